// Emit the SPMD C program for the CPU runtime.
//
// One file per model and mesh, meant to be read: a header with the mesh
// and how a rank finds its coordinates, the memory plan as named constants
// with global shape, layout and local shape beside each, then init,
// train_step (forward, loss, backward with its collectives, update, in
// that order) and eval_step, each statement commented with the op and the
// layer it comes from. Every collective carries the reason shard.c gave for
// it. Output depends only on the graph, so two compilations diff cleanly.
#include "kdcc.h"

#include <stdlib.h>
#include <string.h>

typedef enum { STEP_TRAIN, STEP_EVAL, STEP_GRAD } StepKind;
static StepKind cur_step; // the step function being written

// C compound literals for a local shape and for a layout.
static char *shape_c(const Shape *s) { return format("(const int64_t[])%s", dims_init(s)); }
static char *layout_c(const Node *n) { return format("&(const kdrt_layout)%s", layout_init(n)); }

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
    bool sgd = n->sgd_into && cur_step == STEP_TRAIN;
    if (sgd) out("  //   the SGD update of %s in the same GEMM: w = w - lr * gradient\n",
                 n->sgd_into->var->path);
    out("  cblas_sgemm(CblasRowMajor, %s, %s, %lld, %lld, %lld, %s, %s, %lld, %s, %lld, %s, "
        "%s, %lld);\n",
        n->ta ? "CblasTrans" : "CblasNoTrans", n->tb ? "CblasTrans" : "CblasNoTrans",
        (long long)ls.d[0], (long long)ls.d[1], (long long)k, sgd ? "-c->lr" : "1.0f", buf(a),
        (long long)as.d[1], buf(b), (long long)bs.d[1], sgd ? "1.0f" : "0.0f",
        sgd ? buf(n->sgd_into) : y, (long long)ls.d[1]);
    return;
  }
  case OP_BIAS: {
    int64_t cols = ls.d[ls.rank - 1];
    out("  {\n    float *restrict o = %s;\n    const float *restrict i = %s, *restrict bias = %s;\n",
        y, buf(a), buf(b));
    out("    for (int64_t r = 0; r < %lld; r++)\n      for (int64_t j = 0; j < %lld; j++) "
        "o[r * %lld + j] = i[r * %lld + j] + bias[j];\n  }\n",
        (long long)(N / cols), (long long)cols, (long long)cols, (long long)cols);
    return;
  }
  case OP_BIAS_ACT: {
    // v = x + bias, then the activation, in one loop
    static const char *expr[] = {"v", "v > 0.0f ? v : 0.0f", "1.0f / (1.0f + expf(-v))",
                                 "tanhf(v)", "0.5f * v * (1.0f + erff(v * 0.70710678f))",
                                 "v / (1.0f + expf(-v))"};
    int64_t cols = ls.d[ls.rank - 1];
    out("  {\n    float *restrict o = %s;\n    const float *restrict i = %s, *restrict bias = %s;\n",
        y, buf(a), buf(b));
    out("    for (int64_t r = 0; r < %lld; r++)\n      for (int64_t j = 0; j < %lld; j++) {\n"
        "        float v = i[r * %lld + j] + bias[j];\n        o[r * %lld + j] = %s;\n      }\n  }\n",
        (long long)(N / cols), (long long)cols, (long long)cols, (long long)cols, expr[n->act]);
    return;
  }
  case OP_ACT:
    out("  kdrt_act(%s, %s, %s, %lld);\n", act_c[n->act], y, buf(a), (long long)N);
    return;
  case OP_ACT_GRAD:
    out("  kdrt_act_grad(%s, %s, %s, %s, %s, %lld);\n", act_c[n->act], y, buf(a), buf(b), buf(b),
        (long long)N);
    return;
  case OP_SOFTMAX:
    out("  kdrt_softmax(%s, %s, %lld, %lld);\n", y, buf(a), (long long)(N / ls.d[ls.rank - 1]),
        (long long)ls.d[ls.rank - 1]);
    return;
  case OP_SOFTMAX_GRAD:
    out("  kdrt_softmax_grad(%s, %s, %s, %lld, %lld);\n", y, buf(a), buf(b),
        (long long)(N / ls.d[ls.rank - 1]), (long long)ls.d[ls.rank - 1]);
    return;
  case OP_ADD:
    out("  {\n    float *restrict o = %s;\n", y);
    for (int i = 0; i < n->nin; i++) out("    const float *restrict i%d = %s;\n", i, buf(n->in[i]));
    out("    for (int64_t e = 0; e < %lld; e++) o[e] = i0[e]", (long long)N);
    for (int i = 1; i < n->nin; i++) out(" + i%d[e]", i);
    out(";\n  }\n");
    return;
  case OP_CONCAT: {
    int64_t off = 0;
    for (int i = 0; i < n->nin; i++) {
      Shape is = lshape(n->in[i]);
      out("  kdrt_place_block(%s, %s, %lld, %lld, %lld, %lld, %lld);\n", y, buf(n->in[i]),
          (long long)prod(&ls, 0, n->axis), (long long)is.d[n->axis], (long long)off,
          (long long)ls.d[n->axis], (long long)prod(&ls, n->axis + 1, ls.rank));
      off += is.d[n->axis];
    }
    return;
  }
  case OP_SLICE: {
    Shape is = lshape(a);
    out("  kdrt_copy_block(%s, %s, %lld, %lld, %lld, %lld, %lld);\n", y, buf(a),
        (long long)prod(&ls, 0, n->axis), (long long)is.d[n->axis], (long long)n->start,
        (long long)ls.d[n->axis], (long long)prod(&ls, n->axis + 1, ls.rank));
    return;
  }
  case OP_DROPOUT:
    if (train)
      out("  kdrt_dropout(c, %s, %s, %s, %s, 0x%016llxull);\n", y, buf(a), layout_c(n),
          flt(n->rate), (unsigned long long)n->stream);
    else out("  memcpy(%s, %s, %lld * sizeof(float)); // no dropout outside training\n", y,
             buf(a), (long long)N);
    return;
  case OP_SCALE:
    out("  {\n    float *restrict o = %s;\n    const float *restrict i = %s;\n"
        "    for (int64_t e = 0; e < %lld; e++) o[e] = i[e] * %s + %s;\n  }\n",
        y, buf(a), (long long)N, flt(n->scale), flt(n->shift));
    return;
  case OP_CONV2D:
    out("  kdrt_conv2d(%s, %s, %s, ", y, buf(a), buf(b));
    emit_conv_args(n, a, n);
    out(");\n");
    return;
  case OP_CONV2D_DX:
    out("  kdrt_conv2d_dx(%s, %s, %s, ", y, buf(a), buf(b));
    emit_conv_args(n, n, a);
    out(");\n");
    return;
  case OP_CONV2D_DW:
    out("  kdrt_conv2d_dw(%s, %s, %s, ", y, buf(a), buf(b));
    emit_conv_args(n, a, b);
    out(");\n");
    return;
  case OP_MAXPOOL: {
    Shape xs = lshape(a);
    out("  kdrt_maxpool(%s, %s, %lld, %lld, %lld, %lld, %d, %d, %d, %d, %d, %d, %lld, %lld);\n", y,
        buf(a), (long long)xs.d[0], (long long)xs.d[1], (long long)xs.d[2], (long long)xs.d[3],
        n->kh, n->kw, n->sh, n->sw, n->pad_t, n->pad_l, (long long)ls.d[1], (long long)ls.d[2]);
    return;
  }
  case OP_MAXPOOL_GRAD: {
    Shape ys = lshape(a);
    out("  kdrt_maxpool_grad(%s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %d, %d, %d, %d, %lld, "
        "%lld);\n",
        y, buf(a), buf(b), (long long)ls.d[0], (long long)ls.d[1], (long long)ls.d[2],
        (long long)ls.d[3], n->kh, n->kw, n->sh, n->sw, n->pad_t, n->pad_l, (long long)ys.d[1],
        (long long)ys.d[2]);
    return;
  }
  case OP_LOSS: case OP_METRIC: case OP_LOSS_GRAD: {
    Shape ps = lshape(a);
    int64_t rows = ps.d[0], cols = ps.rank > 1 ? prod(&ps, 1, ps.rank) : 1;
    const char *fn = n->op == OP_LOSS ? "kdrt_loss" : n->op == OP_METRIC ? "kdrt_accuracy" : NULL;
    if (fn)
      out("  %s[0] = (float)%s(%d, %d, %s, %s, %lld, %lld, 1.0 / %d);\n", y, fn, n->loss,
          n->from_logits, buf(a), buf(b), (long long)rows, (long long)cols, EG->batch);
    else
      out("  kdrt_loss_grad(%d, %d, %s, %s, %s, %lld, %lld, 1.0 / %d);\n", n->loss,
          n->from_logits, y, buf(a), buf(b), (long long)rows, (long long)cols, EG->batch);
    return;
  }
  case OP_BIAS_GRAD: {
    int64_t cols = ls.d[0], rows = lelems(a) / cols;
    out("  {\n    float *restrict o = %s;\n    const float *restrict i = %s;\n", y, buf(a));
    out("    for (int64_t j = 0; j < %lld; j++) o[j] = 0;\n", (long long)cols);
    out("    for (int64_t r = 0; r < %lld; r++)\n      for (int64_t j = 0; j < %lld; j++) o[j] "
        "+= i[r * %lld + j];\n  }\n",
        (long long)rows, (long long)cols, (long long)cols);
    return;
  }
  case OP_UPDATE: {
    const Var *v = n->var;
    if (n->fused) {
      out("  //   done by the GEMM that makes the gradient (%%%d)\n", n->in[1]->id);
      return;
    }
    const Optimizer *o = &EG->model->opt;
    char *w = buf(n->in[0]), *gr = buf(n->in[1]);
    int64_t stride = (lelems(n->in[0]) + 15) / 16 * 16;
    char *s1 = format("(P + %s + %lld)", off_name(v->param), (long long)stride);
    char *s2 = format("(P + %s + %lld)", off_name(v->param), (long long)(2 * stride));
    switch (o->kind) {
    case OPT_SGD:
      out("  kdrt_sgd(%s, %s, %s, %lld, c->lr, %s, %d);\n", w, gr, v->nslots ? s1 : "NULL",
          (long long)N, flt(o->momentum), o->nesterov);
      break;
    case OPT_ADAM:
      out("  kdrt_adam(%s, %s, %s, %s, %lld, c->lr, %s, %s, %s, c->step + 1);\n", w, gr, s1, s2,
          (long long)N, flt(o->beta_1), flt(o->beta_2), flt(o->epsilon));
      break;
    case OPT_ADAMW:
      out("  kdrt_adamw(%s, %s, %s, %s, %lld, c->lr, %s, %s, %s, %s, c->step + 1);\n", w, gr, s1,
          s2, (long long)N, flt(o->beta_1), flt(o->beta_2), flt(o->epsilon),
          flt(o->weight_decay));
      break;
    case OPT_RMSPROP:
      out("  kdrt_rmsprop(%s, %s, %s, %s, %lld, c->lr, %s, %s, %s);\n", w, gr, s1,
          v->nslots > 1 ? s2 : "NULL", (long long)N, flt(o->rho), flt(o->momentum),
          flt(o->epsilon));
      break;
    }
    return;
  }
  case OP_ALLREDUCE:
    out("  kdrt_allreduce(c, 0x%x, %s, %s, %lld);\n", n->axes, buf(a), y, (long long)N);
    return;
  case OP_REDUCE_SCATTER: case OP_ALLGATHER: case OP_LOCAL_SLICE: {
    Shape is = lshape(a);
    const char *fn = n->op == OP_REDUCE_SCATTER ? "kdrt_reduce_scatter"
                   : n->op == OP_ALLGATHER      ? "kdrt_allgather"
                                                : "kdrt_slice";
    out("  %s(c, 0x%x, %d, %s, %d, %s, %s);\n", fn, n->axes, is.rank, shape_c(&is), n->axis,
        buf(a), y);
    return;
  }
  case OP_ALLTOALL: {
    Shape is = lshape(a);
    out("  kdrt_alltoall(c, 0x%x, %d, %s, %d, %d, %s, %s);\n", n->axes, is.rank, shape_c(&is),
        n->axis, n->axis2, buf(a), y);
    return;
  }
  case OP_COUNT: break;
  }
  unreachable();
}

// Gradients all-reduced in place over the same axes whose buffers follow
// each other in the gradient blob go as one bucket: one call, one message.
static bool in_place_grad_sum(const Node *n) {
  const Node *a = n->in[0];
  return n->op == OP_ALLREDUCE && n->region == REGION_GRAD && a->region == REGION_GRAD &&
         a->offset == n->offset;
}

// The last node of the bucket starting at node i (i itself: no bucket).
static int bucket_end(int i) {
  const Node *n = EG->nodes[i];
  if (!in_place_grad_sum(n)) return i;
  int j = i;
  while (j + 1 < EG->nnodes) {
    const Node *a = EG->nodes[j], *b = EG->nodes[j + 1];
    if (!in_place_grad_sum(b) || b->axes != n->axes ||
        b->offset != a->offset + (lelems(a) + 15) / 16 * 16)
      break;
    j++;
  }
  return j;
}

static void emit_bucket(int first, int last) {
  const Node *a = EG->nodes[first], *b = EG->nodes[last];
  int64_t n = b->offset + lelems(b) - a->offset;
  out("\n  // %%%d..%%%d all_reduce over %s, one bucket of %d gradients:\n", a->id, b->id,
      axes_str(EG, a->axes), last - first + 1);
  for (int i = first; i <= last; i++)
    out("  //   %s: %s\n", EG->nodes[i]->var->path, describe(EG->nodes[i]));
  out("  //   why: each is a partial sum over '%s'; its update needs the sum\n",
      axes_str(EG, a->axes));
  out("  kdrt_allreduce(c, 0x%x, %s, %s, %lld);\n", a->axes, buf(a), buf(a), (long long)n);
}

static void emit_step(const char *name, StepKind kind) {
  bool train = kind != STEP_EVAL;
  cur_step = kind;
  out("\nstatic void %s(kdrt_ctx *c, const float *x, const float *y, float *loss, float *metric) "
      "{\n",
      name);
  out("  float *P = c->params, *G = c->grads, *A = c->arena;\n");
  out("  float *scratch = A + SCRATCH;\n");
  out("  (void)P; (void)G; (void)x; (void)y; (void)scratch;\n");
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
    int last = bucket_end(i);
    if (last > i) {
      emit_bucket(i, last);
      i = last;
      continue;
    }
    emit_op(n, train);
  }
  out("\n  *loss = %s[0];\n", buf(EG->loss));
  if (EG->metric) out("  *metric = %s[0];\n", buf(EG->metric));
  else out("  *metric = 0;\n");
  out("}\n");
}

void emit_c(Graph *g, FILE *f) {
  emit_begin(g, f);
  const Mesh *m = &g->dist->mesh;
  const Model *md = g->model;
  out("// Generated by kdcc from %s. Do not edit: recompile instead.\n//\n", md->file);
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
  out("// (kdrt_main fills c->coord). Buffers are per device; shapes below are global,\n"
      "// then the layout (one entry per dim: the mesh axis it is split over), then local.\n\n");
  out("#include <cblas.h>\n#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n"
      "#include \"kdrt.h\"\n");

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
    if (v->grad) out("#define %-32s %8lld // %s\n", off_name(v->grad), (long long)v->goffset,
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

  out("\nstatic void init(kdrt_ctx *c) {\n  float *P = c->params;\n  (void)P;\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    out("  kdrt_init_fill(c, P + %s, %s, %s, %.17g, %.17g, %s, %s, 0x%016llxull); // %s\n",
        off_name(v->param), layout_c(v->param), init_name[v->init], v->fan_in, v->fan_out,
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
  const Node *pb = view_base(EG->pred);
  if (pb->region == REGION_ARENA && !EG->pred->place.partial)
    out("  .pred_layout = %s,\n", layout_init(EG->pred));
  out("};\n\n");
  out("int main(int argc, char **argv) {\n"
      "  if (argc > 1 && !strcmp(argv[1], \"gradcheck\")) return kdrt_gradcheck(argc - 1, argv + 1, "
      "&program);\n"
      "  return kdrt_main(argc, argv, &program);\n}\n");
}
