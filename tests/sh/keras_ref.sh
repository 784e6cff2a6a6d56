#!/usr/bin/env bash
# kdcc against real Keras: every case in tests/fixtures/keras_ref/ (written
# by tests/keras_ref/run_ref.py: Keras 3 on JAX, 8 virtual devices,
# keras.distribution, dropout 0, no shuffling) is compiled from its .keras
# for its mesh, trained under mpirun from the same initial weights on the
# same batches in the same order, and compared with what Keras did: every
# step's loss, each epoch's and evaluate's loss, and every final weight,
# within 1e-4 relative (tests/keras_ref/compare_ref.py, standard library
# only: the final weights are read back from --save-weights). A case's
# --x/--y files come from its JSON (x_files, y_files: one --x per model
# input, one --y per output with a loss, in model order); cases written
# before those fields existed have x.npy and y.npy. A case with
# compile_batch_size (Keras's own fit, run_ref.py's FIT_CASES: partial
# batches, validation, a batch size chosen at run time) is compiled for that
# batch and run with its program_args, the whole command line, from its
# folder; its History's val_ logs are compared too. A case with Keras's
# callbacks (func_fit_es, func_fit_rlrop: EarlyStopping, ReduceLROnPlateau
# as flags) is checked for the epochs they ran and the learning_rate
# column, its --csv-log against Keras's CSVLogger file and its
# --checkpoint-best against ModelCheckpoint's (func_fit_best).
#
# A case's own tolerances replace 1e-4 where its JSON has them (issue 23's
# mixed-precision cases: rtol, update_rtol, float32_min_distance; see
# compare_ref.py); a mixed_float16 case's loss scale after every step
# (step_loss_scale: Keras's LossScaleOptimizer halving it at the steps it
# skips) and the optimizer's iterations must be Keras's exactly.
#
# KERAS_REF_DIR=DIR checks the cases in DIR instead (a fresh run_ref.py --out).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
RTOL=1e-4
fix=${KERAS_REF_DIR:-tests/fixtures/keras_ref}
out=build/tests/keras_ref
mkdir -p $out
fail=0
probe=""

for ref in $fix/*/*.json; do
  case $ref in *.dist.json) continue ;; esac
  dir=$(dirname "$ref")
  name=$(basename "$ref" .json)
  read -r devices epochs batch cbatch steps lrank < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(r["devices"], r["epochs"], r["batch_size"], r.get("compile_batch_size", 0),
      r.get("hub", {}).get("sequence_length", 0), r.get("lora", {}).get("rank", 0))' "$ref")
  # a keras-hub model's token steps (its config leaves them open), and its
  # LoRA (keras-hub saves none of it): A and B from keras-hub's initial file
  seq=() && [ "$steps" != 0 ] && seq=(--sequence-length "$steps")
  lora=() && [ "$lrank" != 0 ] && seq+=(--lora-rank "$lrank") &&
    lora=(--lora-weights "$dir/initial.lora.h5" --save-lora-weights "$out/$name.lora.h5")
  mapfile -t data_args < <(python3 -c '
import json, os, sys
r = json.load(open(sys.argv[1]))
for flag, key, one in (("--x", "x_files", "x.npy"), ("--y", "y_files", "y.npy")):
    for f in r.get(key, [one]):
        print(flag)
        print(os.path.join(sys.argv[2], f))' "$ref" "$dir")
  exe=$PWD/$out/$name
  ./kdcc "$dir/model.keras" --distribution "$dir/$name.dist.json" "${seq[@]}" \
    --batch-size "$([ "$cbatch" != 0 ] && echo "$cbatch" || echo "$batch")" -w -o "$exe"
  if [ -z "$probe" ]; then
    # Initial weights must come from the fixture's .keras (kdcc's own
    # initializers draw other numbers than Keras's): nothing to compare
    # without --weights / --save-weights (runtime/weights.c).
    probe=$("$exe" --help 2>&1 || true)
    if ! grep -q -- '--save-weights' <<<"$probe" || ! grep -q -- '--weights' <<<"$probe"; then
      echo "keras_ref: SKIPPED: the training program has no --weights/--save-weights yet" \
           "(runtime/weights.c); nothing can start from Keras's initial weights"
      exit 0
    fi
  fi
  rm -f "$out/$name.history.json" "$out/$name.weights.h5" "$out/$name.csv"
  extra=() # compare_ref.py's --csv, --best
  if [ "$cbatch" != 0 ]; then
    mapfile -t args < <(python3 -c '
import json, sys
print("\n".join(json.load(open(sys.argv[1]))["program_args"]))' "$ref")
    # Keras's callbacks: their CSVLogger and ModelCheckpoint files are compared too.
    if grep -q '"csv_log"' "$ref"; then
      extra=(--csv "$out/$name.csv") && args+=(--csv-log "$PWD/$out/$name.csv")
    fi
    if grep -q '"checkpoint_best"' "$ref"; then
      rm -f "$out/$name.best.weights.h5"
      extra+=(--best "$out/$name.best.weights.h5") && args+=(--checkpoint-best "$PWD/$out/$name.best.weights.h5")
    fi
    (cd "$dir" && timeout 300 mpirun -np "$devices" --oversubscribe "$exe" "${args[@]}" \
      --save-weights "$OLDPWD/$out/$name.weights.h5" --history "$OLDPWD/$out/$name.history.json" \
      --quiet)
  else
    timeout 300 mpirun -np "$devices" --oversubscribe "$exe" "${data_args[@]}" \
      --epochs "$epochs" --batch-size "$batch" --no-shuffle --weights "$dir/model.keras" \
      --save-weights "$out/$name.weights.h5" --history "$out/$name.history.json" --quiet \
      "${lora[@]}"
  fi
  python3 tests/keras_ref/compare_ref.py $RTOL "$ref" "$out/$name.history.json" \
    "$out/$name.weights.h5" "${extra[@]}" || fail=1
done
exit $fail
