#!/usr/bin/python3
"""Accuracy table and plots: the network against the trivial predictor and the P(k) baseline.

Inputs are CSV files with columns index, true_<param>..., pred_<param>... on the same test set
(the network's predictions, optionally the same averaged over the cube's symmetries, and
tools/pk_baseline.py's). The trivial predictor always answers the
mean of the training labels (--train-mean, or the mean of the test labels if not given).
Writes <out>/accuracy.md (table with the MLPerf metric, MAE on unit-range labels), <out>/accuracy.json
and <out>/pred_vs_true.png (one panel per parameter, network (its symmetry mean if given) and
baseline, with the diagonal). Exits 1 with one line if an input is unusable.

When the network's CSVs also carry sigma_<param> and cov_<a>_<b> columns and the validation set's
predictions are given (--network-val, --network-sym-val), a calibration report follows
(tools/calibration.py): coverage of the 68.3% / 95.4% intervals truncated to the prior (--prior,
the training labels' range), per tercile of the true value and of sigma, z, mean sigma vs RMS, the
NLL against the best constant sigma fitted on validation, the joint (Omega_M, sigma_8) regions,
the issue's targets, and coverage_curve.png and pred_vs_true_errorbars.png.

Usage: accuracy_report.py --network net.csv [--network-sym net_sym48.csv] [--network-val net_val.csv
       --network-sym-val net_val_sym48.csv --prior "lo,hi;lo,hi;lo,hi" --calibration power] --baseline pk.csv
       --train-mean "0.3,0.865,0.95" --out DIR
"""
import argparse
import csv
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import calibration as cal  # noqa: E402


def read(path):
    names, true, pred, _ = read_posterior(path)
    return names, true, pred


def read_posterior(path):
    """names, truths, means and, when the CSV has sigma_<p> and cov_<a>_<b> columns, the
    covariances (n, P, P); else None."""
    if not os.path.exists(path):
        sys.exit(f"accuracy_report.py: {path}: no such file")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"accuracy_report.py: {path}: no rows")
    names = [k[5:] for k in rows[0] if k.startswith("true_")]
    true = np.array([[float(r["true_" + n]) for n in names] for r in rows])
    pred = np.array([[float(r["pred_" + n]) for n in names] for r in rows])
    cov = None
    if all(f"cov_{a}_{b}" in rows[0] for i, a in enumerate(names) for b in names[i:]):
        p = len(names)
        cov = np.zeros((len(rows), p, p))
        for i, a in enumerate(names):
            for j in range(i, p):
                cov[:, i, j] = cov[:, j, i] = [float(r[f"cov_{a}_{names[j]}"]) for r in rows]
        if not np.all(np.isfinite(cov)) or np.any(np.diagonal(cov, axis1=1, axis2=2) <= 0):
            sys.exit(f"accuracy_report.py: {path}: a covariance is not finite or has a variance <= 0")
    return names, true, pred, cov


def metrics(true, pred, half_range):
    err = pred - true
    return {"rms": np.sqrt((err ** 2).mean(0)).tolist(),
            "mean_rel": (np.abs(err) / np.abs(true)).mean(0).tolist(),
            "mae": np.abs(err).mean(0).tolist(),
            # MLPerf HPC's metric: labels mapped to [-1, 1] over the prior range.
            "mae_unit": (np.abs(err).mean(0) / half_range).tolist()}


# The targets for the served uncertainty (docs/accuracy.md, "Uncertainties").
BANDS = {0.683: ((0.65, 0.71), (0.62, 0.74)), 0.954: ((0.93, 0.97), (0.91, 0.98))}  # overall, per tercile
SHARP = ("Omega_M", "sigma_8")  # parameters that must beat the constant sigma and stay sharp
JOINT = ("Omega_M", "sigma_8")


def terciles(key):
    """Three index sets splitting the samples by `key` into thirds."""
    order = np.argsort(key, kind="stable")
    return np.array_split(order, 3)


def calibration(names, true, mean, cov, prior, val_true, val_mean):
    """Per parameter: coverage of the 68.3/95.4% intervals truncated to the prior, overall and per
    tercile of the true value and of sigma; z mean and spread; mean sigma vs RMS; the NLL of the
    truncated posterior with the served sigma vs with the best constant sigma (fitted on the
    validation set by the same truncated likelihood; the untruncated pair, with the RMS of the
    validation errors as the constant, is kept in the JSON); plus the coverage
    of JOINT's joint regions: those of the truncated posterior (the one the marginal intervals come
    from, cal.region_pit), and for comparison the untruncated ellipses at the mean. Returns a
    JSON-able dict."""
    sigma = np.sqrt(np.diagonal(cov, axis1=1, axis2=2))
    out = {"params": {}}
    for j, n in enumerate(names):
        lo, hi = prior[j]
        u = cal.pit(true[:, j], mean[:, j], sigma[:, j], lo, hi)
        z = (mean[:, j] - true[:, j]) / sigma[:, j]
        rms = float(np.sqrt(np.mean((mean[:, j] - true[:, j]) ** 2)))
        rms_val = float(np.sqrt(np.mean((val_mean[:, j] - val_true[:, j]) ** 2)))
        const = rms_val * cal.fit_sigma_scale(val_true[:, j], val_mean[:, j], np.full(len(val_true), rms_val), lo, hi)
        entry = {"coverage": {str(q): cal.coverage(u, q) for q in cal.LEVELS},
                 "z_mean": float(z.mean()), "z_std": float(z.std()),
                 "mean_sigma": float(sigma[:, j].mean()), "rms": rms,
                 "nll": cal.truncated_nll(true[:, j], mean[:, j], sigma[:, j], lo, hi),
                 "constant_sigma": const,
                 "nll_constant": cal.truncated_nll(true[:, j], mean[:, j], np.full(len(true), const), lo, hi),
                 "nll_untruncated": cal.gaussian_nll(true[:, j], mean[:, j], sigma[:, j]),
                 "nll_constant_untruncated": cal.gaussian_nll(true[:, j], mean[:, j], np.full(len(true), rms_val)),
                 "curve": [cal.coverage(u, q) for q in CURVE_LEVELS]}
        for what, key in (("true", true[:, j]), ("sigma", sigma[:, j])):
            entry["terciles_" + what] = [{str(q): cal.coverage(u[idx], q) for q in cal.LEVELS} for idx in terciles(key)]
        if np.isfinite(lo) and np.isfinite(hi):  # the labels are drawn flat over the prior
            best = cal.flat_prior_terciles(rms / ((hi - lo) / np.sqrt(12)))
            entry["exact_posterior_terciles_true"] = [{str(q): best[q][i] for q in cal.LEVELS} for i in range(3)]
        out["params"][n] = entry
    if all(n in names for n in JOINT):
        idx = [names.index(n) for n in JOINT]
        sub = cov[:, idx][:, :, idx]
        u = cal.region_pit(true[:, idx], mean[:, idx], sub, [prior[j] for j in idx])
        out["joint"] = {"params": list(JOINT),
                        "coverage": {str(q): float(np.mean(u <= q)) for q in cal.LEVELS},
                        "coverage_ellipse_at_mean": {str(q): cal.ellipse_coverage(true[:, idx], mean[:, idx], sub, q)
                                                     for q in cal.LEVELS}}
    return out


CURVE_LEVELS = np.linspace(0.02, 0.98, 49)


def check_targets(c, rms_ratio):
    """(target, value, met) rows for the issue's Done criteria."""
    rows = []
    def band(ok_range, v):
        return ok_range[0] <= v <= ok_range[1]
    for n, e in c["params"].items():
        for q in cal.LEVELS:
            overall, third = BANDS[q]
            v = e["coverage"][str(q)]
            rows.append((f"{n}: {100 * q:.1f}% coverage in [{overall[0]}, {overall[1]}]", f"{v:.3f}", band(overall, v)))
            worst = [t[str(q)] for k in ("terciles_true", "terciles_sigma") for t in e[k]]
            lo, hi = min(worst), max(worst)
            rows.append((f"{n}: {100 * q:.1f}% coverage per tercile (true value, sigma) in [{third[0]}, {third[1]}]",
                         f"{lo:.3f}-{hi:.3f}", band(third, lo) and band(third, hi)))
        if n in SHARP:
            rows.append((f"{n}: NLL below the constant sigma's (truncated posterior)", f"{e['nll']:.4f} vs {e['nll_constant']:.4f}",
                         e["nll"] < e["nll_constant"]))
            rows.append((f"{n}: mean sigma <= 1.1 x RMS error", f"{e['mean_sigma'] / e['rms']:.3f}",
                         e["mean_sigma"] <= 1.1 * e["rms"]))
    if "joint" in c:
        for q in cal.LEVELS:
            overall, _ = BANDS[q]
            v = c["joint"]["coverage"][str(q)]
            rows.append((f"joint {'/'.join(c['joint']['params'])}: {100 * q:.1f}% region in [{overall[0]}, {overall[1]}]",
                         f"{v:.3f}", band(overall, v)))
    for n, (ratio, limit) in rms_ratio.items():
        rows.append((f"{n}: RMS / trivial no worse than {limit}", f"{ratio:.3f}", ratio <= limit))
    return rows


def calibration_markdown(title, c, factors=None):
    lines = [f"### {title}", ""]
    if factors is not None:
        lines += ["Sigma recalibrated on the validation set (sigma -> s r (sigma / r)^b exp(e u^2)): " +
                  ", ".join(f"{n} s {f['scale']:.3f}, b {f['exponent']:.2f}" + (f", e {f['edge']:.2f}" if "edge" in f else "")
                            for n, f in factors.items() if n != "joint")
                  + (f"; joint ({', '.join(factors['joint']['params'])}) covariance x {factors['joint']['factor']:.3f}"
                     " (in the factors)" if "joint" in factors else ""), ""]
    lines += ["| parameter | 68.3% | 95.4% | 68.3% by true tercile | 68.3% by sigma tercile | 95.4% by true tercile | "
              "95.4% by sigma tercile | z mean | z std | mean sigma | RMS error | sigma / RMS | NLL | NLL, constant sigma | "
              "untruncated NLL | untruncated, constant = RMS |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, e in c["params"].items():
        t = lambda k, q: " / ".join(f"{x[str(q)]:.3f}" for x in e[k])  # noqa: E731
        lines.append(f"| {n} | {e['coverage']['0.683']:.3f} | {e['coverage']['0.954']:.3f} | {t('terciles_true', 0.683)} | "
                     f"{t('terciles_sigma', 0.683)} | {t('terciles_true', 0.954)} | {t('terciles_sigma', 0.954)} | "
                     f"{e['z_mean']:+.3f} | {e['z_std']:.3f} | {e['mean_sigma']:.4f} | {e['rms']:.4f} | "
                     f"{e['mean_sigma'] / e['rms']:.3f} | {e['nll']:.4f} | {e['nll_constant']:.4f} | "
                     f"{e['nll_untruncated']:.4f} | {e['nll_constant_untruncated']:.4f} |")
    best = {n: e["exact_posterior_terciles_true"] for n, e in c["params"].items() if "exact_posterior_terciles_true" in e}
    if best:
        lines += ["", "What the exact posterior of a flat prior reaches by true-value tercile at each parameter's "
                      "information level (its RMS error over the prior's standard deviation; 68.3% / 95.4%): " +
                  "; ".join(f"{n} " + " / ".join(f"{t['0.683']:.2f}" for t in b) + ", " +
                            " / ".join(f"{t['0.954']:.2f}" for t in b) for n, b in best.items()) + "."]
    if "joint" in c:
        j = c["joint"]
        e = j["coverage_ellipse_at_mean"]
        lines += ["", f"Joint ({', '.join(j['params'])}) region coverage (truncated posterior): 68.3%: "
                      f"{j['coverage']['0.683']:.3f}, 95.4%: {j['coverage']['0.954']:.3f}; untruncated ellipse at the "
                      f"mean: 68.3%: {e['0.683']:.3f}, 95.4%: {e['0.954']:.3f}."]
    return lines + [""]


# Today's network on the default study (docs/accuracy.md): RMS / trivial of the 48-symmetry mean.
BASELINE_RMS_RATIO = {"Omega_M": 0.211, "sigma_8": 0.176, "n_s": 0.943}


def parse_ratio_targets(text):
    """{parameter: RMS / trivial limit} from --trivial-ratio-targets."""
    if text == "default":
        return BASELINE_RMS_RATIO
    if text == "none":
        return {}
    try:
        return {n: float(v) for n, v in (part.split(":") for part in text.split(","))}
    except ValueError:
        sys.exit(f"accuracy_report.py: --trivial-ratio-targets {text}: expected default, none or NAME:LIMIT,...")


def parse_prior(text, names, true):
    """[(low, high)] per parameter from "lo,hi;lo,hi;..." (the training labels' range), else the
    test truths' range."""
    if not text:
        return [(float(true[:, j].min()), float(true[:, j].max())) for j in range(len(names))]
    pairs = [[float(v) for v in part.split(",")] for part in text.split(";")]
    if len(pairs) != len(names) or any(len(p) != 2 or not p[0] < p[1] for p in pairs):
        sys.exit(f"accuracy_report.py: --prior needs low,high with low < high for each of {len(names)} parameters")
    return [tuple(p) for p in pairs]


def recalibrate(form, names, prior, vtrue, vmean, vcov, mean, cov):
    """The trainer's --calibration `form` (power, power-joint or power-edge; core/nn/uncertainty.cc's
    FitCalibration) fitted on the validation posteriors and applied to the test covariances.
    Returns (calibrated cov, {name: {scale, exponent, reference[, edge]}[, joint: ...]})."""
    vsigma = np.sqrt(np.diagonal(vcov, axis1=1, axis2=2))
    fits = [cal.fit_sigma_power(vtrue[:, j], vmean[:, j], vsigma[:, j], *prior[j]) for j in range(len(names))]
    s, b, r = (np.array(v) for v in zip(*fits))
    e = np.zeros(len(names))
    block, k = [], 1.0
    if form == "power-joint":
        vf = cal.power_factors(vsigma, s, b, r)
        block, k = cal.fit_joint_factor(vtrue, vmean, vcov * vf[:, :, None] * vf[:, None, :], prior)
        s[block] *= np.sqrt(k)
    if form == "power-edge":
        vs = vsigma * cal.power_factors(vsigma, s, b, r)
        for j in cal.narrow_outputs(vs, prior):
            if math.isfinite(prior[j][1] - prior[j][0]):
                kj, e[j] = cal.fit_sigma_edge(vtrue[:, j], vmean[:, j], vs[:, j], *prior[j])
                s[j] *= kj
    sigma = np.sqrt(np.diagonal(cov, axis1=1, axis2=2))
    u = np.stack([cal.edge_coordinate(mean[:, j], *prior[j]) if math.isfinite(prior[j][1] - prior[j][0])
                  else np.zeros(len(mean)) for j in range(len(names))], axis=1)
    f = cal.power_factors(sigma, s, b, r) * np.exp(e * u * u)
    factors = {n: {"scale": float(s[j]), "exponent": float(b[j]), "reference": float(r[j])} for j, n in enumerate(names)}
    if form == "power-edge":
        for j, n in enumerate(names):
            factors[n]["edge"] = float(e[j])
    if block:
        factors["joint"] = {"params": [names[j] for j in block], "factor": k}
    return cov * f[:, :, None] * f[:, None, :], factors


def uncertainty_reports(args, names, true, prior, posteriors):
    """The calibration of every predictor that has a covariance: the served one (identity, with the
    checkpoint's calibration) and the symmetry mixture (recalibrated on the validation set here,
    since the server never saw that predictor). Returns ({key: report}, markdown lines, factors)."""
    reports, lines, factors = {}, [], {}
    for key, title, test_path, val_path, refit in (
            ("served", "Served posterior (identity, as the server answers)", args.network, args.network_val, False),
            ("symmetry_mixture", "Mixture over the cube's symmetries, recalibrated on validation",
             args.network_sym, args.network_sym_val, True)):
        if not test_path or not val_path:
            continue
        _, _, mean, cov = posteriors(test_path, "test")
        vnames, vtrue, vmean, vcov = read_posterior(val_path)
        if cov is None or vcov is None or vnames != names:
            continue
        if refit:
            cov, factors[key] = recalibrate(args.calibration, names, prior, vtrue, vmean, vcov, mean, cov)
        reports[key] = calibration(names, true, mean, cov, prior, vtrue, vmean)
        reports[key]["mean"], reports[key]["cov"] = mean, cov  # for the plots, dropped from the JSON
        lines += calibration_markdown(title, reports[key], factors.get(key))
    return reports, lines, factors


def plot_uncertainty(names, true, prior, reports, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="ideal")
    for key, style in (("served", "-"), ("symmetry_mixture", ":")):
        if key not in reports:
            continue
        for j, n in enumerate(names):
            ax.plot(CURVE_LEVELS, reports[key]["params"][n]["curve"], style, color=f"C{j}",
                    label=f"{n} ({'served' if key == 'served' else 'symmetry mixture'})")
    ax.set_xlabel("expected coverage (central interval, truncated to the prior)")
    ax.set_ylabel("observed coverage on the test set")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "coverage_curve.png"), dpi=110)
    key = "served" if "served" in reports else next(iter(reports))
    mean, cov = reports[key]["mean"], reports[key]["cov"]
    sigma = np.sqrt(np.diagonal(cov, axis1=1, axis2=2))
    show = np.random.default_rng(0).permutation(len(true))[:300]  # legible: a fixed subsample
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4.2))
    for j, n in enumerate(names):
        ax = axes[j] if len(names) > 1 else axes
        lo, hi = cal.interval(mean[show, j], sigma[show, j], *prior[j], 0.683)
        # A mean outside the prior range lies outside its truncated interval: the bar then starts at
        # the mean's side of the range (no negative lengths).
        yerr = [np.maximum(mean[show, j] - lo, 0), np.maximum(hi - mean[show, j], 0)]
        ax.errorbar(true[show, j], mean[show, j], yerr=yerr, fmt="o", ms=2,
                    lw=0.5, alpha=0.6, label="68.3% interval (truncated to the prior)")
        ax.plot(prior[j], prior[j], "k--", lw=1)
        ax.set_xlabel(f"true {n}")
        ax.set_ylabel(f"predicted {n}")
        ax.set_title(f"{n}: {len(show)} of {len(true)} test cubes")
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pred_vs_true_errorbars.png"), dpi=110)


def plot_predictions(names, true, net, sym, base, results, out):
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
    fig.savefig(os.path.join(out, "pred_vs_true.png"), dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", required=True)
    ap.add_argument("--network-sym", help="the network's predictions averaged over the cube's symmetries")
    ap.add_argument("--network-val", help="the network's predictions on the validation set (calibration)")
    ap.add_argument("--network-sym-val", help="the same averaged over the symmetries")
    ap.add_argument("--prior", help="lo,hi;lo,hi;... per parameter: the training labels' range")
    ap.add_argument("--baseline")
    ap.add_argument("--train-mean")
    ap.add_argument("--trivial-ratio-targets", default="default",
                    help="RMS / trivial limits of the target table: default (the default study's "
                         f"{BASELINE_RMS_RATIO}), none, or NAME:LIMIT,...")
    ap.add_argument("--calibration", default="power-edge", choices=("power", "power-joint", "power-edge"),
                    help="the form the symmetry mixture is recalibrated with (the trainer's --calibration)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    names, true, net, _ = read_posterior(args.network)
    prior = parse_prior(args.prior, names, true)
    half = np.array([(hi - lo) / 2 for lo, hi in prior])
    results = {"network": metrics(true, net, half)}

    def posteriors(path, what):
        """A CSV that must cover the same test cubes as the network's."""
        onames, otrue, pred, cov = read_posterior(path)
        if onames != names or otrue.shape != true.shape or not np.allclose(otrue, true, rtol=1e-4):
            sys.exit(f"accuracy_report.py: the network and {what} CSVs are not on the same test set")
        return onames, otrue, pred, cov

    base = posteriors(args.baseline, "baseline")[2] if args.baseline else None
    if base is not None:
        results["pk_baseline"] = metrics(true, base, half)
    sym = posteriors(args.network_sym, "symmetry-averaged")[2] if args.network_sym else None
    if sym is not None:
        results["network_sym"] = metrics(true, sym, half)
    mean = (np.array([float(v) for v in args.train_mean.split(",")]) if args.train_mean else true.mean(0))
    if len(mean) != len(names):
        sys.exit(f"accuracy_report.py: --train-mean has {len(mean)} values for {len(names)} parameters")
    results["trivial"] = metrics(true, np.tile(mean, (len(true), 1)), half)
    results["params"] = names
    results["test_samples"] = len(true)
    results["prior"] = prior

    lines = [f"Test set: {len(true)} cubes.", "",
             "| parameter | predictor | RMS error | mean relative error | RMS / trivial RMS | MAE (unit range) |",
             "|---|---|---|---|---|---|"]
    for j, n in enumerate(names):
        for who in ["network", "network_sym", "pk_baseline", "trivial"]:
            if who not in results:
                continue
            m = results[who]
            ratio = m["rms"][j] / results["trivial"]["rms"][j]
            lines.append(f"| {n} | {who} | {m['rms'][j]:.4f} | {100 * m['mean_rel'][j]:.2f}% | {ratio:.3f} | "
                         f"{m['mae_unit'][j]:.4f} |")
    lines += ["", "MLPerf HPC metric (MAE of labels on the unit range [-1, 1] of the prior, mean over parameters; "
                  "target 0.124): " + ", ".join(f"{who} {np.mean(results[who]['mae_unit']):.4f}"
                                              for who in ["network", "network_sym", "pk_baseline", "trivial"]
                                              if who in results), ""]

    reports, unc_lines, factors = uncertainty_reports(args, names, true, prior, posteriors)
    if reports:
        key = "network_sym" if "network_sym" in results else "network"
        limits = parse_ratio_targets(args.trivial_ratio_targets)
        ratios = {n: (results[key]["rms"][j] / results["trivial"]["rms"][j], limits[n])
                  for j, n in enumerate(names) if n in limits}
        lines += ["## Uncertainties", "", f"Intervals are central and truncated to the prior {prior}.", ""] + unc_lines
        for rkey, rep in reports.items():
            rows = check_targets(rep, ratios)
            rep["targets"] = [{"target": t, "value": v, "met": bool(ok)} for t, v, ok in rows]
            lines += [f"Targets ({rkey}; RMS of the {key} mean):", "", "| target | value | met? |", "|---|---|---|"]
            lines += [f"| {t} | {v} | {'met' if ok else '**missed**'} |" for t, v, ok in rows] + [""]
        results["uncertainty"] = {k: {kk: vv for kk, vv in r.items() if kk not in ("mean", "cov")} for k, r in reports.items()}
        results["uncertainty_refit_factors"] = factors
    with open(os.path.join(args.out, "accuracy.json"), "w") as f:
        json.dump(results, f, indent=1)
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "accuracy.md"), "w") as f:
        f.write(table)
    print(table)
    plot_predictions(names, true, net, sym, base, results, args.out)
    written = "accuracy.md, accuracy.json, pred_vs_true.png"
    if reports:
        plot_uncertainty(names, true, prior, reports, args.out)
        written += ", coverage_curve.png, pred_vs_true_errorbars.png"
    print(f"accuracy_report.py: wrote {args.out}/{written}", file=sys.stderr)


if __name__ == "__main__":
    main()
