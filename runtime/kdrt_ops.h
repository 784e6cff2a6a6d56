// kdrt_ops.h: every kernel a generated step calls, listed once for both
// runtimes. The CPU runtime defines kdrt_<name>(args) (kdrt_<name>(c, args)
// for the KC entries, which need the rank's context); the CUDA runtime
// defines kdrt_cuda_<name>(d, args) with the very same args. Both headers
// expand this one list, so the two backends cannot drift apart, and kdcc
// writes one call per op that differs between them only in that prefix.
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

// K(name, (args)): a kernel on local buffers. KC(name, (args)): one that
// needs the rank's context (randomness keyed by global indices, or
// communication over a group of mesh axes `axes`, a bit mask).
#define KDRT_KERNELS(K, KC)                                                                   \
  /* elementwise; y may alias x, dx may alias dy or x (issue 23: y) */                         \
  K(act, (int act, float *y, const float *x, size_t n))                                        \
  K(act_grad, (int act, float *dx, const float *dy, const float *x, const float *y, size_t n)) \
  /* issue 23: act_grad with x or y (v) a saved value of the 16-bit type kind in its  */     \
  /* 16 bits (store16.c's PACK16): the same bits as act_grad on its UNPACK16          */     \
  K(act_grad16, (int act, int kind, float *dx, const float *dy, const uint16_t *v, size_t n))  \
  /* out[r, j] = act(in[r, j] + bias[j]) over [rows, cols] */                                  \
  K(bias_act, (int act, float *out, const float *in, const float *bias, int64_t rows,          \
               int64_t cols))                                                                  \
  /* out[j] = sum over r of in[r, j] */                                                        \
  K(bias_grad, (float *out, const float *in, int64_t rows, int64_t cols))                      \
  /* out[r, j] = in[r, j] * g[j] over [rows, cols] (a scale over trailing dims) */            \
  K(col_mul, (float *out, const float *in, const float *g, int64_t rows, int64_t cols))        \
  /* Normalization over the last dim of [rows, cols], no scale or offset: layer norm  */      \
  /* y = (x - mean) / sqrt(var + eps), or (rms) y = x / sqrt(mean(x^2) + eps), both  */       \
  /* statistics in double; norm_grad: dx from dy, recomputing them from x.           */       \
  K(norm, (int rms, float *y, const float *x, int64_t rows, int64_t cols, float eps))          \
  K(norm_grad, (int rms, float *dx, const float *dy, const float *x, int64_t rows,             \
                int64_t cols, float eps))                                                      \
  /* Keras's LayerNormalization (and RMSNormalization) in one pass each way:     */          \
  /* layer_norm: y = norm(x) * g + b, g and b over the last dim, either NULL;    */          \
  /* layer_norm_dx: dx from dy (its norm_grad of dy * g, g NULL: 1);            */          \
  /* layer_norm_dw: dg[j] = the sum over r of dy * norm(x), db[j] of dy (either */          \
  /* NULL), summed as bias_grad sums; every product rounded to float first.     */          \
  /* kdcc passes db NULL: the offset's gradient is its own node (bias_grad).    */          \
  K(layer_norm, (int rms, float *y, const float *x, const float *g, const float *b,           \
                 int64_t rows, int64_t cols, float eps))                                       \
  K(layer_norm_dx, (int rms, float *dx, const float *dy, const float *x, const float *g,      \
                    int64_t rows, int64_t cols, float eps))                                    \
  K(layer_norm_dw, (int rms, float *dg, float *db, const float *dy, const float *x,           \
                    int64_t rows, int64_t cols, float eps))                                    \
  /* issue 15: batch normalization over the last dim of [rows, cols], with     */             \
  /* the statistics of the global batch (x's rows on every device).           */             \
  /* bn_stats: out[j] = the sum over r of x[r, j] (m and dy NULL), or of       */             \
  /* (x[r, j] - m[j])^2 (dy NULL), or with dy: out[j] = the sum of dy[r, j]    */             \
  /* and out[cols + j] the sum of dy[r, j] * (x[r, j] - m[j]); in double,      */             \
  /* blocks of rows added in block order (the same for any thread count).     */             \
  K(bn_stats, (float *out, const float *x, const float *m, const float *dy, int64_t rows,     \
               int64_t cols))                                                                  \
  /* batch_norm: y = act(x * inv + res), inv = rsqrt(v + eps) * g and res =   */             \
  /* b - m * inv (Keras's order); y may alias x.                              */             \
  K(batch_norm, (int act, float *y, const float *x, const float *m, const float *v,           \
                 const float *g, const float *b, int64_t rows, int64_t cols, float eps))       \
  /* bn_grad: dx = g * r * (dy - s[j] / n - (x - m) * r^2 * s[cols + j] / n),  */             \
  /* r = rsqrt(v + eps), s bn_stats' sums with dy, n the global rows: batch     */            \
  /* norm's whole gradient in x, through the statistics too.                  */             \
  K(bn_grad, (float *dx, const float *dy, const float *x, const float *m, const float *v,     \
              const float *g, const float *s, int64_t rows, int64_t cols, float eps,           \
              double n))                                                                       \
  /* Causal masking of attention scores [outer, t, u] (this device's block, whose   */       \
  /* first query and key positions are t0, u0): y = x, but fill where the key       */       \
  /* position is after the query's, or window > 0 and it is window or more before   */       \
  /* it (kdrt_key_masked; KDRT_MASKED forward, 0 for the gradient).                 */       \
  K(causal_mask, (float *y, const float *x, int64_t outer, int64_t t, int64_t u, int64_t t0,   \
                  int64_t u0, int64_t window, float fill))                                     \
  /* issue 24: rotary position embedding (kdrt_rope.h) of x[outer, t, inner, 2h],    */       \
  /* this device's block, whose steps' global positions are t0, t0 + 1, ...;        */       \
  /* inverse: the transpose (the gradient); y may be x.                             */       \
  K(rope, (float *y, const float *x, const kdrt_rotary *r, int64_t outer, int64_t t,           \
           int64_t inner, int64_t t0, int inverse))                                            \
  /* issue 10: attention scores x[outer, heads, inner] where a call's attention_mask */       \
  /* m[outer, m_inner] (int32 when m_int, else float; the same for every head) is    */      \
  /* zero become fill (KDRT_MASKED forward, 0 for the gradient); y may be x. m_inner */      \
  /* is inner, or the keys' count of a padding mask (element j reads j % m_inner).   */      \
  K(attention_mask, (float *y, const float *x, const void *m, int m_int, int64_t outer,        \
                     int64_t heads, int64_t inner, int64_t m_inner, float fill))               \
  /* out = in[0] + ... + in[nin - 1], left to right (nin <= 8) */                              \
  K(add, (float *out, const float *const *in, int nin, size_t n))                              \
  /* out = a * b elementwise */                                                                \
  K(mul, (float *out, const float *a, const float *b, size_t n))                               \
  /* out = in * scale + shift */                                                               \
  K(scale, (float *out, const float *in, size_t n, float scale, float shift))                  \
  K(copy, (float *out, const float *in, size_t n))                                             \
  /* issue 23: y = x rounded to bfloat16 or float16 (kind KDRT_ROUND_*; kdrt_round.h) */     \
  /* and kept in float32: a mixed policy's cast to its compute dtype; y may be x      */     \
  K(round, (int kind, float *y, const float *x, size_t n))                                     \
  /* issue 23: a value of that type (round's result) stored in its 16 bits, and back */      \
  /* (kdrt_round.h: bit for bit the same float32); y never aliases x                  */      \
  K(pack16, (int kind, uint16_t *y, const float *x, size_t n))                                 \
  K(unpack16, (int kind, float *y, const uint16_t *x, size_t n))                               \
  /* issue 23: round, its result in its 16 bits (a value only 16-bit products read) */     \
  K(round16, (int kind, uint16_t *y, const float *x, size_t n))                                \
  /* softmax over the last dim of [rows, cols]; dx = y * (dy - sum(dy * y)) */                 \
  K(softmax, (float *y, const float *x, int64_t rows, int64_t cols))                           \
  K(softmax_grad, (float *dx, const float *dy, const float *y, int64_t rows, int64_t cols))    \
  /* issue 25: y = x - max - log(sum(exp(x - max))) over the last dim of         */            \
  /* [rows, cols] (Keras's log_softmax); dx = dy - exp(y) * sum(dy)               */           \
  K(log_softmax, (float *y, const float *x, int64_t rows, int64_t cols))                       \
  K(log_softmax_grad, (float *dx, const float *dy, const float *y, int64_t rows, int64_t cols)) \
  /* Attention's scores x[outer, t, u] (this device's block of queries, the first  */         \
  /* at position t0; every key): y = softmax(mask(x * scale)) over u, the mask     */         \
  /* (when causal) making a key after its query KDRT_MASKED; then its gradient    */          \
  /* dx = scale * mask(y * (dy - sum(dy * y))) with 0 where masked. The same     */           \
  /* arithmetic, element for element, as scale, causal_mask and softmax (and     */           \
  /* back) one after the other; the masked keys' exps are not taken.             */           \
  K(attn_softmax, (float *y, const float *x, int64_t outer, int64_t t, int64_t u, int64_t t0,  \
                   float scale, int causal))                                                   \
  K(attn_softmax_grad, (float *dx, const float *dy, const float *y, int64_t outer, int64_t t,   \
                        int64_t u, int64_t t0, float scale, int causal))                       \
  /* issue 22: attention without its scores in memory (kdcc --target cuda, bf16   */          \
  /* and tf32): o = softmax(mask(q k^T * scale)) v over bn heads' q [t, hd], k    */          \
  /* and v [s, hd] (causal: a key after its query masked), and lse[bn, t], each   */          \
  /* row's max + log(sum of exps); then dq, dk, dv from do, o and lse. The CPU:   */          \
  /* the chain's arithmetic in float, row by row (the reference of opcheck).      */          \
  K(attention, (float *o, float *lse, const float *q, const float *k, const float *v,          \
                int64_t bn, int64_t t, int64_t s, int64_t hd, float scale, int causal))        \
  K(attention_grad, (float *dq, float *dk, float *dv, const float *dout, const float *q,       \
                     const float *k, const float *v, const float *o, const float *lse,         \
                     int64_t bn, int64_t t, int64_t s, int64_t hd, float scale, int causal))   \
  K(matmul, (const kdrt_gemm *g, float alpha, const float *a, const float *b, float beta,      \
             float *c))                                                                        \
  /* issue 23: c = a b of values of the 16-bit type kind, float32 sums and result;  */       \
  /* fa (fb): how a (b) is held, KDRT_OPND_* (kdrt_defs.h). The CPU: oneDNN's bf16  */       \
  /* matmul (onednn.c) where it has one, else (float16, or KDRT_GEMM16=0) the       */       \
  /* operands widened (rounded) and matmul's float32 product, its bits.             */       \
  K(matmul16, (const kdrt_gemm *g, int kind, int fa, const void *a, int fb, const void *b,     \
               float *c))                                                                      \
  /* issue 22: a Dense layer's product with its bias in the GEMM (cuBLASLt's        */       \
  /* epilogues; batch 1): c = act(a b + bias[j]) (bias NULL: c = a b; act LINEAR,     */       \
  /* RELU or GELU_TANH), and dbias non-NULL: dbias[j] = sum over k of b[k, j] (b      */       \
  /* is then dy, [K, N] with ldb N: the weight gradient's product makes the bias's).  */       \
  /* The CPU: matmul, then bias_act in place and bias_grad, as the separate ops.     */       \
  K(matmul_bias, (const kdrt_gemm *g, int act, const float *a, const float *b,                 \
                  const float *bias, float *c, float *dbias))                                  \
  /* Losses on [rows, cols] (rows: every sample or token of this rank, cols: the     */        \
  /* per-row width). out[0] = scale * sum over rows of the per-row loss (Keras 3's */          \
  /* reductions: mse/mae mean the last axis, crossentropies sum it); sparse: y holds */        \
  /* class ids as floats, one per row. accuracy: scale * correct rows, as Keras     */         \
  /* resolves "accuracy" for the loss. loss_grad: d(out)/d(pred). a: the loss's    */         \
  /* parameter (huber's delta); flag: hinge and squared_hinge, the step's           */         \
  /* not_binary (0: labels 0/1 become -1/1, as Keras converts them), else NULL.     */         \
  K(loss, (int kind, int from_logits, float a, float *out, const float *pred, const float *y,  \
           const float *flag, int64_t rows, int64_t cols, double scale))                       \
  K(accuracy, (int kind, int from_logits, float *out, const float *pred, const float *y,       \
               int64_t rows, int64_t cols, double scale))                                      \
  K(loss_grad, (int kind, int from_logits, float a, float *dpred, const float *pred,           \
                const float *y, const float *flag, int64_t rows, int64_t cols, double scale))  \
  /* kdcc --sample-weight: the same, each row's loss, hit or gradient times w[r]    */         \
  /* (Keras's sample_weight; the divisor stays the rows, sum_over_batch_size).      */         \
  K(loss_w, (int kind, int from_logits, float a, float *out, const float *pred, const float *y, \
             const float *flag, const float *w, int64_t rows, int64_t cols, double scale))     \
  K(accuracy_w, (int kind, int from_logits, float *out, const float *pred, const float *y,     \
                 const float *w, int64_t rows, int64_t cols, double scale))                    \
  K(loss_grad_w, (int kind, int from_logits, float a, float *dpred, const float *pred,         \
                  const float *y, const float *flag, const float *w, int64_t rows,             \
                  int64_t cols, double scale))                                                 \
  /* issue 11: out[0] = 1 when an element of y[n] is neither 0 nor 1, else 0 (the */          \
  /* labels' test in Keras's hinge losses; a max: ranks' flags all-reduced, max). */          \
  K(not_binary, (float *out, const float *y, int64_t n))                                       \
  /* Crossentropy from logits with the class dim split over ranks: this rank holds */          \
  /* columns [col0, col0 + cols) of V. row_max: out[r] = max_j x[r, j];            */          \
  /* row_sumexp: out[r] = sum_j exp(x[r, j] - m[r]) (m, s: after their all-reduce). */         \
  /* sparse_xent: out[0] = scale * sum over rows whose label y[r] is in this rank's */         \
  /* columns of (m[r] + log s[r] - x[r, y[r] - col0]); its grad: dx[r, j] =         */         \
  /* scale * (exp(x[r, j] - m[r]) / s[r] - (j + col0 == y[r])), 0 where y[r] < 0. */           \
  K(row_max, (float *out, const float *x, int64_t rows, int64_t cols))                         \
  K(row_sumexp, (float *out, const float *x, const float *m, int64_t rows, int64_t cols))      \
  K(sparse_xent, (float *out, const float *x, const float *y, const float *m, const float *s,  \
                  int64_t rows, int64_t cols, int64_t col0, double scale))                     \
  K(sparse_xent_grad, (float *dx, const float *x, const float *y, const float *m,              \
                       const float *s, int64_t rows, int64_t cols, int64_t col0, double scale)) \
  /* sparse accuracy with split classes: out[r] = (max, argmax) pairs are reduced    */        \
  /* by the caller; here: out[0] = scale * rows whose label's logit equals m[r] and */         \
  /* is the first such column (ties: lowest index), for labels in this rank's range */         \
  K(sparse_xent_acc, (float *out, const float *x, const float *y, const float *m,              \
                      int64_t rows, int64_t cols, int64_t col0, double scale))                 \
  /* kdcc --sample-weight: the same, each row's times w[r]                           */        \
  K(sparse_xent_w, (float *out, const float *x, const float *y, const float *m, const float *s, \
                    const float *w, int64_t rows, int64_t cols, int64_t col0, double scale))   \
  K(sparse_xent_grad_w, (float *dx, const float *x, const float *y, const float *m,            \
                         const float *s, const float *w, int64_t rows, int64_t cols,           \
                         int64_t col0, double scale))                                          \
  K(sparse_xent_acc_w, (float *out, const float *x, const float *y, const float *m,            \
                        const float *w, int64_t rows, int64_t cols, int64_t col0, double scale)) \
  K(conv2d, (const kdrt_window *w, float *y, const float *x, const float *f, float *scratch))  \
  K(conv2d_dx, (const kdrt_window *w, float *dx, const float *dy, const float *f,              \
                float *scratch))                                                               \
  K(conv2d_dw, (const kdrt_window *w, float *dw, const float *x, const float *dy,              \
                float *scratch))                                                               \
  K(maxpool, (const kdrt_window *w, float *y, const float *x))                                 \
  K(maxpool_grad, (const kdrt_window *w, float *dx, const float *dy, const float *x))          \
  /* out[.., i, ..] = in[.., off + i, ..] along one dim (outer: product of the dims  */        \
  /* before, inner: after); place_block is the reverse, into out at off             */         \
  K(copy_block, (float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,      \
                 int64_t out_ext, int64_t inner))                                              \
  K(place_block, (float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,     \
                  int64_t out_ext, int64_t inner))                                             \
  /* pad_block: place_block into zeros (every element of out outside the block is 0) */      \
  K(pad_block, (float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,       \
                int64_t out_ext, int64_t inner))                                               \
  /* out = in with its dims permuted: out dim i is in dim perm[i]; shape: in's */              \
  K(transpose, (float *out, const float *in, int rank, const int64_t *shape, const int *perm)) \
  /* out[o, i] = sum over m of in[o, m, i]; broadcast: out[o, m, i] = in[o, i] */              \
  K(reduce_sum, (float *out, const float *in, int64_t outer, int64_t mid, int64_t inner))      \
  K(broadcast, (float *out, const float *in, int64_t outer, int64_t mid, int64_t inner))       \
  /* Embedding lookup on a table block of rows [row0, row0 + rows) of the vocab:    */         \
  /* out[i, :] = table[ids[i] - row0, :] for ids in range, else zeros (a partial   */         \
  /* sum over the ranks that split the vocab). scatter_add: dtable (overwritten)   */          \
  /* = sum over i with ids in range of dy[i, :] into row ids[i] - row0.            */          \
  K(gather, (float *out, const float *table, const int32_t *ids, int64_t n, int64_t rows,      \
             int64_t cols, int64_t row0))                                                      \
  K(scatter_add, (float *dtable, const float *dy, const int32_t *ids, int64_t n, int64_t rows, \
                  int64_t cols, int64_t row0))                                                 \
  /* issue 11 (runtime/layers.c): w = w * momentum + x * rest in place (rest = 1 - */          \
  /* momentum, rounded once as Keras does): a moving statistic's update           */          \
  K(ema, (float *w, const float *x, size_t n, float momentum, float rest))                     \
  /* issue 11: the factor a weight constraint scales a vector by, from the sum of */         \
  /* its squares s: norm = sqrt(s), (rate * clip(norm, lo, hi) + rest * norm) /   */         \
  /* (1e-7 + norm), rest = 1 - rate (MaxNorm, UnitNorm, MinMaxNorm)               */         \
  K(clip_norm, (float *f, const float *s, size_t n, float lo, float hi, float rate, float rest)) \
  /* issue 11: activation layers with Keras's parameters (kind KDRT_PACT_*):   */             \
  /* LeakyReLU(alpha), ELU(alpha), ReLU(negative_slope alpha, max_value max,   */             \
  /* threshold); pact_grad: dx = dy * d pact / d x at x                        */             \
  K(pact, (int kind, float *y, const float *x, size_t n, float alpha, float max,              \
           float threshold))                                                                  \
  K(pact_grad, (int kind, float *dx, const float *dy, const float *x, size_t n, float alpha,  \
                float max, float threshold))                                                  \
  /* y = max(a, b) elementwise (min: the minimum), NaN if either is; b NULL: max(a, c).  */    \
  /* maximum_grad: dx = dy where a is the result and b is not, dy / 2 where both are   */    \
  /* (JAX's balanced gradient of a tie), else 0: d y / d a                               */    \
  /* y[i] = v; load_const: y = the program's constant k (host memory) (issue 11) */          \
  K(fill, (float *y, float v, size_t n))                                                       \
  K(load_const, (float *y, const float *k, size_t n))                                          \
  K(maximum, (float *y, const float *a, const float *b, float c, int min, size_t n))           \
  K(maximum_grad, (float *dx, const float *dy, const float *a, const float *b, float c,        \
                   int min, size_t n))                                                         \
  /* issue 11 (runtime/rnn.c): recurrent layers, the records of kdrt_rnn.h, one */           \
  /* step t a call (the program loops). recur: step t of y[B, T, width] from     */           \
  /* xw[B, T, G * U], r[U, G * U] (and GRU's recurrent bias brec[3U], or NULL)   */           \
  /* and step t - 1 (t = 0: a zero state); recur_grad, t from T - 1 down: step t */           \
  /* of the gradient record dx from dy (the gradient of y), y and step t + 1;    */           \
  /* reverse: out = in with dim mid reversed                                     */           \
  K(recur, (int cell, int act, int ract, float *y, const float *xw, const float *r,            \
            const float *brec, int64_t B, int64_t T, int64_t U, int64_t t))                    \
  K(recur_grad, (int cell, int act, int ract, float *dx, const float *dy, const float *y,      \
                 const float *r, int64_t B, int64_t T, int64_t U, int64_t t))                  \
  K(reverse, (float *out, const float *in, int64_t outer, int64_t mid, int64_t inner))         \
  /* optimizer updates on local shards, Keras 3 semantics; t is the 1-based step; */          \
  /* vhat (Adam's amsgrad), m (RMSprop's momentum), a (RMSprop's centered         */          \
  /* average gradient): NULL when the option is off                               */          \
  K(sgd, (float *w, const float *g, float *m, size_t n, float lr, float momentum,              \
          int nesterov))                                                                       \
  K(adam, (float *w, const float *g, float *m, float *v, float *vhat, size_t n, float lr,      \
           float b1, float b2, float eps, int64_t t))                                          \
  K(adamw, (float *w, const float *g, float *m, float *v, float *vhat, size_t n, float lr,     \
            float b1, float b2, float eps, float wd, int64_t t))                               \
  K(rmsprop, (float *w, const float *g, float *v, float *m, float *a, size_t n, float lr,      \
              float rho, float momentum, float eps))                                           \
  K(adagrad, (float *w, const float *g, float *acc, size_t n, float lr, float eps))            \
  K(adamax, (float *w, const float *g, float *m, float *u, size_t n, float lr, float b1,       \
             float b2, float eps, int64_t t))                                                  \
  /* Nadam: u_prod, the product of the momentum schedule up to step t           */             \
  /* (kdrt_nadam_product)                                                        */            \
  K(nadam, (float *w, const float *g, float *m, float *v, size_t n, float lr, float b1,        \
            float b2, float eps, int64_t t, float u_prod))                                     \
  K(lion, (float *w, const float *g, float *m, size_t n, float lr, float b1, float b2))       \
  /* base_optimizer's weight decay before an update: w -= w * wd * lr             */          \
  K(weight_decay, (float *w, size_t n, float lr, float wd))                                    \
  /* base_optimizer's gradient clipping, in place before the update: g *= f[0]     */          \
  /* (f NULL: no factor), then clipvalue > 0 clips g to [-clipvalue, clipvalue]    */          \
  K(clip_grad, (float *g, size_t n, const float *f, float clipvalue))                          \
  /* f[0] = the factor gradients are scaled by from their sum of squares s[0]:     */          \
  /* clipnorm c / max(sqrt(s), c); global (global_clipnorm) c * min(1 / sqrt(s),   */          \
  /* 1 / c), NaN when the norm is not finite                                      */           \
  K(grad_clip_factor, (float *f, const float *s, float c, int global))                         \
  /* issue 23: Keras's LossScaleOptimizer's step on the gradient blob g (each     */          \
  /* variable's local gradient where c->prog->vars puts it): kdrt_loss_scale_decide */        \
  /* on its non-finite values, then (updates to run) each divided by the scale    */          \
  KC(loss_scale_step, (float *g))                                                              \
  /* y = x * mask / (1 - rate), the mask drawn for (seed, stream, step, global      */         \
  /* element index); the same call on dy gives the gradient                        */         \
  KC(dropout, (float *y, const float *x, const kdrt_layout *l, float rate, uint64_t stream))   \
  /* issue 11: y = x + stddev * z, or (mul) x * (1 + stddev * z), z a standard normal */      \
  /* drawn for (seed, stream, step, global element index): GaussianNoise, and        */      \
  /* GaussianDropout and its gradient (the same call on dy); y may be x              */      \
  KC(gaussian_noise, (float *y, const float *x, const kdrt_layout *l, float stddev, int mul,   \
                      uint64_t stream))                                                        \
  /* collectives: see kdrt.h's comm.c section */                                               \
  KC(allreduce, (unsigned axes, const float *in, float *out, size_t n))                        \
  KC(allreduce_max, (unsigned axes, const float *in, float *out, size_t n))                    \
  KC(reduce_scatter, (unsigned axes, int rank, const int64_t *lshape, int dim, const float *in, \
                      float *out))                                                             \
  KC(allgather, (unsigned axes, int rank, const int64_t *lshape, int dim, const float *in,     \
                 float *out))                                                                  \
  KC(alltoall, (unsigned axes, int rank, const int64_t *lshape, int from, int to,              \
                const float *in, float *out))                                                  \
  KC(slice, (unsigned axes, int rank, const int64_t *lshape, int dim, const float *in,         \
             float *out))                                                                      \
  /* issue 23: allgather and alltoall of values of the 16-bit type kind, in 16 bits */         \
  KC(allgather16, (int kind, unsigned axes, int rank, const int64_t *lshape, int dim,          \
                   const float *in, float *out))                                               \
  KC(alltoall16, (int kind, unsigned axes, int rank, const int64_t *lshape, int from, int to,  \
                  const float *in, float *out))

#endif
