// predict.c: `./train predict`, the model's outputs for every sample of
// the inputs.
//
// The forward pass of eval_step (no dropout) in compiled batches: rank r
// fills its rows of each batch from the input files (data.c's readers,
// checked as training checks them; the last batch padded with zeros), the
// step runs on every rank, rank 0 gathers each output's global block
// (kdrt_gather_global) and keeps the rows that are samples, and at the end
// writes each output [N, outputs...] as float32 .npy, to a temporary name
// first, so that no reader sees half a file. Every output file is checked
// to be writable before anything runs.
#include "kdrt.h"
#include "kdrt_round.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define leave(c, status, ...) kdrt_leave((c), "predict", (status), __VA_ARGS__)

typedef struct {
  const char *out_path, *weights;
  kdrt_files xf; // --x
  int init_random, quiet;
  double scale;
  uint64_t seed;
} predict_options;

static void predict_usage(FILE *f, const char *argv0, const kdrt_program *p) {
  fprintf(f,
          "usage: %s predict --x FILE --out OUT.npy [--weights FILE | --init random]\n"
          "                  [--scale S] [--seed S] [--quiet]\n"
          "The model's outputs for every sample of the inputs (no dropout), in batches of\n"
          "%d, written as float32 .npy [N, outputs...]. --x FILE once per model input, in\n"
          "order, or --x NAME=FILE (inputs:",
          argv0, p->batch);
  for (int k = 0; k < p->ninputs; k++) fprintf(f, " %s", p->inputs[k].name);
  fprintf(f, ").\n");
  if (p->noutputs > 1) {
    fprintf(f, "With several outputs, one file each: --out P.npy writes P.<output>.npy, and\n"
               "--out DIR/ writes DIR/<output>.npy (outputs:");
    for (int o = 0; o < p->noutputs; o++) fprintf(f, " %s", p->outputs[o].name);
    fprintf(f, ").\n");
  }
  const char *archive = kdrt_program_archive(p);
  fprintf(f, "Weights: --weights (.keras or .weights.h5), else %s%s%s.\n",
          !p->weights_file ? "random from --seed"
          : archive        ? "those of the archive it was compiled from: "
                           : "those of the archive it was compiled from, gone: ",
          archive ? archive : p->weights_file ? p->weights_file : "",
          archive && archive != p->weights_file ? " (kdcc's copy)" : "");
}

// The options after "predict": -1 to go on, 0 for --help, 2 for a usage
// error (err says it). No MPI: every rank parses the same line.
static int parse_options(int argc, char **argv, predict_options *o, char *err, size_t errlen) {
  *o = (predict_options){.scale = 1.0, .seed = 1337};
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 0;
    if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
      o->quiet = 1;
      continue;
    }
    if (!v) {
      kdrt_errf(err, errlen, "option '%s' needs a value (see %s predict --help)", a, argv[0]);
      return 2;
    }
    i++;
    if (!strcmp(a, "--x")) {
      if (o->xf.n == KDRT_MAX_FILES) {
        kdrt_errf(err, errlen, "more than %d '--x' options", KDRT_MAX_FILES);
        return 2;
      }
      o->xf.arg[o->xf.n++] = v;
    } else if (!strcmp(a, "--out")) {
      o->out_path = v;
    } else if (!strcmp(a, "--weights")) {
      o->weights = v;
    } else if (!strcmp(a, "--init") && !strcmp(v, "random")) {
      o->init_random = 1;
    } else if (!strcmp(a, "--init")) {
      kdrt_errf(err, errlen, "--init takes 'random', got '%s'", v);
      return 2;
    } else if (!strcmp(a, "--seed")) {
      o->seed = strtoull(v, NULL, 10);
    } else if (!strcmp(a, "--scale")) { // "0.5" or "1/255", as training's --scale
      char *e;
      o->scale = strtod(v, &e);
      if (*e == '/') o->scale /= strtod(e + 1, &e);
      if (*e || !isfinite(o->scale) || o->scale == 0) {
        kdrt_errf(err, errlen, "--scale wants a number or a fraction such as 1/255, got '%s'", v);
        return 2;
      }
    } else {
      kdrt_errf(err, errlen, "unknown option '%s %s' (see %s predict --help)", a, v, argv[0]);
      return 2;
    }
  }
  if (!o->xf.n || !o->out_path) {
    kdrt_errf(err, errlen, "--x and --out are required (see %s predict --help)", argv[0]);
    return 2;
  }
  if (o->weights && o->init_random) {
    kdrt_errf(err, errlen, "--weights and --init random exclude each other");
    return 2;
  }
  return -1;
}

// Where output o goes: with one output, out itself; with several, DIR/<name>.npy
// when out ends in '/' or is a directory, else out without its ".npy",
// then ".<name>.npy".
void kdrt_predict_path(const kdrt_program *p, const char *out, int o, char *buf, size_t len) {
  if (p->noutputs == 1) {
    snprintf(buf, len, "%s", out);
    return;
  }
  size_t n = strlen(out);
  struct stat st;
  const char *name = p->outputs[o].name;
  if ((n && out[n - 1] == '/') || (stat(out, &st) == 0 && S_ISDIR(st.st_mode))) {
    snprintf(buf, len, "%s%s%s.npy", out, n && out[n - 1] == '/' ? "" : "/", name);
    return;
  }
  if (n >= 4 && !strcmp(out + n - 4, ".npy")) n -= 4;
  snprintf(buf, len, "%.*s.%s.npy", (int)n, out, name);
}

// Every output file can be written (rank 0 checks; every rank learns it).
static int outputs_writable(kdrt_ctx *c, const kdrt_program *p, const char *out_path, char *err,
                            size_t errlen) {
  int failed = 0;
  for (int o = 0; o < p->noutputs && c->rank == 0 && !failed; o++) {
    char path[4096], e[4400] = "";
    kdrt_predict_path(p, out_path, o, path, sizeof path);
    if (kdrt_check_output(path, e, sizeof e)) failed = kdrt_errf(err, errlen, "--out %s", e);
  }
  KDRT_MPI(MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (failed && c->rank) kdrt_errf(err, errlen, "--out cannot be written");
  return failed;
}

// The input files, one per model input, checked as training checks them,
// all with the same number of samples (*n). Nonzero: err says why, nothing
// left open.
static int open_inputs(const kdrt_program *p, const char *const *xpaths, kdrt_array *xa,
                       int64_t *n, char *err, size_t errlen) {
  memset(xa, 0, sizeof *xa * KDRT_MAX_FILES);
  int rc = 0;
  for (int k = 0; k < p->ninputs && !rc; k++) {
    if (kdrt_array_open(&xa[k], xpaths[k], err, errlen) ||
        kdrt_fit_inputs(&xa[k], p, k, err, errlen))
      rc = 1;
    else if (k == 0)
      *n = xa[k].n;
    else if (xa[k].n != *n)
      rc = kdrt_errf(err, errlen, "%s has %lld samples but %s has %lld", xpaths[0],
                     (long long)*n, xpaths[k], (long long)xa[k].n);
    if (rc)
      for (int i = 0; i <= k; i++) kdrt_array_close(&xa[i]);
  }
  return rc;
}

// A .npy header for float32 [n, dims...], padded so the data is 64-byte aligned.
static size_t npy_header(char *buf, size_t len, int64_t n, int rank, const int64_t *dims) {
  char shape[256], dict[512];
  int64_t all[KDRT_MAX_RANK + 1];
  all[0] = n;
  for (int d = 0; d < rank; d++) all[d + 1] = dims[d];
  kdrt_fmt_shape(shape, sizeof shape, rank + 1, all);
  int k = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }",
                   shape);
  size_t total = (10 + (size_t)k + 1 + 63) / 64 * 64, hl = total - 10;
  if (total > len) return 0;
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = (char)(hl & 0xff), buf[9] = (char)(hl >> 8);
  memset(buf + 10, ' ', hl);
  memcpy(buf + 10, dict, (size_t)k);
  buf[total - 1] = '\n';
  return total;
}

// Output o's n rows of `row` floats to its file, atomically (rank 0).
static int write_output(const kdrt_program *p, const char *out_path, int o, const float *result,
                        int64_t n, int64_t row) {
  const kdrt_layout *l = &p->outputs[o].layout;
  char hdr[1024], tmp[4400], path[4096];
  kdrt_predict_path(p, out_path, o, path, sizeof path);
  size_t hl = npy_header(hdr, sizeof hdr, n, l->rank - 1, l->gshape + 1);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  int bad = !f || !hl || fwrite(hdr, 1, hl, f) != hl ||
            fwrite(result, sizeof(float), (size_t)(n * row), f) != (size_t)(n * row);
  if (f && fclose(f)) bad = 1;
  if (bad || kdrt_commit_file(tmp, path)) {
    fprintf(stderr, "predict: cannot write %s: %s\n", path, strerror(errno));
    unlink(tmp);
    return 1;
  }
  return 0;
}

// What the batches need: this rank's rows of each input and label (the
// labels zeros: eval_step takes them, predict needs none), the logs, and
// on rank 0 each output's global block and its whole result.
typedef struct {
  void *x[KDRT_MAX_FILES];
  float *y[KDRT_MAX_FILES], *g[KDRT_MAX_FILES], *result[KDRT_MAX_FILES], *logs;
  int64_t xn[KDRT_MAX_FILES], on[KDRT_MAX_FILES]; // an input's, an output's floats per sample
} predict_buffers;

static void buffers_free(const kdrt_program *p, predict_buffers *b) {
  for (int k = 0; k < p->ninputs; k++) free(b->x[k]);
  for (int j = 0; j < p->nlabels; j++) free(b->y[j]);
  for (int o = 0; o < p->noutputs; o++) free(b->g[o]), free(b->result[o]);
  free(b->logs);
}

static void buffers_alloc(kdrt_ctx *c, const kdrt_program *p, int rows, int64_t n,
                          predict_buffers *b) {
  *b = (predict_buffers){0};
  b->logs = calloc((size_t)p->nlogs, sizeof(float));
  int oom = !b->logs;
  for (int k = 0; k < p->ninputs; k++) {
    b->xn[k] = kdrt_io_elems(&p->inputs[k]);
    oom |= !(b->x[k] = calloc((size_t)(rows * b->xn[k] + 1), 4));
  }
  for (int j = 0; j < p->nlabels; j++)
    oom |= !(b->y[j] = calloc((size_t)(rows * kdrt_io_elems(&p->labels[j]) + 1), sizeof(float)));
  for (int o = 0; o < p->noutputs; o++) {
    const kdrt_layout *l = &p->outputs[o].layout;
    int64_t all = 1;
    b->on[o] = 1;
    for (int d = 0; d < l->rank; d++) all *= l->gshape[d];
    for (int d = 1; d < l->rank; d++) b->on[o] *= l->gshape[d];
    if (c->rank == 0) {
      oom |= !(b->g[o] = malloc(sizeof(float) * (size_t)all));
      oom |= !(b->result[o] = malloc(sizeof(float) * (size_t)(n * b->on[o] > 0 ? n * b->on[o] : 1)));
    }
  }
  if (oom) kdrt_fatal(c, "out of memory");
}

// Every batch of the n samples through eval_step, this rank filling its lb
// rows of each; rank 0 keeps the outputs.
static int64_t run_batches(kdrt_ctx *c, const kdrt_program *p, kdrt_array *xa, int64_t n,
                           int lb, double scale, predict_buffers *b) {
  int ba = p->batch_axis;
  int row0 = ba >= 0 ? c->coord[ba] * lb : 0;
  int64_t steps = (n + p->batch - 1) / p->batch;
  for (int64_t s = 0; s < steps; s++) {
    for (int i = 0; i < lb; i++) {
      int64_t pos = s * p->batch + row0 + i;
      for (int k = 0; k < p->ninputs; k++) {
        void *xr = (char *)b->x[k] + (size_t)i * (size_t)b->xn[k] * 4;
        if (pos >= n) memset(xr, 0, 4 * (size_t)b->xn[k]); // padding (id 0 for int inputs)
        else if (p->inputs[k].dtype == KDRT_I32) kdrt_array_row_i32(&xa[k], pos, xr);
        else kdrt_array_row(&xa[k], pos, scale, xr);
      }
    }
    p->eval_step(c, (const void *const *)b->x, (const void *const *)b->y, b->logs);
    int64_t keep = n - s * p->batch < p->batch ? n - s * p->batch : p->batch;
    for (int o = 0; o < p->noutputs; o++) {
      kdrt_gather_global(c, &p->outputs[o].layout, c->arena + p->outputs[o].offset, b->g[o]);
      if (c->rank == 0) {
        float *r = b->result[o] + (size_t)(s * p->batch * b->on[o]);
        memcpy(r, b->g[o], sizeof(float) * (size_t)(keep * b->on[o]));
        int kind = p->output_round ? p->output_round[o] : 0;
        if (kind) // the 16-bit output Keras's predict returns
          for (int64_t e = 0; e < keep * b->on[o]; e++) r[e] = kdrt_round_to(kind, r[e]);
      }
    }
  }
  return steps;
}

int kdrt_predict(int argc, char **argv, const kdrt_program *p) {
  // The options first: --help and usage errors need no MPI.
  predict_options o;
  char err[4096] = "";
  int usage_rc = parse_options(argc, argv, &o, err, sizeof err);
  static kdrt_ctx ctx;
  kdrt_ctx *c = &ctx;
  c->seed = o.seed;
  if (usage_rc >= 0) { // every rank parsed the same line: leave together
    KDRT_MPI(MPI_Init(&argc, &argv));
    KDRT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
    if (usage_rc == 0 && c->rank == 0) predict_usage(stdout, argv[0], p);
    return leave(c, usage_rc, usage_rc ? "%s" : NULL, err);
  }
  int failed = kdrt_infer_open(c, "predict", p, &argc, &argv, o.weights, o.init_random, err,
                               sizeof err);
  if (!failed) failed = outputs_writable(c, p, o.out_path, err, sizeof err);
  if (failed) return leave(c, 1, "%s", err);
  const char *xpaths[KDRT_MAX_FILES];
  if (kdrt_resolve_files(&o.xf, "--x", p->inputs, p->ninputs, "input", xpaths, err, sizeof err))
    return leave(c, 2, "%s (see %s predict --help)", err, argv[0]);
  if (!o.weights && (o.init_random || !p->weights_file) && !o.quiet && c->rank == 0)
    fprintf(stderr, "predict: no weights file; predicting with random weights from --seed "
            "%llu\n", (unsigned long long)c->seed);

  kdrt_array xa[KDRT_MAX_FILES];
  int64_t n = 0;
  if (open_inputs(p, xpaths, xa, &n, err, sizeof err)) return leave(c, 1, "%s", err);
  int ba = p->batch_axis, lb = ba >= 0 ? p->batch / p->mesh_shape[ba] : p->batch;
  predict_buffers b;
  buffers_alloc(c, p, lb, n, &b);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int64_t steps = run_batches(c, p, xa, n, lb, o.scale, &b);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  for (int k = 0; k < p->ninputs; k++) kdrt_array_close(&xa[k]);
  int rc = 0;
  for (int i = 0; i < p->noutputs && c->rank == 0 && !rc; i++)
    rc = write_output(p, o.out_path, i, b.result[i], n, b.on[i]);
  if (c->rank == 0 && !rc && !o.quiet) {
    double el = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    char line[512];
    kdrt_progress_line(line, sizeof line, steps, steps, 1, el, steps ? el / (double)steps : 0,
                       0, NULL, NULL, 0);
    printf("%s\n", line);
  }
  KDRT_MPI(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
  buffers_free(p, &b);
  return leave(c, rc, NULL);
}
