// layers.cu: the CUDA kernels of issue 11's layers, as ../layers.c.
#include "common.cuh"

__global__ static void ema_kernel(float *w, const float *x, size_t n, float momentum, float rest) {
  KDRT_FOR(i, n) w[i] = __fadd_rn(__fmul_rn(w[i], momentum), __fmul_rn(x[i], rest));
}

extern "C" void kdrt_cuda_ema(kdrt_cuda *d, float *w, const float *x, size_t n, float momentum,
                              float rest) {
  if (!n) return;
  ema_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(w, x, n, momentum, rest);
  KDRT_LAUNCHED(d, "ema_kernel");
}

__global__ static void clip_norm_kernel(float *f, const float *s, size_t n, float lo, float hi,
                                        float rate, float rest) {
  KDRT_FOR(i, n) {
    float norm = __fsqrt_rn(s[i]);
    float desired = __fadd_rn(__fmul_rn(rate, fminf(fmaxf(norm, lo), hi)), __fmul_rn(rest, norm));
    f[i] = __fdiv_rn(desired, __fadd_rn(1e-7f, norm));
  }
}

extern "C" void kdrt_cuda_clip_norm(kdrt_cuda *d, float *f, const float *s, size_t n, float lo,
                                    float hi, float rate, float rest) {
  if (!n) return;
  clip_norm_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(f, s, n, lo, hi, rate,
                                                                         rest);
  KDRT_LAUNCHED(d, "clip_norm_kernel");
}

// As ../layers.c's kdrt_pact: Keras's LeakyReLU, ELU and ReLU parameters.
__device__ static float pact1(int kind, float x, float a, float max, float t) {
  if (kind == KDRT_PACT_LEAKY) return x >= 0.0f ? x : __fmul_rn(a, x);
  if (kind == KDRT_PACT_ELU) return x > 0.0f ? x : __fmul_rn(a, expm1f(x));
  float p = t != 0.0f ? (x > t ? x : 0.0f) : x > 0.0f ? x : 0.0f;
  if (isfinite(max)) p = p < 0.0f ? 0.0f : p > max ? max : p;
  if (a != 0.0f) {
    float neg = __fadd_rn(-x, t);
    p = __fsub_rn(p, __fmul_rn(a, neg > 0.0f ? neg : 0.0f));
  }
  return p;
}

__device__ static float pact_d(int kind, float x, float a, float max, float t) {
  if (kind == KDRT_PACT_LEAKY) return x >= 0.0f ? 1.0f : a;
  if (kind == KDRT_PACT_ELU) return x > 0.0f ? 1.0f : __fmul_rn(a, expf(x));
  bool kept = x > t && (!isfinite(max) || (x > 0.0f && x < max));
  return __fadd_rn(kept ? 1.0f : 0.0f, x < t ? a : 0.0f);
}

__global__ static void pact_kernel(int kind, float *y, const float *x, size_t n, float a,
                                   float max, float t) {
  KDRT_FOR(i, n) y[i] = pact1(kind, x[i], a, max, t);
}

__global__ static void pact_grad_kernel(int kind, float *dx, const float *dy, const float *x,
                                        size_t n, float a, float max, float t) {
  KDRT_FOR(i, n) dx[i] = __fmul_rn(dy[i], pact_d(kind, x[i], a, max, t));
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
