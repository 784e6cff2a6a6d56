// The op table: what every op of the training graph means, which operands
// it is linear in, and its sharding rule as named factors (SHARDING.md).
//
// Ops work on global shapes; a pass never needs to know how a tensor is
// split to build or differentiate the graph. Only shard.c reads the rules,
// only emit_c.c turns ops into local computation.
//
// Semantics (operands in order; shapes global):
//   INPUT            -> x[b, ...]            the input batch
//   LABEL            -> y[b, ...]            the labels
//   PARAM            -> w                    a trainable variable
//   MATMUL  a, b     -> op(a) @ op(b)        op = transpose when ta / tb
//   BIAS    x, b     -> x + b                b broadcast along the last dim
//   ACT     x        -> act(x)               elementwise activation
//   BIAS_ACT x, b    -> act(x + b)           BIAS then ACT in one loop (fuse.c)
//   SOFTMAX x        -> softmax(x)           over the last dim
//   ADD     x...     -> sum of operands      same shapes
//   CONCAT  x...     -> concatenation        along `axis`
//   SLICE   x        -> x[.., start:start+n, ..] along `axis`
//   RESHAPE x        -> x with a new shape   same element order
//   DROPOUT x        -> x * mask / (1-rate)  mask from (seed, stream, step, index)
//   SCALE   x        -> x * scale + offset   (Rescaling; offset 0 in gradients)
//   CONV2D  x, f     -> conv(x, f)           channels last, no bias
//   MAXPOOL x        -> max over windows
//   LOSS    p, y     -> mean over the batch of the per-sample loss (scalar)
//   METRIC  p, y     -> mean over the batch of per-sample accuracy (scalar)
//   LOSS_GRAD p, y   -> d LOSS / d p
//   ACT_GRAD dy, t   -> dy * act'(.)         t = x for gelu/silu, else y
//   SOFTMAX_GRAD dy, y -> y * (dy - sum(dy * y))
//   BIAS_GRAD dy     -> dy summed over every dim but the last
//   CONV2D_DX dy, f  -> d conv / d x
//   CONV2D_DW x, dy  -> d conv / d f
//   MAXPOOL_GRAD dy, x -> dy routed to each window's max
//   UPDATE  w, g     -> w updated in place by the optimizer (and its slots)
//   ALLREDUCE x      -> sum of x over the mesh axes `axes`
//   REDUCE_SCATTER x -> sum over `axes`, then dim `axis` split over them
//   ALLGATHER x      -> dim `axis`, split over `axes`, gathered
//   ALLTOALL x       -> split moved from dim `axis` to dim `axis2` over `axes`
//   LOCAL_SLICE x    -> this device's block of dim `axis` over `axes` (no traffic)
#include "kdcc.h"

#include <assert.h>

const OpInfo op_info[OP_COUNT] = {
  [OP_INPUT] = {"input", 0, 0, false, PH_FORWARD},
  [OP_LABEL] = {"label", 0, 0, false, PH_FORWARD},
  [OP_PARAM] = {"param", 0, 0, false, PH_FORWARD},
  [OP_MATMUL] = {"matmul", 2, 3, false, PH_FORWARD},
  [OP_BIAS] = {"bias_add", 2, 0, false, PH_FORWARD},
  [OP_ACT] = {"act", 1, 0, false, PH_FORWARD},
  [OP_BIAS_ACT] = {"bias_act", 2, 0, false, PH_FORWARD},
  [OP_SOFTMAX] = {"softmax", 1, 0, false, PH_FORWARD},
  [OP_ADD] = {"add", -1, 0xff, true, PH_FORWARD},
  [OP_CONCAT] = {"concat", -1, 0xff, true, PH_FORWARD},
  [OP_SLICE] = {"slice", 1, 1, false, PH_BACKWARD},
  [OP_RESHAPE] = {"reshape", 1, 1, false, PH_FORWARD},
  [OP_DROPOUT] = {"dropout", 1, 1, false, PH_FORWARD},
  [OP_SCALE] = {"scale", 1, 0, false, PH_FORWARD},
  [OP_CONV2D] = {"conv2d", 2, 3, false, PH_FORWARD},
  [OP_MAXPOOL] = {"maxpool", 1, 0, false, PH_FORWARD},
  [OP_LOSS] = {"loss", 2, 0, false, PH_LOSS},
  [OP_METRIC] = {"accuracy", 2, 0, false, PH_LOSS},
  [OP_LOSS_GRAD] = {"loss_grad", 2, 0, false, PH_BACKWARD},
  [OP_ACT_GRAD] = {"act_grad", 2, 1, false, PH_BACKWARD},
  [OP_SOFTMAX_GRAD] = {"softmax_grad", 2, 1, false, PH_BACKWARD},
  [OP_BIAS_GRAD] = {"bias_grad", 1, 1, false, PH_BACKWARD},
  [OP_CONV2D_DX] = {"conv2d_dx", 2, 3, false, PH_BACKWARD},
  [OP_CONV2D_DW] = {"conv2d_dw", 2, 3, false, PH_BACKWARD},
  [OP_MAXPOOL_GRAD] = {"maxpool_grad", 2, 0, false, PH_BACKWARD},
  [OP_UPDATE] = {"update", 2, 0, false, PH_UPDATE},
  [OP_ALLREDUCE] = {"all_reduce", 1, 0, false, PH_BACKWARD},
  [OP_REDUCE_SCATTER] = {"reduce_scatter", 1, 0, false, PH_BACKWARD},
  [OP_ALLGATHER] = {"all_gather", 1, 0, false, PH_BACKWARD},
  [OP_ALLTOALL] = {"all_to_all", 1, 0, false, PH_BACKWARD},
  [OP_LOCAL_SLICE] = {"local_slice", 1, 0, false, PH_BACKWARD},
};
static_assert(sizeof(op_info) / sizeof(op_info[0]) == OP_COUNT, "op_info out of step with ops.def");

bool is_collective(OpKind op) {
  return op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER || op == OP_ALLGATHER ||
         op == OP_ALLTOALL || op == OP_LOCAL_SLICE;
}

const char *act_name(int act) {
  static const char *names[] = {"linear", "relu", "sigmoid", "tanh", "gelu", "silu", "softmax"};
  return names[act];
}

// ---- rule construction helpers

static int factor(Rule *r, FactorKind kind, int64_t size) {
  assert(r->nf < MAX_FACTORS);
  r->kind[r->nf] = kind;
  r->size[r->nf] = size;
  return r->nf++;
}

// Every dim of the result its own PASS factor, shared by every operand of
// the same shape (elementwise ops).
static void rule_elementwise(const Node *n, Rule *r) {
  for (int d = 0; d < n->shape.rank; d++)
    r->out[d] = factor(r, F_PASS, n->shape.d[d]);
  for (int i = 0; i < n->nin; i++)
    for (int d = 0; d < n->in[i]->shape.rank; d++)
      r->in[i][d] = r->out[d];
}

// Reshape: split both shapes into groups of equal products. In each group
// the major-most dims of input and output share one factor (a block split
// of the major dim is a block split of the merged one); the rest need their
// whole extent.
static void rule_reshape(const Node *n, Rule *r) {
  const Shape *a = &n->in[0]->shape, *b = &n->shape;
  int i = 0, j = 0;
  while (i < a->rank || j < b->rank) {
    int i0 = i, j0 = j;
    int64_t pa = i < a->rank ? a->d[i++] : 1, pb = j < b->rank ? b->d[j++] : 1;
    while (pa != pb) {
      if (pa < pb && i < a->rank) pa *= a->d[i++];
      else if (j < b->rank) pb *= b->d[j++];
      else break;
    }
    int f = factor(r, F_PASS, a->d[i0] < b->d[j0] ? a->d[i0] : b->d[j0]);
    if (i0 < a->rank) r->in[0][i0] = f;
    if (j0 < b->rank) r->out[j0] = f;
    for (int k = i0 + 1; k < i; k++) r->in[0][k] = factor(r, F_FULL, a->d[k]);
    for (int k = j0 + 1; k < j; k++) r->out[k] = factor(r, F_FULL, b->d[k]);
  }
}

void op_rule(const Node *n, Rule *r) {
  *r = (Rule){0};
  for (int i = 0; i < MAX_IN; i++)
    for (int d = 0; d < MAX_RANK; d++) r->in[i][d] = -1;
  for (int d = 0; d < MAX_RANK; d++) r->out[d] = -1;
  const Shape *s = &n->shape;

  switch (n->op) {
  case OP_INPUT: case OP_LABEL: case OP_PARAM:
  case OP_ACT: case OP_ADD: case OP_DROPOUT: case OP_ACT_GRAD: case OP_UPDATE: case OP_SCALE:
    rule_elementwise(n, r);
    return;
  case OP_BIAS: case OP_BIAS_ACT:
    rule_elementwise(n, r);
    r->in[1][0] = r->out[s->rank - 1];
    return;
  case OP_SOFTMAX: case OP_SOFTMAX_GRAD:
    rule_elementwise(n, r);
    r->kind[r->out[s->rank - 1]] = F_FULL;
    return;
  case OP_CONCAT: case OP_SLICE:
    rule_elementwise(n, r);
    r->kind[r->out[n->axis]] = F_FULL;
    return;
  case OP_RESHAPE:
    rule_reshape(n, r);
    return;
  case OP_MATMUL: {
    const Shape *a = &n->in[0]->shape;
    int m = factor(r, F_PASS, s->d[0]), nn = factor(r, F_PASS, s->d[1]);
    int k = factor(r, F_CONTRACT, n->ta ? a->d[0] : a->d[1]);
    r->in[0][n->ta ? 1 : 0] = m; r->in[0][n->ta ? 0 : 1] = k;
    r->in[1][n->tb ? 0 : 1] = nn; r->in[1][n->tb ? 1 : 0] = k;
    r->out[0] = m; r->out[1] = nn;
    return;
  }
  case OP_CONV2D: case OP_CONV2D_DX: case OP_CONV2D_DW: {
    // x[b,h,w,ci] f[kh,kw,ci,co] y[b,oh,ow,co]
    const Shape *x = n->op == OP_CONV2D_DX ? s : &n->in[0]->shape;
    const Shape *y = n->op == OP_CONV2D ? s : n->op == OP_CONV2D_DX ? &n->in[0]->shape
                                                                   : &n->in[1]->shape;
    int b = factor(r, n->op == OP_CONV2D_DW ? F_CONTRACT : F_PASS, x->d[0]);
    int h = factor(r, F_FULL, x->d[1]), w = factor(r, F_FULL, x->d[2]);
    int oh = factor(r, F_FULL, y->d[1]), ow = factor(r, F_FULL, y->d[2]);
    int kh = factor(r, F_FULL, n->kh), kw = factor(r, F_FULL, n->kw);
    int ci = factor(r, n->op == OP_CONV2D ? F_CONTRACT : F_PASS, x->d[3]);
    int co = factor(r, n->op == OP_CONV2D_DX ? F_CONTRACT : F_PASS, y->d[3]);
    int8_t xf[4] = {b, h, w, ci}, ff[4] = {kh, kw, ci, co}, yf[4] = {b, oh, ow, co};
    const int8_t *in0 = n->op == OP_CONV2D_DX ? yf : xf;
    const int8_t *in1 = n->op == OP_CONV2D_DW ? yf : ff;
    const int8_t *out = n->op == OP_CONV2D ? yf : n->op == OP_CONV2D_DX ? xf : ff;
    for (int d = 0; d < 4; d++) {
      r->in[0][d] = in0[d];
      r->in[1][d] = in1[d];
      r->out[d] = out[d];
    }
    return;
  }
  case OP_MAXPOOL: case OP_MAXPOOL_GRAD: {
    const Shape *x = n->op == OP_MAXPOOL ? &n->in[0]->shape : s;
    const Shape *y = n->op == OP_MAXPOOL ? s : &n->in[0]->shape;
    int b = factor(r, F_PASS, x->d[0]), c = factor(r, F_PASS, x->d[3]);
    int8_t xf[4] = {b, factor(r, F_FULL, x->d[1]), factor(r, F_FULL, x->d[2]), c};
    int8_t yf[4] = {b, factor(r, F_FULL, y->d[1]), factor(r, F_FULL, y->d[2]), c};
    for (int d = 0; d < 4; d++) {
      if (n->op == OP_MAXPOOL) {
        r->in[0][d] = xf[d];
        r->out[d] = yf[d];
      } else {
        r->in[0][d] = yf[d];
        r->in[1][d] = xf[d];
        r->out[d] = xf[d];
      }
    }
    return;
  }
  case OP_LOSS: case OP_METRIC: case OP_LOSS_GRAD: {
    // p[b, c...], y[b, c...] or y[b] (class ids): the batch contracts (or
    // passes, for the gradient), everything per sample is needed whole.
    const Shape *p = &n->in[0]->shape, *y = &n->in[1]->shape;
    int b = factor(r, n->op == OP_LOSS_GRAD ? F_PASS : F_CONTRACT, p->d[0]);
    r->in[0][0] = r->in[1][0] = b;
    for (int d = 1; d < p->rank; d++) r->in[0][d] = factor(r, F_FULL, p->d[d]);
    for (int d = 1; d < y->rank; d++) r->in[1][d] = factor(r, F_FULL, y->d[d]);
    if (n->op == OP_LOSS_GRAD)
      for (int d = 0; d < s->rank; d++) r->out[d] = r->in[0][d];
    return;
  }
  case OP_BIAS_GRAD: {
    const Shape *dy = &n->in[0]->shape;
    for (int d = 0; d + 1 < dy->rank; d++) r->in[0][d] = factor(r, F_CONTRACT, dy->d[d]);
    r->in[0][dy->rank - 1] = r->out[0] = factor(r, F_PASS, s->d[0]);
    return;
  }
  case OP_ALLREDUCE: case OP_REDUCE_SCATTER: case OP_ALLGATHER: case OP_ALLTOALL:
  case OP_LOCAL_SLICE: case OP_COUNT:
    break;
  }
  unreachable();
}
