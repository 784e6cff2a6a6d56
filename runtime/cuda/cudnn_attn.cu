// cudnn_attn.cu (issue 22): ATTENTION (with its lse) and ATTENTION_GRAD
// through cuDNN's fused scaled-dot-product attention (cuDNN 9's flash
// attention, forward and backward), in place of attn.cu's kernels; the
// same semantics, attn.cu's header and kdrt_attention / _attention_grad in
// ../ops.c: q, o, do [bn, t, hd], k, v [bn, s, hd], scale, causal (key j
// for query i when j <= i: cuDNN's top-left causal mask), lse [bn, t] each
// row's max + log(sum of exps) of the scaled, masked scores: cuDNN's Stats
// (float32, natural log, of the scaled scores), written and read as it is.
// The heads are cuDNN's batch: [bn, 1, rows, hd], packed.
//
// Opt-in until a GPU run proves it: KDRT_CUDA_CUDNN=attn (or =1: the
// convolutions too; =conv: those alone; cudnn_attn.h), read when the device
// opens (session.cu), and only at --precision bf16 (cuDNN's operands are
// 16-bit; tf32 keeps attn.cu's kernels, fp32 the chain). q, k, v (and
// backward o and do), float32 buffers, are rounded to bfloat16 into
// scratch, as attn.cu's kernels round their operands; O, dQ, dK and dV come
// back as bfloat16 and are widened into the float32 outputs.
//
// Through the cuDNN frontend's graph API (graph::Graph::sdpa and
// sdpa_backward, header-only C++: build/cudnn-frontend, fetched by `make
// setup`, not vendored; a build without it compiles the stub at the bottom
// and says so). NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: the frontend calls
// libcudnn (and libcudart) through dlsym, on the handle cudnn.cu's loader
// opened, so that a program that does not opt in needs no libcudnn to start.
//
// Backward is deterministic (the same run, the same bits): the frontend's
// set_deterministic_algorithm, which on Hopper takes the dP-workspace
// engine (bn * t * s bf16 of workspace: 192 MiB at GPT-2's shape, batch 8).
// A graph is built once per shape, scale and pass (a cache for the
// process), with heuristics' first plan (no timing runs: every run picks
// the same). A shape cuDNN cannot take (cudnn_attn.h's rules, or any error
// of the frontend: cuDNN too old, no deterministic engine, a head dim its
// kernels lack) is said once on stderr and keeps attn.cu's kernels.
//
// Memory: the bf16 operands and cuDNN's workspace share device scratch 7
// with cudnn.cu (one op runs at a time), which grows in the first run of a
// step; a step is captured as a CUDA graph only after one uncaptured run of
// its rows (device.cu), so a replay builds and allocates nothing, and
// cuDNN's execute (launches on the runtime's stream) is captured.
#include <cuda_bf16.h>
#include <stdio.h>
#include <string.h>

#include "common.cuh"
#include "cudnn_attn.h"

#if KDRT_CUDNN_FE
// The parts (at most 5) of one rounding or widening launch. (The kernels
// are extern: the device pass sees no launch of them, see below.)
typedef struct {
  __nv_bfloat16 *h[5];
  float *f[5];
  size_t n[5];
  int k;
} attn_parts;

__global__ void kdrt_attn_to_bf16_kernel(attn_parts p) {
  for (int i = 0; i < p.k; i++) KDRT_FOR(e, p.n[i]) p.h[i][e] = __float2bfloat16_rn(p.f[i][e]);
}

__global__ void kdrt_attn_to_float_kernel(attn_parts p) {
  for (int i = 0; i < p.k; i++) KDRT_FOR(e, p.n[i]) p.f[i][e] = __bfloat162float(p.h[i][e]);
}

#endif

// The rest is host code: the device pass (cicc) parses none of it, the
// frontend's headers above all (half the build time of this file).
#ifndef __CUDA_ARCH__
static char last_why[512]; // the last refusal, for opcheck

const char *kdrt_cudnn_attention_why(void) { return last_why; }

// The refusal of shape `shape`: said once on stderr (rank 0), kept for opcheck.
static void refuse(kdrt_cuda *d, const char *shape, const char *why) {
  snprintf(last_why, sizeof last_why, "%s", why);
  if (!d->c || d->c->rank == 0)
    fprintf(stderr, "kdrt-cuda: cudnn attention: %s: %s; kdcc's kernels instead\n", shape, why);
}

#if KDRT_CUDNN_FE
// One launch over every part: to bf16 (widen 0) or back to float (1).
static void convert(kdrt_cuda *d, const attn_parts *p, int widen) {
  size_t most = 0;
  for (int i = 0; i < p->k; i++) most = p->n[i] > most ? p->n[i] : most;
  if (!most) return;
  const unsigned nb = kdrt_blocks(most);
  cudaStream_t st = d->impl->stream;
  if (widen) kdrt_attn_to_float_kernel<<<nb, KDRT_THREADS, 0, st>>>(*p);
  else kdrt_attn_to_bf16_kernel<<<nb, KDRT_THREADS, 0, st>>>(*p);
  KDRT_LAUNCHED(d, widen ? "kdrt_attn_to_float_kernel" : "kdrt_attn_to_bf16_kernel");
}

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#include <cudnn_frontend.h>

#include <memory>
#include <string>
#include <vector>

namespace cudnn_frontend {
void *cudnn_dlhandle; // the frontend's dlsym handle (shim.h): cudnn.cu's libcudnn.so.9
}
namespace fe = cudnn_frontend;

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_LSE, UID_DO, UID_DQ, UID_DK, UID_DV };

// A shape's graph: g NULL when cuDNN refused it (said once).
typedef struct {
  int64_t bn, t, s, hd;
  float scale;
  int causal, grad;
  std::shared_ptr<fe::graph::Graph> g;
  int64_t ws;
} attn_graph;

static std::vector<attn_graph> graphs;
static cudnnHandle_t handle;
static int state; // 0: not tried, 1: the handle made, -1: it could not be (load_why)
static char load_why[512];

void kdrt_cudnn_attention_free(void) {
  graphs.clear();
  if (handle) fe::detail::destroy_handle(handle);
  handle = NULL, state = 0;
}

// The handle on the runtime's stream, made (and cuDNN loaded): 0 when it
// cannot be (load_why says why).
static int open_handle(kdrt_cuda *d) {
  void *lib = kdrt_cudnn_lib(load_why, sizeof load_why);
  if (!lib) return 0;
  fe::cudnn_dlhandle = lib;
  try {
    cudnnStatus_t st = fe::detail::create_handle(&handle);
    if (st == CUDNN_STATUS_SUCCESS) st = fe::detail::set_stream(handle, d->impl->stream);
    if (st != CUDNN_STATUS_SUCCESS) {
      snprintf(load_why, sizeof load_why, "cudnnCreate: %s", fe::detail::get_error_string(st));
      return 0;
    }
  } catch (std::exception &e) {
    snprintf(load_why, sizeof load_why, "%s", e.what());
    return 0;
  }
  if (!d->c || d->c->rank == 0)
    fprintf(stderr, "kdrt-cuda: KDRT_CUDA_CUDNN: attention through cuDNN %zu (frontend %d.%d.%d)\n",
            fe::detail::get_backend_version(), CUDNN_FRONTEND_MAJOR_VERSION,
            CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
  return 1;
}

// The handle, opened on first use (a step's first, uncaptured run); why
// says why not.
static int get_handle(kdrt_cuda *d, char *why, size_t n) {
  if (!state) state = open_handle(d) ? 1 : -1;
  snprintf(why, n, "%s", load_why);
  return state > 0;
}

// a's graph defined: its tensors and the operation, not yet built; for GPU
// generation sm (90: Hopper), else (0) the device's.
static std::shared_ptr<fe::graph::Graph> define(const attn_graph *a, int sm) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm) g->set_sm_version(sm); // (before the nodes, which copy it)
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t bn = a->bn, hd = a->hd;
  auto dims = [&](fe::graph::Tensor_attributes &x, int64_t uid, int64_t rows, int64_t cols) {
    x.set_uid(uid).set_dim({bn, 1, rows, cols}).set_stride({rows * cols, rows * cols, cols, 1});
  };
  auto input = [&](const char *name, int64_t uid, int64_t rows, int64_t cols) {
    fe::graph::Tensor_attributes x;
    x.set_name(name);
    dims(x, uid, rows, cols);
    if (cols == 1) x.set_data_type(fe::DataType_t::FLOAT); // lse (head dims are 8 or more)
    return g->tensor(x);
  };
  auto Q = input("q", UID_Q, a->t, hd), K = input("k", UID_K, a->s, hd);
  auto V = input("v", UID_V, a->s, hd);
  if (!a->grad) {
    auto opt = fe::graph::SDPA_attributes()
                   .set_name("attention")
                   .set_generate_stats(true)
                   .set_attn_scale(a->scale)
                   .set_causal_mask(a->causal != 0);
    auto [O, L] = g->sdpa(Q, K, V, opt);
    O->set_output(true);
    dims(*O, UID_O, a->t, hd);
    L->set_output(true).set_data_type(fe::DataType_t::FLOAT);
    dims(*L, UID_LSE, a->t, 1);
  } else {
    auto O = input("o", UID_O, a->t, hd), dO = input("do", UID_DO, a->t, hd);
    auto L = input("lse", UID_LSE, a->t, 1);
    auto opt = fe::graph::SDPA_backward_attributes()
                   .set_name("attention_grad")
                   .set_attn_scale(a->scale)
                   .set_causal_mask(a->causal != 0)
                   .set_deterministic_algorithm(true);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, L, opt);
    dQ->set_output(true), dK->set_output(true), dV->set_output(true);
    dims(*dQ, UID_DQ, a->t, hd), dims(*dK, UID_DK, a->s, hd), dims(*dV, UID_DV, a->s, hd);
  }
  return g;
}

static std::string message(fe::error_t st) {
  std::string m = st.get_message();
  return m.empty() ? "the frontend refused the graph" : m;
}

// a's graph, built: its workspace in a->ws; why says what cuDNN refused.
static std::shared_ptr<fe::graph::Graph> build(attn_graph *a, std::string *why) {
  auto g = define(a, 0);
  auto built = g->build(handle, {fe::HeurMode_t::A});
  auto st = built.is_good() ? g->get_workspace_size(a->ws) : built;
  if (st.is_bad()) {
    *why = message(st);
    return nullptr;
  }
  return g;
}

const char *kdrt_cudnn_attention_validate(int grad, int64_t bn, int64_t t, int64_t s, int64_t hd,
                                          float scale, int causal, int sm) {
  static std::string why;
  void *lib = kdrt_cudnn_lib(load_why, sizeof load_why);
  if (!lib) return load_why;
  fe::cudnn_dlhandle = lib;
  const attn_graph a = {bn, t, s, hd, scale, causal, grad, nullptr, 0};
  try {
    auto g = define(&a, sm);
    auto st = g->validate();
    if (st.is_good()) return NULL;
    why = message(st);
  } catch (std::exception &e) {
    why = e.what();
  }
  return why.c_str();
}

// a's shape as the messages say it.
static void shape_of(char *buf, size_t n, const attn_graph *a) {
  snprintf(buf, n, "%s [%lld, %lld, %lld, %lld]%s", a->grad ? "backward" : "forward",
           (long long)a->bn, (long long)a->t, (long long)a->s, (long long)a->hd,
           a->causal ? " causal" : "");
}

// The cached graph of this attention (built on first sight), or NULL
// when cuDNN does not take it (said once).
static attn_graph *graph_of(kdrt_cuda *d, int grad, int64_t bn, int64_t t, int64_t s, int64_t hd,
                            float scale, int causal) {
  for (auto &a : graphs)
    if (a.bn == bn && a.t == t && a.s == s && a.hd == hd &&
        !memcmp(&a.scale, &scale, sizeof scale) && a.causal == causal && a.grad == grad)
      return a.g ? &a : NULL;
  char shape[160], why[512] = "";
  attn_graph a = {bn, t, s, hd, scale, causal, grad, nullptr, 0};
  shape_of(shape, sizeof shape, &a);
  const char *no = kdrt_cudnn_attn_refuses(d->precision == KDRT_PREC_BF16, bn, t, s, hd);
  if (no) {
    snprintf(why, sizeof why, "%s", no);
  } else if (get_handle(d, why, sizeof why)) {
    std::string msg;
    try {
      a.g = build(&a, &msg);
    } catch (std::exception &e) {
      msg = e.what(), a.g = nullptr;
    }
    if (!a.g) snprintf(why, sizeof why, "%s", msg.c_str());
  }
  if (!a.g) refuse(d, shape, why);
  graphs.push_back(a);
  return a.g ? &graphs.back() : NULL;
}

extern "C" int kdrt_cudnn_attention_run(kdrt_cuda *d, int grad, float *o, float *lse, float *dq,
                                        float *dk, float *dv, const float *dout, const float *q,
                                        const float *k, const float *v, const float *oin,
                                        const float *lsein, int64_t bn, int64_t t, int64_t s,
                                        int64_t hd, float scale, int causal) {
  if (!(d->impl->cudnn & KDRT_CUDNN_ATTN)) return 0;
  attn_graph *a = graph_of(d, grad, bn, t, s, hd, scale, causal);
  if (!a) return 0;
  const size_t nq = (size_t)(bn * t * hd), nk = (size_t)(bn * s * hd);
  // scratch 7: the workspace, then the bf16 tensors (each 256-byte aligned)
  const size_t n[8] = {nq, nk, nk, nq, nq, nq, nk, nk}; // q k v o do dq dk dv
  size_t off[9];
  off[0] = kdrt_round256((size_t)a->ws);
  for (int i = 0; i < 8; i++) off[i + 1] = off[i] + kdrt_round256(n[i] * sizeof(__nv_bfloat16));
  char *sc = (char *)kdrt_cuda_dscratch(d, 7, off[grad ? 8 : 4]);
  __nv_bfloat16 *h[8];
  for (int i = 0; i < 8; i++) h[i] = (__nv_bfloat16 *)(sc + off[i]);
  attn_parts in = {{h[0], h[1], h[2], h[3], h[4]},
                   {(float *)q, (float *)k, (float *)v, (float *)oin, (float *)dout},
                   {nq, nk, nk, nq, nq}, grad ? 5 : 3};
  convert(d, &in, 0);
  std::unordered_map<int64_t, void *> pack = {{UID_Q, h[0]}, {UID_K, h[1]}, {UID_V, h[2]},
                                              {UID_O, h[3]}};
  if (!grad) {
    pack[UID_LSE] = lse;
  } else {
    pack[UID_LSE] = (void *)lsein, pack[UID_DO] = h[4];
    pack[UID_DQ] = h[5], pack[UID_DK] = h[6], pack[UID_DV] = h[7];
  }
  std::string msg;
  try {
    auto st = a->g->execute(handle, pack, a->ws ? sc : nullptr);
    if (st.is_bad()) msg = st.get_message() + std::string(" (execute)");
  } catch (std::exception &e) {
    msg = e.what();
  }
  // A plan that will not run after all: said once, and this shape keeps
  // attn.cu's kernels from here on (they write everything it would have).
  if (!msg.empty()) {
    if (d->impl->capturing) kdrt_cuda_fail("cuDNN's attention", __FILE__, __LINE__, msg.c_str());
    char shape[160];
    shape_of(shape, sizeof shape, a);
    refuse(d, shape, msg.c_str());
    a->g = nullptr;
    (void)cudaGetLastError(); // nothing of it ran
    return 0;
  }
  const attn_parts out = grad ? attn_parts{{h[5], h[6], h[7]}, {dq, dk, dv}, {nq, nk, nk}, 3}
                              : attn_parts{{h[3]}, {o}, {nq}, 1};
  convert(d, &out, 1);
  if (d->impl->sync_each) KDRT_LAUNCHED(d, "cuDNN's attention");
  return 1;
}

#else // built without the cuDNN frontend's headers (`make setup` fetches them)

void kdrt_cudnn_attention_free(void) {}

const char *kdrt_cudnn_attention_validate(int grad, int64_t bn, int64_t t, int64_t s, int64_t hd,
                                          float scale, int causal, int sm) {
  return "built without the cuDNN frontend's headers";
}

extern "C" int kdrt_cudnn_attention_run(kdrt_cuda *d, int grad, float *o, float *lse, float *dq,
                                        float *dk, float *dv, const float *dout, const float *q,
                                        const float *k, const float *v, const float *oin,
                                        const float *lsein, int64_t bn, int64_t t, int64_t s,
                                        int64_t hd, float scale, int causal) {
  static int said;
  if (!(d->impl->cudnn & KDRT_CUDNN_ATTN) || d->precision != KDRT_PREC_BF16) return 0;
  if (!said++)
    refuse(d, "every shape", "this runtime was built without the cuDNN frontend's headers "
           "(build/cudnn-frontend: make setup, then make cuda)");
  return 0;
}
#endif
#endif // __CUDA_ARCH__
