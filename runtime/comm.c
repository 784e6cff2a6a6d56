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
#include "kdrt.h"

#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    KDRT_MPI(MPI_Comm_split(MPI_COMM_WORLD, color, kdrt_group_index(c, axes), comm));
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

static void split_shape(int rank, const int64_t *lshape, int dim, int64_t *outer,
                        int64_t *inner) {
  *outer = 1, *inner = 1;
  for (int d = 0; d < dim; d++) *outer *= lshape[d];
  for (int d = dim + 1; d < rank; d++) *inner *= lshape[d];
}

// One growing scratch buffer per purpose (the runtime is single-threaded).
static float *scratch(int which, size_t n) {
  static float *buf[2];
  static size_t cap[2];
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
  if (lshape[dim] % n)
    kdrt_fatal(c, "%s: extent %lld of dim %d does not divide by the group size %d", what,
               (long long)lshape[dim], dim, n);
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
    KDRT_MPI(MPI_Allreduce(src, out + done, cnt, MPI_FLOAT, op, comm));
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
  split_shape(rank, lshape, dim, &outer, &inner);
  int64_t blk = outer * part * inner; // floats each rank ends with
  if (n == 1) {
    memmove(out, in, (size_t)blk * sizeof(float));
    return;
  }
  const float *send = in;
  if (outer > 1) { // pack: block b (for group rank b) contiguous
    float *packed = scratch(0, (size_t)(blk * n));
    for (int b = 0; b < n; b++)
      take_block(packed + b * blk, in, outer, ext, b * part, part, inner);
    send = packed;
  }
  KDRT_MPI(MPI_Reduce_scatter_block(send, out, count_of(c, blk), MPI_FLOAT, MPI_SUM,
                                    group_comm(c, axes)));
}

void kdrt_allgather(kdrt_ctx *c, unsigned axes, int rank, const int64_t *lshape, int dim,
                    const float *in, float *out) {
  int n = kdrt_group_size(c, axes);
  check_dim(c, "allgather", rank, lshape, dim, 1);
  int64_t outer, inner, ext = lshape[dim];
  split_shape(rank, lshape, dim, &outer, &inner);
  int64_t blk = outer * ext * inner;
  if (n == 1) {
    memmove(out, in, (size_t)blk * sizeof(float));
    return;
  }
  int cnt = count_of(c, blk);
  MPI_Comm comm = group_comm(c, axes);
  if (outer == 1) {
    KDRT_MPI(MPI_Allgather(in, cnt, MPI_FLOAT, out, cnt, MPI_FLOAT, comm));
    return;
  }
  float *recv = scratch(0, (size_t)(blk * n));
  KDRT_MPI(MPI_Allgather(in, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, comm));
  for (int b = 0; b < n; b++) put_block(out, recv + b * blk, outer, ext, b * ext, ext * n, inner);
}

void kdrt_alltoall(kdrt_ctx *c, unsigned axes, int rank, const int64_t *lshape, int from, int to,
                   const float *in, float *out) {
  int n = kdrt_group_size(c, axes);
  check_dim(c, "alltoall", rank, lshape, from, 1);
  check_dim(c, "alltoall", rank, lshape, to, n);
  if (from == to) kdrt_fatal(c, "alltoall: from and to are the same dim %d", from);
  int64_t total = 1;
  for (int d = 0; d < rank; d++) total *= lshape[d];
  if (n == 1) {
    memmove(out, in, (size_t)total * sizeof(float));
    return;
  }
  // Chunk j of the input (its j-th block along `to`) goes to group rank j;
  // the chunk from group rank i is block i along `from` of the output.
  int64_t part = lshape[to] / n, blk = total / n;
  int64_t cshape[KDRT_MAX_RANK]; // shape of one chunk
  memcpy(cshape, lshape, (size_t)rank * sizeof(int64_t));
  cshape[to] = part;
  int64_t to_outer, to_inner, from_outer, from_inner;
  split_shape(rank, lshape, to, &to_outer, &to_inner);
  split_shape(rank, cshape, from, &from_outer, &from_inner);
  float *send = scratch(0, (size_t)total), *recv = scratch(1, (size_t)total);
  for (int j = 0; j < n; j++)
    take_block(send + j * blk, in, to_outer, lshape[to], j * part, part, to_inner);
  int cnt = count_of(c, blk);
  KDRT_MPI(MPI_Alltoall(send, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, group_comm(c, axes)));
  int64_t fext = lshape[from];
  for (int i = 0; i < n; i++)
    put_block(out, recv + i * blk, from_outer, fext, i * fext, fext * n, from_inner);
}

void kdrt_slice(kdrt_ctx *c, unsigned axes, int rank, const int64_t *lshape, int dim,
                const float *in, float *out) {
  int n = kdrt_group_size(c, axes);
  check_dim(c, "slice", rank, lshape, dim, n);
  int64_t outer, inner, ext = lshape[dim], part = ext / n;
  split_shape(rank, lshape, dim, &outer, &inner);
  take_block(out, in, outer, ext, kdrt_group_index(c, axes) * part, part, inner);
}
