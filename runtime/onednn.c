// onednn.c: convolutions through oneDNN (Debian's libdnnl), behind ops.c's
// kdrt_conv2d, kdrt_conv2d_dx and kdrt_conv2d_dw; and (issue 23, at the
// end) products of bfloat16 operands, behind kdrt_matmul16.
//
// A kdrt_window is a compile-time constant of the generated program but
// for its batch (the step's rows). Each distinct (kind, window) gets its
// primitives made once, on first use, and kept in a small cache keyed on
// the window's contents: a program with three convolutions makes its
// primitives in the first step, and every later call only points the
// memory objects at the caller's buffers and runs.
//
// Memory formats are chosen once, when an entry is made: activations stay
// in kdcc's channels-last layout (oneDNN's nhwc, so no reorder), and the
// filter [KH, KW, C, K] (oneDNN's hwio; with groups [KH, KW, cg, G * kg],
// the 5-D hwigo: oneDNN convolves the groups itself, issue 15) is handed
// over in whatever layout the primitive prefers (format_tag_any): forward
// and backward-data reorder the filter into the entry's own buffer before
// running (a few kilobytes), backward-weights writes that layout and is
// reordered back into hwio (hwigo).
//
// Results never depend on the number of threads. Forward and backward-data
// reduce over the filter window and channels only, inside one thread.
// Backward-weights reduces over the batch, which oneDNN splits over its
// threads; so here the batch is cut into a fixed number of chunks (a
// function of the batch alone), each chunk's filter gradient is computed by
// a single-threaded primitive (the chunks run in parallel), and the chunks
// are added in order.
//
// Max pooling stays in ops.c: on this 2-core AVX2 machine its own loops
// are 2-4x faster than oneDNN's nhwc pooling (bench/analysis.md).
//
// KDRT_ONEDNN=0 in the environment turns this file off (ops.c's im2col
// path runs instead, and kdrt_matmul16 widens its operands for OpenBLAS),
// for comparisons and tests.
#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdrt.h"

#define KD_CACHE 32     // entries; a program uses a few, the oldest is dropped when full
#define KD_DW_CHUNKS 8 // backward-weights: at most this many batch chunks

typedef struct {
  dnnl_primitive_t prim;
  dnnl_memory_t src, dst, wts, pad; // operands (handles set per call), scratchpad
  void *wbuf, *padbuf;              // this chunk's filter gradient, its scratchpad
} chunk;

typedef struct {
  int kind; // KDRT_DNNL_CONV*, 0: a free slot
  kdrt_window w;
  dnnl_primitive_t reorder; // the filter hwio <-> the primitive's layout, or NULL
  dnnl_memory_t wts, user_w; // the filter in the primitive's layout (wbuf), the caller's
  void *wbuf;
  size_t wbytes;
  int nch;                   // chunks (1 but for backward-weights)
  chunk ch[KD_DW_CHUNKS];
} entry;

static struct {
  int state; // 0: not tried, 1: ready, -1: off or failed
  dnnl_engine_t eng;
  dnnl_stream_t strm, chunk_strm[KD_DW_CHUNKS]; // the latter: one per concurrent chunk
  entry e[KD_CACHE];
  int next; // the slot to reuse when full (oldest first)
} D;

static int ok(dnnl_status_t s) { return s == dnnl_success; }

static int ready(void) {
  if (D.state) return D.state > 0;
  const char *env = getenv("KDRT_ONEDNN");
  D.state = -1;
  if (env && !strcmp(env, "0")) return 0;
  if (!ok(dnnl_engine_create(&D.eng, dnnl_cpu, 0))) return 0;
  if (!ok(dnnl_stream_create(&D.strm, D.eng, dnnl_stream_default_flags))) return 0;
  for (int i = 0; i < KD_DW_CHUNKS; i++)
    if (!ok(dnnl_stream_create(&D.chunk_strm[i], D.eng, dnnl_stream_default_flags))) return 0;
  D.state = 1;
  return 1;
}

static void drop_chunk(chunk *c) {
  dnnl_primitive_destroy(c->prim);
  dnnl_memory_destroy(c->src);
  dnnl_memory_destroy(c->dst);
  dnnl_memory_destroy(c->wts);
  dnnl_memory_destroy(c->pad);
  free(c->wbuf);
  free(c->padbuf);
}

static void drop(entry *e) {
  for (int i = 0; i < KD_DW_CHUNKS; i++) drop_chunk(&e->ch[i]);
  dnnl_primitive_destroy(e->reorder);
  dnnl_memory_destroy(e->wts);
  dnnl_memory_destroy(e->user_w);
  free(e->wbuf);
  memset(e, 0, sizeof *e);
}

static void *alloc64(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }

// ---- descriptors

static void md_nhwc(dnnl_memory_desc_t *md, int n, int c, int h, int w) {
  dnnl_dims_t d = {n, c, h, w};
  dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, dnnl_nhwc);
}

// The filter, oneDNN's logical order OIHW, or with G groups GOIHW; kdcc's
// [KH, KW, cg, G * kg] is hwio, grouped hwigo. any: the primitive's choice.
static void md_filter(dnnl_memory_desc_t *md, const kdrt_window *w, int any) {
  int G = kdrt_groups(w);
  if (G == 1) {
    dnnl_dims_t d = {w->K, w->C, w->KH, w->KW};
    dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, any ? dnnl_format_tag_any : dnnl_hwio);
  } else {
    dnnl_dims_t d = {G, w->K / G, w->C / G, w->KH, w->KW};
    dnnl_memory_desc_init_by_tag(md, 5, d, dnnl_f32, any ? dnnl_format_tag_any : dnnl_hwigo);
  }
}

// The end padding oneDNN wants so that OH = (H - KH + pad_t + pad_b) / sh + 1
// holds (floor division, as for a 'valid' window that does not tile the input).
static int64_t pad_end(int out, int in, int k, int s, int pad0) {
  int64_t p = (int64_t)(out - 1) * s + k - in - pad0;
  return p < 0 ? 0 : p;
}

// The conv descriptor of `kind` for w with a batch of mb.
static int conv_desc(dnnl_convolution_desc_t *cd, int kind, const kdrt_window *w, int mb) {
  dnnl_memory_desc_t src, dst, wts;
  md_nhwc(&src, mb, w->C, w->H, w->W);
  md_nhwc(&dst, mb, w->K, w->OH, w->OW);
  md_filter(&wts, w, 1);
  dnnl_dims_t st = {w->sh, w->sw}, pl = {w->pad_t, w->pad_l}, dl = {w->dil_h, w->dil_w};
  // the padding at the end, from the dilated kernel's extent
  int ekh = (w->KH - 1) * (w->dil_h + 1) + 1, ekw = (w->KW - 1) * (w->dil_w + 1) + 1;
  dnnl_dims_t pr = {pad_end(w->OH, w->H, ekh, w->sh, w->pad_t),
                    pad_end(w->OW, w->W, ekw, w->sw, w->pad_l)};
  const dnnl_alg_kind_t alg = dnnl_convolution_direct;
  if (kind == KDRT_DNNL_CONV)
    return ok(dnnl_dilated_convolution_forward_desc_init(cd, dnnl_forward_training, alg, &src,
                                                         &wts, NULL, &dst, st, dl, pl, pr));
  if (kind == KDRT_DNNL_CONV_DX)
    return ok(dnnl_dilated_convolution_backward_data_desc_init(cd, alg, &src, &wts, &dst, st, dl,
                                                               pl, pr));
  return ok(dnnl_dilated_convolution_backward_weights_desc_init(cd, alg, &src, &wts, NULL, &dst,
                                                                st, dl, pl, pr));
}

// The primitive descriptor of `kind` for a batch of mb (the backward ones
// take the forward one as their hint), its scratchpad left to the caller.
static dnnl_primitive_desc_t conv_pd(int kind, const kdrt_window *w, int mb) {
  dnnl_primitive_attr_t attr = NULL;
  dnnl_primitive_desc_t fwd = NULL, pd = NULL;
  dnnl_convolution_desc_t fd, cd;
  if (!ok(dnnl_primitive_attr_create(&attr)) ||
      !ok(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) ||
      !conv_desc(&fd, KDRT_DNNL_CONV, w, mb) ||
      !ok(dnnl_primitive_desc_create(&fwd, &fd, attr, D.eng, NULL)))
    goto out;
  if (kind == KDRT_DNNL_CONV) {
    pd = fwd, fwd = NULL;
  } else if (!conv_desc(&cd, kind, w, mb) ||
             !ok(dnnl_primitive_desc_create(&pd, &cd, attr, D.eng, fwd))) {
    pd = NULL;
  }
out:
  dnnl_primitive_desc_destroy(fwd);
  dnnl_primitive_attr_destroy(attr);
  return pd;
}

static int memory(dnnl_memory_t *m, const dnnl_memory_desc_t *md, void *handle) {
  return ok(dnnl_memory_create(m, md, D.eng, handle ? handle : DNNL_MEMORY_NONE));
}

// One chunk's primitive and memory objects for a batch of mb; wts_buf:
// allocate the filter (gradient) buffer of the chunk's own.
static int make_chunk(chunk *c, int kind, const kdrt_window *w, int mb, int wts_buf) {
  dnnl_primitive_desc_t pd = conv_pd(kind, w, mb);
  if (!pd) return 0;
  dnnl_memory_desc_t src, dst;
  md_nhwc(&src, mb, w->C, w->H, w->W);
  md_nhwc(&dst, mb, w->K, w->OH, w->OW);
  dnnl_query_t wq = kind == KDRT_DNNL_CONV_DW ? dnnl_query_diff_weights_md : dnnl_query_weights_md;
  const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, wq, 0);
  const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  size_t pad = dnnl_memory_desc_get_size(smd);
  int r = ok(dnnl_primitive_create(&c->prim, pd)) && memory(&c->src, &src, NULL) &&
          memory(&c->dst, &dst, NULL);
  if (r && wts_buf) {
    c->wbuf = alloc64(dnnl_memory_desc_get_size(wmd));
    r = c->wbuf && memory(&c->wts, wmd, c->wbuf);
  } else if (r) {
    r = memory(&c->wts, wmd, NULL);
  }
  if (r && pad) {
    c->padbuf = alloc64(pad);
    r = c->padbuf && memory(&c->pad, smd, c->padbuf);
  }
  dnnl_primitive_desc_destroy(pd);
  return r;
}

// The batch rows of chunk i of n: [*b0, *b0 + size), the first B % n
// chunks one row longer.
static int chunk_rows(int B, int n, int i, int *b0) {
  int base = B / n, rem = B % n;
  *b0 = i * base + (i < rem ? i : rem);
  return base + (i < rem);
}

// Backward-weights' chunks: about 4096 output pixels each, at least 2 (both
// cores of the machine this was tuned on busy) and at most KD_DW_CHUNKS,
// never more than the batch. Fewer, larger chunks run faster on one thread;
// a function of the window alone, so the sum's order is the same for any
// thread count.
static int dw_chunks(const kdrt_window *w) {
  int64_t n = (int64_t)w->B * w->OH * w->OW / 4096;
  n = n < 2 ? 2 : n > KD_DW_CHUNKS ? KD_DW_CHUNKS : n;
  return (int)(n < w->B ? n : w->B);
}

// The primitives of e: one for the whole batch, or for backward-weights one
// single-threaded primitive per chunk (made with one OpenMP thread, so that
// oneDNN plans for one; chunks of the same size could share one, but a
// primitive per chunk keeps each chunk's memory objects its own).
static int make_entry(entry *e) {
  const kdrt_window *w = &e->w;
  dnnl_memory_desc_t user;
  md_filter(&user, w, 0);
  int dw = e->kind == KDRT_DNNL_CONV_DW;
  e->nch = dw ? dw_chunks(w) : 1;
  if (e->nch < 1) return 0;
  int threads = omp_get_max_threads();
  if (dw) omp_set_num_threads(1);
  int r = 1;
  for (int i = 0; i < e->nch && r; i++) {
    int b0, mb = chunk_rows(w->B, e->nch, i, &b0);
    r = make_chunk(&e->ch[i], e->kind, w, mb, dw);
  }
  if (dw) omp_set_num_threads(threads);
  if (!r) return 0;
  // The filter: hwio as it is, or reordered to / from the primitive's layout.
  const dnnl_memory_desc_t *wmd;
  if (!ok(dnnl_memory_get_memory_desc(e->ch[0].wts, &wmd))) return 0;
  e->wbytes = dnnl_memory_desc_get_size(wmd);
  if (dnnl_memory_desc_equal(&user, wmd)) return 1;
  dnnl_primitive_desc_t rpd;
  if (!ok(dnnl_reorder_primitive_desc_create(&rpd, dw ? wmd : &user, D.eng, dw ? &user : wmd,
                                             D.eng, NULL)))
    return 0;
  r = ok(dnnl_primitive_create(&e->reorder, rpd));
  dnnl_primitive_desc_destroy(rpd);
  e->wbuf = alloc64(e->wbytes);
  return r && e->wbuf && memory(&e->user_w, &user, NULL) && memory(&e->wts, wmd, e->wbuf);
}

// The cache entry for (kind, w), made on first use; NULL when oneDNN is off
// or cannot do it (the caller then runs its own loops).
static entry *lookup(int kind, const kdrt_window *w) {
  if (!ready()) return NULL;
  for (int i = 0; i < KD_CACHE; i++)
    if (D.e[i].kind == kind && !memcmp(&D.e[i].w, w, sizeof *w)) return &D.e[i];
  entry *e = &D.e[D.next];
  D.next = (D.next + 1) % KD_CACHE;
  if (e->kind) drop(e);
  e->kind = kind;
  e->w = *w;
  if (!make_entry(e)) {
    drop(e);
    return NULL;
  }
  return e;
}

static void run(dnnl_primitive_t p, int nargs, const dnnl_exec_arg_t *args) {
  if (!ok(dnnl_primitive_execute(p, D.strm, nargs, args)) || !ok(dnnl_stream_wait(D.strm))) {
    fprintf(stderr, "kdrt: oneDNN failed to run a primitive it had accepted\n");
    abort();
  }
}

static void point(dnnl_memory_t m, const void *p) { dnnl_memory_set_data_handle(m, (void *)p); }

// Chunk c's call: src/dst and the filter (gradient) memory, its arguments.
static void run_chunk(const chunk *c, int kind, dnnl_memory_t wts) {
  int src_arg = kind == KDRT_DNNL_CONV_DX ? DNNL_ARG_DIFF_SRC : DNNL_ARG_SRC;
  int dst_arg = kind == KDRT_DNNL_CONV ? DNNL_ARG_DST : DNNL_ARG_DIFF_DST;
  int w_arg = kind == KDRT_DNNL_CONV_DW ? DNNL_ARG_DIFF_WEIGHTS : DNNL_ARG_WEIGHTS;
  dnnl_exec_arg_t args[4] = {{src_arg, c->src}, {dst_arg, c->dst}, {w_arg, wts},
                             {DNNL_ARG_SCRATCHPAD, c->pad}};
  run(c->prim, c->pad ? 4 : 3, args);
}

// ---- the entry ops.c calls: 1 when done, 0 when the caller must do it

int kdrt_dnnl_conv(int kind, const kdrt_window *w, float *out, const float *a, const float *b) {
  entry *e = lookup(kind, w);
  if (!e) return 0;
  if (kind != KDRT_DNNL_CONV_DW) {
    chunk *c = &e->ch[0];
    if (kind == KDRT_DNNL_CONV) // y = conv(x = a, f = b)
      point(c->src, a), point(c->dst, out);
    else // dx = out from dy = a and f = b
      point(c->src, out), point(c->dst, a);
    if (e->reorder) { // the filter into the primitive's layout
      point(e->user_w, b);
      run(e->reorder, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, e->user_w}, {DNNL_ARG_TO, e->wts}});
      run_chunk(c, kind, e->wts);
    } else {
      point(c->wts, b);
      run_chunk(c, kind, c->wts);
    }
    return 1;
  }
  // dw = out from x = a, dy = b: each chunk its own gradient, in parallel,
  // each on one thread; then their sum, chunk 0 first, in any layout (the
  // same for every chunk), and the reorder to hwio.
  const size_t xrow = (size_t)w->H * w->W * w->C, yrow = (size_t)w->OH * w->OW * w->K;
  int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
  for (int i = 0; i < e->nch; i++) {
    chunk *c = &e->ch[i];
    int b0;
    chunk_rows(w->B, e->nch, i, &b0);
    point(c->src, a + b0 * xrow), point(c->dst, b + b0 * yrow);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, c->src}, {DNNL_ARG_DIFF_DST, c->dst},
                               {DNNL_ARG_DIFF_WEIGHTS, c->wts}, {DNNL_ARG_SCRATCHPAD, c->pad}};
    failed |= !ok(dnnl_primitive_execute(c->prim, D.chunk_strm[i], c->pad ? 4 : 3, args)) ||
              !ok(dnnl_stream_wait(D.chunk_strm[i]));
  }
  if (failed) {
    fprintf(stderr, "kdrt: oneDNN failed to run a primitive it had accepted\n");
    abort();
  }
  float *sum = e->reorder ? e->wbuf : out;
  const size_t n = e->wbytes / sizeof(float);
  const float *p0 = e->ch[0].wbuf;
  for (size_t j = 0; j < n; j++) {
    float s = p0[j];
    for (int i = 1; i < e->nch; i++) s += ((const float *)e->ch[i].wbuf)[j];
    sum[j] = s;
  }
  if (e->reorder) {
    point(e->user_w, out);
    run(e->reorder, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, e->wts}, {DNNL_ARG_TO, e->user_w}});
  }
  return 1;
}

// ---- issue 23: products of bfloat16 operands, for ops.c's kdrt_matmul16
//
// One block of a product at a time (ops.c cuts it as kdrt_matmul does),
// on the calling thread: each OpenMP thread keeps its own stream and its
// own cache of primitives, made while it plans for one thread, so that no
// block's sums are split over threads (their order fixed by the block's
// shape alone) and no memory object is shared between threads. Operands
// in place with their leading dimensions (strided descriptors), bf16 in,
// float32 out, float32 sums. Only a kernel of the CPU's bf16 instructions
// (AVX512-BF16, AMX) is used: oneDNN's reference one would be slower than
// widening the operands for OpenBLAS, which the caller then does.

#define KD_MM_THREADS 64 // threads with a cache; a thread past them: the caller widens
#define KD_MM_CACHE 16   // shapes per thread, the oldest dropped when full

typedef struct {
  int key[8]; // ta, tb, M, N, K, lda, ldb, ldc; M 0: a free slot
  chunk p;    // the primitive; src a, wts b, dst c
} mm_entry;

static struct {
  dnnl_stream_t strm;
  mm_entry e[KD_MM_CACHE];
  int next;
} MM[KD_MM_THREADS];

int kdrt_dnnl_bf16(void) {
  return ready() && dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core_bf16;
}

static void mm_drop(mm_entry *e) {
  drop_chunk(&e->p);
  memset(e, 0, sizeof *e);
}

// A rows x cols operand of type dt, stored row-major with leading dimension
// ld, or (t) transposed: cols x rows stored.
static void md_2d(dnnl_memory_desc_t *md, int rows, int cols, int ld, int t, dnnl_data_type_t dt) {
  dnnl_dims_t d = {rows, cols}, st = {t ? 1 : ld, t ? ld : 1};
  dnnl_memory_desc_init_by_strides(md, 2, d, dt, st);
}

static int mm_make(mm_entry *e) {
  const int *k = e->key;
  dnnl_memory_desc_t a, b, c;
  md_2d(&a, k[2], k[4], k[5], k[0], dnnl_bf16);
  md_2d(&b, k[4], k[3], k[6], k[1], dnnl_bf16);
  md_2d(&c, k[2], k[3], k[7], 0, dnnl_f32);
  dnnl_matmul_desc_t md;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_primitive_desc_t pd = NULL;
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  int r = ok(dnnl_matmul_desc_init(&md, &a, &b, NULL, &c)) &&
          ok(dnnl_primitive_attr_create(&attr)) &&
          ok(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) &&
          ok(dnnl_primitive_desc_create(&pd, &md, attr, D.eng, NULL));
  omp_set_num_threads(threads);
  const char *impl = NULL;
  r = r && ok(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl)) && impl &&
      strncmp(impl, "ref", 3) != 0;
  if (r) {
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t pad = dnnl_memory_desc_get_size(smd);
    chunk *p = &e->p;
    r = ok(dnnl_primitive_create(&p->prim, pd)) && memory(&p->src, &a, NULL) &&
        memory(&p->wts, &b, NULL) && memory(&p->dst, &c, NULL);
    if (r && pad) {
      p->padbuf = alloc64(pad);
      r = p->padbuf && memory(&p->pad, smd, p->padbuf);
    }
  }
  dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_attr_destroy(attr);
  return r;
}

int kdrt_dnnl_matmul16(int ta, int tb, int M, int N, int K, const uint16_t *a, int lda,
                       const uint16_t *b, int ldb, float *c, int ldc) {
  int t = omp_get_thread_num();
  if (t >= KD_MM_THREADS || !kdrt_dnnl_bf16()) return 0;
  if (!MM[t].strm && !ok(dnnl_stream_create(&MM[t].strm, D.eng, dnnl_stream_default_flags)))
    return 0;
  const int key[8] = {ta, tb, M, N, K, lda, ldb, ldc};
  mm_entry *e = NULL;
  for (int i = 0; i < KD_MM_CACHE && !e; i++)
    if (!memcmp(MM[t].e[i].key, key, sizeof key)) e = &MM[t].e[i];
  if (!e) {
    e = &MM[t].e[MM[t].next];
    MM[t].next = (MM[t].next + 1) % KD_MM_CACHE;
    if (e->p.prim) mm_drop(e);
    memcpy(e->key, key, sizeof key);
    if (!mm_make(e)) {
      mm_drop(e);
      return 0;
    }
  }
  chunk *p = &e->p;
  point(p->src, a), point(p->wts, b), point(p->dst, c);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->src}, {DNNL_ARG_WEIGHTS, p->wts},
                             {DNNL_ARG_DST, p->dst}, {DNNL_ARG_SCRATCHPAD, p->pad}};
  return ok(dnnl_primitive_execute(p->prim, MM[t].strm, p->pad ? 4 : 3, args)) &&
         ok(dnnl_stream_wait(MM[t].strm));
}
