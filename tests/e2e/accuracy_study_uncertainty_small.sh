#!/usr/bin/env bash
# tools/accuracy_study.sh with uncertainties at toy scale (64 training cubes, one epoch, a
# 2-member ensemble of the full-covariance head): every stage runs, the server serves the
# ensemble with sigma and covariance for the test and validation sets, and the report has the
# calibration tables, the targets and both plots. Says nothing about calibration quality
# (docs/accuracy.md does, at full scale).
# Usage: accuracy_study_uncertainty_small.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$1; work=$2
rm -rf "$work"
fail() { echo "accuracy_study_uncertainty_small: $*" >&2; exit 1; }

set +e
err=$(MEMBERS=0 BUILD_DIR="$build" bash "$here/tools/accuracy_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"MEMBERS=0"* ]] || fail "MEMBERS=0 exited $rc: $err"
[ ! -e "$work/bad" ] || fail "MEMBERS=0 created $work/bad"

BUILD_DIR="$build" N_TRAIN=64 N_VAL=16 N_TEST=16 EPOCHS=2 SYMMETRIES=2 MEMBERS=2 MSE_WARMUP_EPOCHS=1 \
  SPEC="$here/tools/specs/study32x4-overdensity-ns-light-fullcov.json" bash "$here/tools/accuracy_study.sh" "$work/run"
out=$work/run
for f in accuracy.md accuracy.json pred_vs_true.png coverage_curve.png pred_vs_true_errorbars.png \
         network.csv network_sym2.csv network_val.csv network_val_sym2.csv run/ensemble.json \
         run/members/m0/run.json run/members/m1/run.json; do
  [ -s "$out/$f" ] || fail "$out/$f missing or empty"
done
for f in network.csv network_sym2.csv network_val.csv network_val_sym2.csv; do
  [ "$(wc -l < "$out/$f")" = 17 ] || fail "$out/$f: expected a header and 16 rows"
  head -1 "$out/$f" | grep -q ",sigma_Omega_M,sigma_sigma_8,sigma_n_s,cov_Omega_M_Omega_M," ||
    fail "$out/$f has no sigma and covariance columns"
done
for section in "### Served posterior (identity, as the server answers)" \
               "### Mixture over the cube's symmetries, recalibrated on validation" \
               "Joint (Omega_M, sigma_8) region coverage (truncated posterior)" "MLPerf HPC metric"; do
  grep -qF "$section" "$out/accuracy.md" || fail "accuracy.md has no '$section'"
done
for p in Omega_M sigma_8 n_s; do
  grep -qE "^\| $p \| [0-9.]+ \| [0-9.]+ \| " "$out/accuracy.md" || fail "accuracy.md has no calibration row for $p"
  grep -qF "| $p: 68.3% coverage in [0.65, 0.71] |" "$out/accuracy.md" || fail "accuracy.md has no target row for $p"
done
/usr/bin/python3 - "$out/accuracy.json" <<'PY' || fail "accuracy.json lacks the calibration report"
import json, sys
r = json.load(open(sys.argv[1]))["uncertainty"]
for key in ("served", "symmetry_mixture"):
    for n in ("Omega_M", "sigma_8", "n_s"):
        e = r[key]["params"][n]
        assert 0 <= e["coverage"]["0.683"] <= 1 and len(e["terciles_true"]) == 3 and len(e["curve"]) > 10, (key, n)
    assert r[key]["targets"], key
PY
echo "accuracy_study_uncertainty_small: ok"
