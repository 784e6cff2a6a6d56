#!/usr/bin/env bash
# gpu_bundle.sh: the GPU check's parts that need no GPU (tests/gpu/), in
# seconds; `make gpu-bundle` itself takes minutes and is not run here.
#   - the scripts parse (bash -n, Python's parser);
#   - build_bundle.sh --list builds a program for every model real Keras
#     wrote (models/NAME.keras) and every tests/gradcheck model, once each;
#   - compare.py hist on two histories of one CPU program: equal ones
#     pass; a loss moved by 1e-3, a null (a NaN), a missing key or file
#     fail, naming the model and the loss; a move within --tol passes;
#   - compare.py speed prints the table from the three sources;
#   - device.sh with a bundle that is not one: exit status 3 and a message;
#   - slim_tree.sh, in a clone: away takes tests/fixtures out of what a
#     device call carries, back restores it as git has it, twice refused.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin gpu_bundle.sh

for f in tests/gpu/*.sh; do bash -n "$f" || fail "$f does not parse"; done
python3 -c 'import ast, sys
for f in sys.argv[1:]: ast.parse(open(f).read(), f)' tests/gpu/*.py || fail "a tests/gpu/*.py does not parse"

name="slim_tree.sh"
if git clone -q --no-hardlinks . "$T/clone/kdcc" 2>/dev/null; then
  (cd "$T/clone/kdcc" && cp "$OLDPWD/tests/gpu/slim_tree.sh" tests/gpu/ &&
    bash tests/gpu/slim_tree.sh away >"$T/slim" 2>&1 && [ ! -e tests/fixtures ] &&
    [ -d ../kdcc-fixtures.away ] && ! bash tests/gpu/slim_tree.sh away 2>/dev/null &&
    bash tests/gpu/slim_tree.sh back >>"$T/slim" 2>&1 &&
    [ -z "$(git status --porcelain tests/fixtures)" ] &&
    ! bash tests/gpu/slim_tree.sh back 2>/dev/null) || fail "$name: $(cat "$T/slim")"
  grep -q "checkout [0-9.]* MB" "$T/slim" || fail "$name: no size said: $(cat "$T/slim")"
else
  fail "$name: cannot clone the checkout"
fi

name="build_bundle.sh --list"
bash tests/gpu/build_bundle.sh --list >"$T/plan" || fail "$name: exit status $?"
for f in models/*.keras tests/gradcheck/*.json; do
  n=$(basename "${f%.*}")
  [ "${f##*.}" = keras ] && [ ! -f "models/$n.json" ] && continue
  grep -qE "^c_(gc_)?$n ${f%.*}.json " "$T/plan" || fail "$name: no program for $f"
done
dup=$(awk '{print $1}' "$T/plan" | sort | uniq -d | tr '\n' ' ')
[ -z "$dup" ] || fail "$name: names built twice: $dup"

# two histories of one program, and edited copies
./kdcc models/seed_mlp.json --batch-size 16 -w -o "$T/seed" >/dev/null || exit 1
mkdir -p "$T/ref" "$T/got"
OMPI_MCA_ess_singleton_isolated=1 "$T/seed" --synthetic 48 --epochs 2 --batch-size 16 \
  --validation-split 0.25 --seed 7 --quiet --history "$T/ref/a.cpu.json" || fail "seed_mlp did not train"
OMPI_MCA_ess_singleton_isolated=1 "$T/seed" --synthetic 48 --epochs 2 --batch-size 16 \
  --validation-split 0.25 --seed 7 --quiet --history "$T/got/a.cuda.json" || fail "seed_mlp did not train"
python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
h = json.load(open(f"{d}/ref/a.cpu.json"))
for n in "bcdef":
    json.dump(h, open(f"{d}/ref/{n}.cpu.json", "w"))
def put(n, edit):
    g = json.loads(json.dumps(h)); edit(g); json.dump(g, open(f"{d}/got/{n}.cuda.json", "w"))
put("b", lambda g: g["step_loss"].__setitem__(2, g["step_loss"][2] * (1 + 1e-3)))
put("c", lambda g: g["val_loss"].__setitem__(1, None))
put("d", lambda g: g["evaluate"].pop("loss"))
put("e", lambda g: g["loss"].__setitem__(0, g["loss"][0] + 1e-7))
PY
cmp_run() { "${@:1}" >"$T/out" 2>&1; rc=$?; }
name="compare.py, equal histories"
cmp_run python3 tests/gpu/compare.py hist "$T/ref" "$T/got" a,e --label same
expect 0 "same: 2/2 within 1e-05"
name="compare.py, a loss moved by 1e-3"
cmp_run python3 tests/gpu/compare.py hist "$T/ref" "$T/got" a,b
expect 1 "losses vs CPU: 1/2 within 1e-05; differ: b(1.0e-03 at step_loss[2])"
name="compare.py, within --tol"
cmp_run python3 tests/gpu/compare.py hist "$T/ref" "$T/got" b --tol 2e-3
expect 0 "1/1 within 0.002"
name="compare.py, a null loss"
cmp_run python3 tests/gpu/compare.py hist "$T/ref" "$T/got" c
expect 1 "differ: c(val_loss[1]=None vs "
name="compare.py, a missing loss"
cmp_run python3 tests/gpu/compare.py hist "$T/ref" "$T/got" d
expect 1 "differ: d(keys evaluate.loss)"
name="compare.py, missing files"
echo f >"$T/list"
cmp_run python3 tests/gpu/compare.py hist "$T/ref" "$T/got" @"$T/list"
expect 1 "differ: f(missing)"

name="compare.py speed"
mkdir -p "$T/res/perf"
printf 'gpt fp32 128 250.0\ngpt fp32base 128 200.0\n' >"$T/res/perf/kdcc.txt"
echo '{"results": [{"model": "gpt", "prec": "fp32", "batch": 128, "mode": "eager", "nosync": 100.0}]}' \
  >"$T/res/perf/torch.json"
cmp_run python3 tests/gpu/compare.py speed "$T/res"
expect 0 "gpt        fp32    128    250.0    200.0    100.0        -        -       2.50      1.25"

name="base_progs.sh, no commit"
bash tests/gpu/base_progs.sh >"$T/out" 2>&1
rc=$?
expect 2 "usage: "
name="base_progs.sh, not a commit"
bash tests/gpu/base_progs.sh no-such-commit-here "$T/b.tar.xz" >"$T/out" 2>&1
rc=$?
expect 2 "no-such-commit-here: no such commit"
[ ! -e "$T/b.tar.xz" ] || fail "$name: wrote $T/b.tar.xz"

name="device.sh, not a bundle"
mkdir -p "$T/g"
echo "not xz" >"$T/g/bundle.tar.xz"
OUT="$T/o" WORK="$T/w" bash tests/gpu/device.sh "$T/g" >"$T/out" 2>&1
rc=$?
expect 3 "unreadable or of another layout: rebuild it with make gpu-bundle"
[ -s "$T/o/res.tar.gz" ] || fail "$name: no $T/o/res.tar.gz"
finish
