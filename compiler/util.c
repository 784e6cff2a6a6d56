// util.c: diagnostics and small allocation helpers.
//
// Every user-facing diagnostic goes through error_at / warn_at so that all
// messages share one shape, `file:line:col: error: msg`, which editors and
// the tests both parse. A location with no line prints as `file: error: msg`,
// and one with no file as `kdcc: error: msg`. Errors flush stderr and exit(1).
#include "kdcc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

bool opt_quiet_warnings;

static void print_loc(Loc loc) {
  if (!loc.file)
    fprintf(stderr, "kdcc: ");
  else if (loc.line <= 0)
    fprintf(stderr, "%s: ", loc.file);
  else
    fprintf(stderr, "%s:%d:%d: ", loc.file, loc.line, loc.col);
}

noreturn void error_at(Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  print_loc(loc);
  fprintf(stderr, "error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  exit(1);
}

void warn_at(Loc loc, const char *fmt, ...) {
  if (opt_quiet_warnings)
    return;
  va_list ap;
  va_start(ap, fmt);
  print_loc(loc);
  fprintf(stderr, "warning: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
}

noreturn void error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "kdcc: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  exit(1);
}

noreturn void fatal_internal(const char *file, int line, const char *msg) {
  fprintf(stderr, "kdcc: internal error at %s:%d: %s\n", file, line, msg);
  fflush(stderr);
  abort();
}

void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p)
    error("out of memory");
  return p;
}

char *xstrdup(const char *s) {
  char *p = strdup(s);
  if (!p)
    error("out of memory");
  return p;
}

char *format(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0)
    error("out of memory");
  return s;
}

void *xgrow(void *p, int n, int *cap, size_t size) {
  if (n < *cap) return p;
  *cap = *cap ? 2 * *cap : 16;
  p = realloc(p, (size_t)*cap * size);
  if (!p) error("out of memory");
  return p;
}
