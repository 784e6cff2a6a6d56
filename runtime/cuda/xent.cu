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
