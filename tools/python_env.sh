#!/usr/bin/env bash
# Builds the pinned Python environment the protocol tests and benchmarks run
# third-party clients in (diffusers' remote_decode, tritonclient, PyAV): a
# venv on Python 3.12 (the Python tag of the LibTorch wheel tools/libtorch.sh
# caches, installed into it with --no-deps so torch is the same 2.11.0
# build) plus tools/python-requirements.txt. Idempotent: a venv whose stamp
# matches is reused.
#
#   tools/python_env.sh          # build if needed; print the python to run
#
# The printed path is a wrapper that puts the CUDA runtime libraries torch
# loads (LibTorch's tree, /usr/local/cuda) on LD_LIBRARY_PATH, then runs the
# venv's python. tools/test.sh passes it to the tests as VAEDECODE_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${VAEDECODE_CACHE:-$HOME/.cache/vaedecode}
requirements=tools/python-requirements.txt
libtorch=$(tools/libtorch.sh --print)
wheel=$(ls "$cache"/wheels/torch-2.11.0-cp312-*.whl 2>/dev/null | head -n 1 || true)
[ -n "$wheel" ] || { tools/libtorch.sh >&2; wheel=$(ls "$cache"/wheels/torch-2.11.0-cp312-*.whl | head -n 1); }

find_python312() {
  local c
  for c in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys, venv; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

stamp="$(sha256sum "$requirements" | cut -c1-16) $(basename "$wheel")"
venv="$cache/python/venv-$(echo "$stamp" | sha256sum | cut -c1-12)"
wrapper="$venv/bin/python-with-torch"
if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]; then
  python=$(find_python312) || { echo "python_env.sh: no Python 3.12 (with venv) on PATH or under pyenv; the torch wheel is cp312" >&2; exit 1; }
  echo "python_env.sh: building $venv with $python" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$wheel"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$requirements"
  cat >"$wrapper" <<WRAP
#!/usr/bin/env bash
# torch's CUDA build loads libcudart and friends even on a CPU.
export LD_LIBRARY_PATH="$libtorch/lib:/usr/local/cuda/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$venv/bin/python" "\$@"
WRAP
  chmod +x "$wrapper"
  "$wrapper" -c 'import torch, diffusers, tritonclient.grpc, tritonclient.http, av, PIL' \
    || { echo "python_env.sh: the venv does not import its packages" >&2; exit 1; }
  echo "$stamp" >"$venv/.stamp"
fi
echo "$wrapper"
