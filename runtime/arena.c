// arena.c: the activation arena's plan, replayed for a batch larger than
// the compiled one.
//
// kdcc plans the arena for its --batch-size (memplan.c: each value's
// buffer taken first-fit from the free space when it is computed, given
// back after its last reader) and writes the offsets into the program
// (AO[]), with the plan's steps (arena_plan): each buffer k floats per row
// of its batch dim. A run with more rows replays those steps here for its
// batch, so the offsets stay disjoint; kdrt_main first replays the
// compiled batch and checks that it gives the program's offsets.
#include "kdrt.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

// kdcc's memplan.c first fit, step for step: the two must agree (kdrt_main
// checks the replay for the compiled batch against the program's offsets).
typedef struct {
  int64_t off, len;
} span;

static int cmp_span(const void *x, const void *y) {
  const span *a = x, *b = y;
  return (a->off > b->off) - (a->off < b->off);
}

static int64_t first_fit(span *fr, int *nfree, int64_t *peak, int64_t len) {
  for (int i = 0; i < *nfree; i++)
    if (fr[i].len >= len) {
      int64_t off = fr[i].off;
      fr[i].off += len, fr[i].len -= len;
      return off;
    }
  for (int i = 0; i < *nfree; i++) // grow at the end: extend a trailing free span
    if (fr[i].off + fr[i].len == *peak) {
      int64_t off = fr[i].off;
      *peak = off + len, fr[i].len = 0;
      return off;
    }
  int64_t off = *peak;
  *peak += len;
  return off;
}

static void give_back(span *fr, int *nfree, int64_t off, int64_t len) {
  fr[(*nfree)++] = (span){off, len};
  qsort(fr, (size_t)*nfree, sizeof *fr, cmp_span);
  int k = 0; // merge neighbours, drop empties
  for (int i = 0; i < *nfree; i++) {
    if (!fr[i].len) continue;
    if (k && fr[k - 1].off + fr[k - 1].len == fr[i].off) fr[k - 1].len += fr[i].len;
    else fr[k++] = fr[i];
  }
  *nfree = k;
}

static int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }

size_t kdrt_arena_plan(const kdrt_program *p, int64_t B) {
  if (!p->narena_plan) return p->arena_floats;
  int nslots = p->arena_plan[p->narena_plan - 1].slot; // the last step is a scratch one
  int64_t *len = calloc((size_t)nslots + 1, sizeof *len), peak = 0, scratch = 0;
  span *fr = calloc((size_t)p->narena_plan + 8, sizeof *fr);
  if (!len || !fr) { // kdrt_main says so: this file calls nothing of the runtime's
    free(len), free(fr);
    return SIZE_MAX;
  }
  int nfree = 0;
  for (int i = 0; i < p->narena_plan; i++) {
    const kdrt_arena_op *s = &p->arena_plan[i];
    int64_t n = s->k * (s->parts ? (B + s->parts - 1) / s->parts : 1);
    if (s->op == KDRT_ARENA_SCRATCH && n > scratch) scratch = n;
    if (s->op == KDRT_ARENA_ALLOC)
      len[s->slot] = align16(n), p->arena_off[s->slot] = first_fit(fr, &nfree, &peak, len[s->slot]);
    if (s->op == KDRT_ARENA_FREE) give_back(fr, &nfree, p->arena_off[s->slot], len[s->slot]);
  }
  p->arena_off[nslots] = align16(peak);
  free(len), free(fr);
  return (size_t)(align16(peak) + align16(scratch));
}

// The big buffers come from mmap, whose pages the kernel hands out zeroed
// when first touched, so nothing is written here. A memset of every byte was
// most of a large program's start: a GPT-2 124M at batch 8 has a 15 GB host
// arena, which the CUDA program never reads (its arena is on the GPU) and
// which took most of its 17 s before the first step (issue 22). The CPU
// program's threads now fault in the pages where they first compute.
// The mapping's length sits in a 64-byte header before the floats.
#define BUF_HEAD 64

float *kdrt_buffer_alloc(size_t n) {
  size_t bytes = BUF_HEAD + (n * sizeof(float) + 63) / 64 * 64;
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  *(size_t *)m = bytes;
  return (float *)((char *)m + BUF_HEAD);
}

void kdrt_buffer_free(float *p) {
  if (!p) return;
  char *m = (char *)p - BUF_HEAD;
  munmap(m, *(size_t *)m);
}
