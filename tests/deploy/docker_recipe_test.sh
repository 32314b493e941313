#!/usr/bin/env bash
# The container recipes without a container engine: deploy_checks.py reads
# both Dockerfiles (multi-stage, non-root user = the pods' runAsUser, the
# server as ENTRYPOINT, CMD flags known to the server, EXPOSE = CMD's ports,
# HEALTHCHECK on the gRPC port); then stage.sh lays the real binaries out as
# the image does, and the CPU image's ENTRYPOINT + CMD run from that layout
# (in this test's own network namespace, on the image's real ports) until
# its HEALTHCHECK command passes.
source tests/deploy/lib.sh
"$SERVER" --helpfull >"$TMP/helpfull.txt" 2>&1 || true
# kustomize does not follow runfiles' symlinks: render a copy.
cp -rL "$RUNFILES/deploy/k8s" "$TMP/k8s"
"$PY" tests/deploy/deploy_checks.py manifests "$TMP/helpfull.txt" "$TMP/k8s" \
  "$RUNFILES/deploy/prometheus/podmonitor.yaml" "$RUNFILES/deploy/prometheus/prometheus.yml" "$TMP" >/dev/null
cp "$TMP/gpu.uid" "$TMP/uid"
"$PY" tests/deploy/deploy_checks.py dockerfiles "$TMP/helpfull.txt" "$RUNFILES/deploy/docker" \
  "$RUNFILES/deploy/k8s" "$TMP"

root="$TMP/rootfs"
"$RUNFILES/deploy/docker/stage.sh" "$RUNFILES" "$root"
grep -qx 'libgrpc++1.51' "$root/runtime-packages.txt" || fail "runtime packages miss gRPC"
grep -qx 'libavcodec59' "$root/runtime-packages.txt" || fail "runtime packages miss FFmpeg (MP4 output)"
! grep -q torch "$root/runtime-packages.txt" || fail "a Debian LibTorch package is still a runtime dependency"
# LibTorch (PyPI's wheel) is the only thing no package provides: staged in lib/.
for lib in libtorch_cpu.so libc10.so; do
  grep -qx "$lib" "$root/unpackaged-libs.txt" && [ -f "$root/opt/vaedecode/lib/$lib" ] \
    || fail "$lib is not staged into the image's lib/"
done
others=$(grep -v -E '^lib(torch_cpu|c10|gomp|cudart|cupti)\.so' "$root/unpackaged-libs.txt" || true)
[ -z "$others" ] || fail "libraries outside Debian packages besides LibTorch's: $others"

# The image's command lines, with /opt/vaedecode re-rooted into the layout.
reroot() { sed "s#/opt/vaedecode/#$root/opt/vaedecode/#g" "$1"; }
read -r -a cmdline <<<"$(reroot "$TMP/cpu.cmdline")"
read -r -a healthcheck <<<"$(reroot "$TMP/cpu.healthcheck")"
# Only the layout may provide the worker: no Bazel runfiles hints.
env -u TEST_SRCDIR -u RUNFILES_DIR -u RUNFILES_MANIFEST_FILE "${cmdline[@]}" >"$TMP/image.log" 2>&1 &
image_pid=$!
_pids+=("$image_pid")
ok=0
for _ in $(seq 300); do
  if "${healthcheck[@]}" >/dev/null 2>&1; then ok=1; break; fi
  kill -0 "$image_pid" 2>/dev/null || { cat "$TMP/image.log" >&2; fail "the image's command exited"; }
  sleep 0.2
done
[ "$ok" = 1 ] || { cat "$TMP/image.log" >&2; fail "the image's HEALTHCHECK never passed"; }
"${healthcheck[@]}"
workers=""
for child in $(cat /proc/"$image_pid"/task/*/children); do
  workers+="$(readlink "/proc/$child/exe") "
done
[[ " $workers" == *" $root/opt/vaedecode/worker/vaedecode_worker "* ]] \
  || fail "the server did not start the worker from the image layout (children: $workers)"
# The image serves diffusers' remote_decode over HTTP too (CMD's --http_listen).
http_port=$(grep -o -- '--http_listen=[^ ]*' "$TMP/cpu.cmdline" | sed 's/.*://')
[ -n "$http_port" ] || fail "the image's CMD has no --http_listen"
[ "$(curl -sf "http://127.0.0.1:$http_port/health")" = "Ok" ] || fail "the image's HTTP endpoint is not healthy"
kill -TERM "$image_pid"
wait "$image_pid" || fail "the image's server did not exit 0 on SIGTERM"
if "${healthcheck[@]}" >/dev/null 2>&1; then fail "HEALTHCHECK passes with the server gone"; fi
echo "docker recipe: ok"
