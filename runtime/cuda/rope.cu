// rope.cu: issue 24's rotary position embedding (kdrt_rope), as ../ops.c
// computes it: the same descriptor and the same per-pair math
// (../kdrt_rope.h), one thread a feature pair. The descriptor goes by
// value, so a step captured as a CUDA graph keeps its frequencies.
#include "common.cuh"

__global__ static void rope_kernel(float *y, const float *x, const kdrt_rotary r,
                                   int64_t outer, int64_t t, int64_t inner, int64_t t0,
                                   int inverse) {
  const int64_t h = r.half;
  size_t n = (size_t)outer * (size_t)t * (size_t)inner * (size_t)h;
  KDRT_FOR(k, n) {
    int64_t j = (int64_t)(k % (size_t)h), row = (int64_t)(k / (size_t)h);
    int64_t i = row / inner % t;
    float c, s;
    kdrt_rope_cs(&r, t0 + i, j, &c, &s);
    const float *xr = x + row * 2 * h;
    float *yr = y + row * 2 * h;
    float x0 = xr[j], x1 = xr[j + h];
    kdrt_rope_pair(x0, x1, c, s, inverse, &yr[j], &yr[j + h]);
  }
}

extern "C" void kdrt_cuda_rope(kdrt_cuda *d, float *y, const float *x, const kdrt_rotary *r,
                               int64_t outer, int64_t t, int64_t inner, int64_t t0,
                               int inverse) {
  size_t n = (size_t)outer * (size_t)t * (size_t)inner * (size_t)r->half;
  if (!n) return;
  rope_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(y, x, *r, outer, t, inner, t0,
                                                                    inverse);
  KDRT_LAUNCHED(d, "rope_kernel");
}
