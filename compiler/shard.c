// Sharding propagation and collective insertion.
//
// The lattice: per tensor dimension a mesh axis or replicated (-1), plus a
// set of mesh axes over which the local values are pending partial sums
// (Place, kdcc.h). Replicated is the bottom; a proposal only ever makes a
// dimension more specific, and fixed placements (seeds: the LayoutMap's
// variable layouts, the batch axis on the input and labels, `<layer>/output`
// constraints and, as their transposes, the same constraints on those
// outputs' gradients) never change.
//
// Phase A, propagation. Each op's rule (ops.c) names a factor for every
// dimension of its operands and result. Walking the whole training graph
// forward, then backward, to a fixed point, each op collects one mesh axis
// per factor from its tensors (fixed ones first, then the result, then the
// operands), never the same axis for two factors, and proposes it to every
// open dimension of that factor. Factors that need their whole extent
// (softmax's class dim, conv's spatial dims) never carry an axis. A first
// stage spreads the batch axis alone, from the input and labels, so that a
// weight split over the batch axis (FSDP-style) is gathered for use rather
// than pulling the batch split off the activations.
//
// Phase B, partitioning. In topological order each op fixes its factor
// assignment (pass-through factors from its result, contractions from its
// operands), which says what placement each operand must arrive in and what
// the result comes out as: a contraction over an axis makes the result a
// partial sum over it. Partial sums flow on through ops linear in that
// operand (matmul, add, reshape, ...) and are settled where something needs
// the true value. Every edge whose producer's placement differs from what
// the consumer needs gets a reshard, the cheapest sequence of collectives:
//   partial -> replicated        all-reduce
//   partial -> split             reduce-scatter
//   split -> replicated          all-gather
//   split on dim i -> on dim j   all-to-all
//   replicated -> split          local slice, no traffic
// A reshard of one value to one placement is made once and shared by all
// its consumers. Nothing is special-cased per layer or distribution: the
// data-parallel gradient all-reduce is the reshard of dW = x^T dy (partial
// over the batch axis) to its variable's replicated placement.
#include "kdcc.h"

#include <string.h>

bool place_eq(const Place *a, const Place *b, int rank) {
  if (a->partial != b->partial || a->pmax != b->pmax) return false;
  for (int d = 0; d < rank; d++)
    if (a->axis[d] != b->axis[d]) return false;
  return true;
}

static bool uses_axis(const Place *p, int rank, int a) {
  for (int d = 0; d < rank; d++)
    if (p->axis[d] == a) return true;
  return ((p->partial | p->pmax) >> a) & 1;
}

// Axes of size 1 split nothing and sum nothing: drop them.
static Place normalize(const Graph *g, Place p, int rank) {
  for (int d = 0; d < rank; d++)
    if (axis_size(g, p.axis[d]) == 1) p.axis[d] = -1;
  for (int a = 0; a < MAX_AXES; a++)
    if (axis_size(g, a) == 1) p.partial &= ~(1u << a), p.pmax &= ~(1u << a);
  return p;
}

// ---- Phase A

// The tensors an op's rule talks about: index 0 the result, then operands.
static int rule_tensors(Node *n, Rule *r, Node **t, const int8_t **map) {
  op_rule(n, r);
  t[0] = n;
  map[0] = r->out;
  for (int i = 0; i < n->nin; i++) {
    t[i + 1] = n->in[i];
    map[i + 1] = r->in[i];
  }
  return n->nin + 1;
}

// The stages of Phase A: the batch axis alone, then one hop from fixed
// placements only, then everything.
enum { STAGE_BATCH, STAGE_FIXED, STAGE_ALL };

static bool propagate_op(Graph *g, Node *n, int stage) {
  int only_axis = stage == STAGE_BATCH ? g->dist->batch_axis : -1;
  Rule r;
  Node *t[MAX_IN + 1];
  const int8_t *map[MAX_IN + 1];
  int nt = rule_tensors(n, &r, t, map);
  int fa[MAX_FACTORS];
  unsigned used = 0;
  for (int f = 0; f < r.nf; f++) fa[f] = -1;
  for (int pass = 0; pass < 2; pass++) // fixed tensors first
    for (int i = 0; i < nt; i++) {
      if (t[i]->has_want != (pass == 0)) continue;
      if (stage == STAGE_BATCH && t[i]->op == OP_PARAM) continue;
      if (stage == STAGE_FIXED && !t[i]->has_want) continue;
      for (int d = 0; d < t[i]->shape.rank; d++) {
        int f = map[i][d], a = t[i]->place.axis[d];
        if (f < 0 || r.kind[f] == F_FULL || a < 0 || fa[f] >= 0 || ((used >> a) & 1)) continue;
        if (only_axis >= 0 && a != only_axis) continue;
        fa[f] = a;
        used |= 1u << a;
      }
    }
  bool changed = false;
  for (int i = 0; i < nt; i++) {
    if (t[i]->has_want) continue;
    for (int d = 0; d < t[i]->shape.rank; d++) {
      int f = map[i][d];
      if (f < 0 || fa[f] < 0 || t[i]->place.axis[d] >= 0) continue;
      if (uses_axis(&t[i]->place, t[i]->shape.rank, fa[f])) continue;
      if (t[i]->shape.d[d] % axis_size(g, fa[f]) || r.size[f] % axis_size(g, fa[f])) continue;
      t[i]->place.axis[d] = fa[f];
      changed = true;
    }
  }
  return changed;
}

// ---- Phase B

typedef struct {
  Graph *g;
  Node **out;           // the new node order
  int nout, cap_out;
  Node **memo_src;      // reshards made so far
  Node **memo_dst;
  int nmemo, cap_memo;  // memo_src and memo_dst grow together
  Node **redirect;      // by original node id: the value consumers read instead
  bool *settle;         // by original node id: a partial sum here is summed at once
  int nredirect;
} Part;

static void emit_node(Part *p, Node *n) {
  p->out = xgrow(p->out, p->nout, &p->cap_out, sizeof *p->out);
  p->out[p->nout++] = n;
}

static Node *collective(Part *p, OpKind op, Node *src, unsigned axes, int dim, int dim2,
                        Node *consumer, Node *orig) {
  // Token ids may be cut further (a local slice is a copy of this rank's
  // block: sequence parallelism cuts them on the sequence); nothing sums,
  // gathers or exchanges integers.
  if (src->dtype != DT_F32 && op != OP_LOCAL_SLICE)
    error_at(consumer->loc, "layer '%s': the integer tensor %s would need a %s over '%s', which "
             "kdcc does not support; keep it split over the batch axis only",
             consumer->layer ? consumer->layer : "?", src->name ? src->name : "(ids)",
             op_info(op).name, axes_str(p->g, axes));
  Node *c = new_node(p->g, op, 1, &src);
  c->shape = src->shape;
  c->dtype = src->dtype;
  c->bdims = src->bdims;
  c->coll = (CollAttr){axes, dim, dim2, 0, orig, consumer, 0};
  c->phase = consumer->phase;
  c->layer = consumer->layer;
  c->loc = consumer->loc;
  c->name = orig->name;
  c->place = src->place;
  emit_node(p, c);
  return c;
}

char *axes_str(const Graph *g, unsigned axes) {
  char *s = "";
  for (int a = 0; a < g->dist->mesh.ndim; a++)
    if ((axes >> a) & 1) s = format("%s%s%s", s, *s ? "," : "", g->dist->mesh.names[a]);
  return xstrdup(s);
}


// One step of a reshard: a collective over `axes` on dim (and dim2).
typedef struct {
  OpKind op;
  unsigned axes;
  int dim, dim2;
  Place after;          // the placement once it is done
} Step;

// The cheapest sequence of collectives from placement `from` to `want`
// (SHARDING.md's table): partial sums first (reduce-scatter where the
// target splits a dim that is free, else all-reduce), then splits that must
// go (all-to-all where the axis moves to a free dim, else all-gather), then
// local slices. Returns the number of steps.
static int plan_reshard(int rank, Place from, Place want, Step *st) {
  int n = 0;
  Place cur = from;
  if (cur.pmax) { // a pending max is never wanted: settle it first
    unsigned m = cur.pmax;
    cur.pmax = 0;
    st[n++] = (Step){OP_ALLREDUCE_MAX, m, -1, -1, cur};
  }
  unsigned pend = cur.partial & ~want.partial;
  for (int a = 0; a < MAX_AXES; a++) {
    if (!((pend >> a) & 1)) continue;
    for (int d = 0; d < rank; d++)
      if (want.axis[d] == a && cur.axis[d] < 0) {
        cur.axis[d] = a;
        cur.partial &= ~(1u << a);
        pend &= ~(1u << a);
        st[n++] = (Step){OP_REDUCE_SCATTER, 1u << a, d, -1, cur};
        break;
      }
  }
  if (pend) {
    cur.partial &= ~pend;
    st[n++] = (Step){OP_ALLREDUCE, pend, -1, -1, cur};
  }
  for (int d = 0; d < rank; d++) {
    int a = cur.axis[d];
    if (a < 0 || want.axis[d] == a) continue;
    int e = -1;
    for (int k = 0; k < rank; k++)
      if (k != d && want.axis[k] == a && cur.axis[k] < 0) e = k;
    cur.axis[d] = -1;
    if (e >= 0) cur.axis[e] = a;
    st[n++] = (Step){e >= 0 ? OP_ALLTOALL : OP_ALLGATHER, 1u << a, d, e, cur};
  }
  for (int d = 0; d < rank; d++) {
    int a = want.axis[d];
    if (a < 0 || cur.axis[d] == a) continue;
    cur.axis[d] = a;
    st[n++] = (Step){OP_LOCAL_SLICE, 1u << a, d, -1, cur};
  }
  if (!place_eq(&cur, &want, rank)) unreachable();
  return n;
}

// Bytes one device sends to bring a tensor of global shape s from `from`
// to `want`.
static int64_t reshard_cost(const Graph *g, const Shape *s, Place from, Place want) {
  Step st[4 * MAX_RANK + 4];
  int n = plan_reshard(s->rank, from, want, st);
  int64_t bytes = 0;
  Node tmp = {.shape = *s};
  for (int i = 0; i < n; i++) {
    Node in = tmp, c = {.op = st[i].op, .coll.axes = st[i].axes, .nin = 1};
    in.place = i ? st[i - 1].after : from;
    c.in[0] = &in;
    bytes += coll_sent(g, &c);
  }
  return bytes;
}

// Bring src to placement want for consumer; returns the node holding it.
// Each collective node's place is the placement it produces. A reshard of
// one value to one placement is made once.
static Node *reshard(Part *p, Node *src, Place want, Node *consumer) {
  int rank = src->shape.rank;
  if (place_eq(&src->place, &want, rank)) return src;
  for (int i = 0; i < p->nmemo; i++)
    if (p->memo_src[i] == src && place_eq(&p->memo_dst[i]->place, &want, rank))
      return p->memo_dst[i];

  Step st[4 * MAX_RANK + 4];
  int n = plan_reshard(rank, src->place, want, st);
  Node *x = src;
  for (int i = 0; i < n; i++) {
    x = collective(p, st[i].op, x, st[i].axes, st[i].dim, st[i].dim2, consumer, src);
    x->place = st[i].after;
  }
  int cap = p->cap_memo;
  p->memo_src = xgrow(p->memo_src, p->nmemo, &cap, sizeof *p->memo_src);
  p->memo_dst = xgrow(p->memo_dst, p->nmemo, &p->cap_memo, sizeof *p->memo_dst);
  p->memo_src[p->nmemo] = src;
  p->memo_dst[p->nmemo++] = x;
  return x;
}

// An op's factor assignment and what follows from it: the placement each
// operand must arrive in and the one the result comes out in.
typedef struct {
  int fa[MAX_FACTORS];  // mesh axis per factor, -1: none
  Place want[MAX_IN];
  Place res;
} Assign;

// Every tensor of a factor, and the factor itself (a blocked one's dims are
// a multiple of it), must divide by its axis; drop those that don't.
static void check_divisible(const Graph *g, const Rule *r, Node **t, const int8_t **map, int nt,
                            int *fa) {
  for (int f = 0; f < r->nf; f++) {
    if (fa[f] >= 0 && r->size[f] % axis_size(g, fa[f])) fa[f] = -1;
    for (int i = 0; i < nt && fa[f] >= 0; i++)
      for (int d = 0; d < t[i]->shape.rank; d++)
        if (map[i][d] == f && t[i]->shape.d[d] % axis_size(g, fa[f])) {
          fa[f] = -1;
          break;
        }
  }
}

static void derive(Part *p, Node *n, const Rule *r, const int8_t **map, Assign *as) {
  unsigned used = 0;
  for (int f = 0; f < r->nf; f++)
    if (as->fa[f] >= 0) used |= 1u << as->fa[f];
  as->res = place_replicated();
  for (int i = 0; i < n->nin; i++) {
    as->want[i] = place_replicated();
    for (int d = 0; d < n->in[i]->shape.rank; d++)
      as->want[i].axis[d] = map[i + 1][d] >= 0 ? as->fa[map[i + 1][d]] : -1;
  }
  // partial sums that may pass through
  uint8_t lin = op_info(n->op).linear;
  if (op_info(n->op).joint) {
    unsigned common = n->in[0]->place.partial;
    bool same = common && !(common & used);
    for (int i = 0; i < n->nin; i++)
      same &= n->in[i]->id < p->nredirect && !p->settle[n->in[i]->id];
    for (int i = 0; i < n->nin; i++) same &= n->in[i]->place.partial == common;
    if (same) {
      for (int i = 0; i < n->nin; i++) as->want[i].partial = common;
      as->res.partial = common;
    }
  } else {
    for (int i = 0; i < n->nin; i++) {
      unsigned pp = n->in[i]->place.partial;
      if (!((lin >> i) & 1) || !pp || (pp & used) || as->res.partial) continue;
      if (n->in[i]->id >= p->nredirect || p->settle[n->in[i]->id]) continue;
      as->want[i].partial = pp;
      as->res.partial = pp;
    }
  }
  for (int f = 0; f < r->nf; f++) {
    if (r->kind[f] == F_CONTRACT && as->fa[f] >= 0) as->res.partial |= 1u << as->fa[f];
    if (r->kind[f] == F_MAX && as->fa[f] >= 0) as->res.pmax |= 1u << as->fa[f];
  }
  for (int d = 0; d < n->shape.rank; d++)
    as->res.axis[d] = r->out[d] >= 0 ? as->fa[r->out[d]] : -1;
}

// Bytes an assignment costs: its operands' reshards, and the result's to
// what its consumers expect (the propagated placement, or the constraint).
// A reshard made already for another consumer is free.
static int64_t cost(Part *p, Node *n, const Assign *as, const Place *target) {
  int64_t c = 0;
  for (int i = 0; i < n->nin; i++) {
    bool made = false;
    for (int k = 0; k < p->nmemo && !made; k++)
      made = p->memo_src[k] == n->in[i] &&
             place_eq(&p->memo_dst[k]->place, &as->want[i], n->in[i]->shape.rank);
    if (!made) c += reshard_cost(p->g, &n->in[i]->shape, n->in[i]->place, as->want[i]);
  }
  return c + reshard_cost(p->g, &n->shape, as->res, *target);
}

// Decide op n's factor assignment, bring its operands to what that needs
// and set the placement its result comes out in.
//
// The first candidate takes pass-through factors from the result's
// propagated placement and contractions from the operands. Where an
// operand is split along a contracted factor over an axis the first
// candidate gave to another factor (or to none), contracting over that
// axis instead is a second candidate: the result then comes out as a
// partial sum. The candidate that moves the fewest bytes wins; ties keep
// the first.
static void partition_op(Part *p, Node *n) {
  Graph *g = p->g;
  for (int i = 0; i < n->nin; i++)
    if (n->in[i]->id < p->nredirect && p->redirect[n->in[i]->id])
      n->in[i] = p->redirect[n->in[i]->id];
  Rule r;
  Node *t[MAX_IN + 1];
  const int8_t *map[MAX_IN + 1];
  int nt = rule_tensors(n, &r, t, map);
  Place target = n->has_want ? n->want : n->place;
  target.partial = 0;

  Assign best;
  unsigned used = 0;
  for (int f = 0; f < r.nf; f++) best.fa[f] = -1;
  for (int i = 0; i < nt; i++)
    for (int d = 0; d < t[i]->shape.rank; d++) {
      int f = map[i][d], a = t[i]->place.axis[d];
      if (f < 0 || r.kind[f] == F_FULL || a < 0 || best.fa[f] >= 0 || ((used >> a) & 1))
        continue;
      if (i > 0 && r.kind[f] == F_PASS) {
        bool in_result = false;
        for (int k = 0; k < n->shape.rank; k++) in_result |= r.out[k] == f;
        if (in_result) continue;
      }
      best.fa[f] = a;
      used |= 1u << a;
    }
  check_divisible(g, &r, t, map, nt, best.fa);
  derive(p, n, &r, map, &best);
  int64_t best_cost = cost(p, n, &best, &target);

  for (int f = 0; f < r.nf; f++) {
    if (r.kind[f] != F_CONTRACT && r.kind[f] != F_MAX) continue;
    for (int i = 1; i < nt; i++)
      for (int d = 0; d < t[i]->shape.rank; d++) {
        int a = t[i]->place.axis[d];
        if (map[i][d] != f || a < 0 || best.fa[f] == a) continue;
        Assign c = best;
        for (int k = 0; k < r.nf; k++)
          if (c.fa[k] == a) c.fa[k] = -1;
        c.fa[f] = a;
        check_divisible(g, &r, t, map, nt, c.fa);
        if (c.fa[f] != a) continue;
        derive(p, n, &r, map, &c);
        int64_t cc = cost(p, n, &c, &target);
        if (cc < best_cost) best = c, best_cost = cc;
      }
  }

  for (int i = 0; i < n->nin; i++) n->in[i] = reshard(p, n->in[i], best.want[i], n);
  n->place = best.res;
  emit_node(p, n);
  if (n->has_want && !place_eq(&n->place, &n->want, n->shape.rank))
    p->redirect[n->id] = reshard(p, n, n->want, n);
}

void propagate_shardings(Graph *g) {
  int n0 = g->nnodes;
  // the transpose of an output constraint constrains the output's gradient
  for (int i = 0; i < n0; i++) {
    Node *n = g->nodes[i];
    if (n->has_want && n->op != OP_PARAM && n->grad && !n->grad->has_want) {
      n->grad->has_want = true;
      n->grad->want = n->want;
    }
  }
  for (int i = 0; i < n0; i++) {
    Node *n = g->nodes[i];
    n->place = place_replicated();
    if (n->has_want) n->place = n->want = normalize(g, n->want, n->shape.rank);
  }

  // Phase A: forward and backward sweeps to a fixed point, first
  // for the batch axis alone (the batch split reaches every activation
  // before any weight layout can claim that axis for another dim), then one
  // hop from the fixed placements (a gradient takes its variable's layout
  // before an activation's split can reach it), then for all
  bool batch = g->dist->batch_axis >= 0 && axis_size(g, g->dist->batch_axis) > 1;
  for (int stage = batch ? STAGE_BATCH : STAGE_FIXED; stage <= STAGE_ALL; stage++)
    for (int round = 0; round < (stage == STAGE_FIXED ? 1 : 64); round++) {
      bool changed = false;
      for (int i = 0; i < n0; i++) changed |= propagate_op(g, g->nodes[i], stage);
      for (int i = n0 - 1; i >= 0; i--) changed |= propagate_op(g, g->nodes[i], stage);
      if (!changed) break;
    }

  // Phase B: in topological order
  Part p = {.g = g};
  p.redirect = xcalloc(n0, sizeof *p.redirect);
  p.nredirect = n0;
  // A partial sum may flow on only if every consumer is linear in it and
  // no bigger than it (summing before a matmul that makes a weight-sized
  // partial from an activation-sized one moves fewer bytes); otherwise it
  // is summed once, right away, and every consumer reads the sum.
  p.settle = xcalloc(n0, sizeof *p.settle);
  for (int i = 0; i < n0; i++) {
    Node *c = g->nodes[i];
    for (int k = 0; k < c->nin; k++)
      if (!((op_info(c->op).linear >> k) & 1) ||
          shape_elems(&c->shape) > shape_elems(&c->in[k]->shape))
        p.settle[c->in[k]->id] = true;
  }
  for (int i = 0; i < n0; i++) {
    Node *n = g->nodes[i];
    if (n->op == OP_INPUT || n->op == OP_LABEL || n->op == OP_PARAM) {
      emit_node(&p, n);
      continue;
    }
    bool in_place = n->op == OP_UPDATE || n->op == OP_ASSIGN;
    if (in_place) // the result is the variable itself
      n->place = n->in[0]->place;
    partition_op(&p, n);
    if (in_place) n->place = n->in[0]->place;
  }
  // the loss and the metric are reported: they need their sums
  for (int i = 0; i < g->nlogs; i++) {
    Node *s = g->logs[i].node;
    if (s->id < n0 && p.redirect[s->id]) s = p.redirect[s->id];
    Node *v = reshard(&p, s, place_replicated(), s);
    v->phase = PH_LOSS;
    g->logs[i].node = v;
  }
  for (int i = 0; i < p.nout; i++) // a gradient ends in its variable's placement
    if (p.out[i]->op == OP_UPDATE && !p.out[i]->var->ema_stat)
      p.out[i]->var->grad = p.out[i]->in[1];
  g->nodes = p.out;
  g->nnodes = p.nout;
  g->cap = p.cap_out;
  for (int i = 0; i < g->nnodes; i++) g->nodes[i]->id = i;
}

// The dims whose extent is the batch: dim 0 of the inputs and labels, and
// every dim that shares a factor of an op's rule with one of them, to a
// fixed point (the batch factor passes through activations and their
// gradients and is contracted away in weight gradients and losses). Their
// extents are the step's rows at run time (emit.c's Sym).
void find_batch_dims(Graph *g) {
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if ((n->op == OP_INPUT || n->op == OP_LABEL) && n->shape.rank > 0) n->bdims = 1;
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < g->nnodes; i++) {
      Node *n = g->nodes[i];
      Rule r;
      op_rule(n, &r);
      bool batch[MAX_FACTORS] = {false};
      for (int t = 0; t <= n->nin; t++) {
        const Node *x = t ? n->in[t - 1] : n;
        const int8_t *map = t ? r.in[t - 1] : r.out;
        for (int d = 0; d < x->shape.rank; d++)
          if (map[d] >= 0 && ((x->bdims >> d) & 1)) batch[map[d]] = true;
      }
      for (int t = 0; t <= n->nin; t++) {
        Node *x = t ? n->in[t - 1] : n;
        const int8_t *map = t ? r.in[t - 1] : r.out;
        for (int d = 0; d < x->shape.rank; d++)
          if (map[d] >= 0 && batch[map[d]] && !((x->bdims >> d) & 1)) {
            if (x->shape.d[d] != g->batch)
              error_at(x->loc, "layer '%s': a dim of extent %lld holds the batch merged with "
                       "other dims, which kdcc does not support", x->layer ? x->layer : "?",
                       (long long)x->shape.d[d]);
            x->bdims |= 1u << d;
            changed = true;
          }
      }
    }
  }
}

// ---- costs

int64_t coll_bytes(const Graph *g, const Node *n) {
  Shape s = local_shape(g, n->in[0]);
  return size_mul(shape_elems(&s), n->coll.half ? 2 : 4); // issue 23: 16-bit values
}

int64_t coll_sent(const Graph *g, const Node *n) {
  int64_t groupn = 1, b = coll_bytes(g, n);
  for (int a = 0; a < MAX_AXES; a++)
    if ((n->coll.axes >> a) & 1) groupn *= axis_size(g, a);
  switch (n->op) {
  case OP_ALLREDUCE: case OP_ALLREDUCE_MAX: return size_mul(2 * (groupn - 1), b) / groupn;
  case OP_REDUCE_SCATTER: return size_mul(groupn - 1, b) / groupn;
  case OP_ALLGATHER: return size_mul(groupn - 1, b);
  case OP_ALLTOALL: return size_mul(groupn - 1, b) / groupn;
  default: return 0;
  }
}

// ---- why a collective is there

// "%23 dot (d1) grad(d1/kernel)": an op by its id in the emitted file.
static char *op_ref(const Node *n) {
  if (n->op == OP_PARAM || n->op == OP_INPUT || n->op == OP_LABEL) return xstrdup(n->name);
  char *s = format("%%%d %s", n->id, op_info(n->op).name);
  if (n->layer) s = format("%s (%s)", s, n->layer);
  if (n->name && strcmp(n->name, op_info(n->op).name)) s = format("%s %s", s, n->name);
  return s;
}

char *coll_why(const Graph *g, const Node *n) {
  const Node *src = n->coll.src, *user = n->coll.user;
  char *ax = axes_str(g, n->coll.axes), *s = op_ref(src), *u = op_ref(user);
  if (src == user) u = xstrdup("the step's result"); // a reported value: its log needs the sum
  switch (n->op) {
  case OP_REDUCE_SCATTER:
    return format("%s is a partial sum over '%s'; %s wants it split on dim %d", s, ax, u,
                  n->coll.dim);
  case OP_ALLREDUCE:
    if (n->coll.bucket)
      return format("each is a partial sum over '%s'; its update needs the sum", ax);
    return format("%s is a partial sum over '%s'; %s needs the sum", s, ax, u);
  case OP_ALLREDUCE_MAX:
    return format("%s is a partial max over '%s'; %s needs the max", s, ax, u);
  case OP_ALLTOALL:
    return format("%s is split over '%s' on dim %d; %s wants it on dim %d", s, ax, n->coll.dim, u,
                  n->coll.dim2);
  case OP_ALLGATHER:
    return format("%s is split over '%s' on dim %d; %s needs it whole", s, ax, n->coll.dim, u);
  case OP_LOCAL_SLICE:
    return format("%s is replicated over '%s'; %s takes this device's block of dim %d", s, ax, u,
                  n->coll.dim);
  default: unreachable();
  }
}
