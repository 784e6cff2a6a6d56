// The IR: nodes, shapes and the small constructors every pass uses.
//
// A Node is one op of the op table (ops.c) on global shapes; new_node appends
// it to g->nodes in the phase being built (g->phase), so that g->nodes stays
// in topological order. The helpers here make nodes of a common form (a sum
// to a scalar, a scale, a view) and add a gradient into a node's running sum
// for the ops' grad rules (accumulate). They read no layer and no config;
// every pass may call them, and they call nothing above util.c.
#include "kdcc.h"

#include <stdint.h>

bool shape_eq(const Shape *a, const Shape *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->d[i] != b->d[i]) return false;
  return true;
}

char *shape_str(const Shape *s) {
  char *b = "[";
  for (int i = 0; i < s->rank; i++) b = format("%s%s%lld", b, i ? ", " : "", (long long)s->d[i]);
  return format("%s]", b);
}

// A layer output's shape as Keras prints it: the batch dim as None.
char *kshape(const Shape *s) {
  char *b = "(None";
  for (int i = 1; i < s->rank; i++) b = format("%s, %lld", b, (long long)s->d[i]);
  return format("%s%s", b, s->rank == 1 ? ",)" : ")");
}

int axis_size(const Graph *g, int axis) { return axis < 0 ? 1 : g->dist->mesh.shape[axis]; }

// Saturated (INT64_MAX) rather than wrapped: loss.c rejects a tensor over MAX_ELEMS.
int64_t shape_elems(const Shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n = size_mul(n, s->d[i]);
  return n;
}

Shape local_shape(const Graph *g, const Node *n) {
  Shape s = n->shape;
  for (int d = 0; d < s.rank; d++) s.d[d] /= axis_size(g, n->place.axis[d]);
  return s;
}

uint64_t hash_str(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull; // FNV-1a
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

Node *new_node(Graph *g, OpKind op, int nin, Node **in) {
  g->nodes = xgrow(g->nodes, g->nnodes, &g->cap, sizeof *g->nodes);
  Node *n = xcalloc(1, sizeof *n);
  n->id = g->nnodes;
  n->op = op;
  n->nin = nin;
  for (int i = 0; i < nin; i++) n->in[i] = in[i];
  n->phase = g->phase;
  n->dtype = DT_F32;
  for (int d = 0; d < MAX_RANK; d++) n->place.axis[d] = n->want.axis[d] = -1;
  g->nodes[g->nnodes++] = n;
  return n;
}

Node *new_node1(Graph *g, OpKind op, Node *a, Shape shape) {
  Node *n = new_node(g, op, 1, &a);
  n->shape = shape;
  n->layer = a->layer;
  n->loc = a->loc;
  return n;
}

Node *new_node2(Graph *g, OpKind op, Node *a, Node *b, Shape shape) {
  Node *in[2] = {a, b};
  Node *n = new_node(g, op, 2, in);
  n->shape = shape;
  n->layer = a->layer;
  n->loc = a->loc;
  return n;
}

// Gradient accumulation for the ops' grad rules: x->grad += dx.
void accumulate(Graph *g, Node *x, Node *dx) {
  if (!x->grad) {
    x->grad = dx;
    return;
  }
  Node *sum = new_node2(g, OP_ADD, x->grad, dx, x->shape);
  sum->layer = dx->layer;
  sum->loc = dx->loc;
  x->grad = sum;
}

// x summed over every dim, to a scalar (one REDUCE_SUM a dim).
Node *sum_all(Graph *g, Node *x) {
  while (x->shape.rank > 0) {
    Shape s = x->shape;
    s.rank--;
    for (int i = 0; i < s.rank; i++) s.d[i] = x->shape.d[i + 1];
    Node *y = new_node1(g, OP_REDUCE_SUM, x, s);
    y->red.dim = 0;
    x = y;
  }
  return x;
}

Node *scaled(Graph *g, Node *x, double k) {
  Node *y = new_node1(g, OP_SCALE, x, x->shape);
  y->aff = (AffAttr){(float)k, 0};
  return y;
}

// A view of x with a dim of size 1 inserted (or any new shape).
Node *view(Graph *g, Node *x, Shape s) { return new_node1(g, OP_RESHAPE, x, s); }
