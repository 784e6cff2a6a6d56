// dropout.cu: y = x * mask / (1 - rate) with the mask of ../rng.c, bit for
// bit: the key is splitmix64(seed ^ splitmix64(stream)); element e (its
// global row-major index) takes word e % 4 of the Philox-4x32-10 block for
// counter (e / 4, step); the uniform is the word's top 24 bits / 2^24, kept
// when u >= rate. Each thread turns its local index into the global index
// of this rank's block (walk_block in ../rng.c), so every mesh draws the
// same mask for the same element.
#include <string.h>

#include "common.cuh"
#include "kdrt_philox.h" // Philox-4x32-10 and the key's splitmix64: the CPU's own source

typedef struct {
  int rank;
  int64_t lext[KDRT_MAX_RANK];    // local extents
  int64_t off[KDRT_MAX_RANK];     // this rank's block start per dim
  int64_t gstride[KDRT_MAX_RANK]; // global row-major strides
} block_map;

// The global row-major index of local element e.
__device__ static inline uint64_t global_index(const block_map *bm, uint64_t e) {
  uint64_t rest = e, g = 0;
  for (int d = bm->rank - 1; d >= 0; d--) {
    uint64_t i = rest % (uint64_t)bm->lext[d];
    rest /= (uint64_t)bm->lext[d];
    g += (uint64_t)(bm->off[d] + (int64_t)i) * (uint64_t)bm->gstride[d];
  }
  return g;
}

// This rank's block of layout l; returns its elements.
static size_t block_map_of(const kdrt_ctx *c, const kdrt_layout *l, block_map *bm) {
  memset(bm, 0, sizeof *bm);
  bm->rank = l->rank;
  size_t n = 1;
  int64_t stride = 1;
  for (int k = l->rank - 1; k >= 0; k--) {
    int ax = l->axis[k];
    int64_t parts = ax >= 0 ? c->prog->mesh_shape[ax] : 1;
    bm->lext[k] = l->gshape[k] / parts;
    bm->off[k] = ax >= 0 ? c->coord[ax] * bm->lext[k] : 0;
    bm->gstride[k] = stride;
    stride *= l->gshape[k];
    n *= (size_t)bm->lext[k];
  }
  return n;
}

__global__ static void dropout_kernel(float *y, const float *x, size_t n, block_map bm,
                                      uint32_t k0, uint32_t k1, uint64_t step, float rate,
                                      float keep_scale, const kdrt_step_scalars *sc) {
  if (sc) step = (uint64_t)sc->step; // a step replayed from a graph
  KDRT_FOR(e, n) {
    uint64_t g = global_index(&bm, e);
    float u = kdrt_philox_uniform(kdrt_philox_word(k0, k1, g >> 2, step, (unsigned)(g & 3)));
    y[e] = u >= rate ? x[e] * keep_scale : 0.0f;
  }
}

extern "C" void kdrt_cuda_dropout(kdrt_cuda *d, float *y, const float *x, const kdrt_layout *l,
                                  float rate, uint64_t stream) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_dropout");
  const kdrt_ctx *c = d->c;
  block_map bm;
  size_t n = block_map_of(c, l, &bm);
  if (!n) return;
  float keep_scale = rate < 1.0f ? 1.0f / (1.0f - rate) : 0.0f;
  if (rate >= 1.0f) rate = 2.0f; // nothing is kept
  uint64_t k = kdrt_splitmix64(c->seed ^ kdrt_splitmix64(stream));
  dropout_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(
      y, x, n, bm, (uint32_t)k, (uint32_t)(k >> 32), (uint64_t)c->step, rate, keep_scale,
      kdrt_step_sc(d));
  KDRT_LAUNCHED(d, "dropout_kernel");
}

// issue 11: Gaussian noise, z for global element g = kdrt_normal(seed,
// stream, step, g) of ../rng.c: Box-Muller over words 0 and 1 of the block
// for counter (g, step), in double.
__global__ static void noise_kernel(float *y, const float *x, size_t n, block_map bm, uint32_t k0,
                                    uint32_t k1, uint64_t step, float stddev, int mul,
                                    const kdrt_step_scalars *sc) {
  if (sc) step = (uint64_t)sc->step;
  KDRT_FOR(e, n) {
    uint64_t g = global_index(&bm, e);
    float z = stddev * kdrt_philox_normal(kdrt_philox_word(k0, k1, g, step, 0),
                                          kdrt_philox_word(k0, k1, g, step, 1));
    y[e] = mul ? x[e] * (1.0f + z) : x[e] + z;
  }
}

extern "C" void kdrt_cuda_gaussian_noise(kdrt_cuda *d, float *y, const float *x,
                                         const kdrt_layout *l, float stddev, int mul,
                                         uint64_t stream) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_gaussian_noise");
  const kdrt_ctx *c = d->c;
  block_map bm;
  size_t n = block_map_of(c, l, &bm);
  if (!n) return;
  uint64_t k = kdrt_splitmix64(c->seed ^ kdrt_splitmix64(stream));
  noise_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(
      y, x, n, bm, (uint32_t)k, (uint32_t)(k >> 32), (uint64_t)c->step, stddev, mul,
      kdrt_step_sc(d));
  KDRT_LAUNCHED(d, "noise_kernel");
}
