#!/usr/bin/env python3
"""A Keras 3 model JSON of a deep GPT-style decoder, for timing how kdcc's
builds grow with the model (bench/build_time.sh):

    bench/deep_gpt.py --blocks 48 > gpt48.json

Token and position embeddings, BLOCKS pre-norm blocks of causal
MultiHeadAttention and a gelu MLP (tests/keras_ref/make_models.py's gpt,
deeper), a final LayerNormalization and the logits. Written by real Keras
(model.to_json() with its compile config), so it needs keras and keras_hub
(tests/keras_ref/requirements.txt)."""
import argparse
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import keras  # noqa: E402
import keras_hub  # noqa: E402
from keras import layers  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--blocks", type=int, default=48)
ap.add_argument("--hidden", type=int, default=64)
ap.add_argument("--seq", type=int, default=32)
ap.add_argument("--vocab", type=int, default=256)
args = ap.parse_args()

x = keras.Input((args.seq,), dtype="int32", name="tokens")
tok = layers.Embedding(args.vocab, args.hidden, name="tok")(x)
pos = keras_hub.layers.PositionEmbedding(sequence_length=args.seq, name="pos")(tok)
h = layers.Add(name="embed_add")([tok, pos])
for i in range(args.blocks):
    p = f"b{i}_"
    n = layers.LayerNormalization(name=p + "ln1")(h)
    a = layers.MultiHeadAttention(num_heads=4, key_dim=args.hidden // 4,
                                  name=p + "attn")(n, n, use_causal_mask=True)
    h = layers.Add(name=p + "add1")([h, a])
    n = layers.LayerNormalization(name=p + "ln2")(h)
    f = layers.Dense(4 * args.hidden, activation="gelu", name=p + "up")(n)
    f = layers.Dense(args.hidden, name=p + "down")(f)
    h = layers.Add(name=p + "add2")([h, f])
h = layers.LayerNormalization(name="ln_f")(h)
out = layers.Dense(args.vocab, name="logits")(h)
model = keras.Model(x, out, name="gpt")
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              optimizer=keras.optimizers.Adam(), metrics=["accuracy"])
config = json.loads(model.to_json())
config["compile_config"] = model.get_compile_config()
print(json.dumps(config, indent=1))
