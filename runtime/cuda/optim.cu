// optim.cu: the optimizer updates of ../optim.c on a variable's local
// shard, one thread per element, each element's update ../kdrt_optim.h's. Step-dependent scalars
// (Adam's step size, the bias corrections, Nadam's momentum schedule) are
// computed on the host exactly as the CPU does; in a step captured as a
// CUDA graph (sc, kdrt_step_scalars) the learning rate and the step are
// read on the device when it runs, and the step size formed there by the
// same formula, by a block's first thread.
#include <math.h>

#include "common.cuh"
#include "kdrt_optim.h"

#define LAUNCH(d, kernel, n, ...)                                                              \
  do {                                                                                         \
    if (!(n)) return;                                                                          \
    kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, (d)->impl->stream>>>(__VA_ARGS__);               \
    KDRT_LAUNCHED(d, #kernel);                                                                 \
  } while (0)

// The learning rate: the argument, or the device's in a graph.
__device__ static inline float step_lr(const kdrt_step_scalars *sc, float lr) {
  return sc ? sc->lr : lr;
}

__global__ static void sgd_kernel(float *w, const float *g, float *m, size_t n, float lr,
                                  float momentum, int nesterov, const kdrt_step_scalars *sc) {
  lr = step_lr(sc, lr);
  KDRT_FOR(i, n) w[i] = kdrt_sgd_at(w[i], g, m, i, lr, momentum, nesterov);
}

__global__ static void adam_kernel(float *w, const float *g, float *m, float *v, float *vhat,
                                   size_t n, float alpha, float c1, float c2, float eps, float wd,
                                   float lr, int decay, const kdrt_step_scalars *sc, int64_t dt,
                                   float b1, float b2) {
  if (sc) { // alpha for step sc->step + dt
    __shared__ float a;
    if (threadIdx.x == 0) a = kdrt_adam_alpha(sc->lr, b1, b2, (double)(sc->step + dt));
    __syncthreads();
    alpha = a, lr = sc->lr;
  }
  KDRT_FOR(i, n) {
    float wi = w[i];
    if (decay) wi = kdrt_decay(wi, wd, lr); // AdamW: before the Adam step
    w[i] = kdrt_adam_at(wi, g, m, v, vhat, i, alpha, c1, c2, eps);
  }
}

__global__ static void rmsprop_kernel(float *w, const float *g, float *v, float *m, float *a,
                                      size_t n, float lr, float rho, float momentum, float eps,
                                      const kdrt_step_scalars *sc) {
  const float c = 1.0f - rho;
  lr = step_lr(sc, lr);
  KDRT_FOR(i, n) w[i] = kdrt_rmsprop_at(w[i], g, v, m, a, i, lr, rho, c, momentum, eps);
}

__global__ static void adagrad_kernel(float *w, const float *g, float *acc, size_t n, float lr,
                                      float eps, const kdrt_step_scalars *sc) {
  lr = step_lr(sc, lr);
  KDRT_FOR(i, n) w[i] = kdrt_adagrad_at(w[i], g, acc, i, lr, eps);
}

__global__ static void adamax_kernel(float *w, const float *g, float *m, float *u, size_t n,
                                     float lr, float c1, float b2, float eps, float bias,
                                     const kdrt_step_scalars *sc, int64_t dt, float b1) {
  if (sc) lr = sc->lr, bias = kdrt_adamax_bias(b1, sc->step + dt);
  KDRT_FOR(i, n) w[i] = kdrt_adamax_at(w[i], g, m, u, i, lr, c1, b2, eps, bias);
}

__global__ static void nadam_kernel(float *w, const float *g, float *m, float *v, size_t n,
                                    float lr, float c1, float c2, float eps, kdrt_nadam_k k) {
  KDRT_FOR(i, n) w[i] = kdrt_nadam_at(w[i], g, m, v, i, lr, c1, c2, eps, k);
}

__global__ static void lion_kernel(float *w, const float *g, float *m, size_t n, float lr,
                                   float b1, float b2, const kdrt_step_scalars *sc) {
  const float c1 = 1.0f - b1, c2 = 1.0f - b2;
  lr = step_lr(sc, lr);
  KDRT_FOR(i, n) w[i] = kdrt_lion_at(w[i], g, m, i, lr, b1, c1, b2, c2);
}

__global__ static void weight_decay_kernel(float *w, size_t n, float lr, float wd,
                                           const kdrt_step_scalars *sc) {
  lr = step_lr(sc, lr);
  KDRT_FOR(i, n) w[i] = kdrt_decay(w[i], wd, lr);
}

__global__ static void clip_grad_kernel(float *g, size_t n, const float *f, float clipvalue) {
  KDRT_FOR(i, n) {
    float gi = g[i];
    if (f) gi *= f[0];
    if (clipvalue > 0.0f) gi = kdrt_clip(gi, clipvalue);
    g[i] = gi;
  }
}

__global__ static void grad_clip_factor_kernel(float *f, const float *s, float c, int global) {
  f[0] = kdrt_clip_factor(s[0], c, global);
}

extern "C" void kdrt_cuda_sgd(kdrt_cuda *d, float *w, const float *g, float *m, size_t n,
                              float lr, float momentum, int nesterov) {
  if (momentum != 0.0f && !m)
    kdrt_cuda_fail("kdrt_cuda_sgd", __FILE__, __LINE__, "momentum without a slot");
  LAUNCH(d, sgd_kernel, n, w, g, m, n, lr, momentum, nesterov, kdrt_step_sc(d));
}

static void adam(kdrt_cuda *d, float *w, const float *g, float *m, float *v, float *vhat,
                 size_t n, float lr, float b1, float b2, float eps, float wd, int decay,
                 int64_t t) {
  const float alpha = kdrt_adam_alpha(lr, b1, b2, (double)t);
  LAUNCH(d, adam_kernel, n, w, g, m, v, vhat, n, alpha, 1.0f - b1, 1.0f - b2, eps, wd, lr, decay,
         kdrt_step_sc(d), t - (d->c ? d->c->step : 0), b1, b2);
}

extern "C" void kdrt_cuda_adam(kdrt_cuda *d, float *w, const float *g, float *m, float *v,
                               float *vhat, size_t n, float lr, float b1, float b2, float eps,
                               int64_t t) {
  adam(d, w, g, m, v, vhat, n, lr, b1, b2, eps, 0.0f, 0, t);
}

extern "C" void kdrt_cuda_adamw(kdrt_cuda *d, float *w, const float *g, float *m, float *v,
                                float *vhat, size_t n, float lr, float b1, float b2, float eps,
                                float wd, int64_t t) {
  adam(d, w, g, m, v, vhat, n, lr, b1, b2, eps, wd, 1, t);
}

extern "C" void kdrt_cuda_rmsprop(kdrt_cuda *d, float *w, const float *g, float *v, float *m,
                                  float *a, size_t n, float lr, float rho, float momentum,
                                  float eps) {
  LAUNCH(d, rmsprop_kernel, n, w, g, v, m, a, n, lr, rho, momentum, eps, kdrt_step_sc(d));
}

extern "C" void kdrt_cuda_adagrad(kdrt_cuda *d, float *w, const float *g, float *acc, size_t n,
                                  float lr, float eps) {
  LAUNCH(d, adagrad_kernel, n, w, g, acc, n, lr, eps, kdrt_step_sc(d));
}

extern "C" void kdrt_cuda_adamax(kdrt_cuda *d, float *w, const float *g, float *m, float *u,
                                 size_t n, float lr, float b1, float b2, float eps, int64_t t) {
  LAUNCH(d, adamax_kernel, n, w, g, m, u, n, lr, 1.0f - b1, b2, eps, kdrt_adamax_bias(b1, t),
         kdrt_step_sc(d), t - (d->c ? d->c->step : 0), b1);
}

extern "C" void kdrt_cuda_nadam(kdrt_cuda *d, float *w, const float *g, float *m, float *v,
                                size_t n, float lr, float b1, float b2, float eps, int64_t t,
                                float u_prod) {
  kdrt_cuda_graph_unsafe(d); // u_prod: the host's running product
  LAUNCH(d, nadam_kernel, n, w, g, m, v, n, lr, 1.0f - b1, 1.0f - b2, eps,
         kdrt_nadam_coef(b1, b2, t, u_prod));
}

extern "C" void kdrt_cuda_lion(kdrt_cuda *d, float *w, const float *g, float *m, size_t n,
                               float lr, float b1, float b2) {
  LAUNCH(d, lion_kernel, n, w, g, m, n, lr, b1, b2, kdrt_step_sc(d));
}

// issue 23: a 16-bit variable's update, ../optim.c's kdrt_sgd16 ..
// kdrt_lion16 (the variable and its slots float32 buffers of 16-bit values,
// or kind | KDRT_STORE16 their 16 bits: kdrt_optim.h's kdrt_ld16 ..
// kdrt_put16; st: kind with that flag, kind without); in a graph the
// learning rate (and Adam's, Adamax's scalars for step sc->step + dt) are
// the device's; Nadam's u_prod is the host's, as float32 Nadam's.
__device__ static inline float decayed16(const void *w, size_t i, float wd16, float lr16, int st) {
  float wi = kdrt_ld16(w, i, st);
  return wd16 != 0.0f ? kdrt_decay16(wi, wd16, lr16, st & ~KDRT_STORE16) : wi;
}

__global__ static void sgd16_kernel(void *w, const float *g, void *m, size_t n, float lr,
                                    float momentum, int nesterov, float wd, int st,
                                    const kdrt_step_scalars *sc) {
  const int kind = st & ~KDRT_STORE16;
  lr = kdrt_round_to(kind, step_lr(sc, lr));
  const float wd16 = kdrt_round_to(kind, wd), mom16 = kdrt_round_to(kind, momentum);
  if (momentum == 0.0f) m = NULL;
  KDRT_FOR(i, n) {
    float mi = 0.0f, *pm = kdrt_slot16(m, i, &mi, st);
    kdrt_st16(w, i, kdrt_sgd16_at(decayed16(w, i, wd16, lr, st), g + i, pm, 0, lr, mom16,
                                  nesterov, kind), st);
    kdrt_put16(m, i, pm, st);
  }
}

__global__ static void adam16_kernel(void *w, const float *g, void *m, void *v, void *vhat,
                                     size_t n, float lr, float b1, float b2, float eps, float wd,
                                     int64_t t, int st, const kdrt_step_scalars *sc,
                                     int64_t dt) {
  const int kind = st & ~KDRT_STORE16;
  __shared__ kdrt_adam16_k k;
  if (sc) lr = sc->lr, t = sc->step + dt;
  if (threadIdx.x == 0) k = kdrt_adam16_coef(lr, b1, b2, eps, t, kind);
  __syncthreads();
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  KDRT_FOR(i, n) {
    float s[3] = {0}, *p0 = kdrt_slot16(m, i, s, st), *p1 = kdrt_slot16(v, i, s + 1, st);
    float *p2 = kdrt_slot16(vhat, i, s + 2, st);
    kdrt_st16(w, i, kdrt_adam16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, p1, p2, 0, k,
                                   kind), st);
    kdrt_put16(m, i, p0, st), kdrt_put16(v, i, p1, st), kdrt_put16(vhat, i, p2, st);
  }
}

extern "C" void kdrt_cuda_sgd16(kdrt_cuda *d, void *w, const float *g, void *m, size_t n,
                                float lr, float momentum, int nesterov, float wd, int kind) {
  LAUNCH(d, sgd16_kernel, n, w, g, m, n, lr, momentum, nesterov, wd, kind, kdrt_step_sc(d));
}

extern "C" void kdrt_cuda_adam16(kdrt_cuda *d, void *w, const float *g, void *m, void *v,
                                 void *vhat, size_t n, float lr, float b1, float b2, float eps,
                                 float wd, int64_t t, int kind) {
  LAUNCH(d, adam16_kernel, n, w, g, m, v, vhat, n, lr, b1, b2, eps, wd, t, kind,
         kdrt_step_sc(d), t - (d->c ? d->c->step : 0));
}

__global__ static void rmsprop16_kernel(void *w, const float *g, void *v, void *m, void *a,
                                        size_t n, float lr, float rho, float momentum, float eps,
                                        float wd, int st, const kdrt_step_scalars *sc) {
  const int kind = st & ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, step_lr(sc, lr)), wd16 = kdrt_round_to(kind, wd);
  const float rho16 = kdrt_round_to(kind, rho), mom16 = kdrt_round_to(kind, momentum);
  const float c = kdrt_round_to(kind, (float)(1.0 - (double)rho));
  const float eps16 = kdrt_round_to(kind, eps);
  KDRT_FOR(i, n) {
    float s[3] = {0}, *p0 = kdrt_slot16(v, i, s, st), *p1 = kdrt_slot16(m, i, s + 1, st);
    float *p2 = kdrt_slot16(a, i, s + 2, st);
    kdrt_st16(w, i, kdrt_rmsprop16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, p1, p2, 0,
                                      lr16, rho16, c, mom16, eps16, kind), st);
    kdrt_put16(v, i, p0, st), kdrt_put16(m, i, p1, st), kdrt_put16(a, i, p2, st);
  }
}

__global__ static void adagrad16_kernel(void *w, const float *g, void *acc, size_t n, float lr,
                                        float eps, float wd, int st,
                                        const kdrt_step_scalars *sc) {
  const int kind = st & ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, step_lr(sc, lr)), wd16 = kdrt_round_to(kind, wd);
  const float eps16 = kdrt_round_to(kind, eps);
  KDRT_FOR(i, n) {
    float s = 0.0f, *p0 = kdrt_slot16(acc, i, &s, st);
    kdrt_st16(w, i, kdrt_adagrad16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, 0, lr16,
                                      eps16, kind), st);
    kdrt_put16(acc, i, p0, st);
  }
}

__global__ static void adamax16_kernel(void *w, const float *g, void *m, void *u, size_t n,
                                       float lr, float b1, float b2, float eps, float wd,
                                       int64_t t, int st, const kdrt_step_scalars *sc,
                                       int64_t dt) {
  const int kind = st & ~KDRT_STORE16;
  __shared__ kdrt_adamax16_k k;
  if (sc) lr = sc->lr, t = sc->step + dt;
  if (threadIdx.x == 0) k = kdrt_adamax16_coef(b1, b2, eps, t, kind);
  __syncthreads();
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  KDRT_FOR(i, n) {
    float s[2] = {0}, *p0 = kdrt_slot16(m, i, s, st), *p1 = kdrt_slot16(u, i, s + 1, st);
    kdrt_st16(w, i, kdrt_adamax16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, p1, 0, lr16, k,
                                     kind), st);
    kdrt_put16(m, i, p0, st), kdrt_put16(u, i, p1, st);
  }
}

__global__ static void nadam16_kernel(void *w, const float *g, void *m, void *v, size_t n,
                                      float lr, float wd, kdrt_nadam16_k k, int st) {
  const int kind = st & ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  KDRT_FOR(i, n) {
    float s[2] = {0}, *p0 = kdrt_slot16(m, i, s, st), *p1 = kdrt_slot16(v, i, s + 1, st);
    kdrt_st16(w, i, kdrt_nadam16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, p1, 0, lr16, k,
                                    kind), st);
    kdrt_put16(m, i, p0, st), kdrt_put16(v, i, p1, st);
  }
}

__global__ static void lion16_kernel(void *w, const float *g, void *m, size_t n, float lr,
                                     float b1, float b2, float wd, int st,
                                     const kdrt_step_scalars *sc) {
  const int kind = st & ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, step_lr(sc, lr)), wd16 = kdrt_round_to(kind, wd);
  const float b116 = kdrt_round_to(kind, b1), b216 = kdrt_round_to(kind, b2);
  const float c1 = kdrt_round_to(kind, 1.0f - b116), c2 = kdrt_round_to(kind, 1.0f - b216);
  KDRT_FOR(i, n) {
    float s = 0.0f, *p0 = kdrt_slot16(m, i, &s, st);
    kdrt_st16(w, i, kdrt_lion16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, 0, lr16, b116, c1,
                                   b216, c2, kind), st);
    kdrt_put16(m, i, p0, st);
  }
}

__global__ static void clip_grad16_kernel(float *g, size_t n, const float *f, float clipnorm,
                                          int kind) {
  const float k = f[0], c16 = kdrt_round_to(kind, clipnorm);
  KDRT_FOR(i, n) g[i] = kdrt_clip16(g[i], k, c16, kind);
}

__global__ static void grad_clip_factor16_kernel(float *f, const float *s, float c, int global,
                                                 int kind) {
  f[0] = kdrt_clip_factor16(s[0], c, global, kind);
}

__global__ static void clip_norm16_kernel(float *f, const float *s, size_t n, float lo, float hi,
                                         float rate, float rest, int kind) {
  KDRT_FOR(i, n) f[i] = kdrt_clip_norm16_1(s[i], lo, hi, rate, rest, kind);
}

extern "C" void kdrt_cuda_clip_norm16(kdrt_cuda *d, float *f, const float *s, size_t n, float lo,
                                      float hi, float rate, float rest, int kind) {
  LAUNCH(d, clip_norm16_kernel, n, f, s, n, lo, hi, rate, rest, kind);
}

extern "C" void kdrt_cuda_rmsprop16(kdrt_cuda *d, void *w, const float *g, void *v, void *m,
                                    void *a, size_t n, float lr, float rho, float momentum,
                                    float eps, float wd, int kind) {
  LAUNCH(d, rmsprop16_kernel, n, w, g, v, m, a, n, lr, rho, momentum, eps, wd, kind,
         kdrt_step_sc(d));
}

extern "C" void kdrt_cuda_adagrad16(kdrt_cuda *d, void *w, const float *g, void *acc, size_t n,
                                    float lr, float eps, float wd, int kind) {
  LAUNCH(d, adagrad16_kernel, n, w, g, acc, n, lr, eps, wd, kind, kdrt_step_sc(d));
}

extern "C" void kdrt_cuda_adamax16(kdrt_cuda *d, void *w, const float *g, void *m, void *u,
                                   size_t n, float lr, float b1, float b2, float eps, float wd,
                                   int64_t t, int kind) {
  LAUNCH(d, adamax16_kernel, n, w, g, m, u, n, lr, b1, b2, eps, wd, t, kind, kdrt_step_sc(d),
         t - (d->c ? d->c->step : 0));
}

extern "C" void kdrt_cuda_nadam16(kdrt_cuda *d, void *w, const float *g, void *m, void *v,
                                  size_t n, float lr, float b1, float b2, float eps, float wd,
                                  int64_t t, float u_prod, int kind) {
  kdrt_cuda_graph_unsafe(d); // u_prod: the host's running product
  LAUNCH(d, nadam16_kernel, n, w, g, m, v, n, lr, wd,
         kdrt_nadam16_coef(b1, b2, eps, t, u_prod, kind & ~KDRT_STORE16), kind);
}

extern "C" void kdrt_cuda_lion16(kdrt_cuda *d, void *w, const float *g, void *m, size_t n,
                                 float lr, float b1, float b2, float wd, int kind) {
  LAUNCH(d, lion16_kernel, n, w, g, m, n, lr, b1, b2, wd, kind, kdrt_step_sc(d));
}

extern "C" void kdrt_cuda_clip_grad16(kdrt_cuda *d, float *g, size_t n, const float *f,
                                      float clipnorm, int kind) {
  LAUNCH(d, clip_grad16_kernel, n, g, n, f, clipnorm, kind);
}

extern "C" void kdrt_cuda_grad_clip_factor16(kdrt_cuda *d, float *f, const float *s, float c,
                                             int global, int kind) {
  grad_clip_factor16_kernel<<<1, 1, 0, d->impl->stream>>>(f, s, c, global, kind);
  KDRT_LAUNCHED(d, "grad_clip_factor16_kernel");
}

extern "C" void kdrt_cuda_weight_decay(kdrt_cuda *d, float *w, size_t n, float lr, float wd) {
  LAUNCH(d, weight_decay_kernel, n, w, n, lr, wd, kdrt_step_sc(d));
}

extern "C" void kdrt_cuda_clip_grad(kdrt_cuda *d, float *g, size_t n, const float *f,
                                    float clipvalue) {
  LAUNCH(d, clip_grad_kernel, n, g, n, f, clipvalue);
}

extern "C" void kdrt_cuda_grad_clip_factor(kdrt_cuda *d, float *f, const float *s, float c,
                                           int global) {
  grad_clip_factor_kernel<<<1, 1, 0, d->impl->stream>>>(f, s, c, global);
  KDRT_LAUNCHED(d, "grad_clip_factor_kernel");
}

// ---------------------------------------------------------------- issue 23: loss scaling
// Keras's LossScaleOptimizer's step, as ../optim.c's kdrt_loss_scale_step:
// the gradients' non-finite values counted on the device, the decision on
// the host (kdrt_loss_scale_decide: every rank agrees, through MPI), then
// each gradient divided by the scale there. The host waits for the count,
// so a loss-scaled program's training steps run without CUDA graphs
// (device.cu's kdrt_cuda_replay). Compiled and linked here; not yet run on
// a GPU.

__global__ static void count_nonfinite_kernel(const float *g, size_t n, unsigned long long *bad) {
  unsigned long long mine = 0;
  KDRT_FOR(i, n) mine += !isfinite(g[i]);
  if (mine) atomicAdd(bad, mine);
}

__global__ static void unscale_kernel(float *g, size_t n, float s) {
  KDRT_FOR(i, n) g[i] = kdrt_unscale(g[i], s);
}

extern "C" void kdrt_cuda_loss_scale_step(kdrt_cuda *d, float *g) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_loss_scale_step");
  kdrt_ctx *c = d->c;
  const kdrt_program *p = c->prog;
  cudaStream_t st = d->impl->stream;
  const float s = c->loss_scale; // the one the loss was multiplied by
  unsigned long long *bad = (unsigned long long *)kdrt_cuda_dscratch(d, 2, sizeof *bad), nbad = 0;
  CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof *bad, st));
  for (int v = 0; v < p->nvars; v++) {
    const kdrt_var *var = &p->vars[v];
    if (var->goffset == SIZE_MAX || !var->n) continue;
    count_nonfinite_kernel<<<kdrt_blocks(var->n), KDRT_THREADS, 0, st>>>(g + var->goffset,
                                                                          var->n, bad);
    KDRT_LAUNCHED(d, "count_nonfinite_kernel");
  }
  CUDA_CHECK(cudaMemcpyAsync(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost, st));
  kdrt_cuda_wait(d, st, "the loss scale's check of the gradients");
  if (!kdrt_loss_scale_decide(c, (int64_t)nbad)) return;
  for (int v = 0; v < p->nvars; v++) {
    const kdrt_var *var = &p->vars[v];
    if (var->goffset == SIZE_MAX || !var->n) continue;
    unscale_kernel<<<kdrt_blocks(var->n), KDRT_THREADS, 0, st>>>(g + var->goffset, var->n, s);
    KDRT_LAUNCHED(d, "unscale_kernel");
  }
}

// issue 23: a 16-bit UnitNorm's factors, a 16-bit activity penalty's batch
// mean (kdrt_optim.h).
__global__ static void unit_norm16_kernel(float *f, const float *s, size_t n, int kind) {
  KDRT_FOR(i, n) f[i] = kdrt_unit_norm16_1(s[i], kind);
}

extern "C" void kdrt_cuda_unit_norm16(kdrt_cuda *d, float *f, const float *s, size_t n,
                                      int kind) {
  LAUNCH(d, unit_norm16_kernel, n, f, s, n, kind);
}

__global__ static void batch_mean16_kernel(float *out, const float *in, size_t n, double rows,
                                           int kind) {
  KDRT_FOR(i, n) out[i] = kdrt_batch_mean16_1(in[i], rows, kind);
}

extern "C" void kdrt_cuda_batch_mean16(kdrt_cuda *d, float *out, const float *in, size_t n,
                                       double rows, int kind) {
  LAUNCH(d, batch_mean16_kernel, n, out, in, n, rows, kind);
}
