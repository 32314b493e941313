#!/usr/bin/env bash
# Installs what vaedecode builds and tests with: Debian's packages (podman
# with runc, and debootstrap for a base image where no registry is
# reachable: tests/deploy/images_test.sh), then
# LibTorch from PyPI's torch wheel (tools/libtorch.sh). Idempotent: a machine
# that already has them pays one dpkg query and a checksum stamp read.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java bazel-platforms
  build-essential
  libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libpng-dev libjpeg62-turbo-dev libcpp-httplib-dev
  libavcodec-dev libavformat-dev libavutil-dev libswscale-dev patchelf
  python3-grpcio python3-protobuf python3-numpy python3-pip
  prometheus yamllint python3-yaml openssl curl
  clang libclang-rt-14-dev clang-format
  podman runc debootstrap
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'install ok installed' > /dev/null || missing+=("$p")
done

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

"$(dirname "$0")/libtorch.sh"
