#!/bin/bash
# The device tool carries the checkout (tracked and untracked-not-ignored
# files) beside .gpu, 64 MiB in all. tests/fixtures (about 26 MB of Keras
# references) is never read on the device: device.sh runs the bundle's
# programs alone. So for a device call that also carries the base programs
# and the keras wheels (bench/GPU.md's "The next GPU session"):
#
#   bash tests/gpu/slim_tree.sh away   # before the call: fixtures beside the checkout
#   bash tests/gpu/slim_tree.sh back   # right after it
#   bash tests/gpu/slim_tree.sh size   # what the call would carry, in MB
#
# Commit nothing while they are away (git commit -a would delete them);
# `back` puts them back and checks git sees them unchanged, and a session
# that stopped in between gets them back with `git checkout -- tests/fixtures`.
set -euo pipefail
cd "$(dirname "$0")/../.."
away=../kdcc-fixtures.away
size() {
  local t c
  t=$(git ls-files -z | while IFS= read -r -d '' f; do [ -f "$f" ] && stat -c %s "$f"; done |
        awk '{s += $1} END {printf "%.1f", s / 1e6}')
  c=$( (du -cb .gpu/bundle.tar.xz .gpu/base.tar.xz .gpu/whl 2>/dev/null || true) |
        awk 'END {printf "%.1f", $1 / 1e6}')
  echo "slim_tree: checkout $t MB + .gpu $c MB (limit 67.1 MB)"
}
case ${1:-size} in
away)
  [ -e "$away" ] && { echo "slim_tree: $away exists: put it back first" >&2; exit 1; }
  [ -z "$(git status --porcelain tests/fixtures)" ] ||
    { echo "slim_tree: tests/fixtures has changes: commit them first" >&2; exit 1; }
  mv tests/fixtures "$away"
  size ;;
back)
  [ -d "$away" ] || { echo "slim_tree: nothing away ($away)" >&2; exit 1; }
  [ -e tests/fixtures ] && { echo "slim_tree: tests/fixtures is here already" >&2; exit 1; }
  mv "$away" tests/fixtures
  [ -z "$(git status --porcelain tests/fixtures)" ] ||
    { echo "slim_tree: tests/fixtures differs from git after the move" >&2; exit 1; }
  echo "slim_tree: tests/fixtures back, unchanged" ;;
size) size ;;
*) echo "usage: slim_tree.sh away|back|size" >&2; exit 2 ;;
esac
