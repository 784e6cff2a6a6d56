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
