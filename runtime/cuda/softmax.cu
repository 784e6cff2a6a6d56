// softmax.cu: softmax over the last dim and its gradient, one block per
// row (as kdrt_softmax / kdrt_softmax_grad: max, exp(x - max), times
// 1/sum; dx = y * (dy - sum(dy * y))). Row sums are block reductions, so
// they may differ from the CPU's running sums in the last bits.
#include "common.cuh"

__global__ static void softmax_kernel(float *y, const float *x, int64_t cols) {
  __shared__ float shm[32];
  const float *xr = x + (int64_t)blockIdx.x * cols;
  float *yr = y + (int64_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = xr[j] > m ? xr[j] : m;
  m = kdrt_block_reduce<kdrt_max_op<float> >(m, shm);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float e = expf(xr[j] - m);
    yr[j] = e; // y may alias x: this thread alone reads and writes j
    s += e;
  }
  s = kdrt_block_reduce<kdrt_sum_op<float> >(s, shm);
  float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] *= inv;
}

__global__ static void softmax_grad_kernel(float *dx, const float *dy, const float *y,
                                           int64_t cols) {
  __shared__ float shm[32];
  int64_t off = (int64_t)blockIdx.x * cols;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += dy[off + j] * y[off + j];
  dot = kdrt_block_reduce<kdrt_sum_op<float> >(dot, shm);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dx[off + j] = y[off + j] * (dy[off + j] - dot);
}

// Attention's scores (kdrt_attn_softmax): one block per row r of [outer, t,
// u]; its query is at t0 + r % t, and with `causal` only the keys up to it
// are read (the others' probabilities are 0, written as such).
__device__ static inline int64_t attn_keys(int64_t r, int64_t t, int64_t u, int64_t t0,
                                           int causal) {
  int64_t k = t0 + r % t + 1;
  return causal && k < u ? k : u;
}

__global__ static void attn_softmax_kernel(float *y, const float *x, int64_t t, int64_t u,
                                           int64_t t0, float scale, int causal) {
  __shared__ float shm[32];
  int64_t r = blockIdx.x, keys = attn_keys(r, t, u, t0, causal);
  const float *xr = x + r * u;
  float *yr = y + r * u;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    float v = xr[j] * scale + 0.0f;
    m = v > m ? v : m;
  }
  m = kdrt_block_reduce<kdrt_max_op<float> >(m, shm);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    float e = expf(xr[j] * scale + 0.0f - m);
    yr[j] = e; // y may alias x: this thread alone reads and writes j
    s += e;
  }
  for (int64_t j = keys + threadIdx.x; j < u; j += blockDim.x) yr[j] = 0.0f;
  s = kdrt_block_reduce<kdrt_sum_op<float> >(s, shm);
  float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) yr[j] *= inv;
}

__global__ static void attn_softmax_grad_kernel(float *dx, const float *dy, const float *y,
                                                int64_t t, int64_t u, int64_t t0, float scale,
                                                int causal) {
  __shared__ float shm[32];
  int64_t r = blockIdx.x, keys = attn_keys(r, t, u, t0, causal), off = r * u;
  float dot = 0.0f; // y is 0 past the keys
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) dot += dy[off + j] * y[off + j];
  dot = kdrt_block_reduce<kdrt_sum_op<float> >(dot, shm);
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x)
    dx[off + j] = y[off + j] * (dy[off + j] - dot) * scale + 0.0f;
  for (int64_t j = keys + threadIdx.x; j < u; j += blockDim.x) dx[off + j] = 0.0f;
}

static void check_rows(int64_t rows) {
  if (rows > 2147483647)
    kdrt_cuda_fail("softmax", __FILE__, __LINE__, "more than 2^31-1 rows");
}

extern "C" void kdrt_cuda_softmax(kdrt_cuda *d, float *y, const float *x, int64_t rows,
                                  int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  softmax_kernel<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(y, x, cols);
  KDRT_LAUNCHED(d, "softmax_kernel");
}

extern "C" void kdrt_cuda_softmax_grad(kdrt_cuda *d, float *dx, const float *dy, const float *y,
                                       int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  softmax_grad_kernel<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(dx, dy, y,
                                                                                     cols);
  KDRT_LAUNCHED(d, "softmax_grad_kernel");
}

extern "C" void kdrt_cuda_attn_softmax(kdrt_cuda *d, float *y, const float *x, int64_t outer,
                                       int64_t t, int64_t u, int64_t t0, float scale, int causal) {
  int64_t rows = outer * t;
  if (rows <= 0 || u <= 0) return;
  check_rows(rows);
  attn_softmax_kernel<<<(unsigned)rows, kdrt_row_threads(u), 0, d->impl->stream>>>(
      y, x, t, u, t0, scale, causal);
  KDRT_LAUNCHED(d, "attn_softmax_kernel");
}

extern "C" void kdrt_cuda_attn_softmax_grad(kdrt_cuda *d, float *dx, const float *dy,
                                            const float *y, int64_t outer, int64_t t, int64_t u,
                                            int64_t t0, float scale, int causal) {
  int64_t rows = outer * t;
  if (rows <= 0 || u <= 0) return;
  check_rows(rows);
  attn_softmax_grad_kernel<<<(unsigned)rows, kdrt_row_threads(u), 0, d->impl->stream>>>(
      dx, dy, y, t, u, t0, scale, causal);
  KDRT_LAUNCHED(d, "attn_softmax_grad_kernel");
}
