// Helpers both emitters share (emit_c.c, emit_cuda.c): how a node's buffer,
// shapes, layout and literals are written in generated code, so that the
// CPU and CUDA programs name and describe everything the same way.
#include "kdcc.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
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

// "{8, 13, 13, 2}"
char *dims_init(const Shape *s) {
  char b[256];
  int k = snprintf(b, sizeof b, "{");
  for (int i = 0; i < s->rank; i++)
    k += snprintf(b + k, sizeof b - k, "%s%lld", i ? ", " : "", (long long)s->d[i]);
  snprintf(b + k, sizeof b - k, "}");
  return xstrdup(b);
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

// The tables a kdrt_program points to: its variables and the mesh.
void emit_program_tables(void) {
  const Mesh *m = &EG->dist->mesh;
  out("\nstatic const kdrt_var vars[] = {\n");
  for (int i = 0; i < EG->nvars; i++) {
    const Var *v = EG->vars[i];
    out("  {\"%s\", \"%s\", \"%s\", %d, %s,\n   %s, %lld, %d, %s, %lld},\n", v->path, v->layer,
        v->layer_class, v->index, layout_init(v->param), off_name(v->param),
        (long long)((lelems(v->param) + 15) / 16 * 16), v->nslots,
        v->grad ? off_name(v->grad) : "SIZE_MAX", (long long)lelems(v->param));
  }
  if (!EG->nvars) out("  {NULL, NULL, NULL, 0, {0, {0}, {0}}, 0, 0, 0, 0, 0},\n");
  out("};\n");
  out("\nstatic const int mesh_shape[] = {");
  for (int a = 0; a < m->ndim; a++) out("%s%d", a ? ", " : "", m->shape[a]);
  if (!m->ndim) out("1");
  out("};\nstatic const char *const mesh_axes[] = {");
  for (int a = 0; a < m->ndim; a++) out("%s\"%s\"", a ? ", " : "", m->names[a]);
  if (!m->ndim) out("\"batch\"");
  out("};\n");
}

// Every field of the kdrt_program but pred_layout, one per line as
// `<lhs><field> = <value><end>`: ("  .", ",\n") for a C initializer,
// ("  p.", ";\n") for assignments.
void emit_program_fields(const char *lhs, const char *end) {
  const Graph *g = EG;
  const Mesh *m = &g->dist->mesh;
  const Model *md = g->model;
  const Node *x = g->x, *p = g->pred, *pb = view_base(p);
  int label = md->loss == LOSS_CCE ? 1 : md->loss == LOSS_SCCE ? 2 : md->loss == LOSS_BCE ? 3 : 0;
#define FIELD(name, ...) (out("%s" name " = ", lhs), out(__VA_ARGS__), out("%s", end))
  FIELD("model_name", "\"%s\"", md->name);
  FIELD("mesh_ndim", "%d", m->ndim ? m->ndim : 1);
  FIELD("mesh_shape", "mesh_shape");
  FIELD("mesh_axes", "mesh_axes");
  FIELD("batch_axis", "%d", g->dist->batch_axis);
  FIELD("batch", "%d", g->batch);
  FIELD("x_rank", "%d", x->shape.rank - 1);
  for (int d = 1; d < x->shape.rank; d++)
    out("%sx_shape[%d] = %lld%s", lhs, d - 1, (long long)x->shape.d[d], end);
  FIELD("y_rank", "%d", g->y->shape.rank - 1);
  for (int d = 1; d < g->y->shape.rank; d++)
    out("%sy_shape[%d] = %lld%s", lhs, d - 1, (long long)g->y->shape.d[d], end);
  FIELD("label_kind", "%d", label);
  FIELD("num_classes", "%lld", (long long)p->shape.d[p->shape.rank - 1]);
  FIELD("loss_name", "\"loss\"");
  FIELD("metric_name", "%s", g->metric ? "\"accuracy\"" : "NULL");
  FIELD("learning_rate", "%s", flt(md->opt.lr));
  FIELD("param_floats", "PARAM_FLOATS");
  FIELD("grad_floats", "GRAD_FLOATS");
  FIELD("arena_floats", "ARENA_FLOATS");
  FIELD("init", "init");
  FIELD("train_step", "train_step");
  FIELD("eval_step", "eval_step");
  FIELD("grad_step", "grad_step");
  FIELD("nvars", "%d", g->nvars);
  FIELD("vars", "vars");
  // A .keras archive's own weights are the program's initial ones (runtime/weights.c).
  size_t flen = strlen(md->file);
  char *abs = flen > 6 && !strcmp(md->file + flen - 6, ".keras") ? realpath(md->file, NULL) : NULL;
  if (abs) {
    out("%sweights_file = \"", lhs);
    for (const char *q = abs; *q; q++)
      out(*q == '"' || *q == '\\' ? "\\%c" : (unsigned char)*q < 0x20 ? "\\%03o" : "%c", *q);
    out("\"%s", end);
  }
  // The model output, for `./train predict`; memplan.c keeps it live to the end of eval_step.
  if (pb->region == REGION_ARENA && !p->place.partial)
    FIELD("pred_offset", "%s", off_name(pb));
  else
    FIELD("pred_offset", "SIZE_MAX /* the output is not one whole arena buffer */");
#undef FIELD
}
