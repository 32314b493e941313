#include "families/minimax_h3_audio/config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::minimax_h3_audio {
namespace {

int64_t Product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

}  // namespace

int64_t MiniMaxH3AudioConfig::hop() const { return Product(decoder_rates); }

absl::Status MiniMaxH3AudioConfig::CheckEncoder() const {
  const int64_t stages = static_cast<int64_t>(encoder_rates.size());
  if (encoder_dim < 1 || stages >= 24 || encoder_dim > ((int64_t{1} << 24) >> stages)) {
    return absl::InvalidArgumentError(
        absl::StrCat("encoder_dim ", encoder_dim, " doubled by ", stages, " encoder stages is not a width"));
  }
  if (num_attention_heads < 1 || latent_dim % num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the pre_block's ", num_attention_heads,
                                                   " attention heads do not divide latent_dim ", latent_dim));
  }
  return absl::OkStatus();
}

int64_t MiniMaxH3AudioConfig::Samples(int64_t latent_frames) const {
  int64_t length = latent_frames;
  for (size_t i = 0; i < decoder_rates.size(); ++i) {
    const int64_t r = decoder_rates[i], k = decoder_kernel_sizes[i];
    length = (length - 1) * r - 2 * ((k - r) / 2) + k;  // ConvTranspose1d's output length
  }
  return length;
}

absl::StatusOr<MiniMaxH3AudioConfig> MiniMaxH3AudioConfig::FromJson(const nlohmann::json& json,
                                                                    const std::string& source) {
  ConfigReader r(json, source);
  MiniMaxH3AudioConfig c;
  c.encoder_dim = r.Int("encoder_dim", c.encoder_dim);
  c.num_attention_heads = r.Int("num_attention_heads", c.num_attention_heads);
  c.encoder_rates = r.IntList("encoder_rates", c.encoder_rates);
  c.latent_dim = r.Int("latent_dim", c.latent_dim);
  c.latent_channels = r.Int("latent_channels", c.latent_channels);
  c.decoder_dim = r.Int("decoder_dim", c.decoder_dim);
  c.decoder_rates = r.IntList("decoder_rates", c.decoder_rates);
  c.decoder_kernel_sizes = r.IntList("decoder_kernel_sizes", c.decoder_kernel_sizes);
  c.resblock_kernel_sizes = r.IntList("resblock_kernel_sizes", c.resblock_kernel_sizes);
  c.sampling_rate = r.Int("sampling_rate", c.sampling_rate);
  c.latents_mean = r.OptionalDoubleList("latents_mean").value_or(std::vector<double>{});
  c.latents_std = r.OptionalDoubleList("latents_std").value_or(std::vector<double>{});
  c.resblock_dilation_sizes = r.IntLists("resblock_dilation_sizes", c.resblock_dilation_sizes);
  RETURN_IF_ERROR(r.status());

  auto positive = [](const std::vector<int64_t>& v) {
    for (int64_t x : v) {
      if (x < 1) return false;
    }
    return !v.empty();
  };
  if (!positive(c.encoder_rates) || !positive(c.decoder_rates) || !positive(c.decoder_kernel_sizes) ||
      !positive(c.resblock_kernel_sizes)) {
    r.Fail("the rates and kernel sizes must be non-empty lists of positive integers");
  }
  if (Product(c.decoder_rates) != Product(c.encoder_rates)) {
    r.Fail(absl::StrCat("decoder_rates must upsample by the encoder hop length ", Product(c.encoder_rates), ", got ",
                        Product(c.decoder_rates)));
  }
  if (c.decoder_kernel_sizes.size() != c.decoder_rates.size()) {
    r.Fail(absl::StrCat("decoder_kernel_sizes has ", c.decoder_kernel_sizes.size(), " entries for ",
                        c.decoder_rates.size(), " decoder_rates"));
  }
  if (c.resblock_dilation_sizes.size() != c.resblock_kernel_sizes.size()) {
    r.Fail(absl::StrCat("resblock_dilation_sizes has ", c.resblock_dilation_sizes.size(), " entries for ",
                        c.resblock_kernel_sizes.size(), " resblock_kernel_sizes"));
  }
  for (const std::vector<int64_t>& d : c.resblock_dilation_sizes) {
    if (!positive(d)) r.Fail("every resblock_dilation_sizes entry must be a non-empty list of positive integers");
  }
  if (c.latent_channels < 1 || c.latent_dim < 1 || c.latent_dim % c.latent_channels != 0) {
    r.Fail(absl::StrCat("latent_dim (", c.latent_dim, ") must be a positive multiple of latent_channels (",
                        c.latent_channels, ")"));
  }
  const int64_t halvings = static_cast<int64_t>(c.decoder_rates.size());
  if (c.decoder_dim < 1 || halvings >= 63 || (c.decoder_dim >> halvings) < 1) {
    r.Fail(absl::StrCat("decoder_dim ", c.decoder_dim, " cannot be halved by ", halvings, " upsamplers"));
  }
  for (size_t i = 0; i < c.decoder_kernel_sizes.size() && i < c.decoder_rates.size(); ++i) {
    // ConvTranspose1d(k, stride=rate, padding=(k - rate) // 2): a negative padding cannot be built.
    if (c.decoder_kernel_sizes[i] < c.decoder_rates[i]) {
      r.Fail(absl::StrCat("upsampler ", i, ": kernel ", c.decoder_kernel_sizes[i], " is shorter than its rate ",
                          c.decoder_rates[i]));
    }
  }
  for (size_t j = 0; j < c.resblock_kernel_sizes.size(); ++j) {
    // Every AMP block has an undilated conv padded (k - 1) // 2: an even k
    // shortens the signal, and diffusers' residual add fails.
    if (c.resblock_kernel_sizes[j] % 2 == 0) {
      r.Fail(absl::StrCat("AMP block ", j, ": kernel ", c.resblock_kernel_sizes[j],
                          " is even, which changes the length; diffusers' residual cannot add it"));
    }
  }
  if (c.sampling_rate < 1) r.Fail("\"sampling_rate\" must be positive");
  if (!c.latents_mean.empty() || !c.latents_std.empty()) {
    if (static_cast<int64_t>(c.latents_mean.size()) != c.latent_channels ||
        static_cast<int64_t>(c.latents_std.size()) != c.latent_channels) {
      r.Fail(absl::StrCat("\"latents_mean\"/\"latents_std\" must have latent_channels (", c.latent_channels,
                          ") entries, got ", c.latents_mean.size(), "/", c.latents_std.size()));
    }
  }
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::minimax_h3_audio
