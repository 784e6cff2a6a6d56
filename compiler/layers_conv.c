// Layer builders: convolutions, pooling, padding and cropping, upsampling
// and batch normalization.
//
// Every window op works on channels-last [b, h, w, c]: the 1-D layers are
// views with a unit dim ([b, steps, 1, c]), so that CONV2D, its transpose
// (CONV2D_DX) and MAXPOOL serve both; output extents and padding are Keras's
// (window). Pooling and upsampling that no op does are made of existing
// ones (sums over a view, a BROADCAST); BatchNormalization's training
// statistics are the global batch's, partial sums the lattice all-reduces.
#include "graph_build.h"

#include <string.h>

// ---- convolutions and max pooling

// Output extent and leading padding of a window op along one dim, Keras's way.
static void window(int64_t in, int k, int stride, bool same, int64_t *out, int *pad) {
  if (same) {
    *out = (in + stride - 1) / stride;
    int64_t total = (*out - 1) * stride + k - in;
    *pad = total > 0 ? (int)(total / 2) : 0;
  } else {
    *out = in >= k ? (in - k) / stride + 1 : 0;
    *pad = 0;
  }
}

static bool parse_padding(Layer *l) {
  const char *p = cfg_str(l, "padding", "valid");
  if (!strcmp(p, "same")) return true;
  if (!strcmp(p, "valid")) return false;
  error_at(jloc_key(l->cfg, "padding"), "layer '%s': unknown padding '%s'", l->name, p);
}

void check_channels_last(Layer *l) {
  const char *f = cfg_str(l, "data_format", "channels_last");
  if (strcmp(f, "channels_last"))
    error_at(jloc_key(l->cfg, "data_format"),
             "layer '%s': data_format '%s' is not supported (only channels_last)", l->name, f);
}

// The window w between extents h, wd and its windows oh, ow: its padding
// after (pad_b, pad_r), which the ops' shape rule reads (ops_nn.c).
static WinAttr window_attr(WinAttr w, int64_t h, int64_t wd, int64_t oh, int64_t ow) {
  w.pad_b = (int)((oh - 1) * w.sh + (int64_t)(w.kh - 1) * (w.dil_h + 1) + 1 - h - w.pad_t);
  w.pad_r = (int)((ow - 1) * w.sw + (int64_t)(w.kw - 1) * (w.dil_w + 1) + 1 - wd - w.pad_l);
  return w;
}

// A CONV2D of x4 by f4 with the window win, to [b, oh, ow, f4's filters].
static Node *conv_node(Graph *g, Node *x4, Node *f4, WinAttr win, int64_t oh, int64_t ow) {
  return make2(g, OP_CONV2D, x4, f4,
               .win = window_attr(win, x4->shape.d[1], x4->shape.d[2], oh, ow));
}

typedef enum { CONV, DEPTHWISE, SEPARABLE } ConvKind;

// Conv1D, Conv2D, DepthwiseConv1D/2D and SeparableConv1D/2D: CONV2D on
// channels-last [b, h, w, c] (the 1-D layers: a [b, steps, 1, c] view, a
// [k, cin, cout] kernel viewed as [k, 1, cin, cout]; DepthwiseConv2D: its
// [kh, kw, cin, m] kernel viewed as [kh, kw, 1, cin * m], cin groups;
// SeparableConv2D: that, then a 1x1 CONV2D by its pointwise_kernel [1, 1,
// cin * m, filters]), then the bias and the activation. n: the spatial dims
// (1 or 2).
static Node *build_conv(Graph *g, Layer *l, Node *x, int n, ConvKind kind) {
  bool depthwise = kind != CONV;
  check_channels_last(l);
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d (batch, %s, c), got %s",
             l->name, l->cls, n + 2, n == 1 ? "steps" : "h, w", kshape(&x->shape));
  const int64_t *d = x->shape.d;
  int64_t ci = d[n + 1], mult = depthwise ? cfg_size(l, "depth_multiplier", 1) : 1;
  int64_t filters = depthwise ? size_mul(ci, mult) : cfg_size(l, "filters", -1);
  int64_t out_ch = kind == SEPARABLE ? cfg_size(l, "filters", -1) : filters;
  int64_t ks[2] = {1, 1}, st[2] = {1, 1}, dil[2] = {1, 1};
  if (filters <= 0 || out_ch <= 0)
    error_at(jloc_key(l->cfg, "filters"), "layer '%s': 'filters' must be positive", l->name);
  int64_t groups = depthwise ? ci : cfg_size(l, "groups", 1);
  if (ci % groups || filters % groups)
    error_at(jloc_key(l->cfg, "groups"), "layer '%s': groups=%lld must divide the input channels "
             "(%lld) and filters (%lld)", l->name, (long long)groups, (long long)ci,
             (long long)filters);
  if (cfg_sizes(l, "kernel_size", ks, n) != n)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': bad kernel_size", l->name);
  cfg_sizes(l, "strides", st, n);
  cfg_sizes(l, "dilation_rate", dil, n);
  if ((st[0] > 1 || st[1] > 1) && (dil[0] > 1 || dil[1] > 1)) // as Keras refuses it
    error_at(jloc_key(l->cfg, "dilation_rate"), "layer '%s': %s cannot have both strides and "
             "dilation_rate over 1", l->name, l->cls);
  // a dilated kernel spans (k - 1) * d + 1 steps: its extent for the window's shape
  int64_t ek[2] = {(ks[0] - 1) * dil[0] + 1, (ks[1] - 1) * dil[1] + 1};
  // Conv1D's 'causal': the k - 1 steps of padding all before, then 'valid'
  bool causal = n == 1 && !strcmp(cfg_str(l, "padding", "valid"), "causal");
  bool same = !causal && parse_padding(l);
  int64_t b = d[0], h = d[1], w = n == 2 ? d[2] : 1, cg = ci / groups, oh, ow;
  int pt, pl;
  if (ek[0] > MAX_DIM || ek[1] > MAX_DIM)
    error_at(jloc_key(l->cfg, "dilation_rate"), "layer '%s': the dilated kernel spans more than "
             "%d steps", l->name, MAX_DIM);
  window(h + (causal ? ek[0] - 1 : 0), (int)ek[0], (int)st[0], same, &oh, &pt);
  window(w, (int)ek[1], (int)st[1], same, &ow, &pl);
  if (causal) pt = (int)ek[0] - 1;
  if (oh <= 0 || ow <= 0)
    error_at(l->loc, "layer '%s': kernel %s does not fit the input %s", l->name,
             n == 1 ? format("%lld", (long long)ks[0])
                    : format("%lldx%lld", (long long)ks[0], (long long)ks[1]), kshape(&x->shape));
  if (size_mul(size_mul(ks[0], ks[1]), size_mul(cg, filters)) > MAX_ELEMS)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': a kernel of %lld x %lld x %lld x %lld "
             "would hold more than 2^40 elements, the most a tensor may hold", l->name,
             (long long)ks[0], (long long)ks[1], (long long)cg, (long long)filters);
  // its im2col scratch: a row of kh * kw * ci / groups per output pixel and group
  int64_t scratch = size_mul(size_mul(b, size_mul(oh, ow)), size_mul(size_mul(ks[0], ks[1]), ci));
  if (scratch > MAX_ELEMS)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': its im2col buffer would hold more "
             "than 2^40 elements, the most a tensor may hold", l->name);
  // Keras's kernels: [k.., cin / groups, filters], depthwise [k.., cin, mult]
  Shape fs = {n + 2, {ks[0], ks[1]}};
  fs.d[n] = depthwise ? ci : cg;
  fs.d[n + 1] = depthwise ? mult : filters;
  Node *f = new_var(g, l, kind == SEPARABLE ? "depthwise_kernel" : "kernel", fs,
                    depthwise ? "depthwise_initializer" : "kernel_initializer", "glorot_uniform");
  Node *x4 = n == 2 ? x : view(g, x, (Shape){4, {b, h, 1, ci}});
  Node *f4 = fs.rank == 4 && !depthwise ? f : view(g, f, (Shape){4, {ks[0], ks[1], cg, filters}});
  // one CONV2D for all the groups (issue 15; before, a SLICE, a CONV2D and a
  // CONCAT per group)
  WinAttr win = {.kh = (int)ks[0], .kw = (int)ks[1], .sh = (int)st[0], .sw = (int)st[1],
                 .pad_t = pt, .pad_l = pl, .dil_h = (int)dil[0] - 1, .dil_w = (int)dil[1] - 1,
                 .groups = groups > 1 ? (int)groups : 0};
  Node *y = conv_node(g, x4, f4, win, oh, ow);
  if (kind == SEPARABLE) {
    Node *p = new_var(g, l, "pointwise_kernel", n == 2 ? (Shape){4, {1, 1, filters, out_ch}}
                                                       : (Shape){3, {1, filters, out_ch}},
                      "pointwise_initializer", "glorot_uniform");
    if (n == 1) p = view(g, p, (Shape){4, {1, 1, filters, out_ch}});
    y = conv_node(g, y, p, (WinAttr){.kh = 1, .kw = 1, .sh = 1, .sw = 1}, oh, ow);
  }
  if (scratch > g->scratch_floats) g->scratch_floats = scratch;
  if (n == 1) y = view(g, y, (Shape){3, {b, oh, out_ch}});
  if (cfg_bool(l, "use_bias", true)) {
    Node *bias = new_var(g, l, "bias", (Shape){1, {out_ch}}, "bias_initializer", "zeros");
    y = make2(g, OP_BIAS, y, bias);
  }
  return apply_act(g, y, parse_act(l, "activation"));
}

// Conv1DTranspose and Conv2DTranspose(filters, kernel_size, strides,
// padding): the gradient of a conv with respect to its input (CONV2D_DX),
// that conv mapping the output [b, H, W, filters] back to x [b, h, w, cin]
// by the kernel [kh, kw, filters, cin] as Keras stores it. H = h * s
// ('same'), or (h - 1) * s + max(k, s) ('valid'), Keras's output shape. The
// 1-D layer: x [b, steps, 1, cin] and its [k, filters, cin] kernel viewed
// with a unit dim, as Conv1D. output_padding: Keras's output length ((h -
// 1) * s + k + p, 'same' (h - 1) * s + k % 2 + p) and JAX's left padding
// of the transposed conv, which fixes the forward conv's. n: the spatial dims.
static Node *build_conv_transpose(Graph *g, Layer *l, Node *x, int n) {
  check_channels_last(l);
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d (batch, %s, c), got %s", l->name,
             l->cls, n + 2, n == 1 ? "steps" : "h, w", kshape(&x->shape));
  int64_t filters = cfg_size(l, "filters", -1), ks[2] = {1, 1}, st[2] = {1, 1}, dil[2] = {1, 1};
  if (cfg_sizes(l, "kernel_size", ks, n) != n)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': bad kernel_size", l->name);
  cfg_sizes(l, "strides", st, n);
  // output_padding (issue 11): extra output steps after the last, each under its stride
  json_t *oj = json_object_get(l->cfg, "output_padding");
  bool op_given = oj && !json_is_null(oj);
  int64_t op[2] = {0, 0};
  if (op_given && cfg_ints(l, "output_padding", op, n) != n)
    error_at(jloc(oj), "layer '%s': 'output_padding' must give %d sizes", l->name, n);
  for (int i = 0; i < n; i++)
    if (op[i] < 0 || op[i] >= st[i])
      error_at(jloc(oj), "layer '%s': output_padding %lld must be at least 0 and less than the "
               "stride %lld", l->name, (long long)op[i], (long long)st[i]);
  cfg_sizes(l, "dilation_rate", dil, n);
  if (dil[0] != 1 || dil[1] != 1)
    error_at(jloc_key(l->cfg, "dilation_rate"), "layer '%s': %s dilation_rate other than 1 is "
             "not supported yet", l->name, l->cls);
  if (filters <= 0)
    error_at(jloc_key(l->cfg, "filters"), "layer '%s': 'filters' must be positive", l->name);
  bool same = parse_padding(l);
  const int64_t *d = x->shape.d;
  int64_t in[2] = {d[1], n == 2 ? d[2] : 1}, b = d[0], ci = d[n + 1], out[2], chk[2];
  int pad[2];
  for (int i = 0; i < 2; i++) {
    if (op_given && i < n) { // Keras's output length, and JAX's padding of the transposed conv
      int64_t k = ks[i], len = k + k % 2 - 2 + op[i], left = len / 2 + len % 2;
      out[i] = size_add(size_mul(in[i] - 1, st[i]), same ? k % 2 + op[i] : k + op[i]);
      pad[i] = same ? (int)(k - 1 - (left < k - 1 ? left : k - 1)) : 0;
      if (out[i] <= 0)
        error_at(l->loc, "layer '%s': an output dimension of %lld", l->name, (long long)out[i]);
    } else {
      out[i] = same ? size_mul(in[i], st[i])
                    : size_add(size_mul(in[i] - 1, st[i]), ks[i] > st[i] ? ks[i] : st[i]);
    }
    if (out[i] > MAX_DIM)
      error_at(l->loc, "layer '%s': an output dimension over %d", l->name, MAX_DIM);
    if (op_given && i < n) continue;
    window(out[i], (int)ks[i], (int)st[i], same, &chk[i], &pad[i]);
    if (chk[i] != in[i]) unreachable();
  }
  if (size_mul(size_mul(ks[0], ks[1]), size_mul(filters, ci)) > MAX_ELEMS ||
      size_mul(size_mul(b, size_mul(in[0], in[1])), size_mul(size_mul(ks[0], ks[1]), filters)) >
          MAX_ELEMS)
    error_at(jloc_key(l->cfg, "kernel_size"), "layer '%s': its kernel or im2col buffer would "
             "hold more than 2^40 elements, the most a tensor may hold", l->name);
  Shape fs = {n + 2, {ks[0], ks[1]}};
  fs.d[n] = filters, fs.d[n + 1] = ci;
  Node *f = new_var(g, l, "kernel", fs, "kernel_initializer", "glorot_uniform");
  Node *x4 = n == 2 ? x : view(g, x, (Shape){4, {b, in[0], 1, ci}});
  Node *f4 = n == 2 ? f : view(g, f, (Shape){4, {ks[0], 1, filters, ci}});
  WinAttr win = {.kh = (int)ks[0], .kw = (int)ks[1], .sh = (int)st[0], .sw = (int)st[1],
                 .pad_t = pad[0], .pad_l = pad[1]};
  Node *y = make2(g, OP_CONV2D_DX, x4, f4, .win = window_attr(win, out[0], out[1], in[0], in[1]));
  if (n == 1) y = view(g, y, (Shape){3, {b, out[0], filters}});
  if (cfg_bool(l, "use_bias", true)) {
    Node *bias = new_var(g, l, "bias", (Shape){1, {filters}}, "bias_initializer", "zeros");
    y = make2(g, OP_BIAS, y, bias);
  }
  return apply_act(g, y, parse_act(l, "activation"));
}

Node *build_conv1d_transpose(Graph *g, Layer *l, Node *x) {
  return build_conv_transpose(g, l, x, 1);
}
Node *build_conv2d_transpose(Graph *g, Layer *l, Node *x) {
  return build_conv_transpose(g, l, x, 2);
}
Node *build_conv1d(Graph *g, Layer *l, Node *x) { return build_conv(g, l, x, 1, CONV); }
Node *build_conv2d(Graph *g, Layer *l, Node *x) { return build_conv(g, l, x, 2, CONV); }
Node *build_depthwise(Graph *g, Layer *l, Node *x) {
  return build_conv(g, l, x, 2, DEPTHWISE);
}
Node *build_separable(Graph *g, Layer *l, Node *x) {
  return build_conv(g, l, x, 2, SEPARABLE);
}
Node *build_depthwise1d(Graph *g, Layer *l, Node *x) {
  return build_conv(g, l, x, 1, DEPTHWISE);
}
Node *build_separable1d(Graph *g, Layer *l, Node *x) {
  return build_conv(g, l, x, 1, SEPARABLE);
}

// A MAXPOOL of x4, windows ph x pw by strides sh, sw, padded pt, pl before,
// to [b, oh, ow, c].
static Node *maxpool_node(Graph *g, Node *x4, int64_t ph, int64_t pw, int64_t sh, int64_t sw,
                          int pt, int pl, int64_t oh, int64_t ow) {
  WinAttr win = {.kh = (int)ph, .kw = (int)pw, .sh = (int)sh, .sw = (int)sw, .pad_t = pt,
                 .pad_l = pl};
  return make1(g, OP_MAXPOOL, x4,
               .win = window_attr(win, x4->shape.d[1], x4->shape.d[2], oh, ow));
}

Node *build_maxpool(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (x->shape.rank != 4)
    error_at(l->loc, "layer '%s': MaxPooling2D needs an input of rank 4, got %s", l->name,
             kshape(&x->shape));
  int64_t ps[2] = {2, 2}, st[2];
  cfg_sizes(l, "pool_size", ps, 2);
  st[0] = ps[0], st[1] = ps[1];
  cfg_sizes(l, "strides", st, 2);
  bool same = parse_padding(l);
  int64_t oh, ow;
  int pt, pl;
  window(x->shape.d[1], ps[0], st[0], same, &oh, &pt);
  window(x->shape.d[2], ps[1], st[1], same, &ow, &pl);
  if (oh <= 0 || ow <= 0)
    error_at(l->loc, "layer '%s': pool %lldx%lld does not fit the input %s", l->name,
             (long long)ps[0], (long long)ps[1], kshape(&x->shape));
  return maxpool_node(g, x, ps[0], ps[1], st[0], st[1], pt, pl, oh, ow);
}

// ---- issue 11: global pooling, padding and cropping

// GlobalAveragePooling1D: x[b, t, c] -> the mean over t.
Node *build_gap1d(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (cfg_bool(l, "keepdims", false))
    error_at(jloc_key(l->cfg, "keepdims"), "layer '%s': keepdims is not supported", l->name);
  if (x->shape.rank != 3)
    error_at(l->loc, "layer '%s': GlobalAveragePooling1D needs an input of rank 3 (batch, steps, "
             "features), got %s", l->name, kshape(&x->shape));
  Node *s = make1(g, OP_REDUCE_SUM, x, .red.dim = 1);
  return make1(g, OP_SCALE, s, .aff = (AffAttr){(float)(1.0 / (double)x->shape.d[1]), 0, NULL});
}

// GlobalAveragePooling2D: x[b, h, w, c] -> the mean over h and w.
Node *build_gap2d(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (cfg_bool(l, "keepdims", false))
    error_at(jloc_key(l->cfg, "keepdims"), "layer '%s': keepdims is not supported", l->name);
  if (x->shape.rank != 4)
    error_at(l->loc, "layer '%s': GlobalAveragePooling2D needs an input of rank 4 (batch, rows, "
             "cols, channels), got %s", l->name, kshape(&x->shape));
  const int64_t *d = x->shape.d;
  Node *t = make1(g, OP_REDUCE_SUM, make1(g, OP_REDUCE_SUM, x, .red.dim = 1), .red.dim = 1);
  return make1(g, OP_SCALE, t, .aff = (AffAttr){(float)(1.0 / (double)(d[1] * d[2])), 0, NULL});
}

// Amounts before and after along n spatial dims: Keras stores [a, b] for 1-D
// and [[t, b], [l, r]] for 2-D (an int for a 1-D symmetric amount).
static void cfg_amounts(Layer *l, const char *key, int n, int64_t out[][2]) {
  json_t *j = json_object_get(l->cfg, key);
  if (!j) error_at(l->loc, "layer '%s': '%s' is missing", l->name, key);
  for (int i = 0; i < n; i++) {
    json_t *e = n == 1 ? j : json_array_get(j, (size_t)i);
    if (e && json_is_integer(e)) {
      out[i][0] = out[i][1] = json_integer_value(e);
    } else if (e && json_is_array(e) && json_array_size(e) == 2 &&
               json_is_integer(json_array_get(e, 0)) && json_is_integer(json_array_get(e, 1))) {
      out[i][0] = json_integer_value(json_array_get(e, 0));
      out[i][1] = json_integer_value(json_array_get(e, 1));
    } else {
      error_at(jloc(e ? e : j), "layer '%s': bad '%s'", l->name, key);
    }
    if (out[i][0] < 0 || out[i][1] < 0)
      error_at(jloc(e), "layer '%s': '%s' must not be negative", l->name, key);
    if (out[i][0] > MAX_DIM || out[i][1] > MAX_DIM)
      error_at(jloc(e), "layer '%s': '%s' is over %d", l->name, key, MAX_DIM);
  }
}

// ZeroPadding1D/2D (pad) and Cropping1D/2D: one PAD or SLICE per side pair
// along each spatial dim (dims 1..n of [b, ..., c]).
static Node *pad_or_crop(Graph *g, Layer *l, Node *x, int n, bool pad) {
  if (n == 2) check_channels_last(l);
  const char *key = pad ? "padding" : "cropping";
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d, got %s", l->name, l->cls, n + 2,
             kshape(&x->shape));
  int64_t a[2][2];
  cfg_amounts(l, key, n, a);
  for (int i = 0; i < n; i++) {
    if (!a[i][0] && !a[i][1]) continue;
    Shape s = x->shape;
    int ax = i + 1;
    s.d[ax] += pad ? a[i][0] + a[i][1] : -(a[i][0] + a[i][1]);
    if (s.d[ax] > MAX_DIM)
      error_at(jloc_key(l->cfg, key), "layer '%s': padding makes dim %d %lld, over %d", l->name,
               ax, (long long)s.d[ax], MAX_DIM);
    if (s.d[ax] <= 0)
      error_at(jloc_key(l->cfg, key), "layer '%s': cropping %lld+%lld leaves nothing of dim %d "
               "(%lld)", l->name, (long long)a[i][0], (long long)a[i][1], ax,
               (long long)x->shape.d[ax]);
    x = make1(g, pad ? OP_PAD : OP_SLICE, x, .cat = {ax, a[i][0], s.d[ax]});
  }
  return x;
}

Node *build_zeropad1d(Graph *g, Layer *l, Node *x) { return pad_or_crop(g, l, x, 1, true); }
Node *build_zeropad2d(Graph *g, Layer *l, Node *x) { return pad_or_crop(g, l, x, 2, true); }
Node *build_crop1d(Graph *g, Layer *l, Node *x) { return pad_or_crop(g, l, x, 1, false); }
Node *build_crop2d(Graph *g, Layer *l, Node *x) { return pad_or_crop(g, l, x, 2, false); }

// ---- issue 11: more pooling and upsampling, from existing ops

// GlobalMaxPooling1D/2D: one MAXPOOL window over every step (the gradient
// goes to the first maximum of each channel).
Node *build_global_maxpool(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (cfg_bool(l, "keepdims", false))
    error_at(jloc_key(l->cfg, "keepdims"), "layer '%s': keepdims is not supported", l->name);
  int n = strstr(l->cls, "1D") ? 1 : 2;
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d, got %s", l->name, l->cls, n + 2,
             kshape(&x->shape));
  const int64_t *d = x->shape.d;
  int64_t b = d[0], h = d[1], w = n == 2 ? d[2] : 1, c = d[n + 1];
  Node *x4 = n == 2 ? x : view(g, x, (Shape){4, {b, h, 1, c}});
  Node *y = maxpool_node(g, x4, h, w, h, w, 0, 0, 1, 1);
  return view(g, y, (Shape){2, {b, c}});
}

// MaxPooling1D: MAXPOOL on a [b, steps, 1, c] view.
Node *build_maxpool1d(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  if (x->shape.rank != 3)
    error_at(l->loc, "layer '%s': MaxPooling1D needs an input of rank 3, got %s", l->name,
             kshape(&x->shape));
  int64_t ps = 2, st;
  cfg_sizes(l, "pool_size", &ps, 1);
  st = ps;
  cfg_sizes(l, "strides", &st, 1);
  bool same = parse_padding(l);
  int64_t ot;
  int pt;
  window(x->shape.d[1], (int)ps, (int)st, same, &ot, &pt);
  if (ot <= 0)
    error_at(l->loc, "layer '%s': pool %lld does not fit the input %s", l->name, (long long)ps,
             kshape(&x->shape));
  const int64_t *d = x->shape.d;
  Node *y = maxpool_node(g, view(g, x, (Shape){4, {d[0], d[1], 1, d[2]}}), ps, 1, st, 1, pt, 0,
                         ot, 1);
  return view(g, y, (Shape){3, {d[0], ot, d[2]}});
}

// AveragePooling1D/2D, padding 'valid' with strides equal to the pool:
// the steps that fit, viewed as [b, o, p, ..., c] and summed over p.
Node *build_avgpool(Graph *g, Layer *l, Node *x) {
  check_channels_last(l);
  int n = strstr(l->cls, "1D") ? 1 : 2;
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d, got %s", l->name, l->cls, n + 2,
             kshape(&x->shape));
  int64_t ps[2] = {2, 2}, st[2];
  if (cfg_sizes(l, "pool_size", ps, n) == 1 && n == 2) ps[1] = ps[0];
  st[0] = ps[0], st[1] = ps[1];
  json_t *sj = json_object_get(l->cfg, "strides");
  if (sj && !json_is_null(sj) && cfg_sizes(l, "strides", st, n) == 1 && n == 2) st[1] = st[0];
  if (parse_padding(l))
    error_at(jloc_key(l->cfg, "padding"), "layer '%s': %s padding 'same' is not supported (only "
             "'valid')", l->name, l->cls);
  for (int i = 0; i < n; i++)
    if (st[i] != ps[i])
      error_at(jloc_key(l->cfg, "strides"), "layer '%s': %s strides other than pool_size are not "
               "supported", l->name, l->cls);
  for (int i = 0; i < n; i++) {
    int64_t o = x->shape.d[i + 1] / ps[i];
    if (o <= 0)
      error_at(l->loc, "layer '%s': pool %lld does not fit the input %s", l->name,
               (long long)ps[i], kshape(&x->shape));
    if (o * ps[i] != x->shape.d[i + 1]) { // Keras drops the steps that do not fill a window
      x = make1(g, OP_SLICE, x, .cat = {i + 1, 0, o * ps[i]});
    }
  }
  const int64_t *d = x->shape.d;
  int64_t b = d[0], c = d[n + 1];
  int64_t o0 = d[1] / ps[0], o1 = n == 2 ? d[2] / ps[1] : 1;
  Node *v = n == 2 ? view(g, x, (Shape){6, {b, o0, ps[0], o1, ps[1], c}})
                   : view(g, x, (Shape){4, {b, o0, ps[0], c}});
  Node *r = make1(g, OP_REDUCE_SUM, v, .red.dim = 2);
  if (n == 2) r = make1(g, OP_REDUCE_SUM, r, .red.dim = 3);
  return make1(g, OP_SCALE, r,
               .aff = (AffAttr){(float)(1.0 / (double)(ps[0] * (n == 2 ? ps[1] : 1))), 0, NULL});
}

// UpSampling1D/2D (nearest): each step repeated, a BROADCAST and a view.
Node *build_upsample(Graph *g, Layer *l, Node *x) {
  int n = strstr(l->cls, "1D") ? 1 : 2;
  if (n == 2) {
    check_channels_last(l);
    const char *ip = cfg_str(l, "interpolation", "nearest");
    if (strcmp(ip, "nearest"))
      error_at(jloc_key(l->cfg, "interpolation"), "layer '%s': UpSampling2D interpolation '%s' "
               "is not supported (only 'nearest')", l->name, ip);
  }
  if (x->shape.rank != n + 2)
    error_at(l->loc, "layer '%s': %s needs an input of rank %d, got %s", l->name, l->cls, n + 2,
             kshape(&x->shape));
  int64_t sz[2] = {2, 2};
  if (cfg_sizes(l, "size", sz, n) == 1 && n == 2) sz[1] = sz[0];
  for (int i = 0; i < n; i++)
    if (x->shape.d[i + 1] > MAX_DIM / sz[i])
      error_at(jloc_key(l->cfg, "size"), "layer '%s': %s by %lld makes dim %d over %d", l->name,
               l->cls, (long long)sz[i], i + 1, MAX_DIM);
  const int64_t *d = x->shape.d;
  if (n == 1) {
    Node *b = make1(g, OP_BROADCAST, x, .red = {2, sz[0]});
    return view(g, b, (Shape){3, {d[0], d[1] * sz[0], d[2]}});
  }
  Node *b = make1(g, OP_BROADCAST, x, .red = {2, sz[0]});
  Node *b2 = make1(g, OP_BROADCAST, b, .red = {4, sz[1]});
  return view(g, b2, (Shape){4, {d[0], d[1] * sz[0], d[2] * sz[1], d[3]}});
}

// ---- issue 11: BatchNormalization
// Over the last axis, Keras's formula: training uses the statistics of the
// global batch (sums over every dim but the last, BN_STATS: a split batch
// leaves partial sums that the lattice all-reduces, synchronized batch
// norm), evaluate and predict the moving ones (TRAIN_SELECT); then y = x *
// inv + (beta - mean * inv), inv = rsqrt(var + epsilon) * gamma, one
// BATCH_NORM (issue 15; its gradient is batch norm's whole). The moving
// statistics are variables whose update is the moving average of the
// batch's.
static Node *fill_channels(Graph *g, Shape cs, float v) {
  Node *f = new_node(g, OP_FILL, 0, NULL);
  f->shape = cs;
  f->aff = (AffAttr){0, v, NULL};
  return f;
}

// A frozen BatchNormalization (trainable false) normalises with its moving
// statistics in training too and leaves them be (Keras: `if training and
// self.trainable`). Its mean and variance are constants then, so its
// gradient in x is dy * inv, not BATCH_NORM's (which differentiates through
// batch statistics): it is built from COL_MUL and BIAS, with per channel
// Keras's inv = rsqrt(var + eps) * gamma and res = -mean * inv + beta.
static Node *frozen_batchnorm(Graph *g, Node *x, Node *mm, Node *mv, Node *gam, Node *beta,
                              double eps) {
  Node *ve = make1(g, OP_SCALE, mv, .aff = (AffAttr){1, (float)eps, "epsilon"});
  Node *inv = apply_act(g, ve, KDRT_ACT_RSQRT);
  if (gam) inv = make2(g, OP_MUL, inv, gam);
  Node *res = make2(g, OP_MUL, scaled(g, mm, -1), inv);
  if (beta) res = make2(g, OP_ADD, res, beta);
  return make2(g, OP_BIAS, make2(g, OP_COL_MUL, x, inv), res);
}

// issue 23: how many layers read layer l's output (*one: the last of them),
// and *out the model output it is: its index, -1 none, -2 several
int layer_readers(const Model *m, const Layer *l, Layer **one, int *out) {
  int n = 0;
  for (int i = 0; i < m->nlayers; i++)
    for (int k = 0; k < m->layers[i]->nin; k++)
      if (m->layers[i]->in[k].layer == l) {
        n++;
        if (one) *one = m->layers[i];
      }
  *out = -1;
  for (int i = 0; i < m->noutputs; i++)
    if (m->outputs[i].layer == l) *out = *out == -1 ? i : -2;
  return n;
}

// Issue 23: under bfloat16 (mixed or pure) XLA's CPU program, Keras's,
// normalizes a convolution's float32 result as it is: the bfloat16
// convolution is computed in float32 and its cast to bfloat16 then back to
// float32 (BatchNormalization's upcast) cancels (allow_excess_precision),
// while the backward pass still rounds batch norm's gradient in x (the
// casts' transposes). Read in Keras 3.15's optimized HLO of the batch-norm
// CNN; under float16 the casts stay. So a convolution of such a policy
// whose one reader is a trained BatchNormalization leaves its output
// unrounded (layers.c's build_layer), and the batch norm takes it so.
bool bn_reads_f32(Graph *g, Layer *l, const Node *y) {
  if (l->cdt != KDRT_ROUND_BF16 || y->op != OP_CONV2D || !y->pend) return false;
  Layer *reader = NULL;
  int out;
  if (layer_readers(g->model, l, &reader, &out) != 1 || out != -1) return false;
  return !strcmp(reader->cls, "BatchNormalization") && reader->cdt == l->cdt &&
         !layer_frozen(reader);
}

Node *build_batchnorm(Graph *g, Layer *l, Node *x) {
  check_last_axis(l, x);
  static const char *const no[] = {"renorm"};
  check_none(l, no, 1);
  if (x->shape.rank < 2)
    error_at(l->loc, "layer '%s': BatchNormalization needs an input of rank 2 or more, got %s",
             l->name, kshape(&x->shape));
  if (l->shared)
    error_at(l->loc, "layer '%s': a BatchNormalization layer called more than once is not "
             "supported (call %d)", l->name, l->call);
  int r = x->shape.rank;
  int64_t c = x->shape.d[r - 1], rows = shape_elems(&x->shape) / c;
  int64_t per = rows / x->shape.d[0]; // elements of a channel per sample
  double eps = cfg_num(l, "epsilon", 1e-3), mom = cfg_num(l, "momentum", 0.99);
  Shape cs = {1, {c}};
  Node *gam = cfg_bool(l, "scale", true) ? new_var(g, l, "gamma", cs, "gamma_initializer", "ones")
                                         : NULL;
  Node *beta = cfg_bool(l, "center", true)
                   ? new_var(g, l, "beta", cs, "beta_initializer", "zeros") : NULL;
  Node *mm = new_var(g, l, "moving_mean", cs, "moving_mean_initializer", "zeros");
  Node *mv = new_var(g, l, "moving_variance", cs, "moving_variance_initializer", "ones");
  if (layer_frozen(l)) return frozen_batchnorm(g, x, mm, mv, gam, beta, eps);
  int rnd = x->pend, cdt = g->cdt; // bn_reads_f32's convolution: x as it is
  if (rnd) g->cdt = 0;
  Node *mean = make1(g, OP_BATCH_MEAN, make1(g, OP_BN_STATS, x),
                     .aff = (AffAttr){(float)per, 0, NULL});
  Node *var = make1(g, OP_BATCH_MEAN, make2(g, OP_BN_STATS, x, mean),
                    .aff = (AffAttr){(float)per, 0, NULL});
  mm->var->ema_stat = mean, mm->var->ema_momentum = (float)mom;
  mv->var->ema_stat = var, mv->var->ema_momentum = (float)mom;
  Node *in[5] = {x, make2(g, OP_TRAIN_SELECT, mean, mm),
                 make2(g, OP_TRAIN_SELECT, var, mv),
                 gam ? gam : fill_channels(g, cs, 1), beta ? beta : fill_channels(g, cs, 0)};
  Node *y = op_make(g, OP_BATCH_NORM, 5, in,
                    &(Node){.bn = {(float)eps, ACT_LINEAR, (double)per, rnd}});
  g->cdt = cdt;
  return y;
}
