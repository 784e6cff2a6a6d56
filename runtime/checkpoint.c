// checkpoint.c: saving and resuming training, --checkpoint-dir/-every and --resume.
//
// A checkpoint is a directory D/ckpt-<step>, <step> the optimizer steps done:
//
//   D/ckpt-40/shard-00000.kdck ... shard-<world-1>.kdck   one per rank
//   D/ckpt-40/MANIFEST                                    rank 0, written last
//   D/latest                                              "ckpt-40\n"
//
// A shard file is a text header, zero padding to a 64-byte boundary, then
// raw little-endian float32: for each variable its local block, then each
// optimizer slot's (same shape), exactly as they lie in the parameter blob.
//
//   KDCKPT-SHARD 1 header 000000000512         (header bytes = data start)
//   model sequential
//   step 40
//   mesh 2 data=2 model=4
//   rank 3 of 8 coord 0 3
//   vars 3
//   var sequential/d1/kernel slots 2 rank 2 shape 784 200 axes -1 1 start 0 150
//       local 784 50 at 000000000512          (one line per variable)
//   end
//
// `start` is the block's global offset per dimension, so a reader on any
// mesh can cut out the part it needs (resharding). The MANIFEST holds
// everything else a resumed run needs, doubles in C99 hex (%a) so they come
// back bit for bit, and a CRC-32 (zlib's polynomial) and size per shard file:
//
//   KDCKPT-MANIFEST 2
//   model sequential
//   optimizer Adam                             (older manifests lack it)
//   step 40
//   seed 1337
//   mesh 2 data=2 model=4
//   epoch 4 pos 8 steps 8 samples 128 batch 16 (epoch in progress from 0, its steps done;
//                                              older manifests lack the batch)
//   logs 2 loss accuracy                      (the program's log names, in its order)
//   sums 0x1.06p+3 0x1.2p-1                   (each log's running sum over that epoch, each
//                                              step's value times its rows / batch)
//   history 4                                  (finished epochs, one 'h' line each:
//   h 0x1.0ap+0 0x1.9p-4 0x0p+0 0x0p+0          every log's mean, then every val_ log's)
//   steploss 40                                (every step's loss so far, 8 a line)
//   0x1.1p+0 0x1.08p+0 ...
//   lossscale 0x1p+14 count 3 iterations 38    (issue 23, a loss-scaled program's only:
//   stepscale 40                               its scale, finite steps since it moved and
//   0x1p+15 0x1p+15 ...                        the optimizer's iterations; every step's scale)
//   files 8
//   file shard-00000.kdck 493312 9f1e22c0
//   crc 1c291d57                               (of every byte before this line)
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

#define SHARD_MAGIC "KDCKPT-SHARD 1"
#define MANIFEST_MAGIC "KDCKPT-MANIFEST 2"

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

// ------------------------------------------------------------ CRC-32 (zlib)

uint32_t kdrt_crc32(uint32_t crc, const void *buf, size_t n) {
  const unsigned char *p = buf;
  while (n) { // zlib takes 32-bit lengths
    uInt k = n > (1u << 30) ? 1u << 30 : (uInt)n;
    crc = (uint32_t)crc32(crc, p, k);
    p += k, n -= k;
  }
  return crc;
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

// ------------------------------------------------------------ text headers

// Names go into the headers as one token: bytes <= ' ' and '%' as %XX.
static void enc(char *out, size_t len, const char *s) {
  size_t k = 0;
  for (; *s && k + 4 < len; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch <= ' ' || ch == '%' || ch == 0x7f) k += (size_t)snprintf(out + k, len - k, "%%%02X", ch);
    else out[k++] = (char)ch;
  }
  out[k] = 0;
}

static void dec(char *s) {
  char *o = s;
  for (; *s; s++) {
    unsigned v;
    if (*s == '%' && sscanf(s + 1, "%2x", &v) == 1) *o++ = (char)v, s += 2;
    else *o++ = *s;
  }
  *o = 0;
}

// A growable text buffer.
typedef struct {
  char *s;
  size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (b->n + (size_t)w + 1 > b->cap) {
    size_t cap = (b->cap ? b->cap * 2 : 1024) + (size_t)w;
    char *s = realloc(b->s, cap);
    if (!s) abort();
    b->s = s, b->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
  va_end(ap);
  b->n += (size_t)w;
}

// Split the next line of text[*pos..len) into at most max tokens (in place:
// text is modified). Returns the token count, -1 at the end.
static int next_line(char *text, size_t len, size_t *pos, char **tok, int max) {
  if (*pos >= len) return -1;
  char *line = text + *pos;
  char *nl = memchr(line, '\n', len - *pos);
  size_t ll = nl ? (size_t)(nl - line) : len - *pos;
  line[ll] = 0; // the newline, or the byte past a final unterminated line (text has room)
  *pos += ll + 1;
  int n = 0;
  char *save = NULL;
  for (char *t = strtok_r(line, " \t\r", &save); t; t = strtok_r(NULL, " \t\r", &save)) {
    if (n == max) return max + 1;
    tok[n++] = t;
  }
  return n;
}

static int to_i64(const char *s, int64_t *v) {
  char *e;
  errno = 0;
  long long x = strtoll(s, &e, 10);
  if (errno || e == s || *e) return -1;
  *v = x;
  return 0;
}

static int to_f64(const char *s, double *v) {
  char *e;
  *v = strtod(s, &e);
  return e == s || *e ? -1 : 0;
}

// "mesh 2 data=2 model=4" from / into the mesh fields.
static void fmt_mesh(sbuf *b, int nd, const int *shape, char (*axes)[64]) {
  sb_printf(b, "mesh %d", nd);
  for (int i = 0; i < nd; i++) {
    char e[200];
    enc(e, sizeof e, axes[i]);
    sb_printf(b, " %s=%d", e, shape[i]);
  }
  sb_printf(b, "\n");
}

static int parse_mesh(char **tok, int n, int *nd, int *shape, char (*axes)[64]) {
  int64_t v;
  if (n < 2 || to_i64(tok[1], &v) || v < 1 || v > KDRT_MAX_AXES || n != 2 + v) return -1;
  *nd = (int)v;
  for (int i = 0; i < *nd; i++) {
    char *eq = strrchr(tok[2 + i], '=');
    if (!eq || to_i64(eq + 1, &v) || v < 1 || (size_t)(eq - tok[2 + i]) >= 64) return -1;
    *eq = 0;
    snprintf(axes[i], 64, "%s", tok[2 + i]);
    dec(axes[i]);
    shape[i] = (int)v;
  }
  return 0;
}

// The header of this rank's shard file for program p at coords coord.
void kdrt_ckpt_header_of(const kdrt_ctx *c, int64_t step, kdrt_ckpt_header *h) {
  const kdrt_program *p = c->prog;
  memset(h, 0, sizeof h[0]);
  snprintf(h->model, sizeof h->model, "%s", p->model_name ? p->model_name : "model");
  h->step = step;
  h->mesh_ndim = p->mesh_ndim;
  h->world = 1;
  for (int a = 0; a < p->mesh_ndim; a++) {
    h->mesh_shape[a] = p->mesh_shape[a];
    snprintf(h->axes[a], sizeof h->axes[a], "%s", p->mesh_axes[a]);
    h->coord[a] = c->coord[a];
    h->world *= p->mesh_shape[a];
  }
  h->rank = c->rank;
  h->nvars = p->nvars;
  h->vars = calloc((size_t)(p->nvars ? p->nvars : 1), sizeof h->vars[0]);
  if (!h->vars) abort();
  uint64_t at = 0;
  for (int i = 0; i < p->nvars; i++) {
    const kdrt_var *v = &p->vars[i];
    kdrt_ckpt_var *hv = &h->vars[i];
    snprintf(hv->path, sizeof hv->path, "%s", v->path);
    hv->nslots = v->nslots;
    hv->layout = v->layout;
    for (int d = 0; d < v->layout.rank; d++) {
      int ax = v->layout.axis[d];
      hv->local[d] = ax >= 0 ? v->layout.gshape[d] / p->mesh_shape[ax] : v->layout.gshape[d];
      hv->start[d] = ax >= 0 ? c->coord[ax] * hv->local[d] : 0;
    }
    hv->offset = at; // relative to the data start until formatted
    at += (uint64_t)(1 + v->nslots) * v->n * sizeof(float);
  }
  h->data_bytes = at;
}

static uint64_t local_count(const kdrt_ckpt_var *v) {
  uint64_t n = 1;
  for (int d = 0; d < v->layout.rank; d++) n *= (uint64_t)v->local[d];
  return n;
}

char *kdrt_ckpt_header_format(kdrt_ckpt_header *h, size_t *len) {
  // Offsets are printed at a fixed width, so the header's length does not
  // depend on them: format once to measure, once for real.
  sbuf b = {0};
  for (int pass = 0; pass < 2; pass++) {
    b.n = 0;
    char e[1024];
    sb_printf(&b, "%s header %012llu\n", SHARD_MAGIC, (unsigned long long)h->data_offset);
    enc(e, sizeof e, h->model);
    sb_printf(&b, "model %s\nstep %lld\n", e, (long long)h->step);
    fmt_mesh(&b, h->mesh_ndim, h->mesh_shape, h->axes);
    sb_printf(&b, "rank %d of %d coord", h->rank, h->world);
    for (int a = 0; a < h->mesh_ndim; a++) sb_printf(&b, " %d", h->coord[a]);
    sb_printf(&b, "\nvars %d\n", h->nvars);
    for (int i = 0; i < h->nvars; i++) {
      const kdrt_ckpt_var *v = &h->vars[i];
      enc(e, sizeof e, v->path);
      sb_printf(&b, "var %s slots %d rank %d shape", e, v->nslots, v->layout.rank);
      for (int d = 0; d < v->layout.rank; d++) sb_printf(&b, " %lld", (long long)v->layout.gshape[d]);
      sb_printf(&b, " axes");
      for (int d = 0; d < v->layout.rank; d++) sb_printf(&b, " %d", v->layout.axis[d]);
      sb_printf(&b, " start");
      for (int d = 0; d < v->layout.rank; d++) sb_printf(&b, " %lld", (long long)v->start[d]);
      sb_printf(&b, " local");
      for (int d = 0; d < v->layout.rank; d++) sb_printf(&b, " %lld", (long long)v->local[d]);
      sb_printf(&b, " at %012llu\n",
                (unsigned long long)(pass ? v->offset : 0));
    }
    sb_printf(&b, "end\n");
    if (pass == 0) {
      uint64_t start = (b.n + 63) / 64 * 64;
      if (h->data_offset != start) // offsets were relative: make them absolute once
        for (int i = 0; i < h->nvars; i++) h->vars[i].offset += start - h->data_offset;
      h->data_offset = start;
    }
  }
  while (b.n < h->data_offset) sb_printf(&b, "%c", 0); // zero padding up to the data
  *len = b.n;
  return b.s;
}

int kdrt_ckpt_header_parse(char *text, size_t len, kdrt_ckpt_header *h, char *err,
                           size_t errlen) {
  memset(h, 0, sizeof h[0]);
  size_t pos = 0;
  char *t[64];
  int n;
  int64_t v;
  // KDCKPT-SHARD 1 header N
  n = next_line(text, len, &pos, t, 64);
  if (n != 4 || strcmp(t[0], "KDCKPT-SHARD") || strcmp(t[2], "header"))
    return kdrt_errf(err, errlen, "not a kdcc checkpoint shard (no KDCKPT-SHARD header)");
  if (strcmp(t[1], "1")) return kdrt_errf(err, errlen, "shard format version %s is not supported", t[1]);
  if (to_i64(t[3], &v) || v < 1) return kdrt_errf(err, errlen, "bad header length '%s'", t[3]);
  h->data_offset = (uint64_t)v;
  int seen_end = 0, nv = 0;
  while (!seen_end && (n = next_line(text, len, &pos, t, 64)) >= 0) {
    if (n == 0) continue;
    if (n > 64) return kdrt_errf(err, errlen, "header line too long");
    if (!strcmp(t[0], "model") && n == 2) {
      snprintf(h->model, sizeof h->model, "%s", t[1]);
      dec(h->model);
    } else if (!strcmp(t[0], "step") && n == 2 && !to_i64(t[1], &v) && v >= 0) {
      h->step = v;
    } else if (!strcmp(t[0], "mesh")) {
      if (parse_mesh(t, n, &h->mesh_ndim, h->mesh_shape, h->axes))
        return kdrt_errf(err, errlen, "bad 'mesh' line");
    } else if (!strcmp(t[0], "rank")) {
      int64_t r, w;
      if (n != 5 + h->mesh_ndim || strcmp(t[2], "of") || strcmp(t[4], "coord") ||
          to_i64(t[1], &r) || to_i64(t[3], &w) || r < 0 || r >= w)
        return kdrt_errf(err, errlen, "bad 'rank' line");
      h->rank = (int)r, h->world = (int)w;
      for (int a = 0; a < h->mesh_ndim; a++) {
        if (to_i64(t[5 + a], &v) || v < 0 || v >= h->mesh_shape[a])
          return kdrt_errf(err, errlen, "bad 'rank' line");
        h->coord[a] = (int)v;
      }
    } else if (!strcmp(t[0], "vars") && n == 2 && !to_i64(t[1], &v) && v >= 0 && v < 1000000) {
      h->nvars = (int)v;
      h->vars = calloc((size_t)(v ? v : 1), sizeof h->vars[0]);
      if (!h->vars) return kdrt_errf(err, errlen, "out of memory");
    } else if (!strcmp(t[0], "var")) {
      if (nv >= h->nvars) return kdrt_errf(err, errlen, "more 'var' lines than 'vars' says");
      kdrt_ckpt_var *hv = &h->vars[nv];
      int64_t r = -1, s = -1;
      if (n < 8 || strcmp(t[2], "slots") || to_i64(t[3], &s) || s < 0 || s > 8 ||
          strcmp(t[4], "rank") || to_i64(t[5], &r) || r < 0 || r > KDRT_MAX_RANK ||
          n != 6 + 4 * (1 + (int)r) + 2)
        return kdrt_errf(err, errlen, "bad 'var' line %d", nv + 1);
      snprintf(hv->path, sizeof hv->path, "%s", t[1]);
      dec(hv->path);
      hv->nslots = (int)s;
      hv->layout.rank = (int)r;
      int k = 6;
      static const char *const key[4] = {"shape", "axes", "start", "local"};
      for (int part = 0; part < 4; part++) {
        if (strcmp(t[k++], key[part])) return kdrt_errf(err, errlen, "bad 'var' line %d", nv + 1);
        for (int d = 0; d < r; d++, k++) {
          if (to_i64(t[k], &v)) return kdrt_errf(err, errlen, "bad 'var' line %d", nv + 1);
          if (part == 0) hv->layout.gshape[d] = v;
          if (part == 1) hv->layout.axis[d] = (int8_t)v;
          if (part == 2) hv->start[d] = v;
          if (part == 3) hv->local[d] = v;
        }
      }
      if (strcmp(t[k], "at") || to_i64(t[k + 1], &v) || v < (int64_t)h->data_offset)
        return kdrt_errf(err, errlen, "bad 'var' line %d", nv + 1);
      hv->offset = (uint64_t)v;
      for (int d = 0; d < r; d++)
        if (hv->local[d] < 1 || hv->start[d] < 0 ||
            hv->start[d] + hv->local[d] > hv->layout.gshape[d])
          return kdrt_errf(err, errlen, "variable %s: block out of its shape", hv->path);
      nv++;
    } else if (!strcmp(t[0], "end") && n == 1) {
      seen_end = 1;
    } else {
      return kdrt_errf(err, errlen, "bad header line '%s'", t[0]);
    }
  }
  if (!seen_end) return kdrt_errf(err, errlen, "truncated header (no 'end' line)");
  if (!h->mesh_ndim || !h->world) return kdrt_errf(err, errlen, "header lacks the mesh or rank");
  if (nv != h->nvars) return kdrt_errf(err, errlen, "header lists %d of %d variables", nv, h->nvars);
  return 0;
}

void kdrt_ckpt_header_free(kdrt_ckpt_header *h) {
  free(h->vars);
  h->vars = NULL;
}

// ------------------------------------------------------------ the manifest

char *kdrt_ckpt_manifest_format(const kdrt_ckpt_manifest *m, size_t *len) {
  const kdrt_ckpt_state *st = &m->st;
  sbuf b = {0};
  char e[1024];
  enc(e, sizeof e, m->model);
  sb_printf(&b, "%s\nmodel %s\n", MANIFEST_MAGIC, e);
  if (m->optimizer[0]) sb_printf(&b, "optimizer %s\n", m->optimizer);
  sb_printf(&b, "step %lld\nseed %llu\n", (long long)st->step, (unsigned long long)st->seed);
  fmt_mesh(&b, m->mesh_ndim, m->mesh_shape, (char (*)[64])m->axes);
  sb_printf(&b, "epoch %lld pos %lld steps %lld samples %lld", (long long)st->epoch,
            (long long)st->pos, (long long)st->steps, (long long)st->ntrain);
  if (st->batch) sb_printf(&b, " batch %lld", (long long)st->batch);
  sb_printf(&b, "\n");
  sb_printf(&b, "logs %d", st->nlogs);
  for (int k = 0; k < st->nlogs; k++) {
    enc(e, sizeof e, st->log_names[k]);
    sb_printf(&b, " %s", e);
  }
  sb_printf(&b, "\nsums");
  for (int k = 0; k < st->nlogs; k++) sb_printf(&b, " %a", st->sums[k]);
  sb_printf(&b, "\nhistory %d\n", st->nhist);
  for (int i = 0; i < st->nhist; i++) {
    sb_printf(&b, "h");
    for (int k = 0; k < 2 * st->nlogs; k++) sb_printf(&b, " %a", st->hist[k][i]);
    sb_printf(&b, "\n");
  }
  sb_printf(&b, "steploss %lld\n", (long long)st->nsteps);
  for (int64_t i = 0; i < st->nsteps; i++)
    sb_printf(&b, "%a%s", st->step_loss[i], i % 8 == 7 || i + 1 == st->nsteps ? "\n" : " ");
  if (st->has_loss_scale) { // issue 23
    sb_printf(&b, "lossscale %a count %lld iterations %lld\nstepscale %lld\n", st->loss_scale,
              (long long)st->loss_scale_count, (long long)st->iterations, (long long)st->nsteps);
    for (int64_t i = 0; i < st->nsteps; i++)
      sb_printf(&b, "%a%s", st->step_scale[i], i % 8 == 7 || i + 1 == st->nsteps ? "\n" : " ");
  }
  sb_printf(&b, "files %d\n", m->nfiles);
  for (int i = 0; i < m->nfiles; i++)
    sb_printf(&b, "file %s %llu %08x\n", m->files[i].name, (unsigned long long)m->files[i].size,
              m->files[i].crc);
  sb_printf(&b, "crc %08x\n", kdrt_crc32(0, b.s, b.n));
  *len = b.n;
  return b.s;
}

int kdrt_ckpt_manifest_parse(char *text, size_t len, kdrt_ckpt_manifest *m, char *err,
                             size_t errlen) {
  memset(m, 0, sizeof m[0]);
  kdrt_ckpt_state *st = &m->st;
  // The last line is "crc XXXXXXXX" over everything before it.
  size_t body = len;
  if (body && text[body - 1] == '\n') body--;
  while (body && text[body - 1] != '\n') body--;
  unsigned crc;
  if (len - body < 12 || sscanf(text + body, "crc %8x", &crc) != 1)
    return kdrt_errf(err, errlen, "does not end in its crc line (truncated or altered)");
  if (kdrt_crc32(0, text, body) != crc) return kdrt_errf(err, errlen, "checksum mismatch");
  size_t pos = 0;
  char *t[2 * KDRT_MAX_LOGS + 2];
  int n, nf = 0, nh = 0, files_seen = 0, hist_seen = 0;
  int64_t v;
  n = next_line(text, body, &pos, t, (int)(sizeof t / sizeof t[0]));
  if (n != 2 || strcmp(t[0], "KDCKPT-MANIFEST"))
    return kdrt_errf(err, errlen, "not a kdcc checkpoint manifest");
  if (strcmp(t[1], "2"))
    return kdrt_errf(err, errlen, "manifest version %s is not supported (this runtime writes 2)",
                     t[1]);
  while ((n = next_line(text, body, &pos, t, (int)(sizeof t / sizeof t[0]))) >= 0) {
    if (n == 0) continue;
    if (!strcmp(t[0], "model") && n == 2) {
      snprintf(m->model, sizeof m->model, "%s", t[1]);
      dec(m->model);
    } else if (!strcmp(t[0], "optimizer") && n == 2) {
      snprintf(m->optimizer, sizeof m->optimizer, "%s", t[1]);
    } else if (!strcmp(t[0], "step") && n == 2 && !to_i64(t[1], &v) && v >= 0) {
      st->step = v;
    } else if (!strcmp(t[0], "seed") && n == 2 && !to_i64(t[1], &v)) {
      st->seed = (uint64_t)v;
    } else if (!strcmp(t[0], "mesh")) {
      if (parse_mesh(t, n, &m->mesh_ndim, m->mesh_shape, m->axes))
        return kdrt_errf(err, errlen, "bad 'mesh' line");
    } else if (!strcmp(t[0], "epoch") && (n == 8 || (n == 10 && !strcmp(t[8], "batch"))) &&
               !strcmp(t[2], "pos") && !strcmp(t[4], "steps") && !strcmp(t[6], "samples")) {
      if (to_i64(t[1], &st->epoch) || to_i64(t[3], &st->pos) || to_i64(t[5], &st->steps) ||
          to_i64(t[7], &st->ntrain) || (n == 10 && (to_i64(t[9], &st->batch) || st->batch < 1)) ||
          st->epoch < 0 || st->pos < 0 || st->pos > st->steps)
        return kdrt_errf(err, errlen, "bad 'epoch' line");
    } else if (!strcmp(t[0], "logs") && n >= 3 && !to_i64(t[1], &v) && v == n - 2 &&
               !m->names) {
      st->nlogs = (int)v;
      m->names = calloc((size_t)v, sizeof *m->names);
      m->sums = calloc((size_t)v, sizeof *m->sums);
      if (!m->names || !m->sums) return kdrt_errf(err, errlen, "out of memory");
      for (int k = 0; k < st->nlogs; k++) {
        if (!(m->names[k] = strdup(t[2 + k]))) return kdrt_errf(err, errlen, "out of memory");
        dec(m->names[k]);
      }
      st->log_names = (const char *const *)m->names;
      st->sums = m->sums;
    } else if (!strcmp(t[0], "sums") && m->names && n == st->nlogs + 1) {
      for (int k = 0; k < st->nlogs; k++)
        if (to_f64(t[1 + k], &m->sums[k])) return kdrt_errf(err, errlen, "bad 'sums' line");
    } else if (!strcmp(t[0], "history") && n == 2 && !to_i64(t[1], &v) && v >= 0 &&
               v < 100000000 && !hist_seen && m->names) {
      hist_seen = 1;
      st->nhist = (int)v;
      if (!(m->hist = calloc(2 * (size_t)st->nlogs, sizeof *m->hist)))
        return kdrt_errf(err, errlen, "out of memory");
      for (int k = 0; k < 2 * st->nlogs; k++)
        if (!(m->hist[k] = calloc((size_t)(v ? v : 1), sizeof(double))))
          return kdrt_errf(err, errlen, "out of memory");
      st->hist = (const double *const *)m->hist;
    } else if (!strcmp(t[0], "h") && hist_seen && n == 2 * st->nlogs + 1 && nh < st->nhist) {
      for (int k = 0; k < 2 * st->nlogs; k++)
        if (to_f64(t[1 + k], &m->hist[k][nh])) return kdrt_errf(err, errlen, "bad 'h' line");
      nh++;
    } else if (!strcmp(t[0], "steploss") && n == 2 && !to_i64(t[1], &v) && v >= 0 &&
               v < ((int64_t)1 << 40) && !m->step_loss) {
      st->nsteps = v;
      m->step_loss = malloc(sizeof(double) * (size_t)(v ? v : 1));
      if (!m->step_loss) return kdrt_errf(err, errlen, "out of memory");
      st->step_loss = m->step_loss;
      // Then the values, 8 a line.
      for (int64_t i = 0; i < v; i += 8) {
        int want = v - i < 8 ? (int)(v - i) : 8;
        if (next_line(text, body, &pos, t, (int)(sizeof t / sizeof t[0])) != want)
          return kdrt_errf(err, errlen, "bad step loss line");
        for (int k = 0; k < want; k++)
          if (to_f64(t[k], &m->step_loss[i + k])) return kdrt_errf(err, errlen, "bad step loss");
      }
    } else if (!strcmp(t[0], "lossscale") && n == 6 && !strcmp(t[2], "count") &&
               !strcmp(t[4], "iterations")) { // issue 23
      if (to_f64(t[1], &st->loss_scale) || !(st->loss_scale > 0) ||
          to_i64(t[3], &st->loss_scale_count) || to_i64(t[5], &st->iterations) ||
          st->loss_scale_count < 0 || st->iterations < 0)
        return kdrt_errf(err, errlen, "bad 'lossscale' line");
      st->has_loss_scale = 1;
    } else if (!strcmp(t[0], "stepscale") && n == 2 && !to_i64(t[1], &v) && m->step_loss &&
               v == st->nsteps && !m->step_scale) {
      m->step_scale = malloc(sizeof(double) * (size_t)(v ? v : 1));
      if (!m->step_scale) return kdrt_errf(err, errlen, "out of memory");
      st->step_scale = m->step_scale;
      for (int64_t i = 0; i < v; i += 8) {
        int want = v - i < 8 ? (int)(v - i) : 8;
        if (next_line(text, body, &pos, t, (int)(sizeof t / sizeof t[0])) != want)
          return kdrt_errf(err, errlen, "bad step scale line");
        for (int k = 0; k < want; k++)
          if (to_f64(t[k], &m->step_scale[i + k]))
            return kdrt_errf(err, errlen, "bad step scale");
      }
    } else if (!strcmp(t[0], "files") && n == 2 && !to_i64(t[1], &v) && v >= 1 &&
               v < 10000000 && !files_seen) {
      files_seen = 1;
      m->nfiles = (int)v;
      m->files = calloc((size_t)v, sizeof m->files[0]);
      if (!m->files) return kdrt_errf(err, errlen, "out of memory");
    } else if (!strcmp(t[0], "file") && n == 4 && nf < m->nfiles) {
      unsigned long long size;
      if (strlen(t[1]) >= sizeof m->files[nf].name || strchr(t[1], '/') || t[1][0] == '.' ||
          sscanf(t[2], "%llu", &size) != 1 || sscanf(t[3], "%8x", &crc) != 1)
        return kdrt_errf(err, errlen, "bad 'file' line");
      snprintf(m->files[nf].name, sizeof m->files[nf].name, "%s", t[1]);
      m->files[nf].size = size, m->files[nf].crc = crc;
      nf++;
    } else {
      return kdrt_errf(err, errlen, "bad line '%s'", t[0]);
    }
  }
  if (!m->mesh_ndim || !files_seen || !hist_seen || !m->step_loss)
    return kdrt_errf(err, errlen, "lacks the mesh, logs, history or file list");
  if (st->has_loss_scale != (m->step_scale != NULL))
    return kdrt_errf(err, errlen, "has a loss scale without its steps' or the other way round");
  if (nf != m->nfiles || nh != st->nhist)
    return kdrt_errf(err, errlen, "lists %d of %d files, %d of %d epochs", nf, m->nfiles, nh, st->nhist);
  return 0;
}

void kdrt_ckpt_manifest_free(kdrt_ckpt_manifest *m) {
  for (int k = 0; m->hist && k < 2 * m->st.nlogs; k++) free(m->hist[k]);
  for (int k = 0; m->names && k < m->st.nlogs; k++) free(m->names[k]);
  free(m->hist), free(m->names), free(m->sums);
  m->hist = NULL, m->names = NULL, m->sums = NULL;
  free(m->step_loss), free(m->step_scale);
  m->step_loss = NULL, m->step_scale = NULL;
  free(m->files);
  m->files = NULL;
}

// ------------------------------------------------------------ resharding

int64_t kdrt_ckpt_copy_overlap(float *dst, const int64_t *dst_start, const int64_t *dst_ext,
                               const float *src, const int64_t *src_start,
                               const int64_t *src_ext, int rank) {
  int64_t lo[KDRT_MAX_RANK], hi[KDRT_MAX_RANK], idx[KDRT_MAX_RANK];
  int64_t total = 1;
  for (int d = 0; d < rank; d++) {
    lo[d] = dst_start[d] > src_start[d] ? dst_start[d] : src_start[d];
    int64_t de = dst_start[d] + dst_ext[d], se = src_start[d] + src_ext[d];
    hi[d] = de < se ? de : se;
    if (lo[d] >= hi[d]) return 0;
    total *= hi[d] - lo[d];
    idx[d] = lo[d];
  }
  if (rank == 0) {
    dst[0] = src[0];
    return 1;
  }
  // Contiguous runs along the last dimension, the other indices odometer-style.
  int last = rank - 1;
  size_t run = (size_t)(hi[last] - lo[last]);
  for (;;) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < rank; d++) {
      so = so * src_ext[d] + (idx[d] - src_start[d]);
      doff = doff * dst_ext[d] + (idx[d] - dst_start[d]);
    }
    memcpy(dst + doff, src + so, run * sizeof(float));
    int d = last - 1;
    while (d >= 0 && ++idx[d] == hi[d]) idx[d] = lo[d], d--;
    if (d < 0) break;
  }
  return total;
}

// ------------------------------------------------------------ save

static void join(char *out, size_t len, const char *a, const char *b) {
  if ((size_t)snprintf(out, len, "%s/%s", a, b) >= len) out[len - 1] = 0;
}

static int is_ckpt_name(const char *s, int64_t *step) {
  if (strncmp(s, "ckpt-", 5) || !s[5]) return 0;
  for (const char *p = s + 5; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  return !to_i64(s + 5, step);
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
      for (int k = 0; k <= v->nslots; k++)
        kdrt_ckpt_write(&f, c->params + v->offset + (size_t)k * v->stride, v->n * sizeof(float));
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
  unsigned long long hl = 0;
  if (r > 0) first[r] = 0;
  if (r <= 0 || sscanf(first, SHARD_MAGIC " header %llu", &hl) != 1 || hl > (1u << 30))
    return kdrt_errf(err, errlen, "%s: not a kdcc checkpoint shard", path);
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
        got = kdrt_ckpt_copy_overlap(c->params + v->offset + (size_t)k * v->stride, start, ext,
                                     buf, sv->start, sv->local, l->rank);
      }
      covered += got;
    }
    if (!err[0] && covered != (int64_t)v->n)
      snprintf(err, sizeof err, "%s: the shard files cover %lld of the %zu values of '%s' this "
               "rank needs", cdir, (long long)covered, v->n, v->path);
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
