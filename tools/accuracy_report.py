#!/usr/bin/python3
"""Accuracy table and plots: the network against the trivial predictor and the P(k) baseline.

Inputs are CSV files with columns index, true_<param>..., pred_<param>... on the same test set
(the network's predictions, optionally the same averaged over the cube's symmetries, and
tools/pk_baseline.py's). The trivial predictor always answers the
mean of the training labels (--train-mean, or the mean of the test labels if not given).
Writes <out>/accuracy.md (table), <out>/accuracy.json and <out>/pred_vs_true.png (one panel per
parameter, network (its symmetry mean if given) and baseline, with the diagonal). Exits 1 with one line if an input is unusable.

Usage: accuracy_report.py --network net.csv [--network-sym net_sym48.csv] --baseline pk.csv --train-mean "0.3,0.865,0.95" --out DIR
"""
import argparse
import csv
import json
import os
import sys

import numpy as np


def read(path):
    if not os.path.exists(path):
        sys.exit(f"accuracy_report.py: {path}: no such file")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"accuracy_report.py: {path}: no rows")
    names = [k[5:] for k in rows[0] if k.startswith("true_")]
    true = np.array([[float(r["true_" + n]) for n in names] for r in rows])
    pred = np.array([[float(r["pred_" + n]) for n in names] for r in rows])
    return names, true, pred


def metrics(true, pred):
    err = pred - true
    return {"rms": np.sqrt((err ** 2).mean(0)).tolist(),
            "mean_rel": (np.abs(err) / np.abs(true)).mean(0).tolist(),
            "mae": np.abs(err).mean(0).tolist()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", required=True)
    ap.add_argument("--network-sym", help="the network's predictions averaged over the cube's symmetries")
    ap.add_argument("--baseline")
    ap.add_argument("--train-mean")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    names, true, net = read(args.network)
    results = {"network": metrics(true, net)}

    def other(path, what):
        """Predictions from another CSV, which must cover the same test cubes as the network's."""
        if not path:
            return None
        onames, otrue, pred = read(path)
        if onames != names or otrue.shape != true.shape or not np.allclose(otrue, true, rtol=1e-4):
            sys.exit(f"accuracy_report.py: the network and {what} CSVs are not on the same test set")
        return pred

    base = other(args.baseline, "baseline")
    if base is not None:
        results["pk_baseline"] = metrics(true, base)
    sym = other(args.network_sym, "symmetry-averaged")
    if sym is not None:
        results["network_sym"] = metrics(true, sym)
    mean = (np.array([float(v) for v in args.train_mean.split(",")]) if args.train_mean else true.mean(0))
    if len(mean) != len(names):
        sys.exit(f"accuracy_report.py: --train-mean has {len(mean)} values for {len(names)} parameters")
    results["trivial"] = metrics(true, np.tile(mean, (len(true), 1)))
    results["params"] = names
    results["test_samples"] = len(true)
    with open(os.path.join(args.out, "accuracy.json"), "w") as f:
        json.dump(results, f, indent=1)

    lines = [f"Test set: {len(true)} cubes.", "",
             "| parameter | predictor | RMS error | mean relative error | RMS / trivial RMS |",
             "|---|---|---|---|---|"]
    for j, n in enumerate(names):
        for who in ["network", "network_sym", "pk_baseline", "trivial"]:
            if who not in results:
                continue
            m = results[who]
            ratio = m["rms"][j] / results["trivial"]["rms"][j]
            lines.append(f"| {n} | {who} | {m['rms'][j]:.4f} | {100 * m['mean_rel'][j]:.2f}% | {ratio:.3f} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "accuracy.md"), "w") as f:
        f.write(table)
    print(table)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4.2))
    for j, n in enumerate(names):
        ax = axes[j] if len(names) > 1 else axes
        lo, hi = true[:, j].min(), true[:, j].max()
        pad = 0.05 * (hi - lo)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=1, label="truth")
        if base is not None:
            ax.scatter(true[:, j], base[:, j], s=6, alpha=0.5, c="tab:orange",
                       label=f"P(k) baseline (RMS {results['pk_baseline']['rms'][j]:.4f})")
        # The symmetry average when there is one (the better network estimate), else the plain one.
        shown, key, label = (sym, "network_sym", "network, symmetry mean") if sym is not None else \
            (net, "network", "network")
        ax.scatter(true[:, j], shown[:, j], s=6, alpha=0.6, c="tab:blue",
                   label=f"{label} (RMS {results[key]['rms'][j]:.4f})")
        ax.set_xlabel(f"true {n}")
        ax.set_ylabel(f"predicted {n}")
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
        ax.legend(fontsize=7, loc="upper left")
        ax.set_title(n)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "pred_vs_true.png"), dpi=110)
    print(f"accuracy_report.py: wrote {args.out}/accuracy.md, accuracy.json, pred_vs_true.png", file=sys.stderr)


if __name__ == "__main__":
    main()
