#!/usr/bin/env bash
# The rendered overlays against the Kubernetes API's own JSON schemas,
# strictly (unknown fields are errors), for every version we support:
# kubernetes-validate from PyPI, pinned by SHA-256 with the schemas its wheel
# carries (tools/k8s_validate_env.sh; tools/test.sh passes it as
# VAEDECODE_K8S_VALIDATE). A broken copy must fail, so the validator cannot
# pass by checking nothing.
source tests/deploy/lib.sh
# Oldest to newest Kubernetes release supported (docs/OPERATIONS.md says so).
versions="1.29.0 1.30.0 1.31.0 1.32.0 1.33.0 1.34.0 1.35.0 1.36.0 1.37.0"
validate=${VAEDECODE_K8S_VALIDATE:-}
[ -n "$validate" ] && [ -x "$validate" ] \
  || fail "VAEDECODE_K8S_VALIDATE is not set to the pinned validator; run tools/test.sh, or: VAEDECODE_K8S_VALIDATE=\$(tools/k8s_validate_env.sh) bazel test ..."
cp -rL "$RUNFILES/deploy/k8s" "$TMP/k8s"
"$PY" tests/deploy/deploy_checks.py render "$TMP/k8s" "$TMP"
files=("$TMP/cpu.yaml" "$TMP/gpu.yaml" "$RUNFILES/deploy/prometheus/prometheus-adapter.yaml")
for v in $versions; do
  "$validate" --strict --quiet -k "$v" "${files[@]}" || fail "the manifests do not validate against Kubernetes $v"
  echo "Kubernetes $v: ${#files[@]} files validate (strict)"
done
# Every object was checked against a schema (none skipped for an unknown kind).
out=$("$validate" --strict -k "${versions##* }" "${files[@]}" 2>&1)
[ "$(grep -c ' passed for resource ' <<<"$out")" -ge 16 ] || { echo "$out" >&2; fail "fewer objects validated than rendered"; }
! grep -q WARN <<<"$out" || { echo "$out" >&2; fail "the validator skipped objects"; }
# The negative control: a misspelt field in the Deployment's pod spec.
sed 's/terminationGracePeriodSeconds:/terminationGracePeriodSecondz:/' "$TMP/cpu.yaml" >"$TMP/broken.yaml"
if "$validate" --strict --quiet -k "${versions##* }" "$TMP/broken.yaml" >/dev/null 2>&1; then
  fail "a Deployment with an unknown field validated"
fi
echo "k8s schemas: ok"
