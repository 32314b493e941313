#!/usr/bin/env bash
# Lays out the image's files from a Bazel output tree, the same way for the
# Dockerfiles' build stages, for tests/deploy (which then runs the server
# from the layout, as the image would) and for tools/gpu_bundle.sh.
#
#   deploy/docker/stage.sh [--bundle] [--host-libs REGEX] [--also DST=SRC]... BIN_DIR OUT_DIR
#
# BIN_DIR: bazel-bin (or a runfiles tree of the same shape). Writes
#   OUT_DIR/opt/vaedecode/server/vaedecode_server
#   OUT_DIR/opt/vaedecode/worker/vaedecode_worker  (the server finds it beside
#                                                  itself: ../worker/)
#   OUT_DIR/opt/vaedecode/bin/vaedecode_client, vaedecode_health_probe
#   OUT_DIR/opt/vaedecode/lib/    the libraries no Debian package provides
#                                 (LibTorch, from PyPI's torch wheel); every
#                                 binary's run path is $ORIGIN/../lib
#   OUT_DIR/runtime-packages.txt  Debian packages owning the shared libraries
#                                 the binaries load, and FFmpeg's, which the
#                                 worker dlopens (for the runtime stage's
#                                 apt-get install), one per line, sorted
#   OUT_DIR/unpackaged-libs.txt   the libraries copied into lib/ because no
#                                 package owns them
# --bundle: also copy every packaged library except glibc's into lib/ (for a
#   runtime base that is not Debian 12: the CUDA image, a bare GPU machine).
# --host-libs REGEX: libraries (file names matching REGEX) the target machine
#   provides itself (CUDA, cuDNN, NCCL, or its own LibTorch): never copied,
#   and allowed not to resolve here.
# --also DST=SRC: one more binary, BIN_DIR/SRC to opt/vaedecode/DST.
# Fails if a binary is missing or a library does not resolve.
set -euo pipefail

bundle=0
host_re='^$'
extra=()
while [ $# -gt 2 ]; do
  case "$1" in
    --bundle) bundle=1; shift ;;
    --host-libs) host_re=$2; shift 2 ;;
    --also) extra+=("${2%%=*}:${2#*=}"); shift 2 ;;
    *) break ;;
  esac
done
if [ $# -ne 2 ]; then
  echo "usage: stage.sh [--bundle] [--host-libs REGEX] [--also DST=SRC]... BIN_DIR OUT_DIR" >&2
  exit 2
fi
command -v patchelf >/dev/null || { echo "stage.sh: needs patchelf (tools/setup.sh installs it)" >&2; exit 1; }
bin=$1
out=$2
root="$out/opt/vaedecode"
mkdir -p "$root/server" "$root/worker" "$root/bin" "$root/lib"

# Image path <- Bazel output path.
files=(
  "server/vaedecode_server:server/vaedecode_server"
  "worker/vaedecode_worker:worker/vaedecode_worker"
  "bin/vaedecode_client:client/vaedecode_client"
  "bin/vaedecode_health_probe:deploy/healthcheck/vaedecode_health_probe"
  "${extra[@]}"
)
binaries=()
sources=()
for f in "${files[@]}"; do
  dst=${f%%:*}
  src="$bin/${f#*:}"
  if [ ! -x "$src" ]; then
    echo "stage.sh: $src is missing: build it first" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$root/$dst")"
  cp -L "$src" "$root/$dst"
  chmod 0755 "$root/$dst"
  binaries+=("$root/$dst")
  sources+=("$src")
done

# The shared libraries the binaries load, as the dynamic loader resolves them
# where Bazel put them (their run paths are relative to bazel-bin).
libs=$(for b in "${sources[@]}"; do ldd "$b"; done | awk -v host="$host_re" '
  { name = $1; sub(/.*\//, "", name) }
  name ~ host { next }
  /not found/ { print "MISSING " $1; next }
  $2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
if grep -q '^MISSING' <<<"$libs"; then
  echo "stage.sh: unresolved libraries: $(grep '^MISSING' <<<"$libs" | cut -d' ' -f2 | tr '\n' ' ')" >&2
  exit 1
fi

# Owner packages, in one dpkg query (one read of its database). Debian 12
# registers some libraries under /lib, others under /usr/lib, and
# alternatives resolve to another path: try each spelling.
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
    cp -L "$lib" "$root/lib/"
    echo "$(basename "$lib")" >> "$out/unpackaged-libs.txt"
  fi
done <<<"$libs"
# lib/ beside the binaries, wherever the layout is unpacked.
for b in "${binaries[@]}"; do patchelf --set-rpath '$ORIGIN/../lib' "$b"; done
# The worker loads FFmpeg with dlopen for MP4 output (formats/mp4.h): no
# binary links it, so its packages are named here. (--bundle does not copy
# it: a bare GPU machine serves everything but MP4 unless it has FFmpeg.)
packages+=(libavcodec59 libavformat59 libswscale6)
printf '%s\n' "${packages[@]}" | sort -u > "$out/runtime-packages.txt"
sort -o "$out/unpackaged-libs.txt" "$out/unpackaged-libs.txt"
echo "stage.sh: ${#binaries[@]} binaries, $(wc -l < "$out/runtime-packages.txt") runtime packages," \
  "$(wc -l < "$out/unpackaged-libs.txt") unpackaged libraries" >&2
