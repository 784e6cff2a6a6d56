#!/usr/bin/env python3
"""Check kdcc programs' weights files and predictions against real Keras 3
(JAX backend, CPU). Driven by tests/sh/keras_weights.sh:

    check_weights.py prepare DIR MODEL...   # DIR/<m>.x.npy: 37 fixed inputs;
                                            # DIR/<m>.keras.weights.h5: Keras's own
                                            # save_weights of models/<m>.keras
    check_weights.py check DIR MODEL...     # compare what the programs wrote
    check_weights.py preset DIR             # DIR/bf16_preset/: a keras-hub Gemma saved
                                            # in bfloat16, and its inputs
    check_weights.py check-preset DIR       # the programs' predictions of it

Files `check` reads for each model m (written by the programs):

    DIR/<m>.read.npy      predict with the weights compiled in (the .keras's)
    DIR/<m>.kw.npy        predict --weights DIR/<m>.keras.weights.h5
    DIR/<m>.random.npy    predict --init random
    DIR/<m>.trained.*     --save-weights after a few steps (.weights.h5 or .keras)
    DIR/<m>.trained.npy   predict --weights DIR/<m>.trained.*
    DIR/<m>.bf16.npy      predict --weights DIR/<m>.bf16.weights.h5, when prepare
                          wrote that: the model under Keras's bfloat16 policy saved
                          by Keras (2-byte opaque datasets, attribute dtype
                          "bfloat16"), which a float32 model loads exactly

and checks, within TOL (1e-4) absolute:
  - Keras's predictions of models/<m>.keras equal read.npy and kw.npy (reading);
  - load_model(models/<m>.keras) + load_weights(trained file) predicts
    trained.npy (writing), the trained weights differ from the original ones,
    and a saved .keras also loads whole with load_model;
  - random.npy differs from read.npy (--init random ignores the file);
  - the float32 model loading the bfloat16 file predicts bf16.npy.
Exit status 1 with a line per failure.
"""
import os
import sys
import warnings

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

TOL = 1e-4
N = 37  # not a multiple of any compiled batch: the last batch is padded
failures = []


def model_path(m):
    """models/<m>.keras, else a keras_ref fixture's model.keras"""
    path = os.path.join("models", m + ".keras")
    if os.path.exists(path):
        return path
    return os.path.join("tests", "fixtures", "keras_ref", m, "model.keras")


def load(path):
    import keras

    # Loading a compiled model warns that its optimizer (built on load) has
    # more variables than the file's unbuilt one; Keras's own files do too.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return keras.saving.load_model(path)


def load_weights(model, path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(path)
    for w in caught:
        msg = str(w.message)
        # Only the optimizer note above is expected.
        if "optimizer" not in msg:
            failures.append(f"{path}: Keras warned while loading: {msg}")


def compare(what, got, want):
    if got.shape != want.shape:
        failures.append(f"{what}: shape {got.shape}, Keras {want.shape}")
        return
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    status = "ok" if err <= TOL else "DIFFERS"
    print(f"  {what}: max |kdcc - keras| = {err:.3g} {status}")
    if err > TOL:
        failures.append(f"{what}: max abs difference {err:.3g} > {TOL}")


def prepare(d, models):
    import keras  # noqa: F401

    for m in models:
        model = load(model_path(m))
        shape = tuple(model.inputs[0].shape[1:])
        rng = np.random.default_rng(20240611 + len(m))
        x = rng.standard_normal((N,) + shape).astype(np.float32)
        np.save(os.path.join(d, m + ".x.npy"), x)
        model.save_weights(os.path.join(d, m + ".keras.weights.h5"))
        print(f"  {m}: inputs {x.shape}, Keras's own weights file written")
        if m in BF16:
            save_bfloat16(model, os.path.join(d, m + ".bf16.weights.h5"))


# Models whose weights prepare also writes as Keras does under the bfloat16
# policy (every layer's variables bfloat16).
BF16 = ("seed_mlp", "cnn")


def save_bfloat16(model, path):
    import h5py
    import keras
    import ml_dtypes

    def to_bf16(c):
        if isinstance(c, dict):
            if c.get("class_name") == "DTypePolicy" and c["config"]["name"] == "float32":
                return dict(c, config=dict(c["config"], name="bfloat16"))
            return {k: to_bf16(v) for k, v in c.items()}
        return [to_bf16(v) for v in c] if isinstance(c, list) else c

    twin = model.__class__.from_config(to_bf16(model.get_config()))
    twin.set_weights([w.astype(ml_dtypes.bfloat16) for w in model.get_weights()])
    twin.save_weights(path)
    with h5py.File(path) as f:  # the test means nothing unless Keras wrote bfloat16
        kinds = set()
        f.visititems(lambda n, o: kinds.add(o.attrs.get("dtype"))
                     if isinstance(o, h5py.Dataset) else None)
    if kinds != {"bfloat16"}:
        sys.exit(f"{path}: Keras wrote datasets of {kinds}, not bfloat16 only")
    print(f"  {os.path.basename(path)}: the model's weights as Keras saves them in bfloat16")


def check(d, models):
    for m in models:
        print(f"{m}:")
        p = lambda suffix: os.path.join(d, m + suffix)  # noqa: E731
        x = np.load(p(".x.npy"))
        orig = load(model_path(m))
        want = np.asarray(orig.predict(x, batch_size=N, verbose=0))
        compare(f"{m}: predict from the compiled-in .keras weights", np.load(p(".read.npy")), want)
        compare(f"{m}: predict --weights Keras's .weights.h5", np.load(p(".kw.npy")), want)

        if os.path.exists(p(".bf16.weights.h5")):
            f32 = load(model_path(m))
            load_weights(f32, p(".bf16.weights.h5"))
            compare(f"{m}: predict --weights a bfloat16 .weights.h5", np.load(p(".bf16.npy")),
                    np.asarray(f32.predict(x, batch_size=N, verbose=0)))

        rnd = np.load(p(".random.npy"))
        if rnd.shape == want.shape and np.max(np.abs(rnd - want)) < 1e-3:
            failures.append(f"{m}: --init random predicts like the file's weights")

        trained = [p(s) for s in (".trained.weights.h5", ".trained.keras") if os.path.exists(p(s))]
        if not trained:
            failures.append(f"{m}: no trained weights file was written")
        for t in trained:
            model = load(model_path(m))
            load_weights(model, t)
            got = np.load(p(".trained.npy"))
            compare(f"{m}: load_weights({os.path.basename(t)}) then predict", got,
                    np.asarray(model.predict(x, batch_size=N, verbose=0)))
            moved = max(float(np.max(np.abs(a - b)))
                        for a, b in zip(model.get_weights(), orig.get_weights()))
            print(f"  {m}: training moved the weights by up to {moved:.3g}")
            if moved < 1e-6:
                failures.append(f"{m}: the saved weights equal the initial ones")
            if t.endswith(".keras"):
                whole = load(t)
                compare(f"{m}: load_model({os.path.basename(t)}) then predict", got,
                        np.asarray(whole.predict(x, batch_size=N, verbose=0)))


# A keras-hub preset saved in bfloat16, as most real ones are (Gemma's,
# Llama's): its variables are bfloat16 in model.weights.h5. keras-hub trains
# it with float32 variables when loaded with from_preset(..., dtype=P); kdcc
# with --dtype-policy P. Its predictions under float32 and mixed_bfloat16,
# and under its own bfloat16 (issue 23: kdcc keeps the variables bfloat16).
PRESET_POLICIES = ("float32", "mixed_bfloat16", "bfloat16")


def bf16_preset(d):
    import keras
    import keras_hub

    keras.utils.set_random_seed(7)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=64, num_layers=2, num_query_heads=4, num_key_value_heads=2,
        hidden_dim=32, intermediate_dim=64, head_dim=8, dropout=0.0, dtype="bfloat16")
    task = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    task.save_to_preset(os.path.join(d, "bf16_preset"))
    rng = np.random.default_rng(11)
    x = rng.integers(0, 64, (8, 16)).astype(np.int32)
    mask = np.ones_like(x)
    mask[5, 11:] = 0  # one padded row
    np.save(os.path.join(d, "bf16_preset.x.npy"), x)
    np.save(os.path.join(d, "bf16_preset.mask.npy"), mask)
    for policy in PRESET_POLICIES:
        t = keras_hub.models.GemmaCausalLM.from_preset(
            os.path.join(d, "bf16_preset"), dtype=policy, preprocessor=None)
        want = np.asarray(t({"token_ids": x, "padding_mask": mask})).astype(np.float32)
        np.save(os.path.join(d, f"bf16_preset.{policy}.want.npy"), want)
    print("  bf16_preset: a keras-hub Gemma saved in bfloat16, keras-hub's predictions written")


def check_preset(d):
    # mixed_bfloat16: within a few bfloat16 steps of the logits (their
    # spacing is 1.6e-2 at 2 to 4); this checks the 16-bit file is read under
    # a mixed policy, keras_hub.sh's *_mixed cases check the policy's numbers
    for policy, tol in zip(PRESET_POLICIES, (TOL, 5e-2, 5e-2)):
        want = np.load(os.path.join(d, f"bf16_preset.{policy}.want.npy"))
        got = np.load(os.path.join(d, f"bf16_preset.{policy}.npy"))
        if got.shape != want.shape:
            failures.append(f"bf16_preset --dtype-policy {policy}: shape {got.shape}, "
                            f"keras-hub {want.shape}")
            continue
        err = float(np.max(np.abs(got - want)))
        ok = err <= tol
        print(f"  bf16_preset --dtype-policy {policy}: max |kdcc - keras-hub| = {err:.3g} "
              f"{'ok' if ok else 'DIFFERS'} (logits up to {float(np.max(np.abs(want))):.3g})")
        if not ok:
            failures.append(f"bf16_preset --dtype-policy {policy}: {err:.3g} > {tol}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] in ("preset", "check-preset"):
        (bf16_preset if sys.argv[1] == "preset" else check_preset)(sys.argv[2])
    elif len(sys.argv) < 4 or sys.argv[1] not in ("prepare", "check"):
        sys.exit(__doc__)
    else:
        cmd, d, models = sys.argv[1], sys.argv[2], sys.argv[3:]
        (prepare if cmd == "prepare" else check)(d, models)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
