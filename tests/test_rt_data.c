// test_rt_data: data.c, the files a training program reads.
//
// - IDX headers (every type byte, big-endian dims) and what is rejected;
// - files on disk: plain and gzip'd IDX and .npy, recognised by magic;
//   truncated, over-long, empty, corrupt and truncated gzip files, each an
//   error naming the file;
// - element conversion: big-endian int16 / float32 / float64, --scale;
// - fitting to the model: images [N,28,28] for inputs [28,28,1] or [784],
//   and the errors; labels by label_kind (class ids kept, expanded to
//   one-hot, dense), ids out of range;
// - datasets: x and y counts, slices; the new options (--scale 1/255,
//   --val-x/--val-y, --test-x/--test-y).
// No MPI: nothing here calls kdrt_main.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "kdrt.h"

// ------------------------------------------------------------ helpers

static char tmpdir[64];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/test_rt_data.XXXXXX");
  cr_assert(mkdtemp(tmpdir), "mkdtemp");
}

static void remove_tmpdir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd)) {}
}

TestSuite(idx_file, .init = make_tmpdir, .fini = remove_tmpdir);
TestSuite(fit, .init = make_tmpdir, .fini = remove_tmpdir);
TestSuite(dataset, .init = make_tmpdir, .fini = remove_tmpdir);

static const char *tmp(const char *name) {
  static char buf[4][256];
  static int k;
  char *b = buf[k++ % 4];
  snprintf(b, 256, "%s/%s", tmpdir, name);
  return b;
}

// An IDX file image: header for (type, dims) then `data` (already in file order).
static size_t idx_bytes(unsigned char *buf, int type, int nd, const uint32_t *dims,
                        const void *data, size_t dlen) {
  buf[0] = buf[1] = 0, buf[2] = (unsigned char)type, buf[3] = (unsigned char)nd;
  for (int i = 0; i < nd; i++) {
    buf[4 + 4 * i] = (unsigned char)(dims[i] >> 24);
    buf[5 + 4 * i] = (unsigned char)(dims[i] >> 16);
    buf[6 + 4 * i] = (unsigned char)(dims[i] >> 8);
    buf[7 + 4 * i] = (unsigned char)dims[i];
  }
  memcpy(buf + 4 + 4 * nd, data, dlen);
  return 4 + 4 * (size_t)nd + dlen;
}

static void write_file(const char *path, const void *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert(f, "cannot write %s", path);
  cr_assert_eq(fwrite(buf, 1, n, f), n);
  fclose(f);
}

static void write_gz(const char *path, const void *buf, size_t n) {
  gzFile g = gzopen(path, "wb");
  cr_assert(g);
  cr_assert_eq(gzwrite(g, buf, (unsigned)n), (int)n);
  cr_assert_eq(gzclose(g), Z_OK);
}

static size_t file_bytes(const char *path, unsigned char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  cr_assert(f);
  size_t n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

// N images of 28x28 uint8 (pixel = sample*7 + i, mod 256) and their labels.
enum { N = 6 };
static unsigned char images[N * 28 * 28];
static unsigned char labels[N] = {3, 0, 9, 1, 1, 7};

static void write_mnist(const char *xname, const char *yname, int gz) {
  static unsigned char buf[16 + N * 28 * 28];
  for (int i = 0; i < N * 28 * 28; i++) images[i] = (unsigned char)(i * 7 + i / 784);
  uint32_t xd[3] = {N, 28, 28}, yd[1] = {N};
  size_t n = idx_bytes(buf, 0x08, 3, xd, images, sizeof images);
  (gz ? write_gz : write_file)(tmp(xname), buf, n);
  n = idx_bytes(buf, 0x08, 1, yd, labels, sizeof labels);
  (gz ? write_gz : write_file)(tmp(yname), buf, n);
}

// A program with only what data.c reads: one input and one label (their
// descriptions in a ring of static slots, so programs outlive the call).
static kdrt_program prog_of(int x_rank, const int64_t *x_shape, int label_kind, int classes) {
  static kdrt_io ios[32][2];
  static int next;
  kdrt_io *io = ios[next++ % 32];
  memset(io, 0, 2 * sizeof *io);
  io[0].name = "x";
  io[0].dtype = KDRT_F32;
  io[0].rank = x_rank;
  memcpy(io[0].shape, x_shape, sizeof(int64_t) * (size_t)x_rank);
  io[1].name = "y";
  io[1].label_kind = label_kind;
  io[1].num_classes = classes;
  if (label_kind == KDRT_LABEL_ONEHOT || label_kind == KDRT_LABEL_DENSE)
    io[1].rank = 1, io[1].shape[0] = classes;
  kdrt_program p;
  memset(&p, 0, sizeof p);
  p.ninputs = 1, p.inputs = &io[0];
  p.nlabels = 1, p.labels = &io[1];
  return p;
}

static const int64_t IMG[3] = {28, 28, 1}, FLAT[1] = {784};

// ------------------------------------------------------------ IDX headers

Test(idx, parses_mnist_headers) {
  unsigned char buf[64];
  char err[256];
  kdrt_array_header h;
  uint32_t d3[3] = {60000, 28, 28}, d1[1] = {60000};
  size_t n = idx_bytes(buf, 0x08, 3, d3, "", 0);
  cr_assert_eq(n, 16);
  cr_assert_eq(kdrt_idx_parse(buf, n, &h, err, sizeof err), 0, "%s", err);
  cr_assert(h.kind == 'u' && h.size == 1 && !h.big_endian);
  cr_assert(h.ndim == 3 && h.shape[0] == 60000 && h.shape[1] == 28 && h.shape[2] == 28);
  cr_assert_eq(h.data_offset, 16);
  cr_assert_eq(buf[2] << 8 | buf[3], 0x0803);
  n = idx_bytes(buf, 0x08, 1, d1, "", 0);
  cr_assert_eq(kdrt_idx_parse(buf, n, &h, err, sizeof err), 0, "%s", err);
  cr_assert(h.ndim == 1 && h.shape[0] == 60000 && h.data_offset == 8);
  // dims are big-endian uint32: 0x01020304
  uint32_t big[2] = {0x01020304u, 2};
  n = idx_bytes(buf, 0x08, 2, big, "", 0);
  cr_assert_eq(kdrt_idx_parse(buf, n, &h, err, sizeof err), 0, "%s", err);
  cr_assert_eq(h.shape[0], 0x01020304);
}

Test(idx, knows_every_type_byte) {
  static const struct { int type; char kind; int size; } t[] = {
      {0x08, 'u', 1}, {0x09, 'i', 1}, {0x0B, 'i', 2}, {0x0C, 'i', 4}, {0x0D, 'f', 4},
      {0x0E, 'f', 8}};
  unsigned char buf[64];
  char err[256];
  kdrt_array_header h;
  uint32_t d[1] = {5};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    size_t n = idx_bytes(buf, t[i].type, 1, d, "", 0);
    cr_assert_eq(kdrt_idx_parse(buf, n, &h, err, sizeof err), 0, "%s", err);
    cr_assert(h.kind == t[i].kind && h.size == t[i].size, "type 0x%02x", t[i].type);
    cr_assert_eq(h.big_endian, t[i].size > 1);
  }
}

Test(idx, rejects_bad_headers) {
  unsigned char buf[64];
  char err[256];
  kdrt_array_header h;
  uint32_t d[3] = {2, 28, 28};
  size_t n = idx_bytes(buf, 0x07, 3, d, "", 0);
  cr_assert_eq(kdrt_idx_parse(buf, n, &h, err, sizeof err), -1);
  cr_assert_str_eq(err, "IDX type byte 0x07 is not one of 0x08 (uint8), 0x09 (int8), 0x0B "
                        "(int16), 0x0C (int32), 0x0D (float32), 0x0E (float64)");
  n = idx_bytes(buf, 0x08, 0, d, "", 0);
  cr_assert_eq(kdrt_idx_parse(buf, n, &h, err, sizeof err), -1);
  cr_assert_str_eq(err, "IDX header has 0 dimensions (1 to 8 are supported)");
  n = idx_bytes(buf, 0x08, 3, d, "", 0);
  cr_assert_eq(kdrt_idx_parse(buf, 10, &h, err, sizeof err), -1);
  cr_assert_str_eq(err, "truncated IDX header: 3 dimensions need 16 bytes, the file has 10");
  buf[0] = 1;
  cr_assert_eq(kdrt_idx_parse(buf, n, &h, err, sizeof err), -1);
  cr_assert(strstr(err, "not an IDX file"), "%s", err);
  cr_assert_eq(kdrt_idx_parse(buf, 3, &h, err, sizeof err), -1);
}

// ------------------------------------------------------------ files

Test(idx_file, reads_plain_and_gzip_alike) {
  char err[512];
  write_mnist("x.idx", "y.idx", 0);
  write_mnist("x.idx.gz", "y.idx.gz", 1);
  kdrt_array a, b;
  cr_assert_eq(kdrt_array_open(&a, tmp("x.idx"), err, sizeof err), 0, "%s", err);
  cr_assert_eq(kdrt_array_open(&b, tmp("x.idx.gz"), err, sizeof err), 0, "%s", err);
  cr_assert_str_eq(a.format, "IDX");
  cr_assert_str_eq(b.format, "gzip'd IDX");
  cr_assert(a.map && !a.buf && b.buf && !b.map, "plain is mapped, gzip is in memory");
  cr_assert(a.n == N && a.row == 784 && b.n == N && b.row == 784);
  static float ra[784], rb[784];
  for (int s = 0; s < N; s++) {
    kdrt_array_row(&a, s, 1.0 / 255, ra);
    kdrt_array_row(&b, s, 1.0 / 255, rb);
    cr_assert_arr_eq(ra, rb, sizeof ra);
    for (int i = 0; i < 784; i++)
      cr_assert_float_eq(ra[i], images[s * 784 + i] / 255.0f, 1e-7);
  }
  kdrt_array_close(&a);
  kdrt_array_close(&b);
  // The name does not matter: a gzip'd file without .gz, a plain one with it.
  unsigned char gz[8192];
  size_t n = file_bytes(tmp("y.idx.gz"), gz, sizeof gz);
  write_file(tmp("labels.bin"), gz, n);
  cr_assert_eq(kdrt_array_open(&a, tmp("labels.bin"), err, sizeof err), 0, "%s", err);
  cr_assert(a.n == N && a.row == 1 && a.buf);
  kdrt_array_close(&a);
}

Test(idx_file, converts_big_endian_elements) {
  char err[512];
  unsigned char buf[128];
  kdrt_array a;
  float out[3];
  // int16 [1, 3]: -2, 300, 7
  unsigned char i16[6] = {0xff, 0xfe, 0x01, 0x2c, 0x00, 0x07};
  uint32_t d[2] = {1, 3};
  write_file(tmp("i16"), buf, idx_bytes(buf, 0x0B, 2, d, i16, sizeof i16));
  cr_assert_eq(kdrt_array_open(&a, tmp("i16"), err, sizeof err), 0, "%s", err);
  kdrt_array_row(&a, 0, 0.5, out);
  cr_assert(out[0] == -1.0f && out[1] == 150.0f && out[2] == 3.5f, "%g %g %g", out[0], out[1],
            out[2]);
  kdrt_array_close(&a);
  // float32 [1, 3]: 1.5, -2, 0.25 (big-endian bytes)
  unsigned char f32[12] = {0x3f, 0xc0, 0, 0, 0xc0, 0, 0, 0, 0x3e, 0x80, 0, 0};
  write_file(tmp("f32"), buf, idx_bytes(buf, 0x0D, 2, d, f32, sizeof f32));
  cr_assert_eq(kdrt_array_open(&a, tmp("f32"), err, sizeof err), 0, "%s", err);
  kdrt_array_row(&a, 0, 1.0, out);
  cr_assert(out[0] == 1.5f && out[1] == -2.0f && out[2] == 0.25f);
  kdrt_array_close(&a);
  // float64 [1, 1]: 3.0; int32 [1, 1]: -5; int8 [1, 1]: -3
  unsigned char f64[8] = {0x40, 0x08, 0, 0, 0, 0, 0, 0}, i32[4] = {0xff, 0xff, 0xff, 0xfb},
                i8[1] = {0xfd};
  uint32_t d1[2] = {1, 1};
  write_file(tmp("f64"), buf, idx_bytes(buf, 0x0E, 2, d1, f64, 8));
  cr_assert_eq(kdrt_array_open(&a, tmp("f64"), err, sizeof err), 0, "%s", err);
  kdrt_array_row(&a, 0, 1.0, out);
  cr_assert_eq(out[0], 3.0f);
  kdrt_array_close(&a);
  write_file(tmp("i32"), buf, idx_bytes(buf, 0x0C, 2, d1, i32, 4));
  cr_assert_eq(kdrt_array_open(&a, tmp("i32"), err, sizeof err), 0, "%s", err);
  kdrt_array_row(&a, 0, 1.0, out);
  cr_assert_eq(out[0], -5.0f);
  kdrt_array_close(&a);
  write_file(tmp("i8"), buf, idx_bytes(buf, 0x09, 2, d1, i8, 1));
  cr_assert_eq(kdrt_array_open(&a, tmp("i8"), err, sizeof err), 0, "%s", err);
  kdrt_array_row(&a, 0, 1.0, out);
  cr_assert_eq(out[0], -3.0f);
  kdrt_array_close(&a);
}

Test(idx_file, truncated_and_overlong_files_are_errors) {
  char err[512], want[512];
  static unsigned char buf[16 + N * 784 + 16];
  uint32_t d[3] = {N, 28, 28};
  size_t n = idx_bytes(buf, 0x08, 3, d, images, sizeof images);
  kdrt_array a;
  write_file(tmp("short"), buf, n - 100);
  cr_assert_eq(kdrt_array_open(&a, tmp("short"), err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: file is truncated: 4604 bytes of data, but IDX of uint8 "
                              "shape (6, 28, 28) needs 4704", tmp("short"));
  cr_assert_str_eq(err, want);
  write_gz(tmp("short.gz"), buf, n - 100);
  cr_assert_eq(kdrt_array_open(&a, tmp("short.gz"), err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: file is truncated: 4604 bytes of data, but gzip'd IDX of "
                              "uint8 shape (6, 28, 28) needs 4704", tmp("short.gz"));
  cr_assert_str_eq(err, want);
  write_file(tmp("long"), buf, n + 16); // 16 bytes of whatever follows
  cr_assert_eq(kdrt_array_open(&a, tmp("long"), err, sizeof err), -1);
  cr_assert(strstr(err, "4720 bytes of data, but IDX uint8 shape (6, 28, 28) needs exactly 4704"),
            "%s", err);
  // The header cut short.
  write_file(tmp("hdr"), buf, 9);
  cr_assert_eq(kdrt_array_open(&a, tmp("hdr"), err, sizeof err), -1);
  snprintf(want, sizeof want,
           "%s: truncated IDX header: 3 dimensions need 16 bytes, the file has 9", tmp("hdr"));
  cr_assert_str_eq(err, want);
}

Test(idx_file, damaged_gzip_is_an_error) {
  char err[512];
  write_mnist("x.gz", "y.gz", 1);
  static unsigned char gz[16384];
  size_t n = file_bytes(tmp("x.gz"), gz, sizeof gz);
  cr_assert(n > 100 && n < sizeof gz);
  kdrt_array a;
  // Cut off the end: zlib reports an unexpected end of file.
  write_file(tmp("cut.gz"), gz, n / 2);
  cr_assert_eq(kdrt_array_open(&a, tmp("cut.gz"), err, sizeof err), -1);
  cr_assert(strstr(err, "cut.gz: gzip data is truncated"), "%s", err);
  // Only the trailer (CRC, length) missing.
  write_file(tmp("notrailer.gz"), gz, n - 8);
  cr_assert_eq(kdrt_array_open(&a, tmp("notrailer.gz"), err, sizeof err), -1);
  cr_assert(strstr(err, "notrailer.gz: gzip data is truncated"), "%s", err);
  // A flipped byte in the CRC: corrupt, in zlib's own words (read before
  // gzclose frees them).
  gz[n - 6] ^= 0x55;
  write_file(tmp("crc.gz"), gz, n);
  cr_assert_eq(kdrt_array_open(&a, tmp("crc.gz"), err, sizeof err), -1);
  char want[600];
  snprintf(want, sizeof want, "%s: corrupt gzip data (incorrect data check)", tmp("crc.gz"));
  cr_assert_str_eq(err, want);
  gz[n - 6] ^= 0x55;
  cr_assert_eq(kdrt_array_open(&a, tmp("x.gz"), err, sizeof err), 0, "%s", err);
  kdrt_array_close(&a);
  write_file(tmp("cut2.gz"), gz, n / 2);
  cr_assert_eq(kdrt_array_open(&a, tmp("cut2.gz"), err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: gzip data is truncated (unexpected end of file)", tmp("cut2.gz"));
  cr_assert_str_eq(err, want);
  // Garbage after the gzip magic.
  unsigned char junk[64] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  for (int i = 10; i < 64; i++) junk[i] = (unsigned char)(i * 37);
  write_file(tmp("junk.gz"), junk, sizeof junk);
  cr_assert_eq(kdrt_array_open(&a, tmp("junk.gz"), err, sizeof err), -1);
  cr_assert(strstr(err, "junk.gz: "), "%s", err);
  cr_assert(strstr(err, "gzip"), "%s", err);
}

Test(idx_file, unknown_and_missing_files_are_errors) {
  char err[512], want[512];
  kdrt_array a;
  write_file(tmp("zip"), "PK\3\4 not data", 14);
  cr_assert_eq(kdrt_array_open(&a, tmp("zip"), err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: not a .npy or IDX file (it starts with 50 4b 03 04 20 6e; "
                              ".npy starts with 93 4e 55 4d 50 59 (\\x93NUMPY), IDX with 00 00, "
                              "gzip with 1f 8b)", tmp("zip"));
  cr_assert_str_eq(err, want);
  write_file(tmp("empty"), "", 0);
  cr_assert_eq(kdrt_array_open(&a, tmp("empty"), err, sizeof err), -1);
  cr_assert(strstr(err, "it starts with nothing, it is empty"), "%s", err);
  write_gz(tmp("zip.gz"), "PK\3\4 not data", 14);
  cr_assert_eq(kdrt_array_open(&a, tmp("zip.gz"), err, sizeof err), -1);
  cr_assert(strstr(err, "not a .npy or IDX file inside the gzip"), "%s", err);
  cr_assert_eq(kdrt_array_open(&a, tmp("none"), err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: cannot open: No such file or directory", tmp("none"));
  cr_assert_str_eq(err, want);
  cr_assert_eq(kdrt_array_open(&a, tmpdir, err, sizeof err), -1);
  cr_assert(strstr(err, "not a regular file"), "%s", err);
}

Test(idx_file, reads_npy_plain_and_gzip) {
  // float32 (2, 3) = 0..5; the header padded to 64 bytes as numpy does.
  unsigned char buf[256];
  const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  size_t dl = strlen(d), total = (10 + dl + 1 + 63) / 64 * 64, hlen = total - 10;
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = (unsigned char)hlen, buf[9] = 0;
  memcpy(buf + 10, d, dl);
  memset(buf + 10 + dl, ' ', hlen - dl - 1);
  buf[total - 1] = '\n';
  float v[6] = {0, 1, 2, 3, 4, 5};
  memcpy(buf + total, v, sizeof v);
  write_file(tmp("a.npy"), buf, total + sizeof v);
  write_gz(tmp("a.npy.gz"), buf, total + sizeof v);
  char err[512];
  kdrt_array a;
  float out[3];
  cr_assert_eq(kdrt_array_open(&a, tmp("a.npy"), err, sizeof err), 0, "%s", err);
  cr_assert_str_eq(a.format, ".npy");
  kdrt_array_row(&a, 1, 1.0, out);
  cr_assert(out[0] == 3 && out[1] == 4 && out[2] == 5);
  kdrt_array_close(&a);
  cr_assert_eq(kdrt_array_open(&a, tmp("a.npy.gz"), err, sizeof err), 0, "%s", err);
  cr_assert_str_eq(a.format, "gzip'd .npy");
  kdrt_array_row(&a, 1, 2.0, out);
  cr_assert(out[0] == 6 && out[1] == 8 && out[2] == 10);
  kdrt_array_close(&a);
  write_file(tmp("t.npy"), buf, total + 20);
  cr_assert_eq(kdrt_array_open(&a, tmp("t.npy"), err, sizeof err), -1);
  cr_assert(strstr(err, "t.npy: file is truncated: 20 bytes of data, but .npy of float32 shape "
                        "(2, 3) needs 24"), "%s", err);
}

// ------------------------------------------------------------ fitting to the model

Test(fit, images_fit_any_input_of_784) {
  char err[512], want[512];
  write_mnist("x", "y", 0);
  kdrt_array a;
  cr_assert_eq(kdrt_array_open(&a, tmp("x"), err, sizeof err), 0, "%s", err);
  kdrt_program img = prog_of(3, IMG, KDRT_LABEL_CLASSID, 10);
  kdrt_program flat = prog_of(1, FLAT, KDRT_LABEL_CLASSID, 10);
  cr_assert_eq(kdrt_fit_inputs(&a, &img, 0, err, sizeof err), 0, "%s", err);
  cr_assert_eq(kdrt_fit_inputs(&a, &flat, 0, err, sizeof err), 0, "%s", err);
  static const int64_t big[3] = {32, 32, 1};
  kdrt_program cifar = prog_of(3, big, KDRT_LABEL_CLASSID, 10);
  cr_assert_eq(kdrt_fit_inputs(&a, &cifar, 0, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: shape (6, 28, 28) does not fit the model's input (N, 32, 32, "
                              "1): a sample has 784 elements, the model's input 1024", tmp("x"));
  cr_assert_str_eq(err, want);
  kdrt_array_close(&a);
}

Test(fit, labels_follow_the_label_kind) {
  char err[512], want[512];
  write_mnist("x", "y", 0);
  kdrt_array y, x;
  cr_assert_eq(kdrt_array_open(&y, tmp("y"), err, sizeof err), 0, "%s", err);
  cr_assert_eq(kdrt_array_open(&x, tmp("x"), err, sizeof err), 0, "%s", err);
  int conv;
  float out[10];
  // sparse: ids stay ids
  kdrt_program sparse = prog_of(3, IMG, KDRT_LABEL_CLASSID, 10);
  cr_assert_eq(kdrt_fit_labels(&y, &sparse, 0, &conv, err, sizeof err), 0, "%s", err);
  cr_assert_eq(conv, KDRT_LABELS_IDS);
  for (int s = 0; s < N; s++) {
    kdrt_label_row(&y, conv, 10, s, out);
    cr_assert_eq(out[0], (float)labels[s]);
  }
  cr_assert_eq(kdrt_fit_labels(&x, &sparse, 0, &conv, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: shape (6, 28, 28) does not fit the model's labels: expected "
                              "class ids (N,) or (N, 1), as the loss is a sparse one",
           tmp("x"));
  cr_assert_str_eq(err, want);
  // one-hot: ids expand to rows of num_classes
  kdrt_program onehot = prog_of(3, IMG, KDRT_LABEL_ONEHOT, 10);
  cr_assert_eq(kdrt_fit_labels(&y, &onehot, 0, &conv, err, sizeof err), 0, "%s", err);
  cr_assert_eq(conv, KDRT_LABELS_ONEHOT);
  for (int s = 0; s < N; s++) {
    kdrt_label_row(&y, conv, 10, s, out);
    for (int k = 0; k < 10; k++) cr_assert_eq(out[k], k == labels[s] ? 1.0f : 0.0f);
  }
  // dense: 10 numbers a sample wanted, one given
  kdrt_program dense = prog_of(3, IMG, KDRT_LABEL_DENSE, 10);
  cr_assert_eq(kdrt_fit_labels(&y, &dense, 0, &conv, err, sizeof err), -1);
  snprintf(want, sizeof want,
           "%s: shape (6,) does not fit the model's labels: expected (N, 10)", tmp("y"));
  cr_assert_str_eq(err, want);
  // a class id out of range, for either kind
  kdrt_program five = prog_of(3, IMG, KDRT_LABEL_CLASSID, 5);
  cr_assert_eq(kdrt_fit_labels(&y, &five, 0, &conv, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: label 9 of sample 2 is not a class id in [0, 5)", tmp("y"));
  cr_assert_str_eq(err, want);
  kdrt_program onehot5 = prog_of(3, IMG, KDRT_LABEL_ONEHOT, 5);
  cr_assert_eq(kdrt_fit_labels(&y, &onehot5, 0, &conv, err, sizeof err), -1);
  cr_assert_str_eq(err, want);
  kdrt_array_close(&y);
  kdrt_array_close(&x);
}

Test(fit, one_hot_files_and_dense_labels_are_copied) {
  char err[512];
  unsigned char buf[256];
  // float32 (2, 3) labels in IDX, big-endian: rows (0,1,0) and (0.5,0,0.5)
  unsigned char f[24] = {0, 0, 0, 0, 0x3f, 0x80, 0, 0, 0, 0, 0, 0,
                         0x3f, 0, 0, 0, 0, 0, 0, 0, 0x3f, 0, 0, 0};
  uint32_t d[2] = {2, 3};
  write_file(tmp("y3"), buf, idx_bytes(buf, 0x0D, 2, d, f, sizeof f));
  kdrt_array y;
  cr_assert_eq(kdrt_array_open(&y, tmp("y3"), err, sizeof err), 0, "%s", err);
  int conv;
  float out[3];
  kdrt_program onehot = prog_of(3, IMG, KDRT_LABEL_ONEHOT, 3);
  cr_assert_eq(kdrt_fit_labels(&y, &onehot, 0, &conv, err, sizeof err), 0, "%s", err);
  cr_assert_eq(conv, KDRT_LABELS_COPY);
  kdrt_label_row(&y, conv, 3, 1, out);
  cr_assert(out[0] == 0.5f && out[1] == 0 && out[2] == 0.5f);
  kdrt_program dense = prog_of(3, IMG, KDRT_LABEL_DENSE, 3);
  cr_assert_eq(kdrt_fit_labels(&y, &dense, 0, &conv, err, sizeof err), 0, "%s", err);
  cr_assert_eq(conv, KDRT_LABELS_COPY);
  kdrt_program four = prog_of(3, IMG, KDRT_LABEL_ONEHOT, 4);
  cr_assert_eq(kdrt_fit_labels(&y, &four, 0, &conv, err, sizeof err), -1);
  cr_assert(strstr(err, "shape (2, 3) does not fit the model's labels: expected one-hot (N, 4) "
                        "or class ids (N,)"), "%s", err);
  kdrt_array_close(&y);
}

// ------------------------------------------------------------ datasets

Test(dataset, opens_pairs_and_slices_them) {
  char err[512], want[1024];
  write_mnist("x.gz", "y.gz", 1);
  kdrt_program p = prog_of(1, FLAT, KDRT_LABEL_CLASSID, 10);
  kdrt_data d;
  char xp[256], yp[256]; // tmp() returns one static buffer
  const char *xs[1], *ys[1];
  snprintf(xp, sizeof xp, "%s", tmp("x.gz"));
  snprintf(yp, sizeof yp, "%s", tmp("y.gz"));
  xs[0] = xp, ys[0] = yp;
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 2.0, err, sizeof err), 0, "%s", err);
  cr_assert(d.n == N && d.owner);
  static float x[784];
  float y;
  void *xr[1] = {x};
  float *yr[1] = {&y};
  kdrt_data v = kdrt_data_slice(&d, 4, 2);
  cr_assert(!v.owner && v.n == 2 && v.first == 4);
  kdrt_data_sample(&v, 1, xr, yr); // sample 5
  cr_assert_eq(y, (float)labels[5]);
  for (int i = 0; i < 784; i++) cr_assert_eq(x[i], 2.0f * images[5 * 784 + i]);
  kdrt_data_close(&v);
  kdrt_data_close(&d);
  // counts that differ
  unsigned char buf[64];
  uint32_t d5[1] = {5};
  write_file(tmp("y5"), buf, idx_bytes(buf, 0x08, 1, d5, labels, 5));
  snprintf(yp, sizeof yp, "%s", tmp("y5"));
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 1.0, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s has 6 samples but %s has 5", xp, yp);
  cr_assert_str_eq(err, want);
}

// A .npy file of raw little-endian elements (descr such as '<i8').
static void write_npy(const char *path, const char *descr, int nd, const int64_t *shape,
                      const void *data, size_t bytes) {
  char h[256], dims[128] = "";
  size_t k = 0;
  for (int i = 0; i < nd; i++)
    k += (size_t)snprintf(dims + k, sizeof dims - k, "%lld,%s", (long long)shape[i],
                          i + 1 < nd ? " " : "");
  int n = snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                   descr, dims);
  int total = (10 + n + 1 + 63) / 64 * 64;
  unsigned char buf[4096];
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = (unsigned char)((total - 10) & 0xff), buf[9] = (unsigned char)((total - 10) >> 8);
  memset(buf + 10, ' ', (size_t)(total - 10));
  memcpy(buf + 10, h, (size_t)n);
  buf[total - 1] = '\n';
  memcpy(buf + total, data, bytes);
  write_file(path, buf, (size_t)total + bytes);
}

// Two inputs (float [3] and int32 ids [4] < 10) and two labels (class ids,
// dense [2]): one file each, read into rows of their dtypes.
static const kdrt_io two_in[2] = {
    {.name = "feat", .dtype = KDRT_F32, .rank = 1, .shape = {3}},
    {.name = "tok", .dtype = KDRT_I32, .rank = 1, .shape = {4}, .num_classes = 10}};
static const kdrt_io two_lab[2] = {
    {.name = "cls", .dtype = KDRT_F32, .rank = 0, .label_kind = KDRT_LABEL_CLASSID,
     .num_classes = 5},
    {.name = "reg", .dtype = KDRT_F32, .rank = 1, .shape = {2}, .label_kind = KDRT_LABEL_DENSE}};

static kdrt_program two_prog(void) {
  kdrt_program p;
  memset(&p, 0, sizeof p);
  p.ninputs = 2, p.inputs = two_in, p.nlabels = 2, p.labels = two_lab;
  return p;
}

// two_prog's four files of n samples (feat [n, 3] float32, tok [n, 4]
// int64, cls [n] uint8, reg [n, 2] float64) in the temp dir, their paths in fp.
static void write_two(int64_t n, const float *feat, const int64_t *tok, const uint8_t *cls,
                      const double *reg, char fp[4][256]) {
  int64_t s3[2] = {n, 3}, s4[2] = {n, 4}, s1[1] = {n}, s2[2] = {n, 2};
  const char *names[4] = {"feat.npy", "tok.npy", "cls.npy", "reg.npy"};
  for (int i = 0; i < 4; i++) snprintf(fp[i], 256, "%s", tmp(names[i]));
  write_npy(fp[0], "<f4", 2, s3, feat, (size_t)(n * 3) * sizeof *feat);
  write_npy(fp[1], "<i8", 2, s4, tok, (size_t)(n * 4) * sizeof *tok);
  write_npy(fp[2], "|u1", 1, s1, cls, (size_t)n);
  write_npy(fp[3], "<f8", 2, s2, reg, (size_t)(n * 2) * sizeof *reg);
}

Test(dataset, several_inputs_and_labels_int_ids) {
  char err[512], want[1024];
  float feat[4 * 3];
  int64_t tok[4 * 4];
  uint8_t cls[4] = {0, 4, 2, 1};
  double reg[4 * 2];
  for (int i = 0; i < 12; i++) feat[i] = 0.5f * (float)i;
  for (int i = 0; i < 16; i++) tok[i] = (i * 7) % 10;
  for (int i = 0; i < 8; i++) reg[i] = i - 3.25;
  int64_t s44[2] = {4, 4}, s4[1] = {4};
  char fp[4][256];
  write_two(4, feat, tok, cls, reg, fp);
  kdrt_program p = two_prog();
  const char *xs[2] = {fp[0], fp[1]}, *ys[2] = {fp[2], fp[3]};
  kdrt_data d;
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 2.0, err, sizeof err), 0, "%s", err);
  cr_assert_eq(d.n, 4);
  float xf[3], yc, yr[2];
  int32_t xi[4];
  void *xrow[2] = {xf, xi};
  float *yrow[2] = {&yc, yr};
  kdrt_data_sample(&d, 2, xrow, yrow);
  for (int i = 0; i < 3; i++) cr_assert_eq(xf[i], 2.0f * feat[2 * 3 + i]); // --scale: floats only
  for (int i = 0; i < 4; i++) cr_assert_eq(xi[i], (int32_t)tok[2 * 4 + i]);
  cr_assert_eq(yc, 2.0f);
  cr_assert(yr[0] == (float)reg[4] && yr[1] == (float)reg[5]);
  kdrt_data_close(&d);

  // An id out of range names the file, the sample and the value.
  tok[9] = 10;
  write_npy(fp[1], "<i8", 2, s44, tok, sizeof tok);
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 1.0, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: id 10 of sample 2 is not in [0, 10) (input tok)", fp[1]);
  cr_assert_str_eq(err, want);
  tok[9] = -1;
  write_npy(fp[1], "<i8", 2, s44, tok, sizeof tok);
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 1.0, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: id -1 of sample 2 is not in [0, 10) (input tok)", fp[1]);
  cr_assert_str_eq(err, want);
  // Float ids: integral values are ids, others an error.
  float ftok[16];
  for (int i = 0; i < 16; i++) ftok[i] = (float)((i * 7) % 10);
  write_npy(fp[1], "<f4", 2, s44, ftok, sizeof ftok);
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 1.0, err, sizeof err), 0, "%s", err);
  kdrt_data_sample(&d, 3, xrow, yrow);
  for (int i = 0; i < 4; i++) cr_assert_eq(xi[i], (int32_t)ftok[12 + i]);
  kdrt_data_close(&d);
  ftok[5] = 2.5f;
  write_npy(fp[1], "<f4", 2, s44, ftok, sizeof ftok);
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 1.0, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: input tok takes integer ids, but sample 1 holds 2.5", fp[1]);
  cr_assert_str_eq(err, want);
  // A label file with fewer samples than the first input: both named.
  write_npy(fp[1], "<i8", 2, s44, (int64_t[16]){0}, 16 * 8);
  int64_t s3[1] = {3};
  write_npy(fp[2], "|u1", 1, s3, cls, 3);
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 1.0, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s has 4 samples but %s has 3", fp[0], fp[2]);
  cr_assert_str_eq(err, want);
  // A wrong shape names the input among several.
  write_npy(fp[2], "|u1", 1, s4, cls, 4);
  xs[0] = fp[1], xs[1] = fp[0]; // swapped: tok (4, 4) for feat
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 1.0, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: shape (4, 4) does not fit the model's input feat (N, 3): a "
                              "sample has 4 elements, the model's input 3", fp[1]);
  cr_assert_str_eq(err, want);
}

Test(dataset, synthetic_several_inputs_cached_or_not) {
  kdrt_program p = two_prog();
  kdrt_data d;
  kdrt_data_synthetic(&d, &p, 9, 10);
  cr_assert_not_null(d.cache);
  float xf[3], yc, yr[2], xf2[3], yc2, yr2[2];
  int32_t xi[4], xi2[4];
  void *xrow[2] = {xf, xi};
  float *yrow[2] = {&yc, yr};
  kdrt_data_sample(&d, 7, xrow, yrow);
  kdrt_synthetic_input(&p, 9, 0, 7, xf2);
  kdrt_synthetic_input(&p, 9, 1, 7, xi2);
  kdrt_synthetic_label(&p, 9, 0, 7, &yc2);
  kdrt_synthetic_label(&p, 9, 1, 7, yr2);
  cr_assert_arr_eq(xf, xf2, sizeof xf);
  cr_assert_arr_eq(xi, xi2, sizeof xi);
  cr_assert(yc == yc2 && yr[0] == yr2[0] && yr[1] == yr2[1]);
  for (int i = 0; i < 4; i++) cr_assert(xi[i] >= 0 && xi[i] < 10);
  cr_assert(yc >= 0 && yc < 5 && yc == floorf(yc));
  kdrt_data_close(&d);
}

// issue 22: a backend holding a data set whole gathers rows from
// kdrt_data_records; each record must be the bytes kdrt_data_gather writes
// for its sample, files (a slice, scaled floats, int ids, one-hot-free
// labels) and synthetic alike.
static void check_records(const kdrt_data *d) {
  const kdrt_program *p = d->p;
  size_t per = kdrt_data_record_bytes(p);
  cr_assert_eq(per, (size_t)(3 + 4 + 1 + 2) * 4);
  unsigned char *rec = malloc((size_t)d->n * per);
  memset(rec, 0xa5, (size_t)d->n * per);
  kdrt_data_records(d, rec);
  const int64_t order[5] = {2, 0, 3, 1, 2};
  for (int64_t pos0 = 0; pos0 + 3 <= 5; pos0 += 2) {
    float xf[3 * 3], yc[3], yr[3 * 2];
    int32_t xi[3 * 4];
    void *x[2] = {xf, xi};
    float *y[2] = {yc, yr};
    kdrt_data_gather(d, order, pos0, 3, x, y);
    for (int i = 0; i < 3; i++) {
      const unsigned char *r = rec + (size_t)order[pos0 + i] * per;
      cr_assert_arr_eq(r, xf + 3 * i, 12);
      cr_assert_arr_eq(r + 12, xi + 4 * i, 16);
      cr_assert_arr_eq(r + 28, yc + i, 4);
      cr_assert_arr_eq(r + 32, yr + 2 * i, 8);
    }
  }
  free(rec);
}

Test(dataset, records_are_the_gathered_rows) {
  char err[512];
  float feat[5 * 3];
  int64_t tok[5 * 4];
  uint8_t cls[5] = {0, 4, 2, 1, 3};
  double reg[5 * 2];
  for (int i = 0; i < 15; i++) feat[i] = 0.25f * (float)i - 1.0f;
  for (int i = 0; i < 20; i++) tok[i] = (i * 3) % 10;
  for (int i = 0; i < 10; i++) reg[i] = 1.5 * i - 2.0;
  char fp[4][256];
  write_two(5, feat, tok, cls, reg, fp);
  kdrt_program p = two_prog();
  const char *xs[2] = {fp[0], fp[1]}, *ys[2] = {fp[2], fp[3]};
  kdrt_data d;
  cr_assert_eq(kdrt_data_open(&d, &p, xs, ys, 0.5, err, sizeof err), 0, "%s", err);
  check_records(&d);
  kdrt_data s = kdrt_data_slice(&d, 1, 4); // samples 1..4 as 0..3
  check_records(&s);
  kdrt_data_close(&d);
  kdrt_data syn;
  kdrt_data_synthetic(&syn, &p, 7, 6);
  check_records(&syn);
  kdrt_data_close(&syn);
}

static int parse(kdrt_options *o, char *err, const char *const *args) {
  char *argv[32];
  int argc = 0;
  argv[argc++] = (char *)"train";
  for (; *args; args++) argv[argc++] = (char *)*args;
  return kdrt_parse_args(argc, argv, o, err, 256);
}

Test(options, data_options) {
  kdrt_options o;
  char err[256];
  const char *none[] = {NULL};
  cr_assert_eq(parse(&o, err, none), 0, "%s", err);
  cr_assert_eq(o.scale, 1.0);
  const char *all[] = {"--x", "tx", "--y", "ty", "--val-x", "vx", "--val-y=vy", "--test-x",
                       "sx", "--test-y", "sy", "--scale", "1/255", NULL};
  cr_assert_eq(parse(&o, err, all), 0, "%s", err);
  cr_assert_str_eq(o.val_x.arg[0], "vx");
  cr_assert_str_eq(o.val_y.arg[0], "vy");
  cr_assert_str_eq(o.test_x.arg[0], "sx");
  cr_assert_str_eq(o.test_y.arg[0], "sy");
  cr_assert_float_eq(o.scale, 1.0 / 255, 1e-15);
  const char *f[] = {"--scale=0.5", NULL};
  cr_assert_eq(parse(&o, err, f), 0, "%s", err);
  cr_assert_eq(o.scale, 0.5);
  const char *frac[] = {"--scale", "1.0/255.0", NULL};
  cr_assert_eq(parse(&o, err, frac), 0, "%s", err);
  cr_assert_float_eq(o.scale, 1.0 / 255, 1e-15);
  const char *zero[] = {"--scale", "1/0", NULL};
  cr_assert_eq(parse(&o, err, zero), 2);
  cr_assert_str_eq(err, "option '--scale' wants a number or a fraction such as 1/255, got '1/0'");
  const char *half[] = {"--val-x", "vx", NULL};
  cr_assert_eq(parse(&o, err, half), 2);
  cr_assert_str_eq(err, "--val-x needs --val-y (the labels)");
  const char *half2[] = {"--test-y", "sy", NULL};
  cr_assert_eq(parse(&o, err, half2), 2);
  cr_assert_str_eq(err, "--test-y needs --test-x (the inputs)");
  const char *both[] = {"--val-x", "vx", "--val-y", "vy", "--validation-split", "0.1", NULL};
  cr_assert_eq(parse(&o, err, both), 2);
  cr_assert_str_eq(err, "--val-x and --validation-split exclude each other");
  // Repeated --x/--y, kept as typed (kdrt_resolve_files orders them).
  const char *many[] = {"--x", "a=1.npy", "--x=b=2.npy", "--y", "c.npy", "--y", "d.npy", NULL};
  cr_assert_eq(parse(&o, err, many), 0, "%s", err);
  cr_assert(o.x.n == 2 && o.y.n == 2);
  cr_assert_str_eq(o.x.arg[0], "a=1.npy");
  cr_assert_str_eq(o.x.arg[1], "b=2.npy");
  cr_assert_str_eq(o.y.arg[1], "d.npy");
}

// A gzip'd file is inflated only as far as its header promises, and only
// when that fits the bound (KDRT_MAX_INFLATE here): a small file that
// inflates hugely is refused before anything is allocated.
Test(idx_file, inflating_is_bounded) {
  char err[1024];
  kdrt_array a;
  // A .npy of (4096, 256) float32: 4 MiB of zeros, a few KiB gzip'd.
  static float zeros[4096 * 256];
  int64_t shape[2] = {4096, 256};
  write_npy(tmp("big.npy"), "<f4", 2, shape, zeros, 0); // the header alone
  unsigned char *raw = calloc(sizeof zeros + 1024, 1);
  size_t n = file_bytes(tmp("big.npy"), raw, 1024);
  write_gz(tmp("big.npy.gz"), raw, n + sizeof zeros);
  setenv("KDRT_MAX_INFLATE", "1M", 1);
  cr_assert_eq(kdrt_max_inflate(), (size_t)1 << 20);
  cr_assert_eq(kdrt_array_open(&a, tmp("big.npy.gz"), err, sizeof err), -1);
  char want[1024];
  snprintf(want, sizeof want, "%s: inflates to 4.0 MiB (its header: float32 shape (4096, 256)); "
           "every rank inflates a gzip'd file whole, and may take 1.0 MiB (half the memory, "
           "shared by the ranks on this host; KDRT_MAX_INFLATE sets it): decompress it "
           "(gunzip), so that each rank maps only its rows", tmp("big.npy.gz"));
  cr_assert_str_eq(err, want);
  setenv("KDRT_MAX_INFLATE", "8M", 1);
  cr_assert_eq(kdrt_array_open(&a, tmp("big.npy.gz"), err, sizeof err), 0, "%s", err);
  cr_assert_eq(a.n, 4096);
  kdrt_array_close(&a);
  unsetenv("KDRT_MAX_INFLATE");
  // A header that lies: (2, 2) promised, 4 MiB inflated. Read no further.
  int64_t small[2] = {2, 2};
  write_npy(tmp("lie.npy"), "<f4", 2, small, zeros, 16);
  size_t m = file_bytes(tmp("lie.npy"), raw, 1024);
  memset(raw + m, 0, sizeof zeros);
  write_gz(tmp("lie.npy.gz"), raw, m + sizeof zeros);
  cr_assert_eq(kdrt_array_open(&a, tmp("lie.npy.gz"), err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: the gzip stream holds more than the %zu bytes its header "
           "promises: a corrupt header or a wrong file", tmp("lie.npy.gz"), m);
  cr_assert_str_eq(err, want);
  free(raw);
}

// A file that is neither format: its first bytes, and never the expected
// ones as what was found.
Test(idx_file, bad_magic_says_what_it_found) {
  char err[1024];
  kdrt_array a;
  write_file(tmp("almost.npy"), "\x93NUMPX\x01\x00\x10\x00{}", 14);
  cr_assert_eq(kdrt_array_open(&a, tmp("almost.npy"), err, sizeof err), -1);
  char want[1024];
  snprintf(want, sizeof want, "%s: not a .npy or IDX file (it starts with 93 4e 55 4d 50 58; "
           ".npy starts with 93 4e 55 4d 50 59 (\\x93NUMPY), IDX with 00 00, gzip with 1f 8b)",
           tmp("almost.npy"));
  cr_assert_str_eq(err, want);
}
