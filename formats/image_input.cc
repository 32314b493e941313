#include "formats/image_input.h"

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/file_io.h"
#include "formats/image_bytes.h"
#include "formats/tensor_file.h"
#include "rpc/status_macros.h"

namespace vaedecode::formats {

at::Tensor ImageTensorFromPixels(const Pixels& pixels) {
  const at::Tensor thwc = at::from_blob(const_cast<uint8_t*>(pixels.data.data()),
                                        {pixels.frames, pixels.height, pixels.width, pixels.channels}, at::kByte);
  // numpy's astype(float32) / 255.0, then torch's 2.0 * x - 1.0, all in float32.
  const at::Tensor unit = thwc.to(at::kFloat) / 255.0;
  const at::Tensor ncthw = (2.0 * unit - 1.0).permute({3, 0, 1, 2}).unsqueeze(0);
  return (pixels.video ? ncthw : ncthw.squeeze(2)).contiguous();
}

absl::StatusOr<at::Tensor> DecodeImageBytes(const std::string& bytes) {
  ASSIGN_OR_RETURN(Pixels pixels, DecodeEncodedImage(bytes));
  return ImageTensorFromPixels(pixels);
}

bool IsPixelImagePath(const std::string& path) {
  return absl::EndsWith(path, ".png") || absl::EndsWith(path, ".jpg") || absl::EndsWith(path, ".jpeg") ||
         absl::EndsWith(path, ".mp4");
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
      absl::StrCat(path, ": unknown image extension (want .png, .jpg, .jpeg, .mp4, .safetensors or .npy)"));
}

}  // namespace vaedecode::formats
