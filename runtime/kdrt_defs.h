// kdrt_defs.h: the enums that the compiler (kdcc), the CPU runtime and the
// CUDA runtime share, each written once as an X-macro list. kdcc includes
// this file too, so the compiler's numbers and the runtime's agree by
// construction, not by a comment. Plain C99, no dependencies: it is also
// compiled as CUDA C++.
#ifndef KDRT_DEFS_H
#define KDRT_DEFS_H

// What the headers written once for both runtimes (kdrt_ops.h's inline
// helpers, kdrt_philox.h, kdrt_rope.h, kdrt_round.h, kdrt_rnn.h) mark their
// functions with: host and device code under nvcc, plain C elsewhere.
#ifdef __CUDACC__
#define KDRT_HD __host__ __device__
#else
#define KDRT_HD
#endif

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
  X(ABS, "abs", 1, fabsf(v), ((v) >= 0.0f ? 1.0f : -1.0f))                                    \
  /* not a Keras activation: an adapted Normalization's sqrt(variance) (invert) */             \
  X(SQRT, "sqrt", 0, sqrtf(v), (0.5f / (y)))

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
  X(BCE, "binary_crossentropy")                                                                \
  /* issue 11 */                                                                               \
  X(HUBER, "huber")                                                                            \
  X(LOG_COSH, "log_cosh")                                                                      \
  X(KLD, "kl_divergence")                                                                      \
  X(POISSON, "poisson")                                                                        \
  X(HINGE, "hinge")                                                                            \
  X(SQUARED_HINGE, "squared_hinge")                                                            \
  X(MAPE, "mean_absolute_percentage_error")                                                    \
  X(MSLE, "mean_squared_logarithmic_error")                                                    \
  X(COSINE, "cosine_similarity")                                                               \
  X(CAT_HINGE, "categorical_hinge")
enum {
#define KDRT_X(name, kname) KDRT_LOSS_##name,
  KDRT_LOSS_LIST(KDRT_X)
#undef KDRT_X
  KDRT_LOSS_COUNT
};

// issue 11: the losses made of one term per element, as keras/src/losses/
// losses.py writes them on JAX, in float: X(NAME, MEAN, f, df) with f the
// term of prediction p and label t and df its derivative in p (JAX's: at
// a tie of maximum or clip each side gets half, abs' is 1 at 0); a is the
// loss's parameter (huber's delta). A row's loss is the mean of its terms
// over the last axis (MEAN 1) or their sum (kl_divergence). hinge and
// squared_hinge get t after Keras's conversion of 0/1 labels to -1/1.
#define KDRT_EPSILON 1e-7f /* keras.backend.epsilon() */
#define KDRT_LOG2 0.693147182f /* ops.log(2.0) in float32 */
// d max(v, lo) / dv, and d clip(v, lo, hi) / dv (jnp.clip: a maximum, then a minimum)
#define KDRT_MAX_D(v, lo) ((v) > (lo) ? 1.0f : (v) == (lo) ? 0.5f : 0.0f)
#define KDRT_CLIP_D(v, lo, hi) (KDRT_MAX_D(v, lo) * ((v) < (hi) ? 1.0f : (v) == (hi) ? 0.5f : 0.0f))
#define KDRT_CLIP(v, lo, hi) fminf(fmaxf((v), (lo)), (hi))
#define KDRT_MSLE_P(v) logf(fmaxf((v), KDRT_EPSILON) + 1.0f)
#define KDRT_MAPE_U(p, t) (((t) - (p)) / fmaxf(fabsf(t), KDRT_EPSILON))
#define KDRT_ELEM_LOSS_LIST(X)                                                                \
  X(HUBER, 1,                                                                                  \
    (fabsf((p) - (t)) <= (a) ? 0.5f * ((p) - (t)) * ((p) - (t))                                \
                             : (a) * fabsf((p) - (t)) - 0.5f * ((a) * (a))),                   \
    (fabsf((p) - (t)) <= (a) ? (p) - (t) : (p) > (t) ? (a) : -(a)))                            \
  /* x + softplus(-2x) - log(2), x = p - t */                                                  \
  X(LOG_COSH, 1, ((p) - (t) + KDRT_SOFTPLUS(-2.0f * ((p) - (t))) - KDRT_LOG2),                 \
    (1.0f - 2.0f * KDRT_SIGMOID(-2.0f * ((p) - (t)))))                                         \
  /* clip(t) log(clip(t) / clip(p)), both clipped to [epsilon, 1] */                           \
  X(KLD, 0,                                                                                    \
    (KDRT_CLIP(t, KDRT_EPSILON, 1.0f) *                                                        \
     logf(KDRT_CLIP(t, KDRT_EPSILON, 1.0f) / KDRT_CLIP(p, KDRT_EPSILON, 1.0f))),               \
    (-KDRT_CLIP(t, KDRT_EPSILON, 1.0f) / KDRT_CLIP(p, KDRT_EPSILON, 1.0f) *                    \
     KDRT_CLIP_D(p, KDRT_EPSILON, 1.0f)))                                                      \
  X(POISSON, 1, ((p) - (t) * logf((p) + KDRT_EPSILON)), (1.0f - (t) / ((p) + KDRT_EPSILON)))   \
  X(HINGE, 1, fmaxf(1.0f - (t) * (p), 0.0f), (-(t) * KDRT_MAX_D(1.0f - (t) * (p), 0.0f)))      \
  X(SQUARED_HINGE, 1, (fmaxf(1.0f - (t) * (p), 0.0f) * fmaxf(1.0f - (t) * (p), 0.0f)),         \
    (-2.0f * (t) * fmaxf(1.0f - (t) * (p), 0.0f)))                                             \
  /* 100 |t - p| / max(|t|, epsilon) */                                                        \
  X(MAPE, 1, (100.0f * fabsf(KDRT_MAPE_U(p, t))),                                              \
    ((KDRT_MAPE_U(p, t) >= 0.0f ? -100.0f : 100.0f) / fmaxf(fabsf(t), KDRT_EPSILON)))          \
  /* (log(max(p, epsilon) + 1) - log(max(t, epsilon) + 1))^2 */                                \
  X(MSLE, 1, ((KDRT_MSLE_P(p) - KDRT_MSLE_P(t)) * (KDRT_MSLE_P(p) - KDRT_MSLE_P(t))),          \
    (2.0f * (KDRT_MSLE_P(p) - KDRT_MSLE_P(t)) / (fmaxf((p), KDRT_EPSILON) + 1.0f) *            \
     KDRT_MAX_D(p, KDRT_EPSILON)))

// ---- initializers
#define KDRT_INIT_LIST(X)                                                                     \
  X(ZEROS, "zeros") X(ONES, "ones") X(CONSTANT, "constant")                                    \
  X(GLOROT_UNIFORM, "glorot_uniform") X(GLOROT_NORMAL, "glorot_normal")                        \
  X(HE_UNIFORM, "he_uniform") X(HE_NORMAL, "he_normal")                                        \
  X(LECUN_UNIFORM, "lecun_uniform") X(LECUN_NORMAL, "lecun_normal")                            \
  X(RANDOM_NORMAL, "random_normal") X(RANDOM_UNIFORM, "random_uniform")                        \
  X(TRUNCATED_NORMAL, "truncated_normal")                                                      \
  /* issue 11: a recurrent kernel's (gain p0), LSTM's unit_forget_bias (zeros, */             \
  /* ones in [p0, 2 p0) of the last dim) */                                                   \
  X(ORTHOGONAL, "orthogonal") X(UNIT_FORGET, "unit_forget")
typedef enum {
#define KDRT_X(name, kname) KDRT_INIT_##name,
  KDRT_INIT_LIST(KDRT_X)
#undef KDRT_X
  KDRT_INIT_COUNT
} kdrt_init_kind;

// ---- issue 11: the cells of recurrent layers (kdrt_rnn.h)
// GRU: reset_after=True (Keras 3's default); GRU_V1: reset_after=False
enum { KDRT_RNN_SIMPLE, KDRT_RNN_LSTM, KDRT_RNN_GRU, KDRT_RNN_GRU_V1 };

// ---- what a label file becomes for the loss (synthetic data, conversions)
// (WEIGHT: kdcc --sample-weight's sample_weight, a float a row, --sample-weight W.npy or ones)
enum { KDRT_LABEL_DENSE, KDRT_LABEL_ONEHOT, KDRT_LABEL_CLASSID, KDRT_LABEL_BINARY,
       KDRT_LABEL_WEIGHT };

// ---- element types of a program's inputs and labels, and of a variable's
// dataset in the weights file (kdrt_var.dtype; KDRT_BF16 and KDRT_F16, issue
// 23: a variable of the bfloat16 or float16 policy, in a float32 buffer
// holding its type's values)
enum { KDRT_F32, KDRT_I32, KDRT_BF16, KDRT_F16 };
// issue 23: KDRT_BF16 (KDRT_F16) | KDRT_IN16: a variable kept in its 16 bits
// (kdrt.h's kdrt_var_half)
#define KDRT_IN16 0x10

// ---- matrix operands: as stored, or transposed
enum { KDRT_NOTRANS, KDRT_TRANS };

// ---- issue 23: the 16-bit types a mixed policy computes in, whose values
// kdrt_round (kdrt_round.h) rounds float32 buffers to (0: float32, none)
enum { KDRT_ROUND_NONE, KDRT_ROUND_BF16, KDRT_ROUND_F16 };
// A 16-bit update's kind | KDRT_STORE16: the variable and its slots kept in
// their 16 bits (kdrt_optim.h's kdrt_ld16, kdrt_st16)
#define KDRT_STORE16 0x100
// issue 23: an operand of kdrt_matmul16: float32 values of the 16-bit type,
// its 16 bits (uint16_t), or float32 values the product rounds to the type
// (a variable's cast for its use, a model input's)
enum { KDRT_OPND_EXACT, KDRT_OPND_16, KDRT_OPND_ROUND };

// ---- kdrt_pact's activations with Keras's parameters (issue 11)
enum { KDRT_PACT_LEAKY, KDRT_PACT_ELU, KDRT_PACT_RELU };

// kdrt_norm and kdrt_layer_norm*'s first argument: LayerNormalization (the
// mean and variance of a row) or RMSNormalization (its mean square alone)
enum { KDRT_NORM_LAYER, KDRT_NORM_RMS };

// ---- learning-rate schedules (keras.optimizers.schedules), by class name
#define KDRT_SCHEDULE_LIST(X)                                                                 \
  X(EXPONENTIAL, "ExponentialDecay") X(PIECEWISE, "PiecewiseConstantDecay")                    \
  X(COSINE, "CosineDecay") X(INVERSE_TIME, "InverseTimeDecay")                                 \
  X(POLYNOMIAL, "PolynomialDecay")
enum {
#define KDRT_X(name, kname) KDRT_SCHEDULE_##name,
  KDRT_SCHEDULE_LIST(KDRT_X)
#undef KDRT_X
  KDRT_SCHEDULE_COUNT
};
#define KDRT_SCHEDULE_MAX_BOUNDS 32

// One schedule's config as Keras's get_config holds it (Python floats kept
// in double, since Keras does some of its arithmetic on them before the
// cast to float32); kdrt_schedule_lr evaluates it at a step.
typedef struct kdrt_schedule {
  int kind;
  double initial;             // initial_learning_rate
  double decay_steps, decay_rate, alpha, end, power;
  int staircase, cycle;
  int warmup;                 // CosineDecay: warmup_target is set
  double warmup_target, warmup_steps;
  int nbounds;                // PiecewiseConstantDecay: boundaries (steps) and values
  double bounds[KDRT_SCHEDULE_MAX_BOUNDS], values[KDRT_SCHEDULE_MAX_BOUNDS + 1];
} kdrt_schedule;

#endif
