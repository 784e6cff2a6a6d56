// kdcc: an ahead-of-time SPMD compiler for Keras training steps.
//
// Pipeline (one file per pass, in this order):
//   json.c     JSON text -> jansson tree, with a line:column for every value
//   load.c     Keras 3 model JSON -> Model (layers, edges)
//   hub.c      a keras-hub task or preset -> the Functional model it builds
//   load_compile.c its compile config (losses, metrics, optimizer)
//   dist.c     distribution spec -> Mesh + LayoutMap (PCRE2 full match)
//   ir.c       nodes, shapes and the constructors every pass uses
//   vars.c     variables: initializers, regularizers, constraints, penalties
//   layers*.c  Keras layers -> ops, shapes inferred (op table: ops.c);
//              layers.def lists the classes, layers.c holds the table,
//              layers_attn/conv/rnn.c the families
//   loss.c     the forward graph, losses and metrics (build_graph)
//   autodiff.c reverse-mode gradients and optimizer updates
//   shard.c    sharding propagation to a fixed point, then collectives
//   fuse.c     adjacent elementwise ops into one loop
//   store16.c  issue 23: a mixed policy's saved activations stored in 16 bits
//   blocks.c   repeated blocks (a model's stacked layers), to be written once, in a loop
//   memplan.c  static memory plan: parameter blob + activation arena
//   report.c   --report, --report=json, --emit=graph
//   lower.c    how a node's buffer, shapes and literals are spelled (ops.c, emit.c)
//   emit.c     what the emitters share
//   emit_c.c   SPMD C program for the CPU runtime (runtime/kdrt.h)
//   emit_cuda.c the same program for the CUDA runtime (runtime/cuda/kdrt_cuda.h)
//   verify.c   the IR verifier, run after every pass
//   decode.c   generate's decode step with a key/value cache (issue 24)
//   pipeline.c the passes in order
//   main.c     command line, output, building the executable
#ifndef KDCC_H
#define KDCC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../runtime/kdrt_defs.h" // the enums kdcc and both runtimes share

#define MAX_RANK 6
#define MAX_AXES 4
#define MAX_IN 8

#define noreturn _Noreturn
#define unreachable() fatal_internal(__FILE__, __LINE__, "unreachable")

// ---------------------------------------------------------------- util.c
// Diagnostics and small helpers.

typedef struct {
  const char *file; // path as the user gave it
  int line, col;    // 1-based; 0 when unknown
} Loc;

// `file:line:col: error: msg` on stderr, exit(1).
noreturn void error_at(Loc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// `file:line:col: warning: msg` on stderr.
void warn_at(Loc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// `kdcc: error: msg`, exit(1): errors with no place in a file (command line).
noreturn void error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
noreturn void fatal_internal(const char *file, int line, const char *msg);
// Diagnostics go to diag_out (stderr when NULL). An error calls error_exit,
// which must not return (the fuzz target's longjmp), instead of exit(1).
extern FILE *diag_out;
extern void (*error_exit)(void);
// Allocations live until exit, or until release_all() frees every one of
// them (the fuzz target, between runs); "out of memory" is an error.
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t bytes);
void xfree(void *p);
void release_all(void);
char *xstrdup(const char *s);
// p (n elements used of *cap, each size bytes) with room for one more.
void *xgrow(void *p, int n, int *cap, size_t size);
char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern bool opt_quiet_warnings;

// Sizes kdcc compiles: every dimension at most MAX_DIM (the runtime's window
// ops and BLAS take int extents), every tensor at most MAX_ELEMS elements
// (4 TiB of float32). Products and sums of sizes go through size_mul and
// size_add, which saturate at INT64_MAX instead of overflowing.
#define MAX_DIM INT32_MAX
#define MAX_ELEMS (INT64_C(1) << 40)
// Layers a model may have (each call of a shared layer counts): passes
// after the loader are not all linear in the model's size.
#define MAX_LAYERS 10000
int64_t size_mul(int64_t a, int64_t b);
int64_t size_add(int64_t a, int64_t b);

// Names (a model's, a layer's, a mesh axis's) are written into the
// generated program's string literals and comments: what makes one unsafe
// there ("holds '\"'"; also '\\', '/', "??", control characters, or empty),
// or NULL.
const char *name_flaw(const char *s);
#define NAME_RULE "a name is written into the generated program: it may not hold '/', '\"', " \
                  "'\\', '\?\?' or control characters"

// ---------------------------------------------------------------- json.c
// jansson does not keep positions, so after it parses a document we walk
// the text once more in step with the tree and record where each value
// starts. Singletons (true/false/null) have no identity in jansson; ask for
// their position through their parent.

// Parse `path` (or, if it ends in ".keras", its config.json member). On a
// syntax error: error_at the position jansson reports. The returned tree
// lives as long as the process.
json_t *json_load_file_located(const char *path);
// Parse text in memory; `name` is the file name used in messages.
json_t *json_load_text_located(const char *name, const char *text, size_t len);
// Where v starts. For a singleton, the position of its last recorded use.
Loc jloc(const json_t *v);
// Where member `key` of object obj starts (its value), or obj's own position.
Loc jloc_key(const json_t *obj, const char *key);
// Where element i of array arr starts.
Loc jloc_idx(const json_t *arr, size_t i);
// Where the key string of member `key` of obj starts, or obj's own position.
Loc jloc_keyname(const json_t *obj, const char *key);
// Forget every recorded position (the fuzz target, before release_all()).
void json_forget_locations(void);
// Member `key` of obj if it is a string, else NULL.
const char *json_get_str(const json_t *obj, const char *key);
// A value kdcc made itself (hub.c's layers) takes `at` as its position, so
// that errors about it point at what it was made from.
void jloc_alias(const json_t *v, Loc at);

// ---------------------------------------------------------------- load.c
// The model as the user wrote it: layers with their resolved inbound edges.

// Loss kinds are the runtime's (kdrt_defs.h): KDRT_LOSS_MSE, ...
typedef int LossKind;
enum { LOSS_MSE = KDRT_LOSS_MSE, LOSS_MAE = KDRT_LOSS_MAE, LOSS_CCE = KDRT_LOSS_CCE,
       LOSS_SCCE = KDRT_LOSS_SCCE, LOSS_BCE = KDRT_LOSS_BCE, LOSS_HUBER = KDRT_LOSS_HUBER,
       LOSS_HINGE = KDRT_LOSS_HINGE, LOSS_SQUARED_HINGE = KDRT_LOSS_SQUARED_HINGE,
       LOSS_COSINE = KDRT_LOSS_COSINE, LOSS_KLD = KDRT_LOSS_KLD,
       LOSS_CAT_HINGE = KDRT_LOSS_CAT_HINGE };

typedef enum {
  OPT_SGD, OPT_ADAM, OPT_ADAMW, OPT_RMSPROP, OPT_ADAGRAD, OPT_ADAMAX, OPT_NADAM, OPT_LION,
  OPT_COUNT
} OptKind;

// A learning-rate schedule (Keras's keras.optimizers.schedules), evaluated
// by the runtime at every step: the runtime's kdrt_schedule (kdrt_defs.h).
typedef struct kdrt_schedule Schedule;
const char *schedule_class(int kind); // "ExponentialDecay", ... (load_compile.c)

typedef struct {
  OptKind kind;
  const char *cls;        // Keras's class: "Adam", "SGD", ...
  const char *name;       // Keras's lower-case name: "adam", "sgd", ...
  float lr, beta_1, beta_2, epsilon, weight_decay, momentum, rho;
  float initial_accumulator_value; // Adagrad: its slot's first value
  bool nesterov, amsgrad, centered;
  // Gradient clipping as base_optimizer does it before the update (at most
  // one is set; 0: unset): each gradient scaled to norm <= clipnorm, all of
  // them scaled together to global norm <= global_clipnorm, or each element
  // clipped to [-clipvalue, clipvalue].
  float clipnorm, global_clipnorm, clipvalue;
  Schedule *schedule;     // NULL: the constant rate lr
  Loc loc;
  // issue 23: Keras's LossScaleOptimizer around it (compile wraps the
  // optimizer of a mixed_float16 model; or the compile_config names one):
  // the loss times a dynamic scale before the backward pass, the gradients
  // divided by it, a step whose gradients are not all finite skipped and
  // the scale halved, doubled after growth_steps finite steps in a row.
  // loss_scale: its initial_scale (0: no loss scaling).
  double loss_scale;
  int64_t growth_steps;   // dynamic_growth_steps
  const char *loss_scale_why; // what wrapped it, for --report and the program's header
} Optimizer;

typedef struct Layer Layer;

// A metric of one output, as compile_config names it: an accuracy, or a
// loss function computed as a metric (Keras's MeanMetricWrapper).
typedef enum { MET_ACCURACY, MET_BINARY_ACC, MET_CAT_ACC, MET_SPARSE_ACC, MET_LOSS } MetricKind;
typedef struct {
  MetricKind kind;
  LossKind loss;          // MET_LOSS: which loss
  bool from_logits;       // MET_LOSS: the metric's own (false when named by a string)
  const char *name;       // its log's name, as Keras names it ("acc", "mae", ...)
  bool weighted;          // one of compile's weighted_metrics: weighted by the sample weights
  Loc loc;
} Metric;

// The loss and metrics of one model output (compile_config).
typedef struct {
  bool has;               // this output has a loss (else it is only predicted)
  LossKind kind;
  bool from_logits;
  float param;            // issue 11: huber's delta
  double label_smoothing; // issue 11: the crossentropies' (0: none)
  Loc axis_loc;           // issue 11: where a loss's `axis` is written (none: -1)
  int axis;
  double weight;          // loss_weights, default 1
  Loc loc;                // where its loss is written
  Metric *metrics;        // in compile_config's order
  int nmetrics;
} OutLoss;

typedef struct {
  Layer *layer;   // producing layer
  int node_index; // keras_history[1]
  int tensor_index;
  Loc loc;        // where the reference was written
} TensorRef;

struct Layer {
  const char *cls;        // "Dense", "Conv2D", ...
  const char *name;       // Keras layer name
  const char *path;       // variable path prefix: "d1" (Functional) or "seq/d1" (Sequential)
  json_t *json;           // the layer envelope {"class_name", "config", ...}
  json_t *cfg;            // its "config" object
  Loc loc;                // where the envelope starts
  TensorRef in[MAX_IN];   // inbound tensors, in call order (after flattening nested lists)
  json_t *kwargs;         // the call's keyword arguments (Keras 3 files), or NULL
  int nin;
  int mask;               // issue 10: attention layers: the in[] index of the call's
                          // attention_mask tensor (after the arguments), 0: none
  int index;              // position in Model.layers
  // InputLayer only: per-sample shape (batch dim dropped), from batch_shape /
  // batch_input_shape / shape.
  int in_rank;
  int64_t in_shape[MAX_RANK];
  bool in_int;            // an integer dtype (token ids): int32 in the program
  void *node;             // loss.c: the Node holding this layer's output
  // A layer called k times is k Layers: the first, and a clone per further
  // call (shared = the first, call = k), each with that call's inputs; the
  // clones own no variables: they use the first one's.
  Layer *shared;
  int call;
  Layer **calls;          // the first: every call's Layer, [ncalls]
  int ncalls;
  const char *sub;        // issue 11: where a Bidirectional's forward (backward) layer keeps
                          // its variables in the weights file: "forward_layer/cell"
  bool frozen;            // its Functional model has trainable false: it is frozen
                          // whatever its own flag says
  int cdt;                // issue 23: its dtype policy's compute dtype when that is 16-bit
                          // (mixed_bfloat16: KDRT_ROUND_BF16), else 0 (float32)
  int vdt;                // issue 23: its variables' dtype when that is 16-bit (the
                          // bfloat16 policy: KDRT_ROUND_BF16, float16's _F16), else 0
  // Nested models (a Sequential or Functional used as a layer): load.c
  // inlines their layers, named "<model>/<layer>" (Keras refuses '/' in a
  // name, so these never clash), and drops the model's own Layer.
  struct Nest *nest;      // load.c: this Layer is a nested model's call
  const TensorRef *bound; // load.c: a nested model's InputLayer: the call's tensor
  const char *scope;      // the weights file's group of the nested model(s) holding
                          // it, "sequential" or "functional/layers/sequential_1";
                          // NULL: the model's own layer
  const char *group;      // its weights-file group under scope when not the one Keras
                          // counts from its class (hub.c: "transformer_decoder_1/
                          // _self_attention_layer"), else NULL
};

typedef struct {
  const char *file;
  const char *name;       // model name ("sequential", "functional", ...)
  bool sequential;
  Layer **layers;         // in file order; Sequential gets its chain of edges filled in
  int nlayers;
  Layer **names;          // load.c: a hash of the layers by name (find_layer)
  size_t names_cap;
  Layer **inputs;         // input layers
  int ninputs;
  TensorRef *outputs;
  int noutputs;
  Layer **bound;          // the nested models' InputLayers (Layer.bound), whose shapes
  int nbound;             // the tensors their calls pass must have
  // compile_config (defaults when absent: loss mse, adam), per output
  OutLoss *losses;        // [noutputs]
  Optimizer opt;
  json_t *root;           // the whole document
  json_t *dist_json;      // an embedded "distribution" object, or NULL
  const char *weights_file; // the program's initial weights: a .keras archive, a keras-hub
                          // preset's model.weights.h5, or NULL
} Model;

// A model file (.json, .keras) or a keras-hub preset directory.
Model *load_model(const char *path);
// Same, from a parsed document; `file` for messages.
Model *load_model_json(const char *file, json_t *root);
Layer *find_layer(Model *m, const char *name);
// issue 23: --dtype-policy's policy for every layer but the inputs, or NULL.
extern const char *opt_dtype_policy;

// Typed config getters: error_at the value (naming the layer) when it has
// the wrong type. `def` is returned when the key is absent or null.
int64_t cfg_int(const Layer *l, const char *key, int64_t def);
double cfg_num(const Layer *l, const char *key, double def);
bool cfg_bool(const Layer *l, const char *key, bool def);
const char *cfg_str(const Layer *l, const char *key, const char *def);
// A list of ints (e.g. kernel_size, strides: an int n means [n, n]); returns count.
int cfg_ints(const Layer *l, const char *key, int64_t *out, int max);
// A size (units, filters): an integer in [1, MAX_DIM], else an error at the
// value; `def` when absent. cfg_sizes: cfg_ints whose every entry is one
// (kernel_size, strides, pool_size).
int64_t cfg_size(const Layer *l, const char *key, int64_t def);
int cfg_sizes(const Layer *l, const char *key, int64_t *out, int max);

// ---------------------------------------------------------------- hub.c
// keras-hub's models, which keras-hub saves as hyper-parameters: a task
// (GPT2CausalLM, ...) or its backbone, as the Functional model of Keras
// layers keras-hub's Python builds from them.

// Whether root is a keras-hub model ("registered_name": "keras_hub>...").
bool hub_model(json_t *root);
// root as a Functional envelope with the task's compile_config; *scope: the
// weights-file group the backbone's layers sit in (a task's archive keeps
// them under its backbone's group; a preset's file is the backbone's own).
json_t *hub_expand(json_t *root, bool preset, const char **scope);
// A preset directory (config.json, task.json, metadata.json,
// model.weights.h5): its task's envelope, *weights its weights file.
json_t *hub_load_preset(const char *dir, const char **weights);
// --sequence-length: the steps of a keras-hub model's token_ids (0: the
// backbone's max_sequence_length, where it has one).
extern int64_t opt_sequence_length;
// --lora-rank, --lora-targets: keras-hub's backbone.enable_lora(rank) on the
// attention projections named in targets (default "query,value"); 0: none.
extern int64_t opt_lora_rank;
extern const char *opt_lora_targets;
// --sample-weight: the program takes Keras's sample_weight (a LABEL of the
// losses' rows, Graph.sample_weight), weighing the losses and weighted_metrics.
extern bool opt_sample_weight;

// ---------------------------------------------------------------- load_compile.c
// compile_config (absent or null: loss "mse", optimizer "adam") into m's
// losses, loss weights, metrics and optimizer; m's outputs already known.
void load_compile(Model *m, json_t *cc);

// ---------------------------------------------------------------- dist.c
// Mesh, layouts and the LayoutMap.

typedef struct {
  int ndim;
  int shape[MAX_AXES];
  const char *names[MAX_AXES];
  int size;               // product of shape
  Loc loc;
  Loc size_loc[MAX_AXES]; // where each axis's size is written (no file: --mesh)
} Mesh;

// A placement: per tensor dim the mesh axis it is split over (-1:
// replicated) and the axes over which the local values are pending partial
// sums. Invariant: every mesh axis appears at most once in axis[] and partial.
typedef struct {
  int8_t axis[MAX_RANK];
  uint8_t partial;        // bit mask of mesh axes: pending sums
  uint8_t pmax;           // bit mask of mesh axes: pending maxima (a split max reduction)
} Place;

typedef struct {
  const char *key;        // the regex or exact path
  json_t *val;            // the layout list
  Loc loc;                // where the key is written
  void *re;               // pcre2_code *
  int uses;               // how many paths it matched
} LayoutRule;

typedef enum { DIST_NONE, DIST_DATA, DIST_MODEL } DistKind;

typedef struct {
  DistKind kind;
  Mesh mesh;
  int batch_axis;         // index into mesh, -1 when no distribution
  LayoutRule *rules;
  int nrules;
  void *match_ctx;        // pcre2_match_context * (the match limit)
  const char *file;
  Loc loc;
} Dist;

// From --distribution FILE, else the model's embedded "distribution", else
// one device. `mesh_override` is --mesh's text ("data=2,model=4") or NULL.
Dist *load_dist(Model *m, const char *dist_path, const char *mesh_override);
// Layout for `path` (a variable or "<layer>/output") of global shape
// shape[rank]: exact key, else the unique full-match regex, else replicated.
// Errors (ambiguous, bad axis, wrong rank, axis twice, not divisible) name
// the key's position, the layer and the path. Returns whether a rule matched.
bool dist_lookup(Dist *d, const char *path, const char *layer, int rank, const int64_t *shape,
                 Place *out);
// Warn for every rule that matched nothing, with the nearest of `paths` as a hint.
void dist_warn_unused(Dist *d, const char **paths, int npaths);
Place place_replicated(void);
// "(None, 'model')" style text of a placement for messages and the report.
char *place_str(const Mesh *mesh, int rank, const Place *p);

// ---------------------------------------------------------------- ops.c, ops_nn.c
// The ops of the training graph. runtime/kdrt_ops.def lists them, each
// with its attributes and kernels; ops.c (the core ops) or ops_nn.c (the
// network families, then the table op_defs) defines each one in one
// place, as one OpDef: its operands, its shape rule, its sharding rule
// (named factors), its gradient (forward ops built from the op and its
// output's gradient) and its emission (runtime calls, the same for the C
// and the CUDA program); its typed attributes are its family's ATTR line
// in kdrt_ops.def. A name there without its op_<NAME>
// definition fails the link.

typedef enum {
#define X(name) OP_##name,
#include "../runtime/kdrt_ops.def"
  OP_COUNT
} OpKind;

// PH_CONSTRAIN: issue 11's weight constraints, after every update (and
// after the update phase's gradient collectives, which fuse.c moves first)
typedef enum { PH_FORWARD, PH_LOSS, PH_BACKWARD, PH_UPDATE, PH_CONSTRAIN } Phase;

// Activations are the runtime's (kdrt_defs.h's KDRT_ACT_LIST), then those
// that are ops of their own (kdrt_ops.def's ACT_OP: softmax, log_softmax).
typedef int Act;
enum { ACT_LINEAR = KDRT_ACT_LINEAR, ACT_RELU = KDRT_ACT_RELU, ACT_SIGMOID = KDRT_ACT_SIGMOID,
       ACT_TANH = KDRT_ACT_TANH, ACT_GELU = KDRT_ACT_GELU, ACT_SILU = KDRT_ACT_SILU,
       ACT_OP_BEFORE_ = KDRT_ACT_COUNT - 1, // so that the first ACT_OP is KDRT_ACT_COUNT
#define ACT_OP(name, kname) ACT_##name,
#include "../runtime/kdrt_ops.def"
       ACT_COUNT };

// DT_U16 (issue 23): a value stored in 16 bits, the bits of the bfloat16 or
// float16 (its `half`) that its float32 value is exactly (store16.c's
// PACK16); the memory plan gives it half the floats.
typedef enum { DT_F32, DT_I32, DT_U16 } DType;

typedef struct Var Var;
typedef struct Node Node;

typedef struct {
  int rank;
  int64_t d[MAX_RANK];
} Shape;

// issue 24: ROPE: rotary position embedding as keras-hub computes it; its
// inverse frequencies come from these (rope_inv_freq), once per program.
// ROPE_LINEAR, ROPE_DYNAMIC and ROPE_YARN are RotaryEmbedding's rope_type
// ("linear": the frequencies over scaling_factor); ROPE_LLAMA is
// LlamaRotaryEmbedding's own (which ignores scaling_factor), ROPE_LLAMA31
// with Llama 3.1's smoothing (freq_adjust, low_freq, high_freq,
// pretrain_len: keras-hub's frequency_adjustment_factor, low_freq_factor,
// high_freq_factor, pretraining_sequence_length).
typedef enum { ROPE_LINEAR, ROPE_DYNAMIC, ROPE_YARN, ROPE_LLAMA, ROPE_LLAMA31 } RopeKind;
typedef struct {
  RopeKind kind;
  double max_wavelength, scaling_factor;
  int64_t denominator_dim;          // LINEAR, DYNAMIC: the exponents' denominator; 0: the features
  double beta_fast, beta_slow;      // YARN
  int64_t original_max;             // YARN: original_max_position_embeddings
  bool truncate;                    // YARN
  double freq_adjust, low_freq, high_freq, pretrain_len; // LLAMA31
} RopeParams;

// Typed attributes, one struct per family of ops (kdrt_ops.def's ATTR lines),
// and Attrs, the union of them all, which is Node's.
#define ATTR(type, member, ...) typedef struct { __VA_ARGS__ } type;
#include "../runtime/kdrt_ops.def"
#define ATTR(type, member, ...) type member;
typedef union {
#include "../runtime/kdrt_ops.def"
} Attrs;

struct Node {
  int id;
  OpKind op;
  Node *in[MAX_IN];       // operands
  int nin;
  Shape shape;            // global shape
  DType dtype;
  Phase phase;
  const char *name;       // "d1/kernel", "d1/output", "grad(d1/kernel)", ...
  const char *layer;      // the Keras layer it comes from (NULL for internals)
  const char *role;       // what it is in its layer ("q", "scores", "probs"), which its
                          // buffer's name says (lower.c's off_name), or NULL
  Loc loc;                // where that layer is written
  union {                 // its attributes: Attrs, by the op's member (n->dot.nk)
#define ATTR(type, member, ...) type member;
#include "../runtime/kdrt_ops.def"
  };
  int index;              // INPUT, LABEL: which input / label; LOSS, METRIC: the output
  int64_t id_range;       // INPUT of integer ids: they index tables of this many rows
  uint8_t bdims;          // dims whose extent is the batch (find_batch_dims): the global
                          // batch at compile time, the step's rows at run time
  Var *var;               // OP_PARAM, OP_UPDATE
  // passes' results
  Place place;            // placement this node produces (shard.c)
  Place want;             // a fixed placement (seed or constraint), if has_want
  bool has_want;
  Node *grad;             // autodiff.c scratch: accumulated gradient
  int64_t offset;         // memplan.c: float offset in its region
  int region;             // memplan.c: REGION_*
  int last_use;           // memplan.c
  bool dead;              // removed by a pass
  bool fused;             // OP_UPDATE done by the op that makes its gradient (fuse.c);
                          // BIAS_GRAD, ATTENTION_LSE, ATTENTION_GRAD's dk and dv: written
                          // by the op after them (no code of their own)
  // issue 23: mixed precision (ir.c's new_node, while a layer of a 16-bit
  // policy is built): half, the 16-bit type (KDRT_ROUND_*) its value is
  // exactly one of (a ROUND, or an exact op of such values); pend, the
  // type a 16-bit op's result is to be rounded to before any use (its
  // users read `rounded`, the ROUND made at the first use).
  uint8_t half, pend;
  Node *rounded;
  // issue 23 (store16.c): 1 + the operand whose buffer this op writes (a ROUND,
  // an activation or its gradient, that operand's only reader: kdrt_ops.def's "y
  // may be x"), else 0; to the memory plan and the emitters a view of it
  uint8_t inplace;
  // issues 22, 23 (fuse.c's fuse_rounds): the 16-bit type (KDRT_ROUND_*) this
  // op rounds its result to as its kernel stores it (its _rnd kernel: the
  // ROUND after it, its only reader, is then fused and emits nothing), else 0
  uint8_t round_out;
};

// The node whose buffer n's is, when n is a view: a reshape's operand, or
// (issue 23) the operand an in-place op writes over; else NULL.
static inline Node *view_of(const Node *n) {
  return n->op == OP_RESHAPE ? n->in[0] : n->inplace ? n->in[n->inplace - 1] : NULL;
}

// The node whose buffer n is: n, or a view's operand's (view_of, repeated).
static inline Node *base_of(Node *n) {
  while (view_of(n)) n = view_of(n);
  return n;
}

// The sharding rule of an op, einsum-style: every dimension of every
// operand and of the result is mapped to a named factor; a factor passes
// through to the result, is contracted (summed over: a split leaves a
// partial sum), is reduced by max (a split leaves a pending max), or needs
// its whole extent on every device.
#define MAX_FACTORS 24
typedef enum { F_PASS, F_CONTRACT, F_MAX, F_FULL } FactorKind;
typedef struct {
  int nf;
  FactorKind kind[MAX_FACTORS];
  int64_t size[MAX_FACTORS];
  // A blocked factor's dims may be a multiple of its size: the factor is
  // their major part, an inner block riding along unsplit (a grouped conv's
  // channels, G groups of cg inputs or kg outputs); a split divides the size.
  bool blocked[MAX_FACTORS];
  int8_t in[MAX_IN][MAX_RANK]; // factor of each operand dim, -1: none
  int8_t out[MAX_RANK];        // factor of each result dim
} Rule;

// The kernels of runtime/kdrt_ops.def's K and KC lines, KN_<name>: a
// lowering names its kernel by one, so that a misspelled kernel fails
// kdcc's build, not the generated program's.
typedef enum {
#define K(name, args) KN_##name,
#define KC K
#include "../runtime/kdrt_ops.def"
  KN_COUNT
} Kernel;

// What an op emits: runtime calls, each the same kernel of kdrt_ops.def in
// both backends (kdrt_<fn>(...) on the CPU, kdrt_cuda_<fn>(d, ...) on the
// GPU), with static descriptors declared before it.
typedef enum { STEP_TRAIN, STEP_EVAL, STEP_GRAD } StepKind;
typedef struct {
  const char *fn;         // "matmul"
  bool ctx;               // a KC entry: the CPU one takes the context c first
  char *decl;             // "static const kdrt_gemm g = {...};" or NULL
  char *args;
} Call;
typedef struct {
  StepKind step;
  Call *calls;
  int ncalls, cap;
  const char *note;       // a comment line instead of / before the calls
  const char *loop;       // a loop statement the calls run in ("for (...)", issue 11's
                          // time loop; issue 23's "if (c->apply_update)"), or NULL
} Lowering;

typedef struct Graph Graph;
typedef struct {
  const char *name;       // "matmul"
  int nin;                // operand count, -1: variadic
  uint8_t linear;         // operands the op is linear in: partial sums may pass (shard.c)
  bool joint;             // linear jointly (add): all partial operands must agree;
                          // else separately (matmul): at most one may stay partial
  void (*rule)(const Node *n, Rule *r);
  // Gradients of n's operands from n->grad: accumulate(g, operand, grad)
  // for each operand with need[operand->id]. NULL: not differentiable
  // (backward and update ops, collectives).
  void (*grad)(Graph *g, Node *n, const bool *need);
  void (*emit)(const Node *n, Lowering *lw);
  // Its result's shape from its operands and attributes (JAX's abstract
  // evaluation): op_make gives a new node this shape, and verify.c checks
  // every node against it after every pass. False where they do not fit;
  // NULL: a leaf (INPUT, LABEL, FILL, CONST), whose shape no operand or
  // attribute holds: its builder gives it.
  bool (*shape)(const Node *n, Shape *out);
} OpDef;

#define X(name) extern const OpDef op_##name;
#include "../runtime/kdrt_ops.def"
extern const OpDef *const op_defs[OP_COUNT];
#define op_info(op) (*op_defs[op])

void op_rule(const Node *n, Rule *r);
// A node of op on in[nin], attr's attributes (its member of Node's union;
// nothing else of it is read), its shape by its op's rule, its layer its
// first operand's: make1(g, OP_TRANSPOSE, x, .perm = {{0, 2, 1, 3}}).
Node *op_make(Graph *g, OpKind op, int nin, Node **in, const Node *attr);
#define make1(g, o, a, ...) op_make(g, o, 1, (Node *[]){a}, &(Node){.op = (o), __VA_ARGS__})
#define make2(g, o, a, b, ...) op_make(g, o, 2, (Node *[]){a, b}, &(Node){.op = (o), __VA_ARGS__})
const char *act_name(int act);
const char *loss_name(LossKind kind); // Keras's function name: "mean_squared_error", ...
static inline bool is_collective(OpKind op) {
  return op == OP_ALLREDUCE || op == OP_ALLREDUCE_MAX || op == OP_REDUCE_SCATTER ||
         op == OP_ALLGATHER || op == OP_ALLTOALL || op == OP_LOCAL_SLICE;
}
// The output shape of a DOT with these attributes; false when they do not fit.
bool dot_shape(const Shape *a, const Shape *b, int nb, int nk, bool ta, bool tb, Shape *out);
// Add a call to a lowering: its kernel (whether it takes the context is
// its K or KC line's), the descriptor declaration (or NULL), the arguments
// (printf-style).
void lower_call(Lowering *lw, Kernel k, char *decl, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));
// issues 22, 23: lower_call of n's kernel k, or, where n rounds its result as
// it stores it (Node.round_out), of k's _rnd form (kdrt_ops.def: the K line
// after k's) with the type as its first argument.
void lower_call_rnd(Lowering *lw, const Node *n, Kernel k, char *decl, const char *fmt, ...)
  __attribute__((format(printf, 5, 6)));
// issue 24: the h = dim / 2 inverse frequencies keras-hub's RotaryEmbedding
// (or LlamaRotaryEmbedding) computes for a feature dim `dim`, in float32 as
// it computes them, into out[h]; the factor its cos and sin are multiplied
// by (YaRN's, else 1).
float rope_inv_freq(const RopeParams *p, int64_t dim, float *out);
// Why collective n is there, naming ops by their ids ("%8 matmul (d2) is a
// partial sum over 'model'; %9 bias_add (d2) needs the sum").
char *coll_why(const Graph *g, const Node *n);

// ---------------------------------------------------------------- ir.c

struct Var {
  // issue 11: a non-trainable variable that is a moving average instead of a
  // trained one (BatchNormalization's moving statistics): its UPDATE makes
  // w = w * ema_momentum + stat * (1 - ema_momentum), stat = ema_stat.
  Node *ema_stat;
  float ema_momentum;
  // Keras's `trainable: false` on its layer: not in model.trainable_variables,
  // so it gets no gradient, no update, no optimizer slots, no constraint, and
  // its regularizer's penalty is not in the loss (Layer._get_regularization_losses
  // sums trainable weights only); its value stays what --weights or init gave it
  bool frozen;
  // issue 24: LoRA (keras-hub's enable_lora): this kernel is used as
  // w + lora_scale * lora_a . lora_b, w frozen, A and B trained. A and B
  // (lora_part) are not in Keras's weights file, which holds w merged.
  Var *lora_a, *lora_b;
  float lora_scale;
  int lora_index;         // its group in keras-hub's .lora.h5: lora/<lora_index>
  bool lora_part;
  // issue 25: its dataset's type in the weights file, KDRT_F32, or KDRT_I32 for
  // an integer Keras keeps (an adapted Normalization's count; kdrt_var.dtype),
  // or KDRT_BF16 / KDRT_F16 (issue 23: a variable of the bfloat16 / float16 policy)
  int file_dtype;
  // issue 23: its layer's policy keeps it in 16 bits (KDRT_ROUND_BF16, _F16), else 0:
  // a float32 buffer holding exact 16-bit values, rounded after every
  // update (Keras's update in its dtype: ops.c's update_emit) and load
  int vdt;
  // issue 11: its regularizer (Keras's L1, L2, L1L2), whose penalty
  // l1 * sum(|w|) + l2 * sum(w^2) the loss includes (both 0: none)
  double l1, l2;
  // issue 11: its constraint, applied after each update as Keras's optimizer
  // applies it: NonNeg's max(w, 0), or a norm constraint (MaxNorm, UnitNorm,
  // MinMaxNorm: lo, hi, rate) on the norms over the dims in c_axes
  enum { CONS_NONE, CONS_NON_NEG, CONS_NORM } constraint;
  ClipAttr clip;
  uint8_t c_axes;
  const char *path;       // "d1/kernel"
  const char *vname;      // "kernel"
  const char *layer;
  const char *layer_class;
  int index;              // among its layer's (sublayer's) variables (kernel 0, bias 1)
  const char *sub;        // the sublayer holding it in Keras's weights file, or NULL
  const char *scope;      // its layer's Layer.scope
  const char *group;      // its layer's Layer.group
  Loc loc;                // the layer
  Shape shape;
  Place place;            // from the layout map, else replicated
  bool matched;           // a layout rule matched
  int init;               // kdrt_init_kind
  float p0, p1;           // initializer parameters
  double fan_in, fan_out;
  Node *param;
  Node *grad;             // final gradient (input to the update)
  int nslots;             // optimizer slots (0..2)
  int64_t offset;         // memplan.c: in the parameter blob
  int64_t sstride;        // memplan.c: slot k at offset + (k + 1) * sstride (its group's floats)
  int64_t goffset;        // memplan.c: in the gradient blob
  int order;              // issue 25: its index in Graph.vars (blocks.c)
  int ugroup;             // issue 25: its update group, 1 + index in Graph.ugroups; 0: none
};

// A value the steps report: "loss", "accuracy", "out_a_loss", ...
typedef struct {
  const char *name;
  Node *node;             // a scalar (after its reduction, shard.c)
  bool weighted;          // a weighted metric's: its epoch mean is over the sample weights
} Log;

// One step of the arena plan (memplan.c), which a program replays when it
// starts with a batch larger than the compiled one (runtime kdrt_arena_plan,
// the same first fit): a value's buffer taken (PLAN_ALLOC) or given back
// (PLAN_FREE), or a convolution's im2col scratch (PLAN_SCRATCH); each is
// k * rows floats, rows = ceil(B / parts) of a global batch of B (parts 0:
// no batch dim, rows 1).
enum { PLAN_ALLOC, PLAN_FREE, PLAN_SCRATCH };
typedef struct {
  int op;
  const struct Node *n;
  int64_t k;
  int parts;
} PlanStep;

struct Graph {
  Model *model;
  Dist *dist;
  Node **nodes;           // in topological order
  int nnodes, cap;
  Var **vars;
  int nvars, cap_vars;
  Node **inputs;          // INPUT nodes, the model's inputs in order
  int ninputs;
  Node **labels;          // LABEL nodes, one per output with a loss (then sample_weight's)
  int nlabels;
  Node *sample_weight;    // kdcc --sample-weight: the LABEL of the weights of the losses'
                          // rows, after the outputs' labels; else NULL
  Node **outputs;         // the model's outputs
  int noutputs;
  Log *logs;              // logs[0]: "loss", the total
  Node *penalty;          // the regularizers' penalty in the total (a scalar), or NULL
  int nlogs;
  Phase phase;            // the phase new nodes belong to
  int batch;              // global batch size
  int64_t arena_floats, param_floats, grad_floats;
  int64_t scratch_floats; // conv im2col scratch
  int64_t widen16_floats; // issue 23: the CPU's 16-bit products' widened operands (memplan.c)
  int64_t gpu_scratch;    // issue 22: bytes the GPU's products take in scratch (memplan.c)
  PlanStep *plan;         // the arena plan's steps, in order (memplan.c)
  int nplan;
  // issue 23: while a layer of a mixed policy is built (build_layer), its
  // compute dtype (KDRT_ROUND_*; 0: float32, new_node changes nothing), its
  // call's first node, whether it casts float inputs (Keras's autocast),
  // and whether the ops made now compute in float32 (LayerNormalization,
  // attention's softmax: Keras's exceptions)
  int cdt, cdt_first;
  bool cdt_autocast, cdt_f32;
  // issue 25: the repeated blocks (blocks.c), their variables, where each
  // node sits in them (by node id; b -1: in none) and the gradient-blob
  // variable of each node that is one (ir.c's gradient_homes)
  struct RepBlock *blocks;
  int nblocks;
  struct VarBlock *vblocks;
  int nvblocks;
  struct BlockAt *at;
  int nat;
  Var **home;
  // issue 25: the update groups (memplan.c's group_updates): variables
  // updated alike, whose values, gradients and each slot lie in one run
  // each, so that one optimizer call updates them all
  struct UpdGroup *ugroups;
  int nugroups;
};

Node *new_node(Graph *g, OpKind op, int nin, Node **in);
// Gradient accumulation for the ops' grad rules: x->grad += dx.
void accumulate(Graph *g, Node *x, Node *dx);
Node *new_node1(Graph *g, OpKind op, Node *a, Shape shape);
Node *new_node2(Graph *g, OpKind op, Node *a, Node *b, Shape shape);
// x summed over every dim, to a scalar (one REDUCE_SUM a dim).
Node *sum_all(Graph *g, Node *x);
Node *scaled(Graph *g, Node *x, double k);  // x * k (a SCALE)
Node *view(Graph *g, Node *x, Shape s);     // x as shape s (a RESHAPE, no code)
// issue 23: x rounded to the 16-bit type kind (a ROUND; x itself when its
// value already is one); and, while a mixed layer is built, x as its
// readers are to see it (a 16-bit op's result rounded first).
Node *round_to(Graph *g, Node *x, int kind);
Node *mixed_value(Graph *g, Node *x);
// Whether n's result is exactly a 16-bit value of a type when its float
// operands are values of it (n moves, picks or clips them: a reshape, a
// transpose, a gather, relu, ...).
bool exact_op(const Node *n);
uint64_t hash_str(const char *s);
bool shape_eq(const Shape *a, const Shape *b);
char *shape_str(const Shape *s);            // "[16, 200]"
char *kshape(const Shape *s);               // "(None, 200)": as Keras prints a layer's output
int64_t shape_elems(const Shape *s);        // saturated at INT64_MAX
int axis_size(const Graph *g, int axis);    // devices along mesh axis `axis` (-1: 1)
// Local shape of a node under its placement.
Shape local_shape(const Graph *g, const Node *n);

// The variable whose gradient blob entry node n is computed into (its
// gradient, a view's base, or a partial sum all-reduced in place), by node
// id, [ids]; NULL: none.
Var **gradient_homes(Graph *g, int ids);

// ---------------------------------------------------------------- loss.c
// The forward graph of model m (layers, losses, metrics, the penalty) on
// global shapes, for a global batch of `batch`.
Graph *build_graph(Model *m, Dist *d, int batch);

// ---------------------------------------------------------------- autodiff.c
void build_backward(Graph *g);
// A variable's optimizer slots under o, and Keras's name of slot k
// ("momentum", "velocity", ...), in the order the update kernels take them.
int opt_nslots(const Optimizer *o);
const char *opt_slot_name(const Optimizer *o, int k);
// Whether o clips gradients (clipnorm, global_clipnorm or clipvalue).
bool opt_clips(const Optimizer *o);

// ---------------------------------------------------------------- shard.c
// Mark the dims whose extent is the batch, from the inputs' and labels'
// dim 0 through every op's rule (a factor shared with a batch dim is one).
void find_batch_dims(Graph *g);
void propagate_shardings(Graph *g);
// "data,model": the names of the mesh axes in a mask.
char *axes_str(const Graph *g, unsigned axes);
// Bytes of a collective's local input buffer, and bytes each device sends
// for it (ring algorithms, SHARDING.md's table).
int64_t coll_bytes(const Graph *g, const Node *n);
int64_t coll_sent(const Graph *g, const Node *n);
bool place_eq(const Place *a, const Place *b, int rank);

// ---------------------------------------------------------------- fuse.c
// Every fusion of fuse.c's table, in its order (issue 25).
void fuse_graph(Graph *g);
// issue 22: fuse_graph makes attention's chain ATTENTION and ATTENTION_GRAD
// where opt_fuse_attention (main.c: --target cuda at tf32 or bf16) is the
// largest head dim the kernels take; 0: off.
extern int opt_fuse_attention;
// issues 22, 23: after store16, a ROUND written in place over its operand,
// its only reader, folds into the kernel that makes the operand
// (Node.round_out). Nothing changes with KDCC_FUSE_ROUND=0.
void fuse_rounds(Graph *g);
// After the memory plan: gradient all-reduces over the same axes whose
// buffers follow each other in the gradient blob become one call.
void bucket_gradients(Graph *g);

// ---------------------------------------------------------------- store16.c
// The 16-bit types whose products and convolutions read their operands in
// 16 bits (store16.c's mark_dots): a mask of 1 << KDRT_ROUND_*. bfloat16
// only by default (the CPU's oneDNN bf16 matmul; a float16 product there
// would be widened in memory outside the plan, so it stays a float32
// product of exact values); main.c adds float16 for --target cuda.
extern unsigned opt_products16;
// issue 23 (lower.c): Graph.widen16_floats (memplan.c), the buffer of the CPU's
// 16-bit products (kdrt_matmul16's operands widened where the CPU has no
// bfloat16 product); main.c: off for --target cuda, whose runtime needs none.
extern bool opt_widen16;
// issue 22 (lower.c): --target cuda (main.c): 1, its products' scratch
// (Graph.gpu_scratch) counted; 2, at --precision bf16 (every product's
// operands rounded to bfloat16 in scratch).
extern int opt_gpu_products;
// issue 23: every 16-bit value of a mixed policy that the backward pass
// reads, stored in 16 bits in between (PACK16 after it, UNPACK16 before its
// backward readers, or a variable's or a kept value's ROUND made again);
// then ROUNDs and activation gradients in place over an operand that dies
// with them (Node.inplace). Bit for bit the same numbers. Nothing changes
// in a float32 model, or with KDCC_STORE16=0.
void store16(Graph *g);

// ---------------------------------------------------------------- blocks.c
// issue 25: repeated blocks (every transformer block, a ResNet stage's
// blocks): runs of nodes that repeat, op for op, shape for shape and
// layout for layout, each copy one layer's, so that the emitters write one
// function of the layer l and call it in a loop. blocks.c explains how they
// are found and what makes two copies the same.

// Variables that repeat: layer j's are vars[first + j * nv ...], in the
// same order, of the same local sizes, so that each layer's sit pstride
// floats after the one before in the parameter blob, gstride in the
// gradient blob (memplan.c lays the blobs out in variable order).
typedef struct VarBlock {
  int first, nv, n;
  int64_t pstride, gstride;   // memplan.c
  const char **gen;           // [nv]: each path with the layer's number as "<l>"
  int id;                     // 1, 2, ...: BLOCK<id>_P, BLOCK<id>_G
} VarBlock;

// A value a copy reads from another layer's copy of a block (the block's
// input: the one before's output, or in the backward pass the gradient of
// the layer after): block src's node pos of the layer l + delta, or, where
// src has no such layer (the first layer's input), `outer`.
typedef struct {
  int src, pos, delta;
  const Node *outer;
} BlockIn;

// issue 25: a step input a block reads one of a layer (the decode step's
// key/value caches): layer l's is x[base + step * l], operand k of the
// block's node r.
typedef struct {
  int base, step, r, k;
} BlockX;

typedef struct RepBlock {
  int start, len, count;      // copy c: g->nodes[start + c * len .. + len)
  int layer0, dir;            // copy c runs layer layer0 + dir * c (dir 1 or -1)
  int vb;                     // the VarBlock whose layers these are, -1: none
  BlockIn *in;
  int nin;
  BlockX *xin;                // the step inputs it reads by layer
  int nxin;
  // per node of a copy: whether it is an arena value kept for every layer
  // (read outside its copy; memplan.c stacks the layers' values in one
  // buffer, layer l's l * kper * rows floats in), or a temporary that every
  // layer's copy takes at the same place; kper and parts as PlanStep's
  bool *stacked;
  bool *pair;                 // [len]: a stacked value only the next layer's copy reads (and,
                              // the last layer's, what follows the block): two buffers,
                              // layer l's in the (l % 2)th
  int64_t *kper;
  int *parts;
  bool arena;                 // it has arena values (stacked or temporary)
  const char *name;           // its function: "block_forward", "block2_backward"
  const char *gen_layer;      // its first layer's name with the number as "<l>", or NULL
} RepBlock;

typedef struct BlockAt {
  int b, copy, pos;
} BlockAt;

// --no-loops: every node emitted in order, as before issue 25.
extern bool opt_no_loops;
void find_blocks(Graph *g);
// Whether layers a and b are one to find_blocks: their names' first part
// ("decoder_block_0" of keras-hub's "decoder_block_0/attention/query").
bool same_layer(const char *a, const char *b);
// After the memory plan and the gradients' buckets: a block whose copies
// the buckets made differ (the last layer's gradients summed with what
// follows) loses them, or, holding arena values, is an internal error.
void recheck_blocks(Graph *g);
// issue 25: drops every block holding a node of `drop` (by node id), and a
// VarBlock no block runs any longer.
void drop_blocks(Graph *g, const bool *drop);

// ---------------------------------------------------------------- memplan.c
enum { REGION_NONE, REGION_PARAM, REGION_GRAD, REGION_ARENA, REGION_INPUT };
// issue 25: the n variables of vars[first .. last] whose ugroup is this
// one's, updated by one call of the optimizer (their UPDATE nodes: the
// last, `leader`, makes it; the others clip their own gradient first, if
// clipnorm asks it).
typedef struct UpdGroup {
  int first, last, n;
  const Node *leader;
  int64_t floats;             // plan_memory: the values' run (each 16-float aligned)
} UpdGroup;
// The update groups, after find_blocks: a block of their updates is
// dropped (their updates are one call, not one a layer), unless each group
// lies in one copy of it (a layer's groups, parted by frozen variables:
// LoRA's), which its function updates layer by layer.
void group_updates(Graph *g);
void plan_memory(Graph *g);

// ---------------------------------------------------------------- verify.c
// The IR's invariants, after pass `pass` (placements too when placed);
// a failure is an internal error naming the pass and the node (exit 70).
void verify_graph(const Graph *g, const char *pass, bool placed);

// ---------------------------------------------------------------- pipeline.c
// Every pass from the model file to a planned graph (no output).
Graph *compile_model(const char *model_path, const char *dist_path, const char *mesh, int batch);

// ---------------------------------------------------------------- decode.c
// issue 24: the key/value-cached decode step of `./train generate`, derived
// from the forward graph right after build_graph (decode_derive), sharded
// and planned after the training graph's passes (decode_finish), written
// as the program's second C file (decode_emit_c: false, nothing written,
// when the model has none; decode_why says why a model generate can run has
// none, else NULL).
void decode_derive(Graph *g);
void decode_finish(Graph *g);
bool decode_emit_c(const char *path);
// The prefill step (the whole window, its keys and values stored in the
// caches), the program's third file when the decode step has one.
bool prefill_emit_c(const char *path);
const char *decode_why(void);

// ---------------------------------------------------------------- report.c
void print_report(Graph *g, FILE *out, bool json);
void print_graph(Graph *g, FILE *out);
// An error, naming the largest tensors, when one device needs more than
// `limit` bytes (the report's total); limit_text says where it comes from.
void check_memory(Graph *g, int64_t limit, const char *limit_text);

// ---------------------------------------------------------------- lower.c
// How a node's buffer, shapes, layout and literals are spelled in generated
// code, for the ops' lowerings (ops.c) and the emitters; EG is the graph
// being emitted (emit_begin sets it).
extern Graph *EG;
char *ident(const char *s);                 // a C identifier from a path
char *off_name(const Node *n);              // the named constant of its offset
const Node *view_base(const Node *n);       // the node whose buffer a view uses
char *buf(const Node *n);                   // "(A + A12_d1)": its local buffer
char *flt(double v);                        // a float literal that reads back exactly
char *axes_c(unsigned axes);                // "AX_data | AX_model": a group of mesh axes
// Extents as C: a constant, or k times the step's rows for a batch dim
// ("b": this rank's rows, "B": the global rows, "(B / 4)": split otherwise),
// so that the batch is known only at run time (the compiled batch is the
// most it may be: the memory plan's).
typedef struct {
  int64_t k;
  const char *v;          // NULL: the constant k
} Sym;
Sym sym_dim(const Node *n, int d, bool local);
Sym sym_prod(const Node *n, int from, int to, bool local);
Sym sym_mul(Sym a, Sym b);
char *sym_c(Sym s);                         // "b * 50", "b", "400"
char *sym_dims(const Node *n);              // local dims: "{b, 10}"
char *sym_layout(const Node *n);            // "{2, {B, 200}, {0, 1}}"
Shape lshape(const Node *n);                // local shape
int64_t lelems(const Node *n);              // local elements
char *layout_init(const Node *n);           // "{rank, {global shape}, {axis per dim}}"
char *describe(const Node *n);              // "[16, 200] ('data', 'model') local [8, 50]"
// issue 25: the optimizer's hyper-parameter `name` (Keras's: "beta_1") as the
// named constant the program defines (ADAM_BETA_1: opt_consts).
char *opt_const(const char *name);
// issue 25: node n's layer's hyper-parameter `attr` (Keras's name: "epsilon")
// of value v, as the constant the program defines where the call reads it
// ("BL_LN1_EPSILON", b<l>_ln1's in a block's function), its comment the
// layer's class and the value, or `note`; the literal itself while blocks.c
// compares a block's copies (so layers with other values are no one block).
// Named between emit_hparams_begin and _end, which writes the #defines
// before the code that reads them.
char *hparam(const Node *n, const char *attr, double v, const char *note);
// issue 25: node n's per-layer constant `attr` (a dropout's stream, a
// sliding window), the literal lit(n), which differs between layers that
// are otherwise one block: in a block's function, a table of every layer's
// lit() indexed by l ("BL_ATTN_STREAM[l]", a static const `ctype` array
// named as hparam names, `note` its comment), or the literal when the
// layers agree; "{attr by layer}" while blocks.c compares the copies, so
// that they are one block.
char *per_layer(const Node *n, const char *attr, const char *ctype, const char *note,
                char *(*lit)(const Node *));
// The same for a descriptor, a static const `ctype` that init(n) initializes
// (the rotary embedding's frequencies), which the call reads by pointer: in
// a block's function whose layers' differ, each value once, named
// ("DECODER_BLOCK_L_ATTENTION_ROPE_2", its comment the layers using it), and
// a table of pointers to them indexed by l ("DECODER_BLOCK_L_ATTENTION_ROPE[l]");
// "{attr by layer}" while blocks.c compares the copies; NULL where the layers
// agree or n is no block's: the caller declares its own at the call.
char *per_layer_object(const Node *n, const char *attr, const char *ctype, const char *note,
                       char *(*init)(const Node *));
// The constants hparam and per_layer named since hparams_reset, for
// emit_hparams_end to write.
typedef struct {
  char *name, *value, *why;
  const char *ctype; // a table of a value by layer (per_layer): its elements' type
  int n;             // and length; 0: one object (per_layer_object's values)
} HParam;
void hparams_reset(void);
const HParam *hparams_named(int *n);
// issue 25: in a block's function, a name of node n (its layer, 0, or its
// own, 1) with the layer's number as <l>; else s.
const char *layer_named(const Node *n, const char *s, int which);
void emit_hparams_begin(void);
void emit_hparams_end(void);
// The hyper-parameters the optimizer's update calls read, their names and
// values (at most 8), for the program's #defines.
int opt_consts(const Optimizer *o, const char **names, float *values);
// issue 25: while a copy of a block is lowered, ECTX.b is the block: buf()
// and off_name() spell every value as that copy's layer sees it. Symbolic
// (blocks.c's comparison of the copies): by what the value is to the copy
// ("{B2.7@-1}": block 2's node 7 of the layer before); else (emit.c's
// function of the block, written from copy 0): as C of the layer l.
// Outside a block's function, a value of a block is spelled with its layer.
typedef struct {
  const struct RepBlock *b;
  int copy;
  bool symbolic;
} BlockCtx;
extern BlockCtx ECTX;
// A layer's rows in a stacked value split `parts` ways: "B", or "R2" (the
// emitters declare R<parts> = (B + parts - 1) / parts in every function).
char *rows_name(int parts);
// The value block input in is in a block's function, for the layer l: the
// other layer's node (spelled as the context's copy 0 sees it).
char *block_input_value(const BlockIn *in);
// The index in x of a block's step input x for the layer l: "3 + 2 * l".
char *block_x_index(const BlockX *x);
// The node block input s reads in copy c of block b.
const Node *block_in_node(const RepBlock *b, int s, int c);
const BlockAt *block_at(const Graph *g, const Node *n); // NULL: in no block
// The VarBlock holding v, its layer in *layer and place in *k; or NULL.
const VarBlock *var_block(const Graph *g, const Var *v, int *layer, int *k);
int block_layer(const RepBlock *b, int copy);
int block_copy(const RepBlock *b, int layer);  // -1: b has no copy of that layer
// The name s0 (one layer's) with the layer's number written as `mark`, from
// s0 and the same name of another layer, s1; NULL when they differ otherwise.
char *name_with_layer(const char *s0, const char *s1, const char *mark);

// ---------------------------------------------------------------- emit.c
// What both emitters share: the file's header and memory plan, the step
// bodies (every op's Lowering printed for the backend) and the program
// description. emit_begin sets the graph, file and backend the rest use.
typedef enum { BACKEND_C, BACKEND_CUDA } Backend;
extern FILE *EF;
extern Backend EB;
void emit_begin(Graph *g, FILE *f, Backend b);
void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern const char *const init_name[];       // KDRT_INIT_* by Var.init
// The header comment (mesh, coordinates) and the memory plan as named
// constants; `what` names the target in the first line.
void emit_preamble(const char *what);
// The steps' shared code, in parts (emit.c explains the cut): nodes
// [first, end) of the graph, run by the steps in `steps` (bit 1 << StepKind),
// one function each called `name` ("forward", "backward_2").
typedef struct {
  const char *name;
  int first, end, nops;
  unsigned steps;
  const RepBlock *block;  // issue 25: a block's function (its copy 0's nodes, for the layer l)
} StepPart;
StepPart *step_parts(int *count);
// A part's body (after the emitter's PART_LOCALS or STEP_ROWS: the step's
// rows, B and b, emit_preamble's macros), every op's comment and its
// calls for EB, under `if (step == TRAIN_STEP ...)` where steps differ.
void emit_part_body(const StepPart *part);
void emit_step_rows(void);
typedef void PartEmitter(const StepPart *part);
typedef void StepEmitter(const char *name, StepKind kind, const StepPart *parts, int nparts);
void emit_steps(PartEmitter *part, StepEmitter *step);
// issue 25: each repeated block's function, which the parts call in a loop
// (emit_steps; decode.c's steps), after emit_hparams_begin.
void emit_block_fns(PartEmitter *part);
// The vars[], io and mesh tables of a kdrt_program, then its fields as
// `<lhs>field = value<end>` lines.
void emit_program_tables(void);
void emit_program_fields(const char *lhs, const char *end);
// issue 25: whether a VarBlock's layers are one macro of the vars table,
// BLOCK<id>_VARS(N, l), entries vars[first + l * nv ...]
bool vars_in_macro(const VarBlock *vb);
// init()'s line for v's optimizer slots when they start other than 0, or "".
char *slot_init(const Var *v, const char *layout);
const char *init_fill(const Var *v); // issue 23: "kdrt_init_fill(c, " or its 16-bit form
char *accum_init(const Var *v);
const char *round_c(int kind); // issue 23 (ops.c): a 16-bit type's KDRT_ROUND_* name

// ---------------------------------------------------------------- emit_c.c
void emit_c(Graph *g, FILE *out);
// A part's function for the C runtime (a block's takes the layer l too),
// the decode and prefill steps' as the program's (decode.c).
void emit_c_part(const StepPart *p);

// ---------------------------------------------------------------- emit_cuda.c
// The program as CUDA C++ (program.cu) for runtime/cuda: the same plan and
// op order as emit_c, every op a kdrt_cuda_* call. arch ("sm_90") goes in
// the header comment; precision is "fp32", "tf32" or "bf16" (matmuls).
void emit_cuda(Graph *g, FILE *out, const char *arch, const char *precision);

#endif
