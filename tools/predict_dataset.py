#!/usr/bin/python3
"""Predicts every cube of an HDF5 dataset through a running cosmoflow-server (Python client, one
stream) and writes one CSV row per cube, in dataset order (sorted shards, as Dataset::Open reads a
directory, which is the order tools/average_subcubes.py expects):

    index, true_<p>..., pred_<p>... [, sigma_<p>..., cov_<a>_<b>...]

in the model's output order; sigma and covariance when the model serves them (calibrated, as the
server answers). Cubes are read shard by shard, so a large dataset never sits in memory.

    /usr/bin/python3 tools/predict_dataset.py --address HOST:PORT --data DIR|FILE.h5 --out PRED.csv
    /usr/bin/python3 tools/predict_dataset.py --address HOST:PORT --info-json MODEL.json   (ModelInfo only)

Progress (cubes, cubes/s) goes to stderr. Exit status 0 done, 1 failure (one line on stderr).
"""
import argparse
import glob
import json
import os
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
from cosmoflow_client import CosmoFlowClient  # noqa: E402


def shards(path):
    files = sorted(glob.glob(os.path.join(path, "*.h5"))) if os.path.isdir(path) else [path]
    if not files or not all(os.path.exists(f) for f in files):
        sys.exit(f"predict_dataset.py: {path}: no such shard or directory of shards")
    return files


def connect(address, timeout):
    client = CosmoFlowClient(address, timeout=timeout)
    for attempt in range(150):
        try:
            return client, client.info()
        except Exception as e:  # the server may still be loading the model
            if attempt == 149:
                sys.exit(f"predict_dataset.py: server at {address} never answered: {e}")
            time.sleep(0.2)


def labels(files, names):
    """The true labels of every cube, in the model's output order (names matched case-insensitively)."""
    out = []
    for f in files:
        with h5py.File(f, "r") as h:
            have = [s.decode() if isinstance(s, bytes) else s for s in h.attrs["param_names"]]
            lower = [n.lower() for n in have]
            missing = [n for n in names if n.lower() not in lower]
            if missing:
                sys.exit(f"predict_dataset.py: {f}: no label for the model's outputs {missing} (has {have})")
            out.append(h["params"][:][:, [lower.index(n.lower()) for n in names]])
    return np.concatenate(out)


def cubes(files):
    for f in files:
        with h5py.File(f, "r") as h:
            d = h["cubes"]
            for start in range(0, d.shape[0], 64):
                yield from d[start:start + 64]


def predict(client, info, data, out):
    names = [o["name"] for o in info["outputs"]]
    files = shards(data)
    true = labels(files, names)
    n, p = len(true), len(names)
    pred, cov, with_cov = np.zeros((n, p)), np.zeros((n, p, p)), True
    t0, last = time.time(), time.time()
    for done, (k, r) in enumerate(client.predict_stream(cubes(files)), 1):
        if isinstance(r, str):
            sys.exit(f"predict_dataset.py: {data} cube {k}: {r}")
        pred[k] = [r["parameters"][m] for m in names]
        if r["covariance"] is None:
            with_cov = False
        else:
            cov[k] = r["covariance"]
        if time.time() - last > 10 or done == n:
            last = time.time()
            print(f"   {os.path.basename(data.rstrip('/'))}: {done}/{n} cubes, {done / (last - t0):.0f} cubes/s",
                  file=sys.stderr)
    pairs = [(i, j) for i in range(p) for j in range(i, p)]
    with open(out + ".tmp", "w") as f:
        f.write("index," + ",".join("true_" + m for m in names) + "," + ",".join("pred_" + m for m in names))
        if with_cov:
            f.write("," + ",".join("sigma_" + m for m in names) + "," +
                    ",".join(f"cov_{names[i]}_{names[j]}" for i, j in pairs))
        f.write("\n")
        for i in range(n):
            row = [f"{i}"] + [f"{v:.7g}" for v in true[i]] + [f"{v:.7g}" for v in pred[i]]
            if with_cov:
                row += [f"{np.sqrt(cov[i, j, j]):.7g}" for j in range(p)] + [f"{cov[i, a, b]:.9g}" for a, b in pairs]
            f.write(",".join(row) + "\n")
    os.replace(out + ".tmp", out)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", required=True)
    ap.add_argument("--data")
    ap.add_argument("--out")
    ap.add_argument("--info-json", help="write the server's ModelInfo (version, checksum, members) here")
    ap.add_argument("--timeout", type=float, default=7200)
    a = ap.parse_args()
    if not a.info_json and not (a.data and a.out):
        ap.error("need --data and --out, or --info-json")
    client, info = connect(a.address, a.timeout)
    if a.info_json:
        with open(a.info_json + ".tmp", "w") as f:
            json.dump(info, f, indent=1)
        os.replace(a.info_json + ".tmp", a.info_json)
    if a.data:
        n = predict(client, info, a.data, a.out)
        print(f"predict_dataset.py: {n} cubes of {a.data} predicted by {info['version']} "
              f"(uncertainty: {info['uncertainty']}) -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
