// rnn.cu: issue 11's recurrent layers on the GPU, as ../rnn.c: one call a
// step (the generated program loops), a kernel that prepares the records'
// rows, one cuBLAS product for the recurrent term (kdrt_cuda_matmul,
// strided rows) and a kernel running kdrt_rnn.h's cell on every (row, unit).
#include "common.cuh"
#include "kdrt_rnn.h"

// Step t's record rows: h_prev (h of the step before, or zeros) and the
// slot the recurrent product is added to (xw, GRU's recurrent bias, or 0).
__global__ static void recur_prep_kernel(int cell, float *y, const float *xw, const float *brec,
                                         int64_t B, int64_t T, int64_t U, int64_t t) {
  const int64_t S = kdrt_rnn_width(cell, U), GU = kdrt_rnn_gates(cell) * U;
  const int64_t at = kdrt_rnn_rec_at(cell, U);
  KDRT_FOR(e, (size_t)(B * GU)) {
    int64_t b = (int64_t)e / GU, k = (int64_t)e % GU;
    float *rec = y + (b * T + t) * S;
    if (k < U) rec[U + k] = t ? rec[k - S] : 0.0f;
    rec[at + k] = !kdrt_rnn_is_gru(cell) ? xw[(b * T + t) * GU + k] : brec ? brec[k] : 0.0f;
  }
}

__global__ static void recur_cell_kernel(int cell, int act, int ract, float *y, const float *xw,
                                         int64_t B, int64_t T, int64_t U, int64_t t) {
  const int64_t S = kdrt_rnn_width(cell, U), GU = kdrt_rnn_gates(cell) * U;
  KDRT_FOR(e, (size_t)(B * U)) {
    int64_t b = (int64_t)e / U, j = (int64_t)e % U;
    float *rec = y + (b * T + t) * S;
    const float *cprev = cell == KDRT_RNN_LSTM && t ? rec - S + 2 * U : NULL;
    kdrt_rnn_cell(cell, act, ract, rec, xw + (b * T + t) * GU, cprev, U, j);
  }
}

// GRU_V1: r * h_prev in y, before the step's second product; or (dx
// non-NULL) r's gradient in dx, after d (r * h_prev).
__global__ static void recur_reset_kernel(int ract, float *y, float *dx, const float *xw,
                                          int64_t B, int64_t T, int64_t U, int64_t t) {
  const int64_t S = kdrt_rnn_width(KDRT_RNN_GRU_V1, U), GU = 3 * U;
  const int64_t W = kdrt_rnn_grad_width(KDRT_RNN_GRU_V1, U);
  KDRT_FOR(e, (size_t)(B * U)) {
    int64_t b = (int64_t)e / U, j = (int64_t)e % U;
    if (dx) kdrt_rnn_reset_grad(ract, dx + (b * T + t) * W, y + (b * T + t) * S, U, j);
    else kdrt_rnn_reset(ract, y + (b * T + t) * S, xw + (b * T + t) * GU, U, j);
  }
}

extern "C" void kdrt_cuda_recur(kdrt_cuda *d, int cell, int act, int ract, float *y,
                                const float *xw, const float *r, const float *brec, int64_t B,
                                int64_t T, int64_t U, int64_t t) {
  if (!B || !T) return;
  const int64_t S = kdrt_rnn_width(cell, U), GU = kdrt_rnn_gates(cell) * U;
  const int64_t at = kdrt_rnn_rec_at(cell, U), HC = kdrt_rnn_hcols(cell, U);
  const kdrt_gemm g = {KDRT_NOTRANS, KDRT_NOTRANS, 1, B, HC, U, T * S, GU, T * S, 0, 0, 0};
  const kdrt_gemm g2 = {KDRT_NOTRANS, KDRT_NOTRANS, 1, B, U, U, T * S, GU, T * S, 0, 0, 0};
  recur_prep_kernel<<<kdrt_blocks((size_t)(B * GU)), KDRT_THREADS, 0, d->impl->stream>>>(
      cell, y, xw, brec, B, T, U, t);
  KDRT_LAUNCHED(d, "recur_prep_kernel");
  if (t) kdrt_cuda_matmul(d, &g, 1.0f, y + t * S + U, r, 1.0f, y + t * S + at);
  if (cell == KDRT_RNN_GRU_V1) {
    recur_reset_kernel<<<kdrt_blocks((size_t)(B * U)), KDRT_THREADS, 0, d->impl->stream>>>(
        ract, y, NULL, xw, B, T, U, t);
    KDRT_LAUNCHED(d, "recur_reset_kernel");
    if (t) kdrt_cuda_matmul(d, &g2, 1.0f, y + t * S + 8 * U, r + 2 * U, 0.0f, y + t * S + at + 2 * U);
  }
  recur_cell_kernel<<<kdrt_blocks((size_t)(B * U)), KDRT_THREADS, 0, d->impl->stream>>>(
      cell, act, ract, y, xw, B, T, U, t);
  KDRT_LAUNCHED(d, "recur_cell_kernel");
}

// Step t's gradient of h from the output's (the h slot of dy).
__global__ static void recur_dh_kernel(int cell, float *dx, const float *dy, int64_t B,
                                       int64_t T, int64_t U, int64_t t) {
  const int64_t S = kdrt_rnn_width(cell, U), W = kdrt_rnn_grad_width(cell, U);
  const int64_t dh = kdrt_rnn_dh_at(cell, U);
  KDRT_FOR(e, (size_t)(B * U)) {
    int64_t b = (int64_t)e / U, j = (int64_t)e % U;
    dx[(b * T + t) * W + dh + j] = dy[(b * T + t) * S + j];
  }
}

__global__ static void recur_cell_grad_kernel(int cell, int act, int ract, float *dx,
                                              const float *y, int64_t B, int64_t T, int64_t U,
                                              int64_t t) {
  const int64_t S = kdrt_rnn_width(cell, U), W = kdrt_rnn_grad_width(cell, U);
  KDRT_FOR(e, (size_t)(B * U)) {
    int64_t b = (int64_t)e / U, j = (int64_t)e % U;
    const float *rec = y + (b * T + t) * S, *next = t + 1 < T ? rec + S : NULL;
    const float *cprev = cell == KDRT_RNN_LSTM && t ? rec - S + 2 * U : NULL;
    float *db = dx + (b * T + t) * W;
    kdrt_rnn_cell_grad(cell, act, ract, db, rec, next, next ? db + W : NULL, cprev, U, j);
  }
}

extern "C" void kdrt_cuda_recur_grad(kdrt_cuda *d, int cell, int act, int ract, float *dx,
                                     const float *dy, const float *y, const float *r, int64_t B,
                                     int64_t T, int64_t U, int64_t t) {
  if (!B || !T) return;
  const int64_t W = kdrt_rnn_grad_width(cell, U), GU = kdrt_rnn_gates(cell) * U;
  const int64_t dh = kdrt_rnn_dh_at(cell, U), drec = kdrt_rnn_drec_at(cell, U);
  const int64_t HC = kdrt_rnn_hcols(cell, U);
  const kdrt_gemm g = {KDRT_NOTRANS, KDRT_TRANS, 1, B, U, HC, T * W, GU, T * W, 0, 0, 0};
  const kdrt_gemm g2 = {KDRT_NOTRANS, KDRT_TRANS, 1, B, U, U, T * W, GU, T * W, 0, 0, 0};
  recur_dh_kernel<<<kdrt_blocks((size_t)(B * U)), KDRT_THREADS, 0, d->impl->stream>>>(
      cell, dx, dy, B, T, U, t);
  KDRT_LAUNCHED(d, "recur_dh_kernel");
  if (t + 1 < T) kdrt_cuda_matmul(d, &g, 1.0f, dx + (t + 1) * W + drec, r, 1.0f, dx + t * W + dh);
  recur_cell_grad_kernel<<<kdrt_blocks((size_t)(B * U)), KDRT_THREADS, 0, d->impl->stream>>>(
      cell, act, ract, dx, y, B, T, U, t);
  KDRT_LAUNCHED(d, "recur_cell_grad_kernel");
  if (cell != KDRT_RNN_GRU_V1) return;
  kdrt_cuda_matmul(d, &g2, 1.0f, dx + t * W + 2 * U, r + 2 * U, 0.0f, dx + t * W + 7 * U);
  recur_reset_kernel<<<kdrt_blocks((size_t)(B * U)), KDRT_THREADS, 0, d->impl->stream>>>(
      ract, (float *)y, dx, NULL, B, T, U, t); // y only read here
  KDRT_LAUNCHED(d, "recur_reset_kernel");
}

__global__ static void reverse_kernel(float *out, const float *in, int64_t outer, int64_t mid,
                                      int64_t inner) {
  KDRT_FOR(e, (size_t)(outer * mid * inner)) {
    int64_t k = (int64_t)e % inner, i = (int64_t)e / inner % mid, o = (int64_t)e / inner / mid;
    out[e] = in[(o * mid + mid - 1 - i) * inner + k];
  }
}

extern "C" void kdrt_cuda_reverse(kdrt_cuda *d, float *out, const float *in, int64_t outer,
                                  int64_t mid, int64_t inner) {
  size_t n = (size_t)(outer * mid * inner);
  if (!n) return;
  reverse_kernel<<<kdrt_blocks(n), KDRT_THREADS, 0, d->impl->stream>>>(out, in, outer, mid, inner);
  KDRT_LAUNCHED(d, "reverse_kernel");
}
