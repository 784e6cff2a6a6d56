// common.cuh: what every runtime/cuda/*.cu shares: the error checks, the
// device state behind kdrt_cuda.impl, launch helpers and block reductions.
#ifndef KDRT_CUDA_COMMON_CUH
#define KDRT_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#include "cudnn_attn.h"
#include "kdrt_cuda.h"

// ---------------------------------------------------------------- checks
// One template: evaluate the call once, compare with its success value,
// report the call's text, file, line and the library's message, abort.
extern "C" void kdrt_cuda_fail(const char *call, const char *file, int line, const char *msg);
#define KDRT_GPU_CHECK(call, type, ok, to_string)                                                \
  do {                                                                                           \
    type kdrt_rc_ = (call);                                                                      \
    if (kdrt_rc_ != (ok)) kdrt_cuda_fail(#call, __FILE__, __LINE__, to_string(kdrt_rc_));        \
  } while (0)
#define CUDA_CHECK(call) KDRT_GPU_CHECK(call, cudaError_t, cudaSuccess, cudaGetErrorString)
#define CUBLAS_CHECK(call)                                                                       \
  KDRT_GPU_CHECK(call, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
#define NCCL_CHECK(call) KDRT_GPU_CHECK(call, ncclResult_t, ncclSuccess, ncclGetErrorString)

// After every kernel launch: the launch error, and with KDRT_CUDA_SYNC=1 in
// the environment the kernel's own (the stream is synchronised), so that a
// fault is reported at the op that caused it.
extern "C" void kdrt_cuda_launched(kdrt_cuda *d, const char *what, const char *file, int line);
#define KDRT_LAUNCHED(d, what) kdrt_cuda_launched((d), (what), __FILE__, __LINE__)

// ---------------------------------------------------------------- state
enum { KDRT_COMM_NONE, KDRT_COMM_NCCL, KDRT_COMM_HOST };

// What changes from one training step to the next besides the data: the
// learning rate and the step count, on the device (uploaded with the
// step's inputs), so that a step captured as a CUDA graph reads them there
// when it is replayed (the kernels that use them take this pointer, NULL
// outside a capture: then their host arguments hold).
typedef struct {
  float lr;     // c->lr
  int64_t step; // c->step
  float neg_lr; // -c->lr: the alpha of a GEMM that does an SGD update (matmul.cu)
  float one;    // 1: its beta (cuBLAS reads both from the device or neither)
} kdrt_step_scalars;
static_assert(offsetof(kdrt_step_scalars, one) ==
                  offsetof(kdrt_step_scalars, neg_lr) + sizeof(float),
              "matmul.cu reads beta right after alpha");

// A training step captured as a CUDA graph, for one count of rows: one
// graph per half of the double-buffered inputs (each reads its own inputs
// and step scalars: device.cu).
typedef struct {
  int64_t rows;
  int seen;                   // steps of these rows run without a graph so far
  cudaGraphExec_t exec[2];    // NULL until captured
} kdrt_cuda_graph;
enum { KDRT_GRAPHS = 4 };

struct kdrt_cuda_impl {
  int device;
  cudaStream_t stream;        // every kernel, in program order
  cudaStream_t comm_stream;   // NCCL collectives
  cudaStream_t copy_stream;   // the inputs' uploads, while the previous step computes
  cudaEvent_t to_comm, to_compute;
  cublasHandle_t blas;
  void *blas_ws;              // cuBLAS's workspace (cublasSetWorkspace), cuBLASLt's too
  cublasLtHandle_t lt;        // issue 22: products with a bias epilogue (matmul.cu)
  size_t blas_ws_bytes;
  int sync_each;              // KDRT_CUDA_SYNC=1
  int cudnn;                  // KDRT_CUDA_CUDNN (issue 22, opt-in; KDRT_CUDNN_* bits,
                              // cudnn_attn.h): convolutions through cuDNN and bn_stats in
                              // two levels (cudnn.cu, norm.cu), attention (cudnn_attn.cu)
  kdrt_step_scalars *scal;    // device: [2], one per half (see kdrt_step_scalars)
  int half;                   // the half of the step in progress: its inputs and scalars
  // Training steps as CUDA graphs (device.cu): off with KDRT_CUDA_GRAPH=0,
  // KDRT_CUDA_SYNC, KDRT_CUDA_PROFILE or host-staged collectives, for good
  // once a capture fails (then with a message), and for a step that needs
  // what a graph cannot replay (graph_unsafe: captured, run once, dropped).
  int graphs_on, capturing, graph_unsafe, ngraphs;
  kdrt_cuda_graph graph[KDRT_GRAPHS];
  // The op in progress: the line of program.cu whose call is running
  // (kdrt_cuda_at), for a fault's message; the calls so far, and the one
  // that launches a faulting kernel instead (KDRT_CUDA_INJECT_FAULT=N, a
  // test of that message; 0: none).
  const char *at_fn, *at_file;
  int at_line;
  long calls, fault_at;
  // KDRT_CUDA_PROFILE=1: an event before each call of the step in progress
  // (prof_line[k]: its line, prof_fn[k]: its name), and per line of
  // program.cu the time and calls summed over the training steps after
  // the first.
  int profile, profile_steps;
  cudaEvent_t *prof_ev;
  int *prof_line;
  const char **prof_fn;
  int prof_n, prof_cap;
  double *line_ms;
  long *line_calls;
  const char **line_fn;
  int nlines;
  // communication (comm.cu)
  int comm_mode;              // KDRT_COMM_*
  // comm.cu's kdrt_cuda_comm_abort and _poll, set by session.cu when it
  // opens the device: device.cu (the floor, beneath comm.cu) aborts the
  // communicators when a check fails and polls them while it waits.
  void (*comm_abort)(kdrt_cuda *d);
  void (*comm_poll)(kdrt_cuda *d, const char *what);
  ncclComm_t world;
  ncclComm_t group[1 << KDRT_MAX_AXES]; // per group mask, made on first use
  // scratch, grown on demand: device (two for packing, one for reductions,
  // two for products, two for the 16-bit collectives, one for cuDNN's
  // convolutions), pinned host (two for host-staged collectives, one for
  // step I/O)
  void *dscratch[8];
  size_t dscratch_cap[8];
  void *hscratch[3];
  size_t hscratch_cap[3];
};

// Wait until stream st has run its work. With NCCL the wait polls, asking
// the communicators for asynchronous errors in between (comm.cu), so a
// failed peer ends the job with a message instead of a hang; `what` names
// the wait in that message.
void kdrt_cuda_wait(kdrt_cuda *d, cudaStream_t st, const char *what);
// The same until event ev has happened.
void kdrt_cuda_wait_event(kdrt_cuda *d, cudaEvent_t ev, const char *what);
void kdrt_cuda_comm_poll(kdrt_cuda *d, const char *what);
void kdrt_cuda_comm_abort(kdrt_cuda *d);

// b bytes rounded up to 256: the start of the next of several tensors
// sharing one device scratch (cuDNN wants its tensors 256-byte aligned).
static inline size_t kdrt_round256(size_t b) { return (b + 255) / 256 * 256; }
// Device scratch `which` (0, 1: collectives' packing, 2: reductions, 3: a
// product's bf16 operands, 4: its padded result, 5, 6: a 16-bit
// collective's packed operand and result, 7: a cuDNN convolution's
// workspace, filter and padded input, or cuDNN's attention's workspace and
// bf16 operands) of at least bytes; contents
// undefined. Growing waits for the device.
void *kdrt_cuda_dscratch(kdrt_cuda *d, int which, size_t bytes);
// Pinned host scratch `which` (0, 1: host-staged collectives, 2: step I/O).
void *kdrt_cuda_hscratch(kdrt_cuda *d, int which, size_t bytes);
// The device with its program set up (the first step's probe does it), else NULL.
extern "C" kdrt_cuda *kdrt_cuda_current(void);
// session.cu to device.cu: d is the process's device (opened: a failed
// check reports its op and aborts its communicators), ready once its
// program's buffers are made (kdrt_cuda_current), not ready after shutdown.
extern "C" void kdrt_cuda_register(kdrt_cuda *d, int ready);
// The end of a training step being captured (kdrt_cuda_end): its graph made,
// kept and run; on a failure, back to the step's start without graphs.
void kdrt_cuda_end_capture(kdrt_cuda *d);
// Every training step's CUDA graph destroyed (none may be running).
void kdrt_cuda_drop_graphs(kdrt_cuda_impl *s);
// main.cu's for everything but opcheck (session.cu): gradcheck, or
// kdrt_main; frees the device before returning.
extern "C" int kdrt_cuda_run(int argc, char **argv, const kdrt_program *prog, int precision);
// resident.cu (issue 22): data sets held whole on the device, within a
// budget. kdrt_cuda_resident_rows is kdrt_batch_buffers.rows; fill gathers
// the rows it said yes to into the step's inputs x and labels y (half
// `half` of the double buffers) on the copy stream, the sample numbers
// through *stage, and returns 1; 0 (nothing done) when the step's rows come
// from the host. free gives every set back (at shutdown).
extern "C" int kdrt_cuda_resident_rows(const kdrt_data *d, const int64_t *order, int64_t pos0,
                                       int64_t n);
extern "C" int kdrt_cuda_resident_fill(kdrt_cuda *d, int half, void *const *x, float *const *y,
                                       char **stage);
extern "C" void kdrt_cuda_resident_free(void);
// cudnn.cu (issue 22, KDRT_CUDA_CUDNN=1): pass `pass` (KDRT_CONV_Y: out = y,
// a = x, b = f; _DX: out = dx, a = dy, b = f; _DW: out = dw, a = x, b = dy)
// of conv w through cuDNN; 0 when it did nothing (cuDNN off, a pointwise
// conv, no deterministic algorithm for the shape): conv2d.cu's kernels do it.
int kdrt_cudnn_conv(kdrt_cuda *d, int pass, const kdrt_window *w, float *out, const float *a,
                    const float *b);
// Whether cuDNN can be loaded (why not into why[0, n)); opcheck asks first.
int kdrt_cudnn_available(char *why, size_t n);
// The handle and every shape's descriptors given back (kdrt_cuda_shutdown).
void kdrt_cudnn_free(void);
// libcudnn.so.9's dlopen handle, loading it on first use; NULL (why in
// why[0, n)) when it cannot be loaded.
void *kdrt_cudnn_lib(char *why, size_t n);
// cudnn_attn.cu (issue 22, KDRT_CUDA_CUDNN=attn or =1, bf16 only):
// kdrt_cuda_attention (grad 0: o, lse from q, k, v) or _attention_grad
// (grad 1: dq, dk, dv from dout, q, k, v, oin, lsein) through cuDNN's
// fused attention; 0 when it did nothing (off, not bf16, a shape cuDNN does
// not take: said once on stderr, and kdrt_cudnn_attention_why says why):
// attn.cu's kernels do it.
extern "C" int kdrt_cudnn_attention_run(kdrt_cuda *d, int grad, float *o, float *lse, float *dq,
                                        float *dk, float *dv, const float *dout, const float *q,
                                        const float *k, const float *v, const float *oin,
                                        const float *lsein, int64_t bn, int64_t t, int64_t s,
                                        int64_t hd, float scale, int causal);
const char *kdrt_cudnn_attention_why(void);
// Its handle and graphs given back (kdrt_cuda_shutdown).
void kdrt_cudnn_attention_free(void);
// The CPU runtime's context of the step in progress must be set.
void kdrt_cuda_need_ctx(const kdrt_cuda *d, const char *what);

// The step scalars for a kernel being captured into a graph (its half's),
// else NULL.
static inline const kdrt_step_scalars *kdrt_step_sc(const kdrt_cuda *d) {
  return d->impl->capturing ? d->impl->scal + d->impl->half : NULL;
}
// A GEMM's alpha that is the step's -lr (the SGD update fused into a
// weight's gradient product: w = w - lr * dW, beta 1; every other GEMM's
// alpha is positive): in a capture, the device's -lr (&scal->neg_lr, with
// &scal->one for beta, under CUBLAS_POINTER_MODE_DEVICE), else NULL. A
// rate of 0 counts (a warm-up schedule's first steps).
static inline const float *kdrt_step_neg_lr(const kdrt_cuda *d, float alpha, float beta) {
  const kdrt_step_scalars *sc = kdrt_step_sc(d);
  return sc && d->c && alpha <= 0.0f && alpha == -d->c->lr && beta == 1.0f ? &sc->neg_lr : NULL;
}
// What only this step's host values can give (Nadam's running product):
// the graph being captured runs once and is not kept.
static inline void kdrt_cuda_graph_unsafe(kdrt_cuda *d) {
  if (d->impl->capturing) d->impl->graph_unsafe = 1;
}

// ---------------------------------------------------------------- launching
#define KDRT_THREADS 256
// Blocks for a grid-stride loop over n elements.
static inline unsigned kdrt_blocks(size_t n) {
  size_t b = (n + KDRT_THREADS - 1) / KDRT_THREADS;
  if (b < 1) b = 1;
  if (b > 65535u * 16u) b = 65535u * 16u;
  return (unsigned)b;
}
#define KDRT_FOR(i, n)                                                                           \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)(n);                \
       i += (size_t)gridDim.x * blockDim.x)

// Elementwise kernels move W floats per thread and step: W = 4 (one 16-byte
// access, LDG.E.128 / STG.E.128) where every buffer they touch is 16-byte
// aligned, else 1; the n % W elements past the last whole group are the
// tail, one per thread (KDRT_FOR_TAIL). Scalar loads were a quarter of the
// bytes per instruction and left the H100 at 2/3 of its bandwidth (issue 22).
static inline int kdrt_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
template <int W> __device__ inline void kdrt_ld(float *v, const float *p) {
  if constexpr (W == 4) {
    float4 q = *(const float4 *)p;
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int k = 0; k < W; k++) v[k] = p[k];
  }
}
template <int W> __device__ inline void kdrt_st(float *p, const float *v) {
  if constexpr (W == 4) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int k = 0; k < W; k++) p[k] = v[k];
  }
}
// out[r, j] = f(in[r, j], vec[j]) over n = rows * cols floats, W at a time
// (cw = cols / W groups a row; with W 4 cols % 4 == 0 and the buffers
// 16-byte aligned): a grid-stride loop that keeps its column by steps, not a
// 64-bit division an element (bias_act's bias, col_mul's scale).
template <int W, typename F>
__device__ inline void kdrt_col_map(float *out, const float *in, const float *vec, size_t n,
                                    size_t cw, F f) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  size_t j = i % cw, step = stride % cw; // the column (in groups of W) of group i
  for (; i < n / W; i += stride) {
    float v[W], c[W];
    kdrt_ld<W>(v, in + i * W);
    kdrt_ld<W>(c, vec + j * W);
#pragma unroll
    for (int k = 0; k < W; k++) v[k] = f(v[k], c[k]);
    kdrt_st<W>(out + i * W, v);
    j += step;
    if (j >= cw) j -= cw;
  }
}
#define KDRT_FOR_TAIL(i, n, W)                                                                   \
  for (size_t i = (size_t)(n) / (W) * (W) + (size_t)blockIdx.x * blockDim.x + threadIdx.x;     \
       i < (size_t)(n); i += (size_t)gridDim.x * blockDim.x)

// Column sums over many rows (norm.cu's col_sums2; bias.cu has its own)
// take blocks of 32 columns; when those are too few to fill the GPU (264:
// two blocks for each of an H100's 132 multiprocessors), the rows are cut
// into at most `most` chunks of at least 256 rows, whose sums a second
// kernel adds in chunk order. Returns the chunks; *chunk: the rows of each
// (at least 1).
static inline int64_t kdrt_row_chunks(int64_t rows, int64_t cols, int64_t most,
                                      int64_t *chunk) {
  int64_t cblocks = (cols + 31) / 32, n = (264 + cblocks - 1) / cblocks;
  int64_t fit = (rows + 255) / 256;
  if (n > fit) n = fit;
  if (n > most) n = most;
  if (n < 1) n = 1;
  *chunk = (rows + n - 1) / n;
  if (*chunk < 1) *chunk = 1;
  return n;
}

// Threads for one block per row of `cols`: a power of two in [32, 256].
static inline unsigned kdrt_row_threads(int64_t cols) {
  unsigned t = 32;
  while (t < 256 && (int64_t)t < cols) t *= 2;
  return t;
}
// A kernel of one block per row takes at most 2^31-1 rows (what: the kernel).
void kdrt_cuda_check_rows(int64_t rows, const char *what);
// out[0] = (float)(the sum of rowv[0, rows) * scale): one block, in a fixed
// order (the losses' and accuracies' per-row values; loss.cu).
// kdcc --sample-weight: rowv[r] *= w[r] (loss.cu).
void kdrt_cuda_weigh_rows(kdrt_cuda *d, double *rowv, const float *w, int64_t rows);
void kdrt_cuda_sum_rows(kdrt_cuda *d, float *out, const double *rowv, int64_t rows,
                        double scale);

// ---------------------------------------------------------------- activations
// act(v), kdrt_defs.h's KDRT_ACT_LIST expanded as the CPU kernels expand it
// (an unknown act leaves v: the launchers check it first).
__device__ inline float kdrt_act1(int act, float v) {
  float r = v;
  switch (act) {
#define KDRT_X(name, kname, from_x, f, df) case KDRT_ACT_##name: r = f; break;
    KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
  }
  return r;
}

// ---------------------------------------------------------------- reductions
// Over the whole block (blockDim.x a power of two <= 1024, a multiple of
// 32); every thread gets the result. shm: blockDim.x / 32 slots.
template <typename T> struct kdrt_sum_op {
  __device__ static T apply(T a, T b) { return a + b; }
};
template <typename T> struct kdrt_max_op {
  __device__ static T apply(T a, T b) { return b > a ? b : a; }
};

// Over the warp, in a fixed butterfly order; every lane gets the result.
template <typename Op, typename T> __device__ inline T kdrt_warp_reduce(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename Op, typename T> __device__ inline T kdrt_block_reduce(T v, T *shm) {
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  __syncthreads(); // shm may still be read from a previous reduction
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  v = shm[0];
  for (int w = 1; w < nwarps; w++) v = Op::apply(v, shm[w]);
  return v;
}

// The first maximum: the larger value, on a tie the smaller index.
__device__ inline void kdrt_argmax_merge(float &v, int64_t &i, float v2, int64_t i2) {
  if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

#endif
