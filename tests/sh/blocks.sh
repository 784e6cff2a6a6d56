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
#  - a per-layer constant is a table indexed by l: the GPT with its
#    attention's dropout 0.1 (each layer's random stream its own,
#    BL_ATTN_STREAM[l]) folds, trains to the --no-loops history byte for
#    byte (one device and (2,4)) and to another than without dropout, and
#    its 48 blocks' program.c is at most 1.2 times 12's; Gemma 2's blocks,
#    sliding and global attention in turn, fold with the window a table
#    ({4, 0, 4}) and train to the --no-loops history; Gemma 3's, five local
#    blocks to one global, fold with the rotary embedding's descriptor a
#    table too (each distinct one named once, the table pointers to them);
#  - keras-hub backbones fold: GPT-2, Llama and Gemma 2 presets of 12 and 48
#    layers (a fixture's config, num_layers changed), 48 at most 1.2 times
#    12, with LoRA too (forward, backward but layer 0's: the frozen
#    embeddings need no gradient, and each layer's update groups, parted by
#    the frozen kernels, in block_update); LoRA programs train to the
#    --no-loops history (a fixture, and 4-layer GPT-2 and Gemma 2 presets);
#  - `./train generate`'s decode and prefill steps fold too (each layer's
#    caches read at a fixed stride in the step's inputs), and give the
#    --no-loops steps' tokens and outputs bit for bit (tests/decode_tap.c).
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
python3 -c '
import json, sys
d = json.load(sys.stdin)
for l in d["config"]["layers"]:
    if l["class_name"] == "MultiHeadAttention": l["config"]["dropout"] = 0.1
json.dump(d, sys.stdout, indent=1)' < models/gpt.json > $out/gptd.json
for n in 4 12 48; do python3 -c "$expand" $n < $out/gptd.json > $out/gptd$n.json; done
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

for m in gpt2 gpt4 gptd4; do
  n=${m#gpt} && n=${n#d}
  for mesh in data=1,model=1 data=2,model=4; do
    tag=${m}_${mesh//[=,]/_}
    args=($out/$m.json --distribution models/gpt.dist.json --mesh $mesh --batch-size 16 -w)
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

# The dropout GPT's block functions read each layer's stream from its table.
for p in $out/gptd4_data_2_model_4.a/program.c $out/gptd4_data_2_model_4.cuda/program.cu; do
  if grep -q "^static const uint64_t BL_ATTN_STREAM\[4\] = {" $p &&
     [ "$(sed -n '/^static void block_forward(/,/^}/p' $p | grep -c "BL_ATTN_STREAM\[l\]")" = 1 ] &&
     [ "$(sed -n '/^static void block_backward(/,/^}/p' $p | grep -c "BL_ATTN_STREAM\[l\]")" = 1 ]; then
    echo "blocks: gptd4: each layer's dropout stream, BL_ATTN_STREAM[l], in both block functions ($(basename $p))"
  else
    echo "FAIL gptd4: no stream table by layer in $p"; fail=1
  fi
done
# In a block's function buffers are named by layer and role, as llm.c's, l the index.
# (grep -c, not -q, which would stop reading and leave sed a broken pipe)
if sed -n '/^static void block_forward(/,/^}/p' $out/gptd4_data_1_model_1.a/program.c | grep -c \
     "kdrt_attn_softmax((A + A[0-9]*_bl_attn_probs + l \* B \* 1024), (A + A[0-9]*_bl_attn_scores), .*BL_ATTN_SCALE" \
     >/dev/null; then
  echo "blocks: gptd4: block_forward names the attention's scores, probs and scale by role and l"
else
  echo "FAIL gptd4: block_forward's attention buffers are not named by role"; fail=1
fi

# The same numbers: the 4-block GPT, and with dropout, trained with and without loops.
for m in gpt4 gptd4; do
  for mesh in data=1,model=1 data=2,model=4; do
    tag=${m}_${mesh//[=,]/_}
    np=1
    for kv in ${mesh//,/ }; do np=$((np * ${kv#*=})); done
    for v in loops flat; do
      flag=(); [ $v = flat ] && flag=(--no-loops)
      ./kdcc $out/$m.json --distribution models/gpt.dist.json --mesh $mesh --batch-size 16 -w \
        "${flag[@]}" -o $out/$tag.$v.train
      timeout 300 mpirun -np $np --oversubscribe $out/$tag.$v.train --synthetic 62 --validation-split 0.27 \
        --epochs 2 --batch-size 16 --quiet --history $out/$tag.$v.json
    done
    if cmp -s $out/$tag.loops.json $out/$tag.flat.json; then
      echo "blocks: $tag: trained with loops and with --no-loops, the same history byte for byte"
    else
      echo "FAIL $tag: the histories differ:"; diff $out/$tag.loops.json $out/$tag.flat.json || true; fail=1
    fi
  done
done
for mesh in data_1_model_1 data_2_model_4; do # the dropout draws: not dropout 0's history
  ! cmp -s $out/gpt4_$mesh.loops.json $out/gptd4_$mesh.loops.json ||
    { echo "FAIL gptd4_$mesh: dropout 0.1 trains to the history of dropout 0"; fail=1; }
done

# Sizes: 48 blocks at most 1.2 times 12, and 12 smaller than written out.
sizes() { # name, then the model and flags, {} standing for the blocks
  local name=$1 n s12 s48 f12 f48
  shift
  for n in 12 48; do
    ./kdcc "${@//\{\}/$n}" --batch-size 16 -w -S $out/$name$n.loops
    ./kdcc "${@//\{\}/$n}" --batch-size 16 -w --no-loops -S $out/$name$n.flat
    folded $out/$name$n.loops/program.c $((n - 1)) ${first:-0} || { echo "FAIL $name$n: no block loops"; fail=1; }
  done
  s12=$(stat -c %s $out/${name}12.loops/program.c) s48=$(stat -c %s $out/${name}48.loops/program.c)
  f12=$(stat -c %s $out/${name}12.flat/program.c) f48=$(stat -c %s $out/${name}48.flat/program.c)
  mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime $out/${name}48.loops/program.c
  if [ $((s48 * 10)) -le $((s12 * 12)) ] && [ $s12 -lt $f12 ]; then
    echo "blocks: $name: program.c of 12 blocks $s12 bytes (written out $f12), 48 blocks $s48 (written out $f48)"
  else
    echo "FAIL $name: 12 blocks $s12 bytes (flat $f12), 48 blocks $s48 (flat $f48): want 48 <= 1.2 x 12 < flat"
    fail=1
  fi
}
# block_forward for l = 0 .. last, block_backward for l = last .. first
folded() { # program, last, first
  grep -A1 "for (int l = 0; l <= $2; l++)" $1 | grep -q "block_forward(" &&
    grep -A1 "for (int l = $2; l >= $3; l--)" $1 | grep -q "block_backward("
}
sizes gpt $out/gpt{}.json
for n in 12 48; do loops $out/gpt$n.loops/program.c $n || { echo "FAIL gpt$n: no block loops"; fail=1; }; done
sizes gptd $out/gptd{}.json

# Gemma 2's blocks alternate sliding (0 and 2) and global (1) attention: one
# block, the window a table by layer, the same history as written out.
g=tests/fixtures/keras_hub/hub_gemma2_sw
for v in loops flat; do
  flag=(); [ $v = flat ] && flag=(--no-loops)
  args=($g/model.keras --distribution $g/hub_gemma2_sw.dist.json --sequence-length 16 --batch-size 16 -w)
  ./kdcc "${args[@]}" "${flag[@]}" -S $out/gemma2.$v
  ./kdcc "${args[@]}" "${flag[@]}" -o $out/gemma2.$v.train
  timeout 300 mpirun -np 8 --oversubscribe $out/gemma2.$v.train --x $g/padding_mask.npy \
    --x $g/token_ids.npy --y $g/y.npy --epochs 2 --batch-size 16 --no-shuffle --weights $g/model.keras \
    --quiet --history $out/gemma2.$v.json
done
p=$out/gemma2.loops/program.c
if grep -q "^static const int64_t [A-Z_]*_WINDOW\[3\] = {4, 0, 4};" $p && folded $p 2 0 &&
   sed -n '/^static void block_forward(/,/^}/p' $p | grep -c "_WINDOW\[l\]" >/dev/null &&
   cmp -s $out/gemma2.loops.json $out/gemma2.flat.json; then
  echo "blocks: hub_gemma2_sw: sliding and global blocks one loop (the window {4, 0, 4}[l]), the" \
       "--no-loops history; program.c $(stat -c %s $p) bytes (written out $(stat -c %s $out/gemma2.flat/program.c))"
else
  echo "FAIL hub_gemma2_sw: its blocks not folded with the window by layer, or the histories differ"; fail=1
fi

# keras-hub presets of 12 and 48 layers: a fixture's config, num_layers changed.
deep() { # fixture, layers, directory[, dropout]
  mkdir -p $3 && cp tests/fixtures/keras_hub/$1/preset/metadata.json $3/
  python3 -c '
import json, sys
src, n, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = json.load(open(src + "/config.json"))
c["config"]["num_layers"] = n
if len(sys.argv) > 4: c["config"]["dropout"] = float(sys.argv[4])
t = json.load(open(src + "/task.json"))
t["config"]["backbone"] = c
json.dump(c, open(dst + "/config.json", "w"), indent=1)
json.dump(t, open(dst + "/task.json", "w"), indent=1)' tests/fixtures/keras_hub/$1/preset $2 $3 ${4:-}
}
for c in hub_gpt2 hub_llama hub_gemma2_sw; do
  for n in 12 48; do deep $c $n $out/$c.$n; done
  sizes $c $out/$c.{} --sequence-length 16
  first=1 sizes $c.lora $out/$c.{} --sequence-length 16 --lora-rank 4
  grep -A1 "for (int l = 0; l <= 47; l++)" $out/$c.lora48.loops/program.c | grep -q "block_update(" ||
    { echo "FAIL $c with LoRA: its layers' updates not folded"; fail=1; }
done
# Gemma 3: five local blocks to one global, their rotary frequencies and
# windows apart, one loop (the descriptors a table of pointers by layer,
# two distinct ones), 48 at most 1.2 times 12 (no LoRA: kdcc refuses it).
for n in 12 48; do deep hub_gemma3 $n $out/hub_gemma3.$n; done
sizes hub_gemma3 $out/hub_gemma3.{} --sequence-length 16
if [ "$(grep -c "^static const kdrt_rotary [A-Z_0-9]* = {" $out/hub_gemma348.loops/program.c)" = 2 ] &&
   grep -q "^static const kdrt_rotary \*const [A-Z_]*_ROPE\[48\] = {" $out/hub_gemma348.loops/program.c; then
  echo "blocks: hub_gemma3: 48 layers, two rotary descriptors (local, global) and a table of 48"
else
  echo "FAIL hub_gemma3: its rotary descriptors are not two and a table by layer"; fail=1
fi

# `./train generate`: the decode and prefill steps' blocks are loops too
# (layer l's key and value caches the step inputs x[i + 2 * l] and
# x[i + 1 + 2 * l]: one write of each in the block's function, not one a
# layer), written out with
# --no-loops, and both give the same tokens and every step's output bit for
# bit (tests/decode_tap.c appends each prefill and decode step's output to
# $KDRT_TAP): the 4-block GPT on one device and on (2,4) (heads split),
# Gemma 2's sliding and global blocks (the window {4, 0, 4}[l]) on the
# fixture's (2,4), Gemma 3's 12 (the rotary descriptors by layer).
tap="mpicc $PWD/tests/decode_tap.c -Wl,--wrap=kdrt_main"
generate_both() { # tag, ranks, layers, kdcc's model and flags
  local tag=$1 np=$2 L=$3 v f run
  shift 3
  for v in loops flat; do
    flag=(); [ $v = flat ] && flag=(--no-loops)
    KDCC_CC=$tap ./kdcc "$@" --batch-size 8 -w "${flag[@]}" -o $out/$tag.$v.gen
    rm -f $out/$tag.$v.tap
    for run in "--prompt-ids 5,9,2;7 --tokens 6 --temperature 0" \
               "--prompt-ids 1 --tokens 9 --temperature 0.8 --top-k 8 --samples 3 --seed 7"; do
      KDRT_TAP=$out/$tag.$v.tap timeout 300 mpirun -np $np --oversubscribe $out/$tag.$v.gen generate \
        $run -q >>$out/$tag.$v.tokens
    done
  done
  local d=$out/$tag.loops.gen.kdcc.d e=$out/$tag.flat.gen.kdcc.d ok=1
  for f in decode prefill; do # each cache written by one call of the block's, or one a layer
    local k='kdrt_place_block((float \*)((const float \*)x\['
    [ $f = prefill ] && k='kdrt_copy((float \*)((const float \*)x\['
    grep -q "^static void block_forward(" $d/$f.c && grep -A1 "for (int l = 0; l <= $((L - 1)); l++)" \
      $d/$f.c | grep -q "block_forward(" && [ "$(grep -c "$k" $d/$f.c)" = 2 ] &&
      [ "$(grep -c "$k[0-9]* + 2 \* l\]" $d/$f.c)" = 2 ] && ! grep -q "block_forward" $e/$f.c &&
      [ "$(grep -c "$k" $e/$f.c)" = $((2 * L)) ] || ok=0
  done
  if [ $ok = 1 ] && [ -s $out/$tag.loops.tap ] && cmp -s $out/$tag.loops.tap $out/$tag.flat.tap &&
     cmp -s $out/$tag.loops.tokens $out/$tag.flat.tokens; then
    echo "blocks: $tag: decode.c and prefill.c one loop over $L layers ($(wc -l <$d/decode.c) and" \
         "$(wc -l <$d/prefill.c) lines; written out $(wc -l <$e/decode.c), $(wc -l <$e/prefill.c))," \
         "the same tokens and step outputs ($(stat -c %s $out/$tag.loops.tap) bytes) bit for bit"
  else
    echo "FAIL $tag: generate's steps not one loop each, or not --no-loops's tokens and outputs"
    fail=1
  fi
}
generate_both gpt4_gen 1 4 $out/gpt4.json
generate_both gpt4_gen_mesh 8 4 $out/gpt4.json --distribution models/gpt.dist.json --mesh data=2,model=4
g=tests/fixtures/keras_hub/hub_gemma2_sw
generate_both gemma2_gen 8 3 $g/model.keras --distribution $g/hub_gemma2_sw.dist.json --sequence-length 16
sed -n '/^static void block_forward(/,/^}/p' $out/gemma2_gen.loops.gen.kdcc.d/decode.c |
  grep -c "kdrt_causal_mask(.*_WINDOW\[l\]" >/dev/null ||
  { echo "FAIL gemma2_gen: the decode step's window is not a table by layer"; fail=1; }
generate_both gemma3_gen 1 12 $out/hub_gemma3.12 --sequence-length 16
sed -n '/^static void block_forward(/,/^}/p' $out/gemma3_gen.loops.gen.kdcc.d/decode.c |
  grep -c "kdrt_rope(.*_ROPE\[l\]" >/dev/null ||
  { echo "FAIL gemma3_gen: the decode step's rotary descriptors are not a table by layer"; fail=1; }

# LoRA's updates: two groups a layer (frozen kernels part them), block_update
# a loop over the layers; trained from kdcc's initial values, 4 layers, on
# (2,4) under the fixture's layout map, the --no-loops history (GPT-2 with
# keras-hub's default dropout, 0.1: three streams a layer, each a table).
for c in hub_gpt2 hub_gemma2_sw; do
  deep $c 4 $out/$c.4 $([ $c = hub_gpt2 ] && echo 0.1)
  for v in loops flat; do
    flag=(); [ $v = flat ] && flag=(--no-loops)
    ./kdcc $out/$c.4 --distribution tests/fixtures/keras_hub/$c/$c.dist.json --sequence-length 16 \
      --lora-rank 4 --batch-size 16 -w "${flag[@]}" -o $out/$c.4.$v.train
    timeout 300 mpirun -np 8 --oversubscribe $out/$c.4.$v.train --synthetic 40 --epochs 2 --batch-size 16 \
      --quiet --history $out/$c.4.$v.json
  done
  if grep -q "^static void block_update(" $out/$c.4.loops.train.kdcc.d/program.c &&
     { [ $c != hub_gpt2 ] || [ "$(grep -c "^static const uint64_t .*_STREAM\[4\]" $out/$c.4.loops.train.kdcc.d/program.c)" = 3 ]; } &&
     cmp -s $out/$c.4.loops.json $out/$c.4.flat.json; then
    echo "blocks: $c, 4 layers, LoRA, (2,4): block_update, and the --no-loops history byte for byte"
  else
    echo "FAIL $c, 4 layers, LoRA, (2,4): no block_update, or the histories differ"; fail=1
  fi
done
g=tests/fixtures/keras_hub/hub_gpt2_lora
for v in loops flat; do
  flag=(); [ $v = flat ] && flag=(--no-loops)
  ./kdcc $g/model.keras --distribution $g/hub_gpt2_lora_dp.dist.json --sequence-length 16 --lora-rank 4 \
    --batch-size 16 -w "${flag[@]}" -o $out/gpt2_lora.$v.train
  timeout 300 mpirun -np 8 --oversubscribe $out/gpt2_lora.$v.train --x $g/padding_mask.npy \
    --x $g/token_ids.npy --y $g/y.npy --epochs 2 --batch-size 16 --no-shuffle --weights $g/model.keras \
    --lora-weights $g/initial.lora.h5 --quiet --history $out/gpt2_lora.$v.json
done
if cmp -s $out/gpt2_lora.loops.json $out/gpt2_lora.flat.json; then
  echo "blocks: hub_gpt2_lora_dp: trained with loops and with --no-loops, the same history byte for byte"
else
  echo "FAIL hub_gpt2_lora_dp: the histories differ"; fail=1
fi

# nvcc, when there is one: the CUDA programs build without a warning (the
# 4-block GPT, with dropout, Gemma 2's windows, the LoRA GPT-2's block_update,
# Gemma 3's rotary descriptors by layer).
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}
if [ -n "$NVCC" ]; then
  export PATH="$(dirname "$NVCC"):$PATH"
  make -s -j"$(nproc)" cuda NVCC="$NVCC" # the CUDA runtime, as cuda_build.sh builds it
  g=tests/fixtures/keras_hub/hub_gemma2_sw
  for c in "gpt4 $out/gpt4.json --distribution models/gpt.dist.json" \
           "gptd4 $out/gptd4.json --distribution models/gpt.dist.json" \
           "gemma2 $g/model.keras --distribution $g/hub_gemma2_sw.dist.json --sequence-length 16" \
           "gpt2_lora $out/hub_gpt2.4 --sequence-length 16 --lora-rank 4" \
           "gemma3 $out/hub_gemma3.12 --sequence-length 16"; do
    set -- $c
    name=$1 && shift
    if ./kdcc "$@" --batch-size 16 -w --target cuda -o $out/${name}_cuda >$out/${name}_cuda.log 2>&1 &&
       ! grep -qi warning $out/${name}_cuda.log; then
      echo "blocks: $name: the CUDA program builds without warnings"
    else
      echo "FAIL $name: the CUDA program:"; cat $out/${name}_cuda.log; fail=1
    fi
  done
else
  echo "blocks: skipping the CUDA build (no nvcc)"
fi
exit $fail
