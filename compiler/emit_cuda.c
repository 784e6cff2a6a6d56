// Emit the SPMD program for the CUDA runtime (runtime/cuda/kdrt_cuda.h).
//
// The same program as emit_c.c's, statement for statement: the same memory
// plan as named constants (now offsets into device blobs), the same op
// order with the same comments and collective reasons, the same init (on
// the host, with the CPU runtime's kdrt_init_fill, so both backends start
// from the same numbers) and the same kdrt_program for the CPU runtime's
// kdrt_main, the same parts shared by the three steps. Only the calls
// change: every op is a kdrt_cuda_* call on the device state d, and each
// step begins by copying this rank's rows of the batch to the device
// (kdrt_cuda_begin), calls its parts, and ends by copying the loss and
// metric back (kdrt_cuda_end). A training step's parts are what a CUDA
// graph captures and replays (kdrt_cuda_replay), with the setjmp that a
// failed capture returns to before them; tests/sh/cuda_graph.sh checks that
// nothing in them reads a host value a graph would freeze.
//
// The output is compiled by nvcc, i.e. as C++: no compound literals and no
// designated initializers; layouts and shapes are named static constants.
// The generated file holds no kernels (they live in the runtime library),
// so it compiles quickly for any architecture.
#include "kdcc.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>


// Whether code (comments skipped) names the identifier id.
static bool uses_ident(const char *code, const char *id) {
  size_t len = strlen(id);
  for (const char *p = code; *p; p++) {
    if (p[0] == '/' && p[1] == '/') { // a comment, to the line's end
      while (*p && *p != '\n') p++;
      if (!*p) break;
      continue;
    }
    if (p[0] == '"') { // a string literal
      for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && p[1]) p++;
      if (!*p) break;
      continue;
    }
    if (!strncmp(p, id, len) && (p == code || !(isalnum((unsigned char)p[-1]) || p[-1] == '_')) &&
        !(isalnum((unsigned char)p[len]) || p[len] == '_'))
      return true;
    if (isalnum((unsigned char)*p) || *p == '_') // skip the rest of this identifier
      while (isalnum((unsigned char)p[1]) || p[1] == '_') p++;
  }
  return false;
}

// text's code declarations of the buffers it uses (nvcc warns about the
// others, (void) casts or not), with `d`'s fields.
static void emit_uses(const char *text) {
  static const char *decl[][2] = {
    {"P", "  float *P = d->params;\n"}, {"G", "  float *G = d->grads;\n"},
    {"A", "  float *A = d->arena;\n"}, {"x", "  const void *const *x = d->x;\n"},
    {"y", "  const void *const *y = (const void *const *)d->y;\n"},
    {"scratch", "  float *scratch = A + SCRATCH;\n"},
  };
  for (size_t i = 0; i < sizeof decl / sizeof decl[0]; i++)
    if (uses_ident(text, decl[i][0]) || (!strcmp(decl[i][0], "A") && uses_ident(text, "scratch")))
      out("%s", decl[i][1]);
}

// One part: its body first, so that only the buffers it uses are declared.
static void emit_part(const StepPart *p) {
  out("\nstatic void %s(kdrt_ctx *c, kdrt_cuda *d, int step%s) {\n", p->name,
      p->block ? ", int l" : ""); // issue 25: a block's function, of the layer l
  FILE *whole = EF;
  char *body = NULL;
  size_t body_len = 0;
  EF = open_memstream(&body, &body_len);
  if (!EF) error("out of memory");
  out("  STEP_ROWS;\n"); // emit.c's macro: B, b
  emit_part_body(p);
  if (fclose(EF) != 0) error("out of memory");
  EF = whole;
  out("  (void)c; (void)step;\n");
  emit_uses(body);
  fputs(body, EF);
  free(body);
  out("}\n");
}

// A step: this rank's rows to the device, the parts in order, the logs back.
static void emit_step(const char *name, StepKind kind, const StepPart *parts, int nparts) {
  static const char *mode[] = {"KDRT_CUDA_TRAIN", "KDRT_CUDA_EVAL", "KDRT_CUDA_GRAD"};
  static const char *const kind_const[] = {"TRAIN_STEP", "EVAL_STEP", "GRAD_STEP"};
  out("\nstatic void %s(kdrt_ctx *c, const void *const *hx, const void *const *hy, float *logs) "
      "{\n", name);
  out("  kdrt_cuda *d = kdrt_cuda_begin(c, %s, hx, hy); // this rank's rows to the device\n",
      mode[kind]);
  FILE *whole = EF;
  char *logs = NULL;
  size_t logs_len = 0;
  EF = open_memstream(&logs, &logs_len);
  if (!EF) error("out of memory");
  emit_step_rows();
  // A training step's parts and log copies are what a CUDA graph captures
  // and replays (kdrt_cuda_replay).
  const char *ind = kind == STEP_TRAIN ? "    " : "  ";
  if (kind == STEP_TRAIN) {
    out("  if (!kdrt_cuda_replay(d, %s)) { // else this step's graph, captured before, is queued\n",
        mode[kind]);
    out("    // a capture that fails comes back here, and the parts run again without a graph\n"
        "    (void)setjmp(*kdrt_cuda_capture_env(d));\n");
  }
  for (int i = 0; i < nparts; i++)
    if ((parts[i].steps >> kind) & 1)
      out("%s%s(c, d, %s);\n", ind, parts[i].name, kind_const[kind]);
  out("%s// the logs, gathered in d->logs and copied back together\n", ind);
  for (int k = 0; k < EG->nlogs; k++)
    out("%skdrt_cuda_copy(d, d->logs + %d, %s, 1); // %s\n", ind, k, buf(EG->logs[k].node),
        EG->logs[k].name);
  if (kind == STEP_TRAIN) out("  }\n");
  out("  kdrt_cuda_end(d, %s, d->logs, logs);\n}\n", mode[kind]);
  if (fclose(EF) != 0) error("out of memory");
  EF = whole;
  emit_uses(logs);
  fputs(logs, EF);
  free(logs);
}

// Every runtime call of the steps, `kdrt_cuda_<fn>(d, ...)`, as a macro that
// first tells the runtime its line in this file (kdrt_cuda_at), so that a
// GPU fault names the op; the calls below read as plain calls.
static void emit_call_sites(const char *code) {
  char **seen = NULL;
  int nseen = 0, cap = 0;
  for (const char *p = code; (p = strstr(p, "kdrt_cuda_"));) {
    const char *q = p + strlen("kdrt_cuda_");
    while (isalnum((unsigned char)*q) || *q == '_') q++;
    bool call = !strncmp(q, "(d, ", 4) && (p == code || !(isalnum((unsigned char)p[-1]) ||
                                                           p[-1] == '_'));
    char *name = call ? format("%.*s", (int)(q - p), p) : NULL;
    for (int i = 0; name && i < nseen; i++)
      if (!strcmp(seen[i], name)) name = NULL;
    if (name) {
      seen = xgrow(seen, nseen, &cap, sizeof *seen);
      seen[nseen++] = name;
    }
    p = q;
  }
  out("\n// Each call below first records its line (kdrt_cuda_at): a GPU fault then names\n"
      "// the op that launched it (with KDRT_CUDA_SYNC=1, exactly), and KDRT_CUDA_PROFILE=1\n"
      "// times each line on the GPU.\n");
  for (int i = 0; i < nseen; i++)
    out("#define %s(d, ...) (kdrt_cuda_at((d), \"%s\", __FILE__, __LINE__), %s((d), __VA_ARGS__))\n",
        seen[i], seen[i] + strlen("kdrt_cuda_"), seen[i]);
}

static const char *precision_enum(const char *p) {
  return !strcmp(p, "tf32") ? "KDRT_PREC_TF32" : !strcmp(p, "bf16") ? "KDRT_PREC_BF16"
                                                                    : "KDRT_PREC_FP32";
}

void emit_cuda(Graph *g, FILE *f, const char *arch, const char *precision) {
  emit_begin(g, f, BACKEND_CUDA);
  emit_preamble(format(" for CUDA (%s, %s matrix products)", arch, precision));
  out("\n// Initial values on the host, exactly as the CPU program makes them; the first step\n"
      "// uploads them.\nstatic void init(kdrt_ctx *c) {\n  float *P = c->params;\n  (void)P;\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    out("  {\n    static const kdrt_layout l = %s; // %s\n", layout_init(v->param), v->path);
    out("    %sP + %s, &l, %s, %.17g, %.17g, %s, %s, 0x%016llxull);\n", init_fill(v),
        off_name(v->param), init_name[v->init], v->fan_in, v->fan_out, flt(v->p0), flt(v->p1),
        (unsigned long long)hash_str(v->path));
    out("%s  }\n", slot_init(v, "&l"));
  }
  out("}\n");
  FILE *whole = EF;
  char *steps = NULL;
  size_t steps_len = 0;
  EF = open_memstream(&steps, &steps_len);
  if (!EF) error("out of memory");
  emit_steps(emit_part, emit_step);
  if (fclose(EF) != 0) error("out of memory");
  EF = whole;
  emit_call_sites(steps);
  fputs(steps, EF);
  free(steps);

  emit_program_tables();
  out("\n// The program for the CPU runtime's kdrt_main, field by field.\n");
  out("static kdrt_program describe_program(void) {\n  kdrt_program p;\n"
      "  memset(&p, 0, sizeof p);\n");
  emit_program_fields("  p.", ";\n");
  out("  return p;\n}\n\n");
  out("int main(int argc, char **argv) {\n"
      "  static kdrt_program program;\n"
      "  program = describe_program();\n"
      "  return kdrt_cuda_main(argc, argv, &program, %s);\n}\n",
      precision_enum(precision));
}
