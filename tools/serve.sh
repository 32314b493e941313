#!/usr/bin/env bash
# The service end to end: builds the server and the client, starts
# vaedecode_server with the embedded default model on two CPU workers (one
# group of two ranks: exact sharding), waits until the model is served,
# decodes a seeded demo latent through vaedecode_client to out/serve.png and
# a raw latent file through the HTTP endpoint (diffusers' remote_decode
# protocol, with curl) to out/serve_http.jpg, then drains the server with
# SIGTERM (it exits 0).
#
#   tools/serve.sh                       # the demo above
#   tools/serve.sh --keep                # …and keep serving until Ctrl-C
#   tools/serve.sh --latent_shape=1,4,64,64 --out=out/big.npy   # client flags
#
# Environment: VAEDECODE_DEVICES (default cpu:2), VAEDECODE_GROUP_SIZE (2),
# VAEDECODE_LISTEN (127.0.0.1:0 = any free port), VAEDECODE_METRICS
# (127.0.0.1:0), VAEDECODE_HTTP (127.0.0.1:0), VAEDECODE_MODEL_REPOSITORY
# (empty = the embedded default).
set -euo pipefail
cd "$(dirname "$0")/.."

keep=0
if [ "${1:-}" = "--keep" ]; then
  keep=1
  shift
fi

tools/setup.sh
bazel build //:vaedecode_server //:vaedecode_client //worker:vaedecode_worker
bin=$(bazel info bazel-bin 2>/dev/null)
mkdir -p out
ready=$(mktemp -u /tmp/vaedecode-serve-XXXXXX.ready)

"$bin/server/vaedecode_server" \
  --listen="${VAEDECODE_LISTEN:-127.0.0.1:0}" \
  --metrics_listen="${VAEDECODE_METRICS:-127.0.0.1:0}" \
  --devices="${VAEDECODE_DEVICES:-cpu:2}" \
  --group_size="${VAEDECODE_GROUP_SIZE:-2}" \
  --model_repository="${VAEDECODE_MODEL_REPOSITORY:-}" \
  --http_listen="${VAEDECODE_HTTP:-127.0.0.1:0}" \
  --ready_file="$ready" &
server=$!
stop() {
  if kill -0 "$server" 2>/dev/null; then
    kill -TERM "$server"
    wait "$server" || true
  fi
  rm -f "$ready"
}
trap stop EXIT
trap 'exit 130' INT TERM

for _ in $(seq 600); do
  [ -s "$ready" ] && break
  kill -0 "$server" 2>/dev/null || { echo "serve.sh: the server exited" >&2; exit 1; }
  sleep 0.1
done
[ -s "$ready" ] || { echo "serve.sh: the server did not start listening" >&2; exit 1; }
port=$(sed -n 's/^grpc_port=//p' "$ready")
metrics=$(sed -n 's/^metrics_port=//p' "$ready")
http=$(sed -n 's/^http_port=//p' "$ready")
address="127.0.0.1:$port"
echo "serve.sh: vaedecode_server on $address, metrics on http://127.0.0.1:$metrics/metrics," \
  "remote_decode on http://127.0.0.1:$http/" >&2

# Served once a worker group has formed and loaded the model.
model=default
[ -n "${VAEDECODE_MODEL_REPOSITORY:-}" ] && model=$(ls "$VAEDECODE_MODEL_REPOSITORY" | head -n1)
for _ in $(seq 600); do
  "$bin/client/vaedecode_client" --server="$address" --list_models 2>/dev/null | grep "^$model " > /dev/null && break
  kill -0 "$server" 2>/dev/null || { echo "serve.sh: the server exited" >&2; exit 1; }
  sleep 0.5
done

"$bin/client/vaedecode_client" --server="$address" --model="$model" --out=out/serve.png "$@"

# The same server over HTTP, as diffusers' remote_decode() calls it: a raw
# little-endian float32 latent as the body, its shape and dtype as query
# parameters, a JPEG back. (The embedded default takes 4 latent channels.)
if [ -z "${VAEDECODE_MODEL_REPOSITORY:-}" ]; then
  /usr/bin/python3 -c 'import numpy as np; np.random.default_rng(0).standard_normal((1, 4, 32, 32), dtype=np.float32).tofile("out/serve_latent.bin")'
  curl -sSf -X POST -H 'Content-Type: tensor/binary' --data-binary @out/serve_latent.bin \
    "http://127.0.0.1:$http/models/$model?shape=1&shape=4&shape=32&shape=32&dtype=float32&output_type=pil&image_format=jpg" \
    -o out/serve_http.jpg
  echo "serve.sh: wrote out/serve_http.jpg through the HTTP endpoint" >&2
fi

if [ "$keep" = 1 ]; then
  echo "serve.sh: serving on $address until Ctrl-C" >&2
  wait "$server"
fi
