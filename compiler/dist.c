// dist.c: distribution spec -> Mesh + LayoutMap.
//
// The spec mirrors keras.distribution (see KERAS.md):
//   {"distribution": "DataParallel", "device_mesh": {"shape": [8], "axis_names": ["batch"]}}
//   {"distribution": "DataParallel", "devices": 8}          (1-D mesh, axis "batch")
//   {"distribution": "ModelParallel",
//    "device_mesh": {"shape": [2, 4], "axis_names": ["data", "model"]},
//    "batch_dim_name": "data",                             (default: the first axis)
//    "layout_map": {"d1/kernel": [null, "model"], "d2/output": ["data", null]}}
// It comes from --distribution FILE, else the model document's top-level
// "distribution", else there is none: one device, an empty mesh (ndim 0,
// size 1) and batch_axis -1. --mesh "data=2,model=4" then resizes the axes;
// it can neither rename, add nor drop one.
//
// LayoutMap lookup is Keras 3.14's: an exact key wins; otherwise every key
// is a regex (PCRE2, compiled once) that must match the whole path; two
// matches are an error, none means replicated. What can be checked without
// a tensor is checked at load (layout is a list of axis names or nulls, the
// axes exist, none twice); rank and divisibility when a path is looked up.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "kdcc.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

Place place_replicated(void) {
  Place p;
  memset(p.axis, -1, sizeof p.axis);
  p.partial = p.pmax = 0;
  return p;
}

static int mesh_axis(const Mesh *mesh, const char *name) {
  for (int i = 0; i < mesh->ndim; i++)
    if (!strcmp(mesh->names[i], name))
      return i;
  return -1;
}

// "'data', 'model'"
static char *axis_list(const Mesh *mesh) {
  char *s = "";
  for (int i = 0; i < mesh->ndim; i++)
    s = format("%s%s'%s'", s, i ? ", " : "", mesh->names[i]);
  return s;
}

char *place_str(const Mesh *mesh, int rank, const Place *p) {
  char *s = "(";
  for (int i = 0; i < rank; i++) {
    int a = p->axis[i];
    const char *name = a < 0 ? NULL : a < mesh->ndim ? mesh->names[a] : "?";
    s = name ? format("%s%s'%s'", s, i ? ", " : "", name) : format("%s%sNone", s, i ? ", " : "");
  }
  s = format("%s%s)", s, rank == 1 ? "," : "");
  if (p->partial) {
    s = format("%s partial(", s);
    bool first = true;
    for (int a = 0; a < MAX_AXES; a++)
      if (p->partial & (1u << a)) {
        s = format("%s%s'%s'", s, first ? "" : ", ", a < mesh->ndim ? mesh->names[a] : "?");
        first = false;
      }
    s = format("%s)", s);
  }
  return s;
}

// ---- loading

static void load_mesh(Mesh *mesh, json_t *v) {
  mesh->loc = jloc(v);
  if (!json_is_object(v))
    error_at(jloc(v), "'device_mesh' must be an object with 'shape' and 'axis_names'");
  json_t *shape = json_object_get(v, "shape"), *names = json_object_get(v, "axis_names");
  if (!json_is_array(shape))
    error_at(jloc_key(v, "shape"), "device mesh: 'shape' must be a list of sizes");
  if (!json_is_array(names))
    error_at(jloc_key(v, "axis_names"), "device mesh: 'axis_names' must be a list of names");
  int n = (int)json_array_size(shape);
  if (n != (int)json_array_size(names))
    error_at(mesh->loc, "device mesh has %d sizes in 'shape' but %zu names in 'axis_names'", n,
             json_array_size(names));
  if (n == 0)
    error_at(mesh->loc, "device mesh has no axes");
  if (n > MAX_AXES)
    error_at(mesh->loc, "device mesh has %d axes; at most %d are supported", n, MAX_AXES);
  mesh->ndim = n;
  mesh->size = 1;
  for (int i = 0; i < n; i++) {
    json_t *d = json_array_get(shape, (size_t)i), *a = json_array_get(names, (size_t)i);
    if (!json_is_integer(d) || json_integer_value(d) <= 0 || json_integer_value(d) > 65536)
      error_at(jloc_idx(shape, (size_t)i), "device mesh: 'shape' entry %d must be a positive integer",
               i);
    if (!json_is_string(a) || !*json_string_value(a))
      error_at(jloc_idx(names, (size_t)i), "device mesh: 'axis_names' entry %d must be a "
               "non-empty string", i);
    mesh->shape[i] = (int)json_integer_value(d);
    mesh->size_loc[i] = jloc_idx(shape, (size_t)i);
    mesh->names[i] = json_string_value(a);
    if (name_flaw(mesh->names[i]))
      error_at(jloc_idx(names, (size_t)i), "mesh axis name '%s' %s; " NAME_RULE, mesh->names[i],
               name_flaw(mesh->names[i]));
    if (mesh_axis(mesh, mesh->names[i]) != i)
      error_at(jloc_idx(names, (size_t)i), "device mesh: axis name '%s' appears twice",
               mesh->names[i]);
    if ((int64_t)mesh->size * mesh->shape[i] > 65536)
      error_at(mesh->loc, "device mesh has more than 65536 devices");
    mesh->size *= mesh->shape[i];
  }
}

// PCRE2 allocates through util.c (release_all frees its patterns too).
static void *re_alloc(PCRE2_SIZE n, void *unused) { return xcalloc(1, n); }
static void re_free(void *p, void *unused) { xfree(p); }

// A layout key's match gives up after this many steps (PCRE2's default is
// 10 million): a key that backtracks that far is an error, not a hang.
#define RE_MATCH_LIMIT 1000000

static void load_layout_map(Dist *d, json_t *lm) {
  if (!json_is_object(lm))
    error_at(jloc(lm), "'layout_map' must be an object mapping paths to layouts");
  d->rules = xcalloc(json_object_size(lm), sizeof(LayoutRule));
  pcre2_general_context *gc = pcre2_general_context_create(re_alloc, re_free, NULL);
  pcre2_compile_context *cc = pcre2_compile_context_create(gc);
  d->match_ctx = pcre2_match_context_create(gc);
  if (!gc || !cc || !d->match_ctx) error("out of memory");
  pcre2_set_match_limit(d->match_ctx, RE_MATCH_LIMIT);
  const char *key;
  json_t *val;
  json_object_foreach(lm, key, val) {
    LayoutRule *r = &d->rules[d->nrules++];
    r->key = key;
    r->val = val;
    r->loc = jloc_keyname(lm, key);
    int err;
    PCRE2_SIZE off;
    r->re = pcre2_compile((PCRE2_SPTR)key, PCRE2_ZERO_TERMINATED,
                          PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF, &err, &off, cc);
    if (!r->re) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      error_at(r->loc, "layout key '%s' is not a valid regular expression: %s (at offset %zu)",
               key, (char *)msg, (size_t)off);
    }
    if (!json_is_array(val))
      error_at(jloc(val), "layout for '%s' must be a list of mesh axis names or nulls", key);
    if (json_array_size(val) > MAX_RANK)
      error_at(jloc(val), "layout for '%s' has %zu entries; at most %d are supported", key,
               json_array_size(val), MAX_RANK);
    for (size_t i = 0; i < json_array_size(val); i++) {
      json_t *e = json_array_get(val, i);
      if (json_is_null(e))
        continue;
      if (!json_is_string(e))
        error_at(jloc_idx(val, i), "layout for '%s': entry %zu must be a mesh axis name or null",
                 key, i);
      const char *a = json_string_value(e);
      if (mesh_axis(&d->mesh, a) < 0)
        error_at(jloc_idx(val, i), "layout for '%s' names mesh axis '%s', which the device mesh "
                 "lacks (axes: %s)", key, a, axis_list(&d->mesh));
      for (size_t j = 0; j < i; j++)
        if (json_is_string(json_array_get(val, j)) &&
            !strcmp(json_string_value(json_array_get(val, j)), a))
          error_at(jloc_idx(val, i), "layout for '%s' uses mesh axis '%s' twice", key, a);
    }
  }
}

// --mesh "data=2,model=4": new sizes for the axes, same names, same order.
static void override_mesh(Mesh *mesh, const char *text) {
  char *expect = "";
  for (int i = 0; i < mesh->ndim; i++)
    expect = format("%s%s%s=N", expect, i ? "," : "", mesh->names[i]);
  if (mesh->ndim == 0)
    error("--mesh '%s': there is no device mesh to resize (give --distribution)", text);
  char *copy = xstrdup(text), *save = NULL;
  int n = 0, shape[MAX_AXES];
  for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save), n++) {
    char *eq = strchr(item, '='), *end;
    long size = eq ? strtol(eq + 1, &end, 10) : 0;
    if (!eq || eq == item || end == eq + 1 || *end || size <= 0 || size > 65536)
      error("--mesh '%s': expected NAME=SIZE items with positive sizes, e.g. %s", text, expect);
    *eq = '\0';
    if (n >= mesh->ndim || strcmp(item, mesh->names[n]) != 0)
      error("--mesh '%s': the device mesh's axes are %s, in that order: write %s", text,
            axis_list(mesh), expect);
    shape[n] = (int)size;
  }
  if (n != mesh->ndim)
    error("--mesh '%s': the device mesh's axes are %s, in that order: write %s", text,
          axis_list(mesh), expect);
  mesh->size = 1;
  for (int i = 0; i < n; i++) {
    mesh->shape[i] = shape[i];
    mesh->size_loc[i] = (Loc){0};
    if ((int64_t)mesh->size * shape[i] > 65536)
      error("--mesh '%s': the device mesh has more than 65536 devices", text);
    mesh->size *= shape[i];
  }
  xfree(copy);
}

static const char *spec_keys[] = {"distribution", "device_mesh", "devices", "batch_dim_name",
                                  "layout_map"};

static Dist *parse_dist(const char *file, json_t *root) {
  Dist *d = xcalloc(1, sizeof *d);
  d->file = file;
  d->loc = jloc(root);
  if (!json_is_object(root))
    error_at(d->loc, "a distribution must be an object with a \"distribution\" key");
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    bool known = false;
    for (size_t i = 0; i < sizeof spec_keys / sizeof *spec_keys; i++)
      known |= !strcmp(key, spec_keys[i]);
    if (!known)
      warn_at(jloc_keyname(root, key), "unknown key '%s' in the distribution is ignored", key);
  }
  json_t *kind = json_object_get(root, "distribution");
  if (!json_is_string(kind))
    error_at(jloc_key(root, "distribution"), "'distribution' must be \"DataParallel\" or "
             "\"ModelParallel\"");
  const char *k = json_string_value(kind);
  json_t *mesh = json_object_get(root, "device_mesh"), *devices = json_object_get(root, "devices");
  json_t *batch = json_object_get(root, "batch_dim_name"), *lm = json_object_get(root, "layout_map");
  if (!strcmp(k, "DataParallel")) {
    d->kind = DIST_DATA;
    if (lm)
      error_at(jloc_keyname(root, "layout_map"), "DataParallel takes no 'layout_map' (use "
               "ModelParallel)");
    if (batch)
      error_at(jloc_keyname(root, "batch_dim_name"), "DataParallel takes no 'batch_dim_name': "
               "the batch is split over the mesh's first axis");
    if (mesh && devices)
      error_at(jloc_keyname(root, "devices"), "give either 'device_mesh' or 'devices', not both");
    if (mesh) {
      load_mesh(&d->mesh, mesh);
    } else if (devices) {
      int64_t n = json_is_integer(devices) ? json_integer_value(devices)
                  : json_is_array(devices) ? (int64_t)json_array_size(devices) : 0;
      if (n <= 0 || n > 65536)
        error_at(jloc(devices), "'devices' must be a positive number of devices or a list of "
                 "devices");
      d->mesh = (Mesh){.ndim = 1, .shape = {(int)n}, .names = {"batch"}, .size = (int)n,
                       .loc = jloc(devices), .size_loc = {jloc(devices)}};
    } else {
      error_at(d->loc, "DataParallel needs 'device_mesh' or 'devices'");
    }
    d->batch_axis = 0;
  } else if (!strcmp(k, "ModelParallel")) {
    d->kind = DIST_MODEL;
    if (devices)
      error_at(jloc_keyname(root, "devices"), "ModelParallel takes its devices from "
               "'device_mesh', not 'devices'");
    if (!mesh)
      error_at(d->loc, "ModelParallel needs a 'device_mesh'");
    load_mesh(&d->mesh, mesh);
    if (!lm)
      error_at(d->loc, "ModelParallel needs a 'layout_map'");
    load_layout_map(d, lm);
    d->batch_axis = 0;
    if (batch && !json_is_null(batch)) {
      if (!json_is_string(batch))
        error_at(jloc(batch), "'batch_dim_name' must be a mesh axis name");
      d->batch_axis = mesh_axis(&d->mesh, json_string_value(batch));
      if (d->batch_axis < 0)
        error_at(jloc(batch), "batch_dim_name '%s' is not an axis of the device mesh (axes: %s)",
                 json_string_value(batch), axis_list(&d->mesh));
    }
  } else {
    error_at(jloc(kind), "unknown distribution '%s' (expected DataParallel or ModelParallel)", k);
  }
  return d;
}

Dist *load_dist(Model *m, const char *dist_path, const char *mesh_override) {
  Dist *d;
  if (dist_path) {
    d = parse_dist(dist_path, json_load_file_located(dist_path));
  } else if (m && m->dist_json) {
    d = parse_dist(m->file, m->dist_json);
  } else {
    d = xcalloc(1, sizeof *d);
    d->kind = DIST_NONE;
    d->mesh.size = 1;
    d->batch_axis = -1;
  }
  if (mesh_override)
    override_mesh(&d->mesh, mesh_override);
  return d;
}

// ---- lookup

static bool re_match(const Dist *d, LayoutRule *r, const char *path) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->re, NULL);
  if (!md) error("out of memory");
  int rc = pcre2_match(r->re, (PCRE2_SPTR)path, PCRE2_ZERO_TERMINATED, 0, 0, md, d->match_ctx);
  pcre2_match_data_free(md);
  if (rc < PCRE2_ERROR_NOMATCH) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    error_at(r->loc, "matching layout key '%s' against '%s' failed: %s", r->key, path,
             (char *)msg);
  }
  return rc >= 0;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

bool dist_lookup(Dist *d, const char *path, const char *layer, int rank, const int64_t *shape,
                 Place *out) {
  *out = place_replicated();
  if (d->kind != DIST_MODEL)
    return false;
  const char *who = layer ? format("layer '%s': ", layer) : ""; // for messages
  LayoutRule *r = NULL;
  for (int i = 0; i < d->nrules && !r; i++)
    if (!strcmp(d->rules[i].key, path))
      r = &d->rules[i];
  if (!r) {
    int nmatch = 0;
    char *keys = "";
    for (int i = 0; i < d->nrules; i++)
      if (re_match(d, &d->rules[i], path)) {
        if (!r)
          r = &d->rules[i];
        keys = format("%s%s'%s'", keys, nmatch ? ", " : "", d->rules[i].key);
        nmatch++;
      }
    if (nmatch > 1)
      error_at(r->loc, "%s'%s' matches %d layout keys: %s", who, path, nmatch, keys);
  }
  if (!r)
    return false;
  r->uses++;
  // For messages: the key, when it is a regex rather than the path itself.
  const char *via = strcmp(r->key, path) ? format(" (layout key '%s')", r->key) : "";
  const char *what = ends_with(path, "/output") ? "output" : "variable";
  int n = (int)json_array_size(r->val);
  if (n != rank)
    error_at(r->loc, "%slayout for '%s'%s has %d entries but the %s has rank %d", who, path, via,
             n, what, rank);
  for (int i = 0; i < rank; i++) {
    json_t *e = json_array_get(r->val, (size_t)i);
    if (json_is_null(e))
      continue;
    int a = mesh_axis(&d->mesh, json_string_value(e)); // checked at load
    if (shape[i] % d->mesh.shape[a] != 0)
      error_at(r->loc, "%sdimension %d of '%s' (size %lld) is not divisible by mesh axis '%s' "
               "(size %d)%s", who, i, path, (long long)shape[i], d->mesh.names[a],
               d->mesh.shape[a], via);
    out->axis[i] = (int8_t)a;
  }
  return true;
}

// ---- unused keys

static int levenshtein(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  int *row = xcalloc(m + 1, sizeof(int));
  for (size_t j = 0; j <= m; j++)
    row[j] = (int)j;
  for (size_t i = 1; i <= n; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= m; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best)
        best = up + 1;
      if (row[j - 1] + 1 < best)
        best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  int dist = row[m];
  xfree(row);
  return dist;
}

// Does the key (exactly, or as a regex) match a trailing part of `path`
// that starts after a '/'? That is the "d1/kernel" for "sequential/d1/kernel"
// mistake.
static bool matches_suffix(const Dist *d, LayoutRule *r, const char *path) {
  for (const char *p = strchr(path, '/'); p; p = strchr(p + 1, '/'))
    if (!strcmp(p + 1, r->key) || re_match(d, r, p + 1))
      return true;
  return false;
}

void dist_warn_unused(Dist *d, const char **paths, int npaths) {
  for (int i = 0; i < d->nrules; i++) {
    LayoutRule *r = &d->rules[i];
    if (r->uses)
      continue;
    const char *hint = NULL, *near = NULL;
    int best = (int)strlen(r->key) / 2 + 1; // this far or farther is no hint
    for (int j = 0; j < npaths && !hint; j++)
      if (matches_suffix(d, r, paths[j]))
        hint = paths[j];
    // Else the nearest path by edit distance, the first one on ties.
    for (int j = 0; j < npaths && !hint; j++) {
      int dist = levenshtein(r->key, paths[j]);
      if (dist < best) {
        best = dist;
        near = paths[j];
      }
    }
    if (!hint)
      hint = near;
    const char *what = ends_with(r->key, "/output") ? "layer output" : "variable";
    if (hint)
      warn_at(r->loc, "layout key '%s' matches no %s; did you mean '%s'?", r->key, what, hint);
    else
      warn_at(r->loc, "layout key '%s' matches no %s", r->key, what);
  }
}
