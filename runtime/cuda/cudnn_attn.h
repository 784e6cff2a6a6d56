// cudnn_attn.h (issue 22): what cuDNN is switched on for, and which
// attention shapes cudnn_attn.cu gives cuDNN's fused attention; plain C,
// so that the host's tests check it without a GPU (tests/test_cudnn_attn.c).
#ifndef KDRT_CUDNN_ATTN_H
#define KDRT_CUDNN_ATTN_H

#include <stdint.h>
#include <string.h>

// KDRT_CUDA_CUDNN: unset, "" or "0": nothing; "conv": the convolutions
// (and the two-level bn_stats, cudnn.cu, norm.cu); "attn": the attention
// at bf16 (cudnn_attn.cu); any other value ("1"): both.
enum { KDRT_CUDNN_CONV = 1, KDRT_CUDNN_ATTN = 2 };

static inline int kdrt_cudnn_mode(const char *v) {
  if (!v || !*v || !strcmp(v, "0")) return 0;
  if (!strcmp(v, "conv")) return KDRT_CUDNN_CONV;
  if (!strcmp(v, "attn")) return KDRT_CUDNN_ATTN;
  return KDRT_CUDNN_CONV | KDRT_CUDNN_ATTN;
}

// Why cuDNN's SDPA does not take an attention of bn heads, t queries, s
// keys, head dim hd at precision `bf16` (1: --precision bf16), or NULL
// when it may (cuDNN may still refuse it when its graph is built). Only
// bf16: cuDNN's operands are 16-bit, tf32 and fp32 keep their kernels.
// cuDNN wants the head dim a multiple of 8 (16-byte rows) and, on Hopper,
// at most 256; each operand's elements must index in int32.
static inline const char *kdrt_cudnn_attn_refuses(int bf16, int64_t bn, int64_t t, int64_t s,
                                                  int64_t hd) {
  if (!bf16) return "not bf16 (cuDNN's attention takes 16-bit operands)";
  if (bn < 1 || t < 1 || s < 1 || hd < 1) return "an empty attention";
  if (hd % 8) return "head dim not a multiple of 8";
  if (hd > 256) return "head dim over 256";
  const int64_t most = (int64_t)1 << 31;
  if (bn * (t > s ? t : s) >= most / hd) return "2^31 elements or more in an operand";
  return 0;
}

// cudnn_attn.cu, for the tests without a GPU (tests/cudnn_attn_check.cu):
// the graph of an attention (grad 0: forward, 1: backward), as the
// runtime defines it, validated by the cuDNN frontend for GPU generation
// sm (90: Hopper), libcudnn loaded but no device touched; NULL when valid,
// else why not.
#ifdef __cplusplus
extern "C"
#endif
const char *kdrt_cudnn_attention_validate(int grad, int64_t bn, int64_t t, int64_t s, int64_t hd,
                                          float scale, int causal, int sm);

#endif
