#!/usr/bin/env bash
# opt16.sh (issue 23): the runtime's updates of variables kept in 16 bits
# (runtime/kdrt_optim.h's *16: SGD, Adam with amsgrad, RMSprop centered
# with momentum, Adagrad, Adamax, Nadam, Lion; weight decay; clipnorm,
# global_clipnorm, clipvalue) against Keras 3.15's own optimizers on a
# bfloat16 and a float16 keras.Variable (tests/keras_ref/opt16_ref.py),
# three steps from the same weights and gradients: tests/opt16_check.c
# requires Keras's eager run bit for bit, weights and slots, and reports
# how many values its jit run differs in (bfloat16: none; float16: XLA keeps
# fused chains in float32); the same for the constraints (MaxNorm, MinMaxNorm,
# NonNeg, UnitNorm) and an L1L2 penalty on a 16-bit kernel, and an activity
# regularizer's penalty under each 16-bit policy (Keras's eager values bit
# for bit; the constraints' jit values reported: XLA keeps bfloat16's squares
# of MaxNorm and UnitNorm in float32). Skipped without Keras (KDCC_PYTHON, else
# build/keras-venv, which keras_weights.sh makes).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin opt16.sh
mkdir -p build/tests
mpicc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -g -Iruntime -o build/tests/opt16_check \
  tests/opt16_check.c build/libkdrt.a $(make -s rt-libs) || exit 1
PY=${KDCC_PYTHON:-build/keras-venv/bin/python}
export KERAS_BACKEND=jax
if ! "$PY" -c 'import keras, jax, numpy' >/dev/null 2>&1; then
  echo "opt16.sh: SKIPPED: no Python with keras and jax (KDCC_PYTHON)"
  exit 0
fi
"$PY" -W ignore tests/keras_ref/opt16_ref.py "$T/ref" --jit >"$T/out" 2>&1 ||
  { cat "$T/out"; fail "opt16_ref.py"; finish; }
build/tests/opt16_check "$T/ref" || fail "the 16-bit updates differ from Keras's"
finish
