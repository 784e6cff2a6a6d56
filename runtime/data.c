// data.c: the data files a training program reads, and what it hands a step.
//
// Formats, recognised by their first bytes, never by their names:
//   - .npy (\x93NUMPY): little-endian f4 f8 u1 i4 i8, C order;
//   - IDX, as MNIST and Fashion-MNIST ship (00 00 TYPE NDIM, then NDIM
//     big-endian uint32 dims, then the elements, big-endian): TYPE 0x08 u8,
//     0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64; images are
//     0x00000803 [N, 28, 28], labels 0x00000801 [N];
//   - either of them gzip'd (1f 8b): decompressed once, into memory.
// A plain file is mmap'd, so a rank touches only the pages of the rows it
// reads; every rank reads only its own rows of each global batch.
//
// Fitting a file to the model (kdrt_data_open):
//   - each input and each label has its own file, all of one set with the
//     same number of samples;
//   - inputs fit when each sample has as many elements as the model's input
//     ([N, 28, 28] feeds [28, 28, 1] or [784]): the bytes are the same,
//     row-major, so nothing is said; float inputs become float32 (times
//     --scale); int32 inputs (token ids) take integer files (uint8, int32,
//     int64, IDX integers) or float files of integral values, every id
//     checked at open against [0, num_classes);
//   - labels follow each label's label_kind: CLASSID takes class ids [N]
//     or [N, 1]; ONEHOT takes [N, C] as it is, or class ids that it expands
//     to one-hot rows of C = num_classes; DENSE and BINARY take any shape with
//     the label's element count per sample. Class ids are checked once, at
//     open (every id an integer in [0, num_classes)), so a bad label is an
//     error before the first step and not a silent NaN.
// Every problem is a message naming the file and what did not fit, returned
// to kdrt.c, which prints it once and ends every rank with status 1.
#include "kdrt.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

// "(60000, 28, 28)", or with first = "N": "(N, 28, 28, 1)"; one element: "(N,)".
static void fmt_shape(char *buf, size_t len, const char *first, int n, const int64_t *v) {
  size_t k = (size_t)snprintf(buf, len, "(%s", first);
  for (int i = 0; i < n && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%lld", (i || *first) ? ", " : "",
                          (long long)v[i]);
  if (k < len) snprintf(buf + k, len - k, "%s)", n + (*first != 0) == 1 ? "," : "");
}

static int64_t prod(int n, const int64_t *v) {
  int64_t p = 1;
  for (int i = 0; i < n; i++) p *= v[i];
  return p;
}

// The dtype of a header as numpy names it: "uint8", "float32", ...
static const char *dtype_name(const kdrt_array_header *h) {
  switch (h->kind * 16 + h->size) {
  case 'u' * 16 + 1: return "uint8";
  case 'i' * 16 + 1: return "int8";
  case 'i' * 16 + 2: return "int16";
  case 'i' * 16 + 4: return "int32";
  case 'i' * 16 + 8: return "int64";
  case 'f' * 16 + 4: return "float32";
  case 'f' * 16 + 8: return "float64";
  default: return "?";
  }
}

// ------------------------------------------------------------ .npy headers

// Find key ('key' or "key") in the header dict; returns the text after its colon.
static const char *npy_key(const char *h, const char *end, const char *key) {
  size_t kl = strlen(key);
  for (const char *p = h; p + kl + 2 <= end; p++) {
    if ((*p == '\'' || *p == '"') && !strncmp(p + 1, key, kl) && p[kl + 1] == *p) {
      p += kl + 2;
      while (p < end && (*p == ' ' || *p == ':')) p++;
      return p;
    }
  }
  return NULL;
}

int kdrt_npy_parse(const unsigned char *buf, size_t len, kdrt_npy *out, char *err,
                   size_t errlen) {
  memset(out, 0, sizeof *out);
  if (len < 10 || memcmp(buf, "\x93NUMPY", 6))
    return kdrt_errf(err, errlen, "not a .npy file (no \\x93NUMPY magic)");
  size_t hlen, hstart;
  if (buf[6] == 1) {
    hlen = buf[8] | (size_t)buf[9] << 8, hstart = 10;
  } else if (buf[6] == 2 || buf[6] == 3) {
    if (len < 12) return kdrt_errf(err, errlen, "truncated .npy header");
    hlen = buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    hstart = 12;
  } else {
    return kdrt_errf(err, errlen, ".npy format version %d is not supported", buf[6]);
  }
  if (hstart + hlen > len) return kdrt_errf(err, errlen, "truncated .npy header");
  const char *h = (const char *)buf + hstart, *end = h + hlen;
  out->data_offset = hstart + hlen;

  // 'descr': '<f4'
  const char *p = npy_key(h, end, "descr");
  if (!p || p >= end || (*p != '\'' && *p != '"'))
    return kdrt_errf(err, errlen, ".npy header has no 'descr' string");
  char q = *p++, descr[16];
  size_t n = 0;
  while (p < end && *p != q && n + 1 < sizeof descr) descr[n++] = *p++;
  descr[n] = 0;
  if (p >= end || *p != q)
    return kdrt_errf(err, errlen, ".npy header's 'descr' is not a short quoted string");
  if (n < 3 || strchr("<>|=", descr[0]) == NULL || descr[0] == '>')
    return kdrt_errf(err, errlen, "dtype '%s' is not supported (big-endian or structured)", descr);
  out->kind = descr[1];
  // The size is every character after the kind, all digits: '<f4', never '<f4aaaa'.
  int digits = descr[2] != 0;
  for (const char *d = descr + 2; *d; d++) digits &= *d >= '0' && *d <= '9';
  out->size = digits && n <= 4 ? atoi(descr + 2) : 0;
  // issue 10: numpy's bool ('|b1', an attention mask) is one byte, 0 or 1: read as uint8
  if (out->kind == 'b' && out->size == 1) out->kind = 'u';
  int ok = (out->kind == 'f' && (out->size == 4 || out->size == 8)) ||
           (out->kind == 'u' && out->size == 1) ||
           (out->kind == 'i' && (out->size == 4 || out->size == 8));
  if (!ok)
    return kdrt_errf(err, errlen,
                "dtype '%s' is not supported (use float32, float64, uint8, int32 or int64)",
                descr);

  // 'fortran_order': False
  p = npy_key(h, end, "fortran_order");
  if (!p) return kdrt_errf(err, errlen, ".npy header has no 'fortran_order'");
  if (!strncmp(p, "True", 4))
    return kdrt_errf(err, errlen, "array is in Fortran order; save it with "
                             "np.save(f, np.ascontiguousarray(a))");
  if (strncmp(p, "False", 5)) return kdrt_errf(err, errlen, "bad 'fortran_order' value");

  // 'shape': (128, 28, 28, 1)
  p = npy_key(h, end, "shape");
  if (!p || *p != '(') return kdrt_errf(err, errlen, ".npy header has no 'shape' tuple");
  p++;
  for (;;) {
    while (p < end && (*p == ' ' || *p == ',')) p++;
    if (p >= end) return kdrt_errf(err, errlen, "unterminated 'shape' tuple");
    if (*p == ')') break;
    char *e;
    long long v = strtoll(p, &e, 10);
    if (e == p || v < 0) return kdrt_errf(err, errlen, "bad 'shape' tuple");
    if (out->ndim == 8) return kdrt_errf(err, errlen, "more than 8 dimensions");
    out->shape[out->ndim++] = v;
    p = e;
    while (p < end && (*p == 'L' || *p == ' ')) p++; // Python 2 longs
  }
  return 0;
}

// ------------------------------------------------------------ IDX headers

int kdrt_idx_parse(const unsigned char *buf, size_t len, kdrt_array_header *out, char *err,
                   size_t errlen) {
  memset(out, 0, sizeof *out);
  if (len < 4 || buf[0] || buf[1])
    return kdrt_errf(err, errlen, "not an IDX file (the magic number does not start with 00 00)");
  switch (buf[2]) {
  case 0x08: out->kind = 'u', out->size = 1; break;
  case 0x09: out->kind = 'i', out->size = 1; break;
  case 0x0B: out->kind = 'i', out->size = 2; break;
  case 0x0C: out->kind = 'i', out->size = 4; break;
  case 0x0D: out->kind = 'f', out->size = 4; break;
  case 0x0E: out->kind = 'f', out->size = 8; break;
  default:
    return kdrt_errf(err, errlen,
                "IDX type byte 0x%02X is not one of 0x08 (uint8), 0x09 (int8), 0x0B (int16), "
                "0x0C (int32), 0x0D (float32), 0x0E (float64)", buf[2]);
  }
  out->big_endian = out->size > 1;
  int nd = buf[3];
  if (nd < 1 || nd > 8)
    return kdrt_errf(err, errlen, "IDX header has %d dimensions (1 to 8 are supported)", nd);
  size_t need = 4 + 4 * (size_t)nd;
  if (len < need)
    return kdrt_errf(err, errlen, "truncated IDX header: %d dimensions need %zu bytes, the file has %zu",
                nd, need, len);
  out->ndim = nd;
  for (int i = 0; i < nd; i++) {
    const unsigned char *p = buf + 4 + 4 * i;
    out->shape[i] = (int64_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
                              (uint32_t)p[2] << 8 | p[3]);
  }
  out->data_offset = need;
  return 0;
}

// ------------------------------------------------------------ files

// The most bytes a gzip'd data file may inflate to in one rank: every rank
// inflates a gzip'd file whole (a plain file is mapped, and a rank touches
// only its rows), so half the host's memory shared by the ranks on it
// (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE), or KDRT_MAX_INFLATE (bytes, or
// with a K, M or G suffix).
size_t kdrt_max_inflate(void) {
  const char *env = getenv("KDRT_MAX_INFLATE");
  if (env && *env) {
    char *end;
    double v = strtod(env, &end);
    double mult = *end == 'K' || *end == 'k' ? 1024.0 : *end == 'M' || *end == 'm' ? 1048576.0
                : *end == 'G' || *end == 'g' ? 1073741824.0 : 1.0;
    if (v > 0 && end != env) return v * mult >= 1.8e19 ? SIZE_MAX : (size_t)(v * mult);
  }
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  long ranks = local ? atol(local) : 1;
  if (pages <= 0 || page <= 0) return (size_t)1 << 32;
  return (size_t)((double)pages * (double)page / 2.0 / (double)(ranks > 0 ? ranks : 1));
}

// "512.0 MiB"
static void fmt_bytes(char *buf, size_t len, double b) {
  const char *u[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

// gzread in pieces of at most 1 GiB (its count is an unsigned int): bytes
// read, or -1 on an error.
static int64_t gz_read_all(gzFile g, unsigned char *buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    size_t want = n - done > (1u << 30) ? (1u << 30) : n - done;
    int got = gzread(g, buf + done, (unsigned)want);
    if (got < 0) return -1;
    if (got == 0) break;
    done += (size_t)got;
  }
  return (int64_t)done;
}

// zlib's error of g (code in *zerr) as text in buf: gzerror's text lives
// in g, so it is copied before gzclose frees it, without the "path: " zlib
// puts first.
static void gz_error(gzFile g, const char *path, int *zerr, char *buf, size_t len) {
  const char *msg = gzerror(g, zerr);
  size_t plen = strlen(path);
  if (msg && !strncmp(msg, path, plen) && !strncmp(msg + plen, ": ", 2)) msg += plen + 2;
  snprintf(buf, len, "%s", msg ? msg : "");
}

// Read a gzip'd .npy or IDX file into memory, bounded: its header (in the
// first 64 KiB) says how many bytes the data take, which must be within
// kdrt_max_inflate() before anything is allocated; the stream may hold no
// more than that. Corrupt or truncated streams are errors (zlib checks the
// CRC and length trailer); a stream that is neither format is returned as
// it is, for parse_bytes to say so.
static int gunzip(const char *path, unsigned char **out, size_t *outlen, char *err,
                  size_t errlen) {
  gzFile g = gzopen(path, "rb");
  if (!g) return kdrt_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno ? errno : ENOMEM));
  gzbuffer(g, 1 << 17);
  enum { HEAD = 1 << 16 };
  unsigned char *buf = malloc(HEAD);
  if (!buf) {
    gzclose(g);
    return kdrt_errf(err, errlen, "%s: out of memory decompressing", path);
  }
  int64_t got = gz_read_all(g, buf, HEAD), total = -1;
  char e[256];
  if (got > 0) {
    kdrt_array_header h;
    int known = 0;
    if (got >= 6 && !memcmp(buf, "\x93NUMPY", 6)) known = !kdrt_npy_parse(buf, (size_t)got, &h, e, sizeof e);
    else if (got >= 2 && !buf[0] && !buf[1]) known = !kdrt_idx_parse(buf, (size_t)got, &h, e, sizeof e);
    if (known) {
      double elems = 1;
      for (int i = 0; i < h.ndim; i++) elems *= (double)h.shape[i];
      double bytes = (double)h.data_offset + elems * (double)h.size;
      size_t limit = kdrt_max_inflate();
      if (bytes > (double)limit || bytes > 9e18) {
        char want[32], lim[32], shp[160];
        fmt_bytes(want, sizeof want, bytes);
        fmt_bytes(lim, sizeof lim, (double)limit);
        fmt_shape(shp, sizeof shp, "", h.ndim, h.shape);
        free(buf);
        gzclose(g);
        return kdrt_errf(err, errlen, "%s: inflates to %s (its header: %s shape %s); every "
                         "rank inflates a gzip'd file whole, and may take %s (half the memory, "
                         "shared by the ranks on this host; KDRT_MAX_INFLATE sets it): "
                         "decompress it (gunzip), so that each rank maps only its rows", path,
                         want, dtype_name(&h), shp, lim);
      }
      total = (int64_t)bytes;
    }
  }
  int64_t n = got;
  if (total > HEAD) { // the rest, into its exact size, and one byte to see if it ends there
    unsigned char *nb = realloc(buf, (size_t)total + 1);
    if (!nb) {
      free(buf);
      gzclose(g);
      return kdrt_errf(err, errlen, "%s: out of memory decompressing", path);
    }
    buf = nb;
    int64_t more = gz_read_all(g, buf + HEAD, (size_t)(total - HEAD) + 1);
    n = more < 0 ? -1 : HEAD + more;
  } else if (total < 0 && got == HEAD) { // not a format we know: no bound to read to
    n = HEAD;
  }
  int zerr = Z_OK;
  char zmsg[256];
  gz_error(g, path, &zerr, zmsg, sizeof zmsg);
  if (n >= 0 && zerr == Z_OK && total >= 0 && n == total) { // must end here
    unsigned char one;
    if (gz_read_all(g, &one, 1) > 0) n = total + 1;
    gz_error(g, path, &zerr, zmsg, sizeof zmsg);
  }
  gzclose(g);
  if (n < 0 || (zerr != Z_OK && zerr != Z_STREAM_END)) {
    free(buf);
    if (zerr == Z_BUF_ERROR)
      return kdrt_errf(err, errlen, "%s: gzip data is truncated (%s)", path, zmsg);
    return kdrt_errf(err, errlen, "%s: corrupt gzip data (%s)", path, zmsg);
  }
  if (total >= 0 && n > total) {
    free(buf);
    return kdrt_errf(err, errlen, "%s: the gzip stream holds more than the %lld bytes its "
                     "header promises: a corrupt header or a wrong file", path, (long long)total);
  }
  *out = buf, *outlen = (size_t)n;
  return 0;
}

// Parse the header of bytes[0..len) (npy or IDX) and check that the data
// the shape promises is all there.
static int parse_bytes(kdrt_array *a, const unsigned char *bytes, size_t len, const char *format,
                       char *err, size_t errlen) {
  char e[200];
  const char *path = a->path;
  if (len >= 6 && !memcmp(bytes, "\x93NUMPY", 6)) {
    a->format = format ? "gzip'd .npy" : ".npy";
    if (kdrt_npy_parse(bytes, len, &a->h, e, sizeof e)) return kdrt_errf(err, errlen, "%s: %s", path, e);
  } else if (len >= 2 && bytes[0] == 0 && bytes[1] == 0) {
    a->format = format ? "gzip'd IDX" : "IDX";
    if (kdrt_idx_parse(bytes, len, &a->h, e, sizeof e)) return kdrt_errf(err, errlen, "%s: %s", path, e);
  } else {
    char got[40] = ""; // as many bytes as the longest magic, so never only what was expected
    for (size_t i = 0, k = 0; i < 6 && i < len; i++)
      k += (size_t)snprintf(got + k, sizeof got - k, "%s%02x", i ? " " : "", bytes[i]);
    return kdrt_errf(err, errlen,
                "%s: not a .npy or IDX file%s (it starts with %s; .npy starts with 93 4e 55 "
                "4d 50 59 (\\x93NUMPY), IDX with 00 00, gzip with 1f 8b)", path,
                format ? " inside the gzip" : "", len ? got : "nothing, it is empty");
  }
  const kdrt_array_header *h = &a->h;
  if (h->ndim < 1) return kdrt_errf(err, errlen, "%s: a 0-dimensional array holds no samples", path);
  // Bytes the shape promises, without overflow.
  int64_t elems = 1;
  for (int i = 0; i < h->ndim; i++) {
    if (h->shape[i] && elems > INT64_MAX / 16 / h->shape[i])
      return kdrt_errf(err, errlen, "%s: shape is too large", path);
    elems *= h->shape[i];
  }
  size_t need = (size_t)elems * (size_t)h->size, have = len - h->data_offset;
  char shp[160];
  fmt_shape(shp, sizeof shp, "", h->ndim, h->shape);
  if (have < need)
    return kdrt_errf(err, errlen,
                "%s: file is truncated: %zu bytes of data, but %s of %s shape %s needs %zu",
                path, have, a->format, dtype_name(h), shp, need);
  if (have > need && !strstr(a->format, "npy"))
    return kdrt_errf(err, errlen,
                "%s: %zu bytes of data, but IDX %s shape %s needs exactly %zu: a corrupt "
                "header or a wrong file", path, have, dtype_name(h), shp, need);
  a->data = bytes + h->data_offset;
  a->n = h->shape[0];
  a->row = prod(h->ndim - 1, h->shape + 1);
  return 0;
}

int kdrt_array_open(kdrt_array *a, const char *path, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  a->path = path;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return kdrt_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st)) {
    int e = errno;
    close(fd);
    return kdrt_errf(err, errlen, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return kdrt_errf(err, errlen, "%s: not a regular file", path);
  }
  unsigned char magic[2] = {0, 0};
  ssize_t m = st.st_size >= 2 ? pread(fd, magic, 2, 0) : 0;
  if (m == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    close(fd);
    size_t len = 0;
    if (gunzip(path, &a->buf, &len, err, errlen)) return -1;
    return parse_bytes(a, a->buf, len, "gzip", err, errlen);
  }
  if (st.st_size == 0) {
    close(fd);
    return parse_bytes(a, (const unsigned char *)"", 0, NULL, err, errlen);
  }
  a->map_len = (size_t)st.st_size;
  a->map = mmap(NULL, a->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (a->map == MAP_FAILED) {
    a->map = NULL;
    return kdrt_errf(err, errlen, "%s: cannot map: %s", path, strerror(errno));
  }
  return parse_bytes(a, a->map, a->map_len, NULL, err, errlen);
}

void kdrt_array_close(kdrt_array *a) {
  if (a->map) munmap(a->map, a->map_len);
  free(a->buf);
  memset(a, 0, sizeof *a);
}

// Element i of the file (flat index) as a double.
static double element(const kdrt_array *a, size_t i) {
  const kdrt_array_header *h = &a->h;
  const unsigned char *p = a->data + i * (size_t)h->size;
  unsigned char b[8];
  if (h->big_endian) {
    for (int k = 0; k < h->size; k++) b[k] = p[h->size - 1 - k];
    p = b;
  }
  switch (h->kind * 16 + h->size) {
  case 'u' * 16 + 1: return *p;
  case 'i' * 16 + 1: return (int8_t)*p;
  case 'i' * 16 + 2: { int16_t x; memcpy(&x, p, 2); return x; }
  case 'i' * 16 + 4: { int32_t x; memcpy(&x, p, 4); return x; }
  case 'i' * 16 + 8: { int64_t x; memcpy(&x, p, 8); return (double)x; }
  case 'f' * 16 + 4: { float x; memcpy(&x, p, 4); return x; }
  default: { double x; memcpy(&x, p, 8); return x; }
  }
}

void kdrt_array_row(const kdrt_array *a, int64_t s, double scale, float *out) {
  size_t n = (size_t)a->row, base = (size_t)s * n;
  if (a->h.kind == 'u' && a->h.size == 1) { // the common case: uint8 pixels
    const unsigned char *p = a->data + base;
    for (size_t i = 0; i < n; i++) out[i] = (float)(p[i] * scale);
    return;
  }
  if (a->h.kind == 'f' && a->h.size == 4 && !a->h.big_endian && scale == 1.0) {
    memcpy(out, a->data + base * 4, n * 4);
    return;
  }
  for (size_t i = 0; i < n; i++) out[i] = (float)(element(a, base + i) * scale);
}

// Sample s as int32s: the caller checked (kdrt_fit_inputs) that every
// element is an integer in int32's range.
void kdrt_array_row_i32(const kdrt_array *a, int64_t s, int32_t *out) {
  size_t n = (size_t)a->row, base = (size_t)s * n;
  if (a->h.kind == 'i' && a->h.size == 4 && !a->h.big_endian) {
    memcpy(out, a->data + base * 4, n * 4);
    return;
  }
  for (size_t i = 0; i < n; i++) out[i] = (int32_t)element(a, base + i);
}

// ------------------------------------------------------------ fitting files to the model

int64_t kdrt_io_elems(const kdrt_io *io) { return prod(io->rank, io->shape); }

// A float file must hold finite numbers only: one NaN in the data makes
// every loss after it NaN, which would stop training (TerminateOnNaN) at a
// step that says nothing of the cause. Said at open instead, with the place.
static int finite_file(const kdrt_array *a, const char *what, char *err, size_t errlen) {
  if (a->h.kind != 'f') return 0;
  for (int64_t s = 0; s < a->n; s++)
    for (int64_t i = 0; i < a->row; i++) {
      double v = element(a, (size_t)(s * a->row + i));
      if (!isfinite(v))
        return kdrt_errf(err, errlen, "%s: sample %lld holds %s (element %lld): %s must be "
                         "finite numbers", a->path, (long long)s, isnan(v) ? "nan" : "inf",
                         (long long)i, what);
    }
  return 0;
}

int kdrt_fit_inputs(const kdrt_array *a, const kdrt_program *p, int k, char *err,
                    size_t errlen) {
  const kdrt_io *in = &p->inputs[k];
  int64_t want = kdrt_io_elems(in);
  if (a->row != want) {
    char got[160], exp[160];
    fmt_shape(got, sizeof got, "", a->h.ndim, a->h.shape);
    fmt_shape(exp, sizeof exp, "N", in->rank, in->shape);
    return kdrt_errf(err, errlen,
                     "%s: shape %s does not fit the model's input%s%s %s: a sample has %lld "
                     "element%s, the model's input %lld", a->path, got, p->ninputs > 1 ? " " : "",
                     p->ninputs > 1 ? in->name : "", exp, (long long)a->row,
                     a->row == 1 ? "" : "s", (long long)want);
  }
  if (in->dtype != KDRT_I32) return finite_file(a, "inputs", err, errlen);
  // Token ids: integers (a float file must hold integral values), within
  // int32, and within [0, num_classes) when the model says how many.
  int64_t hi = in->num_classes > 0 ? in->num_classes : (int64_t)INT32_MAX + 1;
  int64_t lo = in->num_classes > 0 ? 0 : INT32_MIN;
  for (int64_t s = 0; s < a->n; s++)
    for (int64_t i = 0; i < a->row; i++) {
      double v = element(a, (size_t)(s * a->row + i));
      if (v != floor(v))
        return kdrt_errf(err, errlen, "%s: input %s takes integer ids, but sample %lld holds %g",
                         a->path, in->name, (long long)s, v);
      if (!(v >= (double)lo && v < (double)hi)) {
        if (in->num_classes > 0)
          return kdrt_errf(err, errlen, "%s: id %.17g of sample %lld is not in [0, %lld) "
                           "(input %s)", a->path, v, (long long)s, (long long)in->num_classes,
                           in->name);
        return kdrt_errf(err, errlen, "%s: id %.17g of sample %lld does not fit in int32 "
                         "(input %s)", a->path, v, (long long)s, in->name);
      }
    }
  return 0;
}

int kdrt_fit_labels(const kdrt_array *a, const kdrt_program *p, int j, int *conv, char *err,
                    size_t errlen) {
  const kdrt_io *l = &p->labels[j];
  int64_t want = kdrt_io_elems(l);
  int ids = a->h.ndim == 1 || (a->h.ndim == 2 && a->h.shape[1] == 1); // one number a sample
  *conv = KDRT_LABELS_COPY;
  char got[160], exp[160], whose[300] = "";
  fmt_shape(got, sizeof got, "", a->h.ndim, a->h.shape);
  fmt_shape(exp, sizeof exp, "N", l->rank, l->shape);
  if (p->nlabels > 1) snprintf(whose, sizeof whose, " for %s", l->name);
  int64_t k = l->num_classes;
  switch (l->label_kind) {
  case KDRT_LABEL_WEIGHT: // kdcc --sample-weight: a weight a row, or one a sample for its rows
    if (a->row == want) break;
    if (ids) {
      *conv = KDRT_LABELS_BCAST;
      break;
    }
    return kdrt_errf(err, errlen, "%s: shape %s does not fit the model's sample weights: expected "
                     "%s%s (one weight a sample)", a->path, got, exp,
                     want == 1 ? "" : " or (N,)");
  case KDRT_LABEL_CLASSID: // `want` ids a sample: (N,) or (N, 1) for one, (N, T) per token
    if (a->row != want)
      return kdrt_errf(err, errlen,
                  "%s: shape %s does not fit the model's labels%s: expected class ids %s%s, as "
                  "the loss is a sparse one", a->path, got, whose, exp,
                  want == 1 ? " or (N, 1)" : "");
    *conv = KDRT_LABELS_IDS;
    break;
  case KDRT_LABEL_ONEHOT: // (N, .., C) as it is, or class ids (N, ..) to expand
    if (a->row == want && !(ids && want == 1 && k > 1)) break;
    if (k < 1 || a->row * k != want) {
      char idexp[160];
      fmt_shape(idexp, sizeof idexp, "N", l->rank > 0 ? l->rank - 1 : 0, l->shape);
      return kdrt_errf(err, errlen,
                  "%s: shape %s does not fit the model's labels%s: expected one-hot %s or class "
                  "ids %s", a->path, got, whose, exp, idexp);
    }
    *conv = KDRT_LABELS_ONEHOT;
    break;
  default:
    if (a->row == want) break;
    return kdrt_errf(err, errlen, "%s: shape %s does not fit the model's labels%s: expected %s%s",
                a->path, got, whose, exp, want == 1 ? " or (N,)" : "");
  }
  if (*conv == KDRT_LABELS_COPY || *conv == KDRT_LABELS_BCAST)
    return finite_file(a, l->label_kind == KDRT_LABEL_WEIGHT ? "sample weights" : "labels", err,
                       errlen);
  // Class ids: every one an integer in [0, k).
  for (int64_t s = 0; s < a->n; s++)
    for (int64_t i = 0; i < a->row; i++) {
      double v = element(a, (size_t)(s * a->row + i));
      if (!(v >= 0 && v < (double)k && v == floor(v)))
        return kdrt_errf(err, errlen, "%s: label %g of sample %lld is not a class id in [0, %lld)",
                    a->path, v, (long long)s, (long long)k);
    }
  return 0;
}

void kdrt_label_row(const kdrt_array *a, int conv, int64_t num_classes, int64_t s, float *out) {
  switch (conv) {
  case KDRT_LABELS_IDS:
    for (int64_t i = 0; i < a->row; i++) out[i] = (float)element(a, (size_t)(s * a->row + i));
    break;
  case KDRT_LABELS_ONEHOT:
    for (int64_t i = 0; i < a->row; i++) {
      int64_t cls = (int64_t)element(a, (size_t)(s * a->row + i));
      for (int64_t c = 0; c < num_classes; c++) out[i * num_classes + c] = c == cls ? 1.0f : 0.0f;
    }
    break;
  default: kdrt_array_row(a, s, 1.0, out); break;
  }
}

// ------------------------------------------------------------ datasets

static int alloc_sets(kdrt_data *d, const kdrt_program *p) {
  d->x = calloc((size_t)(p->ninputs ? p->ninputs : 1), sizeof *d->x);
  d->y = calloc((size_t)(p->nlabels ? p->nlabels : 1), sizeof *d->y);
  d->yconv = calloc((size_t)(p->nlabels ? p->nlabels : 1), sizeof *d->yconv);
  d->owner = 1;
  return d->x && d->y && d->yconv ? 0 : -1;
}

int kdrt_data_open(kdrt_data *d, const kdrt_program *p, const char *const *xpaths,
                   const char *const *ypaths, double scale, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  d->p = p;
  d->scale = scale;
  if (alloc_sets(d, p)) {
    kdrt_data_close(d);
    return kdrt_errf(err, errlen, "out of memory");
  }
  // Inputs, then labels; the first file's sample count is the one to match.
  const char *first = NULL;
  int64_t n = 0;
  for (int f = 0; f < p->ninputs + p->nlabels; f++) {
    int isx = f < p->ninputs, k = isx ? f : f - p->ninputs;
    const char *path = isx ? xpaths[k] : ypaths[k];
    kdrt_array *a = isx ? &d->x[k] : &d->y[k];
    if (!isx && !path && p->labels[k].label_kind == KDRT_LABEL_WEIGHT) { // no sample weights
      d->yconv[k] = KDRT_LABELS_ONES;
      continue;
    }
    if (kdrt_array_open(a, path, err, errlen) ||
        (isx ? kdrt_fit_inputs(a, p, k, err, errlen)
             : kdrt_fit_labels(a, p, k, &d->yconv[k], err, errlen))) {
      kdrt_data_close(d);
      return -1;
    }
    if (!first) {
      first = path, n = a->n;
    } else if (a->n != n) {
      kdrt_errf(err, errlen, "%s has %lld samples but %s has %lld", first, (long long)n, path,
                (long long)a->n);
      kdrt_data_close(d);
      return -1;
    }
  }
  d->n = n;
  return 0;
}

size_t kdrt_data_record_bytes(const kdrt_program *p) {
  size_t per = 0;
  for (int k = 0; k < p->ninputs; k++) per += (size_t)kdrt_io_elems(&p->inputs[k]) * 4;
  for (int j = 0; j < p->nlabels; j++) per += (size_t)kdrt_io_elems(&p->labels[j]) * 4;
  return per;
}

void kdrt_data_records(const kdrt_data *d, unsigned char *out) {
  const kdrt_program *p = d->p;
  size_t per = kdrt_data_record_bytes(p);
  void *xs[KDRT_MAX_FILES];
  float *ys[KDRT_MAX_FILES];
  for (int64_t i = 0; i < d->n; i++) {
    unsigned char *c = out + (size_t)i * per;
    for (int k = 0; k < p->ninputs; k++)
      xs[k] = c, c += (size_t)kdrt_io_elems(&p->inputs[k]) * 4;
    for (int j = 0; j < p->nlabels; j++)
      ys[j] = (float *)c, c += (size_t)kdrt_io_elems(&p->labels[j]) * 4;
    kdrt_data_sample(d, i, xs, ys);
  }
}

void kdrt_data_synthetic(kdrt_data *d, const kdrt_program *p, uint64_t seed, int64_t n) {
  memset(d, 0, sizeof *d);
  d->p = p;
  d->synthetic = 1;
  d->seed = seed;
  d->scale = 1.0;
  d->n = n;
  // Made once rather than at every step, when they fit in 256 MiB: the
  // same numbers (a pure function of seed and sample), without Philox and
  // Box-Muller in the training loop. Every element is 4 bytes (float32 or
  // int32).
  size_t per = kdrt_data_record_bytes(p);
  d->per = per;
  if ((double)n * (double)per <= 256.0 * 1024 * 1024 &&
      (d->cache = malloc((size_t)n * per + 1))) {
    d->owner = 1;
    for (int64_t s = 0; s < n; s++) {
      unsigned char *c = d->cache + (size_t)s * per;
      for (int k = 0; k < p->ninputs; k++) {
        kdrt_synthetic_input(p, seed, k, s, c);
        c += (size_t)kdrt_io_elems(&p->inputs[k]) * 4;
      }
      for (int j = 0; j < p->nlabels; j++) {
        kdrt_synthetic_label(p, seed, j, s, (float *)c);
        c += (size_t)kdrt_io_elems(&p->labels[j]) * 4;
      }
    }
  }
}

kdrt_data kdrt_data_slice(const kdrt_data *d, int64_t first, int64_t n) {
  kdrt_data v = *d;
  v.owner = 0;
  v.first = d->first + first;
  v.n = n;
  return v;
}

void kdrt_data_sample(const kdrt_data *d, int64_t i, void *const *x, float *const *y) {
  const kdrt_program *p = d->p;
  int64_t s = d->first + i;
  if (d->synthetic) {
    const unsigned char *c = d->cache ? d->cache + (size_t)s * d->per : NULL;
    for (int k = 0; k < p->ninputs; k++) {
      int64_t n = kdrt_io_elems(&p->inputs[k]);
      if (c) memcpy(x[k], c, (size_t)n * 4), c += (size_t)n * 4;
      else kdrt_synthetic_input(p, d->seed, k, s, x[k]);
      if (d->scale != 1.0 && p->inputs[k].dtype == KDRT_F32)
        for (int64_t e = 0; e < n; e++) ((float *)x[k])[e] = (float)(((float *)x[k])[e] * d->scale);
    }
    for (int j = 0; j < p->nlabels; j++) {
      int64_t n = kdrt_io_elems(&p->labels[j]);
      if (c) memcpy(y[j], c, (size_t)n * 4), c += (size_t)n * 4;
      else kdrt_synthetic_label(p, d->seed, j, s, y[j]);
    }
    return;
  }
  for (int k = 0; k < p->ninputs; k++) {
    if (p->inputs[k].dtype == KDRT_I32) kdrt_array_row_i32(&d->x[k], s, x[k]);
    else kdrt_array_row(&d->x[k], s, d->scale, x[k]);
  }
  for (int j = 0; j < p->nlabels; j++) {
    int64_t n = kdrt_io_elems(&p->labels[j]);
    if (d->yconv[j] == KDRT_LABELS_ONES || d->yconv[j] == KDRT_LABELS_BCAST) {
      float w = 1.0f; // sample weights: none given, or one a sample for each of its rows
      if (d->yconv[j] == KDRT_LABELS_BCAST) kdrt_array_row(&d->y[j], s, 1.0, &w);
      if (d->class_w) w = d->class_w[s];
      for (int64_t e = 0; e < n; e++) y[j][e] = w;
    } else {
      kdrt_label_row(&d->y[j], d->yconv[j], p->labels[j].num_classes, s, y[j]);
    }
  }
}

double kdrt_data_weight_sum(const kdrt_data *d, int j, const int64_t *order, int64_t pos0,
                            int64_t n) {
  int64_t e = kdrt_io_elems(&d->p->labels[j]);
  if (d->class_w) { // --class-weight: one a sample
    double total = 0.0;
    for (int64_t i = 0; i < n; i++)
      total += (double)d->class_w[d->first + (order ? order[pos0 + i] : pos0 + i)] * (double)e;
    return total;
  }
  if (d->synthetic || d->yconv[j] == KDRT_LABELS_ONES) return (double)(n * e);
  const kdrt_array *a = &d->y[j];
  double total = 0.0;
  for (int64_t i = 0; i < n; i++) {
    int64_t s = d->first + (order ? order[pos0 + i] : pos0 + i);
    double w = 0.0;
    for (int64_t k = 0; k < a->row; k++) w += element(a, (size_t)(s * a->row + k));
    total += d->yconv[j] == KDRT_LABELS_BCAST ? w * (double)e : w;
  }
  return total;
}

int kdrt_data_class_weight(kdrt_data *d, const char *spec, char *err, size_t errlen) {
  enum { MAXC = 4096 };
  static int64_t cls[MAXC];
  static double wt[MAXC];
  int nc = 0;
  for (const char *p = spec; *p;) { // C:W pairs, comma-separated
    char *end;
    long long c = strtoll(p, &end, 10);
    if (end == p || *end != ':' || c < 0 || nc == MAXC)
      return kdrt_errf(err, errlen, "--class-weight '%s': not class:weight pairs such as 0:1,1:5",
                       spec), -1;
    p = end + 1;
    double w = strtod(p, &end);
    if (end == p || (*end && *end != ',') || !isfinite(w))
      return kdrt_errf(err, errlen, "--class-weight '%s': not class:weight pairs such as 0:1,1:5",
                       spec), -1;
    cls[nc] = c, wt[nc++] = w;
    p = *end ? end + 1 : end;
  }
  const kdrt_array *a = &d->y[0];
  if (a->h.ndim > 2 || (a->h.ndim == 2 && a->row != a->h.shape[1]))
    return kdrt_errf(err, errlen, "--class-weight: %s holds more than one label a sample; Keras's "
                     "class_weight takes one class id (or one-hot row) a sample", a->path), -1;
  float *sw = malloc((size_t)(a->n ? a->n : 1) * sizeof *sw);
  if (!sw) return kdrt_errf(err, errlen, "out of memory"), -1;
  for (int64_t s = 0; s < a->n; s++) {
    int64_t c = 0; // the class: the id, or the one-hot row's first maximum
    if (a->row == 1) {
      c = (int64_t)llround(element(a, (size_t)s));
    } else {
      double best = element(a, (size_t)(s * a->row));
      for (int64_t k = 1; k < a->row; k++)
        if (element(a, (size_t)(s * a->row + k)) > best) best = element(a, (size_t)(s * a->row + k)), c = k;
    }
    sw[s] = 1.0f;
    for (int k = 0; k < nc; k++)
      if (cls[k] == c) sw[s] = (float)wt[k];
  }
  d->class_w = sw;
  return 0;
}

void kdrt_data_close(kdrt_data *d) {
  if (d->owner) {
    const kdrt_program *p = d->p;
    for (int k = 0; d->x && p && k < p->ninputs; k++) kdrt_array_close(&d->x[k]);
    for (int j = 0; d->y && p && j < p->nlabels; j++) kdrt_array_close(&d->y[j]);
    free(d->x), free(d->y), free(d->yconv), free(d->cache), free((float *)d->class_w);
  }
  memset(d, 0, sizeof *d);
}

// ------------------------------------------------------------ gathering a batch

void kdrt_data_gather(const kdrt_data *d, const int64_t *order, int64_t pos0, int64_t n,
                      void *const *x, float *const *y) {
  const kdrt_program *p = d->p;
  void *xs[KDRT_MAX_FILES];
  float *ys[KDRT_MAX_FILES];
  for (int64_t i = 0; i < n; i++) {
    for (int k = 0; k < p->ninputs; k++)
      xs[k] = (char *)x[k] + (size_t)i * (size_t)kdrt_io_elems(&p->inputs[k]) * 4;
    for (int j = 0; j < p->nlabels; j++)
      ys[j] = y[j] + (size_t)i * (size_t)kdrt_io_elems(&p->labels[j]);
    kdrt_data_sample(d, order ? order[pos0 + i] : pos0 + i, xs, ys);
  }
}

// ------------------------------------------------------------ the input thread
//
// One worker and one job slot under a mutex: post fills the slot and wakes
// the worker, which gathers outside the lock and marks the job done; wait
// sleeps until it is. The main thread never touches the buffers of a job in
// flight (the fit loop gathers into the set the step is not reading), and
// kdrt_data_sample only reads the data, so nothing else is shared. The
// worker's writes are seen by the main thread after wait (the mutex orders
// them).

struct kdrt_prefetch {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t posted, done;  // a job for the worker; the job finished
  int busy;                     // a job is posted and not finished
  int quit;
  const kdrt_data *d;           // the job
  const int64_t *order;
  int64_t pos0, n;
  void *x[KDRT_MAX_FILES];
  float *y[KDRT_MAX_FILES];
};

static void *prefetch_worker(void *arg) {
  kdrt_prefetch *f = arg;
  pthread_mutex_lock(&f->lock);
  for (;;) {
    while (!f->busy && !f->quit) pthread_cond_wait(&f->posted, &f->lock);
    if (f->quit && !f->busy) break;
    pthread_mutex_unlock(&f->lock);
    kdrt_data_gather(f->d, f->order, f->pos0, f->n, f->x, f->y);
    pthread_mutex_lock(&f->lock);
    f->busy = 0;
    pthread_cond_broadcast(&f->done);
  }
  pthread_mutex_unlock(&f->lock);
  return NULL;
}

kdrt_prefetch *kdrt_prefetch_start(void) {
  const char *v = getenv("KDRT_PREFETCH");
  if (v && !strcmp(v, "0")) return NULL;
  kdrt_prefetch *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  pthread_mutex_init(&f->lock, NULL);
  pthread_cond_init(&f->posted, NULL);
  pthread_cond_init(&f->done, NULL);
  if (pthread_create(&f->thread, NULL, prefetch_worker, f) != 0) {
    pthread_cond_destroy(&f->posted), pthread_cond_destroy(&f->done);
    pthread_mutex_destroy(&f->lock);
    free(f);
    return NULL;
  }
  return f;
}

void kdrt_prefetch_wait(kdrt_prefetch *f) {
  pthread_mutex_lock(&f->lock);
  while (f->busy) pthread_cond_wait(&f->done, &f->lock);
  pthread_mutex_unlock(&f->lock);
}

void kdrt_prefetch_post(kdrt_prefetch *f, const kdrt_data *d, const int64_t *order, int64_t pos0,
                        int64_t n, void *const *x, float *const *y) {
  kdrt_prefetch_wait(f);
  pthread_mutex_lock(&f->lock);
  f->d = d, f->order = order, f->pos0 = pos0, f->n = n;
  for (int k = 0; k < d->p->ninputs; k++) f->x[k] = x[k];
  for (int j = 0; j < d->p->nlabels; j++) f->y[j] = y[j];
  f->busy = 1;
  pthread_cond_signal(&f->posted);
  pthread_mutex_unlock(&f->lock);
}

void kdrt_prefetch_stop(kdrt_prefetch *f) {
  if (!f) return;
  pthread_mutex_lock(&f->lock);
  f->quit = 1;
  pthread_cond_signal(&f->posted);
  pthread_mutex_unlock(&f->lock);
  pthread_join(f->thread, NULL);
  pthread_cond_destroy(&f->posted), pthread_cond_destroy(&f->done);
  pthread_mutex_destroy(&f->lock);
  free(f);
}

// ------------------------------------------------------------ synthetic data and the shuffle

// Stream ids of the runtime's own randomness (kdcc hashes variable paths
// for the model's streams).
#define STREAM_DATA_X 0x6b647274782d3031ull  // synthetic inputs
#define STREAM_DATA_Y 0x6b647274792d3031ull  // synthetic labels
#define STREAM_SHUFFLE 0x6b64727473687566ull // per-epoch permutation

// Input k draws from stream STREAM_DATA_X + k, label j from STREAM_DATA_Y
// + j: the first of each keeps the numbers of a one-input program.
void kdrt_synthetic_input(const kdrt_program *p, uint64_t seed, int k, int64_t sample, void *x) {
  const kdrt_io *in = &p->inputs[k];
  int64_t xn = prod(in->rank, in->shape);
  uint64_t stream = STREAM_DATA_X + (uint64_t)k;
  for (int64_t i = 0; i < xn; i++) {
    uint64_t g = (uint64_t)(sample * xn + i);
    if (in->dtype == KDRT_I32) {
      int64_t classes = in->num_classes > 0 ? in->num_classes : 1;
      int64_t id = (int64_t)((double)kdrt_uniform(seed, stream, 0, g) * (double)classes);
      ((int32_t *)x)[i] = (int32_t)(id < classes ? id : classes - 1);
    } else {
      ((float *)x)[i] = kdrt_normal(seed, stream, 0, g);
    }
  }
}

void kdrt_synthetic_label(const kdrt_program *p, uint64_t seed, int j, int64_t sample, float *y) {
  const kdrt_io *l = &p->labels[j];
  int64_t yn = prod(l->rank, l->shape);
  uint64_t stream = STREAM_DATA_Y + (uint64_t)j;
  int64_t classes = l->num_classes > 0 ? l->num_classes : yn;
  int64_t cls = (int64_t)(kdrt_uniform(seed, stream, 0, (uint64_t)sample) * (float)classes);
  if (cls >= classes) cls = classes - 1;
  for (int64_t i = 0; i < yn; i++) {
    uint64_t g = (uint64_t)(sample * yn + i);
    switch (l->label_kind) {
    case KDRT_LABEL_ONEHOT: y[i] = i == cls ? 1.0f : 0.0f; break;
    case KDRT_LABEL_CLASSID: y[i] = (float)cls; break;
    case KDRT_LABEL_BINARY: y[i] = kdrt_uniform(seed, stream, 1, g) < 0.5f ? 0.0f : 1.0f; break;
    case KDRT_LABEL_WEIGHT: y[i] = 1.0f; break; // sample weights: none
    default: y[i] = kdrt_normal(seed, stream, 0, g); break;
    }
  }
}

void kdrt_shuffle(uint64_t seed, int64_t epoch, int64_t *idx, int64_t n) {
  for (int64_t i = 0; i < n; i++) idx[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    float u = kdrt_uniform(seed, STREAM_SHUFFLE, (uint64_t)epoch, (uint64_t)i);
    int64_t j = (int64_t)(u * (double)(i + 1));
    if (j > i) j = i;
    int64_t t = idx[i];
    idx[i] = idx[j], idx[j] = t;
  }
}
