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

// issue 11: the elementwise losses (kdrt_defs.h's list), as ../ops.c: a
// term, or (d) its derivative in p.
__device__ static inline float elem_loss(int kind, int d, float p, float t, float a) {
  switch (kind) {
#define KDRT_X(name, mean, f, df) case KDRT_LOSS_##name: return d ? (df) : (f);
    KDRT_ELEM_LOSS_LIST(KDRT_X)
#undef KDRT_X
  }
  return NAN;
}
__host__ __device__ static inline int elem_mean(int kind) {
  switch (kind) {
#define KDRT_X(name, mean, f, df) case KDRT_LOSS_##name: return mean;
    KDRT_ELEM_LOSS_LIST(KDRT_X)
#undef KDRT_X
  }
  return -1;
}
// Keras's hinge labels: 0/1 become -1/1 unless the step's labels hold another value.
__device__ static inline int hinge_pm1(int kind, const float *flag) {
  return (kind == KDRT_LOSS_HINGE || kind == KDRT_LOSS_SQUARED_HINGE) && flag[0] == 0.0f;
}
// CosineSimilarity's min(rsqrt(sum of squares), 1 / epsilon); w: its d / d rsqrt.
__device__ static inline float cos_inv(float ss, float *w) {
  float r = 1.0f / sqrtf(ss);
  if (w) *w = r < 1e7f ? 1.0f : r == 1e7f ? 0.5f : 0.0f;
  return fminf(r, 1e7f);
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
    a += t[j] * p[j], b = fmaxf(b, (1.0f - t[j]) * p[j]);
  *pos = kdrt_block_reduce<kdrt_sum_op<float> >(a, shm);
  __syncthreads();
  *neg = kdrt_block_reduce<kdrt_max_op<float> >(b, shm);
}

// Every row's loss into rowv[r].
__global__ static void loss_rows(int kind, int from_logits, float a, const float *pred,
                                 const float *y, const float *flag, int64_t cols, double *rowv) {
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
  case KDRT_LOSS_COSINE: {
    float sp, st;
    row_sumsq2(p, t, cols, shm, &sp, &st);
    float ip = cos_inv(sp, NULL), it = cos_inv(st, NULL);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) l -= (double)((t[j] * it) * (p[j] * ip));
    l = kdrt_block_reduce<kdrt_sum_op<double> >(l, shd);
    break;
  }
  case KDRT_LOSS_CAT_HINGE: {
    float pos, neg;
    row_cat_hinge(p, t, cols, shm, &pos, &neg);
    l = fmaxf(neg - pos + 1.0f, 0.0f);
    break;
  }
  default: {
    int pm1 = hinge_pm1(kind, flag);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      l += elem_loss(kind, 0, p[j], pm1 ? 2.0f * t[j] - 1.0f : t[j], a);
    l = kdrt_block_reduce<kdrt_sum_op<double> >(l, shd);
    if (elem_mean(kind)) l /= (double)cols;
    break;
  }
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

extern "C" void kdrt_cuda_loss(kdrt_cuda *d, int kind, int from_logits, float a, float *out,
                               const float *pred, const float *y, const float *flag,
                               int64_t rows, int64_t cols, double scale) {
  cudaStream_t s = d->impl->stream;
  check_rows(rows);
  double *rowv = (double *)kdrt_cuda_dscratch(d, 2, (size_t)(rows > 0 ? rows : 1) * sizeof(double));
  if (rows > 0) {
    loss_rows<<<(unsigned)rows, kdrt_row_threads(cols), 0, s>>>(kind, from_logits, a, pred, y,
                                                                flag, cols, rowv);
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

__global__ static void loss_grad_rows(int kind, int from_logits, float a, float *dpred,
                                      const float *pred, const float *y, const float *flag,
                                      int64_t cols, float sc, float sc_cols) {
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
  case KDRT_LOSS_COSINE: { // as ../ops.c
    float sp, st;
    row_sumsq2(p, t, cols, shm, &sp, &st);
    float w, ip = cos_inv(sp, &w), it = cos_inv(st, NULL);
    float spt = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) spt += p[j] * (t[j] * it);
    __syncthreads();
    spt = kdrt_block_reduce<kdrt_sum_op<float> >(spt, shm);
    __syncthreads();
    float r = 1.0f / sqrtf(sp), r3 = w > 0.0f ? w * r * r * r * spt : 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dd[j] = sc * (r3 * p[j] - ip * (t[j] * it));
    break;
  }
  case KDRT_LOSS_CAT_HINGE: {
    float pos, neg;
    row_cat_hinge(p, t, cols, shm, &pos, &neg);
    float ties = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) ties += (1.0f - t[j]) * p[j] == neg;
    __syncthreads();
    ties = kdrt_block_reduce<kdrt_sum_op<float> >(ties, shm);
    __syncthreads();
    float g = sc * KDRT_MAX_D(neg - pos + 1.0f, 0.0f);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dd[j] = g * (((1.0f - t[j]) * p[j] == neg ? (1.0f - t[j]) / ties : 0.0f) - t[j]);
    break;
  }
  default: { // elementwise: each thread reads only its own elements
    int pm1 = hinge_pm1(kind, flag);
    float s = elem_mean(kind) ? sc_cols : sc;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dd[j] = s * elem_loss(kind, 1, p[j], pm1 ? 2.0f * t[j] - 1.0f : t[j], a);
    break;
  }
  }
}

extern "C" void kdrt_cuda_loss_grad(kdrt_cuda *d, int kind, int from_logits, float a,
                                    float *dpred, const float *pred, const float *y,
                                    const float *flag, int64_t rows, int64_t cols,
                                    double scale) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  const float sc = (float)scale, sc_cols = (float)(scale / (double)cols);
  loss_grad_rows<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(
      kind, from_logits, a, dpred, pred, y, flag, cols, sc, sc_cols);
  KDRT_LAUNCHED(d, "loss_grad_rows");
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
