// The neural-network ops, each defined as ops.c defines the core ones: one
// `const OpDef op_NAME` with its sharding rule, gradient and emission side
// by side. Softmax, and attention's fused softmax; convolution and max
// pooling with their window descriptors; layer (RMS) normalization and
// attention's causal and call masks; rotary position embedding; the
// losses and metrics, sparse
// crossentropy by row statistics included; batch normalization; the
// recurrent layers' recurrence and REVERSE. They are made of ops.c's
// pieces (ops_impl.h: factors, elementwise rules, DOT, the local rows and
// columns as C). Last, the table of every op in kdrt_ops.def (op_defs, op_rule),
// which names ops.c's OpDefs and these: here, so that ops.c calls nothing
// of this file (its op_make reads the table).
#include "ops_impl.h"

#include "../runtime/kdrt_rnn.h"
#include "../runtime/kdrt_rope.h"

// ---------------------------------------------------------------- SOFTMAX

static void softmax_rule(const Node *n, Rule *r) {
  rule_elementwise(n, r);
  r->kind[r->out[n->shape.rank - 1]] = F_FULL;
}

static void softmax_grad(Graph *g, Node *n, const bool *need) {
  accumulate(g, n->in[0], make2(g, OP_SOFTMAX_GRAD, n->grad, n));
}

// Attention's scores [.., t, u] with a scale and a causal mask folded in
// (fuse.c): the outer rows, the query rows t of this block and its first
// query position, the keys (whole: softmax's last dim is never split), the
// scale by name (scale_decl: 1 / sqrt(head_dim) as such where it is one).
char *attn_scale(const Node *n, double v) {
  double d = 1.0 / (v * v); // the head dim, if it is one
  bool head = d >= 0.999 && fabs(d - nearbyint(d)) < 1e-3 * d;
  return hparam(n, "scale", v,
                head ? format("1 / sqrt(head_dim %.0f)", nearbyint(d)) : "the scores' scale");
}

static char *scores_args(const Node *n) {
  int r = n->shape.rank;
  return format("%s, %s, %s, %s, %s, %d", sym_c(sym_prod(n, 0, r - 2, true)),
                sym_c(sym_dim(n, r - 2, true)), sym_c(sym_dim(n, r - 1, true)),
                block_start(n, r - 2), attn_scale(n, n->sm.scale), n->sm.causal);
}

static void softmax_emit(const Node *n, Lowering *lw) {
  if (n->sm.fused)
    lower_call(lw, KN_attn_softmax, NULL, "%s, %s, %s", buf(n), buf(n->in[0]),
               scores_args(n));
  else
    lower_call(lw, KN_softmax, NULL, "%s, %s, %s, %s", buf(n), buf(n->in[0]), rows_c(n),
               cols_c(n));
}

static void softmax_grad_emit(const Node *n, Lowering *lw) {
  if (n->sm.fused)
    lower_call(lw, KN_attn_softmax_grad, NULL, "%s, %s, %s, %s", buf(n),
               buf(n->in[0]), buf(n->in[1]), scores_args(n));
  else
    lower_call(lw, KN_softmax_grad, NULL, "%s, %s, %s, %s, %s", buf(n), buf(n->in[0]),
               buf(n->in[1]), rows_c(n), cols_c(n));
}

const OpDef op_SOFTMAX = {"softmax", 1, 0, false, softmax_rule, softmax_grad, softmax_emit,
                          shape_in0};
const OpDef op_SOFTMAX_GRAD = {"softmax_grad", 2, 1, false, softmax_rule, NULL,
                               softmax_grad_emit, shape_in0};

// issue 25: Keras's log_softmax, x - max - log(sum(exp(x - max))) over the
// last dim (needed whole, as softmax's); its gradient dy - exp(y) * sum(dy)
// from its output.
static void log_softmax_grad(Graph *g, Node *n, const bool *need) {
  accumulate(g, n->in[0], make2(g, OP_LOG_SOFTMAX_GRAD, n->grad, n));
}

static void log_softmax_emit(const Node *n, Lowering *lw) {
  bool grad = n->op == OP_LOG_SOFTMAX_GRAD;
  lower_call(lw, grad ? KN_log_softmax_grad : KN_log_softmax, NULL, "%s, %s%s, %s, %s",
             buf(n), grad ? format("%s, ", buf(n->in[0])) : "", buf(n->in[grad]), rows_c(n),
             cols_c(n));
}

const OpDef op_LOG_SOFTMAX = {"log_softmax", 1, 0, false, softmax_rule, log_softmax_grad,
                              log_softmax_emit, shape_in0};
const OpDef op_LOG_SOFTMAX_GRAD = {"log_softmax_grad", 2, 1, false, softmax_rule, NULL,
                                   log_softmax_emit, shape_in0};

// ---------------------------------------------------------------- GLU
// issue 25: Keras's glu, x's last dim split in halves a and b, a *
// sigmoid(b): the result has half that dim (the shape rule), which is
// needed whole, x's and the result's (the halves are far apart); its
// gradient in x from x.
static bool glu_shape(const Node *n, Shape *out) {
  *out = n->in[0]->shape;
  int last = out->rank - 1;
  if (last < 0 || out->d[last] % 2) return false;
  out->d[last] /= 2;
  return true;
}

static void glu_rule(const Node *n, Rule *r) { rule_whole_axis(n, r, n->shape.rank - 1); }

static void glu_grad(Graph *g, Node *n, const bool *need) {
  accumulate(g, n->in[0], make2(g, OP_GLU_GRAD, n->grad, n->in[0]));
}

static void glu_emit(const Node *n, Lowering *lw) {
  bool grad = n->op == OP_GLU_GRAD;
  const Node *half = grad ? n->in[0] : n; // [rows, cols]: y, dy
  lower_call(lw, grad ? KN_glu_grad : KN_glu, NULL, "%s, %s%s, %s, %s", buf(n),
             grad ? format("%s, ", buf(n->in[0])) : "", buf(n->in[grad]), rows_c(half),
             cols_c(half));
}

const OpDef op_GLU = {"glu", 1, 0, false, glu_rule, glu_grad, glu_emit, glu_shape};
const OpDef op_GLU_GRAD = {"glu_grad", 2, 1, false, glu_rule, NULL, glu_emit, shape_in1};

// ---------------------------------------------------------------- ATTENTION
// issue 22: attention's chain in one op each way (fuse.c's fuse_attention,
// the CUDA program's): q[b, n, t, h], k and v [b, n, s, h] as the
// transposes to heads leave them, lse[b, n, t]. The batch and the heads
// pass through (split heads: each device its own); the steps, the keys and
// the head dim are needed whole.
static void attention_rule(const Node *n, Rule *r) {
  bool grad = n->op == OP_ATTENTION_GRAD;
  const Shape *q = &n->in[grad]->shape, *k = &n->in[grad + 1]->shape;
  int b = factor(r, F_PASS, q->d[0]), hn = factor(r, F_PASS, q->d[1]);
  int t = factor(r, F_FULL, q->d[2]), s = factor(r, F_FULL, k->d[2]);
  int h = factor(r, F_FULL, q->d[3]);
  const int8_t qf[4] = {b, hn, t, h}, kf[4] = {b, hn, s, h};
  // each operand's factors: q-like, k-like or lse-like (q's without h)
  static const char fwd[] = "qkkl", lse[] = "qkk", bwd[] = "qqkkqlkk";
  const char *kinds = grad ? bwd : n->op == OP_ATTENTION ? fwd : lse;
  for (int i = 0; i < n->nin; i++)
    for (int d = 0; d < n->in[i]->shape.rank; d++) r->in[i][d] = kinds[i] == 'k' ? kf[d] : qf[d];
  const int8_t *out = n->op == OP_ATTENTION_GRAD && n->fused ? kf : qf;
  for (int d = 0; d < n->shape.rank; d++) r->out[d] = out[d];
}

// bn, t, s, h as C, then the scale by name and the mask.
static char *attention_args(const Node *n, const Node *q, const Node *k) {
  return format("%s, %s, %s, %s, %s, %d", sym_c(sym_prod(q, 0, 2, true)),
                sym_c(sym_dim(q, 2, true)), sym_c(sym_dim(k, 2, true)), sym_c(sym_dim(q, 3, true)),
                attn_scale(n, n->sm.scale), n->sm.causal);
}

static void attention_emit(const Node *n, Lowering *lw) {
  if (n->op == OP_ATTENTION_LSE) {
    lw->note = "made by the attention after it (each query row's max + log(sum of exps))";
    return;
  }
  if (n->op == OP_ATTENTION) {
    lower_call(lw, KN_attention, NULL, "%s, %s, %s, %s, %s, %s", buf(n), buf(n->in[3]),
               buf(n->in[0]), buf(n->in[1]), buf(n->in[2]), attention_args(n, n->in[0], n->in[1]));
    return;
  }
  if (n->fused) {
    lw->note = "made with dq by the attention's gradient after it";
    return;
  }
  lower_call(lw, KN_attention_grad, NULL, "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s", buf(n),
             buf(n->in[6]), buf(n->in[7]), buf(n->in[0]), buf(n->in[1]), buf(n->in[2]),
             buf(n->in[3]), buf(n->in[4]), buf(n->in[5]), attention_args(n, n->in[1], n->in[2]));
}

// q [b, n, t, h], v [b, n, s, hv] -> [b, n, t, hv]
static bool attention_shape(const Node *n, Shape *out) {
  *out = n->in[0]->shape;
  out->d[out->rank - 1] = n->in[2]->shape.d[out->rank - 1];
  return true;
}

const OpDef op_ATTENTION = {"attention", 4, 0, false, attention_rule, NULL, attention_emit,
                            attention_shape};
const OpDef op_ATTENTION_LSE = {"attention_lse", 3, 0, false, attention_rule, NULL,
                                attention_emit, shape_rows};
// dq (its 8 operands: dk and dv after the six) is q's shape; dk and dv are
// k's, which is v's.
static bool attention_grad_shape(const Node *n, Shape *out) {
  *out = n->in[n->nin == 8 ? 1 : 2]->shape;
  return n->nin == 6 || n->nin == 8;
}

const OpDef op_ATTENTION_GRAD = {"attention_grad", -1, 0, false, attention_rule, NULL,
                                 attention_emit, attention_grad_shape};

// ---------------------------------------------------------------- CONV2D, MAXPOOL
// x[b,h,w,ci] f[kh,kw,ci,co] y[b,oh,ow,co]; the spatial dims need their
// whole extent (no halo exchange). With G groups (issue 15) x[b,h,w,(g,ci)]
// f[kh,kw,ci,(g,co)] y[b,oh,ow,(g,co)]: the groups factor g (size G) passes
// through all three ops, each device convolving its own groups; it is
// blocked (the channel dims are G * cg and G * kg), so it splits only over
// an axis dividing G, and where none does the operands are gathered. ci
// within a group is not a dim of x of its own: it needs its whole extent.

static void conv_rule(const Node *n, Rule *r) {
  const Shape *s = &n->shape;
  const Shape *x = n->op == OP_CONV2D_DX ? s : &n->in[0]->shape;
  const Shape *y = n->op == OP_CONV2D ? s : n->op == OP_CONV2D_DX ? &n->in[0]->shape
                                                                 : &n->in[1]->shape;
  const Shape *f = n->op == OP_CONV2D_DW ? s : &n->in[1]->shape;
  int b = factor(r, n->op == OP_CONV2D_DW ? F_CONTRACT : F_PASS, x->d[0]);
  int h = factor(r, F_FULL, x->d[1]), w = factor(r, F_FULL, x->d[2]);
  int oh = factor(r, F_FULL, y->d[1]), ow = factor(r, F_FULL, y->d[2]);
  int kh = factor(r, F_FULL, n->win.kh), kw = factor(r, F_FULL, n->win.kw);
  int ci, co;
  if (n->win.groups > 1) {
    ci = factor(r, F_FULL, f->d[2]);
    co = factor(r, F_PASS, n->win.groups);
    r->blocked[co] = true;
  } else {
    ci = factor(r, n->op == OP_CONV2D ? F_CONTRACT : F_PASS, x->d[3]);
    co = factor(r, n->op == OP_CONV2D_DX ? F_CONTRACT : F_PASS, y->d[3]);
  }
  int8_t xf[4] = {b, h, w, n->win.groups > 1 ? co : ci}, ff[4] = {kh, kw, ci, co};
  int8_t yf[4] = {b, oh, ow, co};
  const int8_t *in0 = n->op == OP_CONV2D_DX ? yf : xf;
  const int8_t *in1 = n->op == OP_CONV2D_DW ? yf : ff;
  const int8_t *out = n->op == OP_CONV2D ? yf : n->op == OP_CONV2D_DX ? xf : ff;
  for (int d = 0; d < 4; d++) {
    r->in[0][d] = in0[d];
    r->in[1][d] = in1[d];
    r->out[d] = out[d];
  }
}

// The shape rules: the windows' extents from the padding before and after
// (WinAttr's pad_b: the last window ends the padded extent), as JAX's
// conv_general_dilated with explicit padding; a conv's channels from its
// filter, a gradient's dims from its operands'.
static int64_t span(int k, int dil) { return (int64_t)(k - 1) * (dil + 1) + 1; }

// The windows over an extent `in` padded by pt and pb; -1: they do not tile it.
static int64_t windows_over(int64_t in, int k, int dil, int s, int pt, int pb) {
  int64_t e = in + pt + pb - span(k, dil);
  return e >= 0 && s > 0 && e % s == 0 ? e / s + 1 : -1;
}

// The extent whose windows are `out` (CONV2D_DX's x).
static int64_t extent_under(int64_t out, int k, int dil, int s, int pt, int pb) {
  return (out - 1) * s + span(k, dil) - pt - pb;
}

static bool window_shape(const Node *n, Shape *out) {
  const WinAttr *w = &n->win;
  const Shape *a = &n->in[0]->shape, *b = n->nin > 1 ? &n->in[1]->shape : NULL;
  if (a->rank != 4 || (b && b->rank != 4)) return false;
  int64_t G = w->groups > 1 ? w->groups : 1;
  *out = (Shape){4, {a->d[0]}};
  switch (n->op) {
  case OP_CONV2D: case OP_MAXPOOL: // a = x: y[b, oh, ow, co]
    out->d[1] = windows_over(a->d[1], w->kh, w->dil_h, w->sh, w->pad_t, w->pad_b);
    out->d[2] = windows_over(a->d[2], w->kw, w->dil_w, w->sw, w->pad_l, w->pad_r);
    out->d[3] = n->op == OP_MAXPOOL ? a->d[3] : b->d[3];
    break;
  case OP_CONV2D_DX: // a = dy: x[b, h, w, G * ci]
    out->d[1] = extent_under(a->d[1], w->kh, w->dil_h, w->sh, w->pad_t, w->pad_b);
    out->d[2] = extent_under(a->d[2], w->kw, w->dil_w, w->sw, w->pad_l, w->pad_r);
    out->d[3] = G * b->d[2];
    break;
  case OP_CONV2D_DW: // a = x, b = dy: f[kh, kw, ci, co]
    *out = (Shape){4, {w->kh, w->kw, a->d[3] / G, b->d[3]}};
    return a->d[0] == b->d[0] && a->d[3] % G == 0;
  default: unreachable();
  }
  return out->d[1] > 0 && out->d[2] > 0;
}

static Node *windowed(Graph *g, OpKind op, Node *a, Node *b, const Node *like) {
  return make2(g, op, a, b, .win = like->win);
}

static void conv_grad(Graph *g, Node *n, const bool *need) {
  Node *a = n->in[0], *b = n->in[1];
  if (need[a->id]) accumulate(g, a, windowed(g, OP_CONV2D_DX, n->grad, b, n));
  if (need[b->id]) accumulate(g, b, windowed(g, OP_CONV2D_DW, a, n->grad, n));
}

// The window descriptor of a conv or pool op, from its local x and y: a
// split of the channels over an axis holds that share of the groups.
static char *window_decl(const Node *n, const Node *x, const Node *y) {
  Shape xs = lshape(x), ys = lshape(y);
  int64_t groups = n->win.groups > 1 ? n->win.groups * xs.d[3] / x->shape.d[3] : 0;
  // every member named: C++ (CUDA) warns about a designated one left out
  char *dil = format(",\n                            .dil_h = %d, .dil_w = %d, .groups = %lld",
                     n->win.dil_h, n->win.dil_w, (long long)groups);
  return format("const kdrt_window w = {.B = (int)%s, .H = %lld, .W = %lld, .C = %lld, "
                ".KH = %d, .KW = %d, .K = %lld,\n"
                "                            .sh = %d, .sw = %d, .pad_t = %d, "
                ".pad_l = %d, .OH = %lld, .OW = %lld%s};",
                sym_c(sym_dim(x, 0, true)), (long long)xs.d[1], (long long)xs.d[2], (long long)xs.d[3],
                n->win.kh, n->win.kw, (long long)ys.d[3], n->win.sh, n->win.sw, n->win.pad_t,
                n->win.pad_l, (long long)ys.d[1], (long long)ys.d[2], dil);
}

static void conv_emit(const Node *n, Lowering *lw) {
  const Node *x = n->op == OP_CONV2D_DX ? n : n->in[0];
  const Node *y = n->op == OP_CONV2D ? n : n->op == OP_CONV2D_DX ? n->in[0] : n->in[1];
  if (n->win.half) { // issue 23: 16-bit operands, float32 sums (store16.c)
    const char *pass = n->op == OP_CONV2D      ? "KDRT_CONV_Y"
                       : n->op == OP_CONV2D_DX ? "KDRT_CONV_DX"
                                               : "KDRT_CONV_DW";
    lower_call(lw, KN_conv2d16, window_decl(n, x, y),
               "&w, %s, %s, %s, %s, %s, %s, %s, scratch, %s", pass, round_c(n->win.half),
               form16(n->in[0], false), buf(n->in[0]), form16(n->in[1], false), buf(n->in[1]),
               buf(n), widen16_c());
    return;
  }
  Kernel fn = n->op == OP_CONV2D ? KN_conv2d : n->op == OP_CONV2D_DX ? KN_conv2d_dx : KN_conv2d_dw;
  lower_call(lw, fn, window_decl(n, x, y), "&w, %s, %s, %s, scratch", buf(n),
             buf(n->in[0]), buf(n->in[1]));
}

// issue 11: CONV2D_DX as a layer's own op (Conv2DTranspose): its transpose
// is the forward conv, and its filter's gradient the conv's.
static void conv_dx_grad(Graph *g, Node *n, const bool *need) {
  Node *dy = n->in[0], *f = n->in[1];
  if (need[dy->id]) accumulate(g, dy, windowed(g, OP_CONV2D, n->grad, f, n));
  if (need[f->id]) accumulate(g, f, windowed(g, OP_CONV2D_DW, n->grad, dy, n));
}

const OpDef op_CONV2D = {"conv2d", 2, 3, false, conv_rule, conv_grad, conv_emit, window_shape};
const OpDef op_CONV2D_DX = {"conv2d_dx", 2, 3, false, conv_rule, conv_dx_grad, conv_emit,
                            window_shape};
const OpDef op_CONV2D_DW = {"conv2d_dw", 2, 3, false, conv_rule, NULL, conv_emit, window_shape};

static void pool_rule(const Node *n, Rule *r) {
  bool fwd = n->op == OP_MAXPOOL;
  const Shape *x = fwd ? &n->in[0]->shape : &n->shape, *y = fwd ? &n->shape : &n->in[0]->shape;
  int b = factor(r, F_PASS, x->d[0]), c = factor(r, F_PASS, x->d[3]);
  int8_t xf[4] = {b, factor(r, F_FULL, x->d[1]), factor(r, F_FULL, x->d[2]), c};
  int8_t yf[4] = {b, factor(r, F_FULL, y->d[1]), factor(r, F_FULL, y->d[2]), c};
  for (int d = 0; d < 4; d++) {
    r->in[0][d] = fwd ? xf[d] : yf[d];
    r->out[d] = fwd ? yf[d] : xf[d];
    if (!fwd) r->in[1][d] = xf[d];
  }
}

static void pool_grad(Graph *g, Node *n, const bool *need) {
  accumulate(g, n->in[0], windowed(g, OP_MAXPOOL_GRAD, n->grad, n->in[0], n));
}

static void pool_emit(const Node *n, Lowering *lw) {
  if (n->op == OP_MAXPOOL)
    lower_call(lw, KN_maxpool, window_decl(n, n->in[0], n), "&w, %s, %s", buf(n),
               buf(n->in[0]));
  else
    lower_call(lw, KN_maxpool_grad, window_decl(n, n, n->in[0]), "&w, %s, %s, %s", buf(n),
               buf(n->in[0]), buf(n->in[1]));
}

const OpDef op_MAXPOOL = {"maxpool", 1, 0, false, pool_rule, pool_grad, pool_emit, window_shape};
const OpDef op_MAXPOOL_GRAD = {"maxpool_grad", 2, 0, false, pool_rule, NULL, pool_emit, shape_in1};

// ---------------------------------------------------------------- COL_MUL, NORM, CAUSAL, ATTN_MASK
// COL_MUL: x * g, g over x's trailing dims (a normalization's scale).
// NORM: layer (or RMS) normalization over the last dim, no scale or
// offset (those are COL_MUL and BIAS after it): the last dim is needed
// whole. Its gradient recomputes the row statistics from x.

static void col_mul_grad(Graph *g, Node *n, const bool *need) {
  Node *x = n->in[0], *gam = n->in[1];
  if (need[x->id]) accumulate(g, x, make2(g, OP_COL_MUL, n->grad, gam));
  if (need[gam->id]) {
    Node *p = make2(g, OP_MUL, n->grad, x);
    accumulate(g, gam, bias_grad_of(g, p, gam));
  }
}

static void col_mul_emit(const Node *n, Lowering *lw) {
  int rb = n->in[1]->shape.rank;
  lower_call(lw, KN_col_mul, NULL, "%s, %s, %s, %s, %s", buf(n), buf(n->in[0]),
             buf(n->in[1]), lead_c(n, rb), trail_c(n, rb));
}

// Linear in x (operand 0) and in g separately.
const OpDef op_COL_MUL = {"col_mul", 2, 3, false, bias_rule, col_mul_grad, col_mul_emit, shape_in0};

static void norm_rule(const Node *n, Rule *r) {
  rule_elementwise(n, r);
  r->kind[r->out[n->shape.rank - 1]] = F_FULL;
}

static void norm_grad(Graph *g, Node *n, const bool *need) {
  Node *x = n->in[0];
  Node *dx = make2(g, OP_NORM_GRAD, n->grad, x, .norm = n->norm);
  accumulate(g, x, dx);
}

// issue 25: the runtime's first argument by name, and the layer's epsilon.
static const char *norm_kind(const NormAttr *a) { return a->rms ? "KDRT_NORM_RMS" : "KDRT_NORM_LAYER"; }

static void norm_emit(const Node *n, Lowering *lw) {
  const Node *x = n->op == OP_NORM ? n->in[0] : n->in[1];
  char *eps = hparam(n, "epsilon", n->norm.eps, NULL);
  if (n->op == OP_NORM)
    lower_call(lw, KN_norm, NULL, "%s, %s, %s, %s, %s, %s", norm_kind(&n->norm), buf(n),
               buf(x), rows_c(n), cols_c(n), eps);
  else
    lower_call(lw, KN_norm_grad, NULL, "%s, %s, %s, %s, %s, %s, %s", norm_kind(&n->norm),
               buf(n), buf(n->in[0]), buf(x), rows_c(n), cols_c(n), eps);
}

const OpDef op_NORM = {"norm", 1, 0, false, norm_rule, norm_grad, norm_emit, shape_in0};
const OpDef op_NORM_GRAD = {"norm_grad", 2, 0, false, norm_rule, NULL, norm_emit, shape_in0};

// issue 25: LAYER_NORM is Keras's LayerNormalization (and RMSNormalization)
// whole, NORM then COL_MUL by g then BIAS of b, in one pass; LAYER_NORM_DX
// its gradient in x, a row at a time, and LAYER_NORM_DW the column sums of
// dy * NORM(x) (d g), each recomputing the row statistics from x. Made by
// fuse.c's fuse_layer_norm from that chain after partitioning, never
// differentiated; the runtime forms every element as the chain did. The
// last dim is needed whole (the row statistics), g and b are over it.
static void layer_norm_rule(const Node *n, Rule *r) {
  norm_rule(n, r);
  int c = r->out[n->shape.rank - 1];
  for (int i = n->op == OP_LAYER_NORM ? 1 : 2; i < n->nin; i++) { // g, b
    for (int d = 0; d < MAX_RANK; d++) r->in[i][d] = -1;
    r->in[i][0] = c;
  }
}

// dy, x -> [c]: the rows contract, the columns are needed whole.
static void layer_norm_dw_rule(const Node *n, Rule *r) {
  const Shape *dy = &n->in[0]->shape;
  int c = r->out[0] = factor(r, F_FULL, dy->d[dy->rank - 1]);
  for (int d = 0; d + 1 < dy->rank; d++)
    r->in[0][d] = r->in[1][d] = factor(r, F_CONTRACT, dy->d[d]);
  r->in[0][dy->rank - 1] = r->in[1][dy->rank - 1] = c;
}

static const char *opt_buf(const Node *n, int i, bool has) { return has ? buf(n->in[i]) : "NULL"; }

static void layer_norm_emit(const Node *n, Lowering *lw) {
  const NormAttr *a = &n->norm;
  char *eps = hparam(n, "epsilon", a->eps, NULL);
  if (n->op == OP_LAYER_NORM) {
    lower_call_rnd(lw, n, KN_layer_norm, NULL, "%s, %s, %s, %s, %s, %s, %s, %s", norm_kind(a),
                   buf(n), buf(n->in[0]), opt_buf(n, 1, a->scale),
                   opt_buf(n, n->nin - 1, a->center), rows_c(n), cols_c(n), eps);
  } else if (n->op == OP_LAYER_NORM_DX) {
    lower_call(lw, KN_layer_norm_dx, NULL, "%s, %s, %s, %s, %s, %s, %s, %s", norm_kind(a),
               buf(n), buf(n->in[0]), buf(n->in[1]), opt_buf(n, 2, a->scale), rows_c(n),
               cols_c(n), eps);
  } else { // d b stays BIAS_GRAD's (a node has one result): NULL
    const Node *dy = n->in[0];
    lower_call(lw, KN_layer_norm_dw, NULL, "%s, %s, NULL, %s, %s, %s, %s, %s", norm_kind(a),
               buf(n), buf(dy), buf(n->in[1]), rows_c(dy), cols_c(dy), eps);
  }
}

const OpDef op_LAYER_NORM = {"layer_norm", -1, 0, false, layer_norm_rule, NULL, layer_norm_emit,
                             shape_in0};
const OpDef op_LAYER_NORM_DX = {"layer_norm_dx", -1, 0, false, layer_norm_rule, NULL,
                                layer_norm_emit, shape_in0};
// Linear in dy: a partial dy gives partial sums.
static bool layer_norm_dw_shape(const Node *n, Shape *out) {
  const Shape *x = &n->in[1]->shape;
  *out = (Shape){1, {x->d[x->rank - 1]}};
  return true;
}

const OpDef op_LAYER_NORM_DW = {"layer_norm_dw", 2, 1, false, layer_norm_dw_rule, NULL,
                                layer_norm_emit, layer_norm_dw_shape};

// Scores s[.., t, u]: a key position u after the query position t is
// masked, and with a window w one at u <= t - w; the gradient is the same
// mask with 0 (a masked score has no effect). Positions are global: a split
// t or u starts at its block.
static void causal_grad(Graph *g, Node *n, const bool *need) {
  MaskAttr m = n->mask;
  m.fill = 0;
  Node *dx = make1(g, OP_CAUSAL, n->grad, .mask = m);
  accumulate(g, n->in[0], dx);
}

static char *window_c(const Node *n) { return format("%lld", (long long)n->mask.window); }

char *causal_window(const Node *n) {
  // Gemma 2's layers alternate sliding and global attention: in a block, a table by layer
  return per_layer(n, "window", "int64_t", "its sliding window (0: none), by layer", window_c);
}

static void causal_emit(const Node *n, Lowering *lw) {
  int r = n->shape.rank;
  char *window = causal_window(n);
  lower_call(lw, KN_causal_mask, NULL, "%s, %s, %s, %s, %s, %s, %s, %s, %s", buf(n),
             buf(n->in[0]), sym_c(sym_prod(n, 0, r - 2, true)), sym_c(sym_dim(n, r - 2, true)),
             sym_c(sym_dim(n, r - 1, true)), block_start(n, r - 2), block_start(n, r - 1),
             window, n->mask.fill == 0 ? "0.0f" : "KDRT_MASKED");
}

const OpDef op_CAUSAL = {"causal_mask", 1, 0, false, rule_elementwise, causal_grad, causal_emit,
                         shape_in0};

// issue 10: scores s[b, n, t, u] where a call's attention_mask m[b, t, u]
// is zero become mask.fill (Keras casts the mask to bool); m is the same
// for every head, so it shares every factor of s but the heads'. A
// padding mask m[b, u] (keras-hub's, over the keys) is the same for every
// query too. The gradient is the same mask with 0. Not linear: a masked
// partial sum would be filled once per summand.
static void attn_mask_rule(const Node *n, Rule *r) {
  rule_elementwise(n, r);
  for (int d = 0; d < MAX_RANK; d++) r->in[1][d] = -1;
  bool keys = n->in[1]->shape.rank == 2;
  for (int d = 0, k = 0; d < n->shape.rank; d++)
    if (d != 1 && !(keys && d == 2)) r->in[1][k++] = r->out[d];
}

static void attn_mask_grad(Graph *g, Node *n, const bool *need) {
  Node *dx = make2(g, OP_ATTN_MASK, n->grad, n->in[1], .mask.fill = 0);
  accumulate(g, n->in[0], dx);
}

static void attn_mask_emit(const Node *n, Lowering *lw) {
  bool keys = n->in[1]->shape.rank == 2;
  lower_call(lw, KN_attention_mask, NULL, "%s, %s, %s, %d, %s, %s, %s, %s, %s", buf(n),
             buf(n->in[0]), buf(n->in[1]), n->in[1]->dtype == DT_I32,
             sym_c(sym_dim(n, 0, true)), sym_c(sym_dim(n, 1, true)),
             sym_c(sym_prod(n, 2, n->shape.rank, true)),
             sym_c(keys ? sym_dim(n, 3, true) : sym_prod(n, 2, n->shape.rank, true)),
             n->mask.fill == 0 ? "0.0f" : "KDRT_MASKED");
}

const OpDef op_ATTN_MASK = {"attention_mask", 2, 0, false, attn_mask_rule, attn_mask_grad,
                            attn_mask_emit, shape_in0};

// ---------------------------------------------------------------- issue 24: ROPE
// Rotary position embedding (kdrt_rope.h) of x[b, t, .., 2h]: feature pair
// (j, j + h) of step t turned by the angle pos * f[j], pos the step's
// global position plus the op's offset, f the inverse frequencies below.
// Linear in x; its transpose, the gradient, turns the other way. The
// features are needed whole (a pair spans both halves); every other dim
// passes: a split sequence's block starts at its first step's position.

// XLA's float32 pow and log (the inverse frequencies had these bits in
// every case tried).
static float pow32(float a, float b) { return (float)pow((double)a, (double)b); }
static float log32(float a) { return (float)log((double)a); }

// keras-hub's RotaryEmbedding._get_inverse_freq and
// LlamaRotaryEmbedding._get_inverse_freq in float32, as XLA computes them
// (a Python number meeting a float32 tensor is rounded to float32 first, as
// JAX's weak types are): XLA rewrites a / pow(b, c) as a * pow(b, -c),
// a / (b / c) as a * c / b and some divisions by a scalar as products by
// its reciprocal, and fuses a multiply-add; every form was checked bit for
// bit against keras-hub 0.32 on JAX's CPU backend (linear, dynamic and
// YaRN with feature dims 8 to 128, powers of two or not; Llama and Llama
// 3.1 with frequency adjustments 3, 4 and 8).
float rope_inv_freq(const RopeParams *p, int64_t dim, float *out) {
  const int64_t h = dim / 2;
  const float base = (float)p->max_wavelength, sf = (float)p->scaling_factor, d = (float)dim;
  if (p->kind == ROPE_LLAMA || p->kind == ROPE_LLAMA31) {
    const float pi2 = (float)(2 * M_PI), fa = (float)p->freq_adjust, len = (float)p->pretrain_len;
    const float low_wl = (float)(p->pretrain_len / p->low_freq);
    const float high_wl = (float)(p->pretrain_len / p->high_freq);
    for (int64_t j = 0; j < h; j++) {
      float inv = pow32(base, -((float)(2 * j) * (1.0f / d)));
      if (p->kind == ROPE_LLAMA31) { // Llama 3.1's smoothing between two wavelengths
        float wavelen = pi2 / inv, raw = inv;
        if (wavelen > low_wl) inv = inv * (1.0f / fa);
        float smooth = (len * raw / pi2 - (float)p->low_freq) /
                       (float)(p->high_freq - p->low_freq);
        float smoothed = fmaf(smooth, inv, (1.0f - smooth) * (inv * (1.0f / fa)));
        if (wavelen >= high_wl && wavelen <= low_wl) inv = smoothed;
      }
      out[j] = inv;
    }
    return 1.0f;
  }
  if (p->kind == ROPE_YARN) {
    // the ramp between interpolation (low frequencies) and extrapolation
    const float maxpos = (float)p->original_max, pi = (float)M_PI;
    float low = d * log32(maxpos / ((float)p->beta_fast * 2.0f * pi)) / (2.0f * log32(base));
    float high = d * log32(maxpos / ((float)p->beta_slow * 2.0f * pi)) / (2.0f * log32(base));
    if (p->truncate) low = floorf(low), high = ceilf(high);
    low = fmaxf(low, 0.0f);
    high = fminf(high, (float)(dim - 1));
    const float diff = fmaxf(high - low, 0.001f);
    for (int64_t j = 0; j < h; j++) {
      float x = (float)(2 * j) * (1.0f / d);
      float extra = pow32(base, -x), inter = 1.0f / (sf * pow32(base, x));
      float ramp = fminf(fmaxf(((float)j - low) * (1.0f / diff), 0.0f), 1.0f), ef = 1.0f - ramp;
      out[j] = inter * (1.0f - ef) + extra * ef;
    }
    return 0.1f * log32(sf) + 1.0f;
  }
  const float denom = (float)(p->denominator_dim ? p->denominator_dim : dim);
  const float dyn = pow32(sf, -(d / (float)(dim - 2 > 1 ? dim - 2 : 1)));
  for (int64_t j = 0; j < h; j++) {
    float inv = pow32(base, -((float)(2 * j) * (1.0f / denom)));
    out[j] = p->kind == ROPE_DYNAMIC ? inv * dyn : inv * (1.0f / sf);
  }
  return 1.0f;
}

static void rope_rule(const Node *n, Rule *r) {
  rule_elementwise(n, r);
  r->kind[r->out[n->shape.rank - 1]] = F_FULL;
}

static void rope_grad(Graph *g, Node *n, const bool *need) {
  RopeAttr r = n->rope;
  r.inverse = !r.inverse;
  Node *dx = make1(g, OP_ROPE, n->grad, .rope = r);
  accumulate(g, n->in[0], dx);
}

// ROPE's descriptor, a kdrt_rotary: the frequencies (six a line) and the
// rounding of a mixed policy, every field named (CUDA C++ warns of a
// designated one left out). indent: the continuation lines' spaces; named:
// a constant of its own, the fields from the second line.
static char *rope_init(const Node *n, int indent, bool named) {
  int64_t dim = n->shape.d[n->shape.rank - 1];
  if (dim % 2 || dim / 2 > KDRT_ROPE_MAX_HALF) unreachable(); // rope_node refuses them
  float f[KDRT_ROPE_MAX_HALF];
  float scale = rope_inv_freq(n->rope.p, dim, f);
  char *vals = xstrdup("");
  for (int64_t j = 0; j < dim / 2; j++)
    vals = format("%s%s%s", vals, !j ? "" : j % 6 ? ", " : format(",\n%*s", indent, ""),
                  flt(f[j]));
  return format("{%s.half = %lld, .scale = %s, .rounding = %s,\n%*s.inv_freq = {%s}}",
                named ? format("\n%*s", indent, "") : "", (long long)(dim / 2), flt(scale),
                !n->rope.round                     ? "KDRT_ROUND_NONE"
                : n->rope.round == KDRT_ROUND_F16 ? "KDRT_ROUND_F16"
                                                  : "KDRT_ROUND_BF16", indent, "", vals);
}

static char *rope_init_named(const Node *n) { return rope_init(n, 2, true); }

char *rope_desc(const Node *n, int indent, char **decl) {
  // issue 25: Gemma 3's local and global blocks differ by their frequencies alone
  char *r = per_layer_object(n, "rope", "kdrt_rotary", "its rotary embedding", rope_init_named);
  *decl = r ? NULL : format("static const kdrt_rotary r = %s;", rope_init(n, indent, false));
  return r ? r : xstrdup("&r");
}

// The call: x as [b, t, heads.., 2h] and its block's first position.
static void rope_emit(const Node *n, Lowering *lw) {
  int r = n->shape.rank;
  char *decl, *desc = rope_desc(n, 8, &decl);
  char *t0 = block_start(n, 1);
  if (n->rope.offset)
    t0 = n->place.axis[1] >= 0 ? format("%lld + %s", (long long)n->rope.offset, t0)
                               : format("%lld", (long long)n->rope.offset);
  lower_call(lw, KN_rope, decl, "%s, %s, %s, %s, %s, %s, %s, %d", buf(n), buf(n->in[0]), desc,
             sym_c(sym_dim(n, 0, true)), sym_c(sym_dim(n, 1, true)),
             sym_c(sym_prod(n, 2, r - 1, true)), t0,
             n->rope.inverse | n->rope.round << 1); // kdrt_rope.h's mode
}

const OpDef op_ROPE = {"rope", 1, 1, false, rope_rule, rope_grad, rope_emit, shape_in0};

// ---------------------------------------------------------------- losses and metrics
// p[b, t.., c] and y[b, t.., c] (or class ids y[b, t..]): every dim but the
// class dim indexes a row; rows contract into the scalar (or pass, for the
// gradient); a row's classes are needed whole. The hinge losses take a
// third operand, the step's NOT_BINARY flag (a scalar, whole).

static const char *const loss_c[] = {
#define KDRT_X(name, kname) "KDRT_LOSS_" #name,
  KDRT_LOSS_LIST(KDRT_X)
#undef KDRT_X
};

// A loss's scale as C: its numerator over the global rows it averages over
// (every sample, or every token), counted at run time.
static char *scale_c(const Node *n, const Node *p) {
  Sym rows = sym_prod(p, 0, p->shape.rank > 1 ? p->shape.rank - 1 : p->shape.rank, false);
  if (!rows.v) return format("%.17g", n->loss.weight);
  return format("%.17g / (double)(%s)", n->loss.num, sym_c(rows));
}

static void loss_rule(const Node *n, Rule *r) {
  const Shape *p = &n->in[0]->shape, *y = &n->in[1]->shape;
  bool grad = n->op == OP_LOSS_GRAD;
  const Shape *w = n->loss.weighted ? &n->in[n->nin - 1]->shape : NULL; // a weight a row
  for (int d = 0; d + 1 < p->rank || (p->rank == 1 && d == 0); d++) {
    int f = factor(r, grad ? F_PASS : F_CONTRACT, p->d[d]);
    r->in[0][d] = f;
    if (d < y->rank) r->in[1][d] = f;
    if (w && d < w->rank) r->in[n->nin - 1][d] = f;
    if (grad) r->out[d] = f;
  }
  if (p->rank > 1) {
    int c = factor(r, F_FULL, p->d[p->rank - 1]);
    r->in[0][p->rank - 1] = c;
    if (y->rank == p->rank) r->in[1][p->rank - 1] = c;
    if (grad) r->out[p->rank - 1] = c;
  }
}

// kdcc --sample-weight: the weighted kernels (kdrt_loss_w, ...) take the
// rows' weights after the operands.
// issue 25: Huber's delta by name (the other losses have no parameter: 0).
static char *loss_param(const Node *n) {
  return n->loss.kind == KDRT_LOSS_HUBER
             ? hparam(n, "delta", n->loss.param,
                      format("its loss Huber(delta=%g)", n->loss.param))
             : flt(n->loss.param);
}

static void loss_emit_w(const Node *n, Lowering *lw, char *rows, char *cols) {
  const Node *p = n->in[0];
  char *w = buf(n->in[n->nin - 1]);
  if (n->op == OP_METRIC) {
    lower_call(lw, KN_accuracy_w, NULL, "%s, %d, %s, %s, %s, %s, %s, %s, %s",
               loss_c[n->loss.kind], n->loss.from_logits, buf(n), buf(p), buf(n->in[1]), w, rows,
               cols, scale_c(n, p));
    return;
  }
  lower_call(lw, n->op == OP_LOSS ? KN_loss_w : KN_loss_grad_w, NULL,
             "%s, %d, %s, %s, %s, %s, %s, %s, %s, %s, %s", loss_c[n->loss.kind],
             n->loss.from_logits, loss_param(n), buf(n), buf(p), buf(n->in[1]),
             n->nin > 3 ? buf(n->in[2]) : "NULL", w, rows, cols, scale_c(n, p));
}

static void loss_emit(const Node *n, Lowering *lw) {
  const Node *p = n->in[0];
  char *rows = p->shape.rank > 1 ? rows_c(p) : elems_c(p);
  char *cols = p->shape.rank > 1 ? cols_c(p) : "1";
  if (n->loss.weighted) {
    loss_emit_w(n, lw, rows, cols);
    return;
  }
  if (n->op == OP_METRIC) {
    lower_call(lw, KN_accuracy, NULL, "%s, %d, %s, %s, %s, %s, %s, %s", loss_c[n->loss.kind],
               n->loss.from_logits, buf(n), buf(p), buf(n->in[1]), rows, cols, scale_c(n, p));
    return;
  }
  lower_call(lw, n->op == OP_LOSS ? KN_loss : KN_loss_grad, NULL,
             "%s, %d, %s, %s, %s, %s, %s, %s, %s, %s", loss_c[n->loss.kind], n->loss.from_logits,
             loss_param(n), buf(n), buf(p), buf(n->in[1]), n->nin > 2 ? buf(n->in[2]) : "NULL",
             rows, cols, scale_c(n, p));
}

const OpDef op_LOSS = {"loss", -1, 0, false, loss_rule, NULL, loss_emit, shape_scalar};
const OpDef op_METRIC = {"accuracy", -1, 0, false, loss_rule, NULL, loss_emit, shape_scalar};
const OpDef op_LOSS_GRAD = {"loss_grad", -1, 0, false, loss_rule, NULL, loss_emit, shape_in0};

// issue 11: y -> 1 when an element of y is neither 0 nor 1, else 0: a max
// over every dim (ranks holding parts of y all-reduce it, max).
static void not_binary_rule(const Node *n, Rule *r) {
  const Shape *y = &n->in[0]->shape;
  for (int d = 0; d < y->rank; d++) r->in[0][d] = factor(r, F_MAX, y->d[d]);
}

static void not_binary_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_not_binary, NULL, "%s, %s, %s", buf(n), buf(n->in[0]),
             elems_c(n->in[0]));
}

const OpDef op_NOT_BINARY = {"not_binary", 1, 0, false, not_binary_rule, NULL, not_binary_emit,
                             shape_scalar};

// Sparse crossentropy from logits x[rows.., V], by its row statistics, so
// that V may stay split (vocab-parallel): m = max over V (a split leaves a
// pending max: all-reduce max), s = sum of exp(x - m) (pending sum), then
// each device's rows and classes contribute their share of the loss and of
// the gradient. Bytes: two floats a row instead of the row.

// x[r.., V] (and y[r..], m[r..], s[r..]) -> a scalar or, for the grad, x's shape.
static void xent_rule(const Node *n, Rule *r) {
  const Shape *x = &n->in[0]->shape;
  bool grad = n->op == OP_XENT_GRAD;
  bool stat = n->op == OP_ROW_MAX || n->op == OP_ROW_SUMEXP;
  for (int d = 0; d + 1 < x->rank; d++) {
    int f = factor(r, grad || stat ? F_PASS : F_CONTRACT, x->d[d]);
    for (int i = 0; i < n->nin; i++) r->in[i][d] = f;
    if (grad || stat) r->out[d] = f;
  }
  int v = factor(r, n->op == OP_ROW_MAX ? F_MAX : grad ? F_PASS : F_CONTRACT, x->d[x->rank - 1]);
  r->in[0][x->rank - 1] = v;
  if (grad) r->out[x->rank - 1] = v;
}

static void xent_emit(const Node *n, Lowering *lw) {
  if (n->fused) { // issue 22: fuse.c's fuse_xent
    lw->note = "made by the fused crossentropy after it";
    return;
  }
  const Node *x = n->in[0];
  char *rows = rows_c(x), *cols = cols_c(x);
  char *col0 = block_start(x, x->shape.rank - 1);
  switch (n->op) {
  case OP_ROW_MAX:
    lower_call(lw, KN_row_max, NULL, "%s, %s, %s, %s", buf(n), buf(x), rows, cols);
    return;
  case OP_ROW_SUMEXP:
    lower_call(lw, KN_row_sumexp, NULL, "%s, %s, %s, %s, %s", buf(n), buf(x),
               buf(n->in[1]), rows, cols);
    return;
  case OP_XENT: case OP_XENT_GRAD:
    if (n->loss.weighted) {
      lower_call(lw, n->op == OP_XENT ? KN_sparse_xent_w : KN_sparse_xent_grad_w, NULL,
                 "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s", buf(n), buf(x), buf(n->in[1]),
                 buf(n->in[2]), buf(n->in[3]), buf(n->in[4]), rows, cols, col0, scale_c(n, x));
      return;
    }
    lower_call(lw, n->op == OP_XENT ? KN_sparse_xent : KN_sparse_xent_grad, NULL,
               "%s, %s, %s, %s, %s, %s, %s, %s, %s", buf(n), buf(x), buf(n->in[1]),
               buf(n->in[2]), buf(n->in[3]), rows, cols, col0, scale_c(n, x));
    return;
  case OP_XENT_ACC:
    if (n->loss.weighted) {
      lower_call(lw, KN_sparse_xent_acc_w, NULL, "%s, %s, %s, %s, %s, %s, %s, %s, %s",
                 buf(n), buf(x), buf(n->in[1]), buf(n->in[2]), buf(n->in[3]), rows, cols, col0,
                 scale_c(n, x));
      return;
    }
    lower_call(lw, KN_sparse_xent_acc, NULL, "%s, %s, %s, %s, %s, %s, %s, %s",
               buf(n), buf(x), buf(n->in[1]), buf(n->in[2]), rows, cols, col0, scale_c(n, x));
    return;
  default: unreachable();
  }
}

const OpDef op_ROW_MAX = {"row_max", 1, 0, false, xent_rule, NULL, xent_emit, shape_rows};
const OpDef op_ROW_SUMEXP = {"row_sumexp", 2, 0, false, xent_rule, NULL, xent_emit, shape_rows};
const OpDef op_XENT = {"sparse_xent", -1, 0, false, xent_rule, NULL, xent_emit, shape_scalar};
const OpDef op_XENT_GRAD = {"sparse_xent_grad", -1, 0, false, xent_rule, NULL, xent_emit,
                            shape_in0};
const OpDef op_XENT_ACC = {"sparse_xent_acc", -1, 0, false, xent_rule, NULL, xent_emit,
                           shape_scalar};

// issue 22: XENT_FUSED(x, y, dx, [acc], [w]), the loss XENT whose node it
// is, also writing the XENT_GRAD dx and the XENT_ACC acc before it (fused:
// no code of their own), where V is whole (fuse.c's fuse_xent): the rows
// contract, V needs its whole extent, dx is placed as x.
static void xent_fused_rule(const Node *n, Rule *r) {
  const Shape *x = &n->in[0]->shape;
  for (int d = 0; d + 1 < x->rank; d++) {
    int f = factor(r, F_CONTRACT, x->d[d]);
    for (int i = 0; i < n->nin; i++)
      if (n->in[i]->shape.rank) r->in[i][d] = f; // (not acc, a scalar)
  }
  r->in[0][x->rank - 1] = r->in[2][x->rank - 1] = factor(r, F_FULL, x->d[x->rank - 1]);
}

static void xent_fused_emit(const Node *n, Lowering *lw) {
  const Node *x = n->in[0], *dx = n->in[2];
  const Node *acc = n->nin > 3 && n->in[3]->op == OP_XENT_ACC ? n->in[3] : NULL;
  const char *w = n->loss.weighted ? buf(n->in[n->nin - 1]) : "NULL";
  char *args = format("%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s", buf(n),
                      acc ? buf(acc) : "NULL", lw->step == STEP_EVAL ? "NULL" : buf(dx), buf(x),
                      buf(n->in[1]), w, acc && acc->loss.weighted ? w : "NULL", rows_c(x),
                      cols_c(x), scale_c(n, x), acc ? scale_c(acc, x) : "0", scale_c(dx, x));
  if (lw->step == STEP_EVAL) { // evaluation and predict need no gradient
    lw->note = "the loss (and accuracy) alone: no gradient outside training";
    lower_call(lw, KN_sparse_xent_fused, NULL, "%s", args);
    return;
  }
  lower_call_rnd(lw, dx, KN_sparse_xent_fused, NULL, "%s", args);
}

const OpDef op_XENT_FUSED = {"sparse_xent_fused", -1, 0, false, xent_fused_rule, NULL,
                             xent_fused_emit, shape_scalar};

// ---------------------------------------------------------------- issue 15: BN_STATS, BATCH_NORM, BN_GRAD
// Batch normalization in three passes over the activations: the sums of
// its statistics (BN_STATS: a split batch leaves partial sums, which the
// lattice all-reduces: synchronized batch norm), the normalization
// (BATCH_NORM, per channel of the last dim) and, backward, one BN_STATS of
// dy and dy * (x - m) then BN_GRAD. BATCH_NORM's gradient in x is the whole
// of batch norm's, through the batch statistics too (the classic formula),
// so none flows into its m and v operands: in training they are x's own
// statistics, outside it the moving ones, which are not trained.

// x (and dy) [lead.., c]: the lead dims contract, c passes; m [c].
static void bn_stats_rule(const Node *n, Rule *r) {
  const Node *x = n->in[0];
  int rx = x->shape.rank, c = factor(r, F_PASS, x->shape.d[rx - 1]);
  for (int d = 0; d < rx - 1; d++) r->in[0][d] = factor(r, F_CONTRACT, x->shape.d[d]);
  r->in[0][rx - 1] = c;
  if (n->nin > 1) r->in[1][0] = c;
  if (n->nin > 2)
    for (int d = 0; d < rx; d++) r->in[2][d] = r->in[0][d];
  if (n->nin > 2) {
    r->out[0] = factor(r, F_FULL, 2);
    r->out[1] = c;
  } else {
    r->out[0] = c;
  }
}

static void bn_stats_emit(const Node *n, Lowering *lw) {
  const Node *x = n->in[0];
  lower_call(lw, KN_bn_stats, NULL, "%s, %s, %s, %s, %s, %s", buf(n), buf(x),
             n->nin > 1 ? buf(n->in[1]) : "NULL", n->nin > 2 ? buf(n->in[2]) : "NULL",
             lead_c(x, 1), trail_c(x, 1));
}

static bool bn_stats_shape(const Node *n, Shape *out) {
  const Shape *x = &n->in[0]->shape;
  *out = n->nin > 2 ? (Shape){2, {2, x->d[x->rank - 1]}} : (Shape){1, {x->d[x->rank - 1]}};
  return true;
}

const OpDef op_BN_STATS = {"bn_stats", -1, 0, false, bn_stats_rule, NULL, bn_stats_emit,
                           bn_stats_shape};

// The operands before `chan` are x's shape, elementwise with the result;
// the rest are per channel (x's last dim), [c] or (BN_GRAD's s) [2, c].
static void bn_rule(const Node *n, Rule *r, int chan) {
  int rx = n->shape.rank;
  for (int d = 0; d < rx; d++) r->out[d] = factor(r, F_PASS, n->shape.d[d]);
  for (int i = 0; i < chan; i++)
    for (int d = 0; d < rx; d++) r->in[i][d] = r->out[d];
  for (int i = chan; i < n->nin; i++) {
    if (n->in[i]->shape.rank == 2) r->in[i][0] = factor(r, F_FULL, 2);
    r->in[i][n->in[i]->shape.rank - 1] = r->out[rx - 1];
  }
}

static void batch_norm_rule(const Node *n, Rule *r) { bn_rule(n, r, 1); }
static void bn_grad_rule(const Node *n, Rule *r) { bn_rule(n, r, 2); }

// dx = BN_GRAD(dy, x, m, v, g, s); dg = rsqrt(v + eps) * sum dy * (x - m),
// db = sum dy: both rows of s = BN_STATS(x, m, dy).
static void batch_norm_grad(Graph *g, Node *n, const bool *need) {
  Node *x = n->in[0], *m = n->in[1], *v = n->in[2], *gam = n->in[3], *beta = n->in[4];
  Node *in[6] = {x, m, n->grad};
  Node *s = op_make(g, OP_BN_STATS, 3, in, &(Node){0});
  if (need[x->id]) {
    Node *gin[6] = {n->grad, x, m, v, gam, s};
    Node *dx = op_make(g, OP_BN_GRAD, 6, gin, &(Node){.bn = n->bn});
    dx->bn.act = ACT_LINEAR;
    accumulate(g, x, n->bn.rnd ? round_to(g, dx, n->bn.rnd) : dx);
  }
  for (int k = 0; k < 2; k++) {
    Node *w = k ? gam : beta;
    if (!need[w->id]) continue;
    Node *row = make1(g, OP_SLICE, s, .cat = {0, k, 1});
    Node *sum = new_node1(g, OP_RESHAPE, row, m->shape);
    if (k) {
      Node *ve = make1(g, OP_SCALE, v, .aff = (AffAttr){1, n->bn.eps, "epsilon"});
      Node *r = make1(g, OP_ACT, ve, .act.kind = KDRT_ACT_RSQRT);
      sum = make2(g, OP_MUL, sum, r);
    }
    accumulate(g, w, sum);
  }
}

static void batch_norm_emit(const Node *n, Lowering *lw) {
  const Node *x = n->in[0];
  lower_call(lw, KN_batch_norm, NULL, "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s",
             act_c[n->bn.act], buf(n), buf(x), buf(n->in[1]), buf(n->in[2]), buf(n->in[3]),
             buf(n->in[4]), lead_c(x, 1), trail_c(x, 1),
             // an activation fused after it (fuse.c) is the node's layer: the
             // epsilon is the batch norm's, whose moving mean in[1] selects
             hparam(n->bn.act != ACT_LINEAR ? n->in[1] : n, "epsilon", n->bn.eps, NULL));
}

static void bn_grad_emit(const Node *n, Lowering *lw) {
  const Node *x = n->in[1];
  lower_call(lw, KN_bn_grad, NULL, "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
             "(double)B * %.17g", buf(n), buf(n->in[0]), buf(x), buf(n->in[2]), buf(n->in[3]),
             buf(n->in[4]), buf(n->in[5]), lead_c(x, 1), trail_c(x, 1),
             hparam(n, "epsilon", n->bn.eps, NULL),
             n->bn.per);
}

const OpDef op_BATCH_NORM = {"batch_norm", 5, 0, false, batch_norm_rule, batch_norm_grad,
                             batch_norm_emit, shape_in0};
const OpDef op_BN_GRAD = {"bn_grad", 6, 0, false, bn_grad_rule, NULL, bn_grad_emit, shape_in0};

// ---------------------------------------------------------------- issue 11: RECUR, RECUR_GRAD, REVERSE
// A recurrent layer's recurrence as one op (runtime/kdrt_rnn.h's records):
// RECUR(xw[B, T, G*U], r[U, G*U][, brec[G*U]]) -> y[B, T, width], and
// RECUR_GRAD(dy, y, r) -> d[B, T, grad width], each emitted as a loop over
// the steps in the program, one runtime call a step (its GEMM and its
// cells; the gradient's from the last step down). The batch passes through (a
// batch split runs each device's rows); every other dim is needed whole:
// the steps are a sequence, and a unit of h feeds every unit of the next
// step, so a kernel split on its units is gathered first (the numbers stay
// the mesh's). The kernels' gradients are ordinary ops made here from the
// records: d xw and d brec are slices and sums of d, dR = h_prev^T . d rec
// over every row and step (a DOT, whose batch contraction the lattice
// all-reduces).

static void recur_rule(const Node *n, Rule *r) {
  int b = factor(r, F_PASS, n->shape.d[0]);
  r->out[0] = b;
  for (int d = 1; d < n->shape.rank; d++) r->out[d] = factor(r, F_FULL, n->shape.d[d]);
  for (int i = 0; i < n->nin; i++) {
    const Shape *s = &n->in[i]->shape;
    bool batched = s->rank == 3; // xw, dy, y; not r and brec
    for (int d = 0; d < s->rank; d++)
      r->in[i][d] = batched && d == 0 ? b : factor(r, F_FULL, s->d[d]);
  }
}

// n's record sliced along its last dim: [off, off + len).
static Node *record_slice(Graph *g, Node *n, int64_t off, int64_t len) {
  return make1(g, OP_SLICE, n, .cat = {2, off, len});
}

static void recur_grad(Graph *g, Node *n, const bool *need) {
  Node *xw = n->in[0], *r = n->in[1];
  int cell = n->rec.cell;
  int64_t U = n->rec.units, GU = kdrt_rnn_gates(cell) * U;
  Node *in[3] = {n->grad, n, r};
  Node *d = op_make(g, OP_RECUR_GRAD, 3, in, &(Node){.rec = n->rec});
  d->layer = n->layer;
  d->loc = n->loc;
  Node *dxw = record_slice(g, d, 0, GU);
  int64_t at = kdrt_rnn_drec_at(cell, U), hc = kdrt_rnn_hcols(cell, U);
  Node *drec = kdrt_rnn_is_gru(cell) ? record_slice(g, d, at, GU) : dxw;
  if (need[xw->id]) accumulate(g, xw, dxw);
  if (need[r->id]) {
    Node *hp = record_slice(g, n, U, U);
    if (hc == GU) {
      accumulate(g, r, dot(g, hp, drec, 0, 2, true, false));
    } else { // GRU_V1: the columns of R_h multiply r * h_prev, not h_prev
      Node *p[2] = {dot(g, hp, record_slice(g, d, at, hc), 0, 2, true, false),
                    dot(g, record_slice(g, n, 8 * U, U), record_slice(g, d, at + hc, U), 0, 2,
                        true, false)};
      accumulate(g, r, make2(g, OP_CONCAT, p[0], p[1], .cat.axis = 1));
    }
  }
  if (n->nin > 2 && need[n->in[2]->id])
    accumulate(g, n->in[2], bias_grad_of(g, drec, n->in[2]));
}

static char *act_arg(Act a) { return xstrdup(act_c[a]); }

static void recur_emit(const Node *n, Lowering *lw) {
  static const char *const cells[] = {"KDRT_RNN_SIMPLE", "KDRT_RNN_LSTM", "KDRT_RNN_GRU",
                                      "KDRT_RNN_GRU_V1"};
  const char *cell = cells[n->rec.cell];
  char *B = sym_c(sym_dim(n, 0, true));
  long long T = n->shape.d[1], U = n->rec.units;
  bool fwd = n->op == OP_RECUR;
  lw->loop = fwd ? format("for (int64_t t = 0; t < %lld; t++)", T)
                 : format("for (int64_t t = %lld; t >= 0; t--)", T - 1);
  lower_call(lw, fwd ? KN_recur : KN_recur_grad, NULL,
             "%s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld, t", cell, act_arg(n->rec.act),
             act_arg(n->rec.ract), buf(n), buf(n->in[0]), buf(n->in[1]),
             fwd ? n->nin > 2 ? buf(n->in[2]) : "NULL" : buf(n->in[2]), B, T, U);
}

// The record [B, T, its width] of xw[B, T, gates * units]; the gradient's
// of the forward's record (operand 1).
static bool recur_shape(const Node *n, Shape *out) {
  int cell = n->rec.cell;
  int64_t U = n->rec.units;
  const Shape *x = &n->in[n->op == OP_RECUR ? 0 : 1]->shape;
  *out = (Shape){3, {x->d[0], x->d[1], n->op == OP_RECUR ? kdrt_rnn_width(cell, U)
                                                         : kdrt_rnn_grad_width(cell, U)}};
  return x->rank == 3;
}

const OpDef op_RECUR = {"recur", -1, 0, false, recur_rule, recur_grad, recur_emit, recur_shape};
const OpDef op_RECUR_GRAD = {"recur_grad", 3, 0, false, recur_rule, NULL, recur_emit,
                             recur_shape};

// x with dim red.dim reversed: that dim is needed whole; its own transpose.
static void reverse_rule(const Node *n, Rule *r) {
  rule_elementwise(n, r);
  r->kind[r->out[n->red.dim]] = F_FULL;
}

static void reverse_grad(Graph *g, Node *n, const bool *need) {
  Node *dx = make1(g, OP_REVERSE, n->grad, .red = n->red);
  accumulate(g, n->in[0], dx);
}

static void reverse_emit(const Node *n, Lowering *lw) {
  int d = n->red.dim;
  lower_call(lw, KN_reverse, NULL, "%s, %s, %s, %s, %s", buf(n), buf(n->in[0]),
             sym_c(sym_prod(n, 0, d, true)), sym_c(sym_dim(n, d, true)),
             sym_c(sym_prod(n, d + 1, n->shape.rank, true)));
}

const OpDef op_REVERSE = {"reverse", 1, 1, false, reverse_rule, reverse_grad, reverse_emit,
                          shape_in0};

// ---------------------------------------------------------------- the table
// Every op of kdrt_ops.def, ops.c's and this file's: here, above both files'
// definitions, so that ops.c calls nothing of this file.

const OpDef *const op_defs[OP_COUNT] = {
#define X(name) [OP_##name] = &op_##name,
#include "../runtime/kdrt_ops.def"
};

void op_rule(const Node *n, Rule *r) {
  *r = (Rule){0};
  for (int i = 0; i < MAX_IN; i++)
    for (int d = 0; d < MAX_RANK; d++) r->in[i][d] = -1;
  for (int d = 0; d < MAX_RANK; d++) r->out[d] = -1;
  op_info(n->op).rule(n, r);
}
