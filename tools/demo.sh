#!/usr/bin/env bash
# The main job: install what is missing, build, and decode a latent with the
# embedded default model to out/demo.png. Extra arguments go to `vaedecode decode`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //:vaedecode
mkdir -p out
bazel-bin/cli/vaedecode decode --out out/demo.png "$@"
