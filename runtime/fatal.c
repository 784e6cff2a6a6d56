// fatal.c: how a generated program speaks and how it leaves on an error.
//
// Every message starts with the program's name (the basename of argv[0],
// kdrt_set_program; "train" until then), or a forward-only command's. Three
// ways out:
//   kdrt_fail_all: an error every rank sees alike (options, data files):
//     rank 0 says it, every rank finalizes MPI and exits with the status;
//   kdrt_leave: the end of a forward-only command (predict, generate), an
//     error or not: as kdrt_fail_all (rank 0 says "who: " and the message,
//     if any), the buffers freed, and the status returned for main;
//   kdrt_fatal: an error of one rank: it says so with its rank, and
//     MPI_Abort takes the whole job down (exit 1 without MPI).
// The first two let go of the communicators, so they are comm.c's (which
// calls kdrt_fatal: this file calls nothing above it, tests/sh/layering.sh).
// kdrt_errf is the convention of the file readers and the option parser:
// the message in a caller's buffer, -1 returned.
#include "kdrt.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kdrt_prog_name = "train";     // basename of argv[0], prefixes messages
const char *kdrt_prog_invoke = "./train"; // argv[0] as typed, for the mpirun hint

void kdrt_set_program(int argc, char **argv) {
  if (argc > 0 && argv[0]) {
    const char *slash = strrchr(argv[0], '/');
    kdrt_prog_name = slash ? slash + 1 : argv[0];
    kdrt_prog_invoke = argv[0];
  }
}

void kdrt_printf0(const kdrt_ctx *c, const char *fmt, ...) {
  if (c && c->rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

// "who: " and the message on stderr, on a line of its own after whatever
// stdout holds.
void kdrt_vsay(const char *who, const char *fmt, va_list ap) {
  fflush(stdout);
  fprintf(stderr, "%s: ", who);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

void kdrt_fatal(const kdrt_ctx *c, const char *fmt, ...) {
  int rank = c ? c->rank : -1, inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!c && inited && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char who[256];
  snprintf(who, sizeof who, "%s: rank %d", kdrt_prog_name, rank);
  va_list ap;
  va_start(ap, fmt);
  kdrt_vsay(who, fmt, ap);
  va_end(ap);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

int kdrt_errf(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}
