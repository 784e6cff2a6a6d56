// kdrt_rnn.h: the cell math of issue 11's recurrent layers (SimpleRNN, LSTM,
// GRU), written once for the CPU runtime (rnn.c) and the CUDA one
// (cuda/rnn.cu): every function here computes one unit j of one batch row,
// so the CPU loops over (row, unit) and the GPU runs a thread per pair.
// Plain C99 that also compiles as CUDA C++ (KDRT_HD marks host and device).
//
// A recurrent layer runs as two ops (kdcc's RECUR and RECUR_GRAD): the
// input projection xw = x . kernel + bias for every step is a DOT before
// them; the recurrence reads it step by step. Keras's gate orders: LSTM
// i, f, c, o; GRU z, r, h (reset_after: the recurrent bias is kept apart
// and the reset gate multiplies the recurrent part, h . R_h + b_h; GRU_V1,
// reset_after=False: it multiplies h before, (r * h) . R_h, a second
// product in each step).
//
// The record RECUR writes, per batch row and step, `kdrt_rnn_width` floats:
//   [0, U)    h, the output
//   [U, 2U)   h of the step before (zeros first): the recurrent kernel's
//             gradient is h_prev^T . drec over every row and step
//   SimpleRNN [2U, 3U)  z = xw + h_prev . R, before the activation
//   LSTM      [2U, 3U)  c, the carry; [3U, 7U) z = xw + h_prev . R
//   GRU       [2U, 5U)  the pre-activations of z, r and the candidate;
//             [5U, 8U)  rec = h_prev . R + b_rec
//   GRU_V1    as GRU, rec = (h_prev . R_zr, (r * h_prev) . R_h); [8U, 9U) r * h_prev
// The record RECUR_GRAD writes, per row and step (`kdrt_rnn_grad_width`):
//   SimpleRNN [0, U) dz (= d xw = d rec), [U, 2U) dh, the whole gradient of h
//   LSTM      [0, 4U) dz, [4U, 5U) dh, [5U, 6U) dc, the carry's
//   GRU       [0, 3U) d xw, [3U, 6U) d rec, [6U, 7U) dh
//   GRU_V1    as GRU; [7U, 8U) d (r * h_prev)
#ifndef KDRT_RNN_H
#define KDRT_RNN_H

#include <math.h>
#include <stdint.h>

#include "kdrt_defs.h"

static inline KDRT_HD int kdrt_rnn_is_gru(int cell) {
  return cell == KDRT_RNN_GRU || cell == KDRT_RNN_GRU_V1;
}
// Gates per cell: the width of the kernels' second dim over U.
static inline KDRT_HD int kdrt_rnn_gates(int cell) {
  return cell == KDRT_RNN_LSTM ? 4 : kdrt_rnn_is_gru(cell) ? 3 : 1;
}
static inline KDRT_HD int64_t kdrt_rnn_width(int cell, int64_t U) {
  return (cell == KDRT_RNN_LSTM ? 7 : cell == KDRT_RNN_GRU ? 8 : cell == KDRT_RNN_GRU_V1 ? 9 : 3) * U;
}
static inline KDRT_HD int64_t kdrt_rnn_grad_width(int cell, int64_t U) {
  return (cell == KDRT_RNN_LSTM ? 6 : cell == KDRT_RNN_GRU ? 7 : cell == KDRT_RNN_GRU_V1 ? 8 : 2) * U;
}
// Where the recurrent product goes in the record (z, or GRU's rec), and
// where d rec (the rows that multiply R^T) is in the gradient's.
static inline KDRT_HD int64_t kdrt_rnn_rec_at(int cell, int64_t U) {
  return (cell == KDRT_RNN_LSTM ? 3 : kdrt_rnn_is_gru(cell) ? 5 : 2) * U;
}
static inline KDRT_HD int64_t kdrt_rnn_drec_at(int cell, int64_t U) {
  return kdrt_rnn_is_gru(cell) ? 3 * U : 0;
}
static inline KDRT_HD int64_t kdrt_rnn_dh_at(int cell, int64_t U) {
  return (int64_t)kdrt_rnn_gates(cell) * U * (kdrt_rnn_is_gru(cell) ? 2 : 1);
}
// The columns of R that multiply h_prev itself (GRU_V1: z's and r's only).
static inline KDRT_HD int64_t kdrt_rnn_hcols(int cell, int64_t U) {
  return (cell == KDRT_RNN_GRU_V1 ? 2 : kdrt_rnn_gates(cell)) * U;
}

// f(v) and f'(v, y) of one of KDRT_ACT_LIST's activations.
static inline KDRT_HD float kdrt_rnn_f(int act, float v) {
  switch (act) {
#define KDRT_X(name, kname, from_x, f, df) case KDRT_ACT_##name: return f;
    KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
  }
  return v;
}
static inline KDRT_HD float kdrt_rnn_df(int act, float v, float y) {
  switch (act) {
#define KDRT_X(name, kname, from_x, f, df) case KDRT_ACT_##name: return df;
    KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
  }
  return 1.0f;
}

// One step's unit j of one row: rec points at this row's record for the
// step (the recurrent product already in its slot), xw at its projection,
// cprev at the carry before (LSTM; NULL first).
static inline KDRT_HD void kdrt_rnn_cell(int cell, int act, int ract, float *rec, const float *xw,
                                         const float *cprev, int64_t U, int64_t j) {
  float hp = rec[U + j];
  if (cell == KDRT_RNN_SIMPLE) {
    rec[j] = kdrt_rnn_f(act, rec[2 * U + j]);
  } else if (cell == KDRT_RNN_LSTM) {
    const float *z = rec + 3 * U;
    float i = kdrt_rnn_f(ract, z[j]), f = kdrt_rnn_f(ract, z[U + j]);
    float g = kdrt_rnn_f(act, z[2 * U + j]), o = kdrt_rnn_f(ract, z[3 * U + j]);
    float c = f * (cprev ? cprev[j] : 0.0f) + i * g;
    rec[2 * U + j] = c;
    rec[j] = o * kdrt_rnn_f(act, c);
  } else {
    float *pre = rec + 2 * U;
    const float *r_ = rec + 5 * U;
    pre[j] = xw[j] + r_[j];
    pre[U + j] = xw[U + j] + r_[U + j];
    float z = kdrt_rnn_f(ract, pre[j]), r = kdrt_rnn_f(ract, pre[U + j]);
    pre[2 * U + j] = xw[2 * U + j] + (cell == KDRT_RNN_GRU ? r * r_[2 * U + j] : r_[2 * U + j]);
    float hh = kdrt_rnn_f(act, pre[2 * U + j]);
    rec[j] = z * hp + (1.0f - z) * hh;
  }
}

// GRU_V1, before its second product: r * h_prev of unit j.
static inline KDRT_HD void kdrt_rnn_reset(int ract, float *rec, const float *xw, int64_t U,
                                          int64_t j) {
  rec[8 * U + j] = kdrt_rnn_f(ract, xw[U + j] + rec[6 * U + j]) * rec[U + j];
}

// The gradient of one step's unit j of one row: rec as above; d at this
// row's gradient record for the step, its dh slot already holding the
// gradient from the output and through R from the step after; next / dnext
// the records of the step after (NULL at the last), cprev as above.
static inline KDRT_HD void kdrt_rnn_cell_grad(int cell, int act, int ract, float *d,
                                              const float *rec, const float *next,
                                              const float *dnext, const float *cprev, int64_t U,
                                              int64_t j) {
  if (cell == KDRT_RNN_SIMPLE) {
    d[j] = d[U + j] * kdrt_rnn_df(act, rec[2 * U + j], rec[j]);
  } else if (cell == KDRT_RNN_LSTM) {
    const float *z = rec + 3 * U;
    float i = kdrt_rnn_f(ract, z[j]), f = kdrt_rnn_f(ract, z[U + j]);
    float g = kdrt_rnn_f(act, z[2 * U + j]), o = kdrt_rnn_f(ract, z[3 * U + j]);
    float c = rec[2 * U + j], ac = kdrt_rnn_f(act, c), dh = d[4 * U + j];
    float dc = dh * o * kdrt_rnn_df(act, c, ac);
    if (next) dc += dnext[5 * U + j] * kdrt_rnn_f(ract, next[4 * U + j]); // f of the step after
    d[5 * U + j] = dc;
    d[j] = dc * g * kdrt_rnn_df(ract, z[j], i);
    d[U + j] = dc * (cprev ? cprev[j] : 0.0f) * kdrt_rnn_df(ract, z[U + j], f);
    d[2 * U + j] = dc * i * kdrt_rnn_df(act, z[2 * U + j], g);
    d[3 * U + j] = dh * ac * kdrt_rnn_df(ract, z[3 * U + j], o);
  } else {
    const float *pre = rec + 2 * U, *r_ = rec + 5 * U;
    float dh = d[6 * U + j];
    if (next) dh += dnext[6 * U + j] * kdrt_rnn_f(ract, next[2 * U + j]); // h_prev's share z
    if (next && cell == KDRT_RNN_GRU_V1) // and r * h_prev's
      dh += dnext[7 * U + j] * kdrt_rnn_f(ract, next[3 * U + j]);
    d[6 * U + j] = dh;
    float z = kdrt_rnn_f(ract, pre[j]), r = kdrt_rnn_f(ract, pre[U + j]);
    float hh = kdrt_rnn_f(act, pre[2 * U + j]), hp = rec[U + j];
    float dph = dh * (1.0f - z) * kdrt_rnn_df(act, pre[2 * U + j], hh);
    float dpz = dh * (hp - hh) * kdrt_rnn_df(ract, pre[j], z);
    d[j] = d[3 * U + j] = dpz;
    d[2 * U + j] = dph;
    if (cell == KDRT_RNN_GRU_V1) { // r's gradient needs d (r * h_prev): kdrt_rnn_reset_grad
      d[5 * U + j] = dph;
      return;
    }
    float dpr = dph * r_[2 * U + j] * kdrt_rnn_df(ract, pre[U + j], r);
    d[U + j] = d[4 * U + j] = dpr;
    d[5 * U + j] = dph * r;
  }
}

// GRU_V1, after d (r * h_prev) = dph . R_h^T: r's gradient of unit j.
static inline KDRT_HD void kdrt_rnn_reset_grad(int ract, float *d, const float *rec, int64_t U,
                                               int64_t j) {
  float r = kdrt_rnn_f(ract, rec[3 * U + j]);
  d[U + j] = d[4 * U + j] = d[7 * U + j] * rec[U + j] * kdrt_rnn_df(ract, rec[3 * U + j], r);
}

#endif
