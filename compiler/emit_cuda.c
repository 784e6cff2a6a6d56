// Emit the SPMD program for the CUDA runtime (runtime/cuda/kdrt_cuda.h).
//
// The same program as emit_c.c's, statement for statement: the same memory
// plan as named constants (now offsets into device blobs), the same op
// order with the same comments and collective reasons, the same init (on
// the host, with the CPU runtime's kdrt_init_fill, so both backends start
// from the same numbers) and the same kdrt_program for the CPU runtime's
// kdrt_main. Only the calls change: every op is a kdrt_cuda_* call on the
// device state d, and each step begins by copying this rank's rows of the
// batch to the device (kdrt_cuda_begin) and ends by copying the loss and
// metric back (kdrt_cuda_end).
//
// The output is compiled by nvcc, i.e. as C++: no compound literals and no
// designated initializers; layouts and shapes are named static constants.
// The generated file holds no kernels (they live in the runtime library),
// so it compiles quickly for any architecture.
#include "kdcc.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>


// ---- ops

static void emit_op(const Node *n, bool train) {
  Shape ls = lshape(n);
  const Node *a = n->nin > 0 ? n->in[0] : NULL, *b = n->nin > 1 ? n->in[1] : NULL;
  emit_op_comment(n);
  char *y = n->op == OP_UPDATE ? NULL : buf(n);
  int64_t N = lelems(n);
  switch (n->op) {
  case OP_INPUT: case OP_LABEL: case OP_PARAM:
    return;
  case OP_RESHAPE:
    out("  //   a view of %%%d: no code\n", a->id);
    return;
  case OP_MATMUL: {
    Shape as = lshape(a), bs = lshape(b);
    int64_t k = n->ta ? as.d[0] : as.d[1];
    out("  kdrt_cuda_matmul(d, %d, %d, %lld, %lld, %lld, %s, %lld, %s, %lld, %s, %lld);\n", n->ta,
        n->tb, (long long)ls.d[0], (long long)ls.d[1], (long long)k, buf(a), (long long)as.d[1],
        buf(b), (long long)bs.d[1], y, (long long)ls.d[1]);
    return;
  }
  case OP_BIAS: case OP_BIAS_ACT: {
    int64_t cols = ls.d[ls.rank - 1];
    out("  kdrt_cuda_bias_act(d, %s, %s, %s, %s, %lld, %lld);\n",
        act_c[n->op == OP_BIAS ? ACT_LINEAR : n->act], y, buf(a), buf(b), (long long)(N / cols),
        (long long)cols);
    return;
  }
  case OP_ACT:
    out("  kdrt_cuda_act(d, %s, %s, %s, %lld);\n", act_c[n->act], y, buf(a), (long long)N);
    return;
  case OP_ACT_GRAD:
    out("  kdrt_cuda_act_grad(d, %s, %s, %s, %s, %s, %lld);\n", act_c[n->act], y, buf(a), buf(b),
        buf(b), (long long)N);
    return;
  case OP_SOFTMAX:
    out("  kdrt_cuda_softmax(d, %s, %s, %lld, %lld);\n", y, buf(a),
        (long long)(N / ls.d[ls.rank - 1]), (long long)ls.d[ls.rank - 1]);
    return;
  case OP_SOFTMAX_GRAD:
    out("  kdrt_cuda_softmax_grad(d, %s, %s, %s, %lld, %lld);\n", y, buf(a), buf(b),
        (long long)(N / ls.d[ls.rank - 1]), (long long)ls.d[ls.rank - 1]);
    return;
  case OP_ADD:
    out("  {\n    const float *in[] = {");
    for (int i = 0; i < n->nin; i++) out("%s%s", i ? ", " : "", buf(n->in[i]));
    out("};\n    kdrt_cuda_add(d, %s, in, %d, %lld);\n  }\n", y, n->nin, (long long)N);
    return;
  case OP_CONCAT: {
    int64_t off = 0;
    for (int i = 0; i < n->nin; i++) {
      Shape is = lshape(n->in[i]);
      out("  kdrt_cuda_place_block(d, %s, %s, %lld, %lld, %lld, %lld, %lld);\n", y,
          buf(n->in[i]), (long long)prod(&ls, 0, n->axis), (long long)is.d[n->axis],
          (long long)off, (long long)ls.d[n->axis], (long long)prod(&ls, n->axis + 1, ls.rank));
      off += is.d[n->axis];
    }
    return;
  }
  case OP_SLICE: {
    Shape is = lshape(a);
    out("  kdrt_cuda_copy_block(d, %s, %s, %lld, %lld, %lld, %lld, %lld);\n", y, buf(a),
        (long long)prod(&ls, 0, n->axis), (long long)is.d[n->axis], (long long)n->start,
        (long long)ls.d[n->axis], (long long)prod(&ls, n->axis + 1, ls.rank));
    return;
  }
  case OP_DROPOUT:
    if (train)
      out("  {\n    static const kdrt_layout l = %s;\n"
          "    kdrt_cuda_dropout(d, %s, %s, &l, %s, 0x%016llxull);\n  }\n",
          layout_init(n), y, buf(a), flt(n->rate), (unsigned long long)n->stream);
    else
      out("  kdrt_cuda_copy(d, %s, %s, %lld); // no dropout outside training\n", y, buf(a),
          (long long)N);
    return;
  case OP_SCALE:
    out("  kdrt_cuda_scale(d, %s, %s, %lld, %s, %s);\n", y, buf(a), (long long)N, flt(n->scale),
        flt(n->shift));
    return;
  case OP_CONV2D:
    out("  kdrt_cuda_conv2d(d, %s, %s, %s, ", y, buf(a), buf(b));
    emit_conv_args(n, a, n);
    out(");\n");
    return;
  case OP_CONV2D_DX:
    out("  kdrt_cuda_conv2d_dx(d, %s, %s, %s, ", y, buf(a), buf(b));
    emit_conv_args(n, n, a);
    out(");\n");
    return;
  case OP_CONV2D_DW:
    out("  kdrt_cuda_conv2d_dw(d, %s, %s, %s, ", y, buf(a), buf(b));
    emit_conv_args(n, a, b);
    out(");\n");
    return;
  case OP_MAXPOOL: {
    Shape xs = lshape(a);
    out("  kdrt_cuda_maxpool(d, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %d, %d, %d, %d, %lld, "
        "%lld);\n",
        y, buf(a), (long long)xs.d[0], (long long)xs.d[1], (long long)xs.d[2], (long long)xs.d[3],
        n->kh, n->kw, n->sh, n->sw, n->pad_t, n->pad_l, (long long)ls.d[1], (long long)ls.d[2]);
    return;
  }
  case OP_MAXPOOL_GRAD: {
    Shape ys = lshape(a);
    out("  kdrt_cuda_maxpool_grad(d, %s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %d, %d, %d, %d, "
        "%lld, %lld);\n",
        y, buf(a), buf(b), (long long)ls.d[0], (long long)ls.d[1], (long long)ls.d[2],
        (long long)ls.d[3], n->kh, n->kw, n->sh, n->sw, n->pad_t, n->pad_l, (long long)ys.d[1],
        (long long)ys.d[2]);
    return;
  }
  case OP_LOSS: case OP_METRIC: case OP_LOSS_GRAD: {
    Shape ps = lshape(a);
    int64_t rows = ps.d[0], cols = ps.rank > 1 ? prod(&ps, 1, ps.rank) : 1;
    const char *fn = n->op == OP_LOSS     ? "kdrt_cuda_loss"
                     : n->op == OP_METRIC ? "kdrt_cuda_accuracy"
                                          : "kdrt_cuda_loss_grad";
    out("  %s(d, %d, %d, %s, %s, %s, %lld, %lld, 1.0 / %d);\n", fn, n->loss, n->from_logits, y,
        buf(a), buf(b), (long long)rows, (long long)cols, EG->batch);
    return;
  }
  case OP_BIAS_GRAD: {
    int64_t cols = ls.d[0], rows = lelems(a) / cols;
    out("  kdrt_cuda_bias_grad(d, %s, %s, %lld, %lld);\n", y, buf(a), (long long)rows,
        (long long)cols);
    return;
  }
  case OP_UPDATE: {
    const Var *v = n->var;
    const Optimizer *o = &EG->model->opt;
    char *w = buf(n->in[0]), *gr = buf(n->in[1]);
    int64_t stride = (lelems(n->in[0]) + 15) / 16 * 16;
    char *s1 = format("(P + %s + %lld)", off_name(v->param), (long long)stride);
    char *s2 = format("(P + %s + %lld)", off_name(v->param), (long long)(2 * stride));
    switch (o->kind) {
    case OPT_SGD:
      out("  kdrt_cuda_sgd(d, %s, %s, %s, %lld, c->lr, %s, %d);\n", w, gr,
          v->nslots ? s1 : "NULL", (long long)N, flt(o->momentum), o->nesterov);
      break;
    case OPT_ADAM:
      out("  kdrt_cuda_adam(d, %s, %s, %s, %s, %lld, c->lr, %s, %s, %s, c->step + 1);\n", w, gr,
          s1, s2, (long long)N, flt(o->beta_1), flt(o->beta_2), flt(o->epsilon));
      break;
    case OPT_ADAMW:
      out("  kdrt_cuda_adamw(d, %s, %s, %s, %s, %lld, c->lr, %s, %s, %s, %s, c->step + 1);\n", w,
          gr, s1, s2, (long long)N, flt(o->beta_1), flt(o->beta_2), flt(o->epsilon),
          flt(o->weight_decay));
      break;
    case OPT_RMSPROP:
      out("  kdrt_cuda_rmsprop(d, %s, %s, %s, %s, %lld, c->lr, %s, %s, %s);\n", w, gr, s1,
          v->nslots > 1 ? s2 : "NULL", (long long)N, flt(o->rho), flt(o->momentum),
          flt(o->epsilon));
      break;
    }
    return;
  }
  case OP_ALLREDUCE:
    out("  kdrt_cuda_allreduce(d, 0x%x, %s, %s, %lld);\n", n->axes, buf(a), y, (long long)N);
    return;
  case OP_REDUCE_SCATTER: case OP_ALLGATHER: case OP_LOCAL_SLICE: {
    Shape is = lshape(a);
    const char *fn = n->op == OP_REDUCE_SCATTER ? "kdrt_cuda_reduce_scatter"
                     : n->op == OP_ALLGATHER    ? "kdrt_cuda_allgather"
                                                : "kdrt_cuda_slice";
    out("  {\n    static const int64_t s[] = %s;\n    %s(d, 0x%x, %d, s, %d, %s, %s);\n  }\n",
        dims_init(&is), fn, n->axes, is.rank, n->axis, buf(a), y);
    return;
  }
  case OP_ALLTOALL: {
    Shape is = lshape(a);
    out("  {\n    static const int64_t s[] = %s;\n"
        "    kdrt_cuda_alltoall(d, 0x%x, %d, s, %d, %d, %s, %s);\n  }\n",
        dims_init(&is), n->axes, is.rank, n->axis, n->axis2, buf(a), y);
    return;
  }
  case OP_COUNT: break;
  }
  unreachable();
}

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

typedef enum { STEP_TRAIN, STEP_EVAL, STEP_GRAD } StepKind;

static void emit_step(const char *name, StepKind kind) {
  static const char *mode[] = {"KDRT_CUDA_TRAIN", "KDRT_CUDA_EVAL", "KDRT_CUDA_GRAD"};
  bool train = kind != STEP_EVAL;
  out("\nstatic void %s(kdrt_ctx *c, const float *hx, const float *hy, float *loss, "
      "float *metric) {\n", name);
  out("  kdrt_cuda *d = kdrt_cuda_begin(c, %s, hx, hy); // this rank's rows to the device\n",
      mode[kind]);
  // The body first, so that only the buffers it uses are declared (nvcc
  // warns about the others, (void) casts or not).
  FILE *whole = EF;
  char *body = NULL;
  size_t body_len = 0;
  EF = open_memstream(&body, &body_len);
  if (!EF) error("out of memory");
  Phase ph = -1;
  static const char *phase_title[] = {"forward", "loss", "backward", "update"};
  for (int i = 0; i < EG->nnodes; i++) {
    const Node *n = EG->nodes[i];
    if (kind == STEP_EVAL && n->phase > PH_LOSS) continue;
    if (kind == STEP_GRAD && n->op == OP_UPDATE) continue;
    if (n->phase != ph) {
      ph = n->phase;
      out("\n  // ======== %s\n", phase_title[ph]);
    }
    emit_op(n, train);
  }
  out("\n  kdrt_cuda_end(d, %s, %s, %s, loss, metric);\n}\n", mode[kind], buf(EG->loss),
      EG->metric ? buf(EG->metric) : "NULL");
  if (fclose(EF) != 0) error("out of memory");
  EF = whole;
  static const char *decl[][2] = {
    {"P", "  float *P = d->params;\n"}, {"G", "  float *G = d->grads;\n"},
    {"A", "  float *A = d->arena;\n"}, {"x", "  const float *x = d->x;\n"},
    {"y", "  const float *y = d->y;\n"}, {"scratch", "  float *scratch = A + SCRATCH;\n"},
  };
  for (size_t i = 0; i < sizeof decl / sizeof decl[0]; i++)
    if (uses_ident(body, decl[i][0]) || (!strcmp(decl[i][0], "A") && uses_ident(body, "scratch")))
      out("%s", decl[i][1]);
  fputs(body, EF);
  free(body);
}

static const char *precision_enum(const char *p) {
  return !strcmp(p, "tf32") ? "KDRT_PREC_TF32" : !strcmp(p, "bf16") ? "KDRT_PREC_BF16"
                                                                    : "KDRT_PREC_FP32";
}

void emit_cuda(Graph *g, FILE *f, const char *arch, const char *precision) {
  emit_begin(g, f);
  const Mesh *m = &g->dist->mesh;
  const Model *md = g->model;
  out("// Generated by kdcc from %s for CUDA (%s, %s matrix products). Do not edit:\n"
      "// recompile instead.\n//\n", md->file, arch, precision);
  out("// Model '%s', one SPMD program for every device of the mesh\n//   (", md->name);
  for (int a = 0; a < m->ndim; a++) out("%s%s=%d", a ? ", " : "", m->names[a], m->shape[a]);
  out("), %d device%s, global batch %d", m->size, m->size == 1 ? "" : "s", g->batch);
  if (g->dist->batch_axis >= 0)
    out(" split over '%s' (%d per device)", m->names[g->dist->batch_axis],
        g->batch / m->shape[g->dist->batch_axis]);
  out(".\n// A device's MPI rank gives its mesh coordinates, row-major as Keras fills the mesh:\n");
  for (int a = 0; a < m->ndim; a++) {
    int inner = 1;
    for (int b = a + 1; b < m->ndim; b++) inner *= m->shape[b];
    out("//   coord[%s] = rank / %d %% %d\n", m->names[a], inner, m->shape[a]);
  }
  out("// (kdrt_main fills c->coord); each rank drives one GPU. Buffers are per device; shapes\n"
      "// below are global, then the layout (one entry per dim: the mesh axis it is split\n"
      "// over), then local. The same plan as the CPU program's, in device memory: P, G and A\n"
      "// below are device pointers, x and y this rank's rows of the batch on the device.\n\n");
  out("#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n\n#include \"kdrt_cuda.h\"\n");

  out("\n// ---- parameter blob: each variable's shard, then its optimizer slots\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    out("#define %-32s %8lld // %s, %d slot%s\n", off_name(v->param), (long long)v->offset,
        describe(v->param), v->nslots, v->nslots == 1 ? "" : "s");
  }
  out("#define PARAM_FLOATS %lld\n", (long long)g->param_floats);
  out("\n// ---- gradient blob: each variable's gradient, reduced to its layout\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    if (v->grad)
      out("#define %-32s %8lld // %s\n", off_name(v->grad), (long long)v->goffset,
          describe(v->grad));
  }
  out("#define GRAD_FLOATS %lld\n", (long long)g->grad_floats);
  out("\n// ---- activation arena: buffers reused by liveness\n");
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    if (n->region != REGION_ARENA || n->op == OP_RESHAPE) continue;
    out("#define %-32s %8lld // %s\n", off_name(n), (long long)n->offset, describe(n));
  }
  out("#define SCRATCH %lld // conv im2col scratch, %lld floats\n",
      (long long)(g->arena_floats - g->scratch_floats), (long long)g->scratch_floats);
  out("#define ARENA_FLOATS %lld\n", (long long)g->arena_floats);

  out("\n// Initial values on the host, exactly as the CPU program makes them; the first step\n"
      "// uploads them.\nstatic void init(kdrt_ctx *c) {\n  float *P = c->params;\n  (void)P;\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    out("  {\n    static const kdrt_layout l = %s; // %s\n", layout_init(v->param), v->path);
    out("    kdrt_init_fill(c, P + %s, &l, %s, %.17g, %.17g, %s, %s, 0x%016llxull);\n  }\n",
        off_name(v->param), init_name[v->init], v->fan_in, v->fan_out, flt(v->p0), flt(v->p1),
        (unsigned long long)hash_str(v->path));
  }
  out("}\n");
  emit_step("train_step", STEP_TRAIN);
  emit_step("eval_step", STEP_EVAL);
  out("\n// The training step without the update, for `./train gradcheck`.");
  emit_step("grad_step", STEP_GRAD);

  emit_program_tables();
  out("\n// The program for the CPU runtime's kdrt_main, field by field.\n");
  out("static kdrt_program describe_program(void) {\n  kdrt_program p;\n"
      "  memset(&p, 0, sizeof p);\n");
  emit_program_fields("  p.", ";\n");
  const Node *pb = view_base(EG->pred);
  if (pb->region == REGION_ARENA && !EG->pred->place.partial) {
    out("  static const kdrt_layout pred_layout = %s;\n", layout_init(EG->pred));
    out("  p.pred_layout = pred_layout;\n");
  }
  out("  return p;\n}\n\n");
  out("int main(int argc, char **argv) {\n"
      "  static kdrt_program program;\n"
      "  program = describe_program();\n"
      "  return kdrt_cuda_main(argc, argv, &program, %s);\n}\n",
      precision_enum(precision));
}
