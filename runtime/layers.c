// layers.c: the CPU kernels of issue 11's layers (kdrt_ops.h's entries
// marked issue 11). The CUDA versions are cuda/layers.cu.
#include "kdrt.h"

#include <math.h>
#include <stdbool.h>

// w = w * momentum + x * rest, in place: a moving statistic's update
// (BatchNormalization's moving_mean and moving_variance), rest = 1 -
// momentum rounded once, so each product rounds as Keras's does.
void kdrt_ema(float *w, const float *x, size_t n, float momentum, float rest) {
  for (size_t i = 0; i < n; i++)
    w[i] = w[i] * momentum + x[i] * rest;
}

// A weight constraint's scale (Keras's MaxNorm, UnitNorm, MinMaxNorm): the
// desired norm over 1e-7 (Keras's epsilon) plus the norm, each step
// rounded as Keras's float32 ops round it.
void kdrt_clip_norm(float *f, const float *s, size_t n, float lo, float hi, float rate,
                    float rest) {
  for (size_t i = 0; i < n; i++) {
    float norm = sqrtf(s[i]);
    float desired = rate * fminf(fmaxf(norm, lo), hi) + rest * norm;
    f[i] = desired / (1e-7f + norm);
  }
}

// Activation layers with Keras's parameters, as jax.nn computes them:
// leaky_relu is where(x >= 0, x, alpha * x); elu where(x > 0, x, alpha *
// expm1(x)); Keras's relu(x, negative_slope, max_value, threshold) is x
// where x > threshold (else 0) -- relu6 when max is 6 and there is no
// threshold -- clipped to [0, max] when there is a max, less alpha *
// relu(threshold - x). Gradients are JAX's, except at the ties (x exactly
// 0 or max with a max) where JAX's clip splits the gradient in halves.
static float pact1(int kind, float x, float a, float max, float t) {
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

static float pact_d(int kind, float x, float a, float max, float t) {
  if (kind == KDRT_PACT_LEAKY) return x >= 0.0f ? 1.0f : a;
  if (kind == KDRT_PACT_ELU) return x > 0.0f ? 1.0f : a * expf(x);
  bool kept = x > t && (!isfinite(max) || (x > 0.0f && x < max));
  return (kept ? 1.0f : 0.0f) + (x < t ? a : 0.0f);
}

void kdrt_pact(int kind, float *y, const float *x, size_t n, float alpha, float max,
               float threshold) {
  for (size_t i = 0; i < n; i++) y[i] = pact1(kind, x[i], alpha, max, threshold);
}

void kdrt_pact_grad(int kind, float *dx, const float *dy, const float *x, size_t n, float alpha,
                    float max, float threshold) {
  for (size_t i = 0; i < n; i++) dx[i] = dy[i] * pact_d(kind, x[i], alpha, max, threshold);
}
