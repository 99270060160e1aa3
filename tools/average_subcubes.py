#!/usr/bin/env python3
"""Averages per-sub-cube predictions over each universe (the parent cube of cosmoflow-subcubes).

    /usr/bin/python3 tools/average_subcubes.py --pred PRED.csv --data SUBCUBES(.h5|DIR) --out UNIVERSES.csv
        [--combine conservative|independent|rho:R|fit:VAL.csv,VAL_DATA]

PRED.csv has one row per sub-cube in dataset order (as the accuracy study's client writes them):
true_<p>, pred_<p> and optionally sigma_<p> and cov_<a>_<b>. The group of each row is read from
the dataset's /sample/group (sorted shard order, as Dataset::Open reads a directory). The output
has one row per universe, in the order groups first appear: group, subcubes, true_<p>, pred_<p>,
spread_<p> (std of the sub-cube predictions / sqrt(M): a diagnostic, not an error bar) and, when
the input has them, sigma_<p> and cov_<a>_<b> of the averaged prediction.

The average is the plain mean of the M sub-cube predictions. Not inverse-variance weighting:
the errors of sub-cubes of one universe are correlated (they share its modes larger than a
sub-cube and its parameters), so 1/sigma^2 weights, optimal only for independent errors, would
lean on the sub-cubes the network is most confident about without reducing the shared error;
equal weights are unbiased whatever the correlation.

Its covariance, Var(mean) = (1/M^2) sum_ij Cov(e_i, e_j), needs the correlations between
sub-cube errors, which the network does not predict. --combine chooses:
- conservative (default): Cbar = (1/M) sum_i C_i. An upper bound for any correlations: in every
  direction v, sd(v.mean) <= mean_i sd(v.e_i) (triangle inequality) <= sqrt(mean_i v'C_i v)
  (Jensen), so the error bar is never too small; it is what one sub-cube's error would be.
- independent: Cbar / M, the lower bound (uncorrelated errors). Too small for real sub-cubes.
- rho:R: one correlation R between any two sub-cubes' errors: ((1 - R) / M + R) Cbar.
- fit:VAL.csv,VAL_DATA: R fitted on held-out validation universes (never the test set) so that
  the mean squared standardised error of the averaged predictions is one; the fitted R is printed
  and recorded in the output's `combine` column.
Exit status: 0 done, 1 bad input (one line on stderr), 2 bad usage.
"""
import argparse
import csv
import glob
import os
import sys

import h5py
import numpy as np


class Failure(Exception):
    pass


def read_predictions(path):
    """names, true (N, P), pred (N, P), cov (N, P, P) or None."""
    if not os.path.exists(path):
        raise Failure(f"{path}: no such file")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise Failure(f"{path}: no rows")
    names = [k[5:] for k in rows[0] if k.startswith("true_")]
    if not names or any("pred_" + n not in rows[0] for n in names):
        raise Failure(f"{path}: need true_<p> and pred_<p> columns")
    true = np.array([[float(r["true_" + n]) for n in names] for r in rows])
    pred = np.array([[float(r["pred_" + n]) for n in names] for r in rows])
    p = len(names)
    cov = None
    if all(f"cov_{a}_{b}" in rows[0] for i, a in enumerate(names) for b in names[i:]):
        cov = np.zeros((len(rows), p, p))
        for i, a in enumerate(names):
            for j in range(i, p):
                cov[:, i, j] = cov[:, j, i] = [float(r[f"cov_{a}_{names[j]}"]) for r in rows]
    elif all("sigma_" + n in rows[0] for n in names):
        sig = np.array([[float(r["sigma_" + n]) for n in names] for r in rows])
        cov = np.zeros((len(rows), p, p))
        cov[:, np.arange(p), np.arange(p)] = sig ** 2
    if cov is not None and (not np.all(np.isfinite(cov)) or np.any(np.diagonal(cov, axis1=1, axis2=2) <= 0)):
        raise Failure(f"{path}: a covariance is not finite or has a variance <= 0")
    return names, true, pred, cov


def read_groups(data):
    """/sample/group of every sub-cube, in the order Dataset::Open reads them."""
    files = sorted(glob.glob(os.path.join(data, "*.h5"))) if os.path.isdir(data) else [data]
    if not files or not all(os.path.exists(f) for f in files):
        raise Failure(f"{data}: no such shard or directory of shards")
    groups = []
    for f in files:
        with h5py.File(f, "r") as h:
            if "sample/group" not in h:
                raise Failure(f"{f}: no /sample/group (cut it with cosmoflow-subcubes)")
            groups.append(h["sample/group"][:])
    return np.concatenate(groups).astype(np.int64)


def average(true, pred, cov, groups, path):
    """Per group: (group id, M, true, mean prediction, spread, mean covariance Cbar or None)."""
    if len(groups) != len(pred):
        raise Failure(f"{path}: {len(pred)} predictions for {len(groups)} sub-cubes in the dataset")
    order = list(dict.fromkeys(groups.tolist()))
    out = []
    for g in order:
        idx = np.flatnonzero(groups == g)
        t = true[idx]
        if np.any(np.abs(t - t[0]) > 1e-6 * np.maximum(1, np.abs(t[0]))):
            raise Failure(f"{path}: sub-cubes of group {g} have different true labels (wrong group ids?)")
        m = len(idx)
        spread = pred[idx].std(axis=0, ddof=1) / np.sqrt(m) if m > 1 else np.zeros(pred.shape[1])
        cbar = cov[idx].mean(axis=0) if cov is not None else None
        out.append((g, m, t[0], pred[idx].mean(axis=0), spread, cbar))
    return out


def scale(m, rho):
    """Var(mean) / Cbar for M sub-cubes with one pairwise error correlation rho."""
    return (1 - rho) / m + rho


def fit_rho(universes):
    """The rho that makes the mean squared standardised error of the averages one."""
    z2, inv_m = [], []
    for _, m, t, mean, _, cbar in universes:
        z2.append(np.mean((mean - t) ** 2 / np.diagonal(cbar)))
        inv_m.append(1.0 / m)
    # mean_u z2_u / scale(m_u, rho) = 1 with scale = 1/m + rho (1 - 1/m); equal M in practice:
    # solve with the mean M.
    s = float(np.mean(z2))
    im = float(np.mean(inv_m))
    return float(np.clip((s - im) / (1 - im), 0.0, 1.0)) if im < 1 else 0.0


def combine_factor(spec, universes_fit):
    if spec == "conservative":
        return lambda m: 1.0, None
    if spec == "independent":
        return lambda m: 1.0 / m, None
    if spec.startswith("rho:"):
        rho = float(spec[4:])
        if not 0 <= rho <= 1:
            raise Failure(f"--combine {spec}: rho must be in [0, 1]")
        return lambda m: scale(m, rho), rho
    if spec.startswith("fit:"):
        rho = fit_rho(universes_fit)
        return lambda m: scale(m, rho), rho
    raise Failure(f"--combine {spec}: not conservative, independent, rho:R or fit:VAL.csv,VAL_DATA")


def write(path, names, universes, factor, combine):
    p = len(names)
    has_cov = universes[0][5] is not None
    cols = ["group", "subcubes", "combine"] + [f"true_{n}" for n in names] + [f"pred_{n}" for n in names] + \
        [f"spread_{n}" for n in names]
    if has_cov:
        cols += [f"sigma_{n}" for n in names] + [f"cov_{a}_{names[j]}" for i, a in enumerate(names) for j in range(i, p)]
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for g, m, t, mean, spread, cbar in universes:
            row = [g, m, combine] + list(t) + list(mean) + list(spread)
            if has_cov:
                c = cbar * factor(m)
                row += list(np.sqrt(np.diagonal(c))) + [c[i, j] for i in range(p) for j in range(i, p)]
            w.writerow([f"{v:.9g}" if isinstance(v, float) else v for v in row])
    os.replace(path + ".tmp", path)


def main(argv):
    ap = argparse.ArgumentParser(description="average sub-cube predictions per universe")
    ap.add_argument("--pred", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--combine", default="conservative")
    a = ap.parse_args(argv)
    try:
        names, true, pred, cov = read_predictions(a.pred)
        universes = average(true, pred, cov, read_groups(a.data), a.pred)
        fit_set = None
        if a.combine.startswith("fit:"):
            if cov is None:
                raise Failure("--combine fit: the predictions carry no sigma or covariance")
            val_csv, _, val_data = a.combine[4:].partition(",")
            vn, vt, vp, vc = read_predictions(val_csv)
            if vc is None or vn != names:
                raise Failure(f"{val_csv}: needs the same parameters with sigma or covariance columns")
            fit_set = average(vt, vp, vc, read_groups(val_data), val_csv)
        factor, rho = combine_factor(a.combine, fit_set)
        combine = a.combine.split(":")[0] + (f" rho={rho:.4f}" if rho is not None else "")
        write(a.out, names, universes, factor, combine)
    except (Failure, OSError, ValueError, KeyError) as e:
        print(f"average_subcubes: {e}", file=sys.stderr)
        return 1
    if rho is not None:
        print(f"average_subcubes: rho = {rho:.4f}", file=sys.stderr)
    print(f"average_subcubes: {len(pred)} sub-cubes -> {len(universes)} universes: {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
