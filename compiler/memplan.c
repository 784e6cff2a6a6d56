// Static memory plan, per device, in floats.
//
// - The parameter blob: every variable's local shard, in variable order;
//   an update group's (below) shards form one run, followed by one run for
//   each optimizer slot (same local shapes, same order); a variable in no
//   group is followed by its own slots. Issue 23: a variable kept in 16
//   bits (store16.c's var16) and each of its slots take half the floats
//   (var_floats).
// - The gradient blob: every variable's final gradient (in the variable's
//   placement, after its reduction), where the update reads it. A gradient
//   that is an all-reduced partial sum is reduced in place there; one that
//   is a reshape (a view) has its base computed there.
// - The activation arena: every other value, placed by liveness. Values are
//   visited in the (topological) order they are computed; a value's buffer
//   is taken first-fit from the free space when it is computed and given
//   back after its last reader. A reshape is a view of its operand (a split
//   on the major-most dim of a group keeps the local element order), so it
//   takes no buffer and keeps its operand alive; so does an op written in
//   place over its operand (issue 23's ROUNDs, store16.c). A 16-bit value
//   (issue 23, DT_U16) takes half the floats (value_floats). Convolution
//   scratch (im2col; a 16-bit conv's, kdrt_ops.h's kdrt_conv16_scratch)
//   sits past the arena's peak. (Issue 23: the CPU's 16-bit products'
//   widened operands have a buffer of their own, widen_floats.)
// All offsets are multiples of 16 floats (64 bytes) and become named
// constants in the generated program (the arena's: named entries of its
// AO[] array, see below). A repeated block's values (blocks.c) are planned
// once for all its layers (below: the arena with repeated blocks).
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

#include "../runtime/kdrt_ops.h" // issue 23: kdrt_conv16_scratch

#include <stdlib.h>
#include <string.h>

#define ALIGN 16

static int64_t align(int64_t n) { return size_add(n, ALIGN - 1) / ALIGN * ALIGN; }

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

// The local extent of n's first batch dim (the rows a plan step counts), 0: none.
static int64_t batch_rows(const Graph *g, const Node *n) {
  for (int i = 0; i < n->shape.rank; i++)
    if ((n->bdims >> i) & 1) {
      Shape s = local_shape(g, n);
      return s.d[i];
    }
  return 0;
}

// The floats n's buffer takes: its local elements, or for a 16-bit value
// (issue 23, DT_U16) two a float, each row's count rounded up, so that the
// plan's k floats a row (plan_step) give it at any batch.
static int64_t value_floats(const Graph *g, const Node *n) {
  int64_t e = local_elems(g, n), rows = batch_rows(g, n);
  if (n->dtype != DT_U16) return e;
  if (!rows) return (e + 1) / 2;
  return size_mul((e / rows + 1) / 2, rows);
}

// issue 23: the floats of a 16-bit product's widened operands (kdrt_ops.h's
// kdrt_matmul16_scratch), where the CPU has no bfloat16 product, as a whole
// number of floats a row of `rows` (0: no batch dim), with room for the
// parts' 16-float alignment, so that the buffer scaled with the batch
// (kdrt.c) holds them at any larger batch, whether an operand grows with it
// or not. Not in the arena: Graph.widen16_floats, the largest product's,
// a buffer of its own (the program's WIDEN16_FLOATS; --report shows it).

static int64_t widen_floats(int64_t floats, int64_t rows) {
  if (floats <= 0) return 0;
  floats = size_add(floats, 32);
  return rows > 0 ? size_mul((floats + rows - 1) / rows, rows) : floats;
}

// issue 22: the bytes a product n takes in the CUDA runtime's scratch
// (runtime/cuda/matmul.cu), at most: its 16-bit operands (bf16 precision
// rounds both; kdrt_cuda_matmul16 converts a float32 one and repacks a
// 16-bit one) in slot 3, each with its rows packed 16 bytes apart where its
// last dim is not a multiple of 8 (GPT-2's 50257), and 256 bytes between
// them; and (slot 4, at any precision) a result of 2^20 floats or more
// whose rows are not 16 bytes apart, made with its rows padded to a
// multiple of 8 floats and copied into place (pads_c). Each slot grows to its largest product's and
// stays, so the program needs the two maxima together. Not in the arena:
// --report shows it, --max-memory counts it.
static void gpu_product_scratch(Graph *g, const Node *n, int64_t *s3, int64_t *s4) {
  if (!opt_gpu_products || n->op != OP_DOT) return;
  int64_t ops = 256;
  for (int k = 0; k < 2 && (opt_gpu_products == 2 || n->dot.half); k++) {
    Shape s = local_shape(g, n->in[k]);
    int64_t last = s.d[s.rank - 1], e = shape_elems(&s);
    ops = size_add(ops, size_mul(last % 8 ? size_mul(e / last, (last + 7) / 8 * 8) : e, 2));
  }
  Shape y = local_shape(g, n);
  int64_t ny = y.d[y.rank - 1], ey = shape_elems(&y);
  int64_t res = ny % 4 && ey >= (1 << 20) ? size_mul(size_mul(ey / ny, (ny + 7) / 8 * 8), 4) : 0;
  if (ops > 256 && ops > *s3) *s3 = ops;
  if (res > *s4) *s4 = res;
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

// issue 25: the arena with repeated blocks (blocks.c). A value of a block
// that is read outside its copy (a layer's output, what the backward pass
// reads) is stacked: one buffer holds every layer's, taken when the block
// begins, each layer's share kper * rows floats (64-byte multiples, so a
// layer's value is where a buffer of its own would be aligned). Copy 0's
// other values, its temporaries, are placed first-fit as they come and
// given back within it; every later copy uses the same places. That holds
// because nothing else is taken or given back while a block runs: whatever
// else its copies read last is given back when the block ends. The copies
// then take nothing from the plan (the program's AO[] and arena_plan hold
// one entry for each value of copy 0), and first fit, which grows at the
// end as if the free space went on forever, leaves the free space as it
// found it after each copy.
typedef struct {
  int start, end;         // the block running: nodes [start, end), else start -1
  const RepBlock *b;
  Node **later;           // frees deferred to its end
  int nlater, cap;
} Running;

// The node whose buffer holds n: a stacked value's first copy.
static Node *holder(const Graph *g, Node *n) {
  const BlockAt *at = block_at(g, n);
  if (!at || !g->blocks[at->b].stacked[at->pos]) return n;
  const RepBlock *b = &g->blocks[at->b];
  return g->nodes[b->start + at->pos];
}

// The floats a stacked value's buffer holds: every layer's share.
static int64_t stacked_floats(const Graph *g, const RepBlock *b, int pos) {
  const Node *n = g->nodes[b->start + pos];
  int copies = b->pair[pos] ? 2 : b->count;
  if (!b->parts[pos]) return size_mul(b->kper[pos], copies);
  return size_mul(size_mul(b->kper[pos], batch_rows(g, n)), copies);
}

// Where layer `layer`'s share of stacked value (b, pos) sits from its buffer's start.
static int64_t layer_share(const Graph *g, const RepBlock *b, int pos, int layer) {
  int lo = b->dir > 0 ? b->layer0 : block_layer(b, b->count - 1);
  int64_t per = stacked_floats(g, b, pos) / (b->pair[pos] ? 2 : b->count);
  return (b->pair[pos] ? layer % 2 : layer - lo) * per;
}

// The floats node h's buffer takes in the arena.
static int64_t buffer_floats(const Graph *g, const Node *h) {
  const BlockAt *at = block_at(g, h);
  if (at && g->blocks[at->b].stacked[at->pos]) return stacked_floats(g, &g->blocks[at->b], at->pos);
  return value_floats(g, h);
}

// Gives back b's buffer (b a value's base) at node i: now, or, while a
// block runs, when it ends (but its own copy 0's temporaries now; its later
// copies' are not in the plan).
static void give_back(Graph *g, Arena *a, Running *run, int i, Node *b) {
  const BlockAt *at = block_at(g, b);
  const RepBlock *bb = at ? &g->blocks[at->b] : NULL;
  bool stacked = bb && bb->stacked[at->pos];
  if (bb && !stacked && at->copy > 0) return;
  Node *h = stacked ? holder(g, b) : b;
  bool own_temp = bb && bb == run->b && !stacked && i < run->start + bb->len;
  if (run->b && i >= run->start && i < run->end && !own_temp) {
    for (int k = 0; k < run->nlater; k++)
      if (run->later[k] == h) return;
    run->later = xgrow(run->later, run->nlater, &run->cap, sizeof *run->later);
    run->later[run->nlater++] = h;
    return;
  }
  arena_free(a, h->offset, align(buffer_floats(g, h)));
  plan_step(g, PLAN_FREE, h, 0, -1);
}

// issue 25: the update groups. Every trained variable's update is the same
// elementwise arithmetic on its own elements (kdcc has one optimizer, one
// learning rate and one step for all; AdamW decays every variable), so a
// run of variables whose values, gradients and slots each lie in one run
// is updated by one call over the run: the same result, element for
// element, in one call instead of one a variable (one launch on a GPU).
// The 16-float padding between two variables is in the run: zeros in
// both blobs, which every optimizer leaves zero (nothing reads them).
// A group is a run of variables, in variable order, whose updates are
// optimizer steps (not a moving statistic's, not done by the GEMM that
// makes the gradient, fuse.c); a variable updated otherwise parts them,
// unless it has no gradient (frozen, a moving statistic) and is in no
// VarBlock: the group's run then goes on, and the variable follows it.
// A VarBlock's layers must keep a fixed stride in both blobs: one with a
// variable in no group parts the groups at each of its layers too, so
// that every layer's groups are alike, and a block of the updates then
// calls the optimizer once a group of its layer. clipnorm scales
// each gradient by its own norm first (its UPDATE node, each variable's);
// the group's last UPDATE in the graph's order makes the call, after every
// member's gradient is clipped; global_clipnorm's one factor, clipvalue
// and weight decay apply to the whole run in that call.
void group_updates(Graph *g) {
  int nv = g->nvars, ids = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->id >= ids) ids = g->nodes[i]->id + 1;
  Node **upd = xcalloc((size_t)nv + 1, sizeof *upd);
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->op == OP_UPDATE && !n->var->ema_stat && !n->fused && n->var->grad)
      upd[n->var->order] = n;
  }
  bool *part = xcalloc((size_t)nv + 1, sizeof *part); // no group goes on from var i - 1 to i
  bool *in_vb = xcalloc((size_t)nv + 1, sizeof *in_vb);
  for (int i = 0; i < g->nvblocks; i++) {
    const VarBlock *vb = &g->vblocks[i];
    bool all = true;
    for (int k = vb->first; k < vb->first + vb->n * vb->nv; k++) all &= upd[k] != NULL;
    for (int k = vb->first; k < vb->first + vb->n * vb->nv; k++) in_vb[k] = true;
    for (int j = 0; j <= vb->n && !all; j++) part[vb->first + j * vb->nv] = true;
  }
  g->ugroups = xcalloc((size_t)nv + 1, sizeof *g->ugroups);
  g->nugroups = 0;
  // A variable with no gradient in no VarBlock (frozen, a moving statistic)
  // does not part a group: it takes no room in the gradient blob, and
  // plan_memory puts it after the group in the parameter blob.
  for (int i = 0, prev = -1; i < nv; i++) {
    if (!upd[i]) {
      if (g->vars[i]->grad || in_vb[i]) prev = -1;
      continue;
    }
    if (!g->nugroups || part[i] || prev < 0 || g->vars[i]->nslots != g->vars[prev]->nslots ||
        g->vars[i]->vdt != g->vars[prev]->vdt) // issue 23: a 16-bit variable's own call
      g->ugroups[g->nugroups++] = (UpdGroup){.first = i};
    UpdGroup *ug = &g->ugroups[g->nugroups - 1];
    ug->n++;
    ug->last = i;
    g->vars[i]->ugroup = g->nugroups;
    prev = i;
  }
  xfree(in_vb);
  // the leaders; no node between a group's first update and its leader
  // may read a variable the group updates
  bool *drop = xcalloc((size_t)ids + 1, sizeof *drop);
  int *span = xcalloc((size_t)g->nugroups * 2 + 2, sizeof *span); // first update, leader
  // a group within one copy of a block (one layer's, parted from the next
  // by frozen variables: LoRA's) stays in it, the block's function updating
  // each layer's; one of several layers is one call, not one a layer
  bool *apart = xcalloc((size_t)g->nugroups + 1, sizeof *apart);
  const BlockAt **first = xcalloc((size_t)g->nugroups + 1, sizeof *first);
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->op != OP_UPDATE || !n->var->ugroup) continue;
    int gi = n->var->ugroup - 1;
    const BlockAt *at = block_at(g, n);
    if (!g->ugroups[gi].leader) span[2 * gi] = i, first[gi] = at;
    if (!at || !first[gi] || at->b != first[gi]->b || at->copy != first[gi]->copy)
      apart[gi] = true;
    g->ugroups[gi].leader = n;
    span[2 * gi + 1] = i;
  }
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->op == OP_UPDATE && n->var->ugroup) drop[n->id] = apart[n->var->ugroup - 1];
  }
  xfree(apart), xfree(first);
  for (int gi = 0; gi < g->nugroups; gi++)
    for (int i = span[2 * gi]; i < span[2 * gi + 1]; i++)
      for (int k = 0; k < g->nodes[i]->nin; k++) {
        const Node *x = g->nodes[i]->in[k];
        if (x->op == OP_UPDATE && x->var->ugroup == gi + 1)
          fatal_internal(__FILE__, __LINE__,
                         format("%%%d reads a variable before its group's update", g->nodes[i]->id));
      }
  drop_blocks(g, drop); // one call for the group, not one a layer
  xfree(upd), xfree(part), xfree(drop), xfree(span);
}

// issue 23: the floats of variable v's region in the parameter blob (and
// of each slot's) and in the gradient blob. A variable kept in 16 bits
// (store16.c's var16: its PARAM a DT_U16 value) takes half the floats of
// its elements rounded up to 32, its gradient (float32) those 32s: so that
// an update group's one call reads element i of every member at 16-bit
// index i of the values' run and float index i of the gradients', and each
// run still starts on 16 floats.
static int64_t var_floats(const Graph *g, const Var *v, bool grad) {
  int64_t e = local_elems(g, v->param);
  if (v->param->dtype != DT_U16) return align(e);
  e = size_add(e, 2 * ALIGN - 1) / (2 * ALIGN) * (2 * ALIGN);
  return grad ? e : e / 2;
}

void plan_memory(Graph *g) {
  int64_t off = 0, goff = 0;
  for (int i = 0, placed = 0; i < g->nvars; i++) { // placed: the update groups laid out
    Var *v = g->vars[i];
    if (v->ugroup && v->ugroup <= placed) continue;
    // v's group (numbered in variable order: no member after the next
    // group's first), or v alone; a variable of no group amid it follows it
    int end = i + 1;
    while (v->ugroup && end < g->nvars && g->vars[end]->ugroup <= v->ugroup) end++;
    int64_t run = 0;
    for (int e = i; e < end; e++) {
      Var *w = g->vars[e];
      if (w->ugroup != v->ugroup) continue;
      if (w->nslots != v->nslots) unreachable();
      w->offset = size_add(off, run);
      w->param->region = REGION_PARAM;
      w->param->offset = w->offset;
      run = size_add(run, var_floats(g, w, false));
    }
    for (int e = i; e < end; e++)
      if (g->vars[e]->ugroup == v->ugroup) g->vars[e]->sstride = run;
    if (v->ugroup) placed = v->ugroup;
    if (v->ugroup && g->ugroups) g->ugroups[v->ugroup - 1].floats = run;
    off = size_add(off, size_mul(run, 1 + v->nslots));
  }
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    if (v->grad) {
      v->goffset = goff;
      goff = size_add(goff, var_floats(g, v, true));
    }
  }
  g->param_floats = off;
  g->grad_floats = goff;
  for (int i = 0; i < g->nugroups && g->ugroups; i++) { // one call reads both runs alike
    const Var *a = g->vars[g->ugroups[i].first];
    for (int k = g->ugroups[i].first; k <= g->ugroups[i].last; k++) {
      const Var *w = g->vars[k];
      int two = a->param->dtype == DT_U16 ? 2 : 1; // (16-bit values: two a float)
      if (w->ugroup == i + 1 && two * (w->offset - a->offset) != w->goffset - a->goffset)
        fatal_internal(__FILE__, __LINE__, format("update group %d's gradients lie apart", i + 1));
    }
  }
  for (int i = 0; i < g->nvblocks; i++) { // a layer's variables from the next's
    VarBlock *vb = &g->vblocks[i];
    const Var *a = g->vars[vb->first], *b = g->vars[vb->first + (vb->n > 1 ? vb->nv : 0)];
    vb->pstride = b->offset - a->offset;
    for (int k = 0; k < vb->nv && !vb->gstride; k++) // (a frozen variable has no gradient)
      if (g->vars[vb->first + k]->grad)
        vb->gstride = g->vars[vb->first + vb->nv + k]->goffset - g->vars[vb->first + k]->goffset;
    for (int j = 0; j < vb->n; j++) // (group_updates keeps every layer's groups alike)
      for (int k = 0; k < vb->nv; k++) {
        const Var *x = g->vars[vb->first + k], *y = g->vars[vb->first + j * vb->nv + k];
        if (y->offset - x->offset != j * vb->pstride || y->sstride != x->sstride ||
            (x->grad && y->goffset - x->goffset != j * vb->gstride))
          fatal_internal(__FILE__, __LINE__, format("block %d's layers are not at a fixed stride", i));
      }
  }

  for (int i = 0; i < g->nnodes; i++) g->nodes[i]->last_use = -1;
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    for (int k = 0; k < n->nin; k++) {
      Node *b = holder(g, base_of(n->in[k]));
      if (b->last_use < i) b->last_use = i;
      b = base_of(n->in[k]); // a stacked value's holder and each copy
      if (b->last_use < i) b->last_use = i;
    }
  }
  for (int i = 0; i < g->nlogs; i++) {
    base_of(g->logs[i].node)->last_use = g->nnodes;
    holder(g, base_of(g->logs[i].node))->last_use = g->nnodes;
  }
  for (int i = 0; i < g->noutputs; i++) // read after eval_step by `train predict`
    base_of(g->outputs[i])->last_use = g->nnodes;

  int ids = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->id >= ids) ids = g->nodes[i]->id + 1;
  Var **home = g->home && g->nat >= ids ? g->home : gradient_homes(g, ids);

  Arena a = {.free = xcalloc(g->nnodes + 8, sizeof(Span))};
  Running run = {0};
  int64_t scratch = 0, widen = 0, gpu3 = 0, gpu4 = 0;
  // issue 23: the 16-bit copies of saved values (store16.c's PACK16) live
  // from the forward pass into the backward one: taken when the step
  // begins, first (as a block's stacked values are when it begins), so that
  // they do not cut up the free space between the values that come and go;
  // and below them the values read after the backward pass (the model's
  // outputs, the logs), which else sit among its values, or just above
  // the copies, keeping the space those give back in two
  bool packs = false;
  int update = g->nnodes; // the first node after the backward pass
  for (int i = g->nnodes - 1; i >= 0; i--) {
    packs |= g->nodes[i]->op == OP_PACK16;
    if (g->nodes[i]->phase > PH_BACKWARD) update = i;
  }
  bool *early = xcalloc((size_t)ids + 1, sizeof *early);
  for (int pass = 0; pass < 2 && packs; pass++)
    for (int i = 0; i < g->nnodes; i++) {
      Node *n = g->nodes[i];
      bool kept = n->last_use >= update && n->phase <= PH_LOSS && n->op != OP_RESHAPE &&
                  !n->inplace && !home[n->id] && n->op != OP_PARAM && n->op != OP_INPUT &&
                  n->op != OP_LABEL && n->op != OP_PACK16;
      if (block_at(g, n) || !(pass ? n->op == OP_PACK16 : kept)) continue;
      early[n->id] = true;
      n->region = REGION_ARENA;
      n->offset = arena_alloc(&a, align(value_floats(g, n)));
      plan_step(g, PLAN_ALLOC, n, value_floats(g, n), -1);
    }
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    const BlockAt *at = block_at(g, n);
    const RepBlock *bb = at ? &g->blocks[at->b] : NULL;
    if (bb && at->copy == 0 && at->pos == 0) { // a block begins: its stacked values
      run = (Running){.start = i, .end = i + bb->count * bb->len, .b = bb, .later = run.later,
                      .cap = run.cap};
      for (int r = 0; r < bb->len; r++) {
        if (!bb->stacked[r]) continue;
        Node *h = g->nodes[bb->start + r];
        int64_t total = stacked_floats(g, bb, r);
        h->region = REGION_ARENA;
        h->offset = arena_alloc(&a, align(total));
        plan_step(g, PLAN_ALLOC, h, total, -1);
        for (int c = 1; c < bb->count; c++) { // (the holder's offset is the buffer's)
          Node *m = g->nodes[bb->start + c * bb->len + r];
          m->region = REGION_ARENA;
          m->offset = h->offset + layer_share(g, bb, r, block_layer(bb, c));
        }
      }
    }
    bool later_copy = bb && at->copy > 0;
    if (n->op == OP_CONV2D || n->op == OP_CONV2D_DX || n->op == OP_CONV2D_DW) {
      const Node *x = n->op == OP_CONV2D_DX ? n : n->in[0];
      const Node *y = n->op == OP_CONV2D ? n : n->op == OP_CONV2D_DX ? n->in[0] : n->in[1];
      Shape xs = local_shape(g, x), ys = local_shape(g, y);
      int64_t s = size_mul(size_mul(size_mul(ys.d[0], ys.d[1]), size_mul(ys.d[2], n->win.kh)),
                           size_mul(n->win.kw, xs.d[3]));
      if (n->win.half) { // issue 23: what kdrt_conv2d16 takes (its 16-bit columns: half)
        const kdrt_window w = {
            .B = (int)xs.d[0], .H = (int)xs.d[1], .W = (int)xs.d[2], .C = (int)xs.d[3],
            .KH = n->win.kh, .KW = n->win.kw, .K = (int)ys.d[3], .sh = n->win.sh,
            .sw = n->win.sw, .pad_t = n->win.pad_t, .pad_l = n->win.pad_l, .OH = (int)ys.d[1],
            .OW = (int)ys.d[2], .dil_h = n->win.dil_h, .dil_w = n->win.dil_w,
            .groups = n->win.groups > 1 ? (int)(n->win.groups * xs.d[3] / x->shape.d[3]) : 0};
        int64_t part[KDRT_C16_PARTS];
        int fa = n->in[0]->dtype == DT_U16 ? KDRT_OPND_16 : KDRT_OPND_EXACT;
        int fb = n->in[1]->dtype == DT_U16 ? KDRT_OPND_16 : KDRT_OPND_EXACT;
        int pass = n->op == OP_CONV2D ? KDRT_CONV_Y : n->op == OP_CONV2D_DX ? KDRT_CONV_DX
                                                                             : KDRT_CONV_DW;
        s = kdrt_conv16_scratch(&w, pass, fa, fb, part);
        int64_t wide = opt_widen16 ? widen_floats(kdrt_conv16_widen(&w, pass, fb), w.B) : 0;
        if (wide > widen) widen = wide;
      }
      if (s > scratch) scratch = s;
      if (!later_copy) plan_step(g, PLAN_SCRATCH, y, s, 0);
    }
    gpu_product_scratch(g, n, &gpu3, &gpu4);
    if (n->op == OP_DOT && n->dot.half && n->nin < 3 && !n->dot.bgrad && opt_widen16) {
      // issue 23: kdrt_matmul16's buffer (kdrt_ops.h), as its lowering reads the operands
      const Node *ab[2] = {n->in[0], n->in[1]}, *r = n; // r: a value with the batch's rows
      int64_t s = 0;
      for (int k = 0; k < 2; k++) {
        int form = ab[k]->dtype == DT_U16 ? KDRT_OPND_16
                   : n->dot.rounds >> k & 1 ? KDRT_OPND_ROUND : KDRT_OPND_EXACT;
        s += kdrt_matmul16_part(local_elems(g, ab[k]), form);
        if (!batch_rows(g, r)) r = ab[k];
      }
      s = widen_floats(s, batch_rows(g, r));
      if (s > widen) widen = s;
    }
    if (n->op == OP_PARAM) goto block_end;
    if (n->op == OP_UPDATE || n->op == OP_ASSIGN || n->op == OP_UNSCALE) { // in place, into
                                             // the variable (UNSCALE: into every gradient)
      n->region = REGION_NONE;
      goto block_end;
    }
    if (n->op == OP_INPUT || n->op == OP_LABEL) {
      n->region = REGION_INPUT;
      goto block_end;
    }
    if (n->op == OP_RESHAPE || n->inplace) {
      Node *b = base_of(n);
      n->region = b->region;
      n->offset = b->offset;
      if (b->region == REGION_GRAD) n->var = b->var; // its name in the program
      if (n->op == OP_RESHAPE) goto block_end;
      // issue 23: an op in place over its operand's buffer: its other operands may die here
    } else if (n->id < ids && home[n->id]) { // the gradient, the value it is a view of, or
                                             // its partial sum
      n->region = REGION_GRAD;
      n->offset = home[n->id]->goffset;
      n->var = home[n->id];
    } else if (early[n->id]) {
      // taken when the step began
    } else if (bb && bb->stacked[at->pos]) {
      // taken when its block began
    } else if (later_copy) { // a temporary: where copy 0's is
      n->region = REGION_ARENA;
      n->offset = g->nodes[bb->start + at->pos]->offset;
    } else {
      n->region = REGION_ARENA;
      n->offset = arena_alloc(&a, align(value_floats(g, n)));
      plan_step(g, PLAN_ALLOC, n, value_floats(g, n), -1);
    }
    // values whose last reader is this node are free from here on
    for (int k = 0; k < n->nin; k++) {
      Node *b = base_of(n->in[k]);
      const BlockAt *bat = block_at(g, b);
      bool stacked = bat && g->blocks[bat->b].stacked[bat->pos];
      Node *h = stacked ? holder(g, b) : b;
      if (h->last_use != i || b->region != REGION_ARENA) continue;
      bool seen = false; // an operand may appear twice
      for (int j = 0; j < k; j++) {
        Node *o = base_of(n->in[j]);
        const BlockAt *oat = block_at(g, o);
        seen |= (oat && g->blocks[oat->b].stacked[oat->pos] ? holder(g, o) : o) == h;
      }
      if (!seen) give_back(g, &a, &run, i, b);
    }
    if (n->region == REGION_ARENA && n->last_use < 0 && !n->inplace &&
        !(bb && bb->stacked[at->pos]))
      give_back(g, &a, &run, i, n); // never read
  block_end:
    if (run.b && i == run.end - 1) { // the block ends: what its copies read last
      for (int k = 0; k < run.nlater; k++) {
        arena_free(&a, run.later[k]->offset, align(buffer_floats(g, run.later[k])));
        plan_step(g, PLAN_FREE, run.later[k], 0, -1);
      }
      run.nlater = 0;
      run.b = NULL;
    }
  }
  xfree(early);
  g->scratch_floats = align(scratch);
  g->widen16_floats = widen;
  g->gpu_scratch = size_add(gpu3, gpu4);
  g->arena_floats = size_add(align(a.peak), g->scratch_floats);
  // Each tensor is at most MAX_ELEMS (loss.c), so only a plan of millions of them could
  // pass this: offsets in the program are 64-bit.
  if (g->param_floats > INT64_MAX / 8 || g->grad_floats > INT64_MAX / 8 ||
      g->arena_floats > INT64_MAX / 8)
    error("the memory plan of one device is over 2^60 floats");
}
