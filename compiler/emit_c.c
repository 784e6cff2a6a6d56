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

static void emit_part(const StepPart *p) {
  out("\nstatic void %s(kdrt_ctx *c, const void *const *x, const void *const *y, int step) {\n",
      p->name);
  out("  float *P = c->params, *G = c->grads, *A = c->arena;\n");
  out("  float *scratch = A + SCRATCH;\n");
  out("  (void)P; (void)G; (void)x; (void)y; (void)scratch; (void)step;\n");
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

void emit_c(Graph *g, FILE *f) {
  emit_begin(g, f, BACKEND_C);
  emit_preamble("");
  out("\nstatic void init(kdrt_ctx *c) {\n  float *P = c->params;\n  (void)P;\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    out("  kdrt_init_fill(c, P + %s, &(const kdrt_layout)%s, %s, %.17g, %.17g, %s, %s, "
        "0x%016llxull); // %s\n",
        off_name(v->param), layout_init(v->param), init_name[v->init], v->fan_in, v->fan_out,
        flt(v->p0), flt(v->p1), (unsigned long long)hash_str(v->path), v->path);
    out("%s", slot_init(v, format("&(const kdrt_layout)%s", layout_init(v->param))));
  }
  out("}\n");
  emit_steps(emit_part, emit_step);

  emit_program_tables();
  out("\nstatic const kdrt_program program = {\n");
  emit_program_fields("  .", ",\n");
  out("};\n\n");
  out("int main(int argc, char **argv) {\n"
      "  if (argc > 1 && !strcmp(argv[1], \"gradcheck\")) return kdrt_gradcheck(argc - 1, argv + 1, "
      "&program);\n"
      "  return kdrt_main(argc, argv, &program);\n}\n");
}
