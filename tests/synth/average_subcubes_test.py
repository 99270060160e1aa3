#!/usr/bin/env python3
"""Tests of tools/average_subcubes.py: per-universe means, the covariance combinations, the fitted
correlation on simulated correlated sub-cube errors, and its errors. Run by ctest."""
import csv
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "average_subcubes.py")


def write_case(d, name, true, pred, sigma, groups, rho_cov=None):
    """A predictions CSV and a dataset file with /sample/group."""
    with h5py.File(os.path.join(d, name + ".h5"), "w") as f:
        f["sample/group"] = np.asarray(groups, dtype=np.float64)
    with open(os.path.join(d, name + ".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["true_a", "true_b", "pred_a", "pred_b", "sigma_a", "sigma_b"])
        for t, p, s in zip(true, pred, sigma):
            w.writerow(list(t) + list(p) + list(s))
    return os.path.join(d, name + ".csv"), os.path.join(d, name + ".h5")


def run(*args):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
    return r.returncode, r.stderr


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


class AverageSubcubesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_mean_and_combinations(self):
        # Two universes of 4 sub-cubes, groups interleaved on purpose.
        groups = [7, 7, 3, 3, 7, 3, 7, 3]
        true = [[0.3, 0.8] if g == 7 else [0.25, 0.9] for g in groups]
        pred = [[0.30 + 0.01 * i, 0.80 - 0.01 * i] for i in range(8)]
        sigma = [[0.01 * (1 + i % 2), 0.02] for i in range(8)]
        pc, data = write_case(self.d, "p", true, pred, sigma, groups)
        out = os.path.join(self.d, "u.csv")
        for combine, factor in (("conservative", 1.0), ("independent", 0.25), ("rho:0.5", 0.625)):
            rc, err = run("--pred", pc, "--data", data, "--out", out, "--combine", combine)
            self.assertEqual(rc, 0, err)
            rows = read(out)
            self.assertEqual([r["group"] for r in rows], ["7", "3"])
            idx7 = [i for i, g in enumerate(groups) if g == 7]
            self.assertAlmostEqual(float(rows[0]["pred_a"]), np.mean([pred[i][0] for i in idx7]), places=7)
            self.assertEqual(rows[0]["subcubes"], "4")
            self.assertEqual(float(rows[0]["true_b"]), 0.8)
            # Cbar = mean of the variances: (0.01^2 + 0.02^2) / 2 for a (two of each), 0.02^2 for b.
            var_a = np.mean([sigma[i][0] ** 2 for i in idx7]) * factor
            self.assertAlmostEqual(float(rows[0]["sigma_a"]), np.sqrt(var_a), places=7)
            self.assertAlmostEqual(float(rows[0]["cov_a_b"]), 0.0, places=12)
            self.assertAlmostEqual(float(rows[0]["sigma_b"]), 0.02 * np.sqrt(factor), places=7)

    def test_fitted_correlation_recovers_the_simulated_one(self):
        rng = np.random.default_rng(4)
        m, rho, sig = 16, 0.3, 0.01

        def universes(n, name):
            groups, true, pred, sigma = [], [], [], []
            for u in range(n):
                shared = rng.standard_normal(2) * np.sqrt(rho)
                for _ in range(m):
                    e = (shared + rng.standard_normal(2) * np.sqrt(1 - rho)) * sig
                    groups.append(u)
                    true.append([0.3, 0.8])
                    pred.append([0.3 + e[0], 0.8 + e[1]])
                    sigma.append([sig, sig])
            return write_case(self.d, name, true, pred, sigma, groups)

        val_csv, val_data = universes(400, "val")
        test_csv, test_data = universes(50, "test")
        out = os.path.join(self.d, "u.csv")
        rc, err = run("--pred", test_csv, "--data", test_data, "--out", out,
                      "--combine", f"fit:{val_csv},{val_data}")
        self.assertEqual(rc, 0, err)
        fitted = float(err.split("rho = ")[1].split()[0])
        self.assertAlmostEqual(fitted, rho, delta=0.08)
        rows = read(out)
        self.assertIn("rho=", rows[0]["combine"])
        # The fitted error bar is between the independent and the conservative ones.
        s = float(rows[0]["sigma_a"])
        self.assertGreater(s, sig / np.sqrt(m))
        self.assertLess(s, sig)

    def test_bad_inputs_fail_with_one_line(self):
        pc, data = write_case(self.d, "p", [[0.3, 0.8], [0.31, 0.8]], [[0.3, 0.8]] * 2,
                              [[0.01, 0.01]] * 2, [1, 1])
        good, good_data = write_case(self.d, "g", [[0.3, 0.8]] * 2, [[0.3, 0.8]] * 2,
                                     [[0.01, 0.01]] * 2, [1, 1])
        out = os.path.join(self.d, "u.csv")
        for args, needle in (
                (["--pred", pc, "--data", data], "different true labels"),
                (["--pred", pc + "x", "--data", data], "no such file"),
                (["--pred", pc, "--data", data + "x"], "no such shard"),
                (["--pred", good, "--data", good_data, "--combine", "rho:2"], "rho must be in"),
                (["--pred", good, "--data", data + "x"], "no such shard"),
        ):
            rc, err = run(*args, "--out", out)
            self.assertEqual(rc, 1, args)
            self.assertIn(needle, err)
            self.assertEqual(err.count("\n"), 1, err)
            self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
