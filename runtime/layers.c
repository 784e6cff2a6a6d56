// layers.c: the CPU kernels of issue 11's layers (kdrt_ops.h's entries
// marked issue 11). The CUDA versions are cuda/layers.cu.
#include "kdrt.h"

#include <math.h>

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
