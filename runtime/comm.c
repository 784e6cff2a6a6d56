// comm.c: mesh groups and the collectives kdcc inserts between placements.
//
// A group is a set of mesh axes (bit i = axis i). The ranks of one group
// share their coordinates on every other axis, so the world splits into
// prod(other axes) disjoint groups; MPI_Comm_split makes them with
//   color = row-major index of the coordinates on the axes NOT in the group,
//   key   = row-major index of the coordinates on the axes in the group,
// so a rank's place in its communicator is its block index along a tensor
// dimension split over those axes (block b = coordinate b along the axis).
// Communicators are made on first use and cached in c->comm[mask].
//
// The dimension-wise collectives move blocks of a row-major local tensor:
// with outer = product of dims before `dim` and inner = product after, a
// block along dim is `outer` strided runs. MPI wants each destination's
// data contiguous, so reduce-scatter and all-to-all pack blocks first and
// all-gather and all-to-all unpack after; when outer == 1 the blocks are
// already contiguous and the copies are skipped.
//
// Every call is collective over its group and works with a group of one
// (a copy) and with one process started without mpirun.
//
// Uneven rows (c->ragged: a step whose rows do not divide over the batch
// axis, split as kdrt_rows_split does): a dimension-wise collective over a
// group that holds the batch axis may then move blocks of unequal extent.
// The extent of a dimension that is split (all-gather's dim, all-to-all's
// `from`) is exchanged first; one that is about to be split and does not
// divide by the group (reduce-scatter's and slice's dim, all-to-all's
// `to`) can only be the batch, and is cut as the rows are. Every other
// step takes the even path, with no extra message.
#include "kdrt.h"
#include "kdrt_round.h"

#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------ a step's rows, the ways out

void kdrt_rows_split(int64_t rows, int parts, int i, int64_t *first, int64_t *n) {
  int64_t base = rows / parts, extra = rows % parts;
  *n = base + (i < extra);
  *first = (int64_t)i * base + (i < extra ? i : extra);
}

// kdrt_fail_all's and kdrt_leave's: rank 0 says it (fmt not NULL), every
// rank lets go of its communicators and finalizes MPI; the buffers too
// with free_buffers.
static void leave_all(kdrt_ctx *c, int free_buffers, const char *who, const char *fmt,
                      va_list ap) {
  if (c->rank == 0 && fmt) kdrt_vsay(who, fmt, ap);
  if (free_buffers) {
    kdrt_buffer_free(c->params), kdrt_buffer_free(c->grads), kdrt_buffer_free(c->arena);
    kdrt_buffer_free(c->widen16);
    c->params = c->grads = c->arena = c->widen16 = NULL;
    c->widen16_floats = 0;
  }
  kdrt_comm_free(c);
  MPI_Finalize();
}

void kdrt_fail_all(const kdrt_ctx *c, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  leave_all((kdrt_ctx *)c, 0, kdrt_prog_name, fmt, ap);
  va_end(ap);
  exit(status);
}

int kdrt_leave(kdrt_ctx *c, const char *who, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  leave_all(c, 1, who, fmt, ap);
  va_end(ap);
  return status;
}

// ------------------------------------------------------------ groups

static void check_mask(const kdrt_ctx *c, unsigned axes) {
  if (axes >= (1u << c->prog->mesh_ndim))
    kdrt_fatal(c, "group mask 0x%x names an axis the %d-axis mesh lacks", axes,
               c->prog->mesh_ndim);
}

int kdrt_group_size(const kdrt_ctx *c, unsigned axes) {
  check_mask(c, axes);
  int n = 1;
  for (int a = 0; a < c->prog->mesh_ndim; a++)
    if (axes & (1u << a)) n *= c->prog->mesh_shape[a];
  return n;
}

int kdrt_group_index(const kdrt_ctx *c, unsigned axes) {
  int idx = 0;
  for (int a = 0; a < c->prog->mesh_ndim; a++)
    if (axes & (1u << a)) idx = idx * c->prog->mesh_shape[a] + c->coord[a];
  return idx;
}

static MPI_Comm group_comm(kdrt_ctx *c, unsigned axes) {
  check_mask(c, axes);
  if (!c->comm[axes]) {
    int color = kdrt_group_index(c, ~axes & ((1u << c->prog->mesh_ndim) - 1));
    MPI_Comm *comm = malloc(sizeof *comm);
    if (!comm) kdrt_fatal(c, "out of memory");
    kdrt_watch_enter("making a communicator", axes);
    KDRT_MPI(MPI_Comm_split(MPI_COMM_WORLD, color, kdrt_group_index(c, axes), comm));
    kdrt_watch_leave();
    c->comm[axes] = comm;
  }
  return *(MPI_Comm *)c->comm[axes];
}

void kdrt_comm_free(kdrt_ctx *c) {
  for (size_t i = 0; i < sizeof c->comm / sizeof c->comm[0]; i++) {
    if (!c->comm[i]) continue;
    KDRT_MPI(MPI_Comm_free((MPI_Comm *)c->comm[i]));
    free(c->comm[i]);
    c->comm[i] = NULL;
  }
}

void kdrt_mpi_check(int rc, const char *call, const char *file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  int rank = -1, inited = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fprintf(stderr, "rank %d: %s:%d: %s failed: %s\n", rank, file, line, call, msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

// ------------------------------------------------------------ block moves

// out[o, i, r] = in[o, off + i, r] for i < out_ext (a block along one dim).
static void take_block(float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,
                       int64_t out_ext, int64_t inner) {
  size_t run = (size_t)(out_ext * inner) * sizeof(float);
  for (int64_t o = 0; o < outer; o++)
    memcpy(out + o * out_ext * inner, in + (o * in_ext + off) * inner, run);
}

// out[o, off + i, r] = in[o, i, r] for i < in_ext (the reverse).
static void put_block(float *out, const float *in, int64_t outer, int64_t in_ext, int64_t off,
                      int64_t out_ext, int64_t inner) {
  size_t run = (size_t)(in_ext * inner) * sizeof(float);
  for (int64_t o = 0; o < outer; o++)
    memcpy(out + (o * out_ext + off) * inner, in + o * in_ext * inner, run);
}

void kdrt_split_shape(int rank, const int64_t *lshape, int dim, int64_t *outer,
                      int64_t *inner) {
  *outer = 1, *inner = 1;
  for (int d = 0; d < dim; d++) *outer *= lshape[d];
  for (int d = dim + 1; d < rank; d++) *inner *= lshape[d];
}

// One growing scratch buffer per purpose (the runtime is single-threaded).
static float *scratch(int which, size_t n) {
  static float *buf[3];
  static size_t cap[3];
  if (n > cap[which]) {
    free(buf[which]);
    buf[which] = malloc(n * sizeof(float));
    cap[which] = buf[which] ? n : 0;
    if (!buf[which]) kdrt_fatal(NULL, "out of memory for %zu communication floats", n);
  }
  return buf[which];
}

static int count_of(const kdrt_ctx *c, int64_t n) {
  if (n > INT_MAX) kdrt_fatal(c, "collective of %lld floats per rank is too large for MPI",
                              (long long)n);
  return (int)n;
}

static void check_dim(const kdrt_ctx *c, const char *what, int rank, const int64_t *lshape,
                      int dim, int n) {
  if (dim < 0 || dim >= rank) kdrt_fatal(c, "%s: dim %d out of range for rank %d", what, dim, rank);
  if (lshape[dim] % n && !c->ragged)
    kdrt_fatal(c, "%s: extent %lld of dim %d does not divide by the group size %d", what,
               (long long)lshape[dim], dim, n);
}

// Does this step split rows unevenly over a group of these axes?
static int uneven(const kdrt_ctx *c, unsigned axes) {
  int ba = c->prog->batch_axis;
  return c->ragged && ba >= 0 && ((axes >> ba) & 1);
}

// ext[b] = the extent of a dim on group rank b (exchanged).
static void group_extents(kdrt_ctx *c, unsigned axes, int64_t mine, int64_t *ext) {
  MPI_Comm comm = group_comm(c, axes);
  kdrt_watch_enter("an all-gather of block sizes", axes);
  KDRT_MPI(MPI_Allgather(&mine, 1, MPI_INT64_T, ext, 1, MPI_INT64_T, comm));
  kdrt_watch_leave();
}

// ------------------------------------------------------------ collectives

// out = the elementwise reduction by op over the group of in; in == out
// reduces in place.
static void allreduce_op(kdrt_ctx *c, unsigned axes, const float *in, float *out, size_t n,
                         MPI_Op op) {
  if (kdrt_group_size(c, axes) == 1) {
    if (in != out) memmove(out, in, n * sizeof(float));
    return;
  }
  MPI_Comm comm = group_comm(c, axes);
  // MPI counts are ints: large buffers go in chunks.
  const size_t chunk = (size_t)1 << 30;
  for (size_t done = 0; done < n; done += chunk) {
    int cnt = (int)(n - done < chunk ? n - done : chunk);
    const void *src = in == out ? MPI_IN_PLACE : (const void *)(in + done);
    kdrt_watch_enter(op == MPI_MAX ? "an all-reduce (max)" : "an all-reduce", axes);
    KDRT_MPI(MPI_Allreduce(src, out + done, cnt, MPI_FLOAT, op, comm));
    kdrt_watch_leave();
  }
}

// out = the elementwise sum over the group of in; in == out sums in place.
void kdrt_allreduce(kdrt_ctx *c, unsigned axes, const float *in, float *out, size_t n) {
  allreduce_op(c, axes, in, out, n, MPI_SUM);
}

// out = the elementwise maximum over the group of in; in == out in place.
void kdrt_allreduce_max(kdrt_ctx *c, unsigned axes, const float *in, float *out, size_t n) {
  allreduce_op(c, axes, in, out, n, MPI_MAX);
}

void kdrt_reduce_scatter(kdrt_ctx *c, unsigned axes, int rank, const int64_t *lshape, int dim,
                         const float *in, float *out) {
  int n = kdrt_group_size(c, axes);
  check_dim(c, "reduce_scatter", rank, lshape, dim, n);
  int64_t outer, inner, ext = lshape[dim], part = ext / n;
  kdrt_split_shape(rank, lshape, dim, &outer, &inner);
  int64_t blk = outer * part * inner; // floats each rank ends with
  if (n == 1) {
    memmove(out, in, (size_t)blk * sizeof(float));
    return;
  }
  if (ext % n) { // uneven rows: block b is rows_split(ext, n, b)
    int *counts = malloc(sizeof(int) * (size_t)n);
    float *packed = scratch(0, (size_t)(outer * ext * inner));
    if (!counts) kdrt_fatal(c, "out of memory");
    for (int b = 0; b < n; b++) {
      int64_t first, cnt;
      kdrt_rows_split(ext, n, b, &first, &cnt);
      take_block(packed + outer * first * inner, in, outer, ext, first, cnt, inner);
      counts[b] = count_of(c, outer * cnt * inner);
    }
    MPI_Comm comm = group_comm(c, axes);
    kdrt_watch_enter("a reduce-scatter", axes);
    KDRT_MPI(MPI_Reduce_scatter(packed, out, counts, MPI_FLOAT, MPI_SUM, comm));
    kdrt_watch_leave();
    free(counts);
    return;
  }
  const float *send = in;
  if (outer > 1) { // pack: block b (for group rank b) contiguous
    float *packed = scratch(0, (size_t)(blk * n));
    for (int b = 0; b < n; b++)
      take_block(packed + b * blk, in, outer, ext, b * part, part, inner);
    send = packed;
  }
  MPI_Comm comm = group_comm(c, axes);
  kdrt_watch_enter("a reduce-scatter", axes);
  KDRT_MPI(MPI_Reduce_scatter_block(send, out, count_of(c, blk), MPI_FLOAT, MPI_SUM, comm));
  kdrt_watch_leave();
}

// kdrt_allgather; returns the floats written.
static int64_t allgather(kdrt_ctx *c, unsigned axes, int rank, const int64_t *lshape, int dim,
                         const float *in, float *out) {
  int n = kdrt_group_size(c, axes);
  check_dim(c, "allgather", rank, lshape, dim, 1);
  int64_t outer, inner, ext = lshape[dim];
  kdrt_split_shape(rank, lshape, dim, &outer, &inner);
  int64_t blk = outer * ext * inner;
  if (n == 1) {
    memmove(out, in, (size_t)blk * sizeof(float));
    return blk;
  }
  int cnt = count_of(c, blk);
  MPI_Comm comm = group_comm(c, axes);
  if (uneven(c, axes)) { // blocks of unequal extent: gathered by their sizes
    int64_t *exts = malloc(sizeof(int64_t) * (size_t)n);
    int *counts = malloc(sizeof(int) * (size_t)n), *displs = malloc(sizeof(int) * (size_t)n);
    if (!exts || !counts || !displs) kdrt_fatal(c, "out of memory");
    group_extents(c, axes, ext, exts);
    int64_t total = 0;
    for (int b = 0; b < n; b++) {
      displs[b] = count_of(c, outer * total * inner);
      counts[b] = count_of(c, outer * exts[b] * inner);
      total += exts[b];
    }
    float *recv = outer == 1 ? out : scratch(0, (size_t)(outer * total * inner));
    kdrt_watch_enter("an all-gather", axes);
    KDRT_MPI(MPI_Allgatherv(in, cnt, MPI_FLOAT, recv, counts, displs, MPI_FLOAT, comm));
    kdrt_watch_leave();
    if (outer > 1)
      for (int64_t b = 0, at = 0; b < n; at += exts[b], b++)
        put_block(out, recv + outer * at * inner, outer, exts[b], at, total, inner);
    free(exts), free(counts), free(displs);
    return outer * total * inner;
  }
  kdrt_watch_enter("an all-gather", axes);
  if (outer == 1) {
    KDRT_MPI(MPI_Allgather(in, cnt, MPI_FLOAT, out, cnt, MPI_FLOAT, comm));
    kdrt_watch_leave();
    return blk * n;
  }
  float *recv = scratch(0, (size_t)(blk * n));
  KDRT_MPI(MPI_Allgather(in, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, comm));
  kdrt_watch_leave();
  for (int b = 0; b < n; b++) put_block(out, recv + b * blk, outer, ext, b * ext, ext * n, inner);
  return blk * n;
}

void kdrt_allgather(kdrt_ctx *c, unsigned axes, int rank, const int64_t *lshape, int dim,
                    const float *in, float *out) {
  allgather(c, axes, rank, lshape, dim, in, out);
}

// All-to-all with uneven rows: the extent of `from` may differ between
// group ranks (exchanged), `to` is cut as rows are (kdrt_rows_split).
// Returns the floats written.
static int64_t alltoall_uneven(kdrt_ctx *c, unsigned axes, int n, int rank,
                               const int64_t *lshape, int from, int to, const float *in,
                               float *out) {
  int64_t *fext = malloc(sizeof(int64_t) * (size_t)n);
  int *sc = malloc(sizeof(int) * 4 * (size_t)n);
  if (!fext || !sc) kdrt_fatal(c, "out of memory");
  int *sd = sc + n, *rc = sc + 2 * n, *rd = sc + 3 * n;
  group_extents(c, axes, lshape[from], fext);
  int me = kdrt_group_index(c, axes);
  int64_t total = 1, rest = 1; // rest: the elements of every dim but from and to
  for (int d = 0; d < rank; d++) total *= lshape[d], rest *= d == from || d == to ? 1 : lshape[d];
  int64_t my_first, my_part, fsum = 0;
  kdrt_rows_split(lshape[to], n, me, &my_first, &my_part);
  for (int j = 0; j < n; j++) fsum += fext[j];
  int64_t to_outer, to_inner, from_outer, from_inner;
  kdrt_split_shape(rank, lshape, to, &to_outer, &to_inner);
  float *send = scratch(0, (size_t)total), *recv = scratch(1, (size_t)(fsum * my_part * rest));
  int64_t at = 0;
  for (int j = 0; j < n; j++) { // chunk j: block j along `to`
    int64_t first, part;
    kdrt_rows_split(lshape[to], n, j, &first, &part);
    take_block(send + at, in, to_outer, lshape[to], first, part, to_inner);
    sd[j] = count_of(c, at), sc[j] = count_of(c, part * lshape[from] * rest);
    at += part * lshape[from] * rest;
  }
  at = 0;
  for (int i = 0; i < n; i++) {
    rd[i] = count_of(c, at), rc[i] = count_of(c, fext[i] * my_part * rest);
    at += fext[i] * my_part * rest;
  }
  MPI_Comm comm = group_comm(c, axes);
  kdrt_watch_enter("an all-to-all", axes);
  KDRT_MPI(MPI_Alltoallv(send, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, comm));
  kdrt_watch_leave();
  // The chunk from group rank i is block i along `from` of the output.
  int64_t cshape[KDRT_MAX_RANK];
  memcpy(cshape, lshape, (size_t)rank * sizeof(int64_t));
  cshape[to] = my_part;
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    cshape[from] = fext[i];
    kdrt_split_shape(rank, cshape, from, &from_outer, &from_inner);
    put_block(out, recv + rd[i], from_outer, fext[i], off, fsum, from_inner);
    off += fext[i];
  }
  free(fext), free(sc);
  return fsum * my_part * rest;
}

// kdrt_alltoall; returns the floats written.
static int64_t alltoall(kdrt_ctx *c, unsigned axes, int rank, const int64_t *lshape, int from,
                        int to, const float *in, float *out) {
  int n = kdrt_group_size(c, axes);
  check_dim(c, "alltoall", rank, lshape, from, 1);
  check_dim(c, "alltoall", rank, lshape, to, n);
  if (from == to) kdrt_fatal(c, "alltoall: from and to are the same dim %d", from);
  int64_t total = 1;
  for (int d = 0; d < rank; d++) total *= lshape[d];
  if (n == 1) {
    memmove(out, in, (size_t)total * sizeof(float));
    return total;
  }
  if (uneven(c, axes)) return alltoall_uneven(c, axes, n, rank, lshape, from, to, in, out);
  // Chunk j of the input (its j-th block along `to`) goes to group rank j;
  // the chunk from group rank i is block i along `from` of the output.
  int64_t part = lshape[to] / n, blk = total / n;
  int64_t cshape[KDRT_MAX_RANK]; // shape of one chunk
  memcpy(cshape, lshape, (size_t)rank * sizeof(int64_t));
  cshape[to] = part;
  int64_t to_outer, to_inner, from_outer, from_inner;
  kdrt_split_shape(rank, lshape, to, &to_outer, &to_inner);
  kdrt_split_shape(rank, cshape, from, &from_outer, &from_inner);
  float *send = scratch(0, (size_t)total), *recv = scratch(1, (size_t)total);
  for (int j = 0; j < n; j++)
    take_block(send + j * blk, in, to_outer, lshape[to], j * part, part, to_inner);
  int cnt = count_of(c, blk);
  MPI_Comm comm = group_comm(c, axes);
  kdrt_watch_enter("an all-to-all", axes);
  KDRT_MPI(MPI_Alltoall(send, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, comm));
  kdrt_watch_leave();
  int64_t fext = lshape[from];
  for (int i = 0; i < n; i++)
    put_block(out, recv + i * blk, from_outer, fext, i * fext, fext * n, from_inner);
  return total;
}

void kdrt_alltoall(kdrt_ctx *c, unsigned axes, int rank, const int64_t *lshape, int from, int to,
                   const float *in, float *out) {
  alltoall(c, axes, rank, lshape, from, to, in, out);
}

void kdrt_slice(kdrt_ctx *c, unsigned axes, int rank, const int64_t *lshape, int dim,
                const float *in, float *out) {
  int n = kdrt_group_size(c, axes);
  check_dim(c, "slice", rank, lshape, dim, n);
  int64_t outer, inner, ext = lshape[dim], first, part;
  kdrt_split_shape(rank, lshape, dim, &outer, &inner);
  kdrt_rows_split(ext, n, kdrt_group_index(c, axes), &first, &part); // ext / n when it divides
  take_block(out, in, outer, ext, first, part, inner);
}

// ------------------------------------------------------------ 16-bit values (issue 23)
// A value exactly of a 16-bit type moves in its 16 bits, two values a
// 4-byte word: packed (kdrt_pack16), moved by the float kernels above over
// the shape with its last dim halved (any block starts on a word), then
// unpacked. The words come back into the first half of out, unpacked from
// the last value down, so that none is overwritten before it is read (a
// value i is written at byte 4i, over the 16-bit ones 2i and 2i + 1, read
// before it); memcpy, since the same bytes are read as one type and written
// as another.

int kdrt_pair_shape(int rank, const int64_t *lshape, int to, int n, int64_t *pair) {
  if (rank < 1 || lshape[rank - 1] % 2 || (to == rank - 1 && lshape[to] % (2 * n))) return 0;
  memcpy(pair, lshape, (size_t)rank * sizeof *pair);
  pair[rank - 1] /= 2;
  return 1;
}

static const float *pack_pairs(kdrt_ctx *c, const char *what, int kind, int rank,
                               const int64_t *lshape, int to, int n, const float *in,
                               int64_t *pair) {
  if (!kdrt_pair_shape(rank, lshape, to, n, pair))
    kdrt_fatal(c, "%s: a shape whose blocks do not pair 16-bit values (kdcc asks for none)", what);
  int64_t m = 1;
  for (int d = 0; d < rank; d++) m *= lshape[d];
  float *p = scratch(2, (size_t)(m + 1) / 2);
  kdrt_pack16(kind, (uint16_t *)p, in, (size_t)m);
  return p;
}

static void unpack_pairs(int kind, float *out, int64_t words) {
  const char *h = (const char *)out;
  for (int64_t i = 2 * words - 1; i >= 0; i--) {
    uint16_t b;
    memcpy(&b, h + 2 * i, sizeof b);
    float v = kdrt_value16(kind, b);
    memcpy(out + i, &v, sizeof v);
  }
}

void kdrt_allgather16(kdrt_ctx *c, int kind, unsigned axes, int rank, const int64_t *lshape,
                      int dim, const float *in, float *out) {
  int64_t pair[KDRT_MAX_RANK];
  const float *p = pack_pairs(c, "allgather16", kind, rank, lshape, -1, 1, in, pair);
  unpack_pairs(kind, out, allgather(c, axes, rank, pair, dim, p, out));
}

void kdrt_alltoall16(kdrt_ctx *c, int kind, unsigned axes, int rank, const int64_t *lshape,
                     int from, int to, const float *in, float *out) {
  int64_t pair[KDRT_MAX_RANK];
  const float *p = pack_pairs(c, "alltoall16", kind, rank, lshape, to,
                              kdrt_group_size(c, axes), in, pair);
  unpack_pairs(kind, out, alltoall(c, axes, rank, pair, from, to, p, out));
}
