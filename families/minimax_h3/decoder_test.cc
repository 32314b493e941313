#include "families/minimax_h3/decoder.h"

#include <cmath>
#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "device/counting_cpu_allocator.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
#include "families/status_error.h"
#include "families/weight_loading.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families::minimax_h3 {
namespace {

using ::testing::HasSubstr;

TEST(MiniMaxH3Decoder, ParameterNamesAreTheDiffusersDecodeKeys) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("minimax_h3"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::set<std::string> want;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (absl::StartsWith(name, "decoder.") || absl::StartsWith(name, "post_quant_conv.")) want.insert(name);
  }
  absl::StatusOr<MiniMaxH3Config> config = MiniMaxH3Config::FromJson((*files)->config(), "minimax_h3");
  ASSERT_TRUE(config.ok()) << config.status();
  MiniMaxH3Decoder decoder(*config, "{}");
  std::set<std::string> have;
  for (const auto& item : decoder.module()->named_parameters()) have.insert(item.key());
  EXPECT_EQ(have, want);
  EXPECT_EQ(want.size(), 41u);  // 39 decoder.* + 2 post_quant_conv.* (fixtures README)
}

TEST(MiniMaxH3Decoder, LoadsTheFixtureAndDescribesIt) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("minimax_h3"), {});
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelInfo& info = (*d)->info();
  EXPECT_EQ(info.family, "minimax_h3");
  EXPECT_EQ(info.diffusers_class, "AutoencoderKLMiniMaxH3");
  EXPECT_EQ(info.latent_channels, 24);
  EXPECT_EQ(info.spatial_factor, 16);
  EXPECT_TRUE(info.is_video);
  EXPECT_FALSE(info.spatial_tiling);
  EXPECT_EQ(info.min_latent_frames, 3);
  EXPECT_EQ(info.peak_latent_frames, 3);  // any latent costs one (padded) window
  EXPECT_EQ((*d)->OutputShape({1, 24, 9, 3, 5}), (std::vector<int64_t>{1, 3, 30, 48, 80}));
  EXPECT_EQ((*d)->OutputShape({2, 24, 7, 3, 2}), (std::vector<int64_t>{2, 3, 22, 48, 32}));
  // raw: z * latents_std + latents_mean per channel (channel 0: std 0.6673, mean 0.5798).
  const at::Tensor vae = (*d)->ToVaeSpace(at::ones({1, 24, 1, 1, 1}));
  EXPECT_NEAR(vae[0][0][0][0][0].item<double>(), 0.6673 + 0.5798, 1e-6);
  EXPECT_TRUE((*d)->CheckExactSharding({1, 24, 9, 3, 5}, 3).ok());
  EXPECT_FALSE((*d)->CheckExactSharding({1, 24, 9, 3, 5}, 4).ok());
}

TEST(MiniMaxH3Decoder, FewerThanThreeLatentFramesAreRefusedWithTheReason) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("minimax_h3"), {});
  ASSERT_TRUE(d.ok()) << d.status();
  const absl::Status s = (*d)->ValidateLatent(at::zeros({1, 24, 2, 3, 5}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("decodes at least 3"));
  EXPECT_TRUE((*d)->ValidateLatent(at::zeros({1, 24, 3, 3, 5})).ok());
}

TEST(MiniMaxH3Decoder, RotaryPositionsAreLengthNormalisedGlobalCoordinates) {
  // One token per axis value: t, h, w of sizes 1, 4 (rows 1..2 of a band), 1;
  // rope_dim 6: one frequency (inv_freq 1) per axis, tiled twice.
  const Rotary r = RotaryEmbedding(1, /*first_row=*/1, /*band_rows=*/2, /*total_rows=*/4, 1, /*extra_tokens=*/1, 6,
                                   100.0, c10::Device(c10::kCPU));
  ASSERT_EQ(r.cos.sizes(), (std::vector<int64_t>{3, 6}));
  // Global rows 1 and 2 of 4: positions 2·(1.5/4) − 1 = −0.25 and 0.25; t and w are 0.
  for (int64_t token = 0; token < 2; ++token) {
    const double h = token == 0 ? -0.25 : 0.25;
    EXPECT_NEAR(r.sin[token][1].item<double>(), std::sin(2 * M_PI * h), 1e-6);
    EXPECT_NEAR(r.sin[token][4].item<double>(), std::sin(2 * M_PI * h), 1e-6);  // the tiled copy
    EXPECT_NEAR(r.cos[token][0].item<double>(), 1.0, 1e-6);
  }
  // The appended token sits at the origin on every axis.
  EXPECT_TRUE(r.cos[2].equal(at::ones({6})));
}

TEST(MiniMaxH3Decoder, DecodesWithoutRegisterTokens) {
  absl::StatusOr<MiniMaxH3Config> c = MiniMaxH3Config::FromJson({{"latent_channels", 4},
                                                                 {"decoder_num_layers", 1},
                                                                 {"decoder_num_attention_heads", 2},
                                                                 {"decoder_attention_head_dim", 8},
                                                                 {"decoder_num_register_tokens", 0},
                                                                 {"decoder_rope_dim_ratio", 0.75},
                                                                 {"spatial_downsample_factors", {2}},
                                                                 {"temporal_downsample_factors", {4}}},
                                                                "small");
  ASSERT_TRUE(c.ok()) << c.status();
  MiniMaxH3Decoder decoder(*c, "{}");
  SeedParameters(*decoder.module(), 3);
  at::manual_seed(4);
  DenseOps ops;
  const at::Tensor out = decoder.Decode(at::randn({1, 4, 7, 2, 3}), ops);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 3, 22, 4, 6}));
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
}

TEST(MiniMaxH3Decoder, OutputFramesFromTheTableAreTheWindowPlansForAnyLength) {
  // Window geometries of several clip lengths and token drops, 0..300
  // latent frames: the table and period info() hands the frontend reproduce
  // the window plan (not a closed form of T) everywhere.
  const std::vector<std::pair<int64_t, int64_t>> geometries = {{17, 3}, {17, 0}, {16, 2}, {9, 1}, {13, 4}, {33, 7}};
  for (const auto& [clip_length, token_drop] : geometries) {
    absl::StatusOr<MiniMaxH3Config> c = MiniMaxH3Config::FromJson({{"latent_channels", 4},
                                                                   {"decoder_num_layers", 1},
                                                                   {"decoder_num_attention_heads", 2},
                                                                   {"decoder_attention_head_dim", 8},
                                                                   {"clip_length", clip_length},
                                                                   {"token_drop", token_drop}},
                                                                  "geometry");
    ASSERT_TRUE(c.ok()) << c.status();
    const MiniMaxH3Decoder decoder(*c, "{}");
    ASSERT_GT(decoder.info().output_frames.period, 0);
    for (int64_t t = 0; t <= 300; ++t) {
      ASSERT_EQ(decoder.OutputShape({1, 4, t, 2, 2})[2], c->Windows(t).output_frames)
          << "clip_length " << clip_length << " token_drop " << token_drop << " latent frames " << t;
    }
  }
}

// The latent decoded through one stream, `chunks` latent frames at a time,
// the last chunk saying the clip ends; each chunk's frame count checked
// against StreamedFrames.
// A one-layer decoder (2x spatial, 4x temporal, 4 latent channels) small
// enough to decode many clips, with the window geometry given.
absl::StatusOr<MiniMaxH3Config> SmallWindowConfig(int64_t clip_length, int64_t token_drop) {
  return MiniMaxH3Config::FromJson({{"latent_channels", 4},
                                    {"decoder_num_layers", 1},
                                    {"decoder_num_attention_heads", 2},
                                    {"decoder_attention_head_dim", 8},
                                    {"spatial_downsample_factors", {2}},
                                    {"temporal_downsample_factors", {4}},
                                    {"clip_length", clip_length},
                                    {"token_drop", token_drop}},
                                   "small windows");
}

at::Tensor DecodeInChunks(MiniMaxH3Decoder& decoder, const at::Tensor& z, const std::vector<int64_t>& chunks) {
  std::unique_ptr<DecodeStream> stream = decoder.OpenStream();
  DenseOps ops;
  std::vector<at::Tensor> frames;
  int64_t done = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const bool last = i + 1 == chunks.size();
    frames.push_back(stream->DecodeChunk(z.narrow(2, done, chunks[i]), ops, last));
    EXPECT_EQ(frames.back().size(2),
              decoder.StreamedFrames(done + chunks[i], last) - decoder.StreamedFrames(done, false))
        << "chunk " << i << " of " << chunks.size();
    done += chunks[i];
  }
  EXPECT_EQ(stream->latent_frames(), z.size(2));
  return at::cat(frames, 2);
}

TEST(MiniMaxH3Decoder, AStreamReturnsEachWindowOnceItsLatentsCameAndEqualsTheWholeDecode) {
  // Window geometries of several clip lengths and token drops (token_drop 0:
  // no overlap; 7 > tokens_chunk_size: a last window cut short), batch 2,
  // every clip length from the shortest to past three windows, in chunks of
  // one frame, of two and three, and all at once: bit for bit the whole decode.
  const std::vector<std::pair<int64_t, int64_t>> geometries = {{17, 3}, {17, 0}, {9, 1}, {13, 7}};
  for (const auto& [clip_length, token_drop] : geometries) {
    absl::StatusOr<MiniMaxH3Config> c = SmallWindowConfig(clip_length, token_drop);
    ASSERT_TRUE(c.ok()) << c.status();
    MiniMaxH3Decoder decoder(*c, "{}");
    SeedParameters(*decoder.module(), 7);
    ASSERT_TRUE(decoder.CheckStreaming().ok());
    ASSERT_TRUE(decoder.info().stream_holds_clip_end);
    at::manual_seed(8);
    const int64_t longest = decoder.info().min_latent_frames + 3 * c->tokens_chunk_size() + 1;
    const at::Tensor clip = at::randn({2, 4, longest, 2, 3});
    for (int64_t t = decoder.info().min_latent_frames; t <= longest; ++t) {
      const at::Tensor z = clip.narrow(2, 0, t);
      DenseOps ops;
      const at::Tensor whole = decoder.Decode(z, ops);
      ASSERT_EQ(whole.size(2), c->Windows(t).output_frames);
      std::vector<std::vector<int64_t>> chunkings = {std::vector<int64_t>(t, 1), {t}};
      std::vector<int64_t> uneven;
      for (int64_t left = t, k = 0; left > 0; ++k) {
        uneven.push_back(std::min<int64_t>(left, 2 + k % 2));
        left -= uneven.back();
      }
      chunkings.push_back(uneven);
      for (const std::vector<int64_t>& chunks : chunkings) {
        const at::Tensor streamed = DecodeInChunks(decoder, z, chunks);
        ASSERT_TRUE(streamed.equal(whole)) << "clip_length " << clip_length << " token_drop " << token_drop
                                           << " latent frames " << t << " in " << chunks.size() << " chunks";
      }
    }
  }
}

TEST(MiniMaxH3Decoder, AStreamReturnsAWindowsFramesBeforeTheClipEnds) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("minimax_h3"), {});
  ASSERT_TRUE(d.ok()) << d.status();
  auto& decoder = static_cast<MiniMaxH3Decoder&>(**d);
  // clip_length 17, patch_t 4, token_drop 3: windows of 7 latent frames every
  // 5; a window's first 20 frames less 3 of pre-padding are final once the
  // window is decoded, the 5 after them once the next window fades in.
  std::unique_ptr<DecodeStream> stream = decoder.OpenStream();
  DenseOps ops;
  at::manual_seed(9);
  const at::Tensor z = at::randn({1, 24, 13, 2, 2});
  std::vector<int64_t> returned;
  for (int64_t i = 0; i < 13; ++i) {
    returned.push_back(stream->DecodeChunk(z.narrow(2, i, 1), ops, i == 12).size(2));
    if (i == 6) {
      // Window 0 decoded: the latents window 1 reads next (frames 5 and 6)
      // and the 5 overlap frames (3 x 32 x 32 floats each), copied out of
      // the window's 28 decoded frames, which are freed.
      EXPECT_EQ(stream->state_bytes(), 2 * 24 * 2 * 2 * 4 + 5 * 3 * 32 * 32 * 4);
    }
  }
  EXPECT_EQ(returned, (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0, 17, 9}));
  EXPECT_EQ(decoder.OutputShape({1, 24, 13, 2, 2})[2], 17 + 17 + 9);
  // What the stream holds between chunks: latents the next window reads,
  // the overlap and the frames not yet due; nothing once the clip ended.
  EXPECT_EQ(stream->state_bytes(), 0);
  const absl::Status more = CatchExceptions("more", [&] { (void)stream->DecodeChunk(z.narrow(2, 0, 1), ops); });
  EXPECT_EQ(more.code(), absl::StatusCode::kFailedPrecondition);
  // A clip too short for a window is refused when it ends.
  std::unique_ptr<DecodeStream> short_clip = decoder.OpenStream();
  EXPECT_TRUE(decoder.ValidateChunk(z.narrow(2, 0, 1)).ok());
  const absl::Status too_short =
      CatchExceptions("short", [&] { (void)short_clip->DecodeChunk(z.narrow(2, 0, 2), ops, true); });
  EXPECT_EQ(too_short.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_short.message(), HasSubstr("decodes at least 3"));
}

// A whole decode holds its output once: each window's frames are copied
// into the chunk's output as they come, so a longer clip's peak grows by
// its output (and latents), not by twice its output as when the windows
// were kept and concatenated at the end (1.8x here).
TEST(MiniMaxH3Decoder, AWholeDecodeHoldsItsOutputOnce) {
  device::CountingCpuAllocator& memory = device::CountingCpuAllocator::Install();
  absl::StatusOr<MiniMaxH3Config> c = SmallWindowConfig(/*clip_length=*/17, /*token_drop=*/3);
  ASSERT_TRUE(c.ok()) << c.status();
  MiniMaxH3Decoder decoder(*c, "{}");
  SeedParameters(*decoder.module(), 7);
  struct Measured {
    int64_t peak = 0, output = 0, latent = 0;
  };
  auto decode = [&](int64_t latent_frames) {
    Measured m;
    const at::Tensor z = at::randn({1, 4, latent_frames, 8, 8});
    DenseOps ops;
    const int64_t before = memory.current_bytes();
    memory.ResetPeak();
    const at::Tensor out = decoder.Decode(z, ops);
    m.peak = memory.peak_bytes() - before;
    m.output = static_cast<int64_t>(out.nbytes());
    m.latent = static_cast<int64_t>(z.nbytes());
    return m;
  };
  // Long enough that the output outweighs a window's activations (the
  // window being decoded still adds its frames on top: the output is
  // allocated whole before it).
  const Measured short_clip = decode(41), long_clip = decode(81);
  const int64_t more_output = long_clip.output - short_clip.output;
  ASSERT_GT(more_output, 0);
  // The latents are buffered (and padded) a few times over; the output once.
  EXPECT_LE(long_clip.peak - short_clip.peak, more_output + 4 * (long_clip.latent - short_clip.latent));
  EXPECT_GE(long_clip.peak - short_clip.peak, more_output);
}

TEST(MiniMaxH3Decoder, MemorySaturatesAtTheFirstFullWindow) {
  // token_drop 6 >= tokens_chunk_size 5: the shortest decodable latent (1
  // frame) pads to a 5-frame window, 9 (5 + token_overlap 4) from 5 frames on.
  absl::StatusOr<MiniMaxH3Config> c = MiniMaxH3Config::FromJson({{"latent_channels", 4},
                                                                 {"decoder_num_layers", 1},
                                                                 {"decoder_num_attention_heads", 2},
                                                                 {"decoder_attention_head_dim", 8},
                                                                 {"clip_length", 17},
                                                                 {"token_drop", 6}},
                                                                "long drop");
  ASSERT_TRUE(c.ok()) << c.status();
  const MiniMaxH3Decoder decoder(*c, "{}");
  ASSERT_EQ(c->window_latent_frames(), 9);
  const int64_t peak = decoder.info().peak_latent_frames;
  EXPECT_GT(peak, decoder.info().min_latent_frames);
  EXPECT_GE(peak + c->Windows(peak).pad_frames, 9);
  EXPECT_LT(peak - 1 + c->Windows(peak - 1).pad_frames, 9);
}

TEST(MiniMaxH3Decoder, BFloat16KeepsTheNormsAndResidualScalesInFloat32) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("minimax_h3"), {});
  ASSERT_TRUE(d.ok()) << d.status();
  auto& decoder = static_cast<MiniMaxH3Decoder&>(**d);
  decoder.ToDtype(at::kBFloat16);
  int64_t kept = 0;
  for (const auto& item : decoder.module()->named_parameters()) {
    const std::string& name = item.key();
    const bool want_float = absl::StrContains(name, ".norm1.") || absl::StrContains(name, ".norm2.") ||
                            absl::StartsWith(name, "decoder.norm_out.") || absl::EndsWith(name, ".scale1") ||
                            absl::EndsWith(name, ".scale2");
    kept += want_float;
    EXPECT_EQ(item.value().scalar_type(), want_float ? at::kFloat : at::kBFloat16) << name;
  }
  EXPECT_EQ(kept, 2 * 4 + 2);  // 2 layers × (norm1, norm2, scale1, scale2), norm_out's weight and bias
  at::manual_seed(5);
  DenseOps ops;
  const at::Tensor out = decoder.Decode(at::randn({1, 24, 3, 2, 2}), ops);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);  // proj_out's dtype, as diffusers
}

}  // namespace
}  // namespace vaedecode::families::minimax_h3
