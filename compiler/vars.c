// Variables: a layer's weights with their initializers, regularizers and
// constraints, and the penalties the regularizers add to the loss.
//
// new_var makes a variable (a PARAM node) once per path, so that a layer
// called twice shares its weights; its layout comes from the LayoutMap now,
// so that a bad layout is reported with the variable's global shape at hand.
// Options sit beside the initializer Keras reads them from ("kernel_initializer"
// -> "kernel_regularizer", "kernel_constraint"). Below them, what every layer
// builder reads of its layer (its activation, its inputs, options it must
// not set) and the DOT they all make: the builder files (layers*.c) call
// down to here and never into each other's families.
#include "graph_build.h"
#include "../runtime/kdrt_round.h" // issue 23: a 16-bit penalty's l1, l2

#include <float.h>
#include <math.h>
#include <string.h>

// ---- variables and initializers

typedef struct {
  const char *name;
  int kind;
} InitName;

// Keras initializer names (class and snake case) -> kdrt_init_kind order.
static const InitName init_names[] = {
  {"Zeros", 0}, {"zeros", 0}, {"Ones", 1}, {"ones", 1}, {"Constant", 2}, {"constant", 2},
  {"GlorotUniform", 3}, {"glorot_uniform", 3}, {"GlorotNormal", 4}, {"glorot_normal", 4},
  {"HeUniform", 5}, {"he_uniform", 5}, {"HeNormal", 6}, {"he_normal", 6},
  {"LecunUniform", 7}, {"lecun_uniform", 7}, {"LecunNormal", 8}, {"lecun_normal", 8},
  {"RandomNormal", 9}, {"random_normal", 9}, {"RandomUniform", 10}, {"random_uniform", 10},
  {"TruncatedNormal", 11}, {"truncated_normal", 11},
  {"uniform", 10}, {"normal", 9}, // Keras's aliases (Embedding's default is "uniform")
  {"Orthogonal", KDRT_INIT_ORTHOGONAL}, {"orthogonal", KDRT_INIT_ORTHOGONAL}, // issue 11
};

static void parse_init(Layer *l, const char *key, const char *def, Var *v) {
  json_t *j = json_object_get(l->cfg, key);
  const char *name = def;
  json_t *cfg = NULL;
  if (json_is_string(j)) name = json_string_value(j);
  else if (json_is_object(j)) {
    json_t *cn = json_object_get(j, "class_name");
    if (!json_is_string(cn))
      error_at(jloc(j), "layer '%s': '%s' has no class_name", l->name, key);
    name = json_string_value(cn);
    cfg = json_object_get(j, "config");
  } else if (j && !json_is_null(j))
    error_at(jloc_key(l->cfg, key), "layer '%s': '%s' must be a string or an initializer",
             l->name, key);
  v->init = -1;
  for (size_t i = 0; i < sizeof init_names / sizeof init_names[0]; i++)
    if (!strcmp(init_names[i].name, name)) v->init = init_names[i].kind;
  if (v->init < 0)
    error_at(j ? jloc(j) : l->loc, "layer '%s': unknown initializer '%s' for '%s'", l->name,
             name, v->path);
  double a = 0, b = 0;
  json_t *x;
  switch (v->init) {
  case 2: a = (x = json_object_get(cfg, "value")) ? json_number_value(x) : 0; break;
  case 9: case 11:
    a = (x = json_object_get(cfg, "mean")) ? json_number_value(x) : 0;
    b = (x = json_object_get(cfg, "stddev")) ? json_number_value(x) : 0.05;
    break;
  case 10:
    a = (x = json_object_get(cfg, "minval")) ? json_number_value(x) : -0.05;
    b = (x = json_object_get(cfg, "maxval")) ? json_number_value(x) : 0.05;
    break;
  case KDRT_INIT_ORTHOGONAL: a = (x = json_object_get(cfg, "gain")) ? json_number_value(x) : 1; break;
  }
  if (fabs(a) > FLT_MAX || fabs(b) > FLT_MAX) // float literals of the program
    error_at(j ? jloc(j) : l->loc, "layer '%s': initializer '%s' of '%s' has a parameter beyond "
             "float32's range", l->name, name, v->path);
  v->p0 = a;
  v->p1 = b;
  // Keras's compute_fans
  const Shape *s = &v->shape;
  if (s->rank == 0) v->fan_in = v->fan_out = 1; // a scalar (Normalization's count)
  else if (s->rank == 1) v->fan_in = v->fan_out = s->d[0];
  else if (s->rank == 2) v->fan_in = s->d[0], v->fan_out = s->d[1];
  else {
    double rf = 1;
    for (int i = 0; i + 2 < s->rank; i++) rf *= s->d[i];
    v->fan_in = s->d[s->rank - 2] * rf;
    v->fan_out = s->d[s->rank - 1] * rf;
  }
}

// ---- issue 11: regularizers
// A variable's regularizer sits beside its initializer: "kernel_initializer"
// -> "kernel_regularizer". Keras accepts a class envelope (L1, L2, L1L2 with
// their config) or a name (its class's defaults: L1 and L2 0.01, L1L2 none).
static double reg_factor(Layer *l, json_t *cfg, const char *key, double def) {
  json_t *x = json_object_get(cfg, key);
  if (!x || json_is_null(x)) return def;
  if (!json_is_number(x) || !isfinite(json_number_value(x)) ||
      fabs(json_number_value(x)) > FLT_MAX)
    error_at(jloc(x), "layer '%s': '%s' must be a finite number", l->name, key);
  return json_number_value(x);
}

// Layer option `key`'s factors into *l1 and *l2 (untouched when it is absent).
// Layer option `key` given as Keras gives a regularizer or a constraint: a
// name, or a class envelope whose config goes to *cfg (NULL for a name).
// NULL when absent; `what` names the kind in the error for anything else.
static const char *option_class(Layer *l, const char *key, const char *what, json_t **j,
                                json_t **cfg) {
  *j = json_object_get(l->cfg, key);
  *cfg = NULL;
  if (!*j || json_is_null(*j)) return NULL;
  if (json_is_string(*j)) return json_string_value(*j);
  if (!json_is_object(*j))
    error_at(jloc(*j), "layer '%s': '%s' must be a string or a %s", l->name, key, what);
  json_t *cn = json_object_get(*j, "class_name");
  if (!json_is_string(cn)) error_at(jloc(*j), "layer '%s': '%s' has no class_name", l->name, key);
  *cfg = json_object_get(*j, "config");
  return json_string_value(cn);
}

static void parse_regularizer(Layer *l, const char *key, double *l1, double *l2) {
  json_t *j, *cfg;
  const char *cls = option_class(l, key, "regularizer", &j, &cfg);
  if (!cls) return;
  if (!strcmp(cls, "L1") || !strcmp(cls, "l1")) {
    *l1 = reg_factor(l, cfg, "l1", 0.01);
  } else if (!strcmp(cls, "L2") || !strcmp(cls, "l2")) {
    *l2 = reg_factor(l, cfg, "l2", 0.01);
  } else if (!strcmp(cls, "L1L2") || !strcmp(cls, "l1_l2") || !strcmp(cls, "l1l2")) {
    *l1 = reg_factor(l, cfg, "l1", 0);
    *l2 = reg_factor(l, cfg, "l2", 0);
  } else {
    error_at(jloc(j), "layer '%s': regularizer '%s' of '%s' is not supported (only L1, L2 and "
             "L1L2)", l->name, cls, key);
  }
}

// ---- issue 11: constraints
// Keras's NonNeg, MaxNorm(max_value=2, axis=0), UnitNorm(axis=0) and
// MinMaxNorm(min_value=0, max_value=1, rate=1, axis=0), as an envelope or
// by name (the class's defaults). The axis: an int or a list, negative from
// the end.
static void parse_constraint_axes(Layer *l, json_t *cfg, const char *key, Var *v) {
  json_t *a = json_object_get(cfg, "axis");
  int r = v->shape.rank;
  v->c_axes = a && !json_is_null(a) ? 0 : 1;
  size_t n = json_is_array(a) ? json_array_size(a) : a && !json_is_null(a) ? 1 : 0;
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_is_array(a) ? json_array_get(a, i) : a;
    int64_t d = json_is_integer(e) ? json_integer_value(e) : INT64_MAX;
    if (d < 0 && d >= -r) d += r;
    if (d < 0 || d >= r)
      error_at(jloc(e), "layer '%s': '%s' axis must be integers in [-%d, %d) for '%s' of rank %d",
               l->name, key, r, r, v->path, r);
    v->c_axes |= 1u << d;
  }
}

static void parse_constraint(Layer *l, const char *key, Var *v) {
  json_t *j, *cfg;
  const char *cls = option_class(l, key, "constraint", &j, &cfg);
  if (!cls) return;
  v->constraint = CONS_NORM;
  if (!strcmp(cls, "NonNeg") || !strcmp(cls, "non_neg")) {
    v->constraint = CONS_NON_NEG;
    return;
  } else if (!strcmp(cls, "MaxNorm") || !strcmp(cls, "max_norm")) {
    v->clip = (ClipAttr){.lo = 0, .hi = (float)reg_factor(l, cfg, "max_value", 2), .rate = 1};
  } else if (!strcmp(cls, "UnitNorm") || !strcmp(cls, "unit_norm")) {
    // (float32: MinMaxNorm(1, 1)'s; issue 23: in 16 bits w / (epsilon + norms), rounded so)
    v->clip = (ClipAttr){.lo = 1, .hi = 1, .rate = 1, .unit = true};
  } else if (!strcmp(cls, "MinMaxNorm") || !strcmp(cls, "min_max_norm")) {
    v->clip = (ClipAttr){.lo = (float)reg_factor(l, cfg, "min_value", 0),
                         .hi = (float)reg_factor(l, cfg, "max_value", 1),
                         .rate = reg_factor(l, cfg, "rate", 1)};
  } else {
    error_at(jloc(j), "layer '%s': constraint '%s' of '%s' is not supported (only NonNeg, "
             "MaxNorm, UnitNorm and MinMaxNorm)", l->name, cls, key);
  }
  parse_constraint_axes(l, cfg, key, v);
}

// A variable's regularizer and constraint: the options beside its
// initializer ("kernel_initializer": "kernel_regularizer", "kernel_constraint").
static void parse_var_options(Layer *l, const char *init_key, Var *v) {
  const char *suffix = strstr(init_key, "_initializer");
  if (!suffix || suffix[strlen("_initializer")]) return; // a variable with no such options
  int stem = (int)(suffix - init_key);
  parse_regularizer(l, format("%.*s_regularizer", stem, init_key), &v->l1, &v->l2);
  parse_constraint(l, format("%.*s_constraint", stem, init_key), v);
}

// Keras's penalty of a regularized tensor, in graph ops: l1 * sum(|x|) +
// l2 * sum(x * x), or NULL. A split dim of x contracts in its sum, so a
// sharded kernel's penalty is a partial sum that the lattice all-reduces,
// and its gradient (l1 * sign(x) + 2 * l2 * x) comes from the ops' rules.
//
// issue 23: a variable kept in 16 bits is penalised in its dtype, as
// Keras's regularizers compute (regularizers.py: l1 and l2 cast to x.dtype,
// 0 + l1 * sum(|x|) + l2 * sum(x^2) in that dtype; jnp.sum adds 16-bit
// values in float32 and rounds the sum): every square, sum, product and the
// sum of the two rounded (r16). The penalty reads x through a ROUND of its
// own, so that its gradient (2 * l2 * x rounded, plus l1 * sign(x), rounded:
// JAX's cotangents of x in its dtype) is rounded before the layer's
// gradient is added to it; the penalty itself, a 16-bit value, is added to
// the float32 loss (tests/sh/opt16.sh: Keras's bit for bit). k: the 16-bit
// type x is of (KDRT_ROUND_*), 0 for float32: a variable's dtype, or the
// layer's compute dtype for its output's penalty (activity_penalty).
static Node *r16(Graph *g, Node *x, int kind) {
  if (!kind) return x;
  Node *r = make1(g, OP_ROUND, x, .rnd.kind = kind);
  r->half = (uint8_t)kind;
  return r;
}

Node *penalty(Graph *g, Node *x, double l1, double l2, int k) {
  Node *p1 = NULL, *p2 = NULL;
  if (k && (l1 != 0 || l2 != 0)) x = r16(g, x, k);
  if (k) l1 = kdrt_round_to(k, (float)l1), l2 = kdrt_round_to(k, (float)l2);
  if (l1 != 0) {
    Node *a = make1(g, OP_ACT, x, .act.kind = KDRT_ACT_ABS);
    p1 = r16(g, scaled(g, r16(g, sum_all(g, a), k), l1), k);
  }
  if (l2 != 0) { // (read again: the square's gradient is rounded before the l1 one is added)
    Node *x2 = r16(g, x, k);
    p2 = r16(g, scaled(g, r16(g, sum_all(g, r16(g, make2(g, OP_MUL, x2, x2), k)), k), l2), k);
  }
  return p1 && p2 ? r16(g, make2(g, OP_ADD, p1, p2), k) : p1 ? p1 : p2;
}

// g->penalty += p: the regularizers' penalties, summed as Keras sums
// model.losses into the loss.
void add_penalty(Graph *g, Node *p) {
  if (!p) return;
  g->penalty = g->penalty ? make2(g, OP_ADD, g->penalty, p) : p;
  g->penalty->name = "regularization";
}

// A layer's activity_regularizer: the penalty of its output divided by
// the step's global batch (BATCH_MEAN), added at each call, as Keras does.
// issue 23: under a 16-bit policy (mixed or not) the output is of the
// compute dtype k, and so is Keras's penalty (Layer.__call__): the
// regularizer's ops rounded as a variable's (penalty), then divide_no_nan
// by the batch size cast to k, rounded; the 16-bit value is added to the
// float32 loss (_aggregate_additional_loss casts no float; the sum of the
// losses promotes it). Keras's eager run, rounding point for rounding
// point; its jit run (fit's) keeps bfloat16's squares in float32 and
// multiplies float16's penalty by the rounded reciprocal of the batch.
void batch_penalty(Graph *g, Node *y, double l1, double l2, int k) {
  Node *p = penalty(g, y, l1, l2, k);
  if (!p) return;
  Node *m = k ? make1(g, OP_BATCH_MEAN16, p, .rnd.kind = k)
              : make1(g, OP_BATCH_MEAN, p, .aff = (AffAttr){1, 0, NULL});
  add_penalty(g, r16(g, m, k));
}

void activity_penalty(Graph *g, Layer *l, Node *y) {
  double l1 = 0, l2 = 0;
  parse_regularizer(l, "activity_regularizer", &l1, &l2);
  batch_penalty(g, y, l1, l2, l->cdt);
}

// Where Keras's weights file keeps a layer's variable "<sub>/<name>":
// attention layers save their projections as sublayers, under attribute
// names that differ from the variables' path names.
const char *weights_sublayer(const char *cls, const char *vname) {
  static const char *const map[][3] = {
    {"MultiHeadAttention", "query", "query_dense"},
    {"MultiHeadAttention", "key", "key_dense"},
    {"MultiHeadAttention", "value", "value_dense"},
    {"MultiHeadAttention", "attention_output", "output_dense"},
    {"GroupedQueryAttention", "query", "_query_dense"},
    {"GroupedQueryAttention", "key", "_key_dense"},
    {"GroupedQueryAttention", "value", "_value_dense"},
    {"GroupedQueryAttention", "attention_output", "_output_dense"},
    {"GroupQueryAttention", "query", "_query_dense"},
    {"GroupQueryAttention", "key", "_key_dense"},
    {"GroupQueryAttention", "value", "_value_dense"},
    {"GroupQueryAttention", "attention_output", "_output_dense"},
  };
  const char *slash = strchr(vname, '/');
  if (!slash) return NULL;
  // issue 11: a recurrent layer's cell (a Bidirectional's layers say theirs)
  if (!strcmp(cls, "SimpleRNN") || !strcmp(cls, "LSTM") || !strcmp(cls, "GRU")) return "cell";
  for (size_t i = 0; i < sizeof map / sizeof *map; i++)
    if (!strcmp(map[i][0], cls) && strlen(map[i][1]) == (size_t)(slash - vname) &&
        !strncmp(map[i][1], vname, (size_t)(slash - vname)))
      return map[i][2];
  unreachable();
}

// Keras's `trainable: false` (the flag Layer.get_config writes; for a
// Bidirectional, its wrapped layers'): a frozen layer's variables
// are not trained (Var.frozen) and its BatchNormalization runs as in
// inference (`training and self.trainable`).
bool layer_frozen(Layer *l) { return l->frozen || !cfg_bool(l, "trainable", true); }

Node *new_var(Graph *g, Layer *l, const char *vname, Shape shape, const char *init_key,
              const char *init_def) {
  const char *path = format("%s/%s", l->path, vname);
  for (int i = 0; i < g->nvars; i++)
    if (!strcmp(g->vars[i]->path, path)) {
      // Keras names a nested Functional model's variables by their layers
      // alone, so two layers may give one path, which nothing could tell apart
      if (strcmp(g->vars[i]->layer, l->name) || !(l->shared || l->ncalls > 1))
        error_at(l->loc, "layer '%s': variable path '%s' is also layer '%s''s (a nested "
                 "Functional model's variables are named by their layers alone); rename one of "
                 "the layers", l->name, path, g->vars[i]->layer);
      // a layer called again: the variable its first built call made
      if (!shape_eq(&g->vars[i]->shape, &shape))
        error_at(l->loc, "layer '%s': call %d needs '%s' of shape %s, but another call made "
                 "it %s", l->name, l->call, vname, shape_str(&shape),
                 shape_str(&g->vars[i]->shape));
      return g->vars[i]->param;
    }
  Var *v = xcalloc(1, sizeof *v);
  v->path = path;
  v->vname = vname;
  v->layer = l->name;
  // the class's own name, which Keras's weights file groups by (the JSON may
  // hold its export alias)
  v->layer_class = strcmp(l->cls, "GroupQueryAttention") ? l->cls : "GroupedQueryAttention";
  v->sub = l->sub ? l->sub : weights_sublayer(l->cls, vname);
  v->scope = l->scope;
  v->group = l->group;
  for (int i = 0; i < g->nvars; i++) // LoRA's A and B are not in the weights file
    v->index += !g->vars[i]->lora_part && !strcmp(g->vars[i]->layer, l->name) &&
                (v->sub ? g->vars[i]->sub && !strcmp(g->vars[i]->sub, v->sub) : !g->vars[i]->sub);
  v->loc = l->loc;
  v->shape = shape;
  v->frozen = layer_frozen(l);
  v->vdt = l->vdt; // issue 23: a 16-bit policy's variables (ops.c's update_emit)
  if (v->vdt) v->file_dtype = v->vdt == KDRT_ROUND_BF16 ? KDRT_BF16 : KDRT_F16;
  parse_init(l, init_key, init_def, v);
  parse_var_options(l, init_key, v); // (a 16-bit one's regularizer: penalty; constraint: autodiff.c)
  v->matched = dist_lookup(g->dist, v->path, l->name, shape.rank, shape.d, &v->place);
  Node *n = new_node(g, OP_PARAM, 0, NULL);
  n->shape = shape;
  n->name = v->path;
  n->layer = l->name;
  n->loc = l->loc;
  n->var = v;
  n->has_want = true;
  n->want = v->place;
  v->param = n;
  g->vars = xgrow(g->vars, g->nvars, &g->cap_vars, sizeof *g->vars);
  g->vars[g->nvars++] = v;
  return n;
}

Node *lora_kernel(Graph *g, Layer *l, Node *w, const char *prefix, int64_t rank, double alpha,
                  int index) {
  Shape sa = w->shape, sb = {2, {rank, w->shape.d[w->shape.rank - 1]}};
  sa.d[sa.rank - 1] = rank;
  Node *a = new_var(g, l, format("%slora_kernel_a", prefix), sa, "-", "he_uniform");
  a->var->lora_part = true;
  Node *b = new_var(g, l, format("%slora_kernel_b", prefix), sb, "-", "zeros");
  b->var->lora_part = true;
  a->var->frozen = b->var->frozen = false;
  w->var->frozen = true;
  w->var->lora_a = a->var, w->var->lora_b = b->var;
  w->var->lora_scale = (float)(alpha / (double)rank);
  w->var->lora_index = index;
  // issue 23: Keras's enable_lora makes A and B float32 whatever the
  // policy, and under a bfloat16 (float16) one, whose layers enter no
  // autocast scope, reads them so: the merge in float32, rounded once at
  // the layer's product. (A mixed policy's scope casts them when read: each
  // op of the merge in 16 bits, as new_node rounds.)
  int cdt = g->cdt;
  if (l->vdt) {
    a->var->vdt = b->var->vdt = 0;
    a->var->file_dtype = b->var->file_dtype = KDRT_F32;
    g->cdt = 0;
  }
  // Keras: kernel + (alpha / rank) * matmul(a, b), then the layer's product
  Node *ab = dot_node(g, a, b, 0, 1, false);
  Node *s = make1(g, OP_SCALE, ab, .aff = (AffAttr){w->var->lora_scale, 0, NULL});
  Node *merged = make2(g, OP_ADD, w, s);
  g->cdt = cdt;
  return merged;
}

int64_t lora_rank_of(Layer *l, const char *name, double *alpha, int *index) {
  json_t *lo = json_object_get(l->cfg, "kdcc_lora");
  if (!json_is_object(lo)) return 0;
  json_t *targets = json_object_get(lo, "targets");
  if (name) {
    bool hit = false;
    for (size_t i = 0; i < json_array_size(targets); i++)
      hit |= !strcmp(json_string_value(json_array_get(targets, i)), name);
    if (!hit) return 0;
  }
  int64_t r = json_integer_value(json_object_get(lo, "rank"));
  json_t *ix = json_object_get(lo, "index");
  *index = (int)json_integer_value(name ? json_object_get(ix, name) : ix);
  *alpha = json_is_number(json_object_get(lo, "alpha"))
           ? json_number_value(json_object_get(lo, "alpha")) : (double)r;
  return r;
}

// ---- what every layer builder reads of its layer

// An activation by name ("gelu" is the exact erf form, as in Keras), or
// keras_hub's registered function gelu_approximate (gelu(x, approximate=True)),
// which a config holds as {"class_name": "function", "config":
// "keras_hub>gelu_approximate"} (keras_nlp> in older files).
int parse_act(Layer *l, const char *key) {
  json_t *j = json_object_get(l->cfg, key);
  if (!j || json_is_null(j)) return ACT_LINEAR;
  json_t *fn = json_is_object(j) ? json_object_get(j, "config") : NULL;
  if (json_is_string(fn) && json_is_string(json_object_get(j, "class_name")) &&
      !strcmp(json_string_value(json_object_get(j, "class_name")), "function"))
    j = fn;
  if (!json_is_string(j))
    error_at(jloc_key(l->cfg, key), "layer '%s': only named activations are supported", l->name);
  const char *s = json_string_value(j);
  if (!strcmp(s, "keras_hub>gelu_approximate") || !strcmp(s, "keras_nlp>gelu_approximate"))
    return KDRT_ACT_GELU_TANH;
  for (int a = 0; a < ACT_COUNT; a++) // rsqrt, abs and sqrt are kdcc's own, not Keras's
    if (a != KDRT_ACT_RSQRT && a != KDRT_ACT_ABS && a != KDRT_ACT_SQRT && !strcmp(s, act_name(a)))
      return a;
  if (!strcmp(s, "swish")) return ACT_SILU;
  if (!strcmp(s, "hard_swish")) return KDRT_ACT_HARD_SILU; // issue 11
  error_at(jloc(j), "layer '%s': unknown activation '%s'", l->name, s);
}

Node *apply_act(Graph *g, Node *x, int act) {
  if (act == ACT_LINEAR) return x;
  static const OpKind op_of[] = {
#define ACT_OP(name, kname) [ACT_##name - KDRT_ACT_COUNT] = OP_##name,
#include "../runtime/kdrt_ops.def"
  };
  if (act < KDRT_ACT_COUNT) return make1(g, OP_ACT, x, .act.kind = act);
  // an op of its own may refuse x's shape (glu: an odd last dim)
  OpKind op = op_of[act - KDRT_ACT_COUNT];
  Shape s;
  if (!op_info(op).shape(&(Node){.op = op, .nin = 1, .in = {x}}, &s))
    error_at(x->loc, "layer '%s': activation '%s' does not apply to a value of shape %s",
             x->layer ? x->layer : "?", act_name(act), shape_str(&x->shape));
  return make1(g, op, x);
}

Node *layer_input(Layer *l, int i) {
  Node *n = l->in[i].layer->node;
  if (!n) error_at(l->in[i].loc, "layer '%s': input '%s' has no value", l->name,
                   l->in[i].layer->name);
  bool ids = !strcmp(l->cls, "Embedding") || !strcmp(l->cls, "ReversibleEmbedding") ||
             (l->mask && i == l->mask); // an attention_mask may be int32
  if (n->dtype != DT_F32 && !ids)
    error_at(l->in[i].loc, "layer '%s': %s takes float input, but '%s' holds integer ids "
             "(only Embedding takes integer input)", l->name, l->cls, l->in[i].layer->name);
  return n;
}

// The one normalized axis a LayerNormalization / RMSNormalization allows: the last.
void check_last_axis(Layer *l, const Node *x) {
  json_t *a = json_object_get(l->cfg, "axis");
  int64_t axis = -1;
  if (json_is_array(a) && json_array_size(a) == 1) axis = json_integer_value(json_array_get(a, 0));
  else if (json_is_integer(a)) axis = json_integer_value(a);
  else if (a && !json_is_null(a))
    error_at(jloc(a), "layer '%s': only the last axis can be normalized", l->name);
  if (axis != -1 && axis != x->shape.rank - 1)
    error_at(jloc(a), "layer '%s': only the last axis can be normalized (got axis %lld)", l->name,
             (long long)axis);
}

void check_none(Layer *l, const char *const *keys, int n) {
  for (int i = 0; i < n; i++) {
    json_t *u = json_object_get(l->cfg, keys[i]);
    if (u && !json_is_null(u) && !json_is_false(u))
      error_at(jloc_key(l->cfg, keys[i]), "layer '%s': '%s' is not supported", l->name, keys[i]);
  }
}

Node *dot_node(Graph *g, Node *a, Node *b, int nb, int nk, bool tb) {
  return make2(g, OP_DOT, a, b, .dot = {.nb = nb, .nk = nk, .tb = tb});
}
