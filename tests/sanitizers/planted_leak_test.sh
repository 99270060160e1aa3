#!/bin/bash
# The sanitizer run's suppressions hide only third-party leaks: a leak planted in project code
# (planted_leak.cc) still fails its process with LeakSanitizer's report naming the frame.
# Usage: planted_leak_test.sh PLANTED_LEAK_BINARY LSAN_SUPPRESSIONS
set -u
bin=$1 supp=$2
out=$(LSAN_OPTIONS="suppressions=$supp:print_suppressions=0" ASAN_OPTIONS="detect_leaks=1" "$bin" 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "planted_leak_test: the planted leak was not reported (exit 0):"; echo "$out"; exit 1
fi
if ! grep -q "ERROR: LeakSanitizer: detected memory leaks" <<<"$out" ||
   ! grep -q "cosmoflow::PlantedLeakInProjectCode" <<<"$out"; then
  echo "planted_leak_test: exit $rc but no LeakSanitizer report naming the planted frame:"; echo "$out"; exit 1
fi
echo "planted_leak_test: ok (exit $rc, LeakSanitizer names cosmoflow::PlantedLeakInProjectCode)"
