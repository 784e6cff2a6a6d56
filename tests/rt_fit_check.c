// rt_fit_check: a hand-written stand-in for a kdcc-generated program, to
// test kdrt_main (options, data, fit loop, output, history) without the
// compiler. tests/sh/rt_fit.sh runs it on several meshes.
//
// The model is a linear layer with mse loss and plain SGD:
//   pred[b, n] = sum_k x[b, k] w[k, n]      x (B, 6), w (6, 8), y (B, 8) one-hot
// placed as kdcc would place it on mesh (data[, model]): the batch split
// over `data`, w's columns over `model` when the mesh has two axes. So the
// loss is a partial sum over every axis (all-reduce over both), accuracy
// needs whole rows (all-gather of pred along n over `model`), and dw is a
// partial sum over `data` (all-reduce over data).
//
// The mesh comes from the environment, RT_FIT_MESH=2,4 (default 1), since a
// generated program has its mesh compiled in. Like a generated step it
// takes the step's rows from the context: rows (global) and this rank's
// local_rows (kdrt_set_rows), the losses averaged over the global rows.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"

enum { B = 16, K = 6, N = 8 };

static int mesh_shape[2] = {1, 1};
static const char *const mesh_axes[2] = {"data", "model"};

static int model_parts(const kdrt_ctx *c) {
  return c->prog->mesh_ndim > 1 ? c->prog->mesh_shape[1] : 1;
}

static void init(kdrt_ctx *c) {
  kdrt_layout w = {2, {K, N}, {-1, (int8_t)(c->prog->mesh_ndim > 1 ? 1 : -1)}};
  kdrt_init_fill(c, c->params, &w, KDRT_INIT_GLOROT_UNIFORM, K, N, 0, 0, 0x77);
}

// Forward pass; returns the local rows' predictions of this rank's columns
// in c->arena ([lb, ln]), and loss / accuracy, reduced.
static void forward(kdrt_ctx *c, const void *const *xs, const void *const *ys, float *logs) {
  if (c->probe) return;
  const float *x = xs[0], *y = ys[0];
  float *loss = &logs[0], *metric = &logs[1];
  int64_t rows = c->rows ? c->rows : B;
  int lb = (int)(c->ragged ? c->local_rows : rows / c->prog->mesh_shape[0]);
  int ln = N / model_parts(c), col0 = c->coord[1] * ln;
  if (c->prog->mesh_ndim == 1) col0 = 0;
  float *pred = c->arena, *full = c->arena + lb * ln;
  double part = 0;
  for (int b = 0; b < lb; b++) {
    for (int n = 0; n < ln; n++) {
      float s = 0;
      for (int k = 0; k < K; k++) s += x[b * K + k] * c->params[k * ln + n];
      pred[b * ln + n] = s;
      float d = s - y[b * N + col0 + n];
      part += (double)d * d;
    }
  }
  unsigned all = (1u << c->prog->mesh_ndim) - 1;
  float l = (float)(part / (double)(rows * N));
  kdrt_allreduce(c, all, &l, loss, 1);
  // accuracy: argmax over whole rows
  int64_t shape[2] = {lb, ln};
  if (c->prog->mesh_ndim > 1) kdrt_allgather(c, 2, 2, shape, 1, pred, full);
  else memcpy(full, pred, sizeof(float) * (size_t)(lb * ln));
  float correct = 0;
  for (int b = 0; b < lb; b++) {
    int pa = 0, ya = 0;
    for (int n = 1; n < N; n++) {
      if (full[b * N + n] > full[b * N + pa]) pa = n;
      if (y[b * N + n] > y[b * N + ya]) ya = n;
    }
    correct += pa == ya;
  }
  correct /= (float)rows;
  kdrt_allreduce(c, 1, &correct, metric, 1);
}

// RT_FIT_LATE=1: the steps hand their logs over one step late, as a device
// runtime does (kdrt_ctx.logs_pending, collect): the fit loop must give the
// same history and stop at the same step.
static float late[2][2];
static int nlate;

static void collect(kdrt_ctx *c, float *logs) {
  if (!nlate) kdrt_fatal(c, "rt_fit_check: logs collected with none held");
  logs[0] = late[0][0], logs[1] = late[0][1];
  late[0][0] = late[1][0], late[0][1] = late[1][1];
  nlate--;
}

static void train_step(kdrt_ctx *c, const void *const *xs, const void *const *ys, float *logs) {
  forward(c, xs, ys, logs);
  if (c->probe) return;
  const char *l8 = getenv("RT_FIT_LATE");
  if (l8 && *l8 == '1') {
    if (nlate == 2) kdrt_fatal(c, "rt_fit_check: a third step before the first's logs");
    late[nlate][0] = logs[0], late[nlate][1] = logs[1], nlate++;
    logs[0] = logs[1] = NAN; // not to be read before collect
    c->logs_pending = 1;
    c->collect = collect;
  }
  const float *x = xs[0], *y = ys[0];
  int64_t rows = c->rows ? c->rows : B;
  int lb = (int)(c->ragged ? c->local_rows : rows / c->prog->mesh_shape[0]);
  int ln = N / model_parts(c), col0 = c->coord[1] * ln;
  if (c->prog->mesh_ndim == 1) col0 = 0;
  const float *pred = c->arena;
  memset(c->grads, 0, sizeof(float) * K * (size_t)ln);
  for (int b = 0; b < lb; b++)
    for (int n = 0; n < ln; n++) {
      float d = 2.0f * (pred[b * ln + n] - y[b * N + col0 + n]) / (float)(rows * N);
      for (int k = 0; k < K; k++) c->grads[k * ln + n] += x[b * K + k] * d;
    }
  kdrt_allreduce(c, 1, c->grads, c->grads, (size_t)(K * ln)); // dw: partial over data
  for (int i = 0; i < K * ln; i++) c->params[i] -= c->lr * c->grads[i];
  // RT_FIT_POISON=S: after optimizer step S (from 1) one weight of rank
  // 0's block is NaN, while this step's loss is finite (a divergence that
  // only the weights show).
  const char *poison = getenv("RT_FIT_POISON");
  if (poison && c->rank == 0 && c->step + 1 == atoll(poison)) c->params[0] = NAN;
}

int main(int argc, char **argv) {
  const char *m = getenv("RT_FIT_MESH");
  int nd = 1;
  if (m && *m) nd = sscanf(m, "%d,%d", &mesh_shape[0], &mesh_shape[1]);
  if (nd < 1 || mesh_shape[0] < 1 || mesh_shape[1] < 1) {
    fprintf(stderr, "rt_fit_check: bad RT_FIT_MESH '%s'\n", m);
    return 2;
  }
  int parts = nd > 1 ? mesh_shape[1] : 1;
  static const kdrt_io input = {.name = "x", .dtype = KDRT_F32, .rank = 1, .shape = {K}};
  static const kdrt_io label = {.name = "d", .dtype = KDRT_F32, .rank = 1, .shape = {N},
                                .label_kind = KDRT_LABEL_ONEHOT, .num_classes = N};
  static const char *const log_names[] = {"loss", "accuracy"};
  // pred [B, N]: the batch over data, the columns over model.
  kdrt_output output = {"d", 0, {2, {B, N}, {0, (int8_t)(nd > 1 ? 1 : -1)}}};
  kdrt_var var = {.path = "d/kernel", .layer = "d", .layer_class = "Dense", .index = 0,
                  .layout = {2, {K, N}, {-1, (int8_t)(nd > 1 ? 1 : -1)}}, .offset = 0,
                  .stride = (size_t)(K * N / parts), .nslots = 0, .goffset = 0,
                  .n = (size_t)(K * N / parts)};
  kdrt_program prog = {
      .model_name = "rt_fit_check",
      .mesh_ndim = nd,
      .mesh_shape = mesh_shape,
      .mesh_axes = mesh_axes,
      .batch_axis = 0,
      .batch = B,
      .ninputs = 1,
      .inputs = &input,
      .nlabels = 1,
      .labels = &label,
      .nlogs = 2,
      .log_names = log_names,
      .noutputs = 1,
      .outputs = &output,
      .learning_rate = 0.05f,
      .param_floats = (size_t)(K * N / parts),
      .grad_floats = (size_t)(K * N / parts),
      .arena_floats = (size_t)(B * N * 2),
      .init = init,
      .train_step = train_step,
      .eval_step = forward,
      .nvars = 1,
      .vars = &var,
  };
  return kdrt_main(argc, argv, &prog);
}
