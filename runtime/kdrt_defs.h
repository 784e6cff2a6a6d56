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
// The transcendental functions the formulas call: libm's here, for CUDA
// and the tests; the CPU runtime's kernels (runtime/vmath.h) redefine them
// as vectorised ones.
#define KDRT_EXPF expf
#define KDRT_EXPM1F expm1f
#define KDRT_LOG1PF log1pf
#define KDRT_ERFF erff
#define KDRT_TANHF tanhf
#define KDRT_COSHF coshf
// Stable for large |v|: exp never overflows. 1 / (1 + exp(-v)) for v >= 0,
// else exp(v) / (1 + exp(v)) (as exp(v) * (1 / (1 + exp(v)))), written with
// one exp(-|v|) and a select of plain values, so that a loop of it vectorises.
#define KDRT_SIGMOID(v)                                                                       \
  ((1.0f / (1.0f + KDRT_EXPF(-fabsf(v)))) * ((v) >= 0.0f ? 1.0f : KDRT_EXPF(-fabsf(v))))
// issue 11: selu's constants (JAX's), softplus as logaddexp(v, 0), relu6
// written so that NaN stays NaN; leaky_relu is Keras's default slope 0.2.
#define KDRT_SELU_ALPHA 1.6732632423543772848170429916717f
#define KDRT_SELU_SCALE 1.0507009873554804934193349852946f
#define KDRT_SOFTPLUS(v) (fmaxf((v), 0.0f) + KDRT_LOG1PF(KDRT_EXPF(-fabsf(v))))
#define KDRT_RELU6(v) ((v) < 0.0f ? 0.0f : ((v) > 6.0f ? 6.0f : (v)))
// issue 10: gelu's tanh form: 0.5 v (1 + tanh(u)), u = sqrt(2/pi) (v + 0.044715 v^3);
// tanh' as 1 / cosh^2, which keeps its digits where tanh rounds to 1.
#define KDRT_GELU_U(v) (KDRT_SQRT_2_OVER_PI * ((v) + 0.044715f * (v) * (v) * (v)))
#define KDRT_GELU_T(v) KDRT_TANHF(KDRT_GELU_U(v))
#define KDRT_SECH2(u) (1.0f / (KDRT_COSHF(u) * KDRT_COSHF(u)))
#define KDRT_ACT_LIST(X)                                                                      \
  X(LINEAR, "linear", 0, (v), 1.0f)                                                            \
  X(RELU, "relu", 0, ((v) < 0.0f ? 0.0f : (v)), ((y) > 0.0f ? 1.0f : 0.0f))                    \
  X(SIGMOID, "sigmoid", 0, KDRT_SIGMOID(v), ((y) * (1.0f - (y))))                              \
  X(TANH, "tanh", 0, KDRT_TANHF(v), (1.0f - (y) * (y)))                                        \
  X(GELU, "gelu", 1, (0.5f * (v) * (1.0f + KDRT_ERFF((v) * KDRT_SQRT1_2))),                    \
    (0.5f * (1.0f + KDRT_ERFF((v) * KDRT_SQRT1_2)) +                                           \
     (v) * (KDRT_INV_SQRT_2PI * KDRT_EXPF(-0.5f * (v) * (v)))))                                \
  X(SILU, "silu", 1, ((v) * KDRT_SIGMOID(v)),                                                  \
    (KDRT_SIGMOID(v) * (1.0f + (v) * (1.0f - KDRT_SIGMOID(v)))))                              \
  /* issue 11: the rest of Keras 3's elementwise activations (JAX's formulas) */                \
  X(ELU, "elu", 1, ((v) > 0.0f ? (v) : KDRT_EXPM1F(v)),                                        \
    ((v) > 0.0f ? 1.0f : KDRT_EXPF(v)))                                                        \
  X(SELU, "selu", 1,                                                                           \
    (KDRT_SELU_SCALE * ((v) > 0.0f ? (v) : KDRT_SELU_ALPHA * KDRT_EXPM1F(v))),                 \
    ((v) > 0.0f ? KDRT_SELU_SCALE : KDRT_SELU_SCALE * KDRT_SELU_ALPHA * KDRT_EXPF(v)))         \
  X(SOFTPLUS, "softplus", 1, KDRT_SOFTPLUS(v), KDRT_SIGMOID(v))                                \
  X(SOFTSIGN, "softsign", 1, ((v) / (fabsf(v) + 1.0f)),                                        \
    (1.0f / ((fabsf(v) + 1.0f) * (fabsf(v) + 1.0f))))                                          \
  X(HARD_SIGMOID, "hard_sigmoid", 1, (KDRT_RELU6((v) + 3.0f) / 6.0f),                          \
    ((v) > -3.0f && (v) < 3.0f ? 1.0f / 6.0f : 0.0f))                                          \
  X(HARD_SILU, "hard_silu", 1, ((v) * (KDRT_RELU6((v) + 3.0f) / 6.0f)),                        \
    ((v) <= -3.0f ? 0.0f : (v) >= 3.0f ? 1.0f : (2.0f * (v) + 3.0f) / 6.0f))                   \
  X(EXPONENTIAL, "exponential", 0, KDRT_EXPF(v), (y))                                          \
  X(LEAKY_RELU, "leaky_relu", 0, ((v) >= 0.0f ? (v) : 0.2f * (v)),                             \
    ((y) >= 0.0f ? 1.0f : 0.2f))                                                               \
  X(RELU6, "relu6", 0, KDRT_RELU6(v), ((y) > 0.0f && (y) < 6.0f ? 1.0f : 0.0f))                \
  X(MISH, "mish", 1, ((v) * KDRT_TANHF(KDRT_SOFTPLUS(v))),                                     \
    (KDRT_TANHF(KDRT_SOFTPLUS(v)) +                                                            \
     (v) * (1.0f - KDRT_TANHF(KDRT_SOFTPLUS(v)) * KDRT_TANHF(KDRT_SOFTPLUS(v))) *              \
       KDRT_SIGMOID(v)))                                                                       \
  /* issue 10: gelu(x, approximate=True), keras_hub's gelu_approximate (JAX's tanh form) */     \
  X(GELU_TANH, "gelu_approximate", 1, (0.5f * (v) * (1.0f + KDRT_GELU_T(v))),                  \
    (0.5f * (1.0f + KDRT_GELU_T(v)) +                                                          \
     0.5f * (v) * KDRT_SECH2(KDRT_GELU_U(v)) * KDRT_SQRT_2_OVER_PI *                           \
       (1.0f + 3.0f * 0.044715f * (v) * (v))))                                                 \
  /* not a Keras activation: BatchNormalization's 1 / sqrt(var + epsilon) */                    \
  X(RSQRT, "rsqrt", 0, (1.0f / sqrtf(v)), (-0.5f * (y) * (y) * (y)))                          \
  /* not a Keras activation: the L1 regularizer's |w| (JAX's derivative: 1 at 0) */            \
  X(ABS, "abs", 1, fabsf(v), ((v) >= 0.0f ? 1.0f : -1.0f))

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
