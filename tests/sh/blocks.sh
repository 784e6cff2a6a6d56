#!/usr/bin/env bash
# issue 25: repeated blocks (compiler/blocks.c) are written once, as a
# function of the layer l called in a loop, and compute what the flat
# program (kdcc --no-loops) computes, bit for bit.
#  - models/gpt.json (2 blocks) and the same GPT with 4, 12 and 48 blocks
#    (below: b1_'s layers again as b2_, b3_, ..., as Keras writes the model
#    built with more blocks; bench/deep_gpt.py's loop) get block_forward
#    and block_backward, each called for l over the layers, and one Adam
#    call for every variable (an update group, memplan.c: no block_update);
#  - trained on one device and on gpt.dist.json's (2,4) mesh, the 4-block
#    GPT's history is byte for byte the --no-loops program's;
#  - the 48-block GPT's program.c is at most 1.2 times the 12-block one's,
#    which is smaller than the flat program;
#  - --no-loops gives the flat program (no block function), and the CUDA
#    program has the same loops (built with nvcc when there is one);
#  - blocks that differ are not folded: Gemma 2's blocks alternate sliding
#    and global attention, so its forward and backward stay written out.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=build/tests/blocks
rm -rf $out && mkdir -p $out
fail=0

expand='
import json, sys
n = int(sys.argv[1])
d = json.load(sys.stdin)
layers = d["config"]["layers"]
block1 = [l for l in layers if l["name"].startswith("b1_")]
rest = [l for l in layers if not l["name"].startswith("b1_")]
at = [l["name"] for l in rest].index("ln_f")
new = rest[:at]
for i in range(1, n):
    text = json.dumps(block1).replace("\"b1_", "\"b%d_" % i).replace("\"b0_add2\"", "\"b%d_add2\"" % (i - 1))
    new += json.loads(text)
d["config"]["layers"] = new + json.loads(json.dumps(rest[at:]).replace("\"b1_add2\"", "\"b%d_add2\"" % (n - 1)))
json.dump(d, sys.stdout, indent=1)
'
for n in 2 4 12 48; do python3 -c "$expand" $n < models/gpt.json > $out/gpt$n.json; done
cmp -s <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])))' $out/gpt2.json) \
       <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])))' models/gpt.json) ||
  { echo "FAIL blocks: the 2-block expansion is not models/gpt.json"; exit 1; }

# The loops of an L-block GPT's program: each block function called for l over the layers.
loops() { # program, L
  local p=$1 L=$2 last=$(($2 - 1))
  grep -q "^static void block_forward(" $p && grep -q "^static void block_backward(" $p &&
    grep -A1 "for (int l = 0; l <= $last; l++)" $p | grep -q "block_forward(" &&
    grep -A1 "for (int l = $last; l >= 0; l--)" $p | grep -q "block_backward(" &&
    ! grep -q "block_update(" $p && [ "$(grep -c "^ *kdrt_\(cuda_\)\?adam(" $p)" = 1 ] &&
    grep -q "update group 1: $((6 + 16 * L)) variables" $p
}

for n in 2 4; do
  for mesh in data=1,model=1 data=2,model=4; do
    tag=gpt${n}_${mesh//[=,]/_}
    args=($out/gpt$n.json --distribution models/gpt.dist.json --mesh $mesh --batch-size 16 -w)
    ./kdcc "${args[@]}" -S $out/$tag.a && ./kdcc "${args[@]}" -S $out/$tag.b
    cmp -s $out/$tag.a/program.c $out/$tag.b/program.c ||
      { echo "FAIL $tag: program.c differs between two runs"; fail=1; }
    mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime $out/$tag.a/program.c
    loops $out/$tag.a/program.c $n || { echo "FAIL $tag: no block loops"; fail=1; }
    ./kdcc "${args[@]}" --no-loops -S $out/$tag.flat
    ! grep -q "block_forward" $out/$tag.flat/program.c ||
      { echo "FAIL $tag: --no-loops still has block functions"; fail=1; }
    ./kdcc "${args[@]}" --target cuda -S $out/$tag.cuda
    loops $out/$tag.cuda/program.cu $n || { echo "FAIL $tag: no block loops in program.cu"; fail=1; }
    echo "blocks: $tag: block_forward, block_backward for l = 0 .. $((n - 1)), one Adam call (C and CUDA)"
  done
done

# The same numbers: the 4-block GPT trained with and without loops.
for mesh in data=1,model=1 data=2,model=4; do
  tag=gpt4_${mesh//[=,]/_}
  np=1
  for kv in ${mesh//,/ }; do np=$((np * ${kv#*=})); done
  for v in loops flat; do
    flag=(); [ $v = flat ] && flag=(--no-loops)
    ./kdcc $out/gpt4.json --distribution models/gpt.dist.json --mesh $mesh --batch-size 16 -w \
      "${flag[@]}" -o $out/$tag.$v.train
    timeout 300 mpirun -np $np --oversubscribe $out/$tag.$v.train --synthetic 62 --validation-split 0.27 \
      --epochs 2 --batch-size 16 --quiet --history $out/$tag.$v.json
  done
  if cmp -s $out/$tag.loops.json $out/$tag.flat.json; then
    echo "blocks: $tag: trained with loops and with --no-loops, the same history byte for byte"
  else
    echo "FAIL $tag: the histories differ:"; diff $out/$tag.loops.json $out/$tag.flat.json; fail=1
  fi
done

# Sizes: 48 blocks at most 1.2 times 12, and 12 smaller than written out.
for n in 12 48; do
  ./kdcc $out/gpt$n.json --batch-size 16 -w -S $out/gpt$n.loops
  ./kdcc $out/gpt$n.json --batch-size 16 -w --no-loops -S $out/gpt$n.flat
  loops $out/gpt$n.loops/program.c $n || { echo "FAIL gpt$n: no block loops"; fail=1; }
done
s12=$(stat -c %s $out/gpt12.loops/program.c) s48=$(stat -c %s $out/gpt48.loops/program.c)
f12=$(stat -c %s $out/gpt12.flat/program.c) f48=$(stat -c %s $out/gpt48.flat/program.c)
mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime $out/gpt48.loops/program.c
if [ $((s48 * 10)) -le $((s12 * 12)) ] && [ $s12 -lt $f12 ]; then
  echo "blocks: program.c of 12 blocks $s12 bytes (written out $f12), 48 blocks $s48 (written out $f48)"
else
  echo "FAIL sizes: 12 blocks $s12 bytes (flat $f12), 48 blocks $s48 (flat $f48): want 48 <= 1.2 x 12 < flat"
  fail=1
fi

# Blocks that differ stay apart: Gemma 2's windows alternate (blocks 0 and 2 sliding, 1 global).
g=tests/fixtures/keras_hub/hub_gemma2_sw
./kdcc $g/model.keras --distribution $g/hub_gemma2_sw.dist.json --sequence-length 16 --batch-size 16 \
  -w -S $out/gemma2
if grep -q "block_forward\|block_backward" $out/gemma2/program.c; then
  echo "FAIL gemma2_sw: blocks of different attention folded into one"; fail=1
else
  echo "blocks: hub_gemma2_sw: its sliding and global blocks are written out, not folded"
fi

# nvcc, when there is one: the 4-block GPT's CUDA program builds without a warning.
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}
if [ -n "$NVCC" ]; then
  export PATH="$(dirname "$NVCC"):$PATH"
  make -s -j"$(nproc)" cuda NVCC="$NVCC" # the CUDA runtime, as cuda_build.sh builds it
  if ./kdcc $out/gpt4.json --distribution models/gpt.dist.json --batch-size 16 -w --target cuda \
       -o $out/gpt4_cuda >$out/gpt4_cuda.log 2>&1 && ! grep -qi warning $out/gpt4_cuda.log; then
    echo "blocks: gpt4: the CUDA program builds without warnings"
  else
    echo "FAIL gpt4: the CUDA program:"; cat $out/gpt4_cuda.log; fail=1
  fi
else
  echo "blocks: skipping the CUDA build (no nvcc)"
fi
exit $fail
