// matmul.cu: batched row-major GEMM through cuBLAS (column-major), at the
// precision kdcc --precision chose (kdrt_matmul in ../ops.c).
//
// Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T:
// the same buffers with the operands swapped, so no copy is made. A batch
// is one cublasGemmStridedBatchedEx (the strides swap with the operands; a
// stride of 0 reuses one operand), a single product one cublasGemmEx. Data
// is float32 throughout; the compute type decides how products are formed:
// fp32 (CUBLAS_COMPUTE_32F_PEDANTIC: IEEE float products and sums) or
// tf32 (CUBLAS_COMPUTE_32F_FAST_TF32, tensor cores, float accumulation).
// bf16 rounds both operands to bfloat16 (nearest even) in scratch and
// multiplies those on the tensor cores with float accumulation into the
// float result: real bf16 products, as torch's autocast forms them. (The
// first GPU run found that CUBLAS_COMPUTE_32F_FAST_16BF on float operands
// ran the same TF32 kernels as tf32.) Storage stays float32 until Keras's
// mixed-precision policies are read (the mixed-precision issue).
#include <cuda_bf16.h>
#include <limits.h>

#include "common.cuh"

// The elements an operand's products read: `batch` matrices `stride`
// apart, each `rows` rows of `cols` elements `ld` apart (row-major).
static size_t extent(int64_t batch, int64_t stride, int64_t rows, int64_t cols, int64_t ld) {
  return (size_t)((batch - 1) * stride + (rows - 1) * ld + cols);
}

__global__ static void to_bf16_kernel(__nv_bfloat16 *out, const float *in, size_t n) {
  KDRT_FOR(e, n) out[e] = __float2bfloat16_rn(in[e]);
}

// in[0, n) rounded to bfloat16 at out (same positions: the same ld and strides).
static void to_bf16(kdrt_cuda *d, __nv_bfloat16 *out, const float *in, size_t n) {
  to_bf16_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, in, n);
  KDRT_LAUNCHED(d, "to_bf16_kernel");
}

static int as_int(int64_t v, const char *what) {
  if (v < 0 || v > INT_MAX) kdrt_cuda_fail(what, __FILE__, __LINE__, "dimension exceeds 2^31-1");
  return (int)v;
}

// An empty sum (K = 0): c_i = beta * c_i (0 when beta is 0, whatever c held).
__global__ static void scale_c_kernel(float *c, int64_t batch, int64_t M, int64_t N, int64_t ldc,
                                      int64_t stride_c, float beta) {
  size_t n = (size_t)batch * (size_t)M * (size_t)N;
  KDRT_FOR(e, n) {
    int64_t j = (int64_t)(e % (size_t)N), r = (int64_t)(e / (size_t)N % (size_t)M);
    int64_t i = (int64_t)(e / ((size_t)N * (size_t)M));
    float *p = c + i * stride_c + r * ldc + j;
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

extern "C" void kdrt_cuda_matmul(kdrt_cuda *d, const kdrt_gemm *g, float alpha, const float *a,
                                 const float *b, float beta, float *c) {
  if (g->batch <= 0 || g->M <= 0 || g->N <= 0) return;
  if (g->K <= 0) {
    size_t n = (size_t)g->batch * (size_t)g->M * (size_t)g->N;
    scale_c_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(
        c, g->batch, g->M, g->N, g->ldc, g->stride_c, beta);
    KDRT_LAUNCHED(d, "scale_c_kernel");
    return;
  }
  cublasComputeType_t ct = d->precision == KDRT_PREC_TF32   ? CUBLAS_COMPUTE_32F_FAST_TF32
                           : d->precision == KDRT_PREC_BF16 ? CUBLAS_COMPUTE_32F
                                                            : CUBLAS_COMPUTE_32F_PEDANTIC;
  cudaDataType_t in_type = CUDA_R_32F;
  const void *av = a, *bv = b;
  if (d->precision == KDRT_PREC_BF16) { // both operands rounded, into scratch 3
    int64_t bb = g->stride_b ? g->batch : 1, ba = g->stride_a ? g->batch : 1;
    size_t nb = extent(bb, g->stride_b, g->tb == KDRT_TRANS ? g->N : g->K,
                       g->tb == KDRT_TRANS ? g->K : g->N, g->ldb);
    size_t na = extent(ba, g->stride_a, g->ta == KDRT_TRANS ? g->K : g->M,
                       g->ta == KDRT_TRANS ? g->M : g->K, g->lda);
    size_t nb16 = (nb + 127) / 128 * 128; // a's part 256-byte aligned
    __nv_bfloat16 *s16 =
        (__nv_bfloat16 *)kdrt_cuda_dscratch(d, 3, (nb16 + na) * sizeof(__nv_bfloat16));
    to_bf16(d, s16, b, nb);
    to_bf16(d, s16 + nb16, a, na);
    bv = s16, av = s16 + nb16, in_type = CUDA_R_16BF;
  }
  cublasOperation_t opb = g->tb == KDRT_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opa = g->ta == KDRT_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
  int N = as_int(g->N, "matmul N"), M = as_int(g->M, "matmul M"), K = as_int(g->K, "matmul K");
  int ldb = as_int(g->ldb, "matmul ldb"), lda = as_int(g->lda, "matmul lda");
  int ldc = as_int(g->ldc, "matmul ldc");
  // issue 22: a fused SGD update captured in a graph reads -lr on the device
  const float *dev_alpha = kdrt_step_neg_lr(d, alpha, beta);
  const void *pa = &alpha, *pb = &beta;
  if (dev_alpha) {
    CUBLAS_CHECK(cublasSetPointerMode(d->impl->blas, CUBLAS_POINTER_MODE_DEVICE));
    pa = dev_alpha, pb = dev_alpha + 1; // kdrt_step_scalars: neg_lr, then one
  }
  if (g->batch == 1) {
    CUBLAS_CHECK(cublasGemmEx(d->impl->blas, opb, opa, N, M, K, pa, bv, in_type, ldb, av,
                              in_type, lda, pb, c, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT));
    if (d->impl->sync_each) KDRT_LAUNCHED(d, "cublasGemmEx");
  } else {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        d->impl->blas, opb, opa, N, M, K, pa, bv, in_type, ldb, (long long)g->stride_b, av,
        in_type, lda, (long long)g->stride_a, pb, c, CUDA_R_32F, ldc, (long long)g->stride_c,
        as_int(g->batch, "matmul batch"), ct, CUBLAS_GEMM_DEFAULT));
    if (d->impl->sync_each) KDRT_LAUNCHED(d, "cublasGemmStridedBatchedEx");
  }
  if (dev_alpha) CUBLAS_CHECK(cublasSetPointerMode(d->impl->blas, CUBLAS_POINTER_MODE_HOST));
}
