#pragma once

// Maps a diffusers config's "_class_name" to the family that loads it.
//
// Families register explicitly (builtin_families.h), not through static
// initialisers, so linking order can never drop one. A Registry is filled at
// start-up and read-only afterwards; reads are thread-safe then.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/encoder.h"
#include "families/model_files.h"
#include "families/weight_loading.h"

namespace vaedecode::families {

struct LoadOptions {
  // The dtype asked for; the decoder runs in DecodeDtype(info, dtype)
  // (float32 for float16 requests of force_upcast VAEs).
  at::ScalarType dtype = at::kFloat;
  // Set: parameters are seeded random values (SeedParameters) and the
  // checkpoint is not read, so a folder with config.json alone loads: the
  // real architecture for benchmarks, without its weights.
  std::optional<uint64_t> seeded_weights;
};

// Builds a family's decoder in float32 from `files`, its parameters filled
// by FillWeights; Registry::Load converts it to the requested dtype.
using DecoderFactory =
    std::function<absl::StatusOr<std::unique_ptr<Decoder>>(const ModelFiles& files, const LoadOptions& options)>;

// The same for a family's encode side (encoder.*, quant_conv.*, and what
// its pipeline's normalisation reads), loaded only when a model encodes.
using EncoderFactory =
    std::function<absl::StatusOr<std::unique_ptr<Encoder>>(const ModelFiles& files, const LoadOptions& options)>;

// A factory's weights: strictly from the checkpoint (LoadStrict, with the
// family's ignore rules), or seeded when options.seeded_weights is set.
absl::Status FillWeights(torch::nn::Module& module, const ModelFiles& files, const IgnoreRules& ignore,
                         const LoadOptions& options);

// What a lineage's decoder-side checkpoint keys have that the others' lack.
// A checkpoint matches a signature when it has every `present` key (with the
// given rank, when not 0) and none of the `absent` ones.
struct KeySignature {
  std::vector<std::string> classes;                     // the diffusers classes such checkpoints come from
  std::vector<std::pair<std::string, size_t>> present;  // key, rank (0: any)
  std::vector<std::string> absent;
};

struct FamilyRegistration {
  std::string family;                          // e.g. "autoencoder_kl"
  std::vector<std::string> diffusers_classes;  // config "_class_name" values it accepts
  DecoderFactory factory;
  // How its checkpoints are recognised (ClassesWithKeysLike).
  std::vector<KeySignature> signatures;
  // Null for a family that has no encoder yet.
  EncoderFactory encoder_factory;
  // An audio VAE: its latents decode to waveforms (ModelInfo::is_audio).
  bool audio = false;
};

class Registry {
 public:
  void Register(FamilyRegistration registration);

  // The family for a diffusers class name, or nullptr.
  const FamilyRegistration* FindByClass(const std::string& diffusers_class) const;
  std::vector<std::string> SupportedClasses() const;

  // Opens a model folder and builds its decoder: NOT_FOUND for a missing
  // folder, INVALID_ARGUMENT for an unsupported class or malformed files.
  absl::StatusOr<std::unique_ptr<Decoder>> Load(const std::string& path, const LoadOptions& options) const;

  // Whether the model folder's class is an audio VAE's (from its config
  // alone; the weights are not read). Errors as Load's.
  absl::StatusOr<bool> DecodesAudio(const std::string& path) const;

  // Opens a model folder and builds its encoder, in float32 or
  // options.dtype: as Load, and FAILED_PRECONDITION for a family without an
  // encoder or a checkpoint without encoder weights (a decoder-only file).
  absl::StatusOr<std::unique_ptr<Encoder>> LoadEncoder(const std::string& path, const LoadOptions& options) const;

  // The diffusers classes whose checkpoints have tensor names like
  // `tensors` (decoder-side keys only each lineage has, e.g. FLUX.2's
  // `bn.running_mean`; the registered families' signatures), or empty when
  // none is recognised. Wan and Qwen-Image checkpoints look alike, so a guess
  // may name several classes. Load adds the guess to a failed load's error
  // when the config names another class (a config from one model next to
  // weights from another).
  std::vector<std::string> ClassesWithKeysLike(const std::map<std::string, const formats::TensorView*>& tensors) const;

 private:
  // The folder's files and its family, or why neither.
  absl::StatusOr<std::pair<std::unique_ptr<ModelFiles>, const FamilyRegistration*>> Open(
      const std::string& path, const LoadOptions& options) const;

  std::vector<FamilyRegistration> families_;
};

// Checks that `dtype` is a decoder dtype (float32, bfloat16, float16; LibTorch
// 2.x runs all three on CPUs and GPUs).
absl::Status CheckDtypeSupported(at::ScalarType dtype);

}  // namespace vaedecode::families
