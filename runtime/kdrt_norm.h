// kdrt_norm.h: the normalizations' formulas, written once for the CPU
// runtime (norm.c) and the CUDA one (cuda/norm.cu): plain C99 that also
// compiles as CUDA C++ (KDRT_HD marks host and device), as kdrt_rnn.h.
// The sums over a row or a column are each backend's (the CPU's in order,
// the GPU's by warps or blocks, in double both); what is made of them is
// here, so that the two differ only in those sums' rounding.
#ifndef KDRT_NORM_H
#define KDRT_NORM_H

#include <math.h>
#include <stdint.h>

#include "kdrt_defs.h" // KDRT_HD

// ---- layer and RMS normalization over the last dim (kdrt_norm,
// kdrt_norm_grad): a row's mean (0 for RMS) and rstd = 1 / sqrt(var + eps),
// var the mean square about the mean, all in double.

// Element x's squared distance from the mean m: the variance's summand.
static inline KDRT_HD double kdrt_norm_dev2(float x, double m) { return (x - m) * (x - m); }

// rstd from the sum of squared distances over cols.
static inline KDRT_HD double kdrt_norm_rstd(double sum_dev2, int64_t cols, float eps) {
  return 1.0 / sqrt(sum_dev2 / (double)cols + (double)eps);
}

// y = (x - m) * rstd.
static inline KDRT_HD float kdrt_norm_y(float x, double m, double rstd) {
  return (float)((x - m) * rstd);
}

// The gradient's second summand: dy * h, h = (x - m) * rstd.
static inline KDRT_HD double kdrt_norm_gh(float dy, float x, double m, double rstd) {
  return dy * (x - m) * rstd;
}

// dx = rstd * (dy - mean(dy) - h * mean(dy * h)); mg = mean(dy) (0 for
// RMS), mgh = mean(dy * h).
static inline KDRT_HD float kdrt_norm_dx(float dy, float x, double m, double rstd, double mg,
                                         double mgh) {
  return (float)(rstd * (dy - mg - (x - m) * rstd * mgh));
}

// ---- batch normalization (issue 15: kdrt_batch_norm, kdrt_bn_grad), per
// channel j from its mean m, variance var, gamma g and beta b.

// y = act(x * scale + shift): scale = g / sqrt(var + eps) and shift = b - m
// * scale, in float as Keras's batch_normalization forms them.
static inline KDRT_HD float kdrt_bn_scale(float var, float eps, float g) {
  return 1.0f / sqrtf(var + eps) * g;
}
static inline KDRT_HD float kdrt_bn_shift(float m, float scale, float b) {
  return -m * scale + b;
}

// The gradient dx = k * (dy - a - (x - m) * c), its factors in double:
// r = 1 / sqrt(var + eps), k = g r, a = sum(dy) / n, c = r^2 sum(dy (x -
// m)) / n (s, s2: those sums; n: the rows of the global batch).
static inline KDRT_HD void kdrt_bn_grad_coef(float var, float eps, float g, float s, float s2,
                                             double n, float *k, float *a, float *c) {
  double r = 1.0 / sqrt((double)var + (double)eps);
  *k = (float)(g * r);
  *a = (float)(s / n);
  *c = (float)(r * r * s2 / n);
}
static inline KDRT_HD float kdrt_bn_dx(float dy, float x, float m, float k, float a, float c) {
  return k * (dy - a - (x - m) * c);
}

#endif
