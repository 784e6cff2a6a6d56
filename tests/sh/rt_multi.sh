#!/usr/bin/env bash
# rt_multi.sh: kdrt_main with several inputs and outputs, through
# tests/rt_multi_check.c (inputs feat float32 and tok int32 ids; outputs a,
# class ids, and b, dense; logs loss, a_loss, b_loss, a_accuracy). Checks:
# Keras-shaped history keys and values (loss = a_loss + b_loss, val_
# names), the progress line sorted by name, the same history on meshes of
# 1, 2 and 4 ranks, --x/--y by position and by NAME=FILE, the errors (the
# wrong number of --x, sample counts that differ, an id out of range),
# predict's one file per output, and gradcheck. Exit status 0 when all pass.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

make -s build/libkdrt.a || exit 1
mkdir -p build/tests
mpicc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -g -Iruntime \
  -o build/tests/rt_multi_check tests/rt_multi_check.c build/libkdrt.a $(make -s rt-libs) || exit 1

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
BIN=build/tests/rt_multi_check
fails=0
fail() { echo "rt_multi.sh: FAIL: $*" >&2; fails=$((fails + 1)); }
. tests/lib.sh # expect, same_history

# run NP ARGS...: NP ranks (0: a lone process) on the mesh (NP,); output in
# $T/out, status in $rc.
run() {
  local np=$1
  shift
  if [ "$np" = 0 ]; then
    RT_MULTI_MESH=1 "$BIN" "$@" >"$T/out" 2>&1
  else
    RT_MULTI_MESH=$np mpirun --oversubscribe -np "$np" -x RT_MULTI_MESH -x RT_MULTI_NOPRED \
      "$BIN" "$@" >"$T/out" 2>&1
  fi
  rc=$?
}
export RT_MULTI_NOPRED=0

# Keras's History of a two-output model: exactly these keys, loss the sum
# of the outputs' losses, accuracies in [0, 1], every list one per epoch.
keras_shaped() { # keras_shaped FILE EPOCHS VAL(0|1)
  python3 - "$@" <<'PY' || fail "$name: history not Keras-shaped: $(cat "$1")"
import json, sys
h = json.load(open(sys.argv[1])); n = int(sys.argv[2]); val = sys.argv[3] == "1"
logs = ["loss", "a_loss", "b_loss", "a_accuracy"]
want = logs[:1] + ["step_loss"] + logs[1:] + (["val_" + k for k in logs] if val else []) + ["evaluate"]
assert list(h) == want, list(h)
assert list(h["evaluate"]) == logs, list(h["evaluate"])
for p in [""] + (["val_"] if val else []):
    assert all(len(h[p + k]) == n for k in logs)
    for i in range(n):
        assert abs(h[p + "loss"][i] - h[p + "a_loss"][i] - h[p + "b_loss"][i]) <= 1e-5 * h[p + "loss"][i]
        assert 0 <= h[p + "a_accuracy"][i] <= 1
e = h["evaluate"]
assert abs(e["loss"] - e["a_loss"] - e["b_loss"]) <= 1e-5 * e["loss"]
assert h["loss"][-1] < h["loss"][0], h["loss"]
PY
}

BAR='━━━━━━━━━━━━━━━━━━━━'
NUM='[0-9]+\.[0-9]+'
name="synthetic singleton"
run 0 --epochs 3 --validation-split 0.25 --history "$T/s1.json"
expect 0 "Epoch 3/3"
grep -qE "^12/12 $BAR [0-9]+s [0-9]+(s|ms|us)/step - a_accuracy: $NUM - a_loss: $NUM - b_loss: $NUM - loss: $NUM - val_a_accuracy: $NUM - val_a_loss: $NUM - val_b_loss: $NUM - val_loss: $NUM\$" "$T/out" \
  || { fail "$name: no sorted Keras progress line"; sed 's/^/    | /' "$T/out" >&2; }
grep -qE "^4/4 $BAR [0-9]+s [0-9]+(s|ms|us)/step - a_accuracy: $NUM - a_loss: $NUM - b_loss: $NUM - loss: $NUM\$" "$T/out" \
  || fail "$name: no evaluate line with every log"
keras_shaped "$T/s1.json" 3 1
for np in 2 4; do
  name="synthetic mesh ($np,)"
  run "$np" --epochs 3 --validation-split 0.25 --history "$T/s$np.json"
  expect 0 "Epoch 3/3"
  same_history "$T/s1.json" "$T/s$np.json"
done
# Partial batches: 37 samples, 27 to train (8 + 8 + 8 + 3) and 10 to
# validate (8 + 2), unequal rows over 2 and 4 ranks; every log averaged
# over samples as Keras averages it, the same on every mesh.
name="partial batches singleton"
run 0 --synthetic 37 --epochs 2 --validation-split 0.27 --history "$T/p1.json"
expect 0 "4/4 $BAR"
for np in 2 4; do
  name="partial batches mesh ($np,)"
  run "$np" --synthetic 37 --epochs 2 --validation-split 0.27 --history "$T/p$np.json"
  expect 0 "4/4 $BAR"
  same_history "$T/p1.json" "$T/p$np.json"
done
name="no validation"; run 0 --epochs 2 --history "$T/nv.json"; expect 0 "Epoch 2/2"
keras_shaped "$T/nv.json" 2 0

# Files: feat float32 (40, 5), tok int64 (40, 3) ids < 6, a uint8 ids
# (40,) < 4, b float32 (40, 1); and broken variants.
python3 - "$T" <<'PY'
import sys, random
sys.path.insert(0, "tests")
from npylite import save_npy as save  # noqa: E402
random.seed(2)
d = sys.argv[1]
feat = [random.gauss(0, 1) for _ in range(40 * 5)]
tok = [random.randrange(6) for _ in range(40 * 3)]
save(d + "/feat.npy", "<f4", "f", (40, 5), feat)
save(d + "/tok.npy", "<i8", "q", (40, 3), tok)
save(d + "/a.npy", "|u1", "B", (40,), [random.randrange(4) for _ in range(40)])
save(d + "/b.npy", "<f4", "f", (40, 1), [sum(feat[5 * i:5 * i + 3]) for i in range(40)])
save(d + "/tok39.npy", "<i8", "q", (39, 3), tok[:39 * 3])
bad = list(tok); bad[3 * 17 + 2] = 6
save(d + "/tokbad.npy", "<i4", "i", (40, 3), bad)
PY
F="$T/feat.npy" K="$T/tok.npy" A="$T/a.npy" Bf="$T/b.npy"
name="files by position"
run 0 --x "$F" --x "$K" --y "$A" --y "$Bf" --epochs 2 --history "$T/f1.json"
expect 0 "5/5 $BAR"
keras_shaped "$T/f1.json" 2 0
name="files by name, in another order"
run 0 --x "tok=$K" --x="feat=$F" --y "b=$Bf" --y "a=$A" --epochs 2 --history "$T/f1n.json"
expect 0 "5/5 $BAR"
cmp -s "$T/f1.json" "$T/f1n.json" || fail "$name: history differs from the positional run"
name="files mesh (4,)"
run 4 --x "$F" --x "$K" --y "a=$A" --y "b=$Bf" --epochs 2 --history "$T/f4.json"
expect 0 "5/5 $BAR"
same_history "$T/f1.json" "$T/f4.json"
name="validation files"
run 2 --x "$F" --x "$K" --y "$A" --y "$Bf" --val-x "tok=$K" --val-x "feat=$F" --val-y "$A" \
  --val-y "$Bf" --epochs 2 --history "$T/fv.json"
expect 0 "val_a_accuracy: "
keras_shaped "$T/fv.json" 2 1

name="one --x for two inputs"; run 0 --x "$F" --y "$A" --y "$Bf"
expect 2 "--x given 1 time, but the model has 2 inputs ('feat', 'tok'): give one --x FILE per input, in this order, or --x NAME=FILE"
name="three --y"; run 2 --x "$F" --x "$K" --y "$A" --y "$Bf" --y "$Bf"
expect 2 "--y given 3 times, but the model has 2 labels ('a', 'b')"
name="a name twice"; run 0 --x "feat=$F" --x "feat=$F" --y "$A" --y "$Bf"
expect 2 "--x feat=$F: input 'feat' has a file already ($F)"
name="sample counts differ"; run 2 --x "$F" --x "$T/tok39.npy" --y "$A" --y "$Bf"
expect 1 "$F has 40 samples but $T/tok39.npy has 39"
name="id out of range"; run 0 --x "$F" --x "$T/tokbad.npy" --y "$A" --y "$Bf"
expect 1 "$T/tokbad.npy: id 6 of sample 17 is not in [0, 6) (input tok)"
name="test set, wrong count"; run 0 --x "$F" --x "$K" --y "$A" --y "$Bf" --test-x "$F" --test-x "$T/tok39.npy" --test-y "$A" --test-y "$Bf"
expect 1 "has 39"

# predict: one .npy per output, the same numbers on every mesh.
name="predict"
run 0 predict --x "tok=$K" --x "feat=$F" --out "$T/p.npy" --quiet
expect 0
run 4 predict --x "$F" --x "$K" --out "$T/d/" --quiet
[ "$rc" = 1 ] || fail "$name: a missing directory should fail (status $rc)"
mkdir -p "$T/d"
run 4 predict --x "$F" --x "$K" --out "$T/d" --quiet
expect 0
python3 - "$T" <<'PY' || fail "predict: wrong files"
import struct, sys
def load(p):
    b = open(p, "rb").read(); hl = struct.unpack("<H", b[8:10])[0]; h = b[10:10 + hl].decode()
    shape = tuple(int(v) for v in h.split("'shape': (")[1].split(")")[0].split(",") if v.strip())
    n = 1
    for s in shape: n *= s
    return shape, struct.unpack("<%df" % n, b[10 + hl:10 + hl + 4 * n])
d = sys.argv[1]
for o, shape in (("a", (40, 4)), ("b", (40, 1))):
    s1, v1 = load("%s/p.%s.npy" % (d, o)); s4, v4 = load("%s/d/%s.npy" % (d, o))
    assert s1 == shape and s4 == shape, (o, s1, s4)
    assert all(abs(x - y) <= 1e-5 * max(1, abs(x)) for x, y in zip(v1, v4)), o
PY
[ -e "$T/p.npy" ] && fail "predict: wrote p.npy for a two-output model"
name="predict, an output not in the arena"
RT_MULTI_NOPRED=1 run 2 predict --x "$F" --x "$K" --out "$T/q.npy"
expect 1 "predict: output 'b' is not one buffer of the activation arena in this program, so predict cannot read it"
name="predict, one --x"; run 0 predict --x "$F" --out "$T/q.npy"
expect 2 "--x given 1 time, but the model has 2 inputs"

name="gradcheck"; run 0 gradcheck; expect 0 "gradcheck: ok"

# Checkpoints keep every log's sums and history: resuming, at an epoch's
# end or in the middle of one, gives the uninterrupted run's history.
name="resume at an epoch's end"
run 2 --epochs 1 --validation-split 0.25 --checkpoint-dir "$T/ck1"
expect 0 "Epoch 1/1"
grep -q "^KDCKPT-MANIFEST 2" "$T/ck1/ckpt-12/MANIFEST" && grep -q "^logs 4 loss a_loss b_loss a_accuracy$" "$T/ck1/ckpt-12/MANIFEST" \
  || fail "$name: MANIFEST lacks the logs line: $(head -8 "$T/ck1/ckpt-12/MANIFEST")"
run 2 --epochs 3 --validation-split 0.25 --checkpoint-dir "$T/ck1" --resume --history "$T/r1.json"
expect 0 "resuming from $T/ck1/ckpt-12"
same_history "$T/s1.json" "$T/r1.json"
name="resume mid-epoch"
run 4 --epochs 2 --validation-split 0.25 --checkpoint-dir "$T/ck2" --checkpoint-every 5
expect 0 "Epoch 2/2"
run 0 --epochs 3 --validation-split 0.25 --checkpoint-dir "$T/ck2" --resume --history "$T/r2.json"
expect 0 "resuming from $T/ck2/ckpt-20: epoch 2, 8 of 12 steps done"
same_history "$T/s1.json" "$T/r2.json"

[ "$fails" = 0 ] && echo "rt_multi.sh: ok" && exit 0
echo "rt_multi.sh: $fails failures" >&2
exit 1
