// conv2d.cu: Conv2D, channels last, as ../ops.c lowers it: the input as a
// [B*OH*OW, KH*KW*C] matrix in the caller's scratch (im2col), then one GEMM
// with the [KH*KW*C, K] filter; the input gradient is one GEMM into the
// scratch, then col2im. A 1x1, stride 1, unpadded conv uses x directly.
// With G groups (issue 15) the scratch holds one [B*OH*OW, KH*KW*cg] matrix
// per group, one after the other, and each product is one strided batch of
// G GEMMs, group j's columns of the filter, dy and y starting at j * kg.
//
// col2im is a gather (one thread per input element adds the entries that
// came from it) rather than a scatter, so it needs no atomics and adds in
// the CPU's order: windows by (oh, ow) ascending, i.e. kh then kw descending.
// Where a kernel position reads, and back, is ../kdrt_ops.h's (kdrt_conv_at,
// kdrt_conv_from), shared with the CPU.
//
// issue 22: with KDRT_CUDA_CUDNN=1 each pass goes to cuDNN first
// (cudnn.cu); what it does not take comes here as before.
#include "common.cuh"

typedef struct {
  int B, H, W, C, KH, KW, sh, sw, pad_t, pad_l, OH, OW;
  int dh, dw; // the kernel's dilation (1: none)
  int G, cg;  // groups (1: none), the input channels of one
} conv_geom;

// cols [G][B*OH*OW, KH*KW*cg]: entry e is group j's row m, column (kh, kw, c).
__global__ static void im2col_kernel(float *cols, const float *x, conv_geom g) {
  size_t kc = (size_t)g.KH * g.KW * g.cg, M = (size_t)g.B * g.OH * g.OW;
  size_t n = (size_t)g.G * M * kc;
  KDRT_FOR(e, n) {
    size_t j = e / (M * kc), m = e / kc % M, k = e % kc;
    int c = (int)(k % g.cg), kw = (int)(k / g.cg % g.KW), kh = (int)(k / ((size_t)g.cg * g.KW));
    int ow = (int)(m % g.OW), oh = (int)(m / g.OW % g.OH), b = (int)(m / ((size_t)g.OW * g.OH));
    int ih = kdrt_conv_at(oh, kh, g.sh, g.pad_t, g.dh, g.H);
    int iw = kdrt_conv_at(ow, kw, g.sw, g.pad_l, g.dw, g.W);
    cols[e] = ih >= 0 && iw >= 0 ? x[(((size_t)b * g.H + ih) * g.W + iw) * g.C + j * g.cg + c]
                                 : 0.0f;
  }
}

__global__ static void col2im_kernel(float *dx, const float *cols, conv_geom g) {
  size_t kc = (size_t)g.KH * g.KW * g.cg, M = (size_t)g.B * g.OH * g.OW;
  size_t n = (size_t)g.B * g.H * g.W * g.C;
  KDRT_FOR(e, n) {
    int c = (int)(e % g.C), iw = (int)(e / g.C % g.W), ih = (int)(e / ((size_t)g.C * g.W) % g.H);
    int b = (int)(e / ((size_t)g.C * g.W * g.H));
    const float *gc = cols + (size_t)(c / g.cg) * M * kc; // its group's matrix
    c %= g.cg;
    float s = 0.0f;
    for (int kh = g.KH - 1; kh >= 0; kh--) {
      int oh = kdrt_conv_from(ih, kh, g.sh, g.pad_t, g.dh, g.OH);
      if (oh < 0) continue;
      for (int kw = g.KW - 1; kw >= 0; kw--) {
        int ow = kdrt_conv_from(iw, kw, g.sw, g.pad_l, g.dw, g.OW);
        if (ow < 0) continue;
        size_t m = ((size_t)b * g.OH + oh) * g.OW + ow;
        s += gc[m * kc + ((size_t)kh * g.KW + kw) * g.cg + c];
      }
    }
    dx[e] = s;
  }
}

static conv_geom geom(const kdrt_window *w) {
  int G = kdrt_groups(w);
  conv_geom g = {w->B,     w->H,     w->W,  w->C,  w->KH,         w->KW,         w->sh, w->sw,
                 w->pad_t, w->pad_l, w->OH, w->OW, w->dil_h + 1, w->dil_w + 1, G,     w->C / G};
  return g;
}

// The im2col matrices (conv_cols in ../ops.c): x itself for a pointwise
// conv, else scratch filled from x.
static const float *conv_cols(kdrt_cuda *d, const kdrt_window *w, const float *x,
                              float *scratch) {
  if (kdrt_conv_pointwise(w)) return x;
  conv_geom g = geom(w);
  size_t n = (size_t)g.B * g.OH * g.OW * g.KH * g.KW * g.C;
  if (!n) return scratch;
  im2col_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(scratch, x, g);
  KDRT_LAUNCHED(d, "im2col_kernel");
  return scratch;
}

extern "C" void kdrt_cuda_conv2d(kdrt_cuda *d, const kdrt_window *w, float *y, const float *x,
                                 const float *f, float *scratch) {
  if (kdrt_cudnn_conv(d, KDRT_CONV_Y, w, y, x, f)) return;
  const kdrt_gemm p = kdrt_conv_gemm(w, KDRT_CONV_Y);
  kdrt_cuda_matmul(d, &p, 1.0f, conv_cols(d, w, x, scratch), f, 0.0f, y);
}

extern "C" void kdrt_cuda_conv2d_dx(kdrt_cuda *d, const kdrt_window *w, float *dx,
                                    const float *dy, const float *f, float *scratch) {
  if (kdrt_cudnn_conv(d, KDRT_CONV_DX, w, dx, dy, f)) return;
  // dx itself for a pointwise conv, else scratch gathered back
  const kdrt_gemm p = kdrt_conv_gemm(w, KDRT_CONV_DX);
  kdrt_cuda_matmul(d, &p, 1.0f, dy, f, 0.0f, kdrt_conv_pointwise(w) ? dx : scratch);
  size_t n = (size_t)w->B * w->H * w->W * w->C;
  if (kdrt_conv_pointwise(w) || !n) return;
  col2im_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(dx, scratch, geom(w));
  KDRT_LAUNCHED(d, "col2im_kernel");
}

extern "C" void kdrt_cuda_conv2d_dw(kdrt_cuda *d, const kdrt_window *w, float *dw,
                                    const float *x, const float *dy, float *scratch) {
  if (kdrt_cudnn_conv(d, KDRT_CONV_DW, w, dw, x, dy)) return;
  const kdrt_gemm p = kdrt_conv_gemm(w, KDRT_CONV_DW);
  kdrt_cuda_matmul(d, &p, 1.0f, conv_cols(d, w, x, scratch), dy, 0.0f, dw);
}
