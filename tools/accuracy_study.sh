#!/usr/bin/env bash
# The accuracy study, reproducible by one command: generate synthetic universes, train the network
# with 2 MPI ranks, predict a held-out test set through the real gRPC server (Python client, one
# stream), fit the P(k) baseline, and write the table and predicted-vs-true plots.
#
# Usage: tools/accuracy_study.sh [OUT_DIR]   (default ./accuracy-out; needs a build in ./build)
# Scale is set by environment variables (defaults = the default study of docs/accuracy.md):
#   SIDE=32 VOXEL=8 REDSHIFTS=0,0.5,1.5,3 DISPLACEMENT=2lpt PARTICLES=2
#   SPEC=tools/specs/study32x4-overdensity-ns-light.json
#   N_TRAIN=8192 N_VAL=512 N_TEST=1024 EPOCHS=30 BATCH=8 LR=0.001 PRECISION=auto SYNTH_ARGS=""
#   SYMMETRIES=48 MEMBERS=1 SEED=1 MSE_WARMUP_EPOCHS=0 MEAN_GRADIENT=nll COVARIANCE_GRADIENT=all
#   SERVE_PRECISION=fp32 CALIBRATION=power-edge
# Uncertainties: a SPEC with an uncertainty head (tools/specs/study32x4-overdensity-ns-light-fullcov.json) and/or MEMBERS=K
# (a deep ensemble, served as one model) add the calibration report, computed on the test set with
# the validation set's predictions (served the same way) for the constant-sigma comparison.
# Data already in OUT_DIR/data is reused; TRAIN=0 also reuses a finished OUT_DIR/run (re-report only).
# 32^3 voxels of 8 Mpc/h = a 256 Mpc/h box (the modes that carry sigma_8 and the shape of P(k)),
# four redshifts of the same initial field as in the MLPerf data (their growth carries Omega_M),
# PARTICLES^3 = 8 particles per voxel (one per voxel leaves the field dominated by shot noise).
# PRECISION=auto is bf16 where the CPU has AVX512-BF16 or AMX, else fp32.
# The other named studies of docs/accuracy.md set SPEC, N_TRAIN, EPOCHS (and, for the
# particle-mesh study, DISPLACEMENT=pm PARTICLES=1); run times are in docs/benchmarks.md.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$here/accuracy-out}")
build=${BUILD_DIR:-$here/build}
SIDE=${SIDE:-32}; VOXEL=${VOXEL:-8}; REDSHIFTS=${REDSHIFTS:-0,0.5,1.5,3}; SPEC=${SPEC:-$here/tools/specs/study32x4-overdensity-ns-light.json}
DISPLACEMENT=${DISPLACEMENT:-2lpt}; PARTICLES=${PARTICLES:-2}
N_TRAIN=${N_TRAIN:-8192}; N_VAL=${N_VAL:-512}; N_TEST=${N_TEST:-1024}
EPOCHS=${EPOCHS:-30}; BATCH=${BATCH:-8}; LR=${LR:-0.001}; PRECISION=${PRECISION:-auto}; SYNTH_ARGS=${SYNTH_ARGS:-}
TRAIN=${TRAIN:-1}
MEMBERS=${MEMBERS:-1}; SEED=${SEED:-1}; MSE_WARMUP_EPOCHS=${MSE_WARMUP_EPOCHS:-0}; MEAN_GRADIENT=${MEAN_GRADIENT:-nll}
COVARIANCE_GRADIENT=${COVARIANCE_GRADIENT:-all}
CALIBRATION=${CALIBRATION:-power-edge}  # the trainer's --calibration: scale | power | power-joint | power-edge
SERVE_PRECISION=${SERVE_PRECISION:-fp32}  # the server's; bf16 (as trained) is about twice as fast
if ! [[ "$MEMBERS" =~ ^[1-9][0-9]?$ ]]; then
  echo "accuracy_study.sh: MEMBERS=$MEMBERS: expected 1..99 ensemble members" >&2; exit 2
fi
SYMMETRIES=${SYMMETRIES:-48}  # test-time average over this many of the cube's 48 symmetries (1 = none)
if ! [[ "$SYMMETRIES" =~ ^[0-9]+$ ]] || (( 10#$SYMMETRIES < 1 || 10#$SYMMETRIES > 48 )); then
  echo "accuracy_study.sh: SYMMETRIES=$SYMMETRIES: expected 1..48" >&2; exit 2
fi
SYMMETRIES=$((10#$SYMMETRIES))  # "08" -> 8, the count the file names use
if ! [[ "$PARTICLES" =~ ^[1-9]$ ]]; then
  echo "accuracy_study.sh: PARTICLES=$PARTICLES: expected 1..9 particles per voxel side" >&2; exit 2
fi
if [ "$PRECISION" = auto ]; then
  PRECISION=fp32
  grep -q -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo && PRECISION=bf16
fi
for b in synth/synth trainer/cosmoflow-train server/cosmoflow-server; do
  [ -x "$build/$b" ] || { echo "accuracy_study.sh: $build/$b missing: build first (see README)" >&2; exit 1; }
done
mkdir -p "$out/data"
t0=$(date +%s)
echo "== synthetic universes (${SIDE}^3 x ${VOXEL} Mpc/h, z = $REDSHIFTS, $DISPLACEMENT, $((PARTICLES ** 3)) particles per voxel): $N_TRAIN train, $N_VAL val, $N_TEST test"
synth_common=(--side "$SIDE" --voxel-size "$VOXEL" --redshifts "$REDSHIFTS" --displacement "$DISPLACEMENT"
  --particles-per-side $((PARTICLES * SIDE)) --quiet)
# shellcheck disable=SC2206
synth_common+=($SYNTH_ARGS)
[ -d "$out/data/train" ] || "$build/synth/synth" --out "$out/data/train" --samples "$N_TRAIN" --seed 11 \
  --samples-per-shard 512 "${synth_common[@]}"
[ -d "$out/data/val" ] || "$build/synth/synth" --out "$out/data/val" --samples "$N_VAL" --seed 12 \
  --samples-per-shard 512 "${synth_common[@]}"
[ -d "$out/data/test" ] || "$build/synth/synth" --out "$out/data/test" --samples "$N_TEST" --seed 13 \
  --samples-per-shard 1024 "${synth_common[@]}"
echo "   data ready after $(( $(date +%s) - t0 )) s"

# What the server loads: the run's checkpoints, or the ensemble's manifest.
model=$out/run/checkpoints; [ "$MEMBERS" -gt 1 ] && model=$out/run
if [ "$TRAIN" = 0 ]; then
  [ -f "$out/run/run.json" ] || [ -f "$out/run/ensemble.json" ] ||
    { echo "accuracy_study.sh: TRAIN=0 but $out/run holds no finished run" >&2; exit 1; }
  [ -f "$out/run/ensemble.json" ] && model=$out/run
  echo "== reusing the trained run in $out/run"
else
  echo "== training $SPEC ($PRECISION), 2 ranks x batch $BATCH, $EPOCHS epochs, $MEMBERS member(s) from seed $SEED"
  root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
  rm -rf "$out/run"
  OMP_NUM_THREADS=1 mpirun "${root[@]}" -np 2 --bind-to none "$build/trainer/cosmoflow-train" \
    --spec "$SPEC" --train "$out/data/train" --val "$out/data/val" --out "$out/run" --epochs "$EPOCHS" \
    --batch "$BATCH" --recipe sc18 --lr "$LR" --precision "$PRECISION" --augment --log-every 64 \
    --seed "$SEED" --members "$MEMBERS" --mse-warmup-epochs "$MSE_WARMUP_EPOCHS" --mean-gradient "$MEAN_GRADIENT" \
    --covariance-gradient "$COVARIANCE_GRADIENT" --calibration "$CALIBRATION"
  echo "   trained after $(( $(date +%s) - t0 )) s"
  /usr/bin/python3 -c "
import glob, json
for f in sorted(glob.glob('$out/run/run.json') + glob.glob('$out/run/members/m*/run.json')):
    print(f'   {f[len(\"$out/run/\"):-len(\"run.json\")] or \"run/\"}: {json.load(open(f))[\"elapsed_s\"]:.0f} s of training')"
fi
run_dir=$out/run; [ -d "$out/run/members/m0" ] && run_dir=$out/run/members/m0  # an ensemble: member 0's curves
[ -f "$here/tools/plot_training.py" ] && /usr/bin/python3 "$here/tools/plot_training.py" "$run_dir" --out "$out/plots" || true

echo "== predicting the test set through the gRPC server"
rm -f "$out/grpc.port"  # a stale one from an earlier run would point the client at a dead port
rm -f "$out"/network_val*.csv  # nor may an earlier model's validation predictions reach the report
"$build/server/cosmoflow-server" --checkpoint "$model" --address 127.0.0.1:0 --metrics-address "" \
  --port-file "$out/grpc.port" --max-batch 8 --precision "$SERVE_PRECISION" > "$out/server.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 150); do [ -s "$out/grpc.port" ] && break; sleep 0.2; done
/usr/bin/python3 - "$here" "127.0.0.1:$(cat "$out/grpc.port")" "$out" "$SYMMETRIES" <<'PY'
import glob, itertools, sys, time, h5py, numpy as np
here, addr, out, nsym = sys.argv[1:5]
nsym = int(nsym)
sys.path.insert(0, f"{here}/client/python")
sys.path.insert(0, f"{here}/tools")
from cosmoflow_client import CosmoFlowClient
from calibration import mixture
client = CosmoFlowClient(addr, timeout=1800)
for attempt in range(150):
    try:
        info = client.info(); break
    except Exception as e:
        if attempt == 149:
            sys.exit(f"accuracy_study.sh: server at {addr} never answered: {e}")
        time.sleep(0.2)
# The cube's symmetries (axis permutations x reflections of the three spatial axes; the identity
# first): the field is statistically isotropic and the network was trained on all 48, so the mean
# of its predictions over them is a lower-variance estimate (test-time augmentation).
symmetries = [(perm, flips) for perm in itertools.permutations((1, 2, 3))
              for flips in itertools.product((False, True), repeat=3)][:nsym]
def predict(data_dir, csv):
    """Serves every cube of data_dir in each symmetry; writes csv (identity) and, with more than one
    symmetry, csv_sym<S>.csv (the mean; with an uncertainty the symmetry mixture's covariance)."""
    cubes, params, names = [], [], None
    for f in sorted(glob.glob(f"{data_dir}/*.h5")):
        with h5py.File(f) as h:
            names = [s.decode() if isinstance(s, bytes) else s for s in h.attrs["param_names"]]
            cubes += list(h["cubes"][:]); params.append(h["params"][:])
    params, p, s = np.concatenate(params), len(names), len(symmetries)
    def variants():
        for c in cubes:
            for perm, flips in symmetries:
                v = np.transpose(c, (0,) + perm)
                axes = tuple(a for a, f in zip((1, 2, 3), flips) if f)
                yield np.ascontiguousarray(np.flip(v, axes) if axes else v)
    preds, covs, with_cov = np.zeros((len(cubes), s, p)), np.zeros((len(cubes), s, p, p)), True
    for k, r in client.predict_stream(variants()):
        if isinstance(r, str):
            sys.exit(f"accuracy_study.sh: {data_dir} cube {k // s}: {r}")
        preds[k // s, k % s] = [r["parameters"][n] for n in names]
        if r["covariance"] is None:
            with_cov = False
        else:
            covs[k // s, k % s] = r["covariance"]
    def write(path, mean, cov):
        pairs = [(i, j) for i in range(p) for j in range(i, p)]
        with open(path, "w") as f:
            f.write("index," + ",".join("true_" + n for n in names) + "," + ",".join("pred_" + n for n in names))
            if cov is not None:
                f.write("," + ",".join("sigma_" + n for n in names) + "," +
                        ",".join(f"cov_{names[i]}_{names[j]}" for i, j in pairs))
            f.write("\n")
            for i in range(len(cubes)):
                row = [f"{i}"] + [f"{v:.6g}" for v in params[i]] + [f"{v:.7g}" for v in mean[i]]
                if cov is not None:
                    row += [f"{np.sqrt(cov[i, j, j]):.7g}" for j in range(p)] + [f"{cov[i, a, b]:.9g}" for a, b in pairs]
                f.write(",".join(row) + "\n")
    write(csv, preds[:, 0], covs[:, 0] if with_cov else None)
    if s > 1:
        mean, cov = mixture(preds, covs)
        write(csv.replace(".csv", f"_sym{s}.csv"), mean, cov if with_cov else None)
    return len(cubes), with_cov
n, with_cov = predict(f"{out}/data/test", f"{out}/network.csv")
print(f"   {n} test cubes x {len(symmetries)} symmetries predicted by {info['version']} "
      f"(uncertainty: {info['uncertainty']})")
if with_cov:  # the validation set too: the constant-sigma comparison and the symmetry mixture's calibration
    n, _ = predict(f"{out}/data/val", f"{out}/network_val.csv")
    print(f"   {n} validation cubes x {len(symmetries)} symmetries predicted")
PY
echo "   served after $(( $(date +%s) - t0 )) s"
kill -TERM $pid; wait $pid || true; trap - EXIT

echo "== P(k) baseline"
/usr/bin/python3 "$here/tools/pk_baseline.py" --train "$out/data/train" --test "$out/data/test" --out "$out/pk_baseline.csv"
mean=$(/usr/bin/python3 -c "
import glob,h5py,numpy as np
p=np.concatenate([h5py.File(f)['params'][:] for f in sorted(glob.glob('$out/data/train/*.h5'))])
print(','.join(f'{v:.6f}' for v in p.mean(0)))")
prior=$(/usr/bin/python3 -c "
import glob,h5py,numpy as np
p=np.concatenate([h5py.File(f)['params'][:] for f in sorted(glob.glob('$out/data/train/*.h5'))])
print(';'.join(f'{lo:.6f},{hi:.6f}' for lo, hi in zip(p.min(0), p.max(0))))")
echo "== report (trivial predictor = training mean $mean)"
sym=(); [ "$SYMMETRIES" -gt 1 ] && sym=(--network-sym "$out/network_sym$SYMMETRIES.csv")
val=()
if [ -f "$out/network_val.csv" ]; then  # written above only for a model with an uncertainty
  val=(--network-val "$out/network_val.csv")
  [ "$CALIBRATION" = scale ] || val+=(--calibration "$CALIBRATION")
  [ "$SYMMETRIES" -gt 1 ] && val+=(--network-sym-val "$out/network_val_sym$SYMMETRIES.csv")
fi
/usr/bin/python3 "$here/tools/accuracy_report.py" --network "$out/network.csv" "${sym[@]}" "${val[@]}" \
  --prior "$prior" --baseline "$out/pk_baseline.csv" --train-mean "$mean" --out "$out"
echo "accuracy study done in $(( $(date +%s) - t0 )) s: $out/accuracy.md, $out/pred_vs_true.png"
