# common.sh: what every example's train.sh does first, sourced from it.
#
# Moves to the repository root, lets Open MPI run as root with more ranks
# than cores (CI machines and containers run as root on 2 cores), and builds
# the compiler and the runtime. ranks_of MESH prints how many ranks a mesh
# such as data=2,model=4 needs (the product of its sizes); example_text
# [FILE] the text an example trains on, as an absolute path.
KDCC_FROM=$PWD # where the example was run: a file name given is relative to it
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
make -s kdcc build/libkdrt.a

ranks_of() {
  local n=1 axis
  for axis in ${1//,/ }; do n=$((n * ${axis#*=})); done
  echo "$n"
}

# FILE (relative to where the example was run), else the poems and songs of
# Debian's fortunes package; an error naming it when it is not there.
example_text() {
  local t=${1:-/usr/share/games/fortunes/songs-poems}
  [[ $t == /* ]] || t=$KDCC_FROM/$t
  [ -f "$t" ] || { echo "$0: $t not found: give a text file, or apt-get install fortunes" >&2; return 1; }
  realpath "$t"
}
