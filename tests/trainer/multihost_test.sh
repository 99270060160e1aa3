#!/bin/bash
# Multi-node training across hosts: deploy/slurm/netns-cluster.sh makes two hosts (network
# namespaces with their own hostnames and /tmp, a bridge between them, slurmctld on a third, one
# slurmd per host, shared munge); the production script deploy/slurm/train_knl.sbatch is submitted
# unchanged with --nodes=2 (overrides on the sbatch line and in the environment only), srun
# --mpi=pmix, OpenMPI on TCP over the hosts' cable only (btl tcp,self, interface cf0), the dataset
# staged into each host's own /tmp.
#   a. 2 nodes x 1 rank train bit-identical weights to 1 node x 2 ranks on the same samples; the
#      gradients crossed the cable; each host staged its own copy.
#   b. SIGUSR1 from Slurm (scancel --signal) reaches the ranks on both hosts: checkpoint, exit 75,
#      the batch script requeues, the job resumes from that checkpoint and completes.
#   c. kill -9 of the rank on host 2: the job fails within 60 s, srun names the task (rank); the
#      resubmitted job resumes from the last checkpoint.
#   d. the cable of host 2 cut, trainer watchdog at 8 s: rank 0 names rank 1 on cfn2 as unreachable
#      (its TCP probe) and aborts the job with 76 (timed).
#   e. the cable of host 2 cut, watchdog long: Slurm declares the node failed within 60 s, naming it
#      (the trainer's "ranks by host" line gives its rank), requeues the job, and once the cable is
#      back it resumes from the last checkpoint.
# Usage: multihost_test.sh TRAIN_BIN MAKE_DATASET_BIN DEPLOY_SLURM_DIR
# Exit 77 (ctest SKIP) when not root or when iproute2/util-linux/Slurm/munge/h5py are missing.
# The cluster (namespaces, veths, bridge, daemons) is torn down on every exit path.
set -u
train_bin=$1
make_dataset=$2
deploy=$3
export PATH="$PATH:/usr/sbin:/sbin"

skip() { echo "SKIP: $*; multi-host test not run"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, Slurm daemons)"
for bin in ip nsenter unshare slurmctld slurmd munged mungekey sbatch scontrol; do
  command -v "$bin" >/dev/null 2>&1 || skip "$bin is not installed (iproute2, util-linux, slurm-wlm, munge)"
done
/usr/bin/python3 -c "import h5py, numpy" 2>/dev/null || skip "/usr/bin/python3 lacks h5py/numpy (python3-h5py)"
probe="cfprobe$$"
ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces here"
ip netns delete "$probe"

work=$(mktemp -d /var/tmp/cf-multihost-XXXXXX)  # not /tmp: every test host mounts its own /tmp
chmod 755 "$work"
# The hosts see their own /tmp: a checkout or build under /tmp is invisible to them, so the
# trainer and the deploy scripts run from copies in the shared work directory.
mkdir -p "$work/bin" "$work/deploy"
cp "$train_bin" "$work/bin/" && train_bin="$work/bin/$(basename "$train_bin")"
cp "$deploy"/*.sh "$deploy"/*.sbatch "$work/deploy/" && deploy="$work/deploy"
cl="$work/cluster"
cluster="$deploy/netns-cluster.sh"
cleanup() {
  local rc=$?
  "$cluster" stop "$cl" >/dev/null 2>&1 || true
  if [ "$rc" -eq 0 ]; then rm -rf "$work"; else echo "kept $work for inspection"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
  echo "FAIL: $*"
  for f in "$work"/job-*.out; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
  exit 1
}
sl() { "$cluster" exec "$cl" "$@"; }  # a Slurm client command on the controller host
now() { date +%s.%N; }
since() { echo "$(now) $1" | awk '{printf "%.1f", $1 - $2}'; }

"$cluster" start "$cl" 2 2 || fail "could not start the namespace cluster"
[ "$(sl sinfo -h -N -o '%N %f %T' | grep -c 'knl idle')" -eq 2 ] || fail "two idle knl hosts expected"

mkdir -p "$work/data/train"
"$make_dataset" "$work/data/train/part0.h5" 32 32 1 >/dev/null || fail "dataset"

# OpenMPI between hosts: TCP over the cluster interface only (no shared memory, no other NIC).
# Set here, not in --export, whose commas would split "tcp,self".
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=cf0

submit() {  # submit NODES RANKS_PER_NODE RUN_DIR "TRAINER ARGS"
  sl sbatch --parsable --nodes="$1" --ntasks-per-node="$2" --cpus-per-task=1 --time=10 \
    --signal=USR1@30 --output="$work/job-%j.out" \
    --export=ALL,COSMOFLOW_TRAIN_BIN="$train_bin",COSMOFLOW_DATA="$work/data",COSMOFLOW_RUN_DIR="$3",COSMOFLOW_ARGS="$4" \
    "$deploy/train_knl.sbatch"
}

# Submits and waits until the trainer is past MPI_Init (its "ranks by host" line). Debian's OpenMPI
# 4.1.4 TCP BTL crashes now and then inside MPI_Init (SIGSEGV in opal_progress, a start-up race of
# the upstream component, about 1 start in 30 here): such a job is resubmitted once, with a note.
submit_started() {  # submit_started NODES RANKS_PER_NODE RUN_DIR "TRAINER ARGS": prints the job id
  local jid attempt
  for attempt in 1 2; do
    jid=$(submit "$@") || return 1
    for _ in $(seq 300); do
      grep -q "ranks by host:" "$work/job-$jid.out" 2>/dev/null && { echo "$jid"; return 0; }
      [[ "$(job_field "$jid" JobState)" =~ ^(FAILED|COMPLETED|CANCELLED|TIMEOUT|NODE_FAIL)$ ]] && break
      sleep 0.2
    done
    if ! grep -q "Segmentation fault" "$work/job-$jid.out" 2>/dev/null; then echo "$jid"; return 0; fi
    echo "NOTE: job $jid: a rank crashed inside MPI_Init (OpenMPI TCP start-up race); resubmitting" >&2
  done
  echo "$jid"
}

job_field() { sl scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -1 | cut -d= -f2; }

wait_state() {  # wait_state JOB REGEX SECONDS: prints the state; fails when it is not reached
  local state=""
  for _ in $(seq $(($3 * 2))); do
    state=$(job_field "$1" JobState)
    if [[ "$state" =~ ^($2)$ ]]; then echo "$state"; return 0; fi
    sleep 0.5
  done
  echo "$state"
  return 1
}

wait_line() {  # wait_line FILE REGEX SECONDS
  for _ in $(seq $(($3 * 5))); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done
  return 1
}

latest_step() { sed 's/.*ckpt-0*\([0-9]*\)\.h5.*/\1/' "$1/checkpoints/LATEST"; }

rank_pid() {  # the pid of the trainer rank on host $1
  local pid
  for pid in $(ip netns pids "$(cat "$cl/prefix")-$1"); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = cosmoflow-train ] && { echo "$pid"; return 0; }
  done
  return 1
}

tx_bytes() { ip -n "$(cat "$cl/prefix")-$1" -s link show cf0 | awk 'f {print $1; exit} /TX:/ {f=1}'; }

# Largest |a - b| over the weights of two checkpoints, relative to the largest |a|.
weight_diff() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r")["weights"], h5py.File(sys.argv[2], "r")["weights"]
assert sorted(a) == sorted(b), "different tensors"
diff = max(float(np.max(np.abs(a[k][()] - b[k][()]))) for k in a)
scale = max(float(np.max(np.abs(a[k][()]))) for k in a)
print(f"{diff / scale:.3g}")
PY
}

restore_host2() {  # plug the cable back and return the host to service (an operator's resume)
  "$cluster" link "$cl" cfn2 up
  sl scontrol update NodeName=cfn2 State=RESUME 2>/dev/null || true
  for _ in $(seq 100); do
    sl sinfo -h -n cfn2 -o %T | grep -qx idle && return 0
    sleep 0.2
  done
  fail "cfn2 did not return to idle after its cable was plugged back"
}

# The fixed kernel rule: case (a) compares weights bit for bit between two layouts of ranks, whose
# measured kernel choices could differ (docs/engine.md, "Choice by measurement").
common="--spec=tiny32 --batch=2 --recipe=constant --lr=0.0003 --seed=3 --log-every=4 --kernel-selection=rule"

# ---- a. 2 nodes x 1 rank == 1 node x 2 ranks
tx0=$(tx_bytes cfn2)
ja=$(submit_started 2 1 "$work/run-2x1" "$common --epochs=2") || fail "sbatch refused the batch script"
state=$(wait_state "$ja" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 120) || fail "job $ja did not finish ($state)"
[ "$state" = COMPLETED ] || fail "2-node job $ja ended $state"
tx1=$(tx_bytes cfn2)
jb=$(submit_started 1 2 "$work/run-1x2" "$common --epochs=2") || fail "sbatch refused the batch script"
state=$(wait_state "$jb" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 120) || fail "job $jb did not finish ($state)"
[ "$state" = COMPLETED ] || fail "1-node job $jb ended $state"
grep -q "ranks by host: cfn1 \[0\], cfn2 \[1\]" "$work/job-$ja.out" || fail "job $ja did not run one rank on each host"
grep -qE "ranks by host: cfn[12] \[0-1\]$" "$work/job-$jb.out" || fail "job $jb did not run both ranks on one host"
for j in "$ja" "$jb"; do grep -q "2 ranks x batch 2" "$work/job-$j.out" || fail "job $j: not 2 ranks x batch 2"; done
final=checkpoints/ckpt-000000016.h5
diff=$(weight_diff "$work/run-2x1/$final" "$work/run-1x2/$final") || fail "could not compare checkpoints"
[ "$diff" = 0 ] || fail "2 nodes x 1 rank and 1 node x 2 ranks differ (relative $diff)"
moved=$(weight_diff "$work/run-2x1/$final" "$work/run-2x1/checkpoints/ckpt-000000008.h5")
awk -v m="$moved" 'BEGIN {exit !(m > 1e-4)}' || fail "weights did not move between steps 8 and 16 ($moved)"
# 16 allreduces of 151 kB of gradients; srun/PMIx traffic alone is a few kB.
sent=$((tx1 - tx0))
[ "$sent" -gt $((16 * 150924 / 2)) ] || fail "only $sent bytes left host 2 on cf0: gradients did not cross the cable"
for h in cfn1 cfn2; do
  [ -s "$cl/hosts/$h/tmp/cosmoflow-stage-train/part0.h5" ] || fail "no staged copy in $h's /tmp"
done
echo "ok a - 2 nodes x 1 rank (job $ja) = 1 node x 2 ranks (job $jb): weights identical (relative difference $diff; steps 8->16 moved them by $moved); host 2 sent $sent bytes on cf0; each host staged its own copy"

# ---- b. SIGUSR1 across nodes -> checkpoint, exit 75, requeue, resume
run="$work/run-usr1"
jid=$(submit_started 2 1 "$run" "$common --epochs=6 --debug-step-sleep=0.3") || fail "sbatch refused the batch script"
out="$work/job-$jid.out"
wait_line "$out" "step 8/48" 120 || fail "job $jid did not reach step 8"
sl scancel --signal=USR1 "$jid" || fail "scancel --signal=USR1"
wait_line "$out" "requeueing job $jid" 60 || fail "job $jid was not requeued after SIGUSR1"
stop=$(grep -m1 -o "checkpointing at step [0-9]*" "$out" | grep -o "[0-9]*$")
[ "$(grep -c "stop requested.*at step $stop " "$out")" -eq 2 ] || fail "expected a stop line from both ranks"
[ -f "$run/checkpoints/ckpt-$(printf %09d "$stop").h5" ] || fail "no checkpoint at the stop step $stop"
state=$(wait_state "$jid" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 150) || fail "requeued job $jid did not finish ($state)"
[ "$state" = COMPLETED ] || fail "requeued job $jid ended $state"
[ "$(job_field "$jid" Restarts)" -ge 1 ] || fail "Slurm does not count a restart"
grep -q "resumed from .*ckpt-0*$stop.h5 at step $stop" "$out" || fail "the requeued job did not resume from step $stop"
[ -f "$run/checkpoints/ckpt-000000048.h5" ] || fail "final checkpoint missing"
grep -q '"outcome": "finished"' "$run/run.json" || fail "run.json does not say finished"
echo "ok b - SIGUSR1 to job $jid: both hosts' ranks stopped at step $stop, checkpoint, requeue, resumed at $stop, finished"

# ---- c. kill -9 of the rank on host 2
run="$work/run-kill"
args="$common --epochs=6 --checkpoint-every=8 --debug-step-sleep=0.3"
jid=$(submit_started 2 1 "$run" "$args") || fail "sbatch refused the batch script"
out="$work/job-$jid.out"
wait_line "$out" "ckpt-000000016.h5" 120 || fail "job $jid did not checkpoint step 16"
pid=$(rank_pid cfn2) || fail "no trainer rank found on host cfn2"
t0=$(now)
kill -9 "$pid"
state=$(wait_state "$jid" "FAILED|COMPLETED|CANCELLED|NODE_FAIL" 60) || fail "job $jid still $state 60 s after kill -9 of a rank"
secs=$(since "$t0")
[ "$state" = FAILED ] || fail "job $jid ended $state after a rank was killed"
grep -qE "srun: error: cfn2: task 1: Killed" "$out" || fail "no message naming the killed rank (task 1 on cfn2)"
last=$(latest_step "$run")
jid2=$(submit_started 2 1 "$run" "$args") || fail "sbatch refused the resubmission"
state=$(wait_state "$jid2" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 120) || fail "resubmitted job $jid2 did not finish ($state)"
[ "$state" = COMPLETED ] || fail "resubmitted job $jid2 ended $state"
grep -q "resumed from .*ckpt-0*$last.h5 at step $last" "$work/job-$jid2.out" || fail "job $jid2 did not resume from step $last"
echo "ok c - kill -9 of rank 1 on cfn2: job $jid FAILED ${secs} s later, srun named 'cfn2: task 1'; job $jid2 resumed at step $last and finished"

# ---- d. cable of host 2 cut, watchdog 8 s: rank 0 aborts the job with 76
run="$work/run-watchdog"
jid=$(submit_started 2 1 "$run" "$common --epochs=6 --debug-step-sleep=0.3 --watchdog-timeout-s=8") || fail "sbatch refused the batch script"
out="$work/job-$jid.out"
wait_line "$out" "step 8/48" 120 || fail "job $jid did not reach step 8"
t0=$(now)
"$cluster" link "$cl" cfn2 down
wait_line "$out" "rank 0 \(cfn1\): watchdog: no progress" 60 || fail "rank 0's watchdog did not fire within 60 s of the cut"
t_watchdog=$(since "$t0")
# Slurm may declare cfn2 failed (its cable is cut) and cancel the job before the batch script logs
# the trainer's exit (seen under AddressSanitizer, whose slow steps lengthen the watchdog's
# timeout); srun's line for rank 0 then carries the 76.
wait_line "$out" "trainer exited with 76|srun: error: cfn1: task 0: Exited with exit code 76" 60 \
  || fail "the step did not end with the watchdog's 76"
grep -q "watchdog: probe from rank 0: rank 1 (cfn2) no answer: unreachable" "$out" \
  || fail "rank 0's watchdog did not name rank 1 on cfn2 as unreachable"
t_exit=$(since "$t0")
# The watchdog's timeout is --watchdog-timeout-s or 10x the slowest step if longer (slow steps, as
# under AddressSanitizer, raise it); its message states it, and it fires within 7 s after it.
limit=$(grep -oE "watchdog: no progress for [0-9.]+ s" "$out" | head -1 | awk '{print $5}')
awk -v t="$t_watchdog" -v l="${limit:-0}" 'BEGIN {exit !(l >= 8 && t >= l - 1 && t < l + 7)}' \
  || fail "watchdog fired after $t_watchdog s (its stated timeout: ${limit:-none} s, --watchdog-timeout-s 8)"
awk -v t="$t_exit" 'BEGIN {exit !(t < 60)}' || fail "the batch script saw the exit only after $t_exit s"
# When Slurm declares cfn2 failed first, it requeues the batch job itself (as in e); that job waits
# for cfn2 and is cancelled here, so that it does not restart once the cable is back.
state=$(wait_state "$jid" "FAILED|COMPLETED|CANCELLED|NODE_FAIL|PENDING|REQUEUED|REQUEUE_HOLD" 90) || fail "job $jid still $state"
[ "$state" = FAILED ] || { [[ "$state" =~ CANCELLED|NODE_FAIL|PENDING|REQUEUE ]] && grep -q "DUE TO NODE FAILURE" "$out"; } \
  || fail "job $jid ended $state (expected FAILED with 76, or ended by Slurm for cfn2's node failure)"
if [[ "$state" =~ PENDING|REQUEUE ]]; then
  sl scancel "$jid" || fail "scancel of the requeued job $jid"
  wait_state "$jid" "CANCELLED" 30 >/dev/null || fail "requeued job $jid not cancelled"
fi
restore_host2
echo "ok d - cable of cfn2 cut at step >= 8: rank 0's watchdog (timeout $limit s) fired after $t_watchdog s naming rank 1 (cfn2) unreachable, exit 76 seen after $t_exit s, job $jid $state"

# ---- e. cable of host 2 cut, Slurm detects the node failure, requeues, the job resumes
run="$work/run-cut"
jid=$(submit_started 2 1 "$run" "$common --epochs=6 --checkpoint-every=8 --debug-step-sleep=0.3 --watchdog-timeout-s=300") \
  || fail "sbatch refused the batch script"
out="$work/job-$jid.out"
wait_line "$out" "ckpt-000000016.h5" 120 || fail "job $jid did not checkpoint step 16"
t0=$(now)
"$cluster" link "$cl" cfn2 down
wait_line "$out" "srun: error: Node failure on cfn2" 60 || fail "no node failure reported within 60 s of the cut"
secs=$(since "$t0")
last=$(latest_step "$run")
lost=$(grep -o "ranks by host: .*" "$out" | grep -o "cfn2 \[[0-9-]*\]")
[ "$lost" = "cfn2 [1]" ] || fail "the trainer's rank map does not give cfn2's rank ($lost)"
wait_state "$jid" "PENDING|REQUEUED|REQUEUE_HOLD" 60 >/dev/null || fail "job $jid was not requeued after the node failure"
restore_host2
state=$(wait_state "$jid" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 150) || fail "requeued job $jid did not finish ($state)"
[ "$state" = COMPLETED ] || fail "requeued job $jid ended $state"
grep -q "resumed from .*ckpt-0*$last.h5 at step $last" "$out" || fail "job $jid did not resume from step $last"
echo "ok e - cable of cfn2 cut: 'Node failure on cfn2' (rank 1 by the rank map) after ${secs} s, job $jid requeued by Slurm, resumed at step $last and finished"
exit 0
