// Layer builders: recurrent layers (SimpleRNN, LSTM, GRU) and Bidirectional.
//
// The input projection of every step is one DOT and BIAS, sharded as a
// Dense is; the recurrence is one RECUR op, whose step is written once for
// both runtimes (runtime/kdrt_rnn.h). A Bidirectional is its forward and
// backward layers on the same input, the backward one's steps reversed
// back, then merged.
#include "graph_build.h"
#include "../runtime/kdrt_rnn.h"

#include <string.h>

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
  if (a >= KDRT_ACT_COUNT)
    error_at(jloc(j), "layer '%s': %s '%s' is not supported in a recurrent cell (only "
             "elementwise activations)", c->name, key, act_name(a));
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
  if (cfg_bool(c, "go_backwards", false) != flip) x = make1(g, OP_REVERSE, x, .red.dim = 1);
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
        bi = view(g, make1(g, OP_SLICE, b, .cat = {0, i, 1}), (Shape){1, {GU}});
      }
      if (i == 0) xw = in[0] = make2(g, OP_BIAS, xw, bi);
      else in[2] = bi;
    }
  }
  Node *y = op_make(g, OP_RECUR, in[2] ? 3 : 2, in, &(Node){.rec = ra});
  Node *h = make1(g, OP_SLICE, y, .cat = {2, 0, U});
  if (cfg_bool(c, "return_sequences", false)) return h;
  Node *last = make1(g, OP_SLICE, h, .cat = {1, T - 1, 1});
  return view(g, last, (Shape){2, {B, U}});
}

Node *build_rnn(Graph *g, Layer *l, Node *x) { return recurrent(g, l, l->cls, "", false, x); }

// Bidirectional(layer, merge_mode, backward_layer): the forward layer and
// the backward one (go_backwards) on the same input, the backward one's
// sequence reversed back, then merged: concat (the default), sum, ave or
// mul. Their variables are the Bidirectional's, as Keras names them:
// <name>/forward_<layer>/<cell>/kernel, ... (weights file:
// layers/<name>/forward_layer/cell/vars).
Node *build_bidirectional(Graph *g, Layer *l, Node *x) {
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
    Node *rv = make1(g, OP_REVERSE, y[1], .red.dim = 1);
    y[1] = rv;
  }
  if (!strcmp(mode, "concat"))
    return make2(g, OP_CONCAT, y[0], y[1], .cat.axis = y[0]->shape.rank - 1);
  if (!strcmp(mode, "mul")) return make2(g, OP_MUL, y[0], y[1]);
  Node *sum = make2(g, OP_ADD, y[0], y[1]);
  if (!strcmp(mode, "sum")) return sum;
  if (strcmp(mode, "ave"))
    error_at(jloc(mj), "layer '%s': unknown merge_mode '%s'", l->name, mode);
  Node *ave = make1(g, OP_SCALE, sum, .aff = (AffAttr){0.5f, 0, NULL});
  return ave;
}
