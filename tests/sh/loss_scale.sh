#!/usr/bin/env bash
# loss_scale.sh (issue 23): mixed_float16's loss scaling (Keras's
# LossScaleOptimizer, which compile wraps around a mixed_float16 model's
# optimizer) on whole programs, from the keras_ref case mixed_f16_mlp (its
# model, initial weights and data: the third batch's labels are 1000 times
# the others', so that step's float16 gradients overflow, each epoch):
#  1. mesh equivalence: one device, (2,4), (8,1), (1,8) and DataParallel (8,)
#     skip the same steps (step_loss_scale and the optimizer's iterations
#     equal) and agree within 1e-4;
#  2. checkpoints: a run that stops after its first epoch (its checkpoint
#     after step 3, past the first skipped step: scale 2^14, 2 iterations)
#     and is resumed gives the uninterrupted run's history bit for bit,
#     scales and iterations included; the same checkpoint resumed by the
#     model's float32 program (--dtype-policy float32) is an error;
#  3. a step whose loss itself is not finite (labels of 1e30: inf in
#     float32) is a skipped step, not a divergence: training goes on, as
#     Keras's does, and the loss scale halves; the float32 program stops.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin loss_scale.sh
F=tests/fixtures/keras_ref/mixed_f16_mlp
DATA=(--x $F/x.npy --y $F/y.npy --batch-size 16 --no-shuffle --weights $F/model.keras --quiet)
run() { # NP EXE ARGS...: output in $T/out, status in $rc
  local np=$1 exe=$2
  shift 2
  timeout 120 mpirun -np "$np" "$T/$exe" "$@" >"$T/out" 2>&1
  rc=$?
}
compile() { # NAME SPEC MESH [kdcc options]
  local name=$1 spec=$2 mesh=$3
  shift 3
  ./kdcc $F/model.keras --distribution "$F/$spec" --mesh "$mesh" --batch-size 16 -w \
    -o "$T/$name" "$@" || exit 1
}

# ---- 1. mesh equivalence
hists=()
for mesh in data=1,model=1 data=2,model=4 data=8,model=1 data=1,model=8 batch=8; do
  spec=mixed_f16_mlp.dist.json && [ $mesh = batch=8 ] && spec=mixed_f16_mlp_dp.dist.json
  compile "m_$mesh" $spec $mesh
  np=$(($(echo "$mesh" | tr -dc '0-9,' | tr ',' '*')))
  name="mesh $mesh" && run $np "m_$mesh" "${DATA[@]}" --epochs 2 --history "$T/h_$mesh.json"
  expect 0
  hists+=("$T/h_$mesh.json")
done
python3 - "${hists[0]}" <<'EOF' || fail "the one-device run did not skip steps 3 and 7"
import json, sys
h = json.load(open(sys.argv[1]))
assert h["step_loss_scale"] == [2.0 ** k for k in (15, 15, 14, 14, 14, 14, 13, 13)], h
assert h["iterations"] == 6, h
EOF
if python3 tests/compare_history.py 1e-4 "${hists[@]}"; then
  echo "  ok: one device and 4 meshes: the same skipped steps and scales, losses within 1e-4"
else fail "mesh equivalence"; fi

# ---- 2. checkpoints
compile t22 mixed_f16_mlp.dist.json data=2,model=2
compile f32 mixed_f16_mlp.dist.json data=2,model=2 --dtype-policy float32
name="straight" && run 4 t22 "${DATA[@]}" --epochs 2 --history "$T/straight.json"
expect 0
D=$T/ck
name="first epoch" && run 4 t22 "${DATA[@]}" --epochs 1 --checkpoint-dir "$D" --checkpoint-every 3
expect 0
grep -q "^lossscale 0x1p+14 count 0 iterations 2$" "$D/ckpt-3/MANIFEST" ||
  fail "ckpt-3's MANIFEST lacks scale 2^14, count 0, 2 iterations: $(grep -A2 lossscale "$D/ckpt-3/MANIFEST")"
cp -r "$D" "$T/ck2"
name="resume" && run 4 t22 "${DATA[@]}" --epochs 2 --checkpoint-dir "$D" --resume \
  --history "$T/resumed.json"
expect 0
if cmp -s "$T/straight.json" "$T/resumed.json"; then
  echo "  ok: resumed from ckpt-3 (scale 2^14): history bitwise equal, scales and iterations too"
else fail "resume: the history differs"; diff "$T/straight.json" "$T/resumed.json"; fi
name="resume without a loss scale" &&
  run 4 f32 "${DATA[@]}" --epochs 2 --checkpoint-dir "$T/ck2" --resume
expect 1 "ckpt-3: it was trained with a loss scale (Keras's LossScaleOptimizer), this program trains without one; resume with the program that wrote it"

# ---- 3. a loss that is not finite
python3 - $F/y.npy "$T/y_inf.npy" <<'EOF'
import sys
sys.path.insert(0, "tests/keras_ref")
import struct
raw = open(sys.argv[1], "rb").read()
hlen = struct.unpack("<H", raw[8:10])[0]
head, body = raw[:10 + hlen], bytearray(raw[10 + hlen:])
for i in range(32 * 10, 48 * 10):  # the third batch's labels (float32, 10 a row)
    body[4 * i:4 * i + 4] = struct.pack("<f", 1e30)
open(sys.argv[2], "wb").write(head + bytes(body))
EOF
INF=(--x $F/x.npy --y "$T/y_inf.npy" --batch-size 16 --no-shuffle --weights $F/model.keras)
name="an infinite loss" && run 4 t22 "${INF[@]}" --epochs 1 --history "$T/inf.json"
expect 0
python3 - "$T/inf.json" <<'EOF' || fail "an infinite loss: not a skipped step"
import json, sys
h = json.load(open(sys.argv[1]))
assert h["step_loss"][2] is None and None not in h["step_loss"][3:], h
assert h["step_loss_scale"] == [2.0 ** 15, 2.0 ** 15, 2.0 ** 14, 2.0 ** 14], h
assert h["iterations"] == 3, h
EOF
name="an infinite loss, float32" && run 4 f32 "${INF[@]}" --epochs 1
expect 1 "loss is inf at epoch 1, step 3"
finish
