// layers.c: the CPU kernels of issue 11's layers (kdrt_ops.h's entries
// marked issue 11). The CUDA versions are cuda/layers.cu.
#include "kdrt.h"

// w = w * momentum + x * rest, in place: a moving statistic's update
// (BatchNormalization's moving_mean and moving_variance), rest = 1 -
// momentum rounded once, so each product rounds as Keras's does.
void kdrt_ema(float *w, const float *x, size_t n, float momentum, float rest) {
  for (size_t i = 0; i < n; i++)
    w[i] = w[i] * momentum + x[i] * rest;
}
