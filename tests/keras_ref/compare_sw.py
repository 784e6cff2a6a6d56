"""tests/sh/sample_weight.sh's check: kdcc's --history and --save-weights
against Keras's (tests/keras_ref/sample_weight_ref.py's ref.json and
final.npz): every step's loss, each epoch's loss, weighted accuracy and val_
logs, the final evaluation and every final weight, within rtol. Standard
library only. Usage: compare_sw.py RTOL REF_DIR HISTORY.json WEIGHTS.h5"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_ref import compare_weights, npz, rel  # noqa: E402


def main():
    rtol, ref_dir, hist_path, weights_path = float(sys.argv[1]), *sys.argv[2:5]
    ref = json.load(open(os.path.join(ref_dir, "ref.json")))
    got = json.load(open(hist_path))
    bad, worst = [], 0.0

    def close(what, a, b):
        nonlocal worst
        d = rel(a, b)
        worst = max(worst, d)
        if d > rtol:
            bad.append(f"{what}: kdcc {a!r}, Keras {b!r} (relative {d:.2e})")

    if len(got["step_loss"]) != len(ref["step_loss"]):
        bad.append(f"{len(got['step_loss'])} steps, Keras {len(ref['step_loss'])}")
    for i, (a, b) in enumerate(zip(got["step_loss"], ref["step_loss"])):
        close(f"step {i + 1} loss", a, b)
    for k, vs in ref["history"].items():
        if k not in got:
            bad.append(f"no log '{k}' in {hist_path}")
            continue
        for e, (a, b) in enumerate(zip(got[k], vs)):
            close(f"epoch {e + 1} {k}", a, b)
    for k, b in ref["evaluate_weighted"].items():
        close(f"evaluate {k}", got["evaluate"][k], b)
    ww, wp = compare_weights(npz(os.path.join(ref_dir, "final.npz")), weights_path,
                             ref.get("final_weights_atol", {}), rtol, bad)
    for b in bad:
        print("  " + b)
    print(f"  worst: logs {worst:.2e}, weights {ww:.2e} ({wp})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
