#!/usr/bin/env bash
# The Python client example against the real vaedecode_server (embedded
# default model, one group of two CPU ranks: exact sharding):
#   - it decodes a seeded 1x4x16x16 latent to float32 .npy and to PNG, streamed
#     in many small chunks, and the C++ vaedecode_client's outputs for the
#     same latent file are identical;
#   - an unknown model exits non-zero with NOT_FOUND on stderr, a latent with
#     the wrong channel count with INVALID_ARGUMENT;
#   - decode_session refuses a decode timestep or noise (a session has none);
#   - the server drains on SIGTERM and exits 0.
set -euo pipefail

PY=/usr/bin/python3
RUNFILES="${TEST_SRCDIR:?run under bazel test}/vaedecode"
TMP="${TEST_TMPDIR:?run under bazel test}"
export HOME="$TMP/home"  # workers cache decode-peak profiles under $HOME
mkdir -p "$HOME"

SERVER="$RUNFILES/server/vaedecode_server"
WORKER="$RUNFILES/worker/vaedecode_worker"
CPP_CLIENT="$RUNFILES/client/vaedecode_client"
PY_CLIENT="$RUNFILES/client/python/vaedecode_client.py"

fail() {
  echo "FAIL: $*" >&2
  [ -f "$TMP/server.log" ] && { echo "--- server log (tail)" >&2; tail -n 30 "$TMP/server.log" >&2; }
  exit 1
}

server=""
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
    kill -KILL "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
}
trap cleanup EXIT

# The stubs are the genrule's, beside the client in the runfiles (the client
# would otherwise generate its own with protoc).
[ -f "$RUNFILES/client/python/vaedecode/v1/vaedecode_pb2_grpc.py" ] || fail "no generated stubs in the runfiles"
unset VAEDECODE_PY_STUBS

# Small chunks (16 KiB) so that the client assembles many row bands (13 for
# the float32 output) and PNGs arrive in several pieces.
echo "== start the server (cpu:2, group of 2)"
ready="$TMP/server.ready"
"$SERVER" --devices=cpu:2 --group_size=2 --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --chunk_bytes=16384 --ready_file="$ready" --worker_binary="$WORKER" >"$TMP/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do
  [ -s "$ready" ] && break
  kill -0 "$server" 2>/dev/null || fail "vaedecode_server exited at start"
  sleep 0.1
done
[ -s "$ready" ] || fail "vaedecode_server did not listen within 30 s"
address="127.0.0.1:$(sed -n 's/^grpc_port=//p' "$ready")"

# Served once the worker group has formed and loaded the model; extra
# arguments go to the client (TLS flags).
wait_served() {
  for _ in $(seq 120); do
    "$PY" "$PY_CLIENT" --server="$address" "$@" --list-models 2>/dev/null | grep -q '^default ' && return 0
    kill -0 "$server" 2>/dev/null || fail "vaedecode_server exited before serving"
    sleep 1
  done
  fail "the default model was not served within 120 s"
}
wait_served

echo "== float32: Python client vs C++ client, same latent"
"$PY" "$PY_CLIENT" --server="$address" --latent-shape=1,4,16,16 --seed=7 --save-latent="$TMP/latent.npy" \
  --mode=exact --out="$TMP/py.npy" >"$TMP/py.txt" || fail "Python client decode"
cat "$TMP/py.txt"
grep -q 'shape=\[1,3,128,128\] mode=MODE_EXACT degree=2 ' "$TMP/py.txt" || fail "unexpected header: $(cat "$TMP/py.txt")"
grep -Eq ' chunks=([2-9]|[1-9][0-9]+) ' "$TMP/py.txt" || fail "expected several chunks: $(cat "$TMP/py.txt")"
grep -q 'decode_ms=[0-9]' "$TMP/py.txt" || fail "no trailer timings printed"
"$CPP_CLIENT" --server="$address" --latent="$TMP/latent.npy" --mode=exact --out="$TMP/cpp.npy" \
  || fail "C++ client decode"

"$PY" - "$TMP/latent.npy" "$TMP/py.npy" "$TMP/cpp.npy" <<'PY' || fail "the Python and C++ outputs differ"
import sys
import numpy as np
latent, py, cpp = (np.load(p) for p in sys.argv[1:])
assert latent.shape == (1, 4, 16, 16) and latent.dtype == np.float32, (latent.shape, latent.dtype)
assert py.shape == cpp.shape == (1, 3, 128, 128), (py.shape, cpp.shape)
assert py.dtype == cpp.dtype == np.float32, (py.dtype, cpp.dtype)
assert np.isfinite(py).all() and py.std() > 0, "degenerate output"
diff = np.abs(py.astype(np.float64) - cpp.astype(np.float64)).max()
assert np.array_equal(py, cpp), f"max |difference| {diff}"
print(f"  ok: {py.size} values identical (mean {py.mean():.4f}, std {py.std():.4f})")
PY

echo "== png: Python client vs C++ client, same latent"
"$PY" "$PY_CLIENT" --server="$address" --latent="$TMP/latent.npy" --mode=exact --out="$TMP/py.png" \
  || fail "Python client PNG decode"
"$CPP_CLIENT" --server="$address" --latent="$TMP/latent.npy" --mode=exact --out="$TMP/cpp.png" >/dev/null \
  || fail "C++ client PNG decode"
head -c 8 "$TMP/py.png" | od -An -tx1 | grep -q '89 50 4e 47 0d 0a 1a 0a' || fail "py.png is not a PNG"
cmp "$TMP/py.png" "$TMP/cpp.png" || fail "the Python and C++ PNGs differ"
echo "  ok: identical PNGs"

echo "== errors"
rc=0
"$PY" "$PY_CLIENT" --server="$address" --model=no_such_model --latent="$TMP/latent.npy" \
  --out="$TMP/bad.npy" >/dev/null 2>"$TMP/bad_model.err" || rc=$?
cat "$TMP/bad_model.err"
[ "$rc" != 0 ] || fail "an unknown model decoded (exit 0)"
grep -q 'NOT_FOUND' "$TMP/bad_model.err" || fail "unknown model: no NOT_FOUND on stderr"
[ ! -e "$TMP/bad.npy" ] || fail "a failed call wrote its output"
rc=0
"$PY" "$PY_CLIENT" --server="$address" --latent-shape=1,3,16,16 --out="$TMP/bad.npy" \
  >/dev/null 2>"$TMP/bad_latent.err" || rc=$?
cat "$TMP/bad_latent.err"
[ "$rc" != 0 ] || fail "a 3-channel latent decoded (exit 0)"
grep -q 'INVALID_ARGUMENT' "$TMP/bad_latent.err" || fail "bad latent: no INVALID_ARGUMENT on stderr"

echo "== a session refuses a decode timestep or noise, before any call (decode_session)"
"$PY" - "$(dirname "$PY_CLIENT")" <<'PY' || fail "decode_session took a decode timestep"
import sys
sys.path.insert(0, sys.argv[1])
import vaedecode_client as vc
for fields in ({"decode_timestep": 0.05}, {"decode_noise_scale": 0.1}, {"decode_timestep": 0.05, "decode_noise_scale": 0}):
    request = vc.pb2.DecodeRequest(model="default", **fields)
    request.latent.shape.extend([1, 16, 2, 4, 4])
    try:
        vc.decode_session(None, request, [1, 1])  # no stub: a refusal comes first
    except ValueError as e:
        assert "without noise" in str(e), e
    else:
        raise AssertionError(f"{fields}: no refusal")
print("  ok: refused before any call")
PY

echo "== SIGTERM drains the server"
kill -TERM "$server"
rc=0
wait "$server" || rc=$?
server=""
[ "$rc" = 0 ] || fail "vaedecode_server exited $rc after SIGTERM"

echo "== mutual TLS: the same decode over a TLS port that requires client certificates"
certs="$TMP/certs"
mkdir -p "$certs"
(
  cd "$certs"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\n' >san.ext
  openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr 2>/dev/null
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext \
    -out server.pem 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=client -keyout client.key -out client.csr 2>/dev/null
  openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem 2>/dev/null
) || fail "openssl could not make the test certificates (tools/setup.sh installs openssl)"
rm -f "$ready"
"$SERVER" --listen=127.0.0.1:0 --metrics_listen= --devices=cpu:2 --group_size=2 --ready_file="$ready" \
  --worker_binary="$WORKER" --tls_cert="$certs/server.pem" --tls_key="$certs/server.key" \
  --tls_client_ca="$certs/ca.pem" >"$TMP/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do [ -s "$ready" ] && break; sleep 0.1; done
[ -s "$ready" ] || fail "the TLS server did not listen within 30 s"
address="127.0.0.1:$(sed -n 's/^grpc_port=//p' "$ready")"
tls=(--tls-ca="$certs/ca.pem" --tls-cert="$certs/client.pem" --tls-key="$certs/client.key")
wait_served "${tls[@]}"
"$PY" "$PY_CLIENT" --server="$address" "${tls[@]}" --latent="$TMP/latent.npy" --mode=exact \
  --out="$TMP/py_tls.npy" >/dev/null || fail "Python client decode over mutual TLS"
cmp "$TMP/py.npy" "$TMP/py_tls.npy" || fail "the TLS decode differs from the plaintext one"
rc=0
"$PY" "$PY_CLIENT" --server="$address" --tls-ca="$certs/ca.pem" --latent="$TMP/latent.npy" \
  --out="$TMP/no_cert.npy" --deadline-s=10 >/dev/null 2>"$TMP/no_cert.err" || rc=$?
[ "$rc" != 0 ] || fail "a client without a certificate decoded over mutual TLS"
echo "  ok: identical output over mutual TLS; a client without a certificate is refused"
kill -TERM "$server"
rc=0
wait "$server" || rc=$?
server=""
[ "$rc" = 0 ] || fail "the TLS server exited $rc after SIGTERM"
echo "PASS"
