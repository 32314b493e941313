#pragma once

// The strict loader of a ModuleBackedEncoder family (the encode-side twin of
// module_decoder.h's LoadModuleDecoder): EncoderT::Config::FromJson on the
// folder's config, EncoderT(config), then every parameter of
// its module from the checkpoint, keys matched by `ignore` (the decoder
// side) skipped.

#include <memory>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/model_files.h"
#include "families/registry.h"
#include "families/status_error.h"
#include "families/weight_loading.h"
#include "rpc/status_macros.h"

namespace vaedecode::families {

// `config`, or a StatusError thrown when config.CheckEncoder() says
// diffusers cannot build or run its encoder: for an encoder constructor's
// member initialisers (Registry::LoadEncoder turns the throw into the status).
template <typename ConfigT>
const ConfigT& EncodableConfig(const ConfigT& config) {
  if (absl::Status s = config.CheckEncoder(); !s.ok()) throw StatusError(s);
  return config;
}

template <typename EncoderT>
absl::StatusOr<std::unique_ptr<Encoder>> LoadModuleEncoder(const ModelFiles& files, const LoadOptions& options,
                                                           const IgnoreRules& ignore) {
  ASSIGN_OR_RETURN(typename EncoderT::Config config, EncoderT::Config::FromJson(files.config(), files.config_path()));
  auto encoder = std::make_unique<EncoderT>(std::move(config));
  RETURN_IF_ERROR(FillWeights(encoder->parameters_module(), files, ignore, options));
  return encoder;
}

}  // namespace vaedecode::families
