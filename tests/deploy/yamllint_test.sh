#!/usr/bin/env bash
# yamllint --strict on every YAML file under deploy/ (deploy/.yamllint), and
# the Grafana dashboard parses as JSON.
source tests/deploy/lib.sh
need /usr/bin/yamllint
files=$(find -L "$RUNFILES/deploy" \( -name '*.yaml' -o -name '*.yml' \) | sort)
count=$(wc -l <<<"$files")
[ "$count" -ge 20 ] || fail "found only $count YAML files under deploy/ (runfiles broken?)"
# shellcheck disable=SC2086
/usr/bin/yamllint --strict -c "$RUNFILES/deploy/.yamllint" $files || fail "yamllint"
"$PY" -c 'import json, sys; json.load(open(sys.argv[1]))' "$RUNFILES/deploy/grafana/vaedecode-dashboard.json" \
  || fail "the dashboard is not JSON"
echo "yamllint: $count files clean"
