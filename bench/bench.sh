#!/usr/bin/env bash
# make bench: kdcc vs PyTorch vs Keras 3 on JAX, one CPU process, float32.
# Creates (once) a venv under build/bench-venv with torch, jax and keras from
# PyPI, builds kdcc and the runtime, then runs bench/bench.py, which prints
# the table and writes bench/RESULTS.md. Safe to run again: an existing venv
# that imports all three is reused. Extra arguments go to bench.py
# (e.g. --threads 1 --seconds 1.5 --no-perf).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build/bench-venv
PY=$VENV/bin/python

if ! { [ -x "$PY" ] && KERAS_BACKEND=jax "$PY" -c 'import torch, jax, keras, numpy' 2>/dev/null; }; then
  echo "bench: setting up $VENV (torch, jax, keras; a few GB, the first time only)" >&2
  mkdir -p build
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q torch jax keras numpy
  KERAS_BACKEND=jax "$PY" -c 'import torch, jax, keras, numpy' >/dev/null
fi
# keras_hub for the GPT's PositionEmbedding, without its TensorFlow dependency
# (tests/keras_ref/requirements-nodeps.txt), and what it needs to import.
if ! KERAS_BACKEND=jax "$PY" -c 'import keras_hub' 2>/dev/null; then
  "$PY" -m pip install -q --no-deps -r tests/keras_ref/requirements-nodeps.txt
  "$PY" -m pip install -q regex tokenizers sentencepiece kagglehub
fi

make -s kdcc build/libkdrt.a build/gemm_time
exec "$PY" bench/bench.py "$@"
