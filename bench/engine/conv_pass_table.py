#!/usr/bin/python3
"""Per layer and pass, every conv kernel candidate's time on the real shapes: one engine_bench run
with kernel selection by measurement (each supported candidate of each pass timed on the pass's
real descs, no cache) and the fp32 FMA peak measured in the same process. Prints a markdown table:
layer, pass, candidate, ms, effective GFLOP/s (the direct convolution's flops / time), fraction of
the FMA peak, and with --accuracy the error of the path against a double reference
(conv_accuracy, batch 1: max |path - reference| / max |reference|).

    /usr/bin/python3 bench/engine/conv_pass_table.py [--bench build/bench/engine/engine_bench]
        [--model sc18] [--mode train] [--batch 4] [--accuracy]
"""
import argparse
import json
import os
import re
import subprocess
import sys

CHOICE = re.compile(r"kernel choice (conv\d+)\.(\w+) \((?:timed|cached timings)\): (.*) -> (\w+)")
# conv_accuracy's path names -> candidate names
ACC_PATHS = {"oneDNN fp32": "onednn", "FFT-tiled fp32": "fft", "Winograd fp32": "winograd"}
ACC_PASS = {"fwd": 0, "bwd_data": 1, "bwd_weights": 2}


def engine(args):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    cmd = [args.bench, "--model", args.model, "--mode", args.mode, "--precision", "fp32", "--batch",
           str(args.batch), "--iters", "1", "--warmup", "0", "--kernel-selection", "measure",
           "--kernel-cache", "none", "--fma-peak", "--profile"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("conv_pass_table: engine_bench failed: " + p.stderr[-500:])
    peak = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])["fma_peak_gflops"]
    gflop, choices = {}, []
    for line in p.stderr.splitlines():
        m = CHOICE.search(line)
        if m:
            times = re.findall(r"(\w+) ([0-9.]+) ms", m.group(3))
            choices.append((m.group(1), m.group(2), [(k, float(t)) for k, t in times], m.group(4)))
        m = re.match(r"\| (conv\d+)[+|\s]", line)
        if m:  # profile row: forward ms and GFLOP/s give the layer's direct flops
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            gflop[m.group(1)] = float(cells[1]) * float(cells[2]) / 1e3
    return peak, gflop, choices


def accuracy(args, layers):
    bench = os.path.join(os.path.dirname(args.bench), "conv_accuracy")
    p = subprocess.run([bench, "--model", args.model, "--layers", ",".join(layers)], capture_output=True, text=True)
    errors = {}
    for line in p.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[2] in ACC_PATHS:
            errors[(cells[0], ACC_PATHS[cells[2]])] = cells[3:6]
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default="build/bench/engine/engine_bench")
    ap.add_argument("--model", default="sc18")
    ap.add_argument("--mode", default="train")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--accuracy", action="store_true")
    args = ap.parse_args()
    peak, gflop, choices = engine(args)
    tiled = sorted({c[0] for c in choices if any(k in ("winograd", "fft") for k, _ in c[2])})
    errors = accuracy(args, tiled) if args.accuracy and tiled else {}
    print("fp32 FMA peak (same process): %.0f GFLOP/s" % peak)
    print()
    print("| layer | pass | candidate | ms | effective GFLOP/s | / FMA peak | error | chosen |")
    print("|---|---|---|---|---|---|---|---|")
    for layer, pas, times, chosen in choices:
        for kernel, ms in times:
            rate = gflop.get(layer, 0) / (ms / 1e3) if ms > 0 else 0
            err = errors.get((layer, kernel))
            print("| %s | %s | %s | %.1f | %.0f | %.2f | %s | %s |" % (
                layer, pas, kernel, ms, rate, rate / peak, err[ACC_PASS[pas]] if err else "",
                "yes" if kernel == chosen else ""))


if __name__ == "__main__":
    main()
