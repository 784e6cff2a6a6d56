// vmath.c: kdrt_expf and the rest of vmath.h's list, scalar and in the
// x86 vector-function ABI that GCC calls from a vectorised loop.
//
// Every element, whichever entry point it comes through, is computed by
// one function, kd_<name>8, on a group of 8 lanes:
// - in a build for AVX2 and FMA (x86-64-v3, the default MARCH, or newer):
//   glibc's libmvec version for AVX2, _ZGVdN8v_<name>f (its lanes do not
//   depend on each other);
// - in a build for an older CPU: libm's scalar function, lane by lane.
// The choice is made when the runtime is compiled, never at run time, so
// every rank of a program (one binary) computes alike on any CPU it runs on.
// The entry points a `simd` declaration promises on x86-64 (GCC's mangling
// _ZGV<isa>N<lanes>v_<name>: b = SSE2, 4 lanes; c = AVX and d = AVX2, 8;
// e = AVX-512F, 16) and the scalar one pad their lanes into groups of 8.
#define KDRT_VMATH_IMPL
#include "vmath.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#define KDRT_X(name)                                                                             \
  __m256 _ZGVdN8v_##name##f(__m256 x);                                                           \
  static void kd_##name##8(float y[8], const float x[8]) {                                       \
    _mm256_storeu_ps(y, _ZGVdN8v_##name##f(_mm256_loadu_ps(x)));                                 \
  }
#else
#define KDRT_X(name)                                                                             \
  static void kd_##name##8(float y[8], const float x[8]) {                                       \
    for (int i = 0; i < 8; i++)                                                                  \
      y[i] = name##f(x[i]);                                                                      \
  }
#endif
KDRT_VMATH_LIST(KDRT_X)
#undef KDRT_X

// y[0..n) = f(x[0..n)) for n <= 8, the other lanes of the group zero.
#define KD_PADDED(name, y, x, n)                                                                 \
  do {                                                                                           \
    float in_[8] = {0}, out_[8];                                                                 \
    memcpy(in_, (x), (n) * sizeof(float));                                                       \
    kd_##name##8(out_, in_);                                                                     \
    memcpy((y), out_, (n) * sizeof(float));                                                      \
  } while (0)

#define KDRT_SCALAR(name)                                                                        \
  float kdrt_##name##f(float x);                                                                 \
  float kdrt_##name##f(float x) {                                                                \
    float y;                                                                                     \
    KD_PADDED(name, &y, &x, 1);                                                                  \
    return y;                                                                                    \
  }
#if defined(__x86_64__)
// The entry point of ISA letter isa: `lanes` floats in a vt, compiled for
// tgt.
#define KD_ENTRY(name, isa, lanes, vt, tgt)                                                      \
  vt kdrt_##name##f_##isa(vt x) __asm__("_ZGV" #isa "N" #lanes "v_kdrt_" #name "f");             \
  __attribute__((target(tgt))) vt kdrt_##name##f_##isa(vt x) {                               \
    float in[lanes], out[lanes];                                                                 \
    memcpy(in, &x, sizeof in);                                                                   \
    for (int i = 0; i < (lanes); i += 8)                                                         \
      KD_PADDED(name, out + i, in + i, (lanes) - i < 8 ? (lanes) - i : 8);                      \
    memcpy(&x, out, sizeof out);                                                                 \
    return x;                                                                                    \
  }
#if defined(__AVX2__) && defined(__FMA__) // the 8-lane one is libmvec's itself
#define KD_ENTRY_D(name)                                                                         \
  __m256 kdrt_##name##f_d(__m256 x) __asm__("_ZGVdN8v_kdrt_" #name "f");                         \
  __m256 kdrt_##name##f_d(__m256 x) { return _ZGVdN8v_##name##f(x); }
#else
#define KD_ENTRY_D(name) KD_ENTRY(name, d, 8, __m256, "avx2")
#endif
#define KDRT_X(name)                                                                             \
  KDRT_SCALAR(name)                                                                              \
  KD_ENTRY(name, b, 4, __m128, "sse2")                                                           \
  KD_ENTRY(name, c, 8, __m256, "avx")                                                            \
  KD_ENTRY_D(name)                                                                               \
  KD_ENTRY(name, e, 16, __m512, "avx512f")
#else // elsewhere GCC's vector ABI differs, and vmath.h promises no entry points
#define KDRT_X(name) KDRT_SCALAR(name)
#endif
KDRT_VMATH_LIST(KDRT_X)
#undef KDRT_X
