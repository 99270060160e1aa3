#!/usr/bin/python3
"""tools/pk_baseline.py on toys with known answers.

- The plain features (no --cross) equal a naive reference: binned P(k) of delta = n / mean - 1 per
  channel, log variance, empty fraction; their number is channels x (bins + 2).
- --cross: r_ij(k) is 1 in every bin for two identical channels and near 0 for independent ones.
- A toy where only the correlation between two channels carries the label (both channels have the
  same power spectrum): with --cross the ridge fit recovers it (RMS below 0.3 of the trivial
  predictor's), without it it cannot (above 0.8).
- The ridge strength is chosen per parameter: beside the informative label, a second one of pure
  noise a thousand times larger gets a stronger ridge than the first, and the first is still
  recovered (RMS below 0.3 of trivial; one joint strength would follow the noise's squared error).
  --lambda fixes one strength for every parameter (a negative one is refused).
- Cross-validation folds keep rows with identical labels (twins) together.
- Several --test sets in one call give the same predictions as one call each; a --test / --out
  count mismatch is refused.
Usage: pk_baseline_test.py WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "..", "tools")
sys.path.insert(0, TOOLS)
import pk_baseline as pk  # noqa: E402

SIDE, BINS = 16, 6


def fail(msg):
    sys.exit(f"pk_baseline_test: {msg}")


def naive_pk(n, nbins):
    """Binned P(k) by explicit loops over the rfftn modes (the reference for the vectorised code)."""
    n = n.astype(np.float64)
    side = n.shape[0]
    dk = np.fft.rfftn(n / n.mean() - 1)
    edges = np.logspace(0, np.log10(side / 2), nbins + 1)
    sums, counts = np.zeros(nbins), np.zeros(nbins)
    for i in range(side):
        for j in range(side):
            for k in range(side // 2 + 1):
                ki = i if i < side / 2 else i - side
                kj = j if j < side / 2 else j - side
                kk = np.sqrt(ki * ki + kj * kj + k * k)
                b = np.searchsorted(edges, kk, side="right") - 1
                if 0 <= b < nbins:
                    sums[b] += abs(dk[i, j, k]) ** 2 / n.size
                    counts[b] += 1
    return sums / np.maximum(counts, 1)


def gaussian(rng, side):
    """A smooth Gaussian random field of unit variance (power falling as k^-2)."""
    w = np.fft.rfftn(rng.standard_normal((side,) * 3))
    kx = np.fft.fftfreq(side) * side
    kz = np.fft.rfftfreq(side) * side
    kk = np.sqrt(kx[:, None, None] ** 2 + kx[None, :, None] ** 2 + kz[None, None, :] ** 2)
    f = np.fft.irfftn(w / np.maximum(kk, 1), s=(side,) * 3)
    return f / f.std()


def counts(field):
    return np.round(200 * (1 + 0.1 * field)).astype(np.int16)


def write_toy(path, n, seed, noise_label=False):
    """Two channels a and rho a + sqrt(1 - rho^2) b: the same spectrum, correlation rho = the label.
    noise_label adds a second label, 1000 x N(0, 1), that nothing in the cube predicts."""
    rng = np.random.default_rng(seed)
    rho = rng.uniform(0.1, 0.9, n)
    cubes = np.zeros((n, 2) + (SIDE,) * 3, np.int16)
    for i in range(n):
        a, b = gaussian(rng, SIDE), gaussian(rng, SIDE)
        cubes[i, 0] = counts(a)
        cubes[i, 1] = counts(rho[i] * a + np.sqrt(1 - rho[i] ** 2) * b)
    params, names = rho[:, None], ["rho"]
    if noise_label:
        params, names = np.stack([rho, 1000 * rng.standard_normal(n)], axis=1), ["rho", "noise"]
    with h5py.File(path, "w") as h:
        h["cubes"] = cubes
        h["params"] = params.astype(np.float32)
        h.attrs["param_names"] = names


def run(*args, ok=True):
    r = subprocess.run(["/usr/bin/python3", os.path.join(TOOLS, "pk_baseline.py"), *args],
                       capture_output=True, text=True)
    if ok and r.returncode != 0:
        fail(f"pk_baseline.py {' '.join(args)} failed: {r.stderr}")
    return r


def rms_ratio(csv):
    d = np.genfromtxt(csv, delimiter=",", names=True)
    err = np.sqrt(np.mean((d["pred_rho"] - d["true_rho"]) ** 2))
    return err / d["true_rho"].std()


def main():
    work = sys.argv[1]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = np.random.default_rng(1)

    # Plain features against the naive reference.
    cube = np.stack([rng.poisson(lam, (SIDE,) * 3) for lam in (0.7, 3.0)]).astype(np.int16)
    f = pk.power_features(cube, BINS)
    if f.shape != (2 * (BINS + 2),):
        fail(f"plain features have shape {f.shape}, expected {(2 * (BINS + 2),)}")
    for c in range(2):
        ref = np.concatenate([np.log(naive_pk(cube[c], BINS) + 1e-12),
                              [np.log(cube[c].astype(float).var()), (cube[c] == 0).mean()]])
        got = f[c * (BINS + 2):(c + 1) * (BINS + 2)]
        if not np.allclose(got, ref, rtol=1e-10, atol=1e-12):
            fail(f"channel {c}: features {got} differ from the naive reference {ref}")

    # Cross-correlation coefficients: identical channels -> 1, independent ones -> ~0.
    a, b = gaussian(rng, 32), gaussian(rng, 32)
    cube = np.stack([counts(a), counts(a), counts(b)])
    f = pk.power_features(cube, BINS, cross=True)
    if f.shape != (3 * (BINS + 2) + 3 * BINS,):
        fail(f"cross features have shape {f.shape}")
    r = f[3 * (BINS + 2):].reshape(3, BINS)  # pairs (0,1), (0,2), (1,2)
    if not np.allclose(r[0], 1, atol=1e-9):
        fail(f"identical channels: r(k) = {r[0]}, expected 1")
    if np.max(np.abs(r[1:])) > 0.35 or np.max(np.abs(r[1:, 2:])) > 0.1:
        fail(f"independent channels: r(k) = {r[1:]}, expected near 0")

    # Only the cross-spectrum carries the label.
    write_toy(f"{work}/train.h5", 80, 2)
    write_toy(f"{work}/test.h5", 30, 3)
    write_toy(f"{work}/test2.h5", 10, 4)
    run("--train", f"{work}/train.h5", "--test", f"{work}/test.h5", "--out", f"{work}/plain.csv", "--bins", str(BINS))
    run("--train", f"{work}/train.h5", "--test", f"{work}/test.h5", f"{work}/test2.h5",
        "--out", f"{work}/cross.csv", f"{work}/cross2.csv", "--bins", str(BINS), "--cross", "--workers", "2")
    run("--train", f"{work}/train.h5", "--test", f"{work}/test2.h5", "--out", f"{work}/cross2-alone.csv",
        "--bins", str(BINS), "--cross")
    # A saved fit predicts exactly as the fit it was saved from, with its own --bins and --cross.
    run("--train", f"{work}/train.h5", "--test", f"{work}/test.h5", "--out", f"{work}/cross-saved.csv",
        "--bins", str(BINS), "--cross", "--save-model", f"{work}/fit.npz")
    run("--model", f"{work}/fit.npz", "--test", f"{work}/test2.h5", "--out", f"{work}/cross2-model.csv")
    if open(f"{work}/cross2-model.csv").read() != open(f"{work}/cross2-alone.csv").read():
        fail("predictions from --model differ from those of the fit it saved")
    with open(f"{work}/bad.npz", "wb") as bad:
        bad.write(b"not a fit")
    r = run("--model", f"{work}/bad.npz", "--test", f"{work}/test2.h5", "--out", "x.csv", ok=False)
    if r.returncode == 0 or "bad.npz" not in r.stderr or "Traceback" in r.stderr:
        fail(f"a corrupt --model was not refused with one line: {r.returncode} {r.stderr}")
    r = run("--test", f"{work}/test2.h5", "--out", "x.csv", ok=False)
    if r.returncode == 0 or "--model" not in r.stderr:
        fail(f"neither --train nor --model was not refused: {r.returncode} {r.stderr}")
    # --taper: a window that keeps the power (white noise: the same log P(k) within 0.15 per bin),
    # carried by a saved fit, and a fraction outside [0, 1) refused.
    noise = rng.poisson(2.0, (32,) * 3)
    flat, tapered = pk.channel_features(noise, 6), pk.channel_features(noise, 6, pk.channel_fft(noise, 0.2))
    if not np.all(np.abs(flat[:6] - tapered[:6]) < 0.15) or np.allclose(flat[:6], tapered[:6]):
        fail(f"tapered white-noise log P(k) {tapered[:6]} against {flat[:6]}: expected close, not equal")
    run("--train", f"{work}/train.h5", "--test", f"{work}/test2.h5", "--out", f"{work}/taper.csv",
        "--bins", str(BINS), "--cross", "--taper", "0.2", "--save-model", f"{work}/fit-taper.npz")
    run("--model", f"{work}/fit-taper.npz", "--test", f"{work}/test2.h5", "--out", f"{work}/taper-model.csv")
    if open(f"{work}/taper-model.csv").read() != open(f"{work}/taper.csv").read():
        fail("a saved --taper fit predicts differently from the fit")
    if open(f"{work}/taper.csv").read() == open(f"{work}/cross2-alone.csv").read():
        fail("--taper 0.2 changed no prediction")
    r = run("--train", f"{work}/train.h5", "--test", f"{work}/test.h5", "--out", "x.csv", "--taper", "1", ok=False)
    if r.returncode == 0 or "--taper 1" not in r.stderr:
        fail(f"--taper 1 was not refused: {r.returncode} {r.stderr}")
    plain, cross = rms_ratio(f"{work}/plain.csv"), rms_ratio(f"{work}/cross.csv")
    if not cross < 0.3:
        fail(f"with --cross the RMS is {cross:.3f} of the trivial predictor's, expected < 0.3")
    if not plain > 0.8:
        fail(f"without --cross the RMS is {plain:.3f} of the trivial predictor's, expected > 0.8 (no information)")
    if open(f"{work}/cross2.csv").read() != open(f"{work}/cross2-alone.csv").read():
        fail("a second --test set's predictions differ from the same set alone")

    # One ridge strength per parameter.
    write_toy(f"{work}/train-noise.h5", 80, 2, noise_label=True)
    write_toy(f"{work}/test-noise.h5", 30, 3, noise_label=True)
    r = run("--train", f"{work}/train-noise.h5", "--test", f"{work}/test-noise.h5", "--out", f"{work}/noise.csv",
            "--bins", str(BINS), "--cross")
    lams = dict(re.findall(r"(rho|noise) ([0-9.e+-]+)", r.stderr.split("ridge lambda")[-1]))
    if set(lams) != {"rho", "noise"} or not float(lams["rho"]) < float(lams["noise"]):
        fail(f"ridge strengths {lams} (from: {r.stderr.strip()}): expected rho's below the noise label's")
    ratio = rms_ratio(f"{work}/noise.csv")
    if not ratio < 0.3:
        fail(f"beside a noise label rho's RMS is {ratio:.3f} of trivial, expected < 0.3")
    # --lambda fixes one strength for both: the noise label's (1000) over-regularises rho.
    run("--train", f"{work}/train-noise.h5", "--test", f"{work}/test-noise.h5", "--out", f"{work}/noise-fixed.csv",
        "--bins", str(BINS), "--cross", "--lambda", "1000")
    fixed = rms_ratio(f"{work}/noise-fixed.csv")
    if not fixed > 0.5:
        fail(f"with --lambda 1000 rho's RMS is {fixed:.3f} of trivial, expected > 0.5 (over-regularised)")
    r = run("--train", f"{work}/train.h5", "--test", f"{work}/test.h5", "--out", "x.csv", "--lambda", "-1", ok=False)
    if r.returncode == 0 or "--lambda -1" not in r.stderr:
        fail(f"a negative --lambda was not refused: {r.returncode} {r.stderr}")

    # Twins share a fold; distinct labels go round-robin.
    y = np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [5.0, 6.0], [3.0, 4.0], [7.0, 8.0]])
    if pk.cv_folds(y, 3).tolist() != [0, 1, 0, 2, 1, 0]:
        fail(f"cv_folds of labels with twins: {pk.cv_folds(y, 3).tolist()}, expected [0, 1, 0, 2, 1, 0]")
    if pk.cv_folds(np.arange(12.0)[:, None]).tolist() != [i % 5 for i in range(12)]:
        fail("cv_folds of distinct labels is not i % 5")

    r = run("--train", f"{work}/train.h5", "--test", f"{work}/test.h5", f"{work}/test2.h5", "--out", "x.csv", ok=False)
    if r.returncode == 0 or "--out" not in r.stderr:
        fail(f"a --test / --out mismatch was not refused: {r.returncode} {r.stderr}")
    print(f"pk_baseline_test: ok (RMS / trivial: {plain:.3f} plain, {cross:.3f} with --cross)")


if __name__ == "__main__":
    main()
