// fuzz_frontend.c: a libFuzzer target for kdcc's front end.
//
// An input is one of the three files a user gives kdcc, told apart by its
// bytes: a .keras archive (it starts with "PK"), a Keras model JSON (it
// mentions "class_name"; it may embed a "distribution"), or else a
// distribution spec, compiled with tests/good/seq_mlp.json as the model. So
// a crash file is a kdcc input as it is: name it tests/bad/<what>.json (a
// spec: tests/bad/dist_<what>.json) or .keras, and bad_inputs_asan.sh runs
// it as this target did.
//
// Each input is written to a file in a private directory and compiled as
// `kdcc FILE [--distribution SPEC] --batch-size 32 --report` would: every
// pass up to the memory plan (compile_model, the IR verifier after each),
// then the text and JSON reports and the graph, to /dev/null. An error
// longjmps back here (util.c's error_exit) instead of exiting, and
// release_all() frees everything the run allocated, jansson's trees and
// PCRE2's patterns included, so that millions of runs fit in one process.
//
// What is a finding: a crash, a sanitizer report, an internal error (abort,
// or the verifier's exit(70)), a timeout, and a diagnostic of the wrong
// shape: every error must be `FILE:LINE:COL: error: ...`, or `FILE: error:
// ...` for damage to a file as a whole, naming the input (or the spec).
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../compiler/kdcc.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static jmp_buf on_error;
static char dir[64];
static char *model_json, *model_keras, *dist_json, *seed_model;
static FILE *devnull;

static void error_jump(void) { longjmp(on_error, 1); }

static void remove_dir(void) {
  const char *names[] = {"model.json", "model.keras", "dist.json", "seed_mlp.json"};
  char path[128];
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  rmdir(dir);
}

static void *jansson_alloc(size_t n) { return xcalloc(1, n); }

static void write_file(const char *path, const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
    perror(path);
    abort();
  }
}

// The model a distribution spec is compiled with: KDCC_FUZZ_MODEL, else
// tests/good/seq_mlp.json (the target runs from the repository's root).
static char *copy_seed_model(void) {
  const char *from = getenv("KDCC_FUZZ_MODEL") ? getenv("KDCC_FUZZ_MODEL")
                                               : "tests/good/seq_mlp.json";
  FILE *f = fopen(from, "rb");
  if (!f) {
    fprintf(stderr, "fuzz_frontend: cannot open %s (run from the repository's root, or set "
                    "KDCC_FUZZ_MODEL)\n", from);
    exit(2);
  }
  static uint8_t buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  char *to = malloc(strlen(dir) + 32);
  sprintf(to, "%s/seed_mlp.json", dir);
  write_file(to, buf, n);
  return to;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  // tmpfs where there is one: ext4 flushes a file truncated and written again on close
  struct stat st;
  snprintf(dir, sizeof dir, "%s/kdcc-fuzz-XXXXXX",
           stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(2);
  }
  model_json = malloc(sizeof dir + 32), model_keras = malloc(sizeof dir + 32);
  dist_json = malloc(sizeof dir + 32);
  atexit(remove_dir);
  sprintf(model_json, "%s/model.json", dir);
  sprintf(model_keras, "%s/model.keras", dir);
  sprintf(dist_json, "%s/dist.json", dir);
  seed_model = copy_seed_model();
  devnull = fopen("/dev/null", "w");
  error_exit = error_jump;
  json_object_seed(1);
  json_set_alloc_funcs(jansson_alloc, xfree);
  return 0;
}

// `FILE:L:C: error: ` or `FILE: error: ` on the last line, for one of the files.
static bool well_formed(const char *msg, const char *const *files, int nfiles) {
  const char *last = msg, *nl;
  while ((nl = strchr(last, '\n')) && nl[1]) last = nl + 1;
  for (int i = 0; i < nfiles; i++) {
    size_t n = strlen(files[i]);
    if (strncmp(last, files[i], n) || last[n] != ':') continue;
    const char *p = last + n + 1;
    int line, col, used = 0;
    if (sscanf(p, "%d:%d:%n", &line, &col, &used) == 2 && used > 0 && line > 0 && col > 0)
      p += used;
    if (!strncmp(p, " error: ", 8) && p[8] && p[8] != '\n') return true;
  }
  return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *model, *dist = NULL;
  if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
    model = model_keras;
  } else if (memmem(data, size, "\"class_name\"", 12)) {
    model = model_json;
  } else {
    model = seed_model;
    dist = dist_json;
  }
  write_file(dist ? dist : model, data, size);

  char *msg = NULL;
  size_t len = 0;
  diag_out = open_memstream(&msg, &len);
  volatile bool failed = false;
  if (!setjmp(on_error)) {
    Graph *g = compile_model(model, dist, NULL, 32);
    print_report(g, devnull, false);
    print_report(g, devnull, true);
    print_graph(g, devnull);
  } else {
    failed = true;
  }
  fclose(diag_out);
  diag_out = NULL;
  const char *files[] = {model, dist};
  if (failed && !well_formed(msg, files, dist ? 2 : 1)) {
    fprintf(stderr, "fuzz_frontend: an error without its place in %s:\n%s", dist ? dist : model,
            msg);
    abort();
  }
  free(msg);
  json_forget_locations();
  release_all();
  return 0;
}
