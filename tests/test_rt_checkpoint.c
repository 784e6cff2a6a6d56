// test_rt_checkpoint: the file-format half of checkpoint.c, no MPI.
//
// - CRC-32 against the standard check value;
// - atomic files: the final name appears only on commit, no temporary is
//   left behind, a write error (file size limit, as a full disk would) and
//   an uncreatable file are messages naming the file;
// - a shard header: built for rank 5 of a (2, 4) mesh, formatted, parsed
//   back field for field; data offsets; names with spaces; damaged headers;
// - the MANIFEST: a round trip that keeps every double bit for bit (NaN
//   included), and a flipped byte or a cut file caught by its crc line;
// - resharding: blocks of a (2, 4)-split tensor cut into the blocks of a
//   (3, 2) split give back the global tensor exactly.
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kdrt.h"

// ------------------------------------------------------------ fixtures

static const int mesh24[2] = {2, 4};
static const char *const axes24[2] = {"data", "model"};

// kernel [784, 200] split over 'model' on dim 1, 2 slots; bias [10]
// replicated, 2 slots; a scalar with no slots.
static const kdrt_var vars3[3] = {
    {"seq/d1/kernel", "d1", "Dense", 0, {2, {784, 200}, {-1, 1}}, 0, 39200, 2, 0, 39200, NULL,
     NULL, NULL, 0},
    {"seq/d1/bias", "d1", "Dense", 1, {1, {10}, {-1}}, 117600, 16, 2, 39200, 10, NULL, NULL, NULL, 0},
    {"seq/s/scale", "s", "Scale", 0, {0, {0}, {0}}, 117648, 16, 0, 39210, 1, NULL, NULL, NULL, 0},
};

static kdrt_program prog3(void) {
  kdrt_program p;
  memset(&p, 0, sizeof p);
  p.model_name = "seq";
  p.mesh_ndim = 2;
  p.mesh_shape = mesh24;
  p.mesh_axes = axes24;
  p.nvars = 3;
  p.vars = vars3;
  return p;
}

static kdrt_ctx ctx_at(const kdrt_program *p, int rank) {
  kdrt_ctx c;
  memset(&c, 0, sizeof c);
  c.prog = p;
  c.rank = rank;
  for (int a = p->mesh_ndim - 1; a >= 0; a--) c.coord[a] = rank % p->mesh_shape[a], rank /= p->mesh_shape[a];
  return c;
}

static char *tmpdir(void) {
  static char d[64];
  snprintf(d, sizeof d, "/tmp/kdck-test-XXXXXX");
  cr_assert_not_null(mkdtemp(d));
  return d;
}

static void rm_dir(const char *d) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
  cr_assert_eq(system(cmd), 0);
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  buf[n] = 0;
  *len = (size_t)n;
  return buf;
}

// ------------------------------------------------------------ CRC-32

Test(crc, check_value) {
  cr_assert_eq(kdrt_crc32(0, "123456789", 9), 0xCBF43926u);
  uint32_t c = kdrt_crc32(0, "1234", 4);
  cr_assert_eq(kdrt_crc32(c, "56789", 5), 0xCBF43926u, "chained = whole");
  cr_assert_eq(kdrt_crc32(0, "", 0), 0u);
}

// ------------------------------------------------------------ atomic files

Test(file, appears_on_commit_only) {
  char *d = tmpdir(), path[256], tmp[4200];
  snprintf(path, sizeof path, "%s/a.bin", d);
  kdrt_ckpt_file f;
  cr_assert_eq(kdrt_ckpt_open(&f, path), 0, "%s", f.err);
  snprintf(tmp, sizeof tmp, "%s", f.tmp);
  cr_assert_eq(kdrt_ckpt_write(&f, "hello ", 6), 0);
  cr_assert_eq(kdrt_ckpt_write(&f, "world", 5), 0);
  cr_assert_neq(access(path, F_OK), 0, "the final name exists before commit");
  cr_assert_eq(access(tmp, F_OK), 0);
  cr_assert_eq(kdrt_ckpt_commit(&f), 0, "%s", f.err);
  cr_assert_neq(access(tmp, F_OK), 0, "temporary left behind");
  size_t n;
  char *got = slurp(path, &n);
  cr_assert_str_eq(got, "hello world");
  cr_assert_eq(f.size, 11);
  cr_assert_eq(f.crc, kdrt_crc32(0, "hello world", 11));
  free(got);
  rm_dir(d);
}

Test(file, cannot_create_names_the_file) {
  kdrt_ckpt_file f;
  cr_assert_eq(kdrt_ckpt_open(&f, "/nonexistent-dir/x/shard-00000.kdck"), -1);
  cr_assert_str_eq(f.err, "/nonexistent-dir/x/shard-00000.kdck: cannot create: No such file or "
                          "directory");
}

Test(file, write_error_names_the_file_and_leaves_nothing) {
  // A file size limit fails write() as a full disk would.
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit rl = {4096, 4096};
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
  char *d = tmpdir(), path[256];
  snprintf(path, sizeof path, "%s/big.kdck", d);
  static char block[8192];
  kdrt_ckpt_file f;
  cr_assert_eq(kdrt_ckpt_open(&f, path), 0);
  cr_assert_eq(kdrt_ckpt_write(&f, block, sizeof block), -1);
  cr_assert_eq(kdrt_ckpt_commit(&f), -1);
  char want[512];
  snprintf(want, sizeof want, "%s: cannot write: File too large", path);
  cr_assert_str_eq(f.err, want);
  cr_assert_neq(access(path, F_OK), 0);
  cr_assert_neq(access(f.tmp, F_OK), 0, "temporary left behind");
  rm_dir(d);
}

// ------------------------------------------------------------ shard headers

Test(header, round_trip) {
  kdrt_program p = prog3();
  kdrt_ctx c = ctx_at(&p, 5); // coords (1, 1)
  kdrt_ckpt_header h, g;
  kdrt_ckpt_header_of(&c, 40, &h);
  size_t len;
  char *text = kdrt_ckpt_header_format(&h, &len);
  cr_assert_eq(len, h.data_offset);
  cr_assert_eq(h.data_offset % 64, 0);
  cr_assert(!strncmp(text, "KDCKPT-SHARD 1 header ", 22));
  // kernel block: columns [50, 100); the var and 2 slots of 784*50 floats.
  cr_assert_eq(h.vars[0].offset, h.data_offset);
  cr_assert_eq(h.vars[1].offset, h.data_offset + 3 * 39200 * 4);
  cr_assert_eq(h.vars[2].offset, h.data_offset + 3 * 39200 * 4 + 3 * 10 * 4);
  cr_assert_eq(h.data_bytes, (3 * 39200 + 3 * 10 + 1) * 4);
  char err[256] = "";
  cr_assert_eq(kdrt_ckpt_header_parse(text, len, &g, err, sizeof err), 0, "%s", err);
  cr_assert_str_eq(g.model, "seq");
  cr_assert_eq(g.step, 40);
  cr_assert_eq(g.mesh_ndim, 2);
  cr_assert_eq(g.mesh_shape[1], 4);
  cr_assert_str_eq(g.axes[1], "model");
  cr_assert_eq(g.rank, 5);
  cr_assert_eq(g.world, 8);
  cr_assert_eq(g.coord[0], 1);
  cr_assert_eq(g.coord[1], 1);
  cr_assert_eq(g.nvars, 3);
  cr_assert_eq(g.data_offset, h.data_offset);
  cr_assert_str_eq(g.vars[0].path, "seq/d1/kernel");
  cr_assert_eq(g.vars[0].nslots, 2);
  cr_assert_eq(g.vars[0].layout.gshape[1], 200);
  cr_assert_eq(g.vars[0].layout.axis[1], 1);
  cr_assert_eq(g.vars[0].start[1], 50);
  cr_assert_eq(g.vars[0].local[1], 50);
  cr_assert_eq(g.vars[0].local[0], 784);
  cr_assert_eq(g.vars[2].layout.rank, 0);
  for (int i = 0; i < 3; i++) cr_assert_eq(g.vars[i].offset, h.vars[i].offset);
  free(text);
  kdrt_ckpt_header_free(&h);
  kdrt_ckpt_header_free(&g);
}

Test(header, names_with_spaces) {
  static const kdrt_var v[1] = {
      {"my model/d 1/kernel%", "d 1", "Dense", 0, {1, {8}, {-1}}, 0, 8, 0, 0, 8, NULL, NULL, NULL, 0}};
  kdrt_program p = prog3();
  p.model_name = "my model";
  p.vars = v;
  p.nvars = 1;
  kdrt_ctx c = ctx_at(&p, 0);
  kdrt_ckpt_header h, g;
  kdrt_ckpt_header_of(&c, 1, &h);
  size_t len;
  char *text = kdrt_ckpt_header_format(&h, &len);
  char err[256] = "";
  cr_assert_eq(kdrt_ckpt_header_parse(text, len, &g, err, sizeof err), 0, "%s", err);
  cr_assert_str_eq(g.model, "my model");
  cr_assert_str_eq(g.vars[0].path, "my model/d 1/kernel%");
  free(text);
  kdrt_ckpt_header_free(&h);
  kdrt_ckpt_header_free(&g);
}

static void header_error(const char *text, const char *want) {
  char buf[1024], err[256] = "";
  snprintf(buf, sizeof buf, "%s", text);
  kdrt_ckpt_header h;
  cr_assert_eq(kdrt_ckpt_header_parse(buf, strlen(buf), &h, err, sizeof err), -1, "%s", text);
  cr_assert_str_eq(err, want);
  kdrt_ckpt_header_free(&h);
}

Test(header, damaged) {
  header_error("PK\x03\x04 zip", "not a kdcc checkpoint shard (no KDCKPT-SHARD header)");
  header_error("KDCKPT-SHARD 2 header 000000000064\n", "shard format version 2 is not supported");
  header_error("KDCKPT-SHARD 1 header 000000000064\nmodel m\nstep 3\nmesh 1 x=2\n",
               "truncated header (no 'end' line)");
  header_error("KDCKPT-SHARD 1 header 000000000064\nmodel m\nmesh 1 x=2\nrank 0 of 2 coord 0\n"
               "vars 1\nvar a slots 0 rank 1 shape 8 axes 0 start 6 local 4 at 000000000064\nend\n",
               "variable a: block out of its shape");
  header_error("KDCKPT-SHARD 1 header 000000000064\nmodel m\nmesh 1 x=2\nrank 0 of 2 coord 0\n"
               "vars 2\nvar a slots 0 rank 1 shape 8 axes 0 start 0 local 4 at 000000000064\nend\n",
               "header lists 1 of 2 variables");
  header_error("KDCKPT-SHARD 1 header 000000000064\nmodel m\nmesh 1 x=2\nrank 0 of 2 coord 0\n"
               "vars 1\nvar a slots 0 rank 2 shape 8 axes 0 start 0 local 4 at 0\nend\n",
               "bad 'var' line 1");
}

// ------------------------------------------------------------ the manifest

Test(manifest, round_trip_bit_for_bit) {
  kdrt_ckpt_manifest m, g;
  memset(&m, 0, sizeof m);
  snprintf(m.model, sizeof m.model, "sequential");
  snprintf(m.optimizer, sizeof m.optimizer, "Adam");
  m.mesh_ndim = 2;
  m.mesh_shape[0] = 2, m.mesh_shape[1] = 4;
  snprintf(m.axes[0], 64, "data");
  snprintf(m.axes[1], 64, "model");
  double loss[2] = {1.0 / 3.0, 0.1}, metric[2] = {0.0625, 1e-300}, nan2[2] = {NAN, -0.0};
  double steps[11];
  for (int i = 0; i < 11; i++) steps[i] = 1.0 / (i + 7);
  // Two logs with awkward names (a space and a '%' travel encoded).
  static const char *const names[2] = {"loss", "out a%accuracy"};
  double sums[2] = {3.0 / 7.0, 2.5};
  const double *hist[4] = {loss, metric, nan2, nan2};
  m.st = (kdrt_ckpt_state){.step = 21, .seed = 1337, .epoch = 2, .pos = 5, .steps = 8,
                           .ntrain = 128, .nlogs = 2, .log_names = names, .sums = sums,
                           .nhist = 2, .hist = hist, .nsteps = 11, .step_loss = steps};
  m.nfiles = 2;
  m.files = calloc(2, sizeof m.files[0]);
  snprintf(m.files[0].name, 64, "shard-00000.kdck");
  snprintf(m.files[1].name, 64, "shard-00001.kdck");
  m.files[0].size = 965368, m.files[0].crc = 0xa0fcc674;
  m.files[1].size = 12, m.files[1].crc = 0x1;
  size_t len;
  char *text = kdrt_ckpt_manifest_format(&m, &len);
  char *copy = strdup(text), err[256] = "";
  cr_assert_eq(kdrt_ckpt_manifest_parse(copy, len, &g, err, sizeof err), 0, "%s\n%s", err, text);
  cr_assert_str_eq(g.model, "sequential");
  cr_assert_str_eq(g.optimizer, "Adam");
  cr_assert_eq(g.mesh_shape[1], 4);
  cr_assert_eq(g.st.step, 21);
  cr_assert_eq(g.st.seed, 1337);
  cr_assert_eq(g.st.epoch, 2);
  cr_assert_eq(g.st.pos, 5);
  cr_assert_eq(g.st.steps, 8);
  cr_assert_eq(g.st.ntrain, 128);
  cr_assert_eq(g.st.nlogs, 2);
  cr_assert_str_eq(g.st.log_names[0], "loss");
  cr_assert_str_eq(g.st.log_names[1], "out a%accuracy");
  cr_assert(!memcmp(g.st.sums, sums, sizeof sums));
  cr_assert_eq(g.st.nhist, 2);
  for (int i = 0; i < 2; i++) {
    cr_assert(!memcmp(&g.st.hist[0][i], &loss[i], sizeof(double)));
    cr_assert(!memcmp(&g.st.hist[1][i], &metric[i], sizeof(double)));
  }
  cr_assert(isnan(g.st.hist[2][0]));
  cr_assert(signbit(g.st.hist[3][1]) && g.st.hist[3][1] == 0);
  cr_assert_eq(g.st.nsteps, 11);
  for (int i = 0; i < 11; i++) cr_assert(!memcmp(&g.st.step_loss[i], &steps[i], sizeof(double)));
  cr_assert_eq(g.nfiles, 2);
  cr_assert_str_eq(g.files[1].name, "shard-00001.kdck");
  cr_assert_eq(g.files[0].size, 965368);
  cr_assert_eq(g.files[0].crc, 0xa0fcc674);
  kdrt_ckpt_manifest_free(&g);

  // One flipped byte, or a cut, and the crc line catches it.
  strcpy(copy, text);
  copy[30] ^= 1;
  cr_assert_eq(kdrt_ckpt_manifest_parse(copy, len, &g, err, sizeof err), -1);
  cr_assert_str_eq(err, "checksum mismatch");
  kdrt_ckpt_manifest_free(&g);
  strcpy(copy, text);
  cr_assert_eq(kdrt_ckpt_manifest_parse(copy, len / 2, &g, err, sizeof err), -1);
  cr_assert_str_eq(err, "does not end in its crc line (truncated or altered)");
  kdrt_ckpt_manifest_free(&g);
  cr_assert(!strstr(text, "lossscale"), "no loss scale: no line of it");
  free(copy), free(text);

  // issue 23: a loss-scaled program's scale, its count, the optimizer's
  // iterations and every step's scale come back as they were.
  double scales[11];
  for (int i = 0; i < 11; i++) scales[i] = ldexp(1, 15 - i / 4);
  m.st.has_loss_scale = 1, m.st.loss_scale = 4096, m.st.loss_scale_count = 3;
  m.st.iterations = 19, m.st.step_scale = scales;
  text = kdrt_ckpt_manifest_format(&m, &len);
  copy = strdup(text);
  cr_assert(strstr(text, "\nlossscale 0x1p+12 count 3 iterations 19\nstepscale 11\n0x1p+15 "));
  cr_assert_eq(kdrt_ckpt_manifest_parse(copy, len, &g, err, sizeof err), 0, "%s\n%s", err, text);
  cr_assert(g.st.has_loss_scale);
  cr_assert_eq(g.st.loss_scale, 4096);
  cr_assert_eq(g.st.loss_scale_count, 3);
  cr_assert_eq(g.st.iterations, 19);
  for (int i = 0; i < 11; i++) cr_assert_eq(g.st.step_scale[i], scales[i]);
  kdrt_ckpt_manifest_free(&g);
  free(copy), free(text), free(m.files);
}

// ------------------------------------------------------------ resharding

Test(reshard, blocks_of_one_split_from_another) {
  enum { R = 6, C = 8 };
  float g[R * C];
  for (int i = 0; i < R * C; i++) g[i] = (float)i;
  // Saved: rows over 2, columns over 4 -> blocks of 3 x 2.
  float saved[8][6];
  int64_t sstart[8][2], sext[2] = {3, 2};
  for (int b = 0; b < 8; b++) {
    sstart[b][0] = b / 4 * 3, sstart[b][1] = b % 4 * 2;
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 2; j++) saved[b][i * 2 + j] = g[(sstart[b][0] + i) * C + sstart[b][1] + j];
  }
  // Wanted: rows over 3, columns over 2 -> blocks of 2 x 4.
  for (int b = 0; b < 6; b++) {
    int64_t start[2] = {b / 2 * 2, b % 2 * 4}, ext[2] = {2, 4};
    float got[8];
    memset(got, 0xff, sizeof got);
    int64_t n = 0;
    for (int s = 0; s < 8; s++)
      n += kdrt_ckpt_copy_overlap(got, start, ext, saved[s], sstart[s], sext, 2);
    cr_assert_eq(n, 8, "block %d covered %lld times", b, (long long)n);
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 4; j++)
        cr_assert_eq(got[i * 4 + j], g[(start[0] + i) * C + start[1] + j]);
  }
}

Test(reshard, disjoint_and_scalar) {
  float src[4] = {1, 2, 3, 4}, dst[4] = {0};
  int64_t a[1] = {0}, b[1] = {4}, e[1] = {4};
  cr_assert_eq(kdrt_ckpt_copy_overlap(dst, a, e, src, b, e, 1), 0);
  cr_assert_eq(dst[0], 0);
  cr_assert_eq(kdrt_ckpt_copy_overlap(dst, NULL, NULL, src, NULL, NULL, 0), 1);
  cr_assert_eq(dst[0], 1);
}
