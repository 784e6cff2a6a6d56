// Reverse-mode differentiation of the global (unsharded) training graph,
// then one optimizer update per variable.
//
// Differentiate first, partition once: gradients are built on global shapes
// from the forward ops alone, so collectives never need gradient rules;
// shard.c later propagates placements through forward and backward alike.
// The walk goes over the forward and loss nodes in reverse topological
// order; each op's rule below builds the gradients of its operands from
// forward ops and adds them into the operand's running sum (n->grad).
// Only nodes that depend on a variable get gradients (the input does not).
#include "kdcc.h"

static void accumulate(Graph *g, Node *x, Node *dx) {
  if (!x->grad) {
    x->grad = dx;
    return;
  }
  Node *sum = new_node2(g, OP_ADD, x->grad, dx, x->shape);
  sum->layer = dx->layer;
  sum->loc = dx->loc;
  x->grad = sum;
}

static Node *mm(Graph *g, Node *a, Node *b, bool ta, bool tb) {
  int64_t m = ta ? a->shape.d[1] : a->shape.d[0], n = tb ? b->shape.d[0] : b->shape.d[1];
  Node *c = new_node2(g, OP_MATMUL, a, b, (Shape){2, {m, n}});
  c->ta = ta;
  c->tb = tb;
  return c;
}

static void copy_window(Node *to, const Node *from) {
  to->kh = from->kh, to->kw = from->kw, to->sh = from->sh, to->sw = from->sw;
  to->pad_t = from->pad_t, to->pad_l = from->pad_l;
}

// Gradients of n's operands from dy = n->grad.
static void backward_op(Graph *g, Node *n, const bool *need) {
  Node *dy = n->grad, *a = n->in[0], *b = n->nin > 1 ? n->in[1] : NULL;
  switch (n->op) {
  case OP_MATMUL:
    if (need[a->id])
      accumulate(g, a, n->ta ? mm(g, b, dy, n->tb, true) : mm(g, dy, b, false, !n->tb));
    if (need[b->id])
      accumulate(g, b, n->tb ? mm(g, dy, a, true, n->ta) : mm(g, a, dy, !n->ta, false));
    return;
  case OP_BIAS:
    if (need[a->id]) accumulate(g, a, dy);
    if (need[b->id]) accumulate(g, b, new_node1(g, OP_BIAS_GRAD, dy, b->shape));
    return;
  case OP_ACT: {
    bool uses_x = n->act == ACT_GELU || n->act == ACT_SILU;
    Node *dx = new_node2(g, OP_ACT_GRAD, dy, uses_x ? a : n, a->shape);
    dx->act = n->act;
    accumulate(g, a, dx);
    return;
  }
  case OP_SOFTMAX:
    accumulate(g, a, new_node2(g, OP_SOFTMAX_GRAD, dy, n, a->shape));
    return;
  case OP_ADD:
    for (int i = 0; i < n->nin; i++)
      if (need[n->in[i]->id]) accumulate(g, n->in[i], dy);
    return;
  case OP_CONCAT: {
    int64_t start = 0;
    for (int i = 0; i < n->nin; i++) {
      Node *x = n->in[i];
      if (need[x->id]) {
        Node *s = new_node1(g, OP_SLICE, dy, x->shape);
        s->axis = n->axis;
        s->start = start;
        accumulate(g, x, s);
      }
      start += x->shape.d[n->axis];
    }
    return;
  }
  case OP_RESHAPE:
    accumulate(g, a, new_node1(g, OP_RESHAPE, dy, a->shape));
    return;
  case OP_DROPOUT: {
    Node *dx = new_node1(g, OP_DROPOUT, dy, a->shape); // the same mask
    dx->rate = n->rate;
    dx->stream = n->stream;
    accumulate(g, a, dx);
    return;
  }
  case OP_SCALE: {
    Node *dx = new_node1(g, OP_SCALE, dy, a->shape);
    dx->scale = n->scale;
    accumulate(g, a, dx);
    return;
  }
  case OP_CONV2D:
    if (need[a->id]) {
      Node *dx = new_node2(g, OP_CONV2D_DX, dy, b, a->shape);
      copy_window(dx, n);
      accumulate(g, a, dx);
    }
    if (need[b->id]) {
      Node *dw = new_node2(g, OP_CONV2D_DW, a, dy, b->shape);
      copy_window(dw, n);
      accumulate(g, b, dw);
    }
    return;
  case OP_MAXPOOL: {
    Node *dx = new_node2(g, OP_MAXPOOL_GRAD, dy, a, a->shape);
    copy_window(dx, n);
    accumulate(g, a, dx);
    return;
  }
  default:
    unreachable();
  }
}

void build_backward(Graph *g) {
  int nfwd = g->nnodes;
  bool *need = xcalloc(nfwd, sizeof *need);
  for (int i = 0; i < nfwd; i++) {
    Node *n = g->nodes[i];
    need[i] = n->op == OP_PARAM;
    for (int k = 0; k < n->nin; k++) need[i] |= need[n->in[k]->id];
  }

  g->phase = PH_BACKWARD;
  Node *p = g->pred;
  if (need[p->id]) {
    Node *dp = new_node2(g, OP_LOSS_GRAD, p, g->y, p->shape);
    dp->loss = g->model->loss;
    dp->from_logits = g->model->from_logits;
    dp->name = "grad(loss)";
    dp->layer = p->layer;
    dp->loc = g->model->loss_loc;
    p->grad = dp;
  }
  for (int i = nfwd - 1; i >= 0; i--) {
    Node *n = g->nodes[i];
    if (!n->grad || n->op == OP_PARAM || n->op == OP_INPUT) continue;
    int first = g->nnodes;
    backward_op(g, n, need);
    for (int k = first; k < g->nnodes; k++) { // gradient ops belong to the op's layer
      g->nodes[k]->layer = n->layer;
      g->nodes[k]->loc = n->loc;
    }
  }

  g->phase = PH_UPDATE;
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    if (!v->param->grad) {
      warn_at(v->loc, "variable '%s' does not affect the loss; it is not trained", v->path);
      continue;
    }
    v->grad = v->param->grad;
    v->grad->name = format("grad(%s)", v->path);
    v->nslots = g->model->opt.kind == OPT_SGD ? (g->model->opt.momentum != 0)
              : g->model->opt.kind == OPT_RMSPROP ? 1 + (g->model->opt.momentum != 0)
                                                  : 2;
    Node *u = new_node2(g, OP_UPDATE, v->param, v->grad, v->shape);
    u->var = v;
    u->name = v->path;
    u->layer = v->layer;
    u->loc = v->loc;
  }
}
