#!/usr/bin/env bash
# On a GPU: the CUDA program trains like the CPU program. Every seed model
# compiled for one device both ways, trained on the same synthetic data
# (same seed: same initial weights, same batches, same dropout masks),
# with a validation split; every loss in the two --history files (per
# epoch, per step, validation, evaluate) equal within 1e-4 (relative to
# max(1, |loss|)), in float32. Then --save-weights / --checkpoint-dir on
# the GPU: the host copy of the weights must be the trained one, so a
# program resumed from the GPU's checkpoint on the CPU continues the same
# losses. Skips (exit 0) without nvcc or without a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}
[ -n "$NVCC" ] || { echo "gpu_losses: skipping: nvcc not found"; exit 0; }
command -v nvidia-smi >/dev/null 2>&1 || { echo "gpu_losses: skipping: no GPU (nvidia-smi not found)"; exit 0; }
nvidia-smi -L 2>/dev/null | grep -q "^GPU" || { echo "gpu_losses: skipping: no GPU (nvidia-smi lists none)"; exit 0; }
export PATH="$(dirname "$NVCC"):$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make -s -j"$(nproc)" cuda NVCC="$NVCC"
out=build/tests/gpu_losses
mkdir -p $out

# compare REF OTHER: the losses of two --history files within 1e-4.
compare() {
  python3 - "$1" "$2" <<'PY'
import json, sys
ref, got = (json.load(open(p)) for p in sys.argv[1:3])
def losses(h):
    out = {}
    for k in ("loss", "step_loss", "val_loss"):
        for i, v in enumerate(h.get(k, [])):
            out[f"{k}[{i}]"] = v
    out["evaluate.loss"] = h["evaluate"]["loss"]
    return out
a, b = losses(ref), losses(got)
if set(a) != set(b):
    print(f"  {sys.argv[2]}: keys differ: {sorted(set(a) ^ set(b))}")
    sys.exit(1)
worst, where = 0.0, None
for k in a:
    if a[k] is None or b[k] is None:
        print(f"  {k}: {b[k]!r} vs {a[k]!r}")
        sys.exit(1)
    e = abs(a[k] - b[k]) / max(1.0, abs(a[k]))
    if e > worst: worst, where = e, k
acc = ""
if "accuracy" in ref:
    d = max(abs(x - y) for x, y in zip(ref["accuracy"], got["accuracy"]))
    acc = f", accuracy differs by at most {d:.4f}"
ok = worst <= 1e-4
print(f"  {sys.argv[2]}: worst loss difference {worst:.2e}" + (f" at {where}" if where else "")
      + f"{acc} ({'ok' if ok else 'DIFFERS'})")
if not ok:
    print(f"    {where}: cuda {b[where]!r} vs cpu {a[where]!r}")
sys.exit(0 if ok else 1)
PY
}

fail=0
run_args="--synthetic 96 --epochs 2 --batch-size 16 --validation-split 0.25 --seed 7 --quiet"
# cpu_vs_cuda NAME MODEL SPEC
cpu_vs_cuda() {
  local m=$1
  echo "gpu_losses: $m, one device, CPU vs CUDA (fp32)"
  spec="$2 --distribution $3 --mesh data=1,model=1 --batch-size 16 -w"
  ./kdcc $spec -o $out/${m}_cpu
  ./kdcc $spec --target cuda -o $out/${m}_cuda
  timeout 600 $out/${m}_cpu $run_args --history $out/${m}_cpu.json
  timeout 600 $out/${m}_cuda $run_args --history $out/${m}_cuda.json
  compare $out/${m}_cpu.json $out/${m}_cuda.json || fail=1
}
for m in seed_mlp func_branches cnn megatron; do
  cpu_vs_cuda $m models/$m.json models/$m.dist.json
done
# issue 11: every loss kdcc knows
for m in losses_reg losses_cls; do
  cpu_vs_cuda $m tests/gradcheck/$m.json tests/good/losses.dist.json
done

# The host copy of the weights follows the device: a checkpoint taken by the
# CUDA program after epoch 1, resumed by the CPU program for epoch 2, gives
# the losses of the CPU program trained straight through.
m=cnn
echo "gpu_losses: $m, checkpoint on the GPU, resumed on the CPU"
rm -rf $out/ckpt
ck_args="--synthetic 96 --batch-size 16 --seed 7 --quiet"
timeout 600 $out/${m}_cpu $ck_args --epochs 2 --history $out/straight.json
timeout 600 $out/${m}_cuda $ck_args --epochs 1 --checkpoint-dir $out/ckpt
timeout 600 $out/${m}_cpu $ck_args --epochs 2 --checkpoint-dir $out/ckpt --resume \
  --history $out/resumed.json
compare $out/straight.json $out/resumed.json || fail=1
exit $fail
