#!/usr/bin/env python3
"""Write model.json and model.dist.json, the character-level GPT that
train.sh compiles. Run once with real Keras 3 (tests/keras_ref/requirements.txt);
the committed files are its output, so training needs no Python packages.

    KERAS_BACKEND=jax python3 examples/char_gpt/make_model.py

A decoder of 4 pre-norm blocks (causal MultiHeadAttention with 4 heads of
32, a gelu MLP of 512), 128 token ids (any ASCII text), a window of 64
characters, keras_hub's PositionEmbedding. The distribution is Megatron's
(SHARDING.md): query, key and value kernels split on heads, the attention
output kernel on its input heads, the MLP up kernel on its columns and
the down kernel on its rows, over 'model'; the batch over 'data'."""
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import keras  # noqa: E402
import keras_hub  # noqa: E402
from keras import layers  # noqa: E402

VOCAB, SEQ, HIDDEN, BLOCKS = 128, 64, 128, 4
here = os.path.dirname(os.path.abspath(__file__))

keras.utils.set_random_seed(1234)
x = keras.Input((SEQ,), dtype="int32", name="chars")
tok = layers.Embedding(VOCAB, HIDDEN, name="tok")(x)
pos = keras_hub.layers.PositionEmbedding(sequence_length=SEQ, name="pos")(tok)
h = layers.Add(name="embed_add")([tok, pos])
for i in range(BLOCKS):
    p = f"b{i}_"
    n = layers.LayerNormalization(name=p + "ln1")(h)
    a = layers.MultiHeadAttention(num_heads=4, key_dim=HIDDEN // 4,
                                  name=p + "attn")(n, n, use_causal_mask=True)
    h = layers.Add(name=p + "add1")([h, a])
    n = layers.LayerNormalization(name=p + "ln2")(h)
    f = layers.Dense(4 * HIDDEN, activation="gelu", name=p + "up")(n)
    f = layers.Dropout(0.1, name=p + "drop")(layers.Dense(HIDDEN, name=p + "down")(f))
    h = layers.Add(name=p + "add2")([h, f])
h = layers.LayerNormalization(name="ln_f")(h)
out = layers.Dense(VOCAB, name="logits")(h)
model = keras.Model(x, out, name="char_gpt")
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              optimizer=keras.optimizers.AdamW(learning_rate=1e-3), metrics=["accuracy"])
config = json.loads(model.to_json())
config["compile_config"] = model.get_compile_config()
with open(os.path.join(here, "model.json"), "w") as f:
    json.dump(config, f, indent=1)
    f.write("\n")
dist = {
    "distribution": "ModelParallel",
    "device_mesh": {"shape": [2, 4], "axis_names": ["data", "model"]},
    "batch_dim_name": "data",
    "layout_map": {
        r"b\d_attn/(query|key|value)/kernel": [None, "model", None],
        r"b\d_attn/(query|key|value)/bias": ["model", None],
        r"b\d_attn/attention_output/kernel": ["model", None, None],
        r"b\d_up/kernel": [None, "model"],
        r"b\d_up/bias": ["model"],
        r"b\d_down/kernel": ["model", None],
    },
}
with open(os.path.join(here, "model.dist.json"), "w") as f:
    json.dump(dist, f, indent=2)
    f.write("\n")
