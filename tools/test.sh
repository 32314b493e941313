#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test. The GPU worker
# path (NCCL communicator, the worker and CLI with CUDA devices, the GPU
# tests) is also compiled and linked against /usr/local/cuda: it cannot run
# without a GPU and a CUDA LibTorch, but it must always build.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# Bazel names one convenience symlink after the checkout's folder
# (bazel-<folder>, pointing into the execroot); `//...` would descend into
# it on a second run. .bazelignore lists the usual names; this covers any
# folder name (the build recreates the link).
link="bazel-$(basename "$PWD")"
if [ -L "$link" ]; then rm -f "$link"; fi
status=0
bazel test //... "$@" || status=$?
if [ -f /usr/local/cuda/include/nccl.h ]; then
  # The GPU worker path links NCCL and the CUDA runtime; the caching
  # allocator's accounting needs an official CUDA LibTorch to link, so it is
  # compiled only.
  bazel build --config=cuda //parallel:nccl_communicator //parallel:nccl_communicator_test \
    //worker:vaedecode_worker //:vaedecode //tests/gpu:gpu_decode_test || status=$?
  bazel build --config=gpu //device:cuda_memory || status=$?
else
  echo "test.sh: /usr/local/cuda has no NCCL; skipped the --config=cuda build" >&2
fi
exit $status
