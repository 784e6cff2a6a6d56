// kdrt_philox.h: Philox-4x32-10 and the splitmix64 key mix, written once
// for the CPU runtime (rng.c) and the CUDA one (cuda/dropout.cu), so that
// the two draw the same bits from the same source: initial weights,
// dropout masks and Gaussian noise are the same on any mesh and either
// backend. Plain C99 that also compiles as CUDA C++ (KDRT_HD marks host
// and device), as kdrt_rnn.h. rng.c's AVX2 path draws eight blocks at a
// time with the same rounds (its tests compare it with kdrt_philox_block).
#ifndef KDRT_PHILOX_H
#define KDRT_PHILOX_H

#include <math.h>
#include <stdint.h>

#include "kdrt_defs.h" // KDRT_HD

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u // golden ratio
#define PHILOX_W1 0xBB67AE85u // sqrt(3) - 1

// The key of (seed, stream) is splitmix64(seed ^ splitmix64(stream)).
static inline KDRT_HD uint64_t kdrt_splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The ten rounds on the counter words x[0..3] with key (k0, k1).
static inline KDRT_HD void kdrt_philox_block(uint32_t x[4], uint32_t k0, uint32_t k1) {
  uint32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * x0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * x2;
    uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0;
    uint32_t y1 = (uint32_t)p1;
    uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1;
    uint32_t y3 = (uint32_t)p0;
    x0 = y0, x1 = y1, x2 = y2, x3 = y3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3;
}

// Word `word` (0..3) of the block for counter (lo, hi): lo's low and high
// halves, then hi's.
static inline KDRT_HD uint32_t kdrt_philox_word(uint32_t k0, uint32_t k1, uint64_t lo,
                                                uint64_t hi, unsigned word) {
  uint32_t x[4] = {(uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi, (uint32_t)(hi >> 32)};
  kdrt_philox_block(x, k0, k1);
  return word == 0 ? x[0] : word == 1 ? x[1] : word == 2 ? x[2] : x[3]; // no run-time index
                                                                         // into x (registers)
}

// A uniform in [0, 1) from a word: its top 24 bits / 2^24 (exact in float).
// Initializers, dropout's masks.
static inline KDRT_HD float kdrt_philox_uniform(uint32_t w) {
  return (float)(w >> 8) * (1.0f / 16777216.0f);
}

// A standard normal from two words, Box-Muller in double: u1 in (0, 1] so
// the log is finite, u2 in [0, 1). Initializers, Gaussian noise.
static inline KDRT_HD float kdrt_philox_normal(uint32_t w0, uint32_t w1) {
  double u1 = ((double)w0 + 1.0) * (1.0 / 4294967296.0);
  double u2 = (double)w1 * (1.0 / 4294967296.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif
