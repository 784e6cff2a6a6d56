// kdrt_layers.h: the elementwise math of issue 11's layers, written once
// for the CPU runtime (layers.c) and the CUDA one (cuda/layers.cu): plain
// C99 that also compiles as CUDA C++ (KDRT_HD marks host and device), as
// kdrt_rnn.h. Both builds keep every product and sum as written (ISO C's
// -ffp-contract=off, nvcc's -fmad=false), each rounded as Keras's float32
// ops round it.
#ifndef KDRT_LAYERS_H
#define KDRT_LAYERS_H

#include <math.h>
#include <stdbool.h>

#include "kdrt_defs.h" // KDRT_HD, KDRT_PACT_*

// w * momentum + x * rest: a moving statistic's update
// (BatchNormalization's moving_mean and moving_variance), rest = 1 -
// momentum rounded once.
static inline KDRT_HD float kdrt_ema1(float w, float x, float momentum, float rest) {
  return w * momentum + x * rest;
}

// A weight constraint's scale (Keras's MaxNorm, UnitNorm, MinMaxNorm) from
// the norm (the square root of the sum of squares): the desired norm over
// 1e-7 (Keras's epsilon) plus the norm.
static inline KDRT_HD float kdrt_clip_norm1(float norm, float lo, float hi, float rate,
                                            float rest) {
  float desired = rate * fminf(fmaxf(norm, lo), hi) + rest * norm;
  return desired / (1e-7f + norm);
}

// Activation layers with Keras's parameters, as jax.nn computes them:
// leaky_relu is where(x >= 0, x, alpha * x); elu where(x > 0, x, alpha *
// expm1(x)); Keras's relu(x, negative_slope, max_value, threshold) is x
// where x > threshold (else 0) -- relu6 when max is 6 and there is no
// threshold -- clipped to [0, max] when there is a max, less alpha *
// relu(threshold - x).
static inline KDRT_HD float kdrt_pact1(int kind, float x, float a, float max, float t) {
  if (kind == KDRT_PACT_LEAKY) return x >= 0.0f ? x : a * x;
  if (kind == KDRT_PACT_ELU) return x > 0.0f ? x : a * expm1f(x);
  float p = t != 0.0f ? (x > t ? x : 0.0f) : x > 0.0f ? x : 0.0f;
  if (isfinite(max)) p = p < 0.0f ? 0.0f : p > max ? max : p; // (a threshold < 0 keeps x < 0)
  if (a != 0.0f) {
    float neg = -x + t;
    p -= a * (neg > 0.0f ? neg : 0.0f);
  }
  return p;
}

// Its derivative: JAX's, except at the ties (x exactly 0 or max with a
// max) where JAX's clip splits the gradient in halves.
static inline KDRT_HD float kdrt_pact_d(int kind, float x, float a, float max, float t) {
  if (kind == KDRT_PACT_LEAKY) return x >= 0.0f ? 1.0f : a;
  if (kind == KDRT_PACT_ELU) return x > 0.0f ? 1.0f : a * expf(x);
  bool kept = x > t && (!isfinite(max) || (x > 0.0f && x < max));
  return (kept ? 1.0f : 0.0f) + (x < t ? a : 0.0f);
}

// Maximum and Minimum (and the normalizations' clamps): a where it beats
// o (the larger, the smaller with min) or is a NaN, which lax.max and
// lax.min propagate; else o.
static inline KDRT_HD float kdrt_max1(float a, float o, int min) {
  return (min ? a < o : a > o) || a != a ? a : o;
}

// JAX's gradient of max(a, o) with respect to a, from dy: dy where a alone
// is the result, dy / 2 where a equals o (a tie shares it), else 0.
static inline KDRT_HD float kdrt_max_grad1(float dy, float a, float o, int min) {
  return a == o ? dy * 0.5f : (min ? a < o : a > o) ? dy : 0.0f;
}

#endif
