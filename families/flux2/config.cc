#include "families/flux2/config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::flux2 {

std::string Flux2Config::ToJson() const {
  nlohmann::json j = nlohmann::json::parse(decoder.ToJson());
  j["_class_name"] = "AutoencoderKLFlux2";
  j.erase("scaling_factor");
  j.erase("shift_factor");
  j.erase("latents_mean");
  j.erase("latents_std");
  j["decoder_block_out_channels"] = decoder.block_out_channels;
  j["batch_norm_eps"] = batch_norm_eps;
  j["patch_size"] = {patch_h, patch_w};
  return j.dump(2);
}

absl::StatusOr<Flux2Config> Flux2Config::FromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  Flux2Config c;
  c.batch_norm_eps = r.Double("batch_norm_eps", c.batch_norm_eps);
  const std::vector<int64_t> patch = r.IntList("patch_size", {2, 2});
  if (patch.size() == 2) {
    c.patch_h = patch[0];
    c.patch_w = patch[1];
  }
  if (patch != std::vector<int64_t>{2, 2}) {
    // Flux2Pipeline._unpatchify_latents hard-codes 2x2 patches.
    r.Fail(absl::StrCat("\"patch_size\" [", absl::StrJoin(patch, ", "),
                        "] is not supported (FLUX.2's pipeline packs 2x2 patches)"));
  }
  if (!(c.batch_norm_eps >= 0)) r.Fail("\"batch_norm_eps\" must be >= 0");
  const std::optional<std::vector<int64_t>> decoder_widths = r.OptionalIntList("decoder_block_out_channels");
  const std::vector<int64_t> widths = r.IntList("block_out_channels", {128, 256, 512, 512});
  RETURN_IF_ERROR(r.status());

  // The decoder is diffusers' VAE Decoder with these constructor arguments;
  // AutoencoderKLConfig parses and validates them (FLUX.2's defaults differ).
  nlohmann::json decoder = json;
  decoder["block_out_channels"] = decoder_widths.value_or(widths);
  if (!json.contains("latent_channels") || json["latent_channels"].is_null()) decoder["latent_channels"] = 32;
  if (!json.contains("layers_per_block") || json["layers_per_block"].is_null()) decoder["layers_per_block"] = 2;
  if (!json.contains("norm_num_groups") || json["norm_num_groups"].is_null()) decoder["norm_num_groups"] = 32;
  if (!json.contains("sample_size") || json["sample_size"].is_null()) decoder["sample_size"] = 1024;
  // FLUX.2's VAE has no latent scaling of its own: the BatchNorm statistics
  // take that role in the pipeline.
  decoder["scaling_factor"] = 1.0;
  decoder["shift_factor"] = nullptr;
  decoder["latents_mean"] = nullptr;
  decoder["latents_std"] = nullptr;
  ASSIGN_OR_RETURN(autoencoder_kl::AutoencoderKLConfig parsed,
                   autoencoder_kl::AutoencoderKLConfig::FromJson(decoder, source));
  c.decoder = std::move(parsed);
  decoder["block_out_channels"] = widths;
  ASSIGN_OR_RETURN(c.encoder, autoencoder_kl::AutoencoderKLConfig::FromJson(decoder, source));
  // Unread here and by the decoder's reader; batch_norm_momentum only trains.
  r.Known({"batch_norm_momentum"});
  for (const std::string& key : r.UnreadKeys()) {
    const std::vector<std::string>& also = c.decoder.unread_keys;
    if (std::find(also.begin(), also.end(), key) != also.end()) c.unread_keys.push_back(key);
  }
  return c;
}

}  // namespace vaedecode::families::flux2
