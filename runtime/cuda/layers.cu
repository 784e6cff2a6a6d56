// layers.cu: the CUDA kernels of issue 11's layers, as ../layers.c, each
// element's math ../kdrt_layers.h's.
#include "common.cuh"
#include "kdrt_layers.h"

__global__ static void ema_kernel(float *w, const float *x, size_t n, float momentum, float rest) {
  KDRT_FOR(i, n) w[i] = kdrt_ema1(w[i], x[i], momentum, rest);
}

extern "C" void kdrt_cuda_ema(kdrt_cuda *d, float *w, const float *x, size_t n, float momentum,
                              float rest) {
  if (!n) return;
  ema_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(w, x, n, momentum, rest);
  KDRT_LAUNCHED(d, "ema_kernel");
}

__global__ static void clip_norm_kernel(float *f, const float *s, size_t n, float lo, float hi,
                                        float rate, float rest) {
  KDRT_FOR(i, n) f[i] = kdrt_clip_norm1(sqrtf(s[i]), lo, hi, rate, rest);
}

extern "C" void kdrt_cuda_clip_norm(kdrt_cuda *d, float *f, const float *s, size_t n, float lo,
                                    float hi, float rate, float rest) {
  if (!n) return;
  clip_norm_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(f, s, n, lo, hi, rate,
                                                                         rest);
  KDRT_LAUNCHED(d, "clip_norm_kernel");
}

__global__ static void pact_kernel(int kind, float *y, const float *x, size_t n, float a,
                                   float max, float t) {
  KDRT_FOR(i, n) y[i] = kdrt_pact1(kind, x[i], a, max, t);
}

__global__ static void pact_grad_kernel(int kind, float *dx, const float *dy, const float *x,
                                        size_t n, float a, float max, float t) {
  KDRT_FOR(i, n) dx[i] = dy[i] * kdrt_pact_d(kind, x[i], a, max, t);
}

extern "C" void kdrt_cuda_pact(kdrt_cuda *d, int kind, float *y, const float *x, size_t n,
                               float alpha, float max, float threshold) {
  if (!n) return;
  pact_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(kind, y, x, n, alpha, max,
                                                                    threshold);
  KDRT_LAUNCHED(d, "pact_kernel");
}

extern "C" void kdrt_cuda_pact_grad(kdrt_cuda *d, int kind, float *dx, const float *dy,
                                    const float *x, size_t n, float alpha, float max,
                                    float threshold) {
  if (!n) return;
  pact_grad_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(kind, dx, dy, x, n,
                                                                         alpha, max, threshold);
  KDRT_LAUNCHED(d, "pact_grad_kernel");
}
