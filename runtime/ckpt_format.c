// ckpt_format.c: what a checkpoint's files hold, as text and bytes: the
// shard header, the MANIFEST, their CRC-32, and cutting one saved block
// into another mesh's (resharding). No MPI and no files here: saving and
// resuming (checkpoint.c) write and read what these functions format and
// parse, and tests/test_rt_checkpoint.c checks them alone.
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
#include "kdrt.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define SHARD_MAGIC "KDCKPT-SHARD 1"
#define MANIFEST_MAGIC "KDCKPT-MANIFEST 2"

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

// A value a training step of the run so far (its loss, its loss scale): n
// doubles, 8 a line, written and read back exactly (%a).
static void put_per_step(sbuf *b, const double *v, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    sb_printf(b, "%a%s", v[i], i % 8 == 7 || i + 1 == n ? "\n" : " ");
}

static int get_per_step(char *text, size_t len, size_t *pos, double *v, int64_t n,
                        const char *what, char *err, size_t errlen) {
  char *t[8];
  for (int64_t i = 0; i < n; i += 8) {
    int want = n - i < 8 ? (int)(n - i) : 8;
    if (next_line(text, len, pos, t, 8) != want)
      return kdrt_errf(err, errlen, "bad %s line", what);
    for (int k = 0; k < want; k++)
      if (to_f64(t[k], &v[i + k])) return kdrt_errf(err, errlen, "bad %s", what);
  }
  return 0;
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
  put_per_step(&b, st->step_loss, st->nsteps);
  if (st->has_loss_scale) { // issue 23
    sb_printf(&b, "lossscale %a count %lld iterations %lld\nstepscale %lld\n", st->loss_scale,
              (long long)st->loss_scale_count, (long long)st->iterations, (long long)st->nsteps);
    put_per_step(&b, st->step_scale, st->nsteps);
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
      if (get_per_step(text, body, &pos, m->step_loss, v, "step loss", err, errlen)) return -1;
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
      if (get_per_step(text, body, &pos, m->step_scale, v, "step scale", err, errlen)) return -1;
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

int64_t kdrt_ckpt_header_bytes(const char *first) {
  unsigned long long hl = 0;
  if (sscanf(first, SHARD_MAGIC " header %llu", &hl) != 1 || hl > (1u << 30)) return -1;
  return (int64_t)hl;
}
