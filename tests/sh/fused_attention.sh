#!/usr/bin/env bash
# fused_attention.sh: issue 22's attention without its [t, s] scores in
# memory, checked without a GPU on what kdcc writes (the kernels themselves:
# opcheck on a GPU machine, tests/gpu/device.sh's corr phase):
#  1. --target cuda at bf16 and tf32: the GPT and GPT-2 124M's shape call
#     kdrt_cuda_attention and _attention_grad, no attention softmax, no
#     [.., T, T] buffer in the plan, and a lower activation peak than with
#     --attention chain (GPT-2's: less by the kept probabilities);
#  2. the CPU program, fp32 CUDA and --attention chain keep the chain; so do
#     the chains the kernels do not take: a mixed policy's rounded
#     probabilities, Gemma 2's soft caps and sliding windows;
#  3. GPT-2's blocks stay folded into loops; two compiles write the same
#     program.cu; a bad --attention is refused.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin fused_attention.sh
CU="--target cuda --cuda-arch sm_90 -w"
F="--attention fused" # (the default is the chain until the kernels are proven on a GPU)

calls() { grep -c "kdrt_cuda_attention(d,\|kdrt_cuda_attention_grad(d," "$1"; }
peak() { ./kdcc "$@" --report 2>/dev/null | awk '/peak activations/ {printf "%.0f\n", $3 * ($4 == "GiB" ? 1048576 : $4 == "MiB" ? 1024 : 1)}'; }

for prec in bf16 tf32; do
  for m in "gpt 16 models/gpt.json --batch-size 16" "gpt2 1024 tests/gpu/gpt2_124m.json --batch-size 8"; do
    set -- $m
    name=$1_$prec t=$2 # t: the model's steps
    shift 2
    ./kdcc "$@" $CU --precision $prec $F -S "$T/$name" || { fail "$name: kdcc failed"; continue; }
    src=$T/$name/program.cu
    grep -q "kdrt_cuda_attention(d," "$src" || fail "$name: no kdrt_cuda_attention call"
    grep -q "kdrt_cuda_attention_grad(d," "$src" || fail "$name: no kdrt_cuda_attention_grad call"
    ! grep -q "kdrt_cuda_attn_softmax" "$src" || fail "$name: the attention softmax is still called"
    # the scores' [batch, heads, t, t] in the plan (#define A12_.. AO[3] // @0 [8, 12, t, t] ..)
    if grep -q "^#define A[0-9]*_.* \[[0-9]*, [0-9]*, $t, $t\]" "$src"; then
      fail "$name: a [.., $t, $t] buffer is still planned: $(grep "^#define A[0-9]*_.* \[[0-9]*, [0-9]*, $t, $t\]" "$src" | head -1)"
    fi
    ./kdcc "$@" $CU --precision $prec --attention chain -S "$T/${name}_chain" || fail "$name: --attention chain failed"
    grep -q "^#define A[0-9]*_.* \[[0-9]*, [0-9]*, $t, $t\]" "$T/${name}_chain/program.cu" ||
      fail "$name: the chain plans no [.., $t, $t] buffer (the check above checks nothing)"
    [ "$(calls "$T/${name}_chain/program.cu")" = 0 ] || fail "$name: --attention chain fused"
    fused=$(peak "$@" $CU --precision $prec $F) chain=$(peak "$@" $CU --precision $prec --attention chain)
    if ! awk -v f="$fused" -v c="$chain" 'BEGIN { exit !(f > 0 && f < c) }'; then
      fail "$name: peak activations $fused KiB fused, $chain KiB with the chain"
    else
      echo "fused_attention.sh: $name: fused, peak activations $fused KiB (the chain: $chain KiB)"
    fi
  done
done
# the fused ops keep GPT-2's 12 blocks one loop each way (blocks.c)
for dir in "0; l <= 11; l++" "11; l >= 0; l--"; do
  grep -q "for (int l = $dir)" "$T/gpt2_bf16/program.cu" || fail "gpt2_bf16: no block loop 'for (int l = $dir)'"
done
# GPT-2's probabilities, [8, 12, 1024, 1024] floats a layer kept for the backward, are gone
f=$(peak tests/gpu/gpt2_124m.json --batch-size 8 $CU --precision bf16 $F)
c=$(peak tests/gpu/gpt2_124m.json --batch-size 8 $CU --precision bf16 --attention chain)
awk -v f="$f" -v c="$c" 'BEGIN { exit !(c - f >= 12 * 8 * 12 * 1024 * 1024 * 4 / 1024 * 0.9) }' ||
  fail "gpt2: the peak fell by $((c - f)) KiB, less than 12 layers' probabilities"

# 2. the chain stays
./kdcc models/gpt.json --batch-size 16 -w -S "$T/cpu" || fail "cpu: kdcc failed"
grep -q "kdrt_attn_softmax(" "$T/cpu/program.c" || fail "cpu: no attn_softmax (the chain)"
! grep -q "kdrt_attention" "$T/cpu/program.c" || fail "cpu: the CPU program calls the fused op"
./kdcc models/gpt.json --batch-size 16 $CU $F -S "$T/fp32" || fail "fp32: kdcc failed"
[ "$(calls "$T/fp32/program.cu")" = 0 ] || fail "fp32: fused (the kernels round the operands)"
for m in "mixed models/gpt.json --batch-size 16 --dtype-policy mixed_bfloat16" \
         "gemma2 tests/fixtures/keras_hub/hub_gemma2/model.keras --sequence-length 16 --batch-size 16"; do
  set -- $m
  name=$1; shift
  ./kdcc "$@" $CU --precision bf16 $F -S "$T/$name" || { fail "$name: kdcc failed"; continue; }
  [ "$(calls "$T/$name/program.cu")" = 0 ] || fail "$name: a chain the kernels do not take was fused"
done

# the kernels' algorithm (tests/gpu/attn_model.py: numpy, where there is one)
py=$(for p in python3 build/keras-venv/bin/python; do "$p" -c "import numpy" 2>/dev/null && echo "$p" && break; done)
if [ -n "$py" ]; then
  "$py" tests/gpu/attn_model.py >"$T/model" 2>&1 || { cat "$T/model"; fail "attn_model.py"; }
  tail -1 "$T/model"
else
  echo "fused_attention.sh: attn_model.py skipped: no python with numpy"
fi

# without --attention, the chain (the default until a GPU has proven the kernels)
./kdcc models/gpt.json --batch-size 16 $CU --precision bf16 -S "$T/default" || fail "default: kdcc failed"
[ "$(calls "$T/default/program.cu")" = 0 ] || fail "default: fused without --attention fused"

# 3. deterministic text, and the option's errors
./kdcc models/gpt.json --batch-size 16 $CU --precision bf16 $F -S "$T/again"
cmp -s "$T/gpt_bf16/program.cu" "$T/again/program.cu" || fail "two compiles differ"
name="--attention bogus"
./kdcc models/gpt.json $CU --attention bogus -S "$T/x" >"$T/out" 2>&1
rc=$?
expect 1 "--attention: 'bogus' is not one of fused, chain"
finish
