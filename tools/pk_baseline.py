#!/usr/bin/python3
"""Classical baseline for the accuracy study: parameters from the cube's measured power spectrum.

For every cube and every channel (one per redshift): overdensity delta = n / mean(n) - 1, its power
spectrum P(k) = <|delta_k|^2> V / N^2 in logarithmic k bins (NGP window not deconvolved: the same
for every cube, so it cancels in a regression), plus log(var n) and the fraction of empty voxels. A ridge
regression from these features (log P per bin, standardised) to each physical parameter is fitted on
the training set, with the ridge strength chosen by 5-fold cross-validation, and applied to the test
set. This is "a regression on binned P(k)": the information a two-point statistic carries, which is
what the network has to beat.

Usage: pk_baseline.py --train DIR_OR_H5 --test DIR_OR_H5 --out predictions.csv
Writes CSV rows: index, true_<param>..., pred_<param>...
"""
import argparse
import glob
import os
import sys

import h5py
import numpy as np


def shards(path):
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.h5")))
        if not files:
            sys.exit(f"pk_baseline.py: {path}: no .h5 shards")
        return files
    if not os.path.exists(path):
        sys.exit(f"pk_baseline.py: {path}: no such file or directory")
    return [path]


def channel_features(n, nbins):
    """Binned log P(k) of one channel, plus its log variance and empty fraction."""
    n = n.astype(np.float64)
    side = n.shape[0]
    mean = n.mean()
    delta = n / mean - 1.0
    dk = np.fft.rfftn(delta)
    p = (np.abs(dk) ** 2) / delta.size  # in units of voxel volume (box side in voxels)
    kx = np.fft.fftfreq(side) * side
    kz = np.fft.rfftfreq(side) * side
    kk = np.sqrt(kx[:, None, None] ** 2 + kx[None, :, None] ** 2 + kz[None, None, :] ** 2)
    # Bins from the fundamental mode to the Nyquist frequency, logarithmic.
    edges = np.logspace(0, np.log10(side / 2), nbins + 1)
    which = np.digitize(kk.ravel(), edges) - 1
    good = (which >= 0) & (which < nbins)
    sums = np.bincount(which[good], weights=p.ravel()[good], minlength=nbins)
    counts = np.bincount(which[good], minlength=nbins)
    pk = sums / np.maximum(counts, 1)
    return np.concatenate([np.log(pk + 1e-12), [np.log(n.var() + 1e-12), (n == 0).mean()]])


def power_features(cube, nbins):
    """The features of every channel (redshift), side by side: with several redshifts of the same
    initial field, differences of log P(k) between channels measure the growth of structure (which
    depends on Omega_M) nearly free of sample variance, and a linear model can form them."""
    return np.concatenate([channel_features(c, nbins) for c in cube])


def load(path, nbins):
    feats, params, names = [], [], None
    for f in shards(path):
        with h5py.File(f, "r") as h:
            names = [s.decode() if isinstance(s, bytes) else s for s in h.attrs["param_names"]]
            cubes = h["cubes"]
            for i in range(cubes.shape[0]):
                feats.append(power_features(cubes[i], nbins))
            params.append(h["params"][:])
    return np.array(feats), np.concatenate(params), names


def ridge_fit(x, y, lam):
    a = x.T @ x + lam * np.eye(x.shape[1])
    a[0, 0] -= lam  # do not penalise the intercept
    return np.linalg.solve(a, x.T @ y)


def design(x, mu, sd):
    z = (x - mu) / sd
    return np.hstack([np.ones((z.shape[0], 1)), z])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bins", type=int, default=12)
    args = ap.parse_args()

    xtr, ytr, names = load(args.train, args.bins)
    xte, yte, _ = load(args.test, args.bins)
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-12
    dtr, dte = design(xtr, mu, sd), design(xte, mu, sd)
    # Ridge strength by 5-fold cross-validation on the training set.
    folds = np.arange(len(dtr)) % 5
    best = None
    for lam in [1e-3, 1e-2, 1e-1, 1, 10, 100]:
        err = 0.0
        for f in range(5):
            w = ridge_fit(dtr[folds != f], ytr[folds != f], lam)
            err += ((dtr[folds == f] @ w - ytr[folds == f]) ** 2).sum()
        if best is None or err < best[0]:
            best = (err, lam)
    w = ridge_fit(dtr, ytr, best[1])
    pred = dte @ w
    with open(args.out, "w") as out:
        out.write("index," + ",".join(f"true_{n}" for n in names) + "," +
                  ",".join(f"pred_{n}" for n in names) + "\n")
        for i, (t, p) in enumerate(zip(yte, pred)):
            out.write(f"{i}," + ",".join(f"{v:.6g}" for v in t) + "," + ",".join(f"{v:.6g}" for v in p) + "\n")
    print(f"pk_baseline.py: {len(xtr)} train / {len(xte)} test cubes, {args.bins} k bins, ridge lambda {best[1]}"
          f" -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
