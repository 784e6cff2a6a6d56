// Emit the SPMD C program for the CPU runtime (runtime/kdrt.h).
//
// One file per model and mesh, meant to be read: a header with the mesh
// and how a rank finds its coordinates, the memory plan as named constants
// with global shape, layout and local shape beside each, then init, the
// step's parts (forward with the loss, backward with its collectives,
// update, in that order; a long one cut into numbered parts), each
// statement commented with the op and the layer it comes from, every
// collective with the reason shard.c gave for it, and last train_step,
// eval_step and grad_step, each a list of calls to the parts it runs. The
// statements themselves come from the ops' lowerings (ops.c), the same as
// the CUDA program's (emit.c). Output depends only on the graph, so two
// compilations diff cleanly.
#include "kdcc.h"

#include <stdlib.h>
#include <string.h>

void emit_c_part(const StepPart *p) {
  out("\nstatic void %s(kdrt_ctx *c, const void *const *x, const void *const *y, int step%s) {\n",
      p->name, p->block ? ", int l" : "");
  out("  PART_LOCALS;\n"); // emit.c's macro: P, G, A, scratch, the rows
  emit_part_body(p);
  out("}\n");
}

// A step: its parts in order, then its logs.
static void emit_step(const char *name, StepKind kind, const StepPart *parts, int nparts) {
  static const char *const kind_const[] = {"TRAIN_STEP", "EVAL_STEP", "GRAD_STEP"};
  out("\nstatic void %s(kdrt_ctx *c, const void *const *x, const void *const *y, float *logs) {\n",
      name);
  out("  const float *P = c->params, *G = c->grads, *A = c->arena;\n");
  out("  (void)P; (void)G; (void)A;\n");
  emit_step_rows();
  for (int i = 0; i < nparts; i++)
    if ((parts[i].steps >> kind) & 1) out("  %s(c, x, y, %s);\n", parts[i].name, kind_const[kind]);
  for (int k = 0; k < EG->nlogs; k++)
    out("  logs[%d] = %s[0]; // %s\n", k, buf(EG->logs[k].node), EG->logs[k].name);
  out("}\n");
}

// issue 25: whether vb's layers are initialized in a loop over the vars
// table: in it as one macro (emit.c), each variable's initializer the same
// in every layer (its seed is its path's).
static bool init_loop(const Graph *g, const VarBlock *vb) {
  if (!vars_in_macro(vb)) return false;
  for (int k = 0; k < vb->nv; k++) {
    const Var *a = g->vars[vb->first + k];
    for (int j = 1; j < vb->n; j++) {
      const Var *b = g->vars[vb->first + j * vb->nv + k];
      if (a->init != b->init || a->fan_in != b->fan_in || a->fan_out != b->fan_out ||
          a->p0 != b->p0 || a->p1 != b->p1)
        return false;
    }
  }
  return true;
}

static void emit_init(Graph *g) {
  bool loops = false;
  for (int i = 0; i < g->nvblocks; i++) loops |= init_loop(g, &g->vblocks[i]);
  if (loops)
    out("\n// FNV-1a of a variable's path (as kdcc's hash_str): the seed of its initial values\n"
        "static uint64_t path_seed(const char *s) {\n"
        "  uint64_t h = 0xcbf29ce484222325ull;\n"
        "  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;\n"
        "  return h;\n}\n");
  out("\nstatic void init(kdrt_ctx *c) {\n  float *P = c->params;\n  (void)P;\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    int layer, k;
    const VarBlock *vb = var_block(g, v, &layer, &k);
    if (vb && init_loop(g, vb)) {
      if (layer || k) continue;
      out("  for (int l = 0; l < %d; l++) { // block %d's layers, each from its vars[] entries\n",
          vb->n, vb->id);
      out("    const kdrt_var *v = vars + %d + l * %d;\n", vb->first, vb->nv);
      for (int j = 0; j < vb->nv; j++) {
        const Var *w = g->vars[vb->first + j];
        out("    %sP + v[%d].offset, &v[%d].layout, %s, %.17g, %.17g, %s, %s, "
            "path_seed(v[%d].path)); // %s\n", init_fill(w), j, j, init_name[w->init], w->fan_in,
            w->fan_out,
            flt(w->p0), flt(w->p1), j, vb->gen[j]);
        if (*slot_init(w, "")) // Adagrad's accumulator
          out("    %sP + v[%d].offset + v[%d].stride, &v[%d].layout, "
              "KDRT_INIT_CONSTANT, 0, 0, %s, 0, 0);\n", init_fill(w), j, j, j,
              accum_init(w));
      }
      out("  }\n");
      continue;
    }
    out("  %sP + %s, &(const kdrt_layout)%s, %s, %.17g, %.17g, %s, %s, "
        "0x%016llxull); // %s\n",
        init_fill(v), off_name(v->param), layout_init(v->param), init_name[v->init], v->fan_in,
        v->fan_out, flt(v->p0), flt(v->p1), (unsigned long long)hash_str(v->path), v->path);
    out("%s", slot_init(v, format("&(const kdrt_layout)%s", layout_init(v->param))));
  }
  out("}\n");
}

void emit_c(Graph *g, FILE *f) {
  emit_begin(g, f, BACKEND_C);
  emit_preamble("");
  // init after the tables when a block's layers are initialized from vars[]
  bool loops = false;
  for (int i = 0; i < g->nvblocks; i++) loops |= init_loop(g, &g->vblocks[i]);
  if (!loops) emit_init(g);
  emit_steps(emit_c_part, emit_step);

  emit_program_tables();
  if (loops) emit_init(g);
  out("\nstatic const kdrt_program program = {\n");
  emit_program_fields("  .", ",\n");
  out("};\n\n");
  out("int main(int argc, char **argv) {\n"
      "  if (argc > 1 && !strcmp(argv[1], \"gradcheck\")) return kdrt_gradcheck(argc - 1, argv + 1, "
      "&program);\n"
      "  return kdrt_main(argc, argv, &program);\n}\n");
}
