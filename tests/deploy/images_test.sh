#!/usr/bin/env bash
# The container images for real, with podman (runtime runc; see
# deploy/docker/podman.sh): built, started and checked as a user would. Run
# by tools/test.sh after the builds they reuse (podman as root does not run
# inside Bazel's sandbox):
#
#   tests/deploy/images_test.sh cpu BIN_DIR      # bazel-bin of the CPU build
#   tests/deploy/images_test.sh gpu GPU_BIN_DIR  # bazel-bin of the --config=gpu build
#   tests/deploy/images_test.sh bare BUNDLE_DIR  # out/gpu_bundle
#
# cpu: builds the CPU overlay's image (deploy/k8s/overlays/cpu names it) from
#   BIN_DIR's binaries (deploy/docker/build_image.sh), starts it with its own
#   CMD, and checks: it runs as the non-root user, its HEALTHCHECK reports
#   healthy, vaedecode_client on the host decodes through the published gRPC
#   port and curl through the published HTTP port, both byte-equal to the same
#   decodes by the same binaries outside the container, /metrics counts them,
#   and `podman stop` (SIGTERM) drains: exit 0, no warning or error logged.
#   Records the image's size and start-to-SERVING time.
# gpu: builds the GPU overlay's image from a --config=gpu build and checks
#   every binary and library resolves inside it, the NVIDIA libraries are
#   the wheels torch pins, and without a GPU the server refuses cuda:0 with
#   its message, then serves on cpu (a decode equal to the CPU image's, from
#   the cpu run before it).
# bare: a container holding a minimal Debian and a Python 3.12 venv with the
#   torch wheel and its NVIDIA wheels, nothing else (the bare GPU machine);
#   BUNDLE_DIR/gpu_check.sh must pass there as on the host.
#
# Each check appends "NAME<TAB>passed|failed<TAB>SECONDS<TAB>DETAIL" to
# $VAEDECODE_STEPS (tools/count_tests.py counts them); figures go to
# out/images/images.json. Exit status 1 when a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
podman=deploy/docker/podman.sh
out=out/images
mkdir -p "$out"
steps=${VAEDECODE_STEPS:-$out/steps.tsv}
failures=0
tmp=$(mktemp -d)
containers=()
cleanup() {
  local c
  for c in "${containers[@]}"; do "$podman" rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# check NAME FUNCTION ARGS...: runs FUNCTION in a subshell with -e; its last
# line of output is the detail recorded.
check() {
  local check_name=$1
  shift
  local t0=$SECONDS status detail
  if ("$@") >"$tmp/check.log" 2>&1; then status=passed; else status=failed; failures=$((failures + 1)); fi
  detail=$(tail -n 1 "$tmp/check.log" | tr '\t' ' ' | cut -c1-300)
  printf '%s\t%s\t%s\t%s\n' "images/$check_name" "$status" $((SECONDS - t0)) "$detail" >>"$steps"
  echo "== images/$check_name: $status ($((SECONDS - t0))s) $detail"
  [ "$status" = passed ] || sed 's/^/   | /' "$tmp/check.log" | tail -n 40
  return 0
}

# figure KEY VALUE: one number or string into out/images/images.json.
figure() {
  /usr/bin/python3 - "$out/images.json" "$1" "$2" <<'PY'
import json, os, sys
path, key, value = sys.argv[1:]
data = json.load(open(path)) if os.path.exists(path) else {}
try:
    value = float(value) if "." in value else int(value)
except ValueError:
    pass
data[key] = value
json.dump(data, open(path, "w"), indent=1, sort_keys=True)
PY
}

overlay_image() {  # FLAVOUR: the image the overlay's Deployment runs
  mkdir -p "$tmp/render"
  /usr/bin/python3 tests/deploy/deploy_checks.py render deploy/k8s "$tmp/render" >/dev/null
  cat "$tmp/render/$1.image"
}

# published NAME PORT: the host port podman published a container port on.
published() { "$podman" port "$1" "$2/tcp" | head -n 1 | sed 's/.*://'; }

# wait_serving PORT SECONDS [NAME]: grpc.health.v1 SERVING through the port.
wait_serving() {
  local port=$1 seconds=$2 name=${3:-} i
  for i in $(seq $((seconds * 5))); do
    "$probe" --addr="127.0.0.1:$port" --service=vaedecode.v1.VaeDecoder --timeout_s=2 >/dev/null 2>&1 && return 0
    if [ -n "$name" ] && [ "$("$podman" inspect --format '{{.State.Running}}' "$name")" != true ]; then
      "$podman" logs "$name" 2>&1 | tail -n 20
      echo "the container exited"
      return 1
    fi
    sleep 0.2
  done
  echo "not SERVING on port $port within ${seconds}s"
  return 1
}

# clean_log FILE: a clean start and stop log nothing at warning or error.
clean_log() {
  local bad
  bad=$(grep -E -i 'level=(warn|warning|error|fatal)|\[(warn|warning|error|critical)\]|^[WEF][0-9]{4} ' "$1" || true)
  [ -z "$bad" ] || { echo "$bad" | head -n 10; echo "warning or error lines in $(basename "$1")"; return 1; }
}

stop_clean() {  # NAME: podman stop (SIGTERM), exit 0, clean log
  local name=$1
  "$podman" stop -t 120 "$name" >/dev/null
  "$podman" logs "$name" >"$tmp/$name.log" 2>&1
  local code
  code=$("$podman" inspect --format '{{.State.ExitCode}}' "$name")
  [ "$code" = 0 ] || { tail -n 20 "$tmp/$name.log"; echo "exit code $code after podman stop"; return 1; }
  clean_log "$tmp/$name.log"
  echo "stopped: exit 0, $(wc -l <"$tmp/$name.log") log lines, no warning or error"
}

# The demo latent both protocols decode: .npy for the client, raw for HTTP.
make_latent() {
  /usr/bin/python3 -c 'import numpy as np, sys
z = np.random.default_rng(7).standard_normal((1, 4, 32, 32), dtype=np.float32)
np.save(sys.argv[1] + ".npy", z); z.tofile(sys.argv[1] + ".bin")' "$tmp/latent"
}

decode_grpc() {  # PORT OUT
  "$client" --server="127.0.0.1:$1" --latent="$tmp/latent.npy" --out="$2" >/dev/null
}

decode_http() {  # PORT OUT
  curl -sSf -X POST -H 'Content-Type: tensor/binary' --data-binary @"$tmp/latent.bin" \
    "http://127.0.0.1:$1/?shape=1&shape=4&shape=32&shape=32&dtype=float32&output_type=pt" -o "$2"
}

# ------------------------------------------------------------------- cpu

# image_build cpu|gpu BIN_DIR: $image from that build's binaries, with its
# size and build time as figures.
image_build() {
  local kind=$1 t0=$SECONDS size
  deploy/docker/build_image.sh "$kind" "$2" "$image" >/dev/null
  size=$("$podman" image inspect --format '{{.Size}}' "$image")
  figure "${kind}_image" "$image"
  figure "${kind}_image_bytes" "$size"
  figure "${kind}_image_build_s" $((SECONDS - t0))
  echo "$image: $((size / 1048576)) MiB, built in $((SECONDS - t0)) s"
}

# The same decodes by the same binaries outside any container, with the
# image's CMD flags on loopback ports.
cpu_reference() {
  local ready="$tmp/host.ready"
  HOME="$tmp/host-home" "$bin/server/vaedecode_server" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
    --http_listen=127.0.0.1:0 --devices=cpu:1 --group_size=1 --ready_file="$ready" >"$tmp/host.log" 2>&1 &
  host_pid=$!  # this check's subshell: its EXIT trap stops the server
  trap 'kill -TERM $host_pid 2>/dev/null' EXIT
  for _ in $(seq 300); do [ -s "$ready" ] && break; sleep 0.1; done
  local port http
  port=$(sed -n 's/^grpc_port=//p' "$ready")
  http=$(sed -n 's/^http_port=//p' "$ready")
  wait_serving "$port" 300
  decode_grpc "$port" "$tmp/host.npy"
  cp "$tmp/host.npy" "$out/cpu_reference.npy"  # for the gpu run
  decode_http "$http" "$tmp/host_http.bin"
  kill -TERM "$host_pid"
  wait "$host_pid" || { echo "the host server did not exit 0"; return 1; }
  echo "host decodes: $(stat -c %s "$tmp/host.npy") B (gRPC), $(stat -c %s "$tmp/host_http.bin") B (HTTP)"
}

cpu_start() {
  local t0
  t0=$(date +%s.%N)
  "$podman" run -d --name "$name" -p 127.0.0.1::50051 -p 127.0.0.1::8080 -p 127.0.0.1::9090 "$image" >/dev/null
  wait_serving "$(published "$name" 50051)" 600 "$name"
  local s
  s=$(/usr/bin/python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t0")
  figure cpu_start_to_serving_s "$s"
  echo "podman run to SERVING through the published port: $s s"
}

cpu_nonroot() {
  local uid users
  uid=$("$podman" exec "$name" id -u)
  [ "$uid" = 10001 ] || { echo "exec runs as uid $uid"; return 1; }
  # Every process of the container (server and worker), by numeric uid.
  users=$("$podman" top "$name" huser | tail -n +2 | sort -u | tr '\n' ' ')
  [ "$users" = "10001 " ] || { echo "processes run as: $users"; return 1; }
  echo "server and worker run as uid 10001"
}

cpu_healthcheck() {
  "$podman" healthcheck run "$name" || { echo "podman healthcheck run: unhealthy"; return 1; }
  echo "the image's HEALTHCHECK: healthy"
}

cpu_grpc() {
  decode_grpc "$(published "$name" 50051)" "$tmp/container.npy"
  cmp "$tmp/host.npy" "$tmp/container.npy" || { echo "the container's gRPC decode differs from the host's"; return 1; }
  echo "gRPC through the published port: byte-equal to the host's decode ($(stat -c %s "$tmp/container.npy") B)"
}

cpu_http() {
  decode_http "$(published "$name" 8080)" "$tmp/container_http.bin"
  cmp "$tmp/host_http.bin" "$tmp/container_http.bin" || { echo "the container's HTTP decode differs from the host's"; return 1; }
  echo "HTTP through the published port: byte-equal to the host's decode ($(stat -c %s "$tmp/container_http.bin") B)"
}

cpu_metrics() {
  curl -sSf "http://127.0.0.1:$(published "$name" 9090)/metrics" >"$tmp/metrics.txt"
  local p n
  for p in grpc http; do
    n=$(awk -v p="$p" '/^vaedecode_requests_total\{/ && $0 ~ "protocol=\"" p "\"" && $0 ~ /status="OK"|code="OK"|status="ok"/ {s += $NF} END {print s + 0}' "$tmp/metrics.txt")
    [ "$n" -ge 1 ] 2>/dev/null || { grep '^vaedecode_requests_total' "$tmp/metrics.txt" | head; echo "no successful $p request counted"; return 1; }
  done
  echo "metrics scrape: $(grep -c '^vaedecode_' "$tmp/metrics.txt") vaedecode_ samples, the gRPC and HTTP decodes counted"
}

run_cpu() {
  bin=$(cd "$1" && pwd)
  client="$bin/client/vaedecode_client"
  probe="$bin/deploy/healthcheck/vaedecode_health_probe"
  image=$(overlay_image cpu)
  name=vaedecode-images-test-cpu-$$
  containers+=("$name")
  make_latent
  check cpu_image_build image_build cpu "$bin"
  check cpu_host_reference cpu_reference
  check cpu_start_to_serving cpu_start
  check cpu_non_root cpu_nonroot
  check cpu_healthcheck cpu_healthcheck
  check cpu_grpc_decode cpu_grpc
  check cpu_http_decode cpu_http
  check cpu_metrics cpu_metrics
  check cpu_stop_drains stop_clean "$name"
}

# ------------------------------------------------------------------- gpu

gpu_libs() {
  # Every binary, LibTorch's CUDA libraries and cuDNN's sub-libraries (which
  # cuDNN loads by name at run time) resolve, and only from the image's lib/.
  "$podman" run --rm --entrypoint /bin/sh "$image" -c '
    set -e
    for f in /opt/vaedecode/server/* /opt/vaedecode/worker/* /opt/vaedecode/bin/* /opt/vaedecode/lib/lib*.so*; do
      ldd "$f" | sed "s|^|$f: |"
    done' >"$tmp/ldd.txt"
  if grep -q 'not found' "$tmp/ldd.txt"; then grep 'not found' "$tmp/ldd.txt" | sort -u | head; echo "unresolved libraries"; return 1; fi
  local stray
  # The library's name (left of "=>", after the "FILE: " prefix).
  stray=$(sed 's/^[^:]*:[[:space:]]*//' "$tmp/ldd.txt" \
    | grep -E '^lib(cuda|cublas|cudnn|nccl|cufft|curand|cusparse|cusolver|nvJitLink|nvrtc|torch|c10)[^ ]* => /' \
    | grep -v '=> /opt/vaedecode/lib/' | sort -u || true)
  [ -z "$stray" ] || { echo "$stray" | head; echo "NVIDIA or LibTorch libraries resolved outside /opt/vaedecode/lib"; return 1; }
  for lib in libtorch_cuda.so libcudnn.so.9 libcublasLt.so.13 libnccl.so.2; do
    grep -q "^/opt/vaedecode/server/vaedecode_server: .*$lib => /opt/vaedecode/lib/" "$tmp/ldd.txt" \
      || grep -q "^/opt/vaedecode/lib/$lib:" "$tmp/ldd.txt" || { echo "$lib is not in the image"; return 1; }
  done
  echo "$(cut -d: -f1 "$tmp/ldd.txt" | sort -u | wc -l) files: every library resolves, NVIDIA's and LibTorch's from /opt/vaedecode/lib"
}

gpu_versions() {
  # The image's NVIDIA wheels are the versions torch's wheel requires, and
  # the libraries are those wheels' (NCCL and cuDNN say their version).
  "$podman" run --rm --entrypoint /bin/cat "$image" /opt/vaedecode/lib/NVIDIA_WHEELS >"$tmp/wheels.txt"
  local torch_wheel
  torch_wheel=$(ls "${VAEDECODE_CACHE:-$HOME/.cache/vaedecode}"/wheels/torch-2.11.0-cp312-*.whl | head -n 1)
  /usr/bin/python3 - "$torch_wheel" "$tmp/wheels.txt" <<'PY'
import re, sys, zipfile
torch_wheel, manifest = sys.argv[1:]
with zipfile.ZipFile(torch_wheel) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
pins = dict(re.findall(r"^Requires-Dist: (nvidia-[a-z0-9-]+)==([0-9.]+)", meta, re.M))
have = {}
for line in open(manifest):
    m = re.match(r"(nvidia_[a-z0-9_]+)-([0-9.]+)-", line)
    if m:
        have[m.group(1).replace("_", "-")] = m.group(2)
bad = [f"{p} {v} (image: {have.get(p)})" for p, v in pins.items() if have.get(p) != v]
if not pins or bad:
    sys.exit(f"torch pins {pins}; not matched: {bad}")
print("torch's pins in the image:", " ".join(f"{p}=={v}" for p, v in sorted(pins.items())))
PY
  local nccl cudnn
  nccl=$("$podman" run --rm --entrypoint /bin/grep "$image" -a -o -m 1 'NCCL version [0-9.]*+cuda[0-9.]*' /opt/vaedecode/lib/libnccl.so.2 | head -n 1)
  [[ "$nccl" == "NCCL version 2.28.9+cuda13.0" ]] || { echo "libnccl.so.2 says: $nccl"; return 1; }
  grep -q '^nvidia_cudnn_cu13-9.19.0.56-' "$tmp/wheels.txt" || { echo "cuDNN is not 9.19.0.56"; return 1; }
  echo "NVIDIA wheels = torch 2.11.0's pins; $nccl; cuDNN 9.19.0.56"
}

gpu_refuses_cuda() {
  # The image's own CMD (cuda:0) on a machine without a GPU: the server
  # starts, says why the GPU group cannot form, and never reports SERVING.
  local n=$name-cuda
  containers+=("$n")
  "$podman" run -d --name "$n" -p 127.0.0.1::50051 "$image" >/dev/null
  local port
  port=$(published "$n" 50051)
  for _ in $(seq 300); do
    "$podman" logs "$n" 2>&1 | grep -E 'cuda:0: this process sees 0 GPU|cuda:0: .*(no CUDA|CUDA driver|no NVIDIA|GPU)' > /dev/null && break
    sleep 0.2
  done
  "$podman" logs "$n" >"$tmp/cuda.log" 2>&1
  local message
  message=$(grep -o -E 'device cuda:0: [^"]*' "$tmp/cuda.log" | head -n 1)
  [ -n "$message" ] || { tail -n 20 "$tmp/cuda.log"; echo "no message about cuda:0"; return 1; }
  if "$probe" --addr="127.0.0.1:$port" --service=vaedecode.v1.VaeDecoder --timeout_s=2 >/dev/null 2>&1; then
    echo "SERVING without a GPU"; return 1
  fi
  "$podman" rm -f -t 30 "$n" >/dev/null
  echo "without a GPU: \"$message\", not SERVING"
}

gpu_serves_cpu() {
  "$podman" run -d --name "$name" -p 127.0.0.1::50051 -p 127.0.0.1::8080 -p 127.0.0.1::9090 "$image" \
    --listen=0.0.0.0:50051 --metrics_listen=0.0.0.0:9090 --http_listen=0.0.0.0:8080 \
    --devices=cpu:1 --group_size=1 >/dev/null
  wait_serving "$(published "$name" 50051)" 600 "$name"
  decode_grpc "$(published "$name" 50051)" "$tmp/gpu_image.npy"
  /usr/bin/python3 -c 'import numpy as np, sys
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
d = float(np.abs(a - b).max())
assert a.shape == b.shape and d <= 1e-5, (a.shape, b.shape, d)
print(f"the --config=gpu build serves on cpu: its decode is within {d:.1e} of the CPU build'"'"'s")' "$tmp/gpu_image.npy" "$out/cpu_reference.npy"
}

run_gpu() {
  gpu_bin=$(cd "$1" && pwd)
  # The --config=gpu client and probe run on this host as well.
  client="$gpu_bin/client/vaedecode_client"
  probe="$gpu_bin/deploy/healthcheck/vaedecode_health_probe"
  image=$(overlay_image gpu)
  name=vaedecode-images-test-gpu-$$
  containers+=("$name")
  make_latent
  check gpu_image_build image_build gpu "$gpu_bin"
  check gpu_image_libraries gpu_libs
  check gpu_image_versions gpu_versions
  check gpu_refuses_cuda_without_gpu gpu_refuses_cuda
  check gpu_serves_on_cpu gpu_serves_cpu
  check gpu_stop_drains stop_clean "$name"
}

# ------------------------------------------------------------------- bare

bare_build() {
  local base python wheels list key
  base=$(deploy/docker/base_image.sh)
  python=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.* 2>/dev/null | sort -V | tail -n 1)
  [ -x "$python/bin/python3.12" ] || { echo "no CPython 3.12 under ${PYENV_ROOT:-$HOME/.pyenv}/versions"; return 1; }
  wheels=${VAEDECODE_CACHE:-$HOME/.cache/vaedecode}/wheels
  # torch (tools/libtorch.sh's), NVIDIA's (tools/nvidia_wheels.sh's) and the
  # pure-Python packages `import torch` needs (hash-pinned).
  tools/libtorch.sh >/dev/null
  list=$(ls "$wheels"/torch-2.11.0-cp312-*.whl; tools/nvidia_wheels.sh --list)
  /usr/bin/python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --require-hashes -r tests/deploy/bare_gpu_requirements.txt -d "$tmp/pure"
  mkdir -p "$wheels/pure"
  cp -n "$tmp"/pure/*.whl "$wheels/pure/" 2>/dev/null || true
  list+=$'\n'$(for w in "$tmp"/pure/*.whl; do echo "$wheels/pure/$(basename "$w")"; done)
  key=$( (cat tests/deploy/bare_gpu.Containerfile; echo "$base $python"; xargs -n1 basename <<<"$list" | sort) | sha256sum | cut -c1-16)
  local bare_image=localhost/vaedecode-bare-gpu:$key
  echo "$bare_image" >"$tmp/bare_image"
  if ! "$podman" image exists "$bare_image"; then
    "$podman" build --format docker --network none --build-arg "BASE=$base" --build-arg "PYTHON=$python" \
      --build-arg "WHEELS=$(sed "s|^$wheels/||" <<<"$list" | tr '\n' ' ')" \
      -v "$python:/mnt/python:ro" -v "$wheels:/wheels:ro" \
      -f tests/deploy/bare_gpu.Containerfile -t "$bare_image" tests/deploy >"$tmp/bare_build.log" 2>&1 \
      || { tail -n 30 "$tmp/bare_build.log"; echo "building the bare machine failed"; return 1; }
  fi
  figure bare_image "$bare_image"
  figure bare_image_bytes "$("$podman" image inspect --format '{{.Size}}' "$bare_image")"
  echo "$bare_image: Debian minbase + $(basename "$python") + torch 2.11.0 + $(tools/nvidia_wheels.sh --list | wc -l) NVIDIA wheels"
}

bare_check() {
  local results="$out/bare_gpu_check" bare_image
  bare_image=$(cat "$tmp/bare_image")
  rm -rf "$results"
  mkdir -p "$results"
  # The bundle read-only, as it arrives on the GPU machine; no network.
  "$podman" run --rm --network none -v "$bundle:/bundle:ro" -v "$(pwd)/$results:/results" -e OUT=/results \
    "$bare_image" /bundle/gpu_check.sh >"$tmp/bare.log" 2>&1
  local rc=$?
  local steps
  steps=$(/usr/bin/python3 -c 'import json, sys
for s in json.load(open(sys.argv[1]))["steps"]: print(s["step"], s["status"], s["seconds"])' "$results/gpu_check.json" 2>/dev/null)
  sed 's/^/   step /' <<<"$steps"
  [ "$rc" = 0 ] || { tail -n 30 "$tmp/bare.log"; echo "gpu_check.sh exited $rc in the bare container ($results/gpu_check.log)"; return 1; }
  echo "gpu_check.sh passed in the bare container: $(grep -c ' passed ' <<<"$steps") steps passed, $(grep -c ' skipped ' <<<"$steps") skipped"
}

run_bare() {
  bundle=$(cd "$1" && pwd)
  [ -x "$bundle/gpu_check.sh" ] || { echo "images_test.sh: $bundle has no gpu_check.sh (tools/gpu_bundle.sh)" >&2; exit 2; }
  check bare_gpu_machine_build bare_build
  check bare_gpu_machine_gpu_check bare_check
}

case "${1:-}" in
  cpu) [ $# -eq 2 ] || exit 2; run_cpu "$2" ;;
  gpu) [ $# -eq 2 ] || exit 2; run_gpu "$2" ;;
  bare) [ $# -eq 2 ] || exit 2; run_bare "$2" ;;
  *) echo "usage: images_test.sh cpu BIN_DIR | gpu GPU_BIN_DIR | bare BUNDLE_DIR" >&2; exit 2 ;;
esac
[ "$failures" = 0 ]
