// rt_rows_check: the batch is a run-time row count. A program compiled for
// a global batch of BATCH (included below as PROGRAM, its main renamed)
// runs eval_step on one device with c->rows = BATCH, then with c->rows =
// BATCH/2 on each half of the same samples: the loss of the whole batch
// must be the mean of the halves' (losses average over rows), and every
// other log likewise. tests/sh/rows.sh builds it for several models.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define main program_main
#include PROGRAM
#undef main

// Rows [first, first + n) of every input and label, contiguous.
static void **rows_of(const kdrt_program *p, int labels, void **all, int64_t first) {
  int count = labels ? p->nlabels : p->ninputs;
  void **out = calloc((size_t)count, sizeof *out);
  for (int i = 0; i < count; i++) {
    const kdrt_io *io = labels ? &p->labels[i] : &p->inputs[i];
    int64_t per = 1;
    for (int d = 0; d < io->rank; d++) per *= io->shape[d];
    out[i] = (char *)all[i] + (size_t)(first * per) * 4; // float32 and int32 alike
  }
  return out;
}

int main(void) {
  const kdrt_program *p = &program;
  kdrt_ctx c = {.prog = p, .rank = 0, .world = 1, .seed = 1337, .lr = p->learning_rate};
  c.params = calloc(p->param_floats + 16, sizeof(float));
  c.grads = calloc(p->grad_floats + 16, sizeof(float));
  c.arena = calloc(p->arena_floats + 16, sizeof(float));
  p->init(&c);
  void **x = calloc((size_t)p->ninputs, sizeof *x), **y = calloc((size_t)p->nlabels, sizeof *y);
  for (int i = 0; i < p->ninputs; i++) {
    int64_t per = 1;
    for (int d = 0; d < p->inputs[i].rank; d++) per *= p->inputs[i].shape[d];
    x[i] = calloc((size_t)(per * p->batch), 4);
    for (int64_t s = 0; s < p->batch; s++)
      kdrt_synthetic_input(p, 7, i, s, (char *)x[i] + (size_t)(s * per) * 4);
  }
  for (int j = 0; j < p->nlabels; j++) {
    int64_t per = 1;
    for (int d = 0; d < p->labels[j].rank; d++) per *= p->labels[j].shape[d];
    y[j] = calloc((size_t)(per * p->batch), 4);
    for (int64_t s = 0; s < p->batch; s++)
      kdrt_synthetic_label(p, 7, j, s, (float *)y[j] + s * per);
  }
  float whole[64], a[64], b[64];
  c.rows = 0; // the compiled batch
  p->eval_step(&c, (const void *const *)x, (const void *const *)y, whole);
  int64_t half = p->batch / 2;
  c.rows = half;
  p->eval_step(&c, (const void *const *)rows_of(p, 0, x, 0),
               (const void *const *)rows_of(p, 1, (void **)y, 0), a);
  p->eval_step(&c, (const void *const *)rows_of(p, 0, x, half),
               (const void *const *)rows_of(p, 1, (void **)y, half), b);
  int bad = 0;
  for (int k = 0; k < p->nlogs; k++) {
    double mean = 0.5 * ((double)a[k] + b[k]);
    double err = fabs(mean - whole[k]) / fmax(1e-6, fabs(whole[k]));
    printf("  %-18s batch %d: %.7g, halves: %.7g %.7g (mean %.7g), relative difference %.1e\n",
           p->log_names[k], p->batch, whole[k], a[k], b[k], mean, err);
    if (!(err < 1e-5)) bad = 1;
  }
  return bad;
}
