// Repeated blocks (issue 25): the runs of nodes that repeat layer after
// layer (every transformer block, forward and backward; its gradients'
// collectives; its variables' updates), so that the emitters write each
// once, as a function of the layer l, called in a loop, as llm.c's
// train_gpt2.c does, instead of the same lines once per layer.
//
// A block is `count` copies of `len` consecutive nodes of the graph's
// order; copy c runs layer layer0 + dir * c (dir -1: the backward pass,
// last layer first). Node r of every copy must lower to the same calls once
// each buffer is spelled by what it is to its copy (lower.c's symbolic
// spelling): a variable of the copy's layer ({V1.3P@0}: variable 3 of a
// layer, of this one), a value of a block's layer ({B0.7@-1}: block 0's
// node 7 of the layer before), the block's input ({in0}), a step input one
// of a layer (the decode and prefill steps' key/value caches, separate
// inputs: {x3+2*l}, layer l's x[3 + 2 * l]), or any other node as itself
// ({%12}: the same node for every copy). Equal text is the
// whole test: ops, shapes, layouts, collectives, literals and the steps'
// differences come out of the ops' own lowerings (ops.c), so what differs
// between two layers (a shape, a layout, another op) keeps them apart, and
// what is folded computes what the flat program computes, call for call,
// bit for bit. A constant that differs by value alone (a dropout's stream,
// Gemma 2's sliding window: lower.c's per_layer; Gemma 3's rotary
// frequencies, a descriptor the call reads by pointer: per_layer_object)
// is spelled "{stream by layer}" here and a table indexed by l in the
// block's function.
//
// Finding them:
//  1. Each node gets a signature (op, shape, layout, dtype, phase, role, its
//     operands' ops). Periods are voted for by the distance from each node
//     to the last one before it with the same signature; the most voted
//     are tried in turn, each run of nodes equal to the node a period
//     later (and in no block yet) giving a candidate block. Its copies
//     begin where a layer begins (keras-hub's "decoder_block_0/attention"
//     is decoder_block_0's), with the fewest values crossing a copy's
//     edge (a copy is one layer's nodes, not two halves).
//  2. Variables that repeat: a block whose every copy holds the PARAM nodes
//     of one layer's variables, the next copy the next layer's, of equal
//     local sizes, makes a VarBlock. Every block's layers are the
//     VarBlock's layers its copies use (one layer a copy), which orders the
//     backward pass's copies from the last layer down.
//  3. A block's inputs: a value that every copy reads from another layer's
//     copy (the layer before's output), except a copy whose such layer is
//     in no block, which reads one outer node instead (layer 0's input,
//     the embeddings' sum).
//  4. The copies are compared; a block whose copies differ keeps its
//     longest run of equal ones (two at least, and a loop that writes at
//     least MIN_SAVED calls fewer), which changes what others read, so 3
//     and 4 repeat until nothing changes. A block keeping a value
//     for every layer (read outside its copy) needs each layer's share on
//     64 bytes (a multiple of 16 floats a row); one holding a model output,
//     or arena values beside gradients that fuse.c buckets, is dropped.
//
// Invariants the memory plan and the emitters rely on: blocks are disjoint,
// in one phase each (forward with loss, backward, update); a VarBlock's
// layers sit at a fixed stride in both blobs; a temporary of a block lives
// within its copy; every value a block reads from outside it is read the
// same way by every copy. recheck_blocks compares the copies again after
// the gradients' buckets are made (they can only merge the last layer's
// gradients with what follows, in blocks of no arena value).
#include "kdcc.h"

#include <stdlib.h>
#include <string.h>

bool opt_no_loops;

#define MAX_PERIODS 24   // periods tried, the most voted first

static int phase_group(Phase ph) { return ph <= PH_LOSS ? 0 : ph == PH_BACKWARD ? 1 : 2; }

static bool foldable(const Node *n) {
  return !n->dead && n->op != OP_INPUT && n->op != OP_LABEL && n->op != OP_UNSCALE;
}

static bool emits(const Node *n) {
  return n->op != OP_INPUT && n->op != OP_LABEL && n->op != OP_PARAM;
}

static uint64_t mix(uint64_t h, uint64_t v) {
  return (h ^ v) * 0x100000001b3ull + (h >> 29);
}

static uint64_t signature(const Node *n) {
  uint64_t h = mix(0xcbf29ce484222325ull, (uint64_t)n->op);
  h = mix(h, (uint64_t)n->dtype);
  h = mix(h, (uint64_t)n->phase);
  h = mix(h, n->role ? hash_str(n->role) : 0);
  h = mix(h, (uint64_t)n->shape.rank);
  for (int d = 0; d < n->shape.rank; d++)
    h = mix(mix(h, (uint64_t)n->shape.d[d]), (uint64_t)(n->place.axis[d] + 2));
  h = mix(mix(mix(h, n->place.partial), n->place.pmax), n->bdims);
  return mix(h, (uint64_t)n->nin);
}

// ---- the graph's readers, by node index

typedef struct {
  Graph *g;
  int n;                  // nodes
  int *idx;               // by id: index in g->nodes, -1: none
  int ids;
  int *ufirst, *users;    // node i's readers: users[ufirst[i] .. ufirst[i + 1])
  Node **by_id;
} Index;

static const Node *base(const Node *n) {
  while (view_of(n)) n = view_of(n);
  return n;
}

static Index index_graph(Graph *g) {
  Index x = {.g = g, .n = g->nnodes};
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    if (n->id >= x.ids) x.ids = n->id + 1;
    for (int k = 0; k < n->nin; k++)
      if (n->in[k]->id >= x.ids) x.ids = n->in[k]->id + 1;
  }
  x.idx = xcalloc((size_t)x.ids + 1, sizeof *x.idx);
  x.by_id = xcalloc((size_t)x.ids + 1, sizeof *x.by_id);
  for (int i = 0; i < x.ids; i++) x.idx[i] = -1;
  for (int i = 0; i < g->nnodes; i++)
    x.idx[g->nodes[i]->id] = i, x.by_id[g->nodes[i]->id] = g->nodes[i];
  x.ufirst = xcalloc((size_t)x.n + 2, sizeof *x.ufirst);
  for (int i = 0; i < x.n; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) {
      int j = x.idx[base(g->nodes[i]->in[k])->id];
      if (j >= 0) x.ufirst[j + 1]++;
    }
  for (int i = 0; i < x.n; i++) x.ufirst[i + 1] += x.ufirst[i];
  x.users = xcalloc((size_t)x.ufirst[x.n] + 1, sizeof *x.users);
  int *fill = xcalloc((size_t)x.n + 1, sizeof *fill);
  for (int i = 0; i < x.n; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) {
      int j = x.idx[base(g->nodes[i]->in[k])->id];
      if (j >= 0) x.users[x.ufirst[j] + fill[j]++] = i;
    }
  xfree(fill);
  return x;
}

// ---- 1. candidate blocks

typedef struct {
  int p, votes;
} Period;

static int cmp_period(const void *a, const void *b) {
  const Period *x = a, *y = b;
  return x->votes != y->votes ? y->votes - x->votes : x->p - y->p;
}

bool same_layer(const char *a, const char *b) {
  size_t la = strcspn(a, "/"), lb = strcspn(b, "/");
  return la == lb && !strncmp(a, b, la);
}

// The best start o in [s, e) for copies of p nodes (at least two fit before
// e): each copy's first and last node in layers other than their
// neighbours', then the fewest values crossing the first copy's edges.
static int best_start(const Index *x, int s, int e, int p) {
  Graph *g = x->g;
  int best = -1;
  long best_score = 0;
  int *stamp = xcalloc((size_t)x->n + 1, sizeof *stamp), mark = 0;
  for (int o = s; o < s + p && (e - o) / p >= 2; o++) {
    long score = 0;
    int count = (e - o) / p;
    for (int c = 0; c <= count; c++) { // the edges between copies, and the outer two
      int at = o + c * p;
      if (at <= 0 || at >= x->n) continue;
      const char *a = g->nodes[at - 1]->layer, *b = g->nodes[at]->layer;
      if (a && b && same_layer(a, b)) score += 1000000;
    }
    mark++;
    for (int i = o; i < o + p; i++) {
      const Node *n = g->nodes[i];
      for (int k = 0; k < n->nin; k++) {
        int j = x->idx[base(n->in[k])->id];
        if (j < 0 || (j >= o && j < o + p) || stamp[j] == mark) continue;
        Node *m = g->nodes[j];
        if (m->op == OP_PARAM || m->op == OP_INPUT || m->op == OP_LABEL) continue;
        stamp[j] = mark, score++;
      }
      for (int u = x->ufirst[i]; u < x->ufirst[i + 1]; u++)
        if (x->users[u] < o || x->users[u] >= o + p) {
          score++;
          break;
        }
    }
    if (best < 0 || score < best_score) best = o, best_score = score;
  }
  xfree(stamp);
  return best;
}

static void add_block(Graph *g, int start, int len, int count) {
  if (g->nblocks % 8 == 0)
    g->blocks = xrealloc(g->blocks, sizeof *g->blocks * (size_t)(g->nblocks + 8));
  g->blocks[g->nblocks++] = (RepBlock){.start = start, .len = len, .count = count, .dir = 1,
                                    .vb = -1};
}

static int cmp_start(const void *a, const void *b) {
  const RepBlock *x = a, *y = b;
  return (x->start > y->start) - (x->start < y->start);
}

// Where the run of nodes from i that equal the node p later ends (the run
// covers [i, end), end - p its last node with an equal one); i itself when
// node i does not.
static int run_end(const Graph *g, const uint64_t *sig, const bool *taken, int i, int p) {
  int s = i, n = g->nnodes;
  while (i + p < n && sig[i] == sig[i + p] && !taken[i] && !taken[i + p] &&
         foldable(g->nodes[i]) && foldable(g->nodes[i + p]) &&
         phase_group(g->nodes[i]->phase) == phase_group(g->nodes[s]->phase) &&
         phase_group(g->nodes[i + p]->phase) == phase_group(g->nodes[s]->phase))
    i++;
  return i > s ? i + p : s;
}

static void find_candidates(const Index *x) {
  Graph *g = x->g;
  int n = x->n;
  uint64_t *sig = xcalloc((size_t)n + 1, sizeof *sig);
  for (int i = 0; i < n; i++) sig[i] = signature(g->nodes[i]);
  // the last node of each signature: open addressing
  int cap = 16;
  while (cap < 2 * n) cap *= 2;
  int *slot = xcalloc((size_t)cap, sizeof *slot);
  for (int i = 0; i < cap; i++) slot[i] = -1;
  int *votes = xcalloc((size_t)n + 1, sizeof *votes);
  for (int i = 0; i < n; i++) {
    if (!foldable(g->nodes[i])) continue;
    size_t h = (size_t)(sig[i] ^ (sig[i] >> 31)) & (size_t)(cap - 1);
    while (slot[h] >= 0 && sig[slot[h]] != sig[i]) h = (h + 1) & (size_t)(cap - 1);
    if (slot[h] >= 0) votes[i - slot[h]]++;
    slot[h] = i;
  }
  Period *per = xcalloc((size_t)n + 1, sizeof *per);
  int np = 0;
  for (int p = 1; p <= n / 2; p++)
    if (votes[p] >= 2) per[np++] = (Period){p, votes[p]};
  qsort(per, (size_t)np, sizeof *per, cmp_period);
  bool *taken = xcalloc((size_t)n + 1, sizeof *taken);
  if (np > MAX_PERIODS) np = MAX_PERIODS;
  // The period whose runs cover the most nodes first, then the next.
  for (;;) {
    int best = -1;
    long best_cover = 0;
    for (int t = 0; t < np; t++) {
      long cover = 0;
      for (int i = 0, e; per[t].p && i + per[t].p < n; i = e > i ? e - per[t].p + 1 : i + 1) {
        e = run_end(g, sig, taken, i, per[t].p);
        if (e - i >= 2 * per[t].p) cover += e - i;
      }
      if (cover > best_cover) best = t, best_cover = cover;
    }
    if (best < 0) break;
    int p = per[best].p;
    per[best].p = 0; // tried
    for (int i = 0, e, q; i + p < n; i = e > i ? e - q + 1 : i + 1) {
      q = p;
      e = run_end(g, sig, taken, i, p); // nodes [i, e) repeat with period p
      if (e - i < 2 * p) continue;
      for (int d = 1; d < p; d++) // or with a period that divides p: one layer, not two
        if (p % d == 0 && run_end(g, sig, taken, i, d) >= e) {
          q = d;
          break;
        }
      int o = best_start(x, i, e, q), count = (e - o) / q, code = 0;
      for (int k = o; k < o + q; k++) code += emits(g->nodes[k]);
      if (code < 2) continue;
      add_block(g, o, q, count);
      for (int k = o; k < o + count * q; k++) taken[k] = true;
      e = o + count * q + q - 1; // the scan goes on after the block
    }
  }
  xfree(sig), xfree(slot), xfree(votes), xfree(per), xfree(taken);
  if (g->nblocks > 1) // in the graph's order (none: no array to sort, which qsort may not take)
    qsort(g->blocks, (size_t)g->nblocks, sizeof *g->blocks, cmp_start);
}

// ---- 2. variables that repeat, and each block's layers

static bool same_var(const Graph *g, const Var *a, const Var *b) {
  Shape la = local_shape(g, a->param), lb = local_shape(g, b->param);
  return shape_eq(&a->shape, &b->shape) && shape_eq(&la, &lb) &&
         place_eq(&a->place, &b->place, a->shape.rank) && a->nslots == b->nslots &&
         !a->grad == !b->grad && a->frozen == b->frozen && !a->ema_stat == !b->ema_stat &&
         a->lora_part == b->lora_part && !a->lora_a == !b->lora_a &&
         a->vdt == b->vdt; // issue 23: a 16-bit variable's update is another call
}

static void find_var_blocks(Graph *g) {
  for (int i = 0; i < g->nvars; i++) g->vars[i]->order = i;
  for (int bi = 0; bi < g->nblocks; bi++) {
    RepBlock *b = &g->blocks[bi];
    int first = -1, nv = -1;
    bool ok = true;
    for (int c = 0; c < b->count && ok; c++) {
      int lo = -1, hi = -1, cnt = 0;
      for (int r = 0; r < b->len; r++) {
        const Node *n = g->nodes[b->start + c * b->len + r];
        if (n->op != OP_PARAM) continue;
        int o = n->var->order;
        if (lo < 0 || o < lo) lo = o;
        if (o > hi) hi = o;
        cnt++;
      }
      if (!cnt || hi - lo + 1 != cnt || (c && (cnt != nv || lo != first + c * nv))) ok = false;
      if (!c) first = lo, nv = cnt;
    }
    if (!ok || nv <= 0) continue;
    for (int j = 1; j < b->count && ok; j++)
      for (int k = 0; k < nv && ok; k++)
        ok = same_var(g, g->vars[first + k], g->vars[first + j * nv + k]);
    if (!ok) continue;
    if (g->nvblocks % 8 == 0)
      g->vblocks = xrealloc(g->vblocks, sizeof *g->vblocks * (size_t)(g->nvblocks + 8));
    g->vblocks[g->nvblocks] = (VarBlock){.first = first, .nv = nv, .n = b->count,
                                         .id = g->nvblocks + 1};
    g->nvblocks++;
  }
}

// Every VarBlock layer copy c of b uses (its nodes and their operands), as
// (VarBlock index, layer); false when it uses two, or none.
static bool copy_layer(const Graph *g, const RepBlock *b, int c, int *vbi, int *layer) {
  *vbi = -1;
  for (int r = 0; r < b->len; r++) {
    const Node *n = g->nodes[b->start + c * b->len + r];
    for (int k = -1; k < n->nin; k++) {
      const Node *m = base(k < 0 ? n : n->in[k]);
      while (m->op == OP_UPDATE) m = m->in[0];
      const Var *v = m->op == OP_PARAM ? m->var : m->id < g->nat ? g->home[m->id] : NULL;
      int j;
      const VarBlock *vb = var_block(g, v, &j, NULL);
      if (!vb) continue;
      int i = (int)(vb - g->vblocks);
      if (*vbi >= 0 && (*vbi != i || *layer != j)) return false;
      *vbi = i, *layer = j;
    }
  }
  return *vbi >= 0;
}

// b's layers from its variables: true when each copy is one layer's, the
// next copy the next (or the previous) layer's; a block of no variable
// numbers its copies.
static bool number_layers(const Graph *g, RepBlock *b) {
  int v0, l0, v1, l1;
  // copies of a period shorter than a layer (two convolutions alike in a
  // residual block): k copies a layer, made one
  int k = 1;
  if (copy_layer(g, b, 0, &v0, &l0))
    while (k < b->count && copy_layer(g, b, k, &v1, &l1) && v1 == v0 && l1 == l0) k++;
  if (k > 1 && b->count / k >= 2) {
    b->len *= k;
    b->count /= k;
  }
  bool any = false;
  for (int c = 0; c < b->count && !any; c++) any = copy_layer(g, b, c, &v0, &l0);
  if (!any) return b->vb = -1, b->layer0 = 0, b->dir = 1, true;
  if (!copy_layer(g, b, 0, &v0, &l0) || !copy_layer(g, b, 1, &v1, &l1) || v0 != v1 ||
      (l1 - l0 != 1 && l1 - l0 != -1))
    return false;
  b->vb = v0, b->layer0 = l0, b->dir = l1 - l0;
  for (int c = 2; c < b->count; c++)
    if (!copy_layer(g, b, c, &v1, &l1) || v1 != v0 || l1 != l0 + c * b->dir) return false;
  return true;
}

// ---- 3. inputs, and where each node sits

static void locate(Graph *g) {
  for (int i = 0; i < g->nat; i++) g->at[i] = (BlockAt){-1, 0, 0};
  for (int bi = 0; bi < g->nblocks; bi++) {
    const RepBlock *b = &g->blocks[bi];
    for (int c = 0; c < b->count; c++)
      for (int r = 0; r < b->len; r++) {
        const Node *n = g->nodes[b->start + c * b->len + r];
        if (n->id < g->nat) g->at[n->id] = (BlockAt){bi, c, r};
      }
  }
}

static bool arena_value(const Graph *g, const Node *n) {
  return n->op != OP_PARAM && !view_of(n) && n->op != OP_UPDATE && n->op != OP_ASSIGN &&
         n->op != OP_UNSCALE && n->op != OP_INPUT && n->op != OP_LABEL &&
         !(n->id < g->nat && g->home[n->id]);
}

// b's step inputs by layer: a cache (decode.c: each layer's keys and
// values, separate inputs of the decode and prefill steps) that copy c
// reads at index i0 + c * s, the same s for every copy; layer l's is then
// x[base + step * l]. Caches alone: a training graph's inputs stay apart.
static void find_step_inputs(Graph *g, RepBlock *b) {
  b->nxin = 0;
  for (int r = 0; r < b->len && b->count >= 2; r++) {
    const Node *n0 = g->nodes[b->start + r];
    for (int k = 0; k < n0->nin; k++) {
      const Node *m0 = n0->in[k], *m1 = g->nodes[b->start + b->len + r]->in[k];
      if (m0->op != OP_INPUT || m1->op != OP_INPUT || strcmp(m0->role ? m0->role : "", "cache"))
        continue;
      int s = m1->index - m0->index;
      bool ok = s != 0;
      for (int c = 2; c < b->count && ok; c++) {
        const Node *m = g->nodes[b->start + c * b->len + r]->in[k];
        ok = m->op == OP_INPUT && m->index == m0->index + c * s;
      }
      BlockX x = {m0->index - block_layer(b, 0) * s * b->dir, s * b->dir, r, k};
      for (int i = 0; i < b->nxin && ok; i++)
        ok = b->xin[i].base != x.base || b->xin[i].step != x.step;
      if (!ok) continue;
      b->xin = xrealloc(b->xin, sizeof *b->xin * (size_t)(b->nxin + 1));
      b->xin[b->nxin++] = x;
    }
  }
}

// b's inputs: an operand that every copy reads from another layer's copy
// of one block, but for the copies where that block has no such layer,
// which read one outer node instead (a value, or the model's input).
static void find_inputs(Graph *g, RepBlock *b) {
  b->nin = 0;
  for (int r = 0; r < b->len; r++) {
    const Node *n0 = g->nodes[b->start + r];
    for (int k = 0; k < n0->nin; k++) {
      int src = -1, pos = -1, delta = 0;
      const Node *outer = NULL;
      bool ok = true, inner = false;
      for (int c = 0; c < b->count && ok; c++) {
        const Node *m = base(g->nodes[b->start + c * b->len + r]->in[k]);
        const BlockAt *at = block_at(g, m);
        if (m->op == OP_PARAM || (m->id < g->nat && g->home[m->id])) ok = false; // a variable's
        else if (at) {
          const RepBlock *s = &g->blocks[at->b];
          int d = block_layer(s, at->copy) - block_layer(b, c);
          if (inner && (at->b != src || at->pos != pos || d != delta)) ok = false;
          src = at->b, pos = at->pos, delta = d, inner = true;
        } else {
          if (outer && outer != m) ok = false;
          outer = m;
        }
      }
      if (!ok || !inner || !outer) continue;
      const RepBlock *s = &g->blocks[src];
      for (int c = 0; c < b->count && ok; c++) {
        const Node *m = base(g->nodes[b->start + c * b->len + r]->in[k]);
        ok = (block_copy(s, block_layer(b, c) + delta) < 0) == (m == outer);
      }
      for (int i = 0; i < b->nin && ok; i++)
        if (b->in[i].src == src && b->in[i].pos == pos && b->in[i].delta == delta &&
            b->in[i].outer == outer)
          ok = false;
      if (!ok) continue;
      b->in = xrealloc(b->in, sizeof *b->in * (size_t)(b->nin + 1));
      b->in[b->nin++] = (BlockIn){src, pos, delta, outer};
    }
  }
  find_step_inputs(g, b);
}

// ---- 4. comparing the copies

// "%12" in a note: the node as the copy sees it.
static char *note_text(const Index *x, const char *note) {
  char *t = xstrdup("");
  for (const char *p = note; *p;) {
    if (*p == '%' && p[1] >= '0' && p[1] <= '9') {
      int id = atoi(p + 1);
      p++;
      while (*p >= '0' && *p <= '9') p++;
      t = format("%s%s", t, id < x->ids && x->by_id[id] ? buf(x->by_id[id]) : "{?}");
      continue;
    }
    const char *q = strchr(p + 1, '%');
    size_t len = q ? (size_t)(q - p) : strlen(p);
    t = format("%s%.*s", t, (int)len, p);
    p += len;
  }
  return t;
}

// Copy c of b as text: every node's calls for each step, spelled symbolically.
static char *copy_text(const Index *x, RepBlock *b, int c) {
  Graph *g = x->g;
  ECTX = (BlockCtx){b, c, true};
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) error("out of memory");
  for (int r = 0; r < b->len; r++) {
    const Node *n = g->nodes[b->start + c * b->len + r];
    fprintf(f, "#%d %s", r, buf(n));
    if (!emits(n)) continue;
    for (int k = 0; k < 3; k++) {
      Lowering lw = {.step = (StepKind)k};
      op_info(n->op).emit(n, &lw);
      fprintf(f, "|%d", k);
      if (lw.note) fprintf(f, " note %s", note_text(x, lw.note));
      if (lw.loop) fprintf(f, " loop %s", lw.loop);
      for (int i = 0; i < lw.ncalls; i++)
        fprintf(f, " %s%s(%s)%s", lw.calls[i].ctx ? "c:" : "", lw.calls[i].fn, lw.calls[i].args,
                lw.calls[i].decl ? lw.calls[i].decl : "");
    }
  }
  ECTX = (BlockCtx){0};
  if (fclose(f) != 0) error("out of memory");
  char *t = xstrdup(text);
  free(text);
  return t;
}

// Shrinks b to its longest run of equal copies; false when b stays whole.
static bool compare_copies(const Index *x, RepBlock *b) {
  int n = b->count;
  char **t = xcalloc((size_t)n, sizeof *t);
  for (int c = 0; c < n; c++) t[c] = copy_text(x, b, c);
  int best = 0, blen = 1;
  for (int c = 0; c < n;) {
    int e = c + 1;
    while (e < n && !strcmp(t[e], t[c])) e++;
    if (e - c > blen) best = c, blen = e - c;
    c = e;
  }
  for (int c = 0; c < n; c++) xfree(t[c]);
  xfree(t);
  if (blen == n) return false;
  if (blen < 2) return b->count = 0, true;
  b->layer0 = block_layer(b, best);
  b->start += best * b->len;
  b->count = blen;
  return true;
}

// The stacked values of b, each layer's share; false when b cannot be
// planned (a share off 64 bytes, a model output, bucketed gradients).
static bool plan_values(const Index *x, RepBlock *b) {
  Graph *g = x->g;
  b->stacked = xrealloc(b->stacked, sizeof *b->stacked * (size_t)b->len);
  b->kper = xrealloc(b->kper, sizeof *b->kper * (size_t)b->len);
  b->parts = xrealloc(b->parts, sizeof *b->parts * (size_t)b->len);
  b->pair = xrealloc(b->pair, sizeof *b->pair * (size_t)b->len);
  b->arena = false;
  bool grad_sums = false;
  for (int r = 0; r < b->len; r++) {
    b->stacked[r] = false, b->kper[r] = 0, b->parts[r] = 0, b->pair[r] = true;
    for (int c = 0; c < b->count; c++) {
      int i = b->start + c * b->len + r;
      const Node *n = g->nodes[i];
      if (n->op == OP_ALLREDUCE && n->id < g->nat && g->home[n->id]) grad_sums = true;
      if (!arena_value(g, n)) continue;
      b->arena = true;
      for (int o = 0; o < g->noutputs; o++)
        if (base(g->outputs[o]) == n) return false;
      for (int k = 0; k < g->nlogs; k++) // read by the step, after the block
        if (base(g->logs[k].node) == n) b->stacked[r] = true, b->pair[r] &= c + 1 == b->count;
      int lo = b->start + c * b->len, hi = lo + b->len, end = b->start + b->count * b->len;
      for (int u = x->ufirst[i]; u < x->ufirst[i + 1]; u++) {
        int at = x->users[u];
        if (at >= lo && at < hi) continue;
        b->stacked[r] = true;
        // read by the next copy, or after the block (the last copy): two buffers do
        bool next = c + 1 < b->count ? at >= hi && at < hi + b->len : at >= end;
        if (!next) b->pair[r] = false;
      }
    }

    if (!b->stacked[r]) continue;
    if (b->count < 3) b->pair[r] = false; // two buffers are every layer's
    const Node *n = g->nodes[b->start + r];
    Shape s = local_shape(g, n);
    int64_t elems = shape_elems(&s);
    int d = -1;
    for (int i = 0; d < 0 && i < n->shape.rank; i++)
      if ((n->bdims >> i) & 1) d = i;
    bool half = n->dtype == DT_U16; // issue 23: 16-bit values, two a float
    if (d < 0) {
      b->kper[r] = ((half ? (elems + 1) / 2 : elems) + 15) / 16 * 16;
      continue;
    }
    b->kper[r] = s.d[d] ? elems / s.d[d] : 0;
    b->parts[r] = n->place.axis[d] < 0 ? 1 : axis_size(g, n->place.axis[d]);
    if (half) b->kper[r] = ((b->kper[r] + 1) / 2 + 15) / 16 * 16; // a row's, on 64 bytes
    if (b->kper[r] % 16) return false;
  }
  return !(b->arena && grad_sums);
}

// Whether a loop saves enough: MIN_SAVED calls or more written once instead
// of once a layer (two layers' updates of a Dense stay as they are).
#define MIN_SAVED 8
static bool worth_a_loop(const Graph *g, const RepBlock *b) {
  int code = 0;
  for (int r = 0; r < b->len; r++) code += emits(g->nodes[b->start + r]);
  return code * (b->count - 1) >= MIN_SAVED;
}

static void drop_dead(Graph *g) {
  int k = 0;
  for (int i = 0; i < g->nblocks; i++)
    if (g->blocks[i].count >= 2) g->blocks[k++] = g->blocks[i];
  g->nblocks = k;
}

// Steps 3 and 4 to a fixed point; with `planned`, a block holding arena
// values must not change.
static void settle(const Index *x, bool planned) {
  Graph *g = x->g;
  for (bool changed = true; changed;) {
    changed = false;
    drop_dead(g);
    locate(g);
    for (int bi = 0; bi < g->nblocks; bi++) find_inputs(g, &g->blocks[bi]);
    for (int bi = 0; bi < g->nblocks && !changed; bi++) {
      RepBlock *b = &g->blocks[bi];
      bool arena = b->arena;
      if (compare_copies(x, b)) {
        if (planned && arena)
          fatal_internal(__FILE__, __LINE__, "a block's copies differ after the memory plan");
        changed = true;
      } else if (!planned && (!worth_a_loop(g, b) || !plan_values(x, b))) {
        b->count = 0;
        changed = true;
      }
    }
  }
}

// What a block does: its phase (forward, backward, update), or 3: it sums
// gradients over the mesh (the update phase's all-reduces, first).
static int kind_of(const Graph *g, const RepBlock *b) {
  int ph = phase_group(g->nodes[b->start]->phase);
  bool sums = ph == 2;
  for (int r = 0; r < b->len && sums; r++) {
    const Node *n = g->nodes[b->start + r];
    sums = !emits(n) || n->op == OP_ALLREDUCE;
  }
  return sums ? 3 : ph;
}

// Names: block_forward, block_backward, block_allreduce, block_update
// (block2_... for a second VarBlock's; _2 for a second block of one kind).
static void name_blocks(Graph *g) {
  static const char *const phase[] = {"forward", "backward", "update", "allreduce"};
  for (int bi = 0; bi < g->nblocks; bi++) {
    RepBlock *b = &g->blocks[bi];
    int ph = kind_of(g, b), nth = 1;
    for (int i = 0; i < bi; i++) nth += g->blocks[i].vb == b->vb && kind_of(g, &g->blocks[i]) == ph;
    char *fam = b->vb < 0 ? xstrdup("block_") : g->nvblocks > 1 ? format("block%d_", b->vb + 1)
                                                                 : xstrdup("block_");
    if (b->vb < 0) { // blocks of no variable are numbered among themselves
      int k = 1;
      for (int i = 0; i < bi; i++) k += g->blocks[i].vb < 0;
      fam = format("loop%d_", k);
      nth = 1;
    }
    b->name = nth > 1 ? format("%s%s_%d", fam, phase[ph], nth) : format("%s%s", fam, phase[ph]);
    const Node *a = g->nodes[b->start], *c = g->nodes[b->start + b->len];
    b->gen_layer = name_with_layer(a->layer, c->layer, "<l>");
  }
}

// The numbers each VarBlock's layers carry in their names, and each
// variable's path with its layer's number as "<l>".
static void name_var_blocks(Graph *g) {
  for (int i = 0; i < g->nvblocks; i++) {
    VarBlock *vb = &g->vblocks[i];
    vb->id = i + 1;
    vb->gen = xcalloc((size_t)vb->nv, sizeof *vb->gen);
    for (int k = 0; k < vb->nv; k++) {
      const char *p0 = g->vars[vb->first + k]->path;
      const char *p1 = vb->n > 1 ? g->vars[vb->first + vb->nv + k]->path : p0;
      char *gp = name_with_layer(p0, p1, "<l>");
      vb->gen[k] = gp ? gp : p0;
    }
  }
}

// A VarBlock no block runs is none; the blocks' VarBlocks renumbered and
// named, and the blocks located and named.
static void renumber(Graph *g) {
  int *keep = xcalloc((size_t)g->nvblocks + 1, sizeof *keep), nk = 0;
  for (int i = 0; i < g->nvblocks; i++) keep[i] = -1;
  for (int bi = 0; bi < g->nblocks; bi++)
    if (g->blocks[bi].vb >= 0 && keep[g->blocks[bi].vb] < 0) keep[g->blocks[bi].vb] = 0;
  for (int i = 0; i < g->nvblocks; i++)
    if (keep[i] == 0) g->vblocks[nk] = g->vblocks[i], keep[i] = nk++;
  for (int bi = 0; bi < g->nblocks; bi++)
    if (g->blocks[bi].vb >= 0) g->blocks[bi].vb = keep[g->blocks[bi].vb];
  g->nvblocks = nk;
  xfree(keep);
  name_var_blocks(g);
  locate(g);
  for (int bi = 0; bi < g->nblocks; bi++) find_inputs(g, &g->blocks[bi]);
  name_blocks(g);
}

void find_blocks(Graph *g) {
  g->nblocks = g->nvblocks = 0;
  for (int i = 0; i < g->nvars; i++) g->vars[i]->order = i;
  if (opt_no_loops) return;
  Index x = index_graph(g);
  g->nat = x.ids;
  g->at = xcalloc((size_t)g->nat + 1, sizeof *g->at);
  g->home = gradient_homes(g, g->nat);
  locate(g);
  Graph *outer = EG;
  EG = g;
  find_candidates(&x);
  find_var_blocks(g);
  for (int bi = 0; bi < g->nblocks; bi++)
    if (!number_layers(g, &g->blocks[bi])) g->blocks[bi].count = 0;
  settle(&x, false);
  renumber(g);
  EG = outer;
}

void drop_blocks(Graph *g, const bool *drop) {
  bool any = false;
  for (int bi = 0; bi < g->nblocks; bi++) {
    RepBlock *b = &g->blocks[bi];
    for (int i = b->start; i < b->start + b->count * b->len && b->count; i++)
      if (drop[g->nodes[i]->id]) b->count = 0, any = true;
  }
  if (!any) return;
  Index x = index_graph(g);
  Graph *outer = EG;
  EG = g;
  settle(&x, false); // what the others read of the dropped ones' copies
  renumber(g);
  EG = outer;
}

void recheck_blocks(Graph *g) {
  if (!g->nblocks) return;
  Index x = index_graph(g);
  Graph *outer = EG;
  EG = g;
  settle(&x, true);
  for (int bi = 0; bi < g->nblocks; bi++) find_inputs(g, &g->blocks[bi]);
  name_blocks(g);
  EG = outer;
}
