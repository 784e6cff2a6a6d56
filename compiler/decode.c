// issue 24: a language model's decode step with a key/value cache, for
// `./train generate`: one new position per sequence instead of the whole
// window.
//
// decode_derive takes the forward graph of a model generate can run (token
// ids [T] in, maybe keras-hub's padding_mask; one output [T, vocabulary])
// before any pass and derives a second graph from it, for one position:
// every value that has the query's sequence dim (tracked from token_ids
// through each op) gets extent 1 there. Where attention meets keys and
// values (a DOT both of whose operands have that dim: q.k and probs.v), the
// second operand becomes a cache, a step input of its full shape [.., T, ..]
// that KV_WRITE first fills at the row's position with the new key or
// value; position-dependent ops take each row's position from another step
// input, positions[b]: ROPE turns by it (DEC_ROPE), the causal (sliding
// window) mask is relative to it (DEC_CAUSAL), and a table over positions
// added to the tokens (GPT-2's position embedding) is read at it
// (POS_SLICE). The padding mask stays the keys' [T]. Anything else that
// mixes positions leaves the model without a decode step (decode_why says
// why) and generate re-runs the whole window as before.
//
// decode_finish then runs the decode graph through the same sharding
// propagation and memory plan as the training graph, on the same mesh:
// each cache is placed as the training graph places the operand it
// replaces (batch over the data axis, heads over 'model' under a layout
// map), so that the decode step needs the forward's collectives and no
// others; a cache that would be resharded (a copy written, not the cache)
// refuses the decode step. The parameters are the training program's own
// (the same variables, offsets and layouts, checked), so the decode step
// reads the program's parameter blob; it has its own arena. The IR
// verifier checks both graphs after their derivation and after each pass,
// as pipeline.c the training graph. find_blocks folds their repeated
// blocks as the training graph's (issue 25: a function of the layer l
// called in a loop; --no-loops writes them out): each PARAM node is made
// where the training graph has it, among its layer's nodes, and the
// caches, made where attention reads them, are moved first with the other
// inputs, so that a layer's nodes repeat as the training forward's; each
// layer's key and value caches are separate step inputs in layer order,
// which a block reads at a fixed stride (x[3 + 2 * l]: the runtime's array
// of inputs as it is, no table), and Gemma 2's windows (DEC_CAUSAL) and
// Gemma 3's rotary descriptors (DEC_ROPE) are tables by layer as the
// training step's.
//
// The prefill graph is derived the same way without shrinking anything:
// the whole window, each attention's keys and values also stored whole in
// its cache (KV_STORE), so that one step over the prompts fills the caches.
//
// decode_emit_c and prefill_emit_c write them as the program's second and
// third C files (each its own translation unit: their memory plans' names
// are the main file's), whose tables register themselves with the runtime
// (runtime/generate.c).
#include "ops_impl.h"

#include "../runtime/kdrt_rope.h"

#include <string.h>

static Graph *DG;          // the decode graph, or NULL
static Graph *PG;          // the prefill graph (the whole window, filling the caches), or NULL
static Graph *cur;         // the graph being derived
static bool PF;            // it is the prefill graph
static const char *why;    // why a language model has none (NULL: not one, or it has one)
static Node **cache_of;    // [k]: the training graph's DOT whose operand 1 cache k replaces
static int ncaches;

const char *decode_why(void) { return DG ? NULL : why; }

// ---------------------------------------------------------------- the decode ops
// Each reads the rows' positions pos[b] (int32, the step input after the
// model's own) and loops over this device's rows, calling kernels of
// kdrt_ops.h on one row at a time; dim 0 is the batch, nothing else is.

static char *rows(const Node *n) { return sym_c(sym_dim(n, 0, true)); }
static char *row_elems(const Node *n) { return sym_c(sym_prod(n, 1, n->shape.rank, true)); }
static char *at_row(const Node *n) { return format("%s + r_ * %s", buf(n), row_elems(n)); }
static const char *row_loop(Lowering *lw, const Node *n) {
  return lw->loop = format("for (int64_t r_ = 0; r_ < %s; r_++)", rows(n));
}

// KV_WRITE(new, cache, pos): cache[r, .., pos[r], ..] = new[r, .., 0, ..]
// along dim cat.axis; the result is new (what reads the cache reads the
// input itself, after this op).
static void kv_write_rule(const Node *n, Rule *r) {
  int d = n->cat.axis;
  for (int i = 0; i < n->shape.rank; i++) {
    if (i == d) continue;
    r->out[i] = r->in[0][i] = r->in[1][i] = factor(r, F_PASS, n->shape.d[i]);
  }
  r->out[d] = r->in[0][d] = factor(r, F_FULL, 1);
  r->in[1][d] = factor(r, F_FULL, n->in[1]->shape.d[d]);
  r->in[2][0] = r->out[0];
}

static void kv_write_emit(const Node *n, Lowering *lw) {
  const Node *x = n->in[0], *cache = n->in[1], *pos = n->in[2];
  int d = n->cat.axis;
  row_loop(lw, n);
  lower_call(lw, KN_place_block, NULL, "(float *)%s + r_ * %s, %s, %s, 1, %s[r_], %s, %s",
             buf(cache), row_elems(cache), at_row(x), sym_c(sym_prod(x, 1, d, true)), buf(pos),
             sym_c(sym_dim(cache, d, true)), sym_c(sym_prod(x, d + 1, x->shape.rank, true)));
  lower_call(lw, KN_copy, NULL, "%s, %s, %s", at_row(n), at_row(x), row_elems(n));
}

const OpDef op_KV_WRITE = {"kv_write", 3, 0, false, kv_write_rule, NULL, kv_write_emit, shape_in0};

// KV_STORE(x, cache): the prefill's keys or values x, every position, copied
// into the cache (an input placed as x); the result is x.
static void kv_store_emit(const Node *n, Lowering *lw) {
  lower_call(lw, KN_copy, NULL, "(float *)%s, %s, %s", buf(n->in[1]), buf(n->in[0]),
             elems_c(n));
  lower_call(lw, KN_copy, NULL, "%s, %s, %s", buf(n), buf(n->in[0]), elems_c(n));
}

const OpDef op_KV_STORE = {"kv_store", 2, 0, false, rule_elementwise, NULL,
                           kv_store_emit, shape_in0};

// POS_SLICE(x, pos): y[r, .., 0, ..] = x[r, .., pos[r], ..] along cat.axis.
static void pos_slice_rule(const Node *n, Rule *r) {
  int d = n->cat.axis;
  for (int i = 0; i < n->shape.rank; i++)
    if (i != d) r->out[i] = r->in[0][i] = factor(r, F_PASS, n->shape.d[i]);
  r->out[d] = factor(r, F_FULL, 1);
  r->in[0][d] = factor(r, F_FULL, n->in[0]->shape.d[d]);
  r->in[1][0] = r->out[0];
}

static void pos_slice_emit(const Node *n, Lowering *lw) {
  const Node *x = n->in[0];
  int d = n->cat.axis;
  row_loop(lw, n);
  lower_call(lw, KN_copy_block, NULL, "%s, %s, %s, %s, %s[r_], 1, %s", at_row(n), at_row(x),
             sym_c(sym_prod(x, 1, d, true)), sym_c(sym_dim(x, d, true)), buf(n->in[1]),
             sym_c(sym_prod(x, d + 1, x->shape.rank, true)));
}

// x with one position along cat.axis.
static bool pos_slice_shape(const Node *n, Shape *out) {
  *out = n->in[0]->shape;
  if (n->cat.axis < 0 || n->cat.axis >= out->rank) return false;
  out->d[n->cat.axis] = 1;
  return true;
}

const OpDef op_POS_SLICE = {"pos_slice", 2, 1, false, pos_slice_rule, NULL, pos_slice_emit,
                            pos_slice_shape};

// DEC_CAUSAL(s, pos): scores s[b, .., 1, T] of the query at pos[r] against
// every cached key: CAUSAL's mask (and window) for that one query.
static void last_full_rule(const Node *n, Rule *r) {
  rule_elementwise(n, r);
  r->kind[r->out[n->shape.rank - 1]] = F_FULL;
}

static void dec_causal_emit(const Node *n, Lowering *lw) {
  int rk = n->shape.rank;
  row_loop(lw, n);
  lower_call(lw, KN_causal_mask, NULL, "%s, %s, %s, 1, %s, %s[r_], 0, %s, %s", at_row(n),
             at_row(n->in[0]), sym_c(sym_prod(n, 1, rk - 2, true)),
             sym_c(sym_dim(n, rk - 1, true)), buf(n->in[1]), causal_window(n),
             n->mask.fill == 0 ? "0.0f" : "KDRT_MASKED");
}

const OpDef op_DEC_CAUSAL = {"dec_causal_mask", 2, 0, false, last_full_rule, NULL,
                             dec_causal_emit, shape_in0};

// DEC_ROPE(x, pos): ROPE of x[b, 1, .., 2h] at position pos[r] (plus the
// op's offset); the frequencies as rope_emit writes them.
static void dec_rope_emit(const Node *n, Lowering *lw) {
  int rk = n->shape.rank;
  char *decl, *desc = rope_desc(n, 10, &decl);
  row_loop(lw, n);
  lower_call(lw, KN_rope, decl, "%s, %s, %s, 1, 1, %s, %lld + %s[r_], %d", at_row(n),
             at_row(n->in[0]), desc, sym_c(sym_prod(n, 2, rk - 1, true)),
             (long long)n->rope.offset, buf(n->in[1]),
             n->rope.inverse | n->rope.round << 1); // kdrt_rope.h's mode
}

const OpDef op_DEC_ROPE = {"dec_rope", 2, 1, false, last_full_rule, NULL, dec_rope_emit, shape_in0};

// ---------------------------------------------------------------- the derivation
// qd[id]: the dims of a training-graph value that are the query's sequence
// dim (a bit per dim); copy[id]: its value in the decode graph.

static uint8_t *qd;
static Node **copy;
static Node *positions;
// unmasked[id]: attention scores against the cache not yet causally masked: the
// cache's empty positions (zeros, not the padded window's tokens) must never
// reach a softmax or the values.
static bool *unmasked;

static bool refuse(const Node *n, const char *what) {
  why = format("%s: %s", n->layer ? format("layer '%s'", n->layer) : op_info(n->op).name, what);
  return false;
}

// The decode graph's copy of n (op, attributes, names) on operands in[],
// its query dims q set to extent 1.
static Node *clone(const Node *n, Node **in, int nin, uint8_t q) {
  Node *c = new_node(cur, n->op, nin, in);
  int id = c->id;
  Node *ins[MAX_IN];
  memcpy(ins, c->in, sizeof ins);
  *c = *n;
  c->id = id;
  c->nin = nin;
  memcpy(c->in, ins, sizeof ins);
  c->phase = PH_FORWARD;
  c->grad = NULL, c->rounded = NULL, c->pend = 0, c->bdims = 0;
  for (int d = 0; d < c->shape.rank; d++)
    if (((q >> d) & 1) && !PF) {
      c->shape.d[d] = 1;
      if (c->has_want) c->want.axis[d] = -1; // one position is not split
    }
  // the extents an op keeps in its attributes (its shape rule's) follow
  if (c->op == OP_BROADCAST) c->red.n = c->shape.d[c->red.dim];
  if (c->op == OP_SLICE || c->op == OP_PAD) c->cat.n = c->shape.d[c->cat.axis];
  copy[n->id] = c;
  qd[n->id] = q;
  return c;
}

// A new node of the decode graph beside n's (its layer, place in the file).
static Node *beside(const Node *n, OpKind op, int nin, Node **in, Shape s) {
  Node *c = new_node(cur, op, nin, in);
  c->shape = s;
  c->layer = n->layer;
  c->loc = n->loc;
  c->name = n->name;
  return c;
}

// x (a decode value without query dims, a table over positions where its
// user's other operands have them) read at each row's position: POS_SLICE
// along every dim of q.
static Node *at_positions(const Node *user, Node *x, uint8_t q, int64_t T) {
  for (int d = 0; d < x->shape.rank; d++) {
    if (!((q >> d) & 1)) continue;
    if (x->shape.d[d] != T) return NULL;
    Shape s = x->shape;
    s.d[d] = 1;
    x = beside(user, OP_POS_SLICE, 2, (Node *[]){x, positions}, s);
    x->cat.axis = d;
  }
  return x;
}

// The DOT's dims: operand a's dim i (or b's) is the result's dim *out, or
// contracted (-1).
static int dot_out_dim(const Node *n, int operand, int i) {
  const DotAttr *t = &n->dot;
  const Node *a = n->in[0];
  int nb = t->nb, nk = t->nk, ma = a->shape.rank - nb - nk;
  if (i < nb) return i;
  int j = i - nb;
  if (operand == 0) {
    if (t->ta) return j < nk ? -1 : nb + (j - nk);
    return j < ma ? nb + j : -1;
  }
  int base = nb + ma;
  if (t->tb) return j < n->in[1]->shape.rank - nb - nk ? base + j : -1;
  return j < nk ? -1 : base + (j - nk);
}

static uint8_t dot_q(const Node *n, int operand, uint8_t q) {
  uint8_t out = 0;
  for (int i = 0; i < n->in[operand]->shape.rank; i++)
    if ((q >> i) & 1) {
      int o = dot_out_dim(n, operand, i);
      if (o < 0) return 0xff; // a query position summed over
      out |= 1u << o;
    }
  return out;
}

static int single_dim(uint8_t q) {
  for (int d = 0; d < 8; d++)
    if (q == 1u << d) return d;
  return -1;
}

// Node n into the decode graph; false (why says why) when it cannot be.
static bool derive_node(Graph *g, Node *n, int64_t T) {
  Node *in[MAX_IN];
  uint8_t q = 0, any = 0;
  for (int k = 0; k < n->nin; k++) {
    in[k] = copy[n->in[k]->id];
    if (!in[k]) return refuse(n, "it reads a value the decode step does not have");
    any |= qd[n->in[k]->id];
  }
  const uint8_t q0 = n->nin ? qd[n->in[0]->id] : 0;
  bool opened = false;
  for (int k = 0; k < n->nin; k++) opened |= unmasked[n->in[k]->id];
  if (opened && (n->op == OP_SOFTMAX || n->op == OP_DOT))
    return refuse(n, "attention without a causal mask (the cache's empty positions would count)");
  unmasked[n->id] = opened;
  switch (n->op) {
  case OP_ADD: case OP_MUL: case OP_MAXIMUM: // same shapes: a table over positions is read at them
    for (int k = 0; k < n->nin; k++) q |= qd[n->in[k]->id];
    for (int k = 0; k < n->nin; k++)
      if (qd[n->in[k]->id] != q && !PF) {
        if (qd[n->in[k]->id] || !(in[k] = at_positions(n, in[k], q, T)))
          return refuse(n, "adds values of different positions");
      }
    break;
  case OP_ACT: case OP_SCALE: case OP_ROUND: case OP_PACT: case OP_DROPOUT: case OP_NOISE:
    q = q0;
    break;
  case OP_BIAS: case OP_COL_MUL:
    if (qd[n->in[1]->id]) return refuse(n, "a bias over positions");
    q = q0;
    break;
  case OP_NORM: case OP_SOFTMAX:
    if ((q0 >> (n->shape.rank - 1)) & 1) return refuse(n, "normalizes over positions");
    q = q0;
    break;
  case OP_ATTN_MASK: // keras-hub's padding mask over the keys (the cache's [T])
    if (qd[n->in[1]->id] || n->in[1]->shape.rank != 2)
      return refuse(n, "an attention mask over queries");
    q = q0;
    break;
  case OP_TRANSPOSE:
    for (int d = 0; d < n->shape.rank; d++) q |= ((q0 >> n->perm.perm[d]) & 1) << d;
    break;
  case OP_BROADCAST: case OP_REDUCE_SUM: {
    int nd = n->red.dim;
    if (n->op == OP_REDUCE_SUM && ((q0 >> nd) & 1)) return refuse(n, "sums over positions");
    for (int d = 0; d < n->in[0]->shape.rank; d++) {
      int o = n->op == OP_BROADCAST ? (d < nd ? d : d + 1) : (d < nd ? d : d == nd ? -1 : d - 1);
      if (o >= 0) q |= ((q0 >> d) & 1) << o;
    }
    break;
  }
  case OP_RESHAPE: { // the position dim must be a dim of its own on both sides
    const Shape *a = &n->in[0]->shape, *b = &n->shape;
    for (int d = 0; d < a->rank; d++) {
      if (!((q0 >> d) & 1)) continue;
      int64_t pre = 1, pb = 1;
      for (int i = 0; i < d; i++) pre *= a->d[i];
      int found = -1;
      for (int j = 0; j < b->rank && found < 0; pb *= b->d[j], j++)
        if (pb == pre && b->d[j] == a->d[d]) found = j;
      if (found < 0) return refuse(n, "reshapes positions");
      q |= 1u << found;
    }
    break;
  }
  case OP_GATHER:
    if (qd[n->in[0]->id]) return refuse(n, "a table over positions");
    q = qd[n->in[1]->id];
    break;
  case OP_SLICE: case OP_CONCAT:
    if ((any >> n->cat.axis) & 1) return refuse(n, "slices positions");
    q = any;
    break;
  case OP_CAUSAL: {
    int r = n->shape.rank;
    if (q0 != 1u << (r - 2)) return refuse(n, "a causal mask not over [queries, keys]");
    unmasked[n->id] = false;
    if (PF) {
      q = q0;
      break;
    }
    Node *c = beside(n, OP_DEC_CAUSAL, 2, (Node *[]){in[0], positions}, in[0]->shape);
    c->mask = n->mask;
    unmasked[n->id] = false;
    copy[n->id] = c, qd[n->id] = q0;
    return true;
  }
  case OP_ROPE: {
    if (q0 != 1u << 1) return refuse(n, "rotary embedding not over the positions");
    if (PF) {
      q = q0;
      break;
    }
    Node *c = beside(n, OP_DEC_ROPE, 2, (Node *[]){in[0], positions}, in[0]->shape);
    c->rope = n->rope;
    c->role = n->role;
    copy[n->id] = c, qd[n->id] = q0;
    return true;
  }
  case OP_DOT: {
    uint8_t qa = qd[n->in[0]->id], qb = qd[n->in[1]->id];
    if (qa && qb) { // attention: operand b (keys, values) becomes a cache
      int d = single_dim(qb);
      if (d < 0) return refuse(n, "attention over several position dims");
      Node *cache = new_node(cur, OP_INPUT, 0, NULL);
      cache->shape = n->in[1]->shape;
      bool keys = dot_out_dim(n, 1, d) >= 0; // scores over the cache's positions, not values
      cache->layer = n->layer, cache->loc = n->loc, cache->role = "cache";
      cache->name = format("%s(%s)", keys ? "keys" : "values", n->layer ? n->layer : "attention");
      cache->index = -1; // decode_derive numbers them
      cur->inputs = xgrow(cur->inputs, cur->ninputs, &(int){cur->ninputs}, sizeof *cur->inputs);
      cur->inputs[cur->ninputs++] = cache;
      if (!PF) {
        cache_of = xrealloc(cache_of, sizeof *cache_of * (size_t)(ncaches + 1));
        cache_of[ncaches++] = n;
        Node *w = beside(n, OP_KV_WRITE, 3, (Node *[]){in[1], cache, positions}, in[1]->shape);
        w->cat.axis = d;
        w->name = format("%s written", cache->name);
        in[1] = cache;
      } else { // the prefill keeps every position's, and stores them whole
        in[1] = beside(n, OP_KV_STORE, 2, (Node *[]){in[1], cache}, in[1]->shape);
        in[1]->name = format("%s stored", cache->name);
      }
      qb = 0;
      unmasked[n->id] = keys;
    }
    uint8_t oa = dot_q(n, 0, qa), ob = dot_q(n, 1, qb);
    if (oa == 0xff || ob == 0xff) return refuse(n, "sums over positions");
    q = oa | ob;
    break;
  }
  case OP_PARAM: case OP_CONST: case OP_FILL:
    break;
  default:
    return refuse(n, format("op %s has no decode step", op_info(n->op).name));
  }
  clone(n, in, n->nin, q);
  return true;
}

// Variable p's (a training graph's PARAM node) in dg, made the first time.
static void param(const Graph *g, Graph *dg, Node *p) {
  int i = p->var ? p->var->order : -1;
  if (i < 0 || i >= g->nvars || g->vars[i]->param != p || dg->vars[i]->param) return;
  Var *v = dg->vars[i];
  v->param = clone(p, NULL, 0, 0);
  v->param->var = v;
}

// The caches (made where attention reads them) first among dg's nodes,
// with the other inputs, and the nodes numbered again in order: between
// two layers' nodes they would part the runs of nodes find_blocks folds.
static void first_inputs(Graph *dg) {
  Node **order = xcalloc((size_t)dg->nnodes + 1, sizeof *order);
  int k = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < dg->nnodes; i++)
      if ((dg->nodes[i]->op == OP_INPUT) == !pass) order[k++] = dg->nodes[i];
  for (int i = 0; i < dg->nnodes; i++) dg->nodes[i] = order[i], dg->nodes[i]->id = i;
  xfree(order);
}

// generate's model: token ids [T] (keras-hub's padding_mask beside them),
// one output [T, vocabulary].
static Node *token_input(Graph *g) {
  if (g->noutputs != 1 || g->outputs[0]->shape.rank != 3) return NULL;
  Node *ids = NULL;
  for (int i = 0; i < g->ninputs; i++) {
    const char *name = g->model->inputs[i]->name;
    if (g->inputs[i]->dtype == DT_I32 && g->inputs[i]->shape.rank == 2 &&
        (g->ninputs == 1 || !strcmp(name, "token_ids")))
      ids = g->inputs[i];
    else if (g->ninputs != 2 || strcmp(name, "padding_mask"))
      return NULL;
  }
  return ids && g->outputs[0]->shape.d[1] == ids->shape.d[1] ? ids : NULL;
}

// The decode graph (pf: the prefill graph) of g, whose token ids are ids;
// NULL when there is none (why says why).
static Graph *derive(Graph *g, Node *ids, bool pf) {
  int64_t T = ids->shape.d[1];
  Graph *dg = xcalloc(1, sizeof *dg);
  *dg = (Graph){.model = g->model, .dist = g->dist, .batch = g->batch, .phase = PH_FORWARD};
  cur = dg, PF = pf;
  qd = xcalloc((size_t)g->nnodes, sizeof *qd);
  copy = xcalloc((size_t)g->nnodes, sizeof *copy);
  unmasked = xcalloc((size_t)g->nnodes, sizeof *unmasked);
  // every variable, in order, so that the parameter blob is the program's;
  // each PARAM node where the training graph has it (among its layer's
  // nodes, as find_blocks finds a layer's variables)
  dg->vars = xcalloc((size_t)g->nvars + 1, sizeof *dg->vars);
  for (int i = 0; i < g->nvars; i++) {
    Var *v = xcalloc(1, sizeof *v);
    *v = *g->vars[i];
    v->grad = NULL, v->ema_stat = NULL, v->param = NULL;
    g->vars[i]->order = i;
    dg->vars[dg->nvars++] = v;
  }
  for (int i = 0; i < g->ninputs; i++) {
    Node *x = g->inputs[i];
    Node *c = clone(x, NULL, 0, x == ids ? 1u << 1 : 0);
    dg->inputs = xgrow(dg->inputs, dg->ninputs, &(int){dg->ninputs}, sizeof *dg->inputs);
    dg->inputs[dg->ninputs++] = c;
  }
  positions = new_node(dg, OP_INPUT, 0, NULL);
  positions->shape = (Shape){1, {g->batch}};
  positions->dtype = DT_I32;
  positions->name = "input(positions)";
  positions->index = g->ninputs;
  positions->has_want = true;
  positions->want = place_replicated();
  positions->want.axis[0] = g->dist->batch_axis;
  dg->inputs = xgrow(dg->inputs, dg->ninputs, &(int){dg->ninputs}, sizeof *dg->inputs);
  dg->inputs[dg->ninputs++] = positions;

  // what the output needs, in the forward
  bool *need = xcalloc((size_t)g->nnodes, sizeof *need);
  need[g->outputs[0]->id] = true;
  for (int i = g->nnodes - 1; i >= 0; i--)
    if (need[i])
      for (int k = 0; k < g->nodes[i]->nin; k++) need[g->nodes[i]->in[k]->id] = true;
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->op == OP_PARAM) param(g, dg, n);
    if (!need[i] || copy[i]) continue;
    if (n->phase != PH_FORWARD || n->op == OP_INPUT || n->op == OP_LABEL) {
      refuse(n, "the output reads something other than the inputs and weights");
      return NULL;
    }
    if (!derive_node(g, n, T)) return NULL;
  }
  for (int i = 0; i < g->nvars; i++) param(g, dg, g->vars[i]->param);
  first_inputs(dg);
  Node *o = copy[g->outputs[0]->id];
  if (qd[g->outputs[0]->id] != 1u << 1 || !ncaches) {
    why = "the output is not one position's";
    return NULL;
  }
  dg->outputs = xcalloc(1, sizeof *dg->outputs);
  dg->outputs[dg->noutputs++] = o;
  for (int k = 0, i = 0; i < dg->ninputs; i++)
    if (dg->inputs[i]->index < 0) dg->inputs[i]->index = g->ninputs + 1 + k++;
  xfree(need);
  return dg;
}

void decode_derive(Graph *g) {
  DG = PG = NULL, why = NULL, ncaches = 0, cache_of = NULL; // (release_all may have freed them)
  Node *ids = token_input(g);
  if (!ids || !(DG = derive(g, ids, false))) return;
  verify_graph(DG, "decode_derive (decode)", false);
  if ((PG = derive(g, ids, true))) verify_graph(PG, "decode_derive (prefill)", false);
}

// dg's repeated blocks whose layers' variables are not at one stride in
// the training program's blob (plan_memory lays dg's out as the program's:
// a VarBlock the training graph has not may be laid out otherwise) are
// written out instead.
static void keep_strided(const Graph *g, Graph *dg) {
  bool *drop = xcalloc((size_t)dg->nnodes + 1, sizeof *drop), any = false;
  for (int i = 0; i < dg->nvblocks; i++) {
    const VarBlock *vb = &dg->vblocks[i];
    const Var *a = g->vars[vb->first];
    int64_t stride = g->vars[vb->first + vb->nv]->offset - a->offset;
    bool ok = true;
    for (int j = 0; j < vb->n && ok; j++)
      for (int k = 0; k < vb->nv && ok; k++) {
        const Var *x = g->vars[vb->first + k], *y = g->vars[vb->first + j * vb->nv + k];
        ok = y->offset - x->offset == j * stride && y->sstride == x->sstride;
      }
    for (int bi = 0; bi < dg->nblocks && !ok; bi++) {
      const RepBlock *b = &dg->blocks[bi];
      for (int n = b->start; n < b->start + b->count * b->len && b->vb == i; n++)
        drop[dg->nodes[n]->id] = any = true;
    }
  }
  if (any) drop_blocks(dg, drop);
  xfree(drop);
}

// dg (the decode or the prefill graph) sharded and planned; false (why says
// why) when it cannot run as the program's.
static bool finish(Graph *g, Graph *dg) {
  // the caches as the training graph places what they replace, whole sums
  for (int k = 0, i = 0; i < dg->ninputs; i++) {
    Node *c = dg->inputs[i];
    if (strcmp(c->role ? c->role : "", "cache")) continue;
    const Node *src = cache_of[k++]->in[1];
    c->has_want = true;
    c->want = src->place;
    c->want.partial = c->want.pmax = 0;
  }
  for (int i = 0; i < dg->nvars; i++) { // autodiff's slots, and the program's update groups
    dg->vars[i]->nslots = g->vars[i]->nslots;
    dg->vars[i]->ugroup = g->vars[i]->ugroup;
  }
  const char *what = dg == PG ? "prefill" : "decode";
  find_batch_dims(dg);
  propagate_shardings(dg);
  verify_graph(dg, format("propagate_shardings (%s)", what), true);
  for (int i = 0; i < dg->nnodes; i++) {
    const Node *n = dg->nodes[i], *x = n->nin ? n->in[0] : NULL;
    if (is_collective(n->op) && x->op == OP_INPUT && x->index >= g->ninputs) {
      why = format("the decode step would reshard its %s", x->name);
      return false;
    }
    bool decode_op = n->op == OP_KV_WRITE || n->op == OP_POS_SLICE || n->op == OP_DEC_CAUSAL ||
                     n->op == OP_DEC_ROPE;
    if (decode_op && (n->bdims != 1 || n->place.partial || n->place.pmax)) {
      why = format("%s: its rows are not dim 0 alone", n->name ? n->name : "a decode op");
      return false;
    }
    if (n->op == OP_KV_STORE && !place_eq(&n->in[0]->place, &n->in[1]->place, n->shape.rank)) {
      why = format("%s: the keys or values are not placed as their cache", n->name);
      return false;
    }
  }
  find_blocks(dg); // issue 25: its layers in a loop, as the training step's
  keep_strided(g, dg);
  plan_memory(dg);
  verify_graph(dg, format("plan_memory (%s)", what), true);
  for (int i = 0; i < dg->nvars; i++)
    if (dg->vars[i]->offset != g->vars[i]->offset) {
      why = "its parameter blob is not the program's";
      return false;
    }
  const Node *o = view_base(dg->outputs[0]);
  if (o->region != REGION_ARENA || dg->outputs[0]->place.partial || dg->outputs[0]->place.pmax) {
    why = "its output is not one arena buffer";
    return false;
  }
  return true;
}

void decode_finish(Graph *g) {
  if (DG && !finish(g, DG)) DG = PG = NULL;
  if (PG && !finish(g, PG)) PG = NULL; // the decode step then fills the caches itself
}

// ---------------------------------------------------------------- the C file

// The parts as emit_c writes them (the forward, run as evaluation; the
// repeated blocks' functions first, which they call in a loop), then
// `name` calling them.
static void emit_step_fn(const char *name, const char *what) {
  int nparts;
  StepPart *parts = step_parts(&nparts);
  emit_hparams_begin(); // the layers' hyper-parameters first
  emit_block_fns(emit_c_part);
  out("\n// ---- the %s's parts, in order\n", name);
  for (int i = 0; i < nparts; i++) emit_c_part(&parts[i]);
  emit_hparams_end();
  out("\n// ---- the %s: x = %s, the rows' positions, the caches\n", name, what);
  out("static void %s(kdrt_ctx *c, const void *const *x) {\n", name);
  out("  const void *const *y = NULL;\n");
  emit_step_rows();
  for (int i = 0; i < nparts; i++) out("  %s(c, x, y, EVAL_STEP);\n", parts[i].name);
  out("}\n");
}

// dg's file: its step, its table, and the table registered as `global`.
static bool emit_file(Graph *dg, const char *path, const char *name, const char *global) {
  if (!dg) return false;
  FILE *f = fopen(path, "w");
  if (!f) error("cannot write '%s'", path);
  bool pf = dg == PG;
  emit_begin(dg, f, BACKEND_C);
  emit_preamble(pf ? ": its prefill step for `./train generate` (the caches from a whole window)"
                   : ": its decode step for `./train generate` (one position, key/value caches)");
  emit_step_fn(name, pf ? "the model's inputs" : "the model's inputs for one position");
  const Node *o = dg->outputs[0];
  out("\n// the caches, after the model's inputs and the positions: local floats for BATCH rows\n");
  out("static const int64_t cache_floats[] = {");
  int k = 0;
  for (int i = 0; i < dg->ninputs; i++)
    if (dg->inputs[i]->role && !strcmp(dg->inputs[i]->role, "cache"))
      out("%s\n  %lld /* %s: %s */", k++ ? "," : "", (long long)lelems(dg->inputs[i]),
          dg->inputs[i]->name, describe(dg->inputs[i]));
  out("};\n");
  out("\nstatic const kdrt_decode table = {\n");
  out("  .step = %s,\n  .arena_floats = ARENA_FLOATS,\n  .param_floats = PARAM_FLOATS,\n", name);
  out("  .batch = BATCH,\n  .ncaches = %d,\n  .cache_floats = cache_floats,\n", k);
  out("  .arena_plan = arena_plan,\n");
  out("  .output = {\"%s\", %lld /* %s */, %s},\n", dg->model->outputs[0].layer->name,
      (long long)view_base(o)->offset, off_name(view_base(o)), layout_init(o));
  out("};\n\n");
  out("// The main file's table does not name this one: it registers itself.\n");
  out("__attribute__((constructor)) static void register_table(void) { %s = &table; }\n",
      global);
  if (fclose(f) != 0) error("cannot write '%s'", path);
  return true;
}

bool decode_emit_c(const char *path) {
  return emit_file(DG, path, "decode_step", "kdrt_decode_program");
}

bool prefill_emit_c(const char *path) {
  return emit_file(PG, path, "prefill_step", "kdrt_prefill_program");
}
