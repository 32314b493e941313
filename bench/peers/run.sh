#!/usr/bin/env bash
# vaedecode against diffusers and DistVAE, side by side, from a fresh machine in one command:
# installs what is missing (tools/setup.sh's Debian packages and LibTorch, Debian's matplotlib for
# the chart), builds the pinned venv (tools/python_env.sh: diffusers, distvae, the LibTorch wheel's
# torch) and the vaedecode CLI, runs peers_bench.py and draws its table.
#
#   bench/peers/run.sh [--rounds 3] [--latent 64]     # table on stdout, chart in docs/img/peers_cpu.png
set -euo pipefail
cd "$(dirname "$0")/../.."

tools/setup.sh
# Debian's matplotlib draws the chart; GNU time measures each configuration's max RSS.
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || [ ! -x /usr/bin/time ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y -qq --no-install-recommends python3-matplotlib time >/dev/null
fi
python=$(tools/python_env.sh)
bazel build //:vaedecode >&2

results=${PEERS_JSON:-/tmp/vaedecode-peers/results.json}
mkdir -p "$(dirname "$results")" docs/img
"$python" bench/peers/peers_bench.py --binary bazel-bin/cli/vaedecode --json "$results" "$@"
/usr/bin/python3 bench/peers/chart.py "$results" docs/img/peers_cpu.png
echo "chart: docs/img/peers_cpu.png" >&2
