// kdcc: an ahead-of-time SPMD compiler for Keras training steps.
//
// Pipeline (one file per pass, in this order):
//   json.c     JSON text -> jansson tree, with a line:column for every value
//   load.c     Keras 3 model JSON -> Model (layers, edges, compile config)
//   dist.c     distribution spec -> Mesh + LayoutMap (PCRE2 full match)
//   graph.c    layers -> forward graph + loss, shapes inferred (op table: ops.c)
//   autodiff.c reverse-mode gradients and optimizer updates
//   shard.c    sharding propagation to a fixed point, then collectives
//   fuse.c     adjacent elementwise ops into one loop
//   memplan.c  static memory plan: parameter blob + activation arena
//   report.c   --report, --report=json, --emit=graph
//   emit.c     what the emitters share
//   emit_c.c   SPMD C program for the CPU runtime (runtime/kdrt.h)
//   emit_cuda.c the same program for the CUDA runtime (runtime/cuda/kdrt_cuda.h)
//   pipeline.c the passes in order
//   main.c     command line, output, building the executable
#ifndef KDCC_H
#define KDCC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
void *xcalloc(size_t n, size_t size);
char *xstrdup(const char *s);
// p (n elements used of *cap, each size bytes) with room for one more.
void *xgrow(void *p, int n, int *cap, size_t size);
char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern bool opt_quiet_warnings;

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

// ---------------------------------------------------------------- load.c
// The model as the user wrote it: layers with their resolved inbound edges.

typedef enum {
  LOSS_MSE, LOSS_MAE, LOSS_CCE, LOSS_SCCE, LOSS_BCE, // same order as KDRT_LOSS_*
} LossKind;

typedef enum { OPT_SGD, OPT_ADAM, OPT_ADAMW, OPT_RMSPROP } OptKind;

typedef struct {
  OptKind kind;
  const char *name;       // Keras's lower-case name: "adam", "sgd", ...
  float lr, beta_1, beta_2, epsilon, weight_decay, momentum, rho;
  bool nesterov;
  Loc loc;
} Optimizer;

typedef struct Layer Layer;

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
  int nin;
  int index;              // position in Model.layers
  // InputLayer only: per-sample shape (batch dim dropped), from batch_shape /
  // batch_input_shape / shape.
  int in_rank;
  int64_t in_shape[MAX_RANK];
  void *node;             // graph.c: the Node holding this layer's output
};

typedef struct {
  const char *file;
  const char *name;       // model name ("sequential", "functional", ...)
  bool sequential;
  Layer **layers;         // in file order; Sequential gets its chain of edges filled in
  int nlayers;
  Layer **inputs;         // input layers
  int ninputs;
  TensorRef *outputs;
  int noutputs;
  // compile_config (defaults when absent: loss mse, adam)
  LossKind loss;
  bool from_logits;
  Loc loss_loc;
  Optimizer opt;
  bool metric_accuracy;
  Loc metric_loc;
  json_t *root;           // the whole document
  json_t *dist_json;      // an embedded "distribution" object, or NULL
} Model;

Model *load_model(const char *path);
// Same, from a parsed document; `file` for messages.
Model *load_model_json(const char *file, json_t *root);
Layer *find_layer(Model *m, const char *name);

// Typed config getters: error_at the value (naming the layer) when it has
// the wrong type. `def` is returned when the key is absent or null.
int64_t cfg_int(const Layer *l, const char *key, int64_t def);
double cfg_num(const Layer *l, const char *key, double def);
bool cfg_bool(const Layer *l, const char *key, bool def);
const char *cfg_str(const Layer *l, const char *key, const char *def);
// A list of ints (e.g. kernel_size, strides: an int n means [n, n]); returns count.
int cfg_ints(const Layer *l, const char *key, int64_t *out, int max);

// ---------------------------------------------------------------- dist.c
// Mesh, layouts and the LayoutMap.

typedef struct {
  int ndim;
  int shape[MAX_AXES];
  const char *names[MAX_AXES];
  int size;               // product of shape
  Loc loc;
} Mesh;

// A placement: per tensor dim the mesh axis it is split over (-1:
// replicated) and the axes over which the local values are pending partial
// sums. Invariant: every mesh axis appears at most once in axis[] and partial.
typedef struct {
  int8_t axis[MAX_RANK];
  uint8_t partial;        // bit mask of mesh axes
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

// ---------------------------------------------------------------- ops.c
// The op table: the single source of truth for every op's name, arity,
// sharding rule, gradient rule and emitter. See ops.c for the semantics
// of each op.

typedef enum {
#define X(name, ...) OP_##name,
#include "ops.def"
#undef X
  OP_COUNT
} OpKind;

typedef enum { PH_FORWARD, PH_LOSS, PH_BACKWARD, PH_UPDATE } Phase;

typedef enum { ACT_LINEAR, ACT_RELU, ACT_SIGMOID, ACT_TANH, ACT_GELU, ACT_SILU, ACT_SOFTMAX }
  Act;

typedef struct Var Var;
typedef struct Node Node;

typedef struct {
  int rank;
  int64_t d[MAX_RANK];
} Shape;

struct Node {
  int id;
  OpKind op;
  Node *in[MAX_IN];
  int nin;
  Shape shape;            // global shape
  Phase phase;
  const char *name;       // "d1/kernel", "d1/output", "grad(d1/kernel)", ...
  const char *layer;      // the Keras layer it comes from (NULL for internals)
  Loc loc;                // where that layer is written
  // op parameters
  int act;                // OP_ACT, OP_ACT_GRAD: Act
  int axis;               // concat/slice axis; collectives: the dim
  int axis2;              // all-to-all: target dim
  int64_t start;          // slice start
  bool ta, tb;            // matmul transposes
  int kh, kw, sh, sw, pad_t, pad_l; // conv / pool window, strides, padding
  float rate;             // dropout
  float scale, shift;     // OP_SCALE: x * scale + shift
  int loss;               // LossKind
  bool from_logits;
  unsigned axes;          // collectives: group of mesh axes (mask)
  uint64_t stream;        // dropout RNG stream
  const char *reason;     // collectives: why it is there (the op it serves)
  Var *var;               // OP_PARAM, OP_UPDATE
  // passes' results
  Place place;            // placement this node produces (shard.c)
  Place want;             // a fixed placement (seed or constraint), if has_want
  bool has_want;
  Node *grad;             // autodiff.c scratch: accumulated gradient
  int64_t offset;         // memplan.c: float offset in its region
  int region;             // memplan.c: REGION_*
  int last_use;           // memplan.c
  int nuses;
  bool dead;              // removed by a pass
  bool fused;             // OP_UPDATE done by the op that makes its gradient (fuse.c)
  Node *sgd_into;         // OP_MATMUL: plain SGD, w -= lr * result, into this param
};

typedef struct {
  const char *name;       // "matmul"
  int nin;                // operand count, -1: variadic
  uint8_t linear;         // operands the op is linear in: partial sums may pass (shard.c)
  bool joint;             // linear jointly (add): all partial operands must agree;
                          // else separately (matmul): at most one may stay partial
  Phase phase;            // unused for ops built in several phases
} OpInfo;
extern const OpInfo op_info[OP_COUNT];

// The sharding rule of an op, einsum-style: every dimension of every
// operand and of the result is mapped to a named factor; a factor passes
// through to the result, is contracted (summed over), or needs its whole
// extent on every device.
#define MAX_FACTORS 16
typedef enum { F_PASS, F_CONTRACT, F_FULL } FactorKind;
typedef struct {
  int nf;
  FactorKind kind[MAX_FACTORS];
  int64_t size[MAX_FACTORS];
  int8_t in[MAX_IN][MAX_RANK]; // factor of each operand dim, -1: none
  int8_t out[MAX_RANK];        // factor of each result dim
} Rule;
void op_rule(const Node *n, Rule *r);
const char *act_name(int act);
bool is_collective(OpKind op);

// ---------------------------------------------------------------- graph.c

struct Var {
  const char *path;       // "d1/kernel"
  const char *vname;      // "kernel"
  const char *layer;
  const char *layer_class;
  int index;              // among its layer's variables (kernel 0, bias 1)
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
  int64_t offset;         // memplan.c: in the parameter blob (slots follow)
  int64_t goffset;        // memplan.c: in the gradient blob
};

typedef struct {
  Model *model;
  Dist *dist;
  Node **nodes;           // in topological order
  int nnodes, cap;
  Var **vars;
  int nvars, cap_vars;
  Node *x, *y;            // input batch, labels
  Node *pred;             // model output
  Node *loss, *metric;    // scalars (after their reductions)
  Phase phase;            // the phase new nodes belong to
  int batch;              // global batch size
  int64_t arena_floats, param_floats, grad_floats;
  int64_t scratch_floats; // conv im2col scratch
} Graph;

Node *new_node(Graph *g, OpKind op, int nin, Node **in);
Node *new_node1(Graph *g, OpKind op, Node *a, Shape shape);
Node *new_node2(Graph *g, OpKind op, Node *a, Node *b, Shape shape);
uint64_t hash_str(const char *s);
bool shape_eq(const Shape *a, const Shape *b);
char *shape_str(const Shape *s);
Graph *build_graph(Model *m, Dist *d, int batch);

// ---------------------------------------------------------------- autodiff.c
void build_backward(Graph *g);

// ---------------------------------------------------------------- shard.c
void propagate_shardings(Graph *g);
int axis_size(const Graph *g, int axis);
// "data,model": the names of the mesh axes in a mask.
char *axes_str(const Graph *g, unsigned axes);
// Bytes of a collective's local input buffer, and bytes each device sends
// for it (ring algorithms, SHARDING.md's table).
int64_t coll_bytes(const Graph *g, const Node *n);
int64_t coll_sent(const Graph *g, const Node *n);
bool place_eq(const Place *a, const Place *b, int rank);
// Local shape of a node under its placement.
Shape local_shape(const Graph *g, const Node *n);
int64_t shape_elems(const Shape *s);

// ---------------------------------------------------------------- fuse.c
void fuse_elementwise(Graph *g);

// ---------------------------------------------------------------- memplan.c
enum { REGION_NONE, REGION_PARAM, REGION_GRAD, REGION_ARENA, REGION_INPUT };
void plan_memory(Graph *g);

// ---------------------------------------------------------------- pipeline.c
// Every pass from the model file to a planned graph (no output).
Graph *compile_model(const char *model_path, const char *dist_path, const char *mesh, int batch);

// ---------------------------------------------------------------- report.c
void print_report(Graph *g, FILE *out, bool json);
void print_graph(Graph *g, FILE *out);

// ---------------------------------------------------------------- emit.c
// What both emitters share. emit_begin sets the graph and file the rest use.
extern Graph *EG;
extern FILE *EF;
void emit_begin(Graph *g, FILE *f);
void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *ident(const char *s);                 // a C identifier from a path
char *off_name(const Node *n);              // the named constant of its offset
const Node *view_base(const Node *n);       // the node whose buffer a view uses
char *buf(const Node *n);                   // "(A + A12_d1)": its local buffer
char *flt(double v);                        // a float literal that reads back exactly
Shape lshape(const Node *n);                // local shape
int64_t lelems(const Node *n);              // local elements
char *dims_init(const Shape *s);            // "{8, 13, 13, 2}"
char *layout_init(const Node *n);           // "{rank, {global shape}, {axis per dim}}"
char *describe(const Node *n);              // "[16, 200] ('data', 'model') local [8, 50]"
int64_t prod(const Shape *s, int from, int to);
extern const char *const init_name[];       // KDRT_INIT_* by Var.init
extern const char *const act_c[];           // KDRT_ACT_* by Act
// The comment above each op: id, op, layer, name, shapes and layout, and
// for a collective why it is there.
void emit_op_comment(const Node *n);
// The vars[] and mesh tables of a kdrt_program, then its fields (but
// pred_layout) as `<lhs>field = value<end>` lines.
void emit_program_tables(void);
void emit_program_fields(const char *lhs, const char *end);
// Conv/pool argument list: local x and y dims, window, strides, padding.
void emit_conv_args(const Node *n, const Node *x, const Node *y);

// ---------------------------------------------------------------- emit_c.c
void emit_c(Graph *g, FILE *out);

// ---------------------------------------------------------------- emit_cuda.c
// The program as CUDA C++ (program.cu) for runtime/cuda: the same plan and
// op order as emit_c, every op a kdrt_cuda_* call. arch ("sm_90") goes in
// the header comment; precision is "fp32", "tf32" or "bf16" (matmuls).
void emit_cuda(Graph *g, FILE *out, const char *arch, const char *precision);

#endif
