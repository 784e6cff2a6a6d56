#!/usr/bin/env python3
"""Write the Fashion-MNIST example models as Keras 3 JSON, with their layouts.

Usage (from the repository root, in a venv with keras and jax; see
tests/keras_ref/requirements.txt for the versions used):

    KERAS_BACKEND=jax python3 examples/fashion_mnist/make_models.py

Writes, next to this script:

  mlp.json, mlp.dist.json   Input(28,28,1) -> Flatten -> Dense(256, relu)
                            -> Dense(128, relu) -> Dense(100, relu)
                            -> Dense(10, softmax)
  cnn.json, cnn.dist.json   Conv2D(32,3,same) -> MaxPool -> Conv2D(64,3,same)
                            -> MaxPool -> Conv2D(128,3) -> Flatten -> Dropout
                            -> Dense(128, relu) -> Dropout -> Dense(10, softmax)
  vit.json, vit.dist.json   a 2-block vision transformer (see vit())
  resnet.json, resnet.dist.json
                            a small ResNet with batch norm (see resnet()),
                            data parallel on 4 devices; make bench times it too

Both are Functional models (variable paths "<layer>/<var>" whether built in
Python or loaded), compiled with sparse_categorical_crossentropy, Adam and
accuracy. The JSON is model.to_json(), re-indented, with Keras's id()-based
"shared_object_id" values renumbered 1, 2, ... so the output is reproducible.

The layouts are ModelParallel on a (2, 4) ("data", "model") mesh, with the
wide kernels split over "model" in Megatron pairs (a column-split kernel
followed by a row-split one, so the activation between them stays split)
and the conv kernels split over their output channels. Every split extent
is divisible by 4. The script checks each spec against real Keras: it
builds the model under keras.distribution on 8 host CPU devices and reads
every variable's sharding back.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (
        _flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

warnings.filterwarnings("ignore")

import jax  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402  (PositionEmbedding: vit)
from keras import layers  # noqa: E402

SEED = 1234
HERE = os.path.dirname(os.path.abspath(__file__))
MESH = {"shape": [2, 4], "axis_names": ["data", "model"]}


def mlp():
    x = keras.Input((28, 28, 1), name="image")
    y = layers.Flatten(name="flatten")(x)
    y = layers.Dense(256, activation="relu", name="d1")(y)
    y = layers.Dense(128, activation="relu", name="d2")(y)
    y = layers.Dense(100, activation="relu", name="d3")(y)
    out = layers.Dense(10, activation="softmax", name="d4")(y)
    model = keras.Model(x, out, name="fashion_mlp")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(learning_rate=1e-3),
                  metrics=["accuracy"])
    return model


MLP_LAYOUT = {
    "d1/kernel": [None, "model"],   # (784, 256): columns split
    "d1/bias": ["model"],
    "d2/kernel": ["model", None],   # (256, 128): rows split, partial sums
    "d3/kernel": [None, "model"],   # (128, 100): columns split
    "d3/bias": ["model"],
    "d4/kernel": ["model", None],   # (100, 10): rows split
}


def cnn():
    x = keras.Input((28, 28, 1), name="image")
    y = layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1")(x)
    y = layers.MaxPooling2D(2, name="pool1")(y)
    y = layers.Conv2D(64, 3, padding="same", activation="relu", name="conv2")(y)
    y = layers.MaxPooling2D(2, name="pool2")(y)
    y = layers.Conv2D(128, 3, activation="relu", name="conv3")(y)
    y = layers.Flatten(name="flatten")(y)
    y = layers.Dropout(0.3, name="drop1")(y)
    y = layers.Dense(128, activation="relu", name="fc1")(y)
    y = layers.Dropout(0.3, name="drop2")(y)
    out = layers.Dense(10, activation="softmax", name="fc2")(y)
    model = keras.Model(x, out, name="fashion_cnn")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(learning_rate=1e-3),
                  metrics=["accuracy"])
    return model


CNN_LAYOUT = {
    "conv2/kernel": [None, None, None, "model"],  # (3, 3, 32, 64)
    "conv2/bias": ["model"],
    "conv3/kernel": [None, None, None, "model"],  # (3, 3, 64, 128)
    "conv3/bias": ["model"],
    "fc1/kernel": ["model", None],                # (3200, 128): rows split
}


def renumber_shared_ids(obj):
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

    walk(obj)
    return obj


def dump(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def spec_of(array):
    sh = array.sharding
    rank = len(array.shape)
    if isinstance(sh, jax.sharding.NamedSharding):
        return list(sh.spec) + [None] * (rank - len(sh.spec))
    return [None] * rank


def verify(build, layout):
    """Build under the distribution; every variable's sharding must be the
    one the spec names (None everywhere for keys it does not name), and
    every split extent divisible by its mesh axis."""
    dist = keras.distribution
    devices = dist.list_devices()
    if layout is None:  # DataParallel: every variable replicated
        layout = {}
        dist.set_distribution(dist.DataParallel(devices=devices[:DP_MESH["shape"][0]]))
    else:
        mesh = dist.DeviceMesh(tuple(MESH["shape"]), MESH["axis_names"], devices[:8])
        lm = dist.LayoutMap(mesh)
        for k, v in layout.items():
            lm[k] = tuple(v)
        dist.set_distribution(dist.ModelParallel(layout_map=lm, batch_dim_name="data"))
    try:
        keras.utils.set_random_seed(SEED)
        model = build()
        x = np.zeros((16, 28, 28, 1), "float32")
        y = np.zeros((16,), "int32")
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        seen = set()
        sizes = dict(zip(MESH["axis_names"], MESH["shape"]))
        for v in model.weights:
            # LayoutMap's rule (Keras 3.14+): the exact key, else a full regex match
            keys = [k for k in layout if k == v.path] or \
                [k for k in layout if re.fullmatch(k, v.path)]
            want = layout[keys[0]] if keys else [None] * len(v.shape)
            seen.update(keys)
            got = spec_of(v.value)
            if got != want:
                sys.exit("%s: Keras applied %s, the spec says %s" % (v.path, got, want))
            for d, a in enumerate(want):
                if a is not None and v.shape[d] % sizes[a]:
                    sys.exit("%s: dim %d (%d) not divisible by %s" % (v.path, d, v.shape[d], a))
        for k in layout:
            if k not in seen:
                sys.exit("layout key %s matches no variable" % k)
    finally:
        dist.set_distribution(None)


def vit():
    """A small vision transformer: 4x4 patches (a strided Conv2D), a learned
    position embedding, 2 pre-norm encoder blocks, mean over the patches."""
    x = keras.Input((28, 28, 1), name="image")
    p = layers.Conv2D(64, 4, strides=4, name="patch")(x)  # (7, 7, 64)
    h = layers.Reshape((49, 64), name="patches")(p)
    pos = keras_hub.layers.PositionEmbedding(sequence_length=49, name="pos")(h)
    h = layers.Add(name="embed_add")([h, pos])
    for i in range(2):
        n = layers.LayerNormalization(name=f"b{i}_ln1")(h)
        a = layers.MultiHeadAttention(num_heads=4, key_dim=16, name=f"b{i}_attn")(n, n)
        h = layers.Add(name=f"b{i}_add1")([h, a])
        n = layers.LayerNormalization(name=f"b{i}_ln2")(h)
        f = layers.Dense(128, activation="gelu", name=f"b{i}_up")(n)
        f = layers.Dropout(0.1, name=f"b{i}_drop")(layers.Dense(64, name=f"b{i}_down")(f))
        h = layers.Add(name=f"b{i}_add2")([h, f])
    h = layers.LayerNormalization(name="ln_f")(h)
    h = layers.GlobalAveragePooling1D(name="gap")(h)
    out = layers.Dense(10, activation="softmax", name="head")(h)
    model = keras.Model(x, out, name="fashion_vit")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(learning_rate=1e-3),
                  metrics=["accuracy"])
    return model


# Megatron: heads split for query, key and value and the attention output's
# input, the MLP's hidden units split; one all-reduce per block half.
VIT_LAYOUT = {
    r"b\d_attn/(query|key|value)/kernel": [None, "model", None],  # (64, 4, 16)
    r"b\d_attn/(query|key|value)/bias": ["model", None],
    r"b\d_attn/attention_output/kernel": ["model", None, None],  # (4, 16, 64)
    r"b\d_up/kernel": [None, "model"],                           # (64, 128)
    r"b\d_up/bias": ["model"],
    r"b\d_down/kernel": ["model", None],                         # (128, 64)
}


def resnet():
    """A small ResNet with batch norm: a 3x3 stem and 2x2 max pooling, then
    two residual blocks of two 3x3 convs, each conv followed by batch norm
    (the convs have no bias: batch norm cancels it). The second block halves
    the size with stride 2 and doubles the channels, its shortcut a strided
    1x1 conv with batch norm. Global average pooling, Dense 10."""
    def conv_bn(y, filters, size, strides, name, relu=True):
        y = layers.Conv2D(filters, size, strides=strides, padding="same", use_bias=False,
                          name=name)(y)
        y = layers.BatchNormalization(name=name + "_bn")(y)
        return layers.ReLU(name=name + "_relu")(y) if relu else y

    x = keras.Input((28, 28, 1), name="image")
    y = conv_bn(x, 32, 3, 1, "stem")
    y = layers.MaxPooling2D(2, name="pool")(y)                         # (14, 14, 32)
    r = conv_bn(conv_bn(y, 32, 3, 1, "b1_c1"), 32, 3, 1, "b1_c2", relu=False)
    y = layers.ReLU(name="b1_relu")(layers.Add(name="b1_add")([y, r]))
    r = conv_bn(conv_bn(y, 64, 3, 2, "b2_c1"), 64, 3, 1, "b2_c2", relu=False)  # (7, 7, 64)
    s = conv_bn(y, 64, 1, 2, "b2_short", relu=False)
    y = layers.ReLU(name="b2_relu")(layers.Add(name="b2_add")([s, r]))
    y = layers.GlobalAveragePooling2D(name="gap")(y)
    out = layers.Dense(10, activation="softmax", name="head")(y)
    model = keras.Model(x, out, name="fashion_resnet")
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.Adam(learning_rate=1e-3),
                  metrics=["accuracy"])
    return model


# Data parallel on 4 devices (a global batch of 100 is 25 a device): a small
# model's weights are better replicated than split; batch norm's statistics
# are the global batch's, as Keras computes them.
RESNET_LAYOUT = None
DP_MESH = {"shape": [4], "axis_names": ["batch"]}


def main():
    for name, build, layout in (("mlp", mlp, MLP_LAYOUT), ("cnn", cnn, CNN_LAYOUT),
                                ("vit", vit, VIT_LAYOUT), ("resnet", resnet, RESNET_LAYOUT)):
        keras.backend.clear_session()
        keras.utils.set_random_seed(SEED)
        model = build()
        config = renumber_shared_ids(json.loads(model.to_json()))
        dump(os.path.join(HERE, name + ".json"), config)
        if layout is None:
            spec = {"distribution": "DataParallel", "device_mesh": DP_MESH}
        else:
            spec = {"distribution": "ModelParallel", "device_mesh": MESH,
                    "batch_dim_name": "data", "layout_map": layout}
        dump(os.path.join(HERE, name + ".dist.json"), spec)
        verify(build, layout)
        print("wrote %s.json and %s.dist.json (%d parameters; layouts checked "
              "against keras %s)" % (name, name, model.count_params(), keras.__version__))


if __name__ == "__main__":
    main()
