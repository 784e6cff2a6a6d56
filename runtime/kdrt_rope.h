// kdrt_rope.h: rotary position embedding (keras-hub's RotaryEmbedding),
// written once for the CPU runtime (ops.c's kdrt_rope) and the CUDA one
// (cuda/rope.cu), and read by kdcc, which fills the descriptor: plain C99
// that also compiles as CUDA C++ (KDRT_HD marks host and device), as
// kdrt_rnn.h.
//
// x[.., t, .., 2h] (the sequence axis 1, the features last): feature pair
// (j, j + h) of step t turns by the angle a = pos * inv_freq[j], pos = t's
// global position. keras-hub computes, in float32:
//   freq = pos * inv_freq (einsum "bi,j->bij"), emb = concat(freq, freq),
//   y = (x * cos(emb)) + (rotate_half(x) * sin(emb)), rotate_half(x) =
//   concat(-x2, x1),
// so y[j] = x[j] * c - x[j + h] * s and y[j + h] = x[j + h] * c + x[j] * s,
// which XLA's CPU backend contracts into fused multiply-adds (and its
// gradient, the turn by -a, into others): here the same ones, so that the
// results are Keras's bits. The inverse frequencies, which hold every
// scaling keras-hub applies (linear, dynamic, YaRN, Llama 3.1's), are
// kdcc's (ops_nn.c's rope_inv_freq), so both backends read the same. cos
// and sin: on the CPU glibc's cosf and sinf, which XLA's CPU backend calls
// (the same bits, but where XLA fuses YaRN's factor into them: within an
// ulp there); on the GPU the double ones rounded, within an ulp.
#ifndef KDRT_ROPE_H
#define KDRT_ROPE_H

#include <math.h>
#include <stdint.h>

#include "kdrt_defs.h" // KDRT_HD
#include "kdrt_round.h"

// The most pairs a row may have (a head dim of 1024); the descriptor goes
// to a CUDA kernel by value, under its 4 KB of parameters.
#define KDRT_ROPE_MAX_HALF 512

typedef struct {
  int64_t half;                       // h: the feature dim is 2h
  float scale;                        // cos and sin times it (YaRN's temperature; 1: none)
  int rounding;                       // issue 23: KDRT_ROUND_* cos and sin are cast to, or 0
  float inv_freq[KDRT_ROPE_MAX_HALF]; // pair j's inverse frequency, [h]
} kdrt_rotary;

// The cosine and sine of pair j at global position pos.
static inline KDRT_HD void kdrt_rope_cs(const kdrt_rotary *r, int64_t pos, int64_t j,
                                        float *c, float *s) {
  float a = (float)pos * r->inv_freq[j];
#ifdef __CUDA_ARCH__
  *c = (float)cos((double)a) * r->scale;
  *s = (float)sin((double)a) * r->scale;
#else
  *c = cosf(a) * r->scale;
  *s = sinf(a) * r->scale;
#endif
  if (r->rounding) { // issue 23: cast to the compute dtype (YaRN's factor: not rounded apart)
    *c = kdrt_round_to(r->rounding, *c);
    *s = kdrt_round_to(r->rounding, *s);
  }
}

// One pair (x0, x1) = (x[j], x[j + h]) turned: forward by the angle of
// (c, s), inverse (the gradient) by its negative, each product rounded or
// fused as XLA computes keras-hub's forward and JAX's gradient of it.
// mode: bit 0 the inverse; above it (issue 23) the 16-bit type (KDRT_ROUND_*)
// of a mixed policy, where keras-hub's bfloat16 x * cos + rotate_half(x) *
// sin rounds each product and the sum (XLA keeps them: its jitted result is
// the eager one's bit for bit), and JAX's gradient its dy * cos, dy * sin
// and their sum alike.
static inline KDRT_HD void kdrt_rope_pair(float x0, float x1, float c, float s, int mode,
                                          float *y0, float *y1) {
  const int inverse = mode & 1, k = mode >> 1;
  if (k) {
    float x0c = kdrt_round_to(k, x0 * c), x1c = kdrt_round_to(k, x1 * c);
    float x0s = kdrt_round_to(k, x0 * s), x1s = kdrt_round_to(k, x1 * s);
    *y0 = kdrt_round_to(k, inverse ? x0c + x1s : x0c - x1s);
    *y1 = kdrt_round_to(k, inverse ? x1c - x0s : x1c + x0s);
    return;
  }
  if (inverse) {
    *y0 = fmaf(x1, s, x0 * c);
    *y1 = fmaf(x1, c, -(x0 * s));
  } else {
    *y0 = fmaf(x0, c, -x1 * s);
    *y1 = fmaf(x1, c, x0 * s);
  }
}

#endif
