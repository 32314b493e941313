#!/usr/bin/env bash
# Stages everything a bare GPU machine needs to run the GPU check, in one
# git-ignored folder of at most 60 MiB (what travels with a checkout to the
# GPU machine is capped at 64 MiB, the tracked files included: about 2 MiB):
#   gpu_check.sh            tools/gpu_check.sh, run from the folder
#   LIBTORCH_VERSION        the LibTorch the binaries were built against
#   server/, worker/, bin/  the --config=gpu service binaries, CLI and client,
#                           laid out as the images are (deploy/docker/stage.sh)
#   tests/                  the GPU tests (fixtures on cuda:0, NCCL, CUDA memory)
#   lib/                    the Debian libraries they load that such a machine
#                           lacks (gRPC, protobuf, abseil, spdlog, ...); not
#                           LibTorch, CUDA, cuDNN or NCCL, which the machine's
#                           torch environment provides; lib/compat: Debian's
#                           libstdc++, for a machine whose own is older
#   diffusers_fixtures/     the fixtures the tests decode (decode-side weights only)
#   models/                 bench/models: real-width configs for seeded decodes
#
#   tools/gpu_bundle.sh [DIR]        # default out/gpu_bundle
#   DIR/gpu_check.sh                 # there (OUT=... for the results)
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-out/gpu_bundle}
readonly limit_mib=60

tools/setup.sh
# The service binaries, as stage.sh lays them out, plus the CLI and the tests.
also=(
  bin/vaedecode=cli/vaedecode
  tests/gpu_decode_test=tests/gpu/gpu_decode_test
  tests/nccl_communicator_test=parallel/nccl_communicator_test
  tests/compute_device_test=device/compute_device_test
  tests/device_memory_test=device/device_memory_test
)
targets=(//server:vaedecode_server //worker:vaedecode_worker //client:vaedecode_client
  //deploy/healthcheck:vaedecode_health_probe)
for a in "${also[@]}"; do
  src=${a#*=}
  targets+=("//${src%/*}:${src##*/}")
done
bazel build --config=gpu "${targets[@]}"
bin=$(bazel info --config=gpu bazel-bin)

rm -rf "$bundle"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# The GPU machine's torch environment has LibTorch, CUDA, cuDNN, NCCL and
# their NVIDIA companions: never bundled, and allowed not to resolve here.
host='^lib(torch|c10|gomp|cuda|cupti|cublas|cudnn|cufft|cufile|curand|cusolver|cusparse|nccl|nvshmem|nvJitLink|nvrtc|nvToolsExt|caffe2)'
also_args=()
for a in "${also[@]}"; do also_args+=(--also "$a"); done
deploy/docker/stage.sh --bundle --host-libs "$host" "${also_args[@]}" "$bin" "$stage"
mkdir -p "$(dirname "$bundle")"
mv "$stage/opt/vaedecode" "$bundle"
# The C++ runtime the binaries were built with, for a machine whose own is
# older (gpu_check.sh adds it only then).
mkdir -p "$bundle/lib/compat"
cp -L /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 "$bundle/lib/compat/"
cp tools/gpu_check.sh "$bundle/gpu_check.sh"
cp "$(tools/libtorch.sh --print)/VERSION" "$bundle/LIBTORCH_VERSION"
cp -rL bench/models "$bundle/models"
# The fixtures the GPU test decodes, as it lists its cases (fixture_case).
fixtures=../shared/fixtures
mkdir -p "$bundle/diffusers_fixtures"
cp "$fixtures/index.json" "$bundle/diffusers_fixtures/"
cases=$(LD_LIBRARY_PATH="$(tools/libtorch.sh --print)/lib:/usr/local/cuda/lib64" TEST_SRCDIR="$bundle" \
  "$bundle/tests/gpu_decode_test" --gtest_list_tests | sed -n 's|^  *[A-Za-z]*/\([a-z0-9_]*\)  *# GetParam.*|\1|p')
for folder in $(/usr/bin/python3 -c 'import json, sys
index = json.load(open(sys.argv[1]))
cases = set(sys.argv[2].split())
for f in index["fixtures"]:
    if any(f["folder"] + "_" + c["case"] in cases for c in f["cases"]):
        print(f["folder"])' "$fixtures/index.json" "$cases"); do
  # What the decodes read: the config, latents, expected outputs, and the
  # weights without the encoder side (which every loader ignores by name).
  mkdir -p "$bundle/diffusers_fixtures/$folder"
  cp -L "$fixtures/$folder"/config.json "$fixtures/$folder"/latent*.safetensors \
    "$fixtures/$folder"/expected*.safetensors "$bundle/diffusers_fixtures/$folder/"
  /usr/bin/python3 tools/slim_safetensors.py "$fixtures/$folder/diffusion_pytorch_model.safetensors" \
    "$bundle/diffusers_fixtures/$folder/diffusion_pytorch_model.safetensors" encoder. quant_conv.
done
git rev-parse HEAD > "$bundle/COMMIT" 2>/dev/null || true

size_kib=$(du -sk "$bundle" | cut -f1)
echo "gpu_bundle: $bundle, $((size_kib / 1024)) MiB (limit $limit_mib MiB)" >&2
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  du -sk "$bundle"/* | sort -n >&2
  echo "gpu_bundle: over the $limit_mib MiB limit" >&2
  exit 1
fi
