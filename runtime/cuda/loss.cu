// loss.cu: the losses, their gradients and accuracy, as kdrt_loss,
// kdrt_loss_grad and kdrt_accuracy in ../loss.c (Keras 3's conventions; see
// there), the formulas ../kdrt_loss.h's, which both runtimes include. One
// block per row: the row's reductions (max, sum of exp, sums of p and y)
// first, then each thread writes its own elements, so dpred may alias pred.
// The loss and accuracy keep each row's value as a double in scratch, then
// one block adds them in a fixed order, times scale, into the float out[0]
// (the CPU adds rows in order in double: the two agree to double rounding).
#include "common.cuh"
#include "kdrt_loss.h"

// Block reductions of one row.
__device__ static float row_max(const float *p, int64_t cols, float *shm) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = p[j] > m ? p[j] : m;
  return kdrt_block_reduce<kdrt_max_op<float> >(m, shm);
}
__device__ static float row_sum(const float *p, int64_t cols, float *shm) {
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += p[j];
  return kdrt_block_reduce<kdrt_sum_op<float> >(s, shm);
}
__device__ static float row_lse(const float *p, int64_t cols, float *shm) {
  float m = row_max(p, cols, shm);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(p[j] - m);
  s = kdrt_block_reduce<kdrt_sum_op<float> >(s, shm);
  return kdrt_loss_lse(m, s);
}

// Sums of x*x and y*y over the row (cosine similarity), every thread.
__device__ static void row_sumsq2(const float *x, const float *y, int64_t cols, float *shm,
                                  float *sx, float *sy) {
  float a = 0.0f, b = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) a += x[j] * x[j], b += y[j] * y[j];
  *sx = kdrt_block_reduce<kdrt_sum_op<float> >(a, shm);
  __syncthreads();
  *sy = kdrt_block_reduce<kdrt_sum_op<float> >(b, shm);
}
// categorical_hinge's sum(t p) and max((1 - t) p), every thread.
__device__ static void row_cat_hinge(const float *p, const float *t, int64_t cols, float *shm,
                                     float *pos, float *neg) {
  float a = 0.0f, b = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    a += t[j] * p[j], b = fmaxf(b, kdrt_loss_hinge_neg(p[j], t[j]));
  *pos = kdrt_block_reduce<kdrt_sum_op<float> >(a, shm);
  __syncthreads();
  *neg = kdrt_block_reduce<kdrt_max_op<float> >(b, shm);
}

// Step 2 of ../kdrt_loss.h: the sums `need` names, of row p (labels t),
// on every thread of the block.
__device__ static void row_sums(int need, kdrt_loss_row *row, const float *p, const float *t,
                                int64_t cols, float *shm) {
  if (need & KDRT_ROW_LSE) row->lse = row_lse(p, cols, shm);
  if (need & KDRT_ROW_SUM) row->s = row_sum(p, cols, shm);
  if (need & KDRT_ROW_YSUM) row->ysum = row_sum(t, cols, shm);
  if (need & KDRT_ROW_SQ) row_sumsq2(p, t, cols, shm, &row->sp, &row->st);
  if (need & KDRT_ROW_HINGE) row_cat_hinge(p, t, cols, shm, &row->pos, &row->neg);
}

// Every row's loss into rowv[r].
__global__ static void loss_rows(int kind, int from_logits, float a, const float *pred,
                                 const float *y, const float *flag, int64_t cols, double *rowv) {
  __shared__ float shm[32];
  __shared__ double shd[32];
  int64_t r = blockIdx.x;
  const float *p = pred + r * cols, *t = kdrt_loss_labels(kind, y, r, cols);
  const int need = kdrt_loss_needs(kind, from_logits, 0);
  kdrt_loss_row row = kdrt_loss_row_init(kind, flag, y, r, cols);
  row_sums(need, &row, p, t, cols, shm);
  kdrt_loss_mid(kind, from_logits, &row, p);
  double l = 0.0;
  if (need & KDRT_ROW_TERMS) {
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      l += kdrt_loss_term(kind, from_logits, a, &row, p, t, j);
    l = kdrt_block_reduce<kdrt_sum_op<double> >(l, shd);
  }
  l = kdrt_loss_finish(kind, from_logits, &row, p, l, cols);
  if (threadIdx.x == 0) rowv[r] = l;
}

// Index of the first maximum of the row (every thread gets it).
__device__ static int64_t row_argmax(const float *p, int64_t cols, float *shv, int64_t *shi) {
  float v = -INFINITY;
  int64_t best = cols; // "none yet": loses every tie
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) kdrt_argmax_merge(v, best, p[j], j);
  __syncthreads();
  shv[threadIdx.x] = v, shi[threadIdx.x] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned k = 1; k < blockDim.x; k++) kdrt_argmax_merge(v, best, shv[k], shi[k]);
    shv[0] = v, shi[0] = best;
  }
  __syncthreads();
  best = shi[0];
  // A row of NaNs (no j ever won): the CPU answers 0.
  return best >= cols ? 0 : best;
}

__global__ static void accuracy_rows(int kind, const float *pred, const float *y, int64_t cols,
                                     double *rowv) {
  __shared__ float shv[256];
  __shared__ int64_t shi[256];
  int64_t r = blockIdx.x;
  double ok;
  if (cols == 1) {
    ok = y[r] == (pred[r] > 0.5f ? 1.0f : 0.0f);
  } else if (kind == KDRT_LOSS_SCCE) {
    ok = (float)row_argmax(pred + r * cols, cols, shv, shi) == y[r];
  } else {
    int64_t a = row_argmax(pred + r * cols, cols, shv, shi);
    int64_t b = row_argmax(y + r * cols, cols, shv, shi);
    ok = a == b;
  }
  if (threadIdx.x == 0) rowv[r] = ok;
}

__global__ static void sum_rows_kernel(float *out, const double *rowv, int64_t rows,
                                       double scale) {
  __shared__ double shd[32];
  double s = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += rowv[r];
  s = kdrt_block_reduce<kdrt_sum_op<double> >(s, shd);
  if (threadIdx.x == 0) out[0] = (float)(s * scale);
}

void kdrt_cuda_sum_rows(kdrt_cuda *d, float *out, const double *rowv, int64_t rows,
                        double scale) {
  sum_rows_kernel<<<1, 256, 0, d->impl->stream>>>(out, rowv, rows, scale);
  KDRT_LAUNCHED(d, "sum_rows_kernel");
}

__global__ static void weigh_rows_kernel(double *rowv, const float *w, int64_t rows) {
  KDRT_FOR(r, (size_t)rows) rowv[r] *= (double)w[r];
}

void kdrt_cuda_weigh_rows(kdrt_cuda *d, double *rowv, const float *w, int64_t rows) {
  if (rows <= 0) return;
  weigh_rows_kernel<<<kdrt_blocks((size_t)rows), KDRT_THREADS, 0, d->impl->stream>>>(rowv, w,
                                                                                      rows);
  KDRT_LAUNCHED(d, "weigh_rows_kernel");
}

void kdrt_cuda_check_rows(int64_t rows, const char *what) {
  if (rows > 2147483647) kdrt_cuda_fail(what, __FILE__, __LINE__, "more than 2^31-1 rows");
}

// kdcc --sample-weight: each row's loss times w[r] (w NULL: none).
extern "C" void kdrt_cuda_loss_w(kdrt_cuda *d, int kind, int from_logits, float a, float *out,
                                 const float *pred, const float *y, const float *flag,
                                 const float *w, int64_t rows, int64_t cols, double scale) {
  cudaStream_t s = d->impl->stream;
  kdrt_cuda_check_rows(rows, "loss");
  double *rowv = (double *)kdrt_cuda_dscratch(d, 2, (size_t)(rows > 0 ? rows : 1) * sizeof(double));
  if (rows > 0) {
    loss_rows<<<(unsigned)rows, kdrt_row_threads(cols), 0, s>>>(kind, from_logits, a, pred, y,
                                                                flag, cols, rowv);
    KDRT_LAUNCHED(d, "loss_rows");
  }
  if (w) kdrt_cuda_weigh_rows(d, rowv, w, rows);
  kdrt_cuda_sum_rows(d, out, rowv, rows, scale);
}

extern "C" void kdrt_cuda_loss(kdrt_cuda *d, int kind, int from_logits, float a, float *out,
                               const float *pred, const float *y, const float *flag,
                               int64_t rows, int64_t cols, double scale) {
  kdrt_cuda_loss_w(d, kind, from_logits, a, out, pred, y, flag, NULL, rows, cols, scale);
}

extern "C" void kdrt_cuda_accuracy_w(kdrt_cuda *d, int kind, int from_logits, float *out,
                                     const float *pred, const float *y, const float *w,
                                     int64_t rows, int64_t cols, double scale) {
  (void)from_logits;
  cudaStream_t s = d->impl->stream;
  kdrt_cuda_check_rows(rows, "loss");
  double *rowv = (double *)kdrt_cuda_dscratch(d, 2, (size_t)(rows > 0 ? rows : 1) * sizeof(double));
  if (rows > 0) {
    accuracy_rows<<<(unsigned)rows, kdrt_row_threads(cols), 0, s>>>(kind, pred, y, cols, rowv);
    KDRT_LAUNCHED(d, "accuracy_rows");
  }
  if (w) kdrt_cuda_weigh_rows(d, rowv, w, rows);
  kdrt_cuda_sum_rows(d, out, rowv, rows, scale);
}

extern "C" void kdrt_cuda_accuracy(kdrt_cuda *d, int kind, int from_logits, float *out,
                                   const float *pred, const float *y, int64_t rows,
                                   int64_t cols, double scale) {
  kdrt_cuda_accuracy_w(d, kind, from_logits, out, pred, y, NULL, rows, cols, scale);
}

__global__ static void loss_grad_rows(int kind, int from_logits, float a, float *dpred,
                                      const float *pred, const float *y, const float *flag,
                                      const float *w, int64_t cols, double scale) {
  __shared__ float shm[32];
  int64_t r = blockIdx.x;
  const float *p = pred + r * cols, *t = kdrt_loss_labels(kind, y, r, cols);
  float *dd = dpred + r * cols;
  const int need = kdrt_loss_needs(kind, from_logits, 1);
  kdrt_loss_row row = kdrt_loss_row_init(kind, flag, y, r, cols);
  row_sums(need, &row, p, t, cols, shm);
  kdrt_loss_mid(kind, from_logits, &row, p);
  if (need & KDRT_ROW_SUM2) {
    float s2 = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      s2 += kdrt_loss_sum2_term(kind, &row, p, t, j);
    row.sum2 = kdrt_block_reduce<kdrt_sum_op<float> >(s2, shm);
  }
  kdrt_loss_grad_prep(kind, &row, w ? (double)w[r] * scale : scale, cols);
  __syncthreads(); // every read of the row by another thread (its sums, SCCE's label
                   // column) is done before dpred, maybe pred, is written
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dd[j] = kdrt_loss_dterm(kind, from_logits, a, &row, p, t, j);
}

extern "C" void kdrt_cuda_loss_grad_w(kdrt_cuda *d, int kind, int from_logits, float a,
                                      float *dpred, const float *pred, const float *y,
                                      const float *flag, const float *w, int64_t rows,
                                      int64_t cols, double scale) {
  if (rows <= 0 || cols <= 0) return;
  kdrt_cuda_check_rows(rows, "loss");
  loss_grad_rows<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(
      kind, from_logits, a, dpred, pred, y, flag, w, cols, scale);
  KDRT_LAUNCHED(d, "loss_grad_rows");
}

extern "C" void kdrt_cuda_loss_grad(kdrt_cuda *d, int kind, int from_logits, float a,
                                    float *dpred, const float *pred, const float *y,
                                    const float *flag, int64_t rows, int64_t cols,
                                    double scale) {
  kdrt_cuda_loss_grad_w(d, kind, from_logits, a, dpred, pred, y, flag, NULL, rows, cols, scale);
}

// issue 11: one block; the flag is 0 or 1, so the max of the threads' flags.
__global__ static void not_binary_k(float *out, const float *y, int64_t n) {
  __shared__ float shm[32];
  float any = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    if (y[i] != 0.0f && y[i] != 1.0f) any = 1.0f;
  any = kdrt_block_reduce<kdrt_max_op<float> >(any, shm);
  if (threadIdx.x == 0) out[0] = any;
}

extern "C" void kdrt_cuda_not_binary(kdrt_cuda *d, float *out, const float *y, int64_t n) {
  not_binary_k<<<1, 256, 0, d->impl->stream>>>(out, y, n);
  KDRT_LAUNCHED(d, "not_binary");
}
