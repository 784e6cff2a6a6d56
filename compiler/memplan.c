// Static memory plan, per device, in floats.
//
// - The parameter blob: every variable's local shard, each followed by its
//   optimizer slots (same local shape), in variable order.
// - The gradient blob: every variable's final gradient (in the variable's
//   placement, after its reduction), where the update reads it. A gradient
//   that is an all-reduced partial sum is reduced in place there; one that
//   is a reshape (a view) has its base computed there.
// - The activation arena: every other value, placed by liveness. Values are
//   visited in the (topological) order they are computed; a value's buffer
//   is taken first-fit from the free space when it is computed and given
//   back after its last reader. A reshape is a view of its operand (a split
//   on the major-most dim of a group keeps the local element order), so it
//   takes no buffer and keeps its operand alive. Convolution scratch (im2col)
//   sits past the arena's peak.
// All offsets are multiples of 16 floats (64 bytes) and become named
// constants in the generated program (the arena's: named entries of its
// AO[] array, see below).
//
// The plan is made for the compiled batch (kdcc --batch-size): the steps
// take their rows at run time (B, b), so any smaller batch runs in it. A
// larger one does not (first-fit offsets found for one set of sizes do not
// stay disjoint when the sizes grow), so the plan's steps are kept
// (g->plan): every arena value's size is k * ceil(B / parts) floats (its
// one batch dim, split over `parts` devices, or none), and the program
// carries the steps (arena_plan) for kdrt_arena_plan to replay, with the
// same first fit, for the run's batch when it starts. The offsets the
// program reads (AO[]) are this plan's until then.
#include "kdcc.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 16

static int64_t align(int64_t n) { return size_add(n, ALIGN - 1) / ALIGN * ALIGN; }

static Node *base_of(Node *n) {
  while (n->op == OP_RESHAPE) n = n->in[0];
  return n;
}

typedef struct {
  int64_t off, len;
} Span;

typedef struct {
  Span *free;
  int nfree;
  int64_t peak;
} Arena;

static int64_t arena_alloc(Arena *a, int64_t len) {
  for (int i = 0; i < a->nfree; i++)
    if (a->free[i].len >= len) {
      int64_t off = a->free[i].off;
      a->free[i].off += len;
      a->free[i].len -= len;
      return off;
    }
  // grow at the end: extend a trailing free span if there is one
  for (int i = 0; i < a->nfree; i++)
    if (a->free[i].off + a->free[i].len == a->peak) {
      int64_t off = a->free[i].off;
      a->peak = size_add(off, len);
      a->free[i].len = 0;
      return off;
    }
  int64_t off = a->peak;
  a->peak = size_add(a->peak, len);
  return off;
}

static int cmp_span(const void *x, const void *y) {
  const Span *a = x, *b = y;
  return (a->off > b->off) - (a->off < b->off);
}

static void arena_free(Arena *a, int64_t off, int64_t len) {
  a->free[a->nfree++] = (Span){off, len};
  qsort(a->free, a->nfree, sizeof *a->free, cmp_span);
  int k = 0; // merge neighbours, drop empties
  for (int i = 0; i < a->nfree; i++) {
    if (!a->free[i].len) continue;
    if (k && a->free[k - 1].off + a->free[k - 1].len == a->free[i].off)
      a->free[k - 1].len += a->free[i].len;
    else a->free[k++] = a->free[i];
  }
  a->nfree = k;
}

static int64_t local_elems(const Graph *g, const Node *n) {
  Shape s = local_shape(g, n);
  return shape_elems(&s);
}

// A plan step for n: its elems floats as k * rows (see PlanStep), rows
// the local extent of n's batch dim `d` (-1: the first that is one).
static PlanStep *plan_step(Graph *g, int op, const Node *n, int64_t elems, int d) {
  if (g->nplan % 64 == 0) g->plan = xrealloc(g->plan, sizeof *g->plan * (size_t)(g->nplan + 64));
  PlanStep *p = &g->plan[g->nplan++];
  *p = (PlanStep){op, n, elems, 0};
  if (op == PLAN_FREE) return p; // the size is the buffer's
  for (int i = 0; d < 0 && i < n->shape.rank; i++)
    if ((n->bdims >> i) & 1) d = i;
  if (d < 0 || !((n->bdims >> d) & 1)) return p;
  Shape s = local_shape(g, n);
  p->k = s.d[d] ? elems / s.d[d] : 0;
  p->parts = n->place.axis[d] < 0 ? 1 : axis_size(g, n->place.axis[d]);
  return p;
}

void plan_memory(Graph *g) {
  int64_t off = 0, goff = 0;
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    int64_t n = align(local_elems(g, v->param));
    v->offset = off;
    off = size_add(off, size_mul(n, 1 + v->nslots));
    v->param->region = REGION_PARAM;
    v->param->offset = v->offset;
    if (v->grad) {
      v->goffset = goff;
      goff = size_add(goff, n);
    }
  }
  g->param_floats = off;
  g->grad_floats = goff;

  for (int i = 0; i < g->nnodes; i++) g->nodes[i]->last_use = -1;
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    for (int k = 0; k < n->nin; k++) {
      Node *b = base_of(n->in[k]);
      if (b->last_use < i) b->last_use = i;
    }
  }
  for (int i = 0; i < g->nlogs; i++) base_of(g->logs[i].node)->last_use = g->nnodes;
  for (int i = 0; i < g->noutputs; i++) // read after eval_step by `train predict`
    base_of(g->outputs[i])->last_use = g->nnodes;

  // A gradient summed by an all-reduce is summed in place: the partial
  // sums are computed straight into the gradient blob.
  int *uses = xcalloc(g->nnodes, sizeof *uses);
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) uses[g->nodes[i]->in[k]->id]++;
  bool *in_grad = xcalloc(g->nnodes, sizeof *in_grad);
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    if (!v->grad || v->grad->op != OP_ALLREDUCE) continue;
    Node *p = v->grad->in[0];
    if (uses[p->id] != 1 || p->op == OP_PARAM || p->op == OP_INPUT || p->op == OP_LABEL ||
        p->op == OP_RESHAPE || is_collective(p->op))
      continue;
    p->region = REGION_GRAD;
    p->offset = v->goffset;
    p->var = v;
    in_grad[p->id] = true;
  }

  Arena a = {.free = xcalloc(g->nnodes + 8, sizeof(Span))};
  int64_t scratch = 0;
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->op == OP_CONV2D || n->op == OP_CONV2D_DX || n->op == OP_CONV2D_DW) {
      const Node *x = n->op == OP_CONV2D_DX ? n : n->in[0];
      const Node *y = n->op == OP_CONV2D ? n : n->op == OP_CONV2D_DX ? n->in[0] : n->in[1];
      Shape xs = local_shape(g, x), ys = local_shape(g, y);
      int64_t s = size_mul(size_mul(size_mul(ys.d[0], ys.d[1]), size_mul(ys.d[2], n->win.kh)),
                           size_mul(n->win.kw, xs.d[3]));
      if (s > scratch) scratch = s;
      plan_step(g, PLAN_SCRATCH, y, s, 0);
    }
    if (n->op == OP_PARAM) continue;
    if (n->op == OP_UPDATE || n->op == OP_ASSIGN || n->op == OP_UNSCALE) { // in place, into
                                             // the variable (UNSCALE: into every gradient)
      n->region = REGION_NONE;
      continue;
    }
    if (n->op == OP_INPUT || n->op == OP_LABEL) {
      n->region = REGION_INPUT;
      continue;
    }
    if (n->op == OP_RESHAPE) {
      Node *b = base_of(n);
      n->region = b->region;
      n->offset = b->offset;
      if (b->region == REGION_GRAD) n->var = b->var; // its name in the program
      continue;
    }
    bool is_grad = false;
    for (int v = 0; v < g->nvars; v++) // the gradient, or the value it is a view of
      if (g->vars[v]->grad && base_of(g->vars[v]->grad) == n) {
        n->region = REGION_GRAD;
        n->offset = g->vars[v]->goffset;
        n->var = g->vars[v];
        is_grad = true;
        break;
      }
    if (in_grad[n->id]) is_grad = true;
    if (!is_grad) {
      n->region = REGION_ARENA;
      n->offset = arena_alloc(&a, align(local_elems(g, n)));
      plan_step(g, PLAN_ALLOC, n, local_elems(g, n), -1);
    }
    // values whose last reader is this node are free from here on
    for (int k = 0; k < n->nin; k++) {
      Node *b = base_of(n->in[k]);
      if (b->last_use != i || b->region != REGION_ARENA) continue;
      bool seen = false; // an operand may appear twice
      for (int j = 0; j < k; j++) seen |= base_of(n->in[j]) == b;
      if (!seen) arena_free(&a, b->offset, align(local_elems(g, b)));
      if (!seen) plan_step(g, PLAN_FREE, b, 0, -1);
    }
    if (n->region == REGION_ARENA && n->last_use < 0) { // never read
      arena_free(&a, n->offset, align(local_elems(g, n)));
      plan_step(g, PLAN_FREE, n, 0, -1);
    }
  }
  g->scratch_floats = align(scratch);
  g->arena_floats = size_add(align(a.peak), g->scratch_floats);
  // Each tensor is at most MAX_ELEMS (loss.c), so only a plan of millions of them could
  // pass this: offsets in the program are 64-bit.
  if (g->param_floats > INT64_MAX / 8 || g->grad_floats > INT64_MAX / 8 ||
      g->arena_floats > INT64_MAX / 8)
    error("the memory plan of one device is over 2^60 floats");
}
