"""Calibration arithmetic for the accuracy study (tools/accuracy_report.py) and its toy test.

Posteriors are Gaussian (mean, sigma per parameter; covariance for joint regions), truncated to the
prior range [low, high] where a parameter's interval is meant: for n_s the posterior is close to
its flat prior, and an untruncated Gaussian would put probability outside what the data can be.
The truncated posterior of a served (mean, sigma) is the Gaussian of scale sigma whose truncation
has that mean (`location`): the served mean is a posterior mean, already pulled inside the prior,
and centring the Gaussian on it would pull it a second time (the exact posterior of a flat prior
and a Gaussian likelihood is centred on the likelihood's peak, outside the posterior mean).
The sigma-factor fit is the same as core/nn/uncertainty.cc's FitSigmaScale (truncated-Gaussian
maximum likelihood over log c), so the study can recalibrate a predictor the server does not
serve (the symmetry mixture) the way the trainer calibrates the served one.
"""
import math

import numpy as np
from scipy.special import ndtr, ndtri

LEVELS = (0.683, 0.954)  # the 1- and 2-sigma central intervals


LOCATION_REACH = 30.0  # the location is searched within this many sigmas outside the prior


def _mass(a, b):
    """The standard normal's mass in [a, b], from the tail that keeps its digits (a > 0: the
    upper one, mirrored)."""
    upper = a > 0
    return ndtr(np.where(upper, -a, b)) - ndtr(np.where(upper, -b, a))


def _fraction(t, a, b):
    """The standard normal's mass in [a, t] over its mass in [a, b] (a <= t <= b)."""
    return _mass(a, t) / np.maximum(_mass(a, b), 1e-300)


def _quantile(p, a, b):
    """The t in [a, b] with _fraction(t, a, b) = p."""
    qa, qb = ndtr(-a), ndtr(-b)
    return np.where(a > 0, -ndtri(qa - p * (qa - qb)), ndtri(ndtr(a) + p * (ndtr(b) - ndtr(a))))


def truncated_mean(loc, sigma, low, high):
    """Mean of N(loc, sigma^2) truncated to [low, high]."""
    a, b = (low - loc) / sigma, (high - loc) / sigma
    mass = np.maximum(_mass(a, b), 1e-300)
    return loc + sigma * (np.exp(-0.5 * a * a) - np.exp(-0.5 * b * b)) / math.sqrt(2 * math.pi) / mass


def location(mean, sigma, low=-np.inf, high=np.inf):
    """The location of the Gaussian of scale sigma whose truncation to [low, high] has mean `mean`
    (core/base/truncated_normal.cc's TruncatedLocation): the mean itself without a prior or 8
    sigmas from both ends; otherwise Newton steps kept in a bracket within LOCATION_REACH sigmas of
    the prior (the truncated mean rises with the location). A mean outside the prior takes the
    nearest end of that range."""
    mean, sigma = np.broadcast_arrays(np.asarray(mean, dtype=float), np.asarray(sigma, dtype=float))
    loc = mean.copy()
    if not (np.isfinite(low) and np.isfinite(high)):
        return loc
    near = (mean - low < 8 * sigma) | (high - mean < 8 * sigma)
    if not near.any():
        return loc
    m, s = mean[near], sigma[near]
    lo, hi = low - LOCATION_REACH * s, high + LOCATION_REACH * s
    x = np.clip(m, lo, hi)
    tol = 1e-10 * (high - low)
    for _ in range(100):  # Newton steps kept inside the bracket (else its midpoint)
        a, b = (low - x) / s, (high - x) / s
        mass = np.maximum(_mass(a, b), 1e-300)
        pa, pb = np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi), np.exp(-0.5 * b * b) / math.sqrt(2 * math.pi)
        shift = (pa - pb) / mass
        f = x + s * shift - m
        slope = 1 + (a * pa - b * pb) / mass - shift * shift  # d(truncated mean) / d(location)
        # A converged element keeps its x: a further step would fall on the bracket's end it just
        # became and be replaced by the bracket's midpoint.
        done = np.abs(f) <= tol
        lo, hi = np.where(f < 0, x, lo), np.where(f < 0, hi, x)
        done |= hi - lo <= tol
        step = x - f / np.maximum(slope, 1e-12)
        x = np.where(done, x, np.where((step > lo) & (step < hi), step, 0.5 * (lo + hi)))
        if np.all(done):
            break
    loc[near] = x
    return loc


def pit(truth, mean, sigma, low=-np.inf, high=np.inf):
    """Probability integral transform: the truth's CDF value under the truncated posterior of
    (mean, sigma) (`location`); clipped to [0, 1] (a truth just outside an estimated prior is
    outside every interval)."""
    loc = location(mean, sigma, low, high)
    a, b = (low - loc) / sigma, (high - loc) / sigma
    return np.clip(_fraction(np.clip((truth - loc) / sigma, a, b), a, b), 0.0, 1.0)


def coverage(u, level):
    """Fraction of truths inside the central `level` interval, from their PIT values."""
    return float(np.mean(np.abs(np.asarray(u) - 0.5) <= level / 2))


def truncated_nll(truth, mean, sigma, low=-np.inf, high=np.inf):
    """Mean negative log-likelihood (with the constant) under the truncated posterior of
    (mean, sigma) (`location`)."""
    loc = location(mean, sigma, low, high)
    z = (truth - loc) / sigma
    nll = 0.5 * z * z + np.log(sigma) + 0.5 * math.log(2 * math.pi)
    if np.isfinite(low) or np.isfinite(high):
        mass = _mass((low - loc) / sigma, (high - loc) / sigma)
        nll = nll + np.log(np.maximum(mass, 1e-300))
    return float(np.mean(nll))


def gaussian_nll(truth, mean, sigma):
    return truncated_nll(truth, mean, sigma)


def fit_sigma_scale(truth, mean, sigma, low=-np.inf, high=np.inf, near=None):
    """The factor c > 0 maximising the likelihood of the truths under N(mean, (c sigma)^2)
    truncated to [low, high]: c^2 = mean(z^2) without a prior; otherwise a grid over log c in
    [-7, log(2 (high - low) / mean sigma)] (beyond twice the prior width the truncated posterior
    is flat over the prior) refined by golden section. `near` (a log factor, e.g. a neighbouring
    fit's) replaces the grid by a walk downhill from it in steps of 0.25, as core/nn/uncertainty.cc's
    LocalScale does."""
    truth, mean, sigma = (np.asarray(x, dtype=float) for x in (truth, mean, sigma))
    if len(truth) == 0 or not np.all(np.isfinite(sigma)) or not np.all(sigma > 0):
        raise ValueError("sigma must be positive and finite for every sample")
    if not (np.isfinite(low) or np.isfinite(high)):
        return float(np.sqrt(np.mean(((truth - mean) / sigma) ** 2)))
    hi_log = min(7.0, math.log(max(1e-12, 2 * (high - low) / sigma.mean())))
    f = lambda x: truncated_nll(truth, mean, math.exp(x) * sigma, low, high)  # noqa: E731
    a, b = _bracket(f, hi_log) if near is None else _walk(f, hi_log, near)
    phi = (math.sqrt(5) - 1) / 2
    x1, x2 = b - phi * (b - a), a + phi * (b - a)
    f1, f2 = f(x1), f(x2)
    while b - a > 1e-7:
        if f1 < f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - phi * (b - a)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + phi * (b - a)
            f2 = f(x2)
    return math.exp((a + b) / 2)


def _bracket(f, hi_log):
    """The grid step either side of f's lowest point on log c in [-7, hi_log]."""
    grid = np.linspace(-7.0, hi_log, 281)
    best = int(np.argmin([f(x) for x in grid]))
    if best == 0:
        raise ValueError("the fitted factor is below e^-7 (sigma far too wide?)")
    return grid[best - 1], grid[min(len(grid) - 1, best + 1)]


def _walk(f, hi_log, near, step=0.25):
    """A bracket of one step either side of the point where f stops falling, walking from `near`."""
    x = min(hi_log, max(-7.0, near))
    fx = f(x)
    d = -step if f(max(-7.0, x - step)) < fx else step
    while True:
        nx = min(hi_log, max(-7.0, x + d))
        fn = f(nx) if nx != x else math.inf
        if not fn < fx:
            break
        x, fx = nx, fn
    if x == -7.0:
        raise ValueError("the fitted factor is below e^-7 (sigma far too wide?)")
    return max(-7.0, x - step), min(hi_log, x + step)


def _refine(trial, lo, hi, best):
    """Golden section on [lo, hi] to 1e-4 of trial(x, best fit so far) -> (nll, fit), keeping the
    lowest NLL seen in best = (nll, fit, x); returns it."""
    phi = (math.sqrt(5) - 1) / 2
    while hi - lo > 1e-4:
        x1, x2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
        (n1, f1), (n2, f2) = trial(x1, best[1]), trial(x2, best[1])
        if n1 < n2:
            hi = x2
        else:
            lo = x1
        n, f, x = (n1, f1, x1) if n1 < n2 else (n2, f2, x2)
        if n < best[0]:
            best = (n, f, x)
    return best


def fit_sigma_power(truth, mean, sigma, low=-np.inf, high=np.inf):
    """The power calibration sigma -> s r (sigma / r)^b of core/nn/uncertainty.cc's FitSigmaPower:
    r the geometric mean sigma, b over [0, 2] in steps of 0.05 then golden section, each b with its
    best factor s (fit_sigma_scale), keeping the highest truncated likelihood. Returns (s, b, r)."""
    truth, mean, sigma = (np.asarray(x, dtype=float) for x in (truth, mean, sigma))
    r = float(np.exp(np.mean(np.log(sigma))))

    def trial(b):
        s_b = r * (sigma / r) ** b
        try:
            s = fit_sigma_scale(truth, mean, s_b, low, high)
        except ValueError:
            return math.inf, None
        return truncated_nll(truth, mean, s * s_b, low, high), s

    best_nll, best_s = trial(1.0)
    best_b = 1.0
    for b in np.linspace(0.0, 2.0, 41):
        nll, s = trial(float(b))
        if nll < best_nll:
            best_nll, best_s, best_b = nll, s, float(b)
    best_nll, best_s, best_b = _refine(lambda b, _: trial(b), max(0.0, best_b - 0.05), min(2.0, best_b + 0.05),
                                       (best_nll, best_s, best_b))
    if best_s is None:
        raise ValueError("no exponent gives a calibration factor")
    return best_s, best_b, r


def power_factors(sigma, s, b, r):
    """Per-sample factors s (sigma / r)^(b - 1) of a power calibration (sigma: n x p)."""
    return np.asarray(s) * (np.asarray(sigma) / np.asarray(r)) ** (np.asarray(b) - 1.0)


JOINT_PRIOR_FRACTION = 0.1  # core/nn/uncertainty.h's kJointPriorFraction
EDGE_LIMIT, EDGE_REACH = 2.0, 3.0  # core/nn/uncertainty.h's kEdgeLimit, kEdgeReach


def edge_coordinate(x, low, high):
    """u = (x - centre) / half-width of [low, high], clamped to +-EDGE_REACH (core/nn/uncertainty.cc)."""
    return np.clip((2.0 * np.asarray(x, dtype=float) - (low + high)) / (high - low), -EDGE_REACH, EDGE_REACH)


def narrow_outputs(sigma, prior):
    """The parameters whose mean sigma (n x p) is below JOINT_PRIOR_FRACTION of their prior's width
    (or that have no prior): the joint block, and the outputs that get an edge term."""
    return [j for j, (low, high) in enumerate(prior)
            if not math.isfinite(high - low) or sigma[:, j].mean() < JOINT_PRIOR_FRACTION * (high - low)]


def fit_sigma_edge(truth, mean, sigma, low, high):
    """The edge term of core/nn/uncertainty.cc's FitSigmaEdge: the e in [-EDGE_LIMIT, EDGE_LIMIT]
    (steps of 0.1 walking out from 0 both ways, then golden section) and factor k (fit_sigma_scale,
    each search started from the neighbouring e's k) that maximise the truncated likelihood of
    (mean, k sigma exp(e u^2)), u = edge_coordinate(mean). Returns (k, e)."""
    truth, mean, sigma = (np.asarray(x, dtype=float) for x in (truth, mean, sigma))
    u2 = edge_coordinate(mean, low, high) ** 2

    def trial(e, near):
        s_e = sigma * np.exp(e * u2)
        try:
            k = fit_sigma_scale(truth, mean, s_e, low, high, near)
        except ValueError:
            return math.inf, None
        return truncated_nll(truth, mean, k * s_e, low, high), k

    plain = fit_sigma_scale(truth, mean, sigma, low, high)
    best_nll, best_k, best_e = truncated_nll(truth, mean, plain * sigma, low, high), plain, 0.0
    steps = int(round(EDGE_LIMIT / 0.1))
    for direction in (1, -1):
        near = math.log(plain)
        for g in range(1, steps + 1):
            e = direction * g * 0.1
            nll, k = trial(e, near)
            if k is None:
                continue
            near = math.log(k)
            if nll < best_nll:
                best_nll, best_k, best_e = nll, k, e
    _, best_k, best_e = _refine(lambda e, k: trial(e, math.log(k)), max(-EDGE_LIMIT, best_e - 0.1),
                                min(EDGE_LIMIT, best_e + 0.1), (best_nll, best_k, best_e))
    return best_k, best_e


def fit_joint_factor(truth, mean, cov, prior):
    """The joint step of core/nn/uncertainty.cc's power calibration (FitJointFactor): the block is
    the parameters whose mean sigma is below JOINT_PRIOR_FRACTION of their prior's width (prior:
    (low, high) per parameter, infinite = none); its covariance factor k = mean(d^2) / q maximises
    the block's Gaussian likelihood. Returns (block indices, k); ([], 1.0) below two parameters."""
    truth, mean, cov = (np.asarray(x, dtype=float) for x in (truth, mean, cov))
    block = narrow_outputs(np.sqrt(np.diagonal(cov, axis1=1, axis2=2)), prior)
    if len(block) < 2:
        return [], 1.0
    r = (truth - mean)[:, block]
    sub = cov[:, block][:, :, block]
    d2 = np.einsum("ni,nij,nj->n", r, np.linalg.inv(sub), r)
    return block, float(d2.mean() / len(block))


def ellipse_coverage(truth, mean, cov, level):
    """Fraction of truth vectors inside the `level` region of N(mean, cov) (any dimension d):
    Mahalanobis distance^2 below the chi-square quantile, -2 ln(1 - level) for d = 2."""
    r = np.asarray(truth) - np.asarray(mean)
    d = r.shape[1]
    quantile = -2 * math.log(1 - level) if d == 2 else _chi2_quantile(level, d)
    m = np.einsum("ni,nij,nj->n", r, np.linalg.inv(cov), r)
    return float(np.mean(m <= quantile))


def region_pit(truth, mean, cov, prior, draws=4096, seed=0):
    """Per sample, the mass of the truncated posterior inside the smallest ellipse about its
    location that holds the truth: the truth lies in the `level` region of the joint posterior
    when this is <= level. The posterior is N(location, cov) truncated to the prior's box, its
    location per parameter the one `location` gives that parameter's marginal (the same
    placement as the marginal intervals; exact without correlations, a first-order approximation
    with them near the edges). Its highest-density regions are the ellipses about the location cut
    by the box. The mass is estimated from `draws` seeded draws of the GHK sampler (each coordinate
    in turn from its conditional normal truncated to the box, weighted by those conditionals'
    masses), which stays exact when the location lies far outside the box, as it does for a mean
    beyond the prior. truth, mean (n, d), cov (n, d, d), prior [(low, high)] per parameter."""
    truth, mean, cov = (np.asarray(x, dtype=float) for x in (truth, mean, cov))
    n, d = mean.shape
    sigma = np.sqrt(np.diagonal(cov, axis1=1, axis2=2))
    low = np.array([p[0] for p in prior], dtype=float)
    high = np.array([p[1] for p in prior], dtype=float)
    loc = np.stack([location(mean[:, j], sigma[:, j], low[j], high[j]) for j in range(d)], axis=1)
    chol = np.linalg.cholesky(cov)
    rng = np.random.default_rng(seed)
    # In the whitened coordinates z (x = loc + L z) the ellipses are spheres: d^2 = |z|^2.
    z_truth = np.linalg.solve(chol, (truth - loc)[:, :, None])[:, :, 0]
    d2_truth = np.sum(z_truth ** 2, axis=1)
    out = np.empty(n)
    for start in range(0, n, 256):  # bounded memory: 256 x draws at a time
        sl = slice(start, min(n, start + 256))
        m = sl.stop - sl.start
        z = np.zeros((m, draws, d))
        log_w = np.zeros((m, draws))
        for j in range(d):
            shift = loc[sl, j, None] + np.einsum("nk,ndk->nd", chol[sl, j, :j], z[:, :, :j])
            a = (low[j] - shift) / chol[sl, j, j, None]
            b = (high[j] - shift) / chol[sl, j, j, None]
            z[:, :, j] = _quantile(rng.uniform(size=(m, draws)), a, b)
            log_w += np.log(np.maximum(_mass(a, b), 1e-300))
        w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
        inner = np.sum(z ** 2, axis=2) < d2_truth[sl, None]
        out[sl] = np.sum(w * inner, axis=1) / np.sum(w, axis=1)
    return out


def _chi2_quantile(level, d):
    from scipy.stats import chi2
    return float(chi2.ppf(level, d))


def mixture(means, covs):
    """Moments of an equal-weight mixture over axis 1: means (n, k, p), covs (n, k, p, p) ->
    the mean of the means and the mean covariance plus the spread of the means (1/k)."""
    mean = means.mean(axis=1)
    dev = means - mean[:, None, :]
    return mean, covs.mean(axis=1) + np.einsum("nki,nkj->nij", dev, dev) / means.shape[1]


def flat_prior_terciles(info_ratio, levels=LEVELS, n=60000, seed=0):
    """Coverage per tercile of the true value that the exact posterior reaches for a parameter
    with a flat prior and a Gaussian likelihood, at the information level `info_ratio`: its
    posterior mean's RMS error over the prior's standard deviation (the study's RMS / trivial).
    The exact posterior covers each level on average over the prior, but not given the truth: the
    less the data say, the more the middle tercile is over-covered and the outer ones under-covered
    (with no information, 0.52 / 1.00 / 0.52 at 68.3%). It is what the best posterior reaches per
    tercile at that information level: an interval that moves little with the data cannot cover
    62% of both outer thirds without covering all of the middle one. Returns {level: [low, middle,
    high tercile]}."""
    rng = np.random.default_rng(seed)
    theta = np.sort(rng.uniform(-1.0, 1.0, n))
    eps = rng.standard_normal(n)
    sd = 1 / math.sqrt(3)  # the prior's, on [-1, 1]

    def posterior(tau):  # the likelihood's peak x and the posterior mean
        x = theta + tau * eps
        return x, truncated_mean(x, tau, -1.0, 1.0)

    ratio = lambda tau: float(np.sqrt(np.mean((posterior(tau)[1] - theta) ** 2)) / sd)  # noqa: E731
    if info_ratio >= ratio(1e4):
        tau = 1e4
    else:  # ratio(tau) grows with tau: bisection in log tau
        lo, hi = math.log(1e-4), math.log(1e4)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ratio(math.exp(mid)) < info_ratio else (lo, mid)
        tau = math.exp((lo + hi) / 2)
    u = pit(theta, posterior(tau)[1], np.full(n, tau), -1.0, 1.0)  # served as (posterior mean, tau)
    thirds = np.array_split(np.arange(n), 3)
    return {q: [coverage(u[idx], q) for idx in thirds] for q in levels}


def interval(mean, sigma, low, high, level):
    """The central `level` interval of the truncated posterior (`location`; for error bars; the C++
    client's TruncatedInterval)."""
    loc = location(mean, sigma, low, high)
    a, b = (low - loc) / sigma, (high - loc) / sigma
    return loc + sigma * _quantile(0.5 - level / 2, a, b), loc + sigma * _quantile(0.5 + level / 2, a, b)
