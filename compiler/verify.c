// The IR verifier: the invariants every pass must keep, checked after each
// pass (pipeline.c). A failure is a compiler bug, never the user's: it
// names the pass, the node and what is wrong, and stops.
//
// Checked:
//   - ids are positions, and every operand is defined before its use;
//   - operand counts match the op's definition; ranks and extents are sane;
//   - every op's sharding rule agrees with the shapes: all dims mapped to
//     one factor have the same extent (reshape aside, whose groups differ
//     by design);
//   - every node's shape is its op's shape rule's: every op has one but
//     the leaves (INPUT, LABEL, FILL, CONST), whose builder gives it (a
//     reshape's keeps the element count);
//   - a collective keeps its operand's shape;
//   - placements (once shard.c has run): each mesh axis used at most once
//     per tensor (split dims, pending sums, pending maxima together), and
//     every split dim divides by its axis;
//   - integer tensors are only inputs and what reads them as ids, masks or
//     positions (the decode step's, decode.c, which is verified too); a 16-bit
//     one (issue 23's storage) is read by its UNPACK16 alone, or as an
//     operand of a product in 16 bits (a DOT's dot.half, a convolution's
//     win.half), or as the saved
//     x or y of an activation's gradient.
#include "kdcc.h"

#include <stdarg.h>
#include <stdlib.h>

static noreturn void bad(const char *pass, const Node *n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "kdcc: internal error: after %s: %%%d %s (%s): ", pass, n->id,
          op_info(n->op).name, n->layer ? n->layer : "-");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(70);
}

static void check_place(const Graph *g, const char *pass, const Node *n) {
  unsigned used = n->place.partial;
  if (n->place.partial & n->place.pmax) bad(pass, n, "an axis both summed and maxed");
  used |= n->place.pmax;
  for (int d = 0; d < n->shape.rank; d++) {
    int a = n->place.axis[d];
    if (a < 0) continue;
    if (a >= g->dist->mesh.ndim) bad(pass, n, "dim %d split over axis %d of a %d-axis mesh", d,
                                     a, g->dist->mesh.ndim);
    if ((used >> a) & 1) bad(pass, n, "mesh axis '%s' used twice", g->dist->mesh.names[a]);
    used |= 1u << a;
    if (n->shape.d[d] % axis_size(g, a))
      bad(pass, n, "dim %d (%lld) does not divide over '%s'", d, (long long)n->shape.d[d],
          g->dist->mesh.names[a]);
  }
}

// Whether operand k of n may hold integers: ids (GATHER, SCATTER_ADD), a
// mask (ATTN_MASK's), a decode op's positions (its last), what a
// collective moves.
static bool takes_ints(const Node *n, int k) {
  switch (n->op) {
  case OP_GATHER: case OP_SCATTER_ADD: return true;
  case OP_ATTN_MASK: return k == 1;
  case OP_KV_WRITE: case OP_POS_SLICE: case OP_DEC_CAUSAL: case OP_DEC_ROPE: return k == n->nin - 1;
  default: return is_collective(n->op);
  }
}

void verify_graph(const Graph *g, const char *pass, bool placed) {
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    if (n->id != i) bad(pass, n, "id is not its position %d", i);
    int want = op_info(n->op).nin;
    if (want >= 0 && n->nin != want) bad(pass, n, "%d operands, the op takes %d", n->nin, want);
    if (n->nin > MAX_IN) bad(pass, n, "%d operands", n->nin);
    for (int k = 0; k < n->nin; k++) {
      const Node *a = n->in[k];
      if (!a || a->id >= i || g->nodes[a->id] != a)
        bad(pass, n, "operand %d is not defined before its use", k);
      if (a->dtype == DT_U16 && n->op != OP_UNPACK16 &&
          !(n->op == OP_DOT && n->dot.half && k < 2) && !(n->op == OP_ACT_GRAD && k == 1) &&
          // (issue 23: a variable kept in 16 bits, store16.c's var16, updated or looked up)
          !((n->op == OP_UPDATE || n->op == OP_ASSIGN || n->op == OP_GATHER) && k == 0) &&
          !((n->op == OP_CONV2D || n->op == OP_CONV2D_DX || n->op == OP_CONV2D_DW) &&
            n->win.half && k < 2))
        bad(pass, n, "operand %d holds 16-bit values", k);
      if (a->dtype == DT_I32 && !takes_ints(n, k)) bad(pass, n, "operand %d holds integers", k);
    }
    if (n->shape.rank < 0 || n->shape.rank > MAX_RANK) bad(pass, n, "rank %d", n->shape.rank);
    for (int d = 0; d < n->shape.rank; d++)
      if (n->shape.d[d] <= 0) bad(pass, n, "dim %d is %lld", d, (long long)n->shape.d[d]);
    Shape rs;
    if (op_info(n->op).shape && (!op_info(n->op).shape(n, &rs) || !shape_eq(&rs, &n->shape)))
      bad(pass, n, "shape %s, its op's shape rule %s", shape_str(&n->shape),
          op_info(n->op).shape(n, &rs) ? shape_str(&rs) : "fails");
    if (is_collective(n->op)) {
      if (!shape_eq(&n->shape, &n->in[0]->shape)) bad(pass, n, "changes its operand's shape");
    } else if (n->op != OP_RESHAPE) {
      Rule r;
      op_rule(n, &r);
      for (int t = 0; t <= n->nin; t++) {
        const Shape *s = t ? &n->in[t - 1]->shape : &n->shape;
        const int8_t *map = t ? r.in[t - 1] : r.out;
        for (int d = 0; d < s->rank; d++)
          if (map[d] >= 0 && (r.blocked[map[d]] ? s->d[d] % r.size[map[d]]
                                                : s->d[d] != r.size[map[d]]))
            bad(pass, n, "%s dim %d is %lld where its factor is %lld",
                t ? format("operand %d", t - 1) : "the result", d, (long long)s->d[d],
                (long long)r.size[map[d]]);
      }
    }
    if (placed) check_place(g, pass, n);
  }
}
