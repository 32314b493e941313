#!/usr/bin/env bash
# The Kubernetes overlays against the real server: flags known to
# `vaedecode_server --helpfull`, ports, probes, grace period, devices and
# resources (deploy_checks.py manifests); then each overlay's flagfile
# really starts the server, and the CPU overlay's probe service names
# answer SERVING through grpc.health.v1.
source tests/deploy/lib.sh
"$SERVER" --helpfull >"$TMP/helpfull.txt" 2>&1 || true
# kustomize does not follow runfiles' symlinks: render a copy.
cp -rL "$RUNFILES/deploy/k8s" "$TMP/k8s"
"$PY" tests/deploy/deploy_checks.py manifests "$TMP/helpfull.txt" "$TMP/k8s" \
  "$RUNFILES/deploy/prometheus/podmonitor.yaml" "$RUNFILES/deploy/prometheus/prometheus.yml" "$TMP"

# CPU: the overlay's flags as they are, except what only exists in a pod:
# loopback ports (start_server) and the /models volume (the embedded model).
# Fewer ranks than the overlay's so the check stays cheap on a small machine.
start_server "$TMP/cpu.log" --flagfile="$TMP/cpu.flags" --model_repository= --devices=cpu:1 --group_size=1
while read -r service; do
  wait_serving "$GRPC_PORT" "$service" 120
  echo "cpu overlay: probe service \"$service\" SERVING"
done <"$TMP/cpu.probes"
"$PROBE" --addr="127.0.0.1:$GRPC_PORT" --service=no.such.Service >/dev/null && fail "an unknown health name answered SERVING"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || fail "the server did not drain and exit 0 on SIGTERM"
"$PROBE" --addr="127.0.0.1:$GRPC_PORT" --timeout_s=1 >/dev/null && fail "health SERVING after the server exited"

# GPU: no GPU here, but the server must accept the flags and listen.
start_server "$TMP/gpu.log" --flagfile="$TMP/gpu.flags" --model_repository=
echo "gpu overlay: flags accepted, listening on $GRPC_PORT"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || true
echo "manifests: ok"
