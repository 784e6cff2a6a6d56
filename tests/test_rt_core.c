// test_rt_core: the runtime pieces that need no MPI peers.
//
// - rng.c: Philox-4x32-10 against the Random123 known-answer vectors; the
//   uniform and normal draws; every initializer's range and spread; and the
//   property the whole design rests on: a tensor initialised (or dropped
//   out) block by block on a (2,4) or (4,2) mesh equals, bit for bit, the
//   same tensor made on one device.
// - kdrt.c: option parsing (values, both spellings, the errors), .npy
//   headers, the per-epoch shuffle, synthetic samples and the exact text of
//   Keras's progress line.
// A fake program with only a mesh stands in for a generated one; no call
// here touches MPI.
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"

// ------------------------------------------------------------ fixtures

static kdrt_program fake_prog(int nd, const int *shape) {
  kdrt_program p;
  memset(&p, 0, sizeof p);
  p.mesh_ndim = nd;
  p.mesh_shape = shape;
  return p;
}

// A ctx for the rank at `rank` of the program's mesh (row-major).
static kdrt_ctx fake_ctx(const kdrt_program *p, int rank, uint64_t seed) {
  kdrt_ctx c;
  memset(&c, 0, sizeof c);
  c.prog = p;
  c.rank = rank;
  c.seed = seed;
  for (int a = p->mesh_ndim - 1; a >= 0; a--) c.coord[a] = rank % p->mesh_shape[a], rank /= p->mesh_shape[a];
  return c;
}

static int world_of(const kdrt_program *p) {
  int n = 1;
  for (int a = 0; a < p->mesh_ndim; a++) n *= p->mesh_shape[a];
  return n;
}

// The global tensor of layout gl (any axes ignored), made on one device.
static void fill_global(float *g, const kdrt_layout *gl, kdrt_init_kind kind, uint64_t stream) {
  static const int one[1] = {1};
  kdrt_program p = fake_prog(1, one);
  kdrt_ctx c = fake_ctx(&p, 0, 1337);
  kdrt_layout l = *gl;
  for (int d = 0; d < l.rank; d++) l.axis[d] = -1;
  kdrt_init_fill(&c, g, &l, kind, 48, 10, 0.5f, 2.0f, stream);
}

// Check every rank's block of layout l on mesh against the global tensor.
static void check_blocks(const int *mesh, int nd, const kdrt_layout *l, const float *global,
                         kdrt_init_kind kind, uint64_t stream) {
  kdrt_program p = fake_prog(nd, mesh);
  float block[4096];
  for (int r = 0; r < world_of(&p); r++) {
    kdrt_ctx c = fake_ctx(&p, r, 1337);
    kdrt_init_fill(&c, block, l, kind, 48, 10, 0.5f, 2.0f, stream);
    // Walk the local block and compare with the global element.
    int64_t lext[KDRT_MAX_RANK], off[KDRT_MAX_RANK], idx[KDRT_MAX_RANK] = {0};
    int64_t n = 1;
    for (int d = 0; d < l->rank; d++) {
      int ax = l->axis[d];
      lext[d] = l->gshape[d] / (ax >= 0 ? mesh[ax] : 1);
      off[d] = ax >= 0 ? c.coord[ax] * lext[d] : 0;
      n *= lext[d];
    }
    for (int64_t i = 0; i < n; i++) {
      int64_t g = 0;
      for (int d = 0; d < l->rank; d++) g = g * l->gshape[d] + off[d] + idx[d];
      cr_assert_eq(block[i], global[g], "rank %d local %lld: %g != global[%lld] %g", r,
                   (long long)i, block[i], (long long)g, global[g]);
      for (int d = l->rank - 1; d >= 0; d--) {
        if (++idx[d] < lext[d]) break;
        idx[d] = 0;
      }
    }
  }
}

// ------------------------------------------------------------ Philox

Test(rng, philox_known_answers) {
  static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                     {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                     {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}};
  static const uint32_t key[3][2] = {{0, 0}, {0xffffffff, 0xffffffff}, {0xa4093822, 0x299f31d0}};
  static const uint32_t want[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                                      {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                                      {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
  for (int t = 0; t < 3; t++) {
    uint32_t out[4];
    kdrt_philox4x32(ctr[t], key[t], out);
    for (int i = 0; i < 4; i++)
      cr_assert_eq(out[i], want[t][i], "vector %d word %d: %08x != %08x", t, i, out[i],
                   want[t][i]);
  }
}

Test(rng, uniform_is_a_function_of_its_key) {
  cr_assert_eq(kdrt_uniform(1, 2, 3, 4), kdrt_uniform(1, 2, 3, 4));
  cr_assert_neq(kdrt_uniform(1, 2, 3, 4), kdrt_uniform(1, 2, 3, 5));
  cr_assert_neq(kdrt_uniform(1, 2, 3, 4), kdrt_uniform(1, 2, 4, 4));
  cr_assert_neq(kdrt_uniform(1, 2, 3, 4), kdrt_uniform(1, 3, 3, 4));
  cr_assert_neq(kdrt_uniform(1, 2, 3, 4), kdrt_uniform(2, 2, 3, 4));
}

// Pinned draws: a change here changes every program's initial weights,
// dropout masks and data order, so it must be deliberate.
Test(rng, pinned_values) {
  cr_assert_float_eq(kdrt_uniform(1337, 0, 0, 0), 0.677454233f, 1e-7f);
  cr_assert_float_eq(kdrt_uniform(1337, 5, 2, 9), 0.787853539f, 1e-7f);
  cr_assert_float_eq(kdrt_normal(1337, 0, 0, 0), -0.209981352f, 1e-6f);
  cr_assert_float_eq(kdrt_normal(42, 7, 1, 123456789), 0.273529232f, 1e-6f);
}

Test(rng, uniform_range_and_moments) {
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; i++) {
    float u = kdrt_uniform(7, 1, 0, (uint64_t)i);
    cr_assert(u >= 0.0f && u < 1.0f, "uniform %g out of [0,1)", u);
    s += u, s2 += (double)u * u;
  }
  double mean = s / n, var = s2 / n - mean * mean;
  cr_assert(fabs(mean - 0.5) < 0.005, "mean %g", mean);
  cr_assert(fabs(var - 1.0 / 12) < 0.002, "variance %g", var);
}

Test(rng, normal_moments) {
  const int n = 200000;
  double s = 0, s2 = 0, s4 = 0;
  for (int i = 0; i < n; i++) {
    double z = kdrt_normal(7, 2, 0, (uint64_t)i);
    cr_assert(isfinite(z));
    s += z, s2 += z * z, s4 += z * z * z * z;
  }
  double mean = s / n, var = s2 / n - mean * mean;
  cr_assert(fabs(mean) < 0.01, "mean %g", mean);
  cr_assert(fabs(var - 1.0) < 0.02, "variance %g", var);
  cr_assert(fabs(s4 / n - 3.0) < 0.1, "fourth moment %g (normal: 3)", s4 / n);
}

// ------------------------------------------------------------ initializers

static void stats(const float *v, int n, double *mean, double *sd, double *maxabs) {
  double s = 0, s2 = 0;
  *maxabs = 0;
  for (int i = 0; i < n; i++) {
    s += v[i], s2 += (double)v[i] * v[i];
    if (fabs(v[i]) > *maxabs) *maxabs = fabs(v[i]);
  }
  *mean = s / n;
  *sd = sqrt(s2 / n - *mean * *mean);
}

Test(init, variance_scaling_ranges_and_spread) {
  enum { R = 300, C = 200 };
  static float w[R * C];
  kdrt_layout l = {2, {R, C}, {-1, -1}};
  static const int one[1] = {1};
  kdrt_program p = fake_prog(1, one);
  kdrt_ctx c = fake_ctx(&p, 0, 42);
  double fi = R, fo = C, mean, sd, mx;
  struct {
    kdrt_init_kind kind;
    double sd, limit; // expected stddev; bound on |w|
  } cases[] = {
      {KDRT_INIT_GLOROT_UNIFORM, sqrt(2 / (fi + fo)), sqrt(6 / (fi + fo))},
      {KDRT_INIT_HE_UNIFORM, sqrt(2 / fi), sqrt(6 / fi)},
      {KDRT_INIT_LECUN_UNIFORM, sqrt(1 / fi), sqrt(3 / fi)},
      // truncated at 2 stddev of the pre-correction normal
      {KDRT_INIT_GLOROT_NORMAL, sqrt(2 / (fi + fo)), 2 * sqrt(2 / (fi + fo)) / .87962566103423978},
      {KDRT_INIT_HE_NORMAL, sqrt(2 / fi), 2 * sqrt(2 / fi) / .87962566103423978},
      {KDRT_INIT_LECUN_NORMAL, sqrt(1 / fi), 2 * sqrt(1 / fi) / .87962566103423978},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    kdrt_init_fill(&c, w, &l, cases[k].kind, fi, fo, 0, 0, 99 + k);
    stats(w, R * C, &mean, &sd, &mx);
    cr_assert(fabs(mean) < 0.02 * cases[k].sd, "kind %d: mean %g", cases[k].kind, mean);
    cr_assert(fabs(sd / cases[k].sd - 1) < 0.02, "kind %d: stddev %g, want %g", cases[k].kind,
              sd, cases[k].sd);
    cr_assert(mx <= cases[k].limit * (1 + 1e-6), "kind %d: |w| %g > %g", cases[k].kind, mx,
              cases[k].limit);
    cr_assert(mx > cases[k].limit * 0.95, "kind %d: |w| never near the bound %g", cases[k].kind,
              cases[k].limit);
  }
}

Test(init, user_parameters_and_constants) {
  enum { N = 50000 };
  static float w[N];
  kdrt_layout l = {1, {N}, {-1}};
  static const int one[1] = {1};
  kdrt_program p = fake_prog(1, one);
  kdrt_ctx c = fake_ctx(&p, 0, 42);
  double mean, sd, mx;
  kdrt_init_fill(&c, w, &l, KDRT_INIT_RANDOM_NORMAL, 0, 0, 3.0f, 0.5f, 1);
  stats(w, N, &mean, &sd, &mx);
  cr_assert(fabs(mean - 3) < 0.01 && fabs(sd - 0.5) < 0.01, "random_normal %g %g", mean, sd);
  kdrt_init_fill(&c, w, &l, KDRT_INIT_RANDOM_UNIFORM, 0, 0, -1.0f, 3.0f, 2);
  for (int i = 0; i < N; i++) cr_assert(w[i] >= -1.0f && w[i] < 3.0f, "uniform %g", w[i]);
  stats(w, N, &mean, &sd, &mx);
  cr_assert(fabs(mean - 1) < 0.02, "random_uniform mean %g", mean);
  kdrt_init_fill(&c, w, &l, KDRT_INIT_TRUNCATED_NORMAL, 0, 0, 1.0f, 0.25f, 3);
  for (int i = 0; i < N; i++)
    cr_assert(fabsf(w[i] - 1.0f) <= 0.5f + 1e-6f, "truncated_normal %g beyond 2 stddev", w[i]);
  kdrt_init_fill(&c, w, &l, KDRT_INIT_ONES, 0, 0, 0, 0, 4);
  cr_assert(w[0] == 1 && w[N - 1] == 1);
  kdrt_init_fill(&c, w, &l, KDRT_INIT_CONSTANT, 0, 0, 0.25f, 0, 5);
  cr_assert(w[0] == 0.25f && w[N - 1] == 0.25f);
  kdrt_init_fill(&c, w, &l, KDRT_INIT_ZEROS, 0, 0, 0, 0, 6);
  cr_assert(w[0] == 0 && w[N - 1] == 0);
}

// The uniform initializers draw their Philox blocks in bulk (AVX2 where
// the CPU has it, rows on threads): element g is still a + (b - a) *
// kdrt_uniform(seed, stream, 0, g), bit for bit, on 1 and on 3 threads, and
// with the scalar block maker (KDRT_PHILOX=scalar).
Test(init, uniform_is_its_definition_element_by_element) {
  enum { R = 37, C = 301, N = R * C };
  static float w[N];
  kdrt_layout l = {2, {R, C}, {-1, -1}};
  static const int one[1] = {1};
  for (int pass = 0; pass < 3; pass++) {
    if (pass == 2) setenv("KDRT_PHILOX", "scalar", 1); // read when each fill starts
    omp_set_num_threads(pass == 1 ? 3 : 1);
    kdrt_program p = fake_prog(1, one);
    kdrt_ctx c = fake_ctx(&p, 0, 7);
    kdrt_init_fill(&c, w, &l, KDRT_INIT_RANDOM_UNIFORM, 0, 0, -0.5f, 1.5f, 9);
    for (int g = 0; g < N; g++) {
      float want = (float)(-0.5 + 2.0 * kdrt_uniform(7, 9, 0, (uint64_t)g));
      cr_assert_eq(w[g], want, "pass %d element %d: %a != %a", pass, g, w[g], want);
    }
  }
  unsetenv("KDRT_PHILOX");
  omp_set_num_threads(1);
}

Test(init, same_seed_same_weights_other_seed_other_weights) {
  static float a[64], b[64];
  kdrt_layout l = {2, {8, 8}, {-1, -1}};
  static const int one[1] = {1};
  kdrt_program p = fake_prog(1, one);
  kdrt_ctx c1 = fake_ctx(&p, 0, 1), c2 = fake_ctx(&p, 0, 2);
  kdrt_init_fill(&c1, a, &l, KDRT_INIT_GLOROT_UNIFORM, 8, 8, 0, 0, 5);
  kdrt_init_fill(&c1, b, &l, KDRT_INIT_GLOROT_UNIFORM, 8, 8, 0, 0, 5);
  cr_assert_arr_eq(a, b, sizeof a);
  kdrt_init_fill(&c2, b, &l, KDRT_INIT_GLOROT_UNIFORM, 8, 8, 0, 0, 5);
  cr_assert(memcmp(a, b, sizeof a) != 0, "another seed gave the same weights");
  kdrt_init_fill(&c1, b, &l, KDRT_INIT_GLOROT_UNIFORM, 8, 8, 0, 0, 6);
  cr_assert(memcmp(a, b, sizeof a) != 0, "another stream gave the same weights");
}

Test(init, blocks_on_any_mesh_equal_the_global_tensor) {
  static const int m24[2] = {2, 4}, m42[2] = {4, 2}, m222[3] = {2, 2, 2}, m8[1] = {8};
  static float g[4096];
  const kdrt_init_kind kinds[] = {KDRT_INIT_GLOROT_UNIFORM, KDRT_INIT_HE_NORMAL,
                                  KDRT_INIT_RANDOM_NORMAL, KDRT_INIT_ORTHOGONAL};
  for (size_t k = 0; k < 4; k++) {
    kdrt_layout l2 = {2, {16, 24}, {-1, -1}};
    fill_global(g, &l2, kinds[k], 17);
    kdrt_layout cols = {2, {16, 24}, {-1, 1}}, both = {2, {16, 24}, {0, 1}},
                swapped = {2, {16, 24}, {1, 0}}, rows = {2, {16, 24}, {0, -1}};
    check_blocks(m24, 2, &cols, g, kinds[k], 17);
    check_blocks(m24, 2, &both, g, kinds[k], 17);
    check_blocks(m42, 2, &swapped, g, kinds[k], 17);
    check_blocks(m42, 2, &rows, g, kinds[k], 17);
    check_blocks(m8, 1, &cols, g, kinds[k], 17);
    kdrt_layout l4 = {4, {3, 3, 4, 8}, {-1, -1, -1, -1}};
    fill_global(g, &l4, kinds[k], 18);
    kdrt_layout conv = {4, {3, 3, 4, 8}, {-1, -1, 0, 2}}, conv2 = {4, {3, 3, 4, 8}, {-1, -1, -1, 1}};
    check_blocks(m222, 3, &conv, g, kinds[k], 18);
    check_blocks(m24, 2, &conv2, g, kinds[k], 18);
  }
}

// issue 11: Orthogonal(gain): orthonormal columns (rows when there are fewer
// rows than columns) times the gain; unit_forget_bias: ones in [U, 2U)
Test(init, orthogonal_and_unit_forget) {
  static const int one[1] = {1};
  kdrt_program p = fake_prog(1, one);
  kdrt_ctx c = fake_ctx(&p, 0, 7);
  static float w[64 * 16];
  const int64_t shapes[2][2] = {{64, 16}, {16, 64}};
  for (int s = 0; s < 2; s++) {
    int64_t R = shapes[s][0], C = shapes[s][1];
    kdrt_layout l = {2, {R, C}, {-1, -1}};
    kdrt_init_fill(&c, w, &l, KDRT_INIT_ORTHOGONAL, 0, 0, 2.0f, 0, 3);
    int64_t n = R > C ? C : R; // the orthonormal vectors: columns, or rows
    for (int64_t a = 0; a < n; a++)
      for (int64_t b = 0; b < n; b++) {
        double dot = 0;
        for (int64_t k = 0; k < (R > C ? R : C); k++)
          dot += R > C ? (double)w[k * C + a] * w[k * C + b] : (double)w[a * C + k] * w[b * C + k];
        cr_assert(fabs(dot - (a == b ? 4.0 : 0.0)) < 1e-5, "[%lld, %lld]: %lld . %lld = %g",
                  (long long)R, (long long)C, (long long)a, (long long)b, dot);
      }
  }
  float bias[12];
  kdrt_layout b = {1, {12}, {-1}};
  kdrt_init_fill(&c, bias, &b, KDRT_INIT_UNIT_FORGET, 0, 0, 3.0f, 0, 4);
  for (int i = 0; i < 12; i++) cr_assert_eq(bias[i], i >= 3 && i < 6 ? 1.0f : 0.0f, "%d", i);
}

// ------------------------------------------------------------ dropout

Test(dropout, keeps_the_right_fraction_scaled) {
  enum { N = 100000 };
  static float x[N], y[N];
  for (int i = 0; i < N; i++) x[i] = 1.0f + (float)(i % 7);
  kdrt_layout l = {1, {N}, {-1}};
  static const int one[1] = {1};
  kdrt_program p = fake_prog(1, one);
  kdrt_ctx c = fake_ctx(&p, 0, 1337);
  kdrt_dropout(&c, y, x, &l, 0.4f, 9);
  int kept = 0;
  for (int i = 0; i < N; i++) {
    if (y[i] != 0) {
      kept++;
      cr_assert_float_eq(y[i], x[i] / 0.6f, 1e-5f, "kept element %d not scaled", i);
    }
  }
  cr_assert(fabs(kept / (double)N - 0.6) < 0.01, "kept %d of %d", kept, N);
  // Another step, another mask; the same step, the same mask.
  static float y2[N];
  c.step = 1;
  kdrt_dropout(&c, y2, x, &l, 0.4f, 9);
  cr_assert(memcmp(y, y2, sizeof y) != 0, "step 1 reused step 0's mask");
  c.step = 0;
  kdrt_dropout(&c, y2, x, &l, 0.4f, 9);
  cr_assert_arr_eq(y, y2, sizeof y);
  // rate 0: identity; rate 1: nothing survives.
  kdrt_dropout(&c, y2, x, &l, 0.0f, 9);
  cr_assert_arr_eq(x, y2, sizeof x);
  kdrt_dropout(&c, y2, x, &l, 1.0f, 9);
  for (int i = 0; i < N; i++) cr_assert_eq(y2[i], 0.0f);
}

Test(dropout, mask_does_not_depend_on_the_mesh) {
  static const int one[1] = {1}, m24[2] = {2, 4};
  enum { B = 16, H = 24 };
  static float x[B * H], g[B * H], y[B * H];
  for (int i = 0; i < B * H; i++) x[i] = (float)i;
  kdrt_program p1 = fake_prog(1, one), p = fake_prog(2, m24);
  kdrt_ctx c1 = fake_ctx(&p1, 0, 5);
  c1.step = 3;
  kdrt_layout gl = {2, {B, H}, {-1, -1}}, l = {2, {B, H}, {0, 1}};
  kdrt_dropout(&c1, g, x, &gl, 0.5f, 11);
  for (int r = 0; r < 8; r++) {
    kdrt_ctx c = fake_ctx(&p, r, 5);
    c.step = 3;
    int lb = B / 2, lh = H / 4;
    float lx[B * H];
    for (int i = 0; i < lb; i++)
      for (int j = 0; j < lh; j++)
        lx[i * lh + j] = x[(c.coord[0] * lb + i) * H + c.coord[1] * lh + j];
    kdrt_dropout(&c, y, lx, &l, 0.5f, 11);
    for (int i = 0; i < lb; i++)
      for (int j = 0; j < lh; j++)
        cr_assert_eq(y[i * lh + j], g[(c.coord[0] * lb + i) * H + c.coord[1] * lh + j],
                     "rank %d (%d,%d)", r, i, j);
  }
}

// issue 11: GaussianNoise and GaussianDropout: standard normals times the
// stddev, added or multiplied (1 + s z), drawn per step and global index.
Test(gaussian_noise, moments_steps_and_mesh) {
  enum { N = 40000 };
  static float x[N], y[N], y2[N];
  for (int i = 0; i < N; i++) x[i] = 2.0f;
  kdrt_layout l = {1, {N}, {-1}};
  static const int one[1] = {1}, two[1] = {2};
  kdrt_program p = fake_prog(1, one);
  kdrt_ctx c = fake_ctx(&p, 0, 1337);
  kdrt_gaussian_noise(&c, y, x, &l, 0.5f, 0, 7);
  double m = 0, v = 0;
  for (int i = 0; i < N; i++) m += y[i] - 2.0, v += (y[i] - 2.0) * (y[i] - 2.0);
  m /= N, v = v / N - m * m;
  cr_assert(fabs(m) < 0.01 && fabs(sqrt(v) - 0.5) < 0.01, "mean %g, stddev %g", m, sqrt(v));
  kdrt_gaussian_noise(&c, y2, x, &l, 0.5f, 1, 7); // x * (1 + z): the same z
  for (int i = 0; i < N; i++) cr_assert_float_eq(y2[i] - 2.0f, 2.0f * (y[i] - 2.0f), 1e-5f);
  c.step = 1;
  kdrt_gaussian_noise(&c, y2, x, &l, 0.5f, 0, 7);
  cr_assert(memcmp(y, y2, sizeof y) != 0, "step 1 reused step 0's draws");
  kdrt_program p2 = fake_prog(1, two); // split in two: each half draws its own elements
  kdrt_layout half = {1, {N}, {0}};
  c.step = 0;
  for (int r = 0; r < 2; r++) {
    kdrt_ctx cr = fake_ctx(&p2, r, 1337);
    kdrt_gaussian_noise(&cr, y2, x, &half, 0.5f, 0, 7);
    cr_assert_arr_eq(y2, y + r * (N / 2), sizeof(float) * (N / 2), "rank %d", r);
  }
}

// ------------------------------------------------------------ options

static int parse(kdrt_options *o, char *err, const char *const *args) {
  char *argv[32];
  int argc = 0;
  argv[argc++] = (char *)"./train";
  for (; *args; args++) argv[argc++] = (char *)*args;
  argv[argc] = NULL;
  err[0] = 0;
  return kdrt_parse_args(argc, argv, o, err, 256);
}

Test(args, defaults) {
  kdrt_options o;
  char err[256];
  const char *a[] = {NULL};
  cr_assert_eq(parse(&o, err, a), 0);
  cr_assert_eq(o.epochs, 1);
  cr_assert_eq(o.seed, 1337);
  cr_assert_eq(o.synthetic, 0);
  cr_assert_eq(o.batch_size, 0);
  cr_assert_null(o.history);
  cr_assert(!o.quiet && !o.help && !o.has_lr);
}

Test(args, every_option) {
  kdrt_options o;
  char err[256];
  const char *a[] = {"--epochs", "3", "--batch-size=16", "--steps-per-epoch", "5",
                     "--x", "x.npy", "--y=y.npy", "--validation-split", "0.25",
                     "--seed", "7", "--lr", "0.01", "--history", "h.json", "--quiet", NULL};
  cr_assert_eq(parse(&o, err, a), 0, "%s", err);
  cr_assert_eq(o.epochs, 3);
  cr_assert_eq(o.batch_size, 16);
  cr_assert_eq(o.steps_per_epoch, 5);
  cr_assert(o.x.n == 1 && o.y.n == 1);
  cr_assert_str_eq(o.x.arg[0], "x.npy");
  cr_assert_str_eq(o.y.arg[0], "y.npy");
  cr_assert_float_eq(o.validation_split, 0.25, 1e-12);
  cr_assert_eq(o.seed, 7);
  cr_assert(o.has_lr);
  cr_assert_float_eq(o.lr, 0.01f, 1e-9f);
  cr_assert_str_eq(o.history, "h.json");
  cr_assert(o.quiet);
  const char *b[] = {"--synthetic", "64", "--help", NULL};
  cr_assert_eq(parse(&o, err, b), 0, "%s", err);
  cr_assert_eq(o.synthetic, 64);
  cr_assert(o.help);
}

Test(args, errors_name_the_option) {
  kdrt_options o;
  char err[256];
  const char *unknown[] = {"--epoch", "3", NULL};
  cr_assert_eq(parse(&o, err, unknown), 2);
  cr_assert_str_eq(err, "unknown option '--epoch'");
  const char *positional[] = {"data.npy", NULL};
  cr_assert_eq(parse(&o, err, positional), 2);
  cr_assert_str_eq(err, "unknown option 'data.npy'");
  const char *missing[] = {"--epochs", NULL};
  cr_assert_eq(parse(&o, err, missing), 2);
  cr_assert_str_eq(err, "option '--epochs' needs a value");
  const char *notnum[] = {"--batch-size", "16x", NULL};
  cr_assert_eq(parse(&o, err, notnum), 2);
  cr_assert_str_eq(err, "option '--batch-size' wants an integer >= 1, got '16x'");
  const char *split[] = {"--validation-split", "1.5", NULL};
  cr_assert_eq(parse(&o, err, split), 2);
  cr_assert_str_eq(err, "option '--validation-split' wants a number in [0, 1), got '1.5'");
  const char *xonly[] = {"--x", "a.npy", NULL};
  cr_assert_eq(parse(&o, err, xonly), 2);
  cr_assert_str_eq(err, "--x needs --y (the labels)");
  const char *both[] = {"--x", "a.npy", "--y", "b.npy", "--synthetic", "8", NULL};
  cr_assert_eq(parse(&o, err, both), 2);
  cr_assert_str_eq(err, "--synthetic and --x exclude each other");
}

Test(args, callback_options) {
  kdrt_options o;
  char err[256];
  const char *none[] = {NULL};
  cr_assert_eq(parse(&o, err, none), 0);
  cr_assert(!o.early_stopping && !o.reduce_lr && !o.csv_log && !o.checkpoint_best);
  cr_assert(o.rl_factor == 0.1 && o.rl_min_delta == 1e-4); // ReduceLROnPlateau's defaults
  const char *a[] = {"--early-stopping", "3", "--restore-best-weights", "--min-delta=0.01",
                     "--baseline", "-2", "--start-from-epoch", "1", "--monitor", "val_accuracy",
                     "--mode", "max", "--reduce-lr-on-plateau", "2", "--reduce-lr-factor",
                     "0.5", "--reduce-lr-min-delta", "0", "--reduce-lr-cooldown", "4",
                     "--min-lr", "1e-3", "--checkpoint-best", "b.weights.h5", "--csv-log",
                     "l.csv", "--csv-append", NULL};
  cr_assert_eq(parse(&o, err, a), 0, "%s", err);
  cr_assert(o.early_stopping && o.es_patience == 3 && o.restore_best && o.min_delta == 0.01);
  cr_assert(o.has_baseline && o.baseline == -2 && o.start_from_epoch == 1);
  cr_assert_str_eq(o.monitor, "val_accuracy");
  cr_assert_eq(o.mode, 1);
  cr_assert(o.reduce_lr && o.rl_patience == 2 && o.rl_factor == 0.5 && o.rl_min_delta == 0);
  cr_assert(o.rl_cooldown == 4 && o.min_lr == 1e-3);
  cr_assert_str_eq(o.checkpoint_best, "b.weights.h5");
  cr_assert(!strcmp(o.csv_log, "l.csv") && o.csv_append);
  const char *cooldown[] = {"--reduce-lr-cooldown", "2", NULL};
  cr_assert_eq(parse(&o, err, cooldown), 2);
  cr_assert_str_eq(err, "--reduce-lr-cooldown needs --reduce-lr-on-plateau");
  const char *baseline[] = {"--baseline", "1", NULL};
  cr_assert_eq(parse(&o, err, baseline), 2);
  cr_assert_str_eq(err, "--baseline needs --early-stopping");
  const char *patience[] = {"--reduce-lr-on-plateau", "x", NULL};
  cr_assert_eq(parse(&o, err, patience), 2);
  cr_assert_str_eq(err, "option '--reduce-lr-on-plateau' wants an integer >= 0, got 'x'");
}

// ------------------------------------------------------------ callbacks

Test(callbacks, python_float_repr) {
  static const struct { double v; const char *s; } cases[] = {
      {0.1, "0.1"}, {3.0, "3.0"}, {1e-05, "1e-05"}, {0.0001, "0.0001"}, {1.5e-05, "1.5e-05"},
      {1e16, "1e+16"}, {1.2345e16, "1.2345e+16"}, {123456789012345.6, "123456789012345.6"},
      {9999999999999998.0, "9999999999999998.0"}, {-0.0, "-0.0"}, {0.0, "0.0"},
      {100.0, "100.0"}, {2.5e-300, "2.5e-300"}, {-INFINITY, "-inf"}, {1e22, "1e+22"},
      {0.5, "0.5"}, {(double)0.005f, "0.004999999888241291"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char buf[64];
    kdrt_py_float(buf, sizeof buf, cases[i].v);
    cr_assert_str_eq(buf, cases[i].s, "repr(%.17g)", cases[i].v);
  }
}

// func_fit_rlrop's run in Keras (tests/fixtures/keras_ref): val_loss rises
// every epoch; ReduceLROnPlateau(factor=0.5, patience=1, cooldown=1,
// min_lr=0.002) halves the rate after epochs 2, 3, 4 (the last stopped at
// min_lr), EarlyStopping(patience=3) stops after epoch 4.
Test(callbacks, keras_plateau_and_stopping) {
  kdrt_options o;
  char err[256];
  const char *a[] = {"--reduce-lr-on-plateau", "1", "--reduce-lr-factor", "0.5",
                     "--reduce-lr-cooldown", "1", "--min-lr", "0.002", "--early-stopping", "3",
                     NULL};
  cr_assert_eq(parse(&o, err, a), 0, "%s", err);
  kdrt_ctx c = {.lr = 0.01f};
  const char *names[] = {"loss", "val_loss"};
  kdrt_callbacks cb;
  cr_assert_eq(kdrt_cb_begin(&cb, &c, &o, 2, names, 1, 0, err, sizeof err), 0, "%s", err);
  const double val[] = {1.5420925617218018, 1.576389193534851, 1.618839144706726,
                        1.6504124402999878};
  const float lr[] = {0.01f, 0.005f, 0.0025f, 0.002f};
  for (int e = 0; e < 4; e++) {
    double logs[2] = {1, val[e]};
    cr_assert_eq(kdrt_cb_epoch_end(&cb, &c, e, logs, 0), e == 3, "epoch %d", e + 1);
    cr_assert_float_eq(c.lr, lr[e], 1e-9f, "after epoch %d: %g", e + 1, (double)c.lr);
  }
  kdrt_cb_end(&cb, &c);
  // A monitor the run has not: an error naming the logs.
  const char *nv[] = {"loss", "val_loss"};
  cr_assert_eq(kdrt_cb_begin(&cb, &c, &o, 2, nv, 0, 0, err, sizeof err), -1);
  cr_assert_str_eq(err, "--monitor val_loss: no such log (val_ logs need --val-x/--val-y or "
                        "--validation-split); the logs are loss");
}

// ------------------------------------------------------------ the arena plan

// kdcc's first fit replayed: a buffer given back is reused by the next
// that fits; sizes are k * ceil(B / parts) rounded up to 16 floats; the
// scratch sits past the peak.
Test(arena, replays_first_fit_for_any_batch) {
  static const kdrt_arena_op plan[] = {
      {KDRT_ARENA_ALLOC, 0, 10, 2},   // 10 floats a local row (rows over 2 devices)
      {KDRT_ARENA_ALLOC, 1, 20, 0},   // 20 floats, no batch dim
      {KDRT_ARENA_FREE, 0, 0, 0},
      {KDRT_ARENA_ALLOC, 2, 3, 1},    // 3 floats a row, every row
      {KDRT_ARENA_SCRATCH, 3, 7, 2},
      {KDRT_ARENA_SCRATCH, 3, 0, 0}};
  int64_t off[4];
  kdrt_program p = {.batch = 16, .arena_plan = plan, .narena_plan = 6, .arena_off = off};
  // B = 16: buffer 0 80 floats at 0, buffer 1 32 at 80; buffer 2 (48) reuses 0
  cr_assert_eq(kdrt_arena_plan(&p, 16), 112 + 64);
  cr_assert(off[0] == 0 && off[1] == 80 && off[2] == 0 && off[3] == 112);
  // B = 40: 200 floats (208), 32; buffer 2 (120 -> 128) still fits in 208
  cr_assert_eq(kdrt_arena_plan(&p, 40), 240 + 144);
  cr_assert(off[0] == 0 && off[1] == 208 && off[2] == 0 && off[3] == 240);
  // B = 3 over 2 devices: 2 rows the most a device gets
  cr_assert_eq(kdrt_arena_plan(&p, 3), 64 + 16);
  cr_assert(off[1] == 32 && off[2] == 0);
  kdrt_program none = {.batch = 16, .arena_floats = 99};
  cr_assert_eq(kdrt_arena_plan(&none, 64), 99);
}

// ------------------------------------------------------------ .npy headers

// A version-1 .npy header for dict text `d`, padded as numpy pads it.
static size_t npy_header(unsigned char *buf, const char *d, int version) {
  size_t pre = version == 1 ? 10 : 12, n = strlen(d);
  size_t total = (pre + n + 1 + 63) / 64 * 64, hlen = total - pre;
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)version, buf[7] = 0;
  buf[8] = (unsigned char)hlen, buf[9] = (unsigned char)(hlen >> 8);
  if (version != 1) buf[10] = buf[11] = 0;
  memcpy(buf + pre, d, n);
  memset(buf + pre + n, ' ', hlen - n - 1);
  buf[total - 1] = '\n';
  return total;
}

Test(npy, parses_numpy_headers) {
  unsigned char buf[256];
  char err[256];
  kdrt_npy h;
  size_t n = npy_header(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (128, 28, 28, 1), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), 0, "%s", err);
  cr_assert_eq(h.kind, 'f');
  cr_assert_eq(h.size, 4);
  cr_assert_eq(h.ndim, 4);
  cr_assert(h.shape[0] == 128 && h.shape[1] == 28 && h.shape[2] == 28 && h.shape[3] == 1);
  cr_assert_eq(h.data_offset, n);
  cr_assert_eq(h.data_offset % 64, 0);
  n = npy_header(buf, "{'descr': '|u1', 'fortran_order': False, 'shape': (60000,), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), 0, "%s", err);
  cr_assert(h.kind == 'u' && h.size == 1 && h.ndim == 1 && h.shape[0] == 60000);
  n = npy_header(buf, "{'descr': '|b1', 'fortran_order': False, 'shape': (4, 16, 16), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), 0, "%s", err);
  cr_assert(h.kind == 'u' && h.size == 1, "bool reads as uint8");
  n = npy_header(buf, "{'descr': '<i8', 'fortran_order': False, 'shape': (5, 3), }", 2);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), 0, "%s", err);
  cr_assert(h.kind == 'i' && h.size == 8 && h.ndim == 2 && h.shape[1] == 3);
  n = npy_header(buf, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), 0, "%s", err);
  cr_assert_eq(h.ndim, 0);
}

Test(npy, rejects_what_it_cannot_read) {
  unsigned char buf[256];
  char err[256];
  kdrt_npy h;
  size_t n = npy_header(buf, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), -1);
  cr_assert(strstr(err, "Fortran order"), "%s", err);
  n = npy_header(buf, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), -1);
  cr_assert(strstr(err, "'>f4'"), "%s", err);
  n = npy_header(buf, "{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), -1);
  cr_assert_str_eq(err, "dtype '<c8' is not supported (use float32, float64, uint8, int32 or int64)");
  cr_assert_eq(kdrt_npy_parse((const unsigned char *)"PK\3\4 not numpy", 16, &h, err, sizeof err), -1);
  cr_assert(strstr(err, "magic"), "%s", err);
  n = npy_header(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, 20, &h, err, sizeof err), -1, "a truncated header parsed");
  // A dtype's size is digits only: '<f4aaaa' is no float32.
  n = npy_header(buf, "{'descr': '<f4aaaa', 'fortran_order': False, 'shape': (2, 3), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), -1, "'<f4aaaa' parsed");
  cr_assert_str_eq(err, "dtype '<f4aaaa' is not supported (use float32, float64, uint8, int32 or int64)");
  n = npy_header(buf, "{'descr': '<i40', 'fortran_order': False, 'shape': (2, 3), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), -1, "'<i40' parsed");
  n = npy_header(buf, "{'descr': '<f4444444444444444444', 'fortran_order': False, 'shape': (2,), }", 1);
  cr_assert_eq(kdrt_npy_parse(buf, n, &h, err, sizeof err), -1, "a long descr parsed");
  cr_assert_str_eq(err, ".npy header's 'descr' is not a short quoted string");
}

// ------------------------------------------------------------ data order

Test(data, shuffle_is_a_seeded_permutation) {
  enum { N = 1000 };
  static int64_t a[N], b[N];
  kdrt_shuffle(1337, 0, a, N);
  kdrt_shuffle(1337, 0, b, N);
  cr_assert_arr_eq(a, b, sizeof a);
  static char seen[N];
  int moved = 0;
  for (int i = 0; i < N; i++) {
    cr_assert(a[i] >= 0 && a[i] < N);
    cr_assert(!seen[a[i]], "index %lld twice", (long long)a[i]);
    seen[a[i]] = 1;
    moved += a[i] != i;
  }
  cr_assert(moved > N * 9 / 10, "only %d of %d moved", moved, N);
  kdrt_shuffle(1337, 1, b, N);
  cr_assert(memcmp(a, b, sizeof a) != 0, "epoch 1 repeated epoch 0's order");
  kdrt_shuffle(1338, 0, b, N);
  cr_assert(memcmp(a, b, sizeof a) != 0, "another seed gave the same order");
  int64_t one;
  kdrt_shuffle(1, 0, &one, 1);
  cr_assert_eq(one, 0);
}

Test(data, synthetic_labels_follow_the_label_kind) {
  static const int one[1] = {1};
  kdrt_program p = fake_prog(1, one);
  kdrt_io in = {.name = "x", .dtype = KDRT_F32, .rank = 2, .shape = {3, 2}};
  kdrt_io lab = {.name = "d", .dtype = KDRT_F32, .rank = 1, .shape = {10}, .num_classes = 10};
  p.ninputs = 1, p.inputs = &in, p.nlabels = 1, p.labels = &lab;
  float x[6], y[10], x2[6], y2[10];
  int hist[10] = {0};
  lab.label_kind = KDRT_LABEL_ONEHOT;
  for (int s = 0; s < 2000; s++) {
    kdrt_synthetic_label(&p, 1337, 0, s, y);
    int ones = 0, cls = -1;
    for (int i = 0; i < 10; i++) {
      cr_assert(y[i] == 0 || y[i] == 1);
      if (y[i] == 1) ones++, cls = i;
    }
    cr_assert_eq(ones, 1, "sample %d: %d ones", s, ones);
    hist[cls]++;
  }
  for (int i = 0; i < 10; i++) cr_assert(hist[i] > 120, "class %d only %d times", i, hist[i]);
  kdrt_synthetic_input(&p, 1337, 0, 77, x), kdrt_synthetic_label(&p, 1337, 0, 77, y);
  kdrt_synthetic_input(&p, 1337, 0, 77, x2), kdrt_synthetic_label(&p, 1337, 0, 77, y2);
  cr_assert_arr_eq(x, x2, sizeof x);
  cr_assert_arr_eq(y, y2, sizeof y);
  kdrt_synthetic_input(&p, 1337, 0, 78, x2);
  cr_assert(memcmp(x, x2, sizeof x) != 0, "two samples share their inputs");
  // The numbers of a one-input program, as before several inputs: pinned.
  kdrt_synthetic_input(&p, 1337, 0, 0, x);
  cr_assert_eq(x[0], kdrt_normal(1337, 0x6b647274782d3031ull, 0, 0));
  cr_assert_eq(x[5], kdrt_normal(1337, 0x6b647274782d3031ull, 0, 5));

  lab.label_kind = KDRT_LABEL_CLASSID, lab.rank = 0;
  for (int s = 0; s < 200; s++) {
    kdrt_synthetic_label(&p, 1337, 0, s, y);
    cr_assert(y[0] >= 0 && y[0] <= 9 && y[0] == floorf(y[0]), "class id %g", y[0]);
  }
  lab.label_kind = KDRT_LABEL_BINARY, lab.rank = 1, lab.shape[0] = 1;
  int pos = 0;
  for (int s = 0; s < 1000; s++) {
    kdrt_synthetic_label(&p, 1337, 0, s, y);
    cr_assert(y[0] == 0 || y[0] == 1);
    pos += y[0] == 1;
  }
  cr_assert(pos > 400 && pos < 600, "%d positives of 1000", pos);
}

Test(data, synthetic_inputs_each_their_own_and_ids_in_range) {
  static const int one[1] = {1};
  kdrt_program p = fake_prog(1, one);
  kdrt_io in[3] = {{.name = "a", .dtype = KDRT_F32, .rank = 1, .shape = {4}},
                   {.name = "b", .dtype = KDRT_F32, .rank = 1, .shape = {4}},
                   {.name = "ids", .dtype = KDRT_I32, .rank = 1, .shape = {50}, .num_classes = 7}};
  p.ninputs = 3, p.inputs = in;
  float a[4], b[4];
  kdrt_synthetic_input(&p, 5, 0, 3, a);
  kdrt_synthetic_input(&p, 5, 1, 3, b);
  cr_assert(memcmp(a, b, sizeof a) != 0, "inputs 0 and 1 drew the same numbers");
  int32_t ids[50];
  int seen[7] = {0};
  for (int s = 0; s < 20; s++) {
    kdrt_synthetic_input(&p, 5, 2, s, ids);
    for (int i = 0; i < 50; i++) {
      cr_assert(ids[i] >= 0 && ids[i] < 7, "id %d", ids[i]);
      seen[ids[i]]++;
    }
  }
  for (int i = 0; i < 7; i++) cr_assert(seen[i] > 50, "id %d drawn %d times of 1000", i, seen[i]);
}

Test(data, resolve_files_by_position_and_by_name) {
  kdrt_io ios[2] = {{.name = "img"}, {.name = "tok"}};
  const char *out[2];
  char err[512];
  kdrt_files pos = {2, {"a.npy", "b.npy"}};
  cr_assert_eq(kdrt_resolve_files(&pos, "--x", ios, 2, "input", out, err, sizeof err), 0, "%s", err);
  cr_assert_str_eq(out[0], "a.npy");
  cr_assert_str_eq(out[1], "b.npy");
  kdrt_files named = {2, {"tok=t.npy", "img=i=1.npy"}};
  cr_assert_eq(kdrt_resolve_files(&named, "--x", ios, 2, "input", out, err, sizeof err), 0, "%s", err);
  cr_assert_str_eq(out[0], "i=1.npy");
  cr_assert_str_eq(out[1], "t.npy");
  // A name no input has: a file name (with '=' in it).
  kdrt_files odd = {2, {"x=1.npy", "b.npy"}};
  cr_assert_eq(kdrt_resolve_files(&odd, "--x", ios, 2, "input", out, err, sizeof err), 0, "%s", err);
  cr_assert_str_eq(out[0], "x=1.npy");
  kdrt_files one = {1, {"a.npy"}};
  cr_assert_eq(kdrt_resolve_files(&one, "--x", ios, 2, "input", out, err, sizeof err), -1);
  cr_assert_str_eq(err, "--x given 1 time, but the model has 2 inputs ('img', 'tok'): give one "
                        "--x FILE per input, in this order, or --x NAME=FILE");
  kdrt_files mixed = {2, {"img=a.npy", "b.npy"}};
  cr_assert_eq(kdrt_resolve_files(&mixed, "--x", ios, 2, "input", out, err, sizeof err), -1);
  cr_assert_str_eq(err, "--x b.npy: with NAME=FILE, every --x needs a NAME, one of 'img', 'tok'");
  kdrt_files twice = {2, {"img=a.npy", "img=b.npy"}};
  cr_assert_eq(kdrt_resolve_files(&twice, "--x", ios, 2, "input", out, err, sizeof err), -1);
  cr_assert_str_eq(err, "--x img=b.npy: input 'img' has a file already (a.npy)");
  kdrt_files missing = {1, {"tok=t.npy"}};
  cr_assert_eq(kdrt_resolve_files(&missing, "--x", ios, 2, "input", out, err, sizeof err), -1);
  cr_assert_str_eq(err, "--x: no file for input 'img' (give --x img=FILE)");
}

// ------------------------------------------------------------ progress line

#define BAR "\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81" \
            "\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81" \
            "\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81" \
            "\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81"

Test(progress, keras_line_text) {
  char buf[512];
  const char *names[] = {"loss", "accuracy"};
  double vals[] = {0.923712, 0.5};
  kdrt_progress_line(buf, sizeof buf, 8, 8, 1, 0.2, 0.004, 2, names, vals, 0);
  cr_assert_str_eq(buf, "8/8 " BAR " 0s 4ms/step - accuracy: 0.5000 - loss: 0.9237");
  const char *n4[] = {"loss", "accuracy", "val_loss", "val_accuracy"};
  double v4[] = {1.5, 0.25, 0.00012345, 1};
  kdrt_progress_line(buf, sizeof buf, 12, 12, 1, 3.4, 0.000250, 4, n4, v4, 0);
  cr_assert_str_eq(buf, "12/12 " BAR " 3s 250us/step - accuracy: 0.2500 - loss: 1.5000"
                        " - val_accuracy: 1.0000 - val_loss: 1.2345e-04");
  // Live: the ETA instead of the elapsed time, the step count right-aligned.
  kdrt_progress_line(buf, sizeof buf, 3, 100, 0, 9.0, 1.5, 1, names, vals, 0);
  cr_assert_str_eq(buf, "  3/100 " BAR " 2:25 2s/step - loss: 0.9237");
}

// The watchdog's limit (watchdog.c): --timeout as given; else 300 s until
// 5 steps are timed, then 100 times the median step, at least 120 s.
Test(watchdog, limit_from_the_median_step) {
  cr_expect_eq(kdrt_watchdog_limit(7.5, NULL, 0), 7.5);
  cr_expect_eq(kdrt_watchdog_limit(0, NULL, 0), 300.0);
  double t[70] = {0.01, 0.02, 5.0, 0.03, 0.02};
  cr_expect_eq(kdrt_watchdog_limit(0, t, 4), 300.0);
  cr_expect_eq(kdrt_watchdog_limit(0, t, 5), 120.0); // 100 x 0.02 s is under the floor
  double slow[6] = {3, 2, 100, 2.5, 3, 2};           // median 2.75 s: one slow step does not count
  cr_expect_float_eq(kdrt_watchdog_limit(0, slow, 6), 275.0, 1e-9);
  for (int i = 0; i < 70; i++) t[i] = 4.0;
  cr_expect_float_eq(kdrt_watchdog_limit(0, t, 70), 400.0, 1e-9);
}
