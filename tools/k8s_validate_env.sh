#!/usr/bin/env bash
# The Kubernetes schema validator's environment: a Python 3.12 venv (the
# same interpreter tools/python_env.sh finds) holding
# tools/k8s-validate-requirements.txt, every wheel checked by its SHA-256.
# Idempotent: a venv whose stamp matches is reused.
#
#   tools/k8s_validate_env.sh   # build if needed; print the kubernetes-validate to run
#
# tools/test.sh passes it to the tests as VAEDECODE_K8S_VALIDATE.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${VAEDECODE_CACHE:-$HOME/.cache/vaedecode}
requirements=tools/k8s-validate-requirements.txt
stamp=$(sha256sum "$requirements" | cut -c1-16)
venv="$cache/python/k8s-validate-$stamp"
if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]; then
  python=""
  for c in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys, venv; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      python=$(command -v "$c")
      break
    fi
  done
  [ -n "$python" ] || { echo "k8s_validate_env.sh: no Python 3.12 (with venv) on PATH or under pyenv" >&2; exit 1; }
  echo "k8s_validate_env.sh: building $venv with $python" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes --only-binary=:all: \
    -r "$requirements" >&2
  "$venv/bin/kubernetes-validate" --version >/dev/null \
    || { echo "k8s_validate_env.sh: kubernetes-validate does not run" >&2; exit 1; }
  echo "$stamp" >"$venv/.stamp"
fi
echo "$venv/bin/kubernetes-validate"
