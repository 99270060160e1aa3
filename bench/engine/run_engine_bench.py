#!/usr/bin/python3
"""Engine benchmark: our oneDNN network vs the PyTorch peer, same cores, same run, alternating.

    /usr/bin/python3 bench/engine/run_engine_bench.py --bench build/bench/engine/engine_bench \
        [--models sc18,mlperf] [--rounds 1] [--iters 3] [--threads 2] [--markdown out.md]

For every model and mode (train fp32, train bf16, infer bf16 batch 1, infer bf16 batch 4,
infer fp32 batch 4) it runs engine_bench and then the peer (../shared/peers/torch_cosmoflow.py with
tcmalloc preloaded, as its header asks), `rounds` times alternating, and prints the median
samples/s, GFLOP/s, peak RSS and the ratio ours/peer. Without ../shared/peers the peer is skipped
and the table says so. Each process is a fresh run (warm-up steps excluded from the timing).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PEER = os.path.normpath(os.path.join(ROOT, "..", "shared", "peers", "torch_cosmoflow.py"))
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

MODES = [  # (mode, precision, batch)
    ("train", "fp32", 4),
    ("train", "bf16", 4),
    ("infer", "bf16", 1),
    ("infer", "bf16", 4),
    ("infer", "fp32", 1),
    ("infer", "fp32", 4),
]


def run_json(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write("failed: %s\n%s\n" % (" ".join(cmd), out.stderr[-2000:]))
        return None
    for line in reversed(out.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "engine", "engine_bench"))
    ap.add_argument("--models", default="sc18,mlperf")
    ap.add_argument("--modes", default="", help="subset, e.g. train-fp32-4,infer-bf16-1")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", default="")
    args = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    peer_env = dict(env)
    if os.path.exists(TCMALLOC):
        peer_env["LD_PRELOAD"] = TCMALLOC
    have_peer = os.path.exists(PEER)
    if not have_peer:
        print("NOTE: %s is absent: the peer is skipped, no ratios." % PEER)

    modes = MODES
    if args.modes:
        want = set(args.modes.split(","))
        modes = [m for m in MODES if "%s-%s-%d" % m in want]
        unknown = want - {"%s-%s-%d" % m for m in MODES}
        if unknown:
            sys.exit("run_engine_bench.py: unknown mode(s) %s; known: %s"
                     % (",".join(sorted(unknown)), ",".join("%s-%s-%d" % m for m in MODES)))
    rows = []
    for model in args.models.split(","):
        for mode, prec, batch in modes:
            ours, peer = [], []
            for _ in range(args.rounds):
                r = run_json([args.bench, "--model", model, "--mode", mode, "--precision", prec, "--batch",
                              str(batch), "--iters", str(args.iters), "--warmup", str(args.warmup)], env)
                if r:
                    ours.append(r)
                if have_peer:
                    p = run_json(["/usr/bin/python3", PEER, "--model", model, "--mode", mode, "--precision", prec,
                                  "--batch", str(batch), "--threads", str(args.threads), "--iters", str(args.iters),
                                  "--warmup", str(args.warmup)], peer_env)
                    if p:
                        peer.append(p)

            def med(rs, key):
                return statistics.median([r[key] for r in rs]) if rs else float("nan")

            row = {
                "model": model, "mode": mode, "precision": prec, "batch": batch,
                "ours_sps": med(ours, "samples_per_s"), "ours_gflops": med(ours, "gflops"),
                "ours_rss": med(ours, "peak_rss_mib"),
                "peer_sps": med(peer, "samples_per_s"), "peer_gflops": med(peer, "gflops"),
                "peer_rss": med(peer, "peak_rss_mib"),
            }
            row["ratio"] = row["ours_sps"] / row["peer_sps"] if peer else float("nan")
            row["rss_ratio"] = row["ours_rss"] / row["peer_rss"] if peer else float("nan")
            rows.append(row)
            print(json.dumps(row), flush=True)

    header = ("| model | mode | batch | ours samples/s | ours GFLOP/s | ours peak RSS MiB | peer samples/s | "
              "peer GFLOP/s | peer peak RSS MiB | speed ours/peer | RSS ours/peer |")
    lines = [header, "|" + "---|" * 11]
    for r in rows:
        lines.append("| %s | %s %s | %d | %.2f | %.0f | %.0f | %.2f | %.0f | %.0f | %.2fx | %.2f |" % (
            r["model"], r["mode"], r["precision"], r["batch"], r["ours_sps"], r["ours_gflops"], r["ours_rss"],
            r["peer_sps"], r["peer_gflops"], r["peer_rss"], r["ratio"], r["rss_ratio"]))
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
