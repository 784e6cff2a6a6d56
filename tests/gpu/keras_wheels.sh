#!/usr/bin/env bash
# The wheels device.sh's keras phase installs on the GPU machine (it has
# JAX, numpy, absl and rich but no package registry): keras (the version
# the reference cases use), namex and optree, for its Python 3.12, into
# DIR/whl (default .gpu/whl; about 3 MB). Run here, before the device call:
#     bash tests/gpu/keras_wheels.sh .gpu
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.gpu}/whl
# the tests' Keras (make test-keras makes build/keras-venv), else 3.15.1
py=build/keras-venv/bin/python
[ -x "$py" ] || py=python3
ver=$(KERAS_BACKEND=jax $py -c 'import keras; print(keras.__version__)' 2>/dev/null || echo 3.15.1)
pip="$py -m pip"
mkdir -p "$dir"
$pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 "keras==$ver" namex optree -d "$dir"
ls "$dir"
