// util.c: diagnostics, allocation and size arithmetic.
//
// Every user-facing diagnostic goes through error_at / warn_at so that all
// messages share one shape, `file:line:col: error: msg`, which editors and
// the tests both parse. A location with no line prints as `file: error: msg`,
// and one with no file as `kdcc: error: msg`; one line each, whatever the
// user's names hold. Errors flush and exit(1).
//
// Memory: kdcc allocates and never frees (one compilation, then exit), but
// every block is linked into one list, so that a process that compiles many
// times (the fuzz target) can give everything back with release_all().
//
// Sizes: a dimension is at most MAX_DIM and a tensor holds at most
// MAX_ELEMS elements; the loader and the graph builder reject larger ones
// at the JSON value. Products and sums of sizes use size_mul / size_add,
// which saturate at INT64_MAX instead of wrapping, so that a chain of them
// is checked once, at its end.
#include "kdcc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

bool opt_quiet_warnings;
FILE *diag_out;
void (*error_exit)(void);

static FILE *diag(void) { return diag_out ? diag_out : stderr; }

static void print_loc(Loc loc) {
  if (!loc.file)
    fprintf(diag(), "kdcc: ");
  else if (loc.line <= 0)
    fprintf(diag(), "%s: ", loc.file);
  else
    fprintf(diag(), "%s:%d:%d: ", loc.file, loc.line, loc.col);
}

// The message on one line: control characters that came from the user's
// text (a layer named "a\nb") are written as escapes.
static void print_msg(const char *kind, const char *fmt, va_list ap) {
  char *s;
  if (vasprintf(&s, fmt, ap) < 0)
    s = NULL;
  fprintf(diag(), "%s: ", kind);
  for (const unsigned char *p = (const unsigned char *)(s ? s : "out of memory"); *p; p++) {
    if (*p == '\n') fputs("\\n", diag());
    else if (*p == '\t') fputs("\\t", diag());
    else if (*p == '\r') fputs("\\r", diag());
    else if (*p < 0x20 || *p == 0x7f) fprintf(diag(), "\\x%02x", *p);
    else fputc(*p, diag());
  }
  fputc('\n', diag());
  free(s);
}

static noreturn void stop(void) {
  fflush(diag());
  if (error_exit) error_exit(); // does not return
  exit(1);
}

noreturn void error_at(Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  print_loc(loc);
  print_msg("error", fmt, ap);
  va_end(ap);
  stop();
}

void warn_at(Loc loc, const char *fmt, ...) {
  if (opt_quiet_warnings)
    return;
  va_list ap;
  va_start(ap, fmt);
  print_loc(loc);
  print_msg("warning", fmt, ap);
  va_end(ap);
  fflush(diag());
}

noreturn void error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  print_loc((Loc){0});
  print_msg("error", fmt, ap);
  va_end(ap);
  stop();
}

noreturn void fatal_internal(const char *file, int line, const char *msg) {
  fprintf(stderr, "kdcc: internal error at %s:%d: %s\n", file, line, msg);
  fflush(stderr);
  abort();
}

// ---- allocation

typedef struct Block {
  struct Block *prev, *next;
  max_align_t align[]; // the caller's memory follows, aligned as malloc's
} Block;

static Block blocks = {&blocks, &blocks};

static void *link_block(Block *b) {
  b->prev = &blocks;
  b->next = blocks.next;
  blocks.next->prev = b;
  blocks.next = b;
  return b->align;
}

static Block *unlink_block(void *p) {
  Block *b = (Block *)((char *)p - offsetof(Block, align));
  b->prev->next = b->next;
  b->next->prev = b->prev;
  return b;
}

void *xcalloc(size_t n, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(n ? n : 1, size ? size : 1, &bytes) ||
      bytes > SIZE_MAX - sizeof(Block))
    error("out of memory");
  Block *b = calloc(1, sizeof(Block) + bytes);
  if (!b)
    error("out of memory");
  return link_block(b);
}

void *xrealloc(void *p, size_t bytes) {
  if (!p)
    return xcalloc(1, bytes);
  if (bytes > SIZE_MAX - sizeof(Block))
    error("out of memory");
  Block *b = unlink_block(p), *nb = realloc(b, sizeof(Block) + bytes);
  if (!nb) {
    link_block(b);
    error("out of memory");
  }
  return link_block(nb);
}

void xfree(void *p) {
  if (p)
    free(unlink_block(p));
}

void release_all(void) {
  while (blocks.next != &blocks)
    free(unlink_block(blocks.next->align));
}

char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(xcalloc(1, n), s, n);
}

char *format(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0)
    error("out of memory");
  char *t = memcpy(xcalloc(1, (size_t)n + 1), s, (size_t)n + 1);
  free(s);
  return t;
}

void *xgrow(void *p, int n, int *cap, size_t size) {
  if (n < *cap) return p;
  if (*cap > INT32_MAX / 2) error("out of memory");
  *cap = *cap ? 2 * *cap : 16;
  return xrealloc(p, (size_t)*cap * size);
}

// ---- sizes

int64_t size_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

int64_t size_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

// ---- names

const char *name_flaw(const char *s) {
  if (!*s) return "is empty";
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7f) return "holds a control character";
    if (*p == '"') return "holds '\"'";
    if (*p == '\\') return "holds '\\'";
    if (*p == '/') return "holds '/'";
    if (*p == '?' && p[1] == '?') return "holds '\?\?'"; // a trigraph in ISO C
  }
  return NULL;
}
