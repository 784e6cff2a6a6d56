// act.cu: elementwise ops: activations and their gradients (kdrt_act,
// kdrt_act_grad in ../ops.c), the n-ary add, the product, the affine scale
// and (issue 25) glu. The activation formulas are kdrt_defs.h's
// KDRT_ACT_LIST, expanded into one switch case per activation, as the CPU
// kernels expand it.
// Each thread takes W floats at a time (common.cuh: 16-byte accesses when
// the buffers allow, a scalar tail), but every element's arithmetic is the
// same float operations as one thread per element, so the results do not
// depend on W. Outputs may alias an input of the same shape (each element
// is read before it is written, by one thread). The _rnd kernels
// (kdrt_ops.def) round each value to rnd as they store it: kdrt_round.h's
// kdrt_round_opt, the CPU's bits; the plain ones are them with
// KDRT_ROUND_NONE.
#include "common.cuh"
#include "kdrt_round.h"

template <int W>
__global__ static void act_kernel(int rnd, int act, float *out, const float *in, size_t n) {
  KDRT_FOR(i, n / W) {
    float v[W];
    kdrt_ld<W>(v, in + i * W);
#pragma unroll
    for (int k = 0; k < W; k++) v[k] = kdrt_round_opt(rnd, kdrt_act1(act, v[k]));
    kdrt_st<W>(out + i * W, v);
  }
  KDRT_FOR_TAIL(i, n, W) out[i] = kdrt_round_opt(rnd, kdrt_act1(act, in[i]));
}

// As kdrt_act_grad: g * act'(v), v being x for the FROM_X activations (y
// recomputed where the derivative wants it), y for the others.
__device__ static inline float act_grad1(int act, float g, float v) {
  float r = g;
  switch (act) {
#define KDRT_X(name, kname, from_x, f, df)                                                       \
  case KDRT_ACT_##name: {                                                                        \
    [[maybe_unused]] float y = from_x ? (f) : v;                                                 \
    r = g * (df);                                                                                \
    break;                                                                                       \
  }
    KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
  }
  return r;
}

// v: x or y, whichever the activation's derivative reads (act_from_x).
template <int W>
__global__ static void act_grad_kernel(int rnd, int act, float *dx, const float *dy,
                                       const float *v, size_t n) {
  KDRT_FOR(i, n / W) {
    float g[W], a[W];
    kdrt_ld<W>(g, dy + i * W);
    kdrt_ld<W>(a, v + i * W);
#pragma unroll
    for (int k = 0; k < W; k++) g[k] = kdrt_round_opt(rnd, act_grad1(act, g[k], a[k]));
    kdrt_st<W>(dx + i * W, g);
  }
  KDRT_FOR_TAIL(i, n, W) dx[i] = kdrt_round_opt(rnd, act_grad1(act, dy[i], v[i]));
}

static const int act_from_x[] = {
#define KDRT_X(name, kname, from_x, f, df) from_x,
    KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
};

static void check_act(int act, const char *what) {
  if (act < 0 || act >= KDRT_ACT_COUNT) kdrt_cuda_fail(what, __FILE__, __LINE__, "unknown activation");
}

extern "C" void kdrt_cuda_act_rnd(kdrt_cuda *d, int rnd, int act, float *y, const float *x,
                                  size_t n) {
  check_act(act, "kdrt_cuda_act");
  if (!n) return;
  if (act == KDRT_ACT_LINEAR && rnd == KDRT_ROUND_NONE) {
    kdrt_cuda_copy(d, y, x, n);
    return;
  }
  if (kdrt_aligned16(y) && kdrt_aligned16(x))
    act_kernel<4><<<kdrt_blocks(n / 4), KDRT_THREADS, 0, d->impl->stream>>>(rnd, act, y, x, n);
  else
    act_kernel<1><<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(rnd, act, y, x, n);
  KDRT_LAUNCHED(d, "act_kernel");
}

extern "C" void kdrt_cuda_act(kdrt_cuda *d, int act, float *y, const float *x, size_t n) {
  kdrt_cuda_act_rnd(d, KDRT_ROUND_NONE, act, y, x, n);
}

extern "C" void kdrt_cuda_act_grad_rnd(kdrt_cuda *d, int rnd, int act, float *dx,
                                       const float *dy, const float *x, const float *y,
                                       size_t n) {
  check_act(act, "kdrt_cuda_act_grad");
  if (!n) return;
  if (act == KDRT_ACT_LINEAR && rnd == KDRT_ROUND_NONE) {
    kdrt_cuda_copy(d, dx, dy, n);
    return;
  }
  const float *v = act_from_x[act] ? x : y;
  if (act == KDRT_ACT_LINEAR) v = dy; // (read by no formula: any aligned buffer of n)
  if (kdrt_aligned16(dx) && kdrt_aligned16(dy) && kdrt_aligned16(v))
    act_grad_kernel<4><<<kdrt_blocks(n / 4), KDRT_THREADS, 0, d->impl->stream>>>(rnd, act, dx, dy,
                                                                                 v, n);
  else
    act_grad_kernel<1><<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(rnd, act, dx, dy, v,
                                                                             n);
  KDRT_LAUNCHED(d, "act_grad_kernel");
}

extern "C" void kdrt_cuda_act_grad(kdrt_cuda *d, int act, float *dx, const float *dy,
                                   const float *x, const float *y, size_t n) {
  kdrt_cuda_act_grad_rnd(d, KDRT_ROUND_NONE, act, dx, dy, x, y, n);
}

// issue 23: v a saved value of a 16-bit type in its 16 bits (store16.c),
// each element widened as kdrt_unpack16 widens it: the same bits as above.
__global__ static void act_grad16_kernel(int rnd, int act, int kind, float *dx, const float *dy,
                                         const uint16_t *v, size_t n) {
  KDRT_FOR(i, n) {
    float a = kdrt_value16(kind, v[i]);
    dx[i] = kdrt_round_opt(rnd, act_grad1(act, dy[i], a));
  }
}

extern "C" void kdrt_cuda_act_grad16_rnd(kdrt_cuda *d, int rnd, int act, int kind, float *dx,
                                         const float *dy, const uint16_t *v, size_t n) {
  check_act(act, "kdrt_cuda_act_grad16");
  if (!n) return;
  act_grad16_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(rnd, act, kind, dx, dy,
                                                                          v, n);
  KDRT_LAUNCHED(d, "act_grad16_kernel");
}

extern "C" void kdrt_cuda_act_grad16(kdrt_cuda *d, int act, int kind, float *dx, const float *dy,
                                     const uint16_t *v, size_t n) {
  kdrt_cuda_act_grad16_rnd(d, KDRT_ROUND_NONE, act, kind, dx, dy, v, n);
}

#define KDRT_MAX_ADD 8
typedef struct {
  const float *p[KDRT_MAX_ADD];
} add_args;

// The operands are indexed by constants only (the loops unrolled, the
// count tested): a run-time index into the parameter array put it in local
// memory, and the kernel ran 5x under bandwidth (the first GPU run). The
// sum is still left to right, as the CPU's; the nin loads of a step are
// all in flight before the first add.
template <int W>
__global__ static void add_kernel(int rnd, float *out, add_args in, int nin, size_t n) {
  KDRT_FOR(i, n / W) {
    float v[KDRT_MAX_ADD][W];
#pragma unroll
    for (int k = 0; k < KDRT_MAX_ADD; k++)
      if (k < nin) kdrt_ld<W>(v[k], in.p[k] + i * W);
#pragma unroll
    for (int k = 1; k < KDRT_MAX_ADD; k++)
      if (k < nin)
#pragma unroll
        for (int e = 0; e < W; e++) v[0][e] = v[0][e] + v[k][e];
#pragma unroll
    for (int e = 0; e < W; e++) v[0][e] = kdrt_round_opt(rnd, v[0][e]);
    kdrt_st<W>(out + i * W, v[0]);
  }
  KDRT_FOR_TAIL(i, n, W) {
    float s = in.p[0][i];
#pragma unroll
    for (int k = 1; k < KDRT_MAX_ADD; k++)
      if (k < nin) s = s + in.p[k][i];
    out[i] = kdrt_round_opt(rnd, s);
  }
}

extern "C" void kdrt_cuda_add_rnd(kdrt_cuda *d, int rnd, float *out, const float *const *in,
                                  int nin, size_t n) {
  if (nin < 1 || nin > KDRT_MAX_ADD)
    kdrt_cuda_fail("kdrt_cuda_add", __FILE__, __LINE__, "between 1 and 8 operands");
  if (!n) return;
  add_args a;
  int aligned = kdrt_aligned16(out);
  for (int k = 0; k < nin; k++) {
    a.p[k] = in[k];
    aligned = aligned && kdrt_aligned16(in[k]);
  }
  if (aligned)
    add_kernel<4><<<kdrt_blocks(n / 4), KDRT_THREADS, 0, d->impl->stream>>>(rnd, out, a, nin, n);
  else
    add_kernel<1><<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(rnd, out, a, nin, n);
  KDRT_LAUNCHED(d, "add_kernel");
}

extern "C" void kdrt_cuda_add(kdrt_cuda *d, float *out, const float *const *in, int nin,
                              size_t n) {
  kdrt_cuda_add_rnd(d, KDRT_ROUND_NONE, out, in, nin, n);
}

template <int W>
__global__ static void scale_kernel(float *out, const float *in, size_t n, float scale,
                                    float shift) {
  KDRT_FOR(i, n / W) {
    float v[W];
    kdrt_ld<W>(v, in + i * W);
#pragma unroll
    for (int k = 0; k < W; k++) v[k] = kdrt_scale1(v[k], scale, shift);
    kdrt_st<W>(out + i * W, v);
  }
  KDRT_FOR_TAIL(i, n, W) out[i] = kdrt_scale1(in[i], scale, shift);
}

extern "C" void kdrt_cuda_scale(kdrt_cuda *d, float *out, const float *in, size_t n, float scale,
                                float shift) {
  if (!n) return;
  if (kdrt_aligned16(out) && kdrt_aligned16(in))
    scale_kernel<4><<<kdrt_blocks(n / 4), KDRT_THREADS, 0, d->impl->stream>>>(out, in, n, scale,
                                                                              shift);
  else
    scale_kernel<1><<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, in, n, scale,
                                                                          shift);
  KDRT_LAUNCHED(d, "scale_kernel");
}

template <int W>
__global__ static void mul_kernel(float *out, const float *a, const float *b, size_t n) {
  KDRT_FOR(i, n / W) {
    float u[W], v[W];
    kdrt_ld<W>(u, a + i * W);
    kdrt_ld<W>(v, b + i * W);
#pragma unroll
    for (int k = 0; k < W; k++) u[k] = u[k] * v[k];
    kdrt_st<W>(out + i * W, u);
  }
  KDRT_FOR_TAIL(i, n, W) out[i] = a[i] * b[i];
}

extern "C" void kdrt_cuda_mul(kdrt_cuda *d, float *out, const float *a, const float *b, size_t n) {
  if (!n) return;
  if (kdrt_aligned16(out) && kdrt_aligned16(a) && kdrt_aligned16(b))
    mul_kernel<4><<<kdrt_blocks(n / 4), KDRT_THREADS, 0, d->impl->stream>>>(out, a, b, n);
  else
    mul_kernel<1><<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, a, b, n);
  KDRT_LAUNCHED(d, "mul_kernel");
}

// issue 25: glu (../ops.c's kdrt_glu) over x[rows, 2 * cols], one element
// of y (or of dy: both halves of dx) a thread.
__global__ static void glu_kernel(float *y, const float *x, size_t cols, size_t n) {
  KDRT_FOR(i, n) {
    const float *a = x + i / cols * 2 * cols + i % cols;
    y[i] = a[0] * KDRT_SIGMOID(a[cols]);
  }
}

__global__ static void glu_grad_kernel(float *dx, const float *dy, const float *x, size_t cols,
                                       size_t n) {
  KDRT_FOR(i, n) {
    size_t at = i / cols * 2 * cols + i % cols;
    float a = x[at], s = KDRT_SIGMOID(x[at + cols]);
    dx[at] = dy[i] * s;
    dx[at + cols] = (dy[i] * a) * (s * (1.0f - s));
  }
}

extern "C" void kdrt_cuda_glu(kdrt_cuda *d, float *y, const float *x, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  size_t n = (size_t)(rows * cols);
  glu_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(y, x, (size_t)cols, n);
  KDRT_LAUNCHED(d, "glu_kernel");
}

extern "C" void kdrt_cuda_glu_grad(kdrt_cuda *d, float *dx, const float *dy, const float *x,
                                   int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  size_t n = (size_t)(rows * cols);
  glu_grad_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(dx, dy, x, (size_t)cols,
                                                                        n);
  KDRT_LAUNCHED(d, "glu_grad_kernel");
}
