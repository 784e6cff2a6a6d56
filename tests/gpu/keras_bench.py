#!/usr/bin/env python3
"""Keras 3 on JAX on one GPU: the same model JSONs kdcc compiles, compiled from
their compile_config, trained with model.fit on the same .npy batches; steps/s
from the median epoch time after two warm-up epochs (jit compile excluded).
JAX's default float32 matmul precision on this GPU is its default (noted)."""
import argparse, json, os, time, sys
os.environ.setdefault("KERAS_BACKEND", "jax")
import numpy as np, keras, jax
ap = argparse.ArgumentParser(); ap.add_argument("--data"); ap.add_argument("--models"); ap.add_argument("--out")
ap.add_argument("--budget", type=float, default=200, help="seconds; no model starts after them")
a = ap.parse_args(); T0 = time.time()

@keras.saving.register_keras_serializable(package="keras_hub")
class PositionEmbedding(keras.layers.Layer):
    """keras_hub's PositionEmbedding: a learned [sequence_length, d] table, broadcast to the input."""
    def __init__(self, sequence_length, initializer="glorot_uniform", **kw):
        kw.pop("hierarchical_embedding", None); super().__init__(**kw)
        self.sequence_length, self.initializer = sequence_length, initializer
    def build(self, shape):
        self.position_embeddings = self.add_weight(name="embeddings", shape=(self.sequence_length, shape[-1]), initializer=self.initializer)
    def call(self, x):
        T = keras.ops.shape(x)[-2]
        return keras.ops.broadcast_to(self.position_embeddings[:T], keras.ops.shape(x))

class Timer(keras.callbacks.Callback):
    def __init__(s): s.t = []
    def on_epoch_begin(s, e, logs=None): s.s = time.perf_counter()
    def on_epoch_end(s, e, logs=None): s.t.append(time.perf_counter() - s.s)

out = {"keras": keras.__version__, "jax": jax.__version__, "devices": str(jax.devices()), "results": []}
for name, B, file in [("seed_mlp", 128, "seed_mlp"), ("gpt", 128, "gpt"), ("resnet", 128, "resnet"), ("wide_mlp", 1024, "wide_mlp"), ("gpt_med", 16, "gpt_med")]:
    if time.time() - T0 > a.budget: print("keras: out of time"); break
    try:
        text = open(f"{a.models}/{file}.json").read()
        m = keras.models.model_from_json(text); m.compile_from_config(json.loads(text)["compile_config"])
        x = np.load(f"{a.data}/{name}.x.npy"); y = np.load(f"{a.data}/{name}.y.npy")
        t = Timer(); m.fit(x, y, batch_size=B, epochs=2, verbose=0, shuffle=False)
        epochs = max(3, min(30, int(3.0 / max(1e-3, (time.perf_counter() - T0) / 100))))
        m.fit(x, y, batch_size=B, epochs=6, verbose=0, shuffle=False, callbacks=[t])
        med = float(np.median(t.t[1:])); sps = (len(x) // B) / med
        print(f"keras-jax {name} fp32(default precision) b{B}: {sps:.2f} steps/s (epoch times {['%.3f' % v for v in t.t]}) [{time.time()-T0:.0f}s]", flush=True)
        out["results"].append(dict(model=name, batch=B, steps_per_s=sps, epochs=t.t))
    except Exception as e:
        print(f"keras-jax {name}: FAILED {e!r}"[:400], flush=True)
    json.dump(out, open(a.out, "w"), indent=1)
