#!/usr/bin/env bash
# base_progs.sh: an earlier commit's speed programs, for device.sh's EXTRA,
# so that a GPU run times the old and the new program on one card in one
# run (the speed table's "base" column; bench/GPU.md's run 4).
#
#   bash tests/gpu/base_progs.sh COMMIT [OUT]      OUT: default .gpu/base.tar.xz
#
# Builds COMMIT's kdcc and CUDA runtime in a temporary worktree, compiles
# there the speed programs its own build_bundle.sh lists (the p_* lines of
# --list; GPT2="bf16 tf32" adds GPT-2's shape where that commit knows it),
# each renamed p_MODEL_PRECbase, and packs them. Then, on the GPU machine:
#   EXTRA=.gpu/base.tar.xz PERF="gpt_med:bf16:16 gpt_med:bf16base:16" \
#     bash tests/gpu/device.sh .gpu
# About a minute and a half on 2 cores; CUDA_ARCH as make gpu-bundle's.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 COMMIT [OUT]" >&2; exit 2; }
cd "$(dirname "$0")/../.."
commit=$(git rev-parse --verify "$1^{commit}") ||
  { echo "$0: $1: no such commit" >&2; exit 2; }
OUT=$(realpath -m "${2:-.gpu/base.tar.xz}")
ARCH=${CUDA_ARCH:-sm_90}
W=$(mktemp -d /tmp/kdcc-base.XXXXXX)
trap 'git worktree remove --force "$W/src" >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
git worktree add --detach -q "$W/src" "$commit"
make -C "$W/src" -s -j"$(nproc)" kdcc build/libkdrt.a >"$W/make.log" 2>&1 &&
  make -C "$W/src" -s cuda CUDA_ARCH="$ARCH" >>"$W/make.log" 2>&1 ||
  { tail -20 "$W/make.log" >&2; echo "$0: $commit does not build" >&2; exit 1; }
mkdir -p "$W/pack/progs"
n=0
while read -r name args; do
  # (each line: NAME then kdcc's arguments, paths relative to the checkout)
  # shellcheck disable=SC2086
  if (cd "$W/src" && ./kdcc $args -w -o "$W/pack/progs/${name}base") >"$W/$name.log" 2>&1; then
    n=$((n + 1))
  else
    echo "$0: $name did not build at $commit (kept going):" >&2
    tail -3 "$W/$name.log" >&2
  fi
done < <(cd "$W/src" && CUDA_ARCH=$ARCH bash tests/gpu/build_bundle.sh --list | grep '^p_')
[ $n -gt 0 ] || { echo "$0: no speed program built at $commit" >&2; exit 1; }
# only the programs: the bundle brings the libraries they load
(cd "$W/pack" && find progs -type f -name 'p_*base' | sort | tar cf - -T -) | xz -9 -T0 >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "base_progs: $n programs of $(git log -1 --format='%h %s' "$commit" | cut -c1-60) in $OUT"
