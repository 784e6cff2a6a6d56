#!/usr/bin/env python3
"""compare.py: the GPU check's comparisons (standard library only).

compare.py hist REFDIR GOTDIR NAMES [--tol X] [--label TEXT]
    For each name, REFDIR/NAME.cpu.json (the CPU program's --history) against
    GOTDIR/NAME.cuda.json: every loss (per epoch, per step, validation,
    evaluate) within X (default 1e-5) relative to max(1, |loss|). NAMES: a
    comma-separated list, or @FILE with one name a line. Prints one line,
    "LABEL: K/N within X[; differ: NAME(worst at KEY) ...]", then one line per
    name that differs; exit status 1 when any differs or is missing.
compare.py speed RESDIR
    The speed table: kdcc against torch eager, torch.compile and Keras on JAX,
    from RESDIR/perf/{kdcc.txt,torch.json,keras.json}."""
import json, math, os, sys


def losses(h):
    out = {f"{k}[{i}]": v for k in ("loss", "step_loss", "val_loss") for i, v in enumerate(h.get(k, []))}
    if "loss" in h.get("evaluate", {}):
        out["evaluate.loss"] = h["evaluate"]["loss"]
    return out


def worst(a, b):
    """The largest relative difference of two loss maps, and where: (inf, why)
    when the keys differ or a loss is not a number (null in the JSON: nan, inf)."""
    if set(a) != set(b):
        return math.inf, "keys " + " ".join(sorted(set(a) ^ set(b)))[:60]
    w, wk = 0.0, None
    for k in sorted(a):
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a[k], b[k])):
            return math.inf, f"{k}={b[k]!r} vs {a[k]!r}"
        e = abs(a[k] - b[k]) / max(1.0, abs(a[k]))
        if e > w:
            w, wk = e, k
    return w, wk


def hist(ref, got, names, tol, label):
    ok, bad, lines = 0, [], []
    for n in names:
        rp, gp = f"{ref}/{n}.cpu.json", f"{got}/{n}.cuda.json"
        miss = [p for p in (rp, gp) if not os.path.exists(p)]
        if miss:
            bad.append(f"{n}(missing)")
            lines.append(f"  {n}: missing {' '.join(miss)}")
            continue
        try:
            w, k = worst(losses(json.load(open(rp))), losses(json.load(open(gp))))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            w, k = math.inf, f"unreadable: {e}"
        if w <= tol:
            ok += 1
        else:
            bad.append(f"{n}({w:.1e} at {k})" if math.isfinite(w) else f"{n}({k})")
            lines.append(f"  {n}: worst {w:.2e} at {k}")
    print(f"{label}: {ok}/{len(names)} within {tol:g}" + (f"; differ: {' '.join(bad)}" if bad else ""))
    for l in lines:
        print(l)
    return 0 if ok == len(names) else 1


def speed(R):
    rows = {}
    p = f"{R}/perf/kdcc.txt"
    for line in open(p) if os.path.exists(p) else []:
        m, pr, b, s = line.split()
        # PREC"base": the same program from an earlier commit (device.sh's
        # EXTRA), timed in the same run: the column that shows what changed
        key = "base" if pr.endswith("base") else "kdcc"
        rows.setdefault((m, pr.removesuffix("base"), int(b)), {})[key] = float(s)
    if os.path.exists(f"{R}/perf/torch.json"):
        for r in json.load(open(f"{R}/perf/torch.json"))["results"]:
            rows.setdefault((r["model"], r["prec"], r["batch"]), {})["torch " + r["mode"]] = r["nosync"]
    if os.path.exists(f"{R}/perf/keras.json"):
        for r in json.load(open(f"{R}/perf/keras.json"))["results"]:
            # Keras-JAX's float32 products run as TF32 on these GPUs: compare it with
            # the tf32 row (or the fp32 row of a model that has no tf32 one)
            pr = "tf32" if (r["model"], "tf32", r["batch"]) in rows else "fp32"
            if (r["model"], pr, r["batch"]) in rows:
                rows[(r["model"], pr, r["batch"])]["keras-jax"] = r["steps_per_s"]
    if not rows:
        print("speed: no timings (phases perf, torch, keras skipped or out of time)")
        return 0
    print(f"{'steps/s':10s} {'prec':5s} {'batch':>5s} {'kdcc':>8s} {'base':>8s} {'torch':>8s} {'compile':>8s} {'keras':>8s}  kdcc/best kdcc/base")
    for (m, pr, b), v in rows.items():
        peers = [v[k] for k in ("torch eager", "torch compile", "keras-jax") if k in v]
        ratio = f"{v['kdcc'] / max(peers):.2f}" if peers and "kdcc" in v else "-"
        f = lambda k: f"{v[k]:8.1f}" if k in v else f"{'-':>8s}"
        gain = f"{v['kdcc'] / v['base']:.2f}" if "base" in v and "kdcc" in v else "-"
        print(f"{m:10s} {pr:5s} {b:5d} {f('kdcc')} {f('base')} {f('torch eager')} {f('torch compile')} "
              f"{f('keras-jax')}  {ratio:>9s} {gain:>9s}")
    return 0


def main(argv):
    if len(argv) >= 4 and argv[0] == "hist":
        ref, got, names = argv[1], argv[2], argv[3]
        opts = dict(zip(argv[4::2], argv[5::2]))
        if names.startswith("@"):
            names = [l.strip() for l in open(names[1:]) if l.strip()]
        else:
            names = [n for n in names.split(",") if n]
        return hist(ref, got, names, float(opts.get("--tol", 1e-5)), opts.get("--label", "losses vs CPU"))
    if len(argv) == 2 and argv[0] == "speed":
        return speed(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
