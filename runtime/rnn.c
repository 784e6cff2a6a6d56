// rnn.c: the CPU kernels of issue 11's recurrent layers (kdrt_recur,
// kdrt_recur_grad, kdrt_reverse). The records they read and write, and the
// cell math, are kdrt_rnn.h's; the CUDA versions are cuda/rnn.cu.
//
// One call is one step t: the generated program loops over the steps. A
// step's recurrent product of every row (this rank's rows of the batch) is
// one strided GEMM (kdrt_matmul: the rows of one step are T * width floats
// apart in the records), then the cell runs on every (row, unit). The
// gradient walks the steps backwards (t from T - 1 down): the
// gradient of h at step t is the output's, plus d rec of step t + 1 times
// R^T (one GEMM), plus what the cell of step t + 1 passes on directly.
// GRU_V1 (reset_after=False) has a second product in each step, (r * h) .
// R_h, and so a second one in its gradient, d (r * h) = dph . R_h^T.
#include "kdrt.h"
#include "kdrt_rnn.h"

#include <string.h>

// The cells of a step's rows run on the rank's OpenMP threads when there
// is enough of them (each (row, unit) is independent, so the numbers do not
// depend on the thread count).
#define RNN_PAR_FOR(B, U) _Pragma("omp parallel for schedule(static) if ((B) * (U) >= 4096)")

// out[.., i, ..] = in[.., mid - 1 - i, ..]: dim `mid` reversed (go_backwards).
void kdrt_reverse(float *out, const float *in, int64_t outer, int64_t mid, int64_t inner) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < mid; i++)
      memcpy(out + (o * mid + i) * inner, in + (o * mid + mid - 1 - i) * inner,
             sizeof(float) * (size_t)inner);
}

// Step t of y[B, T, width], the record of the recurrence over xw[B, T,
// G * U] with the recurrent kernel r[U, G * U] (and GRU's recurrent bias
// brec[3U], or NULL), from step t - 1 (t = 0: a zero state).
void kdrt_recur(int cell, int act, int ract, float *y, const float *xw, const float *r,
                const float *brec, int64_t B, int64_t T, int64_t U, int64_t t) {
  const int64_t S = kdrt_rnn_width(cell, U), GU = kdrt_rnn_gates(cell) * U;
  const int64_t at = kdrt_rnn_rec_at(cell, U), HC = kdrt_rnn_hcols(cell, U);
  // h_prev . R into the slot at `at` of every row of a step: beta 1 adds it
  // to what the slot holds (xw, or the recurrent bias); GRU_V1's second,
  // (r * h_prev) . R_h, into the slot's last U
  const kdrt_gemm g = {KDRT_NOTRANS, KDRT_NOTRANS, 1, B, HC, U, T * S, GU, T * S, 0, 0, 0};
  const kdrt_gemm g2 = {KDRT_NOTRANS, KDRT_NOTRANS, 1, B, U, U, T * S, GU, T * S, 0, 0, 0};
  RNN_PAR_FOR(B, U)
  for (int64_t b = 0; b < B; b++) {
    float *rec = y + (b * T + t) * S;
    const float *x = xw + (b * T + t) * GU;
    if (t) memcpy(rec + U, rec - S, sizeof(float) * (size_t)U);
    else memset(rec + U, 0, sizeof(float) * (size_t)U);
    if (kdrt_rnn_is_gru(cell) && brec) memcpy(rec + at, brec, sizeof(float) * (size_t)GU);
    else if (kdrt_rnn_is_gru(cell)) memset(rec + at, 0, sizeof(float) * (size_t)GU);
    else memcpy(rec + at, x, sizeof(float) * (size_t)GU);
  }
  if (t) kdrt_matmul(&g, 1.0f, y + t * S + U, r, 1.0f, y + t * S + at);
  if (cell == KDRT_RNN_GRU_V1) { // r * h_prev (0 first), then its product
    RNN_PAR_FOR(B, U)
    for (int64_t b = 0; b < B; b++)
      for (int64_t j = 0; j < U; j++)
        kdrt_rnn_reset(ract, y + (b * T + t) * S, xw + (b * T + t) * GU, U, j);
    if (t) kdrt_matmul(&g2, 1.0f, y + t * S + 8 * U, r + 2 * U, 0.0f, y + t * S + at + 2 * U);
  }
  RNN_PAR_FOR(B, U)
  for (int64_t b = 0; b < B; b++) {
    float *rec = y + (b * T + t) * S;
    const float *x = xw + (b * T + t) * GU;
    const float *cprev = cell == KDRT_RNN_LSTM && t ? rec - S + 2 * U : NULL;
    for (int64_t j = 0; j < U; j++) kdrt_rnn_cell(cell, act, ract, rec, x, cprev, U, j);
  }
}

// Step t of d[B, T, grad width], the gradient record of kdrt_recur's, from
// dy[B, T, width] (the gradient of its record: only the h slot is read), y
// and step t + 1 of d (none at the last step).
void kdrt_recur_grad(int cell, int act, int ract, float *d, const float *dy, const float *y,
                     const float *r, int64_t B, int64_t T, int64_t U, int64_t t) {
  const int64_t S = kdrt_rnn_width(cell, U), W = kdrt_rnn_grad_width(cell, U);
  const int64_t GU = kdrt_rnn_gates(cell) * U, dh = kdrt_rnn_dh_at(cell, U);
  const int64_t drec = kdrt_rnn_drec_at(cell, U), HC = kdrt_rnn_hcols(cell, U);
  // dh of step t += d rec of step t + 1 . R^T (of the columns that multiply
  // h); GRU_V1: d (r * h_prev) = dph . R_h^T
  const kdrt_gemm g = {KDRT_NOTRANS, KDRT_TRANS, 1, B, U, HC, T * W, GU, T * W, 0, 0, 0};
  const kdrt_gemm g2 = {KDRT_NOTRANS, KDRT_TRANS, 1, B, U, U, T * W, GU, T * W, 0, 0, 0};
  for (int64_t b = 0; b < B; b++)
    memcpy(d + (b * T + t) * W + dh, dy + (b * T + t) * S, sizeof(float) * (size_t)U);
  if (t + 1 < T) kdrt_matmul(&g, 1.0f, d + (t + 1) * W + drec, r, 1.0f, d + t * W + dh);
  RNN_PAR_FOR(B, U)
  for (int64_t b = 0; b < B; b++) {
    const float *rec = y + (b * T + t) * S;
    const float *next = t + 1 < T ? rec + S : NULL;
    const float *cprev = cell == KDRT_RNN_LSTM && t ? rec - S + 2 * U : NULL;
    float *db = d + (b * T + t) * W;
    for (int64_t j = 0; j < U; j++)
      kdrt_rnn_cell_grad(cell, act, ract, db, rec, next, next ? db + W : NULL, cprev, U, j);
  }
  if (cell != KDRT_RNN_GRU_V1) return;
  kdrt_matmul(&g2, 1.0f, d + t * W + 2 * U, r + 2 * U, 0.0f, d + t * W + 7 * U);
  RNN_PAR_FOR(B, U)
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < U; j++)
      kdrt_rnn_reset_grad(ract, d + (b * T + t) * W, y + (b * T + t) * S, U, j);
}
