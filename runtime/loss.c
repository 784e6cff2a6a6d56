// loss.c: the losses and metrics a generated step computes, and their
// gradients, on one rank's local rows: every kdrt_loss*, kdrt_accuracy*,
// kdrt_not_binary, and the crossentropy with the classes split over ranks.
// Apart from ops.c's kernels because they are a family of their own, the
// one whose formulas kdrt_loss.h shares with the CUDA runtime
// (cuda/loss.cu, cuda/xent.cu). Conventions, threads and aliasing: ops.c's
// header comment. The semantics are Keras 3's as the JAX backend runs them:
//
// - Losses follow keras/src/losses and keras/src/backend/jax/nn.py: mse and
//   mae average the last axis; categorical crossentropy on probabilities
//   divides the output by its row sum, clips to [1e-7, 1 - 1e-7] and takes
//   -sum(y log p); binary crossentropy clips the same way and averages the
//   last axis; from_logits forms use log-softmax and the stable softplus
//   form. Where a value was clipped its gradient is 0, as in JAX. Every loss
//   writes sum over rows * scale (kdcc passes 1/global batch), accumulated
//   in double, to out[0] as a float.
// - "accuracy" resolves as keras/src/trainers/compile_utils.py does it, by
//   shape: one prediction column -> binary accuracy (threshold 0.5, as
//   Keras's BinaryAccuracy uses whatever the loss's from_logits), class ids
//   -> sparse categorical, otherwise categorical (argmax, first maximum).
// - Crossentropy with the classes split over ranks (row_max, row_sumexp,
//   sparse_xent*): each rank holds columns [col0, col0 + cols) of the
//   logits; the caller all-reduces the row maxima (max) and the sums of
//   exp (sum) between the calls, and the per-rank losses add up to
//   kdrt_loss's SCCE from logits on the whole row. Where the classes are
//   not split, kdrt_sparse_xent_fused does all of it in one pass a row
//   (issue 22), with the same bits.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kdrt.h"
#include "vmath.h"
// after vmath.h: its sigmoid and elementwise losses call vmath's exp, as
// the activations do (not a copy included before, through another header)
#ifdef KDRT_LOSS_H
#error "kdrt_loss.h must be included after vmath.h"
#endif
#include "kdrt_loss.h"
#include "ops_impl.h"

// ---------------------------------------------------------------- losses
// The formulas are kdrt_loss.h's, shared with the CUDA runtime; here, the
// loops of one row on one thread, every sum in column order.

// A loop over a row's elements, KD_LOSS_LOOP(K, FL), in one copy per loss
// and from_logits, those two constants in each: kdrt_loss.h's switches fold
// away and each loop is the plain one it would be by hand, vectorised where
// it can be (binary crossentropy's sigmoid: vmath's exp, 8 lanes).
#define KD_LOSS_CASE(name, kname)                                                                  \
  case 2 * KDRT_LOSS_##name:                                                                       \
    KD_LOSS_LOOP(KDRT_LOSS_##name, 0);                                                             \
    break;                                                                                         \
  case 2 * KDRT_LOSS_##name + 1:                                                                   \
    KD_LOSS_LOOP(KDRT_LOSS_##name, 1);                                                             \
    break;
#define KD_EACH_LOSS(kind, from_logits)                                                            \
  switch (2 * (kind) + !!(from_logits)) { KDRT_LOSS_LIST(KD_LOSS_CASE) }

// Step 2 of kdrt_loss.h: the sums `need` names, of row p (labels t).
static void row_sums(int need, kdrt_loss_row *row, const float *p, const float *t, int64_t cols) {
  if (need & KDRT_ROW_LSE) { // log(sum(exp(p))), stable
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = 0; j < cols; j++)
      m = p[j] > m ? p[j] : m;
    for (int64_t j = 0; j < cols; j++)
      s += expf(p[j] - m);
    row->lse = kdrt_loss_lse(m, s);
  }
  if (need & KDRT_ROW_SUM) {
    float s = 0.0f;
    for (int64_t j = 0; j < cols; j++)
      s += p[j];
    row->s = s;
  }
  if (need & KDRT_ROW_YSUM) {
    float s = 0.0f;
    for (int64_t j = 0; j < cols; j++)
      s += t[j];
    row->ysum = s;
  }
  if (need & KDRT_ROW_SQ) {
    float sp = 0.0f, st = 0.0f;
    for (int64_t j = 0; j < cols; j++)
      sp += p[j] * p[j], st += t[j] * t[j];
    row->sp = sp, row->st = st;
  }
  if (need & KDRT_ROW_HINGE) {
    float pos = 0.0f, neg = -INFINITY;
    for (int64_t j = 0; j < cols; j++)
      pos += t[j] * p[j], neg = fmaxf(neg, kdrt_loss_hinge_neg(p[j], t[j]));
    row->pos = pos, row->neg = neg;
  }
}

// Row r's loss, in double.
static double row_loss(int kind, int from_logits, float a, const float *pred, const float *y,
                       const float *flag, int64_t r, int64_t cols) {
  const float *p = pred + r * cols, *t = kdrt_loss_labels(kind, y, r, cols);
  const int need = kdrt_loss_needs(kind, from_logits, 0);
  kdrt_loss_row row = kdrt_loss_row_init(kind, flag, y, r, cols);
  row_sums(need, &row, p, t, cols);
  kdrt_loss_mid(kind, from_logits, &row, p);
  double l = 0.0;
  if (need & KDRT_ROW_TERMS) {
#define KD_LOSS_LOOP(K, FL)                                                                        \
  for (int64_t j = 0; j < cols; j++)                                                               \
  l += kdrt_loss_term(K, FL, a, &row, p, t, j)
    KD_EACH_LOSS(kind, from_logits)
#undef KD_LOSS_LOOP
  }
  return kdrt_loss_finish(kind, from_logits, &row, p, l, cols);
}

// Row losses kept, then added in row order (the same sum on any thread count).
static double sum_rows(double *l, int64_t rows) {
  double total = 0.0;
  for (int64_t r = 0; r < rows; r++)
    total += l[r];
  return total;
}

// Row r's loss times its sample weight (w NULL: none).
#define KD_ROW_W(w, r, l) ((w) ? (double)(w)[r] * (l) : (l))

// out[0] = scale * the sum over rows of each row's loss (times its weight
// w[r], w NULL: none), accumulated in double in row order.
void kdrt_loss_w(int kind, int from_logits, float a, float *out, const float *pred,
                 const float *y, const float *flag, const float *w, int64_t rows, int64_t cols,
                 double scale) {
  double total = 0.0;
  if (rows * cols < KD_PAR_MIN || rows < 2) {
    for (int64_t r = 0; r < rows; r++)
      total += KD_ROW_W(w, r, row_loss(kind, from_logits, a, pred, y, flag, r, cols));
  } else {
    double *l = malloc((size_t)rows * sizeof *l);
    if (!l)
      bad_call("kdrt_loss", "out of memory");
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
      l[r] = KD_ROW_W(w, r, row_loss(kind, from_logits, a, pred, y, flag, r, cols));
    total = sum_rows(l, rows);
    free(l);
  }
  out[0] = (float)(total * scale);
}

void kdrt_loss(int kind, int from_logits, float a, float *out, const float *pred, const float *y,
               const float *flag, int64_t rows, int64_t cols, double scale) {
  kdrt_loss_w(kind, from_logits, a, out, pred, y, flag, NULL, rows, cols, scale);
}

void kdrt_loss_grad_w(int kind, int from_logits, float a, float *dpred, const float *pred,
                      const float *y, const float *flag, const float *w, int64_t rows,
                      int64_t cols, double scale) {
  const int need = kdrt_loss_needs(kind, from_logits, 1);
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *p = pred + r * cols, *t = kdrt_loss_labels(kind, y, r, cols);
    float *d = dpred + r * cols;
    kdrt_loss_row row = kdrt_loss_row_init(kind, flag, y, r, cols);
    row_sums(need, &row, p, t, cols);
    kdrt_loss_mid(kind, from_logits, &row, p);
    if (need & KDRT_ROW_SUM2) {
      float s2 = 0.0f;
#define KD_LOSS_LOOP(K, FL)                                                                        \
  for (int64_t j = 0; j < cols; j++)                                                               \
  s2 += kdrt_loss_sum2_term(K, &row, p, t, j)
      KD_EACH_LOSS(kind, from_logits)
#undef KD_LOSS_LOOP
      row.sum2 = s2;
    }
    kdrt_loss_grad_prep(kind, &row, KD_ROW_W(w, r, scale), cols);
#define KD_LOSS_LOOP(K, FL)                                                                        \
  for (int64_t j = 0; j < cols; j++)                                                               \
  d[j] = kdrt_loss_dterm(K, FL, a, &row, p, t, j)
    KD_EACH_LOSS(kind, from_logits)
#undef KD_LOSS_LOOP
  }
}

void kdrt_loss_grad(int kind, int from_logits, float a, float *dpred, const float *pred,
                    const float *y, const float *flag, int64_t rows, int64_t cols, double scale) {
  kdrt_loss_grad_w(kind, from_logits, a, dpred, pred, y, flag, NULL, rows, cols, scale);
}

void kdrt_not_binary(float *out, const float *y, int64_t n) {
  int any = 0;
  for (int64_t i = 0; i < n && !any; i++)
    any = y[i] != 0.0f && y[i] != 1.0f;
  out[0] = (float)any;
}

// Index of the first maximum of x[0..n).
static int64_t argmax_first(const float *x, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; j++)
    if (x[j] > x[best])
      best = j;
  return best;
}

// out[0] = scale * the sum over the correct rows of their weights w[r], in
// double in row order.
void kdrt_accuracy_w(int kind, int from_logits, float *out, const float *pred, const float *y,
                     const float *w, int64_t rows, int64_t cols, double scale) {
  (void)from_logits;
  double total = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    int hit = cols == 1 ? y[r] == (pred[r] > 0.5f ? 1.0f : 0.0f)
              : kind == KDRT_LOSS_SCCE
                  ? (float)argmax_first(pred + r * cols, cols) == y[r]
                  : argmax_first(pred + r * cols, cols) == argmax_first(y + r * cols, cols);
    if (hit)
      total += w[r];
  }
  out[0] = (float)(total * scale);
}

// out[0] = scale * the number of correct rows.
void kdrt_accuracy(int kind, int from_logits, float *out, const float *pred, const float *y,
                   int64_t rows, int64_t cols, double scale) {
  (void)from_logits;
  int64_t correct = 0; // a count: the same in any order
  if (cols == 1) {
    // BinaryAccuracy: y_true == float(y_pred > 0.5). Keras keeps 0.5 even
    // for a from_logits loss.
    for (int64_t r = 0; r < rows; r++)
      correct += y[r] == (pred[r] > 0.5f ? 1.0f : 0.0f);
  } else if (kind == KDRT_LOSS_SCCE) {
#pragma omp parallel for reduction(+ : correct) if (rows * cols >= KD_PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
      correct += (float)argmax_first(pred + r * cols, cols) == y[r];
  } else {
#pragma omp parallel for reduction(+ : correct) if (rows * cols >= KD_PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
      correct += argmax_first(pred + r * cols, cols) == argmax_first(y + r * cols, cols);
  }
  out[0] = (float)((double)correct * scale);
}

// ---------------------------------------------------------------- split crossentropy
// Sparse crossentropy from logits with the class dim split over ranks:
// x [rows, cols] holds columns [col0, col0 + cols) of each row's V logits.
// The caller all-reduces row_max's m (max) and row_sumexp's s (sum) over
// the ranks that split the classes; then the label's logit is on exactly
// one rank, which adds the row's loss m + log s - x[label]. Rows whose
// label is negative (no class: loss and gradient 0, as kdrt_loss) are
// skipped everywhere; a label >= V is the caller's to avoid (kdrt checks
// label files).

// Row xr's maximum: 32 running maxima (vector registers), then those and
// the rest. A maximum is the same in any order (NaNs never taken), but a
// maximum of zero may come out -0 or +0 by the order; no reader tells them
// apart (x - m, m + log s, x == m give the same bits), so the results are
// those of one running max in column order.
static float row_max1(const float *xr, int64_t cols) {
  float mm[32], m = -INFINITY;
  for (int k = 0; k < 32; k++)
    mm[k] = -INFINITY;
  int64_t j = 0;
  for (; j + 32 <= cols; j += 32)
    for (int k = 0; k < 32; k++)
      mm[k] = xr[j + k] > mm[k] ? xr[j + k] : mm[k];
  for (int k = 0; k < 32; k++)
    m = mm[k] > m ? mm[k] : m;
  for (; j < cols; j++)
    m = xr[j] > m ? xr[j] : m;
  return m;
}

// Row xr's sum of exp(x - m) (exp_flush), in float, in column order (as
// kdrt_loss); the exps made a vector loop at a time, into e[cols] (the
// fused classifier's gradient row, which keeps them) or 256 at a time on
// the stack (e NULL). e may be xr.
static float row_sumexp1(float *e, const float *xr, float m, int64_t cols) {
  float buf[256], s = 0.0f;
  for (int64_t j0 = 0; j0 < cols; j0 += 256) {
    const int64_t n = cols - j0 < 256 ? cols - j0 : 256;
    float *ej = e ? e + j0 : buf;
    for (int64_t j = 0; j < n; j++)
      ej[j] = exp_flush(xr[j0 + j] - m);
    for (int64_t j = 0; j < n; j++)
      s += ej[j];
  }
  return s;
}

// out[r] = max over j of x[r, j].
void kdrt_row_max(float *out, const float *x, int64_t rows, int64_t cols) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++)
    out[r] = row_max1(x + r * cols, cols);
}

// out[r] = sum over j of exp(x[r, j] - m[r]).
void kdrt_row_sumexp(float *out, const float *x, const float *m, int64_t rows, int64_t cols) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++)
    out[r] = row_sumexp1(NULL, x + r * cols, m[r], cols);
}

// out[0] = scale * sum over the rows whose label is in this rank's columns
// of (m + log s - x[r, label - col0]), in double; as kdrt_loss forms it
// (log-sum-exp rounded to float first).
void kdrt_sparse_xent_w(float *out, const float *x, const float *y, const float *m,
                        const float *s, const float *w, int64_t rows, int64_t cols, int64_t col0,
                        double scale) {
  double total = 0.0; // rows: few (one log each), so one thread
  for (int64_t r = 0; r < rows; r++) {
    int64_t c = kdrt_xent_class(y, r, cols, col0);
    if (c < 0)
      continue;
    total += KD_ROW_W(w, r, kdrt_xent_row_loss(m[r], s[r], x[r * cols + c]));
  }
  out[0] = (float)(total * scale);
}

void kdrt_sparse_xent(float *out, const float *x, const float *y, const float *m, const float *s,
                      int64_t rows, int64_t cols, int64_t col0, double scale) {
  kdrt_sparse_xent_w(out, x, y, m, s, NULL, rows, cols, col0, scale);
}

// dx[r, j] = scale * (exp(x[r, j] - m[r]) / s[r] - [j + col0 == label]);
// a row with a negative label gets 0 (as kdrt_loss_grad). dx may be x.
void kdrt_sparse_xent_grad_w(float *dx, const float *x, const float *y, const float *m,
                             const float *s, const float *w, int64_t rows, int64_t cols,
                             int64_t col0, double scale) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float sc = (float)KD_ROW_W(w, r, scale);
    const float *xr = x + r * cols;
    float *dr = dx + r * cols;
    if (!(y[r] >= 0.0f)) {
      memset(dr, 0, (size_t)cols * sizeof *dr);
      continue;
    }
    const float mr = m[r], sr = s[r];
    const int64_t c = kdrt_xent_class(y, r, cols, col0); // -1: matches no j
    for (int64_t j = 0; j < cols; j++)
      dr[j] = kdrt_xent_dterm(sc, exp_flush(xr[j] - mr), sr, j == c);
  }
}

void kdrt_sparse_xent_grad(float *dx, const float *x, const float *y, const float *m,
                           const float *s, int64_t rows, int64_t cols, int64_t col0,
                           double scale) {
  kdrt_sparse_xent_grad_w(dx, x, y, m, s, NULL, rows, cols, col0, scale);
}

// out[0] = scale * the rows whose label is in this rank's columns, whose
// logit equals the global maximum m[r], and that no earlier column of this
// block equals (the first maximum, as kdrt_accuracy's argmax). A tie with
// a column of an earlier rank is not seen here: exact ties of float
// logits across ranks are the one case where this differs from argmax.
// Whether column c of row xr (-1: none) holds the row's first maximum m.
static int xent_hit1(const float *xr, int64_t c, float m) {
  if (c < 0 || xr[c] != m)
    return 0;
  for (int64_t j = 0; j < c; j++)
    if (xr[j] == m)
      return 0;
  return 1;
}

// Whether row r's label column (of this rank's block) holds the block's
// first maximum m[r].
static int xent_hit(const float *x, const float *y, const float *m, int64_t r, int64_t cols,
                    int64_t col0) {
  return xent_hit1(x + r * cols, kdrt_xent_class(y, r, cols, col0), m[r]);
}

void kdrt_sparse_xent_acc(float *out, const float *x, const float *y, const float *m,
                          int64_t rows, int64_t cols, int64_t col0, double scale) {
  int64_t correct = 0;
#pragma omp parallel for reduction(+ : correct) if (rows * cols >= KD_PAR_MIN)
  for (int64_t r = 0; r < rows; r++)
    correct += xent_hit(x, y, m, r, cols, col0);
  out[0] = (float)((double)correct * scale);
}

// The same, each row counting its weight w[r] (a sum in double, row order).
void kdrt_sparse_xent_acc_w(float *out, const float *x, const float *y, const float *m,
                            const float *w, int64_t rows, int64_t cols, int64_t col0,
                            double scale) {
  double total = 0.0;
  for (int64_t r = 0; r < rows; r++)
    if (xent_hit(x, y, m, r, cols, col0))
      total += w[r];
  out[0] = (float)(total * scale);
}

// ---------------------------------------------------------------- fused classifier
// issue 22: the kernels above on whole rows (col0 0), one row at a time
// while it is hot in cache: its max (row_max1), its label's logit and hit,
// its exps written into its gradient row and summed (row_sumexp1), then
// that row turned into the gradient. Each value is the one the separate
// kernels make, in the same order: the same bits (tests/test_rt_ops.c).
// The row losses and hits are kept and added in row order, as
// kdrt_sparse_xent_w and the accuracies add them.
void kdrt_sparse_xent_fused_rnd(int rnd, float *loss, float *acc, float *dx, const float *x,
                                const float *y, const float *w, const float *wa, int64_t rows,
                                int64_t cols, double scale, double ascale, double gscale) {
  double *l = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *l);
  unsigned char *hit = malloc((size_t)(rows > 0 ? rows : 1));
  if (!l || !hit)
    bad_call("kdrt_sparse_xent_fused", "out of memory");
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *dr = dx ? dx + r * cols : NULL;
    const float m = row_max1(xr, cols);
    const int64_t c = kdrt_xent_class(y, r, cols, 0);
    const float xc = c >= 0 ? xr[c] : 0.0f; // read before dr overwrites x (dx may be x)
    hit[r] = acc && xent_hit1(xr, c, m);
    const float s = row_sumexp1(dr, xr, m, cols);
    l[r] = c >= 0 ? KD_ROW_W(w, r, kdrt_xent_row_loss(m, s, xc)) : 0.0;
    if (!dr)
      continue;
    if (!(y[r] >= 0.0f)) {
      memset(dr, 0, (size_t)cols * sizeof *dr);
      continue;
    }
    const float sc = (float)KD_ROW_W(w, r, gscale);
    if (rnd == KDRT_ROUND_NONE) // (a loop without the rounding's branch vectorises)
      for (int64_t j = 0; j < cols; j++) // dr[j] holds exp(x - m)
        dr[j] = kdrt_xent_dterm(sc, dr[j], s, j == c);
    else
      for (int64_t j = 0; j < cols; j++)
        dr[j] = kdrt_round_to(rnd, kdrt_xent_dterm(sc, dr[j], s, j == c));
  }
  double total = 0.0, hits = 0.0;
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; r++) {
    if (kdrt_xent_class(y, r, cols, 0) >= 0)
      total += l[r];
    if (hit[r] && wa)
      hits += wa[r];
    correct += hit[r];
  }
  loss[0] = (float)(total * scale);
  if (acc)
    acc[0] = (float)((wa ? hits : (double)correct) * ascale);
  free(l), free(hit);
}

void kdrt_sparse_xent_fused(float *loss, float *acc, float *dx, const float *x, const float *y,
                            const float *w, const float *wa, int64_t rows, int64_t cols,
                            double scale, double ascale, double gscale) {
  kdrt_sparse_xent_fused_rnd(KDRT_ROUND_NONE, loss, acc, dx, x, y, w, wa, rows, cols, scale,
                             ascale, gscale);
}
