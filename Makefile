# kdcc: `make` builds ./kdcc and the runtime; `make test` runs the tests;
# `make run` compiles the bundled example and trains it.

CC      ?= cc
MPICC   ?= mpicc
WARN    = -Wall -Wextra -Wshadow -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes \
          -Wno-unused-parameter -Wvla -Wformat=2
CFLAGS  ?= -O2 -g
PKGS    = jansson libpcre2-8
KCFLAGS = -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
KLIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lz -lm
RCFLAGS = -std=c11 -D_GNU_SOURCE $(WARN) -O3 -g -fPIC -I/usr/include/x86_64-linux-gnu/openblas-pthread

COMPILER_SRCS = $(wildcard compiler/*.c)
COMPILER_OBJS = $(COMPILER_SRCS:compiler/%.c=build/compiler/%.o)
RUNTIME_SRCS  = $(wildcard runtime/*.c)
RUNTIME_OBJS  = $(RUNTIME_SRCS:runtime/%.c=build/runtime/%.o)
LIB_OBJS      = $(filter-out build/compiler/main.o,$(COMPILER_OBJS))

all: kdcc build/libkdrt.a

kdcc: $(COMPILER_OBJS)
	$(CC) -o $@ $^ $(KLIBS)

build/compiler/%.o: compiler/%.c compiler/kdcc.h compiler/ops.def
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -c -o $@ $<

build/runtime/%.o: runtime/%.c runtime/kdrt.h
	@mkdir -p $(dir $@)
	$(MPICC) $(RCFLAGS) -c -o $@ $<

build/libkdrt.a: $(RUNTIME_OBJS)
	ar rcs $@ $^

# ---- tests: one Criterion binary per pass, plus whole-program runs
TEST_SRCS = $(wildcard tests/test_*.c)
TEST_BINS = $(TEST_SRCS:tests/%.c=build/tests/%)

build/tests/test_rt_%: tests/test_rt_%.c build/libkdrt.a
	@mkdir -p $(dir $@)
	$(MPICC) $(RCFLAGS) -Iruntime -o $@ $< build/libkdrt.a -lcriterion -lopenblas -lm

build/tests/%: tests/%.c $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -Icompiler -o $@ $< $(LIB_OBJS) $(KLIBS) -lcriterion

export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

test: setup all $(TEST_BINS)
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; $$t --jobs 1; done
	@set -e; for s in tests/sh/*.sh; do echo "== $$s"; bash $$s; done
	@echo "all tests passed"

# Everything the build and the tests need, installed once (safe to repeat).
DEBS = build-essential pkg-config libjansson-dev libpcre2-dev libopenblas-dev libopenmpi-dev \
       openmpi-bin zlib1g-dev libcriterion-dev python3
setup:
	@missing=$$(for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "setup: installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

run: setup all
	./kdcc models/seed_mlp.json --distribution models/seed_mlp_fixed.dist.json --batch-size 16 \
	  --report -o build/seed_mlp
	mpirun -np 8 ./build/seed_mlp --synthetic 128 --epochs 3 --batch-size 16

clean:
	rm -rf build kdcc

# ---- bench: kdcc vs PyTorch vs Keras-on-JAX steps/s on this CPU (bench/RESULTS.md)
bench:
	@bash bench/bench.sh $(BENCH_ARGS)

.PHONY: all test setup run clean bench

# kdcc built with AddressSanitizer and UBSan, for the bad-input corpus
ASAN_OBJS = $(COMPILER_SRCS:compiler/%.c=build/asan/%.o)
build/asan/%.o: compiler/%.c compiler/kdcc.h compiler/ops.def
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -c -o $@ $<
build/asan/kdcc: $(ASAN_OBJS)
	$(CC) -fsanitize=address,undefined -o $@ $^ $(KLIBS)
