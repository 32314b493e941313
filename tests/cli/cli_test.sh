#!/usr/bin/env bash
# The vaedecode binary end to end: every AutoencoderKL fixture through
# `decode` (dense, exact over 3 local ranks, raw latent space) and every
# encode case of the families that encode through `encode` (moments dense,
# a seeded sample exact over 3 ranks, raw over 2), compared with diffusers'
# output by the fixtures' own compare.py; MiniMax-H3's audio VAE to its
# waveform and to WAVs; encoding a PNG; PNG naming; one-line
# errors and non-zero exits for malformed input; a rank killed mid-decode
# fails the whole group promptly and leaves no process behind.
set -uo pipefail

BIN="$TEST_SRCDIR/vaedecode/cli/vaedecode"
FIX="$TEST_SRCDIR/diffusers_fixtures"
[ -d "$FIX" ] || FIX="$TEST_SRCDIR/vaedecode/external/diffusers_fixtures"
OUT="$TEST_TMPDIR/out"
mkdir -p "$OUT"
PY=/usr/bin/python3
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

compare() {  # expected actual
  local verdict
  verdict=$("$PY" "$FIX/compare.py" "$1" "$2" --atol 1e-4 --rtol 0 | tail -n 1)
  case "$verdict" in *OK) echo "  ok: $verdict" ;; *) fail "$2 vs $1: $verdict" ;; esac
}

expect_error() {  # expected-code substring args...
  local code=$1 want=$2
  shift 2
  local err rc
  err=$("$BIN" "$@" 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -eq "$code" ] || fail "exit $rc (want $code) for: $*"
  echo "$err" | grep -- "$want" > /dev/null || fail "error for '$*' does not mention '$want': $err"
  [ "$code" -eq 2 ] || [ "$(echo "$err" | wc -l)" -eq 1 ] || fail "error for '$*' is not one line: $err"
}

# Cases of every AutoencoderKL fixture: folder case latent expected pipeline_latent
cases=$("$PY" - "$FIX/index.json" <<'PY'
import json, sys
for f in json.load(open(sys.argv[1]))["fixtures"]:
    if f["diffusers_class"] != "AutoencoderKL":
        continue
    for c in f["cases"]:
        print(f["folder"], c["case"], c["latent_file"], c["expected_file"], c.get("pipeline_latent_file") or "-")
PY
)
[ -n "$cases" ] || fail "no AutoencoderKL fixture cases found"

while read -r folder name latent expected pipeline; do
  echo "== $folder/$name"
  "$BIN" decode --model "$FIX/$folder" --latent "$FIX/$latent" --out "$OUT/${folder}_${name}.safetensors" \
    || fail "dense decode of $folder/$name"
  compare "$FIX/$expected" "$OUT/${folder}_${name}.safetensors"
  "$BIN" decode --model "$FIX/$folder" --latent "$FIX/$latent" --out "$OUT/${folder}_${name}_exact.npy" \
    --mode exact --ranks 3 --timeout-s 60 | grep "mode=exact ranks=3" > /dev/null || fail "exact decode of $folder/$name"
  compare "$FIX/$expected" "$OUT/${folder}_${name}_exact.npy"
  if [ "$pipeline" != "-" ]; then
    "$BIN" decode --model "$FIX/$folder" --latent "$FIX/$pipeline" --latent-space raw \
      --out "$OUT/${folder}_${name}_raw.npy" || fail "raw decode of $folder/$name"
    compare "$FIX/$expected" "$OUT/${folder}_${name}_raw.npy"
  fi
done <<< "$cases"

# Encode cases of every family that encodes: folder case image mean logvar sample seed pipeline_encoded uses_sample ranks
encode_cases=$("$PY" - "$FIX/index.json" <<'PY'
import json, sys
for f in json.load(open(sys.argv[1]))["fixtures"]:
    if f["diffusers_class"] not in ("AutoencoderKL", "AutoencoderKLFlux2", "AutoencoderKLWan",
                                    "AutoencoderKLQwenImage", "AutoencoderKLQwenImage21", "AutoencoderKLHunyuanImage",
                                    "AutoencoderKLHunyuanVideo15", "AutoencoderKLHunyuanVideo",
                                    "AutoencoderKLLTX2Video", "AutoencoderKLMiniMaxH3", "AutoencoderKLLTX2Audio",
                                    "AutoencoderKLMiniMaxH3Audio"):
        continue
    uses_sample = (f.get("pipeline_encode") or {}).get("posterior", "").startswith("sample")
    for c in f.get("encode_cases", []):
        ranks = min(3, c["latent_shape"][-2])  # every band keeps a latent row (1 rank: dense)
        if f["diffusers_class"] in ("AutoencoderKLLTX2Audio", "AutoencoderKLMiniMaxH3Audio"):
            ranks = 1  # audio encodes densely on one process
        print(f["folder"], c["case"], c["image_file"], c["mean_file"], c["logvar_file"], c["sample_file"],
              c["sample_seed"], c.get("pipeline_encoded_file") or "-", "sample" if uses_sample else "mean", ranks)
PY
)
[ -n "$encode_cases" ] || fail "no encode cases found"

compare_tensor() {  # expected name actual [actual-name]
  local verdict
  verdict=$("$PY" "$FIX/compare.py" "$1" "$3" --tensor "$2" --actual-tensor "${4:-$2}" --atol 1e-4 --rtol 0 | tail -n 1)
  case "$verdict" in *OK) echo "  ok: $verdict" ;; *) fail "$3 vs $1 ($2): $verdict" ;; esac
}

while read -r folder name image mean logvar sample seed encoded posterior ranks; do
  echo "== encode $folder/$name"
  "$BIN" encode --model "$FIX/$folder" --image "$FIX/$image" --out "$OUT/enc_${folder}_${name}.safetensors" \
    --posterior moments >/dev/null || fail "dense encode of $folder/$name"
  compare_tensor "$FIX/$mean" mean "$OUT/enc_${folder}_${name}.safetensors"
  # MiniMax-H3 audio's posterior is a log standard deviation: golden_encode_test checks its log-variance.
  [ "$logvar" = None ] || compare_tensor "$FIX/$logvar" logvar "$OUT/enc_${folder}_${name}.safetensors"
  "$BIN" encode --model "$FIX/$folder" --image "$FIX/$image" --out "$OUT/enc_${folder}_${name}_exact.safetensors" \
    --posterior sample --seed "$seed" --mode exact --ranks "$ranks" --timeout-s 60 \
    | grep "mode=$([ "$ranks" -gt 1 ] && echo exact || echo dense) ranks=$ranks" > /dev/null \
    || fail "exact encode of $folder/$name"
  compare_tensor "$FIX/$sample" sample "$OUT/enc_${folder}_${name}_exact.safetensors" latent
  if [ "$encoded" != "-" ]; then
    "$BIN" encode --model "$FIX/$folder" --image "$FIX/$image" --out "$OUT/enc_${folder}_${name}_raw.safetensors" \
      --posterior "$posterior" --seed "$seed" --latent-space raw --mode exact --ranks 2 >/dev/null \
      || fail "raw encode of $folder/$name"
    compare_tensor "$FIX/$encoded" latent "$OUT/enc_${folder}_${name}_raw.safetensors"
  fi
done <<< "$encode_cases"

echo "== encode from a PNG: the pixels as diffusers preprocesses them (p / 255 * 2 - 1)"
"$BIN" decode --model "$FIX/sd_kl" --latent "$FIX/sd_kl/latent.safetensors" --out "$OUT/to_encode.png" >/dev/null \
  || fail "png decode for the encode"
"$BIN" encode --model "$FIX/sd_kl" --image "$OUT/to_encode.png" --out "$OUT/from_png.safetensors" >/dev/null \
  || fail "encode of a png"
"$PY" - "$OUT/to_encode.png" "$OUT/from_png.safetensors" <<'PY' || fail "the PNG's encode input shape"
import json, struct, sys, zlib
w, h = struct.unpack(">II", open(sys.argv[1], "rb").read()[16:24])
raw = open(sys.argv[2], "rb").read()
header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert header["latent"]["shape"] == [1, 4, h // 4, w // 4], (header, w, h)
PY
echo "== a PNG encodes as one frame of a video model"
"$BIN" encode --model "$FIX/wan21" --image "$OUT/to_encode.png" --out "$OUT/wan_from_png.safetensors" >/dev/null \
  || fail "wan encode of a png"
"$PY" - "$OUT/to_encode.png" "$OUT/wan_from_png.safetensors" <<'PY' || fail "the PNG's one-frame encode shape"
import json, struct, sys
w, h = struct.unpack(">II", open(sys.argv[1], "rb").read()[16:24])
raw = open(sys.argv[2], "rb").read()
header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert header["latent"]["shape"] == [1, 16, 1, h // 8, w // 8], (header, w, h)
PY
"$PY" -c "import numpy as np; np.save('$OUT/clip6.npy', np.zeros((1, 3, 6, 24, 40), np.float32))"
expect_error 1 "1 + 4·k frames" encode --model "$FIX/wan21" --image "$OUT/clip6.npy" --out "$OUT/x.safetensors"
expect_error 1 "1 + 8·k frames" encode --model "$FIX/ltx2_full" --image "$OUT/clip6.npy" --out "$OUT/x.safetensors"
expect_error 1 "encoder" encode --model "$FIX/ltx2" --image "$FIX/ltx2_full/image.safetensors" \
  --out "$OUT/x.safetensors"
expect_error 1 "multiples of 16" encode --model "$FIX/wan22" --image "$FIX/wan21/image.safetensors" \
  --out "$OUT/x.safetensors"
expect_error 1 "want .png" encode --model "$FIX/sd_kl" --image "$FIX/sd_kl/config.json" --out "$OUT/x.safetensors"
cp "$FIX/sd_kl/config.json" "$OUT/fake.png"
expect_error 1 "neither PNG, JPEG nor MP4" encode --model "$FIX/sd_kl" --image "$OUT/fake.png" --out "$OUT/x.safetensors"
expect_error 1 "AutoencoderKL encodes 3" encode --model "$FIX/sd_kl" --image "$FIX/sd_kl/latent.safetensors" \
  --out "$OUT/x.safetensors"
expect_error 1 "cannot encode" encode --model "$FIX/ltx2" --image "$FIX/sd_kl/image.safetensors" --out "$OUT/x.safetensors"
expect_error 1 "moments" encode --model "$FIX/sd_kl" --image "$FIX/sd_kl/image.safetensors" --out "$OUT/x.npy" \
  --posterior moments

echo "== png naming"
"$BIN" decode --model "$FIX/sd_kl" --latent "$FIX/sd_kl/latent_b2.safetensors" --out "$OUT/b2.png" >/dev/null \
  || fail "png decode"
[ -s "$OUT/b2_0.png" ] && [ -s "$OUT/b2_1.png" ] && [ ! -e "$OUT/b2.png" ] || fail "batch 2 did not write b2_0.png and b2_1.png"
"$BIN" decode --model "$FIX/sd_kl" --latent "$FIX/sd_kl/latent.safetensors" --out "$OUT/one.png" >/dev/null \
  && [ -s "$OUT/one.png" ] || fail "batch 1 did not write one.png"

echo "== the service's other outputs and options: JPEG, MP4, scaling overrides, decode noise"
"$BIN" decode --model "$FIX/sd_kl" --latent "$FIX/sd_kl/latent.safetensors" --out "$OUT/one.jpg" --jpeg-quality 90 \
  >/dev/null || fail "jpeg decode"
[ "$(head -c 2 "$OUT/one.jpg" | od -An -tx1 | tr -d ' \n')" = "ffd8" ] || fail "one.jpg is not a JPEG"
# PNG's zlib level (a request option added as one row of rpc/request_options):
# 0 stores, 9 deflates hardest; a level outside 0..9 is refused by name.
for level in 0 9; do
  "$BIN" decode --model "$FIX/sd_kl" --latent "$FIX/sd_kl/latent.safetensors" --out "$OUT/level$level.png" \
    --png-compression $level >/dev/null || fail "png decode at level $level"
done
[ "$(stat -c %s "$OUT/level0.png")" -gt "$(stat -c %s "$OUT/level9.png")" ] \
  || fail "--png-compression 0 did not write a larger PNG than 9"
expect_error 1 "png-compression: \"10\"; use an integer 0..9" decode --png-compression 10 --out "$OUT/x.png"
"$BIN" decode --model "$FIX/wan21" --latent "$FIX/wan21/latent.safetensors" --out "$OUT/clip.mp4" --fps 8 \
  >/dev/null || fail "mp4 decode"
[ "$(head -c 8 "$OUT/clip.mp4" | tail -c 4)" = "ftyp" ] || fail "clip.mp4 is not an MP4 file"
echo "== an MP4 encodes as its frames (13 frames of 56x40 -> 4 latent frames of 7x5)"
"$BIN" encode --model "$FIX/wan21" --image "$OUT/clip.mp4" --out "$OUT/from_mp4.safetensors" --mode exact --ranks 2 \
  | grep "image_shape=\[1,3,13,56,40\] latent_shape=\[1,16,4,7,5\]" > /dev/null || fail "mp4 encode"
expect_error 1 "must be 4-D" encode --model "$FIX/sd_kl" --image "$OUT/clip.mp4" --out "$OUT/x.safetensors"
# The model's own scaling factor as the request's override: the family's
# de-normalisation, bit for bit.
sf=$("$BIN" info --model "$FIX/sd_kl" | sed -n 's/^scaling factor: //p')
"$BIN" decode --model "$FIX/sd_kl" --latent "$FIX/sd_kl/pipeline_latent.safetensors" --latent-space raw \
  --scaling-factor "$sf" --out "$OUT/scaled.npy" >/dev/null || fail "scaling-factor decode"
"$BIN" decode --model "$FIX/sd_kl" --latent "$FIX/sd_kl/pipeline_latent.safetensors" --latent-space raw \
  --out "$OUT/unscaled.npy" >/dev/null || fail "raw decode"
cmp -s "$OUT/scaled.npy" "$OUT/unscaled.npy" || fail "--scaling-factor $sf is not the model's own de-normalisation"
"$BIN" decode --model "$FIX/sd_kl" --latent "$FIX/sd_kl/pipeline_latent.safetensors" --latent-space raw \
  --scaling-factor 1 --out "$OUT/scaled1.npy" >/dev/null || fail "scaling-factor 1 decode"
! cmp -s "$OUT/scaled1.npy" "$OUT/unscaled.npy" || fail "--scaling-factor 1 changed nothing"
expect_error 1 "applies to raw latents" decode --scaling-factor 2 --out "$OUT/x.npy"
expect_error 1 "not timestep-conditioned" decode --decode-timestep 0.05 --out "$OUT/x.npy"
expect_error 1 "mp4 holds video" decode --out "$OUT/x.mp4"

echo "== streaming sessions: a clip decoded chunk by chunk equals the whole decode"
# Dense: byte for byte. Exact over 3 ranks (uneven bands of 7 latent rows):
# within 3e-5 of the exact whole clip (a session is the whole clip's Decode in
# the same mode; exact vs dense is the sharding's check, in
# tests/multiprocess: the demo latent's own rounding floor, dense at 1 thread
# vs 2, is 2.6e-5 on some CPUs). Batch 2 from a demo latent.
stream_case() {  # name model-dir latent-args... -- chunkings...
  local name=$1 model=$2
  shift 2
  local args=()
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  "$BIN" decode --model "$model" "${args[@]}" --out "$OUT/${name}_whole.safetensors" >/dev/null || fail "$name whole decode"
  "$BIN" decode --model "$model" "${args[@]}" --mode exact --ranks 3 --timeout-s 60 \
    --out "$OUT/${name}_xwhole.safetensors" >/dev/null || fail "$name exact whole decode"
  for chunks in "$@"; do
    local n lines
    n=$(tr ',' '\n' <<<"$chunks" | grep -c .)
    lines=$("$BIN" decode --model "$model" "${args[@]}" --stream-chunks "$chunks" --out "$OUT/${name}_s.safetensors")
    [ "$(grep -c '^chunk=' <<<"$lines")" = "$n" ] || fail "$name --stream-chunks $chunks did not print $n chunk lines"
    cmp -s "$OUT/${name}_whole.safetensors" "$OUT/${name}_s.safetensors" || fail "$name dense chunks $chunks differ from the whole clip"
    lines=$("$BIN" decode --model "$model" "${args[@]}" --stream-chunks "$chunks" --mode exact --ranks 3 \
      --timeout-s 60 --out "$OUT/${name}_sx.npy")
    [ "$(grep -c '^chunk=.* mode=exact ' <<<"$lines")" = "$n" ] || fail "$name: not every chunk of $chunks was exact"
    verdict=$("$PY" "$FIX/compare.py" "$OUT/${name}_xwhole.safetensors" "$OUT/${name}_sx.npy" --atol 3e-5 --rtol 0 | tail -n 1)
    case "$verdict" in *OK) ;; *) fail "$name exact chunks $chunks vs the exact whole clip: $verdict" ;; esac
  done
}
stream_case wan21 "$FIX/wan21" --latent "$FIX/wan21/latent.safetensors" -- 1,1,1,1 1,3 2,2 4
stream_case wan22 "$FIX/wan22" --latent "$FIX/wan22/latent.safetensors" -- 1,1
stream_case wan21_b2 "$FIX/wan21" --latent-shape 2,16,3,7,5 --seed 3 -- 1,2 2,1
# LTX-2 with its decoder causal (the fixture's weights, config decoder_causal
# true; the released decoders are not causal and refuse).
causal_ltx2() {  # dir json-changes
  mkdir -p "$1"
  ln -sf "$FIX/ltx2/diffusion_pytorch_model.safetensors" "$1/"
  /usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c.update(json.loads(sys.argv[3]))
json.dump(c, open(sys.argv[2], "w"))' "$FIX/ltx2/config.json" "$1/config.json" "$2"
}
causal_ltx2 "$OUT/ltx2_causal" '{"decoder_causal": true}'
stream_case ltx2_causal "$OUT/ltx2_causal" --latent-shape 1,128,3,3,2 --seed 5 -- 1,2 1,1,1
expect_error 1 "not causal in time" decode --model "$FIX/ltx2" --latent-shape 1,128,3,3,2 --stream-chunks 1,2 \
  --out "$OUT/x.npy"
# A timestep-conditioned one streams at a timestep, without noise (seeded
# weights zero its timestep multiplier, so the timestep's effect on the
# frames is ltx2's decoder_test's to check).
causal_ltx2 "$OUT/ltx2_causal_t" '{"decoder_causal": true, "timestep_conditioning": true}'
lt=(decode --model "$OUT/ltx2_causal_t" --seeded-weights 1 --latent-shape 1,128,3,3,2 --seed 6)
"$BIN" "${lt[@]}" --decode-timestep 0.05 --decode-noise-scale 0 --out "$OUT/lt5.safetensors" >/dev/null ||
  fail "causal LTX-2 at timestep 0.05"
"$BIN" "${lt[@]}" --decode-timestep 0.05 --decode-noise-scale 0 --stream-chunks 1,2 --out "$OUT/lt5_s.safetensors" \
  >/dev/null || fail "causal LTX-2 session at timestep 0.05"
cmp -s "$OUT/lt5.safetensors" "$OUT/lt5_s.safetensors" || fail "a session at timestep 0.05 differs from the whole decode"
expect_error 1 "mixes no decode noise" "${lt[@]}" --decode-timestep 0.05 --stream-chunks 1,2 --out "$OUT/x.npy"
"$BIN" decode --model "$FIX/wan21" --latent "$FIX/wan21/latent.safetensors" --stream-chunks 1,3 --out "$OUT/s.png" \
  >/dev/null || fail "streamed PNG frames"
[ -f "$OUT/s_f012.png" ] && [ ! -f "$OUT/s_f013.png" ] || fail "streamed PNG frames are not named as the whole clip's: $(ls "$OUT" | grep '^s_' | head -3)"
expect_error 1 "adds up to 3 latent frames; the latent has 4" decode --model "$FIX/wan21" \
  --latent "$FIX/wan21/latent.safetensors" --stream-chunks 1,2 --out "$OUT/x.npy"
expect_error 1 "is an image model" decode --stream-chunks 1 --out "$OUT/x.npy"
expect_error 1 "must list positive latent frame counts" decode --model "$FIX/wan21" \
  --latent "$FIX/wan21/latent.safetensors" --stream-chunks 2,0,2 --out "$OUT/x.npy"
expect_error 1 "no tiles" decode --model "$FIX/wan21" --latent "$FIX/wan21/latent.safetensors" --stream-chunks 4 \
  --mode tiled --out "$OUT/x.npy"

echo "== float16: force_upcast VAEs decode in float32, as diffusers' pipelines do"
line=$("$BIN" decode --model "$FIX/sd_kl" --dtype float16 --out "$OUT/fp16.npy" | tail -n 1)
[[ "$line" == *"dtype=float32 requested_dtype=float16 (force_upcast)"* ]] || fail "sd_kl in float16 was not upcast: $line"
line=$("$BIN" decode --model "$FIX/wan21" --latent "$FIX/wan21/latent.safetensors" --dtype float16 \
  --out "$OUT/wan_fp16.npy" | tail -n 1)
[[ "$line" == *"dtype=float16 device"* ]] || fail "wan21 (no force_upcast) did not decode in float16: $line"

echo "== seeded weights from a config alone, timed repeats"
mkdir -p "$OUT/config_only" && cp "$FIX/flux1_kl/config.json" "$OUT/config_only/"
line=$("$BIN" decode --model "$OUT/config_only" --seeded-weights 5 --latent-shape 1,16,8,8 --warmup 1 --repeat 3 \
  --out "$OUT/seeded.npy" | tail -n 1)
runs=$(sed -n 's/.*decode_ms_runs=\[\([^]]*\)\].*/\1/p' <<<"$line" | tr ',' '\n' | grep -c .)
[ "$runs" = 3 ] || fail "--repeat 3 did not time 3 decodes: $line"
[[ "$line" == *"warmup=1"* ]] || fail "no warm-up reported: $line"
"$BIN" decode --model "$OUT/config_only" --seeded-weights 5 --latent-shape 1,16,8,8 --out "$OUT/seeded2.npy" >/dev/null
cmp -s "$OUT/seeded.npy" "$OUT/seeded2.npy" || fail "the same seed gave another decoder"
expect_error 1 "no diffusion_pytorch_model.safetensors" decode --model "$OUT/config_only" --out "$OUT/x.npy"

echo "== info"
"$BIN" info --model "$FIX/flux1_kl" | grep "shift factor: 0.1159" > /dev/null || fail "info lacks the shift factor"
"$BIN" info --model "$FIX/minimax_h3" > "$OUT/minimax_info.txt"
grep -q "family: minimax_h3 (diffusers AutoencoderKLMiniMaxH3)" "$OUT/minimax_info.txt" || fail "info lacks MiniMax-H3's family"
grep -q "^tiled mode: not available" "$OUT/minimax_info.txt" || fail "info does not say MiniMax-H3 is never tiled"
grep -q "^note: decoded untiled.*256x256-pixel tiles" "$OUT/minimax_info.txt" || fail "info does not say how MiniMax-H3 differs from diffusers above 256 px"
if "$BIN" info --model "$FIX/sd_kl" | grep "^note:" > /dev/null; then fail "sd_kl has no decode note"; fi

echo "== malformed input: one-line error, non-zero exit"
head -c 100 "$FIX/sd_kl/latent.safetensors" > "$OUT/truncated.safetensors"
printf '\x08\x00\x00\x00\x00\x00\x00\x00{"a":1}' > "$OUT/badjson.safetensors"
expect_error 1 "does not exist" decode --model "$OUT/nope" --out "$OUT/x.npy"
expect_error 1 "truncated.safetensors" decode --model "$FIX/sd_kl" --latent "$OUT/truncated.safetensors" --out "$OUT/x.npy"
expect_error 1 "badjson.safetensors" decode --model "$FIX/sd_kl" --latent "$OUT/badjson.safetensors" --out "$OUT/x.npy"
expect_error 1 "expects 4" decode --model "$FIX/sd_kl" --latent "$FIX/flux1_kl/latent.safetensors" --out "$OUT/x.npy"
expect_error 1 "needs --model" decode --seeded-weights 3 --out "$OUT/x.npy"
expect_error 1 "are for dense and tiled" decode --mode exact --ranks 2 --repeat 3 --out "$OUT/x.npy"
expect_error 1 "--repeat must be" decode --repeat 0 --out "$OUT/x.npy"
expect_error 1 "unknown dtype" decode --dtype int8 --out "$OUT/x.npy"
# A diffusers VAE class no family registers, next to real weights.
mkdir -p "$OUT/unsupported" && echo '{"_class_name": "AutoencoderKLMochi"}' > "$OUT/unsupported/config.json"
ln -sf "$FIX/sd_kl/diffusion_pytorch_model.safetensors" "$OUT/unsupported/diffusion_pytorch_model.safetensors"
expect_error 1 "not supported" decode --model "$OUT/unsupported" --out "$OUT/x.npy"
expect_error 1 "extension" decode --out "$OUT/x.txt"
expect_error 2 "unknown flag" decode --bogus 1 --out "$OUT/x.npy"

echo "== tiled decode within a memory budget (--mode tiled --budget-mib)"
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" "$2"; }
# Every AutoencoderKL fixture case fits a budget of its dense peak plus the
# planner's headroom and the output: one tile, planned without an
# out-of-memory retry, diffusers' output.
while read -r folder name latent expected pipeline; do
  "$BIN" decode --model "$FIX/$folder" --latent "$FIX/$latent" --out "$OUT/d.npy" > "$OUT/d.log" \
    || fail "dense decode of $folder/$name"
  budget=$("$PY" -c "import math,sys; print(math.ceil(float(sys.argv[1]) * 1.5) + 1)" "$(field decode_peak_mib "$OUT/d.log")")
  "$BIN" decode --model "$FIX/$folder" --latent "$FIX/$latent" --out "$OUT/${folder}_${name}_tiled.npy" \
    --mode tiled --budget-mib "$budget" > "$OUT/t.log" || fail "tiled decode of $folder/$name: $(cat "$OUT/t.log")"
  grep -q " plan=untiled .* tile_retries=0 " "$OUT/t.log" \
    || fail "$folder/$name: not one tile planned right at $budget MiB: $(cat "$OUT/t.log")"
  compare "$FIX/$expected" "$OUT/${folder}_${name}_tiled.npy"
done <<< "$cases"

# A packed raw FLUX.2 latent unpacks to twice the rows and columns before
# tiles are cut: the whole image, diffusers' output.
"$BIN" decode --model "$FIX/flux2_kl" --latent "$FIX/flux2_kl/pipeline_latent.safetensors" --latent-space raw \
  --mode tiled --out "$OUT/flux2_raw_tiled.npy" > "$OUT/t.log" || fail "tiled raw FLUX.2 decode: $(cat "$OUT/t.log")"
compare "$FIX/flux2_kl/expected.safetensors" "$OUT/flux2_raw_tiled.npy"

# Latents larger than the fixtures, with budgets well below their dense
# peak: several seam-free tiles, the measured peak within the budget, and
# at least 40 dB against the untiled decode.
for spec in "sd_kl 1,4,72,88 0.45" "flux1_kl 1,16,64,56 0.5"; do
  read -r folder shape share <<< "$spec"
  # (the calibrated prediction must hold: no out-of-memory retry is allowed)
  "$BIN" decode --model "$FIX/$folder" --latent-shape "$shape" --out "$OUT/big_dense.npy" > "$OUT/d.log" \
    || fail "dense decode of $folder at $shape"
  budget=$("$PY" -c "import sys; print(int(float(sys.argv[1]) * float(sys.argv[2])) + 1)" \
    "$(field decode_peak_mib "$OUT/d.log")" "$share")
  "$BIN" decode --model "$FIX/$folder" --latent-shape "$shape" --out "$OUT/big_tiled.npy" --mode tiled \
    --budget-mib "$budget" > "$OUT/t.log" || { fail "tiled decode of $folder at $shape"; continue; }
  echo "  $folder $shape budget ${budget} MiB: $(grep -o 'plan=.*decode_peak_mib=[^ ]*' "$OUT/t.log")"
  verdict=$("$PY" - "$OUT/big_dense.npy" "$OUT/big_tiled.npy" "$(field decode_peak_mib "$OUT/t.log")" "$budget" \
    "$(field tile_calls "$OUT/t.log")" "$(field tile_retries "$OUT/t.log")" <<'PY'
import sys
import numpy as np
dense, tiled = np.load(sys.argv[1]).astype(np.float64), np.load(sys.argv[2]).astype(np.float64)
peak, budget, calls, retries = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
mse = float(np.mean((dense - tiled) ** 2))
span = float(dense.max() - dense.min())
psnr = 10 * np.log10(span * span / mse) if mse > 0 else float("inf")
problems = []
if calls < 2: problems.append(f"{calls} tile call(s): the budget did not force tiling")
if retries != 0: problems.append(f"{retries} out-of-memory retries: the prediction was too low")
if peak > budget: problems.append(f"peak {peak} MiB above the {budget} MiB budget")
if psnr < 40: problems.append(f"PSNR {psnr:.1f} dB < 40")
print("; ".join(problems) if problems else f"OK psnr={psnr:.1f}dB")
PY
)
  case "$verdict" in OK*) echo "  ok: $verdict" ;; *) fail "$folder at $shape: $verdict" ;; esac
done
expect_error 1 "out of memory" decode --model "$FIX/sd_kl" --latent-shape 1,4,72,88 --mode tiled --budget-mib 1 \
  --out "$OUT/x.npy"
expect_error 1 "budget-mib must be a positive integer" decode --mode tiled --budget-mib 0 --out "$OUT/x.npy"
expect_error 1 "this build has no CUDA backend" decode --device cuda:0 --out "$OUT/x.npy"

# Audio (MiniMax-H3's waveform VAE): the waveform tensor, from the VAE and the
# raw latents, and 16-bit WAVs, one per batch entry, at its sample rate.
for name in main m1; do
  echo "== audio minimax_h3_audio/$name"
  suffix=$([ "$name" = main ] && echo "" || echo "_$name")
  AUD="$FIX/minimax_h3_audio"
  "$BIN" decode --model "$AUD" --latent "$AUD/latent$suffix.safetensors" --out "$OUT/audio_$name.safetensors" \
    | grep "sample_rate=32000" > /dev/null || fail "audio decode of minimax_h3_audio/$name"
  compare "$AUD/expected$suffix.safetensors" "$OUT/audio_$name.safetensors"
  "$BIN" decode --model "$AUD" --latent "$AUD/pipeline_latent$suffix.safetensors" --latent-space raw \
    --out "$OUT/audio_${name}_raw.npy" > /dev/null || fail "raw audio decode of minimax_h3_audio/$name"
  compare "$AUD/expected$suffix.safetensors" "$OUT/audio_${name}_raw.npy"
done
"$BIN" decode --model "$FIX/minimax_h3_audio" --latent "$FIX/minimax_h3_audio/latent.safetensors" \
  --out "$OUT/audio.wav" > /dev/null || fail "WAV decode of minimax_h3_audio"
"$PY" - "$OUT" "$FIX/minimax_h3_audio/expected.safetensors" <<'PY' || fail "the WAVs do not hold the waveforms"
import sys, wave, numpy as np, json, struct
out, expected = sys.argv[1], sys.argv[2]
with open(expected, "rb") as f:  # safetensors: the "sample" tensor, float32
    n = struct.unpack("<Q", f.read(8))[0]; header = json.loads(f.read(n)); blob = f.read()
meta = header["sample"]; lo, hi = meta["data_offsets"]
ref = np.frombuffer(blob[lo:hi], dtype=np.float32).reshape(meta["shape"])  # [2, 1, 4000]
for b in range(ref.shape[0]):
    w = wave.open(f"{out}/audio_{b}.wav")
    assert (w.getnchannels(), w.getframerate(), w.getsampwidth(), w.getnframes()) == (1, 32000, 2, 4000)
    pcm = np.frombuffer(w.readframes(4000), dtype="<i2").astype(np.float32) / 32767
    assert np.abs(pcm - ref[b, 0]).max() <= 1 / 32767 + 1e-4, np.abs(pcm - ref[b, 0]).max()
PY
"$BIN" decode --model "$FIX/minimax_h3_audio" --latent "$FIX/minimax_h3_audio/latent_m1.safetensors" \
  --out "$OUT/audio_f32.wav" --wav-encoding float32 > /dev/null || fail "float32 WAV decode of minimax_h3_audio"
"$PY" - "$OUT/audio_f32.wav" "$OUT/audio_m1.safetensors" <<'PY' || fail "the float32 WAV does not hold the waveform"
import sys, struct, json, numpy as np
wav = open(sys.argv[1], "rb").read()
assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE"
chunks, at = {}, 12
while at + 8 <= len(wav):  # the RIFF chunks, as a strict reader walks them
    kind, size = wav[at:at + 4], struct.unpack("<I", wav[at + 4:at + 8])[0]
    chunks[kind] = wav[at + 8:at + 8 + size]
    at += 8 + size + (size & 1)
fmt, channels, rate = struct.unpack("<HHI", chunks[b"fmt "][:8])
assert (fmt, channels, rate) == (3, 1, 32000), (fmt, channels, rate)
pcm = np.frombuffer(chunks[b"data"], dtype="<f4")
assert struct.unpack("<I", chunks[b"fact"])[0] == pcm.size
with open(sys.argv[2], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]; header = json.loads(f.read(n)); blob = f.read()
lo, hi = header["sample"]["data_offsets"]
ref = np.frombuffer(blob[lo:hi], dtype=np.float32).reshape(-1)
assert pcm.shape == ref.shape and np.array_equal(pcm, ref), (pcm.shape, ref.shape)
PY
"$BIN" info --model "$FIX/minimax_h3_audio" | grep "audio: latents to waveforms at 32000 Hz, 800 samples" \
  > /dev/null || fail "info does not describe the audio VAE"
expect_error 1 "an audio VAE decodes to .wav, .safetensors or .npy" decode --model "$FIX/minimax_h3_audio" \
  --latent "$FIX/minimax_h3_audio/latent.safetensors" --out "$OUT/audio.png"

# LTX-2's audio VAE and vocoder: the waveform by default (from the VAE latent
# and the pipeline's packed raw latent), the mel spectrogram on request, and
# a stereo WAV at the vocoder's rate.
LTA="$FIX/ltx2_audio"
for name in main b2; do
  echo "== audio ltx2_audio/$name"
  suffix=$([ "$name" = main ] && echo "" || echo "_$name")
  "$BIN" decode --model "$LTA" --latent "$LTA/latent$suffix.safetensors" --out "$OUT/ltx2a_$name.safetensors" \
    | grep "output=waveform sample_rate=24000" > /dev/null || fail "audio decode of ltx2_audio/$name"
  compare "$LTA/waveform$suffix.safetensors" "$OUT/ltx2a_$name.safetensors"
  "$BIN" decode --model "$LTA" --latent "$LTA/pipeline_latent$suffix.safetensors" --latent-space raw \
    --out "$OUT/ltx2a_${name}_raw.npy" > /dev/null || fail "raw audio decode of ltx2_audio/$name"
  compare "$LTA/waveform$suffix.safetensors" "$OUT/ltx2a_${name}_raw.npy"
  "$BIN" decode --model "$LTA" --latent "$LTA/latent$suffix.safetensors" --audio-output mel \
    --out "$OUT/ltx2a_${name}_mel.safetensors" | grep "output=mel" > /dev/null || fail "mel decode of ltx2_audio/$name"
  compare "$LTA/expected$suffix.safetensors" "$OUT/ltx2a_${name}_mel.safetensors"
done
"$BIN" decode --model "$LTA" --latent "$LTA/latent.safetensors" --out "$OUT/ltx2a.wav" > /dev/null \
  || fail "WAV decode of ltx2_audio"
"$PY" - "$OUT/ltx2a.wav" "$LTA/waveform.safetensors" <<'PY' || fail "the stereo WAV does not hold the waveform"
import sys, wave, numpy as np, json, struct
with open(sys.argv[2], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]; header = json.loads(f.read(n)); blob = f.read()
lo, hi = header["sample"]["data_offsets"]
ref = np.frombuffer(blob[lo:hi], dtype=np.float32).reshape(header["sample"]["shape"])  # [1, 2, 5040]
w = wave.open(sys.argv[1])
assert (w.getnchannels(), w.getframerate(), w.getsampwidth(), w.getnframes()) == (2, 24000, 2, 5040)
pcm = np.frombuffer(w.readframes(5040), dtype="<i2").astype(np.float32).reshape(5040, 2).T / 32767
assert np.abs(pcm - ref[0]).max() <= 1 / 32767 + 1e-4, np.abs(pcm - ref[0]).max()
PY
expect_error 1 "decoded a mel spectrogram (--audio-output mel), not a waveform" decode --model "$LTA" \
  --latent "$LTA/latent.safetensors" --audio-output mel --out "$OUT/mel.wav"
expect_error 1 "--audio-output: \"spectrum\"; use waveform or mel" decode --model "$LTA" --latent "$LTA/latent.safetensors" --audio-output spectrum \
  --out "$OUT/mel.npy"
"$BIN" info --model "$LTA" | grep "audio: latents to waveforms at 24000 Hz, 960 samples" > /dev/null \
  || fail "info does not describe LTX-2's audio VAE"

echo "== an audio latent muxed into the video's MP4"
# LTX-2's repository layout: vae/ and audio_vae/ (its vocoder/ inside), so
# --audio-model defaults to the audio VAE beside the video's.
mkdir -p "$OUT/ltx2_repo"
ln -sfn "$FIX/ltx2_full" "$OUT/ltx2_repo/vae"
ln -sfn "$LTA" "$OUT/ltx2_repo/audio_vae"
"$BIN" decode --model "$OUT/ltx2_repo/vae/" --latent "$FIX/ltx2_full/latent_b2.safetensors" \
  --audio-latent "$LTA/latent_b2.safetensors" --out "$OUT/ltx2_av.mp4" > /dev/null || fail "muxed MP4 of LTX-2"
"$BIN" decode --model "$FIX/minimax_h3" --latent "$FIX/minimax_h3/latent.safetensors" \
  --audio-latent "$FIX/minimax_h3_audio/pipeline_latent.safetensors" --audio-latent-space raw \
  --audio-model "$FIX/minimax_h3_audio" --out "$OUT/minimax_av.mp4" > /dev/null || fail "muxed MP4 of MiniMax-H3"
# The tracks as the container describes them: an H.264 video of the clip's
# frames and a stereo AAC track of every audio sample (AAC pads to its
# 1024-sample frames).
"$PY" - "$OUT/ltx2_av_0.mp4:1:24000:3120" "$OUT/ltx2_av_1.mp4:1:24000:3120" \
  "$OUT/minimax_av.mp4:30:$(grep -o '"sampling_rate": *[0-9]*' "$FIX/minimax_h3_audio/config.json" | grep -o '[0-9]*$'):4000" \
  <<'PY' || fail "a muxed MP4 lacks a track or its length"
import struct, sys

def boxes(data, start, end):
    while start + 8 <= end:
        size, kind = struct.unpack(">I4s", data[start:start + 8])
        yield kind.decode("latin-1"), start + 8, start + size
        start += size

def find(data, start, end, kind):
    return [(s, e) for k, s, e in boxes(data, start, end) if k == kind]

for arg in sys.argv[1:]:
    path, frames, rate, samples = arg.split(":")
    data = open(path, "rb").read()
    (ms, me), = find(data, 0, len(data), "moov")
    tracks = {}
    for ts, te in find(data, ms, me, "trak"):
        (ds, de), = find(data, ts, te, "mdia")
        (hs, he), = find(data, ds, de, "hdlr")
        handler = data[hs + 8:hs + 12].decode()
        (mhs, mhe), = find(data, ds, de, "mdhd")
        version = data[mhs]
        timescale, duration = struct.unpack(">IQ" if version else ">II", data[mhs + (20 if version else 12):mhs + (32 if version else 20)])
        (ns, ne), = find(data, ds, de, "minf")
        (ss, se), = find(data, ns, ne, "stbl")
        (ds2, de2), = find(data, ss, se, "stsd")
        entry = data[ds2 + 8 + 4:ds2 + 8 + 8].decode()
        (ts2, te2), = find(data, ss, se, "stts")
        count, = struct.unpack(">I", data[ts2 + 4:ts2 + 8])
        samples_in = sum(struct.unpack(">I", data[ts2 + 8 + 8 * i:ts2 + 12 + 8 * i])[0] for i in range(count))
        tracks[handler] = (entry, timescale, duration, samples_in, ds2 + 8)
    assert set(tracks) == {"vide", "soun"}, (path, set(tracks))
    entry, timescale, duration, _, at = tracks["soun"]
    assert entry == "mp4a", (path, entry)
    channels, = struct.unpack(">H", data[at + 8 + 16:at + 8 + 18])
    assert channels == 2, (path, channels)
    assert timescale == int(rate), (path, timescale, rate)
    assert abs(duration - int(samples)) < 1024 + 1024, (path, duration, samples)
    entry, timescale, duration, video_frames, _ = tracks["vide"]
    assert entry == "avc1", (path, entry)
    assert video_frames == int(frames), (path, video_frames, frames)
PY
expect_error 1 "--audio-latent is muxed into a video: --out must be .mp4" decode --model "$FIX/ltx2_full" \
  --latent "$FIX/ltx2_full/latent.safetensors" --audio-latent "$LTA/latent.safetensors" --audio-model "$LTA" \
  --out "$OUT/x.npy"
expect_error 1 "audio_latent: a batch of 2 beside 1 video clip(s)" decode --model "$FIX/ltx2_full" \
  --latent "$FIX/ltx2_full/latent.safetensors" --audio-latent "$LTA/latent_b2.safetensors" --audio-model "$LTA" \
  --out "$OUT/x.mp4"

echo "== a rank killed mid-decode fails the group without hanging or orphans"
start=$(date +%s)
"$BIN" decode --latent-shape 1,4,40,40 --mode exact --ranks 3 --timeout-s 30 --out "$OUT/killed.npy" \
  > "$OUT/killed.log" 2>&1 &
leader=$!
victim=""
for _ in $(seq 1 200); do
  victim=$(pgrep -P "$leader" | head -n 1)
  [ -n "$victim" ] && break
  sleep 0.05
done
if [ -z "$victim" ]; then
  fail "the leader started no rank process"
else
  sleep 2  # let the group form and start decoding
  ranks=$(pgrep -P "$leader")
  kill -9 "$victim"
  wait "$leader"
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  [ "$rc" -ne 0 ] || fail "the leader succeeded although rank process $victim was killed"
  [ "$elapsed" -lt 60 ] || fail "the leader took ${elapsed}s to notice"
  for pid in $ranks; do
    sleep 0.2
    ! kill -0 "$pid" 2>/dev/null || fail "rank process $pid outlived the leader"
  done
  echo "  leader exited $rc after ${elapsed}s: $(tail -n 1 "$OUT/killed.log")"
fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
