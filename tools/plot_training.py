#!/usr/bin/python3
"""Plots a cosmoflow-train run: loss curves and predicted-vs-true scatter per parameter.

    /usr/bin/python3 tools/plot_training.py RUN_DIR [--out DIR]

Reads RUN_DIR/train_log.csv (the run log, see trainer/run_log.h) and RUN_DIR/val_predictions.csv
(written after each validation) and writes PNG files into --out (default RUN_DIR):
  loss_curves.png     training loss (per progress point) and validation loss vs step; validation MAE
                      and mean relative error per parameter on a second panel
  pred_vs_true.png    one panel per parameter: predicted vs true value (physical units), with the
                      identity line and the mean relative error
A requeued run appends to its log, so rows repeat for the same (kind, step): the last one wins.
Exits non-zero with one line on stderr when the files are missing or malformed.
"""
import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def fail(message):
    print(f"plot_training.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def read_csv(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    if not rows:
        fail(f"{path}: no rows")
    return rows


def number(row, key, path):
    value = row.get(key)
    if value is None:
        fail(f"{path}: missing column '{key}'")
    if value == "":
        return None
    try:
        return float(value)
    except ValueError:
        fail(f"{path}: column '{key}' has non-numeric value '{value}'")


def load_log(path):
    rows = read_csv(path)
    latest = {}
    for row in rows:
        kind = row.get("kind")
        if kind not in ("train", "val"):
            fail(f"{path}: unknown row kind '{kind}'")
        latest[(kind, int(number(row, "step", path)))] = row
    params = [c[len("rel_err_"):] for c in rows[0].keys() if c.startswith("rel_err_")]
    train = sorted((s, number(r, "loss", path)) for (k, s), r in latest.items() if k == "train")
    val = sorted(
        (s, number(r, "loss", path), number(r, "mae", path), [number(r, "rel_err_" + p, path) for p in params])
        for (k, s), r in latest.items()
        if k == "val"
    )
    return params, train, val


def plot_losses(params, train, val, out):
    fig, axes = plt.subplots(1, 2 if val else 1, figsize=(12 if val else 6, 4.5), squeeze=False)
    ax = axes[0][0]
    ax.plot([s for s, _ in train], [l for _, l in train], label="train loss (MSE)", lw=1)
    if val:
        ax.plot([v[0] for v in val], [v[1] for v in val], "o-", label="validation loss (MSE)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss on normalised labels")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    if val:
        ax = axes[0][1]
        ax.plot([v[0] for v in val], [v[2] for v in val], "o-", label="MAE (normalised)")
        for i, p in enumerate(params):
            ax.plot([v[0] for v in val], [v[3][i] for v in val], "s--", label=f"mean rel. error {p}")
        ax.set_xlabel("step")
        ax.set_ylabel("validation error")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_predictions(path, out):
    rows = read_csv(path)
    names = [c[len("true_"):] for c in rows[0].keys() if c.startswith("true_")]
    if not names:
        fail(f"{path}: no true_<parameter> columns")
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 4.3), squeeze=False)
    for i, name in enumerate(names):
        true = [number(r, "true_" + name, path) for r in rows]
        pred = [number(r, "pred_" + name, path) for r in rows]
        rel = sum(abs(p - t) / max(abs(t), 1e-12) for p, t in zip(pred, true)) / len(true)
        ax = axes[0][i]
        ax.scatter(true, pred, s=12, alpha=0.7)
        lo, hi = min(true + pred), max(true + pred)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="predicted = true")
        ax.set_title(f"{name}: mean relative error {100 * rel:.2f}%")
        ax.set_xlabel(f"true {name}")
        ax.set_ylabel(f"predicted {name}")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return len(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", help="directory for the PNG files (default: RUN_DIR)")
    args = parser.parse_args()
    out = args.out or args.run_dir
    os.makedirs(out, exist_ok=True)
    params, train, val = load_log(os.path.join(args.run_dir, "train_log.csv"))
    if not train:
        fail(f"{args.run_dir}/train_log.csv: no training rows")
    plot_losses(params, train, val, os.path.join(out, "loss_curves.png"))
    written = [os.path.join(out, "loss_curves.png")]
    predictions = os.path.join(args.run_dir, "val_predictions.csv")
    if os.path.exists(predictions):
        n = plot_predictions(predictions, os.path.join(out, "pred_vs_true.png"))
        written.append(os.path.join(out, "pred_vs_true.png") + f" ({n} cubes)")
    for w in written:
        print(w)


if __name__ == "__main__":
    main()
