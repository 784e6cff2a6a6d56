// The command line: run the passes in order, then report, print the graph,
// emit C, or emit and build an executable against the runtime.
#include "kdcc.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
  "usage: kdcc MODEL.json|MODEL.keras [options]\n"
  "  --distribution FILE   distribution spec (DataParallel / ModelParallel, JSON)\n"
  "  --mesh a=N,b=M        change the mesh's shape, nothing else\n"
  "  --batch-size N        global batch size (default 32)\n"
  "  --report[=json]       print layouts, collectives and memory per device\n"
  "  --emit=graph          print the sharded training graph\n"
  "  --emit=c DIR, -S DIR  write the generated C program to DIR (no build)\n"
  "  -o FILE               build the training program FILE (default: ./train)\n"
  "  --target cpu          code generation target (cpu)\n"
  "  -w                    no warnings\n";

// The directory holding kdcc (and runtime/, build/libkdrt.a beside it).
static char *root_dir(void) {
  const char *env = getenv("KDCC_ROOT");
  if (env) return xstrdup(env);
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return xstrdup(".");
  buf[n] = 0;
  char *slash = strrchr(buf, '/');
  if (slash) *slash = 0;
  return xstrdup(buf);
}

static void write_c(Graph *g, const char *path) {
  char *tmp = format("%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) error("cannot write '%s': %s", tmp, strerror(errno));
  emit_c(g, f);
  if (fclose(f) != 0 || rename(tmp, path) != 0)
    error("cannot write '%s': %s", path, strerror(errno));
}

static void build_program(Graph *g, const char *out) {
  char *root = root_dir();
  char *dir = format("%s.kdcc.d", out);
  mkdir(dir, 0755);
  char *src = format("%s/program.c", dir);
  write_c(g, src);
  char *lib = format("%s/build/libkdrt.a", root);
  if (access(lib, R_OK) != 0)
    error("runtime library '%s' not found; run 'make' in %s first", lib, root);
  const char *cc = getenv("KDCC_CC") ? getenv("KDCC_CC") : "mpicc";
  char *tmp = format("%s.tmp.%d", out, (int)getpid());
  char *cmd = format("%s -std=c11 -O3 -march=native -Wall -Wextra -Werror -I'%s/runtime' "
                     "-I/usr/include/x86_64-linux-gnu/openblas-pthread -o '%s' '%s' '%s' "
                     "-lopenblas -lm",
                     cc, root, tmp, src, lib);
  if (system(cmd) != 0) {
    unlink(tmp);
    error("building '%s' failed (the generated source is %s)", out, src);
  }
  if (rename(tmp, out) != 0) error("cannot write '%s': %s", out, strerror(errno));
}

int main(int argc, char **argv) {
  const char *model_path = NULL, *dist_path = NULL, *mesh = NULL, *out = NULL, *cdir = NULL;
  int batch = 32;
  bool report = false, report_json = false, emit_graph = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (error("option '%s' needs a value", a), NULL))
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (!strcmp(a, "--distribution")) dist_path = NEXT();
    else if (!strncmp(a, "--distribution=", 15)) dist_path = a + 15;
    else if (!strcmp(a, "--mesh")) mesh = NEXT();
    else if (!strncmp(a, "--mesh=", 7)) mesh = a + 7;
    else if (!strcmp(a, "--batch-size") || !strncmp(a, "--batch-size=", 13)) {
      const char *v = a[12] == '=' ? a + 13 : NEXT();
      char *end;
      long b = strtol(v, &end, 10);
      if (*end || b <= 0 || b > INT_MAX) error("--batch-size: '%s' is not a positive integer", v);
      batch = (int)b;
    } else if (!strcmp(a, "--report") || !strcmp(a, "--report=text")) report = true;
    else if (!strcmp(a, "--report=json")) report = report_json = true;
    else if (!strcmp(a, "--emit=graph")) emit_graph = true;
    else if (!strcmp(a, "--emit=c") || !strcmp(a, "-S")) cdir = NEXT();
    else if (!strcmp(a, "-o")) out = NEXT();
    else if (!strcmp(a, "--target") || !strncmp(a, "--target=", 9)) {
      const char *t = a[8] == '=' ? a + 9 : NEXT();
      if (strcmp(t, "cpu")) error("--target '%s' is not supported (cpu)", t);
    } else if (!strcmp(a, "-w")) opt_quiet_warnings = true;
    else if (a[0] == '-') error("unknown option '%s' (see kdcc --help)", a);
    else if (model_path) error("more than one model given ('%s' and '%s')", model_path, a);
    else model_path = a;
#undef NEXT
  }
  if (!model_path) {
    fputs(usage, stderr);
    return 2;
  }

  Graph *g = compile_model(model_path, dist_path, mesh, batch);

  if (report) print_report(g, stdout, report_json);
  if (emit_graph) print_graph(g, stdout);
  if (cdir) {
    mkdir(cdir, 0755);
    write_c(g, format("%s/program.c", cdir));
  }
  if (out || (!report && !emit_graph && !cdir)) build_program(g, out ? out : "train");
  return 0;
}
