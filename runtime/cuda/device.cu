// device.cu: the device state of a process, the step protocol between the
// CPU runtime's fit loop and the device (kdrt_cuda_begin / _end), and the
// generated program's main.
//
// One process drives one GPU: the rank's local index on its node modulo
// the devices it sees (comm.cu picks it). The state is made on the first
// step and lives until kdrt_cuda_shutdown. The host blobs of the kdrt_ctx
// stay the reference for everything the CPU runtime does between steps
// (init, weights files, checkpoints); `host_newer` and `device_newer`
// say which copy is ahead.
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

// comm.cu
void kdrt_cuda_comm_setup(kdrt_cuda *d, kdrt_ctx *c);
void kdrt_cuda_comm_free(kdrt_cuda *d);

static kdrt_cuda dev;             // the device state (one per process)
static kdrt_cuda_impl dev_impl;
static int opened;                // stream and handles exist
static const kdrt_program *dev_prog; // the program the blobs were sized for
static size_t x_floats, y_floats; // this rank's rows of a batch
static const kdrt_ctx *owner;     // the ctx whose host blobs the device mirrors
static const float *owner_params;
static int host_newer = 1;        // upload c->params before the next step
static int device_newer;          // download before the host reads c->params
static int mirror_each_step;      // checkpoints on: the host copy follows every step

// ---------------------------------------------------------------- errors

extern "C" void kdrt_cuda_fail(const char *call, const char *file, int line, const char *msg) {
  int inited = 0, finalized = 0, rank = -1;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fflush(stdout);
  fprintf(stderr, "kdrt-cuda: rank %d: %s:%d: %s failed: %s\n", rank, file, line, call,
          msg ? msg : "(no message)");
  if (inited && !finalized) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  exit(1);
}

extern "C" void kdrt_cuda_launched(kdrt_cuda *d, const char *what, const char *file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && d->impl->sync_each) e = cudaStreamSynchronize(d->impl->stream);
  if (e != cudaSuccess) kdrt_cuda_fail(what, file, line, cudaGetErrorString(e));
}

void kdrt_cuda_need_ctx(const kdrt_cuda *d, const char *what) {
  if (!d->c) kdrt_cuda_fail(what, __FILE__, __LINE__, "no kdrt_ctx: call kdrt_cuda_begin first");
}

// ---------------------------------------------------------------- memory

extern "C" float *kdrt_cuda_alloc(size_t floats) {
  void *p = NULL;
  size_t bytes = (floats ? floats : 1) * sizeof(float);
  CUDA_CHECK(cudaMalloc(&p, bytes));
  CUDA_CHECK(cudaMemset(p, 0, bytes));
  return (float *)p;
}

extern "C" void kdrt_cuda_free(float *p) {
  if (p) CUDA_CHECK(cudaFree(p));
}

void *kdrt_cuda_dscratch(kdrt_cuda *d, int which, size_t bytes) {
  kdrt_cuda_impl *s = d->impl;
  if (bytes > s->dscratch_cap[which]) {
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->comm_stream));
    if (s->dscratch[which]) CUDA_CHECK(cudaFree(s->dscratch[which]));
    s->dscratch[which] = NULL;
    size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
    CUDA_CHECK(cudaMalloc(&s->dscratch[which], cap));
    s->dscratch_cap[which] = cap;
  }
  return s->dscratch[which];
}

void *kdrt_cuda_hscratch(kdrt_cuda *d, int which, size_t bytes) {
  kdrt_cuda_impl *s = d->impl;
  if (bytes > s->hscratch_cap[which]) {
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    if (s->hscratch[which]) CUDA_CHECK(cudaFreeHost(s->hscratch[which]));
    s->hscratch[which] = NULL;
    size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
    CUDA_CHECK(cudaMallocHost(&s->hscratch[which], cap));
    s->hscratch_cap[which] = cap;
  }
  return s->hscratch[which];
}

extern "C" void kdrt_cuda_upload(kdrt_cuda *d, float *dst, const float *src, size_t n) {
  if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice,
                                    d->impl->stream));
}

extern "C" void kdrt_cuda_download(kdrt_cuda *d, float *dst, const float *src, size_t n) {
  if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost,
                                    d->impl->stream));
  CUDA_CHECK(cudaStreamSynchronize(d->impl->stream));
}

extern "C" void kdrt_cuda_copy(kdrt_cuda *d, float *dst, const float *src, size_t n) {
  if (n && dst != src)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice,
                               d->impl->stream));
}

extern "C" void kdrt_cuda_sync(kdrt_cuda *d) { CUDA_CHECK(cudaStreamSynchronize(d->impl->stream)); }

// ---------------------------------------------------------------- setup

// Device, streams, events and the cuBLAS handle. With several ranks the
// device and the communicators come from comm.cu (which uses MPI); one
// process uses the current device and never touches MPI here.
extern "C" kdrt_cuda *kdrt_cuda_open(kdrt_ctx *c, int precision) {
  dev.c = c;
  dev.precision = precision;
  if (opened) return &dev;
  dev.impl = &dev_impl;
  kdrt_cuda_impl *s = &dev_impl;
  const char *sync = getenv("KDRT_CUDA_SYNC");
  s->sync_each = sync && *sync && strcmp(sync, "0");
  int ndev = 0;
  CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (c && c->world > 1) kdrt_cuda_comm_setup(&dev, c); // picks and sets the device
  CUDA_CHECK(cudaGetDevice(&s->device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->comm_stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&s->to_comm, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&s->to_compute, cudaEventDisableTiming));
  CUBLAS_CHECK(cublasCreate(&s->blas));
  CUBLAS_CHECK(cublasSetStream(s->blas, s->stream));
  // FP32 means FP32: no TF32 unless --precision asks (matmul.cu picks the
  // compute type per call; this keeps cuBLAS's own choices in line).
  CUBLAS_CHECK(cublasSetMathMode(s->blas, precision == KDRT_PREC_FP32
                                              ? CUBLAS_PEDANTIC_MATH
                                              : CUBLAS_DEFAULT_MATH));
  opened = 1;
  return &dev;
}

static size_t pred_floats(const kdrt_program *p, const kdrt_ctx *c) {
  const kdrt_layout *l = &p->pred_layout;
  if (l->rank < 1 || p->pred_offset == SIZE_MAX) return 0;
  size_t n = 1;
  for (int i = 0; i < l->rank; i++)
    n *= (size_t)(l->gshape[i] / (l->axis[i] >= 0 ? p->mesh_shape[l->axis[i]] : 1));
  (void)c;
  return n;
}

// The blobs for c's program, once.
static void setup_program(kdrt_ctx *c) {
  const kdrt_program *p = c->prog;
  if (dev_prog == p) return;
  if (dev_prog) kdrt_fatal(c, "kdrt-cuda: one program per process");
  int lb = p->batch_axis >= 0 ? p->batch / p->mesh_shape[p->batch_axis] : p->batch;
  size_t xn = 1, yn = 1;
  for (int i = 0; i < p->x_rank; i++) xn *= (size_t)p->x_shape[i];
  for (int i = 0; i < p->y_rank; i++) yn *= (size_t)p->y_shape[i];
  x_floats = (size_t)lb * xn, y_floats = (size_t)lb * yn;
  dev.params = kdrt_cuda_alloc(p->param_floats);
  dev.grads = kdrt_cuda_alloc(p->grad_floats);
  dev.arena = kdrt_cuda_alloc(p->arena_floats);
  dev.x = kdrt_cuda_alloc(x_floats);
  dev.y = kdrt_cuda_alloc(y_floats);
  dev_prog = p;
}

// ---------------------------------------------------------------- steps

extern "C" kdrt_cuda *kdrt_cuda_begin(kdrt_ctx *c, int mode, const float *hx, const float *hy) {
  kdrt_cuda *d = kdrt_cuda_open(c, dev.precision);
  setup_program(c);
  const kdrt_program *p = c->prog;
  // A new ctx, or new host blobs (predict, gradcheck): the host copy rules.
  if (owner != c || owner_params != c->params) {
    owner = c, owner_params = c->params;
    host_newer = 1, device_newer = 0;
  }
  if (mode == KDRT_CUDA_GRAD) host_newer = 1; // gradcheck moves c->params between calls
  if (host_newer) {
    kdrt_cuda_upload(d, d->params, c->params, p->param_floats);
    host_newer = 0;
  }
  // This rank's rows, through pinned memory so the copies are asynchronous.
  float *stage = (float *)kdrt_cuda_hscratch(d, 2, (x_floats + y_floats + 2) * sizeof(float));
  CUDA_CHECK(cudaStreamSynchronize(d->impl->stream)); // the stage is free again
  memcpy(stage, hx, x_floats * sizeof(float));
  memcpy(stage + x_floats, hy, y_floats * sizeof(float));
  kdrt_cuda_upload(d, d->x, stage, x_floats);
  kdrt_cuda_upload(d, d->y, stage + x_floats, y_floats);
  return d;
}

extern "C" void kdrt_cuda_end(kdrt_cuda *d, int mode, const float *loss_dev,
                              const float *metric_dev, float *loss, float *metric) {
  kdrt_ctx *c = d->c;
  const kdrt_program *p = c->prog;
  cudaStream_t s = d->impl->stream;
  float *stage = (float *)kdrt_cuda_hscratch(d, 2, (x_floats + y_floats + 2) * sizeof(float));
  float *out = stage + x_floats + y_floats;
  CUDA_CHECK(cudaMemcpyAsync(out, loss_dev, sizeof(float), cudaMemcpyDeviceToHost, s));
  if (metric_dev)
    CUDA_CHECK(cudaMemcpyAsync(out + 1, metric_dev, sizeof(float), cudaMemcpyDeviceToHost, s));
  if (mode == KDRT_CUDA_TRAIN) device_newer = 1;
  if (mode == KDRT_CUDA_GRAD && p->grad_floats)
    CUDA_CHECK(cudaMemcpyAsync(c->grads, d->grads, p->grad_floats * sizeof(float),
                               cudaMemcpyDeviceToHost, s));
  if (mode == KDRT_CUDA_EVAL) {
    size_t np = pred_floats(p, c); // `./train predict` reads the output from the host arena
    if (np)
      CUDA_CHECK(cudaMemcpyAsync(c->arena + p->pred_offset, d->arena + p->pred_offset,
                                 np * sizeof(float), cudaMemcpyDeviceToHost, s));
  }
  if (device_newer && (mode == KDRT_CUDA_EVAL || mirror_each_step)) {
    CUDA_CHECK(cudaMemcpyAsync(c->params, d->params, p->param_floats * sizeof(float),
                               cudaMemcpyDeviceToHost, s));
    device_newer = 0;
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  *loss = out[0];
  *metric = metric_dev ? out[1] : 0.0f;
}

extern "C" void kdrt_cuda_shutdown(void) {
  if (!opened) return;
  kdrt_cuda_impl *s = &dev_impl;
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->comm_stream));
  kdrt_cuda_comm_free(&dev);
  for (int i = 0; i < 3; i++) {
    if (s->dscratch[i]) CUDA_CHECK(cudaFree(s->dscratch[i]));
    if (s->hscratch[i]) CUDA_CHECK(cudaFreeHost(s->hscratch[i]));
    s->dscratch[i] = s->hscratch[i] = NULL;
    s->dscratch_cap[i] = s->hscratch_cap[i] = 0;
  }
  kdrt_cuda_free(dev.params), kdrt_cuda_free(dev.grads), kdrt_cuda_free(dev.arena);
  kdrt_cuda_free(dev.x), kdrt_cuda_free(dev.y);
  dev.params = dev.grads = dev.arena = dev.x = dev.y = NULL;
  CUBLAS_CHECK(cublasDestroy(s->blas));
  CUDA_CHECK(cudaEventDestroy(s->to_comm));
  CUDA_CHECK(cudaEventDestroy(s->to_compute));
  CUDA_CHECK(cudaStreamDestroy(s->stream));
  CUDA_CHECK(cudaStreamDestroy(s->comm_stream));
  opened = 0;
  dev_prog = NULL;
  owner = NULL;
}

// ---------------------------------------------------------------- main

extern "C" int kdrt_cuda_main(int argc, char **argv, const kdrt_program *prog, int precision) {
  dev.precision = precision;
  if (argc > 1 && !strcmp(argv[1], "opcheck")) {
    int rc = kdrt_cuda_opcheck(argc - 1, argv + 1, precision);
    kdrt_cuda_shutdown();
    return rc;
  }
  int rc;
  if (argc > 1 && !strcmp(argv[1], "gradcheck")) {
    rc = kdrt_gradcheck(argc - 1, argv + 1, prog);
  } else {
    // Checkpoints read c->params during fit: keep the host copy current.
    for (int i = 1; i < argc; i++)
      if (!strcmp(argv[i], "--checkpoint-dir") || !strncmp(argv[i], "--checkpoint-dir=", 17))
        mirror_each_step = 1;
    rc = kdrt_main(argc, argv, prog); // predict too (kdrt_main dispatches it)
  }
  kdrt_cuda_shutdown();
  return rc;
}
