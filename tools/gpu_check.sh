#!/usr/bin/env bash
# The GPU checks, as one script for a machine with NVIDIA GPUs and an
# official CUDA LibTorch installed as deploy/docker/Dockerfile.gpu installs it
# (headers under /usr/local/include with /usr/include/torch pointing there,
# libraries in /usr/local/lib). Builds with --config=gpu, runs the GPU tests
# (fixtures on cuda:0 within 1e-4, the group path over NCCL, exact over
# 2-4 GPUs when present, CUDA memory accounting), decodes with the CLI on the
# GPU (float32 and bfloat16 at 1024², tiled under a budget), and serves one
# decode through vaedecode_server --devices=cuda:0. Figures go to stdout and,
# when $OUT is set, to $OUT/gpu_check.log.
#
#   tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-/tmp}/gpu_check.log
exec > >(tee "$log") 2>&1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv || { echo "no NVIDIA GPU"; exit 2; }
if ! ls /usr/local/lib/libtorch_cuda.so /usr/lib/libtorch_cuda.so >/dev/null 2>&1; then
  echo "gpu_check: no CUDA LibTorch (libtorch_cuda.so) in /usr/local/lib; install one as Dockerfile.gpu does"
  exit 2
fi

targets=(//:vaedecode //:vaedecode_server //:vaedecode_client //worker:vaedecode_worker)
bazel build --config=gpu "${targets[@]}" || { echo "gpu_check: the --config=gpu build failed"; exit 1; }
bazel test --config=gpu --test_output=all //tests/gpu:gpu_decode_test //parallel:nccl_communicator_test \
  //device:all || fail "GPU tests"

bin=$(bazel info --config=gpu bazel-bin)
echo "== CLI on cuda:0 (embedded SD-1.x decoder)"
for dtype in float32 bfloat16; do
  for n in 64 128; do
    "$bin/cli/vaedecode" decode --device cuda:0 --dtype "$dtype" --latent-shape "1,4,$n,$n" \
      --out "/tmp/gpu_${dtype}_${n}.npy" | tail -n 1 || fail "dense $dtype ${n}x$n on cuda:0"
  done
done
"$bin/cli/vaedecode" decode --device cpu --latent-shape 1,4,64,64 --out /tmp/cpu_64.npy | tail -n 1
/usr/bin/python3 - <<'PY' || fail "cuda:0 float32 differs from the CPU decode"
import numpy as np
a, b = np.load("/tmp/gpu_float32_64.npy"), np.load("/tmp/cpu_64.npy")
d = float(np.abs(a - b).max())
print(f"cuda:0 vs cpu float32 at 512²: max abs {d:.3g}")
raise SystemExit(0 if d <= 1e-3 else 1)
PY
"$bin/cli/vaedecode" decode --device cuda:0 --latent-shape 1,4,128,128 --mode tiled --budget-mib 2048 \
  --out /tmp/gpu_tiled.npy | tail -n 1 || fail "tiled under 2 GiB on cuda:0"

echo "== vaedecode_server --devices=cuda:0"
ready=$(mktemp -u /tmp/gpu-check-XXXXXX.ready)
"$bin/server/vaedecode_server" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --devices=cuda:0 \
  --group_size=1 --dtype=bfloat16 --ready_file="$ready" &
server=$!
for _ in $(seq 600); do [ -s "$ready" ] && break; sleep 0.2; done
port=$(sed -n 's/^grpc_port=//p' "$ready")
for _ in $(seq 300); do
  "$bin/client/vaedecode_client" --server="127.0.0.1:$port" --list_models >/dev/null 2>&1 && break
  sleep 1
done
"$bin/client/vaedecode_client" --server="127.0.0.1:$port" --latent_shape=1,4,128,128 --out=/tmp/gpu_served.png \
  || fail "a decode through the server on cuda:0"
kill -TERM "$server"
wait "$server" || fail "the server did not drain cleanly"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
