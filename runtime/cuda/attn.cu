// attn.cu: attention without its [t, s] scores in memory (issue 22), as
// FlashAttention-2 computes it: kdrt_cuda_attention and _attention_grad
// (kdrt_attention and _attention_grad in ../ops.c are the reference).
//
// q, o, do [bn, t, d], k, v [bn, s, d] (heads' rows one after another, as
// the transposes to [b, n, t, d] leave them); lse [bn, t], each query row's
// log of the sum of exps (max + log(sum)), which the forward writes and
// the backward reads to remake the probabilities without a softmax pass.
//
// The products run on tensor cores (wmma) with float accumulation: under
// bf16 their operands are q, k, v, do, the probabilities and their
// gradient rounded to bfloat16 (as the chain's matmuls round them), under
// tf32 rounded to tf32. A block is 4 warps; each warp owns 16 rows (of
// queries, or in the key/value gradient of keys) of a 64-row tile, and the
// other operand's 64-row tile is loaded into shared memory, rounded, by the
// whole block. Scores go through shared memory (a warp's 16 x 64 floats):
// the row maxima, exps and sums are taken there by the warp, then the
// rounded probabilities are the next product's operand. The head dim is
// padded with zeros to 16, 32, 64 or 128 (kdcc fuses up to 128, tf32 to 64).
// With `causal`, the key tiles after a query tile's last query are skipped.
//
// Backward without atomics, so the same run gives the same bits: one kernel
// makes dk and dv, a block a key tile looping over the query tiles; another
// makes dq, a block a query tile looping over the key tiles, computing the
// scores and dp = do v^T again (7 tile products instead of FlashAttention-2's
// 5 with atomic dq). delta = rowsum(do * o) is taken as each query tile is
// loaded (d multiply-adds a row: nothing beside the products).
#include "common.cuh"

#include <cuda_bf16.h>
#include <mma.h>
#include <type_traits>

using namespace nvcuda;

// bf16 and tf32 wmma need sm_80; an older GPU's build keeps the kernels
// as traps (kdcc's programs call them only at bf16 and tf32).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define ATT_WMMA 1
#else
#define ATT_WMMA 0
#endif
#define ATT_ROWS 64   // a tile's rows (queries or keys): 4 warps of 16
#define ATT_THREADS 128
#define ATT_SLD (ATT_ROWS + 4) // a warp's scores in floats: row length (16-byte multiples)
#define ATT_PLD (ATT_ROWS + 8) // its probabilities (or their gradient) rounded

// The operands of one precision: their type in shared memory, the wmma
// element type and depth, and the rounding.
template <int P> struct att_prec;
template <> struct att_prec<KDRT_PREC_BF16> {
  typedef __nv_bfloat16 T;
  typedef __nv_bfloat16 E;
  enum { K = 16 };
  static __device__ T cvt(float x) { return __float2bfloat16_rn(x); }
};
template <> struct att_prec<KDRT_PREC_TF32> {
  typedef float T;
  enum { K = 8 };
#if ATT_WMMA
  typedef wmma::precision::tf32 E;
  static __device__ T cvt(float x) { return wmma::__float_to_tf32(x); }
#else
  typedef float E;
  static __device__ T cvt(float x) { return x; }
#endif
};

template <int P> using att_acc = wmma::fragment<wmma::accumulator, 16, 16, att_prec<P>::K, float>;

// The leading dim of an operand tile in shared memory: DP + 8 elements
// (wmma wants multiples of 16 bytes; the offset spreads the banks).
template <int DP> struct att_ld { enum { v = DP + 8 }; };

// One warp: acc[f] += a[16, kd] . B[kd, 16 f .. 16 f + 15] for f < NF, a
// row-major (lda); B row-major [kd, n] (ldb), or with BT its transpose is
// stored row-major [n, kd] (ldb): wmma's col_major.
template <int P, int NF, bool BT>
__device__ static void att_mm(att_acc<P> *acc, const typename att_prec<P>::T *a, int lda,
                              const typename att_prec<P>::T *b, int ldb, int kd) {
  typedef att_prec<P> O;
  typedef typename std::conditional<BT, wmma::col_major, wmma::row_major>::type BL;
  for (int k0 = 0; k0 < kd; k0 += O::K) {
    wmma::fragment<wmma::matrix_a, 16, 16, O::K, typename O::E, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + k0, lda);
#pragma unroll
    for (int f = 0; f < NF; f++) {
      wmma::fragment<wmma::matrix_b, 16, 16, O::K, typename O::E, BL> fb;
      const typename O::T *bf = BT ? b + (int64_t)f * 16 * ldb + k0 : b + (int64_t)k0 * ldb + f * 16;
      wmma::load_matrix_sync(fb, bf, ldb);
      wmma::mma_sync(acc[f], fa, fb, acc[f]);
    }
  }
}

template <int P, int NF> __device__ static void att_zero(att_acc<P> *acc) {
#pragma unroll
  for (int f = 0; f < NF; f++) wmma::fill_fragment(acc[f], 0.0f);
}

// A warp's 16 x 16 NF accumulators to floats at s (row length ld).
template <int P, int NF> __device__ static void att_store(float *s, int ld, att_acc<P> *acc) {
#pragma unroll
  for (int f = 0; f < NF; f++) wmma::store_matrix_sync(s + f * 16, acc[f], ld, wmma::mem_row_major);
}

// Rows [r0, r0 + 64) of x [n, d] into a tile [64, DP] rounded, zeros past n
// rows and d columns (the whole block); float4s where d is a multiple of 4
// and x 16-byte aligned (kdcc's buffers are), a float at a time elsewhere.
template <int P, int DP>
__device__ static void att_load(typename att_prec<P>::T *t, const float *x, int64_t r0, int64_t n,
                                int d) {
  typedef att_prec<P> O;
  if (d % 4 == 0 && ((uintptr_t)x & 15) == 0) {
    for (int i = threadIdx.x; i < ATT_ROWS * DP / 4; i += ATT_THREADS) {
      int r = i / (DP / 4), c = i % (DP / 4) * 4;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r0 + r < n && c < d) v = *(const float4 *)(x + (r0 + r) * d + c);
      typename O::T *y = t + r * att_ld<DP>::v + c;
      y[0] = O::cvt(v.x), y[1] = O::cvt(v.y), y[2] = O::cvt(v.z), y[3] = O::cvt(v.w);
    }
    return;
  }
  for (int i = threadIdx.x; i < ATT_ROWS * DP; i += ATT_THREADS) {
    int r = i / DP, c = i % DP;
    float v = r0 + r < n && c < d ? x[(r0 + r) * d + c] : 0.0f;
    t[r * att_ld<DP>::v + c] = O::cvt(v);
  }
}

// A warp's 16 x DP result rows from floats at s (times mul) to y [n, d].
// (maybe_unused: below sm_80 the kernels are traps)
[[maybe_unused]] __device__ static void att_write(float *y, const float *s, int ld, int64_t r0,
                                                  int64_t n, int d, const float *mul) {
  int lane = threadIdx.x & 31;
  for (int r = 0; r < 16; r++)
    if (r0 + r < n)
      for (int c = lane; c < d; c += 32) y[(r0 + r) * d + c] = s[r * ld + c] * mul[r];
}

// A warp's 16 x 64 scores a . b^T into s (floats): a its 16 rows of one
// tile, b the other tile.
template <int P, int DP>
__device__ static void att_scores(float *s, const typename att_prec<P>::T *a,
                                  const typename att_prec<P>::T *b) {
  att_acc<P> x[ATT_ROWS / 16];
  att_zero<P, ATT_ROWS / 16>(x);
  att_mm<P, ATT_ROWS / 16, true>(x, a, att_ld<DP>::v, b, att_ld<DP>::v, DP);
  att_store<P, ATT_ROWS / 16>(s, ATT_SLD, x);
}

// A warp's accumulated 16 x DP result times mul to rows [r0, r0 + 16) of
// y [n, d], through its staging floats.
template <int P, int DP>
__device__ static void att_put(float *y, float *stage, att_acc<P> *acc, int64_t r0, int64_t n,
                               int d, float mul) {
  float m[16];
  for (int r = 0; r < 16; r++) m[r] = mul;
  att_store<P, DP / 16>(stage, DP + 4, acc);
  __syncwarp();
  att_write(y, stage, DP + 4, r0, n, d, m);
  __syncwarp();
}

template <class T> __device__ static T *att_carve(char *&p, size_t n) {
  T *q = (T *)p;
  p += (n * sizeof(T) + 127) / 128 * 128;
  return q;
}

// ---------------------------------------------------------------- forward
// Block (query tile, bn). Per warp: its scores S [16, 64] and running
// output O [16, DP] in floats, its probabilities P [16, 64] rounded; each
// row's running max m and sum l in every lane's registers.
template <int P, int DP>
__global__ static void __launch_bounds__(ATT_THREADS)
attn_fwd_kernel(float *o, float *lse, const float *q, const float *k, const float *v, int64_t t,
                int64_t s, int d, float scale, int causal) {
#if ATT_WMMA
  typedef typename att_prec<P>::T T;
  const int LD = att_ld<DP>::v, OLD = DP + 4, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  extern __shared__ __align__(128) char att_smem[];
  char *p = att_smem;
  T *qs = att_carve<T>(p, ATT_ROWS * LD), *ks = att_carve<T>(p, ATT_ROWS * LD);
  T *vs = att_carve<T>(p, ATT_ROWS * LD), *ps = att_carve<T>(p, ATT_ROWS * ATT_PLD);
  float *ss = att_carve<float>(p, ATT_ROWS * ATT_SLD), *os = att_carve<float>(p, ATT_ROWS * OLD);
  const int64_t bn = blockIdx.x, q0 = (int64_t)blockIdx.y * ATT_ROWS;
  q += bn * t * d, k += bn * s * d, v += bn * s * d, o += bn * t * d, lse += bn * t;
  T *pw = ps + w * 16 * ATT_PLD;
  float *sw = ss + w * 16 * ATT_SLD, *ow = os + w * 16 * OLD;
  att_load<P, DP>(qs, q, q0, t, d);
  for (int i = lane; i < 16 * OLD; i += 32) ow[i] = 0.0f;
  float m[16], l[16];
#pragma unroll
  for (int r = 0; r < 16; r++) m[r] = -INFINITY, l[r] = 0.0f;
  int64_t tiles = (s + ATT_ROWS - 1) / ATT_ROWS;
  if (causal && q0 / ATT_ROWS + 1 < tiles) tiles = q0 / ATT_ROWS + 1; // keys <= the last query
  for (int64_t j = 0; j < tiles; j++) {
    const int64_t s0 = j * ATT_ROWS;
    __syncthreads(); // the tiles before are read
    att_load<P, DP>(ks, k, s0, s, d);
    att_load<P, DP>(vs, v, s0, s, d);
    __syncthreads();
    att_scores<P, DP>(sw, qs + w * 16 * LD, ks);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; r++) {
      const int64_t qi = q0 + w * 16 + r;
      float x[ATT_ROWS / 32], mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < ATT_ROWS / 32; c++) {
        int64_t kj = s0 + lane + 32 * c;
        bool on = kj < s && !(causal && kdrt_key_masked(qi, kj, 0));
        x[c] = on ? sw[r * ATT_SLD + lane + 32 * c] * scale : -INFINITY;
        mx = fmaxf(mx, x[c]);
      }
      mx = kdrt_warp_reduce<kdrt_max_op<float> >(mx);
      float mn = fmaxf(m[r], mx), base = mn == -INFINITY ? 0.0f : mn;
      float alpha = expf(m[r] - base), sum = 0.0f; // (m -INFINITY: 0)
#pragma unroll
      for (int c = 0; c < ATT_ROWS / 32; c++) {
        float e = expf(x[c] - base);
        sum += e;
        pw[r * ATT_PLD + lane + 32 * c] = att_prec<P>::cvt(e);
      }
      l[r] = l[r] * alpha + kdrt_warp_reduce<kdrt_sum_op<float> >(sum);
      m[r] = mn;
      for (int c = lane; c < DP; c += 32) ow[r * OLD + c] *= alpha;
    }
    __syncwarp();
    att_acc<P> oa[DP / 16];
#pragma unroll
    for (int f = 0; f < DP / 16; f++)
      wmma::load_matrix_sync(oa[f], ow + f * 16, OLD, wmma::mem_row_major);
    att_mm<P, DP / 16, false>(oa, pw, ATT_PLD, vs, LD, ATT_ROWS);
    att_store<P, DP / 16>(ow, OLD, oa);
    __syncwarp();
  }
  float inv[16];
#pragma unroll
  for (int r = 0; r < 16; r++) {
    inv[r] = 1.0f / l[r];
    if (lane == 0 && q0 + w * 16 + r < t) lse[q0 + w * 16 + r] = m[r] + logf(l[r]);
  }
  att_write(o, ow, OLD, q0 + w * 16, t, d, inv);
#else
  __trap();
#endif
}

// ---------------------------------------------------------------- backward
// The probabilities p = exp(score * scale - lse) and ds = p (dp - delta)
// of a warp's 16 x 64 block, from its scores (sc) and dp (dp) in floats,
// rounded into pw and dsw (pw NULL: not kept). Element (r, c) is query
// qi(r, c), key kj(r, c); `trans`: the warp's rows are keys.
template <int P>
__device__ static void att_probs(typename att_prec<P>::T *pw, typename att_prec<P>::T *dsw,
                                 const float *sc, const float *dp, const float *lse,
                                 const float *delta, int64_t row0, int64_t col0, bool trans,
                                 int64_t t, int64_t s, float scale, int causal) {
  int lane = threadIdx.x & 31;
  for (int r = 0; r < 16; r++)
    for (int c = lane; c < ATT_ROWS; c += 32) {
      int64_t qi = trans ? col0 + c : row0 + r, kj = trans ? row0 + r : col0 + c;
      int qr = trans ? c : r; // lse's and delta's row
      bool on = qi < t && kj < s && !(causal && kdrt_key_masked(qi, kj, 0));
      float e = on ? expf(sc[r * ATT_SLD + c] * scale - lse[qr]) : 0.0f;
      if (pw) pw[r * ATT_PLD + c] = att_prec<P>::cvt(e);
      dsw[r * ATT_PLD + c] = att_prec<P>::cvt(e * (dp[r * ATT_SLD + c] - delta[qr]));
    }
}

// A query tile's rows of q and do (rounded), and of lse and delta =
// rowsum(do * o) in floats (lse +INFINITY past t: probabilities 0).
template <int P, int DP>
__device__ static void att_load_queries(typename att_prec<P>::T *qs, typename att_prec<P>::T *dos,
                                        float *lse_s, float *delta_s, const float *q,
                                        const float *dout, const float *o, const float *lse,
                                        int64_t q0, int64_t t, int d) {
  att_load<P, DP>(qs, q, q0, t, d);
  att_load<P, DP>(dos, dout, q0, t, d);
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = w * 16; r < w * 16 + 16; r++) {
    int64_t qi = q0 + r;
    float acc = 0.0f;
    if (qi < t)
      for (int c = lane; c < d; c += 32) acc += dout[qi * d + c] * o[qi * d + c];
    acc = kdrt_warp_reduce<kdrt_sum_op<float> >(acc);
    if (lane == 0) delta_s[r] = acc, lse_s[r] = qi < t ? lse[qi] : INFINITY;
  }
}

// The backward kernels' shared memory: the query tile's q and do, the key
// tile's k and v (rounded; qs, dos and ks, vs each next to each other, so
// that either pair's space stages the results), the rounded ds (and p,
// with `probs`), the warps' scores and dp, and the query rows' lse and
// delta.
template <class T> struct att_bwd_smem {
  T *qs, *dos, *ks, *vs, *dss, *ps;
  float *ss, *dps, *lse, *delta;
};

template <class T, int DP> __device__ static att_bwd_smem<T> att_bwd_carve(char *p, bool probs) {
  att_bwd_smem<T> m;
  const int LD = att_ld<DP>::v;
  m.qs = att_carve<T>(p, ATT_ROWS * LD), m.dos = att_carve<T>(p, ATT_ROWS * LD);
  m.ks = att_carve<T>(p, ATT_ROWS * LD), m.vs = att_carve<T>(p, ATT_ROWS * LD);
  m.dss = att_carve<T>(p, ATT_ROWS * ATT_PLD);
  m.ss = att_carve<float>(p, ATT_ROWS * ATT_SLD), m.dps = att_carve<float>(p, ATT_ROWS * ATT_SLD);
  m.lse = att_carve<float>(p, ATT_ROWS), m.delta = att_carve<float>(p, ATT_ROWS);
  m.ps = probs ? att_carve<T>(p, ATT_ROWS * ATT_PLD) : NULL;
  return m;
}

// Block (key tile, bn): dk and dv of its 64 keys, over every query tile
// that sees them. Per warp: 16 keys, s^T = k q^T and dp^T = v do^T [16, 64]
// in floats; dv += p^T do, dk += ds^T q in its accumulators.
template <int P, int DP>
__global__ static void __launch_bounds__(ATT_THREADS)
attn_dkdv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k,
                 const float *v, const float *o, const float *lse, int64_t t, int64_t s, int d,
                 float scale, int causal) {
#if ATT_WMMA
  typedef typename att_prec<P>::T T;
  extern __shared__ __align__(128) char att_smem[];
  const att_bwd_smem<T> m = att_bwd_carve<T, DP>(att_smem, true);
  const int LD = att_ld<DP>::v, w = threadIdx.x >> 5;
  const int64_t bn = blockIdx.x, s0 = (int64_t)blockIdx.y * ATT_ROWS;
  q += bn * t * d, dout += bn * t * d, o += bn * t * d, lse += bn * t;
  k += bn * s * d, v += bn * s * d, dk += bn * s * d, dv += bn * s * d;
  T *pw = m.ps + w * 16 * ATT_PLD, *dsw = m.dss + w * 16 * ATT_PLD;
  float *sw = m.ss + w * 16 * ATT_SLD, *dpw = m.dps + w * 16 * ATT_SLD;
  att_load<P, DP>(m.ks, k, s0, s, d);
  att_load<P, DP>(m.vs, v, s0, s, d);
  att_acc<P> dka[DP / 16], dva[DP / 16];
  att_zero<P, DP / 16>(dka);
  att_zero<P, DP / 16>(dva);
  const int64_t tiles = (t + ATT_ROWS - 1) / ATT_ROWS;
  for (int64_t i = causal ? s0 / ATT_ROWS : 0; i < tiles; i++) { // queries before s0 see none
    const int64_t q0 = i * ATT_ROWS;
    __syncthreads();
    att_load_queries<P, DP>(m.qs, m.dos, m.lse, m.delta, q, dout, o, lse, q0, t, d);
    __syncthreads();
    att_scores<P, DP>(sw, m.ks + w * 16 * LD, m.qs); // s^T
    att_scores<P, DP>(dpw, m.vs + w * 16 * LD, m.dos); // dp^T
    __syncwarp();
    att_probs<P>(pw, dsw, sw, dpw, m.lse, m.delta, s0 + w * 16, q0, true, t, s, scale, causal);
    __syncwarp();
    att_mm<P, DP / 16, false>(dva, pw, ATT_PLD, m.dos, LD, ATT_ROWS);
    att_mm<P, DP / 16, false>(dka, dsw, ATT_PLD, m.qs, LD, ATT_ROWS);
  }
  __syncthreads(); // the query tiles are read: their space holds the results
  float *stage = (float *)m.qs + w * 16 * (DP + 4);
  att_put<P, DP>(dk, stage, dka, s0 + w * 16, s, d, scale);
  att_put<P, DP>(dv, stage, dva, s0 + w * 16, s, d, 1.0f);
#else
  __trap();
#endif
}

// Block (query tile, bn): dq of its 64 queries over every key tile they
// see. Per warp: 16 queries, s = q k^T and dp = do v^T [16, 64] in floats;
// dq += ds k in its accumulators.
template <int P, int DP>
__global__ static void __launch_bounds__(ATT_THREADS)
attn_dq_kernel(float *dq, const float *dout, const float *q, const float *k, const float *v,
               const float *o, const float *lse, int64_t t, int64_t s, int d, float scale,
               int causal) {
#if ATT_WMMA
  typedef typename att_prec<P>::T T;
  const int LD = att_ld<DP>::v, w = threadIdx.x >> 5;
  extern __shared__ __align__(128) char att_smem[];
  const att_bwd_smem<T> m = att_bwd_carve<T, DP>(att_smem, false);
  const int64_t bn = blockIdx.x, q0 = (int64_t)blockIdx.y * ATT_ROWS;
  q += bn * t * d, dout += bn * t * d, o += bn * t * d, lse += bn * t, dq += bn * t * d;
  k += bn * s * d, v += bn * s * d;
  T *dsw = m.dss + w * 16 * ATT_PLD;
  float *sw = m.ss + w * 16 * ATT_SLD, *dpw = m.dps + w * 16 * ATT_SLD;
  att_load_queries<P, DP>(m.qs, m.dos, m.lse, m.delta, q, dout, o, lse, q0, t, d);
  att_acc<P> dqa[DP / 16];
  att_zero<P, DP / 16>(dqa);
  int64_t tiles = (s + ATT_ROWS - 1) / ATT_ROWS;
  if (causal && q0 / ATT_ROWS + 1 < tiles) tiles = q0 / ATT_ROWS + 1;
  for (int64_t j = 0; j < tiles; j++) {
    const int64_t s0 = j * ATT_ROWS;
    __syncthreads();
    att_load<P, DP>(m.ks, k, s0, s, d);
    att_load<P, DP>(m.vs, v, s0, s, d);
    __syncthreads();
    att_scores<P, DP>(sw, m.qs + w * 16 * LD, m.ks);
    att_scores<P, DP>(dpw, m.dos + w * 16 * LD, m.vs);
    __syncwarp();
    att_probs<P>(NULL, dsw, sw, dpw, m.lse + w * 16, m.delta + w * 16, q0 + w * 16, s0, false,
                 t, s, scale, causal);
    __syncwarp();
    att_mm<P, DP / 16, false>(dqa, dsw, ATT_PLD, m.ks, LD, ATT_ROWS);
  }
  __syncthreads(); // every warp is done with the key tiles: their space holds the results
  att_put<P, DP>(dq, (float *)m.ks + w * 16 * (DP + 4), dqa, q0 + w * 16, t, d, scale);
#else
  __trap();
#endif
}

// ---------------------------------------------------------------- launches
// Shared memory of each kernel (the carve order above), in bytes.
template <int P, int DP> static size_t att_smem_bytes(int kernel) {
  typedef typename att_prec<P>::T T;
  auto r = [](size_t n) { return (n + 127) / 128 * 128; };
  size_t tile = r(sizeof(T) * ATT_ROWS * att_ld<DP>::v), pt = r(sizeof(T) * ATT_ROWS * ATT_PLD);
  size_t sc = r(sizeof(float) * ATT_ROWS * ATT_SLD), row = r(sizeof(float) * ATT_ROWS);
  if (kernel == 0) return 3 * tile + pt + sc + r(sizeof(float) * ATT_ROWS * (DP + 4));
  return 4 * tile + (kernel == 1 ? 2 : 1) * pt + 2 * sc + 2 * row;
}

// Raise kernel f's shared memory limit to `bytes` the first time (past 48
// KB a kernel must ask). A GPU that gives a block less (sm_86 and sm_89:
// 99 KB; bf16 at head dim 128 needs up to 121 KB, tf32 at 32 and 64 up to
// 143 KB) is said with the kernel's name and the way out, not as
// cudaFuncSetAttribute's "invalid argument".
template <typename F>
static void att_launch_prep(F f, const char *name, size_t bytes, bool *raised) {
  if (*raised) return;
  int dev = 0, most = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > (size_t)most) {
    char msg[200];
    snprintf(msg, sizeof msg, "%s needs %zu bytes of shared memory a block, this GPU gives at "
             "most %d (kdcc --attention chain keeps the attention's ops)", name, bytes, most);
    kdrt_cuda_fail("the fused attention", __FILE__, __LINE__, msg);
  }
  CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  *raised = true;
}

template <int P, int DP>
static void att_run(kdrt_cuda *d, int grad, float *o, float *lse, float *dq, float *dk, float *dv,
                    const float *dout, const float *q, const float *k, const float *v,
                    const float *oin, const float *lsein, int64_t bn, int64_t t, int64_t s, int hd,
                    float scale, int causal) {
  static bool raised[3];
  cudaStream_t st = d->impl->stream;
  dim3 gq((unsigned)bn, (unsigned)((t + ATT_ROWS - 1) / ATT_ROWS));
  dim3 gk((unsigned)bn, (unsigned)((s + ATT_ROWS - 1) / ATT_ROWS));
  if (!grad) {
    size_t b = att_smem_bytes<P, DP>(0);
    att_launch_prep(attn_fwd_kernel<P, DP>, "attn_fwd_kernel", b, &raised[0]);
    attn_fwd_kernel<P, DP><<<gq, ATT_THREADS, b, st>>>(o, lse, q, k, v, t, s, hd, scale, causal);
    KDRT_LAUNCHED(d, "attn_fwd_kernel");
    return;
  }
  size_t b = att_smem_bytes<P, DP>(1);
  att_launch_prep(attn_dkdv_kernel<P, DP>, "attn_dkdv_kernel", b, &raised[1]);
  attn_dkdv_kernel<P, DP><<<gk, ATT_THREADS, b, st>>>(dk, dv, dout, q, k, v, oin, lsein, t, s, hd,
                                                      scale, causal);
  KDRT_LAUNCHED(d, "attn_dkdv_kernel");
  b = att_smem_bytes<P, DP>(2);
  att_launch_prep(attn_dq_kernel<P, DP>, "attn_dq_kernel", b, &raised[2]);
  attn_dq_kernel<P, DP><<<gq, ATT_THREADS, b, st>>>(dq, dout, q, k, v, oin, lsein, t, s, hd, scale,
                                                    causal);
  KDRT_LAUNCHED(d, "attn_dq_kernel");
}

// The instantiation for d's precision and the head dim padded to 16, 32,
// 64 or 128 (tf32 to 64).
static void att_dispatch(kdrt_cuda *d, const char *what, int grad, float *o, float *lse, float *dq,
                         float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, const float *oin, const float *lsein, int64_t bn,
                         int64_t t, int64_t s, int64_t hd, float scale, int causal) {
  if (!bn || !t || !s) return;
  // a block per 64-row tile on gridDim.y, at most 65535 (T up to 4194240)
  if ((t + ATT_ROWS - 1) / ATT_ROWS > 65535 || (s + ATT_ROWS - 1) / ATT_ROWS > 65535 ||
      bn > 2147483647)
    kdrt_cuda_fail(what, __FILE__, __LINE__, "more than 65535 tiles of 64 rows, or 2^31 heads");
  int dp = hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 0;
  bool bf = d->precision == KDRT_PREC_BF16, tf = d->precision == KDRT_PREC_TF32;
  if (!(bf || tf) || !dp || (tf && dp > 64)) {
    char msg[160];
    snprintf(msg, sizeof msg, "head dim %lld at this precision (the fused attention takes bf16 "
             "up to 128, tf32 up to 64; kdcc keeps the chain elsewhere)", (long long)hd);
    kdrt_cuda_fail(what, __FILE__, __LINE__, msg);
  }
#define ATT_CASE(PR, DP)                                                                        \
  if (d->precision == PR && dp == DP)                                                            \
    return att_run<PR, DP>(d, grad, o, lse, dq, dk, dv, dout, q, k, v, oin, lsein, bn, t, s,    \
                           (int)hd, scale, causal);
  ATT_CASE(KDRT_PREC_BF16, 16) ATT_CASE(KDRT_PREC_BF16, 32) ATT_CASE(KDRT_PREC_BF16, 64)
  ATT_CASE(KDRT_PREC_BF16, 128) ATT_CASE(KDRT_PREC_TF32, 16) ATT_CASE(KDRT_PREC_TF32, 32)
  ATT_CASE(KDRT_PREC_TF32, 64)
#undef ATT_CASE
}

extern "C" void kdrt_cuda_attention(kdrt_cuda *d, float *o, float *lse, const float *q,
                                    const float *k, const float *v, int64_t bn, int64_t t,
                                    int64_t s, int64_t hd, float scale, int causal) {
  if (kdrt_cudnn_attention_run(d, 0, o, lse, NULL, NULL, NULL, NULL, q, k, v, NULL, NULL, bn, t, s,
                               hd, scale, causal))
    return; // cuDNN's (KDRT_CUDA_CUDNN=attn, bf16)
  att_dispatch(d, "kdrt_cuda_attention", 0, o, lse, NULL, NULL, NULL, NULL, q, k, v, NULL, NULL, bn,
               t, s, hd, scale, causal);
}

extern "C" void kdrt_cuda_attention_grad(kdrt_cuda *d, float *dq, float *dk, float *dv,
                                         const float *dout, const float *q, const float *k,
                                         const float *v, const float *o, const float *lse,
                                         int64_t bn, int64_t t, int64_t s, int64_t hd, float scale,
                                         int causal) {
  if (kdrt_cudnn_attention_run(d, 1, NULL, NULL, dq, dk, dv, dout, q, k, v, o, lse, bn, t, s, hd,
                               scale, causal))
    return;
  att_dispatch(d, "kdrt_cuda_attention_grad", 1, NULL, NULL, dq, dk, dv, dout, q, k, v, o, lse,
               bn, t, s, hd, scale, causal);
}
