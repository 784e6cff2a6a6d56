// more_layers.cu: the CUDA kernels of ../more_layers.c.
#include "common.cuh"
#include "kdrt_layers.h"
#include "kdrt_round.h"

__global__ static void maximum_kernel(float *y, const float *a, const float *b, float c, int min,
                                      size_t n) {
  KDRT_FOR(i, n) y[i] = kdrt_max1(a[i], b ? b[i] : c, min);
}

extern "C" void kdrt_cuda_maximum(kdrt_cuda *d, float *y, const float *a, const float *b, float c,
                                  int min, size_t n) {
  if (!n) return;
  maximum_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(y, a, b, c, min, n);
  KDRT_LAUNCHED(d, "maximum_kernel");
}

__global__ static void maximum_grad_kernel(float *dx, const float *dy, const float *a,
                                           const float *b, float c, int min, size_t n) {
  KDRT_FOR(i, n) dx[i] = kdrt_max_grad1(dy[i], a[i], b ? b[i] : c, min);
}

extern "C" void kdrt_cuda_maximum_grad(kdrt_cuda *d, float *dx, const float *dy, const float *a,
                                       const float *b, float c, int min, size_t n) {
  if (!n) return;
  maximum_grad_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(dx, dy, a, b, c, min,
                                                                            n);
  KDRT_LAUNCHED(d, "maximum_grad_kernel");
}

__global__ static void fill_kernel(float *y, float v, size_t n) {
  KDRT_FOR(i, n) y[i] = v;
}

extern "C" void kdrt_cuda_fill(kdrt_cuda *d, float *y, float v, size_t n) {
  if (!n) return;
  fill_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(y, v, n);
  KDRT_LAUNCHED(d, "fill_kernel");
}

extern "C" void kdrt_cuda_load_const(kdrt_cuda *d, float *y, const float *k, size_t n) {
  if (!n) return;
  CUDA_CHECK(cudaMemcpyAsync(y, k, n * sizeof *y, cudaMemcpyHostToDevice, d->impl->stream));
}

// issue 23: the same rounding as the CPU's (kdrt_round.h)
__global__ static void round_kernel(int kind, float *y, const float *x, size_t n) {
  KDRT_FOR(i, n) y[i] = kdrt_round_to(kind, x[i]);
}

extern "C" void kdrt_cuda_round(kdrt_cuda *d, int kind, float *y, const float *x, size_t n) {
  if (!n) return;
  round_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(kind, y, x, n);
  KDRT_LAUNCHED(d, "round_kernel");
}

// issue 23: a saved 16-bit value in its 16 bits, and back: the CPU's
// functions (kdrt_round.h), element for element, so the same bits.
__global__ static void pack16_kernel(int kind, uint16_t *y, const float *x, size_t n) {
  if (kind == KDRT_ROUND_F16) {
    KDRT_FOR(i, n) y[i] = kdrt_f16_bits(x[i]);
  } else {
    KDRT_FOR(i, n) y[i] = kdrt_bf16_bits(x[i]);
  }
}

__global__ static void unpack16_kernel(int kind, float *y, const uint16_t *x, size_t n) {
  if (kind == KDRT_ROUND_F16) {
    KDRT_FOR(i, n) y[i] = kdrt_f16_value(x[i]);
  } else {
    KDRT_FOR(i, n) y[i] = kdrt_bf16_value(x[i]);
  }
}

extern "C" void kdrt_cuda_pack16(kdrt_cuda *d, int kind, uint16_t *y, const float *x, size_t n) {
  if (!n) return;
  pack16_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(kind, y, x, n);
  KDRT_LAUNCHED(d, "pack16_kernel");
}

// issue 23: round's value straight in its 16 bits (a value only 16-bit
// products read), the CPU's functions element for element
__global__ static void round16_kernel(int kind, uint16_t *y, const float *x, size_t n) {
  if (kind == KDRT_ROUND_F16) {
    KDRT_FOR(i, n) y[i] = kdrt_f16_bits(kdrt_round_f16(x[i]));
  } else {
    KDRT_FOR(i, n) y[i] = kdrt_bf16_bits(kdrt_round_bf16(x[i]));
  }
}

extern "C" void kdrt_cuda_round16(kdrt_cuda *d, int kind, uint16_t *y, const float *x, size_t n) {
  if (!n) return;
  round16_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(kind, y, x, n);
  KDRT_LAUNCHED(d, "round16_kernel");
}

extern "C" void kdrt_cuda_unpack16(kdrt_cuda *d, int kind, float *y, const uint16_t *x, size_t n) {
  if (!n) return;
  unpack16_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(kind, y, x, n);
  KDRT_LAUNCHED(d, "unpack16_kernel");
}
