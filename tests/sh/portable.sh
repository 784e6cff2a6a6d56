#!/usr/bin/env bash
# portable.sh: a program compiled from a .keras archive does not depend on
# the archive's path. kdcc copies the archive beside the program
# (<program>.kdcc.d/model.keras); the program starts from that copy, so it
# runs after the archive is deleted and after the program and its .kdcc.d
# directory move together, with the same numbers; predict and
# --save-weights .keras (which needs the archive's config.json) too. With
# neither the copy nor the archive left, it says so and what to do.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin portable.sh
run() { # run NP EXE ARGS...: output in $T/out, status in $rc
  local np=$1 exe=$2
  shift 2
  timeout 300 mpirun -np "$np" "$exe" "$@" >"$T/out" 2>&1
  rc=$?
}
F=tests/fixtures/keras_ref/func_branches
ARGS=(--x "$PWD/$F/x.npy" --y "$PWD/$F/y.npy" --epochs 2 --no-shuffle --quiet)

mkdir -p "$T/a" "$T/b"
cp "$F/model.keras" "$T/a/m.keras"
./kdcc "$T/a/m.keras" --distribution "$F/func_branches.dist.json" --batch-size 16 -w \
  -o "$T/a/train" || exit 1
cmp -s "$T/a/m.keras" "$T/a/train.kdcc.d/model.keras" || fail "no copy of the archive"
name="where it was built"; run 8 "$T/a/train" "${ARGS[@]}" --history "$T/h0.json"; expect 0
rm "$T/a/m.keras"
mv "$T/a/train" "$T/a/train.kdcc.d" "$T/b/"
name="moved, the archive deleted"
run 8 "$T/b/train" "${ARGS[@]}" --history "$T/h1.json" --save-weights "$T/w.keras"
expect 0
same_history "$T/h0.json" "$T/h1.json"
python3 -c "import zipfile,sys; assert 'config.json' in zipfile.ZipFile(sys.argv[1]).namelist()" \
  "$T/w.keras" || fail "$name: --save-weights .keras has no config.json"
"$T/b/train" --help | grep -qF "$T/b/train.kdcc.d/model.keras" || fail "--help names no copy"
name="predict, moved"; run 8 "$T/b/train" predict --x "$F/x.npy" --out "$T/p.npy" --quiet
expect 0
rm "$T/b/train.kdcc.d/model.keras"
name="nothing left"; run 8 "$T/b/train" "${ARGS[@]}"
expect 1 "train: this program starts from the weights of $T/a/m.keras, the archive it was compiled from, which kdcc copied to $T/b/train.kdcc.d/model.keras; neither is there now: move the program together with its .kdcc.d directory, or give --weights FILE or --init random"
name="nothing left, --init random"; run 8 "$T/b/train" "${ARGS[@]}" --init random; expect 0
name="nothing left, --weights"; run 8 "$T/b/train" "${ARGS[@]}" --weights "$F/model.keras"
expect 0
name="nothing left, predict"; run 8 "$T/b/train" predict --x "$F/x.npy" --out "$T/p.npy"
expect 1 "predict: this program starts from the weights of $T/a/m.keras"

finish
