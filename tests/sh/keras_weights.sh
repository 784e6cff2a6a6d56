#!/usr/bin/env bash
# Keras weights in and out, checked by real Keras 3 (tests/keras_ref/check_weights.py).
#
# For models/seed_mlp.keras, models/cnn.keras, models/nested.keras and
# models/nested_frozen.keras (models used as layers: their weights under
# layers/sequential/layers/..., layers/functional/layers/...), and
# tests/fixtures/keras_ref/adapted_norm/model.keras (adapted Normalizations: their
# statistics and int32 count in the file, split over the mesh) compiled for a (2,4) mesh,
# 8 ranks: predict from the archive's own weights and from a .weights.h5
# Keras wrote (reading, sharded), train a few steps and --save-weights
# (gathering, writing), predict from that file; seed_mlp and cnn also
# predict from their weights as Keras saves them under the bfloat16 policy
# (read into the float32 program exactly, as Keras loads them), and a keras-hub
# preset saved in bfloat16 predicts under --dtype-policy float32 and
# mixed_bfloat16 as keras-hub does; then Keras loads each file
# and must predict the same within 1e-4. Also: another model's weights and
# a bad --save-weights name are errors that write nothing.
#
# Python: $KDCC_PYTHON, else build/keras-venv (made here from
# tests/keras_ref/requirements.txt); skipped, saying so, when no venv with
# pip can be made.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 KDRT_PROGRESS=plain
export KERAS_BACKEND=jax JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3

has_keras() { "$1" -c 'import keras, jax, h5py, numpy' >/dev/null 2>&1; }
PY=${KDCC_PYTHON:-}
if [ -z "$PY" ]; then
  PY=build/keras-venv/bin/python
  if ! has_keras "$PY"; then
    echo "keras_weights: making build/keras-venv (keras, jax, h5py from PyPI)"
    if ! python3 -m venv build/keras-venv >/dev/null 2>&1 ||
       ! build/keras-venv/bin/python -m pip --version >/dev/null 2>&1; then
      echo "keras_weights: SKIP: cannot make a Python venv with pip (apt-get install python3-venv)"
      exit 0
    fi
    if ! build/keras-venv/bin/python -m pip install -q -r tests/keras_ref/requirements.txt \
         >build/keras-venv.log 2>&1; then
      echo "keras_weights: SKIP: pip could not install keras/jax/h5py (see build/keras-venv.log)"
      exit 0
    fi
  fi
fi
has_keras "$PY" || { echo "keras_weights: FAIL: $PY cannot import keras, jax, h5py"; exit 1; }
if [ "$PY" = build/keras-venv/bin/python ] && ! "$PY" -c 'import keras_hub' 2>/dev/null; then
  "$PY" -m pip install -q --no-deps -r tests/keras_ref/requirements-nodeps.txt \
    >>build/keras-venv.log 2>&1 || echo "keras_weights: could not install keras-hub (build/keras-venv.log)"
fi

make -s kdcc build/libkdrt.a || exit 1
D=build/keras_weights
rm -rf "$D" && mkdir -p "$D"
fail=0
bad() { echo "keras_weights: FAIL: $*"; fail=1; }

"$PY" tests/keras_ref/check_weights.py prepare "$D" seed_mlp cnn nested nested_frozen adapted_norm ||
  exit 1

run8() { mpirun -np 8 "$@" >"$D/out.txt" 2>&1 || { cat "$D/out.txt"; return 1; }; }

# model  distribution                    batch  trained weights saved as
for spec in "seed_mlp seed_mlp_fixed.dist.json 16 weights.h5" "cnn cnn.dist.json 8 keras" \
            "nested nested.dist.json 8 weights.h5" "nested_frozen nested_frozen.dist.json 8 keras" \
            "adapted_norm adapted_norm.dist.json 16 keras"; do
  set -- $spec
  m=$1 dist=$2 batch=$3 ext=$4
  src=models/$m.keras && [ -f "$src" ] || src=tests/fixtures/keras_ref/$m/model.keras
  ./kdcc "$src" --distribution "$(dirname "$src")/$dist" --batch-size "$batch" -w -o "$D/$m" ||
    { bad "$m: kdcc failed"; continue; }
  p="$D/$m"
  run8 "$p" predict --x "$p.x.npy" --out "$p.read.npy" || bad "$m: predict"
  run8 "$p" predict --x "$p.x.npy" --out "$p.kw.npy" --weights "$p.keras.weights.h5" ||
    bad "$m: predict --weights (Keras's file)"
  if [ -f "$p.bf16.weights.h5" ]; then
    run8 "$p" predict --x "$p.x.npy" --out "$p.bf16.npy" --weights "$p.bf16.weights.h5" ||
      bad "$m: predict --weights (Keras's file in bfloat16)"
  fi
  run8 "$p" predict --x "$p.x.npy" --out "$p.random.npy" --init random || bad "$m: predict --init random"
  run8 "$p" --synthetic 64 --epochs 1 --steps-per-epoch 3 --quiet --save-weights "$p.trained.$ext" ||
    bad "$m: train --save-weights"
  run8 "$p" predict --x "$p.x.npy" --out "$p.trained.npy" --weights "$p.trained.$ext" ||
    bad "$m: predict --weights (saved)"
  ls "$D" | grep -q '\.tmp\.' && bad "$m: a temporary file was left behind"
done

# Another model's weights: exit 1, the file and the layer named, nothing written.
mpirun -np 8 "$D/seed_mlp" --synthetic 32 --weights "$D/cnn.keras.weights.h5" \
  --save-weights "$D/never.weights.h5" >"$D/err.txt" 2>&1
rc=$?
[ $rc = 1 ] || bad "seed_mlp with cnn's weights: exit $rc, want 1"
grep -q "cnn.keras.weights.h5: layer 'd1' (layers/dense) has 2 variables in the file, but 1 in the model" \
  "$D/err.txt" || { cat "$D/err.txt"; bad "seed_mlp with cnn's weights: message"; }
mpirun -np 8 "$D/cnn" predict --x "$D/cnn.x.npy" --out "$D/never.npy" \
  --weights "$D/seed_mlp.trained.weights.h5" >"$D/err.txt" 2>&1
rc=$?
[ $rc = 1 ] || bad "cnn with seed_mlp's weights: exit $rc, want 1"
grep -q "seed_mlp.trained.weights.h5: no weights for layer 'conv2d' (Conv2D): the file has no group layers/conv2d; it holds layers/dense ('d1'), layers/dense_1 ('d2')" \
  "$D/err.txt" || { cat "$D/err.txt"; bad "cnn with seed_mlp's weights: message"; }
mpirun -np 8 "$D/cnn" --synthetic 32 --save-weights "$D/never.h5" >"$D/err.txt" 2>&1
rc=$?
[ $rc = 2 ] || bad "--save-weights never.h5: exit $rc, want 2"
grep -q "must end in .weights.h5 or .keras" "$D/err.txt" || { cat "$D/err.txt"; bad "--save-weights never.h5: message"; }
ls "$D" | grep -q never && bad "a failed run wrote a file: $(ls "$D" | grep never)"

"$PY" tests/keras_ref/check_weights.py check "$D" seed_mlp cnn nested nested_frozen adapted_norm ||
  fail=1

# A keras-hub preset saved in bfloat16 (its weights 2-byte, as most real
# presets): compiled as it is (its own bfloat16: bfloat16 variables, issue
# 23), or with --dtype-policy float32 or mixed_bfloat16 (float32 variables,
# as from_preset(..., dtype=...)), it predicts as keras-hub does on 2 ranks
# (Gemma's layout map, model=2).
if "$PY" -c 'import keras_hub' 2>/dev/null; then
  "$PY" tests/keras_ref/check_weights.py preset "$D" || exit 1
  pre=(--sequence-length 16 --batch-size 8 --distribution examples/gemma_lora/gemma.dist.json
       --mesh batch=1,model=2)
  for policy in float32 mixed_bfloat16 bfloat16; do
    as=(--dtype-policy $policy) && [ $policy = bfloat16 ] && as=() # the preset's own
    ./kdcc "$D/bf16_preset" "${pre[@]}" "${as[@]}" -o "$D/bf16_$policy" \
      2>"$D/err.txt" || { cat "$D/err.txt"; bad "bf16_preset --dtype-policy $policy: kdcc"; continue; }
    mpirun -np 2 "$D/bf16_$policy" predict --x "padding_mask=$D/bf16_preset.mask.npy" \
      --x "token_ids=$D/bf16_preset.x.npy" --out "$D/bf16_preset.$policy.npy" --quiet \
      >"$D/out.txt" 2>&1 || { cat "$D/out.txt"; bad "bf16_preset --dtype-policy $policy: predict"; }
  done
  "$PY" tests/keras_ref/check_weights.py check-preset "$D" || fail=1
else
  echo "keras_weights: SKIP the bfloat16 preset: no keras_hub in $PY"
fi
[ $fail = 0 ] && echo "keras_weights: ok"
exit $fail
