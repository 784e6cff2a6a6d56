// norm.cu: layer and RMS normalization over the last dim (kdrt_norm,
// kdrt_norm_grad; with the scale and offset in one pass each way:
// kdrt_layer_norm, _dx, _dw), batch normalization (issue 15), the scale
// over trailing dims (kdrt_col_mul) and the causal mask of attention scores
// (kdrt_causal_mask), as ../norm.c and ../ops.c compute them. A layer
// normalization takes one warp a row: its statistics are summed in double
// by the 32 lanes in a fixed pattern (lane, lane + 32, ...) and then
// combined in a fixed butterfly order: deterministic from run to run, not
// bit-identical to the CPU's one running sum. What is made of the sums is
// ../kdrt_norm.h's, shared with the CPU.
#include "common.cuh"
#include "kdrt_norm.h"
#include "kdrt_round.h"

__device__ static double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// mean (0 for rms) and 1 / sqrt(var + eps) of row xr, on every lane.
__device__ static void row_stats(int rms, const float *xr, int64_t cols, float eps, double *mean,
                                 double *rstd) {
  int lane = threadIdx.x & 31;
  double m = 0;
  if (!rms) {
    for (int64_t j = lane; j < cols; j += 32) m += xr[j];
    m = warp_sum(m) / (double)cols;
  }
  double v = 0;
  for (int64_t j = lane; j < cols; j += 32) v += kdrt_norm_dev2(xr[j], m);
  *mean = m;
  *rstd = kdrt_norm_rstd(warp_sum(v), cols, eps);
}

// one warp a row, 8 rows a block
__global__ static void norm_kernel(int rms, float *y, const float *x, int64_t rows, int64_t cols,
                                   float eps) {
  int64_t r = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
  if (r >= rows) return;
  const float *xr = x + r * cols;
  double m, s;
  row_stats(rms, xr, cols, eps, &m, &s);
  for (int64_t j = threadIdx.x & 31; j < cols; j += 32) y[r * cols + j] = kdrt_norm_y(xr[j], m, s);
}

__global__ static void norm_grad_kernel(int rms, float *dx, const float *dy, const float *x,
                                        int64_t rows, int64_t cols, float eps) {
  int64_t r = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
  if (r >= rows) return;
  const float *xr = x + r * cols, *gr = dy + r * cols;
  double m, s, sg = 0, sgh = 0;
  row_stats(rms, xr, cols, eps, &m, &s);
  for (int64_t j = threadIdx.x & 31; j < cols; j += 32) {
    sg += gr[j];
    sgh += kdrt_norm_gh(gr[j], xr[j], m, s);
  }
  sg = warp_sum(sg);
  sgh = warp_sum(sgh);
  double mg = rms ? 0 : sg / (double)cols, mgh = sgh / (double)cols;
  for (int64_t j = threadIdx.x & 31; j < cols; j += 32)
    dx[r * cols + j] = kdrt_norm_dx(gr[j], xr[j], m, s, mg, mgh);
}

extern "C" void kdrt_cuda_norm(kdrt_cuda *d, int rms, float *y, const float *x, int64_t rows,
                               int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0) return;
  norm_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, d->impl->stream>>>(rms, y, x, rows, cols, eps);
  KDRT_LAUNCHED(d, "norm_kernel");
}

extern "C" void kdrt_cuda_norm_grad(kdrt_cuda *d, int rms, float *dx, const float *dy,
                                    const float *x, int64_t rows, int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0) return;
  norm_grad_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, d->impl->stream>>>(rms, dx, dy, x, rows,
                                                                             cols, eps);
  KDRT_LAUNCHED(d, "norm_grad_kernel");
}

// As bias.cu's bias_act (issue 22): W floats a thread (kdrt_col_map).
template <int W>
__global__ static void col_mul_kernel(float *out, const float *in, const float *g, size_t n,
                                      size_t cw) {
  kdrt_col_map<W>(out, in, g, n, cw, [](float x, float s) { return x * s; });
}

extern "C" void kdrt_cuda_col_mul(kdrt_cuda *d, float *out, const float *in, const float *g,
                                  int64_t rows, int64_t cols) {
  size_t n = (size_t)rows * (size_t)cols;
  if (!n) return;
  if (cols % 4 == 0 && kdrt_aligned16(out) && kdrt_aligned16(in) && kdrt_aligned16(g))
    col_mul_kernel<4><<<kdrt_blocks(n / 4), KDRT_THREADS, 0, d->impl->stream>>>(
        out, in, g, n, (size_t)cols / 4);
  else
    col_mul_kernel<1><<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, in, g, n,
                                                                            (size_t)cols);
  KDRT_LAUNCHED(d, "col_mul_kernel");
}

// Two column sums over rows, of bn_stats and layer_norm_dw: 32 columns a
// block, its 32 row lanes each summing rows lane, lane + 32, ... of the
// block's chunk of rows (blockIdx.y: `chunk` rows) in T, the lanes added in
// lane order, then the chunks' sums in chunk order (col_sums2_chunks):
// deterministic, not bit-identical to the CPU's blocks. The rows are cut
// into chunks (kdrt_row_chunks) because a layer's channels alone give a
// block or two (the first GPU run: bn_stats 155 us a call, 60% of the
// ResNet's step). add(r, j, s, t) adds row r's summands of column j to s
// and t; part: [gridDim.y, 2, cols], each chunk's two sums.
template <typename T, typename F>
__device__ static inline void col_sums2(T *part, int64_t rows, int64_t cols, int64_t chunk,
                                        F add) {
  __shared__ T sp[2][32][33];
  int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x;
  int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  T s = 0, t = 0;
  if (j < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 32) add(r, j, s, t);
  sp[0][threadIdx.y][threadIdx.x] = s;
  sp[1][threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    for (int k = 1; k < 32; k++) {
      s += sp[0][k][threadIdx.x];
      t += sp[1][k][threadIdx.x];
    }
    T *o = part + (int64_t)blockIdx.y * 2 * cols; // this chunk's [2, cols]
    o[j] = s;
    o[cols + j] = t;
  }
}

// out0[j], out1[j] (either NULL: not wanted) = the chunks' two sums, in
// chunk order.
template <typename T>
__global__ static void col_sums2_chunks(float *out0, float *out1, const T *part, int nchunks,
                                        int64_t cols) {
  KDRT_FOR(j, (size_t)cols) {
    T s = 0, t = 0;
    for (int k = 0; k < nchunks; k++) {
      s += part[(int64_t)k * 2 * cols + (int64_t)j];
      t += part[(int64_t)k * 2 * cols + cols + (int64_t)j];
    }
    if (out0) out0[j] = (float)s;
    if (out1) out1[j] = (float)t;
  }
}

// The chunks' sums of a col_sums2 kernel's part into out0, out1.
template <typename T>
static void launch_col_sums2(kdrt_cuda *d, const char *what, float *out0, float *out1, T *part,
                             int64_t nchunks, int64_t cols) {
  col_sums2_chunks<T><<<kdrt_blocks((size_t)cols), KDRT_THREADS, 0, d->impl->stream>>>(
      out0, out1, part, (int)nchunks, cols);
  KDRT_LAUNCHED(d, what);
}

// issue 15: batch normalization (kdrt_bn_stats, kdrt_batch_norm,
// kdrt_bn_grad). The statistics: column sums in double, of x (m NULL), (x -
// m)^2 (dy NULL), or dy and dy (x - m): row r's summands of column j.
// xv = x[r, j], mv = m[j], gv = dy[r, j] (the last two read only when m,
// dy are given): row r's summands of column j.
__device__ static inline void bn_add(bool has_m, bool has_dy, float xv, float mv, float gv,
                                     double &s, double &t) {
  if (!has_m) {
    s += xv;
  } else if (!has_dy) {
    float d = xv - mv;
    s += (double)d * d;
  } else {
    s += gv;
    t += (double)gv * (xv - mv);
  }
}

__global__ static void bn_stats_kernel(double *out, const float *x, const float *m,
                                       const float *dy, int64_t rows, int64_t cols,
                                       int64_t chunk) {
  col_sums2<double>(out, rows, cols, chunk, [=](int64_t r, int64_t j, double &s, double &t) {
    bn_add(m, dy, x[r * cols + j], m ? m[j] : 0.0f, dy ? dy[r * cols + j] : 0.0f, s, t);
  });
}

// issue 22, KDRT_CUDA_CUDNN=1: bn_stats in two levels at memory bandwidth
// (col_sums2's 32-column blocks read 64 or 128 bytes a warp of a ResNet's
// 16- to 64-channel rows, and its chunks' sums were one serial loop a
// column). Level one: 256 threads a block, `tw` of them across a tile of tw
// * W columns (W = 4: 16-byte loads) and 256 / tw row lanes down the
// block's chunk of rows (blockIdx.y), each summing in double; the lanes
// added by a fixed tree into part[chunk][2][cols]. Level two: one warp a
// column and sum, the chunks strided over its lanes, then a fixed
// butterfly. The same bits every run (the grid depends on the shape and
// alignment only); not bit-identical to col_sums2's order.
enum { BN_THREADS = 256, BN_BLOCKS = 528 }; // 4 blocks for each of an H100's 132 SMs
template <int W>
__global__ static void bn_part_kernel(double *part, const float *x, const float *m,
                                      const float *dy, int64_t rows, int64_t cols, int64_t chunk,
                                      int tw) {
  __shared__ double sh[2][BN_THREADS][W];
  const int g = threadIdx.x % tw, lane = threadIdx.x / tw, lanes = BN_THREADS / tw;
  const int64_t j0 = ((int64_t)blockIdx.x * tw + g) * W; // this thread's first column
  const int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  double s[W], t[W];
  float mv[W];
#pragma unroll
  for (int k = 0; k < W; k++) s[k] = 0, t[k] = 0, mv[k] = m && j0 < cols ? m[j0 + k] : 0.0f;
  if (j0 < cols) {
#pragma unroll 4
    for (int64_t r = r0 + lane; r < r1; r += lanes) {
      float xv[W], gv[W] = {};
      kdrt_ld<W>(xv, x + r * cols + j0);
      if (dy) kdrt_ld<W>(gv, dy + r * cols + j0);
#pragma unroll
      for (int k = 0; k < W; k++) bn_add(m, dy, xv[k], mv[k], gv[k], s[k], t[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < W; k++) sh[0][threadIdx.x][k] = s[k], sh[1][threadIdx.x][k] = t[k];
  for (int half = lanes / 2; half >= 1; half /= 2) { // lane l += lane l + half
    __syncthreads();
    if (lane < half)
#pragma unroll
      for (int k = 0; k < W; k++) {
        sh[0][threadIdx.x][k] += sh[0][threadIdx.x + half * tw][k];
        sh[1][threadIdx.x][k] += sh[1][threadIdx.x + half * tw][k];
      }
  }
  __syncthreads();
  if (lane == 0 && j0 < cols) {
    double *o = part + (int64_t)blockIdx.y * 2 * cols; // this chunk's [2, cols]
#pragma unroll
    for (int k = 0; k < W; k++) o[j0 + k] = sh[0][g][k], o[cols + j0 + k] = sh[1][g][k];
  }
}

// out[j] (sum 0) and out[cols + j] (sum 1, when `two`): warp j + w * cols
// adds sum w of column j over the chunks.
__global__ static void bn_final_kernel(float *out, const double *part, int nchunks, int64_t cols,
                                       int two) {
  int64_t wi = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (wi >= (two ? 2 : 1) * cols) return; // (a whole warp)
  int64_t j = wi % cols, w = wi / cols;
  double v = 0;
  for (int k = lane; k < nchunks; k += 32) v += part[(int64_t)k * 2 * cols + w * cols + j];
  v = warp_sum(v);
  if (lane == 0) out[w * cols + j] = (float)v;
}

static void bn_stats2(kdrt_cuda *d, float *out, const float *x, const float *m, const float *dy,
                      int64_t rows, int64_t cols) {
  const int W = cols % 4 == 0 && kdrt_aligned16(x) && (!dy || kdrt_aligned16(dy)) ? 4 : 1;
  int64_t cw = cols / W, tw = 1; // column groups; those a block's tile spans
  while (tw < cw && tw < BN_THREADS) tw *= 2;
  const int64_t tiles = (cw + tw - 1) / tw, lanes = BN_THREADS / tw;
  // chunks: BN_BLOCKS blocks in all, each lane at least 4 rows
  int64_t nchunks = (BN_BLOCKS + tiles - 1) / tiles, most = (rows + 4 * lanes - 1) / (4 * lanes);
  if (nchunks > most) nchunks = most;
  if (nchunks > 65535) nchunks = 65535;
  if (nchunks < 1) nchunks = 1;
  int64_t chunk = (rows + nchunks - 1) / nchunks;
  if (chunk < 1) chunk = 1;
  double *part = (double *)kdrt_cuda_dscratch(d, 2, (size_t)(nchunks * 2 * cols) * sizeof(double));
  dim3 grid((unsigned)tiles, (unsigned)nchunks);
  if (W == 4)
    bn_part_kernel<4><<<grid, BN_THREADS, 0, d->impl->stream>>>(part, x, m, dy, rows, cols, chunk,
                                                               (int)tw);
  else
    bn_part_kernel<1><<<grid, BN_THREADS, 0, d->impl->stream>>>(part, x, m, dy, rows, cols, chunk,
                                                               (int)tw);
  KDRT_LAUNCHED(d, "bn_part_kernel");
  size_t threads = (size_t)(dy ? 2 : 1) * (size_t)cols * 32;
  bn_final_kernel<<<(unsigned)((threads + BN_THREADS - 1) / BN_THREADS), BN_THREADS, 0,
                    d->impl->stream>>>(out, part, (int)nchunks, cols, dy != NULL);
  KDRT_LAUNCHED(d, "bn_final_kernel");
}

extern "C" void kdrt_cuda_bn_stats(kdrt_cuda *d, float *out, const float *x, const float *m,
                                   const float *dy, int64_t rows, int64_t cols) {
  if (cols <= 0) return;
  if (d->impl->cudnn & KDRT_CUDNN_CONV) return bn_stats2(d, out, x, m, dy, rows, cols);
  unsigned cblocks = (unsigned)((cols + 31) / 32);
  int64_t chunk, nchunks = kdrt_row_chunks(rows, cols, 256, &chunk);
  double *part = (double *)kdrt_cuda_dscratch(d, 2, (size_t)(nchunks * 2 * cols) * sizeof(double));
  bn_stats_kernel<<<dim3(cblocks, (unsigned)nchunks), dim3(32, 32), 0, d->impl->stream>>>(
      part, x, m, dy, rows, cols, chunk);
  KDRT_LAUNCHED(d, "bn_stats_kernel");
  launch_col_sums2(d, "bn_stats' col_sums2_chunks", out, dy ? out + cols : NULL, part, nchunks,
                   cols);
}

__global__ static void batch_norm_kernel(int act, float *y, const float *x, const float *m,
                                         const float *var, const float *g, const float *b,
                                         int64_t rows, int64_t cols, float eps) {
  size_t n = (size_t)rows * (size_t)cols;
  KDRT_FOR(e, n) {
    size_t j = e % (size_t)cols;
    float inv = kdrt_bn_scale(var[j], eps, g[j]);
    y[e] = kdrt_act1(act, x[e] * inv + kdrt_bn_shift(m[j], inv, b[j]));
  }
}

extern "C" void kdrt_cuda_batch_norm(kdrt_cuda *d, int act, float *y, const float *x,
                                     const float *m, const float *var, const float *g,
                                     const float *b, int64_t rows, int64_t cols, float eps) {
  if (act < 0 || act >= KDRT_ACT_COUNT)
    kdrt_cuda_fail("kdrt_cuda_batch_norm", __FILE__, __LINE__, "unknown activation");
  size_t n = (size_t)rows * (size_t)cols;
  if (!n) return;
  batch_norm_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(act, y, x, m, var, g, b,
                                                                          rows, cols, eps);
  KDRT_LAUNCHED(d, "batch_norm_kernel");
}

// The gradient's three per-column factors (k, a, c) first, in double as
// the CPU forms them, then one pass over the rows: the same floats as
// forming them per element, without a double square root per element.
__global__ static void bn_grad_coef_kernel(float *coef, const float *var, const float *g,
                                           const float *s, int64_t cols, float eps, double n) {
  KDRT_FOR(j, (size_t)cols)
    kdrt_bn_grad_coef(var[j], eps, g[j], s[j], s[cols + j], n, &coef[j], &coef[cols + j],
                      &coef[2 * cols + j]);
}

__global__ static void bn_grad_kernel(float *dx, const float *dy, const float *x, const float *m,
                                      const float *coef, int64_t rows, int64_t cols) {
  size_t total = (size_t)rows * (size_t)cols;
  KDRT_FOR(e, total) {
    size_t j = e % (size_t)cols;
    float k = coef[j], a = coef[cols + j], c = coef[2 * cols + j];
    dx[e] = kdrt_bn_dx(dy[e], x[e], m[j], k, a, c);
  }
}

extern "C" void kdrt_cuda_bn_grad(kdrt_cuda *d, float *dx, const float *dy, const float *x,
                                  const float *m, const float *var, const float *g,
                                  const float *s, int64_t rows, int64_t cols, float eps,
                                  double n) {
  size_t total = (size_t)rows * (size_t)cols;
  if (!total) return;
  float *coef = (float *)kdrt_cuda_dscratch(d, 2, (size_t)(3 * cols) * sizeof(float));
  bn_grad_coef_kernel<<<kdrt_blocks((size_t)cols), KDRT_THREADS, 0, d->impl->stream>>>(
      coef, var, g, s, cols, eps, n);
  KDRT_LAUNCHED(d, "bn_grad_coef_kernel");
  bn_grad_kernel<<<kdrt_blocks(total), KDRT_THREADS, 0, d->impl->stream>>>(dx, dy, x, m, coef,
                                                                           rows, cols);
  KDRT_LAUNCHED(d, "bn_grad_kernel");
}

__global__ static void causal_mask_kernel(float *y, const float *x, int64_t outer, int64_t t,
                                          int64_t u, int64_t t0, int64_t u0, int64_t window,
                                          float fill) {
  size_t n = (size_t)outer * (size_t)t * (size_t)u;
  KDRT_FOR(k, n) {
    int64_t j = (int64_t)(k % (size_t)u), i = (int64_t)(k / (size_t)u % (size_t)t);
    y[k] = kdrt_key_masked(t0 + i, u0 + j, window) ? fill : x[k];
  }
}

extern "C" void kdrt_cuda_causal_mask(kdrt_cuda *d, float *y, const float *x, int64_t outer,
                                      int64_t t, int64_t u, int64_t t0, int64_t u0,
                                      int64_t window, float fill) {
  size_t n = (size_t)outer * (size_t)t * (size_t)u;
  if (!n) return;
  causal_mask_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(y, x, outer, t, u, t0,
                                                                           u0, window, fill);
  KDRT_LAUNCHED(d, "causal_mask_kernel");
}

__global__ static void attention_mask_kernel(float *y, const float *x, const void *m, int m_int,
                                             int64_t outer, int64_t heads, int64_t inner,
                                             int64_t m_inner, float fill) {
  size_t n = (size_t)outer * (size_t)heads * (size_t)inner;
  KDRT_FOR(k, n) {
    size_t j = k % (size_t)inner, o = k / (size_t)inner / (size_t)heads;
    size_t q = o * (size_t)m_inner + j % (size_t)m_inner;
    bool keep = m_int ? ((const int32_t *)m)[q] != 0 : ((const float *)m)[q] != 0.0f;
    y[k] = keep ? x[k] : fill;
  }
}

extern "C" void kdrt_cuda_attention_mask(kdrt_cuda *d, float *y, const float *x, const void *m,
                                         int m_int, int64_t outer, int64_t heads, int64_t inner,
                                         int64_t m_inner, float fill) {
  size_t n = (size_t)outer * (size_t)heads * (size_t)inner;
  if (!n) return;
  attention_mask_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(
    y, x, m, m_int, outer, heads, inner, m_inner, fill);
  KDRT_LAUNCHED(d, "attention_mask_kernel");
}

// ---- Keras's LayerNormalization in one pass each way (layer_norm,
// layer_norm_dx, layer_norm_dw). Forward and dx: one warp a row, as above,
// with float4 loads where a row allows them (cols a multiple of 4, every
// pointer 16-byte aligned); the lane pattern is fixed for given cols, so
// the sums are deterministic. The row stays in L1 between its passes.

// v = float j of p (VEC: its float4 j, four floats), a lane's load.
template <bool VEC>
__device__ static inline void row_load(const float *p, int64_t j, float v[4]) {
  if (VEC) {
    float4 q = reinterpret_cast<const float4 *>(p)[j];
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    v[0] = p[j];
  }
}

// mean (0 for rms) and rstd of row xr on every lane; W: floats a lane reads at a time.
template <bool VEC>
__device__ static void row_stats_v(int rms, const float *xr, int64_t cols, float eps, double *mean,
                                   double *rstd) {
  const int W = VEC ? 4 : 1;
  int lane = threadIdx.x & 31;
  int64_t nv = cols / W;
  float v[4];
  double m = 0;
  if (!rms) {
    for (int64_t j = lane; j < nv; j += 32) {
      row_load<VEC>(xr, j, v);
      for (int k = 0; k < W; k++) m += v[k];
    }
    m = warp_sum(m) / (double)cols;
  }
  double q = 0;
  for (int64_t j = lane; j < nv; j += 32) {
    row_load<VEC>(xr, j, v);
    for (int k = 0; k < W; k++) q += kdrt_norm_dev2(v[k], m);
  }
  *mean = m;
  *rstd = kdrt_norm_rstd(warp_sum(q), cols, eps);
}

template <bool VEC>
__global__ static void layer_norm_kernel(int rnd, int rms, float *__restrict__ y,
                                         const float *__restrict__ x, const float *__restrict__ g,
                                         const float *__restrict__ b, int64_t rows, int64_t cols,
                                         float eps) {
  const int W = VEC ? 4 : 1;
  int64_t r = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
  if (r >= rows) return;
  const float *xr = x + r * cols;
  float *yr = y + r * cols;
  double m, s;
  row_stats_v<VEC>(rms, xr, cols, eps, &m, &s);
  float v[4], gv[4] = {1, 1, 1, 1}, bv[4] = {0, 0, 0, 0};
  for (int64_t j = threadIdx.x & 31; j < cols / W; j += 32) {
    row_load<VEC>(xr, j, v);
    if (g) row_load<VEC>(g, j, gv);
    if (b) row_load<VEC>(b, j, bv);
    for (int k = 0; k < W; k++) {
      float h = kdrt_norm_y(v[k], m, s);
      if (g) h = __fmul_rn(h, gv[k]); // rounded, then added: the CPU's two steps
      if (b) h = __fadd_rn(h, bv[k]);
      v[k] = kdrt_round_opt(rnd, h); // (kdrt_ops.def's _rnd kernels)
    }
    if (VEC)
      reinterpret_cast<float4 *>(yr)[j] = make_float4(v[0], v[1], v[2], v[3]);
    else
      yr[j] = v[0];
  }
}

template <bool VEC>
__global__ static void layer_norm_dx_kernel(int rms, float *__restrict__ dx,
                                            const float *__restrict__ dy,
                                            const float *__restrict__ x,
                                            const float *__restrict__ g, int64_t rows,
                                            int64_t cols, float eps) {
  const int W = VEC ? 4 : 1;
  int64_t r = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
  if (r >= rows) return;
  const float *xr = x + r * cols, *gr = dy + r * cols;
  float *dr = dx + r * cols;
  double m, s, sg = 0, sgh = 0;
  row_stats_v<VEC>(rms, xr, cols, eps, &m, &s);
  float v[4], d[4], gv[4] = {1, 1, 1, 1};
  for (int64_t j = threadIdx.x & 31; j < cols / W; j += 32) {
    row_load<VEC>(xr, j, v);
    row_load<VEC>(gr, j, d);
    if (g) row_load<VEC>(g, j, gv);
    for (int k = 0; k < W; k++) {
      float e = g ? __fmul_rn(d[k], gv[k]) : d[k];
      sg += e;
      sgh += kdrt_norm_gh(e, v[k], m, s);
    }
  }
  sg = warp_sum(sg);
  sgh = warp_sum(sgh);
  double mg = rms ? 0 : sg / (double)cols, mgh = sgh / (double)cols;
  for (int64_t j = threadIdx.x & 31; j < cols / W; j += 32) {
    row_load<VEC>(xr, j, v);
    row_load<VEC>(gr, j, d);
    if (g) row_load<VEC>(g, j, gv);
    for (int k = 0; k < W; k++) {
      float e = g ? __fmul_rn(d[k], gv[k]) : d[k];
      v[k] = kdrt_norm_dx(e, v[k], m, s, mg, mgh);
    }
    if (VEC)
      reinterpret_cast<float4 *>(dr)[j] = make_float4(v[0], v[1], v[2], v[3]);
    else
      dr[j] = v[0];
  }
}

// float4 loads for rows of cols floats at each of these pointers (NULL: none).
static bool rows_vec4(int64_t cols, const void *a, const void *b, const void *c, const void *e) {
  uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)e;
  return cols % 4 == 0 && (u & 15) == 0;
}

extern "C" void kdrt_cuda_layer_norm_rnd(kdrt_cuda *d, int rnd, int rms, float *y,
                                         const float *x, const float *g, const float *b,
                                         int64_t rows, int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0) return;
  unsigned blocks = (unsigned)((rows + 7) / 8);
  if (rows_vec4(cols, y, x, g, b))
    layer_norm_kernel<true><<<blocks, 256, 0, d->impl->stream>>>(rnd, rms, y, x, g, b, rows, cols,
                                                                 eps);
  else
    layer_norm_kernel<false><<<blocks, 256, 0, d->impl->stream>>>(rnd, rms, y, x, g, b, rows,
                                                                  cols, eps);
  KDRT_LAUNCHED(d, "layer_norm_kernel");
}

extern "C" void kdrt_cuda_layer_norm(kdrt_cuda *d, int rms, float *y, const float *x,
                                     const float *g, const float *b, int64_t rows, int64_t cols,
                                     float eps) {
  kdrt_cuda_layer_norm_rnd(d, KDRT_ROUND_NONE, rms, y, x, g, b, rows, cols, eps);
}

extern "C" void kdrt_cuda_layer_norm_dx(kdrt_cuda *d, int rms, float *dx, const float *dy,
                                        const float *x, const float *g, int64_t rows,
                                        int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0) return;
  unsigned blocks = (unsigned)((rows + 7) / 8);
  if (rows_vec4(cols, dx, dy, x, g))
    layer_norm_dx_kernel<true><<<blocks, 256, 0, d->impl->stream>>>(rms, dx, dy, x, g, rows, cols,
                                                                    eps);
  else
    layer_norm_dx_kernel<false><<<blocks, 256, 0, d->impl->stream>>>(rms, dx, dy, x, g, rows,
                                                                     cols, eps);
  KDRT_LAUNCHED(d, "layer_norm_dx_kernel");
}

// layer_norm_dw: each row's (mean, rstd) first (a warp a row), then the
// column sums of dy * h and dy by col_sums2 (32 columns a block, 32 row
// lanes, chunks of rows), then the chunks' sums in chunk order. No atomics:
// the same bits from run to run.
__global__ static void row_stats_kernel(int rms, double2 *st, const float *x, int64_t rows,
                                        int64_t cols, float eps) {
  int64_t r = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
  if (r >= rows) return;
  double m, s;
  row_stats(rms, x + r * cols, cols, eps, &m, &s);
  if ((threadIdx.x & 31) == 0) st[r] = make_double2(m, s);
}

// part: [gridDim.y, 2, cols], each chunk's sums of dy * h (0) and dy (1),
// in float.
__global__ static void layer_norm_dw_kernel(float *part, const float *dy, const float *x,
                                            const double2 *st, int64_t rows, int64_t cols,
                                            int64_t chunk, int want_g, int want_b) {
  col_sums2<float>(part, rows, cols, chunk, [=](int64_t r, int64_t j, float &a, float &c) {
    float gv = dy[r * cols + j];
    if (want_g) {
      double2 ms = st[r];
      a += __fmul_rn(gv, kdrt_norm_y(x[r * cols + j], ms.x, ms.y));
    }
    if (want_b) c += gv;
  });
}

extern "C" void kdrt_cuda_layer_norm_dw(kdrt_cuda *d, int rms, float *dg, float *db,
                                        const float *dy, const float *x, int64_t rows,
                                        int64_t cols, float eps) {
  if (cols <= 0 || (!dg && !db)) return;
  unsigned cblocks = (unsigned)((cols + 31) / 32);
  int64_t chunk, nchunks = kdrt_row_chunks(rows, cols, 64, &chunk);
  size_t st_bytes = (size_t)(rows > 0 ? rows : 1) * sizeof(double2);
  char *scr = (char *)kdrt_cuda_dscratch(d, 2, st_bytes + (size_t)(nchunks * 2 * cols) *
                                                              sizeof(float));
  double2 *st = (double2 *)scr;
  float *part = (float *)(scr + st_bytes);
  if (dg && rows > 0) {
    row_stats_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, d->impl->stream>>>(rms, st, x, rows,
                                                                              cols, eps);
    KDRT_LAUNCHED(d, "row_stats_kernel");
  }
  layer_norm_dw_kernel<<<dim3(cblocks, (unsigned)nchunks), dim3(32, 32), 0, d->impl->stream>>>(
      part, dy, x, st, rows, cols, chunk, dg != NULL, db != NULL);
  KDRT_LAUNCHED(d, "layer_norm_dw_kernel");
  launch_col_sums2(d, "layer_norm_dw's col_sums2_chunks", dg, db, part, nchunks, cols);
}
