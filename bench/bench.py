#!/usr/bin/env python3
"""kdcc vs PyTorch vs Keras 3 (JAX) on one CPU process: steps per second of a
full training step (forward, backward, optimizer update), float32, batch 128,
after warm-up. Run through `make bench` (bench/bench.sh), which builds kdcc
and the venv first. Writes bench/RESULTS.md.

kdcc's figure: each program reads the same 10 batches from .npy files
(--x/--y) and runs E epochs of 10 steps; steps/s = 10*(E2-E1) / (t(E2) -
t(E1)), the best of 3 runs each, so process start, MPI init, weight init and
the final evaluate cancel out. The kdcc "--synthetic" column times the
program as it is usually run (data made from the seed inside the step loop).
"""
import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "bench")
DATA = os.path.join(BUILD, "data")
BATCH = 128
NBATCH = 10  # batches in each data file (one epoch)
MODELS = [  # name, model file, x shape of one sample, label kind
    ("seed_mlp", "models/seed_mlp.json", (28, 28, 1), "onehot"),
    ("wide_mlp", "models/wide_mlp.json", (1024,), "classid"),
    ("cnn", "models/cnn.json", (28, 28, 1), "classid"),
    ("gpt", "models/gpt.json", (16,), "tokens"),
    ("resnet", "examples/fashion_mnist/resnet.json", (28, 28, 1), "classid"),
]
DESCR = {
    "seed_mlp": "seed MLP (784-200-10, Adam, mse)",
    "wide_mlp": "wide MLP (1024-4x2048-10, SGD, scce logits)",
    "cnn": "CNN (2 conv3x3 + pool, Adam, scce)",
    "gpt": "GPT (2 causal blocks of 32, 16 tokens of 64, Adam, scce logits per token)",
    "resnet": "ResNet (3x3 stem 32 + pool, 2 residual blocks of 32 and 64, batch norm, Adam, scce)",
}

ap = argparse.ArgumentParser()
ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
ap.add_argument("--seconds", type=float, default=2.5, help="timed seconds per repetition")
ap.add_argument("--no-perf", action="store_true", help="skip the perf profile of kdcc")
ap.add_argument("--out", default=os.path.join(ROOT, "bench", "RESULTS.md"))
args = ap.parse_args()
THREADS = [int(t) for t in args.threads.split(",")]
ncpu = os.cpu_count() or 1
THREADS = [t for t in THREADS if t <= ncpu] or [1]
T_START = time.time()


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


LOAD_START = loadavg()


def log(msg):
    print("[bench %5.0fs] %s" % (time.time() - T_START, msg), file=sys.stderr, flush=True)


def pin(threads):
    """Command prefix pinning a process to the first `threads` cores."""
    if shutil.which("taskset"):
        return ["taskset", "-c", "0-%d" % (threads - 1)]
    return []


def thread_env(threads):
    env = dict(os.environ)
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    return env


# ---------------------------------------------------------------- data
def make_data():
    os.makedirs(DATA, exist_ok=True)
    rng = np.random.default_rng(1337)
    n = BATCH * NBATCH
    for name, _, xs, kind in MODELS:
        if kind == "tokens":  # ids in, the next ids out: a class per token of 64
            np.save(os.path.join(DATA, name + ".x.npy"), rng.integers(0, 64, (n,) + xs, np.int32))
            np.save(os.path.join(DATA, name + ".y.npy"), rng.integers(0, 64, (n,) + xs, np.int32))
            continue
        x = rng.standard_normal((n,) + xs).astype(np.float32)
        cls = rng.integers(0, 10, size=n)
        if kind == "onehot":
            y = np.eye(10, dtype=np.float32)[cls]
        else:
            y = cls.astype(np.float32)
        np.save(os.path.join(DATA, name + ".x.npy"), x)
        np.save(os.path.join(DATA, name + ".y.npy"), y)


# ---------------------------------------------------------------- kdcc
def kdcc_compile(name, model):
    exe = os.path.join(BUILD, name)
    subprocess.run([os.path.join(ROOT, "kdcc"), os.path.join(ROOT, model), "--batch-size",
                    str(BATCH), "-w", "-o", exe], check=True, cwd=ROOT)
    return exe


def kdcc_cmd(exe, name, epochs, synthetic=False):
    cmd = [exe]
    if synthetic:
        cmd += ["--synthetic", str(BATCH * NBATCH)]
    else:
        cmd += ["--x", os.path.join(DATA, name + ".x.npy"), "--y",
                os.path.join(DATA, name + ".y.npy")]
    hist = os.path.join(BUILD, name + ".history.json")
    return cmd + ["--epochs", str(epochs), "--batch-size", str(BATCH), "--quiet",
                  "--history", hist], hist


def cpu_seconds():
    """CPU time (user + system) of this process's finished children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def kdcc_time(exe, name, epochs, threads, synthetic=False):
    """Seconds of one run: CPU time with 1 thread (see CLOCK), else wall time."""
    cmd, hist = kdcc_cmd(exe, name, epochs, synthetic)
    t0, c0 = time.perf_counter(), cpu_seconds()
    subprocess.run(pin(threads) + cmd, check=True, env=thread_env(threads),
                   stdout=subprocess.DEVNULL)
    dt = cpu_seconds() - c0 if threads == 1 else time.perf_counter() - t0
    with open(hist) as f:
        h = json.load(f)
    if not all(np.isfinite(v) for v in h["loss"]):
        raise SystemExit("%s: non-finite loss in %s" % (name, h["loss"]))
    return dt


def kdcc_bench(exe, name, threads, synthetic=False):
    best = lambda e: min(kdcc_time(exe, name, e, threads, synthetic) for _ in range(3))
    t1 = best(1)
    t3 = kdcc_time(exe, name, 3, threads, synthetic)
    # On a loaded machine t3 - t1 can come out near 0 (or below): bound the
    # estimate below by a tenth of the 1-epoch run, and k by 100 epochs.
    per_epoch = max((t3 - t1) / 2, t1 / 10, 1e-4)
    k = min(100, max(4, int(round(args.seconds / per_epoch))))  # at least 40 steps timed
    t2 = best(1 + k)
    sps = NBATCH * k / (t2 - t1)
    log("kdcc%s %-9s threads=%d  %8.2f steps/s  (%d vs 1 epochs of %d steps: %.3fs vs %.3fs)" %
        (" --synthetic" if synthetic else "", name, threads, sps, 1 + k, NBATCH, t2, t1))
    return sps, k


def kdcc_profile(exe, name, k):
    """Top symbols (self time) of a 1-thread run, from perf's cpu-clock samples."""
    if args.no_perf or not shutil.which("perf"):
        return None
    data = os.path.join(BUILD, name + ".perf.data")
    cmd, _ = kdcc_cmd(exe, name, 1 + k)
    r = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-o", data, "--"]
                       + pin(1) + cmd, env=thread_env(1), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        return None
    rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,symbol",
                          "--stdio", "--percent-limit", "1.5"], capture_output=True, text=True)
    lines = []
    for ln in rep.stdout.splitlines():
        if ln.startswith("#") or "%" not in ln:
            continue
        parts = ln.split()
        if len(parts) >= 4 and parts[0].endswith("%"):
            sym = [w for w in parts[3:] if w != "-"]
            lines.append("%7s  %-26s %s" % (parts[0], parts[1][:26], " ".join(sym)))
    return lines[:14]


# ---------------------------------------------------------------- GEMM-bound
GEMM_FIELDS = ("ta", "tb", "batch", "M", "N", "K", "lda", "ldb", "ldc", "stride_a", "stride_b",
               "stride_c")


def step_gemms(name):
    """The matrix products of one training step (forward, backward, update) as
    the generated program declares them, the step's rows filled in."""
    with open(os.path.join(BUILD, name + ".kdcc.d", "program.c")) as f:
        src = f.read()
    src = src[src.index("static void forward("):src.index("static void train_step(")]
    # the gradient check's and evaluation's branches are not the training step's
    src = re.sub(r"\} else if \(step == (GRAD|EVAL)_STEP\) \{.*?\n  \}\n", "}\n", src,
                 flags=re.S)
    out = []
    # issue 22: kdrt_matmul_bias, a product with its bias (beta 0), counts as its product
    for decl, fn, call in re.findall(
            r"const kdrt_gemm g = \{(.*?)\};\s*kdrt_(matmul|matmul_bias)\(([^;]*)\);", src, re.S):
        kv = dict(re.findall(r"\.(\w+) = ([^,]+?)\s*(?:,|$)", decl.replace("\n", " ")))
        env = {"B": BATCH, "b": BATCH, "KDRT_TRANS": 1, "KDRT_NOTRANS": 0}
        # an SGD update folded in: beta 1
        beta = 0.0 if fn == "matmul_bias" else float(call.split(",")[4].strip().rstrip("f"))
        out.append(" ".join([str(int(eval(kv[k], {}, env))) for k in GEMM_FIELDS] + [str(beta)]))
    return out


def gemm_bound(name, threads):
    """Seconds a step's products take alone: (kdcc's kdrt_matmul blocks, plain
    OpenBLAS on its own threads), or None without products."""
    gemms = step_gemms(name)
    if not gemms:
        return None
    exe = os.path.join(ROOT, "build", "gemm_time")
    res = []
    for mode in ("kdcc", "blas"):
        clock = ["cpu"] if threads == 1 else []  # the kdcc figures' clock (CLOCK)
        r = subprocess.run(pin(threads) + [exe, mode] + clock, input="\n".join(gemms) + "\n",
                           capture_output=True, text=True, env=thread_env(threads), check=True)
        res.append(float(r.stdout))
    return res


# ---------------------------------------------------------------- frameworks
def framework_bench(fw, threads):
    out = os.path.join(BUILD, "%s.t%d.json" % (fw, threads))
    cmd = pin(threads) + [sys.executable, os.path.join(ROOT, "bench", "frameworks.py"),
                          "--framework", fw, "--threads", str(threads), "--data", DATA,
                          "--models", ",".join(m[0] for m in MODELS), "--json", out,
                          "--seconds", str(args.seconds)]
    env = thread_env(threads)
    env.pop("XLA_FLAGS", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


# ---------------------------------------------------------------- main
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("flags"):
                    fl = set(ln.split(":", 1)[1].split())
                    return " ".join(x for x in ("avx2", "fma", "avx512f", "avx512_vnni",
                                                "amx_tile") if x in fl)
    except OSError:
        pass
    return ""


def main():
    os.makedirs(BUILD, exist_ok=True)
    log("load average at start: %s (anything else running makes the figures noisy)" % LOAD_START)
    log("data: %d batches of %d per model in %s" % (NBATCH, BATCH, DATA))
    make_data()
    exes = {name: kdcc_compile(name, model) for name, model, _, _ in MODELS}
    res = {}  # (threads, model) -> dict
    versions = {}
    profiles = {}
    for t in THREADS:
        for name, _, _, _ in MODELS:
            sps, k = kdcc_bench(exes[name], name, t)
            syn, _ = kdcc_bench(exes[name], name, t, synthetic=True)
            res[(t, name)] = {"kdcc": sps, "kdcc_syn": syn}
            res[(t, name)]["gemm"] = gemm_bound(name, t)
            if t == 1:
                profiles[name] = kdcc_profile(exes[name], name, k)
        for fw in ("torch", "jax"):
            log("%s, %d thread(s) ..." % (fw, t))
            r = framework_bench(fw, t)
            versions[fw] = r["version"]
            for name, v in r["results"].items():
                res[(t, name)][fw] = v["steps_per_s"]
                log("%-5s %-9s threads=%d  %8.2f steps/s" % (fw, name, t, v["steps_per_s"]))

    # ---- table
    head = ("| model | batch | threads | kdcc steps/s | torch steps/s | keras-jax steps/s "
            "| kdcc/torch | kdcc/jax | kdcc --synthetic steps/s |")
    rows = [head, "|" + "---|" * 9]
    for t in THREADS:
        for name, _, _, _ in MODELS:
            r = res[(t, name)]
            rows.append("| %s | %d | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f |" % (
                name, BATCH, t, r["kdcc"], r["torch"], r["jax"], r["kdcc"] / r["torch"],
                r["kdcc"] / r["jax"], r["kdcc_syn"]))
    table = "\n".join(rows)
    grows = ["| model | threads | products a step | their time alone: kdcc's blocks "
             "| OpenBLAS's own threads | kdcc step time | GEMM-bound / kdcc step |",
             "|" + "---|" * 7]
    for t in THREADS:
        for name, _, _, _ in MODELS:
            r = res[(t, name)]
            if r["gemm"]:
                step = 1.0 / r["kdcc"]
                grows.append("| %s | %d | %d | %.2f ms | %.2f ms | %.2f ms | %.0f%% |" % (
                    name, t, len(step_gemms(name)), 1e3 * r["gemm"][0], 1e3 * r["gemm"][1],
                    1e3 * step, 100 * r["gemm"][1] / step))
    gtable = "\n".join(grows)
    print()
    print(table)
    print()

    now = datetime.datetime.now().astimezone()
    cc = subprocess.run(["cc", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    blas = ""
    try:
        ldd = subprocess.run(["ldd", exes["seed_mlp"]], capture_output=True, text=True).stdout
        blas = " ".join(ln.split()[2] for ln in ldd.splitlines() if "blas" in ln)
        blas = os.path.realpath(blas) if blas else ""
    except (OSError, IndexError):
        pass
    md = []
    md.append("# kdcc benchmark: one CPU process, float32, batch %d\n" % BATCH)
    md.append("Generated by `make bench` (bench/bench.sh -> bench/bench.py); the analysis "
              "below the figures is bench/analysis.md, written by hand from a run like this "
              "one. Re-running overwrites this file.\n")
    md.append("- date: %s" % now.strftime("%Y-%m-%d %H:%M %Z"))
    md.append(("- command: `make bench` (= `bash bench/bench.sh`, which runs `%s bench/bench.py "
               "%s`)" % (os.path.relpath(sys.executable, ROOT), " ".join(sys.argv[1:])))
              .replace(" `)", "`)"))
    md.append("- machine: %d cores (nproc), %s; flags: %s; %s" % (ncpu, cpu_model(), cpu_flags(),
                                                                 platform.platform()))
    md.append("- load average (1/5/15 min) at start: %s, at end: %s%s" % (
        LOAD_START, loadavg(), " -- other work was running, so the figures are noisy"
        if float(LOAD_START.split()[0]) > 0.5 else ""))
    march = subprocess.run(["make", "-s", "rt-march"], capture_output=True, text=True,
                           cwd=ROOT).stdout.strip() or "?"
    md.append("- kdcc: runtime `-O3 -march=%s`, programs `-O1` (calls into the runtime); %s; "
              "BLAS: %s" % (march, cc, blas or "?"))
    md.append("- %s; %s; python %s" % (versions.get("torch", "?"), versions.get("jax", "?"),
                                       platform.python_version()))
    md.append("- threads: every process pinned with `taskset -c 0-(T-1)` and given "
              "OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS=T; torch also "
              "`torch.set_num_threads(T)`; JAX with T=1 also "
              "`XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1` "
              "(with T=2 XLA sizes its pool to the 2 cores it may use).")
    md.append("- clock: with 1 thread, the CPU time (user + system) of each process, which "
              "other work on the machine inflates far less than wall time (the kdcc program's "
              "from `getrusage`, PyTorch's and JAX's from `time.process_time()`); with more "
              "threads, wall time.")
    md.append("- step: forward + loss (+ accuracy where the model has that metric) + backward + "
              "optimizer update, on the next of 10 fixed batches (normal x, random classes). "
              "torch: same layers, loss and optimizer (hand-written, NCHW for the CNN). "
              "keras-jax: the same JSON through `keras.models.model_from_json` + "
              "`compile_from_config`, timed with `model.train_on_batch` (jit-compiled) after 5 "
              "warm-up steps; best of 3 repetitions of ~%.1f s.\n" % args.seconds)
    md.append("- kdcc: the program reads the same batches from .npy (`--x/--y`); steps/s = "
              "10*(E-1)/(t(E epochs) - t(1 epoch)), best of 3 runs each, so start-up, "
              "MPI init, weight init and the final evaluate cancel out. The last column is the "
              "same program with `--synthetic 1280` (data drawn from the seed each step, as "
              "the examples run it).\n")
    md.append("## Figures (higher is better; ratio > 1: kdcc faster)\n")
    md.append(table + "\n")
    md.append("## GEMM-bound: a step's matrix products timed alone\n")
    md.append("Every product of the training step (as `program.c` declares it, batch %d) run "
              "alone on random operands by `build/gemm_time` (bench/gemm_time.c), best of 15 "
              "runs each, summed: through kdcc's `kdrt_matmul` (fixed blocks, one "
              "single-threaded OpenBLAS call each, for results that do not depend on the "
              "thread count) and as one plain `cblas_sgemm` on OpenBLAS's own threads. The last "
              "column is the plain products' time over kdcc's whole step, on the same clock as the "
              "figures above (CPU time at 1 thread, wall time above): 100%% would be a step that "
              "is nothing but OpenBLAS at full speed. Convolutions (oneDNN) are not products here.\n" % BATCH)
    md.append(gtable + "\n")
    if any(profiles.values()):
        md.append("## Where a kdcc program spends its time (1 thread, perf cpu-clock, self "
                  "time, symbols over 1.5%)\n")
        for name, lines in profiles.items():
            if lines:
                md.append("%s:\n\n```\n%s\n```\n" % (name, "\n".join(lines)))
    ana = os.path.join(ROOT, "bench", "analysis.md")
    if os.path.exists(ana):
        with open(ana) as f:
            md.append(f.read())
    with open(args.out, "w") as f:
        f.write("\n".join(md))
    log("wrote %s (%.0f s in all)" % (os.path.relpath(args.out, ROOT), time.time() - T_START))


main()
