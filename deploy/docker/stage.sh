#!/usr/bin/env bash
# Lays out the image's files from a Bazel output tree, the same way for the
# Dockerfiles' build stages and for tests/deploy (which then runs the server
# from the layout, as the image would).
#
#   deploy/docker/stage.sh [--bundle] BIN_DIR OUT_DIR
#
# BIN_DIR: bazel-bin (or a runfiles tree of the same shape). Writes
#   OUT_DIR/opt/vaedecode/server/vaedecode_server
#   OUT_DIR/opt/vaedecode/worker/vaedecode_worker  (the server finds it beside
#                                                  itself: ../worker/)
#   OUT_DIR/opt/vaedecode/bin/vaedecode_client, vaedecode_health_probe
#   OUT_DIR/runtime-packages.txt  Debian packages owning the shared libraries
#                                 the binaries load (for the runtime stage's
#                                 apt-get install), one per line, sorted
#   OUT_DIR/unpackaged-libs.txt   libraries no package owns (/usr/local, /opt:
#                                 CUDA, an official LibTorch)
# --bundle: also copy every packaged library except glibc's into
#   OUT_DIR/opt/vaedecode/lib (for a runtime base that is not Debian 12,
#   e.g. the CUDA image; run with LD_LIBRARY_PATH=/opt/vaedecode/lib).
# Fails if a binary is missing or a library does not resolve.
set -euo pipefail

bundle=0
if [ "${1:-}" = "--bundle" ]; then
  bundle=1
  shift
fi
if [ $# -ne 2 ]; then
  echo "usage: stage.sh [--bundle] BIN_DIR OUT_DIR" >&2
  exit 2
fi
bin=$1
out=$2
root="$out/opt/vaedecode"
mkdir -p "$root/server" "$root/worker" "$root/bin"

# Image path <- Bazel output path.
files=(
  "server/vaedecode_server:server/vaedecode_server"
  "worker/vaedecode_worker:worker/vaedecode_worker"
  "bin/vaedecode_client:client/vaedecode_client"
  "bin/vaedecode_health_probe:deploy/healthcheck/vaedecode_health_probe"
)
binaries=()
for f in "${files[@]}"; do
  dst=${f%%:*}
  src="$bin/${f#*:}"
  if [ ! -x "$src" ]; then
    echo "stage.sh: $src is missing: build it first" >&2
    exit 1
  fi
  cp -L "$src" "$root/$dst"
  chmod 0755 "$root/$dst"
  binaries+=("$root/$dst")
done

# The shared libraries the binaries load, as the dynamic loader resolves them.
libs=$(for b in "${binaries[@]}"; do ldd "$b"; done | awk '
  /not found/ { print "MISSING " $1; next }
  $2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
if grep -q '^MISSING' <<<"$libs"; then
  echo "stage.sh: unresolved libraries: $(grep '^MISSING' <<<"$libs" | cut -d' ' -f2 | tr '\n' ' ')" >&2
  exit 1
fi

# Owner packages, in one dpkg query (one read of its database). Debian 12
# registers some libraries under /lib, others under /usr/lib, and
# alternatives (libblas.so.3) resolve to another path: try each spelling.
declare -A candidates=()
while read -r lib; do
  [ -n "$lib" ] || continue
  for c in "$lib" "$(readlink -f "$lib")" "${lib#/usr}" "/usr$lib"; do candidates["$c"]=1; done
done <<<"$libs"
declare -A owner=()
while IFS= read -r line; do
  owner["${line#*: }"]=${line%%: *}
done < <(dpkg-query --search "${!candidates[@]}" 2>/dev/null | grep -v '^diversion by' || true)

: > "$out/unpackaged-libs.txt"
packages=()
glibc_re='^(libc6|libgcc-s1|libstdc\+\+6)$'
[ "$bundle" = 1 ] && mkdir -p "$root/lib"
while read -r lib; do
  [ -n "$lib" ] || continue
  pkg=""
  for c in "$lib" "$(readlink -f "$lib")" "${lib#/usr}" "/usr$lib"; do
    if [ -n "${owner[$c]:-}" ]; then
      pkg=${owner[$c]%%,*}
      pkg=${pkg%%:*}
      break
    fi
  done
  if [ -n "$pkg" ]; then
    packages+=("$pkg")
    if [ "$bundle" = 1 ] && ! [[ "$pkg" =~ $glibc_re ]]; then
      cp -L "$lib" "$root/lib/"
    fi
  else
    echo "$lib" >> "$out/unpackaged-libs.txt"
  fi
done <<<"$libs"
printf '%s\n' "${packages[@]}" | sort -u > "$out/runtime-packages.txt"
echo "stage.sh: ${#binaries[@]} binaries, $(wc -l < "$out/runtime-packages.txt") runtime packages," \
  "$(wc -l < "$out/unpackaged-libs.txt") unpackaged libraries" >&2
