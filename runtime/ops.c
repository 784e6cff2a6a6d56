// ops.c: the compute kernels a generated train_step calls on local buffers.
//
// Every function here works on one rank's local block and never
// communicates; kdcc decides what is local and inserts the collectives
// around these calls. The semantics are Keras 3's as the JAX backend runs
// them, so that a kdcc program and `model.fit` on JAX print the same numbers:
//
// - Activations follow keras.activations (gelu is the exact erf form,
//   Keras's default approximate=False). Gradients take both the input x and
//   the output y; each uses whichever is cheaper (relu/sigmoid/tanh: y).
// - Losses follow keras/src/losses and keras/src/backend/jax/nn.py: mse and
//   mae average the last axis; categorical crossentropy on probabilities
//   divides the output by its row sum, clips to [1e-7, 1 - 1e-7] and takes
//   -sum(y log p); binary crossentropy clips the same way and averages the
//   last axis; from_logits forms use log-softmax and the stable softplus
//   form. Where a value was clipped its gradient is 0, as in JAX. Every loss
//   returns sum over rows * scale (kdcc passes 1/global batch), accumulated
//   in double.
// - "accuracy" resolves as keras/src/trainers/compile_utils.py does it, by
//   shape: one prediction column -> binary accuracy (threshold 0.5, as
//   Keras's BinaryAccuracy uses whatever the loss's from_logits), class ids
//   -> sparse categorical, otherwise categorical (argmax, first maximum).
// - Conv2D is channels last. The forward pass and the filter gradient lower
//   the input to a [B*OH*OW, KH*KW*C] matrix in the caller's scratch
//   (im2col) and make one sgemm with the [KH*KW*C, K] filter; the input
//   gradient makes one sgemm into the scratch and scatters it back (col2im).
//   A 1x1, stride 1, unpadded conv skips the copy: x already is that matrix.
// - Max pooling never lets a padding position win; its gradient goes to the
//   first maximum of each window in row-major window order.
// - Optimizers follow keras/src/optimizers/{sgd,adam,adamw,rmsprop}.py
//   (AdamW: decoupled decay w -= w*wd*lr applied before the Adam step, as
//   base_optimizer does; RMSprop: centered=False, eps inside the sqrt).
//
// Elementwise kernels allow the output to alias an input of the same shape
// (dx == dy, y == x); the conv and pooling kernels do not.
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kdrt.h"

// Keras's backend.epsilon() and the clip bounds it implies, in float32.
#define KD_EPS 1e-7f
#define KD_ONE_MINUS_EPS ((float)(1.0 - 1e-7))
#define KD_SQRT1_2 0.70710678118654752f

// ---------------------------------------------------------------- activations

static inline float sigmoidf(float x) {
  // Stable for large |x|: exp never overflows.
  float e = expf(-fabsf(x));
  float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}

void kdrt_act(int act, float *y, const float *x, size_t n) {
  switch (act) {
  case KDRT_ACT_LINEAR:
    if (y != x)
      memmove(y, x, n * sizeof *y);
    return;
  case KDRT_ACT_RELU:
    for (size_t i = 0; i < n; i++)
      y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return;
  case KDRT_ACT_SIGMOID:
    for (size_t i = 0; i < n; i++)
      y[i] = sigmoidf(x[i]);
    return;
  case KDRT_ACT_TANH:
    for (size_t i = 0; i < n; i++)
      y[i] = tanhf(x[i]);
    return;
  case KDRT_ACT_GELU:
    for (size_t i = 0; i < n; i++)
      y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * KD_SQRT1_2));
    return;
  case KDRT_ACT_SILU:
    for (size_t i = 0; i < n; i++)
      y[i] = x[i] * sigmoidf(x[i]);
    return;
  }
}

void kdrt_act_grad(int act, float *dx, const float *dy, const float *x, const float *y,
                   size_t n) {
  switch (act) {
  case KDRT_ACT_LINEAR:
    if (dx != dy)
      memmove(dx, dy, n * sizeof *dx);
    return;
  case KDRT_ACT_RELU:
    for (size_t i = 0; i < n; i++) { // both loads unconditional: vectorises, no branch
      float g = dy[i], keep = y[i] > 0.0f ? 1.0f : 0.0f;
      dx[i] = g * keep;
    }
    return;
  case KDRT_ACT_SIGMOID:
    for (size_t i = 0; i < n; i++)
      dx[i] = dy[i] * y[i] * (1.0f - y[i]);
    return;
  case KDRT_ACT_TANH:
    for (size_t i = 0; i < n; i++)
      dx[i] = dy[i] * (1.0f - y[i] * y[i]);
    return;
  case KDRT_ACT_GELU: {
    // d/dx [x Phi(x)] = Phi(x) + x phi(x)
    const float inv_sqrt_2pi = 0.3989422804014327f;
    for (size_t i = 0; i < n; i++) {
      float xi = x[i];
      float cdf = 0.5f * (1.0f + erff(xi * KD_SQRT1_2));
      float pdf = inv_sqrt_2pi * expf(-0.5f * xi * xi);
      dx[i] = dy[i] * (cdf + xi * pdf);
    }
    return;
  }
  case KDRT_ACT_SILU:
    for (size_t i = 0; i < n; i++) {
      float s = sigmoidf(x[i]);
      dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
    return;
  }
}

// ---------------------------------------------------------------- softmax

void kdrt_softmax(float *y, const float *x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    float m = -INFINITY;
    for (int64_t j = 0; j < cols; j++)
      m = xr[j] > m ? xr[j] : m;
    float s = 0.0f;
    for (int64_t j = 0; j < cols; j++) {
      yr[j] = expf(xr[j] - m);
      s += yr[j];
    }
    float inv = 1.0f / s;
    for (int64_t j = 0; j < cols; j++)
      yr[j] *= inv;
  }
}

void kdrt_softmax_grad(float *dx, const float *dy, const float *y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) {
    const float *dyr = dy + r * cols, *yr = y + r * cols;
    float *dxr = dx + r * cols;
    float dot = 0.0f;
    for (int64_t j = 0; j < cols; j++)
      dot += dyr[j] * yr[j];
    for (int64_t j = 0; j < cols; j++)
      dxr[j] = yr[j] * (dyr[j] - dot);
  }
}

// ---------------------------------------------------------------- losses

static inline float clipf(float p) {
  return p < KD_EPS ? KD_EPS : (p > KD_ONE_MINUS_EPS ? KD_ONE_MINUS_EPS : p);
}

// 1 where clip(p) passes p through, 0 where it clamps (JAX's gradient).
static inline float unclipped(float p) {
  return (p >= KD_EPS && p <= KD_ONE_MINUS_EPS) ? 1.0f : 0.0f;
}

// log(sum(exp(x))) over one row, stable.
static float logsumexp(const float *x, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; j++)
    m = x[j] > m ? x[j] : m;
  float s = 0.0f;
  for (int64_t j = 0; j < n; j++)
    s += expf(x[j] - m);
  return m + logf(s);
}

// softplus(x) = log(1 + exp(x)), stable.
static inline float softplusf(float x) {
  return (x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x)));
}

// The sparse label of row r as a column index, or -1 when out of range
// (JAX's one_hot then gives an all-zero row: loss and gradient 0).
static inline int64_t class_id(const float *y, int64_t r, int64_t cols) {
  float v = y[r];
  if (!(v >= 0.0f) || v >= (float)cols)
    return -1;
  return (int64_t)v;
}

double kdrt_loss(int kind, int from_logits, const float *pred, const float *y, int64_t rows,
                 int64_t cols, double scale) {
  double total = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    const float *p = pred + r * cols;
    const float *t = y + r * cols; // dense labels; SCCE reads y[r]
    double l = 0.0;
    switch (kind) {
    case KDRT_LOSS_MSE:
      for (int64_t j = 0; j < cols; j++) {
        double d = (double)p[j] - t[j];
        l += d * d;
      }
      l /= (double)cols;
      break;
    case KDRT_LOSS_MAE:
      for (int64_t j = 0; j < cols; j++)
        l += fabs((double)p[j] - t[j]);
      l /= (double)cols;
      break;
    case KDRT_LOSS_CCE:
      if (from_logits) {
        float lse = logsumexp(p, cols);
        for (int64_t j = 0; j < cols; j++)
          l -= (double)t[j] * (p[j] - lse);
      } else {
        float s = 0.0f;
        for (int64_t j = 0; j < cols; j++)
          s += p[j];
        for (int64_t j = 0; j < cols; j++)
          l -= (double)t[j] * logf(clipf(p[j] / s));
      }
      break;
    case KDRT_LOSS_SCCE: {
      int64_t c = class_id(y, r, cols);
      if (c < 0)
        break;
      if (from_logits) {
        l = (double)logsumexp(p, cols) - p[c];
      } else {
        float s = 0.0f;
        for (int64_t j = 0; j < cols; j++)
          s += p[j];
        l = -logf(clipf(p[c] / s));
      }
      break;
    }
    case KDRT_LOSS_BCE:
      if (from_logits) {
        for (int64_t j = 0; j < cols; j++)
          l += softplusf(p[j]) - p[j] * t[j];
      } else {
        for (int64_t j = 0; j < cols; j++) {
          float q = clipf(p[j]);
          l -= t[j] * logf(q) + (1.0f - t[j]) * logf(1.0f - q);
        }
      }
      l /= (double)cols;
      break;
    }
    total += l;
  }
  return total * scale;
}

void kdrt_loss_grad(int kind, int from_logits, float *dpred, const float *pred, const float *y,
                    int64_t rows, int64_t cols, double scale) {
  const float sc = (float)scale;
  const float sc_cols = (float)(scale / (double)cols);
  for (int64_t r = 0; r < rows; r++) {
    const float *p = pred + r * cols;
    const float *t = y + r * cols;
    float *d = dpred + r * cols;
    switch (kind) {
    case KDRT_LOSS_MSE:
      for (int64_t j = 0; j < cols; j++)
        d[j] = 2.0f * sc_cols * (p[j] - t[j]);
      break;
    case KDRT_LOSS_MAE:
      for (int64_t j = 0; j < cols; j++) {
        float e = p[j] - t[j];
        d[j] = e > 0.0f ? sc_cols : (e < 0.0f ? -sc_cols : 0.0f);
      }
      break;
    case KDRT_LOSS_CCE:
      if (from_logits) {
        // d/dx -sum y log_softmax(x) = softmax(x) * sum(y) - y
        float lse = logsumexp(p, cols);
        float ysum = 0.0f;
        for (int64_t j = 0; j < cols; j++)
          ysum += t[j];
        for (int64_t j = 0; j < cols; j++)
          d[j] = sc * (expf(p[j] - lse) * ysum - t[j]);
      } else {
        // q = p / s; L = -sum y log clip(q). With g_j = -y_j/q_j where q_j
        // is unclipped (0 elsewhere): dL/dp_k = (g_k + sum_j y_j [q_j unclipped]) / s.
        float s = 0.0f;
        for (int64_t j = 0; j < cols; j++)
          s += p[j];
        float ym = 0.0f;
        for (int64_t j = 0; j < cols; j++)
          ym += t[j] * unclipped(p[j] / s);
        float inv = sc / s;
        for (int64_t j = 0; j < cols; j++) {
          float q = p[j] / s;
          float g = unclipped(q) > 0.0f ? -t[j] / q : 0.0f;
          d[j] = inv * (g + ym);
        }
      }
      break;
    case KDRT_LOSS_SCCE: {
      int64_t c = class_id(y, r, cols);
      if (c < 0) {
        memset(d, 0, (size_t)cols * sizeof *d);
        break;
      }
      if (from_logits) {
        float lse = logsumexp(p, cols);
        for (int64_t j = 0; j < cols; j++)
          d[j] = sc * expf(p[j] - lse);
        d[c] -= sc;
      } else {
        float s = 0.0f;
        for (int64_t j = 0; j < cols; j++)
          s += p[j];
        float q = p[c] / s;
        float m = unclipped(q);
        float inv = sc / s;
        for (int64_t j = 0; j < cols; j++)
          d[j] = inv * m;
        d[c] = m > 0.0f ? inv * (1.0f - 1.0f / q) : 0.0f;
      }
      break;
    }
    case KDRT_LOSS_BCE:
      if (from_logits) {
        for (int64_t j = 0; j < cols; j++)
          d[j] = sc_cols * (sigmoidf(p[j]) - t[j]);
      } else {
        for (int64_t j = 0; j < cols; j++) {
          float q = p[j];
          float g = -t[j] / q + (1.0f - t[j]) / (1.0f - q);
          d[j] = unclipped(q) > 0.0f ? sc_cols * g : 0.0f;
        }
      }
      break;
    }
  }
}

// Index of the first maximum of x[0..n).
static int64_t argmax_first(const float *x, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; j++)
    if (x[j] > x[best])
      best = j;
  return best;
}

double kdrt_accuracy(int kind, int from_logits, const float *pred, const float *y, int64_t rows,
                     int64_t cols, double scale) {
  (void)from_logits;
  int64_t correct = 0;
  if (cols == 1) {
    // BinaryAccuracy: y_true == float(y_pred > 0.5). Keras keeps 0.5 even
    // for a from_logits loss.
    for (int64_t r = 0; r < rows; r++)
      correct += y[r] == (pred[r] > 0.5f ? 1.0f : 0.0f);
  } else if (kind == KDRT_LOSS_SCCE) {
    for (int64_t r = 0; r < rows; r++)
      correct += (float)argmax_first(pred + r * cols, cols) == y[r];
  } else {
    for (int64_t r = 0; r < rows; r++)
      correct += argmax_first(pred + r * cols, cols) == argmax_first(y + r * cols, cols);
  }
  return (double)correct * scale;
}

// ---------------------------------------------------------------- conv2d

// Is this conv a plain matmul over [B*H*W, C] (1x1, stride 1, no padding)?
static int conv_is_pointwise(int H, int W, int KH, int KW, int sh, int sw, int pad_t, int pad_l,
                             int OH, int OW) {
  return KH == 1 && KW == 1 && sh == 1 && sw == 1 && pad_t == 0 && pad_l == 0 && OH == H &&
         OW == W;
}

// For output column ow, the kernel columns [*lo, *hi) that land inside the
// input; iw0 is the input column of kernel column 0.
static inline void kw_range(int ow, int sw, int pad_l, int KW, int W, int *iw0, int *lo,
                            int *hi) {
  *iw0 = ow * sw - pad_l;
  *lo = *iw0 < 0 ? -*iw0 : 0;
  *hi = W - *iw0 < KW ? W - *iw0 : KW;
  if (*hi < *lo)
    *hi = *lo;
}

// cols [B*OH*OW, KH*KW*C], row (b,oh,ow), column (kh,kw,c): the input under
// the kernel, zero where it falls in the padding. For one (kh), the kernel
// columns in range are adjacent in x (channels last), so each is one memcpy.
static void im2col(float *restrict cols, const float *restrict x, int B, int H, int W, int C,
                   int KH, int KW, int sh, int sw, int pad_t, int pad_l, int OH, int OW) {
  const size_t kwc = (size_t)KW * C;
  const size_t rowlen = (size_t)KH * kwc;
  for (int b = 0; b < B; b++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        float *dst = cols + (((size_t)b * OH + oh) * OW + ow) * rowlen;
        int iw0, lo, hi;
        kw_range(ow, sw, pad_l, KW, W, &iw0, &lo, &hi);
        for (int kh = 0; kh < KH; kh++) {
          float *d = dst + kh * kwc;
          int ih = oh * sh - pad_t + kh;
          if (ih < 0 || ih >= H || hi == lo) {
            memset(d, 0, kwc * sizeof *d);
            continue;
          }
          const float *src = x + (((size_t)b * H + ih) * W + iw0 + lo) * C;
          memset(d, 0, (size_t)lo * C * sizeof *d);
          memcpy(d + (size_t)lo * C, src, (size_t)(hi - lo) * C * sizeof *d);
          memset(d + (size_t)hi * C, 0, (size_t)(KW - hi) * C * sizeof *d);
        }
      }
}

// The transpose of im2col: dx (zeroed first) += each column entry at the
// input position it was copied from; padding entries are dropped.
static void col2im(float *restrict dx, const float *restrict cols, int B, int H, int W, int C,
                   int KH, int KW, int sh, int sw, int pad_t, int pad_l, int OH, int OW) {
  const size_t kwc = (size_t)KW * C;
  const size_t rowlen = (size_t)KH * kwc;
  memset(dx, 0, (size_t)B * H * W * C * sizeof *dx);
  for (int b = 0; b < B; b++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        const float *src = cols + (((size_t)b * OH + oh) * OW + ow) * rowlen;
        int iw0, lo, hi;
        kw_range(ow, sw, pad_l, KW, W, &iw0, &lo, &hi);
        for (int kh = 0; kh < KH; kh++) {
          int ih = oh * sh - pad_t + kh;
          if (ih < 0 || ih >= H || hi == lo)
            continue;
          const float *s = src + kh * kwc + (size_t)lo * C;
          float *d = dx + (((size_t)b * H + ih) * W + iw0 + lo) * C;
          const size_t n = (size_t)(hi - lo) * C;
          for (size_t i = 0; i < n; i++)
            d[i] += s[i];
        }
      }
}

// The im2col matrix [B*OH*OW, KH*KW*C] of x: x itself for a pointwise
// convolution, else built in scratch.
static const float *conv_cols(const float *x, int B, int H, int W, int C, int KH, int KW, int sh,
                              int sw, int pad_t, int pad_l, int OH, int OW, float *scratch) {
  if (conv_is_pointwise(H, W, KH, KW, sh, sw, pad_t, pad_l, OH, OW)) return x;
  im2col(scratch, x, B, H, W, C, KH, KW, sh, sw, pad_t, pad_l, OH, OW);
  return scratch;
}

void kdrt_conv2d(float *y, const float *x, const float *f, int B, int H, int W, int C, int KH,
                 int KW, int K, int sh, int sw, int pad_t, int pad_l, int OH, int OW,
                 float *scratch) {
  const int M = B * OH * OW, KC = KH * KW * C;
  const float *cols = conv_cols(x, B, H, W, C, KH, KW, sh, sw, pad_t, pad_l, OH, OW, scratch);
  // y[M, K] = cols[M, KC] @ f[KC, K]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, KC, 1.0f, cols, KC, f, K, 0.0f, y,
              K);
}

void kdrt_conv2d_dx(float *dx, const float *dy, const float *f, int B, int H, int W, int C,
                    int KH, int KW, int K, int sh, int sw, int pad_t, int pad_l, int OH, int OW,
                    float *scratch) {
  const int M = B * OH * OW, KC = KH * KW * C;
  if (conv_is_pointwise(H, W, KH, KW, sh, sw, pad_t, pad_l, OH, OW)) {
    // dx[M, C] = dy[M, K] @ f[C, K]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, KC, K, 1.0f, dy, K, f, K, 0.0f, dx,
                KC);
    return;
  }
  // dcols[M, KC] = dy[M, K] @ f[KC, K]^T, then scatter back.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, KC, K, 1.0f, dy, K, f, K, 0.0f,
              scratch, KC);
  col2im(dx, scratch, B, H, W, C, KH, KW, sh, sw, pad_t, pad_l, OH, OW);
}

void kdrt_conv2d_dw(float *dw, const float *x, const float *dy, int B, int H, int W, int C,
                    int KH, int KW, int K, int sh, int sw, int pad_t, int pad_l, int OH, int OW,
                    float *scratch) {
  const int M = B * OH * OW, KC = KH * KW * C;
  const float *cols = conv_cols(x, B, H, W, C, KH, KW, sh, sw, pad_t, pad_l, OH, OW, scratch);
  // dw[KC, K] = cols[M, KC]^T @ dy[M, K]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, KC, K, M, 1.0f, cols, KC, dy, K, 0.0f, dw,
              K);
}

// ---------------------------------------------------------------- max pooling

// The window rows [*lo, *hi) of output row o that fall inside [0, n).
static inline void win_range(int o, int s, int pad, int P, int n, int *i0, int *lo, int *hi) {
  *i0 = o * s - pad;
  *lo = *i0 < 0 ? -*i0 : 0;
  *hi = n - *i0 < P ? n - *i0 : P;
  if (*hi < *lo)
    *hi = *lo;
}

void kdrt_maxpool(float *y, const float *x, int B, int H, int W, int C, int PH, int PW, int sh,
                  int sw, int pad_t, int pad_l, int OH, int OW) {
  for (int b = 0; b < B; b++)
    for (int oh = 0; oh < OH; oh++) {
      int ih0, phl, phh;
      win_range(oh, sh, pad_t, PH, H, &ih0, &phl, &phh);
      for (int ow = 0; ow < OW; ow++) {
        int iw0, pwl, pwh;
        win_range(ow, sw, pad_l, PW, W, &iw0, &pwl, &pwh);
        float *restrict yr = y + (((size_t)b * OH + oh) * OW + ow) * C;
        if (phl == phh || pwl == pwh) { // a window wholly in the padding
          memset(yr, 0, (size_t)C * sizeof *yr);
          continue;
        }
        const float *first = x + (((size_t)b * H + ih0 + phl) * W + iw0 + pwl) * C;
        memcpy(yr, first, (size_t)C * sizeof *yr);
        for (int ph = phl; ph < phh; ph++)
          for (int pw = pwl; pw < pwh; pw++) {
            const float *restrict xr = x + (((size_t)b * H + ih0 + ph) * W + iw0 + pw) * C;
            for (int c = 0; c < C; c++)
              yr[c] = xr[c] > yr[c] ? xr[c] : yr[c];
          }
      }
    }
}

// Channels are handled in chunks of this many, so that the running maximum
// and its position fit in fixed arrays on the stack.
#define KD_POOL_CHUNK 256

void kdrt_maxpool_grad(float *dx, const float *dy, const float *x, int B, int H, int W, int C,
                       int PH, int PW, int sh, int sw, int pad_t, int pad_l, int OH, int OW) {
  float best[KD_POOL_CHUNK];
  int pos[KD_POOL_CHUNK]; // input pixel (ih * W + iw) of the first maximum
  memset(dx, 0, (size_t)B * H * W * C * sizeof *dx);
  for (int b = 0; b < B; b++) {
    const float *xb = x + (size_t)b * H * W * C;
    float *dxb = dx + (size_t)b * H * W * C;
    for (int oh = 0; oh < OH; oh++) {
      int ih0, phl, phh;
      win_range(oh, sh, pad_t, PH, H, &ih0, &phl, &phh);
      for (int ow = 0; ow < OW; ow++) {
        int iw0, pwl, pwh;
        win_range(ow, sw, pad_l, PW, W, &iw0, &pwl, &pwh);
        if (phl == phh || pwl == pwh)
          continue;
        const float *dyr = dy + (((size_t)b * OH + oh) * OW + ow) * C;
        const int p0 = (ih0 + phl) * W + iw0 + pwl;
        for (int c0 = 0; c0 < C; c0 += KD_POOL_CHUNK) {
          const int nc = C - c0 < KD_POOL_CHUNK ? C - c0 : KD_POOL_CHUNK;
          const float *first = xb + (size_t)p0 * C + c0;
          for (int c = 0; c < nc; c++) {
            best[c] = first[c];
            pos[c] = p0;
          }
          for (int ph = phl; ph < phh; ph++)
            for (int pw = pwl; pw < pwh; pw++) {
              const int p = (ih0 + ph) * W + iw0 + pw;
              const float *xr = xb + (size_t)p * C + c0;
              for (int c = 0; c < nc; c++) {
                int better = xr[c] > best[c]; // strict: the first maximum wins
                best[c] = better ? xr[c] : best[c];
                pos[c] = better ? p : pos[c];
              }
            }
          for (int c = 0; c < nc; c++)
            dxb[(size_t)pos[c] * C + c0 + c] += dyr[c0 + c];
        }
      }
    }
  }
}

// ---------------------------------------------------------------- blocks

void kdrt_copy_block(float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,
                     int64_t out_ext, int64_t inner) {
  const size_t n = (size_t)(out_ext * inner);
  for (int64_t o = 0; o < outer; o++)
    memcpy(out + o * out_ext * inner, in + (o * in_ext + off) * inner, n * sizeof *out);
}

void kdrt_place_block(float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,
                      int64_t out_ext, int64_t inner) {
  const size_t n = (size_t)(in_ext * inner);
  for (int64_t o = 0; o < outer; o++)
    memcpy(out + (o * out_ext + off) * inner, in + o * in_ext * inner, n * sizeof *out);
}

// ---------------------------------------------------------------- optimizers

void kdrt_sgd(float *w, const float *g, float *m, size_t n, float lr, float momentum,
              int nesterov) {
  if (momentum == 0.0f) {
    for (size_t i = 0; i < n; i++)
      w[i] -= lr * g[i];
    return;
  }
  // m = m*momentum - g*lr; w += m (nesterov: w += m*momentum - g*lr)
  if (nesterov) {
    for (size_t i = 0; i < n; i++) {
      float mi = m[i] * momentum - g[i] * lr;
      m[i] = mi;
      w[i] += mi * momentum - g[i] * lr;
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      float mi = m[i] * momentum - g[i] * lr;
      m[i] = mi;
      w[i] += mi;
    }
  }
}

// The Adam step shared by kdrt_adam and kdrt_adamw.
static void adam_step(float *restrict w, const float *restrict g, float *restrict m,
                      float *restrict v, size_t n, float lr, float b1, float b2, float eps,
                      int64_t t) {
  const float alpha =
      (float)(lr * sqrt(1.0 - pow(b2, (double)t)) / (1.0 - pow(b1, (double)t)));
  const float c1 = 1.0f - b1, c2 = 1.0f - b2;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i];
    float mi = m[i] + (gi - m[i]) * c1;
    float vi = v[i] + (gi * gi - v[i]) * c2;
    m[i] = mi;
    v[i] = vi;
    w[i] -= mi * alpha / (sqrtf(vi) + eps);
  }
}

void kdrt_adam(float *w, const float *g, float *m, float *v, size_t n, float lr, float b1,
               float b2, float eps, int64_t t) {
  adam_step(w, g, m, v, n, lr, b1, b2, eps, t);
}

void kdrt_adamw(float *w, const float *g, float *m, float *v, size_t n, float lr, float b1,
                float b2, float eps, float wd, int64_t t) {
  for (size_t i = 0; i < n; i++)
    w[i] = w[i] - w[i] * wd * lr; // Keras's order of operations
  adam_step(w, g, m, v, n, lr, b1, b2, eps, t);
}

void kdrt_rmsprop(float *w, const float *g, float *v, float *m, size_t n, float lr, float rho,
                  float momentum, float eps) {
  const float c = 1.0f - rho;
  if (momentum > 0.0f) {
    for (size_t i = 0; i < n; i++) {
      float gi = g[i];
      float vi = rho * v[i] + c * gi * gi;
      v[i] = vi;
      float mi = momentum * m[i] + lr * gi / sqrtf(vi + eps);
      m[i] = mi;
      w[i] -= mi;
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      float gi = g[i];
      float vi = rho * v[i] + c * gi * gi;
      v[i] = vi;
      w[i] -= lr * gi / sqrtf(vi + eps);
    }
  }
}
