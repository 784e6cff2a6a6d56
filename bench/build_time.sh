#!/usr/bin/env bash
# How kdcc's builds grow with the model: deep MLPs (bench/deep_mlp.py, no
# Keras needed) and deep GPT-style decoders (bench/deep_gpt.py, needs keras
# and keras_hub: PY=python with them, default build/keras-venv's or
# /tmp/kvenv's when present, else the GPT rows are skipped). For each model:
# kdcc's own time to write program.c (-S), the whole build (-o: C compiler
# included), and program.c's size. The issue's target: under 30 s for a
# 1000-layer MLP and a 48-block transformer.
#
#   bash bench/build_time.sh                 # the table, on stdout
set -euo pipefail
cd "$(dirname "$0")/.."
make -s kdcc build/libkdrt.a
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
PY=${PY:-}
for p in build/keras-venv/bin/python /tmp/kvenv/bin/python; do
  [ -z "$PY" ] && [ -x "$p" ] && KERAS_BACKEND=jax "$p" -c 'import keras, keras_hub' 2>/dev/null && PY=$p
done

secs() { # run "$@", print the wall seconds it took
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }'
}

row() { # name model.json [kdcc flags...]
  local name=$1 json=$2
  shift 2
  local emit build size
  emit=$(secs ./kdcc "$json" "$@" -S "$W/$name.src")
  build=$(secs ./kdcc "$json" "$@" -o "$W/$name")
  size=$(stat -c %s "$W/$name.src/program.c")
  printf '| %s | %s s | %s s | %s KB |\n' "$name" "$emit" "$build" $((size / 1024))
}

echo "| model | kdcc -S (program.c) | kdcc -o (whole build) | program.c |"
echo "|---|---|---|---|"
for L in 100 1000; do
  python3 bench/deep_mlp.py --layers "$L" > "$W/mlp$L.json"
  row "MLP, $L layers" "$W/mlp$L.json"
done
if [ -n "$PY" ]; then
  for N in 12 48; do
    "$PY" bench/deep_gpt.py --blocks "$N" > "$W/gpt$N.json" 2>/dev/null
    row "GPT, $N blocks" "$W/gpt$N.json" --batch-size 16
  done
else
  echo "build_time: no Python with keras and keras_hub (set PY=): GPT rows skipped" >&2
fi
