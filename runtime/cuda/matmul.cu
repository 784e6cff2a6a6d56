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
// bf16 rounds both operands to bfloat16 (nearest even) in scratch (an
// operand with an odd leading dimension with its rows packed 16 bytes
// apart: read_as) and multiplies those on the tensor cores with float
// accumulation into the float result: real bf16 products, as torch's
// autocast forms them. (The
// first GPU run found that CUBLAS_COMPUTE_32F_FAST_16BF on float operands
// ran the same TF32 kernels as tf32.) Storage stays float32 until Keras's
// mixed-precision policies are read (the mixed-precision issue).
//
// issue 22: a Dense layer's product and its bias are one cuBLASLt call
// (kdrt_cuda_matmul_bias). After the swap above the row-major bias along N
// runs along the rows of the column-major D = C^T [N, M], which is what
// CUBLASLT_EPILOGUE_BIAS adds (one value per row of D, broadcast over its
// columns); RELU_BIAS and GELU_BIAS apply the activation after it. The
// weight gradient's product dW = x^T dy is, swapped, dW^T = dy^T x: dy is
// cuBLASLt's A, [N, K] column-major, and CUBLASLT_EPILOGUE_BGRADA sums it
// over k into a vector of D's rows: the bias gradient. Each call's
// algorithm comes from cublasLtMatmulAlgoGetHeuristic once per shape,
// transposes, compute type, epilogue and operand alignment (a cache for
// the process); the workspace is cuBLAS's (session.cu), which serves both
// since both run on the one stream, so a step allocates nothing and can be
// captured in a CUDA graph.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "kdrt_round.h"

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

static cublasComputeType_t compute_type(const kdrt_cuda *d) {
  return d->precision == KDRT_PREC_TF32   ? CUBLAS_COMPUTE_32F_FAST_TF32
         : d->precision == KDRT_PREC_BF16 ? CUBLAS_COMPUTE_32F
                                          : CUBLAS_COMPUTE_32F_PEDANTIC;
}

// One operand as memory holds it: `nb` matrices `stride` apart (nb 1 when
// the stride is 0: one matrix for every product of the batch), each `rows`
// rows of `cols` elements `ld` apart (row-major).
typedef struct {
  int64_t nb, stride, rows, cols, ld;
} opnd;

static opnd opnd_a(const kdrt_gemm *g) {
  opnd o = {g->stride_a ? g->batch : 1, g->stride_a, g->ta == KDRT_TRANS ? g->K : g->M,
            g->ta == KDRT_TRANS ? g->M : g->K, g->lda};
  return o;
}

static opnd opnd_b(const kdrt_gemm *g) {
  opnd o = {g->stride_b ? g->batch : 1, g->stride_b, g->tb == KDRT_TRANS ? g->N : g->K,
            g->tb == KDRT_TRANS ? g->K : g->N, g->ldb};
  return o;
}

// Under bf16 an operand whose rows are not 16 bytes apart (a leading
// dimension not a multiple of 8: GPT-2's vocabulary, 50257) is rounded into
// scratch with its rows packed that far apart: cuBLAS's tensor-core kernels
// want each row of a 16-bit operand 16-byte aligned (the fourth GPU run
// timed GPT-2's three logits products at about 110 TFLOP/s). The others
// keep their layout: the same positions, as before. kdrt_cuda_matmul16's
// 16-bit operands likewise.
static int packs(const opnd *o) { return o->ld % 8 != 0; }

// The operand's leading dimension and batch stride as the product reads it.
static void read_as(const opnd *o, int64_t *ld, int64_t *stride) {
  *ld = packs(o) ? (o->cols + 7) / 8 * 8 : o->ld;
  *stride = packs(o) && o->stride ? o->rows * *ld : o->stride;
}

// The 16-bit elements the operand takes in scratch.
static size_t elems16(const opnd *o) {
  if (!packs(o)) return extent(o->nb, o->stride, o->rows, o->cols, o->ld);
  int64_t ld, stride;
  read_as(o, &ld, &stride);
  return (size_t)(o->nb * o->rows * ld);
}

// The element conversions into scratch: float32 to bfloat16 (bf16
// precision), float32 to a 16-bit type's bits (kdrt_round.h: exact for
// values already of the type, KDRT_OPND_EXACT; a variable's cast for its
// use, _ROUND), and 16-bit bits as they are (a row's repacking).
struct cvt_bf16 {
  __device__ __nv_bfloat16 operator()(float x) const { return __float2bfloat16_rn(x); }
};
struct cvt_bits16 {
  int kind;
  __device__ uint16_t operator()(float x) const {
    return kdrt_bits16(kind, kdrt_round_to(kind, x));
  }
};
struct cvt_same16 {
  __device__ uint16_t operator()(uint16_t x) const { return x; }
};

// Row r of all nb * rows (matrix r / rows) converted (f) into its packed row
// of out: a row of blocks (blockIdx.y) strides over the rows, a block's
// threads over the columns. The padding between rows is never read.
template <typename To, typename From, typename F>
__global__ static void pack_rows_kernel(To *out, const From *in, opnd o, int64_t ldo, F f) {
  int64_t all = o.nb * o.rows;
  for (int64_t r = blockIdx.y; r < all; r += gridDim.y) {
    const From *src = in + r / o.rows * o.stride + r % o.rows * o.ld;
    To *dst = out + r * ldo;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < o.cols;
         c += (int64_t)gridDim.x * blockDim.x)
      dst[c] = f(src[c]);
  }
}

// The operand in, converted by f, at out as read_as lays it (packs(o)).
template <typename To, typename From, typename F>
static void pack_rows(kdrt_cuda *d, To *out, const From *in, const opnd *o, F f) {
  int64_t ld, stride, all = o->nb * o->rows;
  read_as(o, &ld, &stride);
  int64_t bx = (o->cols + 255) / 256;
  dim3 grid((unsigned)(bx < 64 ? bx : 64), (unsigned)(all < 65535 ? all : 65535));
  pack_rows_kernel<<<grid, 256, 0, d->impl->stream>>>(out, in, *o, ld, f);
  KDRT_LAUNCHED(d, "pack_rows_kernel");
}

// The operand in rounded to bfloat16 at out, as read_as lays it.
static void to_bf16_operand(kdrt_cuda *d, __nv_bfloat16 *out, const float *in, const opnd *o) {
  if (!packs(o)) {
    to_bf16(d, out, in, elems16(o));
    return;
  }
  pack_rows(d, out, in, o, cvt_bf16());
}

// The operands as the product reads them: where they are, their type, and
// their leading dimensions and batch strides. fp32 and tf32: a and b
// themselves; bf16: both rounded into scratch 3 (b first, a 256 bytes
// aligned after it), each as read_as lays it.
typedef struct {
  const void *a, *b;
  cudaDataType_t type;
  int64_t lda, ldb, stride_a, stride_b;
} gemm_in;

static gemm_in operands(kdrt_cuda *d, const kdrt_gemm *g, const float *a, const float *b) {
  gemm_in in = {a, b, CUDA_R_32F, g->lda, g->ldb, g->stride_a, g->stride_b};
  if (d->precision != KDRT_PREC_BF16) return in;
  opnd oa = opnd_a(g), ob = opnd_b(g);
  read_as(&oa, &in.lda, &in.stride_a);
  read_as(&ob, &in.ldb, &in.stride_b);
  size_t na = elems16(&oa), nb = elems16(&ob);
  size_t nb16 = (nb + 127) / 128 * 128; // a's part 256-byte aligned
  __nv_bfloat16 *s16 =
      (__nv_bfloat16 *)kdrt_cuda_dscratch(d, 3, (nb16 + na) * sizeof(__nv_bfloat16));
  to_bf16_operand(d, s16, b, &ob);
  to_bf16_operand(d, s16 + nb16, a, &oa);
  in.b = s16, in.a = s16 + nb16, in.type = CUDA_R_16BF;
  return in;
}

// issue 22: a float result whose rows are not 16 bytes apart (ldc not a
// multiple of 4: the logits of GPT-2's 50257-word vocabulary, and the
// gradient of their kernel) keeps cuBLAS off its fast kernels even when the
// operands are aligned (the fourth GPU run: 5.3-6.4 ms for each of the
// logits' 632-GFLOP products, about 110 TFLOP/s in bf16). A large one is
// made in scratch 4 with its rows padded to a multiple of 8 floats (llm.c
// pads the vocabulary itself to 50304) and copied into place after: two
// passes over M x N floats (four when beta reads c), well under the
// product's time at these sizes. Small ones (the seed MLP's 10 classes)
// stay as they are.
enum { PAD_C_MIN_FLOATS = 1 << 20, PAD_C_MIN_K = 64 };

static int pads_c(const kdrt_gemm *g) {
  return g->batch == 1 && g->ldc % 4 != 0 && g->M * g->N >= PAD_C_MIN_FLOATS &&
         g->K >= PAD_C_MIN_K;
}

static int64_t padded_ldc(const kdrt_gemm *g) { return (g->N + 7) / 8 * 8; }

// rows x cols floats from src (rows lds apart) to dst (ldd apart), on the
// stream (a memcpy node when a graph is being captured).
static void copy_rows(kdrt_cuda *d, float *dst, int64_t ldd, const float *src, int64_t lds,
                      int64_t rows, int64_t cols) {
  CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)ldd * sizeof(float), src, (size_t)lds * sizeof(float),
                               (size_t)cols * sizeof(float), (size_t)rows,
                               cudaMemcpyDeviceToDevice, d->impl->stream));
}

// Where the product writes c: c itself, or (pads_c) the padded scratch,
// holding c's values when the product reads them (reads_c).
static float *result_at(kdrt_cuda *d, const kdrt_gemm *g, float *c, int reads_c) {
  if (!pads_c(g)) return c;
  int64_t ld = padded_ldc(g);
  float *p = (float *)kdrt_cuda_dscratch(d, 4, (size_t)(g->M * ld) * sizeof(float));
  if (reads_c) copy_rows(d, p, ld, c, g->ldc, g->M, g->N);
  return p;
}

// The padded result (result_at) copied into c.
static void result_done(kdrt_cuda *d, const kdrt_gemm *g, float *c, const float *at) {
  if (at != c) copy_rows(d, c, g->ldc, at, padded_ldc(g), g->M, g->N);
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
  cublasComputeType_t ct = compute_type(d);
  const gemm_in in = operands(d, g, a, b);
  const void *av = in.a, *bv = in.b;
  cudaDataType_t in_type = in.type;
  cublasOperation_t opb = g->tb == KDRT_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opa = g->ta == KDRT_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
  int N = as_int(g->N, "matmul N"), M = as_int(g->M, "matmul M"), K = as_int(g->K, "matmul K");
  int ldb = as_int(in.ldb, "matmul ldb"), lda = as_int(in.lda, "matmul lda");
  float *at = result_at(d, g, c, beta != 0.0f); // (pads_c: batch 1)
  int ldc = as_int(at == c ? g->ldc : padded_ldc(g), "matmul ldc");
  // issue 22: a fused SGD update captured in a graph reads -lr on the device
  const float *dev_alpha = kdrt_step_neg_lr(d, alpha, beta);
  const void *pa = &alpha, *pb = &beta;
  if (dev_alpha) {
    CUBLAS_CHECK(cublasSetPointerMode(d->impl->blas, CUBLAS_POINTER_MODE_DEVICE));
    pa = dev_alpha, pb = dev_alpha + 1; // kdrt_step_scalars: neg_lr, then one
  }
  if (g->batch == 1) {
    CUBLAS_CHECK(cublasGemmEx(d->impl->blas, opb, opa, N, M, K, pa, bv, in_type, ldb, av,
                              in_type, lda, pb, at, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT));
    if (d->impl->sync_each) KDRT_LAUNCHED(d, "cublasGemmEx");
  } else {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        d->impl->blas, opb, opa, N, M, K, pa, bv, in_type, ldb, (long long)in.stride_b, av,
        in_type, lda, (long long)in.stride_a, pb, c, CUDA_R_32F, ldc, (long long)g->stride_c,
        as_int(g->batch, "matmul batch"), ct, CUBLAS_GEMM_DEFAULT));
    if (d->impl->sync_each) KDRT_LAUNCHED(d, "cublasGemmStridedBatchedEx");
  }
  if (dev_alpha) CUBLAS_CHECK(cublasSetPointerMode(d->impl->blas, CUBLAS_POINTER_MODE_HOST));
  result_done(d, g, c, at);
}

// ---------------------------------------------------------------- 16-bit operands (issue 23)

// A float32 operand as the 16 bits of its values rounded to the 16-bit
// type at out (the same positions).
__global__ static void bits16_kernel(cvt_bits16 f, uint16_t *out, const float *in, size_t n) {
  KDRT_FOR(e, n) out[e] = f(in[e]);
}

// An operand of kdrt_cuda_matmul16 that is not read where it is (copies16):
// a float32 one (form not KDRT_OPND_16) as its 16 bits, and (issue 22) a
// 16-bit one whose rows are not 16 bytes apart (GPT-2's 50257 logits, the
// gradient of them) packed, into out as read_as lays it, as bf16 precision's
// operands are (cuBLAS's tensor-core kernels want 16-byte rows).
static int copies16(int form, const opnd *o) { return form != KDRT_OPND_16 || packs(o); }

static void to16_operand(kdrt_cuda *d, int kind, int form, uint16_t *out, const void *in,
                         const opnd *o) {
  if (form == KDRT_OPND_16) return pack_rows(d, out, (const uint16_t *)in, o, cvt_same16());
  const cvt_bits16 f = {kind};
  if (packs(o)) return pack_rows(d, out, (const float *)in, o, f);
  size_t n = elems16(o);
  bits16_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(f, out, (const float *)in,
                                                                      n);
  KDRT_LAUNCHED(d, "bits16_kernel");
}

// c = a b of values of a 16-bit type (kdcc's mixed policies, store16.c):
// operands CUDA_R_16BF or CUDA_R_16F (a float32 one, fa or fb not
// KDRT_OPND_16, first as its 16 bits in scratch 3; either packed there
// when its rows are not 16 bytes apart), float32 sums (CUBLAS_COMPUTE_32F)
// into the float32 c (a large one whose rows are not 16 bytes apart made
// in scratch 4 first: pads_c): Keras's bf16 dot with float32
// accumulation, on the tensor cores whatever --precision says.
extern "C" void kdrt_cuda_matmul16(kdrt_cuda *d, const kdrt_gemm *g, int kind, int fa,
                                   const void *a, int fb, const void *b, float *c,
                                   float *widen) {
  (void)widen; // the CPU's widened operands: here a float32 operand's 16 bits are scratch 3's
  if (g->batch <= 0 || g->M <= 0 || g->N <= 0) return;
  if (g->K <= 0) {
    size_t n = (size_t)g->batch * (size_t)g->M * (size_t)g->N;
    scale_c_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(
        c, g->batch, g->M, g->N, g->ldc, g->stride_c, 0.0f);
    KDRT_LAUNCHED(d, "scale_c_kernel");
    return;
  }
  opnd oa = opnd_a(g), ob = opnd_b(g);
  int64_t lda64 = g->lda, ldb64 = g->ldb, stride_a = g->stride_a, stride_b = g->stride_b;
  size_t na = copies16(fa, &oa) ? elems16(&oa) : 0, nb = copies16(fb, &ob) ? elems16(&ob) : 0;
  size_t nb16 = (nb + 127) / 128 * 128; // a's part 256-byte aligned
  uint16_t *s16 = na + nb ? (uint16_t *)kdrt_cuda_dscratch(d, 3, (nb16 + na) * sizeof(uint16_t))
                          : NULL;
  if (nb) {
    to16_operand(d, kind, fb, s16, b, &ob);
    read_as(&ob, &ldb64, &stride_b);
    b = s16;
  }
  if (na) {
    to16_operand(d, kind, fa, s16 + nb16, a, &oa);
    read_as(&oa, &lda64, &stride_a);
    a = s16 + nb16;
  }
  cudaDataType_t t = kind == KDRT_ROUND_F16 ? CUDA_R_16F : CUDA_R_16BF;
  cublasOperation_t opb = g->tb == KDRT_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opa = g->ta == KDRT_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
  int N = as_int(g->N, "matmul16 N"), M = as_int(g->M, "matmul16 M");
  int K = as_int(g->K, "matmul16 K");
  int ldb = as_int(ldb64, "matmul16 ldb"), lda = as_int(lda64, "matmul16 lda");
  float *at = result_at(d, g, c, 0); // (pads_c: batch 1)
  int ldc = as_int(at == c ? g->ldc : padded_ldc(g), "matmul16 ldc");
  const float one = 1.0f, zero = 0.0f;
  // (the swap: column-major C^T = op(b)^T op(a)^T, as kdrt_cuda_matmul)
  if (g->batch == 1) {
    CUBLAS_CHECK(cublasGemmEx(d->impl->blas, opb, opa, N, M, K, &one, b, t, ldb, a, t, lda, &zero,
                              at, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (d->impl->sync_each) KDRT_LAUNCHED(d, "cublasGemmEx");
  } else {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        d->impl->blas, opb, opa, N, M, K, &one, b, t, ldb, (long long)stride_b, a, t, lda,
        (long long)stride_a, &zero, c, CUDA_R_32F, ldc, (long long)g->stride_c,
        as_int(g->batch, "matmul16 batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (d->impl->sync_each) KDRT_LAUNCHED(d, "cublasGemmStridedBatchedEx");
  }
  result_done(d, g, c, at);
}

// ---------------------------------------------------------------- with a bias (issue 22)

// The epilogue for what the call asks, or 0 when cuBLASLt has none: its
// GELU is the tanh approximation, kdrt's GELU_TANH (Keras's default gelu,
// the erf form, is not one).
static cublasLtEpilogue_t epilogue(int act, const float *bias, const float *dbias) {
  if (bias && !dbias)
    return act == KDRT_ACT_LINEAR      ? CUBLASLT_EPILOGUE_BIAS
           : act == KDRT_ACT_RELU      ? CUBLASLT_EPILOGUE_RELU_BIAS
           : act == KDRT_ACT_GELU_TANH ? CUBLASLT_EPILOGUE_GELU_BIAS
                                       : (cublasLtEpilogue_t)0;
  if (dbias && !bias && act == KDRT_ACT_LINEAR) return CUBLASLT_EPILOGUE_BGRADA;
  return (cublasLtEpilogue_t)0;
}

// The largest power of two up to 256 that divides p's address.
static uint32_t alignment(const void *p) {
  uint32_t a = 256;
  while (a > 4 && (uintptr_t)p % a) a /= 2;
  return a;
}

// An algorithm chosen for one key (ok 0: the heuristic found none).
typedef struct {
  int opa, opb, M, N, K, lda, ldb, ldc, ct, in_type, epi;
  uint32_t align;
  int ok;
  cublasLtMatmulAlgo_t algo;
} lt_plan;
enum { LT_PLANS = 512 };
static lt_plan lt_plans[LT_PLANS];
static int lt_nplans;

// The first key without an algorithm is said once.
static void lt_warn(const lt_plan *key) {
  static int warned;
  if (warned) return;
  warned = 1;
  fprintf(stderr,
          "kdrt_cuda: cuBLASLt has no algorithm for a product with a bias epilogue "
          "([%d, %d, %d], epilogue %d); such products run as a GEMM and a separate kernel "
          "(correct, slower)\n",
          key->M, key->N, key->K, key->epi);
}

// key, remembered (a full cache asks again next time: slower, still right).
static lt_plan *lt_remember(lt_plan *key) {
  if (!key->ok) lt_warn(key);
  if (lt_nplans == LT_PLANS) return key;
  lt_plans[lt_nplans] = *key;
  return &lt_plans[lt_nplans++];
}

static int lt_same(const lt_plan *p, const lt_plan *q) {
  return p->opa == q->opa && p->opb == q->opb && p->M == q->M && p->N == q->N && p->K == q->K &&
         p->lda == q->lda && p->ldb == q->ldb && p->ldc == q->ldc && p->ct == q->ct &&
         p->in_type == q->in_type && p->epi == q->epi && p->align == q->align;
}

// The product through cuBLASLt with epilogue epi and its vector vec (the
// bias read, or the bias gradient written): 0 when cuBLASLt offers no
// algorithm for it (nothing was launched; the caller does it otherwise).
static int lt_matmul(kdrt_cuda *d, const kdrt_gemm *g, cublasLtEpilogue_t epi, const float *a,
                     const float *b, const float *vec, float *c) {
  kdrt_cuda_impl *s = d->impl;
  cublasComputeType_t ct = compute_type(d);
  cublasOperation_t opb = g->tb == KDRT_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opa = g->ta == KDRT_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
  int N = as_int(g->N, "matmul N"), M = as_int(g->M, "matmul M"), K = as_int(g->K, "matmul K");
  // (under bf16 the leading dimensions the rounded operands will have)
  int64_t lda64 = g->lda, ldb64 = g->ldb, unused;
  if (d->precision == KDRT_PREC_BF16) {
    opnd oa = opnd_a(g), ob = opnd_b(g);
    read_as(&oa, &lda64, &unused);
    read_as(&ob, &ldb64, &unused);
  }
  int ldb = as_int(ldb64, "matmul ldb"), lda = as_int(lda64, "matmul lda");
  float *at = result_at(d, g, c, 0); // (beta is 0 here)
  int ldc = as_int(at == c ? g->ldc : padded_ldc(g), "matmul ldc");
  // the key: bf16's operands are in scratch, 256-byte aligned, so only the
  // float pointers' alignment can vary
  cudaDataType_t in_type = d->precision == KDRT_PREC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  uint32_t al = alignment(at), av_al = alignment(vec);
  if (in_type == CUDA_R_32F) {
    uint32_t x = alignment(a) < alignment(b) ? alignment(a) : alignment(b);
    if (x < al) al = x;
  }
  lt_plan key = {(int)opa, (int)opb, M, N, K, lda, ldb, ldc, (int)ct, (int)in_type, (int)epi,
                 al < av_al ? al : av_al, 0, {}};
  lt_plan *p = NULL;
  for (int i = 0; i < lt_nplans && !p; i++)
    if (lt_same(&lt_plans[i], &key)) p = &lt_plans[i];
  if (p && !p->ok) return 0;

  // Descriptors: column-major D [N, M] = op(b) [N, K] op(a) [K, M] (the swap).
  cublasLtMatmulDesc_t md = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  if (cublasLtMatmulDescCreate(&md, ct, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
    if (!p) lt_remember(&key);
    return 0;
  }
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, in_type, opb == CUBLAS_OP_N ? N : K,
                                          opb == CUBLAS_OP_N ? K : N, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, in_type, opa == CUBLAS_OP_N ? K : M,
                                          opa == CUBLAS_OP_N ? M : K, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, ldc));
  if (!p) { // first time for this key: ask the heuristic, once
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = s->blas_ws_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t align_attr[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &al, sizeof al));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(s->lt, md, la, lb, lc, lc, pref, 1, &r, &found) !=
            CUBLAS_STATUS_SUCCESS ||
        found < 1 || r.state != CUBLAS_STATUS_SUCCESS)
      found = 0;
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    key.ok = found > 0;
    if (key.ok) key.algo = r.algo;
    p = lt_remember(&key);
  }
  int ok = p->ok;
  if (ok) {
    const float one = 1.0f, zero = 0.0f;
    const gemm_in in = operands(d, g, a, b); // (lt_matmul takes no batch: no strides)
    const void *av = in.a, *bv = in.b;
    cublasStatus_t st = cublasLtMatmul(s->lt, md, &one, bv, la, av, lb, &zero, at, lc, at, lc,
                                       &p->algo, s->blas_ws, s->blas_ws_bytes, s->stream);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
      // refused before anything ran: the heuristic's algorithm after all
      // does not take these operands; this key goes the separate way
      p->ok = ok = 0;
      lt_warn(p);
    } else {
      CUBLAS_CHECK(st);
      if (s->sync_each) KDRT_LAUNCHED(d, "cublasLtMatmul");
      result_done(d, g, c, at);
    }
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
  CUBLAS_CHECK(cublasLtMatmulDescDestroy(md));
  return ok;
}

// A product with its bias add (and activation), or with its bias gradient,
// in one call where cuBLASLt can; else (a batch, bf16's bias gradient, no
// algorithm) the GEMM and the separate kernel, as before issue 22. bf16
// keeps the separate bias gradient: BGRADA would sum dy rounded to
// bfloat16 (its operand in scratch), the separate kernel sums dy itself.
// KDRT_CUDA_BF16_BGRAD=1 sums the rounded dy in the epilogue instead (what
// torch's autocast does: a Linear's bias gradient from the bf16 gradient).
extern "C" void kdrt_cuda_matmul_bias(kdrt_cuda *d, const kdrt_gemm *g, int act, const float *a,
                                      const float *b, const float *bias, float *c,
                                      float *dbias) {
  static int bf16_bgrad = -1, lt_on = -1; // read once
  if (bf16_bgrad < 0) {
    const char *e = getenv("KDRT_CUDA_BF16_BGRAD"), *l = getenv("KDRT_CUDA_LT");
    bf16_bgrad = e && !strcmp(e, "1");
    lt_on = !(l && !strcmp(l, "0"));
  }
  if (g->batch <= 0) return;
  cublasLtEpilogue_t epi = epilogue(act, bias, dbias);
  // A small product keeps the separate kernels: the epilogue saves one pass
  // over the M x N result (or K x N dy), under a microsecond below 64K
  // floats, and GPU run 4 (bench/GPU.md) measured the seed MLP (products of
  // 128 x 200 x 10) at 7239 steps/s with its two products in cuBLASLt
  // against 12903 before (an H200; suspected, not yet measured alone:
  // KDRT_CUDA_LT=0 turns the epilogues off to compare).
  int64_t touched = dbias ? g->K * g->N : g->M * g->N;
  // (a bias vector less than 16-byte aligned is left to the separate
  // kernels: others report epilogues that fail on one, heuristic or not)
  int fused = lt_on && epi && g->batch == 1 && g->M > 0 && g->N > 0 && g->K > 0 &&
              touched >= 65536 && alignment(bias ? bias : dbias) >= 16 &&
              !(dbias && ((d->precision == KDRT_PREC_BF16 && !bf16_bgrad) ||
                          g->tb != KDRT_NOTRANS || g->ldb != g->N));
  if (fused && lt_matmul(d, g, epi, a, b, bias ? bias : dbias, c)) return;
  kdrt_cuda_matmul(d, g, 1.0f, a, b, 0.0f, c);
  if (bias) kdrt_cuda_bias_act(d, act, c, c, bias, g->M, g->N);
  if (dbias) kdrt_cuda_bias_grad(d, dbias, b, g->K, g->N);
}
