// Graph building: layers -> the forward graph, the loss and the metric.
//
// Each Keras layer becomes a few ops of the op table (ops.c) on global
// shapes; shapes are inferred here, as the nodes are made, and every shape
// that does not fit is reported at the layer that caused it. Variables get
// their layout from the LayoutMap now, so that a bad layout is reported with
// the variable's global shape at hand; `<layer>/output` keys become fixed
// placements (constraints) on the layer's output node.
//
// Invariants: g->nodes is in topological order; nothing computes here.
#include "kdcc.h"
#include "../runtime/kdrt_rnn.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
static char *kshape(const Shape *s) {
  char *b = "(None";
  for (int i = 1; i < s->rank; i++) b = format("%s, %lld", b, (long long)s->d[i]);
  return format("%s%s", b, s->rank == 1 ? ",)" : ")");
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
  if (s->rank == 1) v->fan_in = v->fan_out = s->d[0];
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
    v->clip = (ClipAttr){0, (float)reg_factor(l, cfg, "max_value", 2), 1};
  } else if (!strcmp(cls, "UnitNorm") || !strcmp(cls, "unit_norm")) {
    v->clip = (ClipAttr){1, 1, 1};
  } else if (!strcmp(cls, "MinMaxNorm") || !strcmp(cls, "min_max_norm")) {
    v->clip = (ClipAttr){(float)reg_factor(l, cfg, "min_value", 0),
                         (float)reg_factor(l, cfg, "max_value", 1), reg_factor(l, cfg, "rate", 1)};
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

static Node *scaled(Graph *g, Node *x, double k) {
  Node *y = new_node1(g, OP_SCALE, x, x->shape);
  y->aff = (AffAttr){(float)k, 0};
  return y;
}

// Keras's penalty of a regularized tensor, in graph ops: l1 * sum(|x|) +
// l2 * sum(x * x), or NULL. A split dim of x contracts in its sum, so a
// sharded kernel's penalty is a partial sum that the lattice all-reduces,
// and its gradient (l1 * sign(x) + 2 * l2 * x) comes from the ops' rules.
static Node *penalty(Graph *g, Node *x, double l1, double l2) {
  Node *p1 = NULL, *p2 = NULL;
  if (l1 != 0) {
    Node *a = new_node1(g, OP_ACT, x, x->shape);
    a->act.kind = KDRT_ACT_ABS;
    p1 = scaled(g, sum_all(g, a), l1);
  }
  if (l2 != 0) p2 = scaled(g, sum_all(g, new_node2(g, OP_MUL, x, x, x->shape)), l2);
  return p1 && p2 ? new_node2(g, OP_ADD, p1, p2, (Shape){0}) : p1 ? p1 : p2;
}

// g->penalty += p: the regularizers' penalties, summed as Keras sums
// model.losses into the loss.
static void add_penalty(Graph *g, Node *p) {
  if (!p) return;
  g->penalty = g->penalty ? new_node2(g, OP_ADD, g->penalty, p, (Shape){0}) : p;
  g->penalty->name = "regularization";
}

// A layer's activity_regularizer: the penalty of its output divided by
// the step's global batch (BATCH_MEAN), added at each call, as Keras does.
static void batch_penalty(Graph *g, Node *y, double l1, double l2) {
  Node *p = penalty(g, y, l1, l2);
  if (!p) return;
  Node *m = new_node1(g, OP_BATCH_MEAN, p, p->shape);
  m->aff = (AffAttr){1, 0};
  add_penalty(g, m);
}

static void activity_penalty(Graph *g, Layer *l, Node *y) {
  double l1 = 0, l2 = 0;
  parse_regularizer(l, "activity_regularizer", &l1, &l2);
  batch_penalty(g, y, l1, l2);
}

// Where Keras's weights file keeps a layer's variable "<sub>/<name>":
// attention layers save their projections as sublayers, under attribute
// names that differ from the variables' path names.
static const char *weights_sublayer(const char *cls, const char *vname) {
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
static bool layer_frozen(Layer *l) { return l->frozen || !cfg_bool(l, "trainable", true); }

static Node *new_var(Graph *g, Layer *l, const char *vname, Shape shape, const char *init_key,
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
  for (int i = 0; i < g->nvars; i++)
    v->index += !strcmp(g->vars[i]->layer, l->name) &&
                (v->sub ? g->vars[i]->sub && !strcmp(g->vars[i]->sub, v->sub) : !g->vars[i]->sub);
  v->loc = l->loc;
  v->shape = shape;
  v->frozen = layer_frozen(l);
  parse_init(l, init_key, init_def, v);
  parse_var_options(l, init_key, v);
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

// ---- layers

// An activation by name ("gelu" is the exact erf form, as in Keras), or
// keras_hub's registered function gelu_approximate (gelu(x, approximate=True)),
// which a config holds as {"class_name": "function", "config":
// "keras_hub>gelu_approximate"} (keras_nlp> in older files).
static int parse_act(Layer *l, const char *key) {
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
  for (int a = 0; a <= ACT_SOFTMAX; a++) // rsqrt and abs are kdcc's own, not Keras's
    if (a != KDRT_ACT_RSQRT && a != KDRT_ACT_ABS && !strcmp(s, act_name(a))) return a;
  if (!strcmp(s, "swish")) return ACT_SILU;
  if (!strcmp(s, "hard_swish")) return KDRT_ACT_HARD_SILU; // issue 11
  error_at(jloc(j), "layer '%s': unknown activation '%s'", l->name, s);
}

static Node *apply_act(Graph *g, Node *x, int act) {
  if (act == ACT_LINEAR) return x;
  if (act == ACT_SOFTMAX) return new_node1(g, OP_SOFTMAX, x, x->shape);
  Node *n = new_node1(g, OP_ACT, x, x->shape);
  n->act.kind = act;
  return n;
}

static Node *layer_input(Layer *l, int i) {
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

static Node *build_dense(Graph *g, Layer *l, Node *x) {
  int64_t units = cfg_size(l, "units", -1);
  if (units <= 0) error_at(jloc_key(l->cfg, "units"), "layer '%s': 'units' must be positive",
                           l->name);
  if (x->shape.rank < 2)
    error_at(l->loc, "layer '%s': Dense needs an input of rank 2 or more, got %s", l->name,
             kshape(&x->shape));
  int64_t k = x->shape.d[x->shape.rank - 1];
  if (size_mul(k, units) > MAX_ELEMS)
    error_at(jloc_key(l->cfg, "units"), "layer '%s': a kernel of [%lld, %lld] would hold more "
             "than 2^40 elements, the most a tensor may hold", l->name, (long long)k,
             (long long)units);
  Shape out = x->shape;
  out.d[out.rank - 1] = units;
  Node *w = new_var(g, l, "kernel", (Shape){2, {k, units}}, "kernel_initializer",
                    "glorot_uniform");
  // x[.., k] . w[k, units]: every leading dim of x is a free dim
  Node *y = new_node2(g, OP_DOT, x, w, out);
  y->dot = (DotAttr){.nb = 0, .nk = 1};
  y->layer = l->name;
  y->loc = l->loc;
  if (cfg_bool(l, "use_bias", true)) {
    Node *b = new_var(g, l, "bias", (Shape){1, {units}}, "bias_initializer", "zeros");
    y = new_node2(g, OP_BIAS, y, b, y->shape);
  }
  return apply_act(g, y, parse_act(l, "activation"));
}

// ---- normalization and attention

// The one normalized axis a LayerNormalization / RMSNormalization allows: the last.
static void check_last_axis(Layer *l, const Node *x) {
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

static void check_none(Layer *l, const char *const *keys, int n) {
  for (int i = 0; i < n; i++) {
    json_t *u = json_object_get(l->cfg, keys[i]);
    if (u && !json_is_null(u) && !json_is_false(u))
      error_at(jloc_key(l->cfg, keys[i]), "layer '%s': '%s' is not supported", l->name, keys[i]);
  }
}

static Node *view(Graph *g, Node *x, Shape s);
static Node *to_last(Graph *g, Node *x, unsigned axes, Shape *moved);
static Node *from_last(Graph *g, Node *y, unsigned axes, const Shape *moved, const Shape *orig);
static unsigned cfg_axes(Layer *l, const Node *x, const char *key, int lo);

// LayerNormalization: (x - mean) / sqrt(var + epsilon) over its axes, then
// * gamma and + beta (scale, center); rms_scaling: x / rms * gamma. Axes
// other than the last alone (issue 11) are moved to the end and merged
// into one, where NORM works, and moved back after gamma and beta.
static Node *build_layernorm(Graph *g, Layer *l, Node *x) {
  unsigned axes = cfg_axes(l, x, "axis", 1);
  Shape moved;
  Node *xm = to_last(g, x, axes, &moved);
  int k = __builtin_popcount(axes);
  Shape gs = {k, {0}};
  for (int i = 0; i < k; i++) gs.d[i] = moved.d[moved.rank - k + i];
  bool rms = cfg_bool(l, "rms_scaling", false);
  Node *y = new_node1(g, OP_NORM, xm, xm->shape);
  y->norm = (NormAttr){rms, (float)cfg_num(l, "epsilon", 1e-3)};
  if (k > 1) y = view(g, y, moved);
  if (cfg_bool(l, "scale", true) || rms) {
    Node *gam = new_var(g, l, "gamma", gs, "gamma_initializer", "ones");
    y = new_node2(g, OP_COL_MUL, y, gam, moved);
  }
  if (cfg_bool(l, "center", true) && !rms) {
    Node *beta = new_var(g, l, "beta", gs, "beta_initializer", "zeros");
    y = new_node2(g, OP_BIAS, y, beta, moved);
  }
  return from_last(g, y, axes, &moved, &x->shape);
}

// RMSNormalization: x / sqrt(mean(x^2) + epsilon) * scale, the last axis.
static Node *build_rmsnorm(Graph *g, Layer *l, Node *x) {
  check_last_axis(l, x);
  int64_t h = x->shape.d[x->shape.rank - 1];
  Node *y = new_node1(g, OP_NORM, x, x->shape);
  y->norm = (NormAttr){true, (float)cfg_num(l, "epsilon", 1e-6)};
  Node *scale = new_var(g, l, "scale", (Shape){1, {h}}, "-", "ones");
  return new_node2(g, OP_COL_MUL, y, scale, x->shape);
}

static Node *transpose_0213(Graph *g, Node *x) {
  Shape s = {4, {x->shape.d[0], x->shape.d[2], x->shape.d[1], x->shape.d[3]}};
  Node *t = new_node1(g, OP_TRANSPOSE, x, s);
  t->perm = (PermAttr){{0, 2, 1, 3}};
  return t;
}

static Node *dot_node(Graph *g, Node *a, Node *b, int nb, int nk, bool tb) {
  Shape s;
  if (!dot_shape(&a->shape, &b->shape, nb, nk, false, tb, &s)) unreachable();
  Node *n = new_node2(g, OP_DOT, a, b, s);
  n->dot = (DotAttr){.nb = nb, .nk = nk, .tb = tb};
  return n;
}

// Keras builds attention's projections as EinsumDense layers, whose
// kernels take their fans from the equation (einsum's input_axes and
// output_axes), not from the kernel's shape as a convolution's: the
// contracted dims in, the rest out.
static void einsum_fans(Node *w, double fan_in) {
  w->var->fan_in = fan_in;
  w->var->fan_out = (double)shape_elems(&w->shape) / fan_in;
}

// One projection of attention: x[b, t, h] . w[h, heads, dim] (+ bias[heads, dim]).
static Node *project(Graph *g, Layer *l, Node *x, const char *name, int64_t heads, int64_t dim,
                     bool bias) {
  int64_t h = x->shape.d[2];
  Node *w = new_var(g, l, format("%s/kernel", name), (Shape){3, {h, heads, dim}},
                    "kernel_initializer", "glorot_uniform");
  einsum_fans(w, (double)h);
  Node *y = dot_node(g, x, w, 0, 1, false);
  if (bias) {
    Node *b = new_var(g, l, format("%s/bias", name), (Shape){2, {heads, dim}}, "bias_initializer",
                      "zeros");
    y = new_node2(g, OP_BIAS, y, b, y->shape);
  }
  return y;
}

// A call keyword the layer reads: a boolean (false when absent).
static bool call_flag(Layer *l, const char *key) {
  json_t *v = l->kwargs ? json_object_get(l->kwargs, key) : NULL;
  if (!v || json_is_null(v)) return false;
  if (!json_is_boolean(v))
    error_at(jloc(v), "layer '%s': call argument '%s' must be true or false", l->name, key);
  return json_is_true(v);
}

// Every call keyword must be one the layer reads.
static void check_kwargs(Layer *l, const char *const *known, int n) {
  if (!l->kwargs) return;
  const char *k;
  json_t *v;
  json_object_foreach(l->kwargs, k, v) {
    bool ok = json_is_null(v);
    for (int i = 0; i < n; i++) ok |= !strcmp(k, known[i]);
    if (!strcmp(k, "return_attention_scores") && json_is_false(v)) ok = true;
    if (!ok)
      error_at(jloc_keyname(l->kwargs, k), "layer '%s': call argument '%s' is not supported",
               l->name, k);
  }
}

// The attention core of MultiHeadAttention and GroupQueryAttention, as
// JAX's dot_product_attention computes it: q[b, t, n, d], k, v[b, s, n, d]
// (kv heads already repeated) -> o[b, t, n, dv]. Scores q.k are scaled by
// 1 / sqrt(d), causally masked, softmaxed over the keys.
static Node *attend(Graph *g, Layer *l, Node *q, Node *k, Node *v, double scale, bool causal,
                    Node *mask, double dropout) {
  Node *qt = transpose_0213(g, q), *kt = transpose_0213(g, k), *vt = transpose_0213(g, v);
  Node *s = dot_node(g, qt, kt, 2, 1, true); // [b, n, t, s]
  Node *sc = new_node1(g, OP_SCALE, s, s->shape);
  sc->aff = (AffAttr){(float)scale, 0};
  s = sc;
  if (causal) {
    s = new_node1(g, OP_CAUSAL, s, s->shape);
    s->mask.fill = -1; // forward: KDRT_MASKED
  }
  if (mask) {
    s = new_node2(g, OP_ATTN_MASK, s, mask, s->shape);
    s->mask.fill = -1;
  }
  Node *p = apply_act(g, s, ACT_SOFTMAX);
  if (dropout > 0) {
    Node *dp = new_node1(g, OP_DROPOUT, p, p->shape);
    dp->drop = (DropAttr){(float)dropout, hash_str(format("%s/attention_dropout", l->path)), false};
    p = dp;
  }
  Node *o = dot_node(g, p, vt, 2, 1, false); // [b, n, t, dv]
  return transpose_0213(g, o);
}

// The call's attention_mask (issue 10), or NULL: [batch, query steps, key
// steps], int32 or float32, nonzero where a query may attend to a key, as
// Keras casts it to bool. Synthetic data fills an int32 mask with 0 and 1.
static Node *attention_mask_input(Layer *l, const Node *q, const Node *v) {
  if (!l->mask) return NULL;
  Node *m = layer_input(l, l->mask);
  Shape want = {3, {q->shape.d[0], q->shape.d[1], v->shape.d[1]}};
  if (!shape_eq(&m->shape, &want))
    error_at(l->in[l->mask].loc, "layer '%s': attention_mask must be (None, %lld, %lld) (query "
             "steps, key steps), got %s", l->name, (long long)want.d[1], (long long)want.d[2],
             kshape(&m->shape));
  if (m->op == OP_INPUT && m->dtype == DT_I32 && !m->id_range) m->id_range = 2;
  return m;
}

// An attention layer's call: query, value and (optionally) key tensors of
// rank 3, keys as long as values; use_causal_mask and attention_mask its
// keywords.
static void attention_inputs(Layer *l, Node **xq, Node **xv, Node **xk, Node **mask) {
  int nargs = l->mask ? l->mask : l->nin;
  if (nargs < 2 || nargs > 3)
    error_at(l->loc, "layer '%s': %s is called with query and value (and key), got %d tensors",
             l->name, l->cls, nargs);
  static const char *const kw[] = {"use_causal_mask", "attention_mask"};
  check_kwargs(l, kw, 2);
  for (int i = 0; i < nargs; i++)
    if (layer_input(l, i)->shape.rank != 3)
      error_at(l->in[i].loc, "layer '%s': attention inputs must be [batch, steps, features]",
               l->name);
  *xq = layer_input(l, 0), *xv = layer_input(l, 1), *xk = nargs > 2 ? layer_input(l, 2) : *xv;
  if ((*xk)->shape.d[1] != (*xv)->shape.d[1])
    error_at(l->loc, "layer '%s': key and value have different lengths", l->name);
  *mask = attention_mask_input(l, *xq, *xv);
}

// An attention layer's output projection: o[b, t, heads, dim] .
// attention_output/kernel[heads, dim, out] (+ attention_output/bias[out]).
static Node *attention_output(Graph *g, Layer *l, Node *o, int64_t out, bool bias) {
  Node *wo = new_var(g, l, "attention_output/kernel",
                     (Shape){3, {o->shape.d[2], o->shape.d[3], out}}, "kernel_initializer",
                     "glorot_uniform");
  einsum_fans(wo, (double)(o->shape.d[2] * o->shape.d[3]));
  Node *y = dot_node(g, o, wo, 0, 2, false);
  if (bias) {
    Node *bo = new_var(g, l, "attention_output/bias", (Shape){1, {out}}, "bias_initializer",
                       "zeros");
    y = new_node2(g, OP_BIAS, y, bo, y->shape);
  }
  return y;
}

// MultiHeadAttention(num_heads, key_dim, value_dim, use_bias, output_shape,
// dropout), called as (query, value[, key]) with use_causal_mask. Kernels
// as Keras stores them: query/key/value [hidden, heads, dim], the output
// [heads, dim, hidden].
static Node *build_mha(Graph *g, Layer *l, Node *unused) {
  Node *xq, *xv, *xk, *mask;
  attention_inputs(l, &xq, &xv, &xk, &mask);
  // attention over the steps only: attention_axes absent, or [1] as Keras writes it
  json_t *ax = json_object_get(l->cfg, "attention_axes");
  if (ax && !json_is_null(ax) &&
      !(json_is_array(ax) && json_array_size(ax) == 1 &&
        json_integer_value(json_array_get(ax, 0)) == 1) &&
      !(json_is_integer(ax) && json_integer_value(ax) == 1))
    error_at(jloc(ax), "layer '%s': attention_axes other than [1] (the steps) are not "
             "supported", l->name);
  int64_t heads = cfg_int(l, "num_heads", -1), kd = cfg_int(l, "key_dim", -1);
  int64_t vd = cfg_int(l, "value_dim", kd);
  if (heads <= 0) error_at(jloc_key(l->cfg, "num_heads"), "layer '%s': 'num_heads' must be "
                           "positive", l->name);
  if (kd <= 0) error_at(jloc_key(l->cfg, "key_dim"), "layer '%s': 'key_dim' must be positive",
                        l->name);
  if (vd <= 0) error_at(jloc_key(l->cfg, "value_dim"), "layer '%s': 'value_dim' must be "
                        "positive", l->name);
  int64_t out = xq->shape.d[2];
  json_t *os = json_object_get(l->cfg, "output_shape");
  if (os && !json_is_null(os)) {
    int64_t o[MAX_RANK];
    if (cfg_ints(l, "output_shape", o, MAX_RANK) != 1 || o[0] <= 0)
      error_at(jloc(os), "layer '%s': output_shape must be one positive size", l->name);
    out = o[0];
  }
  bool bias = cfg_bool(l, "use_bias", true);
  Node *q = project(g, l, xq, "query", heads, kd, bias);
  Node *k = project(g, l, xk, "key", heads, kd, bias);
  Node *v = project(g, l, xv, "value", heads, vd, bias);
  Node *o = attend(g, l, q, k, v, 1.0 / sqrt((double)kd), call_flag(l, "use_causal_mask"),
                   mask, cfg_num(l, "dropout", 0));
  return attention_output(g, l, o, out, bias);
}

// Each of kv's heads repeated r times, in place: [b, s, h, d] ->
// [b, s, h * r, d] (ops.repeat on axis 2), as a broadcast and a view.
static Node *repeat_heads(Graph *g, Node *kv, int64_t r) {
  if (r == 1) return kv;
  const Shape *s = &kv->shape;
  Node *b = new_node1(g, OP_BROADCAST, kv, (Shape){5, {s->d[0], s->d[1], s->d[2], r, s->d[3]}});
  b->red.dim = 3;
  return new_node1(g, OP_RESHAPE, b, (Shape){4, {s->d[0], s->d[1], s->d[2] * r, s->d[3]}});
}

// GroupedQueryAttention(head_dim, num_query_heads, num_key_value_heads,
// use_bias, dropout), called as (query, value[, key]) with use_causal_mask:
// key and value heads repeated to the query heads, then as MultiHeadAttention.
static Node *build_gqa(Graph *g, Layer *l, Node *unused) {
  Node *xq, *xv, *xk, *mask;
  attention_inputs(l, &xq, &xv, &xk, &mask);
  static const char *const no[] = {"sliding_window", "use_gate"};
  check_none(l, no, 2);
  int64_t hd = cfg_int(l, "head_dim", -1), nq = cfg_int(l, "num_query_heads", -1);
  int64_t nkv = cfg_int(l, "num_key_value_heads", -1);
  if (hd <= 0 || nq <= 0 || nkv <= 0 || nq % nkv)
    error_at(l->loc, "layer '%s': head_dim, num_query_heads and num_key_value_heads must be "
             "positive, the query heads a multiple of the key/value heads", l->name);
  bool bias = cfg_bool(l, "use_bias", true);
  Node *q = project(g, l, xq, "query", nq, hd, bias);
  Node *k = repeat_heads(g, project(g, l, xk, "key", nkv, hd, bias), nq / nkv);
  Node *v = repeat_heads(g, project(g, l, xv, "value", nkv, hd, bias), nq / nkv);
  Node *o = attend(g, l, q, k, v, 1.0 / sqrt((double)hd), call_flag(l, "use_causal_mask"),
                   mask, cfg_num(l, "dropout", 0));
  return attention_output(g, l, o, xq->shape.d[2], bias);
}

// keras_hub's PositionEmbedding(sequence_length): its call returns the first
// `steps` rows of its embeddings [sequence_length, features], broadcast
// over the batch (the model adds them to the tokens').
static Node *build_position_embedding(Graph *g, Layer *l, Node *x) {
  if (x->shape.rank != 3)
    error_at(l->loc, "layer '%s': PositionEmbedding needs [batch, steps, features], got %s",
             l->name, kshape(&x->shape));
  int64_t len = cfg_int(l, "sequence_length", -1), t = x->shape.d[1], f = x->shape.d[2];
  if (len <= 0) error_at(jloc_key(l->cfg, "sequence_length"), "layer '%s': 'sequence_length' "
                         "must be positive", l->name);
  if (t > len)
    error_at(l->loc, "layer '%s': %lld steps, but sequence_length is %lld", l->name, (long long)t,
             (long long)len);
  check_kwargs(l, NULL, 0); // start_index included: not supported
  Node *e = new_var(g, l, "embeddings", (Shape){2, {len, f}}, "initializer", "glorot_uniform");
  if (t < len) {
    Node *s = new_node1(g, OP_SLICE, e, (Shape){2, {t, f}});
    s->cat = (CatAttr){0, 0};
    e = s;
  }
  Node *y = new_node1(g, OP_BROADCAST, e, x->shape);
  y->red.dim = 0;
  return y;
}

// ---- EinsumDense

// An EinsumDense equation with its ellipsis spelled out: one index per dim
// of the input, the kernel and the output, the ellipsis's dims named '0',
// '1', ... Keras's forms: "ab,bc->ac", "...ab,bc->...ac" (leading in the
// input and the output) and "ab...,bc->ac..." (trailing, after two or more
// input indices); never in the kernel.
typedef struct {
  char x[MAX_RANK + 1], w[MAX_RANK + 1], y[MAX_RANK + 1];
  int elided;             // dims the ellipsis stands for
  bool left;              // it leads
} Einsum;

static noreturn void einsum_error(Layer *l, json_t *eq, const char *why) {
  error_at(jloc(eq), "layer '%s': equation '%s': %s", l->name, json_string_value(eq), why);
}

// Position of index c in s, or -1.
static int index_of(const char *s, char c) {
  const char *p = strchr(s, c);
  return c && p ? (int)(p - s) : -1;
}

// One operand of an equation, s[0, n): its indices into `out`; returns
// where "..." is: 0 nowhere, 1 leading, 2 trailing.
static int einsum_operand(Layer *l, json_t *eq, const char *s, size_t n, char *out) {
  int ell = 0;
  if (n >= 3 && !strncmp(s, "...", 3)) ell = 1, s += 3, n -= 3;
  else if (n >= 3 && !strncmp(s + n - 3, "...", 3)) ell = 2, n -= 3;
  if (n == 0 || n > MAX_RANK)
    einsum_error(l, eq, format("every operand needs 1 to %d indices", MAX_RANK));
  for (size_t i = 0; i < n; i++) {
    if (!isalpha((unsigned char)s[i]))
      einsum_error(l, eq, "indices are letters, with at most one ellipsis ('...') leading or "
                   "trailing the input and the output");
    if (memchr(s, s[i], i))
      einsum_error(l, eq, format("index '%c' repeats within one operand (a diagonal): not "
                                 "supported", s[i]));
    out[i] = s[i];
  }
  out[n] = 0;
  return ell;
}

// spec with the ellipsis's dims ('0', '1', ...) before or after it.
static void spell_ellipsis(char *spec, int elided, bool left) {
  char e[MAX_RANK + 1] = {0}, t[2 * MAX_RANK + 2];
  for (int i = 0; i < elided; i++) e[i] = (char)('0' + i);
  snprintf(t, sizeof t, "%s%s", left ? e : spec, left ? spec : e);
  strcpy(spec, t);
}

static void parse_einsum(Layer *l, json_t *eq, int rank, Einsum *e) {
  if (!json_is_string(eq))
    error_at(eq ? jloc(eq) : l->loc, "layer '%s': EinsumDense needs an 'equation' string",
             l->name);
  const char *s = json_string_value(eq), *comma = strchr(s, ','), *arrow = strstr(s, "->");
  if (!comma || !arrow || arrow < comma || strchr(comma + 1, ','))
    einsum_error(l, eq, "not of the form input,kernel->output");
  int ex = einsum_operand(l, eq, s, (size_t)(comma - s), e->x);
  int ew = einsum_operand(l, eq, comma + 1, (size_t)(arrow - comma - 1), e->w);
  int ey = einsum_operand(l, eq, arrow + 2, strlen(arrow + 2), e->y);
  if (ew || ex != ey || (ex == 2 && strlen(e->x) < 2))
    einsum_error(l, eq, "an ellipsis must lead both the input and the output (...ab,bc->...ac) "
                 "or trail both (ab...,bc->ac...), and never be in the kernel");
  e->elided = rank - (int)strlen(e->x);
  e->left = ex == 1;
  if (e->elided < 0 || (!ex && e->elided) || (int)strlen(e->y) + e->elided > MAX_RANK)
    einsum_error(l, eq, format("the input has rank %d, which its indices '%s' do not fit", rank,
                               e->x));
  spell_ellipsis(e->x, e->elided, e->left);
  spell_ellipsis(e->y, e->elided, e->left);
  for (const char *c = e->y; *c; c++)
    if (index_of(e->x, *c) < 0 && index_of(e->w, *c) < 0)
      einsum_error(l, eq, format("output index '%c' is in neither the input nor the kernel", *c));
  for (const char *c = e->w; *c; c++)
    if (index_of(e->x, *c) < 0 && index_of(e->y, *c) < 0)
      einsum_error(l, eq, format("kernel index '%c' is in neither the input nor the output", *c));
  if (e->x[0] != e->y[0] || index_of(e->w, e->x[0]) >= 0)
    einsum_error(l, eq, format("the batch dim (index '%c') must be the output's first, and not "
                               "in the kernel", e->x[0]));
}

// The output's extents: the input's where it has the index, else output_shape's
// (Keras's partial shape: every output dim but the batch and the ellipsis's,
// null where the input gives it).
static Shape einsum_out_shape(Layer *l, const Einsum *e, const Shape *xs) {
  json_t *os = json_object_get(l->cfg, "output_shape");
  int ry = (int)strlen(e->y), lead = 1 + (e->left && e->elided ? e->elided - 1 : 0);
  int n = json_is_array(os) ? (int)json_array_size(os) : json_is_integer(os) ? 1 : -1;
  if (n != ry - lead - (e->left ? 0 : e->elided))
    error_at(os ? jloc(os) : l->loc, "layer '%s': output_shape must give %d sizes (each output "
             "dim but the batch and the ellipsis's), or null where the input gives one", l->name,
             ry - lead - (e->left ? 0 : e->elided));
  Shape s = {ry, {0}};
  for (int j = 0; j < ry; j++) {
    json_t *v = j < lead || j >= lead + n ? NULL
              : json_is_array(os)          ? json_array_get(os, (size_t)(j - lead))
                                           : os;
    Loc at = v ? jloc(v) : l->loc;
    int i = index_of(e->x, e->y[j]);
    if (v && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) <= 0 ||
                                  json_integer_value(v) > MAX_DIM))
      error_at(at, "layer '%s': output_shape entries must be positive sizes or null", l->name);
    int64_t given = v && !json_is_null(v) ? json_integer_value(v) : -1;
    if (i >= 0 && given >= 0 && given != xs->d[i])
      error_at(at, "layer '%s': output_shape gives %lld for index '%c', whose input dim is %lld",
               l->name, (long long)given, e->y[j], (long long)xs->d[i]);
    if (i < 0 && given < 0)
      error_at(at, "layer '%s': output_shape must give the size of index '%c' (the kernel's "
               "alone)", l->name, e->y[j]);
    s.d[j] = i >= 0 ? xs->d[i] : given;
  }
  return s;
}

// The kernel initializer's own input_axes and output_axes, when it gives
// both: Keras then keeps them instead of EinsumDense's, and the fans are
// the products of those kernel dims.
static void initializer_axes_fans(Layer *l, Node *w) {
  json_t *c = json_object_get(json_object_get(l->cfg, "kernel_initializer"), "config");
  json_t *axes[2] = {json_object_get(c, "input_axes"), json_object_get(c, "output_axes")};
  if (!json_is_array(axes[0]) || !json_is_array(axes[1])) return;
  double fan[2] = {1, 1};
  int r = w->shape.rank;
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < json_array_size(axes[k]); i++) {
      json_t *a = json_array_get(axes[k], i);
      int64_t d = json_is_integer(a) ? json_integer_value(a) : r;
      if (d < -r || d >= r)
        error_at(jloc(a), "layer '%s': the kernel initializer's axes must be dims of the "
                 "kernel %s", l->name, shape_str(&w->shape));
      fan[k] *= (double)w->shape.d[d < 0 ? d + r : d];
    }
  w->var->fan_in = fan[0], w->var->fan_out = fan[1];
}

// x, whose dims are named by the indices `from`, with its dims in the order of `to`.
static Node *arrange(Graph *g, Node *x, const char *from, const char *to) {
  if (!strcmp(from, to)) return x;
  Node *t = new_node1(g, OP_TRANSPOSE, x, x->shape);
  for (int i = 0; to[i]; i++) {
    t->perm.perm[i] = index_of(from, to[i]);
    t->shape.d[i] = x->shape.d[t->perm.perm[i]];
  }
  return t;
}

// The bias over bias_axes, as Keras stores it: the output's trailing dims
// from the first bias index on, 1 where an index is not a bias axis; those
// 1s are broadcast to the output's extents before the add.
static Node *einsum_bias(Graph *g, Layer *l, const Einsum *e, Node *y) {
  json_t *ba = json_object_get(l->cfg, "bias_axes");
  if (!ba || json_is_null(ba)) return y;
  const char *bs = json_is_string(ba) ? json_string_value(ba) : "";
  int ry = y->shape.rank, first = ry;
  for (const char *c = bs; *c; c++) {
    int j = isalpha((unsigned char)*c) ? index_of(e->y, *c) : -1;
    if (j <= 0)
      error_at(jloc(ba), "layer '%s': bias axis '%c' is %s", l->name, *c,
               j ? "not an index of the output" : "the batch dim");
    if (j < first) first = j;
  }
  if (first == ry)
    error_at(jloc(ba), "layer '%s': bias_axes must be a string of output indices", l->name);
  Shape ks = {ry - first, {0}}, cs = {0, {0}};
  for (int j = first; j < ry; j++) {
    bool on = index_of(bs, e->y[j]) >= 0;
    ks.d[j - first] = on ? y->shape.d[j] : 1;
    if (on) cs.d[cs.rank++] = y->shape.d[j];
  }
  Node *b = new_var(g, l, "bias", ks, "bias_initializer", "zeros");
  if (cs.rank < ks.rank) b = new_node1(g, OP_RESHAPE, b, cs);
  for (int j = first; j < ry; j++) {
    if (index_of(bs, e->y[j]) >= 0) continue;
    Shape s = b->shape;
    int d = j - first;
    memmove(s.d + d + 1, s.d + d, (size_t)(s.rank++ - d) * sizeof *s.d);
    s.d[d] = y->shape.d[j];
    b = new_node1(g, OP_BROADCAST, b, s);
    b->red.dim = d;
  }
  return new_node2(g, OP_BIAS, y, b, y->shape);
}

// EinsumDense(equation, output_shape, bias_axes, activation): one DOT
// (dot_general) of the input and the kernel. Indices of the input alone are
// summed first; those of the input, the kernel and the output are the DOT's
// batch dims, of the input and the kernel its contracted ones, of the input
// and the output (the batch among them) the input's free dims, of the
// kernel and the output the kernel's. Transposes put the operands in that
// order (the kernel's free dims may also lead: DOT's tb) and the result in
// the output's, so that a layout of the kernel's dims propagates through
// DOT's rule.
static Node *build_einsum_dense(Graph *g, Layer *l, Node *x) {
  static const char *const no[] = {"lora_rank", "quantization_config"};
  check_none(l, no, 2);
  json_t *eq = json_object_get(l->cfg, "equation");
  Einsum e;
  parse_einsum(l, eq, x->shape.rank, &e);
  Shape ys = einsum_out_shape(l, &e, &x->shape);
  Shape ks = {(int)strlen(e.w), {0}};
  double fan_in = 1;
  for (int i = 0; i < ks.rank; i++) {
    int j = index_of(e.y, e.w[i]);
    ks.d[i] = j >= 0 ? ys.d[j] : x->shape.d[index_of(e.x, e.w[i])];
    if (j < 0) fan_in *= (double)ks.d[i];
  }
  if (shape_elems(&ks) > MAX_ELEMS)
    einsum_error(l, eq, format("a kernel of %s would hold more than 2^40 elements, the most a "
                               "tensor may hold", shape_str(&ks)));
  Node *w = new_var(g, l, "kernel", ks, "kernel_initializer", "glorot_uniform");
  einsum_fans(w, fan_in);
  initializer_axes_fans(l, w);
  for (int d = x->shape.rank - 1; d > 0; d--) // the input's indices summed over
    if (index_of(e.w, e.x[d]) < 0 && index_of(e.y, e.x[d]) < 0) {
      Shape s = x->shape;
      memmove(s.d + d, s.d + d + 1, (size_t)(--s.rank - d) * sizeof *s.d);
      x = new_node1(g, OP_REDUCE_SUM, x, s);
      x->red.dim = d;
      memmove(e.x + d, e.x + d + 1, strlen(e.x + d));
    }
  char B[MAX_RANK + 1] = {0}, M[MAX_RANK + 1] = {0}, K[MAX_RANK + 1] = {0}, N[MAX_RANK + 1] = {0};
  for (const char *c = e.x; *c; c++) {
    char *grp = index_of(e.w, *c) < 0 ? M : index_of(e.y, *c) < 0 ? K : B;
    grp[strlen(grp)] = *c;
  }
  for (const char *c = e.w; *c; c++)
    if (index_of(e.x, *c) < 0) N[strlen(N)] = *c;
  char *a = format("%s%s%s", B, M, K), *b = format("%s%s%s", B, K, N);
  bool tb = strcmp(e.w, b) && !strcmp(e.w, format("%s%s%s", B, N, K));
  Node *y = dot_node(g, arrange(g, x, e.x, a), tb ? w : arrange(g, w, e.w, b), (int)strlen(B),
                     (int)strlen(K), tb);
  y->layer = l->name;
  y->loc = l->loc;
  y = arrange(g, y, format("%s%s%s", B, M, N), e.y);
  return apply_act(g, einsum_bias(g, l, &e, y), parse_act(l, "activation"));
}

// Output extent and leading padding of a window op along one dim, Keras's way.
static void window(int64_t in, int k, int stride, bool same, int64_t *out, int *pad) {
  if (same) {
    *out = (in + stride - 1) / stride;
    int64_t total = (*out - 1) * stride + k - in;
    *pad = total > 0 ? (int)(total / 2) : 0;
  } else {
    *out = in >= k ? (in - k) / stride + 1 : 0;
    *pad = 0;
  }
}

static bool parse_padding(Layer *l) {
  const char *p = cfg_str(l, "padding", "valid");
  if (!strcmp(p, "same")) return true;
  if (!strcmp(p, "valid")) return false;
  error_at(jloc_key(l->cfg, "padding"), "layer '%s': unknown padding '%s'", l->name, p);
}

static void check_channels_last(Layer *l) {
  const char *f = cfg_str(l, "data_format", "channels_last");
  if (strcmp(f, "channels_last"))
    error_at(jloc_key(l->cfg, "data_format"),
             "layer '%s': data_format '%s' is not supported (only channels_last)", l->name, f);
}

// A view of x with a dim of size 1 inserted (or any new shape).
static Node *view(Graph *g, Node *x, Shape s) { return new_node1(g, OP_RESHAPE, x, s); }

// A CONV2D of x4 by f4 with the window win.
static Node *conv_node(Graph *g, Node *x4, Node *f4, WinAttr win, Shape ys) {
  Node *y = new_node2(g, OP_CONV2D, x4, f4, ys);
  y->win = win;
  return y;
}

typedef enum { CONV, DEPTHWISE, SEPARABLE } ConvKind;

// Conv1D, Conv2D, DepthwiseConv1D/2D and SeparableConv1D/2D: CONV2D on
// channels-last [b, h, w, c] (the 1-D layers: a [b, steps, 1, c] view, a
// [k, cin, cout] kernel viewed as [k, 1, cin, cout]; DepthwiseConv2D: its
// [kh, kw, cin, m] kernel viewed as [kh, kw, 1, cin * m], cin groups;
// SeparableConv2D: that, then a 1x1 CONV2D by its pointwise_kernel [1, 1,
// cin * m, filters]), then the bias and the activation. n: the spatial dims
// (1 or 2).
static Node *build_conv(Graph *g, Layer *l, Node *x, int n, ConvKind kind) {
  bool depthwise = kind != CONV;
  check_channels_last(l);
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d (batch, %s, c), got %s",
             l->name, l->cls, n + 2, n == 1 ? "steps" : "h, w", kshape(&x->shape));
  const int64_t *d = x->shape.d;
  int64_t ci = d[n + 1], mult = depthwise ? cfg_size(l, "depth_multiplier", 1) : 1;
  int64_t filters = depthwise ? size_mul(ci, mult) : cfg_size(l, "filters", -1);
  int64_t out_ch = kind == SEPARABLE ? cfg_size(l, "filters", -1) : filters;
  int64_t ks[2] = {1, 1}, st[2] = {1, 1}, dil[2] = {1, 1};
  if (filters <= 0 || out_ch <= 0)
    error_at(jloc_key(l->cfg, "filters"), "layer '%s': 'filters' must be positive", l->name);
  int64_t groups = depthwise ? ci : cfg_size(l, "groups", 1);
  if (ci % groups || filters % groups)
    error_at(jloc_key(l->cfg, "groups"), "layer '%s': groups=%lld must divide the input channels "
             "(%lld) and filters (%lld)", l->name, (long long)groups, (long long)ci,
             (long long)filters);
  if (cfg_sizes(l, "kernel_size", ks, n) != n)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': bad kernel_size", l->name);
  cfg_sizes(l, "strides", st, n);
  cfg_sizes(l, "dilation_rate", dil, n);
  if ((st[0] > 1 || st[1] > 1) && (dil[0] > 1 || dil[1] > 1)) // as Keras refuses it
    error_at(jloc_key(l->cfg, "dilation_rate"), "layer '%s': %s cannot have both strides and "
             "dilation_rate over 1", l->name, l->cls);
  // a dilated kernel spans (k - 1) * d + 1 steps: its extent for the window's shape
  int64_t ek[2] = {(ks[0] - 1) * dil[0] + 1, (ks[1] - 1) * dil[1] + 1};
  // Conv1D's 'causal': the k - 1 steps of padding all before, then 'valid'
  bool causal = n == 1 && !strcmp(cfg_str(l, "padding", "valid"), "causal");
  bool same = !causal && parse_padding(l);
  int64_t b = d[0], h = d[1], w = n == 2 ? d[2] : 1, cg = ci / groups, oh, ow;
  int pt, pl;
  if (ek[0] > MAX_DIM || ek[1] > MAX_DIM)
    error_at(jloc_key(l->cfg, "dilation_rate"), "layer '%s': the dilated kernel spans more than "
             "%d steps", l->name, MAX_DIM);
  window(h + (causal ? ek[0] - 1 : 0), (int)ek[0], (int)st[0], same, &oh, &pt);
  window(w, (int)ek[1], (int)st[1], same, &ow, &pl);
  if (causal) pt = (int)ek[0] - 1;
  if (oh <= 0 || ow <= 0)
    error_at(l->loc, "layer '%s': kernel %s does not fit the input %s", l->name,
             n == 1 ? format("%lld", (long long)ks[0])
                    : format("%lldx%lld", (long long)ks[0], (long long)ks[1]), kshape(&x->shape));
  if (size_mul(size_mul(ks[0], ks[1]), size_mul(cg, filters)) > MAX_ELEMS)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': a kernel of %lld x %lld x %lld x %lld "
             "would hold more than 2^40 elements, the most a tensor may hold", l->name,
             (long long)ks[0], (long long)ks[1], (long long)cg, (long long)filters);
  // its im2col scratch: a row of kh * kw * ci / groups per output pixel and group
  int64_t scratch = size_mul(size_mul(b, size_mul(oh, ow)), size_mul(size_mul(ks[0], ks[1]), ci));
  if (scratch > MAX_ELEMS)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': its im2col buffer would hold more "
             "than 2^40 elements, the most a tensor may hold", l->name);
  // Keras's kernels: [k.., cin / groups, filters], depthwise [k.., cin, mult]
  Shape fs = {n + 2, {ks[0], ks[1]}};
  fs.d[n] = depthwise ? ci : cg;
  fs.d[n + 1] = depthwise ? mult : filters;
  Node *f = new_var(g, l, kind == SEPARABLE ? "depthwise_kernel" : "kernel", fs,
                    depthwise ? "depthwise_initializer" : "kernel_initializer", "glorot_uniform");
  Node *x4 = n == 2 ? x : view(g, x, (Shape){4, {b, h, 1, ci}});
  Node *f4 = fs.rank == 4 && !depthwise ? f : view(g, f, (Shape){4, {ks[0], ks[1], cg, filters}});
  // one CONV2D for all the groups (issue 15; before, a SLICE, a CONV2D and a
  // CONCAT per group)
  WinAttr win = {(int)ks[0], (int)ks[1], (int)st[0], (int)st[1], pt, pl, (int)dil[0] - 1,
                 (int)dil[1] - 1, groups > 1 ? (int)groups : 0};
  Node *y = conv_node(g, x4, f4, win, (Shape){4, {b, oh, ow, filters}});
  if (kind == SEPARABLE) {
    Node *p = new_var(g, l, "pointwise_kernel", n == 2 ? (Shape){4, {1, 1, filters, out_ch}}
                                                       : (Shape){3, {1, filters, out_ch}},
                      "pointwise_initializer", "glorot_uniform");
    if (n == 1) p = view(g, p, (Shape){4, {1, 1, filters, out_ch}});
    y = conv_node(g, y, p, (WinAttr){1, 1, 1, 1, 0, 0, 0, 0, 0}, (Shape){4, {b, oh, ow, out_ch}});
  }
  if (scratch > g->scratch_floats) g->scratch_floats = scratch;
  if (n == 1) y = view(g, y, (Shape){3, {b, oh, out_ch}});
  if (cfg_bool(l, "use_bias", true)) {
    Node *bias = new_var(g, l, "bias", (Shape){1, {out_ch}}, "bias_initializer", "zeros");
    y = new_node2(g, OP_BIAS, y, bias, y->shape);
  }
  return apply_act(g, y, parse_act(l, "activation"));
}

// Conv1DTranspose and Conv2DTranspose(filters, kernel_size, strides,
// padding): the gradient of a conv with respect to its input (CONV2D_DX),
// that conv mapping the output [b, H, W, filters] back to x [b, h, w, cin]
// by the kernel [kh, kw, filters, cin] as Keras stores it. H = h * s
// ('same'), or (h - 1) * s + max(k, s) ('valid'), Keras's output shape. The
// 1-D layer: x [b, steps, 1, cin] and its [k, filters, cin] kernel viewed
// with a unit dim, as Conv1D. output_padding: Keras's output length ((h -
// 1) * s + k + p, 'same' (h - 1) * s + k % 2 + p) and JAX's left padding
// of the transposed conv, which fixes the forward conv's. n: the spatial dims.
static Node *build_conv_transpose(Graph *g, Layer *l, Node *x, int n) {
  check_channels_last(l);
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d (batch, %s, c), got %s", l->name,
             l->cls, n + 2, n == 1 ? "steps" : "h, w", kshape(&x->shape));
  int64_t filters = cfg_size(l, "filters", -1), ks[2] = {1, 1}, st[2] = {1, 1}, dil[2] = {1, 1};
  if (cfg_sizes(l, "kernel_size", ks, n) != n)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': bad kernel_size", l->name);
  cfg_sizes(l, "strides", st, n);
  // output_padding (issue 11): extra output steps after the last, each under its stride
  json_t *oj = json_object_get(l->cfg, "output_padding");
  bool op_given = oj && !json_is_null(oj);
  int64_t op[2] = {0, 0};
  if (op_given && cfg_ints(l, "output_padding", op, n) != n)
    error_at(jloc(oj), "layer '%s': 'output_padding' must give %d sizes", l->name, n);
  for (int i = 0; i < n; i++)
    if (op[i] < 0 || op[i] >= st[i])
      error_at(jloc(oj), "layer '%s': output_padding %lld must be at least 0 and less than the "
               "stride %lld", l->name, (long long)op[i], (long long)st[i]);
  cfg_sizes(l, "dilation_rate", dil, n);
  if (dil[0] != 1 || dil[1] != 1)
    error_at(jloc_key(l->cfg, "dilation_rate"), "layer '%s': %s dilation_rate other than 1 is "
             "not supported yet", l->name, l->cls);
  if (filters <= 0)
    error_at(jloc_key(l->cfg, "filters"), "layer '%s': 'filters' must be positive", l->name);
  bool same = parse_padding(l);
  const int64_t *d = x->shape.d;
  int64_t in[2] = {d[1], n == 2 ? d[2] : 1}, b = d[0], ci = d[n + 1], out[2], chk[2];
  int pad[2];
  for (int i = 0; i < 2; i++) {
    if (op_given && i < n) { // Keras's output length, and JAX's padding of the transposed conv
      int64_t k = ks[i], len = k + k % 2 - 2 + op[i], left = len / 2 + len % 2;
      out[i] = size_add(size_mul(in[i] - 1, st[i]), same ? k % 2 + op[i] : k + op[i]);
      pad[i] = same ? (int)(k - 1 - (left < k - 1 ? left : k - 1)) : 0;
      if (out[i] <= 0)
        error_at(l->loc, "layer '%s': an output dimension of %lld", l->name, (long long)out[i]);
    } else {
      out[i] = same ? size_mul(in[i], st[i])
                    : size_add(size_mul(in[i] - 1, st[i]), ks[i] > st[i] ? ks[i] : st[i]);
    }
    if (out[i] > MAX_DIM)
      error_at(l->loc, "layer '%s': an output dimension over %d", l->name, MAX_DIM);
    if (op_given && i < n) continue;
    window(out[i], (int)ks[i], (int)st[i], same, &chk[i], &pad[i]);
    if (chk[i] != in[i]) unreachable();
  }
  if (size_mul(size_mul(ks[0], ks[1]), size_mul(filters, ci)) > MAX_ELEMS ||
      size_mul(size_mul(b, size_mul(in[0], in[1])), size_mul(size_mul(ks[0], ks[1]), filters)) >
          MAX_ELEMS)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': its kernel or im2col buffer would "
             "hold more than 2^40 elements, the most a tensor may hold", l->name);
  Shape fs = {n + 2, {ks[0], ks[1]}};
  fs.d[n] = filters, fs.d[n + 1] = ci;
  Node *f = new_var(g, l, "kernel", fs, "kernel_initializer", "glorot_uniform");
  Node *x4 = n == 2 ? x : view(g, x, (Shape){4, {b, in[0], 1, ci}});
  Node *f4 = n == 2 ? f : view(g, f, (Shape){4, {ks[0], 1, filters, ci}});
  Node *y = new_node2(g, OP_CONV2D_DX, x4, f4, (Shape){4, {b, out[0], out[1], filters}});
  y->win = (WinAttr){(int)ks[0], (int)ks[1], (int)st[0], (int)st[1], pad[0], pad[1], 0, 0, 0};
  if (n == 1) y = view(g, y, (Shape){3, {b, out[0], filters}});
  if (cfg_bool(l, "use_bias", true)) {
    Node *bias = new_var(g, l, "bias", (Shape){1, {filters}}, "bias_initializer", "zeros");
    y = new_node2(g, OP_BIAS, y, bias, y->shape);
  }
  return apply_act(g, y, parse_act(l, "activation"));
}

static Node *build_conv1d_transpose(Graph *g, Layer *l, Node *x) {
  return build_conv_transpose(g, l, x, 1);
}
static Node *build_conv2d_transpose(Graph *g, Layer *l, Node *x) {
  return build_conv_transpose(g, l, x, 2);
}
static Node *build_conv1d(Graph *g, Layer *l, Node *x) { return build_conv(g, l, x, 1, CONV); }
static Node *build_conv2d(Graph *g, Layer *l, Node *x) { return build_conv(g, l, x, 2, CONV); }
static Node *build_depthwise(Graph *g, Layer *l, Node *x) {
  return build_conv(g, l, x, 2, DEPTHWISE);
}
static Node *build_separable(Graph *g, Layer *l, Node *x) {
  return build_conv(g, l, x, 2, SEPARABLE);
}
static Node *build_depthwise1d(Graph *g, Layer *l, Node *x) {
  return build_conv(g, l, x, 1, DEPTHWISE);
}
static Node *build_separable1d(Graph *g, Layer *l, Node *x) {
  return build_conv(g, l, x, 1, SEPARABLE);
}

static Node *build_maxpool(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (x->shape.rank != 4)
    error_at(l->loc, "layer '%s': MaxPooling2D needs an input of rank 4, got %s", l->name,
             kshape(&x->shape));
  int64_t ps[2] = {2, 2}, st[2];
  cfg_sizes(l, "pool_size", ps, 2);
  st[0] = ps[0], st[1] = ps[1];
  cfg_sizes(l, "strides", st, 2);
  bool same = parse_padding(l);
  int64_t oh, ow;
  int pt, pl;
  window(x->shape.d[1], ps[0], st[0], same, &oh, &pt);
  window(x->shape.d[2], ps[1], st[1], same, &ow, &pl);
  if (oh <= 0 || ow <= 0)
    error_at(l->loc, "layer '%s': pool %lldx%lld does not fit the input %s", l->name,
             (long long)ps[0], (long long)ps[1], kshape(&x->shape));
  Node *y = new_node1(g, OP_MAXPOOL, x, (Shape){4, {x->shape.d[0], oh, ow, x->shape.d[3]}});
  y->win = (WinAttr){(int)ps[0], (int)ps[1], (int)st[0], (int)st[1], pt, pl, 0, 0, 0};
  return y;
}

static Node *build_reshape(Graph *g, Layer *l, Node *x) {
  int64_t t[MAX_RANK];
  json_t *ts = json_object_get(l->cfg, "target_shape");
  int n = cfg_ints(l, "target_shape", t, MAX_RANK - 1);
  if (n <= 0) error_at(ts ? jloc(ts) : l->loc, "layer '%s': bad target_shape", l->name);
  Shape s = {.rank = n + 1};
  s.d[0] = x->shape.d[0];
  int64_t known = 1, per = shape_elems(&x->shape) / x->shape.d[0];
  int unknown = -1;
  for (int i = 0; i < n; i++) {
    if (t[i] == -1 && unknown < 0) unknown = i;
    else if (t[i] <= 0 || t[i] > MAX_DIM)
      error_at(jloc(ts), "layer '%s': bad target_shape entry %lld", l->name, (long long)t[i]);
    else known = size_mul(known, t[i]);
    s.d[i + 1] = t[i];
  }
  if (unknown >= 0 && per % known == 0) s.d[unknown + 1] = per / known, known = per;
  if (known != per)
    error_at(jloc(ts), "layer '%s': cannot reshape %s to target_shape with %s elements",
             l->name, kshape(&x->shape), known > MAX_ELEMS ? "more than 2^40"
                                                           : format("%lld", (long long)known));
  return new_node1(g, OP_RESHAPE, x, s);
}

// Permute(dims): dims are 1-based over the per-sample dims.
static Node *build_permute(Graph *g, Layer *l, Node *x) {
  int64_t dims[MAX_RANK];
  json_t *dj = json_object_get(l->cfg, "dims");
  int n = cfg_ints(l, "dims", dims, MAX_RANK);
  if (n != x->shape.rank - 1)
    error_at(dj ? jloc(dj) : l->loc, "layer '%s': 'dims' must list the %d per-sample dims",
             l->name, x->shape.rank - 1);
  Node *y = new_node1(g, OP_TRANSPOSE, x, x->shape);
  bool seen[MAX_RANK] = {false};
  y->perm.perm[0] = 0;
  for (int i = 0; i < n; i++) {
    if (dims[i] < 1 || dims[i] > n || seen[dims[i]])
      error_at(jloc_idx(dj, i), "layer '%s': 'dims' must be a permutation of 1..%d", l->name, n);
    seen[dims[i]] = true;
    y->perm.perm[i + 1] = (int)dims[i];
    y->shape.d[i + 1] = x->shape.d[dims[i]];
  }
  return y;
}

// GlobalAveragePooling1D: x[b, t, c] -> the mean over t.
static Node *build_gap1d(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (cfg_bool(l, "keepdims", false))
    error_at(jloc_key(l->cfg, "keepdims"), "layer '%s': keepdims is not supported", l->name);
  if (x->shape.rank != 3)
    error_at(l->loc, "layer '%s': GlobalAveragePooling1D needs an input of rank 3 (batch, steps, "
             "features), got %s", l->name, kshape(&x->shape));
  Node *s = new_node1(g, OP_REDUCE_SUM, x, (Shape){2, {x->shape.d[0], x->shape.d[2]}});
  s->red.dim = 1;
  Node *y = new_node1(g, OP_SCALE, s, s->shape);
  y->aff = (AffAttr){(float)(1.0 / (double)x->shape.d[1]), 0};
  return y;
}

static Node *build_merge(Graph *g, Layer *l, bool concat) {
  if (l->nin < 2)
    error_at(l->loc, "layer '%s': %s needs at least 2 inputs", l->name, l->cls);
  Node *in[MAX_IN];
  for (int i = 0; i < l->nin; i++) in[i] = layer_input(l, i);
  Shape s = in[0]->shape;
  int axis = 0;
  if (concat) {
    axis = (int)cfg_int(l, "axis", -1);
    if (axis < 0) axis += s.rank;
    if (axis <= 0 || axis >= s.rank)
      error_at(jloc_key(l->cfg, "axis"), "layer '%s': bad concat axis", l->name);
    s.d[axis] = 0;
  }
  for (int i = 0; i < l->nin; i++) {
    const Shape *si = &in[i]->shape;
    bool ok = si->rank == s.rank;
    for (int d = 0; ok && d < s.rank; d++)
      ok = concat && d == axis ? true : si->d[d] == in[0]->shape.d[d];
    if (!ok)
      error_at(l->in[i].loc, "layer '%s': input %d has shape %s, which does not fit %s", l->name,
               i, kshape(si), kshape(&in[0]->shape));
    if (concat) s.d[axis] += si->d[axis];
  }
  // issue 11: Maximum and Minimum (JAX's lax.max / lax.min, ties sharing the
  // gradient), Subtract (a + -b, the same float as a - b), Average (the sum
  // left to right, then times 1 / n where Keras divides by n: within an ulp)
  bool max = !strcmp(l->cls, "Maximum"), min = !strcmp(l->cls, "Minimum");
  if (!strcmp(l->cls, "Multiply") || max || min) { // two at a time, left to right
    Node *p = in[0];
    for (int i = 1; i < l->nin; i++) {
      p = new_node2(g, max || min ? OP_MAXIMUM : OP_MUL, p, in[i], s);
      p->mm = (MinMaxAttr){min, 0};
    }
    return p;
  }
  if (!strcmp(l->cls, "Subtract")) {
    if (l->nin != 2)
      error_at(l->loc, "layer '%s': Subtract takes exactly 2 inputs, got %d", l->name, l->nin);
    in[1] = scaled(g, in[1], -1);
  }
  Node *n = new_node(g, concat ? OP_CONCAT : OP_ADD, l->nin, in);
  n->shape = s;
  n->cat.axis = axis;
  return strcmp(l->cls, "Average") ? n : scaled(g, n, 1.0 / l->nin);
}

// Embedding(input_dim, output_dim): ids[b, ..] -> table[ids] [b, .., output_dim].
static Node *build_embedding(Graph *g, Layer *l, Node *ids) {
  if (ids->dtype != DT_I32)
    error_at(l->in[0].loc, "layer '%s': Embedding takes integer ids, but '%s' is float32 (give "
             "the InputLayer dtype 'int32')", l->name, l->in[0].layer->name);
  int64_t v = cfg_size(l, "input_dim", -1), dim = cfg_size(l, "output_dim", -1);
  if (v <= 0) error_at(jloc_key(l->cfg, "input_dim"), "layer '%s': 'input_dim' must be positive",
                       l->name);
  if (dim <= 0) error_at(jloc_key(l->cfg, "output_dim"), "layer '%s': 'output_dim' must be "
                         "positive", l->name);
  if (cfg_bool(l, "mask_zero", false))
    error_at(jloc_key(l->cfg, "mask_zero"), "layer '%s': mask_zero is not supported (kdcc has no "
             "masks yet): the model would train without its padding mask", l->name);
  static const char *const no[] = {"lora_rank"};
  check_none(l, no, 1);
  if (ids->shape.rank + 1 > MAX_RANK)
    error_at(l->loc, "layer '%s': input rank too large", l->name);
  if (size_mul(v, dim) > MAX_ELEMS)
    error_at(jloc_key(l->cfg, "output_dim"), "layer '%s': a table of [%lld, %lld] would hold "
             "more than 2^40 elements, the most a tensor may hold", l->name, (long long)v,
             (long long)dim);
  Node *t = new_var(g, l, "embeddings", (Shape){2, {v, dim}}, "embeddings_initializer",
                    "uniform");
  Shape out = ids->shape;
  out.d[out.rank++] = dim;
  Node *y = new_node2(g, OP_GATHER, t, ids, out);
  y->layer = l->name;
  y->loc = l->loc;
  // the ids' range, for synthetic data and file checks (the smallest table reading them)
  if (ids->op == OP_INPUT && (!ids->id_range || v < ids->id_range)) ids->id_range = v;
  return y;
}

// ReversibleEmbedding(input_dim, output_dim, tie_weights, logit_soft_cap)
// (keras.layers and keras_hub.layers): called on ids, an Embedding; called
// with reverse=True on h[.., output_dim], the logits h . embeddings^T (a
// DOT contracting the table's second dim), or h . reverse_embeddings
// [output_dim, input_dim] when the weights are not tied; soft-capped as
// tanh(logits / cap) * cap. The reverse call is a later call of the same
// layer, so it finds the table its first call made.
static Node *build_reversible_embedding(Graph *g, Layer *l, Node *x) {
  static const char *const kw[] = {"reverse"};
  check_kwargs(l, kw, 1);
  if (!call_flag(l, "reverse")) return build_embedding(g, l, x);
  const char *rd = cfg_str(l, "reverse_dtype", "float32");
  if (strcmp(rd, "float32"))
    error_at(jloc_key(l->cfg, "reverse_dtype"), "layer '%s': reverse_dtype '%s' is not "
             "supported (float32 only)", l->name, rd);
  int64_t v = cfg_size(l, "input_dim", -1), dim = cfg_size(l, "output_dim", -1);
  if (v <= 0 || dim <= 0)
    error_at(l->loc, "layer '%s': 'input_dim' and 'output_dim' must be positive", l->name);
  if (x->shape.d[x->shape.rank - 1] != dim)
    error_at(l->in[0].loc, "layer '%s': reverse=True takes [.., output_dim = %lld], got %s",
             l->name, (long long)dim, kshape(&x->shape));
  bool tie = cfg_bool(l, "tie_weights", true);
  Node *w = tie ? new_var(g, l, "embeddings", (Shape){2, {v, dim}}, "embeddings_initializer",
                          "uniform")
                : new_var(g, l, "reverse_embeddings", (Shape){2, {dim, v}},
                          "embeddings_initializer", "uniform");
  Node *y = dot_node(g, x, w, 0, 1, tie);
  y->layer = l->name;
  y->loc = l->loc;
  double cap = cfg_num(l, "logit_soft_cap", 0);
  if (cap == 0) return y;
  Node *s = new_node1(g, OP_SCALE, y, y->shape);
  s->aff = (AffAttr){(float)(1.0 / cap), 0};
  Node *t = apply_act(g, s, ACT_TANH);
  Node *c = new_node1(g, OP_SCALE, t, t->shape);
  c->aff = (AffAttr){(float)cap, 0};
  return c;
}

static Node *build_input(Graph *g, Layer *l, Node *unused) {
  Shape s = {.rank = l->in_rank + 1};
  s.d[0] = g->batch;
  for (int i = 0; i < l->in_rank; i++) s.d[i + 1] = l->in_shape[i];
  Node *x = new_node(g, OP_INPUT, 0, NULL);
  x->shape = s;
  x->dtype = l->in_int ? DT_I32 : DT_F32;
  x->index = -1; // set from the model's input order below
  return x;
}

static Node *build_activation(Graph *g, Layer *l, Node *x) {
  return apply_act(g, x, parse_act(l, "activation"));
}

// Softmax(axis): over the last dim, or (issue 11) over any axes, moved to
// the end and merged into one (Keras computes several axes' as exp(x -
// logsumexp(x)): the same values within float rounding).
static Node *build_softmax(Graph *g, Layer *l, Node *x) {
  unsigned axes = cfg_axes(l, x, "axis", 1);
  Shape moved;
  Node *y = apply_act(g, to_last(g, x, axes, &moved), ACT_SOFTMAX);
  if (__builtin_popcount(axes) > 1) y = view(g, y, moved);
  return from_last(g, y, axes, &moved, &x->shape);
}

static Node *build_flatten(Graph *g, Layer *l, Node *x) {
  return new_node1(g, OP_RESHAPE, x,
                   (Shape){2, {x->shape.d[0], shape_elems(&x->shape) / x->shape.d[0]}});
}

// A dropout layer's rate, in [0, 1).
static double dropout_rate(Layer *l) {
  double rate = cfg_num(l, "rate", 0);
  if (rate < 0 || rate >= 1)
    error_at(jloc_key(l->cfg, "rate"), "layer '%s': dropout rate must be in [0, 1)", l->name);
  return rate;
}

static Node *build_dropout(Graph *g, Layer *l, Node *x) {
  double rate = dropout_rate(l);
  if (rate == 0) return x;
  Node *n = new_node1(g, OP_DROPOUT, x, x->shape);
  n->drop = (DropAttr){(float)rate, hash_str(l->path), false};
  return n;
}

static Node *build_rescaling(Graph *g, Layer *l, Node *x) {
  Node *n = new_node1(g, OP_SCALE, x, x->shape);
  n->aff = (AffAttr){(float)cfg_num(l, "scale", 1.0), (float)cfg_num(l, "offset", 0.0)};
  return n;
}

static Node *build_add(Graph *g, Layer *l, Node *x) { return build_merge(g, l, false); }
static Node *build_concat(Graph *g, Layer *l, Node *x) { return build_merge(g, l, true); }

// ---- issue 11: activation layers, global pooling, padding and cropping

static double cfg_opt_num(Layer *l, const char *key, double def, bool *isnull) {
  json_t *j = json_object_get(l->cfg, key);
  *isnull = !j || json_is_null(j);
  if (*isnull) return def;
  if (!json_is_number(j))
    error_at(jloc(j), "layer '%s': '%s' must be a number", l->name, key);
  return json_number_value(j);
}

// An activation layer's parameter, which Keras requires to be >= 0.
static double cfg_nonneg(Layer *l, const char *key, double def, bool *isnull) {
  double v = cfg_opt_num(l, key, def, isnull);
  if (v < 0)
    error_at(jloc_key(l->cfg, key), "layer '%s': %s '%s' is %g; it must be >= 0 (Keras refuses "
             "it too)", l->name, l->cls, key, v);
  return v;
}

// Parameters no KDRT_ACT_LIST activation has: PACT (kdrt_pact).
static Node *pact(Graph *g, Node *x, int kind, double alpha, double max, double threshold) {
  Node *y = new_node1(g, OP_PACT, x, x->shape);
  y->pact = (PactAttr){kind, (float)alpha, (float)max, (float)threshold};
  return y;
}

// ReLU(max_value, negative_slope, threshold), as Keras's relu: relu or
// relu6 where it is one, leaky_relu without a max or a threshold, PACT
// otherwise.
static Node *build_relu_layer(Graph *g, Layer *l, Node *x) {
  bool nomax, isnull;
  double mx = cfg_nonneg(l, "max_value", 0, &nomax);
  double ns = cfg_nonneg(l, "negative_slope", 0, &isnull);
  double th = cfg_nonneg(l, "threshold", 0, &isnull);
  if (th == 0 && ns == 0 && nomax) return apply_act(g, x, ACT_RELU);
  if (th == 0 && ns == 0 && mx == 6) return apply_act(g, x, KDRT_ACT_RELU6);
  if (th == 0 && nomax) return pact(g, x, KDRT_PACT_LEAKY, ns, INFINITY, 0);
  return pact(g, x, KDRT_PACT_RELU, ns, nomax ? INFINITY : mx, th);
}

static Node *build_leaky_relu(Graph *g, Layer *l, Node *x) {
  bool isnull;
  double ns = cfg_nonneg(l, "negative_slope", 0.3, &isnull);
  if ((float)ns == 0.2f) return apply_act(g, x, KDRT_ACT_LEAKY_RELU);
  return pact(g, x, KDRT_PACT_LEAKY, ns, INFINITY, 0);
}

static Node *build_elu_layer(Graph *g, Layer *l, Node *x) {
  double a = cfg_num(l, "alpha", 1.0);
  return a == 1.0 ? apply_act(g, x, KDRT_ACT_ELU) : pact(g, x, KDRT_PACT_ELU, a, INFINITY, 0);
}

// GlobalAveragePooling2D: x[b, h, w, c] -> the mean over h and w.
static Node *build_gap2d(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (cfg_bool(l, "keepdims", false))
    error_at(jloc_key(l->cfg, "keepdims"), "layer '%s': keepdims is not supported", l->name);
  if (x->shape.rank != 4)
    error_at(l->loc, "layer '%s': GlobalAveragePooling2D needs an input of rank 4 (batch, rows, "
             "cols, channels), got %s", l->name, kshape(&x->shape));
  const int64_t *d = x->shape.d;
  Node *s = new_node1(g, OP_REDUCE_SUM, x, (Shape){3, {d[0], d[2], d[3]}});
  s->red.dim = 1;
  Node *t = new_node1(g, OP_REDUCE_SUM, s, (Shape){2, {d[0], d[3]}});
  t->red.dim = 1;
  Node *y = new_node1(g, OP_SCALE, t, t->shape);
  y->aff = (AffAttr){(float)(1.0 / (double)(d[1] * d[2])), 0};
  return y;
}

// Amounts before and after along n spatial dims: Keras stores [a, b] for 1-D
// and [[t, b], [l, r]] for 2-D (an int for a 1-D symmetric amount).
static void cfg_amounts(Layer *l, const char *key, int n, int64_t out[][2]) {
  json_t *j = json_object_get(l->cfg, key);
  if (!j) error_at(l->loc, "layer '%s': '%s' is missing", l->name, key);
  for (int i = 0; i < n; i++) {
    json_t *e = n == 1 ? j : json_array_get(j, (size_t)i);
    if (e && json_is_integer(e)) {
      out[i][0] = out[i][1] = json_integer_value(e);
    } else if (e && json_is_array(e) && json_array_size(e) == 2 &&
               json_is_integer(json_array_get(e, 0)) && json_is_integer(json_array_get(e, 1))) {
      out[i][0] = json_integer_value(json_array_get(e, 0));
      out[i][1] = json_integer_value(json_array_get(e, 1));
    } else {
      error_at(jloc(e ? e : j), "layer '%s': bad '%s'", l->name, key);
    }
    if (out[i][0] < 0 || out[i][1] < 0)
      error_at(jloc(e), "layer '%s': '%s' must not be negative", l->name, key);
    if (out[i][0] > MAX_DIM || out[i][1] > MAX_DIM)
      error_at(jloc(e), "layer '%s': '%s' is over %d", l->name, key, MAX_DIM);
  }
}

// ZeroPadding1D/2D (pad) and Cropping1D/2D: one PAD or SLICE per side pair
// along each spatial dim (dims 1..n of [b, ..., c]).
static Node *pad_or_crop(Graph *g, Layer *l, Node *x, int n, bool pad) {
  if (n == 2) check_channels_last(l);
  const char *key = pad ? "padding" : "cropping";
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d, got %s", l->name, l->cls, n + 2,
             kshape(&x->shape));
  int64_t a[2][2];
  cfg_amounts(l, key, n, a);
  for (int i = 0; i < n; i++) {
    if (!a[i][0] && !a[i][1]) continue;
    Shape s = x->shape;
    int ax = i + 1;
    s.d[ax] += pad ? a[i][0] + a[i][1] : -(a[i][0] + a[i][1]);
    if (s.d[ax] > MAX_DIM)
      error_at(jloc_key(l->cfg, key), "layer '%s': padding makes dim %d %lld, over %d", l->name,
               ax, (long long)s.d[ax], MAX_DIM);
    if (s.d[ax] <= 0)
      error_at(jloc_key(l->cfg, key), "layer '%s': cropping %lld+%lld leaves nothing of dim %d "
               "(%lld)", l->name, (long long)a[i][0], (long long)a[i][1], ax,
               (long long)x->shape.d[ax]);
    Node *y = new_node1(g, pad ? OP_PAD : OP_SLICE, x, s);
    y->cat = (CatAttr){ax, a[i][0]};
    x = y;
  }
  return x;
}

static Node *build_zeropad1d(Graph *g, Layer *l, Node *x) { return pad_or_crop(g, l, x, 1, true); }
static Node *build_zeropad2d(Graph *g, Layer *l, Node *x) { return pad_or_crop(g, l, x, 2, true); }
static Node *build_crop1d(Graph *g, Layer *l, Node *x) { return pad_or_crop(g, l, x, 1, false); }
static Node *build_crop2d(Graph *g, Layer *l, Node *x) { return pad_or_crop(g, l, x, 2, false); }

// ---- issue 11: more pooling and upsampling, from existing ops


static Node *maxpool_node(Graph *g, Node *x4, int64_t ph, int64_t pw, int64_t sh, int64_t sw,
                          int pt, int pl, int64_t oh, int64_t ow) {
  Node *y = new_node1(g, OP_MAXPOOL, x4, (Shape){4, {x4->shape.d[0], oh, ow, x4->shape.d[3]}});
  y->win = (WinAttr){(int)ph, (int)pw, (int)sh, (int)sw, pt, pl, 0, 0, 0};
  return y;
}

// GlobalMaxPooling1D/2D: one MAXPOOL window over every step (the gradient
// goes to the first maximum of each channel).
static Node *build_global_maxpool(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (cfg_bool(l, "keepdims", false))
    error_at(jloc_key(l->cfg, "keepdims"), "layer '%s': keepdims is not supported", l->name);
  int n = strstr(l->cls, "1D") ? 1 : 2;
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d, got %s", l->name, l->cls, n + 2,
             kshape(&x->shape));
  const int64_t *d = x->shape.d;
  int64_t b = d[0], h = d[1], w = n == 2 ? d[2] : 1, c = d[n + 1];
  Node *x4 = n == 2 ? x : view(g, x, (Shape){4, {b, h, 1, c}});
  Node *y = maxpool_node(g, x4, h, w, h, w, 0, 0, 1, 1);
  return view(g, y, (Shape){2, {b, c}});
}

// MaxPooling1D: MAXPOOL on a [b, steps, 1, c] view.
static Node *build_maxpool1d(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (x->shape.rank != 3)
    error_at(l->loc, "layer '%s': MaxPooling1D needs an input of rank 3, got %s", l->name,
             kshape(&x->shape));
  int64_t ps = 2, st;
  cfg_sizes(l, "pool_size", &ps, 1);
  st = ps;
  cfg_sizes(l, "strides", &st, 1);
  bool same = parse_padding(l);
  int64_t ot;
  int pt;
  window(x->shape.d[1], (int)ps, (int)st, same, &ot, &pt);
  if (ot <= 0)
    error_at(l->loc, "layer '%s': pool %lld does not fit the input %s", l->name, (long long)ps,
             kshape(&x->shape));
  const int64_t *d = x->shape.d;
  Node *y = maxpool_node(g, view(g, x, (Shape){4, {d[0], d[1], 1, d[2]}}), ps, 1, st, 1, pt, 0,
                         ot, 1);
  return view(g, y, (Shape){3, {d[0], ot, d[2]}});
}

// AveragePooling1D/2D, padding 'valid' with strides equal to the pool:
// the steps that fit, viewed as [b, o, p, ..., c] and summed over p.
static Node *build_avgpool(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  int n = strstr(l->cls, "1D") ? 1 : 2;
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d, got %s", l->name, l->cls, n + 2,
             kshape(&x->shape));
  int64_t ps[2] = {2, 2}, st[2];
  if (cfg_sizes(l, "pool_size", ps, n) == 1 && n == 2) ps[1] = ps[0];
  st[0] = ps[0], st[1] = ps[1];
  json_t *sj = json_object_get(l->cfg, "strides");
  if (sj && !json_is_null(sj) && cfg_sizes(l, "strides", st, n) == 1 && n == 2) st[1] = st[0];
  if (parse_padding(l))
    error_at(jloc_key(l->cfg, "padding"), "layer '%s': %s padding 'same' is not supported (only "
             "'valid')", l->name, l->cls);
  for (int i = 0; i < n; i++)
    if (st[i] != ps[i])
      error_at(jloc_key(l->cfg, "strides"), "layer '%s': %s strides other than pool_size are not "
               "supported", l->name, l->cls);
  for (int i = 0; i < n; i++) {
    int64_t o = x->shape.d[i + 1] / ps[i];
    if (o <= 0)
      error_at(l->loc, "layer '%s': pool %lld does not fit the input %s", l->name,
               (long long)ps[i], kshape(&x->shape));
    if (o * ps[i] != x->shape.d[i + 1]) { // Keras drops the steps that do not fill a window
      Shape s = x->shape;
      s.d[i + 1] = o * ps[i];
      Node *c = new_node1(g, OP_SLICE, x, s);
      c->cat = (CatAttr){i + 1, 0};
      x = c;
    }
  }
  const int64_t *d = x->shape.d;
  int64_t b = d[0], c = d[n + 1];
  int64_t o0 = d[1] / ps[0], o1 = n == 2 ? d[2] / ps[1] : 1;
  Node *v = n == 2 ? view(g, x, (Shape){6, {b, o0, ps[0], o1, ps[1], c}})
                   : view(g, x, (Shape){4, {b, o0, ps[0], c}});
  Node *r = new_node1(g, OP_REDUCE_SUM, v, n == 2 ? (Shape){5, {b, o0, o1, ps[1], c}}
                                                   : (Shape){3, {b, o0, c}});
  r->red.dim = 2;
  if (n == 2) {
    Node *r2 = new_node1(g, OP_REDUCE_SUM, r, (Shape){4, {b, o0, o1, c}});
    r2->red.dim = 3;
    r = r2;
  }
  Node *y = new_node1(g, OP_SCALE, r, r->shape);
  y->aff = (AffAttr){(float)(1.0 / (double)(ps[0] * (n == 2 ? ps[1] : 1))), 0};
  return y;
}

// UpSampling1D/2D (nearest): each step repeated, a BROADCAST and a view.
static Node *build_upsample(Graph *g, Layer *l, Node *x) {
  int n = strstr(l->cls, "1D") ? 1 : 2;
  if (n == 2) {
    check_channels_last(l);
    const char *ip = cfg_str(l, "interpolation", "nearest");
    if (strcmp(ip, "nearest"))
      error_at(jloc_key(l->cfg, "interpolation"), "layer '%s': UpSampling2D interpolation '%s' "
               "is not supported (only 'nearest')", l->name, ip);
  }
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d, got %s", l->name, l->cls, n + 2,
             kshape(&x->shape));
  int64_t sz[2] = {2, 2};
  if (cfg_sizes(l, "size", sz, n) == 1 && n == 2) sz[1] = sz[0];
  for (int i = 0; i < n; i++)
    if (x->shape.d[i + 1] > MAX_DIM / sz[i])
      error_at(jloc_key(l->cfg, "size"), "layer '%s': %s by %lld makes dim %d over %d", l->name,
               l->cls, (long long)sz[i], i + 1, MAX_DIM);
  const int64_t *d = x->shape.d;
  if (n == 1) {
    Node *b = new_node1(g, OP_BROADCAST, x, (Shape){4, {d[0], d[1], sz[0], d[2]}});
    b->red.dim = 2;
    return view(g, b, (Shape){3, {d[0], d[1] * sz[0], d[2]}});
  }
  Node *b = new_node1(g, OP_BROADCAST, x, (Shape){5, {d[0], d[1], sz[0], d[2], d[3]}});
  b->red.dim = 2;
  Node *b2 = new_node1(g, OP_BROADCAST, b, (Shape){6, {d[0], d[1], sz[0], d[2], sz[1], d[3]}});
  b2->red.dim = 4;
  return view(g, b2, (Shape){4, {d[0], d[1] * sz[0], d[2] * sz[1], d[3]}});
}

// ---- issue 11: BatchNormalization
// Over the last axis, Keras's formula: training uses the statistics of the
// global batch (sums over every dim but the last, BN_STATS: a split batch
// leaves partial sums that the lattice all-reduces, synchronized batch
// norm), evaluate and predict the moving ones (TRAIN_SELECT); then y = x *
// inv + (beta - mean * inv), inv = rsqrt(var + epsilon) * gamma, one
// BATCH_NORM (issue 15; its gradient is batch norm's whole). The moving
// statistics are variables whose update is the moving average of the
// batch's.
static Node *fill_channels(Graph *g, Shape cs, float v) {
  Node *f = new_node(g, OP_FILL, 0, NULL);
  f->shape = cs;
  f->aff = (AffAttr){0, v};
  return f;
}

// A frozen BatchNormalization (trainable false) normalises with its moving
// statistics in training too and leaves them be (Keras: `if training and
// self.trainable`). Its mean and variance are constants then, so its
// gradient in x is dy * inv, not BATCH_NORM's (which differentiates through
// batch statistics): it is built from COL_MUL and BIAS, with per channel
// Keras's inv = rsqrt(var + eps) * gamma and res = -mean * inv + beta.
static Node *frozen_batchnorm(Graph *g, Node *x, Node *mm, Node *mv, Node *gam, Node *beta,
                              double eps) {
  Shape cs = mm->shape;
  Node *ve = new_node1(g, OP_SCALE, mv, cs);
  ve->aff = (AffAttr){1, (float)eps};
  Node *inv = apply_act(g, ve, KDRT_ACT_RSQRT);
  if (gam) inv = new_node2(g, OP_MUL, inv, gam, cs);
  Node *res = new_node2(g, OP_MUL, scaled(g, mm, -1), inv, cs);
  if (beta) res = new_node2(g, OP_ADD, res, beta, cs);
  return new_node2(g, OP_BIAS, new_node2(g, OP_COL_MUL, x, inv, x->shape), res, x->shape);
}

static Node *build_batchnorm(Graph *g, Layer *l, Node *x) {
  check_last_axis(l, x);
  static const char *const no[] = {"renorm"};
  check_none(l, no, 1);
  if (x->shape.rank < 2)
    error_at(l->loc, "layer '%s': BatchNormalization needs an input of rank 2 or more, got %s",
             l->name, kshape(&x->shape));
  if (l->shared)
    error_at(l->loc, "layer '%s': a BatchNormalization layer called more than once is not "
             "supported (call %d)", l->name, l->call);
  int r = x->shape.rank;
  int64_t c = x->shape.d[r - 1], rows = shape_elems(&x->shape) / c;
  int64_t per = rows / x->shape.d[0]; // elements of a channel per sample
  double eps = cfg_num(l, "epsilon", 1e-3), mom = cfg_num(l, "momentum", 0.99);
  Shape cs = {1, {c}};
  Node *gam = cfg_bool(l, "scale", true) ? new_var(g, l, "gamma", cs, "gamma_initializer", "ones")
                                         : NULL;
  Node *beta = cfg_bool(l, "center", true)
                   ? new_var(g, l, "beta", cs, "beta_initializer", "zeros") : NULL;
  Node *mm = new_var(g, l, "moving_mean", cs, "moving_mean_initializer", "zeros");
  Node *mv = new_var(g, l, "moving_variance", cs, "moving_variance_initializer", "ones");
  if (layer_frozen(l)) return frozen_batchnorm(g, x, mm, mv, gam, beta, eps);
  Node *mean = new_node1(g, OP_BATCH_MEAN, new_node1(g, OP_BN_STATS, x, cs), cs);
  mean->aff = (AffAttr){(float)per, 0};
  Node *var = new_node1(g, OP_BATCH_MEAN, new_node2(g, OP_BN_STATS, x, mean, cs), cs);
  var->aff = (AffAttr){(float)per, 0};
  mm->var->ema_stat = mean, mm->var->ema_momentum = (float)mom;
  mv->var->ema_stat = var, mv->var->ema_momentum = (float)mom;
  Node *in[5] = {x, new_node2(g, OP_TRAIN_SELECT, mean, mm, cs),
                 new_node2(g, OP_TRAIN_SELECT, var, mv, cs),
                 gam ? gam : fill_channels(g, cs, 1), beta ? beta : fill_channels(g, cs, 0)};
  Node *y = new_node(g, OP_BATCH_NORM, 5, in);
  y->shape = x->shape;
  y->bn = (BnAttr){(float)eps, ACT_LINEAR, (double)per};
  return y;
}

// ---- issue 11: Dot, normalizations, PReLU, RepeatVector

// x with dim d removed (a reduction's result shape).
static Shape drop_dim(const Shape *x, int d) {
  Shape s = *x;
  memmove(s.d + d, s.d + d + 1, (size_t)(--s.rank - d) * sizeof *s.d);
  return s;
}

// v (x's shape without dim d) repeated along d back to x's shape.
static Node *bcast_dim(Graph *g, Node *v, const Shape *to, int d) {
  Node *b = new_node1(g, OP_BROADCAST, v, *to);
  b->red.dim = d;
  return b;
}

// Keras's ops.normalize(x, axis, order=2, epsilon): x * min(rsqrt(sum of
// squares over the axes), 1 / epsilon), the sum one REDUCE_SUM per axis (a
// split axis leaves a partial sum, all-reduced before the rsqrt).
static Node *l2_normalize(Graph *g, Node *x, unsigned axes, double eps) {
  Node *s = new_node2(g, OP_MUL, x, x, x->shape);
  for (int d = x->shape.rank - 1; d >= 0; d--)
    if ((axes >> d) & 1) {
      Node *r = new_node1(g, OP_REDUCE_SUM, s, drop_dim(&s->shape, d));
      r->red.dim = d;
      s = r;
    }
  Node *inv = apply_act(g, s, KDRT_ACT_RSQRT);
  inv = new_node1(g, OP_MAXIMUM, inv, inv->shape);
  inv->mm = (MinMaxAttr){true, (float)(1.0 / eps)};
  for (int d = 0; d < x->shape.rank; d++)
    if ((axes >> d) & 1) {
      Shape t = inv->shape;
      memmove(t.d + d + 1, t.d + d, (size_t)(t.rank++ - d) * sizeof *t.d);
      t.d[d] = x->shape.d[d];
      inv = bcast_dim(g, inv, &t, d);
    }
  return new_node2(g, OP_MUL, x, inv, x->shape);
}

// x with its dim `from` moved to `to`, the others in order.
static Node *move_dim(Graph *g, Node *x, int from, int to) {
  if (from == to) return x;
  Node *t = new_node1(g, OP_TRANSPOSE, x, x->shape);
  for (int i = 0, k = 0; i < x->shape.rank; i++) {
    if (k == from) k++;
    t->perm.perm[i] = i == to ? from : k++;
    t->shape.d[i] = x->shape.d[t->perm.perm[i]];
  }
  return t;
}

// x with the dims in `axes` (a mask) moved to the end, in order, and merged
// into one; *moved: the shape before the merge (from_last undoes both).
static Node *to_last(Graph *g, Node *x, unsigned axes, Shape *moved) {
  int r = x->shape.rank, k = 0, perm[MAX_RANK];
  for (int d = 0; d < r; d++)
    if (!((axes >> d) & 1)) perm[k++] = d;
  int keep = k;
  for (int d = 0; d < r; d++)
    if ((axes >> d) & 1) perm[k++] = d;
  Node *t = x;
  if (axes != (((1u << (r - keep)) - 1) << keep)) { // not already the trailing dims
    t = new_node1(g, OP_TRANSPOSE, x, x->shape);
    for (int i = 0; i < r; i++) t->shape.d[i] = x->shape.d[t->perm.perm[i] = perm[i]];
  }
  *moved = t->shape;
  if (r - keep == 1) return t;
  Shape m = {keep + 1, {0}};
  for (int i = 0; i < keep; i++) m.d[i] = t->shape.d[i];
  m.d[keep] = 1;
  for (int i = keep; i < r; i++) m.d[keep] *= t->shape.d[i];
  return view(g, t, m);
}

// y, of the shape *moved (to_last's), with its dims back where `axes` were.
static Node *from_last(Graph *g, Node *y, unsigned axes, const Shape *moved, const Shape *orig) {
  if (shape_eq(moved, orig)) return y;
  int r = orig->rank, k = 0;
  Node *t = new_node1(g, OP_TRANSPOSE, y, *orig);
  for (int d = 0; d < r; d++)
    if (!((axes >> d) & 1)) t->perm.perm[d] = k++;
  for (int d = 0; d < r; d++)
    if ((axes >> d) & 1) t->perm.perm[d] = k++;
  return t;
}

// One axis of a layer option (an int, negative from the end), in [lo, rank).
static int axis_in(Layer *l, json_t *a, const char *key, int rank, int lo) {
  int64_t d = json_is_integer(a) ? json_integer_value(a) : INT64_MAX;
  if (d < 0 && d >= -rank) d += rank;
  if (d < lo || d >= rank)
    error_at(a ? jloc(a) : l->loc, "layer '%s': '%s' must name a dim of the rank-%d input "
             "(-%d to %d)%s", l->name, key, rank, rank, rank - 1,
             lo ? ", not the batch (0)" : "");
  return (int)d;
}

// A layer's axis option: an int or a list of them, as a mask of dims in
// [lo, rank); the last when absent. Keras sorts a list as written, then
// orders its weights' dims so: that must be their order from the front.
static int cmp_json_int(const void *a, const void *b) {
  int64_t x = json_integer_value(*(json_t *const *)a), y = json_integer_value(*(json_t *const *)b);
  return (x > y) - (x < y);
}

static unsigned cfg_axes(Layer *l, const Node *x, const char *key, int lo) {
  json_t *a = json_object_get(l->cfg, key);
  int r = x->shape.rank;
  if (!a || json_is_null(a)) return 1u << (r - 1);
  size_t n = json_is_array(a) ? json_array_size(a) : 1;
  if (n == 0 || n > MAX_RANK)
    error_at(jloc(a), "layer '%s': '%s' must list 1 to %d dims", l->name, key, MAX_RANK);
  json_t *v[MAX_RANK];
  for (size_t i = 0; i < n; i++) {
    v[i] = json_is_array(a) ? json_array_get(a, i) : a;
    if (!json_is_integer(v[i])) axis_in(l, v[i], key, r, lo); // the error
  }
  qsort(v, n, sizeof *v, cmp_json_int);
  unsigned m = 0;
  for (size_t i = 0; i < n; i++) {
    int d = axis_in(l, v[i], key, r, lo);
    if (m >> d)
      error_at(jloc(a), "layer '%s': '%s' must name each dim once, and not mix negative and "
               "positive axes out of order", l->name, key);
    m |= 1u << d;
  }
  return m;
}

// Dot(axes, normalize): Keras's batch_dot of two inputs [b, ..] contracting
// x's axis a0 with y's a1: x's other dims, then y's (the batch once), as
// one DOT (x with a0 last, y with a1 after the batch); two rank-2 inputs
// give [b, 1]. normalize: each input L2-normalized along its axis first
// (epsilon 1e-7, Keras's).
static Node *build_dot(Graph *g, Layer *l, Node *unused) {
  if (l->nin != 2)
    error_at(l->loc, "layer '%s': Dot takes exactly 2 inputs, got %d", l->name, l->nin);
  Node *x = layer_input(l, 0), *y = layer_input(l, 1);
  json_t *aj = json_object_get(l->cfg, "axes");
  json_t *a[2] = {aj, aj};
  if (json_is_array(aj) && json_array_size(aj) == 2)
    a[0] = json_array_get(aj, 0), a[1] = json_array_get(aj, 1);
  else if (!json_is_integer(aj))
    error_at(aj ? jloc(aj) : l->loc, "layer '%s': Dot's 'axes' must be an int or two", l->name);
  if (x->shape.rank < 2 || y->shape.rank < 2)
    error_at(l->loc, "layer '%s': Dot needs inputs of rank 2 or more, got %s and %s", l->name,
             kshape(&x->shape), kshape(&y->shape));
  int a0 = axis_in(l, a[0], "axes", x->shape.rank, 1), a1 = axis_in(l, a[1], "axes",
                                                                     y->shape.rank, 1);
  if (x->shape.d[a0] != y->shape.d[a1])
    error_at(jloc(aj), "layer '%s': axis %d of %s and axis %d of %s differ", l->name, a0,
             kshape(&x->shape), a1, kshape(&y->shape));
  if (cfg_bool(l, "normalize", false)) {
    x = l2_normalize(g, x, 1u << a0, 1e-7);
    y = l2_normalize(g, y, 1u << a1, 1e-7);
  }
  Shape s;
  Node *xt = move_dim(g, x, a0, x->shape.rank - 1), *yt = move_dim(g, y, a1, 1);
  if (!dot_shape(&xt->shape, &yt->shape, 1, 1, false, false, &s))
    error_at(l->loc, "layer '%s': the product of %s and %s has rank over %d", l->name,
             kshape(&x->shape), kshape(&y->shape), MAX_RANK);
  Node *d = dot_node(g, xt, yt, 1, 1, false);
  return d->shape.rank > 1 ? d : view(g, d, (Shape){2, {d->shape.d[0], 1}});
}

// UnitNormalization(axis): x * min(rsqrt(sum of squares), 1e12) over the axes.
static Node *build_unit_norm(Graph *g, Layer *l, Node *x) {
  return l2_normalize(g, x, cfg_axes(l, x, "axis", 1), 1e-12);
}

// GroupNormalization(groups, axis=-1, epsilon, center, scale): x [b, s..,
// c] viewed as [b, S, G, c / G] (S the spatial dims merged), each (sample,
// group) normalized over its S * c / G values by NORM (on a [b, G, S * c /
// G] transpose), back to x's shape, then * gamma[c] and + beta[c]. A split
// channel dim splits the groups.
static Node *build_group_norm(Graph *g, Layer *l, Node *x) {
  int r = x->shape.rank;
  if (r < 2)
    error_at(l->loc, "layer '%s': GroupNormalization needs an input of rank 2 or more, got %s",
             l->name, kshape(&x->shape));
  if (cfg_axes(l, x, "axis", 1) != 1u << (r - 1))
    error_at(jloc_key(l->cfg, "axis"), "layer '%s': GroupNormalization over another axis than "
             "the last is not supported", l->name);
  int64_t c = x->shape.d[r - 1], groups = cfg_size(l, "groups", 32), b = x->shape.d[0];
  if (c % groups)
    error_at(jloc_key(l->cfg, "groups"), "layer '%s': groups=%lld must divide the channels "
             "(%lld)", l->name, (long long)groups, (long long)c);
  int64_t sp = shape_elems(&x->shape) / (b * c), cg = c / groups;
  Node *v = view(g, x, (Shape){4, {b, sp, groups, cg}});
  Node *t = new_node1(g, OP_TRANSPOSE, v, (Shape){4, {b, groups, sp, cg}});
  t->perm = (PermAttr){{0, 2, 1, 3}};
  Node *y = new_node1(g, OP_NORM, view(g, t, (Shape){3, {b, groups, sp * cg}}),
                      (Shape){3, {b, groups, sp * cg}});
  y->norm = (NormAttr){false, (float)cfg_num(l, "epsilon", 1e-3)};
  Node *u = new_node1(g, OP_TRANSPOSE, view(g, y, t->shape), v->shape);
  u->perm = (PermAttr){{0, 2, 1, 3}};
  Node *o = view(g, u, x->shape);
  Shape cs = {1, {c}};
  if (cfg_bool(l, "scale", true))
    o = new_node2(g, OP_COL_MUL, o, new_var(g, l, "gamma", cs, "gamma_initializer", "ones"),
                  x->shape);
  if (cfg_bool(l, "center", true))
    o = new_node2(g, OP_BIAS, o, new_var(g, l, "beta", cs, "beta_initializer", "zeros"),
                  x->shape);
  return o;
}

// PReLU(alpha_initializer, shared_axes): relu(x) + -alpha * relu(-x), as
// Keras computes it; alpha [x's sample dims, 1 on the shared axes] (its
// regularizer and constraint are alpha_'s), broadcast over those axes and
// the batch.
static Node *build_prelu(Graph *g, Layer *l, Node *x) {
  int r = x->shape.rank;
  if (r < 2)
    error_at(l->loc, "layer '%s': PReLU needs an input of rank 2 or more, got %s", l->name,
             kshape(&x->shape));
  json_t *sj = json_object_get(l->cfg, "shared_axes");
  unsigned shared = sj && !json_is_null(sj) ? cfg_axes(l, x, "shared_axes", 1) : 0;
  Shape as = {r - 1, {0}}, cs = {0, {0}};
  for (int d = 1; d < r; d++) {
    as.d[d - 1] = (shared >> d) & 1 ? 1 : x->shape.d[d];
    if (!((shared >> d) & 1)) cs.d[cs.rank++] = x->shape.d[d];
  }
  Node *a = new_var(g, l, "alpha", as, "alpha_initializer", "zeros");
  if (shared) a = view(g, a, cs);
  for (int d = 1; d < r; d++)
    if ((shared >> d) & 1) {
      Shape t = a->shape;
      memmove(t.d + d, t.d + d - 1, (size_t)(t.rank++ - (d - 1)) * sizeof *t.d);
      t.d[d - 1] = x->shape.d[d];
      a = bcast_dim(g, a, &t, d - 1);
    }
  Node *neg = apply_act(g, scaled(g, x, -1), ACT_RELU);
  Node *an = new_node2(g, OP_COL_MUL, neg, scaled(g, a, -1), x->shape);
  Node *sum[2] = {apply_act(g, x, ACT_RELU), an};
  Node *y = new_node(g, OP_ADD, 2, sum);
  y->shape = x->shape;
  return y;
}

// RepeatVector(n): x[b, f] -> [b, n, f].
static Node *build_repeat_vector(Graph *g, Layer *l, Node *x) {
  if (x->shape.rank != 2)
    error_at(l->loc, "layer '%s': RepeatVector needs an input of rank 2, got %s", l->name,
             kshape(&x->shape));
  Shape s = {3, {x->shape.d[0], cfg_size(l, "n", -1), x->shape.d[1]}};
  if (s.d[1] <= 0) error_at(jloc_key(l->cfg, "n"), "layer '%s': 'n' must be positive", l->name);
  return bcast_dim(g, x, &s, 1);
}

// ActivityRegularization(l1, l2): x, and its penalty in the loss as an
// activity regularizer's (over the batch).
static Node *build_activity_reg(Graph *g, Layer *l, Node *x) {
  batch_penalty(g, x, cfg_num(l, "l1", 0), cfg_num(l, "l2", 0));
  return x;
}

// SpatialDropout1D/2D(rate): one draw per sample and channel, kept or
// dropped over every step: the mask is DROPOUT of a [b, c] FILL of ones,
// broadcast over the spatial dims, times x.
static Node *build_spatial_dropout(Graph *g, Layer *l, Node *x) {
  int n = strstr(l->cls, "1D") ? 1 : 2;
  if (n == 2) check_channels_last(l);
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d, got %s", l->name, l->cls, n + 2,
             kshape(&x->shape));
  double rate = dropout_rate(l);
  if (rate == 0) return x;
  Node *m = new_node(g, OP_FILL, 0, NULL);
  m->shape = (Shape){2, {x->shape.d[0], x->shape.d[n + 1]}};
  m->aff = (AffAttr){0, 1};
  m = new_node1(g, OP_DROPOUT, m, m->shape);
  m->drop = (DropAttr){(float)rate, hash_str(l->path), false};
  for (int d = 1; d <= n; d++) {
    Shape t = m->shape;
    memmove(t.d + d + 1, t.d + d, (size_t)(t.rank++ - d) * sizeof *t.d);
    t.d[d] = x->shape.d[d];
    m = bcast_dim(g, m, &t, d);
  }
  return new_node2(g, OP_MUL, x, m, x->shape);
}

// GaussianNoise(stddev): x + stddev * z; GaussianDropout(rate): x * (1 +
// sqrt(rate / (1 - rate)) * z), Keras's normal of mean 1; z a standard
// normal per element and step (NOISE), in training only.
static Node *noise(Graph *g, Layer *l, Node *x, double stddev, bool mul) {
  if (stddev == 0) return x;
  Node *y = new_node1(g, OP_NOISE, x, x->shape);
  y->drop = (DropAttr){(float)stddev, hash_str(l->path), mul};
  return y;
}

static Node *build_gaussian_noise(Graph *g, Layer *l, Node *x) {
  double s = cfg_num(l, "stddev", -1);
  if (!(s >= 0) || s > FLT_MAX)
    error_at(jloc_key(l->cfg, "stddev"), "layer '%s': 'stddev' must be a number of 0 or more",
             l->name);
  return noise(g, l, x, s, false);
}

static Node *build_gaussian_dropout(Graph *g, Layer *l, Node *x) {
  double rate = dropout_rate(l);
  return noise(g, l, x, sqrt(rate / (1 - rate)), true);
}

// A number or nested lists of numbers (a config's array): its shape into
// *s and its elements, row-major, into out (NULL: count only); returns the
// count, or -1 when it is ragged, too deep or not finite numbers.
static int64_t json_array_floats(json_t *v, Shape *s, int depth, float *out) {
  if (json_is_number(v)) {
    if (depth == 0) s->rank = 0;
    double x = json_number_value(v);
    if (!isfinite(x) || fabs(x) > FLT_MAX) return -1;
    if (out) *out = (float)x;
    return 1;
  }
  if (!json_is_array(v) || depth >= MAX_RANK || json_array_size(v) == 0) return -1;
  if (depth == 0) s->rank = 0;
  int64_t n = (int64_t)json_array_size(v);
  if (s->rank == depth) s->d[s->rank++] = n;
  else if (s->rank < depth || s->d[depth] != n) return -1;
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t k = json_array_floats(json_array_get(v, (size_t)i), s, depth + 1,
                                  out ? out + total : NULL);
    if (k < 0 || (json_is_number(json_array_get(v, (size_t)i)) != (s->rank == depth + 1)))
      return -1;
    total += k;
  }
  return total;
}

// Normalization(axis, mean, variance, invert) with its statistics in the
// config: (x - mean) / max(sqrt(variance), 1e-7), or (invert) mean + x *
// that, Keras's formula, as a BIAS and a COL_MUL by constants over x's
// sample dims (computed here in float32 as Keras does; a multiplication by
// the reciprocal where Keras divides: within an ulp). mean and variance
// align with the kept axes from the right, a 1 broadcast, as Keras's build.
static Node *build_normalization(Graph *g, Layer *l, Node *x) {
  json_t *mj = json_object_get(l->cfg, "mean"), *vj = json_object_get(l->cfg, "variance");
  if (!mj || json_is_null(mj) || !vj || json_is_null(vj))
    error_at(mj && !json_is_null(mj) ? jloc(mj) : l->loc, "layer '%s': Normalization without "
             "its mean and variance in the config (adapted, kept as weights) is not supported",
             l->name);
  int r = x->shape.rank;
  json_t *aj = json_object_get(l->cfg, "axis");
  unsigned keep = aj && json_is_array(aj) && !json_array_size(aj) ? 0
                : aj && json_is_null(aj) ? 0 : cfg_axes(l, x, "axis", 1);
  int kept[MAX_RANK], nk = 0;
  for (int d = 1; d < r; d++)
    if ((keep >> d) & 1) kept[nk++] = d;
  Shape ms = {0}, vs = {0};
  int64_t nm = json_array_floats(mj, &ms, 0, NULL), nv = json_array_floats(vj, &vs, 0, NULL);
  if (nm < 0 || nv < 0 || !shape_eq(&ms, &vs) || ms.rank > nk)
    error_at(jloc(nm < 0 ? mj : vj), "layer '%s': mean and variance must be finite numbers or "
             "lists of them, of one shape, of rank at most the %d kept axes", l->name, nk);
  for (int i = 1; i <= ms.rank; i++)
    if (ms.d[ms.rank - i] != 1 && ms.d[ms.rank - i] != x->shape.d[kept[nk - i]])
      error_at(jloc(mj), "layer '%s': mean and variance of shape %s do not fit the kept axes "
               "of %s", l->name, shape_str(&ms), kshape(&x->shape));
  float *mean = xcalloc((size_t)nm, sizeof *mean), *var = xcalloc((size_t)nm, sizeof *var);
  json_array_floats(mj, &ms, 0, mean);
  json_array_floats(vj, &vs, 0, var);
  Shape cs = drop_dim(&x->shape, 0);
  int64_t n = shape_elems(&cs);
  float *shift = xcalloc((size_t)n, sizeof *shift), *mul = xcalloc((size_t)n, sizeof *mul);
  bool invert = cfg_bool(l, "invert", false);
  for (int64_t e = 0; e < n; e++) {
    int64_t idx[MAX_RANK], rest = e, at = 0, stride = 1;
    for (int d = r - 1; d >= 1; d--) idx[d] = rest % x->shape.d[d], rest /= x->shape.d[d];
    for (int i = 1; i <= ms.rank; i++) { // the statistic's element for this sample element
      int64_t ext = ms.d[ms.rank - i];
      at += (ext == 1 ? 0 : idx[kept[nk - i]]) * stride;
      stride *= ext;
    }
    float den = fmaxf(sqrtf(var[at]), 1e-7f);
    shift[e] = invert ? mean[at] : -mean[at];
    mul[e] = invert ? den : 1.0f / den;
  }
  Node *k[2];
  for (int i = 0; i < 2; i++) {
    k[i] = new_node(g, OP_CONST, 0, NULL);
    k[i]->shape = cs;
    k[i]->cst.data = i ? mul : shift;
    k[i]->has_want = true;
    k[i]->want = place_replicated();
  }
  if (invert) return new_node2(g, OP_BIAS, new_node2(g, OP_COL_MUL, x, k[1], x->shape), k[0],
                               x->shape);
  return new_node2(g, OP_COL_MUL, new_node2(g, OP_BIAS, x, k[0], x->shape), k[1], x->shape);
}

// ---- issue 11: recurrent layers
// SimpleRNN, LSTM and GRU as Keras 3 computes them (gates i, f, c, o and z,
// r, h; GRU's reset_after): the input projection of every step at once,
// xw = x . kernel + bias (a DOT and a BIAS, sharded as a Dense is), then
// the recurrence as one RECUR op (ops.c: a loop over the steps in the
// program; its record, runtime/kdrt_rnn.h, holds h); go_backwards reverses the steps first, and the output is in
// the order processed, as Keras's. The variables as Keras names them:
// <layer>/<cell>/kernel [F, G*U], recurrent_kernel [U, G*U], bias [G*U]
// (GRU reset_after: [2, 3U], the input bias and the recurrent one), which
// its weights file keeps under layers/<layer>/cell/vars (weights_sublayer).

static const struct {
  const char *cls, *cell;
  int kind;
} rnn_classes[] = {
  {"SimpleRNN", "simple_rnn_cell", KDRT_RNN_SIMPLE},
  {"LSTM", "lstm_cell", KDRT_RNN_LSTM},
  {"GRU", "gru_cell", KDRT_RNN_GRU},
};

static int rnn_class(const char *cls) {
  for (int i = 0; i < (int)(sizeof rnn_classes / sizeof *rnn_classes); i++)
    if (!strcmp(rnn_classes[i].cls, cls)) return i;
  return -1;
}

// An activation of a cell: any elementwise one (softmax is not).
static Act rnn_act(Layer *c, const char *key, Act def) {
  json_t *j = json_object_get(c->cfg, key);
  Act a = j ? parse_act(c, key) : def;
  if (a == ACT_SOFTMAX)
    error_at(jloc(j), "layer '%s': %s 'softmax' is not supported in a recurrent cell (only "
             "elementwise activations)", c->name, key);
  return a;
}

// What kdcc does not do of a recurrent layer's options: an error naming it.
static void rnn_refuse(Layer *c, const char *cls) {
  if (cfg_bool(c, "return_state", false))
    error_at(jloc_key(c->cfg, "return_state"), "layer '%s': %s return_state=True is not "
             "supported (a layer gives one output)", c->name, cls);
  if (cfg_bool(c, "stateful", false))
    error_at(jloc_key(c->cfg, "stateful"), "layer '%s': %s stateful=True is not supported "
             "(every batch starts from a zero state)", c->name, cls);
  static const char *const rates[] = {"dropout", "recurrent_dropout"};
  for (int i = 0; i < 2; i++)
    if (cfg_num(c, rates[i], 0) != 0)
      error_at(jloc_key(c->cfg, rates[i]), "layer '%s': %s %s > 0 is not supported yet", c->name,
               cls, rates[i]);
}

// One recurrent layer on x[B, T, F] from the config of c, a copy of the
// layer that owns the variables with the recurrent layer's config (itself,
// or a Bidirectional's forward or backward layer, whose variables are
// named under `prefix`); flip: its steps go the other way (a
// Bidirectional's backward layer made from the forward one's config).
static Node *recurrent(Graph *g, Layer *c, const char *cls, const char *prefix, bool flip,
                       Node *x) {
  int k = rnn_class(cls);
  rnn_refuse(c, cls);
  int cell = rnn_classes[k].kind;
  if (cell == KDRT_RNN_GRU && !cfg_bool(c, "reset_after", true)) cell = KDRT_RNN_GRU_V1;
  if (x->shape.rank != 3)
    error_at(c->loc, "layer '%s': %s needs an input of rank 3 (batch, steps, features), got %s",
             c->name, cls, kshape(&x->shape));
  int64_t B = x->shape.d[0], T = x->shape.d[1], F = x->shape.d[2];
  int64_t U = cfg_size(c, "units", -1), GU = size_mul(kdrt_rnn_gates(cell), U);
  if (U <= 0) error_at(jloc_key(c->cfg, "units"), "layer '%s': 'units' must be positive", c->name);
  if (size_mul(size_mul(F, GU), 8) > MAX_ELEMS || kdrt_rnn_width(cell, U) > MAX_DIM)
    error_at(jloc_key(c->cfg, "units"), "layer '%s': %lld units make tensors over kdcc's "
             "limits", c->name, (long long)U);
  RecurAttr ra = {cell, rnn_act(c, "activation", ACT_TANH),
                  cell == KDRT_RNN_SIMPLE ? ACT_SIGMOID
                                          : rnn_act(c, "recurrent_activation", ACT_SIGMOID), U};
  if (cfg_bool(c, "go_backwards", false) != flip) {
    x = new_node1(g, OP_REVERSE, x, x->shape);
    x->red.dim = 1;
  }
  const char *cn = format("%s%s", prefix, rnn_classes[k].cell);
  Node *w = new_var(g, c, format("%s/kernel", cn), (Shape){2, {F, GU}}, "kernel_initializer",
                    "glorot_uniform");
  Node *r = new_var(g, c, format("%s/recurrent_kernel", cn), (Shape){2, {U, GU}},
                    "recurrent_initializer", "orthogonal");
  Node *xw = dot_node(g, x, w, 0, 1, false), *in[3] = {xw, r, NULL};
  if (cfg_bool(c, "use_bias", true)) {
    bool gru = cell == KDRT_RNN_GRU; // reset_after: a recurrent bias too
    Node *b = new_var(g, c, format("%s/bias", cn), gru ? (Shape){2, {2, GU}} : (Shape){1, {GU}},
                      "bias_initializer", "zeros");
    if (cell == KDRT_RNN_LSTM && cfg_bool(c, "unit_forget_bias", true)) {
      // Keras's bias_initializer for the i and c, o gates, ones for f
      if (b->var->init != KDRT_INIT_ZEROS)
        error_at(jloc_key(c->cfg, "bias_initializer"), "layer '%s': unit_forget_bias with a "
                 "bias_initializer other than zeros is not supported", c->name);
      b->var->init = KDRT_INIT_UNIT_FORGET;
      b->var->p0 = (float)U;
    }
    for (int i = 0; i < 1 + gru; i++) { // GRU: bias[0] the input's, bias[1] the recurrent's
      Node *bi = b;
      if (gru) {
        Node *s = new_node1(g, OP_SLICE, b, (Shape){2, {1, GU}});
        s->cat = (CatAttr){0, i};
        bi = view(g, s, (Shape){1, {GU}});
      }
      if (i == 0) xw = in[0] = new_node2(g, OP_BIAS, xw, bi, xw->shape);
      else in[2] = bi;
    }
  }
  Node *y = new_node(g, OP_RECUR, in[2] ? 3 : 2, in);
  y->shape = (Shape){3, {B, T, kdrt_rnn_width(cell, U)}};
  y->rec = ra;
  Node *h = new_node1(g, OP_SLICE, y, (Shape){3, {B, T, U}});
  h->cat = (CatAttr){2, 0};
  if (cfg_bool(c, "return_sequences", false)) return h;
  Node *last = new_node1(g, OP_SLICE, h, (Shape){3, {B, 1, U}});
  last->cat = (CatAttr){1, T - 1};
  return view(g, last, (Shape){2, {B, U}});
}

static Node *build_rnn(Graph *g, Layer *l, Node *x) { return recurrent(g, l, l->cls, "", false, x); }

// Bidirectional(layer, merge_mode, backward_layer): the forward layer and
// the backward one (go_backwards) on the same input, the backward one's
// sequence reversed back, then merged: concat (the default), sum, ave or
// mul. Their variables are the Bidirectional's, as Keras names them:
// <name>/forward_<layer>/<cell>/kernel, ... (weights file:
// layers/<name>/forward_layer/cell/vars).
static Node *build_bidirectional(Graph *g, Layer *l, Node *x) {
  const char *mode = cfg_str(l, "merge_mode", "concat");
  json_t *mj = json_object_get(l->cfg, "merge_mode");
  if (mj && json_is_null(mj))
    error_at(jloc(mj), "layer '%s': Bidirectional merge_mode None (two outputs) is not "
             "supported", l->name);
  json_t *env[2] = {json_object_get(l->cfg, "layer"), json_object_get(l->cfg, "backward_layer")};
  Layer in[2];
  Node *y[2];
  for (int i = 0; i < 2; i++) {
    json_t *e = env[i] && !json_is_null(env[i]) ? env[i] : env[0]; // no backward_layer: the layer's
    json_t *cn = json_object_get(e, "class_name"), *cfg = json_object_get(e, "config");
    if (!json_is_string(cn) || !json_is_object(cfg) || rnn_class(json_string_value(cn)) < 0)
      error_at(e ? jloc(e) : l->loc, "layer '%s': Bidirectional wraps a SimpleRNN, LSTM or GRU "
               "only", l->name);
    in[i] = *l; // frozen as its model is, else by its own flag: Keras's from_config
                // leaves the wrapped layers' flags in charge, not the Bidirectional's
    in[i].cfg = cfg;
    in[i].loc = jloc(e);
    in[i].sub = i ? "backward_layer/cell" : "forward_layer/cell";
    static const char *const no[] = {"activity_regularizer"};
    check_none(&in[i], no, 1);
    const char *name = cfg_str(&in[i], "name", "");
    if (name_flaw(name))
      error_at(jloc_key(cfg, "name"), "layer '%s': bad name '%s' of its %s layer: %s", l->name,
               name, i ? "backward" : "forward", NAME_RULE);
    if (e == env[0] && i) { // Keras's backward layer: the forward one's config, named backward_
      const char *base = strncmp(name, "forward_", 8) ? name : name + 8;
      name = format("backward_%s", base);
    }
    y[i] = recurrent(g, &in[i], json_string_value(cn), format("%s/", name), i && e == env[0],
                     x);
  }
  if (cfg_bool(&in[0], "go_backwards", false) == cfg_bool(&in[1], "go_backwards", false) &&
      env[1] && !json_is_null(env[1]))
    error_at(jloc(env[1]), "layer '%s': the forward and backward layers must differ in "
             "go_backwards", l->name);
  bool seq = cfg_bool(&in[0], "return_sequences", false);
  if (seq != cfg_bool(&in[1], "return_sequences", false) || !shape_eq(&y[0]->shape, &y[1]->shape))
    error_at(l->loc, "layer '%s': the forward and backward layers must give the same shape",
             l->name);
  if (seq) {
    Node *rv = new_node1(g, OP_REVERSE, y[1], y[1]->shape);
    rv->red.dim = 1;
    y[1] = rv;
  }
  Shape s = y[0]->shape;
  if (!strcmp(mode, "concat")) {
    s.d[s.rank - 1] *= 2;
    Node *c = new_node(g, OP_CONCAT, 2, y);
    c->shape = s;
    c->cat.axis = s.rank - 1;
    return c;
  }
  if (!strcmp(mode, "mul")) return new_node2(g, OP_MUL, y[0], y[1], s);
  Node *sum = new_node(g, OP_ADD, 2, y);
  sum->shape = s;
  if (!strcmp(mode, "sum")) return sum;
  if (strcmp(mode, "ave"))
    error_at(jloc(mj), "layer '%s': unknown merge_mode '%s'", l->name, mode);
  Node *ave = new_node1(g, OP_SCALE, sum, s);
  ave->aff = (AffAttr){0.5f, 0};
  return ave;
}

// The Keras layers kdcc builds: class name, how many inputs a call takes
// (-1: two or more), and the builder that makes its ops from its first
// input (merges read all of theirs). load.c accepts exactly these classes.
typedef struct {
  const char *cls;
  int nin;
  Node *(*build)(Graph *g, Layer *l, Node *x);
} LayerDef;

static const LayerDef layer_defs[] = {
  {"InputLayer", 0, build_input},
  {"Dense", 1, build_dense},
  {"EinsumDense", 1, build_einsum_dense},
  {"Embedding", 1, build_embedding},
  {"ReversibleEmbedding", 1, build_reversible_embedding},
  {"Conv2D", 1, build_conv2d},
  {"Conv1D", 1, build_conv1d}, // issue 11
  {"DepthwiseConv2D", 1, build_depthwise},
  {"SeparableConv2D", 1, build_separable},
  {"Conv2DTranspose", 1, build_conv2d_transpose},
  {"MaxPooling2D", 1, build_maxpool},
  {"Activation", 1, build_activation},
  {"Softmax", 1, build_softmax},
  {"Flatten", 1, build_flatten},
  {"Reshape", 1, build_reshape},
  {"Permute", 1, build_permute},
  {"Dropout", 1, build_dropout},
  {"Rescaling", 1, build_rescaling},
  {"GlobalAveragePooling1D", 1, build_gap1d},
  {"LayerNormalization", 1, build_layernorm},
  {"RMSNormalization", 1, build_rmsnorm},
  {"MultiHeadAttention", -2, build_mha},
  {"GroupedQueryAttention", -2, build_gqa},
  {"GroupQueryAttention", -2, build_gqa},
  {"PositionEmbedding", 1, build_position_embedding},
  {"Add", -1, build_add},
  {"Multiply", -1, build_add},
  {"Concatenate", -1, build_concat},
  // issue 11
  {"ReLU", 1, build_relu_layer},
  {"LeakyReLU", 1, build_leaky_relu},
  {"ELU", 1, build_elu_layer},
  {"GlobalAveragePooling2D", 1, build_gap2d},
  {"ZeroPadding1D", 1, build_zeropad1d},
  {"ZeroPadding2D", 1, build_zeropad2d},
  {"Cropping1D", 1, build_crop1d},
  {"Cropping2D", 1, build_crop2d},
  {"GlobalMaxPooling1D", 1, build_global_maxpool},
  {"GlobalMaxPooling2D", 1, build_global_maxpool},
  {"MaxPooling1D", 1, build_maxpool1d},
  {"AveragePooling1D", 1, build_avgpool},
  {"AveragePooling2D", 1, build_avgpool},
  {"UpSampling1D", 1, build_upsample},
  {"UpSampling2D", 1, build_upsample},
  {"BatchNormalization", 1, build_batchnorm},
  // issue 11: the remaining non-recurrent layers
  {"Subtract", -1, build_add},
  {"Average", -1, build_add},
  {"Maximum", -1, build_add},
  {"Minimum", -1, build_add},
  {"Dot", -1, build_dot},
  {"UnitNormalization", 1, build_unit_norm},
  {"GroupNormalization", 1, build_group_norm},
  {"PReLU", 1, build_prelu},
  {"RepeatVector", 1, build_repeat_vector},
  {"ActivityRegularization", 1, build_activity_reg},
  {"SpatialDropout1D", 1, build_spatial_dropout},
  {"SpatialDropout2D", 1, build_spatial_dropout},
  {"GaussianNoise", 1, build_gaussian_noise},
  {"GaussianDropout", 1, build_gaussian_dropout},
  {"DepthwiseConv1D", 1, build_depthwise1d},
  {"SeparableConv1D", 1, build_separable1d},
  {"Conv1DTranspose", 1, build_conv1d_transpose},
  {"Normalization", 1, build_normalization},
  // issue 11: recurrent layers
  {"SimpleRNN", 1, build_rnn},
  {"LSTM", 1, build_rnn},
  {"GRU", 1, build_rnn},
  {"Bidirectional", 1, build_bidirectional},
};

// nin -2: several inputs, but not a merge (attention: query, value, key).
static const LayerDef *layer_def(const char *cls) {
  for (size_t i = 0; i < sizeof layer_defs / sizeof *layer_defs; i++)
    if (!strcmp(layer_defs[i].cls, cls)) return &layer_defs[i];
  return NULL;
}

bool layer_known(const char *cls) { return layer_def(cls) != NULL; }
bool layer_takes_several(const char *cls) {
  const LayerDef *d = layer_def(cls);
  return d && d->nin < 0;
}

static Node *build_layer(Graph *g, Layer *l) {
  const LayerDef *def = layer_def(l->cls);
  if (!def) error_at(l->loc, "layer '%s': unknown layer class '%s'", l->name, l->cls);
  if (def->nin == 0) return def->build(g, l, NULL);
  if (l->nin == 0) error_at(l->loc, "layer '%s' has no input", l->name);
  if (def->nin == -2) return def->build(g, l, NULL);
  if (def->nin > 0 && l->nin != def->nin)
    error_at(l->loc, "layer '%s': %s takes one input, got %d", l->name, l->cls, l->nin);
  return def->build(g, l, layer_input(l, 0));
}

// Keras maps hinge labels 0/1 to -1/1 when every label of the step is 0
// or 1: the test is over the global batch (a max over its rows).
static Node *not_binary(Graph *g, Node *y, const char *layer, Loc loc) {
  Node *nb = new_node1(g, OP_NOT_BINARY, y, (Shape){0});
  nb->name = format("%s not 0/1", y->name);
  nb->layer = layer;
  nb->loc = loc;
  return nb;
}

// Metric mt of output i (prediction p, labels y), logged under its name:
// an accuracy is a METRIC (XENT_ACC from the row maxima of a crossentropy
// from logits); a loss function as a metric is a LOSS node marked metric,
// never differentiated nor in the total. "accuracy" resolves as Keras
// does: binary for one output unit, sparse categorical for class-id
// labels, categorical otherwise. The labels are the loss's, so a metric
// that needs the other kind is an error.
static void build_metric(Graph *g, int i, const Metric *mt, Node *p, Node *y, Node *rowmax,
                         int64_t rows, const char *prefix) {
  const OutLoss *ol = &g->model->losses[i];
  const char *out = g->model->outputs[i].layer->name;
  bool sparse = ol->kind == LOSS_SCCE;
  int64_t units = p->shape.d[p->shape.rank - 1];
  MetricKind k = mt->kind;
  if (k == MET_ACCURACY) k = units == 1 ? MET_BINARY_ACC : sparse ? MET_SPARSE_ACC : MET_CAT_ACC;
  bool wants_sparse = k == MET_SPARSE_ACC || (k == MET_LOSS && mt->loss == LOSS_SCCE);
  if (wants_sparse != sparse)
    error_at(mt->loc, "metric '%s' of output '%s' needs %s, but its loss '%s' takes %s", mt->name,
             out, wants_sparse ? "class-id labels" : "labels shaped like the output",
             loss_name(ol->kind), sparse ? "class ids" : "labels shaped like the output");
  if (k == MET_BINARY_ACC && units != 1)
    error_at(mt->loc, "metric '%s' of output '%s': binary accuracy over %lld units is not "
             "supported (only one)", mt->name, out, (long long)units);
  LossAttr la = {.from_logits = ol->from_logits, .weight = 1.0 / (double)rows, .num = 1, .lw = 1};
  Node *n;
  if (k == MET_LOSS) {
    Node *args[3] = {p, y, NULL};
    if (mt->loss == LOSS_HINGE || mt->loss == LOSS_SQUARED_HINGE)
      args[2] = not_binary(g, y, out, mt->loc);
    n = new_node(g, OP_LOSS, args[2] ? 3 : 2, args);
    la.kind = mt->loss;
    la.from_logits = mt->from_logits;
    la.metric = true;
  } else if (k == MET_SPARSE_ACC && rowmax) {
    Node *args[3] = {p, y, rowmax};
    n = new_node(g, OP_XENT_ACC, 3, args);
    la.kind = LOSS_SCCE;
  } else {
    n = new_node2(g, OP_METRIC, p, y, (Shape){0});
    la.kind = k == MET_BINARY_ACC ? LOSS_BCE : k == MET_SPARSE_ACC ? LOSS_SCCE : LOSS_CCE;
  }
  n->loss = la;
  n->shape = (Shape){0};
  n->index = i;
  n->loc = mt->loc;
  n->layer = out;
  n->name = format("%s%s", prefix, mt->name);
  for (int j = 0; j < g->nlogs; j++)
    if (!strcmp(g->logs[j].name, n->name))
      error_at(mt->loc, "metric '%s' of output '%s' would be logged as '%s', a name another log "
               "has", mt->name, out, n->name);
  g->logs = xgrow(g->logs, g->nlogs, &(int){g->nlogs}, sizeof *g->logs);
  g->logs[g->nlogs++] = (Log){n->name, n};
}

// The loss, metric and label of output i (prediction p), and their logs.
// Keras averages a loss over every row (each sample, or each token of a
// [b, t, classes] prediction): each op's weight is one over the global
// number of rows. An output's own log is its unweighted loss, as Keras
// logs it; the total ("loss") weighs each by its loss weight. A sparse crossentropy from logits is made of
// row statistics (ops.c's XENT), so that a split class dim is never
// gathered.
static void build_loss(Graph *g, int i, Node *p, const char *prefix) {
  const OutLoss *ol = &g->model->losses[i];
  const Layer *out = g->model->outputs[i].layer;
  if (p->dtype != DT_F32)
    error_at(ol->loc, "output '%s' holds integer ids: it cannot have a loss", out->name);
  Shape ys = p->shape;
  if (ol->kind == LOSS_SCCE) ys.rank--;
  if (ys.rank == 0) error_at(ol->loc, "output '%s': a sparse loss needs a class dim", out->name);
  Node *y = new_node(g, OP_LABEL, 0, NULL);
  y->shape = ys;
  y->index = g->nlabels;
  y->name = g->model->noutputs == 1 ? "labels" : format("labels(%s)", out->name);
  y->has_want = true;
  y->want = place_replicated();
  y->want.axis[0] = g->dist->batch_axis;
  g->labels = xgrow(g->labels, g->nlabels, &(int){g->nlabels}, sizeof *g->labels);
  g->labels[g->nlabels++] = y;

  int64_t rows = p->shape.rank > 1 ? shape_elems(&p->shape) / p->shape.d[p->shape.rank - 1]
                                   : p->shape.d[0];
  LossAttr la = {ol->kind, ol->from_logits, ol->param, .weight = 1.0 / (double)rows, .num = 1,
                 .lw = ol->weight};
  // issue 11: a loss's axis is the last one (the only one kdcc reduces over)
  if (ol->axis != -1 && ol->axis != p->shape.rank - 1)
    error_at(ol->axis_loc, "loss '%s' of output '%s': axis %d is not supported (only the last "
             "axis, -1)", loss_name(ol->kind), out->name, ol->axis);
  // label_smoothing, as Keras smooths the labels before the loss:
  // categorical y (1 - s) + s / classes, binary y (1 - s) + s / 2 (the
  // metric sees the labels as they are)
  Node *yl = y;
  if (ol->label_smoothing != 0) {
    float ls = (float)ol->label_smoothing;
    yl = new_node1(g, OP_SCALE, y, y->shape);
    yl->aff = (AffAttr){(float)(1.0 - ol->label_smoothing),
                        ol->kind == LOSS_CCE ? ls / (float)ys.d[ys.rank - 1]
                                             : (float)(0.5 * ol->label_smoothing)};
    yl->name = format("%s, smoothed", y->name);
  }
  Node *loss, *rowmax = NULL;
  bool xent = ol->kind == LOSS_SCCE && ol->from_logits;
  Shape rs = ys;
  if (xent) { // row statistics, then the loss from them
    Node *m = rowmax = new_node1(g, OP_ROW_MAX, p, rs);
    Node *sx[2] = {p, m};
    Node *s = new_node(g, OP_ROW_SUMEXP, 2, sx);
    s->shape = rs;
    m->layer = s->layer = out->name;
    m->loc = s->loc = ol->loc;
    Node *args[4] = {p, y, m, s};
    loss = new_node(g, OP_XENT, 4, args);
  } else {
    Node *args[3] = {p, yl, NULL};
    if (ol->kind == LOSS_HINGE || ol->kind == LOSS_SQUARED_HINGE)
      args[2] = not_binary(g, y, out->name, ol->loc);
    loss = new_node(g, OP_LOSS, args[2] ? 3 : 2, args);
  }
  loss->shape = (Shape){0};
  loss->loss = la;
  loss->index = i;
  loss->loc = ol->loc;
  loss->layer = out->name;
  loss->name = format("%sloss", prefix);
  g->logs = xgrow(g->logs, g->nlogs, &(int){g->nlogs}, sizeof *g->logs);
  g->logs[g->nlogs++] = (Log){loss->name, loss};
  for (int k = 0; k < ol->nmetrics; k++)
    build_metric(g, i, &ol->metrics[k], p, y, rowmax, rows, prefix);
}

Graph *build_graph(Model *m, Dist *d, int batch) {
  Graph *g = xcalloc(1, sizeof *g);
  g->model = m;
  g->dist = d;
  g->batch = batch;
  g->phase = PH_FORWARD;
  int ba = d->batch_axis;
  if (ba >= 0 && batch % d->mesh.shape[ba]) // at the axis's size (none: --mesh gave it)
    error_at(d->mesh.size_loc[ba], "batch size %d is not divisible by mesh axis '%s' (size %d%s),"
             " which splits the batch; use a --batch-size that is a multiple of %d", batch,
             d->mesh.names[ba], d->mesh.shape[ba], d->mesh.size_loc[ba].file ? "" : ", from --mesh",
             d->mesh.shape[ba]);

  const char **outs = xcalloc(m->nlayers, sizeof *outs);
  for (int i = 0; i < m->nlayers; i++) {
    Layer *l = m->layers[i];
    int first = g->nnodes;
    Node *y = build_layer(g, l);
    if (l->cls && strcmp(l->cls, "InputLayer")) activity_penalty(g, l, y);
    for (int k = first; k < g->nnodes; k++) { // every tensor within the limits (kdcc.h)
      const Shape *s = &g->nodes[k]->shape;
      for (int j = 0; j < s->rank; j++)
        if (s->d[j] > MAX_DIM)
          error_at(l->loc, "layer '%s': a tensor of shape %s: dimension %d is over %d, the most "
                   "kdcc supports", l->name, shape_str(s), j, MAX_DIM);
      if (shape_elems(s) > MAX_ELEMS)
        error_at(l->loc, "layer '%s': a tensor of shape %s (batch %d) holds more than 2^40 "
                 "elements, the most a tensor may hold", l->name, shape_str(s), batch);
    }
    for (int k = first; k < g->nnodes; k++) // name the layer's own nodes
      if (!g->nodes[k]->layer || g->nodes[k]->op != OP_PARAM) {
        g->nodes[k]->layer = l->name;
        g->nodes[k]->loc = l->loc;
      }
    if (y->op != OP_PARAM && (y->id >= first || y->op == OP_INPUT)) {
      y->name = format("%s/output", l->path);
      outs[i] = y->name;
      Place p;
      if (dist_lookup(d, y->name, l->name, y->shape.rank, y->shape.d, &p)) {
        y->has_want = true;
        y->want = p;
      }
    }
    l->node = y;
  }
  for (int i = 0; i < m->nbound; i++) { // what a nested model is called on: its inputs' shapes
    Layer *in = m->bound[i];
    const Node *given = in->bound->layer->node;
    if (!given) continue; // what feeds it was never built: no output reads this input
    const Shape *s = &given->shape;
    bool fits = s->rank == in->in_rank + 1;
    for (int j = 0; fits && j < in->in_rank; j++) fits = s->d[j + 1] == in->in_shape[j];
    if (!fits) {
      Shape want = {.rank = in->in_rank + 1, .d = {s->d[0]}};
      memcpy(want.d + 1, in->in_shape, sizeof(int64_t) * (size_t)in->in_rank);
      error_at(in->bound->loc, "nested model input '%s' has shape %s, but is given %s", in->name,
               kshape(&want), kshape(s));
    }
  }

  // inputs and labels are split along the batch over the batch axis
  g->inputs = xcalloc(m->ninputs, sizeof *g->inputs);
  for (int i = 0; i < m->ninputs; i++) {
    Node *x = m->inputs[i]->node;
    x->index = i;
    x->name = m->ninputs == 1 ? "input" : format("input(%s)", m->inputs[i]->name);
    x->has_want = true;
    x->want = place_replicated();
    x->want.axis[0] = d->batch_axis;
    g->inputs[g->ninputs++] = x;
  }
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->op == OP_INPUT && g->nodes[i]->index < 0)
      error_at(g->nodes[i]->loc, "InputLayer '%s' is not one of the model's inputs",
               g->nodes[i]->layer);
  g->outputs = xcalloc(m->noutputs, sizeof *g->outputs);
  for (int i = 0; i < m->noutputs; i++) g->outputs[g->noutputs++] = m->outputs[i].layer->node;

  // the losses: "loss" is their sum; each output's own log is "<output>_loss"
  // when there are several outputs
  g->phase = PH_LOSS;
  Node *total[65]; // the losses, and the penalty
  int nl = 0;
  for (int i = 0; i < m->noutputs; i++) {
    if (!m->losses[i].has) continue;
    if (nl == 64) error_at(m->losses[i].loc, "more than 64 losses");
    if (nl == 0) { // "loss" goes first
      g->logs = xgrow(g->logs, g->nlogs, &(int){g->nlogs}, sizeof *g->logs);
      g->logs[g->nlogs++] = (Log){"loss", NULL};
    }
    build_loss(g, i, g->outputs[i],
               m->noutputs == 1 ? "" : format("%s_", m->outputs[i].layer->name));
    for (int k = g->nlogs - 1; k >= 0; k--)
      if (g->logs[k].node && g->logs[k].node->index == i &&
          (g->logs[k].node->op == OP_LOSS || g->logs[k].node->op == OP_XENT) &&
          !g->logs[k].node->loss.metric) {
        total[nl++] = g->logs[k].node;
        break;
      }
  }
  // Keras's loss includes the regularizers' penalties (model.losses): the
  // activities' (made with their layers, frozen or not), then each trainable
  // variable's once
  for (int i = 0; i < g->nvars; i++)
    if (!g->vars[i]->frozen)
      add_penalty(g, penalty(g, g->vars[i]->param, g->vars[i]->l1, g->vars[i]->l2));
  if (!nl) g->penalty = NULL;
  if (m->noutputs == 1 && !g->penalty) { // the loss log is the loss itself
    g->logs[0].node = total[0];
    g->logs[0].node->name = "loss";
    memmove(g->logs + 1, g->logs + 2, (g->nlogs - 2) * sizeof *g->logs);
    g->nlogs--;
  } else if (m->noutputs == 1) { // the compiled loss plus the penalty, one log
    total[0]->name = "compiled_loss";
    g->logs[0].node = new_node2(g, OP_ADD, total[0], g->penalty, (Shape){0});
    g->logs[0].node->name = "loss";
    memmove(g->logs + 1, g->logs + 2, (g->nlogs - 2) * sizeof *g->logs);
    g->nlogs--;
  } else {
    if (g->penalty) total[nl++] = g->penalty;
    if (nl > MAX_IN) error_at(m->losses[0].loc, "more than %d losses", MAX_IN);
    for (int k = 0; k < nl; k++) // the loss weights, where not 1
      if (total[k]->loss.lw != 1) {
        Node *w = new_node1(g, OP_SCALE, total[k], (Shape){0});
        w->aff = (AffAttr){(float)total[k]->loss.lw, 0};
        w->name = format("%s * %g", total[k]->name, total[k]->loss.lw);
        total[k] = w;
      }
    Node *sum = nl == 1 ? total[0] : new_node(g, OP_ADD, nl, total);
    sum->shape = (Shape){0};
    if (nl > 1) sum->name = "loss";
    g->logs[0].node = sum;
  }

  const char **paths = xcalloc(g->nvars + m->nlayers, sizeof *paths);
  int np = 0;
  for (int i = 0; i < g->nvars; i++) paths[np++] = g->vars[i]->path;
  for (int i = 0; i < m->nlayers; i++)
    if (outs[i]) paths[np++] = outs[i];
  dist_warn_unused(d, paths, np);
  return g;
}

// The dims whose extent is the batch: dim 0 of the inputs and labels, and
// every dim that shares a factor of an op's rule with one of them, to a
// fixed point (the batch factor passes through activations and their
// gradients and is contracted away in weight gradients and losses). Their
// extents are the step's rows at run time (emit.c's Sym).
void find_batch_dims(Graph *g) {
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if ((n->op == OP_INPUT || n->op == OP_LABEL) && n->shape.rank > 0) n->bdims = 1;
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < g->nnodes; i++) {
      Node *n = g->nodes[i];
      Rule r;
      op_rule(n, &r);
      bool batch[MAX_FACTORS] = {false};
      for (int t = 0; t <= n->nin; t++) {
        const Node *x = t ? n->in[t - 1] : n;
        const int8_t *map = t ? r.in[t - 1] : r.out;
        for (int d = 0; d < x->shape.rank; d++)
          if (map[d] >= 0 && ((x->bdims >> d) & 1)) batch[map[d]] = true;
      }
      for (int t = 0; t <= n->nin; t++) {
        Node *x = t ? n->in[t - 1] : n;
        const int8_t *map = t ? r.in[t - 1] : r.out;
        for (int d = 0; d < x->shape.rank; d++)
          if (map[d] >= 0 && batch[map[d]] && !((x->bdims >> d) & 1)) {
            if (x->shape.d[d] != g->batch)
              error_at(x->loc, "layer '%s': a dim of extent %lld holds the batch merged with "
                       "other dims, which kdcc does not support", x->layer ? x->layer : "?",
                       (long long)x->shape.d[d]);
            x->bdims |= 1u << d;
            changed = true;
          }
      }
    }
  }
}
