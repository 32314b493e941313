#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test. The GPU
# communicator is also compiled and linked against /usr/local/cuda (it cannot
# run without a GPU, but it must build).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
status=0
bazel test //... "$@" || status=$?
if [ -d /usr/local/cuda/include ] && bazel query 'attr(tags, "cuda_build_check", //...)' >/dev/null 2>&1; then
  targets=$(bazel query 'attr(tags, "cuda_build_check", //...)' 2>/dev/null)
  if [ -n "$targets" ]; then
    bazel build --config=cuda $targets || status=$?
  fi
fi
exit $status
