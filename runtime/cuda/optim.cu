// optim.cu: the optimizer updates of ../ops.c (Keras 3's formulas) on a
// variable's local shard, one thread per element. Adam's step size is
// computed on the host in double exactly as the CPU does.
#include <math.h>

#include "common.cuh"

__global__ static void sgd_kernel(float *w, const float *g, float *m, size_t n, float lr,
                                  float momentum, int nesterov) {
  KDRT_FOR(i, n) {
    if (momentum == 0.0f) {
      w[i] -= lr * g[i];
    } else {
      float mi = m[i] * momentum - g[i] * lr;
      m[i] = mi;
      w[i] += nesterov ? mi * momentum - g[i] * lr : mi;
    }
  }
}

__global__ static void adam_kernel(float *w, const float *g, float *m, float *v, size_t n,
                                   float alpha, float c1, float c2, float eps, float wd, float lr,
                                   int decay) {
  KDRT_FOR(i, n) {
    float wi = w[i];
    if (decay) wi = wi - wi * wd * lr; // AdamW: Keras's order, before the Adam step
    float gi = g[i];
    float mi = m[i] + (gi - m[i]) * c1;
    float vi = v[i] + (gi * gi - v[i]) * c2;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - mi * alpha / (sqrtf(vi) + eps);
  }
}

__global__ static void rmsprop_kernel(float *w, const float *g, float *v, float *m, size_t n,
                                      float lr, float rho, float momentum, float eps) {
  const float c = 1.0f - rho;
  KDRT_FOR(i, n) {
    float gi = g[i];
    float vi = rho * v[i] + c * gi * gi;
    v[i] = vi;
    if (momentum > 0.0f) {
      float mi = momentum * m[i] + lr * gi / sqrtf(vi + eps);
      m[i] = mi;
      w[i] -= mi;
    } else {
      w[i] -= lr * gi / sqrtf(vi + eps);
    }
  }
}

extern "C" void kdrt_cuda_sgd(kdrt_cuda *d, float *w, const float *g, float *m, size_t n,
                              float lr, float momentum, int nesterov) {
  if (!n) return;
  if (momentum != 0.0f && !m)
    kdrt_cuda_fail("kdrt_cuda_sgd", __FILE__, __LINE__, "momentum without a slot");
  sgd_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(w, g, m, n, lr, momentum,
                                                                   nesterov);
  KDRT_LAUNCHED(d, "sgd_kernel");
}

static void adam(kdrt_cuda *d, float *w, const float *g, float *m, float *v, size_t n, float lr,
                 float b1, float b2, float eps, float wd, int decay, int64_t t) {
  if (!n) return;
  const float alpha = (float)(lr * sqrt(1.0 - pow(b2, (double)t)) / (1.0 - pow(b1, (double)t)));
  adam_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(
      w, g, m, v, n, alpha, 1.0f - b1, 1.0f - b2, eps, wd, lr, decay);
  KDRT_LAUNCHED(d, "adam_kernel");
}

extern "C" void kdrt_cuda_adam(kdrt_cuda *d, float *w, const float *g, float *m, float *v,
                               size_t n, float lr, float b1, float b2, float eps, int64_t t) {
  adam(d, w, g, m, v, n, lr, b1, b2, eps, 0.0f, 0, t);
}

extern "C" void kdrt_cuda_adamw(kdrt_cuda *d, float *w, const float *g, float *m, float *v,
                                size_t n, float lr, float b1, float b2, float eps, float wd,
                                int64_t t) {
  adam(d, w, g, m, v, n, lr, b1, b2, eps, wd, 1, t);
}

extern "C" void kdrt_cuda_rmsprop(kdrt_cuda *d, float *w, const float *g, float *v, float *m,
                                  size_t n, float lr, float rho, float momentum, float eps) {
  if (!n) return;
  if (momentum > 0.0f && !m)
    kdrt_cuda_fail("kdrt_cuda_rmsprop", __FILE__, __LINE__, "momentum without a slot");
  rmsprop_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(w, g, v, m, n, lr, rho,
                                                                       momentum, eps);
  KDRT_LAUNCHED(d, "rmsprop_kernel");
}
