// test_rt_prefetch: data.c's input thread (issue 22), without MPI.
//
// - kdrt_data_gather: a shuffled order's rows, a rank's slice of them, and
//   file order, each the samples kdrt_data_sample gives;
// - the thread gathers the bytes kdrt_data_gather does, job after job, the
//   two sets of buffers alternating as the fit loop uses them, over many
//   epochs and a last partial batch (checked on every job, so a job run
//   out of order, twice, or not at all is seen);
// - wait with no job, post after post without a wait (each waits for the
//   one before), stop with a job in flight (it finishes first), stop with
//   none, start and stop many times: none hangs (Criterion's timeout);
// - KDRT_PREFETCH=0: no thread.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"

// Two inputs (float [5], int32 ids [3] < 7) and two labels (class ids, dense [2]).
static const kdrt_io ins[2] = {
    {.name = "feat", .dtype = KDRT_F32, .rank = 1, .shape = {5}},
    {.name = "tok", .dtype = KDRT_I32, .rank = 1, .shape = {3}, .num_classes = 7}};
static const kdrt_io labels[2] = {
    {.name = "cls", .dtype = KDRT_F32, .rank = 0, .label_kind = KDRT_LABEL_CLASSID,
     .num_classes = 4},
    {.name = "reg", .dtype = KDRT_F32, .rank = 1, .shape = {2}, .label_kind = KDRT_LABEL_DENSE}};

static kdrt_program prog(void) {
  kdrt_program p;
  memset(&p, 0, sizeof p);
  p.ninputs = 2, p.inputs = ins, p.nlabels = 2, p.labels = labels;
  return p;
}

enum { N = 203, B = 16 }; // the last batch of an epoch: 11 rows

// One set of batch buffers: B rows of every input and label.
typedef struct {
  void *x[2];
  float *y[2];
} set;

static set set_new(void) {
  set s = {{calloc(B * 5, 4), calloc(B * 3, 4)}, {calloc(B, 4), calloc(B * 2, 4)}};
  cr_assert(s.x[0] && s.x[1] && s.y[0] && s.y[1]);
  return s;
}

static void set_free(set *s) {
  for (int k = 0; k < 2; k++) free(s->x[k]), free(s->y[k]);
}

// The set holds samples order[pos0 + i] (order NULL: pos0 + i), i < n, as
// kdrt_data_sample gives them, bit for bit.
static void expect_rows(const kdrt_data *d, const int64_t *order, int64_t pos0, int64_t n,
                        const set *s, const char *what) {
  float f[5], c[1], r[2];
  int32_t t[3];
  void *x[2] = {f, t};
  float *y[2] = {c, r};
  for (int64_t i = 0; i < n; i++) {
    kdrt_data_sample(d, order ? order[pos0 + i] : pos0 + i, x, y);
    cr_assert(!memcmp((float *)s->x[0] + 5 * i, f, sizeof f), "%s: row %lld's feat", what,
              (long long)i);
    cr_assert(!memcmp((int32_t *)s->x[1] + 3 * i, t, sizeof t), "%s: row %lld's tok", what,
              (long long)i);
    cr_assert(!memcmp(s->y[0] + i, c, sizeof c), "%s: row %lld's cls", what, (long long)i);
    cr_assert(!memcmp(s->y[1] + 2 * i, r, sizeof r), "%s: row %lld's reg", what, (long long)i);
  }
}

static int64_t rows_of(int64_t step) { return N - step * B < B ? N - step * B : B; }

Test(gather, orders_and_slices) {
  kdrt_program p = prog();
  kdrt_data d;
  kdrt_data_synthetic(&d, &p, 42, N);
  int64_t order[N];
  kdrt_shuffle(42, 3, order, N);
  set s = set_new();
  kdrt_data_gather(&d, order, 2 * B, B, s.x, s.y);
  expect_rows(&d, order, 2 * B, B, &s, "shuffled");
  kdrt_data_gather(&d, order, 12 * B + 5, 6, s.x, s.y); // a rank's share of the last batch
  expect_rows(&d, order, 12 * B + 5, 6, &s, "slice");
  kdrt_data_gather(&d, NULL, 7, B, s.x, s.y);
  expect_rows(&d, NULL, 7, B, &s, "file order");
  // not the same as another position: the check can fail
  kdrt_data_gather(&d, order, 0, B, s.x, s.y);
  float f0 = ((float *)s.x[0])[0];
  kdrt_data_gather(&d, order, 1, B, s.x, s.y);
  cr_assert(((float *)s.x[0])[0] != f0, "rows 0 and 1 of the order are the same sample");
  set_free(&s);
  kdrt_data_close(&d);
}

// The fit loop's use: batch s in set cur, s + 1 posted into the other one
// before the step, waited for after it; epochs in turn, each reshuffled.
Test(thread, gathers_what_gather_does, .timeout = 60) {
  unsetenv("KDRT_PREFETCH");
  kdrt_program p = prog();
  kdrt_data d;
  kdrt_data_synthetic(&d, &p, 7, N);
  kdrt_prefetch *f = kdrt_prefetch_start();
  cr_assert(f, "no input thread");
  set sets[2] = {set_new(), set_new()};
  int64_t order[N], steps = (N + B - 1) / B;
  int cur = 0, jobs = 0;
  for (int e = 0; e < 20; e++) {
    kdrt_shuffle(7, e, order, N);
    kdrt_data_gather(&d, order, 0, rows_of(0), sets[cur].x, sets[cur].y);
    for (int64_t s = 0; s < steps; s++) {
      if (s + 1 < steps) {
        kdrt_prefetch_post(f, &d, order, (s + 1) * B, rows_of(s + 1), sets[cur ^ 1].x,
                           sets[cur ^ 1].y);
        jobs++;
      }
      expect_rows(&d, order, s * B, rows_of(s), &sets[cur], "the step's set"); // "the step"
      kdrt_prefetch_wait(f);
      if (s + 1 < steps) {
        cur ^= 1;
        expect_rows(&d, order, (s + 1) * B, rows_of(s + 1), &sets[cur], "gathered ahead");
      }
    }
  }
  cr_assert_eq(jobs, 20 * (steps - 1));
  kdrt_prefetch_stop(f);
  set_free(&sets[0]), set_free(&sets[1]);
  kdrt_data_close(&d);
}

Test(thread, waits_and_stops, .timeout = 60) {
  unsetenv("KDRT_PREFETCH");
  kdrt_program p = prog();
  kdrt_data d;
  kdrt_data_synthetic(&d, &p, 9, N);
  set s = set_new();
  for (int i = 0; i < 200; i++) {
    kdrt_prefetch *f = kdrt_prefetch_start();
    cr_assert(f);
    if (i % 4 == 0) kdrt_prefetch_wait(f); // nothing posted: returns at once
    if (i % 4 == 1) {                      // two posts: the second waits for the first
      kdrt_prefetch_post(f, &d, NULL, 0, B, s.x, s.y);
      kdrt_prefetch_post(f, &d, NULL, B, B, s.x, s.y);
      kdrt_prefetch_wait(f);
      expect_rows(&d, NULL, B, B, &s, "the second post");
    }
    if (i % 4 == 2) { // stopped with a job in flight: it finishes first
      kdrt_prefetch_post(f, &d, NULL, 2 * B, B, s.x, s.y);
      kdrt_prefetch_stop(f);
      expect_rows(&d, NULL, 2 * B, B, &s, "the job in flight at stop");
      continue;
    }
    kdrt_prefetch_stop(f);
  }
  set_free(&s);
  kdrt_data_close(&d);
}

Test(thread, off) {
  setenv("KDRT_PREFETCH", "0", 1);
  cr_assert_null(kdrt_prefetch_start());
  kdrt_prefetch_stop(NULL); // nothing to stop
  unsetenv("KDRT_PREFETCH");
}
