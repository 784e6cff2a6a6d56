// progress.c: what rank 0 shows while a program trains: Keras's progress
// line (kdrt_progress_line), drawn as a bar redrawn in place on a terminal of
// its own or printed once per epoch elsewhere (kdrt_progbar), and which of the
// two this run does (kdrt_live_progress).
#include "kdrt.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


double kdrt_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static size_t put(char *buf, size_t len, size_t k, const char *fmt, ...) {
  if (k >= len) return k;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(buf + k, len - k, fmt, ap);
  va_end(ap);
  return w > 0 ? k + (size_t)w : k;
}

static size_t put_value(char *buf, size_t len, size_t k, double v) {
  if (isnan(v)) return put(buf, len, k, " nan");
  if (isinf(v)) return put(buf, len, k, v > 0 ? " inf" : " -inf");
  return put(buf, len, k, fabs(v) > 1e-3 ? " %.4f" : " %.4e", v);
}

void kdrt_progress_line(char *buf, size_t len, int64_t cur, int64_t target, int finalize,
                        double elapsed_s, double per_step_s, int nvals,
                        const char *const *names, const double *vals, int color) {
  size_t k = 0;
  if (len) buf[0] = 0;
  if (target > 0) {
    int digits = snprintf(NULL, 0, "%lld", (long long)target);
    k = put(buf, len, k, "%*lld/%lld ", digits, (long long)cur, (long long)target);
    // 20 bars; on a terminal the done part is green, the rest grey.
    int done = (int)(20 * (double)cur / (double)target);
    for (int i = 0; i < 20; i++) {
      if (color && (i == 0 || i == done)) k = put(buf, len, k, i < done ? "\x1b[32m" : "\x1b[37m");
      k = put(buf, len, k, "\xe2\x94\x81"); // ━
    }
    if (color) k = put(buf, len, k, "\x1b[0m");
  } else {
    k = put(buf, len, k, "%7lld/Unknown", (long long)cur);
  }
  if (target > 0 && !finalize) { // ETA
    double eta = per_step_s * (double)(target - cur);
    long long e = (long long)eta;
    if (eta > 3600) k = put(buf, len, k, " %lld:%02lld:%02lld", e / 3600, e % 3600 / 60, e % 60);
    else if (eta > 60) k = put(buf, len, k, " %lld:%02lld", e / 60, e % 60);
    else k = put(buf, len, k, " %llds", e);
  } else {
    k = put(buf, len, k, " %.0fs", elapsed_s);
  }
  if (per_step_s >= 1 || per_step_s == 0) k = put(buf, len, k, " %.0fs/step", per_step_s);
  else if (per_step_s >= 1e-3) k = put(buf, len, k, " %.0fms/step", per_step_s * 1e3);
  else k = put(buf, len, k, " %.0fus/step", per_step_s * 1e6);
  // Keras 3 sorts its logs by name: accuracy, loss, val_accuracy, val_loss.
  int order[2 * KDRT_MAX_LOGS];
  int n = nvals < 2 * KDRT_MAX_LOGS ? nvals : 2 * KDRT_MAX_LOGS;
  for (int i = 0; i < n; i++) {
    int j = i;
    while (j > 0 && strcmp(names[order[j - 1]], names[i]) > 0) order[j] = order[j - 1], j--;
    order[j] = i;
  }
  for (int i = 0; i < n; i++) {
    k = put(buf, len, k, " - %s:", names[order[i]]);
    k = put_value(buf, len, k, vals[order[i]]);
  }
}

// One progress bar, drawn by rank 0: redrawn in place on a terminal, else
// printed once when finished (so logs stay one line per epoch).
void kdrt_progbar_start(kdrt_progbar *b, int show, int live, int64_t target) {
  memset(b, 0, sizeof *b);
  b->show = show, b->live = live, b->target = target;
  b->start = kdrt_now_s();
}

// Columns on screen: UTF-8 continuation bytes and colour escapes take none.
static size_t display_width(const char *s) {
  size_t w = 0;
  for (; *s; s++) {
    if (*s == '\x1b') {
      while (*s && *s != 'm') s++;
      if (!*s) break;
      continue;
    }
    w += ((unsigned char)*s & 0xC0) != 0x80;
  }
  return w;
}

void kdrt_progbar_update(kdrt_progbar *b, int64_t cur, int finalize, int n, const char *const *names,
                           const double *vals) {
  double t = kdrt_now_s();
  // Keras's estimate: the first step (compilation, warm-up) is left out.
  double per = 0;
  if (cur > 1 && b->after_first > 0) per = (t - b->after_first) / (double)(cur - 1);
  else if (cur > 0) per = (t - b->start) / (double)cur;
  if (cur == 1 && b->after_first == 0) b->after_first = t;
  if (!b->show || (!b->live && !finalize)) return;
  if (!finalize && t - b->last_draw < 0.05) return;
  b->last_draw = t;
  char line[8192];
  kdrt_progress_line(line, sizeof line, cur, b->target, finalize, t - b->start, per, n, names,
                     vals, b->live);
  size_t w = display_width(line);
  if (b->live) {
    printf("\r%s", line);
    for (size_t i = w; i < b->prev_width; i++) putchar(' ');
  } else {
    fputs(line, stdout);
  }
  if (finalize) putchar('\n');
  b->prev_width = w;
  fflush(stdout);
}


// Redraw the bar in place only on a terminal of our own: under mpirun the
// ranks' stdout is a pty even when mpirun's output goes to a file, so there
// the bar is printed once per epoch. KDRT_PROGRESS=live or =plain decides.
// (Asked before MPI_Init, which sets the same variables for a singleton.)
int kdrt_live_progress(void) {
  const char *force = getenv("KDRT_PROGRESS");
  if (force && !strcmp(force, "live")) return 1;
  if (force && !strcmp(force, "plain")) return 0;
  return isatty(STDOUT_FILENO) && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") &&
         !getenv("PMIX_RANK");
}
