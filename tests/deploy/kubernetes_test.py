#!/usr/bin/python3
"""Checks deploy/kubernetes offline: `kubectl kustomize` renders it, and the rendered objects hang
together with each other and with this build's cosmoflow-server (every container's flags are ones
the server accepts; probes are gRPC on the serving port; every selector matches the pods; the
grace period covers the drain timeout; the autoscaler's metric is one the server exports; the
scrape annotation names the metrics port). The KServe InferenceService example gets the same
container checks. A mutated copy must fail the checks, so they can see a mistake.
Exit 77 (skipped) without kubectl.
    kubernetes_test.py SOURCE_DIR SERVER_BINARY"""
import copy
import os
import shutil
import subprocess
import sys

import yaml

API = {"Deployment": "apps/v1", "Service": "v1", "PodDisruptionBudget": "policy/v1",
       "HorizontalPodAutoscaler": "autoscaling/v2"}


def flag(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def check_container(c, server, problems, where):
    args = list(c.get("args", []))
    r = subprocess.run([server] + args + ["--help"], capture_output=True, text=True)
    if r.returncode != 0:
        problems.append(f"{where}: cosmoflow-server refuses the args: {r.stderr.strip().splitlines()[0]}")
    port = int(flag(args, "--address", "0.0.0.0:8500").rsplit(":", 1)[1])
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if port not in ports.values():
        problems.append(f"{where}: no containerPort {port} (the --address port)")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in c and c[probe].get("grpc", {}).get("port") != port:
            problems.append(f"{where}: {probe} is not a gRPC probe on port {port}")
    if "readinessProbe" not in c:
        problems.append(f"{where}: no readinessProbe")
    return args, ports


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check(objects, server, metric_names):
    problems = []
    kinds = {}
    for o in objects:
        kinds.setdefault(o.get("kind"), []).append(o)
        if API.get(o.get("kind")) not in (None, o.get("apiVersion")):
            problems.append(f"{o.get('kind')}: apiVersion {o.get('apiVersion')}, expected {API[o['kind']]}")
        if not o.get("metadata", {}).get("name"):
            problems.append(f"{o.get('kind')}: no metadata.name")
    for kind in API:
        if kind not in kinds:
            problems.append(f"no {kind}")
    if problems:
        return problems
    dep = kinds["Deployment"][0]
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    if not matches(dep["spec"]["selector"]["matchLabels"], labels):
        problems.append("Deployment: selector does not match its pod labels")
    c = pod["spec"]["containers"][0]
    args, ports = check_container(c, server, problems, "Deployment")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe not in c:
            problems.append(f"Deployment: no {probe}")
    drain = float(flag(args, "--drain-timeout-s", "30"))
    if pod["spec"].get("terminationGracePeriodSeconds", 30) <= drain:
        problems.append(f"Deployment: terminationGracePeriodSeconds does not cover --drain-timeout-s {drain}")
    metrics_port = int(flag(args, "--metrics-address", "0.0.0.0:9464").rsplit(":", 1)[1])
    if pod["metadata"].get("annotations", {}).get("prometheus.io/port") != str(metrics_port):
        problems.append(f"Deployment: prometheus.io/port is not the metrics port {metrics_port}")
    for svc in kinds["Service"]:
        if not matches(svc["spec"].get("selector"), labels):
            problems.append(f"Service {svc['metadata']['name']}: selector does not match the pods")
        for p in svc["spec"]["ports"]:
            if p.get("targetPort") not in ports:
                problems.append(f"Service {svc['metadata']['name']}: targetPort {p.get('targetPort')} is no named container port")
    if not any(s["spec"].get("clusterIP") == "None" for s in kinds["Service"]):
        problems.append("no headless Service (clusterIP: None) for client-side balancing")
    if not matches(kinds["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"], labels):
        problems.append("PodDisruptionBudget: selector does not match the pods")
    hpa = kinds["HorizontalPodAutoscaler"][0]["spec"]
    if hpa["scaleTargetRef"].get("name") != dep["metadata"]["name"]:
        problems.append("HorizontalPodAutoscaler: scaleTargetRef is not the Deployment")
    for m in hpa.get("metrics", []):
        name = m.get("pods", {}).get("metric", {}).get("name")
        if name and name not in metric_names:
            problems.append(f"HorizontalPodAutoscaler: metric {name} is not exported by the server")
    if hpa.get("minReplicas", 1) < kinds["PodDisruptionBudget"][0]["spec"].get("minAvailable", 0):
        problems.append("HorizontalPodAutoscaler: minReplicas below the PodDisruptionBudget's minAvailable")
    return problems


def main():
    src, server = sys.argv[1], sys.argv[2]
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("SKIP: kubectl not installed (Debian: kubernetes-client): deploy/kubernetes not rendered")
        return 77
    rendered = subprocess.run([kubectl, "kustomize", os.path.join(src, "deploy/kubernetes")],
                              capture_output=True, text=True, timeout=120)
    if rendered.returncode != 0:
        print(f"FAIL: kubectl kustomize: {rendered.stderr.strip()}")
        return 1
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    with open(os.path.join(src, "server/metrics.cc")) as f:
        metric_names = {line.split('"')[1] for line in f if '.Name("' in line}
    problems = check(objects, server, metric_names)
    mutated = copy.deepcopy(objects)
    for o in mutated:
        if o["kind"] == "PodDisruptionBudget":
            o["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/component": "other"}
    if not check(mutated, server, metric_names):
        problems.append("the checks did not see a PodDisruptionBudget selecting no pod: they prove nothing")
    with open(os.path.join(src, "deploy/kubernetes/kserve-inferenceservice.yaml")) as f:
        isvc = yaml.safe_load(f)
    kserve_problems = []
    check_container(isvc["spec"]["predictor"]["containers"][0], server, kserve_problems, "InferenceService")
    if "h2c" not in {p.get("name") for p in isvc["spec"]["predictor"]["containers"][0]["ports"]}:
        kserve_problems.append("InferenceService: no port named h2c (KServe's gRPC port)")
    problems += kserve_problems
    for p in problems:
        print(f"FAIL: {p}")
    if not problems:
        print(f"ok: {len(objects)} objects rendered and consistent; the InferenceService example too")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
