#!/usr/bin/env bash
# A rank's threads change nothing: the seed MLP (dropout), the CNN
# (oneDNN convolutions, pooling, dropout), Megatron (AdamW, logits) and the
# GPT (attention's softmax, gelu, vocab crossentropy: runtime/vmath.h) train
# with OMP_NUM_THREADS=1, 2 and 3 to the same history, bit for bit (every
# loss and metric printed with 9 significant digits, every step's loss),
# and so does a (2,1) mesh of the MLP with 1 and 2 threads per rank.
# THREADS_MODELS="gpt cnn" runs only those models (and the mesh case).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=build/tests/threads
mkdir -p $out
make -s kdcc build/libkdrt.a
fail=0
run() { # run NAME THREADS NP: train, write $out/NAME.tTHREADS.json
  local name=$1 t=$2 np=$3
  OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t mpirun -np $np $out/$name --synthetic 512 \
    --epochs 2 --batch-size 128 --quiet --history $out/$name.t$t.json >/dev/null
}
for m in ${THREADS_MODELS:-seed_mlp cnn megatron gpt}; do
  ./kdcc models/$m.json --batch-size 128 -w -o $out/$m
  for t in 1 2 3; do run $m $t 1; done
  for t in 2 3; do
    if cmp -s $out/$m.t1.json $out/$m.t$t.json; then echo "threads: $m: 1 and $t threads agree"
    else echo "threads: FAIL: $m: 1 and $t threads differ"; fail=1; fi
  done
done
./kdcc models/seed_mlp.json --distribution models/seed_mlp_dp.dist.json --mesh batch=2 \
  --batch-size 128 -w -o $out/seed_mlp_dp
for t in 1 2; do run seed_mlp_dp $t 2; done
if cmp -s $out/seed_mlp_dp.t1.json $out/seed_mlp_dp.t2.json; then echo "threads: seed_mlp on (2,): agree"
else echo "threads: FAIL: seed_mlp on (2,): 1 and 2 threads per rank differ"; fail=1; fi
[ $fail = 0 ] && echo "threads: ok"
exit $fail
