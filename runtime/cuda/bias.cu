// bias.cu: the bias add with its activation epilogue (kdrt_bias_act) and
// the bias gradient (a column sum, kdrt_bias_grad).
//
// bias_act applies kdrt_act1 (common.cuh: KDRT_ACT_LIST, expanded as
// ../ops.c expands it), so both backends compute the same expressions.
// bias_grad sums each column in a fixed order: 32 columns a block, each of
// the block's 32 row lanes sums rows lane, lane+32, ... of its chunk of rows
// in order, then the 32 partial sums are added in lane order, then the
// chunks' sums in chunk order: deterministic from run to run (not
// bit-identical to the CPU's one running sum).
#include "common.cuh"

__global__ static void bias_act_kernel(int act, float *out, const float *in, const float *bias,
                                       int64_t rows, int64_t cols) {
  size_t n = (size_t)rows * (size_t)cols;
  KDRT_FOR(e, n) {
    out[e] = kdrt_act1(act, in[e] + bias[e % (size_t)cols]);
  }
}

extern "C" void kdrt_cuda_bias_act(kdrt_cuda *d, int act, float *out, const float *in,
                                   const float *bias, int64_t rows, int64_t cols) {
  if (act < 0 || act >= KDRT_ACT_COUNT)
    kdrt_cuda_fail("kdrt_cuda_bias_act", __FILE__, __LINE__, "unknown activation");
  size_t n = (size_t)rows * (size_t)cols;
  if (!n) return;
  bias_act_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(act, out, in, bias, rows,
                                                                        cols);
  KDRT_LAUNCHED(d, "bias_act_kernel");
}

// blockDim (32 columns, 32 row lanes); blockIdx.y: a chunk of `chunk` rows.
// out: [gridDim.y, cols], each chunk's column sums.
__global__ static void bias_grad_kernel(float *out, const float *in, int64_t rows, int64_t cols,
                                        int64_t chunk) {
  __shared__ float part[32][33];
  int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x;
  int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float s = 0.0f;
  if (j < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 32) s += in[r * cols + j];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float t = part[0][threadIdx.x];
    for (int k = 1; k < 32; k++) t += part[k][threadIdx.x];
    out[(int64_t)blockIdx.y * cols + j] = t;
  }
}

// out[j] = the chunks' sums of column j, added in chunk order.
__global__ static void sum_chunks_kernel(float *out, const float *part, int nchunks,
                                         int64_t cols) {
  KDRT_FOR(j, (size_t)cols) {
    float t = part[j];
    for (int k = 1; k < nchunks; k++) t += part[(int64_t)k * cols + (int64_t)j];
    out[j] = t;
  }
}

// Enough blocks to fill the GPU (kdrt_row_chunks): deterministic for given
// rows and cols.
extern "C" void kdrt_cuda_bias_grad(kdrt_cuda *d, float *out, const float *in, int64_t rows,
                                    int64_t cols) {
  if (cols <= 0) return;
  unsigned cblocks = (unsigned)((cols + 31) / 32);
  int64_t chunk, nchunks = kdrt_row_chunks(rows, cols, 64, &chunk);
  float *part = nchunks > 1 ? (float *)kdrt_cuda_dscratch(d, 2, (size_t)(nchunks * cols) *
                                                                    sizeof(float))
                            : out;
  bias_grad_kernel<<<dim3(cblocks, (unsigned)nchunks), dim3(32, 32), 0, d->impl->stream>>>(
      part, in, rows, cols, chunk);
  KDRT_LAUNCHED(d, "bias_grad_kernel");
  if (nchunks > 1) {
    sum_chunks_kernel<<<kdrt_blocks((size_t)cols), KDRT_THREADS, 0, d->impl->stream>>>(
        out, part, (int)nchunks, cols);
    KDRT_LAUNCHED(d, "sum_chunks_kernel");
  }
}
