#!/usr/bin/env bash
# The main job, end to end, on embedded defaults:
#   install packages -> build -> generate synthetic universes -> train with 2 MPI ranks ->
#   plot the training curves -> serve the checkpoint over gRPC -> predict held-out cubes with the CLI
#   client -> scrape the Prometheus metrics -> stop everything it started.
#
# Usage: deploy/quickstart.sh [--small] [--no-install] [--build-dir DIR] [--workdir DIR] [--keep]
#   --small        CI-sized run (fewer cubes, fewer steps; about a minute after the build)
#   --no-install   do not run deploy/install-deps.sh (packages already there)
#   --build-dir    where to build (default: ./build); an existing build is reused
#   --no-build     use the binaries already in --build-dir (the ctest end-to-end test does this)
#   --workdir      where data, run, plots and logs go (default: ./quickstart-out)
# Exits non-zero, with one line saying which step failed, if anything goes wrong.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
small=0; install=1; build=1; build_dir="$here/build"; work="$here/quickstart-out"
while [ $# -gt 0 ]; do
  case "$1" in
    --small) small=1 ;;
    --no-install) install=0 ;;
    --no-build) build=0 ;;
    --build-dir) build_dir=$(realpath -m "$2"); shift ;;
    --workdir) work=$(realpath -m "$2"); shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "quickstart.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# Embedded defaults: the accuracy study's setting (docs/accuracy.md), shortened. 32^3 voxels of
# 8 Mpc/h at four redshifts (channels, as in the MLPerf data: their growth carries Omega_M), the
# 4-channel study32x4-log1p network, about 1000 steps; --small is the same pipeline, shrunk for CI.
side=32; voxel=8; redshifts=0,0.5,1.5,3; spec="$here/tools/specs/study32x4-log1p.json"
n_train=2048; n_val=256; n_test=6; epochs=8; batch=8; lr=0.001
if [ "$small" = 1 ]; then n_train=64; n_val=16; n_test=3; epochs=2; fi

step() { echo; echo "==> $*"; }
die() { echo "quickstart.sh: $*" >&2; exit 1; }
t0=$(date +%s)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

if [ "$install" = 1 ]; then
  step "installing Debian packages (deploy/install-deps.sh --no-peer)"
  bash "$here/deploy/install-deps.sh" --no-peer || die "package installation failed"
fi

if [ "$build" = 1 ]; then
step "building (CMake, Release) in $build_dir"
cmake -S "$here" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release > "$work.cmake.log" 2>&1 \
  || { tail -20 "$work.cmake.log" >&2; die "cmake configure failed (log: $work.cmake.log)"; }
cmake --build "$build_dir" -j2 --target synth cosmoflow-train cosmoflow-server cosmoflow-client \
  > "$work.build.log" 2>&1 || { tail -20 "$work.build.log" >&2; die "build failed (log: $work.build.log)"; }
rm -f "$work.cmake.log" "$work.build.log"
fi
synth="$build_dir/synth/synth"; train="$build_dir/trainer/cosmoflow-train"
server="$build_dir/server/cosmoflow-server"; client="$build_dir/client/cosmoflow-client"

rm -rf "$work"; mkdir -p "$work/data"
step "generating synthetic universes: $n_train train, $n_val validation, $n_test test cubes of ${side}^3 x $voxel Mpc/h (z = $redshifts)"
universe=(--side "$side" --voxel-size "$voxel" --redshifts "$redshifts")
"$synth" --out "$work/data/train" --samples "$n_train" "${universe[@]}" --seed 1 \
  --samples-per-shard 512 || die "synth (train) failed"
"$synth" --out "$work/data/val" --samples "$n_val" "${universe[@]}" --seed 2 || die "synth (val) failed"
"$synth" --out "$work/data/test.h5" --samples "$n_test" "${universe[@]}" --seed 3 || die "synth (test) failed"

step "training $(basename "$spec" .json) with 2 MPI ranks x batch $batch for $epochs epochs"
mpi_root=()
[ "$(id -u)" = 0 ] && mpi_root=(--allow-run-as-root)
OMP_NUM_THREADS=1 mpirun "${mpi_root[@]}" -np 2 --bind-to none \
  "$train" --spec "$spec" --train "$work/data/train" --val "$work/data/val" --out "$work/run" \
  --epochs "$epochs" --batch "$batch" --recipe sc18 --lr "$lr" --augment --log-every 32 \
  || die "training failed"

if [ -f "$here/tools/plot_training.py" ]; then
  step "plotting the training curves and validation predictions"
  /usr/bin/python3 "$here/tools/plot_training.py" "$work/run" --out "$work/plots" || die "plotting failed"
fi

step "starting the gRPC server on the latest checkpoint"
"$server" --checkpoint "$work/run/checkpoints" --address 127.0.0.1:0 --metrics-address 127.0.0.1:0 \
  --port-file "$work/grpc.port" --metrics-port-file "$work/metrics.port" > "$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  [ -s "$work/grpc.port" ] && "$client" --address "127.0.0.1:$(cat "$work/grpc.port")" health >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; die "server exited during start-up"; }
  sleep 0.2
done
addr="127.0.0.1:$(cat "$work/grpc.port")"
"$client" --address "$addr" health >/dev/null || die "server never became SERVING (log: $work/server.log)"
"$client" --address "$addr" info

step "predicting $n_test held-out cubes with the CLI client"
for i in $(seq 0 $((n_test - 1))); do
  "$client" --address "$addr" predict --h5 "$work/data/test.h5" --dataset cubes --index "$i" --json \
    > "$work/pred-$i.json" || die "prediction of test cube $i failed"
done
/usr/bin/python3 - "$work" "$n_test" <<'PY'
import json, sys, h5py
work, n = sys.argv[1], int(sys.argv[2])
with h5py.File(f"{work}/data/test.h5") as f:
    names = [s.decode() if isinstance(s, bytes) else s for s in f.attrs["param_names"]]
    true = f["params"][:]
print("cube  " + "  ".join(f"{n + ' true':>14} {n + ' pred':>14}" for n in names))
for i in range(n):
    p = json.load(open(f"{work}/pred-{i}.json"))["parameters"]
    print(f"{i:4d}  " + "  ".join(f"{true[i][j]:14.4f} {p[k]:14.4f}" for j, k in enumerate(names)))
PY

step "scraping the Prometheus metrics"
/usr/bin/python3 - "127.0.0.1:$(cat "$work/metrics.port")" "$work/metrics.txt" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
open(sys.argv[2], "w").write(text)
for line in text.splitlines():
    if line.startswith(("cosmoflow_requests_total", "cosmoflow_predicted_cubes_total", "cosmoflow_model_info",
                        "cosmoflow_request_duration_seconds_count", "cosmoflow_received_bytes_total")):
        print("  " + line)
PY
if command -v promtool >/dev/null; then
  promtool check metrics < "$work/metrics.txt" && echo "  promtool check metrics: clean"
fi

step "stopping the server (SIGTERM drains in-flight requests)"
kill -TERM "$server_pid"; wait "$server_pid" || die "server did not exit cleanly"; server_pid=""

echo
echo "quickstart done in $(( $(date +%s) - t0 )) s. Outputs in $work:"
echo "  data/ (HDF5 shards), run/ (checkpoints, train_log.csv, val_predictions.csv), plots/ (PNG),"
echo "  pred-*.json (server answers), metrics.txt (Prometheus exposition), server.log"
