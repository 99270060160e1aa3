#!/usr/bin/python3
"""The accuracy study's calibration arithmetic on toys with known noise (tools/calibration.py,
tools/accuracy_report.py):
- a miscalibrated toy (claimed sigma, truths scattered with k * sigma) recovers k: within 2% without
  a prior, 4% with truncation to the prior (n = 20000: the estimate's own spread is ~0.5% of k);
- once recalibrated, its 68.3% / 95.4% coverage is within 3 binomial standard deviations;
- the joint ellipse of a correlated 2-D toy covers 68.3% / 95.4%; the regions of the truncated
  posterior (region_pit) equal those ellipses far from the prior's edges, cover 68.3% / 95.4% of
  truths drawn from a truncated posterior near an edge (where the ellipse at the mean does not),
  and leave out a truth inside the prior when the mean lies beyond it;
- the power calibration recovers the exponent of a toy whose true sigma grows as the square root of
  the claimed one (b = 0.5 within 0.03), and its calibrated 68.3% coverage is right in every
  tercile of sigma, where the plain factor's is not;
- the report on toy CSVs says "met" for a calibrated heteroscedastic toy and "missed" for one whose
  sigma is 1.5x too small, and gives what the exact posterior reaches per true-value tercile;
- `location` inverts the truncated mean for a whole array at once, elements that converge early
  included (means 0.05 to 10 sigmas from the prior's edges, to 1e-9 of the prior's width);
- that reach (flat prior, Gaussian likelihood) agrees with a posterior computed on a grid within
  0.02, is the level in every tercile with much information, and 0.52 / 1.00 / 0.52 with none.
Usage: calibration_toy_test.py WORK_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
from scipy.special import ndtr

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import calibration as cal  # noqa: E402

rng = np.random.default_rng(7)
N = 20000


def check(ok, what):
    if not ok:
        sys.exit(f"calibration_toy_test: {what}")


def truncated_draws(mean, sigma, low, high):
    """Truths from N(mean, sigma^2) truncated to [low, high], by rejection."""
    t = mean + sigma * rng.standard_normal(len(mean))
    bad = (t < low) | (t > high)
    while bad.any():
        t[bad] = mean[bad] + sigma[bad] * rng.standard_normal(bad.sum())
        bad = (t < low) | (t > high)
    return t


def fits():
    for k in (0.6, 1.0, 1.7):
        mean = rng.uniform(0, 1, N)
        sigma = rng.uniform(0.01, 0.05, N)
        truth = mean + k * sigma * rng.standard_normal(N)
        c = cal.fit_sigma_scale(truth, mean, sigma)
        check(abs(c - k) < 0.02 * k, f"untruncated toy k={k}: fitted {c}")
        u = cal.pit(truth, mean, c * sigma)
        for q in cal.LEVELS:
            tol = 3 * np.sqrt(q * (1 - q) / N)
            check(abs(cal.coverage(u, q) - q) < tol, f"recalibrated coverage {cal.coverage(u, q)} for {q}")
    # Truncated: locations near the prior's edges, where truncation matters; the served mean is the
    # truncated posterior's mean.
    k, low, high = 1.5, 0.0, 1.0
    loc = np.where(rng.uniform(size=N) < 0.5, 0.05, 0.95)
    sigma = np.full(N, 0.2)
    truth = truncated_draws(loc, k * sigma, low, high)
    mean = cal.truncated_mean(loc, k * sigma, low, high)
    c = cal.fit_sigma_scale(truth, mean, sigma, low, high)
    check(abs(c - k) < 0.04 * k, f"truncated toy k={k}: fitted {c}")
    u = cal.pit(truth, mean, c * sigma, low, high)
    for q in cal.LEVELS:
        tol = 3 * np.sqrt(q * (1 - q) / N)
        check(abs(cal.coverage(u, q) - q) < tol, f"truncated recalibrated coverage {cal.coverage(u, q)} for {q}")
    naive = cal.fit_sigma_scale(truth, mean, sigma)
    check(abs(naive - k) > 0.04 * k, "the truncated toy does not exercise truncation")


def locations():
    # One call for many means: elements 4-8 sigmas inside converge in a step or two while those near
    # an edge take many, so a converged element must keep its location while the rest iterate.
    low, high, sigma = 0.78, 0.95, 0.0088
    mean = np.concatenate([low + sigma * np.linspace(0.05, 10, 4001), high - sigma * np.linspace(0.05, 10, 4001)])
    loc = cal.location(mean, np.full_like(mean, sigma), low, high)
    err = np.abs(cal.truncated_mean(loc, sigma, low, high) - mean)
    worst = int(np.argmax(err))
    check(err[worst] < 1e-9 * (high - low), f"location({mean[worst]}) = {loc[worst]}: truncated mean off by {err[worst]}")
    one = float(cal.location(0.8227124, sigma, low, high))  # 4.9 sigmas inside: barely truncated
    check(abs(one - 0.8227124) < 1e-6, f"location(0.8227124) = {one}")


def flat_prior():
    """A parameter the data measure weakly: truths flat in [-1, 1], a Gaussian likelihood of width
    0.5, served as the exact posterior's mean with a sigma claimed half the width. The fit finds
    the width (its spread over seeds is 1.6% at this N) and the truncated posterior covers each
    level; a Gaussian centred on the served mean (pulling it inside the prior a second time),
    with its own likeliest width, does not."""
    tau, low, high = 0.5, -1.0, 1.0
    theta = rng.uniform(low, high, N)
    mean = cal.truncated_mean(theta + tau * rng.standard_normal(N), tau, low, high)
    c = cal.fit_sigma_scale(theta, mean, np.full(N, tau / 2), low, high)
    check(abs(c - 2) < 0.08, f"flat-prior toy: fitted {c}, want 2")
    u = cal.pit(theta, mean, np.full(N, c * tau / 2), low, high)
    for q in cal.LEVELS:
        tol = 3 * np.sqrt(q * (1 - q) / N)
        check(abs(cal.coverage(u, q) - q) < tol, f"flat-prior toy: coverage {cal.coverage(u, q)} for {q}")
    def centred(w):  # the PIT and NLL of a Gaussian of width w centred on the served mean
        a, b = ndtr((low - mean) / w), ndtr((high - mean) / w)
        z = (theta - mean) / w
        return (ndtr(z) - a) / (b - a), np.mean(0.5 * z * z + np.log(w) + np.log(b - a))
    w = min(np.linspace(0.2, 5, 97) * tau, key=lambda w: centred(w)[1])  # its likeliest width
    got = cal.coverage(centred(w)[0], 0.683)
    check(got < 0.683 - 4 * np.sqrt(0.683 * 0.317 / N), f"flat-prior toy: a centred Gaussian covers {got}")


def ellipse():
    cov = np.array([[1.0, -0.8], [-0.8, 2.0]])
    covs = np.tile(cov, (N, 1, 1))
    mean = rng.uniform(-1, 1, (N, 2))
    truth = mean + rng.multivariate_normal([0, 0], cov, N)
    for q in cal.LEVELS:
        tol = 3 * np.sqrt(q * (1 - q) / N)
        v = cal.ellipse_coverage(truth, mean, covs, q)
        check(abs(v - q) < tol, f"ellipse coverage {v} for {q}")
    # Ignoring the correlation must show: the diagonal-only ellipse misses.
    diag = np.tile(np.diag(np.diag(cov)), (N, 1, 1))
    check(abs(cal.ellipse_coverage(truth, mean, diag, 0.683) - 0.683) > 3 * np.sqrt(0.683 * 0.317 / N),
          "the correlated toy does not exercise the correlation")


def regions():
    n = 4000
    tol = {q: 3 * np.sqrt(q * (1 - q) / n) + 0.005 for q in cal.LEVELS}  # + the draws' own error
    # Far from the edges the truncated posterior is the Gaussian: the same regions as the ellipses.
    cov = np.tile(np.array([[1.0, -0.8], [-0.8, 2.0]]), (n, 1, 1))
    mean = rng.uniform(-1, 1, (n, 2))
    truth = mean + rng.multivariate_normal([0, 0], cov[0], n)
    u = cal.region_pit(truth, mean, cov, [(-100, 100), (-100, 100)])
    for q in cal.LEVELS:
        v, e = float(np.mean(u <= q)), cal.ellipse_coverage(truth, mean, cov, q)
        check(abs(v - e) < 0.01 and abs(v - q) < tol[q], f"untruncated region coverage {v} (ellipse {e}) for {q}")
    # Near an edge, independent parameters: the truncated posterior's location is each marginal's,
    # truths are drawn from it, and the served mean is its mean.
    low, high = np.array([0.0, 0.0]), np.array([1.0, 1.0])
    sigma = np.array([0.1, 0.2])
    loc = rng.uniform(-0.1, 0.2, (n, 2))
    truth = np.stack([truncated_draws(loc[:, j], np.full(n, sigma[j]), low[j], high[j]) for j in range(2)], axis=1)
    mean = np.stack([cal.truncated_mean(loc[:, j], sigma[j], low[j], high[j]) for j in range(2)], axis=1)
    cov = np.tile(np.diag(sigma ** 2), (n, 1, 1))
    u = cal.region_pit(truth, mean, cov, list(zip(low, high)))
    for q in cal.LEVELS:
        v = float(np.mean(u <= q))
        check(abs(v - q) < tol[q], f"truncated region coverage {v} for {q}")
    e = cal.ellipse_coverage(truth, mean, cov, 0.683)
    check(abs(e - 0.683) > tol[0.683], f"the edge toy does not exercise truncation (ellipse covers {e})")
    # A mean beyond the prior: the posterior crowds at the edge, a truth 0.4 sigma inside is outside
    # even the 95.4% region.
    far = cal.region_pit([[0.96, 0.5]], [[1.01, 0.5]], [[[0.01, 0.0], [0.0, 0.01]]], [(0, 1), (0, 1)])
    check(np.isfinite(far[0]) and far[0] > 0.954, f"a mean beyond the prior: region mass {far[0]}")


def write_csv(path, truth, mean, cov, names):
    p = len(names)
    pairs = [(i, j) for i in range(p) for j in range(i, p)]
    with open(path, "w") as f:
        f.write("index," + ",".join("true_" + n for n in names) + "," + ",".join("pred_" + n for n in names) + "," +
                ",".join("sigma_" + n for n in names) + "," + ",".join(f"cov_{names[i]}_{names[j]}" for i, j in pairs) + "\n")
        for i in range(len(truth)):
            row = [str(i)] + [f"{v:.9g}" for v in truth[i]] + [f"{v:.9g}" for v in mean[i]]
            row += [f"{np.sqrt(cov[i, j, j]):.9g}" for j in range(p)] + [f"{cov[i, a, b]:.12g}" for a, b in pairs]
            f.write(",".join(row) + "\n")


def toy_set(n, names, prior, claimed_over_true):
    """Heteroscedastic posteriors: per-sample sigma, Omega_M/sigma_8 correlated -0.6, truths drawn
    from the true posterior truncated to the prior; the CSV claims sigma * claimed_over_true."""
    p = len(names)
    lo, hi = np.array(prior).T
    scale = 0.05 * (hi - lo)
    sigma = scale * rng.uniform(0.5, 1.5, (n, p))
    corr = np.eye(p)
    corr[0, 1] = corr[1, 0] = -0.6
    cov = corr[None] * sigma[:, :, None] * sigma[:, None, :]
    mean = rng.uniform(lo + 3 * scale, hi - 3 * scale, (n, p))
    chol = np.linalg.cholesky(cov)
    truth = mean + np.einsum("nij,nj->ni", chol, rng.standard_normal((n, p)))
    truth = np.clip(truth, lo, hi)  # 3-sigma margins: clipping touches almost nothing
    return truth, mean, cov * claimed_over_true ** 2


def report(work):
    names = ["Omega_M", "sigma_8", "n_s"]
    prior = [(0.25, 0.35), (0.78, 0.95), (0.90, 1.00)]
    prior_arg = ";".join(f"{a},{b}" for a, b in prior)
    results = {}
    for label, claimed in (("calibrated", 1.0), ("too_narrow", 1 / 1.5)):
        d = os.path.join(work, label)
        os.makedirs(d, exist_ok=True)
        for what, n in (("network", 6000), ("network_val", 3000)):
            write_csv(os.path.join(d, what + ".csv"), *toy_set(n, names, prior, claimed), names)
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "accuracy_report.py"), "--network",
                        os.path.join(d, "network.csv"), "--network-val", os.path.join(d, "network_val.csv"),
                        "--prior", prior_arg, "--out", d], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(d, "accuracy.json")) as f:
            results[label] = json.load(f)["uncertainty"]["served"]
        for png in ("coverage_curve.png", "pred_vs_true_errorbars.png"):
            check(os.path.getsize(os.path.join(d, png)) > 0, f"{label}: {png} missing")
    good = {t["target"]: t["met"] for t in results["calibrated"]["targets"] if "RMS / trivial" not in t["target"]}
    check(all(good.values()), f"calibrated toy misses: {[t for t, ok in good.items() if not ok]}")
    bad = results["too_narrow"]
    check(bad["params"]["Omega_M"]["coverage"]["0.683"] < 0.55, f"too-narrow toy covers {bad['params']['Omega_M']}")
    check(not all(t["met"] for t in bad["targets"]), "the too-narrow toy meets every target")
    best = results["calibrated"]["params"]["n_s"]["exact_posterior_terciles_true"]
    check(len(best) == 3 and all(0.5 < t["0.683"] <= 1 for t in best), f"exact-posterior reach: {best}")
    check("What the exact posterior of a flat prior reaches" in open(os.path.join(work, "calibrated", "accuracy.md")).read(),
          "the report does not give the exact posterior's reach")
    z = bad["params"]["sigma_8"]["z_std"]
    check(abs(z - 1.5) < 0.1, f"too-narrow toy: z spread {z}, expected 1.5")


def power():
    sigma = np.exp(rng.uniform(np.log(0.02), np.log(0.5), N))
    true_sigma = 0.08 * np.sqrt(sigma / 0.1)
    mean = rng.uniform(0, 1, N)
    truth = mean + true_sigma * rng.standard_normal(N)
    s, b, r = cal.fit_sigma_power(truth, mean, sigma)
    check(abs(b - 0.5) < 0.03, f"power toy: exponent {b}, want 0.5")
    calibrated = sigma * cal.power_factors(sigma, s, b, r)
    check(np.allclose(calibrated, true_sigma, rtol=0.05), "power toy: calibrated sigma off the true one")
    plain = sigma * cal.fit_sigma_scale(truth, mean, sigma)
    thirds = np.array_split(np.argsort(sigma), 3)
    for name, sig, want_ok in (("power", calibrated, True), ("plain factor", plain, False)):
        cov = [cal.coverage(cal.pit(truth[t], mean[t], sig[t]), 0.683) for t in thirds]
        ok = all(abs(c - 0.683) < 0.03 for c in cov)
        check(ok == want_ok, f"power toy: {name} coverage by sigma tercile {cov}")


def edge():
    """fit_sigma_edge: truths drawn from the truncated Gaussian at location L with sigma 0.01
    exp(0.4 u^2) on a prior of half-width 0.15, the served mean that distribution's mean and the
    claimed sigma 0.01: e comes back as 0.4 and k as 1, and the edge term balances the coverage
    of the outer and inner thirds of the prior, which a plain factor cannot."""
    rng = np.random.default_rng(6)
    low, high = 0.25, 0.55
    n = 5000  # each trial e refits k by a grid search: kept small
    loc = rng.uniform(low + 0.0075, high - 0.0075, n)
    u = cal.edge_coordinate(loc, low, high)
    true_sigma = 0.01 * np.exp(0.4 * u * u)
    truth = truncated_draws(loc, true_sigma, low, high)
    mean = cal.truncated_mean(loc, true_sigma, low, high)
    claimed = np.full(n, 0.01)
    k, e = cal.fit_sigma_edge(truth, mean, claimed, low, high)
    check(abs(e - 0.4) < 0.1 and abs(k - 1) < 0.05, f"edge toy: e {e}, k {k}, want 0.4 and 1")
    served = k * claimed * np.exp(e * cal.edge_coordinate(mean, low, high) ** 2)
    plain = claimed * cal.fit_sigma_scale(truth, mean, claimed, low, high)
    outer = np.abs(cal.edge_coordinate(mean, low, high)) > 2 / 3
    for name, sig, want_ok in (("edge", served, True), ("plain factor", plain, False)):
        cov = [cal.coverage(cal.pit(truth[t], mean[t], sig[t], low, high), 0.683) for t in (outer, ~outer)]
        ok = all(abs(c - 0.683) < 0.035 for c in cov)
        check(ok == want_ok, f"edge toy: {name} coverage outer / inner {cov}")


def joint():
    """fit_joint_factor: a claimed correlation of 0.6 over independent unit errors gives
    k = 1 / (1 - 0.36); a parameter whose sigma is a quarter of its prior stays out of the block."""
    rng = np.random.default_rng(4)
    truth = rng.standard_normal((N, 3))
    cov = np.tile(np.eye(3), (N, 1, 1))
    cov[:, 0, 1] = cov[:, 1, 0] = 0.6
    prior = [(-math.inf, math.inf), (-1000.0, 1000.0), (-2.0, 2.0)]
    block, k = cal.fit_joint_factor(truth, np.zeros((N, 3)), cov, prior)
    check(block == [0, 1], f"joint toy: block {block}, want [0, 1]")
    check(abs(k - 1 / 0.64) < 0.05 * k, f"joint toy: factor {k}, want {1 / 0.64}")
    check(cal.fit_joint_factor(truth, np.zeros((N, 3)), cov, [(-2.0, 2.0)] * 3) == ([], 1.0),
          "joint toy: no block when every prior is narrow")


def exact_posterior():
    for r in (0.05, 0.3):
        for q, t in cal.flat_prior_terciles(r).items():
            check(all(abs(c - q) < 0.02 for c in t), f"exact posterior at information {r}: {t} for {q}")
    t = cal.flat_prior_terciles(1.0)[0.683]
    outer = (0.683 - 1 / 3) / (2 / 3)  # a fixed central interval of the prior
    check(abs(t[0] - outer) < 0.015 and abs(t[2] - outer) < 0.015 and t[1] > 0.99, f"no information: {t}")
    # Independently: the posterior on a grid, its mean's RMS and its central intervals' coverage.
    n, tau = 20000, 0.8
    theta = np.sort(rng.uniform(-1, 1, n))
    x = theta + tau * rng.standard_normal(n)
    grid = np.linspace(-1, 1, 801)
    post = np.exp(-0.5 * ((x[:, None] - grid[None, :]) / tau) ** 2)
    post /= post.sum(axis=1, keepdims=True)
    ratio = np.sqrt(np.mean((post @ grid - theta) ** 2)) * math.sqrt(3)
    cdf = np.cumsum(post, axis=1)
    reach = cal.flat_prior_terciles(ratio)
    for q in cal.LEVELS:
        lo = grid[np.argmax(cdf >= 0.5 - q / 2, axis=1)]
        hi = grid[np.argmax(cdf >= 0.5 + q / 2, axis=1)]
        inside = (theta >= lo) & (theta <= hi)
        got = [inside[idx].mean() for idx in np.array_split(np.arange(n), 3)]
        check(all(abs(a - b) < 0.02 for a, b in zip(got, reach[q])), f"grid posterior {got} vs {reach[q]} at {q}")


if __name__ == "__main__":
    work = sys.argv[1]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    fits()
    locations()
    flat_prior()
    ellipse()
    regions()
    power()
    edge()
    joint()
    exact_posterior()
    report(work)
    print("calibration_toy_test: ok")
