#!/usr/bin/env bash
# hang.sh: no hung job. One rank of a training program on a (2, 2) mesh is
# stopped (SIGSTOP, after its step 5: KDRT_TEST_PAUSE parks it, then the
# test stops it whole, its watchdog too). The other ranks wait for it in
# their next collective; with --timeout 5 their watchdogs (watchdog.c) end
# the job within seconds, each saying which rank it is, the epoch and step,
# and the collective and mesh axes it waits in; mpirun ends the stopped
# rank too. A run that makes progress is never stopped, --timeout 0 turns
# the watchdog off, and a bad value is a usage error. The ranks of one host
# share a page of progress marks, so the message also names the rank that
# stopped (rank 2, its pid, its last step).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin hang.sh

./kdcc models/seed_mlp.json --distribution models/seed_mlp_fixed.dist.json --mesh data=2,model=2 \
  --batch-size 16 -w -o "$T/t" || exit 1

# 1. a stopped rank
KDRT_TEST_PAUSE="2:5:train:$T/pid" timeout 120 mpirun -np 4 -x KDRT_TEST_PAUSE "$T/t" \
  --synthetic 128 --epochs 100000 --checkpoint-dir "$T/ck" --checkpoint-every 1000000 \
  --timeout 5 >"$T/out" 2>&1 &
job=$!
for _ in $(seq 600); do [ -s "$T/pid" ] && break; sleep 0.05; done
name="a stopped rank"
if [ ! -s "$T/pid" ]; then
  fail "$name: rank 2 never reached step 5"
  kill $job
else
  victim=$(cat "$T/pid")
  kill -STOP "$victim"
  t0=$(date +%s.%N)
  wait $job
  rc=$?
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then fail "$name: status $rc (124: the job hung)"
  elif (( $(echo "$dt > 30" | bc) )); then fail "$name: the job took ${dt}s to end"
  elif ! grep -qE "^t: rank [013]: no progress for [0-9]+ s \(--timeout\): epoch 1, step 6, training, waiting in an all-reduce over \('[a-z]+',( 'model')?\); rank 2 \(pid $victim\) made no progress for [0-9]+ s outside any collective \(epoch 1, step 5\): it may have stopped or hung; ending the job" "$T/out"; then
    fail "$name: no message naming the rank, step and collective, and the stopped rank"
    sed 's/^/    | /' "$T/out"
  else echo "  ok: $name: the job ended ${dt}s after SIGSTOP, status $rc: $(grep -m1 'no progress' "$T/out")"
  fi
  sleep 1 # then it is gone, or a zombie nobody reaps (a container's init may not)
  if [ -n "$(ps -o stat= -p "$victim" | grep -v Z)" ]; then
    fail "$name: the stopped rank (pid $victim) outlived the job"
    kill -KILL "$victim"
  fi
fi

# 2. progress is never a hang, whatever the limit
name="a short --timeout on a run that progresses"
timeout 120 mpirun -np 4 "$T/t" --synthetic 64 --epochs 3 --timeout 2 --quiet >"$T/out" 2>&1
rc=$?; expect 0
name="--timeout 0: no watchdog"
timeout 120 mpirun -np 4 "$T/t" --synthetic 32 --epochs 1 --timeout 0 --quiet >"$T/out" 2>&1
rc=$?; expect 0
name="--timeout -1"; "$T/t" --timeout -1 >"$T/out" 2>&1
rc=$?; expect 2 "option '--timeout' wants seconds, a number >= 0, got '-1'"

finish
