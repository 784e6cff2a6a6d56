// rng.c: counter-based randomness that does not depend on the mesh.
//
// Every random number kdcc's programs use is a pure function of
// (seed, stream, counter hi, counter lo), computed with Philox-4x32-10
// (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2,
// 3", SC'11). There is no generator state to carry or split: a rank that
// owns a block of a tensor computes exactly the numbers a single device
// would for those elements, by using the element's *global* row-major index
// as the counter. That is what makes initial weights and dropout masks
// identical on a (8,) mesh, a (2,4) mesh or one process.
//
// Key:     (seed, stream) mixed with splitmix64 into the two 32-bit key words.
// Counter: lo = global element index, hi = step (dropout), redraw number
//          (truncated normals) or 0; dropout uses all four words of a block,
//          lo = global element index / 4.
// Uniform: the top 24 bits of the first output word / 2^24, in [0, 1).
// Normal:  Box-Muller over the first two output words of the same block.
#include "kdrt.h"
#include "kdrt_philox.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------ Philox-4x32-10

void kdrt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
  kdrt_philox_block(x, key[0], key[1]);
  out[0] = x[0], out[1] = x[1], out[2] = x[2], out[3] = x[3];
}

// The four output words for (seed, stream, hi, lo).
static void philox_block(uint64_t seed, uint64_t stream, uint64_t hi, uint64_t lo,
                         uint32_t out[4]) {
  uint64_t k = kdrt_splitmix64(seed ^ kdrt_splitmix64(stream));
  uint32_t key[2] = {(uint32_t)k, (uint32_t)(k >> 32)};
  uint32_t ctr[4] = {(uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi, (uint32_t)(hi >> 32)};
  kdrt_philox4x32(ctr, key, out);
}

float kdrt_uniform(uint64_t seed, uint64_t stream, uint64_t hi, uint64_t lo) {
  uint32_t w[4];
  philox_block(seed, stream, hi, lo, w);
  return kdrt_philox_uniform(w[0]);
}

float kdrt_normal(uint64_t seed, uint64_t stream, uint64_t hi, uint64_t lo) {
  uint32_t w[4];
  philox_block(seed, stream, hi, lo, w);
  return kdrt_philox_normal(w[0], w[1]);
}

// A standard normal truncated to [-2, 2], as Keras's TruncatedNormal: a draw
// outside is redrawn with the next counter hi, so the value stays a pure
// function of (seed, stream, index).
static float truncated_normal(uint64_t seed, uint64_t stream, uint64_t idx) {
  for (uint64_t attempt = 0;; attempt++) {
    float z = kdrt_normal(seed, stream, attempt, idx);
    if (fabsf(z) <= 2.0f) return z;
  }
}

// ------------------------------------------------------------ this rank's block

// Where this rank's block of a tensor of layout l lies in the global one,
// row by row (a row: a run along the last dim), for random access to rows.
typedef struct {
  int rank;
  int64_t lext[KDRT_MAX_RANK], off[KDRT_MAX_RANK], gstride[KDRT_MAX_RANK];
  int64_t rows, len; // local rows and their length
} block_rows;

static void block_rows_of(const kdrt_ctx *c, const kdrt_layout *l, block_rows *b) {
  int r = l->rank;
  int64_t stride = 1;
  b->rank = r;
  for (int d = r - 1; d >= 0; d--) {
    int ax = l->axis[d];
    int64_t parts = ax >= 0 ? c->prog->mesh_shape[ax] : 1;
    b->lext[d] = l->gshape[d] / parts;
    b->off[d] = ax >= 0 ? c->coord[ax] * b->lext[d] : 0;
    // Uneven rows (c->ragged): a dim that does not divide over its axis
    // can only be the batch, cut as the rows are (kdrt_rows_split).
    if (ax >= 0 && c->ragged && l->gshape[d] % parts)
      kdrt_rows_split(l->gshape[d], (int)parts, c->coord[ax], &b->off[d], &b->lext[d]);
    b->gstride[d] = stride;
    stride *= l->gshape[d];
  }
  b->rows = 1;
  for (int d = 0; d < r - 1; d++) b->rows *= b->lext[d];
  b->len = r ? b->lext[r - 1] : 1;
}

// The global row-major index of local row `row`'s first element.
static int64_t block_row_global(const block_rows *b, int64_t row) {
  if (b->rank == 0) return 0;
  int64_t g = b->off[b->rank - 1];
  for (int d = b->rank - 2; d >= 0; d--) {
    g += (b->off[d] + row % b->lext[d]) * b->gstride[d];
    row /= b->lext[d];
  }
  return g;
}

// Visit this rank's block of a tensor of layout l one contiguous run (the
// last dimension) at a time: fn gets the run's offset in the local buffer,
// the global row-major index of its first element, and its length.
typedef void row_fn(void *arg, int64_t local, int64_t global, int64_t len);

// Rows run on the rank's OpenMP threads (fn writes only its run).
static void walk_block(const kdrt_ctx *c, const kdrt_layout *l, row_fn *fn, void *arg) {
  block_rows b;
  block_rows_of(c, l, &b);
  if (b.len == 0) return;
#pragma omp parallel for schedule(static) if (b.rows * b.len >= 8192)
  for (int64_t row = 0; row < b.rows; row++) fn(arg, row * b.len, block_row_global(&b, row), b.len);
}

// ------------------------------------------------------------ initializers

// Philox blocks in bulk (below, with dropout's mask).
typedef void philox_blocks_fn(const uint32_t key[2], uint64_t hi, uint64_t blk, size_t n,
                              uint32_t *out);
static philox_blocks_fn *philox_blocks_for_cpu(void);

typedef struct {
  const kdrt_ctx *c;
  float *buf;
  kdrt_init_kind kind;
  uint64_t stream;
  double a, b; // uniform: [a, b); normal: mean a, stddev b; unit_forget: [a, 2a) of b columns
  const double *q; // orthogonal: the whole variable, row-major
  philox_blocks_fn *blocks; // the uniforms' block maker
} init_job;

static void init_row(void *arg, int64_t local, int64_t global, int64_t len) {
  const init_job *j = arg;
  uint64_t seed = j->c->seed;
  float *out = j->buf + local;
  if (j->kind == KDRT_INIT_GLOROT_UNIFORM || j->kind == KDRT_INIT_HE_UNIFORM ||
      j->kind == KDRT_INIT_LECUN_UNIFORM || j->kind == KDRT_INIT_RANDOM_UNIFORM) {
    // kdrt_uniform(seed, stream, 0, g) for each g, its blocks made in bulk
    // (AVX2 where there is): the same words, an order of magnitude faster
    uint64_t k = kdrt_splitmix64(seed ^ kdrt_splitmix64(j->stream));
    const uint32_t key[2] = {(uint32_t)k, (uint32_t)(k >> 32)};
    uint32_t words[4 * 256];
    for (int64_t i0 = 0; i0 < len; i0 += 256) {
      size_t n = (size_t)(len - i0 < 256 ? len - i0 : 256);
      j->blocks(key, 0, (uint64_t)(global + i0), n, words);
      for (size_t i = 0; i < n; i++)
        out[i0 + (int64_t)i] =
            (float)(j->a + (j->b - j->a) * kdrt_philox_uniform(words[4 * i]));
    }
    return;
  }
  for (int64_t i = 0; i < len; i++) {
    uint64_t g = (uint64_t)(global + i);
    switch (j->kind) {
    case KDRT_INIT_GLOROT_UNIFORM: case KDRT_INIT_HE_UNIFORM: case KDRT_INIT_LECUN_UNIFORM:
    case KDRT_INIT_RANDOM_UNIFORM:
      out[i] = (float)(j->a + (j->b - j->a) * kdrt_uniform(seed, j->stream, 0, g));
      break;
    case KDRT_INIT_RANDOM_NORMAL:
      out[i] = (float)(j->a + j->b * kdrt_normal(seed, j->stream, 0, g));
      break;
    case KDRT_INIT_UNIT_FORGET: {
      double col = (double)(g % (uint64_t)j->b);
      out[i] = col >= j->a && col < 2 * j->a ? 1.0f : 0.0f;
      break;
    }
    case KDRT_INIT_ORTHOGONAL:
      out[i] = (float)j->q[g];
      break;
    default: // the truncated normals
      out[i] = (float)(j->a + j->b * truncated_normal(seed, j->stream, g));
      break;
    }
  }
}

// Keras's Orthogonal(gain): the variable seen as [rows, cols] (cols its
// last dim) is gain times the Q of the QR decomposition of a normal matrix
// [max, min] of them (transposed when rows < cols), signed so that R's
// diagonal is positive: what Gram-Schmidt on that matrix's columns gives.
// The whole matrix on every rank (from the global indices, as every
// initializer), in double; each rank keeps its block.
static double *orthogonal(uint64_t seed, uint64_t stream, const kdrt_layout *l, double gain) {
  int64_t cols = l->gshape[l->rank - 1], rows = 1;
  for (int d = 0; d + 1 < l->rank; d++) rows *= l->gshape[d];
  int64_t n = rows > cols ? rows : cols, m = rows > cols ? cols : rows;
  double *a = malloc(sizeof(double) * (size_t)(n * m)), *q = malloc(sizeof(double) * (size_t)(n * m));
  if (!a || !q) {
    fprintf(stderr, "kdrt: out of memory for an orthogonal initializer\n");
    exit(1);
  }
  for (int64_t e = 0; e < n * m; e++) a[e] = kdrt_normal(seed, stream, 0, (uint64_t)e);
  for (int64_t k = 0; k < m; k++) { // column k of a [n, m], made orthogonal to the ones before
    for (int64_t p = 0; p < k; p++) {
      double dot = 0;
      for (int64_t i = 0; i < n; i++) dot += a[i * m + p] * a[i * m + k];
      for (int64_t i = 0; i < n; i++) a[i * m + k] -= dot * a[i * m + p];
    }
    double norm = 0;
    for (int64_t i = 0; i < n; i++) norm += a[i * m + k] * a[i * m + k];
    norm = sqrt(norm);
    for (int64_t i = 0; i < n; i++) a[i * m + k] = norm > 0 ? a[i * m + k] / norm : 0;
  }
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++)
      q[i * cols + j] = gain * (rows >= cols ? a[i * m + j] : a[j * m + i]);
  free(a);
  return q;
}

// issue 23: a variable kept in 16 bits (kdcc's store16.c): the same
// values, rounded to its type (Keras's initializers make them in its dtype)
// and stored as its 16 bits at buf.
void kdrt_init_fill16(const kdrt_ctx *c, int round, float *buf, const kdrt_layout *l,
                      kdrt_init_kind kind, double fan_in, double fan_out, float p0, float p1,
                      uint64_t stream) {
  size_t n = 1;
  for (int d = 0; d < l->rank; d++) {
    int ax = l->axis[d];
    n *= (size_t)(l->gshape[d] / (ax >= 0 ? c->prog->mesh_shape[ax] : 1));
  }
  float *w = malloc(sizeof *w * (n ? n : 1));
  if (!w) kdrt_fatal(c, "out of memory");
  kdrt_init_fill(c, w, l, kind, fan_in, fan_out, p0, p1, stream);
  kdrt_round(round, w, w, n);
  kdrt_pack16(round, (uint16_t *)buf, w, n);
  free(w);
}

void kdrt_init_fill(const kdrt_ctx *c, float *buf, const kdrt_layout *l, kdrt_init_kind kind,
                    double fan_in, double fan_out, float p0, float p1, uint64_t stream) {
  size_t n = 1;
  for (int d = 0; d < l->rank; d++) {
    int ax = l->axis[d];
    n *= (size_t)(l->gshape[d] / (ax >= 0 ? c->prog->mesh_shape[ax] : 1));
  }
  if (kind == KDRT_INIT_ZEROS || kind == KDRT_INIT_ONES || kind == KDRT_INIT_CONSTANT) {
    float v = kind == KDRT_INIT_ZEROS ? 0.0f : kind == KDRT_INIT_ONES ? 1.0f : p0;
    for (size_t i = 0; i < n; i++) buf[i] = v;
    return;
  }
  if (kind == KDRT_INIT_UNIT_FORGET) {
    init_job j = {c, buf, kind, stream, p0, (double)l->gshape[l->rank - 1], NULL, NULL};
    walk_block(c, l, init_row, &j);
    return;
  }
  if (kind == KDRT_INIT_ORTHOGONAL) {
    double *q = orthogonal(c->seed, stream, l, p0);
    init_job j = {c, buf, kind, stream, 0.0, 0.0, q, NULL};
    walk_block(c, l, init_row, &j);
    free(q);
    return;
  }
  // Keras's VarianceScaling: variance scale / fan, uniform limit
  // sqrt(3 * scale / fan), truncated normal stddev sqrt(scale / fan)
  // corrected by the stddev of a standard normal truncated at 2.
  double scale = 1.0, fan = 1.0;
  switch (kind) {
  case KDRT_INIT_GLOROT_UNIFORM: case KDRT_INIT_GLOROT_NORMAL:
    fan = (fan_in + fan_out) / 2.0;
    break;
  case KDRT_INIT_HE_UNIFORM: case KDRT_INIT_HE_NORMAL:
    scale = 2.0, fan = fan_in;
    break;
  case KDRT_INIT_LECUN_UNIFORM: case KDRT_INIT_LECUN_NORMAL:
    fan = fan_in;
    break;
  default:
    break;
  }
  if (fan < 1.0) fan = 1.0; // Keras: max(1, fan)
  init_job j = {c, buf, kind, stream, 0.0, 0.0, NULL, philox_blocks_for_cpu()};
  switch (kind) {
  case KDRT_INIT_GLOROT_UNIFORM: case KDRT_INIT_HE_UNIFORM: case KDRT_INIT_LECUN_UNIFORM: {
    double limit = sqrt(3.0 * scale / fan);
    j.a = -limit, j.b = limit;
    break;
  }
  case KDRT_INIT_GLOROT_NORMAL: case KDRT_INIT_HE_NORMAL: case KDRT_INIT_LECUN_NORMAL:
    j.a = 0.0, j.b = sqrt(scale / fan) / 0.87962566103423978;
    break;
  default: // random_normal, random_uniform, truncated_normal: the user's parameters
    j.a = p0, j.b = p1;
    break;
  }
  walk_block(c, l, init_row, &j);
}

// ------------------------------------------------------------ dropout
//
// Element e of a mask takes word e % 4 of the Philox block for counter
// (lo = e / 4, hi = step): one block serves four elements, whatever the
// mesh. The blocks are made 8 at a time with AVX2 where the CPU has it
// (chosen at run time), else one at a time; both give the same words.

// Blocks [blk, blk + n) for counter hi, their words in element order:
// out[4 * i + w] = word w of block blk + i.
static void philox_blocks_scalar(const uint32_t key[2], uint64_t hi, uint64_t blk, size_t n,
                                 uint32_t *out) {
  for (size_t i = 0; i < n; i++) {
    uint64_t lo = blk + i;
    uint32_t ctr[4] = {(uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi, (uint32_t)(hi >> 32)};
    kdrt_philox4x32(ctr, key, out + 4 * i);
  }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KD_HAVE_AVX2_PATH 1

// The high and low 32 bits of the products a * b of 8 lanes.
__attribute__((target("avx2"))) static inline void mulhilo8(__m256i a, __m256i b, __m256i *hi,
                                                            __m256i *lo) {
  __m256i pe = _mm256_mul_epu32(a, b);                        // lanes 0, 2, 4, 6 (64-bit)
  __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b); // lanes 1, 3, 5, 7
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
  *lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
}

// philox_blocks_scalar, 8 blocks (lanes) at a time, then the rest one by one.
__attribute__((target("avx2"))) static void philox_blocks_avx2(const uint32_t key[2],
                                                               uint64_t hi, uint64_t blk,
                                                               size_t n, uint32_t *out) {
  const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
  const __m256i c2 = _mm256_set1_epi32((int)(uint32_t)hi);
  const __m256i c3 = _mm256_set1_epi32((int)(uint32_t)(hi >> 32));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint32_t lo32[8], hi32[8];
    for (int l = 0; l < 8; l++) {
      uint64_t c = blk + i + (uint64_t)l;
      lo32[l] = (uint32_t)c, hi32[l] = (uint32_t)(c >> 32);
    }
    __m256i x0 = _mm256_loadu_si256((const __m256i *)lo32);
    __m256i x1 = _mm256_loadu_si256((const __m256i *)hi32), x2 = c2, x3 = c3;
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
      __m256i h0, l0, h1, l1;
      mulhilo8(x0, m0, &h0, &l0);
      mulhilo8(x2, m1, &h1, &l1);
      x0 = _mm256_xor_si256(_mm256_xor_si256(h1, x1), _mm256_set1_epi32((int)k0));
      x1 = l1;
      x2 = _mm256_xor_si256(_mm256_xor_si256(h0, x3), _mm256_set1_epi32((int)k1));
      x3 = l0;
      k0 += PHILOX_W0;
      k1 += PHILOX_W1;
    }
    // Lanes (blocks) to element order: a 4x8 transpose.
    __m256i t0 = _mm256_unpacklo_epi32(x0, x1), t1 = _mm256_unpackhi_epi32(x0, x1);
    __m256i t2 = _mm256_unpacklo_epi32(x2, x3), t3 = _mm256_unpackhi_epi32(x2, x3);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i *o = (__m256i *)(out + 4 * i);
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(u0, u1, 0x20)); // blocks 0, 1
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(u2, u3, 0x20)); // blocks 2, 3
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(u0, u1, 0x31)); // blocks 4, 5
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(u2, u3, 0x31)); // blocks 6, 7
  }
  philox_blocks_scalar(key, hi, blk + i, n - i, out + 4 * i);
}
#endif

// The block maker for this CPU (KDRT_PHILOX=scalar forces the plain one).
static philox_blocks_fn *philox_blocks_for_cpu(void) {
#ifdef KD_HAVE_AVX2_PATH
  const char *env = getenv("KDRT_PHILOX");
  if (!(env && !strcmp(env, "scalar")) && __builtin_cpu_supports("avx2"))
    return philox_blocks_avx2;
#endif
  return philox_blocks_scalar;
}

typedef struct {
  philox_blocks_fn *blocks;
  uint32_t key[2];
  uint64_t step;
  float rate, keep_scale;
} dropout_job;

// y[i] = x[i] * keep_scale where the uniform of element global + i is at
// least rate, else 0, for i < len; blocks made KD_DROP_BLOCKS at a time.
#define KD_DROP_BLOCKS 256
static void dropout_run(const dropout_job *j, float *y, const float *x, int64_t global,
                        int64_t len) {
  uint32_t words[4 * KD_DROP_BLOCKS];
  for (int64_t i = 0; i < len;) {
    const uint64_t e = (uint64_t)(global + i), blk = e >> 2;
    const int64_t skip = (int64_t)(e & 3); // words of the first block before element e
    int64_t nb = (skip + len - i + 3) / 4;
    nb = nb < KD_DROP_BLOCKS ? nb : KD_DROP_BLOCKS;
    j->blocks(j->key, j->step, blk, (size_t)nb, words);
    const int64_t m = 4 * nb - skip < len - i ? 4 * nb - skip : len - i;
    const uint32_t *w = words + skip;
    for (int64_t k = 0; k < m; k++) {
      float u = kdrt_philox_uniform(w[k]);
      y[i + k] = u >= j->rate ? x[i + k] * j->keep_scale : 0.0f;
    }
    i += m;
  }
}

// Elements a thread takes at a time: a row, or a piece of a long one.
#define KD_DROP_PIECE 4096

// y = x * mask / (1 - rate) on this rank's block of layout l, the mask
// drawn for (seed, stream, step, global element index); y may be x. Rows
// (or pieces of long rows) run on the rank's OpenMP threads; each
// element's value depends only on its global index.
void kdrt_dropout(kdrt_ctx *c, float *y, const float *x, const kdrt_layout *l, float rate,
                  uint64_t stream) {
  uint64_t k = kdrt_splitmix64(c->seed ^ kdrt_splitmix64(stream));
  dropout_job j = {philox_blocks_for_cpu(), {(uint32_t)k, (uint32_t)(k >> 32)},
                   (uint64_t)c->step, rate, rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f};
  if (rate >= 1.0f) j.rate = 2.0f; // nothing is kept
  block_rows b;
  block_rows_of(c, l, &b);
  if (b.len == 0 || b.rows == 0) return;
  const int64_t pieces = (b.len + KD_DROP_PIECE - 1) / KD_DROP_PIECE;
#pragma omp parallel for schedule(static) if (b.rows * b.len >= 8192)
  for (int64_t t = 0; t < b.rows * pieces; t++) {
    const int64_t row = t / pieces, p0 = t % pieces * KD_DROP_PIECE;
    const int64_t n = b.len - p0 < KD_DROP_PIECE ? b.len - p0 : KD_DROP_PIECE;
    const int64_t local = row * b.len + p0;
    dropout_run(&j, y + local, x + local, block_row_global(&b, row) + p0, n);
  }
}

// ------------------------------------------------------------ issue 11: Gaussian noise
//
// z for element e is kdrt_normal(seed, stream, step, e): a pure function of
// the element's global index, as dropout's mask.

typedef struct {
  const kdrt_ctx *c;
  float *y;
  const float *x;
  float stddev;
  int mul;
  uint64_t stream;
} noise_job;

static void noise_row(void *arg, int64_t local, int64_t global, int64_t len) {
  const noise_job *j = arg;
  for (int64_t i = 0; i < len; i++) {
    float z = j->stddev * kdrt_normal(j->c->seed, j->stream, (uint64_t)j->c->step,
                                      (uint64_t)(global + i));
    j->y[local + i] = j->mul ? j->x[local + i] * (1.0f + z) : j->x[local + i] + z;
  }
}

void kdrt_gaussian_noise(kdrt_ctx *c, float *y, const float *x, const kdrt_layout *l,
                         float stddev, int mul, uint64_t stream) {
  noise_job j = {c, y, x, stddev, mul, stream};
  walk_block(c, l, noise_row, &j);
}
