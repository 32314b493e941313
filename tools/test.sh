#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test. The NCCL
# communicator is also compiled and linked against /usr/local/cuda: it cannot
# run without a GPU, but it must always build.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
status=0
bazel test //... "$@" || status=$?
if [ -f /usr/local/cuda/include/nccl.h ]; then
  bazel build --config=cuda //parallel:nccl_communicator //parallel:nccl_communicator_test || status=$?
else
  echo "test.sh: /usr/local/cuda has no NCCL; skipped the --config=cuda build" >&2
fi
exit $status
