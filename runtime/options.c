// options.c: the command line of a generated training program.
//
// kdrt_parse_args reads argv into a kdrt_options in three steps: the
// flags (--quiet, --resume, ...); the options that take a value, as
// `--opt V` or `--opt=V`, each group of them in a function of its own
// (the run, its files, Keras's callbacks) that says whether the value is
// one the option takes; then the options that need or exclude each other.
// A usage error is a one-line message and status 2; the first one found
// is the one said. Nothing here touches MPI: every rank parses alike.
//
// kdrt_resolve_files puts --x/--y files (FILE or NAME=FILE) in the
// program's order; kdrt_check_output tells before a run whether an output
// path can be written.
#include "kdrt.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kdrt_check_output(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return kdrt_errf(err, errlen, "%s: is a directory", path);
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  if (stat(dir, &st) != 0)
    return kdrt_errf(err, errlen, "%s: cannot write there: %s: %s", path, dir, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return kdrt_errf(err, errlen, "%s: cannot write there: %s is not a directory", path, dir);
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/.kdrt-check.%ld", dir, (long)getpid());
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    return kdrt_errf(err, errlen, "%s: cannot write there: %s: %s", path, dir, strerror(errno));
  close(fd);
  unlink(probe);
  return 0;
}

// A usage error: the message in err, exit status 2.
#define bad(err, errlen, ...) (kdrt_errf(err, errlen, __VA_ARGS__), 2)

static int parse_i64(const char *s, int64_t lo, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo) return -1;
  *out = v;
  return 0;
}

static int parse_f64(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return -1;
  *out = v;
  return 0;
}

// --scale: "0.5", "1/255" or "1.0/255.0"; finite, not 0.
static int parse_scale(const char *s, double *out) {
  const char *slash = strchr(s, '/');
  double num, den = 1;
  if (slash) {
    char a[64];
    if ((size_t)(slash - s) >= sizeof a) return -1;
    memcpy(a, s, (size_t)(slash - s));
    a[slash - s] = 0;
    if (parse_f64(a, &num) || parse_f64(slash + 1, &den) || den == 0) return -1;
  } else if (parse_f64(s, &num)) {
    return -1;
  }
  *out = num / den;
  return isfinite(*out) && *out != 0 ? 0 : -1;
}

// The callbacks' options that need another (EarlyStopping's need
// --early-stopping, ...); 0, or 2 with err.
static int callback_args(const kdrt_options *o, char *err, size_t errlen) {
  const char *es = o->restore_best ? "--restore-best-weights" : o->min_delta > 0 ? "--min-delta"
                   : o->has_baseline ? "--baseline" : o->start_from_epoch ? "--start-from-epoch"
                                                                            : NULL;
  if (es && !o->early_stopping) return bad(err, errlen, "%s needs --early-stopping", es);
  const char *rl = o->rl_factor != 0.1 ? "--reduce-lr-factor" : o->rl_min_delta != 1e-4
                   ? "--reduce-lr-min-delta" : o->rl_cooldown ? "--reduce-lr-cooldown"
                   : o->min_lr > 0 ? "--min-lr" : NULL;
  if (rl && !o->reduce_lr) return bad(err, errlen, "%s needs --reduce-lr-on-plateau", rl);
  if (o->csv_append && !o->csv_log) return bad(err, errlen, "--csv-append needs --csv-log");
  if ((o->monitor || o->mode) && !o->early_stopping && !o->reduce_lr && !o->checkpoint_best)
    return bad(err, errlen, "%s needs --early-stopping, --reduce-lr-on-plateau or "
               "--checkpoint-best", o->monitor ? "--monitor" : "--mode");
  // A checkpoint holds no copy of the best epoch's weights.
  if (o->restore_best && o->resume)
    return bad(err, errlen, "--restore-best-weights and --resume exclude each other (a "
               "checkpoint does not hold the best epoch's weights)");
  return 0;
}

// The options that take no value; 1 when arg is one of them (set in o).
static int flag_option(kdrt_options *o, const char *arg) {
  if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) o->help = 1;
  else if (!strcmp(arg, "--quiet") || !strcmp(arg, "-q")) o->quiet = 1;
  else if (!strcmp(arg, "--no-shuffle")) o->no_shuffle = 1;
  else if (!strcmp(arg, "--resume")) o->resume = 1;
  else if (!strcmp(arg, "--drop-remainder")) o->drop_remainder = 1;
  else if (!strcmp(arg, "--restore-best-weights")) o->restore_best = 1;
  else if (!strcmp(arg, "--csv-append")) o->csv_append = 1;
  else return 0;
  return 1;
}

// What an option group made of `--name val` (val NULL: none was given).
enum {
  NOT_MINE,  // not one of the group's options
  TAKEN,     // set in o
  BAD_VALUE, // the option's, but val is not a value it takes (or there is none)
  TOO_MANY,  // a file option given KDRT_MAX_FILES times already
};

// The run: how long, in what batches, on what samples, how fast it learns.
static int run_option(kdrt_options *o, const char *name, const char *val) {
  int64_t iv;
  double dv;
  int ok;
  if (!strcmp(name, "--epochs")) {
    ok = val && !parse_i64(val, 0, &iv) && iv <= 1000000000;
    if (ok) o->epochs = (int)iv;
  } else if (!strcmp(name, "--batch-size")) {
    ok = val && !parse_i64(val, 1, &iv) && iv <= 1000000000;
    if (ok) o->batch_size = (int)iv;
  } else if (!strcmp(name, "--steps-per-epoch")) {
    ok = val && !parse_i64(val, 1, &iv);
    if (ok) o->steps_per_epoch = iv;
  } else if (!strcmp(name, "--synthetic")) {
    ok = val && !parse_i64(val, 1, &iv);
    if (ok) o->synthetic = iv;
  } else if (!strcmp(name, "--seed")) {
    ok = val && !parse_i64(val, 0, &iv);
    if (ok) o->seed = (uint64_t)iv;
  } else if (!strcmp(name, "--validation-split")) {
    ok = val && !parse_f64(val, &dv) && dv >= 0.0 && dv < 1.0;
    if (ok) o->validation_split = dv;
  } else if (!strcmp(name, "--lr")) {
    ok = val && !parse_f64(val, &dv) && dv >= 0.0;
    if (ok) o->has_lr = 1, o->lr = (float)dv;
  } else if (!strcmp(name, "--scale")) {
    ok = val && !parse_scale(val, &dv);
    if (ok) o->scale = dv;
  } else if (!strcmp(name, "--timeout")) {
    ok = val && !parse_f64(val, &dv) && dv >= 0.0;
    if (ok) o->timeout = dv > 0 ? dv : -1;
  } else {
    return NOT_MINE;
  }
  return ok ? TAKEN : BAD_VALUE;
}

// The files: data, weights, history and checkpoints.
static int file_option(kdrt_options *o, const char *name, const char *val) {
  int64_t iv;
  int ok;
  if (!strcmp(name, "--x") || !strcmp(name, "--y") || !strcmp(name, "--val-x") ||
      !strcmp(name, "--val-y") || !strcmp(name, "--test-x") || !strcmp(name, "--test-y")) {
    ok = val && *val;
    kdrt_files *f = name[2] == 'x' ? &o->x : name[2] == 'y' ? &o->y
                  : name[2] == 'v' ? (name[6] == 'x' ? &o->val_x : &o->val_y)
                                   : (name[7] == 'x' ? &o->test_x : &o->test_y);
    if (ok && f->n == KDRT_MAX_FILES) return TOO_MANY;
    if (ok) f->arg[f->n++] = val;
  } else if (!strcmp(name, "--weights") || !strcmp(name, "--save-weights")) {
    ok = val && *val;
    if (ok) *(name[2] == 'w' ? &o->weights : &o->save_weights) = val;
  } else if (!strcmp(name, "--lora-weights") || !strcmp(name, "--save-lora-weights")) {
    ok = val && *val;
    if (ok) *(name[2] == 'l' ? &o->lora_weights : &o->save_lora) = val;
  } else if (!strcmp(name, "--init")) {
    ok = val && !strcmp(val, "random");
    if (ok) o->init_random = 1;
  } else if (!strcmp(name, "--history")) {
    ok = val && *val;
    if (ok) o->history = val;
  } else if (!strcmp(name, "--sample-weight")) {
    ok = val && *val;
    if (ok) o->sample_weight = val;
  } else if (!strcmp(name, "--class-weight")) {
    ok = val && *val;
    if (ok) o->class_weight = val;
  } else if (!strcmp(name, "--checkpoint-dir")) {
    ok = val && *val;
    if (ok) o->checkpoint_dir = val;
  } else if (!strcmp(name, "--checkpoint-every")) {
    ok = val && !parse_i64(val, 1, &iv);
    if (ok) o->checkpoint_every = iv;
  } else {
    return NOT_MINE;
  }
  return ok ? TAKEN : BAD_VALUE;
}

// Keras's callbacks (callbacks.c): EarlyStopping, ReduceLROnPlateau,
// ModelCheckpoint, CSVLogger.
static int callback_option(kdrt_options *o, const char *name, const char *val) {
  int64_t iv;
  double dv;
  int ok;
  if (!strcmp(name, "--early-stopping") || !strcmp(name, "--reduce-lr-on-plateau")) {
    ok = val && !parse_i64(val, 0, &iv);
    if (ok && name[2] == 'e') o->early_stopping = 1, o->es_patience = iv;
    if (ok && name[2] == 'r') o->reduce_lr = 1, o->rl_patience = iv;
  } else if (!strcmp(name, "--start-from-epoch") || !strcmp(name, "--reduce-lr-cooldown")) {
    ok = val && !parse_i64(val, 0, &iv);
    if (ok) *(name[2] == 's' ? &o->start_from_epoch : &o->rl_cooldown) = iv;
  } else if (!strcmp(name, "--min-delta") || !strcmp(name, "--reduce-lr-min-delta") ||
             !strcmp(name, "--min-lr")) {
    ok = val && !parse_f64(val, &dv) && dv >= 0.0;
    if (ok)
      *(name[2] == 'r' ? &o->rl_min_delta : name[6] == 'l' ? &o->min_lr : &o->min_delta) = dv;
  } else if (!strcmp(name, "--reduce-lr-factor")) {
    ok = val && !parse_f64(val, &dv) && dv >= 0.0 && dv < 1.0;
    if (ok) o->rl_factor = dv;
  } else if (!strcmp(name, "--baseline")) {
    ok = val && !parse_f64(val, &dv);
    if (ok) o->has_baseline = 1, o->baseline = dv;
  } else if (!strcmp(name, "--monitor") || !strcmp(name, "--checkpoint-best") ||
             !strcmp(name, "--csv-log")) {
    ok = val && *val;
    if (ok)
      *(name[3] == 'o' ? &o->monitor : name[3] == 'h' ? &o->checkpoint_best : &o->csv_log) = val;
  } else if (!strcmp(name, "--mode")) {
    ok = val && (!strcmp(val, "auto") || !strcmp(val, "min") || !strcmp(val, "max"));
    if (ok) o->mode = !strcmp(val, "min") ? -1 : !strcmp(val, "max") ? 1 : 0;
  } else {
    return NOT_MINE;
  }
  return ok ? TAKEN : BAD_VALUE;
}

// What an option's value must be, for "option '--x' wants ...".
static const char *wanted(const char *name) {
  static const struct {
    const char *name, *want;
  } wants[] = {
      {"--validation-split", "a number in [0, 1)"},
      {"--reduce-lr-factor", "a number in [0, 1)"},
      {"--min-delta", "a number >= 0"},
      {"--reduce-lr-min-delta", "a number >= 0"},
      {"--min-lr", "a number >= 0"},
      {"--baseline", "a number"},
      {"--mode", "auto, min or max"},
      {"--monitor", "a log's name (val_loss, accuracy, ...)"},
      {"--early-stopping", "an integer >= 0"},
      {"--reduce-lr-on-plateau", "an integer >= 0"},
      {"--start-from-epoch", "an integer >= 0"},
      {"--reduce-lr-cooldown", "an integer >= 0"},
      {"--timeout", "seconds, a number >= 0"},
      {"--lr", "a number >= 0"},
      {"--epochs", "an integer >= 0"},
      {"--seed", "an integer >= 0"},
      {"--scale", "a number or a fraction such as 1/255"},
      {"--init", "'random'"},
      {"--weights", "a file name"},
      {"--save-weights", "a file name"},
      {"--lora-weights", "a file name"},
      {"--save-lora-weights", "a file name"},
      {"--checkpoint-dir", "a directory name"},
      {"--x", "a file name"},
      {"--y", "a file name"},
      {"--history", "a file name"},
      {"--sample-weight", "a file name"},
      {"--class-weight", "class:weight pairs such as 0:1,1:5"},
      {"--val-x", "a file name"},
      {"--val-y", "a file name"},
      {"--checkpoint-best", "a file name"},
      {"--csv-log", "a file name"},
      {"--test-x", "a file name"},
      {"--test-y", "a file name"},
  };
  for (size_t i = 0; i < sizeof wants / sizeof wants[0]; i++)
    if (!strcmp(name, wants[i].name)) return wants[i].want;
  return "an integer >= 1"; // --batch-size, --steps-per-epoch, --synthetic, --checkpoint-every
}

// The data options that come in pairs or exclude each other; 0, or 2 with err.
static int data_args(const kdrt_options *o, char *err, size_t errlen) {
  if (o->x.n && !o->y.n) return bad(err, errlen, "--x needs --y (the labels)");
  if (o->y.n && !o->x.n) return bad(err, errlen, "--y needs --x (the inputs)");
  if (o->class_weight && o->sample_weight)
    return bad(err, errlen, "--class-weight and --sample-weight exclude each other (as Keras's "
               "class_weight and sample_weight)");
  if (o->class_weight && !o->x.n)
    return bad(err, errlen, "--class-weight needs --x and --y (the samples it weighs)");
  if (o->sample_weight && !o->x.n)
    return bad(err, errlen, "--sample-weight needs --x and --y (the samples it weighs)");
  if (o->x.n && o->synthetic)
    return bad(err, errlen, "--synthetic and --x exclude each other");
  if (!o->val_x.n != !o->val_y.n)
    return bad(err, errlen, o->val_x.n ? "--val-x needs --val-y (the labels)"
                                       : "--val-y needs --val-x (the inputs)");
  if (!o->test_x.n != !o->test_y.n)
    return bad(err, errlen, o->test_x.n ? "--test-x needs --test-y (the labels)"
                                        : "--test-y needs --test-x (the inputs)");
  if (o->val_x.n && o->validation_split > 0)
    return bad(err, errlen, "--val-x and --validation-split exclude each other");
  if (o->weights && o->init_random)
    return bad(err, errlen, "--weights and --init random exclude each other");
  if ((o->resume || o->checkpoint_every) && !o->checkpoint_dir)
    return bad(err, errlen, "%s needs --checkpoint-dir",
               o->resume ? "--resume" : "--checkpoint-every");
  return 0;
}

int kdrt_parse_args(int argc, char **argv, kdrt_options *o, char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  o->epochs = 1;
  o->scale = 1.0;
  o->seed = 1337;
  o->rl_factor = 0.1, o->rl_min_delta = 1e-4; // ReduceLROnPlateau's defaults
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (flag_option(o, arg)) continue;
    // Every other option takes a value: `--opt V` or `--opt=V`.
    char name[32];
    const char *val;
    const char *eq = strchr(arg, '=');
    if (strncmp(arg, "--", 2) || (eq && (size_t)(eq - arg) >= sizeof name))
      return bad(err, errlen, "unknown option '%s'", arg);
    if (eq) {
      memcpy(name, arg, (size_t)(eq - arg));
      name[eq - arg] = 0;
      val = eq + 1;
    } else {
      snprintf(name, sizeof name, "%s", arg);
      if (strlen(arg) >= sizeof name) return bad(err, errlen, "unknown option '%s'", arg);
      val = i + 1 < argc ? argv[i + 1] : NULL;
    }
    int got = run_option(o, name, val);
    if (got == NOT_MINE) got = file_option(o, name, val);
    if (got == NOT_MINE) got = callback_option(o, name, val);
    if (got == TOO_MANY)
      return bad(err, errlen, "more than %d '%s' options", KDRT_MAX_FILES, name);
    if (got == NOT_MINE) return bad(err, errlen, "unknown option '%s'", name);
    if (!val) return bad(err, errlen, "option '%s' needs a value", name);
    if (got == BAD_VALUE)
      return bad(err, errlen, "option '%s' wants %s, got '%s'", name, wanted(name), val);
    if (!eq) i++;
  }
  int rc = data_args(o, err, errlen);
  return rc ? rc : callback_args(o, err, errlen);
}

// The io whose name is the part of v before its '=', or -1.
static int named_io(const char *v, const kdrt_io *ios, int nio) {
  const char *eq = strchr(v, '=');
  if (!eq) return -1;
  for (int i = 0; i < nio; i++)
    if (ios[i].name && strlen(ios[i].name) == (size_t)(eq - v) && !strncmp(v, ios[i].name, (size_t)(eq - v)))
      return i;
  return -1;
}

// "'a', 'b'": the names of ios, for messages.
static void io_names(char *buf, size_t len, const kdrt_io *ios, int nio) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < nio && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s'%s'", i ? ", " : "", ios[i].name ? ios[i].name : "?");
}

int kdrt_resolve_files(const kdrt_files *f, const char *opt, const kdrt_io *ios, int nio,
                       const char *what, const char **out, char *err, size_t errlen) {
  char names[1024];
  io_names(names, sizeof names, ios, nio);
  int named = 0;
  for (int i = 0; i < f->n; i++) named += named_io(f->arg[i], ios, nio) >= 0;
  for (int i = 0; i < nio; i++) out[i] = NULL;
  if (named == 0) { // FILEs, in the program's order
    if (f->n != nio)
      return kdrt_errf(err, errlen, "%s given %d time%s, but the model has %d %s%s (%s): give "
                       "one %s FILE per %s, in this order, or %s NAME=FILE", opt, f->n,
                       f->n == 1 ? "" : "s", nio, what, nio == 1 ? "" : "s", names, opt, what,
                       opt);
    for (int i = 0; i < nio; i++) out[i] = f->arg[i];
    return 0;
  }
  for (int i = 0; i < f->n; i++) {
    int k = named_io(f->arg[i], ios, nio);
    if (k < 0)
      return kdrt_errf(err, errlen, "%s %s: with NAME=FILE, every %s needs a NAME, one of %s",
                       opt, f->arg[i], opt, names);
    if (out[k])
      return kdrt_errf(err, errlen, "%s %s: %s '%s' has a file already (%s)", opt, f->arg[i],
                       what, ios[k].name, out[k]);
    out[k] = strchr(f->arg[i], '=') + 1;
    if (!*out[k]) return kdrt_errf(err, errlen, "%s %s: no file name after '='", opt, f->arg[i]);
  }
  for (int k = 0; k < nio; k++)
    if (!out[k])
      return kdrt_errf(err, errlen, "%s: no file for %s '%s' (give %s %s=FILE)", opt, what,
                       ios[k].name, opt, ios[k].name);
  return 0;
}

// ------------------------------------------------------------ --help

void kdrt_usage(FILE *f, const kdrt_program *p) {
  // Where the default initial weights come from.
  char archive_text[4600], copy[4200];
  const char *archive = kdrt_program_archive(p);
  if (!p->weights_file)
    snprintf(archive_text, sizeof archive_text, "random, from --seed");
  else if (archive)
    snprintf(archive_text, sizeof archive_text, "the archive the program was compiled from,\n"
             "                        %s%s", archive, archive == p->weights_file ? ""
             : ",\n                        the copy kdcc put beside the program");
  else
    snprintf(archive_text, sizeof archive_text, "the archive the program was compiled from,\n"
             "                        %s, or kdcc's copy %s; neither is there", p->weights_file,
             kdrt_program_copy(p, copy, sizeof copy) ? copy : "<program>.kdcc.d/model.keras");
  int64_t mesh[KDRT_MAX_AXES];
  int64_t devices = 1;
  for (int i = 0; i < p->mesh_ndim; i++) mesh[i] = p->mesh_shape[i], devices *= mesh[i];
  char m[128], a[256];
  kdrt_fmt_shape(m, sizeof m, p->mesh_ndim, mesh);
  kdrt_fmt_names(a, sizeof a, p->mesh_ndim, p->mesh_axes);
  // This model's inputs and labels, in the order --x and --y take them.
  char io[2048] = "";
  size_t k = 0;
  for (int w = 0; w < 2; w++) {
    const kdrt_io *v = w ? p->labels : p->inputs;
    int n = w ? p->nlabels : p->ninputs;
    k += (size_t)snprintf(io + k, k < sizeof io ? sizeof io - k : 0, "%s",
                          w ? "; labels:" : "                        (inputs:");
    for (int i = 0; i < n && k < sizeof io; i++)
      k += (size_t)snprintf(io + k, sizeof io - k, " %s%s", v[i].name,
                            !w && v[i].dtype == KDRT_I32 ? " (int ids)" : "");
  }
  if (k < sizeof io) snprintf(io + k, sizeof io - k, ")\n");
  fprintf(f,
          "usage: %s [options]\n"
          "Trains %s, compiled for mesh %s %s: run it as mpirun -np %lld %s\n"
          "  --epochs N            passes over the training data (default 1)\n"
          "  --batch-size B        global batch size (default %d, the compiled one; a\n"
          "                        larger one replans the activation memory at start-up);\n"
          "                        the last batch of an epoch, of validation and of\n"
          "                        evaluate may be partial\n"
          "  --drop-remainder      leave out each epoch's last partial batch (evaluate still\n"
          "                        takes every sample)\n"
          "  --steps-per-epoch S   at most S steps per epoch (default: every batch)\n"
          "  --synthetic N         N random samples made from --seed (the default, 128,\n"
          "                        when no --x is given)\n"
          "  --x FILE --y FILE     inputs and labels: .npy (float32, float64, uint8,\n"
          "                        int32, int64) or IDX (MNIST's format), either may be\n"
          "                        gzip'd; class ids become what the loss wants. One --x\n"
          "                        per model input and one --y per output with a loss,\n"
          "                        in order, or named: --x NAME=FILE --y NAME=FILE\n"
          "%s"
          "  --val-x F --val-y F   validation data, evaluated after every epoch\n"
          "  --validation-split F  or hold out the last fraction F of the samples\n"
          "  --sample-weight W     Keras's sample_weight for --x/--y (.npy, one weight a\n"
          "                        sample, or a row of the loss's: (N, T) for an output\n"
          "                        (N, T, C)); a program compiled with kdcc --sample-weight\n"
          "  --class-weight C:W,.. or Keras's class_weight: a sample of class C weighs W\n"
          "                        (others 1; the training samples only)\n"
          "  --test-x F --test-y F evaluate on these after fit (default: the validation\n"
          "                        data, else the training data)\n"
          "  --scale S             multiply the inputs by S, a number or a fraction (1/255)\n"
          "  --seed S              seed of weights, dropout, shuffling, synthetic data\n"
          "                        (default 1337)\n"
          "  --no-shuffle          batches in file order every epoch (fit's shuffle=False)\n"
          "  --lr X                learning rate (default %g, the one compiled in)\n"
          "  --history FILE        write per-epoch metrics (and every step's loss,\n"
          "                        step_loss) as JSON\n"
          "  --checkpoint-dir D    save checkpoints in D/ckpt-<step> (the last 2 kept)\n"
          "  --checkpoint-every N  every N optimizer steps (default: each epoch's end)\n"
          "  --resume              continue from D's newest complete checkpoint\n"
          "Keras's callbacks, run at every epoch's end as Keras runs them:\n"
          "  --monitor NAME        the log they watch (default val_loss; see --history)\n"
          "  --mode auto|min|max   whether it should fall or rise (auto: loss falls,\n"
          "                        accuracy rises)\n"
          "  --early-stopping P    EarlyStopping(patience=P): stop when the log has not\n"
          "                        improved for P epochs\n"
          "  --min-delta X         the least change that counts as improving (default 0)\n"
          "  --baseline X          keep waiting until the log beats X\n"
          "  --start-from-epoch N  watch from epoch N+1 on (default 0)\n"
          "  --restore-best-weights  end with the best epoch's weights (the first epoch's\n"
          "                        when none improved on it)\n"
          "  --reduce-lr-on-plateau P  ReduceLROnPlateau(patience=P): multiply the learning\n"
          "                        rate by --reduce-lr-factor F (default 0.1) when the log\n"
          "                        has not improved by --reduce-lr-min-delta X (1e-4) for P\n"
          "                        epochs, then wait --reduce-lr-cooldown N epochs (0); never\n"
          "                        below --min-lr X (0); --history gets learning_rate\n"
          "  --checkpoint-best FILE  ModelCheckpoint(save_best_only=True): write the weights\n"
          "                        (.weights.h5 or .keras, atomically) whenever the log\n"
          "                        improves\n"
          "  --csv-log FILE        CSVLogger: a row of every log per epoch\n"
          "  --csv-append          add to FILE instead of rewriting it\n"
          "  --timeout S           end the job when a rank makes no progress for S seconds\n"
          "                        (a stopped or hung rank leaves the others waiting); 0:\n"
          "                        never; default: 300 s, then 100 times the median step,\n"
          "                        at least 120 s\n"
          "  --weights FILE        initial weights from a .keras or .weights.h5 (default:\n"
          "                        %s)\n"
          "  --init random         random initial weights from --seed, not from that file\n"
          "  --save-weights FILE   after fit, write the weights (.weights.h5 or .keras)\n"
          "%s"
          "  --quiet               print errors only\n"
          "  --help                this text\n",
          kdrt_prog_name, p->model_name ? p->model_name : "the model", m, a, (long long)devices,
          kdrt_prog_invoke, p->batch, io, (double)p->learning_rate, archive_text,
          p->nlora ? "  --lora-weights F.lora.h5       LoRA's starting A and B, from keras-hub's\n"
                     "                        save_lora_weights (default: A he_uniform, B zeros)\n"
                     "  --save-lora-weights F.lora.h5  after fit, write them in that format\n"
                   : "");
  fprintf(f, "Other commands: %s predict (the outputs for inputs), %s generate (a language\n"
             "model's continuation of a prompt), %s gradcheck; each with --help.\n",
          kdrt_prog_invoke, kdrt_prog_invoke, kdrt_prog_invoke);
}
