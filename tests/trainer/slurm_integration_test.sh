#!/bin/bash
# Integration test: the production batch script deploy/slurm/train_knl.sbatch on a real single-node
# Slurm (slurmctld + slurmd + munge on loopback, node Features=knl), with 2 MPI ranks.
#   1. A normal submission: the job completes and leaves checkpoints and run.json.
#   2. A submission with a short --signal time: SIGUSR1 arrives, both ranks checkpoint and exit 75,
#      the script requeues the job, and the restarted job resumes from the checkpoint and completes.
# Usage: slurm_integration_test.sh TRAIN_BIN MAKE_DATASET_BIN DEPLOY_SLURM_DIR
# Exit 77 (ctest SKIP) when Slurm or munge is not installed. Daemons are stopped on every exit path.
set -u
train_bin=$1
make_dataset=$2
deploy=$3
export PATH="$PATH:/usr/sbin"

for bin in slurmctld slurmd munged sbatch scontrol; do
  if ! command -v "$bin" >/dev/null 2>&1; then
    echo "SKIP: $bin is not installed (apt-get install slurm-wlm munge); Slurm integration test not run"
    exit 77
  fi
done

work=$(mktemp -d /tmp/cf-slurm-test-XXXXXX)
chmod 755 "$work"
cleanup() {
  local rc=$?
  if [ -n "${SLURM_CONF:-}" ]; then scancel --full --quiet -u root 2>/dev/null || true; fi
  "$deploy/local-slurm.sh" stop "$work/slurm" >/dev/null 2>&1 || true
  if [ "$rc" -eq 0 ]; then rm -rf "$work"; else echo "kept $work for inspection"; fi
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$work"/job-*.out; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
  exit 1
}

"$deploy/local-slurm.sh" start "$work/slurm" 2 || fail "could not start the local Slurm"
export SLURM_CONF="$work/slurm/slurm.conf"
sinfo -h -o "%N %f %T" | grep -q "knl" || fail "node does not advertise Features=knl"

mkdir -p "$work/data/train" "$work/data/val"
"$make_dataset" "$work/data/train/part0.h5" 32 32 1 || fail "dataset"
"$make_dataset" "$work/data/val/part0.h5" 8 32 2 || fail "dataset"

# Waits until job $1 reaches one of the states in $2 (regex) within $3 seconds; prints the state.
wait_state() {
  local jid=$1 want=$2 limit=$3 state=""
  for _ in $(seq $((limit * 2))); do
    state=$(scontrol show job "$jid" 2>/dev/null | grep -o "JobState=[A-Z_]*" | cut -d= -f2)
    if [[ "$state" =~ ^($want)$ ]]; then echo "$state"; return 0; fi
    sleep 0.5
  done
  echo "$state"
  return 1
}

submit() {  # submit RUN_DIR "TRAINER ARGS" SBATCH-OPTIONS...
  local run=$1 args=$2
  shift 2
  sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --output="$work/job-%j.out" \
    --export=ALL,COSMOFLOW_TRAIN_BIN="$train_bin",COSMOFLOW_DATA="$work/data",COSMOFLOW_RUN_DIR="$run",COSMOFLOW_STAGE=memory,COSMOFLOW_ARGS="$args" \
    "$@" "$deploy/train_knl.sbatch"
}

# ---- 1. a job that runs to completion
run1="$work/run1"
jid=$(submit "$run1" "--spec=tiny32 --batch=2 --epochs=2 --log-every=4" --time=10 --signal=USR1@60) \
  || fail "sbatch refused the batch script"
state=$(wait_state "$jid" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 120) || fail "job $jid did not finish (state $state)"
[ "$state" = COMPLETED ] || fail "job $jid ended $state"
out="$work/job-$jid.out"
grep -q "trainer exited with 0" "$out" || fail "no clean trainer exit in $out"
grep -q "2 ranks x batch 2" "$out" || fail "trainer did not run with 2 ranks"
[ -f "$run1/checkpoints/ckpt-000000016.h5" ] || fail "final checkpoint missing: $(ls "$run1/checkpoints")"
grep -q '"outcome": "finished"' "$run1/run.json" || fail "run.json does not say finished"
grep -q "^val," "$run1/train_log.csv" || fail "no validation rows in the run log"
echo "ok 1 - job $jid completed with checkpoints"

# ---- 2. checkpoint-and-requeue: the time-limit warning (USR1, 115 s before a 2-minute limit) comes
# at the controller's first time-limit check (it runs every 30 s), while training (96 steps of at
# least 0.5 s) still runs.
run2="$work/run2"
jid=$(submit "$run2" "--spec=tiny32 --batch=2 --epochs=12 --log-every=8 --debug-step-sleep=0.5" \
  --time=2 --signal=USR1@115) || fail "sbatch refused the batch script"
out="$work/job-$jid.out"
# Once the warning has reached the ranks, give the job room to finish after its restart (an operator
# could do the same). Raised now, before the requeue, so that the restarted job never starts with
# the 2-minute limit and gets the warning again while MPI is still starting (a race seen under load).
for _ in $(seq 240); do grep -q "stop requested" "$out" 2>/dev/null && break; sleep 0.5; done
grep -q "stop requested" "$out" || fail "job $jid never saw the time-limit signal"
scontrol update JobId="$jid" TimeLimit=10 || fail "scontrol update TimeLimit"
for _ in $(seq 240); do grep -q "requeueing job" "$out" 2>/dev/null && break; sleep 0.5; done
grep -q "requeueing job $jid" "$out" || fail "job $jid was not requeued"
# Slurm holds a requeued job for cred_expire seconds (30 in local-slurm.sh) before restarting it;
# forcing an earlier start fails it with "Job credential revoked".
first_stop=$(grep -m1 -o "checkpointing at step [0-9]*" "$out" | grep -o "[0-9]*$")
[ "$(grep -c "stop requested.*at step $first_stop " "$out")" -eq 2 ] || fail "expected a stop line from both ranks"
[ -f "$run2/checkpoints/ckpt-$(printf %09d "$first_stop").h5" ] || fail "no checkpoint at the stop step $first_stop"
[ "$first_stop" -gt 0 ] && [ "$first_stop" -lt 96 ] || fail "stop checkpoint at step $first_stop"
echo "ok 2 - job $jid got SIGUSR1, checkpointed at step $first_stop on both ranks and requeued itself"
state=$(wait_state "$jid" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 240) || fail "requeued job did not finish ($state)"
[ "$state" = COMPLETED ] || fail "requeued job ended $state"
scontrol show job "$jid" | grep -q "Restarts=[1-9]" || fail "Slurm does not count a restart"
grep -q "restart 1" "$out" || fail "no restart banner"
grep -q "resumed from .*ckpt-0*$first_stop.h5 at step $first_stop" "$out" || fail "restarted job did not resume from step $first_stop"
[ -f "$run2/checkpoints/ckpt-000000096.h5" ] || fail "final checkpoint missing: $(ls "$run2/checkpoints")"
grep -q '"outcome": "finished"' "$run2/run.json" || fail "run.json does not say finished"
grep -q "trainer exited with 0" "$out" || fail "no clean trainer exit after the restart"
echo "ok 3 - requeued job $jid resumed at step $first_stop and completed"
exit 0
