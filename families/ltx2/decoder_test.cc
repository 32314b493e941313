#include "families/ltx2/decoder.h"

#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "families/ltx2/blocks.h"
#include "families/model_files.h"
#include "formats/tensor_file.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families::ltx2 {
namespace {

using ::testing::HasSubstr;

LTX2Config SmallConfig(nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = {{"latent_channels", 8},
                      {"decoder_block_out_channels", {8, 16}},
                      {"decoder_layers_per_block", {1, 1, 1}},
                      {"decoder_causal", false},
                      {"decoder_inject_noise", false},
                      {"upsample_factor", {2, 2}},
                      {"upsample_residual", {true, true}},
                      {"upsample_type", {"spatiotemporal", "spatiotemporal"}},
                      {"decoder_spatio_temporal_scaling", {true, true}},
                      {"patch_size", 2}};
  j.update(extra);
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(j, "small");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

void Randomise(torch::nn::Module& m, uint64_t seed) {
  at::manual_seed(seed);
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(at::randn(p.sizes()) * 0.3);
}

TEST(LTX2Decoder, ParameterAndBufferNamesAreTheDiffusersKeys) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("ltx2"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::set<std::string> want_params, want_buffers;
  for (const auto& [name, view] : (*files)->tensors()) {
    (absl::StartsWith(name, "decoder.") ? want_params : want_buffers).insert(name);
  }
  absl::StatusOr<LTX2Config> config = LTX2Config::FromJson((*files)->config(), "ltx2");
  ASSERT_TRUE(config.ok()) << config.status();
  LTX2Decoder decoder(*config, "{}");
  std::set<std::string> params, buffers;
  for (const auto& item : decoder.module()->named_parameters()) params.insert(item.key());
  for (const auto& item : decoder.module()->named_buffers()) buffers.insert(item.key());
  EXPECT_EQ(params, want_params);
  EXPECT_EQ(want_params.size(), 38u);  // decoder.* (fixtures README)
  EXPECT_EQ(buffers, (std::set<std::string>{"latents_mean", "latents_std"}));
  EXPECT_EQ(buffers, want_buffers);
}

TEST(LTX2Decoder, LoadsTheDecoderOnlyFixtureAndDescribesIt) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("ltx2"));
  ASSERT_TRUE(files.ok()) << files.status();
  absl::StatusOr<std::unique_ptr<Decoder>> d = LoadLTX2(**files, {});
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelInfo& info = (*d)->info();
  EXPECT_EQ(info.family, "ltx2");
  EXPECT_EQ(info.diffusers_class, "AutoencoderKLLTX2Video");
  EXPECT_TRUE(info.is_video);
  EXPECT_EQ(info.spatial_factor, 32);
  EXPECT_EQ(info.temporal_factor, 8);
  EXPECT_EQ(info.stock_tile, 16);  // diffusers' 512-pixel tiles every 448 pixels
  EXPECT_EQ(info.stock_stride, 14);
  EXPECT_EQ((*d)->OutputShape({1, 128, 3, 2, 3}), (std::vector<int64_t>{1, 3, 17, 64, 96}));
}

TEST(LTX2Decoder, RawSpaceUsesTheWeightsStatistics) {
  LTX2Decoder decoder(SmallConfig({{"scaling_factor", 0.5}}), "{}");
  {
    at::NoGradGuard no_grad;
    decoder.module()->latents_mean.copy_(at::arange(8, at::kFloat));
    decoder.module()->latents_std.fill_(3.0f);
  }
  const at::Tensor z = decoder.ToVaeSpace(at::ones({1, 8, 2, 1, 1}));
  EXPECT_TRUE(z.equal((6.0f + at::arange(8, at::kFloat)).view({1, 8, 1, 1, 1}).expand({1, 8, 2, 1, 1})));
}

TEST(LTX2Decoder, ReflectPaddingNeedsTwoColumns) {
  LTX2Decoder decoder(SmallConfig({{"decoder_spatial_padding_mode", "reflect"}}), "{}");
  EXPECT_THAT(std::string(decoder.ValidateLatent(at::zeros({1, 8, 2, 3, 1})).message()),
              HasSubstr("width must be >= 2"));
  // A 1-row band of an exact decode is fine.
  EXPECT_TRUE(decoder.ValidateLatent(at::zeros({1, 8, 2, 1, 2})).ok());
  LTX2Decoder zeros(SmallConfig({{"decoder_spatial_padding_mode", "zeros"}}), "{}");
  EXPECT_TRUE(zeros.ValidateLatent(at::zeros({1, 8, 2, 1, 1})).ok());
}

TEST(LTX2Blocks, PerChannelRMSNormNormalisesEachPixelOverChannels) {
  const at::Tensor x = at::tensor({3.0f, 4.0f}).view({1, 2, 1, 1, 1});
  const at::Tensor y = PerChannelRMSNorm(x, 0.0);
  const float rms = std::sqrt(12.5f);
  EXPECT_TRUE(at::allclose(y.flatten(), at::tensor({3.0f / rms, 4.0f / rms})));
}

TEST(LTX2Blocks, CausalAndCentredTemporalPaddingReplicateEdgeFrames) {
  // A conv whose only tap is the first temporal one at the centre pixel:
  // output frame t is input frame t - 2 (causal) or t - 1 (centred),
  // clamped to the sequence by the replicated edge frames.
  LTX2VideoCausalConv3d conv(1, 1, 3, PaddingMode::kReflect);
  {
    at::NoGradGuard no_grad;
    conv->conv->weight.zero_();
    conv->conv->weight[0][0][0][1][1] = 1.0f;
    conv->conv->bias.zero_();
  }
  const at::Tensor x = at::arange(4, at::kFloat).view({1, 1, 4, 1, 1}).expand({1, 1, 4, 2, 2}).contiguous();
  DenseOps ops;
  const at::Tensor causal = conv->forward(x, ops, /*causal=*/true);
  const at::Tensor centred = conv->forward(x, ops, /*causal=*/false);
  EXPECT_TRUE(causal.select(3, 0).select(3, 0).flatten().equal(at::tensor({0.0f, 0.0f, 0.0f, 1.0f})));
  EXPECT_TRUE(centred.select(3, 0).select(3, 0).flatten().equal(at::tensor({0.0f, 0.0f, 1.0f, 2.0f})));
}

TEST(LTX2Blocks, UpsamplerIsDepthToSpaceDroppingTheFirstFrame) {
  // Identity-like conv (centre tap) from 8 input channels to 8·8/2 = 32: the
  // output of channel c·8 + i·4 + j·2 + k lands on frame 2t + i, row 2y + j,
  // column 2x + k of output channel c.
  LTX2VideoUpsampler3d up(8, std::vector<int64_t>{2, 2, 2}, /*residual=*/false, /*upscale_factor=*/2,
                          PaddingMode::kZeros);
  {
    at::NoGradGuard no_grad;
    up->conv->conv->weight.zero_();
    up->conv->conv->bias.copy_(at::arange(32, at::kFloat));
  }
  DenseOps ops;
  const at::Tensor y = up->forward(at::zeros({1, 8, 2, 1, 1}), ops, /*causal=*/false);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 4, 3, 2, 2}));
  // Frame 0 of the depth-to-space output (i = 0 of t = 0) was dropped: output
  // frame 1 is t = 1, i = 0.
  EXPECT_EQ(y[0][1][1][1][0].item<float>(), 8.0f + 0 * 4 + 1 * 2 + 0);
  EXPECT_EQ(y[0][3][0][0][1].item<float>(), 24.0f + 1 * 4 + 0 * 2 + 1);
}

TEST(LTX2Decoder, DecodesShapesAndZeroTimestepModulationIsTheUnconditionedDecoder) {
  LTX2Decoder plain(SmallConfig(), "{}");
  LTX2Decoder conditioned(SmallConfig({{"timestep_conditioning", true}}), "{}");
  Randomise(*plain.module(), 5);
  // Same conv weights; scale_shift_tables and time embedders zero, so every
  // modulation is x·(1 + 0) + 0.
  {
    at::NoGradGuard no_grad;
    auto mine = conditioned.module()->named_parameters();
    for (const auto& item : plain.module()->named_parameters()) mine[item.key()].copy_(item.value());
    for (auto& item : mine) {
      if (absl::StrContains(item.key(), "scale_shift_table") || absl::StrContains(item.key(), "time_embedder")) {
        item.value().zero_();
      }
    }
  }
  at::manual_seed(9);
  const at::Tensor z = at::randn({2, 8, 2, 3, 2});
  DenseOps ops;
  const at::Tensor a = plain.Decode(z, ops);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, 3, 1 + 4 * 1, 3 * 8, 2 * 8}));
  EXPECT_EQ(plain.OutputShape({2, 8, 2, 3, 2}), a.sizes().vec());
  EXPECT_TRUE(at::allclose(conditioned.Decode(z, ops), a, 0, 1e-6));
  // A shift in the final modulation moves the output.
  {
    at::NoGradGuard no_grad;
    conditioned.module()->decoder->scale_shift_table[0].fill_(0.5f);
  }
  EXPECT_FALSE(at::allclose(conditioned.Decode(z, ops), a, 0, 1e-3));
}

// A causal decoder streams: any chunking of a clip gives the whole decode's
// frames bit for bit (both step a latent frame at a time), at the stream's
// timestep, and they are the decoder run over the whole clip at once up to
// rounding. The released non-causal decoder says why it cannot.
TEST(LTX2Decoder, ACausalDecoderStreamsTheWholeClipAtItsTimestep) {
  LTX2Decoder causal(SmallConfig({{"decoder_causal", true}, {"timestep_conditioning", true}}), "{}");
  Randomise(*causal.module(), 6);
  ASSERT_TRUE(causal.CheckStreaming().ok());
  at::manual_seed(10);
  const at::Tensor z = at::randn({2, 8, 4, 3, 2});
  DecodeConditioning at_005;
  at_005.timestep = 0.05;
  DenseOps ops;
  const at::Tensor whole = causal.Decode(z, ops, at_005);
  EXPECT_EQ(whole.sizes(), (std::vector<int64_t>{2, 3, 1 + 4 * 3, 3 * 8, 2 * 8}));
  {
    at::NoGradGuard no_grad;
    const at::Tensor at_once = causal.module()->decoder->forward(z, ops, at::full({2}, 0.05));
    EXPECT_TRUE(at::allclose(whole, at_once, 1e-4, 1e-4))
        << (whole - at_once).abs().max();  // rounding: a wrong frame is O(1) off
  }
  EXPECT_FALSE(at::allclose(causal.Decode(z, ops), whole, 0, 1e-4)) << "the timestep changes nothing";
  for (const std::vector<int64_t>& chunks : std::vector<std::vector<int64_t>>{{1, 1, 1, 1}, {2, 2}, {3, 1}, {4}}) {
    std::unique_ptr<DecodeStream> stream = causal.OpenStream(at_005);
    ASSERT_NE(stream, nullptr);
    std::vector<at::Tensor> frames;
    int64_t begin = 0;
    for (int64_t t : chunks) {
      // The clip's last chunk, told so, keeps nothing for a next one.
      const bool clip_ends = begin + t == z.size(2) && chunks.size() > 2;
      frames.push_back(stream->DecodeChunk(z.narrow(2, begin, t), ops, clip_ends));
      begin += t;
      EXPECT_EQ(stream->latent_frames(), begin);
      if (clip_ends) {
        EXPECT_EQ(stream->state_bytes(), 0);
      } else {
        EXPECT_GT(stream->state_bytes(), 0);
      }
    }
    EXPECT_TRUE(at::cat(frames, 2).equal(whole)) << "chunks " << chunks.size();
  }
  LTX2Decoder released(SmallConfig(), "{}");
  EXPECT_THAT(std::string(released.CheckStreaming().message()), HasSubstr("decoder_causal false"));
  EXPECT_EQ(released.OpenStream(), nullptr);
}

TEST(LTX2Decoder, TimestepEmbeddingMatchesTheSinusoidalFormula) {
  const at::Tensor e = SinusoidalTimestepEmbedding(at::tensor({0.0f, 50.0f}), 256);
  ASSERT_EQ(e.sizes(), (std::vector<int64_t>{2, 256}));
  // cos first (flip_sin_to_cos): timestep 0 gives [1]*128 + [0]*128.
  EXPECT_TRUE(e[0].narrow(0, 0, 128).equal(at::ones({128})));
  EXPECT_TRUE(e[0].narrow(0, 128, 128).equal(at::zeros({128})));
  // Frequency i is exp(-ln(10000)·i/128).
  const double f = std::exp(-std::log(10000.0) * 5 / 128);
  EXPECT_NEAR(e[1][5].item<double>(), std::cos(50.0 * f), 1e-5);
  EXPECT_NEAR(e[1][128 + 5].item<double>(), std::sin(50.0 * f), 1e-5);
}

TEST(LTX2Decoder, TimestepConditionedParameterNames) {
  LTX2Decoder d(SmallConfig({{"timestep_conditioning", true}}), "{}");
  std::set<std::string> names;
  for (const auto& item : d.module()->named_parameters()) names.insert(item.key());
  for (const char* key : {"decoder.timestep_scale_multiplier", "decoder.scale_shift_table",
                          "decoder.time_embedder.timestep_embedder.linear_1.weight",
                          "decoder.time_embedder.timestep_embedder.linear_2.bias",
                          "decoder.mid_block.time_embedder.timestep_embedder.linear_1.weight",
                          "decoder.mid_block.resnets.0.scale_shift_table",
                          "decoder.up_blocks.1.time_embedder.timestep_embedder.linear_2.weight",
                          "decoder.up_blocks.1.resnets.0.scale_shift_table"}) {
    EXPECT_TRUE(names.count(key)) << key;
  }
  EXPECT_EQ(d.module()->decoder->timestep_scale_multiplier.item<float>(), 1000.0f);
}

TEST(LTX2Decoder, OneRowPerBandIsEnough) {
  const LTX2Decoder d(SmallConfig(), "{}");
  EXPECT_TRUE(d.CheckExactSharding({1, 8, 3, 2, 3}, 2).ok());
  EXPECT_FALSE(d.CheckExactSharding({1, 8, 3, 2, 3}, 3).ok());
  EXPECT_FALSE(d.CheckExactSharding({1, 8, 3, 5, 3}, 1).ok());
}

}  // namespace
}  // namespace vaedecode::families::ltx2
