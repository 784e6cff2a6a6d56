#!/usr/bin/env bash
# pure16.sh (issue 23): a model under the bfloat16 (float16) policy keeps its
# variables in that type, whole programs on one device (keras_ref.sh's
# bf16_* and f16_* cases compare the training with Keras's on meshes of 8):
#  1. a run resumed from a checkpoint is bitwise the run straight through
#     (history and the weights file), the optimizer's bfloat16 slots too
#     (Adam's, and Nadam's with its bfloat16 running product);
#     every 16-bit case on one device within its tolerances of Keras's
#     run on (2, 4) (mesh equivalence, compare_ref.py);
#  2. the weights file is Keras's for bfloat16 variables (2-byte opaque
#     datasets, attribute dtype "bfloat16"), every value of the run's a
#     bfloat16 value, and Keras loads it into the bfloat16 model: the same
#     values, and its evaluate loss within 1e-2 of kdcc's (both compute in
#     bfloat16, with their own rounding points);
#  3. kdrt reads the file back (its checksum over the 2-byte data);
#  4. --dtype-policy bfloat16 on a model saved in float32 keeps its
#     variables in bfloat16 too;
#  5. float16's file (f16_mlp's run): IEEE half datasets, Keras loads them;
#  6. their CUDA programs build (where nvcc is; not run).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin pure16.sh
export KERAS_BACKEND=jax JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3
ok() { echo "  ok: $*"; }

F=tests/fixtures/keras_ref/bf16_adam_mlp
./kdcc "$F/model.keras" --batch-size 16 -w -o "$T/p" || exit 1
ARGS=(--x "$F/x.npy" --y "$F/y.npy" --epochs 2 --batch-size 16 --no-shuffle
      --weights "$F/model.keras")

# 1. straight through, a checkpoint every 3 steps; then again from ckpt-3
"$T/p" "${ARGS[@]}" --checkpoint-dir "$T/ck" --checkpoint-every 3 --history "$T/h1.json" \
  --save-weights "$T/w1.weights.h5" --quiet >"$T/out" 2>&1 || { cat "$T/out"; exit 1; }
rm -rf "$T/ck/ckpt-6" && echo ckpt-3 >"$T/ck/latest"
"$T/p" "${ARGS[@]}" --checkpoint-dir "$T/ck" --resume --history "$T/h2.json" \
  --save-weights "$T/w2.weights.h5" >"$T/out" 2>&1 || { cat "$T/out"; exit 1; }
grep -q "resuming from .*ckpt-3" "$T/out" || fail "resume: not from ckpt-3: $(cat "$T/out")"
if cmp -s "$T/h1.json" "$T/h2.json"; then ok "resumed from step 3: history bitwise equal"
else fail "resumed from step 3: the history differs"; diff "$T/h1.json" "$T/h2.json"; fi
# the same for Nadam, whose running product (bfloat16, kdrt_nadam_product16) a
# resumed run computes again up to its step
N=tests/fixtures/keras_ref/bf16_nadam_mlp
./kdcc "$N/model.keras" --batch-size 16 -w -o "$T/n" || exit 1
NARGS=(--x "$N/x.npy" --y "$N/y.npy" --epochs 2 --batch-size 16 --no-shuffle
       --weights "$N/model.keras" --checkpoint-dir "$T/nck")
"$T/n" "${NARGS[@]}" --checkpoint-every 3 --history "$T/n1.json" --quiet >"$T/out" 2>&1 ||
  { cat "$T/out"; exit 1; }
rm -rf "$T/nck/ckpt-6" && echo ckpt-3 >"$T/nck/latest"
"$T/n" "${NARGS[@]}" --resume --history "$T/n2.json" >"$T/out" 2>&1 || { cat "$T/out"; exit 1; }
if cmp -s "$T/n1.json" "$T/n2.json"; then ok "bf16_nadam_mlp resumed from step 3: history bitwise equal"
else fail "bf16_nadam_mlp resumed from step 3: the history differs"; fi

# mesh equivalence: each 16-bit keras_ref case on one device, against Keras's
# run on its (2, 4) mesh, within the case's tolerances (compare_ref.py)
for c in bf16_mlp bf16_cnn bf16_bn_cnn bf16_gpt f16_mlp bf16_nadam_mlp bf16_adamax_reg; do
  G=tests/fixtures/keras_ref/$c
  ./kdcc "$G/model.keras" --batch-size 16 -w -o "$T/$c" || exit 1
  "$T/$c" --x "$G/x.npy" --y "$G/y.npy" --epochs 2 --batch-size 16 --no-shuffle \
    --weights "$G/model.keras" --history "$T/$c.json" --save-weights "$T/$c.weights.h5" \
    --quiet >"$T/out" 2>&1 || { fail "$c on one device: $(cat "$T/out")"; continue; }
  python3 tests/keras_ref/compare_ref.py 1e-4 "$G/$c.json" "$T/$c.json" "$T/$c.weights.h5" |
    sed "s/^  $c:/  ok: $c on one device against Keras on (2, 4):/" || fail "$c on one device"
done
python3 tests/keras_ref/compare_ref.py 1e-4 "$F/bf16_adam_mlp.json" "$T/h1.json" \
  "$T/w1.weights.h5" | sed "s/^  bf16_adam_mlp:/  ok: bf16_adam_mlp on one device:/" ||
  fail "bf16_adam_mlp on one device"

# 2. the file, read by the standard library (tests/keras_ref/h5lite.py), then by Keras
python3 - "$T/w1.weights.h5" "$T/w2.weights.h5" <<'EOF' || fail "the weights files"
import struct, sys
sys.path.insert(0, "tests/keras_ref")
import h5lite
a, b = h5lite.datasets(sys.argv[1]), h5lite.datasets(sys.argv[2])
layers = [k for k in a if k.startswith("layers/")]
assert len(layers) == 6, layers
for k in layers:
    assert a[k] == b[k], f"{k}: the resumed run's differs"
    for x in a[k][1]:  # every value a bfloat16's: its float32 bits' lower half zero
        assert struct.unpack("<I", struct.pack("<f", x))[0] & 0xffff == 0, (k, x)
raw = open(sys.argv[1], "rb").read()
assert raw.count(b"bfloat16") >= 6, "the dtype attributes"
print("  ok: 6 bfloat16 datasets, equal after the resume, every value a bfloat16's")
EOF
has_keras() { "$1" -c 'import keras, jax, h5py, numpy' >/dev/null 2>&1; }
PY=${KDCC_PYTHON:-build/keras-venv/bin/python} # keras_weights.sh makes it
if has_keras "$PY"; then
  "$PY" -W ignore - "$F/model.keras" "$T/w1.weights.h5" "$T/h1.json" "$F" <<'EOF' || fail "Keras loads kdcc's file"
import json, sys, h5py, numpy as np, keras
model = keras.saving.load_model(sys.argv[1])
assert all(v.dtype == "bfloat16" for v in model.weights), [v.dtype for v in model.weights]
model.load_weights(sys.argv[2])
dense = [layer for layer in model.layers if layer.weights]  # the file's dense, dense_1, dense_2
with h5py.File(sys.argv[2]) as f:
    for k, layer in enumerate(dense):
        for i, v in enumerate(layer.weights):
            ds = f[f"layers/dense{'_%d' % k if k else ''}/vars/{i}"]
            assert ds.attrs["dtype"] == "bfloat16" and ds.dtype.itemsize == 2, ds
            assert np.array_equal(np.array(ds).view(np.uint16),
                                  np.asarray(v.numpy()).view(np.uint16)), v.path
x, y = np.load(sys.argv[4] + "/x.npy"), np.load(sys.argv[4] + "/y.npy")
keras_loss = model.evaluate(x, y, batch_size=16, verbose=0)
kdcc_loss = json.load(open(sys.argv[3]))["evaluate"]["loss"]
assert abs(keras_loss - kdcc_loss) <= 1e-2 * abs(keras_loss), (keras_loss, kdcc_loss)
print(f"  ok: Keras loads it into its bfloat16 model, the same values; evaluate {keras_loss:.6f}, "
      f"kdcc's {kdcc_loss:.6f}")
EOF
else
  echo "pure16.sh: SKIP Keras loading kdcc's file: no keras in $PY"
fi

# --report says which variables are 16-bit, and that they are kept in 2 bytes
# (issue 23's var16; KDCC_VAR16=0: in float32 buffers)
./kdcc "$F/model.keras" --batch-size 16 --report -S "$T/r" >"$T/out" 2>&1
[ "$(grep -c '^  [a-z0-9_/]* .*  bfloat16$' "$T/out")" = 6 ] &&
  grep -q "kept in its type's 2 bytes" "$T/out" &&
  KDCC_VAR16=0 ./kdcc "$F/model.keras" --batch-size 16 --report 2>&1 | grep -q "float32 buffers" &&
  ok "--report: 6 bfloat16 variables" || fail "--report: $(cat "$T/out")"

# 3. kdrt reads its own file back, checksums and all
"$T/p" predict --x "$F/x.npy" --weights "$T/w1.weights.h5" --out "$T/pred.npy" --quiet \
  >"$T/out" 2>&1 && ok "kdrt reads its bfloat16 file back" ||
  fail "predict --weights w1.weights.h5: $(cat "$T/out")"

# 4. a model saved in float32 compiled with --dtype-policy bfloat16
./kdcc models/seed_mlp.json --dtype-policy bfloat16 --batch-size 16 -o "$T/s" 2>"$T/out" ||
  fail "--dtype-policy bfloat16: $(cat "$T/out")"
"$T/s" --synthetic 64 --epochs 1 --batch-size 16 --save-weights "$T/s.weights.h5" --quiet \
  >"$T/out" 2>&1 || fail "seed_mlp under bfloat16: $(cat "$T/out")"
python3 - "$T/s.weights.h5" <<'EOF' || fail "--dtype-policy bfloat16: the weights"
import struct, sys
sys.path.insert(0, "tests/keras_ref")
import h5lite
d = {k: v for k, v in h5lite.datasets(sys.argv[1]).items() if k.startswith("layers/")}
assert d and all(struct.unpack("<I", struct.pack("<f", x))[0] & 0xffff == 0
                 for _, vals in d.values() for x in vals)
print(f"  ok: --dtype-policy bfloat16 on a float32 model: {len(d)} bfloat16 variables")
EOF

# 5. float16 likewise: its file's IEEE half datasets, which Keras loads
G=tests/fixtures/keras_ref/f16_mlp
./kdcc "$G/model.keras" --batch-size 16 -w -o "$T/h" || exit 1
"$T/h" --x "$G/x.npy" --y "$G/y.npy" --epochs 2 --batch-size 16 --no-shuffle \
  --weights "$G/model.keras" --save-weights "$T/h.weights.h5" --quiet >"$T/out" 2>&1 ||
  fail "f16_mlp: $(cat "$T/out")"
if has_keras "$PY"; then
  "$PY" -W ignore - "$G/model.keras" "$T/h.weights.h5" <<'EOF' || fail "Keras loads kdcc's float16 file"
import sys, h5py, numpy as np, keras
model = keras.saving.load_model(sys.argv[1])
assert all(v.dtype == "float16" for v in model.weights), [v.dtype for v in model.weights]
model.load_weights(sys.argv[2])
dense = [layer for layer in model.layers if layer.weights]
with h5py.File(sys.argv[2]) as f:
    for k, layer in enumerate(dense):
        for i, v in enumerate(layer.weights):
            ds = f[f"layers/dense{'_%d' % k if k else ''}/vars/{i}"]
            assert ds.dtype == np.float16, ds
            assert np.array_equal(np.array(ds), np.asarray(v.numpy())), v.path
print("  ok: kdcc's float16 file: IEEE half datasets, which Keras loads, the same values")
EOF
fi
"$T/h" predict --x "$G/x.npy" --weights "$T/h.weights.h5" --out "$T/pred.npy" --quiet \
  >"$T/out" 2>&1 && ok "kdrt reads its float16 file back" ||
  fail "predict --weights h.weights.h5: $(cat "$T/out")"

# 5b. predict of a bfloat16 model whose softmax the loss reads unrounded
# (XLA's program; layers.c's loss_reads_f32) writes the bfloat16
# probabilities Keras's predict returns: every value a bfloat16 one, and
# Keras's own predict from the same weights within bfloat16's spacing
G=tests/fixtures/keras_ref/bf16_cnn
./kdcc "$G/model.keras" --batch-size 16 -w -S "$T/pcs" >/dev/null 2>&1 &&
  grep -qF "output_round[] = {KDRT_ROUND_BF16}" "$T/pcs/program.c" &&
  ok "bf16_cnn: its output rounded as predict writes it (program.c)" ||
  fail "bf16_cnn: program.c's outputs[] names no KDRT_ROUND_BF16"
./kdcc "$G/model.keras" --batch-size 16 -w -o "$T/pc" >/dev/null 2>&1 &&
  "$T/pc" predict --x "$G/x.npy" --weights "$G/model.keras" --out "$T/pc.npy" --quiet     >"$T/out" 2>&1 || fail "bf16_cnn predict: $(cat "$T/out")"
python3 - "$T/pc.npy" <<'EOF2' && ok "bf16_cnn predict: every probability a bfloat16 value" ||
import struct, sys
sys.path.insert(0, "tests/keras_ref")
from compare_ref import npy
_, v = npy(open(sys.argv[1], "rb").read())
bad = [x for x in v if struct.unpack("<I", struct.pack("<f", x))[0] & 0xFFFF]
sys.exit(1 if bad or not v else 0)
EOF2
  fail "bf16_cnn predict wrote values that are not bfloat16"
if has_keras "$PY"; then
  "$PY" -W ignore - "$G/model.keras" "$G/x.npy" "$T/pc.npy" <<'EOF2' || fail "bf16_cnn predict against Keras's"
import sys
import keras, numpy as np
m = keras.saving.load_model(sys.argv[1], compile=False)
want = np.asarray(m.predict(np.load(sys.argv[2]), batch_size=16, verbose=0)).astype(np.float32)
got = np.load(sys.argv[3]).reshape(want.shape)
d = np.abs(got - want).max()
assert str(m.outputs[0].dtype) == "bfloat16", m.outputs[0].dtype
assert d <= 2 * 2.0 ** -8, d  # two bfloat16 steps of a probability
print(f"  ok: bf16_cnn predict within {d:.2e} of Keras's (bfloat16 outputs)")
EOF2
fi

# 6. the CUDA programs (kdrt_cuda_adam16, kdrt_cuda_sgd16, the other optimizers, clipping
# and constraints in 16 bits) build and link where
# nvcc is; they run only on a GPU (not run yet)
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}
if [ -n "$NVCC" ]; then
  export PATH="$(dirname "$NVCC"):$PATH"
  for c in bf16_adam_mlp bf16_bn_cnn f16_mlp bf16_rmsprop_mlp bf16_nadam_mlp bf16_adamax_reg \
    bf16_lion_mlp f16_adagrad_mlp; do
    ./kdcc "tests/fixtures/keras_ref/$c/model.keras" --batch-size 16 --target cuda -w \
      -o "$T/$c.cuda" >"$T/out" 2>&1 && [ ! -s "$T/out" ] &&
      ok "$c: the CUDA program builds without a warning" ||
      fail "$c --target cuda: $(cat "$T/out")"
  done
fi

finish
