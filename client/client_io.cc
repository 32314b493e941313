#include "client/client_io.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/file_io.h"
#include "formats/npy.h"
#include "formats/safetensors.h"
#include "rpc/output_formats.h"
#include "rpc/status_macros.h"

namespace vaedecode::client {
namespace {

absl::StatusOr<v1::Tensor> ToTensor(const std::string& path, formats::DType dtype, const std::vector<int64_t>& shape,
                                    const void* data, size_t nbytes) {
  v1::Tensor t;
  for (int64_t d : shape) t.add_shape(d);
  switch (dtype) {
    case formats::DType::kF32:
      t.set_dtype(v1::FLOAT32);
      t.set_data(static_cast<const char*>(data), nbytes);
      return t;
    case formats::DType::kF16:
      t.set_dtype(v1::FLOAT16);
      t.set_data(static_cast<const char*>(data), nbytes);
      return t;
    case formats::DType::kBF16:
      t.set_dtype(v1::BFLOAT16);
      t.set_data(static_cast<const char*>(data), nbytes);
      return t;
    case formats::DType::kF64: {
      t.set_dtype(v1::FLOAT32);
      const size_t n = nbytes / 8;
      std::string out(n * 4, '\0');
      for (size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, static_cast<const char*>(data) + i * 8, 8);
        const float f = static_cast<float>(v);
        std::memcpy(out.data() + i * 4, &f, 4);
      }
      t.set_data(std::move(out));
      return t;
    }
    default:
      return absl::InvalidArgumentError(formats::Cat(
          path, ": latent must be a floating tensor (F32, F16, BF16 or F64), got ", formats::DTypeName(dtype)));
  }
}

formats::DType FormatsDType(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT16:
      return formats::DType::kF16;
    case v1::UINT8:
      return formats::DType::kU8;
    default:
      return formats::DType::kF32;
  }
}

}  // namespace

namespace {

// The tensor of a .safetensors (the only one, or `name`) or .npy file.
absl::StatusOr<v1::Tensor> ReadOneTensor(const std::string& path, const std::string& name, const std::string& noun) {
  if (absl::EndsWith(path, ".safetensors")) {
    ASSIGN_OR_RETURN(std::unique_ptr<formats::SafetensorsFile> file, formats::SafetensorsFile::Open(path));
    const formats::TensorView* view = nullptr;
    if (file->tensors().size() == 1) {
      view = &file->tensors()[0];
    } else {
      view = file->Find(name);
    }
    if (view == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", file->tensors().size(),
                                                     " tensors and none is called \"", name, "\"; which one is the ",
                                                     noun, "?"));
    }
    return ToTensor(path, view->dtype, view->shape, view->data, view->nbytes);
  }
  if (absl::EndsWith(path, ".npy")) {
    ASSIGN_OR_RETURN(formats::NpyArray array, formats::ReadNpy(path));
    return ToTensor(path, array.dtype, array.shape, array.data.data(), array.data.size());
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", noun, " files must be .safetensors or .npy"));
}

}  // namespace

absl::StatusOr<v1::Tensor> ReadLatent(const std::string& path) { return ReadOneTensor(path, "latent", "latent"); }

absl::Status ReadImage(const std::string& path, v1::EncodeRequest& request) {
  if (absl::EndsWith(path, ".png") || absl::EndsWith(path, ".jpg") || absl::EndsWith(path, ".jpeg") ||
      absl::EndsWith(path, ".mp4")) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read it"));
    request.set_encoded_image(bytes.str());
    return absl::OkStatus();
  }
  if (!absl::EndsWith(path, ".safetensors") && !absl::EndsWith(path, ".npy")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": images to encode are .png, .jpg, .jpeg, .mp4, .safetensors or .npy"));
  }
  ASSIGN_OR_RETURN(*request.mutable_image(), ReadOneTensor(path, "image", "image"));
  return absl::OkStatus();
}

std::vector<v1::EncodeRequest> EncodePieces(const v1::EncodeRequest& request, int64_t piece_bytes) {
  const bool tensor = request.has_image();
  const std::string& bytes = tensor ? request.image().data() : request.encoded_image();
  const size_t step = static_cast<size_t>(std::max<int64_t>(1, piece_bytes));
  std::vector<v1::EncodeRequest> pieces;
  for (size_t at = 0; at == 0 || at < bytes.size(); at += step) {
    v1::EncodeRequest piece;
    if (at == 0) {
      piece = request;
    }
    std::string part = bytes.substr(at, step);
    if (tensor) {
      piece.mutable_image()->set_data(std::move(part));
    } else {
      piece.set_encoded_image(std::move(part));
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

v1::Tensor DemoLatent(const std::vector<int64_t>& shape, uint64_t seed) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  int64_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= d;
  }
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::string data(n * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = normal(gen);
    std::memcpy(data.data() + i * 4, &v, 4);
  }
  t.set_data(std::move(data));
  return t;
}

absl::StatusOr<std::vector<std::string>> WriteOutput(const std::string& path, const rpc::OutputAssembler& output,
                                                     const std::string& tensor_name) {
  RETURN_IF_ERROR(output.Finish());
  const v1::Header& h = output.header();
  std::vector<int64_t> shape(h.shape().begin(), h.shape().end());
  const rpc::OutputFormatInfo* format = rpc::FindOutputFormat(h.output_format());
  if (format == nullptr) return absl::InvalidArgumentError("the stream's header has an unknown output format");
  if (format->encoded) {
    // The format's own extension as the path has it (.jpg or .jpeg).
    std::string ext;
    for (const std::string& e : format->extensions) {
      if (absl::EndsWith(path, e)) ext = e;
    }
    if (ext.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--out ", path, ": ", format->name, " output needs a ",
                                                     absl::StrJoin(format->extensions, " or "), " path"));
    }
    const std::string stem = path.substr(0, path.size() - ext.size());
    std::vector<std::string> written;
    const auto write = [&written](const std::string& name, const std::string& file) -> absl::Status {
      RETURN_IF_ERROR(formats::WriteFileAtomically(name, {{file.data(), file.size()}}));
      written.push_back(name);
      return absl::OkStatus();
    };
    if (format->chunking == rpc::Chunking::kFilePerEntry) {
      // One file per batch entry (a video, a WAV): FILE.ext, or FILE_<b>.ext for a batch.
      for (size_t b = 0; b < output.images().size(); ++b) {
        RETURN_IF_ERROR(
            write(output.images().size() == 1 ? path : absl::StrCat(stem, "_", b, ext), output.images()[b]));
      }
      return written;
    }
    const int64_t batch = shape[0];
    const bool video = shape.size() == 5;
    const int64_t frames = video ? shape[1] : 1;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < frames; ++t) {
        std::string name;
        if (!video) {
          name = batch == 1 ? path : absl::StrCat(stem, "_", b, ext);
        } else {
          name = batch == 1 ? absl::StrFormat("%s_f%03d%s", stem, t, ext)
                            : absl::StrFormat("%s_%d_f%03d%s", stem, b, t, ext);
        }
        RETURN_IF_ERROR(write(name, output.images()[b * frames + t]));
      }
    }
    return written;
  }
  const std::string& bytes = output.tensor_bytes();
  const formats::DType dtype = FormatsDType(h.dtype());
  absl::Status s;
  if (absl::EndsWith(path, ".npy")) {
    s = formats::WriteNpy(path, dtype, shape, bytes.data(), bytes.size());
  } else if (absl::EndsWith(path, ".safetensors")) {
    formats::TensorView view;
    view.name = tensor_name;
    view.dtype = dtype;
    view.shape = shape;
    view.data = reinterpret_cast<const uint8_t*>(bytes.data());
    view.nbytes = bytes.size();
    s = formats::WriteSafetensors(path, {view});
  } else {
    s = absl::InvalidArgumentError(absl::StrCat("--out ", path, ": tensor output needs .safetensors or .npy"));
  }
  if (!s.ok()) return s;
  return std::vector<std::string>{path};
}

absl::StatusOr<std::vector<std::string>> WriteEncodeOutput(const std::string& path, const rpc::OutputAssembler& output,
                                                           bool moments) {
  if (!moments) return WriteOutput(path, output, "latent");
  RETURN_IF_ERROR(output.Finish());
  if (!absl::EndsWith(path, ".safetensors")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", path, ": moments are two tensors (mean, logvar): use .safetensors"));
  }
  const v1::Header& h = output.header();
  std::vector<int64_t> half(h.shape().begin(), h.shape().end());
  if (half.size() < 2 || half[1] % 2 != 0 || h.dtype() != v1::FLOAT32) {
    return absl::InvalidArgumentError("the server's moments are not float32 [B, 2C, ...]");
  }
  half[1] /= 2;
  // Per batch entry: the mean's channels, then the log-variance's.
  const std::string& bytes = output.tensor_bytes();
  const size_t entry = bytes.size() / static_cast<size_t>(half[0]), part = entry / 2;
  std::string mean, logvar;
  for (int64_t b = 0; b < half[0]; ++b) {
    mean.append(bytes, b * entry, part);
    logvar.append(bytes, b * entry + part, part);
  }
  std::vector<formats::TensorView> views(2);
  const std::pair<const char*, const std::string*> tensors[] = {{"mean", &mean}, {"logvar", &logvar}};
  for (size_t i = 0; i < 2; ++i) {
    views[i].name = tensors[i].first;
    views[i].dtype = formats::DType::kF32;
    views[i].shape = half;
    views[i].data = reinterpret_cast<const uint8_t*>(tensors[i].second->data());
    views[i].nbytes = tensors[i].second->size();
  }
  RETURN_IF_ERROR(formats::WriteSafetensors(path, views));
  return std::vector<std::string>{path};
}

}  // namespace vaedecode::client
