#!/usr/bin/env bash
# Proves that a Dockerfile builds from source as a user runs it (every stage,
# Bazel inside the image, nothing from this machine's builds), then starts
# the image and decodes once through it. CI builds only the runtime stage,
# from binaries it already built (deploy/docker/build_image.sh); run this
# when the build stage or what it installs changes. It takes as long as a
# fresh machine's build (docs/OPERATIONS.md, "Images", has the time).
#
#   deploy/docker/build_from_source.sh [cpu|gpu] [TAG]   # default cpu, vaedecode:FLAVOUR-src
#
# Writes the build log and the time to out/images/from_source_FLAVOUR.{log,txt}.
set -euo pipefail
cd "$(dirname "$0")/../.."
flavour=${1:-cpu}
tag=${2:-vaedecode:$flavour-src}
podman=deploy/docker/podman.sh
mkdir -p out/images
log=out/images/from_source_$flavour.log
base=$(deploy/docker/base_image.sh)

# Where this machine's pip trusts a CA of its own (a proxy between it and
# PyPI), the build's pip is told the same, read-only, outside any layer.
volumes=()
host_ca=${PIP_CERT:-$(/usr/bin/python3 -m pip config get global.cert 2>/dev/null || true)}
if [ -n "$host_ca" ] && [ -f "$host_ca" ]; then
  conf=$(mktemp)
  printf '[global]\ncert = /run/vaedecode-host-ca.crt\n' >"$conf"
  volumes+=(-v "$host_ca:/run/vaedecode-host-ca.crt:ro" -v "$conf:/etc/pip.conf:ro")
fi

t0=$SECONDS
# The file's own .dockerignore (BuildKit reads it beside the Dockerfile;
# podman 4.3 needs it named).
if ! "$podman" build --format docker --build-arg "DEBIAN_IMAGE=$base" "${volumes[@]}" \
    --ignorefile "deploy/docker/Dockerfile.$flavour.dockerignore" \
    -f "deploy/docker/Dockerfile.$flavour" -t "$tag" . >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "build_from_source.sh: the build failed ($log)" >&2
  exit 1
fi
build_s=$((SECONDS - t0))
size=$("$podman" image inspect --format '{{.Size}}' "$tag")

# Start it on the CPU (the GPU image too: no GPU here) and decode once with
# the image's own client.
name=vaedecode-from-source-$$
args=()
[ "$flavour" = gpu ] && args=(--listen=0.0.0.0:50051 --metrics_listen=0.0.0.0:9090 --devices=cpu:1 --group_size=1)
"$podman" run -d --name "$name" "$tag" "${args[@]}" >/dev/null
trap '"$podman" rm -f -t 0 "$name" >/dev/null 2>&1 || true' EXIT
ok=0
for _ in $(seq 600); do
  if "$podman" healthcheck run "$name" >/dev/null 2>&1; then ok=1; break; fi
  sleep 1
done
[ "$ok" = 1 ] || { "$podman" logs "$name" | tail -n 20 >&2; echo "build_from_source.sh: never healthy" >&2; exit 1; }
"$podman" exec "$name" /opt/vaedecode/bin/vaedecode_client --server=127.0.0.1:50051 --out=/tmp/decode.png >&2
"$podman" stop -t 60 "$name" >/dev/null
code=$("$podman" inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { echo "build_from_source.sh: exit code $code after podman stop" >&2; exit 1; }
summary="$tag from source: built in ${build_s} s, $((size / 1048576)) MiB, healthy, decoded, stopped with exit 0 ($(date -u +%F), $(nproc) cores)"
echo "$summary" | tee "out/images/from_source_$flavour.txt"
