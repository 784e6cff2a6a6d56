// kdrt_round.h (issue 23): a float32 rounded to bfloat16 or float16 and
// kept in float32, written once for the CPU runtime (more_layers.c) and the
// CUDA one (cuda/more_layers.cu), so that both give the same bits. It is
// what a cast to the compute dtype of a mixed policy does to a value in
// Keras (ml_dtypes and XLA: round to nearest, ties to even; overflow to
// infinity; float16's subnormals kept): the value a 16-bit tensor would
// hold, in a float32 buffer; and such a value as its 16 bits and back (a
// saved activation stored in 16 bits). Integer arithmetic only, so that no
// compiler flag (contraction, flush to zero) changes it. Plain C99 that also
// compiles as CUDA C++ (KDRT_HD marks host and device), as kdrt_philox.h.
#ifndef KDRT_ROUND_H
#define KDRT_ROUND_H

#include <stdint.h>
#include <string.h>

#include "kdrt_defs.h"

static inline KDRT_HD uint32_t kdrt_f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline KDRT_HD float kdrt_bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// bfloat16 keeps float32's exponent and 7 of its 23 fraction bits: add
// half an ulp (less one when the kept part is even) and cut. A NaN stays
// the NaN it is; the largest finite values round to infinity.
static inline KDRT_HD float kdrt_round_bf16(float x) {
  uint32_t u = kdrt_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;
  u += 0x7fffu + ((u >> 16) & 1u);
  return kdrt_bits_f32(u & 0xffff0000u);
}

// float16: 10 fraction bits, exponents down to 2^-14, subnormals in steps
// of 2^-24 below it, 65504 the largest finite value (65520 and up round
// to infinity).
static inline KDRT_HD float kdrt_round_f16(float x) {
  uint32_t u = kdrt_f32_bits(x), a = u & 0x7fffffffu, sign = u & 0x80000000u;
  if (a >= 0x7f800000u) return x; // infinities and NaNs
  if (a >= 0x38800000u) {         // |x| >= 2^-14: a normal float16, or too large for one
    a += 0xfffu + ((a >> 13) & 1u);
    a &= ~0x1fffu;
    if (a > 0x477fe000u) a = 0x7f800000u;
    return kdrt_bits_f32(sign | a);
  }
  // a subnormal float16: |x| = m * 2^(e - 150) in steps of 2^-24, e < 113
  uint32_t e = a >> 23, q = 0;
  if (e) {
    uint32_t m = (a & 0x7fffffu) | 0x800000u, s = 126 - e; // |x| / 2^-24 = m / 2^s, s >= 14
    if (s < 26) {
      uint32_t rest = m & ((1u << s) - 1), half = 1u << (s - 1);
      q = m >> s;
      q += rest > half || (rest == half && (q & 1u));
    }
  }
  float r = (float)q * 5.9604644775390625e-08f; // q * 2^-24, exact (q <= 1024)
  return kdrt_bits_f32(kdrt_f32_bits(r) | sign);
}

// x rounded to the 16-bit type `kind` (KDRT_ROUND_BF16 or KDRT_ROUND_F16).
static inline KDRT_HD float kdrt_round_to(int kind, float x) {
  return kind == KDRT_ROUND_F16 ? kdrt_round_f16(x) : kdrt_round_bf16(x);
}

// x as an op that rounds its result as it stores it writes it (kdcc's
// fuse.c, fuse_rounds: the ROUND after the op folded into its kernel, the
// _rnd kernels of kdrt_ops.def): rounded to `kind`, or x itself for
// KDRT_ROUND_NONE. The same bits as the ROUND's pass after it.
static inline KDRT_HD float kdrt_round_opt(int kind, float x) {
  return kind == KDRT_ROUND_NONE ? x : kdrt_round_to(kind, x);
}

// Issue 23's storage in 16 bits (kdcc's store16.c): x, a value of the
// type (kdrt_round_to's result), as the type's 16 bits, and back:
// kdrt_bf16_value(kdrt_bf16_bits(x)) is x bit for bit, and so for float16;
// a NaN comes back a quiet NaN of the same sign (the low bits of its
// payload may not: an arithmetic NaN has none). kdcc stores no other x
// (of another, the bits are cut, not rounded). Selects, not branches, so
// that the kernels' loops vectorise.
static inline KDRT_HD uint16_t kdrt_bf16_bits(float x) {
  uint32_t u = kdrt_f32_bits(x);
  return (uint16_t)((u >> 16) | ((u & 0x7fffffffu) > 0x7f800000u ? 0x40u : 0u));
}

static inline KDRT_HD float kdrt_bf16_value(uint16_t h) { return kdrt_bits_f32((uint32_t)h << 16); }

static inline KDRT_HD uint16_t kdrt_f16_bits(float x) {
  uint32_t u = kdrt_f32_bits(x), a = u & 0x7fffffffu, e = a >> 23;
  uint32_t normal = (a - 0x38000000u) >> 13;                 // the exponent less 112
  uint32_t s = 126 - e > 31 ? 31 : 126 - e;                  // below 2^-14: q * 2^-24
  uint32_t q = ((a & 0x7fffffu) | 0x800000u) >> s;           // (0 below 2^-24)
  uint32_t h = a > 0x7f800000u    ? 0x7e00u | ((a >> 13) & 0x3ffu) // NaN, quiet
               : a >= 0x38800000u ? (normal < 0x7c00u ? normal : 0x7c00u) // or infinity
                                  : q;
  return (uint16_t)(((u >> 16) & 0x8000u) | h);
}

static inline KDRT_HD float kdrt_f16_value(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return kdrt_bits_f32(sign | 0x7f800000u | (m << 13));
  if (e) return kdrt_bits_f32(sign | ((e + 112) << 23) | (m << 13));
  float r = (float)m * 5.9604644775390625e-08f; // m * 2^-24, exact, as kdrt_round_f16 makes it
  return kdrt_bits_f32(kdrt_f32_bits(r) | sign);
}

// The same for the 16-bit type `kind` (KDRT_ROUND_BF16 or KDRT_ROUND_F16),
// as kdrt_round_to picks it.
static inline KDRT_HD uint16_t kdrt_bits16(int kind, float x) {
  return kind == KDRT_ROUND_F16 ? kdrt_f16_bits(x) : kdrt_bf16_bits(x);
}

static inline KDRT_HD float kdrt_value16(int kind, uint16_t h) {
  return kind == KDRT_ROUND_F16 ? kdrt_f16_value(h) : kdrt_bf16_value(h);
}

#endif
