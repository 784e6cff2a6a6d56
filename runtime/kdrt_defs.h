// kdrt_defs.h: the enums that the compiler (kdcc), the CPU runtime and the
// CUDA runtime share, each written once as an X-macro list. kdcc includes
// this file too, so the compiler's numbers and the runtime's agree by
// construction, not by a comment. Plain C99, no dependencies: it is also
// compiled as CUDA C++.
#ifndef KDRT_DEFS_H
#define KDRT_DEFS_H

// ---- activations
// X(NAME, "keras name", f(v), f'(v, y)): y = f(v) elementwise, and the
// derivative given the input v and the output y. This list is the only
// place an activation's formula is written: the CPU kernels, the CUDA
// kernels, the fused bias+activation loop and kdcc's name table all expand
// it. FROM_X: whether the derivative needs the input (else the output
// alone, so the input can be dropped after the forward pass).
// relu is written `v < 0 ? 0 : v` so that NaN stays NaN.
#define KDRT_SQRT1_2 0.70710678118654752f
#define KDRT_INV_SQRT_2PI 0.3989422804014327f
#define KDRT_SQRT_2_OVER_PI 0.7978845608028654f
// Stable for large |v|: exp never overflows.
#define KDRT_SIGMOID(v) ((v) >= 0.0f ? 1.0f / (1.0f + expf(-(v))) : expf(v) * (1.0f / (1.0f + expf(v))))
#define KDRT_ACT_LIST(X)                                                                      \
  X(LINEAR, "linear", 0, (v), 1.0f)                                                            \
  X(RELU, "relu", 0, ((v) < 0.0f ? 0.0f : (v)), ((y) > 0.0f ? 1.0f : 0.0f))                    \
  X(SIGMOID, "sigmoid", 0, KDRT_SIGMOID(v), ((y) * (1.0f - (y))))                              \
  X(TANH, "tanh", 0, tanhf(v), (1.0f - (y) * (y)))                                             \
  X(GELU, "gelu", 1, (0.5f * (v) * (1.0f + erff((v) * KDRT_SQRT1_2))),                        \
    (0.5f * (1.0f + erff((v) * KDRT_SQRT1_2)) + (v) * (KDRT_INV_SQRT_2PI * expf(-0.5f * (v) * (v))))) \
  X(SILU, "silu", 1, ((v) * KDRT_SIGMOID(v)),                                                  \
    (KDRT_SIGMOID(v) * (1.0f + (v) * (1.0f - KDRT_SIGMOID(v)))))

enum {
#define KDRT_X(name, kname, from_x, f, df) KDRT_ACT_##name,
  KDRT_ACT_LIST(KDRT_X)
#undef KDRT_X
  KDRT_ACT_COUNT
};

// ---- losses (Keras's names: mean_squared_error, ...)
#define KDRT_LOSS_LIST(X)                                                                     \
  X(MSE, "mean_squared_error")                                                                 \
  X(MAE, "mean_absolute_error")                                                                \
  X(CCE, "categorical_crossentropy")                                                           \
  X(SCCE, "sparse_categorical_crossentropy")                                                   \
  X(BCE, "binary_crossentropy")
enum {
#define KDRT_X(name, kname) KDRT_LOSS_##name,
  KDRT_LOSS_LIST(KDRT_X)
#undef KDRT_X
  KDRT_LOSS_COUNT
};

// ---- initializers
#define KDRT_INIT_LIST(X)                                                                     \
  X(ZEROS, "zeros") X(ONES, "ones") X(CONSTANT, "constant")                                    \
  X(GLOROT_UNIFORM, "glorot_uniform") X(GLOROT_NORMAL, "glorot_normal")                        \
  X(HE_UNIFORM, "he_uniform") X(HE_NORMAL, "he_normal")                                        \
  X(LECUN_UNIFORM, "lecun_uniform") X(LECUN_NORMAL, "lecun_normal")                            \
  X(RANDOM_NORMAL, "random_normal") X(RANDOM_UNIFORM, "random_uniform")                        \
  X(TRUNCATED_NORMAL, "truncated_normal")
typedef enum {
#define KDRT_X(name, kname) KDRT_INIT_##name,
  KDRT_INIT_LIST(KDRT_X)
#undef KDRT_X
  KDRT_INIT_COUNT
} kdrt_init_kind;

// ---- what a label file becomes for the loss (synthetic data, conversions)
enum { KDRT_LABEL_DENSE, KDRT_LABEL_ONEHOT, KDRT_LABEL_CLASSID, KDRT_LABEL_BINARY };

// ---- element types of a program's inputs and labels
enum { KDRT_F32, KDRT_I32 };

// ---- matrix operands: as stored, or transposed
enum { KDRT_NOTRANS, KDRT_TRANS };

#endif
