#!/usr/bin/env bash
# xent_fused.sh (issue 22: fuse.c's fuse_xent): a sparse crossentropy from
# logits whose class dim is whole is one kernel a step (XENT_FUSED:
# kdrt_sparse_xent_fused), not the chain row_max, row_sumexp, sparse_xent,
# sparse_xent_acc, sparse_xent_grad; and every number is the chain's:
#  1. models/gpt.json's program calls the fused kernel (the chain's calls
#     gone), KDCC_FUSE_XENT=0's the chain; each step's loss, the epochs'
#     logs (loss, accuracy, validation) and every final weight bit for bit
#     between the two, on one device, DataParallel over 2, and under
#     mixed_bfloat16 (the gradient's rounding folded into the kernel:
#     kdrt_sparse_xent_fused_rnd) over 2, and mixed_float16 (its loss scale
#     multiplies the gradient after the kernel);
#  2. Keras's sample weights and a weighted accuracy (the sample_weight
#     fixture's MLP): the same, bit for bit;
#  3. a vocabulary split over 'model' (per_token's layout map on (1,2))
#     keeps the chain, the program the same as KDCC_FUSE_XENT=0's;
#  4. a model without a sparse classifier: the program the same with and
#     without the fusion.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin xent_fused.sh
echo '{"distribution": "DataParallel", "devices": 2}' >"$T/dp2.json"

pair() { # PROGRAM-ARGUMENTS -- kdcc-arguments...: $T/new, and $T/old with KDCC_FUSE_XENT=0
  RUN=()
  while [ "$1" != -- ]; do RUN+=("$1"); shift; done
  shift
  ./kdcc "$@" -w -o "$T/new" && KDCC_FUSE_XENT=0 ./kdcc "$@" -w -o "$T/old"
}

same() { # NAME NP KERNEL PROGRAM-ARGUMENTS -- kdcc-arguments...
  local name=$1 np=$2 kernel=$3
  shift 3
  pair "$@" || { fail "$name: kdcc failed"; return; }
  local new=$T/new.kdcc.d/program.c old=$T/old.kdcc.d/program.c
  if ! grep -q "^ *$kernel(" "$new" ||
     grep -Eq "kdrt_(row_max|row_sumexp|sparse_xent_grad)" "$new" ||
     grep -q "sparse_xent_fused" "$old" || ! grep -q "kdrt_row_max(" "$old"; then
    fail "$name: the program does not call $kernel alone (or KDCC_FUSE_XENT=0's does)"
    return
  fi
  echo "  ok: $name: the program calls $kernel"
  same_numbers "$name" "$np" "${RUN[@]}"
}

# ---- 1. the GPT
same "gpt.json, one device" 1 kdrt_sparse_xent_fused --synthetic 96 --epochs 2 \
  --validation-split 0.25 -- models/gpt.json
same "gpt.json, DataParallel over 2" 2 kdrt_sparse_xent_fused --synthetic 96 --epochs 2 -- \
  models/gpt.json --distribution "$T/dp2.json"
same "gpt.json bfloat16, DataParallel over 2" 2 kdrt_sparse_xent_fused_rnd --synthetic 64 \
  --epochs 2 -- models/gpt.json --dtype-policy mixed_bfloat16 --distribution "$T/dp2.json"
same "gpt.json float16 (a loss scale after the gradient)" 1 kdrt_sparse_xent_fused \
  --synthetic 64 --epochs 2 -- models/gpt.json --dtype-policy mixed_float16

# ---- 2. sample weights and a weighted accuracy
F=tests/fixtures/sample_weight
same "sample_weight MLP, weighted loss and accuracy" 1 kdrt_sparse_xent_fused --x $F/x.npy \
  --y $F/y.npy --sample-weight $F/w.npy --epochs 2 --batch-size 16 --no-shuffle \
  --validation-split 0.25 --weights $F/model.keras -- $F/model.keras --batch-size 16 --sample-weight
grep -qF "((const float *)y[1]), ((const float *)y[1]), B" "$T/new.kdcc.d/program.c" ||
  fail "sample_weight MLP: the fused kernel does not weigh the loss and the accuracy"

# ---- 3. a split vocabulary keeps the chain
./kdcc models/per_token.json --distribution models/per_token.dist.json --mesh data=1,model=2 -w \
  -S "$T/split" && KDCC_FUSE_XENT=0 ./kdcc models/per_token.json \
  --distribution models/per_token.dist.json --mesh data=1,model=2 -w -S "$T/split0" ||
  fail "per_token.json on (1,2): kdcc failed"
if grep -q "kdrt_allreduce_max\|kdrt_allreduce(.*row" "$T/split/program.c" &&
   grep -q "kdrt_row_sumexp(" "$T/split/program.c" &&
   cmp -s "$T/split/program.c" "$T/split0/program.c"; then
  echo "  ok: per_token.json, vocabulary split over 'model': the chain, as with KDCC_FUSE_XENT=0"
else fail "per_token.json, vocabulary split: not the chain's program"; fi

# ---- 4. no sparse classifier: nothing changes
for m in cnn seed_mlp; do
  ./kdcc models/$m.json -w -S "$T/p_$m" &&
    KDCC_FUSE_XENT=0 ./kdcc models/$m.json -w -S "$T/p0_$m" &&
    cmp -s "$T/p_$m/program.c" "$T/p0_$m/program.c" ||
    fail "models/$m.json: the program depends on KDCC_FUSE_XENT"
done

finish
