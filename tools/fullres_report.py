#!/usr/bin/python3
"""The full-resolution study's report (tools/fullres_study.sh).

    fullres_report.py real --universes REAL_UNIVERSES.csv --md REAL_CUBES.md --json REAL_CUBES.json
                           [--baseline-pred PK_REAL.csv --baseline-test PK_TEST.csv]
        Appends the real cubes' table to REAL_CUBES.md (which the study began with the served
        model's checksum before any real cube was imported) and writes REAL_CUBES.json: per cube,
        prediction +- sigma against truth for every parameter, the standardised residuals
        z = (pred - true) / sigma of Omega_M and sigma_8, their chi-square over all cubes against
        the 95% point of chi-square with 2 x cubes degrees of freedom (12.6 for 3 cubes), and the
        largest |z| against 3. Sigma is as served and averaged (never rescaled here). With
        --baseline-pred PK_REAL.csv --baseline-test PK_TEST.csv the P(k) baseline's predictions of
        the same cubes get the same test, with sigma = the baseline's RMS error on the test set.

    fullres_report.py summary --dir OUT
        Writes OUT/report.md and OUT/report.json from OUT/study.json (settings), OUT/test/,
        OUT/test-pieces/ (when the study has test pieces) and OUT/robust/accuracy.json
        (tools/accuracy_report.py on the held-out and the robustness universes),
        OUT/model_info.json and OUT/real_cubes.{md,json} (or OUT/real_cubes.md's skip line):
        RMS of network, P(k) baseline and trivial predictor per parameter, the baseline / network
        RMS ratio against the target 1.5 for Omega_M and sigma_8, the MLPerf metric (MAE
        on unit-range labels over all four parameters, target 0.124), the calibration summary
        (68.3% / 95.4% coverage overall and per tercile), then the served model, then the real cubes.
Exit status 0 done, 1 an input missing or unusable (one line on stderr).
"""
import argparse
import csv
import json
import math
import os
import sys

import numpy as np
from scipy.stats import chi2

RATIO_TARGET = 1.5          # P(k) baseline RMS / network RMS, issue 19
RATIO_PARAMS = ("Omega_M", "sigma_8")
MLPERF_TARGET = 0.124       # MLPerf HPC CosmoFlow: MAE on unit-range labels
REAL_PARAMS = ("Omega_M", "sigma_8")


def fail(msg):
    print(f"fullres_report.py: {msg}", file=sys.stderr)
    sys.exit(1)


def load_json(path):
    if not os.path.exists(path):
        fail(f"{path}: no such file")
    with open(path) as f:
        return json.load(f)


def read_rows(path, needed):
    if not os.path.exists(path):
        fail(f"{path}: no such file")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows or not all(c in rows[0] for c in needed):
        fail(f"{path}: no rows, or not all of the columns {', '.join(needed)}")
    return rows


def residuals(cubes, where):
    """The chi-square test of REAL_PARAMS' standardised residuals over `cubes` (entries with params)."""
    zs = np.array([c["params"][n]["z"] for c in cubes for n in REAL_PARAMS])
    if not np.all(np.isfinite(zs)):
        fail(f"{where}: a standardised residual is not finite")
    dof = len(zs)
    limit = float(chi2.ppf(0.95, dof))
    result = {"cubes": cubes, "residual_params": list(REAL_PARAMS), "chi2": float(np.sum(zs ** 2)), "dof": dof,
              "chi2_limit_95": limit, "p_value": float(chi2.sf(np.sum(zs ** 2), dof)),
              "max_abs_z": float(np.max(np.abs(zs)))}
    result["chi2_met"] = result["chi2"] < limit
    result["max_z_met"] = result["max_abs_z"] <= 3
    return result


def residual_lines(result, names):
    """The table of pred +- sigma (true) and z per cube, and the chi-square sentence."""
    lines = ["| cube | " + " | ".join(f"{n}: pred ± sigma (true)" for n in names) + " | " +
             " | ".join(f"z {n}" for n in REAL_PARAMS) + " |",
             "|---|" + "---|" * (len(names) + len(REAL_PARAMS))]
    for c in result["cubes"]:
        lines.append(f"| {c['cube']} | " + " | ".join(
            f"{c['params'][n]['pred']:.4g} ± {c['params'][n]['sigma']:.2g} ({c['params'][n]['true']:.4g})" for n in names) +
            " | " + " | ".join(f"{c['params'][n]['z']:+.2f}" for n in REAL_PARAMS) + " |")
    dof, limit = result["dof"], result["chi2_limit_95"]
    return lines + ["", f"Chi-square of the {dof} standardised residuals ({', '.join(REAL_PARAMS)}): {result['chi2']:.2f} "
                        f"(95% point of chi-square({dof}): {limit:.1f}; p = {result['p_value']:.3g}): "
                        f"{'met' if result['chi2_met'] else '**missed**'}. Largest |z|: {result['max_abs_z']:.2f} "
                        f"(limit 3): {'met' if result['max_z_met'] else '**missed**'}.", ""]


def baseline_on_real(pred_path, test_path, names):
    """The P(k) baseline's residuals on the real cubes, with sigma = its RMS error on the test set: the
    baseline has no per-prediction uncertainty, and its test RMS is fixed before any real cube is seen."""
    cols = [f"{w}_{n}" for n in names for w in ("true", "pred")]
    test, rows = read_rows(test_path, cols), read_rows(pred_path, cols)
    rms = {n: float(np.sqrt(np.mean([(float(r["pred_" + n]) - float(r["true_" + n])) ** 2 for r in test])))
           for n in names}
    cubes = [{"cube": int(r.get("index", i)), "params": {
        n: {"true": float(r["true_" + n]), "pred": float(r["pred_" + n]), "sigma": rms[n],
            "z": (float(r["pred_" + n]) - float(r["true_" + n])) / rms[n]} for n in names}}
        for i, r in enumerate(rows)]
    result = residuals(cubes, pred_path)
    result["sigma_from"] = f"RMS error on the {len(test)} test universes"
    return result


def real(args):
    rows = read_rows(args.universes, [f"sigma_{n}" for n in REAL_PARAMS])
    names = [k[5:] for k in rows[0] if k.startswith("true_")]
    cubes = []
    for r in rows:
        entry = {"cube": int(r["group"]), "subcubes": int(r["subcubes"]), "combine": r["combine"], "params": {}}
        for n in names:
            t, p, s = float(r["true_" + n]), float(r["pred_" + n]), float(r["sigma_" + n])
            entry["params"][n] = {"true": t, "pred": p, "sigma": s, "z": (p - t) / s}
        cubes.append(entry)
    result = residuals(cubes, args.universes)
    rho = cubes[0]["combine"].partition("rho=")[2] or cubes[0]["combine"]
    lines = ["", f"Each cube predicted as its {cubes[0]['subcubes']} sub-cubes, averaged with the combined covariance "
                 f"(error correlation between sub-cubes rho = {rho}, fitted on the validation universes); sigma as "
                 "served, never rescaled after seeing the real cubes.", ""] + residual_lines(result, names)
    if bool(args.baseline_pred) != bool(args.baseline_test):
        fail("--baseline-pred and --baseline-test go together")
    if args.baseline_pred:
        base = baseline_on_real(args.baseline_pred, args.baseline_test, names)
        result["pk_baseline"] = base
        lines += ["The P(k) baseline (the ridge fit of the study's baseline, on each real cube's full spectra) for "
                  f"comparison, with sigma = its {base['sigma_from']}:", ""] + residual_lines(base, names)
    with open(args.md, "a") as f:
        f.write("\n".join(lines))
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print("\n".join(lines))


def summarise(acc, label):
    """Markdown lines and a JSON dict for one set of universes from accuracy_report.py's JSON."""
    names = acc["params"]
    net, base, triv = acc["network"], acc.get("pk_baseline"), acc["trivial"]
    out = {"universes": acc["test_samples"], "params": {}, "mlperf_metric": {}}
    lines = [f"### {label}: {acc['test_samples']} universes", "",
             "| parameter | network RMS | P(k) baseline RMS | trivial RMS | network / trivial | baseline / network | target | met? |",
             "|---|---|---|---|---|---|---|---|"]
    for j, n in enumerate(names):
        ratio = base["rms"][j] / net["rms"][j] if base else math.nan
        target = RATIO_TARGET if n in RATIO_PARAMS else None
        met = None if target is None else bool(ratio >= target)
        out["params"][n] = {"network_rms": net["rms"][j], "baseline_rms": base["rms"][j] if base else None,
                            "trivial_rms": triv["rms"][j], "baseline_over_network": ratio,
                            "target": target, "met": met}
        lines.append(f"| {n} | {net['rms'][j]:.4g} | {base['rms'][j] if base else math.nan:.4g} | {triv['rms'][j]:.4g} | "
                     f"{net['rms'][j] / triv['rms'][j]:.3f} | {ratio:.2f}x | "
                     f"{'>= %.1fx' % target if target else ''} | "
                     f"{'' if met is None else ('met' if met else '**missed**')} |")
    for who in ("network", "pk_baseline", "trivial"):
        if who in acc:
            out["mlperf_metric"][who] = float(np.mean(acc[who]["mae_unit"]))
    lines += ["", f"MLPerf metric (MAE on unit-range labels, mean over {', '.join(names)}; target {MLPERF_TARGET}): " +
              ", ".join(f"{who} {v:.4f}" for who, v in out["mlperf_metric"].items()) +
              f" ({'met' if out['mlperf_metric']['network'] <= MLPERF_TARGET else '**missed**'} by the network).", ""]
    unc = acc.get("uncertainty", {}).get("served")
    if unc:
        lines += ["Calibration of the averaged posterior (68.3% / 95.4% coverage of intervals truncated to the prior; "
                  "per tercile: the range over the terciles of the true value and of sigma):", "",
                  "| parameter | 68.3% | 95.4% | 68.3% per tercile | 95.4% per tercile | mean sigma / RMS |",
                  "|---|---|---|---|---|---|"]
        out["calibration"] = {}
        for n, e in unc["params"].items():
            ter = {q: [t[q] for k in ("terciles_true", "terciles_sigma") for t in e[k]] for q in ("0.683", "0.954")}
            out["calibration"][n] = {"coverage": e["coverage"], "tercile_range": {q: [min(v), max(v)] for q, v in ter.items()},
                                     "sigma_over_rms": e["mean_sigma"] / e["rms"]}
            lines.append(f"| {n} | {e['coverage']['0.683']:.3f} | {e['coverage']['0.954']:.3f} | "
                         f"{min(ter['0.683']):.3f}-{max(ter['0.683']):.3f} | {min(ter['0.954']):.3f}-{max(ter['0.954']):.3f} | "
                         f"{e['mean_sigma'] / e['rms']:.3f} |")
        if "joint" in unc:
            j = unc["joint"]
            out["calibration"]["joint"] = j
            lines += ["", f"Joint ({', '.join(j['params'])}) ellipses: {j['coverage']['0.683']:.3f} (68.3%), "
                          f"{j['coverage']['0.954']:.3f} (95.4%)."]
        missed = [t["target"] for t in unc.get("targets", []) if not t["met"]]
        out["calibration_targets_missed"] = missed
        lines += ["", f"Calibration targets: {len(unc.get('targets', [])) - len(missed)} of {len(unc.get('targets', []))} "
                      "met (each in the accuracy.md linked below).", ""]
    return lines, out


def elapsed_line(study):
    minutes = study.get("elapsed_s", 0) / 60
    if study.get("trained", 1) == 0:
        return f"Elapsed: {minutes:.1f} minutes, the training reused from an earlier run of these settings (TRAIN=0)."
    return f"Elapsed: {minutes:.1f} minutes (estimated {study.get('estimate_s', 0) / 60:.0f} minutes on 2 idle cores)."


def summary(args):
    d = args.dir
    study = load_json(os.path.join(d, "study.json"))
    report = {"study": study, "sets": {}}
    synth_args = study.get("synth_args", "")
    side, parent = study.get("side", 128), study.get("parent_side", study.get("side", 128))
    made = f"`synth --preset mlperf{' ' + synth_args if synth_args else ''}`"
    if parent != side:
        made += f", each parent of {parent}^3 cut into {(parent // side) ** 3} universes of {side}^3"
    evolution = f"`{synth_args}`" if synth_args else "the preset's evolution"
    twin = study.get("train_twin_args", "")
    twin_note = (f" Each training universe is also generated with `{twin}` added (the same seed: the same cosmology "
                 f"and initial phases), and the network and the baseline train on both ({2 * study['n_train']} "
                 f"universes).") if twin else ""
    pp = study.get("pieces_parent_side", 0)
    if pp:
        twin_note += (f" The validation universes are {side}^3 pieces of {pp}^3 parents (each with its own mean density, as "
                      f"the real cubes have), and {study.get('n_train_pieces', 0)} such pieces join the training "
                      f"universes; the baseline of the periodic sets is fitted on the periodic ones only.")
        if study.get("n_test_pieces", 0):
            twin_note += (f" A second test set holds {study['n_test_pieces']} such pieces of other parents, the kind of "
                          f"universe the served sigma is calibrated for, read by a baseline fitted on every training "
                          f"universe.")
    bn = study.get("bn_statistics_batches", 0)
    bn_note = f", batch_norm statistics recomputed from {bn} training batches at each epoch end" if bn else ""
    lines = ["# Full-resolution study", "",
             f"{study['n_train']} training, {study['n_val']} validation and {study['n_test']} test universes of "
             f"{made} (voxels of 1 Mpc/h at H0 = 70, z = 0, 0.5, 1.5, 3), and "
             f"{study['n_robust']} robustness universes evolved with `{study['robust_args']}`; each cut into "
             f"{study['subcubes_per_universe']} sub-cubes of {study['sub_side']}^3.{twin_note} Network `{study['spec']}`, "
             f"{study['members']} member(s) x {study['epochs']} epochs, {study['precision']}, 2 MPI ranks x batch "
             f"{study['batch']}{bn_note}. Predictions averaged per universe over its sub-cubes with the combined "
             f"covariance ({study['combine']}, fitted on the validation universes). P(k) baseline: ridge regression "
             f"on the full {side}^3 cubes' per-redshift spectra and cross-spectra. Trivial predictor: the training mean.",
             "", elapsed_line(study), "",
             "## Held-out synthetic universes", ""]
    sets = [("test", f"Test set ({evolution})", "test")]
    if study.get("n_test_pieces", 0):
        sets.append(("test_pieces", f"Test pieces ({side}^3 of {pp}^3 parents; the baseline fitted on every training "
                                    f"universe, pieces included)", "test-pieces"))
    sets.append(("robust", f"Robustness set (`{study['robust_args']}`)", "robust"))
    for key, label, sub in sets:
        acc = load_json(os.path.join(d, sub, "accuracy.json"))
        part, report["sets"][key] = summarise(acc, label)
        lines += part + [f"Tables: [{sub}/accuracy.md]({sub}/accuracy.md); plots: "
                         f"[predicted vs true with 68.3% error bars]({sub}/pred_vs_true_errorbars.png), "
                         f"[coverage curve]({sub}/coverage_curve.png), [network and baseline]({sub}/pred_vs_true.png).", ""]
    info = load_json(os.path.join(d, "model_info.json"))
    report["model"] = {k: info.get(k) for k in ("version", "checksum", "ensemble_members", "member_checkpoints")}
    report["model"]["manifest_sha256"] = study.get("manifest_sha256")
    lines += ["## Real cubes", ""]
    real_md = os.path.join(d, "real_cubes.md")
    if not os.path.exists(real_md):
        fail(f"{real_md}: no such file")
    with open(real_md) as f:
        lines += [f.read().rstrip(), ""]
    real_json = os.path.join(d, "real_cubes.json")
    report["real_cubes"] = load_json(real_json) if os.path.exists(real_json) else None
    with open(os.path.join(d, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("real")
    r.add_argument("--universes", required=True)
    r.add_argument("--md", required=True)
    r.add_argument("--json", required=True)
    r.add_argument("--baseline-pred", help="the P(k) baseline's predictions of the real cubes (pk_baseline.py)")
    r.add_argument("--baseline-test", help="its predictions of the test set, whose RMS is its sigma")
    s = sub.add_parser("summary")
    s.add_argument("--dir", required=True)
    a = ap.parse_args()
    real(a) if a.what == "real" else summary(a)


if __name__ == "__main__":
    main()
