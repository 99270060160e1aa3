#!/usr/bin/env bash
# The full-resolution study (issue 19), one command: MLPerf-preset universes (128^3 voxels of
# 1 Mpc/h, four redshifts), 32^3 sub-cubes, a 2-rank ensemble of a 4-output full-covariance network,
# predictions of every sub-cube through the real gRPC server averaged per universe with the
# combined uncertainty, the P(k) baseline (per-redshift spectra and cross-spectra) on the full
# cubes, the trivial predictor, a robustness set evolved with other settings, and the three real
# MLPerf cubes, predicted only after the served model's checksum is in the report.
#
# Usage: tools/fullres_study.sh OUT_DIR        (docs/accuracy.md, "The full-resolution study")
# Scale by environment variables; the defaults are the full study, about 90 minutes on 2 idle cores:
#   N_TRAIN=512 N_VAL=64 N_TEST=128 N_ROBUST=64 ROBUST_ARGS="--pm-mesh 2" SUB_SIDE=32 BIN=1
#   SPEC=tools/specs/fullres32x4-log1p-fullcov.json MEMBERS=3 EPOCHS=12 BATCH=8 LR=0.001
#   PRECISION=fp32 MSE_WARMUP_EPOCHS=2 SEED=1 SERVE_PRECISION=fp32 SYNTH_ARGS=""
#   PRIOR="0.27,0.33;0.72,0.88;0.864,1.056;63,77" REAL_DIR=<checkout>/../shared/data/mlperf-cosmoflow
#   BUILD_DIR=<checkout>/build TRAIN=1 (TRAIN=0 reuses a finished OUT_DIR/run)
#   BN_STATISTICS_BATCHES=0: with N > 0, batch_norm's running statistics are recomputed from N
#   training batches at each epoch end (cosmoflow-train --bn-statistics-batches)
#   CUBE_SIDE=<the parents' side>: with SYNTH_ARGS="--side 256" and CUBE_SIDE=128 every universe is
#   a 128^3 piece of a 256^3 parent, whose mean density differs from 1 as the real cubes' do; the
#   N_* then count pieces (multiples of 8).
#   NET_COMPARE_MEMBERS=16: the served network is also run on that many synthetic universes at each
#   real cube's own parameters (tools/compare_real.py --address), placing each real cube's reading
#   among them; 0 skips it (>= 7 otherwise). NET_COMPARE_PARENT_SIDE=256 makes them pieces of
#   256^3 parents, each with its own mean density as the real cubes have (about 1.5x the time).
#   PIECES_PARENT_SIDE=256 N_TRAIN_PIECES=128: the validation universes are 128^3 pieces of 256^3
#   parents (each with its own mean density, as the real cubes have: the calibration then includes
#   that spread) and N_TRAIN_PIECES such pieces join the N_TRAIN periodic training universes; the
#   test and robustness sets and the P(k) baseline's fit stay periodic. N_TEST_PIECES=128 adds a
#   second test set of such pieces (other parents), where the served sigma, calibrated on pieces,
#   applies; a second baseline fit, on every training universe (pieces included), reads it. The
#   counts are multiples of the pieces per parent.
#   TRAIN_TWIN_ARGS=<synth flags>: every periodic training universe is generated a second time
#   with these flags added (the same seed, so the same cosmology and initial phases; e.g.
#   "--pm-mesh 1", the other force resolution, or "--pm-scheme pm", the other integrator) and the
#   network and the baseline train on both: 2 x N_TRAIN universes (with N_TRAIN_PIECES pieces
#   beside them, which have no twins).
# Data already complete in OUT_DIR/data is reused, and an interrupted training with the same
# settings resumes where it stopped. Progress (stage, elapsed, estimate, ETA) goes
# to stdout; the programs' own progress lines to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
[ $# = 1 ] || { echo "usage: tools/fullres_study.sh OUT_DIR" >&2; exit 2; }
out=$(realpath -m "$1")
build=${BUILD_DIR:-$here/build}
N_TRAIN=${N_TRAIN:-512}; N_VAL=${N_VAL:-64}; N_TEST=${N_TEST:-128}; N_ROBUST=${N_ROBUST:-64}
ROBUST_ARGS=${ROBUST_ARGS:---pm-mesh 2}; TRAIN_TWIN_ARGS=${TRAIN_TWIN_ARGS:-}; SUB_SIDE=${SUB_SIDE:-32}; BIN=${BIN:-1}; SYNTH_ARGS=${SYNTH_ARGS:-}
SPEC=${SPEC:-$here/tools/specs/fullres32x4-log1p-fullcov.json}
MEMBERS=${MEMBERS:-3}; EPOCHS=${EPOCHS:-12}; BATCH=${BATCH:-8}; LR=${LR:-0.001}; PRECISION=${PRECISION:-fp32}
MSE_WARMUP_EPOCHS=${MSE_WARMUP_EPOCHS:-2}; SEED=${SEED:-1}; SERVE_PRECISION=${SERVE_PRECISION:-fp32}
BN_STATISTICS_BATCHES=${BN_STATISTICS_BATCHES:-0}; NET_COMPARE_MEMBERS=${NET_COMPARE_MEMBERS:-16}
NET_COMPARE_PARENT_SIDE=${NET_COMPARE_PARENT_SIDE:-0}
PIECES_PARENT_SIDE=${PIECES_PARENT_SIDE:-0}; N_TRAIN_PIECES=${N_TRAIN_PIECES:-0}; N_TEST_PIECES=${N_TEST_PIECES:-0}
PRIOR=${PRIOR:-0.27,0.33;0.72,0.88;0.864,1.056;63,77}  # the preset's prior (synth/mlperf.h): p0 (1 +- 0.1)
REAL_DIR=${REAL_DIR:-$here/../shared/data/mlperf-cosmoflow}
TRAIN=${TRAIN:-1}
py=/usr/bin/python3

for v in N_TRAIN N_VAL N_TEST N_ROBUST SUB_SIDE BIN MEMBERS EPOCHS BATCH MSE_WARMUP_EPOCHS SEED; do
  [[ "${!v}" =~ ^[0-9]+$ ]] && (( 10#${!v} >= 1 )) ||
    { echo "fullres_study.sh: $v=${!v}: expected a positive integer" >&2; exit 2; }
  printf -v "$v" '%d' "$((10#${!v}))"  # "08" -> 8
done
[[ "$BN_STATISTICS_BATCHES" =~ ^[0-9]+$ ]] ||
  { echo "fullres_study.sh: BN_STATISTICS_BATCHES=$BN_STATISTICS_BATCHES: expected a non-negative integer" >&2; exit 2; }
BN_STATISTICS_BATCHES=$((10#$BN_STATISTICS_BATCHES))
[[ "$NET_COMPARE_MEMBERS" =~ ^[0-9]+$ ]] && { NET_COMPARE_MEMBERS=$((10#$NET_COMPARE_MEMBERS)); (( NET_COMPARE_MEMBERS == 0 || NET_COMPARE_MEMBERS >= 7 )); } ||
  { echo "fullres_study.sh: NET_COMPARE_MEMBERS=$NET_COMPARE_MEMBERS: expected 0 (off) or at least 7" >&2; exit 2; }
[[ "$NET_COMPARE_PARENT_SIDE" =~ ^[0-9]+$ ]] ||
  { echo "fullres_study.sh: NET_COMPARE_PARENT_SIDE=$NET_COMPARE_PARENT_SIDE: expected 0 (periodic) or a parent side" >&2; exit 2; }
for v in PIECES_PARENT_SIDE N_TRAIN_PIECES N_TEST_PIECES; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "fullres_study.sh: $v=${!v}: expected a non-negative integer" >&2; exit 2; }
  printf -v "$v" '%d' "$((10#${!v}))"
done
(( MEMBERS <= 99 )) || { echo "fullres_study.sh: MEMBERS=$MEMBERS: expected 1..99" >&2; exit 2; }
(( N_TRAIN >= 5 && N_VAL >= 2 )) ||
  { echo "fullres_study.sh: N_TRAIN=$N_TRAIN N_VAL=$N_VAL: the baseline's 5-fold fit and the rho fit need >= 5 and >= 2" >&2; exit 2; }
[ -f "$SPEC" ] || { echo "fullres_study.sh: SPEC=$SPEC: no such file" >&2; exit 2; }
for b in synth/synth synth/cosmoflow-subcubes synth/cosmoflow-import trainer/cosmoflow-train \
         server/cosmoflow-server client/cosmoflow-client; do
  [ -x "$build/$b" ] || { echo "fullres_study.sh: $build/$b missing: build first (see README)" >&2; exit 1; }
done

# Side of the generated parents (the preset's 128 unless SYNTH_ARGS says otherwise) and of the
# universes the study sees (CUBE_SIDE, pieces cut from the parents): the estimates scale with it.
parent_side=128; [[ " $SYNTH_ARGS " =~ \ --side[\ =]([0-9]+) ]] && parent_side=${BASH_REMATCH[1]}
side=${CUBE_SIDE:-$parent_side}
[[ "$side" =~ ^[0-9]+$ ]] && (( side >= 1 && parent_side % side == 0 )) ||
  { echo "fullres_study.sh: CUBE_SIDE=$side: expected a divisor of the parents' side $parent_side" >&2; exit 2; }
pieces=$(( (parent_side / side) ** 3 ))
for v in N_TRAIN N_VAL N_TEST N_ROBUST; do
  (( ${!v} % pieces == 0 )) ||
    { echo "fullres_study.sh: $v=${!v}: expected a multiple of $pieces (${side}^3 pieces per ${parent_side}^3 parent)" >&2; exit 2; }
done
(( side % BIN == 0 && side / BIN % SUB_SIDE == 0 )) ||
  { echo "fullres_study.sh: SUB_SIDE=$SUB_SIDE BIN=$BIN: BIN x SUB_SIDE does not divide the cube side $side" >&2; exit 2; }
per_universe=$(( (side / BIN / SUB_SIDE) ** 3 ))
# Pieces of larger parents for validation, part of training and a second test set (PIECES_PARENT_SIDE).
val_set=val; pieces_set=''; test_pieces_set=''; per_parent=0
if (( PIECES_PARENT_SIDE > 0 )); then
  (( pieces == 1 )) ||
    { echo "fullres_study.sh: PIECES_PARENT_SIDE goes with periodic universes only, not with CUBE_SIDE" >&2; exit 2; }
  (( PIECES_PARENT_SIDE > side && PIECES_PARENT_SIDE % side == 0 )) ||
    { echo "fullres_study.sh: PIECES_PARENT_SIDE=$PIECES_PARENT_SIDE: expected a multiple of the cube side $side above it" >&2; exit 2; }
  per_parent=$(( (PIECES_PARENT_SIDE / side) ** 3 ))
  for v in N_VAL N_TRAIN_PIECES N_TEST_PIECES; do
    (( ${!v} % per_parent == 0 )) ||
      { echo "fullres_study.sh: $v=${!v}: expected a multiple of $per_parent (${side}^3 pieces per ${PIECES_PARENT_SIDE}^3 parent)" >&2; exit 2; }
  done
  val_set=val-p$PIECES_PARENT_SIDE; pieces_set=train-p$PIECES_PARENT_SIDE
  (( N_TEST_PIECES == 0 )) || test_pieces_set=test-p$PIECES_PARENT_SIDE
else
  for v in N_TRAIN_PIECES N_TEST_PIECES; do
    (( ${!v} == 0 )) || { echo "fullres_study.sh: $v=${!v} needs PIECES_PARENT_SIDE" >&2; exit 2; }
  done
fi
# The sets the server reads, by name, and each one's data; the test sets and robust are reported.
declare -A data_of=([val]=$val_set [test]=test [robust]=robust)
[ -n "$test_pieces_set" ] && data_of[test-pieces]=$test_pieces_set
reported=(test ${test_pieces_set:+test-pieces} robust)
# Sub-cube sets are named by their cutting (e.g. test-sub32, test-sub32-bin2): data reused from a
# run with other SUB_SIDE or BIN are never taken for this one's.
sub=sub$SUB_SIDE; (( BIN > 1 )) && sub+=-bin$BIN
mkdir -p "$out/data"

# Time estimates on 2 idle cores (docs/accuracy.md, "The full-resolution study", has their basis):
# 1.0 s per preset universe with 2 workers, 4x that with --pm-mesh 2, 11x with 3; cutting 0.05 s per universe;
# the baseline 0.15 s per universe; training 300 sub-cubes/s (validation 1000/s); serving 400
# sub-cubes/s per member. Each scales with the voxel count.
vol_milli=$(( 1000 * side ** 3 / 128 ** 3 ))
mesh_cost() {  # a universe's generation time with synth flags $1, in preset universes (the last
               # --pm-mesh given wins)
  local w prev='' mesh=1
  for w in $1; do
    [ "$prev" = --pm-mesh ] && mesh=$w; [[ "$w" == --pm-mesh=* ]] && mesh=${w#--pm-mesh=}; prev=$w
  done
  case $mesh in 2) echo 4 ;; 3) echo 11 ;; *) echo 1 ;; esac
}
synth_factor=$(mesh_cost "$SYNTH_ARGS")
robust_factor=$(mesh_cost "$SYNTH_ARGS $ROBUST_ARGS")
# The training set: N_TRAIN universes, with their twins (TRAIN_TWIN_ARGS) and/or pieces beside
# them; periodic_set is its periodic part (the P(k) baseline's fit). extra_synth is what twins and
# pieces (for validation and test too) add to the generation's estimate.
train_set=train; periodic_set=train; n_train_all=$N_TRAIN; extra_synth=0
if [ -n "$TRAIN_TWIN_ARGS" ]; then
  train_set=train+twin; periodic_set=train+twin; n_train_all=$((2 * N_TRAIN))
  extra_synth=$(( 1000 * $(mesh_cost "$SYNTH_ARGS $TRAIN_TWIN_ARGS") * N_TRAIN ))
fi
if (( PIECES_PARENT_SIDE > 0 )); then  # a piece costs about 1.5 periodic universes of its side
  (( N_TRAIN_PIECES == 0 )) || { train_set+=+p$PIECES_PARENT_SIDE; n_train_all=$((n_train_all + N_TRAIN_PIECES)); }
  extra_synth=$(( extra_synth + synth_factor * (1500 * (N_TRAIN_PIECES + N_TEST_PIECES) + 500 * N_VAL) ))
fi
n_served=$(( N_VAL + N_TEST + N_TEST_PIECES + N_ROBUST ))  # universes the server reads
sub_total=$(( (n_train_all + n_served) * per_universe ))
sub_milli=$(( 1000 * SUB_SIDE ** 3 / 32 ** 3 ))  # the rates below are for 32^3 sub-cubes
names=(data subcubes baseline training serving real report)
est=(
  $(( (1000 * synth_factor * (N_TRAIN + N_VAL + N_TEST) + 1000 * robust_factor * N_ROBUST + extra_synth) * vol_milli / 1000000 + 1 ))
  $(( 50 * (n_train_all + n_served) * vol_milli / 1000000 + 1 ))
  $(( 150 * (n_train_all + N_TEST + N_ROBUST + (N_TEST_PIECES > 0 ? n_train_all + N_TEST_PIECES : 0)) * vol_milli / 1000000 + 5 ))
  $(( MEMBERS * EPOCHS * (n_train_all * per_universe * sub_milli / 300000 + N_VAL * per_universe * sub_milli / 1000000) + 10 * MEMBERS ))
  $(( MEMBERS * n_served * per_universe * sub_milli / 400000 + 5 ))
  $(( MEMBERS * 3 * 64 / 400 + 15 + 3 * NET_COMPARE_MEMBERS * (1000 * synth_factor + 1500) * vol_milli / 1000000 ))
  20)
fmt() { printf '%dh%02dm%02ds' $(($1 / 3600)) $(($1 % 3600 / 60)) $(($1 % 60)); }
t0=$(date +%s); k=0
stage() {  # the next stage: its name, elapsed time, its estimate and the run's ETA (estimates scaled
           # by how the finished stages compared with theirs)
  local now=$(( $(date +%s) - t0 )) done_est=0 rest=0 i
  for ((i = 0; i < k; i++)); do done_est=$((done_est + est[i])); done
  for ((i = k; i < ${#est[@]}; i++)); do rest=$((rest + est[i])); done
  local eta=$rest; (( done_est > 30 )) && eta=$(( rest * now / done_est ))
  echo "== [$(fmt "$now")] stage $((k + 1))/${#est[@]}: ${names[k]}: $1 (estimate $(fmt "${est[k]}"), run ETA $(fmt "$eta"))"
  k=$((k + 1))
}
total=0; for e in "${est[@]}"; do total=$((total + e)); done
train_note=''; [ -n "$TRAIN_TWIN_ARGS" ] && train_note=" (training twice: also with $TRAIN_TWIN_ARGS)"
(( PIECES_PARENT_SIDE > 0 )) &&
  train_note+=" + $N_TRAIN_PIECES train and $N_TEST_PIECES test pieces of ${PIECES_PARENT_SIDE}^3 parents, validation on such pieces"
echo "fullres_study.sh: $out: $N_TRAIN/$N_VAL/$N_TEST universes$train_note + $N_ROBUST robustness ($ROBUST_ARGS), ${side}^3 (bin $BIN) -> $per_universe sub-cubes of ${SUB_SIDE}^3 each ($sub_total in all), $MEMBERS member(s) x $EPOCHS epochs, $PRECISION; estimate $(fmt "$total") on 2 idle cores"
# Disk: each universe once whole and once as sub-cubes (int16, 4 channels), and the comparison's
# universes at the real cubes' parameters.
need_mib=$(( ((n_train_all + n_served) * 2 + 3 * NET_COMPARE_MEMBERS) * 8 * side ** 3 / 1048576 ))
free_mib=$(df -Pm "$out" | awk 'NR == 2 {print $4}')
(( free_mib >= need_mib )) ||
  echo "fullres_study.sh: warning: the data need up to $need_mib MiB in $out, $free_mib MiB are free (data already there is reused)"

# ---- 1. universes: the MLPerf preset; the robustness set the same prior with another evolution.
stage "synth --preset mlperf: $N_TRAIN train$train_note, $N_VAL val, $N_TEST test, $N_ROBUST robustness ($ROBUST_ARGS)"
gen() {  # set seed count extra-args...: into a temporary directory, renamed when complete; with
         # gen_parent set, the universes are pieces of gen_parent^3 parents
  local set=$1 seed=$2 n=$3 pieces=$pieces; shift 3
  [ -d "$out/data/$set" ] && return
  rm -rf "$out/data/$set.tmp" "$out/data/$set.parents.tmp"
  if [ -n "${gen_parent:-}" ]; then set -- "$@" --side "$gen_parent"; pieces=$(( (gen_parent / side) ** 3 )); fi
  if (( pieces == 1 )); then
    # shellcheck disable=SC2086
    "$build/synth/synth" --preset mlperf --out "$out/data/$set.tmp" --samples "$n" --seed "$seed" --quiet $SYNTH_ARGS "$@" >/dev/null
  else  # one parent at a time on both cores: a 256^3 parent with --pm-mesh 2 needs 6.6 GB
    # shellcheck disable=SC2086
    "$build/synth/synth" --preset mlperf --out "$out/data/$set.parents.tmp" --samples $((n / pieces)) --seed "$seed" \
      --threads-per-cube 2 --quiet $SYNTH_ARGS "$@" >/dev/null
    "$build/synth/cosmoflow-subcubes" --in "$out/data/$set.parents.tmp" --out "$out/data/$set.tmp" --side "$side" --quiet >/dev/null
    rm -rf "$out/data/$set.parents.tmp"
  fi
  mv "$out/data/$set.tmp" "$out/data/$set"
  echo "   $set: $n universes after $(fmt $(( $(date +%s) - t0 )))"
}
link_sets() {  # merged a b: one directory of both sets' files, linked under distinct names (a set
               # that is itself merged keeps its links' targets)
  local merged=$1 a=$2 b=$3 f
  [ -d "$out/data/$merged" ] && return
  rm -rf "$out/data/$merged.tmp"; mkdir "$out/data/$merged.tmp"
  for f in "$out/data/$a"/*.h5; do ln -s "../$a/${f##*/}" "$out/data/$merged.tmp/a-${f##*/}"; done
  for f in "$out/data/$b"/*.h5; do ln -s "../$b/${f##*/}" "$out/data/$merged.tmp/b-${f##*/}"; done
  mv "$out/data/$merged.tmp" "$out/data/$merged"
}
gen train 21 "$N_TRAIN"; gen test 23 "$N_TEST"
if [ -n "$TRAIN_TWIN_ARGS" ]; then
  # shellcheck disable=SC2086
  gen train-twin 21 "$N_TRAIN" $TRAIN_TWIN_ARGS
  link_sets "$periodic_set" train train-twin
fi
if (( PIECES_PARENT_SIDE > 0 )); then
  gen_parent=$PIECES_PARENT_SIDE gen "$val_set" 22 "$N_VAL"
  if (( N_TRAIN_PIECES > 0 )); then
    gen_parent=$PIECES_PARENT_SIDE gen "$pieces_set" 25 "$N_TRAIN_PIECES"
    link_sets "$train_set" "$periodic_set" "$pieces_set"
  fi
  (( N_TEST_PIECES == 0 )) || gen_parent=$PIECES_PARENT_SIDE gen "$test_pieces_set" 26 "$N_TEST_PIECES"
else
  gen val 22 "$N_VAL"
fi
# shellcheck disable=SC2086
gen robust 24 "$N_ROBUST" $ROBUST_ARGS

# ---- 2. sub-cubes: all four channels, the parents' labels, a group id per universe.
stage "cosmoflow-subcubes into ${SUB_SIDE}^3 (voxels summed in ${BIN}^3 blocks)"
for set in "$train_set" "$val_set" test $test_pieces_set robust; do
  [ -d "$out/data/$set-$sub" ] && continue
  rm -rf "$out/data/$set-$sub.tmp"
  "$build/synth/cosmoflow-subcubes" --in "$out/data/$set" --out "$out/data/$set-$sub.tmp" --side "$SUB_SIDE" --bin "$BIN" --quiet >/dev/null
  mv "$out/data/$set-$sub.tmp" "$out/data/$set-$sub"
done

# ---- 3. the P(k) baseline on the full cubes: per-redshift spectra and their cross-spectra.
stage "P(k) baseline (ridge on per-redshift P(k) and cross-spectra of the full ${side}^3 cubes)"
$py "$here/tools/pk_baseline.py" --train "$out/data/$periodic_set" --test "$out/data/test" "$out/data/robust" \
  --out "$out/pk_test.csv" "$out/pk_robust.csv" --cross --workers 2 --save-model "$out/pk_fit.npz"
# The test pieces against a fit that has seen pieces: every training universe, pieces included.
[ -z "$test_pieces_set" ] || $py "$here/tools/pk_baseline.py" --train "$out/data/$train_set" \
  --test "$out/data/$test_pieces_set" --out "$out/pk_test-pieces.csv" --cross --workers 2

# ---- 4. training: 2 MPI ranks, the uncertainty study's flags.
model=$out/run/checkpoints; [ "$MEMBERS" -gt 1 ] && model=$out/run
if [ "$TRAIN" = 0 ]; then
  stage "reusing the trained run in $out/run"
  [ -f "$out/run/ensemble.json" ] && model=$out/run
  [ -f "$out/run/ensemble.json" ] || [ -f "$out/run/run.json" ] ||
    { echo "fullres_study.sh: TRAIN=0 but $out/run holds no finished run" >&2; exit 1; }
else
  stage "$(basename "$SPEC"), $MEMBERS member(s) x $EPOCHS epochs of $((n_train_all * per_universe)) sub-cubes, $PRECISION, 2 ranks x batch $BATCH"
  root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
  # An interrupted run with the same settings resumes (the trainer continues each member from its
  # latest checkpoint and skips finished ones); any other run directory is replaced.
  settings="$(sha256sum < "$SPEC" | cut -c1-16) $N_TRAIN $N_VAL $side $SUB_SIDE $BIN $SYNTH_ARGS $MEMBERS $EPOCHS $BATCH $LR $PRECISION $MSE_WARMUP_EPOCHS $SEED $TRAIN_TWIN_ARGS"
  (( PIECES_PARENT_SIDE == 0 )) || settings+=" pieces $PIECES_PARENT_SIDE $N_TRAIN_PIECES"
  (( BN_STATISTICS_BATCHES == 0 )) || settings+=" bn-statistics $BN_STATISTICS_BATCHES"
  if [ "$(cat "$out/run/fullres-settings" 2>/dev/null)" = "$settings" ]; then
    echo "   resuming the run in $out/run (same settings)"
  else
    rm -rf "$out/run"; mkdir -p "$out/run"; echo "$settings" > "$out/run/fullres-settings"
  fi
  # A sample that is a whole generated universe is a periodic box: periodic shifts are symmetries
  # of its statistics, so they augment it too (never a cut piece or sub-cube, whose faces do not join).
  shift=(); (( pieces == 1 && N_TRAIN_PIECES == 0 && per_universe == 1 && BIN * SUB_SIDE == side )) && shift=(--augment-shift)
  OMP_NUM_THREADS=1 mpirun "${root[@]}" -np 2 --bind-to none "$build/trainer/cosmoflow-train" \
    --spec "$SPEC" --train "$out/data/$train_set-$sub" --val "$out/data/$val_set-$sub" --out "$out/run" --epochs "$EPOCHS" \
    --batch "$BATCH" --recipe sc18 --lr "$LR" --precision "$PRECISION" --augment "${shift[@]}" --log-every 256 \
    --seed "$SEED" --members "$MEMBERS" --mse-warmup-epochs "$MSE_WARMUP_EPOCHS" --mean-gradient mse \
    --covariance-gradient head --calibration power --bn-statistics-batches "$BN_STATISTICS_BATCHES"
fi

# ---- 5. every sub-cube through the real server, averaged per universe.
stage "serving $(( n_served * per_universe )) sub-cubes through cosmoflow-server, averaging per universe"
rm -f "$out/grpc.port" "$out"/pred_*.csv "$out"/universes_*.csv "$out"/model_info*.json "$out"/real_cubes.* "$out/pk_real.csv"
"$build/server/cosmoflow-server" --checkpoint "$model" --address 127.0.0.1:0 --metrics-address "" \
  --port-file "$out/grpc.port" --max-batch 8 --precision "$SERVE_PRECISION" > "$out/server.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do [ -s "$out/grpc.port" ] && break; sleep 0.2; done
[ -s "$out/grpc.port" ] || { echo "fullres_study.sh: the server never listened: $(tail -3 "$out/server.log")" >&2; exit 1; }
addr=127.0.0.1:$(cat "$out/grpc.port")
for set in val "${reported[@]}"; do
  $py "$here/tools/predict_dataset.py" --address "$addr" --data "$out/data/${data_of[$set]}-$sub" --out "$out/pred_$set.csv"
done
# rho (the correlation between one universe's sub-cube errors) is fitted on the validation
# universes only; the test, robustness and real cubes use that value.
$py "$here/tools/average_subcubes.py" --pred "$out/pred_test.csv" --data "$out/data/test-$sub" \
  --out "$out/universes_test.csv" --combine "fit:$out/pred_val.csv,$out/data/$val_set-$sub"
rho=$($py -c "import csv,sys; print(next(csv.DictReader(open(sys.argv[1])))['combine'].split('rho=')[1])" "$out/universes_test.csv")
for set in val "${reported[@]:1}"; do  # every set but test, averaged above
  $py "$here/tools/average_subcubes.py" --pred "$out/pred_$set.csv" --data "$out/data/${data_of[$set]}-$sub" \
    --out "$out/universes_$set.csv" --combine "rho:$rho"
done
echo "   rho = $rho (fitted on the $N_VAL validation universes)"

# The network on synthetic universes at each real cube's parameters (the generator's flags without
# --side: whole periodic universes of the study's side), appended to the real cubes' report.
network_compare() {
  local synth_args pk_bins=$(( NET_COMPARE_MEMBERS - 4 < 10 ? NET_COMPARE_MEMBERS - 4 : 10 ))
  synth_args=$(sed -E 's/--side[ =][0-9]+//g' <<< "$SYNTH_ARGS")
  $py "$here/tools/compare_real.py" --real "$(ls "$out"/data/real/*.h5 | head -1)" --out "$out/compare-real" \
    --members "$NET_COMPARE_MEMBERS" --seed $(( 1000 * SEED + 500 )) --synth "$build/synth/synth" \
    --synth-args "$synth_args" --side "$side" --pk-bins "$pk_bins" --threads 2 --address "$addr" \
    --sub-side "$SUB_SIDE" --bin "$BIN" --subcubes "$build/synth/cosmoflow-subcubes" \
    --parent-side "$NET_COMPARE_PARENT_SIDE" > /dev/null
  local kind="synthetic universes"
  if (( NET_COMPARE_PARENT_SIDE > 0 )); then kind="pieces of ${NET_COMPARE_PARENT_SIDE}^3 parents"; fi
  { printf '\n### The served network at each real cube'"'"'s own parameters (%d %s each)\n\n' \
      "$NET_COMPARE_MEMBERS" "$kind"; cat "$out/compare-real/network.md"
    echo "All statistics: [compare-real/real_cubes.md](compare-real/real_cubes.md)."; } >> "$out/real_cubes.md"
}

# ---- 6. the real cubes: the served model's checksum goes into the report first.
stage "the served model's checksum, then the real MLPerf cubes"
$py "$here/tools/predict_dataset.py" --address "$addr" --info-json "$out/model_info.json"
"$build/client/cosmoflow-client" --address "$addr" info --json > "$out/model_info_cli.json"
manifest_sha=none; [ -f "$model/ensemble.json" ] && manifest_sha=$(sha256sum "$model/ensemble.json" | cut -d' ' -f1)
$py - "$out/model_info.json" "$manifest_sha" "$out/real_cubes.md" <<'PY'
import json, sys, time
info, sha, md = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
members = ", ".join(info["member_checkpoints"]) or "one checkpoint"
with open(md, "w") as f:
    f.write(f"Served model, recorded {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} before any real cube "
            f"was imported: version `{info['version']}`, checksum `{info['checksum']}`, {info['ensemble_members']} "
            f"member(s) ({members}), ensemble.json sha256 `{sha}`.\n")
PY
sync "$out/real_cubes.md"
echo "   served model: $(head -c 300 "$out/real_cubes.md")"
if ls "$REAL_DIR"/*.tfrecord >/dev/null 2>&1; then
  rm -rf "$out/data/real" "$out/data/real-$sub"
  "$build/synth/cosmoflow-import" --out "$out/data/real" --quiet "$REAL_DIR"/*.tfrecord >/dev/null
  "$build/synth/cosmoflow-subcubes" --in "$out/data/real" --out "$out/data/real-$sub" --side "$SUB_SIDE" --bin "$BIN" --quiet >/dev/null
  $py "$here/tools/predict_dataset.py" --address "$addr" --data "$out/data/real-$sub" --out "$out/pred_real.csv"
  $py "$here/tools/average_subcubes.py" --pred "$out/pred_real.csv" --data "$out/data/real-$sub" \
    --out "$out/universes_real.csv" --combine "rho:$rho"
  # The baseline's fit of stage 3, for comparison on the same cubes (its test RMS is its sigma).
  $py "$here/tools/pk_baseline.py" --model "$out/pk_fit.npz" --test "$out/data/real" --out "$out/pk_real.csv"
  $py "$here/tools/fullres_report.py" real --universes "$out/universes_real.csv" --md "$out/real_cubes.md" \
    --json "$out/real_cubes.json" --baseline-pred "$out/pk_real.csv" --baseline-test "$out/pk_test.csv"
  if (( NET_COMPARE_MEMBERS > 0 )); then network_compare; fi
else
  msg="Real cubes skipped: no MLPerf TFRecords in $REAL_DIR."
  printf '\n%s\n' "$msg" >> "$out/real_cubes.md"
  echo "   $msg"
fi
kill -TERM $pid; wait $pid || true; trap - EXIT

# ---- 7. the report.
stage "report"
read -r mean < <($py -c "
import glob, h5py, numpy as np
p = np.concatenate([h5py.File(f)['params'][:] for f in sorted(glob.glob('$out/data/$train_set/*.h5'))])
print(','.join(f'{v:.6f}' for v in p.mean(0)))")
for set in "${reported[@]}"; do
  $py "$here/tools/accuracy_report.py" --network "$out/universes_$set.csv" --network-val "$out/universes_val.csv" \
    --baseline "$out/pk_$set.csv" --train-mean "$mean" --prior "$PRIOR" --trivial-ratio-targets none \
    --out "$out/$set" > /dev/null
done
$py - "$out/study.json" <<PY
import json, sys
json.dump({"n_train": $N_TRAIN, "n_val": $N_VAL, "n_test": $N_TEST, "n_robust": $N_ROBUST,
           "robust_args": "$ROBUST_ARGS", "train_twin_args": "$TRAIN_TWIN_ARGS", "pieces_parent_side": $PIECES_PARENT_SIDE, "n_train_pieces": $N_TRAIN_PIECES, "n_test_pieces": $N_TEST_PIECES, "synth_args": "$SYNTH_ARGS", "side": $side, "parent_side": $parent_side, "sub_side": $SUB_SIDE, "bin": $BIN,
           "subcubes_per_universe": $per_universe, "spec": "$(basename "$SPEC")", "members": $MEMBERS,
           "epochs": $EPOCHS, "batch": $BATCH, "lr": $LR, "precision": "$PRECISION",
           "serve_precision": "$SERVE_PRECISION", "mse_warmup_epochs": $MSE_WARMUP_EPOCHS, "seed": $SEED, "bn_statistics_batches": $BN_STATISTICS_BATCHES,
           "combine": "rho = $rho", "rho": $rho, "prior": "$PRIOR", "train_mean": "$mean",
           "manifest_sha256": "$manifest_sha", "trained": $TRAIN, "estimate_s": $total, "elapsed_s": $(( $(date +%s) - t0 ))},
          open(sys.argv[1], "w"), indent=1)
PY
$py "$here/tools/fullres_report.py" summary --dir "$out" > /dev/null
echo "fullres study done in $(fmt $(( $(date +%s) - t0 ))) (estimate $(fmt "$total")): $out/report.md"
