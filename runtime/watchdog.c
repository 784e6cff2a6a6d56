// watchdog.c: no hung job.
//
// A rank that stops (SIGSTOP, a hung device, a dead link) leaves the other
// ranks waiting in their next collective, spinning, forever. Each rank runs
// a watchdog thread from the start of fit to the end of the run: the main
// thread marks progress (every step, every collective it enters and leaves,
// every phase: training, validation, evaluate, a checkpoint, the weights),
// and when no mark comes for the time limit the watchdog says where this
// rank is waiting (rank, epoch and step, the collective and its mesh axes)
// on stderr and ends the process with status 1; mpirun then ends the job
// ("exited with non-zero status"), the stopped rank included.
//
// The limit: --timeout S when given (0: no watchdog); else a fixed
// generous one until steps are timed (300 s), then 100
// times the median of the last 64 training steps, never under 120 s
// (kdrt_watchdog_limit): long enough for a slow machine, a long
// validation or a checkpoint between two marks, short enough that a hung
// job does not hold its machines for hours.
//
// Which rank stopped: the ranks of one host share a page (POSIX shared
// memory, named by rank 0, unlinked as soon as every rank has it open, so
// nothing is left behind), one slot per rank: its marks, the time of the
// last, whether it waits in a collective, its pid. A watchdog that fires
// names the ranks of its host that made no progress for half the limit
// outside any collective: the stopped or hung one(s), not the waiting
// ones. (Ranks of other hosts are not seen; the message says nothing of
// them.)
//
// The watchdog calls no MPI (the runtime initialises MPI for one thread);
// marks are atomic stores, a few per step and per collective.
#include "kdrt.h"

#include <errno.h> // program_invocation_short_name
#include <fcntl.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FIRST_LIMIT 300.0   // seconds, until steps are timed
#define MIN_LIMIT 120.0     // seconds, the least a timed limit is
#define STEP_FACTOR 100.0   // times the median step
#define NTIMES 64           // steps the median is taken over
#define MIN_TIMED 5         // steps timed before the median is used

// One rank's slot in the host's shared page.
typedef struct {
  atomic_ullong ticks;              // its marks (0: not a rank of this host)
  atomic_llong last_ms;             // CLOCK_MONOTONIC of its last mark
  atomic_int in_coll;               // waiting in a collective
  atomic_int pid;
  atomic_llong epoch, step;
  char pad[64 - 2 * sizeof(long long) - 2 * sizeof(int) - 2 * sizeof(long long)];
} slot;

static struct {
  const kdrt_ctx *c;
  slot *slots;                      // [world], this host's page, or NULL
  slot *me;
  double timeout;                   // --timeout (0: the timed default)
  atomic_ullong ticks;              // bumped by every mark
  atomic_llong epoch, step;         // where training is (from 1; 0: not in an epoch)
  _Atomic(const char *) phase;      // "training", "validation", ...
  _Atomic(const char *) coll;       // the collective waited in, or NULL
  atomic_uint axes;                 // its group of mesh axes
  atomic_llong limit_ms;            // the limit in force
  double times[NTIMES];             // the last step times (main thread only)
  int ntimes;
  pthread_t thread;
  atomic_int running;
  pthread_mutex_t lock;             // with wake: stop ends the watchdog's nap at once
  pthread_cond_t wake;
} wd = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// A mark: this rank's counter, and its slot in the host's page.
static void mark(void) {
  atomic_fetch_add(&wd.ticks, 1);
  if (!wd.me) return;
  atomic_fetch_add(&wd.me->ticks, 1);
  atomic_store(&wd.me->last_ms, (long long)(now_s() * 1000));
}

// Collective: the host's shared page (see the top). NULL when it cannot
// be made; the watchdog then speaks only for its own rank.
static slot *share_slots(const kdrt_ctx *c) {
  char name[64] = "";
  if (c->rank == 0) snprintf(name, sizeof name, "/kdrt-wd-%ld-%lld", (long)getpid(),
                             (long long)(now_s() * 1e6));
  KDRT_MPI(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD));
  size_t bytes = sizeof(slot) * (size_t)c->world;
  int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
  slot *s = NULL;
  if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0) {
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) s = m;
  }
  if (fd >= 0) close(fd);
  KDRT_MPI(MPI_Barrier(MPI_COMM_WORLD)); // every rank has it open (or failed): unlink
  shm_unlink(name);
  int ok = s != NULL, all = 0;
  KDRT_MPI(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (!all && s) munmap(s, bytes), s = NULL;
  return s;
}

// "; rank 2 (pid 1234) made no progress for 61 s outside any collective
// (epoch 1, step 5): it may have stopped or hung" for each rank of this
// host that looks stopped; "" if none does.
static void culprits(char *buf, size_t len, double limit) {
  buf[0] = 0;
  if (!wd.slots) return;
  long long now = (long long)(now_s() * 1000);
  size_t k = 0;
  for (int r = 0; r < wd.c->world && k < len; r++) {
    slot *q = &wd.slots[r];
    if (q == wd.me || !atomic_load(&q->ticks) || atomic_load(&q->in_coll)) continue;
    double idle = (double)(now - atomic_load(&q->last_ms)) / 1000.0;
    if (idle < limit / 2) continue;
    char at[96] = "";
    if (atomic_load(&q->epoch) > 0)
      snprintf(at, sizeof at, " (epoch %lld, step %lld)", atomic_load(&q->epoch),
               atomic_load(&q->step));
    k += (size_t)snprintf(buf + k, len - k, "; rank %d (pid %d) made no progress for %.0f s "
                          "outside any collective%s: it may have stopped or hung", r,
                          atomic_load(&q->pid), idle, at);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double kdrt_watchdog_limit(double timeout, const double *times, int n) {
  if (timeout > 0) return timeout;
  if (n < MIN_TIMED) return FIRST_LIMIT;
  double sorted[NTIMES];
  if (n > NTIMES) n = NTIMES;
  memcpy(sorted, times, sizeof(double) * (size_t)n);
  qsort(sorted, (size_t)n, sizeof(double), cmp_double);
  double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  double limit = STEP_FACTOR * median;
  return limit > MIN_LIMIT ? limit : MIN_LIMIT;
}

// "('data', 'model')"
static void axes_text(char *buf, size_t len, unsigned axes) {
  const kdrt_program *p = wd.c->prog;
  size_t k = (size_t)snprintf(buf, len, "(");
  int n = 0;
  for (int a = 0; a < p->mesh_ndim && k < len; a++)
    if ((axes >> a) & 1) k += (size_t)snprintf(buf + k, len - k, "%s'%s'", n++ ? ", " : "", p->mesh_axes[a]);
  if (k < len) snprintf(buf + k, len - k, "%s)", n == 1 ? "," : "");
}

static void *watch(void *arg) {
  (void)arg;
  unsigned long long seen = atomic_load(&wd.ticks);
  double since = now_s();
  while (atomic_load(&wd.running)) {
    double limit = (double)atomic_load(&wd.limit_ms) / 1000.0;
    double nap = limit / 20 < 1.0 ? limit / 20 : 1.0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(nap * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000), ts.tv_nsec = (long)(ns % 1000000000);
    pthread_mutex_lock(&wd.lock);
    if (atomic_load(&wd.running)) pthread_cond_timedwait(&wd.wake, &wd.lock, &ts);
    pthread_mutex_unlock(&wd.lock);
    unsigned long long t = atomic_load(&wd.ticks);
    double now = now_s();
    if (t != seen) {
      seen = t, since = now;
      continue;
    }
    if (now - since < limit || !atomic_load(&wd.running)) continue;
    // No progress for the limit: say where, and end.
    char where[512], ax[256];
    const char *coll = atomic_load(&wd.coll), *phase = atomic_load(&wd.phase);
    long long epoch = atomic_load(&wd.epoch), step = atomic_load(&wd.step);
    if (coll) {
      axes_text(ax, sizeof ax, atomic_load(&wd.axes));
      snprintf(where, sizeof where, "waiting in %s over %s", coll, ax);
    } else {
      snprintf(where, sizeof where, "not in a collective");
    }
    char at[128] = "", who[1024];
    if (epoch > 0) snprintf(at, sizeof at, "epoch %lld, step %lld, ", epoch, step);
    culprits(who, sizeof who, limit);
    fflush(stdout);
    fprintf(stderr, "%s: rank %d: no progress for %.0f s (%s): %s%s, %s%s; ending the job\n",
            program_invocation_short_name, wd.c->rank, now - since,
            wd.timeout > 0 ? "--timeout" : "the watchdog's limit; --timeout sets it", at,
            phase ? phase : "starting", where,
            who[0] ? who : "; another rank may have stopped or hung");
    fflush(stderr);
    _exit(1);
  }
  return NULL;
}

void kdrt_watchdog_start(const kdrt_ctx *c, double timeout) {
  if (timeout < 0 || atomic_load(&wd.running)) return; // < 0: off
  wd.c = c;
  wd.slots = c->world > 1 ? share_slots(c) : NULL;
  wd.me = wd.slots ? &wd.slots[c->rank] : NULL;
  if (wd.me) atomic_store(&wd.me->pid, (int)getpid());
  mark();
  wd.timeout = timeout;
  wd.ntimes = 0;
  atomic_store(&wd.limit_ms, (long long)(kdrt_watchdog_limit(timeout, NULL, 0) * 1000));
  atomic_store(&wd.running, 1);
  if (pthread_create(&wd.thread, NULL, watch, NULL) != 0) atomic_store(&wd.running, 0);
}

void kdrt_watchdog_stop(void) {
  pthread_mutex_lock(&wd.lock);
  int was = atomic_exchange(&wd.running, 0);
  pthread_cond_signal(&wd.wake);
  pthread_mutex_unlock(&wd.lock);
  if (!was) return;
  pthread_join(wd.thread, NULL);
  if (wd.slots) munmap(wd.slots, sizeof(slot) * (size_t)wd.c->world);
  wd.slots = wd.me = NULL;
}

void kdrt_watch_phase(const char *phase, int64_t epoch, int64_t step) {
  if (phase) {
    atomic_store(&wd.phase, phase);
    atomic_store(&wd.epoch, (long long)epoch);
    atomic_store(&wd.step, (long long)step);
    if (wd.me) atomic_store(&wd.me->epoch, (long long)epoch), atomic_store(&wd.me->step, (long long)step);
  }
  mark();
}

void kdrt_watch_step_time(double seconds) {
  wd.times[wd.ntimes % NTIMES] = seconds;
  wd.ntimes++;
  if (wd.timeout > 0 || wd.ntimes < MIN_TIMED) return;
  double limit = kdrt_watchdog_limit(0, wd.times, wd.ntimes < NTIMES ? wd.ntimes : NTIMES);
  atomic_store(&wd.limit_ms, (long long)(limit * 1000));
}

void kdrt_watch_enter(const char *coll, unsigned axes) {
  atomic_store(&wd.axes, axes);
  atomic_store(&wd.coll, coll);
  if (wd.me) atomic_store(&wd.me->in_coll, 1);
  mark();
}

void kdrt_watch_leave(void) {
  atomic_store(&wd.coll, NULL);
  if (wd.me) atomic_store(&wd.me->in_coll, 0);
  mark();
}
