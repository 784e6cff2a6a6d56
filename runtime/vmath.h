// vmath.h: the transcendental functions of the CPU kernels, vectorised,
// each element's result the same wherever it falls.
//
// kdrt_expf and the others are declared here as SIMD functions, so GCC
// vectorises a loop that calls them (a loop of `y[i] = f(x[i])` calls the
// 8-lane version, its remainder a 4-lane or the scalar one), and
// runtime/vmath.c defines every one of those entry points on a single
// function of 8 lanes: glibc's libmvec (AVX2) in a build for x86-64-v3 or
// newer, libm's scalar function in a build for an older CPU. An element's
// result depends on its value alone, not on the thread count, the mesh,
// the alignment or the entry point; libmvec is 2 to 20 times faster than
// libm's scalar calls here, and within 4 ulp (its documented bound).
//
// Including this file maps kdrt_defs.h's KDRT_EXPF ... onto these, so the
// activation formulas of KDRT_ACT_LIST call them when ops.c expands it.
// A conditional select in such a loop vectorises only with
// -fno-trapping-math (the Makefile's RCFLAGS), which changes no result.
#ifndef KDRT_VMATH_H
#define KDRT_VMATH_H

// X(name): float kdrt_<name>f(float), as libm's <name>f.
#define KDRT_VMATH_LIST(X) X(exp) X(expm1) X(log1p) X(erf) X(tanh) X(cosh)

// vmath.c defines the functions itself and must not see the attribute
// (GCC would then make the vector versions from the scalar body).
// Elsewhere than x86-64 the vector entry points are not made (vmath.c).
#ifndef KDRT_VMATH_IMPL
#if defined(__x86_64__)
#define KDRT_VMATH_SIMD simd("notinbranch"),
#else
#define KDRT_VMATH_SIMD
#endif
#define KDRT_X(name) float kdrt_##name##f(float) __attribute__((KDRT_VMATH_SIMD const));
KDRT_VMATH_LIST(KDRT_X)
#undef KDRT_X
#endif

#include "kdrt_defs.h"
#undef KDRT_EXPF
#undef KDRT_EXPM1F
#undef KDRT_LOG1PF
#undef KDRT_ERFF
#undef KDRT_TANHF
#undef KDRT_COSHF
#define KDRT_EXPF kdrt_expf
#define KDRT_EXPM1F kdrt_expm1f
#define KDRT_LOG1PF kdrt_log1pf
#define KDRT_ERFF kdrt_erff
#define KDRT_TANHF kdrt_tanhf
#define KDRT_COSHF kdrt_coshf

#endif
