// Graph building: layers -> the forward graph, the loss and the metrics.
//
// build_graph builds every layer in the model's order by the table
// (layers.c), checks each tensor against kdcc's limits and names the
// layer's nodes; `<layer>/output` keys of the LayoutMap become fixed
// placements (constraints) on the layer's output node. Then each output's
// loss and metrics are made, Keras's way (a loss averaged over every row of
// the global batch), and summed with the regularizers' penalties into
// "loss". Invariants: g->nodes is in topological order; nothing computes here.
#include "graph_build.h"

#include <string.h>

bool opt_sample_weight;

// A loss or metric node of op on args[nin], then the sample weights where
// it is weighted and there are some (Keras's sample_weight: the LABEL of
// the losses' rows, g->sample_weight; LossAttr.weighted).
static Node *loss_node(Graph *g, OpKind op, int nin, Node **args, bool weighted) {
  Node *a[MAX_IN];
  memcpy(a, args, sizeof *a * (size_t)nin);
  weighted = weighted && g->sample_weight;
  if (weighted) a[nin++] = g->sample_weight;
  return op_make(g, op, nin, a, &(Node){.loss.weighted = weighted});
}

// or 1: the test is over the global batch (a max over its rows).
static Node *not_binary(Graph *g, Node *y, const char *layer, Loc loc) {
  Node *nb = make1(g, OP_NOT_BINARY, y);
  nb->name = format("%s not 0/1", y->name);
  nb->layer = layer;
  nb->loc = loc;
  return nb;
}

// Metric mt of output i (prediction p, labels y), logged under its name:
// an accuracy is a METRIC (XENT_ACC from the row maxima of a crossentropy
// from logits); a loss function as a metric is a LOSS node marked metric,
// never differentiated nor in the total. "accuracy" resolves as Keras
// does: binary for one output unit, sparse categorical for class-id
// labels, categorical otherwise. The labels are the loss's, so a metric
// that needs the other kind is an error.
static void build_metric(Graph *g, int i, const Metric *mt, Node *p, Node *y, Node *rowmax,
                         int64_t rows, const char *prefix) {
  const OutLoss *ol = &g->model->losses[i];
  const char *out = g->model->outputs[i].layer->name;
  bool sparse = ol->kind == LOSS_SCCE;
  int64_t units = p->shape.d[p->shape.rank - 1];
  MetricKind k = mt->kind;
  if (k == MET_ACCURACY) k = units == 1 ? MET_BINARY_ACC : sparse ? MET_SPARSE_ACC : MET_CAT_ACC;
  bool wants_sparse = k == MET_SPARSE_ACC || (k == MET_LOSS && mt->loss == LOSS_SCCE);
  if (wants_sparse != sparse)
    error_at(mt->loc, "metric '%s' of output '%s' needs %s, but its loss '%s' takes %s", mt->name,
             out, wants_sparse ? "class-id labels" : "labels shaped like the output",
             loss_name(ol->kind), sparse ? "class ids" : "labels shaped like the output");
  if (k == MET_BINARY_ACC && units != 1)
    error_at(mt->loc, "metric '%s' of output '%s': binary accuracy over %lld units is not "
             "supported (only one)", mt->name, out, (long long)units);
  LossAttr la = {.from_logits = ol->from_logits, .weight = 1.0 / (double)rows, .num = 1, .lw = 1};
  Node *n;
  if (k == MET_LOSS) {
    Node *args[3] = {p, y, NULL};
    if (mt->loss == LOSS_HINGE || mt->loss == LOSS_SQUARED_HINGE)
      args[2] = not_binary(g, y, out, mt->loc);
    n = loss_node(g, OP_LOSS, args[2] ? 3 : 2, args, mt->weighted);
    la.kind = mt->loss;
    la.from_logits = mt->from_logits;
    la.metric = true;
  } else if (k == MET_SPARSE_ACC && rowmax) {
    Node *args[3] = {p, y, rowmax};
    n = loss_node(g, OP_XENT_ACC, 3, args, mt->weighted);
    la.kind = LOSS_SCCE;
  } else {
    n = loss_node(g, OP_METRIC, 2, (Node *[]){p, y}, mt->weighted);
    la.kind = k == MET_BINARY_ACC ? LOSS_BCE : k == MET_SPARSE_ACC ? LOSS_SCCE : LOSS_CCE;
  }
  la.weighted = n->loss.weighted;
  n->loss = la;
  n->index = i;
  n->loc = mt->loc;
  n->layer = out;
  n->name = format("%s%s", prefix, mt->name);
  for (int j = 0; j < g->nlogs; j++)
    if (!strcmp(g->logs[j].name, n->name))
      error_at(mt->loc, "metric '%s' of output '%s' would be logged as '%s', a name another log "
               "has", mt->name, out, n->name);
  g->logs = xgrow(g->logs, g->nlogs, &(int){g->nlogs}, sizeof *g->logs);
  g->logs[g->nlogs++] = (Log){n->name, n, la.weighted};
}

// The loss, metric and label of output i (prediction p), and their logs.
// Keras averages a loss over every row (each sample, or each token of a
// [b, t, classes] prediction): each op's weight is one over the global
// number of rows. An output's own log is its unweighted loss, as Keras
// logs it; the total ("loss") weighs each by its loss weight. A sparse crossentropy from logits is made of
// row statistics (ops.c's XENT), so that a split class dim is never
// gathered.
static void build_loss(Graph *g, int i, Node *p, const char *prefix) {
  const OutLoss *ol = &g->model->losses[i];
  const Layer *out = g->model->outputs[i].layer;
  // a loss kdcc defaults (no compile_config) is written nowhere: the output's layer
  Loc at = ol->loc.file ? ol->loc : out->loc;
  if (p->dtype != DT_F32)
    error_at(at, "output '%s' holds integer ids: it cannot have a loss%s", out->name,
             ol->loc.file ? "" : " (the default loss: the model has no compile_config)");
  Shape ys = p->shape;
  if (ol->kind == LOSS_SCCE) ys.rank--;
  if (ys.rank == 0) error_at(at, "output '%s': a sparse loss needs a class dim", out->name);
  Node *y = new_node(g, OP_LABEL, 0, NULL);
  y->shape = ys;
  y->index = g->nlabels;
  y->name = g->model->noutputs == 1 ? "labels" : format("labels(%s)", out->name);
  y->has_want = true;
  y->want = place_replicated();
  y->want.axis[0] = g->dist->batch_axis;
  g->labels = xgrow(g->labels, g->nlabels, &(int){g->nlabels}, sizeof *g->labels);
  g->labels[g->nlabels++] = y;

  int64_t rows = p->shape.rank > 1 ? shape_elems(&p->shape) / p->shape.d[p->shape.rank - 1]
                                   : p->shape.d[0];
  LossAttr la = {ol->kind, ol->from_logits, ol->param, .weight = 1.0 / (double)rows, .num = 1,
                 .lw = ol->weight};
  // issue 11: a loss's axis is the last one (the only one kdcc reduces over)
  if (ol->axis != -1 && ol->axis != p->shape.rank - 1)
    error_at(ol->axis_loc, "loss '%s' of output '%s': axis %d is not supported (only the last "
             "axis, -1)", loss_name(ol->kind), out->name, ol->axis);
  // label_smoothing, as Keras smooths the labels before the loss:
  // categorical y (1 - s) + s / classes, binary y (1 - s) + s / 2 (the
  // metric sees the labels as they are)
  Node *yl = y;
  if (ol->label_smoothing != 0) {
    float ls = (float)ol->label_smoothing;
    yl = make1(g, OP_SCALE, y);
    yl->aff = (AffAttr){(float)(1.0 - ol->label_smoothing),
                        ol->kind == LOSS_CCE ? ls / (float)ys.d[ys.rank - 1]
                                             : (float)(0.5 * ol->label_smoothing), NULL};
    yl->name = format("%s, smoothed", y->name);
  }
  Node *loss, *rowmax = NULL;
  bool xent = ol->kind == LOSS_SCCE && ol->from_logits;
  if (xent) { // row statistics, then the loss from them
    Node *m = rowmax = make1(g, OP_ROW_MAX, p);
    Node *s = make2(g, OP_ROW_SUMEXP, p, m);
    m->layer = s->layer = out->name;
    m->loc = s->loc = at;
    Node *args[4] = {p, y, m, s};
    loss = loss_node(g, OP_XENT, 4, args, true);
  } else {
    Node *args[3] = {p, yl, NULL};
    if (ol->kind == LOSS_HINGE || ol->kind == LOSS_SQUARED_HINGE)
      args[2] = not_binary(g, y, out->name, at);
    loss = loss_node(g, OP_LOSS, args[2] ? 3 : 2, args, true);
  }
  la.weighted = loss->loss.weighted;
  loss->loss = la;
  loss->index = i;
  loss->loc = at;
  loss->layer = out->name;
  loss->name = format("%sloss", prefix);
  g->logs = xgrow(g->logs, g->nlogs, &(int){g->nlogs}, sizeof *g->logs);
  g->logs[g->nlogs++] = (Log){loss->name, loss, false};
  for (int k = 0; k < ol->nmetrics; k++)
    build_metric(g, i, &ol->metrics[k], p, y, rowmax, rows, prefix);
}

// kdcc --sample-weight: Keras's sample_weight, one weight a row of the
// losses (a sample's, or a token's of a [b, t, classes] output), a LABEL
// split along the batch as the labels are, after them. Every output with a
// loss must have the same rows (./train broadcasts a weight a sample over
// a sample's tokens).
static void sample_weights(Graph *g) {
  const Model *m = g->model;
  Shape rs = {0};
  const char *first = NULL;
  int nl = 0;
  for (int i = 0; i < m->noutputs; i++) {
    if (!m->losses[i].has) continue;
    nl++;
    const Shape *p = &g->outputs[i]->shape;
    Shape r = *p;
    if (r.rank > 1) r.rank--;
    if (!first) rs = r, first = m->outputs[i].layer->name;
    else if (!shape_eq(&r, &rs))
      error_at(m->losses[i].loc, "--sample-weight: output '%s' has rows %s, output '%s' %s: "
               "one sample weight a row needs the same rows", m->outputs[i].layer->name,
               shape_str(&r), first, shape_str(&rs));
  }
  if (!nl) return;
  Node *w = new_node(g, OP_LABEL, 0, NULL);
  w->shape = rs;
  w->index = nl; // after the outputs' labels
  w->name = "sample_weight";
  w->loss.weighted = true;
  w->has_want = true;
  w->want = place_replicated();
  w->want.axis[0] = g->dist->batch_axis;
  g->sample_weight = w;
}

Graph *build_graph(Model *m, Dist *d, int batch) {
  Graph *g = xcalloc(1, sizeof *g);
  g->model = m;
  g->dist = d;
  g->batch = batch;
  g->phase = PH_FORWARD;
  int ba = d->batch_axis;
  if (ba >= 0 && batch % d->mesh.shape[ba]) // at the axis's size (none: --mesh gave it)
    error_at(d->mesh.size_loc[ba], "batch size %d is not divisible by mesh axis '%s' (size %d%s),"
             " which splits the batch; use a --batch-size that is a multiple of %d", batch,
             d->mesh.names[ba], d->mesh.shape[ba], d->mesh.size_loc[ba].file ? "" : ", from --mesh",
             d->mesh.shape[ba]);

  const char **outs = xcalloc(m->nlayers, sizeof *outs);
  for (int i = 0; i < m->nlayers; i++) {
    Layer *l = m->layers[i];
    int first = g->nnodes;
    Node *y = build_layer(g, l);
    if (l->cls && strcmp(l->cls, "InputLayer")) activity_penalty(g, l, y);
    for (int k = first; k < g->nnodes; k++) { // every tensor within the limits (kdcc.h)
      const Shape *s = &g->nodes[k]->shape;
      for (int j = 0; j < s->rank; j++)
        if (s->d[j] > MAX_DIM)
          error_at(l->loc, "layer '%s': a tensor of shape %s: dimension %d is over %d, the most "
                   "kdcc supports", l->name, shape_str(s), j, MAX_DIM);
      if (shape_elems(s) > MAX_ELEMS)
        error_at(l->loc, "layer '%s': a tensor of shape %s (batch %d) holds more than 2^40 "
                 "elements, the most a tensor may hold", l->name, shape_str(s), batch);
    }
    for (int k = first; k < g->nnodes; k++) // name the layer's own nodes
      if (!g->nodes[k]->layer || g->nodes[k]->op != OP_PARAM) {
        g->nodes[k]->layer = l->name;
        g->nodes[k]->loc = l->loc;
      }
    if (y->op != OP_PARAM && (y->id >= first || y->op == OP_INPUT)) {
      y->name = format("%s/output", l->path);
      outs[i] = y->name;
      Place p;
      if (dist_lookup(d, y->name, l->name, y->shape.rank, y->shape.d, &p)) {
        y->has_want = true;
        y->want = p;
      }
    }
    l->node = y;
  }
  for (int i = 0; i < m->nbound; i++) { // what a nested model is called on: its inputs' shapes
    Layer *in = m->bound[i];
    const Node *given = in->bound->layer->node;
    if (!given) continue; // what feeds it was never built: no output reads this input
    const Shape *s = &given->shape;
    bool fits = s->rank == in->in_rank + 1;
    for (int j = 0; fits && j < in->in_rank; j++) fits = s->d[j + 1] == in->in_shape[j];
    if (!fits) {
      Shape want = {.rank = in->in_rank + 1, .d = {s->d[0]}};
      memcpy(want.d + 1, in->in_shape, sizeof(int64_t) * (size_t)in->in_rank);
      error_at(in->bound->loc, "nested model input '%s' has shape %s, but is given %s", in->name,
               kshape(&want), kshape(s));
    }
  }

  // inputs and labels are split along the batch over the batch axis
  g->inputs = xcalloc(m->ninputs, sizeof *g->inputs);
  for (int i = 0; i < m->ninputs; i++) {
    Node *x = m->inputs[i]->node;
    x->index = i;
    x->name = m->ninputs == 1 ? "input" : format("input(%s)", m->inputs[i]->name);
    x->has_want = true;
    x->want = place_replicated();
    x->want.axis[0] = d->batch_axis;
    g->inputs[g->ninputs++] = x;
  }
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->op == OP_INPUT && g->nodes[i]->index < 0)
      error_at(g->nodes[i]->loc, "InputLayer '%s' is not one of the model's inputs",
               g->nodes[i]->layer);
  g->outputs = xcalloc(m->noutputs, sizeof *g->outputs);
  for (int i = 0; i < m->noutputs; i++) g->outputs[g->noutputs++] = m->outputs[i].layer->node;

  // the losses: "loss" is their sum; each output's own log is "<output>_loss"
  // when there are several outputs
  g->phase = PH_LOSS;
  if (opt_sample_weight) sample_weights(g);
  Node *total[65]; // the losses, and the penalty
  int nl = 0;
  for (int i = 0; i < m->noutputs; i++) {
    if (!m->losses[i].has) continue;
    if (nl == 64) error_at(m->losses[i].loc, "more than 64 losses");
    if (nl == 0) { // "loss" goes first
      g->logs = xgrow(g->logs, g->nlogs, &(int){g->nlogs}, sizeof *g->logs);
      g->logs[g->nlogs++] = (Log){"loss", NULL, false};
    }
    build_loss(g, i, g->outputs[i],
               m->noutputs == 1 ? "" : format("%s_", m->outputs[i].layer->name));
    for (int k = g->nlogs - 1; k >= 0; k--)
      if (g->logs[k].node && g->logs[k].node->index == i &&
          (g->logs[k].node->op == OP_LOSS || g->logs[k].node->op == OP_XENT) &&
          !g->logs[k].node->loss.metric) {
        total[nl++] = g->logs[k].node;
        break;
      }
  }
  // Keras's loss includes the regularizers' penalties (model.losses): the
  // activities' (made with their layers, frozen or not), then each trainable
  // variable's once
  for (int i = 0; i < g->nvars; i++)
    if (!g->vars[i]->frozen)
      add_penalty(g, penalty(g, g->vars[i]->param, g->vars[i]->l1, g->vars[i]->l2,
                              g->vars[i]->vdt));
  if (!nl) g->penalty = NULL;
  if (m->noutputs == 1 && !g->penalty) { // the loss log is the loss itself
    g->logs[0].node = total[0];
    g->logs[0].node->name = "loss";
    memmove(g->logs + 1, g->logs + 2, (g->nlogs - 2) * sizeof *g->logs);
    g->nlogs--;
  } else if (m->noutputs == 1) { // the compiled loss plus the penalty, one log
    total[0]->name = "compiled_loss";
    g->logs[0].node = make2(g, OP_ADD, total[0], g->penalty);
    g->logs[0].node->name = "loss";
    memmove(g->logs + 1, g->logs + 2, (g->nlogs - 2) * sizeof *g->logs);
    g->nlogs--;
  } else {
    if (g->penalty) total[nl++] = g->penalty;
    if (nl > MAX_IN) error_at(m->losses[0].loc, "more than %d losses", MAX_IN);
    for (int k = 0; k < nl; k++) // the loss weights, where not 1
      if (total[k]->loss.lw != 1) {
        Node *w = make1(g, OP_SCALE, total[k], .aff = (AffAttr){(float)total[k]->loss.lw, 0, NULL});
        w->name = format("%s * %g", total[k]->name, total[k]->loss.lw);
        total[k] = w;
      }
    Node *sum = total[0];
    if (nl > 1) { // the total: no one output's
      sum = op_make(g, OP_ADD, nl, total, &(Node){0});
      sum->layer = NULL, sum->loc = (Loc){0};
      sum->name = "loss";
    }
    g->logs[0].node = sum;
  }

  const char **paths = xcalloc(g->nvars + m->nlayers, sizeof *paths);
  int np = 0;
  for (int i = 0; i < g->nvars; i++) paths[np++] = g->vars[i]->path;
  if (g->sample_weight) { // its label last
    g->labels = xgrow(g->labels, g->nlabels, &(int){g->nlabels}, sizeof *g->labels);
    g->labels[g->nlabels++] = g->sample_weight;
  }
  for (int i = 0; i < m->nlayers; i++)
    if (outs[i]) paths[np++] = outs[i];
  dist_warn_unused(d, paths, np);
  return g;
}
