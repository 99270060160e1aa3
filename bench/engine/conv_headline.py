#!/usr/bin/python3
"""The fast-convolution headline: sc18's two 4^3 convs (conv1, conv2) at batch 4, all three passes
together, as an effective rate (direct-equivalent flops / time) against the fp32 FMA peak measured
in the same engine_bench process (--fma-peak), for each path: the direct fp32 kernels the rule took
before Winograd (oneDNN's, and the transposed backward-data of conv1; forced), the rule's fp32
choice (Winograd in every pass of both convs), the FFT-tiled kernel forced, and bf16 (AMX or
AVX512-BF16 where the CPU has them). Prints a markdown table, one row per path; median step of --iters.

    /usr/bin/python3 bench/engine/conv_headline.py [--bench build/bench/engine/engine_bench] [--iters 3]
"""
import argparse
import json
import os
import subprocess
import sys

def forced(algo):
    return ",".join("conv%d.%s=%s" % (i, p, algo) for i in (1, 2) for p in ("fwd", "bwd_data", "bwd_weights"))


DIRECT = forced("onednn").replace("conv1.bwd_data=onednn", "conv1.bwd_data=transposed")
PATHS = [("direct fp32 (forced)", {"COSMOFLOW_KERNELS": DIRECT}, "fp32"),
         ("fp32 (rule: Winograd)", {}, "fp32"),
         ("FFT-tiled fp32 (forced)", {"COSMOFLOW_KERNELS": forced("fft")}, "fp32"),
         ("bf16 (rule)", {}, "bf16")]


def run(bench, env_extra, precision, iters):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), **env_extra)
    cmd = [bench, "--model", "sc18", "--mode", "train", "--precision", precision, "--batch", "4",
           "--iters", str(iters), "--warmup", "1", "--fma-peak", "--profile"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    result = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
    ms = gflop = 0.0
    kernels = []
    for line in p.stderr.splitlines():
        if line.startswith("| conv1+") or line.startswith("| conv2+"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            fwd_ms, fwd_rate, bwd_ms, bwd_rate = map(float, cells[1:5])
            ms += fwd_ms + bwd_ms
            gflop += (fwd_ms * fwd_rate + bwd_ms * bwd_rate) / 1e3
            kernels.append(cells[7])
    return ms, gflop / (ms / 1e3), result["fma_peak_gflops"], kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default="build/bench/engine/engine_bench")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    print("| path | conv1 + conv2, 3 passes, ms | effective GFLOP/s | fp32 FMA peak GFLOP/s | effective / peak |")
    print("|---|---|---|---|---|")
    for name, env, precision in PATHS:
        r = run(args.bench, env, precision, args.iters)
        if r is None:
            print("| %s | not run (engine_bench failed: %s not supported here?) | | | |" % (name, precision))
            continue
        ms, rate, peak, kernels = r
        print("| %s | %.0f | %.0f | %.0f | %.2fx |" % (name, ms, rate, peak, rate / peak))
        for k in kernels:
            print("    " + k, file=sys.stderr)


if __name__ == "__main__":
    main()
