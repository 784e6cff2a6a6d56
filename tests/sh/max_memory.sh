#!/usr/bin/env bash
# kdcc --max-memory: a model that needs more per device is an error naming
# the largest tensors; the option's sizes; the default (this machine's
# memory) stops a model of terabytes.
set -uo pipefail
cd "$(dirname "$0")/../.."
make -s kdcc || exit 1
fail=0
check() { # expected status, expected start of stderr, kdcc arguments...
  local want=$1 start=$2; shift 2
  err=$(./kdcc "$@" --report 2>&1 >/dev/null); rc=$?
  if [ $rc != "$want" ] || [ "${err:0:${#start}}" != "$start" ]; then
    echo "FAIL kdcc $*: exit $rc, stderr: $err"; fail=1
  fi
}
check 1 "models/seed_mlp.json:61:7: error: one device needs 2521.4 KiB (parameters" \
  models/seed_mlp.json --batch-size 16 --max-memory 100K
check 0 "" models/seed_mlp.json --batch-size 16 --max-memory 3M
check 0 "" models/seed_mlp.json --batch-size 16 --max-memory=2582000
check 1 "kdcc: error: --max-memory: '1X' is not a size such as 16G" models/seed_mlp.json --max-memory 1X
check 1 "kdcc: error: --max-memory: '99999999999T' is not a size such as 16G" \
  models/seed_mlp.json --max-memory 99999999999T
check 1 "tests/bad/memory_2_tib.json:4:3: error: one device needs 8192.1 GiB" \
  tests/bad/memory_2_tib.json
echo "max_memory: $([ $fail = 0 ] && echo ok || echo FAILED)"
exit $fail
