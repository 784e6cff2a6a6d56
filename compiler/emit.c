// Helpers both emitters share (emit_c.c, emit_cuda.c): how a node's buffer,
// shapes, layout and literals are written in generated code, so that the
// CPU and CUDA programs name and describe everything the same way.
#include "kdcc.h"

#include <ctype.h>
#include <stdarg.h>
#include <string.h>

Graph *EG;
FILE *EF;

void emit_begin(Graph *g, FILE *f) {
  EG = g;
  EF = f;
}

void out(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(EF, fmt, ap);
  va_end(ap);
}

char *ident(const char *s) {
  char *r = xstrdup(s ? s : "");
  for (char *p = r; *p; p++)
    if (!isalnum((unsigned char)*p)) *p = '_';
  return r;
}

char *off_name(const Node *n) {
  switch (n->region) {
  case REGION_PARAM: return format("P_%s", ident(n->var->path));
  case REGION_GRAD: return format("G_%s", ident(n->var->path));
  case REGION_ARENA: return format("A%d_%s", n->id, ident(n->layer ? n->layer : n->name));
  default: return NULL;
  }
}

const Node *view_base(const Node *n) {
  while (n->op == OP_RESHAPE) n = n->in[0];
  return n;
}

char *buf(const Node *n) {
  n = view_base(n);
  switch (n->region) {
  case REGION_PARAM: return format("(P + %s)", off_name(n));
  case REGION_GRAD: return format("(G + %s)", off_name(n));
  case REGION_ARENA: return format("(A + %s)", off_name(n));
  case REGION_INPUT: return xstrdup(n->op == OP_INPUT ? "x" : "y");
  }
  unreachable();
}

char *flt(double v) {
  char *s = format("%.9g", v);
  return strpbrk(s, ".en") ? format("%sf", s) : format("%s.0f", s);
}

Shape lshape(const Node *n) { return local_shape(EG, n); }

int64_t lelems(const Node *n) {
  Shape s = lshape(n);
  return shape_elems(&s);
}

char *layout_init(const Node *n) {
  char b[256];
  int k = snprintf(b, sizeof b, "{%d, {", n->shape.rank);
  for (int i = 0; i < n->shape.rank; i++)
    k += snprintf(b + k, sizeof b - k, "%s%lld", i ? ", " : "", (long long)n->shape.d[i]);
  k += snprintf(b + k, sizeof b - k, "}, {");
  for (int i = 0; i < n->shape.rank; i++)
    k += snprintf(b + k, sizeof b - k, "%s%d", i ? ", " : "", n->place.axis[i]);
  snprintf(b + k, sizeof b - k, "}}");
  return xstrdup(b);
}

char *describe(const Node *n) {
  Shape ls = lshape(n);
  return format("%s %s local %s", shape_str(&n->shape),
                place_str(&EG->dist->mesh, n->shape.rank, &n->place), shape_str(&ls));
}

int64_t prod(const Shape *s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= s->d[i];
  return p;
}

const char *const init_name[] = {
  "KDRT_INIT_ZEROS", "KDRT_INIT_ONES", "KDRT_INIT_CONSTANT", "KDRT_INIT_GLOROT_UNIFORM",
  "KDRT_INIT_GLOROT_NORMAL", "KDRT_INIT_HE_UNIFORM", "KDRT_INIT_HE_NORMAL",
  "KDRT_INIT_LECUN_UNIFORM", "KDRT_INIT_LECUN_NORMAL", "KDRT_INIT_RANDOM_NORMAL",
  "KDRT_INIT_RANDOM_UNIFORM", "KDRT_INIT_TRUNCATED_NORMAL",
};
const char *const act_c[] = {"KDRT_ACT_LINEAR", "KDRT_ACT_RELU", "KDRT_ACT_SIGMOID",
                             "KDRT_ACT_TANH", "KDRT_ACT_GELU", "KDRT_ACT_SILU"};

void emit_conv_args(const Node *n, const Node *x, const Node *y) {
  Shape xs = lshape(x), ys = lshape(y);
  out("%lld, %lld, %lld, %lld, %d, %d, %lld, %d, %d, %d, %d, %lld, %lld, scratch",
      (long long)xs.d[0], (long long)xs.d[1], (long long)xs.d[2], (long long)xs.d[3], n->kh,
      n->kw, (long long)ys.d[3], n->sh, n->sw, n->pad_t, n->pad_l, (long long)ys.d[1],
      (long long)ys.d[2]);
}

void emit_op_comment(const Node *n) {
  out("\n  // %%%d %s", n->id, op_info[n->op].name);
  if (n->op == OP_ACT || n->op == OP_ACT_GRAD || n->op == OP_BIAS_ACT)
    out(" %s", act_name(n->act));
  if (n->layer) out(" (%s)", n->layer);
  if (n->name) out(": %s", n->name);
  out("\n  //   %s\n", describe(n));
  if (is_collective(n->op)) out("  //   why: %s\n", n->reason);
}
