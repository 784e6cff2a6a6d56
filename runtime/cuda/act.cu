// act.cu: elementwise ops: activations and their gradients (kdrt_act,
// kdrt_act_grad in ../ops.c, the same expressions), the n-ary add and the
// affine scale. One thread per element; outputs may alias an input of the
// same shape (each element is read before it is written, by one thread).
#include "common.cuh"

#define KD_SQRT1_2 0.70710678118654752f

__device__ static inline float sigmoid_stable(float x) {
  float e = expf(-fabsf(x));
  float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}

__global__ static void act_kernel(int act, float *y, const float *x, size_t n) {
  KDRT_FOR(i, n) {
    float v = x[i], r = v;
    switch (act) {
    case KDRT_ACT_RELU: r = v > 0.0f ? v : 0.0f; break;
    case KDRT_ACT_SIGMOID: r = sigmoid_stable(v); break;
    case KDRT_ACT_TANH: r = tanhf(v); break;
    case KDRT_ACT_GELU: r = 0.5f * v * (1.0f + erff(v * KD_SQRT1_2)); break;
    case KDRT_ACT_SILU: r = v * sigmoid_stable(v); break;
    default: break;
    }
    y[i] = r;
  }
}

__global__ static void act_grad_kernel(int act, float *dx, const float *dy, const float *x,
                                       const float *y, size_t n) {
  const float inv_sqrt_2pi = 0.3989422804014327f;
  KDRT_FOR(i, n) {
    float g = dy[i], r = g;
    switch (act) {
    case KDRT_ACT_RELU: r = g * (y[i] > 0.0f ? 1.0f : 0.0f); break; // as ../ops.c: -0, NaN kept
    case KDRT_ACT_SIGMOID: r = g * y[i] * (1.0f - y[i]); break;
    case KDRT_ACT_TANH: r = g * (1.0f - y[i] * y[i]); break;
    case KDRT_ACT_GELU: {
      float xi = x[i];
      float cdf = 0.5f * (1.0f + erff(xi * KD_SQRT1_2));
      float pdf = inv_sqrt_2pi * expf(-0.5f * xi * xi);
      r = g * (cdf + xi * pdf);
      break;
    }
    case KDRT_ACT_SILU: {
      float s = sigmoid_stable(x[i]);
      r = g * s * (1.0f + x[i] * (1.0f - s));
      break;
    }
    default: break;
    }
    dx[i] = r;
  }
}

extern "C" void kdrt_cuda_act(kdrt_cuda *d, int act, float *y, const float *x, size_t n) {
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

__global__ static void add_kernel(float *out, add_args in, int nin, size_t n) {
  KDRT_FOR(i, n) {
    float s = in.p[0][i];
    for (int k = 1; k < nin; k++) s = s + in.p[k][i];
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
