#!/usr/bin/env bash
# Train the character-level GPT on a text, then let it write.
#
#   examples/char_gpt/train.sh [TEXT] [options for the training program]
#
# TEXT: any ASCII text file (default: the poems and songs of Debian's
# `fortunes` package, /usr/share/games/fortunes/songs-poems; apt-get install
# fortunes). prepare.py cuts it into windows of 64 characters; kdcc compiles
# model.json (4 decoder blocks, Megatron layouts: model.dist.json) for a
# global batch of 32 on the mesh MESH (default data=1,model=2, for a
# 2-core machine; data=2,model=4 is the spec's own, NP=8), it trains with 10%
# held out for validation, saves the weights, and `./train generate`
# continues PROMPT (default "The ") by 400 characters at temperature 0.8.
# Extra options go to the training program (e.g. --epochs 5).
# Outputs: build/char_gpt/ (the program, history.json, weights.weights.h5).
set -euo pipefail
source "$(dirname "$0")/../common.sh"
TEXT=
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then TEXT=$1; shift; fi
TEXT=$(example_text "$TEXT")
MESH=${MESH:-data=1,model=2}
NP=${NP:-$(ranks_of "$MESH")}
OUT=build/char_gpt
EX=examples/char_gpt
mkdir -p "$OUT"
python3 "$EX/prepare.py" "$TEXT" "$OUT"
./kdcc "$EX/model.json" --distribution "$EX/model.dist.json" --mesh "$MESH" --batch-size 32 \
  -o "$OUT/train"
mpirun -np "$NP" "$OUT/train" --x "$OUT/x.npy" --y "$OUT/y.npy" --validation-split 0.1 \
  --epochs 3 --history "$OUT/history.json" --save-weights "$OUT/weights.weights.h5" "$@"
echo
mpirun -np "$NP" "$OUT/train" generate --weights "$OUT/weights.weights.h5" --vocab "$TEXT" \
  --prompt "${PROMPT:-The }" --tokens 400 --temperature 0.8 --quiet
