"""Summary statistics of particle-count cubes and the tests that compare one cube with an ensemble.

Used by tools/compare_real.py (real MLPerf cubes against synthetic ensembles at their own
parameters) and tested by tests/synth/cosmo_stats_test.py. numpy and scipy only (Debian's).

Conventions: a cube is a (n, n, n) array of counts on a box of side `box` Mpc/h; the density
contrast is delta = counts / mean - 1 (each cube relative to its own mean, as the real cubes, cut
from larger boxes, do not have a mean of exactly one). Power spectra follow synth/universe.h:
P(k) = |dV DFT(delta)|^2 / V in (Mpc/h)^3, shot noise included.
"""
import functools

import numpy as np
from scipy import fft, special, stats

FFT_WORKERS = 2  # scipy.fft threads; the machines here have 2 cores


def rfftn(x):
    """Single precision: ample for these statistics and twice as fast as numpy's double FFT."""
    return fft.rfftn(np.asarray(x, dtype=np.float32), workers=FFT_WORKERS)


def irfftn(x, shape):
    return fft.irfftn(x, s=shape, workers=FFT_WORKERS)


@functools.lru_cache(maxsize=8)
def wavenumbers(n, box):
    """|k| (h/Mpc) of the rfftn modes of an n^3 grid, and each mode's weight (2 for the modes whose
    mirror -k is not stored, 1 for the k_z = 0 and Nyquist planes)."""
    kf = 2 * np.pi / box
    kx = np.fft.fftfreq(n, 1.0 / n)
    kz = np.arange(n // 2 + 1)
    kk = np.sqrt(kx[:, None, None] ** 2 + kx[None, :, None] ** 2 + kz[None, None, :] ** 2) * kf
    weight = np.full(kz.shape, 2.0)
    weight[0] = 1
    if n % 2 == 0:
        weight[-1] = 1
    kk.setflags(write=False)
    return kk, np.broadcast_to(weight[None, None, :], kk.shape)


def log_k_edges(box, kmax, nbins):
    """nbins logarithmic k bins from 1.5 k_f (the first shell with several modes) to kmax."""
    kf = 2 * np.pi / box
    return np.geomspace(1.5 * kf, kmax, nbins + 1)


def power_spectrum(delta, box, edges, dk=None):
    """Binned P(k) of a real field on a periodic grid: (mean |k| per bin, P per bin, modes per bin),
    modes counted with their mirrors. Bins without modes give NaN. `dk` = rfftn(delta) if known."""
    n = delta.shape[0]
    if dk is None:
        dk = rfftn(delta)
    p = np.abs(dk).astype(np.float64) ** 2 * (box / n) ** 6 / box ** 3
    kk, w = wavenumbers(n, box)
    idx = np.digitize(kk.ravel(), edges) - 1
    ok = (idx >= 0) & (idx < len(edges) - 1)
    idx, wr = idx[ok], w.ravel()[ok]
    nb = len(edges) - 1
    modes = np.bincount(idx, weights=wr, minlength=nb)
    ksum = np.bincount(idx, weights=wr * kk.ravel()[ok], minlength=nb)
    psum = np.bincount(idx, weights=wr * p.ravel()[ok], minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        return ksum / modes, psum / modes, modes


def contrast(counts):
    counts = np.asarray(counts, dtype=np.float64)
    return counts / counts.mean() - 1.0


def tukey(n, fraction):
    """1-D Tukey (tapered cosine) window: flat in the middle, cosine over `fraction` of the length
    in all (half at each end); fraction 0 is no window."""
    if fraction <= 0:
        return np.ones(n)
    x = (np.arange(n) + 0.5) / n
    w = np.ones(n)
    edge = fraction / 2
    lo, hi = x < edge, x > 1 - edge
    w[lo] = 0.5 * (1 - np.cos(np.pi * x[lo] / edge))
    w[hi] = 0.5 * (1 - np.cos(np.pi * (1 - x[hi]) / edge))
    return w


def windowed(delta, fraction):
    """delta times a separable 3-D Tukey window, rescaled so that <w^2> = 1 (P(k) keeps its
    amplitude)."""
    if fraction <= 0:
        return delta
    w1 = tukey(delta.shape[0], fraction)
    w = w1[:, None, None] * w1[None, :, None] * w1[None, None, :]
    return delta * w / np.sqrt(np.mean(w ** 2))


# Counts-in-voxel histogram bins: every small count, then about logarithmic bins up to the
# int16 maximum (the real cubes reach ~1000 at z = 0).
PDF_EDGES = np.array([0, 1, 2, 3, 4, 6, 9, 14, 22, 36, 60, 100, 200, 32768])


def count_pdf(counts, edges=PDF_EDGES):
    """Fraction of voxels per count bin [edges[i], edges[i+1])."""
    h, _ = np.histogram(np.asarray(counts).ravel(), bins=edges)
    return h / h.sum()


def pdf_chi2(x, ensemble, voxels, min_voxels=20):
    """ensemble_chi2 of a counts-in-voxel PDF (fractions per PDF_EDGES bin) against an ensemble's.

    The sparse tail is merged first: from the top, bins are pooled until the pooled bin holds at
    least `min_voxels` voxels on average in the ensemble (a bin that holds 0 or 1 voxel is far
    from Gaussian, and one stray voxel would dominate the chi-square). The pooled tail is then
    dropped: the fractions sum to one, so the last bin carries no information of its own. At most
    N - 4 bins are tested (N members), so that the sample covariance stays invertible.
    Returns ensemble_chi2's dict plus `bins` (the number of bins tested)."""
    x = np.asarray(x, dtype=np.float64)
    e = np.asarray(ensemble, dtype=np.float64)
    mean_voxels = e.mean(axis=0) * voxels
    tail = len(x) - 1
    while tail > 1 and mean_voxels[tail:].sum() < min_voxels:
        tail -= 1
    tail = max(1, min(tail, len(e) - 4))  # a small ensemble tests fewer, wider bins
    r = ensemble_chi2(x[:tail], e[:, :tail])
    r["bins"] = tail
    return r


@functools.lru_cache(maxsize=16)
def gaussian_kernel(n, box, radius):
    kk, _ = wavenumbers(n, box)
    g = np.exp(-0.5 * (kk * radius) ** 2).astype(np.float32)
    g.setflags(write=False)
    return g


def gaussian_smooth(delta, box, radius, dk=None):
    """delta convolved with a Gaussian of rms radius `radius` Mpc/h (periodic, by FFT); `dk` =
    rfftn(delta) if known."""
    if dk is None:
        dk = rfftn(delta)
    return irfftn(dk * gaussian_kernel(delta.shape[0], box, radius), delta.shape)


def skewness(x):
    x = x.ravel() - x.mean()
    x2 = x * x
    return float(np.dot(x2, x) / x.size / (np.mean(x2) ** 1.5))


def smoothed_skewness(delta, box, radii, dk=None):
    """Skewness of delta smoothed with Gaussians of the given radii (Mpc/h)."""
    if dk is None:
        dk = rfftn(delta)
    return np.array([skewness(gaussian_smooth(delta, box, r, dk)) for r in radii])


def channel_correlations(deltas, box, radius, pairs):
    """Pearson correlation of the smoothed contrasts of channel pairs (a, b)."""
    sm = [gaussian_smooth(d, box, radius) for d in deltas]
    return np.array([float(np.corrcoef(sm[a].ravel(), sm[b].ravel())[0, 1]) for a, b in pairs])


def ensemble_chi2(x, ensemble):
    """Where one data vector x (p values) sits in an ensemble (N x p) of simulations of the same
    model, accounting for the covariance estimated from the ensemble itself.

    chi2 = h (x - m)^T S^-1 (x - m) / (1 + 1/N), m and S the ensemble mean and sample covariance,
    h = (N - p - 2) / (N - 1) the Hartlap et al. (2007, A&A 464, 399) factor that makes the
    inverse of a sample covariance unbiased, (1 + 1/N) the variance of m; compared with
    chi-square(p). The exact small-N law is Hotelling's: T^2 = (x - m)^T S^-1 (x - m) N / (N + 1)
    with (N - p) / (p (N - 1)) T^2 ~ F(p, N - p) for Gaussian data; both p-values are returned.
    Components that do not vary in the ensemble (a zero variance) are dropped first.

    Returns dict(chi2, dof, p, p_hotelling, hartlap).
    """
    x = np.asarray(x, dtype=np.float64)
    e = np.asarray(ensemble, dtype=np.float64)
    keep = (np.std(e, axis=0) > 0) & np.isfinite(x) & np.all(np.isfinite(e), axis=0)
    x, e = x[keep], e[:, keep]
    n, p = e.shape
    if p == 0 or n < p + 3:
        raise ValueError(f"ensemble of {n} too small for {p} components (need N >= p + 3)")
    m = e.mean(axis=0)
    s = np.cov(e, rowvar=False).reshape(p, p)
    d = x - m
    q = float(d @ np.linalg.solve(s, d))
    h = (n - p - 2) / (n - 1)
    chi2 = h * q / (1 + 1.0 / n)
    t2 = q * n / (n + 1)
    f = (n - p) / (p * (n - 1)) * t2
    return {
        "chi2": chi2,
        "dof": p,
        "p": float(stats.chi2.sf(chi2, p)),
        "p_hotelling": float(stats.f.sf(f, p, n - p)),
        "hartlap": h,
    }


def percentile(x, ensemble):
    """Percent of the ensemble below x (ties count half): 50 is typical, 0 or 100 outside."""
    e = np.asarray(ensemble, dtype=np.float64)
    return float(100.0 * (np.sum(e < x) + 0.5 * np.sum(e == x)) / len(e))


def zscore(x, ensemble):
    e = np.asarray(ensemble, dtype=np.float64)
    sd = e.std(ddof=1)
    return float((x - e.mean()) / sd) if sd > 0 else float("nan")


def two_sided_p(z):
    return float(special.erfc(abs(z) / np.sqrt(2)))
