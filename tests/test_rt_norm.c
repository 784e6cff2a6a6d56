// Tests for the normalization and attention kernels of runtime/ops.c:
// kdrt_norm against a naive double-precision layer / RMS norm, kdrt_norm_grad
// against central finite differences of kdrt_norm through L = sum(w * y),
// kdrt_col_mul and kdrt_pad_block against loops, kdrt_causal_mask on a
// block of a bigger score matrix (offsets t0, u0) against the whole one;
// issue 24's kdrt_rope against the rotation in double, its inverse as its
// transpose, and by blocks of steps. Issue 25: kdrt_layer_norm, _dx and
// _dw against the chain of kernels they replace, bit for bit.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"

static uint64_t state = 0x2545F4914F6CDD1Dull;

static float frand(void) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return (float)((state >> 40) * (1.0 / 16777216.0)) * 4.0f - 2.0f;
}

static float *rand_buf(size_t n) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = frand();
  return p;
}

enum { R = 5, C = 7 };

static void check_norm(int rms) {
  float eps = 1e-3f, *x = rand_buf(R * C), y[R * C];
  kdrt_norm(rms, y, x, R, C, eps);
  for (int r = 0; r < R; r++) {
    double m = 0, v = 0;
    for (int j = 0; j < C; j++) m += x[r * C + j];
    m = rms ? 0 : m / C;
    for (int j = 0; j < C; j++) v += (x[r * C + j] - m) * (x[r * C + j] - m);
    v /= C;
    for (int j = 0; j < C; j++)
      cr_assert_float_eq(y[r * C + j], (x[r * C + j] - m) / sqrt(v + eps), 1e-5, "rms %d [%d, %d]",
                         rms, r, j);
  }
  free(x);
}

Test(norm, layer_norm_and_rms_norm_against_naive) {
  check_norm(0);
  check_norm(1);
}

static void check_norm_grad(int rms) {
  float eps = 1e-3f, *x = rand_buf(R * C), *w = rand_buf(R * C), dx[R * C], y[R * C];
  kdrt_norm_grad(rms, dx, w, x, R, C, eps); // dy = w
  for (int i = 0; i < R * C; i++) {
    float x0 = x[i], h = 1e-2f;
    double lp = 0, lm = 0;
    x[i] = x0 + h;
    kdrt_norm(rms, y, x, R, C, eps);
    for (int k = 0; k < R * C; k++) lp += (double)w[k] * y[k];
    x[i] = x0 - h;
    kdrt_norm(rms, y, x, R, C, eps);
    for (int k = 0; k < R * C; k++) lm += (double)w[k] * y[k];
    x[i] = x0;
    double num = (lp - lm) / (2.0 * h);
    cr_assert(fabs(num - dx[i]) <= 2e-3 + 2e-2 * fabs(num), "rms %d [%d]: analytic %g numeric %g",
              rms, i, dx[i], num);
  }
  free(x);
  free(w);
}

Test(norm, gradients_against_finite_differences) {
  check_norm_grad(0);
  check_norm_grad(1);
}

Test(norm, col_mul_and_pad_block) {
  float *x = rand_buf(R * C), *g = rand_buf(C), y[R * C];
  kdrt_col_mul(y, x, g, R, C);
  for (int i = 0; i < R * C; i++) cr_assert_eq(y[i], x[i] * g[i % C]);
  // a [2, 3, 4] block placed at offset 2 of dim 1 (extent 6): zeros elsewhere
  float in[2 * 3 * 4], out[2 * 6 * 4];
  for (int i = 0; i < 24; i++) in[i] = (float)(i + 1);
  for (int i = 0; i < 48; i++) out[i] = NAN;
  kdrt_pad_block(out, in, 2, 3, 2, 6, 4);
  for (int o = 0; o < 2; o++)
    for (int i = 0; i < 6; i++)
      for (int k = 0; k < 4; k++) {
        float want = i >= 2 && i < 5 ? in[(o * 3 + i - 2) * 4 + k] : 0.0f;
        cr_assert_eq(out[(o * 6 + i) * 4 + k], want, "[%d, %d, %d]", o, i, k);
      }
  free(x);
  free(g);
}

// A sliding window of 3 (Mistral's, Gemma 2's): a query sees itself and the
// 2 keys before it, whole and as the blocks of a split.
Test(norm, causal_mask_sliding_window) {
  enum { T = 6, U = 6 };
  float *s = rand_buf(T * U), whole[T * U], out[3 * 2];
  kdrt_causal_mask(whole, s, 1, T, U, 0, 0, 3, KDRT_MASKED);
  for (int t = 0; t < T; t++)
    for (int u = 0; u < U; u++)
      cr_assert_eq(whole[t * U + u], u > t || t - u >= 3 ? KDRT_MASKED : s[t * U + u],
                   "[%d, %d]", t, u);
  float in[3 * 2];
  for (int t = 0; t < 3; t++)
    for (int u = 0; u < 2; u++) in[t * 2 + u] = s[(3 + t) * U + u];
  kdrt_causal_mask(out, in, 1, 3, 2, 3, 0, 3, KDRT_MASKED); // queries 3..5, keys 0..1
  for (int t = 0; t < 3; t++)
    for (int u = 0; u < 2; u++)
      cr_assert_eq(out[t * 2 + u], 3 + t - u >= 3 ? KDRT_MASKED : in[t * 2 + u], "[%d, %d]", t, u);
  free(s);
}

// The whole [2, 6, 6] mask, and each (3 x 2) block of a 2 x 3 split of it.
Test(norm, causal_mask_by_blocks) {
  enum { O = 2, T = 6, U = 6 };
  float *s = rand_buf(O * T * U), whole[O * T * U];
  kdrt_causal_mask(whole, s, O, T, U, 0, 0, 0, KDRT_MASKED);
  for (int o = 0; o < O; o++)
    for (int t = 0; t < T; t++)
      for (int u = 0; u < U; u++) {
        int k = (o * T + t) * U + u;
        cr_assert_eq(whole[k], u > t ? KDRT_MASKED : s[k]);
      }
  for (int bt = 0; bt < 2; bt++)
    for (int bu = 0; bu < 3; bu++) {
      float in[O * 3 * 2], out[O * 3 * 2];
      for (int o = 0; o < O; o++)
        for (int t = 0; t < 3; t++)
          for (int u = 0; u < 2; u++) in[(o * 3 + t) * 2 + u] = s[(o * T + bt * 3 + t) * U + bu * 2 + u];
      kdrt_causal_mask(out, in, O, 3, 2, bt * 3, bu * 2, 0, 0.0f);
      for (int o = 0; o < O; o++)
        for (int t = 0; t < 3; t++)
          for (int u = 0; u < 2; u++) {
            int gt = bt * 3 + t, gu = bu * 2 + u;
            cr_assert_eq(out[(o * 3 + t) * 2 + u], gu > gt ? 0.0f : in[(o * 3 + t) * 2 + u],
                         "block (%d, %d) [%d, %d, %d]", bt, bu, o, t, u);
          }
    }
  free(s);
}

// issue 24: x[B, T, H, 2h] turned pair by pair: (x[j], x[j + h]) by the
// angle pos * f[j] at global position pos = t0 + t, cos and sin times the
// scale; the inverse is the transpose (<R x, g> = <x, R^T g>) and undoes
// it; a block of steps at its offset gives the whole's rows bit for bit,
// in place too.
Test(norm, rope_against_the_rotation) {
  enum { B = 2, T = 6, H = 3, W = 8, N = B * T * H * W };
  kdrt_rotary r = {.half = W / 2, .scale = 1.25f};
  for (int j = 0; j < W / 2; j++) r.inv_freq[j] = powf(10000.0f, -2.0f * j / W);
  float *x = rand_buf(N), *g = rand_buf(N), y[N], back[N], rg[N];
  const int64_t t0 = 37;
  kdrt_rope(y, x, &r, B, T, H, t0, 0);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int k = 0; k < H; k++)
        for (int j = 0; j < W / 2; j++) {
          int e = ((b * T + t) * H + k) * W + j;
          float a = (float)(t0 + t) * r.inv_freq[j];
          double c = cos((double)a) * 1.25, s = sin((double)a) * 1.25;
          double y0 = x[e] * c - x[e + W / 2] * s, y1 = x[e + W / 2] * c + x[e] * s;
          cr_assert_float_eq(y[e], y0, 1e-5, "[%d, %d, %d, %d]", b, t, k, j);
          cr_assert_float_eq(y[e + W / 2], y1, 1e-5, "[%d, %d, %d, %d + h]", b, t, k, j);
        }
  kdrt_rope(back, y, &r, B, T, H, t0, 1);
  kdrt_rope(rg, g, &r, B, T, H, t0, 1);
  double lhs = 0, rhs = 0;
  for (int i = 0; i < N; i++) {
    cr_assert_float_eq(back[i], x[i] * 1.5625f, 1e-5, "inverse after forward [%d]", i);
    lhs += (double)y[i] * g[i];
    rhs += (double)x[i] * rg[i];
  }
  cr_assert_float_eq(lhs, rhs, 1e-4, "the transpose: %g vs %g", lhs, rhs);
  // steps [2, 5) alone, at position t0 + 2, in place
  float blk[B * 3 * H * W];
  for (int b = 0; b < B; b++)
    memcpy(blk + b * 3 * H * W, x + (b * T + 2) * H * W, sizeof(float) * 3 * H * W);
  kdrt_rope(blk, blk, &r, B, 3, H, t0 + 2, 0);
  for (int b = 0; b < B; b++)
    for (int i = 0; i < 3 * H * W; i++)
      cr_assert_eq(blk[b * 3 * H * W + i], y[(b * T + 2) * H * W + i], "block [%d, %d]", b, i);
  free(x);
  free(g);
}

// issue 25: one pass each way, the same bits as the chain kdcc fuses
// (fuse.c's fuse_layer_norm): norm, col_mul, bias_act LINEAR; col_mul,
// norm_grad; bias_grad of mul(dy, norm(x)) and of dy. Shapes: one block of
// rows, many blocks of few columns (kdrt_bias_grad's partial sums), wide
// rows.
static void check_layer_norm_chain(int rms, int64_t rows, int64_t cols) {
  size_t n = (size_t)(rows * cols);
  float eps = 1e-3f, *x = rand_buf(n), *dy = rand_buf(n), *g = rand_buf((size_t)cols);
  float *b = rand_buf((size_t)cols), *h = malloc(n * sizeof *h), *t = malloc(n * sizeof *t);
  float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
  float *w2 = malloc(2 * (size_t)cols * sizeof *w2), *g2 = malloc(2 * (size_t)cols * sizeof *g2);
  for (size_t i = 0; i < n; i++) x[i] += 1.5f; // off zero: the mean matters
  kdrt_norm(rms, h, x, rows, cols, eps);
  kdrt_col_mul(t, h, g, rows, cols);
  kdrt_bias_act(KDRT_ACT_LINEAR, want, t, b, rows, cols);
  kdrt_layer_norm(rms, got, x, g, b, rows, cols, eps);
  cr_assert(!memcmp(want, got, n * sizeof *got), "layer_norm rms %d [%lld, %lld]", rms,
            (long long)rows, (long long)cols);
  kdrt_col_mul(t, dy, g, rows, cols);
  kdrt_norm_grad(rms, want, t, x, rows, cols, eps);
  kdrt_layer_norm_dx(rms, got, dy, x, g, rows, cols, eps);
  cr_assert(!memcmp(want, got, n * sizeof *got), "layer_norm_dx rms %d [%lld, %lld]", rms,
            (long long)rows, (long long)cols);
  kdrt_mul(t, dy, h, n);
  kdrt_bias_grad(w2, t, rows, cols);
  kdrt_bias_grad(w2 + cols, dy, rows, cols);
  kdrt_layer_norm_dw(rms, g2, g2 + cols, dy, x, rows, cols, eps);
  cr_assert(!memcmp(w2, g2, 2 * (size_t)cols * sizeof *g2), "layer_norm_dw rms %d [%lld, %lld]",
            rms, (long long)rows, (long long)cols);
  kdrt_layer_norm_dw(rms, g2, NULL, dy, x, rows, cols, eps);
  cr_assert(!memcmp(w2, g2, (size_t)cols * sizeof *g2), "layer_norm_dw (d g alone)");
  free(x), free(dy), free(g), free(b), free(h), free(t), free(want), free(got), free(w2), free(g2);
}

Test(norm, layer_norm_ops_are_the_chain_bit_for_bit) {
  for (int rms = 0; rms < 2; rms++) {
    check_layer_norm_chain(rms, 37, 67);
    check_layer_norm_chain(rms, 2500, 24);
    check_layer_norm_chain(rms, 64, 768);
  }
}
