// Layer builders: attention and EinsumDense.
//
// MultiHeadAttention and GroupedQueryAttention as JAX's dot_product_attention
// computes them: projections of the query, key and value (Keras's EinsumDense
// kernels, whose fans come from the equation), scores scaled, masked and
// softmaxed, then the output projection. EinsumDense is one DOT
// (dot_general) between transposes that put the operands' and the result's
// dims in its order, so that a kernel's layout propagates through DOT's rule.
#include "graph_build.h"

#include "../runtime/kdrt_rope.h"
#include "../runtime/kdrt_round.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

// ---- attention

// n, whose buffer the program names by its role in the layer ("scores").
static Node *named(Node *n, const char *role) {
  n->role = role;
  return n;
}

static Node *transpose_0213(Graph *g, Node *x) {
  return make1(g, OP_TRANSPOSE, x, .perm = {{0, 2, 1, 3}});
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
  // hub.c's keras-hub enable_lora: the projection's sublayer trains again,
  // its kernel through LoRA, its bias as it is
  double alpha;
  int index;
  int64_t rank = lora_rank_of(l, name, &alpha, &index);
  Node *y = dot_node(g, x, rank ? lora_kernel(g, l, w, format("%s/", name), rank, alpha, index)
                                : w, 0, 1, false);
  if (bias) {
    Node *b = new_var(g, l, format("%s/bias", name), (Shape){2, {heads, dim}}, "bias_initializer",
                      "zeros");
    if (rank) b->var->frozen = false;
    y = make2(g, OP_BIAS, y, b);
  }
  return named(y, name);
}

// A call keyword the layer reads: a boolean (false when absent).
bool call_flag(Layer *l, const char *key) {
  json_t *v = l->kwargs ? json_object_get(l->kwargs, key) : NULL;
  if (!v || json_is_null(v)) return false;
  if (!json_is_boolean(v))
    error_at(jloc(v), "layer '%s': call argument '%s' must be true or false", l->name, key);
  return json_is_true(v);
}

// Every call keyword must be one the layer reads.
void check_kwargs(Layer *l, const char *const *known, int n) {
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

// issue 23: a constant as a cast to the 16-bit type `kind` leaves it (a
// Python float cast to the compute dtype, as keras-hub's Gemma casts its
// query normalization and its embedding scale).
float round_scalar(int kind, double v) {
  return kind == KDRT_ROUND_F16 ? kdrt_round_f16((float)v) : kdrt_round_bf16((float)v);
}

static Node *scaled_by(Graph *g, Node *x, double scale, const char *hp) {
  return make1(g, OP_SCALE, x, .aff = (AffAttr){(float)scale, 0, hp});
}

// The attention core of MultiHeadAttention and GroupQueryAttention, as
// JAX's dot_product_attention computes it: q[b, t, n, d], k, v[b, s, n, d]
// (kv heads already repeated) -> o[b, t, n, dv]. Scores q.k are scaled by
// 1 / sqrt(d), causally masked, softmaxed over the keys. Its buffers are
// named by their role: q, k, v, scores, probs, context.

// cap > 0 (Gemma's logit_soft_cap): the scaled scores soft-capped first,
// tanh(s / cap) * cap. window > 0 (causal only: Mistral's and Gemma 2's
// sliding window): a key window or more steps before its query is masked.
// zero_masked (keras-hub Gemma's Softmax layer, which zeroes the masked
// probabilities): a query whose every key is masked gets zeros, not the
// average of all values (the only case where the two differ).
static Node *attend(Graph *g, Layer *l, Node *q, Node *k, Node *v, double scale, bool causal,
                    Node *mask, double dropout, double cap, int64_t window, bool zero_masked) {
  if (g->cdt && dropout > 0) // Keras's MHA then scales q, and softmaxes in 16 bits
    error_at(jloc_key(l->cfg, "dropout"), "layer '%s': attention dropout under a mixed dtype "
             "policy is not supported yet", l->name);
  Node *qt = named(transpose_0213(g, q), "q"), *kt = named(transpose_0213(g, k), "k");
  Node *vt = named(transpose_0213(g, v), "v");
  // issue 23: under a mixed policy the scores are float32 products of the
  // 16-bit q and k, scaled, masked and softmaxed in float32; the
  // probabilities are cast back for the product with v (JAX's
  // _dot_product_attention_core, which Keras's and keras-hub's fused
  // attention call). keras-hub's GemmaAttention off the fused op (the
  // zero_masked path: its Softmax layer; the CPU's path, and the GPU's
  // with a soft cap) computes its scores in the compute dtype instead: q
  // times the scale cast to it (q *= ops.cast(1 / sqrt(head_dim), q.dtype)),
  // the product q.k (einsum "btkgh,bskh->bkgts") and the soft cap's divide,
  // tanh and multiply, each rounded; only the Softmax layer (dtype float32)
  // is float32, its probabilities cast back (ops.cast(.., orig_dtype)).
  bool f32 = g->cdt_f32, scores16 = g->cdt && zero_masked;
  g->cdt_f32 = !scores16;
  if (scores16) qt = scaled_by(g, qt, round_scalar(g->cdt, scale), "scale");
  Node *s = named(dot_node(g, qt, kt, 2, 1, true), "scores"); // [b, n, t, s]
  if (!scores16) s = scaled_by(g, s, scale, "scale");
  if (cap > 0)
    s = scaled_by(g, apply_act(g, scaled_by(g, s, 1 / cap, "1/logit_soft_cap"), ACT_TANH), cap,
                  "logit_soft_cap");
  g->cdt_f32 = true;
  if (causal) s = make1(g, OP_CAUSAL, s, .mask = (MaskAttr){-1, window}); // forward: KDRT_MASKED
  if (mask) s = make2(g, OP_ATTN_MASK, s, mask, .mask.fill = -1);
  Node *p = named(apply_act(g, s, ACT_SOFTMAX), "probs");
  if (zero_masked && causal) p = make1(g, OP_CAUSAL, p, .mask = (MaskAttr){0, window});
  if (zero_masked && mask) p = make2(g, OP_ATTN_MASK, p, mask);
  g->cdt_f32 = f32;
  if (dropout > 0) {
    p = make1(g, OP_DROPOUT, p,
              .drop = (DropAttr){(float)dropout, hash_str(format("%s/attention_dropout", l->path)),
                                 false});
  }
  Node *o = named(dot_node(g, p, vt, 2, 1, false), "context"); // [b, n, t, dv]
  return transpose_0213(g, o);
}

// The call's attention_mask (issue 10), or NULL: [batch, query steps, key
// steps], int32 or float32, nonzero where a query may attend to a key, as
// Keras casts it to bool. Synthetic data fills an int32 mask with 0 and 1.
// hub.c's attention layers take keras-hub's padding_mask [batch, key steps]
// instead (kdcc_padding_mask in their config), the same for every query.
static Node *attention_mask_input(Layer *l, const Node *q, const Node *v) {
  if (!l->mask) return NULL;
  Node *m = layer_input(l, l->mask);
  Shape want = {3, {q->shape.d[0], q->shape.d[1], v->shape.d[1]}};
  if (json_is_true(json_object_get(l->cfg, "kdcc_padding_mask")))
    want = (Shape){2, {q->shape.d[0], v->shape.d[1]}};
  if (!shape_eq(&m->shape, &want))
    error_at(l->in[l->mask].loc, "layer '%s': %s must be %s, got %s", l->name,
             want.rank == 2 ? "padding_mask" : "attention_mask", want.rank == 2
             ? format("(None, %lld) (key steps)", (long long)want.d[1])
             : format("(None, %lld, %lld) (query steps, key steps)", (long long)want.d[1],
                      (long long)want.d[2]), kshape(&m->shape));
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
    y = make2(g, OP_BIAS, y, bo);
  }
  return y;
}

// MultiHeadAttention(num_heads, key_dim, value_dim, use_bias, output_shape,
// dropout), called as (query, value[, key]) with use_causal_mask. Kernels
// as Keras stores them: query/key/value [hidden, heads, dim], the output
// [heads, dim, hidden].
Node *build_mha(Graph *g, Layer *l, Node *unused) {
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
                   mask, cfg_num(l, "dropout", 0), 0, 0, false);
  return attention_output(g, l, o, out, bias);
}

// Each of kv's heads repeated r times, in place: [b, s, h, d] ->
// [b, s, h * r, d] (ops.repeat on axis 2), as a broadcast and a view.
static Node *repeat_heads(Graph *g, Node *kv, int64_t r) {
  if (r == 1) return kv;
  const Shape *s = &kv->shape;
  Node *b = make1(g, OP_BROADCAST, kv, .red = {3, r});
  return new_node1(g, OP_RESHAPE, b, (Shape){4, {s->d[0], s->d[1], s->d[2] * r, s->d[3]}});
}

// hub.c's attention layers: query and key turned by rotary embedding as
// keras-hub turns them, its settings in kdcc_rope (keras-hub's argument
// names): kind "llama", LlamaRotaryEmbedding (Llama 3.1's frequency
// adjustment where frequency_adjustment_factor is set), else RotaryEmbedding
// (Mistral's, Qwen's, Gemma's); x as it is without it.
static Node *hub_rope(Graph *g, Layer *l, Node *x) {
  json_t *r = json_object_get(l->cfg, "kdcc_rope");
  if (!json_is_object(r)) return x;
  RopeParams *p = xcalloc(1, sizeof *p);
  double adjust = json_number_value(json_object_get(r, "frequency_adjustment_factor"));
  bool llama = !strcmp(json_string_value(json_object_get(r, "kind")), "llama");
  *p = rope_params(10000, 1);
  p->kind = !llama ? ROPE_LINEAR : adjust ? ROPE_LLAMA31 : ROPE_LLAMA;
  p->freq_adjust = adjust;
  json_t *v;
  if ((v = json_object_get(r, "max_wavelength"))) p->max_wavelength = json_number_value(v);
  if ((v = json_object_get(r, "position_scaling_factor")) || // Llama's, which it ignores
      (v = json_object_get(r, "scaling_factor")))
    p->scaling_factor = json_number_value(v);
  if (adjust) {
    static const char *const need[] = {"low_freq_factor", "high_freq_factor",
                                       "pretraining_sequence_length"};
    for (int i = 0; i < 3; i++)
      if (!json_is_number(json_object_get(r, need[i])))
        error_at(l->loc, "layer '%s': rope_frequency_adjustment_factor needs rope_%s too",
                 l->name, need[i]);
    p->low_freq = json_number_value(json_object_get(r, "low_freq_factor"));
    p->high_freq = json_number_value(json_object_get(r, "high_freq_factor"));
    p->pretrain_len = json_number_value(json_object_get(r, "pretraining_sequence_length"));
  }
  return rope_node(g, l, x, p, 0);
}

// kdcc's own attention core, for hub.c's keras-hub attention layers whose
// projections it writes as EinsumDense layers (Gemma's, whose kernels are
// [heads, hidden, head_dim], and Qwen 3's): called on q[b, t, n, h], k and v[b, s, kv, h]
// with keras-hub's padding_mask; the query and key turned by rotary
// embedding (kdcc_rope), key and value heads repeated to the query heads,
// the scores scaled by `scale`, soft-capped by logit_soft_cap, masked
// causally and by the padding. Gemma's interleaving of the turned halves
// (stack(split(x, 2), -1)) permutes q's and k's features alike, which
// leaves q.k as it is: it is not done.
Node *build_attention_core(Graph *g, Layer *l, Node *unused) {
  int nargs = l->mask ? l->mask : l->nin;
  if (nargs != 3)
    error_at(l->loc, "layer '%s': the attention core takes query, key and value", l->name);
  static const char *const kw[] = {"attention_mask"};
  check_kwargs(l, kw, 1);
  Node *q = layer_input(l, 0), *k = layer_input(l, 1), *v = layer_input(l, 2);
  if (q->shape.rank != 4 || k->shape.rank != 4 || !shape_eq(&k->shape, &v->shape) ||
      q->shape.d[3] != k->shape.d[3] || q->shape.d[2] % k->shape.d[2])
    error_at(l->loc, "layer '%s': query [b, t, n, h], key and value [b, s, kv, h] with kv "
             "dividing n, got %s, %s, %s", l->name, kshape(&q->shape), kshape(&k->shape),
             kshape(&v->shape));
  Node *mask = attention_mask_input(l, q, v);
  int64_t r = q->shape.d[2] / k->shape.d[2];
  q = hub_rope(g, l, q);
  k = repeat_heads(g, hub_rope(g, l, k), r);
  v = repeat_heads(g, v, r);
  double scale = cfg_num(l, "scale", 1.0 / sqrt((double)q->shape.d[3]));
  // Gemma's Softmax layer zeroes a query with no key; hub.c's Qwen 3 is
  // JAX's fused op instead (kdcc_fused_op), which averages the values there
  bool fused = json_is_true(json_object_get(l->cfg, "kdcc_fused_op"));
  return attend(g, l, q, k, v, scale, true, mask, cfg_num(l, "dropout", 0),
                cfg_num(l, "logit_soft_cap", 0), cfg_int(l, "sliding_window", 0), !fused);
}

// GroupedQueryAttention(head_dim, num_query_heads, num_key_value_heads,
// use_bias, dropout), called as (query, value[, key]) with use_causal_mask:
// key and value heads repeated to the query heads, then as MultiHeadAttention.
Node *build_gqa(Graph *g, Layer *l, Node *unused) {
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
  Node *q = hub_rope(g, l, project(g, l, xq, "query", nq, hd, bias));
  Node *k = repeat_heads(g, hub_rope(g, l, project(g, l, xk, "key", nkv, hd, bias)), nq / nkv);
  Node *v = repeat_heads(g, project(g, l, xv, "value", nkv, hd, bias), nq / nkv);
  // hub.c's Mistral: its sliding window (kdcc_sliding_window)
  Node *o = attend(g, l, q, k, v, 1.0 / sqrt((double)hd), call_flag(l, "use_causal_mask"),
                   mask, cfg_num(l, "dropout", 0), 0, cfg_int(l, "kdcc_sliding_window", 0),
                   false);
  // hub.c's Qwen: biases on the query, key and value but not the output
  json_t *ob = json_object_get(l->cfg, "kdcc_output_bias");
  return attention_output(g, l, o, xq->shape.d[2], ob ? json_is_true(ob) : bias);
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
  PermAttr p = {{0}};
  for (int i = 0; to[i]; i++) p.perm[i] = index_of(from, to[i]);
  return make1(g, OP_TRANSPOSE, x, .perm = p);
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
    b = make1(g, OP_BROADCAST, b, .red = {j - first, y->shape.d[j]});
  }
  return make2(g, OP_BIAS, y, b);
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
Node *build_einsum_dense(Graph *g, Layer *l, Node *x) {
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
  double alpha;
  int index;
  int64_t rank = lora_rank_of(l, NULL, &alpha, &index); // hub.c's keras-hub enable_lora
  if (rank) w = lora_kernel(g, l, w, "", rank, alpha, index);
  for (int d = x->shape.rank - 1; d > 0; d--) // the input's indices summed over
    if (index_of(e.w, e.x[d]) < 0 && index_of(e.y, e.x[d]) < 0) {
      x = make1(g, OP_REDUCE_SUM, x, .red.dim = d);
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

// ---- rotary position embedding (issue 24)

RopeParams rope_params(double max_wavelength, double scaling_factor) {
  return (RopeParams){.kind = ROPE_LINEAR, .max_wavelength = max_wavelength,
                      .scaling_factor = scaling_factor, .beta_fast = 32, .beta_slow = 1,
                      .original_max = 4096, .truncate = true};
}

// x[b, t, .., 2h] turned by ROPE, its step 0 at position `offset`. What
// keras-hub would turn into NaN or infinities (or cannot hold) is an error
// at l (x's layer when l is NULL).
Node *rope_node(Graph *g, Layer *l, Node *x, const RopeParams *p, int64_t offset) {
  const char *who = l ? l->name : x->layer ? x->layer : "?";
  Loc at = l ? l->loc : x->loc;
  const Shape *s = &x->shape;
  if (s->rank < 3)
    error_at(at, "layer '%s': rotary embedding needs (batch, steps, .., features), got %s", who,
             kshape(s));
  int64_t dim = s->d[s->rank - 1];
  if (dim % 2 || dim / 2 > KDRT_ROPE_MAX_HALF)
    error_at(at, "layer '%s': rotary embedding needs an even number of features, at most %d, "
             "got %lld", who, 2 * KDRT_ROPE_MAX_HALF, (long long)dim);
  bool llama = p->kind == ROPE_LLAMA || p->kind == ROPE_LLAMA31;
  bool ok = p->max_wavelength > 0 && isfinite(p->max_wavelength) && offset >= 0 &&
            (llama || (p->scaling_factor > 0 && isfinite(p->scaling_factor)));
  if (p->kind == ROPE_YARN) ok &= p->beta_fast > 0 && p->beta_slow > 0 && p->original_max > 0;
  if (p->kind == ROPE_LLAMA31)
    ok &= p->freq_adjust > 0 && p->low_freq > 0 && p->high_freq > 0 &&
          p->high_freq != p->low_freq && p->pretrain_len > 0;
  if (!ok)
    error_at(at, "layer '%s': rotary embedding's settings must be positive (max_wavelength "
             "%g, scaling_factor %g, start %lld)", who, p->max_wavelength, p->scaling_factor,
             (long long)offset);
  RopeParams *kept = xcalloc(1, sizeof *kept);
  *kept = *p;
  Node *y = make1(g, OP_ROPE, x);
  // issue 23: made in 16 bits (a mixed layer's), keras-hub's RotaryEmbedding
  // casts cos and sin to the compute dtype and computes x * cos +
  // rotate_half(x) * sin there, each product and the sum rounded (XLA keeps
  // these roundings: kdrt_rope.h)
  y->rope = (RopeAttr){kept, offset, false, (uint8_t)(g->cdt && !g->cdt_f32 ? g->cdt : 0)};
  if (l) y->layer = l->name, y->loc = l->loc;
  return y;
}

// keras_hub's RotaryEmbedding(max_wavelength, scaling_factor, rope_type,
// beta_fast, beta_slow, original_max_position_embeddings, truncate,
// sequence_axis, feature_axis, denominator_dim), called on x with the
// sequence axis 1 and the features last, and an integer start_index.
Node *build_rotary_embedding(Graph *g, Layer *l, Node *x) {
  static const char *const types[] = {"linear", "dynamic", "yarn"};
  static const char *const keys[] = {"max_wavelength", "scaling_factor", "beta_fast",
                                     "beta_slow", "original_max_position_embeddings",
                                     "denominator_dim"};
  RopeParams p = rope_params(cfg_num(l, "max_wavelength", 10000),
                             cfg_num(l, "scaling_factor", 1.0));
  const char *type = cfg_str(l, "rope_type", "linear");
  int kind = 0;
  while (kind < 3 && strcmp(type, types[kind])) kind++;
  if (kind == 3)
    error_at(jloc_key(l->cfg, "rope_type"), "layer '%s': rope_type '%s' is not supported "
             "(linear, dynamic or yarn)", l->name, type);
  p.kind = kind == 0 ? ROPE_LINEAR : kind == 1 ? ROPE_DYNAMIC : ROPE_YARN;
  p.beta_fast = cfg_num(l, "beta_fast", 32);
  p.beta_slow = cfg_num(l, "beta_slow", 1);
  p.original_max = cfg_int(l, "original_max_position_embeddings", 4096);
  p.truncate = cfg_bool(l, "truncate", true);
  p.denominator_dim = cfg_int(l, "denominator_dim", 0);
  json_t *dd = json_object_get(l->cfg, "denominator_dim");
  double v[] = {p.max_wavelength, p.scaling_factor, p.beta_fast, p.beta_slow,
                (double)p.original_max, dd && !json_is_null(dd) ? (double)p.denominator_dim : 1};
  for (int i = 0; i < 6; i++)
    if (!(v[i] > 0))
      error_at(jloc_key(l->cfg, keys[i]), "layer '%s': '%s' must be positive", l->name, keys[i]);
  int r = x->shape.rank;
  int64_t sa = cfg_int(l, "sequence_axis", 1), fa = cfg_int(l, "feature_axis", -1);
  if (r < 3)
    error_at(l->loc, "layer '%s': RotaryEmbedding needs (batch, steps, .., features), got %s",
             l->name, kshape(&x->shape));
  if ((sa < 0 ? sa + r : sa) != 1)
    error_at(jloc_key(l->cfg, "sequence_axis"), "layer '%s': sequence_axis %lld is not supported "
             "(1 only)", l->name, (long long)sa);
  if ((fa < 0 ? fa + r : fa) != r - 1)
    error_at(jloc_key(l->cfg, "feature_axis"), "layer '%s': feature_axis %lld is not supported "
             "(the last only)", l->name, (long long)fa);
  static const char *const kw[] = {"start_index"};
  check_kwargs(l, kw, 1);
  json_t *si = l->kwargs ? json_object_get(l->kwargs, "start_index") : NULL;
  if (si && !json_is_null(si) && (!json_is_integer(si) || json_integer_value(si) < 0))
    error_at(jloc(si), "layer '%s': start_index must be a non-negative integer", l->name);
  return rope_node(g, l, x, &p, si && json_is_integer(si) ? json_integer_value(si) : 0);
}
