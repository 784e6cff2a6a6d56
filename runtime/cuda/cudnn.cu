// cudnn.cu (issue 22): Conv2D's three passes (and so Conv1D's, grouped and
// depthwise convs': they lower to it) through cuDNN's convolutions, in
// place of conv2d.cu's im2col, GEMM and col2im. Opt-in until a GPU run
// proves it: KDRT_CUDA_CUDNN=1 or =conv (cudnn_attn.h), read when the
// device opens (session.cu); unset, conv2d.cu runs as before. libcudnn is
// opened (dlopen) only then, so a program that does not opt in needs no
// cuDNN to start.
//
// Layouts. x [B, H, W, C] and y [B, OH, OW, K] are cuDNN's NHWC as they
// are. The filter is Keras's [KH, KW, cg, K] (HWIO); cuDNN's NHWC filter
// is [K, KH, KW, cg] (KRSC), so forward and backward-data transpose it into
// scratch first, and backward-filter makes KRSC in scratch and transposes
// it into dw: KH*KW*cg*K floats, small beside the activations.
//
// Padding. cuDNN pads both sides alike; 'same' with an odd total puts the
// extra row (column) at the bottom (right), as Keras does (the examples'
// stride-2 3x3 conv, 14 -> 7: 0 above, 1 below). Such a conv pads x into
// scratch, [B, Hp, Wp, C] (the rows and columns its windows span:
// kdrt_conv_even_pad in ../kdrt_ops.h), and convolves that unpadded;
// backward-data makes the padded gradient and crops it (a row no window
// read gets 0).
//
// Algorithms: cuDNN's heuristics (cudnnGet*Algorithm_v7: no trial runs, so
// every run picks the same), the first that is deterministic
// (CUDNN_DETERMINISTIC: not BWD_DATA_ALGO_0 or BWD_FILTER_ALGO_0 / 3,
// which add with atomics) and fits WS_CAP of workspace, once per shape and
// pass (a cache for the process). Math: fp32 is CUDNN_FMA_MATH (float
// products and sums; CUDNN_DEFAULT_MATH would allow TF32); tf32 and bf16
// are CUDNN_TENSOR_OP_MATH on the float data, i.e. TF32 (bf16 does not
// round the operands to bfloat16 as matmul.cu's products do).
//
// Memory: the workspace, the KRSC filter and the padded tensor share
// device scratch 7, which grows in the first run of a step; a step is
// captured as a CUDA graph only after one uncaptured run of its rows
// (device.cu), so a replay allocates nothing and the cached descriptors
// and algorithms hold. A conv that cuDNN does not take (pointwise: one GEMM
// already; an empty one; no deterministic algorithm; more than 2^31
// elements) returns 0 and keeps conv2d.cu's kernels.
#include <cudnn.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "common.cuh"

// The entries used, resolved from libcudnn.so.9 by name (decltype: the
// header's own prototypes, so a mismatch does not compile).
#define KDRT_CUDNN_FNS(X)                                                                        \
  X(cudnnGetVersion)                                                                             \
  X(cudnnGetErrorString)                                                                         \
  X(cudnnCreate)                                                                                 \
  X(cudnnDestroy)                                                                                \
  X(cudnnSetStream)                                                                              \
  X(cudnnCreateTensorDescriptor)                                                                 \
  X(cudnnSetTensor4dDescriptor)                                                                  \
  X(cudnnDestroyTensorDescriptor)                                                                \
  X(cudnnCreateFilterDescriptor)                                                                 \
  X(cudnnSetFilter4dDescriptor)                                                                  \
  X(cudnnDestroyFilterDescriptor)                                                                \
  X(cudnnCreateConvolutionDescriptor)                                                            \
  X(cudnnSetConvolution2dDescriptor)                                                             \
  X(cudnnSetConvolutionGroupCount)                                                               \
  X(cudnnSetConvolutionMathType)                                                                 \
  X(cudnnDestroyConvolutionDescriptor)                                                           \
  X(cudnnGetConvolutionForwardAlgorithm_v7)                                                      \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                                                 \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)                                               \
  X(cudnnGetConvolutionForwardWorkspaceSize)                                                     \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)                                                \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize)                                              \
  X(cudnnConvolutionForward)                                                                     \
  X(cudnnConvolutionBackwardData)                                                                \
  X(cudnnConvolutionBackwardFilter)

static struct {
#define KDRT_X(f) decltype(&::f) f;
  KDRT_CUDNN_FNS(KDRT_X)
#undef KDRT_X
} dn;
static int loaded; // 1: dn filled; -1: the load failed (load_why says why)
static char load_why[512];
static void *cudnn_lib; // (cudnn_attn.cu's frontend calls through it too)

#define CUDNN_CHECK(call)                                                                        \
  KDRT_GPU_CHECK(call, cudnnStatus_t, CUDNN_STATUS_SUCCESS, dn.cudnnGetErrorString)

// libcudnn.so.9 (cuDNN 9: the API these prototypes are) and its entries.
static int load(void) {
  if (loaded) return loaded > 0;
  loaded = -1;
  void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(load_why, sizeof load_why, "%s", dlerror());
    return 0;
  }
#define KDRT_X(f)                                                                                \
  if (!(*(void **)&dn.f = dlsym(lib, #f))) {                                                     \
    snprintf(load_why, sizeof load_why, "libcudnn.so.9 has no %s", #f);                          \
    return 0;                                                                                    \
  }
  KDRT_CUDNN_FNS(KDRT_X)
#undef KDRT_X
  if (dn.cudnnGetVersion() / 10000 != CUDNN_MAJOR) {
    snprintf(load_why, sizeof load_why, "libcudnn.so.9 is version %zu, not %d.x",
             dn.cudnnGetVersion(), CUDNN_MAJOR);
    return 0;
  }
  loaded = 1;
  cudnn_lib = lib;
  return 1;
}

int kdrt_cudnn_available(char *why, size_t n) {
  int ok = load();
  if (!ok && why) snprintf(why, n, "%s", load_why);
  return ok;
}

void *kdrt_cudnn_lib(char *why, size_t n) {
  return kdrt_cudnn_available(why, n) ? cudnn_lib : NULL;
}

// A conv's descriptors and per pass (KDRT_CONV_*) its algorithm (-1: not
// chosen yet, -2: none fits) and workspace bytes.
typedef struct {
  kdrt_window w;
  int precision;
  int padded, Hp, Wp; // x padded into scratch: its rows and columns
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t f;
  cudnnConvolutionDescriptor_t conv;
  int algo[3];
  size_t ws[3];
} conv_shape;

enum { MAX_SHAPES = 256 };
static conv_shape shapes[MAX_SHAPES];
static int nshapes;
static cudnnHandle_t handle;
static const size_t WS_CAP = (size_t)64 << 20; // the most workspace an algorithm may take

void kdrt_cudnn_free(void) {
  for (int i = 0; i < nshapes; i++) {
    CUDNN_CHECK(dn.cudnnDestroyTensorDescriptor(shapes[i].x));
    CUDNN_CHECK(dn.cudnnDestroyTensorDescriptor(shapes[i].y));
    CUDNN_CHECK(dn.cudnnDestroyFilterDescriptor(shapes[i].f));
    CUDNN_CHECK(dn.cudnnDestroyConvolutionDescriptor(shapes[i].conv));
  }
  nshapes = 0;
  if (handle) CUDNN_CHECK(dn.cudnnDestroy(handle));
  handle = NULL;
}

// The handle, on the runtime's stream; made (and cuDNN loaded) on first
// use, which is a step's first, uncaptured run.
static cudnnHandle_t get_handle(kdrt_cuda *d) {
  if (handle) return handle;
  if (!load())
    kdrt_cuda_fail("dlopen(\"libcudnn.so.9\") (KDRT_CUDA_CUDNN=1: put cuDNN 9's lib folder on "
                   "LD_LIBRARY_PATH, or unset KDRT_CUDA_CUDNN)", __FILE__, __LINE__, load_why);
  CUDNN_CHECK(dn.cudnnCreate(&handle));
  CUDNN_CHECK(dn.cudnnSetStream(handle, d->impl->stream));
  if (!d->c || d->c->rank == 0)
    fprintf(stderr, "kdrt-cuda: KDRT_CUDA_CUDNN=1: convolutions through cuDNN %zu\n",
            dn.cudnnGetVersion());
  return handle;
}

// w's entry, its descriptors made on first sight; NULL when cuDNN does not
// take it (see the top).
static conv_shape *shape_of(kdrt_cuda *d, const kdrt_window *w) {
  for (int i = 0; i < nshapes; i++)
    if (!memcmp(&shapes[i].w, w, sizeof *w) && shapes[i].precision == d->precision)
      return &shapes[i];
  const int G = kdrt_groups(w), cg = w->C / G;
  int Hp, Wp;
  const int same = kdrt_conv_even_pad(w, &Hp, &Wp); // cuDNN's own padding will do
  const int64_t xn = (int64_t)w->B * (same ? w->H * w->W : Hp * Wp) * w->C;
  if (nshapes == MAX_SHAPES || kdrt_conv_pointwise(w) || w->B < 1 || w->C < 1 || w->K < 1 ||
      w->OH < 1 || w->OW < 1 ||
      xn >= ((int64_t)1 << 31) || (int64_t)w->B * w->OH * w->OW * w->K >= ((int64_t)1 << 31))
    return NULL;
  get_handle(d);
  conv_shape *s = &shapes[nshapes++];
  memset(s, 0, sizeof *s);
  s->w = *w, s->precision = d->precision;
  s->padded = !same, s->Hp = same ? w->H : Hp, s->Wp = same ? w->W : Wp;
  CUDNN_CHECK(dn.cudnnCreateTensorDescriptor(&s->x));
  CUDNN_CHECK(dn.cudnnCreateTensorDescriptor(&s->y));
  CUDNN_CHECK(dn.cudnnCreateFilterDescriptor(&s->f));
  CUDNN_CHECK(dn.cudnnCreateConvolutionDescriptor(&s->conv));
  CUDNN_CHECK(dn.cudnnSetTensor4dDescriptor(s->x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, w->B, w->C,
                                            s->Hp, s->Wp));
  CUDNN_CHECK(dn.cudnnSetTensor4dDescriptor(s->y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, w->B, w->K,
                                            w->OH, w->OW));
  CUDNN_CHECK(dn.cudnnSetFilter4dDescriptor(s->f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, w->K, cg,
                                            w->KH, w->KW));
  CUDNN_CHECK(dn.cudnnSetConvolution2dDescriptor(s->conv, same ? w->pad_t : 0,
                                                 same ? w->pad_l : 0, w->sh, w->sw, w->dil_h + 1,
                                                 w->dil_w + 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT));
  CUDNN_CHECK(dn.cudnnSetConvolutionGroupCount(s->conv, G));
  CUDNN_CHECK(dn.cudnnSetConvolutionMathType(
      s->conv, d->precision == KDRT_PREC_FP32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  s->algo[0] = s->algo[1] = s->algo[2] = -1;
  return s;
}

// The first of cuDNN's ranked algorithms r[0, n) that is deterministic,
// within the precision's math and within WS_CAP of workspace (ws(algo,
// &bytes) asks cuDNN, which also refuses what this shape cannot run);
// -2 when none is.
template <typename Perf, typename Ws>
static int pick(const Perf *r, int n, int precision, size_t *bytes, Ws ws) {
  for (int i = 0; i < n; i++) {
    size_t b = 0;
    if (r[i].status != CUDNN_STATUS_SUCCESS || r[i].determinism != CUDNN_DETERMINISTIC ||
        r[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ||
        (precision == KDRT_PREC_FP32 && r[i].mathType == CUDNN_TENSOR_OP_MATH))
      continue;
    if (ws(r[i].algo, &b) != CUDNN_STATUS_SUCCESS || b > WS_CAP) continue;
    *bytes = b;
    return (int)r[i].algo;
  }
  return -2;
}

// s's algorithm for pass p, chosen on first use: 0 when none fits.
static int choose(conv_shape *s, int p) {
  if (s->algo[p] != -1) return s->algo[p] >= 0;
  int n = 0;
  size_t *b = &s->ws[p];
  if (p == KDRT_CONV_Y) {
    cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDNN_CHECK(dn.cudnnGetConvolutionForwardAlgorithm_v7(handle, s->x, s->f, s->conv, s->y,
                                                          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, r));
    s->algo[p] = pick(r, n, s->precision, b, [&](cudnnConvolutionFwdAlgo_t a, size_t *sz) {
      return dn.cudnnGetConvolutionForwardWorkspaceSize(handle, s->x, s->f, s->conv, s->y, a, sz);
    });
  } else if (p == KDRT_CONV_DX) {
    cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDNN_CHECK(dn.cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, s->f, s->y, s->conv, s->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, r));
    s->algo[p] = pick(r, n, s->precision, b, [&](cudnnConvolutionBwdDataAlgo_t a, size_t *sz) {
      return dn.cudnnGetConvolutionBackwardDataWorkspaceSize(handle, s->f, s->y, s->conv, s->x, a,
                                                             sz);
    });
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_CHECK(dn.cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle, s->x, s->y, s->conv, s->f, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, r));
    s->algo[p] = pick(r, n, s->precision, b, [&](cudnnConvolutionBwdFilterAlgo_t a, size_t *sz) {
      return dn.cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, s->x, s->y, s->conv, s->f,
                                                               a, sz);
    });
  }
  return s->algo[p] >= 0;
}

// dst [B, Hd, Wd, C][b, i, j, c] = src [B, Hs, Ws, C][b, i - oh, j - ow, c],
// 0 outside src: x into its padded copy (oh, ow: the padding above and to
// the left), and the padded gradient back (-oh, -ow).
__global__ static void shift_kernel(float *dst, const float *src, int B, int Hd, int Wd, int Hs,
                                    int Ws, int C, int oh, int ow) {
  size_t n = (size_t)B * Hd * Wd * C;
  KDRT_FOR(e, n) {
    int c = (int)(e % C), j = (int)(e / C % Wd), i = (int)(e / ((size_t)C * Wd) % Hd);
    int b = (int)(e / ((size_t)C * Wd * Hd)), si = i - oh, sj = j - ow;
    dst[e] = si >= 0 && si < Hs && sj >= 0 && sj < Ws
                 ? src[(((size_t)b * Hs + si) * Ws + sj) * C + c]
                 : 0.0f;
  }
}

static void shift(kdrt_cuda *d, float *dst, const float *src, int B, int Hd, int Wd, int Hs,
                  int Ws, int C, int oh, int ow) {
  size_t n = (size_t)B * Hd * Wd * C;
  if (!n) return;
  shift_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(dst, src, B, Hd, Wd, Hs, Ws,
                                                                     C, oh, ow);
  KDRT_LAUNCHED(d, "shift_kernel (cuDNN's padding)");
}

// [rows, cols] -> [cols, rows]: the filter between HWIO and KRSC.
static void transpose2(kdrt_cuda *d, float *out, const float *in, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  const int perm[2] = {1, 0};
  kdrt_cuda_transpose(d, out, in, 2, shape, perm);
}

int kdrt_cudnn_conv(kdrt_cuda *d, int pass, const kdrt_window *w, float *out, const float *a,
                    const float *b) {
  if (!(d->impl->cudnn & KDRT_CUDNN_CONV)) return 0;
  conv_shape *s = shape_of(d, w);
  if (!s || !choose(s, pass)) return 0;
  const int64_t rsc = (int64_t)w->KH * w->KW * (w->C / kdrt_groups(w)); // a filter's rows (HWIO)
  const size_t nf = (size_t)rsc * w->K, np = s->padded ? (size_t)w->B * s->Hp * s->Wp * w->C : 0;
  // scratch 7: the workspace, then the KRSC filter, then the padded x (or dx)
  const size_t off_f = kdrt_round256(s->ws[pass]);
  const size_t off_p = off_f + kdrt_round256(nf * sizeof(float));
  char *sc = (char *)kdrt_cuda_dscratch(d, 7, off_p + np * sizeof(float));
  float *fk = (float *)(sc + off_f), *xp = (float *)(sc + off_p);
  const float one = 1.0f, zero = 0.0f;
  if (pass != KDRT_CONV_DW) transpose2(d, fk, b, rsc, w->K);
  if (pass != KDRT_CONV_DX && s->padded) {
    shift(d, xp, a, w->B, s->Hp, s->Wp, w->H, w->W, w->C, w->pad_t, w->pad_l);
    a = xp;
  }
  cudnnStatus_t st;
  if (pass == KDRT_CONV_Y) {
    st = dn.cudnnConvolutionForward(handle, &one, s->x, a, s->f, fk, s->conv,
                                    (cudnnConvolutionFwdAlgo_t)s->algo[pass], sc, s->ws[pass],
                                    &zero, s->y, out);
  } else if (pass == KDRT_CONV_DX) {
    st = dn.cudnnConvolutionBackwardData(handle, &one, s->f, fk, s->y, a, s->conv,
                                         (cudnnConvolutionBwdDataAlgo_t)s->algo[pass], sc,
                                         s->ws[pass], &zero, s->x, s->padded ? xp : out);
  } else {
    st = dn.cudnnConvolutionBackwardFilter(handle, &one, s->x, a, s->y, b, s->conv,
                                           (cudnnConvolutionBwdFilterAlgo_t)s->algo[pass], sc,
                                           s->ws[pass], &zero, s->f, fk);
  }
  // An algorithm the heuristics offered that will not run after all (an
  // operand's alignment, say): said once, and this pass keeps conv2d.cu's
  // kernels from here on (they write everything it would have).
  if (st != CUDNN_STATUS_SUCCESS) {
    if (d->impl->capturing) CUDNN_CHECK(st); // (the capture fails; the step runs again)
    fprintf(stderr, "kdrt-cuda: cuDNN's %s of a conv [%d, %d, %d, %d] -> [%d, %d, %d, %d] "
            "failed (%s); kdcc's kernels do it instead\n",
            pass == KDRT_CONV_Y ? "forward" : pass == KDRT_CONV_DX ? "backward-data"
                                                                : "backward-filter",
            w->B, w->H, w->W, w->C, w->B, w->OH, w->OW, w->K, dn.cudnnGetErrorString(st));
    s->algo[pass] = -2;
    (void)cudaGetLastError(); // nothing of it ran
    return 0;
  }
  if (s->padded && pass == KDRT_CONV_DX)
    shift(d, out, xp, w->B, w->H, w->W, s->Hp, s->Wp, w->C, -w->pad_t, -w->pad_l);
  if (pass == KDRT_CONV_DW) transpose2(d, out, fk, w->K, rsc);
  if (d->impl->sync_each) KDRT_LAUNCHED(d, "cuDNN's convolution");
  return 1;
}
