#!/usr/bin/env bash
# kdcc against real keras-hub (issue 24): the cases in tests/fixtures/keras_hub/
# (tests/keras_ref/hub_models.py: tiny GPT-2, Llama and Gemma CausalLMs,
# keras-hub 0.32 on JAX, 8 virtual devices, DataParallel and their layout maps
# on (2,4)) are checked as keras_ref.sh checks Keras's: compiled from the task's
# .keras, trained from its weights, every step's loss and every final weight
# within 1e-4. Then each case's preset directory (its initial weights, no
# compile settings: keras-hub's defaults, so --lr gives the case's rate) must
# give the same step losses, and what kdcc refuses of keras-hub is an error.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fix=tests/fixtures/keras_hub
out=build/tests/keras_hub
CASES=${KERAS_HUB_CASES:-hub_gpt2 hub_llama hub_gemma}
rm -rf "$out" && mkdir -p "$out/ref"
for c in $CASES; do cp -r "$fix/$c" "$out/ref/"; done
KERAS_REF_DIR=$out/ref bash tests/sh/keras_ref.sh

# The preset directory: the same numbers from config.json, task.json and
# model.weights.h5 (keras-hub's own layout, without the task's group).
for c in $CASES; do
  d=$fix/$c
  ./kdcc "$d/preset" --distribution "$d/$c.dist.json" --batch-size 16 --sequence-length 16 -o "$out/$c.preset" \
    2>"$out/$c.preset.log"
  grep -q "compiled as keras-hub's" "$out/$c.preset.log" ||
    { echo "keras_hub: $c: the preset's default compile settings were not announced"; exit 1; }
  mpirun -np 8 --oversubscribe "$out/$c.preset" --x "$d/padding_mask.npy" --x "$d/token_ids.npy" \
    --y "$d/y.npy" --epochs 2 --batch-size 16 --no-shuffle --lr 0.001 \
    --history "$out/$c.preset.json" --save-weights "$out/$c.preset.weights.h5" --quiet
  python3 - "$d/$c.json" "$out/$c.preset.json" <<'EOF'
import json, sys
ref, got = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
want, have = ref["step_loss"], got["step_loss"]
assert len(want) == len(have), (len(want), len(have))
worst = max(abs(a - b) / abs(a) for a, b in zip(want, have))
print(f"  {ref['case']} from its preset directory: step losses within {worst:.2e} of keras-hub's")
sys.exit(0 if worst <= 1e-4 else 1)
EOF
done

# What kdcc refuses, with the place and the reason.
d=$fix/hub_gpt2
expect_error() { # file, message part
  if ./kdcc "$1" -o "$out/never" 2>"$out/err.txt"; then echo "keras_hub: $1 compiled"; exit 1; fi
  grep -qF "$2" "$out/err.txt" || { echo "keras_hub: $1: expected '$2', got:"; cat "$out/err.txt"; exit 1; }
}
expect_error "$d/preset/config.json" "GPT2Backbone is a backbone alone"
sed 's/GPT2CausalLM/GPT2Seq2SeqLM/' "$d/preset/task.json" >"$out/other_task.json"
expect_error "$out/other_task.json" "keras-hub model 'GPT2Seq2SeqLM' is not supported"
python3 - "$d/preset/task.json" "$out/no_layers.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
del t["config"]["backbone"]["config"]["num_layers"]
json.dump(t, open(sys.argv[2], "w"), indent=1)
EOF
expect_error "$out/no_layers.json" "GPT2Backbone: the config has no 'num_layers'"
mkdir -p "$out/empty_preset"
expect_error "$out/empty_preset" "it has no config.json"
echo "keras_hub: ok"
