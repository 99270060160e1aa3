#!/usr/bin/python3
"""Throughput of 1, 2 and 3 cosmoflow-server replicas behind one client-side balanced target.

Not run by ctest. Each replica is a cosmoflow-server process on loopback pinned with taskset to one
core (replica i on core i mod the number of cores, OMP_NUM_THREADS=1), serving the same small
model (the accuracy study's network, 4 x 32^3 inputs, trained for 2 steps: the weights do not
matter for speed). The load generator is the project's Python client stack (grpcio, the target
"ipv4:127.0.0.1:P1,...", round_robin and the replica service config), keeping --concurrency
Predict calls in flight for --seconds per measurement, alternating the replica counts over
--rounds. Prints cubes/s per replica count (median over rounds) and the calls each replica served.

  /usr/bin/python3 bench/server/replicas_bench.py --build build [--replicas 1,2,3] [--rounds 3]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import cosmoflow_client as cf  # noqa: E402  (after the path is set)
import grpc  # noqa: E402
import numpy as np  # noqa: E402


def make_checkpoint(args, work):
    data = os.path.join(work, "data")
    subprocess.run([args.synth, "--out", data, "--samples", "16", "--side", "32", "--voxel-size", "8",
                    "--redshifts", "0,0.5,1.5,3", "--displacement", "za", "--threads", "1", "--quiet"], check=True)
    run = os.path.join(work, "run")
    subprocess.run([args.train, f"--spec={args.spec}", f"--train={data}", f"--out={run}", "--batch=4",
                    "--max-steps=2", "--tensorboard=false"], check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    return os.path.join(run, "checkpoints")


class Replica:
    def __init__(self, args, ckpt, work, i):
        cores = os.cpu_count() or 1
        self.core = i % cores
        self.dir = os.path.join(work, f"replica{i}")
        os.makedirs(self.dir, exist_ok=True)
        port_file, mport_file = os.path.join(self.dir, "port"), os.path.join(self.dir, "mport")
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(self.core), args.server, "--checkpoint", ckpt, "--address", "127.0.0.1:0",
             "--port-file", port_file, "--metrics-address", "127.0.0.1:0", "--metrics-port-file", mport_file,
             "--watch-interval-ms", "0", "--max-batch", str(args.max_batch)],
            stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.port = int(wait_file(port_file))
        self.metrics_port = int(wait_file(mport_file))
        wait_serving(f"127.0.0.1:{self.port}")

    def served(self):
        """Cubes predicted so far, from the replica's Prometheus counter."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("cosmoflow_predicted_cubes_total"):
                total += float(line.split()[-1])
        return total

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def wait_serving(address, timeout=60):
    """Waits until the replica's health check says SERVING (model loaded and warmed up)."""
    client = cf.CosmoFlowClient(address, timeout=2)
    end = time.time() + timeout
    try:
        while time.time() < end:
            try:
                if client.health("cosmoflow.v1.CosmoFlow") == "SERVING":
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    finally:
        client.close()
    raise RuntimeError(f"{address} never became SERVING")


def wait_file(path, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read().strip()
        time.sleep(0.05)
    raise RuntimeError(f"{path} never appeared")


def load(target, concurrency, seconds, cube):
    """Keeps `concurrency` Predict calls in flight for `seconds`; returns completed calls per second."""
    client = cf.CosmoFlowClient(target, timeout=30)
    client.predict(cube)  # connect (and, for a replica target, wait for round_robin to be ready)
    done, errors, stop = [0], [0], threading.Event()
    lock = threading.Lock()
    req = cf.pb.PredictRequest(cube=cf.cube_message(cube))

    def one():
        if stop.is_set():
            return
        fut = client._stub.Predict.future(req, timeout=30)

        def finished(f):
            with lock:
                if f.exception() is None:
                    done[0] += 1
                else:
                    errors[0] += 1
            one()
        fut.add_done_callback(finished)

    t0 = time.time()
    for _ in range(concurrency):
        one()
    time.sleep(seconds)
    stop.set()
    with lock:
        n, e = done[0], errors[0]
    rate = n / (time.time() - t0)
    time.sleep(1)  # let the calls in flight finish before the channel closes
    client.close()
    if e:
        raise RuntimeError(f"{e} calls failed")
    return rate


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--spec", default=os.path.join(ROOT, "tools/specs/study32x4-overdensity-ns-light.json"))
    ap.add_argument("--replicas", default="1,2,3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--synth", help="synth binary [BUILD/synth/synth]")
    args = ap.parse_args()
    args.server = os.path.join(args.build, "server/cosmoflow-server")
    args.train = os.path.join(args.build, "trainer/cosmoflow-train")
    args.synth = args.synth or os.path.join(args.build, "synth/synth")

    work = tempfile.mkdtemp(prefix="cf-replicas-bench-")
    try:
        ckpt = make_checkpoint(args, work)
        cube = np.random.default_rng(1).poisson(3, size=(4, 32, 32, 32)).astype(np.int16)
        counts = [int(x) for x in args.replicas.split(",")]
        rates = {n: [] for n in counts}
        shares = {}
        for rnd in range(args.rounds):
            for n in counts if rnd % 2 == 0 else reversed(counts):
                reps = [Replica(args, ckpt, os.path.join(work, f"r{rnd}-{n}"), i) for i in range(n)]
                try:
                    target = "ipv4:" + ",".join(f"127.0.0.1:{r.port}" for r in reps)
                    before = [r.served() for r in reps]
                    rates[n].append(load(target, args.concurrency, args.seconds, cube))
                    shares[n] = [r.served() - b for r, b in zip(reps, before)]
                finally:
                    for r in reps:
                        r.stop()
                print(f"  round {rnd + 1}, {n} replica(s): {rates[n][-1]:.1f} cubes/s", flush=True)
        print(f"\n{os.path.basename(args.spec)}, max batch {args.max_batch}, {args.concurrency} calls in flight,"
              f" {args.seconds:.0f} s per measurement, {args.rounds} rounds, {os.cpu_count()} cores")
        print("| replicas | cores (taskset) | cubes/s (median) | all rounds | vs 1 replica | cubes served per replica (last round) |")
        print("|---|---|---|---|---|---|")
        base = statistics.median(rates[counts[0]])
        for n in counts:
            med = statistics.median(rates[n])
            cores = ",".join(str(i % (os.cpu_count() or 1)) for i in range(n))
            print(f"| {n} | {cores} | {med:.1f} | {', '.join(f'{r:.1f}' for r in rates[n])} | "
                  f"{med / base:.2f}x | {', '.join(f'{s:.0f}' for s in shares.get(n, []))} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
