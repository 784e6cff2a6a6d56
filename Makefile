# kdcc: `make` builds ./kdcc and the runtime; `make test` runs the tests;
# `make run` compiles the bundled example and trains it.

CC      ?= cc
MPICC   ?= mpicc
WARN    = -Wall -Wextra -Wshadow -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes \
          -Wno-unused-parameter -Wvla -Wformat=2
CFLAGS  ?= -O2 -g
PKGS    = jansson libpcre2-8 libzip
KCFLAGS = -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) $(shell pkg-config --cflags $(PKGS) 2>/dev/null) \
          -DKDRT_LIBS='"$(RT_LIBS)"' -DKDRT_MARCH='"$(MARCH)"'
KLIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm

# The CPU the runtime and the generated programs are built for: x86-64-v3
# (AVX2, FMA: every x86 server since about 2015), so that a program built on
# one machine runs on another of the same kind; `make MARCH=native` builds for
# this machine alone. kdcc builds programs with the same flag.
MARCH   ?= x86-64-v3
# The runtime's threads are OpenMP's (libgomp, OMP_NUM_THREADS): its own
# kernels, oneDNN's and the blocks of every matrix product, each block one
# single-threaded OpenBLAS call (runtime/ops.c), so OpenBLAS's own pool
# never runs beside them.
# -fno-trapping-math lets a loop with a select and a vmath.h call vectorise
# (it changes no result: nothing here reads floating-point exceptions).
RCFLAGS = -std=c11 -D_GNU_SOURCE $(WARN) -O3 -march=$(MARCH) -fno-math-errno -fno-trapping-math \
          -fopenmp -g -fPIC \
          -I/usr/include/x86_64-linux-gnu/openblas-pthread -I/usr/include/hdf5/serial

# What every program linked against the runtime needs, in one place: kdcc
# gets it compiled in (KDRT_LIBS), scripts ask `make -s rt-libs`.
RT_LIBS = -ldnnl -lopenblas -lmvec -lgomp -lzip -lhdf5_serial -lz -lm

COMPILER_SRCS = $(wildcard compiler/*.c)
COMPILER_HDRS = $(wildcard compiler/*.h compiler/*.def) runtime/kdrt_ops.def
COMPILER_OBJS = $(COMPILER_SRCS:compiler/%.c=build/compiler/%.o)
RUNTIME_SRCS  = $(wildcard runtime/*.c)
RUNTIME_OBJS  = $(RUNTIME_SRCS:runtime/%.c=build/runtime/%.o)
LIB_OBJS      = $(filter-out build/compiler/main.o,$(COMPILER_OBJS))

all: kdcc build/libkdrt.a

kdcc: $(COMPILER_OBJS)
	$(CC) -o $@ $^ $(KLIBS)

build/compiler/%.o: compiler/%.c $(COMPILER_HDRS) runtime/kdrt_defs.h \
                    runtime/kdrt_rnn.h runtime/kdrt_rope.h
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -c -o $@ $<

# Rewritten only when the build's flags change (MARCH, RT_LIBS), so that a
# change rebuilds the runtime and kdcc's compiled-in defaults.
build/flags.stamp: FORCE
	@mkdir -p build
	@echo "$(MARCH) $(RT_LIBS)" | cmp -s - $@ || echo "$(MARCH) $(RT_LIBS)" > $@
build/compiler/main.o: build/flags.stamp

# The runtime's headers: the API, the op and kernel list (kdrt_ops.def, which
# kdcc reads too), what the kernels share, the shared enums, the recurrent
# cells, the row losses, the normalizations, the optimizers' updates, rotary
# embedding, 16-bit rounding, the kernels' vectorised math, and what the
# kernel files share.
RT_HDRS = runtime/kdrt.h runtime/kdrt_ops.def runtime/kdrt_ops.h runtime/kdrt_defs.h \
          runtime/kdrt_rnn.h runtime/kdrt_philox.h runtime/kdrt_layers.h runtime/kdrt_loss.h runtime/kdrt_norm.h runtime/kdrt_optim.h \
          runtime/kdrt_rope.h runtime/kdrt_round.h runtime/vmath.h runtime/ops_impl.h

build/runtime/%.o: runtime/%.c $(RT_HDRS) build/flags.stamp
	@mkdir -p $(dir $@)
	$(MPICC) $(RCFLAGS) -c -o $@ $<

build/libkdrt.a: $(RUNTIME_OBJS)
	ar rcs $@ $^

# ---- tests: one Criterion binary per pass, plus whole-program runs
TEST_SRCS = $(wildcard tests/test_*.c)
TEST_BINS = $(TEST_SRCS:tests/%.c=build/tests/%)

build/tests/test_rt_%: tests/test_rt_%.c build/libkdrt.a
	@mkdir -p $(dir $@)
	$(MPICC) $(RCFLAGS) -Iruntime -o $@ $< build/libkdrt.a -lcriterion $(RT_LIBS)

build/tests/%: tests/%.c $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -Icompiler -o $@ $< $(LIB_OBJS) $(KLIBS) -lcriterion

# bench/bench.py's GEMM-bound figure: a step's matrix products timed alone
build/gemm_time: bench/gemm_time.c build/libkdrt.a
	$(MPICC) $(RCFLAGS) -Iruntime -o $@ $< build/libkdrt.a $(RT_LIBS)

export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

# setup first, then the build (under make -j the two would race: the build
# needs the headers setup installs).
test: setup
	@$(MAKE) --no-print-directory test-run

test-run: all $(TEST_BINS)
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; $$t --jobs 1; done
	@set -e; for s in tests/sh/*.sh; do echo "== $$s"; bash $$s; done
	@echo "all tests passed"

# Everything the build and the tests need, installed once (safe to repeat).
DEBS = build-essential pkg-config libjansson-dev libpcre2-dev libopenblas-dev libopenmpi-dev libdnnl-dev \
       openmpi-bin zlib1g-dev libcriterion-dev python3 libzip-dev libhdf5-dev \
       dataset-fashion-mnist fortunes clang libclang-rt-dev
setup:
	@missing=$$(for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "setup: installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi
	@# a machine whose mpicc link went missing: Debian's alternatives restore it
	@command -v mpicc >/dev/null 2>&1 || update-alternatives --auto mpi
	@# with nvcc: the cuDNN frontend's headers (CUDNN_FE, below), once; a failed
	@# download is said and the CUDA runtime builds without cuDNN's attention
	@if [ -n "$(NVCC)" ] && [ ! -f $(CUDNN_FE)/include/cudnn_frontend.h ]; then \
	  d=$$(mktemp -d) && echo "setup: the cuDNN frontend $(CUDNN_FE_VERSION)'s headers into $(CUDNN_FE)" && \
	  if python3 -m pip download -q --no-deps -d $$d nvidia-cudnn-frontend==$(CUDNN_FE_VERSION) && \
	     python3 -m zipfile -e $$d/*.whl $$d/x && [ -f $$d/x/include/cudnn_frontend.h ]; then \
	    mkdir -p $(CUDNN_FE) && rm -rf $(CUDNN_FE)/include && cp -r $$d/x/include $(CUDNN_FE)/; \
	  else echo "setup: could not get the cuDNN frontend's headers: the CUDA runtime builds without cuDNN's attention"; fi; \
	  rm -rf $$d; fi

# The Fashion-MNIST MLP (examples/fashion_mnist), compiled for the (2,4) mesh,
# trained on the 60,000 images of dataset-fashion-mnist, evaluated on the 10,000
# test images (RUN_ARGS go to the training program, e.g. RUN_ARGS="--epochs 2").
run: setup
	@$(MAKE) --no-print-directory all
	bash examples/fashion_mnist/train.sh mlp $(RUN_ARGS)

clean:
	rm -rf build kdcc

# ---- test-keras: re-run real Keras (tests/keras_ref/run_ref.py; needs the packages in
# tests/keras_ref/requirements.txt, KERAS_PYTHON=/path/to/venv/bin/python) into a temp
# dir and compare with the committed tests/fixtures/keras_ref/. Not part of `make test`.
test-keras:
	@d=$$(mktemp -d); $${KERAS_PYTHON:-python3} tests/keras_ref/run_ref.py --out $$d \
	  --check tests/fixtures/keras_ref; s=$$?; rm -rf $$d; exit $$s
.PHONY: test-keras

# ---- bench: kdcc vs PyTorch vs Keras-on-JAX steps/s on this CPU (bench/RESULTS.md)
bench:
	@bash bench/bench.sh $(BENCH_ARGS)

# How builds grow with the model (1000-layer MLP, 48-block GPT), a table.
bench-build:
	@bash bench/build_time.sh

rt-libs:
	@echo $(RT_LIBS)

rt-march:
	@echo $(MARCH)

.PHONY: all test test-run setup run clean rt-libs rt-march bench bench-build

# kdcc built with AddressSanitizer and UBSan, for the bad-input corpus
ASAN_OBJS = $(COMPILER_SRCS:compiler/%.c=build/asan/%.o)
build/asan/%.o: compiler/%.c $(COMPILER_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -c -o $@ $<
build/asan/kdcc: $(ASAN_OBJS)
	$(CC) -fsanitize=address,undefined -o $@ $^ $(KLIBS)

# ---- fuzz: the front end under libFuzzer with ASan and UBSan (fuzz/fuzz_frontend.c). `make fuzz`
# runs a campaign of FUZZ_SECONDS from the seeds (tests/good, tests/bad, models, fuzz/corpus) and
# what earlier campaigns found (build/fuzz/corpus); tests/sh/fuzz.sh (part of `make test`) runs
# one of about a minute and skips, saying so, without clang's fuzzer runtime.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SAN      = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
               -Wno-format-nonliteral
FUZZ_OBJS     = $(LIB_OBJS:build/compiler/%.o=build/fuzz/%.o)
build/fuzz/%.o: compiler/%.c $(COMPILER_HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(KCFLAGS) -O1 -g -fsanitize=fuzzer-no-link $(FUZZ_SAN) -c -o $@ $<
build/fuzz/fuzz_frontend: fuzz/fuzz_frontend.c $(FUZZ_OBJS)
	$(FUZZ_CC) $(KCFLAGS) -O1 -g -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $^ $(KLIBS)
fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash tests/sh/fuzz.sh
.PHONY: fuzz

# ---- CUDA backend (kdcc --target cuda): runtime/cuda/*.cu as build/libkdrt_cuda.a.
# Part of `all` when nvcc is found (else `all` says it skipped it, in one line); `make
# cuda` builds it or fails (tests/sh/cuda_build.sh uses it). NVCC: nvcc on PATH, else
# /usr/local/cuda/bin/nvcc. CUDA_ARCH: the GPU nvidia-smi reports, else sm_90;
# the library holds that SASS plus its PTX (newer GPUs JIT it). build/libkdrt_cuda.arch
# records it for kdcc. -fmad=false: no contracted multiply-adds, as the CPU runtime
# (ISO C, -ffp-contract=off), so elementwise results match it bit for bit or nearly.
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_ARCH ?= $(or $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
               | awk -F. 'NR==1 && $$2 != "" {print "sm_" $$1 $$2}'),sm_90)
CUDA_SRCS  = $(wildcard runtime/cuda/*.cu)
CUDA_OBJS  = $(CUDA_SRCS:runtime/cuda/%.cu=build/cuda/%.o)
NVCCFLAGS  = -std=c++17 -O3 -lineinfo -fmad=false \
             -gencode arch=compute_$(CUDA_ARCH:sm_%=%),code=[$(CUDA_ARCH),compute_$(CUDA_ARCH:sm_%=%)] \
             -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter -DOMPI_SKIP_MPICXX=1 \
             -DMPICH_SKIP_MPICXX=1 -Iruntime -Iruntime/cuda \
             $(filter -I% -D%,$(shell $(MPICC) --showme:compile 2>/dev/null))

cuda: all build/libkdrt_cuda.a
	@echo "cuda: build/libkdrt_cuda.a for $$(cat build/libkdrt_cuda.arch) with $(NVCC)"
	@$(if $(CUDNN_FE_H),:,echo "cuda: without cuDNN's attention: no $(CUDNN_FE)/include (make setup fetches the cuDNN frontend's headers)")

# Rewritten only when CUDA_ARCH changes, so that a change rebuilds the objects.
build/cuda/arch.stamp: FORCE
	@mkdir -p build/cuda
	@if [ -z "$(NVCC)" ]; then echo "cuda: nvcc not found (install the CUDA toolkit or set NVCC)"; exit 1; fi
	@echo $(CUDA_ARCH) | cmp -s - $@ || echo $(CUDA_ARCH) > $@

build/cuda/%.o: runtime/cuda/%.cu runtime/cuda/common.cuh runtime/cuda/kdrt_cuda.h \
                runtime/cuda/cudnn_attn.h $(RT_HDRS) build/cuda/arch.stamp
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# cuDNN's attention (cudnn_attn.cu) through the cuDNN frontend's graph API:
# header-only C++ (MIT), not vendored, CUDNN_FE's include/ from the pinned
# wheel that `make setup` downloads and unpacks (on a machine with nvcc).
# Only this translation unit includes it (-isystem: its warnings are not
# ours); without it cudnn_attn.cu builds its stub (kdcc's kernels, said at
# run time) and `make cuda` says so.
CUDNN_FE_VERSION = 1.32.0
CUDNN_FE        = build/cudnn-frontend
CUDNN_FE_H      = $(wildcard $(CUDNN_FE)/include/cudnn_frontend.h)
build/cuda/cudnn_attn.o: NVCCFLAGS += $(if $(CUDNN_FE_H),-isystem $(CUDNN_FE)/include -DKDRT_CUDNN_FE=1)
build/cuda/cudnn_attn.o: build/cuda/cudnn_fe.stamp
# Rewritten only when the headers come or go, so that cudnn_attn.o follows.
build/cuda/cudnn_fe.stamp: FORCE
	@mkdir -p build/cuda
	@echo $(if $(CUDNN_FE_H),$(CUDNN_FE_VERSION),none) | cmp -s - $@ || \
	  echo $(if $(CUDNN_FE_H),$(CUDNN_FE_VERSION),none) > $@

build/libkdrt_cuda.a: $(CUDA_OBJS)
	ar rcs $@ $^
	cp build/cuda/arch.stamp build/libkdrt_cuda.arch

ifneq ($(NVCC),)
all: build/libkdrt_cuda.a
else
all: cuda-skipped
cuda-skipped:
	@echo "all: skipped build/libkdrt_cuda.a (the CUDA runtime): nvcc not found (install the CUDA toolkit or set NVCC)"
.PHONY: cuda-skipped
endif

# On a machine with a GPU: every kernel against the CPU runtime, losses of the
# CUDA programs against the CPU programs', a (2,2) mesh on one GPU; then the
# correctness phases of tests/gpu/device.sh (GPU_PHASES) on a bundle built for
# this GPU in build/tests/gpu_device/. Skips cleanly (exit 0) without a GPU or
# without nvcc.
GPU_PHASES ?= env,corr,faults,mesh
test-gpu: setup
	@$(MAKE) --no-print-directory all
	@set -e; for s in tests/sh/gpu_*.sh; do echo "== $$s"; bash $$s; done
	@if [ -z "$(NVCC)" ]; then echo "test-gpu: device.sh skipped: nvcc not found"; \
	elif ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then \
	  echo "test-gpu: device.sh skipped: no GPU (nvidia-smi lists none)"; \
	else echo "== tests/gpu/device.sh (PHASES=$(GPU_PHASES))"; \
	  $(MAKE) -s gpu-bundle GPU_BUNDLE_ARCH=$(CUDA_ARCH) GPU_BUNDLE=build/tests/gpu_device/bundle.tar.xz && \
	  PHASES=$(GPU_PHASES) DL=$${DL:-900} OUT=build/tests/gpu_device/out WORK=build/tests/gpu_device/work \
	    bash tests/gpu/device.sh build/tests/gpu_device; fi
	@echo "all GPU tests passed (or skipped)"

# ---- gpu-bundle: everything a GPU machine needs to check kdcc, built here
# without a GPU (tests/gpu/build_bundle.sh: every program for GPU_BUNDLE_ARCH,
# the CPU references, the shared libraries, a relocatable Open MPI) into
# GPU_BUNDLE; about 90 s on 2 cores, about 32 MB. On the GPU machine,
# with the checkout and .gpu/ copied there: bash tests/gpu/device.sh .gpu
GPU_BUNDLE_ARCH ?= sm_90
GPU_BUNDLE      ?= .gpu/bundle.tar.xz
gpu-bundle:
	@[ -f $(CUDNN_FE)/include/cudnn_frontend.h ] || { echo "gpu-bundle: no $(CUDNN_FE)/include" \
	  "(the cuDNN frontend's headers, for cuDNN's attention): run make setup first"; exit 1; }
	@$(MAKE) -s cuda CUDA_ARCH=$(GPU_BUNDLE_ARCH)
	CUDA_ARCH=$(GPU_BUNDLE_ARCH) bash tests/gpu/build_bundle.sh . $(GPU_BUNDLE)

# ---- bench-gpu: kdcc against PyTorch and Keras-JAX on this machine's GPU, GPT-2's
# 124M shape included, into bench/GPU_RESULTS.md (tests/gpu/bench_gpu.sh; skips
# without a GPU). bench/GPU.md is the analysis of such runs.
bench-gpu: setup
	@$(MAKE) --no-print-directory all
	@bash tests/gpu/bench_gpu.sh

FORCE:
.PHONY: cuda test-gpu gpu-bundle bench-gpu FORCE
