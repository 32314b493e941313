#!/usr/bin/env bash
# A real Prometheus (Debian's) on loopback scrapes a running vaedecode_server
# through deploy/prometheus/prometheus.yml's relabelling and evaluates
# deploy/prometheus/rules; after some decodes, every recording rule whose
# inputs the server exports has a sane value, every dashboard query parses
# and has data, and no rule fails to evaluate.
source tests/deploy/lib.sh
need /usr/bin/prometheus /usr/bin/promtool
start_server "$TMP/server.log" --devices=cpu:1 --group_size=1
wait_serving "$GRPC_PORT" vaedecode.v1.VaeDecoder 120

cp -rL "$RUNFILES/deploy/prometheus" "$TMP/prometheus"
"$PY" tests/deploy/deploy_checks.py prom-config "$TMP/prometheus/prometheus.yml" "$TMP/prometheus/e2e.yml" \
  "127.0.0.1:$METRICS_PORT" "$TMP/prometheus/rules"
port=$(free_port)
url="http://127.0.0.1:$port"
/usr/bin/prometheus --config.file="$TMP/prometheus/e2e.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$port" --log.level=warn >"$TMP/prometheus.log" 2>&1 &
prom_pid=$!
_pids+=("$prom_pid")

query() {  # query EXPR: the number of series in the result
  "$PY" -c '
import json, sys, urllib.parse, urllib.request
q = urllib.parse.urlencode({"query": sys.argv[2]})
r = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/query?" + q, timeout=5))
print(len(r["data"]["result"]))' "$url" "$1" 2>/dev/null || echo 0
}
for _ in $(seq 150); do
  [ "$(query 'up{job="vaedecode",namespace="e2e",pod="vaedecode-e2e-0"} == 1')" = 1 ] && break
  kill -0 "$prom_pid" 2>/dev/null || { cat "$TMP/prometheus.log" >&2; fail "prometheus exited"; }
  sleep 0.2
done
[ "$(query 'up{job="vaedecode"} == 1')" = 1 ] || { cat "$TMP/prometheus.log" >&2; fail "prometheus did not scrape the server"; }
[ "$(query 'count(up)')" = 1 ] || fail "the relabelling kept a target that is not vaedecode's metrics port"

# Traffic after the first scrapes, so that rates see it increase.
sleep 2
for _ in 1 2 3 4 5; do decode >/dev/null || fail "decode"; done
# Failures: a new counter series only shows a rate from its second
# increment on, so each kind fails twice, a scrape apart.
for _ in 1 2; do
  decode --model=no_such_model >/dev/null 2>&1 && fail "an unknown model decoded"
  decode --latent_shape=1,5,8,8 >/dev/null 2>&1 && fail "a latent with 5 channels decoded"
  sleep 1.5
done
decode >/dev/null || fail "decode"
http_get "http://127.0.0.1:$METRICS_PORT/metrics" >"$TMP/scrape.txt"
# Two more scrapes and rule evaluations at 1 s.
for _ in $(seq 100); do
  [ "$(query 'vaedecode:decode_seconds:p95_5m')" -ge 1 ] && [ "$(query 'vaedecode:requests:error_ratio5m > 0')" -ge 1 ] && break
  sleep 0.2
done
sleep 2
"$PY" tests/deploy/deploy_checks.py query-check "$url" "$TMP/prometheus/rules/vaedecode.rules.yml" \
  "$RUNFILES/deploy/grafana/vaedecode-dashboard.json" "$TMP/scrape.txt"

# No rule may fail to evaluate on real data.
"$PY" - "$url" <<'PYEOF' || fail "rule evaluation"
import json, sys, urllib.request
groups = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/rules", timeout=5))["data"]["groups"]
rules = [r for g in groups for r in g["rules"]]
bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") != "ok"]
print(f"{len(rules)} rules loaded, {len(rules) - len(bad)} healthy")
if len(rules) < 20 or bad:
    sys.exit(f"unhealthy rules: {bad}")
PYEOF
echo "prometheus e2e: ok"
