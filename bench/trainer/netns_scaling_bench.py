#!/usr/bin/python3
"""The parallel-efficiency model of docs/training.md against 2 emulated hosts (not run by ctest).

Starts deploy/slurm/netns-cluster.sh with 2 hosts (root only), limits each host's link with a tbf
qdisc at each rate of --rates, and at each rate measures on 2 hosts x 1 rank (srun --mpi=pmix,
OpenMPI over TCP on the hosts' cable):
  - MPI_Allreduce time versus size (trainer_allreduce_bench), interpolated at the gradient size;
  - the trainer's median step on --spec (the accuracy study's network), and the 2-host efficiency
    t_step(1 host x 1 rank) / t_step(2 hosts x 1 rank) at the same batch per rank;
and prints them beside the model's prediction for the same inputs (B = the tbf rate, alpha from the
unlimited link's small-message allreduce, the overlap window and the step time measured on the
unlimited link, gamma assumed). Then, on the unlimited link, it injects per-rank step-time jitter
(--debug-step-jitter S: each rank sleeps N(3S, S) seconds per step, independently) and compares the
measured straggler cost with the model's term sigma sqrt(2 ln N) and the exact expected maximum of N
Gaussians. Last, the model's predictions at 64 / 1,024 / 8,192 KNL nodes.

  sudo bench/trainer/netns_scaling_bench.py --build build [--rates 50mbit,...] [--json FILE]
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLUSTER = os.path.join(ROOT, "deploy", "slurm", "netns-cluster.sh")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900, **kw).stdout


class Cluster:
    """Two namespace hosts with Slurm; every command runs on the controller host or a compute host."""

    def __init__(self, work):
        self.dir = os.path.join(work, "cluster")
        sh([CLUSTER, "start", self.dir, "2", "2"])
        self.prefix = open(os.path.join(self.dir, "prefix")).read().strip()

    def stop(self):
        subprocess.run([CLUSTER, "stop", self.dir], capture_output=True)

    def srun(self, nodes, ranks_per_node, argv):
        env = dict(os.environ, OMPI_MCA_pml="ob1", OMPI_MCA_btl="tcp,self",
                   OMPI_MCA_btl_tcp_if_include="cf0", OMPI_MCA_mpi_yield_when_idle="1",
                   OMP_NUM_THREADS="1")
        return sh([CLUSTER, "exec", self.dir, "srun", "--mpi=pmix", f"--nodes={nodes}",
                   f"--ntasks-per-node={ranks_per_node}", "--cpus-per-task=1", "--time=20",
                   "--kill-on-bad-exit=1"] + argv, env=env)

    def limit(self, rate):
        """tbf on each host's egress (both directions of the cable); 'none' removes it."""
        for host in ("cfn1", "cfn2"):
            ns = f"{self.prefix}-{host}"
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", "cf0", "root"], capture_output=True)
            if rate != "none":
                burst = max(16000, int(rate_bits(rate) / 8 / 250))  # 4 ms of traffic
                sh(["tc", "-n", ns, "qdisc", "add", "dev", "cf0", "root", "tbf", "rate", rate,
                    "burst", str(burst), "latency", "200ms"])


def rate_bits(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * f
    raise ValueError(rate)


def allreduce(cluster, args):
    out = cluster.srun(2, 1, [args.allreduce_bin, "4", "10"])
    return json.loads(out)["sizes"]


def interpolate(sizes, nbytes):
    """Allreduce seconds at nbytes, linear between the measured sizes (power-of-two grid)."""
    pts = [(s["bytes"], s["median_s"]) for s in sizes]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b0 <= nbytes <= b1:
            return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
    return pts[0][1] * nbytes / pts[0][0] if nbytes < pts[0][0] else pts[-1][1] * nbytes / pts[-1][0]


def train(cluster, args, work, nodes, name, jitter=0.0, spec=None, steps=None, data="data", sleep=0.0):
    out = os.path.join(work, f"run-{name}")
    shutil.rmtree(out, ignore_errors=True)
    argv = [args.train_bin, f"--spec={spec or args.spec}", f"--train={work}/{data}", f"--out={out}",
            f"--batch={args.batch}", f"--max-steps={steps or args.steps}", "--epochs=100", "--stage=memory",
            "--recipe=constant", "--lr=0.0001", "--checkpoint-every=100000", "--tensorboard=false",
            "--resume=never", "--log-every=1000"]
    if jitter > 0:
        argv.append(f"--debug-step-jitter={jitter}")
    if sleep > 0:
        argv.append(f"--debug-step-sleep={sleep}")
    try:
        cluster.srun(nodes, 1, argv)
    except subprocess.CalledProcessError as e:  # one retry: a start-up crash was seen once in ~40 runs
        print(f"  {name}: srun failed ({e.returncode}); retrying once", flush=True)
        cluster.srun(nodes, 1, argv)
    return json.load(open(os.path.join(out, "run.json")))


def model_two(t_step, sigma, overlap, S, B, alpha, gamma):
    """docs/training.md's model at N = 2."""
    t_ar = 2 * alpha + S / B + S / 2 * gamma
    exposed = max(0.0, t_ar - overlap)
    straggle = sigma * math.sqrt(2 * math.log(2))
    return t_ar, t_step / (t_step + exposed + straggle)


def expected_max_gauss(n):
    """E[max of n standard normals], by numerical integration (exact up to the grid)."""
    if n == 1:
        return 0.0
    dx, total = 1e-3, 0.0
    x = -8.0
    while x < 8.0:
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        total += x * n * pdf * cdf ** (n - 1) * dx
        x += dx
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--spec", default=os.path.join(ROOT, "tools/specs/study32x4-overdensity-ns-light.json"))
    ap.add_argument("--rates", default="none,2gbit,1gbit,500mbit,200mbit,100mbit,50mbit")
    ap.add_argument("--jitters", default="0.01,0.02,0.04", help="S values (seconds) for --debug-step-jitter")
    ap.add_argument("--jitter-spec", default="tiny32",
                    help="network of the jitter runs: a tiny one, so that the step is mostly the injected sleep")
    ap.add_argument("--jitter-steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=4, help="batch per rank")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--gamma", type=float, default=0.25e-9, help="reduction s/byte (assumed)")
    ap.add_argument("--synth", help="synth binary [BUILD/synth/synth]")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.train_bin = os.path.join(args.build, "trainer/cosmoflow-train")
    args.allreduce_bin = os.path.join(args.build, "bench/trainer/trainer_allreduce_bench")
    synth = args.synth or os.path.join(args.build, "synth/synth")
    args.make_dataset = os.path.join(args.build, "tests/trainer/cf_make_trainer_dataset")

    work = tempfile.mkdtemp(prefix="cf-scaling-", dir="/var/tmp")  # not /tmp: hosts mount their own
    os.chmod(work, 0o755)
    os.makedirs(f"{work}/data1")
    sh([args.make_dataset, f"{work}/data1/part0.h5", "256", "32", "1"])
    sh([synth, "--out", f"{work}/data", "--samples", "128", "--side", "32", "--voxel-size", "8",
        "--redshifts", "0,0.5,1.5,3", "--displacement", "za", "--threads", "1", "--quiet"])
    cluster = Cluster(work)
    try:
        results = run_all(cluster, args, work)
    finally:
        cluster.limit("none")
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(results, args)
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)


def run_all(cluster, args, work):
    res = {"rates": {}, "jitter": {}}
    one = [train(cluster, args, work, 1, "base-a")]
    for rate in args.rates.split(","):
        cluster.limit(rate)
        sizes = allreduce(cluster, args)
        two = train(cluster, args, work, 2, f"two-{rate}")
        res["rates"][rate] = {"allreduce": sizes, "run": two}
        print(f"  {rate}: step {two['median_step_s']:.4f} s, comm wait {100 * two['comm_wait_frac']:.1f}%", flush=True)
    cluster.limit("none")
    one.append(train(cluster, args, work, 1, "base-b"))
    res["one"] = one
    # Per S: 1 and 2 hosts with the jitter, and with a constant sleep of its mean 3S (what sleeping
    # itself costs 2 hosts, e.g. waking the peer's progress, is then not counted as straggling).
    kw = dict(spec=args.jitter_spec, steps=args.jitter_steps, data="data1")
    for s in (float(x) for x in args.jitters.split(",")):
        res["jitter"][s] = {"one": train(cluster, args, work, 1, f"j1-{s}", s, **kw),
                            "two": train(cluster, args, work, 2, f"j2-{s}", s, **kw),
                            "one_const": train(cluster, args, work, 1, f"c1-{s}", sleep=3 * s, **kw),
                            "two_const": train(cluster, args, work, 2, f"c2-{s}", sleep=3 * s, **kw)}
        print(f"  jitter {s}: done", flush=True)
    return res


def report(res, args):
    one = res["one"]
    t1 = statistics.median(r["median_step_s"] for r in one)
    sigma1 = statistics.median(r.get("stdev_step_s", 0) for r in one)
    free = res["rates"].get("none") or next(iter(res["rates"].values()))
    S = free["run"]["gradient_bytes"]
    # alpha: half the smallest allreduce (64 kB) on the unlimited link, an upper bound (it
    # includes 64 kB of transfer, about 10 us at the veth's speed).
    alpha = free["allreduce"][0]["median_s"] / 2
    two = free["run"]
    overlap = max(0.0, two["median_comm_span_s"] - two["comm_wait_frac"] * two["median_step_s"])
    base_runs = ", ".join(f"{r['median_step_s'] * 1e3:.1f}" for r in one)
    print(f"\n2 hosts x 1 rank, {os.path.basename(args.spec)}, batch {args.batch} per rank, {args.steps} steps;"
          f" gradients S = {S / 1e6:.3f} MB; 1 host x 1 rank step {t1 * 1e3:.1f} ms (runs: "
          f"{base_runs}), sigma {sigma1 * 1e3:.1f} ms;"
          f" overlap window {overlap * 1e3:.1f} ms; alpha {alpha * 1e6:.0f} us; gamma {args.gamma * 1e9:.2f} ns/B (assumed)")
    print("| link (tbf) | allreduce of S, measured ms | model ms | measured / model | 2-host step ms | efficiency measured | model |")
    print("|---|---|---|---|---|---|---|")
    for rate, r in res["rates"].items():
        t_ar = interpolate(r["allreduce"], S)
        # Unlimited link: B is what the measured allreduce implies (the model is then exact for T_ar).
        B = rate_bits(rate) / 8 if rate != "none" else S / max(t_ar - 2 * alpha - S / 2 * args.gamma, 1e-6)
        m_ar, m_eff = model_two(t1, sigma1, overlap, S, B, alpha, args.gamma)
        t2 = r["run"]["median_step_s"]
        label = rate if rate != "none" else f"none (B = {B * 8 / 1e9:.1f} Gbit/s implied)"
        r["summary"] = {"allreduce_ms": t_ar * 1e3, "model_allreduce_ms": m_ar * 1e3, "step_ms": t2 * 1e3,
                        "efficiency": t1 / t2, "model_efficiency": m_eff}
        print(f"| {label} | {t_ar * 1e3:.2f} | {m_ar * 1e3:.2f} | {t_ar / m_ar:.2f} | {t2 * 1e3:.1f} | "
              f"{100 * t1 / t2:.0f}% | {100 * m_eff:.0f}% |")

    print(f"\nJitter ({args.jitter_spec}, batch {args.batch} per rank, {args.jitter_steps} steps, mean step times):"
          " each rank sleeps N(3S, S) per step; straggler cost = (2 hosts - 1 host) with the jitter minus"
          " (2 hosts - 1 host) with a constant sleep of 3S")
    print("| S ms | 1 host, jitter | 2 hosts, jitter | 1 host, 3S constant | 2 hosts, 3S constant | straggler cost ms "
          "| model sigma sqrt(2 ln 2) ms | exact E[max of 2] - mean ms |")
    print("|---|---|---|---|---|---|---|---|")
    for s, r in res["jitter"].items():
        m = {k: v["mean_step_s"] * 1e3 for k, v in r.items() if isinstance(v, dict) and "mean_step_s" in v}
        cost = (m["two"] - m["one"]) - (m["two_const"] - m["one_const"])
        r["summary"] = {"cost_ms": cost, "model_ms": s * math.sqrt(2 * math.log(2)) * 1e3,
                        "exact_ms": s * expected_max_gauss(2) * 1e3}
        print(f"| {s * 1e3:.0f} | {m['one']:.1f} | {m['two']:.1f} | {m['one_const']:.1f} | {m['two_const']:.1f} | "
              f"{cost:.1f} | {r['summary']['model_ms']:.1f} | {r['summary']['exact_ms']:.1f} |")

    print("\nModel at scale (docs/training.md inputs: sc18 S = 28.2 MB, B = 5 GB/s, alpha = 5 us, gamma = 0.25 ns/B,"
          " KNL step 0.15 s, no overlap: the allreduce fully exposed); paper: 77% at 8192 nodes")
    print("| nodes | CV | straggler sqrt(2 ln N) | efficiency (model) | straggler E[max of N] | efficiency (exact max) |")
    print("|---|---|---|---|---|---|")
    t_knl, S_sc18 = 3 * 21.3e9 / (3.5e15 / 8192), 28.2e6
    for cv in (0.01, 0.03, 0.05):
        for n in (64, 1024, 8192):
            t_ar = 2 * math.log2(n) * 5e-6 + 2 * (n - 1) / n * S_sc18 / 5e9 + (n - 1) / n * S_sc18 * 0.25e-9
            exposed = t_ar
            sig = cv * t_knl
            e_model = t_knl / (t_knl + exposed + sig * math.sqrt(2 * math.log(n)))
            e_exact = t_knl / (t_knl + exposed + sig * expected_max_gauss(n))
            print(f"| {n} | {100 * cv:.0f}% | {math.sqrt(2 * math.log(n)):.2f} sigma | {100 * e_model:.0f}% | "
                  f"{expected_max_gauss(n):.2f} sigma | {100 * e_exact:.0f}% |")


if __name__ == "__main__":
    main()
