// A tap on `./train generate`'s steps, for tests/sh/blocks.sh: linked into
// a program (KDCC_CC="mpicc tests/decode_tap.c -Wl,--wrap=kdrt_main"), it
// appends the output of every prefill and decode step, [batch, .., vocabulary]
// as rank 0 gathers it, to the file $KDRT_TAP, so that two programs' steps
// (their blocks as loops, and written out) compare bit for bit.
#include "kdrt.h"

#include <stdio.h>
#include <stdlib.h>

int __real_kdrt_main(int argc, char **argv, const kdrt_program *prog);
int __wrap_kdrt_main(int argc, char **argv, const kdrt_program *prog);

static kdrt_decode dec, pre;
static void (*dec_step)(kdrt_ctx *c, const void *const *x);
static void (*pre_step)(kdrt_ctx *c, const void *const *x);

static void dump(kdrt_ctx *c, const kdrt_decode *d) {
  size_t n = 1;
  for (int i = 0; i < d->output.layout.rank; i++) n *= (size_t)d->output.layout.gshape[i];
  float *out = malloc(sizeof *out * n);
  if (!out) abort();
  kdrt_gather_global(c, &d->output.layout, c->arena + d->output.offset, out);
  FILE *f = c->rank == 0 ? fopen(getenv("KDRT_TAP"), "ab") : NULL;
  if (c->rank == 0 && (!f || fwrite(out, sizeof *out, n, f) != n || fclose(f) != 0)) abort();
  free(out);
}

static void tap_decode(kdrt_ctx *c, const void *const *x) {
  dec_step(c, x);
  dump(c, &dec);
}

static void tap_prefill(kdrt_ctx *c, const void *const *x) {
  pre_step(c, x);
  dump(c, &pre);
}

int __wrap_kdrt_main(int argc, char **argv, const kdrt_program *prog) {
  if (kdrt_decode_program) {
    dec = *kdrt_decode_program, dec_step = dec.step, dec.step = tap_decode;
    kdrt_decode_program = &dec;
  }
  if (kdrt_prefill_program) {
    pre = *kdrt_prefill_program, pre_step = pre.step, pre.step = tap_prefill;
    kdrt_prefill_program = &pre;
  }
  return __real_kdrt_main(argc, argv, prog);
}
