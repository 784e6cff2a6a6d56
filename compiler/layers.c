// Layer builders: the table of Keras layers, and the layers of no family of
// their own (dense, embeddings, normalizations, activations, merges,
// reshapes, dropout and noise).
//
// Each Keras layer becomes a few ops of the op table (ops.c) on global
// shapes; shapes are inferred here, as the nodes are made, and every shape
// that does not fit is reported at the layer that caused it. layer_defs
// names the builder of every class kdcc accepts; the families with more
// code (layers_attn.c, layers_conv.c, layers_rnn.c) sit below this file,
// their shared helpers below them (vars.c), so that calls only go down.
// Invariant: nothing computes here; nodes are only made.
#include "graph_build.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- Dense

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
  Node *w = new_var(g, l, "kernel", (Shape){2, {k, units}}, "kernel_initializer",
                    "glorot_uniform");
  // x[.., k] . w[k, units]: every leading dim of x is a free dim
  Node *y = make2(g, OP_DOT, x, w, .dot = {.nb = 0, .nk = 1});
  y->layer = l->name;
  y->loc = l->loc;
  if (cfg_bool(l, "use_bias", true)) {
    Node *b = new_var(g, l, "bias", (Shape){1, {units}}, "bias_initializer", "zeros");
    y = make2(g, OP_BIAS, y, b);
  }
  return apply_act(g, y, parse_act(l, "activation"));
}

// ---- normalization

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
  Node *y = make1(g, OP_NORM, xm,
                  .norm = (NormAttr){rms, (float)cfg_num(l, "epsilon", 1e-3), false, false});
  if (k > 1) y = view(g, y, moved);
  if (cfg_bool(l, "scale", true) || rms) {
    Node *gam = new_var(g, l, "gamma", gs, "gamma_initializer", "ones");
    y = make2(g, OP_COL_MUL, y, gam);
  }
  if (cfg_bool(l, "center", true) && !rms) {
    Node *beta = new_var(g, l, "beta", gs, "beta_initializer", "zeros");
    y = make2(g, OP_BIAS, y, beta);
  }
  return from_last(g, y, axes, &moved, &x->shape);
}

// RMSNormalization: x / sqrt(mean(x^2) + epsilon) * scale, the last axis.
static Node *build_rmsnorm(Graph *g, Layer *l, Node *x) {
  check_last_axis(l, x);
  int64_t h = x->shape.d[x->shape.rank - 1];
  Node *y = make1(g, OP_NORM, x,
                  .norm = (NormAttr){true, (float)cfg_num(l, "epsilon", 1e-6), false, false});
  // keras-hub's Gemma RMSNormalization (hub.c: kdcc_scale_plus_one) scales
  // by 1 + scale, its scale starting at zeros
  bool plus_one = json_is_true(json_object_get(l->cfg, "kdcc_scale_plus_one"));
  Node *scale = new_var(g, l, "scale", (Shape){1, {h}}, "-", plus_one ? "zeros" : "ones");
  // issue 23: under a mixed policy the norm is float32 (build_layer), but
  // the scale is read under the layer's autocast scope, cast to the compute
  // dtype, then used in float32: keras-hub's RMS norms (Gemma's
  // ops.cast(self.scale, "float32"), 1 + scale in float32; Llama's,
  // Mistral's and Qwen's x * self.scale on float32 x) and Keras's
  // (ops.rms_normalization converts the scale to x's float32)
  if (g->cdt) scale = round_to(g, scale, g->cdt);
  if (plus_one) {
    Node *s1 = make1(g, OP_SCALE, scale, .aff = (AffAttr){1, 1, NULL});
    scale = s1;
  }
  return make2(g, OP_COL_MUL, y, scale);
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
    e = make1(g, OP_SLICE, e, .cat = {0, 0, t});
  }
  return make1(g, OP_BROADCAST, e, .red = {0, x->shape.d[0]});
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
  bool seen[MAX_RANK] = {false};
  PermAttr p = {{0}};
  for (int i = 0; i < n; i++) {
    if (dims[i] < 1 || dims[i] > n || seen[dims[i]])
      error_at(jloc_idx(dj, i), "layer '%s': 'dims' must be a permutation of 1..%d", l->name, n);
    seen[dims[i]] = true;
    p.perm[i + 1] = (int)dims[i];
  }
  return make1(g, OP_TRANSPOSE, x, .perm = p);
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
  Node *n = op_make(g, concat ? OP_CONCAT : OP_ADD, l->nin, in, &(Node){.cat.axis = axis});
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
  Node *y = make2(g, OP_GATHER, t, ids);
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
  Node *s = make1(g, OP_SCALE, y, .aff = (AffAttr){(float)(1.0 / cap), 0, "1/logit_soft_cap"});
  Node *t = apply_act(g, s, ACT_TANH);
  return make1(g, OP_SCALE, t, .aff = (AffAttr){(float)cap, 0, "logit_soft_cap"});
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
  return make1(g, OP_DROPOUT, x, .drop = (DropAttr){(float)rate, hash_str(l->path), false});
}

// Rescaling(scale, offset): x * scale + offset. Under a mixed policy
// (issue 23) Keras casts scale and offset to the compute dtype (as
// keras-hub's Gemma casts its embedding scale sqrt(hidden_dim), which
// hub.c writes as a Rescaling); kdcc rounds x * scale + offset once where
// Keras rounds the product and the sum (the same where the offset is 0).
static Node *build_rescaling(Graph *g, Layer *l, Node *x) {
  Node *n = make1(g, OP_SCALE, x);
  double scale = cfg_num(l, "scale", 1.0), offset = cfg_num(l, "offset", 0.0);
  if (g->cdt) scale = round_scalar(g->cdt, scale), offset = round_scalar(g->cdt, offset);
  n->aff = (AffAttr){(float)scale, (float)offset, NULL};
  return n;
}

static Node *build_add(Graph *g, Layer *l, Node *x) { return build_merge(g, l, false); }
static Node *build_concat(Graph *g, Layer *l, Node *x) { return build_merge(g, l, true); }

// ---- issue 11: activation layers

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
  return make1(g, OP_PACT, x, .pact = (PactAttr){kind, (float)alpha, (float)max, (float)threshold});
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

// ---- issue 11: Dot, normalizations, PReLU, RepeatVector

// x with dim d removed (a reduction's result shape).
static Shape drop_dim(const Shape *x, int d) {
  Shape s = *x;
  memmove(s.d + d, s.d + d + 1, (size_t)(--s.rank - d) * sizeof *s.d);
  return s;
}

// v (x's shape without dim d) repeated along d back to x's shape.
static Node *bcast_dim(Graph *g, Node *v, const Shape *to, int d) {
  return make1(g, OP_BROADCAST, v, .red = {d, to->d[d]});
}

// Keras's ops.normalize(x, axis, order=2, epsilon): x * min(rsqrt(sum of
// squares over the axes), 1 / epsilon), the sum one REDUCE_SUM per axis (a
// split axis leaves a partial sum, all-reduced before the rsqrt).
static Node *l2_normalize(Graph *g, Node *x, unsigned axes, double eps) {
  Node *s = make2(g, OP_MUL, x, x);
  for (int d = x->shape.rank - 1; d >= 0; d--)
    if ((axes >> d) & 1) {
      s = make1(g, OP_REDUCE_SUM, s, .red.dim = d);
    }
  Node *inv = apply_act(g, s, KDRT_ACT_RSQRT);
  inv = make1(g, OP_MAXIMUM, inv, .mm = (MinMaxAttr){true, (float)(1.0 / eps)});
  for (int d = 0; d < x->shape.rank; d++)
    if ((axes >> d) & 1) {
      Shape t = inv->shape;
      memmove(t.d + d + 1, t.d + d, (size_t)(t.rank++ - d) * sizeof *t.d);
      t.d[d] = x->shape.d[d];
      inv = bcast_dim(g, inv, &t, d);
    }
  return make2(g, OP_MUL, x, inv);
}

// x with its dim `from` moved to `to`, the others in order.
static Node *move_dim(Graph *g, Node *x, int from, int to) {
  if (from == to) return x;
  PermAttr p = {{0}};
  for (int i = 0, k = 0; i < x->shape.rank; i++) {
    if (k == from) k++;
    p.perm[i] = i == to ? from : k++;
  }
  return make1(g, OP_TRANSPOSE, x, .perm = p);
}

// x with the dims in `axes` (a mask) moved to the end, in order, and merged
// into one; *moved: the shape before the merge (from_last undoes both).
static Node *to_last(Graph *g, Node *x, unsigned axes, Shape *moved) {
  int r = x->shape.rank, k = 0;
  PermAttr p = {{0}};
  for (int d = 0; d < r; d++)
    if (!((axes >> d) & 1)) p.perm[k++] = d;
  int keep = k;
  for (int d = 0; d < r; d++)
    if ((axes >> d) & 1) p.perm[k++] = d;
  Node *t = x;
  if (axes != (((1u << (r - keep)) - 1) << keep)) // not already the trailing dims
    t = make1(g, OP_TRANSPOSE, x, .perm = p);
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
  PermAttr p = {{0}};
  for (int d = 0; d < r; d++)
    if (!((axes >> d) & 1)) p.perm[d] = k++;
  for (int d = 0; d < r; d++)
    if ((axes >> d) & 1) p.perm[d] = k++;
  return make1(g, OP_TRANSPOSE, y, .perm = p);
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
  Node *t = make1(g, OP_TRANSPOSE, v, .perm = {{0, 2, 1, 3}});
  Node *y = make1(g, OP_NORM, view(g, t, (Shape){3, {b, groups, sp * cg}}),
                  .norm = (NormAttr){false, (float)cfg_num(l, "epsilon", 1e-3), false, false});
  Node *u = make1(g, OP_TRANSPOSE, view(g, y, t->shape), .perm = {{0, 2, 1, 3}});
  Node *o = view(g, u, x->shape);
  Shape cs = {1, {c}};
  if (cfg_bool(l, "scale", true))
    o = make2(g, OP_COL_MUL, o, new_var(g, l, "gamma", cs, "gamma_initializer", "ones"));
  if (cfg_bool(l, "center", true))
    o = make2(g, OP_BIAS, o, new_var(g, l, "beta", cs, "beta_initializer", "zeros"));
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
  Node *an = make2(g, OP_COL_MUL, neg, scaled(g, a, -1));
  return make2(g, OP_ADD, apply_act(g, x, ACT_RELU), an);
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
  batch_penalty(g, x, cfg_num(l, "l1", 0), cfg_num(l, "l2", 0), l->cdt);
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
  m->aff = (AffAttr){0, 1, NULL};
  m = make1(g, OP_DROPOUT, m, .drop = (DropAttr){(float)rate, hash_str(l->path), false});
  for (int d = 1; d <= n; d++) {
    Shape t = m->shape;
    memmove(t.d + d + 1, t.d + d, (size_t)(t.rank++ - d) * sizeof *t.d);
    t.d[d] = x->shape.d[d];
    m = bcast_dim(g, m, &t, d);
  }
  return make2(g, OP_MUL, x, m);
}

// GaussianNoise(stddev): x + stddev * z; GaussianDropout(rate): x * (1 +
// sqrt(rate / (1 - rate)) * z), Keras's normal of mean 1; z a standard
// normal per element and step (NOISE), in training only.
static Node *noise(Graph *g, Layer *l, Node *x, double stddev, bool mul) {
  if (stddev == 0) return x;
  return make1(g, OP_NOISE, x, .drop = (DropAttr){(float)stddev, hash_str(l->path), mul});
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

// Issue 25: a Normalization whose statistics were adapted (layer.adapt) has
// mean and variance null in its config; its build added them as variables
// (Keras's add_weight: "mean", "variance" of the kept axes' shape, zeros
// and ones, trainable false) and then "count", an integer scalar Keras 3
// keeps for older files and never changes (vars/0, 1, 2 in the weights
// file; count int32 there, kdrt_var.dtype). They are never trained: frozen,
// no gradient, no optimizer slots; a layout map may split mean and variance.
// Keras's call, finalize_state's reshape to the kept axes, in graph ops on
// them: (x + -mean) * min(rsqrt(variance), 1 / 1e-7), which is 1 / max(
// sqrt(variance), 1e-7) to the bit (rounding is monotonic), as the config
// form's constants; invert: x * max(sqrt(variance), 1e-7) + mean. The
// statistics are broadcast over the reduced dims after the first kept one;
// BIAS and COL_MUL take them over x's trailing dims.
static Node *adapted_normalization(Graph *g, Layer *l, Node *x, const int *kept, int nk,
                                   bool invert) {
  Shape ms = {nk, {0}};
  for (int i = 0; i < nk; i++) ms.d[i] = x->shape.d[kept[i]];
  Node *mean = new_var(g, l, "mean", ms, "-", "zeros");
  Node *var = new_var(g, l, "variance", ms, "-", "ones");
  Node *count = new_var(g, l, "count", (Shape){0, {0}}, "-", "zeros");
  mean->var->frozen = var->var->frozen = count->var->frozen = true;
  count->var->file_dtype = KDRT_I32;
  Node *mul = apply_act(g, var, invert ? KDRT_ACT_SQRT : KDRT_ACT_RSQRT);
  mul = make1(g, OP_MAXIMUM, mul,
              .mm = invert ? (MinMaxAttr){false, 1e-7f} : (MinMaxAttr){true, (float)(1.0 / 1e-7f)});
  Node *shift = invert ? mean : scaled(g, mean, -1);
  // over x's dims from the first kept one (axis None: the last), the
  // reduced ones among them repeated
  int first = nk ? kept[0] : x->shape.rank - 1;
  for (int d = first, k = 0; d < x->shape.rank; d++) {
    if (k < nk && kept[k] == d) {
      k++;
      continue;
    }
    Shape t = mul->shape;
    int at = d - first;
    memmove(t.d + at + 1, t.d + at, (size_t)(t.rank++ - at) * sizeof *t.d);
    t.d[at] = x->shape.d[d];
    mul = bcast_dim(g, mul, &t, at);
    shift = bcast_dim(g, shift, &t, at);
  }
  if (invert) return make2(g, OP_BIAS, make2(g, OP_COL_MUL, x, mul), shift);
  return make2(g, OP_COL_MUL, make2(g, OP_BIAS, x, shift), mul);
}

// Normalization(axis, mean, variance, invert) with its statistics in the
// config: (x - mean) / max(sqrt(variance), 1e-7), or (invert) mean + x *
// that, Keras's formula, as a BIAS and a COL_MUL by constants over x's
// sample dims (computed here in float32 as Keras does; a multiplication by
// the reciprocal where Keras divides: within an ulp). mean and variance
// align with the kept axes from the right, a 1 broadcast, as Keras's build.
// Both null: adapted, the statistics weights (adapted_normalization).
static Node *build_normalization(Graph *g, Layer *l, Node *x) {
  json_t *mj = json_object_get(l->cfg, "mean"), *vj = json_object_get(l->cfg, "variance");
  bool no_mean = !mj || json_is_null(mj), no_var = !vj || json_is_null(vj);
  if (no_mean != no_var)
    error_at(no_mean ? jloc(vj) : jloc(mj), "layer '%s': Normalization needs both mean and "
             "variance in its config, or neither (adapted: kept as weights)", l->name);
  int r = x->shape.rank;
  json_t *aj = json_object_get(l->cfg, "axis");
  unsigned keep = aj && json_is_array(aj) && !json_array_size(aj) ? 0
                : aj && json_is_null(aj) ? 0 : cfg_axes(l, x, "axis", 1);
  int kept[MAX_RANK], nk = 0;
  for (int d = 1; d < r; d++)
    if ((keep >> d) & 1) kept[nk++] = d;
  if (no_mean) return adapted_normalization(g, l, x, kept, nk, cfg_bool(l, "invert", false));
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
  if (invert) return make2(g, OP_BIAS, make2(g, OP_COL_MUL, x, k[1]), k[0]);
  return make2(g, OP_COL_MUL, make2(g, OP_BIAS, x, k[0]), k[1]);
}

// The Keras layers kdcc builds (layers.def): class name, how many inputs a
// call takes, and the builder that makes its ops.
typedef struct {
  const char *cls;
  int nin;
  Node *(*build)(Graph *g, Layer *l, Node *x);
} LayerDef;

static const LayerDef layer_defs[] = {
#define LAYER(cls, nin, build) {cls, nin, build},
#include "layers.def"
#undef LAYER
};

// nin -2: several inputs, but not a merge (attention: query, value, key).
static const LayerDef *layer_def(const char *cls) {
  for (size_t i = 0; i < sizeof layer_defs / sizeof *layer_defs; i++)
    if (!strcmp(layer_defs[i].cls, cls)) return &layer_defs[i];
  return NULL;
}

static Node *build_call(Graph *g, Layer *l) {
  const LayerDef *def = layer_def(l->cls);
  if (!def) error_at(l->loc, "layer '%s': unknown layer class '%s'", l->name, l->cls);
  if (def->nin == 0) return def->build(g, l, NULL);
  if (l->nin == 0) error_at(l->loc, "layer '%s' has no input", l->name);
  if (def->nin == -2) return def->build(g, l, NULL);
  if (def->nin > 0 && l->nin != def->nin)
    error_at(l->loc, "layer '%s': %s takes one input, got %d", l->name, l->cls, l->nin);
  return def->build(g, l, layer_input(l, 0));
}

// Issue 23: a layer of a mixed policy (Layer.cdt) is built as in float32,
// new_node rounding where Keras casts (ir.c). Keras 3.15's layers, read in
// keras/src/layers: every layer casts its float inputs to the compute dtype
// when called (Layer.__call__, autocast) but LayerNormalization and
// Embedding (autocast = False); LayerNormalization (ops.layer_normalization)
// and BatchNormalization compute in float32 with float32 gamma, beta and
// statistics, and cast their outputs; the global average poolings' mean
// sums in float32 (jnp.mean); attention's scores and softmax are float32
// (attend, layers_attn.c). load.c accepts a mixed policy on the classes
// whose casts these are. keras-hub's layers (hub.c), read in keras_hub/src:
// every RMS norm (Gemma's RMSNormalization, LlamaLayerNorm,
// MistralLayerNormalization, QwenLayerNorm, and Keras's own) casts x to
// float32, computes in float32 with its scale cast to the compute dtype
// (build_rmsnorm) and casts its output back; ReversibleEmbedding is an
// Embedding (autocast = False): its reverse call (the logits) multiplies
// the 16-bit hidden states by the float32 table (reverse_dtype None or
// "float32": a float32 product) and returns float32 logits, soft-capped in
// float32, which the loss reads as they are. Under the bfloat16 policy the
// table is bfloat16 and the product's dtype too, but XLA keeps a product
// the loss casts to float32 in float32 (its simplify_fp_conversions,
// measured): the same float32 logits.
static bool casts_inputs(const char *cls) {
  return strcmp(cls, "LayerNormalization") && strcmp(cls, "Embedding") &&
         strcmp(cls, "ReversibleEmbedding");
}

static bool computes_f32(const char *cls) {
  return !strcmp(cls, "LayerNormalization") || !strcmp(cls, "BatchNormalization") ||
         !strcmp(cls, "GlobalAveragePooling1D") || !strcmp(cls, "GlobalAveragePooling2D") ||
         !strcmp(cls, "RMSNormalization");
}

// issue 23: the bfloat16 probabilities of a softmax that only a
// crossentropy (not from logits) reads are its float32 result, unrounded:
// in XLA's program the activation's cast to bfloat16 and the loss's cast to
// float32 cancel (its allow_excess_precision; read in Keras 3.15's
// optimized HLO of Dense(softmax) and Activation("softmax")), while the
// loss's gradient in them is still rounded (autodiff.c: the casts'
// transposes). Under float16 the probabilities are a float16 product, and
// rounded. (XLA keeps logits from a bias add unrounded for a loss from
// logits too, but reading them so brought the keras_ref cases no nearer.)
static bool loss_reads_f32(Graph *g, Layer *l, const Node *y) {
  if (l->cdt != KDRT_ROUND_BF16 || y->op != OP_SOFTMAX || !y->pend) return false;
  const Model *m = g->model;
  int out;
  if (layer_readers(m, l, NULL, &out) || out < 0) return false;
  const OutLoss *ol = &m->losses[out];
  return ol && ol->has && !ol->from_logits && (ol->kind == LOSS_SCCE || ol->kind == LOSS_CCE);
}

Node *build_layer(Graph *g, Layer *l) {
  if (!l->cdt) return build_call(g, l);
  bool logits = !strcmp(l->cls, "ReversibleEmbedding") && call_flag(l, "reverse");
  g->cdt = l->cdt;
  g->cdt_first = g->nnodes;
  g->cdt_autocast = casts_inputs(l->cls);
  g->cdt_f32 = computes_f32(l->cls) || logits;
  Node *y = build_call(g, l);
  if (!bn_reads_f32(g, l, y) && !loss_reads_f32(g, l, y)) { // (else left unrounded)
    y = mixed_value(g, y);
    if (y->dtype == DT_F32 && !logits) y = round_to(g, y, l->cdt); // the output in 16 bits
  }
  g->cdt = 0;
  g->cdt_f32 = false;
  return y;
}

// Keras maps hinge labels 0/1 to -1/1 when every label of the step is 0
