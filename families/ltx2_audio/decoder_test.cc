#include "families/ltx2_audio/decoder.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
#include "formats/tensor_file.h"
#include "tests/fixtures/fixture_paths.h"
#include "worker/decode_job.h"

namespace vaedecode::families::ltx2_audio {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::map<std::string, std::vector<int64_t>> CheckpointShapes(const std::string& folder, bool decode_side) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(folder);
  EXPECT_TRUE(files.ok()) << files.status();
  std::map<std::string, std::vector<int64_t>> out;
  if (!files.ok()) return out;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (!decode_side || !absl::StartsWith(name, "encoder.")) out[name] = view->shape;
  }
  return out;
}

std::map<std::string, std::vector<int64_t>> ModuleShapes(torch::nn::Module& module) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().sizes().vec();
  for (const auto& item : module.named_buffers()) out[item.key()] = item.value().sizes().vec();
  return out;
}

TEST(LTX2AudioDecoder, ParametersAreTheDiffusersKeysOfTheVaeAndTheVocoder) {
  const std::string folder = testing::FixturePath("ltx2_audio");
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(folder);
  ASSERT_TRUE(files.ok()) << files.status();
  absl::StatusOr<LTX2AudioConfig> config = LTX2AudioConfig::FromJson((*files)->config(), "ltx2_audio");
  absl::StatusOr<std::unique_ptr<ModelFiles>> vocoder_files = ModelFiles::Open(folder + "/vocoder");
  ASSERT_TRUE(config.ok() && vocoder_files.ok());
  absl::StatusOr<LTX2VocoderConfig> vocoder = LTX2VocoderConfig::FromJson((*vocoder_files)->config(), "vocoder");
  ASSERT_TRUE(vocoder.ok()) << vocoder.status();
  LTX2AudioDecoder decoder(*config, *vocoder, "{}");
  EXPECT_EQ(ModuleShapes(*decoder.module()->vae), CheckpointShapes(folder, true));
  EXPECT_EQ(ModuleShapes(*decoder.module()->vocoder), CheckpointShapes(folder + "/vocoder", false));

  // The encoder side, and a snake vocoder's anti-aliased activations, by the same names.
  AudioEncoder encoder(*config);
  std::map<std::string, std::vector<int64_t>> encoder_keys;
  for (const auto& [name, shape] : CheckpointShapes(folder, false)) {
    if (absl::StartsWith(name, "encoder.")) encoder_keys[name.substr(8)] = shape;
  }
  EXPECT_EQ(ModuleShapes(*encoder), encoder_keys);
  LTX2VocoderConfig snake = *vocoder;
  snake.act_fn = "snakebeta";
  snake.antialias = true;
  const std::map<std::string, std::vector<int64_t>> keys = ModuleShapes(*Vocoder(snake));
  EXPECT_EQ(keys.at("resnets.0.acts1.0.upsample.filter"), (std::vector<int64_t>{1, 1, 12}));
  EXPECT_EQ(keys.at("resnets.0.acts2.2.act.beta"), (std::vector<int64_t>{16}));
  EXPECT_EQ(keys.at("act_out.downsample.filter"), (std::vector<int64_t>{1, 1, 12}));
}

// mel_bins null: the mel keeps the latent's bins, which the vocoder must
// take for a waveform, but not for the mel alone.
TEST(LTX2AudioDecoder, OnlyAWaveformNeedsBinsTheVocoderTakes) {
  const std::string folder = testing::FixturePath("ltx2_audio");
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(folder);
  absl::StatusOr<std::unique_ptr<ModelFiles>> vocoder_files = ModelFiles::Open(folder + "/vocoder");
  ASSERT_TRUE(files.ok() && vocoder_files.ok());
  absl::StatusOr<LTX2AudioConfig> config = LTX2AudioConfig::FromJson((*files)->config(), "ltx2_audio");
  absl::StatusOr<LTX2VocoderConfig> vocoder = LTX2VocoderConfig::FromJson((*vocoder_files)->config(), "vocoder");
  ASSERT_TRUE(config.ok() && vocoder.ok());
  config->mel_bins = 0;
  LTX2AudioDecoder decoder(*config, *vocoder, "{}");
  const int64_t fitting = vocoder->in_channels / config->output_channels;
  const at::Tensor fits = at::zeros({1, config->latent_channels, 3, fitting});
  const at::Tensor other = at::zeros({1, config->latent_channels, 3, fitting + 1});
  EXPECT_TRUE(decoder.ValidateLatentFor(fits, {}).ok());
  const absl::Status refused = decoder.ValidateLatentFor(other, {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("the vocoder takes"));
  DecodeConditioning mel;
  mel.mel_spectrogram = true;
  EXPECT_TRUE(decoder.ValidateLatentFor(other, mel).ok());
  EXPECT_EQ(decoder.OutputShapeFor(other.sizes().vec(), mel),
            (std::vector<int64_t>{1, config->output_channels, config->MelFrames(3), fitting + 1}));
}

TEST(LTX2AudioDecoder, DecodesToTheWaveformOrOnRequestTheMel) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("ltx2_audio"), {});
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelInfo& info = (*d)->info();
  EXPECT_TRUE(info.is_audio);
  EXPECT_EQ(info.sample_rate, 24000);
  EXPECT_EQ(info.samples_per_latent, 960);
  EXPECT_EQ(info.out_channels, 2);
  EXPECT_EQ((*d)->OutputShape({1, 4, 6, 2}), (std::vector<int64_t>{1, 2, 5040}));
  EXPECT_EQ((*d)->OutputShape({1, 6, 8}), (std::vector<int64_t>{1, 2, 5040}));  // packed
  EXPECT_TRUE(BuiltinFamilies().DecodesAudio(testing::FixturePath("ltx2_audio")).value_or(false));

  EXPECT_TRUE((*d)->ValidateLatent(at::zeros({1, 4, 3, 2})).ok());
  EXPECT_TRUE((*d)->ValidateLatent(at::zeros({1, 3, 8})).ok());
  EXPECT_THAT(std::string((*d)->ValidateLatent(at::zeros({1, 8, 3, 2})).message()), HasSubstr("expects 4"));
  EXPECT_THAT(std::string((*d)->ValidateLatent(at::zeros({1, 3, 7})).message()),
              HasSubstr("not a multiple of AutoencoderKLLTX2Audio's 4 latent channels"));
  EXPECT_THAT(std::string((*d)->ValidateLatent(at::zeros({1, 4, 3})).message()), HasSubstr("latent channels"));
  EXPECT_THAT(std::string((*d)->ValidateLatent(at::zeros({1, 4, 3, 2, 1})).message()),
              HasSubstr("must be 4-D [B, C, L, M]"));
  EXPECT_EQ((*d)->CheckStreaming().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE((*d)->CheckExactSharding({1, 4, 8, 2}, 2).ok());

  absl::StatusOr<at::Tensor> latent =
      formats::ReadTensorFile(testing::FixturePath("ltx2_audio/latent.safetensors"), "latent");
  absl::StatusOr<at::Tensor> mel =
      formats::ReadTensorFile(testing::FixturePath("ltx2_audio/expected.safetensors"), "sample");
  ASSERT_TRUE(latent.ok() && mel.ok());
  DenseOps ops;
  worker::DecodeJob job{*latent, LatentSpace::kVae};
  job.conditioning.mel_spectrogram = true;
  absl::StatusOr<at::Tensor> decoded = worker::RunDecode(**d, job, ops);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_LE((*decoded - *mel).abs().max().item<double>(), 1e-4);
  // The packed layout decodes the same.
  job.latent = latent->transpose(1, 2).flatten(2, 3);
  absl::StatusOr<at::Tensor> packed = worker::RunDecode(**d, job, ops);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_TRUE(packed->equal(*decoded));
}

// A scratch copy of the fixture in the layout `layout` names.
std::string Layout(const std::string& name, bool vocoder_inside, bool vocoder_beside) {
  const fs::path root = fs::path(std::getenv("TEST_TMPDIR")) / name;
  fs::remove_all(root);
  const fs::path vae = root / "audio_vae";
  fs::create_directories(vae);
  const fs::path fixture = testing::FixturePath("ltx2_audio");
  fs::create_symlink(fixture / "config.json", vae / "config.json");
  fs::create_symlink(fixture / "diffusion_pytorch_model.safetensors", vae / "diffusion_pytorch_model.safetensors");
  if (vocoder_inside) fs::create_directory_symlink(fixture / "vocoder", vae / "vocoder");
  if (vocoder_beside) fs::create_directory_symlink(fixture / "vocoder", root / "vocoder");
  return vae.string();
}

TEST(LTX2AudioDecoder, FindsTheVocoderBesideTheVaeAsLTX2ShipsItOrDecodesToTheMel) {
  absl::StatusOr<std::unique_ptr<Decoder>> beside = BuiltinFamilies().Load(Layout("beside", false, true), {});
  ASSERT_TRUE(beside.ok()) << beside.status();
  EXPECT_EQ((*beside)->info().sample_rate, 24000);
  // As a shell completes the folder's name: with a trailing slash.
  absl::StatusOr<std::unique_ptr<Decoder>> slash = BuiltinFamilies().Load(Layout("slash", false, true) + "/", {});
  ASSERT_TRUE(slash.ok()) << slash.status();
  EXPECT_EQ((*slash)->info().sample_rate, 24000);
  EXPECT_EQ((*beside)->OutputShape({2, 4, 4, 2}), (std::vector<int64_t>{2, 2, 3120}));

  absl::StatusOr<std::unique_ptr<Decoder>> none = BuiltinFamilies().Load(Layout("none", false, false), {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ((*none)->info().sample_rate, 0);
  EXPECT_THAT((*none)->info().decode_note, HasSubstr("decodes to the mel spectrogram"));
  EXPECT_EQ((*none)->OutputShape({2, 4, 4, 2}), (std::vector<int64_t>{2, 2, 13, 8}));
  DenseOps ops;
  absl::StatusOr<at::Tensor> mel = worker::RunDecode(**none, {at::zeros({1, 4, 2, 2})}, ops);
  ASSERT_TRUE(mel.ok()) << mel.status();
  EXPECT_EQ(mel->sizes(), (c10::IntArrayRef{1, 2, 5, 8}));

  // LTX-2.3's bandwidth-extension vocoder is another class: refused by name.
  const std::string vae = Layout("bwe", false, false);
  const fs::path vocoder = fs::path(vae).parent_path() / "vocoder";
  fs::create_directories(vocoder);
  std::ofstream(vocoder / "config.json") << R"({"_class_name": "LTX2VocoderWithBWE"})";
  absl::StatusOr<std::unique_ptr<Decoder>> bwe = BuiltinFamilies().Load(vae, {});
  ASSERT_FALSE(bwe.ok());
  EXPECT_THAT(std::string(bwe.status().message()), HasSubstr("bandwidth-extension vocoder is not supported"));
}

}  // namespace
}  // namespace vaedecode::families::ltx2_audio
