#!/usr/bin/env bash
# Property test: random small MLPs (tests/property_gen.py), each with a random
# valid layout map, compiled for three meshes (the first the one-device
# reference), trained under mpirun on synthetic data, histories compared.
#
#   PROPERTY_CASES  number of cases (default 12)
#   PROPERTY_SEED   generator seed (default fixed, so CI is reproducible)
#   PROPERTY_FIRST  index of the first case (default 0); with PROPERTY_CASES=1,
#                   regenerates one case of a seed alone
#   PROPERTY_RTOL   relative tolerance (default 1e-5, see below)
#   PROPERTY_KEEP=1 keep the run's directory even when every case passes
#
# A case fails when kdcc rejects it (the generator only draws specs that real
# Keras/JAX accept on every mesh of the case), when a program crashes or hangs,
# or when any history number differs from the reference's by more than RTOL.
# Exit status 1 if any case fails; the failing case directory and the commands
# that reproduce it are printed.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
seed=${PROPERTY_SEED:-20250611}
count=${PROPERTY_CASES:-12}
first=${PROPERTY_FIRST:-0}
# Relative tolerance. Sharding a contraction dimension changes the order of a
# float32 sum (local partial sums, then an all-reduce), so bit-equality is not
# expected; 1e-5 is the bound tests/sh/mesh_equiv.sh holds the hand-written
# models to, and the property test holds random ones to the same.
rtol=${PROPERTY_RTOL:-1e-5}
# One directory per run, so that two runs in one tree (two `make test`s) do not
# delete each other's files; removed when every case passes unless
# PROPERTY_KEEP=1, kept (and named) when one fails.
mkdir -p build/tests/property
out=$(mktemp -d build/tests/property/run.XXXXXX) || exit 1
[ -x ./kdcc ] && [ -f build/libkdrt.a ] || make kdcc build/libkdrt.a >/dev/null || exit 1
python3 tests/property_gen.py --seed "$seed" --count "$count" --first "$first" \
  --out "$out/cases" || exit 1

fail=0
failed=()
start=$SECONDS
echo "property: $count random models (seed $seed), rtol $rtol"
for dir in "$out"/cases/case_*; do
  case=$(basename "$dir")
  batch=$(cat "$dir/batch.txt")
  summary=$(cat "$dir/summary.txt")
  ref="" hists=() status="" detail=""
  mapfile -t meshes <"$dir/meshes.txt"
  for mesh in "${meshes[@]}"; do
    [ -n "$mesh" ] || continue
    tag=${mesh//[=,]/_}
    exe=$dir/train_$tag
    compile=(./kdcc "$dir/model.json" --distribution "$dir/dist.json" --mesh "$mesh"
             --batch-size "$batch" -w -o "$exe")
    "${compile[@]}" >"$exe.kdcc.log" 2>&1 </dev/null
    rc=$?
    if [ $rc -ne 0 ]; then
      status=REJECTED
      [ $rc -ge 128 ] && status=KDCC-CRASH
      detail="kdcc failed (exit $rc) on a valid case, mesh $mesh:
    ${compile[*]}
$(sed 's/^/    | /' "$exe.kdcc.log" | head -20)"
      break
    fi
    np=1
    for kv in ${mesh//,/ }; do np=$((np * ${kv#*=})); done
    run=(mpirun -np "$np" --oversubscribe "$exe" --synthetic 64 --epochs 2
         --batch-size "$batch" --quiet --history "$exe.history.json")
    timeout 120 "${run[@]}" >"$exe.run.log" 2>&1 </dev/null
    rc=$?
    if [ $rc -ne 0 ] || [ ! -s "$exe.history.json" ]; then
      status=CRASH
      [ $rc -eq 124 ] && status=HANG
      detail="training failed (exit $rc) on mesh $mesh:
    ${compile[*]}
    ${run[*]}
$(sed 's/^/    | /' "$exe.run.log" | tail -20)"
      break
    fi
    if [ -z "$ref" ]; then ref=$exe.history.json; else hists+=("$exe.history.json"); fi
  done
  if [ -z "$status" ] && [ ${#hists[@]} -lt 2 ]; then
    status=ERROR detail="fewer than three meshes ran"
  fi
  if [ -z "$status" ]; then
    if cmp=$(python3 tests/compare_history.py "$rtol" "$ref" "${hists[@]}" 2>&1); then
      worst=$(grep -o 'difference [0-9.e+-]*' <<<"$cmp" | awk '{print $2}' | sort -g | tail -1)
      status="ok (worst ${worst:-0})"
    else
      status=DIFFERS
      detail="histories differ from the one-device reference $ref:
$(sed 's/^/  /' <<<"$cmp")"
    fi
  fi
  printf '%-9s %-34s %s\n' "$case" "$(tr '\n' ' ' <"$dir/meshes.txt")" "$status"
  if [[ $status != ok* ]]; then
    fail=1
    failed+=("$case")
    echo "  case: $dir   ($summary)"
    echo "  regenerate: python3 tests/property_gen.py --seed $seed --first ${case#case_} --count 1 --out DIR"
    echo "$detail" | sed 's/^/  /'
  fi
done
echo "property: $((count - ${#failed[@]}))/$count cases passed in $((SECONDS - start))s${failed:+; failed: ${failed[*]} (kept in $out)}"
[ $fail -ne 0 ] || [ "${PROPERTY_KEEP:-0}" = 1 ] || rm -rf "$out"
exit $fail
