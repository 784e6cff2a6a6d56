// norm.c: the normalizations on one rank's local rows: layer and RMS
// normalization and their gradients, batch normalization (issue 15: its
// statistics, the normalization fused with an activation, the gradient),
// and the column scale col_mul. Apart from ops.c's kernels because their
// formulas are kdrt_norm.h's, shared with the CUDA runtime's
// cuda/norm.cu. Threads: ops.c's header comment; the sums over rows are
// taken in blocks of KD_SUM_BLOCK rows, as kdrt_bias_grad's.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kdrt.h"
#include "vmath.h"
#include "kdrt_norm.h"
#include "ops_impl.h"

// ---------------------------------------------------------------- normalization

void kdrt_col_mul(float *out, const float *in, const float *g, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) out[r * cols + j] = in[r * cols + j] * g[j];
}

// The statistics of one row: its mean (0 for rms) and 1 / sqrt(var + eps),
// var being the mean square about the mean (rms: about 0), in double.
static void row_stats(int rms, const float *x, int64_t cols, float eps, double *mean,
                      double *rstd) {
  double m = 0;
  if (!rms) {
    for (int64_t j = 0; j < cols; j++) m += x[j];
    m /= (double)cols;
  }
  double v = 0;
  for (int64_t j = 0; j < cols; j++) v += kdrt_norm_dev2(x[j], m);
  *mean = m;
  *rstd = kdrt_norm_rstd(v, cols, eps);
}

// Keras's LayerNormalization in one pass: each element as the chain of
// norm, col_mul by g and bias_act by b computed it (h = the norm's float,
// h * g rounded, then + b), so the numbers are that chain's; _rnd: y
// rounded to rnd as it is stored.
void kdrt_layer_norm_rnd(int rnd, int rms, float *y, const float *x, const float *g,
                         const float *b, int64_t rows, int64_t cols, float eps) {
  KD_ROUNDED(rnd, { // (a loop for each rounding)
    KD_PAR_FOR(rows * cols) // rows are independent: the same bits on any thread count
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * cols;
      float *yr = y + r * cols;
      double m, s;
      row_stats(rms, xr, cols, eps, &m, &s);
      for (int64_t j = 0; j < cols; j++) {
        float h = kdrt_norm_y(xr[j], m, s);
        if (g) h = h * g[j];
        if (b) h = h + b[j];
        yr[j] = kdrt_round_opt(R, h);
      }
    }
  });
}

void kdrt_layer_norm(int rms, float *y, const float *x, const float *g, const float *b,
                     int64_t rows, int64_t cols, float eps) {
  kdrt_layer_norm_rnd(KDRT_ROUND_NONE, rms, y, x, g, b, rows, cols, eps);
}

void kdrt_norm(int rms, float *y, const float *x, int64_t rows, int64_t cols, float eps) {
  kdrt_layer_norm(rms, y, x, NULL, NULL, rows, cols, eps);
}

// With h = (x - mean) * rstd (rms: x * rstd), y = h: dx = rstd * (dy -
// mean(dy) - h * mean(dy * h)), the mean(dy) term only for layer norm.
// With g, dy is first dy * g rounded to float (col_mul's gradient).
void kdrt_layer_norm_dx(int rms, float *dx, const float *dy, const float *x, const float *g,
                        int64_t rows, int64_t cols, float eps) {
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols, *gr = dy + r * cols;
    double m, s, sum_g = 0, sum_gh = 0;
    row_stats(rms, xr, cols, eps, &m, &s);
    for (int64_t j = 0; j < cols; j++) {
      float d = g ? gr[j] * g[j] : gr[j];
      sum_g += d;
      sum_gh += kdrt_norm_gh(d, xr[j], m, s);
    }
    double mg = rms ? 0 : sum_g / (double)cols, mgh = sum_gh / (double)cols;
    for (int64_t j = 0; j < cols; j++) {
      float d = g ? gr[j] * g[j] : gr[j];
      dx[r * cols + j] = kdrt_norm_dx(d, xr[j], m, s, mg, mgh);
    }
  }
}

void kdrt_norm_grad(int rms, float *dx, const float *dy, const float *x, int64_t rows,
                    int64_t cols, float eps) {
  kdrt_layer_norm_dx(rms, dx, dy, x, NULL, rows, cols, eps);
}

typedef struct {
  const float *dy, *x;
  const double *st; // each row's mean and rstd; NULL: dg not wanted
  int64_t cols;
} LnRows;

// acc[j] += dy * h (dg's sums) and acc[stride + j] += dy (db's) over rows
// [r0, r1) in row order, for columns [j0, j0 + n): h = norm(x) from the
// row's statistics st[2 r], st[2 r + 1]; the product rounded to float (the
// chain's mul).
static void add_ln_rows(const void *ctx, float *restrict acc, int64_t stride, int64_t r0,
                        int64_t r1, int64_t j0, int64_t n) {
  const LnRows *m = ctx;
  float *restrict dg = acc, *restrict db = acc + stride;
  for (int64_t r = r0; r < r1; r++) {
    const float *gr = m->dy + r * m->cols + j0, *xr = m->x + r * m->cols + j0;
    if (m->st)
      for (int64_t j = 0; j < n; j++) {
        float p = gr[j] * kdrt_norm_y(xr[j], m->st[2 * r], m->st[2 * r + 1]);
        dg[j] += p;
      }
    for (int64_t j = 0; j < n; j++) db[j] += gr[j];
  }
}

// The sums of kdrt_bias_grad (kd_col_sums's blocks and order) of dy * h and
// dy at once: the chain's bias_grad of mul(dy, norm(x)) and of dy.
void kdrt_layer_norm_dw(int rms, float *dg, float *db, const float *dy, const float *x,
                        int64_t rows, int64_t cols, float eps) {
  double *st = NULL; // each row's mean and rstd
  if (dg && rows > 0) {
    st = malloc((size_t)(2 * rows) * sizeof *st);
    if (!st)
      bad_call("kdrt_layer_norm_dw", "out of memory");
    KD_PAR_FOR(rows * cols)
    for (int64_t r = 0; r < rows; r++)
      row_stats(rms, x + r * cols, cols, eps, &st[2 * r], &st[2 * r + 1]);
  }
  float *out[2] = {dg, db};
  kd_col_sums(out, 2, add_ln_rows, &(LnRows){dy, x, st, cols}, rows, cols,
              "kdrt_layer_norm_dw");
  free(st);
}

// issue 15: batch normalization, each of its passes one loop over the
// activations (before, a dozen REDUCE_SUM, BROADCAST, ADD and MUL passes).
// The sums are taken per block of KD_SUM_BLOCK rows and per 256 columns,
// in double, and the blocks added in block order: the same bits for any
// thread count.
void kdrt_bn_stats(float *out, const float *x, const float *m, const float *dy, int64_t rows,
                   int64_t cols) {
  const int64_t CB = 256, nblk = (rows + KD_SUM_BLOCK - 1) / KD_SUM_BLOCK;
  const int64_t ncb = (cols + CB - 1) / CB, w = dy ? 2 * cols : cols;
  if (rows <= 0 || cols <= 0) {
    for (int64_t j = 0; j < w; j++) out[j] = 0.0f;
    return;
  }
  double *part = calloc((size_t)(nblk * w), sizeof *part);
  if (!part)
    bad_call("kdrt_bn_stats", "out of memory");
  KD_PRAGMA(omp parallel for collapse(2) schedule(static) if (rows * cols >= KD_PAR_MIN))
  for (int64_t k = 0; k < nblk; k++)
    for (int64_t c0 = 0; c0 < ncb; c0++) {
      const int64_t r1 = (k + 1) * KD_SUM_BLOCK < rows ? (k + 1) * KD_SUM_BLOCK : rows;
      const int64_t j0 = c0 * CB, j1 = j0 + CB < cols ? j0 + CB : cols;
      double *restrict p = part + k * w;
      for (int64_t r = k * KD_SUM_BLOCK; r < r1; r++) {
        const float *restrict xr = x + r * cols;
        if (!m) {
          for (int64_t j = j0; j < j1; j++) p[j] += xr[j];
        } else if (!dy) {
          for (int64_t j = j0; j < j1; j++) {
            float d = xr[j] - m[j];
            p[j] += (double)d * d;
          }
        } else {
          const float *restrict gr = dy + r * cols;
          for (int64_t j = j0; j < j1; j++) {
            p[j] += gr[j];
            p[cols + j] += (double)gr[j] * (xr[j] - m[j]);
          }
        }
      }
    }
  for (int64_t j = 0; j < w; j++) {
    double t = 0;
    for (int64_t k = 0; k < nblk; k++) t += part[k * w + j];
    out[j] = (float)t;
  }
  free(part);
}

void kdrt_batch_norm(int act, float *y, const float *x, const float *m, const float *var,
                     const float *g, const float *b, int64_t rows, int64_t cols, float eps) {
  float *inv = malloc((size_t)(2 * cols) * sizeof *inv), *res = inv + cols;
  if (!inv)
    bad_call("kdrt_batch_norm", "out of memory");
  for (int64_t j = 0; j < cols; j++) {
    inv[j] = kdrt_bn_scale(var[j], eps, g[j]);
    res[j] = kdrt_bn_shift(m[j], inv[j], b[j]);
  }
  int known = col_affine_act(KDRT_ROUND_NONE, act, y, x, inv, res, rows, cols);
  free(inv);
  if (!known)
    bad_call("kdrt_batch_norm", "unknown activation");
}

void kdrt_bn_grad(float *dx, const float *dy, const float *x, const float *m, const float *v,
                  const float *g, const float *s, int64_t rows, int64_t cols, float eps,
                  double n) {
  float *k = malloc((size_t)(3 * cols) * sizeof *k), *a = k + cols, *c = a + cols;
  if (!k)
    bad_call("kdrt_bn_grad", "out of memory");
  for (int64_t j = 0; j < cols; j++)
    kdrt_bn_grad_coef(v[j], eps, g[j], s[j], s[cols + j], n, &k[j], &a[j], &c[j]);
  KD_PAR_FOR(rows * cols)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols, *gr = dy + r * cols;
    float *dr = dx + r * cols;
    for (int64_t j = 0; j < cols; j++)
      dr[j] = kdrt_bn_dx(gr[j], xr[j], m[j], k[j], a[j], c[j]);
  }
  free(k);
}
