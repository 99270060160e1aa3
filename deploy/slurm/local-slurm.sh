#!/bin/bash
# A single-node Slurm cluster on loopback, for the project's integration test and for trying the
# batch script on a workstation. The node advertises Features=knl so deploy/slurm/train_knl.sbatch
# (which asks for --constraint=knl) runs unchanged.
#
#   deploy/slurm/local-slurm.sh start DIR [CPUS]   # writes DIR/slurm.conf, starts munged, slurmctld, slurmd
#   export SLURM_CONF=DIR/slurm.conf               # for sbatch, squeue, scontrol, sacct ...
#   deploy/slurm/local-slurm.sh stop DIR           # stops the three daemons by their pid files
# Needs root (the daemons run as root here), slurm-wlm and munge (deploy/install-deps.sh).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR [CPUS]" >&2
  exit 2
fi

stop_daemons() {
  for name in slurmd slurmctld munged; do
    local pidfile="$dir/$name.pid"
    if [ -s "$pidfile" ]; then
      local pid
      pid=$(cat "$pidfile")
      if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
      fi
      rm -f "$pidfile"
    fi
  done
}

case "$cmd" in
  stop)
    stop_daemons
    exit 0
    ;;
  start) ;;
  *) echo "$0: unknown command '$cmd' (start|stop)" >&2; exit 2 ;;
esac

for bin in slurmctld slurmd munged mungekey; do
  if ! command -v "$bin" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$bin" ]; then
    echo "$0: $bin is not installed (apt-get install slurm-wlm munge)" >&2
    exit 3
  fi
done
export PATH="$PATH:/usr/sbin"
cpus=${3:-$(nproc)}
mkdir -p "$dir"/{state,spool,log,munge}
dir=$(cd "$dir" && pwd)
chmod o+x "$dir" "$dir/munge"   # munge clients must reach the socket

mungekey --create --keyfile="$dir/munge/munge.key" --force >/dev/null 2>&1 \
  || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$dir/munge/munge.key"
munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket.2" \
  --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" --force

cat > "$dir/slurm.conf" <<CONF
ClusterName=cosmoflow-local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s):
# starting it sooner fails the job with "Job credential revoked" (the old run's credential is
# still revoked on slurmd). 30 s keeps the requeue test short and is ample to launch a step here.
AuthInfo=socket=$dir/munge/munge.socket.2,cred_expire=30
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=$((6817 + RANDOM % 1000))
SlurmdPort=$((7817 + RANDOM % 1000))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
JobRequeue=1
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
KillWait=10
NodeName=localhost CPUs=$cpus RealMemory=16000 Features=knl State=UNKNOWN
PartitionName=knl Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF="$dir/slurm.conf"
slurmctld -i
slurmd -N localhost
for _ in $(seq 100); do
  if sinfo -h -o %T 2>/dev/null | grep -q idle; then
    echo "local Slurm up: export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.1
done
echo "$0: the node did not become idle; see $dir/log" >&2
stop_daemons
exit 1
