#!/usr/bin/env bash
# var16.sh (issue 23): the variables of the bfloat16 and float16 policies,
# and their optimizer slots, kept in 2 bytes (compiler/store16.c's var16,
# KDCC_VAR16=1) against the float32 buffers of 16-bit values of before
# (KDCC_VAR16=0): the values were the type's already, so no number may
# change.
#  1. every number the same, bit for bit (each step's loss, the epochs'
#     logs, evaluate's, every final weight as --save-weights writes it):
#     the keras_ref MLP (SGD), its Adam twin, the batch-norm CNN (its
#     moving statistics stay float32 buffers; conv kernels read in 16
#     bits), the GPT (embeddings, layer norms, attention), the float16 MLP
#     and batch-norm CNN, Adamax with its regularizers and constraints
#     (clipvalue, MaxNorm over a split dim, NonNeg, MinMaxNorm), RMSprop
#     with clipnorm, Nadam with global_clipnorm, and keras-hub's GPT-2 and
#     Gemma with LoRA (its bfloat16 kernels frozen, A and B float32) in
#     bfloat16: each on its ModelParallel mesh (a layout map) and
#     DataParallel over 8, from Keras's initial weights (so the load of a
#     bfloat16 file into 16 bits too); each 16-bit program
#     really keeps them so (its parameter blob's #defines say "16 bits"),
#     the float32-buffer one does not;
#  2. a checkpoint round trip: Adam (two slots) stopped mid-epoch and
#     resumed gives the uninterrupted run's history and weights, bit for
#     bit, from the 16-bit program's own checkpoint and from the float32
#     one's (the format keeps float32 values either way); EarlyStopping's
#     restore_best_weights the same bits as the float32 buffers';
#  3. --report=json: parameters and optimizer state exactly half the
#     float32 buffers' (the MLP's), gradients the same; the programs (C and
#     CUDA) of models with float32 variables (mixed_bfloat16's MLP, the
#     float32 GPT) the same with KDCC_VAR16=1 and without.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin var16.sh
F=tests/fixtures/keras_ref

# case json: "devices batch epochs", kdcc's extra arguments (a keras-hub
# case's sequence length, LoRA rank), then the program's data arguments
# (and LoRA's initial A and B), one a line
case_args() {
  python3 - "$1" "$(dirname "$1")" <<'EOF'
import json, os, sys
r = json.load(open(sys.argv[1]))
print(r["devices"], r["batch_size"], r["epochs"])
hub, lora = r.get("hub", {}).get("sequence_length", 0), r.get("lora", {}).get("rank", 0)
print(" ".join((["--sequence-length", str(hub)] if hub else []) +
               (["--lora-rank", str(lora)] if lora else [])))
for flag, key, one in (("--x", "x_files", "x.npy"), ("--y", "y_files", "y.npy")):
    for f in r.get(key, [one]):
        print(flag)
        print(os.path.join(sys.argv[2], f))
if lora:
    print("--lora-weights")
    print(os.path.join(sys.argv[2], "initial.lora.h5"))
EOF
}

# build NAME VAR16 MODEL DIST BATCH [kdcc arguments]: $T/NAME, checked to
# keep (or not) 16-bit variables
build() {
  local p=$1 on=$2 model=$3 dist=$4 batch=$5
  shift 5
  if ! KDCC_VAR16=$on ./kdcc "$model" --distribution "$dist" --batch-size "$batch" "$@" -w \
    -o "$T/$p" >"$T/out" 2>&1; then
    fail "$name: kdcc (KDCC_VAR16=$on) failed"
    sed 's/^/    | /' "$T/out" >&2
    return 1
  fi
  local n16
  n16=$(grep -c "^#define P_.*16 bits" "$T/$p.kdcc.d/program.c")
  if [ "$on" = 1 ] && [ "$n16" = 0 ]; then fail "$name: no variable kept in 16 bits"; return 1; fi
  if [ "$on" = 0 ] && [ "$n16" != 0 ]; then fail "$name: KDCC_VAR16=0 keeps $n16 in 16 bits"; return 1; fi
}

# ---- 1. bit for bit
H=tests/fixtures/keras_hub
for c in $F/bf16_mlp $F/bf16_adam_mlp $F/bf16_bn_cnn $F/bf16_gpt $F/f16_mlp $F/f16_bn_cnn \
         $F/bf16_adamax_reg $F/bf16_unit_act $F/bf16_rmsprop_mlp $F/bf16_nadam_mlp $H/hub_gpt2_bf16 \
         $H/hub_gemma_lora_bf16; do
  for m in "$(basename "$c")" "$(basename "$c")_dp"; do
    name=$m
    mapfile -t a < <(case_args "$c/$m.json")
    read -r devices batch epochs <<<"${a[0]}"
    read -r -a extra <<<"${a[1]}"
    build new 1 "$c/model.keras" "$c/$m.dist.json" "$batch" "${extra[@]}" || continue
    build old 0 "$c/model.keras" "$c/$m.dist.json" "$batch" "${extra[@]}" || continue
    same_numbers "$m" "$devices" "${a[@]:2}" --epochs "$epochs" --batch-size "$batch" \
      --no-shuffle --weights "$c/model.keras"
  done
done

# ---- 2. a checkpoint round trip
c=bf16_adam_mlp
name="$c checkpoint"
mapfile -t a < <(case_args "$F/$c/$c.json")
read -r devices batch epochs <<<"${a[0]}"
RUN=("${a[@]:2}" --epochs "$epochs" --batch-size "$batch" --no-shuffle --weights "$F/$c/model.keras"
     --quiet)
build new 1 "$F/$c/model.keras" "$F/$c/$c.dist.json" "$batch" &&
  build old 0 "$F/$c/model.keras" "$F/$c/$c.dist.json" "$batch" &&
  mpirun -np "$devices" "$T/new" "${RUN[@]}" --history "$T/straight.json" \
    --save-weights "$T/straight.weights.h5" >"$T/out" 2>&1 || fail "$name: the straight run"
for from in new old; do
  rm -rf "$T/ck"
  mpirun -np "$devices" "$T/$from" "${RUN[@]}" --epochs 1 --checkpoint-dir "$T/ck" \
    --checkpoint-every 3 >"$T/out" 2>&1 || fail "$name: the $from program's first epoch"
  [ -d "$T/ck/ckpt-3" ] || fail "$name: no ckpt-3 from the $from program"
  mpirun -np "$devices" "$T/new" "${RUN[@]}" --checkpoint-dir "$T/ck" --resume \
    --history "$T/resumed.json" --save-weights "$T/resumed.weights.h5" >"$T/out" 2>&1 ||
    fail "$name: resume from the $from program's checkpoint"
  if cmp -s "$T/straight.json" "$T/resumed.json" &&
    same_weights "$T/straight.weights.h5" "$T/resumed.weights.h5"; then
    echo "  ok: $name: resumed from the $from program's ckpt-3 (step 3 of 8), history and weights bit for bit"
  else
    fail "$name: resumed from the $from program's checkpoint, a number changed"
    diff "$T/straight.json" "$T/resumed.json" | head -5
  fi
done

# EarlyStopping's restore_best_weights: the best epoch's weights kept and put
# back (callbacks.c's snapshot of the 16 bits); at learning rate 0.5 the run
# stops after epoch 2 and restores epoch 1's
same_numbers "$c restore_best_weights" "$devices" "${a[@]:2}" --epochs 8 --batch-size "$batch" \
  --no-shuffle --weights "$F/$c/model.keras" --lr 0.5 --early-stopping 1 --monitor loss \
  --restore-best-weights

# ---- 3. the report's bytes; a float32 model's program
name="report"
mem() { # VAR16 FIELD
  KDCC_VAR16=$1 ./kdcc "$F/bf16_mlp/model.keras" --distribution "$F/bf16_mlp/bf16_mlp.dist.json" \
    --report=json | python3 -c "import json, sys; print(json.load(sys.stdin)['memory']['$2'])"
}
for f in parameters optimizer_state gradients; do
  n=$(mem 1 $f) o=$(mem 0 $f)
  want=$([ $f = gradients ] && echo "$o" || echo $((o / 2)))
  if [ "$n" = "$want" ] && [ "$o" -gt 0 ]; then echo "  ok: $name: $f $n bytes (float32 buffers: $o)"
  else fail "$name: $f $n bytes, want $want (float32 buffers: $o)"; fi
done
name="float32 variables"
for c in mixed_mlp gpt; do
  for t in cpu cuda; do
    for on in 0 1; do
      KDCC_VAR16=$on ./kdcc "$F/$c/model.keras" --distribution "$F/$c/$c.dist.json" --target $t \
        -S "$T/f$on" >/dev/null 2>&1
    done
    if ! ls "$T"/f0/program.* >/dev/null 2>&1; then fail "$name: no $c program ($t)"
    elif diff -r "$T/f0" "$T/f1" >/dev/null; then echo "  ok: $name: $c's program ($t) unchanged"
    else fail "$name: $c's program ($t) changed with KDCC_VAR16=1"; fi
    rm -rf "$T/f0" "$T/f1"
  done
done
finish
