// xent.cu: sparse crossentropy from logits with the class dim split over
// ranks (kdrt_row_max, kdrt_row_sumexp, kdrt_sparse_xent and its gradient
// and accuracy in ../loss.c). x [rows, cols] holds columns [col0, col0 +
// cols) of each row; m and s are the row maxima and sums of exp after the
// caller's all-reduces.
//
// Row reductions are one block per row (block reductions: the sums of exp
// may differ from the CPU's running sums in the last bits). The loss adds
// the rows in a fixed order in double (one block), the gradient is one
// thread per element, the accuracy one block per row then a fixed-order
// sum: deterministic from run to run.
#include "common.cuh"
#include "kdrt_loss.h" // the row's loss and derivative, as ../loss.c's
#include "kdrt_round.h" // issue 22: the fused gradient rounded as stored

__global__ static void row_max_kernel(float *out, const float *x, int64_t cols) {
  __shared__ float shm[32];
  const float *xr = x + (int64_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = xr[j] > m ? xr[j] : m;
  m = kdrt_block_reduce<kdrt_max_op<float> >(m, shm);
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

__global__ static void row_sumexp_kernel(float *out, const float *x, const float *m,
                                         int64_t cols) {
  __shared__ float shm[32];
  const float *xr = x + (int64_t)blockIdx.x * cols;
  const float mr = m[blockIdx.x];
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - mr);
  s = kdrt_block_reduce<kdrt_sum_op<float> >(s, shm);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

extern "C" void kdrt_cuda_row_max(kdrt_cuda *d, float *out, const float *x, int64_t rows,
                                  int64_t cols) {
  if (rows <= 0) return;
  kdrt_cuda_check_rows(rows, "kdrt_cuda_row_max");
  row_max_kernel<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(out, x, cols);
  KDRT_LAUNCHED(d, "row_max_kernel");
}

extern "C" void kdrt_cuda_row_sumexp(kdrt_cuda *d, float *out, const float *x, const float *m,
                                     int64_t rows, int64_t cols) {
  if (rows <= 0) return;
  kdrt_cuda_check_rows(rows, "kdrt_cuda_row_sumexp");
  row_sumexp_kernel<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(out, x, m,
                                                                                    cols);
  KDRT_LAUNCHED(d, "row_sumexp_kernel");
}

// One block of 256: thread t adds rows t, t + 256, ... in double, then the
// block's partial sums are added in a fixed order.
__global__ static void sparse_xent_kernel(float *out, const float *x, const float *y,
                                          const float *m, const float *s, const float *w,
                                          int64_t rows, int64_t cols, int64_t col0,
                                          double scale) {
  __shared__ double shd[32];
  double total = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    int64_t c = kdrt_xent_class(y, r, cols, col0);
    if (c < 0) continue;
    double l = kdrt_xent_row_loss(m[r], s[r], x[r * cols + c]);
    total += w ? (double)w[r] * l : l;
  }
  total = kdrt_block_reduce<kdrt_sum_op<double> >(total, shd);
  if (threadIdx.x == 0) out[0] = (float)(total * scale);
}

extern "C" void kdrt_cuda_sparse_xent(kdrt_cuda *d, float *out, const float *x, const float *y,
                                      const float *m, const float *s, int64_t rows, int64_t cols,
                                      int64_t col0, double scale) {
  sparse_xent_kernel<<<1, 256, 0, d->impl->stream>>>(out, x, y, m, s, NULL, rows, cols, col0,
                                                     scale);
  KDRT_LAUNCHED(d, "sparse_xent_kernel");
}

// kdcc --sample-weight: each row's loss, gradient or hit times w[r].
extern "C" void kdrt_cuda_sparse_xent_w(kdrt_cuda *d, float *out, const float *x,
                                        const float *y, const float *m, const float *s,
                                        const float *w, int64_t rows, int64_t cols,
                                        int64_t col0, double scale) {
  sparse_xent_kernel<<<1, 256, 0, d->impl->stream>>>(out, x, y, m, s, w, rows, cols, col0,
                                                     scale);
  KDRT_LAUNCHED(d, "sparse_xent_kernel");
}

// Rows over blockIdx.y (striding by gridDim.y), each row's columns over
// the x blocks and threads: the row's label, maximum and sum read once, no
// division per element. (The first version, one thread per element with
// 64-bit e / cols and e % cols, ran GPT-2's [8192, 50257] logits at 1.8 ms,
// about 2.5 times its bytes' time; GPU run 4.) Each element's formula is
// the same: the same bits.
__global__ static void sparse_xent_grad_kernel(float *dx, const float *x, const float *y,
                                               const float *m, const float *s, const float *w,
                                               int64_t rows, int64_t cols, int64_t col0,
                                               float sc, double scale) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float *xr = x + r * cols;
    float *dr = dx + r * cols;
    int labelled = y[r] >= 0.0f; // no class: 0, as kdrt_loss_grad
    int64_t c = kdrt_xent_class(y, r, cols, col0);
    float scr = w ? (float)((double)w[r] * scale) : sc, mr = m[r], sr = s[r];
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < cols;
         j += (int64_t)gridDim.x * blockDim.x)
      dr[j] = labelled ? kdrt_xent_dterm(scr, expf(xr[j] - mr), sr, j == c) : 0.0f;
  }
}

static void sparse_xent_grad(kdrt_cuda *d, float *dx, const float *x, const float *y,
                             const float *m, const float *s, const float *w, int64_t rows,
                             int64_t cols, int64_t col0, double scale) {
  if (rows <= 0 || cols <= 0) return;
  unsigned t = kdrt_row_threads(cols);
  int64_t bx = (cols + t - 1) / t;
  dim3 grid((unsigned)(bx < 1024 ? bx : 1024), (unsigned)(rows < 65535 ? rows : 65535));
  sparse_xent_grad_kernel<<<grid, t, 0, d->impl->stream>>>(dx, x, y, m, s, w, rows, cols, col0,
                                                           (float)scale, scale);
  KDRT_LAUNCHED(d, "sparse_xent_grad_kernel");
}

extern "C" void kdrt_cuda_sparse_xent_grad(kdrt_cuda *d, float *dx, const float *x,
                                           const float *y, const float *m, const float *s,
                                           int64_t rows, int64_t cols, int64_t col0,
                                           double scale) {
  sparse_xent_grad(d, dx, x, y, m, s, NULL, rows, cols, col0, scale);
}

extern "C" void kdrt_cuda_sparse_xent_grad_w(kdrt_cuda *d, float *dx, const float *x,
                                             const float *y, const float *m, const float *s,
                                             const float *w, int64_t rows, int64_t cols,
                                             int64_t col0, double scale) {
  sparse_xent_grad(d, dx, x, y, m, s, w, rows, cols, col0, scale);
}

// ok[r] = 1 when row r's label is in this block, its logit equals m[r] and
// no earlier column of the block does (the first maximum), else 0.
__global__ static void sparse_xent_acc_rows(double *ok, const float *x, const float *y,
                                            const float *m, int64_t cols, int64_t col0) {
  __shared__ int shi[32];
  int64_t r = blockIdx.x;
  int64_t c = kdrt_xent_class(y, r, cols, col0);
  const float *xr = x + r * cols;
  int hit = c >= 0 && xr[c] == m[r];
  int earlier = 0;
  if (hit)
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) earlier |= xr[j] == m[r];
  earlier = kdrt_block_reduce<kdrt_max_op<int> >(earlier, shi);
  if (threadIdx.x == 0) ok[r] = hit && !earlier ? 1.0 : 0.0;
}

// Each row's hit (times its weight w[r]; w NULL: 1), summed in row order.
static void sparse_xent_acc(kdrt_cuda *d, float *out, const float *x, const float *y,
                            const float *m, const float *w, int64_t rows, int64_t cols,
                            int64_t col0, double scale) {
  kdrt_cuda_check_rows(rows, "kdrt_cuda_sparse_xent_acc");
  double *ok = (double *)kdrt_cuda_dscratch(d, 2, (size_t)(rows > 0 ? rows : 1) * sizeof(double));
  if (rows > 0) {
    sparse_xent_acc_rows<<<(unsigned)rows, kdrt_row_threads(cols), 0, d->impl->stream>>>(
        ok, x, y, m, cols, col0);
    KDRT_LAUNCHED(d, "sparse_xent_acc_rows");
  }
  if (w) kdrt_cuda_weigh_rows(d, ok, w, rows);
  kdrt_cuda_sum_rows(d, out, ok, rows, scale);
}

extern "C" void kdrt_cuda_sparse_xent_acc(kdrt_cuda *d, float *out, const float *x,
                                          const float *y, const float *m, int64_t rows,
                                          int64_t cols, int64_t col0, double scale) {
  sparse_xent_acc(d, out, x, y, m, NULL, rows, cols, col0, scale);
}

extern "C" void kdrt_cuda_sparse_xent_acc_w(kdrt_cuda *d, float *out, const float *x,
                                            const float *y, const float *m, const float *w,
                                            int64_t rows, int64_t cols, int64_t col0,
                                            double scale) {
  sparse_xent_acc(d, out, x, y, m, w, rows, cols, col0, scale);
}

// ---------------------------------------------------------------- fused classifier
// issue 22: kdrt_sparse_xent_fused (../loss.c), where the class dim is whole:
// a block a row (llm.c's fused classifier). The first pass reads the row
// once, 16 bytes a load where it can, each thread keeping its elements'
// running max, sum of exps rescaled as the max grows (online softmax), and
// first argmax; the block merges those in a fixed tree. The second pass
// reads the row again (at 1024 threads a block, two blocks of 50257-wide
// rows on each of 132 SMs are about L2's size: mostly from L2) and writes
// the gradient, rounded as it stores it (rnd). The rows' losses and hits go
// to scratch and are added in a fixed order (kdrt_cuda_sum_rows): the same
// bits run to run, no atomics. Not the CPU's bits: its sums of exps are in
// column order, these in a tree (within 1e-6 of exact sums; opcheck).

#define XENT_NONE ((int64_t)0x7fffffffffffffffLL) // no argmax yet

// Element j of value v into a thread's running max m, sum s of exp(x - m)
// and first argmax i.
__device__ static inline void xent_online(float v, int64_t j, float &m, float &s, int64_t &i) {
  if (v > m) {
    s *= expf(m - v); // (m -inf: s is 0, expf(-inf) 0)
    m = v, i = j;
  } else if (v == m && j < i) {
    i = j;
  }
  if (m > -INFINITY) s += expf(v - m);
}

// Two threads' (m, s, i) merged, the same result either way round.
__device__ static inline void xent_merge(float &m, float &s, int64_t &i, float m2, float s2,
                                         int64_t i2) {
  float mm = m2 > m ? m2 : m;
  float a = m > -INFINITY ? s * expf(m - mm) : 0.0f, b = m2 > -INFINITY ? s2 * expf(m2 - mm) : 0.0f;
  if (m2 > m || (m2 == m && i2 < i)) i = i2;
  m = mm, s = a + b;
}

// The first 16-byte boundary of p, as an element count (at most n).
__device__ static inline int64_t xent_head(const float *p, int64_t n) {
  int64_t h = (int64_t)((16 - ((uintptr_t)p & 15)) & 15) / 4;
  return h < n ? h : n;
}

// (launch_bounds: at 1024 threads a block, ptxas keeps it within 64 registers
// a thread, or the launch would fail; 32 at sm_90)
__global__ static void __launch_bounds__(1024)
xent_fused_kernel(int rnd, double *rowv, float *dx, const float *x, const float *y, const float *w,
                  const float *wa, int64_t rows, int64_t cols, double gscale, int acc) {
  __shared__ float shm[32], shs[32];
  __shared__ int64_t shi[32];
  const int64_t r = blockIdx.x;
  const float *xr = x + r * cols;
  const int64_t h = xent_head(xr, cols), nv = (cols - h) / 4, t0 = h + 4 * nv;
  float m = -INFINITY, s = 0.0f;
  int64_t i = XENT_NONE;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) xent_online(xr[j], j, m, s, i);
  const float4 *xv = (const float4 *)(xr + h);
  for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
    float4 q = xv[k];
    int64_t j = h + 4 * k;
    xent_online(q.x, j, m, s, i), xent_online(q.y, j + 1, m, s, i);
    xent_online(q.z, j + 2, m, s, i), xent_online(q.w, j + 3, m, s, i);
  }
  for (int64_t j = t0 + threadIdx.x; j < cols; j += blockDim.x) xent_online(xr[j], j, m, s, i);
  for (int o = 16; o > 0; o >>= 1) // the warp's butterfly, then the warps in order
    xent_merge(m, s, i, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o),
               __shfl_xor_sync(0xffffffffu, i, o));
  const int64_t c = kdrt_xent_class(y, r, cols, 0);
  // (read before any thread writes: dx may be x)
  const float xc = threadIdx.x == 0 && c >= 0 ? xr[c] : 0.0f;
  const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) shm[warp] = m, shs[warp] = s, shi[warp] = i;
  __syncthreads();
  m = shm[0], s = shs[0], i = shi[0];
  for (int k = 1; k < nwarps; k++) xent_merge(m, s, i, shm[k], shs[k], shi[k]);
  if (threadIdx.x == 0) {
    double l = c >= 0 ? kdrt_xent_row_loss(m, s, xc) : 0.0;
    rowv[r] = w ? (double)w[r] * l : l;
    if (acc) rowv[rows + r] = c >= 0 && i == c ? (wa ? (double)wa[r] : 1.0) : 0.0;
  }
  if (!dx) return;
  float *dr = dx + r * cols;
  if (!(y[r] >= 0.0f)) { // no class: 0, as kdrt_loss_grad
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dr[j] = 0.0f;
    return;
  }
  const float sc = w ? (float)((double)w[r] * gscale) : (float)gscale;
#define XENT_D(v, j) kdrt_round_opt(rnd, kdrt_xent_dterm(sc, expf((v) - m), s, (j) == c))
  if (xent_head(dr, cols) != h) { // not aligned as x: one element at a time
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dr[j] = XENT_D(xr[j], j);
    return;
  }
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) dr[j] = XENT_D(xr[j], j);
  float4 *dv = (float4 *)(dr + h);
  for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
    float4 q = xv[k];
    int64_t j = h + 4 * k;
    dv[k] = make_float4(XENT_D(q.x, j), XENT_D(q.y, j + 1), XENT_D(q.z, j + 2),
                        XENT_D(q.w, j + 3));
  }
  for (int64_t j = t0 + threadIdx.x; j < cols; j += blockDim.x) dr[j] = XENT_D(xr[j], j);
#undef XENT_D
}

extern "C" void kdrt_cuda_sparse_xent_fused_rnd(kdrt_cuda *d, int rnd, float *loss, float *acc,
                                                float *dx, const float *x, const float *y,
                                                const float *w, const float *wa, int64_t rows,
                                                int64_t cols, double scale, double ascale,
                                                double gscale) {
  kdrt_cuda_check_rows(rows, "kdrt_cuda_sparse_xent_fused");
  size_t n = (size_t)(rows > 0 ? rows : 1);
  double *rowv = (double *)kdrt_cuda_dscratch(d, 2, 2 * n * sizeof(double));
  if (rows > 0) {
    unsigned t = cols >= 8192 ? 1024 : kdrt_row_threads(cols);
    xent_fused_kernel<<<(unsigned)rows, t, 0, d->impl->stream>>>(rnd, rowv, dx, x, y, w, wa, rows,
                                                                 cols, gscale, acc != NULL);
    KDRT_LAUNCHED(d, "xent_fused_kernel");
  }
  kdrt_cuda_sum_rows(d, loss, rowv, rows, scale);
  if (acc) kdrt_cuda_sum_rows(d, acc, rowv + rows, rows, ascale);
}

extern "C" void kdrt_cuda_sparse_xent_fused(kdrt_cuda *d, float *loss, float *acc, float *dx,
                                            const float *x, const float *y, const float *w,
                                            const float *wa, int64_t rows, int64_t cols,
                                            double scale, double ascale, double gscale) {
  kdrt_cuda_sparse_xent_fused_rnd(d, KDRT_ROUND_NONE, loss, acc, dx, x, y, w, wa, rows, cols,
                                  scale, ascale, gscale);
}
