#!/usr/bin/env bash
# Builds libFuzzer targets (clang, libFuzzer + ASan + UBSan; see the `fuzz`
# config in .bazelrc) and runs each for N seconds (default 60) on a scratch
# copy of its checked-in corpus, so the corpus in the repository is never
# modified. tools/test.sh runs every target for a short while.
#
#   tools/fuzz.sh [seconds] [target...]      (default: every target)
#
# Targets: the parsers a file or a client reaches.
#   safetensors    formats/safetensors.h: model weights and latents
#   npy            formats/npy.h: latents for the CLI and the client
#   image_bytes    PNG / JPEG / MP4 bytes of an Encode request (formats/image_bytes.h)
#   remote_decode  an HTTP remote_decode POST: query, body, packed unpack,
#                  validation and admission (server/remote_decode_fuzzer.cc)
#   oip_infer      an OIP ModelInfer request: its protobuf, the translation,
#                  validation and admission (server/oip_infer_fuzzer.cc)
#   oip_rest       an OIP HTTP/REST infer request: its JSON header and binary
#                  tensors, the same path, and the JSON or binary reply
#                  (server/oip_rest_fuzzer.cc)
#   session_request a DecodeSession's open and chunk: their protobufs, the
#                  session checks and the chunk's Decode validation and
#                  admission (server/session_request_fuzzer.cc)
#
# Environment:
#   FUZZ_OUTPUT_BASE  Bazel output base for the clang build (default
#                     /tmp/vaedecode_bazel_fuzz). Kept apart from the normal
#                     one because switching CC re-configures the C++ toolchain
#                     and would invalidate every gcc-built action there.
#   FUZZ_WORKDIR      where the corpus copies and crash artifacts go (default:
#                     a fresh mktemp -d, printed at the end).
#   FUZZ_ARGS         extra libFuzzer flags, e.g. "-fork=2".
#
# On a crash the fuzzer stops and the script exits non-zero; the input is in
# $FUZZ_WORKDIR/<target>/artifacts/. Fix the bug, then add the input to the
# target's corpus as crash-<what> so its corpus test (//formats:
# safetensors_corpus_test, npy_corpus_test, image_bytes_corpus_test,
# //server:remote_decode_corpus_test,
# //server:oip_infer_corpus_test, oip_rest_corpus_test) replays it in every
# CI run.
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: $0 [seconds] [target...]" >&2
  exit 2
fi
shift || true

# name -> "label corpus dict max_len" (dict "-": none)
declare -A targets=(
  [safetensors]="//formats:safetensors_fuzzer formats/testdata/safetensors_corpus formats/testdata/safetensors.dict 16384"
  [npy]="//formats:npy_fuzzer formats/testdata/npy - 4096"
  [image_bytes]="//formats:image_bytes_fuzzer formats/testdata/image_corpus - 4096"
  [remote_decode]="//server:remote_decode_fuzzer server/testdata/remote_decode_corpus server/testdata/remote_decode.dict 4096"
  [oip_infer]="//server:oip_infer_fuzzer server/testdata/oip_infer_corpus - 4096"
  [oip_rest]="//server:oip_rest_fuzzer server/testdata/oip_rest_corpus server/testdata/oip_rest.dict 4096"
  [session_request]="//server:session_request_fuzzer server/testdata/session_request_corpus - 4096"
)
names=("$@")
if [ ${#names[@]} -eq 0 ]; then names=(safetensors npy image_bytes remote_decode oip_infer oip_rest session_request); fi
labels=()
for name in "${names[@]}"; do
  [ -n "${targets[$name]:-}" ] || { echo "$0: unknown target $name (${!targets[*]})" >&2; exit 2; }
  read -r label _ <<<"${targets[$name]}"
  labels+=("$label")
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
output_base="${FUZZ_OUTPUT_BASE:-/tmp/vaedecode_bazel_fuzz}"
# The clang server is only needed for this build: let it exit when idle.
bazel=(bazel "--output_base=$output_base" --max_idle_secs=300)
"${bazel[@]}" build --config=fuzz --symlink_prefix=/ "${labels[@]}"
bin="$("${bazel[@]}" info --config=fuzz bazel-bin 2>/dev/null)"

work="${FUZZ_WORKDIR:-$(mktemp -d /tmp/vaedecode_fuzz.XXXXXX)}"
status=0
for name in "${names[@]}"; do
  read -r label corpus dict max_len <<<"${targets[$name]}"
  fuzzer="$bin/$(echo "${label#//}" | tr ':' '/')"
  dir="$work/$name"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -n "$corpus"/* "$dir/corpus/" 2>/dev/null || true
  seeds=$(find "$dir/corpus" -type f | wc -l)
  dict_flag=()
  if [ "$dict" != "-" ]; then dict_flag=("-dict=$dict"); fi
  echo "fuzzing $name for ${seconds}s: $seeds inputs in $dir/corpus" >&2
  run=0
  # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags.
  "$fuzzer" "$dir/corpus" "${dict_flag[@]}" \
    -max_total_time="$seconds" \
    -max_len="$max_len" \
    -timeout=10 \
    -rss_limit_mb=2048 \
    -artifact_prefix="$dir/artifacts/" \
    -print_final_stats=1 \
    ${FUZZ_ARGS:-} 2>"$dir/fuzz.log" || run=$?
  grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)" "$dir/fuzz.log" >&2 || true
  echo "$name: corpus $seeds -> $(find "$dir/corpus" -type f | wc -l) inputs; log: $dir/fuzz.log" >&2
  if [ "$run" -ne 0 ]; then
    status=$run
    tail -n 40 "$dir/fuzz.log" >&2
    echo "$name: the fuzzer failed; artifacts (crashes, leaks, timeouts, OOMs):" >&2
    ls -l "$dir/artifacts" >&2
  fi
done
exit "$status"
