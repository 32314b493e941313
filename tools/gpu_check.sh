#!/usr/bin/env bash
# The GPU check in one step, run from the bundle tools/gpu_bundle.sh makes:
# on a bare GPU machine (NVIDIA driver, a python3 with torch 2.11.0+cu130;
# no Bazel, no Debian packages) or, with the GPU steps skipped, on a CPU
# machine (tools/test.sh runs it that way, so it cannot rot).
#
#   ./gpu_check.sh               # from the bundle folder
#   OUT=/results ./gpu_check.sh  # figures and log into $OUT (default ./out)
#   GPU_CHECK_DEADLINE_S=360     # the whole check's deadline (default 360 s)
#
# LibTorch is the machine's own: python3's torch (its lib/ and the NVIDIA
# wheels beside it), or VAEDECODE_TORCH_LIB=DIR (libtorch_cpu.so and
# friends, with a VERSION file one level up). The bundle was built against
# the version in LIBTORCH_VERSION and refuses any other.
#
# Steps (each timed and logged; a failed step does not stop the others; a
# step that cannot start before the deadline is "skipped (deadline)"):
#   gpu    the GPU (nvidia-smi); none: every GPU step below runs on the CPU
#          at small sizes instead, or skips
#   load   every bundled binary loads (no missing library)
#   tests  the GPU tests: every fixture dense on cuda:0 in float32 with TF32
#          off within 1e-4 of diffusers, bfloat16 within the fixtures' bf16
#          gate (max abs <= 1, RMSE <= 0.05); the group path over NCCL at
#          world size 1; CUDA memory accounting; TF32 switched off. With a
#          GPU present, a binary that skipped a case for want of a GPU
#          ("[gpu]" in the skip message) fails: it did not see the GPU.
#   bench  dense decodes, median of 5 after a warm-up, with the decode's
#          peak memory: AutoencoderKL at FLUX.1/SD3 width at 1024² and 2048²
#          (bfloat16, float32), FLUX.2 at 1024² and 2048², Wan 2.1 at
#          17x480x832; a tiled decode under a memory budget
#   serve  one decode through vaedecode_server --devices=cuda:0
#
# Results, at most five files (a GPU machine returns at most eight):
#   $OUT/gpu_check.json  every step's status, seconds and figures; written on
#                        every exit, early ones included
#   $OUT/gpu_check.log   this script's output
#   $OUT/tests.tar.gz    the tests' logs and gtest XML
#   $OUT/server.log      the serve step's server
# Exit status: 0 when every step passed, 1 when one failed, 2 when the bundle
# cannot run here at all.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"

# Everything this script prints also goes to the log. Run as a pipeline the
# shell waits for (a `tee` process substitution can still be writing after
# the script exits).
if [ -z "${GPU_CHECK_LOGGING:-}" ]; then
  GPU_CHECK_LOGGING=1 "$0" "$@" 2>&1 | tee "$out/gpu_check.log"
  exit "${PIPESTATUS[0]}"
fi

readonly deadline=$((SECONDS + ${GPU_CHECK_DEADLINE_S:-360}))
tmp=$(mktemp -d)
records="$tmp/steps.tsv"
: > "$records"
mkdir -p "$tmp/tests"
failures=0
have="unknown"
gpu_name=""
gpu_count=0
py=$(command -v python3 || command -v /usr/bin/python3 || true)

# record STEP STATUS SECONDS DETAIL: one entry of the JSON's "steps".
record() {
  local detail=${4//$'\t'/ }
  detail=${detail//$'\n'/; }
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$detail" >> "$records"
  echo "== $1: $2 (${3}s) ${detail:0:300}"
  [ "$2" = failed ] && failures=$((failures + 1))
  return 0
}

# The JSON and the tests' archive, on every exit.
finish() {
  local rc=$?
  trap - EXIT
  if [ -n "$(ls -A "$tmp/tests" 2>/dev/null)" ]; then
    tar -C "$tmp" -czf "$out/tests.tar.gz" tests 2>/dev/null || echo "gpu_check: could not archive the test logs"
  fi
  # Python without the bundle's libraries: they are for the bundled binaries only.
  if [ -n "$py" ]; then
    "$py" - "$records" "$out/gpu_check.json" "$have" "$gpu_name" "$gpu_count" "$rc" <<'PY' || echo "gpu_check: could not write gpu_check.json"
import json, re, sys
records, target, torch_version, gpu, gpu_count, rc = sys.argv[1:]
steps = []
for line in open(records):
    step, status, seconds, detail = line.rstrip("\n").split("\t", 3)
    entry = {"step": step, "status": status, "seconds": int(seconds), "detail": detail}
    if step.startswith("bench/") and detail.startswith("decoded"):
        entry["figures"] = dict(re.findall(r"(\w+)=(\[[^\]]*\]|\{[^}]*\}|\S+)", detail))
    steps.append(entry)
json.dump({"libtorch": torch_version, "gpu": gpu or None, "gpus": int(gpu_count), "exit_status": int(rc),
           "steps": steps}, open(target, "w"), indent=1)
PY
  else
    echo "gpu_check: no python3 to write gpu_check.json; the steps were:"
    cat "$records"
  fi
  rm -rf "$tmp"
  echo "gpu_check: $failures failed step(s), exit status $rc; $out/gpu_check.json"
  exit "$rc"
}
trap finish EXIT

die() {
  echo "gpu_check: $*"
  record setup failed 0 "$*"
  exit 2
}

# Seconds left before the deadline, at most $1.
budget() {
  local left=$((deadline - SECONDS))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# Whether a step needing at least $2 seconds may still start; else it is
# recorded as skipped.
may_start() {
  if [ $((deadline - SECONDS)) -lt "$2" ]; then
    record "$1" skipped 0 "skipped (deadline)"
    return 1
  fi
}

# --- The binaries travel xz-packed (a third of their size; the GPU machine
# takes 64 MiB with the checkout): unpacked into this run's temporary folder
# (the bundle may be read-only), by tar or python3.
root=$here
if [ -f "$here/binaries.tar.xz" ]; then
  root="$tmp/bundle"
  mkdir -p "$root"
  if ! { tar -C "$root" -xJf "$here/binaries.tar.xz" 2> "$tmp/unpack.err" ||
         { [ -n "$py" ] && "$py" -m tarfile -e "$here/binaries.tar.xz" "$root" 2>> "$tmp/unpack.err"; }; }; then
    die "cannot unpack binaries.tar.xz ($(tail -n 1 "$tmp/unpack.err"))"
  fi
fi

# --- LibTorch: this machine's, the bundle's version.
want=$(cat "$here/LIBTORCH_VERSION")
if [ -n "${VAEDECODE_TORCH_LIB:-}" ]; then
  torch_lib=$VAEDECODE_TORCH_LIB
  have=$(cat "$torch_lib/../VERSION" 2>/dev/null || echo unknown)
  nvidia_libs=""
else
  [ -n "$py" ] || die "no python3 here, and VAEDECODE_TORCH_LIB is not set: cannot find LibTorch"
  # stdout only: torch may print warnings on stderr.
  if ! info=$("$py" -c 'import os, torch; print(torch.__version__); print(os.path.dirname(torch.__file__))' \
      2> "$tmp/torch.err"); then
    die "python3 has no torch ($(tail -n 1 "$tmp/torch.err")); install torch==${want%%+*} or set VAEDECODE_TORCH_LIB"
  fi
  have=$(sed -n 1p <<<"$info")
  torch_lib="$(sed -n 2p <<<"$info")/lib"
  site=$(dirname "$(dirname "$torch_lib")")
  # NVIDIA's wheels: nvidia/<name>/lib, and nvidia/cu13/lib for the CUDA 13 toolkit.
  nvidia_libs=$(find "$site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | sort | tr '\n' ':')
fi
if [ "$have" != "$want" ]; then
  die "this bundle was built against LibTorch $want; this machine has $have (from $torch_lib). Use torch==${want%%+*} (+${want#*+}) or rebuild the bundle with that version pinned in tools/libtorch.sh."
fi
[ -f "$torch_lib/libtorch_cpu.so" ] || die "$torch_lib has no libtorch_cpu.so"
# Only the bundled binaries run with the bundle's libraries (run_bundled):
# the machine's own tools (python3, nvidia-smi, tar) keep theirs.
bundle_ld="$root/lib:$torch_lib:${nvidia_libs}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
run_bundled() { LD_LIBRARY_PATH="$bundle_ld" "$@"; }
echo "LibTorch $have from $torch_lib"

if gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null) && [ -n "$gpu" ]; then
  gpu_name=$(head -n 1 <<<"$gpu" | cut -d, -f1)
  gpu_count=$(grep -c . <<<"$gpu")
  record gpu passed 0 "$gpu_count GPU(s): $gpu"
else
  record gpu skipped 0 "no NVIDIA GPU: the GPU steps run on the CPU at small sizes or skip"
fi

# --- Every binary loads: a missing library is named here, not as a crash later.
t0=$SECONDS
versions=$(run_bundled ldd "$root/bin/vaedecode" 2>&1 | grep -o "version \`[A-Z_]*[0-9.]*' not found" | sort -u | tr '\n' ' ')
if [[ "$versions" == *GLIBCXX* || "$versions" == *CXXABI* ]]; then
  echo "this machine's libstdc++ is older than the bundle's: using lib/compat"
  bundle_ld="$root/lib/compat:$bundle_ld"
  versions=$(run_bundled ldd "$root/bin/vaedecode" 2>&1 | grep -o "version \`[A-Z_]*[0-9.]*' not found" | sort -u | tr '\n' ' ')
fi
[ -z "$versions" ] || die "the bundle needs a newer C library than this machine's ($versions): glibc 2.36 or later"
missing=""
for b in "$root"/bin/* "$root"/server/* "$root"/worker/* "$root"/tests/*; do
  m=$(run_bundled ldd "$b" 2>&1 | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
  [ -z "$m" ] || missing+="$(basename "$b"): $m; "
done
if [ -n "$missing" ]; then
  record load failed $((SECONDS - t0)) "missing libraries: $missing"
  exit 2
fi
record load passed $((SECONDS - t0)) "$(ls "$root"/bin "$root"/server "$root"/worker "$root"/tests | grep -v : | tr '\n' ' ')"

# --- The GPU tests (they skip their GPU cases without a GPU).
# gpu_skips XML: how many cases skipped for want of a GPU ("[gpu]" in the message).
gpu_skips() {
  "$py" - "$1" <<'PY' 2>/dev/null || echo 0
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
print(sum(1 for s in root.iter("skipped") if "[gpu]" in (s.get("message", "") + (s.text or ""))))
PY
}
for t in "$root"/tests/*; do
  name=$(basename "$t")
  may_start "tests/$name" 20 || continue
  t0=$SECONDS
  log="$tmp/tests/$name.log"
  xml="$tmp/tests/$name.xml"
  if TEST_SRCDIR="$here" TEST_TMPDIR="$tmp" run_bundled timeout "$(budget 240)" "$t" --gtest_output="xml:$xml" \
      > "$log" 2>&1; then
    status=passed
  else
    status=failed
  fi
  summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$log" | tr '\n' ' ')
  if [ -n "$gpu_name" ] && [ -f "$xml" ] && [ "$(gpu_skips "$xml")" -gt 0 ]; then
    status=failed
    summary="$(gpu_skips "$xml") GPU case(s) skipped for want of a GPU although this machine has $gpu_count: the binary does not see them (no CUDA backend linked?); $summary"
  fi
  [ -n "$gpu_name" ] || summary="(no GPU) $summary"
  record "tests/$name" "$status" $((SECONDS - t0)) "$summary"
  [ "$status" = passed ] || tail -n 40 "$log"
done

# --- Dense decodes: median of 5 after one warm-up, peak memory of the decode.
cli="$root/bin/vaedecode"
bench() {  # NAME TIMEOUT ARGS...
  local name=$1 limit=$2
  shift 2
  may_start "bench/$name" 15 || return 0
  local t0=$SECONDS line
  if line=$(run_bundled timeout "$(budget "$limit")" "$cli" decode --out "$tmp/bench.npy" "$@" 2>&1 | tail -n 1) \
      && [[ "$line" == decoded* ]]; then
    record "bench/$name" passed $((SECONDS - t0)) "$line"
  else
    record "bench/$name" failed $((SECONDS - t0)) "$line"
  fi
}
models="$here/models"
if [ -n "$gpu_name" ]; then
  dev=(--device cuda:0 --seeded-weights 1 --warmup 1 --repeat 5)
  for dtype in bfloat16 float32; do
    bench "flux1_1024_$dtype" 60 "${dev[@]}" --model "$models/flux1" --dtype $dtype --latent-shape 1,16,128,128
    bench "flux1_2048_$dtype" 90 "${dev[@]}" --model "$models/flux1" --dtype $dtype --latent-shape 1,16,256,256
  done
  bench flux2_1024_bfloat16 60 "${dev[@]}" --model "$models/flux2" --dtype bfloat16 --latent-shape 1,32,128,128
  bench flux2_2048_bfloat16 90 "${dev[@]}" --model "$models/flux2" --dtype bfloat16 --latent-shape 1,32,256,256
  bench wan21_17x480x832_bfloat16 120 "${dev[@]}" --model "$models/wan21" --dtype bfloat16 \
    --latent-shape 1,16,5,60,104
  bench flux1_2048_bfloat16_tiled_2GiB 90 "${dev[@]}" --model "$models/flux1" --dtype bfloat16 \
    --latent-shape 1,16,256,256 --mode tiled --budget-mib 2048
else
  # The same commands on the CPU at small sizes: the steps' plumbing runs.
  dev=(--device cpu --seeded-weights 1 --warmup 1 --repeat 2)
  bench flux1_128_float32_cpu 120 "${dev[@]}" --model "$models/flux1" --latent-shape 1,16,16,16
  # bf16 at 32² only: a CPU without native bf16 decodes it ~45x slower than float32 (32²: 10.9 s
  # against 0.24 s on a 2-core EPYC without AVX-512), and this step only checks the plumbing.
  bench flux2_32_bfloat16_cpu 120 "${dev[@]}" --model "$models/flux2" --dtype bfloat16 --latent-shape 1,32,4,4
  bench wan21_5x64x64_float32_cpu 120 "${dev[@]}" --model "$models/wan21" --latent-shape 1,16,2,8,8
  bench flux1_320_float32_cpu_tiled 120 --device cpu --seeded-weights 1 --model "$models/flux1" \
    --latent-shape 1,16,40,40 --mode tiled --budget-mib 256
fi

# --- One decode through the server.
if may_start serve 30; then
  t0=$SECONDS
  if [ -n "$gpu_name" ]; then
    serve_flags=(--devices=cuda:0 --dtype=bfloat16)
    shape=1,4,128,128
  else
    serve_flags=(--devices=cpu:1)
    shape=1,4,16,16
  fi
  ready="$tmp/server.ready"
  # Not through run_bundled: $! must be the server's pid, not a subshell's
  # (SIGTERM to a subshell would orphan the server).
  LD_LIBRARY_PATH="$bundle_ld" "$root/server/vaedecode_server" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --group_size=1 \
    "${serve_flags[@]}" --ready_file="$ready" > "$out/server.log" 2>&1 &
  server=$!
  serve_deadline=$((SECONDS + $(budget 150) - 10))
  while [ ! -s "$ready" ] && [ $SECONDS -lt $serve_deadline ] && kill -0 "$server" 2>/dev/null; do sleep 0.2; done
  port=$(sed -n 's/^grpc_port=//p' "$ready" 2>/dev/null)
  served=""
  if [ -n "$port" ]; then
    # SERVING once a worker group has loaded (and calibrated) its models.
    while [ $SECONDS -lt $serve_deadline ]; do
      run_bundled "$root/bin/vaedecode_health_probe" --addr="127.0.0.1:$port" --service=vaedecode.v1.VaeDecoder \
        > /dev/null 2>&1 && break
      sleep 0.5
    done
    served=$(run_bundled timeout "$(budget 60)" "$root/bin/vaedecode_client" --server="127.0.0.1:$port" \
      --latent_shape=$shape --out="$tmp/served.png" 2>&1 | tail -n 3 | tr '\n' ' ')
  fi
  # SIGTERM drains; a server still up 20 s later is killed (and the step fails).
  kill -TERM "$server" 2> /dev/null
  for _ in $(seq 100); do kill -0 "$server" 2> /dev/null || break; sleep 0.2; done
  kill -KILL "$server" 2> /dev/null
  if wait "$server" && [ -n "$port" ] && [ -s "$tmp/served.png" ]; then
    record serve passed $((SECONDS - t0)) "${serve_flags[*]}: $served"
  else
    record serve failed $((SECONDS - t0)) "${serve_flags[*]}: ${served:-no port} $(tail -n 5 "$out/server.log" | tr '\n' ' ')"
  fi
fi

[ "$failures" -eq 0 ]
