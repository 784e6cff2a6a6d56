// main.cu: the generated program's main, the top of the CUDA runtime:
// `./train opcheck` (opcheck.cu, which opens the device itself through
// session.cu), else a run of the program (session.cu's kdrt_cuda_run).
#include <string.h>

#include "common.cuh"

extern "C" int kdrt_cuda_main(int argc, char **argv, const kdrt_program *prog, int precision) {
  if (argc > 1 && !strcmp(argv[1], "opcheck")) {
    int rc = kdrt_cuda_opcheck(argc - 1, argv + 1, precision);
    kdrt_cuda_shutdown();
    return rc;
  }
  return kdrt_cuda_run(argc, argv, prog, precision);
}
