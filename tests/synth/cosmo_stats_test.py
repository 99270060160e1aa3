#!/usr/bin/env python3
"""Tests of tools/cosmo_stats.py on fields whose statistics are known: a Gaussian random field
with a given P(k), Poisson counts (their PDF), and the ensemble chi-square's calibration.
Run by ctest (synth_cosmo_stats_test) with /usr/bin/python3."""
import os
import sys
import unittest

import numpy as np
from scipy import stats

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import cosmo_stats as cs  # noqa: E402


def gaussian_field(n, box, power, rng):
    """A Gaussian random field on an n^3 periodic grid with P(k) = power(k) (Mpc/h)^3."""
    kk, _ = cs.wavenumbers(n, box)
    white = cs.rfftn(rng.standard_normal((n, n, n)))
    with np.errstate(divide="ignore"):
        amp = np.where(kk > 0, np.sqrt(power(np.maximum(kk, 1e-12)) / (box / n) ** 3), 0.0)
    return np.fft.irfftn(white * amp, s=(n, n, n))


class PowerSpectrumTest(unittest.TestCase):
    def test_recovers_the_input_spectrum_within_its_errors(self):
        n, box = 64, 128.0
        power = lambda k: 2000.0 * (k / 0.1) ** -1.5
        rng = np.random.default_rng(3)
        edges = cs.log_k_edges(box, 1.2, 10)
        k, p, modes = cs.power_spectrum(gaussian_field(n, box, power, rng), box, edges)
        # The mean of the model over each bin's modes, and the error of a P estimated from
        # modes/2 independent complex modes: P sqrt(2 / modes).
        kk, w = cs.wavenumbers(n, box)
        idx = np.digitize(kk.ravel(), edges) - 1
        ok = (idx >= 0) & (idx < 10)
        model = np.bincount(idx[ok], weights=(w.ravel() * power(np.maximum(kk.ravel(), 1e-9)))[ok],
                            minlength=10) / modes
        pull = (p - model) / (model * np.sqrt(2 / modes))
        self.assertTrue(np.all(np.abs(pull) < 4), pull)
        chi2 = float(np.sum(pull ** 2))
        self.assertGreater(stats.chi2.sf(chi2, 10), 1e-3, pull)
        # A spectrum 20% too high is caught.
        pull_wrong = (p - 1.2 * model) / (1.2 * model * np.sqrt(2 / modes))
        self.assertLess(stats.chi2.sf(float(np.sum(pull_wrong ** 2)), 10), 1e-6)

    def test_shot_noise_of_poisson_counts_is_volume_per_particle(self):
        rng = np.random.default_rng(5)
        counts = rng.poisson(2.0, (64, 64, 64))
        _, p, modes = cs.power_spectrum(cs.contrast(counts), 64.0, cs.log_k_edges(64.0, 3.0, 6))
        # V / N = 1 / 2 (Mpc/h)^3, within 4 sigma = 4 P sqrt(2 / modes).
        self.assertTrue(np.all(np.abs(p - 0.5) < 4 * 0.5 * np.sqrt(2 / modes)), (p, modes))


class EnsembleTestsTest(unittest.TestCase):
    def poisson_pdfs(self, lam, members, rng, n=32):
        return np.stack([cs.count_pdf(rng.poisson(lam, (n, n, n))) for _ in range(members)])

    def test_poisson_pdf_passes_and_a_wrong_mean_fails(self):
        rng = np.random.default_rng(11)
        ens = self.poisson_pdfs(1.0, 40, rng)
        voxels = 32 ** 3
        p_same = []
        for _ in range(20):  # calibrated: p < 0.01 about once in 100
            same = cs.count_pdf(rng.poisson(1.0, (32, 32, 32)))
            p_same.append(cs.pdf_chi2(same, ens, voxels)["p_hotelling"])
        self.assertGreaterEqual(np.sum(np.array(p_same) > 0.01), 18, p_same)
        wrong = cs.count_pdf(rng.poisson(1.1, (32, 32, 32)))
        r_wrong = cs.pdf_chi2(wrong, ens, voxels)
        self.assertLess(r_wrong["p_hotelling"], 1e-4, r_wrong)
        self.assertLess(r_wrong["p"], 1e-6, r_wrong)
        self.assertGreaterEqual(r_wrong["bins"], 5)  # counts 0..5 each hold > 20 voxels

    def test_chi2_is_calibrated_for_draws_from_the_ensemble_model(self):
        # 200 trials of (x, ensemble of 32) from one correlated Gaussian model in 8 dimensions:
        # the Hotelling p-values are uniform, so about 5% fall below 0.05.
        rng = np.random.default_rng(2)
        a = rng.standard_normal((8, 8))
        cov = a @ a.T + 8 * np.eye(8)
        chol = np.linalg.cholesky(cov)
        ps, ps_chi2 = [], []
        for _ in range(200):
            draws = rng.standard_normal((33, 8)) @ chol.T + 5.0
            r = cs.ensemble_chi2(draws[0], draws[1:])
            ps.append(r["p_hotelling"])
            ps_chi2.append(r["p"])
        self.assertLess(abs(np.mean(np.array(ps) < 0.05) - 0.05), 0.04)
        self.assertGreater(stats.kstest(ps, "uniform").pvalue, 1e-3)
        # The Hartlap chi-square is approximately calibrated too.
        self.assertLess(np.mean(np.array(ps_chi2) < 0.05), 0.12)

    def test_too_small_an_ensemble_is_an_error(self):
        with self.assertRaises(ValueError):
            cs.ensemble_chi2(np.zeros(10), np.random.default_rng(0).standard_normal((11, 10)))

    def test_percentile_and_skewness(self):
        self.assertEqual(cs.percentile(5.0, np.arange(10.0)), 55.0)
        self.assertEqual(cs.percentile(100.0, np.arange(10.0)), 100.0)
        rng = np.random.default_rng(1)
        self.assertLess(abs(cs.skewness(rng.standard_normal(100000))), 0.03)
        self.assertAlmostEqual(cs.skewness(rng.exponential(size=400000)), 2.0, delta=0.1)
        # Smoothing a Gaussian field keeps it Gaussian; smoothing Poisson(1) counts lowers the
        # skewness (1 per voxel) as 1/sqrt(voxels in the kernel).
        g = gaussian_field(32, 32.0, lambda k: 10 * k ** -1.0, rng)
        self.assertTrue(np.all(np.abs(cs.smoothed_skewness(g, 32.0, (1.0, 2.0))) < 0.15))
        s = cs.smoothed_skewness(cs.contrast(rng.poisson(1.0, (64, 64, 64))), 64.0, (1.0, 2.0))
        self.assertGreater(s[0], s[1])
        self.assertGreater(s[1], 0.0)

    def test_tukey_window(self):
        w = cs.tukey(100, 0.2)
        self.assertEqual(w[50], 1.0)
        self.assertLess(w[0], 0.01)
        np.testing.assert_allclose(w, w[::-1])
        np.testing.assert_array_equal(cs.tukey(8, 0), np.ones(8))


if __name__ == "__main__":
    unittest.main()
