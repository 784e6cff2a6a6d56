// Graph building's own header: what the builder files share and no other
// pass needs, in sections by the file that defines it. The files call
// down this list and never up it: vars.c at the bottom, then the layer
// families (layers_attn.c, layers_conv.c, layers_rnn.c), then layers.c
// with the table of layers, then loss.c with build_graph.
#ifndef GRAPH_BUILD_H
#define GRAPH_BUILD_H

#include "kdcc.h"

// ---------------------------------------------------------------- vars.c
// Variable `vname` of layer l (a PARAM node, made once per path: a second
// call of the layer shares it), its initializer from option init_key
// (init_def when absent), its regularizer and constraint beside it.
Node *new_var(Graph *g, Layer *l, const char *vname, Shape shape, const char *init_key,
              const char *init_def);
bool layer_frozen(Layer *l);   // trainable: false (its variables are not trained)
// Keras's enable_lora on kernel w of layer l (variables "<prefix>lora_kernel_a"
// [w's dims but the last, rank] and "<prefix>lora_kernel_b" [rank, w's last]):
// w frozen, the node w + alpha / rank * a . b used in its place.
// index: where keras-hub's save_lora_weights files the pair (lora/<index>).
Node *lora_kernel(Graph *g, Layer *l, Node *w, const char *prefix, int64_t rank, double alpha,
                  int index);
// The LoRA rank a layer's config asks for (hub.c's kdcc_lora) on its
// projection `name` (NULL: the layer's own kernel), or 0; *alpha its alpha,
// *index its number in keras-hub's .lora.h5.
int64_t lora_rank_of(Layer *l, const char *name, double *alpha, int *index);
// Where Keras's weights file keeps variable "<sub>/<name>" of a class, or NULL.
const char *weights_sublayer(const char *cls, const char *vname);
// l1 * sum(|x|) + l2 * sum(x * x) in graph ops, in the 16-bit type kind where it is
// nonzero (KDRT_ROUND_*), or NULL; g->penalty += p.
Node *penalty(Graph *g, Node *x, double l1, double l2, int kind);
void add_penalty(Graph *g, Node *p);
// The penalty of y over the step's global batch, added to g->penalty; and
// a layer's activity_regularizer's on its output y.
void batch_penalty(Graph *g, Node *y, double l1, double l2, int kind);
void activity_penalty(Graph *g, Layer *l, Node *y);
// What every builder reads of its layer.
int parse_act(Layer *l, const char *key);            // option `key` as an activation
Node *apply_act(Graph *g, Node *x, int act);          // x, or act(x)
Node *layer_input(Layer *l, int i);                   // the node of the call's input i
void check_last_axis(Layer *l, const Node *x);        // "axis": the last only
void check_none(Layer *l, const char *const *keys, int n); // options that must be unset
// a . b as a DOT: nb batch dims, nk contracted, b's free dims first when tb.
Node *dot_node(Graph *g, Node *a, Node *b, int nb, int nk, bool tb);

// ---------------------------------------------------------------- layers_attn.c
bool call_flag(Layer *l, const char *key);            // a boolean call keyword
void check_kwargs(Layer *l, const char *const *known, int n); // only these call keywords
Node *build_mha(Graph *g, Layer *l, Node *unused);
Node *build_gqa(Graph *g, Layer *l, Node *unused);
Node *build_attention_core(Graph *g, Layer *l, Node *unused);
Node *build_einsum_dense(Graph *g, Layer *l, Node *x);
float round_scalar(int kind, double v); // issue 23: v cast to the 16-bit type kind
// issue 24: rotary position embedding of x[b, t, .., 2h] (the sequence dim
// 1, the features last), as keras-hub's RotaryEmbedding (or, by p->kind,
// LlamaRotaryEmbedding) turns it, step 0 at position `offset` (a cache's
// start; 0 for training); its errors at l (NULL: x's layer). rope_params:
// RotaryEmbedding's defaults ("linear") with these two set.
RopeParams rope_params(double max_wavelength, double scaling_factor);
Node *rope_node(Graph *g, Layer *l, Node *x, const RopeParams *p, int64_t offset);
Node *build_rotary_embedding(Graph *g, Layer *l, Node *x);

// ---------------------------------------------------------------- layers_conv.c
void check_channels_last(Layer *l);                   // data_format: channels_last only
Node *build_conv1d(Graph *g, Layer *l, Node *x);
Node *build_conv2d(Graph *g, Layer *l, Node *x);
Node *build_depthwise(Graph *g, Layer *l, Node *x);
Node *build_separable(Graph *g, Layer *l, Node *x);
Node *build_depthwise1d(Graph *g, Layer *l, Node *x);
Node *build_separable1d(Graph *g, Layer *l, Node *x);
Node *build_conv1d_transpose(Graph *g, Layer *l, Node *x);
Node *build_conv2d_transpose(Graph *g, Layer *l, Node *x);
Node *build_maxpool(Graph *g, Layer *l, Node *x);
Node *build_maxpool1d(Graph *g, Layer *l, Node *x);
Node *build_global_maxpool(Graph *g, Layer *l, Node *x);
Node *build_avgpool(Graph *g, Layer *l, Node *x);
Node *build_gap1d(Graph *g, Layer *l, Node *x);
Node *build_gap2d(Graph *g, Layer *l, Node *x);
Node *build_zeropad1d(Graph *g, Layer *l, Node *x);
Node *build_zeropad2d(Graph *g, Layer *l, Node *x);
Node *build_crop1d(Graph *g, Layer *l, Node *x);
Node *build_crop2d(Graph *g, Layer *l, Node *x);
Node *build_upsample(Graph *g, Layer *l, Node *x);
Node *build_batchnorm(Graph *g, Layer *l, Node *x);
// issue 23: y, layer l's result, is a bfloat16 convolution's that its one
// reader, a BatchNormalization, takes in float32 (XLA's), unrounded
bool bn_reads_f32(Graph *g, Layer *l, const Node *y);
int layer_readers(const Model *m, const Layer *l, Layer **one, int *out);

// ---------------------------------------------------------------- layers_rnn.c
Node *build_rnn(Graph *g, Layer *l, Node *x);
Node *build_bidirectional(Graph *g, Layer *l, Node *x);

// ---------------------------------------------------------------- layers.c
// Layer l's ops by its class's builder, on its inputs' nodes; its output.
Node *build_layer(Graph *g, Layer *l);

#endif
