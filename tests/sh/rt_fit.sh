#!/usr/bin/env bash
# rt_fit.sh: kdrt_main end to end with tests/rt_fit_check.c, a hand-written
# stand-in for a generated program (a linear layer, mse, SGD, placed on a
# (data, model) mesh). Checks: Keras-style output; the same history on every
# mesh; .npy input; the errors (wrong -np, bad option, wrong batch size, a
# diverging loss, a data file of the wrong shape); Keras's callbacks as flags
# (runtime/callbacks.c). Exit status 0 when all pass.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

make -s build/libkdrt.a || exit 1
mkdir -p build/tests
mpicc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -g -Iruntime \
  -o build/tests/rt_fit_check tests/rt_fit_check.c build/libkdrt.a $(make -s rt-libs) || exit 1

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
BIN=build/tests/rt_fit_check
export RT_FIT_POISON= # RT_FIT_POISON=S: a NaN weight after step S (rt_fit_check.c)
fails=0
fail() { echo "rt_fit.sh: FAIL: $*" >&2; fails=$((fails + 1)); }
script=rt_fit.sh
. tests/lib.sh # expect, same_history (its fail() names $script)

# run MESH NP ARGS...: runs the program, output in $T/out, status in $rc.
run() {
  local mesh=$1 np=$2
  shift 2
  if [ "$np" = 0 ]; then
    RT_FIT_MESH=$mesh "$BIN" "$@" >"$T/out" 2>&1
  else
    RT_FIT_MESH=$mesh mpirun --oversubscribe -np "$np" -x RT_FIT_MESH -x RT_FIT_POISON "$BIN" "$@" \
      >"$T/out" 2>&1
  fi
  rc=$?
}

BAR='━━━━━━━━━━━━━━━━━━━━'
name="singleton"
run 1 0 --epochs 3 --history "$T/h1.json"
expect 0 "Epoch 3/3"
grep -qE "^8/8 $BAR [0-9]+s [0-9]+(s|ms|us)/step - accuracy: [0-9.]+ - loss: [0-9.]+\$" "$T/out" \
  || fail "$name: no Keras progress line"
[ "$(grep -c "^8/8 " "$T/out")" = 4 ] || fail "$name: want 3 epoch lines and 1 evaluate line"
grep -q $'\r' "$T/out" && fail "$name: carriage returns in non-terminal output"
python3 -c "import json,sys; h=json.load(open(sys.argv[1])); assert len(h['loss'])==3 and len(h['accuracy'])==3 and 'evaluate' in h and h['loss'][2] < h['loss'][0]" "$T/h1.json" \
  || fail "$name: bad history $(cat "$T/h1.json")"

for mesh in "8" "2,4" "4,2" "1,8" "8,1"; do
  name="mesh ($mesh)"
  run "$mesh" 8 --epochs 3 --history "$T/h8.json"
  expect 0 "Epoch 3/3"
  same_history "$T/h1.json" "$T/h8.json"
done
name="mesh (2,2)"; run 2,2 4 --epochs 3 --history "$T/h4.json"; expect 0 "Epoch 3/3"
same_history "$T/h1.json" "$T/h4.json"
# Logs handed over a step late (as the CUDA runtime does, so that the host
# loads the next batch while the GPU computes): the same history, and a
# divergence stops at the same step with the same history.
name="late logs"
RT_FIT_LATE=1 run 1 0 --epochs 3 --validation-split 0.25 --history "$T/hl.json"; expect 0 "Epoch 3/3"
run 1 0 --epochs 3 --validation-split 0.25 --history "$T/hs.json"; expect 0 "Epoch 3/3"
cmp -s "$T/hs.json" "$T/hl.json" || fail "$name: the history differs: $(diff "$T/hs.json" "$T/hl.json")"
name="late logs, diverging"
RT_FIT_LATE=1 run 1 0 --lr 1e30 --epochs 5 --history "$T/hdl.json"
expect 1 "rt_fit_check: training diverged: loss is "
run 1 0 --lr 1e30 --epochs 5 --history "$T/hds.json"
expect 1 "rt_fit_check: training diverged: loss is "
cmp -s "$T/hds.json" "$T/hdl.json" || fail "$name: the history differs: $(diff "$T/hds.json" "$T/hdl.json")"

name="wrong world size"
run 2,4 3
expect 1 "rt_fit_check: this program was compiled for mesh (2, 4) ('data', 'model') = 8 devices, but runs on 3 ranks; run it as: mpirun -np 8 build/tests/rt_fit_check"
name="1-D mesh message"; run 8 0; expect 1 "mesh (8,) ('data',) = 8 devices, but runs on 1 rank;"
name="unknown option"; run 2,2 4 --epoch 3; expect 2 "unknown option '--epoch'"
name="batch size"; run 1 0 --batch-size 32
expect 2 "--batch-size 32: this program holds at most 16 rows a step (its memory plan was compiled for kdcc --batch-size 16); recompile with kdcc --batch-size 32 or more"
name="help"; run 2,4 0 --help; expect 0 "--validation-split F"
# Divergence stops training as Keras's TerminateOnNaN does: the history
# so far is written (the last step's loss null), nothing is evaluated, no
# NaN weights are saved, the last finite checkpoint stays; status 1.
name="diverging loss"
run 2,2 4 --lr 1e30 --epochs 5 --history "$T/hd.json" --save-weights "$T/wd.weights.h5"
expect 1 "rt_fit_check: training diverged: loss is "
grep -qE "loss is (nan|inf) at epoch 1, step [0-9]+; stopped as Keras's TerminateOnNaN stops; the history so far is in $T/hd.json; $T/wd.weights.h5 is not written" "$T/out" \
  || fail "$name: message"
grep -qE "^Batch [0-9]+: Invalid loss, terminating training" "$T/out" || fail "$name: no Keras line"
[ -e "$T/wd.weights.h5" ] && fail "$name: NaN weights were saved"
python3 -c "import json,sys; h=json.load(open(sys.argv[1])); assert len(h['loss'])==1 and h['loss'][0] is None and h['step_loss'][-1] is None and all(v is not None for v in h['step_loss'][:-1]) and h['evaluate']['loss'] is None, h" "$T/hd.json" \
  || fail "$name: history: $(cat "$T/hd.json")"
name="weights NaN, loss finite: the checkpoint is refused"
RT_FIT_POISON=10 run 2,2 4 --epochs 3 --checkpoint-dir "$T/ckn" --checkpoint-every 5 --history "$T/hn.json"
expect 1 "rt_fit_check: training diverged: the weights of 'd/kernel' are not finite after the step; no checkpoint written"
grep -qF "the last checkpoint, $T/ckn/ckpt-5, holds finite weights" "$T/out" || fail "$name: names no checkpoint"
[ "$(cat "$T/ckn/latest")" = ckpt-5 ] && [ ! -e "$T/ckn/ckpt-10" ] || fail "$name: $(ls "$T/ckn")"
python3 -c "import json,sys; h=json.load(open(sys.argv[1])); assert len(h['step_loss'])==10 and None not in h['step_loss'] and len(h['loss'])==2, h" "$T/hn.json" \
  || fail "$name: history: $(cat "$T/hn.json")"
name="weights NaN at the end of an epoch"
RT_FIT_POISON=8 run 2,2 4 --epochs 3 --save-weights "$T/wn.weights.h5"
expect 1 "rt_fit_check: training diverged: the weights of 'd/kernel' are not finite at the end of the epoch"
[ -e "$T/wn.weights.h5" ] && fail "$name: NaN weights were saved"
# Output paths are checked before training, not after it.
touch "$T/afile"
name="history in a missing directory"; run 2,2 4 --history "$T/none/h.json"
expect 1 "rt_fit_check: --history $T/none/h.json: cannot write there: $T/none: No such file or directory"
grep -q "Epoch 1" "$T/out" && fail "$name: training started"
name="history under a file"; run 1 0 --history "$T/afile/h.json"
expect 1 "rt_fit_check: --history $T/afile/h.json: cannot write there: $T/afile is not a directory"
name="history is a directory"; run 1 0 --history "$T"
expect 1 "rt_fit_check: --history $T: is a directory"
name="save-weights in a missing directory"; run 2,2 4 --save-weights "$T/none/w.weights.h5"
expect 1 "rt_fit_check: --save-weights $T/none/w.weights.h5: cannot write there: $T/none: No such file or directory"
grep -q "Epoch 1" "$T/out" && fail "$name: training started"
name="quiet"; run 1 0 --quiet --synthetic 64; expect 0
[ -s "$T/out" ] && fail "quiet: printed $(cat "$T/out")"
name="validation split"; run 2,2 4 --validation-split 0.25 --epochs 2 --history "$T/hv.json"
expect 0 "val_accuracy: "
python3 -c "import json,sys; h=json.load(open(sys.argv[1])); assert len(h['val_loss'])==2 and len(h['val_accuracy'])==2" "$T/hv.json" \
  || fail "$name: history lacks val_loss: $(cat "$T/hv.json")"
# Every sample counts, as in Keras's fit: 37 samples in batches of 16 are 3
# steps, the last of 5 rows (over 2 or 8 ranks: unequal rows, some none),
# averaged by rows; a batch size chosen at run time (12, and 5: every step
# uneven); the same history on every mesh.
for bs in 16 12 5; do
  name="partial batch $bs singleton"
  run 1 0 --synthetic 37 --batch-size $bs --epochs 2 --validation-split 0.3 --history "$T/p1.json"
  steps=$(( (25 + bs - 1) / bs )); vsteps=$(( (12 + bs - 1) / bs ))
  expect 0 "$steps/$steps $BAR"
  python3 -c "import json,sys; h=json.load(open(sys.argv[1])); assert len(h['step_loss'])==2*int(sys.argv[2]), h" "$T/p1.json" "$steps" \
    || fail "$name: want $steps steps an epoch: $(cat "$T/p1.json")"
  grep -q "^$vsteps/$vsteps $BAR" "$T/out" || fail "$name: evaluate should take $vsteps steps"
  for mesh in "8" "2,4" "4,2"; do
    name="partial batch $bs ($mesh)"
    run "$mesh" 8 --synthetic 37 --batch-size $bs --epochs 2 --validation-split 0.3 --history "$T/p8.json"
    expect 0 "$steps/$steps $BAR"
    same_history "$T/p1.json" "$T/p8.json"
  done
done
# Keras's averaging: an epoch's loss is the mean over samples, the steps'
# losses weighted by their rows (with one epoch and a fixed model state
# per step that is checked exactly: --lr 0).
name="weighted mean"; run 2,4 8 --synthetic 37 --lr 0 --history "$T/w.json"; expect 0
python3 - "$T/w.json" <<'PY' || fail "$name: the epoch's loss is not the row-weighted mean"
import json, sys
h = json.load(open(sys.argv[1]))
s = h["step_loss"]
want = (16 * s[0] + 16 * s[1] + 5 * s[2]) / 37
assert len(s) == 3 and abs(h["loss"][0] - want) <= 1e-6 * abs(want), (s, h["loss"], want)
assert abs(h["evaluate"]["loss"] - want) <= 1e-5 * abs(want), (h["evaluate"], want)
PY
name="drop remainder"; run 1 0 --synthetic 37 --drop-remainder --history "$T/d.json"
expect 0 "--drop-remainder: 5 of 37 training samples do not fill a batch of 16; each epoch leaves them out"
grep -q "^2/2 $BAR" "$T/out" || fail "$name: want 2 steps"
grep -q "^3/3 $BAR" "$T/out" || fail "$name: evaluate still sees every sample (3 steps)"

# .npy input: x float64 (40, 6), y float32 (40, 8) one-hot; then a bad shape.
python3 - "$T" <<'PY'
import sys, random
sys.path.insert(0, "tests")
from npylite import save_npy as save  # noqa: E402
random.seed(1)
d = sys.argv[1]
x = [random.gauss(0, 1) for _ in range(40 * 6)]
cls = [random.randrange(8) for _ in range(40)]
save(d + "/x.npy", "<f8", "d", (40, 6), x)
save(d + "/y.npy", "<f4", "f", (40, 8), [1.0 if j == c else 0.0 for c in cls for j in range(8)])
save(d + "/ybad.npy", "<f4", "f", (40, 3), [0.0] * 120)
x[3 * 6 + 2] = float("nan")
save(d + "/xnan.npy", "<f8", "d", (40, 6), x)
PY
name="npy singleton"; run 1 0 --x "$T/x.npy" --y "$T/y.npy" --epochs 2 --history "$T/n1.json"
expect 0 "3/3 $BAR"
name="npy (2,4)"; run 2,4 8 --x "$T/x.npy" --y "$T/y.npy" --epochs 2 --history "$T/n8.json"
expect 0 "3/3 $BAR"
same_history "$T/n1.json" "$T/n8.json"
name="predict, one output"
run 1 0 predict --x "$T/x.npy" --out "$T/p1.npy" --quiet; expect 0
run 2,4 8 predict --x "x=$T/x.npy" --out "$T/p8.npy" --quiet; expect 0
python3 - "$T" <<'PY' || fail "$name: predictions differ or have the wrong shape"
import struct, sys
def load(p):
    b = open(p, "rb").read(); hl = struct.unpack("<H", b[8:10])[0]
    assert "'shape': (40, 8)" in b[10:10 + hl].decode(), b[10:10 + hl]
    return struct.unpack("<320f", b[10 + hl:10 + hl + 1280])
a, b = load(sys.argv[1] + "/p1.npy"), load(sys.argv[1] + "/p8.npy")
assert all(abs(x - y) <= 1e-5 * max(1, abs(x)) for x, y in zip(a, b))
PY
name="predict --out in a missing directory"; run 2,2 4 predict --x "$T/x.npy" --out "$T/none/p.npy"
expect 1 "predict: --out $T/none/p.npy: cannot write there: $T/none: No such file or directory"
name="npy wrong shape"; run 1 0 --x "$T/x.npy" --y "$T/ybad.npy"
expect 1 "ybad.npy: shape (40, 3) does not fit the model's labels: expected one-hot (N, 8) or class ids (N,)"
name="npy with a NaN"; run 2,2 4 --x "$T/xnan.npy" --y "$T/y.npy"
expect 1 "xnan.npy: sample 3 holds nan (element 2): inputs must be finite numbers"
name="npy missing"; run 2,2 4 --x "$T/none.npy" --y "$T/y.npy"
expect 1 "none.npy: cannot open: No such file or directory"

# Keras's callbacks as flags (runtime/callbacks.c; tests/sh/keras_ref.sh
# holds them to real Keras). val_loss at --lr 1.5 improves for 4 epochs,
# then not: EarlyStopping(patience=2) stops after epoch 6, restoring
# epoch 4's weights; ModelCheckpoint(save_best_only) wrote them last.
CB=(--synthetic 64 --validation-split 0.25 --epochs 12 --lr 1.5)
name="early stopping"
run 1 0 "${CB[@]}" --early-stopping 2 --restore-best-weights --checkpoint-best "$T/best.weights.h5" \
  --save-weights "$T/final.weights.h5" --history "$T/es1.json" --csv-log "$T/es.csv"
expect 0 "Epoch 6: early stopping"
grep -qF "Restoring model weights from the end of the best epoch: 4." "$T/out" || fail "$name: no restore line"
[ "$(grep -c "saving model to $T/best.weights.h5" "$T/out")" = 4 ] \
  || fail "$name: want 4 saves (epochs 1-4 improve): $(grep "val_loss" "$T/out")"
grep -qF "Epoch 5: val_loss did not improve from 0.14" "$T/out" || fail "$name: no 'did not improve' line"
ls -a "$T" | grep -q "^\.best" && fail "$name: a temporary was left: $(ls -a "$T")"
python3 - "$T" <<'PY' || fail "$name: history, checkpoint or final weights"
import json, sys
sys.path.insert(0, "tests/keras_ref")
import h5lite
t = sys.argv[1]
h = json.load(open(t + "/es1.json"))
assert len(h["loss"]) == 6 and "learning_rate" not in h, h
v = h["val_loss"]
assert min(range(6), key=lambda i: v[i]) == 3, v
# the evaluation after fit is the restored epoch's validation
assert abs(h["evaluate"]["loss"] - v[3]) <= 1e-6 * v[3], (h["evaluate"], v)
a, b = h5lite.datasets(t + "/best.weights.h5"), h5lite.datasets(t + "/final.weights.h5")
layers = [k for k in a if k.startswith("layers/")]  # not the optimizer's step
assert layers and a.keys() == b.keys() and all(a[k] == b[k] for k in layers), "checkpoint != restored"
PY
# The CSV file: CSVLogger's header (epoch, the logs sorted), a row an
# epoch, Python's float repr, \r\n.
python3 - "$T" <<'PY' || fail "$name: CSV log: $(cat -A "$T/es.csv")"
import json, sys
t = sys.argv[1]
h = json.load(open(t + "/es1.json"))
lines = open(t + "/es.csv", "rb").read().split(b"\r\n")
assert lines[0] == b"epoch,accuracy,loss,val_accuracy,val_loss" and lines[-1] == b"", lines
assert len(lines) == 8, lines
for e, row in enumerate(lines[1:7]):
    f = row.decode().split(",")
    assert f[0] == str(e), row
    for k, x in zip(("accuracy", "loss", "val_accuracy", "val_loss"), f[1:]):
        assert "e" in x or "." in x, row
        assert abs(float(x) - h[k][e]) <= 1e-6 * max(1, abs(h[k][e])), (k, x, h[k][e])
PY
# Never improved on the first epoch: its weights come back (Keras's rule).
name="early stopping, no improvement"
run 2,2 4 --synthetic 64 --validation-split 0.25 --epochs 12 --lr 3 --early-stopping 1 \
  --restore-best-weights --history "$T/es0.json"
expect 0 "Restoring model weights from the end of the best epoch: 1."
python3 -c "import json,sys; h=json.load(open(sys.argv[1])); v=h['val_loss']; assert len(v)==2 and v[1]>v[0] and abs(h['evaluate']['loss']-v[0])<=1e-6*v[0], h" "$T/es0.json" \
  || fail "$name: history $(cat "$T/es0.json")"
for mesh in "2,4" "8"; do
  name="early stopping ($mesh)"
  run "$mesh" 8 "${CB[@]}" --early-stopping 2 --restore-best-weights --history "$T/es8.json"
  expect 0 "Epoch 6: early stopping"
  same_history "$T/es1.json" "$T/es8.json"
done
# ReduceLROnPlateau: the rate halves after each epoch that does not
# improve; the history's learning_rate is the rate each epoch trained with;
# every rank takes the same decisions.
name="reduce lr on plateau"
run 1 0 "${CB[@]}" --reduce-lr-on-plateau 1 --reduce-lr-factor 0.5 --min-lr 0.2 --history "$T/rl1.json" \
  --csv-log "$T/rl.csv"
expect 0 "ReduceLROnPlateau reducing learning rate to 0.75."
python3 - "$T/rl1.json" "$T/rl.csv" <<'PY' || fail "$name: history $(cat "$T/rl1.json")"
import json, sys
h = json.load(open(sys.argv[1]))
lr, v = h["learning_rate"], h["val_loss"]
assert len(lr) == 12 and lr[0] == 1.5 and min(lr) >= 0.2 - 1e-7 and lr[-1] < 1.5, lr
best, want = None, [1.5]
for x in v[:-1]:  # patience 1, min_delta 1e-4, in float32 as Keras compares
    if best is None or x + 1e-4 < best:
        best, nxt = x, want[-1]
    else:
        nxt = max(want[-1] * 0.5, 0.2) if want[-1] > 0.2 + 1e-7 else want[-1]
    want.append(nxt)
assert all(abs(a - b) <= 1e-6 for a, b in zip(lr, want)), (lr, want, v)
head = open(sys.argv[2], "rb").read().split(b"\r\n")[0]
assert head == b"epoch,accuracy,learning_rate,loss,val_accuracy,val_loss", head
PY
name="reduce lr on plateau (2,4)"
run 2,4 8 "${CB[@]}" --reduce-lr-on-plateau 1 --reduce-lr-factor 0.5 --min-lr 0.2 --history "$T/rl8.json"
expect 0 "ReduceLROnPlateau reducing learning rate to 0.75."
same_history "$T/rl1.json" "$T/rl8.json"
# Resumed from a checkpoint, the callbacks' state is replayed from the
# restored epochs' logs: the same rates as an uninterrupted run.
name="reduce lr on plateau, resumed"
run 2,2 4 "${CB[@]}" --epochs 5 --reduce-lr-on-plateau 1 --reduce-lr-factor 0.5 --min-lr 0.2 \
  --checkpoint-dir "$T/rlck"
expect 0
run 2,2 4 "${CB[@]}" --reduce-lr-on-plateau 1 --reduce-lr-factor 0.5 --min-lr 0.2 \
  --checkpoint-dir "$T/rlck" --resume --history "$T/rlr.json"
expect 0 "resuming from"
same_history "$T/rl1.json" "$T/rlr.json"
# CSVLogger without validation: a val_ twin of every key, each NA; appending
# writes no second header.
name="csv log, no validation, append"
run 1 0 --synthetic 32 --epochs 2 --csv-log "$T/nv.csv"; expect 0
run 1 0 --synthetic 32 --epochs 1 --csv-log "$T/nv.csv" --csv-append; expect 0
python3 - "$T/nv.csv" <<'PY' || fail "$name: $(cat -A "$T/nv.csv")"
import sys
lines = open(sys.argv[1], "rb").read().split(b"\r\n")
assert lines[0] == b"epoch,accuracy,loss,val_accuracy,val_loss", lines
assert [l.split(b",")[0] for l in lines[1:4]] == [b"0", b"1", b"0"] and lines[4:] == [b""], lines
assert all(l.endswith(b",NA,NA") for l in lines[1:4]), lines
PY
name="checkpoint-best on accuracy (max mode)"
run 2,2 4 "${CB[@]}" --epochs 3 --monitor val_accuracy --checkpoint-best "$T/acc.weights.h5"
expect 0 "Epoch 1: val_accuracy improved from None to "
# Bad values and combinations: usage errors (status 2) or, for what needs
# the program's logs or the file system, status 1, all before training.
name="callback flags"
run 1 0 --early-stopping -1; expect 2 "option '--early-stopping' wants an integer >= 0, got '-1'"
run 1 0 --reduce-lr-on-plateau 2 --reduce-lr-factor 1; expect 2 "option '--reduce-lr-factor' wants a number in [0, 1), got '1'"
run 1 0 --early-stopping 2 --mode sideways; expect 2 "option '--mode' wants auto, min or max, got 'sideways'"
run 1 0 --early-stopping 2 --min-delta -0.1; expect 2 "option '--min-delta' wants a number >= 0, got '-0.1'"
run 1 0 --restore-best-weights; expect 2 "--restore-best-weights needs --early-stopping"
run 1 0 --min-lr 0.1; expect 2 "--min-lr needs --reduce-lr-on-plateau"
run 1 0 --monitor loss; expect 2 "--monitor needs --early-stopping, --reduce-lr-on-plateau or --checkpoint-best"
run 1 0 --csv-append; expect 2 "--csv-append needs --csv-log"
run 1 0 --early-stopping 1 --restore-best-weights --checkpoint-dir "$T/x" --resume
expect 2 "--restore-best-weights and --resume exclude each other"
run 2,2 4 --early-stopping 1; expect 1 "rt_fit_check: --monitor val_loss: no such log (val_ logs need --val-x/--val-y or --validation-split); the logs are loss, accuracy"
grep -q "Epoch 1" "$T/out" && fail "$name: training started"
run 1 0 --early-stopping 1 --monitor nope --validation-split 0.25
expect 1 "--monitor nope: no such log; the logs are loss, accuracy, val_loss, val_accuracy"
run 1 0 --checkpoint-best "$T/b.txt"; expect 2 "--checkpoint-best $T/b.txt"
run 2,2 4 --csv-log "$T/none/l.csv"; expect 1 "rt_fit_check: --csv-log $T/none/l.csv: cannot write there: $T/none: No such file or directory"
run 1 0 --checkpoint-best "$T/none/b.weights.h5"; expect 1 "--checkpoint-best $T/none/b.weights.h5: cannot write there"
name="help"; run 1 0 --help
for f in --early-stopping --monitor --mode --min-delta --baseline --start-from-epoch --restore-best-weights \
         --reduce-lr-on-plateau --reduce-lr-factor --reduce-lr-min-delta --reduce-lr-cooldown --min-lr \
         --checkpoint-best --csv-log --csv-append; do
  grep -qF -- "$f" "$T/out" || fail "$name: --help lacks $f"
done

[ "$fails" = 0 ] && echo "rt_fit.sh: ok" && exit 0
echo "rt_fit.sh: $fails failures" >&2
exit 1
