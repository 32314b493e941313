#!/usr/bin/env bash
# Checks the GPU bundle's check itself, on the CPU that built it (tools/test.sh
# runs it after the bundle's own CPU run), for what would otherwise show only
# on a GPU machine, where every minute counts:
#   1. its results are at most five files (a GPU machine returns eight) and
#      the JSON holds every step;
#   2. an early exit (a LibTorch of another version) still writes the JSON;
#   3. with a GPU present (a stand-in nvidia-smi), a test binary that skips
#      its GPU cases for want of one fails, and steps past the deadline are
#      "skipped (deadline)" instead of running on.
#
#   tools/gpu_check_test.sh BUNDLE_DIR CPU_RUN_OUT   # CPU_RUN_OUT: $OUT of the normal CPU run
set -euo pipefail
bundle=$(cd "$1" && pwd)
cpu_out=$2
torch_lib="$(tools/libtorch.sh --print)/lib"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "gpu_check_test: FAILED: $*" >&2; failed=1; }
json() { /usr/bin/python3 -c "import json, sys; d = json.load(open(sys.argv[1])); $2" "$1"; }

# 1. The normal run's results.
files=$(find "$cpu_out" -type f | wc -l)
[ "$files" -le 5 ] || fail "the CPU run left $files files in $cpu_out (at most 5 come back from a GPU machine)"
for f in gpu_check.json gpu_check.log tests.tar.gz server.log; do
  [ -s "$cpu_out/$f" ] || fail "the CPU run wrote no $f"
done
json "$cpu_out/gpu_check.json" 'assert d["exit_status"] == 0 and len(d["steps"]) >= 8, d' \
  || fail "the CPU run's JSON is not a passed run with every step"
# The serve step's server drained on SIGTERM and exited 0 (not orphaned).
tail -n 1 "$cpu_out/server.log" | grep 'event=exit code=0' > /dev/null || fail "the serve step's server did not exit cleanly"
tar -tzf "$cpu_out/tests.tar.gz" | grep 'gpu_decode_test.xml' > /dev/null || fail "tests.tar.gz lacks the tests' XML"

# 2. An early exit writes the JSON.
mkdir -p "$work/torch/lib"
ln -s "$torch_lib"/* "$work/torch/lib/"
echo "0.0.0+other" > "$work/torch/VERSION"
rc=0
OUT="$work/early" VAEDECODE_TORCH_LIB="$work/torch/lib" "$bundle/gpu_check.sh" > /dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "another LibTorch version: exit status $rc, want 2"
json "$work/early/gpu_check.json" \
  'assert d["exit_status"] == 2 and d["steps"][-1]["step"] == "setup" and "0.0.0+other" in d["steps"][-1]["detail"], d' \
  || fail "an early exit wrote no JSON naming why"

# 3. A GPU that the binaries do not see, and a deadline.
mkdir -p "$work/bin"
cat > "$work/bin/nvidia-smi" <<'SMI'
#!/bin/sh
echo "NVIDIA H200, 143771 MiB, 580.95.05"
echo "NVIDIA H200, 143771 MiB, 580.95.05"
SMI
chmod +x "$work/bin/nvidia-smi"
start=$SECONDS
rc=0
PATH="$work/bin:$PATH" GPU_CHECK_DEADLINE_S=30 OUT="$work/gpu" VAEDECODE_TORCH_LIB="$torch_lib" \
  "$bundle/gpu_check.sh" > /dev/null 2>&1 || rc=$?
took=$((SECONDS - start))
[ "$rc" -eq 1 ] || fail "a GPU the binaries cannot see: exit status $rc, want 1"
json "$work/gpu/gpu_check.json" '
steps = {s["step"]: s for s in d["steps"]}
assert d["gpus"] == 2 and "2 GPU(s)" in steps["gpu"]["detail"], steps["gpu"]
# The binaries with GPU cases (device_memory_test has none in this build).
for name in ("gpu_decode_test", "nccl_communicator_test", "compute_device_test"):
    s = steps["tests/" + name]
    assert s["status"] == "failed" and "skipped for want of a GPU" in s["detail"], s
# The serve step needs 30 s: never left under a 30 s deadline.
assert steps["serve"]["status"] == "skipped" and steps["serve"]["detail"] == "skipped (deadline)", steps["serve"]
' || fail "with a GPU present, binaries that skipped their GPU cases did not fail, or nothing was skipped at the deadline"
# The deadline bounds the whole check (steps time out at it).
[ "$took" -le 60 ] || fail "the check took ${took}s under a 30 s deadline"

if [ "$failed" -ne 0 ]; then exit 1; fi
echo "gpu_check_test: passed (5-file results, JSON on early exit, GPU cases skipped under a GPU fail, deadline)"
