#!/usr/bin/env python3
"""Where do the real MLPerf CosmoFlow cubes sit among synthetic universes at their own parameters?

    /usr/bin/python3 tools/compare_real.py --real REAL.h5 --out DIR [--members 32] [--seed 1000]
        [--synth build/synth/synth] [--synth-args "--pm-steps 20"] [--side S] [--indices 0,2]
        [--kmax 1.5] [--pk-bins 10] [--taper 0] [--threads N]
        [--parent-side P] [--address HOST:PORT [--sub-side S] [--bin B]]
        [--subcubes build/synth/cosmoflow-subcubes]

REAL.h5 is a shard written by cosmoflow-import (labels Omega_M, sigma_8, n_s, H0 and each cube's
box side in /sample/box_size_mpc_h). For each real cube, `synth --preset mlperf` generates
--members universes at that cube's true parameters (same seed, sample indices 0..M-1, so members
differ only by their initial fields; the ensemble file is reused when its command is unchanged),
and each channel of the real cube is tested against the ensemble:

- P(k) of the count contrast (log P in --pk-bins log bins up to --kmax h/Mpc, shot noise
  included) as ONE chi-square with the ensemble's covariance (Hartlap-corrected; the exact
  Hotelling p-value too): cosmo_stats.ensemble_chi2;
- the counts-in-voxel PDF (fractions in cosmo_stats.PDF_EDGES bins, the sparse tail pooled and
  dropped: cosmo_stats.pdf_chi2), the same chi-square: voxel counts are correlated in space, so a
  multinomial test would overstate the evidence, while the ensemble's covariance carries it;
- the empty-voxel fraction: percentile in the ensemble and z-score;
- the skewness of the contrast smoothed by Gaussians of 1, 2 and 4 Mpc/h: z-scores and their
  joint chi-square;
and, per cube, the correlation between channels (Pearson, contrasts smoothed at 2 Mpc/h) for the
pairs (z=0, 0.5), (0.5, 1.5), (1.5, 3), (0, 3): z-scores and the joint chi-square.

--parent-side P makes every member a side^3 piece of a P^3 parent (cut by cosmoflow-subcubes, the
first M pieces of ceil(M / (P/side)^3) parents), as the real cubes are 128^3 pieces of 512^3 boxes
with their own mean density; pieces of one parent share its large-scale modes, so the ensemble's
spread is measured with fewer independent draws than M.

--side S (< the cube side) compares the corner S^3 sub-box of each real cube with S^3 synthetic
boxes (the toy mode of the ctest test). --taper F multiplies every contrast by a 3-D Tukey
window (cosine over a fraction F of each axis) before P(k), for a P(k) insensitive to the real
cubes' non-periodic edges.

With --address HOST:PORT (a running cosmoflow-server) the served network is one more statistic:
the real cube and every ensemble member are cut as its training data were (cosmoflow-subcubes
with --sub-side and --bin; the whole cube, unbinned, by default), predicted through the server and
averaged per universe; per output the real cube's prediction is placed in the ensemble's
predictions (z-score, percentile, and one chi-square over all outputs with the ensemble's
covariance), and the ensemble's mean against the truth shows the network's own bias at those
parameters. A real cube the network misreads while the ensemble at its parameters is read right
holds something the synthetic universes do not.

Writes DIR/real_cubes.md (table), DIR/real_cubes.csv, DIR/real_cubes.json and one
DIR/real-<index>.png per real cube (real P(k) and PDF over the ensemble's 2.5-97.5% band); with
--address also DIR/network.md (the network's table alone) and the cut inputs in DIR/network/.
Progress goes to stderr. Exit status: 0 done, 1 a failure (one line on stderr), 2 bad usage.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cosmo_stats as cs  # noqa: E402

SKEW_RADII = (1.0, 2.0, 4.0)
CORR_RADIUS = 2.0
CORR_PAIRS = ((0, 1), (1, 2), (2, 3), (0, 3))
P_THRESHOLD = 0.01


class Failure(Exception):
    pass


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--real", required=True, help="shard from cosmoflow-import")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--members", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--synth", default="build/synth/synth")
    ap.add_argument("--synth-args", default="", help="extra synth flags (override the preset)")
    ap.add_argument("--side", type=int, default=0, help="compare S^3 corner sub-boxes (toy mode)")
    ap.add_argument("--indices", default="", help="real cubes to compare (default all)")
    ap.add_argument("--kmax", type=float, default=1.5)
    ap.add_argument("--pk-bins", type=int, default=10)
    ap.add_argument("--taper", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=0, help="synth --threads (default all)")
    ap.add_argument("--address", default="", help="a cosmoflow-server: its network as a statistic")
    ap.add_argument("--sub-side", type=int, default=0, help="the network's input side (default: whole cube)")
    ap.add_argument("--bin", type=int, default=1, help="voxels summed in bin^3 blocks before cutting")
    ap.add_argument("--subcubes", default="build/synth/cosmoflow-subcubes")
    ap.add_argument("--parent-side", type=int, default=0,
                    help="members are side^3 pieces of parents of this side (their own mean density)")
    a = ap.parse_args(argv)
    if a.address and a.members < 7:
        ap.error(f"--members {a.members} is too few for the network's 4 outputs (need 7)")
    if a.parent_side < 0:
        ap.error("--parent-side must be >= 0")
    if a.sub_side < 0 or a.bin < 1:
        ap.error("--sub-side must be >= 0 and --bin >= 1")
    if a.members < a.pk_bins + 4:
        ap.error(f"--members {a.members} is too few for {a.pk_bins} P(k) bins (need bins + 4)")
    if not 0 <= a.taper < 1:
        ap.error("--taper must be in [0, 1)")
    return a


def load_real(path, indices, side):
    """[(index, counts (C, n, n, n), params dict, box)] from an imported shard."""
    if not os.path.exists(path):
        raise Failure(f"{path}: no such file")
    with h5py.File(path, "r") as f:
        names = [n.decode() if isinstance(n, bytes) else n for n in f.attrs["param_names"]]
        if names != ["Omega_M", "sigma_8", "n_s", "H0"]:
            raise Failure(f"{path}: labels {names}, expected Omega_M, sigma_8, n_s, H0 (cosmoflow-import)")
        if "sample/box_size_mpc_h" not in f:
            raise Failure(f"{path}: no /sample/box_size_mpc_h (import it with this cosmoflow-import)")
        boxes = f["sample/box_size_mpc_h"][:]
        n_cubes = f["cubes"].shape[0]
        chosen = indices if indices else list(range(n_cubes))
        out = []
        for i in chosen:
            if not 0 <= i < n_cubes:
                raise Failure(f"{path}: cube index {i} out of range [0, {n_cubes})")
            cube = f["cubes"][i]
            n = cube.shape[-1]
            s = side if side else n
            if s > n:
                raise Failure(f"--side {s} is larger than the real cubes ({n})")
            params = dict(zip(names, (float(v) for v in f["params"][i])))
            out.append((i, cube[:, :s, :s, :s], params, float(boxes[i]) * s / n))
        return out


def synth_command(a, params, side, out):
    cmd = [a.synth, "--preset", "mlperf", "--out", out, "--samples", str(a.members),
           "--seed", str(a.seed), "--side", str(side), "--quiet",
           "--omega-m", repr(params["Omega_M"]), "--sigma-8", repr(params["sigma_8"]),
           "--n-s", repr(params["n_s"]), "--h0", repr(params["H0"])]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    return cmd + shlex.split(a.synth_args)


def generate(a, params, side, path):
    """Writes the ensemble file: M periodic universes, or (--parent-side) the pieces of enough
    parent universes for M, cut by cosmoflow-subcubes (the parents' file is removed)."""
    if not a.parent_side:
        cmds = [synth_command(a, params, side, path)]
    else:
        pieces = (a.parent_side // side) ** 3
        parents = path + ".parents.h5"
        synth = synth_command(a, params, a.parent_side, parents)
        synth[synth.index("--samples") + 1] = str(-(-a.members // pieces))
        cmds = [synth, [a.subcubes, "--in", parents, "--out", path, "--side", str(side), "--quiet"]]
    for cmd in cmds:
        print(f"compare_real:   {' '.join(cmd)}", file=sys.stderr, flush=True)
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise Failure(f"{os.path.basename(cmd[0])} failed (status {r.returncode}): {r.stderr.strip()}")
    if a.parent_side:
        os.remove(path + ".parents.h5")


def ensemble(a, index, params, side):
    """The ensemble's counts (M, C, s, s, s) and box side, generated unless already there."""
    path = os.path.join(a.out, f"ensemble-{index}.h5")
    stamp, key = path + ".cmd", f"{a.parent_side} {' '.join(synth_command(a, params, side, path))}"
    if not (os.path.exists(path) and os.path.exists(stamp) and open(stamp).read() == key):
        t0 = time.time()
        what = f"pieces of {a.parent_side}^3 parents" if a.parent_side else "universes"
        print(f"compare_real: cube {index}: generating {a.members} {what}", file=sys.stderr, flush=True)
        generate(a, params, side, path)
        with open(stamp, "w") as f:
            f.write(key)
        print(f"compare_real: cube {index}: {a.members} universes in {time.time() - t0:.0f} s",
              file=sys.stderr, flush=True)
    with h5py.File(path, "r") as f:
        return f["cubes"][:a.members], float(f["sample/box_size_mpc_h"][0])


def summarise(counts, box, a, edges):
    """Every statistic of one cube (C channels), as a dict of arrays with a channel axis first."""
    out = {"pk": [], "k": [], "pdf": [], "empty": [], "skew": [], "mean": []}
    deltas, dks = [], []
    for ch in counts:
        delta = cs.contrast(ch)
        dk = cs.rfftn(delta)
        deltas.append(delta)
        dks.append(dk)
        tapered = cs.windowed(delta, a.taper)
        k, p, _ = cs.power_spectrum(tapered, box, edges, None if a.taper > 0 else dk)
        out["k"].append(k)
        out["pk"].append(p)
        out["pdf"].append(cs.count_pdf(ch))
        out["empty"].append(float(np.mean(ch == 0)))
        out["skew"].append(cs.smoothed_skewness(delta, box, SKEW_RADII, dk))
        out["mean"].append(float(ch.mean()))
    sm = [cs.gaussian_smooth(d, box, CORR_RADIUS, dk) for d, dk in zip(deltas, dks)]
    out["corr"] = np.array([np.corrcoef(sm[i].ravel(), sm[j].ravel())[0, 1] for i, j in CORR_PAIRS]) \
        if len(counts) == 4 else np.zeros(0)
    out = {key: np.asarray(v) for key, v in out.items()}
    out["voxels"] = counts[0].size
    return out


def compare(real, members, redshifts):
    """Tests of one real cube against its ensemble: one row per channel, plus the channel
    correlations."""
    rows = []
    for c, z in enumerate(redshifts):
        ens_pk = np.log(np.stack([m["pk"][c] for m in members]))
        pk = cs.ensemble_chi2(np.log(real["pk"][c]), ens_pk)
        ens_pdf = np.stack([m["pdf"][c] for m in members])
        pdf = cs.pdf_chi2(real["pdf"][c], ens_pdf, real["voxels"])
        empty = np.array([m["empty"][c] for m in members])
        skew = np.stack([m["skew"][c] for m in members])
        rows.append({
            "z": z, "mean": real["mean"][c],
            "pk_chi2": pk["chi2"], "pk_dof": pk["dof"], "pk_p": pk["p"], "pk_p_hotelling": pk["p_hotelling"],
            "pk_ratio": (real["pk"][c] / np.exp(ens_pk.mean(axis=0))).tolist(),
            "pk_ratio_small": float(np.mean((real["pk"][c] / np.exp(ens_pk.mean(axis=0)))[real["k"][c] > 0.5])),
            "pdf_chi2": pdf["chi2"], "pdf_dof": pdf["dof"], "pdf_p": pdf["p"], "pdf_p_hotelling": pdf["p_hotelling"],
            "empty": real["empty"][c], "empty_ens_mean": float(empty.mean()),
            "empty_ens_std": float(empty.std(ddof=1)), "empty_percentile": cs.percentile(real["empty"][c], empty),
            "empty_z": cs.zscore(real["empty"][c], empty),
            "skew": real["skew"][c].tolist(), "skew_ens_mean": skew.mean(axis=0).tolist(),
            "skew_z": [cs.zscore(real["skew"][c][r], skew[:, r]) for r in range(len(SKEW_RADII))],
            "skew_p": cs.ensemble_chi2(real["skew"][c], skew)["p"],
        })
    corr = {}
    if len(real["corr"]):
        ens = np.stack([m["corr"] for m in members])
        corr = {"pairs": [[redshifts[i], redshifts[j]] for i, j in CORR_PAIRS],
                "real": real["corr"].tolist(), "ens_mean": ens.mean(axis=0).tolist(),
                "z": [cs.zscore(real["corr"][q], ens[:, q]) for q in range(len(CORR_PAIRS))],
                "p": cs.ensemble_chi2(real["corr"], ens)["p"]}
    return rows, corr


def cut(a, src, dst, side, bin_):
    """cosmoflow-subcubes src -> dst (one file), the training data's code path."""
    cmd = [a.subcubes, "--in", src, "--out", dst, "--side", str(side), "--bin", str(bin_), "--quiet"]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise Failure(f"cosmoflow-subcubes failed (status {r.returncode}): {r.stderr.strip()}")


def served_means(client, info, path):
    """{group: mean prediction over the group's sub-cubes}, in the model's output order."""
    import predict_dataset
    csv = path + ".pred.csv"
    predict_dataset.predict(client, info, path, csv)
    names = [o["name"] for o in info["outputs"]]
    pred = np.genfromtxt(csv, delimiter=",", names=True)
    pred = np.stack([np.atleast_1d(pred["pred_" + n]) for n in names], axis=1)
    with h5py.File(path, "r") as f:
        groups = f["sample/group"][:]
    return {int(g): pred[groups == g].mean(axis=0) for g in np.unique(groups)}


class ServedNetwork:
    """The served model, connected once per run: the real shard is cut by cosmoflow-subcubes as the
    training data were (its side^3 corners first in toy mode) and read once; ensembles one by one."""

    def __init__(self, a, side):
        import predict_dataset
        self.a, self.side = a, side
        self.tmp = os.path.join(a.out, "network")
        os.makedirs(self.tmp, exist_ok=True)
        self.client, self.info = predict_dataset.connect(a.address, 3600)
        self.names = [o["name"] for o in self.info["outputs"]]
        with h5py.File(a.real, "r") as f:
            n = f["cubes"].shape[-1]
        self.corners, self.stride = a.real, 1
        if side < n:
            self.corners, self.stride = os.path.join(self.tmp, "real-corner.h5"), (n // side) ** 3
            cut(a, a.real, self.corners, side, 1)
        real_file = os.path.join(self.tmp, "real.h5")
        cut(a, self.corners, real_file, a.sub_side or side, a.bin)
        self.real = served_means(self.client, self.info, real_file)

    def reading(self, index, counts):
        """The network's reading of real cube `index`, whose compared counts are `counts`."""
        group = index * self.stride
        if self.stride > 1:
            with h5py.File(self.corners, "r") as f:
                if not np.array_equal(f["cubes"][group], counts):
                    raise Failure(f"cube {index}: the cut corner differs from the compared counts")
        return self.real[group]

    def ensemble(self, index):
        """The network's readings of the first `members` universes of ensemble `index`."""
        ens_file = os.path.join(self.tmp, f"ensemble-{index}.h5")
        cut(self.a, os.path.join(self.a.out, f"ensemble-{index}.h5"), ens_file, self.a.sub_side or self.side, self.a.bin)
        means = served_means(self.client, self.info, ens_file)
        return np.stack([means[g] for g in sorted(means)[:self.a.members]])


def network_test(net, index, real_counts, params):
    """The served network's reading of the real cube among its readings of the ensemble."""
    real, ens = net.reading(index, real_counts), net.ensemble(index)
    truth = np.array([params.get(n, np.nan) for n in net.names])
    chi = cs.ensemble_chi2(real, ens)
    return {"model": net.info["version"], "names": net.names, "truth": truth.tolist(), "real": real.tolist(),
            "ens": ens.tolist(),
            "ens_mean": ens.mean(axis=0).tolist(), "ens_std": ens.std(axis=0, ddof=1).tolist(),
            "z": [cs.zscore(real[j], ens[:, j]) for j in range(len(net.names))],
            "percentile": [cs.percentile(real[j], ens[:, j]) for j in range(len(net.names))],
            "chi2": chi["chi2"], "dof": chi["dof"], "p": chi["p"], "members": len(ens)}


def density_test(net, counts, ens_counts):
    """Pieces differ in mean density, which the network may read as cosmology: each output's
    readings of the members regressed on their mean count at the first redshift, and the real
    cube's reading against that line at its own mean count, in units of the prediction error of
    the regression (residual spread, and the line's own uncertainty there)."""
    ens = np.asarray(net["ens"])
    m = len(ens)
    x = ens_counts[:m, 0].reshape(m, -1).mean(axis=1) - 1.0
    x_real = float(counts[0].mean()) - 1.0
    design = np.stack([np.ones(m), x], axis=1)
    coef, *_ = np.linalg.lstsq(design, ens, rcond=None)
    resid = ens - design @ coef
    sd = np.sqrt((resid ** 2).sum(axis=0) / (m - 2))
    sxx = float(((x - x.mean()) ** 2).sum())
    se = sd * np.sqrt(1 + 1 / m + (x_real - x.mean()) ** 2 / sxx)
    expected = coef[0] + coef[1] * x_real
    return {"real_mean_count": x_real + 1, "slope": coef[1].tolist(), "expected": expected.tolist(),
            "resid_std": sd.tolist(), "z": ((np.asarray(net["real"]) - expected) / se).tolist(),
            "corr": [float(np.corrcoef(x, ens[:, j])[0, 1]) for j in range(ens.shape[1])]}


def network_table(results):
    rows = [r for r in results if r.get("network")]
    if not rows:
        return ""
    lines = ["", f"The served network (`{rows[0]['network']['model']}`) on each real cube and on its ensemble:", "",
             "| cube | output | truth | real cube | ensemble: mean +- sd | z (percentile) | ensemble mean - truth "
             "| all outputs: chi2/dof, p |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        w = r["network"]
        for j, n in enumerate(w["names"]):
            joint = f"{w['chi2']:.1f}/{w['dof']}, {flag(w['p'])}" if j == 0 else ""
            lines.append(f"| {r['index']} | {n} | {w['truth'][j]:.4g} | {w['real'][j]:.4g} "
                         f"| {w['ens_mean'][j]:.4g} +- {w['ens_std'][j]:.2g} | {w['z'][j]:+.1f} ({w['percentile'][j]:.0f}%) "
                         f"| {w['ens_mean'][j] - w['truth'][j]:+.2g} | {joint} |")
    dens = [r for r in rows if r["network"].get("density")]
    if dens:
        lines += ["", "Given each cube's own mean count (the members' readings regressed on theirs at the first "
                  "redshift; z against the line, in units of its prediction error):", "",
                  "| cube | mean count | output | correlation with the mean count | slope per unit mean count "
                  "| residual sd | expected at the real mean count | real cube | z |", "|---|---|---|---|---|---|---|---|---|"]
        for r in dens:
            w, d = r["network"], r["network"]["density"]
            for j, n in enumerate(w["names"]):
                lines.append(f"| {r['index']} | {d['real_mean_count']:.3f} | {n} | {d['corr'][j]:+.2f} | {d['slope'][j]:+.3g} "
                             f"| {d['resid_std'][j]:.2g} | {d['expected'][j]:.4g} | {w['real'][j]:.4g} | {d['z'][j]:+.1f} |")
    return "\n".join(lines) + "\n"


def flag(p):
    return f"**{p:.2g}**" if p < P_THRESHOLD else f"{p:.2g}"


def table(results):
    """The markdown table: one line per real cube and channel."""
    lines = [
        "| cube (Omega_M, sigma_8, n_s, H0) | z | mean count | P(k) chi2/dof, p (Hotelling p) | P real / synthetic, k > 0.5 "
        "| PDF chi2/dof, p (Hotelling p) | empty fraction: real, ensemble, percentile | skewness z at R = 1, 2, 4 Mpc/h (joint p) |",
        "|---|---|---|---|---|---|---|---|"]
    for r in results:
        par = r["params"]
        label = (f"{r['index']} ({par['Omega_M']:.3f}, {par['sigma_8']:.3f}, {par['n_s']:.3f}, "
                 f"{par['H0']:.1f})")
        for row in r["channels"]:
            lines.append(
                f"| {label} | {row['z']:g} | {row['mean']:.3f} "
                f"| {row['pk_chi2']:.1f}/{row['pk_dof']}, {flag(row['pk_p'])} ({row['pk_p_hotelling']:.2g}) "
                f"| {row['pk_ratio_small']:.2f} "
                f"| {row['pdf_chi2']:.1f}/{row['pdf_dof']}, {flag(row['pdf_p'])} ({row['pdf_p_hotelling']:.2g}) "
                f"| {row['empty']:.3f}, {row['empty_ens_mean']:.3f} +- {row['empty_ens_std']:.3f}, {row['empty_percentile']:.0f}% "
                f"| {', '.join(f'{z:+.1f}' for z in row['skew_z'])} ({flag(row['skew_p'])}) |")
    lines += ["", "| cube | channel pairs (z) | correlation, real | ensemble mean | z | joint p |",
              "|---|---|---|---|---|---|"]
    for r in results:
        c = r["correlations"]
        if not c:
            continue
        pairs = ", ".join(f"{a:g}-{b:g}" for a, b in c["pairs"])
        lines.append(f"| {r['index']} | {pairs} | {', '.join(f'{v:.3f}' for v in c['real'])} "
                     f"| {', '.join(f'{v:.3f}' for v in c['ens_mean'])} "
                     f"| {', '.join(f'{v:+.1f}' for v in c['z'])} | {flag(c['p'])} |")
    return "\n".join(lines) + "\n"


def write_csv(results, path):
    with open(path + ".tmp", "w") as f:
        f.write("cube,z,mean,pk_chi2,pk_dof,pk_p,pk_p_hotelling,pk_ratio_small,pdf_chi2,pdf_dof,pdf_p,pdf_p_hotelling,"
                "empty,empty_ens_mean,empty_ens_std,empty_percentile,skew_z_r1,skew_z_r2,skew_z_r4,skew_p\n")
        for r in results:
            for w in r["channels"]:
                f.write(",".join(str(v) for v in [
                    r["index"], w["z"], w["mean"], w["pk_chi2"], w["pk_dof"], w["pk_p"], w["pk_p_hotelling"],
                    w["pk_ratio_small"],
                    w["pdf_chi2"], w["pdf_dof"], w["pdf_p"], w["pdf_p_hotelling"], w["empty"],
                    w["empty_ens_mean"], w["empty_ens_std"], w["empty_percentile"], *w["skew_z"],
                    w["skew_p"]]) + "\n")
    os.replace(path + ".tmp", path)


def plot(index, params, real, members, redshifts, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nc = len(redshifts)
    fig, axes = plt.subplots(2, nc, figsize=(4 * nc, 7), squeeze=False)
    centres = np.sqrt(cs.PDF_EDGES[:-1] * np.maximum(cs.PDF_EDGES[1:] - 1, cs.PDF_EDGES[:-1]))
    centres[0] = 0.5
    for c, z in enumerate(redshifts):
        ens = np.stack([m["pk"][c] for m in members])
        k = real["k"][c]
        ax = axes[0, c]
        ax.fill_between(k, *np.percentile(ens, [2.5, 97.5], axis=0), color="C0", alpha=0.3,
                        label=f"synthetic, {len(members)} (95%)")
        ax.plot(k, np.median(ens, axis=0), color="C0")
        ax.plot(k, real["pk"][c], "k.-", label="real")
        ax.set(xscale="log", yscale="log", xlabel="k [h/Mpc]", title=f"z = {z:g}")
        if c == 0:
            ax.set_ylabel("P(k) of the count contrast [(Mpc/h)^3]")
            ax.legend(fontsize=8)
        ens = np.stack([m["pdf"][c] for m in members])
        ax = axes[1, c]
        ax.fill_between(centres, *np.percentile(ens, [2.5, 97.5], axis=0), color="C0", alpha=0.3)
        ax.plot(centres, np.median(ens, axis=0), color="C0")
        ax.plot(centres, real["pdf"][c], "k.-")
        ax.set(xscale="log", yscale="log", xlabel="count per voxel (bin centre; 0 at 0.5)")
        if c == 0:
            ax.set_ylabel("fraction of voxels")
    fig.suptitle(f"real cube {index}: Omega_M {params['Omega_M']:.3f}, sigma_8 {params['sigma_8']:.3f}, "
                 f"n_s {params['n_s']:.3f}, H0 {params['H0']:.1f}")
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=80)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


def run(a):
    os.makedirs(a.out, exist_ok=True)
    indices = [int(v) for v in a.indices.split(",")] if a.indices else []
    if not os.path.exists(a.real):
        raise Failure(f"{a.real}: no such file")
    with h5py.File(a.real, "r") as f:
        redshifts = [float(z) for z in f.attrs["redshifts"]]
    results, net = [], None
    for index, counts, params, box in load_real(a.real, indices, a.side):
        side = counts.shape[-1]
        if a.parent_side and (a.parent_side <= side or a.parent_side % side):
            raise Failure(f"--parent-side {a.parent_side}: expected a multiple of the compared side {side}, larger")
        ens_counts, ens_box = ensemble(a, index, params, side)
        if abs(ens_box - box) > 1e-3 * box:
            raise Failure(f"cube {index}: ensemble box {ens_box} Mpc/h differs from the real {box}")
        edges = cs.log_k_edges(box, a.kmax, a.pk_bins)
        t0 = time.time()
        real = summarise(counts, box, a, edges)
        members = [summarise(m, box, a, edges) for m in ens_counts]
        rows, corr = compare(real, members, redshifts)
        print(f"compare_real: cube {index}: statistics in {time.time() - t0:.0f} s", file=sys.stderr,
              flush=True)
        results.append({"index": index, "params": params, "box_mpc_h": box, "channels": rows,
                        "correlations": corr, "k": real["k"][0].tolist(), "members": a.members})
        if a.address:
            net = net or ServedNetwork(a, side)
            results[-1]["network"] = network_test(net, index, counts, params)
            if a.parent_side:
                results[-1]["network"]["density"] = density_test(results[-1]["network"], counts, ens_counts)
        plot(index, params, real, members, redshifts, os.path.join(a.out, f"real-{index}.png"))
    command = " ".join(shlex.quote(v) for v in sys.argv)
    md = f"Command: `{command}`\n\n" + table(results) + network_table(results)
    for name, text in (("real_cubes.md", md), ("real_cubes.json", json.dumps(
            {"command": command, "results": results}, indent=1))):
        with open(os.path.join(a.out, name + ".tmp"), "w") as f:
            f.write(text)
        os.replace(os.path.join(a.out, name + ".tmp"), os.path.join(a.out, name))
    write_csv(results, os.path.join(a.out, "real_cubes.csv"))
    if a.address:
        with open(os.path.join(a.out, "network.md.tmp"), "w") as f:
            f.write(network_table(results).lstrip("\n"))
        os.replace(os.path.join(a.out, "network.md.tmp"), os.path.join(a.out, "network.md"))
    sys.stdout.write(md)


def main(argv):
    a = parse_args(argv)
    try:
        run(a)
    except (Failure, OSError, ValueError, KeyError) as e:
        print(f"compare_real: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
