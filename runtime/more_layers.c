// more_layers.c: the CPU kernels of issue 11's later layers: Maximum and
// Minimum (and the normalizations' clamps), and constants (SpatialDropout's
// ones, Normalization's statistics); issue 23's rounding to a 16-bit type,
// and its storage in 16 bits.
// The CUDA versions are cuda/more_layers.cu; GaussianNoise's is in rng.c.
#include "kdrt.h"
#include "kdrt_round.h"

#include <math.h>
#include <string.h>

// Whether a beats o: the larger (the smaller with min), or a NaN, which
// lax.max and lax.min propagate.
static inline int wins(float a, float o, int min) { return (min ? a < o : a > o) || a != a; }

void kdrt_maximum(float *y, const float *a, const float *b, float c, int min, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float o = b ? b[i] : c;
    y[i] = wins(a[i], o, min) ? a[i] : o;
  }
}

// JAX's gradient of max(a, o) with respect to a: 1 where a alone is the
// result, 1/2 where a equals o (a tie shares it), else 0.
void kdrt_maximum_grad(float *dx, const float *dy, const float *a, const float *b, float c,
                       int min, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float o = b ? b[i] : c;
    dx[i] = a[i] == o ? dy[i] * 0.5f : (min ? a[i] < o : a[i] > o) ? dy[i] : 0.0f;
  }
}

void kdrt_fill(float *y, float v, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = v;
}

void kdrt_load_const(float *y, const float *k, size_t n) { memcpy(y, k, n * sizeof *y); }

// issue 23: a mixed policy's cast to its compute dtype, kept in float32
void kdrt_round(int kind, float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = kdrt_round_to(kind, x[i]);
}

// issue 23: a saved value of the 16-bit type stored in 16 bits, and back
// (kdrt_round.h): the same float32, bit for bit. One loop a type, each
// vectorised.
void kdrt_pack16(int kind, uint16_t *restrict y, const float *restrict x, size_t n) {
  if (kind == KDRT_ROUND_F16)
    for (size_t i = 0; i < n; i++) y[i] = kdrt_f16_bits(x[i]);
  else
    for (size_t i = 0; i < n; i++) y[i] = kdrt_bf16_bits(x[i]);
}

void kdrt_unpack16(int kind, float *restrict y, const uint16_t *restrict x, size_t n) {
  if (kind == KDRT_ROUND_F16)
    for (size_t i = 0; i < n; i++) y[i] = kdrt_f16_value(x[i]);
  else
    for (size_t i = 0; i < n; i++) y[i] = kdrt_bf16_value(x[i]);
}
