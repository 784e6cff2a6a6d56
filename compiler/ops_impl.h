// The op files' own header: what ops.c defines and ops_nn.c uses besides
// kdcc.h, the pieces an op's rule, gradient and lowering are made of. No
// other pass needs them. ops_nn.c calls down into ops.c, never the other
// way: the table of every op (op_defs), which names both files' OpDefs,
// is at the end of ops_nn.c (ops.c's op_make reads it, as data).
#ifndef OPS_IMPL_H
#define OPS_IMPL_H

#include "kdcc.h"

// ---------------------------------------------------------------- ops.c
// Sharding rules: a new factor of r (its kind and size, unblocked); every
// dim of the result its own PASS factor shared by the operands of the same
// rank; so, but along dim ax each its own extent, needed whole (CONCAT's);
// x's factors shared with b (or g) over x's trailing dims.
int factor(Rule *r, FactorKind kind, int64_t size);
void rule_elementwise(const Node *n, Rule *r);
void rule_whole_axis(const Node *n, Rule *r, int ax);
void bias_rule(const Node *n, Rule *r);

// Shape rules: the first operand's shape (elementwise ops, gradients in
// their first operand), the second's, a scalar, the last dim dropped.
bool shape_in0(const Node *n, Shape *out);
bool shape_in1(const Node *n, Shape *out);
bool shape_scalar(const Node *n, Shape *out);
bool shape_rows(const Node *n, Shape *out);

// Gradients: a DOT of a and b with these attributes (dot_shape's); dy
// summed to the shape of b, a bias over dy's trailing dims (BIAS_GRAD).
Node *dot(Graph *g, Node *a, Node *b, int nb, int nk, bool ta, bool tb);
Node *bias_grad_of(Graph *g, Node *dy, const Node *b);

// Lowerings, as C over local blocks: "KDRT_ACT_<NAME>" by activation; n
// as [rows, last dim] and its elements; as [lead, trailing dims of rank
// rb]; the first index of this device's block of dim d.
extern const char *const act_c[];
char *rows_c(const Node *n);
char *cols_c(const Node *n);
char *elems_c(const Node *n);
char *lead_c(const Node *n, int rb);
char *trail_c(const Node *n, int rb);
char *block_start(const Node *n, int d);
// ROPE's kdrt_rotary descriptor as the call passes it (ops_nn.c): "&r",
// *decl declaring r at the call (indent: its continuation lines'), or
// (issue 25) a block's table of its layers' ("NAME[l]"), *decl NULL.
char *rope_desc(const Node *n, int indent, char **decl);
// A causal mask's window (0: none) as its call reads it: in a block, by layer.
char *causal_window(const Node *n);
// issue 25: attention's scale of the scores, v, as a named constant of n's
// layer, 1 / sqrt(head_dim) in its comment where it is one (ops_nn.c).
char *attn_scale(const Node *n, double v);
// issue 23 (ops.c): how a 16-bit product reads an operand (KDRT_OPND_*: its
// 16 bits, exact float32 values, or float32 values it rounds)
const char *form16(const Node *x, bool rounds);
const char *widen16_c(void); // issue 23: kdrt_matmul16's buffer (kdrt_widen16), or "NULL"

#endif
