// generate.c: `./train generate`, text from a trained language model.
//
// For a model whose one input is a sequence of token ids [T] (or a
// keras-hub CausalLM's token_ids and padding_mask, the mask 1 over the
// tokens so far) and whose one output is a distribution over the
// vocabulary per position [T, V] (a GPT: logits, or probabilities after a
// softmax), each new token is drawn
// from the output at the last position of the sequence so far, then
// appended; past T tokens the window slides (the last T are fed). Every
// step is the program's eval_step (no dropout) over one global batch,
// whose first rows hold the samples (--samples; the rest are zeros), so it
// runs on any mesh the program was compiled for. Rank 0 draws and
// broadcasts the tokens; the draws come from Philox with (--seed, sample,
// token), so a seed gives the same text on any mesh.
//
// With the program's decode step (kdcc's decode.c, kdrt_decode_program:
// the forward for one position with a key/value cache per attention layer)
// each token costs one position instead: the prefill step (prefill.c,
// kdrt_prefill_program: the whole window, storing every position's keys and
// values) fills the caches from the prompts and gives each first token,
// then every row goes through the decode step one position a step, each
// token drawn at its own last position, so prompts of different lengths
// share a batch (--prompt-ids a;b;c). The cache holds positions 0 .. T - 1;
// once a sample's window is full the whole window takes over, the same
// tokens as --no-cache gives.
//
// Text in and out needs a vocabulary: --vocab FILE takes the distinct
// bytes of FILE in increasing order as ids 0, 1, ... (what
// examples/char_gpt/prepare.py does to the training text); without it the
// prompt and the output are ids.
#include "kdrt.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define leave(c, status, ...) kdrt_leave((c), "generate", (status), __VA_ARGS__)

// Set by the program's decode and prefill files when kdcc gave the model a
// decode step (and a prefill step).
const kdrt_decode *kdrt_decode_program, *kdrt_prefill_program;

typedef struct {
  const char *prompt, *prompt_ids, *vocab_path, *weights;
  int init_random, quiet, samples, samples_set, top_k, no_cache;
  int64_t tokens;
  double temperature;
  uint64_t seed;
} gen_options;

static void gen_usage(FILE *f, const char *argv0) {
  fprintf(f,
          "usage: %s generate (--prompt TEXT --vocab FILE | --prompt-ids 3,1,4) [--tokens N]\n"
          "                   [--temperature T] [--top-k K] [--samples S] [--seed S]\n"
          "                   [--weights FILE | --init random] [--no-cache] [--quiet]\n"
          "Continues the prompt by N tokens (default 100), each drawn from the model's\n"
          "output at the last position: softmax(logits / T) over the K most likely tokens\n"
          "(T 0: always the most likely; defaults T 1, K all). The output is read as\n"
          "logits, or as probabilities when each position's values are in [0, 1] and sum\n"
          "to 1. --vocab FILE: the distinct bytes of FILE in increasing order are the ids\n"
          "0, 1, ..., so --prompt is text and the output is printed as text; without it,\n"
          "--prompt-ids and the output are ids. --samples S continuations at once (at\n"
          "most the compiled batch); --prompt-ids 3,1;4,1,5 gives each sample its own\n"
          "prompt (one per sample, any lengths). Weights: --weights, else the archive the\n"
          "program was compiled from, else random (--init random forces that).\n"
          "A model kdcc gave a decode step (a key/value cache) computes one position per\n"
          "new token until the window is full, then the whole window; --no-cache reruns\n"
          "the whole window for every token.\n",
          argv0);
}

static int parse_int(const char *v, int64_t lo, int64_t hi, int64_t *out) {
  char *e;
  errno = 0;
  long long n = strtoll(v, &e, 10);
  if (errno || e == v || *e || n < lo || n > hi) return -1;
  *out = n;
  return 0;
}

// The options after "generate"; 0 to go on, else the exit status (2: err
// says why; 0: --help).
static int gen_parse(int argc, char **argv, gen_options *o, char *err, size_t len) {
  *o = (gen_options){.tokens = 100, .temperature = 1.0, .samples = 1, .seed = 1337};
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t n;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 0;
    if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
      o->quiet = 1;
      continue;
    }
    if (!strcmp(a, "--no-cache")) {
      o->no_cache = 1;
      continue;
    }
    if (!v) return kdrt_errf(err, len, "option '%s' needs a value (see %s generate --help)", a, argv[0]), 2;
    i++;
    if (!strcmp(a, "--prompt")) o->prompt = v;
    else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = v;
    else if (!strcmp(a, "--vocab")) o->vocab_path = v;
    else if (!strcmp(a, "--weights")) o->weights = v;
    else if (!strcmp(a, "--init") && !strcmp(v, "random")) o->init_random = 1;
    else if (!strcmp(a, "--tokens") && !parse_int(v, 0, 1000000, &n)) o->tokens = n;
    else if (!strcmp(a, "--samples") && !parse_int(v, 1, 1 << 20, &n)) o->samples = (int)n, o->samples_set = 1;
    else if (!strcmp(a, "--top-k") && !parse_int(v, 1, INT32_MAX, &n)) o->top_k = (int)n;
    else if (!strcmp(a, "--seed") && !parse_int(v, 0, INT64_MAX, &n)) o->seed = (uint64_t)n;
    else if (!strcmp(a, "--temperature")) {
      char *e;
      o->temperature = strtod(v, &e);
      if (*e || e == v || !isfinite(o->temperature) || o->temperature < 0)
        return kdrt_errf(err, len, "--temperature wants a number >= 0, got '%s'", v), 2;
    } else
      return kdrt_errf(err, len, "bad option '%s %s' (see %s generate --help)", a, v, argv[0]), 2;
  }
  if (!o->prompt == !o->prompt_ids)
    return kdrt_errf(err, len, "give one of --prompt TEXT (with --vocab) or --prompt-ids "
                     "(see %s generate --help)", argv[0]), 2;
  if (o->prompt && !o->vocab_path)
    return kdrt_errf(err, len, "--prompt is text: it needs --vocab FILE to turn it into ids"), 2;
  if (o->weights && o->init_random)
    return kdrt_errf(err, len, "--weights and --init random exclude each other"), 2;
  return -1;
}

// The vocabulary of --vocab: byte b is id ids[b] (-1: not in it), id i is
// byte bytes[i].
typedef struct {
  int n, ids[256];
  unsigned char bytes[256];
} vocab;

static int vocab_read(const char *path, vocab *v, char *err, size_t len) {
  FILE *f = fopen(path, "rb");
  if (!f) return kdrt_errf(err, len, "--vocab %s: %s", path, strerror(errno));
  int seen[256] = {0}, ch;
  while ((ch = getc(f)) != EOF) seen[ch] = 1;
  int bad = ferror(f);
  fclose(f);
  if (bad) return kdrt_errf(err, len, "--vocab %s: read error", path);
  v->n = 0;
  for (int b = 0; b < 256; b++) {
    v->ids[b] = seen[b] ? v->n : -1;
    if (seen[b]) v->bytes[v->n++] = (unsigned char)b;
  }
  if (!v->n) return kdrt_errf(err, len, "--vocab %s is empty", path);
  return 0;
}

// The prompt as ids into ids[cap]; returns how many, or -1 (err says why).
static int64_t prompt_ids(const gen_options *o, const vocab *v, int64_t vmax, int32_t *ids,
                          int64_t cap, char *err, size_t len) {
  int64_t n = 0;
  if (o->prompt) {
    for (const unsigned char *s = (const unsigned char *)o->prompt; *s; s++, n++) {
      if (v->ids[*s] < 0)
        return kdrt_errf(err, len, "--prompt: character %ld (byte 0x%02x%s%c%s) is not in "
                         "--vocab %s", (long)n + 1, *s, isprint(*s) ? ", '" : "",
                         isprint(*s) ? *s : ' ', isprint(*s) ? "'" : "", o->vocab_path);
      if (n < cap) ids[n] = v->ids[*s];
    }
  } else {
    for (const char *s = o->prompt_ids; *s; n++) {
      char *e;
      long long id = strtoll(s, &e, 10);
      if (e == s || id < 0 || id >= vmax)
        return kdrt_errf(err, len, "--prompt-ids: id %ld is not an integer in [0, %lld)",
                         (long)n + 1, (long long)vmax);
      if (n < cap) ids[n] = (int32_t)id;
      s = *e == ',' || *e == ' ' ? e + 1 : e;
      if (*e && *e != ',' && *e != ' ')
        return kdrt_errf(err, len, "--prompt-ids wants ids separated by commas, got '%s'", o->prompt_ids);
    }
  }
  if (n == 0) return kdrt_errf(err, len, "the prompt is empty: give at least one token");
  return n;
}

// Whether x[0..n) is a probability distribution rather than logits.
static int is_distribution(const float *x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!(x[i] >= 0.0f && x[i] <= 1.0f)) return 0;
    sum += x[i];
  }
  return fabs(sum - 1.0) < 1e-3;
}

static int cmp_desc(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x < y) - (x > y);
}

// The next token from out[0..n): argmax at temperature 0, else a draw from
// softmax(logit / T) over the top_k largest (0: all), u uniform in [0, 1).
static int32_t draw(const float *out, int64_t n, const gen_options *o, double u, double *work) {
  int probs = is_distribution(out, n);
  int64_t best = 0;
  for (int64_t i = 0; i < n; i++) {
    work[i] = probs ? (out[i] > 0 ? log(out[i]) : -INFINITY) : out[i];
    if (work[i] > work[best]) best = i;
  }
  if (o->temperature == 0) return (int32_t)best;
  double floor = -INFINITY;
  if (o->top_k > 0 && o->top_k < n) { // the k-th largest, from a sorted copy
    double *sorted = work + n;
    memcpy(sorted, work, sizeof(double) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(double), cmp_desc);
    floor = sorted[o->top_k - 1];
  }
  double total = 0;
  for (int64_t i = 0; i < n; i++) {
    work[i] = work[i] >= floor && isfinite(work[i])
                  ? exp((work[i] - work[best]) / o->temperature) : 0.0;
    total += work[i];
  }
  double target = u * total, acc = 0;
  for (int64_t i = 0; i < n; i++) {
    acc += work[i];
    if (work[i] > 0 && acc > target) return (int32_t)i;
  }
  return (int32_t)best;
}

// A uniform in [0, 1) for (seed, sample, token): one Philox block.
static double uniform(uint64_t seed, int sample, int64_t token) {
  uint32_t ctr[4] = {(uint32_t)token, (uint32_t)((uint64_t)token >> 32), (uint32_t)sample, 0x67656e},
           key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, w[4];
  kdrt_philox4x32(ctr, key, w);
  return (double)(((uint64_t)w[0] << 21) ^ (w[1] >> 11)) / 9007199254740992.0;
}

static void put_token(FILE *f, const vocab *v, int32_t id, int first) {
  if (v->n) fputc(id < v->n ? v->bytes[id] : '?', f);
  else fprintf(f, "%s%d", first ? "" : " ", id);
}

// What generate needs of the program: one int input [T] (or keras-hub's
// token_ids and padding_mask, *ids the index of token_ids), one output
// [batch, T, V]; T and V come back.
static int gen_shape(const kdrt_program *p, int64_t *T, int64_t *V, int *ids, char *err,
                     size_t len) {
  *ids = p->ninputs == 2 && !strcmp(p->inputs[0].name, "padding_mask") &&
         !strcmp(p->inputs[1].name, "token_ids");
  const kdrt_io *in = &p->inputs[*ids];
  const kdrt_layout *l = &p->outputs[0].layout;
  if ((p->ninputs != 1 && !*ids) || in->dtype != KDRT_I32 || in->rank != 1)
    return kdrt_errf(err, len, "this model's input is not one sequence of token ids [T] "
                     "(generate needs a language model)");
  if (p->noutputs != 1 || l->rank != 3 || l->gshape[1] != in->shape[0])
    return kdrt_errf(err, len, "this model's output is not one distribution per position "
                     "[T, vocabulary] (generate needs a language model)");
  *T = in->shape[0], *V = l->gshape[2];
  return 0;
}

int kdrt_generate(int argc, char **argv, const kdrt_program *p) {
  static kdrt_ctx ctx;
  kdrt_ctx *c = &ctx;
  gen_options o;
  char err[4096] = "";
  int rc = gen_parse(argc, argv, &o, err, sizeof err);
  c->seed = o.seed;
  if (rc >= 0) { // --help or a usage error, the same on every rank
    KDRT_MPI(MPI_Init(&argc, &argv));
    KDRT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
    if (rc == 0 && c->rank == 0) gen_usage(stdout, argv[0]);
    return leave(c, rc, rc ? "%s" : NULL, err);
  }
  int64_t T = 0, V = 0;
  int ids = 0; // the input holding the token ids (1: keras-hub's, after padding_mask)
  vocab voc = {0};
  if (kdrt_infer_open(c, "generate", p, &argc, &argv, o.weights, o.init_random, err, sizeof err) ||
      gen_shape(p, &T, &V, &ids, err, sizeof err) ||
      (o.vocab_path && vocab_read(o.vocab_path, &voc, err, sizeof err)))
    return leave(c, 1, "%s", err);
  int64_t ids_max = p->inputs[ids].num_classes > 0 ? p->inputs[ids].num_classes : V;
  if (voc.n > V || voc.n > ids_max)
    return leave(c, 1, "--vocab %s has %d tokens but the model takes %lld ids and gives %lld",
                 o.vocab_path, voc.n, (long long)ids_max, (long long)V);
  // --prompt-ids a;b;c: one prompt a sample
  int nprompts = 1;
  for (const char *q = o.prompt_ids; q && *q; q++) nprompts += *q == ';';
  if (nprompts > 1 && o.samples_set && o.samples != nprompts)
    return leave(c, 2, "--samples %d but --prompt-ids gives %d prompts (one a sample)", o.samples,
                 nprompts);
  if (nprompts > 1) o.samples = nprompts;
  if (o.samples > p->batch)
    return leave(c, 2, "--samples %d is more than the compiled batch (%d)", o.samples, p->batch);
  if (!o.weights && (o.init_random || !p->weights_file) && !o.quiet && c->rank == 0)
    fprintf(stderr, "generate: no weights file; random weights from --seed %llu\n",
            (unsigned long long)c->seed);

  // Every sample's tokens so far: its prompt (len[s] tokens), then what is
  // drawn, cap a sample.
  int64_t *len = calloc((size_t)o.samples, sizeof *len), nmax = 0;
  gen_options *po = calloc((size_t)nprompts, sizeof *po);
  if (!len || !po) kdrt_fatal(c, "out of memory");
  for (int k = 0; k < nprompts; k++) { // prompt k: the text between the k-th and next ';'
    po[k] = o;
    if (nprompts == 1) continue;
    const char *q = o.prompt_ids;
    for (int j = 0; j < k; j++) q = strchr(q, ';') + 1;
    size_t m = strcspn(q, ";");
    char *one = malloc(m + 1);
    if (!one) kdrt_fatal(c, "out of memory");
    memcpy(one, q, m), one[m] = 0;
    po[k].prompt_ids = one;
  }
  for (int s = 0; s < o.samples; s++) {
    len[s] = prompt_ids(&po[s % nprompts], &voc, ids_max, NULL, 0, err, sizeof err);
    if (len[s] < 0) return leave(c, 2, "prompt %d: %s", s + 1, err);
    if (len[s] > nmax) nmax = len[s];
  }
  int64_t cap = nmax + o.tokens;
  int ba = p->batch_axis;
  int lb = ba >= 0 ? p->batch / p->mesh_shape[ba] : p->batch;
  int row0 = ba >= 0 ? c->coord[ba] * lb : 0;
  const kdrt_layout *l = &p->outputs[0].layout;
  int64_t out_elems = l->gshape[0] * T * V;
  int32_t *seq = malloc(sizeof(int32_t) * (size_t)(cap * o.samples));
  int32_t *x = calloc((size_t)(lb * T), sizeof(int32_t));
  int32_t *mask = calloc((size_t)(lb * T), sizeof(int32_t)); // keras-hub's padding_mask
  int32_t *pos = calloc((size_t)lb, sizeof(int32_t));       // the decode step's positions
  int32_t *next = malloc(sizeof(int32_t) * (size_t)o.samples);
  float *y[KDRT_MAX_FILES] = {0}, *out = c->rank == 0 ? malloc(sizeof(float) * (size_t)out_elems) : NULL;
  float *logs = calloc((size_t)p->nlogs, sizeof(float));
  double *work = malloc(sizeof(double) * (size_t)(2 * V));
  int oom = !seq || !x || !mask || !pos || !next || !logs || !work || (c->rank == 0 && !out);
  for (int j = 0; j < p->nlabels; j++)
    oom |= !(y[j] = calloc((size_t)(lb * kdrt_io_elems(&p->labels[j]) + 1), sizeof(float)));
  if (oom) kdrt_fatal(c, "out of memory");
  for (int s = 0; s < o.samples; s++)
    prompt_ids(&po[s % nprompts], &voc, ids_max, seq + s * cap, cap, err, sizeof err);

  // The decode step when there is one and every prompt fits the window: it
  // runs until the window is full (the positions of a sliding window change,
  // which the cache does not follow); the whole window each token after.
  const kdrt_decode *dec = o.no_cache ? NULL : kdrt_decode_program;
  if (dec && (dec->param_floats != p->param_floats || dec->batch != p->batch || nmax > T)) dec = NULL;
  const kdrt_decode *pre = dec ? kdrt_prefill_program : NULL;
  if (pre && (pre->param_floats != p->param_floats || pre->ncaches != dec->ncaches)) pre = NULL;
  if (dec && !o.quiet && c->rank == 0) {
    fprintf(stderr, "generate: the decode step, one position a token (%d key/value caches%s)\n",
            dec->ncaches, pre ? ", filled by the prefill step" : "");
    if (nmax + o.tokens > T)
      fprintf(stderr, "generate: past the window of %lld positions, the whole window each token\n",
              (long long)T);
  }
  int stream = o.samples == 1 && c->rank == 0;
  if (stream) {
    for (int64_t i = 0; i < len[0]; i++) put_token(stdout, &voc, seq[i], i == 0);
    fflush(stdout);
  }
  int64_t vn = voc.n ? voc.n : V; // never an id the vocabulary cannot print
  int64_t *drawn = calloc((size_t)o.samples, sizeof *drawn); // each sample's tokens so far
  if (!drawn) kdrt_fatal(c, "out of memory");
  if (dec) {
    // The caches hold positions 0 .. fed[s] - 1 of sample s: the prefill
    // step fills every prompt's at once and draws each first token from the
    // output at its prompt's last position; without it the prompts go
    // through the decode step too. Each decode step feeds every sample's
    // next position, its prompt's token or the last one drawn, and draws
    // from the output when that was the last token known (token i of a
    // sample, Philox's counter as without the cache, at position len + i - 1),
    // while every sample that still draws has room in the window.
    size_t floats = dec->arena_floats > (pre ? pre->arena_floats : 0) ? dec->arena_floats
                                                                      : pre->arena_floats;
    float *arena = malloc(sizeof(float) * (floats ? floats : 1));
    float *caches[64] = {0};
    int64_t *fed = calloc((size_t)o.samples, sizeof *fed);
    const void *xs[2 + 1 + 64];
    oom = !arena || !fed || dec->ncaches > 64;
    for (int k = 0; k < dec->ncaches && !oom; k++)
      oom |= !(caches[k] = calloc((size_t)dec->cache_floats[k] + 1, sizeof(float)));
    if (oom) kdrt_fatal(c, "out of memory (the key/value caches)");
    xs[0] = ids ? (void *)mask : (void *)x, xs[ids] = x, xs[ids + 1] = pos;
    for (int k = 0; k < dec->ncaches; k++) xs[ids + 2 + k] = caches[k];
    float *main_arena = c->arena;
    if (pre && o.tokens > 0) {
      memset(x, 0, sizeof(int32_t) * (size_t)(lb * T));
      memset(mask, 0, sizeof(int32_t) * (size_t)(lb * T));
      for (int r = 0; r < lb; r++)
        if (row0 + r < o.samples) {
          memcpy(x + r * T, seq + (row0 + r) * cap, sizeof(int32_t) * (size_t)len[row0 + r]);
          for (int64_t i = 0; i < len[row0 + r]; i++) mask[r * T + i] = 1;
        }
      c->arena = arena;
      pre->step(c, xs);
      kdrt_gather_global(c, &pre->output.layout, c->arena + pre->output.offset, out);
      c->arena = main_arena;
      if (c->rank == 0)
        for (int s = 0; s < o.samples; s++)
          next[s] = draw(out + (s * T + len[s] - 1) * V, vn, &o, uniform(o.seed, s, 0), work);
      KDRT_MPI(MPI_Bcast(next, o.samples, MPI_INT, 0, MPI_COMM_WORLD));
      for (int s = 0; s < o.samples; s++) seq[s * cap + len[s]] = next[s], drawn[s] = 1, fed[s] = len[s];
      if (stream) {
        put_token(stdout, &voc, next[0], 0);
        fflush(stdout);
      }
    }
    for (;;) {
      int go = 0;
      for (int s = 0; s < o.samples; s++)
        if (drawn[s] < o.tokens) go = fed[s] < T ? go | 1 : (go | 2);
      if (go != 1) break; // done, or a window full: the whole window from here
      for (int r = 0; r < lb; r++) {
        int s = row0 + r;
        int64_t t = s < o.samples && fed[s] < T ? fed[s] : 0;
        x[r] = s < o.samples && t < len[s] + drawn[s] ? seq[s * cap + t] : 0;
        pos[r] = (int32_t)t;
        for (int64_t j = 0; j < T; j++) mask[r * T + j] = s < o.samples && j <= t;
      }
      c->arena = arena;
      dec->step(c, xs);
      kdrt_gather_global(c, &dec->output.layout, c->arena + dec->output.offset, out);
      c->arena = main_arena;
      if (c->rank == 0)
        for (int s = 0; s < o.samples; s++)
          next[s] = drawn[s] < o.tokens && fed[s] == len[s] + drawn[s] - 1
                        ? draw(out + s * V, vn, &o, uniform(o.seed, s, drawn[s]), work) : -1;
      KDRT_MPI(MPI_Bcast(next, o.samples, MPI_INT, 0, MPI_COMM_WORLD));
      for (int s = 0; s < o.samples; s++) {
        if (next[s] >= 0) seq[s * cap + len[s] + drawn[s]] = next[s], drawn[s]++;
        if (drawn[s] < o.tokens) fed[s]++;
      }
      if (stream && next[0] >= 0) {
        put_token(stdout, &voc, next[0], 0);
        fflush(stdout);
      }
    }
    for (int k = 0; k < dec->ncaches; k++) free(caches[k]);
    free(arena), free(fed);
  }
  for (;;) { // the whole window (the last T tokens) for each sample's next token
    int more = 0;
    for (int s = 0; s < o.samples; s++) more |= drawn[s] < o.tokens;
    if (!more) break;
    // This rank's rows: the last T tokens of each sample, padded with id 0
    // (a causal model's output at pos does not see what follows it).
    memset(x, 0, sizeof(int32_t) * (size_t)(lb * T));
    memset(mask, 0, sizeof(int32_t) * (size_t)(lb * T));
    for (int r = 0; r < lb; r++)
      if (row0 + r < o.samples) {
        int64_t n = len[row0 + r] + drawn[row0 + r], w = n < T ? n : T;
        memcpy(x + r * T, seq + (row0 + r) * cap + n - w, sizeof(int32_t) * (size_t)w);
        for (int64_t i = 0; i < w; i++) mask[r * T + i] = 1; // the tokens so far
      }
    void *xs[2] = {ids ? (void *)mask : x, x};
    p->eval_step(c, (const void *const *)xs, (const void *const *)y, logs);
    kdrt_gather_global(c, l, c->arena + p->outputs[0].offset, out);
    if (c->rank == 0)
      for (int s = 0; s < o.samples; s++) {
        int64_t n = len[s] + drawn[s], w = n < T ? n : T;
        next[s] = drawn[s] < o.tokens
                      ? draw(out + (s * T + w - 1) * V, vn, &o, uniform(o.seed, s, drawn[s]), work)
                      : -1;
      }
    KDRT_MPI(MPI_Bcast(next, o.samples, MPI_INT, 0, MPI_COMM_WORLD));
    for (int s = 0; s < o.samples; s++)
      if (next[s] >= 0) seq[s * cap + len[s] + drawn[s]] = next[s], drawn[s]++;
    if (stream && next[0] >= 0) {
      put_token(stdout, &voc, next[0], 0);
      fflush(stdout);
    }
  }
  if (c->rank == 0) {
    for (int s = 0; s < o.samples && !stream; s++) {
      if (s) fputs(voc.n ? "\n----\n" : "\n", stdout);
      for (int64_t i = 0; i < len[s] + o.tokens; i++) put_token(stdout, &voc, seq[s * cap + i], i == 0);
    }
    fputc('\n', stdout);
    fflush(stdout);
  }
  for (int k = 1; k < nprompts; k++) free((char *)po[k].prompt_ids);
  if (nprompts > 1) free((char *)po[0].prompt_ids);
  free(seq), free(x), free(mask), free(pos), free(next), free(out), free(logs), free(work);
  free(len), free(po), free(drawn);
  for (int j = 0; j < p->nlabels; j++) free(y[j]);
  return leave(c, 0, NULL);
}
