// What both emitters share (emit_c.c, emit_cuda.c): how a node's buffer,
// shapes, layout and literals are written in generated code, the file's
// header and memory plan, the steps' parts (the code the three steps
// share) and the program description, so that the CPU and CUDA programs
// name, describe and compute everything the same way. A part's body is
// every op's Lowering (ops.c) printed as calls:
// kdrt_<fn>(...) for the C runtime, kdrt_cuda_<fn>(d, ...) for the CUDA one;
// nothing here or in the emitters knows what an op computes.
#include "kdcc.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

Graph *EG;
FILE *EF;
Backend EB;

// issue 15: forward values that only training reads (batch norm's batch
// statistics and what makes them: read by a TRAIN_SELECT's training operand,
// by gradients or by a moving statistic's update), by node id. Evaluation
// and predict skip them (every rank alike, their collectives too).
static bool *train_only;

static void mark_train_only(const Graph *g) {
  int ids = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    if (n->id >= ids) ids = n->id + 1;
    for (int k = 0; k < n->nin; k++)
      if (n->in[k]->id >= ids) ids = n->in[k]->id + 1;
  }
  xfree(train_only);
  train_only = xcalloc(ids + 1, sizeof *train_only);
  int *users = xcalloc(ids + 1, sizeof *users);
  bool *needed = xcalloc(ids + 1, sizeof *needed); // read outside training
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i]->nin; k++) users[g->nodes[i]->in[k]->id]++;
  for (int i = g->nnodes - 1; i >= 0; i--) { // users before what they read
    const Node *n = g->nodes[i];
    if (n->phase > PH_LOSS) continue;
    bool need = needed[n->id] || !users[n->id]; // a result nothing reads: an output
    train_only[n->id] = !need;
    if (need)
      for (int k = 0; k < n->nin; k++)
        if (!(n->op == OP_TRAIN_SELECT && k == 0)) needed[n->in[k]->id] = true;
  }
  xfree(users), xfree(needed);
}

void emit_begin(Graph *g, FILE *f, Backend b) {
  EG = g;
  EF = f;
  EB = b;
  mark_train_only(g);
}

void out(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(EF, fmt, ap);
  va_end(ap);
}

char *ident(const char *s) {
  char *r = xstrdup(s ? s : "");
  for (char *p = r; *p; p++)
    if (!isalnum((unsigned char)*p)) *p = '_';
  return r;
}

char *off_name(const Node *n) {
  n = view_base(n); // a view's buffer is its base's (a Conv1D kernel's gradient)
  switch (n->region) {
  case REGION_PARAM: return format("P_%s", ident(n->var->path));
  case REGION_GRAD: return format("G_%s", ident(n->var->path));
  case REGION_ARENA: return format("A%d_%s", n->id, ident(n->layer ? n->layer : n->name));
  default: return NULL;
  }
}

const Node *view_base(const Node *n) {
  // an update's value is its variable, updated in place (a constraint reads it)
  while (n->op == OP_RESHAPE || n->op == OP_UPDATE) n = n->in[0];
  return n;
}

char *buf(const Node *n) {
  n = view_base(n);
  switch (n->region) {
  case REGION_PARAM: return format("(P + %s)", off_name(n));
  case REGION_GRAD: return format("(G + %s)", off_name(n));
  case REGION_ARENA:
    return n->dtype == DT_I32 ? format("((int32_t *)(A + %s))", off_name(n))
                              : format("(A + %s)", off_name(n));
  case REGION_INPUT:
    return format("((const %s *)%s[%d])", n->dtype == DT_I32 ? "int32_t" : "float",
                  n->op == OP_INPUT ? "x" : "y", n->index);
  }
  unreachable();
}

char *flt(double v) {
  char *s = format("%.9g", v);
  return strpbrk(s, ".en") ? format("%sf", s) : format("%s.0f", s);
}

char *axes_c(unsigned axes) {
  char *s = NULL;
  for (int a = 0; a < EG->dist->mesh.ndim; a++)
    if ((axes >> a) & 1)
      s = format("%s%sAX_%s", s ? s : "", s ? " | " : "", ident(EG->dist->mesh.names[a]));
  return s ? s : xstrdup("0");
}

Shape lshape(const Node *n) { return local_shape(EG, n); }

Sym sym_dim(const Node *n, int d, bool local) {
  if (!((n->bdims >> d) & 1)) {
    if (!local) return (Sym){n->shape.d[d], NULL};
    Shape s = lshape(n);
    return (Sym){s.d[d], NULL};
  }
  int a = n->place.axis[d];
  if (!local || a < 0) return (Sym){1, "B"};
  if (a == EG->dist->batch_axis) return (Sym){1, "b"};
  return (Sym){1, format("(B / %d)", axis_size(EG, a))};
}

Sym sym_mul(Sym a, Sym b) {
  if (a.v && b.v) unreachable(); // one batch dim a tensor
  return (Sym){a.k * b.k, a.v ? a.v : b.v};
}

Sym sym_prod(const Node *n, int from, int to, bool local) {
  Sym p = {1, NULL};
  for (int d = from; d < to; d++) p = sym_mul(p, sym_dim(n, d, local));
  return p;
}

char *sym_c(Sym s) {
  if (!s.v) return format("%lld", (long long)s.k);
  return s.k == 1 ? xstrdup(s.v) : format("%s * %lld", s.v, (long long)s.k);
}

char *sym_dims(const Node *n) {
  char *b = xstrdup("{");
  for (int d = 0; d < n->shape.rank; d++)
    b = format("%s%s%s", b, d ? ", " : "", sym_c(sym_dim(n, d, true)));
  return format("%s}", b);
}

char *sym_layout(const Node *n) {
  char *g = xstrdup("{"), *ax = xstrdup("{");
  for (int d = 0; d < n->shape.rank; d++) {
    g = format("%s%s%s", g, d ? ", " : "", sym_c(sym_dim(n, d, false)));
    ax = format("%s%s%d", ax, d ? ", " : "", n->place.axis[d]);
  }
  return format("{%d, %s}, %s}}", n->shape.rank, g, ax);
}

int64_t lelems(const Node *n) {
  Shape s = lshape(n);
  return shape_elems(&s);
}

// "{8, 13, 13, 2}"
static char *dims_init(const Shape *s) {
  char *b = xstrdup("{");
  for (int i = 0; i < s->rank; i++) b = format("%s%s%lld", b, i ? ", " : "", (long long)s->d[i]);
  return format("%s}", b);
}

char *layout_init(const Node *n) {
  char *ax = xstrdup("{");
  for (int i = 0; i < n->shape.rank; i++) ax = format("%s%s%d", ax, i ? ", " : "", n->place.axis[i]);
  return format("{%d, %s, %s}}", n->shape.rank, dims_init(&n->shape), ax);
}

char *describe(const Node *n) {
  Shape ls = lshape(n);
  return format("%s %s local %s", shape_str(&n->shape),
                place_str(&EG->dist->mesh, n->shape.rank, &n->place), shape_str(&ls));
}

static void emit_arena(void);

const char *const init_name[] = {
#define KDRT_X(name, kname) "KDRT_INIT_" #name,
  KDRT_INIT_LIST(KDRT_X)
#undef KDRT_X
};

// ---- the file's beginning

void emit_preamble(const char *what) {
  const Graph *g = EG;
  const Mesh *m = &g->dist->mesh;
  const Model *md = g->model;
  out("// Generated by kdcc from %s%s. Do not edit: recompile instead.\n//\n", md->file, what);
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
  out("// (kdrt_main fills c->coord)%s. Buffers are per device; shapes below are global,\n"
      "// then the layout (one entry per dim: the mesh axis it is split over), then local.\n",
      EB == BACKEND_CUDA ? "; each rank drives one GPU, and P, G and A are device pointers"
                         : "");
  out("// Each call is one kernel of runtime/kdrt_ops.h's list.\n\n");
  if (EB == BACKEND_C)
    out("#include <stdint.h>\n#include <string.h>\n\n#include \"kdrt.h\"\n");
  else
    out("#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n\n"
        "#include \"kdrt_cuda.h\"\n");

  out("\n// ---- mesh axes, as the bit masks collectives take\nenum {");
  for (int a = 0; a < m->ndim; a++)
    out("%s AX_%s = 1 << %d", a ? "," : "", ident(m->names[a]), a);
  if (!m->ndim) out(" AX_none = 0");
  out(" };\n");
  out("\n// ---- the steps: the functions of their parts below are told which one runs them\n");
  out("enum { TRAIN_STEP, EVAL_STEP, GRAD_STEP };\n");

  out("\n// ---- parameter blob: each variable's shard, then its optimizer slots\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    out("#define %-32s %8lld // %s, %d slot%s%s\n", off_name(v->param), (long long)v->offset,
        describe(v->param), v->nslots, v->nslots == 1 ? "" : "s",
        v->frozen ? ", frozen (trainable false)" : "");
  }
  out("#define PARAM_FLOATS %lld\n", (long long)g->param_floats);
  out("\n// ---- gradient blob: each variable's gradient, reduced to its layout\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    if (v->grad) out("#define %-32s %8lld // %s\n", off_name(v->grad), (long long)v->goffset,
                     describe(v->grad));
  }
  out("#define GRAD_FLOATS %lld\n", (long long)g->grad_floats);
  emit_arena();
}

// The arena: each buffer's offset for the compiled batch (BATCH rows) in
// AO, which a run with a larger batch replaces by the plan replayed for
// its rows (arena_plan, kdrt_arena_plan: memplan.c's first fit).
static void emit_arena(void) {
  const Graph *g = EG;
  int *slot = xcalloc((size_t)g->nnodes, sizeof *slot), nslots = 0;
  out("\n// ---- activation arena: buffers reused by liveness, at the offsets after '@' for\n"
      "// BATCH rows; a run with more rows replays arena_plan into AO when it starts\n");
  out("static int64_t AO[] = {");
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    if (n->region != REGION_ARENA || n->op == OP_RESHAPE) continue;
    slot[n->id] = nslots++;
    out("%s%lld", nslots % 16 == 1 ? "\n  " : " ", (long long)n->offset);
    out(",");
  }
  out("\n  %lld};\n", (long long)(g->arena_floats - g->scratch_floats));
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    if (n->region != REGION_ARENA || n->op == OP_RESHAPE) continue;
    out("#define %-32s AO[%d] // @%lld %s\n", off_name(n), slot[n->id], (long long)n->offset,
        describe(n));
  }
  out("#define SCRATCH AO[%d] // @%lld conv im2col scratch, %lld floats\n", nslots,
      (long long)(g->arena_floats - g->scratch_floats), (long long)g->scratch_floats);
  out("#define ARENA_FLOATS %lld // for BATCH rows\n", (long long)g->arena_floats);
  out("#define BATCH %d // the global batch the constants above are for\n", g->batch);
  out("static const kdrt_arena_op arena_plan[] = { // {step, buffer (AO index), k, parts}: k *\n"
      "  // ceil(B / parts) floats (parts 0: k) for a batch of B (memplan.c's order)\n");
  static const char *const what[] = {"KDRT_ARENA_ALLOC", "KDRT_ARENA_FREE",
                                     "KDRT_ARENA_SCRATCH"};
  for (int i = 0; i < g->nplan; i++) {
    const PlanStep *p = &g->plan[i];
    out("  {%s, %d, %lld, %d},\n", what[p->op], p->op == PLAN_SCRATCH ? nslots : slot[p->n->id],
        (long long)p->k, p->parts);
  }
  out("  {KDRT_ARENA_SCRATCH, %d, 0, 0}, // none: the end\n};\n", nslots);
  xfree(slot);
}

// ---- step bodies

// The step's rows, at the top of every function of a step.
static void emit_rows(void) {
  const Graph *g = EG;
  int ba = g->dist->batch_axis, parts = ba >= 0 ? g->dist->mesh.shape[ba] : 1;
  out("  // the step's rows: B in all (at most the arena's: BATCH, or the run's), b on this device\n");
  if (parts > 1) {
    out("  // (rows that do not divide over '%s' are split unevenly: c->ragged)\n",
        g->dist->mesh.names[ba]);
    out("  const int64_t B = c->rows ? c->rows : BATCH, b = c->ragged ? c->local_rows : B / %d;\n",
        parts);
  } else {
    out("  const int64_t B = c->rows ? c->rows : BATCH, b = B;\n");
  }
  out("  (void)B; (void)b;\n");
}

// A step's start: its rows, and whether it can run them. A batch dim split
// over an axis other than the batch axis holds B / size rows, so B must
// divide; kdrt_main probes the steps (c->probe) before it picks B.
void emit_step_rows(void) {
  const Graph *g = EG;
  emit_rows();
  unsigned split = 0;
  for (int i = 0; i < g->nnodes; i++)
    for (int d = 0; d < g->nodes[i]->shape.rank; d++) {
      int a = g->nodes[i]->place.axis[d];
      if (((g->nodes[i]->bdims >> d) & 1) && a >= 0 && a != g->dist->batch_axis) split |= 1u << a;
    }
  for (int a = 0; a < g->dist->mesh.ndim; a++)
    if ((split >> a) & 1)
      out("  if (B %% %d) { kdrt_rows_refused(c, B, %d, \"%s\"); return; }\n",
          axis_size(EG, a), axis_size(EG, a), g->dist->mesh.names[a]);
  out("  if (c->probe) return; // kdrt_main asks whether B rows can run\n");
}

// ---- the step's parts
//
// Training, evaluation and the gradient check share their code. The ops,
// in order, are cut into parts where the phase changes between forward
// (with the loss), backward and update, and again every PART_OPS ops so
// that no function grows with the model; a part is one function that takes
// the step it runs for, and each step calls the parts it needs in order.
// An op that every step running its part lowers the same way is written
// once; one that differs (dropout is a copy outside training, plain SGD
// goes into its GEMM only when training) or that some of them skip (the
// update, in the gradient check) is written under `if (step == ...)`.

#define PART_OPS 200

static const char *const phase_title[] = {"forward", "loss", "backward", "update",
                                             "constraints"};
static const char *const step_const[] = {"TRAIN_STEP", "EVAL_STEP", "GRAD_STEP"};

static bool emits_code(const Node *n) {
  return n->op != OP_INPUT && n->op != OP_LABEL && n->op != OP_PARAM;
}

// The steps (bit 1 << StepKind) that run node n.
static unsigned steps_of(const Node *n) {
  unsigned s = 1u << STEP_TRAIN;
  if (n->phase <= PH_LOSS && !train_only[n->id]) s |= 1u << STEP_EVAL;
  if (n->op != OP_UPDATE && n->op != OP_ASSIGN) s |= 1u << STEP_GRAD; // variables unchanged
  return s;
}

// The phases' groups: a part never mixes two.
static int phase_group(Phase ph) { return ph <= PH_LOSS ? 0 : ph == PH_BACKWARD ? 1 : 2; }

StepPart *step_parts(int *count) {
  StepPart *p = NULL;
  int np = 0, cap = 0;
  for (int i = 0; i < EG->nnodes; i++) {
    const Node *n = EG->nodes[i];
    if (!emits_code(n)) continue;
    StepPart *last = np ? &p[np - 1] : NULL;
    if (!last || phase_group(EG->nodes[last->first]->phase) != phase_group(n->phase) ||
        last->nops == PART_OPS) {
      p = xgrow(p, np, &cap, sizeof *p);
      p[np++] = (StepPart){.first = i, .end = i + 1};
      last = &p[np - 1];
    }
    last->end = i + 1;
    last->nops++;
    last->steps |= steps_of(n);
  }
  // Names: the first op's phase, numbered when there is more than one.
  for (int k = 0; k < np; k++) {
    const char *t = phase_title[EG->nodes[p[k].first]->phase];
    int same = 0, nth = 0;
    for (int j = 0; j < np; j++)
      if (!strcmp(phase_title[EG->nodes[p[j].first]->phase], t)) same++, nth += j <= k;
    p[k].name = same > 1 ? format("%s_%d", t, nth) : xstrdup(t);
  }
  *count = np;
  return p;
}

// The comment above each op: id, op, layer, name, shapes and layout, and
// for a collective why it is there.
static void emit_op_comment(const Node *n) {
  out("\n  // %%%d %s", n->id, op_info(n->op).name);
  if (n->op == OP_ACT || n->op == OP_ACT_GRAD || n->op == OP_BIAS_ACT)
    out(" %s", act_name(n->act.kind));
  if (n->op == OP_PACT || n->op == OP_PACT_GRAD)
    out(" %s(%g%s)", (const char *[]){"leaky_relu", "elu", "relu"}[n->pact.kind], n->pact.alpha,
        n->pact.kind != KDRT_PACT_RELU ? ""
        : format(", max %g, threshold %g", n->pact.max, n->pact.threshold));
  if (n->layer) out(" (%s)", n->layer);
  if (n->name) out(": %s", n->name);
  out("\n  //   %s\n", describe(n));
  if (is_collective(n->op) && n->coll.bucket) {
    out("  //   one bucket of gradients, this one and those that follow:\n");
    for (int i = n->id; i < EG->nnodes; i++) {
      const Node *b = EG->nodes[i];
      if (i > n->id && !(b->op == OP_ALLREDUCE && b->fused)) break;
      out("  //     %s: %s\n", b->var ? b->var->path : b->name, describe(b));
    }
  }
  if (is_collective(n->op) && !n->fused) out("  //   why: %s\n", coll_why(EG, n));
}

// text with every line indented two more spaces.
static void out_indented(const char *text) {
  for (const char *p = text; *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p + 1) : strlen(p);
    out("  %.*s", (int)len, p);
    p += len;
  }
}

// One call for the backend: kdrt_<fn>([c, ]args) or kdrt_cuda_<fn>(d, args),
// in a block when it has a descriptor (unless `bare`: the caller's block).
static void emit_call(const Call *k, bool bare) {
  const char *ind = k->decl && !bare ? "    " : "  ";
  if (k->decl && bare) out("  %s\n", k->decl);
  if (k->decl && !bare) out("  {\n    %s\n", k->decl);
  if (EB == BACKEND_C)
    out("%skdrt_%s(%s%s);\n", ind, k->fn, k->ctx ? "c, " : "", k->args);
  else
    out("%skdrt_cuda_%s(d, %s);\n", ind, k->fn, k->args);
  if (k->decl && !bare) out("  }\n");
}

// Node n's code for step kind: its note and calls, as text; `branch`: for
// the body of an if, where a single call needs no block of its own.
static char *lowered(const Node *n, StepKind kind, bool branch) {
  FILE *whole = EF;
  char *text = NULL;
  size_t len = 0;
  EF = open_memstream(&text, &len);
  if (!EF) error("out of memory");
  Lowering lw = {.step = kind};
  op_info(n->op).emit(n, &lw);
  if (lw.note) out("  //   %s\n", lw.note);
  if (lw.loop) { // the calls are the loop's body, a block of its own
    FILE *f = EF;
    char *body = NULL;
    size_t blen = 0;
    EF = open_memstream(&body, &blen);
    if (!EF) error("out of memory");
    for (int k = 0; k < lw.ncalls; k++) emit_call(&lw.calls[k], lw.ncalls == 1);
    if (fclose(EF) != 0) error("out of memory");
    EF = f;
    out("  %s {\n", lw.loop);
    out_indented(body);
    out("  }\n");
  } else {
    for (int k = 0; k < lw.ncalls; k++) emit_call(&lw.calls[k], branch && lw.ncalls == 1);
  }
  if (fclose(EF) != 0) error("out of memory");
  EF = whole;
  return text;
}

// The steps' parts, then train_step, eval_step and grad_step, each printed
// by the backend's own part and step functions.
void emit_steps(PartEmitter *part, StepEmitter *step) {
  int nparts;
  StepPart *parts = step_parts(&nparts);
  out("\n// ---- the steps' parts, in order: forward (and loss), backward, update\n");
  for (int i = 0; i < nparts; i++) part(&parts[i]);
  out("\n// ---- the steps\n");
  step("train_step", STEP_TRAIN, parts, nparts);
  step("eval_step", STEP_EVAL, parts, nparts);
  out("\n// The training step without the update, for `./train gradcheck`.");
  step("grad_step", STEP_GRAD, parts, nparts);
}

void emit_part_body(const StepPart *part) {
  emit_rows();
  Phase ph = -1;
  for (int i = part->first; i < part->end; i++) {
    const Node *n = EG->nodes[i];
    if (!emits_code(n)) continue;
    if (n->phase != ph) {
      ph = n->phase;
      out("\n  // ======== %s\n", phase_title[ph]);
    }
    emit_op_comment(n);
    // The code of each step that runs n, and which steps share which text.
    unsigned run = steps_of(n) & part->steps, done = 0;
    char *text[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++)
      if ((run >> k) & 1) text[k] = lowered(n, (StepKind)k, false);
    int first = -1;
    for (int k = 0; k < 3 && first < 0; k++)
      if (text[k]) first = k;
    bool uniform = run == part->steps;
    for (int k = 0; k < 3; k++)
      if (text[k] && strcmp(text[k], text[first])) uniform = false;
    if (uniform) {
      out("%s", text[first]);
      continue;
    }
    bool chained = false;
    for (int k = 0; k < 3; k++) {
      if (!text[k] || ((done >> k) & 1)) continue;
      out("  %sif (", chained ? "} else " : "");
      for (int j = k, sep = 0; j < 3; j++)
        if (text[j] && !strcmp(text[j], text[k])) {
          out("%sstep == %s", sep++ ? " || " : "", step_const[j]);
          done |= 1u << j;
        }
      out(") {\n");
      out_indented(lowered(n, (StepKind)k, true));
      chained = true;
    }
    out("  }\n");
  }
}

// ---- the program description

// What the labels are: one-hot rows (a label file of class ids is expanded)
// for the categorical losses and kl_divergence, class ids for the sparse
// one, 0/1 for binary crossentropy and the hinge losses (synthetic data).
static int label_kind(LossKind k) {
  switch (k) {
  case LOSS_CCE: case LOSS_KLD: case LOSS_CAT_HINGE: return KDRT_LABEL_ONEHOT;
  case LOSS_SCCE: return KDRT_LABEL_CLASSID;
  case LOSS_BCE: case LOSS_HINGE: case LOSS_SQUARED_HINGE: return KDRT_LABEL_BINARY;
  default: return KDRT_LABEL_DENSE;
  }
}

static char *io_init(const char *name, const Node *n, int label, int64_t classes) {
  Shape s = n->shape;
  char *dims = xstrdup("{");
  for (int d = 1; d < s.rank; d++) dims = format("%s%s%lld", dims, d > 1 ? ", " : "", (long long)s.d[d]);
  if (s.rank <= 1) dims = format("%s0", dims);
  return format("{\"%s\", %s, %d, %s}, %d, %lld}", name,
                n->dtype == DT_I32 ? "KDRT_I32" : "KDRT_F32", s.rank - 1, dims, label,
                (long long)classes);
}

void emit_program_tables(void) {
  const Graph *g = EG;
  const Mesh *m = &g->dist->mesh;
  out("\nstatic const kdrt_var vars[] = {\n");
  for (int i = 0; i < g->nvars; i++) {
    const Var *v = g->vars[i];
    out("  {\"%s\", \"%s\", \"%s\", %d, %s,\n   %s, %lld, %d, %s, %lld, %s, %s},\n", v->path,
        v->layer, v->layer_class, v->index, layout_init(v->param), off_name(v->param),
        (long long)((lelems(v->param) + 15) / 16 * 16), v->nslots,
        v->grad ? off_name(v->grad) : "SIZE_MAX", (long long)lelems(v->param),
        v->sub ? format("\"%s\"", v->sub) : "NULL",
        v->scope ? format("\"%s\"", v->scope) : "NULL");
  }
  if (!g->nvars) out("  {NULL, NULL, NULL, 0, {0, {0}, {0}}, 0, 0, 0, 0, 0, NULL, NULL},\n");
  out("};\n");

  out("\n// inputs and labels: name, dtype, per-sample rank and shape, label kind, classes\n");
  out("static const kdrt_io inputs[] = {\n");
  for (int i = 0; i < g->ninputs; i++)
    out("  %s,\n", io_init(g->model->inputs[i]->name, g->inputs[i], 0, g->inputs[i]->id_range));
  out("};\nstatic const kdrt_io labels[] = {\n");
  for (int j = 0; j < g->nlabels; j++) {
    const Node *y = g->labels[j];
    int o = 0; // the output this label belongs to
    for (int i = 0, k = 0; i < g->noutputs; i++)
      if (g->model->losses[i].has && k++ == j) o = i;
    const Node *p = g->outputs[o];
    out("  %s,\n", io_init(g->model->outputs[o].layer->name, y,
                           label_kind(g->model->losses[o].kind), p->shape.d[p->shape.rank - 1]));
  }
  out("};\nstatic const char *const log_names[] = {");
  for (int k = 0; k < g->nlogs; k++) out("%s\"%s\"", k ? ", " : "", g->logs[k].name);
  out("};\n");
  out("\n// the model's outputs for `./train predict`: arena offset, layout\n");
  out("static const kdrt_output outputs[] = {\n");
  for (int i = 0; i < g->noutputs; i++) {
    const Node *p = g->outputs[i], *pb = view_base(p);
    bool whole = pb->region == REGION_ARENA && !p->place.partial && !p->place.pmax;
    char *off = whole ? format("%lld /* %s for BATCH rows */", (long long)pb->offset,
                               off_name(pb))
                      : xstrdup("SIZE_MAX /* not one arena buffer */");
    out("  {\"%s\", %s, %s},\n", g->model->outputs[i].layer->name, off,
        whole ? layout_init(p) : "{0, {0}, {0}}");
    xfree(off);
  }
  out("};\n");
  out("\nstatic const int mesh_shape[] = {");
  for (int a = 0; a < m->ndim; a++) out("%s%d", a ? ", " : "", m->shape[a]);
  if (!m->ndim) out("1");
  out("};\nstatic const char *const mesh_axes[] = {");
  for (int a = 0; a < m->ndim; a++) out("%s\"%s\"", a ? ", " : "", m->names[a]);
  if (!m->ndim) out("\"batch\"");
  out("};\n");
  const Schedule *sc = g->model->opt.schedule;
  if (sc) {
    out("\n// the learning rate: a keras.optimizers.schedules object, evaluated each step\n"
        "// (kind, initial, decay_steps, decay_rate, alpha, end, power, staircase, cycle,\n"
        "// warmup, warmup_target, warmup_steps, boundaries, values: kdrt_defs.h)\n");
    out("static const kdrt_schedule schedule = {%d, %.17g, %.17g, %.17g, %.17g, %.17g, %.17g, %d, "
        "%d, %d, %.17g, %.17g, %d, {", sc->kind, sc->initial, sc->decay_steps, sc->decay_rate,
        sc->alpha, sc->end, sc->power, sc->staircase, sc->cycle, sc->warmup, sc->warmup_target,
        sc->warmup_steps, sc->nbounds);
    for (int k = 0; k < sc->nbounds; k++) out("%s%.17g", k ? ", " : "", sc->bounds[k]);
    out("%s}, {", sc->nbounds ? "" : "0");
    for (int k = 0; k <= sc->nbounds; k++) out("%s%.17g", k ? ", " : "", sc->values[k]);
    out("}};\n");
  }
}

// The line of init() that gives variable v's optimizer slots a first value
// other than 0 (Adagrad's accumulator), its layout l; or "".
char *slot_init(const Var *v, const char *l) {
  const Optimizer *o = &EG->model->opt;
  if (o->kind != OPT_ADAGRAD || !v->nslots || o->initial_accumulator_value == 0) return "";
  return format("  kdrt_init_fill(c, P + %s + %lld, %s, KDRT_INIT_CONSTANT, 0, 0, %s, 0, 0); "
                "// %s's accumulator\n", off_name(v->param),
                (long long)((lelems(v->param) + 15) / 16 * 16), l,
                flt(o->initial_accumulator_value), v->path);
}

// Every field of the kdrt_program, one per line as `<lhs><field> =
// <value><end>`: ("  .", ",\n") for a C initializer, ("  p.", ";\n") for
// assignments.
void emit_program_fields(const char *lhs, const char *end) {
  const Graph *g = EG;
  const Mesh *m = &g->dist->mesh;
  const Model *md = g->model;
#define FIELD(name, ...) (out("%s" name " = ", lhs), out(__VA_ARGS__), out("%s", end))
  FIELD("model_name", "\"%s\"", md->name);
  FIELD("mesh_ndim", "%d", m->ndim ? m->ndim : 1);
  FIELD("mesh_shape", "mesh_shape");
  FIELD("mesh_axes", "mesh_axes");
  FIELD("batch_axis", "%d", g->dist->batch_axis);
  FIELD("batch", "%d", g->batch);
  FIELD("ninputs", "%d", g->ninputs);
  FIELD("inputs", "inputs");
  FIELD("nlabels", "%d", g->nlabels);
  FIELD("labels", "labels");
  FIELD("nlogs", "%d", g->nlogs);
  FIELD("log_names", "log_names");
  FIELD("noutputs", "%d", g->noutputs);
  FIELD("outputs", "outputs");
  FIELD("learning_rate", "%s", flt(md->opt.lr));
  FIELD("schedule", "%s", md->opt.schedule ? "&schedule" : "NULL");
  FIELD("optimizer", "\"%s\"", md->opt.cls);
  FIELD("param_floats", "PARAM_FLOATS");
  FIELD("grad_floats", "GRAD_FLOATS");
  FIELD("arena_floats", "ARENA_FLOATS");
  // A larger batch replans the arena (the CUDA runtime sizes its device
  // arena and input buffers by the run's batch too).
  FIELD("arena_plan", "arena_plan");
  FIELD("narena_plan", "(int)(sizeof arena_plan / sizeof *arena_plan)");
  FIELD("arena_off", "AO");
  FIELD("init", "init");
  FIELD("train_step", "train_step");
  FIELD("eval_step", "eval_step");
  FIELD("grad_step", "grad_step");
  FIELD("nvars", "%d", g->nvars);
  FIELD("vars", "vars");
  // A .keras archive's own weights are the program's initial ones (runtime/weights.c).
  size_t flen = strlen(md->file);
  char *abs = flen > 6 && !strcmp(md->file + flen - 6, ".keras") ? realpath(md->file, NULL) : NULL;
  if (abs) {
    out("%sweights_file = \"", lhs);
    for (const char *q = abs; *q; q++)
      out(*q == '"' || *q == '\\' ? "\\%c" : (unsigned char)*q < 0x20 ? "\\%03o" : "%c", *q);
    out("\"%s", end);
  }
#undef FIELD
}
