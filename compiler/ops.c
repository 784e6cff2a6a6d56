// The ops of the training graph, each defined once (runtime/kdrt_ops.def
// lists them).
//
// An op is one `const OpDef op_NAME` with, side by side:
//   - its sharding rule: every dimension of every operand and of the result
//     mapped to a named factor (SHARDING.md); only shard.c reads rules;
//   - its gradient: the forward ops that make its operands' gradients from
//     its output's (autodiff.c walks the graph and calls these);
//   - its emission: the runtime calls that compute it on local blocks, one
//     kernel of runtime/kdrt_ops.def (a K line) each, which the C and the
//     CUDA emitters both print (kdrt_<fn> / kdrt_cuda_<fn>), so the
//     backends cannot drift.
// Ops work on global shapes; only emission sees local ones (lshape).
// This file holds the core ops (inputs, DOT, bias and activations,
// add/concat/slice/pad/reshape, dropout and scale, gather, mul, transpose,
// reductions, the optimizer's, the collectives, the elementwise ones of
// issue 11) and the pieces every op is made of; ops_nn.c the
// neural-network families (softmax, convolution and pooling,
// normalizations, attention masks, losses and metrics, batch norm,
// recurrence), made of the pieces declared in ops_impl.h, and the table
// of every op (op_defs), so that this file calls nothing of that one
// (op_make reads the table).
// Adding an op: its lines in runtime/kdrt_ops.def (its X line, its
// attributes' ATTR line, its kernels' K lines), its OpDef in ops.c or
// ops_nn.c with its shape rule, its kernels in both runtimes, its tests.
// Builders make it with make1 or make2 (op_make, here), which give it its
// rule's shape.
#include "ops_impl.h"
#include "../runtime/kdrt_round.h" // kdrt_round_to: a 16-bit clipvalue (issue 23)

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

// ---------------------------------------------------------------- helpers

const char *act_name(int act) {
  static const char *const names[] = {
#define KDRT_X(name, kname, from_x, f, df) kname,
    KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
#define ACT_OP(name, kname) kname,
#include "../runtime/kdrt_ops.def"
  };
  return names[act];
}

const char *const act_c[] = {
#define KDRT_X(name, kname, from_x, f, df) "KDRT_ACT_" #name,
  KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
};

// Whether an activation's derivative needs its input (else its output).
static bool act_from_x(int act) {
  static const bool from_x[] = {
#define KDRT_X(name, kname, fx, f, df) fx,
    KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
  };
  return from_x[act];
}

const char *loss_name(LossKind kind) {
  static const char *const names[] = {
#define KDRT_X(name, kname) kname,
    KDRT_LOSS_LIST(KDRT_X)
#undef KDRT_X
  };
  return names[kind];
}

static const struct {
  const char *name;
  bool ctx;
} kernels[KN_COUNT] = {
#define K(name, args) {#name, false},
#define KC(name, args) {#name, true},
#include "../runtime/kdrt_ops.def"
};

static char *vformat(const char *fmt, va_list ap) {
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) error("out of memory");
  char *args = xstrdup(s); // kdcc's allocator, which the fuzzer's release_all frees
  free(s);
  return args;
}

static void add_call(Lowering *lw, Kernel k, char *decl, char *args) {
  lw->calls = xgrow(lw->calls, lw->ncalls, &lw->cap, sizeof *lw->calls);
  lw->calls[lw->ncalls++] = (Call){kernels[k].name, kernels[k].ctx, decl, args};
}

void lower_call(Lowering *lw, Kernel k, char *decl, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *args = vformat(fmt, ap);
  va_end(ap);
  add_call(lw, k, decl, args);
}

void lower_call_rnd(Lowering *lw, const Node *n, Kernel k, char *decl, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *args = vformat(fmt, ap);
  va_end(ap);
  if (n->round_out) {
    const char *name = kernels[k].name;
    size_t len = strlen(name);
    if (k + 1 >= KN_COUNT || strncmp(kernels[k + 1].name, name, len) ||
        strcmp(kernels[k + 1].name + len, "_rnd"))
      unreachable(); // a fusion gave a kernel without its _rnd form a rounding
    args = format("%s, %s", round_c(n->round_out), args);
    k = (Kernel)(k + 1);
  }
  add_call(lw, k, decl, args);
}

int factor(Rule *r, FactorKind kind, int64_t size) {
  assert(r->nf < MAX_FACTORS);
  r->kind[r->nf] = kind;
  r->size[r->nf] = size;
  r->blocked[r->nf] = false;
  return r->nf++;
}

// Every dim of the result its own PASS factor, shared by every operand of
// the same rank (elementwise ops).
void rule_elementwise(const Node *n, Rule *r) {
  for (int d = 0; d < n->shape.rank; d++) r->out[d] = factor(r, F_PASS, n->shape.d[d]);
  for (int i = 0; i < n->nin; i++)
    for (int d = 0; d < n->in[i]->shape.rank && d < n->shape.rank; d++)
      r->in[i][d] = r->out[d];
}

static void rule_none(const Node *n, Rule *r) { rule_elementwise(n, r); }

// Rows and columns of a tensor seen as [rows, last dim], and its elements,
// local, as C (a batch dim is the step's rows: emit.c's Sym).
char *cols_c(const Node *n) {
  return n->shape.rank ? sym_c(sym_dim(n, n->shape.rank - 1, true)) : xstrdup("1");
}
char *rows_c(const Node *n) {
  return sym_c(sym_prod(n, 0, n->shape.rank ? n->shape.rank - 1 : 0, true));
}
char *elems_c(const Node *n) { return sym_c(sym_prod(n, 0, n->shape.rank, true)); }

// A descriptor declaration, the same text in C and C++; in a block's
// function (issue 25) `lay`, not `l`, which is the block's layer there.
static const char *layout_var(void) { return ECTX.b ? "lay" : "l"; }
static char *layout_decl(const Node *n) {
  return format("const kdrt_layout %s = %s;", layout_var(), sym_layout(n));
}

// The first column (or row) of this device's block of dim d of n: 0 when
// the dim is whole, else its coordinate on the splitting axis times the
// local extent, as a run-time expression.
char *block_start(const Node *n, int d) {
  int a = n->place.axis[d];
  if (a < 0) return xstrdup("0");
  Shape s = lshape(n);
  return format("c->coord[%d] * %lld", a, (long long)s.d[d]);
}

// ---------------------------------------------------------------- shape rules

bool shape_in0(const Node *n, Shape *out) {
  *out = n->in[0]->shape;
  return true;
}

bool shape_in1(const Node *n, Shape *out) {
  *out = n->in[1]->shape;
  return true;
}

bool shape_scalar(const Node *n, Shape *out) {
  *out = (Shape){0};
  return true;
}

bool shape_rows(const Node *n, Shape *out) {
  *out = n->in[0]->shape;
  return out->rank-- > 0;
}

// The builders' constructor: the op's attributes first, then its shape by
// its rule (the op's table, op_defs, is ops_nn.c's data).
Node *op_make(Graph *g, OpKind op, int nin, Node **in, const Node *attr) {
  Node *n = new_node(g, op, nin, in);
  memcpy(&n->act, &attr->act, sizeof(Attrs));
  if (nin) {
    n->layer = in[0]->layer;
    n->loc = in[0]->loc;
  }
  if (!op_info(op).shape || !op_info(op).shape(n, &n->shape)) unreachable();
  return n;
}


// ---------------------------------------------------------------- inputs and variables

static void emit_view(const Node *n, Lowering *lw) { lw->note = "a value of the step: no code"; }

// A variable is its own shape.
static bool param_shape(const Node *n, Shape *out) {
  *out = n->var->shape;
  return true;
}

// INPUT and LABEL are leaves: their shape is the model's (a batch_shape, a
// decode step's cache), which no operand or attribute holds, so they have
// no shape rule and their builder gives it.
const OpDef op_INPUT = {"input", 0, 0, false, rule_none, NULL, emit_view, NULL};
const OpDef op_LABEL = {"label", 0, 0, false, rule_none, NULL, emit_view, NULL};
const OpDef op_PARAM = {"param", 0, 0, false, rule_none, NULL, emit_view, param_shape};

// ---------------------------------------------------------------- DOT
// dot_general with its dims grouped: a = [batch.., M.., K..] (ta: [batch..,
// K.., M..]), b = [batch.., K.., N..] (tb: [batch.., N.., K..]), y =
// [batch.., M.., N..]. Dense on [B, T, H] is a = x (M = B, T; K = H), b =
// the kernel (K = H, N = units). Locally every group is a contiguous block,
// so the op is one strided batched GEMM whatever the split.

bool dot_shape(const Shape *a, const Shape *b, int nb, int nk, bool ta, bool tb, Shape *out) {
  int nm = a->rank - nb - nk, nn = b->rank - nb - nk;
  if (nm < 0 || nn < 0 || nb + nm + nn > MAX_RANK) return false;
  const int64_t *ak = a->d + nb + (ta ? 0 : nm), *bk = b->d + nb + (tb ? nn : 0);
  for (int i = 0; i < nb; i++)
    if (a->d[i] != b->d[i]) return false;
  for (int i = 0; i < nk; i++)
    if (ak[i] != bk[i]) return false;
  out->rank = nb + nm + nn;
  for (int i = 0; i < nb; i++) out->d[i] = a->d[i];
  for (int i = 0; i < nm; i++) out->d[nb + i] = a->d[nb + (ta ? nk : 0) + i];
  for (int i = 0; i < nn; i++) out->d[nb + nm + i] = b->d[nb + (tb ? 0 : nk) + i];
  return true;
}

static void dot_rule(const Node *n, Rule *r) {
  const Shape *a = &n->in[0]->shape, *b = &n->in[1]->shape;
  int nb = n->dot.nb, nk = n->dot.nk, nm = a->rank - nb - nk, nn = b->rank - nb - nk;
  for (int i = 0; i < nb; i++)
    r->in[0][i] = r->in[1][i] = r->out[i] = factor(r, F_PASS, a->d[i]);
  for (int i = 0; i < nm; i++) {
    int ad = nb + (n->dot.ta ? nk : 0) + i;
    r->in[0][ad] = r->out[nb + i] = factor(r, F_PASS, a->d[ad]);
  }
  for (int i = 0; i < nn; i++) {
    int bd = nb + (n->dot.tb ? 0 : nk) + i;
    r->in[1][bd] = r->out[nb + nm + i] = factor(r, F_PASS, b->d[bd]);
  }
  for (int i = 0; i < nk; i++) {
    int ad = nb + (n->dot.ta ? 0 : nm) + i, bd = nb + (n->dot.tb ? nn : 0) + i;
    r->in[0][ad] = r->in[1][bd] = factor(r, F_CONTRACT, a->d[ad]);
  }
  for (int i = 0; n->nin == 3 && i < nn; i++) r->in[2][i] = r->out[nb + nm + i]; // the bias
}

Node *dot(Graph *g, Node *a, Node *b, int nb, int nk, bool ta, bool tb) {
  return make2(g, OP_DOT, a, b, .dot = {.nb = nb, .nk = nk, .ta = ta, .tb = tb});
}

// y = a.b: da = dy.b^T (contracting b's free dims), db = a^T.dy (contracting
// a's free dims), each with the transposes that put the result in the
// operand's stored order.
static void dot_grad(Graph *g, Node *n, const bool *need) {
  Node *dy = n->grad, *a = n->in[0], *b = n->in[1];
  int nb = n->dot.nb, nk = n->dot.nk;
  int nm = a->shape.rank - nb - nk, nn = b->shape.rank - nb - nk;
  bool ta = n->dot.ta, tb = n->dot.tb;
  if (need[a->id])
    accumulate(g, a, ta ? dot(g, b, dy, nb, nn, tb, true) : dot(g, dy, b, nb, nn, false, !tb));
  if (need[b->id])
    accumulate(g, b, tb ? dot(g, dy, a, nb, nm, true, ta) : dot(g, a, dy, nb, nm, !ta, false));
}

// issue 23: the buffer of kdrt_matmul16's widened operands: the CPU
// program's (kdrt.c's kdrt_widen16, WIDEN16_FLOATS), none on the GPU
// (opt_widen16 off)
const char *widen16_c(void) {
  return opt_widen16 ? "kdrt_widen16(c, WIDEN16_FLOATS, B, BATCH)" : "NULL";
}

// issue 23: how kdrt_matmul16 reads an operand (kdrt_defs.h's KDRT_OPND_*)
const char *form16(const Node *x, bool rounds) {
  return x->dtype == DT_U16 ? "KDRT_OPND_16" : rounds ? "KDRT_OPND_ROUND" : "KDRT_OPND_EXACT";
}

static void dot_emit(const Node *n, Lowering *lw) {
  const Node *a = n->in[0], *b = n->in[1];
  int nb = n->dot.nb, nk = n->dot.nk;
  int nm = a->shape.rank - nb - nk, nn = b->shape.rank - nb - nk;
  int m0 = nb + (n->dot.ta ? nk : 0), k0 = nb + (n->dot.ta ? 0 : nm);
  int n0 = nb + (n->dot.tb ? 0 : nk);
  Sym batch = sym_prod(a, 0, nb, true), M = sym_prod(a, m0, m0 + nm, true);
  Sym K = sym_prod(a, k0, k0 + nk, true), N = sym_prod(b, n0, n0 + nn, true);
  Sym zero = {0, NULL};
  bool sgd = n->dot.sgd_into && lw->step == STEP_TRAIN;
  if (sgd) lw->note = format("the SGD update of %s in the same GEMM: w = w - lr * gradient",
                             n->dot.sgd_into->var->path);
  char *decl = format("const kdrt_gemm g = {.ta = %s, .tb = %s, .batch = %s, .M = %s, .N = %s, "
                      ".K = %s,\n"
                      "                          .lda = %s, .ldb = %s, .ldc = %s, .stride_a = %s, "
                      ".stride_b = %s, .stride_c = %s};",
                      n->dot.ta ? "KDRT_TRANS" : "KDRT_NOTRANS",
                      n->dot.tb ? "KDRT_TRANS" : "KDRT_NOTRANS", sym_c(batch), sym_c(M), sym_c(N),
                      sym_c(K), sym_c(n->dot.ta ? M : K), sym_c(n->dot.tb ? K : N), sym_c(N),
                      sym_c(nb ? sym_mul(M, K) : zero), sym_c(nb ? sym_mul(K, N) : zero),
                      sym_c(nb ? sym_mul(M, N) : zero));
  if (n->nin == 3 || n->dot.bgrad) { // issue 22: one call with its epilogue (fuse.c)
    if (n->dot.bgrad)
      lw->note = format("and the bias gradient %%%d, a sum of dy", n->dot.bgrad->id);
    lower_call(lw, KN_matmul_bias, decl, "&g, %s, %s, %s, %s, %s, %s", act_c[n->dot.act],
               buf(a), buf(b), n->nin == 3 ? buf(n->in[2]) : "NULL", buf(n),
               n->dot.bgrad ? buf(n->dot.bgrad) : "NULL");
    return;
  }
  if (n->dot.half) { // issue 23: 16-bit operands, float32 sums (store16.c)
    lower_call(lw, KN_matmul16, decl, "&g, %s, %s, %s, %s, %s, %s, %s",
               round_c(n->dot.half), form16(a, n->dot.rounds & 1), buf(a),
               form16(b, n->dot.rounds & 2), buf(b), buf(n), widen16_c());
    return;
  }
  lower_call(lw, KN_matmul, decl, "&g, %s, %s, %s, %s, %s", sgd ? "-c->lr" : "1.0f", buf(a),
             buf(b), sgd ? "1.0f" : "0.0f", sgd ? buf(n->dot.sgd_into) : buf(n));
}

// nin -1: a, b, and after fuse.c perhaps a bias
static bool dot_shape_rule(const Node *n, Shape *out) {
  return dot_shape(&n->in[0]->shape, &n->in[1]->shape, n->dot.nb, n->dot.nk, n->dot.ta,
                   n->dot.tb, out);
}

const OpDef op_DOT = {"dot", -1, 3, false, dot_rule, dot_grad, dot_emit, dot_shape_rule};

// ---------------------------------------------------------------- BIAS, ACT, BIAS_ACT

// b (or g) covers x's trailing dims: they share factors with the result's.
void bias_rule(const Node *n, Rule *r) {
  rule_elementwise(n, r);
  int rb = n->in[1]->shape.rank, off = n->shape.rank - rb;
  for (int d = 0; d < MAX_RANK; d++) r->in[1][d] = -1;
  for (int d = 0; d < rb; d++) r->in[1][d] = r->out[off + d];
}

// Rows and columns of n seen as [rows, trailing dims of rank rb], local.
char *lead_c(const Node *n, int rb) {
  return sym_c(sym_prod(n, 0, n->shape.rank - rb, true));
}
char *trail_c(const Node *n, int rb) {
  return sym_c(sym_prod(n, n->shape.rank - rb, n->shape.rank, true));
}

static void bias_grad(Graph *g, Node *n, const bool *need) {
  Node *a = n->in[0], *b = n->in[1];
  if (need[a->id]) accumulate(g, a, n->grad);
  if (need[b->id]) accumulate(g, b, bias_grad_of(g, n->grad, b));
}

static void bias_act_emit(const Node *n, Lowering *lw) {
  int rb = n->in[1]->shape.rank;
  lower_call_rnd(lw, n, KN_bias_act, NULL, "%s, %s, %s, %s, %s, %s",
                 act_c[n->op == OP_BIAS ? ACT_LINEAR : n->act.kind], buf(n), buf(n->in[0]),
                 buf(n->in[1]), lead_c(n, rb), trail_c(n, rb));
}

const OpDef op_BIAS = {"bias_add", 2, 0, false, bias_rule, bias_grad, bias_act_emit, shape_in0};
// Made by fuse.c after differentiation: never differentiated itself.
const OpDef op_BIAS_ACT = {"bias_act", 2, 0, false, bias_rule, NULL, bias_act_emit, shape_in0};

static void act_grad(Graph *g, Node *n, const bool *need) {
  Node *a = n->in[0];
  Node *dx = make2(g, OP_ACT_GRAD, n->grad, act_from_x(n->act.kind) ? a : n, .act = n->act);
  accumulate(g, a, dx);
}

static void act_emit(const Node *n, Lowering *lw) {
  lower_call_rnd(lw, n, KN_act, NULL, "%s, %s, %s, %s", act_c[n->act.kind], buf(n), buf(n->in[0]),
                 elems_c(n));
}

const OpDef op_ACT = {"act", 1, 0, false, rule_elementwise, act_grad, act_emit, shape_in0};

// dx = dy * act'(t): t is the input or the output, whichever the
// derivative needs; the runtime reads the one it needs.
static void act_grad_emit(const Node *n, Lowering *lw) {
  char *t = buf(n->in[1]);
  if (n->in[1]->dtype == DT_U16) { // issue 23: the saved x or y in its 16 bits (store16.c)
    lower_call_rnd(lw, n, KN_act_grad16, NULL, "%s, %s, %s, %s, %s, %s", act_c[n->act.kind],
                   round_c(n->in[1]->rnd.kind), buf(n), buf(n->in[0]), t, elems_c(n));
    return;
  }
  lower_call_rnd(lw, n, KN_act_grad, NULL, "%s, %s, %s, %s, %s, %s", act_c[n->act.kind], buf(n),
                 buf(n->in[0]), t, t, elems_c(n));
}

const OpDef op_ACT_GRAD = {"act_grad", 2, 1, false, rule_elementwise, NULL, act_grad_emit,
                           shape_in0};

// ---------------------------------------------------------------- ADD, CONCAT, SLICE, RESHAPE

static void add_grad(Graph *g, Node *n, const bool *need) {
  for (int i = 0; i < n->nin; i++)
    if (need[n->in[i]->id]) accumulate(g, n->in[i], n->grad);
}

static void add_emit(const Node *n, Lowering *lw) {
  char *list = xstrdup("");
  for (int i = 0; i < n->nin; i++) list = format("%s%s%s", list, i ? ", " : "", buf(n->in[i]));
  lower_call_rnd(lw, n, KN_add, format("const float *const in[] = {%s};", list), "%s, in, %d, %s",
                 buf(n), n->nin, elems_c(n));
}

const OpDef op_ADD = {"add", -1, 0xff, true, rule_elementwise, add_grad, add_emit, shape_in0};

// Every dim but the axis passes; along the axis each tensor has its own
// extent, needed whole.
void rule_whole_axis(const Node *n, Rule *r, int ax) {
  rule_elementwise(n, r);
  r->kind[r->out[ax]] = F_FULL;
  for (int i = 0; i < n->nin; i++) r->in[i][ax] = factor(r, F_FULL, n->in[i]->shape.d[ax]);
}

static void cat_rule(const Node *n, Rule *r) { rule_whole_axis(n, r, n->cat.axis); }

static void concat_grad(Graph *g, Node *n, const bool *need) {
  int64_t start = 0;
  for (int i = 0; i < n->nin; i++) {
    Node *x = n->in[i];
    if (need[x->id]) {
      int64_t len = x->shape.d[n->cat.axis];
      accumulate(g, x, make1(g, OP_SLICE, n->grad, .cat = {n->cat.axis, start, len}));
    }
    start += x->shape.d[n->cat.axis];
  }
}

static void concat_emit(const Node *n, Lowering *lw) {
  int ax = n->cat.axis;
  int64_t off = 0;
  for (int i = 0; i < n->nin; i++) {
    Shape is = lshape(n->in[i]);
    lower_call(lw, KN_place_block, NULL, "%s, %s, %s, %lld, %lld, %s, %s", buf(n),
               buf(n->in[i]), sym_c(sym_prod(n, 0, ax, true)), (long long)is.d[ax],
               (long long)off, sym_c(sym_dim(n, ax, true)),
               sym_c(sym_prod(n, ax + 1, n->shape.rank, true)));
    off += is.d[ax];
  }
}

static void slice_emit(const Node *n, Lowering *lw) {
  int ax = n->cat.axis;
  lower_call(lw, KN_copy_block, NULL, "%s, %s, %s, %s, %lld, %s, %s", buf(n),
             buf(n->in[0]), sym_c(sym_prod(n, 0, ax, true)), sym_c(sym_dim(n->in[0], ax, true)),
             (long long)n->cat.start, sym_c(sym_dim(n, ax, true)),
             sym_c(sym_prod(n, ax + 1, n->shape.rank, true)));
}

// SLICE's and PAD's gradient is the other, back to the operand's extent.
static CatAttr back(const Node *n) {
  return (CatAttr){n->cat.axis, n->cat.start, n->in[0]->shape.d[n->cat.axis]};
}

static void slice_grad(Graph *g, Node *n, const bool *need) {
  accumulate(g, n->in[0], make1(g, OP_PAD, n->grad, .cat = back(n)));
}

static void pad_grad(Graph *g, Node *n, const bool *need) {
  accumulate(g, n->in[0], make1(g, OP_SLICE, n->grad, .cat = back(n)));
}

static void pad_emit(const Node *n, Lowering *lw) {
  int ax = n->cat.axis;
  lower_call(lw, KN_pad_block, NULL, "%s, %s, %s, %s, %lld, %s, %s", buf(n), buf(n->in[0]),
             sym_c(sym_prod(n, 0, ax, true)), sym_c(sym_dim(n->in[0], ax, true)),
             (long long)n->cat.start, sym_c(sym_dim(n, ax, true)),
             sym_c(sym_prod(n, ax + 1, n->shape.rank, true)));
}

static bool concat_shape(const Node *n, Shape *out) {
  *out = n->in[0]->shape;
  if (n->cat.axis >= out->rank) return false;
  for (int i = 1; i < n->nin; i++) out->d[n->cat.axis] += n->in[i]->shape.d[n->cat.axis];
  return true;
}

const OpDef op_CONCAT = {"concat", -1, 0xff, true, cat_rule, concat_grad, concat_emit,
                         concat_shape};
// x with its extent along the axis n: a slice [start, start + n) of it, or
// it padded to n with zeros, at start.
static bool slice_shape(const Node *n, Shape *out) {
  const Shape *x = &n->in[0]->shape;
  int ax = n->cat.axis;
  if (ax < 0 || ax >= x->rank || n->cat.start < 0) return false;
  *out = *x;
  out->d[ax] = n->cat.n;
  const Shape *big = n->op == OP_SLICE ? x : out, *small = n->op == OP_SLICE ? out : x;
  return small->d[ax] > 0 && n->cat.start + small->d[ax] <= big->d[ax];
}

const OpDef op_SLICE = {"slice", 1, 1, false, cat_rule, slice_grad, slice_emit, slice_shape};
const OpDef op_PAD = {"pad", 1, 1, false, cat_rule, pad_grad, pad_emit, slice_shape};

// Reshape: split both shapes into groups of equal products. In each group
// the major-most dims of input and output share one factor (a block split
// of the major dim is a block split of the merged one); the rest need their
// whole extent.
static void reshape_rule(const Node *n, Rule *r) {
  const Shape *a = &n->in[0]->shape, *b = &n->shape;
  int i = 0, j = 0;
  while (i < a->rank || j < b->rank) {
    // a unit dim on one side only is a group of its own, so that a split dim
    // beside it passes ([b, t, 1, c] -> [b, t, c]: Conv1D's views)
    bool ua = i < a->rank && a->d[i] == 1, ub = j < b->rank && b->d[j] == 1;
    if (ua != ub) {
      if (ua) r->in[0][i++] = factor(r, F_FULL, 1);
      else r->out[j++] = factor(r, F_FULL, 1);
      continue;
    }
    int i0 = i, j0 = j;
    int64_t pa = i < a->rank ? a->d[i++] : 1, pb = j < b->rank ? b->d[j++] : 1;
    while (pa != pb) {
      if (pa < pb && i < a->rank) pa *= a->d[i++];
      else if (j < b->rank) pb *= b->d[j++];
      else break;
    }
    int64_t sa = i0 < a->rank ? a->d[i0] : 1, sb = j0 < b->rank ? b->d[j0] : 1;
    int f = factor(r, F_PASS, sa < sb ? sa : sb);
    if (i0 < a->rank) r->in[0][i0] = f;
    if (j0 < b->rank) r->out[j0] = f;
    for (int k = i0 + 1; k < i; k++) r->in[0][k] = factor(r, F_FULL, a->d[k]);
    for (int k = j0 + 1; k < j; k++) r->out[k] = factor(r, F_FULL, b->d[k]);
  }
}

static void reshape_grad(Graph *g, Node *n, const bool *need) {
  accumulate(g, n->in[0], new_node1(g, OP_RESHAPE, n->grad, n->in[0]->shape));
}

static void reshape_emit(const Node *n, Lowering *lw) {
  lw->note = format("a view of %%%d: no code", n->in[0]->id);
}

// The new shape is the op's attribute (JAX's new_sizes), held as the node's
// own shape: the rule keeps it where it keeps the element count.
static bool reshape_shape(const Node *n, Shape *out) {
  *out = n->shape;
  return shape_elems(out) == shape_elems(&n->in[0]->shape);
}

const OpDef op_RESHAPE = {"reshape", 1, 1, false, reshape_rule, reshape_grad, reshape_emit,
                          reshape_shape};

// ---------------------------------------------------------------- DROPOUT, SCALE

// DROPOUT and NOISE (issue 11): the same draws on dy give the gradient
// (the mask, or GaussianDropout's factor); GaussianNoise's passes it.
static void random_grad(Graph *g, Node *n, const bool *need) {
  if (n->op == OP_NOISE && !n->drop.mul) {
    accumulate(g, n->in[0], n->grad);
    return;
  }
  Node *dx = make1(g, n->op, n->grad, .drop = n->drop); // the same draws
  accumulate(g, n->in[0], dx);
}

static char *stream_c(const Node *n) {
  return format("0x%016llxull", (unsigned long long)n->drop.stream);
}

static void random_emit(const Node *n, Lowering *lw) {
  bool drop = n->op == OP_DROPOUT;
  if (lw->step == STEP_EVAL) {
    lw->note = drop ? "no dropout outside training" : "no noise outside training";
    lower_call(lw, KN_copy, NULL, "%s, %s, %s", buf(n), buf(n->in[0]), elems_c(n));
    return;
  }
  // each layer's draws its own (a hash of its path): in a block, a table by layer
  char *stream = per_layer(n, "stream", "uint64_t", "its random stream, by layer", stream_c);
  if (drop)
    lower_call(lw, KN_dropout, layout_decl(n), "%s, %s, &%s, %s, %s", buf(n),
               buf(n->in[0]), layout_var(), hparam(n, "rate", n->drop.rate, NULL), stream);
  else
    lower_call(lw, KN_gaussian_noise, layout_decl(n), "%s, %s, &%s, %s, %d, %s", buf(n),
               buf(n->in[0]), layout_var(), hparam(n, "stddev", n->drop.rate,
                      n->drop.mul ? "its factor's stddev, sqrt(rate / (1 - rate))" : NULL),
               n->drop.mul, stream);
}

const OpDef op_DROPOUT = {"dropout", 1, 1, false, rule_elementwise, random_grad, random_emit,
                          shape_in0};

static void scale_grad(Graph *g, Node *n, const bool *need) {
  Node *dx = make1(g, OP_SCALE, n->grad,
                   .aff = (AffAttr){n->aff.scale, 0, n->aff.shift == 0 ? n->aff.hp : NULL});
  accumulate(g, n->in[0], dx);
}

static void scale_emit(const Node *n, Lowering *lw) {
  // issue 25: a Keras hyper-parameter by name (AffAttr.hp): attention's scale
  // of its scores, a logit soft cap, or a frozen batch norm's epsilon
  const char *hp = n->aff.hp;
  char *scale = flt(n->aff.scale), *shift = flt(n->aff.shift);
  if (hp && !strcmp(hp, "epsilon")) shift = hparam(n, hp, n->aff.shift, NULL);
  else if (hp && !strcmp(hp, "scale")) scale = attn_scale(n, n->aff.scale);
  else if (hp && !strcmp(hp, "1/logit_soft_cap"))
    scale = hparam(n, "one_over_logit_soft_cap", n->aff.scale, "1 / logit_soft_cap");
  else if (hp) scale = hparam(n, hp, n->aff.scale, NULL);
  lower_call(lw, KN_scale, NULL, "%s, %s, %s, %s, %s", buf(n), buf(n->in[0]), elems_c(n),
             scale, shift);
}

const OpDef op_SCALE = {"scale", 1, 0, false, rule_elementwise, scale_grad, scale_emit, shape_in0};

// ---------------------------------------------------------------- GATHER, SCATTER_ADD
// table[V, D], ids[b, t..] -> y[b, t.., D]. The vocabulary V contracts: a
// table split on V looks up only the ids in its rows (zeros elsewhere), a
// partial sum over that axis. The gradient is a scatter-add into the
// table's rows, the ids' dims contracting (the batch: a sum over 'data').

static void gather_rule(const Node *n, Rule *r) {
  const Shape *t = &n->in[0]->shape, *ids = &n->in[1]->shape;
  r->in[0][0] = factor(r, F_CONTRACT, t->d[0]);
  r->in[0][1] = r->out[ids->rank] = factor(r, F_PASS, t->d[1]);
  for (int d = 0; d < ids->rank; d++) r->in[1][d] = r->out[d] = factor(r, F_PASS, ids->d[d]);
}

static void scatter_rule(const Node *n, Rule *r) {
  const Shape *dy = &n->in[0]->shape, *ids = &n->in[1]->shape;
  r->out[0] = factor(r, F_PASS, n->shape.d[0]);
  r->out[1] = r->in[0][ids->rank] = factor(r, F_PASS, n->shape.d[1]);
  for (int d = 0; d < ids->rank; d++) r->in[0][d] = r->in[1][d] = factor(r, F_CONTRACT, dy->d[d]);
}

static void gather_grad(Graph *g, Node *n, const bool *need) {
  Node *t = n->in[0];
  if (need[t->id])
    accumulate(g, t, make2(g, OP_SCATTER_ADD, n->grad, n->in[1], .red.n = t->shape.d[0]));
}

static void gather_emit(const Node *n, Lowering *lw) {
  const Node *t = n->in[0];
  Shape ts = lshape(t);
  if (t->dtype == DT_U16) { // issue 23: a table kept in 16 bits (store16.c's var16)
    lower_call(lw, KN_gather16, NULL, "%s, %s, %s, %s, %s, %lld, %lld, %s", round_c(t->rnd.kind),
               buf(n), buf(t), buf(n->in[1]), elems_c(n->in[1]), (long long)ts.d[0],
               (long long)ts.d[1], block_start(t, 0));
    return;
  }
  lower_call(lw, KN_gather, NULL, "%s, %s, %s, %s, %lld, %lld, %s", buf(n), buf(t),
             buf(n->in[1]), elems_c(n->in[1]), (long long)ts.d[0], (long long)ts.d[1],
             block_start(t, 0));
}

static void scatter_emit(const Node *n, Lowering *lw) {
  Shape ts = lshape(n);
  lower_call(lw, KN_scatter_add, NULL, "%s, %s, %s, %s, %lld, %lld, %s", buf(n),
             buf(n->in[0]), buf(n->in[1]), elems_c(n->in[1]), (long long)ts.d[0],
             (long long)ts.d[1], block_start(n, 0));
}

// Linear in the table (operand 0): a partial table gives a partial lookup.
// ids[..] into table[V, E] -> [.., E]
static bool gather_shape(const Node *n, Shape *out) {
  const Shape *t = &n->in[0]->shape;
  *out = n->in[1]->shape;
  if (t->rank != 2 || out->rank == MAX_RANK) return false;
  out->d[out->rank++] = t->d[1];
  return true;
}

const OpDef op_GATHER = {"gather", 2, 1, false, gather_rule, gather_grad, gather_emit,
                         gather_shape};
// dy[.., E] at ids[..] -> the table [red.n, E] (its rows are an attribute:
// no operand has them).
static bool scatter_shape(const Node *n, Shape *out) {
  const Shape *dy = &n->in[0]->shape;
  *out = (Shape){2, {n->red.n, dy->rank ? dy->d[dy->rank - 1] : 0}};
  return dy->rank == n->in[1]->shape.rank + 1;
}

const OpDef op_SCATTER_ADD = {"scatter_add", 2, 1, false, scatter_rule, NULL, scatter_emit,
                              scatter_shape};

// ---------------------------------------------------------------- MUL

static void mul_grad(Graph *g, Node *n, const bool *need) {
  Node *a = n->in[0], *b = n->in[1];
  if (need[a->id]) accumulate(g, a, make2(g, OP_MUL, n->grad, b));
  if (need[b->id]) accumulate(g, b, make2(g, OP_MUL, n->grad, a));
}

static void mul_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_mul, NULL, "%s, %s, %s, %s", buf(n), buf(n->in[0]), buf(n->in[1]),
             elems_c(n));
}

// Linear in each operand separately: a partial sum times a whole value.
const OpDef op_MUL = {"mul", 2, 3, false, rule_elementwise, mul_grad, mul_emit, shape_in0};

// ---------------------------------------------------------------- TRANSPOSE
// y dim i is x dim perm[i]: the factors follow their dims.

static void transpose_rule(const Node *n, Rule *r) {
  for (int d = 0; d < n->shape.rank; d++) {
    int f = factor(r, F_PASS, n->shape.d[d]);
    r->out[d] = f;
    r->in[0][n->perm.perm[d]] = f;
  }
}

static void transpose_grad(Graph *g, Node *n, const bool *need) {
  Node *x = n->in[0];
  PermAttr p = {{0}};
  for (int d = 0; d < n->shape.rank; d++) p.perm[n->perm.perm[d]] = d;
  accumulate(g, x, make1(g, OP_TRANSPOSE, n->grad, .perm = p));
}

static void transpose_emit(const Node *n, Lowering *lw) {
  char *perm = xstrdup("{");
  for (int d = 0; d < n->shape.rank; d++)
    perm = format("%s%s%d", perm, d ? ", " : "", n->perm.perm[d]);
  lower_call(lw, KN_transpose,
             format("const int64_t s[] = %s;\n    const int perm[] = %s};", sym_dims(n->in[0]),
                    perm),
             "%s, %s, %d, s, perm", buf(n), buf(n->in[0]), n->shape.rank);
}

static bool transpose_shape(const Node *n, Shape *out) {
  const Shape *x = &n->in[0]->shape;
  out->rank = x->rank;
  for (int d = 0; d < x->rank; d++) out->d[d] = x->d[n->perm.perm[d]];
  return true;
}

const OpDef op_TRANSPOSE = {"transpose", 1, 1, false, transpose_rule, transpose_grad,
                            transpose_emit, transpose_shape};

// ---------------------------------------------------------------- REDUCE_SUM, BROADCAST
// x[o.., m, i..] -> y[o.., i..] summed over m (which contracts: a split
// leaves a partial sum); BROADCAST is its transpose, a new dim m whose
// every block is the input.

static void reduce_rule(const Node *n, Rule *r) {
  bool red = n->op == OP_REDUCE_SUM;
  const Shape *big = red ? &n->in[0]->shape : &n->shape;
  int8_t *bmap = red ? r->in[0] : r->out, *smap = red ? r->out : r->in[0];
  for (int d = 0, k = 0; d < big->rank; d++) {
    if (d == n->red.dim) {
      bmap[d] = factor(r, red ? F_CONTRACT : F_PASS, big->d[d]);
      continue;
    }
    bmap[d] = smap[k++] = factor(r, F_PASS, big->d[d]);
  }
}

static void reduce_grad(Graph *g, Node *n, const bool *need) {
  Node *x = n->in[0];
  OpKind back = n->op == OP_REDUCE_SUM ? OP_BROADCAST : OP_REDUCE_SUM;
  accumulate(g, x, make1(g, back, n->grad, .red = {n->red.dim, x->shape.d[n->red.dim]}));
}

static void reduce_emit(const Node *n, Lowering *lw) {
  bool red = n->op == OP_REDUCE_SUM;
  const Node *big = red ? n->in[0] : n;
  int d = n->red.dim;
  lower_call(lw, red ? KN_reduce_sum : KN_broadcast, NULL, "%s, %s, %s, %s, %s", buf(n),
             buf(n->in[0]), sym_c(sym_prod(big, 0, d, true)), sym_c(sym_dim(big, d, true)),
             sym_c(sym_prod(big, d + 1, big->shape.rank, true)));
}

static bool reduce_shape(const Node *n, Shape *out) {
  const Shape *x = &n->in[0]->shape;
  out->rank = 0;
  for (int d = 0; d < x->rank; d++)
    if (d != n->red.dim) out->d[out->rank++] = x->d[d];
  return n->red.dim < x->rank;
}

const OpDef op_REDUCE_SUM = {"reduce_sum", 1, 1, false, reduce_rule, reduce_grad, reduce_emit,
                             reduce_shape};
static bool broadcast_shape(const Node *n, Shape *out) {
  const Shape *x = &n->in[0]->shape;
  int d = n->red.dim;
  if (d < 0 || d > x->rank || x->rank == MAX_RANK || n->red.n <= 0) return false;
  out->rank = x->rank + 1;
  for (int i = 0; i < out->rank; i++) out->d[i] = i < d ? x->d[i] : i == d ? n->red.n : x->d[i - 1];
  return true;
}

const OpDef op_BROADCAST = {"broadcast", 1, 1, false, reduce_rule, reduce_grad, reduce_emit,
                            broadcast_shape};

// ---------------------------------------------------------------- BIAS_GRAD

// dy[lead.., trail..] -> the sum over the leading dims, shaped as the bias.
static void bias_grad_rule(const Node *n, Rule *r) {
  const Shape *dy = &n->in[0]->shape;
  int off = dy->rank - n->shape.rank;
  for (int d = 0; d < off; d++) r->in[0][d] = factor(r, F_CONTRACT, dy->d[d]);
  for (int d = 0; d < n->shape.rank; d++)
    r->in[0][off + d] = r->out[d] = factor(r, F_PASS, n->shape.d[d]);
}

static void bias_grad_emit(const Node *n, Lowering *lw) {
  if (n->fused) { // issue 22
    lw->note = "made by the weight gradient's product, after this (its epilogue)";
    return;
  }
  lower_call_rnd(lw, n, KN_bias_grad, NULL, "%s, %s, %s, %s", buf(n), buf(n->in[0]),
                 lead_c(n->in[0], n->shape.rank), trail_c(n->in[0], n->shape.rank));
}

// dy's dims from red.dim on.
static bool bias_grad_shape(const Node *n, Shape *out) {
  const Shape *dy = &n->in[0]->shape;
  int k = n->red.dim;
  if (k < 0 || k > dy->rank) return false;
  out->rank = dy->rank - k;
  for (int d = 0; d < out->rank; d++) out->d[d] = dy->d[k + d];
  return true;
}

Node *bias_grad_of(Graph *g, Node *dy, const Node *b) {
  return make1(g, OP_BIAS_GRAD, dy, .red.dim = dy->shape.rank - b->shape.rank);
}

const OpDef op_BIAS_GRAD = {"bias_grad", 1, 1, false, bias_grad_rule, NULL, bias_grad_emit,
                            bias_grad_shape};

// ---------------------------------------------------------------- GRAD_CLIP, UPDATE

// The optimizer's clipping factor from a sum of squares of gradients:
// clipnorm's for one gradient, global_clipnorm's for all of them.
static void grad_clip_emit(const Node *n, Lowering *lw) {
  const Optimizer *o = &EG->model->opt;
  bool global = o->global_clipnorm > 0;
  if (n->rnd.kind) { // issue 23: of 16-bit gradients (autodiff.c's clip_factor)
    lower_call(lw, KN_grad_clip_factor16, NULL, "%s, %s, %s, %d, %s", buf(n), buf(n->in[0]),
               flt(global ? o->global_clipnorm : o->clipnorm), global, round_c(n->rnd.kind));
    return;
  }
  lower_call(lw, KN_grad_clip_factor, NULL, "%s, %s, %s, %d", buf(n), buf(n->in[0]),
             flt(global ? o->global_clipnorm : o->clipnorm), global);
}

const OpDef op_GRAD_CLIP = {"grad_clip", 1, 0, false, rule_elementwise, NULL, grad_clip_emit,
                            shape_scalar};

// ---------------------------------------------------------------- issue 23: loss scaling
// Keras's LossScaleOptimizer (Optimizer.loss_scale): the backward pass
// starts from the total loss times the dynamic scale (LOSS_SCALE on each
// seed: the scale is a power of two, so where the float32 chain multiplies
// by it changes no bit), so that small float16 gradients do not flush to
// zero (and large ones overflow to infinity). Once every gradient is whole
// in the gradient blob (the update phase's collectives go first, fuse.c),
// UNSCALE is the optimizer's decision for the step (the runtime's
// kdrt_loss_scale_step): every gradient divided by the scale, and the
// updates and constraints run only when all of them are finite on every
// rank (c->apply_update; moving statistics update either way, as Keras's
// come from the forward pass); the optimizer's iterations count the steps
// that update (c->iterations). The gradient check takes the loss's own
// gradients: neither scaled nor unscaled.

static void loss_scale_emit(const Node *n, Lowering *lw) {
  if (lw->step == STEP_GRAD)
    lower_call(lw, KN_copy, NULL, "%s, %s, %s", buf(n), buf(n->in[0]), elems_c(n));
  else
    lower_call(lw, KN_scale, NULL, "%s, %s, %s, c->loss_scale, 0.0f", buf(n),
               buf(n->in[0]), elems_c(n));
}

const OpDef op_LOSS_SCALE = {"loss_scale", 1, 1, false, rule_elementwise, NULL, loss_scale_emit,
                             shape_in0};

static void unscale_emit(const Node *n, Lowering *lw) {
  for (int i = 0; i < EG->nvars; i++) { // every gradient is made before
    const Node *b = EG->vars[i]->grad;
    while (b && b->op == OP_RESHAPE) b = b->in[0];
    if (b && b->id > n->id) unreachable();
  }
  lw->note = "every gradient / the scale; whether the updates below run (c->apply_update)";
  lower_call(lw, KN_loss_scale_step, NULL, "G");
}

const OpDef op_UNSCALE = {"unscale", 0, 0, false, rule_none, NULL, unscale_emit, shape_scalar};

// The optimizer's step t (from 1) in an update's call: its iterations,
// which a loss scale's skipped steps do not count.
static const char *opt_step(void) {
  return EG->model->opt.loss_scale ? "c->iterations + 1" : "c->step + 1";
}

// A loss-scaled program's update or constraint runs only on a step whose
// gradients are finite (UNSCALE).
static void guard_update(Lowering *lw) {
  if (EG->model->opt.loss_scale) lw->loop = "if (c->apply_update)";
}

// w, g and the gradient's clipping factor f (a scalar, whole on every
// device), if any.
static void update_rule(const Node *n, Rule *r) {
  for (int d = 0; d < n->shape.rank; d++) r->out[d] = r->in[0][d] = r->in[1][d] =
                                              factor(r, F_PASS, n->shape.d[d]);
}

// base_optimizer's order: the gradient clipped (in place: the update is its
// last reader), the weight decayed, then the optimizer's step with slot k
// at `offset + (k + 1) * sstride` of the parameter blob. issue 25: a
// variable of an update group (memplan.c) clips its own gradient by its
// own norm (clipnorm) and leaves the rest to the group's last update,
// which does it for the whole group in one call each over its runs.
static int64_t group_elems(const UpdGroup *ug) {
  int64_t n = 0;
  for (int i = ug->first; i <= ug->last; i++)
    if (EG->vars[i]->ugroup == EG->vars[ug->first]->ugroup) n += lelems(EG->vars[i]->param);
  return n;
}

// issue 25: group g's floats, UPD<g>_FLOATS; in a block's function (a
// layer's group: memplan.c's group_updates) the first layer's, every
// layer's groups alike, and the path of v, a variable of the group, by layer.
static char *group_floats(const Node *n, int g) {
  const BlockAt *at = ECTX.b ? block_at(EG, n) : NULL;
  if (!at) return format("UPD%d_FLOATS", g);
  if (ECTX.symbolic) return xstrdup("{UPD_FLOATS}");
  return format("UPD%d_FLOATS", EG->nodes[ECTX.b->start + at->pos]->var->ugroup);
}

static const char *group_path(const Var *v) {
  int k;
  const VarBlock *vb = ECTX.b ? var_block(EG, v, NULL, &k) : NULL;
  return vb ? vb->gen[k] : v->path;
}

// Nadam's running product u_product at the step: a variable of the first
// trainable variable's dtype (nadam.py's build, var_list[0].dtype), so
// 16-bit when that one is (issue 23), and then cast to each variable's.
static char *nadam_product_c(void) {
  const char *b1 = opt_const("beta_1");
  for (int i = 0; i < EG->nvars; i++) {
    const Var *v = EG->vars[i];
    if (v->frozen || v->ema_stat) continue;
    if (v->vdt)
      return format("kdrt_nadam_product16(c, %s, %s, %s)", b1, opt_step(), round_c(v->vdt));
    break;
  }
  return format("kdrt_nadam_product(c, %s, %s)", b1, opt_step());
}

// issue 23: the update of a variable kept in 16 bits, in its dtype as
// Keras 3.15's optimizers compute it (runtime/kdrt_optim.h; read in
// keras/src/optimizers/*.py and base_optimizer.py): apply() hands
// update_step gradients of the variable's dtype (JAX differentiates the
// 16-bit variable), base_optimizer clips them in that dtype (clipvalue:
// the bound cast, so clipping the float32 sum and rounding after is the
// same; clipnorm and global_clipnorm: clip_grad16, from GRAD_CLIP's 16-bit
// factor), _apply_weight_decay decays the variable with lr and wd cast
// (each kernel's wd), then each update_step casts the learning rate and
// the gradient to variable.dtype, and its slots, made by
// add_variable_from_reference, are of that dtype. Every op is a 16-bit op,
// which XLA computes in float32 and rounds. Nadam's u_product is a variable
// of the first trainable variable's dtype (nadam.py's build), multiplied in
// that dtype once a step.
static void update16_emit(const Node *n, Lowering *lw, const char *w, const char *gr, char **s,
                          const char *N_c, bool own_clip) {
  const Var *v = n->var;
  const Optimizer *o = &EG->model->opt;
  const char *kind = round_c(v->vdt);
  // the variable and its slots in 16 bits (store16.c's var16), else float32 buffers
  const char *ks = v->param->dtype == DT_U16 ? format("%s | KDRT_STORE16", kind) : kind;
  char *wd = o->weight_decay != 0 ? opt_const("weight_decay") : flt(0);
  const char *in16 = format("kept in %s: every step of the update rounded, as Keras's in "
                            "its dtype", v->vdt == KDRT_ROUND_BF16 ? "bfloat16" : "float16");
  lw->note = v->ugroup ? format("%s; %s", lw->note, in16) : in16;
  if (n->nin > 2 && !own_clip) // global_clipnorm's scale, or clipnorm's max(norm, c)
    lower_call(lw, KN_clip_grad16, NULL, "%s, %s, %s, %s, %s", gr, N_c, buf(n->in[2]),
               flt(o->clipnorm > 0 ? o->clipnorm : 0), kind);
  if (o->clipvalue > 0) // clip(g, -c, c), c cast: the bound a 16-bit value
    lower_call(lw, KN_clip_grad, NULL, "%s, %s, NULL, %s", gr, N_c,
               flt(kdrt_round_to(v->vdt, o->clipvalue)));
  char *b1 = opt_const("beta_1"), *b2 = opt_const("beta_2"), *eps = opt_const("epsilon");
  switch (o->kind) {
  case OPT_SGD:
    lower_call(lw, KN_sgd16, NULL, "%s, %s, %s, %s, c->lr, %s, %d, %s, %s", w, gr, s[0], N_c,
               opt_const("momentum"), o->nesterov, wd, ks);
    return;
  case OPT_ADAM: case OPT_ADAMW:
    lower_call(lw, KN_adam16, NULL, "%s, %s, %s, %s, %s, %s, c->lr, %s, %s, %s, %s, %s, %s", w,
               gr, s[0], s[1], s[2], N_c, b1, b2, eps, wd, opt_step(), ks);
    return;
  case OPT_RMSPROP: {
    bool mom = o->momentum > 0;
    lower_call(lw, KN_rmsprop16, NULL, "%s, %s, %s, %s, %s, %s, c->lr, %s, %s, %s, %s, %s", w,
               gr, s[0], mom ? s[1] : "NULL", o->centered ? s[1 + mom] : "NULL", N_c,
               opt_const("rho"), opt_const("momentum"), eps, wd, ks);
    return;
  }
  case OPT_ADAGRAD:
    lower_call(lw, KN_adagrad16, NULL, "%s, %s, %s, %s, c->lr, %s, %s, %s", w, gr, s[0], N_c,
               eps, wd, ks);
    return;
  case OPT_ADAMAX:
    lower_call(lw, KN_adamax16, NULL, "%s, %s, %s, %s, %s, c->lr, %s, %s, %s, %s, %s, %s", w, gr,
               s[0], s[1], N_c, b1, b2, eps, wd, opt_step(), ks);
    return;
  case OPT_NADAM:
    lower_call(lw, KN_nadam16, NULL, "%s, %s, %s, %s, %s, c->lr, %s, %s, %s, %s, %s, %s, %s", w,
               gr, s[0], s[1], N_c, b1, b2, eps, wd, opt_step(), nadam_product_c(), ks);
    return;
  case OPT_LION:
    lower_call(lw, KN_lion16, NULL, "%s, %s, %s, %s, c->lr, %s, %s, %s, %s", w, gr, s[0], N_c,
               b1, b2, wd, ks);
    return;
  case OPT_COUNT: break;
  }
  unreachable();
}

static void update_emit(const Node *n, Lowering *lw) {
  const Var *v = n->var;
  if (v->ema_stat) { // issue 11: moving statistics, Keras's momentum
    char *m = hparam(n, "momentum", v->ema_momentum, NULL); // (named in this order)
    char *m1 = hparam(n, "one_minus_momentum", (float)(1.0 - v->ema_momentum), "1 - momentum");
    lower_call(lw, KN_ema, NULL, "%s, %s, %s, %s, %s", buf(n->in[0]), buf(n->in[1]),
               elems_c(n->in[0]), m, m1);
    if (v->vdt) // issue 23: Keras assigns the float32 average to its 16-bit variable
      lower_call(lw, KN_round, NULL, "%s, %s, %s, %s", round_c(v->vdt), buf(n->in[0]),
                 buf(n->in[0]), elems_c(n->in[0]));
    return;
  }
  if (n->fused) {
    lw->note = format("done by the GEMM that makes the gradient (%%%d)", n->in[1]->id);
    return;
  }
  guard_update(lw);
  const Optimizer *o = &EG->model->opt;
  long long N = lelems(n->in[0]), stride = v->sstride;
  char *w = buf(n->in[0]), *gr = buf(n->in[1]), *N_c = format("%lld", N);
  char *s[3] = {"NULL", "NULL", "NULL"};
  for (int k = 0; k < v->nslots; k++)
    s[k] = format("(P + %s + %lld)", off_name(v->param), (k + 1) * stride);
  bool own_clip = n->nin > 2 && o->clipnorm > 0; // by this gradient's own norm
  if (v->ugroup) {
    const UpdGroup *ug = &EG->ugroups[v->ugroup - 1];
    const Var *a = EG->vars[ug->first], *z = EG->vars[ug->last];
    if (own_clip && v->vdt) // clipped before the group's call reads it
      lower_call(lw, KN_clip_grad16, NULL, "%s, %lld, %s, %s, %s", gr, N, buf(n->in[2]),
                 flt(o->clipnorm), round_c(v->vdt));
    else if (own_clip)
      lower_call(lw, KN_clip_grad, NULL, "%s, %lld, %s, %s", gr, N, buf(n->in[2]), flt(0));
    if (n != ug->leader) {
      if (!own_clip) lw->loop = NULL; // (nothing to guard)
      lw->note = format("by the update of its group, %%%d", ug->leader->id);
      return;
    }
    N_c = group_floats(n, v->ugroup);
    const char *sN = N_c; // the slots' stride, in floats
    if (v->param->dtype == DT_U16) N_c = format("2 * %s", N_c); // issue 23: two a float
    lw->note = format("update group %s: %d variable%s, %s%s%s (%lld elements, %lld floats with "
                      "their padding), one call each",
                      ECTX.b ? "of layer <l>" : format("%d", v->ugroup), ug->n,
                      ug->n == 1 ? "" : "s", group_path(a), ug->n > 1 ? " .. " : "",
                      ug->n > 1 ? group_path(z) : "", (long long)group_elems(ug),
                      (long long)ug->floats);
    w = buf(a->param), gr = buf(a->grad);
    for (int k = 0; k < v->nslots; k++)
      s[k] = format("(P + %s + %d * %s)", off_name(a->param), k + 1, sN);
  } else own_clip = false;
  for (int k = 0; k < v->nslots && v->param->dtype == DT_U16; k++)
    s[k] = format("((uint16_t *)%s)", s[k]);
  if (v->vdt) { // issue 23: in its 16-bit dtype (autodiff.c's check_update16), decay included
    update16_emit(n, lw, w, gr, s, N_c, own_clip);
    return;
  }
  if ((n->nin > 2 && !own_clip) || o->clipvalue > 0)
    lower_call(lw, KN_clip_grad, NULL, "%s, %s, %s, %s", gr, N_c,
               n->nin > 2 && !own_clip ? buf(n->in[2]) : "NULL",
               o->clipvalue > 0 ? opt_const("clipvalue") : flt(o->clipvalue));
  if (o->weight_decay != 0 && o->kind != OPT_ADAMW) // AdamW's kernel decays
    lower_call(lw, KN_weight_decay, NULL, "%s, %s, c->lr, %s", w, N_c,
               opt_const("weight_decay"));
  // the hyper-parameters by the names the program defines (issue 25: ADAM_BETA_1, ...)
  char *b1 = opt_const("beta_1"), *b2 = opt_const("beta_2"), *eps = opt_const("epsilon");
  switch (o->kind) {
  case OPT_SGD:
    lower_call(lw, KN_sgd, NULL, "%s, %s, %s, %s, c->lr, %s, %d", w, gr, s[0], N_c,
               opt_const("momentum"), o->nesterov);
    return;
  case OPT_ADAM:
    lower_call(lw, KN_adam, NULL, "%s, %s, %s, %s, %s, %s, c->lr, %s, %s, %s, %s", w, gr,
               s[0], s[1], s[2], N_c, b1, b2, eps, opt_step());
    return;
  case OPT_ADAMW:
    lower_call(lw, KN_adamw, NULL,
               "%s, %s, %s, %s, %s, %s, c->lr, %s, %s, %s, %s, %s", w, gr, s[0], s[1], s[2], N_c,
               b1, b2, eps, opt_const("weight_decay"), opt_step());
    return;
  case OPT_RMSPROP: { // velocity, then momentum and average_gradient where they are on
    bool mom = o->momentum > 0;
    lower_call(lw, KN_rmsprop, NULL, "%s, %s, %s, %s, %s, %s, c->lr, %s, %s, %s", w, gr,
               s[0], mom ? s[1] : "NULL", o->centered ? s[1 + mom] : "NULL", N_c, opt_const("rho"),
               opt_const("momentum"), eps);
    return;
  }
  case OPT_ADAGRAD:
    lower_call(lw, KN_adagrad, NULL, "%s, %s, %s, %s, c->lr, %s", w, gr, s[0], N_c, eps);
    return;
  case OPT_ADAMAX:
    lower_call(lw, KN_adamax, NULL, "%s, %s, %s, %s, %s, c->lr, %s, %s, %s, %s", w, gr,
               s[0], s[1], N_c, b1, b2, eps, opt_step());
    return;
  case OPT_NADAM:
    lower_call(lw, KN_nadam, NULL,
               "%s, %s, %s, %s, %s, c->lr, %s, %s, %s, %s, %s", w, gr, s[0], s[1], N_c, b1, b2,
               eps, opt_step(), nadam_product_c());
    return;
  case OPT_LION:
    lower_call(lw, KN_lion, NULL, "%s, %s, %s, %s, c->lr, %s, %s", w, gr, s[0], N_c, b1,
               b2);
    return;
  case OPT_COUNT: break;
  }
  unreachable();
}

const OpDef op_UPDATE = {"update", -1, 0, false, update_rule, NULL, update_emit, shape_in0};

// issue 11: a constraint's result written over its variable, after the
// update (u, whose buffer is the variable's); training steps only.
static void assign_emit(const Node *n, Lowering *lw) {
  guard_update(lw);
  if (n->in[0]->dtype == DT_U16) { // issue 23: over a variable kept in 16 bits (store16.c)
    lower_call(lw, KN_pack16, NULL, "%s, %s, %s, %s", round_c(n->in[0]->rnd.kind), buf(n->in[0]),
               buf(n->in[1]), elems_c(n->in[0]));
    return;
  }
  lower_call(lw, KN_copy, NULL, "%s, %s, %s", buf(n->in[0]), buf(n->in[1]),
             elems_c(n->in[0]));
}

const OpDef op_ASSIGN = {"assign", 2, 0, false, rule_elementwise, NULL, assign_emit, shape_in0};

// ---------------------------------------------------------------- collectives
// shard.c makes them from placement transitions; they have no rule and
// no gradient (differentiate first, partition once).

static char *shape_decl(const Node *n) {
  return format("const int64_t s[] = %s;", sym_dims(n->in[0]));
}


static void coll_emit(const Node *n, Lowering *lw) {
  const Node *a = n->in[0];
  char *axes = axes_c(n->coll.axes);
  int rank = a->shape.rank;
  if (n->coll.half) { // issue 23: an all-gather or all-to-all of 16-bit values, in 16 bits
    lower_call(lw, n->op == OP_ALLGATHER ? KN_allgather16 : KN_alltoall16, shape_decl(n),
               "%s, %s, %d, s, %d, %s%s, %s", round_c(n->coll.half), axes, rank, n->coll.dim,
               n->op == OP_ALLTOALL ? format("%d, ", n->coll.dim2) : "", buf(a), buf(n));
    return;
  }
  switch (n->op) {
  case OP_ALLREDUCE: case OP_ALLREDUCE_MAX:
    if (n->fused) {
      lw->note = "summed by the bucket above";
      return;
    }
    lower_call(lw, n->op == OP_ALLREDUCE ? KN_allreduce : KN_allreduce_max, NULL,
               "%s, %s, %s, %s", axes, buf(a), buf(n),
               n->coll.bucket ? format("%lld", (long long)n->coll.bucket) : elems_c(n));
    return;
  case OP_REDUCE_SCATTER: case OP_ALLGATHER: case OP_LOCAL_SLICE: {
    // A slice of token ids moves their bits as the float kernel moves floats.
    bool ids = a->dtype == DT_I32;
    lower_call(lw, n->op == OP_REDUCE_SCATTER ? KN_reduce_scatter
                   : n->op == OP_ALLGATHER    ? KN_allgather
                                              : KN_slice,
               shape_decl(n), "%s, %d, s, %d, %s%s, %s%s", axes, rank, n->coll.dim,
               ids ? "(const float *)" : "", buf(a), ids ? "(float *)" : "", buf(n));
    return;
  }
  case OP_ALLTOALL:
    lower_call(lw, KN_alltoall, shape_decl(n), "%s, %d, s, %d, %d, %s, %s", axes, rank,
               n->coll.dim, n->coll.dim2, buf(a), buf(n));
    return;
  default: unreachable();
  }
}

const OpDef op_ALLREDUCE = {"all_reduce", 1, 0, false, rule_elementwise, NULL, coll_emit,
                            shape_in0};
const OpDef op_ALLREDUCE_MAX = {"all_reduce_max", 1, 0, false, rule_elementwise, NULL, coll_emit,
                                shape_in0};
const OpDef op_REDUCE_SCATTER = {"reduce_scatter", 1, 0, false, rule_elementwise, NULL, coll_emit,
                                 shape_in0};
const OpDef op_ALLGATHER = {"all_gather", 1, 0, false, rule_elementwise, NULL, coll_emit,
                            shape_in0};
const OpDef op_ALLTOALL = {"all_to_all", 1, 0, false, rule_elementwise, NULL, coll_emit, shape_in0};
const OpDef op_LOCAL_SLICE = {"local_slice", 1, 0, false, rule_elementwise, NULL, coll_emit,
                              shape_in0};

// ---------------------------------------------------------------- issue 11: BATCH_MEAN, TRAIN_SELECT
// BATCH_MEAN: a sum over the batch rows (and aff.scale elements per row) to
// its mean; the global row count is the step's B, so a short last batch is
// averaged over its own rows. TRAIN_SELECT: a (the batch statistic) in the
// train and gradient steps, b (the moving statistic) in evaluate and
// predict; the gradient goes to a only (b is a moving average).

static void batch_mean_grad(Graph *g, Node *n, const bool *need) {
  Node *dx = make1(g, OP_BATCH_MEAN, n->grad, .aff = n->aff);
  accumulate(g, n->in[0], dx);
}

static void batch_mean_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_scale, NULL, "%s, %s, %s, (float)(1.0 / ((double)B * %.17g)), 0.0f",
             buf(n), buf(n->in[0]), elems_c(n), (double)n->aff.scale);
}

const OpDef op_BATCH_MEAN = {"batch_mean", 1, 1, false, rule_elementwise, batch_mean_grad,
                             batch_mean_emit, shape_in0};

// issue 23: BATCH_MEAN16, a 16-bit activity penalty over the step's rows as
// Keras divides it, by the rows cast to the penalty's type (vars.c's
// batch_penalty); linear, its gradient the same division.
static void batch_mean16_grad(Graph *g, Node *n, const bool *need) {
  accumulate(g, n->in[0], make1(g, OP_BATCH_MEAN16, n->grad, .rnd = n->rnd));
}

static void batch_mean16_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_batch_mean16, NULL, "%s, %s, %s, (double)B, %s", buf(n), buf(n->in[0]),
             elems_c(n), round_c(n->rnd.kind));
}

const OpDef op_BATCH_MEAN16 = {"batch_mean16", 1, 1, false, rule_elementwise, batch_mean16_grad,
                               batch_mean16_emit, shape_in0};

static void train_select_grad(Graph *g, Node *n, const bool *need) {
  if (need[n->in[0]->id]) accumulate(g, n->in[0], n->grad);
}

static void train_select_emit(const Node *n, Lowering *lw) {
  bool eval = lw->step == STEP_EVAL;
  if (eval) lw->note = "the moving statistic outside training";
  lower_call(lw, KN_copy, NULL, "%s, %s, %s", buf(n), buf(n->in[eval ? 1 : 0]), elems_c(n));
}

// issue 11: a weight constraint's scale per norm vector (kdrt_clip_norm);
// after the update, so never differentiated.
static void clip_norm_emit(const Node *n, Lowering *lw) {
  char *args = format("%s, %s, %s, %s, %s, %s, %s", buf(n), buf(n->in[0]), elems_c(n),
                      flt(n->clip.lo), flt(n->clip.hi), flt(n->clip.rate),
                      flt((float)(1.0 - n->clip.rate)));
  if (n->clip.kind && n->clip.unit) // issue 23: a 16-bit UnitNorm's, w / (epsilon + norm)
    lower_call(lw, KN_unit_norm16, NULL, "%s, %s, %s, %s", buf(n), buf(n->in[0]), elems_c(n),
               round_c(n->clip.kind));
  else if (n->clip.kind) // issue 23: a 16-bit variable's, in its dtype
    lower_call(lw, KN_clip_norm16, NULL, "%s, %s", args, round_c(n->clip.kind));
  else
    lower_call(lw, KN_clip_norm, NULL, "%s", args);
}

const OpDef op_CLIP_NORM = {"clip_norm", 1, 0, false, rule_elementwise, NULL, clip_norm_emit,
                            shape_in0};

// issue 11: LeakyReLU, ELU and ReLU layers whose parameters no KDRT_ACT_LIST
// activation has (kdrt_pact); the gradient reads the input.
static const char *const pact_kind_c[] = {"KDRT_PACT_LEAKY", "KDRT_PACT_ELU", "KDRT_PACT_RELU"};

static char *pact_args(const Node *n) {
  const PactAttr *p = &n->pact;
  // issue 25: each by the name of the layer's attribute
  if (p->kind != KDRT_PACT_RELU)
    return format("%s, INFINITY, %s",
                  hparam(n, p->kind == KDRT_PACT_ELU ? "alpha" : "negative_slope", p->alpha, NULL),
                  flt(p->threshold));
  char *ns = hparam(n, "negative_slope", p->alpha, NULL); // (named in this order)
  char *mx = isinf(p->max) ? "INFINITY" : hparam(n, "max_value", p->max, NULL);
  return format("%s, %s, %s", ns, mx, hparam(n, "threshold", p->threshold, NULL));
}

static void pact_grad(Graph *g, Node *n, const bool *need) {
  Node *dx = make2(g, OP_PACT_GRAD, n->grad, n->in[0], .pact = n->pact);
  accumulate(g, n->in[0], dx);
}

static void pact_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_pact, NULL, "%s, %s, %s, %s, %s", pact_kind_c[n->pact.kind], buf(n),
             buf(n->in[0]), elems_c(n), pact_args(n));
}

static void pact_grad_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_pact_grad, NULL, "%s, %s, %s, %s, %s, %s", pact_kind_c[n->pact.kind],
             buf(n), buf(n->in[0]), buf(n->in[1]), elems_c(n), pact_args(n));
}

const OpDef op_PACT = {"pact", 1, 0, false, rule_elementwise, pact_grad, pact_emit, shape_in0};
const OpDef op_PACT_GRAD = {"pact_grad", 2, 1, false, rule_elementwise, NULL, pact_grad_emit,
                            shape_in0};

const OpDef op_TRAIN_SELECT = {"train_select", 2, 0, false, rule_elementwise, train_select_grad,
                               train_select_emit, shape_in0};

// ---------------------------------------------------------------- issue 11: MAXIMUM
// The Maximum and Minimum merges (two operands), and a clamp of one operand
// by the constant mm.c (a normalization's bound on its inverse norm).
// Elementwise, not linear. Gradients as JAX's lax.max and lax.min: the
// operand that is the result gets dy, a tie gives each half.

static void maximum_grad(Graph *g, Node *n, const bool *need) {
  for (int i = 0; i < n->nin; i++) {
    Node *x = n->in[i];
    if (!need[x->id]) continue;
    Node *in[3] = {n->grad, x, n->nin == 2 ? n->in[1 - i] : NULL};
    accumulate(g, x, op_make(g, OP_MAXIMUM_GRAD, n->nin + 1, in, &(Node){.mm = n->mm}));
  }
}

static void maximum_emit(const Node *n, Lowering *lw) {
  bool grad = n->op == OP_MAXIMUM_GRAD;
  int k = grad; // the operands after dy
  lower_call(lw, grad ? KN_maximum_grad : KN_maximum, NULL, "%s, %s%s%s, %s, %s, %d, %s",
             buf(n), grad ? buf(n->in[0]) : "", grad ? ", " : "", buf(n->in[k]),
             n->nin > k + 1 ? buf(n->in[k + 1]) : "NULL", flt(n->mm.c), n->mm.min, elems_c(n));
}

const OpDef op_MAXIMUM = {"maximum", -1, 0, false, rule_elementwise, maximum_grad, maximum_emit,
                          shape_in0};
const OpDef op_MAXIMUM_GRAD = {"maximum_grad", -1, 0, false, rule_elementwise, NULL,
                               maximum_emit, shape_in0};

// ---------------------------------------------------------------- issue 11: NOISE, FILL
// NOISE: GaussianNoise (x + s * z) and GaussianDropout (x * (1 + s * z)),
// z drawn per global element index and step as DROPOUT's mask, so every
// mesh draws the same; evaluate and predict pass x (its gradient and
// emission are DROPOUT's: random_grad, random_emit).
// FILL: a constant tensor (no operands), which SpatialDropout drops out to
// make its mask.

const OpDef op_NOISE = {"noise", 1, 0, false, rule_elementwise, random_grad, random_emit,
                        shape_in0};

static void fill_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_fill, NULL, "%s, %s, %s", buf(n), flt(n->aff.shift), elems_c(n));
}

// FILL and CONST are leaves (JAX's full and constants): their shape is the
// builder's, which no operand holds, so they have no shape rule.
const OpDef op_FILL = {"fill", 0, 0, false, rule_none, NULL, fill_emit, NULL};

// CONST: a replicated constant the program holds (Normalization's mean and
// variance from its config), copied into its buffer when the step needs it.
static void const_emit(const Node *n, Lowering *lw) {
  int64_t k = shape_elems(&n->shape);
  char *vals = xstrdup("");
  for (int64_t i = 0; i < k; i++)
    vals = format("%s%s%s,", vals, i % 8 ? " " : "\n      ", flt(n->cst.data[i]));
  lower_call(lw, KN_load_const, format("static const float k[%lld] = {%s};",
                                             (long long)k, vals),
             "%s, k, %lld", buf(n), (long long)k);
}

const OpDef op_CONST = {"const", 0, 0, false, rule_none, NULL, const_emit, NULL};

// ---------------------------------------------------------------- issue 23: ROUND
// A mixed policy's cast to its compute dtype, the value kept in float32
// (kdrt_round.h). Elementwise, but not linear: a partial sum is summed
// before it is rounded. Its gradient is the incoming one rounded to the
// same type, as JAX transposes a cast (a 16-bit value's cotangent is
// 16-bit too): gradients flow in the compute dtype, and become float32 at
// the variables, past their reads' ROUNDs.

const char *round_c(int kind) {
  return kind == KDRT_ROUND_F16 ? "KDRT_ROUND_F16" : "KDRT_ROUND_BF16";
}

static void round_grad(Graph *g, Node *n, const bool *need) {
  Node *dx = n->grad;
  if (dx->half != n->rnd.kind) { // not already rounded by the ROUND after this one
    dx = make1(g, OP_ROUND, n->grad, .rnd = n->rnd);
    dx->half = (uint8_t)n->rnd.kind;
  }
  accumulate(g, n->in[0], dx);
}

static void round_emit(const Node *n, Lowering *lw) {
  if (n->fused) { // issues 22, 23: fuse.c's fuse_rounds
    lw->note = "rounded by the op that makes its operand, as it stores it";
    return;
  }
  // a value only 16-bit products read: its 16 bits (store16.c)
  lower_call(lw, n->dtype == DT_U16 ? KN_round16 : KN_round, NULL, "%s, %s, %s, %s",
             round_c(n->rnd.kind), buf(n), buf(n->in[0]), elems_c(n));
}

const OpDef op_ROUND = {"round", 1, 0, false, rule_elementwise, round_grad, round_emit, shape_in0};

// issue 23: PACK16 and UNPACK16 (store16.c): a saved activation's value,
// exactly a bfloat16 or float16 one, stored in 16 bits between its forward
// and backward readers (runtime/kdrt_round.h's kdrt_pack16/kdrt_unpack16:
// the value back is the same float32, bit for bit). Elementwise moves of
// each local element, so a pending sum passes through; made after the
// gradients, never differentiated.

static void pack16_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_pack16, NULL, "%s, %s, %s, %s", round_c(n->rnd.kind), buf(n),
             buf(n->in[0]), elems_c(n));
}

static void unpack16_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_unpack16, NULL, "%s, %s, %s, %s", round_c(n->rnd.kind), buf(n),
             buf(n->in[0]), elems_c(n));
}

const OpDef op_PACK16 = {"pack16", 1, 1, false, rule_elementwise, NULL, pack16_emit, shape_in0};
const OpDef op_UNPACK16 = {"unpack16", 1, 1, false, rule_elementwise, NULL, unpack16_emit,
                           shape_in0};
