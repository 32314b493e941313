#!/usr/bin/env bash
# Builds the safetensors fuzzer (clang, libFuzzer + ASan + UBSan; see the
# `fuzz` config in .bazelrc) and runs it for N seconds (default 60) on a
# scratch copy of formats/testdata/safetensors_corpus, so the checked-in
# corpus is never modified.
#
#   tools/fuzz_safetensors.sh [seconds]
#
# Environment:
#   FUZZ_OUTPUT_BASE  Bazel output base for the clang build (default
#                     /tmp/vaedecode_bazel_fuzz). Kept apart from the normal
#                     one because switching CC re-configures the C++ toolchain
#                     and would invalidate every gcc-built action there.
#   FUZZ_WORKDIR      where the corpus copy and crash artifacts go (default:
#                     a fresh mktemp -d, printed at the end).
#   FUZZ_ARGS         extra libFuzzer flags, e.g. "-fork=2".
#
# On a crash the fuzzer stops and exits non-zero; the input is in
# $FUZZ_WORKDIR/artifacts/. Fix the bug, then add the input to the corpus as
# formats/testdata/safetensors_corpus/crash-<what>.safetensors so
# //formats:safetensors_corpus_test replays it in every CI run.
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: $0 [seconds]" >&2
  exit 2
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
output_base="${FUZZ_OUTPUT_BASE:-/tmp/vaedecode_bazel_fuzz}"
# The clang server is only needed for this build: let it exit when idle.
bazel=(bazel "--output_base=$output_base" --max_idle_secs=300)

"${bazel[@]}" build --config=fuzz --symlink_prefix=/ //formats:safetensors_fuzzer
fuzzer="$("${bazel[@]}" info --config=fuzz bazel-bin 2>/dev/null)/formats/safetensors_fuzzer"

work="${FUZZ_WORKDIR:-$(mktemp -d /tmp/fuzz_safetensors.XXXXXX)}"
mkdir -p "$work/corpus" "$work/artifacts"
cp -n formats/testdata/safetensors_corpus/* "$work/corpus/" 2>/dev/null || true
seeds=$(find "$work/corpus" -type f | wc -l)

echo "fuzzing for ${seconds}s: $fuzzer on $seeds inputs in $work/corpus" >&2
status=0
# shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags.
"$fuzzer" "$work/corpus" \
  -dict=formats/testdata/safetensors.dict \
  -max_total_time="$seconds" \
  -max_len=16384 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -artifact_prefix="$work/artifacts/" \
  -print_final_stats=1 \
  ${FUZZ_ARGS:-} 2>"$work/fuzz.log" || status=$?

tail -n 25 "$work/fuzz.log" >&2
echo "corpus: $seeds -> $(find "$work/corpus" -type f | wc -l) inputs; log: $work/fuzz.log" >&2
if ls "$work/artifacts"/* >/dev/null 2>&1; then
  echo "artifacts (crashes, leaks, timeouts, OOMs):" >&2
  ls -l "$work/artifacts" >&2
fi
exit "$status"
