#!/usr/bin/env bash
# NVIDIA's runtime libraries from the PyPI wheels torch 2.11.0 pins (its
# Requires-Dist: cuda-toolkit[...]==13.0.2's components, cuDNN 9.19.0.56,
# NCCL 2.28.9, cuSPARSELt 0.8.0, NVSHMEM 3.4.5): the GPU image carries
# these, and the rehearsal of a bare GPU machine installs them beside the
# torch wheel, so one set of versions runs everywhere. Cached in
# $VAEDECODE_CACHE/wheels beside tools/libtorch.sh's and checked by SHA-256.
#
#   tools/nvidia_wheels.sh --list      # fetch if needed; print the wheels' paths
#   tools/nvidia_wheels.sh --libs DIR  # ...and unpack their shared libraries
#                                      # flat into DIR, with DIR/NVIDIA_WHEELS
#                                      # naming each wheel and its SHA-256
#   tools/nvidia_wheels.sh --toolkit DIR  # a CUDA tree to build --config=gpu
#                                      # against where no CUDA toolkit is
#                                      # installed (the GPU Dockerfile's build
#                                      # stage): DIR/lib64 as --libs plus the
#                                      # linker's unversioned names, DIR/include
#                                      # the runtime's, CRT's and NCCL's headers
set -euo pipefail
cd "$(dirname "$0")/.."

# file name, SHA-256, requirement, platform (pip download needs the wheel's own).
readonly WHEELS=(
  "nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171 nvidia-cublas==13.1.0.3 manylinux_2_27_x86_64"
  "nvidia_cuda_cupti-13.0.85-py3-none-manylinux_2_25_x86_64.whl 4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8 nvidia-cuda-cupti==13.0.85 manylinux_2_25_x86_64"
  "nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575 nvidia-cuda-nvrtc==13.0.88 manylinux_2_12_x86_64"
  "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548 nvidia-cuda-runtime==13.0.96 manylinux_2_17_x86_64"
  "nvidia_cudnn_cu13-9.19.0.56-py3-none-manylinux_2_27_x86_64.whl d20e1734305e9d68889a96e3f35094d733ff1f83932ebe462753973e53a572bf nvidia-cudnn-cu13==9.19.0.56 manylinux_2_27_x86_64"
  "nvidia_cufft-12.0.0.61-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 6c44f692dce8fd5ffd3e3df134b6cdb9c2f72d99cf40b62c32dde45eea9ddad3 nvidia-cufft==12.0.0.61 manylinux_2_17_x86_64"
  "nvidia_cufile-1.15.1.6-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 08a3ecefae5a01c7f5117351c64f17c7c62efa5fffdbe24fc7d298da19cd0b44 nvidia-cufile==1.15.1.6 manylinux_2_17_x86_64"
  "nvidia_curand-10.4.0.35-py3-none-manylinux_2_27_x86_64.whl 1aee33a5da6e1db083fe2b90082def8915f30f3248d5896bcec36a579d941bfc nvidia-curand==10.4.0.35 manylinux_2_27_x86_64"
  "nvidia_cusolver-12.0.4.66-py3-none-manylinux_2_27_x86_64.whl 0a759da5dea5c0ea10fd307de75cdeb59e7ea4fcb8add0924859b944babf1112 nvidia-cusolver==12.0.4.66 manylinux_2_27_x86_64"
  "nvidia_cusparse-12.6.3.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 2b3c89c88d01ee0e477cb7f82ef60a11a4bcd57b6b87c33f789350b59759360b nvidia-cusparse==12.6.3.3 manylinux_2_17_x86_64"
  "nvidia_cusparselt_cu13-0.8.0-py3-none-manylinux2014_x86_64.whl 25e30a8a7323935d4ad0340b95a0b69926eee755767e8e0b1cf8dd85b197d3fd nvidia-cusparselt-cu13==0.8.0 manylinux2014_x86_64"
  "nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_x86_64.whl e4553a30f34195f3fa1da02a6da3d6337d28f2003943aa0a3d247bbc25fefc42 nvidia-nccl-cu13==2.28.9 manylinux_2_18_x86_64"
  "nvidia_nvjitlink-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl 13a74f429e23b921c1109976abefacc69835f2f433ebd323d3946e11d804e47b nvidia-nvjitlink==13.0.88 manylinux_2_12_x86_64"
  "nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 290f0a2ee94c9f3687a02502f3b9299a9f9fe826e6d0287ee18482e78d495b80 nvidia-nvshmem-cu13==3.4.5 manylinux_2_17_x86_64"
  "nvidia_nvtx-13.0.85-py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl 4936d1d6780fbe68db454f5e72a42ff64d1fd6397df9f363ae786930fd5c1cd4 nvidia-nvtx==13.0.85 manylinux_2_5_x86_64"
)
# Headers only (cuda_runtime_api.h includes crt/host_defines.h): --toolkit.
readonly TOOLKIT_WHEELS=(
  "nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4 nvidia-cuda-crt==13.0.88 manylinux_2_17_x86_64"
)

mode=${1:-}
case "$mode" in
  --list) ;;
  --libs|--toolkit) [ $# -eq 2 ] || { echo "usage: nvidia_wheels.sh $mode DIR" >&2; exit 2; } ;;
  *) echo "usage: nvidia_wheels.sh --list | --libs DIR | --toolkit DIR" >&2; exit 2 ;;
esac

wheels=${VAEDECODE_CACHE:-$HOME/.cache/vaedecode}/wheels
mkdir -p "$wheels"
sha_ok() { [ -f "$1" ] && echo "$2  $1" | sha256sum --quiet -c - 2>/dev/null; }
pip=""
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then pip="$py -m pip"; break; fi
done

paths=()
checked=()
entries=("${WHEELS[@]}")
[ "$mode" = --toolkit ] && entries+=("${TOOLKIT_WHEELS[@]}")
for entry in "${entries[@]}"; do
  read -r file sha requirement platform <<<"$entry"
  if ! sha_ok "$wheels/$file" "$sha"; then
    [ -n "$pip" ] || { echo "nvidia_wheels.sh: no pip to fetch $file (install python3-pip)" >&2; exit 1; }
    echo "nvidia_wheels.sh: fetching $file from PyPI" >&2
    rm -f "$wheels/$file"
    $pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform "$platform" --dest "$wheels" "$requirement" >&2
    sha_ok "$wheels/$file" "$sha" || { echo "nvidia_wheels.sh: $wheels/$file is missing or its SHA-256 is not $sha" >&2; exit 1; }
  fi
  paths+=("$wheels/$file")
  checked+=("$wheels/$file=$sha")
done

if [ "$mode" = --list ]; then
  printf '%s\n' "${paths[@]}"
  exit 0
fi

dir=$2
mkdir -p "$dir"
/usr/bin/python3 - "$mode" "$dir" "${checked[@]}" <<'PY'
import os, sys, zipfile

mode, dest, *wheels = sys.argv[1:]
SKIP = {"libcufile_rdma.so.1"}
if mode == "--toolkit":
    include = os.path.join(dest, "include")
    dest = os.path.join(dest, "lib64")
    os.makedirs(include, exist_ok=True)
    os.makedirs(dest, exist_ok=True)
manifest = []
for entry in wheels:
    wheel, sha = entry.rsplit("=", 1)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            name = os.path.basename(member)
            # Shared libraries only (nvidia/<pkg>/lib/lib*.so*): no headers,
            # no static archives, and not cuFile's RDMA plugin, which cuFile
            # loads only for GPUDirect Storage over InfiniBand and which needs
            # the verbs libraries (libibverbs, libmlx5) no image here has.
            if "/lib/" in member and name.startswith("lib") and ".so" in name and name not in SKIP:
                target = os.path.join(dest, name)
                with archive.open(member) as src, open(target, "wb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                os.chmod(target, 0o755)
                if mode == "--toolkit":
                    # -lnccl, -lcudart: the linker's unversioned names.
                    link = os.path.join(dest, name.split(".so")[0] + ".so")
                    if not os.path.lexists(link):
                        os.symlink(name, link)
            elif mode == "--toolkit" and "/include/" in member and member.split("/")[1] in ("cu13", "nccl"):
                target = os.path.join(include, member.split("/include/", 1)[1])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with archive.open(member) as src, open(target, "wb") as out:
                    out.write(src.read())
    manifest.append(f"{os.path.basename(wheel)} {sha}")  # checked above
with open(os.path.join(dest, "NVIDIA_WHEELS"), "w") as f:
    f.write("\n".join(manifest) + "\n")
PY
