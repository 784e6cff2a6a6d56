// resident.cu: data sets held whole on the device (issue 22).
//
// A step's inputs otherwise come from the host: the fit loop (or its input
// thread) gathers the batch's rows into pinned buffers and session.cu
// uploads them, some megabytes a step for an MLP on images. A data set that
// fits the budget is instead uploaded once, as kdrt_data_records lays it
// (every sample one record: its inputs, then its labels, 4-byte elements),
// and each step sends only its rows' sample numbers; a kernel on the copy
// stream gathers the records' parts into the step's input and label
// buffers. The bytes are the same as the host's gather: the same batches,
// bit for bit.
//
// Opt-in until a GPU run has proven it (issue 22): KDRT_CUDA_RESIDENT_MB=N
// gives all sets together N megabytes, =auto a quarter of the device memory
// free when the first set is offered; unset, empty or 0: off, every batch
// from the host as before. A set over the budget stays on the host path.
// tests/gpu/device.sh turns it on (auto) for every run but its "all off"
// and `nores` ones, so the bit-for-bit checks cover the device's gather.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

// One data set, known by what makes its samples (a slice is another set).
typedef struct {
  const kdrt_data *d;
  const kdrt_array *x; // the open files (NULL: synthetic)
  uint64_t seed;
  int64_t first, n;
  uint32_t *records;   // device: n records of `words` 4-byte words; NULL: over the budget
} resident_set;

enum { RESIDENT_SETS = 8 }; // training, validation, test: a few per run
static resident_set sets[RESIDENT_SETS];
static int nsets;
static size_t budget, used; // bytes
static int off = -1;        // KDRT_CUDA_RESIDENT_MB=0

// The next step's rows (kdrt_cuda_resident_rows said yes): set s, n sample
// numbers, taken by kdrt_cuda_resident_fill.
static const resident_set *pending;
static int32_t *pending_idx;
static int64_t pending_n, pending_cap;
static int32_t *idx_dev[2]; // per half of the inputs: the rows' sample numbers
static int64_t idx_cap;

static int same_set(const resident_set *s, const kdrt_data *d) {
  return s->d == d && s->x == d->x && s->seed == d->seed && s->first == d->first && s->n == d->n;
}

// d's set, made (uploaded) now if it fits what is left of the budget.
static const resident_set *set_of(const kdrt_data *d) {
  for (int i = 0; i < nsets; i++)
    if (same_set(&sets[i], d)) return &sets[i];
  if (nsets == RESIDENT_SETS || d->n <= 0 || d->n > INT32_MAX) return NULL;
  resident_set *s = &sets[nsets++];
  *s = (resident_set){d, d->x, d->seed, d->first, d->n, NULL};
  size_t per = kdrt_data_record_bytes(d->p), bytes = (size_t)d->n * per;
  if (!per || bytes / per != (size_t)d->n || bytes > budget - used) return s;
  unsigned char *host = (unsigned char *)malloc(bytes);
  if (!host) return s;
  kdrt_data_records(d, host);
  void *p = NULL;
  if (cudaMalloc(&p, bytes) != cudaSuccess) { // (too little memory after all: the host path)
    (void)cudaGetLastError();
    free(host);
    return s;
  }
  CUDA_CHECK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
  free(host);
  s->records = (uint32_t *)p;
  used += bytes;
  return s;
}

static void read_budget(void) {
  const char *e = getenv("KDRT_CUDA_RESIDENT_MB");
  if (e && !strcmp(e, "auto")) {
    size_t free_b = 0, total = 0;
    off = cudaMemGetInfo(&free_b, &total) != cudaSuccess;
    budget = free_b / 4;
    return;
  }
  char *end = NULL;
  double mb = e && *e ? strtod(e, &end) : 0;
  off = !(mb > 0) || *end;
  budget = off ? 0 : (size_t)(mb * 1024 * 1024);
  if (off && e && *e && strcmp(e, "0"))
    fprintf(stderr, "kdrt-cuda: KDRT_CUDA_RESIDENT_MB='%s' is neither auto nor a number of "
            "megabytes; the data sets stay on the host\n", e);
}

extern "C" int kdrt_cuda_resident_rows(const kdrt_data *d, const int64_t *order, int64_t pos0,
                                       int64_t n) {
  if (!kdrt_cuda_current()) return 0; // (the device is opened by the first step's probe)
  if (off < 0) read_budget();
  if (off) return 0;
  const resident_set *s = set_of(d);
  if (!s || !s->records) return 0;
  if (n > pending_cap) {
    int32_t *p = (int32_t *)realloc(pending_idx, (size_t)n * sizeof *p);
    if (!p) return 0;
    pending_idx = p, pending_cap = n;
  }
  for (int64_t i = 0; i < n; i++) pending_idx[i] = (int32_t)(order ? order[pos0 + i] : pos0 + i);
  pending = s, pending_n = n;
  return 1;
}

// Row i of out (`words` words a row) from the record of sample idx[i], its
// words [at, at + words): a row per blockIdx.y, its words over the x
// blocks and threads.
__global__ static void gather_records_kernel(uint32_t *out, const uint32_t *rec,
                                             const int32_t *idx, int64_t n, int64_t per,
                                             int64_t at, int64_t words) {
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const uint32_t *src = rec + (int64_t)idx[i] * per + at;
    uint32_t *dst = out + i * words;
    for (int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; w < words;
         w += (int64_t)gridDim.x * blockDim.x)
      dst[w] = src[w];
  }
}

static void gather_part(kdrt_cuda *d, cudaStream_t st, void *out, const int32_t *idx, int64_t per,
                        int64_t at, int64_t words) {
  if (!words || !pending_n) return;
  int64_t bx = (words + 255) / 256;
  dim3 grid((unsigned)(bx < 64 ? bx : 64), (unsigned)(pending_n < 65535 ? pending_n : 65535));
  gather_records_kernel<<<grid, 256, 0, st>>>((uint32_t *)out, pending->records, idx, pending_n,
                                              per, at, words);
  KDRT_LAUNCHED(d, "gather_records_kernel");
}

extern "C" int kdrt_cuda_resident_fill(kdrt_cuda *d, int half, void *const *x, float *const *y,
                                       char **stage) {
  if (!pending) return 0;
  const kdrt_program *p = d->c->prog;
  cudaStream_t st = d->impl->copy_stream;
  if (pending_n > idx_cap) {
    for (int h = 0; h < 2; h++) {
      if (idx_dev[h]) CUDA_CHECK(cudaFree(idx_dev[h]));
      CUDA_CHECK(cudaMalloc(&idx_dev[h], (size_t)pending_n * sizeof(int32_t)));
    }
    idx_cap = pending_n;
  }
  // the sample numbers through the pinned stage, as the inputs would go
  size_t bytes = (size_t)pending_n * sizeof(int32_t);
  memcpy(*stage, pending_idx, bytes);
  CUDA_CHECK(cudaMemcpyAsync(idx_dev[half], *stage, bytes, cudaMemcpyHostToDevice, st));
  *stage += (bytes + 15) / 16 * 16;
  int64_t per = (int64_t)(kdrt_data_record_bytes(p) / 4), at = 0;
  for (int k = 0; k < p->ninputs; k++) {
    int64_t w = kdrt_io_elems(&p->inputs[k]);
    gather_part(d, st, x[k], idx_dev[half], per, at, w);
    at += w;
  }
  for (int j = 0; j < p->nlabels; j++) {
    int64_t w = kdrt_io_elems(&p->labels[j]);
    gather_part(d, st, y[j], idx_dev[half], per, at, w);
    at += w;
  }
  pending = NULL, pending_n = 0;
  return 1;
}

extern "C" void kdrt_cuda_resident_free(void) {
  for (int i = 0; i < nsets; i++)
    if (sets[i].records) CUDA_CHECK(cudaFree(sets[i].records));
  for (int h = 0; h < 2; h++) {
    if (idx_dev[h]) CUDA_CHECK(cudaFree(idx_dev[h]));
    idx_dev[h] = NULL;
  }
  free(pending_idx);
  pending_idx = NULL, pending = NULL;
  nsets = 0, used = 0, idx_cap = pending_cap = pending_n = 0, off = -1;
}
