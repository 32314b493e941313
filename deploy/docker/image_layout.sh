#!/usr/bin/env bash
# What an image's runtime stage copies, laid out from a Bazel output tree:
# the Dockerfiles' build stages and deploy/docker/build_image.sh (CI, from
# binaries built on the host) both run this, so the two cannot differ.
#
#   deploy/docker/image_layout.sh cpu|gpu BIN_DIR OUT_DIR
#
# cpu: stage.sh's layout (binaries, LibTorch in lib/, runtime-packages.txt).
# gpu: the same from a --config=gpu build, with NVIDIA's libraries taken from
#   the PyPI wheels torch pins (tools/nvidia_wheels.sh) into lib/ rather than
#   from the build machine's CUDA toolkit.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 3 ] || { echo "usage: image_layout.sh cpu|gpu BIN_DIR OUT_DIR" >&2; exit 2; }
flavour=$1
bin=$2
out=$3
case "$flavour" in
  cpu) deploy/docker/stage.sh "$bin" "$out" ;;
  gpu)
    # Every library one of the NVIDIA wheels provides: not copied from the
    # build machine, and allowed not to resolve there.
    nvidia='^lib(cudart|cupti|cublas|cublasLt|cudnn[a-z_]*|cufft|cufile|curand|cusolver|cusparse|cusparseLt|nccl|nvJitLink|nvrtc|nvshmem_host)\.so'
    deploy/docker/stage.sh --host-libs "$nvidia" "$bin" "$out"
    # Unpacked once per set of wheels, then hard-linked (2.6 GiB).
    cache=${VAEDECODE_CACHE:-$HOME/.cache/vaedecode}/nvidia-libs
    key=$( (tools/nvidia_wheels.sh --list | xargs -n1 basename; sha256sum tools/nvidia_wheels.sh) | sha256sum | cut -c1-16)
    if [ ! -f "$cache/$key/NVIDIA_WHEELS" ]; then
      rm -rf "$cache/$key.partial"
      tools/nvidia_wheels.sh --libs "$cache/$key.partial"
      rm -rf "$cache/$key"
      mv "$cache/$key.partial" "$cache/$key"
    fi
    cp -al "$cache/$key/." "$out/opt/vaedecode/lib/" 2>/dev/null || cp -a "$cache/$key/." "$out/opt/vaedecode/lib/"
    ;;
  *) echo "image_layout.sh: unknown flavour $flavour (cpu or gpu)" >&2; exit 2 ;;
esac
