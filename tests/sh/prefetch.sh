#!/usr/bin/env bash
# prefetch.sh: the input thread (issue 22, data.c's kdrt_prefetch) changes
# no number. With the thread (the default) and without it (KDRT_PREFETCH=0)
# a run gives the same --history and the same --save-weights, byte for
# byte: the Fashion-MNIST example's MLP from IDX files (gzip'd training images, uint8 ids,
# validation and test files) on one rank and on a (2, 2) mesh, the CNN
# (dropout) with a validation split, a last partial batch and
# --steps-per-epoch, the GPT (int32 token ids) from .npy files; an early
# stop (--early-stopping) and a run that diverges (--lr 1e30) stop at the
# same step and exit with the same status; a checkpoint's resume gives the
# uninterrupted run's history. No run hangs (each under a timeout).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin prefetch.sh

EX=examples/fashion_mnist
./kdcc $EX/mlp.json --distribution $EX/mlp.dist.json --mesh data=1,model=1 --batch-size 16 -w \
  -o "$T/mlp1" || exit 1
./kdcc $EX/mlp.json --distribution $EX/mlp.dist.json --mesh data=2,model=2 --batch-size 16 -w \
  -o "$T/mlp22" || exit 1
./kdcc models/cnn.json --distribution models/cnn.dist.json --mesh data=1,model=1 \
  --batch-size 8 -w -o "$T/cnn" || exit 1
./kdcc models/gpt.json --distribution models/gpt_dp.dist.json --mesh batch=1 --batch-size 8 -w \
  -o "$T/gpt" || exit 1

# Data: MNIST-shaped IDX for the MLP (the training set gzip'd), token ids
# for the GPT as .npy (int32 inputs, int64 labels).
python3 - "$T" <<'PY'
import json, random, sys
sys.path.insert(0, "tests")
from npylite import save_npy, save_idx  # noqa: E402
d = sys.argv[1]
random.seed(11)
for name, n, gz in (("train", 77, True), ("val", 21, False), ("test", 19, False)):
    ys = [random.randrange(10) for _ in range(n)]
    px = bytes(min(255, random.randrange(60) + (150 if 2 * c <= (i // 28) < 2 * c + 3 else 0))
               for c in ys for i in range(784))
    save_idx("%s/%s-x.idx%s" % (d, name, ".gz" if gz else ""), 0x08, (n, 28, 28), px, gz)
    save_idx("%s/%s-y.idx%s" % (d, name, ".gz" if gz else ""), 0x08, (n,), bytes(ys), gz)
m = json.load(open("models/gpt.json"))
def find(o, key):
    if isinstance(o, dict):
        if key in o: yield o[key]
        for v in o.values(): yield from find(v, key)
    elif isinstance(o, list):
        for v in o: yield from find(v, key)
shape = next(s for s in find(m, "batch_shape") if s and len(s) == 2)
V = max(v for v in find(m, "input_dim") if isinstance(v, int))
T = shape[1]
n = 45
toks = [random.randrange(V) for _ in range(n * (T + 1))]
xs = [toks[i * (T + 1) + t] for i in range(n) for t in range(T)]
ys = [toks[i * (T + 1) + t + 1] for i in range(n) for t in range(T)]
save_npy(d + "/tx.npy", "<i4", "i", (n, T), xs)
save_npy(d + "/ty.npy", "<i8", "q", (n, T), ys)
PY
[ -s "$T/ty.npy" ] || { echo "prefetch.sh: could not write the data" >&2; exit 1; }

# same_weights A B: two weights files hold the same datasets, bit for bit
# (the files' bytes differ: HDF5 writes the time into them).
same_weights() {
  "$PY" - "$1" "$2" <<'PY'
import sys
import h5py, numpy as np
a, b = (h5py.File(f, "r") for f in sys.argv[1:3])
def sets(g, p=""):
    for k in g:
        if isinstance(g[k], h5py.Dataset): yield p + "/" + k
        else: yield from sets(g[k], p + "/" + k)
ka, kb = sorted(sets(a)), sorted(sets(b))
assert ka == kb and ka, (ka, kb)
for k in ka:
    x, y = a[k][()], b[k][()]
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), k
PY
}
PY=/work/kvenv/bin/python
[ -x "$PY" ] || PY=python3

# both NAME NP EXE ARGS...: the run with the thread and without it, each
# under a timeout; their status, output's last lines, history and weights
# must be equal. Sets rc (the threaded run's) and leaves its output in $T/out.
both() {
  name=$1
  local np=$2 exe=$3
  shift 3
  local k
  for k in on off; do
    local pf=1
    [ $k = off ] && pf=0
    rm -f "$T/h_$k.json" "$T/w_$k.weights.h5"
    KDRT_PREFETCH=$pf timeout 300 mpirun -np "$np" -x KDRT_PREFETCH "$T/$exe" "$@" \
      --history "$T/h_$k.json" --save-weights "$T/w_$k.weights.h5" >"$T/out_$k" 2>&1
    eval "rc_$k=\$?"
  done
  rc=$rc_on
  cp "$T/out_on" "$T/out"
  [ "$rc_on" = 124 ] || [ "$rc_off" = 124 ] && fail "$name: hung (killed after 300 s)"
  [ "$rc_on" = "$rc_off" ] || fail "$name: exit status $rc_on with the thread, $rc_off without"
  cmp -s "$T/h_on.json" "$T/h_off.json" ||
    fail "$name: the history differs: $(diff "$T/h_on.json" "$T/h_off.json" | head -5)"
  if [ -e "$T/w_off.weights.h5" ] || [ -e "$T/w_on.weights.h5" ]; then
    same_weights "$T/w_on.weights.h5" "$T/w_off.weights.h5" || fail "$name: the saved weights differ"
  fi
  [ -s "$T/h_on.json" ] || fail "$name: no history"
}

MNIST=(--x "$T/train-x.idx.gz" --y "$T/train-y.idx.gz" --val-x "$T/val-x.idx"
       --val-y "$T/val-y.idx" --test-x "$T/test-x.idx" --test-y "$T/test-y.idx" --scale 1/255)
both "mlp, one rank" 1 mlp1 "${MNIST[@]}" --epochs 3
expect 0 "val_accuracy: "
python3 -c "import json,sys; h=json.load(open(sys.argv[1])); assert len(h['step_loss'])==15 and h['loss'][2] < h['loss'][0], h" "$T/h_on.json" \
  || fail "$name: history $(cat "$T/h_on.json")"
both "mlp, (2,2)" 4 mlp22 "${MNIST[@]}" --epochs 2
expect 0 "val_accuracy: "
both "mlp, (2,2), --no-shuffle, rows that do not divide" 4 mlp22 "${MNIST[@]}" --epochs 2 \
  --batch-size 14 --no-shuffle
expect 0 "val_accuracy: "
both "cnn, validation split, steps per epoch" 1 cnn --synthetic 53 --validation-split 0.2 \
  --epochs 2 --steps-per-epoch 5
expect 0 "val_loss: "
both "cnn, every step" 1 cnn --synthetic 29 --epochs 2
expect 0 "Epoch 2/2"
both "gpt, token ids from .npy" 1 gpt --x "$T/tx.npy" --y "$T/ty.npy" --validation-split 0.2 \
  --epochs 2
expect 0 "val_loss: "
both "mlp, early stopping" 1 mlp1 "${MNIST[@]}" --epochs 30 --early-stopping 0 --monitor loss --min-delta 100
python3 -c "import json,sys; h=json.load(open(sys.argv[1])); assert len(h['loss']) < 30, h" "$T/h_on.json" \
  || fail "$name: did not stop early: $(cat "$T/h_on.json")"
both "mlp, diverging" 1 mlp1 "${MNIST[@]}" --epochs 3 --lr 1e30
expect 1 "training diverged"

# Checkpoints every 7 steps of a run with the thread (ckpt-7 and ckpt-14
# kept); ckpt-7 (mid-epoch 2) resumed with the thread gives the history of
# the uninterrupted run without it.
name="resume"
KDRT_PREFETCH=0 timeout 300 mpirun -np 4 -x KDRT_PREFETCH "$T/mlp22" "${MNIST[@]}" --epochs 3 \
  --history "$T/h_full.json" >"$T/out" 2>&1
rc=$?; expect 0
timeout 300 mpirun -np 4 "$T/mlp22" "${MNIST[@]}" --epochs 3 --checkpoint-dir "$T/ck" \
  --checkpoint-every 7 >"$T/out" 2>&1
rc=$?; expect 0
if [ -e "$T/ck/ckpt-7/MANIFEST" ]; then
  rm -rf "$T/ck/ckpt-14" && echo ckpt-7 >"$T/ck/latest"
  timeout 300 mpirun -np 4 "$T/mlp22" "${MNIST[@]}" --epochs 3 --checkpoint-dir "$T/ck" \
    --checkpoint-every 7 --resume --history "$T/h_res.json" >"$T/out" 2>&1
  rc=$?; expect 0
  grep -q "ckpt-7" "$T/out" || fail "$name: not from ckpt-7: $(cat "$T/out")"
  cmp -s "$T/h_full.json" "$T/h_res.json" ||
    fail "$name: the history differs: $(diff "$T/h_full.json" "$T/h_res.json" | head -5)"
else
  fail "$name: no ckpt-7: $(ls "$T/ck")"
fi
finish
