#!/usr/bin/env bash
# device.sh: check kdcc on a GPU machine in one go, with the bundle that
# `make gpu-bundle` built (tests/gpu/build_bundle.sh) on a machine without one.
#
#   bash tests/gpu/device.sh [DIR]     DIR holds bundle.tar.xz (default .gpu)
#
# Phases (PHASES=env,corr,... picks some; the default is all but prof). The
# checks of corr, faults and mesh run first, as one pool of jobs, JOBS (8) at
# a time on the one GPU; then the speed phases, in this order:
#   env     the GPU, the bundle's commit, every library found
#   corr    opcheck: every kernel against the CPU runtime, 10 rounds, at
#             fp32, tf32 and bf16 (`opcheck --repeat 10`; a program that
#             takes no --repeat runs 10 times);
#           every model's training against the CPU program's history (each
#             loss within 1e-5) and `gradcheck --points 3`;
#           the GPT at tf32 and bf16 (finite, near the CPU's fp32);
#           a program compiled for batch 16 trained at --batch-size 24 and 40
#             against the CPU program at the same batch;
#           a checkpoint taken on the GPU resumed by the CPU program;
#           a loss that diverges in epoch 2 (--lr 1000): the run says so,
#             keeps epoch 1's checkpoint, which the CPU program resumes;
#           issue 22: cuDNN's convolutions and the two-level bn_stats
#             (KDRT_CUDA_CUDNN=1, opt-in): the models with a conv or a batch
#             norm against the CPU program and by gradcheck, and the
#             examples' ResNet against the same program without it (losses
#             within 1e-5) and run twice (the same bits);
#           issue 22: cuDNN's fused attention (KDRT_CUDA_CUDNN=attn, opt-in):
#             the bf16 GPT (--attention fused) against the CPU's fp32 losses
#             (5e-2, as kdcc's kernels) and run twice (the same bits);
#           issue 22: a learning rate halved at each epoch's end (LR_ARGS)
#             against the CPU program, and CUDA graphs and the input thread
#             changing no bit: models trained with all on (the default)
#             and all off (KDRT_CUDA_GRAPH=0 KDRT_PREFETCH=0 KDRT_CUDA_PINNED=0
#             KDRT_CUDA_RESIDENT_MB=0: the data sets on the host)
#   faults  each must end the program with a message: out of GPU memory
#           (KDRT_CUDA_MEMORY=1M), a kernel reading an illegal address
#           (KDRT_CUDA_INJECT_FAULT=5) with KDRT_CUDA_SYNC=1 (names
#           program.cu:LINE) and without (says to rerun with KDRT_CUDA_SYNC=1)
#   mesh    a (2,2) mesh of four ranks on one GPU (host-staged collectives)
#           against the one-device CPU program
#   pipe    issue 22: steps/s of the seed MLP, the wide MLP and models/gpt.json
#           with CUDA graphs, the input thread and pinned batch buffers on
#           (the default), then each off, then all off (PIPE="model:prec:batch
#           ..." picks the programs)
#   perf, torch, keras   the speed table: kdcc's CUDA programs, PyTorch eager
#           and torch.compile, Keras on JAX (keras, namex and optree wheels in
#           DIR/whl/), on the same data; PERF="model:prec:batch ..." and
#           TORCH_ONLY="model:prec:batch:mode,..." pick fewer
#   kprof   kdcc's own per-line GPU profile (KDRT_CUDA_PROFILE=1) of the
#           speed programs (KPROF="model:prec:batch ..." picks them)
#   prof    (not by default) per-kernel GPU time from ncu
# EXTRA=FILE.tar.xz adds programs to the bundle's (see below).
# The pool ends at DL - 90 seconds at the latest and every speed phase stops
# before DL (default 330), so that the whole takes at most about 6 minutes.
#
# Prints one line per check as it goes, then the speed table and the table
# of checks; writes OUT/summary.txt (the same lines) and OUT/res.tar.gz (every
# log and history; OUT: default ./gpu-results). Exit status 0 when no check
# failed (a WARN is a difference from the CPU worth a look), 1 when one did,
# 3 when the bundle or its libraries are unusable. WORK (default
# /tmp/kdcc-gpu) is where the bundle is unpacked; KEEP=1 leaves it there.
set -u
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
S=$(cd "$(dirname "$0")" && pwd)
G=$(cd "${1:-.gpu}" 2>/dev/null && pwd) ||
  { echo "device.sh: no folder ${1:-.gpu}: copy the one make gpu-bundle wrote (.gpu/) into the checkout" >&2; exit 3; }
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUNDLE=$(realpath "${BUNDLE:-$G/bundle.tar.xz}")
EXTRA=${EXTRA:+$(realpath "$EXTRA")}
PHASES=${PHASES:-env,corr,faults,mesh,perf,pipe,kprof,torch,keras}
# issue 22: data sets resident on the device (runtime/cuda/resident.cu) are
# opt-in until this script has proven them: on here, for every run but the
# "all off" (serial) and nores ones, which keep the data on the host
export KDRT_CUDA_RESIDENT_MB=${KDRT_CUDA_RESIDENT_MB-auto}
DL=${DL:-330}
JOBS=${JOBS:-8}
W=${WORK:-/tmp/kdcc-gpu}
mkdir -p "$W" && W=$(cd "$W" && pwd)
R=$W/res
has() { [[ ",$PHASES," == *",$1,"* ]]; }
left() { echo $((DL - $(el))); }
# tmo N: N seconds, or what is left before the deadline less 30 (at least 10)
tmo() { local l=$(($(left) - 30)); [ $l -lt 10 ] && l=10; [ $l -lt $1 ] && echo $l || echo $1; }

SUM=$OUT/summary.txt
: >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }
# check NAME STATUS DETAIL: a row of the final table (PASS, FAIL, WARN, SKIP)
check() {
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$R/checks.tsv"
  say "$(printf '%-26s %-4s %s' "$1" "$2" "$3") [$(el)s]"
}
finish() { # STATUS: print the tables, pack the results, exit (1 when a check failed)
  local st=$1 n f w
  [ -s "$R/perf.table" ] && { echo; cat "$R/perf.table"; } | tee -a "$SUM"
  n=$(wc -l <"$R/checks.tsv")
  f=$(grep -c $'\tFAIL\t' "$R/checks.tsv")
  w=$(grep -c $'\tWARN\t' "$R/checks.tsv")
  [ "$st" = 0 ] && [ "$f" != 0 ] && st=1
  {
    echo
    echo "== kdcc on ${GPU:-no GPU}, bundle ${COMMIT:-?}"
    printf '%-26s %-4s %s\n' check res detail
    awk -F'\t' '{printf "%-26s %-4s %s\n", $1, $2, substr($3, 1, 160)}' "$R/checks.tsv"
    echo "$n checks: $((n - f - w)) passed, $w warned, $f failed [$(el)s]; every log: $OUT/res.tar.gz"
  } | tee -a "$SUM"
  cp "$SUM" "$R/"
  (cd "$W" && tar czf "$OUT/res.tar.gz" res)
  [ "${KEEP:-0}" = 1 ] || rm -rf "$W"
  exit "$st"
}

# ---- unpack: two xz streams (programs, then libraries), one tar each
rm -rf "$W"
mkdir -p "$W" "$R"/j "$R"/h
: >"$R/checks.tsv"
cd "$W"
if ! xz -dc "$BUNDLE" | tar -xif - || [ "$(cat format 2>/dev/null)" != 2 ]; then
  check bundle FAIL "$BUNDLE: unreadable or of another layout: rebuild it with make gpu-bundle"
  finish 3
fi
# EXTRA=FILE.tar.xz: more programs unpacked over the bundle, e.g. an earlier
# commit's speed programs named progs/p_MODEL_PRECbase, which PERF="MODEL:PRECbase:B"
# times in the same run (compare.py's "base" column)
if [ -n "${EXTRA:-}" ] && ! xz -dc "$EXTRA" | tar -xf -; then
  check bundle FAIL "EXTRA=$EXTRA: unreadable"
  finish 3
fi
COMMIT=$(awk '/^commit/ {$1 = ""; print substr($0, 2)}' info.txt)
. ref/args.sh
CUBLAS=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda-1*/lib64 2>/dev/null | head -1)
TV=$(env -u LD_LIBRARY_PATH python3 -c 'import os,torch;print(os.path.dirname(torch.__file__))' 2>/dev/null)/..
# (cuDNN: KDRT_CUDA_CUDNN=1 opens libcudnn.so.9 itself; the bundle has none)
NV=$(ls -d $TV/nvidia/cu13/lib $TV/nvidia/nccl/lib $TV/nvidia/cublas/lib $TV/nvidia/cudnn/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=$W/lib:${CUBLAS}:${NV}${LD_LIBRARY_PATH:-}
# any library still missing (cuBLAS, NCCL elsewhere in the image): look for it
for l in $(ldd progs/c_cnn 2>/dev/null | awk '/not found/ {print $1}'); do
  f=$(find /usr /opt /lib -name "$l" 2>/dev/null | head -1)
  [ -n "$f" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$f")
done
# cuDNN, which no program links (KDRT_CUDA_CUDNN=1 dlopens it): looked for
# likewise when neither the path nor ld.so's cache has it
on_path() { local d; for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/$1" ] && return 0; done; return 1; }
if ! on_path libcudnn.so.9 && ! ldconfig -p 2>/dev/null | grep -q libcudnn.so.9; then
  f=$(find /usr /opt -name libcudnn.so.9 2>/dev/null | head -1)
  [ -n "$f" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$f")
fi
PY="env -u LD_LIBRARY_PATH python3"
export OPAL_PREFIX=$W/ompi/usr PMIX_INSTALL_PREFIX=$W/ompi/usr/lib/x86_64-linux-gnu/pmix2
export PATH=$W/ompi/usr/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_ess_singleton_isolated=1 KDRT_PROGRESS=plain
GPU=$(nvidia-smi -L 2>/dev/null | head -1 | sed 's/ (UUID.*//')

if has env; then
  {
    nvidia-smi
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ldd progs/c_cnn | grep -E "not found|cublas|nccl|mpi"
    echo "libcudnn.so.9 (KDRT_CUDA_CUDNN=1):"
    for d in ${LD_LIBRARY_PATH//:/ } /usr/lib/x86_64-linux-gnu; do ls "$d"/libcudnn.so.9 2>/dev/null; done
    cat info.txt
    $PY -c 'import torch, jax; print(torch.__version__, jax.__version__, jax.devices())'
  } >"$R/env.txt" 2>&1
  miss=$(ldd progs/c_cnn progs/cpu_cnn "$W/ompi/usr/bin/orterun" | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
  if [ -z "$GPU" ] || [ -n "$miss" ]; then
    check env FAIL "${GPU:-no GPU (nvidia-smi lists none)}; libraries not found: ${miss:-none}"
    finish 3
  fi
  check env PASS "$GPU; every library found; bundle $COMMIT"
  bf=$(tr '\n' ' ' <ref/build_failed.txt)
  rf=$(cat ref/ref_failed.txt)
  [ -z "$bf$rf" ] || check bundle FAIL "not built: ${bf:-none}; CPU references failed: ${rf:-none}"
fi

# ---- the correctness jobs: each writes j/NAME.txt and j/NAME.rc, histories in h/
run_to() { # NAME SECONDS CMD...
  local n=$1 t=$2
  shift 2
  timeout -k 5 "$t" "$@" >"$R/j/$n.txt" 2>&1
  echo $? >"$R/j/$n.rc"
}
job() { # KIND ARGS...
  case $1 in
  opcheck) # PREC
    local exe=progs/c_cnn_$2 n=opcheck_$2
    [ "$2" = fp32 ] && exe=progs/c_cnn
    run_to "$n" 200 "$exe" opcheck --repeat 10
    if [ "$(cat "$R/j/$n.rc")" = 2 ] && grep "usage: .*opcheck" "$R/j/$n.txt" | grep -qv -- --repeat
    then # a program from before --repeat: 10 runs
      local i nf=0
      echo "opcheck --repeat: not known to this program; 10 runs" >"$R/j/$n.txt"
      for i in 1 2 3 4 5 6 7 8 9 10; do
        timeout -k 5 60 "$exe" opcheck >>"$R/j/$n.txt" 2>&1 || nf=$((nf + 1))
      done
      echo "10 runs (it takes no --repeat), $nf failed; " >"$R/j/$n.runs"
      [ $nf = 0 ]
      echo $? >"$R/j/$n.rc"
    fi ;;
  train) run_to "train_$2" 90 progs/c_$2 $ARGS --history "$R/h/$2.cuda.json" ;;
  gc) run_to "gc_$2" 120 progs/c_$2 gradcheck --points 3 ;;
  dnn) # MODEL: issue 22's cuDNN convolutions and two-level bn_stats (opt-in)
    KDRT_CUDA_CUDNN=1 run_to "dnn_$2" 90 progs/c_$2 $ARGS --history "$R/h/dnn_$2.cuda.json" ;;
  dnngc) KDRT_CUDA_CUDNN=1 run_to "dnngc_$2" 120 progs/c_$2 gradcheck --points 3 ;;
  dnnattn) # MODEL [twice]: issue 22's cuDNN attention (opt-in, bf16 programs built with
    # --attention fused), against the CPU program and run twice (the same bits)
    KDRT_CUDA_CUDNN=attn run_to "dnnattn${3:+2}_$2" 90 progs/c_$2 $ARGS \
      --history "$R/h/dnnattn_$2.${3:-cuda}.json" ;;
  resnet) # off | on | twice: the examples' ResNet (the speed program) on ARGS' data
    KDRT_CUDA_CUDNN=$([ "$2" = off ] && echo 0 || echo 1) run_to "resnet_$2" 120 \
      progs/p_resnet_fp32 $ARGS --history "$R/h/resnet.$2.json" ;;
  serial) # MODEL: ARGS without graphs and without the input thread
    KDRT_CUDA_GRAPH=0 KDRT_PREFETCH=0 KDRT_CUDA_PINNED=0 KDRT_CUDA_RESIDENT_MB=0 run_to "serial_$2" 90 progs/c_$2 $ARGS \
      --history "$R/h/$2.serial.json" ;;
  twice) # MODEL: the same run again, to be equal bit for bit (deterministic kernels)
    run_to "twice_$2" 90 progs/c_$2 $ARGS --history "$R/h/$2.twice.json" ;;
  lr) # MODEL [serial]: the rate halved at each epoch's end
    if [ "${3:-}" = serial ]; then
      KDRT_CUDA_GRAPH=0 KDRT_PREFETCH=0 KDRT_CUDA_PINNED=0 KDRT_CUDA_RESIDENT_MB=0 run_to "lrs_$2" 90 progs/c_$2 $LR_ARGS \
        --history "$R/h/lr_$2.serial.json"
    else
      run_to "lr_$2" 90 progs/c_$2 $LR_ARGS --history "$R/h/lr_$2.cuda.json"
    fi ;;
  prec) run_to "prec_$2" 90 progs/c_$2 $ARGS --history "$R/h/$2.cuda.json" ;;
  bs) # MODEL BATCH
    run_to "bs$3_$2" 90 progs/c_$2 $BS_ARGS --batch-size "$3" --history "$R/h/bs$3_$2.cuda.json" ;;
  ck) # epoch 1 on the GPU, epoch 2 on the CPU from its checkpoint
    rm -rf "$R/ck"
    run_to ck_gpu 90 progs/c_cnn $CK_ARGS --epochs 1 --checkpoint-dir "$R/ck"
    ls "$R/ck" >"$R/j/ck.ckpts" 2>/dev/null
    run_to ck_cpu 90 progs/cpu_cnn $CK_ARGS --epochs 2 --checkpoint-dir "$R/ck" --resume \
      --history "$R/h/ck_straight.cuda.json" ;;
  nan) # diverges in epoch 2; the CPU program resumes epoch 1's checkpoint at the compiled rate
    rm -rf "$R/nan_ck"
    run_to nan_gpu 90 progs/c_megatron $NAN_ARGS --lr $NAN_LR --checkpoint-dir "$R/nan_ck" \
      --history "$R/h/nan.cuda.json"
    ls "$R/nan_ck" >"$R/j/nan.ckpts" 2>/dev/null
    run_to nan_cpu 90 progs/cpu_megatron $NAN_ARGS --checkpoint-dir "$R/nan_ck" --resume \
      --history "$R/h/nan_resumed.cuda.json" ;;
  fault) # oom | sync | nosync
    case $2 in
    oom) KDRT_CUDA_MEMORY=1M run_to fault_oom 60 progs/c_cnn $ARGS ;;
    sync) KDRT_CUDA_SYNC=1 KDRT_CUDA_INJECT_FAULT=5 run_to fault_sync 60 progs/c_cnn $ARGS ;;
    nosync) KDRT_CUDA_INJECT_FAULT=5 run_to fault_nosync 60 progs/c_cnn $ARGS ;;
    esac ;;
  mesh) # four ranks on one GPU, one model after another (the ranks wait
    # yielding their cores, which the other jobs need)
    local m
    for m in $m22_models; do
      CUDA_VISIBLE_DEVICES=$MESH_GPU OMPI_MCA_mpi_yield_when_idle=1 run_to "mesh_$m" 120 \
        mpirun -np 4 -x CUDA_VISIBLE_DEVICES progs/m22_$m $M22_ARGS --history "$R/h/m22_$m.cuda.json"
    done ;;
  esac
}
MESH_GPU=${CUDA_VISIBLE_DEVICES:-0}
MESH_GPU=${MESH_GPU%%,*}
export -f job run_to
LR_ARGS=${LR_ARGS:-} lr_models=${lr_models:-} # (a bundle from before issue 22 has none)
serial_models=$(for m in seed_mlp cnn gpt megatron; do grep -qx "$m" ref/corr.list && echo "$m"; done)
twice_models=$(for m in cnn gpt megatron gpt_bf16 gpt_tf32 hub_llama gpt_mixed; do [ -x "progs/c_$m" ] && echo "$m"; done)
# issue 22: the models with a conv or a batch norm, run again with KDRT_CUDA_CUDNN=1
dnn_models=$(for m in cnn nested nested_frozen vit acts_pool batchnorm constrained conv1d conv1d_family \
  dilated frozen grouped pools regularizers transpose transpose_op; do grep -qx "$m" ref/corr.list && echo "$m"; done)
export R ARGS BS_ARGS CK_ARGS NAN_ARGS NAN_LR M22_ARGS MESH_GPU m22_models LR_ARGS
jobs_list() { # the longest first
  has mesh && echo mesh
  if has corr; then
    for p in fp32 tf32 bf16; do echo "opcheck $p"; done
  fi
  if has corr; then
    for m in $(cat ref/corr.list); do echo "gc $m"; done
    for m in $(cat ref/corr.list); do echo "train $m"; done
    echo "prec gpt_tf32"
    echo "prec gpt_bf16"
    for m in $(cat ref/mixed.list 2>/dev/null); do echo "prec $m"; done
    for m in $bs_models; do for b in $BS_SIZES; do echo "bs $m $b"; done; done
    echo ck
    echo nan
    for m in $serial_models; do echo "serial $m"; done
    for m in $twice_models; do echo "twice $m"; done
    for m in $lr_models; do echo "lr $m"; echo "lr $m serial"; done
    for m in $dnn_models; do echo "dnn $m"; echo "dnngc $m"; done
    [ -x progs/c_gpt_bf16 ] && { echo "dnnattn gpt_bf16"; echo "dnnattn gpt_bf16 twice"; }
    [ -x progs/p_resnet_fp32 ] && for v in off on twice; do echo "resnet $v"; done
  fi
  if has faults; then
    for f in oom sync nosync; do echo "fault $f"; done
  fi
}
jobs_list >"$R/jobs.txt"
if [ -s "$R/jobs.txt" ]; then
  say "running $(wc -l <"$R/jobs.txt") correctness jobs, $JOBS at a time [$(el)s]"
  timeout -k 10 "$(tmo $((DL - 90)))" xargs -P "$JOBS" -L 1 bash -c 'job "$@"' _ <"$R/jobs.txt"
  [ $? = 124 ] && say "the correctness jobs ran out of time: those not done count as failed"
fi
rc_of() { cat "$R/j/$1.rc" 2>/dev/null || echo "none (timed out?)"; }
# a line of a job's output: the first with TEXT, else the first from the
# runtime, else the last; at most 110 characters
line_of() {
  { grep -m1 -F -- "$2" "$R/j/$1.txt" || grep -m1 -E 'kdrt|rror|diverged' "$R/j/$1.txt" ||
    tail -1 "$R/j/$1.txt"; } 2>/dev/null | cut -c1-110
}
cmp_hist() { # NAMES TOL LABEL: compare.py's first line; its status
  $PY "$S/compare.py" hist ref "$R/h" "$1" --tol "$2" --label "$3" >"$R/cmp.txt" 2>&1
  local st=$?
  cat "$R/cmp.txt" >>"$R/compare.txt"
  head -1 "$R/cmp.txt"
  return $st
}

if has corr; then
  for p in fp32 tf32 bf16; do
    n=opcheck_$p
    rc=$(rc_of $n)
    nf=$(grep -c '^  .*FAILED$' "$R/j/$n.txt" 2>/dev/null)
    names=$(grep '^  .*FAILED$' "$R/j/$n.txt" 2>/dev/null | cut -c3-42 | sed 's/ *$//' | sort | uniq -c |
      sort -rn | awk '{c = $1; $1 = ""; printf "%s%s(x%d)", (NR > 1 ? " " : ""), substr($0, 2), c}')
    st=FAIL
    [ "$rc" = 0 ] && [ "${nf:-0}" = 0 ] && grep -q "^opcheck:" "$R/j/$n.txt" && st=PASS
    line=$(grep -c ' ok$' "$R/j/$n.txt" 2>/dev/null)
    [ "$line" = 0 ] && line="nothing ran: $(line_of $n opcheck)" || line="$line checks ok, $nf failed${names:+: $names}"
    check "opcheck $p x10" $st "rc=$rc; $(cat "$R/j/$n.runs" 2>/dev/null)${line}"
  done
  total=$(wc -l <ref/corr.list)
  bad=""
  for m in $(cat ref/corr.list); do
    [ "$(rc_of train_$m)" = 0 ] || bad="$bad $m(rc $(rc_of train_$m): $(line_of train_$m rror | cut -c1-60))"
  done
  line=$(cmp_hist @ref/corr.list 1e-5 "losses")
  st=$?
  [ -z "$bad" ] && [ $st = 0 ] && st=PASS || st=FAIL
  check "train vs CPU" $st "$line${bad:+; exit status not 0:$bad}"
  bad=""
  nbad=0
  for m in $(cat ref/corr.list); do
    [ "$(rc_of gc_$m)" = 0 ] && continue
    bad="$bad $m(rc $(rc_of gc_$m): $(tail -1 "$R/j/gc_$m.txt" 2>/dev/null | cut -c1-60))"
    nbad=$((nbad + 1))
  done
  check "gradcheck --points 3" "$([ $nbad = 0 ] && echo PASS || echo FAIL)" \
    "$((total - nbad))/$total passed${bad:+; failed:$bad}"
  # bf16 and tf32 round the products' inputs: a loose bound, not a check of equality
  for p in tf32:1e-2 bf16:5e-2; do
    n=gpt_${p%%:*}
    cp ref/gpt.cpu.json "ref/$n.cpu.json"
    line=$(cmp_hist $n "${p#*:}" "losses vs CPU fp32")
    st=$?
    if [ "$(rc_of prec_$n)" != 0 ] || grep -q 'not a number\|=None' "$R/cmp.txt"; then st=FAIL
    elif [ $st = 0 ]; then st=PASS; else st=WARN; fi
    check "gpt ${p%%:*}" $st "rc=$(rc_of prec_$n); $line"
  done
  # issue 23: Keras's mixed policies against the same policy's CPU program;
  # the roundings are the same, the products' order of sums is not
  if [ -s ref/mixed.list ]; then
    bad=""
    for m in $(cat ref/mixed.list); do [ "$(rc_of prec_$m)" = 0 ] || bad="$bad $m(rc $(rc_of prec_$m))"; done
    line=$(cmp_hist @ref/mixed.list 2e-2 "losses vs CPU, same policy")
    st=$?
    grep -q 'not a number\|=None' "$R/cmp.txt" && st=1
    [ -z "$bad" ] && [ $st = 0 ] && st=PASS || st=FAIL
    check "mixed policies" $st "$line${bad:+; exit status not 0:$bad}"
  fi
  names=""
  for m in $bs_models; do for b in $BS_SIZES; do names="$names,bs${b}_$m"; done; done
  line=$(cmp_hist "${names#,}" 1e-5 "losses vs CPU at the same batch")
  st=$?
  bad=""
  for n in ${names//,/ }; do [ "$(rc_of $n)" = 0 ] || bad="$bad $n: $(line_of $n batch)"; done
  check "batch $BS_SIZES (compiled 16)" "$([ $st = 0 ] && [ -z "$bad" ] && echo PASS || echo FAIL)" "$line${bad:+;$bad}"
  line=$(cmp_hist ck_straight 1e-5 "resumed = straight")
  st=$?
  ck=$(grep '^ckpt-' "$R/j/ck.ckpts" 2>/dev/null | paste -sd' ')
  check "checkpoint GPU->CPU" "$([ $st = 0 ] && [ -n "$ck" ] && [ "$(rc_of ck_gpu)$(rc_of ck_cpu)" = 00 ] &&
    echo PASS || echo FAIL)" "GPU epoch 1 rc=$(rc_of ck_gpu) wrote ${ck:-no checkpoint}, CPU epoch 2 rc=$(rc_of ck_cpu); $line"
  # divergence: what the GPU program did, beside what the CPU program did
  why=$(grep -o 'diverged: [^;]*' "$R/j/nan_gpu.txt" 2>/dev/null | head -1 | cut -c11-)
  cwhy=$(grep -o 'diverged: [^;]*' ref/nan.cpu.txt | head -1 | cut -c11-)
  ck=$(grep '^ckpt-' "$R/j/nan.ckpts" 2>/dev/null | paste -sd' ')
  cck=$(grep '^ckpt-' ref/nan.ckpts | paste -sd' ')
  line=$(cmp_hist nan_resumed 1e-3 "its losses vs the CPU's own resumed")
  st=FAIL
  if [ "$(rc_of nan_gpu)" = "$(cat ref/nan.cpu.rc)" ] && [ -n "$why" ] &&
    { [ -z "$cck" ] || [ -n "$ck" ]; } && [ "$(rc_of nan_cpu)" = 0 ]; then
    st=PASS
    [ "$why" = "$cwhy" ] && [ "$ck" = "$cck" ] || st=WARN
  fi
  [ "$why" = "$cwhy" ] && cmpw="= CPU" || cmpw="CPU: ${cwhy:-none}"
  [ "$ck" = "$cck" ] && cmpk="= CPU" || cmpk="CPU: ${cck:-none}"
  check "diverged (--lr $NAN_LR)" $st "rc=$(rc_of nan_gpu), ${why:-no divergence message} ($cmpw); kept ${ck:-no checkpoint} ($cmpk); CPU resumed it: rc=$(rc_of nan_cpu), $line"
  # issue 22: graphs and the input thread change no bit; a changing rate is read
  # by the replayed graphs (as the CPU program reads it)
  if [ -n "$lr_models" ]; then
    names=$(echo $lr_models | sed 's/\([^ ]*\)/lr_\1/g; s/ /,/g')
    line=$(cmp_hist "$names" 1e-5 "losses vs CPU, the rate halved each epoch")
    st=$?
    bad=""
    for m in $lr_models; do [ "$(rc_of lr_$m)" = 0 ] || bad="$bad lr_$m: $(line_of lr_$m rror)"; done
    check "lr schedule in graphs" "$([ $st = 0 ] && [ -z "$bad" ] && echo PASS || echo FAIL)" "$line${bad:+;$bad}"
  fi
  # pairs of histories that must be equal bit for bit: NAME.cuda.json:NAME.other.json
  same_bits() { # WHAT PAIRS...: a line; status 0 all equal, 1 differ within 1e-5, 2 worse
    local what=$1
    shift
    $PY - "$R/h" "$what" "$@" <<'PY'
import json, sys
d, what, worst, diff, missing = sys.argv[1], sys.argv[2], 0.0, [], []
for pair in sys.argv[3:]:
    a, b = pair.split(":")
    try:
        ha, hb = (json.load(open(f"{d}/{f}")) for f in (a, b))
    except (OSError, ValueError):
        missing.append(a.split(".")[0]); continue
    la, lb = ha.get("step_loss", []), hb.get("step_loss", [])
    if la != lb or ha.get("loss") != hb.get("loss"):
        diff.append(a.split(".")[0])
        if len(la) == len(lb):
            for x, y in zip(la, lb):
                if x is None or y is None: worst = float("inf")
                else: worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-30))
        else: worst = float("inf")
n = len(sys.argv) - 3
print(f"{n - len(diff) - len(missing)}/{n} histories equal bit for bit {what}"
      + (f"; differ: {' '.join(diff)} (worst {worst:.1e})" if diff else "")
      + (f"; missing: {' '.join(missing)}" if missing else ""))
sys.exit(2 if missing or worst > 1e-5 else 1 if diff else 0)
PY
  }
  pairs=""
  for m in $serial_models; do pairs="$pairs $m.cuda.json:$m.serial.json"; done
  for m in $lr_models; do pairs="$pairs lr_$m.cuda.json:lr_$m.serial.json"; done
  if [ -n "$pairs" ]; then
    line=$(same_bits "with graphs and the input thread off" $pairs)
    st=$?
    check "graphs+thread = serial" "$([ $st = 0 ] && echo PASS || { [ $st = 1 ] && echo WARN; } || echo FAIL)" "$line"
  fi
  # issue 22: KDRT_CUDA_CUDNN=1 (cuDNN's convolutions, the two-level bn_stats)
  if [ -n "$dnn_models" ]; then
    for m in $dnn_models; do cp "ref/$m.cpu.json" "ref/dnn_$m.cpu.json"; done
    line=$(cmp_hist "$(echo $dnn_models | sed 's/\([^ ]*\)/dnn_\1/g; s/ /,/g')" 1e-5 "losses vs CPU")
    st=$?
    bad=""
    nbad=0
    for m in $dnn_models; do
      [ "$(rc_of dnn_$m)" = 0 ] || bad="$bad dnn_$m(rc $(rc_of dnn_$m): $(line_of dnn_$m rror | cut -c1-60))"
      [ "$(rc_of dnngc_$m)" = 0 ] || { bad="$bad gradcheck $m(rc $(rc_of dnngc_$m))"; nbad=$((nbad + 1)); }
    done
    grep -h "kdrt-cuda: KDRT_CUDA_CUDNN" "$R"/j/dnn_*.txt 2>/dev/null | head -1 >"$R/cudnn.txt"
    check "cudnn vs CPU" "$([ $st = 0 ] && [ -z "$bad" ] && echo PASS || echo FAIL)" \
      "$line; gradcheck $(($(echo $dnn_models | wc -w) - nbad)) passed; $(cat "$R/cudnn.txt")${bad:+;$bad}"
  fi
  # issue 22: KDRT_CUDA_CUDNN=attn (cuDNN's fused attention at bf16): the
  # GPT's losses near the CPU's fp32 as kdcc's bf16 kernels' are (5e-2),
  # the same bits twice, and cuDNN used (not its fallback to kdcc's kernels)
  if [ -x progs/c_gpt_bf16 ]; then
    cp ref/gpt.cpu.json ref/dnnattn_gpt_bf16.cpu.json
    line=$(cmp_hist dnnattn_gpt_bf16 5e-2 "losses vs CPU fp32")
    st=$?
    twice=$(same_bits "when run twice" dnnattn_gpt_bf16.cuda.json:dnnattn_gpt_bf16.twice.json)
    tst=$?
    used=$(grep -h -m1 "attention through cuDNN" "$R/j/dnnattn_gpt_bf16.txt" 2>/dev/null | cut -c1-80)
    fell=$(grep -h -m1 "cudnn attention: .*kdcc's kernels instead" "$R/j/dnnattn_gpt_bf16.txt" 2>/dev/null |
      cut -c1-140)
    if [ "$(rc_of dnnattn_gpt_bf16)$(rc_of dnnattn2_gpt_bf16)" != 00 ] || [ $st != 0 ] || [ $tst != 0 ]; then
      st=FAIL
    elif [ -z "$used" ] || [ -n "$fell" ]; then st=WARN
    else st=PASS; fi
    check "gpt bf16 cudnn attention" $st "rc $(rc_of dnnattn_gpt_bf16)/$(rc_of dnnattn2_gpt_bf16); $line; $twice; ${used:-cuDNN not used}${fell:+; $fell}"
  fi
  if [ -x progs/p_resnet_fp32 ]; then
    $PY - "$R/h" >"$R/cmp.txt" 2>&1 <<'PY'
import json, sys
d = sys.argv[1]
try:
    a, b, c = (json.load(open(f"{d}/resnet.{v}.json")) for v in ("off", "on", "twice"))
except (OSError, ValueError) as e:
    print(f"no history: {e}"); sys.exit(2)
la, lb = a.get("step_loss", []), b.get("step_loss", [])
worst = max((abs(x - y) / max(abs(x), 1e-30) for x, y in zip(la, lb)), default=float("inf"))
same = lb == c.get("step_loss") and b.get("loss") == c.get("loss")
ok = len(la) == len(lb) > 0 and worst <= 1e-5
print(f"{len(lb)} step losses, worst {worst:.1e} from the kernels' (1e-5); twice: "
      + ("the same bits" if same else "DIFFERENT bits"))
sys.exit(0 if ok and same else 1)
PY
    st=$?
    check "resnet cudnn = kernels" "$([ $st = 0 ] && echo PASS || echo FAIL)" \
      "rc off/on/twice $(rc_of resnet_off)/$(rc_of resnet_on)/$(rc_of resnet_twice); $(head -1 "$R/cmp.txt")"
  fi
  pairs=""
  for m in $twice_models; do pairs="$pairs $m.cuda.json:$m.twice.json"; done
  if [ -n "$pairs" ]; then # issue 22: "the same run twice gives the same bits"
    line=$(same_bits "when run twice" $pairs)
    st=$?
    check "the same run twice" "$([ $st = 0 ] && echo PASS || echo FAIL)" "$line"
  fi
fi

if has faults; then
  for f in "oom|out of GPU memory|KDRT_CUDA_MEMORY=1M" "sync|program.cu:|KDRT_CUDA_SYNC=1 KDRT_CUDA_INJECT_FAULT=5" \
    "nosync|KDRT_CUDA_SYNC=1|KDRT_CUDA_INJECT_FAULT=5"; do
    IFS='|' read -r n want how <<<"$f"
    rc=$(rc_of fault_$n)
    st=FAIL
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ] && grep -qF -- "$want" "$R/j/fault_$n.txt" 2>/dev/null && st=PASS
    if [ $st = PASS ]; then line="rc=$rc: $(line_of fault_$n "$want")"
    else line="rc=$rc, no \"$want\" in: $(line_of fault_$n "$want")"; fi
    check "fault $n" $st "$how: $line"
  done
fi

if has mesh; then
  names=$(echo $m22_models | sed 's/\([^ ]*\)/m22_\1/g; s/ /,/g')
  line=$(cmp_hist "$names" 1e-5 "losses vs one-device CPU")
  st=$?
  bad=""
  for m in $m22_models; do
    [ "$(rc_of mesh_$m)" = 0 ] || bad="$bad $m(rc $(rc_of mesh_$m): $(line_of mesh_$m rror | cut -c1-60))"
    [ "$(rc_of mesh_$m)" != 0 ] || grep -q "staged through host" "$R/j/mesh_$m.txt" ||
      bad="$bad $m(no line about host-staged collectives)"
  done
  check "mesh (2,2) on one GPU" "$([ $st = 0 ] && [ -z "$bad" ] && echo PASS || echo FAIL)" "$line${bad:+;$bad}"
fi

# ---- speed: the same data files for every framework, 10 batches each
late() { # SECONDS WHAT: true (and says so) when fewer than SECONDS are left
  [ "$(left)" -ge "$1" ] && return 1
  say "skipped $2: $(el)s gone, the deadline is ${DL}s"
  return 0
}
SPEED=0
has perf || has pipe || has torch || has keras || has prof || has kprof && SPEED=1
if [ $SPEED = 1 ] && ! $PY -c 'import numpy' 2>/dev/null; then
  say "skipped the speed phases: no numpy to make their data"
  SPEED=0
fi
if [ $SPEED = 1 ]; then
  mkdir -p "$R/perf"
  $PY - <<'PY' || { say "skipped the speed phases: their data could not be made"; SPEED=0; }
import numpy as np, os
os.makedirs("data", exist_ok=True); r = np.random.default_rng(0)
def save(n, x, y): np.save(f"data/{n}.x.npy", x); np.save(f"data/{n}.y.npy", y)
save("seed_mlp", r.random((1280, 28, 28, 1), dtype=np.float32), np.eye(10, dtype=np.float32)[r.integers(0, 10, 1280)])
save("resnet", r.random((1280, 28, 28, 1), dtype=np.float32), r.integers(0, 10, 1280).astype(np.int32))
save("wide_mlp", r.standard_normal((10240, 1024), dtype=np.float32), r.integers(0, 10, 10240).astype(np.int32))
save("gpt", r.integers(0, 64, (1280, 16)).astype(np.int32), r.integers(0, 64, (1280, 16)).astype(np.int32))
save("gpt_med", r.integers(0, 8192, (160, 256)).astype(np.int32), r.integers(0, 8192, (160, 256)).astype(np.int32))
save("gpt2", r.integers(0, 50257, (80, 1024)).astype(np.int32), r.integers(0, 50257, (80, 1024)).astype(np.int32))
PY
fi
KW=0
has keras && [ -d "$G/whl" ] && KW=50 # seconds kept for Keras
if has perf && [ $SPEED = 1 ]; then
  # steps/s = 10*k / (t(1+k epochs) - t(1 epoch)): start-up, init and the final evaluate cancel
  tm() {
    local s=$(date +%s.%N)
    if timeout -k 5 "$(tmo 60)" "$@" >/dev/null 2>>"$R/perf/err.txt"; then
      awk "BEGIN{printf \"%.4f\", $(date +%s.%N) - $s}"
    else
      echo "FAILED: $*" >>"$R/perf/err.txt"
      echo FAILED
    fi
  }
  for c in ${PERF:-seed_mlp:fp32:128 gpt:fp32:128 resnet:fp32:128 resnet:fp32:128:cudnn wide_mlp:fp32:1024 wide_mlp:tf32:1024 \
    wide_mlp:bf16:1024 gpt_med:fp32:16 gpt_med:tf32:16 gpt_med:bf16:16 gpt_med:bf16:16:cudnn}; do
    late $((90 + KW)) "kdcc perf from $c on" && break
    IFS=: read -r m p b v <<<"$c"
    exe=progs/p_${m}_$p
    [ -x "$exe" ] || { say "kdcc $m $p: no program $exe in the bundle"; continue; }
    # model:prec:batch:VARIANT: the same without CUDA graphs (nograph:
    # KDRT_CUDA_GRAPH=0), without the input thread (nothread: KDRT_PREFETCH=0),
    # without cuBLASLt's epilogues (nolt: KDRT_CUDA_LT=0), with the data on
    # the host (nores: KDRT_CUDA_RESIDENT_MB=0), with cuDNN's convolutions
    # and the two-level bn_stats, and at bf16 cuDNN's attention in place of
    # kdcc's fused kernels (cudnn: KDRT_CUDA_CUDNN=1), or without
    # graphs, the thread, pinned buffers and resident data (serial)
    case ${v:-} in
    nograph) exe="env KDRT_CUDA_GRAPH=0 $exe" p=$p-nograph ;;
    nothread) exe="env KDRT_PREFETCH=0 $exe" p=$p-nothread ;;
    nopin) exe="env KDRT_CUDA_PINNED=0 $exe" p=$p-nopin ;;
    nolt) exe="env KDRT_CUDA_LT=0 $exe" p=$p-nolt ;; # the cuBLASLt epilogues off
    nores) exe="env KDRT_CUDA_RESIDENT_MB=0 $exe" p=$p-nores ;;
    cudnn) exe="env KDRT_CUDA_CUDNN=1 $exe" p=$p-cudnn ;;
    serial) exe="env KDRT_CUDA_GRAPH=0 KDRT_PREFETCH=0 KDRT_CUDA_PINNED=0 KDRT_CUDA_RESIDENT_MB=0 $exe" p=$p-serial ;;
    esac
    a="--x data/$m.x.npy --y data/$m.y.npy --batch-size $b --seed 1 --no-shuffle"
    t1=$(tm $exe $a --epochs 1)
    t3=$(tm $exe $a --epochs 3)
    case $t1$t3 in *FAILED*) say "kdcc $m $p b$b: FAILED (perf/err.txt)"; continue ;; esac
    k=$(python3 -c "print(max(2, min(100, round(3.0 / max(($t3 - $t1) / 2, 1e-3)))))")
    tk=$(tm $exe $a --epochs $((1 + k)))
    [ "$tk" = FAILED ] && { say "kdcc $m $p b$b: FAILED (perf/err.txt)"; continue; }
    sps=$(python3 -c "print('%.2f' % (10*$k/max($tk-$t1,1e-6)))")
    # issue 22's start-up: the 1-epoch run less its 10 steps (process start,
    # weights, allocation, the first captures and warm-up, the epoch's end)
    st=$(python3 -c "print('%.2f' % max(0.0, $t1 - 10/max($sps,1e-6)))")
    say "kdcc $m $p b$b: $sps steps/s (1 vs $((1 + k)) epochs of 10 steps: ${t1}s vs ${tk}s; start-up about ${st}s) [$(el)s]"
    echo "$m $p $b $sps" >>"$R/perf/kdcc.txt"
  done
fi
# issue 22: what the CUDA graphs and the input thread (with the copy stream's
# double-buffered uploads) give: each program with all on, graphs off
# (KDRT_CUDA_GRAPH=0), the thread off (KDRT_PREFETCH=0), the batch buffers
# not pinned (KDRT_CUDA_PINNED=0: uploads through the stage), and all off;
# steps/s = 10*K / (t(1+K epochs) - t(1 epoch)), K chosen per model from the
# first variant's 1 and 11 epochs so that the K epochs take about 3 s (at
# most 1000: the fast programs' steps must outweigh a start-up's jitter)
if has pipe && [ $SPEED = 1 ]; then
  pt() { # ENV... -- CMD...: seconds, or FAILED
    local s=$(date +%s.%N)
    if timeout -k 5 "$(tmo 60)" env "$@" >/dev/null 2>>"$R/perf/pipe_err.txt"; then
      awk "BEGIN{printf \"%.4f\", $(date +%s.%N) - $s}"
    else
      echo "FAILED: $*" >>"$R/perf/pipe_err.txt"
      echo FAILED
    fi
  }
  for c in ${PIPE:-seed_mlp:fp32:128 wide_mlp:tf32:1024 wide_mlp:fp32:1024 gpt:fp32:128}; do
    late $((60 + KW)) "pipe from $c on" && break
    IFS=: read -r m p b <<<"$c"
    exe=progs/p_${m}_$p
    [ -x "$exe" ] || { say "pipe $m $p: no program $exe in the bundle"; continue; }
    a="--x data/$m.x.npy --y data/$m.y.npy --batch-size $b --seed 1 --no-shuffle"
    row="pipe $m $p b$b steps/s:"
    base=""
    t1=$(pt KDRT_CUDA_GRAPH=1 $exe $a --epochs 1)
    t11=$(pt KDRT_CUDA_GRAPH=1 $exe $a --epochs 11)
    case $t1$t11 in *FAILED*) say "$row FAILED (perf/pipe_err.txt)"; continue ;; esac
    K=${PIPE_K:-$(python3 -c "print(max(2, min(1000, round(3.0 / max(($t11 - $t1) / 10, 1e-3)))))")}
    row="pipe $m $p b$b, $K epochs of 10 steps, steps/s:"
    for v in on:KDRT_CUDA_GRAPH=1:KDRT_PREFETCH=1:KDRT_CUDA_PINNED=1:KDRT_CUDA_RESIDENT_MB=auto \
      nores:KDRT_CUDA_GRAPH=1:KDRT_PREFETCH=1:KDRT_CUDA_PINNED=1:KDRT_CUDA_RESIDENT_MB=0 \
      nograph:KDRT_CUDA_GRAPH=0:KDRT_PREFETCH=1:KDRT_CUDA_PINNED=1:KDRT_CUDA_RESIDENT_MB=0 \
      nothread:KDRT_CUDA_GRAPH=1:KDRT_PREFETCH=0:KDRT_CUDA_PINNED=1:KDRT_CUDA_RESIDENT_MB=0 \
      nopin:KDRT_CUDA_GRAPH=1:KDRT_PREFETCH=1:KDRT_CUDA_PINNED=0:KDRT_CUDA_RESIDENT_MB=0 \
      serial:KDRT_CUDA_GRAPH=0:KDRT_PREFETCH=0:KDRT_CUDA_PINNED=0:KDRT_CUDA_RESIDENT_MB=0; do
      IFS=: read -r vn e1 e2 e3 e4 <<<"$v"
      t1=$(pt $e1 $e2 $e3 $e4 $exe $a --epochs 1)
      tk=$(pt $e1 $e2 $e3 $e4 $exe $a --epochs $((1 + K)))
      case $t1$tk in *FAILED*) row="$row $vn FAILED"; continue ;; esac
      sps=$(python3 -c "print('%.1f' % (10*$K/max($tk-$t1,1e-6)))")
      [ -z "$base" ] && base=$sps
      row="$row $vn $sps"
      [ "$vn" != on ] && row="$row ($(python3 -c "print('%.2fx' % ($base/max($sps,1e-9)))") on/$vn)"
      echo "$m $p-$vn $b $sps" >>"$R/perf/pipe.txt"
    done
    say "$row [$(el)s]"
  done
fi
if has prof && [ $SPEED = 1 ]; then
  mkdir -p "$R/prof"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  say "ncu: ${NCU:-none}"
  # kernel time per step (GPU time of every launch in a window of steady-state steps)
  for c in wide_mlp:fp32:1024:400:120 gpt_med:bf16:16:4000:2000 gpt_med:tf32:16:4000:2000 resnet:fp32:128:2000:600; do
    [ -n "$NCU" ] || break
    IFS=: read -r m p b skip cnt <<<"$c"
    a="--x data/$m.x.npy --y data/$m.y.npy --batch-size $b --seed 1 --no-shuffle --epochs 3"
    timeout 150 $NCU --metrics gpu__time_duration.sum --csv --launch-skip $skip --launch-count $cnt \
      progs/p_${m}_$p $a >"$R/prof/$m.$p.csv" 2>"$R/prof/$m.$p.err"
    $PY - "$R/prof/$m.$p.csv" $m $p <<'PY' | tee -a "$SUM"
import csv, sys, collections, io
path, m, p = sys.argv[1:4]
txt = open(path).read(); i = txt.find('"ID"')
rows = list(csv.DictReader(io.StringIO(txt[i:]))) if i >= 0 else []
by = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(r["Metric Value"].replace(",", "")); u = r.get("Metric Unit", "")
    v = v / 1e3 if u in ("ns", "nsecond") else v if u in ("us", "usecond") else v * 1e3 if u in ("ms", "msecond") else v
    k = r["Kernel Name"][:60]; by[k][0] += 1; by[k][1] += v
tot = sum(t for _, t in by.values()) or 1
print(f"prof {m} {p}: {len(rows)} launches, {tot/1e3:.2f} ms GPU time in the window")
for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:12]:
    print(f"  {t/tot*100:5.1f}%  {n:5d} x {t/n:8.1f} us  {k}")
PY
  done
fi
# kprof: kdcc's own profile (KDRT_CUDA_PROFILE=1): each call of program.cu
# timed on the GPU between events, 20 training steps, the first left out
if has kprof && [ $SPEED = 1 ]; then
  mkdir -p "$R/prof"
  for c in ${KPROF:-gpt_med:bf16:16 gpt_med:bf16:16:cudnn wide_mlp:bf16:1024 resnet:fp32:128 resnet:fp32:128:cudnn}; do
    late $((40 + KW)) "kprof from $c on" && break
    IFS=: read -r m p b v <<<"$c"
    [ -x progs/p_${m}_$p ] || continue
    # MODEL:PREC:BATCH:cudnn: with KDRT_CUDA_CUDNN=1 (issue 22: convolutions, attention)
    KDRT_CUDA_CUDNN=$([ "${v:-}" = cudnn ] && echo 1 || echo 0) KDRT_CUDA_PROFILE=1 \
      timeout -k 5 "$(tmo 60)" progs/p_${m}_$p --x data/$m.x.npy --y data/$m.y.npy \
      --batch-size $b --seed 1 --no-shuffle --epochs 2 >/dev/null 2>"$R/prof/$m.$p${v:+-$v}.kprof.txt"
    { echo "kprof $m $p${v:+-$v} b$b:"; grep -A40 "kdrt-cuda profile" "$R/prof/$m.$p${v:+-$v}.kprof.txt" | head -32; } | tee -a "$SUM"
  done
fi
if has torch && [ $SPEED = 1 ] && ! $PY -c 'import torch' 2>/dev/null; then
  say "skipped torch: no PyTorch"
elif has torch && [ $SPEED = 1 ] && ! late $((60 + KW)) torch; then
  tb=$(($(left) - 45 - KW))
  [ $tb -lt 15 ] && tb=15
  timeout -k 5 $(($(left) - 10 - KW)) $PY "$S/torch_bench.py" ${TORCH_ONLY:+--only $TORCH_ONLY} --budget $tb \
    --data data --out "$R/perf/torch.json" 2>&1 | tee "$R/perf/torch.txt" | grep -E "^torch" | tee -a "$SUM"
fi
if has keras && [ $SPEED = 1 ] && [ $KW = 0 ]; then
  say "skipped keras: no $G/whl/ (the keras, namex and optree wheels)"
elif has keras && [ $SPEED = 1 ] && ! late 40 keras; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" "$G"/whl/*.whl \
    >"$R/perf/pip.txt" 2>&1
  PYTHONPATH=$W/site KERAS_BACKEND=jax timeout -k 5 $(($(left) - 5)) $PY "$S/keras_bench.py" --budget $(($(left) - 25)) \
    --data data --models models --out "$R/perf/keras.json" 2>&1 | tee "$R/perf/keras.txt" | grep -E "^keras" | tee -a "$SUM"
fi
[ $SPEED = 1 ] && $PY "$S/compare.py" speed "$R" >"$R/perf.table" 2>&1
finish 0
