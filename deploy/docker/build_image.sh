#!/usr/bin/env bash
# Builds an image's runtime stage with podman from binaries already built on
# this machine, instead of compiling them again inside the image (what CI
# does: tools/test.sh has just built them). The runtime stage is the
# Dockerfile's own last stage, taken verbatim, with `COPY --from=build
# /stage/...` reading the same layout from the build context instead; the
# layout is made by the script the Dockerfile's build stage runs
# (deploy/docker/image_layout.sh). So CI builds exactly what users build,
# less the compile (deploy/docker/build_from_source.sh proves the rest).
#
#   deploy/docker/build_image.sh cpu|gpu BIN_DIR TAG
#
# BIN_DIR: bazel-bin of a build of the image's targets (`bazel info
# bazel-bin`; for gpu `bazel info --config=gpu bazel-bin`). The base is
# deploy/docker/base_image.sh's Debian 12 (DEBIAN_IMAGE).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 3 ] || { echo "usage: build_image.sh cpu|gpu BIN_DIR TAG" >&2; exit 2; }
flavour=$1
bin=$2
tag=$3
dockerfile=deploy/docker/Dockerfile.$flavour
[ -f "$dockerfile" ] || { echo "build_image.sh: no $dockerfile" >&2; exit 2; }

base=$(deploy/docker/base_image.sh)
ctx=$(mktemp -d /var/tmp/vaedecode-image.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
deploy/docker/image_layout.sh "$flavour" "$bin" "$ctx/stage"

# Global ARGs (before the first FROM), then the last stage.
/usr/bin/python3 - "$dockerfile" "$ctx/Containerfile" <<'PY'
import re, sys
src, dst = sys.argv[1:]
lines = open(src).read().splitlines()
froms = [i for i, l in enumerate(lines) if re.match(r"FROM\s", l)]
head = [l for l in lines[:froms[0]] if re.match(r"ARG\s", l)]
stage = lines[froms[-1]:]
out = []
for l in stage:
    l = re.sub(r"COPY --from=build /stage/", "COPY stage/", l)
    if "--from=" in l:
        sys.exit(f"build_image.sh: the runtime stage of {src} copies from another stage: {l}")
    out.append(l)
open(dst, "w").write("\n".join(head + out) + "\n")
PY

old=$(deploy/docker/podman.sh image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
# --format docker keeps HEALTHCHECK (the OCI image format has no field for it).
deploy/docker/podman.sh build --format docker --layers --build-arg "DEBIAN_IMAGE=$base" \
  --label "vaedecode.commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  -f "$ctx/Containerfile" -t "$tag" "$ctx" >&2
new=$(deploy/docker/podman.sh image inspect --format '{{.Id}}' "$tag")
# The image this tag named before is now untagged: remove it (each is 1-4
# GiB), unless a container or another tag still uses it.
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  deploy/docker/podman.sh rmi "$old" >/dev/null 2>&1 || true
fi
echo "$new"
