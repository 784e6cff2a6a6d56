// issue 22: cudnn_attn.h's host-side rules: which KDRT_CUDA_CUDNN value
// switches on what, and which attention shapes cudnn_attn.cu offers
// cuDNN (the others keep attn.cu's kernels, said once at run time).
#include <criterion/criterion.h>

#include "../runtime/cuda/cudnn_attn.h"

Test(cudnn_attn, mode) {
  cr_assert_eq(kdrt_cudnn_mode(NULL), 0);
  cr_assert_eq(kdrt_cudnn_mode(""), 0);
  cr_assert_eq(kdrt_cudnn_mode("0"), 0);
  cr_assert_eq(kdrt_cudnn_mode("1"), KDRT_CUDNN_CONV | KDRT_CUDNN_ATTN);
  cr_assert_eq(kdrt_cudnn_mode("yes"), KDRT_CUDNN_CONV | KDRT_CUDNN_ATTN);
  cr_assert_eq(kdrt_cudnn_mode("conv"), KDRT_CUDNN_CONV);
  cr_assert_eq(kdrt_cudnn_mode("attn"), KDRT_CUDNN_ATTN);
  cr_assert_neq(KDRT_CUDNN_CONV, KDRT_CUDNN_ATTN);
}

Test(cudnn_attn, shapes) {
  // what cuDNN takes: GPT-2's heads (64), 128, models/gpt.json's 8, t != s
  cr_assert_null(kdrt_cudnn_attn_refuses(1, 96, 1024, 1024, 64));
  cr_assert_null(kdrt_cudnn_attn_refuses(1, 1, 300, 300, 128));
  cr_assert_null(kdrt_cudnn_attn_refuses(1, 4, 16, 16, 8));
  cr_assert_null(kdrt_cudnn_attn_refuses(1, 2, 70, 130, 256));
  // tf32 and fp32 keep kdcc's kernels (or the chain)
  cr_assert_str_eq(kdrt_cudnn_attn_refuses(0, 96, 1024, 1024, 64),
                   "not bf16 (cuDNN's attention takes 16-bit operands)");
  cr_assert_str_eq(kdrt_cudnn_attn_refuses(1, 2, 40, 40, 6), "head dim not a multiple of 8");
  cr_assert_str_eq(kdrt_cudnn_attn_refuses(1, 2, 40, 40, 264), "head dim over 256");
  cr_assert_str_eq(kdrt_cudnn_attn_refuses(1, 0, 40, 40, 64), "an empty attention");
  cr_assert_str_eq(kdrt_cudnn_attn_refuses(1, 2, 40, 0, 64), "an empty attention");
  // int32 element indices: 2^25 rows of 64 is 2^31 elements
  cr_assert_null(kdrt_cudnn_attn_refuses(1, 1, ((int64_t)1 << 25) - 1, 16, 64));
  cr_assert_str_eq(kdrt_cudnn_attn_refuses(1, 1, 16, (int64_t)1 << 25, 64),
                   "2^31 elements or more in an operand");
  cr_assert_str_eq(kdrt_cudnn_attn_refuses(1, (int64_t)1 << 20, 32, 32, 64),
                   "2^31 elements or more in an operand");
}
