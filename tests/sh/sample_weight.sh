#!/usr/bin/env bash
# Keras's sample_weight (kdcc --sample-weight, ./train --sample-weight W.npy)
# against Keras 3.15 on JAX (tests/fixtures/sample_weight/, written by
# tests/keras_ref/sample_weight_ref.py): an MLP with sparse crossentropy from
# logits and weighted_metrics=["accuracy"], 44 samples weighted 0, 0.5, 1
# and 2, validation_split 0.25 (the weights sliced with the samples),
# batches of 16, 16 and 1. Under DataParallel over 8 and a ModelParallel
# map on (2,4), every step's loss, each epoch's loss, weighted accuracy,
# val_loss and val_accuracy, the final evaluation and every final weight
# equal Keras's within 1e-5 relative; keras-hub's GPT2CausalLM trained on
# padded rows with keras-hub's loss mask (below) within 1e-4. Then: the program without
# --sample-weight trains as all weights 1 (the same history as a file of
# ones, and as the program compiled without --sample-weight, bit for bit);
# a weights file of the wrong length or shape is refused, naming the file
# and the shapes; --sample-weight to a program compiled without it is refused.
# Keras's class_weight (./train --class-weight 0:1,1:3,2:0) equals Keras's fit
# with class_weight and validation_split within 1e-5 too.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fix=tests/fixtures/sample_weight
out=build/tests/sample_weight
mkdir -p $out
fail=0
cat > $out/mp.dist.json <<'J'
{"distribution": "ModelParallel",
 "device_mesh": {"shape": [2, 4], "axis_names": ["data", "model"]},
 "batch_dim_name": "data",
 "layout_map": {"a/kernel": [null, "model"], "a/bias": ["model"], "b/kernel": ["model", null]}}
J
cat > $out/dp.dist.json <<'J'
{"distribution": "DataParallel", "device_mesh": {"shape": [8], "axis_names": ["batch"]}}
J
run() { # PROGRAM NAME ARGS...: trains on the fixture, writes NAME's history and weights
  local exe=$1 name=$2
  shift 2
  rm -f $out/$name.history.json $out/$name.weights.h5
  timeout 300 mpirun -np 8 --oversubscribe "$exe" --x $fix/x.npy --y $fix/y.npy \
    --epochs 2 --batch-size 16 --no-shuffle --validation-split 0.25 --weights $fix/model.keras \
    --history $out/$name.history.json --save-weights $out/$name.weights.h5 --quiet "$@"
}
for d in dp mp; do
  ./kdcc $fix/model.keras --distribution $out/$d.dist.json --batch-size 16 --sample-weight -w \
    -o $out/sw_$d
  run $out/sw_$d $d --sample-weight $fix/w.npy
  if python3 tests/keras_ref/compare_sw.py 1e-5 $fix $out/$d.history.json $out/$d.weights.h5; then
    echo "sample_weight: $d: Keras's step losses, weighted accuracy, val_ logs and weights"
  else
    echo "sample_weight: $d: FAILED"
    fail=1
  fi
done

# Keras's class_weight (--class-weight): the training samples weighed by
# their class, the validation split's not (Keras splits first)
run $out/sw_mp cw --class-weight 0:1,1:3,2:0
if python3 tests/keras_ref/compare_sw.py 1e-5 $fix/class_weight $out/cw.history.json \
   $out/cw.weights.h5; then
  echo "sample_weight: class_weight: Keras's step losses, weighted accuracy, val_ logs and weights"
else
  echo "sample_weight: class_weight: FAILED"
  fail=1
fi

# keras-hub: tests/fixtures/keras_hub/hub_gpt2's GPT2CausalLM on its padded
# rows, the loss and the weighted accuracy masked as keras-hub's
# CausalLMPreprocessor masks them (sample_weight = the padding mask shifted
# left one; tests/keras_ref/hub_sample_weight_ref.py), under its Megatron map
# on (2,4) and DataParallel 8: within 1e-4 of keras-hub's fit
src=tests/fixtures/keras_hub/hub_gpt2
for d in hub_gpt2 hub_gpt2_dp; do
  ./kdcc $src/model.keras --distribution $src/$d.dist.json --sequence-length 16 --batch-size 16 \
    --sample-weight -w -o $out/$d
  rm -f $out/$d.history.json $out/$d.weights.h5
  timeout 300 mpirun -np 8 --oversubscribe $out/$d --x $src/padding_mask.npy \
    --x $src/token_ids.npy --y $src/y.npy --sample-weight $fix/hub_gpt2/sw.npy --epochs 2 \
    --batch-size 16 --no-shuffle --weights $src/model.keras --history $out/$d.history.json \
    --save-weights $out/$d.weights.h5 --quiet
  if python3 tests/keras_ref/compare_sw.py 1e-4 $fix/hub_gpt2 $out/$d.history.json \
     $out/$d.weights.h5; then
    echo "sample_weight: $d: keras-hub's padding-masked step losses, weighted accuracy and weights"
  else
    echo "sample_weight: $d: FAILED"
    fail=1
  fi
done

# no --sample-weight: every weight 1, as a file of ones, as a program without them
python3 - $out/ones.npy <<'P'
import sys
sys.path.insert(0, "tests")
from npylite import save_npy  # noqa: E402
save_npy(sys.argv[1], "<f4", "f", (44,), [1.0] * 44)
P
./kdcc $fix/model.keras --distribution $out/mp.dist.json --batch-size 16 -w -o $out/plain_mp
run $out/sw_mp none
run $out/sw_mp ones --sample-weight $out/ones.npy
run $out/plain_mp plain
same() { python3 -c '
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
keys = ("step_loss", "loss", "accuracy", "val_loss", "val_accuracy", "evaluate")
sys.exit(0 if all(a[k] == b[k] for k in keys) else 1)' "$1" "$2"; }
if same $out/none.history.json $out/ones.history.json &&
   same $out/none.history.json $out/plain.history.json &&
   python3 -c '
import sys; sys.path.insert(0, "tests/keras_ref"); import h5lite
a, b = (h5lite.datasets(p) for p in sys.argv[1:3])
sys.exit(0 if a == b else 1)' $out/none.weights.h5 $out/plain.weights.h5; then
  echo "sample_weight: no --sample-weight: a file of ones, and the program without them, bit for bit"
else
  echo "sample_weight: no --sample-weight differs from ones or from the plain program: FAILED"
  fail=1
fi

# errors: the file and the shapes named
python3 - $out/short.npy $out/shape.npy $out/tokens.npy <<'P'
import math, sys
sys.path.insert(0, "tests")
from npylite import save_npy  # noqa: E402
for path, shape in zip(sys.argv[1:], ((43,), (44, 3), (64, 15))):
    save_npy(path, "<f4", "f", shape, [1.0] * math.prod(shape))
P
expect() { # WHAT PATTERN COMMAND...: fails, saying PATTERN
  local what=$1 pat=$2
  shift 2
  local msg
  if msg=$("$@" 2>&1); then
    echo "sample_weight: $what: accepted: FAILED"; fail=1
  elif grep -qF -- "$pat" <<<"$msg"; then
    echo "sample_weight: $what: refused ($pat)"
  else
    echo "sample_weight: $what: wrong message: FAILED"; echo "$msg" | head -3; fail=1
  fi
}
expect "43 weights for 44 samples" "$out/short.npy has 43" run $out/sw_mp e1 --sample-weight $out/short.npy
expect "weights (44, 3)" "$out/shape.npy: shape (44, 3) does not fit the model's sample weights: expected (N,)" \
  run $out/sw_mp e2 --sample-weight $out/shape.npy
expect "per-token weights (64, 15) for 16 tokens" \
  "$out/tokens.npy: shape (64, 15) does not fit the model's sample weights: expected (N, 16) or (N,)" \
  mpirun -np 8 --oversubscribe $out/hub_gpt2_dp --x $src/padding_mask.npy --x $src/token_ids.npy \
  --y $src/y.npy --sample-weight $out/tokens.npy --epochs 1 --weights $src/model.keras --quiet
expect "--class-weight with --sample-weight" "exclude each other" \
  run $out/sw_mp e4 --class-weight 0:2 --sample-weight $fix/w.npy
expect "a bad --class-weight" "not class:weight pairs" run $out/sw_mp e5 --class-weight 0=2
expect "a program without sample weights" "compile it with kdcc --sample-weight" \
  run $out/plain_mp e3 --sample-weight $fix/w.npy
exit $fail
