// device.cu: the floor of the CUDA runtime, beneath every kernel file,
// comm.cu, resident.cu, cudnn.cu and the driver (session.cu): what a failed
// check does (kdrt_cuda_fail), waits for a stream, a launch's check, device
// memory, scratch and copies, and the CUDA graphs of training steps (a
// failure inside a capture comes back here). It calls nothing above it: the
// process's device, and how its communicators are aborted and polled
// (comm.cu), come down as what session.cu registers when it opens the
// device (kdrt_cuda_register, kdrt_cuda_impl's comm_abort and comm_poll).
#include <mpi.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.cuh"

// The process's one device, as session.cu registers it: once opened, a
// failed check reports where its ops were and aborts its communicators;
// once its program's buffers are made, it is kdrt_cuda_current.
static kdrt_cuda *the_dev;
static int the_dev_ready;

extern "C" void kdrt_cuda_register(kdrt_cuda *d, int ready) { the_dev = d, the_dev_ready = ready; }

extern "C" kdrt_cuda *kdrt_cuda_current(void) { return the_dev_ready ? the_dev : NULL; }

// ---------------------------------------------------------------- errors

// Whether msg is the message of an error a kernel leaves behind (the
// context is unusable after it, and the call that reports it is only the
// first to look).
static int kernel_fault(const char *msg) {
  static const cudaError_t faults[] = {
      cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress,
      cudaErrorIllegalInstruction, cudaErrorHardwareStackError, cudaErrorInvalidPc,
      cudaErrorAssert, cudaErrorInvalidAddressSpace, cudaErrorLaunchTimeout};
  for (size_t i = 0; msg && i < sizeof faults / sizeof faults[0]; i++)
    if (!strcmp(msg, cudaGetErrorString(faults[i]))) return 1;
  return 0;
}

static void capture_failed(kdrt_cuda *d, const char *call, const char *msg);
static jmp_buf capture_env; // in the training step being captured (kdrt_cuda_capture_env)

extern "C" void kdrt_cuda_fail(const char *call, const char *file, int line, const char *msg) {
  kdrt_cuda *d = the_dev;
  kdrt_cuda_impl *s = d ? d->impl : NULL;
  // A failure inside a capture: the step runs again, without a graph. Not
  // with NCCL: whether a collective is captured must be the same on every
  // rank, and the others go on capturing (kdrt_cuda_end_capture decides
  // together).
  if (s && s->capturing && s->comm_mode != KDRT_COMM_NCCL) {
    capture_failed(d, call, msg);
    longjmp(capture_env, 1);
  }
  if (s && s->capturing)
    fprintf(stderr, "kdrt-cuda: while capturing a training step as a CUDA graph "
            "(KDRT_CUDA_GRAPH=0 runs without):\n");
  int inited = 0, finalized = 0, rank = -1;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fflush(stdout);
  fprintf(stderr, "kdrt-cuda: rank %d: %s:%d: %s failed: %s\n", rank, file, line, call,
          msg ? msg : "(no message)");
  if (s && s->sync_each && s->at_file)
    fprintf(stderr, "kdrt-cuda: rank %d: in kdrt_cuda_%s called at %s:%d (KDRT_CUDA_SYNC=1: "
            "each launch was waited for, so this op is the one that failed)\n",
            rank, s->at_fn ? s->at_fn : "?", s->at_file, s->at_line);
  else if (kernel_fault(msg)) {
    fprintf(stderr, "kdrt-cuda: rank %d: a kernel faulted", rank);
    if (s && s->at_file) fprintf(stderr, " at or before the op called at %s:%d", s->at_file, s->at_line);
    fprintf(stderr, "; rerun with KDRT_CUDA_SYNC=1 in the environment to name its op and line in "
            "program.cu (slower: every launch is waited for)\n");
  }
  if (s && s->comm_abort) s->comm_abort(d); // no rank left inside a collective
  if (inited && !finalized) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  exit(1);
}

// Wait until stream st has run its work (ev NULL), or event ev has
// happened; with NCCL by polling, asking its communicators for errors.
static void wait_for(kdrt_cuda *d, cudaStream_t st, cudaEvent_t ev, const char *what) {
  if (d->impl->comm_mode != KDRT_COMM_NCCL) {
    cudaError_t e = ev ? cudaEventSynchronize(ev) : cudaStreamSynchronize(st);
    if (e != cudaSuccess) kdrt_cuda_fail(what, __FILE__, __LINE__, cudaGetErrorString(e));
    return;
  }
  for (unsigned spins = 0;; spins++) {
    cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(st);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) kdrt_cuda_fail(what, __FILE__, __LINE__, cudaGetErrorString(e));
    if (d->impl->comm_poll) d->impl->comm_poll(d, what);
    if (spins > 1000) { // a long wait: stop spinning a core
      struct timespec nap = {0, 50000};
      nanosleep(&nap, NULL);
    }
  }
}

void kdrt_cuda_wait(kdrt_cuda *d, cudaStream_t st, const char *what) { wait_for(d, st, NULL, what); }

void kdrt_cuda_wait_event(kdrt_cuda *d, cudaEvent_t ev, const char *what) {
  wait_for(d, NULL, ev, what);
}

extern "C" void kdrt_cuda_launched(kdrt_cuda *d, const char *what, const char *file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) kdrt_cuda_fail(what, file, line, cudaGetErrorString(e));
  if (d->impl->sync_each) kdrt_cuda_wait(d, d->impl->stream, what);
}

void kdrt_cuda_need_ctx(const kdrt_cuda *d, const char *what) {
  if (!d->c) kdrt_cuda_fail(what, __FILE__, __LINE__, "no kdrt_ctx: call kdrt_cuda_begin first");
}

// ---------------------------------------------------------------- memory

// cudaMemset runs on the legacy default stream, asynchronously to the host,
// and our streams are non-blocking: nothing orders it before their work. An
// upload or a kernel on d's stream could land first and be zeroed after it
// (the first GPU run: whole gradients read as 0 by gradcheck, a model's
// parameters zeroed behind their upload, opcheck's inputs wiped at random).
// So the zeroing is waited for here; allocation is rare.
extern "C" float *kdrt_cuda_alloc(size_t floats) {
  void *p = NULL;
  size_t bytes = (floats ? floats : 1) * sizeof(float);
  CUDA_CHECK(cudaMalloc(&p, bytes));
  CUDA_CHECK(cudaMemset(p, 0, bytes));
  CUDA_CHECK(cudaDeviceSynchronize());
  return (float *)p;
}

extern "C" void kdrt_cuda_free(float *p) {
  if (p) CUDA_CHECK(cudaFree(p));
}

// Every training step's CUDA graph destroyed (none may be running).
void kdrt_cuda_drop_graphs(kdrt_cuda_impl *s) {
  for (int k = 0; k < s->ngraphs; k++)
    for (int h = 0; h < 2; h++)
      if (s->graph[k].exec[h]) CUDA_CHECK(cudaGraphExecDestroy(s->graph[k].exec[h]));
  s->ngraphs = 0;
}

void *kdrt_cuda_dscratch(kdrt_cuda *d, int which, size_t bytes) {
  kdrt_cuda_impl *s = d->impl;
  if (bytes > s->dscratch_cap[which]) {
    kdrt_cuda_wait(d, s->stream, "growing device scratch");
    kdrt_cuda_wait(d, s->comm_stream, "growing device scratch");
    // The graphs captured so far read the old buffer: dropped, so that
    // each row count's next steps capture them again (a step of more rows,
    // e.g. an evaluation's, can need more scratch than training did).
    // (Inside a capture the wait above has already failed it.)
    if (!s->capturing) kdrt_cuda_drop_graphs(s);
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
    kdrt_cuda_wait(d, s->stream, "growing host scratch");
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
  kdrt_cuda_wait(d, d->impl->stream, "copy to the host");
}

extern "C" void kdrt_cuda_copy(kdrt_cuda *d, float *dst, const float *src, size_t n) {
  if (n && dst != src)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice,
                               d->impl->stream));
}

extern "C" void kdrt_cuda_sync(kdrt_cuda *d) { kdrt_cuda_wait(d, d->impl->stream, "kdrt_cuda_sync"); }

// ---------------------------------------------------------------- graphs
//
// A training step of a row count seen before is captured as a CUDA graph
// (every launch of its parts, in order, with the addresses of the memory
// plan, which never move) and replayed after: one launch instead of a
// thousand. The first step of each row count runs without one, so that
// the scratch buffers reach their sizes and the communicators exist
// outside the capture. Each half of the inputs has its graph (the two
// read different input buffers), so the second and third steps are
// captured. What changes between steps besides the inputs, the learning
// rate and the step count, the kernels read from the device
// (kdrt_step_scalars of the half), uploaded with the inputs; nothing in a
// captured step waits on the host (the static check in tests/sh/
// cuda_graph.sh: no host read between replay and end in program.cu).
//
// A capture that fails (an illegal call inside it, or cudaStreamEndCapture
// or cudaGraphInstantiate refusing the graph) is no error: capturing ran
// nothing, so kdrt_cuda_fail comes back to the step (longjmp to the setjmp
// the generated step makes after kdrt_cuda_replay), says why once, turns
// graphs off, and the parts run again, uncaptured. With NCCL every rank
// must capture a collective or none (NCCL's rule): the ranks agree at the
// capture's end (an MPI all-reduce, at the two steps that capture), and
// fall back together; an error inside the capture ends the run there.

static kdrt_cuda_graph *capture_for; // the entry being captured

extern "C" jmp_buf *kdrt_cuda_capture_env(kdrt_cuda *d) {
  (void)d;
  return &capture_env;
}

// A capture that cannot go on: the stream's capture ended (its graph
// dropped), the error cleared, graphs off for the rest of the run.
static void capture_failed(kdrt_cuda *d, const char *call, const char *msg) {
  kdrt_cuda_impl *s = d->impl;
  if (!s->capturing) return;
  cudaGraph_t graph = NULL;
  s->capturing = 0, s->graphs_on = 0, s->graph_unsafe = 0;
  capture_for = NULL;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s->stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone)
    (void)cudaStreamEndCapture(s->stream, &graph);
  if (graph) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  int rank = d->c ? d->c->rank : 0;
  fflush(stdout);
  fprintf(stderr, "kdrt-cuda: rank %d: a training step could not be captured as a CUDA graph (%s: "
          "%s); the steps run without graphs from here on (KDRT_CUDA_GRAPH=0 does so from the "
          "start)\n", rank, call, msg ? msg : "(no message)");
}

extern "C" int kdrt_cuda_replay(kdrt_cuda *d, int mode) {
  kdrt_cuda_impl *s = d->impl;
  const kdrt_ctx *c = d->c;
  if (mode != KDRT_CUDA_TRAIN || !s->graphs_on) return 0;
  // issue 23: a loss-scaled step waits on the host for its decision (optim.cu's
  // kdrt_cuda_loss_scale_step), which a graph cannot replay
  if (c->prog->loss_scale) return 0;
  if (s->graph_unsafe) return 0; // a step of this program needs its host values (Nadam)
  int64_t rows = c->rows ? c->rows : c->prog->batch;
  kdrt_cuda_graph *g = NULL;
  for (int k = 0; k < s->ngraphs && !g; k++)
    if (s->graph[k].rows == rows) g = &s->graph[k];
  if (!g) {
    if (s->ngraphs == KDRT_GRAPHS) return 0;
    g = &s->graph[s->ngraphs++];
    g->rows = rows, g->seen = 0, g->exec[0] = g->exec[1] = NULL;
  }
  if (g->exec[s->half]) {
    CUDA_CHECK(cudaGraphLaunch(g->exec[s->half], s->stream));
    return 1;
  }
  if (g->seen++ < 1) return 0;
  cudaError_t e = cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess && s->comm_mode == KDRT_COMM_NCCL) // (every rank captures, or none)
    kdrt_cuda_fail("cudaStreamBeginCapture (KDRT_CUDA_GRAPH=0 runs without graphs)", __FILE__,
                   __LINE__, cudaGetErrorString(e));
  if (e != cudaSuccess) { // not this run's
    s->capturing = 1; // (for capture_failed)
    capture_failed(d, "cudaStreamBeginCapture", cudaGetErrorString(e));
    return 0;
  }
  s->capturing = 1;
  capture_for = g;
  return 0;
}

// The end of a captured step: the graph made, kept, and run (capturing ran
// nothing). On a failure, back to the step's start, without graphs.
void kdrt_cuda_end_capture(kdrt_cuda *d) {
  kdrt_cuda_impl *s = d->impl;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  const char *call = "cudaStreamEndCapture";
  cudaError_t e = cudaStreamEndCapture(s->stream, &graph);
  if (e == cudaSuccess && !graph) e = cudaErrorUnknown;
  if (e == cudaSuccess) {
    call = "cudaGraphInstantiate";
    e = cudaGraphInstantiate(&exec, graph, 0);
    (void)cudaGraphDestroy(graph);
  }
  int ok = e == cudaSuccess, all = ok;
  if (s->comm_mode == KDRT_COMM_NCCL &&
      MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
    kdrt_cuda_fail("MPI_Allreduce (the ranks' graphs)", __FILE__, __LINE__, "failed");
  if (!all) { // every rank runs the step again, uncaptured
    if (exec) (void)cudaGraphExecDestroy(exec);
    capture_failed(d, ok ? "another rank's capture" : call,
                   ok ? "failed there" : cudaGetErrorString(e));
    longjmp(capture_env, 1);
  }
  s->capturing = 0;
  CUDA_CHECK(cudaGraphLaunch(exec, s->stream));
  if (s->graph_unsafe) // this step's own host values are in it: not for another step
    CUDA_CHECK(cudaGraphExecDestroy(exec)); // (freed once it has run)
  else
    capture_for->exec[s->half] = exec;
  capture_for = NULL;
}
