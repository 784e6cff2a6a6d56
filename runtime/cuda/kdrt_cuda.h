// kdrt_cuda: the CUDA runtime a `kdcc --target cuda` program links against.
//
// The generated program.cu is the CPU program with its kernels swapped:
// the same memory plan (one parameter blob, one gradient blob, one
// activation arena, offsets as named constants), the same op order, and
// the same kdrt_program handed to the CPU runtime's kdrt_main, which keeps
// the fit loop, the data, the progress output, the history, checkpoints
// and weights files. Only the step functions differ: each copies this
// rank's rows of every input and label to the device (kdrt_cuda_begin),
// runs the step there (or replays it as a CUDA graph: kdrt_cuda_replay),
// writes its logs into a device array and copies them back (kdrt_cuda_end);
// a training step's logs reach the host one step later (kdrt_ctx.collect),
// so the host loads the next batch while the device runs this one (the CPU
// runtime's input thread gathers the one after). Steps alternate between
// two halves of the input buffers, pinned and on the device: a step's
// uploads run on a copy stream while the step before it computes, and each
// half has its own CUDA graph (issue 22).
//
// Where the numbers live
// - The device blobs are authoritative while training. The host blobs
//   (c->params, ...) that kdrt_main allocated hold the initial values
//   (kdrt_init_fill on the host: the very numbers the CPU backend starts
//   from), weights files and checkpoints; they are uploaded before the
//   first step and brought back when the host needs them: before an
//   evaluation that follows training (so --save-weights writes trained
//   weights), after every training step when checkpoints are on, and the
//   gradients after every grad_step (gradcheck).
// - Every kernel runs on one stream (d->stream) in program order;
//   collectives run on a second stream ordered with events (comm.cu), the
//   inputs' uploads on a third (session.cu), each ordered with events.
//
// Conventions are those of ../kdrt.h: float32, row-major local blocks,
// groups of mesh axes as bit masks. Each op family is one .cu file with
// one entry point per op; every CUDA, cuBLAS and NCCL call is checked
// (common.cuh).
#ifndef KDRT_CUDA_H
#define KDRT_CUDA_H

#include <setjmp.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kdrt.h"

// How matrix products are computed (kdcc --precision); data stays float32:
// fp32 products, TF32 tensor-core products, or bf16 ones (both operands
// rounded to bfloat16, float32 accumulation and result).
enum { KDRT_PREC_FP32, KDRT_PREC_TF32, KDRT_PREC_BF16 };

// What a step does, for kdrt_cuda_begin / kdrt_cuda_end.
enum { KDRT_CUDA_TRAIN, KDRT_CUDA_EVAL, KDRT_CUDA_GRAD };

typedef struct kdrt_cuda_impl kdrt_cuda_impl;

typedef struct {
  kdrt_ctx *c;             // the host context of the step in progress
  float *params;           // device: prog->param_floats, as c->params
  float *grads;            // device: prog->grad_floats
  float *arena;            // device: prog->arena_floats (conv scratch at its end)
  void **x;                // [ninputs] device: this rank's rows of input i, of its dtype
                           // (float32, or int32 ids): [lb, shape...]
  float **y;               // [nlabels] device: this rank's rows of label j, [lb, shape...]
  float *logs;             // device: [nlogs] floats, where a step may write its logs
                           // (then kdrt_cuda_end(d, mode, d->logs, logs))
  int precision;           // KDRT_PREC_*
  kdrt_cuda_impl *impl;    // streams, handles, communicators (common.cuh)
} kdrt_cuda;

// ---------------------------------------------------------------- main.cu
// The generated main: `./train opcheck` (opcheck.cu), `./train gradcheck`
// (the CPU runtime's, through grad_step), `./train predict`, else
// kdrt_main. Frees the device before returning.
int kdrt_cuda_main(int argc, char **argv, const kdrt_program *prog, int precision);

// ---------------------------------------------------------------- session.cu
// Before a step: the device set up on first use, the parameters uploaded
// when the host copy is newer (and always for GRAD), hx[i] (this rank's
// rows of input i, lb * prod(shape) elements of its dtype, 4 bytes each)
// to d->x[i] and hy[j] (floats) to d->y[j], through pinned memory.
// Returns the device state.
kdrt_cuda *kdrt_cuda_begin(kdrt_ctx *c, int mode, const void *const *hx, const void *const *hy);
// After a step: the program's nlogs floats at logs_dev (a device array,
// e.g. d->logs, in log_names order) to logs on the host, then what the
// host needs back (see above; after EVAL every output with an arena
// offset, for predict). Waits for the device, except after a training
// step without checkpoints, KDRT_CUDA_SYNC or KDRT_CUDA_PROFILE: then it
// returns at once, sets c->logs_pending, and the fit loop takes the logs
// with c->collect after the next step.
void kdrt_cuda_end(kdrt_cuda *d, int mode, const float *logs_dev, float *logs);
// The device without a program, for opcheck: stream and handles only.
kdrt_cuda *kdrt_cuda_open(kdrt_ctx *c, int precision);
void kdrt_cuda_shutdown(void);
// The generated program calls this before each op's call (its macros do,
// with the call's name, file and line), so that a fault names the op: with
// KDRT_CUDA_SYNC=1 every launch is waited for and a failure says
// "program.cu:LINE"; without it, a fault surfaces at the step's end and the
// message says to rerun so. With KDRT_CUDA_PROFILE=1 each call's GPU time
// is measured (an event between calls) and the lines that took the most
// are printed at exit.
void kdrt_cuda_at(kdrt_cuda *d, const char *fn, const char *file, int line);

// ---------------------------------------------------------------- device.cu
// In a training step after its inputs are on their way: 1 when the step
// was captured as a CUDA graph before and that graph is now queued (the
// step's parts must not run), else 0, the parts then run (and may be
// captured, kdrt_cuda_end closing the capture). KDRT_CUDA_GRAPH=0: never.
int kdrt_cuda_replay(kdrt_cuda *d, int mode);
// Where a failed capture comes back to: the step calls
// setjmp(*kdrt_cuda_capture_env(d)) right after kdrt_cuda_replay returns 0,
// before its parts; a CUDA error while capturing (or a graph that cannot be
// made) ends the capture, turns graphs off with a message, and returns
// there, so the parts run again without a graph.
jmp_buf *kdrt_cuda_capture_env(kdrt_cuda *d);
// Device memory (checked; zeroed) and copies on d's stream.
float *kdrt_cuda_alloc(size_t floats);
void kdrt_cuda_free(float *p);
void kdrt_cuda_upload(kdrt_cuda *d, float *dst, const float *src, size_t n);
void kdrt_cuda_download(kdrt_cuda *d, float *dst, const float *src, size_t n); // waits
void kdrt_cuda_copy(kdrt_cuda *d, float *dst, const float *src, size_t n);
void kdrt_cuda_sync(kdrt_cuda *d);

// ---------------------------------------------------------------- the kernels
// Every kernel of kdrt_ops.def's list, with the CPU runtime's arguments after
// the device state: kdrt_cuda_<name>(d, args) runs kdrt_<name>(args) (or
// kdrt_<name>(c, args), the context being d->c) on device buffers, on d's
// stream. Semantics are the CPU runtime's (../ops.c, ../loss.c, ../optim.c,
// ../norm.c, ../comm.c, ../rng.c); where the numbers may differ in the last
// bits, the .cu file says so.
// One .cu per family: act.cu (act, act_grad, add, mul, scale; copy is in
// device.cu), bias.cu, softmax.cu, loss.cu, xent.cu (the split
// crossentropy), matmul.cu, conv2d.cu, maxpool.cu, block.cu, nd.cu
// (transpose, reduce_sum, broadcast, gather, scatter_add), optim.cu,
// dropout.cu and comm.cu (the collectives: NCCL, one communicator per
// group of mesh axes, or host-staged MPI when ranks share a GPU).
#define KDRT_CUDA_UNPAREN(...) __VA_ARGS__
#define K(name, args) void kdrt_cuda_##name(kdrt_cuda *d, KDRT_CUDA_UNPAREN args);
#define KC K
#include "kdrt_ops.def"

// ---------------------------------------------------------------- opcheck.cu
// `./train opcheck [--repeat N] [--seed S] [--matmul-tol X]`: every kernel
// above against the CPU runtime's on random data (round r's from seed S + r),
// outputs poisoned with NaN before each call, by normalised error; exit
// status 1 on a failure.
int kdrt_cuda_opcheck(int argc, char **argv, int precision);

#ifdef __cplusplus
}
#endif

#endif
