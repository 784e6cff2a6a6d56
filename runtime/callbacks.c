// callbacks.c: Keras's callbacks as options of the training program.
//
// --reduce-lr-on-plateau, --early-stopping, --checkpoint-best and --csv-log
// are keras.callbacks.ReduceLROnPlateau, EarlyStopping,
// ModelCheckpoint(save_best_only=True) and CSVLogger: each is the state
// machine of its file in keras/src/callbacks/, run at every epoch's end on
// the epoch's logs, in the order a Keras user would list them,
//
//   callbacks=[ReduceLROnPlateau(...), EarlyStopping(...),
//              ModelCheckpoint(..., save_best_only=True), CSVLogger(...)]
//
// with History last, as Keras appends it. ReduceLROnPlateau puts the
// epoch's learning rate (the one the epoch trained with, before any
// reduction) into the logs as "learning_rate", so the CSV file and the
// History have that column; EarlyStopping sets stop_training, which fit
// reads after the epoch; restore_best_weights puts the best epoch's
// weights back when training ends (kdrt_cb_end), stopped or not.
//
// Improvement is MonitorCallback._is_improvement: in min mode
// current + |min_delta| < best, in max mode current - |min_delta| > best,
// each side rounded to float32 first (Keras compares with ops.less on
// Python floats, which the JAX backend makes float32 tensors); no best
// yet (None) is always an improvement. The monitored value is one of the
// epoch's logs, which every rank holds alike (kdrt_main broadcasts rank
// 0's before the callbacks run), so every rank runs the same machine on
// the same numbers and takes every decision (stop, the new learning rate,
// a save) alike; a save is collective.
//
// Unlike Keras, a monitor that names no log is an error before training
// (Keras warns at each epoch's end and does nothing), and so is a monitor
// whose direction auto mode cannot tell (Keras raises that one at the
// first epoch's end).
#include "kdrt.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------ Python's float repr

// v as Python's repr(float) writes it (what the csv module writes for a
// log): the fewest significant digits that read back as v; positional
// for exponents in [-4, 16) with at least one digit after the point
// ("0.5", "3.0", "0.0001"), else d.ddde-XX ("1e-05", "1.5e+16").
void kdrt_py_float(char *buf, size_t len, double v) {
  if (isnan(v)) {
    snprintf(buf, len, "nan");
    return;
  }
  if (isinf(v)) {
    snprintf(buf, len, v < 0 ? "-inf" : "inf");
    return;
  }
  char e[40];
  for (int prec = 0; prec < 17; prec++) { // "%.*e": d.ddde±XX, shortest that round-trips
    snprintf(e, sizeof e, "%.*e", prec, v);
    if (strtod(e, NULL) == v) break;
  }
  const char *s = e, *ep = strchr(e, 'e');
  int neg = *s == '-', exp = atoi(ep + 1), nd = 0;
  char d[20];
  for (s += neg; s < ep; s++)
    if (*s != '.') d[nd++] = *s;
  while (nd > 1 && d[nd - 1] == '0') nd--; // "%.0e" of 0.5 cannot leave zeros; others may
  size_t k = (size_t)snprintf(buf, len, "%s", neg ? "-" : "");
#define PUT(...) \
  (k += (size_t)snprintf(buf + (k < len ? k : len), k < len ? len - k : 0, __VA_ARGS__))
  if (exp < -4 || exp >= 16) {
    PUT("%c", d[0]);
    if (nd > 1) PUT(".%.*s", nd - 1, d + 1);
    PUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  } else if (exp < 0) {
    PUT("0.%.*s%.*s", -exp - 1, "0000", nd, d);
  } else {
    for (int i = 0; i <= exp; i++) PUT("%c", i < nd ? d[i] : '0');
    PUT(".%.*s", nd > exp + 1 ? nd - exp - 1 : 1, nd > exp + 1 ? d + exp + 1 : "0");
  }
#undef PUT
}

// ------------------------------------------------------------ monitoring

// MonitorCallback._is_improvement (see the top of the file).
static int improves(const kdrt_callbacks *cb, double cur, double delta, int has_ref, double ref) {
  if (!has_ref) return 1;
  if (cb->less) return (float)(cur + delta) < (float)ref;
  return (float)(cur - delta) > (float)ref;
}

// Auto mode as MonitorCallback._set_monitor_op decides it: "loss" (or
// "val_loss") is minimised, a metric whose direction is up (kdcc's only
// metric, accuracy, and an output's "<output>_accuracy") maximised; any
// other name is Keras's ValueError.
static int auto_less(const char *monitor, int *less) {
  const char *m = strncmp(monitor, "val_", 4) ? monitor : monitor + 4;
  size_t n = strlen(m);
  if (!strcmp(m, "loss")) return *less = 1, 0;
  if (n >= 8 && !strcmp(m + n - 8, "accuracy")) return *less = 0, 0;
  return -1;
}

// The monitored log's index among the run's logs (cb->monitor) and its
// direction (cb->less); 0, or -1 with a message naming the logs there are.
static int find_monitor(kdrt_callbacks *cb, char *err, size_t errlen) {
  const char *mon = cb->o->monitor ? cb->o->monitor : "val_loss";
  char list[2048] = "";
  size_t k = 0;
  for (int i = 0; i < cb->nnames; i++) {
    if (!cb->has_val && !strncmp(cb->names[i], "val_", 4)) continue;
    if (!strcmp(cb->names[i], mon)) cb->monitor = i;
    k += (size_t)snprintf(list + k, k < sizeof list ? sizeof list - k : 0, "%s%s",
                          k ? ", " : "", cb->names[i]);
  }
  if (cb->monitor < 0)
    return kdrt_errf(err, errlen, "--monitor %s: no such log%s; the logs are %s", mon,
                     !cb->has_val && !strncmp(mon, "val_", 4)
                         ? " (val_ logs need --val-x/--val-y or --validation-split)" : "",
                     list);
  if (cb->o->mode) cb->less = cb->o->mode < 0;
  else if (auto_less(mon, &cb->less))
    return kdrt_errf(err, errlen, "--monitor %s: cannot tell whether to minimize or maximize "
                     "it (as Keras cannot in auto mode); give --mode min or --mode max", mon);
  return 0;
}

int kdrt_cb_begin(kdrt_callbacks *cb, kdrt_ctx *c, const kdrt_options *o, int nnames,
                  const char *const *names, int has_val, int show, char *err, size_t errlen) {
  memset(cb, 0, sizeof *cb);
  cb->show = show;
  cb->o = o;
  cb->monitor = -1;
  cb->names = names;
  cb->nnames = nnames;
  cb->has_val = has_val;
  cb->lr = c->lr;
  if ((o->early_stopping || o->reduce_lr || o->checkpoint_best) && find_monitor(cb, err, errlen))
    return -1;
  if (o->restore_best) {
    size_t n = 0;
    for (int v = 0; v < c->prog->nvars; v++) n += c->prog->vars[v].n;
    cb->best_weights = malloc(sizeof(float) * (n ? n : 1));
    if (!cb->best_weights) kdrt_fatal(c, "out of memory for the best epoch's weights");
  }
  if (o->csv_log && c->rank == 0) {
    // CSVLogger.on_train_begin: append writes no header when the file
    // already begins with a line.
    FILE *old = o->csv_append ? fopen(o->csv_log, "r") : NULL;
    cb->csv_header = !old || fgetc(old) == EOF;
    if (old) fclose(old);
    cb->csv = fopen(o->csv_log, o->csv_append ? "a" : "w");
    if (!cb->csv) return kdrt_errf(err, errlen, "--csv-log %s: %s", o->csv_log, strerror(errno));
  }
  return 0;
}

// ReduceLROnPlateau.on_epoch_end: the learning rate after epoch `epoch`
// (cb->lr, then c->lr). Says so unless replaying.
static void reduce_lr(kdrt_callbacks *cb, kdrt_ctx *c, int epoch, double cur, int say) {
  const kdrt_options *o = cb->o;
  if (cb->rl_cooldown > 0) cb->rl_cooldown--, cb->rl_wait = 0;
  if (improves(cb, cur, o->rl_min_delta, cb->rl_has_best, cb->rl_best)) {
    cb->rl_best = cur, cb->rl_has_best = 1, cb->rl_wait = 0;
    return;
  }
  if (cb->rl_cooldown > 0 || ++cb->rl_wait < o->rl_patience) return;
  double old = cb->lr; // the optimizer's float32 variable, as a Python float
  if (!(old > (double)(float)o->min_lr)) return;
  double lr = old * o->rl_factor;
  if (lr < o->min_lr) lr = o->min_lr;
  cb->lr = c->lr = (float)lr; // optimizer.learning_rate = new_lr (a float32 variable)
  cb->rl_cooldown = o->rl_cooldown, cb->rl_wait = 0;
  if (say && cb->show) {
    char s[64];
    kdrt_py_float(s, sizeof s, lr);
    printf("Epoch %d: ReduceLROnPlateau reducing learning rate to %s.\n", epoch + 1, s);
  }
}

static void snapshot(kdrt_callbacks *cb, const kdrt_ctx *c, int restore) {
  size_t n = 0;
  for (int v = 0; v < c->prog->nvars; v++) {
    const kdrt_var *var = &c->prog->vars[v];
    float *w = c->params + var->offset;
    size_t f = kdrt_var_floats(var); // (issue 23: a variable kept in 16 bits, half)
    if (restore) memcpy(w, cb->best_weights + n, sizeof(float) * f);
    else memcpy(cb->best_weights + n, w, sizeof(float) * f);
    n += var->n;
  }
}

// EarlyStopping.on_epoch_end: 1 to stop training.
static int early_stopping(kdrt_callbacks *cb, const kdrt_ctx *c, int epoch, double cur,
                          int replay) {
  const kdrt_options *o = cb->o;
  if (epoch < o->start_from_epoch) return 0;
  if (o->restore_best && !cb->has_best_weights && !replay)
    snapshot(cb, c, 0), cb->has_best_weights = 1, cb->best_epoch = epoch;
  cb->es_wait++;
  if (improves(cb, cur, o->min_delta, cb->es_has_best, cb->es_best)) {
    cb->es_best = cur, cb->es_has_best = 1, cb->best_epoch = epoch;
    if (o->restore_best && !replay) snapshot(cb, c, 0);
    if (!o->has_baseline || improves(cb, cur, o->min_delta, 1, o->baseline)) cb->es_wait = 0;
    return 0;
  }
  if (cb->es_wait >= o->es_patience && epoch > 0) {
    if (!replay) cb->stopped_epoch = epoch;
    return 1;
  }
  return 0;
}

// ModelCheckpoint(save_best_only=True): the weights, atomically
// (kdrt_weights_save: a temporary, then a rename), when the value improves.
static void checkpoint_best(kdrt_callbacks *cb, kdrt_ctx *c, int epoch, double cur, int replay) {
  const char *mon = cb->names[cb->monitor];
  char was[64] = "None", now[64];
  if (cb->ck_has_best) snprintf(was, sizeof was, "%.5f", cb->ck_best);
  snprintf(now, sizeof now, "%.5f", cur);
  if (!improves(cb, cur, 0, cb->ck_has_best, cb->ck_best)) {
    if (!replay && cb->show) printf("Epoch %d: %s did not improve from %s\n", epoch + 1, mon, was);
    return;
  }
  cb->ck_best = cur, cb->ck_has_best = 1;
  if (replay) return;
  if (cb->show)
    printf("Epoch %d: %s improved from %s to %s, saving model to %s\n", epoch + 1, mon, was, now,
           cb->o->checkpoint_best);
  char err[1024];
  if (kdrt_weights_save(c, cb->o->checkpoint_best, err, sizeof err)) {
    if (c->rank == 0) kdrt_fatal(c, "--checkpoint-best %s", err);
    KDRT_MPI(MPI_Barrier(MPI_COMM_WORLD)); // rank 0 ends the job
  }
}

// CSVLogger.on_epoch_end: the keys are the first epoch's logs, sorted, and
// when none is a val_ log, a val_ twin of each (written "NA"); rows end in
// \r\n (csv.excel).
static void csv_row(kdrt_callbacks *cb, int epoch, const double *logs, double lr) {
  int n = 0, idx[2 * KDRT_MAX_LOGS + 2]; // the keys: index in names, nnames: learning_rate
  for (int i = 0; i < cb->nnames; i++)
    if (cb->has_val || strncmp(cb->names[i], "val_", 4)) idx[n++] = i;
  if (cb->o->reduce_lr) idx[n++] = cb->nnames;
#define KEY(i) ((i) == cb->nnames ? "learning_rate" : cb->names[i])
  for (int i = 1; i < n; i++) // insertion sort by strcmp: Python's sorted()
    for (int j = i; j > 0 && strcmp(KEY(idx[j - 1]), KEY(idx[j])) > 0; j--) {
      int t = idx[j];
      idx[j] = idx[j - 1], idx[j - 1] = t;
    }
  if (cb->csv_header) {
    fputs("epoch", cb->csv);
    for (int i = 0; i < n; i++) fprintf(cb->csv, ",%s", KEY(idx[i]));
    for (int i = 0; i < n && !cb->has_val; i++) fprintf(cb->csv, ",val_%s", KEY(idx[i]));
    fputs("\r\n", cb->csv);
    cb->csv_header = 0;
  }
  fprintf(cb->csv, "%d", epoch);
  for (int i = 0; i < n; i++) {
    char s[64];
    // Keras's logs are float32 metric results, made Python floats.
    kdrt_py_float(s, sizeof s, idx[i] == cb->nnames ? lr : (double)(float)logs[idx[i]]);
    fprintf(cb->csv, ",%s", s);
  }
  for (int i = 0; i < n && !cb->has_val; i++) fputs(",NA", cb->csv);
  fputs("\r\n", cb->csv);
  fflush(cb->csv);
#undef KEY
}

int kdrt_cb_epoch_end(kdrt_callbacks *cb, kdrt_ctx *c, int epoch, const double *logs,
                      int replay) {
  const kdrt_options *o = cb->o;
  int stop = 0;
  double lr_used = cb->lr; // logs["learning_rate"]: before this epoch's reduction
  if (cb->monitor >= 0) {
    double cur = logs[cb->monitor];
    if (o->reduce_lr) reduce_lr(cb, c, epoch, cur, !replay);
    if (o->early_stopping) stop = early_stopping(cb, c, epoch, cur, replay);
    if (o->checkpoint_best) checkpoint_best(cb, c, epoch, cur, replay);
  }
  if (cb->csv && !replay) csv_row(cb, epoch, logs, lr_used);
  return stop && !replay;
}

void kdrt_cb_end(kdrt_callbacks *cb, kdrt_ctx *c) {
  if (cb->stopped_epoch > 0 && cb->show)
    printf("Epoch %d: early stopping\n", cb->stopped_epoch + 1);
  if (cb->has_best_weights) {
    if (cb->show)
      printf("Restoring model weights from the end of the best epoch: %d.\n", cb->best_epoch + 1);
    snapshot(cb, c, 1);
    c->params_changed = 1;
  }
  fflush(stdout);
  if (cb->csv) fclose(cb->csv);
  cb->csv = NULL;
  free(cb->best_weights);
  cb->best_weights = NULL;
}
