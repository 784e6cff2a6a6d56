// Sharding propagation and collective insertion, checked against a hand
// analysis of the seed programs (KERAS.md) and a Megatron pair.
#include <criterion/criterion.h>
#include <string.h>

#include "kdcc.h"

static Graph *compile(const char *model, const char *dist, const char *mesh, int batch) {
  opt_quiet_warnings = true;
  return compile_model(model, dist, mesh, batch);
}

static int axis_of(Graph *g, const char *name) {
  for (int a = 0; a < g->dist->mesh.ndim; a++)
    if (!strcmp(g->dist->mesh.names[a], name)) return a;
  cr_assert_fail("no mesh axis %s", name);
  return -1;
}

// Collectives of one kind over exactly `axes`, in one phase (-1: any).
static int count(Graph *g, OpKind op, unsigned axes, int phase) {
  int n = 0;
  for (int i = 0; i < g->nnodes; i++) {
    Node *x = g->nodes[i];
    if (x->op == op && x->coll.axes == axes && (phase < 0 || (int)x->phase == phase)) n++;
  }
  return n;
}

static int collectives(Graph *g) {
  int n = 0;
  for (int i = 0; i < g->nnodes; i++) n += is_collective(g->nodes[i]->op);
  return n;
}

static Var *var(Graph *g, const char *path) {
  for (int i = 0; i < g->nvars; i++)
    if (!strcmp(g->vars[i]->path, path)) return g->vars[i];
  cr_assert_fail("no variable %s", path);
  return NULL;
}

// The collective chain that feeds a variable's update: its kinds and axes.
static void grad_chain(Graph *g, Var *v, OpKind *ops, unsigned *axes, int *n) {
  *n = 0;
  for (Node *x = v->grad; is_collective(x->op); x = x->in[0]) {
    ops[*n] = x->op;
    axes[(*n)++] = x->coll.axes;
  }
}

Test(shard, data_parallel_reduces_each_gradient_once) {
  Graph *g = compile("models/seed_mlp.json", "models/seed_mlp_dp.dist.json", NULL, 16);
  unsigned batch = 1u << axis_of(g, "batch");
  cr_assert_eq(g->dist->mesh.size, 8);
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    cr_assert_eq(v->grad->op, OP_ALLREDUCE, "%s: gradient not all-reduced", v->path);
    cr_assert_eq(v->grad->coll.axes, batch, "%s: reduced over the wrong axes", v->path);
    cr_assert(!is_collective(v->grad->in[0]->op), "%s: reduced twice", v->path);
    cr_assert_eq(v->place.axis[0], -1);
  }
  // nothing else moves but the logged loss and accuracy
  cr_assert_eq(collectives(g), g->nvars + 2);
  cr_assert_eq(count(g, OP_ALLREDUCE, batch, PH_UPDATE), g->nvars);
  cr_assert_eq(count(g, OP_ALLREDUCE, batch, PH_LOSS), 2);
}

Test(shard, model_parallel_seed_matches_hand_analysis) {
  Graph *g = compile("models/seed_mlp.json", "models/seed_mlp_fixed.dist.json", NULL, 16);
  unsigned data = 1u << axis_of(g, "data"), model = 1u << axis_of(g, "model");
  Var *k1 = var(g, "sequential/d1/kernel");
  Shape ls = local_shape(g, k1->param);
  cr_assert_eq(ls.rank, 2);
  cr_assert_eq(ls.d[0], 784);
  cr_assert_eq(ls.d[1], 50);
  // every gradient is summed over the batch axis on its way to the update
  for (int i = 0; i < g->nvars; i++) {
    OpKind ops[8];
    unsigned axes[8];
    int n;
    grad_chain(g, g->vars[i], ops, axes, &n);
    bool over_data = false;
    for (int k = 0; k < n; k++) over_data |= ops[k] == OP_ALLREDUCE && axes[k] == data;
    cr_assert(over_data, "%s: no reduction over data", g->vars[i]->path);
    cr_assert_eq(g->vars[i]->grad->place.partial, 0);
  }
  // d2 contracts the model-split dim of d1's output: one forward sum over model
  cr_assert_eq(count(g, OP_ALLREDUCE, model, PH_FORWARD), 1);
  Node *ar = NULL;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->op == OP_ALLREDUCE && g->nodes[i]->coll.axes == model) ar = g->nodes[i];
  cr_assert_eq(ar->in[0]->op, OP_DOT);
  cr_assert_str_eq(ar->layer, "d2");
  // d2/output is constrained to (data, None)
  cr_assert_eq(g->outputs[0]->place.axis[0], axis_of(g, "data"));
  cr_assert_eq(g->outputs[0]->place.axis[1], -1);
}

Test(shard, megatron_pair_one_all_reduce_each_way) {
  Graph *g = compile("models/megatron.json", "models/megatron.dist.json", NULL, 16);
  unsigned model = 1u << axis_of(g, "model");
  cr_assert_eq(count(g, OP_ALLREDUCE, model, PH_FORWARD), 1, "forward: one all-reduce");
  cr_assert_eq(count(g, OP_ALLREDUCE, model, PH_BACKWARD), 1, "backward: its conjugate");
  cr_assert_eq(count(g, OP_ALLGATHER, model, -1), 0);
  cr_assert_eq(count(g, OP_ALLTOALL, model, -1), 0);
  Var *up = var(g, "up/kernel"), *down = var(g, "down/kernel");
  cr_assert_eq(local_shape(g, up->param).d[1], 256 / 4);
  cr_assert_eq(local_shape(g, down->param).d[0], 256 / 4);
}

Test(shard, mesh_override_changes_only_the_shape) {
  Graph *g = compile("models/seed_mlp.json", "models/seed_mlp_fixed.dist.json",
                     "data=8,model=1", 16);
  unsigned model = 1u << axis_of(g, "model");
  cr_assert_eq(g->dist->mesh.size, 8);
  cr_assert_eq(count(g, OP_ALLREDUCE, model, -1), 0, "a size-1 axis moves nothing");
  cr_assert_eq(local_shape(g, var(g, "sequential/d1/kernel")->param).d[1], 200);
}

Test(shard, one_device_has_no_collectives) {
  Graph *g = compile("models/func_branches.json", NULL, NULL, 16);
  cr_assert_eq(collectives(g), 0);
}

Test(report, json_has_every_section) {
  Graph *g = compile("models/seed_mlp.json", "models/seed_mlp_fixed.dist.json", NULL, 16);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  print_report(g, f, true);
  fclose(f);
  json_error_t err;
  json_t *r = json_loads(text, 0, &err);
  cr_assert_not_null(r, "report is not JSON: %s", err.text);
  json_t *vars = json_object_get(r, "variables");
  cr_assert_eq(json_array_size(vars), 3);
  json_t *v0 = json_array_get(vars, 0);
  cr_assert_str_eq(json_string_value(json_object_get(v0, "path")), "sequential/d1/kernel");
  cr_assert_eq(json_integer_value(json_array_get(json_object_get(v0, "local_shape"), 1)), 50);
  cr_assert_str_eq(json_string_value(json_array_get(json_object_get(v0, "layout"), 1)), "model");
  cr_assert(json_is_null(json_array_get(json_object_get(v0, "layout"), 0)));
  json_t *slots = json_object_get(v0, "optimizer_slots");
  cr_assert_eq(json_array_size(slots), 2, "Adam keeps momentum and velocity");
  cr_assert_str_eq(json_string_value(json_array_get(slots, 0)),
                   "adam/sequential_d1_kernel_momentum");
  json_t *cs = json_object_get(r, "collectives");
  cr_assert_gt(json_array_size(cs), 0);
  int64_t sum = 0;
  for (size_t i = 0; i < json_array_size(cs); i++) {
    json_t *c = json_array_get(cs, i);
    cr_assert(json_is_string(json_object_get(c, "kind")));
    cr_assert(json_is_array(json_object_get(c, "axes")));
    cr_assert_gt(json_integer_value(json_object_get(c, "bytes")), 0);
    cr_assert(json_is_string(json_object_get(c, "reason")));
    sum += json_integer_value(json_object_get(c, "sent"));
  }
  cr_assert_eq(json_integer_value(json_object_get(r, "comm_bytes_per_step")), sum);
  json_t *mem = json_object_get(r, "memory");
  // d1 [784,50] + d2 [200,10] + [10], float32
  cr_assert_eq(json_integer_value(json_object_get(mem, "parameters")), (784 * 50 + 2000 + 10) * 4);
  cr_assert_eq(json_integer_value(json_object_get(mem, "optimizer_state")),
               2 * (784 * 50 + 2000 + 10) * 4);
  free(text);
}

// Per-token crossentropy from logits [B, T, V] with V split over 'model'
// (vocab-parallel): the logits are never gathered; the row statistics are
// all-reduced (a max, then a sum), and the loss averages over B*T tokens.
Test(shard, vocab_parallel_crossentropy_gathers_no_logits) {
  Graph *g = compile("tests/good/per_token.json", "tests/good/per_token.dist.json", NULL, 16);
  unsigned model = 1u << axis_of(g, "model");
  Node *logits = g->outputs[0];
  cr_assert_eq(logits->shape.rank, 3);
  cr_assert_eq(logits->place.axis[2], axis_of(g, "model"), "the logits stay split on V");
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->op == OP_ALLGATHER || n->op == OP_ALLTOALL)
      cr_assert(n->shape.rank != 3 || n->shape.d[2] != 32, "%%%d gathers the logits", n->id);
  }
  cr_assert_eq(count(g, OP_ALLREDUCE_MAX, model, PH_LOSS), 1, "one max over 'model'");
  Node *loss = g->logs[0].node;
  cr_assert_eq(loss->op, OP_ALLREDUCE);
  cr_assert_eq(loss->in[0]->op, OP_XENT);
  cr_assert_float_eq(loss->in[0]->loss.weight, 1.0 / (16 * 8), 1e-15, "mean over every token");
  cr_assert_str_eq(g->logs[1].name, "accuracy");
}

// Dense on [B, T, H] is one DOT with T a free dim: no reshape, and the
// split of the batch passes through.
Test(shard, dense_on_rank_3_is_one_dot) {
  Graph *g = compile("tests/good/per_token.json", "tests/good/per_token.dist.json", NULL, 16);
  int dots = 0;
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    cr_assert_neq(n->op, OP_RESHAPE, "%%%d: a reshape", n->id);
    if (n->op == OP_DOT && n->phase == PH_FORWARD) {
      dots++;
      cr_assert_eq(n->shape.rank, 3);
      cr_assert_eq(n->place.axis[0], axis_of(g, "data"));
    }
  }
  cr_assert_eq(dots, 2);
}

// Two inputs (float and ids), two outputs with a loss dict and weights:
// one label each, "loss" is the sum of the weighted losses, logs as Keras
// names them.
Test(shard, two_heads_losses_and_logs) {
  Graph *g = compile("tests/good/two_heads.json", NULL, NULL, 8);
  cr_assert_eq(g->ninputs, 2);
  cr_assert_eq(g->inputs[1]->dtype, DT_I32);
  cr_assert_eq(g->inputs[1]->id_range, 10, "ids index a table of 10 rows");
  cr_assert_eq(g->nlabels, 2);
  cr_assert_eq(g->labels[0]->shape.rank, 1, "sparse labels are class ids");
  cr_assert_eq(g->nlogs, 4);
  const char *names[] = {"loss", "head_a_loss", "head_a_accuracy", "head_b_loss"};
  for (int k = 0; k < 4; k++) cr_assert_str_eq(g->logs[k].name, names[k]);
  Node *total = g->logs[0].node;
  cr_assert_eq(total->op, OP_ADD);
  cr_assert_eq(total->in[1]->op, OP_SCALE);
  cr_assert_float_eq(total->in[1]->aff.scale, 0.5, 1e-7, "head_b weighs 0.5 in the total");
  Node *b = g->logs[3].node; // one device: the loss itself
  cr_assert_eq(b->op, OP_LOSS);
  cr_assert_float_eq(b->loss.weight, 1.0 / 8, 1e-15, "its log is unweighted");
}

// A layer called twice: one variable, the gradient of both calls summed.
Test(shard, shared_layer_sums_its_gradients) {
  Graph *g = compile("tests/good/shared_dense.json", NULL, NULL, 8);
  cr_assert_eq(g->nvars, 4);
  Var *k = var(g, "d/kernel");
  cr_assert_eq(k->grad->op, OP_ADD, "the two calls' gradients are summed");
  int uses = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->op == OP_DOT && g->nodes[i]->phase == PH_FORWARD)
      uses += g->nodes[i]->in[1] == k->param;
  cr_assert_eq(uses, 2);
}

// Megatron attention: q/k/v split on heads, the output projection on heads
// (contracted), the MLP up on columns and down on rows: one all-reduce over
// 'model' in forward per block (attention, MLP), nothing gathered.
Test(shard, megatron_attention_one_all_reduce_per_block) {
  Graph *g = compile("tests/gradcheck/attention.json", "tests/good/attention.dist.json", NULL, 16);
  unsigned model = 1u << axis_of(g, "model");
  cr_assert_eq(count(g, OP_ALLREDUCE, model, PH_FORWARD), 2);
  cr_assert_eq(count(g, OP_ALLGATHER, model, PH_FORWARD), 0);
  cr_assert_eq(count(g, OP_ALLTOALL, model, -1), 0);
  cr_assert_eq(count(g, OP_ALLREDUCE_MAX, model, -1), 0);
  // backward: the conjugates, where the replicated input fans out to the split branches
  cr_assert_eq(count(g, OP_ALLREDUCE, model, PH_BACKWARD), 2);
  // the scores [b, heads, t, s] stay split on heads
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->op == OP_SOFTMAX) cr_assert_eq(n->place.axis[1], axis_of(g, "model"));
  }
}

// keras-hub's Llama map splits query/key/value's contracted hidden dim over
// 'model': it trains (mesh_equiv.sh), and the report says what it costs and,
// where the heads divide, names the cheaper layout (Gemma's).
Test(report, llama_map_warns_of_its_all_reduces) {
  Graph *g = compile("models/llama.json", "tests/good/llama_hub.dist.json", NULL, 16);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  print_report(g, f, false);
  fclose(f);
  cr_assert(strstr(text, "warning: layer 'attn': attn/query/kernel ('model', 'batch', None) "
                         "splits its contracted dim 0 over 'model', so every use ends in a "
                         "reduction of its result over it (4096 bytes per device); ('batch', "
                         "'model', None) would need none\n"), "%s", text);
  cr_assert(strstr(text, "attn/key/kernel ('model', 'batch', None) splits its contracted dim 0"));
  Graph *m = compile("models/gpt.json", "models/gpt.dist.json", NULL, 16);
  f = open_memstream(&text, &len);
  print_report(m, f, false);
  fclose(f);
  cr_assert(!strstr(text, "warning:"), "Megatron's map costs nothing avoidable: %s", text);
}

// Only the second call of a shared layer feeds the output (the first is
// dropped): that call makes the variables (a fuzzing find: it was an
// internal error).
Test(shard, shared_layer_second_call_alone) {
  Graph *g = compile("tests/good/shared_second_call.json", NULL, NULL, 8);
  cr_assert_eq(g->nvars, 2);
  cr_assert_str_eq(g->vars[0]->path, "d/kernel");
  cr_assert_str_eq(g->vars[1]->path, "d/bias");
}

// issue 11: global_clipnorm's norm is over every shard of every gradient:
// the data-parallel gradients are summed first (one all-reduce each, as
// without clipping), the split ones' sums of squares are one partial sum
// over 'model', all-reduced once (a scalar), and every update reads the
// one factor.
Test(shard, global_clipnorm_one_scalar_all_reduce) {
  Graph *g = compile("tests/good/opt_adam_amsgrad.json", "tests/good/opt.dist.json", NULL, 16);
  unsigned data = 1u << axis_of(g, "data"), model = 1u << axis_of(g, "model");
  cr_assert_eq(count(g, OP_ALLREDUCE, model, PH_UPDATE), 1);
  cr_assert_eq(count(g, OP_ALLREDUCE, data, PH_UPDATE), g->nvars);
  Node *f = NULL;
  for (int i = 0; i < g->nnodes; i++) {
    Node *u = g->nodes[i];
    if (u->op == OP_GRAD_CLIP) {
      cr_assert_null(f, "one clipping factor");
      f = u;
      cr_assert_eq(u->in[0]->op, OP_ADD); // replicated + partial, summed
    }
    if (u->op != OP_UPDATE) continue;
    cr_assert_eq(u->nin, 3, "%s: no clipping factor", u->name);
    cr_assert_eq(u->in[2], f);
    cr_assert_eq(u->var->nslots, 3); // amsgrad's velocity_hat
  }
  cr_assert_not_null(f);
  // the data all-reduces of the gradients come before the norm (bucketed)
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->op == OP_ALLREDUCE && g->nodes[i]->coll.axes == model &&
        g->nodes[i]->phase == PH_UPDATE)
      for (int j = i; j < g->nnodes; j++)
        cr_assert(!(g->nodes[j]->op == OP_ALLREDUCE && g->nodes[j]->coll.axes == data &&
                    g->nodes[j]->phase == PH_UPDATE));
}

Test(report, names_the_optimizer) {
  Graph *g = compile("tests/good/opt_nadam_global.json", "tests/good/opt.dist.json", NULL, 16);
  char *text;
  size_t len;
  FILE *f = open_memstream(&text, &len);
  print_report(g, f, false);
  fclose(f);
  cr_assert_not_null(strstr(text, "\noptimizer Nadam (nadam), learning rate CosineDecay, "
                                  "global_clipnorm 0.1, weight_decay 0.01\n"), "%s", text);
  cr_assert_not_null(strstr(text, "[update] %35 add global_norm is a partial sum over 'model'"),
                     "%s", text);
}

// issue 15: a grouped conv is one op whose groups split over an axis that
// divides their count, each device convolving its own with no collective
// (the depthwise convs' 8 and 16 over model=2 or 4, the grouped conv's 2 over
// model=2), and whose channels are gathered where the axis does not (the
// grouped conv's 2 over model=4).
Test(shard, grouped_conv_splits_on_group_boundaries) {
  const char *meshes[] = {"data=4,model=2", "data=2,model=4"};
  for (int t = 0; t < 2; t++) {
    Graph *g = compile("tests/gradcheck/grouped.json", "tests/good/grouped.dist.json", meshes[t], 16);
    int model = axis_of(g, "model"), convs = 0;
    for (int i = 0; i < g->nnodes; i++) {
      Node *n = g->nodes[i];
      if (n->op != OP_CONV2D || n->win.groups < 2) continue;
      convs++;
      bool split = n->win.groups % g->dist->mesh.shape[model] == 0;
      cr_expect_eq(n->place.axis[3], split ? model : -1, "%s: groups=%d: y's channels", meshes[t],
                   n->win.groups);
      cr_expect_eq(n->in[1]->place.axis[3], split ? model : -1, "%s: groups=%d: the filter's",
                   meshes[t], n->win.groups);
      cr_expect(!split || n->in[1]->op != OP_ALLGATHER, "%s: groups=%d: filter gathered",
                meshes[t], n->win.groups);
    }
    cr_expect_eq(convs, 3, "%s: one conv per grouped layer", meshes[t]);
  }
}
