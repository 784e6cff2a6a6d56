#!/usr/bin/env bash
# The batch dimension is symbolic: a program compiled for a batch of 16
# computes a step of 8 rows when told so at run time (c->rows), and the
# losses and metrics of two halves average to the whole batch's
# (tests/rt_rows_check.c, one device, eval_step).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=build/tests/rows
mkdir -p $out
make -s build/libkdrt.a
fail=0
for m in models/seed_mlp models/cnn models/per_token models/two_heads models/shared_dense tests/gradcheck/gated tests/gradcheck/attention; do
  name=$(basename $m)
  ./kdcc $m.json --batch-size 16 -w -S $out/$name
  mpicc -std=c11 -D_GNU_SOURCE -O2 -Iruntime -DPROGRAM="\"$PWD/$out/$name/program.c\"" \
    -o $out/$name/check tests/rt_rows_check.c build/libkdrt.a $(make -s rt-libs) -lm
  echo "rows: $name"
  $out/$name/check || { echo "rows: FAIL: $name"; fail=1; }
done
[ $fail = 0 ] && echo "rows: ok"
exit $fail
