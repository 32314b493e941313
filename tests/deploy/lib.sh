# Shared helpers of the deploy checks (sourced by the *_test.sh scripts, which
# run under `bazel test` with runfiles, $TEST_TMPDIR and loopback only).
set -euo pipefail

PY=/usr/bin/python3
RUNFILES="${TEST_SRCDIR:?run under bazel test}/vaedecode"
TMP="${TEST_TMPDIR:?run under bazel test}"
export HOME="$TMP/home"  # workers cache decode-peak profiles under $HOME
mkdir -p "$HOME"

SERVER="$RUNFILES/server/vaedecode_server"
CLIENT="$RUNFILES/client/vaedecode_client"
PROBE="$RUNFILES/deploy/healthcheck/vaedecode_health_probe"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

need() {
  local tool
  for tool in "$@"; do
    [ -x "$tool" ] || fail "$tool is missing: run tools/setup.sh (Debian packages prometheus, yamllint)"
  done
}

_pids=()
_cleanup() {
  local pid
  for pid in "${_pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${_pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap _cleanup EXIT

# start_server LOG FLAGS...: a vaedecode_server on loopback ports chosen by the
# kernel (later flags win over earlier ones and over a --flagfile). Sets
# SERVER_PID, GRPC_PORT, METRICS_PORT once it listens.
start_server() {
  local log=$1
  shift
  local ready="$TMP/server.$RANDOM.ready"
  "$SERVER" "$@" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --ready_file="$ready" \
    >"$log" 2>&1 &
  SERVER_PID=$!
  _pids+=("$SERVER_PID")
  local i
  for i in $(seq 300); do
    [ -s "$ready" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log" >&2; fail "vaedecode_server exited at start"; }
    sleep 0.1
  done
  [ -s "$ready" ] || fail "vaedecode_server did not listen within 30 s"
  GRPC_PORT=$(sed -n 's/^grpc_port=//p' "$ready")
  METRICS_PORT=$(sed -n 's/^metrics_port=//p' "$ready")
}

# wait_serving PORT SERVICE [SECONDS]: polls grpc.health.v1 until SERVING.
wait_serving() {
  local port=$1 service=$2 seconds=${3:-60} i
  for i in $(seq $((seconds * 5))); do
    "$PROBE" --addr="127.0.0.1:$port" --service="$service" --timeout_s=2 >/dev/null && return 0
    sleep 0.2
  done
  "$PROBE" --addr="127.0.0.1:$port" --service="$service" --timeout_s=2 >&2 || true
  fail "health service \"$service\" on port $port not SERVING after ${seconds}s"
}

# decode ARGS...: one call through vaedecode_client (tiny demo latent).
decode() {
  "$CLIENT" --server="127.0.0.1:$GRPC_PORT" --latent_shape=1,4,8,8 --out="$TMP/out.npy" "$@"
}

# http_get URL: the body on stdout.
http_get() {
  "$PY" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"
}

# free_port: a loopback port that was free a moment ago.
free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# worker_pids: the server's child processes.
worker_pids() {
  cat "/proc/$SERVER_PID/task/"*/children 2>/dev/null | tr ' ' '\n' | grep -v '^$' || true
}
