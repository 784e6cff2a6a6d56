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
