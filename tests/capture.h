// capture.h: run a piece of compiler code in a child process and capture
// its stderr and exit status, so tests can check diagnostics by their exact
// text even when the code exits (error_at calls exit(1)).
//
//   Captured c;
//   IN_CHILD(c, load_model("tests/bad/cycle.json"));
//   cr_assert_eq(c.status, 1);
//   cr_assert_str_eq(c.err, "tests/bad/cycle.json:3:5: error: ...\n");
#ifndef CAPTURE_H
#define CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  int status; // exit status; 128+signal when killed by a signal
  char err[8192];
} Captured;

static inline void capture_child_begin(FILE *tmp) {
  dup2(fileno(tmp), 2);
}

static inline void capture_finish(Captured *c, pid_t pid, FILE *tmp) {
  int st = 0;
  waitpid(pid, &st, 0);
  c->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  rewind(tmp);
  size_t n = fread(c->err, 1, sizeof c->err - 1, tmp);
  c->err[n] = '\0';
  fclose(tmp);
}

// Runs the statements in a forked child; the child exits 0 if they return.
#define IN_CHILD(cap, ...)                                                                 \
  do {                                                                                     \
    FILE *tmp_ = tmpfile();                                                                \
    fflush(NULL);                                                                          \
    pid_t pid_ = fork();                                                                   \
    if (pid_ == 0) {                                                                       \
      capture_child_begin(tmp_);                                                           \
      __VA_ARGS__;                                                                         \
      fflush(stderr);                                                                      \
      _exit(0);                                                                            \
    }                                                                                      \
    capture_finish(&(cap), pid_, tmp_);                                                    \
  } while (0)

#endif
