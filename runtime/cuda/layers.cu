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
