#!/usr/bin/env bash
# store16.sh (issue 23's storage in the compute dtype): a mixed policy's
# saved activations are stored in 16 bits (compiler/store16.c), and the
# memory plan, --report and --max-memory count their real bytes.
#  1. --report=json's activations_peak under mixed_bfloat16 against the
#     float32 twin's, on one device and DataParallel over 2: models/gpt.json
#     and the keras_ref MLP (batch 256) at most 0.75 of it (their products
#     and activations' gradients read the saved values' 16 bits, no float32
#     copy), the batch-norm CNN (batch 64) at most 0.75 of it (its
#     convolutions read 16-bit values too, their im2col columns 16-bit and
#     the input gradient's float32 ones a chunk of rows at a time:
#     kdrt_conv2d16; their results stay float32 for batch norm, as XLA's),
#     each less than with every value in float32 (KDCC_STORE16=0, the
#     storage of before); the CPU's widened product operands are a buffer
#     of their own (widened_16bit_operands), not in this peak;
#  2. every number the same: each step's loss, the epochs' logs and every
#     final weight, bit for bit, between the program with 16-bit storage and
#     the one without, the former's products of 16-bit operands
#     (kdrt_matmul16) widened for OpenBLAS (KDRT_GEMM16=0; by default they
#     are oneDNN's bf16 products, whose float32 sums differ in order only:
#     keras_ref.sh checks those against Keras; the CNN's both programs with
#     ops.c's im2col convolutions, KDRT_ONEDNN=0, whose columns and products
#     the 16-bit convolutions' widened ones are, bit for bit): the GPT
#     (bfloat16) on one device and DataParallel
#     over 2 (and there at a larger batch than compiled, the arena plan
#     replayed, and at rows that do not divide), the batch-norm CNN
#     (bfloat16) from Keras's weights, and the
#     mixed_float16 MLP whose loss scale skips steps, over 2 devices (its
#     products float32 ones of the exact float16 values: the CPU has no
#     float16 product, opt_products16);
#  3. --max-memory between the two totals passes the 16-bit program and
#     stops the float32-storage one; a float32 model's program is the same
#     with and without the pass; a 12-block GPT's blocks still fold (its
#     program.c within 1.1 times the float32-storage one's);
#  4. (issue 23's collectives) the all-gathers and all-to-alls of 16-bit
#     values send 16 bits on a (2,4) mesh: --report=json's bytes they send
#     for models/gpt.json (mixed_bfloat16) under its FSDP layout map (every
#     all-gather a rounded weight's) exactly half those with KDCC_STORE16=0,
#     under sequence parallelism at most 0.6 of them (attention's float32
#     softmax is moved in float32), the sums' bytes unchanged; and every
#     number the same, bit for bit, on that mesh, the programs calling
#     kdrt_allgather16 (and kdrt_alltoall16) where KDCC_STORE16=0's do not;
#     likewise the GPT in mixed_float16 (its loss scale) under FSDP and the
#     batch-norm CNN under its keras_ref (2,4) layout map;
#  5. (issues 22, 23: fuse.c's fuse_rounds) ROUNDs folded into the kernels
#     that make their operands (their _rnd forms): fewer kdrt_round calls
#     than with KDCC_FUSE_ROUND=0, and every number the same, bit for bit
#     (the GPT in bfloat16 and float16, over 2 devices; the batch-norm CNN;
#     the mixed_float16 MLP whose loss scale skips steps); a float32
#     model's program the same with and without.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin store16.sh
F=tests/fixtures/keras_ref
echo '{"distribution": "DataParallel", "devices": 2}' >"$T/dp2.json"
DP2=(--distribution "$T/dp2.json")

json() { # FIELD kdcc-arguments...: a memory figure of --report=json
  local f=$1
  shift
  ./kdcc "$@" -w --report=json | python3 -c "import json, sys; print(json.load(sys.stdin)['memory']['$f'])"
}

# ---- 1. the activations' peak
ratio() { # NAME BOUND FLOAT32-POLICY MIXED-POLICY kdcc-arguments...
  local name=$1 bound=$2 f32=$3 mixed=$4
  shift 4
  local a m o
  a=$(json activations_peak "$@" --dtype-policy "$f32") &&
    m=$(json activations_peak "$@" ${mixed:+--dtype-policy "$mixed"}) &&
    o=$(KDCC_STORE16=0 json activations_peak "$@" ${mixed:+--dtype-policy "$mixed"}) ||
    { fail "$name: kdcc --report=json failed"; return; }
  if python3 -c "import sys; sys.exit(not ($m <= $bound * $a and $m < $o))"; then
    echo "  ok: $name: activations $m bytes, $(python3 -c "print(round($m / $a, 3))") x float32's" \
         "$a (float32 storage: $(python3 -c "print(round($o / $a, 3))") x)"
  else fail "$name: activations $m bytes, float32 model $a, float32 storage $o: want <= $bound x" \
            "the first and less than the second"; fi
}
ratio "gpt.json, one device" 0.75 float32 mixed_bfloat16 models/gpt.json
ratio "gpt.json, DataParallel over 2" 0.75 float32 mixed_bfloat16 models/gpt.json "${DP2[@]}"
ratio "mixed_mlp, batch 256" 0.75 float32 "" $F/mixed_mlp/model.keras --batch-size 256
ratio "mixed_mlp, batch 256, DataParallel over 2" 0.75 float32 "" $F/mixed_mlp/model.keras \
  --batch-size 256 "${DP2[@]}"
ratio "mixed_bn_cnn, batch 64" 0.75 float32 "" $F/mixed_bn_cnn/model.keras --batch-size 64
ratio "mixed_bn_cnn, batch 64, DataParallel over 2" 0.75 float32 "" $F/mixed_bn_cnn/model.keras \
  --batch-size 64 "${DP2[@]}"

# ---- 2. the same numbers
pair() { # VARIABLE PROGRAM-ARGUMENTS -- kdcc-arguments...: $T/new, and $T/old with VARIABLE=0
  local var=$1
  shift
  RUN=() # the program's arguments
  while [ "$1" != -- ]; do RUN+=("$1"); shift; done
  shift
  ./kdcc "$@" -w -o "$T/new" && env "$var=0" ./kdcc "$@" -w -o "$T/old"
}

same() { # NAME NP PROGRAM-ARGUMENTS -- kdcc-arguments...: with and without 16-bit storage
  # (ONEDNN=0 in the environment: both run with KDRT_ONEDNN=0)
  local name=$1 np=$2
  shift 2
  pair KDCC_STORE16 "$@" || { fail "$name: kdcc failed"; return; }
  grep -q "kdrt_pack16(" "$T/new.kdcc.d/program.c" &&
    grep -Eq "kdrt_(unpack16|matmul16|act_grad16)\(" "$T/new.kdcc.d/program.c" ||
    { fail "$name: the program stores nothing in 16 bits"; return; }
  ! grep -q "kdrt_pack16(" "$T/old.kdcc.d/program.c" || fail "$name: KDCC_STORE16=0 still packs"
  if [ "${F16:-0}" = 1 ]; then # float16 on the CPU: float32 products of its exact values
    ! grep -Eq "kdrt_(matmul16|conv2d16)\(" "$T/new.kdcc.d/program.c" ||
      { fail "$name: a float16 product in 16 bits on the CPU (widened outside the plan)"; return; }
  else
    grep -Eq "kdrt_(matmul16|conv2d16)\(" "$T/new.kdcc.d/program.c" ||
      { fail "$name: the program has no product of 16-bit operands"; return; }
  fi
  same_numbers "$name" "$np" "${RUN[@]}"
}

same "gpt.json bfloat16, one device" 1 --synthetic 128 --epochs 2 -- \
  models/gpt.json --dtype-policy mixed_bfloat16
same "gpt.json bfloat16, DataParallel over 2" 2 --synthetic 128 --epochs 2 -- \
  models/gpt.json --dtype-policy mixed_bfloat16 "${DP2[@]}"
same "gpt.json bfloat16 compiled for 16, run at 24 (the arena replayed), DataParallel over 2" 2 \
  --synthetic 96 --epochs 1 --batch-size 24 -- models/gpt.json --dtype-policy mixed_bfloat16 \
  --batch-size 16 "${DP2[@]}"
same "gpt.json bfloat16, 7 rows over 2 devices" 2 --synthetic 28 --epochs 1 --batch-size 7 -- \
  models/gpt.json --dtype-policy mixed_bfloat16 --batch-size 16 "${DP2[@]}"
ONEDNN=0 same "mixed_bn_cnn, one device" 1 --x $F/mixed_bn_cnn/x.npy --y $F/mixed_bn_cnn/y.npy --epochs 2 \
  --batch-size 16 --no-shuffle --weights $F/mixed_bn_cnn/model.keras -- \
  $F/mixed_bn_cnn/model.keras --batch-size 16
F16=1 same "mixed_f16_mlp (loss scale), DataParallel over 2" 2 --x $F/mixed_f16_mlp/x.npy \
  --y $F/mixed_f16_mlp/y.npy --epochs 2 --batch-size 16 --no-shuffle \
  --weights $F/mixed_f16_mlp/model.keras -- $F/mixed_f16_mlp/model.keras --batch-size 16 "${DP2[@]}"
grep -q '"step_loss_scale": \[32768, 32768, 16384' "$T/new.json" ||
  fail "mixed_f16_mlp: its loss scale skipped no step: $(head -c 300 "$T/new.json")"

# ---- 3. --max-memory, float32 models, repeated blocks
new=$(json total models/gpt.json --dtype-policy mixed_bfloat16)
old=$(KDCC_STORE16=0 json total models/gpt.json --dtype-policy mixed_bfloat16)
limit=$(((new + old) / 2))
./kdcc models/gpt.json --dtype-policy mixed_bfloat16 --max-memory $limit --report >"$T/out" 2>&1
rc=$?
name="--max-memory $limit (16-bit storage: $new bytes)"
expect 0
KDCC_STORE16=0 ./kdcc models/gpt.json --dtype-policy mixed_bfloat16 --max-memory $limit --report \
  >"$T/out" 2>&1
rc=$?
name="--max-memory $limit (float32 storage: $old bytes)"
expect 1 "error: one device needs"
[ "$fails" = 0 ] && echo "  ok: --max-memory $limit: the 16-bit program's $new bytes pass, $old do not"
for m in gpt cnn; do
  ./kdcc models/$m.json -w -S "$T/f32_$m" && KDCC_STORE16=0 ./kdcc models/$m.json -w -S "$T/f32_${m}_0" &&
    cmp -s "$T/f32_$m/program.c" "$T/f32_${m}_0/program.c" ||
    fail "models/$m.json (float32): the program depends on KDCC_STORE16"
done
python3 - "$T/gpt12.json" <<'EOF'
import json, sys
d = json.load(open("models/gpt.json"))  # blocks.sh's expansion: b1_'s layers again as b2_ ... b11_
layers = d["config"]["layers"]
block1 = [l for l in layers if l["name"].startswith("b1_")]
rest = [l for l in layers if not l["name"].startswith("b1_")]
at = [l["name"] for l in rest].index("ln_f")
new = rest[:at]
for i in range(1, 12):
    text = json.dumps(block1).replace('"b1_', '"b%d_' % i).replace('"b0_add2"', '"b%d_add2"' % (i - 1))
    new += json.loads(text)
d["config"]["layers"] = new + json.loads(json.dumps(rest[at:]).replace('"b1_add2"', '"b11_add2"'))
json.dump(d, open(sys.argv[1], "w"))
EOF
./kdcc "$T/gpt12.json" --dtype-policy mixed_bfloat16 -w -S "$T/g12" &&
  KDCC_STORE16=0 ./kdcc "$T/gpt12.json" --dtype-policy mixed_bfloat16 -w -S "$T/g12_0" ||
  fail "the 12-block GPT does not compile"
a=$(wc -c <"$T/g12/program.c") b=$(wc -c <"$T/g12_0/program.c")
if grep -q "^static void block_forward(" "$T/g12/program.c" &&
   grep -q "^static void block_backward(" "$T/g12/program.c" && [ $((a * 10)) -le $((b * 11)) ]; then
  echo "  ok: the 12-block GPT still folds: program.c $a bytes (float32 storage: $b)"
else fail "the 12-block GPT: program.c $a bytes, float32 storage $b, or its blocks are not folded"; fi
# ---- 4. the collectives of 16-bit values, on a (2,4) mesh
sent() { # KIND,KIND... kdcc-arguments...: the bytes those collectives send a step
  local kinds=$1
  shift
  ./kdcc "$@" -w --report=json | python3 -c "import json, sys
print(sum(c['sent'] for c in json.load(sys.stdin)['collectives'] if c['kind'] in '$kinds'.split(',')))"
}
moved() { # NAME BOUND kdcc-arguments...: all-gathers and all-to-alls at most BOUND x float32's
  local name=$1 bound=$2
  shift 2
  local m o sm so
  m=$(sent all_gather,all_to_all "$@") && o=$(KDCC_STORE16=0 sent all_gather,all_to_all "$@") &&
    sm=$(sent all_reduce,reduce_scatter "$@") &&
    so=$(KDCC_STORE16=0 sent all_reduce,reduce_scatter "$@") ||
    { fail "$name: kdcc --report=json failed"; return; }
  if python3 -c "import sys; sys.exit(not (0 < $m <= $bound * $o and $sm == $so))"; then
    echo "  ok: $name: all-gathers and all-to-alls send $m bytes a step, $(python3 -c "
print(round($m / $o, 3))") x float32's $o (sums: $sm bytes, as before)"
  else fail "$name: all-gathers and all-to-alls send $m bytes, $o in float32: want <= $bound x;" \
            "sums $sm, before $so: want the same"; fi
}
GPT16=(models/gpt.json --dtype-policy mixed_bfloat16)
moved "gpt.json, FSDP on (2,4)" 0.5 "${GPT16[@]}" --distribution models/gpt_fsdp.dist.json
moved "gpt.json, sequence parallel on (2,4)" 0.6 "${GPT16[@]}" \
  --distribution tests/good/gpt_seqpar.dist.json
same "gpt.json bfloat16, FSDP on (2,4)" 8 --synthetic 64 --epochs 1 --batch-size 16 -- \
  "${GPT16[@]}" --distribution models/gpt_fsdp.dist.json --batch-size 16
grep -q "kdrt_allgather16(" "$T/new.kdcc.d/program.c" && ! grep -q "kdrt_allgather16(" "$T/old.kdcc.d/program.c" ||
  fail "gpt.json, FSDP: the program gathers no 16-bit value in 16 bits (or KDCC_STORE16=0's does)"
F16=1 same "gpt.json float16 (loss scale), FSDP on (2,4)" 8 --synthetic 64 --epochs 1 --batch-size 16 -- \
  models/gpt.json --dtype-policy mixed_float16 --distribution models/gpt_fsdp.dist.json \
  --batch-size 16
grep -q "kdrt_allgather16(c, KDRT_ROUND_F16," "$T/new.kdcc.d/program.c" ||
  fail "gpt.json float16, FSDP: the program gathers no float16 value in 16 bits"
same "gpt.json bfloat16, sequence parallel on (2,4), 13 rows" 8 --synthetic 61 --epochs 1 \
  --batch-size 16 -- "${GPT16[@]}" --distribution tests/good/gpt_seqpar.dist.json --batch-size 16
grep -q "kdrt_alltoall16(" "$T/new.kdcc.d/program.c" && ! grep -q "kdrt_alltoall16(" "$T/old.kdcc.d/program.c" ||
  fail "gpt.json, sequence parallel: no all-to-all in 16 bits (or KDCC_STORE16=0's has one)"
ONEDNN=0 same "mixed_bn_cnn under its (2,4) layout map" 8 --x $F/mixed_bn_cnn/x.npy \
  --y $F/mixed_bn_cnn/y.npy --epochs 2 --batch-size 16 --no-shuffle \
  --weights $F/mixed_bn_cnn/model.keras -- $F/mixed_bn_cnn/model.keras --batch-size 16 \
  --distribution $F/mixed_bn_cnn/mixed_bn_cnn.dist.json
grep -q "kdrt_allgather16(" "$T/new.kdcc.d/program.c" ||
  fail "mixed_bn_cnn, (2,4): the program gathers no 16-bit value in 16 bits"

# ---- 5. ROUNDs in their operands' kernels
fused() { # NAME NP PROGRAM-ARGUMENTS -- kdcc-arguments...: with and without KDCC_FUSE_ROUND=0
  local name=$1 np=$2
  shift 2
  pair KDCC_FUSE_ROUND "$@" || { fail "$name: kdcc failed"; return; }
  local a b r
  a=$(grep -c "^ *kdrt_round(" "$T/new.kdcc.d/program.c")
  b=$(grep -c "^ *kdrt_round(" "$T/old.kdcc.d/program.c")
  r=$(grep -c "^ *kdrt_[a-z0-9_]*_rnd(" "$T/new.kdcc.d/program.c")
  if [ "$a" -lt "$b" ] && [ "$r" = $((b - a)) ] &&
     ! grep -q "^ *kdrt_[a-z0-9_]*_rnd(" "$T/old.kdcc.d/program.c"; then
    echo "  ok: $name: $a kdrt_round calls ($b with KDCC_FUSE_ROUND=0), $r rounding kernels"
  else fail "$name: $a kdrt_round calls and $r _rnd ones, against $b with KDCC_FUSE_ROUND=0"; fi
  same_numbers "$name" "$np" "${RUN[@]}"
}
fused "gpt.json bfloat16, rounds folded, DataParallel over 2" 2 --synthetic 64 --epochs 2 -- \
  "${GPT16[@]}" "${DP2[@]}"
fused "gpt.json float16 (loss scale), rounds folded" 1 --synthetic 64 --epochs 1 -- \
  models/gpt.json --dtype-policy mixed_float16
fused "mixed_bn_cnn, rounds folded" 1 --x $F/mixed_bn_cnn/x.npy --y $F/mixed_bn_cnn/y.npy \
  --epochs 2 --batch-size 16 --no-shuffle --weights $F/mixed_bn_cnn/model.keras -- \
  $F/mixed_bn_cnn/model.keras --batch-size 16
fused "mixed_f16_mlp (loss scale), rounds folded, DataParallel over 2" 2 \
  --x $F/mixed_f16_mlp/x.npy --y $F/mixed_f16_mlp/y.npy --epochs 2 --batch-size 16 --no-shuffle \
  --weights $F/mixed_f16_mlp/model.keras -- $F/mixed_f16_mlp/model.keras --batch-size 16 "${DP2[@]}"
for m in gpt cnn; do
  KDCC_FUSE_ROUND=0 ./kdcc models/$m.json -w -S "$T/f32r_$m" &&
    cmp -s "$T/f32_$m/program.c" "$T/f32r_$m/program.c" ||
    fail "models/$m.json (float32): the program depends on KDCC_FUSE_ROUND"
done

finish
