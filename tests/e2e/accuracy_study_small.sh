#!/usr/bin/env bash
# tools/accuracy_study.sh at toy scale (64 training cubes, one epoch): every stage runs (synthetic
# universes (2LPT, 8 particles per voxel), 2-rank training, the gRPC server, the 2-symmetry mean,
# the P(k) baseline, the report) and its outputs are complete. Says nothing about accuracy (docs/accuracy.md does, at full scale).
# Usage: accuracy_study_small.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$1; work=$2
rm -rf "$work"
fail() { echo "accuracy_study_small: $*" >&2; exit 1; }

# A bad setting is refused before any work, with one line and status 2.
set +e
err=$(SYMMETRIES=49 BUILD_DIR="$build" bash "$here/tools/accuracy_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] || fail "SYMMETRIES=49 exited $rc, expected 2"
[ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && [[ "$err" == *"SYMMETRIES=49"* ]] || fail "SYMMETRIES=49 said: $err"
[ ! -e "$work/bad" ] || fail "SYMMETRIES=49 created $work/bad"
set +e
err=$(PARTICLES=0 BUILD_DIR="$build" bash "$here/tools/accuracy_study.sh" "$work/bad" 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" = 2 ] && [[ "$err" == *"PARTICLES=0"* ]] || fail "PARTICLES=0 exited $rc: $err"
[ ! -e "$work/bad" ] || fail "PARTICLES=0 created $work/bad"

BUILD_DIR="$build" N_TRAIN=64 N_VAL=16 N_TEST=16 EPOCHS=1 SYMMETRIES=2 \
  bash "$here/tools/accuracy_study.sh" "$work/run"
out=$work/run
for f in accuracy.md accuracy.json pred_vs_true.png network.csv network_sym2.csv pk_baseline.csv; do
  [ -s "$out/$f" ] || fail "$out/$f missing or empty"
done
for f in network.csv network_sym2.csv pk_baseline.csv; do
  [ "$(wc -l < "$out/$f")" = 17 ] || fail "$out/$f: expected a header and 16 rows"
done
for p in Omega_M sigma_8 n_s; do
  for who in network network_sym pk_baseline trivial; do
    grep -q "^| $p | $who | " "$out/accuracy.md" || fail "accuracy.md has no row for $p / $who"
  done
done
# The symmetry mean is a mean: it differs from the identity-only prediction for some cube.
cmp -s <(cut -d, -f5- "$out/network.csv") <(cut -d, -f5- "$out/network_sym2.csv") &&
  fail "network_sym2.csv equals network.csv: no averaging happened"
echo "accuracy_study_small: ok"
