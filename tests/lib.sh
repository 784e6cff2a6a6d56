# Helpers the whole-program test scripts share (sourced, not run, from the
# repository root). The script sets $name, $rc and $T/out for expect.

# begin SCRIPT: what a script does first: Open MPI as root and
# oversubscribed, plain progress lines, kdcc and the runtime built, a
# scratch directory $T removed at exit, failures counted by fail().
begin() {
  script=$1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 KDRT_PROGRESS=plain
  make -s kdcc build/libkdrt.a || exit 1
  T=$(mktemp -d)
  trap 'rm -rf "$T"' EXIT
  fails=0
}
fail() { echo "$script: FAIL: $*" >&2; fails=$((fails + 1)); }
# finish: "SCRIPT: ok" and status 0, or the count of failures and 1.
finish() {
  [ "$fails" = 0 ] && echo "$script: ok" && exit 0
  echo "$script: $fails failures" >&2
  exit 1
}

expect() { # expect RC [TEXT]: status and a line of the output
  local ok=1
  [ "$rc" = "$1" ] || { fail "$name: exit status $rc, want $1"; ok=0; }
  if [ -n "${2:-}" ] && ! grep -qF -- "$2" "$T/out"; then
    fail "$name: output lacks: $2"
    ok=0
  fi
  [ "$ok" = 1 ] || sed 's/^/    | /' "$T/out" >&2
}
# same_weights A B: two weights files (--save-weights) with the same
# datasets, every value bit for bit.
same_weights() {
  python3 - "$1" "$2" <<'EOF'
import struct, sys
sys.path.insert(0, "tests/keras_ref")
import h5lite
a, b = (h5lite.datasets(p) for p in sys.argv[1:3])
bits = lambda v: [struct.pack("<f", x) for x in v]
sys.exit(not (a.keys() == b.keys() and all(a[k][0] == b[k][0] and bits(a[k][1]) == bits(b[k][1])
                                           for k in a)))
EOF
}
# same_numbers NAME NP PROGRAM-ARGUMENTS...: the programs $T/new and $T/old
# trained alike under mpirun -np NP (16-bit products widened for OpenBLAS,
# KDRT_GEMM16=0; KDRT_ONEDNN=$ONEDNN, default 1): the same history and
# every final weight, bit for bit (store16.sh, xent_fused.sh).
same_numbers() {
  local name=$1 np=$2
  shift 2
  local run=("$@")
  for p in new old; do # (new's products widened for OpenBLAS: matmul's bits, KDRT_GEMM16=0)
    if ! KDRT_GEMM16=0 KDRT_ONEDNN=${ONEDNN:-1} timeout 300 mpirun -np "$np" -x KDRT_GEMM16 \
      -x KDRT_ONEDNN "$T/$p" "${run[@]}" --quiet \
      --history "$T/$p.json" \
      --save-weights "$T/$p.weights.h5" >"$T/out" 2>&1; then
      fail "$name: the $p program failed"
      sed 's/^/    | /' "$T/out" >&2
      return
    fi
  done
  if cmp -s "$T/new.json" "$T/old.json" && same_weights "$T/new.weights.h5" "$T/old.weights.h5"
  then
    echo "  ok: $name: history and weights bit for bit ($(python3 -c "import json, sys
print(len(json.load(open(sys.argv[1]))['step_loss']))" "$T/new.json") steps)"
  else fail "$name: a number changed"; diff "$T/new.json" "$T/old.json" | head -5; fi
}
# same_history A B: every number equal to 1e-5 relative.
same_history() {
  python3 - "$1" "$2" <<'PY' || fail "$name: histories $1 and $2 differ"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
def flat(h): return [(k, v) for k, vs in sorted(h.items()) for v in (vs if isinstance(vs, list) else [vs[x] for x in sorted(vs)])]
fa, fb = flat(a), flat(b)
assert [k for k, _ in fa] == [k for k, _ in fb], (fa, fb)
for (k, x), (_, y) in zip(fa, fb):
    assert abs(x - y) <= 1e-5 * max(1, abs(x)), (k, x, y)
PY
}
