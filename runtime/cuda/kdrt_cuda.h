// kdrt_cuda: the CUDA runtime a `kdcc --target cuda` program links against.
//
// The generated program.cu is the CPU program with its kernels swapped:
// the same memory plan (one parameter blob, one gradient blob, one
// activation arena, offsets as named constants), the same op order, and
// the same kdrt_program handed to the CPU runtime's kdrt_main, which keeps
// the fit loop, the data, the progress output, the history, checkpoints
// and weights files. Only the step functions differ: each copies this
// rank's rows of every input and label to the device (kdrt_cuda_begin),
// runs the step there, writes its logs into a device array and copies
// them back (kdrt_cuda_end).
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
//   collectives run on a second stream ordered with events (comm.cu).
//
// Conventions are those of ../kdrt.h: float32, row-major local blocks,
// groups of mesh axes as bit masks. Each op family is one .cu file with
// one entry point per op; every CUDA, cuBLAS and NCCL call is checked
// (common.cuh).
#ifndef KDRT_CUDA_H
#define KDRT_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "kdrt.h"

// How matrix products are computed (kdcc --precision); data stays float32.
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

// ---------------------------------------------------------------- device.cu
// The generated main: `./train opcheck` (opcheck.cu), `./train gradcheck`
// (the CPU runtime's, through grad_step), `./train predict`, else
// kdrt_main. Frees the device before returning.
int kdrt_cuda_main(int argc, char **argv, const kdrt_program *prog, int precision);
// Before a step: the device set up on first use, the parameters uploaded
// when the host copy is newer (and always for GRAD), hx[i] (this rank's
// rows of input i, lb * prod(shape) elements of its dtype, 4 bytes each)
// to d->x[i] and hy[j] (floats) to d->y[j], through pinned memory.
// Returns the device state.
kdrt_cuda *kdrt_cuda_begin(kdrt_ctx *c, int mode, const void *const *hx, const void *const *hy);
// After a step: the program's nlogs floats at logs_dev (a device array,
// e.g. d->logs, in log_names order) to logs on the host, then what the
// host needs back (see above; after EVAL every output with an arena
// offset, for predict). Waits for the device.
void kdrt_cuda_end(kdrt_cuda *d, int mode, const float *logs_dev, float *logs);
// The device without a program, for opcheck: stream and handles only.
kdrt_cuda *kdrt_cuda_open(kdrt_ctx *c, int precision);
void kdrt_cuda_shutdown(void);
// Device memory (checked; zeroed) and copies on d's stream.
float *kdrt_cuda_alloc(size_t floats);
void kdrt_cuda_free(float *p);
void kdrt_cuda_upload(kdrt_cuda *d, float *dst, const float *src, size_t n);
void kdrt_cuda_download(kdrt_cuda *d, float *dst, const float *src, size_t n); // waits
void kdrt_cuda_copy(kdrt_cuda *d, float *dst, const float *src, size_t n);
void kdrt_cuda_sync(kdrt_cuda *d);

// ---------------------------------------------------------------- act.cu
// y = act(x), dx = dy * act'(.) (x for gelu/silu, y for the others), as kdrt_act.
void kdrt_cuda_act(kdrt_cuda *d, int act, float *y, const float *x, size_t n);
void kdrt_cuda_act_grad(kdrt_cuda *d, int act, float *dx, const float *dy, const float *x,
                        const float *y, size_t n);
// out = in[0] + ... + in[nin-1] (nin <= 8), summed left to right.
void kdrt_cuda_add(kdrt_cuda *d, float *out, const float *const *in, int nin, size_t n);
// out = in * scale + shift.
void kdrt_cuda_scale(kdrt_cuda *d, float *out, const float *in, size_t n, float scale,
                     float shift);

// ---------------------------------------------------------------- bias.cu
// out[r, j] = act(in[r, j] + bias[j]) over [rows, cols] (KDRT_ACT_LINEAR: the bias add),
// with the expressions of emit_c.c's fused loop.
void kdrt_cuda_bias_act(kdrt_cuda *d, int act, float *out, const float *in, const float *bias,
                        int64_t rows, int64_t cols);
// out[j] = sum over r of in[r, j].
void kdrt_cuda_bias_grad(kdrt_cuda *d, float *out, const float *in, int64_t rows, int64_t cols);

// ---------------------------------------------------------------- softmax.cu
void kdrt_cuda_softmax(kdrt_cuda *d, float *y, const float *x, int64_t rows, int64_t cols);
void kdrt_cuda_softmax_grad(kdrt_cuda *d, float *dx, const float *dy, const float *y,
                            int64_t rows, int64_t cols);

// ---------------------------------------------------------------- loss.cu
// As kdrt_loss / kdrt_accuracy (the value written to out[0], a device
// float) and kdrt_loss_grad.
void kdrt_cuda_loss(kdrt_cuda *d, int kind, int from_logits, float *out, const float *pred,
                    const float *y, int64_t rows, int64_t cols, double scale);
void kdrt_cuda_accuracy(kdrt_cuda *d, int kind, int from_logits, float *out, const float *pred,
                        const float *y, int64_t rows, int64_t cols, double scale);
void kdrt_cuda_loss_grad(kdrt_cuda *d, int kind, int from_logits, float *dpred,
                         const float *pred, const float *y, int64_t rows, int64_t cols,
                         double scale);

// ---------------------------------------------------------------- matmul.cu
// Row-major c[M, N] = op(a) @ op(b), op = transpose when ta / tb; lda, ldb,
// ldc are the row lengths of a, b, c as stored (cblas_sgemm's meaning).
void kdrt_cuda_matmul(kdrt_cuda *d, int ta, int tb, int64_t M, int64_t N, int64_t K,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                      int64_t ldc);

// ---------------------------------------------------------------- conv2d.cu
// As kdrt_conv2d / _dx / _dw: im2col in scratch + one GEMM.
void kdrt_cuda_conv2d(kdrt_cuda *d, float *y, const float *x, const float *f, int B, int H,
                      int W, int C, int KH, int KW, int K, int sh, int sw, int pad_t, int pad_l,
                      int OH, int OW, float *scratch);
void kdrt_cuda_conv2d_dx(kdrt_cuda *d, float *dx, const float *dy, const float *f, int B, int H,
                         int W, int C, int KH, int KW, int K, int sh, int sw, int pad_t,
                         int pad_l, int OH, int OW, float *scratch);
void kdrt_cuda_conv2d_dw(kdrt_cuda *d, float *dw, const float *x, const float *dy, int B, int H,
                         int W, int C, int KH, int KW, int K, int sh, int sw, int pad_t,
                         int pad_l, int OH, int OW, float *scratch);

// ---------------------------------------------------------------- maxpool.cu
void kdrt_cuda_maxpool(kdrt_cuda *d, float *y, const float *x, int B, int H, int W, int C, int PH,
                       int PW, int sh, int sw, int pad_t, int pad_l, int OH, int OW);
void kdrt_cuda_maxpool_grad(kdrt_cuda *d, float *dx, const float *dy, const float *x, int B,
                            int H, int W, int C, int PH, int PW, int sh, int sw, int pad_t,
                            int pad_l, int OH, int OW);

// ---------------------------------------------------------------- block.cu
// As kdrt_copy_block / kdrt_place_block.
void kdrt_cuda_copy_block(kdrt_cuda *d, float *out, const float *in, int64_t outer,
                          int64_t in_ext, int64_t off, int64_t out_ext, int64_t inner);
void kdrt_cuda_place_block(kdrt_cuda *d, float *out, const float *in, int64_t outer,
                           int64_t in_ext, int64_t off, int64_t out_ext, int64_t inner);

// ---------------------------------------------------------------- dropout.cu
// As kdrt_dropout: the same Philox-4x32-10 mask, bit for bit.
void kdrt_cuda_dropout(kdrt_cuda *d, float *y, const float *x, const kdrt_layout *l, float rate,
                       uint64_t stream);

// ---------------------------------------------------------------- optim.cu
// As kdrt_sgd / kdrt_adam / kdrt_adamw / kdrt_rmsprop.
void kdrt_cuda_sgd(kdrt_cuda *d, float *w, const float *g, float *m, size_t n, float lr,
                   float momentum, int nesterov);
void kdrt_cuda_adam(kdrt_cuda *d, float *w, const float *g, float *m, float *v, size_t n,
                    float lr, float b1, float b2, float eps, int64_t t);
void kdrt_cuda_adamw(kdrt_cuda *d, float *w, const float *g, float *m, float *v, size_t n,
                     float lr, float b1, float b2, float eps, float wd, int64_t t);
void kdrt_cuda_rmsprop(kdrt_cuda *d, float *w, const float *g, float *v, float *m, size_t n,
                       float lr, float rho, float momentum, float eps);

// ---------------------------------------------------------------- comm.cu
// The collectives of ../kdrt.h on device buffers: NCCL (one communicator
// per group of mesh axes), or host-staged MPI when ranks share a GPU.
void kdrt_cuda_allreduce(kdrt_cuda *d, unsigned axes, const float *in, float *out, size_t n);
void kdrt_cuda_reduce_scatter(kdrt_cuda *d, unsigned axes, int rank, const int64_t *lshape,
                              int dim, const float *in, float *out);
void kdrt_cuda_allgather(kdrt_cuda *d, unsigned axes, int rank, const int64_t *lshape, int dim,
                         const float *in, float *out);
void kdrt_cuda_alltoall(kdrt_cuda *d, unsigned axes, int rank, const int64_t *lshape, int from,
                        int to, const float *in, float *out);
void kdrt_cuda_slice(kdrt_cuda *d, unsigned axes, int rank, const int64_t *lshape, int dim,
                     const float *in, float *out);

// ---------------------------------------------------------------- opcheck.cu
// `./train opcheck [--precision-tol X]`: every kernel above against the CPU
// runtime's on random data, by normalised error; exit status 1 on a failure.
int kdrt_cuda_opcheck(int argc, char **argv, int precision);

#ifdef __cplusplus
}
#endif

#endif
