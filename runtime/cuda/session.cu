// session.cu: the driver of the CUDA runtime, above device.cu (its floor),
// comm.cu, resident.cu and cudnn.cu, beneath opcheck.cu and main.cu: the
// device opened for the process (streams, handles, the communicators),
// the program's buffers, the step protocol between the CPU runtime's fit
// loop and the device (kdrt_cuda_begin / _end), each op's place and its
// profile (kdrt_cuda_at), a run of the program (kdrt_cuda_run) and the
// shutdown that gives it all back.
//
// One process drives one GPU: the rank's local index on its node modulo
// the devices it sees (comm.cu picks it). The state is made on the first
// step and lives until kdrt_cuda_shutdown. The host blobs of the kdrt_ctx
// stay the reference for everything the CPU runtime does between steps
// (init, weights files, checkpoints); `host_newer` and `device_newer`
// say which copy is ahead.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "kdrt_round.h" // issue 23: nonfinite_kernel reads 16-bit values

// comm.cu
void kdrt_cuda_comm_setup(kdrt_cuda *d, kdrt_ctx *c);
void kdrt_cuda_comm_free(kdrt_cuda *d);

static kdrt_cuda dev;             // the device state (one per process)
static kdrt_cuda_impl dev_impl;
static int opened;                // stream and handles exist
static const kdrt_program *dev_prog; // the program the blobs were sized for
static int lb_rows;                // this rank's most rows of a step
static size_t arena_floats;        // the device arena's floats (the run's batch)
static size_t x_elems[KDRT_MAX_FILES], y_elems[KDRT_MAX_FILES]; // their elements, per input / label
static size_t stage_bytes;         // every input, label and log of a step: one of the two
                                   // halves of the pinned stage (steps alternate)
// The stage's halves: the next one a step takes; for each, an event after
// its uploads on the copy stream (the pinned half is free again, and the
// device half holds the step's inputs), one after the last step that read
// its device inputs (they may be overwritten), and one after its logs'
// copy; the halves of training steps whose logs the host has yet to take,
// oldest first. Steps alternate halves, so the uploads of step s + 1 run
// on the copy stream while step s computes (issue 22).
static int stage_next;
static cudaEvent_t stage_free[2], inputs_free[2], logs_done[2];
static int held[2], nheld;
static int cur_half;               // the half of the step in progress
static int logs_late;              // training steps return before they have run
static size_t *vars_off;           // device: each variable's offset, then its size, then
                                   // an int (device_nonfinite)
static void *x_dev[2][KDRT_MAX_FILES];  // per half: the inputs and labels on the device
static float *y_dev[2][KDRT_MAX_FILES];
// The fit loop's batch buffers, pinned (kdrt_batch_buffers): a step uploads
// straight from them, without the stage's copy; per half, the buffers its
// last uploads read (the fit loop waits for those before refilling one).
enum { PINNED_MAX = 4 * KDRT_MAX_FILES };
static const void *pinned[PINNED_MAX];
static int npinned;
static const void *read_from[2][2 * KDRT_MAX_FILES];
static const kdrt_ctx *owner;     // the ctx whose host blobs the device mirrors
static const float *owner_params;
static int host_newer = 1;        // upload c->params before the next step
static int device_newer;          // download before the host reads c->params
static int mirror_each_step;      // checkpoints on: the host copy follows every step

// ---------------------------------------------------------------- ops

// Before each op of the generated program (its macros): where it is, and
// the test hook KDRT_CUDA_INJECT_FAULT=N, which makes the N-th call launch a
// kernel that writes to an address no allocation holds.
__global__ static void fault_kernel(float *p) { p[threadIdx.x] = 1.0f; }

// KDRT_CUDA_PROFILE=1: an event before this call, its line and name kept.
static void profile_mark(kdrt_cuda_impl *s, const char *fn, int line) {
  if (s->prof_n == s->prof_cap) {
    int cap = s->prof_cap ? 2 * s->prof_cap : 1024;
    s->prof_ev = (cudaEvent_t *)realloc(s->prof_ev, (size_t)cap * sizeof *s->prof_ev);
    s->prof_line = (int *)realloc(s->prof_line, (size_t)cap * sizeof *s->prof_line);
    s->prof_fn = (const char **)realloc(s->prof_fn, (size_t)cap * sizeof *s->prof_fn);
    if (!s->prof_ev || !s->prof_line || !s->prof_fn) kdrt_fatal(NULL, "out of memory (profile)");
    for (int k = s->prof_cap; k < cap; k++) CUDA_CHECK(cudaEventCreate(&s->prof_ev[k]));
    s->prof_cap = cap;
  }
  CUDA_CHECK(cudaEventRecord(s->prof_ev[s->prof_n], s->stream));
  s->prof_line[s->prof_n] = line, s->prof_fn[s->prof_n] = fn;
  s->prof_n++;
}

// After a step has run: the time from each call's event to the next one's
// added to the call's line (training steps after the first only).
static void profile_step(kdrt_cuda *d, int mode) {
  kdrt_cuda_impl *s = d->impl;
  if (!s->profile || !s->prof_n) return;
  profile_mark(s, NULL, 0); // the step's end
  CUDA_CHECK(cudaEventSynchronize(s->prof_ev[s->prof_n - 1]));
  if (mode == KDRT_CUDA_TRAIN && s->profile_steps++ > 0)
    for (int k = 0; k + 1 < s->prof_n; k++) {
      int l = s->prof_line[k];
      if (l >= s->nlines) {
        int n = l + 1024;
        s->line_ms = (double *)realloc(s->line_ms, (size_t)n * sizeof *s->line_ms);
        s->line_calls = (long *)realloc(s->line_calls, (size_t)n * sizeof *s->line_calls);
        s->line_fn = (const char **)realloc(s->line_fn, (size_t)n * sizeof *s->line_fn);
        if (!s->line_ms || !s->line_calls || !s->line_fn) kdrt_fatal(NULL, "out of memory (profile)");
        for (int i = s->nlines; i < n; i++) s->line_ms[i] = 0, s->line_calls[i] = 0, s->line_fn[i] = NULL;
        s->nlines = n;
      }
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, s->prof_ev[k], s->prof_ev[k + 1]));
      s->line_ms[l] += ms, s->line_calls[l]++, s->line_fn[l] = s->prof_fn[k];
    }
  s->prof_n = 0;
}

// At exit: the lines of program.cu that took the most GPU time.
static void profile_report(kdrt_cuda_impl *s) {
  if (!s->profile || s->profile_steps < 2) return;
  double total = 0;
  for (int l = 0; l < s->nlines; l++) total += s->line_ms[l];
  int steps = s->profile_steps - 1;
  fprintf(stderr, "kdrt-cuda profile: %d training steps (the first left out), %.3f ms of GPU "
          "time a step between the calls of %s; the lines that took the most:\n",
          steps, total / steps, s->at_file ? s->at_file : "program.cu");
  fprintf(stderr, "  %6s %9s %7s %9s  %s\n", "line", "ms/step", "share", "us/call", "call");
  for (int k = 0; k < 25; k++) {
    int best = -1;
    for (int l = 0; l < s->nlines; l++)
      if (s->line_calls[l] && (best < 0 || s->line_ms[l] > s->line_ms[best])) best = l;
    if (best < 0 || s->line_ms[best] <= 0) break;
    fprintf(stderr, "  %6d %9.4f %6.1f%% %9.1f  %s\n", best, s->line_ms[best] / steps,
            100 * s->line_ms[best] / (total > 0 ? total : 1),
            1000 * s->line_ms[best] / (double)s->line_calls[best], s->line_fn[best]);
    s->line_ms[best] = -s->line_ms[best]; // printed
  }
  // by kind of call
  for (int l = 0; l < s->nlines; l++) s->line_ms[l] = fabs(s->line_ms[l]);
  enum { KINDS = 96 };
  const char *kind[KINDS];
  double kms[KINDS];
  long kcalls[KINDS];
  int nk = 0;
  for (int l = 0; l < s->nlines; l++) {
    if (!s->line_calls[l] || !s->line_fn[l]) continue;
    int k = 0;
    while (k < nk && strcmp(kind[k], s->line_fn[l])) k++;
    if (k == nk) {
      if (nk == KINDS) continue;
      kind[nk] = s->line_fn[l], kms[nk] = 0, kcalls[nk] = 0, nk++;
    }
    kms[k] += s->line_ms[l], kcalls[k] += s->line_calls[l];
  }
  fprintf(stderr, "  by call:\n");
  for (int i = 0; i < nk && i < 15; i++) {
    int best = i;
    for (int k = i + 1; k < nk; k++)
      if (kms[k] > kms[best]) best = k;
    const char *tn = kind[i]; double tm = kms[i]; long tc = kcalls[i];
    kind[i] = kind[best], kms[i] = kms[best], kcalls[i] = kcalls[best];
    kind[best] = tn, kms[best] = tm, kcalls[best] = tc;
    fprintf(stderr, "    %-22s %9.4f ms/step %6.1f%% %6ld calls/step\n", kind[i], kms[i] / steps,
            100 * kms[i] / (total > 0 ? total : 1), kcalls[i] / steps);
  }
}

extern "C" void kdrt_cuda_at(kdrt_cuda *d, const char *fn, const char *file, int line) {
  kdrt_cuda_impl *s = d->impl;
  s->at_fn = fn, s->at_file = file, s->at_line = line;
  if (s->profile) profile_mark(s, fn, line);
  if (++s->calls == s->fault_at) {
    fault_kernel<<<1, 32, 0, s->stream>>>((float *)(uintptr_t)0x10);
    KDRT_LAUNCHED(d, "fault_kernel (KDRT_CUDA_INJECT_FAULT)");
  }
}

// ---------------------------------------------------------------- setup

static int device_nonfinite(kdrt_ctx *c);

// Device, streams, events and the cuBLAS handle. With several ranks the
// device and the communicators come from comm.cu (which uses MPI); one
// process uses the current device and never touches MPI here.
extern "C" kdrt_cuda *kdrt_cuda_open(kdrt_ctx *c, int precision) {
  dev.c = c;
  dev.precision = precision;
  if (opened) return &dev;
  dev.impl = &dev_impl;
  kdrt_cuda_impl *s = &dev_impl;
  // device.cu, the floor, calls nothing above it: a failed check aborts the
  // communicators, and a wait asks them for errors, through these.
  s->comm_abort = kdrt_cuda_comm_abort, s->comm_poll = kdrt_cuda_comm_poll;
  kdrt_cuda_register(&dev, 0);
  const char *sync = getenv("KDRT_CUDA_SYNC");
  s->sync_each = sync && *sync && strcmp(sync, "0");
  const char *prof = getenv("KDRT_CUDA_PROFILE");
  s->profile = prof && *prof && strcmp(prof, "0");
  // issue 22: cuDNN's convolutions and the two-level bn_stats, its
  // attention, opt-in until a GPU run proves them (cudnn.cu, norm.cu,
  // cudnn_attn.cu)
  s->cudnn = kdrt_cudnn_mode(getenv("KDRT_CUDA_CUDNN"));
  const char *inject = getenv("KDRT_CUDA_INJECT_FAULT");
  s->fault_at = inject ? atol(inject) : 0;
  int ndev = 0;
  CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (c && c->world > 1) kdrt_cuda_comm_setup(&dev, c); // picks and sets the device
  // Training steps as CUDA graphs: no waiting for each launch, no profile,
  // no host-staged collectives (they wait on the host); NCCL's collectives
  // are captured with the kernels (NCCL 2.9 and later can be).
  const char *graph = getenv("KDRT_CUDA_GRAPH");
  int nccl_version = 0;
  if (s->comm_mode == KDRT_COMM_NCCL) NCCL_CHECK(ncclGetVersion(&nccl_version));
  s->graphs_on = !(graph && !strcmp(graph, "0")) && !s->sync_each && !s->profile &&
                 (s->comm_mode == KDRT_COMM_NONE ||
                  (s->comm_mode == KDRT_COMM_NCCL && nccl_version >= 20900));
  CUDA_CHECK(cudaGetDevice(&s->device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->comm_stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->copy_stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&s->to_comm, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&s->to_compute, cudaEventDisableTiming));
  CUDA_CHECK(cudaMalloc(&s->scal, 2 * sizeof *s->scal));
  CUDA_CHECK(cudaMemset(s->scal, 0, 2 * sizeof *s->scal));
  CUDA_CHECK(cudaDeviceSynchronize()); // the memset (legacy stream) before any use
  CUBLAS_CHECK(cublasCreate(&s->blas));
  CUBLAS_CHECK(cublasSetStream(s->blas, s->stream));
  // A workspace of its own for cuBLAS: 32 MiB, what its Hopper kernels can
  // use (its default is smaller), and no allocation inside a step.
  s->blas_ws_bytes = (size_t)32 << 20;
  CUDA_CHECK(cudaMalloc(&s->blas_ws, s->blas_ws_bytes));
  CUBLAS_CHECK(cublasSetWorkspace(s->blas, s->blas_ws, s->blas_ws_bytes));
  CUBLAS_CHECK(cublasLtCreate(&s->lt));
  // FP32 means FP32: no TF32 unless --precision asks (matmul.cu picks the
  // compute type per call; this keeps cuBLAS's own choices in line).
  CUBLAS_CHECK(cublasSetMathMode(s->blas, precision == KDRT_PREC_FP32
                                              ? CUBLAS_PEDANTIC_MATH
                                              : CUBLAS_DEFAULT_MATH));
  opened = 1;
  return &dev;
}

// Local floats of output o's block (0: not one arena buffer).
static size_t output_floats(const kdrt_program *p, int o) {
  const kdrt_layout *l = &p->outputs[o].layout;
  if (l->rank < 1 || p->outputs[o].offset == SIZE_MAX) return 0;
  size_t n = 1;
  for (int i = 0; i < l->rank; i++)
    n *= (size_t)(l->gshape[i] / (l->axis[i] >= 0 ? p->mesh_shape[l->axis[i]] : 1));
  return n;
}

// Bytes as a person reads them.
static const char *human(double bytes, char *buf, size_t len) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
  snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

// KDRT_CUDA_MEMORY=SIZE (K, M, G, T: powers of 1024): the most device
// memory this process may take (a GPU shared with others); 0: no cap.
static size_t memory_cap(const kdrt_ctx *c) {
  const char *v = getenv("KDRT_CUDA_MEMORY");
  if (!v || !*v) return 0;
  char *end;
  double n = strtod(v, &end);
  double scale = *end == 'K' || *end == 'k' ? 1024.0 : *end == 'M' || *end == 'm' ? 1048576.0
               : *end == 'G' || *end == 'g' ? 1073741824.0 : *end == 'T' || *end == 't' ? 1099511627776.0
               : 1.0;
  if (scale != 1.0) end++;
  if (*end == 'B' || *end == 'b') end++;
  if (end == v || *end || !(n > 0))
    kdrt_fatal(c, "KDRT_CUDA_MEMORY='%s': expected a size such as 20G or 512M", v);
  return (size_t)(n * scale);
}

// Before any allocation: the run's plan against what the device has free
// (and KDRT_CUDA_MEMORY), so that a run that cannot fit says why and what
// to change instead of failing in cudaMalloc.
static void check_memory(const kdrt_ctx *c, size_t params, size_t grads, size_t arena, size_t io) {
  const kdrt_program *p = c->prog;
  size_t freeb = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&freeb, &total));
  size_t cap = memory_cap(c), avail = cap && cap < freeb ? cap : freeb;
  // cuBLAS's workspace, the scratch buffers and the pinned stage's mapping:
  // a margin of 64 MiB and 1% of the plan.
  size_t plan = params + grads + arena + io, need = plan + plan / 100 + (64u << 20);
  if (need <= avail) return;
  char b[6][32];
  cudaDeviceProp dp;
  CUDA_CHECK(cudaGetDeviceProperties(&dp, dev_impl.device));
  fflush(stdout);
  fprintf(stderr, "kdrt-cuda: rank %d: out of GPU memory: this run needs %s on GPU %d (%s), "
          "which has %s for it (%s free of %s%s%s):\n", c->rank, human((double)need, b[0], 32),
          dev_impl.device, dp.name, human((double)avail, b[1], 32), human((double)freeb, b[2], 32),
          human((double)total, b[3], 32), cap ? "; KDRT_CUDA_MEMORY=" : "",
          cap ? getenv("KDRT_CUDA_MEMORY") : "");
  int64_t rows = c->max_rows ? c->max_rows : p->batch;
  fprintf(stderr, "  parameters and optimizer state  %10s\n", human((double)params, b[0], 32));
  fprintf(stderr, "  gradients                       %10s\n", human((double)grads, b[0], 32));
  fprintf(stderr, "  activations for %6lld rows     %10s (this rank's share of a batch)\n",
          (long long)rows, human((double)arena, b[0], 32));
  fprintf(stderr, "  inputs, labels and logs         %10s\n", human((double)io, b[0], 32));
  // The five largest variables, with their optimizer slots.
  size_t prev = SIZE_MAX;
  int prev_v = -1;
  for (int k = 0; k < 5; k++) {
    int best = -1;
    size_t most = 0;
    for (int v = 0; v < p->nvars; v++) { // the largest after (prev, prev_v) in (size, index) order
      size_t sz = p->vars[v].n * (1 + (size_t)p->vars[v].nslots) * sizeof(float);
      bool after = sz < prev || (sz == prev && v > prev_v);
      if (after && (best < 0 || sz > most)) best = v, most = sz;
    }
    if (best < 0) break;
    if (k == 0) fprintf(stderr, "  the largest variables (this rank's share, with optimizer slots):\n");
    fprintf(stderr, "    %-40s %10s\n", p->vars[best].path, human((double)most, b[0], 32));
    prev = most, prev_v = best;
  }
  kdrt_fatal(c, "out of GPU memory: run with a smaller --batch-size (the activations scale with "
             "it), or compile for a mesh that splits the largest variables over more GPUs "
             "(kdcc --mesh, a layout map), or free the GPU");
}

// The blobs for c's program, once: parameters, gradients, arena (for the
// run's batch: c->arena_floats, the plan replayed when it is larger than
// the compiled one), one buffer per input and label (this rank's most
// rows), the logs.
static void setup_program(kdrt_ctx *c) {
  const kdrt_program *p = c->prog;
  if (dev_prog == p) return;
  if (dev_prog) kdrt_fatal(c, "kdrt-cuda: one program per process");
  if (p->ninputs > KDRT_MAX_FILES || p->nlabels > KDRT_MAX_FILES || p->nlogs > KDRT_MAX_LOGS)
    kdrt_fatal(c, "kdrt-cuda: %d inputs, %d labels, %d logs: more than this runtime takes",
               p->ninputs, p->nlabels, p->nlogs);
  int parts = p->batch_axis >= 0 ? p->mesh_shape[p->batch_axis] : 1;
  int64_t rows = c->max_rows > p->batch ? c->max_rows : p->batch;
  lb_rows = (int)((rows + parts - 1) / parts);
  arena_floats = c->arena_floats > p->arena_floats ? c->arena_floats : p->arena_floats;
  stage_bytes = 0;
  for (int i = 0; i < p->ninputs; i++) {
    x_elems[i] = (size_t)lb_rows * (size_t)kdrt_io_elems(&p->inputs[i]);
    stage_bytes += x_elems[i] * 4;
  }
  for (int j = 0; j < p->nlabels; j++) {
    y_elems[j] = (size_t)lb_rows * (size_t)kdrt_io_elems(&p->labels[j]);
    stage_bytes += y_elems[j] * sizeof(float);
  }
  stage_bytes = (stage_bytes + 15) / 16 * 16 + sizeof(kdrt_step_scalars); // the step's scalars
  stage_bytes += (size_t)(p->nlogs + 1) * sizeof(float);
  stage_bytes = (stage_bytes + 15) / 16 * 16; // the second half aligned as the first
  check_memory(c, p->param_floats * sizeof(float), p->grad_floats * sizeof(float),
               arena_floats * sizeof(float), 2 * stage_bytes); // inputs: two halves
  for (int h = 0; h < 2; h++) {
    for (int i = 0; i < p->ninputs; i++) // 4-byte elements
      x_dev[h][i] = kdrt_cuda_alloc(x_elems[i]);
    for (int j = 0; j < p->nlabels; j++) y_dev[h][j] = kdrt_cuda_alloc(y_elems[j]);
  }
  dev.params = kdrt_cuda_alloc(p->param_floats);
  dev.grads = kdrt_cuda_alloc(p->grad_floats);
  dev.arena = kdrt_cuda_alloc(arena_floats);
  dev.x = x_dev[0];
  dev.y = y_dev[0];
  dev.logs = kdrt_cuda_alloc((size_t)p->nlogs);
  for (int k = 0; k < 2; k++) {
    CUDA_CHECK(cudaEventCreateWithFlags(&stage_free[k], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&inputs_free[k], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&logs_done[k], cudaEventDisableTiming));
  }
  stage_next = nheld = 0;
  // A training step's logs are taken one step later (kdrt_ctx.collect), so
  // that the host loads the next batch while the device runs this one;
  // not when the host must see every step's weights (checkpoints) or
  // every launch is waited for (KDRT_CUDA_SYNC).
  const char *late = getenv("KDRT_CUDA_LATE_LOGS");
  logs_late = !mirror_each_step && !dev_impl.sync_each && !dev_impl.profile &&
              !(late && !strcmp(late, "0"));
  c->nonfinite = device_nonfinite;
  dev_prog = p;
  kdrt_cuda_register(&dev, 1);
}

// The logs of the oldest training step not yet taken (kdrt_ctx.collect).
static float *logs_of(int half) {
  return (float *)((char *)dev_impl.hscratch[2] + (size_t)(half + 1) * stage_bytes -
                   (size_t)(dev_prog->nlogs + 1) * sizeof(float));
}

static void collect_logs(kdrt_ctx *c, float *logs) {
  if (!nheld) kdrt_fatal(c, "kdrt-cuda: the logs of a step were asked for twice");
  int half = held[0];
  held[0] = held[1], nheld--;
  kdrt_cuda_wait_event(&dev, logs_done[half], "a training step");
  const float *out = logs_of(half);
  for (int k = 0; k < dev_prog->nlogs; k++) logs[k] = out[k];
}

// ---------------------------------------------------------------- weights

// The first variable (blockIdx.y) with an element that is not finite:
// atomicMin into *first. n[v]'s top 4 bits: issue 23's kdrt_var_half (its
// values kept in 16 bits), the rest its count.
#define HALF_SHIFT 60
__global__ static void nonfinite_kernel(int *first, const float *params, const size_t *off,
                                        const size_t *n) {
  int v = blockIdx.y, half = (int)(n[v] >> HALF_SHIFT);
  const float *w = params + off[v];
  const uint16_t *h = (const uint16_t *)w;
  size_t count = n[v] & (((size_t)1 << HALF_SHIFT) - 1);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    if (!isfinite(half ? kdrt_value16(half, h[i]) : w[i])) {
      atomicMin(first, v);
      return;
    }
}

// kdrt_ctx.nonfinite: asked of the device's weights when they are ahead of
// the host's (the host's copy is not kept current while training).
static int device_nonfinite(kdrt_ctx *c) {
  const kdrt_program *p = c->prog;
  if (!dev_prog || host_newer || !device_newer || !p->nvars || p->nvars > 65535)
    return kdrt_weights_nonfinite_host(c);
  if (!vars_off) { // the variables' offsets and sizes, once
    size_t *h = (size_t *)malloc(2 * (size_t)p->nvars * sizeof(size_t));
    if (!h) kdrt_fatal(c, "out of memory");
    for (int v = 0; v < p->nvars; v++)
      h[v] = p->vars[v].offset,
      h[p->nvars + v] = p->vars[v].n | (size_t)kdrt_var_half(&p->vars[v]) << HALF_SHIFT;
    CUDA_CHECK(cudaMalloc(&vars_off, 2 * (size_t)p->nvars * sizeof(size_t) + sizeof(int)));
    CUDA_CHECK(cudaMemcpy(vars_off, h, 2 * (size_t)p->nvars * sizeof(size_t),
                          cudaMemcpyHostToDevice));
    free(h);
  }
  kdrt_cuda *d = &dev;
  int *first = (int *)(vars_off + 2 * (size_t)p->nvars), nv = p->nvars, got = nv;
  CUDA_CHECK(cudaMemcpyAsync(first, &nv, sizeof nv, cudaMemcpyHostToDevice, d->impl->stream));
  nonfinite_kernel<<<dim3(64, (unsigned)nv), KDRT_THREADS, 0, d->impl->stream>>>(
      first, d->params, vars_off, vars_off + nv);
  KDRT_LAUNCHED(d, "nonfinite_kernel");
  CUDA_CHECK(cudaMemcpyAsync(&got, first, sizeof got, cudaMemcpyDeviceToHost, d->impl->stream));
  kdrt_cuda_wait(d, d->impl->stream, "the weights' check");
  return got;
}

// ---------------------------------------------------------------- steps

// The fit loop's batch buffers (kdrt_batch_buffers): pinned memory, known
// here, so that a step uploads from it directly; plain memory when the
// table is full or the pinning fails (then through the stage, as any other
// buffer). reuse(p): p's last upload is done.
static void *pinned_alloc(size_t bytes) {
  void *p = NULL;
  if (npinned < PINNED_MAX && cudaHostAlloc(&p, bytes, cudaHostAllocPortable) == cudaSuccess) {
    pinned[npinned++] = p;
    memset(p, 0, bytes);
    return p;
  }
  (void)cudaGetLastError();
  p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p) memset(p, 0, bytes);
  return p;
}

static int pinned_index(const void *p) {
  for (int k = 0; p && k < npinned; k++)
    if (pinned[k] == p) return k;
  return -1;
}

static void pinned_free(void *p) {
  int k = pinned_index(p);
  if (k < 0) {
    free(p);
    return;
  }
  for (int h = 0; h < 2; h++) // its last upload is done before it goes
    for (int i = 0; i < 2 * KDRT_MAX_FILES; i++)
      if (read_from[h][i] == p)
        kdrt_cuda_wait_event(&dev, stage_free[h], "a batch buffer's upload");
  CUDA_CHECK(cudaFreeHost(p));
  pinned[k] = pinned[--npinned];
}

static void pinned_reuse(const void *p) {
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 2 * KDRT_MAX_FILES; i++)
      if (read_from[h][i] == p) {
        kdrt_cuda_wait_event(&dev, stage_free[h], "a batch buffer's upload");
        read_from[h][i] = NULL;
      }
}

// n bytes of host buffer h to dev_dst on the copy stream: straight from h
// when it is a pinned batch buffer (then remembered as read by this half,
// at slot), else through the stage.
static void upload_input(kdrt_cuda *d, void *dev_dst, const void *h, size_t n, char **stage,
                         int slot) {
  read_from[cur_half][slot] = NULL;
  if (!n) return;
  if (pinned_index(h) >= 0) {
    CUDA_CHECK(cudaMemcpyAsync(dev_dst, h, n, cudaMemcpyHostToDevice, d->impl->copy_stream));
    read_from[cur_half][slot] = h;
    return;
  }
  memcpy(*stage, h, n);
  CUDA_CHECK(cudaMemcpyAsync(dev_dst, *stage, n, cudaMemcpyHostToDevice, d->impl->copy_stream));
  *stage += n;
}

extern "C" kdrt_cuda *kdrt_cuda_begin(kdrt_ctx *c, int mode, const void *const *hx,
                                      const void *const *hy) {
  kdrt_cuda *d = kdrt_cuda_open(c, dev.precision);
  setup_program(c);
  const kdrt_program *p = c->prog;
  // Rows that do not divide over the batch axis: the CPU runtime splits
  // them unevenly (kdrt_ctx.ragged); this one's dropout and collectives
  // still assume even blocks, so it refuses them, before training when
  // kdrt_main asks (c->probe: nothing is copied, the step returns).
  if (c->ragged) {
    int ba = p->batch_axis;
    kdrt_rows_refused(c, c->rows, p->mesh_shape[ba], p->mesh_axes[ba]);
  }
  if (c->probe) return d;
  // A new ctx, or new host blobs (predict, gradcheck): the host copy rules.
  if (owner != c || owner_params != c->params) {
    owner = c, owner_params = c->params;
    host_newer = 1, device_newer = 0;
  }
  if (mode == KDRT_CUDA_GRAD) host_newer = 1; // gradcheck moves c->params between calls
  if (c->params_changed) { // restore_best_weights put an earlier epoch's weights back
    c->params_changed = 0;
    host_newer = 1, device_newer = 0;
  }
  if (host_newer) {
    kdrt_cuda_upload(d, d->params, c->params, p->param_floats);
    host_newer = 0;
  }
  // This rank's rows of every input and label, through pinned memory so the
  // copies are asynchronous.
  int parts = p->batch_axis >= 0 ? p->mesh_shape[p->batch_axis] : 1;
  int64_t local = c->rows ? c->local_rows : p->batch / parts; // this step's rows here
  if (local > lb_rows)
    kdrt_fatal(c, "kdrt-cuda: a step of %lld rows on this rank, more than the %d its buffers "
               "were made for", (long long)local, lb_rows);
  // This step's half: of the pinned stage, free once the uploads of the
  // step that used it last are done; of the device's inputs, free once
  // that step has run (the copy stream waits for it, not the host). The
  // uploads run on the copy stream, so they overlap the step before this
  // one; the compute stream waits for them.
  kdrt_cuda_impl *s = d->impl;
  cur_half = stage_next, stage_next ^= 1;
  s->half = cur_half;
  d->x = x_dev[cur_half], d->y = y_dev[cur_half];
  char *stage = (char *)kdrt_cuda_hscratch(d, 2, 2 * stage_bytes) + cur_half * stage_bytes;
  kdrt_cuda_wait_event(d, stage_free[cur_half], "the step's input copies");
  CUDA_CHECK(cudaStreamWaitEvent(s->copy_stream, inputs_free[cur_half], 0));
  if (kdrt_cuda_resident_fill(d, cur_half, d->x, d->y, &stage)) { // the rows of a resident set
    for (int i = 0; i < 2 * KDRT_MAX_FILES; i++) read_from[cur_half][i] = NULL;
  } else {
    for (int i = 0; i < p->ninputs; i++)
      upload_input(d, d->x[i], hx[i], (size_t)local * (size_t)kdrt_io_elems(&p->inputs[i]) * 4,
                   &stage, i);
    for (int j = 0; j < p->nlabels; j++)
      upload_input(d, d->y[j], hy[j],
                   (size_t)local * (size_t)kdrt_io_elems(&p->labels[j]) * sizeof(float), &stage,
                   KDRT_MAX_FILES + j);
  }
  // The step's learning rate and count, for the kernels of a graph (its
  // half's: the other half's may still be read by the step in flight).
  kdrt_step_scalars *sc = (kdrt_step_scalars *)((char *)logs_of(cur_half) - sizeof *sc);
  sc->lr = c->lr, sc->step = c->step, sc->neg_lr = -c->lr, sc->one = 1.0f;
  CUDA_CHECK(cudaMemcpyAsync(s->scal + cur_half, sc, sizeof *sc, cudaMemcpyHostToDevice,
                             s->copy_stream));
  CUDA_CHECK(cudaEventRecord(stage_free[cur_half], s->copy_stream));
  CUDA_CHECK(cudaStreamWaitEvent(s->stream, stage_free[cur_half], 0));
  return d;
}

extern "C" void kdrt_cuda_end(kdrt_cuda *d, int mode, const float *logs_dev, float *logs) {
  kdrt_ctx *c = d->c;
  const kdrt_program *p = c->prog;
  cudaStream_t s = d->impl->stream;
  if (d->impl->capturing) kdrt_cuda_end_capture(d);
  // The step's inputs on the device are read: the upload of the step after
  // the next one may overwrite them.
  CUDA_CHECK(cudaEventRecord(inputs_free[cur_half], s));
  // The logs land after the inputs and labels in the step's half of the
  // stage, which the uploads of this step may still be reading.
  float *out = logs_of(cur_half);
  if (p->nlogs)
    CUDA_CHECK(cudaMemcpyAsync(out, logs_dev, (size_t)p->nlogs * sizeof(float),
                               cudaMemcpyDeviceToHost, s));
  if (mode == KDRT_CUDA_TRAIN) device_newer = 1;
  if (mode == KDRT_CUDA_GRAD && p->grad_floats)
    CUDA_CHECK(cudaMemcpyAsync(c->grads, d->grads, p->grad_floats * sizeof(float),
                               cudaMemcpyDeviceToHost, s));
  if (mode == KDRT_CUDA_EVAL) // `./train predict` reads the outputs from the host arena
    for (int o = 0; o < p->noutputs; o++) {
      size_t n = output_floats(p, o), off = p->outputs[o].offset;
      if (n)
        CUDA_CHECK(cudaMemcpyAsync(c->arena + off, d->arena + off, n * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
    }
  if (device_newer && (mode == KDRT_CUDA_EVAL || mirror_each_step)) {
    CUDA_CHECK(cudaMemcpyAsync(c->params, d->params, p->param_floats * sizeof(float),
                               cudaMemcpyDeviceToHost, s));
    device_newer = 0;
  }
  if (mode == KDRT_CUDA_TRAIN && logs_late) { // the fit loop takes them after the next step
    if (nheld == 2) kdrt_fatal(c, "kdrt-cuda: a third training step before the first's logs");
    CUDA_CHECK(cudaEventRecord(logs_done[cur_half], s));
    held[nheld++] = cur_half;
    c->logs_pending = 1;
    c->collect = collect_logs;
    return;
  }
  kdrt_cuda_wait(d, s, "the end of the step");
  profile_step(d, mode);
  for (int k = 0; k < p->nlogs; k++) logs[k] = out[k];
}

extern "C" void kdrt_cuda_shutdown(void) {
  if (!opened) return;
  kdrt_cuda_impl *s = &dev_impl;
  profile_report(s);
  kdrt_cuda_wait(&dev, s->stream, "shutdown");
  kdrt_cuda_wait(&dev, s->comm_stream, "shutdown");
  kdrt_cuda_wait(&dev, s->copy_stream, "shutdown");
  kdrt_cuda_comm_free(&dev);
  kdrt_cudnn_attention_free();
  kdrt_cudnn_free();
  for (size_t i = 0; i < sizeof s->dscratch / sizeof *s->dscratch; i++) {
    if (s->dscratch[i]) CUDA_CHECK(cudaFree(s->dscratch[i]));
    s->dscratch[i] = NULL, s->dscratch_cap[i] = 0;
  }
  for (int i = 0; i < 3; i++) {
    if (s->hscratch[i]) CUDA_CHECK(cudaFreeHost(s->hscratch[i]));
    s->hscratch[i] = NULL, s->hscratch_cap[i] = 0;
  }
  kdrt_cuda_free(dev.params), kdrt_cuda_free(dev.grads), kdrt_cuda_free(dev.arena);
  kdrt_cuda_free(dev.logs);
  if (vars_off) {
    CUDA_CHECK(cudaFree(vars_off));
    vars_off = NULL;
  }
  if (dev_prog)
    for (int k = 0; k < 2; k++) {
      CUDA_CHECK(cudaEventDestroy(stage_free[k]));
      CUDA_CHECK(cudaEventDestroy(inputs_free[k]));
      CUDA_CHECK(cudaEventDestroy(logs_done[k]));
    }
  kdrt_cuda_resident_free();
  for (int h = 0; h < 2; h++) {
    for (int i = 0; dev_prog && i < dev_prog->ninputs; i++)
      kdrt_cuda_free((float *)x_dev[h][i]), x_dev[h][i] = NULL;
    for (int j = 0; dev_prog && j < dev_prog->nlabels; j++)
      kdrt_cuda_free(y_dev[h][j]), y_dev[h][j] = NULL;
  }
  dev.params = dev.grads = dev.arena = dev.logs = NULL;
  dev.x = NULL, dev.y = NULL;
  kdrt_cuda_drop_graphs(s);
  CUDA_CHECK(cudaFree(s->scal));
  s->scal = NULL;
  CUBLAS_CHECK(cublasDestroy(s->blas));
  CUBLAS_CHECK(cublasLtDestroy(s->lt));
  CUDA_CHECK(cudaFree(s->blas_ws));
  s->blas_ws = NULL;
  CUDA_CHECK(cudaEventDestroy(s->to_comm));
  CUDA_CHECK(cudaEventDestroy(s->to_compute));
  CUDA_CHECK(cudaStreamDestroy(s->stream));
  CUDA_CHECK(cudaStreamDestroy(s->comm_stream));
  CUDA_CHECK(cudaStreamDestroy(s->copy_stream));
  opened = 0;
  dev_prog = NULL;
  kdrt_cuda_register(&dev, 0);
  owner = NULL;
}

// ---------------------------------------------------------------- run

// Everything but opcheck (main.cu): `./train gradcheck` (the CPU runtime's,
// through grad_step), else kdrt_main (fit, evaluate, predict).
extern "C" int kdrt_cuda_run(int argc, char **argv, const kdrt_program *prog, int precision) {
  dev.precision = precision;
  int rc;
  if (argc > 1 && !strcmp(argv[1], "gradcheck")) {
    rc = kdrt_gradcheck(argc - 1, argv + 1, prog);
  } else {
    // Checkpoints, --checkpoint-best and --restore-best-weights read
    // c->params during fit (the last at an epoch's end, with no
    // evaluation before it when it watches a training log): keep the
    // host copy current.
    static const char *const readers[] = {"--checkpoint-dir", "--checkpoint-best",
                                          "--restore-best-weights"};
    for (int i = 1; i < argc; i++)
      for (int k = 0; k < 3; k++) {
        size_t n = strlen(readers[k]);
        if (!strncmp(argv[i], readers[k], n) && (!argv[i][n] || argv[i][n] == '='))
          mirror_each_step = 1;
      }
    // The batch buffers pinned, uploaded from without a copy (issue 22);
    // KDRT_CUDA_PINNED=0: through the stage.
    const char *pin = getenv("KDRT_CUDA_PINNED");
    if (!(pin && !strcmp(pin, "0"))) {
      kdrt_batch_buffers.alloc = pinned_alloc;
      kdrt_batch_buffers.free = pinned_free;
      kdrt_batch_buffers.reuse = pinned_reuse;
    }
    kdrt_batch_buffers.rows = kdrt_cuda_resident_rows; // resident.cu: within its budget
    rc = kdrt_main(argc, argv, prog); // predict too (kdrt_main dispatches it)
    kdrt_batch_buffers.rows = NULL;
  }
  kdrt_cuda_shutdown();
  return rc;
}
