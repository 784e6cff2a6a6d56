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
  "usage: kdcc MODEL.json|MODEL.keras|PRESET_DIR [options]\n"
  "  --distribution FILE   distribution spec (DataParallel / ModelParallel, JSON)\n"
  "  --mesh a=N,b=M        change the mesh's shape, nothing else\n"
  "  --batch-size N        global batch size (default 32)\n"
  "  --report[=json]       print layouts, collectives and memory per device\n"
  "  --emit=graph          print the sharded training graph\n"
  "  --emit=c DIR, -S DIR  write the generated C program to DIR (no build)\n"
  "  -o FILE               build the training program FILE (default: ./train)\n"
  "  --target cpu|cuda     code generation target (default cpu); cuda writes\n"
  "                        program.cu and builds it with nvcc against runtime/cuda\n"
  "  --cuda-arch sm_NN     GPU architecture (default: the GPU nvidia-smi reports, else sm_90)\n"
  "  --precision P         cuda: matrix products in fp32 (default), tf32, or bf16\n"
  "                        (operands rounded to bfloat16, float32 sums; data stays float32)\n"
  "  --attention fused|chain  cuda at tf32 and bf16: attention in one kernel each way,\n"
  "                        its scores never in memory (not yet proven on a GPU), or as\n"
  "                        the CPU's ops (default chain)\n"
  "  --sequence-length T   a keras-hub model's token steps (default: its\n"
  "                        max_sequence_length, where the backbone has one)\n"
  "  --lora-rank R         keras-hub models: LoRA as backbone.enable_lora(R) (every\n"
  "                        weight frozen, the attention's query and value kernels\n"
  "                        adapted by trained A . B)\n"
  "  --lora-targets a,b    the projections LoRA adapts (default query,value)\n"
  "  --sample-weight       the program takes Keras's sample_weight (./train\n"
  "                        --sample-weight W.npy): each row's loss and weighted\n"
  "                        metric times its weight\n"
  "  --dtype-policy P      Keras's dtype policy for every layer but the inputs, as\n"
  "                        mixed_precision.set_global_policy(P) would give them:\n"
  "                        float32, mixed_bfloat16, mixed_float16 (with Keras's\n"
  "                        LossScaleOptimizer; saved activations in 16 bits), or\n"
  "                        bfloat16 / float16 (the variables kept in that dtype)\n"
  "  --max-memory SIZE     most bytes one device may need (K, M, G, T suffixes;\n"
  "                        default: this machine's memory)\n"
  "  --no-loops            write every layer's code out, in order, instead of a\n"
  "                        function per repeated block called in a loop\n"
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

// --target cuda (see build_cuda_program below).
static bool target_cuda;
static const char *cuda_arch, *precision = "fp32", *attention = "chain";

static void write_c(Graph *g, const char *path) {
  char *tmp = format("%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) error("cannot write '%s': %s", tmp, strerror(errno));
  if (target_cuda) emit_cuda(g, f, cuda_arch, precision);
  else emit_c(g, f);
  if (fclose(f) != 0 || rename(tmp, path) != 0)
    error("cannot write '%s': %s", path, strerror(errno));
}

static void build_cuda_program(Graph *g, const char *out);

// A program compiled from a .keras archive starts from its weights: the
// archive is copied beside the program, as DIR/model.keras, so that the
// program and its .kdcc.d directory can move (runtime/weights.c looks
// there first, then at the archive's path when compiled).
// A keras-hub preset's weights file is copied as DIR/model.weights.h5.
static void copy_archive(const Graph *g, const char *dir) {
  const char *src = g->model->weights_file;
  if (!src) return;
  size_t n = strlen(src);
  bool h5 = n > 3 && !strcmp(src + n - 3, ".h5");
  char *dst = format("%s/%s", dir, h5 ? "model.weights.h5" : "model.keras");
  char *tmp = format("%s.tmp.%d", dst, (int)getpid());
  FILE *in = fopen(src, "rb"), *o = in ? fopen(tmp, "wb") : NULL;
  if (!in || !o) error("cannot copy '%s' to '%s': %s", src, dst, strerror(errno));
  char buf[1 << 16];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, k, o) != k) break;
  int bad = ferror(in) || ferror(o);
  fclose(in);
  if (fclose(o) != 0 || bad || rename(tmp, dst) != 0) {
    unlink(tmp);
    error("cannot copy '%s' to '%s': %s", src, dst, strerror(errno));
  }
}

static void build_program(Graph *g, const char *out) {
  if (target_cuda) {
    build_cuda_program(g, out);
    return;
  }
  char *root = root_dir();
  char *dir = format("%s.kdcc.d", out);
  mkdir(dir, 0755);
  char *src = format("%s/program.c", dir);
  write_c(g, src);
  // issue 24: generate's decode step, a file of its own (decode.c)
  char *dsrc = format("%s/decode.c", dir), *psrc = format("%s/prefill.c", dir);
  if (!prefill_emit_c(psrc)) unlink(psrc), psrc = NULL;
  if (!decode_emit_c(dsrc)) {
    unlink(dsrc), dsrc = NULL;
    if (decode_why())
      warn_at((Loc){0}, "no decode step for `generate` (it re-runs the whole window for each "
              "token): %s", decode_why());
  }
  copy_archive(g, dir);
  char *lib = format("%s/build/libkdrt.a", root);
  if (access(lib, R_OK) != 0)
    error("runtime library '%s' not found; run 'make' in %s first", lib, root);
  const char *cc = getenv("KDCC_CC") ? getenv("KDCC_CC") : "mpicc";
  char *tmp = format("%s.tmp.%d", out, (int)getpid());
  // The program is calls into the runtime, so -O1: a 1000-layer MLP builds
  // about a third faster than with -O2, and steps no slower. KDRT_MARCH:
  // the runtime's own -march (the Makefile's MARCH), so both run on the
  // same machines.
  char *cmd = format("%s -std=c11 -O1 -march=" KDRT_MARCH " -Wall -Wextra -Werror "
                     "-I'%s/runtime' -o '%s' '%s' %s %s '%s' " KDRT_LIBS,
                     cc, root, tmp, src, dsrc ? format("'%s'", dsrc) : "",
                     psrc ? format("'%s'", psrc) : "", lib);
  if (system(cmd) != 0) {
    unlink(tmp);
    error("building '%s' failed (the generated source is %s)", out, src);
  }
  if (rename(tmp, out) != 0) error("cannot write '%s': %s", out, strerror(errno));
}

// ---- --target cuda: program.cu built with nvcc against runtime/cuda

// The first line of a command's output, or NULL.
static char *first_line(const char *cmd) {
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  char line[4096];
  char *r = fgets(line, sizeof line, p) ? xstrdup(line) : NULL;
  int st = pclose(p);
  if (!r || st != 0) return NULL;
  r[strcspn(r, "\r\n")] = 0;
  return *r ? r : NULL;
}

// The first GPU's architecture as nvidia-smi reports it ("9.0" -> sm_90), else sm_90.
static const char *detect_cuda_arch(void) {
  char *cap = first_line("nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null");
  int major, minor;
  if (cap && sscanf(cap, "%d.%d", &major, &minor) == 2 && major > 0 && minor >= 0)
    return format("sm_%d%d", major, minor);
  return "sm_90";
}

// mpicc's flags for nvcc: -Wl,a,b -> -Xlinker a -Xlinker b; -pthread and
// other compiler flags through -Xcompiler; -I, -L, -l, -D as they are.
static char *mpi_flags(const char *what) {
  char *raw = first_line(format("mpicc --showme:%s 2>/dev/null", what));
  if (!raw) error("cannot ask mpicc for its %s flags (is Open MPI's mpicc installed?)", what);
  char *res = xstrdup("");
  for (char *tok = strtok(raw, " \t"); tok; tok = strtok(NULL, " \t")) {
    if (!strncmp(tok, "-Wl,", 4)) {
      char *save = NULL;
      for (char *q = strtok_r(tok + 4, ",", &save); q; q = strtok_r(NULL, ",", &save))
        res = format("%s -Xlinker '%s'", res, q);
    } else if (!strncmp(tok, "-I", 2) || !strncmp(tok, "-L", 2) || !strncmp(tok, "-l", 2) ||
               !strncmp(tok, "-D", 2)) {
      res = format("%s '%s'", res, tok);
    } else {
      res = format("%s -Xcompiler '%s'", res, tok);
    }
  }
  return res;
}

static int arch_number(const char *arch) { return atoi(arch + 3); }

static void build_cuda_program(Graph *g, const char *out) {
  char *root = root_dir();
  char *dir = format("%s.kdcc.d", out);
  mkdir(dir, 0755);
  char *src = format("%s/program.cu", dir);
  write_c(g, src);
  copy_archive(g, dir);
  char *lib = format("%s/build/libkdrt.a", root), *culib = format("%s/build/libkdrt_cuda.a", root);
  if (access(lib, R_OK) != 0)
    error("runtime library '%s' not found; run 'make' in %s first", lib, root);
  if (access(culib, R_OK) != 0)
    error("CUDA runtime library '%s' not found; run 'make' in %s first (it builds the CUDA "
          "runtime where nvcc is installed)", culib, root);
  // The kernels live in the library: it must hold code this GPU can run
  // (its own SASS, or PTX of an older architecture that the driver compiles).
  char *libarch = first_line(format("cat '%s/build/libkdrt_cuda.arch' 2>/dev/null", root));
  if (libarch && !strncmp(libarch, "sm_", 3) && arch_number(libarch) != arch_number(cuda_arch)) {
    if (arch_number(cuda_arch) < arch_number(libarch))
      error("the CUDA runtime in %s was built for %s, which %s cannot run; rebuild it with "
            "'make cuda CUDA_ARCH=%s'", culib, libarch, cuda_arch, cuda_arch);
    warn_at((Loc){0}, "the CUDA runtime was built for %s; on %s its kernels are compiled from "
            "PTX at start-up ('make cuda CUDA_ARCH=%s' avoids that)", libarch, cuda_arch,
            cuda_arch);
  }
  // nvcc: $KDCC_NVCC, else the one on PATH, else CUDA's default place.
  const char *nvcc = getenv("KDCC_NVCC");
  if (!nvcc) nvcc = first_line("command -v nvcc 2>/dev/null") ? "nvcc" : "/usr/local/cuda/bin/nvcc";
  // libnccl and cuBLAS beside nvcc's own libraries: found at run time too.
  char *rpath = xstrdup("");
  char *nvcc_path = first_line(format("readlink -f \"$(command -v '%s')\" 2>/dev/null", nvcc));
  if (nvcc_path) {
    char *slash = strrchr(nvcc_path, '/');
    if (slash) *slash = 0; // .../bin
    slash = strrchr(nvcc_path, '/');
    if (slash) *slash = 0;
    const char *sub[] = {"lib64", "lib", "targets/x86_64-linux/lib"};
    for (int i = 0; i < 3; i++) {
      char *d = format("%s/%s", nvcc_path, sub[i]);
      if (access(d, R_OK) == 0) rpath = format("%s -Xlinker -rpath -Xlinker '%s'", rpath, d);
    }
  }
  char *tmp = format("%s.tmp.%d", out, (int)getpid());
  char *cmd = format("'%s' -std=c++20 -O2 -arch=%s -Xcompiler -Wall,-Wextra "
                     "-DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1 -I'%s/runtime' "
                     "-I'%s/runtime/cuda' %s -o '%s' '%s' '%s' '%s' -lcublasLt -lcublas -lnccl "
                     KDRT_LIBS " %s%s",
                     nvcc, cuda_arch, root, root, mpi_flags("compile"), tmp, src, culib, lib,
                     mpi_flags("link"), rpath);
  if (getenv("KDCC_VERBOSE")) fprintf(stderr, "%s\n", cmd);
  if (system(cmd) != 0) {
    unlink(tmp);
    error("building '%s' with nvcc failed (the generated source is %s)", out, src);
  }
  if (rename(tmp, out) != 0) error("cannot write '%s': %s", out, strerror(errno));
}

// --max-memory: bytes, with an optional K, M, G or T (powers of 1024).
static int64_t parse_bytes(const char *v) {
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  int shift = !*end ? 0 : !strcmp(end, "K") ? 10 : !strcmp(end, "M") ? 20 : !strcmp(end, "G") ? 30
              : !strcmp(end, "T") ? 40 : -1;
  if (end == v || errno || n <= 0 || shift < 0 || n > (INT64_MAX >> shift))
    error("--max-memory: '%s' is not a size such as 16G", v);
  return (int64_t)n << shift;
}

int main(int argc, char **argv) {
  const char *model_path = NULL, *dist_path = NULL, *mesh = NULL, *out = NULL, *cdir = NULL;
  int batch = 32;
  int64_t max_memory = 0;
  const char *max_memory_text = NULL;
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
      if (strcmp(t, "cpu") && strcmp(t, "cuda"))
        error("--target '%s' is not supported (cpu, cuda)", t);
      target_cuda = !strcmp(t, "cuda");
    } else if (!strcmp(a, "--cuda-arch") || !strncmp(a, "--cuda-arch=", 12)) {
      const char *v = a[11] == '=' ? a + 12 : NEXT();
      if (strncmp(v, "sm_", 3) || !v[3] || strspn(v + 3, "0123456789") < 2 ||
          strspn(v + 3, "0123456789abf") != strlen(v + 3))
        error("--cuda-arch: '%s' is not an architecture such as sm_90", v);
      cuda_arch = v;
    } else if (!strcmp(a, "--precision") || !strncmp(a, "--precision=", 12)) {
      const char *v = a[11] == '=' ? a + 12 : NEXT();
      if (strcmp(v, "fp32") && strcmp(v, "tf32") && strcmp(v, "bf16"))
        error("--precision: '%s' is not one of fp32, tf32, bf16", v);
      precision = v;
    } else if (!strcmp(a, "--attention") || !strncmp(a, "--attention=", 12)) {
      attention = a[11] == '=' ? a + 12 : NEXT();
      if (strcmp(attention, "fused") && strcmp(attention, "chain"))
        error("--attention: '%s' is not one of fused, chain", attention);
    } else if (!strcmp(a, "--dtype-policy") || !strncmp(a, "--dtype-policy=", 15)) {
      opt_dtype_policy = a[14] == '=' ? a + 15 : NEXT(); // issue 23: load.c checks it
    } else if (!strcmp(a, "--max-memory") || !strncmp(a, "--max-memory=", 13)) {
      max_memory_text = a[12] == '=' ? a + 13 : NEXT();
      max_memory = parse_bytes(max_memory_text);
    } else if (!strcmp(a, "--sequence-length") || !strncmp(a, "--sequence-length=", 18)) {
      const char *v = a[17] == '=' ? a + 18 : NEXT();
      char *end;
      long long t = strtoll(v, &end, 10);
      if (*end || t <= 0 || t > MAX_DIM)
        error("--sequence-length: '%s' is not a positive integer of at most %d", v, MAX_DIM);
      opt_sequence_length = t;
    } else if (!strcmp(a, "--lora-rank") || !strncmp(a, "--lora-rank=", 12)) {
      const char *v = a[11] == '=' ? a + 12 : NEXT();
      char *end;
      long long r = strtoll(v, &end, 10);
      if (*end || r <= 0 || r > MAX_DIM)
        error("--lora-rank: '%s' is not a positive integer", v);
      opt_lora_rank = r;
    } else if (!strcmp(a, "--lora-targets") || !strncmp(a, "--lora-targets=", 15)) {
      opt_lora_targets = a[14] == '=' ? a + 15 : NEXT();
      if (!*opt_lora_targets || strspn(opt_lora_targets, "abcdefghijklmnopqrstuvwxyz_0123456789,")
                                    != strlen(opt_lora_targets))
        error("--lora-targets: '%s' is not a comma-separated list of layer names such as "
              "query,value", opt_lora_targets);
    } else if (!strcmp(a, "-w")) opt_quiet_warnings = true;
    else if (!strcmp(a, "--no-loops")) opt_no_loops = true; // issue 25
    else if (!strcmp(a, "--sample-weight")) opt_sample_weight = true;
    else if (a[0] == '-') error("unknown option '%s' (see kdcc --help)", a);
    else if (model_path) error("more than one model given ('%s' and '%s')", model_path, a);
    else model_path = a;
#undef NEXT
  }
  if (!model_path) {
    fputs(usage, stderr);
    return 2;
  }

  if (!target_cuda && (cuda_arch || strcmp(precision, "fp32")))
    error("%s applies to --target cuda only", cuda_arch ? "--cuda-arch" : "--precision");
  if (target_cuda && !cuda_arch) cuda_arch = detect_cuda_arch();
  if (target_cuda) opt_products16 |= 1u << KDRT_ROUND_F16; // cuBLAS takes float16 operands too
  if (target_cuda) opt_widen16 = false; // (nothing widened on the GPU)
  if (target_cuda) opt_gpu_products = !strcmp(precision, "bf16") ? 2 : 1; // (their scratch)
  // issue 22: the fused attention's kernels round their products' operands
  // as bf16 and tf32 do (fp32 keeps the chain: within 1e-5 of the CPU's),
  // and take head dims up to 128 (tf32's shared memory: 64)
  if (target_cuda && !strcmp(attention, "fused"))
    opt_fuse_attention = !strcmp(precision, "bf16") ? 128 : !strcmp(precision, "tf32") ? 64 : 0;

  Graph *g = compile_model(model_path, dist_path, mesh, batch);
  if (max_memory_text) {
    check_memory(g, max_memory, format("--max-memory %s", max_memory_text));
  } else {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
      check_memory(g, size_mul(pages, page), format("this machine's %.1f GiB (give --max-memory "
                   "to compile for another)", (double)pages * page / 1073741824.0));
  }

  if (report) print_report(g, stdout, report_json);
  if (emit_graph) print_graph(g, stdout);
  if (cdir) {
    mkdir(cdir, 0755);
    write_c(g, format("%s/program.%s", cdir, target_cuda ? "cu" : "c"));
    char *dsrc = format("%s/decode.c", cdir); // issue 24: generate's decode step, if any
    if (target_cuda || !decode_emit_c(dsrc)) unlink(dsrc);
    char *psrc = format("%s/prefill.c", cdir);
    if (target_cuda || !prefill_emit_c(psrc)) unlink(psrc);
  }
  if (out || (!report && !emit_graph && !cdir)) build_program(g, out ? out : "train");
  return 0;
}
