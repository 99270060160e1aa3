#!/bin/sh
# tools/compare_real.py on one real MLPerf cube at toy size (a 32^3 corner, 12 synthetic members):
# the three files are imported with cosmoflow-import, compared, and the table, CSV, JSON and PNG
# checked. Skips (status 77) when the shared data directory is absent.
#   compare_real_test.sh SOURCE_DIR BINARY_DIR SHARED_DIR
set -eu
src=$1 bin=$2 shared=$3
data="$shared/data/mlperf-cosmoflow"
if ! ls "$data"/*.tfrecord >/dev/null 2>&1; then
  echo "compare_real_test: no MLPerf files in $data (set up ../shared beside the checkout); skipped"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/synth/cosmoflow-import" --out "$tmp/real" --quiet "$data"/*.tfrecord >/dev/null
/usr/bin/python3 "$src/tools/compare_real.py" --real "$tmp/real/mlperf-00000000.h5" --out "$tmp/cmp" \
  --synth "$bin/synth/synth" --indices 1 --side 32 --members 12 --pk-bins 6 --threads 2 \
  --synth-args "--pm-steps 4" >"$tmp/table.md"
for f in real_cubes.md real_cubes.csv real_cubes.json real-1.png; do
  test -s "$tmp/cmp/$f" || { echo "compare_real_test: $f missing or empty"; exit 1; }
done
rows=$(grep -c '^| 1 (0.289, 0.826, 0.877, 70.9) |' "$tmp/table.md" || true)
[ "$rows" -eq 4 ] || { echo "compare_real_test: expected 4 channel rows for cube 1, got $rows"; cat "$tmp/table.md"; exit 1; }
[ "$(wc -l < "$tmp/cmp/real_cubes.csv")" -eq 5 ] || { echo "compare_real_test: CSV is not header + 4 rows"; exit 1; }
/usr/bin/python3 - "$tmp/cmp/real_cubes.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
assert r["members"] == 12 and abs(r["box_mpc_h"] - 32 * 70.86983 / 70) < 1e-3, r["box_mpc_h"]
for row in r["channels"]:
    for key in ("pk_p", "pdf_p", "pk_p_hotelling", "pdf_p_hotelling", "skew_p"):
        assert 0 <= row[key] <= 1, (key, row[key])
    assert 0 <= row["empty_percentile"] <= 100
assert len(r["correlations"]["real"]) == 4
PY
# --parent-side: the members are 32^3 pieces of 64^3 parents (two parents for 12 members), each
# with its own mean density, holding together all of their parents' particles.
/usr/bin/python3 "$src/tools/compare_real.py" --real "$tmp/real/mlperf-00000000.h5" --out "$tmp/pieces" \
  --synth "$bin/synth/synth" --subcubes "$bin/synth/cosmoflow-subcubes" --indices 1 --side 32 --parent-side 64 \
  --members 12 --pk-bins 6 --threads 2 --synth-args "--pm-steps 4" >/dev/null
/usr/bin/python3 - "$tmp/pieces" <<'PY'
import json, sys
import h5py
import numpy as np
out = sys.argv[1]
r = json.load(open(f"{out}/real_cubes.json"))["results"][0]
assert r["members"] == 12 and abs(r["box_mpc_h"] - 32 * 70.86983 / 70) < 1e-3, r["box_mpc_h"]
with h5py.File(f"{out}/ensemble-1.h5") as f:
    cubes, groups = f["cubes"][:], f["sample/group"][:]
assert cubes.shape == (16, 4, 32, 32, 32) and list(groups) == [0] * 8 + [1] * 8, (cubes.shape, groups)
means = cubes[:, 0].reshape(16, -1).mean(1)
assert np.allclose(means.reshape(2, 8).mean(1), 1.0) and means.std() > 0.01, means
PY
/usr/bin/python3 "$src/tools/compare_real.py" --real "$tmp/real/mlperf-00000000.h5" --out "$tmp/pieces" \
  --indices 1 --side 32 --parent-side 48 --members 12 --pk-bins 6 2>"$tmp/err" && exit 1
grep -q "parent-side 48: expected a multiple of the compared side 32" "$tmp/err" || { cat "$tmp/err"; exit 1; }
# The network's readings against the pieces' mean count: a line with known slope plus residuals
# orthogonal to it (so their spread is exact) gives back the slope, the spread, the value
# expected at the real cube's mean count and its z-score.
/usr/bin/python3 - "$src/tools" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import compare_real as cr
rng = np.random.default_rng(3)
m = 12
means = 1 + 0.1 * rng.standard_normal(m)
ens_counts = np.ones((m, 4, 2, 2, 2)) * means[:, None, None, None, None]
x = means - 1
basis = np.stack([np.ones(m), x], axis=1)
r = rng.standard_normal(m)
r -= basis @ np.linalg.lstsq(basis, r, rcond=None)[0]
r *= 0.005 / np.sqrt((r ** 2).sum() / (m - 2))
ens = np.stack([0.3 + 0.2 * x + r, 0.8 - 0.1 * x - r], axis=1)
real_counts = np.full((4, 2, 2, 2), 1.05)
se = 0.005 * np.sqrt(1 + 1 / m + (0.05 - x.mean()) ** 2 / ((x - x.mean()) ** 2).sum())
net = {"ens": ens.tolist(), "real": [0.3 + 0.2 * 0.05 + 2 * se, 0.8 - 0.1 * 0.05]}
d = cr.density_test(net, real_counts, ens_counts)
assert np.allclose(d["slope"], [0.2, -0.1]) and np.allclose(d["resid_std"], 0.005), d
assert np.allclose(d["expected"], [0.31, 0.795]) and np.allclose(d["z"], [2, 0], atol=1e-9), d
assert abs(d["real_mean_count"] - 1.05) < 1e-12 and d["corr"][0] > 0 > d["corr"][1], d
PY
# A second run reuses the ensemble (same command) and a bad input fails with one line.
/usr/bin/python3 "$src/tools/compare_real.py" --real "$tmp/nope.h5" --out "$tmp/cmp" 2>"$tmp/err" && exit 1
[ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "nope.h5: no such file" "$tmp/err" || { cat "$tmp/err"; exit 1; }
# --address in toy mode: the served network's reading of the real cube is that of its 32^3 corner
# (cut by cosmoflow-subcubes inside compare_real), equal to the client's prediction of the same
# corner sliced from the imported counts; the members are read through the same server.
"$bin/synth/synth" --preset mlperf --side 32 --samples 8 --seed 5 --out "$tmp/train" --quiet >/dev/null
OMP_NUM_THREADS=1 "$bin/trainer/cosmoflow-train" --spec "$src/tools/specs/fullres32x4-log1p-fullcov.json" \
  --train "$tmp/train" --val "$tmp/train" --out "$tmp/run" --epochs 1 --batch 4 >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; exit 1; }
"$bin/server/cosmoflow-server" --checkpoint "$tmp/run/checkpoints" --address 127.0.0.1:0 --metrics-address "" \
  --port-file "$tmp/port" >"$tmp/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$tmp"' EXIT
i=0
while [ ! -s "$tmp/port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
[ -s "$tmp/port" ] || { echo "compare_real_test: the server never listened"; cat "$tmp/server.log"; exit 1; }
addr=127.0.0.1:$(cat "$tmp/port")
/usr/bin/python3 "$src/tools/compare_real.py" --real "$tmp/real/mlperf-00000000.h5" --out "$tmp/net" \
  --synth "$bin/synth/synth" --subcubes "$bin/synth/cosmoflow-subcubes" --indices 1 --side 32 --members 7 \
  --pk-bins 3 --threads 2 --synth-args "--pm-steps 4" --address "$addr" --sub-side 32 --bin 1 >/dev/null
/usr/bin/python3 - "$src" "$tmp" "$addr" <<'PY'
import json, sys
import h5py
import numpy as np
src, tmp, addr = sys.argv[1:]
sys.path.insert(0, f"{src}/client/python")
from cosmoflow_client import CosmoFlowClient
w = json.load(open(f"{tmp}/net/real_cubes.json"))["results"][0]["network"]
with h5py.File(f"{tmp}/real/mlperf-00000000.h5") as f:
    corner = f["cubes"][1][:, :32, :32, :32]
ref = CosmoFlowClient(addr).predict(corner)["parameters"]
assert w["members"] == 7 and len(w["ens"]) == 7 and w["names"][:2] == ["Omega_M", "sigma_8"], w
for j, name in enumerate(w["names"]):
    assert abs(w["real"][j] - ref[name]) <= 1e-5 * abs(ref[name]), (name, w["real"][j], ref[name])
assert abs(w["truth"][0] - 0.2892) < 1e-3, w["truth"]
PY
echo "compare_real_test: ok"
