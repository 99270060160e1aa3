#!/bin/bash
# A multi-host Slurm cluster on one machine: each host is a network namespace with its own hostname,
# its own /tmp and /dev/shm (node-local storage) and /etc/hosts naming the cluster, all joined by a
# bridge in a namespace of its own. The controller host runs slurmctld; compute hosts cfn1..cfnN run
# one slurmd each (NodeName per host, Features=knl); one munged with one key serves every host (its
# socket is a file, which all namespaces see). The subnet 10.213.0.0/24 exists only inside these
# namespaces: nothing is added to the root namespace, so traffic stays between the test's hosts.
#
#   deploy/slurm/netns-cluster.sh start DIR N [CPUS]   # N compute hosts (1..9) of CPUS each [2]
#   deploy/slurm/netns-cluster.sh exec DIR CMD...      # run a Slurm client (sbatch, scontrol ...) on the controller host
#   deploy/slurm/netns-cluster.sh on DIR HOST CMD...   # run CMD inside host HOST (cfn1 ...): its network, hostname, /tmp
#   deploy/slurm/netns-cluster.sh link DIR HOST up|down  # plug / unplug HOST's cable (the switch side)
#   deploy/slurm/netns-cluster.sh stop DIR             # stops the daemons, deletes namespaces, veths and bridge
# DIR must not be under /tmp (each host mounts its own /tmp). Needs root, iproute2, util-linux,
# slurm-wlm and munge. Inside the hosts, the cluster interface is `cf0` (for OpenMPI:
# OMPI_MCA_btl_tcp_if_include=cf0).
set -Eeuo pipefail  # -E: the ERR trap of start also fires inside functions
export PATH="$PATH:/usr/sbin:/sbin"

readonly subnet=10.213.0
readonly ctl_addr=$subnet.254

usage() { echo "usage: $0 start DIR N [CPUS] | exec DIR CMD... | on DIR HOST CMD... | link DIR HOST up|down | stop DIR" >&2; exit 2; }

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage
dir=$(mkdir -p "$dir" && cd "$dir" && pwd)

# Namespace names carry a per-cluster prefix (kept in DIR/prefix) so two clusters never collide.
prefix() { cat "$dir/prefix"; }
ns_of() { echo "$(prefix)-$1"; }  # ns_of cfn1 | ns_of cfctl | ns_of sw

# Runs "$@" inside host $1: its network namespace, then a private UTS and mount namespace with the
# host's hostname, /tmp, /dev/shm and /etc/hosts. Daemons started this way keep those namespaces.
in_host() {
  local host=$1
  shift
  # nsenter, not `ip netns exec`: the latter mounts a fresh /sys without the cgroup tree slurmd needs.
  nsenter --net="/run/netns/$(ns_of "$host")" unshare --uts --mount --propagation private \
    /bin/bash -c 'set -e; hostname "$1"; mount --bind "$2/hosts/$1/tmp" /tmp
                  mount -t tmpfs -o size=512m tmpfs /dev/shm; mount --bind "$2/etc-hosts" /etc/hosts
                  shift 2; exec "$@"' in_host "$host" "$dir" "$@"
}

stop_pidfile() {
  local pidfile=$1 pid
  [ -s "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

# Kills every process still inside one of our namespaces (job steps, stray ranks), then deletes it.
delete_ns() {
  local ns=$1 pids
  ip netns list | grep -qw "^$ns" || return 0
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  if [ -n "$pids" ]; then kill -9 $pids 2>/dev/null || true; sleep 0.2; fi
  ip netns delete "$ns" 2>/dev/null || true
}

stop_cluster() {
  [ -f "$dir/prefix" ] || return 0
  for pidfile in "$dir"/hosts/*/slurmd.pid "$dir/slurmctld.pid" "$dir/munged.pid"; do
    stop_pidfile "$pidfile"
  done
  for host in $(cat "$dir/hostlist" 2>/dev/null) cfctl sw; do delete_ns "$(ns_of "$host")"; done
  # Per-host /tmp copies can be large (staged shards); the rest of DIR is the caller's.
  rm -rf "$dir"/hosts/*/tmp
  rm -f "$dir/prefix"
}

# Makes the namespaces: a switch with bridge br0, and per host a veth pair whose host end is cf0.
make_network() {
  local n=$1 sw i host
  sw=$(ns_of sw)
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  ip -n "$sw" link set lo up
  for host in $(cat "$dir/hostlist") cfctl; do
    local ns addr
    ns=$(ns_of "$host")
    ip netns add "$ns"
    ip -n "$sw" link add "$host" type veth peer name cf0 netns "$ns"
    ip -n "$sw" link set "$host" master br0 up
    if [ "$host" = cfctl ]; then addr=$ctl_addr; else addr=$subnet.${host#cfn}; fi
    ip -n "$ns" addr add "$addr/24" dev cf0
    ip -n "$ns" link set cf0 up
    ip -n "$ns" link set lo up
  done
}

write_conf() {
  local n=$1 cpus=$2
  {
    echo "127.0.0.1 localhost"
    echo "$ctl_addr cfctl"
    for i in $(seq "$n"); do echo "$subnet.$i cfn$i"; done
  } > "$dir/etc-hosts"
  cat > "$dir/slurm.conf" <<CONF
ClusterName=cosmoflow-netns
SlurmctldHost=cfctl($ctl_addr)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long a requeued job is held before it may start again (see local-slurm.sh).
AuthInfo=socket=$dir/munge/munge.socket.2,cred_expire=30
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/hosts/%n/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/hosts/%n/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/hosts/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
# A host that stops answering (link cut) is DOWN after SlurmdTimeout and back when it registers.
SlurmdTimeout=20
ReturnToService=2
JobRequeue=1
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
KillWait=10
NodeName=cfn[1-$n] NodeAddr=$subnet.[1-$n] CPUs=$cpus RealMemory=16000 Features=knl State=UNKNOWN
PartitionName=knl Nodes=cfn[1-$n] Default=YES MaxTime=INFINITE State=UP
CONF
}

start_munge() {
  mkdir -p "$dir/munge"
  chmod o+x "$dir" "$dir/munge"  # munge clients must reach the socket
  mungekey --create --keyfile="$dir/munge/munge.key" --force >/dev/null 2>&1 \
    || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$dir/munge/munge.key"
  munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket.2" \
    --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" --force
}

wait_idle() {
  local n=$1
  for _ in $(seq 200); do
    if [ "$(in_host cfctl sinfo -h -N -o %T 2>/dev/null | grep -c idle)" -eq "$n" ]; then return 0; fi
    sleep 0.1
  done
  return 1
}

start_cluster() {
  local n=$1 cpus=$2
  [[ "$n" =~ ^[1-9]$ ]] || { echo "$0: N must be 1..9" >&2; exit 2; }
  case "$dir/" in /tmp/*) echo "$0: DIR must not be under /tmp (each host mounts its own)" >&2; exit 2 ;; esac
  for bin in ip nsenter unshare slurmctld slurmd munged mungekey; do
    command -v "$bin" >/dev/null 2>&1 || { echo "$0: $bin is not installed" >&2; exit 3; }
  done
  [ ! -f "$dir/prefix" ] || { echo "$0: a cluster is already running in $dir (stop it first)" >&2; exit 1; }
  echo "cf$(printf %04x $((RANDOM ^ $$ & 0xffff)))" > "$dir/prefix"
  seq -f "cfn%g" "$n" > "$dir/hostlist"
  mkdir -p "$dir"/{state,log} "$dir/hosts/cfctl/tmp"
  for host in $(cat "$dir/hostlist"); do mkdir -p "$dir/hosts/$host"/{tmp,spool}; done
  chmod 1777 "$dir"/hosts/*/tmp
  trap 'stop_cluster' ERR
  write_conf "$n" "$cpus"
  make_network "$n"
  start_munge
  export SLURM_CONF="$dir/slurm.conf"
  in_host cfctl slurmctld -i
  for host in $(cat "$dir/hostlist"); do in_host "$host" slurmd -N "$host"; done
  if wait_idle "$n"; then
    trap - ERR
    echo "netns cluster up: $n hosts ($(prefix)-*), SLURM_CONF=$SLURM_CONF; run clients with: $0 exec $dir CMD"
    return 0
  fi
  echo "$0: the hosts did not become idle; see $dir/log and $dir/hosts/*/slurmd.log" >&2
  stop_cluster
  exit 1
}

case "$cmd" in
  start) start_cluster "${3:-}" "${4:-2}" ;;
  stop) stop_cluster ;;
  exec) shift 2; export SLURM_CONF="$dir/slurm.conf"; in_host cfctl "$@" ;;
  on) host=${3:?host}; shift 3; export SLURM_CONF="$dir/slurm.conf"; in_host "$host" "$@" ;;
  link) ip -n "$(ns_of sw)" link set "${3:?host}" "${4:?up|down}" ;;
  *) usage ;;
esac
