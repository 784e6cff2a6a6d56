// kdrt_optim.h: the optimizers' updates of one element (Keras 3's formulas,
// keras/src/optimizers/*.py), written once for the CPU runtime (optim.c, a
// loop over a variable's elements) and the CUDA one (cuda/optim.cu, a
// thread an element): plain C99 that also compiles as CUDA C++ (KDRT_HD
// marks host and device), as kdrt_rnn.h. Both builds keep every product
// and sum as written (ISO C's -ffp-contract=off, nvcc's -fmad=false), so
// the two backends give the same bits.
//
// kdrt_<opt>_at(w, g, slots..., i, ...) returns w[i]'s new value from its
// old one w (the caller may have decayed it first) and updates the slots'
// element i in place; a slot the configuration lacks is NULL. The scalars
// that depend on the step alone are formed once by the caller, by the
// functions at the end.
#ifndef KDRT_OPTIM_H
#define KDRT_OPTIM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kdrt_defs.h" // KDRT_HD
#include "kdrt_round.h"

// Keras's moment update, s += (x - s) * (1 - beta): Adam's, Adamax's and
// Nadam's first moment (x = g) and second (x = g^2); c = 1 - beta.
static inline KDRT_HD float kdrt_moment(float s, float x, float c) { return s + (x - s) * c; }

// Decoupled weight decay, applied before the step as base_optimizer does,
// in Keras's order of operations.
static inline KDRT_HD float kdrt_decay(float w, float wd, float lr) { return w - w * wd * lr; }

// SGD: w -= lr * g; with momentum m = m*momentum - g*lr and w += m
// (nesterov: w += m*momentum - g*lr).
static inline KDRT_HD float kdrt_sgd_at(float w, const float *g, float *m, size_t i, float lr,
                                        float momentum, int nesterov) {
  if (momentum == 0.0f) return w - lr * g[i];
  float mi = m[i] * momentum - g[i] * lr;
  m[i] = mi;
  return w + (nesterov ? mi * momentum - g[i] * lr : mi);
}

// Adam (and AdamW after kdrt_decay): alpha, kdrt_adam_alpha's step size;
// c1 = 1 - b1, c2 = 1 - b2; amsgrad (vhat set) divides by the running
// maximum of v instead of v.
static inline KDRT_HD float kdrt_adam_at(float w, const float *g, float *m, float *v,
                                         float *vhat, size_t i, float alpha, float c1, float c2,
                                         float eps) {
  float gi = g[i], mi = kdrt_moment(m[i], gi, c1), vi = kdrt_moment(v[i], gi * gi, c2);
  m[i] = mi;
  v[i] = vi;
  if (vhat) vhat[i] = vi = fmaxf(vhat[i], vi);
  return w - mi * alpha / (sqrtf(vi) + eps);
}

// RMSprop, eps inside the sqrt; c = 1 - rho. centered (a set): the
// denominator is v - a^2 + eps, a the running mean of the gradient; m set:
// with momentum.
static inline KDRT_HD float kdrt_rmsprop_at(float w, const float *g, float *v, float *m,
                                            float *a, size_t i, float lr, float rho, float c,
                                            float momentum, float eps) {
  float gi = g[i];
  float vi = rho * v[i] + c * gi * gi;
  v[i] = vi;
  float den = vi + eps;
  if (a) {
    float ai = rho * a[i] + c * gi;
    a[i] = ai;
    den = vi - ai * ai + eps;
  }
  float inc = lr * gi / sqrtf(den);
  if (m) inc = m[i] = momentum * m[i] + inc;
  return w - inc;
}

static inline KDRT_HD float kdrt_adagrad_at(float w, const float *g, float *acc, size_t i,
                                            float lr, float eps) {
  float gi = g[i], ai = acc[i] + gi * gi;
  acc[i] = ai;
  return w - lr * gi / sqrtf(ai + eps);
}

// Adamax: u the exponentially weighted infinity norm; bias,
// kdrt_adamax_bias's; c1 = 1 - b1.
static inline KDRT_HD float kdrt_adamax_at(float w, const float *g, float *m, float *u, size_t i,
                                           float lr, float c1, float b2, float eps, float bias) {
  float gi = g[i], mi = kdrt_moment(m[i], gi, c1), ui = fmaxf(b2 * u[i], fabsf(gi));
  m[i] = mi;
  u[i] = ui;
  return w - lr * mi / (bias * (ui + eps));
}

// Nadam's step scalars (kdrt_nadam_coef) and its update; c1 = 1 - b1,
// c2 = 1 - b2.
typedef struct {
  float u_next, d1, k2, d2, bias2;
} kdrt_nadam_k;

static inline KDRT_HD float kdrt_nadam_at(float w, const float *g, float *m, float *v, size_t i,
                                          float lr, float c1, float c2, float eps,
                                          kdrt_nadam_k k) {
  float gi = g[i], mi = kdrt_moment(m[i], gi, c1), vi = kdrt_moment(v[i], gi * gi, c2);
  m[i] = mi;
  v[i] = vi;
  float mhat = k.u_next * mi / k.d1 + k.k2 * gi / k.d2;
  return w - mhat * lr / (sqrtf(vi / k.bias2) + eps);
}

// Lion: the sign of the interpolated update; c1 = 1 - b1, c2 = 1 - b2.
static inline KDRT_HD float kdrt_lion_at(float w, const float *g, float *m, size_t i, float lr,
                                         float b1, float c1, float b2, float c2) {
  float gi = g[i], d = m[i] * b1 + gi * c1;
  m[i] = m[i] * b2 + gi * c2;
  return w - lr * (float)((d > 0.0f) - (d < 0.0f));
}

// ---- issue 23: a variable kept in 16 bits (the bfloat16 policy)
// Keras's update_step casts the learning rate, the gradient and every
// constant to variable.dtype, and its slots are of that dtype
// (add_variable_from_reference): every op of the update is a 16-bit op,
// which XLA computes in float32 and rounds (kind: KDRT_ROUND_*). A product
// or sum of two 16-bit values is exact in float32 or rounded once more.
// R16(x): x rounded to the variable's type.
#define R16(x) kdrt_round_to(kind, (x))

// Where the variable and its slots are kept: float32 buffers of exact
// 16-bit values, or, kind | KDRT_STORE16 (kdcc's store16.c, var16), their
// 16 bits (kdrt_round.h's kdrt_bf16_bits, kdrt_f16_bits), two to a float.
// The kernels read element i (kdrt_ld16), update it as below in float32
// (the same value either way: the 16 bits are the value's own) and store
// it back (kdrt_st16); the gradient is float32 both ways. (KDRT_STORE16:
// kdrt_defs.h)

static inline KDRT_HD float kdrt_ld16(const void *p, size_t i, int kind) {
  if (!(kind & KDRT_STORE16)) return ((const float *)p)[i];
  return kdrt_value16(kind & ~KDRT_STORE16, ((const uint16_t *)p)[i]);
}

static inline KDRT_HD void kdrt_st16(void *p, size_t i, float x, int kind) {
  if (!(kind & KDRT_STORE16)) ((float *)p)[i] = x;
  else ((uint16_t *)p)[i] = kdrt_bits16(kind & ~KDRT_STORE16, x);
}

// Slot p's element i (NULL: the configuration has none) into *x, and the
// pointer the updates below take for it (their index 0), or NULL.
static inline KDRT_HD float *kdrt_slot16(const void *p, size_t i, float *x, int kind) {
  if (!p) return NULL;
  *x = kdrt_ld16(p, i, kind);
  return x;
}

static inline KDRT_HD void kdrt_put16(void *p, size_t i, const float *x, int kind) {
  if (p) kdrt_st16(p, i, *x, kind);
}

// base_optimizer's weight decay in 16 bits: w - w * wd * lr, wd and lr cast.
static inline KDRT_HD float kdrt_decay16(float w, float wd, float lr, int kind) {
  return R16(w - R16(R16(w * wd) * lr));
}

// SGD: lr and momentum already rounded (R16).
static inline KDRT_HD float kdrt_sgd16_at(float w, const float *g, float *m, size_t i, float lr,
                                          float momentum, int nesterov, int kind) {
  float gl = R16(R16(g[i]) * lr);
  if (!m) return R16(w - gl);
  float mi = R16(R16(m[i] * momentum) - gl);
  m[i] = mi;
  if (nesterov) mi = R16(R16(mi * momentum) - gl);
  return R16(w + mi);
}

// Adam's step scalars in 16 bits: the step cast, b^t of the cast betas,
// alpha = lr * sqrt(1 - b2^t) / (1 - b1^t), 1 - b (a Python float cast),
// epsilon cast. pow in double, so the CPU and the GPU agree.
typedef struct {
  float alpha, c1, c2, eps;
} kdrt_adam16_k;

static inline KDRT_HD kdrt_adam16_k kdrt_adam16_coef(float lr, float b1, float b2, float eps,
                                                     int64_t t, int kind) {
  float t16 = R16((float)t);
  float p1 = R16((float)pow((double)R16(b1), (double)t16));
  float p2 = R16((float)pow((double)R16(b2), (double)t16));
  float s = R16(sqrtf(R16(1.0f - p2)));
  kdrt_adam16_k k;
  k.alpha = R16(R16(R16(lr) * s) / R16(1.0f - p1));
  k.c1 = R16((float)(1.0 - (double)b1));
  k.c2 = R16((float)(1.0 - (double)b2));
  k.eps = R16(eps);
  return k;
}

// Adam's m += (g - m) * (1 - b1), v += (g^2 - v) * (1 - b2) and
// w -= m * alpha / (sqrt(v) + eps), each op rounded.
static inline KDRT_HD float kdrt_adam16_at(float w, const float *g, float *m, float *v,
                                           float *vhat, size_t i, kdrt_adam16_k k, int kind) {
  float gi = R16(g[i]);
  float mi = R16(m[i] + R16(R16(gi - m[i]) * k.c1));
  float g2 = R16(gi * gi);
  float vi = R16(v[i] + R16(R16(g2 - v[i]) * k.c2));
  m[i] = mi;
  v[i] = vi;
  if (vhat) vhat[i] = vi = fmaxf(vhat[i], vi);
  float den = R16(R16(sqrtf(vi)) + k.eps);
  return R16(w - R16(R16(mi * k.alpha) / den));
}

// RMSprop (keras/src/optimizers/rmsprop.py): rho, momentum and epsilon
// cast, c = 1 - rho a Python float cast; velocity = rho*v + c*g^2,
// centered: average_grad = rho*a + c*g and the denominator (v - a^2) + eps,
// else v + eps; increment = lr*g / sqrt(den); momentum: m = momentum*m +
// increment, w -= m.
static inline KDRT_HD float kdrt_rmsprop16_at(float w, const float *g, float *v, float *m,
                                              float *a, size_t i, float lr, float rho, float c,
                                              float momentum, float eps, int kind) {
  float gi = R16(g[i]);
  float vi = R16(R16(rho * v[i]) + R16(c * R16(gi * gi)));
  v[i] = vi;
  float den = R16(vi + eps);
  if (a) {
    float ai = R16(R16(rho * a[i]) + R16(c * gi));
    a[i] = ai;
    den = R16(R16(vi - R16(ai * ai)) + eps);
  }
  float inc = R16(R16(lr * gi) / R16(sqrtf(den)));
  if (m) inc = m[i] = R16(R16(momentum * m[i]) + inc);
  return R16(w - inc);
}

// x / d, d a scalar (the same for every element): under float16 XLA's
// algebraic simplifier makes it x times the reciprocal, which it rounds to
// float16 (Keras's float16 runs, eager and jit, as tests/sh/opt16.sh
// measures); bfloat16's reciprocal it keeps in float32, which rounds as the
// division does (opt16.sh: equal).
static inline KDRT_HD float kdrt_div16s(float x, float d, int kind) {
  return kind == KDRT_ROUND_F16 ? R16(x * R16(1.0f / d)) : R16(x / d);
}

// Adagrad: accumulator += g^2 (its first value, initial_accumulator_value,
// cast too: emit.c's slot_init); w -= lr*g / sqrt(accumulator + eps).
static inline KDRT_HD float kdrt_adagrad16_at(float w, const float *g, float *acc, size_t i,
                                              float lr, float eps, int kind) {
  float gi = R16(g[i]), ai = R16(acc[i] + R16(gi * gi));
  acc[i] = ai;
  return R16(w - R16(R16(lr * gi) / R16(sqrtf(R16(ai + eps)))));
}

// Adamax's and Nadam's step scalars in 16 bits (kdrt_adamax16_coef,
// kdrt_nadam16_coef), every one of them cast or rounded as Keras forms it.
typedef struct {
  float c1, b2, eps, bias;
} kdrt_adamax16_k;

// Adamax: the step cast, b1^t of the cast b1, bias = 1 - b1^t; 1 - b1 a
// Python float cast.
static inline KDRT_HD kdrt_adamax16_k kdrt_adamax16_coef(float b1, float b2, float eps,
                                                         int64_t t, int kind) {
  float p1 = R16((float)pow((double)R16(b1), (double)R16((float)t)));
  kdrt_adamax16_k k = {R16((float)(1.0 - (double)b1)), R16(b2), R16(eps), R16(1.0f - p1)};
  return k;
}

// m += (g - m) * (1 - b1); u = max(b2*u, |g|); w -= lr*m / (bias * (u + eps)).
static inline KDRT_HD float kdrt_adamax16_at(float w, const float *g, float *m, float *u,
                                             size_t i, float lr, kdrt_adamax16_k k, int kind) {
  float gi = R16(g[i]);
  float mi = R16(m[i] + R16(R16(gi - m[i]) * k.c1));
  float ui = fmaxf(R16(k.b2 * u[i]), fabsf(gi));
  m[i] = mi;
  u[i] = ui;
  return R16(w - R16(R16(lr * mi) / R16(k.bias * R16(ui + k.eps))));
}

// Nadam: u_t = b1 * (1 - 0.5 * 0.96^t) at t and t + 1 (the steps, 0.96
// and the betas cast), the running product u_prod (its own dtype's,
// kdrt_nadam_product16 or the float32 one) cast, then kdrt_nadam_k's
// scalars: u_next, 1 - u_prod*u_next, 1 - u_t, 1 - u_prod, 1 - b2^t; and
// here 1 - b1, 1 - b2 of the cast betas (tensors, not Python floats).
typedef struct {
  kdrt_nadam_k k;
  float c1, c2, eps;
} kdrt_nadam16_k;

static inline KDRT_HD float kdrt_nadam16_u(float b1, int64_t t, int kind) {
  float p = R16((float)pow((double)R16(0.96f), (double)R16((float)t)));
  return R16(R16(b1) * R16(1.0f - R16(0.5f * p)));
}

static inline KDRT_HD kdrt_nadam16_k kdrt_nadam16_coef(float b1, float b2, float eps, int64_t t,
                                                       float u_prod, int kind) {
  const float u_t = kdrt_nadam16_u(b1, t, kind), u_next = kdrt_nadam16_u(b1, t + 1, kind);
  const float up = R16(u_prod), up_next = R16(up * u_next);
  const float p2 = R16((float)pow((double)R16(b2), (double)R16((float)t)));
  kdrt_nadam16_k k = {{u_next, R16(1.0f - up_next), R16(1.0f - u_t), R16(1.0f - up),
                       R16(1.0f - p2)},
                      R16(1.0f - R16(b1)), R16(1.0f - R16(b2)), R16(eps)};
  return k;
}

// m += (g - m) * c1; v += (g^2 - v) * c2; m_hat = u_next*m / (1 -
// u_prod*u_next) + (1 - u_t)*g / (1 - u_prod); v_hat = v / (1 - b2^t)
// (three divisions by scalars: kdrt_div16s); w -= m_hat*lr / (sqrt(v_hat) + eps).
static inline KDRT_HD float kdrt_nadam16_at(float w, const float *g, float *m, float *v,
                                            size_t i, float lr, kdrt_nadam16_k k, int kind) {
  float gi = R16(g[i]);
  float mi = R16(m[i] + R16(R16(gi - m[i]) * k.c1));
  float vi = R16(v[i] + R16(R16(R16(gi * gi) - v[i]) * k.c2));
  m[i] = mi;
  v[i] = vi;
  float mhat = R16(kdrt_div16s(R16(k.k.u_next * mi), k.k.d1, kind) +
                   kdrt_div16s(R16(k.k.k2 * gi), k.k.d2, kind));
  float vhat = kdrt_div16s(vi, k.k.bias2, kind);
  return R16(w - R16(R16(mhat * lr) / R16(R16(sqrtf(vhat)) + k.eps)));
}

// Lion: b1, b2 cast, c1 = 1 - b1, c2 = 1 - b2 of the cast betas;
// w -= lr * sign(m*b1 + g*c1), then m = m*b2 + g*c2 (lr * ±1 is exact).
static inline KDRT_HD float kdrt_lion16_at(float w, const float *g, float *m, size_t i, float lr,
                                           float b1, float c1, float b2, float c2, int kind) {
  float gi = R16(g[i]), d = R16(R16(m[i] * b1) + R16(gi * c1));
  m[i] = R16(R16(m[i] * b2) + R16(gi * c2));
  return R16(w - lr * (float)((d > 0.0f) - (d < 0.0f)));
}

// Nadam's running product (nadam.py's _backend_update_step, once a step
// before the updates) in the 16-bit dtype of the model's first trainable
// variable, which Keras makes it: u = u * b1 * (1 - 0.5 * 0.96^t), each op
// rounded (0.96, b1 and the step cast).
static inline KDRT_HD float kdrt_nadam16_next(float u, float b1, int64_t t, int kind) {
  float p = R16((float)pow((double)R16(0.96f), (double)R16((float)t)));
  return R16(R16(u * R16(b1)) * R16(1.0f - R16(0.5f * p)));
}

// Clipping in 16 bits (base_optimizer's _clip_gradients on the gradients,
// which are of the variable's dtype): clipnorm's _clip_by_norm, per
// gradient, l2sum = sum(g^2) (jnp.sum adds 16-bit values in float32 and
// rounds the sum: s, the float32 sum of the rounded squares, rounded
// here), l2norm = sqrt(l2sum) where l2sum > 0 (else l2sum), and g * c /
// max(l2norm, c), c cast; global_clipnorm's clip_by_global_norm, the
// norm sqrt(sum of each gradient's rounded sum) and the scale c * min(1 /
// norm, 1 / c) + (norm - norm), g * scale. kdrt_clip_factor16 is the
// denominator max(l2norm, c) (clipnorm) or the scale (global), from s;
// kdrt_clip16 clips one gradient by it (c16: clipnorm cast; 0: global).
// clipvalue needs nothing of its own: clip(g, -c, c) to a cast c is the
// same as clipping first and rounding after (ops.c's update_emit).
static inline KDRT_HD float kdrt_clip_factor16(float s, float c, int global, int kind) {
  const float l2 = R16(s), c16 = R16(c);
  if (!global) {
    float norm = l2 > 0.0f ? R16(sqrtf(l2)) : l2;
    return isnan(norm) ? norm : fmaxf(norm, c16); // jnp.maximum keeps a NaN
  }
  const float norm = R16(sqrtf(l2)), inv = R16(1.0f / norm);
  const float m = isnan(inv) ? inv : fminf(inv, R16((float)(1.0 / (double)c)));
  return R16(R16(c16 * m) + R16(norm - norm));
}

static inline KDRT_HD float kdrt_clip16(float g, float f, float c16, int kind) {
  return c16 > 0.0f ? kdrt_div16s(R16(R16(g) * c16), f, kind) : R16(R16(g) * f);
}

// A weight constraint's scale on a 16-bit variable (keras/src/constraints/
// constraints.py, applied by the optimizer after the updates, in the
// variable's dtype): norms = sqrt(sum(w^2)) (s, the float32 sum of the
// rounded squares, rounded as jnp.sum does), desired = rate * clip(norms,
// lo, hi) + (1 - rate) * norms, desired / (epsilon + norms), each op
// rounded, every constant cast; then w times it, rounded (autodiff.c's
// constrain). MaxNorm is rate 1, lo 0: desired = clip(norms, 0, hi)
// exactly. UnitNorm (w / (epsilon + norms), a division) kdcc refuses.
static inline KDRT_HD float kdrt_clip_norm16_1(float s, float lo, float hi, float rate, float rest,
                                             int kind) {
  const float norm = R16(sqrtf(R16(s)));
  const float desired =
      R16(R16(R16(rate) * fminf(fmaxf(norm, R16(lo)), R16(hi))) + R16(R16(rest) * norm));
  return R16(desired / R16(R16(1e-7f) + norm));
}
#undef R16

// ---- gradient clipping and loss scaling

// clipvalue: each gradient into [-c, c].
static inline KDRT_HD float kdrt_clip(float g, float c) { return fminf(fmaxf(g, -c), c); }

// The factor that clipnorm / global_clipnorm c multiplies the gradients
// by, from the sum of their squares.
static inline KDRT_HD float kdrt_clip_factor(float sumsq, float c, int global) {
  float norm = sqrtf(sumsq);
  if (global) // clip_by_global_norm: + (norm - norm) makes a non-finite norm NaN
    return c * fminf(1.0f / norm, 1.0f / c) + (norm - norm);
  return isnan(norm) ? norm : c / fmaxf(norm, c); // _clip_by_norm: a zero gradient keeps its zeros
}

// LossScaleOptimizer: a gradient is divided by the scale s the loss was
// multiplied by, after every one was found finite.
static inline KDRT_HD float kdrt_unscale(float g, float s) { return g / s; }

// ---- the step's scalars (t: the step, from 1)

// Adamax's bias correction 1 - b1^t.
static inline KDRT_HD float kdrt_adamax_bias(float b1, int64_t t) {
  return 1.0f - powf(b1, (float)t);
}

// Nadam's momentum schedule u_t = b1 * (1 - 0.5 * 0.96^t).
static inline KDRT_HD float kdrt_nadam_u(float b1, int64_t t) {
  return b1 * (1.0f - 0.5f * powf(0.96f, (float)t));
}

// u_prod: Keras's running product of u up to t (kdrt_nadam_product).
static inline KDRT_HD kdrt_nadam_k kdrt_nadam_coef(float b1, float b2, int64_t t, float u_prod) {
  const float u_t = kdrt_nadam_u(b1, t), u_next = kdrt_nadam_u(b1, t + 1);
  kdrt_nadam_k k = {u_next, 1.0f - u_prod * u_next, 1.0f - u_t, 1.0f - u_prod,
                    1.0f - powf(b2, (float)t)};
  return k;
}

// ---- issue 23: UnitNorm and an activity penalty's batch mean in 16 bits

// UnitNorm on a 16-bit variable (constraints.py: w / (epsilon + norms) in
// the variable's dtype): norms as kdrt_clip_norm16_1's, the denominator d =
// epsilon (cast) + norms, rounded, and the factor w is multiplied by
// (autodiff.c's constrain, the product rounded), as XLA divides by d: under
// float16 its reciprocal rounded (kdrt_div16s: XLA's simplifier makes the
// division by a broadcast a product, eager and jit); under bfloat16 1 / d in
// float32, whose product rounds as Keras's eager division w / d does (two
// bfloat16 values' quotient is never within float32's error of a bfloat16
// tie: tests/sh/opt16.sh, equal).
static inline KDRT_HD float kdrt_unit_norm16_1(float s, int kind) {
  const float norm = kdrt_round_to(kind, sqrtf(kdrt_round_to(kind, s)));
  const float d = kdrt_round_to(kind, kdrt_round_to(kind, 1e-7f) + norm);
  return kind == KDRT_ROUND_F16 ? kdrt_round_to(kind, 1.0f / d) : 1.0f / d;
}

// An activity penalty p of the 16-bit type kind over the step's rows
// (Layer.__call__: divide_no_nan(p, rows cast to p's dtype), in that dtype):
// p / rows16 in float32, the ROUND after it rounding as Keras's eager
// division does (float16's jit run multiplies by the rounded reciprocal of
// its constant batch instead). Linear in p, so a gradient passes through.
static inline KDRT_HD float kdrt_batch_mean16_1(float p, double rows, int kind) {
  const float r = kdrt_round_to(kind, (float)rows);
  return r == 0.0f ? 0.0f : p / r;
}

#endif
