// ops_impl.h: what the CPU kernel files share, ops.c (the matrix products,
// elementwise and window kernels), loss.c, optim.c and norm.c, and no other
// file includes: the OpenMP loop and its threshold, the row blocks of the
// sums over rows, the abort on a bad call, the affine map with an
// activation of bias_act and batch_norm and softmax's flushed exp. They
// stay static, as in the one file the four were until issue 25. Threads
// and determinism: ops.c's header comment.
#ifndef KDRT_OPS_IMPL_H
#define KDRT_OPS_IMPL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kdrt_defs.h" // KDRT_ACT_LIST
#include "kdrt_round.h" // kdrt_round_opt: the _rnd kernels' stores
#include "vmath.h"

// Loops over fewer elements than this stay on one thread: a parallel region
// costs a few microseconds.
#define KD_PAR_MIN 32768
#define KD_PRAGMA(x) _Pragma(#x)
// `#pragma omp parallel for` over a loop of about `work` elements.
#define KD_PAR_FOR(work) KD_PRAGMA(omp parallel for schedule(static) if ((work) >= KD_PAR_MIN))

// The statements once for each rounding a _rnd kernel takes (kdrt_ops.def),
// R the constant KDRT_ROUND_* of rnd in each copy: their stores
// kdrt_round_opt(R, v). Each loop is compiled for its own kind (the
// float32 one as it was before the rounding kernels, vectorised; rnd itself
// would reach an OpenMP loop's body as a variable, and the loop would
// compute both roundings for every element).
#define KD_ROUNDED(rnd, ...)                                                                     \
  do {                                                                                           \
    if ((rnd) == KDRT_ROUND_BF16) {                                                              \
      enum { R = KDRT_ROUND_BF16 };                                                              \
      __VA_ARGS__                                                                                \
    } else if ((rnd) == KDRT_ROUND_F16) {                                                        \
      enum { R = KDRT_ROUND_F16 };                                                               \
      __VA_ARGS__                                                                                \
    } else {                                                                                     \
      enum { R = KDRT_ROUND_NONE };                                                              \
      __VA_ARGS__                                                                                \
    }                                                                                            \
  } while (0)

// A bad argument is a bug in the generated program: say which call, abort.
// noinline, noclone: loss.c's one call would take it in, or a copy, which
// the file all the kernels were in never did; unused: optim.c has none.
__attribute__((noinline, noclone, unused)) static void bad_call(const char *what, const char *why) {
  fprintf(stderr, "kdrt: %s: %s\n", what, why);
  abort();
}

// Rows summed per block in kdrt_bias_grad: a few blocks a thread for a
// [B*OH*OW, K] conv gradient, one block (the plain row order) for a Dense
// layer's [B, units]. norm.c's sums over rows use the same blocks.
#define KD_SUM_BLOCK 1024

// Column sums over rows in the one order kdrt_bias_grad defines, for the
// sums that follow it (bias_grad's own, layer_norm_dw's two): add(ctx, acc,
// stride, r0, r1, j0, n) adds quantity i at rows [r0, r1) (in row order)
// and columns [j0, j0 + n) into acc[i * stride + j - j0]; out[i] (NULL:
// not wanted) gets the sums of quantity i, for i < nout (at most 2).
typedef void kd_add_rows(const void *ctx, float *restrict acc, int64_t stride, int64_t r0,
                         int64_t r1, int64_t j0, int64_t n);
void kd_col_sums(float *const *out, int nout, kd_add_rows *add, const void *ctx, int64_t rows,
                 int64_t cols, const char *who);

// out[r, j] = f(in[r, j] * scale[j] + shift[j]), f the activation act: a
// per-column affine map with its activation, one loop per activation (as
// kdrt_act). kdrt_bias_act's is in + bias (scale NULL: no product, not a
// product by 1), kdrt_batch_norm's x * scale + shift; each value rounded
// to rnd (KDRT_ROUND_*) as it is stored. out may be in. Returns 0 for an
// unknown activation.
static inline int col_affine_act(int rnd, int act, float *out, const float *in,
                                 const float *scale, const float *shift, int64_t rows,
                                 int64_t cols) {
#define KDRT_X(name, kname, from_x, f, df)                                                       \
  case KDRT_ACT_##name:                                                                          \
    KD_PAR_FOR(rows * cols)                                                                      \
    for (int64_t r = 0; r < rows; r++) {                                                         \
      const float *ir = in + r * cols;                                                           \
      float *orow = out + r * cols;                                                              \
      for (int64_t j = 0; j < cols; j++) {                                                       \
        float v = scale ? ir[j] * scale[j] + shift[j] : ir[j] + shift[j];                        \
        orow[j] = kdrt_round_opt(R, f);                                                          \
      }                                                                                          \
    }                                                                                            \
    return 1;
  KD_ROUNDED(rnd, switch (act) { KDRT_ACT_LIST(KDRT_X) });
#undef KDRT_X
  return 0;
}

// exp(x), but 0 where that is below 2^-125 (about 2.4e-38, twice the
// smallest normal float): for the exps of x less its row's maximum, whose
// sum holds exp(0) = 1 and so cannot change by what is flushed. libmvec
// takes a slow scalar path for a lane whose result is not a normal float,
// and masked attention scores are half of every causal row: the input is
// clamped at -87 (exp(-87) < 2^-125, flushed after). The flush tests the
// result, not x, so that GCC keeps the call out of a branch and vectorises.
static inline float exp_flush(float x) {
  const float e = kdrt_expf(x < -87.0f ? -87.0f : x);
  return e < 0x1p-125f ? 0.0f : e;
}

#endif
