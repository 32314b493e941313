#!/usr/bin/env bash
# Every metric name the alert/recording rules, the dashboard and the
# autoscaler's adapter use is in a real /metrics scrape of the running
# server, after decodes, a failed call and a worker group rebuild.
source tests/deploy/lib.sh
start_server "$TMP/server.log" --devices=cpu:1 --group_size=1
wait_serving "$GRPC_PORT" vaedecode.v1.VaeDecoder 120
decode >/dev/null || fail "decode"
decode --mode=dense >/dev/null || fail "dense decode"
decode --model=no_such_model >/dev/null 2>&1 && fail "an unknown model decoded"
# A worker dies: the group is rebuilt (vaedecode_worker_restarts_total).
pids=$(worker_pids)
[ -n "$pids" ] || fail "the server has no worker processes"
kill -KILL $pids
for _ in $(seq 300); do
  http_get "http://127.0.0.1:$METRICS_PORT/metrics" | grep -q '^vaedecode_worker_restarts_total' && break
  sleep 0.2
done
wait_serving "$GRPC_PORT" vaedecode.v1.VaeDecoder 120
decode >/dev/null || fail "decode after the rebuild"
http_get "http://127.0.0.1:$METRICS_PORT/metrics" >"$TMP/scrape.txt"
/usr/bin/promtool check metrics <"$TMP/scrape.txt" || true  # lint hints only
"$PY" tests/deploy/deploy_checks.py metric-names "$TMP/scrape.txt" \
  "$RUNFILES/deploy/prometheus/rules/vaedecode.rules.yml" "$RUNFILES/deploy/grafana/vaedecode-dashboard.json" \
  "$RUNFILES/deploy/prometheus/prometheus-adapter.yaml" "$RUNFILES/deploy/k8s/base/hpa.yaml"
