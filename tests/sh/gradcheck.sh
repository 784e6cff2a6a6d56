#!/usr/bin/env bash
# Every op's gradient in context: each bundled model is compiled for one
# device and its generated gradients are compared with central finite
# differences of the loss (`./train gradcheck`, runtime/gradcheck.c).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=build/tests/gradcheck
mkdir -p $out
fail=0
for m in seed_mlp func_branches cnn megatron per_token int_tokens wide_deep two_heads shared_dense \
         text_cls gpt vit llama nested nested_frozen; do
  echo "gradcheck: $m"
  ./kdcc models/$m.json --batch-size 4 -w -o $out/$m
  $out/$m gradcheck --points 6 || fail=1
done
for m in tests/gradcheck/*.json; do
  [ -e "$m" ] || continue
  echo "gradcheck: $m"
  exe=$out/$(basename $m .json)
  ./kdcc $m --batch-size 4 -w -o $exe
  $exe gradcheck --points 6 || fail=1
done
exit $fail
