// matmul.cu: row-major GEMM through cuBLAS (column-major), at the
// precision kdcc --precision chose.
//
// Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T:
// the same buffers with the operands swapped, so no copy is made. Data is
// float32 throughout; the compute type decides how products are formed:
// fp32 (CUBLAS_COMPUTE_32F_PEDANTIC: IEEE float products and sums), tf32
// (CUBLAS_COMPUTE_32F_FAST_TF32) or bf16 (CUBLAS_COMPUTE_32F_FAST_16BF),
// both on tensor cores with float accumulation.
#include <limits.h>

#include "common.cuh"

static int as_int(int64_t v, const char *what) {
  if (v < 0 || v > INT_MAX) kdrt_cuda_fail(what, __FILE__, __LINE__, "dimension exceeds 2^31-1");
  return (int)v;
}

extern "C" void kdrt_cuda_matmul(kdrt_cuda *d, int ta, int tb, int64_t M, int64_t N, int64_t K,
                                 const float *a, int64_t lda, const float *b, int64_t ldb,
                                 float *c, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) { // an empty sum: C = 0
    for (int64_t r = 0; r < M; r++)
      CUDA_CHECK(cudaMemsetAsync(c + r * ldc, 0, (size_t)N * sizeof(float), d->impl->stream));
    return;
  }
  cublasComputeType_t ct = d->precision == KDRT_PREC_TF32   ? CUBLAS_COMPUTE_32F_FAST_TF32
                           : d->precision == KDRT_PREC_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                            : CUBLAS_COMPUTE_32F_PEDANTIC;
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(d->impl->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                            ta ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(N, "matmul N"),
                            as_int(M, "matmul M"), as_int(K, "matmul K"), &one, b, CUDA_R_32F,
                            as_int(ldb, "matmul ldb"), a, CUDA_R_32F, as_int(lda, "matmul lda"),
                            &zero, c, CUDA_R_32F, as_int(ldc, "matmul ldc"), ct,
                            CUBLAS_GEMM_DEFAULT));
  if (d->impl->sync_each) KDRT_LAUNCHED(d, "cublasGemmEx");
}
