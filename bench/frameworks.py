#!/usr/bin/env python3
"""Steps per second of one full training step (forward, backward, optimizer
update) in PyTorch or in Keras 3 on JAX, for the models kdcc is benchmarked on.

Run by bench/bench.py, one process per framework and thread count, so that
the thread settings (environment variables read at import time) hold for the
whole process:

    frameworks.py --framework torch|jax --threads N --data DIR --models m1,m2 \
                  --json OUT.json [--seconds S]

The data are the same .npy batches the kdcc programs read (DIR/<model>.x.npy,
DIR/<model>.y.npy: 10 batches of 128). Every step takes the next batch, as a
kdcc program does.
"""
import argparse
import json
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--framework", choices=["torch", "jax"], required=True)
p.add_argument("--threads", type=int, required=True)
p.add_argument("--data", required=True)
p.add_argument("--models", required=True)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per repetition")
p.add_argument("--reps", type=int, default=3)
p.add_argument("--json", required=True)
args = p.parse_args()

T = args.threads
# Thread settings before any numerical library is imported.
os.environ["OMP_NUM_THREADS"] = str(T)
os.environ["OPENBLAS_NUM_THREADS"] = str(T)
os.environ["MKL_NUM_THREADS"] = str(T)
if args.framework == "jax":
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    if T == 1:
        # One intra-op thread; the process is also pinned to one core by bench.py.
        flags += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    os.environ["XLA_FLAGS"] = flags.strip()

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FILES = {
    "seed_mlp": "models/seed_mlp.json",
    "wide_mlp": "models/wide_mlp.json",
    "cnn": "models/cnn.json",
    "gpt": "models/gpt.json",
    "resnet": "examples/fashion_mnist/resnet.json",
}


def load_data(name):
    x = np.load(os.path.join(args.data, name + ".x.npy"))
    y = np.load(os.path.join(args.data, name + ".y.npy"))
    B = args.batch
    n = x.shape[0] // B
    return [(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B]) for i in range(n)]


def measure(step, nbatches):
    """Warm up, then time blocks of steps; returns the best steps/s of args.reps
    repetitions and every repetition's figure. With one thread the clock is
    the process's CPU time, which other work on the machine inflates far less
    than wall time (bench.py times kdcc alike); with more, wall time."""
    clock = time.process_time if T == 1 else time.perf_counter
    i = 0
    for _ in range(5):  # warm-up (compilation, allocator, thread pools)
        step(i % nbatches)
        i += 1
    t0 = clock()
    k = 0
    while clock() - t0 < 0.5:
        step(i % nbatches)
        i += 1
        k += 1
    per = (clock() - t0) / k
    n = max(5, int(args.seconds / per))
    rates = []
    for _ in range(args.reps):
        t0 = clock()
        for _ in range(n):
            step(i % nbatches)
            i += 1
        rates.append(n / (clock() - t0))
    return max(rates), rates, n


# ---------------------------------------------------------------- PyTorch
def TorchGPT(nn):
    """models/gpt.json in PyTorch: token and learned position embeddings,
    2 pre-norm blocks (causal 4-head attention of 32, gelu MLP of 128),
    a final LayerNorm and the logits; Keras's LayerNormalization epsilon."""
    import torch

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(32, eps=1e-3), nn.LayerNorm(32, eps=1e-3)
            self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
            self.up, self.down = nn.Linear(32, 128), nn.Linear(128, 32)

        def forward(self, h, mask):
            n = self.ln1(h)
            h = h + self.attn(n, n, n, attn_mask=mask, need_weights=False)[0]
            return h + self.down(nn.functional.gelu(self.up(self.ln2(h))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(64, 32)
            self.pos = nn.Parameter(torch.randn(16, 32) * 0.02)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.ln_f, self.logits = nn.LayerNorm(32, eps=1e-3), nn.Linear(32, 64)
            self.register_buffer("mask", torch.triu(torch.ones(16, 16, dtype=torch.bool), 1))

        def forward(self, x):
            h = self.tok(x) + self.pos
            for b in self.blocks:
                h = b(h, self.mask)
            return self.logits(self.ln_f(h))

    return GPT()


def TorchResNet(nn):
    """examples/fashion_mnist/resnet.json in PyTorch (NCHW): a 3x3 stem of 32
    with batch norm and 2x2 max pooling, a residual block of two 3x3 convs of
    32, one of 64 with stride 2 and a strided 1x1 shortcut, batch norm after
    every conv (no conv bias), global average pooling, Dense 10 and softmax;
    Keras's batch norm epsilon and momentum (0.99 = torch's 0.01)."""
    def conv_bn(cin, cout, k, s):
        return nn.Sequential(nn.Conv2d(cin, cout, k, s, padding=k // 2, bias=False),
                             nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.pool = conv_bn(1, 32, 3, 1), nn.MaxPool2d(2)
            self.b1 = nn.Sequential(conv_bn(32, 32, 3, 1), nn.ReLU(), conv_bn(32, 32, 3, 1))
            self.b2 = nn.Sequential(conv_bn(32, 64, 3, 2), nn.ReLU(), conv_bn(64, 64, 3, 1))
            self.short = conv_bn(32, 64, 1, 2)
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            y = self.pool(nn.functional.relu(self.stem(x)))
            y = nn.functional.relu(y + self.b1(y))
            y = nn.functional.relu(self.short(y) + self.b2(y))
            return nn.functional.softmax(self.head(y.mean((2, 3))), dim=1)

    return ResNet()


def torch_bench(name, batches):
    import torch
    import torch.nn as nn

    torch.set_num_threads(T)
    torch.manual_seed(0)
    if name == "seed_mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 200, bias=False), nn.ReLU(),
                              nn.Dropout(0.4), nn.Linear(200, 10), nn.Softmax(dim=1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-7)

        def loss_fn(out, y):  # Keras mse: mean over the last axis, then over the batch
            return ((out - y) ** 2).mean()

        def correct(out, y):
            return (out.argmax(1) == y.argmax(1)).float().mean()
        data = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
    elif name == "wide_mlp":
        layers = [nn.Linear(1024, 2048), nn.ReLU()]
        for _ in range(3):
            layers += [nn.Linear(2048, 2048), nn.ReLU()]
        layers += [nn.Linear(2048, 10)]
        model = nn.Sequential(*layers)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.0)
        ce = nn.CrossEntropyLoss()  # sparse categorical crossentropy from logits

        def loss_fn(out, y):
            return ce(out, y)
        correct = None  # the Keras model has no metric
        data = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in batches]
    elif name in ("cnn", "resnet"):
        # Keras is channels-last; torch's natural layout is NCHW, converted once here.
        if name == "cnn":
            model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Dropout(0.25), nn.Linear(576, 10),
                                  nn.Softmax(dim=1))
        else:
            model = TorchResNet(nn)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-7)

        def loss_fn(out, y):  # Keras SCCE on probabilities: clip, log, pick
            return nn.functional.nll_loss(torch.log(out.clamp(1e-7, 1 - 1e-7)), y)

        def correct(out, y):
            return (out.argmax(1) == y).float().mean()
        data = [(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))),
                 torch.from_numpy(y).long().reshape(-1)) for x, y in batches]
    elif name == "gpt":
        model = TorchGPT(nn)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-7)
        ce = nn.CrossEntropyLoss()  # sparse categorical crossentropy from logits, per token

        def loss_fn(out, y):
            return ce(out.reshape(-1, out.shape[-1]), y.reshape(-1))

        def correct(out, y):
            return (out.argmax(-1) == y).float().mean()
        data = [(torch.from_numpy(x).long(), torch.from_numpy(y).long()) for x, y in batches]
    else:
        raise SystemExit("unknown model " + name)
    model.train()

    def step(i):
        x, y = data[i]
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        if correct is not None:
            with torch.no_grad():
                correct(out, y)
        return loss.item()

    return measure(step, len(data))


# ---------------------------------------------------------------- Keras 3 on JAX
def jax_bench(name, batches):
    import keras
    if name == "gpt":
        import keras_hub  # noqa: F401  (PositionEmbedding)

    with open(os.path.join(ROOT, MODEL_FILES[name])) as f:
        text = f.read()
    model = keras.models.model_from_json(text)
    cfg = json.loads(text).get("compile_config")
    if not model.compiled and cfg:
        model.compile_from_config(cfg)
    if not model.compiled:
        raise SystemExit(name + ": the JSON has no compile_config")
    data = batches
    if name in ("wide_mlp", "cnn", "resnet"):
        data = [(x, y.reshape(-1).astype(np.int32)) for x, y in batches]

    def step(i):
        x, y = data[i]
        return model.train_on_batch(x, y)

    return measure(step, len(data))


def main():
    out = {"framework": args.framework, "threads": T, "results": {}}
    if args.framework == "torch":
        import torch
        out["version"] = "torch " + torch.__version__
    else:
        import jax
        import keras
        out["version"] = "keras %s, jax %s" % (keras.__version__, jax.__version__)
    for name in args.models.split(","):
        batches = load_data(name)
        fn = torch_bench if args.framework == "torch" else jax_bench
        best, rates, n = fn(name, batches)
        out["results"][name] = {"steps_per_s": best, "reps": rates, "steps_per_rep": n}
        print("%-6s %-9s threads=%d  %8.2f steps/s  (reps %s, %d steps each)" %
              (args.framework, name, T, best, ", ".join("%.2f" % r for r in rates), n),
              file=sys.stderr)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


main()
