#include "formats/tensor_file.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <exception>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/file_io.h"
#include "formats/npy.h"
#include "formats/png.h"
#include "rpc/status_macros.h"

namespace vaedecode::formats {
namespace {

constexpr std::string_view kSafetensorsExt = ".safetensors";
constexpr std::string_view kNpyExt = ".npy";
// Error messages list at most this many tensor names.
constexpr size_t kMaxListedNames = 16;

bool IsFloating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF64;
}

// The first line of a LibTorch exception, without its backtrace.
std::string ExceptionText(const std::exception& e) {
  std::string_view text = e.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    text = c10_error->what_without_backtrace();
  }
  return QuoteForError(text.substr(0, text.find('\n')));
}

// Copies raw little-endian element bytes into a new CPU tensor.
absl::StatusOr<at::Tensor> MakeTensor(const std::string& label, std::string_view tensor_name, DType dtype,
                                      const std::vector<int64_t>& shape, const void* data, size_t nbytes) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(
        Cat(label, ": ", tensor_name, "latent must be a floating tensor, got ", DTypeName(dtype)));
  }
  ASSIGN_OR_RETURN(at::ScalarType type, ToScalarType(dtype));
  try {
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type).device(at::kCPU));
    if (nbytes != static_cast<size_t>(t.numel()) * t.element_size()) {
      return absl::InternalError(Cat(label, ": tensor size mismatch"));
    }
    if (nbytes > 0) std::memcpy(t.data_ptr(), data, nbytes);
    return t;
  } catch (const std::exception& e) {
    return absl::InternalError(Cat(label, ": ", ExceptionText(e)));
  }
}

std::string PngStem(const std::string& path) {
  if (path.size() >= 4 && absl::EqualsIgnoreCase(absl::string_view(path).substr(path.size() - 4), ".png")) {
    return path.substr(0, path.size() - 4);
  }
  return path;
}

}  // namespace

absl::StatusOr<at::ScalarType> ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return at::kDouble;
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kI64:
      return at::kLong;
    case DType::kI32:
      return at::kInt;
    case DType::kI16:
      return at::kShort;
    case DType::kI8:
      return at::kChar;
    case DType::kU8:
      return at::kByte;
    case DType::kBool:
      return at::kBool;
    case DType::kU64:
      return at::kUInt64;
    case DType::kU32:
      return at::kUInt32;
    case DType::kU16:
      return at::kUInt16;
  }
  return absl::InvalidArgumentError(Cat("dtype ", DTypeName(dtype), " has no LibTorch scalar type"));
}

absl::StatusOr<DType> FromScalarType(at::ScalarType type) {
  switch (type) {
    case at::kDouble:
      return DType::kF64;
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kLong:
      return DType::kI64;
    case at::kInt:
      return DType::kI32;
    case at::kShort:
      return DType::kI16;
    case at::kChar:
      return DType::kI8;
    case at::kByte:
      return DType::kU8;
    case at::kUInt16:
      return DType::kU16;
    case at::kUInt32:
      return DType::kU32;
    case at::kUInt64:
      return DType::kU64;
    case at::kBool:
      return DType::kBool;
    default:
      break;
  }
  return absl::InvalidArgumentError(Cat("scalar type ", c10::toString(type), " has no safetensors dtype"));
}

absl::StatusOr<at::Tensor> ReadTensorFile(const std::string& path, std::string_view preferred_name) {
  const std::string label = QuoteForError(path);
  if (absl::EndsWith(path, AsAbsl(kSafetensorsExt))) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    const std::vector<TensorView>& tensors = file->tensors();
    const TensorView* view = nullptr;
    if (tensors.size() == 1) {
      view = &tensors[0];
    } else {
      view = file->Find(preferred_name);
    }
    if (view == nullptr) {
      if (tensors.empty()) return absl::InvalidArgumentError(Cat(label, ": no tensors"));
      std::vector<std::string> names;
      for (size_t i = 0; i < tensors.size() && i < kMaxListedNames; ++i) {
        names.push_back(Cat("'", QuoteForError(tensors[i].name), "'"));
      }
      if (tensors.size() > kMaxListedNames) {
        names.push_back(Cat("... (", tensors.size() - kMaxListedNames, " more)"));
      }
      return absl::InvalidArgumentError(Cat(label, ": ", tensors.size(), " tensors and none is named '",
                                            QuoteForError(preferred_name), "': ", absl::StrJoin(names, ", ")));
    }
    return MakeTensor(label, Cat("tensor '", QuoteForError(view->name), "': "), view->dtype, view->shape, view->data,
                      view->nbytes);
  }
  if (absl::EndsWith(path, AsAbsl(kNpyExt))) {
    ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
    return MakeTensor(label, "", array.dtype, array.shape, array.data.data(), array.data.size());
  }
  return absl::InvalidArgumentError(Cat(label, ": unknown tensor file extension (want .safetensors or .npy)"));
}

absl::Status WriteTensorFile(const std::string& path, std::string_view name, const at::Tensor& t) {
  return WriteTensorsFile(path, {{std::string(name), t}});
}

absl::Status WriteTensorsFile(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const std::string label = QuoteForError(path);
  const bool safetensors = absl::EndsWith(path, AsAbsl(kSafetensorsExt));
  if (!safetensors && !absl::EndsWith(path, AsAbsl(kNpyExt))) {
    return absl::InvalidArgumentError(Cat(label, ": unknown tensor file extension (want .safetensors or .npy)"));
  }
  if (!safetensors && tensors.size() != 1) {
    return absl::InvalidArgumentError(
        Cat(label, ": a .npy file holds one tensor; write ", tensors.size(), " as .safetensors"));
  }
  std::vector<at::Tensor> cpu(tensors.size());  // alive until written
  std::vector<TensorView> views;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i].second;
    if (!t.defined()) return absl::InvalidArgumentError(Cat(label, ": undefined tensor"));
    absl::StatusOr<DType> dtype = FromScalarType(t.scalar_type());
    if (!dtype.ok()) return absl::InvalidArgumentError(Cat(label, ": ", dtype.status().message()));
    try {
      cpu[i] = t.detach().to(at::kCPU).contiguous();
    } catch (const std::exception& e) {
      return absl::InternalError(Cat(label, ": ", ExceptionText(e)));
    }
    TensorView view;
    view.name = tensors[i].first;
    view.dtype = *dtype;
    view.shape.assign(cpu[i].sizes().begin(), cpu[i].sizes().end());
    view.nbytes = static_cast<size_t>(cpu[i].numel()) * cpu[i].element_size();
    view.data = view.nbytes > 0 ? static_cast<const uint8_t*>(cpu[i].data_ptr()) : nullptr;
    views.push_back(std::move(view));
  }
  if (safetensors) return WriteSafetensors(path, views);
  return WriteNpy(path, views[0].dtype, views[0].shape, views[0].data, views[0].nbytes);
}

absl::StatusOr<at::Tensor> ToImagePixels(const at::Tensor& sample) {
  const bool video = sample.dim() == 5;
  try {
    at::Tensor x = sample.detach().to(at::kCPU);
    // diffusers' denormalize runs in the sample's dtype; pt_to_numpy then
    // converts to float32 before * 255 and round. Clamping commutes with the
    // conversion (0 and 1 are exact), so clamp after it.
    x = x.div(2).add(0.5).to(at::kFloat).nan_to_num(0.0).clamp(0.0, 1.0).mul(255.0).round();
    x = x.to(at::kByte);
    if (!video) x = x.unsqueeze(2);
    return x.permute({0, 2, 3, 4, 1}).contiguous();
  } catch (const std::exception& e) {
    return absl::InternalError(ExceptionText(e));
  }
}

absl::StatusOr<std::vector<std::string>> WritePngImages(const std::string& path, const at::Tensor& sample) {
  const std::string label = QuoteForError(path);
  auto error = [&label](auto&&... parts) { return absl::InvalidArgumentError(Cat(label, ": ", parts...)); };
  if (!sample.defined()) return error("undefined sample tensor");
  const int64_t ndim = sample.dim();
  if (ndim != 4 && ndim != 5) {
    return error("sample must be NCHW or NCTHW, got ", ndim, " dimensions");
  }
  if (!c10::isFloatingType(sample.scalar_type())) {
    return error("sample must be a floating tensor, got ", c10::toString(sample.scalar_type()));
  }
  const bool video = ndim == 5;
  const int64_t batch = sample.size(0);
  const int64_t channels = sample.size(1);
  const int64_t frames = video ? sample.size(2) : 1;
  const int64_t height = sample.size(ndim - 2);
  const int64_t width = sample.size(ndim - 1);
  if (channels != 1 && channels != 3 && channels != 4) {
    return error("sample must have 1, 3 or 4 channels, got ", channels);
  }
  if (batch <= 0 || frames <= 0 || height <= 0 || width <= 0 || height > 0x7fffffff || width > 0x7fffffff) {
    return error("sample has an empty or oversized shape");
  }

  absl::StatusOr<at::Tensor> converted = ToImagePixels(sample);
  if (!converted.ok()) return error(converted.status().message());
  const at::Tensor pixels = *converted;  // [N, T, H, W, C] uint8

  const std::string stem = PngStem(path);
  const size_t frame_bytes = static_cast<size_t>(height) * static_cast<size_t>(width) * static_cast<size_t>(channels);
  const uint8_t* base = pixels.data_ptr<uint8_t>();
  std::vector<std::string> written;
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t f = 0; f < frames; ++f) {
      std::string name;
      if (!video) {
        name = batch == 1 ? path : Cat(stem, "_", n, ".png");
      } else if (batch == 1) {
        name = absl::StrFormat("%s_f%03d.png", stem, f);
      } else {
        name = absl::StrFormat("%s_%d_f%03d.png", stem, n, f);
      }
      const uint8_t* frame = base + static_cast<size_t>(n * frames + f) * frame_bytes;
      RETURN_IF_ERROR(
          WritePng(name, static_cast<int>(width), static_cast<int>(height), static_cast<int>(channels), frame));
      written.push_back(std::move(name));
    }
  }
  return written;
}

}  // namespace vaedecode::formats
