#!/usr/bin/env bash
# tools/fullres_study.sh at toy scale (6 / 3 / 3 MLPerf-preset universes of 128^3 and 3 robustness
# universes with --pm-mesh 2, each cut into 64 sub-cubes of 32^3; a 2-member ensemble, 2 epochs):
# every stage runs with the real programs (synth, cosmoflow-subcubes, a 2-rank cosmoflow-train, the
# gRPC server and the Python client, cosmoflow-import) and its outputs are complete and sane: every
# number finite, the served model's checksum recorded before the real cubes were imported (by file
# order and by time), the three real cubes predicted when ../shared holds them, a skip line when it
# does not (checked in any case by a re-run with REAL_DIR elsewhere, which also resumes the finished
# training instead of starting over). Says nothing about accuracy.
# Usage: fullres_study_small.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$1; work=$2
rm -rf "$work"; mkdir -p "$work"
fail() { echo "fullres_study_small: $*" >&2; exit 1; }

set +e
err=$(MEMBERS=0 BUILD_DIR="$build" bash "$here/tools/fullres_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"MEMBERS=0"* ]] || fail "MEMBERS=0 exited $rc: $err"
[ ! -e "$work/bad" ] || fail "MEMBERS=0 created $work/bad"
set +e
err=$(SUB_SIDE=48 BUILD_DIR="$build" bash "$here/tools/fullres_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"SUB_SIDE=48 BIN=1: BIN x SUB_SIDE does not divide the cube side 128"* ]] ||
  fail "SUB_SIDE=48 exited $rc: $err"
[ ! -e "$work/bad" ] || fail "SUB_SIDE=48 created $work/bad"
set +e
err=$(BIN=8 BUILD_DIR="$build" bash "$here/tools/fullres_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"SUB_SIDE=32 BIN=8: BIN x SUB_SIDE does not divide"* ]] || fail "BIN=8 exited $rc: $err"
[ ! -e "$work/bad" ] || fail "BIN=8 created $work/bad"

set +e
err=$(NET_COMPARE_MEMBERS=3 BUILD_DIR="$build" bash "$here/tools/fullres_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"NET_COMPARE_MEMBERS=3: expected 0 (off) or at least 7"* ]] || fail "NET_COMPARE_MEMBERS=3 exited $rc: $err"
[ ! -e "$work/bad" ] || fail "NET_COMPARE_MEMBERS=3 created $work/bad"
set +e
err=$(SYNTH_ARGS="--side 256" CUBE_SIDE=96 BUILD_DIR="$build" bash "$here/tools/fullres_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"CUBE_SIDE=96: expected a divisor of the parents' side 256"* ]] || fail "CUBE_SIDE=96 exited $rc: $err"
set +e
err=$(SYNTH_ARGS="--side 256" CUBE_SIDE=128 N_VAL=12 BUILD_DIR="$build" bash "$here/tools/fullres_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"N_VAL=12: expected a multiple of 8"* ]] || fail "N_VAL=12 with pieces exited $rc: $err"
[ ! -e "$work/bad" ] || fail "a refused CUBE_SIDE created $work/bad"

# Universes cut from larger parents (CUBE_SIDE): 32^3 pieces of 64^3 parents, one sub-cube each.
# Each piece has its own mean density (as the real cubes do); the eight of a parent hold all of
# its particles. The training pieces come twice (TRAIN_TWIN_ARGS): the same cosmologies and
# phases evolved with the other force mesh.
pieces=$work/pieces
env BUILD_DIR="$build" SYNTH_ARGS="--side 64" CUBE_SIDE=32 TRAIN_TWIN_ARGS="--pm-mesh 2" N_TRAIN=16 N_VAL=8 N_TEST=8 N_ROBUST=8 MEMBERS=1 \
  EPOCHS=1 BATCH=4 MSE_WARMUP_EPOCHS=1 REAL_DIR="$work/no-such-dir" bash "$here/tools/fullres_study.sh" "$pieces" \
  > "$work/stdout-pieces.txt"
/usr/bin/python3 - "$pieces" <<'PY' || fail "the pieces run is wrong (above)"
import csv, glob, json, sys
import h5py
import numpy as np
out = sys.argv[1]
study = json.load(open(f"{out}/study.json"))
assert study["side"] == 32 and study["parent_side"] == 64 and study["subcubes_per_universe"] == 1, study
for s in ("test", "robust"):
    assert len(list(csv.DictReader(open(f"{out}/universes_{s}.csv")))) == 8, s
    cubes = np.concatenate([h5py.File(f)["cubes"][:] for f in sorted(glob.glob(f"{out}/data/{s}/*.h5"))])
    assert cubes.shape == (8, 4, 32, 32, 32), cubes.shape
    means = cubes.reshape(8, 4, -1).mean(axis=2)
    assert means.std(axis=0).min() > 1e-3, means    # the pieces' mean densities differ
    assert np.allclose(means.mean(axis=0), 1.0), means  # the parent's 64^3 particles, all kept
assert not glob.glob(f"{out}/data/*parents*"), "the parents were not removed"
# The twins: the same labels, other particles; the network and the baseline saw both.
assert study["train_twin_args"] == "--pm-mesh 2", study
load = lambda s, k: np.concatenate([h5py.File(f)[k][:] for f in sorted(glob.glob(f"{out}/data/{s}/*.h5"))])
assert np.array_equal(load("train", "params"), load("train-twin", "params"))
assert not np.array_equal(load("train", "cubes"), load("train-twin", "cubes"))
assert load("train+twin", "params").shape == (32, 4) and load("train+twin-sub32", "params").shape == (32, 4)
assert "also generated with `--pm-mesh 2`" in open(f"{out}/report.md").read()
PY

# Periodic training universes with pieces beside them (PIECES_PARENT_SIDE): 32^3 periodic
# universes and their twins evolved by the other integrator (TRAIN_TWIN_ARGS), and 32^3 pieces of
# 64^3 parents for validation, as extra training universes and as a second test set.
set +e
err=$(SYNTH_ARGS="--side 32" PIECES_PARENT_SIDE=48 BUILD_DIR="$build" bash "$here/tools/fullres_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"PIECES_PARENT_SIDE=48: expected a multiple of the cube side 32 above it"* ]] ||
  fail "PIECES_PARENT_SIDE=48 exited $rc: $err"
[ ! -e "$work/bad" ] || fail "a refused PIECES_PARENT_SIDE created $work/bad"
set +e
err=$(SYNTH_ARGS="--side 32" N_TEST_PIECES=8 BUILD_DIR="$build" bash "$here/tools/fullres_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"N_TEST_PIECES=8 needs PIECES_PARENT_SIDE"* ]] || fail "N_TEST_PIECES alone exited $rc: $err"
mixed=$work/mixed
env BUILD_DIR="$build" SYNTH_ARGS="--side 32" TRAIN_TWIN_ARGS="--pm-scheme cola" PIECES_PARENT_SIDE=64 N_TRAIN=8 N_TRAIN_PIECES=8 N_VAL=8 N_TEST=8 N_TEST_PIECES=8 \
  N_ROBUST=8 MEMBERS=1 EPOCHS=1 BATCH=4 MSE_WARMUP_EPOCHS=1 NET_COMPARE_MEMBERS=0 REAL_DIR="$work/no-such-dir" \
  bash "$here/tools/fullres_study.sh" "$mixed" > "$work/stdout-mixed.txt" 2> "$work/stderr-mixed.txt" ||
  { cat "$work/stderr-mixed.txt" >&2; fail "the run with pieces failed"; }
/usr/bin/python3 - "$mixed" <<'PY' || fail "the run with pieces beside periodic universes is wrong (above)"
import csv, glob, json, sys
import h5py
import numpy as np
out = sys.argv[1]
load = lambda s, k: np.concatenate([h5py.File(f)[k][:] for f in sorted(glob.glob(f"{out}/data/{s}/*.h5"))])
mean_counts = lambda s: load(s, "cubes").reshape(8, 4, -1).mean(axis=2)
for s in ("val-p64", "train-p64", "test-p64"):  # pieces: their own mean densities, the parent's particles all kept
    m = mean_counts(s)
    assert m.std(axis=0).min() > 1e-3 and np.allclose(m.mean(axis=0), 1.0), (s, m)
for s in ("train", "train-twin", "test", "robust"):  # periodic: one particle per voxel
    assert np.allclose(mean_counts(s), 1.0), s
# The twins: the same cosmologies and phases, another integrator.
assert np.array_equal(load("train", "params"), load("train-twin", "params"))
assert not np.array_equal(load("train", "cubes"), load("train-twin", "cubes"))
assert load("train+twin+p64", "params").shape == (24, 4) and load("train+twin+p64-sub32", "params").shape == (24, 4)
assert np.array_equal(load("val-p64", "params"), load("val-p64-sub32", "params"))
study = json.load(open(f"{out}/study.json"))
assert study["pieces_parent_side"] == 64 and study["n_train_pieces"] == 8 and study["side"] == 32, study
assert study["n_test_pieces"] == 8 and study["train_twin_args"] == "--pm-scheme cola", study
# Validation and the second test set are the pieces: their served predictions are those of
# val-p64 and test-p64, and the test pieces have their own report beside the periodic one.
for name, data in (("val", "val-p64"), ("test-pieces", "test-p64")):
    rows = list(csv.DictReader(open(f"{out}/universes_{name}.csv")))
    truth = load(data, "params")
    assert len(rows) == 8 and all(abs(float(r["true_Omega_M"]) - truth[i, 0]) < 1e-5 for i, r in enumerate(rows)), rows
assert not set(map(tuple, load("test-p64", "params"))) & set(map(tuple, load("val-p64", "params")))
assert json.load(open(f"{out}/test-pieces/accuracy.json"))["test_samples"] == 8
assert len(list(csv.DictReader(open(f"{out}/pk_test-pieces.csv")))) == 8
report = open(f"{out}/report.md").read()
assert "pieces of 64^3 parents" in report and "### Test pieces (32^3 of 64^3 parents" in report, report
assert json.load(open(f"{out}/report.json"))["sets"]["test_pieces"]["universes"] == 8
PY
grep -q "pk_baseline.py: 16 train / 8 test cubes" "$work/stderr-mixed.txt" ||
  fail "the baseline was not fitted on the 16 periodic training universes (twins included) alone"
grep -q "pk_baseline.py: 24 train / 8 test cubes.*pk_test-pieces.csv" "$work/stderr-mixed.txt" ||
  fail "the baseline of the test pieces was not fitted on all 24 training universes, pieces included"

out=$work/run
toy=(BUILD_DIR="$build" N_TRAIN=6 N_VAL=3 N_TEST=3 N_ROBUST=3 MEMBERS=2 EPOCHS=2 MSE_WARMUP_EPOCHS=1 NET_COMPARE_MEMBERS=8)
env "${toy[@]}" bash "$here/tools/fullres_study.sh" "$out" | tee "$work/stdout.txt"
for s in 1 2 3 4 5 6 7; do
  grep -qE "^== \[[0-9]+h[0-9]{2}m[0-9]{2}s\] stage $s/7: .*estimate .*run ETA" "$work/stdout.txt" ||
    fail "stdout has no progress line for stage $s/7"
done
grep -q "^fullres study done in " "$work/stdout.txt" || fail "stdout has no closing line"

for f in report.md report.json study.json model_info.json model_info_cli.json real_cubes.md run/ensemble.json \
         pk_test.csv pk_robust.csv pred_val.csv pred_test.csv pred_robust.csv \
         universes_val.csv universes_test.csv universes_robust.csv; do
  [ -s "$out/$f" ] || fail "$out/$f missing or empty"
done
for set in test robust; do
  for f in accuracy.md accuracy.json pred_vs_true.png pred_vs_true_errorbars.png coverage_curve.png; do
    [ -s "$out/$set/$f" ] || fail "$out/$set/$f missing or empty"
  done
done

shared=$here/../shared/data/mlperf-cosmoflow
real=0; ls "$shared"/*.tfrecord >/dev/null 2>&1 && real=1
/usr/bin/python3 - "$out" "$real" <<'PY' || fail "the outputs are incomplete or not sane (above)"
import csv, glob, json, math, os, re, sys
out, real = sys.argv[1], sys.argv[2] == "1"
P = ["Omega_M", "sigma_8", "n_s", "H0"]
def rows(name):
    with open(os.path.join(out, name)) as f:
        return list(csv.DictReader(f))
def finite(x, what):
    assert isinstance(x, (int, float)) and math.isfinite(x), f"{what} = {x!r} is not a finite number"
    return x
# Per sub-cube predictions: 64 per universe, sigma and the full 4x4 covariance, all finite.
for name, n in (("pred_val.csv", 3), ("pred_test.csv", 3), ("pred_robust.csv", 3)):
    r = rows(name)
    assert len(r) == 64 * n, f"{name}: {len(r)} rows, expected {64 * n}"
    for key in [f"pred_{p}" for p in P] + [f"sigma_{p}" for p in P] + ["cov_Omega_M_H0", "cov_n_s_H0"]:
        assert key in r[0], f"{name}: no column {key}"
        for x in r:
            finite(float(x[key]), f"{name} {key}")
# Per universe: one row each, 64 sub-cubes, positive sigma.
for name, n in (("universes_val.csv", 3), ("universes_test.csv", 3), ("universes_robust.csv", 3)):
    r = rows(name)
    assert len(r) == n and all(x["subcubes"] == "64" for x in r), f"{name}: {len(r)} rows"
    assert all(float(x[f"sigma_{p}"]) > 0 for x in r for p in P), f"{name}: a sigma <= 0"
for name, n in (("pk_test.csv", 3), ("pk_robust.csv", 3)):
    r = rows(name)
    assert len(r) == n and all(finite(float(x[f"pred_{p}"]), name) for x in r for p in P), name
study = json.load(open(f"{out}/study.json"))
assert 0 <= finite(study["rho"], "rho") <= 1 and study["subcubes_per_universe"] == 64, study
rep = json.load(open(f"{out}/report.json"))
for key in ("test", "robust"):
    s = rep["sets"][key]
    for p in P:
        e = s["params"][p]
        for k in ("network_rms", "baseline_rms", "trivial_rms", "baseline_over_network"):
            assert finite(e[k], f"{key} {p} {k}") >= 0, (key, p, k)
        assert (e["target"] == 1.5) == (p in ("Omega_M", "sigma_8")), (key, p, e["target"])
        c = s["calibration"][p]
        for q in ("0.683", "0.954"):
            assert 0 <= finite(c["coverage"][q], "coverage") <= 1, (key, p, c)
            assert all(0 <= finite(v, "tercile coverage") <= 1 for v in c["tercile_range"][q]), (key, p, c)
        finite(c["sigma_over_rms"], "mean sigma / RMS")
    for who in ("network", "pk_baseline", "trivial"):
        assert 0 <= finite(s["mlperf_metric"][who], f"{key} MLPerf metric {who}") < 5, (key, who)
    assert len(s["calibration"]["joint"]["params"]) == 2, key
# The served model: the same checksum from the Python and the CLI client, 8 hex digits, first in
# real_cubes.md, and before any real-cube line in report.md.
info, cli = json.load(open(f"{out}/model_info.json")), json.load(open(f"{out}/model_info_cli.json"))
assert re.fullmatch(r"[0-9a-f]{8}", info["checksum"]) and cli["checksum"] == info["checksum"], (info["checksum"], cli.get("checksum"))
assert info["ensemble_members"] == 2 and len(info["outputs"]) == 4, info
real_md = open(f"{out}/real_cubes.md").read().splitlines()
assert real_md[0].startswith("Served model") and info["checksum"] in real_md[0], real_md[0]
report = open(f"{out}/report.md").read().splitlines()
served = next(i for i, l in enumerate(report) if l.startswith("Served model") and info["checksum"] in l)
if real:
    first_real = next(i for i, l in enumerate(report) if l.startswith("| 0 |"))
    assert served < first_real, "report.md: a real-cube line precedes the served model's checksum"
    imported = glob.glob(f"{out}/data/real/*.h5")
    assert imported and os.path.getmtime(f"{out}/model_info.json") <= min(os.path.getmtime(f) for f in imported), \
        "the real cubes were imported before the model's checksum was written"
    r = json.load(open(f"{out}/real_cubes.json"))
    assert len(r["cubes"]) == 3 and r["dof"] == 6 and abs(r["chi2_limit_95"] - 12.59) < 0.01, r
    finite(r["chi2"], "chi2"); finite(r["max_abs_z"], "max |z|")
    truth = {0: (0.2842, 0.7893), 1: (0.2892, 0.8262), 2: (0.3156, 0.7990)}  # the real files' labels (README)
    for c in r["cubes"]:
        assert c["subcubes"] == 64, c
        for p in P:
            finite(c["params"][p]["pred"], "real pred"); assert c["params"][p]["sigma"] > 0, c
        t = truth[c["cube"]]
        assert abs(c["params"]["Omega_M"]["true"] - t[0]) < 1e-3 and abs(c["params"]["sigma_8"]["true"] - t[1]) < 1e-3, c
    assert any("Chi-square of the 6 standardised residuals" in l for l in report), "report.md: no chi-square line"
    # The baseline on the same cubes: sigma is its RMS on the test set, z and chi-square follow.
    b = r["pk_baseline"]
    test = list(csv.DictReader(open(f"{out}/pk_test.csv")))
    z2 = 0.0
    for c in b["cubes"]:
        t = truth[c["cube"]]
        assert abs(c["params"]["Omega_M"]["true"] - t[0]) < 1e-3, c
        for p in ("Omega_M", "sigma_8"):
            e = c["params"][p]
            rms = math.sqrt(sum((float(x["pred_" + p]) - float(x["true_" + p])) ** 2 for x in test) / len(test))
            assert abs(e["sigma"] - rms) <= 1e-9 * rms and abs(e["z"] - (e["pred"] - e["true"]) / rms) < 1e-9, (p, e, rms)
            z2 += e["z"] ** 2
    assert len(b["cubes"]) == 3 and abs(b["chi2"] - z2) <= 1e-9 * z2, b
    assert any("The P(k) baseline" in l for l in report), "report.md: no baseline-on-real-cubes table"
    # The served network on 8 synthetic universes at each real cube's parameters: its reading of the
    # real cube is the study's own (the same cut, the same server), placed among theirs.
    assert any("The served network at each real cube's own parameters (8 synthetic" in l for l in report), \
        "report.md: no network-at-the-real-parameters table"
    study_real = {int(x["group"]): x for x in csv.DictReader(open(f"{out}/universes_real.csv"))}
    net = json.load(open(f"{out}/compare-real/real_cubes.json"))["results"]
    assert [n["index"] for n in net] == [0, 1, 2], [n["index"] for n in net]
    for n in net:
        w = n["network"]
        assert w["names"] == P and w["members"] == 8 and w["dof"] == 4 and 0 <= w["p"] <= 1, w
        for j, p in enumerate(P):
            ours = float(study_real[n["index"]]["pred_" + p])
            assert abs(w["real"][j] - ours) <= 1e-5 * abs(ours), (p, w["real"][j], ours)
            z = (w["real"][j] - w["ens_mean"][j]) / w["ens_std"][j]
            assert w["ens_std"][j] > 0 and abs(finite(w["z"][j], "network z") - z) <= 1e-9 * max(1, abs(z)), w
            assert abs(w["truth"][j] - float(study_real[n["index"]]["true_" + p])) <= 1e-5 * abs(w["truth"][j]), (p, w)
else:
    assert any(l.startswith("Real cubes skipped") for l in report), "report.md: no skip line"
PY

# Again without the real files (REAL_DIR elsewhere): the data are reused, the finished training
# resumes (same settings) instead of starting over, and the real-cube stage writes a skip line.
env "${toy[@]}" REAL_DIR="$work/no-such-dir" bash "$here/tools/fullres_study.sh" "$out" > "$work/stdout2.txt"
grep -q "resuming the run in $out/run (same settings)" "$work/stdout2.txt" || fail "the second run did not resume the training"
grep -q "Real cubes skipped: no MLPerf TFRecords in $work/no-such-dir" "$out/report.md" ||
  fail "report.md has no skip line without the real files"
grep -q "Real cubes skipped" "$work/stdout2.txt" || fail "stdout does not say the real cubes were skipped"
[ ! -e "$out/real_cubes.json" ] || fail "real_cubes.json left from the earlier run"

# 2 Mpc/h sub-cubes (BIN=2) of the same universes through the trained model (TRAIN=0; its input is
# 32^3 either way): cut into their own sets, 8 per universe, not the 64-per-universe sets above.
env "${toy[@]}" BIN=2 TRAIN=0 REAL_DIR="$work/no-such-dir" bash "$here/tools/fullres_study.sh" "$out" > "$work/stdout3.txt"
[ -d "$out/data/test-sub32-bin2" ] && [ -d "$out/data/test-sub32" ] || fail "BIN=2 did not cut its own sub-cube sets"
/usr/bin/python3 - "$out" <<'PY' || fail "the BIN=2 outputs are wrong (above)"
import csv, json, sys
out = sys.argv[1]
for s in ("val", "test", "robust"):
    assert len(list(csv.DictReader(open(f"{out}/pred_{s}.csv")))) == 8 * 3, s
    assert all(r["subcubes"] == "8" for r in csv.DictReader(open(f"{out}/universes_{s}.csv"))), s
study = json.load(open(f"{out}/study.json"))
assert study["bin"] == 2 and study["subcubes_per_universe"] == 8, study
PY
[ "$real" = 1 ] && echo "fullres_study_small: ok (real cubes predicted)" ||
  echo "fullres_study_small: ok (no real MLPerf files in $shared: the real-cube stage skipped)"
