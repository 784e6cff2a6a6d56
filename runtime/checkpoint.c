// checkpoint.c: saving and resuming training, --checkpoint-dir/-every and --resume.
//
// A checkpoint is a directory D/ckpt-<step>, <step> the optimizer steps
// done, of one shard file per rank (its blocks of every variable and slot)
// and a MANIFEST (all else a resumed run needs, and each shard's size and
// CRC-32), written by rank 0 last; D/latest names the newest. What the files
// hold: ckpt_format.c.
//
// Every file is written to a dot-named temporary, fsync'd, renamed and the
// directory fsync'd, so no final name ever holds half a file. The order
// makes the MANIFEST the commit point: all shards are durable (a collective
// confirms it) before rank 0 writes it, and D/latest moves only after it.
// A directory without a MANIFEST, or whose checksums fail, is never
// resumed from; --resume takes the newest one that verifies, warning about
// each it skips. After a save rank 0 keeps the new checkpoint and the
// newest complete one before it and deletes every other ckpt-*.
//
// Errors are collective: the rank that meets one says so (naming the file),
// every rank learns of it through an all-reduce and leaves with status 1.
// A rank that dies outright is Open MPI's business: mpirun kills the other
// ranks of the job within about a second (tests/sh/checkpoint.sh checks it).
//
// For tests: KDRT_TEST_PAUSE=rank:step:where:pidfile makes that rank write
// its pid to pidfile and stop (so a test can SIGKILL it) at a chosen point:
// where = train (after that step), save (half-way through its shard file),
// manifest (rank 0, half-way through the MANIFEST).
#include "kdrt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

// ------------------------------------------------------------ messages

static const char *me(void) { return program_invocation_short_name; }

static void warnf(const char *fmt, ...) {
  fflush(stdout);
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: warning: ", me());
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

// The error text of this rank (empty: none), said and agreed on by agree().
static char ck_err[1024];

static void set_err(const char *fmt, ...) {
  if (ck_err[0]) return; // the first error is the one to report
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ck_err, sizeof ck_err, fmt, ap);
  va_end(ap);
}

// Collective: did any rank fail? The first rank that did prints its
// message (the others often met the same one); then every rank leaves
// with status 1.
static void agree(kdrt_ctx *c) {
  int mine = ck_err[0] ? c->rank : c->world, first = c->world;
  KDRT_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (first == c->world) return;
  if (first == c->rank) {
    fflush(stdout);
    if (c->rank > 0) fprintf(stderr, "%s: rank %d: %s\n", me(), c->rank, ck_err);
    else fprintf(stderr, "%s: %s\n", me(), ck_err);
  }
  kdrt_comm_free(c);
  MPI_Finalize();
  exit(1);
}

// ------------------------------------------------------------ test hook

static void test_pause(const kdrt_ctx *c, const char *where) {
  const char *env = getenv("KDRT_TEST_PAUSE");
  if (!env) return;
  int rank;
  long long step;
  char w[16], pidfile[512];
  if (sscanf(env, "%d:%lld:%15[a-z]:%511s", &rank, &step, w, pidfile) != 4) return;
  if (rank != c->rank || step != c->step || strcmp(w, where)) return;
  FILE *f = fopen(pidfile, "w");
  if (f) fprintf(f, "%ld\n", (long)getpid()), fclose(f);
  for (;;) pause();
}

// ------------------------------------------------------------ atomic files

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

static void dir_of(const char *path, char *dir, size_t len) {
  snprintf(dir, len, "%s", path);
  char *s = strrchr(dir, '/');
  if (!s) snprintf(dir, len, ".");
  else if (s == dir) s[1] = 0;
  else *s = 0;
}

int kdrt_ckpt_open(kdrt_ckpt_file *f, const char *path) {
  memset(f, 0, sizeof f[0]);
  snprintf(f->path, sizeof f->path, "%s", path);
  char dir[sizeof f->path];
  dir_of(path, dir, sizeof dir);
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  snprintf(f->tmp, sizeof f->tmp, "%s/.%s.tmp.%ld", dir, base, (long)getpid());
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (f->fd < 0) {
    snprintf(f->err, sizeof f->err, "%s: cannot create: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int kdrt_ckpt_write(kdrt_ckpt_file *f, const void *buf, size_t n) {
  if (f->err[0]) return -1;
  f->crc = kdrt_crc32(f->crc, buf, n);
  f->size += n;
  const char *p = buf;
  while (n) {
    ssize_t w = write(f->fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      snprintf(f->err, sizeof f->err, "%s: cannot write: %s", f->path,
               strerror(w < 0 ? errno : ENOSPC));
      return -1;
    }
    p += w, n -= (size_t)w;
  }
  return 0;
}

int kdrt_ckpt_commit(kdrt_ckpt_file *f) {
  if (!f->err[0] && fsync(f->fd))
    snprintf(f->err, sizeof f->err, "%s: cannot sync: %s", f->path, strerror(errno));
  if (close(f->fd) && !f->err[0])
    snprintf(f->err, sizeof f->err, "%s: cannot write: %s", f->path, strerror(errno));
  f->fd = -1;
  if (!f->err[0] && rename(f->tmp, f->path))
    snprintf(f->err, sizeof f->err, "%s: cannot rename into place: %s", f->path,
             strerror(errno));
  if (f->err[0]) {
    unlink(f->tmp);
    return -1;
  }
  char dir[sizeof f->path];
  dir_of(f->path, dir, sizeof dir);
  if (fsync_dir(dir)) {
    snprintf(f->err, sizeof f->err, "%s: cannot sync directory: %s", dir, strerror(errno));
    return -1;
  }
  return 0;
}

// ------------------------------------------------------------ save

static void join(char *out, size_t len, const char *a, const char *b) {
  if ((size_t)snprintf(out, len, "%s/%s", a, b) >= len) out[len - 1] = 0;
}

static int is_ckpt_name(const char *s, int64_t *step) {
  if (strncmp(s, "ckpt-", 5) || !s[5]) return 0;
  for (const char *p = s + 5; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  errno = 0;
  *step = strtoll(s + 5, NULL, 10);
  return errno == 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static int rm_tree(const char *path) {
  return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

// mkdir -p
static int mkdirs(const char *dir) {
  char p[4096];
  snprintf(p, sizeof p, "%s", dir);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0755) && errno != EEXIST) return -1;
    *s = '/';
  }
  if (mkdir(p, 0755) && errno != EEXIST) return -1;
  struct stat st;
  if (stat(p, &st)) return -1;
  if (!S_ISDIR(st.st_mode)) return errno = ENOTDIR, -1;
  return 0;
}

void kdrt_ckpt_prepare(kdrt_ctx *c, const char *dir) {
  ck_err[0] = 0;
  if (c->rank == 0) {
    if (mkdirs(dir)) {
      set_err("checkpoint directory %s: %s", dir, strerror(errno));
    } else {
      char probe[4200];
      join(probe, sizeof probe, dir, "latest.probe");
      kdrt_ckpt_file f;
      if (kdrt_ckpt_open(&f, probe) || kdrt_ckpt_write(&f, "probe\n", 6) || kdrt_ckpt_commit(&f))
        set_err("checkpoint directory %s is not writable: %s", dir, f.err);
      unlink(probe);
    }
  }
  agree(c);
}

// Checkpoints in dir, newest first: their steps, *n of them (malloc'd).
static int64_t *list_ckpts(const char *dir, int *n) {
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return NULL;
  int cap = 0;
  int64_t *steps = NULL;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t s;
    if (!is_ckpt_name(e->d_name, &s)) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *t = realloc(steps, sizeof(int64_t) * (size_t)cap);
      if (!t) break;
      steps = t;
    }
    steps[(*n)++] = s;
  }
  closedir(d);
  for (int i = 1; i < *n; i++) // insertion sort, descending
    for (int j = i; j > 0 && steps[j - 1] < steps[j]; j--) {
      int64_t t = steps[j];
      steps[j] = steps[j - 1], steps[j - 1] = t;
    }
  return steps;
}

static int has_manifest(const char *dir, int64_t step) {
  char p[4200];
  snprintf(p, sizeof p, "%s/ckpt-%lld/MANIFEST", dir, (long long)step);
  return access(p, F_OK) == 0;
}

// Rank 0, after a save of `step`: keep it and the newest complete one
// before it; delete every other ckpt-* (older ones, and incomplete ones).
static void prune(const char *dir, int64_t step) {
  int n;
  int64_t *steps = list_ckpts(dir, &n);
  int64_t keep = -1;
  for (int i = 0; i < n; i++)
    if (steps[i] < step && has_manifest(dir, steps[i])) {
      keep = steps[i];
      break;
    }
  for (int i = 0; i < n; i++) {
    if (steps[i] == step || steps[i] == keep) continue;
    char p[4200];
    snprintf(p, sizeof p, "%s/ckpt-%lld", dir, (long long)steps[i]);
    if (rm_tree(p)) warnf("cannot delete old checkpoint %s: %s", p, strerror(errno));
  }
  free(steps);
}

typedef struct {
  uint64_t size;
  uint32_t crc;
  int ok;
} shard_info;

static void write_shard(kdrt_ctx *c, const char *cdir, int64_t step, shard_info *out) {
  const kdrt_program *p = c->prog;
  kdrt_ckpt_header h;
  kdrt_ckpt_header_of(c, step, &h);
  size_t hlen;
  char *htext = kdrt_ckpt_header_format(&h, &hlen);
  char name[64], path[4200];
  snprintf(name, sizeof name, "shard-%05d.kdck", c->rank);
  join(path, sizeof path, cdir, name);
  kdrt_ckpt_file f;
  if (!kdrt_ckpt_open(&f, path)) {
    kdrt_ckpt_write(&f, htext, hlen);
    for (int i = 0; i < p->nvars; i++) {
      const kdrt_var *v = &p->vars[i];
      float *wide = kdrt_var_half(v) ? malloc(sizeof *wide * (v->n ? v->n : 1)) : NULL;
      if (kdrt_var_half(v) && !wide) kdrt_fatal(c, "out of memory");
      for (int k = 0; k <= v->nslots; k++) { // issue 23: one kept in 16 bits, as float32
        const float *at = c->params + v->offset + (size_t)k * v->stride;
        if (wide) kdrt_var_get(v, at, wide);
        kdrt_ckpt_write(&f, wide ? wide : at, v->n * sizeof(float));
      }
      free(wide);
      if (i == p->nvars / 2) test_pause(c, "save");
    }
    if (p->nvars == 0) test_pause(c, "save");
    kdrt_ckpt_commit(&f);
  }
  if (f.err[0]) set_err("%s", f.err);
  out->size = f.size, out->crc = f.crc, out->ok = !f.err[0];
  free(htext);
  kdrt_ckpt_header_free(&h);
}

static void write_manifest(kdrt_ctx *c, const char *dir, const char *cdir,
                           const kdrt_ckpt_state *st, const shard_info *info) {
  const kdrt_program *p = c->prog;
  kdrt_ckpt_manifest m;
  memset(&m, 0, sizeof m);
  snprintf(m.model, sizeof m.model, "%s", p->model_name ? p->model_name : "model");
  snprintf(m.optimizer, sizeof m.optimizer, "%s", p->optimizer ? p->optimizer : "");
  m.st = *st;
  m.mesh_ndim = p->mesh_ndim;
  for (int a = 0; a < p->mesh_ndim; a++) {
    m.mesh_shape[a] = p->mesh_shape[a];
    snprintf(m.axes[a], sizeof m.axes[a], "%s", p->mesh_axes[a]);
  }
  m.nfiles = c->world;
  m.files = calloc((size_t)c->world, sizeof m.files[0]);
  if (!m.files) abort();
  for (int r = 0; r < c->world; r++) {
    snprintf(m.files[r].name, sizeof m.files[r].name, "shard-%05d.kdck", r);
    m.files[r].size = info[r].size, m.files[r].crc = info[r].crc;
  }
  size_t len;
  char *text = kdrt_ckpt_manifest_format(&m, &len);
  char path[4200];
  join(path, sizeof path, cdir, "MANIFEST");
  kdrt_ckpt_file f;
  if (!kdrt_ckpt_open(&f, path)) {
    kdrt_ckpt_write(&f, text, len / 2);
    test_pause(c, "manifest");
    kdrt_ckpt_write(&f, text + len / 2, len - len / 2);
    kdrt_ckpt_commit(&f);
  }
  if (f.err[0]) set_err("%s", f.err);
  free(text);
  free(m.files);
  if (ck_err[0]) return;
  // D/latest names the newest complete checkpoint.
  char line[64];
  int n = snprintf(line, sizeof line, "ckpt-%lld\n", (long long)st->step);
  join(path, sizeof path, dir, "latest");
  if (kdrt_ckpt_open(&f, path) || kdrt_ckpt_write(&f, line, (size_t)n) || kdrt_ckpt_commit(&f))
    set_err("%s", f.err);
}

void kdrt_ckpt_save(kdrt_ctx *c, const char *dir, const kdrt_ckpt_state *st) {
  ck_err[0] = 0;
  char cdir[4200];
  snprintf(cdir, sizeof cdir, "%s/ckpt-%lld", dir, (long long)st->step);
  // 0. never a checkpoint of weights that are not finite: it would rotate
  //    out the last good one (kdrt.c stops a diverging run before this).
  int bad = kdrt_weights_finite(c);
  if (bad >= 0 && c->rank == 0)
    set_err("%s: not saved: the weights of '%s' are not finite (training diverged)", cdir,
            c->prog->vars[bad].path);
  agree(c);
  // 1. rank 0 makes a fresh directory (a run resumed from an older
  //    checkpoint may find the remains of an interrupted save here).
  if (c->rank == 0) {
    struct stat sb;
    if (!lstat(cdir, &sb) && rm_tree(cdir)) set_err("%s: cannot clear: %s", cdir, strerror(errno));
    else if (mkdir(cdir, 0755) || fsync_dir(dir)) set_err("%s: cannot create: %s", cdir, strerror(errno));
  }
  agree(c);
  // 2. every rank writes its shard file; all learn every file's size and CRC.
  shard_info mine, *all = calloc((size_t)c->world, sizeof *all);
  if (!all) kdrt_fatal(c, "out of memory");
  write_shard(c, cdir, st->step, &mine);
  KDRT_MPI(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                         MPI_COMM_WORLD));
  agree(c);
  // 3. all shards are durable: rank 0 commits the checkpoint, then prunes.
  if (c->rank == 0) {
    write_manifest(c, dir, cdir, st, all);
    if (!ck_err[0]) prune(dir, st->step);
  }
  free(all);
  agree(c);
}

int kdrt_ckpt_due(int64_t every, const kdrt_ckpt_state *st) {
  return every ? st->step % every == 0 : st->pos == st->steps;
}

void kdrt_ckpt_maybe_save(kdrt_ctx *c, const char *dir, int64_t every,
                          const kdrt_ckpt_state *st) {
  test_pause(c, "train");
  if (kdrt_ckpt_due(every, st)) kdrt_ckpt_save(c, dir, st);
}

// ------------------------------------------------------------ resume

// Read a whole file (plus a terminating zero). NULL with err set.
static char *read_all(const char *path, size_t *len, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return kdrt_errf(err, errlen, "%s", strerror(errno)), NULL;
  struct stat sb;
  if (fstat(fd, &sb)) return close(fd), kdrt_errf(err, errlen, "%s", strerror(errno)), NULL;
  char *buf = malloc((size_t)sb.st_size + 1);
  if (!buf) return close(fd), kdrt_errf(err, errlen, "out of memory"), NULL;
  size_t got = 0;
  while (got < (size_t)sb.st_size) {
    ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      kdrt_errf(err, errlen, "%s", r < 0 ? strerror(errno) : "file shrank while reading");
      free(buf), close(fd);
      return NULL;
    }
    got += (size_t)r;
  }
  close(fd);
  buf[got] = 0;
  *len = got;
  return buf;
}

// Check one shard file's size and CRC against the manifest, streaming.
static int verify_file(const char *path, uint64_t size, uint32_t crc, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return kdrt_errf(err, errlen, "%s: %s", path, strerror(errno));
  static char buf[1 << 20];
  uint64_t n = 0;
  uint32_t c = 0;
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      close(fd);
      return kdrt_errf(err, errlen, "%s: %s", path, strerror(errno));
    }
    if (r == 0) break;
    c = kdrt_crc32(c, buf, (size_t)r);
    n += (uint64_t)r;
  }
  close(fd);
  if (n != size)
    return kdrt_errf(err, errlen, "%s: %llu bytes, the MANIFEST says %llu", path,
               (unsigned long long)n, (unsigned long long)size);
  if (c != crc)
    return kdrt_errf(err, errlen, "%s: checksum %08x, the MANIFEST says %08x", path, c, crc);
  return 0;
}

static int read_manifest(const char *cdir, kdrt_ckpt_manifest *m, char *err, size_t errlen) {
  char path[4200], e[512];
  join(path, sizeof path, cdir, "MANIFEST");
  size_t len;
  char *text = read_all(path, &len, e, sizeof e);
  if (!text) return kdrt_errf(err, errlen, "%s: %s", path, e);
  int rc = kdrt_ckpt_manifest_parse(text, len, m, e, sizeof e);
  free(text);
  if (rc) return kdrt_errf(err, errlen, "%s: %s", path, e);
  return 0;
}

int kdrt_ckpt_find(kdrt_ctx *c, const char *dir, kdrt_ckpt_state *st, char *name,
                   size_t namelen) {
  ck_err[0] = 0;
  memset(st, 0, sizeof st[0]);
  int n = 0;
  int64_t *steps = NULL;
  if (c->rank == 0) steps = list_ckpts(dir, &n);
  KDRT_MPI(MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (n == 0) return -1;
  if (c->rank != 0 && !(steps = malloc(sizeof(int64_t) * (size_t)n))) kdrt_fatal(c, "out of memory");
  KDRT_MPI(MPI_Bcast(steps, n, MPI_INT64_T, 0, MPI_COMM_WORLD));
  int found = -1;
  for (int i = 0; i < n && found < 0; i++) {
    char cdir[4200], err[1024] = "";
    snprintf(cdir, sizeof cdir, "%s/ckpt-%lld", dir, (long long)steps[i]);
    kdrt_ckpt_manifest m;
    int bad_here = 0, bad_any = 0;
    // Every rank reads the MANIFEST; shard files are checked by rank i % world.
    if (!has_manifest(dir, steps[i])) {
      if (c->rank == 0) warnf("skipping %s: no MANIFEST (an interrupted save)", cdir);
      continue;
    }
    if (read_manifest(cdir, &m, err, sizeof err)) {
      if (c->rank == 0) warnf("skipping %s: %s", cdir, err);
      continue;
    }
    if (m.st.step != steps[i]) {
      if (c->rank == 0) warnf("skipping %s: its MANIFEST says step %lld", cdir, (long long)m.st.step);
      kdrt_ckpt_manifest_free(&m);
      continue;
    }
    for (int f = c->rank; f < m.nfiles && !bad_here; f += c->world) {
      char path[4400];
      join(path, sizeof path, cdir, m.files[f].name);
      bad_here = verify_file(path, m.files[f].size, m.files[f].crc, err, sizeof err) != 0;
    }
    if (bad_here) warnf("skipping %s: %s", cdir, err);
    KDRT_MPI(MPI_Allreduce(&bad_here, &bad_any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (bad_any) {
      kdrt_ckpt_manifest_free(&m);
      continue;
    }
    // The history is per log: the checkpoint's logs must be this program's.
    int same = m.st.nlogs == c->prog->nlogs;
    for (int k = 0; same && k < m.st.nlogs; k++)
      same = !strcmp(m.st.log_names[k], c->prog->log_names[k]);
    if (!same) {
      set_err("%s: its logs (%d, the first '%s') are not this program's (%d, the first '%s'); "
              "resume with the program that wrote it", cdir, m.st.nlogs,
              m.st.nlogs ? m.st.log_names[0] : "", c->prog->nlogs,
              c->prog->nlogs ? c->prog->log_names[0] : "");
      kdrt_ckpt_manifest_free(&m);
      break;
    }
    // Another optimizer's slots would be read as this one's (issue 11: Adam's
    // and Adamax's are two of the same shape).
    if (m.optimizer[0] && c->prog->optimizer && strcmp(m.optimizer, c->prog->optimizer)) {
      set_err("%s: it was trained with %s, this program trains with %s (another optimizer's "
              "state); resume with the program that wrote it", cdir, m.optimizer,
              c->prog->optimizer);
      kdrt_ckpt_manifest_free(&m);
      break;
    }
    // issue 23: a loss scale's state is resumed by a program with one only
    if (m.st.has_loss_scale != (c->prog->loss_scale != 0)) {
      set_err("%s: it was trained %s a loss scale (Keras's LossScaleOptimizer), this program "
              "trains %s one; resume with the program that wrote it", cdir,
              m.st.has_loss_scale ? "with" : "without", m.st.has_loss_scale ? "without" : "with");
      kdrt_ckpt_manifest_free(&m);
      break;
    }
    found = i;
    *st = m.st;
    // st's arrays are m's, now owned by the caller.
    free(m.files);
    snprintf(name, namelen, "ckpt-%lld", (long long)steps[i]);
  }
  if (found < 0)
    set_err("no usable checkpoint in %s: all %d are incomplete or corrupt (see the warnings)",
            dir, n);
  free(steps);
  agree(c);
  return 0;
}

// One saved shard file opened for reading, its header parsed on first use.
typedef struct {
  int fd;
  int parsed;
  kdrt_ckpt_header h;
} shard_in;

static int open_shard(shard_in *s, const char *path, char *err, size_t errlen) {
  if (s->parsed) return 0;
  char e[512];
  s->fd = open(path, O_RDONLY);
  if (s->fd < 0) return kdrt_errf(err, errlen, "%s: %s", path, strerror(errno));
  char first[128];
  ssize_t r = pread(s->fd, first, sizeof first - 1, 0);
  if (r > 0) first[r] = 0;
  int64_t hl = r > 0 ? kdrt_ckpt_header_bytes(first) : -1;
  if (hl < 0) return kdrt_errf(err, errlen, "%s: not a kdcc checkpoint shard", path);
  char *text = malloc(hl + 1);
  if (!text) return kdrt_errf(err, errlen, "out of memory");
  r = pread(s->fd, text, hl, 0);
  if (r != (ssize_t)hl) return free(text), kdrt_errf(err, errlen, "%s: truncated header", path);
  text[hl] = 0;
  int rc = kdrt_ckpt_header_parse(text, hl, &s->h, e, sizeof e);
  free(text);
  if (rc) return kdrt_errf(err, errlen, "%s: %s", path, e);
  s->parsed = 1;
  return 0;
}

// The floats of one variable's (or slot's) block in a shard.
static uint64_t local_count(const kdrt_ckpt_var *v) {
  uint64_t n = 1;
  for (int d = 0; d < v->layout.rank; d++) n *= (uint64_t)v->local[d];
  return n;
}

static const kdrt_ckpt_var *find_var(const kdrt_ckpt_header *h, const char *path) {
  for (int i = 0; i < h->nvars; i++)
    if (!strcmp(h->vars[i].path, path)) return &h->vars[i];
  return NULL;
}

static void fmt_dims(char *buf, size_t len, int rank, const int64_t *v) {
  size_t k = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < rank && k < len; d++)
    k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)v[d]);
  if (k < len) snprintf(buf + k, len - k, "]");
}

// Does the saved variable sv fit the program's v? Else a message.
static int same_var(const kdrt_var *v, const kdrt_ckpt_var *sv, char *err, size_t errlen) {
  int same = sv->layout.rank == v->layout.rank && sv->nslots == v->nslots;
  for (int d = 0; same && d < v->layout.rank; d++) same = sv->layout.gshape[d] == v->layout.gshape[d];
  if (same) return 1;
  char a[128], b[128];
  fmt_dims(a, sizeof a, sv->layout.rank, sv->layout.gshape);
  fmt_dims(b, sizeof b, v->layout.rank, v->layout.gshape);
  // The same shape with other slots: most likely a layer frozen (trainable
  // false: no slots) in one program and trained in the other.
  int frozen = !strcmp(a, b) && (!sv->nslots || !v->nslots);
  snprintf(err, errlen,
           "checkpoint is of another model: variable '%s' is %s with %d optimizer slot%s there, "
           "%s with %d here%s", v->path, a, sv->nslots, sv->nslots == 1 ? "" : "s", b, v->nslots,
           frozen ? " (is its layer frozen, trainable false, in one program and trained in the "
                    "other?)" : "");
  return 0;
}

static void load_all(kdrt_ctx *c, const char *cdir, const kdrt_ckpt_manifest *m) {
  const kdrt_program *p = c->prog;
  char err[8192] = "";
  shard_in *in = calloc((size_t)m->nfiles, sizeof *in);
  char (*paths)[4400] = calloc((size_t)m->nfiles, sizeof *paths);
  int64_t (*seen)[KDRT_MAX_RANK] = calloc((size_t)m->nfiles, sizeof *seen);
  if (!in || !paths || !seen) kdrt_fatal(c, "out of memory");
  for (int f = 0; f < m->nfiles; f++) join(paths[f], sizeof paths[f], cdir, m->files[f].name), in[f].fd = -1;
  // Files in the order to try: this rank's own first (same mesh: all from it).
  int own = c->rank < m->nfiles ? c->rank : 0;
  if (open_shard(&in[own], paths[own], err, sizeof err)) goto done;
  // Every variable of the checkpoint must be one of the program's, and back.
  for (int i = 0; i < in[own].h.nvars; i++) {
    int k = 0;
    while (k < p->nvars && strcmp(p->vars[k].path, in[own].h.vars[i].path)) k++;
    if (k == p->nvars) {
      snprintf(err, sizeof err, "%s: checkpoint is of another model: it has variable '%s', "
               "which this program lacks", paths[own], in[own].h.vars[i].path);
      goto done;
    }
  }
  float *buf = NULL;
  size_t bufcap = 0;
  for (int i = 0; i < p->nvars && !err[0]; i++) {
    const kdrt_var *v = &p->vars[i];
    const kdrt_layout *l = &v->layout;
    int64_t start[KDRT_MAX_RANK], ext[KDRT_MAX_RANK];
    for (int d = 0; d < l->rank; d++) {
      ext[d] = l->axis[d] >= 0 ? l->gshape[d] / p->mesh_shape[l->axis[d]] : l->gshape[d];
      start[d] = l->axis[d] >= 0 ? c->coord[l->axis[d]] * ext[d] : 0;
    }
    int64_t covered = 0;
    // issue 23: one kept in 16 bits read as float32 (its values and each slot's), then stored
    size_t all = (size_t)(v->nslots + 1) * (v->n ? v->n : 1);
    float *wide = kdrt_var_half(v) ? malloc(sizeof *wide * all) : NULL;
    if (kdrt_var_half(v) && !wide) kdrt_fatal(c, "out of memory");
    for (int k = 0; wide && k <= v->nslots; k++)
      kdrt_var_get(v, c->params + v->offset + (size_t)k * v->stride, wide + (size_t)k * v->n);
    // Distinct saved blocks (replicas are skipped: the first file holding a
    // block gives it) that meet this rank's block.
    int nseen = 0;
    for (int t = 0; t < m->nfiles && covered < (int64_t)v->n && !err[0]; t++) {
      int f = t == 0 ? own : (t <= own ? t - 1 : t);
      if (open_shard(&in[f], paths[f], err, sizeof err)) break;
      const kdrt_ckpt_var *sv = find_var(&in[f].h, v->path);
      char e[512];
      if (!sv) {
        snprintf(err, sizeof err, "%s: checkpoint is of another model: it lacks variable '%s'",
                 paths[f], v->path);
        break;
      }
      if (!same_var(v, sv, e, sizeof e)) {
        snprintf(err, sizeof err, "%s: %s", paths[f], e);
        break;
      }
      int dup = 0;
      for (int s = 0; s < nseen && !dup; s++) dup = !memcmp(seen[s], sv->start, sizeof seen[s]);
      if (dup) continue;
      memcpy(seen[nseen++], sv->start, sizeof seen[0]);
      int meets = 1;
      for (int d = 0; d < l->rank && meets; d++)
        meets = sv->start[d] < start[d] + ext[d] && start[d] < sv->start[d] + sv->local[d];
      if (!meets) continue;
      size_t sn = (size_t)local_count(sv);
      if (sn > bufcap) {
        free(buf);
        bufcap = sn;
        buf = malloc(sn * sizeof(float));
        if (!buf) kdrt_fatal(c, "out of memory");
      }
      int64_t got = 0;
      for (int k = 0; k <= v->nslots; k++) {
        off_t at = (off_t)(sv->offset + (uint64_t)k * sn * sizeof(float));
        if (pread(in[f].fd, buf, sn * sizeof(float), at) != (ssize_t)(sn * sizeof(float))) {
          snprintf(err, sizeof err, "%s: truncated data of variable '%s'", paths[f], v->path);
          break;
        }
        got = kdrt_ckpt_copy_overlap(wide ? wide + (size_t)k * v->n
                                          : c->params + v->offset + (size_t)k * v->stride,
                                     start, ext, buf, sv->start, sv->local, l->rank);
      }
      covered += got;
    }
    if (!err[0] && covered != (int64_t)v->n)
      snprintf(err, sizeof err, "%s: the shard files cover %lld of the %zu values of '%s' this "
               "rank needs", cdir, (long long)covered, v->n, v->path);
    for (int k = 0; wide && !err[0] && k <= v->nslots; k++)
      kdrt_var_put(v, c->params + v->offset + (size_t)k * v->stride, wide + (size_t)k * v->n);
    free(wide);
  }
  free(buf);
done:
  if (err[0]) set_err("%s", err);
  for (int f = 0; f < m->nfiles; f++) {
    if (in[f].fd >= 0) close(in[f].fd);
    kdrt_ckpt_header_free(&in[f].h);
  }
  free(in);
  free(paths);
  free(seen);
}

void kdrt_ckpt_load(kdrt_ctx *c, const char *dir, const char *name) {
  ck_err[0] = 0;
  char cdir[4200], err[1024];
  join(cdir, sizeof cdir, dir, name);
  kdrt_ckpt_manifest m;
  if (read_manifest(cdir, &m, err, sizeof err)) {
    set_err("%s", err);
  } else {
    const char *model = c->prog->model_name ? c->prog->model_name : "model";
    if (strcmp(m.model, model))
      set_err("%s/MANIFEST: checkpoint is of model '%s', this program trains '%s'", cdir,
              m.model, model);
    else
      load_all(c, cdir, &m);
    kdrt_ckpt_manifest_free(&m);
  }
  agree(c);
}
