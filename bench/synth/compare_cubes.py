#!/usr/bin/env python3
"""Per-channel statistics of dataset shards, as a Markdown table (docs/data.md uses it).

    /usr/bin/python3 bench/synth/compare_cubes.py NAME=SHARD.h5 [NAME=SHARD.h5 ...]

For each shard and channel: mean count, max count (median over cubes, and range), fraction of empty
voxels and variance of counts (mean over cubes, and range), and the power spectrum of the count
contrast at k ~ 0.1 and 0.5 h/Mpc relative to the first shard (same binning).
"""
import sys

import h5py
import numpy as np


def power(delta, box):
    n = delta.shape[0]
    dk = np.fft.rfftn(delta)
    p = (np.abs(dk) ** 2) * (box / n) ** 6 / box ** 3
    kf = 2 * np.pi / box
    kx = np.fft.fftfreq(n, 1.0 / n)
    kz = np.arange(n // 2 + 1)
    kk = np.sqrt(kx[:, None, None] ** 2 + kx[None, :, None] ** 2 + kz[None, None, :] ** 2) * kf
    out = {}
    for k0 in (0.1, 0.5):
        sel = (kk > k0 * 0.8) & (kk < k0 * 1.2)
        out[k0] = p[sel].mean()
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    rows = []
    for arg in argv[1:]:
        name, _, path = arg.partition("=")
        with h5py.File(path, "r") as f:
            cubes = f["cubes"]
            z = list(f.attrs["redshifts"])
            box = float(np.asarray(f.attrs["box_size_mpc_h"]).ravel()[0])
            n = cubes.shape[0]
            stats = []
            for i in range(n):
                c = cubes[i].astype(np.float64)
                st = []
                for ch in range(c.shape[0]):
                    x = c[ch]
                    pk = power(x / x.mean() - 1, box)
                    st.append((x.mean(), x.max(), (x == 0).mean(), x.var(), pk[0.1], pk[0.5]))
                stats.append(st)
            rows.append((name, n, z, np.array(stats)))
    print("| data | cubes | z | mean | max: median (range) | empty fraction | variance | P(0.1) | P(0.5) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, n, z, s in rows:
        for ch in range(s.shape[1]):
            m, mx, e, v, p1, p5 = (s[:, ch, j] for j in range(6))
            print(f"| {name} | {n} | {z[ch]:g} | {m.mean():.3f} | {np.median(mx):.0f} ({mx.min():.0f}-{mx.max():.0f}) "
                  f"| {e.mean():.3f} ({e.min():.3f}-{e.max():.3f}) | {v.mean():.2f} ({v.min():.2f}-{v.max():.2f}) "
                  f"| {p1.mean():.0f} | {p5.mean():.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
