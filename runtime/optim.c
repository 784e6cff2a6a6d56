// optim.c: the update phase of a step on one rank's local parameters:
// every optimizer's update, weight decay, gradient clipping, the loss
// scaling of mixed precision (issue 23) and the learning-rate schedules.
// Apart from ops.c's kernels because it is what the fit loop runs after
// the backward pass, and kdrt.c calls kdrt_schedule_lr itself; the CUDA
// runtime's counterpart is cuda/optim.cu. Threads: ops.c's header comment.
//
// - Optimizers follow keras/src/optimizers/{sgd,adam,adamw,rmsprop,adagrad,
//   adamax,nadam,lion}.py; each one's update of an element is written once
//   for both runtimes, in kdrt_optim.h, and here is the loop over a
//   variable. Learning-rate schedules follow optimizers/schedules/
//   learning_rate_schedule.py.
#include <math.h>
#include <stdint.h>

#include "kdrt.h"
#include "kdrt_optim.h"
#include "ops_impl.h"

// ---------------------------------------------------------------- optimizers

void kdrt_sgd(float *w, const float *g, float *m, size_t n, float lr, float momentum,
              int nesterov) {
  // three loops, so that each has its form fixed when it is vectorised
  if (momentum == 0.0f) {
    KD_PAR_FOR(n)
    for (size_t i = 0; i < n; i++)
      w[i] = kdrt_sgd_at(w[i], g, NULL, i, lr, 0.0f, 0);
  } else if (nesterov) {
    KD_PAR_FOR(n)
    for (size_t i = 0; i < n; i++)
      w[i] = kdrt_sgd_at(w[i], g, m, i, lr, momentum, 1);
  } else {
    KD_PAR_FOR(n)
    for (size_t i = 0; i < n; i++)
      w[i] = kdrt_sgd_at(w[i], g, m, i, lr, momentum, 0);
  }
}

// The Adam step shared by kdrt_adam and kdrt_adamw.
static void adam_step(float *restrict w, const float *restrict g, float *restrict m,
                      float *restrict v, float *restrict vhat, size_t n, float lr, float b1,
                      float b2, float eps, int64_t t) {
  const float alpha = kdrt_adam_alpha(lr, b1, b2, (double)t);
  const float c1 = 1.0f - b1, c2 = 1.0f - b2;
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    w[i] = kdrt_adam_at(w[i], g, m, v, vhat, i, alpha, c1, c2, eps);
}

void kdrt_adam(float *w, const float *g, float *m, float *v, float *vhat, size_t n, float lr,
               float b1, float b2, float eps, int64_t t) {
  adam_step(w, g, m, v, vhat, n, lr, b1, b2, eps, t);
}

void kdrt_adamw(float *w, const float *g, float *m, float *v, float *vhat, size_t n, float lr,
                float b1, float b2, float eps, float wd, int64_t t) {
  kdrt_weight_decay(w, n, lr, wd);
  adam_step(w, g, m, v, vhat, n, lr, b1, b2, eps, t);
}

void kdrt_rmsprop(float *w, const float *g, float *v, float *m, float *a, size_t n, float lr,
                  float rho, float momentum, float eps) {
  const float c = 1.0f - rho;
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    w[i] = kdrt_rmsprop_at(w[i], g, v, m, a, i, lr, rho, c, momentum, eps);
}

void kdrt_adagrad(float *w, const float *g, float *acc, size_t n, float lr, float eps) {
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    w[i] = kdrt_adagrad_at(w[i], g, acc, i, lr, eps);
}

void kdrt_adamax(float *w, const float *g, float *m, float *u, size_t n, float lr, float b1,
                 float b2, float eps, int64_t t) {
  const float c1 = 1.0f - b1, bias = kdrt_adamax_bias(b1, t);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    w[i] = kdrt_adamax_at(w[i], g, m, u, i, lr, c1, b2, eps, bias);
}

// Keras's running product of Nadam's momentum schedule (kdrt_nadam_u), a
// float32 variable multiplied once a step (by b1, then by the rest: not
// by kdrt_nadam_u's product).
float kdrt_nadam_product(kdrt_ctx *c, float b1, int64_t t) {
  if (c->nadam_step > t || c->nadam_step == 0) c->nadam_step = 0, c->nadam_u = 1.0f;
  while (c->nadam_step < t) {
    c->nadam_step++;
    c->nadam_u = c->nadam_u * b1 * (1.0f - 0.5f * powf(0.96f, (float)c->nadam_step));
  }
  return c->nadam_u;
}

void kdrt_nadam(float *w, const float *g, float *m, float *v, size_t n, float lr, float b1,
                float b2, float eps, int64_t t, float u_prod) {
  const kdrt_nadam_k k = kdrt_nadam_coef(b1, b2, t, u_prod);
  const float c1 = 1.0f - b1, c2 = 1.0f - b2;
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    w[i] = kdrt_nadam_at(w[i], g, m, v, i, lr, c1, c2, eps, k);
}

// issue 23: Keras's LossScaleOptimizer (keras/src/optimizers/
// loss_scale_optimizer.py, stateless_apply): a step is finite when every
// gradient is; then the gradients are divided by the scale the loss was
// multiplied by, the inner optimizer updates (its iterations counted by
// the fit loop from c->apply_update), and step_counter moves on: at
// dynamic_growth_steps - 1 the scale doubles and it restarts. A step that
// is not finite updates nothing, halves the scale and restarts the count.
// The scale is a float32 variable in Keras; its products are exact.
int kdrt_loss_scale_decide(kdrt_ctx *c, int64_t bad) {
  const kdrt_program *p = c->prog;
  float mine = bad ? 1.0f : 0.0f, any = mine;
  kdrt_allreduce_max(c, (1u << p->mesh_ndim) - 1, &mine, &any, 1); // one decision on every rank
  c->apply_update = any == 0.0f;
  if (!c->apply_update) {
    c->loss_scale_count = 0;
    c->loss_scale *= 0.5f;
  } else if (c->loss_scale_count == p->loss_scale_growth_steps - 1) {
    c->loss_scale_count = 0;
    c->loss_scale *= 2.0f;
  } else {
    c->loss_scale_count++;
  }
  return c->apply_update;
}

void kdrt_loss_scale_step(kdrt_ctx *c, float *g) {
  const kdrt_program *p = c->prog;
  const float s = c->loss_scale; // the one the loss was multiplied by
  int64_t bad = 0;
  for (int v = 0; v < p->nvars; v++) {
    const kdrt_var *var = &p->vars[v];
    if (var->goffset == SIZE_MAX) continue;
    const float *gv = g + var->goffset;
    for (size_t i = 0; i < var->n; i++) bad += !isfinite(gv[i]);
  }
  if (!kdrt_loss_scale_decide(c, bad)) return;
  for (int v = 0; v < p->nvars; v++) {
    const kdrt_var *var = &p->vars[v];
    if (var->goffset == SIZE_MAX) continue;
    float *gv = g + var->goffset;
    KD_PAR_FOR(var->n)
    for (size_t i = 0; i < var->n; i++) gv[i] = kdrt_unscale(gv[i], s);
  }
}

void kdrt_lion(float *w, const float *g, float *m, size_t n, float lr, float b1, float b2) {
  const float c1 = 1.0f - b1, c2 = 1.0f - b2;
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    w[i] = kdrt_lion_at(w[i], g, m, i, lr, b1, c1, b2, c2);
}

// issue 23: a 16-bit variable's update (kdrt_optim.h); wd != 0: the
// weight decay first, in 16 bits too. The variable and its slots are
// float32 buffers of 16-bit values, or (kind | KDRT_STORE16) their 16 bits:
// each element read (kdrt_ld16, kdrt_slot16), updated at index 0, stored
// (kdrt_st16, kdrt_put16); st: kind with that flag, kind without.

// The 16-bit weight decay of element i, or w[i] (wd 0: Keras's None).
static inline float decayed16(const void *w, size_t i, float wd16, float lr16, int st) {
  float wi = kdrt_ld16(w, i, st);
  return wd16 != 0.0f ? kdrt_decay16(wi, wd16, lr16, st & ~KDRT_STORE16) : wi;
}

void kdrt_sgd16(void *w, const float *g, void *m, size_t n, float lr, float momentum,
                int nesterov, float wd, int kind) {
  const int st = kind;
  kind &= ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  const float mom16 = kdrt_round_to(kind, momentum);
  if (momentum == 0.0f) m = NULL; // Keras's SGD has no slot then
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float mi = 0.0f, *pm = kdrt_slot16(m, i, &mi, st);
    kdrt_st16(w, i, kdrt_sgd16_at(decayed16(w, i, wd16, lr16, st), g + i, pm, 0, lr16, mom16,
                                  nesterov, kind), st);
    kdrt_put16(m, i, pm, st);
  }
}

void kdrt_adam16(void *w, const float *g, void *m, void *v, void *vhat, size_t n, float lr,
                 float b1, float b2, float eps, float wd, int64_t t, int kind) {
  const int st = kind;
  kind &= ~KDRT_STORE16;
  const kdrt_adam16_k k = kdrt_adam16_coef(lr, b1, b2, eps, t, kind);
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float s[3] = {0}, *p0 = kdrt_slot16(m, i, s, st), *p1 = kdrt_slot16(v, i, s + 1, st);
    float *p2 = kdrt_slot16(vhat, i, s + 2, st);
    kdrt_st16(w, i, kdrt_adam16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, p1, p2, 0, k,
                                   kind), st);
    kdrt_put16(m, i, p0, st), kdrt_put16(v, i, p1, st), kdrt_put16(vhat, i, p2, st);
  }
}

void kdrt_rmsprop16(void *w, const float *g, void *v, void *m, void *a, size_t n, float lr,
                    float rho, float momentum, float eps, float wd, int kind) {
  const int st = kind;
  kind &= ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  const float rho16 = kdrt_round_to(kind, rho), mom16 = kdrt_round_to(kind, momentum);
  const float c = kdrt_round_to(kind, (float)(1.0 - (double)rho));
  const float eps16 = kdrt_round_to(kind, eps);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float s[3] = {0}, *p0 = kdrt_slot16(v, i, s, st), *p1 = kdrt_slot16(m, i, s + 1, st);
    float *p2 = kdrt_slot16(a, i, s + 2, st);
    kdrt_st16(w, i, kdrt_rmsprop16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, p1, p2, 0,
                                      lr16, rho16, c, mom16, eps16, kind), st);
    kdrt_put16(v, i, p0, st), kdrt_put16(m, i, p1, st), kdrt_put16(a, i, p2, st);
  }
}

void kdrt_adagrad16(void *w, const float *g, void *acc, size_t n, float lr, float eps, float wd,
                    int kind) {
  const int st = kind;
  kind &= ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  const float eps16 = kdrt_round_to(kind, eps);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float s = 0.0f, *p0 = kdrt_slot16(acc, i, &s, st);
    kdrt_st16(w, i, kdrt_adagrad16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, 0, lr16,
                                      eps16, kind), st);
    kdrt_put16(acc, i, p0, st);
  }
}

void kdrt_adamax16(void *w, const float *g, void *m, void *u, size_t n, float lr, float b1,
                   float b2, float eps, float wd, int64_t t, int kind) {
  const int st = kind;
  kind &= ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  const kdrt_adamax16_k k = kdrt_adamax16_coef(b1, b2, eps, t, kind);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float s[2] = {0}, *p0 = kdrt_slot16(m, i, s, st), *p1 = kdrt_slot16(u, i, s + 1, st);
    kdrt_st16(w, i, kdrt_adamax16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, p1, 0, lr16, k,
                                     kind), st);
    kdrt_put16(m, i, p0, st), kdrt_put16(u, i, p1, st);
  }
}

// Nadam's running product in 16 bits (kdrt_nadam16_next), kept where the
// float32 one is: a program has one of the two.
float kdrt_nadam_product16(kdrt_ctx *c, float b1, int64_t t, int kind) {
  if (c->nadam_step > t || c->nadam_step == 0) c->nadam_step = 0, c->nadam_u = 1.0f;
  while (c->nadam_step < t) {
    c->nadam_step++;
    c->nadam_u = kdrt_nadam16_next(c->nadam_u, b1, c->nadam_step, kind);
  }
  return c->nadam_u;
}

void kdrt_nadam16(void *w, const float *g, void *m, void *v, size_t n, float lr, float b1,
                  float b2, float eps, float wd, int64_t t, float u_prod, int kind) {
  const int st = kind;
  kind &= ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  const kdrt_nadam16_k k = kdrt_nadam16_coef(b1, b2, eps, t, u_prod, kind);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float s[2] = {0}, *p0 = kdrt_slot16(m, i, s, st), *p1 = kdrt_slot16(v, i, s + 1, st);
    kdrt_st16(w, i, kdrt_nadam16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, p1, 0, lr16, k,
                                    kind), st);
    kdrt_put16(m, i, p0, st), kdrt_put16(v, i, p1, st);
  }
}

void kdrt_lion16(void *w, const float *g, void *m, size_t n, float lr, float b1, float b2,
                 float wd, int kind) {
  const int st = kind;
  kind &= ~KDRT_STORE16;
  const float lr16 = kdrt_round_to(kind, lr), wd16 = kdrt_round_to(kind, wd);
  const float b116 = kdrt_round_to(kind, b1), b216 = kdrt_round_to(kind, b2);
  const float c1 = kdrt_round_to(kind, 1.0f - b116), c2 = kdrt_round_to(kind, 1.0f - b216);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float s = 0.0f, *p0 = kdrt_slot16(m, i, &s, st);
    kdrt_st16(w, i, kdrt_lion16_at(decayed16(w, i, wd16, lr16, st), g + i, p0, 0, lr16, b116, c1,
                                   b216, c2, kind), st);
    kdrt_put16(m, i, p0, st);
  }
}

void kdrt_clip_grad16(float *g, size_t n, const float *f, float clipnorm, int kind) {
  const float k = f[0], c16 = kdrt_round_to(kind, clipnorm);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    g[i] = kdrt_clip16(g[i], k, c16, kind);
}

void kdrt_clip_norm16(float *f, const float *s, size_t n, float lo, float hi, float rate,
                      float rest, int kind) {
  for (size_t i = 0; i < n; i++) f[i] = kdrt_clip_norm16_1(s[i], lo, hi, rate, rest, kind);
}

void kdrt_grad_clip_factor16(float *f, const float *s, float c, int global, int kind) {
  f[0] = kdrt_clip_factor16(s[0], c, global, kind);
}

void kdrt_weight_decay(float *w, size_t n, float lr, float wd) {
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    w[i] = kdrt_decay(w[i], wd, lr);
}

void kdrt_clip_grad(float *g, size_t n, const float *f, float clipvalue) {
  const float k = f ? f[0] : 1.0f;
  if (f) {
    KD_PAR_FOR(n)
    for (size_t i = 0; i < n; i++)
      g[i] *= k;
  }
  if (clipvalue > 0.0f) {
    KD_PAR_FOR(n)
    for (size_t i = 0; i < n; i++)
      g[i] = kdrt_clip(g[i], clipvalue);
  }
}

void kdrt_grad_clip_factor(float *f, const float *s, float c, int global) {
  f[0] = kdrt_clip_factor(s[0], c, global);
}

// keras.optimizers.schedules at the optimizer's iterations (0-based), in
// float32 as Keras computes them: the step and the config cast to float32
// (a Python float operand of a tensor op is cast as it stands).
float kdrt_schedule_lr(const kdrt_schedule *s, int64_t step) {
  const float x = (float)step, init = (float)s->initial, ds = (float)s->decay_steps;
  switch (s->kind) {
  case KDRT_SCHEDULE_EXPONENTIAL: {
    float p = x / ds;
    return init * powf((float)s->decay_rate, s->staircase ? floorf(p) : p);
  }
  case KDRT_SCHEDULE_INVERSE_TIME: {
    float p = x / ds;
    return init / (1.0f + (float)s->decay_rate * (s->staircase ? floorf(p) : p));
  }
  case KDRT_SCHEDULE_PIECEWISE: { // the sum of every range's indicator times its value
    float r = 0.0f;
    r += (float)(step <= (int64_t)s->bounds[0]) * (float)s->values[0];
    r += (float)(step > (int64_t)s->bounds[s->nbounds - 1]) * (float)s->values[s->nbounds];
    for (int i = 0; i + 1 < s->nbounds; i++)
      r += (float)(step > (int64_t)s->bounds[i] && step <= (int64_t)s->bounds[i + 1]) *
           (float)s->values[i + 1];
    return r;
  }
  case KDRT_SCHEDULE_POLYNOMIAL: {
    float end = (float)s->end, d = ds, y = x;
    if (s->cycle)
      d = ds * (x == 0.0f ? 1.0f : ceilf(x / (float)s->decay_steps));
    else
      y = fminf(x, ds);
    return (init - end) * powf(1.0f - y / d, (float)s->power) + end;
  }
  case KDRT_SCHEDULE_COSINE: {
    float y = x, from = init;
    if (s->warmup) {
      float ws = (float)s->warmup_steps, target = (float)s->warmup_target;
      y = fminf(x, ds + ws);
      if (y < ws) return (target - init) * (y / ws) + init;
      y -= ws;
      from = target;
    } else {
      y = fminf(x, ds);
    }
    float cosine = 0.5f * (1.0f + cosf(3.14159265358979323846f * (y / ds)));
    return from * ((float)(1.0 - s->alpha) * cosine + (float)s->alpha);
  }
  }
  return init;
}

// issue 23: a 16-bit UnitNorm's factors from the sums of rounded squares,
// and a 16-bit activity penalty over the step's rows (kdrt_optim.h).
void kdrt_unit_norm16(float *f, const float *s, size_t n, int kind) {
  for (size_t i = 0; i < n; i++) f[i] = kdrt_unit_norm16_1(s[i], kind);
}

void kdrt_batch_mean16(float *out, const float *in, size_t n, double rows, int kind) {
  for (size_t i = 0; i < n; i++) out[i] = kdrt_batch_mean16_1(in[i], rows, kind);
}
