// opcheck.cu: `./train opcheck [--repeat N] [--seed S] [--matmul-tol X]`:
// every CUDA kernel of kdrt_ops.def's list against the CPU runtime's on the
// same random operands (the collectives excepted: they need a mesh of
// processes, tests/sh/gpu_mesh.sh runs them; but for the 16-bit ones'
// packing, over a group of one), by normalised error
// ||gpu - cpu|| / ||cpu|| (ggml's test-backend-ops idea). Operands are
// deliberately awkward: odd sizes, padding, overlapping pooling windows,
// a sharded dropout block on a (2, 2) mesh. Dropout must match bit for
// bit; elementwise kernels within 1e-6; anything with a matrix product
// within 1e-5 in fp32, 5e-3 under --precision tf32 and 3e-2 under bf16
// (operands rounded to bfloat16: errors of 1e-3..1e-2), or --matmul-tol.
//
// Besides wrong arithmetic it looks for what a race or a forgotten store
// leaves behind:
// - Every output a kernel overwrites is poisoned just before the call:
//   filled with NaN (every bit set) on the runtime's stream, so that an
//   element the kernel leaves unwritten, or writes before its inputs have
//   arrived, reads back as a NaN (or a stale value) and fails its check. A
//   buffer the kernel reads or adds to (a product with beta != 0,
//   place_block's destination, the optimizers' weights and slots, ema's
//   average, a loss gradient computed in place) starts instead from the
//   same random contents on both sides. Inputs are random, never zeros.
// - A non-finite value must match exactly: NaN with NaN, an infinity with
//   the same infinity; a NaN against a number fails whatever the tolerance.
// - --repeat N runs the whole suite N times; round r draws every operand
//   from seed S + r (S: --seed, default 1), printed, so that a round that
//   failed once can be run alone again with --seed.
//
// One line per check, a summary per round, then "opcheck: R rounds, C
// checks, F failed"; exit status 1 on any failure, 2 on bad usage. Runs on
// one device, without MPI.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "kdrt_loss.h" // issue 22: kdrt_xent_class, for the fused classifier's reference
#include "kdrt_rnn.h"

static int failures, checks;
static double tol_mm = 1e-5; // matrix products (precision-dependent)

static uint64_t rng_state;
// The operands' generator from a seed (splitmix64, so that seeds S and S + 1
// draw unrelated streams; xorshift's state must not be 0).
static void reseed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  rng_state = (z ^ (z >> 31)) | 1;
}
static float frand(float lo, float hi) { // xorshift64*, uniform [lo, hi)
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
  return lo + (hi - lo) * (float)(r >> 40) * (1.0f / 16777216.0f);
}
static float *hrand(size_t n, float lo, float hi) {
  float *p = (float *)malloc((n ? n : 1) * sizeof(float));
  if (!p) abort();
  for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
  return p;
}
static float *hzero(size_t n) {
  float *p = (float *)calloc(n ? n : 1, sizeof(float));
  if (!p) abort();
  return p;
}

static kdrt_cuda *D;
static float *dev(const float *h, size_t n) {
  float *p = kdrt_cuda_alloc(n);
  kdrt_cuda_upload(D, p, h, n);
  return p;
}
// issue 23: a device copy of n 16-bit values (kdrt_pack16's) of host h, in (n + 1) / 2 floats.
static float *dev16(int kind, const float *h, size_t n) {
  uint16_t *b = (uint16_t *)calloc(n + 1, sizeof *b);
  if (!b) abort();
  kdrt_pack16(kind, b, h, n);
  float *p = dev((const float *)b, (n + 1) / 2);
  free(b);
  return p;
}

// n floats of device buffer p to NaN (0xffffffff), on the stream the
// kernels run on, so ordered after what came before and before the call
// that follows. Called right before each kernel that overwrites p.
static void poison(float *p, size_t n) {
  if (n) CUDA_CHECK(cudaMemsetAsync(p, 0xff, n * sizeof(float), D->impl->stream));
}

// Compare n floats of device buffer g with the reference r: the normalised
// error ||g - r|| / max(||r||, terms) within tol (tol 0: every element
// equal), and every non-finite element the same on both sides. terms: the
// size of what a reduction added (the sum of their magnitudes, so that a
// sum that cancels to near 0 is judged against them), or 0.
static void check_scaled(const char *what, const float *g, const float *r, size_t n, double tol,
                         double terms) {
  float *h = hzero(n);
  kdrt_cuda_download(D, h, g, n);
  double num = 0, den = 0, maxd = 0;
  size_t bad = 0, first_bad = 0, worst = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(h[i]) || !isfinite(r[i])) {
      if (!(isnan(h[i]) && isnan(r[i])) && h[i] != r[i] && !bad++) first_bad = i;
      continue;
    }
    double e = (double)h[i] - r[i];
    num += e * e, den += (double)r[i] * r[i];
    if (fabs(e) > maxd) maxd = fabs(e), worst = i;
  }
  if (den < terms * terms) den = terms * terms;
  double nerr = den > 1e-30 ? sqrt(num / den) : sqrt(num); // an all-zero reference: absolute
  int ok = !bad && (tol == 0 ? maxd == 0 : nerr <= tol);
  printf("  %-40s n=%-8zu nerr %.2e  max|diff| %.2e  %s\n", what, n, nerr, maxd,
         ok ? "ok" : "FAILED");
  if (bad)
    printf("    %zu non-finite mismatches (NaN: maybe never written), the first at [%zu]: "
           "gpu %.9g, cpu %.9g\n", bad, first_bad, h[first_bad], r[first_bad]);
  else if (!ok)
    printf("    the largest difference at [%zu]: gpu %.9g, cpu %.9g\n", worst, h[worst], r[worst]);
  checks++;
  if (!ok) failures++;
  free(h);
}
static void check(const char *what, const float *g, const float *r, size_t n, double tol) {
  check_scaled(what, g, r, n, tol, 0.0);
}

static const char *act_names[] = {
#define KDRT_X(name, kname, from_x, f, df) kname,
    KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
};

static void check_elementwise(void) {
  const size_t n = 10007;
  float *hx = hrand(n, -4, 4), *hdy = hrand(n, -1, 1), *hy = hzero(n), *hdx = hzero(n);
  float *x = dev(hx, n), *dy = dev(hdy, n), *y = kdrt_cuda_alloc(n), *dx = kdrt_cuda_alloc(n);
  char name[64];
  for (int a = 0; a < KDRT_ACT_COUNT; a++) {
    kdrt_act(a, hy, hx, n);
    poison(y, n);
    kdrt_cuda_act(D, a, y, x, n);
    snprintf(name, sizeof name, "act %s", act_names[a]);
    check(name, y, hy, n, 1e-6);
    kdrt_act_grad(a, hdx, hdy, hx, hy, n);
    float *yd = dev(hy, n); // the CPU's y, so only the gradient is compared
    poison(dx, n);
    kdrt_cuda_act_grad(D, a, dx, dy, x, yd, n);
    snprintf(name, sizeof name, "act_grad %s", act_names[a]);
    check(name, dx, hdx, n, 1e-6);
    kdrt_cuda_free(yd);
  }
  // add of three, scale
  float *hb = hrand(n, -1, 1), *hc = hrand(n, -1, 1), *ref = hzero(n);
  float *b = dev(hb, n), *cc = dev(hc, n);
  for (size_t i = 0; i < n; i++) ref[i] = hx[i] + hb[i] + hc[i];
  const float *ins[3] = {x, b, cc};
  poison(y, n);
  kdrt_cuda_add(D, y, ins, 3, n);
  check("add (3 operands)", y, ref, n, 0);
  for (size_t i = 0; i < n; i++) ref[i] = hx[i] * 0.00392156886f + -1.0f;
  poison(y, n);
  kdrt_cuda_scale(D, y, x, n, 0.00392156886f, -1.0f);
  check("scale", y, ref, n, 1e-7);
  kdrt_mul(ref, hx, hb, n);
  poison(y, n);
  kdrt_cuda_mul(D, y, x, b, n);
  check("mul", y, ref, n, 0);
  poison(y, n);
  kdrt_cuda_copy(D, y, b, n);
  check("copy", y, hb, n, 0);
  // issue 11: maximum and minimum, a tie in every operand pair (x with itself)
  for (int min = 0; min < 2; min++) {
    kdrt_maximum(ref, hx, hb, 0, min, n);
    poison(y, n);
    kdrt_cuda_maximum(D, y, x, b, 0, min, n);
    check(min ? "minimum" : "maximum", y, ref, n, 0);
    kdrt_maximum_grad(ref, hdy, hx, min ? hx : hb, 0.5f, min, n);
    poison(y, n);
    kdrt_cuda_maximum_grad(D, y, dy, x, min ? x : b, 0.5f, min, n);
    check(min ? "minimum_grad (ties)" : "maximum_grad", y, ref, n, 0);
    kdrt_maximum(ref, hx, NULL, 0.5f, min, n);
    poison(y, n);
    kdrt_cuda_maximum(D, y, x, NULL, 0.5f, min, n);
    check("maximum by a constant", y, ref, n, 0);
  }
  // issue 23: rounding to bfloat16 and float16 (kdrt_round.h on both sides),
  // bit for bit, on values spread over float16's range, its subnormals and
  // past its largest (x scaled by powers of 2 from 2^-30 to 2^17)
  for (size_t i = 0; i < n; i++) hb[i] = ldexpf(hx[i], (int)(i % 48) - 30);
  kdrt_cuda_upload(D, b, hb, n);
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    kdrt_round(kind, ref, hb, n);
    poison(y, n);
    kdrt_cuda_round(D, kind, y, b, n);
    check(kind == KDRT_ROUND_F16 ? "round float16" : "round bfloat16", y, ref, n, 0);
    // its storage in 16 bits: the rounded values packed and unpacked on the
    // GPU, and the CPU's 16 bits unpacked there, give them back bit for bit
    float *rd = dev(ref, n), *pk = kdrt_cuda_alloc((n + 1) / 2), *hpk = hzero((n + 1) / 2);
    poison(pk, (n + 1) / 2);
    kdrt_cuda_pack16(D, kind, (uint16_t *)pk, rd, n);
    poison(y, n);
    kdrt_cuda_unpack16(D, kind, y, (const uint16_t *)pk, n);
    check(kind == KDRT_ROUND_F16 ? "pack16, unpack16 float16" : "pack16, unpack16 bfloat16", y,
          ref, n, 0);
    kdrt_pack16(kind, (uint16_t *)hpk, ref, n);
    kdrt_cuda_upload(D, pk, hpk, (n + 1) / 2);
    poison(y, n);
    kdrt_cuda_unpack16(D, kind, y, (const uint16_t *)pk, n);
    check(kind == KDRT_ROUND_F16 ? "unpack16 float16 (the CPU's bits)"
                                 : "unpack16 bfloat16 (the CPU's bits)", y, ref, n, 0);
    kdrt_cuda_free(rd), kdrt_cuda_free(pk), free(hpk);
  }
  // issue 22: the same kernels on buffers one float off 16-byte alignment
  // (one float a thread; above: float4s and a tail of 3), and in place
  {
    size_t m = n - 1;
    kdrt_cuda_upload(D, b, hb, n);
    kdrt_act(KDRT_ACT_GELU, hy, hx + 1, m);
    poison(y + 1, m);
    kdrt_cuda_act(D, KDRT_ACT_GELU, y + 1, x + 1, m);
    check("act gelu (unaligned)", y + 1, hy, m, 1e-6);
    kdrt_act_grad(KDRT_ACT_GELU, hdx, hdy + 1, hx + 1, hy, m);
    poison(dx + 1, m);
    kdrt_cuda_act_grad(D, KDRT_ACT_GELU, dx + 1, dy + 1, x + 1, y + 1, m);
    check("act_grad gelu (unaligned)", dx + 1, hdx, m, 1e-6);
    kdrt_act_grad(KDRT_ACT_TANH, hdx, hdy + 1, hx + 1, hb + 1, m); // reads y only
    poison(dx + 1, m);
    kdrt_cuda_act_grad(D, KDRT_ACT_TANH, dx + 1, dy + 1, NULL, b + 1, m);
    check("act_grad tanh (unaligned)", dx + 1, hdx, m, 1e-6);
    for (size_t i = 0; i < m; i++) ref[i] = hx[i + 1] + hb[i + 1];
    const float *ins2[2] = {x + 1, b + 1};
    poison(y + 1, m);
    kdrt_cuda_add(D, y + 1, ins2, 2, m);
    check("add (unaligned)", y + 1, ref, m, 0);
    kdrt_mul(ref, hx + 1, hb + 1, m);
    poison(y + 1, m);
    kdrt_cuda_mul(D, y + 1, x + 1, b + 1, m);
    check("mul (unaligned)", y + 1, ref, m, 0);
    for (size_t i = 0; i < m; i++) ref[i] = hx[i + 1] * 0.5f + 2.0f;
    poison(y + 1, m);
    kdrt_cuda_scale(D, y + 1, x + 1, m, 0.5f, 2.0f);
    check("scale (unaligned)", y + 1, ref, m, 0);
    // in place, float4s: y = gelu(y); dx = dy * gelu'(x) into dy
    kdrt_act(KDRT_ACT_GELU, hy, hx, n);
    kdrt_cuda_upload(D, y, hx, n);
    kdrt_cuda_act(D, KDRT_ACT_GELU, y, y, n);
    check("act gelu (in place)", y, hy, n, 1e-6);
    kdrt_act_grad(KDRT_ACT_GELU, hdx, hdy, hx, hy, n);
    kdrt_cuda_upload(D, dx, hdy, n);
    kdrt_cuda_act_grad(D, KDRT_ACT_GELU, dx, dx, x, y, n);
    check("act_grad gelu (in place)", dx, hdx, n, 1e-6);
    for (size_t i = 0; i < n; i++) ref[i] = hx[i] + hb[i];
    kdrt_cuda_upload(D, y, hx, n);
    const float *ins3[2] = {y, b};
    kdrt_cuda_add(D, y, ins3, 2, n);
    check("add (in place)", y, ref, n, 0);
  }
  kdrt_cuda_free(b), kdrt_cuda_free(cc), free(hb), free(hc), free(ref);
  kdrt_cuda_free(x), kdrt_cuda_free(dy), kdrt_cuda_free(y), kdrt_cuda_free(dx);
  free(hx), free(hdy), free(hy), free(hdx);
}

// issues 22, 23: the _rnd kernels (kdrt_ops.def), which round their result
// to bfloat16 or float16 as they store it (kdcc's fuse_rounds folds a ROUND
// into them): each must equal, bit for bit, its plain kernel followed by
// the round kernel on the GPU (the pass it replaces), and the CPU's _rnd
// kernel within the plain kernel's tolerance (bit for bit where the plain
// kernel is: add, a linear bias); on aligned buffers and one float off
// alignment, and in place.
static void check_rnd_pair(const char *what, int kind, const float *fused, float *plain,
                           const float *cpu, size_t n, double tol) {
  char name[96];
  kdrt_cuda_round(D, kind, plain, plain, n);
  float *h = hzero(n);
  kdrt_cuda_download(D, h, plain, n);
  const char *t = kind == KDRT_ROUND_F16 ? "float16" : "bfloat16";
  snprintf(name, sizeof name, "%s %s = round(plain)", what, t);
  check(name, fused, h, n, 0);
  snprintf(name, sizeof name, "%s %s", what, t);
  check(name, fused, cpu, n, tol);
  free(h);
}

static void check_rnd(void) {
  const int64_t rows = 301, cols = 68; // cols % 4 == 0: float4s; off by one float: scalars
  const size_t n = (size_t)(rows * cols);
  float *hx = hrand(n, -4, 4), *hb = hrand(n, -1, 1), *hdy = hrand(n, -1, 1), *ref = hzero(n);
  float *hg = hrand((size_t)cols, 0.5f, 1.5f), *hbias = hrand((size_t)cols, -1, 1);
  for (size_t i = 0; i < n; i += 7) hx[i] = ldexpf(hx[i], (int)(i % 40) - 20); // float16's range
  float *x = dev(hx, n), *b = dev(hb, n), *dy = dev(hdy, n), *g = dev(hg, (size_t)cols);
  float *bias = dev(hbias, (size_t)cols);
  float *y = kdrt_cuda_alloc(n), *p = kdrt_cuda_alloc(n);
  uint16_t *hv = (uint16_t *)malloc(n * sizeof *hv);
  float *v16 = kdrt_cuda_alloc((n + 1) / 2);
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    for (int off = 0; off < 2; off++) { // aligned, then one float off
      size_t m = n - off;
      const float *ins[2] = {x + off, b + off}, *hins[2] = {hx + off, hb + off};
      kdrt_add_rnd(kind, ref, hins, 2, m);
      poison(y + off, m);
      kdrt_cuda_add_rnd(D, kind, y + off, ins, 2, m);
      kdrt_cuda_add(D, p + off, ins, 2, m);
      check_rnd_pair(off ? "add_rnd (unaligned)" : "add_rnd", kind, y + off, p + off, ref, m, 0);
      kdrt_act_rnd(kind, KDRT_ACT_GELU, ref, hx + off, m);
      poison(y + off, m);
      kdrt_cuda_act_rnd(D, kind, KDRT_ACT_GELU, y + off, x + off, m);
      kdrt_cuda_act(D, KDRT_ACT_GELU, p + off, x + off, m);
      check_rnd_pair(off ? "act_rnd gelu (unaligned)" : "act_rnd gelu", kind, y + off, p + off,
                     ref, m, 1e-2);
      kdrt_act_grad_rnd(kind, KDRT_ACT_GELU, ref, hdy + off, hx + off, NULL, m);
      poison(y + off, m);
      kdrt_cuda_act_grad_rnd(D, kind, KDRT_ACT_GELU, y + off, dy + off, x + off, NULL, m);
      kdrt_cuda_act_grad(D, KDRT_ACT_GELU, p + off, dy + off, x + off, NULL, m);
      check_rnd_pair(off ? "act_grad_rnd gelu (unaligned)" : "act_grad_rnd gelu", kind, y + off,
                     p + off, ref, m, 1e-2);
    }
    kdrt_act_rnd(kind, KDRT_ACT_LINEAR, ref, hx, n); // a linear act: a copy, rounded
    kdrt_cuda_upload(D, y, hx, n);
    kdrt_cuda_act_rnd(D, kind, KDRT_ACT_LINEAR, y, y, n);
    kdrt_cuda_act(D, KDRT_ACT_LINEAR, p, x, n);
    check_rnd_pair("act_rnd linear (in place)", kind, y, p, ref, n, 0);
    // the saved value in its 16 bits (store16.c), as act_grad16 reads it
    kdrt_round(kind, ref, hx, n);
    kdrt_pack16(kind, hv, ref, n);
    kdrt_cuda_upload(D, v16, (const float *)hv, (n + 1) / 2);
    kdrt_act_grad16_rnd(kind, KDRT_ACT_RELU, kind, ref, hdy, hv, n);
    poison(y, n);
    kdrt_cuda_act_grad16_rnd(D, kind, KDRT_ACT_RELU, kind, y, dy, (const uint16_t *)v16, n);
    kdrt_cuda_act_grad16(D, KDRT_ACT_RELU, kind, p, dy, (const uint16_t *)v16, n);
    check_rnd_pair("act_grad16_rnd relu", kind, y, p, ref, n, 0);
    for (int a = KDRT_ACT_LINEAR; a <= KDRT_ACT_RELU; a++) { // linear: exact; relu: exact
      kdrt_bias_act_rnd(kind, a, ref, hx, hbias, rows, cols);
      poison(y, n);
      kdrt_cuda_bias_act_rnd(D, kind, a, y, x, bias, rows, cols);
      kdrt_cuda_bias_act(D, a, p, x, bias, rows, cols);
      check_rnd_pair(a == KDRT_ACT_LINEAR ? "bias_act_rnd linear" : "bias_act_rnd relu", kind, y,
                     p, ref, n, 0);
    }
    kdrt_layer_norm_rnd(kind, 0, ref, hx, hg, hbias, rows, cols, 1e-3f);
    poison(y, n);
    kdrt_cuda_layer_norm_rnd(D, kind, 0, y, x, g, bias, rows, cols, 1e-3f);
    kdrt_cuda_layer_norm(D, 0, p, x, g, bias, rows, cols, 1e-3f);
    check_rnd_pair("layer_norm_rnd", kind, y, p, ref, n, 1e-2);
    kdrt_bias_grad_rnd(kind, ref, hx, rows, cols); // (sums in another order: not bit for bit)
    poison(y, (size_t)cols);
    kdrt_cuda_bias_grad_rnd(D, kind, y, x, rows, cols);
    kdrt_cuda_bias_grad(D, p, x, rows, cols);
    check_rnd_pair("bias_grad_rnd", kind, y, p, ref, (size_t)cols, 1e-2);
  }
  kdrt_cuda_free(x), kdrt_cuda_free(b), kdrt_cuda_free(dy), kdrt_cuda_free(g);
  kdrt_cuda_free(bias), kdrt_cuda_free(y), kdrt_cuda_free(p), kdrt_cuda_free(v16);
  free(hx), free(hb), free(hdy), free(ref), free(hg), free(hbias), free(hv);
}

static void check_bias(void) {
  const int64_t rows = 333, cols = 37;
  size_t n = (size_t)(rows * cols);
  float *hx = hrand(n, -3, 3), *hb = hrand((size_t)cols, -1, 1), *ref = hzero(n);
  float *x = dev(hx, n), *b = dev(hb, (size_t)cols), *y = kdrt_cuda_alloc(n);
  char name[64];
  for (int a = 0; a < KDRT_ACT_COUNT; a++) {
    kdrt_bias_act(a, ref, hx, hb, rows, cols);
    poison(y, n);
    kdrt_cuda_bias_act(D, a, y, x, b, rows, cols);
    snprintf(name, sizeof name, "bias_act %s", act_names[a]);
    check(name, y, ref, n, 1e-6);
  }
  float *gref = hzero((size_t)cols);
  kdrt_bias_grad(gref, hx, rows, cols);
  poison(y, n);
  kdrt_cuda_bias_grad(D, y, x, rows, cols);
  check("bias_grad", y, gref, (size_t)cols, 1e-6);
  kdrt_cuda_free(x), kdrt_cuda_free(b), kdrt_cuda_free(y);
  free(hx), free(hb), free(ref), free(gref);
  // one chunk of rows; many (the rows cut over blocks, the sums added in
  // order); issue 22: float4 columns (cols % 4 == 0) or not, the GPT's
  // shapes, an `in` off 16-byte alignment (the third number: 1)
  static const int64_t shapes[][3] = {{40, 700, 0},    {5000, 300, 0},  {3001, 67, 0},
                                      {4096, 768, 0},  {4096, 3072, 0}, {512, 256, 1},
                                      {7, 4, 0},       {1, 1000, 0}};
  for (int k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++) {
    int64_t r = shapes[k][0], cn = shapes[k][1], off = shapes[k][2];
    float *hg = hrand((size_t)(r * cn), -1, 1), *g0 = kdrt_cuda_alloc((size_t)(r * cn + off));
    float *g = g0 + off;
    kdrt_cuda_upload(D, g, hg, (size_t)(r * cn));
    float *sref = hzero((size_t)cn), *sy = kdrt_cuda_alloc((size_t)cn);
    kdrt_bias_grad(sref, hg, r, cn);
    poison(sy, (size_t)cn);
    kdrt_cuda_bias_grad(D, sy, g, r, cn);
    snprintf(name, sizeof name, "bias_grad [%lld, %lld]%s", (long long)r, (long long)cn,
             off ? " unaligned" : "");
    // 5000 rows summed in another order than the CPU's one running float
    // sum: both are off the exact sums by about sqrt(rows) * 2^-24 of the
    // partial sums (the first GPU run: 1.5e-6), so the bound grows with rows.
    check(name, sy, sref, (size_t)cn, 1e-6 * sqrt((double)r / 256));
    kdrt_cuda_free(g0), kdrt_cuda_free(sy), free(hg), free(sref);
  }
  // issue 22: bias_act in float4s (cols % 4 == 0), every activation; the
  // GPT's shape
  static const int64_t ashapes[][2] = {{129, 68}, {4096, 768}};
  for (int k = 0; k < 2; k++) {
    int64_t r = ashapes[k][0], cn = ashapes[k][1];
    size_t an = (size_t)(r * cn);
    float *hax = hrand(an, -3, 3), *hab = hrand((size_t)cn, -1, 1), *aref = hzero(an);
    float *ax = dev(hax, an), *ab = dev(hab, (size_t)cn), *ay = kdrt_cuda_alloc(an);
    for (int a = 0; a < KDRT_ACT_COUNT; a++) {
      if (k && a != KDRT_ACT_LINEAR && a != KDRT_ACT_GELU) continue;
      kdrt_bias_act(a, aref, hax, hab, r, cn);
      poison(ay, an);
      kdrt_cuda_bias_act(D, a, ay, ax, ab, r, cn);
      snprintf(name, sizeof name, "bias_act %s [%lld, %lld]", act_names[a], (long long)r,
               (long long)cn);
      check(name, ay, aref, an, 1e-6);
    }
    // norm.cu's col_mul, the same kernel shape (check_norm: cols % 4 != 0)
    kdrt_col_mul(aref, hax, hab, r, cn);
    poison(ay, an);
    kdrt_cuda_col_mul(D, ay, ax, ab, r, cn);
    snprintf(name, sizeof name, "col_mul [%lld, %lld]", (long long)r, (long long)cn);
    check(name, ay, aref, an, 0);
    kdrt_cuda_free(ax), kdrt_cuda_free(ab), kdrt_cuda_free(ay);
    free(hax), free(hab), free(aref);
  }
}

// issue 25: Keras's LayerNormalization in one op each way (layer_norm,
// layer_norm_dx, layer_norm_dw) on rows of 768 and 4096 (float4 loads),
// odd ones (one float a lane), with and without g and b, and RMS; x off
// zero so the mean matters. dw's column sums: float sums in other orders,
// the bound growing with the rows as bias_grad's.
static void check_layer_norm(void) {
  static const int64_t shapes[][2] = {{301, 67}, {64, 768}, {17, 4096}, {1100, 33}, {5, 3}};
  char name[96];
  for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
    const int64_t rows = shapes[t][0], cols = shapes[t][1];
    size_t n = (size_t)(rows * cols);
    float *hx = hrand(n, -2, 4), *hdy = hrand(n, -1, 1), *hg = hrand((size_t)cols, 0.5f, 1.5f);
    float *hb = hrand((size_t)cols, -1, 1), *ref = hzero(n), *cref = hzero((size_t)(2 * cols));
    float *x = dev(hx, n), *dy = dev(hdy, n), *g = dev(hg, (size_t)cols);
    float *b = dev(hb, (size_t)cols);
    float *y = kdrt_cuda_alloc(n), *cs = kdrt_cuda_alloc((size_t)(2 * cols));
    for (int v = 0; v < 4; v++) { // g and b; g; b; RMS with g
      int rms = v == 3;
      const float *hgv = v == 2 ? NULL : hg, *hbv = v == 0 || v == 2 ? hb : NULL;
      const float *gv = hgv ? g : NULL, *bv = hbv ? b : NULL;
      const char *what = v == 0 ? "g, b" : v == 1 ? "g" : v == 2 ? "b" : "rms, g";
      kdrt_layer_norm(rms, ref, hx, hgv, hbv, rows, cols, 1e-3f);
      poison(y, n);
      kdrt_cuda_layer_norm(D, rms, y, x, gv, bv, rows, cols, 1e-3f);
      snprintf(name, sizeof name, "layer_norm %s [%lld, %lld]", what, (long long)rows,
               (long long)cols);
      check(name, y, ref, n, 1e-6);
      kdrt_layer_norm_dx(rms, ref, hdy, hx, hgv, rows, cols, 1e-3f);
      poison(y, n);
      kdrt_cuda_layer_norm_dx(D, rms, y, dy, x, gv, rows, cols, 1e-3f);
      snprintf(name, sizeof name, "layer_norm_dx %s [%lld, %lld]", what, (long long)rows,
               (long long)cols);
      check(name, y, ref, n, 1e-5);
      // d g and d b (v 0), d g alone (1, 3), d b alone (2)
      float *dg = v == 2 ? NULL : cs, *db = v == 0 ? cs + cols : v == 2 ? cs : NULL;
      kdrt_layer_norm_dw(rms, v == 2 ? NULL : cref, v == 0 ? cref + cols : v == 2 ? cref : NULL,
                         hdy, hx, rows, cols, 1e-3f);
      poison(cs, (size_t)(2 * cols));
      kdrt_cuda_layer_norm_dw(D, rms, dg, db, dy, x, rows, cols, 1e-3f);
      snprintf(name, sizeof name, "layer_norm_dw %s [%lld, %lld]", what, (long long)rows,
               (long long)cols);
      double r = rows < 256 ? 256 : (double)rows;
      check(name, cs, cref, (size_t)(v == 0 ? 2 * cols : cols), 2e-6 * sqrt(r / 256));
    }
    kdrt_cuda_free(x), kdrt_cuda_free(dy), kdrt_cuda_free(g), kdrt_cuda_free(b);
    kdrt_cuda_free(y), kdrt_cuda_free(cs);
    free(hx), free(hdy), free(hg), free(hb), free(ref), free(cref);
  }
}

// layer and RMS norm and their gradients, the scale over trailing dims,
// the causal mask (a block with offsets), the zero-padded block and the
// rotary embedding (issue 24).
static void check_norm(void) {
  const int64_t rows = 301, cols = 67;
  size_t n = (size_t)(rows * cols);
  float *hx = hrand(n, -3, 3), *hdy = hrand(n, -1, 1), *hg = hrand((size_t)cols, -1, 1);
  float *ref = hzero(n), *x = dev(hx, n), *dy = dev(hdy, n), *g = dev(hg, (size_t)cols);
  float *y = kdrt_cuda_alloc(n);
  char pname[64];
  for (int rms = 0; rms < 2; rms++) {
    kdrt_norm(rms, ref, hx, rows, cols, 1e-3f);
    poison(y, n);
    kdrt_cuda_norm(D, rms, y, x, rows, cols, 1e-3f);
    check(rms ? "norm rms" : "norm", y, ref, n, 1e-6);
    kdrt_norm_grad(rms, ref, hdy, hx, rows, cols, 1e-3f);
    poison(y, n);
    kdrt_cuda_norm_grad(D, rms, y, dy, x, rows, cols, 1e-3f);
    check(rms ? "norm_grad rms" : "norm_grad", y, ref, n, 1e-5);
  }
  kdrt_col_mul(ref, hx, hg, rows, cols);
  poison(y, n);
  kdrt_cuda_col_mul(D, y, x, g, rows, cols);
  check("col_mul", y, ref, n, 0);
  // issue 15: batch norm: the statistics (3 kinds), the normalization with
  // an activation, the gradient from the CPU's own statistics
  {
    float *hm = hrand((size_t)cols, -1, 1), *hv = hrand((size_t)cols, 0.1f, 2);
    float *hb = hrand((size_t)cols, -1, 1), *hs = hzero((size_t)(2 * cols));
    float *m = dev(hm, (size_t)cols), *v = dev(hv, (size_t)cols), *b = dev(hb, (size_t)cols);
    float *s = kdrt_cuda_alloc((size_t)(2 * cols)), *sref = hzero((size_t)(2 * cols));
    kdrt_bn_stats(sref, hx, NULL, NULL, rows, cols);
    poison(s, (size_t)(2 * cols));
    kdrt_cuda_bn_stats(D, s, x, NULL, NULL, rows, cols);
    check("bn_stats sum", s, sref, (size_t)cols, 1e-6);
    kdrt_bn_stats(sref, hx, hm, NULL, rows, cols);
    poison(s, (size_t)(2 * cols));
    kdrt_cuda_bn_stats(D, s, x, m, NULL, rows, cols);
    check("bn_stats squares", s, sref, (size_t)cols, 1e-6);
    kdrt_bn_stats(sref, hx, hm, hdy, rows, cols);
    poison(s, (size_t)(2 * cols));
    kdrt_cuda_bn_stats(D, s, x, m, dy, rows, cols);
    check("bn_stats with dy", s, sref, (size_t)(2 * cols), 1e-6);
    for (int a = 0; a < 2; a++) {
      int act = a ? KDRT_ACT_RELU : KDRT_ACT_LINEAR;
      kdrt_batch_norm(act, ref, hx, hm, hv, hg, hb, rows, cols, 1e-3f);
      poison(y, n);
      kdrt_cuda_batch_norm(D, act, y, x, m, v, g, b, rows, cols, 1e-3f);
      check(a ? "batch_norm relu" : "batch_norm", y, ref, n, 1e-6);
    }
    for (int64_t j = 0; j < 2 * cols; j++) hs[j] = sref[j];
    float *sd = dev(hs, (size_t)(2 * cols));
    kdrt_bn_grad(ref, hdy, hx, hm, hv, hg, hs, rows, cols, 1e-3f, 2.0 * rows);
    poison(y, n);
    kdrt_cuda_bn_grad(D, y, dy, x, m, v, g, sd, rows, cols, 1e-3f, 2.0 * rows);
    check("bn_grad", y, ref, n, 1e-6);
    kdrt_cuda_free(m), kdrt_cuda_free(v), kdrt_cuda_free(b), kdrt_cuda_free(s), kdrt_cuda_free(sd);
    free(hm), free(hv), free(hb), free(hs), free(sref);
  }
  // a convolution's statistics: many rows, few channels (the rows cut into chunks)
  {
    const int64_t br = 20000, bc = 24;
    size_t bn = (size_t)(br * bc);
    float *hbx = hrand(bn, -2, 2), *hbd = hrand(bn, -1, 1), *hbm = hrand((size_t)bc, -1, 1);
    float *bx = dev(hbx, bn), *bd = dev(hbd, bn), *bm = dev(hbm, (size_t)bc);
    float *bs = kdrt_cuda_alloc((size_t)(2 * bc)), *bref = hzero((size_t)(2 * bc));
    kdrt_bn_stats(bref, hbx, hbm, hbd, br, bc);
    poison(bs, (size_t)(2 * bc));
    kdrt_cuda_bn_stats(D, bs, bx, bm, bd, br, bc);
    check("bn_stats with dy [20000, 24]", bs, bref, (size_t)(2 * bc), 1e-6);
    kdrt_bn_stats(bref, hbx, NULL, NULL, br, bc);
    poison(bs, (size_t)(2 * bc));
    kdrt_cuda_bn_stats(D, bs, bx, NULL, NULL, br, bc);
    check("bn_stats sum [20000, 24]", bs, bref, (size_t)bc, 1e-6);
    kdrt_cuda_free(bx), kdrt_cuda_free(bd), kdrt_cuda_free(bm), kdrt_cuda_free(bs);
    free(hbx), free(hbd), free(hbm), free(bref);
  }
  // scores [7, 43, 67] as a block starting at query 5, key 11 of a bigger matrix
  kdrt_causal_mask(ref, hx, 7, 43, 67, 5, 11, 0, KDRT_MASKED);
  poison(y, n);
  kdrt_cuda_causal_mask(D, y, x, 7, 43, 67, 5, 11, 0, KDRT_MASKED);
  check("causal_mask", y, ref, n, 0);
  kdrt_causal_mask(ref, hx, 7, 43, 67, 5, 11, 0, 0.0f);
  poison(y, n);
  kdrt_cuda_causal_mask(D, y, x, 7, 43, 67, 5, 11, 0, 0.0f);
  check("causal_mask (gradient)", y, ref, n, 0);
  kdrt_causal_mask(ref, hx, 7, 43, 67, 5, 11, 9, KDRT_MASKED); // a sliding window of 9
  poison(y, n);
  kdrt_cuda_causal_mask(D, y, x, 7, 43, 67, 5, 11, 9, KDRT_MASKED);
  check("causal_mask (sliding window)", y, ref, n, 0);
  // issue 10: scores [3, 7 heads, 500] under a mask [3, 500], float then int32, a third zero
  {
    const size_t nm = 3 * 500;
    float *hmf = hrand(nm, -1, 1);
    int32_t *hmi = (int32_t *)malloc(nm * sizeof(int32_t));
    for (size_t i = 0; i < nm; i++) {
      if (i % 3 == 0) hmf[i] = 0;
      hmi[i] = hmf[i] != 0;
    }
    float *mf = dev(hmf, nm), *mi = dev((const float *)hmi, nm);
    kdrt_attention_mask(ref, hx, hmf, 0, 3, 7, 500, 500, KDRT_MASKED);
    poison(y, n);
    kdrt_cuda_attention_mask(D, y, x, mf, 0, 3, 7, 500, 500, KDRT_MASKED);
    check("attention_mask", y, ref, 3 * 7 * 500, 0);
    kdrt_attention_mask(ref, hx, hmi, 1, 3, 7, 500, 500, 0.0f);
    poison(y, n);
    kdrt_cuda_attention_mask(D, y, x, mi, 1, 3, 7, 500, 500, 0.0f);
    check("attention_mask (int32, gradient)", y, ref, 3 * 7 * 500, 0);
    // a padding mask over 20 keys: scores [3, 7, 25 x 20], the mask [3, 20]
    kdrt_attention_mask(ref, hx, hmi, 1, 3, 7, 500, 20, KDRT_MASKED);
    poison(y, n);
    kdrt_cuda_attention_mask(D, y, x, mi, 1, 3, 7, 500, 20, KDRT_MASKED);
    check("attention_mask (keys' padding)", y, ref, 3 * 7 * 500, 0);
    kdrt_cuda_free(mf), kdrt_cuda_free(mi);
    free(hmf), free(hmi);
  }
  // [rows, 20, cols/...]: a block of 20 rows placed at row 7 of 31, zeros elsewhere
  size_t np = (size_t)(3 * 31 * 5);
  float *pref = hzero(np), *py = kdrt_cuda_alloc(np);
  kdrt_pad_block(pref, hx, 3, 20, 7, 31, 5);
  poison(py, np);
  kdrt_cuda_pad_block(D, py, x, 3, 20, 7, 31, 5);
  check("pad_block", py, pref, np, 0);
  // issue 24: rotary embedding of [3, 41, 5, 2h] at positions from 4000 (angles in the
  // thousands), h = 16 and 64 (Llama's head), forward and its transpose, and in place
  for (int64_t h = 16; h <= 64; h *= 4) {
    kdrt_rotary r = {};
    r.half = h, r.scale = h == 16 ? 1.0f : 1.1f;
    for (int64_t j = 0; j < h; j++) r.inv_freq[j] = (float)pow(10000.0, -(double)j / (double)h);
    const int64_t inner = h == 16 ? 5 : 1, t = 41;
    size_t nr = (size_t)(3 * t * inner * 2 * h);
    for (int inv = 0; inv < 2; inv++) {
      kdrt_rope(ref, hx, &r, 3, t, inner, 4000, inv);
      poison(y, nr);
      kdrt_cuda_rope(D, y, x, &r, 3, t, inner, 4000, inv);
      snprintf(pname, sizeof pname, "rope h=%lld%s", (long long)h, inv ? " (gradient)" : "");
      check(pname, y, ref, nr, 1e-6);
    }
    kdrt_cuda_upload(D, y, hx, nr);
    kdrt_cuda_rope(D, y, y, &r, 3, t, inner, 4000, 0);
    kdrt_rope(ref, hx, &r, 3, t, inner, 4000, 0);
    snprintf(pname, sizeof pname, "rope h=%lld (in place)", (long long)h);
    check(pname, y, ref, nr, 1e-6);
  }
  kdrt_cuda_free(x), kdrt_cuda_free(dy), kdrt_cuda_free(g), kdrt_cuda_free(y), kdrt_cuda_free(py);
  free(hx), free(hdy), free(hg), free(ref), free(pref);
}

static void check_softmax(void) {
  const int64_t rows = 77, cols = 301;
  size_t n = (size_t)(rows * cols);
  float *hx = hrand(n, -6, 6), *hdy = hrand(n, -1, 1), *hy = hzero(n), *hdx = hzero(n);
  float *x = dev(hx, n), *dy = dev(hdy, n), *y = kdrt_cuda_alloc(n), *dx = kdrt_cuda_alloc(n);
  // softmax, then (issue 25) log_softmax, each way
  static const struct {
    const char *name, *grad_name;
    void (*f)(float *, const float *, int64_t, int64_t);
    void (*df)(float *, const float *, const float *, int64_t, int64_t);
    void (*cf)(kdrt_cuda *, float *, const float *, int64_t, int64_t);
    void (*cdf)(kdrt_cuda *, float *, const float *, const float *, int64_t, int64_t);
  } fns[] = {
    {"softmax", "softmax_grad", kdrt_softmax, kdrt_softmax_grad, kdrt_cuda_softmax,
     kdrt_cuda_softmax_grad},
    {"log_softmax", "log_softmax_grad", kdrt_log_softmax, kdrt_log_softmax_grad,
     kdrt_cuda_log_softmax, kdrt_cuda_log_softmax_grad},
  };
  float *yd = NULL;
  for (size_t k = 0; k < sizeof fns / sizeof *fns; k++) {
    fns[k].f(hy, hx, rows, cols);
    poison(y, n);
    fns[k].cf(D, y, x, rows, cols);
    check(fns[k].name, y, hy, n, 1e-6);
    fns[k].df(hdx, hdy, hy, rows, cols);
    if (yd) kdrt_cuda_free(yd);
    yd = dev(hy, n);
    poison(dx, n);
    fns[k].cdf(D, dx, dy, yd, rows, cols);
    check(fns[k].grad_name, dx, hdx, n, 1e-5);
  }
  // attention's scores [7, 11, 301] with a scale folded in, causal or not,
  // as the block of queries from position 40 (keys past a query: masked)
  // and from 0 (most keys masked, the first query one key)
  char name[96];
  static const int64_t starts[] = {40, 0};
  for (int k = 0; k < 4; k++) {
    int causal = k & 1;
    int64_t t0 = starts[k >> 1], outer = 7, t = 11;
    kdrt_attn_softmax(hy, hx, outer, t, cols, t0, 0.125f, causal);
    poison(y, n);
    kdrt_cuda_attn_softmax(D, y, x, outer, t, cols, t0, 0.125f, causal);
    snprintf(name, sizeof name, "attn_softmax t0 %lld%s", (long long)t0, causal ? " causal" : "");
    check(name, y, hy, n, 1e-6);
    kdrt_attn_softmax_grad(hdx, hdy, hy, outer, t, cols, t0, 0.125f, causal);
    float *ya = dev(hy, n);
    poison(dx, n);
    kdrt_cuda_attn_softmax_grad(D, dx, dy, ya, outer, t, cols, t0, 0.125f, causal);
    snprintf(name, sizeof name, "attn_softmax_grad t0 %lld%s", (long long)t0,
             causal ? " causal" : "");
    check(name, dx, hdx, n, 1e-5);
    kdrt_cuda_free(ya);
  }
  kdrt_cuda_free(x), kdrt_cuda_free(dy), kdrt_cuda_free(y), kdrt_cuda_free(dx), kdrt_cuda_free(yd);
  free(hx), free(hdy), free(hy), free(hdx);
}

// issue 25: glu each way on x[77, 2 * 301] (halves off 16-byte alignment)
static void check_glu(void) {
  const int64_t rows = 77, cols = 301;
  size_t n = (size_t)(rows * cols);
  float *hx = hrand(2 * n, -6, 6), *hdy = hrand(n, -1, 1), *hy = hzero(n), *hdx = hzero(2 * n);
  float *x = dev(hx, 2 * n), *dy = dev(hdy, n), *y = kdrt_cuda_alloc(n);
  float *dx = kdrt_cuda_alloc(2 * n);
  kdrt_glu(hy, hx, rows, cols);
  poison(y, n);
  kdrt_cuda_glu(D, y, x, rows, cols);
  check("glu", y, hy, n, 1e-6);
  kdrt_glu_grad(hdx, hdy, hx, rows, cols);
  poison(dx, 2 * n);
  kdrt_cuda_glu_grad(D, dx, dy, x, rows, cols);
  check("glu_grad", dx, hdx, 2 * n, 1e-6);
  kdrt_cuda_free(x), kdrt_cuda_free(dy), kdrt_cuda_free(y), kdrt_cuda_free(dx);
  free(hx), free(hdy), free(hy), free(hdx);
}

// issue 22: the one-warp-a-row kernels at each row length they take (4,
// 8, 16 and 32 floats a lane; float4s or not), the block-a-row kernels
// past 1024, a buffer off 16-byte alignment and outputs in place (y over
// x, dx over dy), attention's and the plain softmax on the same shapes.
typedef struct {
  int64_t outer, t, u, t0;
  int causal, off, inplace;
} softmax_case;

static void check_softmax_case(const softmax_case *c) {
  int64_t rows = c->outer * c->t;
  size_t n = (size_t)(rows * c->u), off = (size_t)c->off;
  float *hx = hrand(n, -8, 8), *hdy = hrand(n, -1, 1), *hy = hzero(n), *hdx = hzero(n);
  float *bx = kdrt_cuda_alloc(n + off), *bdy = kdrt_cuda_alloc(n + off);
  float *by = kdrt_cuda_alloc(n + off), *bdx = kdrt_cuda_alloc(n + off);
  float *x = bx + off, *dy = bdy + off, *y = by + off, *dx = bdx + off;
  char name[128], shape[96];
  // Rows longer than 256: the CPU's one running float sum of u terms is off
  // the exact sum by about sqrt(u) * 2^-24 (as bias_grad's), the GPU's
  // (a lane's partial sums, then a butterfly) by less; the bound grows so.
  double grow = c->u > 256 ? sqrt((double)c->u / 256) : 1.0;
  snprintf(shape, sizeof shape, "[%lld, %lld, %lld]%s%s", (long long)c->outer, (long long)c->t,
           (long long)c->u, c->off ? " unaligned" : "", c->inplace ? " in place" : "");
  for (int attn = 1; attn >= 0; attn--) {
    // the checks' names: "attn_softmax [..] t0 3 causal", "softmax [..]", and _grad
    const char *op = attn ? "attn_softmax" : "softmax";
    char where[48] = "";
    if (attn)
      snprintf(where, sizeof where, " t0 %lld%s", (long long)c->t0, c->causal ? " causal" : "");
    if (attn)
      kdrt_attn_softmax(hy, hx, c->outer, c->t, c->u, c->t0, 0.125f, c->causal);
    else
      kdrt_softmax(hy, hx, rows, c->u);
    kdrt_cuda_upload(D, x, hx, n);
    float *out = c->inplace ? x : y;
    if (!c->inplace) poison(y, n);
    if (attn)
      kdrt_cuda_attn_softmax(D, out, x, c->outer, c->t, c->u, c->t0, 0.125f, c->causal);
    else
      kdrt_cuda_softmax(D, out, x, rows, c->u);
    snprintf(name, sizeof name, "%s %s%s", op, shape, where);
    check(name, out, hy, n, 1e-6 * grow);
    // the gradient from the CPU's y
    if (attn)
      kdrt_attn_softmax_grad(hdx, hdy, hy, c->outer, c->t, c->u, c->t0, 0.125f, c->causal);
    else
      kdrt_softmax_grad(hdx, hdy, hy, rows, c->u);
    kdrt_cuda_upload(D, y, hy, n);
    kdrt_cuda_upload(D, dy, hdy, n);
    out = c->inplace ? dy : dx;
    if (!c->inplace) poison(dx, n);
    if (attn)
      kdrt_cuda_attn_softmax_grad(D, out, dy, y, c->outer, c->t, c->u, c->t0, 0.125f,
                                  c->causal);
    else
      kdrt_cuda_softmax_grad(D, out, dy, y, rows, c->u);
    snprintf(name, sizeof name, "%s_grad %s%s", op, shape, where);
    check(name, out, hdx, n, 1e-5 * grow);
  }
  kdrt_cuda_free(bx), kdrt_cuda_free(bdy), kdrt_cuda_free(by), kdrt_cuda_free(bdx);
  free(hx), free(hdy), free(hy), free(hdx);
}

static void check_softmax_warps(void) {
  static const softmax_case cases[] = {
      {4, 256, 256, 0, 1, 0, 0},    // the GPT's scores: 8 a lane, float4s
      {4, 256, 256, 0, 0, 0, 0},
      {2, 64, 1024, 700, 1, 0, 0},  // 32 a lane, a block of queries from 700
      {3, 50, 1000, 960, 1, 0, 0},  // the last queries see every key
      {3, 40, 512, 0, 1, 0, 1},     // 16 a lane, in place
      {5, 9, 12, 2, 1, 0, 0},       // 4 a lane, three float4s a row
      {5, 9, 5, 0, 1, 0, 0},        // 4 a lane, scalars
      {3, 17, 513, 0, 0, 0, 0},     // 32 a lane, scalars
      {4, 33, 256, 10, 1, 1, 0},    // off 16-byte alignment: scalars
      {2, 40, 1100, 1000, 1, 0, 0}, // past 1024: a block a row
      {2, 30, 1100, 0, 0, 0, 1},    // the same in place
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) check_softmax_case(&cases[k]);
}

// issue 22: the fused attention (attn.cu) against the CPU's reference,
// the chain's arithmetic in float: causal and not, query counts off the
// 64-row tiles, head dims padded (6 and 8 to 16, 32, 64) and 128 (bf16 only),
// keys fewer than queries and more; its gradient from the CPU's o and lse,
// and run twice to the same bits. bf16 and tf32 round the products'
// operands, so the matmul tolerance holds; kdcc fuses no fp32 program (the
// kernels refuse fp32), so at fp32 there is nothing to check. At bf16 each
// case runs again through cuDNN's fused attention (cudnn_attn.cu,
// KDRT_CUDA_CUDNN=attn's path) when cuDNN loads, its dq, dk and dv twice to
// the same bits too; a shape cuDNN does not take is said with its reason.
typedef struct {
  int64_t bn, t, s, hd;
  int causal;
} attn_case;

static int cudnn_loadable(void);

// One implementation's pass over c (dnn: cuDNN's, else attn.cu's); 0 when
// cuDNN did not take it.
// outs: o, lse, dq, dk, dv on the device; ins: q, k, v, dout on the
// device; refs: the CPU's o, lse, dq, dk, dv.
static int attention_pass(const attn_case *c, int dnn, const char *shape, float *const *outs,
                          const float *const *ins, const float *const *refs, float scale) {
  float *o = outs[0], *l = outs[1], *dq = outs[2], *dk = outs[3], *dv = outs[4];
  const float *q = ins[0], *k = ins[1], *v = ins[2], *dout = ins[3];
  const float *ho = refs[0], *hl = refs[1], *hdq = refs[2], *hdk = refs[3], *hdv = refs[4];
  size_t nq = (size_t)(c->bn * c->t * c->hd), nk = (size_t)(c->bn * c->s * c->hd);
  size_t nl = (size_t)(c->bn * c->t);
  const char *how = dnn ? "cudnn " : "";
  char name[160];
  auto fwd = [&]() {
    if (dnn)
      return kdrt_cudnn_attention_run(D, 0, o, l, NULL, NULL, NULL, NULL, q, k, v, NULL, NULL,
                                      c->bn, c->t, c->s, c->hd, scale, c->causal);
    kdrt_cuda_attention(D, o, l, q, k, v, c->bn, c->t, c->s, c->hd, scale, c->causal);
    return 1;
  };
  auto bwd = [&]() {
    poison(dq, nq), poison(dk, nk), poison(dv, nk);
    if (dnn)
      return kdrt_cudnn_attention_run(D, 1, NULL, NULL, dq, dk, dv, dout, q, k, v, o, l, c->bn,
                                      c->t, c->s, c->hd, scale, c->causal);
    kdrt_cuda_attention_grad(D, dq, dk, dv, dout, q, k, v, o, l, c->bn, c->t, c->s, c->hd, scale,
                             c->causal);
    return 1;
  };
  auto skip = [&](const char *pass) {
    printf("    (attention%s %s: not cuDNN's: %s)\n", pass, shape, kdrt_cudnn_attention_why());
    return 0;
  };
  poison(o, nq), poison(l, nl);
  if (!fwd()) return skip("");
  snprintf(name, sizeof name, "attention %s%s", how, shape);
  check(name, o, ho, nq, tol_mm);
  snprintf(name, sizeof name, "attention lse %s%s", how, shape);
  check(name, l, hl, nl, tol_mm);
  kdrt_cuda_upload(D, o, ho, nq), kdrt_cuda_upload(D, l, hl, nl);
  if (!bwd()) return skip("_grad");
  const char *part[3] = {"dq", "dk", "dv"};
  float *got[3] = {dq, dk, dv};
  const float *want[3] = {hdq, hdk, hdv};
  const size_t n[3] = {nq, nk, nk};
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "attention_grad %s %s%s", part[i], how, shape);
    check(name, got[i], want[i], n[i], tol_mm);
  }
  // the same again: no atomics (cuDNN: its deterministic engine), the same bits
  float *first = hzero(nq + 2 * nk);
  for (size_t i = 0, at = 0; i < 3; at += n[i], i++)
    kdrt_cuda_download(D, first + at, got[i], n[i]);
  bwd();
  for (size_t i = 0, at = 0; i < 3; at += n[i], i++) {
    snprintf(name, sizeof name, "attention_grad %s twice %s%s", part[i], how, shape);
    check(name, got[i], first + at, n[i], 0);
  }
  free(first);
  return 1;
}

static void check_attention_case(const attn_case *c) {
  size_t nq = (size_t)(c->bn * c->t * c->hd), nk = (size_t)(c->bn * c->s * c->hd);
  size_t nl = (size_t)(c->bn * c->t);
  float scale = 1.0f / sqrtf((float)c->hd);
  float *hq = hrand(nq, -2, 2), *hk = hrand(nk, -2, 2), *hv = hrand(nk, -1, 1);
  float *hdo = hrand(nq, -1, 1), *ho = hzero(nq), *hl = hzero(nl), *hdq = hzero(nq);
  float *hdk = hzero(nk), *hdv = hzero(nk);
  kdrt_attention(ho, hl, hq, hk, hv, c->bn, c->t, c->s, c->hd, scale, c->causal);
  kdrt_attention_grad(hdq, hdk, hdv, hdo, hq, hk, hv, ho, hl, c->bn, c->t, c->s, c->hd, scale,
                      c->causal);
  float *q = dev(hq, nq), *k = dev(hk, nk), *v = dev(hv, nk), *dout = dev(hdo, nq);
  float *o = kdrt_cuda_alloc(nq), *l = kdrt_cuda_alloc(nl), *dq = kdrt_cuda_alloc(nq);
  float *dk = kdrt_cuda_alloc(nk), *dv = kdrt_cuda_alloc(nk);
  char shape[96];
  snprintf(shape, sizeof shape, "[%lld, %lld, %lld, %lld]%s", (long long)c->bn, (long long)c->t,
           (long long)c->s, (long long)c->hd, c->causal ? " causal" : "");
  float *const outs[5] = {o, l, dq, dk, dv};
  const float *const ins[4] = {q, k, v, dout};
  const float *const refs[5] = {ho, hl, hdq, hdk, hdv};
  const int saved = D->impl->cudnn;
  for (int dnn = 0; dnn < 2; dnn++) {
    if (dnn && (D->precision != KDRT_PREC_BF16 || !cudnn_loadable())) break;
    D->impl->cudnn = dnn ? KDRT_CUDNN_ATTN : saved & ~KDRT_CUDNN_ATTN;
    attention_pass(c, dnn, shape, outs, ins, refs, scale);
  }
  D->impl->cudnn = saved;
  kdrt_cuda_free(q), kdrt_cuda_free(k), kdrt_cuda_free(v), kdrt_cuda_free(dout);
  kdrt_cuda_free(o), kdrt_cuda_free(l), kdrt_cuda_free(dq), kdrt_cuda_free(dk), kdrt_cuda_free(dv);
  free(hq), free(hk), free(hv), free(hdo), free(ho), free(hl), free(hdq), free(hdk), free(hdv);
}

static void check_attention(void) {
  static const attn_case cases[] = {
      {3, 64, 64, 64, 1},   // one tile
      {2, 200, 200, 64, 1}, // GPT-2's head dim, the last tile partial
      {2, 200, 200, 64, 0},
      {4, 16, 16, 8, 1},    // models/gpt.json's heads (8, padded to 16)
      {2, 130, 70, 32, 0},  // fewer keys than queries
      {2, 70, 130, 64, 1},  // more keys than queries, causal (top-left: key j <= query i)
      {2, 40, 40, 6, 1},    // rows not in float4s: a float at a time (cuDNN: not 8 | hd)
      {1, 300, 300, 128, 1}, // bf16 only
      {2, 96, 160, 128, 0}, // bf16 only
      {12, 1024, 1024, 64, 1}, // GPT-2 124M's attention at batch 1 (12 heads, T 1024)
  };
  if (D->precision == KDRT_PREC_FP32) return;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (!(D->precision == KDRT_PREC_TF32 && cases[i].hd > 64)) check_attention_case(&cases[i]);
}

static void check_losses(void) {
  static const char *names[] = {
#define KDRT_X(name, kname) kname,
    KDRT_LOSS_LIST(KDRT_X)
#undef KDRT_X
  };
  const int64_t rows = 53;
  const float a = 0.5f, hflag = 0.0f; // huber's delta; hinge labels 0/1 mapped to -1/1
  float *flag = dev(&hflag, 1);
  for (int kind = KDRT_LOSS_MSE; kind < KDRT_LOSS_COUNT; kind++)
    for (int logits = 0; logits < 2; logits++) {
      if (logits && kind < KDRT_LOSS_CCE) continue;
      for (int64_t cols = 1; cols <= 129; cols += 128) {
        if (cols == 1 && (kind == KDRT_LOSS_CCE || kind == KDRT_LOSS_SCCE)) continue;
        size_t n = (size_t)(rows * cols);
        float *hp = hrand(n, logits ? -5.0f : 0.0f, logits ? 5.0f : 1.0f);
        if (!logits && (kind == KDRT_LOSS_CCE || kind == KDRT_LOSS_SCCE)) {
          kdrt_softmax(hp, hp, rows, cols); // probabilities
          hp[0] = 0.0f;                     // one clipped entry
        }
        float *hy = hzero(n);
        for (int64_t r = 0; r < rows; r++) {
          int cls = (int)(frand(0, 1) * (float)cols) % (int)cols;
          if (kind == KDRT_LOSS_SCCE) hy[r] = r == 5 ? -1.0f : (float)cls; // one out of range
          else if (kind == KDRT_LOSS_CCE || kind == KDRT_LOSS_KLD || kind == KDRT_LOSS_CAT_HINGE)
            hy[r * cols + cls] = 1.0f;
          else if (kind == KDRT_LOSS_BCE || kind == KDRT_LOSS_HINGE ||
                   kind == KDRT_LOSS_SQUARED_HINGE)
            for (int64_t j = 0; j < cols; j++) hy[r * cols + j] = frand(0, 1) < 0.5f ? 0.0f : 1.0f;
          else
            for (int64_t j = 0; j < cols; j++) hy[r * cols + j] = frand(-1, 1);
        }
        float *p = dev(hp, n), *y = dev(hy, n), *out = kdrt_cuda_alloc(n);
        char name[128], shape[96];
        snprintf(shape, sizeof shape, "%s%s [%lld, %lld]", names[kind],
                 logits ? " from_logits" : "", (long long)rows, (long long)cols);
        double scale = 1.0 / 64;
        float ref;
        // The rows' losses one by one: a sum of terms of both signs
        // (cosine_similarity) may cancel; its error is judged against them.
        double terms = 0;
        for (int64_t r = 0; r < rows; r++) {
          const float *yr = kind == KDRT_LOSS_SCCE ? hy + r : hy + r * cols;
          kdrt_loss(kind, logits, a, &ref, hp + r * cols, yr, &hflag, 1, cols, scale);
          terms += fabs(ref);
        }
        kdrt_loss(kind, logits, a, &ref, hp, hy, &hflag, rows, cols, scale);
        poison(out, n);
        kdrt_cuda_loss(D, kind, logits, a, out, p, y, flag, rows, cols, scale);
        snprintf(name, sizeof name, "loss %s", shape);
        check_scaled(name, out, &ref, 1, 1e-6, terms);
        kdrt_accuracy(kind, logits, &ref, hp, hy, rows, cols, scale);
        poison(out, n);
        kdrt_cuda_accuracy(D, kind, logits, out, p, y, rows, cols, scale);
        snprintf(name, sizeof name, "accuracy %s", shape);
        check(name, out, &ref, 1, 0);
        float *hd = hzero(n);
        kdrt_loss_grad(kind, logits, a, hd, hp, hy, &hflag, rows, cols, scale);
        poison(out, n);
        kdrt_cuda_loss_grad(D, kind, logits, a, out, p, y, flag, rows, cols, scale);
        snprintf(name, sizeof name, "loss_grad %s", shape);
        check(name, out, hd, n, 1e-6);
        // dpred may alias pred: every read of the row before any write
        float *pd = dev(hp, n);
        kdrt_cuda_loss_grad(D, kind, logits, a, pd, pd, y, flag, rows, cols, scale);
        snprintf(name, sizeof name, "loss_grad %s in place", shape);
        check(name, pd, hd, n, 1e-6);
        kdrt_cuda_free(p), kdrt_cuda_free(y), kdrt_cuda_free(out), kdrt_cuda_free(pd);
        free(hp), free(hy), free(hd);
      }
    }
  // not_binary: 0/1 labels, then one other value
  float hy[300], ref;
  for (int i = 0; i < 300; i++) hy[i] = (float)(i % 2);
  float *y = dev(hy, 300), *out = kdrt_cuda_alloc(1);
  for (int k = 0; k < 2; k++) {
    kdrt_not_binary(&ref, hy, 300);
    poison(out, 1);
    kdrt_cuda_not_binary(D, out, y, 300);
    check(k ? "not_binary (a 2)" : "not_binary (0/1)", out, &ref, 1, 0);
    hy[217] = 2.0f;
    kdrt_cuda_free(y);
    y = dev(hy, 300);
  }
  kdrt_cuda_free(y), kdrt_cuda_free(out), kdrt_cuda_free(flag);
}

// issue 23: the last of an odd count of 16-bit values, in the low half of
// the device's last float (kdrt_cuda_upload moves whole floats)
static void upload_tail(float *d, const uint16_t *h, size_t n) {
  if (!(n % 2)) return;
  float last;
  uint16_t two[2] = {h[n - 1], 0};
  memcpy(&last, two, sizeof last);
  kdrt_cuda_upload(D, d + n / 2, &last, 1);
}

// One batched product on both backends: c starts as the same random
// contents where beta matters, poisoned on the device where it must not
// (beta 0: c is only written); a or b may be shared by every batch entry
// (stride 0).
static void check_one_matmul(int ta, int tb, int64_t batch, int64_t M, int64_t N, int64_t K,
                             int share_a, int share_b, float alpha, float beta) {
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
  kdrt_gemm g = {ta, tb, batch, M, N, K, lda, ldb, N, share_a ? 0 : M * K, share_b ? 0 : K * N,
                 M * N};
  size_t na = (size_t)((share_a ? 1 : batch) * M * K), nb = (size_t)((share_b ? 1 : batch) * K * N);
  size_t nc = (size_t)(batch * M * N);
  float *ha = hrand(na, -1, 1), *hb = hrand(nb, -1, 1), *hc = hrand(nc, -1, 1);
  float *a = dev(ha, na), *b = dev(hb, nb), *c = dev(hc, nc);
  kdrt_matmul(&g, alpha, ha, hb, beta, hc);
  if (beta == 0.0f) poison(c, nc);
  kdrt_cuda_matmul(D, &g, alpha, a, b, beta, c);
  char name[96];
  snprintf(name, sizeof name, "matmul ta=%d tb=%d [%lld][%lld,%lld,%lld]%s%s a%g b%g", ta, tb,
           (long long)batch, (long long)M, (long long)N, (long long)K, share_a ? " a*" : "",
           share_b ? " b*" : "", alpha, beta);
  check(name, c, hc, nc, tol_mm);
  kdrt_cuda_free(a), kdrt_cuda_free(b), kdrt_cuda_free(c);
  free(ha), free(hb), free(hc);
}

// The same with operands that are views: rows lda (ldb) apart, past their
// columns by pad_a (pad_b), and matrices a row and a few floats further
// apart than that, so that under bf16 a leading dimension that is no
// multiple of 8 is packed (matmul.cu's read_as) and one that is stays.
static void check_one_matmul_view(int ta, int tb, int64_t batch, int64_t M, int64_t N, int64_t K,
                                  int64_t pad_a, int64_t pad_b) {
  int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
  int64_t lda = ca + pad_a, ldb = cb + pad_b, sa = (ra + 1) * lda + 3, sb = (rb + 1) * ldb + 5;
  kdrt_gemm g = {ta, tb, batch, M, N, K, lda, ldb, N, sa, sb, M * N};
  size_t na = (size_t)(batch * sa), nb = (size_t)(batch * sb), nc = (size_t)(batch * M * N);
  float *ha = hrand(na, -1, 1), *hb = hrand(nb, -1, 1), *hc = hzero(nc);
  float *a = dev(ha, na), *b = dev(hb, nb), *c = dev(hc, nc);
  kdrt_matmul(&g, 1.0f, ha, hb, 0.0f, hc);
  poison(c, nc);
  kdrt_cuda_matmul(D, &g, 1.0f, a, b, 0.0f, c);
  char name[96];
  snprintf(name, sizeof name, "matmul view ta=%d tb=%d [%lld][%lld,%lld,%lld] lda %lld ldb %lld",
           ta, tb, (long long)batch, (long long)M, (long long)N, (long long)K, (long long)lda,
           (long long)ldb);
  check(name, c, hc, nc, tol_mm);
  kdrt_cuda_free(a), kdrt_cuda_free(b), kdrt_cuda_free(c);
  free(ha), free(hb), free(hc);
}

// issue 23: a product of 16-bit values (kdcc's mixed policies): values
// rounded to the type, a in its 16 bits, as float32 values of the type, or
// before rounding (fa: KDRT_OPND_*; the product rounds them), b likewise,
// on both backends; the products are exact in float32, so the two differ
// only in the order of the float32 sums: within 1e-5 at any --precision.
static void check_one_matmul16(int kind, int ta, int tb, int64_t batch, int64_t M, int64_t N,
                               int64_t K, int fa, int fb) {
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
  kdrt_gemm g = {ta, tb, batch, M, N, K, lda, ldb, N, M * K, K * N, M * N};
  size_t na = (size_t)(batch * M * K), nb = (size_t)(batch * K * N), nc = (size_t)(batch * M * N);
  float *h0[2] = {hrand(na, -2, 2), hrand(nb, -2, 2)}, *hc = hzero(nc), *dv[2];
  const void *hv[2];
  uint16_t *p[2];
  const int form[2] = {fa, fb};
  const size_t cnt[2] = {na, nb};
  for (int k = 0; k < 2; k++) {
    float *r = (float *)malloc(cnt[k] * sizeof(float));
    p[k] = (uint16_t *)malloc(cnt[k] * 2);
    if (!r || !p[k]) abort();
    kdrt_round(kind, r, h0[k], cnt[k]);
    kdrt_pack16(kind, p[k], r, cnt[k]);
    // the device operand: the 16 bits two to a float, or the float32 values
    if (form[k] == KDRT_OPND_16) {
      dv[k] = kdrt_cuda_alloc((cnt[k] + 1) / 2);
      kdrt_cuda_upload(D, dv[k], (const float *)p[k], cnt[k] / 2);
      upload_tail(dv[k], p[k], cnt[k]);
      hv[k] = p[k];
      free(r);
    } else if (form[k] == KDRT_OPND_ROUND) {
      dv[k] = dev(h0[k], cnt[k]);
      hv[k] = h0[k];
      free(r);
    } else {
      dv[k] = dev(r, cnt[k]);
      free(h0[k]);
      hv[k] = h0[k] = r;
    }
  }
  float *c = dev(hc, nc);
  float *hs = (float *)malloc((size_t)kdrt_matmul16_scratch(&g, fa, fb) * sizeof(float) + 1);
  if (!hs) abort();
  kdrt_matmul16(&g, kind, fa, hv[0], fb, hv[1], hc, hs);
  free(hs);
  poison(c, nc);
  kdrt_cuda_matmul16(D, &g, kind, fa, dv[0], fb, dv[1], c, NULL);
  static const char *fn[] = {"32", "16", "32, rounded"};
  char name[128];
  snprintf(name, sizeof name, "matmul16 %s ta=%d tb=%d [%lld][%lld,%lld,%lld] a%s b%s",
           kind == KDRT_ROUND_F16 ? "float16" : "bfloat16", ta, tb, (long long)batch,
           (long long)M, (long long)N, (long long)K, fn[fa], fn[fb]);
  check(name, c, hc, nc, 1e-5);
  kdrt_cuda_free(dv[0]), kdrt_cuda_free(dv[1]), kdrt_cuda_free(c);
  free(h0[0]), free(h0[1]), free(hc), free(p[0]), free(p[1]);
}

static void check_matmul(void) {
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        check_one_matmul16(kind, ta, tb, 1, 37, 29, 45, KDRT_OPND_16, KDRT_OPND_EXACT);
        check_one_matmul16(kind, ta, tb, 3, 16, 24, 40, KDRT_OPND_EXACT, KDRT_OPND_16);
        check_one_matmul16(kind, ta, tb, 2, 33, 64, 130, KDRT_OPND_16, KDRT_OPND_16);
        check_one_matmul16(kind, ta, tb, 1, 24, 40, 64, KDRT_OPND_ROUND, KDRT_OPND_16);
      }
  // GPT-2's logits at mixed_bfloat16: 16-bit operands whose rows are not 16
  // bytes apart packed in scratch, a result of 2^20 floats and more with
  // rows not 16 bytes apart made with padded rows (matmul.cu's pads_c)
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    check_one_matmul16(kind, 0, 1, 1, 131, 8195, 64, KDRT_OPND_16, KDRT_OPND_16);
    check_one_matmul16(kind, 0, 0, 1, 131, 64, 8195, KDRT_OPND_EXACT, KDRT_OPND_16);
    check_one_matmul16(kind, 1, 0, 1, 131, 8195, 64, KDRT_OPND_16, KDRT_OPND_EXACT);
  }
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      check_one_matmul_view(ta, tb, 3, 9, 13, 11, 3, 2);  // odd leading dimensions: packed
      check_one_matmul_view(ta, tb, 2, 16, 8, 24, 8, 16); // multiples of 8: as they are
      check_one_matmul_view(ta, tb, 1, 40, 301, 77, 0, 0); // a vocabulary-like odd N
    }
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) check_one_matmul(ta, tb, 1, 37, 29, 45, 0, 0, 1.0f, 0.0f);
  check_one_matmul(0, 0, 5, 17, 23, 19, 0, 0, 1.0f, 0.0f);
  check_one_matmul(0, 1, 4, 17, 23, 19, 0, 1, 0.5f, 1.0f);  // a shared weight, accumulate
  check_one_matmul(1, 0, 3, 13, 11, 29, 1, 0, -2.0f, 0.25f);
  check_one_matmul(1, 1, 1, 8, 9, 10, 0, 0, 1.0f, 1.0f);
  check_one_matmul(0, 0, 2, 5, 6, 0, 0, 0, 1.0f, 0.5f);     // K = 0: c = beta * c
  check_one_matmul(0, 0, 2, 5, 6, 0, 0, 0, 1.0f, 0.0f);     // ... = 0, whatever c held
  // a result of 2^20 floats and more with rows not 16 bytes apart: made with
  // padded rows in scratch, copied into place (matmul.cu's pads_c)
  check_one_matmul(0, 0, 1, 131, 8195, 64, 0, 0, 1.0f, 0.0f);
  check_one_matmul(1, 0, 1, 131, 8195, 96, 0, 0, 0.5f, 1.0f); // read first: accumulate
}

// issue 22: a Dense layer's product with its bias (and relu, or gelu's tanh
// form) in cuBLASLt's epilogue, and the weight gradient's product with the
// bias gradient (BGRADA), against kdrt_matmul_bias on the host: the product,
// then kdrt_bias_act and kdrt_bias_grad. off 1: a, b and c one float past
// an aligned address (the algorithms are chosen per alignment); off 2: the
// vector too (the separate kernels take that call).
static void check_one_matmul_bias(int ta, int tb, int64_t M, int64_t N, int64_t K, int act,
                                  int grad, int off) {
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
  kdrt_gemm g = {ta, tb, 1, M, N, K, lda, ldb, N, 0, 0, 0};
  size_t na = (size_t)(M * K), nb = (size_t)(K * N), nc = (size_t)(M * N), nv = (size_t)N;
  float *ha = hrand(na, -1, 1), *hb = hrand(nb, -1, 1), *hv = hrand(nv, -1, 1);
  float *hc = hzero(nc), *hdv = hzero(nv);
  float *a = kdrt_cuda_alloc(na + 1), *b = kdrt_cuda_alloc(nb + 1), *v = kdrt_cuda_alloc(nv + 1);
  float *c = kdrt_cuda_alloc(nc + 1);
  const int vo = off > 1;
  off = off > 0;
  kdrt_cuda_upload(D, a + off, ha, na), kdrt_cuda_upload(D, b + off, hb, nb);
  kdrt_cuda_upload(D, v + vo, hv, nv);
  kdrt_matmul_bias(&g, act, ha, hb, grad ? NULL : hv, hc, grad ? hdv : NULL);
  poison(c + off, nc);
  if (grad) poison(v + vo, nv);
  kdrt_cuda_matmul_bias(D, &g, act, a + off, b + off, grad ? NULL : v + vo, c + off,
                        grad ? v + vo : NULL);
  char name[128];
  snprintf(name, sizeof name, "matmul_bias ta=%d tb=%d [%lld,%lld,%lld] %s%s%s", ta, tb,
           (long long)M, (long long)N, (long long)K, grad ? "bias gradient" : act_names[act],
           vo ? " unaligned+" : off ? " unaligned" : "", grad ? ": product" : "");
  check(name, c + off, hc, nc, tol_mm);
  if (grad) {
    // K rows summed in another order than the CPU's (bias_grad's bound);
    // under tf32 the epilogue may sum the operand as the tensor cores read
    // it, under bf16 (KDRT_CUDA_BF16_BGRAD=1) it sums the rounded operand
    double k = K > 256 ? (double)K / 256 : 1;
    snprintf(name, sizeof name, "matmul_bias ta=%d tb=%d [%lld,%lld,%lld]%s: bias gradient", ta,
             tb, (long long)M, (long long)N, (long long)K,
             vo ? " unaligned+" : off ? " unaligned" : "");
    check(name, v + vo, hdv, nv, D->precision == KDRT_PREC_FP32 ? 1e-6 * sqrt(k) : tol_mm);
  }
  kdrt_cuda_free(a), kdrt_cuda_free(b), kdrt_cuda_free(v), kdrt_cuda_free(c);
  free(ha), free(hb), free(hv), free(hc), free(hdv);
}

static void check_matmul_bias(void) {
  static const int acts[] = {KDRT_ACT_LINEAR, KDRT_ACT_RELU, KDRT_ACT_GELU_TANH};
  for (int i = 0; i < 3; i++) {
    check_one_matmul_bias(0, 0, 37, 29, 45, acts[i], 0, 0); // N a multiple of nothing
    check_one_matmul_bias(0, 0, 300, 77, 130, acts[i], 0, 1);
  }
  check_one_matmul_bias(0, 0, 64, 40, 24, KDRT_ACT_RELU, 0, 2);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) check_one_matmul_bias(ta, tb, 19, 3, 11, KDRT_ACT_RELU, 0, 0);
  check_one_matmul_bias(0, 0, 256, 768, 96, KDRT_ACT_GELU_TANH, 0, 0); // a GPT's MLP, smaller
  // the weight gradient: dW [H, U] = x^T dy, dy [K rows, U]
  check_one_matmul_bias(1, 0, 45, 29, 333, KDRT_ACT_LINEAR, 1, 0);
  check_one_matmul_bias(1, 0, 64, 300, 5000, KDRT_ACT_LINEAR, 1, 0);
  check_one_matmul_bias(1, 0, 13, 7, 17, KDRT_ACT_LINEAR, 1, 1);
  check_one_matmul_bias(1, 0, 32, 16, 64, KDRT_ACT_LINEAR, 1, 2);
  check_one_matmul_bias(0, 0, 13, 7, 17, KDRT_ACT_LINEAR, 1, 0); // a, not transposed
  // logits-like: 2^20 floats and more with odd rows (matmul.cu's pads_c),
  // forward and the weight gradient
  check_one_matmul_bias(0, 0, 131, 8195, 64, KDRT_ACT_LINEAR, 0, 0);
  check_one_matmul_bias(1, 0, 128, 8195, 200, KDRT_ACT_LINEAR, 1, 0);
}

// issue 22: opcheck runs cuDNN's convolutions and the two-level bn_stats
// (KDRT_CUDA_CUDNN=1's paths) whatever the environment says: each case
// once with D->impl->cudnn 0 and once with 1. cuDNN that cannot be loaded
// is said once and its cases skipped (the programs that opt in fail then).
static int cudnn_loadable(void) {
  static int said, ok;
  if (!said) {
    char why[512];
    said = 1, ok = kdrt_cudnn_available(why, sizeof why);
    if (!ok) printf("  cudnn: not loaded (%s): its cases skipped\n", why);
  }
  return ok;
}

// issue 23: a conv of 16-bit values (kdrt_conv2d16) on both backends: x, f
// and dy rounded to the type, each pass's operands in their 16 bits or as
// float32 values of the type, the scratch kdrt_conv16_scratch's floats
// (poisoned); the products exact in float32, the sums' order apart: within
// 1e-5 of the CPU's.
static void check_one_conv16(const kdrt_window *w, const char *name, const float *hx,
                             const float *hf, const float *hdy) {
  const size_t n[3] = {(size_t)w->B * w->H * w->W * w->C,
                       (size_t)w->KH * w->KW * w->C / kdrt_groups(w) * w->K,
                       (size_t)w->B * w->OH * w->OW * w->K}; // x, f, dy
  const float *h0[3] = {hx, hf, hdy};
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    float *r[3], *d32[3], *d16[3];
    uint16_t *p[3];
    for (int k = 0; k < 3; k++) {
      r[k] = (float *)malloc(n[k] * sizeof(float));
      p[k] = (uint16_t *)malloc(n[k] * 2);
      if (!r[k] || !p[k]) abort();
      kdrt_round(kind, r[k], h0[k], n[k]);
      kdrt_pack16(kind, p[k], r[k], n[k]);
      d32[k] = dev(r[k], n[k]);
      d16[k] = kdrt_cuda_alloc((n[k] + 1) / 2);
      kdrt_cuda_upload(D, d16[k], (const float *)p[k], n[k] / 2);
      upload_tail(d16[k], p[k], n[k]);
    }
    for (int form = KDRT_OPND_EXACT; form <= KDRT_OPND_16; form++)
      for (int pass = KDRT_CONV_Y; pass <= KDRT_CONV_DW; pass++) {
        const int ia = pass == KDRT_CONV_DX ? 2 : 0, ib = pass == KDRT_CONV_DW ? 2 : 1;
        const size_t no = pass == KDRT_CONV_Y ? n[2] : pass == KDRT_CONV_DX ? n[0] : n[1];
        int64_t part[KDRT_C16_PARTS];
        size_t ns = (size_t)kdrt_conv16_scratch(w, pass, form, form, part);
        size_t nw = (size_t)kdrt_conv16_widen(w, pass, form); // the CPU's matmul16's
        float *hs = hzero(ns + 1), *hw = hzero(nw + 1), *ho = hzero(no),
              *s = kdrt_cuda_alloc(ns + 1),
              *o = kdrt_cuda_alloc(no);
        const int e = form == KDRT_OPND_EXACT;
        kdrt_conv2d16(w, pass, kind, form, e ? (const void *)r[ia] : p[ia], form,
                      e ? (const void *)r[ib] : p[ib], ho, hs, hw);
        poison(o, no), poison(s, ns + 1);
        kdrt_cuda_conv2d16(D, w, pass, kind, form, e ? d32[ia] : d16[ia], form,
                           e ? d32[ib] : d16[ib], o, s, NULL);
        char full[160];
        snprintf(full, sizeof full, "conv2d16 %s %s %s %s",
                 pass == KDRT_CONV_Y ? "y" : pass == KDRT_CONV_DX ? "dx" : "dw",
                 kind == KDRT_ROUND_F16 ? "float16" : "bfloat16", e ? "a32 b32" : "a16 b16", name);
        check(full, o, ho, no, 1e-5);
        kdrt_cuda_free(s), kdrt_cuda_free(o), free(hs), free(hw), free(ho);
      }
    for (int k = 0; k < 3; k++)
      kdrt_cuda_free(d32[k]), kdrt_cuda_free(d16[k]), free(r[k]), free(p[k]);
  }
}

static void check_conv(void) {
  // B, H, W, C, KH, KW, K, sh, sw, pad_t, pad_l, OH, OW, groups, dil_h, dil_w
  static const int cfg[][16] = {
    {2, 9, 7, 3, 3, 3, 5, 1, 1, 1, 1, 9, 7, 0, 0, 0},     // same, stride 1
    {3, 11, 10, 2, 3, 2, 4, 2, 2, 0, 0, 5, 5, 0, 0, 0},   // valid, stride 2
    {2, 6, 6, 4, 1, 1, 3, 1, 1, 0, 0, 6, 6, 0, 0, 0},     // pointwise
    {1, 8, 8, 2, 5, 5, 2, 2, 2, 1, 1, 4, 4, 0, 0, 0},     // same, stride 2
    {2, 9, 7, 6, 3, 3, 9, 1, 1, 1, 1, 9, 7, 3, 0, 0},     // issue 15: 3 groups
    {2, 8, 8, 8, 3, 3, 16, 2, 2, 1, 1, 4, 4, 8, 0, 0},    // depthwise, multiplier 2, stride 2
    {2, 6, 6, 6, 1, 1, 4, 1, 1, 0, 0, 6, 6, 2, 0, 0},     // grouped pointwise
    // issue 22, cuDNN's cases: the examples' ResNet (its first conv, C = 1;
    // 3x3 same; 14 -> 7 at stride 2, padded 0 above and 1 below; 1x1 stride 2)
    {4, 28, 28, 1, 3, 3, 32, 1, 1, 1, 1, 28, 28, 0, 0, 0},
    {4, 14, 14, 32, 3, 3, 32, 1, 1, 1, 1, 14, 14, 0, 0, 0},
    {4, 14, 14, 32, 3, 3, 64, 2, 2, 0, 0, 7, 7, 0, 0, 0},
    {4, 14, 14, 32, 1, 1, 64, 2, 2, 0, 0, 7, 7, 0, 0, 0},
    {3, 10, 9, 5, 2, 2, 7, 1, 1, 0, 0, 10, 9, 0, 0, 0},   // even kernel, same: 0 before, 1 after
    {2, 12, 11, 4, 3, 3, 6, 1, 1, 2, 2, 12, 11, 0, 1, 1}, // dilation 2, same
    {2, 13, 12, 4, 3, 2, 6, 2, 1, 0, 0, 5, 10, 0, 1, 1},  // dilation 2, valid, stride (2, 1)
  };
  for (size_t t = 0; t < sizeof cfg / sizeof cfg[0]; t++) {
    const int *g = cfg[t];
    int B = g[0], H = g[1], W = g[2], C = g[3], KH = g[4], KW = g[5], K = g[6], sh = g[7],
        sw = g[8], pt = g[9], pl = g[10], OH = g[11], OW = g[12], G = g[13] ? g[13] : 1;
    size_t nx = (size_t)B * H * W * C, nf = (size_t)KH * KW * C / G * K;
    size_t ny = (size_t)B * OH * OW * K;
    size_t ns = (size_t)B * OH * OW * KH * KW * C;
    float *hx = hrand(nx, -1, 1), *hf = hrand(nf, -1, 1), *hdy = hrand(ny, -1, 1);
    float *hy = hzero(ny), *hdx = hzero(nx), *hdw = hzero(nf), *hs = hzero(ns);
    float *x = dev(hx, nx), *f = dev(hf, nf), *dy = dev(hdy, ny);
    float *y = kdrt_cuda_alloc(ny), *dx = kdrt_cuda_alloc(nx), *dw = kdrt_cuda_alloc(nf),
          *s = kdrt_cuda_alloc(ns);
    char name[96];
    int n = snprintf(name, sizeof name, "[%d,%d,%d,%d] k%dx%d s%d p%d,%d g%d", B, H, W, C, KH, KW,
                     sh, pt, pl, G);
    if (g[14] || g[15]) snprintf(name + n, sizeof name - (size_t)n, " d%d", g[14] + 1);
    const kdrt_window w = {B, H, W, C, KH, KW, K, sh, sw, pt, pl, OH, OW, g[14], g[15], g[13]};
    kdrt_conv2d(&w, hy, hx, hf, hs);
    kdrt_conv2d_dx(&w, hdx, hdy, hf, hs);
    kdrt_conv2d_dw(&w, hdw, hx, hdy, hs);
    const int saved = D->impl->cudnn;
    for (int dnn = 0; dnn < 2; dnn++) {
      if (dnn && !cudnn_loadable()) break;
      D->impl->cudnn = dnn;
      const char *how = dnn ? " cudnn" : "";
      char full[128];
      poison(y, ny), poison(s, ns); // the scratch too: nothing may read it before writing it
      kdrt_cuda_conv2d(D, &w, y, x, f, s);
      snprintf(full, sizeof full, "conv2d%s %s", how, name);
      check(full, y, hy, ny, tol_mm);
      poison(dx, nx), poison(s, ns);
      kdrt_cuda_conv2d_dx(D, &w, dx, dy, f, s);
      snprintf(full, sizeof full, "conv2d_dx%s %s", how, name);
      check(full, dx, hdx, nx, tol_mm);
      poison(dw, nf), poison(s, ns);
      kdrt_cuda_conv2d_dw(D, &w, dw, x, dy, s);
      snprintf(full, sizeof full, "conv2d_dw%s %s", how, name);
      check(full, dw, hdw, nf, tol_mm);
      // which passes cuDNN took (the others ran conv2d.cu's kernels, checked above)
      for (int pass = 0; dnn && pass < 3; pass++)
        if (!kdrt_cudnn_conv(D, pass, &w, pass == KDRT_CONV_Y ? y : pass == KDRT_CONV_DX ? dx : dw,
                             pass == KDRT_CONV_DX ? dy : x, pass == KDRT_CONV_DW ? dy : f))
          printf("    (%s %s: not cuDNN's: %s)\n", pass == KDRT_CONV_Y ? "conv2d"
                 : pass == KDRT_CONV_DX ? "conv2d_dx" : "conv2d_dw", name,
                 kdrt_conv_pointwise(&w) ? "pointwise, one GEMM"
                                         : "no deterministic algorithm, or its call failed");
    }
    D->impl->cudnn = saved;
    if (!(G > 1 && G == C)) check_one_conv16(&w, name, hx, hf, hdy); // (not depthwise: float32)
    kdrt_cuda_free(x), kdrt_cuda_free(f), kdrt_cuda_free(dy), kdrt_cuda_free(y);
    kdrt_cuda_free(dx), kdrt_cuda_free(dw), kdrt_cuda_free(s);
    free(hx), free(hf), free(hdy), free(hy), free(hdx), free(hdw), free(hs);
  }
}

// issue 22: the two-level bn_stats (KDRT_CUDA_CUDNN=1) on the ResNet's
// shapes and awkward ones (columns not a multiple of 4, x not 16-byte
// aligned: a float at a time; more columns than a block's tile), each of
// the three kinds, within 1e-6 of the CPU and the same bits twice.
static void check_bn_stats2(void) {
  static const int64_t shp[][3] = { // rows, cols, offset of x (floats)
    {25088, 32, 0}, {6272, 64, 0}, {100352, 32, 0}, {301, 67, 0}, {20000, 24, 1},
    {97, 1030, 0}, {64, 2048, 0}, {5, 8, 0}};
  const int saved = D->impl->cudnn;
  D->impl->cudnn = 1;
  for (size_t t = 0; t < sizeof shp / sizeof shp[0]; t++) {
    const int64_t rows = shp[t][0], cols = shp[t][1], off = shp[t][2];
    size_t n = (size_t)(rows * cols);
    float *hx = hrand(n + (size_t)off, -2, 2), *hdy = hrand(n, -1, 1);
    float *hm = hrand((size_t)cols, -1, 1), *ref = hzero((size_t)(2 * cols));
    float *first = hzero((size_t)(2 * cols));
    float *x = dev(hx, n + (size_t)off), *dy = dev(hdy, n), *m = dev(hm, (size_t)cols);
    float *s = kdrt_cuda_alloc((size_t)(2 * cols));
    for (int kind = 0; kind < 3; kind++) {
      const float *km = kind ? m : NULL, *kdy = kind == 2 ? dy : NULL;
      const size_t no = (size_t)(kind == 2 ? 2 : 1) * (size_t)cols;
      kdrt_bn_stats(ref, hx + off, kind ? hm : NULL, kind == 2 ? hdy : NULL, rows, cols);
      char name[96];
      snprintf(name, sizeof name, "bn_stats two-level %s [%lld, %lld]%s",
               kind == 0 ? "sum" : kind == 1 ? "squares" : "with dy", (long long)rows,
               (long long)cols, off ? " unaligned" : "");
      poison(s, (size_t)(2 * cols));
      kdrt_cuda_bn_stats(D, s, x + off, km, kdy, rows, cols);
      check(name, s, ref, no, 1e-6);
      kdrt_cuda_download(D, first, s, no);
      poison(s, (size_t)(2 * cols));
      kdrt_cuda_bn_stats(D, s, x + off, km, kdy, rows, cols);
      snprintf(name + strlen(name), sizeof name - strlen(name), " twice");
      check(name, s, first, no, 0);
    }
    kdrt_cuda_free(x), kdrt_cuda_free(dy), kdrt_cuda_free(m), kdrt_cuda_free(s);
    free(hx), free(hdy), free(hm), free(ref), free(first);
  }
  D->impl->cudnn = saved;
}

static void check_pool(void) {
  // B, H, W, C, PH, PW, sh, sw, pad_t, pad_l, OH, OW
  static const int cfg[][12] = {
    {2, 26, 26, 3, 2, 2, 2, 2, 0, 0, 13, 13}, // the usual
    {2, 13, 13, 5, 2, 2, 2, 2, 0, 0, 6, 6},   // odd extent, valid
    {1, 7, 9, 4, 3, 3, 1, 1, 1, 1, 7, 9},     // overlapping, same
    {2, 7, 7, 3, 3, 3, 2, 2, 1, 1, 4, 4},     // overlapping, strided, same
  };
  for (size_t t = 0; t < sizeof cfg / sizeof cfg[0]; t++) {
    const int *g = cfg[t];
    int B = g[0], H = g[1], W = g[2], C = g[3], PH = g[4], PW = g[5], sh = g[6], sw = g[7],
        pt = g[8], pl = g[9], OH = g[10], OW = g[11];
    size_t nx = (size_t)B * H * W * C, ny = (size_t)B * OH * OW * C;
    float *hx = hrand(nx, -1, 1), *hdy = hrand(ny, -1, 1), *hy = hzero(ny), *hdx = hzero(nx);
    for (size_t i = 0; i < nx; i += 7) hx[i] = 0.25f; // ties: the first maximum must win
    float *x = dev(hx, nx), *dy = dev(hdy, ny), *y = kdrt_cuda_alloc(ny), *dx = kdrt_cuda_alloc(nx);
    char name[96];
    const kdrt_window w = {B, H, W, C, PH, PW, C, sh, sw, pt, pl, OH, OW, 0, 0, 0};
    kdrt_maxpool(&w, hy, hx);
    poison(y, ny);
    kdrt_cuda_maxpool(D, &w, y, x);
    snprintf(name, sizeof name, "maxpool [%d,%d,%d,%d] %dx%d s%d p%d", B, H, W, C, PH, PW, sh, pt);
    check(name, y, hy, ny, 0);
    kdrt_maxpool_grad(&w, hdx, hdy, hx);
    poison(dx, nx);
    kdrt_cuda_maxpool_grad(D, &w, dx, dy, x);
    snprintf(name, sizeof name, "maxpool_grad [%d,%d,%d,%d] %dx%d s%d p%d", B, H, W, C, PH, PW, sh,
             pt);
    check(name, dx, hdx, nx, 0);
    kdrt_cuda_free(x), kdrt_cuda_free(dy), kdrt_cuda_free(y), kdrt_cuda_free(dx);
    free(hx), free(hdy), free(hy), free(hdx);
  }
}

static void check_blocks(void) {
  const int64_t outer = 6, in_ext = 10, off = 3, ext = 4, inner = 5;
  size_t nin = (size_t)(outer * in_ext * inner), nout = (size_t)(outer * ext * inner);
  float *hin = hrand(nin, -1, 1), *hout = hzero(nout), *hbig = hrand(nin, -1, 1);
  float *in = dev(hin, nin), *out = kdrt_cuda_alloc(nout);
  kdrt_copy_block(hout, hin, outer, in_ext, off, ext, inner);
  poison(out, nout);
  kdrt_cuda_copy_block(D, out, in, outer, in_ext, off, ext, inner);
  check("copy_block", out, hout, nout, 0);
  float *big = dev(hbig, nin); // outside the block: kept, the same random contents
  kdrt_place_block(hbig, hout, outer, ext, off, in_ext, inner);
  kdrt_cuda_place_block(D, big, out, outer, ext, off, in_ext, inner);
  check("place_block", big, hbig, nin, 0);
  kdrt_cuda_free(in), kdrt_cuda_free(out), kdrt_cuda_free(big);
  free(hin), free(hout), free(hbig);
}

// The split crossentropy on one block of columns [col0, col0 + cols) of
// V = 3 * cols classes: labels anywhere in [0, V) (most on other ranks),
// one negative; some rows with the label's logit tied at the maximum.
static void check_xent_shape(int64_t rows, int64_t cols, int64_t col0) {
  char name[64];
#define XNAME(what) (snprintf(name, sizeof name, "%s [%lld, %lld]", what, (long long)rows, \
                              (long long)cols), name)
  size_t n = (size_t)(rows * cols);
  float *hx = hrand(n, -5, 5), *hy = hzero((size_t)rows);
  for (int64_t r = 0; r < rows; r++) {
    hy[r] = (float)((int64_t)(frand(0, 1) * 3 * cols) % (3 * cols));
    if (r % 3 == 0) hy[r] = (float)(col0 + r % cols); // in this block
    if (r % 6 == 0) hx[r * cols + r % cols] = 9.0f;   // ... and the maximum
  }
  hy[1] = -1.0f;
  hx[12 * cols + 3] = 9.0f; // row 12: an earlier column ties: not counted
  float *hm = hzero((size_t)rows), *hs = hzero((size_t)rows), *hd = hzero(n), ref;
  kdrt_row_max(hm, hx, rows, cols);
  kdrt_row_sumexp(hs, hx, hm, rows, cols);
  float *x = dev(hx, n), *y = dev(hy, (size_t)rows), *m = kdrt_cuda_alloc((size_t)rows);
  float *s = kdrt_cuda_alloc((size_t)rows), *out = kdrt_cuda_alloc(n);
  poison(m, (size_t)rows);
  kdrt_cuda_row_max(D, m, x, rows, cols);
  check(XNAME("row_max"), m, hm, (size_t)rows, 0);
  float *md = dev(hm, (size_t)rows); // the CPU's m and s from here on
  poison(s, (size_t)rows);
  kdrt_cuda_row_sumexp(D, s, x, md, rows, cols);
  check(XNAME("row_sumexp"), s, hs, (size_t)rows, 1e-6);
  float *sd = dev(hs, (size_t)rows);
  kdrt_sparse_xent(&ref, hx, hy, hm, hs, rows, cols, col0, 1.0 / 64);
  poison(out, n);
  kdrt_cuda_sparse_xent(D, out, x, y, md, sd, rows, cols, col0, 1.0 / 64);
  check(XNAME("sparse_xent"), out, &ref, 1, 1e-6);
  kdrt_sparse_xent_acc(&ref, hx, hy, hm, rows, cols, col0, 1.0 / 64);
  poison(out, n);
  kdrt_cuda_sparse_xent_acc(D, out, x, y, md, rows, cols, col0, 1.0 / 64);
  check(XNAME("sparse_xent_acc"), out, &ref, 1, 0);
  kdrt_sparse_xent_grad(hd, hx, hy, hm, hs, rows, cols, col0, 1.0 / 64);
  poison(out, n);
  kdrt_cuda_sparse_xent_grad(D, out, x, y, md, sd, rows, cols, col0, 1.0 / 64);
  check(XNAME("sparse_xent_grad"), out, hd, n, 1e-6);
  kdrt_cuda_free(x), kdrt_cuda_free(y), kdrt_cuda_free(m), kdrt_cuda_free(s);
  kdrt_cuda_free(out), kdrt_cuda_free(md), kdrt_cuda_free(sd);
  free(hx), free(hy), free(hm), free(hs), free(hd);
#undef XNAME
}

// issue 22: the fused classifier (kdrt_sparse_xent_fused) on whole rows:
// labels anywhere (one negative, one past the classes), ties at the
// maximum won and lost, sample weights in [0, 2) (the accuracy's too, or
// none). Within 1e-6 of a float64 reference at every V; against the CPU's
// kernel (the chain's bits) within 1e-6 up to V 1024, and where the CPU's
// column-order float sum of exps drifts from the exact one (simulated: up
// to 1.2e-6 at 3001, 4e-5 at 50257; the GPU's tree is nearer), 1e-5 up to
// 4096, 1e-4 above. The accuracy equal;
// evaluation (no gradient) the same loss; a second run the same bits; the
// gradient rounded to bfloat16 equal to the plain one then round; in place
// the same bits; a gradient one float off x's alignment (scalar stores).
static void xent_exact(double *loss, float *grad, const float *x, const float *y, const float *w,
                       int64_t rows, int64_t cols, double scale, double gscale) {
  double total = 0;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float m = -INFINITY;
    for (int64_t j = 0; j < cols; j++) m = xr[j] > m ? xr[j] : m;
    double s = 0, sc = gscale * (w ? w[r] : 1.0);
    for (int64_t j = 0; j < cols; j++) s += exp((double)xr[j] - m);
    int64_t c = kdrt_xent_class(y, r, cols, 0);
    if (c >= 0) total += (w ? w[r] : 1.0) * (m + log(s) - xr[c]);
    for (int64_t j = 0; j < cols; j++)
      grad[r * cols + j] = y[r] >= 0 ? (float)(sc * (exp((double)xr[j] - m) / s - (j == c))) : 0.0f;
  }
  *loss = total * scale;
}

static void check_xent_fused(int64_t rows, int64_t cols, int weighted) {
  char name[96];
#define FNAME(what) (snprintf(name, sizeof name, "xent_fused %s [%lld, %lld]%s", what, \
                              (long long)rows, (long long)cols, weighted ? " weighted" : ""), name)
  const double scale = 1.0 / 64, ascale = 1.0 / 60, gscale = 1.0 / 48;
  const size_t n = (size_t)(rows * cols);
  float *hx = hrand(n, -5, 5), *hy = hzero((size_t)rows), *hw = hrand((size_t)rows, 0, 2);
  for (int64_t r = 0; r < rows; r++) {
    hy[r] = (float)((int64_t)(frand(0, 1) * cols) % cols);
    if (r % 4 == 0) hx[r * cols + (int64_t)hy[r]] = 9.0f; // a hit
  }
  hy[1] = -1.0f, hy[2] = (float)cols;                     // no class; past the classes
  hx[3 * cols + 5] = hx[3 * cols + 9] = 9.0f, hy[3] = 9.0f; // a tie, lost
  hx[4 * cols + 5] = hx[4 * cols + 9] = 9.0f, hy[4] = 5.0f; // a tie, won
  const float *hwl = weighted ? hw : NULL;
  float hl, ha, *hd = hzero(n), *he = hzero(n), *hr = hzero(n);
  double el;
  kdrt_sparse_xent_fused(&hl, &ha, hd, hx, hy, hwl, hwl, rows, cols, scale, ascale, gscale);
  kdrt_sparse_xent_fused_rnd(KDRT_ROUND_BF16, &hl, &ha, hr, hx, hy, hwl, hwl, rows, cols, scale,
                             ascale, gscale);
  xent_exact(&el, he, hx, hy, hwl, rows, cols, scale, gscale);
  float ef = (float)el;
  float *x = dev(hx, n), *y = dev(hy, (size_t)rows), *w = weighted ? dev(hw, (size_t)rows) : NULL;
  float *out = kdrt_cuda_alloc(4), *dx = kdrt_cuda_alloc(n + 1), *d2 = kdrt_cuda_alloc(n);
  poison(out, 4), poison(dx, n + 1);
  kdrt_cuda_sparse_xent_fused(D, out, out + 1, dx, x, y, w, w, rows, cols, scale, ascale, gscale);
  const double tol = cols > 4096 ? 1e-4 : cols > 1024 ? 1e-5 : 1e-6;
  check(FNAME("loss"), out, &hl, 1, tol);
  check(FNAME("loss, float64"), out, &ef, 1, 1e-6);
  check(FNAME("accuracy"), out + 1, &ha, 1, weighted ? 1e-7 : 0);
  check(FNAME("grad"), dx, hd, n, tol);
  check(FNAME("grad, float64"), dx, he, n, 1e-6);
  float *h1 = hzero(n + 2);
  kdrt_cuda_download(D, h1, out, 2);
  poison(out + 2, 2), poison(d2, n);
  kdrt_cuda_sparse_xent_fused(D, out + 2, out + 3, d2, x, y, w, w, rows, cols, scale, ascale,
                              gscale);
  check(FNAME("run twice, loss"), out + 2, h1, 2, 0);
  kdrt_cuda_download(D, he, dx, n); // (the first run's gradient)
  check(FNAME("run twice, grad"), d2, he, n, 0);
  poison(out + 2, 2);
  kdrt_cuda_sparse_xent_fused(D, out + 2, NULL, NULL, x, y, w, NULL, rows, cols, scale, ascale,
                              gscale);
  check(FNAME("evaluation's loss"), out + 2, h1, 1, 0);
  poison(d2, n);
  kdrt_cuda_sparse_xent_fused_rnd(D, KDRT_ROUND_BF16, out + 2, NULL, d2, x, y, w, NULL, rows,
                                  cols, scale, ascale, gscale);
  check_rnd_pair(FNAME("grad_rnd"), KDRT_ROUND_BF16, d2, dx, hr, n, 1e-2); // (dx rounded)
  kdrt_cuda_upload(D, d2, hx, n); // in place: x overwritten by its gradient
  kdrt_cuda_sparse_xent_fused(D, out + 2, NULL, d2, d2, y, w, NULL, rows, cols, scale, ascale,
                              gscale);
  check(FNAME("in place"), d2, he, n, 0);
  poison(dx, n + 1);
  kdrt_cuda_sparse_xent_fused(D, out + 2, NULL, dx + 1, x, y, w, NULL, rows, cols, scale, ascale,
                              gscale);
  check(FNAME("grad one float off"), dx + 1, he, n, 0);
  kdrt_cuda_free(x), kdrt_cuda_free(y), kdrt_cuda_free(out), kdrt_cuda_free(dx);
  kdrt_cuda_free(d2);
  if (w) kdrt_cuda_free(w);
  free(hx), free(hy), free(hw), free(hd), free(he), free(hr), free(h1);
#undef FNAME
}

static void check_xent(void) {
  check_xent_shape(67, 211, 211);
  check_xent_shape(13, 3001, 0); // rows wider than a block: several blocks a row
  check_xent_fused(67, 211, 0);
  check_xent_fused(13, 3001, 0);
  check_xent_fused(13, 3001, 1);
  check_xent_fused(64, 50257, 0); // GPT-2's vocabulary
  check_xent_fused(64, 50257, 1);
  // more rows than gridDim.y's 65535 (batch 64 x T 1024 is 65536): the
  // gradient's rows stride past it; the fused kernel's rows are gridDim.x
  check_xent_shape(70001, 5, 0);
  check_xent_fused(70001, 11, 0);
}

// Device int32 ids (4 bytes, as a float).
static int32_t *dev_ids(const int32_t *h, size_t n) {
  float *p = kdrt_cuda_alloc(n);
  kdrt_cuda_upload(D, p, (const float *)h, n);
  return (int32_t *)p;
}

static void check_nd(void) {
  // transposes of rank 2, 3 and 4
  static const struct { int rank; int64_t shape[4]; int perm[4]; } tc[] = {
    {2, {37, 53}, {1, 0}},
    {3, {5, 7, 9}, {2, 0, 1}},
    {3, {5, 7, 9}, {0, 2, 1}},
    {4, {3, 4, 5, 6}, {0, 2, 1, 3}},
    {4, {3, 4, 5, 6}, {3, 1, 0, 2}},
    // the last dim kept, a multiple of 4 (16-byte accesses): attention's heads
    {4, {2, 8, 3, 16}, {0, 2, 1, 3}},
    {3, {4, 6, 8}, {1, 0, 2}},
    // issue 22: the GPT's heads both ways (float4s); an odd one of 65k floats
    {4, {4, 256, 12, 64}, {0, 2, 1, 3}},
    {4, {4, 12, 256, 64}, {0, 2, 1, 3}},
    {3, {37, 41, 43}, {2, 0, 1}},
  };
  for (size_t t = 0; t < sizeof tc / sizeof tc[0]; t++) {
    size_t n = 1;
    for (int k = 0; k < tc[t].rank; k++) n *= (size_t)tc[t].shape[k];
    float *hin = hrand(n, -1, 1), *hout = hzero(n), *in = dev(hin, n), *out = kdrt_cuda_alloc(n);
    kdrt_transpose(hout, hin, tc[t].rank, tc[t].shape, tc[t].perm);
    poison(out, n);
    kdrt_cuda_transpose(D, out, in, tc[t].rank, tc[t].shape, tc[t].perm);
    char name[64];
    snprintf(name, sizeof name, "transpose rank %d case %zu", tc[t].rank, t);
    check(name, out, hout, n, 0);
    kdrt_cuda_free(in), kdrt_cuda_free(out), free(hin), free(hout);
  }
  // reduce_sum and broadcast over [7, 13, 11]
  const int64_t outer = 7, mid = 13, inner = 11;
  size_t nbig = (size_t)(outer * mid * inner), nsmall = (size_t)(outer * inner);
  float *hbig = hrand(nbig, -1, 1), *hsmall = hzero(nsmall), *hb2 = hzero(nbig);
  float *big = dev(hbig, nbig), *small = kdrt_cuda_alloc(nsmall), *b2 = kdrt_cuda_alloc(nbig);
  kdrt_reduce_sum(hsmall, hbig, outer, mid, inner);
  poison(small, nsmall);
  kdrt_cuda_reduce_sum(D, small, big, outer, mid, inner);
  check("reduce_sum", small, hsmall, nsmall, 0);
  kdrt_broadcast(hb2, hsmall, outer, mid, inner);
  float *sd = dev(hsmall, nsmall);
  poison(b2, nbig);
  kdrt_cuda_broadcast(D, b2, sd, outer, mid, inner);
  check("broadcast", b2, hb2, nbig, 0);
  kdrt_cuda_free(big), kdrt_cuda_free(small), kdrt_cuda_free(b2), kdrt_cuda_free(sd);
  free(hbig), free(hsmall), free(hb2);
  // gather / scatter_add: a table block of rows [40, 90) of a 120-row vocab
  const int64_t rows = 50, cols = 37, row0 = 40, nid = 301;
  int32_t *hid = (int32_t *)malloc((size_t)nid * sizeof(int32_t));
  for (int64_t i = 0; i < nid; i++) hid[i] = (int32_t)(frand(0, 1) * 130.0f) - 5; // some < 0, >= 120
  hid[0] = 40, hid[1] = 89, hid[2] = 90, hid[3] = 39, hid[4] = 40; // edges, a repeat
  size_t nt = (size_t)(rows * cols), no = (size_t)(nid * cols);
  float *htab = hrand(nt, -1, 1), *hout = hzero(no), *hdy = hrand(no, -1, 1), *hdt = hzero(nt);
  float *tab = dev(htab, nt), *out = kdrt_cuda_alloc(no), *dy = dev(hdy, no);
  float *dt = kdrt_cuda_alloc(nt);
  int32_t *ids = dev_ids(hid, (size_t)nid);
  kdrt_gather(hout, htab, hid, nid, rows, cols, row0);
  poison(out, no);
  kdrt_cuda_gather(D, out, tab, ids, nid, rows, cols, row0);
  check("gather", out, hout, no, 0);
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) { // issue 23: kept in 16 bits
    float *hr = hzero(nt), *h16 = hzero(no);
    kdrt_round(kind, hr, htab, nt);
    float *t16 = dev16(kind, hr, nt);
    kdrt_gather(hout, hr, hid, nid, rows, cols, row0); // the float32 table's rows
    uint16_t *hb = (uint16_t *)calloc(nt + 1, sizeof *hb);
    kdrt_pack16(kind, hb, hr, nt);
    kdrt_gather16(kind, h16, hb, hid, nid, rows, cols, row0);
    poison(out, no);
    kdrt_cuda_gather16(D, kind, out, (const uint16_t *)t16, ids, nid, rows, cols, row0);
    check(kind == KDRT_ROUND_F16 ? "gather16 float16" : "gather16 bfloat16", out, hout, no, 0);
    int bad = memcmp(h16, hout, no * sizeof *h16) != 0; // the CPU's too, bit for bit
    checks++, failures += bad;
    if (bad) printf("FAIL gather16 (CPU) differs from gather of the float32 table\n");
    kdrt_cuda_free(t16), free(hr), free(h16), free(hb);
  }
  kdrt_gather(hout, htab, hid, nid, rows, cols, row0);
  kdrt_scatter_add(hdt, hdy, hid, nid, rows, cols, row0);
  poison(dt, nt); // overwritten: rows no id names are zeros
  kdrt_cuda_scatter_add(D, dt, dy, ids, nid, rows, cols, row0);
  check("scatter_add", dt, hdt, nt, 0);
  kdrt_scatter_add(hdt, hdy, hid, 5, rows, cols, row0); // two rows named, the rest zeroed only
  poison(dt, nt);
  kdrt_cuda_scatter_add(D, dt, dy, ids, 5, rows, cols, row0);
  check("scatter_add (two rows named)", dt, hdt, nt, 0);
  kdrt_cuda_free(tab), kdrt_cuda_free(out), kdrt_cuda_free(dy), kdrt_cuda_free(dt);
  kdrt_cuda_free((float *)ids);
  free(hid), free(htab), free(hout), free(hdy), free(hdt);
}

static void check_dropout(kdrt_ctx *c) {
  // [6, 10, 8] split over axis 1 on dim 1 and axis 0 on dim 2, this rank at (1, 1).
  kdrt_layout l = {3, {6, 10, 8}, {-1, 1, 0}};
  size_t n = 6 * 5 * 4;
  float *hx = hrand(n, -1, 1), *hy = hzero(n);
  float *x = dev(hx, n), *y = kdrt_cuda_alloc(n);
  for (int step = 0; step < 3; step++) {
    c->step = 1000000007LL * step;
    kdrt_dropout(c, hy, hx, &l, 0.375f, 0xa13b29c60c02b510ull);
    poison(y, n);
    kdrt_cuda_dropout(D, y, x, &l, 0.375f, 0xa13b29c60c02b510ull);
    char name[64];
    snprintf(name, sizeof name, "dropout (sharded block) step %lld", (long long)c->step);
    check(name, y, hy, n, 0);
    // issue 11: Gaussian noise, added and multiplied (the same draws; the
    // device's double log and cos may round the last bit otherwise)
    for (int mul = 0; mul < 2; mul++) {
      kdrt_gaussian_noise(c, hy, hx, &l, 0.3f, mul, 0x5bd1e9955bd1e995ull);
      poison(y, n);
      kdrt_cuda_gaussian_noise(D, y, x, &l, 0.3f, mul, 0x5bd1e9955bd1e995ull);
      snprintf(name, sizeof name, "gaussian_noise%s step %lld", mul ? " (mul)" : "",
               (long long)c->step);
      check(name, y, hy, n, 1e-6);
    }
  }
  kdrt_fill(hy, 0.75f, n);
  poison(y, n);
  kdrt_cuda_fill(D, y, 0.75f, n);
  check("fill", y, hy, n, 0);
  kdrt_cuda_free(x), kdrt_cuda_free(y), free(hx), free(hy);
}

// issue 23: the 16-bit all-gather and all-to-all over a group of one (the
// moves between ranks are gpu_mesh.sh's): values of each 16-bit type packed
// two to a word, moved and unpacked on the device, bit for bit the CPU's.
static void check_comm16(kdrt_ctx *c) {
  const int64_t shape[3] = {3, 5, 6};
  const size_t n = 3 * 5 * 6;
  float *hx = hrand(n, -4, 4), *hr = hzero(n), *hy = hzero(n), *y = kdrt_cuda_alloc(n);
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    const char *t = kind == KDRT_ROUND_F16 ? "float16" : "bfloat16";
    char name[64];
    kdrt_round(kind, hr, hx, n);
    float *x = dev(hr, n);
    kdrt_allgather16(c, kind, 0, 3, shape, 1, hr, hy);
    poison(y, n);
    kdrt_cuda_allgather16(D, kind, 0, 3, shape, 1, x, y);
    snprintf(name, sizeof name, "allgather16 %s (a group of one)", t);
    check(name, y, hy, n, 0);
    kdrt_alltoall16(c, kind, 0, 3, shape, 0, 2, hr, hy);
    poison(y, n);
    kdrt_cuda_alltoall16(D, kind, 0, 3, shape, 0, 2, x, y);
    snprintf(name, sizeof name, "alltoall16 %s (a group of one)", t);
    check(name, y, hy, n, 0);
    kdrt_cuda_free(x);
  }
  kdrt_cuda_free(y), free(hx), free(hr), free(hy);
}

static void check_optim(void) {
  const size_t n = 4099;
  for (int which = 0; which < 13; which++) {
    float *hw = hrand(n, -1, 1), *hg = hrand(n, -1, 1), *hm = hrand(n, -0.1f, 0.1f),
          *hv = hrand(n, 0.01f, 0.1f), *ha = hrand(n, -0.05f, 0.05f);
    float *w = dev(hw, n), *g = dev(hg, n), *m = dev(hm, n), *v = dev(hv, n), *a = dev(ha, n);
    const char *name = "";
    kdrt_ctx c;
    memset(&c, 0, sizeof c);
    for (int t = 1; t <= 3; t++) switch (which) {
      case 0: name = "sgd"; kdrt_sgd(hw, hg, NULL, n, 0.01f, 0.0f, 0);
        kdrt_cuda_sgd(D, w, g, NULL, n, 0.01f, 0.0f, 0); break;
      case 1: name = "sgd momentum"; kdrt_sgd(hw, hg, hm, n, 0.01f, 0.9f, 0);
        kdrt_cuda_sgd(D, w, g, m, n, 0.01f, 0.9f, 0); break;
      case 2: name = "sgd nesterov"; kdrt_sgd(hw, hg, hm, n, 0.01f, 0.9f, 1);
        kdrt_cuda_sgd(D, w, g, m, n, 0.01f, 0.9f, 1); break;
      case 3: name = "adam"; kdrt_adam(hw, hg, hm, hv, NULL, n, 1e-3f, 0.9f, 0.999f, 1e-7f, t);
        kdrt_cuda_adam(D, w, g, m, v, NULL, n, 1e-3f, 0.9f, 0.999f, 1e-7f, t); break;
      case 4: name = "adamw"; kdrt_adamw(hw, hg, hm, hv, NULL, n, 1e-3f, 0.9f, 0.999f, 1e-7f, 4e-3f, t);
        kdrt_cuda_adamw(D, w, g, m, v, NULL, n, 1e-3f, 0.9f, 0.999f, 1e-7f, 4e-3f, t); break;
      case 5: name = "rmsprop"; kdrt_rmsprop(hw, hg, hv, NULL, NULL, n, 1e-3f, 0.9f, 0.0f, 1e-7f);
        kdrt_cuda_rmsprop(D, w, g, v, NULL, NULL, n, 1e-3f, 0.9f, 0.0f, 1e-7f); break;
      case 6: name = "rmsprop momentum"; kdrt_rmsprop(hw, hg, hv, hm, NULL, n, 1e-3f, 0.9f, 0.5f, 1e-7f);
        kdrt_cuda_rmsprop(D, w, g, v, m, NULL, n, 1e-3f, 0.9f, 0.5f, 1e-7f); break;
      case 7: name = "adam amsgrad"; kdrt_adam(hw, hg, hm, hv, ha, n, 1e-3f, 0.9f, 0.999f, 1e-7f, t);
        kdrt_cuda_adam(D, w, g, m, v, a, n, 1e-3f, 0.9f, 0.999f, 1e-7f, t); break;
      case 8: name = "rmsprop centered"; kdrt_rmsprop(hw, hg, hv, hm, ha, n, 1e-3f, 0.9f, 0.5f, 1e-7f);
        kdrt_cuda_rmsprop(D, w, g, v, m, a, n, 1e-3f, 0.9f, 0.5f, 1e-7f); break;
      case 9: name = "adagrad"; kdrt_adagrad(hw, hg, hv, n, 1e-3f, 1e-7f);
        kdrt_cuda_adagrad(D, w, g, v, n, 1e-3f, 1e-7f); break;
      case 10: name = "adamax"; kdrt_adamax(hw, hg, hm, hv, n, 1e-3f, 0.9f, 0.999f, 1e-7f, t);
        kdrt_cuda_adamax(D, w, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-7f, t); break;
      case 11: {
        name = "nadam";
        float u = kdrt_nadam_product(&c, 0.9f, t);
        kdrt_nadam(hw, hg, hm, hv, n, 1e-3f, 0.9f, 0.999f, 1e-7f, t, u);
        kdrt_cuda_nadam(D, w, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-7f, t, u);
        break;
      }
      case 12: name = "lion"; kdrt_lion(hw, hg, hm, n, 1e-3f, 0.9f, 0.99f);
        kdrt_cuda_lion(D, w, g, m, n, 1e-3f, 0.9f, 0.99f); break;
      }
    char full[64];
    snprintf(full, sizeof full, "%s (3 steps): weights", name);
    check(full, w, hw, n, 1e-6);
    if (which != 0 && which != 5 && which != 9) {
      snprintf(full, sizeof full, "%s (3 steps): momentum", name);
      check(full, m, hm, n, 1e-6);
    }
    if (which >= 3 && which != 12) {
      snprintf(full, sizeof full, "%s (3 steps): second moment", name);
      check(full, v, hv, n, 1e-6);
    }
    if (which == 7 || which == 8) {
      snprintf(full, sizeof full, "%s (3 steps): third slot", name);
      check(full, a, ha, n, 1e-6);
    }
    kdrt_cuda_free(w), kdrt_cuda_free(g), kdrt_cuda_free(m), kdrt_cuda_free(v), kdrt_cuda_free(a);
    free(hw), free(hg), free(hm), free(hv), free(ha);
  }
}

// issue 23: the 16-bit updates (RMSprop centered with momentum, Adagrad,
// Adamax, Nadam, Lion, each with weight decay) and clippings (clipnorm,
// global_clipnorm, a constraint's scale) in bfloat16 and float16: bit for
// bit the CPU's, over 3 steps, every slot too.
// issue 23: the 16-bit updates against the CPU's, each twice: on float32
// buffers of 16-bit values, and on the variable and slots kept in their 16
// bits (kind | KDRT_STORE16; read back through kdrt_cuda_unpack16).
static void check_optim16(void) {
  const size_t n = 4099;
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++)
    for (int which = 0; which < 5; which++) {
      float *hw = hrand(n, -1, 1), *hm = hzero(n), *hv = hzero(n), *ha = hzero(n);
      kdrt_round(kind, hw, hw, n);
      if (which == 1) kdrt_fill(hv, kdrt_round_to(kind, 0.1f), n); // Adagrad's accumulator
      float *w = dev(hw, n), *m = dev(hm, n), *v = dev(hv, n), *a = dev(ha, n);
      float *w16 = dev16(kind, hw, n), *m16 = dev16(kind, hm, n), *v16 = dev16(kind, hv, n);
      float *a16 = dev16(kind, ha, n);
      const int st = kind | KDRT_STORE16;
      const char *name = "";
      kdrt_ctx c;
      memset(&c, 0, sizeof c);
      for (int t = 1; t <= 3; t++) {
        float *hg = hrand(n, -0.5f, 0.5f), *g = dev(hg, n);
        switch (which) {
        case 0: name = "rmsprop16";
          kdrt_rmsprop16(hw, hg, hv, hm, ha, n, 1e-2f, 0.9f, 0.5f, 1e-7f, 4e-3f, kind);
          kdrt_cuda_rmsprop16(D, w, g, v, m, a, n, 1e-2f, 0.9f, 0.5f, 1e-7f, 4e-3f, kind);
          kdrt_cuda_rmsprop16(D, w16, g, v16, m16, a16, n, 1e-2f, 0.9f, 0.5f, 1e-7f, 4e-3f, st);
          break;
        case 1: name = "adagrad16";
          kdrt_adagrad16(hw, hg, hv, n, 1e-2f, 1e-7f, 4e-3f, kind);
          kdrt_cuda_adagrad16(D, w, g, v, n, 1e-2f, 1e-7f, 4e-3f, kind);
          kdrt_cuda_adagrad16(D, w16, g, v16, n, 1e-2f, 1e-7f, 4e-3f, st); break;
        case 2: name = "adamax16";
          kdrt_adamax16(hw, hg, hm, hv, n, 1e-2f, 0.9f, 0.99f, 1e-7f, 4e-3f, t, kind);
          kdrt_cuda_adamax16(D, w, g, m, v, n, 1e-2f, 0.9f, 0.99f, 1e-7f, 4e-3f, t, kind);
          kdrt_cuda_adamax16(D, w16, g, m16, v16, n, 1e-2f, 0.9f, 0.99f, 1e-7f, 4e-3f, t, st);
          break;
        case 3: {
          name = "nadam16";
          float u = kdrt_nadam_product16(&c, 0.9f, t, kind);
          kdrt_nadam16(hw, hg, hm, hv, n, 1e-2f, 0.9f, 0.99f, 1e-7f, 4e-3f, t, u, kind);
          kdrt_cuda_nadam16(D, w, g, m, v, n, 1e-2f, 0.9f, 0.99f, 1e-7f, 4e-3f, t, u, kind);
          kdrt_cuda_nadam16(D, w16, g, m16, v16, n, 1e-2f, 0.9f, 0.99f, 1e-7f, 4e-3f, t, u, st);
          break;
        }
        default: name = "lion16";
          kdrt_lion16(hw, hg, hm, n, 1e-2f, 0.9f, 0.99f, 4e-3f, kind);
          kdrt_cuda_lion16(D, w, g, m, n, 1e-2f, 0.9f, 0.99f, 4e-3f, kind);
          kdrt_cuda_lion16(D, w16, g, m16, n, 1e-2f, 0.9f, 0.99f, 4e-3f, st); break;
        }
        kdrt_cuda_free(g), free(hg);
      }
      char full[96];
      const char *t = kind == KDRT_ROUND_F16 ? "float16" : "bfloat16";
      for (int in16 = 0; in16 < 2; in16++) {
        float *dw = w, *dm = m, *dv = v, *da = a; // in16: unpacked from the 16 bits
        if (in16) {
          float *p16[4] = {w16, m16, v16, a16}, *p32[4];
          for (int j = 0; j < 4; j++) {
            p32[j] = kdrt_cuda_alloc(n);
            kdrt_cuda_unpack16(D, kind, p32[j], (const uint16_t *)p16[j], n);
          }
          dw = p32[0], dm = p32[1], dv = p32[2], da = p32[3];
        }
        const char *how = in16 ? ", kept in 16 bits" : "";
        snprintf(full, sizeof full, "%s %s (3 steps%s): weights", name, t, how);
        check(full, dw, hw, n, 0);
        snprintf(full, sizeof full, "%s %s (3 steps%s): slots", name, t, how);
        if (which != 1) check(full, dm, hm, n, 0);
        if (which != 4) check(full, dv, hv, n, 0);
        if (which == 0) check(full, da, ha, n, 0);
        if (in16) kdrt_cuda_free(dw), kdrt_cuda_free(dm), kdrt_cuda_free(dv), kdrt_cuda_free(da);
      }
      kdrt_cuda_free(w), kdrt_cuda_free(m), kdrt_cuda_free(v), kdrt_cuda_free(a);
      kdrt_cuda_free(w16), kdrt_cuda_free(m16), kdrt_cuda_free(v16), kdrt_cuda_free(a16);
      free(hw), free(hm), free(hv), free(ha);
    }
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    const size_t k = 257;
    float *hg = hrand(k, -1, 1), *hs = hrand(k, 0.01f, 9.0f), *hf = hzero(k), *hr = hzero(k);
    float *g = dev(hg, k), *s = dev(hs, k), *f = kdrt_cuda_alloc(k);
    char name[96];
    const char *t = kind == KDRT_ROUND_F16 ? "float16" : "bfloat16";
    for (int global = 0; global <= 1; global++) {
      kdrt_grad_clip_factor16(hf, hs, 1.5f, global, kind);
      kdrt_cuda_grad_clip_factor16(D, f, s, 1.5f, global, kind);
      snprintf(name, sizeof name, "grad_clip_factor16 %s global %d", t, global);
      check(name, f, hf, 1, 0);
      memcpy(hr, hg, k * sizeof *hr);
      kdrt_clip_grad16(hr, k, hf, global ? 0.0f : 1.5f, kind);
      kdrt_cuda_clip_grad16(D, g, k, f, global ? 0.0f : 1.5f, kind);
      snprintf(name, sizeof name, "clip_grad16 %s global %d", t, global);
      check(name, g, hr, k, 0);
      memcpy(hg, hr, k * sizeof *hg);
    }
    kdrt_clip_norm16(hf, hs, k, 0.2f, 0.5f, 0.5f, 0.5f, kind);
    kdrt_cuda_clip_norm16(D, f, s, k, 0.2f, 0.5f, 0.5f, 0.5f, kind);
    snprintf(name, sizeof name, "clip_norm16 %s", t);
    check(name, f, hf, k, 0);
    kdrt_cuda_free(g), kdrt_cuda_free(s), kdrt_cuda_free(f);
    free(hg), free(hs), free(hf), free(hr);
  }
}

// issue 23: a 16-bit UnitNorm's factors (unit_norm16) from sums of squares
// (zero among them: epsilon alone), and a 16-bit activity penalty over rows
// its type rounds (batch_mean16: 2049 in float16, 257 in bfloat16), exact.
static void check_penalty16(void) {
  for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
    const size_t k = 257;
    float *hs = hrand(k, 0.0f, 9.0f), *hf = hzero(k);
    hs[0] = 0.0f;
    float *s = dev(hs, k), *f = kdrt_cuda_alloc(k);
    char name[96];
    const char *t = kind == KDRT_ROUND_F16 ? "float16" : "bfloat16";
    kdrt_unit_norm16(hf, hs, k, kind);
    kdrt_cuda_unit_norm16(D, f, s, k, kind);
    snprintf(name, sizeof name, "unit_norm16 %s", t);
    check(name, f, hf, k, 0);
    const double rows = kind == KDRT_ROUND_F16 ? 2049.0 : 257.0;
    kdrt_batch_mean16(hf, hs, k, rows, kind);
    kdrt_cuda_batch_mean16(D, f, s, k, rows, kind);
    snprintf(name, sizeof name, "batch_mean16 %s over %g rows", t, rows);
    check(name, f, hf, k, 0);
    kdrt_cuda_free(s), kdrt_cuda_free(f);
    free(hs), free(hf);
  }
}

// issue 11's layer kernels (pact and its gradient, ema, clip_norm,
// load_const) and the optimizers' helpers (weight_decay, clip_grad,
// grad_clip_factor). The in-place ones start from the same contents on
// both sides, uploaded again before each.
static void check_layers(void) {
  const size_t n = 1031;
  float *hx = hrand(n, -3, 3), *hdy = hrand(n, -1, 1), *hw = hrand(n, -1, 1);
  float *hs = hrand(n, 0.01f, 9.0f), *ref = hzero(n);
  float *x = dev(hx, n), *dy = dev(hdy, n), *s = dev(hs, n), *w = dev(hw, n);
  float *y = kdrt_cuda_alloc(n);
  char name[96];
  static const struct {
    int kind;
    float alpha, max, threshold;
    const char *what;
  } pc[] = {
    {KDRT_PACT_LEAKY, 0.3f, INFINITY, 0.0f, "leaky_relu 0.3"},
    {KDRT_PACT_ELU, 1.5f, INFINITY, 0.0f, "elu 1.5"},
    {KDRT_PACT_RELU, 0.0f, 2.0f, 0.0f, "relu max 2"},
    {KDRT_PACT_RELU, 0.1f, 2.0f, 0.5f, "relu slope 0.1 max 2 threshold 0.5"},
  };
  for (size_t k = 0; k < sizeof pc / sizeof pc[0]; k++) {
    kdrt_pact(pc[k].kind, ref, hx, n, pc[k].alpha, pc[k].max, pc[k].threshold);
    poison(y, n);
    kdrt_cuda_pact(D, pc[k].kind, y, x, n, pc[k].alpha, pc[k].max, pc[k].threshold);
    snprintf(name, sizeof name, "pact %s", pc[k].what);
    check(name, y, ref, n, 1e-6);
    kdrt_pact_grad(pc[k].kind, ref, hdy, hx, n, pc[k].alpha, pc[k].max, pc[k].threshold);
    poison(y, n);
    kdrt_cuda_pact_grad(D, pc[k].kind, y, dy, x, n, pc[k].alpha, pc[k].max, pc[k].threshold);
    snprintf(name, sizeof name, "pact_grad %s", pc[k].what);
    check(name, y, ref, n, 1e-6);
  }
  // MaxNorm(2), UnitNorm, MinMaxNorm(0.5, 2, rate 0.7) on norms in [0.1, 3)
  static const float cn[][4] = {{0.0f, 2.0f, 1.0f, 0.0f}, {1.0f, 1.0f, 1.0f, 0.0f},
                                {0.5f, 2.0f, 0.7f, 0.3f}};
  for (size_t k = 0; k < sizeof cn / sizeof cn[0]; k++) {
    kdrt_clip_norm(ref, hs, n, cn[k][0], cn[k][1], cn[k][2], cn[k][3]);
    poison(y, n);
    kdrt_cuda_clip_norm(D, y, s, n, cn[k][0], cn[k][1], cn[k][2], cn[k][3]);
    snprintf(name, sizeof name, "clip_norm [%g, %g] rate %g", cn[k][0], cn[k][1], cn[k][2]);
    check(name, y, ref, n, 1e-6);
  }
  poison(y, n);
  kdrt_cuda_load_const(D, y, hx, n);
  check("load_const", y, hx, n, 0);
  const float momentum = 0.99f;
  kdrt_ema(hw, hx, n, momentum, 1.0f - momentum);
  kdrt_cuda_ema(D, w, x, n, momentum, 1.0f - momentum);
  check("ema (in place)", w, hw, n, 1e-6);
  kdrt_cuda_upload(D, w, hw, n);
  kdrt_weight_decay(hw, n, 0.01f, 0.004f);
  kdrt_cuda_weight_decay(D, w, n, 0.01f, 0.004f);
  check("weight_decay (in place)", w, hw, n, 1e-6);
  const float hf = 0.7f;
  float *f = dev(&hf, 1);
  for (int k = 0; k < 3; k++) {
    const float *fk = k == 1 ? NULL : f, clip = k == 2 ? 0.0f : 0.3f;
    kdrt_cuda_upload(D, w, hw, n);
    kdrt_clip_grad(hw, n, fk ? &hf : NULL, clip);
    kdrt_cuda_clip_grad(D, w, n, fk, clip);
    snprintf(name, sizeof name, "clip_grad (in place)%s clipvalue %g", fk ? " by 0.7," : "", clip);
    check(name, w, hw, n, 1e-6);
  }
  // a norm above and below c, 0, and not finite (NaN factors); the device
  // output starts poisoned, or finite where NaN is the answer
  static const float sq[] = {7.3f, 0.2f, 0.0f, INFINITY, NAN};
  for (size_t k = 0; k < sizeof sq / sizeof sq[0]; k++)
    for (int global = 0; global < 2; global++) {
      float href, other = -1234.5f;
      kdrt_grad_clip_factor(&href, &sq[k], 1.0f, global);
      kdrt_cuda_upload(D, s, &sq[k], 1);
      if (isnan(href)) kdrt_cuda_upload(D, y, &other, 1);
      else poison(y, 1);
      kdrt_cuda_grad_clip_factor(D, y, s, 1.0f, global);
      snprintf(name, sizeof name, "grad_clip_factor%s s=%g", global ? " global" : "", sq[k]);
      check(name, y, &href, 1, 1e-6);
    }
  kdrt_cuda_free(x), kdrt_cuda_free(dy), kdrt_cuda_free(s), kdrt_cuda_free(w);
  kdrt_cuda_free(y), kdrt_cuda_free(f);
  free(hx), free(hdy), free(hw), free(hs), free(ref);
}

// issue 11: the recurrence of each cell and its gradient (matrix products
// every step), and the step reversal
static void check_rnn(void) {
  const int64_t B = 5, T = 7, U = 6;
  static const char *const cells[] = {"simple", "lstm", "gru", "gru reset_after=False"};
  for (int cell = 0; cell < 4; cell++) {
    int64_t GU = kdrt_rnn_gates(cell) * U, S = kdrt_rnn_width(cell, U);
    int64_t W = kdrt_rnn_grad_width(cell, U);
    size_t nx = (size_t)(B * T * GU), ny = (size_t)(B * T * S), nd = (size_t)(B * T * W);
    float *hxw = hrand(nx, -1, 1), *hr = hrand((size_t)(U * GU), -0.5f, 0.5f);
    float *hb = hrand((size_t)GU, -0.3f, 0.3f), *hdy = hrand(ny, -1, 1);
    float *hy = hzero(ny), *hd = hzero(nd);
    float *xw = dev(hxw, nx), *r = dev(hr, (size_t)(U * GU)), *b = dev(hb, (size_t)GU);
    float *dy = dev(hdy, ny), *y = kdrt_cuda_alloc(ny), *d = kdrt_cuda_alloc(nd);
    const float *brec = cell == KDRT_RNN_GRU ? b : NULL;
    // The record is poisoned once: step t writes its own rows and reads
    // step t - 1's, so a slot no step writes, or a read ahead, shows.
    poison(y, ny);
    for (int64_t t = 0; t < T; t++) {
      kdrt_recur(cell, KDRT_ACT_TANH, KDRT_ACT_SIGMOID, hy, hxw, hr, brec ? hb : NULL, B, T, U, t);
      kdrt_cuda_recur(D, cell, KDRT_ACT_TANH, KDRT_ACT_SIGMOID, y, xw, r, brec, B, T, U, t);
    }
    char name[64];
    snprintf(name, sizeof name, "recur %s", cells[cell]);
    check(name, y, hy, ny, tol_mm);
    float *yd = dev(hy, ny); // the CPU's record, so only the gradient is compared
    poison(d, nd);
    for (int64_t t = T - 1; t >= 0; t--) {
      kdrt_recur_grad(cell, KDRT_ACT_TANH, KDRT_ACT_SIGMOID, hd, hdy, hy, hr, B, T, U, t);
      kdrt_cuda_recur_grad(D, cell, KDRT_ACT_TANH, KDRT_ACT_SIGMOID, d, dy, yd, r, B, T, U, t);
    }
    snprintf(name, sizeof name, "recur_grad %s", cells[cell]);
    check(name, d, hd, nd, tol_mm);
    kdrt_reverse(hd, hxw, B, T, GU);
    poison(d, nx);
    kdrt_cuda_reverse(D, d, xw, B, T, GU);
    snprintf(name, sizeof name, "reverse [%lld, %lld, %lld]", (long long)B, (long long)T,
             (long long)GU);
    check(name, d, hd, nx, 0);
    kdrt_cuda_free(xw), kdrt_cuda_free(r), kdrt_cuda_free(b), kdrt_cuda_free(dy);
    kdrt_cuda_free(y), kdrt_cuda_free(d), kdrt_cuda_free(yd);
    free(hxw), free(hr), free(hb), free(hdy), free(hy), free(hd);
  }
}

static int usage(const char *why, const char *arg) {
  fprintf(stderr, "opcheck: %s%s%s\n", why, arg ? ": " : "", arg ? arg : "");
  fprintf(stderr, "usage: train opcheck [--repeat N] [--seed S] [--matmul-tol X]\n");
  return 2;
}

extern "C" int kdrt_cuda_opcheck(int argc, char **argv, int precision) {
  long repeat = 1;
  uint64_t seed0 = 1;
  for (int i = 1; i < argc; i++) {
    const char *opt = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (strcmp(opt, "--repeat") && strcmp(opt, "--seed") && strcmp(opt, "--matmul-tol"))
      return usage("unknown argument", opt);
    if (!v || !*v) return usage("a value must follow", opt);
    i++;
    if (!strcmp(opt, "--repeat")) {
      repeat = strtol(v, &end, 10);
      if (*end || repeat < 1 || repeat > 1000000) return usage("--repeat wants a count >= 1", v);
    } else if (!strcmp(opt, "--seed")) {
      seed0 = strtoull(v, &end, 0);
      if (*end || *v == '-') return usage("--seed wants an unsigned integer", v);
    } else {
      tol_mm = strtod(v, &end);
      if (*end || !(tol_mm >= 0)) return usage("--matmul-tol wants a number >= 0", v);
    }
  }
  // bf16: operands rounded to 8 significant bits (normalised errors of
  // 1e-3..1e-2); tf32: to 11 bits.
  if (precision == KDRT_PREC_TF32 && tol_mm < 5e-3) tol_mm = 5e-3;
  if (precision == KDRT_PREC_BF16 && tol_mm < 3e-2) tol_mm = 3e-2;
  static const int mesh_shape[2] = {2, 2};
  static const char *const mesh_axes[2] = {"data", "model"};
  static kdrt_program prog; // a (2, 2) mesh, so that dropout sees a sharded block
  prog.model_name = "opcheck", prog.mesh_ndim = 2, prog.mesh_shape = mesh_shape;
  prog.mesh_axes = mesh_axes, prog.batch_axis = -1, prog.batch = 1;
  static kdrt_ctx c;
  c.prog = &prog, c.rank = 0, c.world = 1, c.coord[0] = 1, c.coord[1] = 1;
  D = kdrt_cuda_open(&c, precision);
  cudaDeviceProp p;
  CUDA_CHECK(cudaGetDeviceProperties(&p, D->impl->device));
  static const char *const prec_names[] = {"fp32", "tf32", "bf16"};
  printf("opcheck: CUDA kernels against the CPU runtime on %s (sm_%d%d), --precision %s, "
         "matmul tolerance %.0e\n",
         p.name, p.major, p.minor, precision >= 0 && precision < 3 ? prec_names[precision] : "?",
         tol_mm);
  for (long r = 0; r < repeat; r++) {
    const uint64_t seed = seed0 + (uint64_t)r; // every operand of the round, dropout's masks too
    const int checks0 = checks, failures0 = failures;
    reseed(seed);
    c.seed = seed;
    printf("opcheck: round %ld of %ld, --seed %llu\n", r + 1, repeat, (unsigned long long)seed);
    check_elementwise();
    check_rnd();
    check_bias();
    check_softmax();
    check_softmax_warps();
    check_glu();
    check_attention();
    check_norm();
    check_layer_norm();
    check_losses();
    check_xent();
    check_matmul();
    check_matmul_bias();
    check_conv();
    check_bn_stats2();
    check_pool();
    check_blocks();
    check_nd();
    check_dropout(&c);
    check_comm16(&c);
    check_optim();
    check_optim16();
    check_penalty16();
    check_layers();
    check_rnn();
    printf("opcheck: round %ld (--seed %llu): %d checks, %d failed\n", r + 1,
           (unsigned long long)seed, checks - checks0, failures - failures0);
    fflush(stdout);
  }
  printf("opcheck: %ld rounds, %d checks, %d failed\n", repeat, checks, failures);
  return failures ? 1 : 0;
}
