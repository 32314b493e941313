#!/usr/bin/env bash
# Runs a Python test script (the first argument) in the pinned environment
# of the real third-party clients: VAEDECODE_PYTHON, which tools/test.sh
# sets from tools/python_env.sh (bazel passes it through, .bazelrc).
set -euo pipefail
if [ -z "${VAEDECODE_PYTHON:-}" ] || [ ! -x "$VAEDECODE_PYTHON" ]; then
  echo "FAIL: VAEDECODE_PYTHON is not set to the pinned Python environment;" \
    "run tools/test.sh, or: VAEDECODE_PYTHON=\$(tools/python_env.sh) bazel test ..." >&2
  exit 1
fi
script="$TEST_SRCDIR/vaedecode/$1"
shift
exec "$VAEDECODE_PYTHON" "$script" "$@"
