// Tests for runtime/ops.c: the kernels a generated train_step calls.
//
// Gradients are checked against central finite differences of the forward
// kernel (float32, step 1e-2) on small random inputs, through the scalar
// L = sum(w * out) with random weights w, so dy = w. Convolution and
// pooling are also checked against naive direct loops in double; losses,
// accuracy and optimizers against values worked out by hand from Keras 3's
// formulas (the arithmetic is written out beside each expected value).
// matmul, transpose and the reductions are checked against naive loops;
// the split crossentropy against the unsplit loss, gradient and accuracy,
// with the classes cut into 1, 2 and 4 blocks as ranks would hold them.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"
#include "kdrt_round.h" // issue 23: kdrt_round_to
#include "vmath.h"

// ---------------------------------------------------------------- helpers

// issue 23: the largest block malloc gave while `watching` is set: this
// malloc replaces the C library's in the whole test program (every caller,
// the kernels' and the libraries' under them), and hands on to it.
extern void *__libc_malloc(size_t n);
static size_t largest;
static int watching;
void *malloc(size_t n) {
  if (__atomic_load_n(&watching, __ATOMIC_RELAXED)) {
    size_t m = __atomic_load_n(&largest, __ATOMIC_RELAXED);
    while (n > m && !__atomic_compare_exchange_n(&largest, &m, n, 1, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {}
  }
  return __libc_malloc(n);
}
static void watch_malloc(int on) {
  if (on) __atomic_store_n(&largest, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&watching, on, __ATOMIC_RELAXED);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float frand(float lo, float hi) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

static float *rand_buf(size_t n, float lo, float hi) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++)
    p[i] = frand(lo, hi);
  return p;
}

static double dot(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++)
    s += (double)a[i] * b[i];
  return s;
}

// Max over i of |analytic - numeric| / max(1, |numeric|), the numeric
// derivative of f with respect to param[i] by central differences.
typedef double (*scalar_fn)(void *ctx);
#define FD_STEP 1e-2f
#define FD_TOL 2e-2

static double fd_error(float *param, size_t n, const float *analytic, scalar_fn f, void *ctx) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    float v = param[i];
    param[i] = v + FD_STEP;
    double fp = f(ctx);
    param[i] = v - FD_STEP;
    double fm = f(ctx);
    param[i] = v;
    double num = (fp - fm) / (2.0 * FD_STEP);
    double err = fabs(analytic[i] - num) / fmax(1.0, fabs(num));
    if (err > worst)
      worst = err;
  }
  return worst;
}

static double max_abs_diff(const float *a, const double *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++)
    m = fmax(m, fabs(a[i] - b[i]));
  return m;
}

// The losses' parameter (huber's delta, Keras's default) and the hinge
// losses' flag (the labels are 0/1: Keras maps them to -1/1).
static const float DELTA = 1.0f, ZERO_FLAG = 0.0f;

// kdrt_loss and kdrt_accuracy write their value to out[0]; these return it.
static double loss_of(int kind, int logits, const float *pred, const float *y, int64_t rows,
                      int64_t cols, double scale) {
  float out = NAN;
  kdrt_loss(kind, logits, DELTA, &out, pred, y, &ZERO_FLAG, rows, cols, scale);
  return out;
}
static void grad_of(int kind, int logits, float *d, const float *pred, const float *y,
                    int64_t rows, int64_t cols, double scale) {
  kdrt_loss_grad(kind, logits, DELTA, d, pred, y, &ZERO_FLAG, rows, cols, scale);
}
static double accuracy_of(int kind, int logits, const float *pred, const float *y, int64_t rows,
                          int64_t cols, double scale) {
  float out = NAN;
  kdrt_accuracy(kind, logits, &out, pred, y, rows, cols, scale);
  return out;
}

// ---------------------------------------------------------------- activations

typedef struct {
  int act;
  float *x, *y, *w;
  size_t n;
} act_ctx;

static double act_scalar(void *p) {
  act_ctx *c = p;
  kdrt_act(c->act, c->y, c->x, c->n);
  return dot(c->w, c->y, c->n);
}

Test(act, gradients_match_finite_differences) {
  const size_t n = 64;
  static const char *names[] = {"linear", "relu", "sigmoid", "tanh", "gelu", "silu"};
  for (int act = KDRT_ACT_LINEAR; act <= KDRT_ACT_SILU; act++) {
    act_ctx c = {act, rand_buf(n, -3, 3), calloc(n, sizeof(float)), rand_buf(n, -1, 1), n};
    for (size_t i = 0; i < n; i++) // keep relu's kink out of the FD step
      if (fabsf(c.x[i]) < 0.05f)
        c.x[i] = 0.5f;
    float *dx = calloc(n, sizeof *dx);
    kdrt_act(act, c.y, c.x, n);
    kdrt_act_grad(act, dx, c.w, c.x, c.y, n);
    double err = fd_error(c.x, n, dx, act_scalar, &c);
    cr_expect(err < FD_TOL, "%s: gradient error %g", names[act], err);
    free(c.x), free(c.y), free(c.w), free(dx);
  }
}

Test(act, known_values) {
  // relu, sigmoid, tanh, gelu (exact erf form), silu at -1, 0, 1, and the
  // stable sigmoid at +-100.
  const float x[] = {-1, 0, 1, 100, -100};
  float y[5];
  kdrt_act(KDRT_ACT_RELU, y, x, 3);
  cr_expect(y[0] == 0 && y[1] == 0 && y[2] == 1);
  kdrt_act(KDRT_ACT_SIGMOID, y, x, 5);
  cr_expect_float_eq(y[0], 0.26894142f, 1e-6);
  cr_expect_float_eq(y[1], 0.5f, 1e-7);
  cr_expect_float_eq(y[3], 1.0f, 1e-7);
  cr_expect(y[4] >= 0 && y[4] < 1e-40f, "sigmoid(-100) = %g", y[4]);
  kdrt_act(KDRT_ACT_TANH, y, x, 3);
  cr_expect_float_eq(y[2], 0.76159416f, 1e-6);
  kdrt_act(KDRT_ACT_GELU, y, x, 3);
  // gelu(x) = x * Phi(x); Phi(1) = 0.84134475, Phi(-1) = 0.15865525
  cr_expect_float_eq(y[0], -0.15865525f, 1e-6);
  cr_expect_float_eq(y[2], 0.84134475f, 1e-6);
  kdrt_act(KDRT_ACT_SILU, y, x, 5);
  cr_expect_float_eq(y[2], 0.73105858f, 1e-6); // 1 * sigmoid(1)
  cr_expect_float_eq(y[3], 100.0f, 1e-4);
  cr_expect(fabsf(y[4]) < 1e-30f && !isnan(y[4]));
}

Test(act, in_place) {
  float x[4] = {-2, -0.5f, 0.5f, 2}, dy[4] = {1, 1, 1, 1};
  kdrt_act(KDRT_ACT_TANH, x, x, 4);
  cr_expect_float_eq(x[3], 0.96402758f, 1e-6);
  kdrt_act_grad(KDRT_ACT_TANH, dy, dy, NULL, x, 4);
  cr_expect_float_eq(dy[3], 1.0f - 0.96402758f * 0.96402758f, 1e-6);
}

// The vectorised math (runtime/vmath.h) within 4 ulp of the double
// functions (libmvec's documented bound) over each one's working range,
// through a loop that vectorises as the kernels' do.
Test(act, vector_math_within_4_ulp) {
  enum { N = 100003 };
  static float x[N], y[N];
  static const struct {
    const char *name;
    double (*ref)(double);
    float lo, hi;
  } fns[] = {{"exp", exp, -87, 88},   {"expm1", expm1, -20, 20}, {"log1p", log1p, -0.99f, 1e6f},
             {"erf", erf, -5, 5},     {"tanh", tanh, -10, 10},   {"cosh", cosh, -88, 88}};
  for (size_t f = 0; f < sizeof fns / sizeof *fns; f++) {
    for (int i = 0; i < N; i++)
      x[i] = fns[f].lo + (fns[f].hi - fns[f].lo) * (float)i / (N - 1);
    switch (f) {
    case 0: for (int i = 0; i < N; i++) y[i] = kdrt_expf(x[i]); break;
    case 1: for (int i = 0; i < N; i++) y[i] = kdrt_expm1f(x[i]); break;
    case 2: for (int i = 0; i < N; i++) y[i] = kdrt_log1pf(x[i]); break;
    case 3: for (int i = 0; i < N; i++) y[i] = kdrt_erff(x[i]); break;
    case 4: for (int i = 0; i < N; i++) y[i] = kdrt_tanhf(x[i]); break;
    default: for (int i = 0; i < N; i++) y[i] = kdrt_coshf(x[i]); break;
    }
    double worst = 0;
    for (int i = 0; i < N; i++) {
      double ref = fns[f].ref((double)x[i]);
      float r = (float)ref;
      double ulp = nextafterf(fabsf(r), INFINITY) - fabsf(r);
      if (ulp > 0 && isfinite(r))
        worst = fmax(worst, fabs(y[i] - ref) / ulp);
    }
    cr_expect(worst <= 4, "%s: %.2f ulp", fns[f].name, worst);
  }
}

// ---------------------------------------------------------------- softmax

typedef struct {
  float *x, *y, *w;
  int64_t rows, cols;
  void (*fn)(float *y, const float *x, int64_t rows, int64_t cols); // softmax, log_softmax
} sm_ctx;

static double sm_scalar(void *p) {
  sm_ctx *c = p;
  c->fn(c->y, c->x, c->rows, c->cols);
  return dot(c->w, c->y, (size_t)(c->rows * c->cols));
}

Test(softmax, rows_sum_to_one_and_gradient) {
  const int64_t rows = 5, cols = 7;
  const size_t n = rows * cols;
  sm_ctx c = {rand_buf(n, -3, 3), calloc(n, sizeof(float)), rand_buf(n, -1, 1), rows, cols,
              kdrt_softmax};
  kdrt_softmax(c.y, c.x, rows, cols);
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t j = 0; j < cols; j++) {
      cr_expect(c.y[r * cols + j] > 0);
      s += c.y[r * cols + j];
    }
    cr_expect(fabs(s - 1) < 1e-6, "row %ld sums to %.9f", (long)r, s);
  }
  float *dx = calloc(n, sizeof *dx);
  kdrt_softmax_grad(dx, c.w, c.y, rows, cols);
  double err = fd_error(c.x, n, dx, sm_scalar, &c);
  cr_expect(err < FD_TOL, "softmax gradient error %g", err);
  free(c.x), free(c.y), free(c.w), free(dx);
}

// issue 25: log_softmax is log(softmax) (exp of each row sums to one, and
// each element is the log of softmax's), and its gradient the finite
// differences'.
Test(softmax, log_softmax_and_gradient) {
  const int64_t rows = 5, cols = 7;
  const size_t n = rows * cols;
  sm_ctx c = {rand_buf(n, -3, 3), calloc(n, sizeof(float)), rand_buf(n, -1, 1), rows, cols,
              kdrt_log_softmax};
  float *p = calloc(n, sizeof *p);
  kdrt_softmax(p, c.x, rows, cols);
  kdrt_log_softmax(c.y, c.x, rows, cols);
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t j = 0; j < cols; j++) {
      cr_expect(c.y[r * cols + j] < 0);
      cr_expect(fabs(c.y[r * cols + j] - log(p[r * cols + j])) < 1e-6, "[%ld, %ld]: %.9g, log "
                "softmax %.9g", (long)r, (long)j, c.y[r * cols + j], log(p[r * cols + j]));
      s += exp(c.y[r * cols + j]);
    }
    cr_expect(fabs(s - 1) < 1e-6, "row %ld's exps sum to %.9f", (long)r, s);
  }
  float *dx = calloc(n, sizeof *dx);
  kdrt_log_softmax_grad(dx, c.w, c.y, rows, cols);
  double err = fd_error(c.x, n, dx, sm_scalar, &c);
  cr_expect(err < FD_TOL, "log_softmax gradient error %g", err);
  free(c.x), free(c.y), free(c.w), free(dx), free(p);
}

// issue 25: glu is each row's first half times the sigmoid of its second
// (against double precision), and its gradient the finite differences'
// (sm_ctx's x is [rows, 2 * cols] here, y and w [rows, cols]).
Test(softmax, glu_and_gradient) {
  const int64_t rows = 5, cols = 7;
  const size_t n = rows * cols;
  sm_ctx c = {rand_buf(2 * n, -4, 4), calloc(n, sizeof(float)), rand_buf(n, -1, 1), rows, cols,
              kdrt_glu};
  kdrt_glu(c.y, c.x, rows, cols);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) {
      double a = c.x[r * 2 * cols + j], b = c.x[r * 2 * cols + cols + j];
      double want = a / (1 + exp(-b));
      cr_expect(fabs(c.y[r * cols + j] - want) <= 1e-6 * (fabs(want) + 1e-3),
                "[%ld, %ld]: %.9g, want %.9g", (long)r, (long)j, c.y[r * cols + j], want);
    }
  float *dx = calloc(2 * n, sizeof *dx);
  kdrt_glu_grad(dx, c.w, c.x, rows, cols);
  double err = fd_error(c.x, 2 * n, dx, sm_scalar, &c);
  cr_expect(err < FD_TOL, "glu gradient error %g", err);
  free(c.x), free(c.y), free(c.w), free(dx);
}

// attn_softmax and its gradient are scale, causal_mask and softmax (and
// back) folded into one pass: the same bits as the three kernels in turn,
// for a block of queries from position 0 and from 3, causal or not.
Test(softmax, attention_fused_equals_the_chain) {
  const int64_t outer = 3, t = 5, u = 9;
  const size_t n = outer * t * u;
  float *x = rand_buf(n, -4, 4), *dy = rand_buf(n, -1, 1), *s = calloc(n, sizeof(float));
  float *y0 = calloc(n, sizeof(float)), *y1 = calloc(n, sizeof(float));
  float *d0 = calloc(n, sizeof(float)), *d1 = calloc(n, sizeof(float));
  for (int k = 0; k < 4; k++) {
    int causal = k & 1;
    int64_t t0 = k >> 1 ? 3 : 0;
    kdrt_scale(s, x, n, 0.25f, 0.0f);
    if (causal) kdrt_causal_mask(s, s, outer, t, u, t0, 0, 0, KDRT_MASKED);
    kdrt_softmax(y0, s, outer * t, u);
    kdrt_attn_softmax(y1, x, outer, t, u, t0, 0.25f, causal);
    cr_expect(!memcmp(y0, y1, n * sizeof(float)), "attn_softmax t0 %ld causal %d differs",
              (long)t0, causal);
    kdrt_softmax_grad(s, dy, y0, outer * t, u);
    if (causal) kdrt_causal_mask(s, s, outer, t, u, t0, 0, 0, 0.0f);
    kdrt_scale(d0, s, n, 0.25f, 0.0f);
    kdrt_attn_softmax_grad(d1, dy, y0, outer, t, u, t0, 0.25f, causal);
    cr_expect(!memcmp(d0, d1, n * sizeof(float)), "attn_softmax_grad t0 %ld causal %d differs",
              (long)t0, causal);
    if (causal) // the first query of a block from 0 sees one key
      cr_expect(t0 > 0 || (y1[0] == 1.0f && y1[1] == 0.0f), "causal row 0: %g %g", y1[0], y1[1]);
  }
  free(x), free(dy), free(s), free(y0), free(y1), free(d0), free(d1);
}

// issue 22: attention in one op (the CUDA backend's fused kernels'
// reference) computes what the chain does: scores = q k^T (kdrt_matmul),
// attn_softmax, o = p v; backward dv = p^T do, dp = do v^T,
// attn_softmax_grad, dq = ds k, dk = ds^T q. Sums in another order: 1e-5.
static void heads_matmul(int ta, int tb, int64_t bn, int64_t M, int64_t N, int64_t K,
                         const float *a, const float *b, float *c) {
  const kdrt_gemm g = {ta, tb, bn, M, N, K, ta ? M : K, tb ? K : N, N, M * K, K * N, M * N};
  kdrt_matmul(&g, 1.0f, a, b, 0.0f, c);
}

static double max_rel(const float *a, const float *b, size_t n) {
  double m = 0, big = 1e-6;
  for (size_t i = 0; i < n; i++) big = fmax(big, fabs(b[i]));
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]) / big);
  return m;
}

Test(softmax, attention_op_equals_the_chain) {
  const int64_t bn = 3, t = 7, s = 7, hd = 5;
  const size_t nq = bn * t * hd, ns = bn * t * s;
  float *q = rand_buf(nq, -2, 2), *k = rand_buf(nq, -2, 2), *v = rand_buf(nq, -1, 1);
  float *dout = rand_buf(nq, -1, 1), *sc = calloc(ns, sizeof(float));
  float *p = calloc(ns, sizeof(float));
  float *dp = calloc(ns, sizeof(float)), *ds = calloc(ns, sizeof(float)), *lse = calloc(bn * t, 4);
  float *ref[4], *got[4]; // o, dq, dk, dv
  for (int i = 0; i < 4; i++)
    ref[i] = calloc(nq, sizeof(float)), got[i] = calloc(nq, sizeof(float));
  for (int causal = 0; causal < 2; causal++) {
    heads_matmul(KDRT_NOTRANS, KDRT_TRANS, bn, t, s, hd, q, k, sc);
    kdrt_attn_softmax(p, sc, bn, t, s, 0, 0.5f, causal);
    heads_matmul(KDRT_NOTRANS, KDRT_NOTRANS, bn, t, hd, s, p, v, ref[0]);
    heads_matmul(KDRT_TRANS, KDRT_NOTRANS, bn, s, hd, t, p, dout, ref[3]);
    heads_matmul(KDRT_NOTRANS, KDRT_TRANS, bn, t, s, hd, dout, v, dp);
    kdrt_attn_softmax_grad(ds, dp, p, bn, t, s, 0, 0.5f, causal);
    heads_matmul(KDRT_NOTRANS, KDRT_NOTRANS, bn, t, hd, s, ds, k, ref[1]);
    heads_matmul(KDRT_TRANS, KDRT_NOTRANS, bn, s, hd, t, ds, q, ref[2]);
    kdrt_attention(got[0], lse, q, k, v, bn, t, s, hd, 0.5f, causal);
    kdrt_attention_grad(got[1], got[2], got[3], dout, q, k, v, got[0], lse, bn, t, s, hd, 0.5f,
                        causal);
    static const char *const what[] = {"o", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
      double e = max_rel(got[i], ref[i], nq);
      cr_expect(e < 1e-5, "attention %s causal %d: error %g", what[i], causal, e);
    }
    // lse: log of the sum of exps of the scaled scores the row sees
    double m = -INFINITY, z = 0;
    for (int j = 0; j < (causal ? 1 : s); j++) m = fmax(m, 0.5 * sc[j]);
    for (int j = 0; j < (causal ? 1 : s); j++) z += exp(0.5 * sc[j] - m);
    cr_expect(fabs(lse[0] - (m + log(z))) < 1e-5, "lse[0] %g, want %g", lse[0], m + log(z));
  }
  free(q), free(k), free(v), free(dout), free(sc), free(p), free(dp), free(ds), free(lse);
  for (int i = 0; i < 4; i++) free(ref[i]), free(got[i]);
}

Test(softmax, stable_for_large_inputs) {
  // softmax(1e4 + [0,-1,-2]) = softmax([0,-1,-2]) = [1, e^-1, e^-2] / (1 + e^-1 + e^-2)
  const float x[] = {1e4f, 1e4f - 1, 1e4f - 2, -1e4f, -1e4f - 1, -1e4f - 2};
  float y[6];
  kdrt_softmax(y, x, 2, 3);
  const double z = 1 + exp(-1) + exp(-2);
  for (int r = 0; r < 2; r++) {
    cr_expect(fabs(y[3 * r + 0] - 1 / z) < 1e-6, "row %d: %g", r, y[3 * r]);
    cr_expect(fabs(y[3 * r + 1] - exp(-1) / z) < 1e-6);
    cr_expect(fabs(y[3 * r + 2] - exp(-2) / z) < 1e-6);
  }
}

// ---------------------------------------------------------------- losses

typedef struct {
  int kind, logits;
  float *pred, *y;
  int64_t rows, cols;
  double scale;
} loss_ctx;

static double loss_scalar(void *p) {
  loss_ctx *c = p;
  return loss_of(c->kind, c->logits, c->pred, c->y, c->rows, c->cols, c->scale);
}

static void check_loss_grad(int kind, int logits, float plo, float phi) {
  const int64_t rows = 4, cols = 5;
  const size_t n = rows * cols;
  loss_ctx c = {kind, logits, rand_buf(n, plo, phi), calloc(n, sizeof(float)), rows, cols,
                1.0 / 8};
  for (int64_t r = 0; r < rows; r++) {
    int t = (int)(r * 3 % cols);
    switch (kind) {
    case KDRT_LOSS_MSE:
    case KDRT_LOSS_MAE:
    case KDRT_LOSS_HUBER: // errors on both sides of delta 1
    case KDRT_LOSS_LOG_COSH:
    case KDRT_LOSS_MAPE:
      for (int64_t j = 0; j < cols; j++) {
        // keep |pred - y| > FD step for mae's kink
        float d = frand(0.1f, 2.0f);
        c.y[r * cols + j] = c.pred[r * cols + j] + (j % 2 ? d : -d);
      }
      break;
    case KDRT_LOSS_CCE: // soft labels, not summing to 1, to test the general form
    case KDRT_LOSS_KLD:
    case KDRT_LOSS_POISSON:
    case KDRT_LOSS_MSLE:
      for (int64_t j = 0; j < cols; j++)
        c.y[r * cols + j] = frand(0, 1);
      break;
    case KDRT_LOSS_COSINE:
      for (int64_t j = 0; j < cols; j++)
        c.y[r * cols + j] = frand(-1, 1);
      break;
    case KDRT_LOSS_HINGE: // 0/1, mapped to -1/1
    case KDRT_LOSS_SQUARED_HINGE:
      for (int64_t j = 0; j < cols; j++)
        c.y[r * cols + j] = (float)((r + j) % 2);
      break;
    case KDRT_LOSS_CAT_HINGE:
      c.y[r * cols + t] = 1.0f;
      break;
    case KDRT_LOSS_SCCE:
      c.y[r] = (float)t;
      break;
    case KDRT_LOSS_BCE:
      for (int64_t j = 0; j < cols; j++)
        c.y[r * cols + j] = (r + j) % 3 == 0 ? 1.0f : (j == 4 ? 0.3f : 0.0f);
      break;
    }
  }
  float *d = calloc(n, sizeof *d);
  grad_of(kind, logits, d, c.pred, c.y, rows, cols, c.scale);
  // Scale the FD up so the tolerance bites: compare grad*8 against d(8 L).
  c.scale = 1.0;
  for (size_t i = 0; i < n; i++)
    d[i] *= 8;
  double err = fd_error(c.pred, n, d, loss_scalar, &c);
  cr_expect(err < FD_TOL, "loss %d from_logits=%d: gradient error %g", kind, logits, err);
  free(c.pred), free(c.y), free(d);
}

Test(loss, gradients_match_finite_differences) {
  check_loss_grad(KDRT_LOSS_MSE, 0, -2, 2);
  check_loss_grad(KDRT_LOSS_MAE, 0, -2, 2);
  check_loss_grad(KDRT_LOSS_CCE, 0, 0.2f, 1.0f);
  check_loss_grad(KDRT_LOSS_CCE, 1, -3, 3);
  check_loss_grad(KDRT_LOSS_SCCE, 0, 0.2f, 1.0f);
  check_loss_grad(KDRT_LOSS_SCCE, 1, -3, 3);
  check_loss_grad(KDRT_LOSS_BCE, 0, 0.1f, 0.9f);
  check_loss_grad(KDRT_LOSS_BCE, 1, -3, 3);
  // issue 11
  check_loss_grad(KDRT_LOSS_HUBER, 0, -2, 2);
  check_loss_grad(KDRT_LOSS_LOG_COSH, 0, -2, 2);
  check_loss_grad(KDRT_LOSS_MAPE, 0, -2, 2);
  check_loss_grad(KDRT_LOSS_KLD, 0, 0.05f, 0.9f);
  check_loss_grad(KDRT_LOSS_POISSON, 0, 0.2f, 3);
  check_loss_grad(KDRT_LOSS_MSLE, 0, 0.2f, 3);
  check_loss_grad(KDRT_LOSS_COSINE, 0, -2, 2);
  check_loss_grad(KDRT_LOSS_HINGE, 0, -3, 3);
  check_loss_grad(KDRT_LOSS_SQUARED_HINGE, 0, -3, 3);
  check_loss_grad(KDRT_LOSS_CAT_HINGE, 0, -3, 3);
}

// issue 11: values against keras.losses (Keras 3.15.1 on JAX, float32, the
// mean of the rows' losses) for p = [[0.6, 0.4, -1.5], [2.0, 0.1, 0.3]], y =
// [[0, 1, 0], [1, 0, 0.5]] (the hinge losses: labels not all 0/1, as they are)
Test(loss, issue11_values) {
  const float p[] = {0.6f, 0.4f, -1.5f, 2.0f, 0.1f, 0.3f}, y[] = {0, 1, 0, 1, 0, 0.5f};
  struct { int kind; double want; } cases[] = {
    {KDRT_LOSS_HUBER, 0.314166665}, {KDRT_LOSS_LOG_COSH, 0.275725245},
    {KDRT_LOSS_KLD, 0.585850358}, {KDRT_LOSS_POISSON, NAN}, // log(-1.5 + epsilon)
    {KDRT_LOSS_HINGE, 0.741666675}, {KDRT_LOSS_SQUARED_HINGE, 0.680416703},
    {KDRT_LOSS_MAPE, 366666688}, {KDRT_LOSS_MSLE, 0.0903473794},
    {KDRT_LOSS_COSINE, -0.59502387}, {KDRT_LOSS_CAT_HINGE, 0.600000024}};
  float nb, out;
  kdrt_not_binary(&nb, y, 6);
  cr_expect(nb == 1.0f); // 0.5: the hinge losses take the labels as they are
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    kdrt_loss(cases[i].kind, 0, DELTA, &out, p, y, &nb, 2, 3, 0.5);
    double w = cases[i].want;
    cr_expect(isnan(w) ? isnan(out) : fabs(out - w) <= 1e-6 * fmax(1, fabs(w)),
              "loss %d: %.9g, Keras %.9g", cases[i].kind, out, w);
  }
  // labels all 0/1: -1/1 for the hinge losses
  const float y01[] = {0, 1, 0, 1, 0, 1};
  kdrt_not_binary(&nb, y01, 6);
  cr_expect(nb == 0.0f);
  kdrt_loss(KDRT_LOSS_HINGE, 0, DELTA, &out, p, y01, &nb, 2, 3, 0.5);
  cr_expect(fabs(out - 0.666666687) < 1e-6, "hinge, 0/1 labels: %.9g", out);
  kdrt_loss(KDRT_LOSS_SQUARED_HINGE, 0, DELTA, &out, p, y01, &nb, 2, 3, 0.5);
  cr_expect(fabs(out - 0.770000041) < 1e-6, "squared_hinge, 0/1 labels: %.9g", out);
}

Test(loss, mse_mae_values) {
  // rows (1,2) vs (0,0): mse (1+4)/2 = 2.5, mae (1+2)/2 = 1.5
  // rows (3,4) vs (3,2): mse (0+4)/2 = 2,   mae (0+2)/2 = 1
  const float p[] = {1, 2, 3, 4}, y[] = {0, 0, 3, 2};
  cr_expect(fabs(loss_of(KDRT_LOSS_MSE, 0, p, y, 2, 2, 0.5) - 2.25) < 1e-9);
  cr_expect(fabs(loss_of(KDRT_LOSS_MAE, 0, p, y, 2, 2, 0.5) - 1.25) < 1e-9);
  float d[4];
  grad_of(KDRT_LOSS_MSE, 0, d, p, y, 2, 2, 0.5); // 2 (p - y) / cols * scale
  cr_expect(d[0] == 0.5f && d[1] == 1.0f && d[2] == 0.0f && d[3] == 1.0f);
  grad_of(KDRT_LOSS_MAE, 0, d, p, y, 2, 2, 0.5); // sign(p - y) / cols * scale
  cr_expect(d[0] == 0.25f && d[1] == 0.25f && d[2] == 0.0f && d[3] == 0.25f);
}

Test(loss, categorical_values_and_clipping) {
  // Probabilities are normalised by their sum: (1,1,2) -> (.25,.25,.5);
  // label 2 -> -log .5. (0,1,1) with label 0: q0 = 0 clips to 1e-7,
  // loss -log(1e-7) = 16.1181, and its gradient is zero everywhere.
  const float p[] = {1, 1, 2, 0, 1, 1};
  const float y[] = {0, 0, 1, 1, 0, 0};
  const float ids[] = {2, 0};
  double l = loss_of(KDRT_LOSS_CCE, 0, p, y, 2, 3, 1.0);
  cr_expect(fabs(l - (log(2.0) + -log(1e-7))) < 1e-4, "cce %f", l);
  l = loss_of(KDRT_LOSS_SCCE, 0, p, ids, 2, 3, 1.0);
  cr_expect(fabs(l - (log(2.0) + -log(1e-7))) < 1e-4, "scce %f", l);
  float d[6], ds[6];
  grad_of(KDRT_LOSS_CCE, 0, d, p, y, 2, 3, 1.0);
  grad_of(KDRT_LOSS_SCCE, 0, ds, p, ids, 2, 3, 1.0);
  // Row 0, unclipped: dL/dp_k = (1/s) (-y_k/q_k + sum y) with s = 4:
  // (.25, .25, (1 - 2)/4) = (.25, .25, -.25).
  const float want[] = {0.25f, 0.25f, -0.25f, 0, 0, 0};
  for (int i = 0; i < 6; i++) {
    cr_expect(fabsf(d[i] - want[i]) < 1e-6, "cce grad[%d] = %g, want %g", i, d[i], want[i]);
    cr_expect(fabsf(ds[i] - want[i]) < 1e-6, "scce grad[%d] = %g, want %g", i, ds[i], want[i]);
  }
}

Test(loss, categorical_from_logits) {
  // logits (0, 0, ln 2): softmax (.25,.25,.5), label 2 -> ln 2; grad softmax - y.
  // logits (1000, 0), label 1: loss 1000, no overflow.
  const float p[] = {0, 0, logf(2), 1000, 0, 0};
  const float y[] = {0, 0, 1, 0, 1, 0};
  const float ids[] = {2, 1};
  double l = loss_of(KDRT_LOSS_CCE, 1, p, y, 2, 3, 1.0);
  cr_expect(fabs(l - (log(2.0) + 1000)) < 1e-3, "cce logits %f", l);
  l = loss_of(KDRT_LOSS_SCCE, 1, p, ids, 2, 3, 1.0);
  cr_expect(fabs(l - (log(2.0) + 1000)) < 1e-3, "scce logits %f", l);
  float d[6];
  grad_of(KDRT_LOSS_SCCE, 1, d, p, ids, 2, 3, 0.5);
  const float want[] = {0.125f, 0.125f, -0.25f, 0.5f, -0.5f, 0};
  for (int i = 0; i < 6; i++)
    cr_expect(fabsf(d[i] - want[i]) < 1e-6 && !isnan(d[i]), "grad[%d] = %g", i, d[i]);
}

Test(loss, binary_values_and_clipping) {
  // p = .8: y = 1 -> -ln .8, y = 0 -> -ln .2; mean over 2 columns.
  const float p[] = {0.8f, 0.8f}, y[] = {1, 0};
  double l = loss_of(KDRT_LOSS_BCE, 0, p, y, 1, 2, 1.0);
  cr_expect(fabs(l - (-log(0.8) - log(0.2)) / 2) < 1e-6, "bce %f", l);
  // p = 1, y = 0 clips to 1 - 1e-7 (0.99999988 in float32): -ln(1 - 0.99999988).
  // p = 0, y = 1 clips to 1e-7: -ln(1e-7). Both gradients 0.
  const float pc[] = {1.0f, 0.0f}, yc[] = {0, 1};
  l = loss_of(KDRT_LOSS_BCE, 0, pc, yc, 2, 1, 1.0);
  cr_expect(fabs(l - (-log(1.0 - 0.99999988079071044921875) - log(1e-7))) < 1e-3, "bce %f", l);
  float d[2];
  grad_of(KDRT_LOSS_BCE, 0, d, pc, yc, 2, 1, 1.0);
  cr_expect(d[0] == 0 && d[1] == 0, "clipped grads %g %g", d[0], d[1]);
  // Unclipped: d/dp = -y/p + (1-y)/(1-p) = -1.25 and 5, over 2 columns.
  grad_of(KDRT_LOSS_BCE, 0, d, p, y, 1, 2, 1.0);
  cr_expect(fabsf(d[0] + 0.625f) < 1e-5 && fabsf(d[1] - 2.5f) < 1e-5, "%g %g", d[0], d[1]);
  // Logits: x = 0 -> ln 2; x = 100, y = 0 -> 100; x = -100, y = 0 -> ~0.
  const float xl[] = {0, 100, -100}, yl[] = {1, 0, 0};
  l = loss_of(KDRT_LOSS_BCE, 1, xl, yl, 3, 1, 1.0);
  cr_expect(fabs(l - (log(2.0) + 100)) < 1e-4, "bce logits %f", l);
  float dl[3];
  grad_of(KDRT_LOSS_BCE, 1, dl, xl, yl, 3, 1, 1.0); // sigmoid(x) - y
  cr_expect(fabsf(dl[0] + 0.5f) < 1e-6 && fabsf(dl[1] - 1) < 1e-6 && fabsf(dl[2]) < 1e-6);
}

// issue 25: dpred may alias pred (kdrt_loss.h's gradient reads only its own
// element once the row's sums are taken; sparse crossentropy's label column
// before the loop): every loss, either form, on rows with ties and a
// clipped value, gives in place the bits it gives into another buffer.
Test(loss, gradient_in_place) {
  enum { R = 5, C = 7 };
  float p[R * C], y[R * C], ids[R] = {2, -1, 6, 0, 9}, d[R * C], inplace[R * C];
  for (int i = 0; i < R * C; i++) {
    p[i] = 0.05f + 0.9f * (float)((i * 37) % 11) / 11.0f; // repeats: ties in a row
    y[i] = i % 3 == 0 ? 1.0f : i % 5 == 0 ? 0.5f : 0.0f;
  }
  p[3] = 1e-9f; // clipped
  for (int kind = 0; kind < KDRT_LOSS_COUNT; kind++)
    for (int logits = 0; logits < 2; logits++) {
      const float *lab = kind == KDRT_LOSS_SCCE ? ids : y;
      grad_of(kind, logits, d, p, lab, R, C, 0.25);
      memcpy(inplace, p, sizeof p);
      grad_of(kind, logits, inplace, inplace, lab, R, C, 0.25);
      cr_expect(!memcmp(d, inplace, sizeof d), "loss %d from_logits=%d: in place differs", kind,
                logits);
      int finite = 1;
      for (int i = 0; i < R * C; i++) finite &= isfinite(d[i]) != 0;
      cr_expect(finite, "loss %d from_logits=%d: a gradient is not finite", kind, logits);
    }
}

Test(loss, accuracy) {
  // Binary (one column): threshold 0.5.
  const float pb[] = {0.7f, 0.2f, 0.5f, 0.9f}, yb[] = {1, 0, 1, 0};
  cr_expect(accuracy_of(KDRT_LOSS_BCE, 0, pb, yb, 4, 1, 0.25) == 0.5);
  // Categorical: argmax match, first maximum on ties.
  const float pc[] = {0.1f, 0.8f, 0.1f, 0.4f, 0.4f, 0.2f, 0.3f, 0.3f, 0.4f};
  const float yc[] = {0, 1, 0, 0, 1, 0, 0, 0, 1};
  cr_expect(accuracy_of(KDRT_LOSS_CCE, 0, pc, yc, 3, 3, 1.0) == 2.0);
  cr_expect(accuracy_of(KDRT_LOSS_MSE, 0, pc, yc, 3, 3, 1.0) == 2.0);
  const float ids[] = {1, 0, 1};
  cr_expect(accuracy_of(KDRT_LOSS_SCCE, 1, pc, ids, 3, 3, 1.0) == 2.0);
}

// ---------------------------------------------------------------- conv2d

typedef struct {
  int B, H, W, C, KH, KW, K, sh, sw, pt, pl, OH, OW;
  int dh, dw; // dilation minus 1 (kdrt_window's convention)
  int G;      // groups (issue 15; 0: none)
} conv_shape;

static conv_shape conv_make(int B, int H, int W, int C, int KH, int KW, int K, int sh, int sw,
                            int same) {
  conv_shape s = {B, H, W, C, KH, KW, K, sh, sw, 0, 0, 0, 0, 0, 0, 0};
  if (same) {
    s.OH = (H + sh - 1) / sh;
    s.OW = (W + sw - 1) / sw;
    int th = (s.OH - 1) * sh + KH - H, tw = (s.OW - 1) * sw + KW - W;
    s.pt = th > 0 ? th / 2 : 0;
    s.pl = tw > 0 ? tw / 2 : 0;
  } else {
    s.OH = (H - KH) / sh + 1;
    s.OW = (W - KW) / sw + 1;
  }
  return s;
}

// The runtime's description of the same window op.
static kdrt_window window_of(const conv_shape *s) {
  kdrt_window w = {s->B,  s->H,  s->W,  s->C,  s->KH, s->KW, s->K,  s->sh,
                   s->sw, s->pt, s->pl, s->OH, s->OW, s->dh, s->dw, s->G};
  return w;
}

static size_t xs(const conv_shape *s) { return (size_t)s->B * s->H * s->W * s->C; }
static int gs(const conv_shape *s) { return s->G > 1 ? s->G : 1; }
static size_t fs(const conv_shape *s) { return (size_t)s->KH * s->KW * s->C / gs(s) * s->K; }
static size_t ys(const conv_shape *s) { return (size_t)s->B * s->OH * s->OW * s->K; }
static size_t ss(const conv_shape *s) {
  return (size_t)s->B * s->OH * s->OW * s->KH * s->KW * s->C;
}

// Direct convolution and its two gradients, in double; group j maps input
// channels [j * cg, ..) to output channels [j * kg, ..) by f [KH, KW, cg, K].
static void conv_naive(const conv_shape *s, const float *x, const float *f, const float *dy,
                       double *y, double *dx, double *dw) {
  memset(y, 0, ys(s) * sizeof *y);
  memset(dx, 0, xs(s) * sizeof *dx);
  memset(dw, 0, fs(s) * sizeof *dw);
  for (int b = 0; b < s->B; b++)
    for (int oh = 0; oh < s->OH; oh++)
      for (int ow = 0; ow < s->OW; ow++)
        for (int kh = 0; kh < s->KH; kh++)
          for (int kw = 0; kw < s->KW; kw++) {
            int ih = oh * s->sh - s->pt + kh * (s->dh + 1);
            int iw = ow * s->sw - s->pl + kw * (s->dw + 1);
            if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W)
              continue;
            for (int c = 0, cg = s->C / gs(s), kg = s->K / gs(s); c < s->C; c++)
              for (int k = c / cg * kg; k < (c / cg + 1) * kg; k++) {
                size_t xi = (((size_t)b * s->H + ih) * s->W + iw) * s->C + c;
                size_t fi = (((size_t)kh * s->KW + kw) * cg + c % cg) * s->K + k;
                size_t yi = (((size_t)b * s->OH + oh) * s->OW + ow) * s->K + k;
                y[yi] += (double)x[xi] * f[fi];
                dx[xi] += (double)dy[yi] * f[fi];
                dw[fi] += (double)dy[yi] * x[xi];
              }
          }
}

// issue 11: dilated kernels ('same' as Keras pads them: from the dilated
// extent), the width dilated or not (ops.c's two im2col paths).
static conv_shape conv_dilated(int B, int H, int W, int C, int KH, int KW, int K, int dh, int dw,
                               int same) {
  int eh = (KH - 1) * dh + 1, ew = (KW - 1) * dw + 1;
  conv_shape s = {B, H, W, C, KH, KW, K, 1, 1, 0, 0, H - eh + 1, W - ew + 1, dh - 1, dw - 1, 0};
  if (same) s.OH = H, s.OW = W, s.pt = (eh - 1) / 2, s.pl = (ew - 1) / 2;
  return s;
}

static void conv_check(const conv_shape *sp, const char *what) {
  const conv_shape s = *sp;
  float *x = rand_buf(xs(&s), -1, 1), *f = rand_buf(fs(&s), -1, 1);
  float *dy = rand_buf(ys(&s), -1, 1), *scratch = malloc(ss(&s) * sizeof(float));
  float *y = malloc(ys(&s) * sizeof(float)), *dx = malloc(xs(&s) * sizeof(float));
  float *dw = malloc(fs(&s) * sizeof(float));
  double *ry = malloc(ys(&s) * sizeof(double)), *rdx = malloc(xs(&s) * sizeof(double));
  double *rdw = malloc(fs(&s) * sizeof(double));
  conv_naive(&s, x, f, dy, ry, rdx, rdw);
  const kdrt_window cw = window_of(&s);
  kdrt_conv2d(&cw, y, x, f, scratch);
  for (size_t i = 0; i < xs(&s); i++) // dx must be overwritten, not accumulated
    dx[i] = 1e3f;
  kdrt_conv2d_dx(&cw, dx, dy, f, scratch);
  kdrt_conv2d_dw(&cw, dw, x, dy, scratch);
  cr_expect(max_abs_diff(y, ry, ys(&s)) < 1e-4, "%s: y off by %g", what,
            max_abs_diff(y, ry, ys(&s)));
  cr_expect(max_abs_diff(dx, rdx, xs(&s)) < 1e-4, "%s: dx off by %g", what,
            max_abs_diff(dx, rdx, xs(&s)));
  cr_expect(max_abs_diff(dw, rdw, fs(&s)) < 1e-4, "%s: dw off by %g", what,
            max_abs_diff(dw, rdw, fs(&s)));
  free(x), free(f), free(dy), free(scratch), free(y), free(dx), free(dw);
  free(ry), free(rdx), free(rdw);
}

// issue 22: the conv cuDNN is given (runtime/cuda/cudnn.cu): x moved by
// (pt, pl) into zeros of Hs x Ws, Hs = H + 2 pt where kdrt_conv_even_pad
// says cuDNN's even padding will do, else its Hp, and convolved unpadded.
// Its y, its dx cropped back and its dw must be w's (kdrt_conv2d's own).
static void shift_nhwc(float *dst, const float *src, int B, int Hd, int Wd, int Hs, int Ws, int C,
                       int oh, int ow) {
  for (int b = 0; b < B; b++)
    for (int i = 0; i < Hd; i++)
      for (int j = 0; j < Wd; j++)
        for (int c = 0; c < C; c++) {
          int si = i - oh, sj = j - ow;
          dst[(((size_t)b * Hd + i) * Wd + j) * C + c] =
              si >= 0 && si < Hs && sj >= 0 && sj < Ws
                  ? src[(((size_t)b * Hs + si) * Ws + sj) * C + c]
                  : 0.0f;
        }
}

static void cudnn_view_check(const conv_shape *sp, const char *what, int want_even) {
  const conv_shape s = *sp;
  const kdrt_window w = window_of(&s);
  int Hp, Wp;
  const int even = kdrt_conv_even_pad(&w, &Hp, &Wp);
  cr_expect(even == want_even, "%s: even padding %d, expected %d", what, even, want_even);
  const int Hs = even ? s.H + 2 * s.pt : Hp, Ws = even ? s.W + 2 * s.pl : Wp;
  const int eh = (s.KH - 1) * (s.dh + 1) + 1, ew = (s.KW - 1) * (s.dw + 1) + 1;
  conv_shape v = s;
  v.H = Hs, v.W = Ws, v.pt = v.pl = 0, v.OH = (Hs - eh) / s.sh + 1, v.OW = (Ws - ew) / s.sw + 1;
  cr_assert(v.OH == s.OH && v.OW == s.OW, "%s: the unpadded view makes %dx%d outputs, not %dx%d",
            what, v.OH, v.OW, s.OH, s.OW);
  const kdrt_window vw = window_of(&v);
  float *x = rand_buf(xs(&s), -1, 1), *f = rand_buf(fs(&s), -1, 1), *dy = rand_buf(ys(&s), -1, 1);
  float *xv = malloc(xs(&v) * sizeof(float)), *dxv = malloc(xs(&v) * sizeof(float));
  size_t nsc = ss(&s) > ss(&v) ? ss(&s) : ss(&v);
  float *scratch = malloc(nsc * sizeof(float)), *y = malloc(ys(&s) * sizeof(float));
  float *yv = malloc(ys(&s) * sizeof(float)), *dx = malloc(xs(&s) * sizeof(float));
  float *dxc = malloc(xs(&s) * sizeof(float)), *dw = malloc(fs(&s) * sizeof(float));
  float *dwv = malloc(fs(&s) * sizeof(float));
  double *d = malloc((xs(&s) > ys(&s) ? xs(&s) : ys(&s)) * sizeof(double));
  shift_nhwc(xv, x, s.B, Hs, Ws, s.H, s.W, s.C, s.pt, s.pl);
  kdrt_conv2d(&w, y, x, f, scratch);
  kdrt_conv2d(&vw, yv, xv, f, scratch);
  kdrt_conv2d_dx(&w, dx, dy, f, scratch);
  kdrt_conv2d_dx(&vw, dxv, dy, f, scratch);
  shift_nhwc(dxc, dxv, s.B, s.H, s.W, Hs, Ws, s.C, -s.pt, -s.pl);
  kdrt_conv2d_dw(&w, dw, x, dy, scratch);
  kdrt_conv2d_dw(&vw, dwv, xv, dy, scratch);
  for (size_t i = 0; i < ys(&s); i++) d[i] = yv[i];
  cr_expect(max_abs_diff(y, d, ys(&s)) < 1e-5, "%s: y off by %g", what, max_abs_diff(y, d, ys(&s)));
  for (size_t i = 0; i < xs(&s); i++) d[i] = dxc[i];
  cr_expect(max_abs_diff(dx, d, xs(&s)) < 1e-5, "%s: dx off by %g", what,
            max_abs_diff(dx, d, xs(&s)));
  for (size_t i = 0; i < fs(&s); i++) d[i] = dwv[i];
  cr_expect(max_abs_diff(dw, d, fs(&s)) < 1e-5, "%s: dw off by %g", what,
            max_abs_diff(dw, d, fs(&s)));
  free(x), free(f), free(dy), free(xv), free(dxv), free(scratch), free(y), free(yv), free(dx);
  free(dxc), free(dw), free(dwv), free(d);
}

Test(conv2d, cudnn_view) {
  // B H W C KH KW K sh sw same, even padding expected
  static const int cases[][11] = {
      {2, 28, 28, 1, 3, 3, 8, 1, 1, 1, 1},  // the examples' ResNet: 3x3 same
      {2, 14, 14, 4, 3, 3, 6, 2, 2, 1, 0},  // its 14 -> 7 at stride 2: 0 above, 1 below
      {2, 14, 14, 4, 1, 1, 6, 2, 2, 1, 1},  // its 1x1 at stride 2
      {2, 11, 10, 2, 3, 2, 4, 2, 2, 0, 1},  // valid, stride 2: rows past the windows unread
      {3, 10, 9, 5, 2, 2, 7, 1, 1, 1, 0},   // even kernel, same
      {1, 8, 8, 2, 5, 5, 2, 2, 2, 1, 0},    // 5x5 same, stride 2: 1 above, 2 below
      {2, 9, 8, 3, 3, 3, 5, 1, 3, 1, 0},    // stride 3 across: 0 left, 1 right
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    const int *a = cases[t];
    conv_shape s = conv_make(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
    char what[32];
    snprintf(what, sizeof what, "cudnn view case %zu", t);
    cudnn_view_check(&s, what, a[10]);
  }
  conv_shape d = conv_dilated(2, 12, 11, 4, 3, 3, 6, 2, 2, 1); // dilation 2, same: even
  cudnn_view_check(&d, "cudnn view, dilated same", 1);
  d = conv_dilated(2, 12, 11, 4, 2, 2, 6, 3, 3, 1); // extent 4, same: 1 before, 2 after
  cudnn_view_check(&d, "cudnn view, dilated even kernel", 0);
  d = conv_make(2, 9, 7, 6, 3, 3, 9, 2, 2, 1);
  d.G = 3; // grouped, stride 2 same: 9 -> 5 pads 1 and 1, 7 -> 4 pads 1 and 1
  cudnn_view_check(&d, "cudnn view, 3 groups", 1);
}

Test(conv2d, dilated_matches_naive) {
  // B H W C KH KW K dh dw same
  static const int cases[][10] = {
      {2, 9, 8, 3, 3, 3, 4, 2, 2, 0}, {2, 9, 8, 3, 3, 3, 4, 2, 2, 1},
      {2, 9, 7, 3, 3, 2, 4, 3, 1, 1}, {1, 11, 1, 2, 3, 1, 3, 4, 1, 0}, // Conv1D's view
      {1, 6, 9, 2, 2, 3, 3, 1, 3, 1},
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    const int *a = cases[t];
    conv_shape s = conv_dilated(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
    char what[32];
    snprintf(what, sizeof what, "dilated case %zu", t);
    conv_check(&s, what);
  }
}

Test(conv2d, matches_naive_valid_same_strides) {
  // B H W C KH KW K sh sw same
  static const int cases[][10] = {
      {2, 7, 5, 3, 3, 2, 4, 1, 1, 0}, {2, 7, 5, 3, 3, 2, 4, 1, 1, 1},
      {2, 7, 5, 3, 3, 3, 4, 2, 2, 0}, {2, 7, 5, 3, 3, 3, 4, 2, 2, 1},
      {1, 9, 8, 2, 5, 5, 3, 2, 1, 1}, {3, 6, 6, 4, 1, 1, 5, 1, 1, 0}, // 1x1 pointwise
      {1, 4, 4, 2, 1, 1, 3, 2, 2, 1}, {1, 3, 3, 1, 4, 4, 2, 1, 1, 1}, // kernel > input
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    const int *a = cases[t];
    conv_shape s = conv_make(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
    char what[32];
    snprintf(what, sizeof what, "case %zu", t);
    conv_check(&s, what);
  }
}

// issue 15: grouped and depthwise convolutions, one window for all groups.
Test(conv2d, grouped_matches_naive) {
  // B H W C KH KW K sh sw same G
  static const int cases[][11] = {
      {2, 7, 5, 4, 3, 3, 6, 1, 1, 1, 2},  {2, 7, 6, 6, 3, 2, 9, 2, 2, 0, 3},
      {2, 8, 8, 5, 3, 3, 5, 1, 1, 1, 5},  {2, 8, 7, 4, 3, 3, 8, 2, 2, 1, 4}, // depthwise, x2
      {3, 6, 6, 6, 1, 1, 4, 1, 1, 0, 2},  {1, 5, 5, 3, 1, 1, 6, 1, 1, 0, 3}, // pointwise
      {2, 9, 9, 16, 5, 5, 16, 2, 1, 1, 16},
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    const int *a = cases[t];
    conv_shape s = conv_make(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
    s.G = a[10];
    char what[32];
    snprintf(what, sizeof what, "grouped case %zu", t);
    conv_check(&s, what);
  }
  conv_shape s = conv_dilated(2, 9, 8, 4, 3, 3, 4, 2, 2, 1); // dilated depthwise
  s.G = 4;
  conv_check(&s, "dilated depthwise");
}

typedef struct {
  conv_shape s;
  float *x, *f, *y, *w, *scratch;
} conv_ctx;

static double conv_scalar(void *p) {
  conv_ctx *c = p;
  const conv_shape *s = &c->s;
  const kdrt_window cw = window_of(s);
  kdrt_conv2d(&cw, c->y, c->x, c->f, c->scratch);
  return dot(c->w, c->y, ys(s));
}

Test(conv2d, gradients_match_finite_differences) {
  for (int G = 1; G <= 2; G++) // issue 15: and two groups
    for (int same = 0; same <= 1; same++)
      for (int st = 1; st <= 2; st++) {
        conv_ctx c;
        c.s = conv_make(2, 5, 6, 2, 3, 3, 2 * G, st, st, same);
        c.s.G = G;
        const conv_shape *s = &c.s;
        c.x = rand_buf(xs(s), -1, 1), c.f = rand_buf(fs(s), -1, 1);
        c.y = malloc(ys(s) * sizeof(float)), c.w = rand_buf(ys(s), -1, 1);
        c.scratch = malloc(ss(s) * sizeof(float));
        float *dx = malloc(xs(s) * sizeof(float)), *dw = malloc(fs(s) * sizeof(float));
        const kdrt_window cw = window_of(s);
        kdrt_conv2d_dx(&cw, dx, c.w, c.f, c.scratch);
        kdrt_conv2d_dw(&cw, dw, c.x, c.w, c.scratch);
        double ex = fd_error(c.x, xs(s), dx, conv_scalar, &c);
        double ew = fd_error(c.f, fs(s), dw, conv_scalar, &c);
        cr_expect(ex < FD_TOL && ew < FD_TOL, "G=%d same=%d stride=%d: dx err %g, dw err %g", G,
                  same, st, ex, ew);
        free(c.x), free(c.f), free(c.y), free(c.w), free(c.scratch), free(dx), free(dw);
      }
}

// ---------------------------------------------------------------- maxpool

// Naive max pooling; arg receives the flat index in x of the first maximum.
static void pool_naive(const conv_shape *s, const float *x, double *y, size_t *arg) {
  for (int b = 0; b < s->B; b++)
    for (int oh = 0; oh < s->OH; oh++)
      for (int ow = 0; ow < s->OW; ow++)
        for (int c = 0; c < s->C; c++) {
          double m = -INFINITY;
          size_t at = 0;
          for (int ph = 0; ph < s->KH; ph++)
            for (int pw = 0; pw < s->KW; pw++) {
              int ih = oh * s->sh - s->pt + ph, iw = ow * s->sw - s->pl + pw;
              if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W)
                continue;
              size_t xi = (((size_t)b * s->H + ih) * s->W + iw) * s->C + c;
              if (x[xi] > m)
                m = x[xi], at = xi;
            }
          size_t yi = (((size_t)b * s->OH + oh) * s->OW + ow) * s->C + c;
          y[yi] = m;
          arg[yi] = at;
        }
}

typedef struct {
  conv_shape s;
  float *x, *y, *w;
} pool_ctx;

static double pool_scalar(void *p) {
  pool_ctx *c = p;
  const conv_shape *s = &c->s;
  const kdrt_window pw = window_of(s);
  kdrt_maxpool(&pw, c->y, c->x);
  return dot(c->w, c->y, (size_t)s->B * s->OH * s->OW * s->C);
}

Test(maxpool, matches_naive_and_finite_differences) {
  // B H W C PH PW sh sw same (K unused: the pooled tensor keeps C channels)
  static const int cases[][9] = {
      {2, 6, 6, 3, 2, 2, 2, 2, 0}, {2, 7, 5, 3, 2, 2, 2, 2, 1}, {1, 7, 7, 2, 3, 3, 2, 2, 1},
      {1, 5, 6, 4, 3, 2, 1, 1, 0}, {2, 5, 5, 3, 3, 3, 1, 1, 1},
      // tiling windows (kdrt_maxpool_grad's scatter-free path) that leave
      // rows and columns uncovered, which dx must zero
      {2, 7, 5, 3, 2, 2, 2, 2, 0}, {1, 7, 8, 2, 3, 3, 3, 3, 0},
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    const int *a = cases[t];
    pool_ctx c;
    c.s = conv_make(a[0], a[1], a[2], a[3], a[4], a[5], a[3], a[6], a[7], a[8]);
    const conv_shape *s = &c.s;
    const size_t nx = xs(s), ny = (size_t)s->B * s->OH * s->OW * s->C;
    // Distinct values at least 0.05 apart, so the FD step never changes a
    // window's winner: a shuffled ramp, all negative to catch a zero pad winning.
    c.x = malloc(nx * sizeof(float));
    for (size_t i = 0; i < nx; i++)
      c.x[i] = -1.0f - 0.05f * (float)i;
    for (size_t i = nx - 1; i > 0; i--) {
      size_t j = (size_t)frand(0, (float)(i + 1)) % (i + 1);
      float tmp = c.x[i];
      c.x[i] = c.x[j], c.x[j] = tmp;
    }
    c.y = malloc(ny * sizeof(float)), c.w = rand_buf(ny, -1, 1);
    double *ry = malloc(ny * sizeof(double));
    size_t *arg = malloc(ny * sizeof(size_t));
    pool_naive(s, c.x, ry, arg);
    pool_scalar(&c);
    cr_expect(max_abs_diff(c.y, ry, ny) == 0, "case %zu: y off by %g", t,
              max_abs_diff(c.y, ry, ny));
    float *dx = malloc(nx * sizeof(float));
    double *rdx = calloc(nx, sizeof(double));
    for (size_t i = 0; i < ny; i++)
      rdx[arg[i]] += c.w[i];
    for (size_t i = 0; i < nx; i++)
      dx[i] = 7.0f;
    const kdrt_window pw = window_of(s);
    kdrt_maxpool_grad(&pw, dx, c.w, c.x);
    cr_expect(max_abs_diff(dx, rdx, nx) < 1e-6, "case %zu: dx off by %g", t,
              max_abs_diff(dx, rdx, nx));
    double err = fd_error(c.x, nx, dx, pool_scalar, &c);
    cr_expect(err < FD_TOL, "case %zu: gradient error %g", t, err);
    free(c.x), free(c.y), free(c.w), free(ry), free(arg), free(dx), free(rdx);
  }
}

// issue 25: kdrt_ops.h's window arithmetic, which the CPU kernels use one
// way and the CUDA gathers (max pooling's gradient, col2im) the other: the
// inverses agree with the forward maps on every small geometry.
Test(window, inverses_agree) {
  int checked = 0;
  for (int s = 1; s <= 3; s++)
    for (int pad = 0; pad <= 2; pad++)
      for (int P = 1; P <= 4; P++)
        for (int n = 1; n <= 9; n++)
          for (int nout = 1; nout <= 6; nout++)
            for (int i = 0; i < n; i++) {
              int olo, ohi;
              kdrt_win_outs(i, s, pad, P, nout, &olo, &ohi);
              for (int o = 0; o < nout; o++) {
                int i0, lo, hi;
                kdrt_win_range(o, s, pad, P, n, &i0, &lo, &hi);
                int holds = i >= i0 + lo && i < i0 + hi;
                cr_assert_eq(holds, o >= olo && o <= ohi,
                             "pool s=%d pad=%d P=%d n=%d: input %d, output %d", s, pad, P, n, i, o);
              }
              for (int step = 1; step <= 2; step++)
                for (int k = 0; k < P; k++) {
                  int from = kdrt_conv_from(i, k, s, pad, step, nout);
                  for (int o = 0; o < nout; o++)
                    cr_assert_eq(kdrt_conv_at(o, k, s, pad, step, n) == i, o == from,
                                 "conv s=%d pad=%d step=%d n=%d: input %d, k %d, output %d", s,
                                 pad, step, n, i, k, o);
                  checked++;
                }
            }
  cr_expect(checked > 1000);
}

Test(maxpool, ties_go_to_first_and_many_channels) {
  // One 2x2 window of equal values: all the gradient goes to (0,0).
  // C = 300 crosses the kernel's 256-channel chunking.
  const int C = 300;
  float *x = malloc(4 * C * sizeof(float)), *dx = malloc(4 * C * sizeof(float));
  float *dy = malloc(C * sizeof(float)), y[300];
  for (int i = 0; i < 4 * C; i++)
    x[i] = 3.0f;
  for (int c = 0; c < C; c++) {
    dy[c] = (float)c;
    x[3 * C + c] = c % 2 ? 3.0f : 4.0f; // even channels: the last pixel wins
  }
  const kdrt_window pw = {1, 2, 2, C, 2, 2, C, 2, 2, 0, 0, 1, 1, 0, 0, 0};
  kdrt_maxpool(&pw, y, x);
  kdrt_maxpool_grad(&pw, dx, dy, x);
  for (int c = 0; c < C; c++) {
    int win = c % 2 ? 0 : 3;
    cr_expect(y[c] == (c % 2 ? 3.0f : 4.0f));
    for (int p = 0; p < 4; p++)
      cr_expect(dx[p * C + c] == (p == win ? (float)c : 0.0f), "c %d pixel %d: %g", c, p,
                dx[p * C + c]);
  }
  free(x), free(dx), free(dy);
}

// ---------------------------------------------------------------- blocks

Test(block, copy_and_place) {
  // in [2, 5, 2]; copy rows 1..3 of the middle dim -> out [2, 3, 2].
  float in[20], out[12], back[20];
  for (int i = 0; i < 20; i++)
    in[i] = (float)i;
  kdrt_copy_block(out, in, 2, 5, 1, 3, 2);
  const float want[] = {2, 3, 4, 5, 6, 7, 12, 13, 14, 15, 16, 17};
  for (int i = 0; i < 12; i++)
    cr_expect(out[i] == want[i], "out[%d] = %g", i, out[i]);
  for (int i = 0; i < 20; i++)
    back[i] = -1;
  kdrt_place_block(back, out, 2, 3, 1, 5, 2);
  for (int i = 0; i < 20; i++) {
    int mid = (i / 2) % 5;
    float w = (mid >= 1 && mid <= 3) ? (float)i : -1.0f;
    cr_expect(back[i] == w, "back[%d] = %g, want %g", i, back[i], w);
  }
}

// ---------------------------------------------------------------- optimizers
// One weight, w = 1, gradients 1 then 2, lr = 0.1.

Test(optim, sgd) {
  float w = 1, m = 0, g1 = 1, g2 = 2;
  kdrt_sgd(&w, &g1, NULL, 1, 0.1f, 0, 0);
  kdrt_sgd(&w, &g2, NULL, 1, 0.1f, 0, 0);
  cr_expect_float_eq(w, 0.7f, 1e-6); // 1 - .1 - .2
  // momentum .9: m1 = -.1, w1 = .9; m2 = -.09 - .2 = -.29, w2 = .61
  w = 1;
  kdrt_sgd(&w, &g1, &m, 1, 0.1f, 0.9f, 0);
  cr_expect_float_eq(w, 0.9f, 1e-6);
  kdrt_sgd(&w, &g2, &m, 1, 0.1f, 0.9f, 0);
  cr_expect_float_eq(m, -0.29f, 1e-6);
  cr_expect_float_eq(w, 0.61f, 1e-6);
  // nesterov: w1 = 1 + (.9 * -.1 - .1) = .81; w2 = .81 + (.9 * -.29 - .2) = .349
  w = 1, m = 0;
  kdrt_sgd(&w, &g1, &m, 1, 0.1f, 0.9f, 1);
  cr_expect_float_eq(w, 0.81f, 1e-6);
  kdrt_sgd(&w, &g2, &m, 1, 0.1f, 0.9f, 1);
  cr_expect_float_eq(w, 0.349f, 1e-6);
}

Test(optim, adam_and_adamw) {
  // Adam, b1 .9, b2 .999, eps 1e-7.
  // t=1: m = .1, v = .001, alpha = .1 sqrt(.001) / .1 = .0316228;
  //      w -= .0316228 * .1 / (.0316228 + 1e-7) = .0999997 -> .9000003
  // t=2: m = .1 + 1.9 * .1 = .29, v = .001 + 3.999 * .001 = .004999,
  //      alpha = .1 sqrt(.001999) / .19 = .0235317, sqrt(v) = .0707036;
  //      w -= .0235317 * .29 / .0707037 = .0965181 -> .8034822
  float w = 1, m = 0, v = 0, g1 = 1, g2 = 2;
  kdrt_adam(&w, &g1, &m, &v, NULL, 1, 0.1f, 0.9f, 0.999f, 1e-7f, 1);
  cr_expect_float_eq(w, 0.9000003f, 1e-6);
  kdrt_adam(&w, &g2, &m, &v, NULL, 1, 0.1f, 0.9f, 0.999f, 1e-7f, 2);
  cr_expect_float_eq(m, 0.29f, 1e-6);
  // (1 - b2 is 0.000999987 for b2 = 0.999f, so v is 0.004999 to 1.3e-5 relative)
  cr_expect_float_eq(v, 0.004999f, 1e-7);
  cr_expect_float_eq(w, 0.8034822f, 1e-6);
  // AdamW, wd .5: decay first, w *= 1 - .5 * .1 = .95, then the same Adam
  // steps: t=1: .95 - .0999997 = .8500003; t=2: .8500003 * .95 - .0965181 = .7109822
  w = 1, m = 0, v = 0;
  kdrt_adamw(&w, &g1, &m, &v, NULL, 1, 0.1f, 0.9f, 0.999f, 1e-7f, 0.5f, 1);
  cr_expect_float_eq(w, 0.8500003f, 1e-6);
  kdrt_adamw(&w, &g2, &m, &v, NULL, 1, 0.1f, 0.9f, 0.999f, 1e-7f, 0.5f, 2);
  cr_expect_float_eq(w, 0.7109822f, 1e-6);
}

// issue 23: a 16-bit variable's update in its type (Keras's update_step
// under the bfloat16 and float16 policies), every op rounded.
Test(optim, sixteen_bit) {
  // SGD, w = 1, g = 1, lr .1: bfloat16's lr is .10009765625 (.1 * 2^4 =
  // 1.6 -> 205/128), w - lr = .8999023 rounds to the nearest 1/256:
  // 230/256 = .8984375 (float32's SGD gives .9)
  float w = 1, m = 0, v = 0, g1 = 1, zero = 0;
  kdrt_sgd16(&w, &g1, NULL, 1, 0.1f, 0, 0, 0, KDRT_ROUND_BF16);
  cr_expect_eq(w, 0.8984375f, "%.9g", w);
  // float16's lr .0999755859 (1638/16384), w - lr = .9000244 to the
  // nearest 1/2048: 1843/2048 = .89990234375
  w = 1;
  kdrt_sgd16(&w, &g1, NULL, 1, 0.1f, 0, 0, 0, KDRT_ROUND_F16);
  cr_expect_eq(w, 0.89990234375f, "%.9g", w);
  // Adam's default beta_2 .999 is 1.0 in bfloat16: 1 - b2^t = 0, a step
  // size of 0, so w stays (Keras's own: its default Adam does not train a
  // bfloat16 model), while m moves: (g - 0) * bf16(.1) = .10009765625
  w = 1;
  kdrt_adam16(&w, &g1, &m, &v, NULL, 1, 0.1f, 0.9f, 0.999f, 1e-7f, 0, 1, KDRT_ROUND_BF16);
  cr_expect_eq(w, 1.0f, "%.9g", w);
  cr_expect_eq(m, 0.10009765625f, "%.9g", m);
  // beta_2 .99 (.98828125 in bfloat16): t=1, bias-corrected, the step is
  // about lr: alpha = bf16(.1) * bf16(sqrt(1 - .98828125)) / bf16(1 - .8984375),
  // m / sqrt(v) = 1 up to rounding; every value a bfloat16's
  w = 1, m = 0, v = 0;
  kdrt_adam16(&w, &g1, &m, &v, NULL, 1, 0.1f, 0.9f, 0.99f, 1e-7f, 0, 1, KDRT_ROUND_BF16);
  cr_expect(w < 0.95f && w > 0.85f, "w = %.9g", w);
  cr_expect_eq(w, kdrt_round_to(KDRT_ROUND_BF16, w));
  cr_expect_eq(v, kdrt_round_to(KDRT_ROUND_BF16, v));
  // a zero gradient and zero slots leave w, only weight decay moving it:
  // w - w * bf16(.5) * bf16(.1) = 1 - .050048828 -> 243/256 = .94921875
  w = 1, m = 0, v = 0;
  kdrt_adam16(&w, &zero, &m, &v, NULL, 1, 0.1f, 0.9f, 0.99f, 1e-7f, 0.5f, 1, KDRT_ROUND_BF16);
  cr_expect_eq(w, 0.94921875f, "%.9g", w);
}

// issue 23: RMSprop (centered, momentum), Adagrad, Adamax, Nadam, Lion and
// the 16-bit clipping against a reference written here from Keras 3.15's
// update_step (keras/src/optimizers/*.py): each op in double on 16-bit
// values, its result rounded to float32 then to the 16-bit type (R), which
// is what XLA's float32 op and its cast give (double rounding is exact for
// + - * / sqrt of floats), every constant cast as Keras casts it. The
// kernels must give the same bits, over 3 steps, each slot too.
static int rkind; // the type R rounds to
static double R(double x) { return kdrt_round_to(rkind, (float)x); }
static double sgn(double x) { return (double)((x > 0) - (x < 0)); }
// x / d, d a scalar: XLA's float16 program multiplies by its rounded
// reciprocal (tests/sh/opt16.sh checks against Keras's own)
static double div_s(double x, double d) {
  return rkind == KDRT_ROUND_F16 ? R(x * R(1.0 / d)) : R(x / d);
}

static void ref_opt16(int which, double *w, const double *g0, double *m, double *v, double *a,
                      size_t n, double lr0, int64_t t, double *u_prod) {
  const double lr = R(lr0), eps = R(1e-7);
  const double b1 = 0.9, b2 = 0.99, rho = 0.9, mom = 0.5;
  const double tt = R((double)t);
  if (which == 3) { // Nadam's u_product, once a step, in the 16-bit dtype
    *u_prod = R(R(*u_prod * R(b1)) * R(1.0 - R(0.5 * R(pow(R(0.96), tt)))));
  }
  for (size_t i = 0; i < n; i++) {
    double g = R(g0[i]), nw;
    switch (which) {
    case 0: { // RMSprop, centered, momentum
      v[i] = R(R(R(rho) * v[i]) + R(R(1.0 - rho) * R(g * g)));
      a[i] = R(R(R(rho) * a[i]) + R(R(1.0 - rho) * g));
      double den = R(R(v[i] - R(a[i] * a[i])) + eps);
      double inc = R(R(lr * g) / R(sqrt(den)));
      m[i] = R(R(R(mom) * m[i]) + inc);
      nw = R(w[i] - m[i]);
      break;
    }
    case 1: // Adagrad
      v[i] = R(v[i] + R(g * g));
      nw = R(w[i] - R(R(lr * g) / R(sqrt(R(v[i] + eps)))));
      break;
    case 2: { // Adamax
      double bp = R(pow(R(b1), tt));
      m[i] = R(m[i] + R(R(g - m[i]) * R(1.0 - b1)));
      v[i] = fmax(R(R(b2) * v[i]), fabs(g));
      nw = R(w[i] - R(R(lr * m[i]) / R(R(1.0 - bp) * R(v[i] + eps))));
      break;
    }
    case 3: { // Nadam
      double B1 = R(b1), B2 = R(b2), d = R(0.96), nt = R((double)(t + 1));
      double u_t = R(B1 * R(1.0 - R(0.5 * R(pow(d, tt)))));
      double u_t1 = R(B1 * R(1.0 - R(0.5 * R(pow(d, nt)))));
      double up = R(*u_prod), up1 = R(up * u_t1), b2p = R(pow(B2, tt));
      m[i] = R(m[i] + R(R(g - m[i]) * R(1.0 - B1)));
      v[i] = R(v[i] + R(R(R(g * g) - v[i]) * R(1.0 - B2)));
      double mh = R(div_s(R(u_t1 * m[i]), R(1.0 - up1)) + div_s(R(R(1.0 - u_t) * g), R(1.0 - up)));
      double vh = div_s(v[i], R(1.0 - b2p));
      nw = R(w[i] - R(R(mh * lr) / R(R(sqrt(vh)) + eps)));
      break;
    }
    default: { // Lion
      double B1 = R(b1), B2 = R(b2);
      double c = R(R(m[i] * B1) + R(g * R(1.0 - B1)));
      nw = R(w[i] - R(lr * sgn(c)));
      m[i] = R(R(m[i] * B2) + R(g * R(1.0 - B2)));
      break;
    }
    }
    w[i] = nw;
  }
}

Test(optim, sixteen_bit_others) {
  enum { N = 301 };
  static const char *const name[] = {"rmsprop", "adagrad", "adamax", "nadam", "lion"};
  for (rkind = KDRT_ROUND_BF16; rkind <= KDRT_ROUND_F16; rkind++)
    for (int which = 0; which < 5; which++) {
      float w[N], m[N], v[N], a[N], g[N];
      double dw[N], dm[N], dv[N], da[N], dg[N], du = 1.0;
      for (int i = 0; i < N; i++) {
        dw[i] = w[i] = kdrt_round_to(rkind, frand(-1, 1));
        dm[i] = m[i] = dv[i] = v[i] = da[i] = a[i] = 0;
        if (which == 1) dv[i] = v[i] = kdrt_round_to(rkind, 0.1f); // the first accumulator
      }
      kdrt_ctx c;
      memset(&c, 0, sizeof c);
      for (int64_t t = 1; t <= 3; t++) {
        for (int i = 0; i < N; i++) dg[i] = g[i] = frand(-0.5f, 0.5f) * (i % 7 ? 1 : 1e-3f);
        ref_opt16(which, dw, dg, dm, dv, da, N, 0.01, t, &du);
        switch (which) {
        case 0: kdrt_rmsprop16(w, g, v, m, a, N, 0.01f, 0.9f, 0.5f, 1e-7f, 0, rkind); break;
        case 1: kdrt_adagrad16(w, g, v, N, 0.01f, 1e-7f, 0, rkind); break;
        case 2: kdrt_adamax16(w, g, m, v, N, 0.01f, 0.9f, 0.99f, 1e-7f, 0, t, rkind); break;
        case 3:
          kdrt_nadam16(w, g, m, v, N, 0.01f, 0.9f, 0.99f, 1e-7f, 0, t,
                       kdrt_nadam_product16(&c, 0.9f, t, rkind), rkind);
          break;
        default: kdrt_lion16(w, g, m, N, 0.01f, 0.9f, 0.99f, 0, rkind); break;
        }
      }
      int bad = 0, not16 = 0;
      for (int i = 0; i < N; i++) {
        bad += w[i] != (float)dw[i] || m[i] != (float)dm[i] || v[i] != (float)dv[i] ||
               a[i] != (float)da[i];
        not16 += w[i] != kdrt_round_to(rkind, w[i]);
      }
      cr_expect_eq(bad, 0, "%s %s: %d of %d elements differ from the reference (w[0] %.9g, "
                   "ref %.9g)", name[which], rkind == KDRT_ROUND_F16 ? "float16" : "bfloat16",
                   bad, N, w[0], dw[0]);
      cr_expect_eq(not16, 0, "%s: weights not 16-bit values", name[which]);
    }
  rkind = KDRT_ROUND_BF16;
  // weight decay first, in 16 bits (base_optimizer's): a zero gradient and
  // Lion's zero momentum leave w - w * bf16(.5) * bf16(.1) = 243/256
  float w = 1, m = 0, zero = 0;
  kdrt_lion16(&w, &zero, &m, 1, 0.1f, 0.9f, 0.99f, 0.5f, KDRT_ROUND_BF16);
  cr_expect_eq(w, 0.94921875f, "%.9g", w);
}

// issue 23: clipnorm, global_clipnorm in 16 bits: the factor from the sum of
// the rounded squares, then the gradient (a reference from Keras's
// _clip_by_norm and clip_by_global_norm, as above).
Test(optim, sixteen_bit_clip) {
  enum { N = 97 };
  rkind = KDRT_ROUND_BF16;
  float g[N], f;
  double dg[N], s = 0;
  for (int global = 0; global <= 1; global++) {
    s = 0;
    for (int i = 0; i < N; i++) {
      dg[i] = g[i] = kdrt_round_to(rkind, frand(-1, 1));
      s += R(dg[i] * dg[i]); // (the kernel's sum is float32: these are exact enough)
    }
    float fs = (float)s;
    kdrt_grad_clip_factor16(&f, &fs, 1.5f, global, rkind);
    double l2 = R(fs), norm = R(sqrt(l2)), c = R(1.5), k;
    k = global ? R(R(c * fmin(R(1.0 / norm), R(1.0 / 1.5))) + R(norm - norm)) : fmax(norm, c);
    cr_expect_eq(f, (float)k, "global %d: factor %.9g, ref %.9g", global, f, k);
    cr_expect(global ? f < 1.0f : f > 1.5f, "the norm (%.9g) is above 1.5: clipped", f);
    kdrt_clip_grad16(g, N, &f, global ? 0.0f : 1.5f, rkind);
    int bad = 0;
    for (int i = 0; i < N; i++)
      bad += g[i] != (float)(global ? R(dg[i] * k) : R(R(dg[i] * c) / k));
    cr_expect_eq(bad, 0, "global %d: %d gradients differ", global, bad);
  }
  // a zero gradient: clipnorm's norm is 0 (no NaN), the gradient stays 0
  float zero = 0, s0 = 0;
  kdrt_grad_clip_factor16(&f, &s0, 1.0f, 0, rkind);
  kdrt_clip_grad16(&zero, 1, &f, 1.0f, rkind);
  cr_expect_eq(zero, 0.0f);
}

Test(optim, rmsprop) {
  // rho .9, eps 1e-7 (inside the sqrt).
  // t=1: v = .1, inc = .1 / sqrt(.1000001) = .3162276 -> w = .6837724
  // t=2: v = .09 + .4 = .49, inc = .2 / sqrt(.4900001) = .2857143 -> w = .3980581
  float w = 1, v = 0, m = 0, g1 = 1, g2 = 2;
  kdrt_rmsprop(&w, &g1, &v, NULL, NULL, 1, 0.1f, 0.9f, 0, 1e-7f);
  cr_expect_float_eq(w, 0.6837724f, 2e-6);
  kdrt_rmsprop(&w, &g2, &v, NULL, NULL, 1, 0.1f, 0.9f, 0, 1e-7f);
  cr_expect_float_eq(v, 0.49f, 1e-6);
  cr_expect_float_eq(w, 0.3980581f, 2e-6);
  // momentum .5: m1 = .3162276 -> w .6837724; m2 = .1581138 + .2857143 = .4438281
  // -> w = .2399443
  w = 1, v = 0;
  kdrt_rmsprop(&w, &g1, &v, &m, NULL, 1, 0.1f, 0.9f, 0.5f, 1e-7f);
  kdrt_rmsprop(&w, &g2, &v, &m, NULL, 1, 0.1f, 0.9f, 0.5f, 1e-7f);
  cr_expect_float_eq(m, 0.4438281f, 2e-6);
  cr_expect_float_eq(w, 0.2399443f, 2e-6);
}

// ---------------------------------------------------------------- elementwise and bias

Test(act, relu_keeps_nan_and_bias_act_is_act_of_bias_add) {
  float x[3] = {NAN, -1.0f, 2.0f}, y[3];
  kdrt_act(KDRT_ACT_RELU, y, x, 3);
  cr_expect(isnan(y[0]) && y[1] == 0.0f && y[2] == 2.0f);
  // bias_act(in, b) == act(in + b) for every activation, bit for bit.
  const int64_t rows = 9, cols = 13;
  const size_t n = (size_t)(rows * cols);
  float *in = rand_buf(n, -4, 4), *b = rand_buf((size_t)cols, -1, 1);
  float *sum = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
  float *got = malloc(n * sizeof(float));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++)
      sum[r * cols + j] = in[r * cols + j] + b[j];
  for (int act = 0; act < KDRT_ACT_COUNT; act++) {
    kdrt_act(act, want, sum, n);
    kdrt_bias_act(act, got, in, b, rows, cols);
    cr_expect(memcmp(got, want, n * sizeof(float)) == 0, "bias_act %d differs from act", act);
  }
  // bias_grad: column sums.
  kdrt_bias_grad(got, in, rows, cols);
  for (int64_t j = 0; j < cols; j++) {
    double s = 0;
    for (int64_t r = 0; r < rows; r++)
      s += in[r * cols + j];
    cr_expect(fabs(got[j] - s) < 1e-5, "bias_grad[%lld] = %g, want %g", (long long)j, got[j], s);
  }
  free(in), free(b), free(sum), free(want), free(got);
}

Test(elementwise, add_mul_scale_copy) {
  float a[5] = {1, -2, 3.5f, 0, 8}, b[5] = {2, 2, -1, 7, 0.5f}, c[5] = {0.25f, 1, 1, 1, -8};
  float out[5];
  const float *ins[3] = {a, b, c};
  kdrt_add(out, ins, 3, 5);
  for (int i = 0; i < 5; i++)
    cr_expect(out[i] == (a[i] + b[i]) + c[i], "add[%d] = %g", i, out[i]);
  kdrt_add(out, ins, 2, 5);
  for (int i = 0; i < 5; i++)
    cr_expect(out[i] == a[i] + b[i]);
  kdrt_mul(out, a, b, 5);
  const float prod[5] = {2, -4, -3.5f, 0, 4};
  for (int i = 0; i < 5; i++)
    cr_expect(out[i] == prod[i], "mul[%d] = %g", i, out[i]);
  kdrt_scale(out, a, 5, 2.0f, -1.0f);
  const float sc[5] = {1, -5, 6, -1, 15};
  for (int i = 0; i < 5; i++)
    cr_expect(out[i] == sc[i], "scale[%d] = %g", i, out[i]);
  const float odd[3] = {INFINITY, -INFINITY, NAN}; // penalty * 0 + 1 of an overflowed penalty
  kdrt_scale(out, odd, 3, 0.0f, 1.0f);
  for (int i = 0; i < 3; i++)
    cr_expect(out[i] == 1.0f, "scale by 0 of %g = %g", odd[i], out[i]);
  kdrt_copy(out, c, 5);
  cr_expect(memcmp(out, c, sizeof c) == 0);
  kdrt_mul(a, a, a, 5); // in place
  cr_expect(a[1] == 4.0f && a[2] == 12.25f);
}

// ---------------------------------------------------------------- matmul

// c = alpha * op(a) @ op(b) + beta * c0 for one matrix, in double.
static void gemm_naive(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       const float *c0, double *c, int64_t ldc) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++)
        s += (double)(ta ? a[k * lda + i] : a[i * lda + k]) * (tb ? b[j * ldb + k] : b[k * ldb + j]);
      c[i * ldc + j] = alpha * s + (double)beta * c0[i * ldc + j];
    }
}

Test(matmul, batched_strided_transposed_alpha_beta) {
  // ta tb batch M N K share_a share_b alpha beta
  static const struct {
    int ta, tb;
    int64_t batch, M, N, K;
    int share_a, share_b;
    float alpha, beta;
  } cases[] = {
      {0, 0, 1, 7, 5, 3, 0, 0, 1, 0},     {1, 0, 1, 7, 5, 3, 0, 0, 1, 0},
      {0, 1, 1, 7, 5, 3, 0, 0, 1, 0},     {1, 1, 1, 7, 5, 3, 0, 0, 1, 0},
      {0, 0, 4, 6, 5, 7, 0, 0, 1, 0},     {0, 1, 3, 6, 5, 7, 0, 1, 0.5f, 1},  // shared b (weight)
      {1, 0, 3, 4, 9, 2, 1, 0, -2, 0.25f}, {1, 1, 2, 5, 4, 6, 0, 0, 1, 1},
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    int ta = cases[t].ta, tb = cases[t].tb;
    int64_t B = cases[t].batch, M = cases[t].M, N = cases[t].N, K = cases[t].K;
    int64_t lda = ta ? M : K, ldb = tb ? K : N;
    kdrt_gemm g = {ta, tb, B, M, N, K, lda, ldb, N, cases[t].share_a ? 0 : M * K,
                   cases[t].share_b ? 0 : K * N, M * N};
    size_t na = (size_t)((cases[t].share_a ? 1 : B) * M * K);
    size_t nb = (size_t)((cases[t].share_b ? 1 : B) * K * N), nc = (size_t)(B * M * N);
    float *a = rand_buf(na, -1, 1), *b = rand_buf(nb, -1, 1), *c = rand_buf(nc, -1, 1);
    float *c0 = malloc(nc * sizeof(float));
    double *want = malloc(nc * sizeof(double));
    memcpy(c0, c, nc * sizeof(float));
    for (int64_t i = 0; i < B; i++)
      gemm_naive(ta, tb, M, N, K, cases[t].alpha, a + i * g.stride_a, lda, b + i * g.stride_b,
                 ldb, cases[t].beta, c0 + i * M * N, want + i * M * N, N);
    kdrt_matmul(&g, cases[t].alpha, a, b, cases[t].beta, c);
    cr_expect(max_abs_diff(c, want, nc) < 1e-5, "case %zu: off by %g", t,
              max_abs_diff(c, want, nc));
    free(a), free(b), free(c), free(c0), free(want);
  }
}

// issue 22: a product with its bias (and activation), or with the bias
// gradient of its b (dy), is the separate ops' arithmetic, bit for bit.
Test(matmul, with_bias_is_matmul_then_bias_act_or_bias_grad) {
  enum { M = 7, N = 5, K = 300 };
  static float a[K * M], b[K * N], bias[N], c[M * N], ref[M * N], db[N], dref[N];
  for (int i = 0; i < K * M; i++) a[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  for (int i = 0; i < K * N; i++) b[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
  for (int j = 0; j < N; j++) bias[j] = 0.25f * (float)j - 0.5f;
  const kdrt_gemm f = {KDRT_NOTRANS, KDRT_NOTRANS, 1, M, N, K, K, N, N, 0, 0, 0};
  const int acts[] = {KDRT_ACT_LINEAR, KDRT_ACT_RELU, KDRT_ACT_GELU_TANH};
  for (int t = 0; t < 3; t++) {
    kdrt_matmul(&f, 1.0f, a, b, 0.0f, ref);
    kdrt_bias_act(acts[t], ref, ref, bias, M, N);
    kdrt_matmul_bias(&f, acts[t], a, b, bias, c, NULL);
    cr_assert(!memcmp(c, ref, sizeof c), "act %d", acts[t]);
  }
  const kdrt_gemm w = {KDRT_TRANS, KDRT_NOTRANS, 1, M, N, K, M, N, N, 0, 0, 0}; // a^T b
  kdrt_matmul(&w, 1.0f, a, b, 0.0f, ref);
  kdrt_bias_grad(dref, b, K, N);
  kdrt_matmul_bias(&w, KDRT_ACT_LINEAR, a, b, NULL, c, db);
  cr_assert(!memcmp(c, ref, sizeof c) && !memcmp(db, dref, sizeof db));
}

// issue 23: products of 16-bit values. Operands rounded to bfloat16 or
// float16, each given in its 16 bits, as float32 values of the type, or as
// the float32 values before rounding (KDRT_OPND_ROUND: the product rounds
// them), batched, transposed, with K large enough (300) that the order of
// the sums shows. Against kdrt_matmul on the rounded values: bit for bit
// with KDRT_GEMM16=0 (the operands widened for OpenBLAS), and within
// float32 sums' reassociation (and of the naive double product) on the
// default path (oneDNN's bf16 matmul where the CPU has it). Both paths in
// the scratch given, exactly kdrt_matmul16_scratch floats (the memory
// plan's): a guard after it stays untouched, and nothing as large as the
// larger operand's 16-bit copy is allocated (every block malloc gives, watched).
Test(matmul, sixteen_bit_operands) {
  static const struct {
    int ta, tb;
    int64_t batch, M, N, K;
  } cases[] = {{0, 0, 1, 37, 29, 300}, {1, 0, 2, 19, 33, 300}, {0, 1, 3, 40, 17, 129},
               {1, 1, 1, 64, 64, 256}, {0, 0, 1, 300, 8, 64}};
  static const int forms[][2] = {{KDRT_OPND_16, KDRT_OPND_EXACT}, {KDRT_OPND_EXACT, KDRT_OPND_16},
                                 {KDRT_OPND_16, KDRT_OPND_16},    {KDRT_OPND_ROUND, KDRT_OPND_16},
                                 {KDRT_OPND_EXACT, KDRT_OPND_ROUND}};
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++)
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++)
      for (size_t f = 0; f < sizeof forms / sizeof *forms; f++) {
        int ta = cases[t].ta, tb = cases[t].tb, fa = forms[f][0], fb = forms[f][1];
        int64_t B = cases[t].batch, M = cases[t].M, N = cases[t].N, K = cases[t].K;
        kdrt_gemm g = {ta, tb, B, M, N, K, ta ? M : K, tb ? K : N, N, M * K, K * N, M * N};
        size_t na = (size_t)(B * M * K), nb = (size_t)(B * K * N), nc = (size_t)(B * M * N);
        float *a0 = rand_buf(na, -2, 2), *b0 = rand_buf(nb, -2, 2);
        float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float));
        float *ref = malloc(nc * sizeof(float)), *c = malloc(nc * sizeof(float));
        double *want = malloc(nc * sizeof(double));
        uint16_t *pa = malloc(na * 2), *pb = malloc(nb * 2);
        kdrt_round(kind, a, a0, na);
        kdrt_round(kind, b, b0, nb);
        kdrt_pack16(kind, pa, a, na);
        kdrt_pack16(kind, pb, b, nb);
        const void *ua = fa == KDRT_OPND_16 ? (const void *)pa : fa == KDRT_OPND_ROUND ? a0 : a;
        const void *ub = fb == KDRT_OPND_16 ? (const void *)pb : fb == KDRT_OPND_ROUND ? b0 : b;
        kdrt_matmul(&g, 1.0f, a, b, 0.0f, ref);
        for (int64_t i = 0; i < B; i++)
          gemm_naive(ta, tb, M, N, K, 1.0f, a + i * M * K, g.lda, b + i * K * N, g.ldb, 0.0f,
                     ref, want + i * M * N, N);
        enum { GUARD = 64 };
        size_t ns = (size_t)kdrt_matmul16_scratch(&g, fa, fb);
        float *sc = malloc((ns + GUARD) * sizeof(float));
        for (size_t i = 0; i < ns + GUARD; i++) sc[i] = -7.0f;
        size_t widened = (na > nb ? na : nb) * sizeof(uint16_t), big[2]; // the larger one's
        setenv("KDRT_GEMM16", "0", 1);
        watch_malloc(1);
        kdrt_matmul16(&g, kind, fa, ua, fb, ub, c, sc);
        watch_malloc(0);
        big[0] = largest;
        unsetenv("KDRT_GEMM16");
        cr_expect(!memcmp(c, ref, nc * sizeof(float)),
                  "kind %d case %zu form %zu: KDRT_GEMM16=0 is not matmul's bits", kind, t, f);
        for (size_t i = 0; i < nc; i++) c[i] = NAN;
        watch_malloc(1);
        kdrt_matmul16(&g, kind, fa, ua, fb, ub, c, sc);
        watch_malloc(0);
        big[1] = largest;
        int guard = 1;
        for (size_t i = ns; i < ns + GUARD; i++) guard &= sc[i] == -7.0f;
        cr_expect(guard, "kind %d case %zu form %zu: wrote past its %zu floats of scratch", kind,
                  t, f, ns);
        cr_expect(big[0] < widened && big[1] < widened,
                  "kind %d case %zu form %zu: a block of %zu (%zu) bytes allocated, the larger "
                  "operand's 16-bit copy %zu or more", kind, t, f, big[0], big[1], widened);
        free(sc);
        double worst = 0, naive = max_abs_diff(c, want, nc);
        for (size_t i = 0; i < nc; i++) {
          double d = fabs((double)c[i] - ref[i]);
          worst = d > worst || isnan(d) ? d : worst;
        }
        // |terms| <= 4: float32 sums of K of them differ by a few ulps of K * 4
        cr_expect(worst <= 1e-5 * K && naive <= 1e-5 * K,
                  "kind %d case %zu form %zu: off matmul by %g, the exact product by %g", kind, t,
                  f, worst, naive);
        free(a0), free(b0), free(a), free(b), free(ref), free(c), free(want), free(pa), free(pb);
      }
}

// issue 23: convolutions of 16-bit values (kdrt_conv2d16): x, f and dy
// rounded to bfloat16 or float16, each given in its 16 bits or as float32
// values of the type, in windows that pad, stride, dilate, group and are
// pointwise, with batches whose rows the input gradient cuts into chunks
// unevenly. Each pass within float32 sums' reassociation of the float32
// conv on the same values; the scratch exactly kdrt_conv16_scratch floats
// (the memory plan's) and its products' buffer, kdrt_conv16_widen floats:
// a guard after each stays untouched, on oneDNN's bfloat16 path and with
// KDRT_GEMM16=0 (the operands widened, in that buffer); dx overwritten.
Test(conv2d, sixteen_bit_operands) {
  conv_shape shapes[] = {conv_make(3, 7, 5, 6, 3, 3, 8, 1, 1, 1), conv_make(2, 9, 9, 4, 3, 2, 5, 2, 2, 1),
                         conv_make(3, 5, 6, 8, 1, 1, 7, 1, 1, 0), conv_dilated(2, 8, 7, 3, 3, 3, 4, 2, 2, 1),
                         conv_make(2, 6, 6, 8, 3, 3, 4, 1, 1, 0)};
  shapes[4].G = 2;
  static const int forms[][2] = {{KDRT_OPND_16, KDRT_OPND_16}, {KDRT_OPND_EXACT, KDRT_OPND_EXACT},
                                 {KDRT_OPND_16, KDRT_OPND_EXACT}};
  enum { GUARD = 64 };
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++)
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
      const conv_shape s = shapes[si];
      const kdrt_window w = window_of(&s);
      float *x = rand_buf(xs(&s), -1, 1), *f = rand_buf(fs(&s), -1, 1), *dy = rand_buf(ys(&s), -1, 1);
      kdrt_round(kind, x, x, xs(&s)), kdrt_round(kind, f, f, fs(&s)), kdrt_round(kind, dy, dy, ys(&s));
      uint16_t *px = malloc(xs(&s) * 2), *pf = malloc(fs(&s) * 2), *pdy = malloc(ys(&s) * 2);
      kdrt_pack16(kind, px, x, xs(&s)), kdrt_pack16(kind, pf, f, fs(&s)), kdrt_pack16(kind, pdy, dy, ys(&s));
      float *sc = malloc(ss(&s) * sizeof(float));
      float *ref[3] = {malloc(ys(&s) * 4), malloc(xs(&s) * 4), malloc(fs(&s) * 4)};
      kdrt_conv2d(&w, ref[0], x, f, sc);
      kdrt_conv2d_dx(&w, ref[1], dy, f, sc);
      kdrt_conv2d_dw(&w, ref[2], x, dy, sc);
      const size_t nout[3] = {ys(&s), xs(&s), fs(&s)};
      const int terms[3] = {s.KH * s.KW * s.C / gs(&s), s.K, s.B * s.OH * s.OW};
      for (size_t fi = 0; fi < sizeof forms / sizeof *forms; fi++)
        for (int pass = KDRT_CONV_Y, widen = 0; pass <= KDRT_CONV_DW; widen = !widen, pass += !widen) {
          int fa = forms[fi][0], fb = forms[fi][1];
          const float *a32 = pass == KDRT_CONV_DX ? dy : x, *b32 = pass == KDRT_CONV_DW ? dy : f;
          const uint16_t *a16 = pass == KDRT_CONV_DX ? pdy : px, *b16 = pass == KDRT_CONV_DW ? pdy : pf;
          int64_t part[KDRT_C16_PARTS];
          size_t n = (size_t)kdrt_conv16_scratch(&w, pass, fa, fb, part);
          size_t nw = (size_t)kdrt_conv16_widen(&w, pass, fb);
          float *scratch = malloc((n + GUARD) * sizeof(float)), *out = malloc(nout[pass] * 4);
          float *wide = malloc((nw + GUARD) * sizeof(float));
          for (size_t i = 0; i < n + GUARD; i++) scratch[i] = -7.0f;
          for (size_t i = 0; i < nw + GUARD; i++) wide[i] = -7.0f;
          for (size_t i = 0; i < nout[pass]; i++) out[i] = 1e3f;
          if (widen) setenv("KDRT_GEMM16", "0", 1);
          kdrt_conv2d16(&w, pass, kind, fa, fa == KDRT_OPND_16 ? (const void *)a16 : a32, fb,
                        fb == KDRT_OPND_16 ? (const void *)b16 : b32, out, scratch, wide);
          unsetenv("KDRT_GEMM16");
          double worst = 0;
          for (size_t i = 0; i < nout[pass]; i++) {
            double d = fabs((double)out[i] - ref[pass][i]);
            worst = d > worst || isnan(d) ? d : worst;
          }
          int guard = 1;
          for (size_t i = n; i < n + GUARD; i++) guard &= scratch[i] == -7.0f;
          for (size_t i = nw; i < nw + GUARD; i++) guard &= wide[i] == -7.0f;
          cr_expect(worst <= 1e-6 * terms[pass] + 1e-6, "kind %d shape %zu forms %zu pass %d: off by %g",
                    kind, si, fi, pass, worst);
          cr_expect(guard, "kind %d shape %zu forms %zu pass %d widen %d: wrote past its %zu "
                    "floats of scratch", kind, si, fi, pass, widen, n);
          free(scratch), free(wide), free(out);
        }
      free(x), free(f), free(dy), free(px), free(pf), free(pdy), free(sc);
      free(ref[0]), free(ref[1]), free(ref[2]);
    }
}

// issue 23: an activation's gradient from the saved x or y in its 16 bits
// is act_grad on the widened values, bit for bit; round16 is round's value
// in its 16 bits.
Test(ops, act_grad16_and_round16) {
  enum { n = 5000 }; // more than one of act_grad16's blocks, and a tail
  static float x[n], y[n], dy[n], ref[n], dx[n];
  static uint16_t p[n], q[n];
  const int acts[] = {KDRT_ACT_RELU, KDRT_ACT_GELU, KDRT_ACT_SIGMOID, KDRT_ACT_TANH};
  const int from_x[] = {0, 1, 0, 0}; // kdrt_defs.h's list: which one each derivative reads
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    for (int i = 0; i < n; i++) x[i] = frand(-4, 4), dy[i] = frand(-1, 1);
    kdrt_round16(kind, q, x, n);
    kdrt_round(kind, x, x, n);
    kdrt_pack16(kind, p, x, n);
    cr_expect(!memcmp(p, q, sizeof p), "kind %d: round16 is not round then pack16", kind);
    for (int t = 0; t < 4; t++) {
      kdrt_act(acts[t], y, x, n);
      kdrt_round(kind, y, y, n);
      kdrt_pack16(kind, q, y, n);
      kdrt_act_grad(acts[t], ref, dy, x, y, n);
      for (int i = 0; i < n; i++) dx[i] = NAN;
      kdrt_act_grad16(acts[t], kind, dx, dy, from_x[t] ? p : q, n);
      cr_expect(!memcmp(dx, ref, sizeof dx), "kind %d act %d: act_grad16 is not act_grad's bits",
                kind, acts[t]);
    }
  }
}

// issues 22, 23: each _rnd kernel (a ROUND folded into it, kdcc's
// fuse_rounds) is its plain kernel then kdrt_round, bit for bit, for both
// types, on values over float16's range (subnormals, overflow) and in
// place; a large enough n for the OpenMP loops, and a tail.
static void expect_rounded(const char *what, int kind, const float *got, float *plain, size_t n) {
  kdrt_round(kind, plain, plain, n);
  cr_expect(!memcmp(got, plain, n * sizeof *got), "%s, kind %d: not the kernel then round",
            what, kind);
}

Test(ops, rnd_kernels_are_kernel_then_round) {
  enum { R = 301, C = 67, n = R * C };
  static float x[n], b[n], dy[n], g[C], bias[C], y[n], p[n];
  static uint16_t v[n];
  for (int i = 0; i < n; i++)
    x[i] = ldexpf(frand(-4, 4), i % 40 - 24), b[i] = frand(-1, 1), dy[i] = frand(-1, 1);
  for (int j = 0; j < C; j++) g[j] = frand(0.5f, 1.5f), bias[j] = frand(-1, 1);
  const int acts[] = {KDRT_ACT_LINEAR, KDRT_ACT_RELU, KDRT_ACT_GELU, KDRT_ACT_TANH};
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    const float *in[3] = {x, b, dy};
    kdrt_add_rnd(kind, y, in, 2, n);
    kdrt_add(p, in, 2, n);
    expect_rounded("add", kind, y, p, n);
    kdrt_add_rnd(kind, y, in, 3, n);
    kdrt_add(p, in, 3, n);
    expect_rounded("add of 3", kind, y, p, n);
    for (int t = 0; t < 4; t++) {
      kdrt_act_rnd(kind, acts[t], y, x, n);
      kdrt_act(acts[t], p, x, n);
      expect_rounded("act", kind, y, p, n);
      kdrt_bias_act_rnd(kind, acts[t], y, x, bias, R, C);
      kdrt_bias_act(acts[t], p, x, bias, R, C);
      expect_rounded("bias_act", kind, y, p, n);
      kdrt_act_grad_rnd(kind, acts[t], y, dy, x, b, n);
      kdrt_act_grad(acts[t], p, dy, x, b, n);
      expect_rounded("act_grad", kind, y, p, n);
      kdrt_round(kind, p, x, n);
      kdrt_pack16(kind, v, p, n);
      kdrt_act_grad16_rnd(kind, acts[t], kind, y, dy, v, n);
      kdrt_act_grad16(acts[t], kind, p, dy, v, n);
      expect_rounded("act_grad16", kind, y, p, n);
    }
    memcpy(y, x, sizeof y); // in place
    kdrt_act_rnd(kind, KDRT_ACT_GELU, y, y, n);
    kdrt_act(KDRT_ACT_GELU, p, x, n);
    expect_rounded("act in place", kind, y, p, n);
    for (int rms = 0; rms < 2; rms++) {
      kdrt_layer_norm_rnd(kind, rms, y, b, g, rms ? NULL : bias, R, C, 1e-3f);
      kdrt_layer_norm(rms, p, b, g, rms ? NULL : bias, R, C, 1e-3f);
      expect_rounded("layer_norm", kind, y, p, n);
    }
    kdrt_bias_grad_rnd(kind, y, x, R, C);
    kdrt_bias_grad(p, x, R, C);
    expect_rounded("bias_grad", kind, y, p, C);
  }
}

// ---------------------------------------------------------------- layout changes

// out index -> in index through perm, one element at a time.
static void transpose_naive(float *out, const float *in, int rank, const int64_t *shape,
                            const int *perm) {
  int64_t oshape[KDRT_MAX_RANK], oidx[KDRT_MAX_RANK], iidx[KDRT_MAX_RANK], n = 1;
  for (int i = 0; i < rank; i++)
    oshape[i] = shape[perm[i]], n *= shape[i];
  for (int64_t e = 0; e < n; e++) {
    int64_t rest = e;
    for (int i = rank - 1; i >= 0; i--)
      oidx[i] = rest % oshape[i], rest /= oshape[i];
    for (int i = 0; i < rank; i++)
      iidx[perm[i]] = oidx[i];
    int64_t src = 0;
    for (int d = 0; d < rank; d++)
      src = src * shape[d] + iidx[d];
    out[e] = in[src];
  }
}

Test(layout, transpose_rank_3_and_4) {
  static const struct {
    int rank;
    int64_t shape[4];
    int perm[4];
  } cases[] = {
      {2, {5, 7}, {1, 0}},          {3, {2, 3, 4}, {0, 2, 1}},    {3, {2, 3, 4}, {2, 0, 1}},
      {3, {2, 3, 4}, {1, 2, 0}},    {3, {2, 3, 4}, {0, 1, 2}},    {4, {2, 3, 4, 5}, {0, 2, 1, 3}},
      {4, {2, 3, 4, 5}, {3, 1, 0, 2}}, {4, {2, 3, 4, 5}, {1, 3, 2, 0}},
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    size_t n = 1;
    for (int d = 0; d < cases[t].rank; d++)
      n *= (size_t)cases[t].shape[d];
    float *in = rand_buf(n, -1, 1), *got = malloc(n * sizeof(float));
    float *want = malloc(n * sizeof(float));
    transpose_naive(want, in, cases[t].rank, cases[t].shape, cases[t].perm);
    kdrt_transpose(got, in, cases[t].rank, cases[t].shape, cases[t].perm);
    cr_expect(memcmp(got, want, n * sizeof(float)) == 0, "case %zu differs", t);
    free(in), free(got), free(want);
  }
  // A known one: [2, 3] -> [3, 2].
  const float in[6] = {0, 1, 2, 3, 4, 5}, want[6] = {0, 3, 1, 4, 2, 5};
  const int64_t shape[2] = {2, 3};
  const int perm[2] = {1, 0};
  float out[6];
  kdrt_transpose(out, in, 2, shape, perm);
  cr_expect(memcmp(out, want, sizeof out) == 0);
}

Test(layout, reduce_sum_and_broadcast) {
  const int64_t outer = 3, mid = 4, inner = 5;
  const size_t nbig = (size_t)(outer * mid * inner), nsmall = (size_t)(outer * inner);
  float *big = rand_buf(nbig, -1, 1), *small = malloc(nsmall * sizeof(float));
  float *back = malloc(nbig * sizeof(float));
  kdrt_reduce_sum(small, big, outer, mid, inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      double s = 0;
      for (int64_t m = 0; m < mid; m++)
        s += big[(o * mid + m) * inner + i];
      cr_expect(fabs(small[o * inner + i] - s) < 1e-6, "reduce_sum[%lld,%lld]", (long long)o,
                (long long)i);
    }
  kdrt_broadcast(back, small, outer, mid, inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t m = 0; m < mid; m++)
      for (int64_t i = 0; i < inner; i++)
        cr_expect(back[(o * mid + m) * inner + i] == small[o * inner + i]);
  // Reducing over the first (outer 1) and the last (inner 1) dim.
  const float x[6] = {1, 2, 3, 4, 5, 6}; // [2, 3]
  float r[3];
  kdrt_reduce_sum(r, x, 1, 2, 3);
  cr_expect(r[0] == 5 && r[1] == 7 && r[2] == 9);
  kdrt_reduce_sum(r, x, 2, 3, 1);
  cr_expect(r[0] == 6 && r[1] == 15);
  free(big), free(small), free(back);
}

// ---------------------------------------------------------------- embeddings

Test(embedding, gather_and_scatter_add_on_a_row_block) {
  // A vocab of 10 rows split in blocks; this one holds rows [4, 8).
  const int64_t rows = 4, cols = 3, row0 = 4;
  float table[12];
  for (int i = 0; i < 12; i++)
    table[i] = (float)(100 + i);
  const int32_t ids[7] = {5, 0, 7, 8, 4, 5, -1};
  const int64_t n = 7;
  float out[21];
  for (int i = 0; i < 21; i++)
    out[i] = 99; // must be overwritten
  kdrt_gather(out, table, ids, n, rows, cols, row0);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < cols; j++) {
      int64_t r = ids[i] - row0;
      float want = r >= 0 && r < rows ? table[r * cols + j] : 0.0f;
      cr_expect(out[i * cols + j] == want, "gather[%lld,%lld] = %g, want %g", (long long)i,
                (long long)j, out[i * cols + j], want);
    }
  float dy[21], dt[12];
  for (int i = 0; i < 21; i++)
    dy[i] = (float)(i + 1);
  for (int i = 0; i < 12; i++)
    dt[i] = -7; // overwritten, not accumulated
  kdrt_scatter_add(dt, dy, ids, n, rows, cols, row0);
  // row 4 (local 0) <- dy[4]; row 5 (local 1) <- dy[0] + dy[5]; row 6: nothing;
  // row 7 (local 3) <- dy[2]; ids 0, 8, -1 belong to no row here.
  for (int64_t j = 0; j < cols; j++) {
    cr_expect(dt[0 * cols + j] == dy[4 * cols + j]);
    cr_expect(dt[1 * cols + j] == dy[0 * cols + j] + dy[5 * cols + j]);
    cr_expect(dt[2 * cols + j] == 0.0f);
    cr_expect(dt[3 * cols + j] == dy[2 * cols + j]);
  }
}

// ---------------------------------------------------------------- split crossentropy

Test(xent, row_max_and_sumexp) {
  const int64_t rows = 4, cols = 9;
  float *x = rand_buf((size_t)(rows * cols), -20, 20), m[4], s[4];
  x[2 * cols + 8] = 50.0f;
  kdrt_row_max(m, x, rows, cols);
  kdrt_row_sumexp(s, x, m, rows, cols);
  for (int64_t r = 0; r < rows; r++) {
    double mm = -INFINITY, ss = 0;
    for (int64_t j = 0; j < cols; j++)
      mm = fmax(mm, x[r * cols + j]);
    for (int64_t j = 0; j < cols; j++)
      ss += exp(x[r * cols + j] - mm);
    cr_expect(m[r] == (float)mm, "row_max[%lld]", (long long)r);
    cr_expect(fabs(s[r] - ss) < 1e-5 * ss, "row_sumexp[%lld] = %g, want %g", (long long)r, s[r],
              ss);
  }
  cr_expect(m[2] == 50.0f);
  free(x);
}

// The class dim split in `parts` blocks as ranks would hold it: m and s
// all-reduced by hand, the losses and accuracies summed over blocks, the
// gradient blocks put side by side; all against the unsplit kernels.
static void check_split_xent(int64_t rows, int64_t V, int parts) {
  const double scale = 1.0 / 32;
  float *x = rand_buf((size_t)(rows * V), -6, 6), *y = malloc((size_t)rows * sizeof(float));
  for (int64_t r = 0; r < rows; r++)
    y[r] = (float)((int64_t)frand(0, (float)V) % V);
  y[1] = -1.0f;                                      // no class: 0 everywhere
  x[3 * V + (int64_t)y[3]] = 20.0f;                  // a sure hit for the accuracy
  x[5 * V + 0] = 20.0f, x[5 * V + 1] = 20.0f;        // a tie in one block, lost by the
  y[5] = 1.0f;                                       // label (the first maximum wins)
  x[6 * V + 0] = 20.0f, x[6 * V + 1] = 20.0f;        // the same tie, won
  y[6] = 0.0f;
  // (A tie between columns of different blocks is not seen by one block:
  // kdrt_sparse_xent_acc's documented limit; exact float ties are rare.)
  float full_loss, full_acc;
  full_loss = (float)loss_of(KDRT_LOSS_SCCE, 1, x, y, rows, V, scale);
  kdrt_accuracy(KDRT_LOSS_SCCE, 1, &full_acc, x, y, rows, V, scale);
  float *full_grad = malloc((size_t)(rows * V) * sizeof(float));
  grad_of(KDRT_LOSS_SCCE, 1, full_grad, x, y, rows, V, scale);

  const int64_t cols = V / parts;
  float *blk = malloc((size_t)(rows * cols) * sizeof(float));
  float *part = malloc((size_t)rows * sizeof(float));
  float *m = malloc((size_t)rows * sizeof(float)), *s = malloc((size_t)rows * sizeof(float));
  float *grad = malloc((size_t)(rows * V) * sizeof(float));
  for (int64_t r = 0; r < rows; r++)
    m[r] = -INFINITY, s[r] = 0;
  for (int p = 0; p < parts; p++) { // all-reduce max
    kdrt_copy_block(blk, x, rows, V, p * cols, cols, 1);
    kdrt_row_max(part, blk, rows, cols);
    for (int64_t r = 0; r < rows; r++)
      m[r] = fmaxf(m[r], part[r]);
  }
  for (int p = 0; p < parts; p++) { // all-reduce sum
    kdrt_copy_block(blk, x, rows, V, p * cols, cols, 1);
    kdrt_row_sumexp(part, blk, m, rows, cols);
    for (int64_t r = 0; r < rows; r++)
      s[r] += part[r];
  }
  double loss = 0, acc = 0;
  for (int p = 0; p < parts; p++) {
    float l, a;
    kdrt_copy_block(blk, x, rows, V, p * cols, cols, 1);
    kdrt_sparse_xent(&l, blk, y, m, s, rows, cols, p * cols, scale);
    kdrt_sparse_xent_acc(&a, blk, y, m, rows, cols, p * cols, scale);
    loss += l, acc += a;
    kdrt_sparse_xent_grad(blk, blk, y, m, s, rows, cols, p * cols, scale); // in place
    kdrt_place_block(grad, blk, rows, cols, p * cols, V, 1);
  }
  cr_expect(fabs(loss - full_loss) < 1e-5 * fabs(full_loss) + 1e-6,
            "%d parts: loss %.9g, unsplit %.9g", parts, loss, full_loss);
  cr_expect(acc == full_acc, "%d parts: accuracy %g, unsplit %g", parts, acc, full_acc);
  double worst = 0;
  for (int64_t i = 0; i < rows * V; i++)
    worst = fmax(worst, fabs(grad[i] - full_grad[i]));
  cr_expect(worst < 1e-7, "%d parts: gradient off by %g", parts, worst);
  for (int64_t j = 0; j < V; j++)
    cr_expect(grad[1 * V + j] == 0.0f, "no-class row: gradient %g", grad[1 * V + j]);
  free(x), free(y), free(full_grad), free(blk), free(part), free(m), free(s), free(grad);
}

Test(xent, split_over_column_blocks_equals_unsplit) {
  check_split_xent(11, 24, 1);
  check_split_xent(11, 24, 2);
  check_split_xent(11, 24, 4);
  check_split_xent(7, 1000, 4);
}

// issue 22: the fused classifier against the chain it replaces (row_max,
// row_sumexp, sparse_xent(_w), sparse_xent_acc(_w), sparse_xent_grad(_w),
// then round for rnd), bit for bit: loss, accuracy and every gradient
// element; with and without sample weights (the accuracy's own or none),
// rounded to bfloat16 or not, without a gradient (evaluation), in place.
static void check_fused_xent(int64_t rows, int64_t V, int weighted, int acc_weighted, int rnd) {
  const double scale = 1.0 / 37, ascale = 1.0 / 41, gscale = 3.0 / 37;
  float *x = rand_buf((size_t)(rows * V), -6, 6), *y = malloc((size_t)rows * sizeof(float));
  float *w = rand_buf((size_t)rows, 0, 2);
  for (int64_t r = 0; r < rows; r++)
    y[r] = (float)((int64_t)frand(0, (float)V) % V);
  y[1] = -1.0f;                                             // no class: 0 everywhere
  y[2] = (float)V;                                          // past the classes: no loss
  x[3 * V + (int64_t)y[3]] = 20.0f;                         // a sure hit
  x[5 * V + 0] = 20.0f, x[5 * V + 1] = 20.0f, y[5] = 1.0f;  // a tie, lost
  x[6 * V + 0] = 20.0f, x[6 * V + 1] = 20.0f, y[6] = 0.0f;  // a tie, won
  const float *wl = weighted ? w : NULL, *wa = acc_weighted ? w : NULL;
  float *m = malloc((size_t)rows * sizeof(float)), *s = malloc((size_t)rows * sizeof(float));
  float *g0 = malloc((size_t)(rows * V) * sizeof(float));
  float *g1 = malloc((size_t)(rows * V) * sizeof(float));
  float l0, a0, l1, a1 = -1, l2, a2 = -1;
  kdrt_row_max(m, x, rows, V);
  kdrt_row_sumexp(s, x, m, rows, V);
  kdrt_sparse_xent_w(&l0, x, y, m, s, wl, rows, V, 0, scale);
  if (wa) kdrt_sparse_xent_acc_w(&a0, x, y, m, wa, rows, V, 0, ascale);
  else kdrt_sparse_xent_acc(&a0, x, y, m, rows, V, 0, ascale);
  kdrt_sparse_xent_grad_w(g0, x, y, m, s, wl, rows, V, 0, gscale);
  if (rnd) kdrt_round(rnd, g0, g0, (size_t)(rows * V));
  kdrt_sparse_xent_fused_rnd(rnd, &l1, &a1, g1, x, y, wl, wa, rows, V, scale, ascale, gscale);
  cr_expect(!memcmp(&l1, &l0, sizeof l0), "[%lld, %lld]: loss %.9g, the chain's %.9g",
            (long long)rows, (long long)V, l1, l0);
  cr_expect(!memcmp(&a1, &a0, sizeof a0), "accuracy %.9g, the chain's %.9g", a1, a0);
  int64_t diff = 0;
  for (int64_t i = 0; i < rows * V; i++) diff += memcmp(&g1[i], &g0[i], sizeof *g0) != 0;
  cr_expect(diff == 0, "[%lld, %lld] weighted %d rnd %d: %lld gradient elements differ",
            (long long)rows, (long long)V, weighted, rnd, (long long)diff);
  cr_expect(l0 != 0 && a0 != 0, "the case tests nothing: loss %g, accuracy %g", l0, a0);
  kdrt_sparse_xent_fused_rnd(rnd, &l2, NULL, NULL, x, y, wl, NULL, rows, V, scale, ascale,
                             gscale); // evaluation: no gradient, no accuracy
  cr_expect(!memcmp(&l2, &l0, sizeof l0), "loss without a gradient %.9g, the chain's %.9g", l2,
            l0);
  kdrt_sparse_xent_fused_rnd(rnd, &l2, &a2, x, x, y, wl, wa, rows, V, scale, ascale, gscale);
  cr_expect(!memcmp(&l2, &l0, sizeof l0) && !memcmp(&a2, &a0, sizeof a0) &&
            !memcmp(x, g0, (size_t)(rows * V) * sizeof *x), "in place: not the chain's");
  free(x), free(y), free(w), free(m), free(s), free(g0), free(g1);
}

Test(xent, fused_equals_chain) {
  check_fused_xent(11, 24, 0, 0, KDRT_ROUND_NONE);
  check_fused_xent(9, 3001, 1, 0, KDRT_ROUND_NONE);
  check_fused_xent(9, 3001, 1, 1, KDRT_ROUND_BF16);
  check_fused_xent(70, 1000, 0, 0, KDRT_ROUND_F16); // enough work for threads
  check_fused_xent(8, 50257, 1, 1, KDRT_ROUND_NONE);
}

// ---------------------------------------------------------------- learning-rate schedules
// keras.optimizers.schedules at steps 0..13, the values Keras 3.15 (JAX,
// float32) gives (printed with %.9g).
Test(optim, schedules_as_keras) {
  static const struct {
    kdrt_schedule s;
    float want[14];
  } cases[] = {
    {{.kind = KDRT_SCHEDULE_EXPONENTIAL, .initial = 0.5, .decay_steps = 3, .decay_rate = 0.7,
      .staircase = 1},
     {0.5, 0.5, 0.5, 0.349999994, 0.349999994, 0.349999994, 0.24499999, 0.24499999, 0.24499999,
      0.171499997, 0.171499997, 0.171499997, 0.120049991, 0.120049991}},
    {{.kind = KDRT_SCHEDULE_EXPONENTIAL, .initial = 0.1, .decay_steps = 4, .decay_rate = 0.5},
     {0.100000001, 0.0840896443, 0.0707106814, 0.0594603531, 0.0500000007, 0.0420448221,
      0.0353553407, 0.0297301766, 0.0250000004, 0.0210224111, 0.0176776703, 0.0148650883,
      0.0125000002, 0.0105112055}},
    {{.kind = KDRT_SCHEDULE_PIECEWISE, .nbounds = 2, .bounds = {2, 5}, .values = {0.02, 0.01, 0.002}},
     {0.0199999996, 0.0199999996, 0.0199999996, 0.00999999978, 0.00999999978, 0.00999999978,
      0.00200000009, 0.00200000009, 0.00200000009, 0.00200000009, 0.00200000009, 0.00200000009,
      0.00200000009, 0.00200000009}},
    {{.kind = KDRT_SCHEDULE_COSINE, .initial = 0.001, .decay_steps = 8, .alpha = 0.1,
      .warmup = 1, .warmup_target = 0.02, .warmup_steps = 4},
     {0.00100000005, 0.00575000001, 0.0104999999, 0.0152499992, 0.0199999996, 0.0193149149,
      0.0173639599, 0.0144441491, 0.010999999, 0.00755584799, 0.00463603903, 0.00268508331,
      0.00200000009, 0.00200000009}},
    {{.kind = KDRT_SCHEDULE_COSINE, .initial = 0.01, .decay_steps = 5, .alpha = 0.2},
     {0.00999999978, 0.00923606753, 0.00723606767, 0.0047639315, 0.00276393164, 0.00200000009,
      0.00200000009, 0.00200000009, 0.00200000009, 0.00200000009, 0.00200000009, 0.00200000009,
      0.00200000009, 0.00200000009}},
    {{.kind = KDRT_SCHEDULE_INVERSE_TIME, .initial = 0.01, .decay_steps = 2, .decay_rate = 0.5},
     {0.00999999978, 0.00799999945, 0.00666666636, 0.00571428565, 0.00499999989, 0.00444444455,
      0.00399999972, 0.00363636366, 0.00333333318, 0.00307692308, 0.00285714283, 0.00266666664,
      0.00249999994, 0.00235294108}},
    {{.kind = KDRT_SCHEDULE_INVERSE_TIME, .initial = 0.01, .decay_steps = 3, .decay_rate = 0.5,
      .staircase = 1},
     {0.00999999978, 0.00999999978, 0.00999999978, 0.00666666636, 0.00666666636, 0.00666666636,
      0.00499999989, 0.00499999989, 0.00499999989, 0.00399999972, 0.00399999972, 0.00399999972,
      0.00333333318, 0.00333333318}},
    {{.kind = KDRT_SCHEDULE_POLYNOMIAL, .initial = 0.5, .decay_steps = 5, .end = 0.01,
      .power = 2, .cycle = 1},
     {0.5, 0.323600024, 0.186400011, 0.0883999914, 0.0295999981, 0.00999999978, 0.0883999914,
      0.0540999994, 0.0295999981, 0.0149000026, 0.00999999978, 0.0448444411, 0.0295999981,
      0.0187111106}},
    {{.kind = KDRT_SCHEDULE_POLYNOMIAL, .initial = 0.5, .decay_steps = 5, .end = 0.01,
      .power = 0.5},
     {0.5, 0.448269308, 0.389552385, 0.319903195, 0.229134664, 0.00999999978, 0.00999999978,
      0.00999999978, 0.00999999978, 0.00999999978, 0.00999999978, 0.00999999978, 0.00999999978,
      0.00999999978}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
    for (int t = 0; t < 14; t++) {
      float got = kdrt_schedule_lr(&cases[k].s, t), want = cases[k].want[t];
      cr_expect(fabsf(got - want) <= 2.5e-7f * want, "case %zu, step %d: %.9g, Keras %.9g", k, t,
                got, want);
    }
}

// ---------------------------------------------------------------- issue 23: kdrt_round
// Each value's rounding as ml_dtypes (bfloat16) and numpy (float16) round
// it, to nearest, ties to even: ties both ways, the carry into the
// exponent, overflow to infinity, float16's subnormals and what underflows
// them, signs, infinities and NaN. kdrt_round.h was also checked against
// ml_dtypes on 2^24 random floats, bit for bit.
Test(round, bf16_and_f16_as_ml_dtypes) {
  static const struct { float x, bf16, f16; } v[] = {
    {1.0f, 1.0f, 1.0f},
    {1.00390625f, 1.0f, 1.00390625f},          // 1 + 2^-8: a bf16 tie, to even (down)
    {1.01171875f, 1.015625f, 1.01171875f},     // 1 + 3 * 2^-8: a tie, to even (up)
    {1.0009765625f, 1.0f, 1.0009765625f},      // 1 + 2^-10: f16 exact
    {1.00048828125f, 1.0f, 1.0f},              // 1 + 2^-11: an f16 tie, to even (down)
    {1.00146484375f, 1.0f, 1.001953125f},      // 1 + 3 * 2^-11: a tie, to even (up)
    {-3.14159274f, -3.140625f, -3.140625f},
    {255.9f, 256.0f, 255.875f},                // carry into the exponent (bf16)
    {65504.0f, 65536.0f, 65504.0f},            // float16's largest
    {65519.99f, 65536.0f, 65504.0f},
    {65520.0f, 65536.0f, INFINITY},            // overflows float16
    {3.3961776e38f, INFINITY, INFINITY},       // overflows bfloat16 too
    {5.9604645e-08f, 5.9604645e-08f, 5.9604645e-08f},  // 2^-24: float16's least
    {2.9802322e-08f, 2.9802322e-08f, 0.0f},            // 2^-25: a tie, to even (0)
    {4.4703484e-08f, 4.4703484e-08f, 5.9604645e-08f},  // 1.5 * 2^-25
    {-1.0e-8f, -0x1.58p-27f, -0.0f},
    {6.1035156e-05f, 6.1035156e-05f, 6.1035156e-05f},  // 2^-14: float16's least normal
    {1.0e-40f, 0x1p-133f, 0.0f},                       // a float32 subnormal
    {-0.0f, -0.0f, -0.0f},
    {-INFINITY, -INFINITY, -INFINITY},
  };
  int n = (int)(sizeof v / sizeof *v);
  float x[32], y[32];
  for (int i = 0; i < n; i++) x[i] = v[i].x;
  kdrt_round(KDRT_ROUND_BF16, y, x, (size_t)n);
  for (int i = 0; i < n; i++)
    cr_expect(memcmp(&y[i], &v[i].bf16, 4) == 0, "bf16(%.9g) = %.9g, want %.9g", x[i], y[i],
              v[i].bf16);
  kdrt_round(KDRT_ROUND_F16, y, x, (size_t)n);
  for (int i = 0; i < n; i++)
    cr_expect(memcmp(&y[i], &v[i].f16, 4) == 0, "f16(%.9g) = %.9g, want %.9g", x[i], y[i],
              v[i].f16);
  x[0] = NAN;
  kdrt_round(KDRT_ROUND_BF16, y, x, 1);
  cr_expect(isnan(y[0]));
  kdrt_round(KDRT_ROUND_F16, x, x, 1); // in place
  cr_expect(isnan(x[0]));
}

// issue 23's storage in 16 bits: kdrt_pack16, kdrt_unpack16. Every one of
// the 65536 patterns of each type is a value that comes back as its own 16
// bits (the NaNs as NaNs), and it is a value kdrt_round gives; every float
// of a spread (subnormals of both types, past float16's largest, signs,
// infinities) rounded, packed and unpacked is its rounding bit for bit
// (all 2^32 floats were checked so once, by hand); the ml_dtypes table
// above rounds to its own values' bits (float16 65504 is 0x7bff, 2^-24 is
// 0x0001, bfloat16 1 is 0x3f80).
Test(round, pack16_unpack16_bit_for_bit) {
  enum { N = 65536 };
  uint16_t *h = malloc(N * sizeof *h), *h2 = malloc(N * sizeof *h2);
  float *x = malloc(N * sizeof *x), *r = malloc(N * sizeof *r), *y = malloc(N * sizeof *y);
  cr_assert(h && h2 && x && r && y);
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
    kdrt_unpack16(kind, x, h, N);
    kdrt_round(kind, r, x, N);
    kdrt_pack16(kind, h2, x, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
      if (isnan(x[i])) {
        bad += !isnan(r[i]);
        continue;
      }
      bad += h2[i] != h[i] || memcmp(&r[i], &x[i], 4) != 0;
    }
    cr_expect(bad == 0, "kind %d: %d of the 16-bit patterns do not come back", kind, bad);
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) { // random bits, then scaled over both types' ranges
      s = s * 1664525u + 1013904223u;
      float v = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
      x[i] = i < 64 ? (float[]){0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65520.0f, 1e-40f,
                                5.9604645e-08f, 2.9802322e-08f, -6.1035156e-05f}[i % 10]
                    : ldexpf(v, i % 64 - 40);
    }
    kdrt_round(kind, r, x, N);
    kdrt_pack16(kind, h, r, N);
    kdrt_unpack16(kind, y, h, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += memcmp(&r[i], &y[i], 4) != 0;
    cr_expect(bad == 0, "kind %d: %d rounded floats do not come back bit for bit", kind, bad);
    x[0] = NAN, x[1] = -NAN;
    kdrt_pack16(kind, h, x, 2);
    kdrt_unpack16(kind, y, h, 2);
    cr_expect(isnan(y[0]) && !signbit(y[0]) && isnan(y[1]) && signbit(y[1]), "NaNs stay NaNs");
  }
  const float f[] = {65504.0f, 5.9604645e-08f, -2.0f};
  uint16_t b[3];
  kdrt_pack16(KDRT_ROUND_F16, b, f, 3);
  cr_expect(b[0] == 0x7bff && b[1] == 0x0001 && b[2] == 0xc000, "%04x %04x %04x", b[0], b[1], b[2]);
  kdrt_pack16(KDRT_ROUND_BF16, b, (const float[]){1.0f, -2.0f, 0.0f}, 3);
  cr_expect(b[0] == 0x3f80 && b[1] == 0xc000 && b[2] == 0, "%04x %04x %04x", b[0], b[1], b[2]);
  free(h), free(h2), free(x), free(r), free(y);
}
