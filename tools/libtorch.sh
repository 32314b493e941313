#!/usr/bin/env bash
# Installs the project's LibTorch: the C++ LibTorch inside PyPI's torch wheel,
# pinned to the GPU machine's version (2.11.0+cu130), plus, from NVIDIA's
# PyPI wheels, the two CUDA runtime libraries that libtorch_cpu.so loads even
# on a CPU (libcudart, libcupti) and the three that libtorch_cuda.so needs
# beyond /usr/local/cuda (cuSPARSELt, cuFile, NVSHMEM: --config=gpu links
# against them, and the GPU bundle's binaries load here with them). Wheels
# are cached and checked by SHA-256; the unpacked tree is reused while its
# stamp matches.
#
#   tools/libtorch.sh          # fetch (if needed), unpack (if needed), link
#   tools/libtorch.sh --print  # print the unpacked tree's path
#
# Layout (VAEDECODE_CACHE, default ~/.cache/vaedecode):
#   wheels/                         the downloaded wheels
#   libtorch/2.11.0+cu130/include   torch/include without the copies of fmt,
#                                   protobuf and pybind11 it bundles (the
#                                   build uses Debian's: spdlog needs fmt 9,
#                                   the gRPC code protobuf 3.21)
#   libtorch/2.11.0+cu130/lib       libc10, libtorch_cpu, libgomp, libcudart,
#                                   libcupti (CPU); libc10_cuda, libtorch_cuda,
#                                   libtorch_nvshmem, libcusparseLt, libcufile,
#                                   libnvshmem_host (--config=gpu)
# and third_party/torch/libtorch -> that tree, which WORKSPACE's @libtorch reads.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly TORCH_VERSION=2.11.0
readonly TORCH_LOCAL=cu130
# Python tag of the pinned wheel: the GPU machine's (its LibTorch is the same build).
readonly TORCH_WHEEL=torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl
readonly TORCH_SHA256=0f68f4ac6d95d12e896c3b7a912b5871619542ec54d3649cf48cc1edd4dd2756
readonly CUDART_WHEEL=nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
readonly CUDART_SHA256=7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548
readonly CUPTI_WHEEL=nvidia_cuda_cupti-13.0.85-py3-none-manylinux_2_25_x86_64.whl
readonly CUPTI_SHA256=4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8
# The versions torch 2.11.0's wheel requires.
readonly CUSPARSELT_WHEEL=nvidia_cusparselt_cu13-0.8.0-py3-none-manylinux2014_x86_64.whl
readonly CUSPARSELT_SHA256=25e30a8a7323935d4ad0340b95a0b69926eee755767e8e0b1cf8dd85b197d3fd
readonly CUFILE_WHEEL=nvidia_cufile-1.15.1.6-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
readonly CUFILE_SHA256=08a3ecefae5a01c7f5117351c64f17c7c62efa5fffdbe24fc7d298da19cd0b44
readonly NVSHMEM_WHEEL=nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
readonly NVSHMEM_SHA256=290f0a2ee94c9f3687a02502f3b9299a9f9fe826e6d0287ee18482e78d495b80

cache=${VAEDECODE_CACHE:-$HOME/.cache/vaedecode}
wheels="$cache/wheels"
tree="$cache/libtorch/${TORCH_VERSION}+${TORCH_LOCAL}"
link=third_party/torch/libtorch

if [ "${1:-}" = "--print" ]; then
  echo "$tree"
  exit 0
fi

pip_cmd() {
  local py
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
      echo "$py -m pip"
      return 0
    fi
  done
  return 1
}

sha_ok() { [ -f "$1" ] && echo "$2  $1" | sha256sum --quiet -c - 2>/dev/null; }

# fetch WHEEL SHA256 REQUIREMENT PLATFORM...: the wheel alone (--no-deps), for
# an explicit platform and Python, so any interpreter downloads the same file.
fetch() {
  local wheel=$1 sha=$2 requirement=$3
  shift 3
  local file="$wheels/$wheel"
  sha_ok "$file" "$sha" && return 0
  mkdir -p "$wheels"
  local pip
  pip=$(pip_cmd) || { echo "libtorch.sh: no pip to fetch $wheel from PyPI (install python3-pip)" >&2; exit 1; }
  local platforms=()
  for p in "$@"; do platforms+=(--platform "$p"); done
  echo "libtorch.sh: fetching $wheel from PyPI" >&2
  rm -f "$file"
  $pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --dest "$wheels" "$requirement" >&2
  if ! sha_ok "$file" "$sha"; then
    echo "libtorch.sh: $file is missing or its SHA-256 is not $sha" >&2
    exit 1
  fi
}

stamp="$TORCH_SHA256 $CUDART_SHA256 $CUPTI_SHA256 $CUSPARSELT_SHA256 $CUFILE_SHA256 $NVSHMEM_SHA256 layout=1"
if [ "$(cat "$tree/.stamp" 2>/dev/null)" != "$stamp" ]; then
  fetch "$TORCH_WHEEL" "$TORCH_SHA256" "torch==$TORCH_VERSION" manylinux_2_28_x86_64
  fetch "$CUDART_WHEEL" "$CUDART_SHA256" nvidia-cuda-runtime==13.0.96 manylinux_2_17_x86_64
  fetch "$CUPTI_WHEEL" "$CUPTI_SHA256" nvidia-cuda-cupti==13.0.85 manylinux_2_25_x86_64
  fetch "$CUSPARSELT_WHEEL" "$CUSPARSELT_SHA256" nvidia-cusparselt-cu13==0.8.0 manylinux2014_x86_64
  fetch "$CUFILE_WHEEL" "$CUFILE_SHA256" nvidia-cufile==1.15.1.6 manylinux_2_17_x86_64
  fetch "$NVSHMEM_WHEEL" "$NVSHMEM_SHA256" nvidia-nvshmem-cu13==3.4.5 manylinux_2_17_x86_64
  echo "libtorch.sh: unpacking LibTorch $TORCH_VERSION+$TORCH_LOCAL into $tree" >&2
  rm -rf "$tree.partial"
  mkdir -p "$tree.partial"
  # Python's zipfile (Debian's python3 is always there; unzip may not be).
  /usr/bin/python3 - "$tree.partial" "$wheels/$TORCH_WHEEL" "$wheels/$CUDART_WHEEL" "$wheels/$CUPTI_WHEEL" \
    "$wheels/$CUSPARSELT_WHEEL" "$wheels/$CUFILE_WHEEL" "$wheels/$NVSHMEM_WHEEL" <<'PY'
import os, sys, zipfile

dest, torch_wheel, *cuda_wheels = sys.argv[1:]
SKIP_HEADERS = ("torch/include/fmt/", "torch/include/google/", "torch/include/pybind11/")
LIBS = {"libc10.so", "libtorch_cpu.so", "libgomp.so.1", "libc10_cuda.so", "libtorch_cuda.so",
        "libtorch_nvshmem.so", "libcudart.so.13", "libcupti.so.13", "libcusparseLt.so.0", "libcufile.so.0",
        "libnvshmem_host.so.3"}

def extract(archive, member, target):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with archive.open(member) as src, open(target, "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
    if ".so" in os.path.basename(target):
        os.chmod(target, 0o755)

found = set()
for wheel in [torch_wheel] + cuda_wheels:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.endswith("/"):
                continue
            if member.startswith("torch/include/") and not member.startswith(SKIP_HEADERS):
                extract(archive, member, os.path.join(dest, "include", member[len("torch/include/"):]))
            elif member == "torch/version.py":
                extract(archive, member, os.path.join(dest, "version.py"))
            elif os.path.basename(member) in LIBS and "/lib/" in member:
                extract(archive, member, os.path.join(dest, "lib", os.path.basename(member)))
                found.add(os.path.basename(member))
missing = LIBS - found
if missing:
    sys.exit(f"libtorch.sh: the wheels lack {sorted(missing)}")
PY
  echo "$TORCH_VERSION+$TORCH_LOCAL" > "$tree.partial/VERSION"
  echo "$stamp" > "$tree.partial/.stamp"
  rm -rf "$tree"
  mv "$tree.partial" "$tree"
fi

if [ "$(readlink "$link" 2>/dev/null)" != "$tree" ]; then
  rm -rf "$link"
  ln -s "$tree" "$link"
fi
