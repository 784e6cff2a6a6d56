// What a person (or a program) reads before anything runs: every
// variable's layout and local shape, every collective with why it is there
// and what it moves, memory per device; and the sharded graph as text.
#include "kdcc.h"

#include <string.h>

static const char *phase_name[] = {"forward", "loss", "backward", "update", "constraints"};

// An all-gather or all-to-all whose result is at least this big is a large
// tensor made whole on every device: the report says so.
#define LARGE_RESHARD (1 << 20)

static char *large_reshard(const Graph *g, const Node *n) {
  if (n->op != OP_ALLGATHER) return NULL;
  Shape s = local_shape(g, n);
  int64_t bytes = size_mul(shape_elems(&s), 4);
  if (bytes < LARGE_RESHARD) return NULL;
  return format("layer '%s': %s is gathered whole over '%s' (%lld bytes per device); a layout "
                "that keeps it split would avoid this",
                n->layer ? n->layer : "?", n->name ? n->name : "a value",
                g->dist->mesh.names[__builtin_ctz(n->coll.axes)], (long long)bytes);
}

// A weight whose contracted dim is split over an axis its input is not
// split over (keras-hub's Llama map splits query/key/value's hidden dim
// over 'model'): the input is sliced for free, but every use then ends in
// an all-reduce of the result over that axis, which splitting one of the
// weight's output dims instead would not need. n: a forward all-reduce.
static char *avoidable_all_reduce(const Graph *g, const Node *n) {
  if ((n->op != OP_ALLREDUCE && n->op != OP_REDUCE_SCATTER) || n->phase != PH_FORWARD ||
      !n->coll.src)
    return NULL;
  const Node *d = n->coll.src;
  if (d->op != OP_DOT || d->dot.nb) return NULL;
  const Node *x = d->in[0], *w = d->in[1];
  while (is_collective(w->op)) w = w->in[0];
  // the input's split came from a free slice of a replicated value, through
  // elementwise ops (a Megatron row-parallel input comes from a projection)
  for (int hops = 0; hops < 8 && x->op != OP_LOCAL_SLICE; hops++) {
    OpKind k = x->op;
    if (k != OP_COL_MUL && k != OP_BIAS && k != OP_BIAS_ACT && k != OP_ACT && k != OP_SCALE &&
        k != OP_DROPOUT && k != OP_RESHAPE && k != OP_MUL)
      return NULL;
    x = x->in[0];
  }
  if (w->op != OP_PARAM || x->op != OP_LOCAL_SLICE || !(x->coll.axes & n->coll.axes))
    return NULL;
  int a = __builtin_ctz(x->coll.axes & n->coll.axes), nk = d->dot.nk;
  const Var *v = w->var;
  Place better = v->place;
  int from = -1, to = -1;
  // the hint: the axis on the first output dim, if it divides it, swapped with what
  // was there (keras-hub's Gemma map: (batch, model, None) for Llama's
  // (model, batch, None))
  for (int k = 0; k < v->shape.rank; k++) {
    bool contracted = d->dot.tb ? k >= v->shape.rank - nk : k < nk;
    if (contracted && better.axis[k] == a) from = k;
    if (!contracted && to == -1) to = v->shape.d[k] % axis_size(g, a) == 0 ? k : -2;
  }
  if (from < 0) return NULL;
  char *hint = xstrdup("");
  if (to >= 0 && (better.axis[to] < 0 || v->shape.d[from] % axis_size(g, better.axis[to]) == 0)) {
    better.axis[from] = better.axis[to];
    better.axis[to] = a;
    hint = format("; %s would need none", place_str(&g->dist->mesh, v->shape.rank, &better));
  }
  Shape ls = local_shape(g, n);
  return format("layer '%s': %s %s splits its contracted dim %d over '%s', so every use ends in "
                "a reduction of its result over it (%lld bytes per device)%s",
                n->layer ? n->layer : "?", v->path,
                place_str(&g->dist->mesh, v->shape.rank, &v->place), from,
                g->dist->mesh.names[a], (long long)(shape_elems(&ls) * 4), hint);
}

// Every warning the report gives about node n, or NULL.
static char *warning(const Graph *g, const Node *n) {
  char *w = large_reshard(g, n);
  return w ? w : avoidable_all_reduce(g, n);
}

// Keras's names for a variable's optimizer slots, in kdcc's slot order:
// "<optimizer>/<path with / as _>_<slot>".
static json_t *slots_json(const Graph *g, const Var *v) {
  json_t *a = json_array();
  char *flat = xstrdup(v->path);
  for (char *p = flat; *p; p++)
    if (*p == '/') *p = '_';
  for (int k = 0; k < v->nslots; k++)
    json_array_append_new(a, json_string(format("%s/%s_%s", g->model->opt.name, flat,
                                                opt_slot_name(&g->model->opt, k))));
  return a;
}

// The optimizer as kdcc understood it: "Adam (adam), learning rate
// CosineDecay, global_clipnorm 0.1, weight_decay 0.01".
static char *optimizer_text(const Optimizer *o) {
  char *t = o->schedule ? format("%s (%s), learning rate %s", o->cls, o->name,
                                 schedule_class(o->schedule->kind))
                        : format("%s (%s), learning rate %g", o->cls, o->name, o->lr);
  const char *flags[] = {o->amsgrad ? "amsgrad" : NULL, o->centered ? "centered" : NULL,
                         o->nesterov ? "nesterov" : NULL};
  for (int i = 0; i < 3; i++)
    if (flags[i]) t = format("%s, %s", t, flags[i]);
  const char *keys[] = {"clipnorm", "global_clipnorm", "clipvalue", "weight_decay"};
  const float vals[] = {o->clipnorm, o->global_clipnorm, o->clipvalue, o->weight_decay};
  for (int i = 0; i < 4; i++)
    if (vals[i] != 0) t = format("%s, %s %g", t, keys[i], vals[i]);
  if (o->loss_scale) // issue 23
    t = format("%s, in a LossScaleOptimizer (initial_scale %g, dynamic_growth_steps %lld; %s)",
               t, o->loss_scale, (long long)o->growth_steps, o->loss_scale_why);
  return t;
}

static json_t *layout_json(const Graph *g, int rank, const Place *p) {
  json_t *a = json_array();
  for (int d = 0; d < rank; d++)
    json_array_append_new(a, p->axis[d] < 0 ? json_null()
                                            : json_string(g->dist->mesh.names[p->axis[d]]));
  return a;
}

static json_t *shape_json(const Shape *s) {
  json_t *a = json_array();
  for (int d = 0; d < s->rank; d++) json_array_append_new(a, json_integer(s->d[d]));
  return a;
}

static json_t *axes_json(const Graph *g, unsigned axes) {
  json_t *a = json_array();
  for (int i = 0; i < g->dist->mesh.ndim; i++)
    if ((axes >> i) & 1) json_array_append_new(a, json_string(g->dist->mesh.names[i]));
  return a;
}

typedef struct {
  int64_t params, grads, slots, activations, widened16, gpu_scratch, sent, total; // bytes
} Totals;

static Totals totals(const Graph *g) {
  Totals t = {0};
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    Shape s = local_shape(g, v->param);
    int64_t bytes = size_mul(shape_elems(&s), 4);
    // issue 23: a variable kept in 16 bits (store16.c's var16) and its slots: 2 bytes each
    int64_t kept = v->param->dtype == DT_U16 ? bytes / 2 : bytes;
    t.params = size_add(t.params, kept);
    t.slots = size_add(t.slots, size_mul(kept, v->nslots));
    if (v->grad) t.grads = size_add(t.grads, bytes);
  }
  t.activations = size_mul(g->arena_floats, 4);
  t.widened16 = size_mul(g->widen16_floats, 4); // issue 23: kdrt_matmul16's buffer
  for (int i = 0; i < g->nnodes; i++)
    if (is_collective(g->nodes[i]->op)) t.sent = size_add(t.sent, coll_sent(g, g->nodes[i]));
  t.gpu_scratch = g->gpu_scratch; // issue 22: the GPU's products' scratch
  t.total = size_add(size_add(size_add(t.params, t.grads), t.gpu_scratch),
                     size_add(t.slots, size_add(t.activations, t.widened16)));
  return t;
}

static const char *dist_name(const Dist *d) {
  return d->kind == DIST_DATA ? "DataParallel" : d->kind == DIST_MODEL ? "ModelParallel" : "none";
}

static void report_json(Graph *g, FILE *out) {
  const Mesh *m = &g->dist->mesh;
  json_t *root = json_object();
  json_object_set_new(root, "model", json_string(g->model->name));
  json_object_set_new(root, "distribution", json_string(dist_name(g->dist)));
  json_t *mesh = json_object(), *shape = json_array(), *names = json_array();
  for (int a = 0; a < m->ndim; a++) {
    json_array_append_new(shape, json_integer(m->shape[a]));
    json_array_append_new(names, json_string(m->names[a]));
  }
  json_object_set_new(mesh, "shape", shape);
  json_object_set_new(mesh, "axis_names", names);
  json_object_set_new(root, "mesh", mesh);
  json_object_set_new(root, "batch", json_integer(g->batch));
  json_object_set_new(root, "optimizer", json_string(optimizer_text(&g->model->opt)));

  json_t *vars = json_array();
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    Shape ls = local_shape(g, v->param);
    json_array_append_new(vars, json_pack("{s:s, s:o, s:o, s:o, s:o, s:b}", "path", v->path,
                                          "global_shape", shape_json(&v->shape), "layout",
                                          layout_json(g, v->shape.rank, &v->place), "local_shape",
                                          shape_json(&ls), "optimizer_slots", slots_json(g, v),
                                          "trainable", !v->frozen && !v->ema_stat));
  }
  json_object_set_new(root, "variables", vars);

  json_t *colls = json_array();
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (!is_collective(n->op)) continue;
    json_t *c = json_pack("{s:s, s:o, s:I, s:I, s:s, s:s, s:s}", "kind", op_info(n->op).name,
                          "axes", axes_json(g, n->coll.axes), "bytes", (json_int_t)coll_bytes(g, n),
                          "sent", (json_int_t)coll_sent(g, n), "reason", coll_why(g, n), "tensor",
                          n->name ? n->name : "", "phase", phase_name[n->phase]);
    if (n->coll.dim >= 0) json_object_set_new(c, "dim", json_integer(n->coll.dim));
    if (n->layer) json_object_set_new(c, "layer", json_string(n->layer));
    json_array_append_new(colls, c);
  }
  json_object_set_new(root, "collectives", colls);

  Totals t = totals(g);
  json_object_set_new(root, "memory",
                      json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "parameters",
                                (json_int_t)t.params, "gradients", (json_int_t)t.grads,
                                "optimizer_state", (json_int_t)t.slots, "activations_peak",
                                (json_int_t)t.activations, "activations_per_sample",
                                (json_int_t)(t.activations / g->batch), "total",
                                (json_int_t)t.total));
  if (t.widened16) // issue 23: the CPU's 16-bit products' operands widened to float32
    json_object_set_new(json_object_get(root, "memory"), "widened_16bit_operands",
                        json_integer(t.widened16));
  if (t.gpu_scratch) // issue 22: the GPU's products' operands and padded results
    json_object_set_new(json_object_get(root, "memory"), "gpu_product_scratch",
                        json_integer(t.gpu_scratch));
  json_object_set_new(root, "comm_bytes_per_step", json_integer(t.sent));
  json_t *warn = json_array();
  for (int i = 0; i < g->nnodes; i++) {
    char *w = warning(g, g->nodes[i]);
    if (w) json_array_append_new(warn, json_string(w));
  }
  json_object_set_new(root, "warnings", warn);
  json_dumpf(root, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  fputc('\n', out);
  json_decref(root);
}

static char *human(int64_t b) {
  if (b < 10 * 1024) return format("%lld B", (long long)b);
  if (b < 10 * 1024 * 1024) return format("%.1f KiB", b / 1024.0);
  return format("%.1f MiB", b / 1048576.0);
}

static char *mesh_text(const Mesh *m) {
  char *s = "(";
  for (int a = 0; a < m->ndim; a++)
    s = format("%s%s%s=%d", s, a ? ", " : "", m->names[a], m->shape[a]);
  return format("%s)", s);
}

void print_report(Graph *g, FILE *out, bool json) {
  if (json) {
    report_json(g, out);
    return;
  }
  const Mesh *m = &g->dist->mesh;
  fprintf(out, "model '%s', %s on mesh %s, %d device%s, global batch %d\noptimizer %s\n\n",
          g->model->name, dist_name(g->dist), mesh_text(m), m->size, m->size == 1 ? "" : "s",
          g->batch, optimizer_text(&g->model->opt));
  bool any16 = false, kept16 = false, wide16 = false; // issue 23
  for (int i = 0; i < g->nvars; i++) {
    any16 |= g->vars[i]->vdt != 0;
    kept16 |= g->vars[i]->param->dtype == DT_U16;
    wide16 |= g->vars[i]->vdt && g->vars[i]->param->dtype != DT_U16;
  }
  fprintf(out,
          "Variables (optimizer slots take their variable's layout%s)\n  %-32s %-14s %-22s %s\n",
          !any16    ? ""
          : !kept16 ? "; a bfloat16 or float16 one and its slots hold its type's values in "
                      "float32 buffers"
          : !wide16 ? "; a bfloat16 or float16 one and its slots are kept in its type's 2 bytes"
                    : "; a bfloat16 or float16 one and its slots are kept in its type's 2 bytes, "
                      "a moving statistic its type's values in a float32 buffer",
          "path", "global", "layout", "local");
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    Shape ls = local_shape(g, v->param);
    fprintf(out, "  %-32s %-14s %-22s %s%s%s\n", v->path, shape_str(&v->shape),
            place_str(m, v->shape.rank, &v->place), shape_str(&ls),
            v->frozen ? "  frozen (trainable false)" : "",
            // issue 23: its values (and its slots') are 16-bit ones, its buffers float32
            !v->vdt ? "" : v->vdt == KDRT_ROUND_BF16 ? "  bfloat16" : "  float16");
  }
  fprintf(out, "\nCollectives per step, per device\n  %-14s %-8s %10s %10s  %s\n", "kind",
          "axes", "buffer", "sent", "why");
  int nc = 0;
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (!is_collective(n->op)) continue;
    nc++;
    fprintf(out, "  %-14s %-8s %10s %10s  [%s] %s\n", op_info(n->op).name, axes_str(g, n->coll.axes),
            human(coll_bytes(g, n)), human(coll_sent(g, n)), phase_name[n->phase], coll_why(g, n));
  }
  if (!nc) fprintf(out, "  (none)\n");
  Totals t = totals(g);
  fprintf(out, "\nMemory per device\n");
  fprintf(out, "  parameters        %12s\n", human(t.params));
  fprintf(out, "  gradients         %12s\n", human(t.grads));
  fprintf(out, "  optimizer state   %12s\n", human(t.slots));
  fprintf(out, "  peak activations  %12s\n", human(t.activations));
  if (t.widened16) // issue 23: kdrt_matmul16's buffer (memplan.c's widen_floats)
    fprintf(out, "  widened operands  %12s  (16-bit products' operands in float32, on a CPU\n"
                 "                                 without bfloat16 products)\n",
            human(t.widened16));
  if (t.gpu_scratch) // issue 22: memplan.c's gpu_product_scratch
    fprintf(out, "  product scratch   %12s  (the GPU's products: 16-bit operands, rows\n"
                 "                                 packed or padded to 16 bytes)\n",
            human(t.gpu_scratch));
  fprintf(out, "  total             %12s\n", human(t.total));
  fprintf(out, "  activations grow about %s per sample of the global batch (./train\n"
               "  --batch-size B: about B times that; the figures above are for %d)\n",
          human(t.activations / g->batch), g->batch);
  fprintf(out, "\nBytes sent per step, per device: %lld\n", (long long)t.sent);
  for (int i = 0; i < g->nnodes; i++) {
    char *w = warning(g, g->nodes[i]);
    if (w) fprintf(out, "warning: %s\n", w);
  }
}

// ---- --max-memory

static char *bytes_text(int64_t b) {
  if (b < (INT64_C(10) << 30)) return human(b);
  return format("%.1f GiB", b / 1073741824.0);
}

void check_memory(Graph *g, int64_t limit, const char *limit_text) {
  Totals t = totals(g);
  if (t.total <= limit) return;
  // The three largest tensors of a device: a variable with its gradient and
  // optimizer slots, or an activation.
  const Node *top[3] = {NULL};
  int64_t top_bytes[3] = {0};
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    if (view_of(n) || (n->region != REGION_PARAM && n->region != REGION_ARENA)) continue;
    Shape ls = local_shape(g, n);
    int64_t b = size_mul(shape_elems(&ls), n->dtype == DT_U16 ? 2 : 4); // issue 23: 16 bits
    if (n->op == OP_PARAM) // (issue 23: a gradient float32, a variable kept in 16 bits or not)
      b = size_add(size_mul(b, 1 + n->var->nslots),
                   n->var->grad ? size_mul(shape_elems(&ls), 4) : 0);
    for (int k = 0; k < 3; k++)
      if (b > top_bytes[k]) {
        for (int j = 2; j > k; j--) top[j] = top[j - 1], top_bytes[j] = top_bytes[j - 1];
        top[k] = n, top_bytes[k] = b;
        break;
      }
  }
  char *list = "";
  for (int k = 0; k < 3 && top[k]; k++) {
    const Node *n = top[k];
    list = format("%s%s%s %s (layer '%s'%s): %s", list, k ? ", " : "",
                  n->op == OP_PARAM ? n->name : format("%%%d %s", n->id, op_info(n->op).name),
                  shape_str(&n->shape), n->layer ? n->layer : "?",
                  n->op == OP_PARAM ? ", with its gradient and optimizer state" : "",
                  bytes_text(top_bytes[k]));
  }
  char *more = t.gpu_scratch ? format(", the GPU's product scratch %s", bytes_text(t.gpu_scratch))
                : t.widened16  ? format(", widened operands %s", bytes_text(t.widened16))
                               : "";
  error_at(top[0] ? top[0]->loc : (Loc){0}, "one device needs %s (parameters %s, gradients %s, "
           "optimizer state %s, peak activations %s%s), more than %s; the largest tensors: %s",
           bytes_text(t.total), bytes_text(t.params), bytes_text(t.grads), bytes_text(t.slots),
           bytes_text(t.activations), more, limit_text, list);
}

void print_graph(Graph *g, FILE *out) {
  const Mesh *m = &g->dist->mesh;
  fprintf(out, "# sharded training graph of '%s' on mesh %s, global batch %d\n", g->model->name,
          mesh_text(m), g->batch);
  Phase ph = -1;
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->phase != ph) fprintf(out, "\n# %s\n", phase_name[ph = n->phase]);
    char *args = "", *extra = "";
    for (int k = 0; k < n->nin; k++) args = format("%s%s%%%d", args, k ? ", " : "", n->in[k]->id);
    if (n->op == OP_ACT || n->op == OP_ACT_GRAD || n->op == OP_BIAS_ACT)
      extra = format(" %s", act_name(n->act.kind));
    if (n->op == OP_DOT && (n->dot.ta || n->dot.tb || n->dot.nb || n->dot.nk != 1))
      extra = format(" %s%s batch %d contract %d", n->dot.ta ? "T" : "N", n->dot.tb ? "T" : "N",
                     n->dot.nb, n->dot.nk);
    if (is_collective(n->op))
      extra = format(" over %s%s", axes_str(g, n->coll.axes),
                     n->coll.dim >= 0 ? format(" dim %d", n->coll.dim) : "");
    Shape ls = local_shape(g, n);
    fprintf(out, "%%%-3d = %s%s(%s)  %s %s", n->id, op_info(n->op).name, extra, args,
            shape_str(&n->shape), place_str(m, n->shape.rank, &n->place));
    fprintf(out, " local %s", shape_str(&ls));
    if (n->inplace) fprintf(out, " in place of %%%d", view_of(n)->id); // issue 23
    if (n->name) fprintf(out, "  # %s", n->name);
    else if (n->layer) fprintf(out, "  # %s", n->layer);
    fputc('\n', out);
  }
}
