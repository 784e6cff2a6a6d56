// issue 22, without a GPU (tests/sh/cuda_build.sh): cudnn_attn.cu's graphs
// of cuDNN's attention, as the runtime defines them, validated by the cuDNN
// frontend for Hopper (sm 90) with this machine's libcudnn.so.9: the
// shapes opcheck's cudnn cases and the GPT-2 program give it, forward and
// backward (deterministic), and a head dim it refuses. Linked with cudnn_attn.o and cudnn.o alone:
// the runtime's other entries they name are stubs no validation reaches.
#include <stdio.h>
#include <stdlib.h>

#include "common.cuh"

void *kdrt_cuda_dscratch(kdrt_cuda *, int, size_t) { abort(); }
extern "C" void kdrt_cuda_fail(const char *, const char *, int, const char *) { abort(); }
extern "C" void kdrt_cuda_launched(kdrt_cuda *, const char *, const char *, int) { abort(); }
extern "C" void kdrt_cuda_transpose(kdrt_cuda *, float *, const float *, int, const int64_t *,
                                    const int *) {
  abort();
}

int main(void) {
  static const int64_t cases[][5] = { // bn, t, s, hd, causal
      {96, 1024, 1024, 64, 1}, // GPT-2 124M at batch 8
      {3, 64, 64, 64, 1},  {2, 200, 200, 64, 0}, {4, 16, 16, 8, 1},  {2, 130, 70, 32, 0},
      {2, 70, 130, 64, 1}, {1, 300, 300, 128, 1}, {2, 96, 160, 128, 0}};
  int bad = 0, n = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int grad = 0; grad < 2; grad++, n++) {
      const int64_t *c = cases[i];
      const char *why = kdrt_cudnn_attention_validate(grad, c[0], c[1], c[2], c[3],
                                                      1.0f / sqrtf((float)c[3]), (int)c[4], 90);
      if (why) {
        printf("FAIL: cuDNN's attention %s [%lld, %lld, %lld, %lld]%s: %s\n",
               grad ? "backward" : "forward", (long long)c[0], (long long)c[1], (long long)c[2],
               (long long)c[3], c[4] ? " causal" : "", why);
        bad++;
      }
    }
  // and it can say no: a head dim not a multiple of 8 (cudnn_attn.h's rule too)
  if (!kdrt_cudnn_attention_validate(0, 2, 40, 40, 6, 0.4f, 1, 90) ||
      !kdrt_cudnn_attn_refuses(1, 2, 40, 40, 6)) {
    printf("FAIL: cuDNN's attention of head dim 6 validated, or not refused\n");
    bad++;
  }
  if (!bad) printf("cudnn_attn_check: %d graphs of cuDNN's attention valid for sm_90\n", n);
  return bad != 0;
}
