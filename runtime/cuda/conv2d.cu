// conv2d.cu: Conv2D, channels last, as ../ops.c lowers it: the input as a
// [B*OH*OW, KH*KW*C] matrix in the caller's scratch (im2col), then one GEMM
// with the [KH*KW*C, K] filter; the input gradient is one GEMM into the
// scratch, then col2im. A 1x1, stride 1, unpadded conv uses x directly.
//
// col2im is a gather (one thread per input element adds the entries that
// came from it) rather than a scatter, so it needs no atomics and adds in
// the CPU's order: windows by (oh, ow) ascending, i.e. kh then kw descending.
#include "common.cuh"

typedef struct {
  int B, H, W, C, KH, KW, sh, sw, pad_t, pad_l, OH, OW;
  int dh, dw; // the kernel's dilation (1: none)
} conv_geom;

static int pointwise(const conv_geom &g) {
  return g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.pad_t == 0 && g.pad_l == 0 &&
         g.OH == g.H && g.OW == g.W;
}

__global__ static void im2col_kernel(float *cols, const float *x, conv_geom g) {
  size_t kc = (size_t)g.KH * g.KW * g.C;
  size_t n = (size_t)g.B * g.OH * g.OW * kc;
  KDRT_FOR(e, n) {
    size_t m = e / kc, k = e % kc;
    int c = (int)(k % g.C), kw = (int)(k / g.C % g.KW), kh = (int)(k / ((size_t)g.C * g.KW));
    int ow = (int)(m % g.OW), oh = (int)(m / g.OW % g.OH), b = (int)(m / ((size_t)g.OW * g.OH));
    int ih = oh * g.sh - g.pad_t + kh * g.dh, iw = ow * g.sw - g.pad_l + kw * g.dw;
    cols[e] = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W
                  ? x[(((size_t)b * g.H + ih) * g.W + iw) * g.C + c]
                  : 0.0f;
  }
}

__global__ static void col2im_kernel(float *dx, const float *cols, conv_geom g) {
  size_t kc = (size_t)g.KH * g.KW * g.C;
  size_t n = (size_t)g.B * g.H * g.W * g.C;
  KDRT_FOR(e, n) {
    int c = (int)(e % g.C), iw = (int)(e / g.C % g.W), ih = (int)(e / ((size_t)g.C * g.W) % g.H);
    int b = (int)(e / ((size_t)g.C * g.W * g.H));
    float s = 0.0f;
    for (int kh = g.KH - 1; kh >= 0; kh--) {
      int t = ih + g.pad_t - kh * g.dh;
      if (t < 0 || t % g.sh) continue;
      int oh = t / g.sh;
      if (oh >= g.OH) continue;
      for (int kw = g.KW - 1; kw >= 0; kw--) {
        int u = iw + g.pad_l - kw * g.dw;
        if (u < 0 || u % g.sw) continue;
        int ow = u / g.sw;
        if (ow >= g.OW) continue;
        size_t m = ((size_t)b * g.OH + oh) * g.OW + ow;
        s += cols[m * kc + ((size_t)kh * g.KW + kw) * g.C + c];
      }
    }
    dx[e] = s;
  }
}

static conv_geom geom(const kdrt_window *w) {
  conv_geom g = {w->B,  w->H,  w->W,     w->C,     w->KH, w->KW,          w->sh,
                 w->sw, w->pad_t, w->pad_l, w->OH, w->OW, w->dil_h + 1, w->dil_w + 1};
  return g;
}

static void im2col(kdrt_cuda *d, float *cols, const float *x, const conv_geom &g) {
  size_t n = (size_t)g.B * g.OH * g.OW * g.KH * g.KW * g.C;
  if (!n) return;
  im2col_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(cols, x, g);
  KDRT_LAUNCHED(d, "im2col_kernel");
}

// One product c[M, N] = op(a) @ op(b), alpha 1, beta 0.
static void gemm(kdrt_cuda *d, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc) {
  kdrt_gemm g = {ta, tb, 1, M, N, K, lda, ldb, ldc, 0, 0, 0};
  kdrt_cuda_matmul(d, &g, 1.0f, a, b, 0.0f, c);
}

extern "C" void kdrt_cuda_conv2d(kdrt_cuda *d, const kdrt_window *w, float *y, const float *x,
                                 const float *f, float *scratch) {
  conv_geom g = geom(w);
  int64_t M = (int64_t)w->B * w->OH * w->OW, KC = (int64_t)w->KH * w->KW * w->C, K = w->K;
  const float *cols = x;
  if (!pointwise(g)) {
    im2col(d, scratch, x, g);
    cols = scratch;
  }
  gemm(d, KDRT_NOTRANS, KDRT_NOTRANS, M, K, KC, cols, KC, f, K, y, K); // y[M,K] = cols @ f
}

extern "C" void kdrt_cuda_conv2d_dx(kdrt_cuda *d, const kdrt_window *w, float *dx,
                                    const float *dy, const float *f, float *scratch) {
  conv_geom g = geom(w);
  int64_t M = (int64_t)w->B * w->OH * w->OW, KC = (int64_t)w->KH * w->KW * w->C, K = w->K;
  if (pointwise(g)) { // dx[M,C] = dy[M,K] @ f[C,K]^T
    gemm(d, KDRT_NOTRANS, KDRT_TRANS, M, KC, K, dy, K, f, K, dx, KC);
    return;
  }
  gemm(d, KDRT_NOTRANS, KDRT_TRANS, M, KC, K, dy, K, f, K, scratch, KC); // dcols = dy @ f^T
  size_t n = (size_t)w->B * w->H * w->W * w->C;
  if (!n) return;
  col2im_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(dx, scratch, g);
  KDRT_LAUNCHED(d, "col2im_kernel");
}

extern "C" void kdrt_cuda_conv2d_dw(kdrt_cuda *d, const kdrt_window *w, float *dw,
                                    const float *x, const float *dy, float *scratch) {
  conv_geom g = geom(w);
  int64_t M = (int64_t)w->B * w->OH * w->OW, KC = (int64_t)w->KH * w->KW * w->C, K = w->K;
  const float *cols = x;
  if (!pointwise(g)) {
    im2col(d, scratch, x, g);
    cols = scratch;
  }
  gemm(d, KDRT_TRANS, KDRT_NOTRANS, KC, K, M, cols, KC, dy, K, dw, K); // dw[KC,K] = cols^T @ dy
}
