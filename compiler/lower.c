// Lowering's spelling: how a node's buffer, shapes, layout and literals
// are written in generated code, for the ops' lowerings (ops.c) and the
// emitters (emit.c, emit_c.c, emit_cuda.c) alike.
//
// A buffer is named by its region and node (P_ a variable's, G_ its
// gradient's, A<id>_ an arena value's, a view its base's); a batch dim's
// extent is a Sym, k times the step's rows, so that the batch is known only
// at run time; a float literal reads back exactly. Everything here reads
// the graph being emitted (EG), which emit_begin sets, and writes nothing.
//
// issue 25: a value of a repeated block (blocks.c) is spelled for its
// layer: a block's variable as layer 0's name plus the layer times the
// block's stride in the blob (P_bl_ln1_gamma + l * BLOCK1_P), a value kept
// for every layer as its buffer plus the layer times one layer's floats
// (A23_bl_attn_q + l * R2 * 128), a temporary of the block as its one
// buffer. Inside a block's function (ECTX) the layer is the variable l;
// outside, the number of the layer.
#include "kdcc.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

Graph *EG;
BlockCtx ECTX;

// ---- where a node sits in the repeated blocks

const BlockAt *block_at(const Graph *g, const Node *n) {
  if (!g->at || n->id < 0 || n->id >= g->nat || g->at[n->id].b < 0) return NULL;
  return &g->at[n->id];
}

const VarBlock *var_block(const Graph *g, const Var *v, int *layer, int *k) {
  for (int i = 0; v && i < g->nvblocks; i++) {
    const VarBlock *vb = &g->vblocks[i];
    int o = v->order - vb->first;
    if (o < 0 || o >= vb->nv * vb->n) continue;
    if (layer) *layer = o / vb->nv;
    if (k) *k = o % vb->nv;
    return vb;
  }
  return NULL;
}

int block_layer(const RepBlock *b, int copy) { return b->layer0 + b->dir * copy; }

int block_copy(const RepBlock *b, int layer) {
  int c = (layer - b->layer0) * b->dir;
  return c >= 0 && c < b->count ? c : -1;
}

char *name_with_layer(const char *s0, const char *s1, const char *mark) {
  if (!s0 || !s1) return NULL;
  if (!strcmp(s0, s1)) return xstrdup(s0);
  size_t i = 0;
  while (s0[i] && s0[i] == s1[i]) i++;
  while (i > 0 && isdigit((unsigned char)s0[i - 1])) i--;
  size_t a = i, b = i;
  if (!isdigit((unsigned char)s0[a]) || !isdigit((unsigned char)s1[b])) return NULL;
  while (isdigit((unsigned char)s0[a])) a++;
  while (isdigit((unsigned char)s1[b])) b++;
  if (strcmp(s0 + a, s1 + b)) return NULL;
  return format("%.*s%s%s", (int)i, s0, mark, s0 + a);
}

char *rows_name(int parts) { return parts <= 1 ? xstrdup("B") : format("R%d", parts); }

// The variable whose blob entry node n (a view's base) is: P (a parameter)
// or G (a gradient) in *which; NULL: none.
static const Var *bound_var(const Node *n, char *which) {
  if (n->op == OP_PARAM) return *which = 'P', n->var;
  if (EG->home && n->id < EG->nat && EG->home[n->id]) return *which = 'G', EG->home[n->id];
  return NULL;
}

// A name with the layer's number written "<l>" as an identifier's "l".
static char *layer_mark(const char *s) {
  const char *m = strstr(s, "<l>");
  return m ? format("%.*sl%s", (int)(m - s), s, m + 3) : xstrdup(s);
}

// A buffer expression e as a pointer to n's elements: int32 ids, issue
// 23's 16-bit values (DT_U16), or floats.
static char *typed(const Node *n, const char *e) {
  return n->dtype == DT_I32   ? format("((int32_t *)(%s))", e)
         : n->dtype == DT_U16 ? format("((uint16_t *)(%s))", e)
                              : format("(%s)", e);
}

// The layer the context's copy runs.
static int ctx_layer(void) { return block_layer(ECTX.b, ECTX.copy); }

// "l", "(l + 2)", "(l - 1)": the layer d after the function's.
static char *layer_expr(int d) {
  return !d ? xstrdup("l") : format("(l %c %d)", d > 0 ? '+' : '-', abs(d));
}

// The name of block value (b, pos): its first copy's node, its layer's
// name with the layer's number as 'l' ("A23_bl_attn_q").
static char *block_value_name(const RepBlock *b, int pos) {
  const Node *n0 = EG->nodes[b->start + pos], *n1 = EG->nodes[b->start + b->len + pos];
  const char *l0 = n0->layer ? n0->layer : n0->name, *l1 = n1->layer ? n1->layer : n1->name;
  char *gl = name_with_layer(l0, l1, "l");
  return format("A%d_%s%s%s", n0->id, ident(gl ? gl : l0), n0->role ? "_" : "",
                n0->role ? n0->role : "");
}

const Node *block_in_node(const RepBlock *b, int s, int c) {
  const BlockIn *in = &b->in[s];
  const RepBlock *src = &EG->blocks[in->src];
  int sc = block_copy(src, block_layer(b, c) + in->delta);
  return sc < 0 ? in->outer : EG->nodes[src->start + sc * src->len + in->pos];
}

// Stacked value (b, pos) of layer `layer` in block b's buffer, spelled
// for the context's copy (ECTX.b: its l) or, outside a block, the layer.
static char *stacked_value(const RepBlock *b, int pos, int layer) {
  const Node *n = EG->nodes[b->start + pos];
  char *e = format("A + %s", block_value_name(b, pos));
  int lo = b->dir > 0 ? b->layer0 : block_layer(b, b->count - 1);
  char *stride = b->parts[pos] ? format("%s * %lld", rows_name(b->parts[pos]),
                                        (long long)b->kper[pos])
                               : format("%lld", (long long)b->kper[pos]);
  if (b->pair[pos]) { // two buffers, layer l's the (l % 2)th
    int d = layer - (ECTX.b ? ctx_layer() : 0);
    char *l = d ? format("(l %c %d)", d > 0 ? '+' : '-', abs(d)) : "l";
    if (ECTX.b) e = format("%s + %s %% 2 * %s", e, l, stride);
    else if (layer % 2) e = format("%s + %s", e, stride);
  } else if (ECTX.b) e = format("%s + %s * %s", e, layer_expr(layer - ctx_layer() - lo), stride);
  else if (layer - lo) e = format("%s + %d * %s", e, layer - lo, stride);
  return typed(n, e);
}

char *block_input_value(const BlockIn *in) {
  return stacked_value(&EG->blocks[in->src], in->pos, ctx_layer() + in->delta);
}

char *block_x_index(const BlockX *x) {
  return x->base ? format("%d + %d * l", x->base, x->step) : format("%d * l", x->step);
}

// Step input n, at index idx of x (an input) or y (a label).
static char *step_input(const Node *n, const char *idx) {
  return format("((const %s *)%s[%s])", n->dtype == DT_I32 ? "int32_t" : "float",
                n->op == OP_INPUT ? "x" : "y", idx);
}

// Node n (a view's base) as the context spells it, as a buffer or (name)
// as the offset that follows "P + "; NULL: as it would be without blocks.
static char *block_spelling(const Node *n, bool name) {
  char which;
  const Var *v = bound_var(n, &which);
  int j, k;
  const VarBlock *vb = v ? var_block(EG, v, &j, &k) : NULL;
  bool sym = ECTX.b && ECTX.symbolic;
  if (vb) {
    if (sym) return format("{V%d.%d%c@%d}", vb->id, k, which, j - ctx_layer());
    char *base = format("%c_%s", which, ident(layer_mark(vb->gen[k]))), *e;
    if (ECTX.b)
      e = format("%s + %s * BLOCK%d_%c", base, layer_expr(j - ctx_layer()), vb->id, which);
    else e = j ? format("%s + %d * BLOCK%d_%c", base, j, vb->id, which) : base;
    return name ? e : format("(%c + %s)", which, e);
  }
  if (v) return sym ? format("{%%%d}", n->id) : NULL; // a variable of no block: itself
  for (int s = 0; n->op == OP_INPUT && ECTX.b && s < ECTX.b->nxin; s++) {
    const BlockX *x = &ECTX.b->xin[s]; // a step input by layer: x[base + step * l]
    if (n->index != x->base + x->step * ctx_layer()) continue;
    if (sym) return format("{x%d%+d*l}", x->base, x->step);
    return name ? NULL : step_input(n, block_x_index(x));
  }
  if (ECTX.b)
    for (int s = 0; s < ECTX.b->nin; s++)
      if (block_in_node(ECTX.b, s, ECTX.copy) == n) return format(sym ? "{in%d}" : "in%d", s);
  const BlockAt *at = block_at(EG, n);
  if (!at) return sym ? format("{%%%d}", n->id) : NULL;
  const RepBlock *b = &EG->blocks[at->b];
  int layer = block_layer(b, at->copy);
  if (sym) return format("{B%d.%d@%d}", at->b, at->pos, layer - ctx_layer());
  if (name) return block_value_name(b, at->pos);
  if (b->stacked && b->stacked[at->pos]) return stacked_value(b, at->pos, layer);
  return typed(n, format("A + %s", block_value_name(b, at->pos)));
}

char *ident(const char *s) {
  char *r = xstrdup(s ? s : "");
  for (char *p = r; *p; p++)
    if (!isalnum((unsigned char)*p)) *p = '_';
  return r;
}

char *off_name(const Node *n) {
  n = view_base(n); // a view's buffer is its base's (a Conv1D kernel's gradient)
  char *b = EG->nblocks ? block_spelling(n, true) : NULL;
  if (b) return b;
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
  while (n->op == OP_UPDATE || view_of(n)) n = n->op == OP_UPDATE ? n->in[0] : view_of(n);
  return n;
}

char *buf(const Node *n) {
  n = view_base(n);
  char *b = EG->nblocks ? block_spelling(n, false) : NULL;
  if (b) return n->region == REGION_PARAM && n->dtype == DT_U16 ? typed(n, b) : b; // (issue 23)
  switch (n->region) {
  case REGION_PARAM: return typed(n, format("P + %s", off_name(n)));
  case REGION_GRAD: return format("(G + %s)", off_name(n));
  case REGION_ARENA: return typed(n, format("A + %s", off_name(n)));
  case REGION_INPUT: return step_input(n, format("%d", n->index));
  }
  unreachable();
}

char *flt(double v) {
  char *s = format("%.9g", v);
  return strpbrk(s, ".en") ? format("%sf", s) : format("%s.0f", s);
}

char *opt_const(const char *name) {
  char *s = format("%s_%s", EG->model->opt.name, name);
  for (char *p = s; *p; p++) *p = (char)toupper((unsigned char)*p);
  return s;
}

// issue 23: the CPU's 16-bit products widen their operands in a buffer of
// the program's (ops.c's widen16_c, memplan.c's widen16_floats); off for
// the GPU (main.c), which widens nothing.
bool opt_widen16 = true;
int opt_gpu_products = 0;

int opt_consts(const Optimizer *o, const char **names, float *values) {
  int n = 0;
#define HP(field) (names[n] = #field, values[n++] = o->field)
  switch (o->kind) { // as ops.c's update_emit reads them
  case OPT_SGD: HP(momentum); break;
  case OPT_ADAM: case OPT_ADAMAX: case OPT_NADAM: HP(beta_1), HP(beta_2), HP(epsilon); break;
  case OPT_ADAMW: HP(beta_1), HP(beta_2), HP(epsilon), HP(weight_decay); break;
  case OPT_RMSPROP: HP(rho), HP(momentum), HP(epsilon); break;
  case OPT_ADAGRAD: HP(epsilon); break;
  case OPT_LION: HP(beta_1), HP(beta_2); break;
  case OPT_COUNT: break;
  }
  if (o->weight_decay != 0 && o->kind != OPT_ADAMW) HP(weight_decay);
  if (o->clipvalue > 0) HP(clipvalue);
#undef HP
  return n;
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

// issue 25: in a block's function, a name of node n (its layer, 0, or its
// own, 1) with the layer's number as <l>.
const char *layer_named(const Node *n, const char *s, int which) {
  const BlockAt *at = ECTX.b ? block_at(EG, n) : NULL;
  if (!at) return s;
  const RepBlock *b = &EG->blocks[at->b];
  const Node *m = EG->nodes[b->start + (at->copy ? 0 : b->len) + at->pos];
  char *gn = name_with_layer(s, which ? m->name : m->layer, "<l>");
  return gn ? gn : s;
}

// ---- issue 25: the layers' hyper-parameters, named where a call reads them

static HParam *hparams;
static int nhparams, hparams_cap;

void hparams_reset(void) { nhparams = 0; }

const HParam *hparams_named(int *n) {
  *n = nhparams;
  return hparams;
}

// Node n's layer's `attr` (of a layer <l> of a block's function) named as
// the constant value `lit`, or table `ctype` [count]: "BL_LN1_EPSILON".
static char *hparam_named(const Node *n, const char *attr, char *lit, const char *note,
                          double v, const char *ctype, int count) {
  const char *layer = n->layer ? layer_named(n, n->layer, 0) : "model";
  // "b<l>_ln1" -> "BL_LN1": the layer's number as L, as P_bl_ln1_gamma spells it
  char *base = format("%s_%s", layer, attr), *q = base;
  for (const char *p = base; *p; p++) {
    if (!strncmp(p, "<l>", 3)) {
      *q++ = 'L';
      p += 2;
      continue;
    }
    *q++ = isalnum((unsigned char)*p) ? (char)toupper((unsigned char)*p) : '_';
  }
  *q = '\0';
  char *name = base;
  const char *oh[8];
  float ov[8];
  int no = opt_consts(&EG->model->opt, oh, ov); // a layer called "adam": not ADAM_EPSILON
  for (int k = 2;; k++) { // two layers whose names read the same apart: numbered
    int i = 0, j = 0;
    while (i < nhparams && strcmp(hparams[i].name, name)) i++;
    while (j < no && strcmp(opt_const(oh[j]), name)) j++;
    if (i < nhparams && !strcmp(hparams[i].value, lit)) return name;
    if (i == nhparams && j == no) break;
    name = format("%s_%d", base, k);
  }
  const Layer *l = n->layer ? find_layer(EG->model, n->layer) : NULL;
  const char *cls = l ? l->cls : "the model";
  hparams = xgrow(hparams, nhparams, &hparams_cap, sizeof *hparams);
  hparams[nhparams++] = (HParam){
      name, lit, note ? format("%s: %s, %s", layer, cls, note)
                      : format("%s: %s(%s=%g)", layer, cls, attr, v), ctype, count};
  return name;
}

char *hparam(const Node *n, const char *attr, double v, const char *note) {
  char *lit = flt(v);
  if (ECTX.b && ECTX.symbolic) return lit; // blocks.c: copies are one block by value
  return hparam_named(n, attr, lit, note, v, NULL, 0);
}

// Each layer's lit() of node n of the context's block (v[j]: layer *lo +
// j's); NULL where n is none of the block's or the layers agree.
static char **layer_values(const Node *n, char *(*lit)(const Node *), int *lo) {
  const RepBlock *b = ECTX.b;
  *lo = b->dir > 0 ? b->layer0 : block_layer(b, b->count - 1);
  const BlockAt *at = block_at(EG, n);
  char **v = xcalloc((size_t)b->count, sizeof *v);
  bool same = true;
  for (int c = 0; c < b->count; c++) {
    int j = block_layer(b, c) - *lo;
    v[j] = lit(EG->nodes[b->start + c * b->len + at->pos]);
    same &= !strcmp(v[j], v[block_layer(b, 0) - *lo]);
  }
  if (!same) return v;
  xfree(v);
  return NULL;
}

// Whether node n is a value of the context's block (per_layer's case).
static bool in_ctx_block(const Node *n) {
  const BlockAt *at = ECTX.b ? block_at(EG, n) : NULL;
  return at && &EG->blocks[at->b] == ECTX.b;
}

// "NAME[l]", or "NAME[l - lo]" for a block whose first layer is lo.
static char *by_l(const char *name, int lo) {
  return lo ? format("%s[l - %d]", name, lo) : format("%s[l]", name);
}

char *per_layer(const Node *n, const char *attr, const char *ctype, const char *note,
                char *(*lit)(const Node *)) {
  if (!in_ctx_block(n)) return lit(n);
  if (ECTX.symbolic) return format("{%s by layer}", attr); // the copies alike but for it
  int lo;
  char **v = layer_values(n, lit, &lo);
  if (!v) return lit(n);
  char *table = xstrdup(""); // "v0, v1, ..." (emit_hparams_end wraps it)
  for (int i = 0; i < ECTX.b->count; i++) table = format("%s%s%s", table, i ? ", " : "", v[i]);
  xfree(v);
  return by_l(hparam_named(n, attr, table, note, 0, ctype, ECTX.b->count), lo);
}

char *per_layer_object(const Node *n, const char *attr, const char *ctype, const char *note,
                       char *(*init)(const Node *)) {
  if (!in_ctx_block(n)) return NULL;
  if (ECTX.symbolic) return format("{%s by layer}", attr);
  int lo, count = ECTX.b->count, k = 0;
  char **v = layer_values(n, init, &lo);
  if (!v) return NULL;
  char **name = xcalloc((size_t)count, sizeof *name), *table = xstrdup("");
  for (int j = 0; j < count; j++) {
    int f = 0; // the first layer of v[j]'s value
    while (strcmp(v[f], v[j])) f++;
    if (f == j) { // a value of its own, named once, its comment its layers ("0-4, 6")
      char *layers = xstrdup("");
      for (int i = j, e; i < count; i = e + 1) {
        for (e = i; e + 1 < count && !strcmp(v[e + 1], v[i]); e++) {}
        if (strcmp(v[i], v[j])) continue;
        layers = format(e > i ? "%s%s%d-%d" : "%s%s%d", layers, *layers ? ", " : "", lo + i,
                        lo + e);
      }
      name[j] = hparam_named(n, format("%s_%d", attr, ++k), v[j],
                             format("%s for l = %s", note, layers), 0, ctype, 0);
    } else name[j] = name[f];
    table = format("%s%s&%s", table, j ? ", " : "", name[j]);
  }
  xfree(v), xfree(name);
  return by_l(hparam_named(n, attr, table, format("%s, by layer", note), 0,
                           format("%s *const", ctype), count), lo);
}
