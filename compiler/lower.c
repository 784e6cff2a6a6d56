// Lowering's spelling: how a node's buffer, shapes, layout and literals
// are written in generated code, for the ops' lowerings (ops.c) and the
// emitters (emit.c, emit_c.c, emit_cuda.c) alike.
//
// A buffer is named by its region and node (P_ a variable's, G_ its
// gradient's, A<id>_ an arena value's, a view its base's); a batch dim's
// extent is a Sym, k times the step's rows, so that the batch is known only
// at run time; a float literal reads back exactly. Everything here reads
// the graph being emitted (EG), which emit_begin sets, and writes nothing.
#include "kdcc.h"

#include <ctype.h>
#include <string.h>

Graph *EG;

char *ident(const char *s) {
  char *r = xstrdup(s ? s : "");
  for (char *p = r; *p; p++)
    if (!isalnum((unsigned char)*p)) *p = '_';
  return r;
}

char *off_name(const Node *n) {
  n = view_base(n); // a view's buffer is its base's (a Conv1D kernel's gradient)
  switch (n->region) {
  case REGION_PARAM: return format("P_%s", ident(n->var->path));
  case REGION_GRAD: return format("G_%s", ident(n->var->path));
  case REGION_ARENA:
    return format("A%d_%s%s%s", n->id, ident(n->layer ? n->layer : n->name), n->role ? "_" : "",
                  n->role ? n->role : "");
  default: return NULL;
  }
}

const Node *view_base(const Node *n) {
  // an update's value is its variable, updated in place (a constraint reads it)
  while (n->op == OP_RESHAPE || n->op == OP_UPDATE) n = n->in[0];
  return n;
}

char *buf(const Node *n) {
  n = view_base(n);
  switch (n->region) {
  case REGION_PARAM: return format("(P + %s)", off_name(n));
  case REGION_GRAD: return format("(G + %s)", off_name(n));
  case REGION_ARENA:
    return n->dtype == DT_I32 ? format("((int32_t *)(A + %s))", off_name(n))
                              : format("(A + %s)", off_name(n));
  case REGION_INPUT:
    return format("((const %s *)%s[%d])", n->dtype == DT_I32 ? "int32_t" : "float",
                  n->op == OP_INPUT ? "x" : "y", n->index);
  }
  unreachable();
}

char *flt(double v) {
  char *s = format("%.9g", v);
  return strpbrk(s, ".en") ? format("%sf", s) : format("%s.0f", s);
}

char *axes_c(unsigned axes) {
  char *s = NULL;
  for (int a = 0; a < EG->dist->mesh.ndim; a++)
    if ((axes >> a) & 1)
      s = format("%s%sAX_%s", s ? s : "", s ? " | " : "", ident(EG->dist->mesh.names[a]));
  return s ? s : xstrdup("0");
}

Shape lshape(const Node *n) { return local_shape(EG, n); }

Sym sym_dim(const Node *n, int d, bool local) {
  if (!((n->bdims >> d) & 1)) {
    if (!local) return (Sym){n->shape.d[d], NULL};
    Shape s = lshape(n);
    return (Sym){s.d[d], NULL};
  }
  int a = n->place.axis[d];
  if (!local || a < 0) return (Sym){1, "B"};
  if (a == EG->dist->batch_axis) return (Sym){1, "b"};
  return (Sym){1, format("(B / %d)", axis_size(EG, a))};
}

Sym sym_mul(Sym a, Sym b) {
  if (a.v && b.v) unreachable(); // one batch dim a tensor
  return (Sym){a.k * b.k, a.v ? a.v : b.v};
}

Sym sym_prod(const Node *n, int from, int to, bool local) {
  Sym p = {1, NULL};
  for (int d = from; d < to; d++) p = sym_mul(p, sym_dim(n, d, local));
  return p;
}

char *sym_c(Sym s) {
  if (!s.v) return format("%lld", (long long)s.k);
  return s.k == 1 ? xstrdup(s.v) : format("%s * %lld", s.v, (long long)s.k);
}

char *sym_dims(const Node *n) {
  char *b = xstrdup("{");
  for (int d = 0; d < n->shape.rank; d++)
    b = format("%s%s%s", b, d ? ", " : "", sym_c(sym_dim(n, d, true)));
  return format("%s}", b);
}

char *sym_layout(const Node *n) {
  char *g = xstrdup("{"), *ax = xstrdup("{");
  for (int d = 0; d < n->shape.rank; d++) {
    g = format("%s%s%s", g, d ? ", " : "", sym_c(sym_dim(n, d, false)));
    ax = format("%s%s%d", ax, d ? ", " : "", n->place.axis[d]);
  }
  return format("{%d, %s}, %s}}", n->shape.rank, g, ax);
}

int64_t lelems(const Node *n) {
  Shape s = lshape(n);
  return shape_elems(&s);
}

// "{8, 13, 13, 2}"
static char *dims_init(const Shape *s) {
  char *b = xstrdup("{");
  for (int i = 0; i < s->rank; i++) b = format("%s%s%lld", b, i ? ", " : "", (long long)s->d[i]);
  return format("%s}", b);
}

char *layout_init(const Node *n) {
  char *ax = xstrdup("{");
  for (int i = 0; i < n->shape.rank; i++) ax = format("%s%s%d", ax, i ? ", " : "", n->place.axis[i]);
  return format("{%d, %s, %s}}", n->shape.rank, dims_init(&n->shape), ax);
}

char *describe(const Node *n) {
  Shape ls = lshape(n);
  return format("%s %s local %s", shape_str(&n->shape),
                place_str(&EG->dist->mesh, n->shape.rank, &n->place), shape_str(&ls));
}
