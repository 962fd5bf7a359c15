#!/usr/bin/env bash
# Installs the Debian 12 packages gridsync needs, skipping those already
# present. Debian packages only: no pip, no downloads of our own.
set -euo pipefail

PACKAGES=(
  # toolchain
  g++ cmake make pkg-config ccache git
  # libraries
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev libboost-dev libgtest-dev
  nlohmann-json3-dev libspdlog-dev libcli11-dev libeigen3-dev libstb-dev
  libsystemd-dev libgloo-dev libsodium-dev prometheus-cpp-dev zlib1g-dev
  # the MLP's GEMMs on AVX-512 and AMX (run-time dispatch; Eigen without it)
  libdnnl-dev
  # emulated multi-host tests (network namespaces, tc)
  iproute2
  # libFuzzer targets (scripts/fuzz.sh): clang with its fuzzer and sanitizer runtimes
  clang-14 libclang-rt-14-dev
  # the default training image (grace_hopper.jpg, public domain)
  python-matplotlib-data
  # the PyTorch peer of gridsync-bench and its tests
  python3 python3-torch python3-numpy
  # the plots of gridsync-bench compress
  gnuplot-nox
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
