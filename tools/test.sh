#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test and a short run
# of every fuzzer (tools/fuzz.sh). Then the GPU
# build: the service, worker, CLI and GPU tests are built with --config=gpu
# (LibTorch's CUDA backend, NCCL, /usr/local/cuda) into the bundle a bare GPU
# machine runs (tools/gpu_bundle.sh), and the bundle's check runs here with
# its GPU steps replaced by small CPU decodes, so neither can rot. Then the
# container images, with podman, from those same builds (tests/deploy/
# images_test.sh: the CPU image end to end, the GPU image's libraries, the GPU
# bundle's check in a container that is only Debian and Python's torch).
# Checks outside Bazel record their verdicts in out/test_steps.tsv, which
# .ci/run counts with the Bazel tests (tools/count_tests.py --steps).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# The pinned venv of the real third-party clients (diffusers, tritonclient)
# that tests/protocols run; .bazelrc passes VAEDECODE_PYTHON to the tests.
VAEDECODE_PYTHON=$(tools/python_env.sh)
export VAEDECODE_PYTHON
# The pinned Kubernetes schema validator that tests/deploy:k8s_schema_test runs.
VAEDECODE_K8S_VALIDATE=$(tools/k8s_validate_env.sh)
export VAEDECODE_K8S_VALIDATE
mkdir -p out
VAEDECODE_STEPS=$PWD/out/test_steps.tsv
export VAEDECODE_STEPS
: >"$VAEDECODE_STEPS"
# Bazel names one convenience symlink after the checkout's folder
# (bazel-<folder>, pointing into the execroot); `//...` would descend into
# it on a second run. .bazelignore lists the usual names; this covers any
# folder name (the build recreates the link).
link="bazel-$(basename "$PWD")"
if [ -L "$link" ]; then rm -f "$link"; fi
status=0
# The C++ sources in .clang-format's style (tools/format.sh fixes them).
if tools/format.sh --check; then
  printf 'style/clang_format\tpassed\t0\t\n' >>"$VAEDECODE_STEPS"
else
  printf 'style/clang_format\tfailed\t0\t\n' >>"$VAEDECODE_STEPS"
  status=1
fi
bazel test //... "$@" || status=$?
# The CPU image from the binaries just built, before the --config=gpu build
# below replaces them in bazel-bin (both configurations share one folder).
tests/deploy/images_test.sh cpu "$(bazel info bazel-bin 2>/dev/null)" || status=1
# A short libFuzzer run (clang, ASan + UBSan) of every parser a file or a
# client reaches, from the committed corpora; the corpus tests above replay
# them with gcc. VAEDECODE_FUZZ_SECONDS=0 skips it. After the CPU image:
# --config=fuzz replaces what bazel-bin holds.
fuzz_seconds=${VAEDECODE_FUZZ_SECONDS:-20}
if [ "$fuzz_seconds" -gt 0 ]; then
  t0=$SECONDS
  if tools/fuzz.sh "$fuzz_seconds"; then
    printf 'fuzz/all_parsers\tpassed\t%s\t\n' $((SECONDS - t0)) >>"$VAEDECODE_STEPS"
  else
    echo "test.sh: a fuzzer failed (tools/fuzz.sh)" >&2
    printf 'fuzz/all_parsers\tfailed\t%s\t\n' $((SECONDS - t0)) >>"$VAEDECODE_STEPS"
    status=1
  fi
fi
if [ -f /usr/local/cuda/include/nccl.h ]; then
  if tools/gpu_bundle.sh out/gpu_bundle; then
    # The machine's own LibTorch stands in for a GPU machine's torch.
    rm -rf out/gpu_check
    t0=$SECONDS
    if OUT=out/gpu_check VAEDECODE_TORCH_LIB="$(tools/libtorch.sh --print)/lib" out/gpu_bundle/gpu_check.sh; then
      printf 'gpu_bundle/gpu_check_on_cpu\tpassed\t%s\t\n' $((SECONDS - t0)) >>"$VAEDECODE_STEPS"
    else
      echo "test.sh: the GPU bundle's check failed on the CPU (out/gpu_check/gpu_check.log)" >&2
      printf 'gpu_bundle/gpu_check_on_cpu\tfailed\t%s\t\n' $((SECONDS - t0)) >>"$VAEDECODE_STEPS"
      status=1
    fi
    # The check's own behaviour where a GPU would be (results, early exits, deadline).
    t0=$SECONDS
    if tools/gpu_check_test.sh out/gpu_bundle out/gpu_check; then
      printf 'gpu_bundle/gpu_check_test\tpassed\t%s\t\n' $((SECONDS - t0)) >>"$VAEDECODE_STEPS"
    else
      printf 'gpu_bundle/gpu_check_test\tfailed\t%s\t\n' $((SECONDS - t0)) >>"$VAEDECODE_STEPS"
      status=1
    fi
  else
    echo "test.sh: the --config=gpu build or the GPU bundle failed" >&2
    printf 'gpu_bundle/build\tfailed\t0\t\n' >>"$VAEDECODE_STEPS"
    status=1
  fi
  # The GPU image needs only the --config=gpu build, and the bare-machine
  # rehearsal a bundle, even one over its size limit: each fails on its own.
  tests/deploy/images_test.sh gpu "$(bazel info --config=gpu bazel-bin 2>/dev/null)" || status=1
  if [ -x out/gpu_bundle/gpu_check.sh ]; then
    tests/deploy/images_test.sh bare out/gpu_bundle || status=1
  else
    printf 'images/bare_gpu_machine_gpu_check\tfailed\t0\tno bundle\n' >>"$VAEDECODE_STEPS"
    status=1
  fi
else
  echo "test.sh: /usr/local/cuda has no NCCL; skipped the --config=gpu build and the GPU bundle" >&2
fi
exit $status
