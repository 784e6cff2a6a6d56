// optim.c: the update phase of a step on one rank's local parameters:
// every optimizer's update, weight decay, gradient clipping, the loss
// scaling of mixed precision (issue 23) and the learning-rate schedules.
// Apart from ops.c's kernels because it is what the fit loop runs after
// the backward pass, and kdrt.c calls kdrt_schedule_lr itself; the CUDA
// runtime's counterpart is cuda/optim.cu. Threads: ops.c's header comment.
//
// - Optimizers follow keras/src/optimizers/{sgd,adam,adamw,rmsprop,adagrad,
//   adamax,nadam,lion}.py (weight decay w -= w*wd*lr applied before the
//   step, as base_optimizer does; RMSprop: eps inside the sqrt), and
//   learning-rate schedules optimizers/schedules/learning_rate_schedule.py.
#include <math.h>
#include <stdint.h>

#include "kdrt.h"
#include "ops_impl.h"

// ---------------------------------------------------------------- optimizers

void kdrt_sgd(float *w, const float *g, float *m, size_t n, float lr, float momentum,
              int nesterov) {
  if (momentum == 0.0f) {
    KD_PAR_FOR(n)
    for (size_t i = 0; i < n; i++)
      w[i] -= lr * g[i];
    return;
  }
  // m = m*momentum - g*lr; w += m (nesterov: w += m*momentum - g*lr)
  if (nesterov) {
    KD_PAR_FOR(n)
    for (size_t i = 0; i < n; i++) {
      float mi = m[i] * momentum - g[i] * lr;
      m[i] = mi;
      w[i] += mi * momentum - g[i] * lr;
    }
  } else {
    KD_PAR_FOR(n)
    for (size_t i = 0; i < n; i++) {
      float mi = m[i] * momentum - g[i] * lr;
      m[i] = mi;
      w[i] += mi;
    }
  }
}

// Keras's moment update, s += (x - s) * (1 - beta): Adam's, Adamax's and
// Nadam's first moment (x = g) and second (x = g^2).
static inline float moment(float s, float x, float c) { return s + (x - s) * c; }

// The Adam step shared by kdrt_adam and kdrt_adamw; amsgrad (vhat set)
// divides by the running maximum of v instead of v.
static void adam_step(float *restrict w, const float *restrict g, float *restrict m,
                      float *restrict v, float *restrict vhat, size_t n, float lr, float b1,
                      float b2, float eps, int64_t t) {
  const float alpha = kdrt_adam_alpha(lr, b1, b2, (double)t);
  const float c1 = 1.0f - b1, c2 = 1.0f - b2;
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i], mi = moment(m[i], gi, c1), vi = moment(v[i], gi * gi, c2);
    m[i] = mi;
    v[i] = vi;
    if (vhat) vhat[i] = vi = fmaxf(vhat[i], vi);
    w[i] -= mi * alpha / (sqrtf(vi) + eps);
  }
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

// centered (a set): the denominator is v - a^2 + eps, a the running mean
// of the gradient.
void kdrt_rmsprop(float *w, const float *g, float *v, float *m, float *a, size_t n, float lr,
                  float rho, float momentum, float eps) {
  const float c = 1.0f - rho;
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i];
    float vi = rho * v[i] + c * gi * gi;
    v[i] = vi;
    float den = vi + eps;
    if (a) {
      float ai = rho * a[i] + c * gi;
      a[i] = ai;
      den = vi - ai * ai + eps;
    }
    float inc = lr * gi / sqrtf(den);
    if (m) inc = m[i] = momentum * m[i] + inc;
    w[i] -= inc;
  }
}

void kdrt_adagrad(float *w, const float *g, float *acc, size_t n, float lr, float eps) {
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i], ai = acc[i] + gi * gi;
    acc[i] = ai;
    w[i] -= lr * gi / sqrtf(ai + eps);
  }
}

void kdrt_adamax(float *w, const float *g, float *m, float *u, size_t n, float lr, float b1,
                 float b2, float eps, int64_t t) {
  const float c1 = 1.0f - b1, bias = 1.0f - powf(b1, (float)t);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i], mi = moment(m[i], gi, c1), ui = fmaxf(b2 * u[i], fabsf(gi));
    m[i] = mi;
    u[i] = ui;
    w[i] -= lr * mi / (bias * (ui + eps));
  }
}

// Nadam's momentum schedule: u_t = b1 * (1 - 0.5 * 0.96^t), and Keras's
// running product of it, a float32 variable multiplied once a step.
static float nadam_u(float b1, int64_t t) { return b1 * (1.0f - 0.5f * powf(0.96f, (float)t)); }

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
  const float u_t = nadam_u(b1, t), u_next = nadam_u(b1, t + 1);
  const float d1 = 1.0f - u_prod * u_next, d2 = 1.0f - u_prod, k2 = 1.0f - u_t;
  const float c1 = 1.0f - b1, c2 = 1.0f - b2, bias2 = 1.0f - powf(b2, (float)t);
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i], mi = moment(m[i], gi, c1), vi = moment(v[i], gi * gi, c2);
    m[i] = mi;
    v[i] = vi;
    float mhat = u_next * mi / d1 + k2 * gi / d2;
    w[i] -= mhat * lr / (sqrtf(vi / bias2) + eps);
  }
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
    for (size_t i = 0; i < var->n; i++) gv[i] = gv[i] / s;
  }
}

void kdrt_lion(float *w, const float *g, float *m, size_t n, float lr, float b1, float b2) {
  const float c1 = 1.0f - b1, c2 = 1.0f - b2;
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i], d = m[i] * b1 + gi * c1;
    w[i] -= lr * (float)((d > 0.0f) - (d < 0.0f));
    m[i] = m[i] * b2 + gi * c2;
  }
}

void kdrt_weight_decay(float *w, size_t n, float lr, float wd) {
  KD_PAR_FOR(n)
  for (size_t i = 0; i < n; i++)
    w[i] = w[i] - w[i] * wd * lr; // Keras's order of operations
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
      g[i] = fminf(fmaxf(g[i], -clipvalue), clipvalue);
  }
}

void kdrt_grad_clip_factor(float *f, const float *s, float c, int global) {
  float norm = sqrtf(s[0]);
  if (global) // clip_by_global_norm: + (norm - norm) makes a non-finite norm NaN
    f[0] = c * fminf(1.0f / norm, 1.0f / c) + (norm - norm);
  else // _clip_by_norm: a zero gradient keeps its zeros, a NaN norm spreads
    f[0] = isnan(norm) ? norm : c / fmaxf(norm, c);
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
