#!/usr/bin/env bash
# The CUDA backend builds everywhere, GPU or not: runtime/cuda compiled once
# into build/libkdrt_cuda.a, then every bundled model's CUDA program
# (kdcc --target cuda) for its own distribution and for one device, emitted
# twice (the same text both times), compiled with nvcc -O2 and linked
# against cuBLAS, NCCL and MPI, without a warning. Running the programs
# needs a GPU: `make test-gpu` (tests/sh/gpu_*.sh) does that.
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}
if [ -z "$NVCC" ]; then
  echo "cuda_build: skipping: nvcc not found (no CUDA toolkit on this machine)"
  exit 0
fi
export PATH="$(dirname "$NVCC"):$PATH"
gpu=0
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "cuda_build: skipping GPU runs: no GPU (nvidia-smi not found); building only"
elif ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "cuda_build: skipping GPU runs: no GPU (nvidia-smi lists none); building only"
else
  gpu=1
fi
start=$SECONDS
make -s -j"$(nproc)" cuda NVCC="$NVCC"
out=build/tests/cuda_build
mkdir -p $out
fail=0
build() { # name, then kdcc arguments
  local name=$1; shift
  local log=$out/$name.log
  if ! ./kdcc "$@" --target cuda -w -S $out/a >$log 2>&1 ||
     ! ./kdcc "$@" --target cuda -w -S $out/b >>$log 2>&1; then
    echo "FAIL $name: kdcc -S failed:"; cat $log; fail=1; return
  fi
  if ! cmp -s $out/a/program.cu $out/b/program.cu; then
    echo "FAIL $name: program.cu differs between two runs"; fail=1; return
  fi
  if ! ./kdcc "$@" --target cuda -w -o $out/$name >$log 2>&1; then
    echo "FAIL $name: nvcc build failed:"; cat $log; fail=1; return
  fi
  if grep -qi "warning" $log; then
    echo "FAIL $name: the build warns:"; cat $log; fail=1; return
  fi
  echo "cuda_build: $name: deterministic, built without warnings ($(stat -c %s $out/$name) bytes)"
}
for m in seed_mlp func_branches cnn megatron wide_mlp; do
  build ${m}_dist models/$m.json --distribution models/$m.dist.json --batch-size 16
  [ $m = wide_mlp ] && continue # its spec already is one device
  build ${m}_1 models/$m.json --distribution models/$m.dist.json --mesh data=1,model=1 --batch-size 16
done
# the op core's ops: gather/scatter-add, split crossentropy, several inputs and outputs,
# Multiply, Permute, a sum over a dim
build per_token_dist models/per_token.json --distribution models/per_token.dist.json --batch-size 16
build two_heads_dist models/two_heads.json --distribution models/two_heads.dist.json --batch-size 16
build attention_dist tests/gradcheck/attention.json --distribution tests/good/attention.dist.json --batch-size 16
build gated_dist tests/gradcheck/gated.json --distribution tests/good/gated.dist.json --batch-size 16
# issue 11: regularizers (abs, penalties into the loss), constraints (clip_norm, assign)
build regularizers_dist tests/gradcheck/regularizers.json --distribution tests/good/regularizers.dist.json --batch-size 16
build constrained_dist tests/gradcheck/constrained.json --distribution tests/good/constrained.dist.json --batch-size 16
build conv1d_dist tests/gradcheck/conv1d.json --distribution tests/good/conv1d.dist.json --batch-size 16
build dilated_dist tests/gradcheck/dilated.json --distribution tests/good/dilated.dist.json --batch-size 16
build grouped_dist tests/gradcheck/grouped.json --distribution tests/good/grouped.dist.json --batch-size 16
build transpose_dist tests/gradcheck/transpose.json --distribution tests/good/transpose.dist.json --batch-size 16
# issue 11: activation layers with parameters (pact, pact_grad)
build pact_1 tests/gradcheck/pact.json --batch-size 16
build glu_1 tests/gradcheck/glu.json --batch-size 16 # issue 25
# issue 11: the losses (the hinge losses' not_binary all-reduced, max)
build losses_reg_dist tests/gradcheck/losses_reg.json --distribution tests/good/losses.dist.json --batch-size 16
build losses_cls_dist tests/gradcheck/losses_cls.json --distribution tests/good/losses.dist.json --batch-size 16
# issue 11: every optimizer (Nadam, Adagrad's accumulator, Lion, RMSprop centered, Adam
# amsgrad, Adamax), clipping (global norm, per gradient, by value), weight decay, schedules
for m in opt_nadam_global opt_adagrad_clipnorm opt_lion_clipvalue opt_rmsprop_centered \
         opt_adam_amsgrad opt_adamax; do
  build ${m}_dist tests/good/$m.json --distribution tests/good/opt.dist.json --batch-size 16
done
build merging_dist tests/gradcheck/merging.json --distribution tests/good/merging.dist.json --batch-size 16
build norms_acts_dist tests/gradcheck/norms_acts.json --distribution tests/good/norms_acts.dist.json --batch-size 16
build noise_norms_dist tests/gradcheck/noise_norms.json --distribution tests/good/noise_norms.dist.json --batch-size 16
build conv1d_family_dist tests/gradcheck/conv1d_family.json --distribution tests/good/conv1d_family.dist.json --batch-size 16
build normalization_dist tests/gradcheck/normalization.json --distribution tests/good/normalization.dist.json --batch-size 16
# issue 25: adapted Normalizations (their statistics variables, count an int32 in the file; sqrt)
build normalization_adapted_dist tests/gradcheck/normalization_adapted.json \
  --distribution tests/good/normalization.dist.json --batch-size 16
build transpose_op_dist tests/gradcheck/transpose_op.json --distribution tests/good/transpose_op.dist.json --batch-size 16
# issue 11: recurrent layers (recur, recur_grad, reverse), the LSTMs' kernels split
build rnn_dist tests/gradcheck/rnn.json --distribution tests/good/rnn.dist.json --batch-size 16
# issue 24: rotary embedding (its frequencies a descriptor passed by value) on heads,
# features and a sequence split
build rope_dist tests/gradcheck/rope.json --distribution tests/good/rope.dist.json --batch-size 16
build frozen_dist tests/gradcheck/frozen.json --distribution tests/good/frozen.dist.json --batch-size 16
build nested_dist models/nested.json --distribution models/nested.dist.json --batch-size 16
build cnn_tf32 models/cnn.json --distribution models/cnn.dist.json --batch-size 16 --precision tf32
# issue 22: attention fused at bf16 and tf32 (attn.cu), heads split over 'model' and one device
build gpt_bf16_dist models/gpt.json --distribution models/gpt.dist.json --batch-size 16 --precision bf16 --attention fused
build gpt_tf32_1 models/gpt.json --batch-size 16 --precision tf32 --attention fused
# issue 23: mixed_float16 with Keras's LossScaleOptimizer (the seeds scaled, the step's
# decision on the host: kdrt_cuda_loss_scale_step; no CUDA graph)
build mixed_f16_dist tests/fixtures/keras_ref/mixed_f16_mlp/model.keras \
  --distribution tests/fixtures/keras_ref/mixed_f16_mlp/mixed_f16_mlp.dist.json --batch-size 16
# issue 23: 16-bit values gathered and moved all-to-all in 16 bits (kdrt_cuda_allgather16,
# kdrt_cuda_alltoall16): the mixed_bfloat16 GPT under FSDP and sequence parallelism
build gpt_mixed_fsdp models/gpt.json --distribution models/gpt_fsdp.dist.json --batch-size 16 \
  --dtype-policy mixed_bfloat16
build gpt_mixed_seqpar models/gpt.json --distribution tests/good/gpt_seqpar.dist.json \
  --batch-size 16 --dtype-policy mixed_bfloat16
for f in gpt_mixed_fsdp:allgather16 gpt_mixed_seqpar:alltoall16; do
  grep -q "kdrt_cuda_${f#*:}(d," $out/${f%:*}.kdcc.d/program.cu ||
    { echo "FAIL ${f%:*}: no kdrt_cuda_${f#*:}"; fail=1; }
done
# The command line refuses what it cannot do, with a message.
if ./kdcc models/cnn.json --target cuda --cuda-arch 90 -S $out/a 2>$out/err.txt; then
  echo "FAIL: --cuda-arch 90 accepted"; fail=1
elif ! grep -q "not an architecture such as sm_90" $out/err.txt; then
  echo "FAIL: --cuda-arch 90: unexpected message: $(cat $out/err.txt)"; fail=1
fi
if ./kdcc models/cnn.json --precision tf32 -S $out/a 2>$out/err.txt; then
  echo "FAIL: --precision without --target cuda accepted"; fail=1
fi
# The program a run with a larger --batch-size can replan (the device arena and
# input buffers follow the run's batch), and whose every runtime call records
# its line first (kdrt_cuda_at: a GPU fault names the op).
src=build/tests/cuda_build/cnn_1.kdcc.d/program.cu
if ! grep -q "narena_plan = (int)(sizeof arena_plan / sizeof \*arena_plan)" $src; then
  echo "FAIL: $src: no arena plan for a larger run batch"; fail=1
fi
if ! grep -q "^#define kdrt_cuda_matmul(d, ...) (kdrt_cuda_at((d), \"matmul\", __FILE__, __LINE__), kdrt_cuda_matmul((d), __VA_ARGS__))" $src; then
  echo "FAIL: $src: the calls do not record their lines"; fail=1
fi
calls=$(sed -n '/^static void forward/,$p' $src | grep -o "kdrt_cuda_[a-z0-9_]*(d," | sort -u | sed 's/(d,//')
for f in $calls; do
  grep -q "^#define $f(d, " $src || { echo "FAIL: $src: $f called without recording its line"; fail=1; }
done
# issue 22: KDRT_CUDA_CUDNN=1 dlopens libcudnn.so.9: a program needs no cuDNN
# to start, and every entry runtime/cuda/cudnn.cu resolves by name is one of
# the library's (where this machine has it: beside nvcc's libraries)
if ldd $out/cnn_1 | grep -q libcudnn; then
  echo "FAIL: cnn_1 is linked against cuDNN: $(ldd $out/cnn_1 | grep libcudnn)"; fail=1
fi
dnn=$(ls "$(dirname "$(readlink -f "$NVCC")")"/../lib*/libcudnn.so.9 \
  "$(dirname "$(readlink -f "$NVCC")")"/../targets/*/lib/libcudnn.so.9 2>/dev/null | head -1)
if [ -z "$dnn" ]; then
  echo "cuda_build: skipping the cuDNN entries' check: no libcudnn.so.9 beside nvcc"
else
  names=$(sed -n '/^#define KDRT_CUDNN_FNS/,/^$/p' runtime/cuda/cudnn.cu | grep -o 'X(cudnn[A-Za-z0-9_]*)' |
    sed 's/X(\(.*\))/\1/')
  if ! python3 - "$dnn" $names <<'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
missing = [n for n in sys.argv[2:] if not hasattr(lib, n)]
lib.cudnnGetVersion.restype = ctypes.c_size_t
v = lib.cudnnGetVersion()
if missing or v // 10000 != 9 or len(sys.argv) < 20:
    sys.exit(f"{len(sys.argv) - 2} names, version {v}; not in {sys.argv[1]}: {' '.join(missing)}")
print(f"cuda_build: cudnn.cu's {len(sys.argv) - 2} cuDNN entries are in {sys.argv[1]} (version {v})")
PY
  then echo "FAIL: cudnn.cu's cuDNN entries"; fail=1; fi
fi
# and every libcudnn entry the cuDNN frontend's shim resolves by name (cudnn_attn.cu)
fe_shim=build/cudnn-frontend/include/cudnn_frontend_shim.h
if [ -n "$dnn" ] && [ -f $fe_shim ]; then
  fe_names=$(grep -o "NV_FE_CALL_TO_BACKEND([a-z_0-9]*, *cudnn[A-Za-z0-9_]*" $fe_shim | sed 's/.*, *//' | sort -u)
  have=$(nm -D --defined-only "$dnn" | awk '{print $3}' | sed 's/@.*//' | sort -u)
  missing=$(comm -23 <(echo "$fe_names") <(echo "$have") | paste -sd' ')
  if [ -n "$missing" ] || [ "$(echo "$fe_names" | wc -l)" -lt 10 ]; then
    echo "FAIL: the cuDNN frontend's entries not in $dnn: ${missing:-(too few names read)}"; fail=1
  else
    echo "cuda_build: the cuDNN frontend's $(echo "$fe_names" | wc -l) entries are in $dnn"
  fi
fi
# cudnn_attn.cu's graphs of cuDNN's attention validated for sm_90 by the frontend
# on this machine's libcudnn, no GPU touched (tests/cudnn_attn_check.cu)
if [ -n "$dnn" ] && [ -f $fe_shim ]; then
  mpi_inc=$(mpicc --showme:compile 2>/dev/null | tr ' ' '\n' | grep '^-[ID]' | paste -sd' ' || true)
  if ! "$NVCC" -std=c++17 -O1 -Xcompiler -Wall,-Wextra -Iruntime -Iruntime/cuda $mpi_inc \
    -o $out/cudnn_attn_check tests/cudnn_attn_check.cu build/cuda/cudnn_attn.o build/cuda/cudnn.o \
    -ldl >$out/cudnn_attn_check.log 2>&1 || [ -s $out/cudnn_attn_check.log ]; then
    cat $out/cudnn_attn_check.log; echo "FAIL: tests/cudnn_attn_check.cu does not build cleanly"; fail=1
  elif ! LD_LIBRARY_PATH=$(dirname "$dnn") $out/cudnn_attn_check; then
    echo "FAIL: cuDNN's attention graphs"; fail=1
  fi
fi
# issue 22: cuDNN's attention (cudnn_attn.cu) is in the runtime when the cuDNN
# frontend's headers are (make setup), and a program that opts in
# (KDRT_CUDA_CUDNN=1) loads no libcudnn and no libcudart at start-up: the frontend
# opens them on the first attention, so without a GPU it stops where it stops
# without the variable, with the same words
if [ -f build/cudnn-frontend/include/cudnn_frontend.h ] &&
  [ "$(nm -C build/libkdrt_cuda.a 2>/dev/null | grep -c "cudnn_frontend::cudnn_dlhandle" || true)" = 0 ]; then
  echo "FAIL: build/cudnn-frontend is here but libkdrt_cuda.a has no cuDNN attention"; fail=1
fi
if [ $gpu = 0 ]; then
  plain=$($out/cnn_1 --epochs 1 2>&1 | tail -1 || true)
  opted=$(KDRT_CUDA_CUDNN=1 LD_DEBUG=files $out/cnn_1 --epochs 1 2>&1 || true)
  loads=$(grep "file=libcudnn\|file=libcudart" <<<"$opted" | head -3 || true)
  if [ -n "$loads" ]; then
    echo "FAIL: KDRT_CUDA_CUDNN=1 loads cuDNN or cudart before the first attention: $loads"; fail=1
  elif [ "$(grep -v "^ *[0-9]*:" <<<"$opted" | tail -1 || true)" != "$plain" ]; then
    echo "FAIL: KDRT_CUDA_CUDNN=1 changes the start-up without a GPU: $(tail -1 <<<"$opted")"; fail=1
  fi
fi
# With a GPU, one quick run: every kernel against the CPU runtime (the
# full GPU checks are `make test-gpu`).
if [ $gpu = 1 ] && [ $fail = 0 ]; then
  $out/cnn_1 opcheck >$out/opcheck.txt 2>&1 || { cat $out/opcheck.txt; echo "FAIL: opcheck"; fail=1; }
  tail -1 $out/opcheck.txt
fi
[ $fail = 0 ] || exit 1
echo "cuda_build: all CUDA programs built in $((SECONDS - start))s"
