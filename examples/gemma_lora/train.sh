#!/usr/bin/env bash
# Fine-tune a keras-hub Gemma with LoRA on a text, then let it write.
#
#   examples/gemma_lora/train.sh [TEXT]
#
# preset/ is a small random Gemma as keras-hub saves a preset (make_preset.py
# made it). TEXT (default: the poems and songs of Debian's `fortunes` package)
# becomes windows of 64 bytes (examples/char_gpt/prepare.py: ids = the text's
# distinct bytes). Then, on the mesh MESH (default batch=2,model=2: 4 ranks,
# Gemma's own layout map, gemma.dist.json):
#   1. kdcc compiles the preset directory and trains it whole (3 epochs):
#      build/gemma_lora/base.weights.h5, in the preset's own layout;
#   2. kdcc compiles it again with --lora-rank 4, as backbone.enable_lora(4):
#      everything frozen but A and B of every query and value projection, which
#      train 3 epochs from the base weights: tuned.lora.h5 (keras-hub's
#      save_lora_weights file) and tuned.weights.h5 (the kernels merged);
#   3. `./train generate` continues PROMPT (default "The ") by 300 bytes.
set -euo pipefail
source "$(dirname "$0")/../common.sh"
TEXT=$(example_text "${1:-}")
[ $# -gt 0 ] && shift
MESH=${MESH:-batch=2,model=2}
NP=${NP:-$(ranks_of "$MESH")}
OUT=build/gemma_lora
EX=examples/gemma_lora
mkdir -p "$OUT"
python3 examples/char_gpt/prepare.py "$TEXT" "$OUT"
python3 - "$OUT" <<'PY'
import sys, struct  # padding_mask.npy: ones, the shape of x.npy
d = sys.argv[1]
raw = open(d + "/x.npy", "rb").read()
hl = struct.unpack_from("<H", raw, 8)[0]
open(d + "/padding_mask.npy", "wb").write(raw[:10 + hl] + struct.pack("<i", 1) * ((len(raw) - 10 - hl) // 4))
PY
data=(--x "$OUT/padding_mask.npy" --x "$OUT/x.npy" --y "$OUT/y.npy" --validation-split 0.1)
kdcc_args=(--distribution "$EX/gemma.dist.json" --mesh "$MESH" --sequence-length 64 --batch-size 32)

echo "== 1. the preset trained whole"
./kdcc "$EX/preset" "${kdcc_args[@]}" -w -o "$OUT/train"
mpirun -np "$NP" "$OUT/train" "${data[@]}" --epochs 3 --lr 0.003 \
  --history "$OUT/base.history.json" --save-weights "$OUT/base.weights.h5"

echo "== 2. LoRA, rank 4, on the query and value projections"
./kdcc "$EX/preset" "${kdcc_args[@]}" --lora-rank 4 -w -o "$OUT/train_lora"
mpirun -np "$NP" "$OUT/train_lora" "${data[@]}" --weights "$OUT/base.weights.h5" --epochs 3 \
  --lr 0.003 --history "$OUT/lora.history.json" --save-lora-weights "$OUT/tuned.lora.h5" \
  --save-weights "$OUT/tuned.weights.h5"

echo "== 3. generate"
mpirun -np "$NP" "$OUT/train" generate --weights "$OUT/tuned.weights.h5" --vocab "$TEXT" \
  --prompt "${PROMPT:-The }" --tokens 300 --temperature 0.8 --quiet
