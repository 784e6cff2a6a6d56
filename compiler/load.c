// load.c: Keras model JSON -> Model (layers, edges, compile config).
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
// float32. Every user error names the layer, at the JSON value at fault.
//
// compile_config: absent means loss "mse" and optimizer "adam", silently.
// Optimizer fields left unset take Keras 3's defaults.
#include "kdcc.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>


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

static const char *get_str(json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

// Only float32 is computed; an InputLayer may also hold integer ids (int32
// in the program, whatever integer width Keras wrote), or a bool
// attention_mask (int32 0 or 1). dtype is a string or a (DType)Policy envelope.
static void check_dtype(Layer *l) {
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
  if (!strcmp(l->cls, "InputLayer"))
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
      if (!strcmp(t, ints[i])) {
        l->in_int = true;
        return;
      }
  if (strcmp(t, "float32") != 0)
    error_at(jloc(name), "layer '%s': dtype '%s' is not supported (only float32%s)", l->name, t,
             strcmp(l->cls, "InputLayer") ? "" : ", or integer ids on an InputLayer");
}

// A model being loaded: the top one, or a nested one (a Layer's nest).
typedef struct Nest Nest;
struct Nest {
  const char *name;
  bool sequential;
  const char *qual;       // prefix of its layers' names: "" or "<outer qual><name>/"
  const char *vpre;       // prefix of their variable paths
  const char *scope;      // its weights-file group (NULL: the top model)
  int nseq, nfun;         // nested Sequentials and Functionals loaded in it so far
  Layer **inputs;         // its InputLayers, in input order
  int ninputs;
  TensorRef *outputs;
  int noutputs;
};

// Layer `name` of model b (a name with '/' is no layer's: it would reach
// into a nested model).
static Layer *qual_layer(Model *m, const Nest *b, const char *name) {
  if (strchr(name, '/'))
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
  l->cls = get_str(env, "class_name");
  if (!l->cls)
    error_at(jloc_key(env, "class_name"), "layer has no 'class_name'");
  l->cfg = json_object_get(env, "config");
  if (!json_is_object(l->cfg))
    error_at(jloc_key(env, "config"), "%s layer has no 'config' object", l->cls);
  l->name = get_str(env, "name");
  if (!l->name)
    l->name = get_str(l->cfg, "name");
  if (!l->name)
    error_at(jloc_key(l->cfg, "name"), "%s layer has no 'name'", l->cls);
  const char *flaw = name_flaw(l->name);
  if (flaw)
    error_at(get_str(env, "name") ? jloc_key(env, "name") : jloc_key(l->cfg, "name"),
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
  const char *c = get_str(v, "class_name");
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

// ---- compile_config

typedef struct {
  const char *name;
  LossKind kind;
} LossName;

// The names keras.losses.get resolves (keras/src/losses/__init__.py's
// ALL_OBJECTS_DICT): each function's name, its class's, and the aliases.
static const LossName loss_names[] = {
  {"mse", LOSS_MSE}, {"MSE", LOSS_MSE}, {"mean_squared_error", LOSS_MSE},
  {"MeanSquaredError", LOSS_MSE},
  {"mae", LOSS_MAE}, {"MAE", LOSS_MAE}, {"mean_absolute_error", LOSS_MAE},
  {"MeanAbsoluteError", LOSS_MAE},
  {"categorical_crossentropy", LOSS_CCE}, {"CategoricalCrossentropy", LOSS_CCE},
  {"sparse_categorical_crossentropy", LOSS_SCCE}, {"SparseCategoricalCrossentropy", LOSS_SCCE},
  {"binary_crossentropy", LOSS_BCE}, {"BinaryCrossentropy", LOSS_BCE}, {"bce", LOSS_BCE},
  {"BCE", LOSS_BCE},
  // issue 11
  {"huber", LOSS_HUBER}, {"Huber", LOSS_HUBER},
  {"log_cosh", KDRT_LOSS_LOG_COSH}, {"LogCosh", KDRT_LOSS_LOG_COSH},
  {"kl_divergence", LOSS_KLD}, {"KLDivergence", LOSS_KLD}, {"kld", LOSS_KLD},
  {"KLD", LOSS_KLD},
  {"poisson", KDRT_LOSS_POISSON}, {"Poisson", KDRT_LOSS_POISSON},
  {"cosine_similarity", LOSS_COSINE}, {"CosineSimilarity", LOSS_COSINE},
  {"hinge", LOSS_HINGE}, {"Hinge", LOSS_HINGE},
  {"squared_hinge", LOSS_SQUARED_HINGE}, {"SquaredHinge", LOSS_SQUARED_HINGE},
  {"categorical_hinge", LOSS_CAT_HINGE}, {"CategoricalHinge", LOSS_CAT_HINGE},
  {"mean_absolute_percentage_error", KDRT_LOSS_MAPE}, {"MeanAbsolutePercentageError",
  KDRT_LOSS_MAPE}, {"mape", KDRT_LOSS_MAPE}, {"MAPE", KDRT_LOSS_MAPE},
  {"mean_squared_logarithmic_error", KDRT_LOSS_MSLE}, {"MeanSquaredLogarithmicError",
  KDRT_LOSS_MSLE}, {"msle", KDRT_LOSS_MSLE}, {"MSLE", KDRT_LOSS_MSLE},
};

static LossKind loss_by_name(json_t *at, const char *name) {
  for (size_t i = 0; i < sizeof loss_names / sizeof *loss_names; i++)
    if (!strcmp(name, loss_names[i].name))
      return loss_names[i].kind;
  error_at(jloc(at), "unknown loss '%s' (supported: mse, mae, categorical_crossentropy, "
           "sparse_categorical_crossentropy, binary_crossentropy, huber, log_cosh, "
           "kl_divergence, poisson, cosine_similarity, hinge, squared_hinge, categorical_hinge, "
           "mean_absolute_percentage_error, mean_squared_logarithmic_error)", name);
}

// A number option of loss `cls`'s config, or def where absent; lo and hi
// bound it (inclusive), as `range` says.
static double loss_num(json_t *cfg, const char *cls, const char *key, double def, double lo,
                       double hi, const char *range) {
  json_t *v = json_object_get(cfg, key);
  if (!v || json_is_null(v))
    return def;
  if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
    error_at(jloc(v), "loss '%s': '%s' must be a number %s", cls, key, range);
  return json_number_value(v);
}

// One output's loss: a name, or a loss object (class and config).
static void load_loss1(OutLoss *o, json_t *v) {
  o->has = true;
  o->loc = jloc(v);
  if (json_is_string(v)) {
    o->kind = loss_by_name(v, json_string_value(v));
    o->param = o->kind == LOSS_HUBER ? 1.0f : 0.0f; // Keras's default delta
    return;
  }
  const char *cls = get_str(v, "class_name");
  if (!json_is_object(v) || !cls)
    error_at(jloc(v), "a loss must be a loss name or a loss object");
  json_t *cfg = json_object_get(v, "config");
  if (!strcmp(cls, "function")) { // a serialised loss function: config is its name
    if (!json_is_string(cfg))
      error_at(jloc_key(v, "config"), "loss function without a name");
    o->kind = loss_by_name(cfg, json_string_value(cfg));
    o->param = o->kind == LOSS_HUBER ? 1.0f : 0.0f;
    return;
  }
  o->kind = loss_by_name(json_object_get(v, "class_name"), cls);
  o->param = o->kind == LOSS_HUBER ? 1.0f : 0.0f;
  if (!json_is_object(cfg))
    return;
  json_t *fl = json_object_get(cfg, "from_logits");
  if (fl && !json_is_null(fl)) {
    if (!json_is_boolean(fl))
      error_at(jloc(fl), "loss '%s': 'from_logits' must be true or false", cls);
    o->from_logits = json_is_true(fl);
    if (o->from_logits && o->kind != LOSS_CCE && o->kind != LOSS_SCCE && o->kind != LOSS_BCE)
      error_at(jloc(fl), "loss '%s': 'from_logits' is not supported", cls);
  }
  // issue 11: the options Keras's loss classes take (their defaults when
  // absent; Keras 3.15 writes none of Huber's delta and CosineSimilarity's
  // axis, but its from_config reads them)
  if (o->kind == LOSS_HUBER)
    o->param = (float)loss_num(cfg, cls, "delta", 1.0, -FLT_MAX, FLT_MAX,
                               "within float32's range");
  else if (json_object_get(cfg, "delta"))
    error_at(jloc_key(cfg, "delta"), "loss '%s': 'delta' is not supported", cls);
  o->label_smoothing = loss_num(cfg, cls, "label_smoothing", 0, 0, 1, "in [0, 1]");
  if (o->label_smoothing != 0 && o->kind != LOSS_CCE && o->kind != LOSS_BCE)
    error_at(jloc_key(cfg, "label_smoothing"), "loss '%s': label_smoothing is not supported",
             cls);
  json_t *ax = json_object_get(cfg, "axis");
  if (ax && !json_is_null(ax) && !json_is_integer(ax))
    error_at(jloc(ax), "loss '%s': 'axis' must be an integer", cls);
  if (json_is_integer(ax)) { // checked against the output's rank (loss.c); MAX_RANK 6
    o->axis = (int)loss_num(cfg, cls, "axis", -1, -MAX_RANK, MAX_RANK - 1, "from -6 to 5");
    o->axis_loc = jloc(ax);
  }
  json_t *ic = json_object_get(cfg, "ignore_class");
  if (ic && !json_is_null(ic))
    error_at(jloc(ic), "loss '%s': ignore_class is not supported", cls);
  const char *red = get_str(cfg, "reduction");
  if (red && strcmp(red, "sum_over_batch_size") && strcmp(red, "auto"))
    error_at(jloc_key(cfg, "reduction"), "loss '%s': reduction '%s' is not supported (only "
             "sum_over_batch_size)", cls, red);
}

// The output a dict key names, or an error at the key.
static int output_by_name(Model *m, json_t *obj, const char *key, const char *what) {
  for (int i = 0; i < m->noutputs; i++)
    if (!strcmp(m->outputs[i].layer->name, key))
      return i;
  char *names = xstrdup("");
  for (int i = 0; i < m->noutputs; i++)
    names = format("%s%s'%s'", names, i ? ", " : "", m->outputs[i].layer->name);
  error_at(jloc_keyname(obj, key), "'%s' names '%s', which is not an output of model '%s' "
           "(outputs: %s)", what, key, m->name, names);
}

// `loss`: one loss for every output, a list (one per output, in order) or
// a dict keyed by output name (outputs without a key have no loss).
static void load_loss(Model *m, json_t *v) {
  if (json_is_array(v)) {
    if ((int)json_array_size(v) != m->noutputs)
      error_at(jloc(v), "'loss' lists %zu losses, but model '%s' has %d output%s",
               json_array_size(v), m->name, m->noutputs, m->noutputs == 1 ? "" : "s");
    for (int i = 0; i < m->noutputs; i++) {
      json_t *e = json_array_get(v, i);
      if (!json_is_null(e)) load_loss1(&m->losses[i], e);
    }
  } else if (json_is_object(v) && !json_object_get(v, "class_name")) {
    const char *key;
    json_t *e;
    json_object_foreach(v, key, e) {
      int i = output_by_name(m, v, key, "loss");
      if (!json_is_null(e)) load_loss1(&m->losses[i], e);
    }
  } else {
    for (int i = 0; i < m->noutputs; i++) load_loss1(&m->losses[i], v);
  }
}

static double weight_num(json_t *e) {
  if (!json_is_number(e) || json_number_value(e) < 0 || json_number_value(e) > FLT_MAX)
    error_at(jloc(e), "a loss weight must be a number >= 0 (and within float32's range)");
  return json_number_value(e);
}

// `loss_weights`: a list (per output) or a dict keyed by output name.
static void load_loss_weights(Model *m, json_t *v) {
  if (json_is_array(v)) {
    if ((int)json_array_size(v) != m->noutputs)
      error_at(jloc(v), "'loss_weights' lists %zu weights, but model '%s' has %d output%s",
               json_array_size(v), m->name, m->noutputs, m->noutputs == 1 ? "" : "s");
    for (int i = 0; i < m->noutputs; i++) m->losses[i].weight = weight_num(json_array_get(v, i));
  } else if (json_is_object(v)) {
    const char *key;
    json_t *e;
    json_object_foreach(v, key, e) m->losses[output_by_name(m, v, key, "loss_weights")].weight =
        weight_num(e);
  } else if (json_is_number(v) && m->noutputs == 1) {
    m->losses[0].weight = weight_num(v);
  } else {
    error_at(jloc(v), "'loss_weights' must be a list or a dict keyed by output name");
  }
}

typedef struct {
  const char *cls, *name;
  OptKind kind;
  float lr;               // Keras 3's default learning rate
} OptName;

static const OptName opt_names[] = {
  {"SGD", "sgd", OPT_SGD, 0.01f}, {"Adam", "adam", OPT_ADAM, 0.001f},
  {"AdamW", "adamw", OPT_ADAMW, 0.001f}, {"RMSprop", "rmsprop", OPT_RMSPROP, 0.001f},
  {"Adagrad", "adagrad", OPT_ADAGRAD, 0.001f}, {"Adamax", "adamax", OPT_ADAMAX, 0.001f},
  {"Nadam", "nadam", OPT_NADAM, 0.001f}, {"Lion", "lion", OPT_LION, 0.001f},
};

// A number of an optimizer's (what = "optimizer 'adam'") or a schedule's
// config; absent or null: def.
static double opt_num(const char *what, json_t *cfg, const char *key, double def) {
  json_t *v = json_object_get(cfg, key);
  if (!v || json_is_null(v))
    return def;
  if (!json_is_number(v))
    error_at(jloc(v), "%s: '%s' must be a number", what, key);
  if (fabs(json_number_value(v)) > FLT_MAX)
    error_at(jloc(v), "%s: '%s' is %g, beyond float32's range", what, key, json_number_value(v));
  return json_number_value(v);
}

static bool opt_flag(const char *what, json_t *cfg, const char *key) {
  json_t *v = json_object_get(cfg, key);
  if (v && !json_is_null(v) && !json_is_boolean(v))
    error_at(jloc(v), "%s: '%s' must be true or false", what, key);
  return json_is_true(v);
}

// The numbers of a PiecewiseConstantDecay list, into out[max].
static int opt_list(const char *what, json_t *cfg, const char *key, double *out, int max) {
  json_t *v = json_object_get(cfg, key);
  if (!json_is_array(v))
    error_at(v ? jloc(v) : jloc(cfg), "%s: '%s' must be a list of numbers", what, key);
  if ((int)json_array_size(v) > max)
    error_at(jloc(v), "%s: '%s' has %zu entries; kdcc takes at most %d", what, key,
             json_array_size(v), max);
  for (size_t i = 0; i < json_array_size(v); i++) {
    json_t *e = json_array_get(v, i);
    if (!json_is_number(e) || fabs(json_number_value(e)) > FLT_MAX)
      error_at(jloc(e), "%s: '%s' must be a list of numbers (within float32's range)", what, key);
    out[i] = json_number_value(e);
  }
  return (int)json_array_size(v);
}

const char *schedule_class(int kind) {
  static const char *const names[] = {
#define KDRT_X(name, kname) kname,
    KDRT_SCHEDULE_LIST(KDRT_X)
#undef KDRT_X
  };
  return names[kind];
}

// A serialized keras.optimizers.schedules object as the learning rate.
static Schedule *load_schedule(const Optimizer *o, json_t *v) {
  const char *cls = get_str(v, "class_name");
  json_t *cfg = json_object_get(v, "config");
  Schedule *s = xcalloc(1, sizeof *s);
  s->kind = -1;
  for (int k = 0; k < KDRT_SCHEDULE_COUNT; k++)
    if (cls && !strcmp(cls, schedule_class(k))) s->kind = k;
  if (s->kind < 0)
    error_at(jloc(cls ? json_object_get(v, "class_name") : v),
             "optimizer '%s': learning-rate schedule '%s' is not supported (supported: "
             "ExponentialDecay, PiecewiseConstantDecay, CosineDecay, InverseTimeDecay, "
             "PolynomialDecay)", o->name, cls ? cls : "?");
  if (!json_is_object(cfg))
    error_at(jloc(v), "optimizer '%s': learning-rate schedule '%s' has no config", o->name, cls);
  char *what = format("optimizer '%s': schedule '%s'", o->name, cls);
  if (s->kind == KDRT_SCHEDULE_PIECEWISE) {
    double b[KDRT_SCHEDULE_MAX_BOUNDS + 1];
    s->nbounds = opt_list(what, cfg, "boundaries", b, KDRT_SCHEDULE_MAX_BOUNDS);
    int nv = opt_list(what, cfg, "values", s->values, KDRT_SCHEDULE_MAX_BOUNDS + 1);
    if (nv != s->nbounds + 1 || !s->nbounds)
      error_at(jloc(json_object_get(cfg, "values")), "%s: %d values for %d boundaries (Keras "
               "wants one more value than boundaries, and at least one boundary)", what, nv,
               s->nbounds);
    // Keras casts the boundaries to the step's integer type
    for (int i = 0; i < s->nbounds; i++) s->bounds[i] = trunc(b[i]);
    return s;
  }
  json_t *init = json_object_get(cfg, "initial_learning_rate");
  if (!init || json_is_null(init))
    error_at(jloc(cfg), "%s: 'initial_learning_rate' is missing", what);
  s->initial = opt_num(what, cfg, "initial_learning_rate", 0);
  s->decay_steps = opt_num(what, cfg, "decay_steps", 0);
  if (!(s->decay_steps > 0)) // Keras refuses it too
    error_at(jloc_key(cfg, "decay_steps"), "%s: 'decay_steps' must be > 0", what);
  s->decay_rate = opt_num(what, cfg, "decay_rate", 0);
  s->staircase = opt_flag(what, cfg, "staircase");
  s->cycle = opt_flag(what, cfg, "cycle");
  s->alpha = opt_num(what, cfg, "alpha", 0);
  s->end = opt_num(what, cfg, "end_learning_rate", 0.0001);
  s->power = opt_num(what, cfg, "power", 1);
  json_t *wt = json_object_get(cfg, "warmup_target");
  s->warmup = wt && !json_is_null(wt);
  s->warmup_target = opt_num(what, cfg, "warmup_target", 0);
  s->warmup_steps = opt_num(what, cfg, "warmup_steps", 0);
  return s;
}

static void load_optimizer(Model *m, json_t *v) {
  Optimizer *o = &m->opt;
  o->loc = jloc(v);
  const char *cls = json_is_string(v) ? json_string_value(v) : get_str(v, "class_name");
  json_t *at = json_is_string(v) ? v : json_object_get(v, "class_name");
  if (!cls)
    error_at(jloc(v), "'optimizer' must be an optimizer name or an optimizer object");
  const OptName *on = NULL;
  for (size_t i = 0; i < sizeof opt_names / sizeof *opt_names; i++)
    if (!strcasecmp(cls, opt_names[i].cls))
      on = &opt_names[i];
  if (!on)
    error_at(jloc(at), "unknown optimizer '%s' (supported: sgd, adam, adamw, rmsprop, adagrad, "
             "adamax, nadam, lion)", cls);
  // Keras 3 defaults.
  *o = (Optimizer){.kind = on->kind, .cls = on->cls, .name = on->name, .loc = o->loc, .lr = on->lr,
                   .beta_1 = 0.9f, .beta_2 = on->kind == OPT_LION ? 0.99f : 0.999f,
                   .epsilon = 1e-7f, .rho = 0.9f, .initial_accumulator_value = 0.1f};
  if (on->kind == OPT_ADAMW)
    o->weight_decay = 0.004f;
  json_t *cfg = json_is_object(v) ? json_object_get(v, "config") : NULL;
  if (!json_is_object(cfg))
    return;
  if (get_str(cfg, "name"))
    o->name = get_str(cfg, "name");
  char *what = format("optimizer '%s'", o->name);
  json_t *lr = json_object_get(cfg, "learning_rate");
  if (json_is_object(lr)) { // the banner's rate: the schedule's at step 0
    o->schedule = load_schedule(o, lr);
    o->lr = (float)(o->schedule->kind == KDRT_SCHEDULE_PIECEWISE ? o->schedule->values[0]
                                                                 : o->schedule->initial);
  } else
    o->lr = (float)opt_num(what, cfg, "learning_rate", o->lr);
  o->beta_1 = (float)opt_num(what, cfg, "beta_1", o->beta_1);
  o->beta_2 = (float)opt_num(what, cfg, "beta_2", o->beta_2);
  o->epsilon = (float)opt_num(what, cfg, "epsilon", o->epsilon);
  o->weight_decay = (float)opt_num(what, cfg, "weight_decay", o->weight_decay);
  o->momentum = (float)opt_num(what, cfg, "momentum", o->momentum);
  o->rho = (float)opt_num(what, cfg, "rho", o->rho);
  o->initial_accumulator_value =
      (float)opt_num(what, cfg, "initial_accumulator_value", o->initial_accumulator_value);
  // The options of one optimizer only: Keras refuses them on another
  // ("Argument(s) not recognized"), kdcc would ignore them.
  static const struct {
    const char *key;
    unsigned kinds; // bit OPT_*
  } own[] = {
    {"amsgrad", 1u << OPT_ADAM | 1u << OPT_ADAMW}, {"centered", 1u << OPT_RMSPROP},
    {"nesterov", 1u << OPT_SGD}, {"momentum", 1u << OPT_SGD | 1u << OPT_RMSPROP},
    {"rho", 1u << OPT_RMSPROP}, {"initial_accumulator_value", 1u << OPT_ADAGRAD},
    {"beta_1", ~(1u << OPT_SGD | 1u << OPT_RMSPROP | 1u << OPT_ADAGRAD)},
    {"beta_2", ~(1u << OPT_SGD | 1u << OPT_RMSPROP | 1u << OPT_ADAGRAD)},
    {"epsilon", ~(1u << OPT_SGD | 1u << OPT_LION)},
  };
  for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
    json_t *x = json_object_get(cfg, own[i].key);
    if (x && !json_is_null(x) && !((own[i].kinds >> on->kind) & 1))
      error_at(jloc_key(cfg, own[i].key), "optimizer '%s': Keras's %s takes no '%s'", o->name,
               on->cls, own[i].key);
  }
  o->nesterov = opt_flag(what, cfg, "nesterov");
  o->amsgrad = opt_flag(what, cfg, "amsgrad");
  o->centered = opt_flag(what, cfg, "centered");
  // base_optimizer: at most one clipping option; one <= 0 clips nothing.
  static const char *const clips[] = {"clipnorm", "global_clipnorm", "clipvalue"};
  float *clip_of[] = {&o->clipnorm, &o->global_clipnorm, &o->clipvalue};
  const char *first = NULL;
  for (int i = 0; i < 3; i++) {
    json_t *c = json_object_get(cfg, clips[i]);
    if (!c || json_is_null(c)) continue;
    if (first)
      error_at(jloc_key(cfg, clips[i]), "optimizer '%s': '%s' and '%s' are both set (Keras takes "
               "only one of clipnorm, clipvalue and global_clipnorm)", o->name, first, clips[i]);
    first = clips[i];
    *clip_of[i] = fmaxf((float)opt_num(what, cfg, clips[i], 0), 0);
  }
  // Options that would change the arithmetic and that kdcc does not do.
  static const char *unsupported[] = {"gradient_accumulation_steps", "loss_scale_factor",
                                      "use_ema", "decay"};
  for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
    json_t *u = json_object_get(cfg, unsupported[i]);
    if (u && !json_is_null(u) && !json_is_false(u) &&
        !(json_is_number(u) && json_number_value(u) == 0))
      error_at(jloc_key(cfg, unsupported[i]), "optimizer '%s': '%s' is not supported", o->name,
               unsupported[i]);
  }
}

// Keras's metrics by the names keras.metrics.get resolves (class names,
// their snake_case, the short aliases): the accuracies, and the losses
// Keras computes as metrics (MeanMetricWrapper of the loss function).
typedef struct {
  const char *name;
  MetricKind kind;
  LossKind loss;
} MetricName;

static const MetricName metric_names[] = {
  {"BinaryAccuracy", MET_BINARY_ACC, 0}, {"binary_accuracy", MET_BINARY_ACC, 0},
  {"CategoricalAccuracy", MET_CAT_ACC, 0}, {"categorical_accuracy", MET_CAT_ACC, 0},
  {"SparseCategoricalAccuracy", MET_SPARSE_ACC, 0}, {"sparse_categorical_accuracy", MET_SPARSE_ACC, 0},
  {"MeanSquaredError", MET_LOSS, LOSS_MSE}, {"mean_squared_error", MET_LOSS, LOSS_MSE},
  {"mse", MET_LOSS, LOSS_MSE}, {"MSE", MET_LOSS, LOSS_MSE},
  {"MeanAbsoluteError", MET_LOSS, LOSS_MAE}, {"mean_absolute_error", MET_LOSS, LOSS_MAE},
  {"mae", MET_LOSS, LOSS_MAE}, {"MAE", MET_LOSS, LOSS_MAE},
  {"MeanAbsolutePercentageError", MET_LOSS, KDRT_LOSS_MAPE},
  {"mean_absolute_percentage_error", MET_LOSS, KDRT_LOSS_MAPE},
  {"mape", MET_LOSS, KDRT_LOSS_MAPE}, {"MAPE", MET_LOSS, KDRT_LOSS_MAPE},
  {"MeanSquaredLogarithmicError", MET_LOSS, KDRT_LOSS_MSLE},
  {"mean_squared_logarithmic_error", MET_LOSS, KDRT_LOSS_MSLE},
  {"msle", MET_LOSS, KDRT_LOSS_MSLE}, {"MSLE", MET_LOSS, KDRT_LOSS_MSLE},
  {"LogCoshError", MET_LOSS, KDRT_LOSS_LOG_COSH}, {"log_cosh_error", MET_LOSS, KDRT_LOSS_LOG_COSH},
  {"KLDivergence", MET_LOSS, LOSS_KLD}, {"kl_divergence", MET_LOSS, LOSS_KLD},
  {"Poisson", MET_LOSS, KDRT_LOSS_POISSON}, {"poisson", MET_LOSS, KDRT_LOSS_POISSON},
  {"Hinge", MET_LOSS, LOSS_HINGE}, {"hinge", MET_LOSS, LOSS_HINGE},
  {"SquaredHinge", MET_LOSS, LOSS_SQUARED_HINGE}, {"squared_hinge", MET_LOSS, LOSS_SQUARED_HINGE},
  {"CategoricalHinge", MET_LOSS, LOSS_CAT_HINGE}, {"categorical_hinge", MET_LOSS, LOSS_CAT_HINGE},
  {"BinaryCrossentropy", MET_LOSS, LOSS_BCE}, {"binary_crossentropy", MET_LOSS, LOSS_BCE},
  {"bce", MET_LOSS, LOSS_BCE}, {"BCE", MET_LOSS, LOSS_BCE},
  {"CategoricalCrossentropy", MET_LOSS, LOSS_CCE},
  {"categorical_crossentropy", MET_LOSS, LOSS_CCE},
  {"SparseCategoricalCrossentropy", MET_LOSS, LOSS_SCCE},
  {"sparse_categorical_crossentropy", MET_LOSS, LOSS_SCCE},
};

// A metric object's option that kdcc computes only at Keras's default.
static void metric_default(json_t *cfg, const char *cls, const char *key, double def) {
  json_t *v = json_object_get(cfg, key);
  if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == def))
    error_at(jloc(v), "metric '%s': '%s' is not supported (only %g)", cls, key, def);
}

// A name given twice, or one another log has, is an error where the logs
// are made (loss.c's build_metric), for all outputs at once.
static void add_metric(OutLoss *o, Metric mt) {
  o->metrics = xgrow(o->metrics, o->nmetrics, &(int){o->nmetrics}, sizeof *o->metrics);
  o->metrics[o->nmetrics++] = mt;
}

// One output's metrics: a name, a metric object or a list of them. A
// string names its log (Keras's compile_utils); an object's log is its
// config's name. Metrics kdcc does not compute are a warning: they change
// no weight, only what is reported.
static void load_metrics1(OutLoss *o, json_t *v) {
  if (json_is_array(v)) {
    for (size_t i = 0; i < json_array_size(v); i++)
      load_metrics1(o, json_array_get(v, i));
    return;
  }
  if (json_is_null(v)) return;
  const char *s = json_is_string(v) ? json_string_value(v) : get_str(v, "class_name");
  json_t *cfg = json_is_object(v) ? json_object_get(v, "config") : NULL;
  Metric mt = {.name = json_is_string(v) ? s : get_str(cfg, "name"), .loc = jloc(v)};
  if (json_is_string(v) && (!strcasecmp(s, "accuracy") || !strcasecmp(s, "acc"))) {
    mt.kind = MET_ACCURACY; // resolved by the output's shape and labels (loss.c)
    add_metric(o, mt);
    return;
  }
  const MetricName *mn = NULL;
  for (size_t i = 0; s && i < sizeof metric_names / sizeof *metric_names; i++)
    if (!strcmp(s, metric_names[i].name)) mn = &metric_names[i];
  if (!mn) {
    warn_at(jloc(v), "metric '%s' is ignored (kdcc computes the accuracies and the losses as "
            "metrics)", s ? s : "?");
    return;
  }
  mt.kind = mn->kind;
  mt.loss = mn->loss;
  if (!mt.name) mt.name = s;
  if (json_is_object(cfg)) {
    metric_default(cfg, s, "threshold", 0.5);
    metric_default(cfg, s, "label_smoothing", 0);
    metric_default(cfg, s, "axis", -1);
    json_t *fl = json_object_get(cfg, "from_logits");
    if (fl && !json_is_null(fl) && !json_is_boolean(fl))
      error_at(jloc(fl), "metric '%s': 'from_logits' must be true or false", s);
    mt.from_logits = json_is_true(fl);
  }
  add_metric(o, mt);
}

// `metrics`: for one output, a list; for several, a list of lists (one per
// output) or a dict keyed by output name.
static void load_metrics(Model *m, json_t *v) {
  if (json_is_object(v) && !json_object_get(v, "class_name")) {
    const char *key;
    json_t *e;
    json_object_foreach(v, key, e) load_metrics1(&m->losses[output_by_name(m, v, key, "metrics")], e);
  } else if (m->noutputs > 1 && json_is_array(v) && json_array_size(v) == (size_t)m->noutputs &&
             (json_is_array(json_array_get(v, 0)) || json_is_null(json_array_get(v, 0)))) {
    for (int i = 0; i < m->noutputs; i++) load_metrics1(&m->losses[i], json_array_get(v, i));
  } else if (m->noutputs > 1 && !json_is_null(v) &&
             !(json_is_array(v) && json_array_size(v) == 0)) {
    error_at(jloc(v), "model '%s' has %d outputs: give 'metrics' as a dict keyed by output name "
             "or a list of lists", m->name, m->noutputs);
  } else {
    load_metrics1(&m->losses[0], v);
  }
}

static void load_compile(Model *m, json_t *cc) {
  m->losses = xcalloc(m->noutputs, sizeof *m->losses);
  for (int i = 0; i < m->noutputs; i++)
    m->losses[i] = (OutLoss){.kind = LOSS_MSE, .weight = 1, .axis = -1};
  load_optimizer(m, json_string("adam"));
  if (!cc || json_is_null(cc)) {
    for (int i = 0; i < m->noutputs; i++) m->losses[i].has = true;
    return;
  }
  if (!json_is_object(cc))
    error_at(jloc(cc), "'compile_config' must be an object");
  json_t *loss = json_object_get(cc, "loss"), *opt = json_object_get(cc, "optimizer");
  if (loss && !json_is_null(loss))
    load_loss(m, loss);
  else
    for (int i = 0; i < m->noutputs; i++) m->losses[i].has = true;
  json_t *lw = json_object_get(cc, "loss_weights");
  if (lw && !json_is_null(lw))
    load_loss_weights(m, lw);
  if (opt && !json_is_null(opt))
    load_optimizer(m, opt);
  json_t *metrics = json_object_get(cc, "metrics");
  if (metrics)
    load_metrics(m, metrics);
  bool any = false;
  for (int i = 0; i < m->noutputs; i++) any |= m->losses[i].has;
  if (!any)
    error_at(jloc(loss), "model '%s': no output has a loss", m->name);
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
    if (get_str(env, "class_name") && is_model_class(get_str(env, "class_name")) &&
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

Model *load_model_json(const char *file, json_t *root) {
  if (!json_is_object(root) || !get_str(root, "class_name"))
    error_at(jloc(root), "expected a Keras model: an object with 'class_name' and 'config'");
  Model *m = xcalloc(1, sizeof *m);
  m->file = file;
  m->root = root;
  const char *cls = get_str(root, "class_name");
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
              .vpre = m->sequential ? format("%s/", m->name) : ""};
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

Model *load_model(const char *path) {
  return load_model_json(path, json_load_file_located(path));
}
