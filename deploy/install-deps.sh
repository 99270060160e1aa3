#!/usr/bin/env bash
# Installs every Debian 12 package that the build, the tests, the benchmarks and the quickstart need.
# Idempotent; run as root (or with sudo). Usage: deploy/install-deps.sh [--no-peer]
#   --no-peer  skip PyTorch (the benchmark peer, ~1 GiB); tests and the main job do not need it.
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

pkgs=(
  # toolchain
  build-essential cmake pkg-config git
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
  python3-grpcio python3-grpc-tools python3-numpy python3-h5py python3-matplotlib python3-protobuf
)
if [ "$want_peer" = 1 ]; then pkgs+=(python3-torch libtcmalloc-minimal4); fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps.sh: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps.sh: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
# Debian's slurm/munge/prometheus packages may start daemons under systemd; we start our own.
