#!/usr/bin/env bash
# Interleaved A/B of the engine and the trainer: two builds of the project, same machine, same run.
#
#   bench/ab.sh A_BUILD B_BUILD [ROUNDS] [WORKDIR]
#
# A_BUILD and B_BUILD are CMake build directories (each needs bench/engine/engine_bench,
# trainer/cosmoflow-train; B_BUILD also synth/synth). Each round runs, A then B:
#   engine_bench --model sc18 --batch 4: fp32 training, fp32 inference, bf16 training (bf16 only on
#     a CPU with AVX512-BF16);
#   cosmoflow-train, 2 MPI ranks x batch 8, the accuracy-study network on 768 synthetic 32^3 cubes.
# Prints one line per measurement and, at the end, each figure's medians and the B/A ratio.
# Run it on an otherwise idle machine: it measures whatever else the cores are doing too.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: bench/ab.sh A_BUILD B_BUILD [ROUNDS] [WORKDIR]" >&2
  exit 2
fi
A=$(realpath "$1")
B=$(realpath "$2")
ROUNDS=${3:-4}
WORK=${4:-$(mktemp -d /tmp/cosmoflow-ab.XXXXXX)}
REPO=$(cd "$(dirname "$0")/.." && pwd)
SPEC=$REPO/tools/specs/study32x4-overdensity-ns-light.json
for b in "$A" "$B"; do
  for t in bench/engine/engine_bench trainer/cosmoflow-train; do
    [[ -x $b/$t ]] || { echo "bench/ab.sh: $b/$t is missing (build it first)" >&2; exit 2; }
  done
done
BF16=0
grep -q avx512_bf16 /proc/cpuinfo && BF16=1

mkdir -p "$WORK"
if [[ ! -d $WORK/data/train ]]; then
  # The accuracy study's universes (tools/accuracy_study.sh), fewer of them.
  "$B/synth/synth" --out "$WORK/data/train" --samples 768 --seed 11 --samples-per-shard 256 \
    --side 32 --voxel-size 8 --redshifts 0,0.5,1.5,3 --displacement 2lpt --particles-per-side 64 \
    --quiet
fi
RESULTS=$WORK/results.txt
: >"$RESULTS"

engine() {  # label build mode precision
  local out
  out=$(OMP_NUM_THREADS=2 "$2/bench/engine/engine_bench" --model sc18 --batch 4 --iters 3 \
        --warmup 1 --mode "$3" --precision "$4" 2>&1)
  # engine_bench's JSON line: "samples_per_s" is cubes/s for inference.
  local rate
  rate=$(grep -oE '"samples_per_s": [0-9.]+' <<<"$out" | tail -1 | cut -d' ' -f2 || true)
  echo "$1 $3-$4 ${rate:-FAILED}" | tee -a "$RESULTS"
}

trainer() {  # label build
  local out rate
  out=$(OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 \
        "$2/trainer/cosmoflow-train" --spec "$SPEC" --train "$WORK/data/train" --epochs 4 \
        --batch 8 --recipe sc18 --lr 0.001 --max-steps 150 --out "$WORK/ckpt-$1" 2>&1 || true)
  # run.json's samples_per_s: global batch / median step time.
  rate=$(grep -oE '"samples_per_s": *[0-9.]+' "$WORK/ckpt-$1/run.json" 2>/dev/null |
         grep -oE '[0-9.]+$' || true)
  echo "$1 trainer-2ranks ${rate:-FAILED}" | tee -a "$RESULTS"
  rm -rf "$WORK/ckpt-$1"
}

for ((r = 1; r <= ROUNDS; ++r)); do
  echo "== round $r of $ROUNDS ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
  for side in A B; do
    build=$A
    [[ $side == B ]] && build=$B
    engine "$side" "$build" train fp32
    engine "$side" "$build" infer fp32
    [[ $BF16 == 1 ]] && engine "$side" "$build" train bf16
    trainer "$side" "$build"
  done
done

/usr/bin/python3 - "$RESULTS" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 3]
figures = {}
for side, what, rate in rows:
    if rate != "FAILED":
        figures.setdefault(what, {}).setdefault(side, []).append(float(rate))
print(f"{'measurement':<18} {'A median':>10} {'B median':>10} {'B/A':>6}")
for what, sides in figures.items():
    a = statistics.median(sides.get("A", [float("nan")]))
    b = statistics.median(sides.get("B", [float("nan")]))
    print(f"{what:<18} {a:>10.3f} {b:>10.3f} {b / a:>6.3f}")
EOF
echo "raw figures: $RESULTS"
