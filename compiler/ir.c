// The IR: nodes, shapes and the small constructors every pass uses.
//
// A Node is one op of the op table (ops.c) on global shapes; new_node appends
// it to g->nodes in the phase being built (g->phase), so that g->nodes stays
// in topological order. The helpers here make nodes of a common form (a sum
// to a scalar, a scale, a view) and add a gradient into a node's running sum
// for the ops' grad rules (accumulate). They read no layer and no config;
// every pass may call them, and they call nothing above util.c.
//
// Issue 23, mixed precision: while build_layer builds a layer whose policy
// computes in 16 bits (g->cdt), new_node rounds (ROUND) where Keras casts
// and the value a 16-bit tensor would hold differs from float32's, at the
// ops' operands, so that the builders make the same ops as in float32:
//   - the result of an op made in 16 bits is that op's float32 result
//     rounded to the compute dtype (JAX computes each op in float32 and
//     rounds it: XLA's upcasts on the CPU, float32 accumulation in a
//     product); it is rounded once, at its first use (pend, rounded), and
//     not at all when the op only moves or picks 16-bit values (exact_op);
//   - an op made in 16 bits reads every float32 value cast: the layer's
//     inputs (Layer.__call__'s autocast), its variables (kernels, biases and
//     embeddings are cast when read under the layer's autocast scope), and
//     float32 values of its own (attention's probabilities);
//   - ops the builder makes in float32 (g->cdt_f32: LayerNormalization,
//     BatchNormalization, attention's scores and softmax, a mean) read
//     16-bit values as they are and float32 ones uncast (LayerNorm's gamma
//     and beta, BatchNorm's statistics), but a layer that autocasts still
//     casts its inputs (BatchNormalization's).
// build_layer rounds the layer's output (Keras's outputs are in the compute
// dtype). With no mixed layer nothing of this runs: a float32 model's graph
// is what it always was.
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

static Node **mixed_operands(Graph *g, int nin, Node **in, Node **cast);

Node *new_node(Graph *g, OpKind op, int nin, Node **in) {
  Node *cast[MAX_IN];
  if (g->cdt && nin) in = mixed_operands(g, nin, in, cast); // issue 23
  g->nodes = xgrow(g->nodes, g->nnodes, &g->cap, sizeof *g->nodes);
  Node *n = xcalloc(1, sizeof *n);
  n->id = g->nnodes;
  n->op = op;
  n->nin = nin;
  for (int i = 0; i < nin; i++) n->in[i] = in[i];
  n->phase = g->phase;
  n->dtype = DT_F32;
  for (int d = 0; d < MAX_RANK; d++) n->place.axis[d] = n->want.axis[d] = -1;
  if (g->cdt && nin && !g->cdt_f32) n->pend = (uint8_t)g->cdt; // a 16-bit op's result
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
  y->aff = (AffAttr){(float)k, 0, NULL};
  return y;
}

// A view of x with a dim of size 1 inserted (or any new shape).
Node *view(Graph *g, Node *x, Shape s) { return new_node1(g, OP_RESHAPE, x, s); }

// ---------------------------------------------------------------- issue 23: mixed precision

// Ops whose result is exactly a 16-bit value when their float operands
// are: they move, pick or (relu) clip values, never make new ones.
bool exact_op(const Node *n) {
  switch (n->op) {
  case OP_RESHAPE: case OP_TRANSPOSE: case OP_SLICE: case OP_PAD: case OP_CONCAT:
  case OP_MAXPOOL: case OP_GATHER: case OP_BROADCAST: case OP_REVERSE:
    return true;
  case OP_ACT:
    return n->act.kind == ACT_LINEAR || n->act.kind == ACT_RELU;
  case OP_MAXIMUM:
    return n->nin == 2;
  default:
    return false;
  }
}

Node *round_to(Graph *g, Node *x, int kind) {
  if (x->half == kind) return x;
  if (x->rounded && x->rounded->rnd.kind == kind) return x->rounded;
  int cdt = g->cdt;
  g->cdt = 0; // the ROUND itself is no 16-bit op
  Node *r = new_node1(g, OP_ROUND, x, x->shape);
  g->cdt = cdt;
  r->rnd.kind = kind;
  r->half = (uint8_t)kind;
  if (!x->rounded) x->rounded = r;
  return r;
}

Node *mixed_value(Graph *g, Node *x) {
  if (!x->pend) return x;
  bool exact = exact_op(x);
  for (int i = 0; exact && i < x->nin; i++)
    exact = x->in[i]->dtype != DT_F32 || x->in[i]->half == x->pend;
  if (exact) { // already a 16-bit value: nothing to round
    x->half = x->pend;
    x->pend = 0;
    return x;
  }
  return round_to(g, x, x->pend);
}

// The operands a new op of a mixed layer reads (new_node's comment above):
// in[] as they are, or cast[] with some of them rounded.
static Node **mixed_operands(Graph *g, int nin, Node **in, Node **cast) {
  for (int i = 0; i < nin; i++) {
    Node *a = in[i];
    if (a->dtype == DT_F32) {
      a = mixed_value(g, a);
      bool input = a->id < g->cdt_first && a->op != OP_PARAM; // from another layer
      if (!g->cdt_f32 || (input && g->cdt_autocast)) a = round_to(g, a, g->cdt);
    }
    cast[i] = a;
  }
  return cast;
}

Var **gradient_homes(Graph *g, int ids) {
  Var **home = xcalloc((size_t)ids + 1, sizeof *home);
  for (int i = 0; i < g->nvars; i++) { // the gradient, or the value it is a view of
    Var *v = g->vars[i];
    if (v->grad && base_of(v->grad)->id < ids && !home[base_of(v->grad)->id])
      home[base_of(v->grad)->id] = v;
  }
  // A gradient summed by an all-reduce is summed in place: the partial
  // sums are computed straight into the gradient blob.
  int *uses = xcalloc((size_t)ids + 1, sizeof *uses);
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++)
      if (g->nodes[i]->in[k]->id < ids) uses[g->nodes[i]->in[k]->id]++;
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    Node *gr = v->grad;
    while (gr && gr->inplace) gr = view_of(gr); // issue 23: rounded in place after its sum
    if (!gr || gr->op != OP_ALLREDUCE) continue;
    Node *p = gr->in[0];
    if (p->id >= ids || uses[p->id] != 1 || p->op == OP_PARAM || p->op == OP_INPUT ||
        p->op == OP_LABEL || p->op == OP_RESHAPE || is_collective(p->op) || home[p->id])
      continue;
    home[p->id] = v;
  }
  xfree(uses);
  return home;
}
