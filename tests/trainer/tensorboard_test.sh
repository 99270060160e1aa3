#!/usr/bin/env bash
# TensorBoard events of cosmoflow-train (trainer/tensorboard.h), read back by an independent reader
# (tensorboard_check.py) and compared with train_log.csv: a 2-rank run with validation, its resumed
# continuation (a second events file in the same run directory), and --tensorboard=false (none).
#   tensorboard_test.sh TRAIN_BIN MAKE_DATASET_BIN MPIRUN
set -euo pipefail
train_bin=$1 make_dataset=$2 mpirun=$3
here="$(cd "$(dirname "$0")" && pwd)"
tmp=$(mktemp -d /tmp/cosmoflow-tensorboard-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "tensorboard_test: FAIL: $*"; exit 1; }

"$make_dataset" "$tmp/train.h5" 32 32 1 > /dev/null
"$make_dataset" "$tmp/val.h5" 8 32 2 > /dev/null
train() {
  OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$train_bin" --spec=tiny32 \
    --train="$tmp/train.h5" --val="$tmp/val.h5" --batch=4 --log-every=3 "$@" > "$tmp/train.log" 2>&1 ||
    { cat "$tmp/train.log"; fail "cosmoflow-train $* failed"; }
}

train --out="$tmp/run" --epochs=2
/usr/bin/python3 "$here/tensorboard_check.py" "$tmp/run" --expect-files 1 --corrupt-copy || fail "first run"

sleep 1  # the events file name carries the start second: the resumed run gets a new file
train --out="$tmp/run" --epochs=3
grep -q "resum" "$tmp/train.log" || { cat "$tmp/train.log"; fail "the second run did not resume"; }
/usr/bin/python3 "$here/tensorboard_check.py" "$tmp/run" --expect-files 2 || fail "resumed run"

train --out="$tmp/off" --epochs=1 --tensorboard=false
[ -s "$tmp/off/train_log.csv" ] || fail "--tensorboard=false: no train_log.csv"
if compgen -G "$tmp/off/events.out.tfevents.*" > /dev/null; then fail "--tensorboard=false wrote an events file"; fi
echo "tensorboard_test: 3 runs checked, 3 passed, 0 failed"
