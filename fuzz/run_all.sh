#!/usr/bin/env bash
# Runs every fuzz target for a bounded time on its seed corpus (docs/fuzzing.md) and prints one
# line per target: executions, coverage, corpus size. Exits non-zero if any target finds a crash,
# a sanitizer report, a leak, a timeout or an out-of-memory (the reproducer is left in OUT/).
#   fuzz/run_all.sh BUILD_DIR OUT [SECONDS_PER_TARGET=20] [TARGETS...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(realpath "${1:?usage: run_all.sh BUILD_DIR OUT [SECONDS] [TARGETS...]}")
out=$(realpath -m "${2:?usage: run_all.sh BUILD_DIR OUT [SECONDS] [TARGETS...]}")
seconds=${3:-20}
shift $(( $# < 3 ? $# : 3 ))
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_validate fuzz_tfrecord fuzz_npy fuzz_spec fuzz_flags fuzz_checkpoint fuzz_dataset)
real=$here/../../shared/data/mlperf-cosmoflow
[ -d "$real" ] || real=""
mkdir -p "$out/seeds"
COSMOFLOW_STUBS_DIR="$out/stubs" /usr/bin/python3 "$here/make_seeds.py" "$out/seeds" ${real:+--real "$real"} || exit 1
failed=0
printf "%-16s %10s %8s %8s %8s %s\n" target execs exec/s cov corpus result
for t in "${targets[@]}"; do
  bin=$build/fuzz/$t
  if [ ! -x "$bin" ]; then echo "run_all.sh: $bin not built (cmake --build $build --target fuzz)" >&2; exit 2; fi
  mkdir -p "$out/corpus/$t" "$out/artifacts/$t"
  dict=()
  [ -f "$here/$t.dict" ] && dict=(-dict="$here/$t.dict")
  log=$out/$t.log
  # One process, so -max_total_time bounds the wall time; inputs up to 64 KiB; 2 GiB RSS.
  "$bin" "${dict[@]}" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$t/" "$out/corpus/$t" "$out/seeds/$t" > "$log" 2>&1
  rc=$?
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
  rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  corpus=$(ls "$out/corpus/$t" | wc -l)
  result=ok
  if [ $rc -ne 0 ]; then
    result="FAILED (exit $rc, $log, $(ls "$out/artifacts/$t" | head -1))"
    failed=1
  fi
  printf "%-16s %10s %8s %8s %8s %s\n" "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$corpus" "$result"
done
rm -f /dev/shm/cosmoflow-fuzz-* 2>/dev/null
exit $failed
