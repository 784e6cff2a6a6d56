// Emit the SPMD C program for the CPU runtime (runtime/kdrt.h).
//
// One file per model and mesh, meant to be read: a header with the mesh
// and how a rank finds its coordinates, the memory plan as named constants
// with global shape, layout and local shape beside each, then init,
// train_step (forward, loss, backward with its collectives, update, in
// that order), eval_step and grad_step, each statement commented with the
// op and the layer it comes from; every collective carries the reason
// shard.c gave for it. The statements themselves come from the ops'
// lowerings (ops.c), the same as the CUDA program's (emit.c). Output
// depends only on the graph, so two compilations diff cleanly.
#include "kdcc.h"

#include <stdlib.h>
#include <string.h>

static void emit_step(const char *name, StepKind kind) {
  out("\nstatic void %s(kdrt_ctx *c, const void *const *x, const void *const *y, float *logs) {\n",
      name);
  out("  float *P = c->params, *G = c->grads, *A = c->arena;\n");
  out("  float *scratch = A + SCRATCH;\n");
  out("  (void)P; (void)G; (void)x; (void)y; (void)scratch;\n");
  emit_step_body(kind);
  out("\n");
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
  }
  out("}\n");
  emit_step("train_step", STEP_TRAIN);
  emit_step("eval_step", STEP_EVAL);
  out("\n// The training step without the update, for `./train gradcheck`.");
  emit_step("grad_step", STEP_GRAD);

  emit_program_tables();
  out("\nstatic const kdrt_program program = {\n");
  emit_program_fields("  .", ",\n");
  out("};\n\n");
  out("int main(int argc, char **argv) {\n"
      "  if (argc > 1 && !strcmp(argv[1], \"gradcheck\")) return kdrt_gradcheck(argc - 1, argv + 1, "
      "&program);\n"
      "  return kdrt_main(argc, argv, &program);\n}\n");
}
