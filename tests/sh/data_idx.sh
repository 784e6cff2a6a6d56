#!/usr/bin/env bash
# data_idx.sh: real-data input end to end (runtime/data.c through kdrt_main).
# Small IDX files made here (MNIST's layout: uint8 images [N,28,28], uint8
# labels [N], some gzip'd) train the Fashion-MNIST example MLP compiled by
# kdcc, under mpirun:
#   - on two meshes, (2,4) and (4,2), with --val-x/--val-y, --test-x/--test-y
#     and --scale 1/255: equal histories, the test set evaluated;
#   - class ids expanded to one-hot for a categorical model (func_branches):
#     IDX float32 inputs and uint8 ids give the history .npy one-hot gives;
#   - broken files (truncated gzip, truncated IDX, a wrong magic, images of
#     the wrong size, counts that differ, a label out of range): a message
#     naming the file, once, and exit status 1, without hanging.
# Exit status 0 when all pass.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin data_idx.sh

EX=examples/fashion_mnist
./kdcc $EX/mlp.json --distribution $EX/mlp.dist.json --batch-size 16 -o "$T/mlp24" -w || exit 1
./kdcc $EX/mlp.json --distribution $EX/mlp.dist.json --mesh data=4,model=2 --batch-size 16 \
  -o "$T/mlp42" -w || exit 1
./kdcc models/func_branches.json --distribution models/func_branches.dist.json --batch-size 16 \
  -o "$T/fb" -w || exit 1

# The data: images whose class shows as a bright band (plus noise), so the
# model learns something; func_branches data as IDX and as .npy.
python3 - "$T" <<'PY'
import gzip, random, struct, sys
sys.path.insert(0, "tests")
from npylite import save_npy, save_idx  # noqa: E402
d = sys.argv[1]
random.seed(7)
def images(labels):
    out = bytearray()
    for c in labels:
        for r in range(28):
            for col in range(28):
                v = random.randrange(60) + (150 if 2 * c <= r < 2 * c + 3 else 0)
                out.append(min(v, 255))
    return bytes(out)
for name, n, gz in (("train", 96, True), ("val", 32, False), ("test", 32, False)):
    ys = [random.randrange(10) for _ in range(n)]
    save_idx("%s/%s-images.idx%s" % (d, name, ".gz" if gz else ""), 0x08, (n, 28, 28), images(ys), gz)
    save_idx("%s/%s-labels.idx%s" % (d, name, ".gz" if gz else ""), 0x08, (n,), bytes(ys), gz)
# broken ones
full = gzip.open(d + "/train-images.idx.gz").read()
raw = open(d + "/train-images.idx.gz", "rb").read()
open(d + "/cut.idx.gz", "wb").write(raw[: len(raw) // 2])
open(d + "/short.idx", "wb").write(full[:-28])
open(d + "/magic.idx", "wb").write(b"\x00\x01" + full[2:])
save_idx(d + "/small.idx", 0x08, (96, 27, 27), bytes(96 * 27 * 27))
save_idx(d + "/labels95.idx", 0x08, (95,), bytes(95))
save_idx(d + "/labels10.idx", 0x08, (96,), bytes([3] * 50 + [10] + [0] * 45))
# func_branches: x (64, 32) float32, 4 classes
n = 64
xs = [random.gauss(0, 1) for _ in range(n * 32)]
ys = [random.randrange(4) for _ in range(n)]
save_idx(d + "/fx.idx", 0x0D, (n, 32), struct.pack(">%df" % len(xs), *xs))
save_idx(d + "/fy.idx", 0x08, (n,), bytes(ys))
save_npy(d + "/fx.npy", "<f4", "f", (n, 32), xs)
save_npy(d + "/fy.npy", "<f4", "f", (n, 4), [1.0 if j == c else 0.0 for c in ys for j in range(4)])
PY
[ -s "$T/fy.npy" ] || { echo "data_idx.sh: could not write the data" >&2; exit 1; }

# run NAME EXE ARGS...: 8 ranks, output in $T/out, status in $rc; a hang is a failure.
run() {
  name=$1
  local exe=$2
  shift 2
  timeout 120 mpirun --oversubscribe -np 8 "$exe" "$@" >"$T/out" 2>&1
  rc=$?
  [ "$rc" = 124 ] && fail "$name: hung (killed after 120 s)"
}

DATA=(--x "$T/train-images.idx.gz" --y "$T/train-labels.idx.gz"
      --val-x "$T/val-images.idx" --val-y "$T/val-labels.idx"
      --test-x "$T/test-images.idx" --test-y "$T/test-labels.idx" --scale 1/255)
run "mlp (2,4)" "$T/mlp24" "${DATA[@]}" --epochs 3 --history "$T/h24.json"
expect 0 "val_accuracy: "
grep -q "^2/2 ━" "$T/out" || fail "$name: no evaluation of the 2 test batches"
python3 -c "import json,sys; h=json.load(open(sys.argv[1])); assert len(h['val_loss'])==3 and h['loss'][2] < h['loss'][0] and 'evaluate' in h, h" "$T/h24.json" \
  || fail "$name: bad history $(cat "$T/h24.json")"
run "mlp (4,2)" "$T/mlp42" "${DATA[@]}" --epochs 3 --history "$T/h42.json"
expect 0 "val_accuracy: "
same_history "$T/h24.json" "$T/h42.json"

# --scale is applied: unscaled pixels give another history.
run "mlp unscaled" "$T/mlp24" "${DATA[@]/1\/255/1}" --epochs 1 --history "$T/hs.json"
expect 0
python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); assert abs(a['loss'][0]-b['loss'][0])>1e-3" "$T/h24.json" "$T/hs.json" \
  || fail "$name: --scale 1 trained like --scale 1/255"

# Evaluation without a test set: the validation data (2 batches of 16).
run "mlp no test set" "$T/mlp24" --x "$T/train-images.idx.gz" --y "$T/train-labels.idx.gz" \
  --validation-split 0.5 --epochs 1 --scale 0.00392156862745098
expect 0 "val_loss: "
[ "$(grep -c "^3/3 ━" "$T/out")" = 2 ] || { fail "$name: want 3 train and 3 evaluate steps"; cat "$T/out" >&2; }

# Class ids become one-hot for categorical_crossentropy: same as the .npy one-hot.
run "ids to one-hot" "$T/fb" --x "$T/fx.idx" --y "$T/fy.idx" --epochs 2 --history "$T/fi.json"
expect 0 "Epoch 2/2"
run "npy one-hot" "$T/fb" --x "$T/fx.npy" --y "$T/fy.npy" --epochs 2 --history "$T/fn.json"
expect 0 "Epoch 2/2"
same_history "$T/fi.json" "$T/fn.json"

# Broken files: one message naming the file, exit status 1.
bad() { # bad NAME TEXT ARGS...
  local n=$1 text=$2
  shift 2
  run "$n" "$T/mlp24" "$@"
  expect 1 "$text"
  local k
  k=$(grep -cF -- "$text" "$T/out")
  [ "$k" = 1 ] || fail "$n: message printed $k times, want once"
}
Y=(--y "$T/train-labels.idx.gz")
bad "truncated gzip" "cut.idx.gz: gzip data is truncated" --x "$T/cut.idx.gz" "${Y[@]}"
bad "truncated IDX" "short.idx: file is truncated: 75236 bytes of data, but IDX of uint8 shape (96, 28, 28) needs 75264" \
  --x "$T/short.idx" "${Y[@]}"
bad "wrong magic" "magic.idx: not a .npy or IDX file (it starts with 00 01 08 03 00 00;" --x "$T/magic.idx" "${Y[@]}"
bad "wrong image size" "small.idx: shape (96, 27, 27) does not fit the model's input (N, 28, 28, 1): a sample has 729 elements, the model's input 784" \
  --x "$T/small.idx" "${Y[@]}"
bad "counts differ" "train-images.idx.gz has 96 samples but $T/labels95.idx has 95" \
  --x "$T/train-images.idx.gz" --y "$T/labels95.idx"
bad "label out of range" "labels10.idx: label 10 of sample 50 is not a class id in [0, 10)" \
  --x "$T/train-images.idx.gz" --y "$T/labels10.idx"
bad "broken test set" "short.idx: file is truncated" --x "$T/train-images.idx.gz" "${Y[@]}" \
  --test-x "$T/short.idx" --test-y "$T/train-labels.idx.gz"
bad "labels for images" "train-images.idx.gz: shape (96, 28, 28) does not fit the model's labels: expected class ids (N,) or (N, 1), as the loss is a sparse one" \
  --x "$T/train-images.idx.gz" --y "$T/train-images.idx.gz"

finish
