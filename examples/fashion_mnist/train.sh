#!/usr/bin/env bash
# Train a Fashion-MNIST example on its mesh (the (2,4) mesh; the ResNet: 4
# devices, data parallel) and evaluate it on the 10,000 test images.
#
#   examples/fashion_mnist/train.sh [mlp|cnn|vit|resnet] [options for the training program]
#
# Compiles examples/fashion_mnist/<model>.json with <model>.dist.json for a
# global batch of 100 (it divides both 60,000 and 10,000, so no sample is
# dropped), then runs it on one rank per device with the dataset the Debian package
# dataset-fashion-mnist installs (gzip'd IDX files, read as they are), pixels
# scaled by 1/255. Extra options go to the training program and override the
# defaults below (e.g. --epochs 3, --seed 7, --lr 0.0005). Prints the test
# accuracy and the wall time; the history is build/fashion_mnist/<model>.json.
#
# Environment: FASHION_MNIST=DIR (default /usr/share/datasets/fashion-mnist),
# NP (default the mesh's devices, 8 or 4; any other count is refused by the program).
set -euo pipefail
model=${1:-mlp}
[ $# -gt 0 ] && shift
case "$model" in
  mlp|cnn|vit) np=8 ;;&
  mlp) epochs=12 ;;
  cnn) epochs=14 ;;
  vit) epochs=5 ;;
  resnet) epochs=10 np=4 ;;
  *) echo "usage: $0 [mlp|cnn|vit|resnet] [training options]" >&2; exit 2 ;;
esac
D=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
         t10k-labels-idx1-ubyte.gz; do
  [ -f "$D/$f" ] || { echo "$0: $D/$f not found; install the dataset: apt-get install dataset-fashion-mnist (or make setup)" >&2; exit 1; }
done
source "$(dirname "$0")/../common.sh"
OUT=build/fashion_mnist
mkdir -p "$OUT"
EX=examples/fashion_mnist
./kdcc "$EX/$model.json" --distribution "$EX/$model.dist.json" --batch-size 100 --report \
  -o "$OUT/$model"

start=$(date +%s)
mpirun --oversubscribe -np "${NP:-$np}" "$OUT/$model" \
  --x "$D/train-images-idx3-ubyte.gz" --y "$D/train-labels-idx1-ubyte.gz" \
  --test-x "$D/t10k-images-idx3-ubyte.gz" --test-y "$D/t10k-labels-idx1-ubyte.gz" \
  --scale 1/255 --epochs "$epochs" --history "$OUT/$model.json" "$@"
end=$(date +%s)
python3 - "$OUT/$model.json" "$model" "$((end - start))" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))
e = h["evaluate"]
print("%s: test accuracy %.4f, test loss %.4f after %d epochs; %d s (compile excluded)"
      % (sys.argv[2], e["accuracy"], e["loss"], len(h["loss"]), int(sys.argv[3])))
PY
