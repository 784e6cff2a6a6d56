// hub.c: keras-hub's models, which keras-hub saves as hyper-parameters, as
// the Functional model of Keras layers its Python builds from them.
//
// A task (`GPT2CausalLM`, registered_name "keras_hub>GPT2CausalLM") holds
// its backbone's envelope under config.backbone; the backbone's config is
// hyper-parameters (vocabulary_size, num_layers, ...), not layers. This file
// writes the layers keras-hub's backbone and task build from them, as a
// Functional config that load.c reads like any other: layers named by
// keras-hub's variable paths ("transformer_layer_0/self_attention", so that
// a layout map's regexes and the report see keras-hub's names), each with
// the weights-file group keras-hub's objects save it under (kdcc_group:
// "transformer_decoder/_self_attention_layer"), its values taken from the
// backbone's JSON so that errors point there. What keras-hub's layers do
// that Keras's do not is said in kdcc-only config keys their builders read
// (kdcc_padding_mask: attention masked by the padding_mask over the keys).
//
// The sequence length is not in the config (token_ids is (None, None)):
// --sequence-length, else the backbone's max_sequence_length where it has
// one. The inputs are keras-hub's dict, in Keras's order for a dict (its
// keys sorted): padding_mask, token_ids.
#include "kdcc.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

int64_t opt_sequence_length;
int64_t opt_lora_rank;
const char *opt_lora_targets = "query,value";

typedef struct {
  json_t *env;            // the backbone's envelope
  json_t *cfg;            // its config: the hyper-parameters
  const char *cls;        // "GPT2Backbone"
  Loc at;                 // where the backbone's config starts
  json_t *layers;         // the Functional config's layer list being written
  int64_t steps;          // token steps
  json_t *lora;           // --lora-targets, when --lora-rank asks for LoRA
  // Where keras-hub's save_lora_weights numbers a block's projections: the
  // weighted layers of backbone._flatten_layers(), the backbone's own in
  // order, each one's sublayers after it in reverse order of creation. Block
  // i's decoder is number top + i * per_block, its attention's output
  // projection attention_output later, then value, key, query, with the
  // query/key norms where qk_norm says.
  int block, top, per_block, attention_output;
  enum {
    QK_NONE,
    QK_APART, // Qwen 3's: the key's norm before key, the query's before query
    QK_FIRST, // Gemma 3's (built after the projections): key_norm, query_norm before value
  } qk_norm;
} Hub;

// Every value hub.c makes points at the backbone's config in messages.
static json_t *located(Hub *h, json_t *v) {
  jloc_alias(v, h->at);
  return v;
}

// Hyper-parameter `key` of the backbone: an integer of at least lo.
static json_t *hp_int(Hub *h, const char *key, int64_t lo) {
  json_t *v = json_object_get(h->cfg, key);
  if (!v || json_is_null(v))
    error_at(h->at, "%s: the config has no '%s'", h->cls, key);
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > MAX_DIM)
    error_at(jloc(v), "%s: '%s' must be an integer in [%lld, %d]", h->cls, key, (long long)lo,
             MAX_DIM);
  return v;
}

static int64_t hp_val(Hub *h, const char *key, int64_t lo) {
  return json_integer_value(hp_int(h, key, lo));
}

// Hyper-parameter `key`: a number (def when absent).
static json_t *hp_num(Hub *h, const char *key, double def) {
  json_t *v = json_object_get(h->cfg, key);
  if (!v || json_is_null(v)) return located(h, json_real(def));
  if (!json_is_number(v)) error_at(jloc(v), "%s: '%s' must be a number", h->cls, key);
  return v;
}

// The backbone's dtype policy's name (--dtype-policy's first), or NULL.
static const char *policy_name(Hub *h) {
  json_t *d = json_object_get(h->cfg, "dtype");
  return opt_dtype_policy ? opt_dtype_policy
         : json_is_string(d) ? json_string_value(d)
                             : json_get_str(json_object_get(d, "config"), "name");
}

// A reference to call `node` of layer `name`'s output, as Keras 3 writes one.
static json_t *tensor(Hub *h, const char *name, int node) {
  return located(h, json_pack("{s:s, s:{s:[s, i, i]}}", "class_name", "__keras_tensor__",
                              "config", "keras_history", name, node, 0));
}

// --lora-targets as a list (h->lora), each a name keras-hub's enable_lora
// takes that kdcc adapts: the attention's projections.
static void read_lora_targets(Hub *h) {
  h->lora = json_array();
  char *list = xstrdup(opt_lora_targets), *save = NULL;
  for (char *n = strtok_r(list, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
    if (strcmp(n, "query") && strcmp(n, "key") && strcmp(n, "value"))
      error_at(h->at, "%s: --lora-targets '%s': kdcc adapts the attention's query, key and "
               "value projections (keras-hub's default is query,value)", h->cls, n);
    json_array_append_new(h->lora, json_string(n));
  }
}

// Whether layer `name` (its last part: keras-hub's sublayer names) is a target.
static bool lora_target(Hub *h, const char *name) {
  const char *last = strrchr(name, '/');
  last = last ? last + 1 : name;
  for (size_t i = 0; i < json_array_size(h->lora); i++)
    if (!strcmp(json_string_value(json_array_get(h->lora, i)), last)) return true;
  return false;
}

// Projection proj's number in keras-hub's .lora.h5 (see Hub) in block h->block.
static int lora_index(Hub *h, const char *proj) {
  static const char *const order[] = {"value", "key", "query"};
  int k = 0;
  while (k < 3 && strcmp(order[k], proj)) k++;
  int norms = h->qk_norm == QK_APART ? k : h->qk_norm == QK_FIRST ? 2 : 0;
  return h->top + h->block * h->per_block + h->attention_output + 1 + k + norms;
}

// keras-hub's backbone.enable_lora(rank): every layer frozen, then the
// target projections trained again, their kernels through LoRA (alpha =
// rank). The attention layers whose projections kdcc builds inside them
// (MultiHeadAttention, GroupedQueryAttention) get the targets' names.
static void enable_lora(Hub *h, const char *cls, const char *name, json_t *cfg) {
  bool attention = !strcmp(cls, "MultiHeadAttention") || !strcmp(cls, "GroupedQueryAttention");
  bool target = !strcmp(cls, "EinsumDense") && lora_target(h, name);
  json_object_set_new(cfg, "trainable", json_boolean(target));
  if (attention) {
    json_t *index = json_object();
    for (size_t i = 0; i < json_array_size(h->lora); i++) {
      const char *proj = json_string_value(json_array_get(h->lora, i));
      json_object_set_new(index, proj, json_integer(lora_index(h, proj)));
    }
    json_object_set_new(cfg, "kdcc_lora", json_pack("{s:I, s:O, s:o}", "rank",
                                                    (json_int_t)opt_lora_rank, "targets", h->lora,
                                                    "index", index));
  } else if (target) {
    json_object_set_new(cfg, "kdcc_lora", json_pack("{s:I, s:i}", "rank",
                                                    (json_int_t)opt_lora_rank, "index",
                                                    lora_index(h, strrchr(name, '/') + 1)));
  }
}

// Layer `name` of class cls, called once on args (a list: its tensors)
// with kwargs (NULL: none); group: its weights-file group, or NULL when it
// has no variables. Takes the references to cfg, args and kwargs.
static json_t *layer(Hub *h, const char *cls, const char *name, const char *group, json_t *cfg,
                     json_t *args, json_t *kwargs) {
  json_object_set_new(cfg, "name", json_string(name));
  // the backbone's dtype policy is every layer's, as keras-hub passes it
  // down (its own value, so that a policy kdcc refuses is named where it is;
  // a mixed one rounds where keras-hub's layers cast: layers.c's build_layer)
  json_t *dtype = json_object_get(h->cfg, "dtype");
  if (dtype && !json_is_null(dtype) && strcmp(cls, "InputLayer"))
    json_object_set(cfg, "dtype", dtype);
  if (opt_lora_rank) enable_lora(h, cls, name, cfg);
  json_t *env = json_pack("{s:s, s:o, s:s}", "class_name", cls, "config", located(h, cfg),
                          "name", name);
  if (group) json_object_set_new(env, "kdcc_group", json_string(group));
  json_t *nodes = located(h, json_array());
  if (args) {
    json_t *call = json_pack("{s:o, s:o}", "args", located(h, args), "kwargs",
                             located(h, kwargs ? kwargs : json_object()));
    json_array_append_new(nodes, located(h, call));
  }
  json_object_set_new(env, "inbound_nodes", nodes);
  json_array_append_new(h->layers, located(h, env));
  return env;
}

// Another call of a layer (a tied embedding's reverse call).
static void call_again(Hub *h, json_t *env, json_t *args, json_t *kwargs) {
  json_t *call = json_pack("{s:o, s:o}", "args", located(h, args), "kwargs", located(h, kwargs));
  json_array_append_new(json_object_get(env, "inbound_nodes"), located(h, call));
}

static json_t *input(Hub *h, const char *name) {
  json_t *cfg = json_pack("{s:[n, I], s:s}", "batch_shape", (json_int_t)h->steps, "dtype",
                          "int32");
  layer(h, "InputLayer", name, NULL, cfg, NULL, NULL);
  return tensor(h, name, 0);
}

static json_t *normal(Hub *h, double stddev) {
  return located(h, json_pack("{s:s, s:{s:f, s:f, s:n}}", "class_name", "RandomNormal", "config",
                              "mean", 0.0, "stddev", stddev, "seed"));
}

// A call's arguments: one tensor, or a list of two (a merge's).
static json_t *one(Hub *h, const char *name) {
  return located(h, json_pack("[o]", tensor(h, name, 0)));
}

static json_t *two(Hub *h, const char *a, const char *b) {
  return located(h, json_pack("[[o, o]]", tensor(h, a, 0), tensor(h, b, 0)));
}

// A decoder's residual connection, layer `add`: y (after the Dropout(rate)
// layer `drop`, unless drop is NULL) added to x.
static const char *residual(Hub *h, const char *drop, const char *add, const char *y,
                            const char *x, json_t *rate) {
  if (drop) {
    layer(h, "Dropout", drop, NULL, json_pack("{s:O}", "rate", rate), one(h, y), NULL);
    y = drop;
  }
  layer(h, "Add", add, NULL, json_object(), two(h, y, x), NULL);
  return add;
}

// keras-hub's layer groups: the i-th of a class in a list is "<snake>_<i>".
static const char *nth(const char *snake, int i) {
  return i ? format("%s_%d", snake, i) : snake;
}

// ---- GPT-2 (keras_hub/src/models/gpt2/gpt2_backbone.py): token and
// position embeddings, pre-norm TransformerDecoders (causal self-attention
// masked by the padding, a gelu_approximate MLP), a last LayerNormalization;
// GPT2CausalLM's logits are the token embedding's reverse call (tied).

static const char *gpt2_block(Hub *h, int i, const char *x, json_t *dropout) {
  const char *p = format("transformer_layer_%d", i), *g = nth("transformer_decoder", i);
  h->block = i;
  json_t *eps = located(h, json_real(1e-5));
  const char *ln1 = format("%s/self_attention_layer_norm", p);
  layer(h, "LayerNormalization", ln1, format("%s/_self_attention_layer_norm", g),
        json_pack("{s:O}", "epsilon", eps), one(h, x), NULL);
  int64_t heads = hp_val(h, "num_heads", 1), hidden = hp_val(h, "hidden_dim", 1);
  if (hidden / heads == 0)
    error_at(jloc(json_object_get(h->cfg, "num_heads")), "%s: num_heads %lld is more than "
             "hidden_dim %lld", h->cls, (long long)heads, (long long)hidden);
  const char *att = format("%s/self_attention", p);
  layer(h, "MultiHeadAttention", att, format("%s/_self_attention_layer", g),
        json_pack("{s:O, s:I, s:O, s:b, s:o, s:b}", "num_heads", hp_int(h, "num_heads", 1),
                  "key_dim", (json_int_t)(hidden / heads), "dropout", dropout, "use_bias", 1,
                  "kernel_initializer", normal(h, 0.02), "kdcc_padding_mask", 1),
        located(h, json_pack("[o, o]", tensor(h, ln1, 0), tensor(h, ln1, 0))),
        json_pack("{s:b, s:o}", "use_causal_mask", 1, "attention_mask",
                  tensor(h, "padding_mask", 0)));
  const char *r1 = residual(h, format("%s/self_attention_dropout", p),
                            format("%s/add_attention", p), att, x, dropout);
  const char *ln2 = format("%s/feedforward_layer_norm", p);
  layer(h, "LayerNormalization", ln2, format("%s/_feedforward_layer_norm", g),
        json_pack("{s:O}", "epsilon", eps), one(h, r1), NULL);
  const char *f1 = format("%s/feedforward_intermediate_dense", p);
  layer(h, "Dense", f1, format("%s/_feedforward_intermediate_dense", g),
        json_pack("{s:O, s:{s:s, s:s}, s:o}", "units", hp_int(h, "intermediate_dim", 1),
                  "activation", "class_name", "function", "config", "keras_hub>gelu_approximate",
                  "kernel_initializer", normal(h, 0.02)),
        one(h, ln2), NULL);
  const char *f2 = format("%s/feedforward_output_dense", p);
  layer(h, "Dense", f2, format("%s/_feedforward_output_dense", g),
        json_pack("{s:I, s:o}", "units", (json_int_t)hidden, "kernel_initializer",
                  normal(h, 0.02)), one(h, f1), NULL);
  return residual(h, format("%s/feedforward_dropout", p), format("%s/add_feedforward", p), f2,
                  r1, dropout);
}

static const char *gpt2(Hub *h) {
  json_t *dropout = hp_num(h, "dropout", 0.1);
  json_t *len = hp_int(h, "max_sequence_length", 1);
  if (!opt_sequence_length) h->steps = json_integer_value(len);
  else if (h->steps > json_integer_value(len))
    error_at(jloc(len), "%s: --sequence-length %lld is more than max_sequence_length %lld",
             h->cls, (long long)h->steps, (long long)json_integer_value(len));
  input(h, "padding_mask");
  json_t *ids = input(h, "token_ids");
  json_t *tok = layer(h, "ReversibleEmbedding", "token_embedding", "reversible_embedding",
                      json_pack("{s:O, s:O, s:b, s:o}", "input_dim",
                                hp_int(h, "vocabulary_size", 1), "output_dim",
                                hp_int(h, "hidden_dim", 1), "tie_weights", 1,
                                "embeddings_initializer", normal(h, 0.01)),
                      located(h, json_pack("[o]", ids)), NULL);
  layer(h, "PositionEmbedding", "position_embedding", "position_embedding",
        json_pack("{s:O, s:o}", "sequence_length", len, "initializer", normal(h, 0.02)),
        one(h, "token_embedding"), NULL);
  layer(h, "Add", "embeddings_add", NULL, json_object(),
        two(h, "token_embedding", "position_embedding"), NULL);
  layer(h, "Dropout", "embeddings_dropout", NULL, json_pack("{s:O}", "rate", dropout),
        one(h, "embeddings_add"), NULL);
  const char *x = "embeddings_dropout";
  // save_lora_weights's numbers: the embeddings 0 and 1, each decoder then
  // its feedforward norm, output and intermediate dense, attention norm,
  // attention, attention_output, value, key, query
  h->top = 2, h->per_block = 10, h->attention_output = 6;
  for (int i = 0; i < hp_val(h, "num_layers", 1); i++) x = gpt2_block(h, i, x, dropout);
  layer(h, "LayerNormalization", "layer_norm", "layer_normalization",
        json_pack("{s:f}", "epsilon", 1e-5), one(h, x), NULL);
  call_again(h, tok, one(h, "layer_norm"), json_pack("{s:b}", "reverse", 1));
  return "token_embedding";
}

// ---- Llama (keras_hub/src/models/llama/), and Mistral and Qwen, which are
// the same pieces under other names: a token embedding (untied, or tied
// with tie_word_embeddings), pre-norm decoders of RMS norms (x * rsqrt(
// mean(x^2) + eps) * scale, Keras's RMSNormalization), grouped-query
// attention whose query and key are turned by rotary embedding, masked
// causally and by the padding; a SwiGLU MLP (output(intermediate(x) *
// silu(gate(x)))). Llama's rotary embedding is LlamaRotaryEmbedding (Llama
// 3.1's frequency adjustment where the config has one; Llama 3's backbone
// is Llama's), Mistral's and Qwen's keras-hub's RotaryEmbedding with
// rope_scaling_factor; Qwen's query, key and value have biases and its
// head is tied by default. Qwen 3 has no biases but RMS-normalizes each
// query and key head before the rotary embedding (qk_norm).

typedef struct {
  const char *decoder, *norm;   // the weights-file groups of a decoder and the last norm
  bool llama_rope, qkv_bias, tied;
  bool window;                  // Mistral's sliding_window masks attention in training
  bool qk_norm;                 // Qwen 3's query_dense_layernorm and key_dense_layernorm
} Family;

static const Family llama_family = {"llama_transformer_decoder", "llama_layer_norm", true, false,
                                    false, false, false};
static const Family mistral_family = {"mistral_transformer_decoder",
                                      "mistral_layer_normalization", false, false, false, true,
                                      false};
static const Family qwen_family = {"qwen_transformer_decoder", "qwen_layer_norm", false, true,
                                   true, false, false};
static const Family qwen3_family = {"qwen3_transformer_decoder", "qwen3_layer_norm", false,
                                    false, true, false, true};

// The rotary embedding's settings, for the attention builder (kdcc_rope).
static json_t *family_rope(Hub *h, const Family *f) {
  json_t *r = located(h, json_object());
  static const char *const llama_keys[][2] = {
    {"rope_max_wavelength", "max_wavelength"},
    {"rope_position_scaling_factor", "position_scaling_factor"},
    {"rope_frequency_adjustment_factor", "frequency_adjustment_factor"},
    {"rope_low_freq_factor", "low_freq_factor"},
    {"rope_high_freq_factor", "high_freq_factor"},
    {"rope_pretraining_sequence_length", "pretraining_sequence_length"},
  };
  static const char *const linear_keys[][2] = {
    {"rope_max_wavelength", "max_wavelength"},
    {"rope_scaling_factor", "scaling_factor"},
  };
  json_object_set_new(r, "kind", json_string(f->llama_rope ? "llama" : "linear"));
  int n = f->llama_rope ? 6 : 2;
  // LlamaRotaryEmbedding takes Llama 3.1's adjustment (the last four) all
  // together or not at all (keras-hub raises otherwise)
  json_t *adj = f->llama_rope ? json_object_get(h->cfg, llama_keys[2][0]) : NULL;
  for (int i = 3; f->llama_rope && i < n; i++) {
    json_t *v = json_object_get(h->cfg, llama_keys[i][0]);
    bool on = adj && !json_is_null(adj);
    if (on != (v && !json_is_null(v)))
      error_at(v ? jloc_key(h->cfg, llama_keys[i][0]) : jloc(adj), "%s: '%s' is set without "
               "'%s': Llama 3.1's rope settings (rope_frequency_adjustment_factor, "
               "rope_low_freq_factor, rope_high_freq_factor, rope_pretraining_sequence_length) "
               "go together", h->cls,
               on ? llama_keys[2][0] : llama_keys[i][0], on ? llama_keys[i][0] : llama_keys[2][0]);
  }
  for (int i = 0; i < n; i++) {
    const char *const *k = f->llama_rope ? llama_keys[i] : linear_keys[i];
    json_t *v = json_object_get(h->cfg, k[0]);
    if (v && !json_is_null(v)) json_object_set(r, k[1], hp_num(h, k[0], 0));
  }
  return r;
}

// A sliding window (`key` of the config, when `use` is absent or true):
// the steps a query sees, itself included, or 0 when the window covers the
// whole sequence (it changes nothing then).
static int64_t window_of(Hub *h, const char *use, const char *key) {
  json_t *u = use ? json_object_get(h->cfg, use) : NULL, *w = json_object_get(h->cfg, key);
  if ((use && !json_is_true(u)) || !w || json_is_null(w)) return 0;
  int64_t n = hp_val(h, key, 1);
  return h->steps && n < h->steps ? n : 0;
}

// Qwen's use_sliding_window_attention: keras-hub applies it only outside
// its fused attention, so what it does in training depends on the backend;
// a window shorter than the sequence is refused.
static void check_window(Hub *h, const Family *f) {
  // (Qwen 3's sliding_window_size has no use_sliding_window_attention: always on)
  int64_t n = f->window ? 0 : window_of(h, f->qk_norm ? NULL : "use_sliding_window_attention",
                                        "sliding_window_size");
  if (n)
    error_at(jloc(json_object_get(h->cfg, "sliding_window_size")), "%s: a sliding window of "
             "%lld steps, shorter than the %lld of the sequence, is not supported", h->cls,
             (long long)n, (long long)h->steps);
}

// An EinsumDense layer (no bias) on x; init NULL: Keras's default initializer.
static const char *einsum(Hub *h, const char *name, const char *group, const char *eq,
                          json_t *shape, const char *x, json_t *init) {
  json_t *cfg = json_pack("{s:s, s:o, s:n}", "equation", eq, "output_shape", located(h, shape),
                          "bias_axes");
  if (init) json_object_set_new(cfg, "kernel_initializer", init);
  layer(h, "EinsumDense", name, group, cfg, one(h, x), NULL);
  return name;
}

// Qwen 3's attention (keras_hub/src/models/qwen3/qwen3_attention.py) as
// Keras layers: the projections EinsumDense layers ([hidden, heads,
// head_dim] kernels, as GroupedQueryAttention's), each query and key head
// RMS-normalized (Qwen3LayerNorm over head_dim; its epsilon the layer's
// default 1e-5, which Qwen3TransformerDecoder does not pass on), kdcc's
// attention core (rotary embedding, causal and padding masks) as JAX's
// fused dot_product_attention computes it (keras-hub's path on JAX: a query
// with every key masked averages the values), dropout on its output.
static const char *qk_norm_attention(Hub *h, const char *p, const char *g, const char *x,
                                     int64_t nq, int64_t nkv, int64_t hd, int64_t hidden,
                                     json_t *dropout, json_t *rope) {
  const char *a = format("%s/self_attention", p), *ag = format("%s/_self_attention_layer", g);
  static const char *const proj[] = {"query", "key", "value"};
  const char *qkv[3];
  for (int j = 0; j < 3; j++) {
    const char *n = format("%s/%s", a, proj[j]);
    qkv[j] = einsum(h, n, format("%s/_%s_dense", ag, proj[j]), "bqm,muh->bquh",
                    json_pack("[n, I, I]", (json_int_t)(j ? nkv : nq), (json_int_t)hd), x,
                    normal(h, 0.02));
    if (j == 2) break;
    const char *norm = format("%s/%s_dense_layernorm", a, proj[j]);
    layer(h, "RMSNormalization", norm, format("%s/_%s_dense_layer_norm", ag, proj[j]),
          json_pack("{s:f}", "epsilon", 1e-5), one(h, qkv[j]), NULL);
    qkv[j] = norm;
  }
  const char *c = format("%s/core", a);
  layer(h, "kdcc>Attention", c, NULL,
        json_pack("{s:f, s:O, s:b, s:b}", "scale", 1 / sqrt((double)hd), "kdcc_rope", rope,
                  "kdcc_padding_mask", 1, "kdcc_fused_op", 1),
        located(h, json_pack("[o, o, o]", tensor(h, qkv[0], 0), tensor(h, qkv[1], 0),
                             tensor(h, qkv[2], 0))),
        json_pack("{s:o}", "attention_mask", tensor(h, "padding_mask", 0)));
  if (json_number_value(dropout) > 0) {
    layer(h, "Dropout", format("%s/dropout", a), NULL, json_pack("{s:O}", "rate", dropout),
          one(h, c), NULL);
    c = format("%s/dropout", a);
  }
  return einsum(h, format("%s/attention_output", a), format("%s/_output_dense", ag),
                "bquh,uhm->bqm", json_pack("[n, I]", (json_int_t)hidden), c, normal(h, 0.02));
}

static const char *decoder_block(Hub *h, const Family *f, int i, const char *x, json_t *dropout,
                                 json_t *rope) {
  const char *p = format("transformer_layer_%d", i), *g = nth(f->decoder, i);
  json_t *eps = hp_num(h, "layer_norm_epsilon", 1e-6);
  h->block = i;
  int64_t nq = hp_val(h, "num_query_heads", 1), hidden = hp_val(h, "hidden_dim", 1);
  json_t *hdj = json_object_get(h->cfg, "head_dim"); // Mistral's, else hidden / heads
  int64_t hd = json_is_integer(hdj) ? hp_val(h, "head_dim", 1) : hidden / nq;
  if (hd == 0)
    error_at(jloc(json_object_get(h->cfg, "num_query_heads")), "%s: num_query_heads %lld is "
             "more than hidden_dim %lld", h->cls, (long long)nq, (long long)hidden);
  const char *ln1 = format("%s/self_attention_layernorm", p);
  layer(h, "RMSNormalization", ln1, format("%s/_self_attention_layernorm", g),
        json_pack("{s:O}", "epsilon", eps), one(h, x), NULL);
  const char *att = format("%s/self_attention", p);
  if (f->qk_norm) {
    att = qk_norm_attention(h, p, g, ln1, nq, hp_val(h, "num_key_value_heads", 1), hd, hidden,
                            dropout, rope);
  } else {
    json_t *acfg = json_pack("{s:I, s:O, s:O, s:O, s:b, s:b, s:o, s:b, s:O}", "head_dim",
                             (json_int_t)hd, "num_query_heads", hp_int(h, "num_query_heads", 1),
                             "num_key_value_heads", hp_int(h, "num_key_value_heads", 1), "dropout",
                             dropout, "use_bias", f->qkv_bias, "kdcc_output_bias", 0,
                             "kernel_initializer", normal(h, 0.02), "kdcc_padding_mask", 1,
                             "kdcc_rope", rope);
    int64_t window = f->window ? window_of(h, NULL, "sliding_window") : 0;
    if (window) json_object_set_new(acfg, "kdcc_sliding_window", json_integer(window));
    layer(h, "GroupedQueryAttention", att, format("%s/_self_attention_layer", g), acfg,
          located(h, json_pack("[o, o]", tensor(h, ln1, 0), tensor(h, ln1, 0))),
          json_pack("{s:b, s:o}", "use_causal_mask", 1, "attention_mask",
                    tensor(h, "padding_mask", 0)));
  }
  const char *r1 = residual(h, format("%s/self_attention_dropout", p),
                            format("%s/add_attention", p), att, x, dropout);
  const char *ln2 = format("%s/feedforward_layernorm", p);
  layer(h, "RMSNormalization", ln2, format("%s/_feedforward_layernorm", g),
        json_pack("{s:O}", "epsilon", eps), one(h, r1), NULL);
  const char *gate = format("%s/feedforward_gate_dense", p);
  const char *up = format("%s/feedforward_intermediate_dense", p);
  layer(h, "Dense", gate, format("%s/_feedforward_gate_dense", g),
        json_pack("{s:O, s:s, s:b, s:o}", "units", hp_int(h, "intermediate_dim", 1),
                  "activation", "silu", "use_bias", 0, "kernel_initializer", normal(h, 0.02)),
        one(h, ln2), NULL);
  layer(h, "Dense", up, format("%s/_feedforward_intermediate_dense", g),
        json_pack("{s:O, s:b, s:o}", "units", hp_int(h, "intermediate_dim", 1), "use_bias", 0,
                  "kernel_initializer", normal(h, 0.02)), one(h, ln2), NULL);
  const char *mul = format("%s/feedforward_gated", p);
  layer(h, "Multiply", mul, NULL, json_object(), two(h, up, gate), NULL);
  const char *down = format("%s/feedforward_output_dense", p);
  layer(h, "Dense", down, format("%s/_feedforward_output_dense", g),
        json_pack("{s:I, s:b, s:o}", "units", (json_int_t)hidden, "use_bias", 0,
                  "kernel_initializer", normal(h, 0.02)), one(h, mul), NULL);
  return residual(h, NULL, format("%s/add_feedforward", p), down, r1, NULL);
}

static const char *decoder_lm(Hub *h, const Family *f) {
  json_t *dropout = hp_num(h, "dropout", 0);
  json_t *tie = json_object_get(h->cfg, "tie_word_embeddings");
  check_window(h, f);
  input(h, "padding_mask");
  json_t *ids = input(h, "token_ids");
  json_t *tok = layer(h, "ReversibleEmbedding", "token_embedding", "reversible_embedding",
                      json_pack("{s:O, s:O, s:b, s:o}", "input_dim",
                                hp_int(h, "vocabulary_size", 1), "output_dim",
                                hp_int(h, "hidden_dim", 1), "tie_weights",
                                tie && !json_is_null(tie) ? json_is_true(tie) : f->tied,
                                "embeddings_initializer", normal(h, 0.01)),
                      located(h, json_pack("[o]", ids)), NULL);
  json_t *rope = family_rope(h, f);
  const char *x = "token_embedding";
  // save_lora_weights's numbers: the embedding 0, each decoder then its
  // feedforward norm, output, gate and intermediate dense, attention norm,
  // attention, attention_output, value, (key norm,) key, (query norm,) query
  h->top = 1, h->per_block = 11 + 2 * f->qk_norm, h->attention_output = 7;
  h->qk_norm = f->qk_norm ? QK_APART : QK_NONE;
  for (int i = 0; i < hp_val(h, "num_layers", 1); i++)
    x = decoder_block(h, f, i, x, dropout, rope);
  layer(h, "RMSNormalization", "sequence_output_layernorm", f->norm,
        json_pack("{s:O}", "epsilon", hp_num(h, "layer_norm_epsilon", 1e-6)), one(h, x), NULL);
  call_again(h, tok, one(h, "sequence_output_layernorm"), json_pack("{s:b}", "reverse", 1));
  return "token_embedding";
}

static const char *llama(Hub *h) { return decoder_lm(h, &llama_family); }
static const char *mistral(Hub *h) { return decoder_lm(h, &mistral_family); }
static const char *qwen(Hub *h) { return decoder_lm(h, &qwen_family); }
static const char *qwen3(Hub *h) { return decoder_lm(h, &qwen3_family); }

// ---- Gemma (keras_hub/src/models/gemma/): a tied token embedding scaled by
// sqrt(hidden_dim), pre-norm decoder blocks of RMS norms scaling by
// (1 + scale), attention whose projections are EinsumDense layers with
// [heads, hidden, head_dim] kernels around kdcc's attention core (rotary
// embedding on query and key, scores by 1/sqrt(head_dim), Gemma 2's
// soft cap), a GeGLU MLP (ffw_linear(gelu_approximate(ffw_gating(x)) *
// ffw_gating_2(x))); the logits soft-capped where final_logit_soft_cap says.
// Gemma 3 (keras_hub/src/models/gemma3/, its text model) is the same
// pieces: see gemma3_family.

typedef struct {
  const char *decoder;  // a block's weights-file group
  int gate_div;         // the MLP's width is intermediate_dim / gate_div
  bool gemma3;          // Gemma 3's blocks (gemma3_block_kind)
} GemmaFamily;

static const GemmaFamily gemma_family = {"gemma_decoder_block", 2, false};
// Gemma3DecoderBlock: gate_dim_reduction 1; each query and key head
// RMS-normalized before the rotary embedding (use_query_key_norm); blocks
// local (sliding window, rope 1e4 by local_rope_scaling_factor) or global
// (rope 1e6 by global_rope_scaling_factor); the attention's projections
// glorot_uniform (CachedGemma3Attention's default, nothing passes another)
static const GemmaFamily gemma3_family = {"gemma3_decoder_block", 1, true};

// keras-hub's VarianceScaling(1, "fan_in", "untruncated_normal"): a normal
// of variance 1 / fan_in, fan_in as Keras counts it for the kernel's shape.
static json_t *variance_scaling(Hub *h, int64_t fan_in) {
  return normal(h, 1 / sqrt((double)fan_in));
}

// Gemma's RMSNormalization layer `name` (eps: its epsilon) on x.
static const char *rms1(Hub *h, const char *name, const char *group, const char *x, json_t *eps) {
  layer(h, "RMSNormalization", name, group,
        json_pack("{s:O, s:b}", "epsilon", eps, "kdcc_scale_plus_one", 1), one(h, x), NULL);
  return name;
}

// Gemma3Backbone's block i: local (`use_sliding_window_attention and i % 6
// < 5`: five local to one global) or global; its rotary embedding's
// settings (rope) and sliding window (0: none, or one covering the sequence).
static int64_t gemma3_block_kind(Hub *h, int i, json_t *rope) {
  bool local = json_is_true(json_object_get(h->cfg, "use_sliding_window_attention")) && i % 6 < 5;
  json_object_set_new(rope, "max_wavelength", json_real(local ? 1e4 : 1e6));
  json_object_set(rope, "scaling_factor", hp_num(h, local ? "local_rope_scaling_factor"
                                                          : "global_rope_scaling_factor", 1.0));
  return local ? window_of(h, NULL, "sliding_window_size") : 0;
}

// Gemma 3's use_query_key_norm (keras-hub's default True).
static bool gemma3_qk_norm(Hub *h, const GemmaFamily *f) {
  return f->gemma3 && !json_is_false(json_object_get(h->cfg, "use_query_key_norm"));
}

static const char *gemma_block(Hub *h, const GemmaFamily *f, int i, const char *x) {
  const char *p = format("decoder_block_%d", i), *g = nth(f->decoder, i);
  h->block = i;
  json_t *rope = located(h, json_pack("{s:s, s:f}", "kind", "linear", "max_wavelength", 10000.0));
  // Gemma 2: every other block (the even ones) attends within a sliding
  // window; Gemma 3: its local blocks
  int64_t window = f->gemma3 ? gemma3_block_kind(h, i, rope)
                   : i % 2   ? 0
                             : window_of(h, "use_sliding_window_attention", "sliding_window_size");
  // Gemma 3's blocks are built without the backbone's layer_norm_epsilon
  // (their norms', and their attention's query/key norms', is 1e-6)
  json_t *eps = f->gemma3 ? located(h, json_real(1e-6)) : hp_num(h, "layer_norm_epsilon", 1e-6);
  bool qk_norm = gemma3_qk_norm(h, f);
  int64_t nq = hp_val(h, "num_query_heads", 1), nkv = hp_val(h, "num_key_value_heads", 1);
  int64_t hd = hp_val(h, "head_dim", 1), hidden = hp_val(h, "hidden_dim", 1);
  if (nq % nkv)
    error_at(jloc(json_object_get(h->cfg, "num_key_value_heads")), "%s: num_query_heads %lld is "
             "not a multiple of num_key_value_heads %lld", h->cls, (long long)nq, (long long)nkv);
  const char *n1 = rms1(h, format("%s/pre_attention_norm", p), format("%s/pre_attention_norm", g),
                        x, eps);
  const char *a = format("%s/attention", p), *ag = format("%s/attention", g);
  const char *q = einsum(h, format("%s/query", a), format("%s/query_dense", ag), "btd,ndh->btnh",
                         json_pack("[n, I, I]", (json_int_t)nq, (json_int_t)hd), n1,
                         f->gemma3 ? NULL : variance_scaling(h, hidden * nq));
  const char *k = einsum(h, format("%s/key", a), format("%s/key_dense", ag), "bsd,kdh->bskh",
                         json_pack("[n, I, I]", (json_int_t)nkv, (json_int_t)hd), n1,
                         f->gemma3 ? NULL : variance_scaling(h, hidden * nkv));
  const char *v = einsum(h, format("%s/value", a), format("%s/value_dense", ag), "bsd,kdh->bskh",
                         json_pack("[n, I, I]", (json_int_t)nkv, (json_int_t)hd), n1,
                         f->gemma3 ? NULL : variance_scaling(h, hidden * nkv));
  if (qk_norm) {
    q = rms1(h, format("%s/query_norm", a), format("%s/query_norm", ag), q, eps);
    k = rms1(h, format("%s/key_norm", a), format("%s/key_norm", ag), k, eps);
  }
  // keras-hub 0.32's GemmaDecoderBlock gives its attention
  // query_head_dim_normalize=True whatever the backbone's says: 1/sqrt(head_dim)
  double scale = 1 / sqrt((double)hd);
  json_t *cap = json_object_get(h->cfg, "attention_logit_soft_cap");
  json_t *core = json_pack("{s:f, s:O, s:o, s:b}", "scale", scale, "dropout",
                           hp_num(h, "dropout", 0), "kdcc_rope", rope, "kdcc_padding_mask", 1);
  if (cap && !json_is_null(cap)) json_object_set(core, "logit_soft_cap", cap);
  if (window) json_object_set_new(core, "sliding_window", json_integer(window));
  const char *c = format("%s/core", a);
  layer(h, "kdcc>Attention", c, NULL, core,
        located(h, json_pack("[o, o, o]", tensor(h, q, 0), tensor(h, k, 0), tensor(h, v, 0))),
        json_pack("{s:o}", "attention_mask", tensor(h, "padding_mask", 0)));
  const char *o = einsum(h, format("%s/attention_output", a), format("%s/output_dense", ag),
                         "btnh,nhd->btd", json_pack("[n, I]", (json_int_t)hidden), c,
                         f->gemma3 ? NULL : variance_scaling(h, hd * nq));
  if (json_is_true(json_object_get(h->cfg, "use_post_attention_norm")))
    o = rms1(h, format("%s/post_attention_norm", p), format("%s/post_attention_norm", g), o,
             eps);
  // the block's attention_dropout (keras-hub's Gemma and Gemma 3 alike)
  if (json_number_value(hp_num(h, "dropout", 0)) > 0) {
    layer(h, "Dropout", format("%s/attention_dropout", p), NULL,
          json_pack("{s:O}", "rate", hp_num(h, "dropout", 0)), one(h, o), NULL);
    o = format("%s/attention_dropout", p);
  }
  const char *r1 = residual(h, NULL, format("%s/add_attention", p), x, o, NULL); // x + attention
  const char *n2 = rms1(h, format("%s/pre_ffw_norm", p), format("%s/pre_ffw_norm", g), r1, eps);
  json_t *half = json_pack("[n, I]", (json_int_t)(hp_val(h, "intermediate_dim", f->gate_div) /
                                                  f->gate_div));
  const char *x1 = einsum(h, format("%s/ffw_gating", p), format("%s/gating_ffw", g),
                          "btd,df->btf", json_deep_copy(half), n2, NULL);
  const char *x2 = einsum(h, format("%s/ffw_gating_2", p), format("%s/gating_ffw_2", g),
                          "btd,df->btf", half, n2, NULL);
  const char *act = format("%s/ffw_gelu", p);
  layer(h, "Activation", act, NULL, json_pack("{s:{s:s, s:s}}", "activation", "class_name",
                                               "function", "config", "keras_hub>gelu_approximate"),
        one(h, x1), NULL);
  const char *m = format("%s/ffw_gated", p);
  layer(h, "Multiply", m, NULL, json_object(), two(h, act, x2), NULL);
  const char *y = einsum(h, format("%s/ffw_linear", p), format("%s/ffw_linear", g), "btf,fd->btd",
                         json_pack("[n, I]", (json_int_t)hidden), m, NULL);
  if (json_is_true(json_object_get(h->cfg, "use_post_ffw_norm")))
    y = rms1(h, format("%s/post_ffw_norm", p), format("%s/post_ffw_norm", g), y, eps);
  return residual(h, NULL, format("%s/add_feedforward", p), y, r1, NULL);
}

static const char *gemma_lm(Hub *h, const GemmaFamily *f) {
  input(h, "padding_mask");
  json_t *ids = input(h, "token_ids");
  json_t *cap = json_object_get(h->cfg, "final_logit_soft_cap");
  json_t *emb = json_pack("{s:O, s:O, s:b, s:o}", "input_dim", hp_int(h, "vocabulary_size", 1),
                          "output_dim", hp_int(h, "hidden_dim", 1), "tie_weights", 1,
                          "embeddings_initializer",
                          variance_scaling(h, hp_val(h, "vocabulary_size", 1)));
  if (cap && !json_is_null(cap)) json_object_set(emb, "logit_soft_cap", cap);
  json_t *tok = layer(h, "ReversibleEmbedding", "token_embedding", "reversible_embedding", emb,
                      located(h, json_pack("[o]", ids)), NULL);
  layer(h, "Rescaling", "token_embedding_scaled", NULL,
        json_pack("{s:f, s:f}", "scale", sqrt((double)hp_val(h, "hidden_dim", 1)), "offset", 0.0),
        one(h, "token_embedding"), NULL);
  const char *x = "token_embedding_scaled";
  // save_lora_weights's numbers: the embedding 0, each block then its
  // ffw_linear, ffw_gating_2, ffw_gating, (post_ffw_norm,) pre_ffw_norm,
  // attention, attention_output, (key_norm, query_norm,) value, key, query,
  // (post_attention_norm,) pre_attention_norm
  int post_ffw = json_is_true(json_object_get(h->cfg, "use_post_ffw_norm"));
  int post_att = json_is_true(json_object_get(h->cfg, "use_post_attention_norm"));
  int qk = gemma3_qk_norm(h, f);
  h->top = 1, h->per_block = 11 + post_ffw + post_att + 2 * qk, h->attention_output = 6 + post_ffw;
  h->qk_norm = qk ? QK_FIRST : QK_NONE;
  for (int i = 0; i < hp_val(h, "num_layers", 1); i++) x = gemma_block(h, f, i, x);
  rms1(h, "final_normalization", "rms_normalization", x, hp_num(h, "layer_norm_epsilon", 1e-6));
  call_again(h, tok, one(h, "final_normalization"), json_pack("{s:b}", "reverse", 1));
  return "token_embedding";
}

static const char *gemma(Hub *h) { return gemma_lm(h, &gemma_family); }
// Gemma3Backbone's settings for what text-only Gemma 3 does not build: each
// must say it is off (a vision encoder, EmbeddingGemma's bidirectional
// attention and pooled output are refused where they are set).
static const char *gemma3(Hub *h) {
  static const char *const off[] = {"vision_encoder", "use_bidirectional_attention",
                                    "is_embedding_model"};
  for (int i = 0; i < 3; i++) {
    json_t *v = json_object_get(h->cfg, off[i]);
    if (v && !json_is_null(v) && !json_is_false(v))
      error_at(jloc_key(h->cfg, off[i]), "%s: '%s' is set: kdcc compiles Gemma 3's text model "
               "(no vision encoder, causal attention, no pooled output)", h->cls, off[i]);
  }
  // Gemma3DecoderBlock clips its float16 sums to +-65504, which kdcc's
  // float16 policies do not
  const char *policy = policy_name(h);
  if (policy && strstr(policy, "float16") && strcmp(policy, "bfloat16") &&
      strcmp(policy, "mixed_bfloat16"))
    error_at(opt_dtype_policy || !json_object_get(h->cfg, "dtype") ? h->at
             : jloc_key(h->cfg, "dtype"), "%s: %s '%s': kdcc does not clip float16 values to "
             "+-65504 as Gemma 3's blocks do (float32, bfloat16 and mixed_bfloat16 are "
             "compiled)", h->cls, opt_dtype_policy ? "--dtype-policy" : "dtype policy", policy);
  return gemma_lm(h, &gemma3_family);
}

// ---- the table of backbones and tasks

// The hyper-parameters each backbone's get_config writes (keras-hub 0.32),
// besides Backbone's own name, trainable and dtype: the keys kdcc follows.
// (LlamaBackbone takes tie_word_embeddings but does not write it.)
#define DECODER_KEYS "vocabulary_size num_layers num_query_heads num_key_value_heads " \
  "hidden_dim intermediate_dim layer_norm_epsilon dropout "
#define LLAMA_KEYS DECODER_KEYS "rope_max_wavelength rope_position_scaling_factor " \
  "rope_frequency_adjustment_factor rope_low_freq_factor rope_high_freq_factor " \
  "rope_pretraining_sequence_length tie_word_embeddings"

static const struct {
  const char *backbone, *task;
  const char *group;            // the backbone's weights-file group in a task's archive
  const char *(*build)(Hub *h); // writes the layers; returns the logits' layer (its last call)
  const char *keys;             // its config's hyper-parameters, space-separated
} models[] = {
  {"GPT2Backbone", "GPT2CausalLM", "gpt2_backbone", gpt2,
   "vocabulary_size num_layers num_heads hidden_dim intermediate_dim dropout "
   "max_sequence_length"},
  {"LlamaBackbone", "LlamaCausalLM", "llama_backbone", llama, LLAMA_KEYS},
  {"Llama3Backbone", "Llama3CausalLM", "llama3_backbone", llama, LLAMA_KEYS},
  {"GemmaBackbone", "GemmaCausalLM", "gemma_backbone", gemma,
   DECODER_KEYS "head_dim query_head_dim_normalize use_post_ffw_norm use_post_attention_norm "
   "final_logit_soft_cap attention_logit_soft_cap sliding_window_size "
   "use_sliding_window_attention"},
  // (image_size, pooling_intermediate_dim and embedding_dim do nothing in
  // the text model; query_head_dim_normalize nothing at all: keras-hub's
  // decoder block gives its attention True, 1/sqrt(head_dim))
  {"Gemma3Backbone", "Gemma3CausalLM", "gemma3_backbone", gemma3,
   DECODER_KEYS "head_dim query_head_dim_normalize use_query_key_norm use_post_ffw_norm "
   "use_post_attention_norm final_logit_soft_cap attention_logit_soft_cap sliding_window_size "
   "use_sliding_window_attention local_rope_scaling_factor global_rope_scaling_factor "
   "image_size vision_encoder use_bidirectional_attention is_embedding_model "
   "pooling_intermediate_dim embedding_dim"},
  {"MistralBackbone", "MistralCausalLM", "mistral_backbone", mistral,
   DECODER_KEYS "rope_max_wavelength rope_scaling_factor sliding_window head_dim"},
  {"QwenBackbone", "QwenCausalLM", "qwen_backbone", qwen,
   DECODER_KEYS "rope_max_wavelength rope_scaling_factor tie_word_embeddings "
   "use_sliding_window_attention sliding_window_size"},
  {"Qwen3Backbone", "Qwen3CausalLM", "qwen3_backbone", qwen3,
   DECODER_KEYS "head_dim rope_max_wavelength rope_scaling_factor tie_word_embeddings "
   "sliding_window_size"},
};

// Every key of the backbone's config is one kdcc follows (keys, or
// Backbone's own), never silently passed over.
static void check_keys(Hub *h, const char *keys) {
  const char *k;
  json_t *v;
  json_object_foreach(h->cfg, k, v) {
    if (strstr(format(" %s ", keys), format(" %s ", k)) || !strcmp(k, "name") ||
        !strcmp(k, "dtype"))
      continue;
    if (!strcmp(k, "trainable")) {
      if (json_is_false(v))
        error_at(jloc_key(h->cfg, k), "%s: 'trainable' false (a frozen backbone) is not "
                 "supported", h->cls);
      continue;
    }
    error_at(jloc_keyname(h->cfg, k), "%s: config key '%s' is not one kdcc follows (a "
             "keras-hub variant or setting it does not compile); it follows name, trainable, "
             "dtype and %s", h->cls, k, keys);
  }
}

static const char *registered(json_t *env) {
  const char *r = json_get_str(env, "registered_name");
  return r && !strncmp(r, "keras_hub>", 10) ? r + 10 : NULL;
}

bool hub_model(json_t *root) { return registered(root) != NULL; }

// keras-hub's CausalLM.compile() defaults, for a preset (which holds no
// compile settings): Adam(2e-5), SparseCategoricalCrossentropy(from_logits),
// SparseCategoricalAccuracy as a weighted metric.
static json_t *default_compile(void) {
  return json_pack("{s:{s:s, s:{s:f}}, s:{s:s, s:{s:b}}, s:[s]}", "optimizer", "class_name",
                   "Adam", "config", "learning_rate", 2e-5, "loss", "class_name",
                   "SparseCategoricalCrossentropy", "config", "from_logits", 1,
                   "weighted_metrics", "sparse_categorical_accuracy");
}

// issue 23: the backbone's variables are bfloat16 (its policy, or
// --dtype-policy's, is "bfloat16").
static bool bf16_variables(Hub *h) {
  const char *name = policy_name(h);
  return name && !strcmp(name, "bfloat16");
}

json_t *hub_expand(json_t *root, bool preset, const char **scope) {
  const char *cls = registered(root);
  json_t *cfg = json_object_get(root, "config"), *bb = NULL;
  if (!json_is_object(cfg)) // (the errors below point into it)
    error_at(jloc_key(root, "config"), "%s: expected its 'config' object", cls);
  int k = -1;
  for (int i = 0; i < (int)(sizeof models / sizeof *models); i++) {
    if (!strcmp(cls, models[i].task)) {
      k = i;
      bb = json_object_get(cfg, "backbone");
      if (!json_is_object(bb) || !registered(bb) || strcmp(registered(bb), models[i].backbone))
        error_at(jloc_key(cfg, "backbone"), "%s: 'backbone' must be a %s envelope", cls,
                 models[i].backbone);
    } else if (!strcmp(cls, models[i].backbone)) {
      error_at(jloc_key(root, "registered_name"), "%s is a backbone alone: its output is "
               "hidden states, with no loss to train; compile its task (%s: a preset "
               "directory's task.json, or the task's .keras)", cls, models[i].task);
    }
  }
  if (k < 0) {
    const char *known = "";
    for (int i = 0; i < (int)(sizeof models / sizeof *models); i++)
      known = format("%s%s%s", known, i ? ", " : "", models[i].task);
    error_at(jloc_key(root, "registered_name"), "keras-hub model '%s' is not supported (kdcc "
             "compiles %s)", cls, known);
  }
  Hub h = {.env = bb, .cfg = json_object_get(bb, "config"), .cls = models[k].backbone,
           .steps = opt_sequence_length};
  if (!json_is_object(h.cfg))
    error_at(jloc(bb), "%s: the backbone has no 'config' object", h.cls);
  h.at = jloc(h.cfg);
  h.layers = located(&h, json_array());
  json_t *p = json_object_get(cfg, "preprocessor");
  if (p && !json_is_null(p))
    warn_at(jloc(p), "%s: its preprocessor is not compiled: the program takes token ids "
            "(token_ids, padding_mask), not text", cls);
  check_keys(&h, models[k].keys);
  if (opt_lora_rank) read_lora_targets(&h);
  const char *out = models[k].build(&h);
  if (!h.steps)
    error_at(h.at, "%s: give the token steps with --sequence-length (the config has no "
             "max_sequence_length)", h.cls);
  json_t *ncfg = json_pack("{s:s, s:o, s:[[s, i, i], [s, i, i]], s:[[s, i, i]]}", "name",
                           json_get_str(cfg, "name") ? json_get_str(cfg, "name") : "causal_lm",
                           "layers", h.layers, "input_layers", "padding_mask", 0, 0,
                           "token_ids", 0, 0, "output_layers", out, 1, 0);
  json_t *cc = json_object_get(root, "compile_config");
  if (!cc || json_is_null(cc)) {
    cc = located(&h, default_compile());
    warn_at(jloc(root), "%s has no compile_config (a preset holds none): compiled as "
            "keras-hub's %s.compile() defaults, Adam(learning_rate=2e-5), "
            "SparseCategoricalCrossentropy(from_logits=True), weighted metric "
            "sparse_categorical_accuracy", cls, cls);
    // Adam's update_step casts beta_2 to the variable's dtype: 0.999 is 1 in
    // bfloat16, so its alpha (lr * sqrt(1 - beta_2^t) / ...) is 0
    if (bf16_variables(&h))
      warn_at(jloc(root), "%s: its variables are bfloat16, where the default Adam's beta_2 "
              "0.999 is 1: every step is 0 and no variable moves, as in keras-hub; give "
              "task.json a compile_config with an optimizer that moves bfloat16 variables "
              "(AdamW(beta_2=0.99), SGD)", cls);
  }
  json_t *out_root = json_pack("{s:s, s:o, s:O}", "class_name", "Functional", "config",
                               located(&h, ncfg), "compile_config", cc);
  json_t *dist = json_object_get(root, "distribution");
  if (dist) json_object_set(out_root, "distribution", dist);
  // A task's archive keeps the backbone's layers under the backbone's
  // group (its class in snake case); a preset's weights file is the
  // backbone's own.
  *scope = preset ? NULL : models[k].group;
  return located(&h, out_root);
}

// ---- preset directories

json_t *hub_load_preset(const char *dir, const char **weights) {
  const char *task = format("%s/task.json", dir), *config = format("%s/config.json", dir);
  if (access(config, R_OK) != 0)
    error("%s: a directory is read as a keras-hub preset, but it has no config.json", dir);
  if (access(task, R_OK) != 0)
    error("%s: the preset has no task.json: its backbone alone (config.json) has no loss to "
          "train; save the task with task.save_to_preset(...)", dir);
  json_t *root = json_load_file_located(task);
  *weights = format("%s/model.weights.h5", dir);
  if (access(*weights, R_OK) != 0) {
    warn_at(jloc(root), "%s: the preset has no model.weights.h5: the program starts from "
            "kdcc's random initial weights", dir);
    *weights = NULL;
  }
  return root;
}
