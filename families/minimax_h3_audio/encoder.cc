#include "families/minimax_h3_audio/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/input_checks.h"
#include "families/module_encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::minimax_h3_audio {
namespace {

constexpr const char* kClass = "AutoencoderKLMiniMaxH3Audio";

EncoderInfo Describe(const MiniMaxH3AudioConfig& c) {
  EncoderInfo info;
  info.family = "minimax_h3_audio";
  info.diffusers_class = kClass;
  info.in_channels = 1;
  info.latent_channels = c.latent_channels;
  info.computes_in_float32 = true;
  info.is_audio = true;
  info.vae_to_raw_formula = "(z - latents_mean) / latents_std per channel";
  return info;
}

int64_t Latents(const MiniMaxH3AudioConfig& c, int64_t samples) { return (samples + c.hop() - 1) / c.hop(); }

}  // namespace

MiniMaxH3AudioEncodeModuleImpl::MiniMaxH3AudioEncodeModuleImpl(const MiniMaxH3AudioConfig& c) {
  encoder = register_module("encoder", MakeDacEncoder(c));
  pre_block = register_module("pre_block", AttnProjection(c.latent_dim, c.latent_channels, c.num_attention_heads));
  mean_proj = register_module("mean_proj",
                              torch::nn::Conv1d(torch::nn::Conv1dOptions(c.latent_channels, c.latent_channels, 1)));
  logs_proj = register_module("logs_proj",
                              torch::nn::Conv1d(torch::nn::Conv1dOptions(c.latent_channels, c.latent_channels, 1)));
}

MiniMaxH3AudioEncoder::MiniMaxH3AudioEncoder(MiniMaxH3AudioConfig config)
    : ModuleBackedEncoder(Describe(config)), config_(std::move(config)), module_(EncodableConfig(config_)) {
  AdoptModule(*module_);
}

absl::Status MiniMaxH3AudioEncoder::ValidateImage(const at::Tensor& waveform) const {
  InputRule rule{"waveform", kClass, "encodes", 1};
  rule.is_audio = true;
  return CheckInputTensor(waveform, rule);
}

std::vector<int64_t> MiniMaxH3AudioEncoder::LatentShape(const std::vector<int64_t>& shape) const {
  return {shape[0], config_.latent_channels, Latents(config_, shape[2])};
}

at::Tensor MiniMaxH3AudioEncoder::Moments(const at::Tensor& waveform, LayerOps&) {
  at::NoGradGuard no_grad;
  // Right-padded with zeros to whole hops, as encode() does.
  const int64_t padded = Latents(config_, waveform.size(2)) * config_.hop();
  const at::Tensor x = at::constant_pad_nd(waveform.to(at::kFloat), {0, padded - waveform.size(2)}, 0);
  const at::Tensor trunk = module_->encoder->forward(x.contiguous());                       // [B, latent_dim, L]
  const at::Tensor h = module_->pre_block->forward(trunk.transpose(1, 2)).transpose(1, 2);  // [B, C, L]
  // The log standard deviation as a log-variance (x2 is exact), so DiagonalGaussian's std is exp(logs).
  return at::cat({module_->mean_proj->forward(h), module_->logs_proj->forward(h) * 2.0}, 1);
}

absl::Status MiniMaxH3AudioEncoder::CheckRawLatentShape(const std::vector<int64_t>&) const {
  if (config_.latents_mean.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kClass, "'s config has no latents_mean/latents_std: its latents have no raw space"));
  }
  return absl::OkStatus();
}

at::Tensor MiniMaxH3AudioEncoder::ToRawSpace(const at::Tensor& latent) const {
  const int64_t c = config_.latent_channels;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(latent.device());
  const at::Tensor mean = at::tensor(config_.latents_mean, at::kDouble).to(fp32).view({1, c, 1});
  const at::Tensor std = at::tensor(config_.latents_std, at::kDouble).to(fp32).view({1, c, 1});
  return (latent.to(at::kFloat) - mean) / std;
}

std::vector<RowLevel> MiniMaxH3AudioEncoder::RowLevels(int64_t input_rows) const {
  return {RowLevel{input_rows, 1}};  // one level: never sharded (CheckExactSharding)
}

absl::StatusOr<std::unique_ptr<Encoder>> LoadMiniMaxH3AudioEncoder(const ModelFiles& files,
                                                                   const LoadOptions& options) {
  // encode() never reads the decoder side.
  return LoadModuleEncoder<MiniMaxH3AudioEncoder>(files, options, {{"decoder.", "dec_in_proj."}, {}});
}

}  // namespace vaedecode::families::minimax_h3_audio
