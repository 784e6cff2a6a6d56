// kdrt: the runtime every kdcc-generated program links against.
//
// A generated program holds only what is specific to one model on one mesh:
// its buffers (one parameter blob, one activation arena, offsets as named
// constants) and three functions, init / train_step / eval_step, that call
// the kernels and collectives below. Everything else, the rank's place in
// the mesh, the communicators, randomness, data, the fit loop with Keras's
// progress output and the history file, lives here.
//
// Conventions
// - Every tensor is float32 (but a model's int32 token-id inputs), row-major,
//   C-contiguous in its *local* shape.
// - A kdrt_layout describes one tensor's global shape and, per dimension,
//   the mesh axis it is split over (-1: replicated). The local extent of
//   dim d is gshape[d] / mesh_shape[axis[d]]; this rank's block starts at
//   coord[axis[d]] * local extent. kdcc checks divisibility at compile time.
// - Ranks fill the mesh in row-major order, as Keras's DeviceMesh does:
//   rank = sum_i coord[i] * prod_{j>i} mesh_shape[j].
// - A "group" is a set of mesh axes given as a bit mask (bit i = axis i).
//   The ranks of one group share the coordinates of every other axis. Within
//   a group ranks are ordered row-major over the group's axes.
// - All calls work with one rank and no mpirun (MPI is still initialised,
//   as a singleton); a collective over a group of size 1 is a copy or a no-op.
#ifndef KDRT_H
#define KDRT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kdrt_ops.h" // kdrt_layout, KDRT_MAX_*; kdrt_defs.h: the shared enums
#include "kdrt_round.h" // issue 23: kdrt_var_get, kdrt_var_put

// ---------------------------------------------------------------- kdrt.c
// The program description a generated file hands to kdrt_main.

typedef struct kdrt_ctx kdrt_ctx;

// One input of the model, or one label (the target of an output that has
// a loss). A step receives x[i] / y[i] as this rank's rows, each sample
// prod(shape) elements of dtype, contiguous.
typedef struct {
  const char *name;                  // Keras's name: the InputLayer's, or the output layer's
  int dtype;                         // KDRT_F32, or KDRT_I32 (token ids)
  int rank;                          // per-sample rank (batch dim excluded; 0: a scalar a sample)
  int64_t shape[KDRT_MAX_RANK];      // per-sample shape
  int label_kind;                    // labels: KDRT_LABEL_*, what a label file becomes; inputs: 0
  int64_t num_classes;               // labels: classes (ONEHOT, CLASSID: ids in [0, num_classes));
                                     // I32 inputs: ids are in [0, num_classes) (synthetic data
                                     // draws them there; files are checked)
} kdrt_io;

// One output of the model, for `./train predict`.
typedef struct {
  const char *name;                  // the output layer's name
  size_t offset;                     // arena offset of its local block after eval_step;
                                     // SIZE_MAX: not one arena buffer (predict refuses)
  kdrt_layout layout;                // [batch, ...] global shape and split
} kdrt_output;

// A step: this rank's rows of one global batch, x[i] for input i, y[j] for
// label j; writes logs[k] for every log_names[k], each the global mean over
// the batch, already reduced (identical on every rank).
typedef void kdrt_step_fn(kdrt_ctx *c, const void *const *x, const void *const *y, float *logs);

// issue 24: a LoRA kernel, used as vars[kernel] + scale * vars[a] . vars[b];
// index: its group in keras-hub's .lora.h5 (lora/<index>/vars).
typedef struct kdrt_lora {
  int kernel, a, b;
  float scale;
  int index;
} kdrt_lora;

typedef struct {
  const char *model_name;            // for messages
  int mesh_ndim;
  const int *mesh_shape;             // [mesh_ndim]
  const char *const *mesh_axes;      // [mesh_ndim] axis names
  int batch_axis;                    // mesh axis the batch dim is split over, -1: none
  int batch;                         // global batch size the program was compiled for
  int ninputs;
  const kdrt_io *inputs;             // [ninputs], the model's inputs in order
  int nlabels;
  const kdrt_io *labels;             // [nlabels], one per output with a loss, in output order
  int nlogs;
  const char *const *log_names;      // [nlogs]: "loss" first, then Keras's names for the rest
                                     // ("accuracy"; with several outputs "out_a_loss",
                                     // "out_a_accuracy", ...), in the order steps write them
  // kdcc --sample-weight (the last label is KDRT_LABEL_WEIGHT): log_weighted[k]
  // is 1 for a weighted metric, whose epoch mean is over the sample weights
  // (Keras's weighted_metrics); NULL: none
  const unsigned char *log_weighted;
  int noutputs;
  const kdrt_output *outputs;        // [noutputs]
  // issue 23: output_round[o], the KDRT_ROUND_* type predict rounds output o
  // to (a bfloat16 softmax the loss reads unrounded: Keras returns it in
  // bfloat16), 0 for none; NULL: none
  const unsigned char *output_round;
  float learning_rate;               // compiled default; --lr overrides
  const kdrt_schedule *schedule;     // a learning-rate schedule, or NULL: learning_rate
  const char *optimizer;             // Keras's optimizer class ("Adam"): what the slots are
  size_t param_floats;               // local floats in the parameter blob (params + optimizer slots)
  size_t grad_floats;                // local floats for gradients
  size_t arena_floats;               // local floats in the activation arena (for `batch` rows)
  // The arena plan (kdcc's memplan.c), replayed by kdrt_arena_plan for a
  // run with more rows than `batch`: narena_plan steps, the last a
  // SCRATCH one; arena_off, the program's offset of each arena buffer
  // (the generated code reads them there), then the conv scratch's.
  // narena_plan 0: no plan (a batch above `batch` is refused).
  const struct kdrt_arena_op *arena_plan;
  int narena_plan;
  int64_t *arena_off;
  // Set up parameters and optimizer slots from ctx->seed (kdrt_init_* below).
  void (*init)(kdrt_ctx *c);
  kdrt_step_fn *train_step;          // forward, loss, backward, update
  kdrt_step_fn *eval_step;           // forward and loss, no dropout, no update
  // Forward, loss and backward (dropout as in training): every variable's
  // gradient, reduced to its layout, in c->grads; no update.
  kdrt_step_fn *grad_step;
  int nvars;
  const struct kdrt_var *vars;       // [nvars]
  const char *weights_file;          // initial weights (.keras or .weights.h5) as compiled, or
                                     // NULL; found by kdrt_program_archive
  // issue 24: LoRA's kernels, each used as vars[kernel] + scale * vars[a] . vars[b]
  // (a [kernel's dims but the last, rank], b [rank, its last]); Keras's weights
  // file holds the kernel merged and no a or b (kdrt_weights_*); keras-hub's
  // .lora.h5 holds a and b under lora/<index>/vars (kdrt_lora_*).
  int nlora;
  const kdrt_lora *lora;             // [nlora]
  // issue 23: Keras's LossScaleOptimizer around the optimizer: its initial_scale
  // (0: no loss scaling) and dynamic_growth_steps (kdrt_loss_scale_decide)
  double loss_scale;
  int64_t loss_scale_growth_steps;
} kdrt_program;

// issue 24: a language model's decode step with a key/value cache (kdcc's
// decode.c: its own file of the program, which sets kdrt_decode_program when
// the program starts; NULL: the model has none). step(c, x) runs one
// position of every row on the program's parameter blob and c->arena (an
// arena of arena_floats): x holds the model's inputs for that position
// (token_ids [1], keras-hub's padding_mask over the cache's T positions),
// then each row's position (int32 [1]), then the ncaches caches, each this
// rank's cache_floats[k] floats, which the step fills at the positions.
// The output [batch, 1, vocabulary] is in the arena at output.offset.
typedef struct kdrt_decode {
  void (*step)(kdrt_ctx *c, const void *const *x);
  size_t arena_floats, param_floats;
  int batch;
  int ncaches;
  const int64_t *cache_floats;       // [ncaches]
  const struct kdrt_arena_op *arena_plan; // unused: generate runs the compiled batch
  kdrt_output output;
} kdrt_decode;
extern const kdrt_decode *kdrt_decode_program;
// The prefill step (kdcc's prefill.c, or NULL): the whole window of T
// positions, x as the model's inputs, the positions (unused), the caches,
// each filled at every position; the output [batch, T, vocabulary].
extern const kdrt_decode *kdrt_prefill_program;

// One step of an arena plan: buffer `slot` taken (ALLOC) or given back
// (FREE), or a convolution's im2col scratch (SCRATCH, slot: the scratch's
// own entry of arena_off); k * ceil(B / parts) floats for a global batch
// of B (parts 0: k floats).
enum { KDRT_ARENA_ALLOC, KDRT_ARENA_FREE, KDRT_ARENA_SCRATCH };
typedef struct kdrt_arena_op {
  int op, slot;
  int64_t k;
  int parts;
} kdrt_arena_op;

// One trainable variable: what it is and where its local shard, optimizer
// slots and gradient live.
typedef struct kdrt_var {
  const char *path;                  // "d1/kernel"
  const char *layer;                 // Keras layer name, "d1"
  const char *layer_class;           // "Dense", "Conv2D"
  int index;                         // among its layer's variables (kernel 0, bias 1),
                                     // as model.weights.h5's layers/<group>/vars/<index>
                                     // (<group>: kdrt_weights_group, not the layer name)
  kdrt_layout layout;                // global shape and how it is split
  size_t offset;                     // in params; slot k at offset + (k+1)*stride
  size_t stride;                     // floats between the shard and each slot
  int nslots;                        // optimizer slots (Keras order: e.g. momentum, velocity)
  size_t goffset;                    // in grads (SIZE_MAX: not trained)
  size_t n;                          // local floats
  const char *sub;                   // the sublayer holding it in the file, or NULL:
                                     // layers/<group>/<sub>/vars/<index>, index counted
                                     // within the sublayer ("query_dense" of attention)
  const char *scope;                 // the nested model(s) holding its layer in the file,
                                     // or NULL: layers/<scope>/layers/<group>/vars
  const char *group;                 // its layer's group when kdcc names it (a keras-hub
                                     // model's "transformer_decoder_1/_self_attention_layer"),
                                     // else NULL: Keras's count over the classes
  int dtype;                         // its dataset's type in the weights file: KDRT_F32 (0),
                                     // or KDRT_I32, an integer Keras keeps (an adapted
                                     // Normalization's count), a float in params here,
                                     // exact to 2^24 (kdrt_weights_*)
                                     // | KDRT_IN16: kept in 16 bits (kdrt_var_half)
} kdrt_var;

// issue 23: the type (KDRT_ROUND_*) a variable kept in 16 bits (kdcc's
// store16.c; kdrt_var.dtype's KDRT_IN16) is stored as: params at its offset,
// and at each slot's, hold its n values' 16 bits, (n + 1) / 2 floats
// (kdrt_var_get, kdrt_var_put); 0: float32.
static inline int kdrt_var_half(const kdrt_var *v) {
  return !(v->dtype & KDRT_IN16)                 ? 0
         : (v->dtype & ~KDRT_IN16) == KDRT_F16 ? KDRT_ROUND_F16
                                                 : KDRT_ROUND_BF16;
}

// Variable v's n local values (or a slot's) at `at` in params as float32
// into out (from its 16 bits when kept so), for the host's loads, saves,
// checks and checkpoints (which keep float32 values, the same either way);
// and back from in (rounded to its type when kept in 16 bits: a file's
// values); the floats its region takes. Here, not in kdrt.c, so that the
// files below kdrt.c (callbacks, weights, checkpoints) call nothing above
// them (tests/sh/layering.sh).
static inline void kdrt_var_get(const kdrt_var *v, const float *at, float *out) {
  int k = kdrt_var_half(v);
  for (size_t i = 0; i < v->n; i++)
    out[i] = k ? kdrt_value16(k, ((const uint16_t *)at)[i]) : at[i];
}

static inline void kdrt_var_put(const kdrt_var *v, float *at, const float *in) {
  int k = kdrt_var_half(v);
  for (size_t i = 0; i < v->n; i++) {
    if (!k) {
      at[i] = in[i];
      continue;
    }
    ((uint16_t *)at)[i] = kdrt_bits16(k, kdrt_round_to(k, in[i]));
  }
}

static inline size_t kdrt_var_floats(const kdrt_var *v) {
  return kdrt_var_half(v) ? (v->n + 1) / 2 : v->n;
}

struct kdrt_ctx {
  const kdrt_program *prog;
  int rank, world;                   // MPI rank / size
  int coord[KDRT_MAX_AXES];          // this rank's mesh coordinates
  uint64_t seed;                     // --seed (default 1337)
  int64_t step;                      // global optimizer step, from 0; dropout keys on it
  // issue 23: the optimizer's iterations (Keras's optimizer.iterations: the
  // updates' step t - 1 and a schedule's step): step, less the steps a loss
  // scale skipped. With prog->loss_scale: the loss scale in use (Keras's
  // dynamic_scale; 1 without), the finite steps since it last moved (its
  // step_counter), and whether this step's updates run (kdrt_loss_scale_decide;
  // 1 without).
  int64_t iterations;
  float loss_scale;
  int64_t loss_scale_count;
  int apply_update;
  float lr;                          // learning rate in use (a schedule's: set each step)
  int64_t nadam_step;                // Nadam's running product at this step (optim.c's
  float nadam_u;                     // kdrt_nadam_product), 0: not yet computed
  int64_t rows;                      // the global rows of the step in progress (at most the
                                     // batch the arena is planned for); 0: the compiled batch
  // Rows that do not divide over the batch axis (a last partial batch, or a
  // --batch-size that does not) are split as numpy's array_split splits
  // them: the first rows % parts coordinates get one row more. Then ragged
  // is set and this rank's rows are [row0, row0 + local_rows) of the step
  // (local_rows may be 0); else every rank has rows / parts (kdrt_set_rows).
  int ragged;
  int64_t local_rows, row0;
  int probe;                         // set: a step only checks that c->rows can run on this
                                     // program (kdrt_rows_refused) and returns; x, y are NULL
  // A device runtime may return from train_step before the step has run
  // (runtime/cuda: the host loads the next batch meanwhile): it then sets
  // logs_pending, and the fit loop takes that step's logs with collect(c,
  // logs) after the next train_step (or at the epoch's end), oldest first.
  int logs_pending;
  void (*collect)(kdrt_ctx *c, float *logs);
  // A device runtime that holds the weights answers kdrt_weights_finite's
  // question there (this rank's first variable not finite, or nvars);
  // NULL: c->params is read.
  int (*nonfinite)(kdrt_ctx *c);
  int params_changed;                // set when the host changed c->params after training
                                     // began (restore_best_weights): a device copy
                                     // (runtime/cuda) must take them
  float *params;                     // param_floats, 64-byte aligned
  float *grads;                      // grad_floats
  float *arena;                      // arena_floats
  float *widen16;                    // issue 23: kdrt_widen16's buffer (widen16_floats), or NULL
  size_t widen16_floats;
  size_t arena_floats;               // the arena's floats: prog->arena_floats, or the plan
                                     // replayed for a larger run batch (0: prog->arena_floats)
  int64_t max_rows;                  // the most global rows a step of this run has
                                     // (0: prog->batch); a device copy sizes its buffers by it
  void *comm[1 << KDRT_MAX_AXES];    // MPI_Comm* per group mask, created lazily
};

// Parse argv, initialise MPI, check world size == mesh size (else print the
// mesh and the `mpirun -np N` line and exit 1), allocate, init, load or make
// the data, run fit then evaluate with Keras-style output on rank 0, write
// --history. Returns the process exit status.
int kdrt_main(int argc, char **argv, const kdrt_program *prog);

// `./train gradcheck [--seed S] [--points K]`: on one device, compare every
// variable's gradient from grad_step with central finite differences of
// the loss at K elements per variable; print a line per variable, return 1
// when any differs (gradcheck.c).
int kdrt_gradcheck(int argc, char **argv, const kdrt_program *prog);

// The rows [*first, *first + *n) of a step of `rows` global rows that batch
// coordinate i of `parts` gets: numpy's array_split (the first rows % parts
// coordinates one row more than the others) (comm.c, which splits them too).
void kdrt_rows_split(int64_t rows, int parts, int i, int64_t *first, int64_t *n);
// A block of shape lshape[rank] as [outer, lshape[dim], inner]: the
// products of the dims before dim and after it (comm.c; the CUDA
// runtime's collectives too).
void kdrt_split_shape(int rank, const int64_t *lshape, int dim, int64_t *outer,
                      int64_t *inner);
// Set c->rows to `rows` (1 <= rows <= the arena's batch) and this rank's
// share of them: c->ragged, c->local_rows, c->row0 (see kdrt_ctx).
void kdrt_set_rows(kdrt_ctx *c, int64_t rows);
// A generated step's refusal of c->rows: the program splits a batch
// dimension over mesh axis `axis` of `size` devices, which `rows` do not
// divide by. With c->probe it is noted (kdrt_main asks before training,
// and says so); else it is fatal.
void kdrt_rows_refused(kdrt_ctx *c, int64_t rows, int size, const char *axis);

// (arena.c) Replay p's arena plan for a global batch of B rows: first fit, as kdcc
// planned it for p->batch, each buffer's new offset into p->arena_off;
// returns the arena's floats (SIZE_MAX: no memory to replay it). Without a
// plan: p->arena_floats, nothing set.
size_t kdrt_arena_plan(const kdrt_program *p, int64_t B);
// The parameter blob, the gradients and the activation arena: n floats,
// zeroed, 64-byte aligned, or NULL when out of memory; given back with
// kdrt_buffer_free (NULL: nothing). Nothing is written when they are made:
// a page costs only once a step touches it (arena.c).
float *kdrt_buffer_alloc(size_t n);
void kdrt_buffer_free(float *p);

// ---------------------------------------------------------------- fatal.c
// The program's name, its messages and its ways out on an error.

extern const char *kdrt_prog_name;   // basename of argv[0] ("train"), prefixes messages
extern const char *kdrt_prog_invoke; // argv[0] as typed ("./train"), for the mpirun hint
// Take both from argv[0] (kdrt_main's first act).
void kdrt_set_program(int argc, char **argv);

// Format a message into err[errlen]; returns -1 (the error convention of the
// runtime's file readers and writers).
int kdrt_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// printf on rank 0 only.
void kdrt_printf0(const kdrt_ctx *c, const char *fmt, ...);
// "who: " and the message on stderr, on a line of its own after whatever
// stdout holds.
void kdrt_vsay(const char *who, const char *fmt, va_list ap);
// Fatal error: message on stderr (prefixed by the rank), MPI_Abort, exit 1.
void kdrt_fatal(const kdrt_ctx *c, const char *fmt, ...);
// An error every rank sees alike: rank 0 says it ("<program>: ..."), every
// rank frees its communicators, finalizes MPI and exits with status (comm.c).
void kdrt_fail_all(const kdrt_ctx *c, int status, const char *fmt, ...)
    __attribute__((noreturn));

// ---------------------------------------------------------------- weights.c
// Keras weights files, and the start and end of the forward-only
// commands; `./train predict` is predict.c's.
//
// A model.weights.h5 (alone, or the member of a .keras zip) holds layer L's
// variables as layers/<group>/vars/<i>, i = the variable's index in L, where
// <group> is L's class in snake case made unique by a counter over the
// model's layers in order ("dense", "dense_1", "conv2d", ...), never L's
// name; layers/<group>/vars has an attribute name = L's name. Keras's
// saving_lib walks model.layers (a Sequential's without its InputLayer);
// kdrt counts the layers that own variables, in kdrt_program.vars order,
// which is the same for every layer class kdcc supports (no class there
// has instances both with and without variables).

// The h5 group of layer `layer` (a kdrt_var.layer) of p under layers/:
// "dense_1", or in a nested model "sequential/layers/dense_1". Returns
// buf, or NULL if no variable of p belongs to that layer.
const char *kdrt_weights_group(const kdrt_program *p, const char *layer, char *buf, size_t len);
// Keras's naming.to_snake_case: "MaxPooling2D" -> "max_pooling2d".
void kdrt_snake_case(const char *cls, char *buf, size_t len);

// Read this rank's block (mesh coordinates coord) of every variable of p
// from path (.keras or .weights.h5, told apart by their first bytes) into
// params (offsets as kdrt_var.offset); no MPI. All or nothing: any mismatch
// (missing group or variable, wrong shape, not float) returns -1 with a
// message naming the file, the variable and what did not fit, and leaves
// params as it was.
int kdrt_weights_read(const kdrt_program *p, const int *coord, const char *path, float *params,
                      char *err, size_t errlen);
// Write the variables' global tensors (global[v]: kdrt_var v, row-major)
// to path in Keras's layout, atomically (temp file, fsync, rename); no MPI.
// path ending in .keras: a zip with config.json (copied from
// p->weights_file's archive, which must exist), metadata.json and
// model.weights.h5; else a .weights.h5. step, lr: the optimizer's
// iterations and learning_rate, saved as Keras saves an unbuilt optimizer.
int kdrt_weights_write(const kdrt_program *p, const char *path, const float *const *global,
                       int64_t step, float lr, char *err, size_t errlen);
// Collective forms: every rank reads its own block (kdrt_weights_read), or
// rank 0 gathers each variable and writes. Both return the same status on
// every rank; err is filled on rank 0 at least.
// kdrt_weights_write refuses variables that are not finite (NaN or inf: a
// diverged run), naming the first.
int kdrt_weights_load(kdrt_ctx *c, const char *path, char *err, size_t errlen);
// issue 23: every KDRT_BF16 (KDRT_F16) variable's local values rounded to its type
void kdrt_round_vars(kdrt_ctx *c);
int kdrt_weights_save(kdrt_ctx *c, const char *path, char *err, size_t errlen);
// Collective: -1 when every variable (not the optimizer slots) of every
// rank is finite, else the index in p->vars of the first that is not.
int kdrt_weights_finite(kdrt_ctx *c);
// This rank's first variable with a value that is not finite, or nvars,
// from c->params (kdrt_weights_finite's default for c->nonfinite).
int kdrt_weights_nonfinite_host(kdrt_ctx *c);
// The archive a program compiled from a .keras starts from (its
// weights_file): kdcc's copy beside the program, <program>.kdcc.d/
// model.keras (the program found by /proc/self/exe), else the archive at
// the path it was compiled from; NULL when p has none or neither exists.
// So a program moved with its .kdcc.d directory needs no other file.
const char *kdrt_program_archive(const kdrt_program *p);
// issue 24: keras-hub's .lora.h5 (save_lora_weights): a LoRA program's A and
// B read into params (this rank's blocks), or gathered and written by rank 0
// (a temporary, then a rename); 0, or -1 with err. The _load and _save forms
// are collective.
int kdrt_lora_read(const kdrt_program *p, const int *coord, const char *path, float *params,
                   char *err, size_t errlen);
int kdrt_lora_load(kdrt_ctx *c, const char *path, char *err, size_t errlen);
int kdrt_lora_save(kdrt_ctx *c, const char *path, char *err, size_t errlen);
// Where that copy is for this program (buf), or NULL: model.keras, or a
// keras-hub preset's model.weights.h5.
const char *kdrt_program_copy(const kdrt_program *p, char *buf, size_t len);
// The message when p has an archive but neither copy exists (buf).
char *kdrt_archive_gone(const kdrt_program *p, char *buf, size_t len);
// Whether kdrt_weights_save can write path for p (a name ending in
// .weights.h5 or .keras; a .keras needs p->weights_file): 0, or -1 with err.
int kdrt_weights_check_path(const kdrt_program *p, const char *path, char *err, size_t errlen);

// Copy the local block of a tensor of layout l, held by the rank at mesh
// coordinates coord, into the global tensor g (row-major, gshape).
void kdrt_block_place(const kdrt_layout *l, const int *mesh_shape, const int *coord,
                      const float *block, float *g);
// Collective over the world: rank 0 gets in out the global tensor of layout
// l from every rank's local block `in` (out is ignored elsewhere).
void kdrt_gather_global(kdrt_ctx *c, const kdrt_layout *l, const float *in, float *out);
// "(3, 3, 1, 8)", "(10,)", "()": a shape as Python prints it.
void kdrt_fmt_shape(char *buf, size_t len, int n, const int64_t *v);
// "('data', 'model')", "('batch',)": names as Python prints a tuple of strings.
void kdrt_fmt_names(char *buf, size_t len, int n, const char *const *names);
// fsync tmp's contents, then rename it to dst, so that no reader of dst
// ever sees half a file: 0, or -1 (errno says why).
int kdrt_commit_file(const char *tmp, const char *dst);

// `./train predict --x F.npy --out P.npy [--weights FILE | --init random]`
// (argv[1] is "predict"): the forward pass of eval_step over the inputs
// (--x FILE once per model input in order, or --x NAME=FILE) in compiled
// batches (the last one padded, the padding dropped); rank 0 writes each
// output [N, outputs...] as float32 .npy, atomically, to
// kdrt_predict_path's file. An output at offset SIZE_MAX is an error
// naming it. Exit status.
int kdrt_predict(int argc, char **argv, const kdrt_program *p);
// `./train generate ...` (argv[1] is "generate"): a language model's
// continuation of a prompt, token by token (generate.c).
int kdrt_generate(int argc, char **argv, const kdrt_program *p);

// The start of a forward-only command (predict, generate): MPI_Init, this
// rank's mesh coordinates, params/grads/arena, the initial values, then
// the weights (weights, else the archive compiled in, else none with
// init_random or none to find); who: the command, for messages. Nonzero:
// err says why (call kdrt_leave).
int kdrt_infer_open(kdrt_ctx *c, const char *who, const kdrt_program *p, int *argc,
                    char ***argv, const char *weights, int init_random, char *err, size_t errlen);
// The end of one: rank 0 prints "who: " and fmt's message when fmt is not
// NULL; the buffers freed, MPI finalized; returns status (comm.c).
int kdrt_leave(kdrt_ctx *c, const char *who, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
// Where predict writes output o of p for --out `out`: with one output,
// out itself; with several, DIR/<name>.npy when out ends in '/' or is a
// directory, else out less a final ".npy", then ".<name>.npy"
// (--out preds.npy: preds.a.npy, preds.b.npy).
void kdrt_predict_path(const kdrt_program *p, const char *out, int o, char *buf, size_t len);

// ---------------------------------------------------------------- comm.c
// Collectives (declared in kdrt_ops.def) run over the group of mesh
// axes `axes` (bit mask); dim is the tensor dimension concerned and lshape
// the local shape of `in`. in and out never alias, but for kdrt_allreduce
// (in == out sums in place). Bytes move with MPI; groups are made with
// MPI_Comm_split on first use and cached in c->comm.
// - allreduce: out = sum over the group of in, n floats; allreduce_max: max.
// - reduce_scatter: in has dim replicated (or split by other axes); out has
//   dim split further over `axes`, summed over the group.
// - allgather: dim is the group's shard in `in`; out has it gathered
//   (extent lshape[dim] * group size), blocks in group order.
// - alltoall: in split over the group along `from`; out split along `to`
//   instead (out's local shape: lshape[from] * n, lshape[to] / n).
// - slice: no communication: in is replicated along dim over `axes`, out
//   keeps this rank's block along dim.
// - allgather16, alltoall16 (issue 23): allgather and alltoall of a value
//   whose every element is exactly one of the 16-bit type `kind`
//   (KDRT_ROUND_*: a mixed policy's rounded activations), moved in its 16
//   bits: packed two to a 4-byte word along the last dim (kdrt_pair_shape),
//   moved by the float kernels (as int32 ids' bits are), unpacked into out.
//   Bit for bit allgather's and alltoall's result, half the bytes.

int kdrt_group_size(const kdrt_ctx *c, unsigned axes);
// issue 23: the float shape `pair` that moves a 16-bit tensor of local
// shape lshape as words of two values (its last dim halved), for a
// collective over a group of n that splits dim `to` (all-to-all's; -1:
// none). 0 when a block would not start on a word: an odd last dim, or
// `to` the last dim and its blocks odd. kdcc asks for the 16-bit
// collectives only where it is 1 (store16.c's move16).
int kdrt_pair_shape(int rank, const int64_t *lshape, int to, int n, int64_t *pair);
// This rank's index in its group: row-major over the group's axes (the
// coordinates of the other axes, as a mask's complement, name the group).
int kdrt_group_index(const kdrt_ctx *c, unsigned axes);

// ---------------------------------------------------------------- optim.c: optimizer helpers
// The rate a learning-rate schedule gives at optimizer step `step` (from
// 0), in float32 as Keras computes it (optim.c).
float kdrt_schedule_lr(const kdrt_schedule *s, int64_t step);
// Nadam's product of its momentum schedule over steps 1..t, kept in c
// from one step to the next (recomputed after a resume).
float kdrt_nadam_product(kdrt_ctx *c, float b1, int64_t t);
float kdrt_nadam_product16(kdrt_ctx *c, float b1, int64_t t, int kind); // issue 23
// issue 23: Keras's LossScaleOptimizer's decision on a step whose gradients
// held `bad` non-finite values on this rank (collective: any rank's make
// the step a skipped one everywhere). Finite: c->apply_update set, the
// finite steps counted and the scale doubled at dynamic_growth_steps of
// them; else c->apply_update 0, the scale halved and the count restarted.
// Returns c->apply_update. kdrt_loss_scale_step (the kernel list) calls it,
// and the CUDA runtime's.
int kdrt_loss_scale_decide(kdrt_ctx *c, int64_t bad);

// ---------------------------------------------------------------- rng.c
// Counter-based randomness (Philox-4x32-10), keyed by (seed, stream) with
// the counter = (step, global element index). A rank computes only its own
// elements and gets exactly the values one device would.

// Fill this rank's block of a tensor of layout l. fan_in/fan_out as Keras
// computes them for the variable's global shape (kdcc passes them). p0, p1:
// mean/stddev, minval/maxval or the constant. stream: a stable id of the
// variable (kdcc hashes its path).
void kdrt_init_fill16(const kdrt_ctx *c, int round, float *buf, const kdrt_layout *l,
                      kdrt_init_kind kind, double fan_in, double fan_out, float p0, float p1,
                      uint64_t stream); // issue 23: into a variable kept in 16 bits
void kdrt_init_fill(const kdrt_ctx *c, float *buf, const kdrt_layout *l, kdrt_init_kind kind,
                    double fan_in, double fan_out, float p0, float p1, uint64_t stream);
// One uniform [0,1) float for (seed, stream, counter hi, counter lo).
float kdrt_uniform(uint64_t seed, uint64_t stream, uint64_t hi, uint64_t lo);
// One standard normal float (Box-Muller over two uniforms of the same key).
float kdrt_normal(uint64_t seed, uint64_t stream, uint64_t hi, uint64_t lo);

// issue 23: the buffer where a step's 16-bit products widen their operands
// (kdrt_matmul16's and kdrt_conv2d16's widen: float32 copies where the CPU
// has no bfloat16 product), `floats` for `batch` global rows, the step's
// `rows` (a larger run batch: as many times more as it has batches of
// `batch`): the program's WIDEN16_FLOATS, its memory plan's figure. Made
// the first time, grown only for a larger step, kept until the run ends;
// a CPU with bfloat16 products touches little of it.
float *kdrt_widen16(kdrt_ctx *c, size_t floats, int64_t rows, int64_t batch);

// --------------------------------------------------- ops.c, loss.c, optim.c, norm.c, comm.c, rng.c
// The kernels and collectives generated steps call: declared once, for this
// runtime and the CUDA one, by the list in kdrt_ops.def (beside their ops).
#define KDRT_UNPAREN(...) __VA_ARGS__
#define K(name, args) void kdrt_##name args;
#define KC(name, args) void kdrt_##name(kdrt_ctx *c, KDRT_UNPAREN args);
#include "kdrt_ops.def"

// ---------------------------------------------------------------- onednn.c
// Convolutions through oneDNN, for ops.c's kernels: 1 when done, 0 when
// oneDNN is off (KDRT_ONEDNN=0) or cannot do this window (the caller runs
// its own loops). Primitives are made once per distinct (kind, window) and
// cached. Operands: CONV y = out from (x = a, f = b); CONV_DX dx = out from
// (dy = a, f = b); CONV_DW dw = out from (x = a, dy = b).
enum { KDRT_DNNL_CONV = 1, KDRT_DNNL_CONV_DX, KDRT_DNNL_CONV_DW };
int kdrt_dnnl_conv(int kind, const kdrt_window *w, float *out, const float *a, const float *b);
// issue 23: whether oneDNN runs bf16 products on this CPU's bf16
// instructions; then one block of kdrt_matmul16, c = op(a) op(b) (ta, tb:
// transposed) on the calling thread: 1 when done, 0 when the caller must.
int kdrt_dnnl_bf16(void);
int kdrt_dnnl_matmul16(int ta, int tb, int M, int N, int K, const uint16_t *a, int lda,
                       const uint16_t *b, int ldb, float *c, int ldc);

// ---------------------------------------------------------------- data.c
// Data files (.npy and IDX, plain or gzip'd, told apart by their magic
// bytes) and how their samples become a step's float32 rows. Functions
// returning int give 0, or -1 with a message naming the file in err.

// The header of an array file: element kind ('f' float, 'u' unsigned, 'i'
// signed), element size in bytes, byte order, shape, where the data starts.
typedef struct {
  char kind;
  int size;
  int big_endian;             // IDX stores multi-byte elements big-endian
  int ndim;
  int64_t shape[8];
  size_t data_offset;
} kdrt_array_header;
typedef kdrt_array_header kdrt_npy;

// Parse the first len bytes of a .npy file (magic, version, header dict).
// Accepts little-endian f4 f8 u1 i4 i8, C order.
int kdrt_npy_parse(const unsigned char *buf, size_t len, kdrt_npy *out, char *err, size_t errlen);
// Parse an IDX header: 00 00, a type byte (0x08 u8, 0x09 i8, 0x0B i16,
// 0x0C i32, 0x0D f32, 0x0E f64), the number of dims, then each dim as a
// big-endian uint32.
int kdrt_idx_parse(const unsigned char *buf, size_t len, kdrt_array_header *out, char *err,
                   size_t errlen);

// One open data file: n samples of row elements each.
typedef struct {
  const char *path;
  const char *format;         // ".npy", "IDX", "gzip'd IDX", ... for messages
  kdrt_array_header h;
  const unsigned char *data;  // the first element
  void *map;                  // a plain file: mmap'd, map_len bytes
  size_t map_len;
  unsigned char *buf;         // a gzip'd file: decompressed whole, malloc'd
  int64_t n, row;
} kdrt_array;
// Open, recognise, parse, and check that every byte the shape promises is
// there (an IDX file must also have no extra bytes). A gzip'd file is
// inflated whole, bounded: its header's size must be within
// kdrt_max_inflate() before anything is allocated, and the stream may hold
// no more than the header promises.
int kdrt_array_open(kdrt_array *a, const char *path, char *err, size_t errlen);
void kdrt_array_close(kdrt_array *a);
// The most bytes one rank inflates a gzip'd data file to: KDRT_MAX_INFLATE
// (bytes, or with a K, M or G suffix), else half the host's memory divided
// by the ranks on it (OMPI_COMM_WORLD_LOCAL_SIZE).
size_t kdrt_max_inflate(void);
// Sample s as row floats, each times scale.
void kdrt_array_row(const kdrt_array *a, int64_t s, double scale, float *out);

// Integer samples of an array: sample s as row int32s. Callers check
// first (kdrt_fit_inputs) that every element is an integer that fits.
void kdrt_array_row_i32(const kdrt_array *a, int64_t s, int32_t *out);

// Elements of one sample of an input or label: prod(shape).
int64_t kdrt_io_elems(const kdrt_io *io);

// How a label file becomes the rows the loss wants.
// (sample weights: ONES when no file is given, BCAST for one weight a sample
// over its rows)
enum { KDRT_LABELS_COPY, KDRT_LABELS_IDS, KDRT_LABELS_ONEHOT, KDRT_LABELS_ONES,
       KDRT_LABELS_BCAST };
// Input file a for p->inputs[k]: fits when a sample has prod(shape)
// elements, whatever its shape. A KDRT_I32 input wants integers: integer
// files, or float files whose every value is integral; with num_classes > 0
// every id must lie in [0, num_classes) (the message names the file, the
// sample and the value).
int kdrt_fit_inputs(const kdrt_array *a, const kdrt_program *p, int k, char *err, size_t errlen);
// Label file a for p->labels[j], by its label_kind: CLASSID wants ids (N,)
// or (N, 1); ONEHOT wants (N, C) or ids, which it expands; DENSE / BINARY
// want prod(shape) elements a sample. Ids are checked: integers in
// [0, num_classes).
int kdrt_fit_labels(const kdrt_array *a, const kdrt_program *p, int j, int *conv, char *err,
                    size_t errlen);
// Label s of a, converted (conv from kdrt_fit_labels): prod(shape) floats.
void kdrt_label_row(const kdrt_array *a, int conv, int64_t num_classes, int64_t s, float *out);

// The inputs and labels of one data set (one file each), or synthetic
// samples; a slice of samples [first, first + n) of them (a validation
// split is a slice of the files).
typedef struct {
  const kdrt_program *p;
  int synthetic;              // samples from kdrt_synthetic_input/_label(seed)
  uint64_t seed;
  kdrt_array *x, *y;          // [ninputs], [nlabels] open files (files only)
  int *yconv;                 // [nlabels] KDRT_LABELS_*
  int owner;                  // frees the arrays and closes the files (0 for a slice)
  double scale;               // float inputs times scale
  const float *class_w;       // ./train --class-weight: each sample's weight (indexed as the
                              // files are), the sample-weight label's rows; NULL: none
  int64_t first, n;
  unsigned char *cache;       // synthetic samples made once (bytes a sample: `per`), or NULL
  size_t per;                 // the cache's bytes a sample: every input, then every label
} kdrt_data;
// xpaths[ninputs], ypaths[nlabels]: the files in the program's order. All
// must hold the same number of samples (else an error naming two of them).
int kdrt_data_open(kdrt_data *d, const kdrt_program *p, const char *const *xpaths,
                   const char *const *ypaths, double scale, char *err, size_t errlen);
void kdrt_data_synthetic(kdrt_data *d, const kdrt_program *p, uint64_t seed, int64_t n);
kdrt_data kdrt_data_slice(const kdrt_data *d, int64_t first, int64_t n);
// Sample i of the slice: input k into x[k] (prod(shape) elements of its
// dtype), label j into y[j] (prod(shape) floats).
void kdrt_data_sample(const kdrt_data *d, int64_t i, void *const *x, float *const *y);
void kdrt_data_close(kdrt_data *d);
// kdcc --sample-weight: the sum of sample-weight label j's elements over n
// samples of d, sample i being order[pos0 + i] (order NULL: pos0 + i).
double kdrt_data_weight_sum(const kdrt_data *d, int j, const int64_t *order, int64_t pos0,
                            int64_t n);
// Keras's class_weight ("C:W,C:W,..." : class id C weighs W, others 1) as
// sample weights of d's samples, from label 0's class ids (one a sample) or
// one-hot rows (argmax), as Keras's class_weight_to_sample_weights: d->class_w
// (freed with d). 0, or -1 with err (a bad spec, labels not one class a sample).
int kdrt_data_class_weight(kdrt_data *d, const char *spec, char *err, size_t errlen);
// n samples of d, sample i being order[pos0 + i] (order NULL: pos0 + i),
// into consecutive rows of x[k] and y[j] (a rank's share of a batch).
void kdrt_data_gather(const kdrt_data *d, const int64_t *order, int64_t pos0, int64_t n,
                      void *const *x, float *const *y);
// The bytes of one sample as one record: every input, then every label
// (4-byte elements, as kdrt_data_sample writes them).
size_t kdrt_data_record_bytes(const kdrt_program *p);
// d's n samples as consecutive records at out (n * kdrt_data_record_bytes):
// sample i's record is the bytes kdrt_data_gather writes for it (a backend
// that holds the whole data set gathers rows from these; issue 22).
void kdrt_data_records(const kdrt_data *d, unsigned char *out);
// The input thread (issue 22): kdrt_data_gather run by a thread of its
// own, one job at a time, so that the next batch is gathered into a second
// set of buffers while this step runs. Start returns NULL when it is off
// (KDRT_PREFETCH=0) or no thread could be made: the caller gathers itself.
// post hands it a job (the previous one waited for); wait returns once the
// job posted last is done (at once with none); stop waits and ends the
// thread. The bytes are kdrt_data_gather's: the same batches, bit for bit.
typedef struct kdrt_prefetch kdrt_prefetch;
kdrt_prefetch *kdrt_prefetch_start(void);
void kdrt_prefetch_post(kdrt_prefetch *f, const kdrt_data *d, const int64_t *order, int64_t pos0,
                        int64_t n, void *const *x, float *const *y);
void kdrt_prefetch_wait(kdrt_prefetch *f);
void kdrt_prefetch_stop(kdrt_prefetch *f);
// Where the fit loop's batch buffers come from (issue 22). A backend may set
// these before kdrt_main: the CUDA runtime gives pinned memory, which it
// uploads from without a copy, and reuse(p) waits until the upload that
// read buffer p is done, before the fit loop (or its thread) refills it.
// All NULL (the CPU runtime): aligned_alloc, free, no wait.
//
// rows (issue 22), when set, is asked first for each batch: n samples of d,
// sample i being order[pos0 + i] (order NULL: pos0 + i). It returns 1 when
// the backend holds d whole (the CUDA runtime, when d fits its budget: d's
// records on the device) and will gather those samples itself for the next
// step; the fit loop then gathers nothing. 0: gather as usual.
typedef struct {
  void *(*alloc)(size_t bytes); // zeroed; NULL: out of memory
  void (*free)(void *p);
  void (*reuse)(const void *p);
  int (*rows)(const kdrt_data *d, const int64_t *order, int64_t pos0, int64_t n);
} kdrt_host_buffers;
extern kdrt_host_buffers kdrt_batch_buffers;

// ---------------------------------------------------------------- checkpoint.c
// Checkpoints (--checkpoint-dir D --checkpoint-every N, --resume):
// D/ckpt-<step>/shard-<rank>.kdck per rank, then D/ckpt-<step>/MANIFEST
// (the commit point), then D/latest. Format and protocol: checkpoint.c.
// The collective calls agree on errors: on one, the rank that met it says
// so, naming the file, and every rank exits 1.

// Where training stands, besides the tensors.
typedef struct {
  int64_t step;               // c->step: optimizer steps done
  uint64_t seed;              // --seed (shuffle, dropout, synthetic data)
  int64_t epoch;              // epoch in progress, from 0
  int64_t pos;                // its steps done (pos == steps: all, validation not yet)
  int64_t steps;              // steps per epoch
  int64_t ntrain;             // training samples
  int64_t batch;              // the global batch size (0: not recorded, an older checkpoint)
  int nlogs;                  // the program's logs (kdrt_program.log_names)
  const char *const *log_names; // [nlogs]
  const double *sums;         // [nlogs] running sums over those pos steps
  int nhist;                  // finished epochs
  const double *const *hist;  // [2 * nlogs], each [nhist]: log k's epoch means at k,
                              // its val_ means at nlogs + k (0: no validation)
  int64_t nsteps;             // = step: every step's loss so far (--history's step_loss)
  const double *step_loss;    // [nsteps]
  // issue 23: a loss-scaled program's (has_loss_scale): c->loss_scale,
  // c->loss_scale_count, c->iterations, and the scale after every step so
  // far (--history's step_loss_scale)
  int has_loss_scale;
  double loss_scale;
  int64_t loss_scale_count, iterations;
  const double *step_scale;   // [nsteps]
} kdrt_ckpt_state;

// Collective: make D (and parents) and check it takes files.
void kdrt_ckpt_prepare(kdrt_ctx *c, const char *dir);
// Collective, after each optimizer step: save when st->step % every == 0
// (every == 0: at the end of each epoch), as kdrt_ckpt_due says.
int kdrt_ckpt_due(int64_t every, const kdrt_ckpt_state *st);
void kdrt_ckpt_maybe_save(kdrt_ctx *c, const char *dir, int64_t every, const kdrt_ckpt_state *st);
// Weights that are not finite are never saved (an error naming a variable).
void kdrt_ckpt_save(kdrt_ctx *c, const char *dir, const kdrt_ckpt_state *st);
// Collective: the newest checkpoint in dir with a MANIFEST whose files all
// verify (others are skipped with a warning). Fills st (hist malloc'd) and
// name ("ckpt-40"); returns 0, or -1 when dir holds no checkpoint at all.
// A checkpoint whose log names differ from the program's is an error.
int kdrt_ckpt_find(kdrt_ctx *c, const char *dir, kdrt_ckpt_state *st, char *name, size_t len);
// Collective: this rank's blocks of every variable and optimizer slot from
// dir/name into c->params, cut from the saved shards whatever the saved mesh.
void kdrt_ckpt_load(kdrt_ctx *c, const char *dir, const char *name);

// The file format (ckpt_format.c), for tests (no MPI).
uint32_t kdrt_crc32(uint32_t crc, const void *buf, size_t n); // zlib's crc32
// A shard file's header length, from the file's first line: -1 if it is
// not a shard's.
int64_t kdrt_ckpt_header_bytes(const char *first);
// One file written atomically: open makes a dot-named temporary beside
// path; commit fsyncs, renames and fsyncs the directory. Each returns 0,
// or -1 with err set (naming path); write keeps size and crc of the bytes.
typedef struct {
  int fd;
  char path[4096], tmp[4200];
  uint64_t size;
  uint32_t crc;
  char err[4400];
} kdrt_ckpt_file;
int kdrt_ckpt_open(kdrt_ckpt_file *f, const char *path);
int kdrt_ckpt_write(kdrt_ckpt_file *f, const void *buf, size_t n);
int kdrt_ckpt_commit(kdrt_ckpt_file *f);
// A shard file's header: one entry per variable, its block's global start
// and local extent per dim, and its byte offset in the file.
typedef struct {
  char path[256];
  int nslots;
  kdrt_layout layout;
  int64_t start[KDRT_MAX_RANK], local[KDRT_MAX_RANK];
  uint64_t offset;            // bytes from the file's start; the var, then each slot
} kdrt_ckpt_var;
typedef struct {
  char model[256];
  int64_t step;
  int mesh_ndim;
  int mesh_shape[KDRT_MAX_AXES];
  char axes[KDRT_MAX_AXES][64];
  int rank, world;
  int coord[KDRT_MAX_AXES];
  int nvars;
  kdrt_ckpt_var *vars;        // malloc'd
  uint64_t data_offset;       // = the header's length, a multiple of 64
  uint64_t data_bytes;
} kdrt_ckpt_header;
// The header of rank c->rank's file (offsets set by _format).
void kdrt_ckpt_header_of(const kdrt_ctx *c, int64_t step, kdrt_ckpt_header *h);
// Text, zero-padded to h->data_offset (set here); malloc'd, *len bytes.
char *kdrt_ckpt_header_format(kdrt_ckpt_header *h, size_t *len);
// Parse (text is modified); 0, or -1 with err.
int kdrt_ckpt_header_parse(char *text, size_t len, kdrt_ckpt_header *h, char *err, size_t errlen);
void kdrt_ckpt_header_free(kdrt_ckpt_header *h);
typedef struct {
  char model[256];
  char optimizer[64];         // its Keras class, whose slots the shards hold ("": not said)
  int mesh_ndim;
  int mesh_shape[KDRT_MAX_AXES];
  char axes[KDRT_MAX_AXES][64];
  kdrt_ckpt_state st;
  // parse: the storage of st's arrays
  char **names;               // [st.nlogs]
  double *sums, **hist, *step_loss; // [nlogs], [2 * nlogs][nhist], [nsteps]
  double *step_scale;         // [nsteps] (issue 23)
  int nfiles;
  struct { char name[64]; uint64_t size; uint32_t crc; } *files;
} kdrt_ckpt_manifest;
char *kdrt_ckpt_manifest_format(const kdrt_ckpt_manifest *m, size_t *len);
int kdrt_ckpt_manifest_parse(char *text, size_t len, kdrt_ckpt_manifest *m, char *err,
                             size_t errlen);
void kdrt_ckpt_manifest_free(kdrt_ckpt_manifest *m);
// Copy the overlap of a block src (global start src_start, extents src_ext)
// into the block dst (dst_start, dst_ext) of the same tensor of rank `rank`;
// returns the number of elements copied (0: they do not meet).
int64_t kdrt_ckpt_copy_overlap(float *dst, const int64_t *dst_start, const int64_t *dst_ext,
                               const float *src, const int64_t *src_start,
                               const int64_t *src_ext, int rank);

// ---------------------------------------------------------------- watchdog.c
// No hung job: a thread per rank ends the process (status 1, so mpirun
// ends the job) when the main thread makes no progress for the limit,
// saying on stderr where this rank waits: rank, epoch and step, the
// collective and its mesh axes. Format and limits: watchdog.c.

// Start it: timeout > 0 seconds, fixed; 0: the default (300 s until steps
// are timed, then 100 times the median step, at least 120 s); < 0: none.
void kdrt_watchdog_start(const kdrt_ctx *c, double timeout);
void kdrt_watchdog_stop(void);
// The limit in force for a timeout as above and the last n step times.
double kdrt_watchdog_limit(double timeout, const double *times, int n);
// Progress marks: a phase ("training", "validation", ...) and, in
// training, the epoch and step (from 1; 0: none), or NULL: progress within
// the phase; a training step's time;
// a collective over the mesh axes `axes` entered, and left.
void kdrt_watch_phase(const char *phase, int64_t epoch, int64_t step);
void kdrt_watch_step_time(double seconds);
void kdrt_watch_enter(const char *coll, unsigned axes);
void kdrt_watch_leave(void);

// ---------------------------------------------------------------- options.c
// The command line of a generated program; pieces of the runtime that
// generated code does not call, declared here so kdrt.c, the other runtime
// files and the unit tests (tests/test_rt_core.c, tests/rt_comm_check.c)
// can reach them.

// The values of one repeatable file option (--x, --y, ...), as typed.
#define KDRT_MAX_FILES 32              // inputs, labels, outputs of a program: at most this many
#define KDRT_MAX_LOGS 64               // logs of a program: at most this many
typedef struct {
  int n;
  const char *arg[KDRT_MAX_FILES]; // "FILE" or "NAME=FILE"
} kdrt_files;

// Put the files f of option `opt` ("--x") in the order of ios[0..nio):
// either every value is NAME=FILE with NAME one of the ios' names (each
// once), or they are FILEs, one per io in order (a value whose part
// before '=' names no io is a FILE). out[nio] gets the files; returns 0,
// or -1 with a message naming the option and the expected names.
int kdrt_resolve_files(const kdrt_files *f, const char *opt, const kdrt_io *ios, int nio,
                       const char *what, const char **out, char *err, size_t errlen);

// Command-line options of a generated program (see kdrt_parse_args).
typedef struct {
  int epochs;                 // --epochs N, default 1
  int batch_size;             // --batch-size B, 0: not given (the compiled batch)
  int64_t steps_per_epoch;    // --steps-per-epoch S, 0: every batch
  int drop_remainder;         // --drop-remainder: fit leaves out each epoch's last partial batch
  int64_t synthetic;          // --synthetic N, 0: not given
  // The data files, as given: --x FILE or --x NAME=FILE once per model
  // input (.npy or IDX, maybe gzip'd; see data.c), --y once per label;
  // kdrt_resolve_files puts them in the program's order.
  kdrt_files x, y;            // --x, --y
  kdrt_files val_x, val_y;    // --val-x, --val-y: validation data
  kdrt_files test_x, test_y;  // --test-x, --test-y: evaluated after fit
  double scale;               // --scale S (a number or a fraction 1/255): inputs times S, default 1
  double validation_split;    // --validation-split F, in [0, 1)
  const char *class_weight;   // --class-weight C:W,...: Keras's class_weight, NULL: none
  const char *sample_weight;  // --sample-weight FILE: Keras's sample_weight for --x/--y (a
                              // program compiled with kdcc --sample-weight), NULL: ones
  uint64_t seed;              // --seed S, default 1337
  int has_lr;                 // --lr given
  float lr;                   // --lr X
  const char *history;        // --history FILE, NULL: none
  const char *weights;        // --weights FILE: initial weights (.keras, .weights.h5)
  int init_random;            // --init random: ignore prog->weights_file
  const char *save_weights;   // --save-weights FILE (.weights.h5 or .keras)
  const char *lora_weights;   // --lora-weights FILE.lora.h5: LoRA's starting A and B
  const char *save_lora;      // --save-lora-weights FILE.lora.h5: LoRA's A and B after fit
  int quiet;                  // --quiet
  int no_shuffle;             // --no-shuffle: batches in file order every epoch
  const char *checkpoint_dir; // --checkpoint-dir D
  int64_t checkpoint_every;   // --checkpoint-every N optimizer steps, 0: each epoch's end
  int resume;                 // --resume: from D's newest complete checkpoint
  int help;                   // --help
  double timeout;             // --timeout S: > 0 seconds, -1: none (--timeout 0), 0: the
                              // watchdog's default (kdrt_watchdog_start)
  // Keras's callbacks (callbacks.c), their defaults Keras's
  const char *monitor;        // --monitor NAME: a log, default "val_loss"
  int mode;                   // --mode auto|min|max: 0, -1, 1
  int early_stopping;         // --early-stopping PATIENCE given
  int64_t es_patience;
  double min_delta;           // --min-delta X (EarlyStopping's, default 0)
  int has_baseline;           // --baseline X given
  double baseline;
  int64_t start_from_epoch;   // --start-from-epoch N
  int restore_best;           // --restore-best-weights
  int reduce_lr;              // --reduce-lr-on-plateau PATIENCE given
  int64_t rl_patience;
  double rl_factor;           // --reduce-lr-factor F in [0, 1), default 0.1
  double rl_min_delta;        // --reduce-lr-min-delta X, default 1e-4
  int64_t rl_cooldown;        // --reduce-lr-cooldown N, default 0
  double min_lr;              // --min-lr X, default 0
  const char *checkpoint_best; // --checkpoint-best FILE (.weights.h5 or .keras)
  const char *csv_log;        // --csv-log FILE
  int csv_append;             // --csv-append
} kdrt_options;

// Parse argv[1..argc) into o (defaults first). Returns 0, or 2 with a
// one-line message in err (usage errors exit with status 2).
int kdrt_parse_args(int argc, char **argv, kdrt_options *o, char *err, size_t errlen);
// The program's --help: its options, its mesh and devices, its inputs and
// labels, where its initial weights come from.
void kdrt_usage(FILE *f, const kdrt_program *p);

// Whether a file can be written at path, as the runtime writes its outputs
// (a temporary beside it, then a rename): path is not a directory and its
// directory takes a new file (one is made and removed). 0, or -1 with a
// message naming path and why. No MPI.
int kdrt_check_output(const char *path, char *err, size_t errlen);

// ---------------------------------------------------------------- callbacks.c
// Keras's EarlyStopping, ReduceLROnPlateau, ModelCheckpoint(save_best_only)
// and CSVLogger, run by fit at every epoch's end (semantics: callbacks.c).
typedef struct {
  const kdrt_options *o;
  int nnames;                 // the logs an epoch ends with: names[i], then
  const char *const *names;   // (has_val) the val_ ones among them
  int has_val, show;          // validation runs; rank 0 prints
  int monitor, less;          // the monitored log's index in names (-1: none); min mode
  float lr;                   // the learning rate in use
  int es_wait, es_has_best, best_epoch, stopped_epoch; // EarlyStopping
  double es_best;
  float *best_weights;        // restore_best_weights: every variable's shard, in vars order
  int has_best_weights;
  int rl_wait, rl_cooldown, rl_has_best; // ReduceLROnPlateau
  double rl_best;
  int ck_has_best;            // ModelCheckpoint
  double ck_best;
  FILE *csv;                  // CSVLogger (rank 0)
  int csv_header;             // the header is still to write
} kdrt_callbacks;
// on_train_begin: find the monitored log among names[nnames] (the val_
// ones count when has_val), decide the mode, open --csv-log (rank 0).
// 0, or -1 with a message (every rank alike, but the CSV file's).
int kdrt_cb_begin(kdrt_callbacks *cb, kdrt_ctx *c, const kdrt_options *o, int nnames,
                  const char *const *names, int has_val, int show, char *err, size_t errlen);
// on_epoch_end of epoch `epoch` (from 0) with its logs[nnames], identical
// on every rank: may set c->lr, save --checkpoint-best (collective),
// write a CSV row. Returns 1 when EarlyStopping stops training. replay:
// only the state (the epochs a resumed run restored), nothing said or written.
int kdrt_cb_epoch_end(kdrt_callbacks *cb, kdrt_ctx *c, int epoch, const double *logs,
                      int replay);
// on_train_end: restore_best_weights' weights back into c->params; closes.
void kdrt_cb_end(kdrt_callbacks *cb, kdrt_ctx *c);
// v as Python's repr(float) writes it ("0.1", "3.0", "1e-05"): the csv
// module's format for a log.
void kdrt_py_float(char *buf, size_t len, double v);

// idx[0..n) = a permutation of 0..n-1 for this epoch (Fisher-Yates driven by
// kdrt_uniform with counter (epoch, i)); identical on every rank and mesh.
void kdrt_shuffle(uint64_t seed, int64_t epoch, int64_t *idx, int64_t n);
// Synthetic data, a function of (seed, sample index, input or label
// index) only: input k of sample s (prod(shape) elements of its dtype:
// floats ~ N(0, 1), int32 ids uniform in [0, num_classes), 0 when
// num_classes < 1), and label j (prod(shape) floats by its label_kind).
void kdrt_synthetic_input(const kdrt_program *p, uint64_t seed, int k, int64_t sample, void *x);
void kdrt_synthetic_label(const kdrt_program *p, uint64_t seed, int j, int64_t sample, float *y);
// One Keras progress line ("8/8 ━━━━ 0s 4ms/step - accuracy: 0.5000 - loss:
// 0.9237") into buf, without a line end. Metrics come out sorted
// by name, as Keras 3 sorts its logs. finalize: elapsed time, else the ETA.
// color: the bar's done part in green (for a terminal).
void kdrt_progress_line(char *buf, size_t len, int64_t cur, int64_t target, int finalize,
                        double elapsed_s, double per_step_s, int nvals,
                        const char *const *names, const double *vals, int color);
// progress.c: one progress bar, drawn by rank 0 (show): redrawn in place on
// a terminal (live), else printed once when finished, so that logs stay one
// line per epoch. Keras's time per step leaves the first step out.
typedef struct {
  int show, live;
  int64_t target;
  double start, after_first, last_draw;
  size_t prev_width;
} kdrt_progbar;
void kdrt_progbar_start(kdrt_progbar *b, int show, int live, int64_t target);
// Step cur of the target done (finalize: the epoch's last line) with these logs.
void kdrt_progbar_update(kdrt_progbar *b, int64_t cur, int finalize, int n,
                         const char *const *names, const double *vals);
// Whether the bar is redrawn in place: stdout a terminal of this process's own
// (not mpirun's pty), or KDRT_PROGRESS=live|plain. Ask before MPI_Init.
int kdrt_live_progress(void);
// Seconds on the monotonic clock.
double kdrt_now_s(void);

// Free the cached group communicators (before MPI_Finalize, or to reuse a
// ctx on another mesh).
void kdrt_comm_free(kdrt_ctx *c);
// The one error check for MPI calls: KDRT_MPI(MPI_Barrier(comm)) reports
// the call, file and line on failure and aborts.
void kdrt_mpi_check(int rc, const char *call, const char *file, int line);
#define KDRT_MPI(call) kdrt_mpi_check((call), #call, __FILE__, __LINE__)

// The Philox-4x32-10 block function (Salmon et al., SC'11).
void kdrt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#endif
