// rt_comm_check: every collective of runtime/comm.c on every mesh of the
// world's size, checked against a serial reference.
//
// Run under mpirun (tests/sh/rt_comm.sh does, with several -np). For a world
// of W ranks it walks every mesh shape with 1 to 4 axes whose product is W
// (for W = 8: (8,), (2,4), (4,2), (1,8), (2,2,2), ...), every group mask of
// that mesh, several tensor shapes of rank 1 to 3 and every dimension (and
// every from/to pair for all-to-all). Each rank builds its input from a
// formula of the *global* tensor and of its group, runs the collective, and
// compares its output element by element with what the formula says its
// block must hold. The reference never calls comm.c's block helpers: it maps
// multi-indices one element at a time. All values are small integers, so
// sums are exact and any difference is a bug.
//
// Uneven rows (kdrt_ctx.ragged, a step whose rows do not divide over the
// batch axis): with each axis in turn as the batch axis, every group that
// holds it moves blocks of unequal extent, cut as kdrt_rows_split cuts
// rows (some of them empty), by all-gather, reduce-scatter, slice and
// all-to-all, against the same kind of reference.
//
// And (issue 23) the loss scale's decision on every mesh: every rank the
// same, whichever rank's gradients are not finite; and all-gather and
// all-to-all of bfloat16 and float16 values in 16 bits (kdrt_allgather16,
// kdrt_alltoall16), even and uneven, with an even last dim: each element
// a distinct 16-bit pattern (subnormals, negatives), compared bit for bit.
//
// Exit status 0 when every rank saw every check pass; 1 otherwise, after
// printing the first failures.
#include "kdrt.h"
#include "kdrt_round.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int world_rank, world_size;
static long checks, failures;

static void fail(const char *what, const int *mesh, int nd, unsigned mask, const char *detail) {
  failures++;
  if (failures > 5) return;
  char m[64];
  size_t k = 0;
  for (int i = 0; i < nd; i++) k += (size_t)snprintf(m + k, sizeof m - k, "%s%d", i ? "," : "", mesh[i]);
  fprintf(stderr, "rank %d: FAIL %s on mesh (%s) mask 0x%x: %s\n", world_rank, what, m, mask,
          detail);
}

// ------------------------------------------------------------ the mesh

typedef struct {
  int nd;
  int shape[KDRT_MAX_AXES];
  const char *names[KDRT_MAX_AXES];
} mesh;

static void coords_of(const mesh *m, int rank, int *coord) {
  for (int a = m->nd - 1; a >= 0; a--) coord[a] = rank % m->shape[a], rank /= m->shape[a];
}

// Row-major index of coord over the axes in mask (the group index) or,
// with the complement, the group's id (its "color").
static int index_over(const mesh *m, const int *coord, unsigned mask) {
  int idx = 0;
  for (int a = 0; a < m->nd; a++)
    if (mask & (1u << a)) idx = idx * m->shape[a] + coord[a];
  return idx;
}

static int size_over(const mesh *m, unsigned mask) {
  int n = 1;
  for (int a = 0; a < m->nd; a++)
    if (mask & (1u << a)) n *= m->shape[a];
  return n;
}

// ------------------------------------------------------------ tensors

static int64_t numel(int r, const int64_t *s) {
  int64_t n = 1;
  for (int i = 0; i < r; i++) n *= s[i];
  return n;
}

static int64_t flat(int r, const int64_t *shape, const int64_t *idx) {
  int64_t f = 0;
  for (int i = 0; i < r; i++) f = f * shape[i] + idx[i];
  return f;
}

static int next_index(int r, const int64_t *shape, int64_t *idx) {
  for (int d = r - 1; d >= 0; d--) {
    if (++idx[d] < shape[d]) return 1;
    idx[d] = 0;
  }
  return 0;
}

// The global tensor of a group: distinct per group and per element; with
// kind (issue 23: KDRT_ROUND_*), a value of that 16-bit type whose 16 bits
// are distinct per element (a bijection of f mod 2^16: both signs,
// subnormals, zeros), made finite (an all-ones exponent loses its top bit).
static float gval16(int kind, int color, int64_t f) {
  if (!kind) return (float)(color * 10000 + f);
  uint16_t h = (uint16_t)(f * 40503 + color * 977);
  uint16_t exp = kind == KDRT_ROUND_F16 ? 0x7c00 : 0x7f80;
  if ((h & exp) == exp) h ^= 0x4000;
  return kind == KDRT_ROUND_F16 ? kdrt_f16_value(h) : kdrt_bf16_value(h);
}
static float gval(int color, int64_t f) { return gval16(0, color, f); }

static float *falloc(int64_t n) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (!p) abort();
  return p;
}

static void compare(const char *what, const mesh *m, unsigned mask, const float *got,
                    const float *want, int64_t n, int r, const int64_t *shape, int d1, int d2) {
  checks++;
  for (int64_t i = 0; i < n; i++) {
    if (memcmp(&got[i], &want[i], sizeof *got)) { // bit for bit: -0 is not 0
      char detail[256];
      size_t k = (size_t)snprintf(detail, sizeof detail, "shape (");
      for (int j = 0; j < r; j++)
        k += (size_t)snprintf(detail + k, sizeof detail - k, "%s%lld", j ? "," : "",
                              (long long)shape[j]);
      snprintf(detail + k, sizeof detail - k, ") dims %d,%d: element %lld is %g, want %g", d1,
               d2, (long long)i, got[i], want[i]);
      fail(what, m->shape, m->nd, mask, detail);
      return;
    }
  }
}

// ------------------------------------------------------------ one check each

static void check_allreduce(kdrt_ctx *c, const mesh *m, unsigned mask) {
  const int64_t n = 37;
  float *in = falloc(n), *out = falloc(n), *want = falloc(n);
  for (int64_t i = 0; i < n; i++) in[i] = (float)(world_rank * 100 + i), want[i] = 0;
  int coord[KDRT_MAX_AXES], other[KDRT_MAX_AXES];
  coords_of(m, world_rank, coord);
  unsigned rest = ~mask & ((1u << m->nd) - 1);
  for (int q = 0; q < world_size; q++) { // members: the ranks of my color
    coords_of(m, q, other);
    if (index_over(m, other, rest) != index_over(m, coord, rest)) continue;
    for (int64_t i = 0; i < n; i++) want[i] += (float)(q * 100 + i);
  }
  if (kdrt_group_size(c, mask) != size_over(m, mask))
    fail("group_size", m->shape, m->nd, mask, "wrong size");
  kdrt_allreduce(c, mask, in, out, (size_t)n);
  compare("allreduce", m, mask, out, want, n, 1, &n, 0, 0);
  kdrt_allreduce(c, mask, in, in, (size_t)n); // in place
  compare("allreduce in place", m, mask, in, want, n, 1, &n, 0, 0);
  free(in), free(out), free(want);
}

// Every member's values, chosen so the maximum is not always one rank's:
// in_q[i] = (q * 7 + i * 3) % 11 - 5; out = the maximum over members.
static float max_input(int q, int64_t i) { return (float)((q * 7 + i * 3) % 11 - 5); }

static void check_allreduce_max(kdrt_ctx *c, const mesh *m, unsigned mask) {
  const int64_t n = 29;
  float *in = falloc(n), *out = falloc(n), *want = falloc(n);
  for (int64_t i = 0; i < n; i++) in[i] = max_input(world_rank, i), want[i] = -1e30f;
  int coord[KDRT_MAX_AXES], other[KDRT_MAX_AXES];
  coords_of(m, world_rank, coord);
  unsigned rest = ~mask & ((1u << m->nd) - 1);
  for (int q = 0; q < world_size; q++) { // members: the ranks of my color
    coords_of(m, q, other);
    if (index_over(m, other, rest) != index_over(m, coord, rest)) continue;
    for (int64_t i = 0; i < n; i++)
      if (max_input(q, i) > want[i]) want[i] = max_input(q, i);
  }
  kdrt_allreduce_max(c, mask, in, out, (size_t)n);
  compare("allreduce_max", m, mask, out, want, n, 1, &n, 0, 0);
  kdrt_allreduce_max(c, mask, in, in, (size_t)n); // in place
  compare("allreduce_max in place", m, mask, in, want, n, 1, &n, 0, 0);
  free(in), free(out), free(want);
}

// Input of every member: in_g[i] = (g + 1) * 1000 + flat(i); out = sum over
// members of their block `me` along dim.
static void check_reduce_scatter(kdrt_ctx *c, const mesh *m, unsigned mask, int r,
                                 const int64_t *lshape, int dim) {
  int n = size_over(m, mask), coord[KDRT_MAX_AXES];
  coords_of(m, world_rank, coord);
  int me = index_over(m, coord, mask);
  int64_t total = numel(r, lshape), part = lshape[dim] / n;
  float *in = falloc(total), *out = falloc(total / n), *want = falloc(total / n);
  for (int64_t i = 0; i < total; i++) in[i] = (float)((me + 1) * 1000 + i);
  int64_t oshape[KDRT_MAX_RANK], idx[KDRT_MAX_RANK] = {0}, src[KDRT_MAX_RANK];
  memcpy(oshape, lshape, sizeof(int64_t) * (size_t)r);
  oshape[dim] = part;
  do {
    memcpy(src, idx, sizeof src);
    src[dim] = me * part + idx[dim];
    float s = 0;
    for (int g = 0; g < n; g++) s += (float)((g + 1) * 1000 + flat(r, lshape, src));
    want[flat(r, oshape, idx)] = s;
  } while (next_index(r, oshape, idx));
  kdrt_reduce_scatter(c, mask, r, lshape, dim, in, out);
  compare("reduce_scatter", m, mask, out, want, total / n, r, lshape, dim, -1);
  free(in), free(out), free(want);
}

static const char *kind_name(int kind) {
  return !kind ? "" : kind == KDRT_ROUND_F16 ? " (float16, in 16 bits)" : " (bfloat16, in 16 bits)";
}

// Global G of shape gshape (dim = lshape[dim] * n); member g holds block g.
// kind: KDRT_ROUND_* values moved by kdrt_allgather16; 0: floats.
static void check_allgather(kdrt_ctx *c, const mesh *m, unsigned mask, int r,
                            const int64_t *lshape, int dim, int kind) {
  int n = size_over(m, mask), coord[KDRT_MAX_AXES];
  coords_of(m, world_rank, coord);
  int me = index_over(m, coord, mask);
  int color = index_over(m, coord, ~mask & ((1u << m->nd) - 1));
  int64_t gshape[KDRT_MAX_RANK], idx[KDRT_MAX_RANK] = {0}, gi[KDRT_MAX_RANK];
  memcpy(gshape, lshape, sizeof(int64_t) * (size_t)r);
  gshape[dim] *= n;
  int64_t total = numel(r, lshape);
  float *in = falloc(total), *out = falloc(total * n), *want = falloc(total * n);
  do {
    memcpy(gi, idx, sizeof gi);
    gi[dim] += me * lshape[dim];
    in[flat(r, lshape, idx)] = gval16(kind, color, flat(r, gshape, gi));
  } while (next_index(r, lshape, idx));
  for (int64_t i = 0; i < total * n; i++) want[i] = gval16(kind, color, i);
  if (kind) kdrt_allgather16(c, kind, mask, r, lshape, dim, in, out);
  else kdrt_allgather(c, mask, r, lshape, dim, in, out);
  char what[64];
  snprintf(what, sizeof what, "allgather%s", kind_name(kind));
  compare(what, m, mask, out, want, total * n, r, lshape, dim, -1);
  free(in), free(out), free(want);
}

// Global G: member g holds block g along `from`; afterwards block g along `to`.
// kind: as check_allgather's (kdrt_alltoall16).
static void check_alltoall(kdrt_ctx *c, const mesh *m, unsigned mask, int r,
                           const int64_t *lshape, int from, int to, int kind) {
  int n = size_over(m, mask), coord[KDRT_MAX_AXES];
  coords_of(m, world_rank, coord);
  int me = index_over(m, coord, mask);
  int color = index_over(m, coord, ~mask & ((1u << m->nd) - 1));
  int64_t gshape[KDRT_MAX_RANK], oshape[KDRT_MAX_RANK], idx[KDRT_MAX_RANK] = {0},
          gi[KDRT_MAX_RANK];
  memcpy(gshape, lshape, sizeof(int64_t) * (size_t)r);
  gshape[from] *= n;
  memcpy(oshape, gshape, sizeof gshape);
  oshape[to] /= n;
  int64_t total = numel(r, lshape);
  float *in = falloc(total), *out = falloc(total), *want = falloc(total);
  do {
    memcpy(gi, idx, sizeof gi);
    gi[from] += me * lshape[from];
    in[flat(r, lshape, idx)] = gval16(kind, color, flat(r, gshape, gi));
  } while (next_index(r, lshape, idx));
  memset(idx, 0, sizeof idx);
  do {
    memcpy(gi, idx, sizeof gi);
    gi[to] += me * oshape[to];
    want[flat(r, oshape, idx)] = gval16(kind, color, flat(r, gshape, gi));
  } while (next_index(r, oshape, idx));
  if (kind) kdrt_alltoall16(c, kind, mask, r, lshape, from, to, in, out);
  else kdrt_alltoall(c, mask, r, lshape, from, to, in, out);
  char what[64];
  snprintf(what, sizeof what, "alltoall%s", kind_name(kind));
  compare(what, m, mask, out, want, total, r, lshape, from, to);
  free(in), free(out), free(want);
}

static void check_slice(kdrt_ctx *c, const mesh *m, unsigned mask, int r, const int64_t *lshape,
                        int dim) {
  int n = size_over(m, mask), coord[KDRT_MAX_AXES];
  coords_of(m, world_rank, coord);
  int me = index_over(m, coord, mask);
  int64_t oshape[KDRT_MAX_RANK], idx[KDRT_MAX_RANK] = {0}, gi[KDRT_MAX_RANK];
  memcpy(oshape, lshape, sizeof(int64_t) * (size_t)r);
  oshape[dim] /= n;
  int64_t total = numel(r, lshape);
  float *in = falloc(total), *out = falloc(total / n), *want = falloc(total / n);
  for (int64_t i = 0; i < total; i++) in[i] = gval(0, i);
  do {
    memcpy(gi, idx, sizeof gi);
    gi[dim] += me * oshape[dim];
    want[flat(r, oshape, idx)] = gval(0, flat(r, lshape, gi));
  } while (next_index(r, oshape, idx));
  kdrt_slice(c, mask, r, lshape, dim, in, out);
  compare("slice", m, mask, out, want, total / n, r, lshape, dim, -1);
  free(in), free(out), free(want);
}

// ------------------------------------------------------------ uneven rows

// A dim of global extent G (G % n != 0 for the group) cut over the group as
// rows are: member g holds [first(g), first(g) + ext(g)).
static int64_t ufirst(int64_t G, int n, int g) {
  int64_t f, e;
  kdrt_rows_split(G, n, g, &f, &e);
  return f;
}
static int64_t uext(int64_t G, int n, int g) {
  int64_t f, e;
  kdrt_rows_split(G, n, g, &f, &e);
  return e;
}

// The four dimension-wise collectives with a dim of global extent G cut
// unevenly over the group of mask (c->ragged, mask holds the batch axis);
// `other` is all-to-all's second dim (extent base[other]). kind (issue
// 23): all-gather and all-to-all of KDRT_ROUND_* values in 16 bits, the
// last dim (not `dim`: never the batch) 2 n.
static void check_uneven(kdrt_ctx *c, const mesh *m, unsigned mask, int r, int dim, int other,
                         int64_t G, int kind) {
  static const int64_t base[3] = {2, 3, 2};
  int n = size_over(m, mask), coord[KDRT_MAX_AXES];
  coords_of(m, world_rank, coord);
  int me = index_over(m, coord, mask);
  int color = index_over(m, coord, ~mask & ((1u << m->nd) - 1));
  int64_t gshape[KDRT_MAX_RANK], lshape[KDRT_MAX_RANK], idx[KDRT_MAX_RANK] = {0},
          gi[KDRT_MAX_RANK];
  memcpy(gshape, base, sizeof base);
  if (kind) gshape[r - 1] = 2 * n;
  gshape[dim] = G;
  memcpy(lshape, gshape, sizeof gshape);
  lshape[dim] = uext(G, n, me);
  int64_t gtotal = numel(r, gshape), ltotal = numel(r, lshape);
  float *gin = falloc(gtotal), *lin = falloc(ltotal), *out = falloc(gtotal),
        *want = falloc(gtotal);
  for (int64_t i = 0; i < gtotal; i++) gin[i] = gval16(kind, color, i);
  // my block of G along dim
  if (ltotal) do {
    memcpy(gi, idx, sizeof gi);
    gi[dim] += ufirst(G, n, me);
    lin[flat(r, lshape, idx)] = gval16(kind, color, flat(r, gshape, gi));
    want[flat(r, lshape, idx)] = gval16(kind, color, flat(r, gshape, gi));
  } while (next_index(r, lshape, idx));

  // all-gather: every block back into G
  char what[64];
  snprintf(what, sizeof what, "allgather (uneven)%s", kind_name(kind));
  if (kind) kdrt_allgather16(c, kind, mask, r, lshape, dim, lin, out);
  else kdrt_allgather(c, mask, r, lshape, dim, lin, out);
  compare(what, m, mask, out, gin, gtotal, r, gshape, dim, -1);
  float *in = falloc(gtotal);
  if (!kind) { // (the sums stay float32: no 16-bit slice or reduce-scatter)
    // slice: my block of G
    kdrt_slice(c, mask, r, gshape, dim, gin, out);
    compare("slice (uneven)", m, mask, out, want, ltotal, r, gshape, dim, -1);
    // reduce-scatter: member g's input is (g + 1) times G; I get my block of
    // the sum, n (n + 1) / 2 times mine
    for (int64_t i = 0; i < gtotal; i++) in[i] = (float)(me + 1) * gin[i];
    for (int64_t i = 0; i < ltotal; i++) want[i] *= (float)(n * (n + 1) / 2);
    kdrt_reduce_scatter(c, mask, r, gshape, dim, in, out);
    compare("reduce_scatter (uneven)", m, mask, out, want, ltotal, r, gshape, dim, -1);
  }
  // all-to-all from `dim` (my uneven block) to `other` (cut unevenly too
  // when it does not divide): afterwards my block of G along other, whole
  // along dim
  if (other >= 0) {
    int64_t G2 = gshape[other], oshape[KDRT_MAX_RANK];
    memcpy(oshape, gshape, sizeof gshape);
    oshape[other] = uext(G2, n, me);
    int64_t ototal = numel(r, oshape);
    memset(idx, 0, sizeof idx);
    if (ototal) do {
      memcpy(gi, idx, sizeof gi);
      gi[other] += ufirst(G2, n, me);
      want[flat(r, oshape, idx)] = gval16(kind, color, flat(r, gshape, gi));
    } while (next_index(r, oshape, idx));
    if (kind) kdrt_alltoall16(c, kind, mask, r, lshape, dim, other, lin, out);
    else kdrt_alltoall(c, mask, r, lshape, dim, other, lin, out);
    snprintf(what, sizeof what, "alltoall (uneven)%s", kind_name(kind));
    compare(what, m, mask, out, want, ototal, r, lshape, dim, other);
  }
  free(gin), free(lin), free(out), free(want), free(in);
}

static void check_uneven_mesh(kdrt_program *prog, kdrt_ctx *c, const mesh *m) {
  for (int ba = 0; ba < m->nd; ba++) {
    if (m->shape[ba] < 2) continue;
    prog->batch_axis = ba;
    c->ragged = 1;
    for (unsigned mask = 1; mask < (1u << m->nd); mask++) {
      if (!((mask >> ba) & 1)) continue;
      int n = size_over(m, mask);
      for (int r = 1; r <= 2; r++)
        for (int dim = 0; dim < r; dim++)
          for (int other = -1; other < r; other++) {
            if (other == dim) continue;
            check_uneven(c, m, mask, r, dim, other, n - 1, 0);     // one member empty
            check_uneven(c, m, mask, r, dim, other, 2 * n + 1, 0); // one more row for one
          }
      // issue 23: 16-bit values, the uneven dim not the last (kdcc pairs
      // none whose last dim is the batch)
      for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++)
        for (int r = 2; r <= 3; r++)
          for (int other = -1; other < r; other++) {
            if (other == 0) continue;
            check_uneven(c, m, mask, r, 0, other, n - 1, kind);
            check_uneven(c, m, mask, r, 0, other, 2 * n + 1, kind);
          }
    }
    c->ragged = 0;
  }
  prog->batch_axis = -1;
}

// ------------------------------------------------------------ driver

// issue 23: kdrt_loss_scale_step's decision is the whole mesh's: with no
// rank's gradient holding a non-finite value every rank divides its
// gradients by the scale and counts the step (the scale doubled at the
// growth steps, 2 here); with one rank's holding an infinity (each rank in
// turn) every rank skips the step, leaves its gradients and halves the scale.
static void check_loss_scale(kdrt_program *prog, kdrt_ctx *c, const mesh *m) {
  kdrt_var vars[2];
  memset(vars, 0, sizeof vars);
  vars[0].path = "w", vars[0].goffset = 0, vars[0].n = 5;
  vars[1].path = "untrained", vars[1].goffset = SIZE_MAX, vars[1].n = 3;
  prog->nvars = 2, prog->vars = vars;
  prog->loss_scale = 8, prog->loss_scale_growth_steps = 2;
  c->loss_scale = 8, c->loss_scale_count = 0;
  float scale = 8;
  for (int round = -2; round < world_size; round++) { // < 0: finite; else rank round's infinity
    float g[5];
    for (int i = 0; i < 5; i++) g[i] = (float)(world_rank + i) * scale;
    if (round == world_rank) g[2] = INFINITY;
    kdrt_loss_scale_step(c, g);
    int finite = round < 0, ok = c->apply_update == finite;
    for (int i = 0; finite && i < 5; i++) ok &= g[i] == (float)(world_rank + i);
    scale = round == -1 ? scale * 2 : finite ? scale : scale / 2;
    ok &= c->loss_scale == scale && c->loss_scale_count == (round == -2);
    checks++;
    if (!ok) {
      char d[160];
      snprintf(d, sizeof d, "round %d: apply_update %d, scale %g (want %g), count %lld", round,
               c->apply_update, (double)c->loss_scale, (double)scale,
               (long long)c->loss_scale_count);
      fail("loss_scale_step", m->shape, m->nd, (1u << m->nd) - 1, d);
    }
  }
  prog->nvars = 0, prog->vars = NULL, prog->loss_scale = 0;
}

static void check_mesh(const mesh *m) {
  kdrt_program prog;
  memset(&prog, 0, sizeof prog);
  prog.model_name = "rt_comm_check";
  prog.mesh_ndim = m->nd;
  prog.mesh_shape = m->shape;
  prog.mesh_axes = m->names;
  prog.batch_axis = -1;
  kdrt_ctx c;
  memset(&c, 0, sizeof c);
  c.prog = &prog;
  c.rank = world_rank, c.world = world_size;
  coords_of(m, world_rank, c.coord);

  static const int64_t base[3] = {2, 3, 2};
  for (unsigned mask = 0; mask < (1u << m->nd); mask++) {
    check_allreduce(&c, m, mask);
    check_allreduce_max(&c, m, mask);
    int n = size_over(m, mask);
    for (int r = 1; r <= 3; r++) {
      for (int k = 1; k <= 2; k++) {
        int64_t shape[KDRT_MAX_RANK];
        for (int d = 0; d < r; d++) {
          memcpy(shape, base, sizeof base);
          shape[d] = n * k;
          check_reduce_scatter(&c, m, mask, r, shape, d);
          check_slice(&c, m, mask, r, shape, d);
          memcpy(shape, base, sizeof base);
          shape[d] = k + 1;
          check_allgather(&c, m, mask, r, shape, d, 0);
          for (int to = 0; to < r; to++) {
            if (to == d) continue;
            memcpy(shape, base, sizeof base);
            shape[d] = k + 1; // from: any extent
            shape[to] = n * k; // to: divides by the group
            check_alltoall(&c, m, mask, r, shape, d, to, 0);
          }
          // issue 23: in 16 bits, the last dim twice as long (even, and
          // all-to-all's blocks of it even)
          for (int kind = KDRT_ROUND_BF16; kind <= KDRT_ROUND_F16; kind++) {
            memcpy(shape, base, sizeof base);
            shape[d] = k + 1;
            shape[r - 1] *= 2;
            check_allgather(&c, m, mask, r, shape, d, kind);
            for (int to = 0; to < r; to++) {
              if (to == d) continue;
              memcpy(shape, base, sizeof base);
              shape[d] = k + 1;
              shape[to] = n * k;
              shape[r - 1] *= 2;
              check_alltoall(&c, m, mask, r, shape, d, to, kind);
            }
          }
        }
      }
    }
  }
  check_uneven_mesh(&prog, &c, m);
  check_loss_scale(&prog, &c, m);
  kdrt_comm_free(&c);
}

// Every ordered factorisation of w into nd factors, each >= 1.
static int for_each_mesh(int w, int nd, mesh *m, int axis) {
  static const char *const names[KDRT_MAX_AXES] = {"a", "b", "c", "d"};
  int count = 0;
  if (axis == nd - 1) {
    m->nd = nd;
    m->shape[axis] = w;
    for (int a = 0; a < nd; a++) m->names[a] = names[a];
    check_mesh(m);
    return 1;
  }
  for (int f = 1; f <= w; f++) {
    if (w % f) continue;
    m->shape[axis] = f;
    count += for_each_mesh(w / f, nd, m, axis + 1);
  }
  return count;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  int max_axes = argc > 1 ? atoi(argv[1]) : 3;
  if (max_axes < 1 || max_axes > KDRT_MAX_AXES) max_axes = 3;
  int meshes = 0;
  mesh m;
  for (int nd = 1; nd <= max_axes; nd++) meshes += for_each_mesh(world_size, nd, &m, 0);
  long all_fail = 0, all_checks = 0;
  MPI_Allreduce(&failures, &all_fail, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&checks, &all_checks, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank == 0)
    printf("rt_comm_check: %d ranks, %d meshes, %ld checks, %ld failures\n", world_size, meshes,
           all_checks, all_fail);
  MPI_Finalize();
  return all_fail ? 1 : 0;
}
