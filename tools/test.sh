#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test and a short run
# of every fuzzer (tools/fuzz.sh). Then the GPU
# build: the service, worker, CLI and GPU tests are built with --config=gpu
# (LibTorch's CUDA backend, NCCL, /usr/local/cuda) into the bundle a bare GPU
# machine runs (tools/gpu_bundle.sh), and the bundle's check runs here with
# its GPU steps replaced by small CPU decodes, so neither can rot.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# The pinned venv of the real third-party clients (diffusers, tritonclient)
# that tests/protocols run; .bazelrc passes VAEDECODE_PYTHON to the tests.
VAEDECODE_PYTHON=$(tools/python_env.sh)
export VAEDECODE_PYTHON
# Bazel names one convenience symlink after the checkout's folder
# (bazel-<folder>, pointing into the execroot); `//...` would descend into
# it on a second run. .bazelignore lists the usual names; this covers any
# folder name (the build recreates the link).
link="bazel-$(basename "$PWD")"
if [ -L "$link" ]; then rm -f "$link"; fi
status=0
bazel test //... "$@" || status=$?
# A short libFuzzer run (clang, ASan + UBSan) of every parser a file or a
# client reaches, from the committed corpora; the corpus tests above replay
# them with gcc. VAEDECODE_FUZZ_SECONDS=0 skips it.
fuzz_seconds=${VAEDECODE_FUZZ_SECONDS:-20}
if [ "$fuzz_seconds" -gt 0 ]; then
  tools/fuzz.sh "$fuzz_seconds" || { echo "test.sh: a fuzzer failed (tools/fuzz.sh)" >&2; status=1; }
fi
if [ -f /usr/local/cuda/include/nccl.h ]; then
  if tools/gpu_bundle.sh out/gpu_bundle; then
    # The machine's own LibTorch stands in for a GPU machine's torch.
    OUT=out/gpu_check VAEDECODE_TORCH_LIB="$(tools/libtorch.sh --print)/lib" out/gpu_bundle/gpu_check.sh \
      || { echo "test.sh: the GPU bundle's check failed on the CPU (out/gpu_check/gpu_check.log)" >&2; status=1; }
  else
    echo "test.sh: the --config=gpu build or the GPU bundle failed" >&2
    status=1
  fi
else
  echo "test.sh: /usr/local/cuda has no NCCL; skipped the --config=gpu build and the GPU bundle" >&2
fi
exit $status
