#!/usr/bin/env python3
"""Draw random small Keras 3 MLPs, valid layout maps and meshes for kdcc's
mesh-equivalence property test (tests/sh/property.sh).

usage: property_gen.py --seed S --count N --out DIR [--first K]

Writes DIR/case_XXX/ for each case, with
  model.json   the model, as Keras 3 writes it (model.to_json(), or config.json
               of a .keras archive): Functional with inbound_nodes/keras_history,
               or Sequential
  dist.json    a ModelParallel spec whose layout map is valid on every mesh below
  meshes.txt   one --mesh argument a line; the first is the one-device reference
  batch.txt    the global batch size (divisible by every 'data' size)
  summary.txt  a one-line human description of the case

Python 3 standard library only; the same --seed and --count give the same files.
Case i depends only on (seed, i), so a failing case can be regenerated alone with
--first i --count 1.

Validity (what real Keras/JAX would accept, and so what kdcc must accept):
  * every key matches what it is meant to: an exact key wins, otherwise keys
    are tried as regexes with full match and at most one may match a path;
  * a layout has one entry per dimension, names only mesh axes, never names an
    axis twice;
  * every sharded dimension is divisible by every size its axis takes in the
    case's meshes (so the same spec is valid for all of them);
  * batch sizes are divisible by every size of the batch axis 'data'.
The generator checks this itself by resolving every variable path and every
'<layer>/output' lookup through the map, exactly as Keras does.
"""
import argparse
import math
import json
import os
import random
import re

UNITS = [4, 8, 12, 16, 24, 32]
HIDDEN_ACTS = ["linear", "relu", "sigmoid", "tanh", "gelu", "silu"]
INPUT_DIMS = [8, 12, 16, 24, 32]


# ---------------------------------------------------------------- JSON pieces

def dtype_policy(shared):
    d = {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
         "registered_name": None}
    if shared:
        d["shared_object_id"] = 1
    return d


def initializer(cls, cfg):
    return {"module": "keras.initializers", "class_name": cls, "config": cfg,
            "registered_name": None}


def keras_tensor(layer, width):
    return {"class_name": "__keras_tensor__",
            "config": {"shape": [None, width], "dtype": "float32",
                       "keras_history": [layer, 0, 0]}}


class Layer:
    def __init__(self, cls, name, width, inputs=(), **kw):
        self.cls = cls            # Dense, Dropout, Add, Concatenate
        self.name = name
        self.width = width        # output feature width
        self.inputs = list(inputs)  # list of (layer name, width)
        self.kw = kw              # units/activation/use_bias/rate


def layer_json(l, functional, first):
    shared = not first
    if l.cls == "Dense":
        cfg = {"name": l.name, "trainable": True, "dtype": dtype_policy(shared),
               "units": l.width, "activation": l.kw["activation"], "use_bias": l.kw["use_bias"],
               "kernel_initializer": initializer(
                   "GlorotUniform", {"seed": None, "input_axes": None, "output_axes": None}),
               "bias_initializer": initializer("Zeros", {}),
               "kernel_regularizer": None, "bias_regularizer": None,
               "kernel_constraint": None, "bias_constraint": None,
               "quantization_config": None}
    elif l.cls == "Dropout":
        cfg = {"name": l.name, "trainable": True, "dtype": dtype_policy(shared),
               "rate": l.kw["rate"], "seed": None, "noise_shape": None}
    elif l.cls == "Add":
        cfg = {"name": l.name, "trainable": True, "dtype": dtype_policy(shared)}
    elif l.cls == "Concatenate":
        cfg = {"name": l.name, "trainable": True, "dtype": dtype_policy(shared), "axis": -1}
    else:
        raise ValueError(l.cls)
    env = {"module": "keras.layers", "class_name": l.cls, "config": cfg, "registered_name": None}
    # Keras writes build_config for every built layer that has build() state
    # (Dropout has none).
    if l.cls == "Dense":
        env["build_config"] = {"input_shape": [None, l.inputs[0][1]]}
    elif l.cls in ("Add", "Concatenate"):
        env["build_config"] = {"input_shape": [[None, w] for _, w in l.inputs]}
    if functional:
        env["name"] = l.name
        if len(l.inputs) == 1:
            args = [keras_tensor(*l.inputs[0])]
        else:
            args = [[keras_tensor(n, w) for n, w in l.inputs]]
        env["inbound_nodes"] = [{"args": args, "kwargs": {}}]
    return env


def input_json(name, width, functional):
    env = {"module": "keras.layers", "class_name": "InputLayer",
           "config": {"batch_shape": [None, width], "dtype": "float32", "sparse": False,
                      "ragged": False, "name": name, "optional": False},
           "registered_name": None}
    if functional:
        env["name"] = name
        env["inbound_nodes"] = []
    return env


def f32(x):
    """A float32 value printed as a double, as Keras writes learning rates."""
    import struct
    return struct.unpack("f", struct.pack("f", x))[0]


def optimizer_json(rng):
    kind = rng.choice(["sgd", "sgd_momentum", "sgd_nesterov", "adam", "adamw", "rmsprop"])
    common = {"weight_decay": None, "clipnorm": None, "global_clipnorm": None,
              "clipvalue": None, "use_ema": False, "ema_momentum": 0.99,
              "ema_overwrite_frequency": None, "loss_scale_factor": None,
              "gradient_accumulation_steps": None}
    if kind.startswith("sgd"):
        lr = rng.choice([0.01, 0.05, 0.1])
        mom = 0.0 if kind == "sgd" else rng.choice([0.5, 0.9])
        cfg = {"name": "sgd", "learning_rate": f32(lr), **common, "momentum": mom,
               "nesterov": kind == "sgd_nesterov"}
        cls = "SGD"
    elif kind == "adam":
        cfg = {"name": "adam", "learning_rate": f32(rng.choice([0.001, 0.01])), **common,
               "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-07, "amsgrad": False}
        cls = "Adam"
    elif kind == "adamw":
        cfg = {"name": "adamw", "learning_rate": f32(rng.choice([0.001, 0.01])), **common,
               "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-07, "amsgrad": False}
        cfg["weight_decay"] = rng.choice([0.004, 0.01])
        cls = "AdamW"
    else:
        cfg = {"name": "rmsprop", "learning_rate": f32(rng.choice([0.001, 0.01])), **common,
               "rho": 0.9, "momentum": rng.choice([0.0, 0.0, 0.5]), "epsilon": 1e-07,
               "centered": False}
        cls = "RMSprop"
    return kind, {"module": "keras.optimizers", "class_name": cls, "config": cfg,
                  "registered_name": None}


def loss_envelope(cls, name, from_logits, sparse):
    cfg = {"name": name, "reduction": "sum_over_batch_size", "from_logits": from_logits}
    if sparse:
        cfg["ignore_class"] = None
    else:
        cfg["label_smoothing"] = 0.0
        cfg["axis"] = -1
    return {"module": "keras.losses", "class_name": cls, "config": cfg, "registered_name": None}


def pick_loss(rng):
    """-> (description, loss JSON, output units or None (free), output activation or None)"""
    k = rng.choice(["mse", "mae", "cce", "cce_logits", "scce", "scce_logits", "bce"])
    if k in ("mse", "mae"):
        name = rng.choice({"mse": ["mse", "mean_squared_error"],
                           "mae": ["mae", "mean_absolute_error"]}[k])
        return k, name, None, None
    if k == "cce":
        loss = rng.choice(["categorical_crossentropy",
                           loss_envelope("CategoricalCrossentropy", "categorical_crossentropy",
                                         False, False)])
        return k, loss, None, "softmax"
    if k == "cce_logits":
        return k, loss_envelope("CategoricalCrossentropy", "categorical_crossentropy", True,
                                False), None, "linear"
    if k == "scce":
        loss = rng.choice(["sparse_categorical_crossentropy",
                           loss_envelope("SparseCategoricalCrossentropy",
                                         "sparse_categorical_crossentropy", False, True)])
        return k, loss, None, "softmax"
    if k == "scce_logits":
        return k, loss_envelope("SparseCategoricalCrossentropy",
                                "sparse_categorical_crossentropy", True, True), None, "linear"
    return k, "binary_crossentropy", 1, "sigmoid"


# ---------------------------------------------------------------- the model

class Namer:
    def __init__(self, rng):
        self.auto = rng.random() < 0.5
        self.counts = {}

    def __call__(self, cls, last=False):
        if self.auto:   # Keras' own names: dense, dense_1, dropout, add, concatenate...
            base = {"Dense": "dense", "Dropout": "dropout", "Add": "add",
                    "Concatenate": "concatenate"}[cls]
            n = self.counts.get(base, 0)
            self.counts[base] = n + 1
            return base if n == 0 else f"{base}_{n}"
        if last:
            return "out"
        n = self.counts.get(cls, 0) + 1
        self.counts[cls] = n
        return {"Dense": "d", "Dropout": "drop", "Add": "add", "Concatenate": "cat"}[cls] + str(n)


def gen_model(rng):
    functional = rng.random() < 0.6
    namer = Namer(rng)
    d_in = rng.choice(INPUT_DIMS)
    in_name = "input_layer" if (namer.auto or not functional) else "x"
    layers = []
    cur = (in_name, d_in)

    def dense(inp, units, act):
        l = Layer("Dense", namer("Dense"), units, [inp], activation=act,
                  use_bias=rng.random() < 0.75)
        layers.append(l)
        return (l.name, units)

    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if functional and r < 0.22:     # two same-width branches, added
            u = rng.choice(UNITS)
            b1 = dense(cur, u, rng.choice(HIDDEN_ACTS))
            b2 = dense(cur, u, rng.choice(HIDDEN_ACTS)) if rng.random() < 0.8 or cur[1] != u \
                else cur   # a residual: cur + dense(cur)
            l = Layer("Add", namer("Add"), u, [b1, b2])
            layers.append(l)
            cur = (l.name, u)
        elif functional and r < 0.4:    # concatenation of two branches (or a skip)
            b1 = dense(cur, rng.choice(UNITS), rng.choice(HIDDEN_ACTS))
            b2 = dense(cur, rng.choice(UNITS), rng.choice(HIDDEN_ACTS)) \
                if rng.random() < 0.7 else cur
            l = Layer("Concatenate", namer("Concatenate"), b1[1] + b2[1], [b1, b2])
            layers.append(l)
            cur = (l.name, l.width)
        elif r < 0.55 and layers and layers[-1].cls != "Dropout":
            l = Layer("Dropout", namer("Dropout"), cur[1], [cur],
                      rate=rng.choice([0.1, 0.2, 0.25, 0.3, 0.4, 0.5]))
            layers.append(l)
            cur = (l.name, cur[1])
        else:
            cur = dense(cur, rng.choice(UNITS), rng.choice(HIDDEN_ACTS))

    loss_kind, loss, out_units, out_act = pick_loss(rng)
    if out_units is None:
        out_units = rng.choice(UNITS)
    if out_act is None:
        out_act = rng.choice(HIDDEN_ACTS + ["softmax"])
    l = Layer("Dense", namer("Dense", last=True), out_units, [cur], activation=out_act,
              use_bias=rng.random() < 0.75)
    layers.append(l)

    opt_kind, opt = optimizer_json(rng)
    metrics = ["accuracy"] if rng.random() < 0.4 else None
    compile_config = {"optimizer": opt, "loss": loss, "loss_weights": None, "metrics": metrics,
                      "weighted_metrics": None, "run_eagerly": False, "steps_per_execution": 1,
                      "jit_compile": True}
    if functional:
        mname = rng.choice(["functional", "functional", "mlp", "net"])
        jl = [input_json(in_name, d_in, True)] + \
            [layer_json(x, True, i == 0) for i, x in enumerate(layers)]
        model = {"module": "keras.src.models.functional", "class_name": "Functional",
                 "config": {"name": mname, "trainable": True, "layers": jl,
                            "input_layers": [in_name, 0, 0],
                            "output_layers": [layers[-1].name, 0, 0]},
                 "registered_name": "Functional", "build_config": {"input_shape": None},
                 "compile_config": compile_config}
    else:
        mname = rng.choice(["sequential", "sequential", "mlp"])
        jl = [input_json(in_name, d_in, False)] + \
            [layer_json(x, False, False) for x in layers]
        model = {"module": "keras", "class_name": "Sequential",
                 "config": {"name": mname, "trainable": True, "dtype": dtype_policy(True),
                            "layers": jl, "build_input_shape": [None, d_in]},
                 "registered_name": None, "build_config": {"input_shape": [None, d_in]},
                 "compile_config": compile_config}
    info = {"functional": functional, "name": mname, "input": (in_name, d_in),
            "layers": layers, "loss": loss_kind, "opt": opt_kind,
            "accuracy": metrics is not None}
    return model, info


# ---------------------------------------------------------------- meshes and layouts

def gen_meshes(rng, three_axes):
    axes = ["data", "model", "extra"] if three_axes else ["data", "model"]
    sizes = {"data": [1, 2, 4, 8], "model": [1, 2, 2, 4, 4, 8, 3], "extra": [1, 2, 2, 4, 3]}
    cands = set()
    for _ in range(200):
        s = tuple(rng.choice(sizes[a]) for a in axes)
        p = 1
        for x in s:
            p *= x
        if 1 < p <= 8:
            cands.add(s)
    cands = sorted(cands)
    picked = rng.sample(cands, 2)
    meshes = [tuple(1 for _ in axes)] + picked
    return axes, meshes


def paths_of(info):
    """Variable paths (with shapes) and output lookup paths (with widths), as kdcc
    and Keras name them: '<layer>/<var>' (Sequential: '<model>/<layer>/<var>')."""
    pre = "" if info["functional"] else info["name"] + "/"
    variables, outputs = {}, {}
    for l in info["layers"]:
        if l.cls == "Dense":
            variables[f"{pre}{l.name}/kernel"] = (l.inputs[0][1], l.width)
            if l.kw["use_bias"]:
                variables[f"{pre}{l.name}/bias"] = (l.width,)
        outputs[f"{pre}{l.name}/output"] = (None, l.width)   # None: the batch
    return pre, variables, outputs


def resolve(layout_map, path):
    if path in layout_map:
        return layout_map[path]
    hits = [k for k in layout_map if re.fullmatch(k, path)]
    if len(hits) > 1:
        raise ValueError(f"{path}: matched by {hits}")
    return layout_map[hits[0]] if hits else None


def gen_layout(rng, info, axes, maxsize, batch):
    pre, variables, outputs = paths_of(info)

    def shardable(n, used):
        return [a for a in axes if a not in used and n % maxsize[a] == 0 and maxsize[a] > 1]

    def random_layout(shape, p_shard):
        lay, used = [], set()
        for n in shape:
            n = batch if n is None else n
            ok = shardable(n, used)
            if ok and rng.random() < p_shard:
                a = rng.choice(ok)
                used.add(a)
                lay.append(a)
            else:
                lay.append(None)
        return lay

    intended = {}      # variable path -> layout (None = no key, replicated)
    p_kernel = rng.choice([0.3, 0.6, 0.9])
    for path, shape in variables.items():
        if path.endswith("/kernel") and rng.random() < p_kernel:
            lay = random_layout(shape, 0.6)
            if any(lay) or rng.random() < 0.2:   # an explicit all-None layout now and then
                intended[path] = lay
        elif path.endswith("/bias") and rng.random() < 0.35:
            intended[path] = random_layout(shape, 0.8)
    out_intended = {}
    if rng.random() < 0.45:
        for path in rng.sample(sorted(outputs), rng.randint(1, min(3, len(outputs)))):
            shape = outputs[path]
            # the batch dim: usually the batch axis or nothing; any axis is valid
            lay = random_layout(shape, 0.7)
            if lay[0] not in (None, "data") and rng.random() < 0.5:
                lay[0] = None
            out_intended[path] = lay

    def attempt():
        lm = {}
        # group variables with the same kind and layout; express a group by exact
        # keys, an alternation regex, or (for kernels) a blanket regex with overrides
        groups = {}
        for path, lay in intended.items():
            kind = path.rsplit("/", 1)[1]
            groups.setdefault((kind, tuple(lay)), []).append(path)
        blanket = None
        kernels = [p for p in variables if p.endswith("/kernel")]
        kernel_lays = [v for p, v in sorted(intended.items()) if p.endswith("/kernel") and any(v)]
        if kernel_lays and rng.random() < 0.3:
            # one kernel's layout for every kernel; the others get exact keys
            # (an exact key wins over any regex, so they need not fit it)
            blanket = rng.choice(kernel_lays)
            lm[rng.choice([".*/kernel", ".*kernel", f"{re.escape(pre)}.*/kernel"
                           if pre else "[^/]*/kernel"])] = blanket
        for (kind, lay), ps in sorted(groups.items(), key=lambda x: x[1]):
            if blanket is not None and kind == "kernel" and list(lay) == blanket:
                continue     # the blanket regex covers them
            layer_names = [p[len(pre):].split("/")[0] for p in ps]
            style = rng.random()
            if blanket is None and len(ps) > 1 and style < 0.4:
                alt = "|".join(re.escape(n) for n in layer_names)
                key = f"({alt})/{kind}"
                if pre:
                    key = f"({re.escape(pre)})?" + key
                lm[key] = list(lay)
            elif blanket is None and style < 0.6:
                for n in layer_names:   # a single-layer regex
                    key = f"{re.escape(n)}/{kind}"
                    lm[f"({re.escape(pre)})?{key}" if pre else f"(?:{key})"] = list(lay)
            else:
                for p in ps:
                    lm[p] = list(lay)
        if blanket is not None:
            for p in kernels:     # the rest of the kernels: exact overrides
                want = intended.get(p, [None, None])
                if want != blanket:
                    lm[p] = list(want)
        for p, lay in out_intended.items():
            lm[p] = list(lay)
        return lm

    for _ in range(20):
        lm = attempt()
        try:
            ok = all((resolve(lm, p) or [None] * len(s)) == (intended.get(p) or [None] * len(s))
                     for p, s in variables.items())
            ok = ok and all((resolve(lm, p) or [None, None]) == (out_intended.get(p) or
                                                                [None, None])
                            for p in outputs)
        except ValueError:
            ok = False
        if ok:
            break
    else:
        lm = {p: lay for p, lay in intended.items()}
        lm.update(out_intended)
    check_valid(lm, variables, outputs, axes, maxsize, batch)
    return lm


def check_valid(lm, variables, outputs, axes, maxsize, batch):
    used_keys = set()
    for p, shape in list(variables.items()) + list(outputs.items()):
        lay = resolve(lm, p)
        if lay is None:
            continue
        assert len(lay) == len(shape), (p, lay, shape)
        named = [a for a in lay if a is not None]
        assert len(named) == len(set(named)), (p, lay)
        for n, a in zip(shape, lay):
            n = batch if n is None else n
            assert a is None or (a in axes and n % maxsize[a] == 0), (p, lay, shape)


# ---------------------------------------------------------------- a case

def gen_case(seed, index):
    rng = random.Random(f"kdcc-property/{seed}/{index}")
    model, info = gen_model(rng)
    three = rng.random() < 0.3
    axes, meshes = gen_meshes(rng, three)
    batch = rng.choice([16, 16, 16, 8])
    # a dimension sharded by an axis must divide by every size the axis takes
    # (with sizes 3 and 4 in two meshes, by 12): the lcm, not just the largest
    maxsize = {a: 1 for a in axes}
    for i, a in enumerate(axes):
        for m in meshes:
            maxsize[a] = maxsize[a] * m[i] // math.gcd(maxsize[a], m[i])
    lm = gen_layout(rng, info, axes, maxsize, batch)
    spec_mesh = meshes[1]
    dist = {"distribution": "ModelParallel",
            "device_mesh": {"shape": list(spec_mesh), "axis_names": axes},
            "layout_map": lm}
    if rng.random() < 0.7:   # the default is the first axis anyway
        dist = {"distribution": "ModelParallel", "device_mesh": dist["device_mesh"],
                "batch_dim_name": "data", "layout_map": lm}
    mesh_args = [",".join(f"{a}={s}" for a, s in zip(axes, m)) for m in meshes]
    widths = " ".join(
        f"{l.name}:{l.cls[0]}{l.width}" + (f"({l.kw['activation']}{'' if l.kw['use_bias'] else ',nobias'})"
                                          if l.cls == "Dense" else "")
        for l in info["layers"])
    summary = (f"{'Functional' if info['functional'] else 'Sequential'} {info['name']} "
               f"in={info['input'][1]} [{widths}] loss={info['loss']} opt={info['opt']}"
               f"{' +accuracy' if info['accuracy'] else ''} batch={batch} "
               f"keys={len(lm)}")
    return model, dist, mesh_args, batch, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=12)
    ap.add_argument("--first", type=int, default=0, help="index of the first case")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    for i in range(a.first, a.first + a.count):
        model, dist, meshes, batch, summary = gen_case(a.seed, i)
        d = os.path.join(a.out, f"case_{i:03d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.json"), "w") as f:
            json.dump(model, f, indent=2)
            f.write("\n")
        with open(os.path.join(d, "dist.json"), "w") as f:
            json.dump(dist, f, indent=2)
            f.write("\n")
        with open(os.path.join(d, "meshes.txt"), "w") as f:
            f.write("\n".join(meshes) + "\n")
        with open(os.path.join(d, "batch.txt"), "w") as f:
            f.write(f"{batch}\n")
        with open(os.path.join(d, "summary.txt"), "w") as f:
            f.write(summary + "\n")


if __name__ == "__main__":
    main()
