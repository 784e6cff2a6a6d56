#!/usr/bin/env python3
"""Write the reference Keras 3 models and distribution specs kdcc must run.

Usage (from the repository root):

    python3 tests/keras_ref/make_models.py            # regenerate models/
    python3 tests/keras_ref/make_models.py --large    # also write wide_mlp.keras (~59 MB)
    python3 tests/keras_ref/make_models.py --no-verify

Needs the packages pinned in tests/keras_ref/requirements.txt (CPU is enough).

Models with several inputs (wide_deep, shared_dense), several outputs with a
loss each (two_heads), int32 token inputs with an Embedding (int_tokens,
per_token: one class per token) and a shared layer (shared_dense) describe
their data as "inputs"/"outputs" (see fake_data) instead of "x"/"labels".

Everything is written by real Keras 3 (JAX backend):

  models/<name>.json       the config.json a .keras archive holds (includes
                           "compile_config"), pretty-printed with indent=2.
  models/<name>.keras      the archive itself (model.save()).
  models/<name>.dist.json  kdcc's distribution spec (mirrors keras.distribution).
  models/README.md         per model: every variable path, global shape and the
                           layout real Keras applied (from a real run on 8 CPU
                           devices), plus which layer-output keys took effect.
  models/keras_layouts.json  the same facts, machine-readable.

Determinism: the only nondeterministic parts of a Keras save are
  * "shared_object_id" (Keras writes Python id() values): renumbered 1, 2, ... in
    order of first appearance (same sharing, so Keras loads it identically);
  * metadata.json "date_saved" and the zip members' timestamps: fixed.
Weights come from keras.utils.set_random_seed(SEED) before each model.

Variable paths, as printed by Keras 3.15.1 ([v.path for v in model.weights]):
  Sequential "sequential" BUILT IN PYTHON (keras.Sequential([...]) here):
      sequential/d1/kernel, sequential/d2/kernel, sequential/d2/bias
  The same Sequential LOADED from the .keras / .json (load_model,
  model_from_json, deserialize_keras_object):
      d1/kernel, d2/kernel, d2/bias                    (no model prefix!)
    because the deserializer builds each layer from its "build_config" before
    Sequential.from_config adds it, outside the model's name scope. A layer's
    path is fixed at its first build/call (Layer._parent_path).
  Functional, either way:     a/kernel, a/bias, ...  (no model name)
  Optimizer slots:            adam/sequential_d1_kernel_momentum (Python-built),
                              adam/d1_kernel_momentum (loaded)
  Layer outputs (LayoutMap "<layer path>/output" lookups): sequential/d2/output
  (Python-built Sequential), d2/output (loaded Sequential, Functional).
So the distribution-guide style key "d1/kernel" (LayoutMap uses re.fullmatch
since 3.14) leaves the weights silently replicated for the Python-built seed
model, but works for the model loaded from models/seed_mlp.json; the key
"sequential/d1/kernel" is the other way round. Both specs are written
(seed_mlp.dist.json, seed_mlp_fixed.dist.json), plus seed_mlp_both.dist.json
whose regex keys "(sequential/)?d1/kernel" match either form; all are verified
both ways; see models/README.md.
"""

import os
import sys

# Must precede any jax import: 8 host devices for the distribution check.
os.environ["KERAS_BACKEND"] = "jax"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (
        _flags + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import copy  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
import zipfile  # noqa: E402

import numpy as np  # noqa: E402

warnings.filterwarnings("ignore")

import jax  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402  (PositionEmbedding: gpt, vit)
from keras import layers  # noqa: E402

SEED = 1234
FIXED_DATE = "2025-01-01@00:00:00"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "models")

# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def seed_mlp():
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            layers.Flatten(),
            layers.Dense(200, activation="relu", use_bias=False, name="d1"),
            layers.Dropout(0.4),
            layers.Dense(10, activation="softmax", name="d2"),
        ]
    )  # name defaults to "sequential" after clear_session()
    model.compile(loss="mse", optimizer=keras.optimizers.Adam(),
                  metrics=["accuracy"])
    return model


def func_branches():
    x = keras.Input((32,), name="x")
    a = layers.Dense(64, activation="relu", name="a")(x)
    b = layers.Dense(64, activation="tanh", name="b")(x)
    s = layers.Add(name="add")([a, b])
    c = layers.Dense(16, activation="relu", name="c")(s)
    d = layers.Dense(8, activation="relu", name="d")(x)
    cat = layers.Concatenate(name="cat")([c, d])
    out = layers.Dense(4, activation="softmax", name="out")(cat)
    model = keras.Model(x, out, name="func_branches")
    model.compile(loss="categorical_crossentropy",
                  optimizer=keras.optimizers.SGD(momentum=0.9),
                  metrics=["accuracy"])
    return model


def cnn():
    # Functional, so paths are "conv2d/kernel" and the regex keys
    # "conv2d.*kernel" full-match (in a Sequential they would be
    # "sequential/conv2d/kernel" and match nothing).
    x = keras.Input((28, 28, 1), name="image")
    y = layers.Conv2D(8, 3, activation="relu", name="conv2d")(x)
    y = layers.MaxPooling2D(2, name="max_pooling2d")(y)
    y = layers.Conv2D(16, 3, padding="same", activation="relu",
                      name="conv2d_1")(y)
    y = layers.MaxPooling2D(name="max_pooling2d_1")(y)
    y = layers.Flatten(name="flatten")(y)
    y = layers.Dropout(0.25, name="dropout")(y)
    out = layers.Dense(10, activation="softmax", name="dense")(y)
    model = keras.Model(x, out, name="cnn")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
    return model


def megatron():
    x = keras.Input((64,), name="x")
    y = layers.Dense(128, activation="relu", name="pre")(x)
    y = layers.Dense(256, activation="gelu", name="up")(y)
    y = layers.Dense(64, name="down")(y)
    out = layers.Dense(8, name="head")(y)
    model = keras.Model(x, out, name="megatron")
    model.compile(
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.AdamW(),
    )
    return model


def wide_mlp():
    model = keras.Sequential(name="wide_mlp")
    model.add(keras.Input((1024,)))
    for _ in range(4):
        model.add(layers.Dense(2048, activation="relu"))  # dense .. dense_3
    model.add(layers.Dense(10))  # dense_4
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.SGD(),
    )
    return model


def wide_deep():
    # Two float inputs; model.inputs order is [wide, deep].
    wide = keras.Input((8,), name="wide")
    deep = keras.Input((16,), name="deep")
    d = layers.Dense(16, activation="relu", name="deep_1")(deep)
    cat = layers.Concatenate(name="cat")([wide, d])
    out = layers.Dense(4, activation="softmax", name="out")(cat)
    model = keras.Model([wide, deep], out, name="wide_deep")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"])
    return model


def two_heads():
    # One input, two outputs with a loss each (total = 1.0*a + 0.5*b).
    x = keras.Input((12,), name="x")
    t = layers.Dense(16, activation="relu", name="trunk")(x)
    a = layers.Dense(3, activation="softmax", name="head_a")(t)
    b = layers.Dense(1, name="head_b")(t)
    model = keras.Model(x, [a, b], name="two_heads")
    model.compile(
        loss={"head_a": "sparse_categorical_crossentropy", "head_b": "mse"},
        loss_weights={"head_a": 1.0, "head_b": 0.5},
        metrics={"head_a": ["accuracy"]},
        optimizer=keras.optimizers.SGD(0.05),
    )
    return model


def metrics():
    # Keras's metrics by string and by object, on three heads: "acc" (its
    # log named so), SparseCategoricalAccuracy under another name and the
    # crossentropy as a metric; mae, LogCoshError and mape beside mse;
    # binary_accuracy and hinge on a sigmoid head. None changes training.
    x = keras.Input((12,), name="x")
    t = layers.Dense(16, activation="relu", name="trunk")(x)
    c = layers.Dense(5, activation="softmax", name="cls")(t)
    r = layers.Dense(3, name="reg")(t)
    b = layers.Dense(1, activation="sigmoid", name="bin")(t)
    model = keras.Model(x, [c, r, b], name="metrics")
    model.compile(
        loss={"cls": "sparse_categorical_crossentropy", "reg": "mse",
              "bin": "binary_crossentropy"},
        metrics={"cls": ["acc", keras.metrics.SparseCategoricalAccuracy(name="sca"),
                         "sparse_categorical_crossentropy"],
                 "reg": ["mae", keras.metrics.LogCoshError(), "mape"],
                 "bin": ["binary_accuracy", "hinge"]},
        optimizer=keras.optimizers.Adam(0.01),
    )
    return model


def int_tokens():
    # int32 token ids -> Embedding -> Flatten -> classifier.
    x = keras.Input((6,), dtype="int32", name="tokens")
    e = layers.Embedding(32, 8, name="emb")(x)
    f = layers.Flatten(name="flatten")(e)
    out = layers.Dense(4, activation="softmax", name="out")(f)
    model = keras.Model(x, out, name="int_tokens")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
    return model


def per_token():
    # A tiny language-model head: one class id per token, logits [B, 8, 32].
    x = keras.Input((8,), dtype="int32", name="tokens")
    e = layers.Embedding(32, 16, name="emb")(x)
    h = layers.Dense(16, activation="relu", name="hidden")(e)
    out = layers.Dense(32, name="logits")(h)
    model = keras.Model(x, out, name="per_token")
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
    return model


def shared_dense():
    # One Dense layer called on two inputs (its weights are used twice).
    a = keras.Input((10,), name="a")
    b = keras.Input((10,), name="b")
    shared = layers.Dense(8, activation="relu", name="shared")
    s = layers.Add(name="add")([shared(a), shared(b)])
    out = layers.Dense(1, name="out")(s)
    model = keras.Model([a, b], out, name="shared_dense")
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.05))
    return model


# Transformers (text_cls, gpt, vit, llama): dropout 0 everywhere (MHA's
# default), so Keras's attention goes through ops.dot_product_attention
# (jax.nn.dot_product_attention, implementation "xla" on CPU).


def text_cls():
    x = keras.Input((16,), dtype="int32", name="tokens")
    e = layers.Embedding(64, 32, name="emb")(x)
    a = layers.MultiHeadAttention(num_heads=4, key_dim=8, name="mha")(e, e)
    s = layers.Add(name="add")([e, a])
    n = layers.LayerNormalization(name="ln")(s)
    p = layers.GlobalAveragePooling1D(name="pool")(n)
    out = layers.Dense(4, activation="softmax", name="out")(p)
    model = keras.Model(x, out, name="text_cls")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
    return model


def _encoder_block(h, prefix, causal, mlp):
    """Pre-norm block: h + MHA(LN(h)); h + Dense(Dense_gelu(LN(h)))."""
    n = layers.LayerNormalization(name=prefix + "ln1")(h)
    attn = layers.MultiHeadAttention(num_heads=4, key_dim=8,
                                     name=prefix + "attn")
    a = attn(n, n, use_causal_mask=True) if causal else attn(n, n)
    h = layers.Add(name=prefix + "add1")([h, a])
    n = layers.LayerNormalization(name=prefix + "ln2")(h)
    f = layers.Dense(mlp, activation="gelu", name=prefix + "up")(n)
    f = layers.Dense(int(h.shape[-1]), name=prefix + "down")(f)
    return layers.Add(name=prefix + "add2")([h, f])


def gpt():
    x = keras.Input((16,), dtype="int32", name="tokens")
    tok = layers.Embedding(64, 32, name="tok")(x)
    pos = keras_hub.layers.PositionEmbedding(sequence_length=16,
                                             name="pos")(tok)
    h = layers.Add(name="embed_add")([tok, pos])
    for i in range(2):
        h = _encoder_block(h, f"b{i}_", causal=True, mlp=128)
    h = layers.LayerNormalization(name="ln_f")(h)
    out = layers.Dense(64, name="logits")(h)
    model = keras.Model(x, out, name="gpt")
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
    return model


def vit():
    x = keras.Input((28, 28, 1), name="image")
    p = layers.Conv2D(32, 7, strides=7, name="patch")(x)  # (4, 4, 32)
    p = layers.Reshape((16, 32), name="patches")(p)
    pos = keras_hub.layers.PositionEmbedding(sequence_length=16,
                                             name="pos")(p)
    h = layers.Add(name="embed_add")([p, pos])
    h = _encoder_block(h, "", causal=False, mlp=64)
    h = layers.GlobalAveragePooling1D(name="pool")(h)
    out = layers.Dense(10, activation="softmax", name="out")(h)
    model = keras.Model(x, out, name="vit")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
    return model


def llama():
    x = keras.Input((16,), dtype="int32", name="tokens")
    h = layers.Embedding(64, 32, name="emb")(x)
    n = layers.RMSNormalization(name="rms1")(h)
    a = layers.GroupQueryAttention(head_dim=8, num_query_heads=4,
                                   num_key_value_heads=2,
                                   name="attn")(n, n, use_causal_mask=True)
    h = layers.Add(name="add1")([h, a])
    n = layers.RMSNormalization(name="rms2")(h)
    g = layers.Dense(64, activation="silu", use_bias=False, name="gate")(n)
    u = layers.Dense(64, use_bias=False, name="up")(n)
    m = layers.Multiply(name="mul")([g, u])
    d = layers.Dense(32, use_bias=False, name="down")(m)
    h = layers.Add(name="add2")([h, d])
    h = layers.RMSNormalization(name="rms_f")(h)
    out = layers.Dense(64, name="logits")(h)
    model = keras.Model(x, out, name="llama")
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
    return model


def bn_cnn():
    # issue 11: a ResNet-style block with BatchNormalization (after a conv,
    # with momentum 0.9 / epsilon 1e-5, and on a rank-2 tensor without
    # center), Add and GlobalAveragePooling2D. The convs have no bias: batch
    # norm cancels it, so its gradient is rounding noise that Adam amplifies.
    x = keras.Input((8, 8, 3), name="image")
    y = layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv2d")(x)
    y = layers.BatchNormalization(name="batch_normalization")(y)
    y = layers.ReLU(name="re_lu")(y)
    r = layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv2d_1")(y)
    r = layers.BatchNormalization(momentum=0.9, epsilon=1e-5,
                                  name="batch_normalization_1")(r)
    y = layers.Add(name="add")([y, r])
    y = layers.Activation("relu", name="activation")(y)
    y = layers.GlobalAveragePooling2D(name="global_average_pooling2d")(y)
    y = layers.BatchNormalization(center=False, momentum=0.8,
                                  name="batch_normalization_2")(y)
    out = layers.Dense(10, activation="softmax", name="dense")(y)
    model = keras.Model(x, out, name="bn_cnn")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
    return model


def einsum():
    # issue 10: EinsumDense in each form Keras accepts: a projection to
    # heads and back (bias over two axes, over one), a trailing ellipsis with
    # a bias broadcast over it, a kernel dim that is also the output's (a
    # dot_general batch dim), a transposed kernel, a leading ellipsis, an
    # input dim summed over; gelu exact and keras_hub's gelu_approximate;
    # regularizers on a split kernel (a partial sum), a bias and an
    # activity, and a constraint on a transposed kernel.
    from keras_hub.src.utils.keras_utils import gelu_approximate
    x = keras.Input((6, 8), name="x")
    h = layers.EinsumDense("abc,cde->abde", output_shape=(6, 4, 3),
                           bias_axes="de", activation="gelu",
                           kernel_regularizer=keras.regularizers.L2(0.01),
                           name="e1")(x)
    h = layers.EinsumDense("abcd,cde->abe", output_shape=(6, 8),
                           bias_axes="e", name="e2")(h)
    h = layers.EinsumDense("ab...,bc->ac...", output_shape=(4,),
                           bias_axes="c", activation="tanh",
                           bias_regularizer=keras.regularizers.L1(0.02),
                           name="e3")(h)
    h = layers.EinsumDense("abc,bcd->abd", output_shape=(4, 8), bias_axes="d",
                           activation=gelu_approximate, name="e4")(h)
    h = layers.EinsumDense("abc,dc->abd", output_shape=(4, 8),
                           kernel_constraint=keras.constraints.MaxNorm(0.5),
                           name="e5")(h)
    h = layers.EinsumDense("...b,bc->...c", output_shape=(8,), bias_axes="c",
                           activity_regularizer=keras.regularizers.L1L2(1e-3, 1e-3),
                           name="e6")(h)
    out = layers.EinsumDense("abc,cd->ad", output_shape=(4,), name="e7")(h)
    model = keras.Model(x, out, name="einsum")
    model.compile(loss="mse", optimizer=keras.optimizers.Adam())
    return model


def rev_emb():
    # issue 10: ReversibleEmbedding, tied (keras_hub's) and untied with a
    # logit soft cap (keras.layers'), each called on the ids and again with
    # reverse=True for next-token logits from its table.
    x = keras.Input((16,), dtype="int32", name="tokens")
    tok = keras_hub.layers.ReversibleEmbedding(64, 32, name="tok")
    tok2 = layers.ReversibleEmbedding(64, 32, tie_weights=False,
                                      logit_soft_cap=5.0, name="tok2")
    h = layers.Add(name="emb")([tok(x), tok2(x)])
    h = layers.Dense(32, activation="gelu", name="mlp")(h)
    out = layers.Add(name="logits")([tok(h, reverse=True),
                                     tok2(h, reverse=True)])
    model = keras.Model(x, out, name="rev_emb")
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.Adam())
    return model


def attn_mask():
    # issue 10: an attention_mask from a model input ([batch, query, key],
    # int32 0/1): with use_causal_mask (MultiHeadAttention), and alone
    # (GroupQueryAttention).
    x = keras.Input((16,), dtype="int32", name="tokens")
    mask = keras.Input((16, 16), dtype="int32", name="mask")
    h = layers.Embedding(64, 32, name="emb")(x)
    a = layers.MultiHeadAttention(num_heads=4, key_dim=8, name="mha")(
        h, h, attention_mask=mask, use_causal_mask=True)
    h = layers.Add(name="add1")([h, a])
    n = layers.LayerNormalization(name="ln")(h)
    a = layers.GroupQueryAttention(head_dim=8, num_query_heads=4,
                                   num_key_value_heads=2,
                                   name="gqa")(n, n, attention_mask=mask)
    h = layers.Add(name="add2")([h, a])
    out = layers.Dense(64, name="logits")(h)
    model = keras.Model([x, mask], out, name="attn_mask")
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.Adam())
    return model


def sparse_classifier(inputs, out, name):
    """issue 11's models: sparse crossentropy over 10 classes, Adam, accuracy."""
    model = keras.Model(inputs, out, name=name)
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
    return model


def regularized():
    # issue 11: L1, L2 and L1L2 regularizers on every kind of variable
    # (conv, dense, embedding, layer norm), strings and envelopes, and
    # activity regularizers (divided by the batch): Keras's reported loss
    # includes every penalty, and so must kdcc's.
    reg = keras.regularizers
    image = keras.Input((8, 8, 3), name="image")
    tokens = keras.Input((6,), dtype="int32", name="tokens")
    c = layers.Conv2D(8, 3, padding="same", activation="relu",
                      kernel_regularizer=reg.L2(1e-2), bias_regularizer=reg.L2(1e-3),
                      activity_regularizer=reg.L2(1e-4), name="conv2d")(image)
    c = layers.GlobalAveragePooling2D(name="gap2d")(c)
    e = layers.Embedding(20, 8, embeddings_regularizer=reg.L2(1e-2), name="emb")(tokens)
    e = layers.GlobalAveragePooling1D(name="gap1d")(e)
    h = layers.Concatenate(name="cat")([c, e])
    h = layers.Dense(16, activation="relu", kernel_regularizer=reg.L1L2(l1=1e-3, l2=1e-2),
                     bias_regularizer="l2", activity_regularizer=reg.L1(1e-3),
                     name="hidden")(h)
    h = layers.LayerNormalization(gamma_regularizer=reg.L2(1e-2), name="ln")(h)
    out = layers.Dense(10, activation="softmax", kernel_regularizer="l1", name="out")(h)
    return sparse_classifier([image, tokens], out, "regularized")


def constrained():
    # issue 11: weight constraints after every update (NonNeg, MaxNorm over a
    # conv's filters, UnitNorm and MinMaxNorm over a dense kernel's split rows,
    # by name and as envelopes)
    con = keras.constraints
    x = keras.Input((8, 8, 3), name="image")
    c = layers.Conv2D(8, 3, padding="same", activation="relu",
                      kernel_constraint=con.MaxNorm(0.5, axis=[0, 1, 2]),
                      bias_constraint="non_neg", name="conv2d")(x)
    c = layers.GlobalAveragePooling2D(name="gap2d")(c)
    h = layers.Dense(16, activation="relu", kernel_constraint=con.UnitNorm(axis=0),
                     bias_constraint=con.MinMaxNorm(0.01, 0.05, rate=0.7, axis=0),
                     bias_initializer="ones", name="hidden")(c)
    h = layers.LayerNormalization(gamma_constraint=con.MaxNorm(3.0), name="ln")(h)
    out = layers.Dense(10, activation="softmax", kernel_constraint=con.NonNeg(),
                       name="out")(h)
    return sparse_classifier(x, out, "constrained")


def frozen():
    # Fine-tuning: a frozen backbone (trainable=False before compile) under a
    # trained head. A frozen Conv2D and BatchNormalization (which normalises
    # with its moving statistics in training too and leaves them be), a
    # trained conv and batch norm on top, a frozen Dense whose kernel
    # regularizer is not in the loss (Keras sums trainable weights' penalties
    # only) but whose activity regularizer is; the frozen weights must come
    # out as they went in.
    reg = keras.regularizers
    x = keras.Input((8, 8, 3), name="image")
    y = layers.Conv2D(8, 3, padding="same", name="conv2d", trainable=False)(x)
    init = keras.initializers
    bn = layers.BatchNormalization(  # moving statistics far from 0 and 1
        momentum=0.9, gamma_initializer=init.RandomUniform(0.5, 1.5),
        beta_initializer=init.RandomNormal(stddev=0.5),
        moving_mean_initializer=init.RandomNormal(stddev=0.5),
        moving_variance_initializer=init.RandomUniform(0.5, 2.0), name="batch_normalization")
    y = layers.ReLU(name="re_lu")(bn(y))
    y = layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv2d_1")(y)
    y = layers.BatchNormalization(name="batch_normalization_1")(y)
    y = layers.GlobalAveragePooling2D(name="gap2d")(layers.ReLU(name="re_lu_1")(y))
    hidden = layers.Dense(16, activation="relu", kernel_regularizer=reg.L2(1e-1),
                          activity_regularizer=reg.L2(1e-3), name="hidden")
    out = layers.Dense(10, activation="softmax", name="out")(hidden(y))
    bn.trainable = False
    hidden.trainable = False
    return sparse_classifier(x, out, "frozen")


def nested():
    # Models used as layers: a Sequential backbone (conv, pooling, dense) and
    # a Functional block inside a Functional model. The Sequential's
    # variables are "backbone/<layer>/...", the Functional's "<layer>/..."
    # (as Keras names a model built before it is nested); in the weights file
    # layers/sequential/layers/<group>, layers/functional/layers/<group>.
    backbone = keras.Sequential([
        keras.Input((8, 8, 3)),
        layers.Conv2D(8, 3, padding="same", activation="relu", name="conv2d"),
        layers.GlobalAveragePooling2D(name="gap2d"),
        layers.Dense(16, activation="relu", name="dense")], name="backbone")
    bi = keras.Input((16,), name="block_in")
    bo = layers.Dense(16, activation="relu", name="proj")(bi)
    block = keras.Model(bi, layers.Add(name="skip")([bi, bo]), name="block")
    x = keras.Input((8, 8, 3), name="image")
    out = layers.Dense(10, activation="softmax", name="dense")(block(backbone(x)))
    return sparse_classifier(x, out, "nested")


def nested_frozen():
    # Fine-tuning: a Sequential backbone (with a batch norm) frozen as a whole
    # (backbone.trainable = False before compile) under a trained head, Adam:
    # its weights come out bit-identical.
    init = keras.initializers
    backbone = keras.Sequential([
        keras.Input((8, 8, 3)),
        layers.Conv2D(8, 3, padding="same", name="conv2d"),
        layers.BatchNormalization(moving_mean_initializer=init.RandomNormal(stddev=0.5),
                                  moving_variance_initializer=init.RandomUniform(0.5, 2.0),
                                  name="batch_normalization"),
        layers.ReLU(name="re_lu"),
        layers.GlobalAveragePooling2D(name="gap2d"),
        layers.Dense(16, activation="relu", name="dense")], name="backbone")
    backbone.trainable = False
    model = keras.Sequential([backbone, layers.Dense(10, activation="softmax", name="out")],
                             name="finetune")
    model.build((None, 8, 8, 3))
    model.compile(loss="sparse_categorical_crossentropy", optimizer=keras.optimizers.Adam(),
                  metrics=["accuracy"])
    return model


def conv1d():
    # issue 11: Conv1D with 'causal', 'same' (strided) and 'valid' padding
    x = keras.Input((12, 4), name="seq")
    y = layers.Conv1D(8, 3, padding="causal", activation="relu", name="conv1d")(x)
    y = layers.Conv1D(8, 2, strides=2, padding="same", activation="relu", name="conv1d_1")(y)
    y = layers.Conv1D(8, 3, padding="valid", activation="tanh", name="conv1d_2")(y)
    y = layers.GlobalAveragePooling1D(name="gap1d")(y)
    out = layers.Dense(10, activation="softmax", name="out")(y)
    return sparse_classifier(x, out, "conv1d_model")


def dilated():
    # issue 11: dilation_rate on Conv2D ('same', and 'valid' with the width
    # alone dilated) and on Conv1D ('causal', 'same')
    img = keras.Input((9, 8, 3), name="image")
    seq = keras.Input((10, 3), name="seq")
    a = layers.Conv2D(8, 3, dilation_rate=2, padding="same", activation="relu",
                      name="conv2d")(img)
    a = layers.Conv2D(8, (2, 3), dilation_rate=(1, 2), activation="tanh", name="conv2d_1")(a)
    a = layers.GlobalAveragePooling2D(name="gap2d")(a)
    b = layers.Conv1D(8, 3, dilation_rate=2, padding="causal", activation="relu",
                      name="conv1d")(seq)
    b = layers.Conv1D(8, 2, dilation_rate=3, padding="same", activation="tanh",
                      name="conv1d_1")(b)
    b = layers.GlobalAveragePooling1D(name="gap1d")(b)
    h = layers.Concatenate(name="cat")([a, b])
    out = layers.Dense(10, activation="softmax", name="out")(h)
    return sparse_classifier([img, seq], out, "dilated")


def grouped():
    # issue 11: Conv2D groups, DepthwiseConv2D (depth_multiplier, strides) and
    # SeparableConv2D.
    # (Keras 3.15 on JAX fails on Conv1D with groups: feature_group_count.)
    x = keras.Input((8, 8, 4), name="image")
    y = layers.Conv2D(8, 3, groups=2, padding="same", activation="relu", name="conv2d")(x)
    y = layers.DepthwiseConv2D(3, depth_multiplier=2, strides=2, padding="same",
                               activation="relu", name="depthwise_conv2d")(y)
    y = layers.SeparableConv2D(8, 2, depth_multiplier=2, padding="same", activation="tanh",
                               name="separable_conv2d")(y)
    y = layers.GlobalAveragePooling2D(name="gap2d")(y)
    out = layers.Dense(10, activation="softmax", name="out")(y)
    return sparse_classifier(x, out, "grouped")


def transposed():
    # issue 11: Conv2DTranspose, 'same' (strided) and 'valid' with a stride
    # over the kernel (Keras's output is then (h - 1) * s + s)
    x = keras.Input((6, 5, 3), name="image")
    y = layers.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu",
                               name="conv2d_transpose")(x)
    y = layers.Conv2DTranspose(8, (2, 3), strides=(3, 1), activation="tanh",
                               name="conv2d_transpose_1")(y)
    y = layers.GlobalAveragePooling2D(name="gap2d")(y)
    out = layers.Dense(10, activation="softmax", name="out")(y)
    return sparse_classifier(x, out, "transposed")


def lenet():
    # issue 11: LeNet-5 as first written: the 28x28 digits zero-padded to
    # 32x32, tanh convolutions, average pooling.
    x = keras.Input((28, 28, 1), name="image")
    y = layers.ZeroPadding2D(2, name="pad")(x)
    y = layers.Conv2D(6, 5, activation="tanh", name="c1")(y)
    y = layers.AveragePooling2D(2, name="s2")(y)
    y = layers.Conv2D(16, 5, activation="tanh", name="c3")(y)
    y = layers.AveragePooling2D(2, name="s4")(y)
    y = layers.Flatten(name="flatten")(y)
    y = layers.Dense(120, activation="tanh", name="f5")(y)
    y = layers.Dense(84, activation="tanh", name="f6")(y)
    out = layers.Dense(10, activation="softmax", name="out")(y)
    return sparse_classifier(x, out, "lenet")


def mobilenet():
    # issue 11: MobileNet's blocks: a strided stem, a depthwise-separable
    # block, then an inverted residual (1x1 expansion, depthwise, linear 1x1
    # projection, Add), each convolution followed by batch norm and ReLU6.
    def bn_relu6(t, name, relu=True):
        t = layers.BatchNormalization(momentum=0.9, name=name + "_bn")(t)
        return layers.ReLU(6.0, name=name + "_relu")(t) if relu else t
    x = keras.Input((16, 16, 3), name="image")
    y = bn_relu6(layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False,
                               name="stem")(x), "stem")
    y = bn_relu6(layers.DepthwiseConv2D(3, padding="same", use_bias=False,
                                        name="dw1")(y), "dw1")
    y = bn_relu6(layers.Conv2D(16, 1, use_bias=False, name="pw1")(y), "pw1")
    r = bn_relu6(layers.Conv2D(32, 1, use_bias=False, name="expand")(y), "expand")
    r = bn_relu6(layers.DepthwiseConv2D(3, padding="same", use_bias=False,
                                        name="dw2")(r), "dw2")
    r = bn_relu6(layers.Conv2D(16, 1, use_bias=False, name="project")(r), "project",
                 relu=False)
    y = layers.Add(name="residual")([y, r])
    y = layers.GlobalAveragePooling2D(name="gap2d")(y)
    out = layers.Dense(10, activation="softmax", name="out")(y)
    return sparse_classifier(x, out, "mobilenet")


def activations():
    # issue 11: activation layers with parameters no activation name has:
    # LeakyReLU's default slope (0.3), ELU's alpha, ReLU's max_value,
    # negative_slope and threshold together, and each alone.
    x = keras.Input((12,), name="x")
    h = layers.LeakyReLU(name="leaky")(layers.Dense(16, name="d1")(x))
    h = layers.ELU(alpha=0.5, name="elu")(layers.Dense(16, name="d2")(h))
    h = layers.Dense(16, name="d3")(h)
    h = layers.ReLU(max_value=1.5, negative_slope=0.1, threshold=0.2, name="relu")(h)
    h = layers.ReLU(negative_slope=0.05, name="relu_leaky")(layers.Dense(16, name="d4")(h))
    h = layers.ReLU(max_value=2.0, name="relu_max")(layers.Dense(16, name="d5")(h))
    h = layers.ReLU(threshold=0.1, name="relu_thr")(layers.Dense(16, name="d6")(h))
    out = layers.Dense(10, activation="softmax", name="out")(h)
    return sparse_classifier(x, out, "activations")
def glu():
    # issue 25: Keras's glu, a Dense's activation and a layer: the last dim
    # halved (40 -> 20 -> 10 here). Keras 3.15's symbolic shapes keep the
    # whole dim (Dense and Activation say their output is as wide as their
    # input), so a layer with weights after a glu cannot be built; softmax
    # has none.
    x = keras.Input((12,), name="x")
    h = layers.Dense(16, activation="tanh", name="d1")(x)
    h = layers.Dense(40, activation="glu", name="d2")(h)
    h = layers.Activation("glu", name="glu")(h)
    out = layers.Activation("softmax", name="out")(h)
    return sparse_classifier(x, out, "glu")


def serialized_with(loss, **options):
    """loss, writing into its config the options Keras 3.15 leaves out
    (Huber's delta): Keras's from_config reads them, so a file that has
    them means them, and kdcc must read them."""
    config = loss.get_config
    loss.get_config = lambda: {**config(), **options}
    return loss


def loss_heads(x, heads, name, **compile_args):
    """issue 11: a trunk and one Dense head per loss: heads is a list of
    (name, units, activation, loss); Adam."""
    t = layers.Dense(16, activation="tanh", name="trunk")(x)
    outs = [layers.Dense(u, activation=a, name=n)(t) for n, u, a, _ in heads]
    model = keras.Model(x, outs, name=name)
    model.compile(loss={n: lo for n, _, _, lo in heads}, optimizer=keras.optimizers.Adam(),
                  **compile_args)
    return model


def loss_reg():
    # issue 11: the regression losses, as names, functions and objects
    L = keras.losses
    return loss_heads(keras.Input((12,), name="x"), [
        ("huber", 3, "linear", serialized_with(L.Huber(delta=0.5), delta=0.5)),
        ("log_cosh", 3, "linear", L.log_cosh),
        ("poisson", 3, "softplus", L.Poisson()),
        ("cosine", 4, "softplus", L.CosineSimilarity()),  # positive: far from 0
        ("mape", 2, "linear", "mape"),
        ("msle", 2, "linear", L.MeanSquaredLogarithmicError()),
        ("kld", 4, "softmax", "kl_divergence"),
    ], "loss_reg", loss_weights={"huber": 1.0, "log_cosh": 1.0, "poisson": 1.0, "cosine": 1.0,
                                 "mape": 0.01, "msle": 1.0, "kld": 0.5})


def loss_cls():
    # issue 11: the hinge losses (hinge's labels 0/1 in the first half, so
    # that Keras maps them to -1/1, then with a -1 in one row of each batch,
    # so that it does not, though most devices' rows are 0/1) and label
    # smoothing on the crossentropies, with and without logits
    L = keras.losses
    return loss_heads(keras.Input((12,), name="x"), [
        ("hinge", 3, "tanh", "hinge"),
        ("sq_hinge", 3, "linear", L.SquaredHinge()),
        ("cat_hinge", 4, "linear", "categorical_hinge"),
        ("cce_ls", 4, "softmax", L.CategoricalCrossentropy(label_smoothing=0.1)),
        ("cce_ls_logits", 4, "linear",
         L.CategoricalCrossentropy(from_logits=True, label_smoothing=0.2)),
        ("bce_ls", 2, "sigmoid", L.BinaryCrossentropy(label_smoothing=0.1)),
        ("bce_ls_logits", 2, "linear",
         L.BinaryCrossentropy(from_logits=True, label_smoothing=0.2)),
    ], "loss_cls", metrics={"cce_ls": ["accuracy"], "bce_ls": ["accuracy"]})
def opt_mlp(name, optimizer):
    """issue 11's optimizer cases: one MLP, compiled with optimizer() (an
    option, another optimizer, a learning-rate schedule)."""
    def build():
        x = keras.Input((12,), name="x")
        h = layers.Dense(16, activation="tanh", name="hidden")(x)
        out = layers.Dense(10, activation="softmax", name="out")(h)
        model = keras.Model(x, out, name=name)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=optimizer(),
                      metrics=["accuracy"])
        return model
    return build


OPT = keras.optimizers
SCHED = keras.optimizers.schedules
# case -> the optimizer; each case trains opt_mlp under OPT_MP (the hidden
# layer's columns split: a gradient's norm is a partial sum over 'model')
OPT_CASES = {
    "adam_amsgrad": lambda: OPT.Adam(0.01, amsgrad=True),
    "rmsprop_centered": lambda: OPT.RMSprop(0.01, momentum=0.5, centered=True),
    "clipnorm": lambda: OPT.SGD(0.1, momentum=0.9, clipnorm=0.05),
    "clipvalue": lambda: OPT.Adam(0.01, clipvalue=0.002),
    "global_clipnorm": lambda: OPT.Adam(0.01, global_clipnorm=0.1),
    "adagrad": lambda: OPT.Adagrad(0.05),
    "adamax": lambda: OPT.Adamax(0.01),
    "nadam": lambda: OPT.Nadam(0.01),
    "lion": lambda: OPT.Lion(0.001, weight_decay=0.1),
    "sched_exp": lambda: OPT.SGD(SCHED.ExponentialDecay(0.5, 3, 0.7, staircase=True)),
    "sched_piecewise": lambda: OPT.Adam(SCHED.PiecewiseConstantDecay([2, 5], [0.02, 0.01, 0.002])),
    "sched_cosine": lambda: OPT.Adam(SCHED.CosineDecay(0.001, 8, alpha=0.1, warmup_target=0.02,
                                                       warmup_steps=4)),
    "sched_inverse": lambda: OPT.RMSprop(SCHED.InverseTimeDecay(0.01, 2, 0.5)),
    "sched_poly": lambda: OPT.SGD(SCHED.PolynomialDecay(0.5, 5, 0.01, power=2.0, cycle=True)),
}
OPT_MP = {"hidden/kernel": [None, "model"], "hidden/bias": ["model"], "out/kernel": ["model", None]}
def merging():
    # issue 11: Subtract, Maximum and Minimum (three inputs: two at a time),
    # Average, Dot over the features (a [6, 6] product), over the steps
    # (axes=1: both inputs' contracted dim moved) and normalized (cosine)
    x = keras.Input((6, 4), name="seq")
    a = layers.Dense(8, activation="tanh", name="dense_a")(x)
    b = layers.Dense(8, activation="tanh", name="dense_b")(x)
    s = layers.Subtract(name="subtract")([a, b])
    m = layers.Maximum(name="maximum")([a, b, s])
    n = layers.Minimum(name="minimum")([a, s])
    av = layers.Average(name="average")([m, n, a])
    d = layers.Dot(axes=(2, 2), name="dot")([av, b])
    e = layers.Dot(axes=1, name="dot_steps")([a, m])
    p = layers.GlobalAveragePooling1D(name="gap_p")(av)
    q = layers.GlobalAveragePooling1D(name="gap_q")(b)
    c = layers.Dot(axes=-1, normalize=True, name="cosine")([p, q])
    h = layers.Concatenate(name="cat")([layers.Flatten(name="flat_d")(d),
                                       layers.Flatten(name="flat_e")(e), c])
    out = layers.Dense(10, activation="softmax", name="out")(h)
    return sparse_classifier(x, out, "merging")


def norms_acts():
    # issue 11: Softmax and LayerNormalization over other axes than the last
    # (the steps; steps and features together), UnitNormalization, PReLU
    # (alpha shared over the steps, and not), ActivityRegularization and
    # RepeatVector
    init = keras.initializers
    x = keras.Input((6, 8), name="seq")
    h = layers.Dense(8, name="dense")(x)
    a = layers.PReLU(alpha_initializer=init.Constant(0.25), shared_axes=[1],
                     name="prelu_shared")(h)
    b = layers.PReLU(alpha_initializer=init.RandomUniform(-0.5, 0.5), name="prelu")(x)
    s1 = layers.Softmax(axis=1, name="softmax_steps")(a)
    s2 = layers.Softmax(axis=[1, 2], name="softmax_both")(b)
    n1 = layers.LayerNormalization(axis=1, name="ln_steps")(h)
    n2 = layers.LayerNormalization(axis=[1, 2], name="ln_both")(a)
    u = layers.UnitNormalization(axis=1, name="unit_norm")(b)
    y = layers.Add(name="add")([s1, s2, n1, n2, u])
    y = layers.ActivityRegularization(l1=1e-3, l2=1e-2, name="activity_reg")(y)
    y = layers.GlobalAveragePooling1D(name="gap1d")(y)
    y = layers.RepeatVector(2, name="repeat")(y)
    y = layers.Flatten(name="flat")(y)
    out = layers.Dense(10, activation="softmax", name="out")(y)
    return sparse_classifier(x, out, "norms_acts")


def noise_norms():
    # issue 11: GroupNormalization on [b, t, c] and [b, h, w, c], between
    # the noise layers (which run_ref.py turns off: Keras's draws are not
    # kdcc's)
    x = keras.Input((6, 8), name="seq")
    h = layers.Dense(8, name="dense")(x)
    h = layers.GaussianNoise(0.3, name="gauss_noise")(h)
    h = layers.SpatialDropout1D(0.3, name="spatial1d")(h)
    h = layers.GroupNormalization(groups=4, name="group_norm")(h)
    h = layers.GaussianDropout(0.2, name="gauss_dropout")(h)
    h = layers.Reshape((6, 2, 4), name="reshape")(h)
    h = layers.SpatialDropout2D(0.25, name="spatial2d")(h)
    h = layers.GroupNormalization(groups=2, epsilon=1e-2, name="group_norm_2d")(h)
    h = layers.Flatten(name="flat")(h)
    out = layers.Dense(10, activation="softmax", name="out")(h)
    return sparse_classifier(x, out, "noise_norms")


def conv1d_family():
    # issue 11: DepthwiseConv1D, SeparableConv1D (strided) and Conv1DTranspose
    # ('same' strided, 'valid' with a stride over the kernel)
    x = keras.Input((10, 4), name="seq")
    y = layers.DepthwiseConv1D(3, depth_multiplier=2, padding="same", activation="relu",
                               name="depthwise_conv1d")(x)
    y = layers.SeparableConv1D(8, 3, depth_multiplier=2, strides=2, padding="same",
                               activation="relu", name="separable_conv1d")(y)
    y = layers.Conv1DTranspose(8, 3, strides=2, padding="same", activation="tanh",
                               name="conv1d_transpose")(y)
    y = layers.Conv1DTranspose(4, 2, strides=3, name="conv1d_transpose_1")(y)
    y = layers.Flatten(name="flat")(y)
    out = layers.Dense(10, activation="softmax", name="out")(y)
    return sparse_classifier(x, out, "conv1d_family")


def normalization():
    # issue 11: Normalization with its statistics in the config: over the
    # features, over the steps (invert), one scalar (axis None), and a [1, 8]
    # pair over steps and features (broadcast over the steps)
    x = keras.Input((5, 4), name="seq")
    a = layers.Normalization(mean=[0.5, -1.0, 2.0, 0.0], variance=[1.0, 4.0, 0.25, 2.0],
                             name="norm")(x)
    h = layers.Dense(8, name="dense")(a)
    b = layers.Normalization(axis=1, mean=[0.1, 0.2, 0.3, 0.4, 0.5],
                             variance=[1.0, 2.0, 3.0, 4.0, 5.0], invert=True,
                             name="norm_steps")(h)
    c = layers.Normalization(axis=None, mean=0.5, variance=2.0, name="norm_all")(b)
    d = layers.Normalization(axis=[1, 2], mean=[[0.1 * i for i in range(8)]],
                             variance=[[0.5 + i for i in range(8)]], name="norm_both")(c)
    y = layers.GlobalAveragePooling1D(name="gap1d")(d)
    out = layers.Dense(10, activation="softmax", name="out")(y)
    return sparse_classifier(x, out, "normalization")


# issue 25: adapted_norm's input features, far from mean 0 and variance 1
ADAPT_LOC, ADAPT_SCALE = (2.0, -1.0, 0.5, 4.0), (0.5, 2.0, 1.5, 1.0)


def adapted_norm():
    # issue 25: Normalization adapted to the training data (layer.adapt): its
    # mean, variance and count are weights, its config's mean and variance
    # null. On the input: over the features, over steps and features, over
    # the steps inverted, over everything (axis None); and one after a
    # Dense, adapted to that Dense's outputs at the start, so that the
    # gradient runs through it.
    data = fake_data(MODELS["adapted_norm"], 64)[0][0]  # run_ref.py's training data
    x = keras.Input((6, 4), name="seq")
    outs = []
    for name, axis, invert in (("norm", -1, False), ("norm_both", (1, 2), False),
                               ("norm_steps", 1, True), ("norm_all", None, False)):
        n = layers.Normalization(axis=axis, invert=invert, name=name)
        n.adapt(data)
        outs.append(n(x))
    h = layers.Concatenate(name="cat")(outs)
    h = layers.Dense(8, activation="tanh", name="dense")(h)
    n = layers.Normalization(name="norm_units")
    n.adapt(np.asarray(keras.Model(x, h)(data)))
    h = layers.Flatten(name="flatten")(n(h))
    out = layers.Dense(10, activation="softmax", name="out")(h)
    return sparse_classifier(x, out, "adapted_norm")


def transposed_op():
    # issue 11: output_padding: Conv2DTranspose 'same' (odd kernel) and
    # 'valid' (a stride over the kernel, each dim its own), Conv1DTranspose
    # 'same' with an even kernel
    img = keras.Input((5, 4, 3), name="image")
    seq = keras.Input((6, 3), name="seq")
    a = layers.Conv2DTranspose(8, 3, strides=2, padding="same", output_padding=1,
                               activation="relu", name="conv2d_transpose")(img)
    a = layers.Conv2DTranspose(4, (2, 3), strides=(3, 2), output_padding=(2, 1),
                               activation="tanh", name="conv2d_transpose_1")(a)
    a = layers.GlobalAveragePooling2D(name="gap2d")(a)
    b = layers.Conv1DTranspose(4, 4, strides=3, padding="same", output_padding=2,
                               activation="tanh", name="conv1d_transpose")(seq)
    b = layers.GlobalAveragePooling1D(name="gap1d")(b)
    h = layers.Concatenate(name="cat")([a, b])
    out = layers.Dense(10, activation="softmax", name="out")(h)
    return sparse_classifier([img, seq], out, "transposed_op")
def _rnn_text(name, rnn):
    """issue 11: a text classifier, Embedding -> rnn -> Dense."""
    x = keras.Input((10,), dtype="int32", name="tokens")
    e = layers.Embedding(32, 8, name="emb")(x)
    out = layers.Dense(10, activation="softmax", name="out")(rnn(e))
    return sparse_classifier(x, out, name)


def lstm_text():
    return _rnn_text("lstm_text", layers.LSTM(12, name="lstm"))


def gru_text():
    # reset_after, its [2, 3U] bias
    return _rnn_text("gru_text", layers.GRU(12, name="gru"))


def gru_v1_text():
    # reset_after=False: the reset gate before the recurrent kernel, a [3U] bias
    return _rnn_text("gru_v1_text", layers.GRU(12, reset_after=False, name="gru"))


def bilstm_text():
    # issue 11: a stacked Bidirectional LSTM returning sequences (concat),
    # then a Bidirectional GRU (mul) and one with its own backward_layer (ave)
    x = keras.Input((10,), dtype="int32", name="tokens")
    e = layers.Embedding(32, 8, name="emb")(x)
    h = layers.Bidirectional(layers.LSTM(8, return_sequences=True), name="bilstm")(e)
    a = layers.Bidirectional(layers.GRU(6), merge_mode="mul", name="bigru")(h)
    b = layers.Bidirectional(layers.LSTM(6, name="fwd"), merge_mode="ave", name="bilstm_1",
                             backward_layer=layers.LSTM(6, go_backwards=True, name="bwd"))(h)
    out = layers.Dense(10, activation="softmax", name="out")(layers.Concatenate(name="cat")([a, b]))
    return sparse_classifier(x, out, "bilstm_text")


def simple_rnn_seq():
    # issue 11: SimpleRNN returning sequences, then one going backwards
    x = keras.Input((8, 4), name="seq")
    h = layers.SimpleRNN(8, return_sequences=True, name="simple_rnn")(x)
    h = layers.SimpleRNN(8, go_backwards=True, activation="relu", name="simple_rnn_1")(h)
    out = layers.Dense(10, activation="softmax", name="out")(h)
    return sparse_classifier(x, out, "simple_rnn_seq")


def rope():
    # issue 24: keras_hub's RotaryEmbedding on heads [b, t, 4, 8] after a
    # projection, as Llama and Gemma turn query and key
    x = keras.Input((16, 32), name="x")
    h = layers.Dense(32, name="proj")(x)
    h = layers.Reshape((16, 4, 8), name="heads")(h)
    h = keras_hub.layers.RotaryEmbedding(max_wavelength=10000, name="rope")(h)
    h = layers.Reshape((16, 32), name="merge")(h)
    h = layers.Flatten(name="flat")(h)
    out = layers.Dense(8, name="out")(h)
    model = keras.Model(x, out, name="rope")
    model.compile(loss="mse", optimizer=keras.optimizers.Adam())
    return model


MESH_2x4 = {"shape": [2, 4], "axis_names": ["data", "model"]}
DP_8 = {"distribution": "DataParallel",
        "device_mesh": {"shape": [8], "axis_names": ["batch"]}}

def model_parallel(layout_map):
    """issue 11's ModelParallel specs: the (2,4) mesh, the batch over 'data'."""
    return {"distribution": "ModelParallel", "device_mesh": MESH_2x4,
            "batch_dim_name": "data", "layout_map": layout_map}


# name -> (builder, json written?, label kind, {dist file stem: spec})
MODELS = {
    "seed_mlp": dict(
        build=seed_mlp, labels="dense10", x=(28, 28, 1),
        dists={
            # As the distribution guide writes it: matches nothing (Sequential).
            "seed_mlp": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "d1/kernel": [None, "model"],
                    "d1/bias": ["model"],
                    "d2/output": ["data", None],
                },
            },
            # Real paths. d1 has no bias, so the bias key still matches nothing.
            "seed_mlp_fixed": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "sequential/d1/kernel": [None, "model"],
                    "sequential/d1/bias": ["model"],
                    "sequential/d2/output": ["data", None],
                },
            },
            # Regex keys that full-match both forms (Python-built and loaded).
            "seed_mlp_both": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "(sequential/)?d1/kernel": [None, "model"],
                    "(sequential/)?d2/output": ["data", None],
                },
            },
            "seed_mlp_dp": {
                "distribution": "DataParallel",
                "device_mesh": {"shape": [8], "axis_names": ["batch"]},
            },
        },
    ),
    "func_branches": dict(
        build=func_branches, labels="onehot4", x=(32,),
        dists={
            "func_branches": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "a/kernel": [None, "model"],
                    "b/kernel": [None, "model"],
                    "(a|b)/bias": ["model"],
                },
            },
        },
    ),
    "cnn": dict(
        build=cnn, labels="sparse10", x=(28, 28, 1),
        dists={
            "cnn": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "conv2d.*kernel": [None, None, None, "model"],
                    "conv2d.*bias": ["model"],
                    # dense kernel is (576, 10): 576 % 4 == 0, 10 % 4 != 0,
                    # so row-parallel is the valid choice.
                    "dense.*kernel": ["model", None],
                },
            },
            # Negative case: (576, 10) with dim 1 over model=4 does not divide.
            # Real Keras/JAX fails on it (error recorded in README.md); kdcc
            # must reject it at compile time naming layer "dense".
            "cnn_bad": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "conv2d.*kernel": [None, None, None, "model"],
                    "conv2d.*bias": ["model"],
                    "dense.*kernel": [None, "model"],
                },
            },
        },
    ),
    "megatron": dict(
        build=megatron, labels="onehot8", x=(64,),
        dists={
            "megatron": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "up/kernel": [None, "model"],
                    "up/bias": ["model"],
                    "down/kernel": ["model", None],
                },
            },
        },
    ),
    # Models with several inputs, several outputs, int inputs. "inputs":
    # (name, shape, "float" | vocabulary size for int32 ids), in model.inputs
    # order; "outputs": one label kind per output with a loss, in
    # model.outputs order (see fake_data).
    "wide_deep": dict(
        build=wide_deep, inputs=[("wide", (8,), "float"),
                                 ("deep", (16,), "float")],
        outputs=["sparse4"],
        dists={
            "wide_deep": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "deep_1/kernel": [None, "model"],
                    "deep_1/bias": ["model"],
                    # (24, 4): the concatenated [wide, deep_1] rows split
                    "out/kernel": ["model", None],
                },
            },
            "wide_deep_dp": DP_8,
        },
    ),
    "two_heads": dict(
        build=two_heads, inputs=[("x", (12,), "float")],
        outputs=["sparse3", "dense1"],
        dists={
            "two_heads": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "trunk/kernel": [None, "model"],
                    "trunk/bias": ["model"],
                    "head_(a|b)/kernel": ["model", None],
                },
            },
            "two_heads_dp": DP_8,
        },
    ),
    "metrics": dict(
        build=metrics, inputs=[("x", (12,), "float")],
        outputs=["sparse5", "dense3", "binary1"],
        dists={
            "metrics": model_parallel({
                "trunk/kernel": [None, "model"],
                "trunk/bias": ["model"],
                "(cls|reg|bin)/kernel": ["model", None],
            }),
            "metrics_dp": DP_8,
        },
    ),
    "int_tokens": dict(
        build=int_tokens, inputs=[("tokens", (6,), 32)],
        outputs=["sparse4"],
        dists={
            # vocabulary rows split over 'model'
            "int_tokens": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "emb/embeddings": ["model", None],
                    "out/kernel": ["model", None],
                },
            },
            # embedding columns split over 'model'
            "int_tokens_dim": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "emb/embeddings": [None, "model"],
                },
            },
            "int_tokens_dp": DP_8,
        },
    ),
    "per_token": dict(
        build=per_token, inputs=[("tokens", (8,), 32)],
        outputs=["sparse32x8"],
        dists={
            # the logits' class dimension (32) split over 'model'
            "per_token": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "hidden/kernel": [None, "model"],
                    "hidden/bias": ["model"],
                    "logits/kernel": [None, "model"],
                    "logits/bias": ["model"],
                },
            },
            "per_token_dp": DP_8,
        },
    ),
    "shared_dense": dict(
        build=shared_dense, inputs=[("a", (10,), "float"),
                                    ("b", (10,), "float")],
        outputs=["dense1"],
        dists={
            "shared_dense": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "shared/kernel": [None, "model"],
                    "shared/bias": ["model"],
                },
            },
            "shared_dense_dp": DP_8,
        },
    ),
    # Transformers. Megatron-style (2,4) specs: attention heads split over
    # 'model' (Keras MHA kernels: query/key/value (hidden, heads, head_dim),
    # their biases (heads, head_dim), attention_output (heads, head_dim,
    # hidden)), MLP up/gate column-parallel, down row-parallel.
    "text_cls": dict(
        build=text_cls, inputs=[("tokens", (16,), 64)],
        outputs=["sparse4"],
        dists={
            "text_cls": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "mha/(query|key|value)/kernel": [None, "model", None],
                    "mha/(query|key|value)/bias": ["model", None],
                    "mha/attention_output/kernel": ["model", None, None],
                },
            },
            "text_cls_dp": DP_8,
        },
    ),
    "gpt": dict(
        build=gpt, inputs=[("tokens", (16,), 64)],
        outputs=["next64x16"],
        dists={
            "gpt": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "b\\d_attn/(query|key|value)/kernel": [None, "model", None],
                    "b\\d_attn/(query|key|value)/bias": ["model", None],
                    "b\\d_attn/attention_output/kernel": ["model", None, None],
                    "b\\d_up/kernel": [None, "model"],
                    "b\\d_up/bias": ["model"],
                    "b\\d_down/kernel": ["model", None],
                },
            },
            # keras-hub (Gemma) style: every matrix sharded over both axes
            # (FSDP over 'data' as well as tensor parallel over 'model');
            # norms, biases and the position table replicated.
            "gpt_fsdp": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "tok/embeddings": ["model", "data"],
                    "b\\d_attn/(query|key|value)/kernel": ["data", "model", None],
                    "b\\d_attn/attention_output/kernel": ["model", None, "data"],
                    "b\\d_up/kernel": ["data", "model"],
                    "b\\d_down/kernel": ["model", "data"],
                },
            },
            "gpt_dp": DP_8,
        },
    ),
    "vit": dict(
        build=vit, inputs=[("image", (28, 28, 1), "float")],
        outputs=["sparse10"],
        dists={
            "vit": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "attn/(query|key|value)/kernel": [None, "model", None],
                    "attn/(query|key|value)/bias": ["model", None],
                    "attn/attention_output/kernel": ["model", None, None],
                    "up/kernel": [None, "model"],
                    "up/bias": ["model"],
                    "down/kernel": ["model", None],
                },
            },
            "vit_dp": DP_8,
        },
    ),
    "llama": dict(
        build=llama, inputs=[("tokens", (16,), 64)],
        outputs=["next64x16"],
        dists={
            # 4 query heads split over 'model' (4); the 2 key/value heads do
            # not divide by 4, so key/value stay replicated (as Megatron does
            # when kv heads < tensor-parallel size).
            "llama": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "attn/query/kernel": [None, "model", None],
                    "attn/query/bias": ["model", None],
                    "attn/attention_output/kernel": ["model", None, None],
                    "(gate|up)/kernel": [None, "model"],
                    "down/kernel": ["model", None],
                },
            },
            "llama_dp": DP_8,
        },
    ),
    "wide_mlp": dict(
        build=wide_mlp, labels="sparse10", x=(1024,), large=True,
        dists={
            "wide_mlp": {"distribution": "DataParallel", "devices": 1},
        },
    ),
    "einsum": dict(
        build=einsum, inputs=[("x", (6, 8), "float")], outputs=["dense4"],
        dists={
            # heads (e1), rows (e2, e7), a batch dim of the contraction
            # (e4), kernel columns (e3, e6) and a transposed kernel's free
            # dim (e5) split over 'model'
            "einsum": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "e1/kernel": [None, "model", None],
                    "e1/bias": ["model", None],
                    "e2/kernel": ["model", None, None],
                    "e3/kernel": [None, "model"],
                    "e3/bias": ["model", None],
                    "e4/kernel": ["model", None, None],
                    "e5/kernel": ["model", None],
                    "e6/kernel": [None, "model"],
                    "e7/kernel": ["model", None],
                },
            },
            "einsum_dp": DP_8,
        },
    ),
    "rev_emb": dict(
        build=rev_emb, inputs=[("tokens", (16,), 64)],
        outputs=["next64x16"],
        dists={
            # the tables split on the vocabulary (the logits' class dim
            # split), the untied reverse table on its columns
            "rev_emb": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "tok/embeddings": ["model", None],
                    "tok2/embeddings": ["model", None],
                    "tok2/reverse_embeddings": [None, "model"],
                    "mlp/kernel": [None, "model"],
                },
            },
            "rev_emb_dp": DP_8,
        },
    ),
    "attn_mask": dict(
        build=attn_mask, inputs=[("tokens", (16,), 64), ("mask", (16, 16), 2)],
        outputs=["next64x16"],
        dists={
            # heads split over 'model' (Megatron): the mask is the same for
            # every head, so it stays whole on 'model'
            "attn_mask": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "(mha|gqa)/query/kernel": [None, "model", None],
                    "(mha|gqa)/query/bias": ["model", None],
                    "mha/(key|value)/kernel": [None, "model", None],
                    "mha/(key|value)/bias": ["model", None],
                    "(mha|gqa)/attention_output/kernel": ["model", None, None],
                },
            },
            "attn_mask_dp": DP_8,
        },
    ),
    "bn_cnn": dict(
        build=bn_cnn, labels="sparse10", x=(8, 8, 3),
        dists={
            "bn_cnn": {
                "distribution": "ModelParallel",
                "device_mesh": MESH_2x4,
                "batch_dim_name": "data",
                "layout_map": {
                    "conv2d.*kernel": [None, None, None, "model"],
                    "conv2d.*bias": ["model"],
                },
            },
            "bn_cnn_dp": {
                "distribution": "DataParallel",
                "device_mesh": {"shape": [8], "axis_names": ["batch"]},
            },
        },
    ),
    "regularized": dict(
        build=regularized, inputs=[("image", (8, 8, 3), "float"), ("tokens", (6,), 20)],
        outputs=["sparse10"],
        dists={
            # the regularized variables split over 'model' (channels, columns)
            "regularized": model_parallel({
                "conv2d/kernel": [None, None, None, "model"],
                "conv2d/bias": ["model"],
                "emb/embeddings": [None, "model"],
                "hidden/kernel": [None, "model"],
                "hidden/bias": ["model"],
                "out/kernel": ["model", None],
            }),
            "regularized_dp": DP_8,
        },
    ),
    "frozen": dict(
        build=frozen, labels="sparse10", x=(8, 8, 3),
        dists={
            "frozen": model_parallel({
                "conv2d.*/kernel": [None, None, None, "model"],
                "conv2d/bias": ["model"],
                "batch_normalization.*/(gamma|beta|moving_mean|moving_variance)": ["model"],
                "hidden/kernel": [None, "model"],
            }),
            "frozen_dp": DP_8,
        },
    ),
    "nested": dict(
        build=nested, labels="sparse10", x=(8, 8, 3),
        dists={
            # the LayoutMap reaches into the nested models' variables
            "nested": model_parallel({
                "backbone/conv2d/kernel": [None, None, None, "model"],
                "backbone/conv2d/bias": ["model"],
                "backbone/dense/kernel": ["model", None],
                "proj/kernel": [None, "model"],
                "proj/bias": ["model"],
            }),
            "nested_dp": DP_8,
        },
    ),
    "nested_frozen": dict(
        build=nested_frozen, labels="sparse10", x=(8, 8, 3),
        dists={
            "nested_frozen": model_parallel({
                "backbone/conv2d/kernel": [None, None, None, "model"],
                "backbone/batch_normalization/(gamma|beta|moving_mean|moving_variance)": [
                    "model"],
                "finetune/out/kernel": ["model", None],
            }),
        },
    ),
    "conv1d": dict(
        build=conv1d, labels="sparse10", x=(12, 4),
        dists={
            # output channels split, then input channels (a partial sum)
            "conv1d": model_parallel({
                "conv1d/kernel": [None, None, "model"],
                "conv1d/bias": ["model"],
                "conv1d_1/kernel": [None, "model", None],
                "conv1d_2/kernel": [None, None, "model"],
            }),
            "conv1d_dp": DP_8,
        },
    ),
    "dilated": dict(
        build=dilated, inputs=[("image", (9, 8, 3), "float"), ("seq", (10, 3), "float")],
        outputs=["sparse10"],
        dists={
            # output channels split, then input channels (partial sums)
            "dilated": model_parallel({
                "conv2d/kernel": [None, None, None, "model"],
                "conv2d_1/kernel": [None, None, "model", None],
                "conv1d/kernel": [None, None, "model"],
                "conv1d_1/kernel": [None, "model", None],
            }),
            "dilated_dp": DP_8,
        },
    ),
    "grouped": dict(
        build=grouped, labels="sparse10", x=(8, 8, 4),
        dists={
            # DataParallel only: XLA (jax 0.10.2) aborts on a grouped
            # convolution under the (2,4) mesh, whatever the layout
            # (convolution_handler.cc: new_input_batch_size %
            # new_output_batch_size); kdcc's split filters are checked by
            # mesh_equiv.sh
            "grouped_dp": DP_8,
        },
    ),
    # issue 11: the losses; heads split on their inputs (a partial sum
    # before the loss) or on their classes (gathered for the loss)
    "loss_reg": dict(
        build=loss_reg, inputs=[("x", (12,), "float")],
        outputs=["dense3", "dense3", "counts3", "positive4", "positive2", "positive2", "prob4"],
        dists={
            "loss_reg": model_parallel({
                "trunk/kernel": [None, "model"],
                "trunk/bias": ["model"],
                "(huber|log_cosh|poisson|mape|msle)/kernel": ["model", None],
                "(cosine|kld)/kernel": [None, "model"],
                "(cosine|kld)/bias": ["model"],
            }),
            "loss_reg_dp": DP_8,
        },
    ),
    "loss_cls": dict(
        build=loss_cls, inputs=[("x", (12,), "float")],
        outputs=["hingemix3", "pmone3", "onehot4", "onehot4", "onehot4", "binary2", "binary2"],
        dists={
            "loss_cls": model_parallel({
                "trunk/kernel": [None, "model"],
                "trunk/bias": ["model"],
                "(hinge|sq_hinge|bce_ls|bce_ls_logits)/kernel": ["model", None],
                "(cat_hinge|cce_ls|cce_ls_logits)/kernel": [None, "model"],
                "(cat_hinge|cce_ls|cce_ls_logits)/bias": ["model"],
            }),
            "loss_cls_dp": DP_8,
        },
    ),
    "transposed": dict(
        build=transposed, labels="sparse10", x=(6, 5, 3),
        dists={
            # the first kernel's filters split, the second's input channels
            # (a partial sum)
            "transposed": model_parallel({
                "conv2d_transpose/kernel": [None, None, "model", None],
                "conv2d_transpose/bias": ["model"],
                "conv2d_transpose_1/kernel": [None, None, None, "model"],
            }),
            "transposed_dp": DP_8,
        },
    ),
    "lenet": dict(
        build=lenet, labels="sparse10", x=(28, 28, 1),
        dists={
            # c3's 16 filters split over 'model' (c1's 6 do not divide by
            # 4), f5's columns and f6's rows (Megatron's pair)
            "lenet": model_parallel({
                "c3/kernel": [None, None, None, "model"],
                "c3/bias": ["model"],
                "f5/kernel": [None, "model"],
                "f5/bias": ["model"],
                "f6/kernel": ["model", None],
            }),
            "lenet_dp": DP_8,
        },
    ),
    "mobilenet": dict(
        build=mobilenet, labels="sparse10", x=(16, 16, 3),
        dists={
            # DataParallel in Keras: XLA aborts on a depthwise convolution
            # under the (2,4) mesh (see grouped); kdcc's split channels are
            # checked against these numbers (run_ref.py's DERIVED_CASES)
            "mobilenet_dp": DP_8,
        },
    ),
    "activations": dict(
        build=activations, labels="sparse10", x=(12,),
        dists={
            # Megatron pairs: each activation on column shards, then rows
            "activations": model_parallel({
                "d(1|3|5)/kernel": [None, "model"],
                "d(1|3|5)/bias": ["model"],
                "d(2|4|6)/kernel": ["model", None],
            }),
            "activations_dp": DP_8,
        },
    ),
    "glu": dict(
        build=glu, labels="sparse10", x=(12,),
        dists={
            # d2's units split: its glu needs them whole (an all-gather)
            "glu": model_parallel({"d(1|2)/kernel": [None, "model"],
                                   "d(1|2)/bias": ["model"]}),
        },
    ),
    "merging": dict(
        build=merging, labels="sparse10", x=(6, 4),
        dists={
            # the branches' units split: the merges elementwise on split
            # features, the Dots contracting them (partial sums)
            "merging": model_parallel({
                "dense_a/kernel": [None, "model"],
                "dense_a/bias": ["model"],
                "dense_b/kernel": [None, "model"],
                "dense_b/bias": ["model"],
            }),
            "merging_dp": DP_8,
        },
    ),
    "norms_acts": dict(
        build=norms_acts, labels="sparse10", x=(6, 8),
        dists={
            # the features split: the steps' softmax and norms local, the
            # [steps, features] ones gathered; PReLU's alpha split with them
            "norms_acts": model_parallel({
                "dense/kernel": [None, "model"],
                "dense/bias": ["model"],
                "prelu_shared/alpha": [None, "model"],
                "prelu/alpha": [None, "model"],
                "out/kernel": ["model", None],
            }),
            "norms_acts_dp": DP_8,
        },
    ),
    "noise_norms": dict(
        build=noise_norms, labels="sparse10", x=(6, 8),
        dists={
            # the channels split, and with them the groups
            "noise_norms": model_parallel({
                "dense/kernel": [None, "model"],
                "dense/bias": ["model"],
                "group_norm/gamma": ["model"],
                "group_norm/beta": ["model"],
            }),
            "noise_norms_dp": DP_8,
        },
    ),
    "conv1d_family": dict(
        build=conv1d_family, labels="sparse10", x=(10, 4),
        dists={
            # the pointwise kernel's filters split, the first transpose's
            # filters, then the second's input channels (a partial sum)
            "conv1d_family": model_parallel({
                "separable_conv1d/pointwise_kernel": [None, None, "model"],
                "separable_conv1d/bias": ["model"],
                "conv1d_transpose/kernel": [None, "model", None],
                "conv1d_transpose/bias": ["model"],
                "conv1d_transpose_1/kernel": [None, None, "model"],
            }),
            "conv1d_family_dp": DP_8,
        },
    ),
    "normalization": dict(
        build=normalization, labels="sparse10", x=(5, 4),
        dists={
            # the features split: the constants sliced to each device's block
            "normalization": model_parallel({
                "dense/kernel": [None, "model"],
                "dense/bias": ["model"],
                "out/kernel": ["model", None],
            }),
            "normalization_dp": DP_8,
        },
    ),
    "adapted_norm": dict(
        build=adapted_norm, inputs=[("seq", (6, 4), ("float", ADAPT_LOC, ADAPT_SCALE))],
        outputs=["sparse10"],
        dists={
            # the statistics split as the dims they scale (norm_steps's steps
            # over 'data'); count, a scalar, replicated
            "adapted_norm": model_parallel({
                "norm/(mean|variance)": ["model"],
                "norm_both/(mean|variance)": [None, "model"],
                "norm_steps/(mean|variance)": ["data"],
                "dense/kernel": [None, "model"],
                "dense/bias": ["model"],
                "norm_units/(mean|variance)": ["model"],
                "out/kernel": ["model", None],
            }),
            "adapted_norm_dp": DP_8,
        },
    ),
    "transposed_op": dict(
        build=transposed_op,
        inputs=[("image", (5, 4, 3), "float"), ("seq", (6, 3), "float")],
        outputs=["sparse10"],
        dists={
            # the first kernel's filters split, the second's input channels
            # (a partial sum), the 1-D one's filters
            "transposed_op": model_parallel({
                "conv2d_transpose/kernel": [None, None, "model", None],
                "conv2d_transpose/bias": ["model"],
                "conv2d_transpose_1/kernel": [None, None, None, "model"],
                "conv1d_transpose/kernel": [None, "model", None],
                "conv1d_transpose/bias": ["model"],
            }),
            "transposed_op_dp": DP_8,
        },
    ),
    # issue 11: recurrent layers; the LSTM's kernels split on their units
    # (the recurrence gathers them: kdcc's RECUR needs them whole)
    "lstm_text": dict(
        build=lstm_text, inputs=[("tokens", (10,), 32)], outputs=["sparse10"],
        dists={
            "lstm_text": model_parallel({
                "lstm/lstm_cell/kernel": [None, "model"],
                "lstm/lstm_cell/recurrent_kernel": [None, "model"],
                "lstm/lstm_cell/bias": ["model"],
            }),
            "lstm_text_dp": DP_8,
        },
    ),
    "gru_text": dict(
        build=gru_text, inputs=[("tokens", (10,), 32)], outputs=["sparse10"],
        dists={"gru_text_dp": DP_8},
    ),
    "gru_v1_text": dict(
        build=gru_v1_text, inputs=[("tokens", (10,), 32)], outputs=["sparse10"],
        dists={"gru_v1_text_dp": DP_8},
    ),
    "bilstm_text": dict(
        build=bilstm_text, inputs=[("tokens", (10,), 32)], outputs=["sparse10"],
        dists={"bilstm_text_dp": DP_8},
    ),
    "simple_rnn_seq": dict(
        build=simple_rnn_seq, labels="sparse10", x=(8, 4),
        dists={"simple_rnn_seq_dp": DP_8},
    ),
    "constrained": dict(
        build=constrained, labels="sparse10", x=(8, 8, 3),
        dists={
            # the filters split over 'model' (their norms local), the hidden
            # kernel's rows (its norms' sums partial, all-reduced)
            "constrained": model_parallel({
                "conv2d/kernel": [None, None, None, "model"],
                "conv2d/bias": ["model"],
                "hidden/kernel": ["model", None],
                "hidden/bias": ["model"],
                "out/kernel": ["model", None],
            }),
            "constrained_dp": DP_8,
        },
    ),
    "rope": dict(
        build=rope, inputs=[("x", (16, 32), "float")], outputs=["dense8"],
        dists={
            # the projection's columns split over 'model' (a head a device,
            # turned where it is), the output's rows (a partial sum)
            "rope": model_parallel({
                "proj/kernel": [None, "model"],
                "out/kernel": ["model", None],
            }),
            "rope_dp": DP_8,
        },
    ),
}

MODELS.update({
    "opt_" + case: dict(build=opt_mlp("opt_" + case, opt), labels="sparse10", x=(12,),
                        dists={case: model_parallel(OPT_MP),
                               **({"global_clipnorm_dp": DP_8} if case == "global_clipnorm"
                                  else {})})
    for case, opt in OPT_CASES.items()})

# issue 23: mixed precision. Models built under a Keras dtype policy
# (keras.mixed_precision.set_global_policy), so that every layer's config
# carries it (the InputLayers keep float32 / int32), compiled again without
# metrics (a 16-bit rounding may flip an argmax, which no loss tolerance
# absorbs). "float32_twin" builds the same model under float32: run_ref.py
# trains it from the mixed model's initial weights, to show how far the
# rounding moves the losses.


def mixed_mlp():
    x = keras.Input((12,), name="features")
    h = layers.Dense(64, activation="relu", name="d1")(x)
    h = layers.Dropout(0.1, name="drop")(h)
    h = layers.Dense(64, activation="gelu", name="d2")(h)
    out = layers.Dense(10, name="logits")(h)
    model = keras.Model(x, out, name="mixed_mlp")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.Adam())
    return model


def under_policy(build, policy, opt=None):
    """build, under the global dtype policy `policy`, compiled with its loss
    and a fresh Adam (or opt()), no metrics (an empty list: None would keep
    build's)."""
    def built():
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = build()
        finally:
            keras.mixed_precision.set_global_policy("float32")
        model.compile(loss=model.loss, optimizer=opt() if opt else keras.optimizers.Adam(),
                      metrics=[])
        return model
    return built


# issue 23: mixed_float16. compile wraps the optimizer in a LossScaleOptimizer
# (initial_scale 2^15, dynamic_growth_steps 2000) because the model's own
# policy is mixed_float16 (built under the global policy); the saved
# compile_config holds plain Adam. MSE on dense labels, the third batch's
# labels 1000 times the others (label_scale: rows 32..47): its float16
# gradients at the logits overflow, so Keras skips that step and halves
# the scale, each epoch. mixed_f16_growth is compiled with a
# LossScaleOptimizer of its own (in the compile_config), growing the scale
# after 3 finite steps: halved, doubled and halved again in 8 steps.
# mixed_f16_bn_cnn: the batch-norm CNN, whose gradients overflow without help.


def mixed_f16_mlp():
    x = keras.Input((12,), name="features")
    h = layers.Dense(64, activation="relu", name="d1")(x)
    h = layers.Dense(64, activation="gelu", name="d2")(h)
    out = layers.Dense(10, name="out")(h)
    model = keras.Model(x, out, name="mixed_f16_mlp")
    model.compile(loss="mse", optimizer=keras.optimizers.Adam())
    return model


def mixed_f16_growth():
    model = under_policy(mixed_f16_mlp, "mixed_float16")()
    model.compile(loss="mse", metrics=[], optimizer=keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(), initial_scale=2.0 ** 15, dynamic_growth_steps=3))
    return model


F16_MP = {"d1/kernel": [None, "model"], "d1/bias": ["model"], "d2/kernel": ["model", None]}


# issue 23: the pure bfloat16 policy: variables (and the optimizer's slots)
# in bfloat16, updated in bfloat16. Keras's default Adam does not train
# such a model at all (beta_2 = 0.999 is 1.0 in bfloat16, so its step
# size is 0), so bf16_mlp and bf16_cnn train with SGD and momentum,
# bf16_adam_mlp, bf16_bn_cnn and bf16_gpt with Adam(beta_2=0.99), a rate large enough to
# move bfloat16 weights. Their
# twins, from the same weights: float32 and mixed_bfloat16 (float32
# variables), which kdcc's run must be away from (compare_ref.py).


def bf16_with(model_fn, opt):
    """model_fn's model under bfloat16, compiled with its loss and opt(), no
    metrics, with its float32 and mixed_bfloat16 twins."""
    return {key: under_policy(model_fn, policy, opt) for key, policy in
            (("build", "bfloat16"), ("float32_twin", "float32"),
             ("mixed_twin", "mixed_bfloat16"))}


def bf16_sgd():
    return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)


def bf16_adam():
    return keras.optimizers.Adam(learning_rate=0.01, beta_2=0.99)


# issue 23: the other optimizers and the clippings on bfloat16 (and float16)
# variables, in their dtype: RMSprop (centered, with momentum) clipped by
# clipnorm, Nadam by global_clipnorm, Adamax by clipvalue with regularizers
# and constraints on the 16-bit variables, Lion, and Adagrad under float16.
# Rates large enough to move 16-bit weights; Nadam's and Adamax's beta_2 as
# Keras's default would be 1.0 in bfloat16 (Nadam's v_hat 0 / 0).


def bf16_rmsprop():
    return keras.optimizers.RMSprop(learning_rate=0.01, momentum=0.5, centered=True,
                                    clipnorm=1.0)


def bf16_nadam():
    return keras.optimizers.Nadam(learning_rate=0.01, beta_2=0.99, global_clipnorm=1.0)


def bf16_adamax():
    return keras.optimizers.Adamax(learning_rate=0.01, beta_2=0.99, clipvalue=0.05)


def bf16_lion():
    return keras.optimizers.Lion(learning_rate=3e-3)


def f16_adagrad():
    return keras.optimizers.Adagrad(learning_rate=0.05)


def reg_mlp():
    """mixed_mlp with L2/L1/L1L2 regularizers and MaxNorm/NonNeg/MinMaxNorm
    constraints (d2's kernel split on the summed dim under MP16)."""
    reg, con = keras.regularizers, keras.constraints
    x = keras.Input((12,), name="features")
    h = layers.Dense(64, activation="relu", kernel_regularizer=reg.L2(1e-2),
                     bias_regularizer=reg.L1(1e-3), name="d1")(x)
    h = layers.Dense(64, activation="gelu", kernel_constraint=con.MaxNorm(0.6, axis=0),
                     bias_constraint=con.NonNeg(), kernel_regularizer=reg.L1L2(1e-3, 1e-2),
                     name="d2")(h)
    out = layers.Dense(10, kernel_constraint=con.MinMaxNorm(0.2, 0.5, rate=0.5, axis=0),
                       name="logits")(h)
    model = keras.Model(x, out, name="reg_mlp")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.Adam())
    return model


def unit_act_mlp():
    """mixed_mlp with an L1L2 activity regularizer on d1's output (split on
    its features under MP16) and UnitNorm on d2's kernel (over its summed
    dim, split under MP16)."""
    x = keras.Input((12,), name="features")
    h = layers.Dense(64, activation="relu", name="d1",
                     activity_regularizer=keras.regularizers.L1L2(1e-3, 1e-2))(x)
    h = layers.Dense(64, activation="gelu", name="d2",
                     kernel_constraint=keras.constraints.UnitNorm(axis=0))(h)
    out = layers.Dense(10, name="logits")(h)
    model = keras.Model(x, out, name="unit_act_mlp")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.Adam())
    return model


MP16 = model_parallel(F16_MP)

MODELS.update({
    "mixed_mlp": dict(
        build=under_policy(mixed_mlp, "mixed_bfloat16"),
        float32_twin=under_policy(mixed_mlp, "float32"), labels="sparse10", x=(12,),
        dists={"mixed_mlp": model_parallel({"d1/kernel": [None, "model"], "d1/bias": ["model"],
                                            "d2/kernel": ["model", None]}),
               "mixed_mlp_dp": DP_8}),
    "mixed_gpt": dict(
        build=under_policy(gpt, "mixed_bfloat16"), float32_twin=under_policy(gpt, "float32"),
        inputs=[("tokens", (16,), 64)], outputs=["next64x16"],
        dists={"mixed_gpt": MODELS["gpt"]["dists"]["gpt"], "mixed_gpt_dp": DP_8}),
    "mixed_bn_cnn": dict(
        build=under_policy(bn_cnn, "mixed_bfloat16"),
        float32_twin=under_policy(bn_cnn, "float32"), labels="sparse10", x=(8, 8, 3),
        dists={"mixed_bn_cnn": MODELS["bn_cnn"]["dists"]["bn_cnn"], "mixed_bn_cnn_dp": DP_8}),
    "bf16_mlp": dict(
        **bf16_with(mixed_mlp, bf16_sgd), labels="sparse10", x=(12,),
        dists={"bf16_mlp": model_parallel({"d1/kernel": [None, "model"], "d1/bias": ["model"],
                                           "d2/kernel": ["model", None]}),
               "bf16_mlp_dp": DP_8}),
    "bf16_adam_mlp": dict(
        **bf16_with(mixed_mlp, bf16_adam), labels="sparse10", x=(12,),
        dists={"bf16_adam_mlp": model_parallel({"d1/kernel": [None, "model"],
                                                "d1/bias": ["model"],
                                                "d2/kernel": ["model", None]}),
               "bf16_adam_mlp_dp": DP_8}),
    "bf16_cnn": dict(
        **bf16_with(cnn, bf16_sgd), labels="sparse10", x=(28, 28, 1),
        dists={"bf16_cnn": MODELS["cnn"]["dists"]["cnn"], "bf16_cnn_dp": DP_8}),
    "bf16_bn_cnn": dict(
        **bf16_with(bn_cnn, bf16_adam), labels="sparse10", x=(8, 8, 3),
        dists={"bf16_bn_cnn": MODELS["bn_cnn"]["dists"]["bn_cnn"], "bf16_bn_cnn_dp": DP_8}),
    "bf16_gpt": dict(
        **bf16_with(gpt, bf16_adam), inputs=[("tokens", (16,), 64)], outputs=["next64x16"],
        dists={"bf16_gpt": MODELS["gpt"]["dists"]["gpt"], "bf16_gpt_dp": DP_8}),
    "bf16_rmsprop_mlp": dict(
        **bf16_with(mixed_mlp, bf16_rmsprop), labels="sparse10", x=(12,),
        dists={"bf16_rmsprop_mlp": MP16, "bf16_rmsprop_mlp_dp": DP_8}),
    "bf16_nadam_mlp": dict(
        **bf16_with(mixed_mlp, bf16_nadam), labels="sparse10", x=(12,),
        dists={"bf16_nadam_mlp": MP16, "bf16_nadam_mlp_dp": DP_8}),
    "bf16_adamax_reg": dict(
        **bf16_with(reg_mlp, bf16_adamax), labels="sparse10", x=(12,),
        dists={"bf16_adamax_reg": MP16, "bf16_adamax_reg_dp": DP_8}),
    "bf16_unit_act": dict(
        **bf16_with(unit_act_mlp, bf16_adam), labels="sparse10", x=(12,),
        dists={"bf16_unit_act": MP16, "bf16_unit_act_dp": DP_8}),
    "bf16_lion_mlp": dict(
        **bf16_with(mixed_mlp, bf16_lion), labels="sparse10", x=(12,),
        dists={"bf16_lion_mlp": MP16, "bf16_lion_mlp_dp": DP_8}),
    "f16_adagrad_mlp": dict(
        build=under_policy(mixed_mlp, "float16", f16_adagrad),
        float32_twin=under_policy(mixed_mlp, "float32", f16_adagrad),
        mixed_twin=under_policy(mixed_mlp, "mixed_float16", f16_adagrad), labels="sparse10",
        x=(12,), dists={"f16_adagrad_mlp": model_parallel(F16_MP), "f16_adagrad_mlp_dp": DP_8}),
    # float16: Keras's compile wraps no LossScaleOptimizer (that is mixed_float16's)
    "f16_mlp": dict(
        build=under_policy(mixed_mlp, "float16", bf16_sgd),
        float32_twin=under_policy(mixed_mlp, "float32", bf16_sgd),
        mixed_twin=under_policy(mixed_mlp, "mixed_float16", bf16_sgd), labels="sparse10",
        x=(12,), dists={"f16_mlp": model_parallel(F16_MP), "f16_mlp_dp": DP_8}),
    "f16_bn_cnn": dict(
        build=under_policy(bn_cnn, "float16", bf16_sgd),
        float32_twin=under_policy(bn_cnn, "float32", bf16_sgd),
        mixed_twin=under_policy(bn_cnn, "mixed_float16", bf16_sgd), labels="sparse10",
        x=(8, 8, 3), dists={"f16_bn_cnn": MODELS["bn_cnn"]["dists"]["bn_cnn"],
                            "f16_bn_cnn_dp": DP_8}),
    "mixed_f16_mlp": dict(
        build=under_policy(mixed_f16_mlp, "mixed_float16"),
        float32_twin=under_policy(mixed_f16_mlp, "float32"), labels="dense10", x=(12,),
        label_scale=(slice(32, 48), 1000.0),
        dists={"mixed_f16_mlp": model_parallel(F16_MP), "mixed_f16_mlp_dp": DP_8}),
    "mixed_f16_growth": dict(
        build=mixed_f16_growth, float32_twin=under_policy(mixed_f16_mlp, "float32"),
        labels="dense10", x=(12,), label_scale=(slice(32, 48), 1000.0),
        dists={"mixed_f16_growth_dp": DP_8}),
    # the batch-norm CNN, whose float16 gradients overflow at 2^15 of themselves
    # (steps 1, 2 and 6): skipped steps with moving statistics still moving
    "mixed_f16_bn_cnn": dict(
        build=under_policy(bn_cnn, "mixed_float16"),
        float32_twin=under_policy(bn_cnn, "float32"), labels="sparse10", x=(8, 8, 3),
        dists={"mixed_f16_bn_cnn": MODELS["bn_cnn"]["dists"]["bn_cnn"],
               "mixed_f16_bn_cnn_dp": DP_8}),
})

# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def renumber_shared_ids(obj):
    """Replace Keras' id()-based shared_object_id values by 1, 2, ... ."""
    mapping = {}

    def walk(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "shared_object_id":
                    o[k] = mapping.setdefault(v, len(mapping) + 1)
                else:
                    walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    obj = copy.deepcopy(obj)
    walk(obj)
    return obj


def dump(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def save_archive(model, path, write_archive):
    """model.save() to memory; return the (renumbered) config.json dict and
    write the archive with fixed dates and the renumbered config."""
    with tempfile.TemporaryDirectory() as d:
        tmp = os.path.join(d, "m.keras")
        model.save(tmp)
        with zipfile.ZipFile(tmp) as z:
            members = [(i, z.read(i.filename)) for i in z.infolist()]
    members = dict((i.filename, (i, data)) for i, data in members)
    config = renumber_shared_ids(json.loads(members["config.json"][1]))
    meta = json.loads(members["metadata.json"][1])
    meta["date_saved"] = FIXED_DATE
    if write_archive:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, (info, data) in members.items():
                if name == "config.json":
                    data = json.dumps(config).encode()  # Keras writes it compact
                elif name == "metadata.json":
                    data = json.dumps(meta).encode()
                zi = zipfile.ZipInfo(name, date_time=ZIP_DATE)
                zi.compress_type = info.compress_type
                zi.external_attr = info.external_attr
                z.writestr(zi, data)
        with open(path, "wb") as f:
            f.write(buf.getvalue())
    return config


# ---------------------------------------------------------------------------
# Verification against keras.distribution
# ---------------------------------------------------------------------------


def make_distribution(spec):
    dist = keras.distribution
    devices = dist.list_devices()
    if spec["distribution"] == "DataParallel":
        if "device_mesh" in spec:
            m = spec["device_mesh"]
            n = int(np.prod(m["shape"]))
            mesh = dist.DeviceMesh(tuple(m["shape"]), m["axis_names"],
                                   devices[:n])
            return dist.DataParallel(device_mesh=mesh)
        return dist.DataParallel(devices=devices[: spec.get("devices",
                                                             len(devices))])
    m = spec["device_mesh"]
    n = int(np.prod(m["shape"]))
    mesh = dist.DeviceMesh(tuple(m["shape"]), m["axis_names"], devices[:n])
    lm = dist.LayoutMap(mesh)
    for k, v in spec["layout_map"].items():
        lm[k] = tuple(v)  # LayoutMap accepts tuples, not lists
    return dist.ModelParallel(layout_map=lm,
                              batch_dim_name=spec.get("batch_dim_name"))


def spec_of(array):
    """Per-dimension mesh axis (or None) of a jax array's NamedSharding."""
    sh = array.sharding
    rank = len(array.shape)
    if isinstance(sh, jax.sharding.NamedSharding):
        parts = list(sh.spec) + [None] * (rank - len(sh.spec))
        return [p if p is None or isinstance(p, str) else list(p)
                for p in parts]
    if sh.is_fully_replicated:
        return [None] * rank
    return repr(sh)


def fake_data(entry, n=16):
    """(x, y) for a single-input, single-output entry ("x", "labels"): the
    arrays; for an entry with "inputs"/"outputs": lists of arrays, one per
    model input and one per output with a loss, in model order. One
    default_rng(0) stream: the inputs first, then the labels."""
    rng = np.random.default_rng(0)
    if "inputs" not in entry:
        x = rng.normal(size=(n,) + entry["x"]).astype("float32")
        kind = entry["labels"]
        if kind == "dense10":
            y = rng.normal(size=(n, 10)).astype("float32")
        elif kind.startswith("onehot"):
            k = int(kind[len("onehot"):])
            y = np.eye(k, dtype="float32")[rng.integers(0, k, n)]
        else:
            y = rng.integers(0, 10, n).astype("int32")
        if "label_scale" in entry:  # issue 23: some rows' labels scaled
            rows, k = entry["label_scale"]
            y[rows] *= k
        return x, y
    xs, ys = [], []
    for _name, shape, kind in entry["inputs"]:
        if kind == "float":
            xs.append(rng.normal(size=(n,) + shape).astype("float32"))
        elif isinstance(kind, tuple):  # issue 25: ("float", loc, scale) per feature
            xs.append((rng.normal(size=(n,) + shape) * kind[2] + kind[1]).astype("float32"))
        else:  # int32 ids in [0, vocabulary)
            xs.append(rng.integers(0, kind, (n,) + shape).astype("int32"))
    for kind in entry["outputs"]:
        k = int(re.sub(r"^[a-z]+", "", kind)) if re.fullmatch(r"[a-z]+\d+", kind) else 0
        if kind.startswith("dense"):  # float targets (n, k)
            ys.append(rng.normal(size=(n, k)).astype("float32"))
        # issue 11's losses: counts (poisson), positive targets (mape, msle),
        # distributions (kl_divergence), one-hot rows, 0/1, -1/1, and 0/1
        # from the middle on with a -1 in each batch's first row (hinge)
        elif kind.startswith("counts"):
            ys.append(rng.poisson(1.5, size=(n, k)).astype("float32"))
        elif kind.startswith("positive"):
            ys.append(rng.uniform(0.5, 2.0, size=(n, k)).astype("float32"))
        elif kind.startswith("prob"):
            z = np.exp(rng.normal(size=(n, k)))
            ys.append((z / z.sum(axis=1, keepdims=True)).astype("float32"))
        elif kind.startswith("onehot"):
            ys.append(np.eye(k, dtype="float32")[rng.integers(0, k, n)])
        elif kind.startswith(("binary", "pmone", "hingemix")):
            y = rng.integers(0, 2, (n, k)).astype("float32")
            if kind.startswith("pmone"):
                y = 2 * y - 1
            if kind.startswith("hingemix"):
                y[n // 2::16, 0] = -1
            ys.append(y)
        elif kind.startswith("next"):  # "nextKxT": next-token ids (n, T):
            # the first input shifted left one, a fresh id in [0, K) last
            k, _, t = kind[len("next"):].partition("x")
            assert xs[0].shape[1:] == (int(t),), (kind, xs[0].shape)
            last = rng.integers(0, int(k), (n, 1)).astype("int32")
            ys.append(np.concatenate([xs[0][:, 1:], last], axis=1))
        else:  # "sparseK": class ids (n,); "sparseKxT": (n, T)
            k, _, t = kind[len("sparse"):].partition("x")
            shape = (n, int(t)) if t else (n,)
            ys.append(rng.integers(0, int(k), shape).astype("int32"))
    return xs, ys


def input_shapes(entry):
    """Per-sample shape of each model input."""
    if "inputs" not in entry:
        return [entry["x"]]
    return [shape for _name, shape, _kind in entry["inputs"]]


def verify(name, entry, dist_name, spec, config, archive_path, mode):
    """Build the model under the distribution, either with the Python builder
    (mode "python") or from the written files (mode "file": the .keras archive,
    else the .json); report the layout Keras gave every variable and which
    output keys took effect."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(SEED)
    distribution = make_distribution(spec)
    queried = {}
    orig = distribution.get_tensor_layout

    def spy(path):
        layout = orig(path)
        queried[path] = None if layout is None else list(layout.axes)
        return layout

    distribution.get_tensor_layout = spy
    result = {"model": name, "dist": dist_name, "mode": mode, "spec": spec}
    keras.distribution.set_distribution(distribution)
    try:
        if mode == "python":
            model = entry["build"]()
            result["loaded_from"] = "Python builder in make_models.py"
        elif archive_path and os.path.exists(archive_path):
            model = keras.saving.load_model(archive_path)
            result["loaded_from"] = os.path.relpath(archive_path, ROOT)
        else:
            model = keras.saving.deserialize_keras_object(config)
            result["loaded_from"] = "json (deserialize_keras_object)"
        x, y = fake_data(entry)
        if isinstance(x, list) and len(x) == 1:
            x = x[0]
        if isinstance(y, list) and len(y) == 1:
            y = y[0]
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        result["fit"] = "ok (1 epoch, 16 samples, batch 8)"
        result["variables"] = [
            {"path": v.path, "shape": list(v.shape), "layout": spec_of(v.value)}
            for v in model.weights
        ]
        result["optimizer_variables"] = [
            {"path": v.path, "shape": list(v.shape), "layout": spec_of(v.value)}
            for v in model.optimizer.variables
        ]
        result["data_layout"] = list(
            distribution.get_data_layout((16,) + input_shapes(entry)[0]).axes)
        result["output_queries"] = queried
    except Exception as e:  # noqa: BLE001 - record the real Keras/JAX error
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    finally:
        keras.distribution.set_distribution(None)

    # Which layout_map keys matched nothing (neither a variable nor an output)?
    if spec.get("layout_map") and "variables" in result:
        paths = [v["path"] for v in result["variables"]] + list(queried)
        unmatched = []
        for k in spec["layout_map"]:
            if not any(k == p or re.fullmatch(k, p) for p in paths):
                unmatched.append(k)
        result["unmatched_keys"] = unmatched
    return result


def fmt_layout(layout):
    if isinstance(layout, str):
        return layout
    if all(a is None for a in layout):
        return "replicated" if layout else "replicated (scalar)"
    return "(" + ", ".join("None" if a is None else repr(a) for a in layout) + ")"


def _outputs_line(r):
    q = r.get("output_queries", {})
    matched = {p: a for p, a in q.items() if a}
    if matched:
        return ", ".join(f"`{p}` -> {fmt_layout(a)}" for p, a in matched.items())
    return "none"


def write_readme(pairs, versions):
    L = []
    L.append("# Reference models for kdcc (written by real Keras)\n")
    L.append(
        "Generated by `python3 tests/keras_ref/make_models.py`; do not edit by "
        "hand. Versions: " + versions + ".\n\n"
        "The tables come from real runs: each `.dist.json` was turned into "
        "`keras.distribution` objects on 8 host CPU devices "
        "(`XLA_FLAGS=--xla_force_host_platform_device_count=8`) and "
        "`set_distribution`; the model was then built twice, (1) by the Python "
        "builder in `make_models.py` and (2) loaded from the written file "
        "(`keras.saving.load_model` on the `.keras`, or "
        "`deserialize_keras_object` on the `.json` where no archive is "
        "written), trained one epoch on 16 random samples (batch 8), and every "
        "variable's `variable.value.sharding` was read back. A layout has one "
        "entry per dimension: a mesh axis or None.\n")
    L.append(
        "**Variable paths depend on how a Sequential was built.** Built in "
        "Python, a Sequential's layers are built inside the model's name scope: "
        "`sequential/d1/kernel`. Loaded from a `.keras`/JSON, every layer with a "
        "`build_config` is built by the deserializer *before* it is added to "
        "the model: `d1/kernel` (no model prefix). A layer's path (and its "
        "`<path>/output` key) is fixed at its first build/call. Functional "
        "models give `<layer>/<var>` either way. So the guide's `d1/kernel` "
        "keys take effect for the *loaded* seed model and not for the "
        "Python-built one, and `sequential/d1/kernel` the other way round.\n")
    L.append(
        "Output keys: after each layer call Keras looks up `<layer path>/output`; "
        "*outputs* lists the lookups that got a layout (logged by wrapping "
        "`distribution.get_tensor_layout`). Optimizer slots (momentum, "
        "velocity, ...) take the layout of their variable; `iteration` and "
        "`learning_rate` are replicated scalars; they are listed in "
        "`keras_layouts.json`, not here.\n")
    L.append("## Format notes (what Keras " + keras.__version__ + " wrote)\n")
    L.extend([
        "- `<name>.json` is the archive's `config.json` (the one written under "
        "`ObjectSharingScope`), re-indented. It has `compile_config`, as does "
        "`model.to_json()`; plain `serialize_keras_object(model)` lacks the "
        "`shared_object_id` members.",
        "- `dtype` of a layer is a `DTypePolicy` envelope "
        "(`{\"module\": \"keras\", \"class_name\": \"DTypePolicy\", "
        "\"config\": {\"name\": \"float32\"}, ...}`), often with "
        "`shared_object_id` (Keras writes `id()` values; renumbered 1, 2, ... "
        "here). `InputLayer` has a plain string `dtype` and `batch_shape`.",
        "- Sequential: top-level `module` `keras`, layers without `name` / "
        "`inbound_nodes`, `config.build_input_shape`. Functional: `module` "
        "`keras.src.models.functional`, `class_name` `Functional`, every layer "
        "with `name` and `inbound_nodes` (list of `{\"args\", \"kwargs\"}`; "
        "`__keras_tensor__` with `keras_history` `[layer, node, tensor]`; "
        "several inputs = nested list `args: [[kt, kt]]`); a single input or "
        "output is a flat triple `[\"x\", 0, 0]`; top-level `build_config` "
        "is `{\"input_shape\": null}`.",
        "- Every layer except InputLayer (and Dropout, which has none) carries "
        "`build_config.input_shape`; Add/Concatenate have a list of shapes.",
        "- `compile_config`: `loss` is a string (`\"mse\"`) or a `keras.losses` "
        "envelope (`CategoricalCrossentropy` with `from_logits`); `optimizer` "
        "is always an envelope; learning rates are float32 values printed as "
        "doubles (`0.0010000000474974513`, `0.009999999776482582`); "
        "`metrics` is `[\"accuracy\"]` or null.",
        "- `model.weights.h5` inside the archive names groups by the layer's "
        "**class** in snake case with a counter in `model.layers` order, not "
        "by layer name: `layers/dense/vars/0`, `layers/dense_1/vars/0`, ... "
        "even for layers named `a`, `b`, `d1`; `vars/0` = kernel, `vars/1` = "
        "bias. `optimizer/vars/0,1` (iteration, learning rate) are present; "
        "the root group `vars` has attribute `name` = model name.",
        "- Several inputs (wide_deep, shared_dense): `config.input_layers` is "
        "a list of triples in `model.inputs` order (`[[\"wide\", 0, 0], "
        "[\"deep\", 0, 0]]`); a single output stays a flat triple. Several "
        "outputs (two_heads): `output_layers` `[[\"head_a\", 0, 0], "
        "[\"head_b\", 0, 0]]`, and `compile_config` has dicts keyed by "
        "output layer name: `loss` `{\"head_a\": "
        "\"sparse_categorical_crossentropy\", \"head_b\": \"mse\"}`, "
        "`loss_weights` `{\"head_a\": 1.0, \"head_b\": 0.5}`, `metrics` "
        "`{\"head_a\": [\"accuracy\"]}`. Keras's total loss is "
        "`sum(loss_weight * output loss)`; History/`train_on_batch` log "
        "`loss` (the total), `head_a_loss`, `head_b_loss` (unweighted) and "
        "`head_a_accuracy`.",
        "- int inputs (int_tokens, per_token): the InputLayer's `dtype` is "
        "`\"int32\"`. `Embedding` has `input_dim`, `output_dim`, "
        "`embeddings_initializer` (RandomUniform -0.05..0.05), `mask_zero` "
        "false; its variable is `emb/embeddings` (input_dim, output_dim), "
        "`layers/embedding/vars/0` in the weights file.",
        "- A shared layer (shared_dense: one Dense called on two inputs) has "
        "two `inbound_nodes`; its second call's output is "
        "`keras_history` `[\"shared\", 1, 0]` (node index 1). Its "
        "variables exist once.",
        "- wide_mlp.keras is only written with `--large` (about 59 MB).",
        "",
    ])
    for py, fl in pairs:
        L.append(f"## {py['model']} with `{py['dist']}.dist.json`\n")
        L.append("Spec: `" + json.dumps(py["spec"]) + "`\n")
        if "error" in py or "error" in fl:
            L.append("**Real Keras/JAX rejects it**: `"
                     + (py.get("error") or fl.get("error")) + "`\n")
            continue
        L.append(f"Input batch layout: {fmt_layout(py['data_layout'])}; "
                 f"file: {fl['loaded_from']}.\n")
        L.append("| path (built in Python) | path (loaded from file) | global "
                 "shape | layout, built in Python | layout, loaded from file |")
        L.append("|---|---|---|---|---|")
        for v, w in zip(py["variables"], fl["variables"]):
            L.append(f"| `{v['path']}` | `{w['path']}` | {tuple(v['shape'])} | "
                     f"{fmt_layout(v['layout'])} | {fmt_layout(w['layout'])} |")
        L.append("")
        L.append("Outputs, built in Python: " + _outputs_line(py) +
                 "; loaded from file: " + _outputs_line(fl) + ".\n")
        for r, what in ((py, "built in Python"), (fl, "loaded from file")):
            if r.get("unmatched_keys"):
                L.append(f"**Keys that matched nothing** ({what}; Keras ignores "
                         "them silently): "
                         + ", ".join(f"`{k}`" for k in r["unmatched_keys"])
                         + "\n")
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write("\n".join(L))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--large", action="store_true",
                    help="also write wide_mlp.keras (about 59 MB of weights)")
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    versions = f"keras {keras.__version__}, jax {jax.__version__}"
    print(versions, "devices:", len(jax.devices()))

    configs = {}
    for name, entry in MODELS.items():
        keras.backend.clear_session()
        keras.utils.set_random_seed(SEED)
        model = entry["build"]()
        print(f"{name}: model {model.name!r}, weights",
              [v.path for v in model.weights])
        write_archive = args.large or not entry.get("large")
        config = save_archive(model, os.path.join(OUT, name + ".keras"),
                              write_archive)
        configs[name] = config
        dump(os.path.join(OUT, name + ".json"), config)
        for dist_name, spec in entry["dists"].items():
            dump(os.path.join(OUT, dist_name + ".dist.json"), spec)

    # The seed model with its (correct-path) spec embedded.
    embedded = dict(configs["seed_mlp"])
    embedded["distribution"] = MODELS["seed_mlp"]["dists"]["seed_mlp_fixed"]
    dump(os.path.join(OUT, "seed_mlp_embedded.json"), embedded)

    if args.no_verify:
        return
    results, pairs = [], []
    for name, entry in MODELS.items():
        for dist_name, spec in entry["dists"].items():
            pair = []
            for mode in ("python", "file"):
                r = verify(name, entry, dist_name, spec, configs[name],
                           os.path.join(OUT, name + ".keras"), mode)
                status = r.get("error") or "ok"
                print(f"verify {dist_name} [{mode}]: {status}")
                for v in r.get("variables", []):
                    print(f"   {v['path']:32s} {str(tuple(v['shape'])):14s} "
                          f"{fmt_layout(v['layout'])}")
                for p, a in r.get("output_queries", {}).items():
                    if a:
                        print(f"   output {p} -> {fmt_layout(a)}")
                if r.get("unmatched_keys"):
                    print("   unmatched keys:", r["unmatched_keys"])
                results.append(r)
                pair.append(r)
            pairs.append(pair)
    dump(os.path.join(OUT, "keras_layouts.json"),
         {"versions": versions, "results": results})
    write_readme(pairs, versions)


if __name__ == "__main__":
    sys.exit(main())
