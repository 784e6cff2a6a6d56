#!/usr/bin/env bash
# checkpoint.sh: --checkpoint-dir / --checkpoint-every / --resume on whole
# programs under mpirun (the seed MLP, dropout and Adam included, on a
# (data=2, model=2) mesh, 3 epochs of 8 steps, a checkpoint every 5 steps).
#
#  1. a run killed (SIGKILL, one rank) during training: the job ends within
#     30 s; --resume gives a history bitwise equal to an uninterrupted run,
#     prints the same epoch lines, and leaves the last 2 checkpoints;
#  2. the same checkpoint resumed on two other meshes (4x1 on 4 ranks, 1x2
#     on 2 ranks): equal within 1e-5;
#  3. a rank killed half-way through writing its shard, and rank 0 killed
#     half-way through the MANIFEST: that checkpoint is skipped, the one
#     before is used, the result is again bitwise equal;
#  4. a rank killed from outside at a moment the test does not choose;
#  5. errors: an unwritable directory, a corrupt checkpoint (skipped, then
#     none left), a checkpoint of another model, other data, bad options;
#  6., 7., 8.: partial batches, schedules, frozen layers (see each).
# KDRT_TEST_PAUSE=rank:step:where:pidfile (checkpoint.c) stops a rank at a
# chosen point and writes its pid; the test then kills it with SIGKILL.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export KDRT_PROGRESS=plain

make -s kdcc build/libkdrt.a || exit 1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "checkpoint.sh: FAIL: $*" >&2; fails=$((fails + 1)); }
ok() { echo "  ok: $*"; }

compile() { # compile NAME MESH [MODEL]
  ./kdcc "${3:-models/seed_mlp.json}" --distribution models/seed_mlp_fixed.dist.json \
    --mesh "$2" --batch-size 16 -w -o "$T/$1" || exit 1
}
compile t22 data=2,model=2
compile t41 data=4,model=1
compile t12 data=1,model=2
python3 - "$T/other.json" <<'EOF'
import json, sys
m = json.load(open("models/seed_mlp.json"))
for l in m["config"]["layers"]:
    if l["config"].get("name") == "d1":
        l["config"]["units"] = 100
json.dump(m, open(sys.argv[1], "w"))
EOF
compile other data=2,model=2 "$T/other.json"

ARGS=(--synthetic 128 --epochs 3 --batch-size 16)
# run NP EXE ARGS...: output in $T/out, status in $rc
run() {
  local np=$1 exe=$2
  shift 2
  timeout 120 mpirun -np "$np" "$T/$exe" "$@" >"$T/out" 2>&1
  rc=$?
}
# killed NAME PAUSE NP EXE ARGS...: start the run with KDRT_TEST_PAUSE=PAUSE,
# SIGKILL the paused rank, check the job ends (non-zero) within 30 s.
killed() {
  local name=$1 pause=$2 np=$3 exe=$4
  shift 4
  rm -f "$T/pid"
  KDRT_TEST_PAUSE="$pause:$T/pid" timeout 120 mpirun -np "$np" -x KDRT_TEST_PAUSE "$T/$exe" "$@" \
    >"$T/out" 2>&1 &
  local job=$!
  for _ in $(seq 600); do [ -s "$T/pid" ] && break; sleep 0.05; done
  if [ ! -s "$T/pid" ]; then
    fail "$name: the rank never reached the pause point"
    wait $job
    return
  fi
  local t0=$(date +%s.%N)
  kill -9 "$(cat "$T/pid")"
  wait $job
  rc=$?
  local dt=$(echo "$(date +%s.%N) - $t0" | bc)
  if [ "$rc" = 0 ]; then fail "$name: mpirun exited 0 after a rank was killed"
  elif [ "$rc" = 124 ]; then fail "$name: the other ranks hung (timeout)"
  elif (( $(echo "$dt > 30" | bc) )); then fail "$name: the job took ${dt}s to end"
  elif ! grep -q "exited on signal 9" "$T/out"; then fail "$name: no clear message: $(cat "$T/out")"
  else ok "$name: job ended ${dt}s after the kill, status $rc: $(grep -o 'process rank [0-9]* .*signal 9 (Killed)' "$T/out" | head -1)"
  fi
}
# The numbers an epoch's line prints, without its timing.
epoch_lines() { grep -E '^ *[0-9]+/[0-9]+ ' "$1" | sed -E 's/ [0-9]+s [0-9]+[mu]?s\/step//'; }

# ---- the reference: 3 epochs straight, no checkpoints
run 4 t22 "${ARGS[@]}" --history "$T/straight.json"
[ "$rc" = 0 ] || fail "straight run: status $rc: $(cat "$T/out")"
cp "$T/out" "$T/straight.out"

# ---- 1. killed during training at step 13: ckpt-5 and ckpt-10 are complete
D=$T/ck1
killed "kill during training" 2:13:train 4 t22 "${ARGS[@]}" --checkpoint-dir "$D" --checkpoint-every 5
[ -f "$D/ckpt-10/MANIFEST" ] && [ "$(cat "$D/latest")" = ckpt-10 ] ||
  fail "kill during training: ckpt-10 is not the latest complete checkpoint"
cp -r "$D" "$T/ck_x1" && cp -r "$D" "$T/ck_x2"
run 4 t22 "${ARGS[@]}" --checkpoint-dir "$D" --checkpoint-every 5 --resume --history "$T/r1.json"
if [ "$rc" != 0 ]; then fail "resume: status $rc: $(cat "$T/out")"
elif ! grep -q "resuming from $D/ckpt-10: epoch 2, 2 of 8 steps done" "$T/out"; then
  fail "resume: not from ckpt-10: $(cat "$T/out")"
elif ! cmp -s "$T/straight.json" "$T/r1.json"; then
  fail "resume: history differs from the uninterrupted run"; diff "$T/straight.json" "$T/r1.json"
elif [ "$(epoch_lines "$T/straight.out" | tail -3)" != "$(epoch_lines "$T/out" | tail -3)" ]; then
  fail "resume: the epoch lines differ"; diff <(epoch_lines "$T/straight.out") <(epoch_lines "$T/out")
else ok "resume after a kill during training: history bitwise equal"
fi
[ "$(cd "$D" && echo ckpt-*)" = "ckpt-15 ckpt-20" ] && [ "$(cat "$D/latest")" = ckpt-20 ] ||
  fail "keep-2: $D holds $(cd "$D" && echo *)"

# ---- 2. the same checkpoint on other meshes
run 4 t41 "${ARGS[@]}" --checkpoint-dir "$T/ck_x1" --resume --history "$T/x1.json"
[ "$rc" = 0 ] || fail "resume on (4, 1): status $rc: $(cat "$T/out")"
run 2 t12 "${ARGS[@]}" --checkpoint-dir "$T/ck_x2" --resume --history "$T/x2.json"
[ "$rc" = 0 ] || fail "resume on (1, 2): status $rc: $(cat "$T/out")"
if python3 tests/compare_history.py 1e-5 "$T/straight.json" "$T/x1.json" "$T/x2.json"; then
  ok "resume on meshes (4, 1) and (1, 2): within 1e-5"
else fail "cross-mesh resume"; fi

# ---- 3. killed during a save: of a shard (rank 1), of the MANIFEST (rank 0)
for where in 1:10:save 0:10:manifest; do
  D=$T/ck_$where
  killed "kill during save ($where)" "$where" 4 t22 "${ARGS[@]}" --checkpoint-dir "$D" \
    --checkpoint-every 5
  [ ! -f "$D/ckpt-10/MANIFEST" ] && [ "$(cat "$D/latest")" = ckpt-5 ] ||
    fail "kill during save ($where): ckpt-10 looks complete or latest moved"
  [ -n "$(ls -A "$D/ckpt-10" | grep '\.tmp\.')" ] || fail "kill during save ($where): no temp file"
  [ "$where" != 1:10:save ] || [ ! -e "$D/ckpt-10/shard-00001.kdck" ] ||
    fail "kill during save: a half-written shard has its final name"
  run 4 t22 "${ARGS[@]}" --checkpoint-dir "$D" --checkpoint-every 5 --resume \
    --history "$T/r3.json"
  if [ "$rc" != 0 ]; then fail "resume after kill during save ($where): status $rc: $(cat "$T/out")"
  elif ! grep -q "skipping $D/ckpt-10: no MANIFEST" "$T/out" ||
       ! grep -q "resuming from $D/ckpt-5:" "$T/out"; then
    fail "resume after kill during save ($where): $(cat "$T/out")"
  elif ! cmp -s "$T/straight.json" "$T/r3.json"; then
    fail "resume after kill during save ($where): history differs"
  else ok "resume after a kill during save ($where): skipped ckpt-10, bitwise equal"
  fi
done

# ---- 4. a rank killed from outside, whenever the first checkpoint exists
D=$T/ck4
LONG=(--synthetic 128 --epochs 40 --batch-size 16 --checkpoint-dir "$D" --checkpoint-every 10)
run 4 t22 "${LONG[@]}" --history "$T/long.json" # uninterrupted, with checkpoints
[ "$rc" = 0 ] || fail "long run: status $rc: $(cat "$T/out")"
rm -rf "$D"
timeout 120 mpirun -np 4 "$T/t22" "${LONG[@]}" >"$T/out" 2>&1 &
job=$!
for _ in $(seq 600); do [ -f "$D/latest" ] && break; sleep 0.05; done
victim=$(pgrep -P "$(pgrep -P $job mpirun)" t22 | sed -n 3p)
t0=$(date +%s.%N)
kill -9 "$victim" 2>/dev/null
killrc=$?
wait $job
rc=$?
dt=$(echo "$(date +%s.%N) - $t0" | bc)
if [ -z "$victim" ] || [ "$killrc" != 0 ]; then
  echo "  (the run finished before the kill; nothing to check)"
elif [ "$rc" = 0 ] || [ "$rc" = 124 ] || (( $(echo "$dt > 30" | bc) )); then
  fail "outside kill: status $rc after ${dt}s"
else
  ok "outside kill of pid $victim: job ended ${dt}s after, status $rc"
  run 4 t22 "${LONG[@]}" --resume --history "$T/r4.json"
  if [ "$rc" != 0 ] || ! cmp -s "$T/long.json" "$T/r4.json"; then
    fail "resume after outside kill: status $rc, $(grep -E 'resuming|warning' "$T/out")"
  else ok "resume after outside kill: $(grep -o 'resuming from [^:]*' "$T/out"), bitwise equal"
  fi
fi

# ---- 5. errors
expect() { # expect NAME RC TEXT
  if [ "$rc" != "$2" ] || ! grep -qF -- "$3" "$T/out"; then
    fail "$1: status $rc (want $2), output: $(cat "$T/out")"
  else ok "$1: $(grep -F -- "$3" "$T/out" | head -1)"
  fi
}
touch "$T/file"
run 4 t22 "${ARGS[@]}" --checkpoint-dir "$T/file/ck"
expect "unwritable directory" 1 "checkpoint directory $T/file/ck: Not a directory"
run 1 t12 "${ARGS[@]}" --resume
expect "--resume alone" 2 "--resume needs --checkpoint-dir"
run 2 t12 "${ARGS[@]}" --checkpoint-dir "$T/empty" --resume
expect "--resume, nothing saved yet" 0 "no checkpoint in $T/empty; starting from scratch"
D=$T/ck1 # ckpt-15 and ckpt-20 from test 1
cp -r "$D" "$T/ck5"
printf '\xff' | dd of="$D/ckpt-20/shard-00002.kdck" bs=1 seek=5000 conv=notrunc 2>/dev/null
cp -r "$D" "$T/ck6"
run 4 t22 "${ARGS[@]}" --checkpoint-dir "$D" --resume --history "$T/r5.json"
expect "corrupt newest checkpoint" 0 \
  "warning: skipping $D/ckpt-20: $D/ckpt-20/shard-00002.kdck: checksum"
grep -q "resuming from $D/ckpt-15:" "$T/out" && cmp -s "$T/straight.json" "$T/r5.json" ||
  fail "corrupt newest checkpoint: did not resume from ckpt-15 to the same history"
D=$T/ck6
truncate -s 100000 "$D/ckpt-15/shard-00001.kdck"
echo junk >>"$D/ckpt-20/MANIFEST"
run 4 t22 "${ARGS[@]}" --checkpoint-dir "$D" --resume
expect "no usable checkpoint" 1 "no usable checkpoint in $D: all 2 are incomplete or corrupt"
grep -q "skipping $D/ckpt-15: $D/ckpt-15/shard-00001.kdck: 100000 bytes" "$T/out" ||
  fail "truncated shard: no warning naming it: $(cat "$T/out")"
grep -q "skipping $D/ckpt-20: $D/ckpt-20/MANIFEST: does not end in its crc line" "$T/out" ||
  fail "corrupt MANIFEST: no warning naming it: $(cat "$T/out")"
run 4 other "${ARGS[@]}" --checkpoint-dir "$T/ck5" --resume
expect "another model" 1 \
  "shard-00000.kdck: checkpoint is of another model: variable 'sequential/d1/kernel' is [784, 200] with 2 optimizer slots there, [784, 100] with 2 here"
run 4 t22 --synthetic 64 --epochs 3 --batch-size 16 --checkpoint-dir "$T/ck5" --resume
expect "other data" 1 "the checkpoint was taken with 8 steps per epoch over 128 training samples in batches of 16, this run has 4 over 64 in batches of 16"

# resumed WHAT EXE D SAYS ARGS...: EXE run straight, then rank 1 killed after
# step 7 (a checkpoint every 3 steps into D), then resumed: it must say it
# resumes from D/ckpt-6 (then SAYS) and end with the straight run's history,
# bitwise.
resumed() {
  local what=$1 exe=$2 D=$3 says=$4
  shift 4
  run 4 "$exe" "$@" --history "$T/$exe.straight.json"
  [ "$rc" = 0 ] || fail "$what, straight: status $rc: $(cat "$T/out")"
  killed "$what: kill during training" 1:7:train 4 "$exe" "$@" --checkpoint-dir "$D" \
    --checkpoint-every 3
  run 4 "$exe" "$@" --checkpoint-dir "$D" --checkpoint-every 3 --resume \
    --history "$T/$exe.resumed.json"
  if [ "$rc" != 0 ] || ! grep -q "resuming from $D/ckpt-6$says" "$T/out"; then
    fail "$what, resume: status $rc: $(cat "$T/out")"
  elif ! cmp -s "$T/$exe.straight.json" "$T/$exe.resumed.json"; then
    fail "$what, resume: history differs"
    diff "$T/$exe.straight.json" "$T/$exe.resumed.json"
  else ok "$what: resume from ckpt-6 bitwise equal"
  fi
}

# ---- 6. partial batches: 61 samples in batches of 16 (the last of 13 rows,
# split unevenly over 'data'), a checkpoint every 3 steps (one of them after
# the partial batch), killed at step 7: the resumed history is bitwise the
# uninterrupted one; resuming with another --batch-size is an error.
P=(--synthetic 61 --epochs 3 --batch-size 16 --validation-split 0.1)
D=$T/ck7
resumed "partial batches" t22 "$D" ": epoch 2, 2 of 4 steps done" "${P[@]}"
run 4 t22 --synthetic 61 --epochs 3 --batch-size 15 --validation-split 0.1 --checkpoint-dir "$D" \
  --resume
expect "other batch size" 1 "over 54 training samples in batches of 16, this run has 4 over 54 in batches of 15"

# ---- 7. issue 11: a learning-rate schedule (CosineDecay with warmup) and
# Nadam's running product continue at the checkpoint's step: killed at step
# 7, resumed from ckpt-6, the history is bitwise the uninterrupted one; and
# a schedule takes no --lr nor --reduce-lr-on-plateau (Keras's optimizer
# refuses a new rate), before training.
./kdcc tests/good/opt_nadam_global.json --distribution tests/good/opt.dist.json \
  --mesh data=2,model=2 --batch-size 16 -w -o "$T/opt" || exit 1
S=(--synthetic 61 --epochs 3 --batch-size 16)
D=$T/ck8
resumed "schedule and Nadam" opt "$D" "" "${S[@]}"
# Adamax's slots have Nadam's shapes: the MANIFEST's optimizer tells them apart.
./kdcc tests/good/opt_adamax.json --distribution tests/good/opt.dist.json \
  --mesh data=2,model=2 --batch-size 16 -w -o "$T/adamax" || exit 1
run 4 adamax "${S[@]}" --checkpoint-dir "$D" --resume
expect "another optimizer" 1 "it was trained with Nadam, this program trains with Adamax (another optimizer's state); resume with the program that wrote it"
run 1 opt "${S[@]}" --lr 0.1
expect "--lr with a schedule" 2 "--lr: this program's learning rate is a schedule (CosineDecay), which sets the rate at every step; Keras's optimizer takes no other rate"
run 1 opt "${S[@]}" --reduce-lr-on-plateau 1
expect "--reduce-lr-on-plateau with a schedule" 2 "--reduce-lr-on-plateau: this program's learning rate is a schedule (CosineDecay)"

# ---- 8. frozen layers (trainable false: no optimizer slots): killed at step
# 7, resumed from ckpt-6, the history is bitwise the uninterrupted one; the
# same model with the frozen Dense trained (Adam's two slots) refuses that
# checkpoint instead of reading other variables' state as its slots.
./kdcc tests/gradcheck/frozen.json --distribution tests/good/frozen.dist.json \
  --mesh data=2,model=2 --batch-size 16 -w -o "$T/frozen" || exit 1
python3 - "$T/thawed.json" <<'EOF'
import json, sys
m = json.load(open("tests/gradcheck/frozen.json"))
for l in m["config"]["layers"]:
    if l["config"]["name"] == "hidden":
        del l["config"]["trainable"]
json.dump(m, open(sys.argv[1], "w"))
EOF
./kdcc "$T/thawed.json" --distribution tests/good/frozen.dist.json \
  --mesh data=2,model=2 --batch-size 16 -w -o "$T/thawed" || exit 1
D=$T/ck9
resumed "frozen layers" frozen "$D" "" "${S[@]}"
run 4 thawed "${S[@]}" --checkpoint-dir "$D" --resume
expect "a frozen layer trained" 1 "checkpoint is of another model: variable 'hidden/kernel' is [4, 8] with 0 optimizer slots there, [4, 8] with 2 here (is its layer frozen, trainable false, in one program and trained in the other?)"

[ "$fails" = 0 ] && echo "checkpoint.sh: all passed" || echo "checkpoint.sh: $fails failed"
exit $((fails > 0))
