// json.c: JSON text -> jansson tree, with a line:column for every value.
//
// jansson parses and builds the tree but forgets positions. After a
// successful parse we scan the text a second time, in step with the tree:
// jansson keeps object members in the order they were written (and we
// reject duplicate keys), so the i-th member in the text is the i-th member
// the object iterator yields. The scan only skips tokens, it never decides
// anything, because jansson has already accepted the text.
//
// Positions live in a hash map keyed by the json_t pointer. Each container
// also keeps the positions of its children (and, for objects, of the keys),
// because true/false/null are shared singletons in jansson and have no
// identity of their own. Lines and columns are 1-based; a column counts
// characters (UTF-8 sequences), as jansson's own error columns do.
//
// A `.keras` file is a zip archive; its `config.json` member is read with
// libzip, every failure reported with libzip's own reason. No JSON text
// (a file, or config.json as it inflates) may be over MAX_JSON_BYTES: that
// is checked before anything is read whole.
#include "kdcc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zip.h>

// A Keras config.json is at most a few MiB; this bounds what a damaged or
// hostile archive can make kdcc inflate (README: Limits).
#define MAX_JSON_BYTES (64 << 20)

typedef struct {
  const json_t *v;
  Loc loc;
  int n;            // containers: number of children
  Loc *kids;        // containers: where each child value starts
  Loc *keylocs;     // objects: where each key starts
  const char **keys; // objects: member keys in order
} LocRec;

static LocRec *table;
static size_t table_cap, table_len;
static Loc singleton_loc[3]; // true, false, null: their last recorded use

static size_t hash_ptr(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x;
}

static LocRec *lookup(const json_t *v) {
  if (!table_cap)
    return NULL;
  for (size_t i = hash_ptr(v) & (table_cap - 1);; i = (i + 1) & (table_cap - 1)) {
    if (table[i].v == v)
      return &table[i];
    if (!table[i].v)
      return NULL;
  }
}

static LocRec *insert(const json_t *v) {
  if (2 * (table_len + 1) > table_cap) {
    size_t old_cap = table_cap;
    LocRec *old = table;
    table_cap = old_cap ? 2 * old_cap : 1024;
    table = xcalloc(table_cap, sizeof *table);
    table_len = 0;
    for (size_t i = 0; i < old_cap; i++)
      if (old[i].v)
        *insert(old[i].v) = old[i];
    xfree(old);
  }
  for (size_t i = hash_ptr(v) & (table_cap - 1);; i = (i + 1) & (table_cap - 1)) {
    if (table[i].v == v)
      return &table[i];
    if (!table[i].v) {
      table[i].v = v;
      table_len++;
      return &table[i];
    }
  }
}

// ---- the second scan

typedef struct {
  const char *name;
  const char *p, *end;
  int line, col;
} Scan;

static void advance(Scan *s) {
  unsigned char c = (unsigned char)*s->p++;
  if (c == '\n') {
    s->line++;
    s->col = 1;
  } else if ((c & 0xC0) != 0x80) {
    s->col++; // continuation bytes of a UTF-8 sequence do not count
  }
}

static void skip_ws(Scan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
    advance(s);
}

static Loc here(Scan *s) {
  return (Loc){s->name, s->line, s->col};
}

static void expect(Scan *s, char c) {
  skip_ws(s);
  if (s->p >= s->end || *s->p != c)
    unreachable(); // jansson accepted the text, so this cannot happen
  advance(s);
}

static void skip_string(Scan *s) {
  expect(s, '"');
  while (s->p < s->end && *s->p != '"') {
    if (*s->p == '\\')
      advance(s);
    advance(s);
  }
  expect(s, '"');
}

static void skip_scalar(Scan *s) {
  while (s->p < s->end && strchr("+-.0123456789eEtruefalsn", *s->p))
    advance(s);
}

static Loc walk(Scan *s, json_t *v) {
  skip_ws(s);
  Loc loc = here(s);
  switch (json_typeof(v)) {
  case JSON_TRUE: singleton_loc[0] = loc; skip_scalar(s); return loc;
  case JSON_FALSE: singleton_loc[1] = loc; skip_scalar(s); return loc;
  case JSON_NULL: singleton_loc[2] = loc; skip_scalar(s); return loc;
  default: break;
  }
  LocRec *r = insert(v);
  r->loc = loc;
  if (json_is_object(v)) {
    int n = (int)json_object_size(v);
    r->n = n;
    r->kids = xcalloc((size_t)n, sizeof(Loc));
    r->keylocs = xcalloc((size_t)n, sizeof(Loc));
    r->keys = xcalloc((size_t)n, sizeof(char *));
    expect(s, '{');
    int i = 0;
    for (void *it = json_object_iter(v); it; it = json_object_iter_next(v, it), i++) {
      if (i > 0)
        expect(s, ',');
      skip_ws(s);
      Loc kl = here(s);
      skip_string(s);
      expect(s, ':');
      const char *key = json_object_iter_key(it);
      Loc vl = walk(s, json_object_iter_value(it));
      r = lookup(v); // the table may have grown while walking the child
      r->keys[i] = key;
      r->keylocs[i] = kl;
      r->kids[i] = vl;
    }
    expect(s, '}');
  } else if (json_is_array(v)) {
    int n = (int)json_array_size(v);
    r->n = n;
    r->kids = xcalloc((size_t)n, sizeof(Loc));
    expect(s, '[');
    for (int i = 0; i < n; i++) {
      if (i > 0)
        expect(s, ',');
      Loc vl = walk(s, json_array_get(v, (size_t)i));
      lookup(v)->kids[i] = vl;
    }
    expect(s, ']');
  } else if (json_is_string(v)) {
    skip_string(s);
  } else {
    skip_scalar(s);
  }
  return loc;
}

json_t *json_load_text_located(const char *name, const char *text, size_t len) {
  json_error_t err;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
  if (!root) {
    // jansson names its flag for NUL characters; the user wrote no flag
    const char *flag = " is not allowed without JSON_ALLOW_NUL", *p = strstr(err.text, flag);
    char *msg = p ? format("%.*s (a NUL character) in a string is not supported%s",
                           (int)(p - err.text), err.text, p + strlen(flag))
                  : err.text;
    error_at((Loc){name, err.line > 0 ? err.line : 1, err.column > 0 ? err.column : 1}, "%s",
             msg);
  }
  // A UTF-8 byte order mark is not JSON; jansson rejects it, so the text
  // starts with the root value (after optional white space).
  Scan s = {xstrdup(name), text, text + len, 1, 1};
  walk(&s, root);
  return root;
}

// ---- .keras archives

// Every error about the archive: the archive is closed first.
static noreturn void zip_fail(zip_t *z, zip_file_t *f, const char *path, char *msg) {
  if (f) zip_fclose(f);
  if (z) zip_discard(z);
  error_at((Loc){path, 0, 0}, "%s", msg);
}

// The `config.json` member of the .keras (zip) archive at path, through
// libzip, as a buffer of *out_len bytes (and a NUL).
static char *zip_config_json(const char *path, size_t *out_len) {
  int zerr = 0;
  zip_t *z = zip_open(path, ZIP_RDONLY, &zerr);
  if (!z) {
    if (zerr == ZIP_ER_NOZIP)
      zip_fail(NULL, NULL, path, "not a .keras file (not a zip archive, or a truncated one)");
    zip_error_t ze;
    zip_error_init_with_code(&ze, zerr);
    char *msg = format("damaged .keras archive: %s", zip_error_strerror(&ze));
    zip_error_fini(&ze);
    zip_fail(NULL, NULL, path, msg);
  }
  zip_int64_t idx = zip_name_locate(z, "config.json", 0);
  if (idx < 0) zip_fail(z, NULL, path, "no config.json in the .keras archive");
  zip_stat_t st;
  if (zip_stat_index(z, (zip_uint64_t)idx, 0, &st) != 0)
    zip_fail(z, NULL, path, format("damaged .keras archive: config.json: %s", zip_strerror(z)));
  if (!(st.valid & ZIP_STAT_SIZE))
    zip_fail(z, NULL, path, "damaged .keras archive: config.json has no size");
  if (st.size > MAX_JSON_BYTES)
    zip_fail(z, NULL, path, format("config.json inflates to %llu bytes; kdcc reads at most %d "
                                   "MiB", (unsigned long long)st.size, MAX_JSON_BYTES >> 20));
  zip_file_t *f = zip_fopen_index(z, (zip_uint64_t)idx, 0);
  if (!f)
    zip_fail(z, NULL, path, format("cannot open config.json in the .keras archive: %s",
                                   zip_strerror(z)));
  char *out = xcalloc((size_t)st.size + 1, 1);
  zip_int64_t n = st.size ? zip_fread(f, out, st.size) : 0;
  if (n < 0)
    zip_fail(z, f, path, format("damaged .keras archive: cannot read config.json: %s",
                                zip_file_strerror(f)));
  if ((zip_uint64_t)n != st.size)
    zip_fail(z, f, path, format("damaged .keras archive: config.json ends after %lld of the "
                                "%llu bytes its entry gives", (long long)n,
                                (unsigned long long)st.size));
  // Read on to the end: libzip checks the CRC there.
  char more;
  zip_int64_t m = zip_fread(f, &more, 1);
  if (m < 0)
    zip_fail(z, f, path, format("damaged .keras archive: cannot read config.json: %s",
                                zip_file_strerror(f)));
  if (m > 0)
    zip_fail(z, f, path, format("damaged .keras archive: config.json holds more than the %llu "
                                "bytes its entry gives", (unsigned long long)st.size));
  zip_fclose(f);
  zip_discard(z);
  *out_len = (size_t)st.size;
  return out;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    error("cannot open '%s': %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = xcalloc(cap + 1, 1);
  for (;;) {
    n += fread(buf + n, 1, cap - n, f);
    if (n > MAX_JSON_BYTES) {
      fclose(f);
      error_at((Loc){path, 0, 0}, "the file is larger than %d MiB, the most kdcc reads",
               MAX_JSON_BYTES >> 20);
    }
    if (n < cap || ferror(f))
      break;
    cap = cap * 2 > MAX_JSON_BYTES ? MAX_JSON_BYTES + 1 : cap * 2;
    buf = xrealloc(buf, cap + 1);
  }
  if (ferror(f)) {
    int e = errno;
    fclose(f);
    error("cannot read '%s': %s", path, strerror(e));
  }
  fclose(f);
  buf[n] = 0;
  *len = n;
  return buf;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

json_t *json_load_file_located(const char *path) {
  size_t len;
  if (ends_with(path, ".keras")) {
    if (access(path, R_OK) != 0) error("cannot open '%s': %s", path, strerror(errno));
    char *conf = zip_config_json(path, &len);
    // Positions are those inside the config.json member.
    return json_load_text_located(path, conf, len);
  }
  char *text = read_file(path, &len);
  return json_load_text_located(path, text, len);
}

void json_forget_locations(void) {
  table = NULL;
  table_cap = table_len = 0;
  memset(singleton_loc, 0, sizeof singleton_loc);
}

// ---- queries

Loc jloc(const json_t *v) {
  if (!v)
    return (Loc){0};
  switch (json_typeof(v)) {
  case JSON_TRUE: return singleton_loc[0];
  case JSON_FALSE: return singleton_loc[1];
  case JSON_NULL: return singleton_loc[2];
  default: break;
  }
  LocRec *r = lookup(v);
  return r ? r->loc : (Loc){0};
}

static int key_index(const LocRec *r, const char *key) {
  if (r && r->keys)
    for (int i = 0; i < r->n; i++)
      if (strcmp(r->keys[i], key) == 0)
        return i;
  return -1;
}

Loc jloc_key(const json_t *obj, const char *key) {
  LocRec *r = obj ? lookup(obj) : NULL;
  int i = key_index(r, key);
  return i >= 0 ? r->kids[i] : jloc(obj);
}

Loc jloc_keyname(const json_t *obj, const char *key) {
  LocRec *r = obj ? lookup(obj) : NULL;
  int i = key_index(r, key);
  return i >= 0 ? r->keylocs[i] : jloc(obj);
}

const char *json_get_str(const json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

Loc jloc_idx(const json_t *arr, size_t i) {
  LocRec *r = arr ? lookup(arr) : NULL;
  if (r && r->kids && i < (size_t)r->n)
    return r->kids[i];
  return jloc(arr);
}

void jloc_alias(const json_t *v, Loc at) {
  LocRec *r = insert(v);
  if (!r->loc.line) r->loc = at;
}
