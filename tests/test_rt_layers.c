// Tests for issue 11's kernels and activations: every activation added to
// kdrt_defs.h's KDRT_ACT_LIST against values from Keras 3 on JAX
// (keras.activations.NAME and jax.grad of it, at the points below), and
// each derivative against central finite differences away from kinks.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"

// ---------------------------------------------------------------- activations

enum { NP = 9 };
static const float xs[NP] = {-4, -3, -1, -0.5f, 0.5f, 1, 2.5f, 5, 7};

typedef struct {
  const char *name;
  float y[NP], dy[NP];
} act_ref;

// keras.activations.NAME(xs) and jax.vmap(jax.grad(NAME))(xs), Keras 3.15.1
// on JAX 0.10.2 (relu6 and hard_sigmoid: JAX's derivative is 0 at the kinks).
static const act_ref refs[] = {
  {"elu", {-0.981684387f, -0.950212955f, -0.63212055f, -0.393469334f, 0.5f, 1.0f, 2.5f, 5.0f, 7.0f}, {0.0183156133f, 0.0497870445f, 0.36787945f, 0.606530666f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}},
  {"selu", {-1.72589874f, -1.67056882f, -1.11133075f, -0.691758215f, 0.525350511f, 1.05070102f, 2.62675261f, 5.25350523f, 7.35490704f}, {0.032200668f, 0.0875305682f, 0.64676863f, 1.06634116f, 1.05070102f, 1.05070102f, 1.05070102f, 1.05070102f, 1.05070102f}},
  {"softplus", {0.0181499291f, 0.048587352f, 0.313261688f, 0.474076986f, 0.974076986f, 1.31326175f, 2.57888985f, 5.0067153f, 7.00091124f}, {0.0179862119f, 0.0474258736f, 0.268941402f, 0.377540678f, 0.622459352f, 0.731058538f, 0.924141705f, 0.993307173f, 0.999089181f}},
  {"softsign", {-0.800000012f, -0.75f, -0.5f, -0.333333343f, 0.333333343f, 0.5f, 0.714285731f, 0.833333313f, 0.875f}, {0.0400000066f, 0.0625f, 0.25f, 0.444444478f, 0.444444478f, 0.25f, 0.0816326737f, 0.0277777761f, 0.015625f}},
  {"hard_sigmoid", {0.0f, 0.0f, 0.333333343f, 0.416666687f, 0.583333373f, 0.666666687f, 0.916666687f, 1.0f, 1.0f}, {0.0f, 0.0f, 0.166666672f, 0.166666672f, 0.166666672f, 0.166666672f, 0.166666672f, 0.0f, 0.0f}},
  {"hard_silu", {-0.0f, -0.0f, -0.333333343f, -0.208333343f, 0.291666687f, 0.666666687f, 2.29166675f, 5.0f, 7.0f}, {0.0f, 0.0f, 0.166666672f, 0.333333343f, 0.666666687f, 0.833333373f, 1.33333337f, 1.0f, 1.0f}},
  {"exponential", {0.0183156393f, 0.0497870669f, 0.36787945f, 0.606530666f, 1.64872122f, 2.71828175f, 12.1824942f, 148.413162f, 1096.63318f}, {0.0183156393f, 0.0497870669f, 0.36787945f, 0.606530666f, 1.64872122f, 2.71828175f, 12.1824942f, 148.413162f, 1096.63318f}},
  {"leaky_relu", {-0.800000012f, -0.600000024f, -0.200000003f, -0.100000001f, 0.5f, 1.0f, 2.5f, 5.0f, 7.0f}, {0.200000003f, 0.200000003f, 0.200000003f, 0.200000003f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}},
  {"relu6", {0.0f, 0.0f, 0.0f, 0.0f, 0.5f, 1.0f, 2.5f, 5.0f, 6.0f}, {0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.0f}},
  {"mish", {-0.0725917369f, -0.145647451f, -0.30340144f, -0.220743775f, 0.375245243f, 0.865098476f, 2.47139239f, 4.99955225f, 6.99998903f}, {-0.0537732132f, -0.0933931321f, 0.0592167526f, 0.289510667f, 0.886424422f, 1.04903615f, 1.04112935f, 1.00079966f, 1.00002015f}},
  // issue 10: keras.activations.gelu(x, approximate=True)
  {"gelu_approximate", {-7.00950623e-05f, -0.00363734365f, -0.158807963f, -0.154285997f, 0.345714003f, 0.841192007f, 2.48491573f, 5.0f, 7.0f}, {-0.000334409531f, -0.0115839057f, -0.0829640701f, 0.13263011f, 0.86736995f, 1.08296394f, 1.03795171f, 1.0f, 1.0f}},
  {"linear", {-4.0f, -3.0f, -1.0f, -0.5f, 0.5f, 1.0f, 2.5f, 5.0f, 7.0f}, {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}},
};

static int act_of(const char *name) {
#define KDRT_X(nm, kname, fx, f, df) if (!strcmp(name, kname)) return KDRT_ACT_##nm;
  KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
  return -1;
}

static int act_needs_x(int act) {
  static const int fx[] = {
#define KDRT_X(nm, kname, from_x, f, df) from_x,
    KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
  };
  return fx[act];
}

Test(act, keras_values_and_derivatives) {
  for (size_t r = 0; r < sizeof refs / sizeof *refs; r++) {
    int act = act_of(refs[r].name);
    cr_assert(act >= 0, "%s is not in KDRT_ACT_LIST", refs[r].name);
    float y[NP], dx[NP], ones[NP];
    for (int i = 0; i < NP; i++) ones[i] = 1;
    kdrt_act(act, y, xs, NP);
    // the derivative as the compiler calls it: x for FROM_X, else y alone
    kdrt_act_grad(act, dx, ones, act_needs_x(act) ? xs : NULL, act_needs_x(act) ? NULL : y, NP);
    for (int i = 0; i < NP; i++) {
      float ty = refs[r].y[i], td = refs[r].dy[i];
      cr_expect(fabsf(y[i] - ty) <= 1e-6f + 1e-6f * fabsf(ty), "%s(%g) = %.9g, Keras %.9g",
                refs[r].name, xs[i], y[i], ty);
      cr_expect(fabsf(dx[i] - td) <= 1e-6f + 1e-6f * fabsf(td), "%s'(%g) = %.9g, JAX %.9g",
                refs[r].name, xs[i], dx[i], td);
    }
  }
}

// Central differences in double around points that avoid every kink (0, +-3, 6).
Test(act, derivatives_match_finite_differences) {
  static const float pts[] = {-5.3f, -2.7f, -1.1f, -0.4f, -0.05f, 0.07f, 0.6f, 1.9f, 2.8f, 4.4f, 6.3f};
  enum { N = sizeof pts / sizeof *pts };
  for (int act = 0; act < KDRT_ACT_COUNT; act++) {
    float y[N], dx[N], ones[N];
    for (int i = 0; i < N; i++) ones[i] = 1;
    kdrt_act(act, y, pts, N);
    kdrt_act_grad(act, dx, ones, act_needs_x(act) ? pts : NULL, act_needs_x(act) ? NULL : y, N);
    for (int i = 0; i < N; i++) {
      if ((act == KDRT_ACT_RSQRT || act == KDRT_ACT_SQRT) && pts[i] <= 0) continue; // v > 0 only
      float h = 1e-3f, xp = pts[i] + h, xm = pts[i] - h, yp, ym;
      kdrt_act(act, &yp, &xp, 1);
      kdrt_act(act, &ym, &xm, 1);
      double fd = ((double)yp - ym) / ((double)xp - xm);
      cr_expect(fabs(dx[i] - fd) <= 2e-3 * (1 + fabs(fd)), "act %d at %g: derivative %g, "
                "finite differences %g", act, pts[i], dx[i], fd);
    }
  }
}

Test(act, nan_stays_nan) {
  float x = NAN, y;
  for (int act = 0; act < KDRT_ACT_COUNT; act++) {
    kdrt_act(act, &y, &x, 1);
    cr_expect(isnan(y), "act %d: NaN in, %g out", act, y);
  }
}

Test(act, rsqrt_is_batch_norms_inverse_deviation) {
  float x[3] = {0.25f, 1.0f, 4.0f}, y[3], dx[3], ones[3] = {1, 1, 1};
  kdrt_act(KDRT_ACT_RSQRT, y, x, 3);
  kdrt_act_grad(KDRT_ACT_RSQRT, dx, ones, NULL, y, 3);
  float ty[3] = {2.0f, 1.0f, 0.5f}, td[3] = {-4.0f, -0.5f, -0.0625f};
  for (int i = 0; i < 3; i++) {
    cr_expect_float_eq(y[i], ty[i], 1e-7f, "rsqrt(%g) = %g", x[i], y[i]);
    cr_expect_float_eq(dx[i], td[i], 1e-6f, "rsqrt'(%g) = %g", x[i], dx[i]);
  }
}

// The L1 regularizer's |w|: JAX's derivative is select(w >= 0, 1, -1), so 1 at 0.
Test(act, abs_is_jaxs_at_zero) {
  float x[3] = {-2.0f, 0.0f, 3.0f}, y[3], dx[3], ones[3] = {1, 1, 1};
  kdrt_act(KDRT_ACT_ABS, y, x, 3);
  kdrt_act_grad(KDRT_ACT_ABS, dx, ones, x, NULL, 3);
  float ty[3] = {2.0f, 0.0f, 3.0f}, td[3] = {-1.0f, 1.0f, 1.0f};
  for (int i = 0; i < 3; i++) {
    cr_expect_float_eq(y[i], ty[i], 0.0f, "abs(%g) = %g", x[i], y[i]);
    cr_expect_float_eq(dx[i], td[i], 0.0f, "abs'(%g) = %g", x[i], dx[i]);
  }
}

// ---------------------------------------------------------------- ema

Test(ema, keras_moving_average) {
  // Keras: moving * momentum + stat * (1 - momentum), each product in float32
  float w[4] = {0, 1, -2, 3.5f}, x[4] = {1, 0.5f, 4, -1};
  double m = 0.99;
  float rest = (float)(1.0 - m), ref[4];
  for (int i = 0; i < 4; i++) ref[i] = w[i] * (float)m + x[i] * rest;
  kdrt_ema(w, x, 4, (float)m, rest);
  for (int i = 0; i < 4; i++) cr_expect_eq(w[i], ref[i], "w[%d] = %.9g, want %.9g", i, w[i], ref[i]);
  cr_expect_float_eq(w[0], 0.01f, 1e-8f);
}

// issue 10: an attention_mask [outer, inner] over scores [outer, heads,
// inner]: a zero (int32 or float) masks that position in every head.
Test(attention_mask, zeros_mask_every_head) {
  const float x[2 * 3 * 2] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const int32_t mi[2 * 2] = {1, 0, 0, 5};
  const float mf[2 * 2] = {0.5f, 0, 0, -1};
  float yi[12], yf[12];
  kdrt_attention_mask(yi, x, mi, 1, 2, 3, 2, 2, -9);
  kdrt_attention_mask(yf, x, mf, 0, 2, 3, 2, 2, -9);
  const float want[12] = {1, -9, 3, -9, 5, -9, -9, 8, -9, 10, -9, 12};
  for (int i = 0; i < 12; i++) {
    cr_expect_eq(yi[i], want[i], "int32 mask [%d]: %g", i, yi[i]);
    cr_expect_eq(yf[i], want[i], "float mask [%d]: %g", i, yf[i]);
  }
}

// A padding mask over the keys (keras-hub's padding_mask): scores [outer 2,
// heads 1, 2 queries x 3 keys], the mask [2, 3]: every query of a sample
// loses the same keys.
Test(attention_mask, padding_mask_over_keys) {
  const float x[2 * 6] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const int32_t m[2 * 3] = {1, 1, 0, 1, 0, 0};
  float y[12];
  kdrt_attention_mask(y, x, m, 1, 2, 1, 6, 3, -9);
  const float want[12] = {1, 2, -9, 4, 5, -9, 7, -9, -9, 10, -9, -9};
  for (int i = 0; i < 12; i++) cr_expect_eq(y[i], want[i], "[%d]: %g", i, y[i]);
}

// ---------------------------------------------------------------- clip_norm

// A weight constraint's scale from a sum of squares: MaxNorm(2) leaves a
// norm under 2 (almost) alone and brings 5 down to 2; UnitNorm makes it 1;
// MinMaxNorm(1, 2, rate 0.5) moves a norm of 4 half way to 2.
Test(clip_norm, keras_norm_constraints) {
  float s[3] = {1.0f, 25.0f, 16.0f}, f[3];
  kdrt_clip_norm(f, s, 2, 0.0f, 2.0f, 1.0f, 0.0f);
  cr_expect_float_eq(f[0], 1.0f / (1e-7f + 1.0f), 1e-7f, "MaxNorm under the limit: %g", f[0]);
  cr_expect_float_eq(f[1] * 5.0f, 2.0f, 1e-6f, "MaxNorm over the limit: %g", f[1]);
  kdrt_clip_norm(f, s + 1, 1, 1.0f, 1.0f, 1.0f, 0.0f);
  cr_expect_float_eq(f[0] * 5.0f, 1.0f, 1e-6f, "UnitNorm: %g", f[0]);
  kdrt_clip_norm(f, s + 2, 1, 1.0f, 2.0f, 0.5f, 0.5f);
  cr_expect_float_eq(f[0] * 4.0f, 3.0f, 1e-6f, "MinMaxNorm: %g", f[0]);
}

// ---------------------------------------------------------------- maximum

// Maximum and Minimum as jax.numpy's: NaN wins, and the gradient of a tie
// is shared (jax.grad of jnp.maximum(a, b) at a == b is 0.5 for each).
Test(maximum, values_and_jaxs_tie_gradient) {
  float a[4] = {1, 2, 3, NAN}, b[4] = {1, 1, 4, 0}, dy[4] = {2, 2, 2, 2}, y[4], dx[4];
  kdrt_maximum(y, a, b, 0, 0, 4);
  cr_expect(y[0] == 1 && y[1] == 2 && y[2] == 4 && isnan(y[3]));
  kdrt_maximum(y, a, b, 0, 1, 4);
  cr_expect(y[0] == 1 && y[1] == 1 && y[2] == 3 && isnan(y[3]));
  kdrt_maximum_grad(dx, dy, a, b, 0, 0, 4);
  cr_expect(dx[0] == 1 && dx[1] == 2 && dx[2] == 0 && dx[3] == 0, "%g %g %g %g", dx[0], dx[1],
            dx[2], dx[3]);
  kdrt_maximum_grad(dx, dy, b, a, 0, 1, 4); // d min / d b
  cr_expect(dx[0] == 1 && dx[1] == 2 && dx[2] == 0 && dx[3] == 0);
  kdrt_maximum(y, a, NULL, 2.5f, 1, 3); // a clamp by a constant
  cr_expect(y[0] == 1 && y[1] == 2 && y[2] == 2.5f);
}
