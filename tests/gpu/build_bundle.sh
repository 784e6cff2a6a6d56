#!/usr/bin/env bash
# build_bundle.sh: everything a GPU machine needs to check kdcc, built here
# (no GPU needed) and packed into one file, for tests/gpu/device.sh.
#
#   bash tests/gpu/build_bundle.sh [PROJECT_DIR] [OUT]   (make gpu-bundle)
#     PROJECT_DIR: the built checkout (default: the one this script is in)
#     OUT: default PROJECT_DIR/.gpu/bundle.tar.xz
#   bash tests/gpu/build_bundle.sh --list   the programs it would build, one a line
#
# The GPU machine has nvcc's libraries, PyTorch and numpy but none of kdcc's
# other libraries and no package registry, so the bundle holds:
#   progs/  every program the device run needs, compiled here with
#           kdcc --target cuda --cuda-arch $CUDA_ARCH (default sm_90):
#             c_NAME      each model that real Keras wrote (models/NAME.keras
#                         beside models/NAME.json) and each tests/gradcheck
#                         model, one device, batch 16, fp32
#             c_{cnn,gpt}_{tf32,bf16}   the same at the other precisions
#             c_NAME_mixed  cnn and gpt under Keras's mixed_bfloat16 policy, seed_mlp
#                         under mixed_float16 (loss scaling) (issue 23), each
#                         checked against its own CPU program's history
#             c_hub_NAME  keras-hub's GPT-2, Llama, Gemma 2, Mistral, Qwen (and
#                         Llama with LoRA) from tests/fixtures/keras_hub
#             m22_NAME    five models on the (2,2) mesh (one GPU, four ranks)
#             p_NAME_PREC the speed programs (GPT2=1 adds GPT-2's shape at
#             each precision, GPT2="bf16 tf32" at those)
#             cpu_{cnn,megatron}        CPU programs that resume the GPU's
#                         checkpoints
#   ref/    the CPU programs' histories for the same runs (the references
#           the GPU's must equal), their logs, and what failed to build
#   lib/    every shared library the programs, Open MPI's plugins and mpirun
#           load, except glibc's and CUDA's own (ldd)
#   ompi/   Open MPI and PMIx, relocated (OPAL_PREFIX, PMIX_INSTALL_PREFIX)
#   models/ the JSONs that Keras itself trains in the speed comparison
#   info.txt, format   the commit it was built from; the layout's version
# W (default /tmp/kdcc-gpubundle) is where it is put together; KEEP=1 keeps it.
# Builds and reference runs go $(nproc) (JOBS) at a time: about 90 s on 2
# cores, about 32 MB.
set -euo pipefail
FORMAT=2 # device.sh refuses a bundle of another layout
S=$(cd "$(dirname "$0")" && pwd)
LIST=0
if [ "${1:-}" = "--list" ]; then LIST=1; shift; fi
P=$(cd "${1:-$S/../..}" && pwd)
OUTF=${2:-$P/.gpu/bundle.tar.xz}
ARCH=${CUDA_ARCH:-sm_90}
K="$P/kdcc"
CU="--target cuda --cuda-arch $ARCH"
# issue 22: the GPU run proves the fused attention (kdcc's default stays the
# chain until it has): the tf32 and bf16 GPTs are built with it; ATT= builds
# them with the chain
ATT=${ATT---attention fused}
JOBS=${JOBS:-$(nproc)}

# ---- the programs: one line each, "NAME KDCC-ARGS...", paths relative to P
bs_models="cnn gpt func_branches" # trained at a run-time batch above the compiled 16
m22_models="seed_mlp func_branches cnn megatron gpt"
plan() {
  local f n p
  for f in "$P"/models/*.keras; do
    n=$(basename "$f" .keras)
    [ -f "$P/models/$n.json" ] && echo "c_$n models/$n.json --batch-size 16 $CU"
  done
  for f in "$P"/tests/gradcheck/*.json; do
    n=$(basename "$f" .json)
    [ -f "$P/models/$n.keras" ] && n=gc_$n # a name both lists use
    echo "c_$n tests/gradcheck/${n#gc_}.json --batch-size 16 $CU"
  done
  for n in cnn gpt; do
    for p in tf32 bf16; do echo "c_${n}_$p models/$n.json --batch-size 16 $CU --precision $p $ATT"; done
    echo "c_${n}_mixed models/$n.json --batch-size 16 $CU --dtype-policy mixed_bfloat16"
  done
  echo "c_seed_mlp_mixed models/seed_mlp.json --batch-size 16 $CU --dtype-policy mixed_float16"
  # keras-hub's families (rotary embedding, padding and sliding-window masks,
  # soft caps) from their fixtures' archives, and LoRA
  for n in gpt2 llama gemma2 mistral qwen; do
    echo "c_hub_$n tests/fixtures/keras_hub/hub_$n/model.keras --sequence-length 16 --batch-size 16 $CU"
  done
  echo "c_hub_llama_lora tests/fixtures/keras_hub/hub_llama_lora/model.keras --sequence-length 16" \
       "--lora-rank 4 --batch-size 16 $CU"
  for n in $m22_models; do
    echo "m22_$n models/$n.json --distribution models/$n.dist.json --mesh data=2,model=2 --batch-size 16 $CU"
  done
  for n in seed_mlp gpt; do echo "p_${n}_fp32 models/$n.json --batch-size 128 $CU"; done
  echo "p_resnet_fp32 examples/fashion_mnist/resnet.json --batch-size 128 $CU"
  for p in fp32 tf32 bf16; do
    echo "p_wide_mlp_$p models/wide_mlp.json --batch-size 1024 $CU --precision $p"
    echo "p_gpt_med_$p tests/gpu/gpt_med.json --batch-size 16 $CU --precision $p $ATT"
    case " ${GPT2:-0} " in " 1 " | *" $p "*)
      echo "p_gpt2_$p tests/gpu/gpt2_124m.json --batch-size 8 $CU --precision $p $ATT" ;;
    esac
  done
  # issue 23: Keras's way to bf16 (activations stored in 16 bits), against
  # --precision bf16 on a float32 model (operands rounded, data in float32)
  echo "p_gpt_med_mixed tests/gpu/gpt_med.json --batch-size 16 $CU --dtype-policy mixed_bfloat16 --precision bf16"
  case " ${GPT2:-0} " in " 1 " | *" mixed "* | *" bf16 "*)
    echo "p_gpt2_mixed tests/gpu/gpt2_124m.json --batch-size 8 $CU --dtype-policy mixed_bfloat16 --precision bf16" ;;
  esac
  echo "cpu_cnn models/cnn.json --batch-size 16"
  echo "cpu_megatron models/megatron.json --batch-size 16"
}
if [ $LIST = 1 ]; then plan; exit 0; fi

W=${W:-/tmp/kdcc-gpubundle}
rm -rf "$W"
mkdir -p "$W"/progs "$W"/ref "$W"/lib "$W"/models "$W"/cpu "$(dirname "$OUTF")"
OUTF=$(cd "$(dirname "$OUTF")" && pwd)/$(basename "$OUTF")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_ess_singleton_isolated=1 OMP_NUM_THREADS=1 # JOBS runs at once; threads change no result
T0=$(date +%s)
log() { echo "[gpu-bundle $(( $(date +%s) - T0 ))s] $*" >&2; }
[ -x "$K" ] || { echo "build_bundle: $K not found: run make first" >&2; exit 1; }

# ---- compile: the CUDA programs, and beside each c_NAME the CPU program
# cpu/NAME that makes its reference (a build that fails is listed, not fatal)
export P K W
build_one() { # NAME KDCC-ARGS...
  local n=$1; shift
  if ! (cd "$P" && $K "$@" -w -o "$W/progs/$n") >"$W/ref/$n.kdcc.txt" 2>&1; then
    echo "$n" >>"$W/ref/build_failed.txt"
    return 0
  fi
  case $n in c_*_tf32 | c_*_bf16) return 0 ;; c_*) ;; *) return 0 ;; esac
  local cpu=$(echo " $* " | sed 's/ --target cuda / /; s/ --cuda-arch [^ ]* / /')
  # a mixed policy's products sum in another order on the GPU, so a value
  # may round to the next bf16: compared with a tolerance (mixed.list), not
  # with the fp32 programs' 1e-5 (corr.list)
  local list=corr.list
  case $n in c_*_mixed) list=mixed.list ;; esac
  if (cd "$P" && $K $cpu -w -o "$W/cpu/${n#c_}") >>"$W/ref/$n.kdcc.txt" 2>&1; then
    echo "${n#c_}" >>"$W/ref/$list"
  else
    echo "cpu/${n#c_}" >>"$W/ref/build_failed.txt"
  fi
}
export -f build_one
: >"$W/ref/build_failed.txt"
: >"$W/ref/corr.list"
: >"$W/ref/mixed.list"
plan | sed 's/ *$//' | xargs -P "$JOBS" -L 1 bash -c 'build_one "$@"' _
# the (2,2) programs' reference: the same model on one device
for n in $m22_models; do
  (cd "$P" && $K models/$n.json --distribution models/$n.dist.json --mesh data=1,model=1 \
    --batch-size 16 -w -o "$W/cpu/m22_$n") >>"$W/ref/m22_$n.kdcc.txt" 2>&1 ||
    echo "cpu/m22_$n" >>"$W/ref/build_failed.txt"
done
log "compiled $(ls "$W/progs" | grep -vc '\.kdcc\.d$') programs; failed: $(tr '\n' ' ' <"$W/ref/build_failed.txt")"

# ---- the CPU references: one line each, "NAME PROGRAM ARGS..." -> ref/NAME.cpu.json
# (and NAME.cpu.txt, NAME.cpu.rc). device.sh reads the flags from ref/args.sh.
sort -o "$W/ref/corr.list" "$W/ref/corr.list"
sort -o "$W/ref/mixed.list" "$W/ref/mixed.list"
ARGS="--synthetic 96 --epochs 2 --batch-size 16 --validation-split 0.25 --seed 7 --quiet"
BS_ARGS="--synthetic 96 --epochs 2 --validation-split 0.25 --seed 7 --quiet"
BS_SIZES="24 40"
M22_ARGS="--synthetic 64 --epochs 2 --batch-size 16 --seed 3 --quiet"
CK_ARGS="--synthetic 96 --batch-size 16 --seed 7 --quiet"
NAN_ARGS="--synthetic 96 --batch-size 16 --validation-split 0.25 --seed 7 --quiet --epochs 3"
NAN_LR=1000
# issue 22: a learning rate that halves at every epoch's end (ReduceLROnPlateau
# that never sees an improvement), which a CUDA graph's replays must read from
# the device: the fused SGD update in a GEMM (shared_dense), Adam (seed_mlp),
# dropout's step (cnn)
LR_ARGS="--synthetic 96 --epochs 4 --batch-size 16 --seed 7 --quiet --monitor loss \
--reduce-lr-on-plateau 0 --reduce-lr-min-delta 100 --reduce-lr-factor 0.5"
lr_models="shared_dense seed_mlp cnn"
for v in ARGS BS_ARGS BS_SIZES M22_ARGS CK_ARGS NAN_ARGS NAN_LR LR_ARGS lr_models bs_models \
  m22_models; do
  echo "$v=\"${!v}\""
done >"$W/ref/args.sh"
refs() {
  local f n
  for f in "$W"/cpu/*; do
    n=$(basename "$f")
    case $n in *.kdcc.d) continue ;; m22_*) echo "$n $f $M22_ARGS" ;; *) echo "$n $f $ARGS" ;; esac
  done
  for n in $bs_models; do
    for b in $BS_SIZES; do echo "bs${b}_$n $W/cpu/$n $BS_ARGS --batch-size $b"; done
  done
  for n in $lr_models; do echo "lr_$n $W/cpu/$n $LR_ARGS"; done
  echo "ck_straight $W/progs/cpu_cnn $CK_ARGS --epochs 2"
  # training that diverges in epoch 2 (loss nan at step 4, found on this CPU):
  # the checkpoint after epoch 1 stays, and resumes with the compiled rate
  echo "nan $W/progs/cpu_megatron $NAN_ARGS --lr $NAN_LR --checkpoint-dir $W/nan_ck"
}
ref_one() { # NAME PROGRAM ARGS...
  local n=$1; shift
  (cd "$W/cpu" && timeout 300 "$@" --history "$W/ref/$n.cpu.json" >"$W/ref/$n.cpu.txt" 2>&1)
  echo $? >"$W/ref/$n.cpu.rc"
}
export -f ref_one
refs | sed 's/ *$//' | xargs -P "$JOBS" -L 1 bash -c 'ref_one "$@"' _
ls "$W/nan_ck" >"$W/ref/nan.ckpts" 2>/dev/null || true
ref_one nan_resumed "$W/progs/cpu_megatron" $NAN_ARGS --checkpoint-dir "$W/nan_ck" --resume
bad=$(cd "$W/ref" && grep -L '^0$' *.cpu.rc | sed 's/\.cpu\.rc$//' | grep -v '^nan$' | tr '\n' ' ' || true)
[ "$(cat "$W/ref/nan.cpu.rc")" = 1 ] || bad="$bad nan(rc $(cat "$W/ref/nan.cpu.rc"), want 1)"
log "CPU references: $(ls "$W"/ref/*.cpu.rc | wc -l) runs; failed: ${bad:-none}"
echo "$bad" >"$W/ref/ref_failed.txt"
rm -rf "$W/cpu" "$W/nan_ck"

# ---- the speed comparison's data is made on the GPU machine; Keras reads these
cp "$P"/tests/gpu/gpt_med.json "$P"/models/gpt.json "$P"/models/seed_mlp.json "$P"/models/wide_mlp.json \
  "$P"/examples/fashion_mnist/resnet.json "$W/models/"
rm -rf "$W"/progs/*.kdcc.d
strip --strip-debug "$W"/progs/* 2>/dev/null || true

# ---- libraries: what the programs, Open MPI's plugins and mpirun load, but glibc's and CUDA's
A=x86_64-linux-gnu
O=$W/ompi/usr
mkdir -p "$O/bin" "$O/lib/$A" "$O/share" "$W/ompi/etc"
cp -a /usr/lib/$A/openmpi /usr/lib/$A/pmix2 "$O/lib/$A/"
rm -rf "$O/lib/$A/openmpi/include"
cp -a /usr/share/openmpi "$O/share/"
cp -a /etc/openmpi "$W/ompi/etc/"
cp -L /usr/bin/orterun /usr/bin/orted "$O/bin/"
ln -sf orterun "$O/bin/mpirun"
{
  for f in "$W"/progs/*; do ldd "$f"; done
  for f in "$O"/lib/$A/openmpi/lib/openmpi3/*.so "$O"/lib/$A/pmix2/lib/pmix/*.so "$O/bin/orterun"; do ldd "$f"; done
} 2>/dev/null | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E "/cuda|/libc\.so|/libm\.so|libpthread|/libdl\.so|/librt\.so|ld-linux|libstdc|libgcc_s|libmvec|libcuda\.so" |
  while read -r f; do cp -L "$f" "$W/lib/"; done

echo $FORMAT >"$W/format"
{
  echo "commit $(git -C "$P" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$P" diff --quiet HEAD -- compiler runtime 2>/dev/null || echo ' (with uncommitted changes in compiler/ or runtime/)')"
  echo "built $(date -u +%FT%TZ) on $(hostname) for $ARCH"
  echo "programs $(ls "$W/progs" | wc -l)"
  echo "build_failed $(tr '\n' ' ' <"$W/ref/build_failed.txt")"
  echo "ref_failed $bad"
} >"$W/info.txt"

# ---- pack: two xz streams in one file, read back as one (xz -dc | tar -xi).
# The programs first, by name, each one's copy of the runtime's kernels
# within the dictionary of the last ones' (76 programs of 14.8 MB, the fused
# attention's kernels half of each: 1000 MB in, 11 MB out with 128 MiB,
# 16 MB with 16 MiB; 45 s); then the libraries in one block at -9e (24.9 MB
# in 6 threads' blocks at -6, 23.7 MB so; about 2 minutes): the tree grew to
# 28.7 MB and the tree and .gpu must stay under the device call's 64 MiB.
log "packing $(du -sh "$W" | cut -f1)"
(cd "$W" && tar cf - --sort=name format info.txt progs | xz -T1 --lzma2=preset=3,dict=128MiB) >"$OUTF.tmp"
(cd "$W" && tar cf - --sort=name ref models lib ompi | xz -T1 -9e) >>"$OUTF.tmp"
mv "$OUTF.tmp" "$OUTF"
[ "${KEEP:-0}" = 1 ] || rm -rf "$W"
log "wrote $OUTF: $(du -h "$OUTF" | cut -f1) ($(stat -c %s "$OUTF") bytes)"
[ -z "$(echo $bad)" ] || { echo "build_bundle: CPU references failed: $bad" >&2; exit 1; }
