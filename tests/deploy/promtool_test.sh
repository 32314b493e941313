#!/usr/bin/env bash
# promtool on the Prometheus recipes: the rules check and their unit tests,
# the scrape config (with pod discovery swapped for a static target: Debian's
# Prometheus is built without Kubernetes discovery), and the Operator's
# PrometheusRule in sync with the rule file.
source tests/deploy/lib.sh
need /usr/bin/promtool
prom="$RUNFILES/deploy/prometheus"
/usr/bin/promtool check rules "$prom/rules/vaedecode.rules.yml" || fail "promtool check rules"
# promtool resolves rule_files relative to the test file: copy the tree.
cp -rL "$prom" "$TMP/prometheus"
/usr/bin/promtool test rules "$TMP/prometheus/tests/vaedecode.rules.test.yml" || fail "promtool test rules"
"$PY" tests/deploy/deploy_checks.py prom-config "$TMP/prometheus/prometheus.yml" "$TMP/prometheus/static.yml" \
  127.0.0.1:9090 "$TMP/prometheus/rules"
/usr/bin/promtool check config "$TMP/prometheus/static.yml" || fail "promtool check config"
"$PY" tests/deploy/deploy_checks.py rules-sync "$prom/rules/vaedecode.rules.yml" "$prom/prometheusrule.yaml"
