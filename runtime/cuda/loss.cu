// loss.cu: the losses, their gradients and accuracy, as kdrt_loss,
// kdrt_loss_grad and kdrt_accuracy in ../ops.c (Keras 3's conventions; see
// there). One block per row: the row's reductions (max, sum of exp, sums of
// p and y) first, then each thread writes its own elements, so dpred may
// alias pred. The loss and accuracy keep each row's value as a double in
// scratch, then one block adds them in a fixed order, times scale, into
// the float out[0] (the CPU adds rows in order in double: the two agree to
// double rounding).
#include "common.cuh"

#define KD_EPS 1e-7f
#define KD_ONE_MINUS_EPS ((float)(1.0 - 1e-7))

__device__ static inline float clipf_(float p) {
  return p < KD_EPS ? KD_EPS : (p > KD_ONE_MINUS_EPS ? KD_ONE_MINUS_EPS : p);
}
__device__ static inline float unclipped(float p) {
  return (p >= KD_EPS && p <= KD_ONE_MINUS_EPS) ? 1.0f : 0.0f;
}
__device__ static inline float softplusf_(float x) {
  return (x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x)));
}
__device__ static inline int64_t class_id(const float *y, int64_t r, int64_t cols) {
  float v = y[r];
  if (!(v >= 0.0f) || v >= (float)cols) return -1;
  return (int64_t)v;
}

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
  return m + logf(s);
}

// Every row's loss into rowv[r].
__global__ static void loss_rows(int kind, int from_logits, const float *pred, const float *y,
                                 int64_t cols, double *rowv) {
  __shared__ float shm[32];
  __shared__ double shd[32];
  int64_t r = blockIdx.x;
  const float *p = pred + r * cols, *t = y + r * cols;
  double l = 0.0;
  switch (kind) {
  case KDRT_LOSS_MSE: case KDRT_LOSS_MAE:
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      double e = (double)p[j] - t[j];
      l += kind == KDRT_LOSS_MSE ? e * e : fabs(e);
    }
    l = kdrt_block_reduce<kdrt_sum_op<double> >(l, shd) / (double)cols;
    break;
  case KDRT_LOSS_CCE:
    if (from_logits) {
      float lse = row_lse(p, cols, shm);
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) l -= (double)t[j] * (p[j] - lse);
    } else {
      float s = row_sum(p, cols, shm);
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        l -= (double)t[j] * logf(clipf_(p[j] / s));
    }
    l = kdrt_block_reduce<kdrt_sum_op<double> >(l, shd);
    break;
  case KDRT_LOSS_SCCE: {
    int64_t c = class_id(y, r, cols);
    if (c < 0) break;
    if (from_logits) l = (double)row_lse(p, cols, shm) - p[c];
    else l = -logf(clipf_(p[c] / row_sum(p, cols, shm)));
    break;
  }
  case KDRT_LOSS_BCE:
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      if (from_logits) {
        l += softplusf_(p[j]) - p[j] * t[j];
      } else {
        float q = clipf_(p[j]);
        l -= t[j] * logf(q) + (1.0f - t[j]) * logf(1.0f - q);
      }
    }
    l = kdrt_block_reduce<kdrt_sum_op<double> >(l, shd) / (double)cols;
    break;
  }
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

// out[0] = (float)(sum of rowv * scale), one block, fixed order.
__global__ static void sum_rows(float *out, const double *rowv, int64_t rows, double scale) {
  __shared__ double shd[32];
  double s = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += rowv[r];
  s = kdrt_block_reduce<kdrt_sum_op<double> >(s, shd);
  if (threadIdx.x == 0) out[0] = (float)(s * scale);
}

static void check_rows(int64_t rows) {
  if (rows > 2147483647) kdrt_cuda_fail("loss", __FILE__, __LINE__, "more than 2^31-1 rows");
}

extern "C" void kdrt_cuda_loss(kdrt_cuda *d, int kind, int from_logits, float *out,
                               const float *pred, const float *y, int64_t rows, int64_t cols,
                               double scale) {
  cudaStream_t s = d->impl->stream;
  check_rows(rows);
  double *rowv = (double *)kdrt_cuda_dscratch(d, 2, (size_t)(rows > 0 ? rows : 1) * sizeof(double));
  if (rows > 0) {
    loss_rows<<<(unsigned)rows, kdrt_row_threads(cols), 0, s>>>(kind, from_logits, pred, y, cols,
                                                                rowv);
    KDRT_LAUNCHED(d, "loss_rows");
  }
  sum_rows<<<1, 256, 0, s>>>(out, rowv, rows, scale);
  KDRT_LAUNCHED(d, "sum_rows");
}

extern "C" void kdrt_cuda_accuracy(kdrt_cuda *d, int kind, int from_logits, float *out,
                                   const float *pred, const float *y, int64_t rows,
                                   int64_t cols, double scale) {
  (void)from_logits;
  cudaStream_t s = d->impl->stream;
  check_rows(rows);
  double *rowv = (double *)kdrt_cuda_dscratch(d, 2, (size_t)(rows > 0 ? rows : 1) * sizeof(double));
  if (rows > 0) {
    accuracy_rows<<<(unsigned)rows, kdrt_row_threads(cols), 0, s>>>(kind, pred, y, cols, rowv);
    KDRT_LAUNCHED(d, "accuracy_rows");
  }
  sum_rows<<<1, 256, 0, s>>>(out, rowv, rows, scale);
  KDRT_LAUNCHED(d, "sum_rows");
}

__global__ static void loss_grad_rows(int kind, int from_logits, float *dpred, const float *pred,
                                      const float *y, int64_t cols, float sc, float sc_cols) {
  __shared__ float shm[32];
  int64_t r = blockIdx.x;
  const float *p = pred + r * cols, *t = y + r * cols;
  float *dd = dpred + r * cols;
  switch (kind) {
  case KDRT_LOSS_MSE:
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dd[j] = 2.0f * sc_cols * (p[j] - t[j]);
    break;
  case KDRT_LOSS_MAE:
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float e = p[j] - t[j];
      dd[j] = e > 0.0f ? sc_cols : (e < 0.0f ? -sc_cols : 0.0f);
    }
    break;
  case KDRT_LOSS_CCE:
    if (from_logits) {
      float lse = row_lse(p, cols, shm);
      float ysum = row_sum(t, cols, shm);
      __syncthreads(); // every read of p is done before dpred (maybe p) is written
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        dd[j] = sc * (expf(p[j] - lse) * ysum - t[j]);
    } else {
      float s = row_sum(p, cols, shm);
      float ym = 0.0f;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) ym += t[j] * unclipped(p[j] / s);
      ym = kdrt_block_reduce<kdrt_sum_op<float> >(ym, shm);
      __syncthreads();
      float inv = sc / s;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        float q = p[j] / s;
        float g = unclipped(q) > 0.0f ? -t[j] / q : 0.0f;
        dd[j] = inv * (g + ym);
      }
    }
    break;
  case KDRT_LOSS_SCCE: {
    int64_t c = class_id(y, r, cols);
    if (c < 0) {
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dd[j] = 0.0f;
      break;
    }
    if (from_logits) {
      float lse = row_lse(p, cols, shm);
      __syncthreads();
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        dd[j] = j == c ? sc * expf(p[j] - lse) - sc : sc * expf(p[j] - lse);
    } else {
      float s = row_sum(p, cols, shm);
      float q = p[c] / s;
      __syncthreads();
      float m = unclipped(q);
      float inv = sc / s;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        dd[j] = j == c ? (m > 0.0f ? inv * (1.0f - 1.0f / q) : 0.0f) : inv * m;
    }
    break;
  }
  case KDRT_LOSS_BCE:
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      if (from_logits) {
        dd[j] = sc_cols * (KDRT_SIGMOID(p[j]) - t[j]);
      } else {
        float q = p[j];
        float g = -t[j] / q + (1.0f - t[j]) / (1.0f - q);
        dd[j] = unclipped(q) > 0.0f ? sc_cols * g : 0.0f;
      }
    }
    break;
  }
}

extern "C" void kdrt_cuda_loss_grad(kdrt_cuda *d, int kind, int from_logits, float *dpred,
                                    const float *pred, const float *y, int64_t rows,
                                    int64_t cols, double scale) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  const float sc = (float)scale, sc_cols = (float)(scale / (double)cols);
  loss_grad_rows<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(
      kind, from_logits, dpred, pred, y, cols, sc, sc_cols);
  KDRT_LAUNCHED(d, "loss_grad_rows");
}
