// act.cu: elementwise ops: activations and their gradients (kdrt_act,
// kdrt_act_grad in ../ops.c), the n-ary add, the product and the affine
// scale. The activation formulas are kdrt_defs.h's KDRT_ACT_LIST, expanded
// into one switch case per activation, as the CPU kernels expand it. One
// thread per element; outputs may alias an input of the same shape (each
// element is read before it is written, by one thread).
#include "common.cuh"

__global__ static void act_kernel(int act, float *out, const float *in, size_t n) {
  KDRT_FOR(i, n) {
    out[i] = kdrt_act1(act, in[i]);
  }
}

// As kdrt_act_grad: the FROM_X activations read x (y recomputed where the
// derivative wants it), the others read y only.
__global__ static void act_grad_kernel(int act, float *dx, const float *dy, const float *xs,
                                       const float *ys, size_t n) {
  KDRT_FOR(i, n) {
    float g = dy[i], r = g;
    switch (act) {
#define KDRT_X(name, kname, from_x, f, df)                                                       \
  case KDRT_ACT_##name: {                                                                        \
    float v = from_x ? xs[i] : ys[i];                                                            \
    [[maybe_unused]] float y = from_x ? (f) : v;                                                 \
    r = g * (df);                                                                                \
    break;                                                                                       \
  }
      KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
    }
    dx[i] = r;
  }
}

static void check_act(int act, const char *what) {
  if (act < 0 || act >= KDRT_ACT_COUNT) kdrt_cuda_fail(what, __FILE__, __LINE__, "unknown activation");
}

extern "C" void kdrt_cuda_act(kdrt_cuda *d, int act, float *y, const float *x, size_t n) {
  check_act(act, "kdrt_cuda_act");
  if (!n) return;
  if (act == KDRT_ACT_LINEAR) {
    kdrt_cuda_copy(d, y, x, n);
    return;
  }
  act_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(act, y, x, n);
  KDRT_LAUNCHED(d, "act_kernel");
}

extern "C" void kdrt_cuda_act_grad(kdrt_cuda *d, int act, float *dx, const float *dy,
                                   const float *x, const float *y, size_t n) {
  check_act(act, "kdrt_cuda_act_grad");
  if (!n) return;
  if (act == KDRT_ACT_LINEAR) {
    kdrt_cuda_copy(d, dx, dy, n);
    return;
  }
  act_grad_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(act, dx, dy, x, y, n);
  KDRT_LAUNCHED(d, "act_grad_kernel");
}

#define KDRT_MAX_ADD 8
typedef struct {
  const float *p[KDRT_MAX_ADD];
} add_args;

// The operands are indexed by constants only (the loop unrolled, the count
// tested): a run-time index into the parameter array put it in local
// memory, and the kernel ran 5x under bandwidth (the first GPU run). The
// sum is still left to right, as the CPU's.
__global__ static void add_kernel(float *out, add_args in, int nin, size_t n) {
  KDRT_FOR(i, n) {
    float s = in.p[0][i];
#pragma unroll
    for (int k = 1; k < KDRT_MAX_ADD; k++)
      if (k < nin) s = s + in.p[k][i];
    out[i] = s;
  }
}

extern "C" void kdrt_cuda_add(kdrt_cuda *d, float *out, const float *const *in, int nin,
                              size_t n) {
  if (nin < 1 || nin > KDRT_MAX_ADD)
    kdrt_cuda_fail("kdrt_cuda_add", __FILE__, __LINE__, "between 1 and 8 operands");
  if (!n) return;
  add_args a;
  for (int k = 0; k < nin; k++) a.p[k] = in[k];
  add_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, a, nin, n);
  KDRT_LAUNCHED(d, "add_kernel");
}

__global__ static void scale_kernel(float *out, const float *in, size_t n, float scale,
                                    float shift) {
  KDRT_FOR(i, n) out[i] = in[i] * scale + shift;
}

extern "C" void kdrt_cuda_scale(kdrt_cuda *d, float *out, const float *in, size_t n, float scale,
                                float shift) {
  if (!n) return;
  scale_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, in, n, scale, shift);
  KDRT_LAUNCHED(d, "scale_kernel");
}

__global__ static void mul_kernel(float *out, const float *a, const float *b, size_t n) {
  KDRT_FOR(i, n) out[i] = a[i] * b[i];
}

extern "C" void kdrt_cuda_mul(kdrt_cuda *d, float *out, const float *a, const float *b, size_t n) {
  if (!n) return;
  mul_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, a, b, n);
  KDRT_LAUNCHED(d, "mul_kernel");
}
