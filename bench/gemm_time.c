// gemm_time: the time a step's matrix products take alone, for the
// "GEMM-bound" figure of bench/bench.py. Reads one product a line on stdin,
//   ta tb batch M N K lda ldb ldc stride_a stride_b stride_c beta
// (a kdrt_gemm, as the generated program declares it, with the step's rows
// filled in, and the call's beta: 1 where an SGD update is folded in), runs each on random operands, and prints the sum over the
// lines of each product's best time of 15 runs (after 3 warm-up runs), in
// seconds.
//
//   gemm_time kdcc   < gemms.txt   # kdrt_matmul: the runtime's fixed blocks
//   gemm_time blas   < gemms.txt   # one cblas_sgemm per product on OpenBLAS's
//                                   # own threads (OPENBLAS_NUM_THREADS)
//   gemm_time kdcc cpu < gemms.txt # the process's CPU time instead of wall
//                                   # time (bench.py's clock at 1 thread)
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kdrt.h"

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void) {
  struct timespec t;
  clock_gettime(clock_id, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *buffer(int64_t n) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  if (!p) {
    fprintf(stderr, "gemm_time: out of memory\n");
    exit(1);
  }
  for (int64_t i = 0; i < n; i++) p[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
  return p;
}

static void run(int blas, const kdrt_gemm *g, const float *a, const float *b, float beta,
                float *c) {
  if (!blas) {
    kdrt_matmul(g, 1.0f, a, b, beta, c);
    return;
  }
  for (int64_t i = 0; i < g->batch; i++)
    cblas_sgemm(CblasRowMajor, g->ta == KDRT_TRANS ? CblasTrans : CblasNoTrans,
                g->tb == KDRT_TRANS ? CblasTrans : CblasNoTrans, (int)g->M, (int)g->N, (int)g->K,
                1.0f, a + i * g->stride_a, (int)g->lda, b + i * g->stride_b, (int)g->ldb, beta,
                c + i * g->stride_c, (int)g->ldc);
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3 || (strcmp(argv[1], "kdcc") && strcmp(argv[1], "blas")) ||
      (argc == 3 && strcmp(argv[2], "cpu"))) {
    fprintf(stderr, "usage: gemm_time kdcc|blas [cpu] < gemms.txt\n");
    return 2;
  }
  if (argc == 3) clock_id = CLOCK_PROCESS_CPUTIME_ID;
  int blas = !strcmp(argv[1], "blas");
  double total = 0;
  kdrt_gemm g;
  float beta;
  while (scanf("%d %d %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %f", &g.ta, &g.tb, &g.batch, &g.M,
               &g.N, &g.K, &g.lda, &g.ldb, &g.ldc, &g.stride_a, &g.stride_b, &g.stride_c,
               &beta) == 13) {
    int64_t nb = g.batch > 1 ? g.batch : 1;
    int64_t ra = g.ta == KDRT_TRANS ? g.K : g.M, rb = g.tb == KDRT_TRANS ? g.N : g.K;
    int64_t sa = g.stride_a ? g.stride_a : 0, sb = g.stride_b ? g.stride_b : 0;
    float *a = buffer(sa * (nb - 1) + ra * g.lda), *b = buffer(sb * (nb - 1) + rb * g.ldb);
    float *c = buffer(g.stride_c * (nb - 1) + g.M * g.ldc);
    double best = 1e30;
    for (int r = 0; r < 18; r++) {
      double t0 = now();
      run(blas, &g, a, b, beta, c);
      double t = now() - t0;
      if (r >= 3 && t < best) best = t;
    }
    total += best;
    free(a), free(b), free(c);
  }
  printf("%.9f\n", total);
  return 0;
}
