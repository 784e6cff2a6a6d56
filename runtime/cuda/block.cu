// block.cu: moving a block along one dimension of a row-major tensor
// (kdrt_copy_block / kdrt_place_block): CONCAT, SLICE, local slices and
// the packing around collectives. With outer = product of the dims before
// and inner = product after, out[o, i, r] = in[o, off + i, r] (copy) or
// out[o, off + i, r] = in[o, i, r] (place). One contiguous run per outer
// index: a single strided 2-D copy.
#include "common.cuh"

extern "C" void kdrt_cuda_copy_block(kdrt_cuda *d, float *out, const float *in, int64_t outer,
                                     int64_t in_ext, int64_t off, int64_t out_ext,
                                     int64_t inner) {
  size_t run = (size_t)(out_ext * inner) * sizeof(float);
  if (!outer || !run) return;
  CUDA_CHECK(cudaMemcpy2DAsync(out, run, in + off * inner, (size_t)(in_ext * inner) * sizeof(float),
                               run, (size_t)outer, cudaMemcpyDeviceToDevice, d->impl->stream));
  if (d->impl->sync_each) KDRT_LAUNCHED(d, "copy_block");
}

extern "C" void kdrt_cuda_place_block(kdrt_cuda *d, float *out, const float *in, int64_t outer,
                                      int64_t in_ext, int64_t off, int64_t out_ext,
                                      int64_t inner) {
  size_t run = (size_t)(in_ext * inner) * sizeof(float);
  if (!outer || !run) return;
  CUDA_CHECK(cudaMemcpy2DAsync(out + off * inner, (size_t)(out_ext * inner) * sizeof(float), in,
                               run, run, (size_t)outer, cudaMemcpyDeviceToDevice,
                               d->impl->stream));
  if (d->impl->sync_each) KDRT_LAUNCHED(d, "place_block");
}

extern "C" void kdrt_cuda_pad_block(kdrt_cuda *d, float *out, const float *in, int64_t outer,
                                    int64_t in_ext, int64_t off, int64_t out_ext, int64_t inner) {
  size_t all = (size_t)(outer * out_ext * inner) * sizeof(float);
  if (!all) return;
  CUDA_CHECK(cudaMemsetAsync(out, 0, all, d->impl->stream));
  kdrt_cuda_place_block(d, out, in, outer, in_ext, off, out_ext, inner);
}
