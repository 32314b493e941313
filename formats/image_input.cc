#include "formats/image_input.h"

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/file_io.h"
#include "formats/image_bytes.h"
#include "formats/tensor_file.h"
#include "rpc/status_macros.h"

namespace vaedecode::formats {

at::Tensor ImageTensorFromPixels(int width, int height, int channels, const uint8_t* pixels) {
  const at::Tensor hwc = at::from_blob(const_cast<uint8_t*>(pixels), {height, width, channels}, at::kByte);
  // numpy's astype(float32) / 255.0, then torch's 2.0 * x - 1.0, all in float32.
  const at::Tensor unit = hwc.to(at::kFloat) / 255.0;
  return (2.0 * unit - 1.0).permute({2, 0, 1}).unsqueeze(0).contiguous();
}

absl::StatusOr<at::Tensor> DecodeImageBytes(const std::string& bytes) {
  ASSIGN_OR_RETURN(Pixels pixels, DecodeEncodedImage(bytes));
  return ImageTensorFromPixels(pixels.width, pixels.height, pixels.channels, pixels.data.data());
}

bool IsPixelImagePath(const std::string& path) {
  return absl::EndsWith(path, ".png") || absl::EndsWith(path, ".jpg") || absl::EndsWith(path, ".jpeg");
}

absl::StatusOr<at::Tensor> ReadImageInput(const std::string& path) {
  if (IsPixelImagePath(path)) {
    ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
    absl::StatusOr<at::Tensor> image = DecodeImageBytes(bytes);
    if (!image.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", image.status().message()));
    return image;
  }
  if (absl::EndsWith(path, ".safetensors") || absl::EndsWith(path, ".npy")) return ReadTensorFile(path, "image");
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": unknown image extension (want .png, .jpg, .jpeg, .safetensors or .npy)"));
}

}  // namespace vaedecode::formats
