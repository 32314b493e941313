#!/usr/bin/env bash
# A Debian 12 base image for machines that reach Debian's archive but no
# image registry: debootstrap's minbase of bookworm, imported into podman as
# localhost/debian:12 (what DEBIAN_IMAGE points at here; elsewhere it stays
# debian:12). The root file system is cached as a tarball with its SHA-256,
# so later runs import it in seconds instead of debootstrapping again
# (about 90 s); it is rebuilt when older than VAEDECODE_BASE_MAX_AGE_DAYS
# (default 14), so security updates reach the images.
#
#   deploy/docker/base_image.sh [--refresh]   # prints the image name
set -euo pipefail
cd "$(dirname "$0")/../.."
image=localhost/debian:12
cache=${VAEDECODE_CACHE:-$HOME/.cache/vaedecode}/images
tarball="$cache/debian-12-minbase.tar"
podman=deploy/docker/podman.sh
max_age=${VAEDECODE_BASE_MAX_AGE_DAYS:-14}

fresh=0
if [ "${1:-}" != --refresh ] && [ -f "$tarball" ] && [ -f "$tarball.sha256" ] \
    && [ -n "$(find "$tarball" -mtime -"$max_age")" ]; then
  if (cd "$cache" && sha256sum --quiet -c "$(basename "$tarball").sha256"); then
    fresh=1
  else
    echo "base_image.sh: $tarball does not match its SHA-256: debootstrapping again" >&2
  fi
fi

if [ "$fresh" = 0 ]; then
  command -v debootstrap >/dev/null || { echo "base_image.sh: debootstrap is missing (tools/setup.sh installs it)" >&2; exit 1; }
  # The archive the host's apt uses (deb822 or one-line sources).
  mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)\/*$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  mirror=${mirror:-http://deb.debian.org/debian}
  root=$(mktemp -d /var/tmp/vaedecode-debootstrap.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  echo "base_image.sh: debootstrap --variant=minbase bookworm from $mirror" >&2
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
  rm -f "$root.log"
  # debootstrap leaves its apt cache of .debs behind: not part of a base.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  mkdir -p "$cache"
  tar --numeric-owner -C "$root" -cf "$tarball.partial" .
  mv "$tarball.partial" "$tarball"
  (cd "$cache" && sha256sum "$(basename "$tarball")" > "$(basename "$tarball").sha256")
fi

# Import when podman lacks the image or has an older import of another tarball.
want=$(cut -c1-64 "$tarball.sha256")
have=$("$podman" image inspect --format '{{index .Labels "vaedecode.base.sha256"}}' "$image" 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  "$podman" import --change "LABEL vaedecode.base.sha256=$want" "$tarball" "$image" >/dev/null
  echo "base_image.sh: imported $image from $tarball" >&2
fi
echo "$image"
