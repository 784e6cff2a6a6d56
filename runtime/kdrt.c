// kdrt.c: the part of every kdcc-generated program that is not the model.
//
// kdrt_main runs in this order:
//   1. MPI_Init (a lone `./train` is a singleton world of one rank): start_mpi;
//   2. parse the options (options.c; usage errors exit 2, --help exits 0):
//      parse_options, check_outputs;
//   3. check_program: the world size against the compiled mesh, else say
//      how to run it (`mpirun -np 8 ./train`) and exit 1 on every rank;
//   4. place_and_allocate: place this rank in the mesh (row-major
//      coordinates), allocate the parameter blob, gradients and arena;
//   5. open_data (data.c): a --x file per model input and a --y file
//      per label (in the program's order, or NAME=FILE), .npy or IDX, plain
//      (mmap'd) or gzip'd, converted row by row to float32 (times --scale)
//      or int32 ids, with --val-x/--val-y and --test-x/--test-y; or
//      --synthetic N samples made from the seed; probe_rows; alloc_run;
//      init_weights: prog->init, --weights, with --resume the newest complete
//      checkpoint's tensors, step and data position (checkpoint.c);
//   6. fit: per epoch a seeded shuffle of the training samples, then global
//      batches of --batch-size B (above the compiled batch, the arena
//      plan replayed for B: kdrt_arena_plan) in that order,
//      the last one partial as in Keras; each step's rows are set in the
//      context (kdrt_set_rows) and this rank hands train_step only its share
//      of them (rows [row0, row0 + local_rows): rows / parts of the batch
//      axis, or, when they do not divide, numpy's array_split of them) of
//      every input and label, the next batch gathered by the input thread
//      (data.c's kdrt_prefetch) while this one runs; the running mean of every log
//      (kdrt_program.log_names), each step weighted by its rows as Keras's
//      Mean weighs it, in Keras-style progress on rank 0; validation on
//      --val-x/--val-y, or the last --validation-split fraction (taken
//      before shuffling), every sample; after each step, a checkpoint when
//      one is due; at each epoch's end, Keras's callbacks (callbacks.c:
//      --early-stopping, --reduce-lr-on-plateau, --checkpoint-best,
//      --csv-log) on rank 0's epoch logs, broadcast. A loss that is NaN
//      or inf ends training after its step, as Keras's TerminateOnNaN
//      does; so do weights that are not finite (checked before each
//      checkpoint and at each epoch's end), which are then never saved;
//   7. evaluate (the test set if given, else the validation data if any,
//      else the training data; every sample), then write_outputs: --history
//      atomically, --save-weights (after a divergence, report_divergence:
//      the history so far, no evaluation, status 1); finish.
//   Fit and evaluate are watched (watchdog.c): a rank that makes no progress
//   for --timeout ends the job, saying where it waits.
// Output paths (--history, --save-weights, --checkpoint-best, --csv-log)
// are checked before any of it,
// and every row count the run will use (B and the partial last batches) is
// put to the steps with c->probe set: a program that splits a batch
// dimension over an axis those rows do not divide is an error before
// training (kdrt_rows_refused).
//
// Progress (progress.c): rank 0 redraws the bar in place (\r, colours) on
// its own terminal, else prints one line per epoch; KDRT_PROGRESS=live|plain
// forces. --help is options.c's kdrt_usage; synthetic data and the epoch's
// shuffle are data.c's.
//
// Invariant: the sequence of global batches depends only on the data, the
// seed and the batch size, never on the mesh, so one program compiled for
// different meshes trains on the same numbers. Errors every rank detects
// alike (options, data files) are printed once by rank 0 and every rank
// exits cleanly (kdrt_fail_all); errors of one rank go through kdrt_fatal
// (MPI_Abort): fatal.c's, kdrt_fail_all comm.c's (it frees the communicators).
#include "kdrt.h"
#include "kdrt_round.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ------------------------------------------------------------ a step's rows

void kdrt_set_rows(kdrt_ctx *c, int64_t rows) {
  const kdrt_program *p = c->prog;
  int ba = p->batch_axis, parts = ba >= 0 ? p->mesh_shape[ba] : 1;
  int64_t all = rows ? rows : p->batch;
  c->rows = rows;
  c->ragged = all % parts != 0;
  kdrt_rows_split(all, parts, ba >= 0 ? c->coord[ba] : 0, &c->row0, &c->local_rows);
}

// The first refusal a probe met (kdrt_rows_refused), for kdrt_main's message.
static char rows_refusal[512];

void kdrt_rows_refused(kdrt_ctx *c, int64_t rows, int size, const char *axis) {
  char msg[512];
  snprintf(msg, sizeof msg, "this program splits a batch dimension over mesh axis '%s' (%d "
           "devices), which %lld rows do not divide", axis, size, (long long)rows);
  if (c->probe) {
    if (!rows_refusal[0]) snprintf(rows_refusal, sizeof rows_refusal, "%s", msg);
    return;
  }
  kdrt_fatal(c, "a step of %lld rows cannot run: %s", (long long)rows, msg);
}

// ------------------------------------------------------------ fit and evaluate

typedef struct {
  kdrt_ctx *c;
  const kdrt_program *p;
  const kdrt_options *o;
  kdrt_data data, val, test;   // training data; validation (n = 0: none); test (n = 0: none)
  int64_t ntrain, nval;        // samples of data (after any split) and val
  int64_t B;                   // the global batch in use (--batch-size, or p->batch)
  void **x;                    // [ninputs] each [lb, shape...] of its dtype, lb = this
  float **y;                   // [nlabels] each [lb, shape...]   rank's most rows
  // issue 22: the input thread (data.c; NULL with KDRT_PREFETCH=0) gathers the
  // next batch into the other of two sets of these buffers while a step runs
  // on set cur (x and y point at it); without it there is one set.
  kdrt_prefetch *pf;
  void **xs[2];
  float **ys[2];
  int cur;
  float *logs;                 // [nlogs]: what a step writes
  const char **names;          // [2 * nlogs]: the log names, then "val_" + each
  int show, live;              // rank 0 prints; on a terminal, live
  // history, one entry per epoch: hist[k] for log k, hist[nlogs + k] its val_
  double **hist;
  double *sums;                // [nlogs] the running sums of the epoch in progress
  double *step_loss;           // every train step's own loss, in order (nsteps of them)
  int64_t nsteps;
  // issue 23, a loss-scaled program: each train step's loss scale after it (Keras's
  // dynamic_scale) and whether it was skipped (its gradients not finite), by step
  double *step_scale;
  unsigned char *step_skipped;
  double *eval;                // [nlogs] evaluate's means
  const kdrt_ckpt_state *resume; // --resume: where the checkpoint left off, else NULL
  int epochs_done;             // entries of the history (o->epochs, or fewer when it diverged
                               // or stopped early)
  kdrt_callbacks cb;           // --early-stopping, --reduce-lr-on-plateau, ... (callbacks.c)
  double *lr_hist;             // [epochs] the learning rate each epoch trained with
  char diverged[512];          // why training stopped early (loss or weights not finite), or ""
  double *hist_mem;            // the one allocation behind hist, sums, eval and lr_hist
  char *val_names;             // the one allocation behind the "val_" names
} run;

// The global rows of batch `step` of n samples in batches of B: B, but
// for a last partial batch.
static int64_t batch_rows(int64_t n, int64_t B, int64_t step) {
  return n - step * B < B ? n - step * B : B;
}

// One pass over d in batches of r->B: an epoch's (samples order[]) or
// evaluate's (order NULL: in file order), of `steps` batches; `ahead`, the
// batch the input thread is gathering into the set the step does not read
// (-1: none).
typedef struct {
  const kdrt_data *d;
  const int64_t *order;
  int64_t steps, ahead;
} batches;

kdrt_host_buffers kdrt_batch_buffers;

// A set of batch buffers is about to be refilled: the backend is done
// reading it (kdrt_batch_buffers.reuse).
static void reuse_set(const run *r, void *const *x, float *const *y) {
  if (!kdrt_batch_buffers.reuse) return;
  for (int k = 0; k < r->p->ninputs; k++) kdrt_batch_buffers.reuse(x[k]);
  for (int j = 0; j < r->p->nlabels; j++) kdrt_batch_buffers.reuse(y[j]);
}

// This rank's share of a batch of `rows` global rows: [*row0, *row0 + *n), as
// kdrt_set_rows splits them.
static void rank_rows(const kdrt_ctx *c, int64_t rows, int64_t *row0, int64_t *n) {
  const kdrt_program *p = c->prog;
  int ba = p->batch_axis;
  kdrt_rows_split(rows, ba >= 0 ? p->mesh_shape[ba] : 1, ba >= 0 ? c->coord[ba] : 0, row0, n);
}

// Batch `step` of b: set the step's rows (kdrt_set_rows) and put this
// rank's share of every input and label in r->x and r->y: gathered here, or
// by the input thread while the last step ran (then the sets swap); then the
// next batch of the pass handed to the thread. Returns the batch's global
// rows. The bytes are the same either way (kdrt_data_gather's).
static int64_t load_batch(run *r, batches *b, int64_t step) {
  kdrt_ctx *c = r->c;
  int64_t rows = batch_rows(b->d->n, r->B, step);
  kdrt_set_rows(c, rows);
  // issue 22: a backend holding the whole data set gathers the rows itself
  // (then no batch was handed to the input thread: b->ahead stays -1)
  if (b->ahead < 0 && kdrt_batch_buffers.rows &&
      kdrt_batch_buffers.rows(b->d, b->order, step * r->B + c->row0, c->local_rows))
    return rows;
  if (b->ahead == step) {
    kdrt_prefetch_wait(r->pf);
    r->cur ^= 1, r->x = r->xs[r->cur], r->y = r->ys[r->cur];
  } else {
    if (b->ahead >= 0) kdrt_prefetch_wait(r->pf); // not this one: its set is overwritten
    reuse_set(r, r->x, r->y);
    kdrt_data_gather(b->d, b->order, step * r->B + c->row0, c->local_rows, r->x, r->y);
  }
  b->ahead = -1;
  if (r->pf && step + 1 < b->steps) {
    int64_t row0, n;
    rank_rows(c, batch_rows(b->d->n, r->B, step + 1), &row0, &n);
    reuse_set(r, r->xs[r->cur ^ 1], r->ys[r->cur ^ 1]);
    kdrt_prefetch_post(r->pf, b->d, b->order, (step + 1) * r->B + row0, n, r->xs[r->cur ^ 1],
                       r->ys[r->cur ^ 1]);
    b->ahead = step + 1;
  }
  return rows;
}

// The pass is over (or stopped early): the thread is done with its buffers.
static void end_batches(run *r, batches *b) {
  if (b->ahead >= 0) kdrt_prefetch_wait(r->pf);
  b->ahead = -1;
}

// Keras's Mean of a log over batches weighs each batch's value by its rows.
// The sums are kept in units of whole batches (value * rows / B summed),
// so with full batches they are the plain sums of the values, bit for bit,
// and a checkpoint's sums mean the same either way; a mean is the sum over
// the rows seen / B.
static void add_logs(double *sum, const float *logs, int n, int64_t rows, int64_t B) {
  double w = (double)rows / (double)B;
  for (int k = 0; k < n; k++) sum[k] += (double)logs[k] * w;
}

// kdcc --sample-weight: the sample weights of batch `step` (rows samples,
// order[] or in file order) in add_logs's units (weights / weights a
// sample / B: rows / B when every weight is 1), the divisor of a weighted
// metric's sum (Keras's weighted Mean: sum of value * w over sum of w).
static double batch_weight(const run *r, const kdrt_data *d, const int64_t *order, int64_t step,
                           int64_t rows) {
  const kdrt_program *p = r->p;
  int j = p->nlabels - 1;
  double e = (double)kdrt_io_elems(&p->labels[j]);
  return kdrt_data_weight_sum(d, j, order, step * r->B, rows) / (e * (double)r->B);
}

// A log's mean from its sum: over the batches' rows (units), or for a
// weighted metric over their weights (wsum).
static double log_mean(const kdrt_program *p, int k, double sum, double units, double wsum) {
  return sum / (p->log_weighted && p->log_weighted[k] ? wsum : units);
}

// Mean of every log over every sample of d, the last batch partial, no
// shuffling (Keras's evaluate), into out[nlogs]. Draws a bar when pb is given.
static void evaluate(run *r, const kdrt_data *d, double *out, kdrt_progbar *pb) {
  const kdrt_program *p = r->p;
  int64_t steps = (d->n + r->B - 1) / r->B, seen = 0;
  double wsum = 0.0;
  batches b = {.d = d, .order = NULL, .steps = steps, .ahead = -1};
  for (int k = 0; k < p->nlogs; k++) out[k] = 0;
  for (int64_t s = 0; s < steps; s++) {
    int64_t rows = load_batch(r, &b, s);
    for (int k = 0; k < p->nlogs; k++) r->logs[k] = 0;
    p->eval_step(r->c, (const void *const *)r->x, (const void *const *)r->y, r->logs);
    kdrt_watch_phase(NULL, 0, 0); // progress within the phase
    add_logs(out, r->logs, p->nlogs, rows, r->B);
    if (p->log_weighted) wsum += batch_weight(r, d, NULL, s, rows);
    seen += rows;
    if (pb) {
      double v[2 * KDRT_MAX_LOGS], units = (double)seen / (double)r->B;
      for (int k = 0; k < p->nlogs; k++) v[k] = log_mean(p, k, out[k], units, wsum);
      kdrt_progbar_update(pb, s + 1, s + 1 == steps, p->nlogs, r->names, v);
    }
  }
  end_batches(r, &b);
  for (int k = 0; k < p->nlogs; k++)
    out[k] = seen ? log_mean(p, k, out[k], (double)seen / (double)r->B, wsum) : NAN;
  kdrt_set_rows(r->c, 0);
}

// Training steps per epoch: every batch, the last one partial (or only the
// full ones with --drop-remainder), at most --steps-per-epoch.
static int64_t train_steps(const run *r) {
  int64_t n = r->o->drop_remainder ? r->ntrain / r->B : (r->ntrain + r->B - 1) / r->B;
  return r->o->steps_per_epoch && r->o->steps_per_epoch < n ? r->o->steps_per_epoch : n;
}

// Training has diverged: stop as Keras's TerminateOnNaN stops (the epoch in
// progress ends with what it has, nothing more runs), saying why.
static void diverge(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void diverge(run *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->diverged, sizeof r->diverged, fmt, ap);
  va_end(ap);
}

// Collective: "" when every variable is finite on every rank, else why not
// (the first such variable) in r->diverged, with `when`.
static int weights_diverged(run *r, const char *when) {
  int v = kdrt_weights_finite(r->c);
  if (v < 0) return 0;
  diverge(r, "the weights of '%s' are not finite %s", r->p->vars[v].path, when);
  return 1;
}

// The callbacks at epoch e's end, on its logs v[2 * nlogs] (the val_ ones
// NaN without validation). The logs are identical on every rank already
// (reduced by the steps); rank 0's are broadcast all the same, so no rank
// can take another decision. Returns 1: training stops (EarlyStopping).
static int epoch_end(run *r, int e, double *v) {
  int nl = r->p->nlogs;
  if (r->nval == 0)
    for (int k = 0; k < nl; k++) v[nl + k] = NAN;
  KDRT_MPI(MPI_Bcast(v, 2 * nl, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  for (int k = 0; k < 2 * nl; k++) r->hist[k][e] = v[k];
  kdrt_watch_phase("callbacks", e + 1, 0);
  return kdrt_cb_epoch_end(&r->cb, r->c, e, v, 0);
}

// An epoch in progress, for after_step.
typedef struct {
  int e;
  int64_t steps;
  double *sum, *v;             // the logs' running sums; their means (the bar's values)
  int64_t seen;                // samples done this epoch
  kdrt_progbar *pb;
  const int64_t *order;        // the epoch's sample order
  double wsum;                 // kdcc --sample-weight: the weights seen (batch_weight)
} epoch_run;

// What follows training step s of `rows` samples, on its logs (r->logs):
// the sums, the step's loss, the bar and a checkpoint. Returns 1 when
// training stops there (a loss or weights not finite).
static int after_step(run *r, epoch_run *er, int64_t s, int64_t rows) {
  const kdrt_program *p = r->p;
  const kdrt_options *o = r->o;
  int nl = p->nlogs, e = er->e;
  float l = r->logs[0];
  add_logs(er->sum, r->logs, nl, rows, r->B);
  if (p->log_weighted) er->wsum += batch_weight(r, &r->data, er->order, s, rows);
  er->seen += rows;
  double units = (double)er->seen / (double)r->B;
  for (int k = 0; k < nl; k++) er->v[k] = log_mean(p, k, er->sum[k], units, er->wsum);
  r->step_loss[r->nsteps++] = l;
  // the loss is the same on every rank: all stop here; but a loss scale's
  // skipped step changed nothing (Keras's LossScaleOptimizer goes on)
  if (!isfinite(l) && !(r->step_skipped && r->step_skipped[r->nsteps - 1])) {
    diverge(r, "loss is %s at epoch %d, step %lld", isnan(l) ? "nan" : "inf", e + 1,
            (long long)s + 1);
    if (r->show) {
      if (er->pb->live && er->pb->prev_width) putchar('\n'), er->pb->prev_width = 0;
      printf("Batch %lld: Invalid loss, terminating training\n", (long long)s);
    }
    return 1;
  }
  kdrt_progbar_update(er->pb, s + 1, 0, nl, r->names, er->v);
  if (o->checkpoint_dir) {
    kdrt_ckpt_state st = {.step = r->c->step, .seed = o->seed, .epoch = e, .pos = s + 1,
                          .steps = er->steps, .ntrain = r->ntrain, .batch = r->B, .nlogs = nl,
                          .log_names = p->log_names, .sums = er->sum, .nhist = e,
                          .hist = (const double *const *)r->hist, .nsteps = r->nsteps,
                          .step_loss = r->step_loss, .has_loss_scale = p->loss_scale != 0,
                          .loss_scale = r->c->loss_scale,
                          .loss_scale_count = r->c->loss_scale_count,
                          .iterations = r->c->iterations, .step_scale = r->step_scale};
    // A checkpoint holds finite weights only: a run that diverges keeps
    // its last finite one (and the one before), never rotated out.
    if (kdrt_ckpt_due(o->checkpoint_every, &st) &&
        weights_diverged(r, "after the step; no checkpoint written"))
      return 1;
    kdrt_watch_phase("saving a checkpoint", e + 1, s + 1);
    kdrt_ckpt_maybe_save(r->c, o->checkpoint_dir, o->checkpoint_every, &st);
  }
  return 0;
}

static void fit(run *r) {
  const kdrt_program *p = r->p;
  const kdrt_options *o = r->o;
  int nl = p->nlogs;
  int64_t steps = train_steps(r);
  // The columns: every log, then with validation every val_ log.
  int ncols = r->nval > 0 ? 2 * nl : nl;

  int64_t *order = malloc(sizeof(int64_t) * (size_t)(r->ntrain ? r->ntrain : 1));
  r->step_loss = malloc(sizeof(double) * (size_t)(o->epochs * steps + 1));
  if (p->loss_scale) { // issue 23
    r->step_scale = malloc(sizeof(double) * (size_t)(o->epochs * steps + 1));
    r->step_skipped = calloc((size_t)(o->epochs * steps + 1), 1);
  }
  if (!order || !r->step_loss || (p->loss_scale && (!r->step_scale || !r->step_skipped)))
    kdrt_fatal(r->c, "out of memory for %lld sample indices", (long long)r->ntrain);
  const kdrt_ckpt_state *ck = r->resume;
  int e0 = 0;
  if (ck) { // carry on where the checkpoint left off: epoch, step, sums, history
    if (ck->steps != steps || ck->ntrain != r->ntrain || (ck->batch && ck->batch != r->B))
      kdrt_fail_all(r->c, 1, "%s: the checkpoint was taken with %lld steps per epoch over %lld "
               "training samples in batches of %lld, this run has %lld over %lld in batches of "
               "%lld; resume with the same data, --batch-size and --steps-per-epoch",
               o->checkpoint_dir, (long long)ck->steps, (long long)ck->ntrain,
               (long long)(ck->batch ? ck->batch : r->B), (long long)steps,
               (long long)r->ntrain, (long long)r->B);
    e0 = (int)(ck->epoch < o->epochs ? ck->epoch : o->epochs);
    for (int i = 0; i < ck->nhist && i < o->epochs; i++)
      for (int k = 0; k < 2 * nl; k++) r->hist[k][i] = ck->hist[k][i];
    for (; r->nsteps < ck->nsteps && r->nsteps < o->epochs * steps; r->nsteps++) {
      r->step_loss[r->nsteps] = ck->step_loss[r->nsteps];
      if (r->step_scale) r->step_scale[r->nsteps] = ck->step_scale[r->nsteps];
    }
    // The callbacks' state (and so the learning rate) is a function of the
    // epochs' logs, which the checkpoint holds: replay them.
    for (int i = 0; i < e0; i++) {
      double v[2 * KDRT_MAX_LOGS];
      for (int k = 0; k < 2 * nl; k++) v[k] = r->hist[k][i];
      r->lr_hist[i] = r->c->lr;
      kdrt_cb_epoch_end(&r->cb, r->c, i, v, 1);
    }
  }
  r->epochs_done = e0;
  for (int e = e0; e < o->epochs; e++) {
    if (r->show) printf("Epoch %d/%d\n", e + 1, o->epochs), fflush(stdout);
    r->lr_hist[e] = r->c->lr; // the rate this epoch trains with (ReduceLROnPlateau's log)
    if (o->no_shuffle)
      for (int64_t i = 0; i < r->ntrain; i++) order[i] = i;
    else
      kdrt_shuffle(o->seed, e, order, r->ntrain);
    kdrt_progbar pb;
    kdrt_progbar_start(&pb, r->show, r->live, steps);
    double *sum = r->sums, v[2 * KDRT_MAX_LOGS + 1]; // + 1: learning_rate, for the bar
    for (int k = 0; k < nl; k++) sum[k] = 0;
    int64_t s = 0, seen = 0; // steps and samples done this epoch
    double wsum = 0.0;
    if (ck && e == ck->epoch) {
      s = ck->pos;
      for (int k = 0; k < nl; k++) sum[k] = ck->sums[k];
      for (int64_t i = 0; i < s; i++) {
        seen += batch_rows(r->ntrain, r->B, i);
        if (p->log_weighted)
          wsum += batch_weight(r, &r->data, order, i, batch_rows(r->ntrain, r->B, i));
      }
    }
    epoch_run er = {.e = e, .steps = steps, .sum = sum, .v = v, .seen = seen, .pb = &pb,
                    .order = order, .wsum = wsum};
    // held: a step whose logs its device still holds (c->logs_pending): they
    // are taken (c->collect) once the next step is on its way, so the
    // device computes while the host loads the next batch.
    int64_t held = -1, held_rows = 0;
    batches b = {.d = &r->data, .order = order, .steps = steps, .ahead = -1};
    for (; s < steps; s++) {
      kdrt_watch_phase("training", e + 1, s + 1);
      double t0 = kdrt_now_s();
      int64_t rows = load_batch(r, &b, s);
      for (int k = 0; k < nl; k++) r->logs[k] = 0;
      if (p->schedule) // the rate at the optimizer's iterations, as Keras's optimizer reads it
        r->c->lr = kdrt_schedule_lr(p->schedule, r->c->iterations);
      p->train_step(r->c, (const void *const *)r->x, (const void *const *)r->y, r->logs);
      kdrt_set_rows(r->c, 0);
      kdrt_watch_step_time(kdrt_now_s() - t0);
      if (r->step_scale) { // issue 23: known once the step returns (its decision waits)
        r->step_scale[r->c->step] = r->c->loss_scale;
        r->step_skipped[r->c->step] = !r->c->apply_update;
      }
      r->c->iterations += r->c->apply_update; // a loss scale's skipped step is no iteration
      r->c->step++;
      if (r->c->logs_pending) {
        r->c->logs_pending = 0;
        int stop = 0;
        if (held >= 0) {
          r->c->collect(r->c, r->logs);
          stop = after_step(r, &er, held, held_rows);
        }
        if (stop) { // this step's logs are not wanted; the device is done with it
          r->c->collect(r->c, r->logs);
          s = held + 1;
          held = -1;
          break;
        }
        held = s, held_rows = rows;
        continue;
      }
      if (after_step(r, &er, s, rows)) {
        s++;
        break;
      }
    }
    if (held >= 0) { // the last step's logs
      r->c->collect(r->c, r->logs);
      after_step(r, &er, held, held_rows);
      s = held + 1;
    }
    end_batches(r, &b);
    seen = er.seen;
    double units = (double)seen / (double)r->B;
    for (int k = 0; k < nl; k++)
      r->hist[k][e] = v[k] = seen ? log_mean(p, k, sum[k], units, er.wsum) : NAN;
    r->epochs_done = e + 1;
    if (!r->diverged[0]) weights_diverged(r, "at the end of the epoch");
    if (r->diverged[0]) { // the epoch as far as it went; no validation
      for (int k = 0; k < nl; k++) r->hist[nl + k][e] = v[nl + k] = NAN;
      kdrt_progbar_update(&pb, s, 1, ncols, r->names, v);
      break;
    }
    if (r->nval > 0) {
      double val[KDRT_MAX_LOGS];
      kdrt_watch_phase("validation", e + 1, 0);
      evaluate(r, &r->val, val, NULL);
      for (int k = 0; k < nl; k++) r->hist[nl + k][e] = v[nl + k] = val[k];
    }
    // The callbacks run before the bar's last update, as Keras's
    // ProgbarLogger comes after them: ReduceLROnPlateau's learning_rate
    // is one of the logs the bar shows.
    int stop = epoch_end(r, e, v), nbar = ncols;
    const char *bar_names[2 * KDRT_MAX_LOGS + 1];
    memcpy(bar_names, r->names, sizeof(const char *) * (size_t)ncols);
    if (o->reduce_lr) bar_names[nbar] = "learning_rate", v[nbar++] = r->lr_hist[e];
    kdrt_progbar_update(&pb, steps, 1, nbar, bar_names, v);
    if (stop) break;
  }
  free(order);
}

// ------------------------------------------------------------ history

static void json_num(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.9g", v);
  else fputs("null", f);
}

static void json_list(FILE *f, const char *key, const double *v, int n) {
  fprintf(f, "\"%s\": [", key);
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", f);
    json_num(f, v[i]);
  }
  fputs("]", f);
}

// Write the history as JSON to path.tmp.<pid>, fsync, then rename: a reader
// never sees half a file. Keys as Keras's History: "loss", then every
// other log, then with validation every "val_" log; plus step_loss (every
// step's loss) after "loss", and "evaluate" (the final evaluation's logs).
static int write_history(const run *r, const char *path) {
  const kdrt_program *p = r->p;
  int n = r->epochs_done, nl = p->nlogs;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  fputc('{', f);
  json_list(f, r->names[0], r->hist[0], n);
  if (r->step_loss) fputs(", ", f), json_list(f, "step_loss", r->step_loss, (int)r->nsteps);
  if (r->step_scale) { // issue 23: not Keras's History (it logs none of it): its optimizer's
    fputs(", ", f), json_list(f, "step_loss_scale", r->step_scale, (int)r->nsteps);
    fprintf(f, ", \"iterations\": %lld", (long long)r->c->iterations);
  }
  for (int k = 1; k < nl; k++) fputs(", ", f), json_list(f, r->names[k], r->hist[k], n);
  for (int k = 0; k < nl && r->nval > 0; k++)
    fputs(", ", f), json_list(f, r->names[nl + k], r->hist[nl + k], n);
  if (r->o->reduce_lr) fputs(", ", f), json_list(f, "learning_rate", r->lr_hist, n);
  fputs(", \"evaluate\": {", f);
  for (int k = 0; k < nl; k++) {
    fprintf(f, "%s\"%s\": ", k ? ", " : "", r->names[k]);
    json_num(f, r->eval[k]);
  }
  fputs("}}\n", f);
  int bad_write = fflush(f) != 0 || fsync(fileno(f)) != 0;
  if (fclose(f) != 0 || bad_write || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    errno = e;
    return -1;
  }
  return 0;
}

// ------------------------------------------------------------ the arena

// The arena for a batch of B rows: as compiled up to p->batch, else the
// plan replayed for B (after checking that the replay for p->batch gives
// the compiled offsets, which the program holds).
static size_t replay(const kdrt_ctx *c, int64_t B) {
  size_t n = kdrt_arena_plan(c->prog, B);
  if (n == SIZE_MAX) kdrt_fatal(c, "out of memory for the arena plan");
  return n;
}

static size_t arena_for(const kdrt_ctx *c, int64_t B) {
  const kdrt_program *p = c->prog;
  if (B <= p->batch) return p->arena_floats;
  int nslots = p->arena_plan[p->narena_plan - 1].slot;
  int64_t *compiled = malloc(sizeof(int64_t) * ((size_t)nslots + 1));
  if (!compiled) kdrt_fatal(c, "out of memory for the arena plan");
  memcpy(compiled, p->arena_off, sizeof(int64_t) * ((size_t)nslots + 1));
  size_t n = replay(c, p->batch);
  if (n != p->arena_floats || memcmp(compiled, p->arena_off, sizeof(int64_t) * ((size_t)nslots + 1)))
    kdrt_fatal(c, "this program's arena plan does not replay as kdcc made it (a runtime of "
               "another version?); recompile it with this kdcc");
  free(compiled);
  return replay(c, B);
}

static float *alloc_floats(const kdrt_ctx *c, size_t n, const char *what) {
  float *p = kdrt_buffer_alloc(n);
  if (!p) kdrt_fatal(c, "out of memory: %s needs %zu bytes", what, n * sizeof(float));
  return p;
}

// A batch buffer: kdrt_batch_buffers.alloc's (pinned, from the CUDA
// runtime), else aligned_alloc's; batch_free gives it back.
static float *batch_alloc(const kdrt_ctx *c, size_t n, const char *what) {
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  float *p = kdrt_batch_buffers.alloc ? kdrt_batch_buffers.alloc(bytes ? bytes : 64)
                                      : aligned_alloc(64, bytes ? bytes : 64);
  if (!p) kdrt_fatal(c, "out of memory: %s needs %zu bytes", what, bytes);
  memset(p, 0, bytes);
  return p;
}

// ------------------------------------------------------------ kdrt_main's steps

// MPI up (a lone `./train` is a singleton world of one rank), errors
// returned rather than fatal, this rank's place in the world.
static kdrt_ctx *start_mpi(int *argc, char ***argv, const kdrt_program *prog) {
  KDRT_MPI(MPI_Init(argc, argv));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  static kdrt_ctx ctx;
  kdrt_ctx *c = &ctx;
  c->prog = prog;
  KDRT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
  KDRT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &c->world));
  return c;
}

// Parse the options into o and refuse what this program cannot take: a
// new rate for a scheduled one, weights files of the wrong kind, a
// compiled-in archive that is gone (usage errors exit 2 on every rank).
static void parse_options(kdrt_ctx *c, int argc, char **argv, kdrt_options *o) {
  const kdrt_program *prog = c->prog;
  char err[1024];
  if (kdrt_parse_args(argc, argv, o, err, sizeof err))
    kdrt_fail_all(c, 2, "%s (see %s --help)", err, kdrt_prog_invoke);
  // Keras's optimizer refuses a new rate when its learning rate is a
  // schedule (ReduceLROnPlateau fails at its first reduction): refused here,
  // before training.
  if (prog->schedule && (o->has_lr || o->reduce_lr)) {
    static const char *const names[] = {
#define KDRT_X(name, kname) kname,
      KDRT_SCHEDULE_LIST(KDRT_X)
#undef KDRT_X
    };
    kdrt_fail_all(c, 2, "%s: this program's learning rate is a schedule (%s), which sets the "
                  "rate at every step; Keras's optimizer takes no other rate", o->has_lr ?
                  "--lr" : "--reduce-lr-on-plateau", names[prog->schedule->kind]);
  }
  if (o->save_weights && kdrt_weights_check_path(prog, o->save_weights, err, sizeof err))
    kdrt_fail_all(c, 2, "--save-weights %s", err);
  if (o->checkpoint_best && kdrt_weights_check_path(prog, o->checkpoint_best, err, sizeof err))
    kdrt_fail_all(c, 2, "--checkpoint-best %s", err);
  if ((o->lora_weights || o->save_lora) && !prog->nlora)
    kdrt_fail_all(c, 2, "%s: this program has no LoRA (compile the model with kdcc "
                  "--lora-rank R)", o->lora_weights ? "--lora-weights" : "--save-lora-weights");
  if (!o->help && !o->weights && !o->init_random && prog->weights_file &&
      !kdrt_program_archive(prog))
    kdrt_fail_all(c, 1, "%s", kdrt_archive_gone(prog, err, sizeof err));
}

// Outputs are written at the end (rank 0): a place that cannot take them
// is said now, not after the whole run.
static void check_outputs(kdrt_ctx *c, const kdrt_options *o) {
  const char *const flag[5] = {"--history", "--save-weights", "--checkpoint-best", "--csv-log",
                               "--save-lora-weights"};
  const char *const path[5] = {o->history, o->save_weights, o->checkpoint_best, o->csv_log,
                               o->save_lora};
  char err[1024];
  int bad = 0; // 1 + the index of the first that cannot be written
  for (int i = 0; i < 5 && c->rank == 0 && !bad; i++)
    if (path[i] && kdrt_check_output(path[i], err, sizeof err)) bad = i + 1;
  KDRT_MPI(MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (bad) kdrt_fail_all(c, 1, "%s %s", flag[bad - 1], err);
}

// The world must be the compiled mesh (else how to run it: `mpirun -np 8
// ./train`), the description one this runtime takes, --batch-size one the
// memory plan can hold.
static void check_program(kdrt_ctx *c, const kdrt_options *o) {
  const kdrt_program *prog = c->prog;
  int64_t devices = 1, mesh[KDRT_MAX_AXES];
  for (int i = 0; i < prog->mesh_ndim; i++) mesh[i] = prog->mesh_shape[i], devices *= mesh[i];
  if (devices != c->world) {
    char m[128], a[256];
    kdrt_fmt_shape(m, sizeof m, prog->mesh_ndim, mesh);
    kdrt_fmt_names(a, sizeof a, prog->mesh_ndim, prog->mesh_axes);
    kdrt_fail_all(c, 1,
                  "this program was compiled for mesh %s %s = %lld device%s, but runs on %d "
                  "rank%s; run it as: mpirun -np %lld %s",
                  m, a, (long long)devices, devices == 1 ? "" : "s", c->world,
                  c->world == 1 ? "" : "s", (long long)devices, kdrt_prog_invoke);
  }
  if (prog->nlogs < 1 || prog->nlogs > KDRT_MAX_LOGS || strcmp(prog->log_names[0], "loss") ||
      prog->ninputs < 1 || prog->ninputs > KDRT_MAX_FILES || prog->nlabels > KDRT_MAX_FILES ||
      prog->noutputs > KDRT_MAX_FILES)
    kdrt_fail_all(c, 1, "this program's description is not one this runtime takes (%d inputs, "
                  "%d labels, %d outputs, %d logs, the first '%s'; at most %d, %d, %d, %d, "
                  "'loss' first); recompile it with this kdcc", prog->ninputs, prog->nlabels,
                  prog->noutputs, prog->nlogs, prog->nlogs > 0 ? prog->log_names[0] : "",
                  KDRT_MAX_FILES, KDRT_MAX_FILES, KDRT_MAX_FILES, KDRT_MAX_LOGS);
  // The memory plan is compiled for prog->batch rows: any batch up to it
  // runs in it; a larger one replays the plan for its rows (arena_for),
  // which a program without one (CUDA's) cannot.
  if (o->batch_size > prog->batch && !prog->narena_plan)
    kdrt_fail_all(c, 2, "--batch-size %d: this program holds at most %d rows a step (its "
                  "memory plan was compiled for kdcc --batch-size %d); recompile with kdcc "
                  "--batch-size %d or more", o->batch_size, prog->batch, prog->batch,
                  o->batch_size);
}

// Place this rank in the mesh (row-major coordinates), find the checkpoint
// --resume continues (ck, named in ck_name; "" when none) and take its
// seed, which the data may depend on; allocate the parameters, gradients
// and arena.
static void place_and_allocate(kdrt_ctx *c, kdrt_options *o, kdrt_ckpt_state *ck,
                               char *ck_name, size_t ck_len) {
  const kdrt_program *prog = c->prog;
  for (int a = prog->mesh_ndim - 1, rest = c->rank; a >= 0; a--) {
    c->coord[a] = rest % prog->mesh_shape[a];
    rest /= prog->mesh_shape[a];
  }
  // Checkpoints: D must take files; --resume takes its newest complete one.
  if (o->checkpoint_dir) kdrt_ckpt_prepare(c, o->checkpoint_dir);
  if (o->resume && kdrt_ckpt_find(c, o->checkpoint_dir, ck, ck_name, ck_len) == 0)
    o->seed = ck->seed;
  else if (o->resume && c->rank == 0 && !o->quiet)
    printf("%s: no checkpoint in %s; starting from scratch\n", kdrt_prog_name, o->checkpoint_dir);
  c->seed = o->seed;
  c->step = 0;
  c->iterations = 0; // issue 23
  c->loss_scale = prog->loss_scale ? (float)prog->loss_scale : 1.0f;
  c->loss_scale_count = 0;
  c->apply_update = 1;
  c->lr = o->has_lr ? o->lr : prog->learning_rate;
  c->params = alloc_floats(c, prog->param_floats, "the parameters");
  c->grads = alloc_floats(c, prog->grad_floats, "the gradients");
  c->arena_floats = arena_for(c, o->batch_size);
  c->max_rows = o->batch_size > prog->batch ? o->batch_size : prog->batch;
  c->arena = alloc_floats(c, c->arena_floats, "the activation arena");
}

float *kdrt_widen16(kdrt_ctx *c, size_t floats, int64_t rows, int64_t batch) {
  size_t n = floats * (size_t)(rows > batch ? (rows + batch - 1) / batch : 1);
  if (n > c->widen16_floats) {
    kdrt_buffer_free(c->widen16);
    c->widen16 = alloc_floats(c, n, "the 16-bit products' widened operands");
    c->widen16_floats = n;
  }
  return c->widen16;
}

// Open the data (data.c): --x/--y (or --synthetic samples, 128 when
// nothing is given), --val-x/--val-y or the --validation-split, --test-x/
// --test-y; then the batch B and the checks of the sample counts against
// it. Every rank opens the same files and fails alike.
static void open_data(run *r, kdrt_options *o) {
  kdrt_ctx *c = r->c;
  const kdrt_program *prog = r->p;
  char err[1024];
  // The files in the program's order: --x per input, --y per label (usage
  // errors, status 2).
  const char *xs[3][KDRT_MAX_FILES], *ys[3][KDRT_MAX_FILES];
  const kdrt_files *fx[3] = {&o->x, &o->val_x, &o->test_x};
  const kdrt_files *fy[3] = {&o->y, &o->val_y, &o->test_y};
  static const char *const ox[3] = {"--x", "--val-x", "--test-x"};
  static const char *const oy[3] = {"--y", "--val-y", "--test-y"};
  // kdcc --sample-weight: the last label is the sample weights, --sample-weight's
  // file for --x/--y (validation and test data have none: ones, as in Keras)
  int ny = prog->nlabels, sw = ny && prog->labels[ny - 1].label_kind == KDRT_LABEL_WEIGHT;
  ny -= sw;
  if ((o->sample_weight || o->class_weight) && !sw)
    kdrt_fail_all(c, 2, "%s: the program takes no sample weights; compile it with kdcc "
                  "--sample-weight", o->sample_weight ? "--sample-weight" : "--class-weight");
  if (o->class_weight && ny != 1)
    kdrt_fail_all(c, 2, "--class-weight: the model has %d outputs with a loss; Keras's "
                  "class_weight is for one", ny);
  for (int i = 0; i < 3; i++) {
    if (!fx[i]->n) continue;
    if (kdrt_resolve_files(fx[i], ox[i], prog->inputs, prog->ninputs, "input", xs[i], err,
                           sizeof err) ||
        kdrt_resolve_files(fy[i], oy[i], prog->labels, ny, "label", ys[i], err, sizeof err))
      kdrt_fail_all(c, 2, "%s (see %s --help)", err, kdrt_prog_invoke);
    if (sw) ys[i][ny] = i == 0 ? o->sample_weight : NULL;
  }
  if (o->x.n) {
    if (kdrt_data_open(&r->data, prog, xs[0], ys[0], o->scale, err, sizeof err) ||
        (o->class_weight && kdrt_data_class_weight(&r->data, o->class_weight, err, sizeof err)))
      kdrt_fail_all(c, 1, "%s", err);
  } else {
    if (!o->synthetic) {
      o->synthetic = 128;
      if (r->show) printf("%s: no --x/--y given; training on --synthetic 128 random samples\n",
                          kdrt_prog_name);
    }
    kdrt_data_synthetic(&r->data, prog, o->seed, o->synthetic);
    r->data.scale = o->scale;
  }
  if (o->val_x.n && kdrt_data_open(&r->val, prog, xs[1], ys[1], o->scale, err, sizeof err))
    kdrt_fail_all(c, 1, "%s", err);
  if (o->test_x.n && kdrt_data_open(&r->test, prog, xs[2], ys[2], o->scale, err, sizeof err))
    kdrt_fail_all(c, 1, "%s", err);
  // Keras: the validation split is the last fraction, taken before shuffling.
  if (o->validation_split > 0) {
    int64_t n = r->data.n, keep = (int64_t)floor((double)n * (1.0 - o->validation_split));
    r->val = kdrt_data_slice(&r->data, keep, n - keep);
    r->val.class_w = NULL; // Keras splits before class_weight weighs the training data
    r->data.n = keep;
  }
  r->ntrain = r->data.n;
  r->nval = r->val.n;
  r->B = o->batch_size ? o->batch_size : prog->batch;
  if (r->ntrain == 0 && o->validation_split > 0)
    kdrt_fail_all(c, 1, "--validation-split %g leaves no training samples", o->validation_split);
  if (r->ntrain == 0) kdrt_fail_all(c, 1, "%s holds no samples", o->x.n ? xs[0][0] : "the data");
  if (o->validation_split > 0 && r->nval == 0)
    kdrt_fail_all(c, 1, "--validation-split %g of %lld samples leaves no validation samples",
                  o->validation_split, (long long)(r->ntrain + r->nval));
  if (o->val_x.n && r->nval == 0) kdrt_fail_all(c, 1, "%s holds no samples", xs[1][0]);
  if (o->test_x.n && r->test.n == 0) kdrt_fail_all(c, 1, "%s holds no samples", xs[2][0]);
  if (r->show && o->drop_remainder && r->ntrain % r->B)
    printf("%s: --drop-remainder: %lld of %lld training samples do not fill a batch of %lld; "
           "each epoch leaves them out\n", kdrt_prog_name, (long long)(r->ntrain % r->B),
           (long long)r->ntrain, (long long)r->B);
  if (o->drop_remainder && r->ntrain < r->B)
    kdrt_fail_all(c, 1, "--drop-remainder: %lld training samples do not fill one batch of %lld",
                  (long long)r->ntrain, (long long)r->B);
  int64_t all = o->drop_remainder ? r->ntrain / r->B : (r->ntrain + r->B - 1) / r->B;
  if (r->show && o->steps_per_epoch > all)
    printf("%s: --steps-per-epoch %lld is more than the %lld batches; using %lld\n",
           kdrt_prog_name, (long long)o->steps_per_epoch, (long long)all, (long long)all);
}

// The data evaluate takes: the test set if given, else the validation data
// if any, else the training data.
static const kdrt_data *evaluated(const run *r) {
  return r->test.n ? &r->test : r->nval > 0 ? &r->val : &r->data;
}

// Every row count a step will see must run on this program (a batch
// dimension split over an axis other than the batch axis needs rows that
// divide by its size): asked of the steps (c->probe) before any training.
static void probe_rows(const run *r) {
  kdrt_ctx *c = r->c;
  const kdrt_program *prog = r->p;
  const kdrt_options *o = r->o;
  int64_t counts[4] = {r->B, o->drop_remainder ? 0 : r->ntrain % r->B, r->nval % r->B,
                       evaluated(r)->n % r->B};
  static const char *const what[4] = {"a batch", "the last training batch",
                                      "the last validation batch",
                                      "the last batch that evaluate takes"};
  for (int i = 0; i < 4; i++) {
    if (!counts[i]) continue;
    kdrt_set_rows(c, counts[i]);
    c->probe = 1;
    float probe_logs[KDRT_MAX_LOGS];
    (i == 0 || i == 1 ? prog->train_step : prog->eval_step)(c, NULL, NULL, probe_logs);
    c->probe = 0;
    kdrt_set_rows(c, 0);
    if (rows_refusal[0])
      kdrt_fail_all(c, 1, "%s of %lld rows cannot run: %s; choose a --batch-size (and a sample "
                    "count) that it divides, or --drop-remainder", what[i],
                    (long long)counts[i], rows_refusal);
  }
}

// This rank's batch buffers (its share of the most rows a step has), the
// logs, their names (then "val_" + each) and the history.
static void alloc_run(run *r) {
  kdrt_ctx *c = r->c;
  const kdrt_program *prog = r->p;
  int ba = prog->batch_axis;
  int64_t most = r->B > prog->batch ? r->B : prog->batch; // the most rows a step has
  int64_t lb = ba >= 0 ? (most + prog->mesh_shape[ba] - 1) / prog->mesh_shape[ba] : most;
  r->pf = kdrt_prefetch_start(); // issue 22: a second set of buffers for it
  for (int set = 0; set < (r->pf ? 2 : 1); set++) {
    void **x = calloc((size_t)prog->ninputs + 1, sizeof *x);
    float **y = calloc((size_t)prog->nlabels + 1, sizeof *y);
    if (!x || !y) kdrt_fatal(c, "out of memory");
    for (int k = 0; k < prog->ninputs; k++)
      x[k] = batch_alloc(c, (size_t)lb * (size_t)kdrt_io_elems(&prog->inputs[k]),
                         "the input batch");
    for (int j = 0; j < prog->nlabels; j++)
      y[j] = batch_alloc(c, (size_t)lb * (size_t)kdrt_io_elems(&prog->labels[j]),
                         "the label batch");
    r->xs[set] = x, r->ys[set] = y;
  }
  r->cur = 0, r->x = r->xs[0], r->y = r->ys[0];
  int ne = r->o->epochs > 0 ? r->o->epochs : 1, nl = prog->nlogs;
  double *hist = calloc((size_t)ne * (2 * (size_t)nl + 1) + 2 * (size_t)nl, sizeof(double));
  r->hist = calloc(2 * (size_t)nl, sizeof *r->hist);
  r->names = calloc(2 * (size_t)nl, sizeof *r->names);
  char *val_names = calloc(2 * (size_t)nl, 128);
  r->logs = calloc((size_t)nl, sizeof *r->logs);
  if (!hist || !r->hist || !r->names || !val_names || !r->logs) kdrt_fatal(c, "out of memory");
  for (int k = 0; k < 2 * nl; k++) r->hist[k] = hist + (size_t)k * (size_t)ne;
  r->sums = hist + 2 * (size_t)nl * (size_t)ne, r->eval = r->sums + nl;
  r->lr_hist = r->eval + nl;
  for (int k = 0; k < nl; k++) {
    r->names[k] = prog->log_names[k];
    snprintf(val_names + 128 * k, 128, "val_%s", prog->log_names[k]);
    r->names[nl + k] = val_names + 128 * k;
  }
  r->hist_mem = hist, r->val_names = val_names;
}

// The initial weights: the program's own, then --weights or the archive
// it was compiled from, then the checkpoint ck (named ck_name) that
// --resume continues.
static void init_weights(run *r, const kdrt_ckpt_state *ck, const char *ck_name) {
  kdrt_ctx *c = r->c;
  const kdrt_options *o = r->o;
  char err[1024];
  r->p->init(c);
  kdrt_round_vars(c); // issue 23
  const char *wfile = o->weights ? o->weights : o->init_random ? NULL
                                                               : kdrt_program_archive(r->p);
  if (wfile && kdrt_weights_load(c, wfile, err, sizeof err)) kdrt_fail_all(c, 1, "%s", err);
  if (o->lora_weights && kdrt_lora_load(c, o->lora_weights, err, sizeof err))
    kdrt_fail_all(c, 1, "--lora-weights %s", err);
  if (ck_name[0]) {
    kdrt_ckpt_load(c, o->checkpoint_dir, ck_name);
    c->step = ck->step;
    c->iterations = ck->has_loss_scale ? ck->iterations : ck->step; // issue 23
    if (ck->has_loss_scale)
      c->loss_scale = (float)ck->loss_scale, c->loss_scale_count = ck->loss_scale_count;
    r->resume = ck;
    if (r->show)
      printf("%s: resuming from %s/%s: epoch %lld, %lld of %lld steps done\n", kdrt_prog_name,
             o->checkpoint_dir, ck_name, (long long)ck->epoch + 1, (long long)ck->pos,
             (long long)ck->steps);
  }
}

// The callbacks: their monitored log must be one of this run's.
static void begin_callbacks(run *r) {
  char err[1024];
  int rc = kdrt_cb_begin(&r->cb, r->c, r->o, 2 * r->p->nlogs, r->names, r->nval > 0, r->show,
                         err, sizeof err);
  KDRT_MPI(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (rc) kdrt_fail_all(r->c, 1, "%s", err);
}

// Training diverged: the history so far, no evaluation, no weights saved;
// rank 0 says why and which checkpoint to --resume. Returns the status, 1.
static int report_divergence(run *r) {
  const kdrt_options *o = r->o;
  for (int k = 0; k < r->p->nlogs; k++) r->eval[k] = NAN;
  if (r->c->rank == 0) {
    fflush(stdout);
    fprintf(stderr, "%s: training diverged: %s; stopped as Keras's TerminateOnNaN stops%s%s%s",
            kdrt_prog_name, r->diverged, o->history ? "; the history so far is in " : "",
            o->history ? o->history : "", o->save_weights ? "; " : "\n");
    if (o->save_weights) fprintf(stderr, "%s is not written\n", o->save_weights);
    char latest[4400], name[64] = "";
    FILE *lf = NULL;
    if (o->checkpoint_dir) {
      snprintf(latest, sizeof latest, "%s/latest", o->checkpoint_dir);
      lf = fopen(latest, "r");
    }
    if (lf && fscanf(lf, "%63s", name) == 1)
      fprintf(stderr, "%s: the last checkpoint, %s/%s, holds finite weights: --resume it with "
              "a smaller --lr\n", kdrt_prog_name, o->checkpoint_dir, name);
    if (lf) fclose(lf);
  }
  return 1;
}

// --history (rank 0) and --save-weights (not after a divergence). Returns
// the status: 0, or 1 when one could not be written.
static int write_outputs(run *r) {
  const kdrt_options *o = r->o;
  kdrt_ctx *c = r->c;
  char err[1024];
  int status = 0;
  if (o->history && c->rank == 0 && write_history(r, o->history)) {
    fprintf(stderr, "%s: cannot write history %s: %s\n", kdrt_prog_name, o->history,
            strerror(errno));
    status = 1;
  }
  kdrt_watch_phase("saving the weights", 0, 0);
  if (o->save_weights && !r->diverged[0] &&
      kdrt_weights_save(c, o->save_weights, err, sizeof err)) {
    if (c->rank == 0) fprintf(stderr, "%s: %s\n", kdrt_prog_name, err);
    status = 1;
  }
  if (o->save_lora && !r->diverged[0] && kdrt_lora_save(c, o->save_lora, err, sizeof err)) {
    if (c->rank == 0) fprintf(stderr, "%s: --save-lora-weights %s\n", kdrt_prog_name, err);
    status = 1;
  }
  return status;
}

// MPI down, everything freed.
static void finish(run *r) {
  kdrt_ctx *c = r->c;
  const kdrt_program *prog = r->p;
  fflush(stdout);
  kdrt_watchdog_stop();
  kdrt_comm_free(c);
  MPI_Finalize();
  free(r->hist_mem), free(r->hist), free(r->names), free(r->val_names), free(r->logs);
  free(r->step_loss);
  free(r->step_scale), free(r->step_skipped);
  kdrt_prefetch_stop(r->pf);
  void (*batch_free)(void *) = kdrt_batch_buffers.free ? kdrt_batch_buffers.free : free;
  for (int set = 0; set < 2 && r->xs[set]; set++) {
    for (int k = 0; k < prog->ninputs; k++) batch_free(r->xs[set][k]);
    for (int j = 0; j < prog->nlabels; j++) batch_free(r->ys[set][j]);
    free(r->xs[set]), free(r->ys[set]);
  }
  kdrt_data_close(&r->test), kdrt_data_close(&r->val), kdrt_data_close(&r->data);
  kdrt_buffer_free(c->params), kdrt_buffer_free(c->grads), kdrt_buffer_free(c->arena);
  kdrt_buffer_free(c->widen16);
}

// ------------------------------------------------------------ main

int kdrt_main(int argc, char **argv, const kdrt_program *prog) {
  kdrt_set_program(argc, argv);
  if (argc > 1 && !strcmp(argv[1], "predict")) return kdrt_predict(argc, argv, prog);
  if (argc > 1 && !strcmp(argv[1], "generate")) return kdrt_generate(argc, argv, prog);
  int live = kdrt_live_progress();
  kdrt_ctx *c = start_mpi(&argc, &argv, prog);

  kdrt_options o;
  parse_options(c, argc, argv, &o);
  if (o.help) {
    if (c->rank == 0) kdrt_usage(stdout, prog);
    MPI_Finalize();
    return 0;
  }
  check_outputs(c, &o);
  check_program(c, &o);

  kdrt_ckpt_state ck; // the checkpoint --resume continues, when ck_name is not ""
  char ck_name[64] = "";
  place_and_allocate(c, &o, &ck, ck_name, sizeof ck_name);

  run r;
  memset(&r, 0, sizeof r);
  r.c = c, r.p = prog, r.o = &o;
  r.show = c->rank == 0 && !o.quiet; // rank 0 prints; on a terminal, live
  r.live = r.show && live;
  open_data(&r, &o);
  probe_rows(&r);
  alloc_run(&r);
  init_weights(&r, &ck, ck_name);
  begin_callbacks(&r);

  // Fit and evaluate, watched (watchdog.c).
  kdrt_watchdog_start(c, o.timeout);
  fit(&r);
  kdrt_cb_end(&r.cb, c); // restore_best_weights: before evaluate, as Keras's fit ends
  int status = 0;
  if (!r.diverged[0]) {
    kdrt_progbar pb;
    kdrt_progbar_start(&pb, r.show, r.live, (evaluated(&r)->n + r.B - 1) / r.B);
    kdrt_watch_phase("evaluate", 0, 0);
    evaluate(&r, evaluated(&r), r.eval, &pb);
  } else {
    status = report_divergence(&r);
  }
  status |= write_outputs(&r);
  finish(&r);
  return status;
}

