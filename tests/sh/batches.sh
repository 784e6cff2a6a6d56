#!/usr/bin/env bash
# batches.sh: the batch size is chosen at run time, and every sample is used.
#
#  1. `--batch-size B` on a program compiled for another batch equals a
#     program compiled for B: a program for 16 run with 12, with 5 (rows
#     that divide over no batch axis, so every step splits them unevenly)
#     and with 40 (more than it was compiled for) gives, on meshes of 1,
#     2x4 and 8x1 devices, the history of a one-device program compiled for
#     that batch, within 1e-5;
#  2. a batch larger than the compiled one (40 on a program for 16) replays
#     the memory plan for its rows when the program starts (kdrt_arena_plan)
#     and equals a program compiled for 40 alike; a program without a plan
#     (CUDA's, rt_fit.sh's) refuses it, naming the kdcc flag (rt_fit.sh);
#  3. a program that splits a batch dimension over 'model' (the layout map
#     puts d2's output rows there) takes only rows that divide by its size:
#     a last batch of 13 rows is refused before training, naming the axis;
#     rows that divide run.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 KDRT_PROGRESS=plain

make -s kdcc build/libkdrt.a || exit 1
T=build/tests/batches
rm -rf "$T" && mkdir -p "$T"
fails=0
fail() { echo "batches.sh: FAIL: $*" >&2; fails=$((fails + 1)); }
. tests/lib.sh # expect

# run NP EXE ARGS...: output in $T/out, status in $rc
run() {
  local np=$1 exe=$2
  shift 2
  timeout 300 mpirun -np "$np" "$T/$exe" "$@" >"$T/out" 2>&1
  rc=$?
}
DATA=(--synthetic 61 --validation-split 0.2 --epochs 2 --quiet)

# 1. run-time batch sizes
for m in seed_mlp cnn; do
  for mesh in data=1,model=1 data=2,model=4 data=8,model=1; do
    ./kdcc models/$m.json --distribution models/$m.dist.json --mesh $mesh --batch-size 16 -w \
      -o "$T/${m}_$mesh" || exit 1
  done
  for bs in 12 5 40; do
    ./kdcc models/$m.json --distribution models/$m.dist.json --mesh data=1,model=1 \
      --batch-size $bs -w -o "$T/${m}_ref$bs" || exit 1
    name="$m compiled for $bs"; run 1 ${m}_ref$bs "${DATA[@]}" --history "$T/ref.json"; expect 0
    for mesh in data=1,model=1 data=2,model=4 data=8,model=1; do
      np=$(( $(echo $mesh | sed -E 's/data=([0-9]+),model=([0-9]+)/\1 * \2/') ))
      name="$m compiled for 16 on $mesh, run with --batch-size $bs"
      run $np ${m}_$mesh "${DATA[@]}" --batch-size $bs --history "$T/got.json"
      expect 0
      python3 tests/compare_history.py 1e-5 "$T/ref.json" "$T/got.json" || fail "$name: history"
    done
  done
done

# 2. more rows than the compiled plan holds: 40 above (part 1), and rows
# that divide over no batch axis
name="batch larger than compiled, uneven"; run 8 seed_mlp_data=8,model=1 --batch-size 17 --synthetic 64
expect 0

# 3. a batch dimension split over 'model'
./kdcc models/seed_mlp.json --distribution tests/good/seed_mlp_batch_model.dist.json \
  --batch-size 16 -w -o "$T/bm" || exit 1
grep -q 'if (B % 4) { kdrt_rows_refused(c, B, 4, "model"); return; }' "$T/bm.kdcc.d/program.c" ||
  fail "no row check in the generated step"
name="rows refused"; run 8 bm --synthetic 61 --epochs 1
expect 1 "bm: the last training batch of 13 rows cannot run: this program splits a batch dimension over mesh axis 'model' (4 devices), which 13 rows do not divide; choose a --batch-size (and a sample count) that it divides, or --drop-remainder"
grep -q "Epoch 1" "$T/out" && fail "$name: training started"
name="rows that divide"; run 8 bm --synthetic 64 --epochs 1 --batch-size 12
expect 0 "6/6"
name="rows refused, batch 12 over 4"; run 8 bm --synthetic 61 --epochs 1 --batch-size 12
expect 1 "the last training batch of 1 rows cannot run"

[ "$fails" = 0 ] && echo "batches.sh: ok" && exit 0
echo "batches.sh: $fails failures" >&2
exit 1
