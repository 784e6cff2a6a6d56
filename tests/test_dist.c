// Tests for dist.c: meshes, layouts, LayoutMap lookup (exact, then PCRE2
// full match), --mesh, unused-key warnings, and every diagnostic by its
// exact text.
#include <criterion/criterion.h>
#include <string.h>

#include "capture.h"
#include "kdcc.h"

static Model *seed(void) {
  return load_model("tests/good/seq_mlp.json");
}

static Dist *dist(const char *path, const char *mesh) {
  return load_dist(seed(), path, mesh);
}

static const char *lookup(Dist *d, const char *path, int rank, const int64_t *shape, bool *matched) {
  Place p;
  bool m = dist_lookup(d, path, "L", rank, shape, &p);
  if (matched)
    *matched = m;
  return place_str(&d->mesh, rank, &p);
}

static void expect_load_error(const char *path, const char *mesh, const char *err) {
  Captured c;
  IN_CHILD(c, dist(path, mesh));
  cr_assert_str_eq(c.err, err, "%s", path);
  cr_assert_eq(c.status, 1, "%s: exit status %d", path, c.status);
}

#define EXPECT_ERROR(path, msg) expect_load_error(path, NULL, path ":" msg "\n")

// A lookup in a child: the dist file, the path and its global shape.
static void expect_lookup_error(const char *file, const char *path, int rank,
                                const int64_t *shape, const char *err) {
  Captured c;
  IN_CHILD(c, lookup(dist(file, NULL), path, rank, shape, NULL));
  cr_assert_str_eq(c.err, err, "%s", file);
  cr_assert_eq(c.status, 1);
}

// ---------------------------------------------------------------- good specs

Test(dist, none) {
  Dist *d = dist(NULL, NULL);
  cr_assert_eq(d->kind, DIST_NONE);
  cr_assert_eq(d->mesh.ndim, 0);
  cr_assert_eq(d->mesh.size, 1);
  cr_assert_eq(d->batch_axis, -1);
  bool m = true;
  cr_assert_str_eq(lookup(d, "sequential/d1/kernel", 2, (int64_t[]){784, 200}, &m), "(None, None)");
  cr_assert_not(m);
}

Test(dist, model_parallel) {
  Dist *d = dist("tests/good/dist_mp.json", NULL);
  cr_assert_eq(d->kind, DIST_MODEL);
  cr_assert_str_eq(d->file, "tests/good/dist_mp.json");
  cr_assert_eq(d->mesh.ndim, 2);
  cr_assert(d->mesh.shape[0] == 2 && d->mesh.shape[1] == 4);
  cr_assert_str_eq(d->mesh.names[0], "data");
  cr_assert_str_eq(d->mesh.names[1], "model");
  cr_assert_eq(d->mesh.size, 8);
  cr_assert(d->mesh.loc.line == 3 && d->mesh.loc.col == 18);
  cr_assert_eq(d->batch_axis, 0);
  cr_assert_eq(d->nrules, 5);
  cr_assert_str_eq(d->rules[0].key, "d1/kernel");
  cr_assert(d->rules[0].loc.line == 6 && d->rules[0].loc.col == 5);
  bool m;
  cr_assert_str_eq(lookup(d, "d1/kernel", 2, (int64_t[]){784, 200}, &m), "(None, 'model')");
  cr_assert(m);
  cr_assert_str_eq(lookup(d, "d1/bias", 1, (int64_t[]){200}, &m), "('model',)");
  cr_assert_str_eq(lookup(d, "d2/output", 2, (int64_t[]){16, 10}, &m), "('data', None)");
  cr_assert_str_eq(lookup(d, "conv2d_1/kernel", 4, (int64_t[]){3, 3, 1, 32}, &m),
                   "(None, None, None, 'model')");
  cr_assert_str_eq(lookup(d, "conv2d/bias", 1, (int64_t[]){32}, &m), "('model',)");
  cr_assert(m);
  // full match: a key matching only a prefix or a suffix does not apply
  cr_assert_str_eq(lookup(d, "sequential/d1/kernel", 2, (int64_t[]){784, 200}, &m),
                   "(None, None)");
  cr_assert_not(m);
  cr_assert_str_eq(lookup(d, "conv2d/bias_2", 1, (int64_t[]){3}, &m), "(None,)");
  cr_assert_not(m);
  cr_assert_eq(d->rules[0].uses, 1);
  cr_assert_eq(d->rules[3].uses, 1);
  cr_assert_eq(d->rules[4].uses, 1);
  Place p;
  dist_lookup(d, "d1/kernel", "d1", 2, (int64_t[]){784, 200}, &p);
  cr_assert(p.axis[0] == -1 && p.axis[1] == 1 && p.partial == 0);
  cr_assert_eq(d->rules[0].uses, 2);
}

Test(dist, batch_dim_name_picks_the_axis) {
  Dist *d = dist("tests/good/dist_mp_batch.json", NULL);
  cr_assert_eq(d->batch_axis, 1);
  cr_assert_str_eq(lookup(d, "dense_3/kernel", 2, (int64_t[]){8, 4}, NULL), "(None, 'model')");
}

Test(dist, data_parallel_devices) {
  Dist *d = dist("tests/good/dist_dp_devices.json", NULL);
  cr_assert_eq(d->kind, DIST_DATA);
  cr_assert_eq(d->mesh.ndim, 1);
  cr_assert_str_eq(d->mesh.names[0], "batch");
  cr_assert(d->mesh.shape[0] == 8 && d->mesh.size == 8);
  cr_assert_eq(d->batch_axis, 0);
  cr_assert_eq(d->nrules, 0);
  bool m = true;
  cr_assert_str_eq(lookup(d, "sequential/d1/kernel", 2, (int64_t[]){784, 200}, &m), "(None, None)");
  cr_assert_not(m);
}

Test(dist, data_parallel_mesh) {
  Dist *d = dist("tests/good/dist_dp_mesh.json", NULL);
  cr_assert_eq(d->kind, DIST_DATA);
  cr_assert_eq(d->mesh.ndim, 2);
  cr_assert_str_eq(d->mesh.names[0], "replica");
  cr_assert_eq(d->mesh.size, 8);
  cr_assert_eq(d->batch_axis, 0);
}

Test(dist, embedded_in_the_model) {
  Model *m = load_model("tests/good/embedded_dist.json");
  Dist *d = load_dist(m, NULL, NULL);
  cr_assert_eq(d->kind, DIST_MODEL);
  cr_assert_str_eq(d->file, "tests/good/embedded_dist.json");
  cr_assert_str_eq(d->rules[0].loc.file, "tests/good/embedded_dist.json");
  cr_assert(d->mesh.shape[0] == 1 && d->mesh.shape[1] == 5);
  cr_assert_str_eq(lookup(d, "dense/kernel", 2, (int64_t[]){6, 5}, NULL), "(None, 'model')");
  // --distribution wins over the embedded one
  d = load_dist(m, "tests/good/dist_dp_devices.json", NULL);
  cr_assert_eq(d->kind, DIST_DATA);
}

Test(dist, mesh_override_resizes) {
  Dist *d = dist("tests/good/dist_mp.json", "data=8,model=1");
  cr_assert(d->mesh.shape[0] == 8 && d->mesh.shape[1] == 1 && d->mesh.size == 8);
  cr_assert_str_eq(lookup(d, "d2/output", 2, (int64_t[]){16, 10}, NULL), "('data', None)");
  d = dist("tests/good/dist_dp_devices.json", "batch=4");
  cr_assert(d->mesh.shape[0] == 4 && d->mesh.size == 4);
}

// Axis names of any length (a 300-character one overflowed a buffer of the report).
Test(dist, long_axis_names_in_the_report) {
  opt_quiet_warnings = true;
  Graph *g = compile_model("tests/good/seq_mlp.json", "tests/bad/dist_long_axis.json", NULL, 32);
  char *text;
  size_t len;
  FILE *f = open_memstream(&text, &len);
  print_report(g, f, false);
  print_graph(g, f);
  fclose(f);
  char a[301], b[301];
  memset(a, 'a', 300), memset(b, 'b', 300);
  a[300] = b[300] = 0;
  char *first = format("model 'sequential', ModelParallel on mesh (%s=2, %s=2), 4 devices, "
                       "global batch 32\n", a, b);
  cr_assert(!strncmp(text, first, strlen(first)), "%.700s", text);
  cr_assert_not_null(strstr(text, format("  all_reduce     %s ", b)));
  cr_assert_str_eq(axes_str(g, 3), format("%s,%s", a, b));
}

Test(dist, place_str_forms) {
  Mesh mesh = {.ndim = 2, .shape = {2, 4}, .names = {"data", "model"}, .size = 8};
  Place p = place_replicated();
  cr_assert_str_eq(place_str(&mesh, 0, &p), "()");
  cr_assert_str_eq(place_str(&mesh, 1, &p), "(None,)");
  p.axis[0] = 1;
  p.axis[2] = 0;
  cr_assert_str_eq(place_str(&mesh, 3, &p), "('model', None, 'data')");
  p = place_replicated();
  p.partial = 3;
  cr_assert_str_eq(place_str(&mesh, 2, &p), "(None, None) partial('data', 'model')");
}

// ---------------------------------------------------------------- unused keys

Test(dist, unused_keys_warn_with_the_nearest_path) {
  const char *paths[] = {"sequential/d1/kernel", "sequential/d2/kernel", "sequential/d2/bias",
                         "sequential/flatten/output", "sequential/d1/output",
                         "sequential/d2/output"};
  Captured c;
  IN_CHILD(c, {
    Dist *d = dist("tests/bad/dist_unused.json", NULL);
    Place p;
    dist_lookup(d, "sequential/d1/bias", "d1", 1, (int64_t[]){200}, &p);
    dist_warn_unused(d, paths, 6);
  });
  const char *f = "tests/bad/dist_unused.json";
  cr_assert_str_eq(c.err, format(
    "%s:4:4: warning: layout key 'd1/kernel' matches no variable; did you mean "
    "'sequential/d1/kernel'?\n"
    "%s:5:4: warning: layout key 'sequential/d2/kernl' matches no variable; did you mean "
    "'sequential/d2/kernel'?\n"
    "%s:6:4: warning: layout key 'dense.*kernel' matches no variable\n"
    "%s:7:4: warning: layout key 'd2/output' matches no layer output; did you mean "
    "'sequential/d2/output'?\n", f, f, f, f));
  cr_assert_eq(c.status, 0);
}

Test(dist, regex_key_matching_a_suffix_gets_a_hint) {
  const char *paths[] = {"sequential/d1/kernel", "sequential/conv2d_1/kernel"};
  Captured c;
  IN_CHILD(c, {
    Dist *d = dist("tests/good/dist_mp.json", NULL);
    dist_warn_unused(d, paths, 2);
  });
  const char *f = "tests/good/dist_mp.json";
  cr_assert_str_eq(c.err, format(
    "%s:6:5: warning: layout key 'd1/kernel' matches no variable; did you mean "
    "'sequential/d1/kernel'?\n"
    "%s:7:5: warning: layout key 'd1/bias' matches no variable\n"
    "%s:8:5: warning: layout key 'd2/output' matches no layer output\n"
    "%s:9:5: warning: layout key 'conv2d.*kernel' matches no variable; did you mean "
    "'sequential/conv2d_1/kernel'?\n"
    "%s:10:5: warning: layout key 'conv2d.*bias' matches no variable\n", f, f, f, f, f));
}

// ---------------------------------------------------------------- bad specs

Test(bad, syntax) {
  EXPECT_ERROR("tests/bad/dist_syntax.json", "3:1: error: '}' expected near end of file");
}

Test(bad, unknown_distribution) {
  EXPECT_ERROR("tests/bad/dist_kind.json", "1:18: error: unknown distribution 'FSDP' (expected "
               "DataParallel or ModelParallel)");
}

Test(bad, mesh_lengths_differ) {
  EXPECT_ERROR("tests/bad/dist_mesh_len.json", "2:17: error: device mesh has 2 sizes in 'shape' "
               "but 1 names in 'axis_names'");
}

Test(bad, mesh_empty) {
  EXPECT_ERROR("tests/bad/dist_mesh_empty.json", "2:17: error: device mesh has no axes");
}

Test(bad, mesh_of_2_32_devices) {
  EXPECT_ERROR("tests/bad/dist_mesh_devices.json",
               "2:17: error: device mesh has more than 65536 devices");
}

Test(bad, axis_name_with_a_trigraph) { // "??/" is a backslash in ISO C
  EXPECT_ERROR("tests/bad/dist_axis_trigraph.json",
               "2:47: error: mesh axis name 'data\?\?/' holds '\?\?'; " NAME_RULE);
}

Test(bad, mesh_size_not_positive) {
  EXPECT_ERROR("tests/bad/dist_mesh_size.json",
               "2:31: error: device mesh: 'shape' entry 1 must be a positive integer");
}

Test(bad, mesh_duplicate_axis) {
  EXPECT_ERROR("tests/bad/dist_mesh_dup.json",
               "2:58: error: device mesh: axis name 'data' appears twice");
}

Test(bad, data_parallel_with_layout_map) {
  EXPECT_ERROR("tests/bad/dist_dp_layout.json",
               "3:2: error: DataParallel takes no 'layout_map' (use ModelParallel)");
}

Test(bad, data_parallel_with_mesh_and_devices) {
  EXPECT_ERROR("tests/bad/dist_dp_both.json",
               "2:57: error: give either 'device_mesh' or 'devices', not both");
}

Test(bad, model_parallel_without_mesh) {
  EXPECT_ERROR("tests/bad/dist_mp_no_mesh.json", "1:1: error: ModelParallel needs a 'device_mesh'");
}

Test(bad, unknown_batch_axis) {
  EXPECT_ERROR("tests/bad/dist_batch_axis.json", "3:20: error: batch_dim_name 'batch' is not an "
               "axis of the device mesh (axes: 'data', 'model')");
}

Test(bad, invalid_regex) {
  EXPECT_ERROR("tests/bad/dist_bad_regex.json", "5:4: error: layout key 'd2/(kernel' is not a "
               "valid regular expression: missing closing parenthesis (at offset 10)");
}

Test(bad, layout_not_a_list) {
  EXPECT_ERROR("tests/bad/dist_layout_not_list.json", "3:30: error: layout for 'd1/kernel' must "
               "be a list of mesh axis names or nulls");
}

Test(bad, layout_unknown_axis) {
  EXPECT_ERROR("tests/bad/dist_layout_axis.json", "3:37: error: layout for 'd1/kernel' names "
               "mesh axis 'modle', which the device mesh lacks (axes: 'data', 'model')");
}

Test(bad, layout_axis_twice) {
  EXPECT_ERROR("tests/bad/dist_layout_twice.json",
               "3:40: error: layout for 'd1/kernel' uses mesh axis 'model' twice");
}

Test(bad, unknown_key_warns) {
  Captured c;
  IN_CHILD(c, dist("tests/bad/dist_unknown_key.json", NULL));
  cr_assert_str_eq(c.err, "tests/bad/dist_unknown_key.json:2:2: warning: unknown key 'mesh' in "
                          "the distribution is ignored\n");
  cr_assert_eq(c.status, 0);
}

Test(bad, layout_rank) {
  expect_lookup_error("tests/bad/dist_rank.json", "d1/kernel", 2, (int64_t[]){784, 200},
                      "tests/bad/dist_rank.json:4:4: error: layer 'L': layout for 'd1/kernel' "
                      "has 1 entries but the variable has rank 2\n");
}

Test(bad, layout_rank_through_regex) {
  expect_lookup_error("tests/bad/dist_rank_regex.json", "d1/bias", 1, (int64_t[]){200},
                      "tests/bad/dist_rank_regex.json:4:4: error: layer 'L': layout for "
                      "'d1/bias' (layout key '.*/bias') has 2 entries but the variable has "
                      "rank 1\n");
}

Test(bad, layout_not_divisible) {
  expect_lookup_error("tests/bad/dist_divisible.json", "d2/kernel", 2, (int64_t[]){200, 10},
                      "tests/bad/dist_divisible.json:4:4: error: layer 'L': dimension 1 of "
                      "'d2/kernel' (size 10) is not divisible by mesh axis 'model' (size 4)\n");
}

Test(bad, layout_not_divisible_after_mesh_override) {
  Captured c;
  IN_CHILD(c, lookup(dist("tests/good/dist_mp.json", "data=1,model=8"), "d1/kernel", 2,
                     (int64_t[]){784, 100}, NULL));
  cr_assert_str_eq(c.err, "tests/good/dist_mp.json:6:5: error: layer 'L': dimension 1 of "
                          "'d1/kernel' (size 100) is not divisible by mesh axis 'model' (size 8)\n");
  cr_assert_eq(c.status, 1);
}

Test(bad, layout_ambiguous) {
  expect_lookup_error("tests/bad/dist_ambiguous.json", "d1/kernel", 2, (int64_t[]){784, 200},
                      "tests/bad/dist_ambiguous.json:4:4: error: layer 'L': 'd1/kernel' matches 2 "
                      "layout keys: 'd1/.*', '.*/kernel'\n");
}

Test(bad, exact_key_beats_regexes) {
  bool m;
  Dist *d = dist("tests/bad/dist_ambiguous.json", NULL);
  cr_assert_str_eq(lookup(d, "d2/kernel", 2, (int64_t[]){200, 10}, &m), "(None, None)");
  cr_assert(m);
}

// ---------------------------------------------------------------- --mesh

Test(mesh, wrong_order) {
  expect_load_error("tests/good/dist_mp.json", "model=4,data=2",
                    "kdcc: error: --mesh 'model=4,data=2': the device mesh's axes are 'data', "
                    "'model', in that order: write data=N,model=N\n");
}

Test(mesh, too_few_axes) {
  expect_load_error("tests/good/dist_mp.json", "data=8",
                    "kdcc: error: --mesh 'data=8': the device mesh's axes are 'data', 'model', "
                    "in that order: write data=N,model=N\n");
}

Test(mesh, too_many_axes) {
  expect_load_error("tests/good/dist_dp_devices.json", "batch=4,x=2",
                    "kdcc: error: --mesh 'batch=4,x=2': the device mesh's axes are 'batch', in "
                    "that order: write batch=N\n");
}

Test(mesh, bad_syntax) {
  expect_load_error("tests/good/dist_mp.json", "data=2,model=x",
                    "kdcc: error: --mesh 'data=2,model=x': expected NAME=SIZE items with positive "
                    "sizes, e.g. data=N,model=N\n");
  expect_load_error("tests/good/dist_mp.json", "data=0,model=8",
                    "kdcc: error: --mesh 'data=0,model=8': expected NAME=SIZE items with positive "
                    "sizes, e.g. data=N,model=N\n");
}

Test(mesh, without_a_distribution) {
  expect_load_error(NULL, "data=2", "kdcc: error: --mesh 'data=2': there is no device mesh to "
                    "resize (give --distribution)\n");
}

Test(mesh, too_many_devices) {
  expect_load_error("tests/good/dist_mp.json", "data=65536,model=65536",
                    "kdcc: error: --mesh 'data=65536,model=65536': the device mesh has more than "
                    "65536 devices\n");
}
