// opt16_check.c (tests/sh/opt16.sh): the runtime's 16-bit updates and
// clippings (kdrt_optim.h, issue 23) against Keras 3.15's own, the cases
// tests/keras_ref/opt16_ref.py writes: each optimizer's three steps on one
// bfloat16 or float16 variable, from the same weights and gradients, as
// kdcc's generated update calls them (ops.c's update16_emit: the clipping,
// then the kernel, weight decay inside). Keras's eager run (every op of
// update_step rounded; float16's divisions by a scalar XLA's products by
// the reciprocal, kdrt_optim.h's kdrt_div16s) must be equal bit for bit,
// weights and slots; its jit run (XLA fuses some 16-bit chains in
// float32, float16's more than bfloat16's) is reported. Each case runs a
// second time on the variable and slots kept in their 16 bits (kind |
// KDRT_STORE16, kdcc's KDCC_VAR16): the same bits as the float32 buffers'.
//
// Usage: opt16_check DIR   (exit status 0 when every eager case is equal)
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"
#include "kdrt_optim.h" // kdrt_batch_mean16_1
#include "kdrt_round.h"

typedef struct {
  char name[64], dtype[16], cls[16];
  int n, nslots, centered, nesterov, amsgrad;
  float lr, b1, b2, eps, rho, momentum, wd, clipnorm, global, clipvalue;
} Case;

// The gradient as the update reads it: clipped as base_optimizer clips.
static void clip(const Case *k, int kind, float *g) {
  if (k->clipnorm > 0 || k->global > 0) {
    float s = 0, f;
    for (int i = 0; i < k->n; i++) { // ROUND(grad)^2 rounded, summed in float32 (autodiff.c)
      float r = kdrt_round_to(kind, g[i]);
      s += kdrt_round_to(kind, r * r);
    }
    kdrt_grad_clip_factor16(&f, &s, k->global > 0 ? k->global : k->clipnorm, k->global > 0,
                            kind);
    kdrt_clip_grad16(g, k->n, &f, k->global > 0 ? 0.0f : k->clipnorm, kind);
  }
  if (k->clipvalue > 0) kdrt_clip_grad(g, k->n, NULL, kdrt_round_to(kind, k->clipvalue));
}

// st: kind, or kind | KDRT_STORE16 with w and s the 16 bits' buffers.
static void step(const Case *k, int st, void *w, float *g, void *s[3], int64_t t, kdrt_ctx *c) {
  size_t n = (size_t)k->n;
  int kind = st & ~KDRT_STORE16;
  clip(k, kind, g);
  if (!strcmp(k->cls, "SGD"))
    kdrt_sgd16(w, g, s[0], n, k->lr, k->momentum, k->nesterov, k->wd, st);
  else if (!strcmp(k->cls, "Adam"))
    kdrt_adam16(w, g, s[0], s[1], k->amsgrad ? s[2] : NULL, n, k->lr, k->b1, k->b2, k->eps,
                k->wd, t, st);
  else if (!strcmp(k->cls, "RMSprop"))
    kdrt_rmsprop16(w, g, s[0], k->momentum > 0 ? s[1] : NULL,
                   k->centered ? s[1 + (k->momentum > 0)] : NULL, n, k->lr, k->rho, k->momentum,
                   k->eps, k->wd, st);
  else if (!strcmp(k->cls, "Adagrad"))
    kdrt_adagrad16(w, g, s[0], n, k->lr, k->eps, k->wd, st);
  else if (!strcmp(k->cls, "Adamax"))
    kdrt_adamax16(w, g, s[0], s[1], n, k->lr, k->b1, k->b2, k->eps, k->wd, t, st);
  else if (!strcmp(k->cls, "Nadam"))
    kdrt_nadam16(w, g, s[0], s[1], n, k->lr, k->b1, k->b2, k->eps, k->wd, t,
                 kdrt_nadam_product16(c, k->b1, t, kind), st);
  else if (!strcmp(k->cls, "Lion"))
    kdrt_lion16(w, g, s[0], n, k->lr, k->b1, k->b2, k->wd, st);
  else {
    fprintf(stderr, "opt16_check: %s: no optimizer %s\n", k->name, k->cls);
    exit(2);
  }
}

// Elements of ours (w, then the slots) that differ from Keras's ref.
static int differ(const Case *k, const float *w, float *const s[3], const float *ref) {
  int bad = 0;
  for (int j = 0; j <= k->nslots; j++) {
    const float *a = j ? s[j - 1] : w, *b = ref + (size_t)j * k->n;
    for (int i = 0; i < k->n; i++) bad += memcmp(&a[i], &b[i], sizeof *a) != 0 && a[i] != b[i];
  }
  return bad;
}

// The constraints and the regularizers of DIR/penalties.txt as kdcc's graph
// computes them on a 16-bit (64, 10) kernel (autodiff.c's constrain over
// axis 0: each column's sum of rounded squares, clip_norm16 or UnitNorm's
// unit_norm16, the product rounded; vars.c's penalty: l1 * sum(|w|) + l2 *
// sum(w^2), each op rounded, and its gradient, 2 * l2 * w rounded at the
// square's read of w, plus l1 * sign(w), rounded at the penalty's), and an
// activity penalty on a (rows, 10) output (vars.c's batch_penalty: the
// penalty over the rows cast, batch_mean16, rounded). Returns the cases
// that differ from Keras's eager values; a constraint's jit values (fit's)
// are reported.
static float l1l2_16(const float *w, int n, float l1, float l2, int kind) {
  float s1 = 0, s2 = 0;
  for (int i = 0; i < n; i++) s1 += fabsf(w[i]), s2 += kdrt_round_to(kind, w[i] * w[i]);
  float p1 = kdrt_round_to(kind, l1 * kdrt_round_to(kind, s1));
  float p2 = kdrt_round_to(kind, l2 * kdrt_round_to(kind, s2));
  return kdrt_round_to(kind, p1 + p2);
}

static int penalties(const char *dir) {
  enum { ROWS = 64, COLS = 10, N = ROWS * COLS };
  char path[4096], name[64], dtype[16], what[16];
  float a, b, rate;
  snprintf(path, sizeof path, "%s/penalties.txt", dir);
  FILE *mf = fopen(path, "r");
  if (!mf) return perror(path), 1;
  int failed = 0;
  while (fscanf(mf, "%63s %15s %15s %f %f %f", name, dtype, what, &a, &b, &rate) == 6) {
    int kind = strcmp(dtype, "float16") ? KDRT_ROUND_BF16 : KDRT_ROUND_F16;
    float buf[3 * N + 1], mine[N + 1], *w = buf, *ref = buf + N;
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return perror(path), 1;
    size_t got = fread(buf, sizeof *buf, 3 * N + 1, f);
    fclose(f);
    bool activity = !strcmp(what, "activity"), l1l2 = !strcmp(what, "l1l2");
    int rows = activity ? (int)rate : ROWS, n = rows * COLS;
    bool jit = !l1l2 && !activity && got == 3 * N;
    if (got != (l1l2 ? 2 * N + 1 : activity ? (size_t)n + 1 : jit ? 3 * N : 2 * N))
      return fprintf(stderr, "%s: %zu floats\n", path, got), 1;
    if (activity) { // mine[0] the penalty over the rows
      ref = buf + n;
      mine[0] = kdrt_round_to(kind, kdrt_batch_mean16_1(
                                        l1l2_16(w, n, kdrt_round_to(kind, a),
                                                kdrt_round_to(kind, b), kind), rows, kind));
      n = 1;
    } else if (l1l2) { // mine[0] the penalty, then the gradient
      const float l1 = kdrt_round_to(kind, a), l2 = kdrt_round_to(kind, b);
      mine[0] = l1l2_16(w, N, l1, l2, kind);
      for (int i = 0; i < N; i++) { // (abs's gradient at 0 is +1, JAX's)
        float sq = kdrt_round_to(kind, l2 * w[i] + l2 * w[i]);
        mine[1 + i] = kdrt_round_to(kind, l1 * (w[i] >= 0 ? 1.0f : -1.0f) + sq);
      }
      n = N + 1;
    } else if (!strncmp(name, "nonneg_", 7)) {
      for (int i = 0; i < N; i++) mine[i] = w[i] > 0 ? w[i] : 0.0f;
    } else {
      float s[COLS] = {0}, fc[COLS];
      for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < COLS; j++)
          s[j] += kdrt_round_to(kind, w[i * COLS + j] * w[i * COLS + j]);
      if (!strncmp(name, "unitnorm_", 9))
        kdrt_unit_norm16(fc, s, COLS, kind);
      else
        kdrt_clip_norm16(fc, s, COLS, a, b, rate, (float)(1.0 - rate), kind);
      for (int i = 0; i < N; i++) mine[i] = kdrt_round_to(kind, w[i] * fc[i % COLS]);
    }
    int bad = 0, bad_jit = 0; // (a NaN equals a NaN: float16's UnitNorm of a zero column)
#define DIFFER(x, y) ((x) != (y) && !(isnan(x) && isnan(y)))
    for (int i = 0; i < n; i++) bad += DIFFER(mine[i], ref[i]), bad_jit += jit && DIFFER(mine[i], ref[N + i]);
#undef DIFFER
    printf("%-28s %d of %d values differ from Keras's", name, bad, n);
    if (jit) printf(" (%d from its jit run)", bad_jit);
    printf("%s\n", bad ? "  FAIL" : "");
    failed += bad != 0;
  }
  fclose(mf);
  return failed;
}

int main(int argc, char **argv) {
  if (argc != 2) return fprintf(stderr, "usage: opt16_check DIR\n"), 2;
  char path[4096];
  snprintf(path, sizeof path, "%s/manifest.txt", argv[1]);
  FILE *mf = fopen(path, "r");
  if (!mf) return perror(path), 2;
  Case k;
  int cases = 0, failed = 0;
  while (fscanf(mf, "%63s %15s %15s %d %d %f %f %f %f %f %f %d %d %d %f %f %f %f", k.name,
                k.dtype, k.cls, &k.n, &k.nslots, &k.lr, &k.b1, &k.b2, &k.eps, &k.rho,
                &k.momentum, &k.centered, &k.nesterov, &k.amsgrad, &k.wd, &k.clipnorm,
                &k.global, &k.clipvalue) == 18) {
    int kind = strcmp(k.dtype, "float16") ? KDRT_ROUND_BF16 : KDRT_ROUND_F16;
    size_t n = (size_t)k.n, per = (size_t)(1 + k.nslots);
    snprintf(path, sizeof path, "%s/%s.bin", argv[1], k.name);
    FILE *f = fopen(path, "rb");
    if (!f) return perror(path), 2;
    float *all = malloc((4 + 2 * per) * n * sizeof *all);
    size_t got = fread(all, sizeof *all, (4 + 2 * per) * n, f);
    fclose(f);
    int jit = got == (4 + 2 * per) * n;
    if (!jit && got != (4 + per) * n) return fprintf(stderr, "%s: %zu floats\n", path, got), 2;
    float *w = malloc(n * sizeof *w), *g = malloc(n * sizeof *g), *s[3];
    memcpy(w, all, n * sizeof *w);
    for (int j = 0; j < 3; j++) {
      s[j] = calloc(n, sizeof *s[j]);
      if (!strcmp(k.cls, "Adagrad")) // initial_accumulator_value 0.1, cast (emit.c's accum_init)
        for (size_t i = 0; i < n; i++) s[j][i] = kdrt_round_to(kind, 0.1f);
    }
    // the same in 16 bits: w and the slots packed (uint16_t), kind | KDRT_STORE16
    uint16_t *h = malloc(4 * n * sizeof *h);
    void *hs[3] = {h + n, h + 2 * n, h + 3 * n};
    kdrt_pack16(kind, h, w, n);
    for (int j = 0; j < k.nslots; j++) kdrt_pack16(kind, hs[j], s[j], n);
    kdrt_ctx c, c16;
    memset(&c, 0, sizeof c);
    memset(&c16, 0, sizeof c16);
    for (int64_t t = 1; t <= 3; t++) {
      memcpy(g, all + (size_t)t * n, n * sizeof *g);
      step(&k, kind, w, g, (void **)s, t, &c);
      memcpy(g, all + (size_t)t * n, n * sizeof *g);
      step(&k, kind | KDRT_STORE16, h, g, hs, t, &c16);
    }
    int bad16 = 0;
    for (int j = 0; j <= k.nslots; j++) {
      const float *a = j ? s[j - 1] : w;
      for (size_t i = 0; i < n; i++) {
        float x;
        kdrt_unpack16(kind, &x, h + (size_t)j * n + i, 1);
        bad16 += memcmp(&x, &a[i], sizeof x) != 0;
      }
    }
    free(h);
    int bad = differ(&k, w, s, all + 4 * n) + bad16;
    int bad_jit = jit ? differ(&k, w, s, all + (4 + per) * n) : -1;
    printf("%-28s %d of %zu values differ from Keras's eager run", k.name, bad, per * n);
    if (jit) printf(" (%d from its jit run)", bad_jit);
    printf("; in 16 bits %d differ from float32 buffers'", bad16);
    printf("%s\n", bad ? "  FAIL" : "");
    failed += bad != 0;
    cases++;
    for (int j = 0; j < 3; j++) free(s[j]);
    free(w), free(g), free(all);
  }
  fclose(mf);
  failed += penalties(argv[1]);
  printf("opt16_check: %d cases and the penalties, %d differ\n", cases, failed);
  return cases == 0 || failed ? 1 : 0;
}
