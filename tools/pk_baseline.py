#!/usr/bin/python3
"""Classical baseline for the accuracy study: parameters from the cube's measured power spectrum.

For every cube and every channel (one per redshift): overdensity delta = n / mean(n) - 1, its power
spectrum P(k) = <|delta_k|^2> V / N^2 in logarithmic k bins (NGP window not deconvolved: the same
for every cube, so it cancels in a regression), plus log(var n) and the fraction of empty voxels. A ridge
regression from these features (log P per bin, standardised) to each physical parameter is fitted on
the training set, with the ridge strength chosen per parameter by 5-fold cross-validation, and applied
to the test set. This is "a regression on binned P(k)": the information a two-point statistic
carries, which is what the network has to beat.

One strength per parameter, because the parameters' errors differ by orders of magnitude (H0 in
km/s/Mpc against Omega_M): a joint choice follows the parameter with the largest squared error and
over-regularises the others. Training cubes with identical labels (the same universe evolved twice,
fullres_study.sh TRAIN_TWIN_ARGS) share a fold, so that no cube is validated against its own twin.

With --cross the features also hold the cross-spectra of every pair of channels, as the correlation
coefficient r_ij(k) = Re<delta_i delta_j*> / sqrt(P_i P_j) per k bin: the auto-spectra measure how much
structure each redshift has, r_ij(k) how far nonlinear evolution has decorrelated the field between
two redshifts (1 on linear scales, falling on small ones), which depends on the growth and so on
Omega_M and sigma_8. Without --cross the features, fit and output are those of the plain baseline.

Usage: pk_baseline.py --train DIR_OR_H5 --test DIR_OR_H5 [DIR_OR_H5...] --out predictions.csv [CSV...]
                      [--bins 12] [--cross] [--taper F] [--workers N] [--lambda X]
       pk_baseline.py --model FIT.npz --test ... --out ...     (a fit saved with --save-model FIT.npz)
Several test sets (one --out each) share one fit; a saved fit carries its --bins, --cross and --taper.
--taper F windows every channel before its FFT (for cubes whose faces do not join: pieces of a
larger box, like the real MLPerf cubes); 0, the default, is the plain periodic-box spectrum.
Writes CSV rows: index, true_<param>..., pred_<param>...
"""
import argparse
import functools
import glob
import multiprocessing
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cosmo_stats as cs  # noqa: E402


def shards(path):
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.h5")))
        if not files:
            sys.exit(f"pk_baseline.py: {path}: no .h5 shards")
        return files
    if not os.path.exists(path):
        sys.exit(f"pk_baseline.py: {path}: no such file or directory")
    return [path]


@functools.lru_cache(maxsize=4)
def k_bins(side, nbins):
    """Bin index of every rfftn mode of a side^3 cube (-1 or nbins: outside every bin) and the
    number of modes per bin. Bins are logarithmic from the fundamental mode to the Nyquist frequency."""
    kx = np.fft.fftfreq(side) * side
    kz = np.fft.rfftfreq(side) * side
    kk = np.sqrt(kx[:, None, None] ** 2 + kx[None, :, None] ** 2 + kz[None, None, :] ** 2)
    edges = np.logspace(0, np.log10(side / 2), nbins + 1)
    which = np.digitize(kk.ravel(), edges) - 1
    good = (which >= 0) & (which < nbins)
    return which[good], good, np.bincount(which[good], minlength=nbins)


def binned(values, side, nbins):
    which, good, counts = k_bins(side, nbins)
    return np.bincount(which, weights=values.ravel()[good], minlength=nbins) / np.maximum(counts, 1)


def channel_fft(n, taper=0.0):
    """delta = n / mean(n) - 1 of one channel, Fourier transformed (rfftn); with taper > 0 times a
    3-D Tukey window over that fraction of each axis (cosmo_stats.windowed, power kept), so that a
    cube whose faces do not join (a piece of a larger box) has no step at its edges."""
    n = n.astype(np.float64)
    delta = n / n.mean() - 1.0
    return np.fft.rfftn(cs.windowed(delta, taper) if taper > 0 else delta)


def channel_features(n, nbins, dk=None):
    """Binned log P(k) of one channel, plus its log variance and empty fraction."""
    n = n.astype(np.float64)
    side = n.shape[0]
    dk = channel_fft(n) if dk is None else dk
    p = (np.abs(dk) ** 2) / n.size  # in units of voxel volume (box side in voxels)
    pk = binned(p, side, nbins)
    return np.concatenate([np.log(pk + 1e-12), [np.log(n.var() + 1e-12), (n == 0).mean()]])


def cross_features(dks, side, nbins):
    """r_ij(k) = Re<dk_i conj(dk_j)> / sqrt(P_i P_j) per bin for every pair i < j of channels."""
    auto = [binned(np.abs(d) ** 2, side, nbins) for d in dks]
    out = []
    for i in range(len(dks)):
        for j in range(i + 1, len(dks)):
            c = binned((dks[i] * np.conj(dks[j])).real, side, nbins)
            out.append(c / np.sqrt(np.maximum(auto[i] * auto[j], 1e-300)))
    return np.concatenate(out) if out else np.zeros(0)


def power_features(cube, nbins, cross=False, taper=0.0):
    """The features of every channel (redshift), side by side: with several redshifts of the same
    initial field, differences of log P(k) between channels measure the growth of structure (which
    depends on Omega_M) nearly free of sample variance, and a linear model can form them. With
    cross, the cross-correlation coefficients of every pair of channels follow."""
    dks = [channel_fft(c, taper) for c in cube]
    feats = [channel_features(c, nbins, dk) for c, dk in zip(cube, dks)]
    if cross:
        feats.append(cross_features(dks, cube.shape[-1], nbins))
    return np.concatenate(feats)


def _shard_features(job):
    f, nbins, cross, taper = job
    with h5py.File(f, "r") as h:
        names = [s.decode() if isinstance(s, bytes) else s for s in h.attrs["param_names"]]
        cubes = h["cubes"]
        feats = [power_features(cubes[i], nbins, cross, taper) for i in range(cubes.shape[0])]
        return feats, h["params"][:], names


def load(path, nbins, cross=False, workers=1, taper=0.0):
    jobs = [(f, nbins, cross, taper) for f in shards(path)]
    if workers > 1 and len(jobs) > 1:
        with multiprocessing.Pool(min(workers, len(jobs))) as pool:
            parts = pool.map(_shard_features, jobs)
    else:
        parts = [_shard_features(j) for j in jobs]
    feats = [x for p in parts for x in p[0]]
    return np.array(feats), np.concatenate([p[1] for p in parts]), parts[-1][2]


def ridge_fit(x, y, lam):
    a = x.T @ x + lam * np.eye(x.shape[1])
    a[0, 0] -= lam  # do not penalise the intercept
    return np.linalg.solve(a, x.T @ y)


LAMBDAS = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1, 10, 100, 1000]


def cv_folds(y, k=5):
    """Fold of each training row: rows with identical labels share one; groups dealt round-robin in
    order of first appearance (so a set without repeated labels gets row i % k)."""
    first = {}
    return np.array([first.setdefault(tuple(row), len(first)) for row in y]) % k


def fit_per_parameter(d, y, k=5):
    """Ridge weights (one column per parameter) and each parameter's strength from LAMBDAS, chosen by
    k-fold cross-validation (squared error of that parameter alone)."""
    folds = cv_folds(y, k)
    err = np.zeros((len(LAMBDAS), y.shape[1]))
    for i, lam in enumerate(LAMBDAS):
        for f in range(k):
            w = ridge_fit(d[folds != f], y[folds != f], lam)
            err[i] += ((d[folds == f] @ w - y[folds == f]) ** 2).sum(0)
    lams = [LAMBDAS[i] for i in err.argmin(0)]
    w = np.stack([ridge_fit(d, y[:, j], lam) for j, lam in enumerate(lams)], axis=1)
    return w, lams


def design(x, mu, sd):
    z = (x - mu) / sd
    return np.hstack([np.ones((z.shape[0], 1)), z])


def fit_model(args):
    """The ridge fit on --train: feature scaling, weights and each parameter's strength."""
    xtr, ytr, names = load(args.train, args.bins, args.cross, args.workers, args.taper)
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-12
    dtr = design(xtr, mu, sd)
    if args.lam is None:
        w, lams = fit_per_parameter(dtr, ytr)
    else:
        w, lams = ridge_fit(dtr, ytr, args.lam), [args.lam] * ytr.shape[1]
    return dict(mu=mu, sd=sd, w=w, lams=list(lams), names=list(names), bins=args.bins,
                cross=bool(args.cross), taper=float(args.taper), n_train=len(xtr))


def save_model(path, fit):
    tmp = path + ".tmp.npz"  # np.savez adds .npz; rename keeps a half-written file from being read
    np.savez(tmp, **{k: np.asarray(v) for k, v in fit.items()})
    os.replace(tmp, path)


def load_model(path):
    try:
        with np.load(path) as z:
            fit = {k: z[k] for k in z.files}
        return dict(mu=fit["mu"], sd=fit["sd"], w=fit["w"], lams=[float(v) for v in fit["lams"]],
                    names=[str(n) for n in fit["names"]], bins=int(fit["bins"]), cross=bool(fit["cross"]),
                    taper=float(fit["taper"]) if "taper" in fit else 0.0, n_train=int(fit["n_train"]))
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"pk_baseline.py: --model {path}: not a saved fit ({e})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", help="the training set (the fit); or --model")
    ap.add_argument("--model", help="a fit saved by --save-model, instead of --train")
    ap.add_argument("--save-model", help="write the fit (.npz) for later --model runs")
    ap.add_argument("--test", required=True, nargs="+")
    ap.add_argument("--out", required=True, nargs="+")
    ap.add_argument("--bins", type=int, default=12)
    ap.add_argument("--taper", type=float, default=0.0,
                    help="window each channel (Tukey, this fraction of each axis) before its FFT: for pieces")
    ap.add_argument("--cross", action="store_true",
                    help="add the cross-correlation coefficient r_ij(k) of every pair of channels")
    ap.add_argument("--workers", type=int, default=1, help="processes computing features (one shard each)")
    ap.add_argument("--lambda", dest="lam", type=float, default=None,
                    help="one fixed ridge strength for every parameter instead of the cross-validated ones")
    args = ap.parse_args()
    if len(args.test) != len(args.out):
        sys.exit(f"pk_baseline.py: {len(args.test)} --test sets but {len(args.out)} --out files")
    if not 0 <= args.taper < 1:
        sys.exit(f"pk_baseline.py: --taper {args.taper:g}: expected a fraction in [0, 1)")
    if args.lam is not None and not args.lam >= 0:
        sys.exit(f"pk_baseline.py: --lambda {args.lam:g}: expected a strength >= 0")

    if (args.train is None) == (args.model is None):
        sys.exit("pk_baseline.py: give either --train (fit) or --model (a saved fit)")
    fit = fit_model(args) if args.train else load_model(args.model)
    if args.save_model:
        save_model(args.save_model, fit)
    mu, sd, w, lams, names = fit["mu"], fit["sd"], fit["w"], fit["lams"], fit["names"]
    # The test spectra are measured as the fit's were, whatever the command line says.
    for test, out_path in zip(args.test, args.out):
        xte, yte, tnames = load(test, fit["bins"], fit["cross"], args.workers, fit["taper"])
        if tnames != names:
            sys.exit(f"pk_baseline.py: {test}: parameters {tnames}, the training set has {names}")
        pred = design(xte, mu, sd) @ w
        with open(out_path, "w") as out:
            out.write("index," + ",".join(f"true_{n}" for n in names) + "," +
                      ",".join(f"pred_{n}" for n in names) + "\n")
            for i, (t, p) in enumerate(zip(yte, pred)):
                out.write(f"{i}," + ",".join(f"{v:.6g}" for v in t) + "," + ",".join(f"{v:.6g}" for v in p) + "\n")
        print(f"pk_baseline.py: {fit['n_train']} train / {len(xte)} test cubes, {fit['bins']} k bins"
              f"{', cross-spectra' if fit['cross'] else ''}, {len(mu)} features, ridge lambda "
              f"{', '.join(f'{n} {lam:g}' for n, lam in zip(names, lams))}"
              f" -> {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
