#!/usr/bin/env bash
# Installs every Debian 12 package that the build, the tests, the benchmarks and the quickstart need.
# Idempotent; run as root (or with sudo). Usage: deploy/install-deps.sh [--no-peer]
#   --no-peer  skip what only the benchmark peer needs (tcmalloc). PyTorch itself is installed in any
#              case: the export tests load the exported PyTorch module with it.
# Also installs onnxruntime-node from npm into .deps/node/ (for the export tests) when npm exists.
set -euo pipefail
want_peer=1
for a in "$@"; do
  case "$a" in
    --no-peer) want_peer=0 ;;
    *) echo "install-deps.sh: unknown option '$a'" >&2; exit 2 ;;
  esac
done
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
repo="$(cd "$(dirname "$0")/.." && pwd)"

# ONNX Runtime for the export tests (not in Debian): the npm package, project-local. Its install
# script downloads extra (GPU) binaries and is skipped; the CPU libraries are inside the package.
ort_version=1.20.1
install_onnxruntime_node() {
  local dir="$repo/.deps/node"
  if [ -f "$dir/node_modules/onnxruntime-node/package.json" ] &&
     grep -q "\"version\": \"$ort_version\"" "$dir/node_modules/onnxruntime-node/package.json"; then
    echo "install-deps.sh: onnxruntime-node $ort_version present in $dir"
    return
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "install-deps.sh: npm not found: onnxruntime-node not installed (the export tests skip their ONNX Runtime check)"
    return
  fi
  mkdir -p "$dir"
  npm install --prefix "$dir" --ignore-scripts --no-audit --no-fund --no-save "onnxruntime-node@$ort_version"
}

pkgs=(
  # toolchain
  build-essential cmake pkg-config git ccache
  # the required stack
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools
  prometheus-cpp-dev
  libfftw3-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev
  # integration tests: real Slurm, real Prometheus, Python client
  slurm-wlm munge prometheus
  # the multi-host tests: network namespaces (ip netns), tc bandwidth limits, nsenter/unshare
  iproute2 util-linux
  python3-grpcio python3-grpc-tools python3-numpy python3-scipy python3-h5py python3-matplotlib python3-protobuf
  # cosmoflow-export (checkpoint checksum, ONNX graph and checker) and its tests (the PyTorch module)
  python3-crcmod python3-onnx python3-torch
  # the libFuzzer targets (fuzz/, -DCOSMOFLOW_FUZZ=ON): clang, its sanitizer runtimes, its OpenMP
  clang-14 libclang-rt-14-dev libomp-14-dev
  # the L7 gRPC proxy in front of replicas (deploy/nginx/), run by tests/client/replicas_test.cc
  nginx-light
)
if [ "$want_peer" = 1 ]; then pkgs+=(libtcmalloc-minimal4); fi
# deploy/kubernetes is rendered by `kubectl kustomize` in the tests; any kubectl will do.
command -v kubectl > /dev/null || pkgs+=(kubernetes-client)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps.sh: all ${#pkgs[@]} packages present"
else
  echo "install-deps.sh: installing ${#missing[@]} packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  # Debian's slurm/munge/prometheus packages may start daemons under systemd; we start our own.
fi
install_onnxruntime_node
