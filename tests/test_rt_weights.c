// runtime/weights.c without MPI: Keras's group names, block placement,
// and .weights.h5 written then read back, whole and per block, with the
// errors a file for another model gives (tests/sh/keras_weights.sh checks
// the same files against real Keras); weights that are not finite are not
// written; damage is found: a flipped byte by the CRC-32 kdcc stores with
// every dataset, a damaged .keras archive said in words, and a member too
// large to inflate refused.
// memmem: -D_GNU_SOURCE (RCFLAGS)
#include <criterion/criterion.h>
#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zip.h>

#include "kdrt.h"

// ---------------------------------------------------------------- naming

Test(weights, snake_case_as_keras) {
  // Pairs printed by keras.src.utils.naming.to_snake_case (Keras 3.15).
  static const char *pairs[][2] = {
    {"Dense", "dense"}, {"Conv2D", "conv2d"}, {"MaxPooling2D", "max_pooling2d"},
    {"InputLayer", "input_layer"}, {"BatchNormalization", "batch_normalization"},
    {"GlobalAveragePooling2D", "global_average_pooling2d"},
    {"Conv2DTranspose", "conv2d_transpose"}, {"ReLU", "re_lu"}, {"PReLU", "p_re_lu"},
    {"LSTM", "lstm"}, {"MultiHeadAttention", "multi_head_attention"},
    {"UpSampling2D", "up_sampling2d"}, {"ABcDe", "a_bc_de"}, {"My-Layer.X", "my_layer_x"},
    {"SimpleRNN", "simple_rnn"}, {"HTTPServer", "http_server"}, {"aBC", "a_bc"},
  };
  char buf[64];
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    kdrt_snake_case(pairs[i][0], buf, sizeof buf);
    cr_expect_str_eq(buf, pairs[i][1], "%s", pairs[i][0]);
  }
}

// A (2,2) mesh ("data", "model"): d1 Dense without bias split over model,
// c Conv2D, d2 Dense with bias, d3 Dense; the Dense groups count 0, 1, 2
// across the Conv2D between them.
static const int mesh_shape[] = {2, 2};
static const char *const mesh_axes[] = {"data", "model"};
static const kdrt_var vars[] = {
  {"d1/kernel", "d1", "Dense", 0, {2, {4, 6}, {-1, 1}}, 0, 16, 0, 0, 12, NULL, NULL, NULL, 0},
  {"c/kernel", "c", "Conv2D", 0, {4, {1, 1, 2, 2}, {-1, -1, -1, -1}}, 16, 16, 0, 16, 4, NULL, NULL, NULL, 0},
  {"c/bias", "c", "Conv2D", 1, {1, {2}, {-1}}, 32, 16, 0, 32, 2, NULL, NULL, NULL, 0},
  {"d2/kernel", "d2", "Dense", 0, {2, {6, 2}, {0, -1}}, 48, 16, 0, 48, 6, NULL, NULL, NULL, 0},
  {"d2/bias", "d2", "Dense", 1, {1, {2}, {-1}}, 64, 16, 0, 64, 2, NULL, NULL, NULL, 0},
  {"d3/kernel", "d3", "Dense", 0, {2, {2, 2}, {1, 0}}, 80, 16, 0, 80, 1, NULL, NULL, NULL, 0},
};
static const kdrt_program prog = {
  .model_name = "m", .mesh_ndim = 2, .mesh_shape = mesh_shape, .mesh_axes = mesh_axes,
  .batch = 4, .param_floats = 96, .nvars = 6, .vars = vars,
};

Test(weights, group_names_count_by_class) {
  char buf[64];
  cr_expect_str_eq(kdrt_weights_group(&prog, "d1", buf, sizeof buf), "dense");
  cr_expect_str_eq(kdrt_weights_group(&prog, "c", buf, sizeof buf), "conv2d");
  cr_expect_str_eq(kdrt_weights_group(&prog, "d2", buf, sizeof buf), "dense_1");
  cr_expect_str_eq(kdrt_weights_group(&prog, "d3", buf, sizeof buf), "dense_2");
  cr_expect_null(kdrt_weights_group(&prog, "nope", buf, sizeof buf));
}

// Nested models: a layer's group counts within its model (kdrt_var.scope),
// a nested Dense "dense" beside the outer model's "dense".
Test(weights, group_names_in_nested_models) {
  static const kdrt_var nv[] = {
    {"bb/a/kernel", "bb/a", "Dense", 0, {2, {2, 2}, {-1, -1}}, 0, 16, 0, 0, 4, NULL, "sequential", NULL, 0},
    {"h/kernel", "h", "Dense", 0, {2, {2, 2}, {-1, -1}}, 16, 16, 0, 16, 4, NULL, NULL, NULL, 0},
    {"bb/b/kernel", "bb/b", "Dense", 0, {2, {2, 2}, {-1, -1}}, 32, 16, 0, 32, 4, NULL,
     "sequential", NULL, 0},
    {"c/kernel", "f/c", "Dense", 0, {2, {2, 2}, {-1, -1}}, 48, 16, 0, 48, 4, NULL,
     "sequential/layers/functional", NULL, 0},
  };
  kdrt_program p = prog;
  p.vars = nv;
  p.nvars = 4;
  char buf[64];
  cr_expect_str_eq(kdrt_weights_group(&p, "bb/a", buf, sizeof buf), "sequential/layers/dense");
  cr_expect_str_eq(kdrt_weights_group(&p, "h", buf, sizeof buf), "dense");
  cr_expect_str_eq(kdrt_weights_group(&p, "bb/b", buf, sizeof buf), "sequential/layers/dense_1");
  cr_expect_str_eq(kdrt_weights_group(&p, "f/c", buf, sizeof buf),
                   "sequential/layers/functional/layers/dense");
}

// ---------------------------------------------------------------- blocks

Test(weights, block_place_puts_each_rank_block) {
  kdrt_layout l = {2, {4, 6}, {0, 1}}; // [4,6] over (2,2): blocks [2,3]
  float g[24] = {0};
  for (int r = 0; r < 4; r++) {
    int coord[2] = {r / 2, r % 2};
    float block[6];
    for (int i = 0; i < 6; i++) block[i] = (float)(100 * r + i);
    kdrt_block_place(&l, mesh_shape, coord, block, g);
  }
  // row 1, col 4: rank (0,1), its block row 1, col 1 -> 100 + 4
  cr_expect_eq(g[1 * 6 + 4], 104.0f);
  // row 3, col 0: rank (1,0), block row 1, col 0 -> 200 + 3
  cr_expect_eq(g[3 * 6 + 0], 203.0f);
  cr_expect_eq(g[2 * 6 + 5], 302.0f);
}

// ---------------------------------------------------------------- files

static float globals[6][24];

static void fill_globals(void) {
  for (int v = 0; v < 6; v++)
    for (int i = 0; i < 24; i++) globals[v][i] = (float)(v * 1000 + i) / 7.0f;
}

static const char *tmpname(char *buf, size_t len, const char *suffix) {
  snprintf(buf, len, "/tmp/kdrt_test_weights_%ld%s", (long)getpid(), suffix);
  return buf;
}

Test(weights, write_then_read_blocks) {
  fill_globals();
  const float *g[6];
  for (int v = 0; v < 6; v++) g[v] = globals[v];
  char path[256], err[1024];
  tmpname(path, sizeof path, ".weights.h5");
  cr_assert_eq(kdrt_weights_write(&prog, path, g, 5, 0.01f, err, sizeof err), 0, "%s", err);
  for (int r = 0; r < 4; r++) {
    int coord[2] = {r / 2, r % 2};
    float params[96];
    memset(params, 0, sizeof params);
    cr_assert_eq(kdrt_weights_read(&prog, coord, path, params, err, sizeof err), 0, "%s", err);
    // Each variable's block, put back into a global tensor, matches there.
    for (int v = 0; v < 6; v++) {
      float back[24];
      memcpy(back, globals[v], sizeof back);
      kdrt_block_place(&vars[v].layout, mesh_shape, coord, params + vars[v].offset, back);
      cr_expect_arr_eq(back, globals[v], sizeof back, "rank %d, %s", r, vars[v].path);
    }
    // d1/kernel [4,6] split over model on dim 1: rank (x,1) holds columns 3..5.
    if (coord[1] == 1) cr_expect_eq(params[0], globals[0][3]);
  }
  unlink(path);
}

Test(weights, another_models_file_is_an_error_and_reads_nothing) {
  fill_globals();
  const float *g[6];
  for (int v = 0; v < 6; v++) g[v] = globals[v];
  char path[256], err[1024];
  tmpname(path, sizeof path, "_b.weights.h5");
  cr_assert_eq(kdrt_weights_write(&prog, path, g, 0, 0.01f, err, sizeof err), 0, "%s", err);

  // Same layers, one shape changed: d2/kernel [6,2] -> [6,4].
  kdrt_var other[6];
  memcpy(other, vars, sizeof other);
  other[3].layout.gshape[1] = 4;
  kdrt_program p2 = prog;
  p2.vars = other;
  float params[96];
  for (int i = 0; i < 96; i++) params[i] = -1.0f;
  int coord[2] = {0, 0};
  cr_assert_eq(kdrt_weights_read(&p2, coord, path, params, err, sizeof err), -1);
  char want[512];
  snprintf(want, sizeof want, "%s: variable 'd2/kernel' (layers/dense_1/vars/0) has shape (6, 2) "
           "in the file, but the model's is (6, 4)", path);
  cr_expect_str_eq(err, want);
  for (int i = 0; i < 96; i++) cr_assert_eq(params[i], -1.0f, "params[%d] was overwritten", i);

  // A model with one layer less: d3's weights have no home.
  p2.vars = vars;
  p2.nvars = 5;
  cr_assert_eq(kdrt_weights_read(&p2, coord, path, params, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: layers/dense_2 (layer 'd3' in the file) holds 1 variable, but "
           "the model has no such layer: are these another model's weights?", path);
  cr_expect_str_eq(err, want);

  // A layer the file lacks: Conv2D renamed to a class the file has not.
  memcpy(other, vars, sizeof other);
  other[1].layer_class = other[2].layer_class = "Conv1D";
  p2.vars = other;
  p2.nvars = 6;
  cr_assert_eq(kdrt_weights_read(&p2, coord, path, params, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: no weights for layer 'c' (Conv1D): the file has no group "
           "layers/conv1d; it holds layers/conv2d ('c'), layers/dense ('d1'), layers/dense_1 "
           "('d2'), layers/dense_2 ('d3')", path);
  cr_expect_str_eq(err, want);
  for (int i = 0; i < 96; i++) cr_assert_eq(params[i], -1.0f, "params[%d] was overwritten", i);
  unlink(path);
}

Test(weights, unreadable_files_and_names) {
  char err[1024];
  float params[96] = {0};
  int coord[2] = {0, 0};
  cr_expect_eq(kdrt_weights_read(&prog, coord, "/nonexistent.weights.h5", params, err, sizeof err),
               -1);
  cr_expect_str_eq(err, "/nonexistent.weights.h5: cannot open weights file: No such file or "
                        "directory");
  char path[256];
  tmpname(path, sizeof path, ".txt");
  FILE *f = fopen(path, "w");
  fputs("hello, not weights\n", f);
  fclose(f);
  cr_expect_eq(kdrt_weights_read(&prog, coord, path, params, err, sizeof err), -1);
  char want[512];
  snprintf(want, sizeof want, "%s: not a .keras archive or a .weights.h5 file", path);
  cr_expect_str_eq(err, want);
  unlink(path);
  cr_expect_eq(kdrt_weights_check_path(&prog, "out.h5", err, sizeof err), -1);
  cr_expect_str_eq(err, "out.h5: the name must end in .weights.h5 or .keras, as Keras's "
                        "load_weights requires");
  cr_expect_eq(kdrt_weights_check_path(&prog, "out.keras", err, sizeof err), -1);
  cr_expect_eq(kdrt_weights_check_path(&prog, "out.weights.h5", err, sizeof err), 0);
}

Test(weights, weights_that_are_not_finite_are_not_written) {
  fill_globals();
  const float *g[6];
  for (int v = 0; v < 6; v++) g[v] = globals[v];
  globals[3][5] = NAN;
  char path[256], err[1024];
  tmpname(path, sizeof path, ".weights.h5");
  cr_assert_eq(kdrt_weights_write(&prog, path, g, 5, 0.01f, err, sizeof err), -1);
  char want[512];
  snprintf(want, sizeof want, "%s: not written: variable '%s' holds nan at element 5 (training "
           "diverged)", path, vars[3].path);
  cr_expect_str_eq(err, want);
  cr_expect_neq(access(path, F_OK), 0, "a file was written");
}

// ---------------------------------------------------------------- damage

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  cr_assert(f, "%s", path);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(*n + 1);
  cr_assert_eq(fread(b, 1, *n, f), *n);
  fclose(f);
  return b;
}

static void spit(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert(f, "%s", path);
  cr_assert_eq(fwrite(b, 1, n, f), n);
  fclose(f);
}

// A flipped byte in a variable's data: HDF5 reads it happily, the CRC-32
// kdcc stored beside it does not.
Test(weights, a_flipped_byte_fails_the_checksum) {
  fill_globals();
  const float *g[6];
  for (int v = 0; v < 6; v++) g[v] = globals[v];
  char path[256], err[1024];
  tmpname(path, sizeof path, ".weights.h5");
  cr_assert_eq(kdrt_weights_write(&prog, path, g, 5, 0.01f, err, sizeof err), 0, "%s", err);
  size_t n;
  unsigned char *b = slurp(path, &n);
  // d2/kernel's 6 x 2 floats, as stored
  unsigned char *at = memmem(b, n, globals[3], sizeof(float) * 12);
  cr_assert(at, "d2/kernel's bytes not found in the file");
  at[13] ^= 0x01;
  spit(path, b, n);
  float params[96] = {0};
  int coord[2] = {0, 0};
  cr_assert_eq(kdrt_weights_read(&prog, coord, path, params, err, sizeof err), -1);
  uint32_t good = kdrt_crc32(0, globals[3], sizeof(float) * 12);
  float bad[12];
  memcpy(bad, globals[3], sizeof bad);
  ((unsigned char *)bad)[13] ^= 0x01;
  char want[1024];
  snprintf(want, sizeof want, "%s: layers/dense_1/vars/0 (variable 'd2/kernel') fails its "
           "checksum (written with CRC-32 %08x, the data now give %08x): the file is damaged",
           path, good, kdrt_crc32(0, bad, sizeof bad));
  cr_expect_str_eq(err, want);
  free(b);
  unlink(path);
}

// The model.weights.h5 member of a .keras, zipped as Keras does (stored):
// a flipped byte, a truncated archive, a directory that lies about a size,
// a member larger than KDRT_MAX_INFLATE. Each says what is wrong, in words.
static void write_keras(const char *path, const unsigned char *h5, size_t n) {
  int zerr = 0;
  zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &zerr);
  cr_assert(z);
  zip_source_t *s = zip_source_buffer(z, h5, n, 0);
  zip_int64_t at = zip_file_add(z, "model.weights.h5", s, 0);
  cr_assert(at >= 0);
  zip_set_file_compression(z, (zip_uint64_t)at, ZIP_CM_STORE, 0);
  cr_assert_eq(zip_close(z), 0);
}

Test(weights, damaged_archives_say_what_is_wrong) {
  fill_globals();
  const float *g[6];
  for (int v = 0; v < 6; v++) g[v] = globals[v];
  char h5[256], ar[256], err[1024], want[1024];
  tmpname(h5, sizeof h5, ".weights.h5");
  tmpname(ar, sizeof ar, ".keras");
  cr_assert_eq(kdrt_weights_write(&prog, h5, g, 5, 0.01f, err, sizeof err), 0, "%s", err);
  size_t n, an;
  unsigned char *img = slurp(h5, &n);
  float params[96] = {0};
  int coord[2] = {0, 0};
  write_keras(ar, img, n);
  cr_assert_eq(kdrt_weights_read(&prog, coord, ar, params, err, sizeof err), 0, "%s", err);
  unsigned char *a = slurp(ar, &an);
  // a flipped byte in the member's data: its CRC
  unsigned char *at = memmem(a, an, globals[3], sizeof(float) * 12);
  cr_assert(at);
  at[2] ^= 0x40;
  spit(ar, a, an);
  cr_assert_eq(kdrt_weights_read(&prog, coord, ar, params, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: cannot read model.weights.h5 from the archive: the archive is "
           "damaged: a CRC check failed", ar);
  cr_expect_str_eq(err, want);
  at[2] ^= 0x40;
  // cut in half
  spit(ar, a, an / 2);
  cr_assert_eq(kdrt_weights_read(&prog, coord, ar, params, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: cannot read the archive: not a zip archive (a .keras file is "
           "one): truncated or not a .keras", ar);
  cr_expect_str_eq(err, want);
  // the central directory's size of the member, doubled
  unsigned char *cd = NULL;
  for (size_t i = 0; i + 4 <= an; i++)
    if (!memcmp(a + i, "PK\1\2", 4)) cd = a + i;
  cr_assert(cd);
  uint32_t size;
  memcpy(&size, cd + 24, 4);
  size *= 2;
  memcpy(cd + 24, &size, 4);
  spit(ar, a, an);
  cr_assert_eq(kdrt_weights_read(&prog, coord, ar, params, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: cannot read the archive: the archive is damaged: its "
           "directory does not match its contents", ar);
  cr_expect_str_eq(err, want);
  // too large to inflate here
  write_keras(ar, img, n);
  setenv("KDRT_MAX_INFLATE", "1K", 1);
  cr_assert_eq(kdrt_weights_read(&prog, coord, ar, params, err, sizeof err), -1);
  unsetenv("KDRT_MAX_INFLATE");
  snprintf(want, sizeof want, "%s: model.weights.h5 in the archive inflates to %zu bytes, more "
           "than the 1024 one rank may take (half the memory, shared by the ranks on this host; "
           "KDRT_MAX_INFLATE sets it)", ar, n);
  cr_expect_str_eq(err, want);
  free(img), free(a);
  unlink(h5), unlink(ar);
}

// ---------------------------------------------------------------- integer variables

// An adapted Normalization's variables: mean and variance (float32, split
// over model), and count, a scalar Keras keeps as an integer (int32 on
// JAX, int64 on TensorFlow; kdrt_var.dtype). Written as int32 and read
// back into its float; an int64 dataset reads too; a count a float does
// not hold exactly, or a float where an integer belongs, is an error that
// reads nothing.
static const kdrt_var nvars[] = {
  {"n/mean", "n", "Normalization", 0, {1, {4}, {1}}, 0, 16, 0, SIZE_MAX, 2, NULL, NULL, NULL,
   KDRT_F32},
  {"n/variance", "n", "Normalization", 1, {1, {4}, {1}}, 16, 16, 0, SIZE_MAX, 2, NULL, NULL, NULL,
   KDRT_F32},
  {"n/count", "n", "Normalization", 2, {0, {0}, {0}}, 32, 16, 0, SIZE_MAX, 1, NULL, NULL, NULL,
   KDRT_I32},
};

static hid_t open_dataset(const char *path, const char *ds, hid_t *file) {
  *file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  cr_assert(*file >= 0, "%s", path);
  hid_t d = H5Dopen2(*file, ds, H5P_DEFAULT);
  cr_assert(d >= 0, "%s", ds);
  return d;
}

// Replace dataset `ds` of the file with a scalar of type t holding *val.
static void rewrite_scalar(const char *path, const char *ds, hid_t t, hid_t mt, const void *val) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  cr_assert(f >= 0);
  cr_assert(H5Ldelete(f, ds, H5P_DEFAULT) >= 0);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t d = H5Dcreate2(f, ds, t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  cr_assert(d >= 0 && H5Dwrite(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, val) >= 0);
  H5Dclose(d), H5Sclose(sp), H5Fclose(f);
}

Test(weights, integer_variables_as_keras_writes_them) {
  kdrt_program p = prog;
  p.vars = nvars;
  p.nvars = 3;
  p.param_floats = 48;
  float mean[4] = {0.5f, -1, 2, 3}, var[4] = {1, 4, 0.25f, 9}, count = 1234;
  const float *g[3] = {mean, var, &count};
  char path[256], err[1024], want[1024];
  tmpname(path, sizeof path, "_int.weights.h5");
  cr_assert_eq(kdrt_weights_write(&p, path, g, 5, 0.01f, err, sizeof err), 0, "%s", err);
  // the file: count an int32 scalar, its CRC over the int32's bytes
  hid_t f, d = open_dataset(path, "layers/normalization/vars/2", &f);
  hid_t t = H5Dget_type(d);
  cr_expect_eq(H5Tget_class(t), H5T_INTEGER);
  cr_expect_eq(H5Tget_size(t), 4);
  cr_expect_eq(H5Tget_sign(t), H5T_SGN_2);
  int32_t c32 = 0;
  uint32_t crc = 0;
  cr_assert(H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, &c32) >= 0);
  cr_expect_eq(c32, 1234);
  hid_t a = H5Aopen(d, "kdcc_crc32", H5P_DEFAULT);
  cr_assert(a >= 0 && H5Aread(a, H5T_NATIVE_UINT32, &crc) >= 0);
  cr_expect_eq(crc, kdrt_crc32(0, &c32, sizeof c32));
  H5Aclose(a), H5Tclose(t), H5Dclose(d), H5Fclose(f);
  d = open_dataset(path, "layers/normalization/vars/0", &f);
  t = H5Dget_type(d);
  cr_expect_eq(H5Tget_class(t), H5T_FLOAT);
  H5Tclose(t), H5Dclose(d), H5Fclose(f);
  // read back, on the rank holding the second half of mean and variance
  int coord[2] = {0, 1};
  float params[48];
  memset(params, 0, sizeof params);
  cr_assert_eq(kdrt_weights_read(&p, coord, path, params, err, sizeof err), 0, "%s", err);
  cr_expect(params[0] == 2 && params[1] == 3 && params[16] == 0.25f && params[17] == 9);
  cr_expect_eq(params[32], 1234.0f);
  // TensorFlow's int64 (no CRC: Keras's own file)
  int64_t c64 = -77;
  rewrite_scalar(path, "layers/normalization/vars/2", H5T_STD_I64LE, H5T_NATIVE_INT64, &c64);
  cr_assert_eq(kdrt_weights_read(&p, coord, path, params, err, sizeof err), 0, "%s", err);
  cr_expect_eq(params[32], -77.0f);
  // beyond 2^24: a float would round it
  c64 = (1 << 24) + 1;
  rewrite_scalar(path, "layers/normalization/vars/2", H5T_STD_I64LE, H5T_NATIVE_INT64, &c64);
  for (int i = 0; i < 48; i++) params[i] = -1;
  cr_assert_eq(kdrt_weights_read(&p, coord, path, params, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: layers/normalization/vars/2 (variable 'n/count') holds "
           "16777217, beyond the 16777216 a float32 holds exactly, which kdrt keeps it as", path);
  cr_expect_str_eq(err, want);
  for (int i = 0; i < 48; i++) cr_assert_eq(params[i], -1.0f, "params[%d] was overwritten", i);
  // a float32 count: not what Keras writes
  rewrite_scalar(path, "layers/normalization/vars/2", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &count);
  cr_assert_eq(kdrt_weights_read(&p, coord, path, params, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: layers/normalization/vars/2 (variable 'n/count') is not an "
           "integer dataset", path);
  cr_expect_str_eq(err, want);
  unlink(path);
}
