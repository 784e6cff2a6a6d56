// kdrt_loss.h: the per-row losses and their gradients (kdrt_loss,
// kdrt_loss_grad), written once for the CPU runtime (loss.c) and the CUDA
// one (cuda/loss.cu). Plain C99 that also compiles as CUDA C++ (KDRT_HD
// marks host and device), as kdrt_rnn.h. Keras 3's conventions are loss.c's
// (see its top comment); this file holds every formula, the backends only
// the loops and the reductions, which differ: the CPU sums a row in column
// order, the GPU in a block reduction (the two agree to float rounding).
//
// A row r of pred p and labels t (for sparse crossentropy, y[r] a class
// id) goes through, on either backend:
//   1. kdrt_loss_row_init: the label's column (SCCE), hinge's label form;
//   2. the sums kdrt_loss_needs names (KDRT_ROW_*), each in float: the
//      row's max and sum of exp(p - max) (then kdrt_loss_lse), sum p, sum t,
//      sums of p^2 and t^2, categorical hinge's sum t p and max (1 - t) p;
//   3. kdrt_loss_mid: what those give (cosine's normalizers, the label's
//      probability);
//   4. the loss: the sum over j of kdrt_loss_term in double (KDRT_ROW_TERMS),
//      then kdrt_loss_finish; or the gradient: the float sum over j of
//      kdrt_loss_sum2_term (KDRT_ROW_SUM2), kdrt_loss_grad_prep, then
//      kdrt_loss_dterm for every element.
//
// Sparse crossentropy with the classes split over ranks (loss.c's
// kdrt_sparse_xent and its gradient, cuda/xent.cu) shares its pieces at the
// end: which column of a rank's block is the label, a row's loss from the
// all-reduced max and sum of exp, an element's derivative.
//
// The CPU runtime includes this file after vmath.h, so that the sigmoid of
// binary crossentropy and the elementwise losses (kdrt_defs.h's
// KDRT_ELEM_LOSS_LIST) call its exp as the activations do; the other
// functions here call libm's (expf, logf, log1pf) on the CPU as on the GPU.
#ifndef KDRT_LOSS_H
#define KDRT_LOSS_H

#include <math.h>
#include <stdint.h>

#include "kdrt_defs.h"

// Keras's backend.epsilon() and the clip bounds it implies, in float32.
#define KDRT_LOSS_EPS 1e-7f
#define KDRT_LOSS_ONE_MINUS_EPS ((float)(1.0 - 1e-7))

static inline KDRT_HD float kdrt_loss_clip(float p) {
  return p < KDRT_LOSS_EPS ? KDRT_LOSS_EPS
                           : (p > KDRT_LOSS_ONE_MINUS_EPS ? KDRT_LOSS_ONE_MINUS_EPS : p);
}

// 1 where clip(p) passes p through, 0 where it clamps (JAX's gradient).
static inline KDRT_HD float kdrt_loss_unclipped(float p) {
  return (p >= KDRT_LOSS_EPS && p <= KDRT_LOSS_ONE_MINUS_EPS) ? 1.0f : 0.0f;
}

// softplus(x) = log(1 + exp(x)), stable.
static inline KDRT_HD float kdrt_loss_softplus(float x) {
  return (x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x)));
}

// log(sum(exp(x))) of a row from its max m and its sum s of exp(x - m).
static inline KDRT_HD float kdrt_loss_lse(float m, float s) { return m + logf(s); }

// Row r's labels: dense [rows, cols], or (sparse crossentropy) y[r] alone
// (NULL).
static inline KDRT_HD const float *kdrt_loss_labels(int kind, const float *y, int64_t r,
                                                    int64_t cols) {
  return kind == KDRT_LOSS_SCCE ? NULL : y + r * cols;
}

// The sparse label of row r as a column index, or -1 when out of range
// (JAX's one_hot then gives an all-zero row: loss and gradient 0).
static inline KDRT_HD int64_t kdrt_loss_class(const float *y, int64_t r, int64_t cols) {
  float v = y[r];
  if (!(v >= 0.0f) || v >= (float)cols)
    return -1;
  return (int64_t)v;
}

// issue 11: one term of an elementwise loss (kdrt_defs.h's list), or (d)
// its derivative in p.
static inline KDRT_HD float kdrt_elem_loss(int kind, int d, float p, float t, float a) {
  switch (kind) {
#define KDRT_X(name, mean, f, df) case KDRT_LOSS_##name: return d ? (df) : (f);
    KDRT_ELEM_LOSS_LIST(KDRT_X)
#undef KDRT_X
  }
  return NAN;
}
// Whether a row's loss is the mean of its terms (else their sum), and
// whether the kind is in the list at all (-1: not).
static inline KDRT_HD int kdrt_elem_mean(int kind) {
  switch (kind) {
#define KDRT_X(name, mean, f, df) case KDRT_LOSS_##name: return mean;
    KDRT_ELEM_LOSS_LIST(KDRT_X)
#undef KDRT_X
  }
  return -1;
}

// CosineSimilarity's l2_normalize factor: min(rsqrt(sum of squares), 1 /
// epsilon), as keras.ops.normalize; w: d factor / d rsqrt (half at the tie).
static inline KDRT_HD float kdrt_loss_cos_inv(float ss, float *w) {
  float r = 1.0f / sqrtf(ss);
  if (w)
    *w = r < 1e7f ? 1.0f : r == 1e7f ? 0.5f : 0.0f;
  return fminf(r, 1e7f);
}

// categorical_hinge's negative part of element (p, t): (1 - t) p, whose max
// over the row is taken.
static inline KDRT_HD float kdrt_loss_hinge_neg(float p, float t) { return (1.0f - t) * p; }

// What a row needs before its loss or gradient: the sums of step 2, the
// terms of the loss, the gradient's second sum.
enum {
  KDRT_ROW_LSE = 1,    // max of p, then sum of exp(p - max): lse
  KDRT_ROW_SUM = 2,    // s = sum of p
  KDRT_ROW_YSUM = 4,   // ysum = sum of t
  KDRT_ROW_SQ = 8,     // sp, st = sums of p^2 and t^2
  KDRT_ROW_HINGE = 16, // pos = sum of t p, neg = max of (1 - t) p
  KDRT_ROW_TERMS = 32, // the loss sums kdrt_loss_term over the row
  KDRT_ROW_SUM2 = 64,  // the gradient sums kdrt_loss_sum2_term over the row
};

static inline KDRT_HD int kdrt_loss_needs(int kind, int from_logits, int grad) {
  switch (kind) {
  case KDRT_LOSS_CCE:
    if (from_logits)
      return KDRT_ROW_LSE | (grad ? KDRT_ROW_YSUM : KDRT_ROW_TERMS);
    return KDRT_ROW_SUM | (grad ? KDRT_ROW_SUM2 : KDRT_ROW_TERMS);
  case KDRT_LOSS_SCCE:
    return from_logits ? KDRT_ROW_LSE : KDRT_ROW_SUM;
  case KDRT_LOSS_COSINE:
    return KDRT_ROW_SQ | (grad ? KDRT_ROW_SUM2 : KDRT_ROW_TERMS);
  case KDRT_LOSS_CAT_HINGE:
    return KDRT_ROW_HINGE | (grad ? KDRT_ROW_SUM2 : 0);
  default: // mse, mae, bce and the elementwise losses: terms alone
    return grad ? 0 : KDRT_ROW_TERMS;
  }
}

// One row's statistics and what follows from them.
typedef struct {
  int64_t c;        // SCCE: the label's column, or -1 (no class)
  int pm1;          // hinge, squared_hinge: the labels as -1/1 (2 t - 1)
  float lse;        // KDRT_ROW_LSE
  float s;          // KDRT_ROW_SUM
  float ysum;       // KDRT_ROW_YSUM
  float sp, st;     // KDRT_ROW_SQ
  float pos, neg;   // KDRT_ROW_HINGE
  float sum2;       // KDRT_ROW_SUM2: CCE's sum_j t_j [q_j unclipped],
                    // cosine's sum_j p_j t_j it, categorical hinge's ties
  float ip, it, w;  // cosine: the normalizers of p and t, d ip / d rsqrt
  float q, m;       // SCCE on probabilities: the label's p / s, unclipped(q)
  float inv, r3, g; // kdrt_loss_grad_prep's
  float sc, sc_cols, sc_elem; // the gradient's scales: sc, sc / cols, and
                              // the elementwise losses' (mean or sum)
} kdrt_loss_row;

// Keras's hinge labels: 0/1 become -1/1 unless the step's labels hold
// another value (flag, the step's not_binary).
static inline KDRT_HD kdrt_loss_row kdrt_loss_row_init(int kind, const float *flag,
                                                       const float *y, int64_t r, int64_t cols) {
#ifdef __cplusplus
  kdrt_loss_row row = {}; // every field zero (CUDA C++: {0} warns of the others)
#else
  kdrt_loss_row row = {0};
#endif
  row.c = kind == KDRT_LOSS_SCCE ? kdrt_loss_class(y, r, cols) : -1;
  row.pm1 = (kind == KDRT_LOSS_HINGE || kind == KDRT_LOSS_SQUARED_HINGE) && flag[0] == 0.0f;
  return row;
}

// Step 3, after the sums: p is the row.
static inline KDRT_HD void kdrt_loss_mid(int kind, int from_logits, kdrt_loss_row *row,
                                         const float *p) {
  if (kind == KDRT_LOSS_COSINE) {
    row->ip = kdrt_loss_cos_inv(row->sp, &row->w);
    row->it = kdrt_loss_cos_inv(row->st, NULL);
  } else if (kind == KDRT_LOSS_SCCE && !from_logits && row->c >= 0) {
    row->q = p[row->c] / row->s;
    row->m = kdrt_loss_unclipped(row->q);
  }
}

// Element j's term of the row's loss (KDRT_ROW_TERMS), in double.
static inline KDRT_HD double kdrt_loss_term(int kind, int from_logits, float a,
                                            const kdrt_loss_row *row, const float *p,
                                            const float *t, int64_t j) {
  switch (kind) {
  case KDRT_LOSS_MSE: {
    double d = (double)p[j] - t[j];
    return d * d;
  }
  case KDRT_LOSS_MAE:
    return fabs((double)p[j] - t[j]);
  case KDRT_LOSS_CCE: // -sum(t log softmax(p)), -sum(t log clip(p / s))
    if (from_logits)
      return -((double)t[j] * (p[j] - row->lse));
    return -((double)t[j] * logf(kdrt_loss_clip(p[j] / row->s)));
  case KDRT_LOSS_BCE:
    if (from_logits)
      return kdrt_loss_softplus(p[j]) - p[j] * t[j];
    else {
      float q = kdrt_loss_clip(p[j]);
      return -(double)(t[j] * logf(q) + (1.0f - t[j]) * logf(1.0f - q));
    }
  case KDRT_LOSS_COSINE: // -sum(normalize(t) * normalize(p))
    return -(double)((t[j] * row->it) * (p[j] * row->ip));
  default: // issue 11: the elementwise losses
    return kdrt_elem_loss(kind, 0, p[j], row->pm1 ? 2.0f * t[j] - 1.0f : t[j], a);
  }
}

// The row's loss from the sum of its terms (0 without KDRT_ROW_TERMS).
static inline KDRT_HD double kdrt_loss_finish(int kind, int from_logits, const kdrt_loss_row *row,
                                              const float *p, double terms, int64_t cols) {
  switch (kind) {
  case KDRT_LOSS_MSE:
  case KDRT_LOSS_MAE:
  case KDRT_LOSS_BCE:
    return terms / (double)cols;
  case KDRT_LOSS_CCE:
  case KDRT_LOSS_COSINE:
    return terms;
  case KDRT_LOSS_SCCE:
    if (row->c < 0)
      return 0.0;
    if (from_logits)
      return (double)row->lse - p[row->c];
    return -logf(kdrt_loss_clip(p[row->c] / row->s));
  case KDRT_LOSS_CAT_HINGE: // max(max((1 - t) p) - sum(t p) + 1, 0)
    return fmaxf(row->neg - row->pos + 1.0f, 0.0f);
  default:
    return kdrt_elem_mean(kind) ? terms / (double)cols : terms;
  }
}

// Element j's term of the gradient's second sum (KDRT_ROW_SUM2), in float.
static inline KDRT_HD float kdrt_loss_sum2_term(int kind, const kdrt_loss_row *row,
                                                const float *p, const float *t, int64_t j) {
  switch (kind) {
  case KDRT_LOSS_CCE:
    return t[j] * kdrt_loss_unclipped(p[j] / row->s);
  case KDRT_LOSS_COSINE:
    return p[j] * (t[j] * row->it);
  default: // categorical hinge: the max's gradient is shared among its ties, as JAX's reduce max
    return (float)(kdrt_loss_hinge_neg(p[j], t[j]) == row->neg);
  }
}

// After the sums: scale is the loss's (kdcc passes 1 / global batch).
static inline KDRT_HD void kdrt_loss_grad_prep(int kind, kdrt_loss_row *row, double scale,
                                               int64_t cols) {
  row->sc = (float)scale;
  row->sc_cols = (float)(scale / (double)cols);
  row->sc_elem = kdrt_elem_mean(kind) ? row->sc_cols : row->sc;
  switch (kind) {
  case KDRT_LOSS_CCE:
  case KDRT_LOSS_SCCE:
    row->inv = row->sc / row->s;
    break;
  case KDRT_LOSS_COSINE: {
    // l = -sum(t_j it p_j ip), ip = cos_inv(sum p^2) = rsqrt where it is
    // below 1/epsilon: dl/dp_k = -ip t_k it + w r^3 p_k sum(p_j t_j it)
    float rs = 1.0f / sqrtf(row->sp);
    row->r3 = row->w > 0.0f ? row->w * rs * rs * rs * row->sum2 : 0.0f;
    break;
  }
  case KDRT_LOSS_CAT_HINGE:
    row->g = row->sc * KDRT_MAX_D(row->neg - row->pos + 1.0f, 0.0f);
    break;
  }
}

// d loss / d p[j], times the scale. Reads only p[j] and t[j] (the row's
// other elements went into the sums): dpred may alias pred.
static inline KDRT_HD float kdrt_loss_dterm(int kind, int from_logits, float a,
                                            const kdrt_loss_row *row, const float *p,
                                            const float *t, int64_t j) {
  switch (kind) {
  case KDRT_LOSS_MSE:
    return 2.0f * row->sc_cols * (p[j] - t[j]);
  case KDRT_LOSS_MAE: {
    float e = p[j] - t[j];
    return e > 0.0f ? row->sc_cols : (e < 0.0f ? -row->sc_cols : 0.0f);
  }
  case KDRT_LOSS_CCE:
    if (from_logits) // d/dx -sum y log_softmax(x) = softmax(x) * sum(y) - y
      return row->sc * (expf(p[j] - row->lse) * row->ysum - t[j]);
    else {
      // q = p / s; L = -sum y log clip(q). With g_j = -y_j/q_j where q_j
      // is unclipped (0 elsewhere): dL/dp_k = (g_k + sum_j y_j [q_j unclipped]) / s.
      float q = p[j] / row->s;
      float g = kdrt_loss_unclipped(q) > 0.0f ? -t[j] / q : 0.0f;
      return row->inv * (g + row->sum2);
    }
  case KDRT_LOSS_SCCE:
    if (row->c < 0)
      return 0.0f;
    if (from_logits) {
      float e = row->sc * expf(p[j] - row->lse);
      return j == row->c ? e - row->sc : e;
    }
    if (j != row->c)
      return row->inv * row->m;
    return row->m > 0.0f ? row->inv * (1.0f - 1.0f / row->q) : 0.0f;
  case KDRT_LOSS_BCE:
    if (from_logits)
      return row->sc_cols * (KDRT_SIGMOID(p[j]) - t[j]);
    else {
      float q = p[j];
      float g = -t[j] / q + (1.0f - t[j]) / (1.0f - q);
      return kdrt_loss_unclipped(q) > 0.0f ? row->sc_cols * g : 0.0f;
    }
  case KDRT_LOSS_COSINE:
    return row->sc * (row->r3 * p[j] - row->ip * (t[j] * row->it));
  case KDRT_LOSS_CAT_HINGE: {
    float n = kdrt_loss_hinge_neg(p[j], t[j]);
    return row->g * ((n == row->neg ? (1.0f - t[j]) / row->sum2 : 0.0f) - t[j]);
  }
  default:
    return row->sc_elem * kdrt_elem_loss(kind, 1, p[j], row->pm1 ? 2.0f * t[j] - 1.0f : t[j], a);
  }
}

// ---- sparse crossentropy with the classes split over ranks: x [rows,
// cols] holds columns [col0, col0 + cols) of each row's logits.

// Row r's label as a column of this rank's block, or -1 when another rank
// holds it (or it names no class).
static inline KDRT_HD int64_t kdrt_xent_class(const float *y, int64_t r, int64_t cols,
                                              int64_t col0) {
  float v = y[r];
  if (!(v >= (float)col0) || v >= (float)(col0 + cols))
    return -1;
  return (int64_t)v - col0;
}

// The row's loss m + log s - x[label] from the row's max m and sum s of
// exp (all-reduced), as kdrt_loss forms it (log-sum-exp rounded to float first).
static inline KDRT_HD double kdrt_xent_row_loss(float m, float s, float x_label) {
  return (double)kdrt_loss_lse(m, s) - x_label;
}

// scale * (e / s - [the label]), e = exp(x - m) (the CPU's own exp).
static inline KDRT_HD float kdrt_xent_dterm(float sc, float e, float s, int is_label) {
  return sc * (e / s - (is_label ? 1.0f : 0.0f));
}

#endif
