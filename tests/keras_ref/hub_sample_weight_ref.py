"""keras-hub's loss masking, the reference for tests/sh/sample_weight.sh.

keras-hub's CausalLMPreprocessor yields (x, y, sample_weight) with
sample_weight = padding_mask[..., 1:] of the sequence one token longer:
the loss and the task's weighted_metrics (SparseCategoricalAccuracy)
count only the positions whose next token is real. Here keras-hub 0.32 on
JAX fine-tunes tests/fixtures/keras_hub/hub_gpt2's tiny GPT2CausalLM (its
model.keras, inputs and labels: 64 rows of 16 tokens, half padded) with
those weights (the mask shifted left, each row's last weight its last mask
value), batches of 16, 2 epochs, no shuffling. Written to
tests/fixtures/sample_weight/hub_gpt2/: sw.npy (float32, 64 x 16), ref.json
(every step's loss from train_on_batch, fit's History, evaluate's logs on
the same weighted data), final.npz (the weights after fit, under their
.weights.h5 names).

Run: /work/kvenv/bin/python tests/keras_ref/hub_sample_weight_ref.py
"""
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import numpy as np  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402,F401  (registers GPT2CausalLM)
from sample_weight_ref import save_final  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "fixtures", "keras_hub", "hub_gpt2")
OUT = os.path.join(HERE, "..", "fixtures", "sample_weight", "hub_gpt2")
BATCH, EPOCHS = 16, 2


def main():
    os.makedirs(OUT, exist_ok=True)
    mask = np.load(os.path.join(SRC, "padding_mask.npy"))
    ids = np.load(os.path.join(SRC, "token_ids.npy"))
    y = np.load(os.path.join(SRC, "y.npy"))
    sw = np.concatenate([mask[:, 1:], mask[:, -1:]], axis=1).astype(np.float32)
    np.save(os.path.join(OUT, "sw.npy"), sw)
    x = {"token_ids": ids, "padding_mask": mask}
    path = os.path.join(SRC, "model.keras")
    n = len(ids)

    def load():  # the task's compile config is its custom compile()'s: called again
        m = keras.saving.load_model(path, compile=False)
        m.compile(optimizer=keras.optimizers.Adam(1e-3))
        return m

    m1 = load()
    steps, step_acc = [], []
    for _ in range(EPOCHS):
        for s in range(0, n, BATCH):
            b = slice(s, s + BATCH)
            logs = m1.train_on_batch({k: v[b] for k, v in x.items()}, y[b], sample_weight=sw[b],
                                     return_dict=True)
            steps.append(float(logs["loss"]))
            step_acc.append(float(logs["sparse_categorical_accuracy"]))

    # keras.Model's fit and evaluate: keras-hub's (PipelineModel) want grain or
    # tensorflow for arrays; with no preprocessor they are the same
    m2 = load()
    h = keras.Model.fit(m2, x, y, sample_weight=sw, batch_size=BATCH, epochs=EPOCHS,
                        shuffle=False, verbose=0)
    ev = keras.Model.evaluate(m2, x, y, sample_weight=sw, batch_size=BATCH, verbose=0,
                              return_dict=True)
    for v1, v2 in zip(m1.weights, m2.weights):
        assert np.allclose(np.asarray(v1), np.asarray(v2), rtol=1e-4, atol=1e-5), v1.path
    save_final(m2, OUT)
    src = json.load(open(os.path.join(SRC, "hub_gpt2.json")))
    ref = {"versions": "keras %s, keras-hub %s" % (keras.__version__, keras_hub.__version__),
           "samples": n, "batch_size": BATCH, "epochs": EPOCHS,
           "sample_weight": "padding_mask shifted left one (keras-hub's CausalLMPreprocessor)",
           "step_loss": steps, "step_metric": step_acc,
           "history": {k: [float(v) for v in vs] for k, vs in h.history.items()},
           "evaluate_weighted": {k: float(v) for k, v in ev.items()},
           "final_weights_atol": src.get("final_weights_atol", {}),
           "final_weights_atol_note": src.get("final_weights_atol_note", "")}
    with open(os.path.join(OUT, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(json.dumps({k: ref[k] for k in ("step_loss", "history", "evaluate_weighted")}, indent=1))


if __name__ == "__main__":
    main()
