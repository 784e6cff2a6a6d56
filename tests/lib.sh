# Helpers the whole-program test scripts share (sourced, not run). The
# script defines fail() (report one failure) and sets $name, $rc and $T/out.

expect() { # expect RC [TEXT]: status and a line of the output
  local ok=1
  [ "$rc" = "$1" ] || { fail "$name: exit status $rc, want $1"; ok=0; }
  if [ -n "${2:-}" ] && ! grep -qF -- "$2" "$T/out"; then
    fail "$name: output lacks: $2"
    ok=0
  fi
  [ "$ok" = 1 ] || sed 's/^/    | /' "$T/out" >&2
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
