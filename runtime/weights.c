// weights.c: Keras weights in (--weights, a .keras program's own weights),
// out (--save-weights), keras-hub's LoRA files, and the start and end of
// the forward-only commands (predict.c, generate.c).
//
// The file format is Keras 3's model.weights.h5 (keras/src/saving/
// saving_lib.py), alone or as a member of a .keras zip:
//
//   /vars                       attrs {name: <model name>}, empty
//   /layers/<group>/vars        attrs {name: <layer name>}
//   /layers/<group>/vars/<i>    float32 dataset, the layer's i-th variable
//                               (an integer one, kdrt_var.dtype KDRT_I32: an int32
//                               dataset as Keras writes it on JAX, int64 on
//                               TensorFlow, which is read too)
//                               (a variable of the bfloat16 policy, KDRT_BF16: Keras's
//                               2-byte opaque data with attribute dtype "bfloat16"; of
//                               the float16 one, KDRT_F16: an IEEE half dataset)
//   /optimizer/vars/0, /1       iterations, learning_rate (an optimizer
//                               before its first step has only these two)
//
// <group> is the layer's class name in snake case, made unique by a
// counter over the model's layers in order: the second Dense is "dense_1"
// whatever its name. A nested model is a group too ("sequential"), its
// layers under it as layers/<group>/layers/<inner group>, counted within it
// (kdrt_var.scope names the nested model's group). Keras loads by that path and never looks at the name
// attribute; so does kdrt, which checks in addition that the file holds no
// weights the model lacks, so that another model's file is an error.
//
// Sharding: a variable's global tensor is split in blocks by its
// kdrt_layout. Reading, every rank reads only its own block (an HDF5
// hyperslab). Writing, rank 0 gathers one block from each distinct
// position (MPI_Gatherv; ranks that only repeat a block send nothing),
// places them, and writes. Files are written to a temporary name, fsync'd
// and renamed, so a reader never sees half a file.
#include "kdrt.h"
#include "kdrt_round.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zip.h>

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

// A tuple as Python prints it: v[i] as numbers, or, with s, s[i] quoted.
static void fmt_tuple(char *buf, size_t len, int n, const int64_t *v, const char *const *s) {
  size_t k = (size_t)snprintf(buf, len, "(");
  for (int i = 0; i < n && k < len; i++) {
    const char *sep = i ? ", " : "";
    if (s) k += (size_t)snprintf(buf + k, len - k, "%s'%s'", sep, s[i]);
    else k += (size_t)snprintf(buf + k, len - k, "%s%lld", sep, (long long)v[i]);
  }
  if (k < len) snprintf(buf + k, len - k, "%s)", n == 1 ? "," : "");
}

void kdrt_fmt_shape(char *buf, size_t len, int n, const int64_t *v) {
  fmt_tuple(buf, len, n, v, NULL);
}

void kdrt_fmt_names(char *buf, size_t len, int n, const char *const *names) {
  fmt_tuple(buf, len, n, NULL, names);
}

static int64_t elems(const kdrt_layout *l) {
  int64_t n = 1;
  for (int d = 0; d < l->rank; d++) n *= l->gshape[d];
  return n;
}

// ------------------------------------------------------------ naming

static int is_upper(char c) { return c >= 'A' && c <= 'Z'; }
static int is_lower(char c) { return c >= 'a' && c <= 'z'; }

// Keras's to_snake_case, regex by regex:
//   re.sub(r"\W+", "", name)
//   re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
//   re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()
// (each sub scans left to right over non-overlapping matches).
void kdrt_snake_case(const char *cls, char *buf, size_t len) {
  size_t n = strlen(cls);
  char *a = malloc(2 * n + 1), *b = malloc(4 * n + 1);
  if (!a || !b) abort();
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    char ch = cls[i];
    if (is_upper(ch) || is_lower(ch) || (ch >= '0' && ch <= '9') || ch == '_') a[k++] = ch;
  }
  a[k] = 0;
  n = k, k = 0;
  for (size_t i = 0; i < n;) {
    if (i + 2 < n && is_upper(a[i + 1]) && is_lower(a[i + 2])) {
      size_t e = i + 2;
      while (e < n && is_lower(a[e])) e++;
      b[k++] = a[i], b[k++] = '_';
      for (size_t j = i + 1; j < e; j++) b[k++] = a[j];
      i = e;
    } else {
      b[k++] = a[i++];
    }
  }
  b[k] = 0;
  n = k, k = 0;
  for (size_t i = 0; i < n;) {
    if (i + 1 < n && is_lower(b[i]) && is_upper(b[i + 1])) {
      a[k++] = b[i], a[k++] = '_', a[k++] = b[i + 1];
      i += 2;
    } else {
      a[k++] = b[i++];
    }
  }
  a[k] = 0;
  for (char *p = a; *p; p++)
    if (is_upper(*p)) *p = (char)(*p - 'A' + 'a');
  snprintf(buf, len, "%s", a);
  free(a), free(b);
}

// Whether vars[v] is its layer's first variable in p (one layer, counted once).
static int first_of_layer(const kdrt_program *p, int v) {
  for (int u = 0; u < v; u++)
    if (!strcmp(p->vars[u].layer, p->vars[v].layer)) return 0;
  return 1;
}

static int same_scope(const kdrt_var *a, const kdrt_var *b) {
  return a->scope ? b->scope && !strcmp(a->scope, b->scope) : !b->scope;
}

const char *kdrt_weights_group(const kdrt_program *p, const char *layer, char *buf, size_t len) {
  char snake[256], other[256];
  for (int v = 0; v < p->nvars; v++) {
    if (strcmp(p->vars[v].layer, layer) || !first_of_layer(p, v)) continue;
    const char *scope = p->vars[v].scope;
    if (p->vars[v].group) {
      snprintf(buf, len, "%s%s%s", scope ? scope : "", scope ? "/layers/" : "", p->vars[v].group);
      return buf;
    }
    // Keras's _get_unique_name: the n-th layer of a snake name (in its
    // model) gets "_n".
    kdrt_snake_case(p->vars[v].layer_class, snake, sizeof snake);
    int count = 0;
    for (int u = 0; u < v; u++) {
      if (!first_of_layer(p, u) || !same_scope(&p->vars[u], &p->vars[v])) continue;
      kdrt_snake_case(p->vars[u].layer_class, other, sizeof other);
      count += !strcmp(snake, other);
    }
    if (count) snprintf(buf, len, "%s%s%s_%d", scope ? scope : "", scope ? "/layers/" : "", snake,
                        count);
    else snprintf(buf, len, "%s%s%s", scope ? scope : "", scope ? "/layers/" : "", snake);
    return buf;
  }
  return NULL;
}

// Whether vars[v] is a LoRA kernel's a or b, which Keras's file does not hold.
static int lora_part(const kdrt_program *p, int v) {
  for (int i = 0; i < p->nlora; i++)
    if (p->lora[i].a == v || p->lora[i].b == v) return 1;
  return 0;
}

// The variables of one layer's (sublayer's, sub non-NULL) vars group.
static int layer_nvars(const kdrt_program *p, const char *layer, const char *sub) {
  int n = 0;
  for (int v = 0; v < p->nvars; v++)
    n += !lora_part(p, v) && !strcmp(p->vars[v].layer, layer) &&
         (sub ? p->vars[v].sub && !strcmp(p->vars[v].sub, sub) : !p->vars[v].sub);
  return n;
}

// "layers/<group>[/<sub>]/vars": where variable v's dataset lives.
static void vars_group(const kdrt_var *v, const char *group, char *buf, size_t len) {
  if (v->sub) snprintf(buf, len, "layers/%s/%s/vars", group, v->sub);
  else snprintf(buf, len, "layers/%s/vars", group);
}

// ------------------------------------------------------------ blocks

// This rank's block of l: start and extent per dim.
static void block_of(const kdrt_layout *l, const int *mesh_shape, const int *coord,
                     int64_t *start, int64_t *ext) {
  for (int d = 0; d < l->rank; d++) {
    int a = l->axis[d];
    ext[d] = a >= 0 ? l->gshape[d] / mesh_shape[a] : l->gshape[d];
    start[d] = a >= 0 ? coord[a] * ext[d] : 0;
  }
}

void kdrt_block_place(const kdrt_layout *l, const int *mesh_shape, const int *coord,
                      const float *block, float *g) {
  int64_t start[KDRT_MAX_RANK], ext[KDRT_MAX_RANK], stride[KDRT_MAX_RANK];
  if (l->rank == 0) {
    g[0] = block[0];
    return;
  }
  block_of(l, mesh_shape, coord, start, ext);
  int r = l->rank;
  stride[r - 1] = 1;
  for (int d = r - 2; d >= 0; d--) stride[d] = stride[d + 1] * l->gshape[d + 1];
  int64_t rows = 1;
  for (int d = 0; d < r - 1; d++) rows *= ext[d];
  for (int64_t row = 0; row < rows; row++) {
    int64_t rest = row, off = start[r - 1];
    for (int d = r - 2; d >= 0; d--) {
      off += (start[d] + rest % ext[d]) * stride[d];
      rest /= ext[d];
    }
    memcpy(g + off, block + row * ext[r - 1], sizeof(float) * (size_t)ext[r - 1]);
  }
}

static void coords_of(const kdrt_program *p, int rank, int *coord) {
  for (int a = p->mesh_ndim - 1; a >= 0; a--) {
    coord[a] = rank % p->mesh_shape[a];
    rank /= p->mesh_shape[a];
  }
}

// Whether the rank at coord holds a block no lower rank holds: its
// coordinate is 0 on every mesh axis the layout does not split over.
static int block_owner(const kdrt_layout *l, int mesh_ndim, const int *coord) {
  for (int a = 0; a < mesh_ndim; a++) {
    int used = 0;
    for (int d = 0; d < l->rank; d++) used |= l->axis[d] == a;
    if (!used && coord[a] != 0) return 0;
  }
  return 1;
}

void kdrt_gather_global(kdrt_ctx *c, const kdrt_layout *l, const float *in, float *out) {
  const kdrt_program *p = c->prog;
  int64_t start[KDRT_MAX_RANK], ext[KDRT_MAX_RANK], nloc = 1;
  block_of(l, p->mesh_shape, c->coord, start, ext);
  for (int d = 0; d < l->rank; d++) nloc *= ext[d];
  if (nloc > INT_MAX) kdrt_fatal(c, "a block of %lld floats is too large to gather", (long long)nloc);
  int *counts = NULL, *displs = NULL, total = 0;
  float *buf = NULL;
  if (c->rank == 0) {
    counts = calloc((size_t)c->world, sizeof *counts);
    displs = calloc((size_t)c->world, sizeof *displs);
    if (!counts || !displs) kdrt_fatal(c, "out of memory");
    for (int r = 0; r < c->world; r++) {
      int co[KDRT_MAX_AXES];
      coords_of(p, r, co);
      counts[r] = block_owner(l, p->mesh_ndim, co) ? (int)nloc : 0;
      displs[r] = total;
      if ((int64_t)total + counts[r] > INT_MAX) kdrt_fatal(c, "tensor too large to gather");
      total += counts[r];
    }
    buf = malloc(sizeof(float) * (size_t)(total ? total : 1));
    if (!buf) kdrt_fatal(c, "out of memory gathering %d floats", total);
  }
  int mine = block_owner(l, p->mesh_ndim, c->coord) ? (int)nloc : 0;
  KDRT_MPI(MPI_Gatherv(in, mine, MPI_FLOAT, buf, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD));
  if (c->rank == 0) {
    for (int r = 0; r < c->world; r++) {
      if (!counts[r]) continue;
      int co[KDRT_MAX_AXES];
      coords_of(p, r, co);
      kdrt_block_place(l, p->mesh_shape, co, buf + displs[r], out);
    }
    free(buf), free(counts), free(displs);
  }
}

// ------------------------------------------------------------ the program's archive

const char *kdrt_program_copy(const kdrt_program *p, char *buf, size_t len) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return NULL;
  exe[n] = 0;
  // a keras-hub preset's weights file is copied as it is, not as an archive
  size_t w = p->weights_file ? strlen(p->weights_file) : 0;
  int archive = w < 3 || strcmp(p->weights_file + w - 3, ".h5");
  snprintf(buf, len, "%s.kdcc.d/%s", exe, archive ? "model.keras" : "model.weights.h5");
  return buf;
}

const char *kdrt_program_archive(const kdrt_program *p) {
  static char copy[4200];
  if (!p->weights_file) return NULL;
  if (kdrt_program_copy(p, copy, sizeof copy) && access(copy, R_OK) == 0) return copy;
  if (access(p->weights_file, R_OK) == 0) return p->weights_file;
  return NULL;
}

char *kdrt_archive_gone(const kdrt_program *p, char *buf, size_t len) {
  char copy[4200];
  snprintf(buf, len, "this program starts from the weights of %s, the archive it was compiled "
           "from, which kdcc copied to %s; neither is there now: move the program together "
           "with its .kdcc.d directory, or give --weights FILE or --init random",
           p->weights_file, kdrt_program_copy(p, copy, sizeof copy) ? copy : "<program>.kdcc.d");
  return buf;
}

// ------------------------------------------------------------ files

// What libzip says of an error, in words for a damaged archive: never its
// "No error" or a bare errno text.
static const char *zip_words(int code, const char *lib) {
  switch (code) {
  case ZIP_ER_NOZIP: return "not a zip archive (a .keras file is one): truncated or not a .keras";
  case ZIP_ER_INCONS: return "the archive is damaged: its directory does not match its contents";
  case ZIP_ER_CRC: return "the archive is damaged: a CRC check failed";
  case ZIP_ER_EOF: return "the archive is truncated";
  case ZIP_ER_COMPNOTSUPP: return "it is compressed with a method libzip cannot read";
  case ZIP_ER_ZLIB: return "the archive is damaged: its compressed data are corrupt";
  default: return lib;
  }
}

// The whole of a zip member, malloc'd. 0, or -1 with err. Its size (the
// archive's word for it) must be within kdrt_max_inflate() before anything
// is allocated; the member is read to its end, so that libzip checks its
// CRC (stored members too), and may hold no more than that size.
static int zip_member(const char *path, const char *name, unsigned char **out, size_t *len,
                      char *err, size_t errlen) {
  int zerr = 0;
  *out = NULL;
  zip_t *z = zip_open(path, ZIP_RDONLY | ZIP_CHECKCONS, &zerr);
  if (!z) {
    zip_error_t e;
    zip_error_init_with_code(&e, zerr);
    kdrt_errf(err, errlen, "%s: cannot read the archive: %s", path,
              zip_words(zerr, zip_error_strerror(&e)));
    zip_error_fini(&e);
    return -1;
  }
  zip_stat_t st;
  zip_file_t *f = NULL;
  int rc = -1;
  size_t limit = kdrt_max_inflate();
  if (zip_stat(z, name, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE)) {
    kdrt_errf(err, errlen, "%s: the archive has no %s", path, name);
  } else if (st.size > limit) {
    kdrt_errf(err, errlen, "%s: %s in the archive inflates to %llu bytes, more than the %zu "
              "one rank may take (half the memory, shared by the ranks on this host; "
              "KDRT_MAX_INFLATE sets it)", path, name, (unsigned long long)st.size, limit);
  } else if (!(f = zip_fopen(z, name, 0))) {
    kdrt_errf(err, errlen, "%s: cannot open %s in the archive: %s", path, name,
              zip_words(zip_error_code_zip(zip_get_error(z)), zip_strerror(z)));
  } else if (!(*out = malloc(st.size + 1))) {
    kdrt_errf(err, errlen, "%s: out of memory for %s (%llu bytes)", path, name,
              (unsigned long long)st.size);
  } else {
    zip_int64_t got = zip_fread(f, *out, st.size);
    unsigned char extra;
    zip_int64_t more = got == (zip_int64_t)st.size ? zip_fread(f, &extra, 1) : 0;
    int code = zip_error_code_zip(zip_file_get_error(f));
    if (got < 0 || more < 0)
      kdrt_errf(err, errlen, "%s: cannot read %s from the archive: %s", path, name,
                zip_words(code, zip_file_strerror(f)));
    else if (got != (zip_int64_t)st.size)
      kdrt_errf(err, errlen, "%s: %s in the archive holds %lld bytes, but the archive says "
                "%llu: the archive is damaged", path, name, (long long)got,
                (unsigned long long)st.size);
    else if (more > 0)
      kdrt_errf(err, errlen, "%s: %s in the archive holds more than the %llu bytes the archive "
                "says: the archive is damaged", path, name, (unsigned long long)st.size);
    else
      *len = (size_t)st.size, rc = 0;
  }
  if (rc) free(*out), *out = NULL;
  if (f) zip_fclose(f);
  zip_discard(z);
  return rc;
}

// Open a weights file for reading, by its first bytes: a zip (.keras) is
// read into memory and opened as an HDF5 file image; HDF5 directly.
static hid_t open_weights(const char *path, char *err, size_t errlen) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  FILE *f = fopen(path, "rb");
  if (!f) return kdrt_errf(err, errlen, "%s: cannot open weights file: %s", path, strerror(errno));
  unsigned char magic[8] = {0};
  size_t got = fread(magic, 1, sizeof magic, f);
  fclose(f);
  if (got >= 4 && !memcmp(magic, "PK\x03\x04", 4)) {
    unsigned char *img;
    size_t len;
    if (zip_member(path, "model.weights.h5", &img, &len, err, errlen)) return -1;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(fapl, 1 << 16, 0);
    H5Pset_file_image(fapl, img, len); // HDF5 copies it
    free(img);
    hid_t h = H5Fopen("model.weights.h5", H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (h < 0) return kdrt_errf(err, errlen, "%s: model.weights.h5 in the archive is not HDF5", path);
    return h;
  }
  if (got == 8 && !memcmp(magic, "\x89HDF\r\n\x1a\n", 8)) {
    hid_t h = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (h < 0) return kdrt_errf(err, errlen, "%s: cannot open as HDF5", path);
    return h;
  }
  return kdrt_errf(err, errlen, "%s: not a .keras archive or a .weights.h5 file", path);
}

// An object's string attribute `key` into buf ("?" if none).
static void read_str_attr(hid_t g, const char *key, char *buf, size_t len) {
  snprintf(buf, len, "?");
  if (H5Aexists(g, key) <= 0) return;
  hid_t a = H5Aopen(g, key, H5P_DEFAULT), t = H5Aget_type(a);
  if (H5Tget_class(t) == H5T_STRING) {
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_cset(mt, H5Tget_cset(t)); // h5py writes UTF-8; HDF5 does not convert
    if (H5Tis_variable_str(t) > 0) {
      char *s = NULL;
      H5Tset_size(mt, H5T_VARIABLE);
      if (H5Aread(a, mt, &s) >= 0 && s) {
        snprintf(buf, len, "%s", s);
        H5free_memory(s);
      }
    } else {
      size_t n = H5Tget_size(t);
      char *s = calloc(n + 1, 1);
      H5Tset_size(mt, n + 1);
      if (s && H5Aread(a, mt, s) >= 0) snprintf(buf, len, "%s", s);
      free(s);
    }
    H5Tclose(mt);
  }
  H5Tclose(t);
  H5Aclose(a);
}

static void name_attr(hid_t g, char *buf, size_t len) { read_str_attr(g, "name", buf, len); }

// Keras writes a bfloat16 variable (a model saved under the bfloat16
// policy, as most keras-hub presets are) as 2-byte opaque data with the
// attribute dtype = "bfloat16" (h5py has no bfloat16); Keras loads it into a
// float32 variable exactly, and so does kdrt: its bits are a float32's
// upper half.
static int is_bfloat16(hid_t ds, hid_t t) {
  char dt[32];
  if (H5Tget_class(t) != H5T_OPAQUE || H5Tget_size(t) != 2) return 0;
  read_str_attr(ds, "dtype", dt, sizeof dt);
  return !strcmp(dt, "bfloat16");
}

// issue 23: the 16-bit type a variable is kept in (KDRT_ROUND_*), or 0.
static int var16(const kdrt_var *v) {
  int t = v->dtype & ~KDRT_IN16; // (kept in float32 or in its 16 bits)
  return t == KDRT_BF16 ? KDRT_ROUND_BF16 : t == KDRT_F16 ? KDRT_ROUND_F16 : 0;
}

// h5py's float16 (Keras writes a float16 variable so): IEEE half, little-endian.
static hid_t float16_type(void) {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

static void bfloat16_to_float(const uint16_t *b, float *out, int64_t n) {
  for (int64_t i = n - 1; i >= 0; i--) { // b may be out's own first half
    uint32_t u = (uint32_t)b[i] << 16;
    memcpy(&out[i], &u, sizeof u);
  }
}

static int has_link(hid_t loc, const char *path) {
  return H5Lexists(loc, path, H5P_DEFAULT) > 0 && H5Oexists_by_name(loc, path, H5P_DEFAULT) > 0;
}

// Links in a group (its datasets and subgroups).
static int64_t nlinks(hid_t g) {
  H5G_info_t info;
  return H5Gget_info(g, &info) < 0 ? -1 : (int64_t)info.nlinks;
}

// Calls fn(group, its variable count, its name attribute, ctx) for every
// group under `layers` (the file's /layers) holding variables, a nested
// model's layers (<group>/layers/...) included, until fn returns non-zero.
typedef int (*group_fn)(const char *group, int64_t nvars, const char *lname, void *ctx);

static int walk_groups(hid_t layers, const char *prefix, group_fn fn, void *ctx) {
  hid_t dir = H5Gopen2(layers, *prefix ? prefix : ".", H5P_DEFAULT);
  int64_t n = nlinks(dir);
  int rc = 0;
  for (int64_t i = 0; i < n && !rc; i++) {
    char name[256], group[600], path[700], lname[256];
    if (H5Lget_name_by_idx(dir, ".", H5_INDEX_NAME, H5_ITER_INC, (hsize_t)i, name, sizeof name,
                           H5P_DEFAULT) < 0)
      continue;
    if (snprintf(group, sizeof group, "%s%s%s", prefix, *prefix ? "/" : "", name) >=
        (int)sizeof group)
      continue; // deeper than any model Keras writes: no variable of ours is there
    snprintf(path, sizeof path, "%s/vars", group);
    if (has_link(layers, path)) {
      hid_t g = H5Gopen2(layers, path, H5P_DEFAULT);
      int64_t k = nlinks(g);
      name_attr(g, lname, sizeof lname);
      H5Gclose(g);
      if (k > 0) rc = fn(group, k, lname, ctx);
    }
    snprintf(path, sizeof path, "%s/layers", group);
    if (!rc && has_link(layers, path)) rc = walk_groups(layers, path, fn, ctx);
  }
  H5Gclose(dir);
  return rc;
}

typedef struct {
  char *buf;
  size_t len, k;
} group_list;

static int list_one(const char *group, int64_t nvars, const char *lname, void *ctx) {
  group_list *l = ctx;
  (void)nvars;
  if (l->k < l->len)
    l->k += (size_t)snprintf(l->buf + l->k, l->len - l->k, "%slayers/%s ('%s')", l->k ? ", " : "",
                             group, lname);
  return 0;
}

// "layers/dense ('d1'), layers/dense_1 ('d2')": the groups of the file that
// hold variables, for messages.
static void list_groups(hid_t file, char *buf, size_t len) {
  buf[0] = 0;
  if (!has_link(file, "layers")) {
    snprintf(buf, len, "no layers group");
    return;
  }
  group_list l = {buf, len, 0};
  hid_t layers = H5Gopen2(file, "layers", H5P_DEFAULT);
  walk_groups(layers, "", list_one, &l);
  H5Gclose(layers);
  if (!l.k) snprintf(buf, len, "no layer weights");
}

// Every dataset kdcc writes carries CRC_ATTR, a uint32: zlib's CRC-32 of its
// data as stored, little-endian float32 (int32 for an integer variable,
// 2 bytes for a KDRT_BF16 or KDRT_F16 one) in row-major order (HDF5 keeps
// no checksum of its own). A reader checks it when it is there (files
// written by Keras have none); Keras ignores it.
#define CRC_ATTR "kdcc_crc32"

// n elements of 4 bytes (float32 or int32)
static uint32_t floats_crc(const void *x, size_t n) {
  return kdrt_crc32(0, x, n * sizeof(float)); // x86: the bytes as stored (<f4, <i4)
}

// An integer variable's largest magnitude: what a float holds exactly.
#define INT_EXACT (1 << 24)

// The whole dataset against its CRC_ATTR.
static int verify_crc(hid_t ds, const char *path, const char *ds_path, const kdrt_var *v,
                      char *err, size_t errlen) {
  uint32_t want = 0;
  hid_t a = H5Aopen(ds, CRC_ATTR, H5P_DEFAULT);
  int bad = a < 0 || H5Aread(a, H5T_NATIVE_UINT32, &want) < 0;
  if (a >= 0) H5Aclose(a);
  if (bad) return kdrt_errf(err, errlen, "%s: %s: cannot read its %s attribute", path, ds_path, CRC_ATTR);
  int64_t n = elems(&v->layout);
  float *all = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (!all) return kdrt_errf(err, errlen, "%s: out of memory checking %s", path, ds_path);
  int rc = 0;
  hid_t t = H5Dget_type(ds);
  int half = is_bfloat16(ds, t) || (H5Tget_class(t) == H5T_FLOAT && H5Tget_size(t) == 2);
  hid_t mt = v->dtype == KDRT_I32 ? H5T_NATIVE_INT32 : half ? t : H5T_NATIVE_FLOAT; // as written
  size_t bytes = (size_t)n * (half ? 2 : sizeof(float));
  if (H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) < 0)
    rc = kdrt_errf(err, errlen, "%s: cannot read %s (variable '%s')", path, ds_path, v->path);
  else if (kdrt_crc32(0, all, bytes) != want)
    rc = kdrt_errf(err, errlen, "%s: %s (variable '%s') fails its checksum (written with CRC-32 "
                   "%08x, the data now give %08x): the file is damaged", path, ds_path, v->path,
                   want, kdrt_crc32(0, all, bytes));
  H5Tclose(t);
  free(all);
  return rc;
}

// Check one variable's dataset against the model (and its checksum, when
// kdcc wrote one), then read this rank's block of it into out.
static int read_dataset(hid_t file, const char *path, const char *ds_path, const kdrt_program *p,
                        const kdrt_var *v, const int *coord, float *out, char *err,
                        size_t errlen);

static int read_var(hid_t file, const char *path, const kdrt_program *p, const kdrt_var *v,
                    const char *group, const int *coord, float *out, char *err, size_t errlen) {
  char ds_path[512], vg[400];
  vars_group(v, group, vg, sizeof vg);
  snprintf(ds_path, sizeof ds_path, "%s/%d", vg, v->index);
  return read_dataset(file, path, ds_path, p, v, coord, out, err, errlen);
}

// Dataset ds_path of the file into this rank's block of variable v.
static int read_dataset(hid_t file, const char *path, const char *ds_path, const kdrt_program *p,
                        const kdrt_var *v, const int *coord, float *out, char *err,
                        size_t errlen) {
  char have[160], want[160];
  if (!has_link(file, ds_path))
    return kdrt_errf(err, errlen, "%s: no %s for variable '%s'", path, ds_path, v->path);
  hid_t ds = H5Dopen2(file, ds_path, H5P_DEFAULT);
  if (ds < 0) return kdrt_errf(err, errlen, "%s: %s is not a dataset", path, ds_path);
  hid_t t = H5Dget_type(ds), fs = H5Dget_space(ds);
  int rc = 0;
  int rank = H5Sget_simple_extent_ndims(fs);
  hsize_t dims[32];
  int64_t d64[32];
  int ints = v->dtype == KDRT_I32; // an integer variable (kdrt_var.dtype)
  int bf16 = !ints && is_bfloat16(ds, t);
  if (!bf16 && H5Tget_class(t) != (ints ? H5T_INTEGER : H5T_FLOAT)) {
    rc = kdrt_errf(err, errlen, "%s: %s (variable '%s') is not %s", path, ds_path, v->path,
                   ints ? "an integer dataset" : "floating point (or Keras's bfloat16)");
  } else if (rank < 0 || rank > 32) {
    rc = kdrt_errf(err, errlen, "%s: %s has a dataspace kdrt cannot read", path, ds_path);
  } else {
    H5Sget_simple_extent_dims(fs, dims, NULL);
    int same = rank == v->layout.rank;
    for (int d = 0; d < rank; d++) {
      d64[d] = (int64_t)dims[d];
      if (same) same = d64[d] == v->layout.gshape[d];
    }
    if (!same) {
      kdrt_fmt_shape(have, sizeof have, rank, d64);
      kdrt_fmt_shape(want, sizeof want, v->layout.rank, v->layout.gshape);
      rc = kdrt_errf(err, errlen, "%s: variable '%s' (%s) has shape %s in the file, but the model's "
                "is %s", path, v->path, ds_path, have, want);
    }
  }
  if (!rc && H5Aexists(ds, CRC_ATTR) > 0) rc = verify_crc(ds, path, ds_path, v, err, errlen);
  if (!rc) {
    hsize_t start[KDRT_MAX_RANK], count[KDRT_MAX_RANK];
    int64_t s[KDRT_MAX_RANK], e[KDRT_MAX_RANK];
    block_of(&v->layout, p->mesh_shape, coord, s, e);
    for (int d = 0; d < rank; d++) start[d] = (hsize_t)s[d], count[d] = (hsize_t)e[d];
    hid_t ms;
    int64_t n = 1;
    for (int d = 0; d < rank; d++) n *= e[d];
    if (rank > 0) {
      H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
      ms = H5Screate_simple(rank, count, NULL);
    } else {
      ms = H5Screate(H5S_SCALAR);
    }
    // an integer variable: its values (int32 or int64) as int64 first, each
    // one a float holds exactly
    int64_t *iv = ints ? malloc(sizeof *iv * (size_t)n) : NULL;
    if (ints && !iv)
      rc = kdrt_errf(err, errlen, "%s: out of memory reading %s", path, ds_path);
    else if (H5Dread(ds, ints ? H5T_NATIVE_INT64 : bf16 ? t : H5T_NATIVE_FLOAT, ms, fs,
                     H5P_DEFAULT, ints ? (void *)iv : (void *)out) < 0)
      rc = kdrt_errf(err, errlen, "%s: cannot read %s (variable '%s')", path, ds_path, v->path);
    else if (bf16)
      bfloat16_to_float((const uint16_t *)out, out, n);
    if (!rc && var16(v)) // float32 data: Keras's assign casts it (issue 23)
      for (int64_t i = 0; i < n; i++) out[i] = kdrt_round_to(var16(v), out[i]);
    for (int64_t i = 0; ints && !rc && i < n; i++) {
      if (iv[i] > INT_EXACT || iv[i] < -INT_EXACT)
        rc = kdrt_errf(err, errlen, "%s: %s (variable '%s') holds %lld, beyond the %d a float32 "
                       "holds exactly, which kdrt keeps it as", path, ds_path, v->path,
                       (long long)iv[i], INT_EXACT);
      else
        out[i] = (float)iv[i];
    }
    free(iv);
    H5Sclose(ms);
  }
  H5Sclose(fs);
  H5Tclose(t);
  H5Dclose(ds);
  return rc;
}

typedef struct {
  const kdrt_program *p;
  const char *path;
  char *err;
  size_t errlen;
} unknown_ctx;

// A group of the file that no variable of the model maps to: an error.
static int unknown_group(const char *group, int64_t nvars, const char *lname, void *ctx) {
  unknown_ctx *u = ctx;
  char mine[256];
  for (int v = 0; v < u->p->nvars; v++)
    if (!strcmp(kdrt_weights_group(u->p, u->p->vars[v].layer, mine, sizeof mine), group)) return 0;
  return kdrt_errf(u->err, u->errlen, "%s: layers/%s (layer '%s' in the file) holds %lld "
                   "variable%s, but the model has no such layer: are these another model's "
                   "weights?", u->path, group, lname, (long long)nvars, nvars == 1 ? "" : "s");
}

int kdrt_weights_read(const kdrt_program *p, const int *coord, const char *path, float *params,
                      char *err, size_t errlen) {
  hid_t file = open_weights(path, err, errlen);
  if (file < 0) return -1;
  // Everything is read into a copy first: a file that does not fit leaves
  // params as they were.
  float *stage = malloc(sizeof(float) * (p->param_floats ? p->param_floats : 1));
  if (!stage) {
    H5Fclose(file);
    return kdrt_errf(err, errlen, "%s: out of memory", path);
  }
  if (p->param_floats) memcpy(stage, params, sizeof(float) * p->param_floats);
  int rc = 0;
  char group[256], gpath[600], have[4096];
  for (int v = 0; v < p->nvars && !rc; v++) {
    const kdrt_var *var = &p->vars[v];
    if (lora_part(p, v)) continue; // LoRA's a and b keep their values (--lora-weights)
    kdrt_weights_group(p, var->layer, group, sizeof group);
    vars_group(var, group, gpath, sizeof gpath);
    if (!has_link(file, gpath)) {
      list_groups(file, have, sizeof have);
      rc = kdrt_errf(err, errlen, "%s: no weights for layer '%s' (%s): the file has no group "
                "layers/%s; it holds %s", path, var->layer, var->layer_class, group, have);
      break;
    }
    if (var->index == 0) { // once per layer: the file must hold as many variables
      hid_t g = H5Gopen2(file, gpath, H5P_DEFAULT);
      int64_t n = nlinks(g);
      H5Gclose(g);
      int want = layer_nvars(p, var->layer, var->sub);
      if (n != want) {
        rc = kdrt_errf(err, errlen, "%s: layer '%s' (layers/%s) has %lld variable%s in the file, but "
                  "%d in the model", path, var->layer, group, (long long)n, n == 1 ? "" : "s",
                  want);
        break;
      }
    }
    // issue 23: one kept in 16 bits read as float32, then stored so
    float *wide = kdrt_var_half(var) ? malloc(sizeof *wide * (var->n ? var->n : 1)) : NULL;
    if (kdrt_var_half(var) && !wide) rc = kdrt_errf(err, errlen, "%s: out of memory", path);
    else rc = read_var(file, path, p, var, group, coord, wide ? wide : stage + var->offset, err,
                       errlen);
    if (wide && !rc) kdrt_var_put(var, stage + var->offset, wide);
    free(wide);
  }
  // Weights the model has no layer for: the file is another model's.
  if (!rc && has_link(file, "layers")) {
    hid_t layers = H5Gopen2(file, "layers", H5P_DEFAULT);
    unknown_ctx u = {p, path, err, errlen};
    rc = walk_groups(layers, "", unknown_group, &u);
    H5Gclose(layers);
  }
  H5Fclose(file);
  if (!rc && p->param_floats) memcpy(params, stage, sizeof(float) * p->param_floats);
  free(stage);
  return rc;
}

// ------------------------------------------------------------ writing

static void str_attr(hid_t loc, const char *key, const char *val) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(loc, key, t, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, &val);
  H5Aclose(a);
  H5Sclose(s);
  H5Tclose(t);
}

static int write_dataset(hid_t g, const char *name, hid_t ftype, hid_t mtype, int rank,
                         const int64_t *shape, const void *data) {
  hsize_t dims[KDRT_MAX_RANK];
  for (int d = 0; d < rank; d++) dims[d] = (hsize_t)shape[d];
  hid_t s = rank ? H5Screate_simple(rank, dims, NULL) : H5Screate(H5S_SCALAR);
  hid_t ds = H5Dcreate2(g, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  int rc = ds < 0 || H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0 ? -1 : 0;
  if (ds >= 0) H5Dclose(ds);
  H5Sclose(s);
  return rc;
}

// model.weights.h5 as an in-memory image (malloc'd).
static int h5_image(const kdrt_program *p, const float *const *global, int64_t step, float lr,
                    unsigned char **out, size_t *len) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_core(fapl, 1 << 16, 0); // in memory, never on disk
  hid_t f = H5Fcreate("model.weights.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (f < 0) return -1;
  int rc = 0;
  hid_t g = H5Gcreate2(f, "vars", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  str_attr(g, "name", p->model_name ? p->model_name : "model");
  H5Gclose(g);
  hid_t layers = H5Gcreate2(f, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  for (int v = 0; v < p->nvars && !rc; v++) {
    const kdrt_var *var = &p->vars[v];
    if (lora_part(p, v)) continue; // merged into its kernel (kdrt_weights_save)
    char group[256], gpath[600], idx[16];
    kdrt_weights_group(p, var->layer, group, sizeof group);
    snprintf(gpath, sizeof gpath, "%s/vars", group);
    if (!has_link(layers, group)) { // a nested model's group made on the way
      hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
      H5Pset_create_intermediate_group(lcpl, 1);
      hid_t lg = H5Gcreate2(layers, group, lcpl, H5P_DEFAULT, H5P_DEFAULT);
      H5Pclose(lcpl);
      hid_t vg = H5Gcreate2(lg, "vars", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      str_attr(vg, "name", var->layer);
      H5Gclose(vg);
      H5Gclose(lg);
    }
    if (var->sub) { // a sublayer's variables: layers/<group>/<sub>/vars (sub may nest:
                    // a Bidirectional's "forward_layer/cell")
      snprintf(gpath, sizeof gpath, "%s/%s/vars", group, var->sub);
      if (!has_link(layers, gpath)) {
        hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
        H5Pset_create_intermediate_group(lcpl, 1);
        hid_t svg = H5Gcreate2(layers, gpath, lcpl, H5P_DEFAULT, H5P_DEFAULT);
        H5Gclose(svg);
        H5Pclose(lcpl);
      }
    }
    hid_t vg = H5Gopen2(layers, gpath, H5P_DEFAULT);
    snprintf(idx, sizeof idx, "%d", var->index);
    // an integer variable: int32, as Keras writes it (kdrt_var.dtype); a
    // 16-bit one (issue 23) as Keras's h5py writes it: float16 an IEEE half,
    // ml_dtypes' bfloat16 2-byte opaque data with the attribute that says so
    int64_t n = elems(&var->layout);
    int k16 = var16(var);
    int32_t *iv = var->dtype == KDRT_I32 ? malloc(sizeof *iv * (size_t)(n ? n : 1)) : NULL;
    uint16_t *hv = k16 ? malloc(sizeof *hv * (size_t)(n ? n : 1)) : NULL;
    for (int64_t i = 0; iv && i < n; i++) iv[i] = (int32_t)global[v][i];
    for (int64_t i = 0; hv && i < n; i++) {
      // (the values are the type's already)
      hv[i] = kdrt_bits16(k16, kdrt_round_to(k16, global[v][i]));
    }
    const void *data = iv ? (const void *)iv : hv ? (const void *)hv : (const void *)global[v];
    hid_t t16 = !hv ? -1 : k16 == KDRT_ROUND_BF16 ? H5Tcreate(H5T_OPAQUE, 2) : float16_type();
    if ((var->dtype == KDRT_I32 && !iv) || (k16 && !hv)) rc = -1;
    else rc = write_dataset(vg, idx, iv ? H5T_STD_I32LE : hv ? t16 : H5T_IEEE_F32LE,
                            iv ? H5T_NATIVE_INT32 : hv ? t16 : H5T_NATIVE_FLOAT,
                            var->layout.rank, var->layout.gshape, data);
    if (t16 >= 0) H5Tclose(t16);
    if (!rc && k16 == KDRT_ROUND_BF16) {
      hid_t ds = H5Dopen2(vg, idx, H5P_DEFAULT);
      str_attr(ds, "dtype", "bfloat16");
      H5Dclose(ds);
    }
    if (!rc) { // the dataset's checksum (see CRC_ATTR)
      uint32_t crc = hv ? kdrt_crc32(0, hv, (size_t)n * 2) : floats_crc(data, (size_t)n);
      hid_t ds = H5Dopen2(vg, idx, H5P_DEFAULT), sp = H5Screate(H5S_SCALAR);
      hid_t a = ds < 0 ? -1 : H5Acreate2(ds, CRC_ATTR, H5T_STD_U32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
      rc = a < 0 || H5Awrite(a, H5T_NATIVE_UINT32, &crc) < 0 ? -1 : 0;
      if (a >= 0) H5Aclose(a);
      if (ds >= 0) H5Dclose(ds);
      H5Sclose(sp);
    }
    free(iv);
    free(hv);
    H5Gclose(vg);
  }
  H5Gclose(layers);
  // The optimizer as Keras saves one before its first step: iterations and
  // the learning rate (none with a schedule: it is no variable then). Its
  // slots are not saved (a checkpoint's business).
  hid_t og = H5Gcreate2(f, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  hid_t ov = H5Gcreate2(og, "vars", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (!rc) rc = write_dataset(ov, "0", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, NULL, &step);
  if (!rc && !p->schedule)
    rc = write_dataset(ov, "1", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 0, NULL, &lr);
  H5Gclose(ov);
  H5Gclose(og);
  if (!rc && H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) rc = -1;
  ssize_t n = rc ? -1 : H5Fget_file_image(f, NULL, 0);
  if (n > 0 && (*out = malloc((size_t)n)) && H5Fget_file_image(f, *out, (size_t)n) == n) {
    *len = (size_t)n;
  } else {
    rc = -1;
  }
  H5Fclose(f);
  return rc;
}

int kdrt_commit_file(const char *tmp, const char *dst) {
  int fd = open(tmp, O_RDONLY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  if (rc || rename(tmp, dst)) return -1;
  return 0;
}

static int write_all(const char *path, const void *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  const unsigned char *p = data;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      close(fd);
      return -1;
    }
    p += w, len -= (size_t)w;
  }
  return close(fd);
}

int kdrt_weights_check_path(const kdrt_program *p, const char *path, char *err, size_t errlen) {
  if (ends_with(path, ".keras")) {
    if (!p->weights_file || !ends_with(p->weights_file, ".keras"))
      return kdrt_errf(err, errlen, "%s: a .keras file needs the model's config.json, but this "
                  "program was not compiled from a .keras archive; save to a .weights.h5",
                  path);
    if (!kdrt_program_archive(p))
      return kdrt_errf(err, errlen, "%s: a .keras file needs the model's config.json, from the "
                       "archive this program was compiled from, which is gone (%s, and the "
                       "copy beside the program); save to a .weights.h5", path, p->weights_file);
    return 0;
  }
  if (!ends_with(path, ".weights.h5"))
    return kdrt_errf(err, errlen, "%s: the name must end in .weights.h5 or .keras, as Keras's "
                "load_weights requires", path);
  return 0;
}

// "3.15.1" from a metadata.json, else "3.0.0".
static void keras_version(const unsigned char *meta, size_t len, char *buf, size_t blen) {
  snprintf(buf, blen, "3.0.0");
  if (!meta) return;
  char *s = strndup((const char *)meta, len);
  const char *k = s ? strstr(s, "\"keras_version\"") : NULL;
  if (k && (k = strchr(k + 15, '"'))) {
    size_t n = strcspn(k + 1, "\"\\");
    if (n && n < blen) snprintf(buf, blen, "%.*s", (int)n, k + 1);
  }
  free(s);
}

int kdrt_weights_write(const kdrt_program *p, const char *path, const float *const *global,
                       int64_t step, float lr, char *err, size_t errlen) {
  if (kdrt_weights_check_path(p, path, err, errlen)) return -1;
  for (int v = 0; v < p->nvars; v++) // never NaN weights without a word
    for (int64_t i = 0, n = elems(&p->vars[v].layout); i < n; i++)
      if (!isfinite(global[v][i]))
        return kdrt_errf(err, errlen, "%s: not written: variable '%s' holds %g at element %lld "
                         "(training diverged)", path, p->vars[v].path, (double)global[v][i],
                         (long long)i);
  int keras = ends_with(path, ".keras");
  unsigned char *config = NULL, *meta = NULL, *img = NULL;
  size_t config_len = 0, meta_len = 0, img_len = 0;
  const char *archive = kdrt_program_archive(p);
  if (keras && zip_member(archive, "config.json", &config, &config_len, err, errlen))
    return -1;
  if (keras) {
    char e2[64];
    if (zip_member(archive, "metadata.json", &meta, &meta_len, e2, sizeof e2))
      meta = NULL;
  }
  if (h5_image(p, global, step, lr, &img, &img_len)) {
    free(config), free(meta);
    return kdrt_errf(err, errlen, "%s: HDF5 could not build the weights file", path);
  }
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  int rc = 0;
  if (!keras) {
    if (write_all(tmp, img, img_len))
      rc = kdrt_errf(err, errlen, "%s: cannot write %s: %s", path, tmp, strerror(errno));
  } else {
    // Keras's own archive: config.json, metadata.json, model.weights.h5,
    // stored uncompressed.
    char version[64], metadata[256], date[64];
    keras_version(meta, meta_len, version, sizeof version);
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%Y-%m-%d@%H:%M:%S", localtime_r(&now, &tm));
    snprintf(metadata, sizeof metadata, "{\"keras_version\": \"%s\", \"date_saved\": \"%s\"}",
             version, date);
    int zerr = 0;
    unlink(tmp);
    zip_t *z = zip_open(tmp, ZIP_CREATE | ZIP_EXCL, &zerr);
    const char *names[3] = {"metadata.json", "config.json", "model.weights.h5"};
    const void *data[3] = {metadata, config, img};
    size_t lens[3] = {strlen(metadata), config_len, img_len};
    for (int i = 0; z && i < 3 && !rc; i++) {
      zip_source_t *s = zip_source_buffer(z, data[i], lens[i], 0);
      zip_int64_t at = s ? zip_file_add(z, names[i], s, ZIP_FL_ENC_UTF_8) : -1;
      if (at < 0) {
        if (s) zip_source_free(s);
        rc = -1;
      } else {
        zip_set_file_compression(z, (zip_uint64_t)at, ZIP_CM_STORE, 0);
      }
    }
    if (!z || rc || zip_close(z) != 0) {
      rc = kdrt_errf(err, errlen, "%s: cannot write the archive %s: %s", path, tmp,
                z ? zip_strerror(z) : "zip_open failed");
      if (z) zip_discard(z);
    }
  }
  if (!rc && kdrt_commit_file(tmp, path))
    rc = kdrt_errf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
  if (rc) unlink(tmp);
  free(config), free(meta), free(img);
  return rc;
}

// ------------------------------------------------------------ collective forms

int kdrt_weights_nonfinite_host(kdrt_ctx *c) {
  const kdrt_program *p = c->prog;
  for (int v = 0; v < p->nvars; v++) {
    const kdrt_var *var = &p->vars[v];
    const float *w = c->params + var->offset;
    const uint16_t *h = (const uint16_t *)w; // issue 23: kept in 16 bits
    int k = kdrt_var_half(var);
    for (size_t i = 0; i < var->n; i++)
      if (!isfinite(k ? kdrt_value16(k, h[i]) : w[i]))
        return v;
  }
  return p->nvars;
}

int kdrt_weights_finite(kdrt_ctx *c) {
  const kdrt_program *p = c->prog;
  int mine = c->nonfinite ? c->nonfinite(c) : kdrt_weights_nonfinite_host(c), first = p->nvars;
  KDRT_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return first < p->nvars ? first : -1;
}

// Every rank's read (rc, this rank's): 0 when all read theirs, else -1, err
// saying why (on a rank whose own read worked: that another's did not).
static int all_read(int rc, const char *path, const char *what, char *err, size_t errlen) {
  int all = rc;
  KDRT_MPI(MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (all && !rc) kdrt_errf(err, errlen, "%s: another rank could not read its %s", path, what);
  return all ? -1 : 0;
}

// Rank 0's write (rc), told to every rank.
static int rank0_wrote(const kdrt_ctx *c, int rc, const char *path, char *err, size_t errlen) {
  KDRT_MPI(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (rc && c->rank != 0) kdrt_errf(err, errlen, "%s: rank 0 could not write it", path);
  return rc;
}

// Variable var's global tensor, gathered on rank 0 (malloc'd; NULL elsewhere).
static float *gather_var(kdrt_ctx *c, const kdrt_var *var) {
  float *g = NULL;
  if (c->rank == 0 && !(g = malloc(sizeof(float) * (size_t)elems(&var->layout))))
    kdrt_fatal(c, "out of memory for variable '%s'", var->path);
  const float *w = c->params + var->offset;
  float *wide = NULL; // issue 23: one kept in 16 bits gathered as float32
  if (kdrt_var_half(var)) {
    if (!(wide = malloc(sizeof *wide * (var->n ? var->n : 1))))
      kdrt_fatal(c, "out of memory for variable '%s'", var->path);
    kdrt_var_get(var, w, wide);
  }
  kdrt_gather_global(c, &var->layout, wide ? wide : w, g);
  free(wide);
  return g;
}

// issue 23: a variable of a 16-bit policy holds its type's values from its
// start: its initializer's, rounded (Keras's initializers make them in the
// variable's dtype). A weights file's are rounded as read.
void kdrt_round_vars(kdrt_ctx *c) {
  const kdrt_program *p = c->prog;
  for (int v = 0; v < p->nvars; v++) {
    // (one kept in 16 bits was rounded as stored: kdrt_var_put, kdrt_init_fill16)
    int k = kdrt_var_half(&p->vars[v]) ? 0 : var16(&p->vars[v]);
    float *w = c->params + p->vars[v].offset;
    for (size_t i = 0; k && i < p->vars[v].n; i++) w[i] = kdrt_round_to(k, w[i]);
  }
}

int kdrt_weights_load(kdrt_ctx *c, const char *path, char *err, size_t errlen) {
  return all_read(kdrt_weights_read(c->prog, c->coord, path, c->params, err, errlen), path,
                  "weights", err, errlen);
}

int kdrt_weights_save(kdrt_ctx *c, const char *path, char *err, size_t errlen) {
  const kdrt_program *p = c->prog;
  float **global = calloc((size_t)(p->nvars ? p->nvars : 1), sizeof *global);
  if (!global) kdrt_fatal(c, "out of memory");
  for (int v = 0; v < p->nvars; v++) global[v] = gather_var(c, &p->vars[v]);
  // A LoRA kernel is saved merged, as Keras saves it: w + scale * a . b
  for (int i = 0; i < p->nlora && c->rank == 0; i++) {
    const kdrt_lora *l = &p->lora[i];
    const kdrt_layout *lb = &p->vars[l->b].layout;
    int64_t r = lb->gshape[0], n = lb->gshape[1], m = elems(&p->vars[l->kernel].layout) / n;
    const float *a = global[l->a], *b = global[l->b];
    float *w = global[l->kernel];
    for (int64_t k = 0; k < m; k++)
      for (int64_t j = 0; j < n; j++) {
        float ab = 0;
        for (int64_t q = 0; q < r; q++) ab += a[k * r + q] * b[q * n + j];
        w[k * n + j] += l->scale * ab;
      }
  }
  int rc = 0;
  if (c->rank == 0)
    rc = kdrt_weights_write(p, path, (const float *const *)global, c->iterations, c->lr, err,
                            errlen);
  rc = rank0_wrote(c, rc, path, err, errlen);
  for (int v = 0; v < p->nvars; v++) free(global[v]);
  free(global);
  return rc;
}

// ------------------------------------------------------------ LoRA (issue 24)
//
// keras-hub's backbone.save_lora_weights / load_lora_weights format, a
// .lora.h5: lora/vars/rank (int64), then per adapted layer lora/<index>/
// vars/lora_kernel_a and lora_kernel_b (float32), <index> the layer's
// number in keras-hub's walk of the backbone (kdrt_lora.index).

static int lora_path(const kdrt_program *p, const char *path, char *err, size_t errlen) {
  if (!p->nlora)
    return kdrt_errf(err, errlen, "%s: this program has no LoRA (compile the model with kdcc "
                     "--lora-rank R)", path);
  if (!ends_with(path, ".lora.h5"))
    return kdrt_errf(err, errlen, "%s: a LoRA weights file's name ends in .lora.h5, as "
                     "keras-hub's save_lora_weights requires", path);
  return 0;
}

static int64_t lora_rank(const kdrt_program *p) {
  return p->vars[p->lora[0].b].layout.gshape[0];
}

int kdrt_lora_read(const kdrt_program *p, const int *coord, const char *path, float *params,
                   char *err, size_t errlen) {
  if (lora_path(p, path, err, errlen)) return -1;
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return kdrt_errf(err, errlen, "%s: cannot open it as HDF5 (a .lora.h5)", path);
  int rc = 0;
  int64_t rank = -1;
  if (!has_link(file, "lora/vars/rank")) {
    rc = kdrt_errf(err, errlen, "%s: no lora/vars/rank: not keras-hub's save_lora_weights "
                   "file", path);
  } else {
    hid_t ds = H5Dopen2(file, "lora/vars/rank", H5P_DEFAULT);
    if (ds < 0 || H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &rank) < 0)
      rc = kdrt_errf(err, errlen, "%s: cannot read lora/vars/rank", path);
    if (ds >= 0) H5Dclose(ds);
    if (!rc && rank != lora_rank(p))
      rc = kdrt_errf(err, errlen, "%s: LoRA rank %lld, but this program was compiled with "
                     "--lora-rank %lld", path, (long long)rank, (long long)lora_rank(p));
  }
  for (int i = 0; i < p->nlora && !rc; i++)
    for (int k = 0; k < 2 && !rc; k++) {
      int v = k ? p->lora[i].b : p->lora[i].a;
      char ds[128];
      snprintf(ds, sizeof ds, "lora/%d/vars/lora_kernel_%c", p->lora[i].index, k ? 'b' : 'a');
      rc = read_dataset(file, path, ds, p, &p->vars[v], coord, params + p->vars[v].offset, err,
                        errlen);
    }
  H5Fclose(file);
  return rc;
}

int kdrt_lora_load(kdrt_ctx *c, const char *path, char *err, size_t errlen) {
  return all_read(kdrt_lora_read(c->prog, c->coord, path, c->params, err, errlen), path,
                  "LoRA weights", err, errlen);
}

int kdrt_lora_save(kdrt_ctx *c, const char *path, char *err, size_t errlen) {
  const kdrt_program *p = c->prog;
  if (lora_path(p, path, err, errlen)) return -1;
  float **global = calloc((size_t)(2 * p->nlora), sizeof *global);
  if (!global) kdrt_fatal(c, "out of memory");
  for (int i = 0; i < 2 * p->nlora; i++)
    global[i] = gather_var(c, &p->vars[i % 2 ? p->lora[i / 2].b : p->lora[i / 2].a]);
  int rc = 0;
  if (c->rank == 0) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    rc = f < 0 ? -1 : 0;
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    int64_t rank = lora_rank(p);
    hid_t g = rc ? -1 : H5Gcreate2(f, "lora/vars", lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0 || write_dataset(g, "rank", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, NULL, &rank))
      rc = -1;
    if (g >= 0) H5Gclose(g);
    for (int i = 0; i < p->nlora && !rc; i++) {
      char name[64];
      snprintf(name, sizeof name, "lora/%d/vars", p->lora[i].index);
      hid_t lg = H5Gcreate2(f, name, lcpl, H5P_DEFAULT, H5P_DEFAULT);
      for (int k = 0; k < 2 && lg >= 0 && !rc; k++) {
        const kdrt_var *var = &p->vars[k ? p->lora[i].b : p->lora[i].a];
        rc = write_dataset(lg, k ? "lora_kernel_b" : "lora_kernel_a", H5T_IEEE_F32LE,
                           H5T_NATIVE_FLOAT, var->layout.rank, var->layout.gshape,
                           global[2 * i + k]);
      }
      if (lg < 0) rc = -1;
      else H5Gclose(lg);
    }
    H5Pclose(lcpl);
    if (f >= 0 && H5Fclose(f) < 0) rc = -1;
    if (rc) kdrt_errf(err, errlen, "%s: HDF5 could not write %s", path, tmp);
    else if (kdrt_commit_file(tmp, path))
      rc = kdrt_errf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    if (rc) unlink(tmp);
  }
  rc = rank0_wrote(c, rc, path, err, errlen);
  for (int i = 0; i < 2 * p->nlora; i++) free(global[i]);
  free(global);
  return rc;
}

// ------------------------------------------------------------ forward-only commands

// The start of every forward-only command (predict, generate): MPI, this
// rank's place on the mesh, the buffers, and the weights (--weights, else
// the archive the program was compiled from, else random from the seed
// when init_random or there is none). Nonzero: err says why. The end of
// one is fatal.c's kdrt_leave.
int kdrt_infer_open(kdrt_ctx *c, const char *who, const kdrt_program *p, int *argc, char ***argv,
                    const char *weights, int init_random, char *err, size_t errlen) {
  KDRT_MPI(MPI_Init(argc, argv));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  c->prog = p;
  KDRT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
  KDRT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &c->world));
  if (p->ninputs < 1 || p->ninputs > KDRT_MAX_FILES || p->nlabels > KDRT_MAX_FILES ||
      p->noutputs < 1 || p->noutputs > KDRT_MAX_FILES || p->nlogs < 1)
    return kdrt_errf(err, errlen, "this program's description is not one this runtime takes; "
                     "recompile it with this kdcc");
  for (int o = 0; o < p->noutputs; o++)
    if (p->outputs[o].layout.rank < 1 || p->outputs[o].offset == SIZE_MAX)
      return kdrt_errf(err, errlen, "output '%s' is not one buffer of the activation arena in "
                       "this program, so %s cannot read it", p->outputs[o].name, who);
  int devices = 1;
  for (int a = 0; a < p->mesh_ndim; a++) devices *= p->mesh_shape[a];
  if (devices != c->world)
    return kdrt_errf(err, errlen, "this program was compiled for %d device%s but runs on %d "
                     "rank%s; run it as: mpirun -np %d %s %s ...", devices, devices == 1 ? "" : "s",
                     c->world, c->world == 1 ? "" : "s", devices, program_invocation_name, who);
  coords_of(p, c->rank, c->coord);
  c->lr = p->learning_rate;
  size_t floats[3] = {p->param_floats, p->grad_floats, p->arena_floats};
  float **bufs[3] = {&c->params, &c->grads, &c->arena};
  for (int i = 0; i < 3; i++)
    if (!(*bufs[i] = kdrt_buffer_alloc(floats[i]))) kdrt_fatal(c, "out of memory");
  p->init(c);
  kdrt_round_vars(c);
  const char *wfile = weights ? weights : init_random ? NULL : kdrt_program_archive(p);
  if (!weights && !init_random && p->weights_file && !wfile) {
    kdrt_archive_gone(p, err, errlen);
    return 1;
  }
  return wfile ? kdrt_weights_load(c, wfile, err, errlen) : 0;
}
