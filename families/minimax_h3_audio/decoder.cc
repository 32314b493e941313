#include "families/minimax_h3_audio/decoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/input_checks.h"
#include "families/minimax_h3_audio/encoder.h"
#include "families/status_error.h"

namespace vaedecode::families::minimax_h3_audio {
namespace {

ModelInfo Describe(const MiniMaxH3AudioConfig& c, std::string config_json) {
  ModelInfo info;
  info.family = "minimax_h3_audio";
  info.diffusers_class = "AutoencoderKLMiniMaxH3Audio";
  info.config_json = std::move(config_json);
  info.unread_config_keys = c.unread_keys;
  info.latent_channels = c.latent_channels;
  info.out_channels = 1;  // mono; stereo is a batch of 2
  info.is_audio = true;
  info.sample_rate = c.sampling_rate;
  info.samples_per_latent = c.hop();
  info.spatial_tiling = false;
  info.raw_to_vae_formula = "z * latents_std + latents_mean";
  return info;
}

}  // namespace

MiniMaxH3AudioModuleImpl::MiniMaxH3AudioModuleImpl(const MiniMaxH3AudioConfig& c) {
  dec_in_proj =
      register_module("dec_in_proj", torch::nn::Conv1d(torch::nn::Conv1dOptions(c.latent_channels, c.latent_dim, 1)));
  decoder = register_module("decoder", BigVGANDecoder(c));
}

MiniMaxH3AudioDecoder::MiniMaxH3AudioDecoder(MiniMaxH3AudioConfig config, std::string config_json)
    : ModuleDecoder(MiniMaxH3AudioModule(config), Describe(config, std::move(config_json)), /*latent_halo_rows=*/0),
      config_(std::move(config)) {}

absl::Status MiniMaxH3AudioDecoder::ValidateLatent(const at::Tensor& latent) const {
  InputRule rule{"latent", info().diffusers_class, "expects", config_.latent_channels};
  rule.is_audio = true;
  return CheckInputTensor(latent, rule);
}

std::vector<int64_t> MiniMaxH3AudioDecoder::OutputShape(const std::vector<int64_t>& latent_shape) const {
  return {latent_shape[0], 1, config_.Samples(latent_shape[2])};
}

at::Tensor MiniMaxH3AudioDecoder::ToVaeSpace(const at::Tensor& raw) const {
  // No statistics, no raw space: the request's fault.
  if (config_.latents_mean.empty()) {
    throw StatusError(absl::InvalidArgumentError(
        "latent_space: AutoencoderKLMiniMaxH3Audio's config has no latents_mean/latents_std: its latents have no raw "
        "space (send latent_space VAE)"));
  }
  const int64_t c = config_.latent_channels;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(raw.device());
  // MiniMaxH3AudioDecodeStep: latents * std + mean, the statistics viewed (1, C, 1) in float32.
  const at::Tensor mean = at::tensor(config_.latents_mean, at::kDouble).to(fp32).view({1, c, 1});
  const at::Tensor std = at::tensor(config_.latents_std, at::kDouble).to(fp32).view({1, c, 1});
  return raw.to(at::kFloat) * std + mean;
}

at::Tensor MiniMaxH3AudioDecoder::Decode(const at::Tensor& z, LayerOps&) {
  at::NoGradGuard no_grad;
  return module_->decoder->forward(module_->dec_in_proj->forward(z.to(at::kFloat)));  // [B, 1, samples]
}

void Register(Registry& registry) {
  registry.Register(
      {"minimax_h3_audio",
       {"AutoencoderKLMiniMaxH3Audio"},
       [](const ModelFiles& files, const LoadOptions& options) {
         // The encoder side (encoder, pre_block, the posterior heads) is never read by decode.
         return LoadModuleDecoder<MiniMaxH3AudioDecoder>(files, options,
                                                         {{"encoder.", "pre_block.", "mean_proj.", "logs_proj."}, {}});
       },
       {{{"AutoencoderKLMiniMaxH3Audio"}, {{"dec_in_proj.weight", 3}, {"decoder.conv_pre.weight_v", 3}}, {}}},
       &LoadMiniMaxH3AudioEncoder,
       /*audio=*/true});
}

}  // namespace vaedecode::families::minimax_h3_audio
