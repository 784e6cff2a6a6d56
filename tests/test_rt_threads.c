// Tests for the runtime's threads: every kernel of runtime/ops.c and rng.c
// gives the same bits on 1 and on 3 OpenMP threads, on inputs large enough
// that the parallel paths run; the dropout mask (AVX2 or scalar Philox,
// any piece of any row) is the one its definition gives element by
// element; the kernels whose loops were split for threads (bias_grad's
// row blocks, matmul's blocks, transpose, reduce_sum, scatter_add) against
// naive loops.
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"

// ---------------------------------------------------------------- helpers

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static float frand(float lo, float hi) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

static float *rand_buf(size_t n, float lo, float hi) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
  return p;
}

static float *copy_of(const float *a, size_t n) {
  float *p = malloc(n * sizeof *p);
  memcpy(p, a, n * sizeof *p);
  return p;
}

// Run `body` (which writes `out`, n floats) on 1 thread and on 3, and
// check both gave the same bits. The body must not read what it writes
// (or must restore its inputs first: see the optimizer test).
#define SAME_ON_1_AND_3(what, out, n, body)                                                       \
  do {                                                                                          \
    omp_set_num_threads(1);                                                                     \
    body;                                                                                       \
    float *one_ = copy_of(out, n);                                                              \
    omp_set_num_threads(3);                                                                     \
    body;                                                                                       \
    cr_expect(!memcmp(one_, out, (n) * sizeof(float)), "%s: 1 and 3 threads differ", what);    \
    free(one_);                                                                                 \
  } while (0)

// ---------------------------------------------------------------- elementwise, rows

Test(threads, elementwise_and_row_kernels) {
  enum { R = 700, C = 130, N = R * C };
  float *x = rand_buf(N, -3, 3), *x2 = rand_buf(N, -3, 3), *dy = rand_buf(N, -1, 1);
  float *bias = rand_buf(C, -1, 1), *out = malloc(N * sizeof(float));
  for (int act = 0; act < KDRT_ACT_COUNT; act++) {
    SAME_ON_1_AND_3("act", out, N, kdrt_act(act, out, x, N));
    float *y = malloc(N * sizeof(float));
    kdrt_act(act, y, x, N);
    SAME_ON_1_AND_3("act_grad", out, N, kdrt_act_grad(act, out, dy, x, y, N));
    SAME_ON_1_AND_3("bias_act", out, N, kdrt_bias_act(act, out, x, bias, R, C));
    free(y);
  }
  const float *two[2] = {x, x2}, *three[3] = {x, x2, dy};
  SAME_ON_1_AND_3("add 2", out, N, kdrt_add(out, two, 2, N));
  SAME_ON_1_AND_3("add 3", out, N, kdrt_add(out, three, 3, N));
  SAME_ON_1_AND_3("mul", out, N, kdrt_mul(out, x, x2, N));
  SAME_ON_1_AND_3("scale", out, N, kdrt_scale(out, x, N, 0.3f, -1.0f));
  SAME_ON_1_AND_3("softmax", out, N, kdrt_softmax(out, x, R, C));
  float *sm = copy_of(out, N);
  SAME_ON_1_AND_3("softmax_grad", out, N, kdrt_softmax_grad(out, dy, sm, R, C));
  SAME_ON_1_AND_3("row_max", out, R, kdrt_row_max(out, x, R, C));
  float *m = copy_of(out, R);
  SAME_ON_1_AND_3("row_sumexp", out, R, kdrt_row_sumexp(out, x, m, R, C));
  for (int rms = 0; rms < 2; rms++) {
    SAME_ON_1_AND_3("norm", out, N, kdrt_norm(rms, out, x, R, C, 1e-5f));
    SAME_ON_1_AND_3("norm_grad", out, N, kdrt_norm_grad(rms, out, dy, x, R, C, 1e-5f));
  }
  free(x), free(x2), free(dy), free(bias), free(out), free(sm), free(m);
}

// The vectorised math (runtime/vmath.h): an element's result is the same
// whether it falls in an 8-lane group, a 4-lane remainder or the scalar
// tail, so whatever the length and start of the piece a thread (or a
// rank) holds. Every activation and its gradient, on a whole array, on
// each element alone, and on the array shifted by 1 to 7; with values
// where the functions change regime (exp's underflow and overflow, erf and
// tanh near +-1) and the special ones. A NaN is any NaN: its sign depends
// on operand order, which the vectoriser may change (x86 keeps the first).
static int same_bits(const float *a, const float *b, int n) {
  for (int i = 0; i < n; i++)
    if (memcmp(a + i, b + i, sizeof *a) && !(isnan(a[i]) && isnan(b[i])))
      return 0;
  return 1;
}

Test(threads, vector_math_same_bits_anywhere) {
  enum { N = 203 };
  float x[N + 8], y[N + 8], dy[N + 8], a[N + 8], b[N + 8];
  const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, -88.0f, 87.3f, -104.0f, 9.0f,
                           -9.0f, 4.0f, -4.0f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN};
  const int ns = (int)(sizeof special / sizeof *special);
  for (int i = 0; i < N + 8; i++)
    x[i] = i < ns ? special[i] : frand(-12, 12), dy[i] = frand(-1, 1);
  for (int act = 0; act < KDRT_ACT_COUNT; act++) {
    kdrt_act(act, y, x, N + 8);
    kdrt_act_grad(act, a, dy, x, y, N + 8);
    for (int s = 0; s < 8; s++) { // the array from element s on, then one by one
      kdrt_act(act, b, x + s, N);
      cr_expect(same_bits(b, y + s, N), "act %d: shifted by %d differs", act, s);
      kdrt_act_grad(act, b, dy + s, x + s, y + s, N);
      cr_expect(same_bits(b, a + s, N), "act_grad %d: shifted by %d differs", act,
                s);
    }
    for (int i = 0; i < N + 8; i++) {
      float one;
      kdrt_act(act, &one, x + i, 1);
      cr_expect(same_bits(&one, y + i, 1), "act %d of %g alone: %a, in the array: %a", act,
                x[i], one, y[i]);
    }
  }
  // softmax rows of every length up to 19, in place at every address mod 8
  for (int cols = 1; cols < 20; cols++) {
    kdrt_softmax(y, x, 1, cols);
    for (int s = 0; s < 8; s++) {
      memcpy(a + s, x, cols * sizeof(float));
      kdrt_softmax(a + s, a + s, 1, cols);
      cr_expect(same_bits(a + s, y, cols), "softmax of %d columns at +%d differs", cols, s);
    }
  }
}

Test(threads, losses_and_metrics) {
  enum { R = 600, C = 101, N = R * C };
  float *logits = rand_buf(N, -4, 4), *prob = malloc(N * sizeof(float));
  kdrt_softmax(prob, logits, R, C);
  float *dense = rand_buf(N, 0, 1), *ids = malloc(R * sizeof(float));
  for (int r = 0; r < R; r++) ids[r] = (float)(r * 37 % C);
  ids[5] = -1; // a row without a class
  float *out = malloc(N * sizeof(float));
  for (int kind = 0; kind < KDRT_LOSS_COUNT; kind++)
    for (int fl = 0; fl <= 1; fl++) {
      const float *pred = fl ? logits : prob, *y = kind == KDRT_LOSS_SCCE ? ids : dense;
      if (kind == KDRT_LOSS_BCE && !fl) pred = prob; // probabilities in (0, 1)
      const float flag = 0.0f; // the hinge losses: labels 0/1 mapped to -1/1
      SAME_ON_1_AND_3("loss", out, 1,
                      kdrt_loss(kind, fl, 0.5f, out, pred, y, &flag, R, C, 1.0 / R));
      SAME_ON_1_AND_3("loss_grad", out, N,
                      kdrt_loss_grad(kind, fl, 0.5f, out, pred, y, &flag, R, C, 1.0 / R));
      SAME_ON_1_AND_3("accuracy", out, 1, kdrt_accuracy(kind, fl, out, pred, y, R, C, 1.0 / R));
    }
  float m[R], s[R];
  kdrt_row_max(m, logits, R, C);
  kdrt_row_sumexp(s, logits, m, R, C);
  SAME_ON_1_AND_3("sparse_xent", out, 1, kdrt_sparse_xent(out, logits, ids, m, s, R, C, 0, 0.1));
  SAME_ON_1_AND_3("sparse_xent_grad", out, N,
                  kdrt_sparse_xent_grad(out, logits, ids, m, s, R, C, 0, 0.1));
  SAME_ON_1_AND_3("sparse_xent_acc", out, 1,
                  kdrt_sparse_xent_acc(out, logits, ids, m, R, C, 0, 0.1));
  float la[2]; // issue 22: the fused classifier, its loss, accuracy and gradient
  SAME_ON_1_AND_3("sparse_xent_fused", out, N,
                  kdrt_sparse_xent_fused(la, la + 1, out, logits, ids, NULL, NULL, R, C, 0.1,
                                         0.1, 0.1));
  SAME_ON_1_AND_3("sparse_xent_fused's loss, accuracy", la, 2,
                  kdrt_sparse_xent_fused(la, la + 1, out, logits, ids, NULL, NULL, R, C, 0.1,
                                         0.1, 0.1));
  free(logits), free(prob), free(dense), free(ids), free(out);
}

// ---------------------------------------------------------------- sums split for threads

Test(threads, bias_grad_blocks_and_columns) {
  // [rows, cols]: many row blocks of few columns (a conv's bias), one block
  // of wide rows, and rows that do not fill their last block.
  static const int64_t shapes[][2] = {{86528, 8}, {5000, 7}, {300, 600}, {1025, 3}, {128, 10}};
  for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
    const int64_t R = shapes[t][0], C = shapes[t][1];
    float *in = rand_buf((size_t)(R * C), -1, 1), *out = malloc((size_t)C * sizeof(float));
    SAME_ON_1_AND_3("bias_grad", out, (size_t)C, kdrt_bias_grad(out, in, R, C));
    for (int64_t j = 0; j < C; j++) {
      double ref = 0;
      for (int64_t r = 0; r < R; r++) ref += in[r * C + j];
      cr_expect(fabs(out[j] - ref) < 1e-6 * (double)R, "[%lld, %lld] column %lld: %g vs %g",
                (long long)R, (long long)C, (long long)j, out[j], ref);
    }
    if (R <= 1024) { // one block: exactly the row-by-row float sum
      for (int64_t j = 0; j < C; j++) {
        float f = 0.0f;
        for (int64_t r = 0; r < R; r++) f += in[r * C + j];
        cr_expect(f == out[j], "one block, column %lld: %a vs %a", (long long)j, out[j], f);
      }
    }
    free(in), free(out);
  }
}

// issue 15: batch norm's statistics (sums in double per block of rows and
// 256 columns), its normalization and gradient: the same bits on 1 and 3
// threads, and the sums against naive ones.
Test(threads, batch_norm_kernels) {
  static const int64_t shapes[][2] = {{100352, 8}, {3000, 300}, {1025, 3}, {128, 10}};
  for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
    const int64_t R = shapes[t][0], C = shapes[t][1];
    size_t n = (size_t)(R * C);
    float *x = rand_buf(n, -3, 3), *dy = rand_buf(n, -1, 1), *m = rand_buf((size_t)C, -1, 1);
    float *v = rand_buf((size_t)C, 0.1f, 2), *g = rand_buf((size_t)C, -1, 1);
    float *b = rand_buf((size_t)C, -1, 1), *s = malloc((size_t)(2 * C) * sizeof(float));
    float *y = malloc(n * sizeof(float));
    for (int kind = 0; kind < 3; kind++) {
      const float *mk = kind ? m : NULL, *dk = kind == 2 ? dy : NULL;
      size_t w = (size_t)(kind == 2 ? 2 * C : C);
      SAME_ON_1_AND_3("bn_stats", s, w, kdrt_bn_stats(s, x, mk, dk, R, C));
      for (int64_t j = 0; j < C; j++) { // within 1e-6 of the sum of the terms' magnitudes
        double r0 = 0, r1 = 0, a0 = 0, a1 = 0;
        for (int64_t r = 0; r < R; r++) {
          double d = kind ? (double)(x[r * C + j] - m[j]) : x[r * C + j];
          double t0 = kind == 0 ? d : kind == 1 ? d * d : dy[r * C + j];
          double t1 = kind == 2 ? dy[r * C + j] * d : 0;
          r0 += t0, r1 += t1, a0 += fabs(t0), a1 += fabs(t1);
        }
        cr_expect(fabs(s[j] - r0) <= 1e-6 * a0, "bn_stats %d [%lld, %lld] %lld: %g vs %g", kind,
                  (long long)R, (long long)C, (long long)j, s[j], r0);
        if (kind == 2)
          cr_expect(fabs(s[C + j] - r1) <= 1e-6 * a1, "bn_stats dy*(x-m) %lld: %g vs %g",
                    (long long)j, s[C + j], r1);
      }
    }
    SAME_ON_1_AND_3("batch_norm", y, n, kdrt_batch_norm(KDRT_ACT_RELU, y, x, m, v, g, b, R, C, 1e-3f));
    for (size_t e = 0; e < n; e += 97) {
      size_t j = e % (size_t)C;
      float inv = 1.0f / sqrtf(v[j] + 1e-3f) * g[j], ref = x[e] * inv + (b[j] - m[j] * inv);
      ref = ref > 0 ? ref : 0;
      cr_expect(fabsf(y[e] - ref) <= 1e-5f * (fabsf(ref) + 1), "batch_norm %zu: %g vs %g", e, y[e], ref);
    }
    SAME_ON_1_AND_3("bn_grad", y, n, kdrt_bn_grad(y, dy, x, m, v, g, s, R, C, 1e-3f, (double)R));
    free(x), free(dy), free(m), free(v), free(g), free(b), free(s), free(y);
  }
}

Test(threads, transpose_reduce_broadcast_blocks) {
  const int64_t shape[4] = {7, 33, 5, 61};
  const int perm[4] = {2, 0, 3, 1};
  const size_t n = 7 * 33 * 5 * 61;
  float *in = rand_buf(n, -1, 1), *out = malloc(n * sizeof(float));
  SAME_ON_1_AND_3("transpose", out, n, kdrt_transpose(out, in, 4, shape, perm));
  for (int64_t a = 0; a < 7; a++) // out[c, a, d, b] = in[a, b, c, d]
    for (int64_t b = 0; b < 33; b++)
      for (int64_t c = 0; c < 5; c++)
        for (int64_t d = 0; d < 61; d++)
          cr_assert_eq(out[((c * 7 + a) * 61 + d) * 33 + b], in[((a * 33 + b) * 5 + c) * 61 + d]);
  // reduce_sum over mid, blocks of inner wider than one thread's piece
  const int64_t O = 3, M = 40, I = 2500;
  float *big = rand_buf((size_t)(O * M * I), -1, 1), *red = malloc((size_t)(O * I) * sizeof(float));
  SAME_ON_1_AND_3("reduce_sum", red, (size_t)(O * I), kdrt_reduce_sum(red, big, O, M, I));
  for (int64_t o = 0; o < O; o++)
    for (int64_t i = 0; i < I; i++) {
      float f = 0.0f;
      for (int64_t m = 0; m < M; m++) f += big[(o * M + m) * I + i];
      cr_assert_eq(red[o * I + i], f, "reduce_sum [%lld, %lld]", (long long)o, (long long)i);
    }
  SAME_ON_1_AND_3("broadcast", big, (size_t)(O * M * I), kdrt_broadcast(big, red, O, M, I));
  float *blk = malloc((size_t)(O * 10 * I) * sizeof(float));
  SAME_ON_1_AND_3("copy_block", blk, (size_t)(O * 10 * I),
                  kdrt_copy_block(blk, big, O, M, 7, 10, I));
  SAME_ON_1_AND_3("place_block", big, (size_t)(O * M * I),
                  kdrt_place_block(big, blk, O, 10, 3, M, I));
  free(in), free(out), free(big), free(red), free(blk);
}

Test(threads, gather_and_scatter_add) {
  enum { V = 50, D = 300, NI = 2000 };
  float *table = rand_buf(V * D, -1, 1), *dy = rand_buf(NI * D, -1, 1);
  float *out = malloc(NI * D * sizeof(float)), *dt = malloc(V * D * sizeof(float));
  int32_t ids[NI];
  for (int i = 0; i < NI; i++) ids[i] = (int32_t)((i * 7919) % 70); // some outside [10, 60)
  SAME_ON_1_AND_3("gather", out, NI * D, kdrt_gather(out, table, ids, NI, V, D, 10));
  SAME_ON_1_AND_3("scatter_add", dt, V * D, kdrt_scatter_add(dt, dy, ids, NI, V, D, 10));
  for (int r = 0; r < V; r++)
    for (int j = 0; j < D; j++) {
      float f = 0.0f;
      for (int i = 0; i < NI; i++)
        if (ids[i] - 10 == r) f += dy[i * D + j];
      cr_assert_eq(dt[r * D + j], f, "scatter_add [%d, %d]", r, j);
    }
  free(table), free(dy), free(out), free(dt);
}

// ---------------------------------------------------------------- matmul

// Products big enough to be cut into blocks, along M and along N, every
// transpose, alpha and beta, a batch with a shared operand: the same bits on
// 1 and 3 threads, and the naive product's values.
Test(threads, matmul_blocks) {
  static const int cases[][6] = { // M N K ta tb batch
      {300, 130, 700, 0, 0, 1}, {130, 300, 700, 1, 0, 1}, {784, 200, 128, 1, 0, 1},
      {128, 784, 200, 0, 1, 1}, {97, 531, 333, 1, 1, 1}, {200, 64, 600, 0, 0, 3}};
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    const int M = cases[t][0], N = cases[t][1], K = cases[t][2], ta = cases[t][3];
    const int tb = cases[t][4], nb = cases[t][5];
    const kdrt_gemm g = {ta ? KDRT_TRANS : KDRT_NOTRANS, tb ? KDRT_TRANS : KDRT_NOTRANS, nb, M, N,
                         K, ta ? M : K, tb ? K : N, N, (int64_t)M * K, 0, (int64_t)M * N};
    float *a = rand_buf((size_t)nb * M * K, -1, 1), *b = rand_buf((size_t)K * N, -1, 1);
    float *c0 = rand_buf((size_t)nb * M * N, -1, 1), *c = malloc((size_t)nb * M * N * sizeof(float));
    SAME_ON_1_AND_3("matmul", c, (size_t)nb * M * N,
                    (memcpy(c, c0, (size_t)nb * M * N * sizeof(float)),
                     kdrt_matmul(&g, 0.5f, a, b, 2.0f, c)));
    for (int i = 0; i < nb; i++)
      for (int m = 0; m < M; m += 7)
        for (int n = 0; n < N; n += 5) {
          double s = 0;
          for (int k = 0; k < K; k++)
            s += (double)a[(size_t)i * M * K + (ta ? (size_t)k * M + m : (size_t)m * K + k)] *
                 b[tb ? (size_t)n * K + k : (size_t)k * N + n];
          double want = 0.5 * s + 2.0 * c0[((size_t)i * M + m) * N + n];
          cr_assert(fabs(c[((size_t)i * M + m) * N + n] - want) < 1e-3,
                    "case %zu [%d, %d, %d]: %g vs %g", t, i, m, n, c[((size_t)i * M + m) * N + n],
                    want);
        }
    free(a), free(b), free(c0), free(c);
  }
}

// ---------------------------------------------------------------- windows, optimizers

Test(threads, conv_and_pool) {
  // the CNN's second conv and pool, on a batch of 32
  const kdrt_window cw = {32, 13, 13, 8, 3, 3, 16, 1, 1, 1, 1, 13, 13, 0, 0, 0};
  const kdrt_window pw = {32, 26, 26, 8, 2, 2, 8, 2, 2, 0, 0, 13, 13, 0, 0, 0};
  const size_t nx = 32 * 13 * 13 * 8, ny = 32 * 13 * 13 * 16, nf = 3 * 3 * 8 * 16;
  float *x = rand_buf(nx, -1, 1), *f = rand_buf(nf, -1, 1), *dy = rand_buf(ny, -1, 1);
  float *y = malloc(ny * sizeof(float)), *dx = malloc(nx * sizeof(float));
  float *dw = malloc(nf * sizeof(float)), *scratch = malloc(ny * 9 * sizeof(float));
  SAME_ON_1_AND_3("conv2d", y, ny, kdrt_conv2d(&cw, y, x, f, scratch));
  SAME_ON_1_AND_3("conv2d_dx", dx, nx, kdrt_conv2d_dx(&cw, dx, dy, f, scratch));
  SAME_ON_1_AND_3("conv2d_dw", dw, nf, kdrt_conv2d_dw(&cw, dw, x, dy, scratch));
  const size_t px = 32 * 26 * 26 * 8, py = 32 * 13 * 13 * 8;
  float *pin = rand_buf(px, -1, 1), *pout = malloc(py * sizeof(float));
  float *pdy = rand_buf(py, -1, 1), *pdx = malloc(px * sizeof(float));
  SAME_ON_1_AND_3("maxpool", pout, py, kdrt_maxpool(&pw, pout, pin));
  SAME_ON_1_AND_3("maxpool_grad", pdx, px, kdrt_maxpool_grad(&pw, pdx, pdy, pin));
  free(x), free(f), free(dy), free(y), free(dx), free(dw), free(scratch);
  free(pin), free(pout), free(pdy), free(pdx);
}

// issue 15: a depthwise conv (MobileNet's, depth multiplier 2) and one of
// 4 groups, strided, as one window each
Test(threads, grouped_conv) {
  const kdrt_window ws[] = {{32, 14, 14, 24, 3, 3, 48, 1, 1, 1, 1, 14, 14, 0, 0, 24},
                            {32, 14, 14, 24, 3, 3, 16, 2, 2, 1, 1, 7, 7, 0, 0, 4}};
  for (int i = 0; i < 2; i++) {
    const kdrt_window *cw = &ws[i];
    const size_t nx = (size_t)cw->B * cw->H * cw->W * cw->C;
    const size_t ny = (size_t)cw->B * cw->OH * cw->OW * cw->K;
    const size_t nf = (size_t)cw->KH * cw->KW * cw->C / cw->groups * cw->K;
    float *x = rand_buf(nx, -1, 1), *f = rand_buf(nf, -1, 1), *dy = rand_buf(ny, -1, 1);
    float *y = malloc(ny * sizeof(float)), *dx = malloc(nx * sizeof(float));
    float *dw = malloc(nf * sizeof(float));
    float *scratch = malloc((size_t)cw->B * cw->OH * cw->OW * 9 * cw->C * sizeof(float));
    SAME_ON_1_AND_3("grouped conv2d", y, ny, kdrt_conv2d(cw, y, x, f, scratch));
    SAME_ON_1_AND_3("grouped conv2d_dx", dx, nx, kdrt_conv2d_dx(cw, dx, dy, f, scratch));
    SAME_ON_1_AND_3("grouped conv2d_dw", dw, nf, kdrt_conv2d_dw(cw, dw, x, dy, scratch));
    free(x), free(f), free(dy), free(y), free(dx), free(dw), free(scratch);
  }
}

Test(threads, optimizers) {
  enum { N = 100003 };
  float *w0 = rand_buf(N, -1, 1), *g = rand_buf(N, -1, 1), *m0 = rand_buf(N, -1, 1);
  float *v0 = rand_buf(N, 0, 1), *w = malloc(N * sizeof(float)), *m = malloc(N * sizeof(float));
  float *v = malloc(N * sizeof(float));
#define FRESH (memcpy(w, w0, N * sizeof(float)), memcpy(m, m0, N * sizeof(float)), \
               memcpy(v, v0, N * sizeof(float)))
  SAME_ON_1_AND_3("sgd", w, N, (FRESH, kdrt_sgd(w, g, m, N, 0.1f, 0.9f, 1)));
  SAME_ON_1_AND_3("adam", w, N, (FRESH, kdrt_adam(w, g, m, v, NULL, N, 0.01f, 0.9f, 0.999f, 1e-7f, 3)));
  SAME_ON_1_AND_3("adamw", w, N,
                  (FRESH, kdrt_adamw(w, g, m, v, NULL, N, 0.01f, 0.9f, 0.999f, 1e-7f, 0.004f, 3)));
  SAME_ON_1_AND_3("rmsprop", w, N, (FRESH, kdrt_rmsprop(w, g, v, m, NULL, N, 0.01f, 0.9f, 0.5f, 1e-7f)));
#undef FRESH
  free(w0), free(g), free(m0), free(v0), free(w), free(m), free(v);
}

// ---------------------------------------------------------------- dropout

// The mask's definition (runtime/rng.c), one element at a time.
static float drop_ref(uint64_t seed, uint64_t stream, int64_t step, uint64_t e, float x,
                      float rate) {
  uint64_t z = stream + 0x9E3779B97F4A7C15ull; // splitmix64(stream)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = seed ^ (z ^ (z >> 31));
  z += 0x9E3779B97F4A7C15ull; // splitmix64(seed ^ splitmix64(stream))
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  uint32_t key[2] = {(uint32_t)z, (uint32_t)(z >> 32)}, w[4];
  uint64_t blk = e >> 2;
  uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)step,
                     (uint32_t)((uint64_t)step >> 32)};
  kdrt_philox4x32(ctr, key, w);
  float u = (float)(w[e & 3] >> 8) * (1.0f / 16777216.0f);
  return u >= rate ? x * (1.0f / (1.0f - rate)) : 0.0f;
}

Test(threads, dropout_mask_is_its_definition_on_any_block_and_thread_count) {
  static const int mesh[2] = {2, 4};
  kdrt_program p;
  memset(&p, 0, sizeof p);
  p.mesh_ndim = 2;
  p.mesh_shape = mesh;
  // [G0, G1] split (data, model), long rows cut in pieces, an odd row
  // length so rows start at every offset within a Philox block
  enum { G0 = 6, G1 = 4 * 2503 };
  const kdrt_layout l = {2, {G0, G1}, {0, 1}};
  const size_t n = (G0 / 2) * (G1 / 4);
  float *x = rand_buf(n, -1, 1), *y = malloc(n * sizeof(float));
  for (int pass = 0; pass < 2; pass++) {
    if (pass) setenv("KDRT_PHILOX", "scalar", 1);
    for (int rank = 0; rank < 8; rank += 3) {
      kdrt_ctx c;
      memset(&c, 0, sizeof c);
      c.prog = &p, c.seed = 1337, c.step = 5 + ((int64_t)1 << 33);
      c.coord[0] = rank / 4, c.coord[1] = rank % 4;
      SAME_ON_1_AND_3("dropout", y, n, kdrt_dropout(&c, y, x, &l, 0.3f, 77));
      for (size_t i = 0; i < n; i++) {
        const int64_t r = (int64_t)i / (G1 / 4), j = (int64_t)i % (G1 / 4);
        const uint64_t e = (uint64_t)((c.coord[0] * (G0 / 2) + r) * G1 + c.coord[1] * (G1 / 4) + j);
        cr_assert_eq(y[i], drop_ref(1337, 77, c.step, e, x[i], 0.3f), "%s rank %d element %zu",
                     pass ? "scalar" : "default", rank, i);
      }
    }
  }
  unsetenv("KDRT_PHILOX");
  free(x), free(y);
}
