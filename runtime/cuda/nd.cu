// nd.cu: layout changes and embeddings (kdrt_transpose, kdrt_reduce_sum,
// kdrt_broadcast, kdrt_gather, kdrt_scatter_add in ../ops.c).
//
// Every kernel here writes each output element from one thread, with no
// atomics, so the results are deterministic and, for the sums, added in
// the CPU's order (reduce_sum: m ascending; scatter_add: ids in order),
// hence bit-identical to it (-fmad=false).
//
// scatter_add is one block per row of the table block, which lists the
// positions of its row's ids in order and adds their dy rows (coalesced):
// no sort and no atomic. Only the rows some id names walk the ids (a flag
// per row, set first); the others are zeroed and done.
#include "common.cuh"
#include "kdrt_round.h" // issue 23: gather16_kernel

typedef struct {
  int rank;
  int64_t oshape[KDRT_MAX_RANK];  // out's shape
  int64_t istride[KDRT_MAX_RANK]; // in's stride of out's dim i
} perm_map;

__global__ static void transpose_kernel(float *out, const float *in, size_t n, perm_map p) {
  KDRT_FOR(e, n) {
    size_t rest = e, src = 0;
    for (int i = p.rank - 1; i >= 0; i--) {
      size_t k = rest % (size_t)p.oshape[i];
      rest /= (size_t)p.oshape[i];
      src += k * (size_t)p.istride[i];
    }
    out[e] = in[src];
  }
}

// The same permutation in 32-bit index arithmetic over elements of type T
// (float, or float4 when the last dim stays last and its length and the
// buffers allow 16-byte accesses): the 64-bit divisions of the kernel
// above cost more than the bytes (the first GPU run: 89 us for what the
// bandwidth allows in 8). The divisions by the shape are multiplications
// by magic numbers (Granlund and Montgomery; valid for numerators below
// 2^31, as here), and each thread has TRANSPOSE_U elements' loads in
// flight before it stores them (issue 22: 12.8 us a call on the GPT's
// heads, for 8 of bytes).
#define TRANSPOSE_U 4
typedef struct {
  uint32_t d, magic, shift; // q = (umulhi(n, magic) + n) >> shift = n / d
} fastdiv;

static fastdiv make_fastdiv(uint32_t d) {
  fastdiv f;
  f.d = d;
  f.shift = 0;
  while (f.shift < 32 && ((uint64_t)1 << f.shift) < d) f.shift++;
  f.magic = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << f.shift) - d)) / d + 1);
  return f;
}

__device__ static inline uint32_t fastdiv_q(uint32_t n, fastdiv f) {
  return (__umulhi(n, f.magic) + n) >> f.shift;
}

typedef struct {
  int rank;
  fastdiv oshape[KDRT_MAX_RANK];
  uint32_t istride[KDRT_MAX_RANK];
} perm_map32;

__device__ static inline uint32_t perm_src(uint32_t e, const perm_map32 &p) {
  uint32_t rest = e, src = 0;
#pragma unroll
  for (int i = KDRT_MAX_RANK - 1; i >= 0; i--) {
    if (i >= p.rank) continue;
    uint32_t q = fastdiv_q(rest, p.oshape[i]);
    src += (rest - q * p.oshape[i].d) * p.istride[i];
    rest = q;
  }
  return src;
}

// n < 2^31: e + TRANSPOSE_U * stride stays below 2^32 (stride <= 2^28).
template <typename T>
__global__ static void transpose32_kernel(T *out, const T *in, uint32_t n, perm_map32 p) {
  uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += TRANSPOSE_U * stride) {
    T v[TRANSPOSE_U];
#pragma unroll
    for (int u = 0; u < TRANSPOSE_U; u++)
      if (e + u * stride < n) v[u] = in[perm_src(e + u * stride, p)];
#pragma unroll
    for (int u = 0; u < TRANSPOSE_U; u++)
      if (e + u * stride < n) out[e + u * stride] = v[u];
  }
}

extern "C" void kdrt_cuda_transpose(kdrt_cuda *d, float *out, const float *in, int rank,
                                    const int64_t *shape, const int *perm) {
  if (rank < 1 || rank > KDRT_MAX_RANK)
    kdrt_cuda_fail("kdrt_cuda_transpose", __FILE__, __LINE__, "rank out of range");
  perm_map p;
  p.rank = rank;
  int64_t stride[KDRT_MAX_RANK], total = 1;
  for (int k = rank - 1; k >= 0; k--) {
    stride[k] = total;
    total *= shape[k];
  }
  for (int i = 0; i < rank; i++) {
    if (perm[i] < 0 || perm[i] >= rank)
      kdrt_cuda_fail("kdrt_cuda_transpose", __FILE__, __LINE__, "perm names a dim out of range");
    p.oshape[i] = shape[perm[i]];
    p.istride[i] = stride[perm[i]];
  }
  if (total <= 0) return;
  if (total < ((int64_t)1 << 31)) {
    // Last dim kept and a multiple of 4, buffers 16-byte aligned: float4s.
    int v = perm[rank - 1] == rank - 1 && shape[rank - 1] % 4 == 0 &&
            (uintptr_t)out % 16 == 0 && (uintptr_t)in % 16 == 0 ? 4 : 1;
    perm_map32 q;
    q.rank = rank;
    for (int i = 0; i < rank; i++) {
      q.oshape[i] = make_fastdiv((uint32_t)(i == rank - 1 ? p.oshape[i] / v : p.oshape[i]));
      q.istride[i] = (uint32_t)(i == rank - 1 ? p.istride[i] : p.istride[i] / v);
    }
    uint32_t n = (uint32_t)(total / v);
    unsigned blocks = kdrt_blocks((n + TRANSPOSE_U - 1) / TRANSPOSE_U);
    if (v == 4)
      transpose32_kernel<float4><<<blocks, KDRT_THREADS, 0, d->impl->stream>>>(
          (float4 *)out, (const float4 *)in, n, q);
    else
      transpose32_kernel<float><<<blocks, KDRT_THREADS, 0, d->impl->stream>>>(out, in, n, q);
    KDRT_LAUNCHED(d, "transpose32_kernel");
    return;
  }
  transpose_kernel<<<kdrt_blocks((size_t)total), KDRT_THREADS, 0, d->impl->stream>>>(
      out, in, (size_t)total, p);
  KDRT_LAUNCHED(d, "transpose_kernel");
}

__global__ static void reduce_sum_kernel(float *out, const float *in, int64_t outer, int64_t mid,
                                         int64_t inner) {
  size_t n = (size_t)outer * (size_t)inner;
  KDRT_FOR(e, n) {
    int64_t o = (int64_t)(e / (size_t)inner), i = (int64_t)(e % (size_t)inner);
    const float *p = in + o * mid * inner + i;
    float s = 0.0f;
    for (int64_t m = 0; m < mid; m++) s += p[m * inner];
    out[e] = s;
  }
}

extern "C" void kdrt_cuda_reduce_sum(kdrt_cuda *d, float *out, const float *in, int64_t outer,
                                     int64_t mid, int64_t inner) {
  size_t n = (size_t)(outer > 0 ? outer : 0) * (size_t)(inner > 0 ? inner : 0);
  if (!n) return;
  reduce_sum_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, in, outer, mid,
                                                                          inner);
  KDRT_LAUNCHED(d, "reduce_sum_kernel");
}

__global__ static void broadcast_kernel(float *out, const float *in, int64_t outer, int64_t mid,
                                        int64_t inner) {
  size_t n = (size_t)outer * (size_t)mid * (size_t)inner;
  KDRT_FOR(e, n) {
    size_t i = e % (size_t)inner, o = e / ((size_t)inner * (size_t)mid);
    out[e] = in[o * (size_t)inner + i];
  }
}

extern "C" void kdrt_cuda_broadcast(kdrt_cuda *d, float *out, const float *in, int64_t outer,
                                    int64_t mid, int64_t inner) {
  if (outer <= 0 || mid <= 0 || inner <= 0) return;
  size_t n = (size_t)outer * (size_t)mid * (size_t)inner;
  broadcast_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, in, outer, mid,
                                                                         inner);
  KDRT_LAUNCHED(d, "broadcast_kernel");
}

__global__ static void gather_kernel(float *out, const float *table, const int32_t *ids,
                                     int64_t n, int64_t rows, int64_t cols, int64_t row0) {
  size_t total = (size_t)n * (size_t)cols;
  KDRT_FOR(e, total) {
    int64_t i = (int64_t)(e / (size_t)cols), j = (int64_t)(e % (size_t)cols);
    int64_t r = (int64_t)ids[i] - row0;
    out[e] = r >= 0 && r < rows ? table[r * cols + j] : 0.0f;
  }
}

extern "C" void kdrt_cuda_gather(kdrt_cuda *d, float *out, const float *table, const int32_t *ids,
                                 int64_t n, int64_t rows, int64_t cols, int64_t row0) {
  if (n <= 0 || cols <= 0) return;
  size_t total = (size_t)n * (size_t)cols;
  gather_kernel<<<kdrt_blocks(total), KDRT_THREADS, 0, d->impl->stream>>>(out, table, ids, n, rows,
                                                                          cols, row0);
  KDRT_LAUNCHED(d, "gather_kernel");
}

// issue 23: ../ops.c's kdrt_gather16, from a table kept in 16 bits.
__global__ static void gather16_kernel(int kind, float *out, const uint16_t *table,
                                       const int32_t *ids, int64_t n, int64_t rows, int64_t cols,
                                       int64_t row0) {
  size_t total = (size_t)n * (size_t)cols;
  KDRT_FOR(e, total) {
    int64_t i = (int64_t)(e / (size_t)cols), j = (int64_t)(e % (size_t)cols);
    int64_t r = (int64_t)ids[i] - row0;
    uint16_t h = r >= 0 && r < rows ? table[r * cols + j] : 0; // (0: +0.0 in either type)
    out[e] = kdrt_value16(kind, h);
  }
}

extern "C" void kdrt_cuda_gather16(kdrt_cuda *d, int kind, float *out, const uint16_t *table,
                                   const int32_t *ids, int64_t n, int64_t rows, int64_t cols,
                                   int64_t row0) {
  if (n <= 0 || cols <= 0) return;
  size_t total = (size_t)n * (size_t)cols;
  gather16_kernel<<<kdrt_blocks(total), KDRT_THREADS, 0, d->impl->stream>>>(
      kind, out, table, ids, n, rows, cols, row0);
  KDRT_LAUNCHED(d, "gather16_kernel");
}

// One block per table row r: it zeroes its row, then walks the ids in
// chunks of the block's width; each chunk's matches (ids[i] == row0 + r)
// are listed in order (a ballot per warp, the warps' counts added in
// order), and each thread adds their dy rows into its own columns, i
// ascending: the CPU's order for every element, so the same bits. (The
// first version, one thread per column walking all ids, ran 2.1 ms a step
// on the GPT's embedding: too few threads. The second, every row walking
// all ids, 1.3 ms on GPT-2's 50257 rows for 8192 ids (GPU run 4): now a
// row no id names (used[r] 0, mark_rows_kernel) is only zeroed.)
#define SCATTER_THREADS 256
__global__ static void mark_rows_kernel(int *used, const int32_t *ids, int64_t n, int64_t rows,
                                        int64_t row0) {
  KDRT_FOR(i, n) {
    int64_t r = (int64_t)ids[i] - row0;
    if (r >= 0 && r < rows) used[r] = 1; // (the same value from every writer)
  }
}

__global__ static void scatter_add_kernel(float *dtable, const float *dy, const int32_t *ids,
                                          const int *used, int64_t n, int64_t rows,
                                          int64_t cols, int64_t row0) {
  __shared__ int64_t pos[SCATTER_THREADS];
  __shared__ int counts[SCATTER_THREADS / 32];
  int t = threadIdx.x, warp = t / 32, lane = t % 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float *row = dtable + r * cols;
    for (int64_t j = t; j < cols; j += SCATTER_THREADS) row[j] = 0.0f;
    if (!used[r]) continue; // (the same for the whole block: no barrier skipped by some)
    for (int64_t c = 0; c < n; c += SCATTER_THREADS) {
      int match = c + t < n && (int64_t)ids[c + t] - row0 == r;
      unsigned mask = __ballot_sync(0xffffffffu, match);
      if (lane == 0) counts[warp] = __popc(mask);
      __syncthreads();
      int before = 0, all = 0;
      for (int w = 0; w < SCATTER_THREADS / 32; w++) {
        before += w < warp ? counts[w] : 0;
        all += counts[w];
      }
      if (match) pos[before + __popc(mask & ((1u << lane) - 1))] = c + t;
      __syncthreads();
      for (int k = 0; k < all; k++) {
        const float *g = dy + pos[k] * cols;
        for (int64_t j = t; j < cols; j += SCATTER_THREADS) row[j] += g[j];
      }
      __syncthreads(); // pos and counts are rewritten by the next chunk
    }
  }
}

extern "C" void kdrt_cuda_scatter_add(kdrt_cuda *d, float *dtable, const float *dy,
                                      const int32_t *ids, int64_t n, int64_t rows, int64_t cols,
                                      int64_t row0) {
  if (rows <= 0 || cols <= 0) return;
  if (n < 0) n = 0;
  cudaStream_t st = d->impl->stream;
  int *used = (int *)kdrt_cuda_dscratch(d, 2, (size_t)rows * sizeof(int));
  CUDA_CHECK(cudaMemsetAsync(used, 0, (size_t)rows * sizeof(int), st));
  if (n) {
    mark_rows_kernel<<<kdrt_blocks((size_t)n), KDRT_THREADS, 0, st>>>(used, ids, n, rows, row0);
    KDRT_LAUNCHED(d, "mark_rows_kernel");
  }
  unsigned blocks = (unsigned)(rows < 65535 * 16 ? rows : 65535 * 16);
  scatter_add_kernel<<<blocks, SCATTER_THREADS, 0, st>>>(dtable, dy, ids, used, n, rows, cols,
                                                         row0);
  KDRT_LAUNCHED(d, "scatter_add_kernel");
}
