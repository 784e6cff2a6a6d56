// ops_impl.h: what the CPU kernel files share, ops.c (the matrix products,
// elementwise and window kernels), loss.c, optim.c and norm.c, and no other
// file includes: the OpenMP loop and its threshold, the row blocks of the
// sums over rows, the abort on a bad call and softmax's flushed exp. They
// stay static, as in the one file the four were until issue 25. Threads
// and determinism: ops.c's header comment.
#ifndef KDRT_OPS_IMPL_H
#define KDRT_OPS_IMPL_H

#include <stdio.h>
#include <stdlib.h>

#include "vmath.h"

// Loops over fewer elements than this stay on one thread: a parallel region
// costs a few microseconds.
#define KD_PAR_MIN 32768
#define KD_PRAGMA(x) _Pragma(#x)
// `#pragma omp parallel for` over a loop of about `work` elements.
#define KD_PAR_FOR(work) KD_PRAGMA(omp parallel for schedule(static) if ((work) >= KD_PAR_MIN))

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
