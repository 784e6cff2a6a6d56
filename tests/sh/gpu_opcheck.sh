#!/usr/bin/env bash
# On a GPU: every CUDA kernel against the CPU runtime's by normalised error
# (`./train opcheck --repeat 10`: ten rounds of fresh inputs, outputs poisoned;
# runtime/cuda/opcheck.cu), at each --precision; then
# every bundled model's one-device CUDA program through `./train gradcheck`
# (its gradients against finite differences, as tests/sh/gradcheck.sh does
# for the CPU programs). Skips (exit 0) without nvcc or without a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}
[ -n "$NVCC" ] || { echo "gpu_opcheck: skipping: nvcc not found"; exit 0; }
command -v nvidia-smi >/dev/null 2>&1 || { echo "gpu_opcheck: skipping: no GPU (nvidia-smi not found)"; exit 0; }
nvidia-smi -L 2>/dev/null | grep -q "^GPU" || { echo "gpu_opcheck: skipping: no GPU (nvidia-smi lists none)"; exit 0; }
export PATH="$(dirname "$NVCC"):$PATH"
make -s -j"$(nproc)" cuda NVCC="$NVCC"
out=build/tests/gpu_opcheck
mkdir -p $out
fail=0
for prec in fp32 tf32 bf16; do
  ./kdcc models/cnn.json --distribution models/cnn.dist.json --mesh data=1,model=1 --batch-size 16 \
    --target cuda --precision $prec -w -o $out/cnn_$prec
  echo "gpu_opcheck: --precision $prec"
  if ! timeout 300 $out/cnn_$prec opcheck --repeat 10 >$out/opcheck_$prec.txt 2>&1; then
    grep -v " ok$" $out/opcheck_$prec.txt || true
    echo "FAIL: opcheck at --precision $prec (all of it: $out/opcheck_$prec.txt)"
    fail=1
  else
    tail -1 $out/opcheck_$prec.txt
  fi
done
for m in seed_mlp func_branches cnn megatron; do
  exe=$out/gc_$m
  ./kdcc models/$m.json --distribution models/$m.dist.json --mesh data=1,model=1 --batch-size 16 \
    --target cuda -w -o $exe
  if timeout 600 $exe gradcheck --points 3 >$exe.txt 2>&1; then
    echo "gpu_opcheck: gradcheck $m: $(tail -1 $exe.txt)"
  else
    cat $exe.txt
    echo "FAIL: gradcheck of the CUDA program for $m"
    fail=1
  fi
done
exit $fail
