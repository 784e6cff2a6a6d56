// comm.cu: every multi-GPU line of the CUDA runtime. The collectives of
// ../comm.c on device buffers, over groups of mesh axes (bit masks).
//
// Three ways, chosen once at start-up, the same on every rank:
// - one process (world 1): every group has one member; a collective is a
//   device copy or nothing, and no MPI or NCCL call is ever made;
// - NCCL: one GPU per rank (the rank's index on its node, modulo the GPUs
//   it sees). The world communicator is made from a unique id that rank 0
//   draws and MPI_Bcast's; the communicator of a group of mesh axes is
//   ncclCommSplit of the world with color = the row-major index of the
//   coordinates on the axes NOT in the group and key = the index on the
//   axes in it (as ../comm.c splits MPI_COMM_WORLD), made on first use;
//   every rank reaches the same collectives in the same order, so the
//   (collective) splits line up. Collectives run on their own stream:
//   the compute stream records an event the comm stream waits for, and
//   the other way round after the call;
// - host-staged MPI: when ranks share a GPU (NCCL refuses two ranks on one
//   device) or KDRT_CUDA_COMM=mpi. The compute stream is drained, the
//   operand copied to pinned host memory, ../comm.c's collective runs on
//   it, and the result goes back. Slow, but any mesh runs on one GPU.
// KDRT_CUDA_COMM=nccl forces NCCL (and fails where NCCL fails).
//
// Blocks along a dimension (reduce-scatter, all-gather, all-to-all) are
// packed and unpacked on the compute stream, as ../comm.c does on the host.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

// ------------------------------------------------------------ setup

void kdrt_cuda_comm_setup(kdrt_cuda *d, kdrt_ctx *c) {
  kdrt_cuda_impl *s = d->impl;
  int inited = 0;
  KDRT_MPI(MPI_Initialized(&inited));
  if (!inited) kdrt_cuda_fail("kdrt_cuda_comm_setup", __FILE__, __LINE__, "MPI is not initialised");
  MPI_Comm node;
  int local = 0, nlocal = 1, ndev = 0;
  KDRT_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node));
  KDRT_MPI(MPI_Comm_rank(node, &local));
  KDRT_MPI(MPI_Comm_size(node, &nlocal));
  KDRT_MPI(MPI_Comm_free(&node));
  CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (ndev < 1) kdrt_cuda_fail("cudaGetDeviceCount", __FILE__, __LINE__, "no CUDA device");
  CUDA_CHECK(cudaSetDevice(local % ndev));
  // Every rank must take the same way: share whether any node is crowded.
  int crowded = nlocal > ndev, any = 0;
  KDRT_MPI(MPI_Allreduce(&crowded, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  const char *force = getenv("KDRT_CUDA_COMM");
  s->comm_mode = any ? KDRT_COMM_HOST : KDRT_COMM_NCCL;
  if (force && !strcmp(force, "mpi")) s->comm_mode = KDRT_COMM_HOST;
  if (force && !strcmp(force, "nccl")) s->comm_mode = KDRT_COMM_NCCL;
  if (s->comm_mode == KDRT_COMM_HOST) {
    if (c->rank == 0)
      fprintf(stderr,
              "kdrt-cuda: %s: collectives are staged through host memory over MPI "
              "(slow; NCCL needs one GPU per rank)\n",
              force && !strcmp(force, "mpi")
                  ? "KDRT_CUDA_COMM=mpi"
                  : any ? "several ranks share a GPU" : "host-staged collectives");
    return;
  }
  ncclUniqueId id;
  if (c->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  KDRT_MPI(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
  NCCL_CHECK(ncclCommInitRank(&s->world, c->world, id, c->rank));
}

// Every communicator aborted (a failure is being reported): a kernel stuck
// waiting for a peer that is gone ends, so the process can. No checks: this
// runs on the way out of kdrt_cuda_fail.
void kdrt_cuda_comm_abort(kdrt_cuda *d) {
  kdrt_cuda_impl *s = d->impl;
  if (!s || s->comm_mode != KDRT_COMM_NCCL) return;
  for (int i = 0; i < (1 << KDRT_MAX_AXES); i++)
    if (s->group[i]) ncclCommAbort(s->group[i]), s->group[i] = NULL;
  if (s->world) ncclCommAbort(s->world), s->world = NULL;
  s->comm_mode = KDRT_COMM_NONE;
}

// NCCL reports its own failures (a peer gone, a network error, a timeout
// in a proxy) on the communicator, not on the stream, whose work then
// never finishes. Whoever waits for a stream asks here between polls; an
// error ends the job with NCCL's words, after aborting the communicators.
void kdrt_cuda_comm_poll(kdrt_cuda *d, const char *what) {
  kdrt_cuda_impl *s = d->impl;
  if (s->comm_mode != KDRT_COMM_NCCL) return;
  for (int i = -1; i < (1 << KDRT_MAX_AXES); i++) {
    ncclComm_t comm = i < 0 ? s->world : s->group[i];
    if (!comm) continue;
    ncclResult_t err = ncclSuccess, rc = ncclCommGetAsyncError(comm, &err);
    if (rc == ncclSuccess && (err == ncclSuccess || err == ncclInProgress)) continue;
    char msg[768];
    snprintf(msg, sizeof msg, "NCCL asynchronous error on the %s communicator: %s (%s); "
             "communicators aborted", i < 0 ? "world" : "mesh group",
             ncclGetErrorString(rc != ncclSuccess ? rc : err), ncclGetLastError(comm));
    kdrt_cuda_fail(what, __FILE__, __LINE__, msg); // aborts them first
  }
}

void kdrt_cuda_comm_free(kdrt_cuda *d) {
  kdrt_cuda_impl *s = d->impl;
  for (int i = 0; i < (1 << KDRT_MAX_AXES); i++)
    if (s->group[i]) {
      NCCL_CHECK(ncclCommDestroy(s->group[i]));
      s->group[i] = NULL;
    }
  if (s->world) NCCL_CHECK(ncclCommDestroy(s->world));
  s->world = NULL;
  s->comm_mode = KDRT_COMM_NONE;
}

// ------------------------------------------------------------ groups

static int group_size(const kdrt_cuda *d, unsigned axes) {
  return kdrt_group_size(d->c, axes);
}


static ncclComm_t group_comm(kdrt_cuda *d, unsigned axes) {
  kdrt_cuda_impl *s = d->impl;
  const kdrt_ctx *c = d->c;
  if (!s->group[axes]) {
    unsigned all = (1u << c->prog->mesh_ndim) - 1;
    int color = kdrt_group_index(c, ~axes & all), key = kdrt_group_index(c, axes);
    NCCL_CHECK(ncclCommSplit(s->world, color, key, &s->group[axes], NULL));
  }
  return s->group[axes];
}

// Hand the compute stream's work so far to the comm stream, and back.
static cudaStream_t to_comm(kdrt_cuda *d) {
  kdrt_cuda_impl *s = d->impl;
  CUDA_CHECK(cudaEventRecord(s->to_comm, s->stream));
  CUDA_CHECK(cudaStreamWaitEvent(s->comm_stream, s->to_comm, 0));
  return s->comm_stream;
}
static void to_compute(kdrt_cuda *d, const char *what) {
  kdrt_cuda_impl *s = d->impl;
  CUDA_CHECK(cudaEventRecord(s->to_compute, s->comm_stream));
  CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->to_compute, 0));
  if (s->sync_each) kdrt_cuda_wait(d, s->stream, what);
}

static int64_t elems(int rank, const int64_t *lshape) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= lshape[i];
  return n;
}

static void check_dim(const kdrt_cuda *d, const char *what, int rank, const int64_t *lshape,
                      int dim, int n) {
  if (dim < 0 || dim >= rank) kdrt_fatal(d->c, "%s: dim %d out of range for rank %d", what, dim, rank);
  if (lshape[dim] % n)
    kdrt_fatal(d->c, "%s: extent %lld of dim %d does not divide by the group size %d", what,
               (long long)lshape[dim], dim, n);
}

// Host staging: in (nin floats) to pinned memory; the caller runs the MPI
// collective into the second pinned buffer (nout floats), then stage_back.
static float *stage_in(kdrt_cuda *d, const float *in, size_t nin, size_t nout, float **hout) {
  float *h = (float *)kdrt_cuda_hscratch(d, 0, (nin ? nin : 1) * sizeof(float));
  *hout = (float *)kdrt_cuda_hscratch(d, 1, (nout ? nout : 1) * sizeof(float));
  kdrt_cuda_download(d, h, in, nin); // waits for the compute stream
  return h;
}
static void stage_back(kdrt_cuda *d, float *out, const float *h, size_t n) {
  kdrt_cuda_upload(d, out, h, n);
  // The pinned buffers are reused by the next collective: wait for the copy.
  kdrt_cuda_wait(d, d->impl->stream, "host-staged collective");
}

// ------------------------------------------------------------ collectives

extern "C" void kdrt_cuda_allreduce(kdrt_cuda *d, unsigned axes, const float *in, float *out,
                                    size_t n) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_allreduce");
  if (group_size(d, axes) == 1) {
    kdrt_cuda_copy(d, out, in, n);
    return;
  }
  if (d->impl->comm_mode == KDRT_COMM_HOST) {
    float *hout, *h = stage_in(d, in, n, n, &hout);
    kdrt_allreduce(d->c, axes, h, hout, n);
    stage_back(d, out, hout, n);
    return;
  }
  ncclComm_t comm = group_comm(d, axes);
  cudaStream_t cs = to_comm(d);
  NCCL_CHECK(ncclAllReduce(in, out, n, ncclFloat, ncclSum, comm, cs));
  to_compute(d, "ncclAllReduce");
}

// As kdrt_allreduce_max: the elementwise maximum over the group; in == out
// is allowed (NCCL and the host path both take it in place).
extern "C" void kdrt_cuda_allreduce_max(kdrt_cuda *d, unsigned axes, const float *in, float *out,
                                        size_t n) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_allreduce_max");
  if (group_size(d, axes) == 1) {
    kdrt_cuda_copy(d, out, in, n);
    return;
  }
  if (d->impl->comm_mode == KDRT_COMM_HOST) {
    float *hout, *h = stage_in(d, in, n, n, &hout);
    kdrt_allreduce_max(d->c, axes, h, hout, n);
    stage_back(d, out, hout, n);
    return;
  }
  ncclComm_t comm = group_comm(d, axes);
  cudaStream_t cs = to_comm(d);
  NCCL_CHECK(ncclAllReduce(in, out, n, ncclFloat, ncclMax, comm, cs));
  to_compute(d, "ncclAllReduce (max)");
}

extern "C" void kdrt_cuda_reduce_scatter(kdrt_cuda *d, unsigned axes, int rank,
                                         const int64_t *lshape, int dim, const float *in,
                                         float *out) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_reduce_scatter");
  int n = group_size(d, axes);
  check_dim(d, "reduce_scatter", rank, lshape, dim, n);
  int64_t outer, inner, ext = lshape[dim], part = ext / n;
  kdrt_split_shape(rank, lshape, dim, &outer, &inner);
  int64_t blk = outer * part * inner; // floats each rank ends with
  if (n == 1) {
    kdrt_cuda_copy(d, out, in, (size_t)blk);
    return;
  }
  if (d->impl->comm_mode == KDRT_COMM_HOST) {
    float *hout, *h = stage_in(d, in, (size_t)(blk * n), (size_t)blk, &hout);
    kdrt_reduce_scatter(d->c, axes, rank, lshape, dim, h, hout);
    stage_back(d, out, hout, (size_t)blk);
    return;
  }
  const float *send = in;
  if (outer > 1) { // pack: the block for group rank b contiguous
    float *packed = (float *)kdrt_cuda_dscratch(d, 0, (size_t)(blk * n) * sizeof(float));
    for (int b = 0; b < n; b++)
      kdrt_cuda_copy_block(d, packed + b * blk, in, outer, ext, b * part, part, inner);
    send = packed;
  }
  ncclComm_t comm = group_comm(d, axes);
  cudaStream_t cs = to_comm(d);
  NCCL_CHECK(ncclReduceScatter(send, out, (size_t)blk, ncclFloat, ncclSum, comm, cs));
  to_compute(d, "ncclReduceScatter");
}

extern "C" void kdrt_cuda_allgather(kdrt_cuda *d, unsigned axes, int rank, const int64_t *lshape,
                                    int dim, const float *in, float *out) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_allgather");
  int n = group_size(d, axes);
  check_dim(d, "allgather", rank, lshape, dim, 1);
  int64_t outer, inner, ext = lshape[dim];
  kdrt_split_shape(rank, lshape, dim, &outer, &inner);
  int64_t blk = outer * ext * inner;
  if (n == 1) {
    kdrt_cuda_copy(d, out, in, (size_t)blk);
    return;
  }
  if (d->impl->comm_mode == KDRT_COMM_HOST) {
    float *hout, *h = stage_in(d, in, (size_t)blk, (size_t)(blk * n), &hout);
    kdrt_allgather(d->c, axes, rank, lshape, dim, h, hout);
    stage_back(d, out, hout, (size_t)(blk * n));
    return;
  }
  ncclComm_t comm = group_comm(d, axes);
  float *recv = outer == 1 ? out : (float *)kdrt_cuda_dscratch(d, 0, (size_t)(blk * n) * sizeof(float));
  cudaStream_t cs = to_comm(d);
  NCCL_CHECK(ncclAllGather(in, recv, (size_t)blk, ncclFloat, comm, cs));
  to_compute(d, "ncclAllGather");
  if (outer > 1)
    for (int b = 0; b < n; b++)
      kdrt_cuda_place_block(d, out, recv + b * blk, outer, ext, b * ext, ext * n, inner);
}

extern "C" void kdrt_cuda_alltoall(kdrt_cuda *d, unsigned axes, int rank, const int64_t *lshape,
                                   int from, int to, const float *in, float *out) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_alltoall");
  int n = group_size(d, axes);
  check_dim(d, "alltoall", rank, lshape, from, 1);
  check_dim(d, "alltoall", rank, lshape, to, n);
  if (from == to) kdrt_fatal(d->c, "alltoall: from and to are the same dim %d", from);
  int64_t total = elems(rank, lshape);
  if (n == 1) {
    kdrt_cuda_copy(d, out, in, (size_t)total);
    return;
  }
  if (d->impl->comm_mode == KDRT_COMM_HOST) {
    float *hout, *h = stage_in(d, in, (size_t)total, (size_t)total, &hout);
    kdrt_alltoall(d->c, axes, rank, lshape, from, to, h, hout);
    stage_back(d, out, hout, (size_t)total);
    return;
  }
  // Chunk j of the input (block j along `to`) goes to group rank j; the
  // chunk from group rank i is block i along `from` of the output.
  int64_t part = lshape[to] / n, blk = total / n;
  int64_t cshape[KDRT_MAX_RANK];
  memcpy(cshape, lshape, (size_t)rank * sizeof(int64_t));
  cshape[to] = part;
  int64_t to_outer, to_inner, from_outer, from_inner;
  kdrt_split_shape(rank, lshape, to, &to_outer, &to_inner);
  kdrt_split_shape(rank, cshape, from, &from_outer, &from_inner);
  float *send = (float *)kdrt_cuda_dscratch(d, 0, (size_t)total * sizeof(float));
  float *recv = (float *)kdrt_cuda_dscratch(d, 1, (size_t)total * sizeof(float));
  for (int j = 0; j < n; j++)
    kdrt_cuda_copy_block(d, send + j * blk, in, to_outer, lshape[to], j * part, part, to_inner);
  ncclComm_t comm = group_comm(d, axes);
  cudaStream_t cs = to_comm(d);
  NCCL_CHECK(ncclGroupStart());
  for (int j = 0; j < n; j++) {
    NCCL_CHECK(ncclSend(send + j * blk, (size_t)blk, ncclFloat, j, comm, cs));
    NCCL_CHECK(ncclRecv(recv + j * blk, (size_t)blk, ncclFloat, j, comm, cs));
  }
  NCCL_CHECK(ncclGroupEnd());
  to_compute(d, "ncclSend/ncclRecv (all-to-all)");
  int64_t fext = lshape[from];
  for (int i = 0; i < n; i++)
    kdrt_cuda_place_block(d, out, recv + i * blk, from_outer, fext, i * fext, fext * n, from_inner);
}

extern "C" void kdrt_cuda_slice(kdrt_cuda *d, unsigned axes, int rank, const int64_t *lshape,
                                int dim, const float *in, float *out) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_slice");
  int n = group_size(d, axes);
  check_dim(d, "slice", rank, lshape, dim, n);
  int64_t outer, inner, ext = lshape[dim], part = ext / n;
  kdrt_split_shape(rank, lshape, dim, &outer, &inner);
  kdrt_cuda_copy_block(d, out, in, outer, ext, kdrt_group_index(d->c, axes) * part, part, inner);
}

// ------------------------------------------------------------ 16-bit values (issue 23)
// As ../comm.c's kdrt_allgather16 and kdrt_alltoall16: a value exactly of
// a 16-bit type packed on the compute stream (kdrt_cuda_pack16) into words
// of two values, moved by the float collectives above over the shape with
// its last dim halved (NCCL, or host-staged: the copies to and from the
// host halve too), unpacked into out.

static const float *pack_pairs(kdrt_cuda *d, const char *what, int kind, int rank,
                               const int64_t *lshape, int to, int n, const float *in,
                               int64_t *pair) {
  if (!kdrt_pair_shape(rank, lshape, to, n, pair))
    kdrt_fatal(d->c, "%s: a shape whose blocks do not pair 16-bit values (kdcc asks for none)",
               what);
  size_t m = (size_t)elems(rank, lshape);
  uint16_t *p = (uint16_t *)kdrt_cuda_dscratch(d, 5, m * sizeof(uint16_t));
  kdrt_cuda_pack16(d, kind, p, in, m);
  return (const float *)p;
}

extern "C" void kdrt_cuda_allgather16(kdrt_cuda *d, int kind, unsigned axes, int rank,
                                      const int64_t *lshape, int dim, const float *in,
                                      float *out) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_allgather16");
  int64_t pair[KDRT_MAX_RANK];
  const float *p = pack_pairs(d, "allgather16", kind, rank, lshape, -1, 1, in, pair);
  size_t m = (size_t)(elems(rank, lshape) * group_size(d, axes));
  uint16_t *q = (uint16_t *)kdrt_cuda_dscratch(d, 6, m * sizeof(uint16_t));
  kdrt_cuda_allgather(d, axes, rank, pair, dim, p, (float *)q);
  kdrt_cuda_unpack16(d, kind, out, q, m);
}

extern "C" void kdrt_cuda_alltoall16(kdrt_cuda *d, int kind, unsigned axes, int rank,
                                     const int64_t *lshape, int from, int to, const float *in,
                                     float *out) {
  kdrt_cuda_need_ctx(d, "kdrt_cuda_alltoall16");
  int64_t pair[KDRT_MAX_RANK];
  const float *p = pack_pairs(d, "alltoall16", kind, rank, lshape, to, group_size(d, axes), in,
                              pair);
  size_t m = (size_t)elems(rank, lshape);
  uint16_t *q = (uint16_t *)kdrt_cuda_dscratch(d, 6, m * sizeof(uint16_t));
  kdrt_cuda_alltoall(d, axes, rank, pair, from, to, p, (float *)q);
  kdrt_cuda_unpack16(d, kind, out, q, m);
}
