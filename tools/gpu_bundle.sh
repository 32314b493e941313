#!/usr/bin/env bash
# Stages everything a bare GPU machine needs to run the GPU check, in one
# git-ignored folder of at most 56 MiB (what travels with a checkout to the
# GPU machine is capped at 64 MiB, the tracked files included: a few MiB):
#   gpu_check.sh            tools/gpu_check.sh, run from the folder
#   LIBTORCH_VERSION        the LibTorch the binaries were built against
#   binaries.tar.xz         server/, worker/, bin/, tests/, lib/ packed
#                           (gpu_check.sh unpacks them where it runs):
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
readonly limit_mib=56

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
# The fixtures the GPU test decodes, as it lists its cases (fixture_case):
# the config, the slimmed weights and every file a listed case names in the
# index (latent, expected, pipeline latent), so a file the test reads
# cannot be forgotten (its FixtureFilesArePresent case checks it).
fixtures=../shared/fixtures
mkdir -p "$bundle/diffusers_fixtures"
cp "$fixtures/index.json" "$bundle/diffusers_fixtures/"
cases=$(LD_LIBRARY_PATH="$(tools/libtorch.sh --print)/lib:/usr/local/cuda/lib64" TEST_SRCDIR="$bundle" \
  "$bundle/tests/gpu_decode_test" --gtest_list_tests | sed -n 's|^  *[A-Za-z]*/\([a-z0-9_]*\)  *# GetParam.*|\1|p' | sort -u)
/usr/bin/python3 - "$fixtures" "$bundle/diffusers_fixtures" "$cases" <<'PY'
import json, os, shutil, subprocess, sys
fixtures, dest, cases = sys.argv[1], sys.argv[2], set(sys.argv[3].split())
index = json.load(open(os.path.join(fixtures, "index.json")))
for f in index["fixtures"]:
    listed = [c for c in f["cases"] if f["folder"] + "_" + c["case"] in cases]
    if not listed:
        continue
    os.makedirs(os.path.join(dest, f["folder"]), exist_ok=True)
    files = {os.path.join(f["folder"], "config.json")}
    for c in listed:
        files.update(c[k] for k in ("latent_file", "expected_file", "pipeline_latent_file") if c.get(k))
    for rel in sorted(files):
        shutil.copyfile(os.path.join(fixtures, rel), os.path.join(dest, rel))
    # The weights without the encoder side (which every decode loader ignores by name).
    subprocess.run([sys.executable, "tools/slim_safetensors.py", os.path.join(fixtures, f["weights_file"]),
                    os.path.join(dest, f["weights_file"]), "encoder.", "quant_conv."], check=True)
PY
git rev-parse HEAD > "$bundle/COMMIT" 2>/dev/null || true
# The binaries and their libraries xz-packed: 37 MB become about 10, which
# leaves room for the fixtures under the 64 MiB that travel.
tar -C "$bundle" -cf - bin server worker tests lib | xz -9 -T2 > "$bundle/binaries.tar.xz"
rm -rf "$bundle"/{bin,server,worker,tests,lib}

size_kib=$(du -sk "$bundle" | cut -f1)
echo "gpu_bundle: $bundle, $((size_kib / 1024)) MiB (limit $limit_mib MiB)" >&2
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  du -sk "$bundle"/* | sort -n >&2
  echo "gpu_bundle: over the $limit_mib MiB limit" >&2
  exit 1
fi
