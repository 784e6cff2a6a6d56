// Issue 23's storage in the compute dtype: a mixed policy's saved
// activations in 16 bits, and its 16-bit values moved over the mesh in 16
// bits (move16, below).
//
// Under mixed_bfloat16 or mixed_float16 most values the backward pass reads
// are exactly 16-bit values held in float32 buffers: a ROUND's result
// (Keras's cast to the compute dtype), or an op that moves, picks or clips
// such values (a transpose of one, a gather from a rounded table, relu of
// one: ir.c's exact_op; a gather or slice over the mesh). A training step's
// peak is in the backward pass, where those saved values are alive. In 16
// bits they take half the bytes, and no number changes: the 16 bits are the
// value's own, so the float32 that comes back is the same, bit for bit
// (runtime/kdrt_round.h's kdrt_pack16, kdrt_unpack16).
//
// For each such forward value v that the backward pass reads:
//   - PACK16(v), a DT_U16 buffer, right after v (v's float32 buffer is
//     given back after its last forward reader, as before: only the 16-bit
//     copy lives on into the backward pass; made right away rather than
//     there, it leaves the arena less cut up: the plans measured smaller);
//   - each backward reader reads an UNPACK16 of it instead, made right
//     before it (one for a run of readers next to each other: a layer
//     norm's two gradients), a float32 buffer that lives only to them; a
//     reader of a view of v (a reshape: Flatten's) reads the same view of
//     the UNPACK16;
//   - but a ROUND of a variable (a kernel cast for its product), of a model
//     input, or of a float32 value the backward pass keeps anyway (attention's softmax,
//     whose gradient reads it after the product with v reads its rounded
//     copy), is rounded again where the backward pass reads it: nothing
//     stored (the same ROUND of the same bits).
// Left as they are:
//   - values that are not exactly 16-bit: attention's softmax, which Keras
//     computes in float32 and whose gradient reads those float32 bits;
//     batch norm's statistics;
//   - the model's outputs and the steps' logs (read after the step), and
//     values the update phase reads;
//   - a value whose first backward reader follows its last forward one
//     with nothing between (the logits, which the loss's gradient reads
//     first): its float32 buffer would be alive there anyway;
//   - gradients, variables, optimizer state, and collectives' results (a
//     split saved value gathered in 16 bits, move16 below, is stored as any
//     other). (A bfloat16 or float16 policy's variables and slots are kept
//     in 16 bits by var16, below.)
// Then elementwise ops over an operand that dies with them write in place
// (in_place, below): an op and its ROUND take one buffer, not two.
//
// The pass runs after fusion and before find_blocks, so that the repeated
// blocks see the new nodes as any other (each layer's are the same ops in
// the same places: the layers still fold, a stacked 16-bit value taking
// half the floats a row, memplan.c). Evaluation and predict run no PACK16
// (emit.c's train_only: only the backward pass reads it). A float32 model
// has no 16-bit value: its graph, and so its program, is what it was.
// KDCC_STORE16=0 in kdcc's environment turns the pass off: every value in
// float32 and every collective moving float32, as before issue 23's
// storage, which tests compare bit for bit.
#include "kdcc.h"

#include <stdlib.h>
#include <string.h>

static Node *base(Node *n) {
  while (n->op == OP_RESHAPE) n = n->in[0];
  return n;
}

// The 16-bit type (KDRT_ROUND_*) n's value is exactly one of, 0: none;
// kind[] by id for the nodes before it.
static int kind_of(const Node *n, const uint8_t *kind) {
  if (n->op == OP_ROUND) return n->rnd.kind;
  bool moves = exact_op(n) || n->op == OP_ALLGATHER || n->op == OP_ALLTOALL ||
               n->op == OP_LOCAL_SLICE;
  if (!moves || n->dtype != DT_F32) return 0;
  int k = 0;
  for (int i = 0; i < n->nin; i++) {
    if (n->in[i]->dtype != DT_F32) continue; // ids
    int ki = kind[n->in[i]->id];
    if (!ki || (k && ki != k)) return 0;
    k = ki;
  }
  return k;
}

typedef struct {
  int kind;               // the value's 16-bit type; 0: left as it is
  bool again;             // a ROUND of a value the backward pass has anyway: rounded again
  int last_fwd;           // its last forward (or loss) reader, or itself
  int first_bwd;          // its first backward reader, -1: none
  int last_read;          // its last reader, -1: none
  bool keep;              // read after the backward pass, or after the step: float32
  Node *pack;
  Node *unpack;           // the UNPACK16 (or ROUND) of the run of readers that ends at `last`
  int last;
} Saved;

// A new node op(in) with like's shape and placement, in layer `layer`
// (not yet in g->nodes; its id set by the caller).
static Node *make(OpKind op, Node *in, const Node *like, Phase ph, const char *layer) {
  Node *n = xcalloc(1, sizeof *n);
  n->op = op;
  n->nin = 1;
  n->in[0] = in;
  n->shape = like->shape;
  n->place = like->place;
  n->want = like->want;
  n->bdims = like->bdims;
  n->dtype = DT_F32;
  n->phase = ph;
  n->layer = layer;
  n->loc = like->loc;
  n->name = like->name;
  n->role = like->role;
  return n;
}

// Values the step must keep as they are, by id: the outputs, the logs, the
// variables and their gradients.
static bool *kept_values(const Graph *g, int ids) {
  bool *kept = xcalloc((size_t)ids + 1, sizeof *kept);
  for (int i = 0; i < g->noutputs; i++) kept[g->outputs[i]->id] = true;
  for (int i = 0; i < g->nlogs; i++) kept[g->logs[i].node->id] = true;
  for (int i = 0; i < g->nvars; i++) {
    if (g->vars[i]->grad) kept[g->vars[i]->grad->id] = true;
    if (g->vars[i]->param) kept[g->vars[i]->param->id] = true;
  }
  return kept;
}

// Operand a of reader x, a view of b (or b), as the same view of sub (a
// float32 copy of b): the views' copies appended to order (in x's phase
// and layer), numbered from *ids.
static Node *same_view(Node *a, const Node *b, Node *sub, const Node *x, int *ids, Node ***order,
                       int *m, int *cap) {
  Node *chain[64];
  int len = 0;
  for (Node *r = a; r != b && len < 64; r = r->in[0]) chain[len++] = r;
  if (len == 64) unreachable();
  for (int j = len - 1; j >= 0; j--) {
    Node *r = xcalloc(1, sizeof *r);
    *r = *chain[j];
    r->in[0] = sub;
    r->phase = x->phase;
    r->layer = x->layer;
    r->id = (*ids)++;
    *order = xgrow(*order, *m, cap, sizeof **order);
    (*order)[(*m)++] = r;
    sub = r;
  }
  return sub;
}

// The saved values in 16 bits (above); kind[] by id.
static void pack_saved(Graph *g, const uint8_t *kind) {
  int n = g->nnodes;
  Saved *s = xcalloc((size_t)n + 1, sizeof *s);
  for (int i = 0; i < n; i++)
    s[i] = (Saved){.last_fwd = i, .first_bwd = -1, .last_read = -1, .last = -2};
  for (int i = 0; i < n; i++) {
    const Node *x = g->nodes[i];
    if (x->op == OP_RESHAPE) continue; // a view: its readers read its base
    for (int k = 0; k < x->nin; k++) {
      Saved *v = &s[base(x->in[k])->id];
      v->last_read = i;
      if (x->phase <= PH_LOSS) v->last_fwd = i;
      else if (x->phase == PH_BACKWARD && v->first_bwd < 0) v->first_bwd = i;
      else if (x->phase > PH_BACKWARD) v->keep = true;
    }
  }
  for (int i = 0; i < g->noutputs; i++) s[base(g->outputs[i])->id].keep = true;
  for (int i = 0; i < g->nlogs; i++) s[base(g->logs[i].node)->id].keep = true;
  // variables that a plain SGD update folded into a product changes during
  // the backward pass (fuse.c's fuse_sgd): not read again there
  bool *sgd = xcalloc((size_t)n + 1, sizeof *sgd);
  for (int i = 0; i < n; i++)
    if (g->nodes[i]->op == OP_DOT && g->nodes[i]->dot.sgd_into)
      sgd[base(g->nodes[i]->dot.sgd_into)->id] = true;
  // which values: 16-bit, forward, read by the backward pass after a gap
  int nsaved = 0;
  for (int i = 0; i < n; i++) {
    const Node *x = g->nodes[i];
    Saved *v = &s[i];
    if (!kind[i] || v->keep || v->first_bwd < 0 || x->op == OP_RESHAPE || x->phase > PH_LOSS ||
        v->first_bwd - v->last_fwd < 2)
      continue;
    v->kind = kind[i];
    // a ROUND of a variable (the backward pass runs before any update, but
    // fuse_sgd's), of a model input (the step's), or of a float32 value
    // whose own readers keep it alive past this one's: rounded again where
    // the backward pass reads it
    const Node *o = x->op == OP_ROUND ? base(x->in[0]) : NULL;
    v->again = o && (o->op == OP_PARAM   ? !sgd[o->id]
                     : o->op == OP_INPUT ? true
                                         : !kind[o->id] && s[o->id].last_read >= v->last_read);
    nsaved++;
  }
  if (!nsaved) {
    xfree(s), xfree(sgd);
    return;
  }
  // the new order: each PACK16 right after its value, the UNPACK16s (and
  // views of them) right before their backward readers
  int cap = n + 16, m = 0, ids = n;
  Node **order = xcalloc((size_t)cap, sizeof *order);
#define PUT(x) (order = xgrow(order, m, &cap, sizeof *order), order[m++] = (x))
  for (int i = 0; i < n; i++) {
    Node *x = g->nodes[i];
    if (x->phase == PH_BACKWARD && x->op != OP_RESHAPE) {
      Node *orig[MAX_IN];
      for (int k = 0; k < x->nin; k++) orig[k] = x->in[k];
      for (int k = 0; k < x->nin; k++) {
        Node *a = orig[k], *b = base(a);
        Saved *v = b->id < n ? &s[b->id] : NULL;
        if (!v || !v->kind) continue;
        int same = -1; // this reader's operand already read as another
        for (int j = 0; j < k && same < 0; j++)
          if (orig[j] == a) same = j;
        if (same >= 0) {
          x->in[k] = x->in[same];
          continue;
        }
        if (!v->unpack || v->last < i - 1) { // a new run of readers
          v->unpack = v->again ? make(OP_ROUND, b->in[0], b, PH_BACKWARD, x->layer)
                               : make(OP_UNPACK16, v->pack, b, PH_BACKWARD, x->layer);
          v->unpack->rnd.kind = v->kind;
          v->unpack->half = (uint8_t)v->kind;
          v->unpack->id = ids++;
          PUT(v->unpack);
        }
        v->last = i;
        x->in[k] = same_view(a, b, v->unpack, x, &ids, &order, &m, &cap);
      }
    }
    PUT(x);
    Saved *v = &s[i];
    if (v->kind && !v->again) {
      Node *p = make(OP_PACK16, x, x, x->phase, x->layer);
      p->dtype = DT_U16;
      p->rnd.kind = v->kind;
      p->half = (uint8_t)v->kind;
      const char *t = v->kind == KDRT_ROUND_F16 ? "f16" : "bf16";
      p->role = p->role ? format("%s_%s", p->role, t) : t;
      p->id = ids++;
      v->pack = p;
      PUT(p);
    }
  }
#undef PUT
  // Views of a stored value that nothing reads any longer (a backward
  // reshape whose readers read the UNPACK16's): gone, so that they do not
  // keep the float32 value alive.
  int *readers = xcalloc((size_t)ids + 1, sizeof *readers);
  bool *dead = xcalloc((size_t)ids + 1, sizeof *dead), *kept = kept_values(g, ids);
  for (int i = 0; i < m; i++)
    for (int k = 0; k < order[i]->nin; k++) readers[order[i]->in[k]->id]++;
  for (int i = m - 1; i >= 0; i--) {
    Node *x = order[i];
    if (x->op != OP_RESHAPE || readers[x->id] || kept[x->id] || x->id >= n) continue;
    Node *b = base(x);
    if (b->id >= n || !s[b->id].kind) continue;
    dead[x->id] = true;
    readers[x->in[0]->id]--;
  }
  int w = 0;
  for (int i = 0; i < m; i++)
    if (!dead[order[i]->id]) order[w++] = order[i];
  for (int i = 0; i < w; i++) order[i]->id = i;
  xfree(g->nodes);
  g->nodes = order;
  g->nnodes = w;
  g->cap = cap;
  xfree(s), xfree(readers), xfree(dead), xfree(kept), xfree(sgd);
}

// Whether r may write its result over its operand x's buffer: x a float32
// value of the same shape and placement whose last reader r is (its others,
// a PACK16, before it), made in r's phase (x may itself be written over its
// operand's: one buffer for all).
static bool over(const Node *r, const Node *x, const int *last, const bool *kept) {
  return last[x->id] == r->id && !kept[x->id] && x->dtype == DT_F32 && x->op != OP_PARAM &&
         x->op != OP_INPUT && x->op != OP_LABEL && x->op != OP_UPDATE && x->op != OP_ASSIGN &&
         x->op != OP_RESHAPE && x->phase == r->phase && shape_eq(&x->shape, &r->shape) &&
         place_eq(&x->place, &r->place, r->shape.rank);
}

// Elementwise ops over an operand that dies with them (they are its last
// reader), in place (the kernel's "y may be x"): to the memory plan a view
// of that operand, so that the two take one buffer, not two.
//   - A ROUND: an op and its rounding (the float32 result before a ROUND,
//     which nothing else reads); a gradient's product is then made in the
//     gradient blob and rounded there (ir.c's gradient_homes), as a
//     float32 model's is.
//   - An activation, or a bias added, over its operand (read before by
//     its PACK16 alone).
//   - An activation's gradient over its UNPACK16 (the saved x or y, the
//     largest of a transformer's MLP), or else over dy.
static void in_place(Graph *g) {
  int n = g->nnodes;
  int *last = xcalloc((size_t)n + 1, sizeof *last); // by id: the last reader's
  bool *kept = kept_values(g, n);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) last[g->nodes[i]->in[k]->id] = i;
  for (int i = 0; i < n; i++) // a view's readers read x after its last reader: never over x
    if (g->nodes[i]->op == OP_RESHAPE) last[g->nodes[i]->in[0]->id] = -1;
  for (int i = 0; i < n; i++) {
    Node *r = g->nodes[i];
    if ((r->op == OP_ROUND || r->op == OP_ACT || r->op == OP_BIAS || r->op == OP_BIAS_ACT) &&
        r->dtype == DT_F32 &&
        over(r, r->in[0], last, kept))
      r->inplace = 1;
    else if (r->op == OP_ACT_GRAD && r->in[0] != r->in[1])
      for (int k = 1; k >= 0 && !r->inplace; k--)
        if (over(r, r->in[k], last, kept)) r->inplace = (uint8_t)(k + 1);
  }
  xfree(last), xfree(kept);
}

// The all-gathers and all-to-alls of 16-bit values move them in 16 bits
// (coll.half: kdrt_allgather16, kdrt_alltoall16), two to a 4-byte word
// through the float kernels, as int32 ids' bits go: lossless, half the
// bytes. The words are the last dim's pairs, so every block must start on
// one: the local last dim even and not the batch (whose rows a step may
// split unevenly), and an all-to-all's blocks of it, when it is the dim
// split, even too. Sums (all-reduce, reduce-scatter) stay float32: kdcc
// sums partials in float32 and rounds after, where Keras on XLA may sum in
// 16 bits. kind[] by id.
static void move16(Graph *g, const uint8_t *kind) {
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if ((n->op != OP_ALLGATHER && n->op != OP_ALLTOALL) || !kind[i]) continue;
    Shape ls = local_shape(g, n->in[0]);
    int last = ls.rank - 1, parts = 1;
    if (n->op == OP_ALLTOALL && n->coll.dim2 == last)
      for (int a = 0; a < MAX_AXES; a++)
        if ((n->coll.axes >> a) & 1) parts *= axis_size(g, a);
    if (last >= 0 && !((n->in[0]->bdims >> last) & 1) && ls.d[last] % (2 * parts) == 0)
      n->coll.half = kind[i];
  }
}

// Issue 23's products in 16 bits: a DOT whose two operands are values of
// the same 16-bit type (kind[] by id, before pack_saved) reads them as
// such, with float32 sums and a float32 result (Keras's bf16 dot with
// float32 accumulation; the ROUND after it, where Keras has one, stays).
// Not a product that a fusion gave more to do (a bias, SGD's update).
// Convolutions likewise (win.half, kdrt_conv2d16: 16-bit im2col columns),
// but a depthwise one (its own loops, no product; as float32).
unsigned opt_products16 = 1u << KDRT_ROUND_BF16;

static void mark_dots(Graph *g, const uint8_t *kind) {
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    bool conv = n->op == OP_CONV2D || n->op == OP_CONV2D_DX || n->op == OP_CONV2D_DW;
    if (conv) {
      int64_t c = (n->op == OP_CONV2D_DX ? n : n->in[0])->shape.d[3];
      int k = kind[n->in[0]->id];
      if (k && k == kind[n->in[1]->id] && (opt_products16 >> k & 1) &&
          !(n->win.groups > 1 && n->win.groups == c))
        n->win.half = (uint8_t)k;
      continue;
    }
    if (n->op != OP_DOT || n->nin != 2 || n->dot.sgd_into || n->dot.bgrad) continue;
    int k = kind[n->in[0]->id];
    if (k && k == kind[n->in[1]->id] && (opt_products16 >> k & 1)) n->dot.half = (uint8_t)k;
  }
}

// Whether x reads its operands 0 and 1 in 16 bits (mark_dots).
static bool reads16(const Node *x) {
  return (x->op == OP_DOT && x->dot.half) ||
         ((x->op == OP_CONV2D || x->op == OP_CONV2D_DX || x->op == OP_CONV2D_DW) && x->win.half);
}

// Then (ids are positions again) each 16-bit product or convolution, and
// each activation's gradient (kdrt_act_grad16), reads its saved operands
// straight from their PACK16 (an UNPACK16 that nothing else reads is gone).
// A ROUND that only 16-bit products read: of a variable (its per-step cast;
// not one SGD updates during the backward pass, fuse.c's sgd_into) or of a
// model input, gone, the products reading the float32 value and rounding it
// themselves (dot.rounds); of another value, or read by a 16-bit
// convolution too, written in its 16 bits (DT_U16).
static void read16(Graph *g) {
  int n = g->nnodes;
  Node **pack = xcalloc((size_t)n + 1, sizeof *pack); // by id: the PACK16 of a value
  bool *sgd = xcalloc((size_t)n + 1, sizeof *sgd);
  for (int i = 0; i < n; i++) {
    Node *x = g->nodes[i];
    if (x->op == OP_PACK16) pack[x->in[0]->id] = x;
    if (x->op == OP_DOT && x->dot.sgd_into) sgd[base(x->dot.sgd_into)->id] = true;
    if (x->op == OP_ACT_GRAD && x->in[1]->op == OP_UNPACK16 && x->in[0] != x->in[1])
      x->in[1] = x->in[1]->in[0];
    if (!reads16(x)) continue;
    for (int k = 0; k < 2; k++) // (a value's PACK16 comes right after it: before x)
      if (x->in[k]->op == OP_UNPACK16) x->in[k] = x->in[k]->in[0];
      else if (pack[x->in[k]->id]) x->in[k] = pack[x->in[k]->id];
  }
  int *readers = xcalloc((size_t)n + 1, sizeof *readers), *dots = xcalloc((size_t)n + 1, sizeof *dots);
  int *convs = xcalloc((size_t)n + 1, sizeof *convs);
  bool *kept = kept_values(g, n), *fold = xcalloc((size_t)n + 1, sizeof *fold);
  for (int i = 0; i < n; i++) {
    const Node *x = g->nodes[i];
    for (int k = 0; k < x->nin; k++) {
      readers[x->in[k]->id]++;
      dots[x->in[k]->id] += reads16(x) && k < 2;
      convs[x->in[k]->id] += reads16(x) && x->op != OP_DOT && k < 2;
    }
  }
  for (int i = 0; i < n; i++) {
    Node *x = g->nodes[i];
    if (x->op != OP_ROUND || !readers[i] || dots[i] != readers[i] || kept[i]) continue;
    const Node *o = x->in[0];
    fold[i] = !convs[i] && ((o->op == OP_PARAM && !sgd[o->id]) || o->op == OP_INPUT);
    if (!fold[i]) x->dtype = DT_U16;
  }
  int w = 0;
  for (int i = 0; i < n; i++) {
    Node *x = g->nodes[i];
    for (int k = 0; x->op == OP_DOT && x->dot.half && k < 2; k++)
      if (fold[x->in[k]->id]) {
        x->in[k] = x->in[k]->in[0];
        x->dot.rounds |= (uint8_t)(1 << k);
      }
    if ((x->op == OP_UNPACK16 && !readers[i] && !kept[i]) || fold[i]) continue;
    g->nodes[w++] = x;
  }
  for (int i = 0; i < w; i++) g->nodes[i]->id = i;
  g->nnodes = w;
  xfree(pack), xfree(sgd), xfree(readers), xfree(dots), xfree(convs), xfree(kept), xfree(fold);
}

// Issue 23's variables in 16 bits: a bfloat16 or float16 policy's
// variable (Var.vdt; not a moving statistic, which Keras assigns a float32
// average) and its optimizer slots hold their 16 bits in the parameter
// blob (memplan.c: half the floats), as Keras keeps them. Its PARAM is a
// DT_U16 value, and so is each UPDATE of it (the variable, updated in
// place: kdrt_optim.h's 16-bit updates read and write the 16 bits,
// KDRT_STORE16). Its readers:
//   - a 16-bit product or convolution reads the 16 bits (KDRT_OPND_16; a
//     product no longer rounds them, dot.rounds: they are the type's);
//   - a ROUND of it is an UNPACK16 (the value is the type's already), a
//     ROUND written in 16 bits for convolutions, or one only lookups read,
//     is gone, its readers reading the variable;
//   - an ASSIGN over it (a constraint's) packs its operand (exact too);
//   - a GATHER from it (an embedding's lookup) reads the rows it looks up
//     from their 16 bits (kdrt_gather16): the table is not made float32;
//   - every other reader reads an UNPACK16, a float32 copy made right
//     before it (one for a run of readers next to each other, as the saved
//     values', pack_saved), and a view of it the same view of the copy.
// No number changes: the float32 that comes back is the same, bit for bit.
// On by default; KDCC_VAR16=0 in kdcc's environment keeps the variables in
// float32 buffers of 16-bit values, as before, which tests compare bit for
// bit.
static bool is16(const Node *x) {
  return x->dtype == DT_U16 && (x->op == OP_PARAM || x->op == OP_UPDATE);
}

static void var16(Graph *g) {
  const char *env = getenv("KDCC_VAR16");
  if (env && !strcmp(env, "0")) return;
  bool any = false;
  for (int i = 0; i < g->nvars; i++) {
    Var *v = g->vars[i];
    if (!v->vdt || v->ema_stat || !v->param) continue;
    v->param->dtype = DT_U16;
    v->param->rnd.kind = v->vdt;
    any = true;
  }
  if (!any) return;
  int n = g->nnodes, ids = n, cap = n + 16, m = 0;
  Node **alias = xcalloc((size_t)n + 1, sizeof *alias); // a 16-bit ROUND's readers read this
  Node **unpack = xcalloc((size_t)n + 1, sizeof *unpack); // by base: its run's UNPACK16
  int *last = xcalloc((size_t)n + 1, sizeof *last);
  int *readers = xcalloc((size_t)n + 1, sizeof *readers);
  int *gathers = xcalloc((size_t)n + 1, sizeof *gathers); // of those, lookups in it
  bool *kept = kept_values(g, n);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) {
      readers[g->nodes[i]->in[k]->id]++;
      gathers[g->nodes[i]->in[k]->id] += g->nodes[i]->op == OP_GATHER && k == 0;
    }
  Node **order = xcalloc((size_t)cap, sizeof *order);
  for (int i = 0; i < n; i++) {
    Node *x = g->nodes[i];
    if (x->op == OP_UPDATE && is16(x->in[0])) {
      x->dtype = DT_U16;
      x->rnd.kind = x->in[0]->rnd.kind;
    }
    for (int k = 0; k < x->nin; k++)
      if (alias[x->in[k]->id]) x->in[k] = alias[x->in[k]->id];
    if (x->op == OP_RESHAPE && is16(base(x)) && !kept[x->id])
      continue; // (its readers read the copy's view)
    if (x->op == OP_ROUND && is16(x->in[0]) && !kept[x->id] &&
        (x->dtype == DT_U16 || (readers[x->id] && gathers[x->id] == readers[x->id]))) {
      alias[x->id] = x->in[0]; // read by convolutions, or looked up: they read the variable
      continue;
    }
    if (x->op == OP_ROUND && is16(x->in[0])) {
      x->op = OP_UNPACK16;
      x->half = (uint8_t)x->rnd.kind;
    }
    bool conv = x->op == OP_CONV2D || x->op == OP_CONV2D_DX || x->op == OP_CONV2D_DW;
    for (int k = 0; k < x->nin; k++) {
      Node *a = x->in[k], *b = base(a);
      if (!is16(b)) continue;
      bool at0 = x->op == OP_UPDATE || x->op == OP_ASSIGN || x->op == OP_GATHER;
      if (a == b && ((at0 && k == 0) || x->op == OP_UNPACK16)) continue;
      if (a == b && k < 2 && ((x->op == OP_DOT && x->dot.half) || (conv && x->win.half))) {
        if (x->op == OP_DOT) x->dot.rounds &= (uint8_t)~(1 << k);
        continue;
      }
      if (!unpack[b->id] || last[b->id] < i - 1) { // a new run of readers
        Node *u = make(OP_UNPACK16, b, b, x->phase, x->layer);
        u->rnd.kind = b->rnd.kind;
        u->half = (uint8_t)b->rnd.kind;
        u->name = b->name;
        u->id = ids++;
        order = xgrow(order, m, &cap, sizeof *order);
        order[m++] = unpack[b->id] = u;
      }
      last[b->id] = i;
      x->in[k] = same_view(a, b, unpack[b->id], x, &ids, &order, &m, &cap);
    }
    order = xgrow(order, m, &cap, sizeof *order);
    order[m++] = x;
  }
  for (int i = 0; i < m; i++) order[i]->id = i;
  xfree(g->nodes);
  g->nodes = order;
  g->nnodes = m;
  g->cap = cap;
  xfree(alias), xfree(unpack), xfree(last), xfree(readers), xfree(gathers), xfree(kept);
}

void store16(Graph *g) {
  const char *env = getenv("KDCC_STORE16");
  if (env && !strcmp(env, "0")) {
    var16(g);
    return;
  }
  int n = g->nnodes;
  uint8_t *kind = xcalloc((size_t)n + 1, sizeof *kind); // by id: ids are positions here
  bool any = false;
  for (int i = 0; i < n; i++) any |= (kind[i] = (uint8_t)kind_of(g->nodes[i], kind)) != 0;
  if (any) { // (a float32 model has none)
    move16(g, kind);
    mark_dots(g, kind);
    pack_saved(g, kind);
    read16(g);
    in_place(g);
  }
  xfree(kind);
  var16(g);
}
