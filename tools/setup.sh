#!/usr/bin/env bash
# Installs the Debian packages vaedecode builds and tests with. Idempotent:
# a machine that already has them pays one dpkg query and nothing else.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java bazel-platforms
  build-essential
  libtorch-dev libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libpng-dev
  libopenblas0-pthread
  python3-grpcio python3-protobuf python3-torch
  prometheus yamllint python3-yaml
  clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's LibTorch calls whatever libblas.so.3 resolves to; the reference
# netlib BLAS makes the attention matmuls ~2x slower than OpenBLAS.
openblas=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas | head -n1 || true)
if [ -n "$openblas" ]; then
  current=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || true)
  if [ "$current" != "$(readlink -f "$openblas")" ]; then
    $SUDO update-alternatives --set libblas.so.3-x86_64-linux-gnu "$openblas" >/dev/null
  fi
fi
