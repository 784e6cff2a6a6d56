#!/usr/bin/env python3
"""issue 23: Keras 3.15's optimizers on one 16-bit variable, for
tests/opt16_check.c (tests/sh/opt16.sh): each optimizer (and clipping,
weight decay) updates a bfloat16 or float16 keras.Variable three times
from random 16-bit gradients, eagerly (JAX op by op: every op of
update_step a 16-bit op, rounded, the points kdcc follows) and, with
--jit, under jax.jit (XLA may keep a fused chain in float32: reported, not
required). Writes DIR/manifest.txt, one line per case:

    name kind optimizer n nslots lr beta_1 beta_2 epsilon rho momentum
    centered nesterov amsgrad weight_decay clipnorm global_clipnorm clipvalue

and DIR/<name>.bin: float32 arrays of n values each: the initial weights,
the three steps' gradients, then Keras's final weights and final slots (in
kdcc's slot order, opt_slot_name), eager then (with --jit) jit. And
DIR/penalties.txt (name kind what lo/l1 hi/l2 rate/rows): a constraint's
(64, 10) kernel and its constrained value (eager, then with --jit jit's), a
regularizer's kernel, penalty and gradient, or a Dense's (rows, 10) output
and its activity penalty, in DIR/<name>.bin.

Usage: python opt16_ref.py DIR [--jit]
"""
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
import jax  # noqa: E402
import numpy as np  # noqa: E402
import keras  # noqa: E402

N = 509
SLOTS = {  # kdcc's slot order (compiler/autodiff.c's opt_slot_name)
    "SGD": ["momentum"], "Adam": ["momentum", "velocity", "velocity_hat"],
    "AdamW": ["momentum", "velocity", "velocity_hat"],
    "RMSprop": ["velocity", "momentum", "average_gradient"], "Adagrad": ["accumulator"],
    "Adamax": ["momentum", "norm"], "Nadam": ["momentum", "velocity"], "Lion": ["momentum"],
}
DEFAULTS = dict(learning_rate=0.01, beta_1=0.9, beta_2=0.99, epsilon=1e-7, rho=0.9,
                momentum=0.0, centered=False, nesterov=False, amsgrad=False, weight_decay=0.0,
                clipnorm=0.0, global_clipnorm=0.0, clipvalue=0.0)
CASES = [
    ("rmsprop_centered", "RMSprop", dict(momentum=0.5, centered=True)),
    ("rmsprop_clipnorm", "RMSprop", dict(clipnorm=0.5)),
    ("adagrad", "Adagrad", dict(learning_rate=0.05, weight_decay=0.004)),
    ("adamax", "Adamax", dict(clipvalue=0.2)),
    ("nadam", "Nadam", dict(global_clipnorm=0.5)),
    ("lion", "Lion", dict(weight_decay=0.5)),
    ("adam_amsgrad", "Adam", dict(amsgrad=True)),
    ("sgd_nesterov", "SGD", dict(learning_rate=0.1, momentum=0.9, nesterov=True)),
]
KEYS = {"SGD": ["learning_rate", "momentum", "nesterov"],
        "Adam": ["learning_rate", "beta_1", "beta_2", "epsilon", "amsgrad"],
        "RMSprop": ["learning_rate", "rho", "momentum", "epsilon", "centered"],
        "Adagrad": ["learning_rate", "epsilon"],
        "Adamax": ["learning_rate", "beta_1", "beta_2", "epsilon"],
        "Nadam": ["learning_rate", "beta_1", "beta_2", "epsilon"],
        "Lion": ["learning_rate", "beta_1", "beta_2"]}


def make_opt(cls, cfg):
    kw = {k: cfg[k] for k in KEYS[cls]}
    for k in ("weight_decay", "clipnorm", "global_clipnorm", "clipvalue"):
        if cfg[k]:
            kw[k] = cfg[k]
    return getattr(keras.optimizers, cls)(**kw)


def slots(opt, cls, var):
    by_name = {}
    for v in opt.variables:
        for s in SLOTS[cls]:
            if v.path.endswith("_" + s):
                by_name[s] = np.asarray(v.numpy(), np.float32)
    return [by_name[s] for s in SLOTS[cls] if s in by_name]


def run(cls, cfg, dtype, w0, grads, jit):
    var = keras.Variable(w0, dtype=dtype, name="w")
    opt = make_opt(cls, cfg)
    opt.build([var])
    if not jit:
        for g in grads:
            opt.apply([keras.ops.convert_to_tensor(g, dtype=dtype)], [var])
        return [np.asarray(var.numpy(), np.float32)] + slots(opt, cls, var)
    step = jax.jit(opt.stateless_apply)
    ov, tv = [v.value for v in opt.variables], [var.value]
    for g in grads:
        tv, ov = step(ov, [keras.ops.convert_to_tensor(g, dtype=dtype)], tv)
    for v, x in zip(opt.variables, ov):
        v.assign(x)
    return [np.asarray(tv[0], np.float32)] + slots(opt, cls, var)


def main():
    out, jit = sys.argv[1], "--jit" in sys.argv
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(23)
    lines = []
    for dtype in ("bfloat16", "float16"):
        for name, cls, over in CASES:
            cfg = dict(DEFAULTS, **over)
            w0 = keras.ops.convert_to_numpy(keras.ops.cast(
                rng.uniform(-1, 1, N).astype(np.float32), dtype)).astype(np.float32)
            grads = [(rng.uniform(-0.5, 0.5, N) * np.where(np.arange(N) % 7, 1, 1e-3))
                     .astype(np.float32) for _ in range(3)]
            arrays = [w0] + grads + run(cls, cfg, dtype, w0, grads, False)
            nslots = len(arrays) - 5
            if jit:
                arrays += run(cls, cfg, dtype, w0, grads, True)
            case = f"{name}_{dtype}"
            np.concatenate(arrays).astype("<f4").tofile(os.path.join(out, case + ".bin"))
            lines.append(" ".join(str(x) for x in (
                case, dtype, cls, N, nslots, *(float(cfg[k]) for k in (
                    "learning_rate", "beta_1", "beta_2", "epsilon", "rho", "momentum")),
                int(cfg["centered"]), int(cfg["nesterov"]), int(cfg["amsgrad"]),
                *(float(cfg[k]) for k in ("weight_decay", "clipnorm", "global_clipnorm",
                                          "clipvalue")))))
    with open(os.path.join(out, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    # Constraints (constraints.py) and a regularizer (regularizers.py) on a
    # 16-bit (64, 10) kernel, eagerly: the constrained kernel; the penalty
    # and its gradient (jax.grad through the variable's dtype).
    more = []
    for dtype in ("bfloat16", "float16"):
        w = keras.ops.convert_to_numpy(keras.ops.cast(
            rng.uniform(-0.3, 0.3, (64, 10)).astype(np.float32), dtype))
        for name, con, lo, hi, rate in (
                ("maxnorm", keras.constraints.MaxNorm(0.6, axis=0), 0.0, 0.6, 1.0),
                ("minmaxnorm", keras.constraints.MinMaxNorm(0.2, 0.5, rate=0.5, axis=0),
                 0.2, 0.5, 0.5),
                ("nonneg", keras.constraints.NonNeg(), 0.0, 0.0, 0.0),
                ("unitnorm", keras.constraints.UnitNorm(axis=0), 1.0, 1.0, 1.0)):
            wc = w.copy()
            if name == "unitnorm":  # a zero column and a tiny one: float16's 0 * inf, inf
                wc[:, 0], wc[:, 1] = 0, np.asarray(1e-6, dtype)
            r = [np.asarray(con(keras.ops.convert_to_tensor(wc)), np.float32)]
            if jit:  # what fit runs: the optimizer's constraint in its jitted step
                r.append(np.asarray(jax.jit(con)(jax.numpy.asarray(wc)), np.float32))
            case = f"{name}_{dtype}"
            np.concatenate([wc.astype(np.float32).ravel()] + [x.ravel() for x in r]).astype(
                "<f4").tofile(os.path.join(out, case + ".bin"))
            more.append(f"{case} {dtype} constraint {lo} {hi} {rate}")
        reg = keras.regularizers.L1L2(l1=1e-3, l2=1e-2)
        wt = jax.numpy.asarray(w)
        value, grad = jax.value_and_grad(lambda x: reg(x).astype("float32"))(wt)
        case = f"l1l2_{dtype}"
        np.concatenate([w.astype(np.float32).ravel(), [np.float32(value)],
                        np.asarray(grad, np.float32).ravel()]).astype("<f4").tofile(
            os.path.join(out, case + ".bin"))
        more.append(f"{case} {dtype} l1l2 0.001 0.01 0")
    # An activity regularizer's penalty (Layer.__call__: the regularizer on
    # the output, in the compute dtype, divide_no_nan by the batch size cast
    # to it) under each 16-bit policy, eagerly: a Dense's (6, 10) output
    # and the penalty (6 rows: a division that rounds).
    for policy in ("bfloat16", "mixed_bfloat16", "float16", "mixed_float16"):
        dense = keras.layers.Dense(10, activity_regularizer=keras.regularizers.L1L2(1e-3, 1e-2),
                                   dtype=policy)
        y = dense(rng.normal(size=(6, 12)).astype(np.float32))
        assert len(dense.losses) == 1 and dense.losses[0].dtype == y.dtype, policy
        case = f"activity_{policy}"
        np.concatenate([np.asarray(y, np.float32).ravel(),
                        [np.float32(dense.losses[0])]]).astype("<f4").tofile(
            os.path.join(out, case + ".bin"))
        more.append(f"{case} {y.dtype} activity 0.001 0.01 6")
    with open(os.path.join(out, "penalties.txt"), "w") as f:
        f.write("\n".join(more) + "\n")
    print(f"opt16_ref: {len(lines)} cases ({'eager and jit' if jit else 'eager'}) in {out}")


if __name__ == "__main__":
    main()
