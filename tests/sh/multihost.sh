#!/usr/bin/env bash
# multihost.sh: a training program across several hosts, for real. The
# hosts are network namespaces on this machine (h0, h1, h2: a veth each to
# a bridge in a fourth namespace, addresses 10.77.0.1-3, a hostname each
# through a UTS namespace), Open MPI's TCP transport between them, and a
# launch agent that enters a host's namespace where ssh would log in.
#  1. 3 hosts x 2 ranks on the (3,2) mesh give the numbers of one host;
#  2. one host's link goes down mid-run: the job ends within the watchdog's
#     --timeout plus the time TCP takes to give a lost peer up (Open MPI's
#     keepalive for idle links, net.ipv4.tcp_retries2 for unanswered data:
#     set low here, as on a cluster that wants lost hosts noticed soon),
#     with a message: a watchdog's, naming where its rank waited, or Open
#     MPI's lost daemon;
#  3. --resume from the last checkpoint on 2 hosts (the (2,2) mesh) gives
#     the history of an uninterrupted run on that mesh.
# Needs root and network namespaces; skips, saying so, where they can't be made.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
if [ "$(id -u)" != 0 ] || ! unshare -n -u true 2>/dev/null || ! command -v ip >/dev/null; then
  echo "multihost.sh: skipped: needs root, ip and network namespaces (unshare -n -u)"
  exit 0
fi
begin multihost.sh
NS=kd$$ # a prefix of this run's own namespaces
cleanup() {
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS-"); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$T"
}
trap cleanup EXIT

# The network: a bridge in $NS-sw, host i's eth0 at 10.77.0.(i+1).
net() {
  ip netns add "$NS-sw" && ip -n "$NS-sw" link add br0 type bridge && ip -n "$NS-sw" link set br0 up ||
    return 1
  for i in 0 1 2; do
    ip netns add "$NS-h$i" &&
      ip link add eth0 netns "$NS-h$i" type veth peer name p$i netns "$NS-sw" &&
      ip -n "$NS-sw" link set p$i master br0 && ip -n "$NS-sw" link set p$i up &&
      ip -n "$NS-h$i" addr add 10.77.0.$((i + 1))/24 dev eth0 &&
      ip -n "$NS-h$i" link set eth0 up && ip -n "$NS-h$i" link set lo up &&
      ip netns exec "$NS-h$i" sysctl -q -w net.ipv4.tcp_retries2=4 || return 1
  done
}
if ! net 2>"$T/net.err"; then
  echo "multihost.sh: skipped: cannot make the namespaces' network: $(head -1 "$T/net.err")"
  exit 0
fi
# Open MPI's launch agent: "agent HOST COMMAND..." as ssh would run it.
cat >"$T/agent" <<AGENT
#!/bin/sh
host=\$1
shift
exec ip netns exec "$NS-\$host" unshare -u sh -c 'hostname "\$0"; exec sh -c "\$*"' "\$host" "\$@"
AGENT
chmod +x "$T/agent"
printf 'h0 slots=2\nh1 slots=2\nh2 slots=2\n' >"$T/hosts3"
printf 'h0 slots=2\nh1 slots=2\n' >"$T/hosts2"
MCA=(--mca plm_rsh_agent "$T/agent" --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24
     --mca oob_tcp_if_include 10.77.0.0/24 --mca oob_tcp_keepalive_time 4
     --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 -x KDRT_PROGRESS)
hosts() { # hosts NP HOSTFILE COMMAND...: mpirun from h0 over the hosts; $T/out, $rc
  local np=$1 file=$2
  shift 2
  timeout 240 ip netns exec "$NS-h0" unshare -u sh -c 'hostname h0; exec "$@"' sh \
    mpirun -np "$np" --hostfile "$file" "${MCA[@]}" "$@" >"$T/out" 2>&1
  rc=$?
}

name="where the ranks run"; hosts 6 "$T/hosts3" hostname; expect 0
[ "$(sort -u "$T/out" | tr '\n' ' ')" = "h0 h1 h2 " ] || fail "ranks ran on: $(sort -u "$T/out" | tr '\n' ' ')"

./kdcc models/seed_mlp.json --distribution models/seed_mlp_fixed.dist.json --mesh data=3,model=2 \
  --batch-size 24 -w -o "$T/t32" || exit 1
./kdcc models/seed_mlp.json --distribution models/seed_mlp_fixed.dist.json --mesh data=2,model=2 \
  --batch-size 24 -w -o "$T/t22" || exit 1

# 1. three hosts, the numbers of one
name="3 hosts"; hosts 6 "$T/hosts3" "$T/t32" --synthetic 96 --epochs 2 --quiet --history "$T/h3.json"
expect 0
timeout 240 mpirun -np 6 "$T/t32" --synthetic 96 --epochs 2 --quiet --history "$T/h1.json" ||
  fail "one host: status $?"
python3 tests/compare_history.py 0 "$T/h1.json" "$T/h3.json" >/dev/null ||
  fail "3 hosts: the history differs from one host's"

# 2. a link goes down mid-run
name="a link down"
(hosts 6 "$T/hosts3" "$T/t32" --synthetic 96 --epochs 100000 --checkpoint-dir "$T/ck" \
   --checkpoint-every 20 --timeout 8 --quiet; echo "$rc $(date +%s)" >"$T/down.rc"; cp "$T/out" "$T/down.out") &
# The link goes down at the first checkpoint seen, so that the run stops
# early: a resume hundreds of epochs on would compare two meshes' rounding
# grown over all of them (a fast machine may be past ckpt-20 already).
ckpts() { ls "$T/ck" 2>/dev/null | grep '^ckpt-' | sort -t- -k2 -n; }
for _ in $(seq 1200); do [ -n "$(ckpts)" ] && break; sleep 0.1; done
[ -n "$(ckpts)" ] || fail "no checkpoint after 120 s"
down=$(date +%s)
ip -n "$NS-sw" link set p2 down
wait
read -r rc ended <"$T/down.rc"
cp "$T/down.out" "$T/out"
# Whichever notices first ends it: a rank's watchdog (status 1, where it
# waited) or Open MPI's keepalive (a lost daemon, status 205).
if [ "$rc" = 0 ] || ! grep -qE "no progress for 8 s \(--timeout\)|lost communication with a remote daemon" "$T/out"; then
  fail "a link down: status $rc, no message of a watchdog or a lost host"
  sed 's/^/    | /' "$T/out" >&2
fi
[ $((ended - down)) -le 60 ] || fail "the job ended $((ended - down)) s after the link went down"
echo "multihost.sh: a link down: the job ended $((ended - down)) s later"
ip -n "$NS-sw" link set p2 up

# 3. resume on two hosts, another mesh, 5 epochs past the last checkpoint
# (4 steps an epoch), however far the interrupted run got
last=$(ckpts | tail -1)
epochs=$((${last#ckpt-} / 4 + 5))
name="resume on 2 hosts"
hosts 4 "$T/hosts2" "$T/t22" --synthetic 96 --epochs $epochs --checkpoint-dir "$T/ck" \
  --checkpoint-every 20 --resume --history "$T/resumed.json"
expect 0 "$last"
timeout 240 mpirun -np 4 "$T/t22" --synthetic 96 --epochs $epochs --quiet --history "$T/straight.json" ||
  fail "uninterrupted (2,2): status $?"
python3 tests/compare_history.py 1e-5 "$T/straight.json" "$T/resumed.json" >/dev/null ||
  fail "resumed on 2 hosts: the history differs from an uninterrupted run on (2,2)"
finish
