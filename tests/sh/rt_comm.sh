#!/usr/bin/env bash
# rt_comm.sh: runs tests/rt_comm_check.c (every collective of runtime/comm.c
# on every mesh of the world's size, against a serial reference) under
# mpirun with several world sizes. Exit status 0 when all pass.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

make -s build/libkdrt.a
mkdir -p build/tests
mpicc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -g -Iruntime \
  -o build/tests/rt_comm_check tests/rt_comm_check.c build/libkdrt.a $(make -s rt-libs)

status=0
# Without mpirun: a singleton world of one rank.
build/tests/rt_comm_check 4 || status=1
for np in 1 2 3 4 6 8; do
  # Meshes with up to 4 axes; 8 ranks covers (8,), (2,4), (4,2), (1,8), (2,2,2), ...
  if ! mpirun --oversubscribe -np "$np" build/tests/rt_comm_check 4; then
    echo "rt_comm.sh: FAIL with -np $np" >&2
    status=1
  fi
done
[ "$status" = 0 ] && echo "rt_comm.sh: ok"
exit "$status"
