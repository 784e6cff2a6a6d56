#!/usr/bin/env bash
# The bad-input corpus under AddressSanitizer and UBSan: every file in
# tests/bad/ must give a `file:line:col: error:` (or, for the few that only
# deserve one, a warning) and exit status 1 (0 for warnings), and never a
# crash or a sanitizer report. Distribution specs (dist_*) are paired with
# a good model.
set -uo pipefail
cd "$(dirname "$0")/../.."
make -s build/asan/kdcc || exit 1
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fail=0 n=0
for f in tests/bad/*; do
  n=$((n + 1))
  case $(basename $f) in
    dist_*) args=(tests/good/seq_mlp.json --distribution $f) ;;
    *) args=($f) ;;
  esac
  err=$(build/asan/kdcc "${args[@]}" --report 2>&1 >/dev/null); rc=$?
  if grep -qE "Sanitizer|runtime error" <<<"$err"; then
    echo "FAIL $f: sanitizer report"; echo "$err" | head -20; fail=1
  elif [ $rc = 1 ] && grep -q ": error: " <<<"$err"; then :
  elif [ $rc = 0 ] && grep -q ": warning: " <<<"$err"; then :
  else
    echo "FAIL $f: exit $rc, stderr: $err"; fail=1
  fi
done
echo "bad inputs under ASan/UBSan: $n files, $([ $fail = 0 ] && echo ok || echo FAILED)"
exit $fail
