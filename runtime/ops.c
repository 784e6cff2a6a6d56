// ops.c: the compute kernels a generated train_step calls on local buffers.
//
// Every function here works on one rank's local block and never
// communicates; kdcc decides what is local and inserts the collectives
// around these calls. The semantics are Keras 3's as the JAX backend runs
// them, so that a kdcc program and `model.fit` on JAX print the same numbers:
//
// - Activations follow keras.activations (gelu is the exact erf form,
//   Keras's default approximate=False). Gradients take both the input x and
//   the output y; each uses whichever is cheaper (relu/sigmoid/tanh: y).
// - Conv2D is channels last. The forward pass and the filter gradient lower
//   the input to a [B*OH*OW, KH*KW*C] matrix in the caller's scratch
//   (im2col) and make one sgemm with the [KH*KW*C, K] filter; the input
//   gradient makes one sgemm into the scratch and scatters it back (col2im).
//   A 1x1, stride 1, unpadded conv skips the copy: x already is that matrix.
// - Max pooling never lets a padding position win; its gradient goes to the
//   first maximum of each window in row-major window order.
//
// - Activation formulas live only in kdrt_defs.h's KDRT_ACT_LIST: the
//   kernels here expand it into one plain loop per activation (the formula
//   inlined, so each loop vectorises), as the CUDA kernels do. Their exp,
//   erf, tanh... are vmath.h's (glibc's libmvec), vectorised like the rest
//   of the loop and giving an element the same bits wherever it falls; so
//   are the exps of softmax and of loss.c's split crossentropy. (loss.c's
//   row losses still call libm.) norm.c's batch normalization expands the
//   list the same way.
//
// Apart, each in a file of its own: the losses and metrics (loss.c), the
// optimizer updates (optim.c), the normalizations (norm.c). ops_impl.h
// holds the few static helpers the four files share.
//
// Elementwise kernels allow the output to alias an input of the same shape
// (dx == dy, y == x); the conv, pooling, transpose and embedding kernels
// do not.
//
// Threads: a kernel over enough elements runs on the rank's OpenMP threads
// (OMP_NUM_THREADS; one rank per device, its cores), and its results never
// depend on how many there are. Every output element is computed by one
// thread in the order a single thread would use; a sum over rows is either
// split by columns (each column summed in row order) or taken over fixed
// blocks of rows whose partial sums are added in block order, the blocks a
// function of the shape alone. Losses keep each row's value and add them in
// row order, as before.
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kdrt.h"
#include "ops_impl.h"

// The rank's threads, set before main (and so before MPI_Init):
// - OMP_NUM_THREADS when it is set; else the cores this process may run
//   on, shared out among the ranks of its node (OMPI_COMM_WORLD_LOCAL_SIZE,
//   or MPICH's MPI_LOCALNRANKS) when the launcher did not bind it (its mask
//   is the whole node): one rank per device, each with its share, so 8
//   ranks on 2 cores run one thread each, not two.
// - When the node is oversubscribed (more threads than cores: ranks times
//   threads per rank, or threads beyond a bound rank's cores; or a 1-minute
//   load average already at the cores, from other work): one thread, unless
//   OMP_NUM_THREADS says otherwise, and Open MPI's mpi_yield_when_idle
//   unless set, so that a rank waiting in a collective yields its core.
//   Threads that spin after each parallel region and ranks that busy-poll
//   take the cores from the ones with work: a GPT epoch on 2 ranks of 2
//   threads ran 10 times slower on a loaded 2-core machine. (libgomp has
//   read OMP_WAIT_POLICY before this runs: set it passive yourself with
//   OMP_NUM_THREADS > 1 on a busy machine.)
__attribute__((constructor)) static void rank_threads(void) {
  cpu_set_t set;
  const int mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int bound = online > 0 && mine < online;
  const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); // Open MPI
  if (!local)
    local = getenv("MPI_LOCALNRANKS"); // MPICH's Hydra
  const int ranks = local && atoi(local) > 0 ? atoi(local) : 1;
  const char *given = getenv("OMP_NUM_THREADS");
  int threads = given ? omp_get_max_threads() : bound ? mine : mine / ranks;
  if (threads < 1)
    threads = 1;
  double load = 0;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &load) != 1)
      load = 0;
    fclose(f);
  }
  const int over = (bound ? threads > mine : (long)threads * ranks > online) ||
                   (online > 0 && load >= (double)online);
  if (over) {
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    if (!given)
      threads = 1;
  }
  if (!given)
    omp_set_num_threads(threads);
}

// ---------------------------------------------------------------- activations

// y = f(x) elementwise: one loop per activation of KDRT_ACT_LIST, the
// formula f(v) inlined, rounded to rnd as it is stored (kdrt_ops.def's
// _rnd kernels, a loop for each: KD_ROUNDED). y may be x.
void kdrt_act_rnd(int rnd, int act, float *y, const float *x, size_t n) {
#define KDRT_X(name, kname, from_x, f, df)                                                       \
  case KDRT_ACT_##name:                                                                          \
    KD_PAR_FOR(n)                                                                                \
    for (size_t i = 0; i < n; i++) {                                                             \
      float v = x[i];                                                                            \
      y[i] = kdrt_round_opt(R, f);                                                               \
    }                                                                                            \
    return;
  KD_ROUNDED(rnd, switch (act) { KDRT_ACT_LIST(KDRT_X) });
#undef KDRT_X
  bad_call("kdrt_act", "unknown activation");
}

void kdrt_act(int act, float *y, const float *x, size_t n) {
  kdrt_act_rnd(KDRT_ROUND_NONE, act, y, x, n);
}

// dx = dy * f'(v, y). An activation whose derivative needs the input
// (FROM_X) reads x only (and y is recomputed where the formula wants it,
// which the compiler drops when it does not); the others read y only, so x
// may be NULL for them and y for the FROM_X ones. dx may be dy.
void kdrt_act_grad_rnd(int rnd, int act, float *dx, const float *dy, const float *xs,
                       const float *ys, size_t n) {
#define KDRT_X(name, kname, from_x, f, df)                                                       \
  case KDRT_ACT_##name:                                                                          \
    if (from_x) {                                                                                \
      KD_PAR_FOR(n)                                                                              \
      for (size_t i = 0; i < n; i++) {                                                           \
        float v = xs[i], y = (f);                                                                \
        (void)y;                                                                                 \
        dx[i] = kdrt_round_opt(R, dy[i] * (df));                                                 \
      }                                                                                          \
    } else {                                                                                     \
      KD_PAR_FOR(n)                                                                              \
      for (size_t i = 0; i < n; i++) {                                                           \
        float y = ys[i], v = y;                                                                  \
        (void)v;                                                                                 \
        dx[i] = kdrt_round_opt(R, dy[i] * (df));                                                 \
      }                                                                                          \
    }                                                                                            \
    return;
  KD_ROUNDED(rnd, switch (act) { KDRT_ACT_LIST(KDRT_X) });
#undef KDRT_X
  bad_call("kdrt_act_grad", "unknown activation");
}

void kdrt_act_grad(int act, float *dx, const float *dy, const float *xs, const float *ys,
                   size_t n) {
  kdrt_act_grad_rnd(KDRT_ROUND_NONE, act, dx, dy, xs, ys, n);
}

// issue 23: v (x, or y, whichever act's derivative reads) a saved value of
// a 16-bit type in its 16 bits (store16.c): widened a block at a time
// (kdrt_unpack16, the same float32) and kdrt_act_grad on it: its bits.
void kdrt_act_grad16_rnd(int rnd, int act, int kind, float *dx, const float *dy,
                         const uint16_t *v, size_t n) {
  enum { CH = 2048 };
  const size_t nch = (n + CH - 1) / CH;
#pragma omp parallel for schedule(static) if (n >= KD_PAR_MIN && nch > 1)
  for (size_t c = 0; c < nch; c++) {
    float w[CH];
    const size_t i0 = c * CH, m = n - i0 < CH ? n - i0 : CH;
    kdrt_unpack16(kind, w, v + i0, m);
    kdrt_act_grad_rnd(rnd, act, dx + i0, dy + i0, w, w, m);
  }
}

void kdrt_act_grad16(int act, int kind, float *dx, const float *dy, const uint16_t *v, size_t n) {
  kdrt_act_grad16_rnd(KDRT_ROUND_NONE, act, kind, dx, dy, v, n);
}

// out[r, j] = f(in[r, j] + bias[j]): the bias add fused with its
// activation. out may be in.
void kdrt_bias_act_rnd(int rnd, int act, float *out, const float *in, const float *bias,
                       int64_t rows, int64_t cols) {
  if (!col_affine_act(rnd, act, out, in, NULL, bias, rows, cols))
    bad_call("kdrt_bias_act", "unknown activation");
}

void kdrt_bias_act(int act, float *out, const float *in, const float *bias, int64_t rows,
                   int64_t cols) {
  kdrt_bias_act_rnd(KDRT_ROUND_NONE, act, out, in, bias, rows, cols);
}

// Wide rows (or a single block) are split over threads by 256 columns, each
// column summed row by row in a float accumulator; otherwise each block of
// KD_SUM_BLOCK rows is summed by a thread, the blocks' sums then added in
// block order. The same bits for any thread count.
void kd_col_sums(float *const *out, int nout, kd_add_rows *add, const void *ctx, int64_t rows,
                 int64_t cols, const char *who) {
  const int64_t nblk = (rows + KD_SUM_BLOCK - 1) / KD_SUM_BLOCK;
  if (nblk <= 1 || cols >= 256) {
    const int64_t CB = 256; // columns a thread takes at a time
    KD_PAR_FOR(rows * cols)
    for (int64_t j0 = 0; j0 < cols; j0 += CB) {
      const int64_t n = cols - j0 < CB ? cols - j0 : CB;
      float acc[2 * 256] = {0};
      add(ctx, acc, CB, 0, rows, j0, n);
      for (int i = 0; i < nout; i++)
        if (out[i]) memcpy(out[i] + j0, acc + i * CB, (size_t)n * sizeof *acc);
    }
    return;
  }
  const int64_t w = nout * cols; // block k's sums: part[k * w + i * cols + j]
  float *part = calloc((size_t)(nblk * w), sizeof *part);
  if (!part)
    bad_call(who, "out of memory");
  KD_PAR_FOR(rows * cols)
  for (int64_t k = 0; k < nblk; k++) {
    const int64_t r1 = (k + 1) * KD_SUM_BLOCK < rows ? (k + 1) * KD_SUM_BLOCK : rows;
    add(ctx, part + k * w, cols, k * KD_SUM_BLOCK, r1, 0, cols);
  }
  for (int i = 0; i < nout; i++) {
    if (!out[i]) continue;
    memcpy(out[i], part + i * cols, (size_t)cols * sizeof *part);
    for (int64_t k = 1; k < nblk; k++)
      for (int64_t j = 0; j < cols; j++) out[i][j] += part[k * w + i * cols + j];
  }
  free(part);
}

typedef struct {
  const float *in;
  int64_t cols;
} RowsOf;

// acc[j] += in[r, j0 + j] for rows [r0, r1), in row order.
static void add_in_rows(const void *ctx, float *restrict acc, int64_t stride, int64_t r0,
                        int64_t r1, int64_t j0, int64_t n) {
  const RowsOf *m = ctx;
  (void)stride; // one quantity
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict ir = m->in + r * m->cols + j0;
    for (int64_t j = 0; j < n; j++)
      acc[j] += ir[j];
  }
}

// out[j] = sum over r of in[r, j], in float, in kd_col_sums's order;
// _rnd: each sum then rounded to rnd (cols values, still in cache).
void kdrt_bias_grad_rnd(int rnd, float *out, const float *in, int64_t rows, int64_t cols) {
  kd_col_sums(&out, 1, add_in_rows, &(RowsOf){in, cols}, rows, cols, "kdrt_bias_grad");
  for (int64_t j = 0; rnd != KDRT_ROUND_NONE && j < cols; j++)
    out[j] = kdrt_round_to(rnd, out[j]);
}

void kdrt_bias_grad(float *out, const float *in, int64_t rows, int64_t cols) {
  kdrt_bias_grad_rnd(KDRT_ROUND_NONE, out, in, rows, cols);
}

// ---------------------------------------------------------------- elementwise

// out = in[0] + in[1] + ... + in[nin - 1], added left to right (the order
// the CUDA kernel uses too), rounded to rnd as it is stored. out may be
// any of the inputs.
void kdrt_add_rnd(int rnd, float *out, const float *const *in, int nin, size_t n) {
  if (nin < 1 || nin > 8)
    bad_call("kdrt_add", "between 1 and 8 operands");
  KD_ROUNDED(rnd, {
    if (nin == 2) { // the common case, as one loop that vectorises
      const float *a = in[0], *b = in[1];
      KD_PAR_FOR(n)
      for (size_t i = 0; i < n; i++)
        out[i] = kdrt_round_opt(R, a[i] + b[i]);
      return;
    }
    KD_PAR_FOR(n * nin)
    for (size_t i = 0; i < n; i++) {
      float s = in[0][i];
      for (int k = 1; k < nin; k++)
        s = s + in[k][i];
      out[i] = kdrt_round_opt(R, s);
    }
  });
}

void kdrt_add(float *out, const float *const *in, int nin, size_t n) {
  kdrt_add_rnd(KDRT_ROUND_NONE, out, in, nin, n);
}

// out = a * b elementwise; out may be a or b.
void kdrt_mul(float *out, const float *a, const float *b, size_t n) {
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    out[i] = a[i] * b[i];
}

// out = in * scale + shift; out may be in.
void kdrt_scale(float *out, const float *in, size_t n, float scale, float shift) {
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    out[i] = kdrt_scale1(in[i], scale, shift);
}

// out = in (they may overlap).
void kdrt_copy(float *out, const float *in, size_t n) {
  if (out != in)
    memmove(out, in, n * sizeof *out);
}

// ---------------------------------------------------------------- softmax

// The largest of x[0, n), -INFINITY for none.
static inline float row_max(const float *x, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; j++)
    m = x[j] > m ? x[j] : m;
  return m;
}

// y[0, n) /= their sum, added in order.
static inline void normalize_row(float *y, int64_t n) {
  float s = 0.0f;
  for (int64_t j = 0; j < n; j++)
    s += y[j];
  float inv = 1.0f / s;
  for (int64_t j = 0; j < n; j++)
    y[j] *= inv;
}

void kdrt_softmax(float *y, const float *x, int64_t rows, int64_t cols) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    float m = row_max(xr, cols);
    for (int64_t j = 0; j < cols; j++) // vectorises; the sum in normalize_row cannot
      yr[j] = exp_flush(xr[j] - m);
    normalize_row(yr, cols);
  }
}

void kdrt_softmax_grad(float *dx, const float *dy, const float *y, int64_t rows, int64_t cols) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *dyr = dy + r * cols, *yr = y + r * cols;
    float *dxr = dx + r * cols;
    float dot = 0.0f;
    for (int64_t j = 0; j < cols; j++)
      dot += dyr[j] * yr[j];
    for (int64_t j = 0; j < cols; j++)
      dxr[j] = yr[j] * (dyr[j] - dot);
  }
}

// issue 25: the row's max, its sum of exps added in order, then x - max -
// log(sum); the gradient's sum of dy in order.
void kdrt_log_softmax(float *y, const float *x, int64_t rows, int64_t cols) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    float m = row_max(xr, cols), s = 0.0f;
    for (int64_t j = 0; j < cols; j++)
      s += expf(xr[j] - m);
    float l = logf(s);
    for (int64_t j = 0; j < cols; j++)
      yr[j] = xr[j] - m - l;
  }
}

void kdrt_log_softmax_grad(float *dx, const float *dy, const float *y, int64_t rows,
                           int64_t cols) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *dyr = dy + r * cols, *yr = y + r * cols;
    float *dxr = dx + r * cols;
    float s = 0.0f;
    for (int64_t j = 0; j < cols; j++)
      s += dyr[j];
    for (int64_t j = 0; j < cols; j++)
      dxr[j] = dyr[j] - expf(yr[j]) * s;
  }
}

// issue 25: glu, each row's halves a and b of x[rows, 2 * cols]; its
// gradient in JAX's order, (dy * a) * (s * (1 - s)).
void kdrt_glu(float *y, const float *x, int64_t rows, int64_t cols) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *a = x + r * 2 * cols, *b = a + cols;
    float *yr = y + r * cols;
    for (int64_t j = 0; j < cols; j++)
      yr[j] = a[j] * KDRT_SIGMOID(b[j]);
  }
}

void kdrt_glu_grad(float *dx, const float *dy, const float *x, int64_t rows, int64_t cols) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *a = x + r * 2 * cols, *b = a + cols, *dyr = dy + r * cols;
    float *da = dx + r * 2 * cols, *db = da + cols;
    for (int64_t j = 0; j < cols; j++) {
      float s = KDRT_SIGMOID(b[j]);
      da[j] = dyr[j] * s;
      db[j] = (dyr[j] * a[j]) * (s * (1.0f - s));
    }
  }
}

void kdrt_attn_softmax(float *y, const float *x, int64_t outer, int64_t t, int64_t u, int64_t t0,
                       float scale, int causal) {
  KD_PAR_FOR(outer * t * u)
  for (int64_t r = 0; r < outer * t; r++) {
    const float *xr = x + r * u;
    float *yr = y + r * u;
    int64_t keys = kdrt_attn_keys(t0 + r % t, u, causal); // the masked ones: exp(MASKED - m) = 0
    float m = -INFINITY;
    for (int64_t j = 0; j < keys; j++) {
      float v = xr[j] * scale + 0.0f;
      m = v > m ? v : m;
    }
    for (int64_t j = 0; j < keys; j++)
      yr[j] = exp_flush(xr[j] * scale + 0.0f - m);
    for (int64_t j = keys; j < u; j++)
      yr[j] = 0.0f;
    normalize_row(yr, keys);
  }
}

void kdrt_attn_softmax_grad(float *dx, const float *dy, const float *y, int64_t outer, int64_t t,
                            int64_t u, int64_t t0, float scale, int causal) {
  KD_PAR_FOR(outer * t * u)
  for (int64_t r = 0; r < outer * t; r++) {
    const float *dyr = dy + r * u, *yr = y + r * u;
    float *dxr = dx + r * u;
    int64_t keys = kdrt_attn_keys(t0 + r % t, u, causal);
    float dot = 0.0f;
    for (int64_t j = 0; j < u; j++)
      dot += dyr[j] * yr[j];
    for (int64_t j = 0; j < keys; j++)
      dxr[j] = yr[j] * (dyr[j] - dot) * scale + 0.0f;
    for (int64_t j = keys; j < u; j++)
      dxr[j] = 0.0f * scale + 0.0f;
  }
}

// issue 22: attention in one op (the CUDA backend's fused kernels; kdcc
// emits it for no CPU program). The reference of the CUDA kernels: the
// chain's arithmetic in float (scale, mask, softmax as attn_softmax, the
// product with v), one query row at a time, its scores in a row buffer.
// The row's lse = max + log(sum) remakes the probabilities backward.
static int64_t attention_row(float *p, const float *qr, const float *k, int64_t i, int64_t s,
                             int64_t hd, float scale, int causal, float *lse) {
  int64_t keys = kdrt_attn_keys(i, s, causal);
  float m = -INFINITY, sum = 0.0f;
  for (int64_t j = 0; j < keys; j++) {
    float a = 0.0f;
    for (int64_t c = 0; c < hd; c++) a += qr[c] * k[j * hd + c];
    p[j] = a * scale + 0.0f;
    m = p[j] > m ? p[j] : m;
  }
  for (int64_t j = 0; j < keys; j++) sum += p[j] = exp_flush(p[j] - m);
  float inv = 1.0f / sum; // (normalize_row's sum, in the same order)
  for (int64_t j = 0; j < keys; j++) p[j] *= inv;
  *lse = m + logf(sum);
  return keys;
}

void kdrt_attention(float *o, float *lse, const float *q, const float *k, const float *v,
                    int64_t bn, int64_t t, int64_t s, int64_t hd, float scale, int causal) {
  KD_PAR_FOR(bn * t * s)
  for (int64_t r = 0; r < bn * t; r++) {
    float *p = malloc(sizeof *p * (size_t)(s ? s : 1));
    if (!p) bad_call("kdrt_attention", "out of memory");
    const float *kb = k + r / t * s * hd, *vb = v + r / t * s * hd;
    int64_t keys = attention_row(p, q + r * hd, kb, r % t, s, hd, scale, causal, &lse[r]);
    for (int64_t c = 0; c < hd; c++) {
      float a = 0.0f;
      for (int64_t j = 0; j < keys; j++) a += p[j] * vb[j * hd + c];
      o[r * hd + c] = a;
    }
    free(p);
  }
}

// dv = p^T do, dp = do v^T, ds = p (dp - rowsum(do * o)) * scale (the
// softmax's gradient), dq = ds k, dk = ds^T q; a head at a time (its dk
// and dv are sums over its queries). The probabilities are made again as
// the forward made them, so lse is not read here (the CUDA kernels read it).
void kdrt_attention_grad(float *dq, float *dk, float *dv, const float *dout, const float *q,
                         const float *k, const float *v, const float *o, const float *lse,
                         int64_t bn, int64_t t, int64_t s, int64_t hd, float scale, int causal) {
  (void)lse;
  KD_PAR_FOR(bn * t * s)
  for (int64_t h = 0; h < bn; h++) {
    float *p = malloc(sizeof *p * (size_t)(s ? s : 1));
    if (!p) bad_call("kdrt_attention_grad", "out of memory");
    const float *kb = k + h * s * hd, *vb = v + h * s * hd;
    float *dkb = dk + h * s * hd, *dvb = dv + h * s * hd;
    for (int64_t j = 0; j < s * hd; j++) dkb[j] = dvb[j] = 0.0f;
    for (int64_t i = 0; i < t; i++) {
      const int64_t r = h * t + i;
      const float *qr = q + r * hd, *dor = dout + r * hd, *orow = o + r * hd;
      float l, delta = 0.0f;
      int64_t keys = attention_row(p, qr, kb, i, s, hd, scale, causal, &l);
      for (int64_t c = 0; c < hd; c++) delta += dor[c] * orow[c];
      for (int64_t c = 0; c < hd; c++) dq[r * hd + c] = 0.0f;
      for (int64_t j = 0; j < keys; j++) {
        float dp = 0.0f;
        for (int64_t c = 0; c < hd; c++) dp += dor[c] * vb[j * hd + c];
        float ds = p[j] * (dp - delta) * scale + 0.0f;
        for (int64_t c = 0; c < hd; c++) {
          dvb[j * hd + c] += p[j] * dor[c];
          dq[r * hd + c] += ds * kb[j * hd + c];
          dkb[j * hd + c] += ds * qr[c];
        }
      }
    }
    free(p);
  }
}

// ---------------------------------------------------------------- matmul

// cblas takes int dimensions.
static int blas_int(int64_t v, const char *what) {
  if (v < 0 || v > INT_MAX)
    bad_call("kdrt_matmul", what);
  return (int)v;
}

// Matrix products run on the rank's OpenMP threads as fixed blocks: the
// output is cut along its longer side (M or N) into a number of blocks that
// depends on the product's size alone (a power of two up to KD_GEMM_BLOCKS,
// about KD_GEMM_WORK multiply-adds each, edges at multiples of 16), and each
// block is one single-threaded OpenBLAS call. OpenBLAS's own threads would
// cut the work by the thread count, and its sums with it; these blocks give
// every element the same bits on any number of threads. Cutting the longer
// side repacks the smaller operand once per block.
#define KD_GEMM_BLOCKS 8
#define KD_GEMM_WORK ((int64_t)1 << 22)

// OpenBLAS on one thread, once. An OpenMP build of OpenBLAS (Debian's
// openblas-openmp, chosen by `update-alternatives`) follows the caller's
// OpenMP thread count instead: kd_blas_omp marks it, for sgemm1.
static int kd_blas_omp = -1;

static void blas_single_threaded(void) {
  if (kd_blas_omp >= 0)
    return;
  openblas_set_num_threads(1);
  kd_blas_omp = openblas_get_parallel() == 2;
}

// One row-major cblas_sgemm on this thread.
static void sgemm1(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                   float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                   float *c, int ldc) {
  if (kd_blas_omp && !omp_in_parallel()) {
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
    omp_set_num_threads(threads);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The blocks of a product: how many, and block k's [start, start + size) of
// the side it cuts (D long): 16-wide units shared out as evenly as can be.
static int gemm_blocks(int64_t M, int64_t N, int64_t K, int64_t D) {
  int n = 1;
  while (n < KD_GEMM_BLOCKS && M * N * K >= 2 * n * KD_GEMM_WORK && 2 * n * 16 <= D)
    n *= 2;
  return n;
}

static int64_t block_start(int64_t D, int n, int k, int64_t *size) {
  const int64_t units = (D + 15) / 16, base = units / n, rem = units % n;
  const int64_t u0 = k * base + (k < rem ? k : rem), u1 = u0 + base + (k < rem);
  const int64_t s0 = 16 * u0, s1 = 16 * u1 < D ? 16 * u1 : D;
  *size = s1 - s0;
  return s0;
}

// Task t of a product cut into blocks (gemm_blocks): its product i, and
// the block's rows (along_m) or columns [*s0, *s0 + *len) of c.
typedef struct {
  int M, N, K, lda, ldb, ldc, along_m, nblk;
  enum CBLAS_TRANSPOSE ta, tb;
} gemm_plan;

static gemm_plan plan_gemm(const kdrt_gemm *g) {
  gemm_plan p = {.M = blas_int(g->M, "M exceeds 2^31-1"), .N = blas_int(g->N, "N exceeds 2^31-1"),
                 .K = blas_int(g->K, "K exceeds 2^31-1"),
                 .lda = blas_int(g->lda, "lda exceeds 2^31-1"),
                 .ldb = blas_int(g->ldb, "ldb exceeds 2^31-1"),
                 .ldc = blas_int(g->ldc, "ldc exceeds 2^31-1"),
                 .ta = g->ta == KDRT_TRANS ? CblasTrans : CblasNoTrans,
                 .tb = g->tb == KDRT_TRANS ? CblasTrans : CblasNoTrans};
  p.along_m = p.M >= p.N; // cut the longer side of c
  p.nblk = gemm_blocks(p.M, p.N, p.K, p.along_m ? p.M : p.N);
  return p;
}

// Task t's offsets (in elements) into a, b and c, and its block's M and N.
static void gemm_task(const kdrt_gemm *g, const gemm_plan *p, int64_t t, int64_t off[3], int *m,
                      int *n) {
  const int64_t i = t / p->nblk;
  int64_t len, s0 = block_start(p->along_m ? p->M : p->N, p->nblk, (int)(t % p->nblk), &len);
  off[0] = i * g->stride_a, off[1] = i * g->stride_b, off[2] = i * g->stride_c;
  *m = p->M, *n = p->N;
  if (p->along_m) { // rows s0.. of op(a) and c
    off[0] += p->ta == CblasTrans ? s0 : s0 * p->lda;
    off[2] += s0 * p->ldc;
    *m = (int)len;
  } else { // columns s0.. of op(b) and c
    off[1] += p->tb == CblasTrans ? s0 * p->ldb : s0;
    off[2] += s0;
    *n = (int)len;
  }
}

// For i < g->batch: c_i = alpha * op(a_i) @ op(b_i) + beta * c_i; a stride
// of 0 reuses the same operand for every i. Every (product, block) pair is
// one task for the threads.
void kdrt_matmul(const kdrt_gemm *g, float alpha, const float *a, const float *b, float beta,
                 float *c) {
  if (g->M <= 0 || g->N <= 0)
    return;
  const gemm_plan p = plan_gemm(g);
  blas_single_threaded();
  const int64_t tasks = g->batch * p.nblk;
#pragma omp parallel for schedule(static) if (tasks > 1)
  for (int64_t t = 0; t < tasks; t++) {
    int64_t off[3];
    int m, n;
    gemm_task(g, &p, t, off, &m, &n);
    sgemm1(p.ta, p.tb, m, n, p.K, alpha, a + off[0], p.lda, b + off[1], p.ldb, beta, c + off[2],
           p.ldc);
  }
}

// issue 23: a product of two operands of a 16-bit type, each (fa, fb) its
// 16 bits (KDRT_OPND_16), float32 values of the type (_EXACT) or float32
// values to round to it first (_ROUND: a variable's cast for this use),
// summed in float32. Products of 16-bit values are exact in float32, so
// only the order of the sums differs from matmul's on the same values.
// bfloat16: oneDNN's matmul (onednn.c; AVX512-BF16 or AMX where the CPU
// has them) on the same blocks as matmul's, each on one thread, so that no
// sum depends on the thread count; a float32 operand first rounded to its
// 16 bits (exact for an _EXACT one). Else (float16, no oneDNN bf16 kernel,
// or KDRT_GEMM16=0 in the environment) the operands widened (rounded) to
// float32 and matmul run on them: matmul's very bits. Either way in
// widen, kdrt_matmul16_scratch floats (kdrt_ops.h; the program's buffer,
// sized by the memory plan): nothing is allocated.
void kdrt_matmul16(const kdrt_gemm *g, int kind, int fa, const void *a, int fb, const void *b,
                   float *c, float *widen) {
  if (g->M <= 0 || g->N <= 0)
    return;
  if (!widen && kdrt_matmul16_scratch(g, fa, fb))
    bad_call("kdrt_matmul16", "no buffer for its operands (kdrt_matmul16_scratch)");
  const size_t na = (size_t)kdrt_matmul16_na(g), nb = (size_t)kdrt_matmul16_nb(g);
  float *sa = widen, *sb = widen + kdrt_matmul16_part((int64_t)na, fa);
  const char *env = getenv("KDRT_GEMM16");
  if (kind == KDRT_ROUND_BF16 && !(env && !strcmp(env, "0")) && kdrt_dnnl_bf16()) {
    uint16_t *ca = fa == KDRT_OPND_16 ? NULL : (uint16_t *)sa;
    uint16_t *cb = fb == KDRT_OPND_16 ? NULL : (uint16_t *)sb;
    if (ca) kdrt_round16(kind, ca, a, na);
    if (cb) kdrt_round16(kind, cb, b, nb);
    const uint16_t *pa = ca ? ca : a, *pb = cb ? cb : b;
    const gemm_plan p = plan_gemm(g);
    const int64_t tasks = g->batch * p.nblk;
    int failed = 0;
#pragma omp parallel for schedule(static) if (tasks > 1) reduction(| : failed)
    for (int64_t t = 0; t < tasks; t++) {
      int64_t off[3];
      int m, n;
      gemm_task(g, &p, t, off, &m, &n);
      failed |= !kdrt_dnnl_matmul16(p.ta == CblasTrans, p.tb == CblasTrans, m, n, p.K,
                                    pa + off[0], p.lda, pb + off[1], p.ldb, c + off[2], p.ldc);
    }
    if (!failed) return;
  }
  float *wa = fa == KDRT_OPND_EXACT ? NULL : sa, *wb = fb == KDRT_OPND_EXACT ? NULL : sb;
  if (fa == KDRT_OPND_16) kdrt_unpack16(kind, wa, a, na);
  if (fa == KDRT_OPND_ROUND) kdrt_round(kind, wa, a, na);
  if (fb == KDRT_OPND_16) kdrt_unpack16(kind, wb, b, nb);
  if (fb == KDRT_OPND_ROUND) kdrt_round(kind, wb, b, nb);
  kdrt_matmul(g, 1.0f, wa ? wa : a, wb ? wb : b, 0.0f, c);
}

// issue 22: the CUDA backend does this in one cuBLASLt call (matmul.cu);
// here it is the separate ops' arithmetic in their order, so a program
// computes the very numbers it did before the compiler fused them.
void kdrt_matmul_bias(const kdrt_gemm *g, int act, const float *a, const float *b,
                      const float *bias, float *c, float *dbias) {
  kdrt_matmul(g, 1.0f, a, b, 0.0f, c);
  if (bias)
    kdrt_bias_act(act, c, c, bias, g->M, g->N);
  if (dbias)
    kdrt_bias_grad(dbias, b, g->K, g->N);
}

// ---------------------------------------------------------------- conv2d

// The input row of kernel row kh for output row oh, -1 in the padding.
static inline int dilated_row(int oh, int kh, const kdrt_window *w) {
  return kdrt_conv_at(oh, kh, w->sh, w->pad_t, w->dil_h + 1, w->H);
}
// Where kernel column kw of output column ow reads, for a dilated kernel:
// the input column, or -1 in the padding.
static inline int dilated_col(int ow, int kw, const kdrt_window *w) {
  return kdrt_conv_at(ow, kw, w->sw, w->pad_l, w->dil_w + 1, w->W);
}

// cols [G][B*OH*OW, KH*KW*cg] (G groups of cg = C / G channels): for group
// j, row (b,oh,ow), column (kh,kw,c) holds x's channel j * cg + c under the
// kernel, zero where it falls in the padding. Ungrouped, for one (kh), the
// kernel columns in range are adjacent in x (channels last), so each is one
// memcpy; with a dilated width or groups, one memcpy per kernel column.
// Elements of es bytes: float32, or (issue 23, conv2d16) 16-bit values.
static void im2col(void *restrict cols_, const void *restrict x_, size_t es,
                   const kdrt_window *w) {
  char *restrict cols = cols_;
  const char *restrict x = x_;
  const int H = w->H, W = w->W, C = w->C, KH = w->KH, KW = w->KW, G = kdrt_groups(w);
  const int cg = C / G;
  const size_t kwc = (size_t)KW * cg, rowlen = (size_t)KH * kwc;
  const size_t M = (size_t)w->B * w->OH * w->OW;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < w->B; b++)
    for (int oh = 0; oh < w->OH; oh++)
      for (int ow = 0; ow < w->OW; ow++) {
        const size_t m = ((size_t)b * w->OH + oh) * w->OW + ow;
        int iw0, lo, hi;
        kdrt_win_range(ow, w->sw, w->pad_l, KW, W, &iw0, &lo, &hi);
        for (int j = 0; j < G; j++)
          for (int kh = 0; kh < KH; kh++) {
            char *d = cols + ((j * M + m) * rowlen + kh * kwc) * es;
            int ih = dilated_row(oh, kh, w);
            if (ih < 0 || (!w->dil_w && hi == lo)) {
              memset(d, 0, kwc * es);
              continue;
            }
            const char *row = x + (((size_t)b * H + ih) * W * C + (size_t)j * cg) * es;
            if (w->dil_w || G > 1) {
              for (int kw = 0; kw < KW; kw++) {
                int iw = dilated_col(ow, kw, w);
                if (iw < 0) memset(d + (size_t)kw * cg * es, 0, (size_t)cg * es);
                else memcpy(d + (size_t)kw * cg * es, row + (size_t)iw * C * es, (size_t)cg * es);
              }
              continue;
            }
            const char *src = row + (size_t)(iw0 + lo) * C * es;
            memset(d, 0, (size_t)lo * C * es);
            memcpy(d + (size_t)lo * C * es, src, (size_t)(hi - lo) * C * es);
            memset(d + (size_t)hi * C * es, 0, (size_t)(KW - hi) * C * es);
          }
      }
}

// The transpose of im2col for the rows [m0, m1) of the columns (cols holds
// those, group by group): dx += each column entry at the input position it
// was copied from, an image zeroed first where its first row is in range;
// padding entries are dropped. Images run in parallel, each in the one
// thread's order (its windows overlap), so that rows given a chunk at a
// time in order (conv2d16's input gradient) add up as all at once.
static void col2im(float *restrict dx, const float *restrict cols, const kdrt_window *w,
                   size_t m0, size_t m1) {
  const int H = w->H, W = w->W, C = w->C, KH = w->KH, KW = w->KW, G = kdrt_groups(w);
  const int cg = C / G;
  const size_t kwc = (size_t)KW * cg, rowlen = (size_t)KH * kwc;
  const size_t M = m1 - m0, px = (size_t)w->OH * w->OW;
  const int b0 = px ? (int)(m0 / px) : 0, b1 = px ? (int)((m1 + px - 1) / px) : w->B;
#pragma omp parallel for schedule(static)
  for (int b = b0; b < b1; b++) {
    if (m0 <= (size_t)b * px)
      memset(dx + (size_t)b * H * W * C, 0, (size_t)H * W * C * sizeof *dx);
    for (int oh = 0; oh < w->OH; oh++)
      for (int ow = 0; ow < w->OW; ow++) {
        const size_t m = ((size_t)b * w->OH + oh) * w->OW + ow;
        if (m < m0 || m >= m1)
          continue;
        int iw0, lo, hi;
        kdrt_win_range(ow, w->sw, w->pad_l, KW, W, &iw0, &lo, &hi);
        for (int j = 0; j < G; j++)
          for (int kh = 0; kh < KH; kh++) {
            int ih = dilated_row(oh, kh, w);
            if (ih < 0 || (!w->dil_w && hi == lo))
              continue;
            const float *src = cols + (j * M + m - m0) * rowlen + kh * kwc;
            float *row = dx + ((size_t)b * H + ih) * W * C + (size_t)j * cg;
            if (w->dil_w || G > 1) {
              for (int kw = 0; kw < KW; kw++) {
                int iw = dilated_col(ow, kw, w);
                if (iw < 0) continue;
                const float *s = src + (size_t)kw * cg;
                float *d = row + (size_t)iw * C;
                for (int c = 0; c < cg; c++)
                  d[c] += s[c];
              }
              continue;
            }
            const float *s = src + (size_t)lo * C;
            float *d = row + (size_t)(iw0 + lo) * C;
            const size_t n = (size_t)(hi - lo) * C;
            for (size_t i = 0; i < n; i++)
              d[i] += s[i];
          }
      }
  }
}

// The im2col matrix of x: x itself for a pointwise convolution, else built
// in scratch.
static const float *conv_cols(const float *x, const kdrt_window *w, float *scratch) {
  if (kdrt_conv_pointwise(w))
    return x;
  im2col(scratch, x, sizeof *x, w);
  return scratch;
}

// A depthwise conv (one input channel a group, G = C > 1, kg = K / C output
// channels each) runs as direct loops over the channels, contiguous in x,
// f [KH, KW, 1, K] and y: as G products of one column each, the im2col
// path would copy single floats and run G skinny GEMMs (15x slower on
// MobileNet's [128, 28, 28, 64]).
static int conv_is_depthwise(const kdrt_window *w) { return w->groups > 1 && w->groups == w->C; }

static void depthwise(const kdrt_window *w, float *y, const float *x, const float *f) {
  const int C = w->C, K = w->K, kg = K / C;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < w->B; b++)
    for (int oh = 0; oh < w->OH; oh++)
      for (int ow = 0; ow < w->OW; ow++) {
        float *yr = y + (((size_t)b * w->OH + oh) * w->OW + ow) * K;
        memset(yr, 0, (size_t)K * sizeof *yr);
        for (int kh = 0, ih; kh < w->KH; kh++)
          for (int kw = 0, iw; kw < w->KW; kw++) {
            if ((ih = dilated_row(oh, kh, w)) < 0 || (iw = dilated_col(ow, kw, w)) < 0) continue;
            const float *xr = x + (((size_t)b * w->H + ih) * w->W + iw) * C;
            const float *fr = f + ((size_t)kh * w->KW + kw) * K;
            if (kg == 1) // the usual: a vector loop
              for (int c = 0; c < C; c++)
                yr[c] += xr[c] * fr[c];
            else
              for (int c = 0; c < C; c++)
                for (int m = 0; m < kg; m++)
                  yr[c * kg + m] += xr[c] * fr[c * kg + m];
          }
      }
}

// Its input gradient: images in parallel, each added up in one order.
static void depthwise_dx(const kdrt_window *w, float *dx, const float *dy, const float *f) {
  const int C = w->C, K = w->K, kg = K / C;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < w->B; b++) {
    memset(dx + (size_t)b * w->H * w->W * C, 0, (size_t)w->H * w->W * C * sizeof *dx);
    for (int oh = 0; oh < w->OH; oh++)
      for (int ow = 0; ow < w->OW; ow++) {
        const float *dyr = dy + (((size_t)b * w->OH + oh) * w->OW + ow) * K;
        for (int kh = 0, ih; kh < w->KH; kh++)
          for (int kw = 0, iw; kw < w->KW; kw++) {
            if ((ih = dilated_row(oh, kh, w)) < 0 || (iw = dilated_col(ow, kw, w)) < 0) continue;
            float *dxr = dx + (((size_t)b * w->H + ih) * w->W + iw) * C;
            const float *fr = f + ((size_t)kh * w->KW + kw) * K;
            if (kg == 1)
              for (int c = 0; c < C; c++)
                dxr[c] += dyr[c] * fr[c];
            else
              for (int c = 0; c < C; c++)
                for (int m = 0; m < kg; m++)
                  dxr[c] += dyr[c * kg + m] * fr[c * kg + m];
          }
      }
  }
}

// Its filter gradient, a sum over the batch and pixels: blocks of 16 output
// channels in parallel, each summed in double in one order, so that the
// result does not depend on the thread count.
static void depthwise_dw(const kdrt_window *w, float *dw, const float *x, const float *dy) {
  enum { KB = 16 };
  const int C = w->C, K = w->K, kg = K / C, nkw = w->KH * w->KW;
#pragma omp parallel for schedule(static)
  for (int k0 = 0; k0 < K; k0 += KB) {
    const int nk = K - k0 < KB ? K - k0 : KB;
    double *acc = calloc((size_t)nkw * KB, sizeof *acc);
    if (!acc) bad_call("kdrt_conv2d_dw", "out of memory");
    for (int b = 0; b < w->B; b++)
      for (int oh = 0; oh < w->OH; oh++)
        for (int ow = 0; ow < w->OW; ow++) {
          const float *dyr = dy + (((size_t)b * w->OH + oh) * w->OW + ow) * K + k0;
          for (int kh = 0, ih; kh < w->KH; kh++)
            for (int kw = 0, iw; kw < w->KW; kw++) {
              if ((ih = dilated_row(oh, kh, w)) < 0 || (iw = dilated_col(ow, kw, w)) < 0) continue;
              const float *xr = x + (((size_t)b * w->H + ih) * w->W + iw) * C;
              double *a = acc + ((size_t)kh * w->KW + kw) * KB;
              if (kg == 1)
                for (int k = 0; k < nk; k++)
                  a[k] += (double)xr[k0 + k] * dyr[k];
              else
                for (int k = 0; k < nk; k++)
                  a[k] += (double)xr[(k0 + k) / kg] * dyr[k];
            }
        }
    for (int i = 0; i < nkw; i++)
      for (int k = 0; k < nk; k++)
        dw[(size_t)i * K + k0 + k] = (float)acc[(size_t)i * KB + k];
    free(acc);
  }
}

// y [B, OH, OW, K] = conv(x [B, H, W, C], f [KH, KW, cg, K]), group by
// group; scratch holds B*OH*OW*KH*KW*C floats (unused for a pointwise conv).
void kdrt_conv2d(const kdrt_window *w, float *y, const float *x, const float *f, float *scratch) {
  if (kdrt_dnnl_conv(KDRT_DNNL_CONV, w, y, x, f))
    return;
  if (conv_is_depthwise(w)) {
    depthwise(w, y, x, f);
    return;
  }
  const kdrt_gemm g = kdrt_conv_gemm(w, KDRT_CONV_Y);
  kdrt_matmul(&g, 1.0f, conv_cols(x, w, scratch), f, 0.0f, y);
}

// dx (overwritten) from dy and f.
void kdrt_conv2d_dx(const kdrt_window *w, float *dx, const float *dy, const float *f,
                    float *scratch) {
  if (kdrt_dnnl_conv(KDRT_DNNL_CONV_DX, w, dx, dy, f))
    return;
  if (conv_is_depthwise(w)) {
    depthwise_dx(w, dx, dy, f);
    return;
  }
  // dx itself for a pointwise conv, else scratch scattered back
  float *dcols = kdrt_conv_pointwise(w) ? dx : scratch;
  const kdrt_gemm g = kdrt_conv_gemm(w, KDRT_CONV_DX);
  kdrt_matmul(&g, 1.0f, dy, f, 0.0f, dcols);
  if (!kdrt_conv_pointwise(w))
    col2im(dx, scratch, w, 0, (size_t)w->B * w->OH * w->OW);
}

// dw (overwritten) from x and dy.
void kdrt_conv2d_dw(const kdrt_window *w, float *dw, const float *x, const float *dy,
                    float *scratch) {
  if (kdrt_dnnl_conv(KDRT_DNNL_CONV_DW, w, dw, x, dy))
    return;
  if (conv_is_depthwise(w)) {
    depthwise_dw(w, dw, x, dy);
    return;
  }
  const kdrt_gemm g = kdrt_conv_gemm(w, KDRT_CONV_DW);
  kdrt_matmul(&g, 1.0f, conv_cols(x, w, scratch), dy, 0.0f, dw);
}

// issue 23: an operand of conv2d16 in its 16 bits: a itself (KDRT_OPND_16),
// or the 16 bits of its float32 values (_EXACT: exactly values of the
// type) written to `to`.
static const uint16_t *bits16(int kind, int form, const void *a, float *to, size_t n) {
  if (form == KDRT_OPND_16)
    return a;
  kdrt_pack16(kind, (uint16_t *)to, a, n);
  return (const uint16_t *)to;
}

// issue 23: a conv of 16-bit values (kdrt_ops.def's conv2d16). Y and DW copy
// x's 16 bits into 16-bit columns (copies: exact) and make matmul16's
// product (oneDNN's bf16 matmul, float32 sums); DX makes dy f^T a chunk of
// rows at a time into float32 columns and adds each chunk back into dx
// (col2im) as it comes, in the order of one whole pass. The filter, small,
// goes to matmul16 as it is held. A pointwise conv reads x (writes dx)
// itself.
void kdrt_conv2d16(const kdrt_window *w, int pass, int kind, int fa, const void *a, int fb,
                   const void *b, float *out, float *scratch, float *wide) {
  int64_t part[KDRT_C16_PARTS];
  kdrt_conv16_scratch(w, pass, fa, fb, part);
  const int pw = kdrt_conv_pointwise(w);
  const size_t px = (size_t)w->OH * w->OW, M = (size_t)w->B * px;
  const kdrt_gemm g = kdrt_conv_gemm(w, pass);
  if (pass == KDRT_CONV_DX) {
    const uint16_t *dy = bits16(kind, fa, a, scratch + part[KDRT_C16_DY], M * w->K);
    if (pw) {
      kdrt_matmul16(&g, kind, KDRT_OPND_16, dy, fb, b, out, wide);
      return;
    }
    float *dcols = scratch + part[KDRT_C16_DCOLS];
    kdrt_gemm gc;
    for (int64_t m0 = 0, m1; kdrt_conv16_chunk(w, m0, &m1, &gc); m0 = m1) {
      kdrt_matmul16(&gc, kind, KDRT_OPND_16, dy + m0 * w->K, fb, b, dcols, wide);
      col2im(out, dcols, w, (size_t)m0, (size_t)m1);
      if (m1 == m0)
        break;
    }
    return;
  }
  const uint16_t *x = bits16(kind, fa, a, scratch + part[KDRT_C16_X],
                             (size_t)w->B * w->H * w->W * w->C);
  const uint16_t *cols = x;
  if (!pw) {
    im2col(scratch + part[KDRT_C16_COLS], x, sizeof *x, w);
    cols = (const uint16_t *)(scratch + part[KDRT_C16_COLS]);
  }
  if (pass == KDRT_CONV_Y) {
    kdrt_matmul16(&g, kind, KDRT_OPND_16, cols, fb, b, out, wide);
    return;
  }
  const uint16_t *dy = bits16(kind, fb, b, scratch + part[KDRT_C16_DY], M * w->K);
  kdrt_matmul16(&g, kind, KDRT_OPND_16, cols, KDRT_OPND_16, dy, out, wide);
}

// ---------------------------------------------------------------- max pooling

// y [B, OH, OW, C] = the maximum of each KH x KW window of x [B, H, W, C].
// 2x2 windows of stride 2, unpadded, each within the input: they tile it.
static int tiles_2x2(const kdrt_window *w) {
  return w->KH == 2 && w->KW == 2 && w->sh == 2 && w->sw == 2 && !w->pad_t && !w->pad_l &&
         w->OH * 2 <= w->H && w->OW * 2 <= w->W;
}

// One 2x2 window's maximum over C channels, as the general loop takes it
// (a later pixel wins only when greater). Issue 15.
static void pool2x2(float *restrict y, const float *restrict x0, const float *restrict x1,
                    const float *restrict x2, const float *restrict x3, int C) {
  for (int c = 0; c < C; c++) {
    float a = x0[c], b = x1[c], e = x2[c], f = x3[c];
    float m1 = b > a ? b : a;
    float m2 = e > m1 ? e : m1;
    y[c] = f > m2 ? f : m2;
  }
}

void kdrt_maxpool(const kdrt_window *w, float *y, const float *x) {
  const int H = w->H, W = w->W, C = w->C, OH = w->OH, OW = w->OW;
  if (tiles_2x2(w)) { // windows that tile the input (Keras's default)
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)w->B * H * W * C >= KD_PAR_MIN)
    for (int b = 0; b < w->B; b++)
      for (int oh = 0; oh < OH; oh++) {
        const size_t r0 = ((size_t)b * H + 2 * oh) * W * C, r1 = r0 + (size_t)W * C;
        float *yr = y + ((size_t)b * OH + oh) * OW * C;
        for (int ow = 0; ow < OW; ow++) {
          const size_t o = (size_t)ow * 2 * C;
          pool2x2(yr + (size_t)ow * C, x + r0 + o, x + r0 + o + C, x + r1 + o, x + r1 + o + C, C);
        }
      }
    return;
  }
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)w->B * H * W * C >= KD_PAR_MIN)
  for (int b = 0; b < w->B; b++)
    for (int oh = 0; oh < OH; oh++) {
      int ih0, phl, phh;
      kdrt_win_range(oh, w->sh, w->pad_t, w->KH, H, &ih0, &phl, &phh);
      for (int ow = 0; ow < OW; ow++) {
        int iw0, pwl, pwh;
        kdrt_win_range(ow, w->sw, w->pad_l, w->KW, W, &iw0, &pwl, &pwh);
        float *restrict yr = y + (((size_t)b * OH + oh) * OW + ow) * C;
        if (phl == phh || pwl == pwh) { // a window wholly in the padding
          memset(yr, 0, (size_t)C * sizeof *yr);
          continue;
        }
        const float *first = x + (((size_t)b * H + ih0 + phl) * W + iw0 + pwl) * C;
        memcpy(yr, first, (size_t)C * sizeof *yr);
        for (int ph = phl; ph < phh; ph++)
          for (int pw = pwl; pw < pwh; pw++) {
            const float *restrict xr = x + (((size_t)b * H + ih0 + ph) * W + iw0 + pw) * C;
            for (int c = 0; c < C; c++)
              yr[c] = xr[c] > yr[c] ? xr[c] : yr[c];
          }
      }
    }
}

// Channels are handled in chunks of this many, so that the running maximum
// and its position fit in fixed arrays on the stack.
#define KD_POOL_CHUNK 256

// dx (overwritten): dy routed to the first maximum of each window
// (recomputed from x), in row-major window order. Images run in parallel
// (the windows of one image may overlap; two images never do).
// 2x2 windows that tile the input (stride 2, no padding, every window
// within it: Keras's default pooling): each input pixel is in one window at
// most, so dx is written once, without a scatter. Per channel, the first
// maximum's position in row-major order is kept in registers (the general
// path's rule: a later pixel wins only when strictly greater) and each of
// the four pixels takes dy or 0; the rows and columns no window covers are
// zeroed. Issue 15.
// One 2x2 window's gradient over C channels (restrict parameters and every
// load first, pos a float: GCC vectorises this form).
static void pool2x2_grad(float *restrict d0, float *restrict d1, float *restrict d2,
                         float *restrict d3, const float *restrict x0,
                         const float *restrict x1, const float *restrict x2,
                         const float *restrict x3, const float *restrict g, int C) {
  for (int c = 0; c < C; c++) {
    float a = x0[c], b = x1[c], e = x2[c], f = x3[c], gc = g[c];
    float m1 = b > a ? b : a, pos = b > a ? 1.0f : 0.0f;
    float m2 = e > m1 ? e : m1;
    pos = e > m1 ? 2.0f : pos;
    pos = f > m2 ? 3.0f : pos;
    d0[c] = pos == 0.0f ? gc : 0.0f;
    d1[c] = pos == 1.0f ? gc : 0.0f;
    d2[c] = pos == 2.0f ? gc : 0.0f;
    d3[c] = pos == 3.0f ? gc : 0.0f;
  }
}

static void maxpool_grad_2x2(const kdrt_window *w, float *dx, const float *dy, const float *x) {
  const int H = w->H, W = w->W, C = w->C, OH = w->OH, OW = w->OW;
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)w->B * H * W * C >= KD_PAR_MIN)
  for (int b = 0; b < w->B; b++)
    for (int oh = 0; oh < OH; oh++) {
      const size_t r0 = ((size_t)b * H + 2 * oh) * W * C, r1 = r0 + (size_t)W * C;
      const float *dyr = dy + ((size_t)b * OH + oh) * OW * C;
      for (int ow = 0; ow < OW; ow++) {
        const size_t o = (size_t)ow * 2 * C;
        pool2x2_grad(dx + r0 + o, dx + r0 + o + C, dx + r1 + o, dx + r1 + o + C, x + r0 + o,
                     x + r0 + o + C, x + r1 + o, x + r1 + o + C, dyr + (size_t)ow * C, C);
      }
      if (OW * 2 < W) { // the column no window covers
        memset(dx + r0 + (size_t)OW * 2 * C, 0, (size_t)C * sizeof *dx);
        memset(dx + r1 + (size_t)OW * 2 * C, 0, (size_t)C * sizeof *dx);
      }
      if (oh == OH - 1 && OH * 2 < H) // the row no window covers
        memset(dx + r1 + (size_t)W * C, 0, (size_t)W * C * sizeof *dx);
    }
}

void kdrt_maxpool_grad(const kdrt_window *w, float *dx, const float *dy, const float *x) {
  const int H = w->H, W = w->W, C = w->C, OH = w->OH, OW = w->OW;
  if (tiles_2x2(w)) {
    maxpool_grad_2x2(w, dx, dy, x);
    return;
  }
#pragma omp parallel for schedule(static) if ((int64_t)w->B * H * W * C >= KD_PAR_MIN)
  for (int b = 0; b < w->B; b++) {
    float best[KD_POOL_CHUNK];
    int pos[KD_POOL_CHUNK]; // input pixel (ih * W + iw) of the first maximum
    const float *xb = x + (size_t)b * H * W * C;
    float *dxb = dx + (size_t)b * H * W * C;
    memset(dxb, 0, (size_t)H * W * C * sizeof *dxb);
    for (int oh = 0; oh < OH; oh++) {
      int ih0, phl, phh;
      kdrt_win_range(oh, w->sh, w->pad_t, w->KH, H, &ih0, &phl, &phh);
      for (int ow = 0; ow < OW; ow++) {
        int iw0, pwl, pwh;
        kdrt_win_range(ow, w->sw, w->pad_l, w->KW, W, &iw0, &pwl, &pwh);
        if (phl == phh || pwl == pwh)
          continue;
        const float *dyr = dy + (((size_t)b * OH + oh) * OW + ow) * C;
        const int p0 = (ih0 + phl) * W + iw0 + pwl;
        for (int c0 = 0; c0 < C; c0 += KD_POOL_CHUNK) {
          const int nc = C - c0 < KD_POOL_CHUNK ? C - c0 : KD_POOL_CHUNK;
          const float *first = xb + (size_t)p0 * C + c0;
          for (int c = 0; c < nc; c++) {
            best[c] = first[c];
            pos[c] = p0;
          }
          for (int ph = phl; ph < phh; ph++)
            for (int pw = pwl; pw < pwh; pw++) {
              const int p = (ih0 + ph) * W + iw0 + pw;
              const float *xr = xb + (size_t)p * C + c0;
              for (int c = 0; c < nc; c++) {
                int better = xr[c] > best[c]; // strict: the first maximum wins
                best[c] = better ? xr[c] : best[c];
                pos[c] = better ? p : pos[c];
              }
            }
          for (int c = 0; c < nc; c++)
            dxb[(size_t)pos[c] * C + c0 + c] += dyr[c0 + c];
        }
      }
    }
  }
}

// ---------------------------------------------------------------- blocks

// out[o, i, r] = in[o, off + i, r] for i < out_ext: a block along one dim
// (outer: the product of the dims before it, inner: after).
void kdrt_copy_block(float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,
                     int64_t out_ext, int64_t inner) {
  const size_t n = (size_t)(out_ext * inner);
  KD_PAR_FOR(outer * (int64_t)n)
  for (int64_t o = 0; o < outer; o++)
    memcpy(out + o * out_ext * inner, in + (o * in_ext + off) * inner, n * sizeof *out);
}

// out[o, off + i, r] = in[o, i, r] for i < in_ext: the reverse; the rest
// of out is left as it was.
void kdrt_place_block(float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,
                      int64_t out_ext, int64_t inner) {
  const size_t n = (size_t)(in_ext * inner);
  KD_PAR_FOR(outer * (int64_t)n)
  for (int64_t o = 0; o < outer; o++)
    memcpy(out + (o * out_ext + off) * inner, in + o * in_ext * inner, n * sizeof *out);
}

// ---------------------------------------------------------------- layout changes

// out = in with its dims permuted: out's dim i is in's dim perm[i], in has
// shape[rank]. Walks out in row-major order with an odometer over its
// index, the input offset following by the permuted strides; the last out
// dim is the inner loop.
void kdrt_transpose(float *out, const float *in, int rank, const int64_t *shape,
                    const int *perm) {
  if (rank < 1 || rank > KDRT_MAX_RANK)
    bad_call("kdrt_transpose", "rank out of range");
  int64_t istride[KDRT_MAX_RANK], oshape[KDRT_MAX_RANK], ostride[KDRT_MAX_RANK];
  int64_t total = 1;
  for (int d = rank - 1; d >= 0; d--) {
    istride[d] = total;
    total *= shape[d];
  }
  for (int i = 0; i < rank; i++) {
    if (perm[i] < 0 || perm[i] >= rank)
      bad_call("kdrt_transpose", "perm names a dim out of range");
    oshape[i] = shape[perm[i]];
    ostride[i] = istride[perm[i]]; // in's stride of out's dim i
  }
  if (total == 0)
    return;
  const int last = rank - 1;
  const int64_t n = oshape[last], step = ostride[last], nrows = total / n;
  // Threads take contiguous ranges of out's rows, each starting its odometer
  // at its first row.
#pragma omp parallel if (total >= KD_PAR_MIN)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t r0 = nrows * t / nt, r1 = nrows * (t + 1) / nt;
    int64_t idx[KDRT_MAX_RANK] = {0}, rest = r0;
    for (int i = last - 1; i >= 0; i--) { // row r0's place over dims 0..last-1
      idx[i] = rest % oshape[i];
      rest /= oshape[i];
    }
    for (int64_t o = r0 * n; o < r1 * n; o += n) {
      int64_t src = 0;
      for (int i = 0; i < last; i++)
        src += idx[i] * ostride[i];
      for (int64_t j = 0; j < n; j++)
        out[o + j] = in[src + j * step];
      for (int i = last - 1; i >= 0; i--) { // advance the odometer over dims 0..last-1
        if (++idx[i] < oshape[i])
          break;
        idx[i] = 0;
      }
    }
  }
}

// out[o, i] = sum over m of in[o, m, i], adding m in order, in float.
// Threads take (o, block of 1024 i) pairs, each summed over m in order.
void kdrt_reduce_sum(float *out, const float *in, int64_t outer, int64_t mid, int64_t inner) {
  const int64_t IB = 1024, nib = (inner + IB - 1) / IB;
  KD_PAR_FOR(outer * mid * inner)
  for (int64_t t = 0; t < outer * nib; t++) {
    const int64_t o = t / nib, i0 = t % nib * IB, n = inner - i0 < IB ? inner - i0 : IB;
    float *orow = out + o * inner + i0;
    memset(orow, 0, (size_t)n * sizeof *orow);
    for (int64_t m = 0; m < mid; m++) {
      const float *ir = in + (o * mid + m) * inner + i0;
      for (int64_t i = 0; i < n; i++)
        orow[i] += ir[i];
    }
  }
}

// out[o, m, i] = in[o, i]: the transpose of reduce_sum.
void kdrt_broadcast(float *out, const float *in, int64_t outer, int64_t mid, int64_t inner) {
  KD_PAR_FOR(outer * mid * inner)
  for (int64_t o = 0; o < outer; o++)
    for (int64_t m = 0; m < mid; m++)
      memcpy(out + (o * mid + m) * inner, in + o * inner, (size_t)inner * sizeof *out);
}

// ---------------------------------------------------------------- embeddings

// out[i, :] = table[ids[i] - row0, :] for the n ids this block of the
// table (rows [row0, row0 + rows), cols wide) holds, zeros for the others:
// summed over the ranks that split the vocabulary, every row is found once.
void kdrt_gather(float *out, const float *table, const int32_t *ids, int64_t n, int64_t rows,
                 int64_t cols, int64_t row0) {
  KD_PAR_FOR(n * cols)
  for (int64_t i = 0; i < n; i++) {
    int64_t r = (int64_t)ids[i] - row0;
    float *orow = out + i * cols;
    if (r >= 0 && r < rows)
      memcpy(orow, table + r * cols, (size_t)cols * sizeof *orow);
    else
      memset(orow, 0, (size_t)cols * sizeof *orow);
  }
}

void kdrt_gather16(int kind, float *out, const uint16_t *table, const int32_t *ids, int64_t n,
                   int64_t rows, int64_t cols, int64_t row0) {
  KD_PAR_FOR(n * cols)
  for (int64_t i = 0; i < n; i++) {
    int64_t r = (int64_t)ids[i] - row0;
    float *orow = out + i * cols;
    if (r >= 0 && r < rows) kdrt_unpack16(kind, orow, table + r * cols, (size_t)cols);
    else memset(orow, 0, (size_t)cols * sizeof *orow);
  }
}

// dtable = 0, then dtable[ids[i] - row0, :] += dy[i, :] for i = 0, 1, ...
// in order (deterministic), skipping ids this block does not hold. Threads
// split the columns; each walks every i in order.
void kdrt_scatter_add(float *dtable, const float *dy, const int32_t *ids, int64_t n,
                      int64_t rows, int64_t cols, int64_t row0) {
  const int64_t CB = 64, ncb = (cols + CB - 1) / CB;
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++)
    memset(dtable + r * cols, 0, (size_t)cols * sizeof *dtable);
  KD_PAR_FOR(n * cols)
  for (int64_t jb = 0; jb < ncb; jb++) {
    const int64_t j0 = jb * CB, j1 = j0 + CB < cols ? j0 + CB : cols;
    for (int64_t i = 0; i < n; i++) {
      int64_t r = (int64_t)ids[i] - row0;
      if (r < 0 || r >= rows)
        continue;
      float *trow = dtable + r * cols;
      const float *g = dy + i * cols;
      for (int64_t j = j0; j < j1; j++)
        trow[j] += g[j];
    }
  }
}

// ---------------------------------------------------------------- masks, rotary embedding, padding

void kdrt_causal_mask(float *y, const float *x, int64_t outer, int64_t t, int64_t u, int64_t t0,
                      int64_t u0, int64_t window, float fill) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < t; i++)
      for (int64_t j = 0; j < u; j++) {
        int64_t k = (o * t + i) * u + j;
        y[k] = kdrt_key_masked(t0 + i, u0 + j, window) ? fill : x[k];
      }
}

void kdrt_attention_mask(float *y, const float *x, const void *m, int m_int, int64_t outer,
                         int64_t heads, int64_t inner, int64_t m_inner, float fill) {
  const int32_t *mi = m;
  const float *mf = m;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t h = 0; h < heads; h++)
      for (int64_t j = 0; j < inner; j++) {
        int64_t k = (o * heads + h) * inner + j, q = o * m_inner + j % m_inner;
        y[k] = (m_int ? mi[q] != 0 : mf[q] != 0.0f) ? x[k] : fill;
      }
}

// issue 24: rotary position embedding (kdrt_rope.h). The cosines and sines
// of the block's t steps are taken once ([t, h] each), then every row of
// every batch row and head turns by them.
void kdrt_rope(float *y, const float *x, const kdrt_rotary *r, int64_t outer, int64_t t,
               int64_t inner, int64_t t0, int inverse) {
  const int64_t h = r->half, w = 2 * h;
  if (outer <= 0 || t <= 0 || inner <= 0 || h <= 0)
    return;
  float *cs = malloc((size_t)(2 * t * h) * sizeof *cs), *sn = cs + t * h;
  if (!cs)
    bad_call("kdrt_rope", "out of memory");
  KD_PAR_FOR(t * h * 16)
  for (int64_t i = 0; i < t; i++)
    for (int64_t j = 0; j < h; j++)
      kdrt_rope_cs(r, t0 + i, j, &cs[i * h + j], &sn[i * h + j]);
  KD_PAR_FOR(outer * t * inner * w)
  for (int64_t bt = 0; bt < outer * t; bt++) {
    const float *c = cs + bt % t * h, *s = sn + bt % t * h;
    for (int64_t k = 0; k < inner; k++) {
      const float *xr = x + (bt * inner + k) * w;
      float *yr = y + (bt * inner + k) * w;
      for (int64_t j = 0; j < h; j++)
        kdrt_rope_pair(xr[j], xr[j + h], c[j], s[j], inverse, &yr[j], &yr[j + h]);
    }
  }
  free(cs);
}

void kdrt_pad_block(float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,
                    int64_t out_ext, int64_t inner) {
  memset(out, 0, (size_t)(outer * out_ext * inner) * sizeof *out);
  kdrt_place_block(out, in, outer, in_ext, off, out_ext, inner);
}
