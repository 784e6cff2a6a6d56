#!/usr/bin/env python3
"""Compare one kdcc run with the Keras reference of its case (standard
library only: runs in `make test` with no numpy or h5py).

usage: compare_ref.py RTOL CASE.json HISTORY.json SAVED.weights.h5 [--csv LOG.csv]
                      [--best BEST.weights.h5]

CASE.json comes from tests/keras_ref/run_ref.py (with final.npz beside it);
HISTORY.json is the program's --history, SAVED the --save-weights output.
Checked, all within RTOL:
  - every train step's loss (history step_loss vs Keras's train_on_batch),
    relative to Keras's value;
  - each epoch's mean loss and the evaluate loss, likewise;
  - every other log Keras recorded (per-output losses "<output>_loss",
    metrics "accuracy", "<output>_accuracy", ...) that the history holds
    too: per step (history "step_logs": {name: [...]}, or "step_<name>"),
    per epoch (history "<name>": [...], and the val_ ones, which a case
    trained with Keras's fit must have) and in "evaluate"; losses relative
    to Keras's value, metrics within RTOL * max(1, |Keras|). Logs the
    history lacks are named, not failed;
  - with Keras's callbacks (the case's "callbacks"): the epochs run
    ("epochs_run": EarlyStopping) and ReduceLROnPlateau's learning_rate
    per epoch (relative), which the history must have;
  - every final weight: |kdcc - keras| <= RTOL * max|keras tensor|, per
    tensor (the tensor's scale: an elementwise ratio means nothing for
    weights that cross zero), matched by their model.weights.h5 path;
    a tensor the case lists in "final_weights_atol" (attention key biases,
    whose gradient is zero in exact arithmetic: Keras's values are noise)
    is checked as |kdcc - keras| <= that absolute tolerance instead; one it
    lists in "frozen_weights" (a frozen layer's, which Keras left as they
    were) must be Keras's bit for bit.
  - BEST.weights.h5, the program's --checkpoint-best, against Keras's
    ModelCheckpoint(save_best_only=True) file (the case's "checkpoint_best"),
    as the final weights;
  - LOG.csv, the program's --csv-log, against Keras's CSVLogger file
    (the case's "csv_log"): the same bytes but for the digits of the
    numbers (header, row ends, NA fields), every number within RTOL as above.
A case's own "rtol" replaces RTOL (issue 23's mixed-precision cases, whose
rounding points are not unique); with "update_rtol" the final weights are
checked as the training update instead: per tensor, ||(kdcc - initial) -
(keras - initial)|| <= update_rtol * ||keras - initial|| (the case's
"initial_weights"); with "float32_step_loss" (Keras's float32 run from the
same weights) the step losses must be at least "float32_min_distance"
times Keras's own largest distance from it away from it (the largest
difference over the steps), so that a run that skipped the rounding fails
(a null float32 loss: a step the mixed run's loss scale skipped, left out);
"mixed_step_loss" and "mixed_min_distance" likewise (a bfloat16 case: Keras's
mixed_bfloat16 run from the same weights, whose variables stay float32).
With "step_loss_scale" (issue 23: Keras's LossScaleOptimizer's scale after
each step) the history's step_loss_scale must be equal, step for step, and
its "iterations" Keras's optimizer_iterations (the skipped steps are none).
Prints the worst relative difference of each kind; exit status 1 when any
is over RTOL or anything is missing."""

import ast
import json
import os
import struct
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h5lite  # noqa: E402


def npy(data):
    """(shape, flat list) of a little-endian, C-order .npy held in data."""
    if data[:6] != b"\x93NUMPY":
        raise ValueError("not a .npy")
    hl = struct.unpack_from("<H" if data[6] == 1 else "<I", data, 8)[0]
    off = 10 if data[6] == 1 else 12
    header = ast.literal_eval(data[off:off + hl].decode("latin1"))
    if header["fortran_order"]:
        raise ValueError("Fortran order")
    code = {"<f4": "f", "<f8": "d", "<i4": "i", "<i8": "q", "|u1": "B"}[header["descr"]]
    shape = tuple(header["shape"])
    n = 1
    for s in shape:
        n *= s
    return shape, list(struct.unpack_from("<%d%s" % (n, code), data, off + hl))


def npz(path):
    with zipfile.ZipFile(path) as z:
        return {name[:-4]: npy(z.read(name)) for name in z.namelist() if name.endswith(".npy")}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def within_atol(path, got_w, want_w, atol, bad):
    """A tensor whose gradient is zero in exact arithmetic (a key bias):
    compared absolutely, within atol."""
    d = max(abs(a - b) for a, b in zip(got_w, want_w))
    if d > atol:
        bad.append(f"{path}: max |kdcc - keras| = {d:.2e} > {atol:.2e} "
                   "(absolute: its gradient is zero in exact arithmetic)")


def compare_weights(want, got_path, atol, rtol, bad, frozen=()):
    """Every tensor of want ({path: (shape, values)}) against the .weights.h5
    at got_path, per tensor (see the top); (worst difference, its path)."""
    saved = h5lite.datasets(got_path)
    worst_w, worst_path = 0.0, None
    for path, (shape, want_w) in sorted(want.items()):
        if path not in saved:
            bad.append(f"{got_path} has no {path} (it has {sorted(saved)})")
            continue
        gshape, got_w = saved[path]
        if tuple(gshape) != tuple(shape):
            bad.append(f"{path}: shape {tuple(gshape)}, Keras {tuple(shape)}")
            continue
        if path in frozen and got_w != want_w:
            bad.append(f"{got_path}: {path} is frozen (trainable false) but changed")
        if path in atol:
            within_atol(path, got_w, want_w, atol[path], bad)
            continue
        scale = max(max(abs(v) for v in want_w), 1e-12)
        d = max(abs(a - b) for a, b in zip(got_w, want_w)) / scale
        if d > worst_w:
            worst_w, worst_path = d, path
        if d > rtol:
            bad.append(f"{got_path}: {path}: max |kdcc - keras| = {d:.2e} of max |keras|")
    return worst_w, worst_path


def compare_updates(want, initial, got_path, atol, rtol, bad):
    """issue 23: every tensor's training update (final minus initial) against
    Keras's, relative in norm (see the top); (worst difference, its path)."""
    saved = h5lite.datasets(got_path)
    worst_w, worst_path = 0.0, None
    for path, (shape, want_w) in sorted(want.items()):
        if path not in saved or tuple(saved[path][0]) != tuple(shape):
            bad.append(f"{got_path} has no {path} of shape {tuple(shape)}")
            continue
        got_w, init = saved[path][1], initial[path][1]
        if path in atol:
            within_atol(path, got_w, want_w, atol[path], bad)
            continue
        num = sum((a - b) ** 2 for a, b in zip(got_w, want_w)) ** 0.5
        den = sum((b - i) ** 2 for b, i in zip(want_w, init)) ** 0.5
        d = num / max(den, 1e-12)
        if d > worst_w:
            worst_w, worst_path = d, path
        if d > rtol:
            bad.append(f"{got_path}: {path}: ||update - keras's|| = {d:.2e} of ||keras's||")
    return worst_w, worst_path


def compare_csv(got_path, want_path, close, bad):
    """A CSVLogger file against Keras's: the header and every non-number
    field (epoch, NA) byte for byte, numbers by close(key, got, want)."""
    got, want = open(got_path, "rb").read(), open(want_path, "rb").read()
    gl, wl = got.split(b"\r\n"), want.split(b"\r\n")
    if len(gl) != len(wl) or gl[0] != wl[0]:
        bad.append(f"{got_path}: {len(gl) - 1} lines, header {gl[0]!r}; Keras's CSVLogger "
                   f"{len(wl) - 1}, {wl[0]!r}")
        return
    keys = wl[0].decode().split(",")
    for i, (g, w) in enumerate(zip(gl[1:], wl[1:])):
        for k, a, b in zip(keys, g.decode().split(","), w.decode().split(",")):
            try:
                ok = k != "epoch" and close(k, float(a), float(b))
            except ValueError:
                ok = False
            if a != b and not ok:
                bad.append(f"{got_path} line {i + 2}: {k} {a}, Keras's CSVLogger {b}")
                return


def main():
    opts = dict(zip(sys.argv[5::2], sys.argv[6::2]))
    if len(sys.argv) < 5 or len(sys.argv) % 2 == 0 or set(opts) - {"--csv", "--best"}:
        print(__doc__.split("\n\n")[1])
        return 2
    ref = json.load(open(sys.argv[2]))
    rtol = float(ref.get("rtol", sys.argv[1]))
    hist = json.load(open(sys.argv[3]))
    name = ref["case"]
    bad = []

    # losses
    got = hist.get("step_loss")
    want = ref["step_loss"]
    if got is None or len(got) != len(want):
        bad.append(f"step_loss has {None if got is None else len(got)} entries, "
                   f"Keras {len(want)}")
        worst_step = float("inf")
    else:
        worst_step = max(rel(a, b) for a, b in zip(got, want))
        i = max(range(len(want)), key=lambda k: rel(got[k], want[k]))
        if worst_step > rtol:
            bad.append(f"step {i + 1}: loss {got[i]!r}, Keras {want[i]!r}")
    if "epochs_run" in ref and len(hist["loss"]) != ref["epochs_run"]:  # EarlyStopping
        bad.append(f"{len(hist['loss'])} epochs ran, Keras's callbacks ran {ref['epochs_run']} "
                   f"of {ref['epochs']}")
    worst_epoch = max([rel(a, b) for a, b in zip(hist["loss"], ref["epoch_loss"])] +
                      [rel(hist["evaluate"]["loss"], ref["evaluate"]["loss"])])
    if len(hist["loss"]) != len(ref["epoch_loss"]) or worst_epoch > rtol:
        bad.append(f"epoch losses {hist['loss']} / evaluate {hist['evaluate']['loss']}, "
                   f"Keras {ref['epoch_loss']} / {ref['evaluate']['loss']}")

    # final weights (and ModelCheckpoint's)
    here = os.path.dirname(sys.argv[2])
    if "update_rtol" in ref:
        worst_w, worst_path = compare_updates(npz(os.path.join(here, ref["final_weights"])),
                                              npz(os.path.join(here, ref["initial_weights"])),
                                              sys.argv[4], ref.get("final_weights_atol", {}),
                                              ref["update_rtol"], bad)
    else:
        worst_w, worst_path = compare_weights(npz(os.path.join(here, ref["final_weights"])),
                                              sys.argv[4], ref.get("final_weights_atol", {}),
                                              rtol, bad, ref.get("frozen_weights", []))
    # issue 23: a mixed run must be away from the float32 one; a bfloat16 one
    # from the float32 and the mixed_bfloat16 ones
    f32_note = ""
    for twin in ("float32", "mixed"):
        f32 = ref.get(twin + "_step_loss")
        if not (f32 and got and len(got) == len(f32)):
            continue
        d32 = max(abs(a - b) for a, b in zip(want, f32) if b is not None)
        dk = max(abs(a - b) for a, b in zip(got, f32) if b is not None)
        f32_note += f", from {twin} {dk:.2e} (Keras {d32:.2e})"
        if dk < ref[twin + "_min_distance"] * d32:
            bad.append(f"the step losses are {dk:.2e} from Keras's {twin} run, less than "
                       f"{ref[twin + '_min_distance']} x Keras's own {d32:.2e}: rounding skipped?")
    # issue 23: the loss scale, exactly (powers of two), and the steps it skipped
    scale_note = ""
    if "step_loss_scale" in ref:
        gs, ws = hist.get("step_loss_scale"), ref["step_loss_scale"]
        if gs != ws:
            bad.append(f"step_loss_scale {gs}, Keras {ws}")
        if hist.get("iterations") != ref["optimizer_iterations"]:
            bad.append(f"the optimizer's iterations {hist.get('iterations')}, Keras "
                       f"{ref['optimizer_iterations']}")
        scale_note = (f", loss scale {'equal' if gs == ws else 'DIFFERS'} "
                      f"({len(ref['skipped_steps'])} skipped)")
    if "--best" in opts:
        compare_weights(npz(os.path.join(here, ref["checkpoint_best"])), opts["--best"], {},
                        rtol, bad)

    # every other log (several outputs: "<output>_loss"; metrics), where the
    # history has it
    worst_log, unchecked = 0.0, []

    def log_diff(key, a, b):
        relative = key.endswith("loss") or key == "learning_rate"
        return rel(a, b) if relative else abs(a - b) / max(abs(b), 1.0)

    def compare_list(key, what, got_l, want_l):
        nonlocal worst_log
        if len(got_l) != len(want_l):
            bad.append(f"{what} {key} has {len(got_l)} entries, Keras {len(want_l)}")
            return
        for i, (a, b) in enumerate(zip(got_l, want_l)):
            if a is None:
                bad.append(f"{what} {key}[{i}] is null, Keras {b!r}")
                return
            d = log_diff(key, a, b)
            worst_log = max(worst_log, d)
            if d > rtol:
                bad.append(f"{what} {i + 1}: {key} {a!r}, Keras {b!r}")
                return

    hist_steps = hist.get("step_logs", {})
    for key, want_l in ref.get("step_logs", {}).items():
        if key == "loss":
            continue
        got_l = hist_steps.get(key, hist.get("step_" + key))
        if got_l is None:
            unchecked.append(f"step {key}")
        else:
            compare_list(key, "step", got_l, want_l)
    for key, want_l in ref.get("epoch_logs", {}).items():
        if key == "loss":
            continue
        if isinstance(hist.get(key), list):
            compare_list(key, "epoch", hist[key], want_l)
        elif key.startswith("val_") or key == "learning_rate":
            # fit's validation logs, ReduceLROnPlateau's: the history must have them
            bad.append(f"the history has no {key} (Keras's History: {want_l})")
        else:
            unchecked.append(f"epoch {key}")
    for key, b in ref["evaluate"].items():
        if key == "loss":
            continue
        a = hist.get("evaluate", {}).get(key)
        if a is None:
            unchecked.append(f"evaluate {key}")
            continue
        d = log_diff(key, a, b)
        worst_log = max(worst_log, d)
        if d > rtol:
            bad.append(f"evaluate {key} {a!r}, Keras {b!r}")

    if "--csv" in opts:
        compare_csv(opts["--csv"], os.path.join(here, ref["csv_log"]),
                    lambda key, a, b: log_diff(key, a, b) <= rtol, bad)

    metric = ref.get("metric")
    note = ""
    if metric and metric in hist.get("evaluate", {}):
        note = (f"; evaluate {metric} {hist['evaluate'][metric]:.4f} "
                f"(Keras {ref['evaluate'][metric]:.4f})")
    print(f"  {name}: worst relative difference: step losses {worst_step:.2e}, "
          f"epoch/evaluate losses {worst_epoch:.2e}{f32_note}{scale_note}, "
          f"{'updates' if 'update_rtol' in ref else 'final weights'} {worst_w:.2e}"
          f"{f', other logs {worst_log:.2e}' if len(ref.get('step_logs', {})) > 1 else ''}"
          f"{f' ({worst_path})' if worst_path else ''}{note} "
          f"({'ok' if not bad else 'DIFFERS'})")
    if unchecked:
        print(f"    not in the history, not checked: {', '.join(unchecked)}")
    for b in bad:
        print(f"    {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
