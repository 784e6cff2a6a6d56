"""Keras's sample_weight, the reference for tests/sh/sample_weight.sh.

An MLP (12 -> Dense 16 relu -> Dense 4 logits; sparse crossentropy from
logits, Adam 0.01, weighted_metrics=["accuracy"]) trained by Keras 3 on
JAX from fixed initial weights, without shuffling, on 44 samples with
per-sample weights (some 0, some 2, some 0.5) and validation_split 0.25:
33 training samples (batches of 16, 16, 1) and 11 validation ones, whose
weights are sliced with them. Written to tests/fixtures/sample_weight/:

    model.keras        the initial model (its compile config included)
    x.npy y.npy w.npy  the 44 samples, labels and weights
    ref.json           every step's loss (train_on_batch on fit's batches,
                       from the same weights), fit's History (loss, the
                       weighted accuracy, val_loss, val_accuracy), evaluate's
                       logs on the validation samples with their weights
    final.npz          the weights after fit (both runs end equal)

Run: /work/kvenv/bin/python tests/keras_ref/sample_weight_ref.py
"""
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import numpy as np  # noqa: E402
import keras  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "sample_weight")
N, SPLIT, BATCH, EPOCHS = 44, 0.25, 16, 2


def save_final(model, out):
    """The model's weights under their .weights.h5 names (layers/dense/vars/0,
    ...) into out/final.npz, what compare_sw.py reads."""
    import h5py

    tmp = os.path.join(out, "final.weights.h5")
    model.save_weights(tmp)
    final = {}
    with h5py.File(tmp, "r") as f:
        f.visititems(lambda name, o: final.__setitem__(name, np.asarray(o))
                     if isinstance(o, h5py.Dataset) and name.startswith("layers/") else None)
    os.remove(tmp)
    np.savez(os.path.join(out, "final.npz"), **final)


def build():
    keras.utils.set_random_seed(7)
    x = keras.Input((12,), name="x")
    h = keras.layers.Dense(16, activation="relu", name="a")(x)
    y = keras.layers.Dense(4, name="b")(h)
    m = keras.Model(x, y, name="sw_mlp")
    m.compile(optimizer=keras.optimizers.Adam(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              weighted_metrics=["accuracy"])
    return m


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.RandomState(3)
    x = rng.normal(size=(N, 12)).astype(np.float32)
    y = rng.randint(0, 4, size=(N,)).astype(np.int32)
    w = rng.choice([0.0, 1.0, 2.0, 0.5], size=(N,)).astype(np.float32)
    w[:3] = [0.0, 2.0, 0.0]
    for name, a in (("x", x), ("y", y), ("w", w)):
        np.save(os.path.join(OUT, name + ".npy"), a)
    model = build()
    path = os.path.join(OUT, "model.keras")
    model.save(path)
    keep = int(np.floor(N * (1.0 - SPLIT)))

    # every step's own loss: train_on_batch on fit's batches, same weights
    m1 = keras.saving.load_model(path)
    steps = []
    for _ in range(EPOCHS):
        for s in range(0, keep, BATCH):
            e = min(s + BATCH, keep)
            logs = m1.train_on_batch(x[s:e], y[s:e], sample_weight=w[s:e], return_dict=True)
            steps.append(float(logs["loss"]))

    # the History: fit with the weights and the validation split
    m2 = keras.saving.load_model(path)
    h = m2.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
               validation_split=SPLIT, verbose=0)
    ev = m2.evaluate(x[keep:], y[keep:], sample_weight=w[keep:], batch_size=BATCH,
                     verbose=0, return_dict=True)
    ev_plain = m2.evaluate(x[keep:], y[keep:], batch_size=BATCH, verbose=0, return_dict=True)
    for v1, v2 in zip(m1.weights, m2.weights):
        assert np.allclose(np.asarray(v1), np.asarray(v2), rtol=1e-5, atol=1e-6), v1.path
    save_final(m2, OUT)
    ref = {"versions": "keras %s" % keras.__version__, "samples": N,
           "validation_split": SPLIT, "batch_size": BATCH, "epochs": EPOCHS,
           "step_loss": steps,
           "history": {k: [float(v) for v in vs] for k, vs in h.history.items()},
           "evaluate_weighted": {k: float(v) for k, v in ev.items()},
           "evaluate_plain": {k: float(v) for k, v in ev_plain.items()}}
    with open(os.path.join(OUT, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(json.dumps(ref, indent=1))
    class_weights(path, x, y, keep)


def class_weights(path, x, y, keep):
    """fit(class_weight=CW) on the same model and data, validation_split 0.25:
    Keras splits first, then weighs the training samples by their class (the
    validation samples are not weighted). Into OUT/class_weight/."""
    cw = {0: 1.0, 1: 3.0, 2: 0.0}  # class 3: 1
    out = os.path.join(OUT, "class_weight")
    os.makedirs(out, exist_ok=True)
    w = np.array([cw.get(int(c), 1.0) for c in y], np.float32)
    m1 = keras.saving.load_model(path)
    steps = []
    for _ in range(EPOCHS):
        for s in range(0, keep, BATCH):
            e = min(s + BATCH, keep)
            logs = m1.train_on_batch(x[s:e], y[s:e], class_weight=cw, return_dict=True)
            steps.append(float(logs["loss"]))
    m2 = keras.saving.load_model(path)
    h = m2.fit(x, y, class_weight=cw, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
               validation_split=SPLIT, verbose=0)
    ev = m2.evaluate(x[keep:], y[keep:], batch_size=BATCH, verbose=0, return_dict=True)
    for v1, v2 in zip(m1.weights, m2.weights):
        assert np.allclose(np.asarray(v1), np.asarray(v2), rtol=1e-5, atol=1e-6), v1.path
    save_final(m2, out)
    ref = {"versions": "keras %s" % keras.__version__, "class_weight": "0:1,1:3,2:0",
           "train_weights_sum": float(w[:keep].sum()), "step_loss": steps,
           "history": {k: [float(v) for v in vs] for k, vs in h.history.items()},
           "evaluate_weighted": {k: float(v) for k, v in ev.items()},
           "evaluate_note": "the validation samples, unweighted (class_weight weighs training)"}
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(json.dumps(ref, indent=1))


if __name__ == "__main__":
    main()
