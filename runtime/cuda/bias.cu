// bias.cu: the bias add with its activation epilogue (kdrt_bias_act) and
// the bias gradient (a column sum, kdrt_bias_grad).
//
// bias_act applies kdrt_act1 (common.cuh: KDRT_ACT_LIST, expanded as
// ../ops.c expands it), so both backends compute the same expressions; W
// floats a thread (16-byte accesses when cols % 4 == 0 and the buffers are
// aligned), the column kept by steps rather than by a 64-bit division per
// element (which cost more than the bytes).
//
// bias_grad sums each column in a fixed order: a block takes 32 * W
// columns (each thread W of them, a float4 when the buffer allows) and a
// chunk of rows; each of its 8 row lanes sums rows lane, lane+8, ... of the
// chunk in order, then the 8 lanes' sums are added in lane order, then the
// chunks' sums in chunk order (the same kernel again, over [chunks, cols]):
// deterministic from run to run (not bit-identical to the CPU's one running
// sum).
#include "common.cuh"
#include "kdrt_round.h"

// n: rows * cols; cw = cols / W.
template <int W>
__global__ static void bias_act_kernel(int rnd, int act, float *out, const float *in,
                                       const float *bias, size_t n, size_t cw) {
  kdrt_col_map<W>(out, in, bias, n, cw, [rnd, act](float x, float b) {
    return kdrt_round_opt(rnd, kdrt_act1(act, x + b));
  });
}

// rnd: kdrt_ops.def's _rnd kernels (KDRT_ROUND_NONE: bias_act's float32)
extern "C" void kdrt_cuda_bias_act_rnd(kdrt_cuda *d, int rnd, int act, float *out,
                                       const float *in, const float *bias, int64_t rows,
                                       int64_t cols) {
  if (act < 0 || act >= KDRT_ACT_COUNT)
    kdrt_cuda_fail("kdrt_cuda_bias_act", __FILE__, __LINE__, "unknown activation");
  size_t n = (size_t)rows * (size_t)cols;
  if (!n) return;
  if (cols % 4 == 0 && kdrt_aligned16(out) && kdrt_aligned16(in) && kdrt_aligned16(bias))
    bias_act_kernel<4><<<kdrt_blocks(n / 4), KDRT_THREADS, 0, d->impl->stream>>>(
        rnd, act, out, in, bias, n, (size_t)cols / 4);
  else
    bias_act_kernel<1><<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(
        rnd, act, out, in, bias, n, (size_t)cols);
  KDRT_LAUNCHED(d, "bias_act_kernel");
}

extern "C" void kdrt_cuda_bias_act(kdrt_cuda *d, int act, float *out, const float *in,
                                   const float *bias, int64_t rows, int64_t cols) {
  kdrt_cuda_bias_act_rnd(d, KDRT_ROUND_NONE, act, out, in, bias, rows, cols);
}

// The row lanes of a column-sum block (its blockDim: 32, ROW_LANES).
#define ROW_LANES 8

// blockIdx.y: a chunk of `chunk` rows; out: [gridDim.y, cols], each
// chunk's column sums. W 4: cols % 4 == 0 and `in` 16-byte aligned. Four
// rows' loads are issued before their adds (in row order), so that enough
// bytes are in flight.
template <int W>
__global__ static void col_sums_kernel(int rnd, float *out, const float *in, int64_t rows,
                                       int64_t cols, int64_t chunk) {
  __shared__ float part[ROW_LANES][32 * W];
  int64_t j = ((int64_t)blockIdx.x * 32 + threadIdx.x) * W;
  int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float s[W];
#pragma unroll
  for (int k = 0; k < W; k++) s[k] = 0.0f;
  if (j < cols) { // with W 4 all four columns are in
    const float *p = in + j;
    int64_t r = r0 + threadIdx.y;
    for (; r + 3 * ROW_LANES < r1; r += 4 * ROW_LANES) {
      float a[4][W];
#pragma unroll
      for (int u = 0; u < 4; u++) kdrt_ld<W>(a[u], p + (r + u * ROW_LANES) * cols);
#pragma unroll
      for (int u = 0; u < 4; u++)
#pragma unroll
        for (int k = 0; k < W; k++) s[k] += a[u][k];
    }
    for (; r < r1; r += ROW_LANES) {
      float a[W];
      kdrt_ld<W>(a, p + r * cols);
#pragma unroll
      for (int k = 0; k < W; k++) s[k] += a[k];
    }
  }
#pragma unroll
  for (int k = 0; k < W; k++) part[threadIdx.y][threadIdx.x * W + k] = s[k];
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
#pragma unroll
    for (int l = 1; l < ROW_LANES; l++)
#pragma unroll
      for (int k = 0; k < W; k++) s[k] += part[l][threadIdx.x * W + k];
#pragma unroll
    for (int k = 0; k < W; k++) s[k] = kdrt_round_opt(rnd, s[k]); // (the last pass's rnd)
    kdrt_st<W>(out + (int64_t)blockIdx.y * cols + j, s);
  }
}

// Column sums of in [rows, cols] into out [cols]: enough blocks to keep
// 1024 threads a multiprocessor of an H100 (132) busy, at least 32 rows a
// chunk (4 a row lane); then the chunks' sums [chunks, cols], in the
// scratch, by one chunk of the same kernel. Deterministic for given rows,
// cols and alignment. (The first version: 32 scalar columns and 32 row
// lanes a block, at most 11 chunks of [4096, 768]: 14.6 us a call on the
// GPT, 3x its bytes' time.) The sums rounded to rnd as they are stored.
template <int W>
static void col_sums(kdrt_cuda *d, int rnd, float *out, const float *in, int64_t rows,
                     int64_t cols) {
  int64_t cblocks = (cols + 32 * W - 1) / (32 * W);
  int64_t n = (4 * 132 + cblocks - 1) / cblocks, fit = rows / (4 * ROW_LANES);
  if (n > fit) n = fit;
  if (n > 1024) n = 1024;
  if (n < 1) n = 1;
  int64_t chunk = (rows + n - 1) / n;
  if (chunk < 1) chunk = 1;
  n = (rows + chunk - 1) / chunk; // no empty chunk
  if (n < 1) n = 1;
  dim3 block(32, ROW_LANES);
  if (n == 1) {
    col_sums_kernel<W><<<dim3((unsigned)cblocks, 1), block, 0, d->impl->stream>>>(
        rnd, out, in, rows, cols, chunk);
    KDRT_LAUNCHED(d, "col_sums_kernel");
    return;
  }
  float *part = (float *)kdrt_cuda_dscratch(d, 2, (size_t)(n * cols) * sizeof(float));
  col_sums_kernel<W><<<dim3((unsigned)cblocks, (unsigned)n), block, 0, d->impl->stream>>>(
      KDRT_ROUND_NONE, part, in, rows, cols, chunk);
  KDRT_LAUNCHED(d, "col_sums_kernel");
  col_sums_kernel<W><<<dim3((unsigned)cblocks, 1), block, 0, d->impl->stream>>>(rnd, out, part, n,
                                                                                cols, n);
  KDRT_LAUNCHED(d, "col_sums_kernel (the chunks)");
}

extern "C" void kdrt_cuda_bias_grad_rnd(kdrt_cuda *d, int rnd, float *out, const float *in,
                                        int64_t rows, int64_t cols) {
  if (cols <= 0) return;
  // float4s from in and into out (the scratch, cudaMalloc'd, is aligned)
  if (cols % 4 == 0 && kdrt_aligned16(in) && kdrt_aligned16(out))
    col_sums<4>(d, rnd, out, in, rows, cols);
  else
    col_sums<1>(d, rnd, out, in, rows, cols);
}

extern "C" void kdrt_cuda_bias_grad(kdrt_cuda *d, float *out, const float *in, int64_t rows,
                                    int64_t cols) {
  kdrt_cuda_bias_grad_rnd(d, KDRT_ROUND_NONE, out, in, rows, cols);
}
