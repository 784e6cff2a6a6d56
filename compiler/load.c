// load.c: Keras model JSON -> Model (layers, edges; compile config: load_compile.c).
//
// Input: the document `model.to_json()` writes, or the `config.json` of a
// `.keras` archive; both are an envelope
//   {"module", "class_name": "Sequential" | "Functional" | "Model",
//    "config": {"name", "layers": [...], ...}, "compile_config": {...}}
// plus, as a kdcc extension, an optional top-level "distribution" object.
//
// Sequential: layers chain in file order. The input shape comes from a
// leading InputLayer, else the model's build_input_shape, else the first
// layer's batch_input_shape / build_config.input_shape; when there is no
// InputLayer one is synthesised. Paths are "<model>/<layer>".
//
// Functional: each layer lists its calls in inbound_nodes, in the Keras 3
// form {"args": [tensor or [tensor, ...]], "kwargs": {}} where a tensor is a
// __keras_tensor__ with keras_history [layer, node, tensor], or the Keras 2
// form [[["layer", node, tensor, {kwargs}], ...]]. A layer called several
// times (shared weights) becomes one Layer per call, the clones pointing
// at the first, so that every call is ordered and built on its own inputs
// while the variables stay one. Paths are "<layer>".
//
// Nested models: a Sequential or Functional in the layers list is a model
// used as a layer. Its layers are loaded into the same Model, named
// "<model>/<layer>", its InputLayers bound to the tensors its call passes,
// its outputs standing for the call's; the model's own Layer and its
// InputLayers are then dropped. Variable paths are those Keras gives a
// nested model built on its own before it is used: "<model>/<layer>" in a
// Sequential, "<layer>" in a Functional. Its variables live in the weights
// file under layers/<its group>/layers/<inner group> (Layer.scope).
//
// Invariants on return: every TensorRef points at a layer of the model;
// Model.layers is in topological order (a layer after all its inputs; file
// order where that leaves a choice), holds every InputLayer and every layer
// the outputs depend on, and Layer.index is the position in it. Layers that
// no output depends on get a warning and are dropped. Every layer's dtype is
// float32, or (issue 23) a mixed policy: Layer.cdt. Every user error names
// the layer, at the JSON value at fault.
//
// compile_config is read by load_compile.c, once the outputs are known.
#include "kdcc.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


static bool is_input(const Layer *l) {
  return !strcmp(l->cls, "InputLayer");
}

// Layers by name: an open-addressing hash (Model.names) holding the first
// Layer of each name in Model.layers, so that a model of many layers loads
// in linear time.
static Layer **name_slot(Model *m, const char *name) {
  size_t mask = m->names_cap - 1;
  for (size_t i = hash_str(name) & mask;; i = (i + 1) & mask)
    if (!m->names[i] || !strcmp(m->names[i]->name, name))
      return &m->names[i];
}

static void index_names(Model *m) {
  for (int i = 0; i < m->nlayers; i++) {
    Layer **slot = name_slot(m, m->layers[i]->name);
    if (!*slot)
      *slot = m->layers[i];
  }
}

Layer *find_layer(Model *m, const char *name) {
  return m->names ? *name_slot(m, name) : NULL;
}

// ---- typed config getters

static json_t *cfg_get(const Layer *l, const char *key) {
  json_t *v = l->cfg ? json_object_get(l->cfg, key) : NULL;
  return json_is_null(v) ? NULL : v;
}

int64_t cfg_int(const Layer *l, const char *key, int64_t def) {
  json_t *v = cfg_get(l, key);
  if (!v)
    return def;
  if (!json_is_integer(v))
    error_at(jloc_key(l->cfg, key), "layer '%s': '%s' must be an integer", l->name, key);
  return json_integer_value(v);
}

double cfg_num(const Layer *l, const char *key, double def) {
  json_t *v = cfg_get(l, key);
  if (!v)
    return def;
  if (!json_is_number(v))
    error_at(jloc_key(l->cfg, key), "layer '%s': '%s' must be a number", l->name, key);
  if (fabs(json_number_value(v)) > FLT_MAX) // it becomes a float literal of the program
    error_at(jloc_key(l->cfg, key), "layer '%s': '%s' is %g, beyond float32's range", l->name,
             key, json_number_value(v));
  return json_number_value(v);
}

bool cfg_bool(const Layer *l, const char *key, bool def) {
  json_t *v = cfg_get(l, key);
  if (!v)
    return def;
  if (!json_is_boolean(v))
    error_at(jloc_key(l->cfg, key), "layer '%s': '%s' must be true or false", l->name, key);
  return json_is_true(v);
}

const char *cfg_str(const Layer *l, const char *key, const char *def) {
  json_t *v = cfg_get(l, key);
  if (!v)
    return def;
  if (!json_is_string(v))
    error_at(jloc_key(l->cfg, key), "layer '%s': '%s' must be a string", l->name, key);
  return json_string_value(v);
}

int cfg_ints(const Layer *l, const char *key, int64_t *out, int max) {
  json_t *v = cfg_get(l, key);
  if (!v)
    return 0;
  if (json_is_integer(v)) {
    for (int i = 0; i < max; i++)
      out[i] = json_integer_value(v);
    return max;
  }
  if (!json_is_array(v))
    error_at(jloc_key(l->cfg, key), "layer '%s': '%s' must be an integer or a list of integers",
             l->name, key);
  int n = (int)json_array_size(v);
  if (n > max)
    error_at(jloc_key(l->cfg, key), "layer '%s': '%s' has %d entries; at most %d are supported",
             l->name, key, n, max);
  for (int i = 0; i < n; i++) {
    json_t *e = json_array_get(v, (size_t)i);
    if (!json_is_integer(e))
      error_at(jloc_idx(v, (size_t)i), "layer '%s': '%s' must be an integer or a list of integers",
               l->name, key);
    out[i] = json_integer_value(e);
  }
  return n;
}

// A size (units, filters, a window's extent): an error at the value unless
// it is an integer in [1, MAX_DIM].
static int64_t check_size(const Layer *l, const char *key, Loc at, int64_t v) {
  if (v <= 0)
    error_at(at, "layer '%s': '%s' must be positive", l->name, key);
  if (v > MAX_DIM)
    error_at(at, "layer '%s': '%s' is %lld; a dimension may be at most %d", l->name, key,
             (long long)v, MAX_DIM);
  return v;
}

int64_t cfg_size(const Layer *l, const char *key, int64_t def) {
  if (!cfg_get(l, key))
    return def;
  return check_size(l, key, jloc_key(l->cfg, key), cfg_int(l, key, def));
}

int cfg_sizes(const Layer *l, const char *key, int64_t *out, int max) {
  int n = cfg_ints(l, key, out, max);
  json_t *v = cfg_get(l, key);
  for (int i = 0; i < n; i++)
    check_size(l, key, json_is_array(v) ? jloc_idx(v, (size_t)i) : jloc(v), out[i]);
  return n;
}

// ---- layers

// issue 23: Keras's dtype policies (keras/src/dtype_policies). A mixed one
// keeps float32 variables and computes in its 16-bit type: kdcc rounds to
// it where Keras casts (ir.c, build_layer), its buffers still float32. A
// pure one (bfloat16, float16) computes as the mixed one and keeps its
// variables in its type too (Var.vdt): in float32 buffers holding exact
// 16-bit values.
static const struct {
  const char *name;
  int cdt;             // the compute dtype: KDRT_ROUND_*, 0 float32
  int vdt;             // the variables' dtype: KDRT_ROUND_*, 0 float32
  const char *not_yet; // why kdcc refuses it, or NULL
} policies[] = {
  {"float32", 0, 0, NULL},
  {"mixed_bfloat16", KDRT_ROUND_BF16, 0, NULL},
  {"mixed_float16", KDRT_ROUND_F16, 0, NULL}, // with compile's LossScaleOptimizer (load_compile.c)
  {"bfloat16", KDRT_ROUND_BF16, KDRT_ROUND_BF16, NULL}, // most keras-hub presets are saved so
  {"float16", KDRT_ROUND_F16, KDRT_ROUND_F16, NULL}, // no loss scaling: Keras's compile adds none
};

// The layers whose rounding points under a mixed policy kdcc follows
// (layers.c's build_layer and its builders; KERAS.md).
static const char *const mixed_classes[] = {
  "Dense", "EinsumDense", "Embedding", "PositionEmbedding", "LayerNormalization",
  "MultiHeadAttention", "Conv2D", "BatchNormalization", "Activation", "ReLU", "Softmax",
  "Add", "Subtract", "Multiply", "Concatenate", "Dropout", "Flatten", "Reshape", "Permute",
  "MaxPooling2D", "GlobalAveragePooling1D", "GlobalAveragePooling2D",
  // hub.c's keras-hub models (layers.c's build_layer says how they round)
  "RMSNormalization", "ReversibleEmbedding", "GroupedQueryAttention", "kdcc>Attention",
  "Rescaling",
};

// Under a pure policy a layer computes as under the mixed one on variables
// that hold 16-bit values (LayerNormalization and BatchNormalization read
// their gamma and beta in float32 either way, an RMS norm its scale in the
// compute dtype; batch norm's moving statistics are assigned rounded),
// checked against Keras by keras_ref's bf16_* and f16_* cases and
// keras-hub's bfloat16 Gemma preset (keras_weights.sh).

static bool class_in(const char *cls, const char *const *list, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (!strcmp(list[k], cls)) return true;
  return false;
}

const char *opt_dtype_policy;

// Layer l's policy `t` (at `at`; no file: --dtype-policy's) into l->cdt
// and l->vdt.
static void set_policy(Layer *l, const char *t, Loc at) {
  size_t i = 0, n = sizeof policies / sizeof *policies;
  while (i < n && strcmp(policies[i].name, t)) i++;
  const char *from = at.file ? "" : " (--dtype-policy)";
  if (i == n)
    error_at(at, "layer '%s': dtype '%s'%s is not supported (float32, mixed_bfloat16, "
             "mixed_float16, bfloat16, float16%s)", l->name,
             t, from, strcmp(l->cls, "InputLayer") ? "" : ", or integer ids on an InputLayer");
  if (policies[i].not_yet)
    error_at(at, "layer '%s': dtype policy '%s'%s %s", l->name, t, from, policies[i].not_yet);
  if (!policies[i].cdt) return;
  if (!class_in(l->cls, mixed_classes, sizeof mixed_classes / sizeof *mixed_classes))
    error_at(at, "layer '%s': dtype policy '%s'%s is not supported for %s yet", l->name, t,
             from, l->cls);
  l->cdt = policies[i].cdt;
  l->vdt = policies[i].vdt;
}

// An InputLayer holds float32, integer ids (int32 in the program, whatever
// integer width Keras wrote), or a bool attention_mask (int32 0 or 1);
// other layers a policy (set_policy). dtype is a string or a (DType)Policy
// envelope; --dtype-policy replaces every layer's but the inputs'.
static void check_dtype(Layer *l) {
  bool input = !strcmp(l->cls, "InputLayer");
  if (opt_dtype_policy && !input) {
    set_policy(l, opt_dtype_policy, l->loc);
    return;
  }
  json_t *d = cfg_get(l, "dtype");
  if (!d)
    return;
  json_t *name = d;
  if (json_is_object(d))
    name = json_object_get(json_object_get(d, "config"), "name");
  if (!json_is_string(name))
    error_at(jloc(d), "layer '%s': 'dtype' must be a string or a DTypePolicy", l->name);
  const char *t = json_string_value(name);
  static const char *const ints[] = {"int32", "int64", "int16", "int8", "uint8", "uint16",
                                     "uint32", "bool"};
  if (input) {
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
      if (!strcmp(t, ints[i])) {
        l->in_int = true;
        return;
      }
    if (strcmp(t, "float32") != 0)
      error_at(jloc(name), "layer '%s': dtype '%s' is not supported (only float32, or integer "
               "ids on an InputLayer)", l->name, t);
    return;
  }
  set_policy(l, t, jloc(name));
}

// A model being loaded: the top one, or a nested one (a Layer's nest).
typedef struct Nest Nest;
struct Nest {
  const char *name;
  bool sequential;
  const char *qual;       // prefix of its layers' names: "" or "<outer qual><name>/"
  const char *vpre;       // prefix of their variable paths
  const char *scope;      // its weights-file group (NULL: the top model)
  bool hub;               // hub.c's expansion of a keras-hub model: its layer names are
                          // keras-hub's paths, with '/'
  int nseq, nfun;         // nested Sequentials and Functionals loaded in it so far
  Layer **inputs;         // its InputLayers, in input order
  int ninputs;
  TensorRef *outputs;
  int noutputs;
};

// Layer `name` of model b (a name with '/' is no layer's: it would reach
// into a nested model).
static Layer *qual_layer(Model *m, const Nest *b, const char *name) {
  if (strchr(name, '/') && !b->hub)
    return NULL;
  return find_layer(m, *b->qual ? format("%s%s", b->qual, name) : name);
}

static void load_box(Model *m, Nest *b, json_t *cfg);

static void add_layer(Model *m, Layer *l) {
  Layer *old = find_layer(m, l->name);
  if (old)
    error_at(l->loc, "duplicate layer name '%s' (first defined at line %d)", l->name,
             old->loc.line);
  l->index = m->nlayers;
  m->layers[m->nlayers++] = l;
  *name_slot(m, l->name) = l;
}

static bool is_model_class(const char *cls) {
  return !strcmp(cls, "Sequential") || !strcmp(cls, "Functional") || !strcmp(cls, "Model");
}

// The Keras layer classes build_graph knows (layers.def, the list layers.c
// makes its table from) and how many inputs a call of each takes: the
// loader accepts exactly these, and reads the list rather than the builders.
static const struct {
  const char *cls;
  int nin;
} layer_classes[] = {
#define LAYER(cls, nin, build) {cls, nin},
#include "layers.def"
#undef LAYER
};

static int layer_class(const char *cls) {
  for (int i = 0; i < (int)(sizeof layer_classes / sizeof *layer_classes); i++)
    if (!strcmp(layer_classes[i].cls, cls)) return i;
  return -1;
}

static bool layer_known(const char *cls) { return layer_class(cls) >= 0; }
// Merges, and attention (query, value, key).
static bool layer_takes_several(const char *cls) {
  int i = layer_class(cls);
  return i >= 0 && layer_classes[i].nin < 0;
}

// A nested model's layers, loaded into m under l's name; l becomes its call.
static void load_nested(Model *m, Nest *b, Layer *l) {
  json_t *nodes = json_object_get(l->json, "inbound_nodes");
  if (json_is_array(nodes) && json_array_size(nodes) > 1)
    error_at(jloc_idx(nodes, 1), "layer '%s': a nested model called more than once (shared "
             "weights) is not supported; call it once", l->name);
  Nest *in = xcalloc(1, sizeof *in);
  in->name = l->name;
  in->sequential = !strcmp(l->cls, "Sequential");
  in->qual = format("%s/", l->name);
  const char *slash = strrchr(l->name, '/'); // its own name, after its models' (no '/' in it)
  in->vpre = in->sequential ? format("%s/", slash ? slash + 1 : l->name) : "";
  // Keras's weights file names it by class, counted among its siblings
  const char *snake = in->sequential ? "sequential" : "functional";
  int k = in->sequential ? b->nseq++ : b->nfun++;
  const char *group = k ? format("%s_%d", snake, k) : snake;
  in->scope = b->scope ? format("%s/layers/%s", b->scope, group) : group;
  l->nest = in;
  load_box(m, in, l->cfg);
}

// A layer envelope {"class_name", "config", ["name"], ...}.
static Layer *new_layer(Model *m, Nest *b, json_t *env) {
  if (!json_is_object(env))
    error_at(jloc(env), "a layer must be an object with 'class_name' and 'config'");
  Layer *l = xcalloc(1, sizeof *l);
  l->json = env;
  l->loc = jloc(env);
  l->cls = json_get_str(env, "class_name");
  if (!l->cls)
    error_at(jloc_key(env, "class_name"), "layer has no 'class_name'");
  l->cfg = json_object_get(env, "config");
  if (!json_is_object(l->cfg))
    error_at(jloc_key(env, "config"), "%s layer has no 'config' object", l->cls);
  l->name = json_get_str(env, "name");
  if (!l->name)
    l->name = json_get_str(l->cfg, "name");
  if (!l->name)
    error_at(jloc_key(l->cfg, "name"), "%s layer has no 'name'", l->cls);
  l->group = json_get_str(env, "kdcc_group"); // hub.c's, with keras-hub's names
  const char *flaw = b->hub ? NULL : name_flaw(l->name);
  if (flaw)
    error_at(json_get_str(env, "name") ? jloc_key(env, "name") : jloc_key(l->cfg, "name"),
             "layer name '%s' %s; " NAME_RULE, l->name, flaw);
  l->path = format("%s%s", b->vpre, l->name);
  l->name = format("%s%s", b->qual, l->name);
  l->scope = b->scope;
  if (is_model_class(l->cls)) {
    load_nested(m, b, l);
    return l;
  }
  if (!layer_known(l->cls))
    error_at(jloc_key(env, "class_name"), "unknown layer class '%s' (layer '%s')", l->cls,
             l->name);
  check_dtype(l);
  return l;
}

// Per-sample shape from `shape` (batch dimension first when has_batch).
static void set_input_shape(Layer *l, json_t *shape, const char *what, bool has_batch) {
  Loc at = jloc(shape);
  if (!json_is_array(shape))
    error_at(at, "layer '%s': '%s' must be a list", l->name, what);
  int n = (int)json_array_size(shape), first = has_batch ? 1 : 0;
  if (n - first < 0)
    error_at(at, "layer '%s': '%s' is empty", l->name, what);
  if (n - first + 1 > MAX_RANK)
    error_at(at, "layer '%s': input rank %d is too large (at most %d with the batch dimension)",
             l->name, n - first + 1, MAX_RANK);
  if (has_batch) {
    json_t *b = json_array_get(shape, 0);
    if (!json_is_null(b) && !json_is_integer(b))
      error_at(jloc_idx(shape, 0), "layer '%s': the batch dimension of '%s' must be null or an "
               "integer", l->name, what);
  }
  l->in_rank = n - first;
  int64_t elems = 1;
  for (int i = first; i < n; i++) {
    json_t *d = json_array_get(shape, (size_t)i);
    if (!json_is_integer(d) || json_integer_value(d) <= 0)
      error_at(jloc_idx(shape, (size_t)i), "layer '%s': dimension %d of '%s' must be a positive "
               "integer (dynamic shapes are not supported)", l->name, i, what);
    if (json_integer_value(d) > MAX_DIM)
      error_at(jloc_idx(shape, (size_t)i), "layer '%s': dimension %d of '%s' is %lld; a "
               "dimension may be at most %d", l->name, i, what,
               (long long)json_integer_value(d), MAX_DIM);
    l->in_shape[i - first] = json_integer_value(d);
    elems = size_mul(elems, l->in_shape[i - first]);
  }
  if (elems > MAX_ELEMS)
    error_at(at, "layer '%s': '%s' makes samples of %lld elements; a tensor may hold at most "
             "2^40 (%lld)", l->name, what, (long long)elems, (long long)MAX_ELEMS);
}

static void input_layer_shape(Layer *l) {
  json_t *s;
  if ((s = cfg_get(l, "batch_shape")))
    set_input_shape(l, s, "batch_shape", true);
  else if ((s = cfg_get(l, "batch_input_shape")))
    set_input_shape(l, s, "batch_input_shape", true);
  else if ((s = cfg_get(l, "shape")))
    set_input_shape(l, s, "shape", false);
  else
    error_at(l->loc, "input layer '%s' has no 'batch_shape'", l->name);
}

// ---- Sequential

static void load_sequential(Model *m, Nest *b, json_t *cfg, json_t *layers) {
  int n = (int)json_array_size(layers), nown = 0;
  Layer **own = xcalloc((size_t)n + 1, sizeof *own); // its layers, in order
  Layer *first = new_layer(m, b, json_array_get(layers, 0));
  if (is_input(first)) {
    input_layer_shape(first);
    add_layer(m, own[nown++] = first);
  } else {
    // No InputLayer: take the shape from the model or the first layer and
    // synthesise one, as Keras does when it builds the model.
    json_t *shape = json_object_get(cfg, "build_input_shape"), *bc;
    const char *what = "build_input_shape";
    if (json_is_null(shape))
      shape = NULL;
    if (!shape && (shape = cfg_get(first, "batch_input_shape")))
      what = "batch_input_shape";
    if (!shape && (shape = cfg_get(first, "batch_shape")))
      what = "batch_shape";
    if (!shape && json_is_object(bc = json_object_get(first->json, "build_config")) &&
        (shape = json_object_get(bc, "input_shape")) && !json_is_null(shape))
      what = "input_shape";
    if (!shape || json_is_null(shape))
      error_at(jloc(cfg), "cannot tell the input shape of model '%s': add an InputLayer or "
               "build the model before saving it", b->name);
    const char *name = "input_layer";
    for (int k = 1; !strcmp(format("%s%s", b->qual, name), first->name) ||
                    qual_layer(m, b, name); k++)
      name = format("input_layer_%d", k);
    Layer *in = xcalloc(1, sizeof *in);
    in->cls = "InputLayer";
    in->name = format("%s%s", b->qual, name);
    in->path = format("%s%s", b->vpre, name);
    in->scope = b->scope;
    in->json = json_pack("{s:s, s:{s:O, s:s, s:s}}", "class_name", "InputLayer", "config",
                         "batch_shape", shape, "dtype", "float32", "name", name);
    in->cfg = json_object_get(in->json, "config");
    in->loc = jloc(shape);
    set_input_shape(in, shape, what, true);
    add_layer(m, own[nown++] = in);
    add_layer(m, own[nown++] = first);
  }
  for (int i = 1; i < n; i++)
    add_layer(m, own[nown++] = new_layer(m, b, json_array_get(layers, (size_t)i)));
  for (int i = 1; i < nown; i++) {
    Layer *l = own[i];
    if (is_input(l))
      error_at(l->loc, "input layer '%s' must come first in a Sequential model", l->name);
    if (l->nest && l->nest->noutputs != 1) // as Keras's Sequential requires of every layer
      error_at(l->loc, "layer '%s': a nested model in a Sequential model must have one output, "
               "not %d", l->name, l->nest->noutputs);
    l->in[0] = (TensorRef){own[i - 1], 0, 0, l->loc};
    l->nin = 1;
  }
  b->inputs = xcalloc(1, sizeof(Layer *));
  b->inputs[0] = own[0];
  b->ninputs = 1;
  b->outputs = xcalloc(1, sizeof(TensorRef));
  b->outputs[0] = (TensorRef){own[nown - 1], 0, 0, own[nown - 1]->loc};
  b->noutputs = 1;
  xfree(own);
}

// ---- Functional

static bool is_keras_tensor(json_t *v) {
  const char *c = json_get_str(v, "class_name");
  return c && !strcmp(c, "__keras_tensor__");
}

static bool contains_tensor(json_t *v) {
  if (is_keras_tensor(v))
    return true;
  if (json_is_array(v)) {
    for (size_t i = 0; i < json_array_size(v); i++)
      if (contains_tensor(json_array_get(v, i)))
        return true;
  } else if (json_is_object(v)) {
    const char *k;
    json_t *e;
    json_object_foreach(v, k, e)
      if (contains_tensor(e))
        return true;
  }
  return false;
}

// A reference [layer, node, tensor(, kwargs)] from `user`'s inputs (or, with
// user NULL, from the model's input/output lists, named by `what`).
static TensorRef resolve(Model *m, Nest *b, Layer *user, const char *what, json_t *h) {
  // Messages name the referring layer, or the model's list.
  const char *who = user ? format("layer '%s'", user->name) : format("'%s'", what);
  if (!json_is_array(h) || json_array_size(h) < 3 || !json_is_string(json_array_get(h, 0)) ||
      !json_is_integer(json_array_get(h, 1)) || !json_is_integer(json_array_get(h, 2)))
    error_at(jloc(h), "%s: malformed tensor reference (expected [layer, node, tensor])", who);
  const char *name = json_string_value(json_array_get(h, 0));
  Layer *src = qual_layer(m, b, name);
  if (!src && user)
    error_at(jloc_idx(h, 0), "layer '%s' takes input from unknown layer '%s'", user->name, name);
  if (!src)
    error_at(jloc_idx(h, 0), "'%s' names unknown layer '%s'", what, name);
  json_int_t node = json_integer_value(json_array_get(h, 1));
  json_int_t tensor = json_integer_value(json_array_get(h, 2));
  int ncalls = src->ncalls ? src->ncalls : 1;
  if (node < 0 || node >= ncalls)
    error_at(jloc_idx(h, 1), "%s uses call %lld of layer '%s', which is called %d time%s", who,
             (long long)node, name, ncalls, ncalls == 1 ? "" : "s");
  if (node > 0)
    src = src->calls[node];
  int nout = src->nest ? src->nest->noutputs : 1;
  if (tensor < 0 || tensor >= nout)
    error_at(jloc_idx(h, 2), "%s uses output %lld of layer '%s', which has %d output%s", who,
             (long long)tensor, name, nout, nout == 1 ? "" : "s");
  return (TensorRef){src, (int)node, (int)tensor, jloc(h)};
}

static void add_input(Model *m, Nest *b, Layer *l, json_t *h) {
  if (l->nin == MAX_IN)
    error_at(jloc(h), "layer '%s' has more than %d inputs", l->name, MAX_IN);
  l->in[l->nin++] = resolve(m, b, l, NULL, h);
}

// Keras 3 args: tensors, possibly in (nested) lists, among other values.
static void collect_args(Model *m, Nest *b, Layer *l, json_t *v) {
  if (is_keras_tensor(v)) {
    json_t *h = json_object_get(json_object_get(v, "config"), "keras_history");
    if (!h)
      error_at(jloc(v), "layer '%s': input tensor has no 'keras_history'", l->name);
    add_input(m, b, l, h);
  } else if (json_is_array(v)) {
    for (size_t i = 0; i < json_array_size(v); i++)
      collect_args(m, b, l, json_array_get(v, i));
  }
}

static json_t *inbound_nodes(Layer *l) {
  json_t *nodes = json_object_get(l->json, "inbound_nodes");
  if (!nodes || json_is_null(nodes))
    nodes = json_object_get(l->cfg, "inbound_nodes");
  return nodes;
}

// A layer with several calls: a clone per further call, after the layers.
static void add_calls(Model *m, Layer *l) {
  json_t *nodes = inbound_nodes(l);
  if (!json_is_array(nodes) || json_array_size(nodes) < 2 || is_input(l))
    return;
  l->ncalls = (int)json_array_size(nodes);
  l->calls = xcalloc(l->ncalls, sizeof *l->calls);
  l->calls[0] = l;
  for (int k = 1; k < l->ncalls; k++) {
    Layer *c = xcalloc(1, sizeof *c);
    *c = *l;
    c->shared = l;
    c->call = k;
    c->calls = NULL;
    c->ncalls = 0;
    c->loc = jloc_idx(nodes, k);
    c->index = m->nlayers;
    m->layers[m->nlayers++] = c;
    l->calls[k] = c;
  }
}

static void load_inbound(Model *m, Nest *b, Layer *l) {
  json_t *nodes = inbound_nodes(l);
  if (!nodes || json_is_null(nodes) || (json_is_array(nodes) && json_array_size(nodes) == 0))
    return;
  if (!json_is_array(nodes))
    error_at(jloc(nodes), "layer '%s': 'inbound_nodes' must be a list", l->name);
  if (is_input(l))
    error_at(jloc(nodes), "input layer '%s' cannot take inputs", l->name);
  json_t *node = json_array_get(nodes, (size_t)l->call);
  if (json_is_object(node)) { // Keras 3
    json_t *args = json_object_get(node, "args"), *kwargs = json_object_get(node, "kwargs");
    collect_args(m, b, l, args);
    l->kwargs = json_is_object(kwargs) ? kwargs : NULL;
    if (json_is_object(kwargs)) {
      const char *k;
      json_t *e;
      json_object_foreach(kwargs, k, e) {
        // issue 10: an attention layer's attention_mask, an input after the arguments
        if (!strcmp(k, "attention_mask") && is_keras_tensor(e) && strstr(l->cls, "Attention") &&
            l->nin > 0) {
          collect_args(m, b, l, e);
          l->mask = l->nin - 1;
        } else if (contains_tensor(e))
          error_at(jloc_key(kwargs, k), "layer '%s': tensor keyword argument '%s' is not "
                   "supported", l->name, k);
      }
    }
  } else if (json_is_array(node)) { // Keras 2: [["x", 0, 0, {}], ...]
    for (size_t i = 0; i < json_array_size(node); i++)
      add_input(m, b, l, json_array_get(node, i));
  } else {
    error_at(jloc(node), "layer '%s': malformed inbound node", l->name);
  }
  if (l->nin == 0)
    error_at(jloc(node), "layer '%s' is called with no input tensor", l->name);
}

// [name, node, tensor] triples, or a single flat triple.
static json_t *triples(json_t *cfg, const char *key) {
  json_t *v = json_object_get(cfg, key);
  if (!v || json_is_null(v))
    return NULL;
  if (!json_is_array(v))
    error_at(jloc(v), "'%s' must be a list of [layer, node, tensor] entries", key);
  if (json_array_size(v) > 0 && json_is_string(json_array_get(v, 0))) {
    json_t *wrap = json_array();
    json_array_append(wrap, v);
    return wrap; // its element keeps its recorded location
  }
  return v;
}

// Depth-first search along inbound edges from root, without recursion (a
// chain of many layers is deep): stack[d] is the layer at depth d and
// edge[d] the input of it being explored. A grey layer reached again closes
// a cycle, which the message spells out from that layer around.
enum { WHITE, GREY, BLACK };

static void dfs_cycle(Layer *root, char *color, Layer **stack, int *edge) {
  int depth = 0;
  stack[0] = root;
  edge[0] = -1;
  color[root->index] = GREY;
  while (depth >= 0) {
    Layer *l = stack[depth];
    int i = ++edge[depth];
    if (i >= l->nin) {
      color[l->index] = BLACK;
      depth--;
      continue;
    }
    Layer *s = l->in[i].layer;
    if (color[s->index] == GREY) {
      int k = depth;
      while (stack[k] != s)
        k--;
      char *msg = format("'%s'", s->name);
      for (int j = k + 1; j <= depth; j++)
        msg = format("%s takes input from '%s', which", msg, stack[j]->name);
      msg = format("%s takes input from '%s'", msg, s->name);
      error_at(s->in[edge[k]].loc, "cycle in the model: layer %s", msg);
    }
    if (color[s->index] == WHITE) {
      color[s->index] = GREY;
      stack[++depth] = s;
      edge[depth] = -1;
    }
  }
}

// Marks l and everything it takes input from; work holds room for every layer.
static void mark_needed(Layer *l, bool *needed, Layer **work) {
  if (needed[l->index])
    return;
  int top = 0;
  needed[l->index] = true;
  work[top++] = l;
  while (top > 0) {
    Layer *x = work[--top];
    for (int i = 0; i < x->nin; i++)
      if (!needed[x->in[i].layer->index]) {
        needed[x->in[i].layer->index] = true;
        work[top++] = x->in[i].layer;
      }
  }
}

// A min-heap of layer indices: the ready layer earliest in file order.
static void heap_push(int *h, int *n, int v) {
  int i = (*n)++;
  for (; i > 0 && h[(i - 1) / 2] > v; i = (i - 1) / 2)
    h[i] = h[(i - 1) / 2];
  h[i] = v;
}

static int heap_pop(int *h, int *n) {
  int top = h[0], v = h[--*n], i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= *n)
      break;
    if (c + 1 < *n && h[c + 1] < h[c])
      c++;
    if (h[c] >= v)
      break;
    h[i] = h[c];
    i = c;
  }
  h[i] = v;
  return top;
}

static void load_functional(Model *m, Nest *b, json_t *cfg, json_t *layers) {
  int n = (int)json_array_size(layers), first = m->nlayers;
  Layer **own = xcalloc((size_t)n, sizeof *own); // its layers (a nested model's come before it)
  for (int i = 0; i < n; i++) {
    Layer *l = own[i] = new_layer(m, b, json_array_get(layers, (size_t)i));
    if (is_input(l))
      input_layer_shape(l);
    add_layer(m, l);
  }
  for (int i = 0; i < n; i++)
    add_calls(m, own[i]);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < (own[i]->ncalls ? own[i]->ncalls : 1); k++)
      load_inbound(m, b, own[i]->ncalls ? own[i]->calls[k] : own[i]);
  for (int i = first; i < m->nlayers; i++) {
    Layer *l = m->layers[i];
    if (l->scope != b->scope)
      continue;
    for (int j = 0; j < l->nin; j++) {
      Layer *s = l->in[j].layer;
      if (!is_input(s) && s->nin == 0)
        error_at(l->in[j].loc, "layer '%s' takes input from layer '%s', which is never called",
                 l->name, s->name);
    }
    if (!is_input(l) && !l->nest && !layer_takes_several(l->cls) && l->nin > 1)
      error_at(l->loc, "layer '%s' (%s) takes one input but is called with %d", l->name, l->cls,
               l->nin);
  }

  // Inputs: the listed ones, else every InputLayer.
  b->inputs = xcalloc((size_t)n, sizeof(Layer *));
  json_t *ins = triples(cfg, "input_layers");
  if (ins) {
    for (size_t i = 0; i < json_array_size(ins); i++) {
      TensorRef r = resolve(m, b, NULL, "input_layers", json_array_get(ins, i));
      if (!is_input(r.layer))
        error_at(r.loc, "'input_layers' names layer '%s', which is not an InputLayer",
                 r.layer->name);
      for (int k = 0; k < b->ninputs; k++)
        if (b->inputs[k] == r.layer)
          error_at(r.loc, "'input_layers' lists layer '%s' twice", r.layer->name);
      b->inputs[b->ninputs++] = r.layer;
    }
  } else {
    for (int i = 0; i < n; i++)
      if (is_input(own[i]))
        b->inputs[b->ninputs++] = own[i];
  }
  if (b->ninputs == 0)
    error_at(jloc(cfg), "model '%s' has no input layer", b->name);

  json_t *outs = triples(cfg, "output_layers");
  if (!outs || json_array_size(outs) == 0)
    error_at(jloc_key(cfg, "output_layers"), "model '%s' has no 'output_layers'", b->name);
  b->outputs = xcalloc(json_array_size(outs), sizeof(TensorRef));
  for (size_t i = 0; i < json_array_size(outs); i++) {
    TensorRef r = resolve(m, b, NULL, "output_layers", json_array_get(outs, i));
    if (!is_input(r.layer) && r.layer->nin == 0)
      error_at(r.loc, "output layer '%s' is never called", r.layer->name);
    b->outputs[b->noutputs++] = r;
  }
  xfree(own);
}

// What a reference stands for once nested models are inlined: a nested
// model's call is its output, a nested model's InputLayer the tensor its
// call passes (either may lead to another; a cycle of them is the outer
// model's, which nothing else reports).
static TensorRef follow(Model *m, TensorRef r) {
  for (int hops = 0;; hops++) {
    Loc at = r.loc;
    if (hops > m->nlayers)
      error_at(at, "cycle in the model through nested model '%s'", r.layer->name);
    if (r.layer->nest)
      r = r.layer->nest->outputs[r.tensor_index];
    else if (r.layer->bound)
      r = *r.layer->bound;
    else
      return r;
    r.loc = at;
  }
}

// Inlines the nested models: binds their inputs, points every reference at
// what it stands for, and drops their Layers and InputLayers.
static void inline_nested(Model *m) {
  bool any = false;
  for (int i = 0; i < m->nlayers; i++) {
    Layer *l = m->layers[i];
    if (!l->nest)
      continue;
    any = true;
    if (l->nin != l->nest->ninputs)
      error_at(l->loc, "layer '%s': the nested model takes %d input%s but is called with %d",
               l->name, l->nest->ninputs, l->nest->ninputs == 1 ? "" : "s", l->nin);
    for (int k = 0; k < l->nin; k++)
      l->nest->inputs[k]->bound = &l->in[k];
  }
  if (!any)
    return;
  m->bound = xcalloc((size_t)m->nlayers, sizeof *m->bound);
  for (int i = 0; i < m->nlayers; i++) {
    if (m->layers[i]->bound)
      m->bound[m->nbound++] = m->layers[i];
    for (int j = 0; j < m->layers[i]->nin; j++)
      m->layers[i]->in[j] = follow(m, m->layers[i]->in[j]);
  }
  for (int i = 0; i < m->noutputs; i++)
    m->outputs[i] = follow(m, m->outputs[i]);
  int n = 0;
  for (int i = 0; i < m->nlayers; i++)
    if (!m->layers[i]->nest && !m->layers[i]->bound) {
      m->layers[i]->index = n;
      m->layers[n++] = m->layers[i];
    }
  m->nlayers = n;
}

// Keeps the inputs and what the outputs need, in topological order.
static void order_layers(Model *m) {
  int n = m->nlayers;
  char *color = xcalloc((size_t)n, 1);
  Layer **stack = xcalloc((size_t)n, sizeof(Layer *));
  int *edge = xcalloc((size_t)n, sizeof(int));
  for (int i = 0; i < n; i++)
    if (color[i] == WHITE)
      dfs_cycle(m->layers[i], color, stack, edge);

  // Keep the inputs and what the outputs need; order topologically,
  // preferring file order (Kahn's algorithm, the earliest ready layer first).
  bool *needed = xcalloc((size_t)n, sizeof(bool));
  for (int i = 0; i < m->noutputs; i++)
    mark_needed(m->outputs[i].layer, needed, stack);
  for (int i = 0; i < m->ninputs; i++)
    needed[m->inputs[i]->index] = true;
  for (int i = 0; i < n; i++)
    if (!needed[i])
      warn_at(m->layers[i]->loc, "%s does not contribute to the model's outputs; ignored",
              m->layers[i]->shared ? format("call %d of layer '%s'", m->layers[i]->call,
                                            m->layers[i]->name)
                                   : format("layer '%s'", m->layers[i]->name));
  // users[first[i] .. first[i + 1]): the layers taking input from layer i, once per edge
  int *first = xcalloc((size_t)n + 1, sizeof(int)), *users = NULL, *pending = NULL;
  for (int i = 0; i < n; i++)
    if (needed[i])
      for (int j = 0; j < m->layers[i]->nin; j++)
        first[m->layers[i]->in[j].layer->index + 1]++;
  for (int i = 0; i < n; i++)
    first[i + 1] += first[i];
  users = xcalloc((size_t)first[n] + 1, sizeof(int));
  pending = xcalloc((size_t)n, sizeof(int));
  int *fill = xcalloc((size_t)n, sizeof(int)), *heap = edge, nheap = 0;
  for (int i = 0; i < n; i++)
    if (needed[i]) {
      Layer *l = m->layers[i];
      for (int j = 0; j < l->nin; j++) {
        int src = l->in[j].layer->index;
        users[first[src] + fill[src]++] = i;
      }
      pending[i] = l->nin;
      if (!pending[i])
        heap_push(heap, &nheap, i);
    }
  Layer **order = xcalloc((size_t)n, sizeof(Layer *));
  int nordered = 0;
  while (nheap > 0) {
    int i = heap_pop(heap, &nheap);
    order[nordered++] = m->layers[i];
    for (int k = first[i]; k < first[i + 1]; k++)
      if (--pending[users[k]] == 0)
        heap_push(heap, &nheap, users[k]);
  }
  for (int i = 0; i < nordered; i++)
    order[i]->index = i;
  m->layers = order;
  m->nlayers = nordered;
  memset(m->names, 0, m->names_cap * sizeof *m->names); // only the layers kept
  index_names(m);
  xfree(color);
  xfree(stack);
  xfree(edge);
  xfree(needed);
  xfree(first);
  xfree(users);
  xfree(pending);
  xfree(fill);
}

// ---- the model

// Layers to make room for: every call of every layer, a nested model's
// layers and a Sequential's InputLayer it may synthesise.
static size_t count_layers(json_t *layers) {
  size_t n = 0;
  for (size_t i = 0; i < json_array_size(layers); i++) {
    json_t *env = json_array_get(layers, i), *nodes = json_object_get(env, "inbound_nodes");
    json_t *cfg = json_object_get(env, "config");
    if (!json_is_array(nodes)) nodes = json_object_get(cfg, "inbound_nodes");
    n += json_is_array(nodes) && json_array_size(nodes) > 1 ? json_array_size(nodes) : 1;
    if (json_get_str(env, "class_name") && is_model_class(json_get_str(env, "class_name")) &&
        json_is_array(json_object_get(cfg, "layers")))
      n += 1 + count_layers(json_object_get(cfg, "layers"));
  }
  return n;
}

// One model's layers into m (the top one, or a nested one recursively).
static void load_box(Model *m, Nest *b, json_t *cfg) {
  if (!json_is_object(cfg))
    error_at(jloc(cfg), "model '%s' has no 'config' object", b->name);
  json_t *layers = json_object_get(cfg, "layers");
  if (!json_is_array(layers))
    error_at(jloc_key(cfg, "layers"), "model '%s' has no 'layers' list", b->name);
  if (json_array_size(layers) == 0)
    error_at(jloc(layers), "model '%s' has no layers", b->name);
  int first = m->nlayers;
  if (b->sequential)
    load_sequential(m, b, cfg, layers);
  else
    load_functional(m, b, cfg, layers);
  // A Functional model's `trainable: false` freezes every layer in it, as
  // its from_config sets model.trainable; Sequential.from_config ignores
  // its own (the layers' flags, which model.trainable = False also set, say)
  json_t *tr = json_object_get(cfg, "trainable");
  if (tr && !json_is_null(tr) && !json_is_boolean(tr))
    error_at(jloc(tr), "model '%s': 'trainable' must be true or false", b->name);
  for (int i = first; i < m->nlayers && !b->sequential && json_is_false(tr); i++)
    m->layers[i]->frozen = true;
}

// The document as a Keras model: a keras-hub model becomes the Functional
// model keras-hub builds (hub.c), its layers in the backbone's weights group.
static Model *load_document(const char *file, json_t *root, bool preset) {
  if (!json_is_object(root) || !json_get_str(root, "class_name"))
    error_at(jloc(root), "expected a Keras model: an object with 'class_name' and 'config'");
  const char *scope = NULL;
  bool hub = hub_model(root);
  if (hub) root = hub_expand(root, preset, &scope);
  else if (opt_lora_rank || opt_sequence_length)
    error_at(jloc(root), "%s applies to keras-hub models (a task's .keras or a preset "
             "directory); this is a Keras %s", opt_lora_rank ? "--lora-rank" : "--sequence-length",
             json_get_str(root, "class_name"));
  Model *m = xcalloc(1, sizeof *m);
  m->file = file;
  m->root = root;
  const char *cls = json_get_str(root, "class_name");
  if (!strcmp(cls, "Sequential"))
    m->sequential = true;
  else if (strcmp(cls, "Functional") && strcmp(cls, "Model"))
    error_at(jloc_key(root, "class_name"), "unknown model class '%s' (expected Sequential or "
             "Functional)", cls);
  json_t *cfg = json_object_get(root, "config");
  if (!json_is_object(cfg))
    error_at(jloc_key(root, "config"), "model has no 'config' object");
  json_t *name = json_object_get(cfg, "name");
  if (name && !json_is_string(name))
    error_at(jloc(name), "model 'name' must be a string");
  m->name = name ? json_string_value(name) : m->sequential ? "sequential" : "functional";
  if (name_flaw(m->name))
    error_at(jloc(name), "model name '%s' %s; " NAME_RULE, m->name, name_flaw(m->name));
  json_t *layers = json_object_get(cfg, "layers");
  size_t cap = count_layers(layers) + 1;
  if (cap - 1 > MAX_LAYERS)
    error_at(jloc(layers), "model '%s' has %zu layers (each call of a shared layer counted); "
             "kdcc compiles at most %d", m->name, cap - 1, MAX_LAYERS);
  m->layers = xcalloc(cap, sizeof(Layer *));
  for (m->names_cap = 16; m->names_cap < 2 * cap; m->names_cap *= 2) {}
  m->names = xcalloc(m->names_cap, sizeof *m->names);
  Nest top = {.name = m->name, .sequential = m->sequential, .qual = "",
              .vpre = m->sequential ? format("%s/", m->name) : "", .scope = scope, .hub = hub};
  load_box(m, &top, cfg);
  m->inputs = top.inputs;
  m->ninputs = top.ninputs;
  m->outputs = top.outputs;
  m->noutputs = top.noutputs;
  inline_nested(m);
  order_layers(m);
  load_compile(m, json_object_get(root, "compile_config"));
  json_t *dist = json_object_get(root, "distribution");
  if (dist && !json_is_null(dist)) {
    if (!json_is_object(dist))
      error_at(jloc(dist), "'distribution' must be an object");
    m->dist_json = dist;
  }
  return m;
}

Model *load_model_json(const char *file, json_t *root) {
  return load_document(file, root, false);
}

Model *load_model(const char *path) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) { // a keras-hub preset
    const char *weights;
    Model *m = load_document(path, hub_load_preset(path, &weights), true);
    m->weights_file = weights;
    return m;
  }
  Model *m = load_model_json(path, json_load_file_located(path));
  size_t n = strlen(path);
  if (n > 6 && !strcmp(path + n - 6, ".keras")) m->weights_file = path;
  return m;
}
