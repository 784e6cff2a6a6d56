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

// cols [G][B*OH*OW, KH*KW*cg]: entry e is group j's row m, column (kh, kw, c);
// T: float, or (issue 23, conv2d16) a 16-bit value's bits, copied.
template <typename T>
__global__ static void im2col_kernel(T *cols, const T *x, conv_geom g) {
  size_t kc = (size_t)g.KH * g.KW * g.cg, M = (size_t)g.B * g.OH * g.OW;
  size_t n = (size_t)g.G * M * kc;
  KDRT_FOR(e, n) {
    size_t j = e / (M * kc), m = e / kc % M, k = e % kc;
    int c = (int)(k % g.cg), kw = (int)(k / g.cg % g.KW), kh = (int)(k / ((size_t)g.cg * g.KW));
    int ow = (int)(m % g.OW), oh = (int)(m / g.OW % g.OH), b = (int)(m / ((size_t)g.OW * g.OH));
    int ih = kdrt_conv_at(oh, kh, g.sh, g.pad_t, g.dh, g.H);
    int iw = kdrt_conv_at(ow, kw, g.sw, g.pad_l, g.dw, g.W);
    cols[e] = ih >= 0 && iw >= 0 ? x[(((size_t)b * g.H + ih) * g.W + iw) * g.C + j * g.cg + c]
                                 : (T)0;
  }
}

// dx of images [b0, b1) from the columns' rows [m0, m1) (cols holds those,
// group by group): each element adds its entries in range to what the rows
// before m0 gave it (0 where its image begins in range), in the order of
// one whole pass (issue 23: conv2d16's input gradient, a chunk at a time).
__global__ static void col2im_kernel(float *dx, const float *cols, conv_geom g, size_t m0,
                                     size_t m1, int b0, int b1) {
  size_t kc = (size_t)g.KH * g.KW * g.cg, M = m1 - m0, px = (size_t)g.OH * g.OW;
  size_t n = (size_t)(b1 - b0) * g.H * g.W * g.C;
  KDRT_FOR(i, n) {
    size_t e = i + (size_t)b0 * g.H * g.W * g.C;
    int c = (int)(e % g.C), iw = (int)(e / g.C % g.W), ih = (int)(e / ((size_t)g.C * g.W) % g.H);
    int b = (int)(e / ((size_t)g.C * g.W * g.H));
    const float *gc = cols + (size_t)(c / g.cg) * M * kc; // its group's matrix
    c %= g.cg;
    float s = m0 <= (size_t)b * px ? 0.0f : dx[e];
    for (int kh = g.KH - 1; kh >= 0; kh--) {
      int oh = kdrt_conv_from(ih, kh, g.sh, g.pad_t, g.dh, g.OH);
      if (oh < 0) continue;
      for (int kw = g.KW - 1; kw >= 0; kw--) {
        int ow = kdrt_conv_from(iw, kw, g.sw, g.pad_l, g.dw, g.OW);
        if (ow < 0) continue;
        size_t m = ((size_t)b * g.OH + oh) * g.OW + ow;
        if (m < m0 || m >= m1) continue;
        s += gc[(m - m0) * kc + ((size_t)kh * g.KW + kw) * g.cg + c];
      }
    }
    dx[e] = s;
  }
}

// col2im_kernel over the rows [m0, m1) (all of them: m0 0, m1 B*OH*OW).
static void col2im(kdrt_cuda *d, const kdrt_window *w, float *dx, const float *cols, size_t m0,
                   size_t m1);

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

static void col2im(kdrt_cuda *d, const kdrt_window *w, float *dx, const float *cols, size_t m0,
                   size_t m1) {
  size_t px = (size_t)w->OH * w->OW;
  int b0 = px ? (int)(m0 / px) : 0, b1 = px ? (int)((m1 + px - 1) / px) : w->B;
  size_t n = (size_t)(b1 - b0) * w->H * w->W * w->C;
  if (!n) return;
  col2im_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(dx, cols, geom(w), m0, m1,
                                                                       b0, b1);
  KDRT_LAUNCHED(d, "col2im_kernel");
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
  if (!kdrt_conv_pointwise(w)) col2im(d, w, dx, scratch, 0, (size_t)w->B * w->OH * w->OW);
}

extern "C" void kdrt_cuda_conv2d_dw(kdrt_cuda *d, const kdrt_window *w, float *dw,
                                    const float *x, const float *dy, float *scratch) {
  if (kdrt_cudnn_conv(d, KDRT_CONV_DW, w, dw, x, dy)) return;
  const kdrt_gemm p = kdrt_conv_gemm(w, KDRT_CONV_DW);
  kdrt_cuda_matmul(d, &p, 1.0f, conv_cols(d, w, x, scratch), dy, 0.0f, dw);
}

// issue 23: a conv of 16-bit values (../ops.c's kdrt_conv2d16, the same
// steps and scratch): an _EXACT operand's 16 bits, 16-bit columns, cuBLAS's
// 16-bit product with float32 sums (kdrt_cuda_matmul16); DX's float32
// columns a chunk of rows at a time, each added back into dx in order. Not
// cuDNN's (KDRT_CUDA_CUDNN=1 leaves these to this path).
static const uint16_t *bits16(kdrt_cuda *d, int kind, int form, const void *a, float *to,
                              size_t n) {
  if (form == KDRT_OPND_16) return (const uint16_t *)a;
  kdrt_cuda_pack16(d, kind, (uint16_t *)to, (const float *)a, n);
  return (const uint16_t *)to;
}

extern "C" void kdrt_cuda_conv2d16(kdrt_cuda *d, const kdrt_window *w, int pass, int kind,
                                   int fa, const void *a, int fb, const void *b, float *out,
                                   float *scratch, float *widen) {
  (void)widen; // (the CPU's: cuBLAS takes the 16-bit operands as they are)
  int64_t part[KDRT_C16_PARTS];
  kdrt_conv16_scratch(w, pass, fa, fb, part);
  const int pw = kdrt_conv_pointwise(w);
  const size_t M = (size_t)w->B * w->OH * w->OW;
  const kdrt_gemm p = kdrt_conv_gemm(w, pass);
  if (pass == KDRT_CONV_DX) {
    const uint16_t *dy = bits16(d, kind, fa, a, scratch + part[KDRT_C16_DY], M * w->K);
    if (pw) {
      kdrt_cuda_matmul16(d, &p, kind, KDRT_OPND_16, dy, fb, b, out, NULL);
      return;
    }
    float *dcols = scratch + part[KDRT_C16_DCOLS];
    kdrt_gemm pc;
    for (int64_t m0 = 0, m1; kdrt_conv16_chunk(w, m0, &m1, &pc); m0 = m1) {
      kdrt_cuda_matmul16(d, &pc, kind, KDRT_OPND_16, dy + m0 * w->K, fb, b, dcols, NULL);
      col2im(d, w, out, dcols, (size_t)m0, (size_t)m1);
      if (m1 == m0) break;
    }
    return;
  }
  const uint16_t *x = bits16(d, kind, fa, a, scratch + part[KDRT_C16_X],
                             (size_t)w->B * w->H * w->W * w->C);
  const uint16_t *cols = x;
  if (!pw) {
    uint16_t *c16 = (uint16_t *)(scratch + part[KDRT_C16_COLS]);
    conv_geom g = geom(w);
    size_t n = M * w->KH * w->KW * w->C;
    if (n) {
      im2col_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(c16, x, g);
      KDRT_LAUNCHED(d, "im2col_kernel");
    }
    cols = c16;
  }
  if (pass == KDRT_CONV_Y) {
    kdrt_cuda_matmul16(d, &p, kind, KDRT_OPND_16, cols, fb, b, out, NULL);
    return;
  }
  const uint16_t *dy = bits16(d, kind, fb, b, scratch + part[KDRT_C16_DY], M * w->K);
  kdrt_cuda_matmul16(d, &p, kind, KDRT_OPND_16, cols, KDRT_OPND_16, dy, out, NULL);
}
