// softmax.cu: softmax over the last dim and its gradient (as kdrt_softmax /
// kdrt_softmax_grad: max, exp(x - max), times 1/sum; dx = y * (dy -
// sum(dy * y))), and attention's version with a scale and a causal mask.
//
// Rows of up to 1024 take one warp each, 4 rows a block, the row held in
// registers (N floats a lane, N a compile-time power of two): one read and
// one write of each element, the max and sums by warp shuffles. Lane l
// holds columns l, l + 32, ... or, when the row length is a multiple of 4
// and the buffers are 16-byte aligned, the float4s l, l + 32, ... (16-byte
// accesses). Longer rows take one block each and three passes over global
// memory (max, exp and sum, scale). Row sums are reductions in a fixed
// order, so they may differ from the CPU's running sums in the last bits,
// but not from run to run.
#include "common.cuh"

// The largest of the block's row xr[0, cols), every thread's.
__device__ static float block_row_max(const float *xr, int64_t cols, float *shm) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = xr[j] > m ? xr[j] : m;
  return kdrt_block_reduce<kdrt_max_op<float> >(m, shm);
}

__global__ static void softmax_kernel(float *y, const float *x, int64_t cols) {
  __shared__ float shm[32];
  const float *xr = x + (int64_t)blockIdx.x * cols;
  float *yr = y + (int64_t)blockIdx.x * cols;
  float m = block_row_max(xr, cols, shm);
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
  return kdrt_attn_keys(t0 + r % t, u, causal);
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

// ---------------------------------------------------------------- one warp a row
#define SOFTMAX_WARPS 4 // rows a block
#define SOFTMAX_WARP_COLS 1024 // the longest row a warp takes (N 32)

// The column of a lane's k-th float (V: 16-byte accesses).
template <bool V> __device__ static inline int lane_col(int k, int lane) {
  return V ? ((k / 4) * 32 + lane) * 4 + k % 4 : k * 32 + lane;
}

// v[k] = p[lane_col(k)] for the columns below `keys`, 0 for the others,
// which are not read; with V a float4 that straddles `keys` is read whole
// (it lies within the row: u % 4 == 0), its columns past keys unused.
template <int N, bool V>
__device__ static inline void row_load(float (&v)[N], const float *p, int keys, int lane) {
#pragma unroll
  for (int k = 0; k < N; k += V ? 4 : 1) {
    int j = lane_col<V>(k, lane);
    if constexpr (V) {
      float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (j < keys) q = *(const float4 *)(p + j);
      v[k] = q.x, v[k + 1] = q.y, v[k + 2] = q.z, v[k + 3] = q.w;
    } else {
      v[k] = j < keys ? p[j] : 0.0f;
    }
  }
}

// p[lane_col(k)] = v[k] for the columns below u.
template <int N, bool V>
__device__ static inline void row_store(float *p, const float (&v)[N], int u, int lane) {
#pragma unroll
  for (int k = 0; k < N; k += V ? 4 : 1) {
    int j = lane_col<V>(k, lane);
    if constexpr (V) {
      if (j < u) *(float4 *)(p + j) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
    } else {
      if (j < u) p[j] = v[k];
    }
  }
}

// Rows of [rows, u], u <= 32 * N. ATTN: attention's scores (kdrt_attn_softmax:
// x * scale + 0.0f, causal keys), else the plain softmax (scale and the
// rest unused). y may alias x: every lane has read its row before any
// lane writes (the warp's reductions lie between).
template <int N, bool V, bool ATTN>
__global__ static void softmax_warp_kernel(float *y, const float *x, int64_t rows, int64_t t,
                                           int u, int64_t t0, float scale, int causal) {
  int64_t r = (int64_t)blockIdx.x * SOFTMAX_WARPS + threadIdx.x / 32;
  if (r >= rows) return;
  int lane = threadIdx.x % 32, keys = ATTN ? (int)attn_keys(r, t, u, t0, causal) : u;
  float v[N];
  row_load<N, V>(v, x + r * u, keys, lane);
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < N; k++)
    if (lane_col<V>(k, lane) < keys) {
      if (ATTN) v[k] = v[k] * scale + 0.0f;
      m = v[k] > m ? v[k] : m;
    }
  m = kdrt_warp_reduce<kdrt_max_op<float> >(m);
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < N; k++)
    if (lane_col<V>(k, lane) < keys) {
      v[k] = expf(v[k] - m);
      s += v[k];
    }
  s = kdrt_warp_reduce<kdrt_sum_op<float> >(s);
  float inv = 1.0f / s;
#pragma unroll
  for (int k = 0; k < N; k++) v[k] = lane_col<V>(k, lane) < keys ? v[k] * inv : 0.0f;
  row_store<N, V>(y + r * u, v, u, lane);
}

// dx = y * (dy - dot) (ATTN: times scale, + 0.0f, 0 past the keys); dx may
// alias dy or y, as above.
template <int N, bool V, bool ATTN>
__global__ static void softmax_grad_warp_kernel(float *dx, const float *dy, const float *y,
                                                int64_t rows, int64_t t, int u, int64_t t0,
                                                float scale, int causal) {
  int64_t r = (int64_t)blockIdx.x * SOFTMAX_WARPS + threadIdx.x / 32;
  if (r >= rows) return;
  int lane = threadIdx.x % 32, keys = ATTN ? (int)attn_keys(r, t, u, t0, causal) : u;
  float g[N], w[N];
  row_load<N, V>(g, dy + r * u, keys, lane);
  row_load<N, V>(w, y + r * u, keys, lane);
  float dot = 0.0f;
#pragma unroll
  for (int k = 0; k < N; k++)
    if (lane_col<V>(k, lane) < keys) dot += g[k] * w[k];
  dot = kdrt_warp_reduce<kdrt_sum_op<float> >(dot);
#pragma unroll
  for (int k = 0; k < N; k++) {
    float e = ATTN ? w[k] * (g[k] - dot) * scale + 0.0f : w[k] * (g[k] - dot);
    g[k] = lane_col<V>(k, lane) < keys ? e : 0.0f;
  }
  row_store<N, V>(dx + r * u, g, u, lane);
}

// The warp kernels' N for rows of u (u <= SOFTMAX_WARP_COLS): at least 4
// (a float4 a lane), at least u / 32.
static int softmax_lane_floats(int64_t u) {
  int n = 4;
  while (32 * n < u) n *= 2;
  return n;
}

// Launches softmax_warp_kernel (grad 0) or softmax_grad_warp_kernel (grad
// 1; a: dy, b: y) for the row length's N and the buffers' alignment.
template <bool ATTN>
static void softmax_warp(kdrt_cuda *d, int grad, float *out, const float *a, const float *b,
                         int64_t rows, int64_t t, int64_t u, int64_t t0, float scale,
                         int causal) {
  int v = u % 4 == 0 && kdrt_aligned16(out) && kdrt_aligned16(a) && (!b || kdrt_aligned16(b));
  unsigned blocks = (unsigned)((rows + SOFTMAX_WARPS - 1) / SOFTMAX_WARPS);
  cudaStream_t st = d->impl->stream;
#define SOFTMAX_LAUNCH(N, V)                                                                     \
  do {                                                                                           \
    if (grad)                                                                                    \
      softmax_grad_warp_kernel<N, V, ATTN><<<blocks, 32 * SOFTMAX_WARPS, 0, st>>>(             \
          out, a, b, rows, t, (int)u, t0, scale, causal);                                        \
    else                                                                                         \
      softmax_warp_kernel<N, V, ATTN><<<blocks, 32 * SOFTMAX_WARPS, 0, st>>>(                  \
          out, a, rows, t, (int)u, t0, scale, causal);                                           \
  } while (0)
#define SOFTMAX_LAUNCH_N(N)                                                                      \
  do {                                                                                           \
    if (v) SOFTMAX_LAUNCH(N, true);                                                              \
    else SOFTMAX_LAUNCH(N, false);                                                               \
  } while (0)
  switch (softmax_lane_floats(u)) {
  case 4: SOFTMAX_LAUNCH_N(4); break;
  case 8: SOFTMAX_LAUNCH_N(8); break;
  case 16: SOFTMAX_LAUNCH_N(16); break;
  default: SOFTMAX_LAUNCH_N(32); break;
  }
#undef SOFTMAX_LAUNCH_N
#undef SOFTMAX_LAUNCH
  KDRT_LAUNCHED(d, grad ? "softmax_grad_warp_kernel" : "softmax_warp_kernel");
}

static void check_rows(int64_t rows) {
  if (rows > 2147483647)
    kdrt_cuda_fail("softmax", __FILE__, __LINE__, "more than 2^31-1 rows");
}

extern "C" void kdrt_cuda_softmax(kdrt_cuda *d, float *y, const float *x, int64_t rows,
                                  int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  if (cols <= SOFTMAX_WARP_COLS) {
    softmax_warp<false>(d, 0, y, x, NULL, rows, 1, cols, 0, 1.0f, 0);
    return;
  }
  softmax_kernel<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(y, x, cols);
  KDRT_LAUNCHED(d, "softmax_kernel");
}

extern "C" void kdrt_cuda_softmax_grad(kdrt_cuda *d, float *dx, const float *dy, const float *y,
                                       int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  if (cols <= SOFTMAX_WARP_COLS) {
    softmax_warp<false>(d, 1, dx, dy, y, rows, 1, cols, 0, 1.0f, 0);
    return;
  }
  softmax_grad_kernel<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(dx, dy, y,
                                                                                     cols);
  KDRT_LAUNCHED(d, "softmax_grad_kernel");
}

// issue 25: log_softmax and its gradient, one block a row (as softmax_kernel);
// y and x, dx and dy may alias: each thread reads and writes its own j.
__global__ static void log_softmax_kernel(float *y, const float *x, int64_t cols) {
  __shared__ float shm[32];
  const float *xr = x + (int64_t)blockIdx.x * cols;
  float *yr = y + (int64_t)blockIdx.x * cols;
  float m = block_row_max(xr, cols, shm);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - m);
  s = kdrt_block_reduce<kdrt_sum_op<float> >(s, shm);
  float l = logf(s);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = xr[j] - m - l;
}

__global__ static void log_softmax_grad_kernel(float *dx, const float *dy, const float *y,
                                               int64_t cols) {
  __shared__ float shm[32];
  int64_t off = (int64_t)blockIdx.x * cols;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += dy[off + j];
  s = kdrt_block_reduce<kdrt_sum_op<float> >(s, shm);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dx[off + j] = dy[off + j] - expf(y[off + j]) * s;
}

extern "C" void kdrt_cuda_log_softmax(kdrt_cuda *d, float *y, const float *x, int64_t rows,
                                      int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  log_softmax_kernel<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(y, x, cols);
  KDRT_LAUNCHED(d, "log_softmax_kernel");
}

extern "C" void kdrt_cuda_log_softmax_grad(kdrt_cuda *d, float *dx, const float *dy,
                                           const float *y, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  log_softmax_grad_kernel<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(
      dx, dy, y, cols);
  KDRT_LAUNCHED(d, "log_softmax_grad_kernel");
}

extern "C" void kdrt_cuda_attn_softmax(kdrt_cuda *d, float *y, const float *x, int64_t outer,
                                       int64_t t, int64_t u, int64_t t0, float scale, int causal) {
  int64_t rows = outer * t;
  if (rows <= 0 || u <= 0) return;
  check_rows(rows);
  if (u <= SOFTMAX_WARP_COLS) {
    softmax_warp<true>(d, 0, y, x, NULL, rows, t, u, t0, scale, causal);
    return;
  }
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
  if (u <= SOFTMAX_WARP_COLS) {
    softmax_warp<true>(d, 1, dx, dy, y, rows, t, u, t0, scale, causal);
    return;
  }
  attn_softmax_grad_kernel<<<(unsigned)rows, kdrt_row_threads(u), 0, d->impl->stream>>>(
      dx, dy, y, t, u, t0, scale, causal);
  KDRT_LAUNCHED(d, "attn_softmax_grad_kernel");
}
