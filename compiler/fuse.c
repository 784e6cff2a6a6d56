// Fusion of adjacent elementwise ops, after partitioning: the placements
// are settled, so fusing never hides a collective.
//
// ACT(BIAS(x, b)) becomes BIAS_ACT(x, b) when the bias sum has no other
// reader (relu, sigmoid and tanh differentiate from their output, so the
// pre-activation is dead after the activation; gelu and silu read it in
// backward and stay unfused). One loop instead of two, and one buffer the
// memory plan no longer needs. Likewise ACT(BATCH_NORM(...)) becomes a
// BATCH_NORM with its activation (issue 15; its gradient reads x, never
// its output).
//
// Attention's scores: SOFTMAX(CAUSAL(SCALE(s))) becomes one SOFTMAX with
// the scale and the mask folded in, and SCALE(CAUSAL(SOFTMAX_GRAD(dy, y)))
// one SOFTMAX_GRAD: one pass over the [.., T, T] scores instead of three,
// each way, with the same arithmetic element for element (the kernels
// attn_softmax and attn_softmax_grad), and the masked keys skipped where
// the mask makes their result known.
//
// Then the update phase is ordered so that gradient collectives come before
// the updates, for bucketing (emit_c.c); and a plain SGD update folds into
// the GEMM that makes its gradient.
//
// issue 22: a Dense layer's bias joins its product, which the CUDA backend
// computes in one cuBLASLt call with an epilogue (runtime/cuda/matmul.cu)
// and the CPU one as the product then the bias, as before. Forward, a BIAS
// or BIAS_ACT (relu, or gelu's tanh form: cuBLASLt's epilogues) whose x is
// a plain product (no batch dims) read by nothing else, with the bias over
// the product's N dims, becomes that DOT with the bias as a third operand
// (fold_bias). Backward, the BIAS_GRAD of dy (its column sums) is written by
// the product dW = x^T dy that reads the same dy (fold_bias_grads).
//
// issues 22, 23: after store16, a mixed policy's ROUND (a cast to the
// compute dtype) that writes in place over its operand, the operand's only
// reader, folds into the kernel that makes that operand, where the kernel
// stores its result element by element (fuse_rounds, below).
#include "kdcc.h"

#include <stdlib.h>
#include <string.h>

// x's single reader is n, which places its value as x does: x may fold into n.
static bool folds(const Node *x, const Node *n, const int *uses) {
  return uses[x->id] == 1 && place_eq(&x->place, &n->place, n->shape.rank) &&
         shape_eq(&x->shape, &n->shape);
}

// A causal mask the fused softmax can apply: no sliding window.
static bool plain_causal(const Node *x) { return x->op == OP_CAUSAL && !x->mask.window; }

// The softmax's own input, past a causal mask (fill: what it writes) and a
// scale without shift that fold into it, which are marked dead; n->sm says
// what was folded.
static Node *fold_scores(Node *n, Node *x, const int *uses) {
  if (plain_causal(x) && x->mask.fill != 0 && folds(x, n, uses)) { // forward: KDRT_MASKED
    n->sm.causal = true, n->sm.fused = true;
    x->dead = true;
    x = x->in[0];
  }
  if (x->op == OP_SCALE && x->aff.shift == 0 && folds(x, n, uses)) {
    n->sm.scale = x->aff.scale, n->sm.fused = true;
    x->dead = true;
    x = x->in[0];
  }
  return x;
}

// g's nodes without the dead ones (ids not renumbered).
static void drop_dead(Graph *g) {
  int n = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (!g->nodes[i]->dead) g->nodes[n++] = g->nodes[i];
  g->nnodes = n;
}

static bool is_output(const Graph *g, const Node *x) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == x) return true;
  return false;
}

// BIAS(DOT(a, b), bias) or BIAS_ACT of it -> DOT(a, b, bias) with the act.
static void fold_bias(Graph *g) {
  int ids = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->id >= ids) ids = g->nodes[i]->id + 1;
  int *uses = xcalloc(ids, sizeof *uses);
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) uses[g->nodes[i]->in[k]->id]++;
  for (int i = 0; i < g->nnodes; i++) {
    Node *a = g->nodes[i];
    if (a->op != OP_BIAS && a->op != OP_BIAS_ACT) continue;
    Act k = a->op == OP_BIAS ? ACT_LINEAR : a->act.kind;
    Node *x = a->in[0], *bias = a->in[1];
    if (k != ACT_LINEAR && k != ACT_RELU && k != KDRT_ACT_GELU_TANH) continue;
    if (x->op != OP_DOT || x->nin != 2 || x->dot.nb || !folds(x, a, uses) || is_output(g, x) ||
        bias->shape.rank != x->in[1]->shape.rank - x->dot.nk)
      continue;
    DotAttr dot = x->dot;
    a->op = OP_DOT;
    a->nin = 3;
    a->in[0] = x->in[0], a->in[1] = x->in[1], a->in[2] = bias;
    a->dot = dot; // (act and dot share Node's union)
    a->dot.act = k;
    x->dead = true;
  }
  xfree(uses);
  drop_dead(g);
}

// BIAS_GRAD(dy) -> written by DOT(x, dy) = x^T dy (contracting dy's leading
// dims, the ones the bias gradient sums over), where the sums are the same:
// the same node dy (so the same local rows), the bias's placement that of
// the product's N dims, the same pending sums; and no reader of the bias
// gradient before the product. Not with a folded SGD update (the product
// then writes the weight, scaled by -lr). The BIAS_GRAD stays, fused (no
// code), right before the product: its buffer is live from there on, as
// the product's second result. Renumbers the ids.
static void fold_bias_grads(Graph *g) {
  int n = g->nnodes;
  int *first_read = xcalloc(n, sizeof *first_read);
  for (int i = n - 1; i >= 0; i--)
    for (int k = 0; k < g->nodes[i]->nin; k++) first_read[g->nodes[i]->in[k]->id] = i;
  Node **order = xcalloc(n, sizeof *order);
  bool *moved = xcalloc(n, sizeof *moved);
  for (int i = 0; i < n; i++) {
    Node *d = g->nodes[i];
    if (d->op != OP_DOT || d->nin != 2 || d->dot.nb || d->dot.tb || d->dot.sgd_into) continue;
    Node *dy = d->in[1];
    int rb = dy->shape.rank - d->dot.nk, off = d->shape.rank - rb;
    for (int j = 0; j < n && !d->dot.bgrad; j++) {
      Node *bg = g->nodes[j];
      if (bg->op != OP_BIAS_GRAD || bg->fused || bg->in[0] != dy || bg->shape.rank != rb ||
          bg->place.partial != d->place.partial || bg->place.pmax || d->place.pmax ||
          (first_read[bg->id] && first_read[bg->id] <= i))
        continue;
      bool same = true;
      for (int k = 0; k < rb; k++) same &= bg->place.axis[k] == d->place.axis[off + k];
      if (!same) continue;
      bg->fused = true;
      d->dot.bgrad = bg;
      moved[j] = true;
    }
  }
  int m = 0;
  for (int i = 0; i < n; i++) {
    Node *x = g->nodes[i];
    if (moved[i]) continue;
    if (x->op == OP_DOT && x->dot.bgrad) order[m++] = x->dot.bgrad;
    order[m++] = x;
  }
  for (int i = 0; i < n; i++) g->nodes[i] = order[i], g->nodes[i]->id = i;
  xfree(first_read), xfree(order), xfree(moved);
}

static void fuse_sgd(Graph *g);

static void fuse_elementwise(Graph *g) {
  int *uses = xcalloc(g->nnodes, sizeof *uses);
  Node **reader = xcalloc(g->nnodes, sizeof *reader); // the last (with one use: the only)
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) {
      uses[g->nodes[i]->in[k]->id]++;
      reader[g->nodes[i]->in[k]->id] = g->nodes[i];
    }
  int n = 0;
  for (int i = 0; i < g->nnodes; i++) {
    Node *a = g->nodes[i];
    if (a->op == OP_SOFTMAX && !a->sm.fused && a->shape.rank >= 2) {
      a->sm = (SoftmaxAttr){.scale = 1};
      a->in[0] = fold_scores(a, a->in[0], uses);
      continue;
    }
    // SCALE(CAUSAL(SOFTMAX_GRAD)), or either of the two around it: the
    // last node of the chain becomes the gradient, so the value's later
    // readers see the same node.
    if ((a->op == OP_SCALE && a->aff.shift == 0) || (plain_causal(a) && a->mask.fill == 0)) {
      Node *r = uses[a->id] == 1 ? reader[a->id] : NULL;
      if (plain_causal(a) && r && r->op == OP_SCALE && r->aff.shift == 0 && folds(a, r, uses))
        continue; // the scale after it takes the chain
      Node *sc = a->op == OP_SCALE ? a : NULL, *mk = a->op == OP_CAUSAL ? a : NULL;
      Node *x = a->in[0];
      if (sc && plain_causal(x) && x->mask.fill == 0 && folds(x, a, uses)) mk = x, x = x->in[0];
      if (x->op != OP_SOFTMAX_GRAD || x->sm.fused || !folds(x, a, uses) || a->shape.rank < 2)
        continue;
      float scale = sc ? sc->aff.scale : 1;
      Node *dy = x->in[0], *y = x->in[1];
      if (mk && mk != a) mk->dead = true;
      x->dead = true;
      a->op = OP_SOFTMAX_GRAD;
      a->nin = 2;
      a->in[0] = dy, a->in[1] = y;
      a->sm = (SoftmaxAttr){.fused = true, .causal = mk != NULL, .scale = scale};
      continue;
    }
    if (a->op == OP_ACT && a->in[0]->op == OP_BIAS && uses[a->in[0]->id] == 1 &&
        place_eq(&a->place, &a->in[0]->place, a->shape.rank)) {
      Node *b = a->in[0];
      a->op = OP_BIAS_ACT;
      a->nin = 2;
      a->in[0] = b->in[0];
      a->in[1] = b->in[1];
      b->dead = true;
    } else if (a->op == OP_ACT && a->in[0]->op == OP_BATCH_NORM &&
               a->in[0]->bn.act == ACT_LINEAR && uses[a->in[0]->id] == 1 &&
               place_eq(&a->place, &a->in[0]->place, a->shape.rank)) {
      Node *b = a->in[0];
      Act kind = a->act.kind; // (act and bn share Node's union)
      a->op = OP_BATCH_NORM;
      a->nin = b->nin;
      for (int k = 0; k < b->nin; k++) a->in[k] = b->in[k];
      a->bn = b->bn;
      a->bn.act = kind;
      b->dead = true;
    }
  }
  xfree(reader);
  drop_dead(g);
  fold_bias(g);
  n = g->nnodes;

  // In the update phase the gradients' collectives go first, then the
  // updates (which only read them): gradient all-reduces over the same axes
  // become neighbours that the emitter sends as one bucket. A collective of
  // a value the update phase makes (a clipping norm's sum) keeps its place.
  Node **upd = xcalloc(n, sizeof *upd);
  int first = n, k = 0, ids = 0;
  for (int i = 0; i < n; i++) {
    if (g->nodes[i]->phase == PH_UPDATE && first == n) first = i;
    if (g->nodes[i]->id >= ids) ids = g->nodes[i]->id + 1;
  }
  bool *early = xcalloc(ids, sizeof *early); // by id (not yet renumbered)
  for (int i = first; i < n; i++) {
    Node *x = g->nodes[i];
    early[x->id] = x->phase == PH_UPDATE && is_collective(x->op) &&
                   (x->in[0]->phase != PH_UPDATE || early[x->in[0]->id]);
  }
  for (int pass = 0; pass < 2; pass++)
    for (int i = first; i < n; i++) {
      Node *x = g->nodes[i];
      if (x->phase == PH_UPDATE && early[x->id] == (pass == 0)) upd[k++] = x;
    }
  xfree(early);
  int j = first;
  for (int i = first; i < n; i++) // nodes of later phases keep their place after
    if (g->nodes[i]->phase != PH_UPDATE) upd[k++] = g->nodes[i];
  for (int i = 0; i < k; i++) g->nodes[j++] = upd[i];
  for (int i = 0; i < n; i++) g->nodes[i]->id = i;

  fuse_sgd(g);
  fold_bias_grads(g);
}

// Plain SGD (no momentum, clipping or weight decay): w -= lr * g folds
// into the GEMM that makes g, as C = -lr * A B + C, when g is read by
// nothing else and reaches its update with no collective between, and
// every other reader of w comes before that GEMM.
static void fuse_sgd(Graph *g) {
  int n = g->nnodes;
  const Optimizer *o = &g->model->opt;
  if (o->kind != OPT_SGD || o->momentum != 0 || opt_clips(o) || o->weight_decay != 0 ||
      o->loss_scale) // issue 23: the gradient is needed whole, for the loss scale's decision
    return;
  int *nuse = xcalloc(n, sizeof *nuse), *last_read = xcalloc(n, sizeof *last_read);
  for (int i = 0; i < n; i++)
    for (int a = 0; a < g->nodes[i]->nin; a++) {
      Node *x = g->nodes[i]->in[a];
      nuse[x->id]++;
      if (g->nodes[i]->op != OP_UPDATE && i > last_read[x->id]) last_read[x->id] = i;
    }
  for (int i = 0; i < n; i++) {
    Node *u = g->nodes[i], *gr = u->op == OP_UPDATE ? u->in[1] : NULL, *w = u->in[0];
    if (!gr || gr->op != OP_DOT || nuse[gr->id] != 1 || gr->place.partial || u->var->vdt ||
        !place_eq(&gr->place, &w->place, w->shape.rank) || last_read[w->id] > gr->id)
      continue;
    u->fused = true;
    gr->dot.sgd_into = w;
  }
}

// Gradients all-reduced in place over the same axes whose buffers follow
// each other in the gradient blob go as one bucket: the first all-reduce
// sums them all (coll.bucket floats), the others are marked fused. Both
// emitters then send one message where they would have sent several.
static bool in_place_grad_sum(const Node *n) {
  const Node *a = n->in[0];
  return n->op == OP_ALLREDUCE && n->region == REGION_GRAD && a->region == REGION_GRAD &&
         a->offset == n->offset;
}

void bucket_gradients(Graph *g) {
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (!in_place_grad_sum(n)) continue;
    int j = i;
    while (j + 1 < g->nnodes) {
      const Node *a = g->nodes[j], *b = g->nodes[j + 1];
      Shape as = local_shape(g, a);
      if (!in_place_grad_sum(b) || b->coll.axes != n->coll.axes ||
          b->offset != a->offset + (shape_elems(&as) + 15) / 16 * 16)
        break;
      j++;
    }
    if (j == i) continue;
    Shape ls = local_shape(g, g->nodes[j]);
    n->coll.bucket = g->nodes[j]->offset + shape_elems(&ls) - n->offset;
    for (int k = i + 1; k <= j; k++) g->nodes[k]->fused = true;
    i = j;
  }
}

// issue 25: Keras's LayerNormalization (and RMSNormalization) is built as
// NORM, COL_MUL by g, BIAS of b and differentiated as that chain, so that
// partitioning places each value as before (a split feature axis keeps
// the scale and offset on its columns; a dy that is a partial sum over
// 'model' is multiplied by g before its all-reduce). Where the chain's
// values sit together, one placement with no collective or slice between,
// it becomes one op each way, with the same arithmetic element for
// element (runtime kdrt_layer_norm*):
//   BIAS_GRAD(MUL(dy, NORM(x)))  -> LAYER_NORM_DW(dy, x): d g, h recomputed
//   NORM_GRAD(COL_MUL(dy, g), x) -> LAYER_NORM_DX(dy, x, g)
//   BIAS(COL_MUL(NORM(x), g), b) -> LAYER_NORM(x, g, b) (either optional),
// the last once the backward no longer reads NORM(x). The last node of each
// chain becomes the op, so its readers and its gradient home stay.

// a and b split the same dims over the same axes (partial sums aside).
static bool same_split(const Node *a, const Node *b) {
  for (int d = 0; d < a->shape.rank; d++)
    if (a->place.axis[d] != b->place.axis[d]) return false;
  return shape_eq(&a->shape, &b->shape);
}

// uses[id]: the readers of each value among the live nodes; reader[id]:
// the last (with one use: the only).
static void count_uses(const Graph *g, int *uses, Node **reader) {
  memset(uses, 0, sizeof *uses * (size_t)g->nnodes);
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i]->nin && !g->nodes[i]->dead; k++) {
      uses[g->nodes[i]->in[k]->id]++;
      reader[g->nodes[i]->in[k]->id] = g->nodes[i];
    }
}

static void fuse_layer_norm(Graph *g) {
  int *uses = xcalloc(g->nnodes, sizeof *uses);
  Node **reader = xcalloc(g->nnodes, sizeof *reader);
  count_uses(g, uses, reader);
  for (int i = 0; i < g->nnodes; i++) {
    Node *a = g->nodes[i], *m = a->nin ? a->in[0] : NULL;
    if (a->op == OP_BIAS_GRAD && a->shape.rank == 1 && m->op == OP_MUL && uses[m->id] == 1 &&
        m->in[1]->op == OP_NORM && same_split(m, m->in[1])) {
      Node *h = m->in[1];
      a->op = OP_LAYER_NORM_DW;
      a->nin = 2;
      a->in[0] = m->in[0];
      a->in[1] = h->in[0];
      a->norm = h->norm;
      m->dead = true;
    } else if (a->op == OP_NORM_GRAD && m->op == OP_COL_MUL && m->in[1]->shape.rank == 1 &&
               folds(m, a, uses)) {
      a->op = OP_LAYER_NORM_DX;
      a->nin = 3;
      a->in[0] = m->in[0];
      a->in[2] = m->in[1];
      a->norm.scale = true;
      m->dead = true;
    }
  }
  count_uses(g, uses, reader); // the backward no longer reads NORM(x)
  for (int i = 0; i < g->nnodes; i++) {
    Node *h = g->nodes[i];
    if (h->op != OP_NORM) continue;
    Node *chain[3] = {h}, *in[3] = {h->in[0]};
    int len = 1;
    NormAttr na = h->norm;
    for (int step = 0; step < 2; step++) { // COL_MUL by g, then BIAS of b
      Node *y = chain[len - 1], *r = uses[y->id] == 1 ? reader[y->id] : NULL;
      if (!r || r->op != (step ? OP_BIAS : OP_COL_MUL) || r->in[0] != y ||
          r->in[1]->shape.rank != 1 || !folds(y, r, uses))
        continue;
      in[len] = r->in[1];
      chain[len++] = r;
      if (step) na.center = true;
      else na.scale = true;
    }
    if (len == 1) continue;
    for (int k = 0; k < len - 1; k++) chain[k]->dead = true;
    Node *y = chain[len - 1];
    y->op = OP_LAYER_NORM;
    y->nin = len;
    for (int k = 0; k < len; k++) y->in[k] = in[k];
    y->norm = na;
  }
  xfree(reader);
  xfree(uses);
  int n = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (!g->nodes[i]->dead) g->nodes[n++] = g->nodes[i];
  g->nnodes = n;
  for (int i = 0; i < n; i++) g->nodes[i]->id = i;
}

// issue 22: attention without its [t, s] scores in memory, for the CUDA
// program (main.c sets opt_fuse_attention; the CPU's graph is untouched).
// attend (layers_attn.c) builds, and autodiff differentiates, the chain
//   s = DOT(q, k^T); p = SOFTMAX(s) (scale and plain causal mask folded
//   in by fuse_elementwise); o = DOT(p, v)
//   dv = DOT(p^T, do); dp = DOT(do, v^T); ds = SOFTMAX_GRAD(dp, p) (scale,
//   mask); dq = DOT(ds, k); dk = DOT(ds^T, q)
// over q, k, v [b, n, t|s, h]. Where every value of it is one placement
// with only the batch and the heads split (no partial sums), with nothing
// between (a dropout, a call mask, a soft cap, a sliding window, the zero
// fill of keras-hub's masked probabilities, a mixed policy's rounding of
// the probabilities keep the chain), the heads' dims alike and at most
// opt_fuse_attention, it becomes
//   lse = ATTENTION_LSE(q, k, v) (the softmax's node), o = ATTENTION(q, k,
//   v, lse); dk, dv = ATTENTION_GRAD (fused), dq = ATTENTION_GRAD(do, q, k,
//   v, o, lse, dk, dv) after both,
// and s, dp, ds and p are gone. The backward needs each row's max and sum
// of exps: a node has one result, so the forward writes them as a second
// one, lse [b, n, t] (one float a row, kept for the backward as any
// activation), rather than the backward computing q k^T a third time. Its
// dk and dv are ATTENTION_GRAD nodes of their own, marked fused, right
// where the product that made each was: their buffers are planned as
// before, and the dq node after them writes all three (fold_bias_grads'
// way with a second result).

int opt_fuse_attention;

// x's values split only on the batch and the heads (dims 0, 1) as `like`'s.
static bool heads_split(const Node *x, const Node *like) {
  if (x->place.partial || x->place.pmax) return false;
  for (int d = 0; d < x->shape.rank; d++)
    if (x->place.axis[d] != (d < 2 ? like->place.axis[d] : -1)) return false;
  return true;
}

// A batched product over the heads, DOT(a, b) with its transposes as given.
static bool heads_dot(const Node *x, bool ta, bool tb) {
  return x->op == OP_DOT && x->nin == 2 && x->dot.nb == 2 && x->dot.nk == 1 && x->dot.ta == ta &&
         x->dot.tb == tb && x->shape.rank == 4;
}

// The chain's backward from p's readers: dv, dp's do, ds and its readers
// dq and dk; false when it is not attend's.
typedef struct {
  Node *dv, *dout, *dp, *ds, *dq, *dk;
} AttnGrad;

static bool attention_grad_chain(const Graph *g, Node *const *rd, int nrd, const Node *o,
                                 const Node *p, const int *uses, Node **reader2, AttnGrad *a) {
  *a = (AttnGrad){0};
  for (int i = 0; i < nrd; i++) {
    Node *r = rd[i];
    if (r == o) continue;
    if (heads_dot(r, true, false) && r->in[0] == p) a->dv = r;
    else if (r->op == OP_SOFTMAX_GRAD && r->in[1] == p) a->ds = r;
    else return false;
  }
  if (!a->dv || !a->ds || !a->ds->sm.fused || a->ds->sm.scale != p->sm.scale ||
      a->ds->sm.causal != p->sm.causal)
    return false;
  a->dp = a->ds->in[0], a->dout = a->dv->in[1];
  if (!heads_dot(a->dp, false, true) || a->dp->in[0] != a->dout || a->dp->in[1] != o->in[1] ||
      uses[a->dp->id] != 1 || uses[a->ds->id] != 2)
    return false;
  for (int k = 0; k < 2; k++) { // ds's two readers
    Node *r = reader2[2 * a->ds->id + k];
    const Node *qt = p->in[0]->in[0], *kt = p->in[0]->in[1]; // (s = DOT(q, k^T))
    if (heads_dot(r, false, false) && r->in[0] == a->ds && r->in[1] == kt) a->dq = r;
    else if (heads_dot(r, true, false) && r->in[0] == a->ds && r->in[1] == qt) a->dk = r;
  }
  if (!a->dq || !a->dk) return false;
  int last = a->dk->id > a->dv->id ? a->dk->id : a->dv->id; // dq goes after both: nothing
  for (int j = a->dq->id + 1; j <= last; j++)               // may read it before
    for (int k = 0; k < g->nodes[j]->nin; k++)
      if (g->nodes[j]->in[k] == a->dq) return false;
  const Node *all[] = {a->dv, a->dout, a->dp, a->ds, a->dq, a->dk};
  for (int i = 0; i < 6; i++)
    if (!heads_split(all[i], o)) return false;
  return true;
}

static void fuse_attention(Graph *g) {
  if (!opt_fuse_attention) return;
  int n = g->nnodes;
  for (int i = 0; i < n; i++) g->nodes[i]->id = i;
  int *uses = xcalloc(n, sizeof *uses), *pos = xcalloc(n, sizeof *pos);
  Node **reader2 = xcalloc(2 * (size_t)n, sizeof *reader2); // a value's first two readers
  Node **rd3 = xcalloc(3 * (size_t)n, sizeof *rd3);         // its first three
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) {
      int x = g->nodes[i]->in[k]->id;
      if (uses[x] < 2) reader2[2 * x + uses[x]] = g->nodes[i];
      if (uses[x] < 3) rd3[3 * x + uses[x]] = g->nodes[i];
      uses[x]++;
    }
  for (int i = 0; i < n; i++) {
    Node *o = g->nodes[i], *p = o->nin ? o->in[0] : NULL;
    if (!heads_dot(o, false, false) || p->op != OP_SOFTMAX || p->shape.rank != 4 ||
        is_output(g, p))
      continue;
    Node *s = p->in[0], *vt = o->in[1];
    if (!heads_dot(s, false, true) || uses[s->id] != 1 || is_output(g, s)) continue;
    Node *qt = s->in[0], *kt = s->in[1];
    int64_t hd = qt->shape.d[3];
    if (hd > opt_fuse_attention || !shape_eq(&kt->shape, &vt->shape) ||
        !shape_eq(&qt->shape, &o->shape) || !heads_split(qt, o) || !heads_split(kt, o) ||
        !heads_split(vt, o) || !heads_split(s, o) || !heads_split(p, o))
      continue;
    AttnGrad a = {0};
    bool grad = uses[p->id] == 3;
    if (uses[p->id] != 1 && !(grad && attention_grad_chain(g, &rd3[3 * p->id], 3, o, p, uses,
                                                           reader2, &a)))
      continue;
    SoftmaxAttr sm = p->sm;
    s->dead = true;
    p->op = OP_ATTENTION_LSE; // the softmax's node holds the row statistics
    p->role = "lse";
    p->nin = 3;
    p->in[0] = qt, p->in[1] = kt, p->in[2] = vt;
    p->shape.rank = 3;
    p->fused = true;
    o->op = OP_ATTENTION;
    o->nin = 4;
    o->in[0] = qt, o->in[1] = kt, o->in[2] = vt, o->in[3] = p;
    o->sm = sm;
    if (!grad) continue;
    a.dp->dead = true, a.ds->dead = true;
    Node *const ops[6] = {a.dout, qt, kt, vt, o, p}, *parts[3] = {a.dk, a.dv, a.dq};
    for (int k = 0; k < 3; k++) {
      Node *x = parts[k];
      x->op = OP_ATTENTION_GRAD;
      x->nin = 6;
      for (int j = 0; j < 6; j++) x->in[j] = ops[j];
      x->sm = sm;
      x->fused = k < 2;
    }
    a.dq->nin = 8;
    a.dq->in[6] = a.dk, a.dq->in[7] = a.dv;
    pos[a.dq->id] = (a.dk->id > a.dv->id ? a.dk->id : a.dv->id) + 1; // (0: stays)
  }
  // Each dq moves to right after the later of its dk and dv.
  Node **order = xcalloc(n, sizeof *order);
  int m = 0;
  for (int i = 0; i < n; i++) {
    Node *x = g->nodes[i];
    if (x->dead || (pos[x->id] && pos[x->id] > x->id + 1)) continue;
    order[m++] = x;
    for (int j = 0; j < n; j++) // a moved dq whose place is after x
      if (pos[j] == x->id + 1 && pos[j] > j + 1) order[m++] = g->nodes[j];
  }
  for (int i = 0; i < m; i++) g->nodes[i] = order[i], g->nodes[i]->id = i;
  g->nnodes = m;
  xfree(order), xfree(uses), xfree(pos), xfree(reader2), xfree(rd3);
}

// issue 22: a sparse crossentropy from logits is built (loss.c) as row
// statistics, so that a split class dim all-reduces two floats a row:
//   m = ROW_MAX(x); s = ROW_SUMEXP(x, m); loss = XENT(x, y, m, s[, w]);
//   [acc = XENT_ACC(x, y, m[, w])]; backward dx = XENT_GRAD(x, y, m, s[, w])
// each a pass over the [rows, V] logits. Where V is whole (no collective
// between them) and m and s have no other reader, the loss's node becomes
// XENT_FUSED(x, y, dx, [acc], [w]): one kernel a step that makes each row's
// statistics, loss, hit and gradient while the row is in cache (llm.c's
// fused classifier), with the same arithmetic. dx and acc stay as nodes,
// fused (no code), right before it, so their buffers are planned as any
// value's (fold_bias_grads' way with more results), dx moved into the loss
// phase: evaluation runs the loss's kernel without the gradient. A mixed
// policy's ROUND of dx, its only reader, moves with it into the loss phase
// at dx's old place, so that store16 writes it over dx and fuse_rounds folds
// it into the kernel. Nothing else reads x after it: the logits' buffer is
// free for the backward pass. KDCC_FUSE_XENT=0 in kdcc's environment keeps
// the chain, which tests compare bit for bit.
static void fuse_xent(Graph *g) {
  const char *env = getenv("KDCC_FUSE_XENT");
  if (env && !strcmp(env, "0")) return;
  int n = g->nnodes;
  for (int i = 0; i < n; i++) g->nodes[i]->id = i;
  int *uses = xcalloc(n, sizeof *uses);
  Node **rd = xcalloc(4 * (size_t)n, sizeof *rd); // a value's first four readers
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) {
      int x = g->nodes[i]->in[k]->id;
      if (uses[x] < 4) rd[4 * x + uses[x]] = g->nodes[i];
      uses[x]++;
    }
  Node **at = xcalloc(n, sizeof *at); // by id: the nodes put in its place instead (3 at most)
  bool *moved = xcalloc(n, sizeof *moved);
  for (int i = 0; i < n; i++) {
    Node *l = g->nodes[i];
    if (l->op != OP_XENT) continue;
    Node *x = l->in[0], *y = l->in[1], *m = l->in[2], *s = l->in[3];
    Node *w = l->loss.weighted ? l->in[4] : NULL, *dx = NULL, *acc = NULL, *rnd = NULL;
    if (m->op != OP_ROW_MAX || m->in[0] != x || s->op != OP_ROW_SUMEXP || s->in[0] != x ||
        s->in[1] != m || x->place.axis[x->shape.rank - 1] >= 0 || x->place.partial ||
        x->place.pmax || m->place.pmax || uses[m->id] > 4 || uses[s->id] > 2)
      continue;
    bool ok = true;
    for (int k = 0; k < uses[m->id] && ok; k++) { // s, l, dx and acc, each at most once
      Node *r = rd[4 * m->id + k];
      if (r->op == OP_XENT_GRAD && !dx && r->nin == l->nin && r->in[0] == x && r->in[1] == y &&
          r->in[3] == s && (!w || r->in[4] == w))
        dx = r;
      else if (r->op == OP_XENT_ACC && !acc && r->in[0] == x && r->in[1] == y)
        acc = r;
      else ok = r == s || r == l;
    }
    for (int k = 0; k < uses[s->id] && ok; k++) // l and dx
      ok = rd[4 * s->id + k] == l || rd[4 * s->id + k] == dx;
    if (!ok || !dx || dx->id < i || (acc && acc->id < i)) continue;
    if (uses[dx->id] == 1 && rd[4 * dx->id]->op == OP_ROUND) rnd = rd[4 * dx->id];
    m->dead = s->dead = true;
    dx->fused = true, dx->phase = PH_LOSS;
    dx->nin = w ? 3 : 2, dx->in[2] = w;
    moved[dx->id] = true;
    at[i] = dx;
    Node *in[5] = {x, y, dx}, *wa = acc && acc->loss.weighted ? acc->in[3] : NULL;
    int nin = 3;
    if (acc) {
      acc->fused = true;
      acc->nin = wa ? 3 : 2, acc->in[2] = wa;
      moved[acc->id] = true;
      in[nin++] = acc;
    }
    if (w) in[nin++] = w;
    l->op = OP_XENT_FUSED;
    l->nin = nin;
    for (int k = 0; k < nin; k++) l->in[k] = in[k];
    if (rnd) { // at dx's old place, after l
      rnd->phase = PH_LOSS;
      moved[rnd->id] = true;
      at[dx->id] = rnd;
    }
  }
  Node **order = xcalloc(n, sizeof *order);
  int k = 0;
  for (int i = 0; i < n; i++) {
    Node *x = g->nodes[i];
    if (at[i] && at[i]->op == OP_ROUND) order[k++] = at[i];
    if (at[i] && at[i]->op == OP_XENT_GRAD) { // dx, acc, then the loss
      order[k++] = at[i];
      if (x->nin > 3 && x->in[3]->op == OP_XENT_ACC) order[k++] = x->in[3];
    }
    if (!x->dead && !moved[i]) order[k++] = x;
  }
  for (int i = 0; i < k; i++) g->nodes[i] = order[i], g->nodes[i]->id = i;
  g->nnodes = k;
  xfree(uses), xfree(rd), xfree(at), xfree(moved), xfree(order);
}

// issues 22, 23: ROUND(x) -> x's kernel rounds each value as it stores it
// (its _rnd form, kdrt_ops.def; kdrt_round.h's rounding, so the same
// bits), and the ROUND, marked fused, emits nothing: one pass over the
// tensor instead of two. Where store16's in_place wrote the ROUND over x
// (x dies with it: to the memory plan the ROUND is a view of x, so its
// readers read x's buffer) and nothing else reads x, so that no reader sees
// the unrounded value Keras has before its cast; x an op of these whose
// kernel has a _rnd form. Runs after store16, whose passes read ROUNDs as
// such (a PACK16 of the rounded value stays, reading x's buffer). Only
// within one layer (blocks.c's same_layer): a ROUND that begins a layer's
// copy of a repeated block and rounds what the copy before made (the
// backward pass's residual gradient) would fold in one copy and not in the
// first, whose value comes from outside the block, and the copies would no
// longer be the same code. The buffers are the same, and so the memory
// plan; KDCC_FUSE_ROUND=0 in kdcc's environment turns it off, which tests
// compare bit for bit.
static bool rounds_as_it_stores(const Node *x) {
  switch (x->op) {
  case OP_ADD: case OP_BIAS: case OP_BIAS_ACT: case OP_ACT: case OP_ACT_GRAD: case OP_LAYER_NORM:
  case OP_BIAS_GRAD: // (not one a product writes: fused)
    return x->dtype == DT_F32 && !x->round_out && !x->fused;
  case OP_XENT_GRAD: // issue 22: the fused crossentropy's gradient (fuse_xent)
    return x->fused && !x->round_out;
  default:
    return false;
  }
}

void fuse_rounds(Graph *g) {
  const char *env = getenv("KDCC_FUSE_ROUND");
  if (env && !strcmp(env, "0")) return;
  int ids = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->id >= ids) ids = g->nodes[i]->id + 1;
  int *uses = xcalloc((size_t)ids + 1, sizeof *uses);
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) uses[g->nodes[i]->in[k]->id]++;
  for (int i = 0; i < g->nnodes; i++) {
    Node *r = g->nodes[i], *x = r->nin ? r->in[0] : NULL;
    if (r->op != OP_ROUND || r->dtype != DT_F32 || r->inplace != 1 || r->fused ||
        uses[x->id] != 1 + (x->op == OP_XENT_GRAD) || // (and the op that writes it)
        !rounds_as_it_stores(x) || is_output(g, x) || !r->layer ||
        !x->layer || !same_layer(r->layer, x->layer))
      continue;
    x->round_out = (uint8_t)r->rnd.kind;
    r->fused = true;
  }
  xfree(uses);
}

// Every fusion, in the order they run (issue 25): a new one is its function
// above and its row here, and pipeline.c calls them all as fuse_graph.
static void (*const fusions[])(Graph *g) = {
  fuse_layer_norm,  // NORM, COL_MUL, BIAS into LAYER_NORM; their gradients into LAYER_NORM_DX, _DW
  fuse_elementwise, // BIAS_ACT, attention's scores' softmax, SGD into its GEMM, a Dense's bias
  fuse_attention,   // issue 22: ATTENTION and ATTENTION_GRAD, the CUDA program's only
  fuse_xent,        // issue 22: the sparse crossentropy's chain into XENT_FUSED, V whole
};

void fuse_graph(Graph *g) {
  for (size_t i = 0; i < sizeof fusions / sizeof *fusions; i++) fusions[i](g);
}
