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
