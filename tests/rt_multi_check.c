// rt_multi_check: a hand-written stand-in for a kdcc-generated program with
// two inputs and two outputs, to test kdrt_main's several inputs, labels
// and logs (tests/sh/rt_multi.sh runs it on meshes of 1, 2 and 4 ranks).
//
// The model, Keras's functional API in spirit:
//   feat (F,) float32, tok (T,) int32 ids in [0, V)
//   a[b, c] = sum_k feat[b, k] wa[k, c] + sum_t emb[tok[b, t], c]   (C,)
//   b[b]    = sum_k feat[b, k] wb[k]                               (1,)
//   loss = a_loss + b_loss; a_loss: mse of a against one-hot(label a),
//   label a class ids (CLASSID); b_loss: mse of b against label b (DENSE);
//   a_accuracy: argmax(a) == label a.
// Logs, in the order the steps write them: loss, a_loss, b_loss,
// a_accuracy (Keras's names for a model with outputs "a" and "b").
//
// Placement: the batch split over the one mesh axis `data` (RT_MULTI_MESH,
// default 1), every variable replicated; logs and gradients are partial
// sums over `data` (all-reduce). Predict reads a at arena offset 0 and b
// after it; RT_MULTI_NOPRED=1 marks b as not one arena buffer. Like a
// generated step it takes the step's rows from the context (c->rows, and
// this rank's c->local_rows when they are split unevenly), and returns at
// once when the runtime only asks (c->probe).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"

enum { B = 8, F = 5, T = 3, V = 6, C = 4 };
enum { WA = 0, EMB = F * C, WB = F * C + V * C, NPARAM = F * C + V * C + F };

static int mesh_shape[1] = {1};
static const char *const mesh_axes[1] = {"data"};

static void init(kdrt_ctx *c) {
  kdrt_layout wa = {2, {F, C}, {-1, -1}}, emb = {2, {V, C}, {-1, -1}}, wb = {1, {F}, {-1}};
  kdrt_init_fill(c, c->params + WA, &wa, KDRT_INIT_GLOROT_UNIFORM, F, C, 0, 0, 0xa1);
  kdrt_init_fill(c, c->params + EMB, &emb, KDRT_INIT_RANDOM_UNIFORM, V, C, -0.05f, 0.05f, 0xa2);
  kdrt_init_fill(c, c->params + WB, &wb, KDRT_INIT_GLOROT_UNIFORM, F, 1, 0, 0, 0xa3);
}

// Forward: a in arena [lb, C], b after it [lb]; logs reduced over data.
// With grad, the gradients of every variable (reduced) into c->grads.
static void forward(kdrt_ctx *c, const void *const *x, const void *const *y, float *logs,
                    int grad) {
  if (c->probe) return;
  int64_t rows = c->rows ? c->rows : B;
  int lb = (int)(c->ragged ? c->local_rows : rows / c->prog->mesh_shape[0]);
  const float *feat = x[0], *ya = y[0], *yb = y[1];
  const int32_t *tok = x[1];
  float *a = c->arena, *b = c->arena + lb * C;
  float part[4] = {0, 0, 0, 0}; // a_loss, b_loss, a_accuracy partial sums
  if (grad) memset(c->grads, 0, sizeof(float) * NPARAM);
  for (int r = 0; r < lb; r++) {
    const float *fr = feat + r * F;
    int cls = (int)ya[r], best = 0;
    for (int j = 0; j < C; j++) {
      float s = 0;
      for (int k = 0; k < F; k++) s += fr[k] * c->params[WA + k * C + j];
      for (int t = 0; t < T; t++) s += c->params[EMB + tok[r * T + t] * C + j];
      a[r * C + j] = s;
      if (s > a[r * C + best]) best = j;
      float d = s - (j == cls ? 1.0f : 0.0f);
      part[0] += d * d / (float)(rows * C);
      if (grad) {
        float g = 2.0f * d / (float)(rows * C);
        for (int k = 0; k < F; k++) c->grads[WA + k * C + j] += fr[k] * g;
        for (int t = 0; t < T; t++) c->grads[EMB + tok[r * T + t] * C + j] += g;
      }
    }
    part[2] += (best == cls) / (float)rows;
    float s = 0;
    for (int k = 0; k < F; k++) s += fr[k] * c->params[WB + k];
    b[r] = s;
    float d = s - yb[r];
    part[1] += d * d / (float)rows;
    if (grad)
      for (int k = 0; k < F; k++) c->grads[WB + k] += fr[k] * 2.0f * d / (float)rows;
  }
  float sum[3];
  kdrt_allreduce(c, 1, part, sum, 3);
  logs[0] = sum[0] + sum[1], logs[1] = sum[0], logs[2] = sum[1], logs[3] = sum[2];
  if (grad) kdrt_allreduce(c, 1, c->grads, c->grads, NPARAM);
}

static void eval_step(kdrt_ctx *c, const void *const *x, const void *const *y, float *logs) {
  forward(c, x, y, logs, 0);
}

static void grad_step(kdrt_ctx *c, const void *const *x, const void *const *y, float *logs) {
  forward(c, x, y, logs, 1);
}

static void train_step(kdrt_ctx *c, const void *const *x, const void *const *y, float *logs) {
  forward(c, x, y, logs, 1);
  if (c->probe) return;
  for (int i = 0; i < NPARAM; i++) c->params[i] -= c->lr * c->grads[i];
}

int main(int argc, char **argv) {
  const char *m = getenv("RT_MULTI_MESH");
  if (m && *m && (sscanf(m, "%d", &mesh_shape[0]) != 1 || mesh_shape[0] < 1 ||
                  B % mesh_shape[0])) {
    fprintf(stderr, "rt_multi_check: bad RT_MULTI_MESH '%s'\n", m);
    return 2;
  }
  int lb = B / mesh_shape[0];
  static const kdrt_io inputs[2] = {
      {.name = "feat", .dtype = KDRT_F32, .rank = 1, .shape = {F}},
      {.name = "tok", .dtype = KDRT_I32, .rank = 1, .shape = {T}, .num_classes = V}};
  static const kdrt_io labels[2] = {
      {.name = "a", .dtype = KDRT_F32, .rank = 0, .label_kind = KDRT_LABEL_CLASSID,
       .num_classes = C},
      {.name = "b", .dtype = KDRT_F32, .rank = 1, .shape = {1}, .label_kind = KDRT_LABEL_DENSE}};
  static const char *const log_names[4] = {"loss", "a_loss", "b_loss", "a_accuracy"};
  const char *nopred = getenv("RT_MULTI_NOPRED");
  kdrt_output outputs[2] = {
      {"a", 0, {2, {B, C}, {0, -1}}},
      {"b", nopred && *nopred == '1' ? SIZE_MAX : (size_t)(lb * C), {2, {B, 1}, {0, -1}}}};
  static kdrt_var vars[3] = {
      {"m/da/kernel", "da", "Dense", 0, {2, {F, C}, {-1, -1}}, WA, 0, 0, WA, F * C, NULL, NULL,
       NULL, KDRT_F32},
      {"m/emb/embeddings", "emb", "Embedding", 0, {2, {V, C}, {-1, -1}}, EMB, 0, 0, EMB, V * C, NULL,
       NULL, NULL, KDRT_F32},
      {"m/db/kernel", "db", "Dense", 0, {2, {F, 1}, {-1, -1}}, WB, 0, 0, WB, F, NULL, NULL, NULL,
       KDRT_F32},
  };
  kdrt_program prog = {
      .model_name = "rt_multi_check",
      .mesh_ndim = 1,
      .mesh_shape = mesh_shape,
      .mesh_axes = mesh_axes,
      .batch_axis = 0,
      .batch = B,
      .ninputs = 2,
      .inputs = inputs,
      .nlabels = 2,
      .labels = labels,
      .nlogs = 4,
      .log_names = log_names,
      .noutputs = 2,
      .outputs = outputs,
      .learning_rate = 0.1f,
      .param_floats = NPARAM,
      .grad_floats = NPARAM,
      .arena_floats = (size_t)(B * (C + 1)),
      .init = init,
      .train_step = train_step,
      .eval_step = eval_step,
      .grad_step = grad_step,
      .nvars = 3,
      .vars = vars,
  };
  if (argc > 1 && !strcmp(argv[1], "gradcheck")) return kdrt_gradcheck(argc - 1, argv + 1, &prog);
  return kdrt_main(argc, argv, &prog);
}
