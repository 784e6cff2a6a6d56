// Reverse-mode differentiation of the global (unsharded) training graph,
// then one optimizer update per variable, its gradient clipped first as
// Keras's base_optimizer clips (clipnorm, global_clipnorm: graph ops for the
// norms, so the lattice places them; clipvalue: in the update).
//
// Differentiate first, partition once: gradients are built on global shapes
// from the forward ops alone, so collectives never need gradient rules;
// shard.c later propagates placements through forward and backward alike.
// The walk goes over the forward nodes in reverse topological order; each
// op's grad rule (ops.c, beside its definition) builds the gradients of its
// operands from forward ops and adds them into the operand's running sum
// (n->grad). Only nodes that depend on a trained variable get gradients (the
// inputs and a frozen layer's variables, trainable false, do not). A value
// read twice (a layer called twice, a residual) gets the sum of both
// gradients.
//
// The walk starts from the losses: each output's loss seeds its output's
// gradient (LOSS_GRAD, or XENT_GRAD for a crossentropy from logits made of
// row statistics), scaled by the loss's weight in the total; the
// regularizers' penalty, added to the total as it is, seeds 1. Under a loss
// scale (issue 23) each seed is multiplied by it (LOSS_SCALE), and the
// update phase begins with UNSCALE, the step's decision (ops.c).
#include "kdcc.h"

// issue 23: a seed of the backward pass times the dynamic loss scale, in a
// loss-scaled program (Keras's LossScaleOptimizer scales the total loss,
// whose gradient each seed is; ops.c).
static Node *loss_scaled(Graph *g, Node *dy) {
  if (!g->model->opt.loss_scale) return dy;
  Node *s = make1(g, OP_LOSS_SCALE, dy);
  s->name = format("%s * loss scale", dy->name);
  s->layer = dy->layer;
  s->loc = dy->loc;
  return s;
}

// The gradient of loss node l with respect to its prediction.
static void seed_loss(Graph *g, Node *l, const bool *need) {
  Node *p = l->in[0];
  if (!need[p->id]) return;
  // XENT's operands are p, y and p's row statistics; LOSS's p, y and the
  // hinge losses' flag
  Node *dp = op_make(g, l->op == OP_XENT ? OP_XENT_GRAD : OP_LOSS_GRAD, l->nin, l->in,
                     &(Node){.loss = l->loss});
  dp->loss.weight = l->loss.weight * l->loss.lw; // d(total)/d(this loss) = its loss weight
  dp->loss.num = l->loss.num * l->loss.lw;
  dp->name = format("grad(%s)", l->name);
  dp->loc = l->loc;
  accumulate(g, p, loss_scaled(g, dp));
}

// issue 11: variable v's constraint after its update u (whose value is v,
// updated in place), as Keras's optimizer applies it: NonNeg max(w, 0); a
// norm constraint w * clip_norm(the sums of w^2 over its axes), each sum a
// partial sum where an axis is split; then the result written over v.
// issue 23: on a 16-bit variable in its dtype, as Keras's constraint
// computes on it: each square rounded, each sum rounded by CLIP_NORM's
// 16-bit kernel, the product rounded (NonNeg's max(w, 0) is exact);
// UnitNorm's w / (epsilon + norms) is the product by the factor XLA's
// division makes (kdrt_optim.h's kdrt_unit_norm16_1), rounded.
static void constrain(Graph *g, Var *v, Node *u) {
  Node *c;
  if (v->constraint == CONS_NON_NEG) {
    c = make1(g, OP_ACT, u, .act.kind = ACT_RELU);
  } else {
    Node *s = make2(g, OP_MUL, u, u);
    if (v->vdt) s = round_to(g, s, v->vdt);
    for (int d = v->shape.rank - 1; d >= 0; d--) {
      if (!((v->c_axes >> d) & 1)) continue;
      s = make1(g, OP_REDUCE_SUM, s, .red.dim = d);
    }
    Node *f = make1(g, OP_CLIP_NORM, s, .clip = v->clip);
    f->clip.kind = v->vdt;
    for (int d = 0; d < v->shape.rank; d++) { // back over the summed dims, in order
      if (!((v->c_axes >> d) & 1)) continue;
      f = make1(g, OP_BROADCAST, f, .red = {d, v->shape.d[d]});
    }
    c = make2(g, OP_MUL, u, f);
    if (v->vdt) c = round_to(g, c, v->vdt);
  }
  Node *a = make2(g, OP_ASSIGN, u, c);
  a->var = v;
  a->name = format("constraint(%s)", v->path);
}

int opt_nslots(const Optimizer *o) {
  switch (o->kind) {
  case OPT_SGD: return o->momentum != 0;
  case OPT_ADAM: case OPT_ADAMW: return 2 + o->amsgrad;
  case OPT_RMSPROP: return 1 + (o->momentum > 0) + o->centered;
  case OPT_ADAMAX: case OPT_NADAM: return 2;
  case OPT_ADAGRAD: case OPT_LION: case OPT_COUNT: break;
  }
  return 1;
}

const char *opt_slot_name(const Optimizer *o, int k) {
  static const char *const names[OPT_COUNT][3] = {
    [OPT_SGD] = {"momentum"}, [OPT_ADAM] = {"momentum", "velocity", "velocity_hat"},
    [OPT_ADAMW] = {"momentum", "velocity", "velocity_hat"},
    [OPT_RMSPROP] = {"velocity", "momentum", "average_gradient"},
    [OPT_ADAGRAD] = {"accumulator"}, [OPT_ADAMAX] = {"momentum", "norm"},
    [OPT_NADAM] = {"momentum", "velocity"}, [OPT_LION] = {"momentum"}};
  if (o->kind == OPT_RMSPROP && k > 0 && !(o->momentum > 0)) k++; // no momentum slot
  return names[o->kind][k];
}

bool opt_clips(const Optimizer *o) {
  return o->clipnorm > 0 || o->global_clipnorm > 0 || o->clipvalue > 0;
}

// issue 23: a 16-bit variable's gradient is of its dtype in Keras, and its
// clipping squares it in that dtype, each square rounded; jnp.sum adds
// them in float32 and rounds the sum (GRAD_CLIP's 16-bit kernel).
static Node *sum_squares(Graph *g, Var *v) {
  if (!v->vdt) return sum_all(g, make2(g, OP_MUL, v->grad, v->grad));
  Node *gr = round_to(g, v->grad, v->vdt); // (a sum of two reads' gradients is not yet)
  return sum_all(g, round_to(g, make2(g, OP_MUL, gr, gr), v->vdt));
}

static int split_axes(const Var *v) {
  int mask = 0;
  for (int d = 0; d < v->shape.rank; d++)
    if (v->place.axis[d] >= 0) mask |= 1 << v->place.axis[d];
  return mask;
}

// The scalar factor base_optimizer's clipping scales gradients by, from
// sums of squares of whole gradients: a gradient that is a data-parallel
// partial sum is summed first (its square is not linear), a split one
// leaves a partial sum of squares that the lattice all-reduces. clipnorm:
// one factor per gradient (v set); global_clipnorm: one for all of them,
// their sums added in groups of the same split axes (v NULL), so that each
// group's partial sum crosses the mesh once.
// issue 23: under global_clipnorm with 16-bit gradients (all of one type:
// check_update16), each gradient's sum is rounded before they are added
// (global_norm stacks the 16-bit sums and jnp.sum adds those in float32),
// so each is whole first (ROUND is not linear: the lattice sums a split
// one on its own).
static Node *clip_factor(Graph *g, Var *v) {
  if (v) {
    Node *f = make1(g, OP_GRAD_CLIP, sum_squares(g, v));
    f->name = format("clipnorm(%s)", v->path);
    f->rnd.kind = v->vdt;
    return f;
  }
  int kind = 0;
  for (int i = 0; i < g->nvars; i++)
    if (g->vars[i]->grad) kind = g->vars[i]->vdt;
  int *key = xcalloc(g->nvars, sizeof *key);
  for (int i = 0; i < g->nvars; i++) key[i] = split_axes(g->vars[i]);
  Node *total = NULL;
  for (int i = 0; i < g->nvars; i++) {
    bool first = g->vars[i]->grad != NULL; // the first variable of its group
    for (int j = 0; j < i; j++) first &= !(g->vars[j]->grad && key[j] == key[i]);
    if (!first) continue;
    Node *sum = NULL;
    for (int j = i; j < g->nvars; j++) {
      if (!g->vars[j]->grad || key[j] != key[i]) continue;
      Node *s = sum_squares(g, g->vars[j]);
      if (kind) s = round_to(g, s, kind);
      sum = sum ? make2(g, OP_ADD, sum, s) : s;
      if (sum != s) sum->layer = NULL, sum->name = "global_norm"; // no one layer's
    }
    total = total ? make2(g, OP_ADD, total, sum) : sum;
    if (total != sum) total->layer = NULL, total->name = "global_norm";
  }
  xfree(key);
  Node *f = make1(g, OP_GRAD_CLIP, total);
  f->name = "global_clipnorm";
  f->rnd.kind = kind;
  f->layer = NULL;
  return f;
}

// issue 23: a variable kept in 16 bits is updated in its dtype, as Keras's
// update_step casts the learning rate and gradient to variable.dtype and
// its slots are of that dtype (ops.c's update16_emit), by every optimizer
// kdcc has, with every clipping. What kdcc does not follow: a loss scale
// (Keras's compile adds a LossScaleOptimizer only under mixed_float16; one
// in the compile_config with 16-bit variables is not checked against
// Keras), and global_clipnorm over gradients of different dtypes (Keras
// stacks their sums, promoting them to float32): other, a trained variable
// of another dtype than v's, or NULL.
static const char *dtype_name(int vdt) {
  return vdt == KDRT_ROUND_BF16 ? "bfloat16" : vdt ? "float16" : "float32";
}

static void check_update16(const Optimizer *o, const Var *v, const Var *other) {
  const char *what = o->loss_scale ? "loss scaling" : NULL;
  if (!what && o->global_clipnorm > 0 && other)
    what = format("global_clipnorm over gradients of different dtypes ('%s' is %s)",
                  other->path, dtype_name(other->vdt));
  if (what)
    error_at(v->loc, "layer '%s': variable '%s' is kept in 16 bits (%s, its dtype policy), "
             "and kdcc updates such variables as Keras does with every optimizer and "
             "clipping, but not with %s yet", v->layer, v->path, dtype_name(v->vdt), what);
}

void build_backward(Graph *g) {
  int nfwd = g->nnodes;
  bool *need = xcalloc(nfwd, sizeof *need);
  for (int i = 0; i < nfwd; i++) {
    Node *n = g->nodes[i];
    need[i] = n->op == OP_PARAM && !n->var->frozen; // a frozen layer's: constants here
    for (int k = 0; k < n->nin; k++) need[i] |= need[n->in[k]->id];
  }

  g->phase = PH_BACKWARD;
  for (int i = 0; i < nfwd; i++)
    if ((g->nodes[i]->op == OP_LOSS || g->nodes[i]->op == OP_XENT) && !g->nodes[i]->loss.metric)
      seed_loss(g, g->nodes[i], need);
  if (g->penalty && need[g->penalty->id]) { // d(total)/d(penalty) = 1
    // the graph has no constants: 1 as penalty * 0 + 1, a scalar at hand
    // (kdrt_scale1: a scale of 0 is its shift, so an overflowed penalty
    // seeds 1, not NaN)
    Node *one = make1(g, OP_SCALE, g->penalty, .aff = (AffAttr){0, 1, NULL});
    one->name = "grad(regularization)";
    accumulate(g, g->penalty, loss_scaled(g, one));
  }
  for (int i = nfwd - 1; i >= 0; i--) {
    Node *n = g->nodes[i];
    if (!n->grad || n->op == OP_PARAM || n->op == OP_INPUT) continue;
    if (!op_info(n->op).grad)
      error_at(n->loc, "layer '%s': op '%s' cannot be differentiated", n->layer ? n->layer : "?",
               op_info(n->op).name);
    int first = g->nnodes;
    // issue 23: a 16-bit op's result that a reader took in float32, never
    // rounded (layers.c's loss_reads_f32), has its gradient rounded still,
    // as XLA rounds the cotangent of the casts it dropped
    if (n->pend && !n->rounded && n->grad->half != n->pend) {
      n->grad = make1(g, OP_ROUND, n->grad, .rnd.kind = n->pend);
      n->grad->half = n->pend;
    }
    op_info(n->op).grad(g, n, need);
    for (int k = first; k < g->nnodes; k++) { // gradient ops belong to the op's layer
      g->nodes[k]->layer = n->layer;
      g->nodes[k]->loc = n->loc;
    }
  }

  // The update phase: every trained variable's gradient, the clipping
  // factors, then the updates in variable order (moving statistics too; a
  // frozen layer's variables have none, as they are not in Keras's
  // model.trainable_variables, and no optimizer slots).
  const Optimizer *o = &g->model->opt;
  g->phase = PH_UPDATE;
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    if (v->ema_stat || v->frozen) continue; // a moving average (issue 11), or frozen
    if (!v->param->grad) {
      warn_at(v->loc, "variable '%s' does not affect the loss; it is not trained", v->path);
      continue;
    }
    v->grad = v->param->grad;
    v->grad->name = format("grad(%s)", v->path);
    v->nslots = opt_nslots(o);
  }
  // issue 23: the first trained variable a, the first of another dtype b
  const Var *a = NULL, *b = NULL;
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    if (!v->grad) continue;
    if (!a) a = v;
    else if (!b && v->vdt != a->vdt) b = v;
  }
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    if (v->grad && v->vdt) check_update16(o, v, !b ? NULL : v->vdt == a->vdt ? b : a);
  }
  if (o->loss_scale) { // issue 23: the loss scale's decision, before any reader of a gradient
    Node *u = op_make(g, OP_UNSCALE, 0, NULL, &(Node){0});
    u->name = "loss scale";
  }
  Node *global = o->global_clipnorm > 0 ? clip_factor(g, NULL) : NULL;
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    if (!v->ema_stat && !v->grad) continue;
    Node *in[3] = {v->param, v->ema_stat ? v->ema_stat : v->grad, global};
    if (o->clipnorm > 0 && !v->ema_stat) in[2] = clip_factor(g, v);
    Node *u = op_make(g, OP_UPDATE, in[2] && !v->ema_stat ? 3 : 2, in, &(Node){0});
    u->var = v;
    u->name = v->path;
    u->layer = v->layer;
    u->loc = v->loc;
  }
  g->phase = PH_CONSTRAIN; // once every variable is updated, as Keras's optimizer does
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->op == OP_UPDATE && g->nodes[i]->var->constraint)
      constrain(g, g->nodes[i]->var, g->nodes[i]);
}
