#!/usr/bin/env bash
# Generated C is for people too: two compilations of the same model give
# the same text, and every bundled model's program compiles warning-free
# with -Wall -Wextra -Werror (-pedantic too) for several meshes.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=build/tests/emit_c
mkdir -p $out
for m in seed_mlp func_branches cnn megatron wide_mlp; do
  for mesh in "" "--mesh data=2,model=4"; do
    [ -n "$mesh" ] && [ $m = wide_mlp ] && continue
    dist=models/$m.dist.json
    ./kdcc models/$m.json --distribution $dist $mesh --batch-size 16 -w -S $out/a
    ./kdcc models/$m.json --distribution $dist $mesh --batch-size 16 -w -S $out/b
    cmp -s $out/a/program.c $out/b/program.c || { echo "FAIL $m $mesh: output differs between runs"; exit 1; }
    mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime \
      $out/a/program.c
    echo "emit_c: $m ${mesh:-(spec mesh)}: deterministic, compiles with -Wall -Wextra -Werror -pedantic"
  done
done
# issue 11: a learning-rate schedule's table (CosineDecay, PiecewiseConstantDecay), Adagrad's
# first accumulator in init(), the clipping calls
for m in opt_nadam_global opt_rmsprop_centered opt_adagrad_clipnorm; do
  ./kdcc tests/good/$m.json --distribution tests/good/opt.dist.json --batch-size 16 -w -S $out/a
  ./kdcc tests/good/$m.json --distribution tests/good/opt.dist.json --batch-size 16 -w -S $out/b
  cmp -s $out/a/program.c $out/b/program.c || { echo "FAIL $m: output differs between runs"; exit 1; }
  mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime $out/a/program.c
  echo "emit_c: $m: deterministic, compiles with -Wall -Wextra -Werror -pedantic"
done
# issue 15: batch norm (three passes, a ReLU fused after it); its batch
# statistics are training's alone, so evaluate and predict skip them: every
# forward kdrt_bn_stats call is under `if (step == TRAIN_STEP || step == GRAD_STEP)`
./kdcc tests/gradcheck/batchnorm.json --distribution tests/good/batchnorm.dist.json \
  --mesh data=2,model=4 --batch-size 16 -w -S $out/a
mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime $out/a/program.c
fwd=$(awk '/^static void forward/ {f = 1} /^static void backward/ {f = 0} f' $out/a/program.c)
n=$(grep -c "kdrt_bn_stats(" <<<"$fwd")
guarded=$(grep -B1 "kdrt_bn_stats(" <<<"$fwd" | grep -c "if (step == TRAIN_STEP || step == GRAD_STEP)")
[ "$n" = 4 ] && [ "$guarded" = 4 ] ||
  { echo "FAIL batchnorm: $guarded of $n forward bn_stats calls are training-only (want 4 of 4)"; exit 1; }
echo "emit_c: batchnorm: compiles with -Wall -Wextra -Werror -pedantic; its 4 statistics passes run in training only"
# issue 15: grouped and depthwise convs, one window each with its local share of the groups
for mesh in data=4,model=2 data=2,model=4; do
  ./kdcc tests/gradcheck/grouped.json --distribution tests/good/grouped.dist.json --mesh $mesh \
    --batch-size 16 -w -S $out/a
  ./kdcc tests/gradcheck/grouped.json --distribution tests/good/grouped.dist.json --mesh $mesh \
    --batch-size 16 -w -S $out/b
  cmp -s $out/a/program.c $out/b/program.c || { echo "FAIL grouped $mesh: output differs"; exit 1; }
  mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime $out/a/program.c
  echo "emit_c: grouped $mesh: deterministic, compiles with -Wall -Wextra -Werror -pedantic"
done
# Attention's scale, causal mask and softmax are one pass each way
# (fuse.c): the GPT's two blocks call attn_softmax and attn_softmax_grad
# once each (written out, --no-loops; issue 25's block functions hold one
# each, called for both layers: tests/sh/blocks.sh), and neither
# causal_mask nor a scale of the scores is left.
for loops in "" --no-loops; do
  ./kdcc models/gpt.json --distribution models/gpt.dist.json --batch-size 16 -w $loops -S $out/a
  mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime $out/a/program.c
  f=$(grep -c "kdrt_attn_softmax(" $out/a/program.c); b=$(grep -c "kdrt_attn_softmax_grad(" $out/a/program.c)
  c=$(grep -c "kdrt_causal_mask(\|kdrt_softmax(" $out/a/program.c || true)
  want=1; [ -n "$loops" ] && want=2
  [ "$f" = $want ] && [ "$b" = $want ] && [ "$c" = 0 ] ||
    { echo "FAIL gpt $loops: attn_softmax $f, attn_softmax_grad $b (want $want, $want); causal_mask or softmax calls left: $c"; exit 1; }
done
echo "emit_c: gpt: attention's scale, mask and softmax fused both ways"
# issue 25: LayerNormalization is one call each way (fuse.c's
# fuse_layer_norm): the GPT's 5 (2 a block and the last; --no-loops) are
# layer_norm, layer_norm_dx and layer_norm_dw, no norm or col_mul left. Under
# Megatron's layout (gpt.dist.json) a block's dy is a partial sum over
# 'model', multiplied by g before its all-reduce as before: those 4 keep
# col_mul, the all-reduce and norm_grad.
for dist in "" models/gpt.dist.json; do
  ./kdcc models/gpt.json ${dist:+--distribution $dist} --batch-size 16 -w --no-loops -S $out/a
  n=$(for f in layer_norm layer_norm_dx layer_norm_dw norm norm_grad col_mul; do
    grep -c "kdrt_$f(" $out/a/program.c || true; done | tr '\n' ' ')
  want="5 5 5 0 0 0 "; [ -n "$dist" ] && want="5 1 5 0 4 4 "
  [ "$n" = "$want" ] ||
    { echo "FAIL gpt $dist: layer_norm, _dx, _dw, norm, norm_grad, col_mul calls: $n(want $want)"; exit 1; }
done
echo "emit_c: gpt: layer normalization one call each way (Megatron's: dx as before)"
# issue 25: a literal that is a layer's Keras hyper-parameter is named where a
# call reads it (#define BL_LN1_EPSILON ... // b<l>_ln1: LayerNormalization(epsilon=0.001),
# one name a block's role), a norm's kind is KDRT_NORM_LAYER or _RMS, not 0 or 1,
# and the locals every function of a step begins with are one macro, defined once.
./kdcc models/gpt.json --batch-size 16 -w -S $out/a
p=$out/a/program.c
kind=$(grep -cE "kdrt_(layer_norm|layer_norm_dx|layer_norm_dw|norm|norm_grad)\([01]," $p || true)
eps=$(grep -cE "kdrt_(layer_norm|layer_norm_dx|layer_norm_dw)\(.*, -?[0-9][0-9.e+-]*f\);" $p || true)
scale=$(grep -cE "const float scale = |kdrt_attn_softmax(_grad)?\(.*, [0-9][0-9.e+-]*f, [01]\);" $p || true)
named=$(grep -cE "^#define (BL_LN1_EPSILON|BL_LN2_EPSILON|LN_F_EPSILON|BL_ATTN_SCALE) " $p || true)
rows=$(grep -c "const int64_t B = " $p || true)
parts=$(grep -c "^  PART_LOCALS;$" $p || true)
[ "$kind$eps$scale" = 000 ] && [ "$named" = 4 ] && [ "$rows" = 1 ] && [ "$parts" -ge 5 ] ||
  { echo "FAIL gpt: bare norm kinds $kind, epsilons $eps, scales $scale; named $named (want 4);" \
      "rows written $rows times (want 1, in STEP_ROWS); parts with PART_LOCALS $parts"; exit 1; }
for m in pact noise_norms batchnorm losses_reg; do
  ./kdcc tests/gradcheck/$m.json --batch-size 16 -w -S $out/a
  mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime $out/a/program.c
  # a float literal argument other than 0.0f and 1.0f (no hyper-parameters)
  bare=$(grep -cP 'kdrt_(pact|dropout|gaussian_noise|batch_norm|bn_grad|ema|norm|norm_grad|loss|loss_grad)\(.*[ (](?!0\.0f|1\.0f)-?\d[\d.e+-]*f[,)]' \
    $out/a/program.c || true)
  [ "$bare" = 0 ] || { echo "FAIL $m: $bare calls with a bare hyper-parameter"; exit 1; }
done
echo "emit_c: gpt, pact, noise_norms, batchnorm, losses_reg: hyper-parameters named, one preamble"
