// layers.c: the CPU kernels of issue 11's layers (kdrt_ops.def's entries
// marked issue 11), each element's math kdrt_layers.h's. The CUDA versions
// are cuda/layers.cu.
#include "kdrt.h"
#include "kdrt_layers.h"

// w = w * momentum + x * rest, in place (kdrt_ema1).
void kdrt_ema(float *w, const float *x, size_t n, float momentum, float rest) {
  for (size_t i = 0; i < n; i++)
    w[i] = kdrt_ema1(w[i], x[i], momentum, rest);
}

// A weight constraint's scales from the sums of squares s (kdrt_clip_norm1).
void kdrt_clip_norm(float *f, const float *s, size_t n, float lo, float hi, float rate,
                    float rest) {
  for (size_t i = 0; i < n; i++)
    f[i] = kdrt_clip_norm1(sqrtf(s[i]), lo, hi, rate, rest);
}

void kdrt_pact(int kind, float *y, const float *x, size_t n, float alpha, float max,
               float threshold) {
  for (size_t i = 0; i < n; i++) y[i] = kdrt_pact1(kind, x[i], alpha, max, threshold);
}

void kdrt_pact_grad(int kind, float *dx, const float *dy, const float *x, size_t n, float alpha,
                    float max, float threshold) {
  for (size_t i = 0; i < n; i++) dx[i] = dy[i] * kdrt_pact_d(kind, x[i], alpha, max, threshold);
}
