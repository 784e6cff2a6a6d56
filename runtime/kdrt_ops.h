// kdrt_ops.h: what the kernels of kdrt_ops.def's list share, for both
// runtimes: the descriptors they take (kdrt_layout, kdrt_gemm,
// kdrt_window) and the arithmetic both backends do alike. Every kernel a
// generated step calls is a K or KC line of kdrt_ops.def, beside its op:
// the CPU runtime defines kdrt_<name>(args) (kdrt_<name>(c, args) for the
// KC entries, which need the rank's context); the CUDA runtime defines
// kdrt_cuda_<name>(d, args) with the very same args. Both headers expand
// that one list, so the two backends cannot drift apart, and kdcc writes
// one call per op that differs between them only in that prefix.
//
// Conventions: float32 row-major local blocks; integer ids are int32;
// shapes are local (this rank's block); the output never aliases an input
// unless said so. Semantics of each entry: runtime/*.c (CPU, the
// reference: the kernels are ops.c's, loss.c's, optim.c's and norm.c's,
// the layers' layers.c's...) and runtime/cuda/*.cu.
#ifndef KDRT_OPS_H
#define KDRT_OPS_H

#include <math.h> // INFINITY: kdrt_pact without a max
#include <stddef.h>
#include <stdint.h>

#include "kdrt_defs.h"
#include "kdrt_rope.h"

#define KDRT_MAX_RANK 6
// A masked attention score: exp of it (less the row's max) is exactly 0, as
// with JAX's dot_product_attention (-0.7 times the largest float).
#define KDRT_MASKED (-0.7f * 3.40282347e+38f)
#define KDRT_MAX_AXES 4

// Adam's step size at step t (from 1), in double as Keras forms it:
// lr * sqrt(1 - b2^t) / (1 - b1^t). The CPU's adam and the CUDA one (on
// the host for a launch, on the device inside a CUDA graph) share it.
static inline KDRT_HD float kdrt_adam_alpha(float lr, float b1, float b2, double t) {
  return (float)(lr * sqrt(1.0 - pow((double)b2, t)) / (1.0 - pow((double)b1, t)));
}

// SCALE's element: x * scale + shift, where a scale of 0 is the constant
// shift even for an infinite or NaN x (autodiff.c seeds d(total)/d(penalty)
// as penalty * 0 + 1: a 16-bit penalty that overflows is Keras's inf loss,
// not NaN gradients). Finite x: the same bits as x * scale + shift.
static inline KDRT_HD float kdrt_scale1(float x, float scale, float shift) {
  return scale == 0 ? shift : x * scale + shift;
}

// Whether causal attention masks key position k for query position q: a
// key after its query, or (window > 0: sliding-window attention) one
// window or more steps before it. The causal mask's CPU and CUDA kernels.
static inline KDRT_HD int kdrt_key_masked(int64_t q, int64_t k, int64_t window) {
  return k > q || (window > 0 && q - k >= window);
}

// How many of attention's u keys query position q reads: with causal only
// those up to it (the others' probabilities are 0). The attention
// softmax's CPU and CUDA kernels.
static inline KDRT_HD int64_t kdrt_attn_keys(int64_t q, int64_t u, int causal) {
  return causal && q + 1 < u ? q + 1 : u;
}

typedef struct {
  int rank;                      // number of dimensions
  int64_t gshape[KDRT_MAX_RANK]; // global shape
  int8_t axis[KDRT_MAX_RANK];    // mesh axis per dim, -1 = replicated
} kdrt_layout;

// A batch of row-major matrix products: for i < batch,
//   c_i = alpha * op(a_i) @ op(b_i) + beta * c_i,   c_i is [M, N]
// with a_i = a + i * stride_a (likewise b, c); op = transpose when ta / tb
// is KDRT_TRANS; lda, ldb, ldc the row lengths as stored (cblas's meaning).
// stride 0 reuses one operand for every i (a weight).
typedef struct {
  int ta, tb;
  int64_t batch, M, N, K;
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
} kdrt_gemm;

// issue 23: the elements an operand of `rows` x `cols` stored (leading
// dimension ld), `batch` of them `stride` apart, spans; and the floats of
// the buffer (widen) kdrt_matmul16 takes for g's operands held as fa, fb
// (KDRT_OPND_*): each one not float32 values of the type widened to
// float32 (float16, a CPU without bfloat16 instructions, KDRT_GEMM16=0),
// whose 16-bit copy (oneDNN's bfloat16 path) takes half of that; a float32
// one rounded to its 16 bits (the same path). Each part a whole number of
// 16-float runs. The memory plan sizes the program's buffer by it
// (compiler/memplan.c's widen_floats).
static inline int64_t kdrt_operand_span(int64_t batch, int64_t stride, int64_t rows,
                                        int64_t cols, int64_t ld) {
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}
static inline int64_t kdrt_matmul16_part(int64_t n, int form) { // floats for one operand
  return ((form == KDRT_OPND_EXACT ? (n + 1) / 2 : n) + 15) / 16 * 16;
}
static inline int64_t kdrt_matmul16_na(const kdrt_gemm *g) {
  return kdrt_operand_span(g->batch, g->stride_a, g->ta ? g->K : g->M, g->ta ? g->M : g->K,
                           g->lda);
}
static inline int64_t kdrt_matmul16_nb(const kdrt_gemm *g) {
  return kdrt_operand_span(g->batch, g->stride_b, g->tb ? g->N : g->K, g->tb ? g->K : g->N,
                           g->ldb);
}
static inline int64_t kdrt_matmul16_scratch(const kdrt_gemm *g, int fa, int fb) {
  if (g->M <= 0 || g->N <= 0 || g->batch <= 0) return 0;
  return kdrt_matmul16_part(kdrt_matmul16_na(g), fa) + kdrt_matmul16_part(kdrt_matmul16_nb(g), fb);
}

// A 2-D window op over channels-last [B, H, W, C] inputs: conv2d (filter
// [KH, KW, C, K], output [B, OH, OW, K]) and max pooling (K = C). pad_t,
// pad_l: the zero (or, pooling, never winning) padding before row 0 and
// column 0. dil_h, dil_w (issue 11, conv2d only): the kernel's dilation
// minus 1, oneDNN's convention, so that a zeroed field is no dilation:
// kernel row kh reads input row oh * sh - pad_t + kh * (dil_h + 1).
// groups (issue 15, conv2d only; 0 or 1: none): G groups, C = G * cg,
// K = G * kg, the filter [KH, KW, cg, K] (Keras's grouped kernel), group j
// convolving input channels [j * cg, (j + 1) * cg) into output channels
// [j * kg, (j + 1) * kg).
typedef struct {
  int B, H, W, C;
  int KH, KW, K;
  int sh, sw, pad_t, pad_l;
  int OH, OW;
  int dil_h, dil_w;
  int groups;
} kdrt_window;

static inline int kdrt_groups(const kdrt_window *w) { return w->groups > 1 ? w->groups : 1; }

// ---- window arithmetic, one dimension at a time (rows: o, s, pad, the
// window P or kernel K, the input's n; columns alike), for both runtimes.
// Output o's window starts at input i0 = o * s - pad; of its P positions,
// [*lo, *hi) fall inside [0, n) (empty, *lo == *hi, when none does): max
// pooling's windows (padding never wins) and an undilated conv's kernel
// columns.
static inline KDRT_HD void kdrt_win_range(int o, int s, int pad, int P, int n, int *i0, int *lo,
                                          int *hi) {
  *i0 = o * s - pad;
  *lo = *i0 < 0 ? -*i0 : 0;
  *hi = n - *i0 < P ? n - *i0 : P;
  if (*hi < *lo)
    *hi = *lo;
}
// The outputs [*olo, *ohi] (inclusive; none when *olo > *ohi) of nout whose
// windows of P hold input i: o * s - pad <= i < o * s - pad + P. The
// gradient of max pooling as a gather (CUDA), kdrt_win_range's inverse.
static inline KDRT_HD void kdrt_win_outs(int i, int s, int pad, int P, int nout, int *olo,
                                         int *ohi) {
  int lo = i + pad - P + 1;
  *olo = lo <= 0 ? 0 : (lo + s - 1) / s;
  *ohi = (i + pad) / s;
  if (*ohi > nout - 1)
    *ohi = nout - 1;
}
// The input that kernel position k of output o reads, o * s - pad + k *
// step (step: the dilation, 1 for none), or -1 in the padding.
static inline KDRT_HD int kdrt_conv_at(int o, int k, int s, int pad, int step, int n) {
  int i = o * s - pad + k * step;
  return i >= 0 && i < n ? i : -1;
}
// The output whose kernel position k reads input i (kdrt_conv_at's
// inverse), or -1 when none does: col2im as a gather (CUDA).
static inline KDRT_HD int kdrt_conv_from(int i, int k, int s, int pad, int step, int nout) {
  int t = i + pad - k * step;
  if (t < 0 || t % s)
    return -1;
  return t / s < nout ? t / s : -1;
}

// Is this conv a plain matmul over [B*H*W, C] (1x1, stride 1, no padding)?
static inline int kdrt_conv_pointwise(const kdrt_window *w) {
  return w->KH == 1 && w->KW == 1 && w->sh == 1 && w->sw == 1 && w->pad_t == 0 &&
         w->pad_l == 0 && w->OH == w->H && w->OW == w->W;
}

// issue 22: cuDNN (runtime/cuda/cudnn.cu) pads both sides alike. Whether
// pad_t above and below, pad_l left and right, give w's OH and OW (the
// same windows: a row past the input reads 0 either way); if not ('same'
// with an odd total, whose extra row Keras puts below), cudnn.cu convolves
// x padded explicitly to *Hp rows, *Wp columns (those w's windows span, x
// at pad_t, pad_l), unpadded. tests/test_rt_ops.c checks both views.
static inline int kdrt_conv_even_pad(const kdrt_window *w, int *Hp, int *Wp) {
  const int eh = (w->KH - 1) * (w->dil_h + 1) + 1, ew = (w->KW - 1) * (w->dil_w + 1) + 1;
  *Hp = (w->OH - 1) * w->sh + eh;
  *Wp = (w->OW - 1) * w->sw + ew;
  return w->H + 2 * w->pad_t >= eh && (w->H + 2 * w->pad_t - eh) / w->sh + 1 == w->OH &&
         w->W + 2 * w->pad_l >= ew && (w->W + 2 * w->pad_l - ew) / w->sw + 1 == w->OW;
}

// A conv as G products, one per group (a strided batch, both runtimes): the
// im2col matrices [G][M, KC], M = B*OH*OW, KC = KH*KW*cg (for a pointwise
// conv x itself, group j its columns j*cg..), and dy, y and the filter
// [KC, K], group j their columns j*kg..
typedef struct {
  int64_t M, KC, kg, G;
  int64_t ldcols, gcols; // cols: its row length, the step from one group to the next
} kdrt_conv_mats;

static inline kdrt_conv_mats kdrt_conv_dims(const kdrt_window *w) {
  const int G = kdrt_groups(w), cg = w->C / G, pw = kdrt_conv_pointwise(w);
  const int64_t M = (int64_t)w->B * w->OH * w->OW, KC = (int64_t)w->KH * w->KW * cg;
  kdrt_conv_mats m = {M, KC, w->K / G, G, pw ? w->C : KC, pw ? cg : M * KC};
  return m;
}

// The product each pass of a conv makes over those matrices, group j by
// group (both runtimes): KDRT_CONV_Y, y_j = cols_j @ f_j; KDRT_CONV_DX,
// dcols_j = dy_j @ f_j^T (into dx itself for a pointwise conv, else the
// scratch that col2im reads back); KDRT_CONV_DW, dw_j = cols_j^T @ dy_j.
enum { KDRT_CONV_Y, KDRT_CONV_DX, KDRT_CONV_DW };
static inline kdrt_gemm kdrt_conv_gemm(const kdrt_window *w, int pass) {
  const kdrt_conv_mats m = kdrt_conv_dims(w);
  const kdrt_gemm y = {KDRT_NOTRANS, KDRT_NOTRANS, m.G, m.M, m.kg, m.KC, m.ldcols, w->K, w->K,
                       m.gcols, m.kg, m.kg};
  const kdrt_gemm dx = {KDRT_NOTRANS, KDRT_TRANS, m.G, m.M, m.KC, m.kg, w->K, w->K, m.ldcols,
                        m.kg, m.kg, m.gcols};
  const kdrt_gemm dw = {KDRT_TRANS, KDRT_NOTRANS, m.G, m.KC, m.kg, m.M, m.ldcols, w->K, w->K,
                        m.gcols, m.kg, m.kg};
  return pass == KDRT_CONV_Y ? y : pass == KDRT_CONV_DX ? dx : dw;
}

// issue 23: the scratch of a 16-bit conv (conv2d16, both runtimes), in
// floats: each part a whole number of 16-float runs a batch row, so that
// the memory plan's k floats a row (compiler/memplan.c) give it at any
// batch. part[] gets each part's start, -1 for none: the 16-bit copy of an
// _EXACT x (Y, DW: 16-bit columns are copied from it) and of an _EXACT dy
// (DW, DX); the 16-bit im2col columns (Y, DW; none pointwise); DX's float32
// columns of one chunk of rows (none pointwise): its sums stay float32,
// KDRT_CONV16_CHUNKS chunks of B * ceil(OH*OW / chunks) rows at most, so
// that they take a fraction of the whole. Returns the total.
enum { KDRT_CONV16_CHUNKS = 4 };
enum { KDRT_C16_X, KDRT_C16_DY, KDRT_C16_COLS, KDRT_C16_DCOLS, KDRT_C16_PARTS };
static inline int64_t kdrt_conv16_rows(const kdrt_window *w) { // DX's rows a chunk
  return (int64_t)w->B * (((int64_t)w->OH * w->OW + KDRT_CONV16_CHUNKS - 1) / KDRT_CONV16_CHUNKS);
}
// DX's chunk from row m0 (0 first; then the *m1 before, while it is short of
// B*OH*OW): its rows [m0, *m1) and their product dcols = dy[m0..] f^T (the
// columns group by group); 0 when m0 is past the last (one chunk, empty,
// when there are no rows: dx zeroed).
static inline int kdrt_conv16_chunk(const kdrt_window *w, int64_t m0, int64_t *m1, kdrt_gemm *g) {
  const int64_t M = (int64_t)w->B * w->OH * w->OW, rows = kdrt_conv16_rows(w);
  if (m0 > 0 && m0 >= M) return 0;
  *m1 = m0 + rows < M ? m0 + rows : M;
  *g = kdrt_conv_gemm(w, KDRT_CONV_DX);
  g->M = *m1 - m0;
  g->stride_c = g->M * kdrt_conv_dims(w).KC;
  return rows > 0 || m0 == 0;
}
static inline int64_t kdrt_conv16_scratch(const kdrt_window *w, int pass, int fa, int fb,
                                          int64_t part[KDRT_C16_PARTS]) {
  const int64_t px = (int64_t)w->OH * w->OW, R = (int64_t)w->KH * w->KW * w->C;
  const int pw = kdrt_conv_pointwise(w), dx = pass == KDRT_CONV_DX;
  const int fdy = pass == KDRT_CONV_DW ? fb : dx ? fa : KDRT_OPND_16;
  // each part's 16-bit values (dcols: floats) a batch row, 0: none
  const int64_t row[KDRT_C16_PARTS] = {
      !dx && fa == KDRT_OPND_EXACT ? (int64_t)w->H * w->W * w->C : 0,
      fdy == KDRT_OPND_EXACT ? px * w->K : 0, !dx && !pw ? px * R : 0,
      dx && !pw ? (px + KDRT_CONV16_CHUNKS - 1) / KDRT_CONV16_CHUNKS * R : 0};
  int64_t at = 0;
  for (int i = 0; i < KDRT_C16_PARTS; i++) {
    part[i] = row[i] ? at : -1;
    const int64_t floats = i == KDRT_C16_DCOLS ? row[i] : (row[i] + 1) / 2;
    at += (int64_t)w->B * ((floats + 15) / 16 * 16);
  }
  return at;
}
// issue 23: the floats of the buffer (widen) the CPU's conv2d16 gives its
// matmul16 calls (kdrt_matmul16_scratch: the operands widened where the
// CPU has no bfloat16 product; the CUDA runtime's need none): the largest
// call's, DX's first chunk; a is in its 16 bits, fb says how b is held.
static inline int64_t kdrt_conv16_widen(const kdrt_window *w, int pass, int fb) {
  kdrt_gemm g = kdrt_conv_gemm(w, pass);
  int64_t m1;
  if (pass == KDRT_CONV_DX && !kdrt_conv_pointwise(w) && !kdrt_conv16_chunk(w, 0, &m1, &g))
    return 0;
  return kdrt_matmul16_scratch(&g, KDRT_OPND_16, pass == KDRT_CONV_DW ? KDRT_OPND_16 : fb);
}

#endif
