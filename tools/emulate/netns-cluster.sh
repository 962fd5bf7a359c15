#!/usr/bin/env bash
# An emulated cluster on this machine: N "nodes" as network namespaces
# joined through a bridge (in a hub namespace of its own, so the host's
# network is never touched), each link shaped with tbf in both directions,
# and optionally a CPU quota per node (cgroup v1 cpu.cfs_quota_us).
#
#   netns-cluster.sh up NAME NODES [--rate R] [--rate-of I R] [--cpu-of I PCT]
#       nodes get 10.213.0.(I+1)/24 on eth0 (I = 0..NODES-1); R is a tc rate
#       ("1gbit", "100mbit"; default 1gbit); PCT is the share of one core
#   netns-cluster.sh exec NAME I CMD...   run CMD on node I (namespace + cgroup)
#   netns-cluster.sh addr I               the address of node I
#   netns-cluster.sh down NAME            removes everything NAME created
#   netns-cluster.sh can                  exit 0 when this machine allows it, else
#                                         print why and exit 77 (ctest's skip code)
#
# Traffic stays inside namespaces this script creates (10.213.0.0/24 exists
# nowhere else). `down` is idempotent; callers trap it on exit.
set -euo pipefail

addr() { echo "10.213.0.$(( $1 + 1 ))"; }

can() {
  if [ "$(id -u)" -ne 0 ]; then echo "netns-cluster: needs root (network namespaces)"; exit 77; fi
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "netns-cluster: needs ip and tc (Debian package iproute2)"; exit 77
  fi
  local probe="gsprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "netns-cluster: cannot create network namespaces here"; exit 77
  fi
  ip netns del "$probe"
}

down() {
  local name=$1
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name}-(hub|n[0-9]+)$" || true); do
    # Processes still inside would keep the namespace's interfaces alive.
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  for cg in /sys/fs/cgroup/cpu/"${name}"-n*; do
    [ -d "$cg" ] || continue
    # A killed process leaves the group only once it has exited: wait (at
    # most 5 s) for the group to empty, else rmdir fails and it lingers.
    for _ in $(seq 1 50); do
      pids=$(cat "$cg/cgroup.procs" 2>/dev/null || true)
      [ -z "$pids" ] && break
      for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
      sleep 0.1
    done
    rmdir "$cg" 2>/dev/null || echo "netns-cluster: could not remove $cg (still in use)" >&2
  done
}

shape() {  # namespace device rate
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst 256kb latency 100ms
}

up() {
  local name=$1 nodes=$2; shift 2
  local rate=1gbit
  declare -A rates cpus
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      --rate-of) rates[$2]=$3; shift 3 ;;
      --cpu-of) cpus[$2]=$3; shift 3 ;;
      *) echo "netns-cluster up: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  down "$name"
  local hub="${name}-hub"
  ip netns add "$hub"
  ip netns exec "$hub" ip link set lo up
  ip netns exec "$hub" ip link add br0 type bridge
  ip netns exec "$hub" ip link set br0 up
  for ((i = 0; i < nodes; i++)); do
    local ns="${name}-n$i" r=${rates[$i]:-$rate}
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    ip link add "${name}v$i" netns "$ns" type veth peer name "p$i" netns "$hub"
    ip netns exec "$ns" ip link set "${name}v$i" name eth0
    ip netns exec "$ns" ip addr add "$(addr "$i")/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$hub" ip link set "p$i" master br0
    ip netns exec "$hub" ip link set "p$i" up
    shape "$ns" eth0 "$r"       # node -> network
    shape "$hub" "p$i" "$r"     # network -> node
    if [ -n "${cpus[$i]:-}" ]; then
      local cg="/sys/fs/cgroup/cpu/${ns}"
      mkdir -p "$cg"
      echo 100000 > "$cg/cpu.cfs_period_us"
      echo $(( ${cpus[$i]} * 1000 )) > "$cg/cpu.cfs_quota_us"
    fi
  done
}

run_on() {
  local name=$1 i=$2; shift 2
  local cg="/sys/fs/cgroup/cpu/${name}-n$i"
  if [ -d "$cg" ]; then echo $$ > "$cg/cgroup.procs"; fi
  exec ip netns exec "${name}-n$i" "$@"
}

cmd=${1:-}; shift || true
case $cmd in
  up) up "$@" ;;
  down) down "$@" ;;
  exec) run_on "$@" ;;
  addr) addr "$@" ;;
  can) can ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
