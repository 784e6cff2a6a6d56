// maxpool.cu: max pooling over [B,H,W,C] and its gradient, as ../ops.c:
// padding never wins, the gradient goes to the first maximum of each
// window in row-major window order. The window arithmetic is
// ../kdrt_ops.h's (kdrt_win_range, kdrt_win_outs), shared with the CPU.
//
// The gradient is a gather: one thread per input element walks the
// windows that contain it, (oh, ow) ascending as the CPU does, recomputes
// each window's first maximum and adds dy where that is this element. No
// atomics, and the same sums in the same order as the CPU.
#include "common.cuh"

typedef struct {
  int B, H, W, C, PH, PW, sh, sw, pad_t, pad_l, OH, OW;
} pool_geom;

__global__ static void maxpool_kernel(float *y, const float *x, pool_geom g) {
  size_t n = (size_t)g.B * g.OH * g.OW * g.C;
  KDRT_FOR(e, n) {
    int c = (int)(e % g.C), ow = (int)(e / g.C % g.OW), oh = (int)(e / ((size_t)g.C * g.OW) % g.OH);
    int b = (int)(e / ((size_t)g.C * g.OW * g.OH));
    int ih0, phl, phh, iw0, pwl, pwh;
    kdrt_win_range(oh, g.sh, g.pad_t, g.PH, g.H, &ih0, &phl, &phh);
    kdrt_win_range(ow, g.sw, g.pad_l, g.PW, g.W, &iw0, &pwl, &pwh);
    if (phl == phh || pwl == pwh) {
      y[e] = 0.0f;
      continue;
    }
    const float *xb = x + (size_t)b * g.H * g.W * g.C + c;
    float m = xb[((size_t)(ih0 + phl) * g.W + iw0 + pwl) * g.C];
    for (int ph = phl; ph < phh; ph++)
      for (int pw = pwl; pw < pwh; pw++) {
        float v = xb[((size_t)(ih0 + ph) * g.W + iw0 + pw) * g.C];
        m = v > m ? v : m;
      }
    y[e] = m;
  }
}

__global__ static void maxpool_grad_kernel(float *dx, const float *dy, const float *x,
                                           pool_geom g) {
  size_t n = (size_t)g.B * g.H * g.W * g.C;
  KDRT_FOR(e, n) {
    int c = (int)(e % g.C), iw = (int)(e / g.C % g.W), ih = (int)(e / ((size_t)g.C * g.W) % g.H);
    int b = (int)(e / ((size_t)g.C * g.W * g.H));
    const float *xb = x + (size_t)b * g.H * g.W * g.C + c;
    const int me = ih * g.W + iw;
    int oh_lo, oh_hi, ow_lo, ow_hi; // the windows that hold (ih, iw)
    kdrt_win_outs(ih, g.sh, g.pad_t, g.PH, g.OH, &oh_lo, &oh_hi);
    kdrt_win_outs(iw, g.sw, g.pad_l, g.PW, g.OW, &ow_lo, &ow_hi);
    float s = 0.0f;
    for (int oh = oh_lo; oh <= oh_hi; oh++) {
      int ih0, phl, phh;
      kdrt_win_range(oh, g.sh, g.pad_t, g.PH, g.H, &ih0, &phl, &phh);
      for (int ow = ow_lo; ow <= ow_hi; ow++) {
        int iw0, pwl, pwh;
        kdrt_win_range(ow, g.sw, g.pad_l, g.PW, g.W, &iw0, &pwl, &pwh);
        if (phl == phh || pwl == pwh) continue;
        int p0 = (ih0 + phl) * g.W + iw0 + pwl, pos = p0;
        float best = xb[(size_t)p0 * g.C];
        for (int ph = phl; ph < phh; ph++)
          for (int pw = pwl; pw < pwh; pw++) {
            int p = (ih0 + ph) * g.W + iw0 + pw;
            float v = xb[(size_t)p * g.C];
            if (v > best) best = v, pos = p; // strict: the first maximum wins
          }
        if (pos == me) s += dy[(((size_t)b * g.OH + oh) * g.OW + ow) * g.C + c];
      }
    }
    dx[e] = s;
  }
}

static pool_geom geom(const kdrt_window *w) {
  pool_geom g = {w->B, w->H, w->W, w->C, w->KH, w->KW, w->sh, w->sw, w->pad_t, w->pad_l, w->OH, w->OW};
  return g;
}

extern "C" void kdrt_cuda_maxpool(kdrt_cuda *d, const kdrt_window *w, float *y, const float *x) {
  pool_geom g = geom(w);
  size_t n = (size_t)w->B * w->OH * w->OW * w->C;
  if (!n) return;
  maxpool_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(y, x, g);
  KDRT_LAUNCHED(d, "maxpool_kernel");
}

extern "C" void kdrt_cuda_maxpool_grad(kdrt_cuda *d, const kdrt_window *w, float *dx,
                                       const float *dy, const float *x) {
  pool_geom g = geom(w);
  size_t n = (size_t)w->B * w->H * w->W * w->C;
  if (!n) return;
  maxpool_grad_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(dx, dy, x, g);
  KDRT_LAUNCHED(d, "maxpool_grad_kernel");
}
