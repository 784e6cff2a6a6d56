// more_layers.c: the CPU kernels of issue 11's later layers: Maximum and
// Minimum (and the normalizations' clamps), and constants (SpatialDropout's
// ones, Normalization's statistics); issue 23's rounding to a 16-bit type,
// and its storage in 16 bits. The CUDA versions are cuda/more_layers.cu
// (each element's math kdrt_layers.h's and kdrt_round.h's); GaussianNoise's
// is in rng.c.
#include "kdrt.h"
#include "kdrt_layers.h"
#include "kdrt_round.h"

#include <math.h>
#include <string.h>

void kdrt_maximum(float *y, const float *a, const float *b, float c, int min, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = kdrt_max1(a[i], b ? b[i] : c, min);
}

void kdrt_maximum_grad(float *dx, const float *dy, const float *a, const float *b, float c,
                       int min, size_t n) {
  for (size_t i = 0; i < n; i++) dx[i] = kdrt_max_grad1(dy[i], a[i], b ? b[i] : c, min);
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

// issue 23: a value only 16-bit products read, rounded straight to its 16 bits
void kdrt_round16(int kind, uint16_t *restrict y, const float *restrict x, size_t n) {
  if (kind == KDRT_ROUND_F16)
    for (size_t i = 0; i < n; i++) y[i] = kdrt_f16_bits(kdrt_round_f16(x[i]));
  else
    for (size_t i = 0; i < n; i++) y[i] = kdrt_bf16_bits(kdrt_round_bf16(x[i]));
}

void kdrt_unpack16(int kind, float *restrict y, const uint16_t *restrict x, size_t n) {
  if (kind == KDRT_ROUND_F16)
    for (size_t i = 0; i < n; i++) y[i] = kdrt_f16_value(x[i]);
  else
    for (size_t i = 0; i < n; i++) y[i] = kdrt_bf16_value(x[i]);
}
