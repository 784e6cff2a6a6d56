#!/usr/bin/env bash
# A bounded fuzzing campaign against kdcc's front end (fuzz/fuzz_frontend.c:
# model JSON, distribution JSON, .keras) under libFuzzer with ASan and UBSan:
# FUZZ_SECONDS (default 60) from the seeds (tests/good, tests/bad, models,
# fuzz/corpus) and what earlier campaigns kept in build/fuzz/corpus. Any
# crash, sanitizer report, leak, internal error, hang (a run over FUZZ_TIMEOUT
# s of wall time, default 60: a loaded machine stalls runs for seconds) or
# error without its place fails, leaving the input in build/fuzz/ (see
# fuzz/README.md). Skips, saying so, where clang or its fuzzer runtime is
# missing.
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds=${FUZZ_SECONDS:-60}
cc=${FUZZ_CC:-clang}
skip() { echo "fuzz: SKIPPED: $*"; exit 0; }
command -v "$cc" >/dev/null || skip "$cc not found (make setup installs clang and libclang-rt-dev)"
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' >"$probe/p.c"
"$cc" -fsanitize=fuzzer,address,undefined -o "$probe/p" "$probe/p.c" >/dev/null 2>&1 ||
  skip "$cc cannot link -fsanitize=fuzzer (install libclang-rt-dev)"
make -s build/fuzz/fuzz_frontend FUZZ_CC="$cc" || exit 1

# Seeds: every kdcc input in the tree (a distribution spec as it is: the
# target pairs it with tests/good/seq_mlp.json), each model also as a
# .keras holding only its config.json.
seeds=build/fuzz/seeds corpus=build/fuzz/corpus
rm -rf $seeds && mkdir -p $seeds $corpus
# (a name in both: good/ and bad/ keep one seed each)
for f in tests/good/* tests/bad/*; do cp "$f" "$seeds/$(basename "$(dirname "$f")")_$(basename "$f")"; done
cp fuzz/corpus/* $seeds/ 2>/dev/null
for f in models/*.json; do
  case $f in *keras_layouts.json) continue ;; esac
  cp "$f" "$seeds/models_$(basename "$f")"
done
python3 - "$seeds" models/*.json <<'EOF' || exit 1
import sys, zipfile, os
out = sys.argv[1]
for f in sys.argv[2:]:
    if f.endswith('keras_layouts.json') or f.endswith('.dist.json'): continue
    with zipfile.ZipFile(os.path.join(out, os.path.basename(f) + '.keras'), 'w',
                         zipfile.ZIP_DEFLATED) as z:
        z.write(f, 'config.json')
EOF

export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
log=build/fuzz/last.log
build/fuzz/fuzz_frontend -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT:-60}" \
  -rss_limit_mb=2048 -max_len=20000 -dict=fuzz/kdcc.dict -print_final_stats=1 \
  -artifact_prefix=build/fuzz/ $corpus $seeds >$log 2>&1
rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' $log | tail -1)
if [ $rc != 0 ]; then
  grep -E "ERROR|error|SUMMARY|Test unit written|fuzz_frontend:" $log | head -30
  echo "fuzz: FAILED after ${runs:-?} runs (exit $rc); the full log is $log"
  exit 1
fi
echo "fuzz: ${runs:-?} runs in ${seconds} s, no crash, no sanitizer report, every error in place" \
     "(corpus: $(ls $corpus | wc -l) inputs in $corpus)"
