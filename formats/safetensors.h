#pragma once

// Reader and writer for the safetensors format
// (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header, then the raw little-endian tensor data.
//
// The reader validates everything it is given and never throws or crashes on
// malformed input (it is fuzzed: see safetensors_fuzzer.cc). No torch here.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vaedecode::formats {

// Element types shared by the safetensors and .npy code. The names are the
// safetensors spellings ("F32", "BF16", "BOOL", ...).
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU64, kU32, kU16, kU8, kBool };

// "F32" -> kF32, ... Case-sensitive, as in the spec. Unknown names (including
// the F8 types, which this project does not use) are InvalidArgument.
absl::StatusOr<DType> ParseDType(std::string_view name);
std::string_view DTypeName(DType dtype);
// Bytes per element: 8, 4, 2 or 1.
size_t DTypeSize(DType dtype);

// A tensor inside a buffer someone else owns. `data` is NOT necessarily
// aligned for the element type (safetensors does not require the header to be
// padded): copy with memcpy rather than casting the pointer.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // [] is a 0-d tensor with one element.
  const uint8_t* data = nullptr;
  size_t nbytes = 0;  // == numel() * DTypeSize(dtype).

  // Product of `shape`; 1 for a 0-d tensor.
  int64_t numel() const;
};

// A parsed, validated safetensors file. Immutable after construction, so all
// const methods may be called from any number of threads. The TensorViews
// point into memory owned by this object and die with it.
//
// Rejected, each with a one-line InvalidArgument naming the file: fewer than
// 8 bytes; a header length of 0, past the end of the file, or over 100 MB; a
// header that is not JSON, not an object, or nested more than 64 levels; a
// key repeated within any object (JSON parsers disagree on which duplicate
// wins, so a repeated tensor name is an error, not "last one wins"); a tensor
// entry that is not an object or lacks "dtype" (a known name), "shape"
// (non-negative integers whose product, zeros counted as one, fits in int64)
// or "data_offsets" (two non-negative integers, begin <= end <= data size,
// end - begin == numel * element size); tensors whose byte ranges overlap;
// "__metadata__" that is not an object of strings. Accepted: 0-d and
// zero-size tensors, gaps between tensors, unknown extra keys in a tensor
// entry, a header not padded to 8 bytes.
class SafetensorsFile {
 public:
  // Maps `path` read-only (mmap; unmapped in the destructor). Truncating the
  // file on disk while it is mapped makes later reads of the data fault:
  // callers must not rewrite files in place (WriteSafetensors renames).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  // Parses a copy of `bytes`; `label` stands in for the path in errors.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(std::string bytes, std::string label);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Every tensor, sorted by data offset (ties, which only zero-size tensors
  // can have, by name): the order of the bytes in the file.
  const std::vector<TensorView>& tensors() const { return tensors_; }

  // The tensor called `name`, or nullptr.
  const TensorView* Find(std::string_view name) const;

  // The "__metadata__" map; empty when the header has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The path given to Open, or the label given to FromBuffer.
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;

  // Parses [base_, base_ + size_) and fills tensors_/metadata_/by_name_.
  absl::Status Parse();

  std::string path_;
  std::string owned_bytes_;  // FromBuffer's copy.
  void* mapping_ = nullptr;  // Open's mmap, or nullptr.
  size_t mapping_size_ = 0;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;  // -> index in tensors_.
  std::map<std::string, std::string> metadata_;
};

// Serializes `tensors` in the standard layout: the u64 LE header length, the
// JSON header padded with spaces to a multiple of 8 bytes (so the data section,
// and every tensor when all element sizes divide 8, is 8-byte aligned), then
// the tensors' bytes back to back in the given order. Errors: duplicate or
// reserved ("__metadata__") names, names or metadata that are not UTF-8,
// nbytes != numel * dtype size, negative dims, null data with nbytes > 0.
absl::StatusOr<std::string> SerializeSafetensors(const std::vector<TensorView>& tensors,
                                                 const std::map<std::string, std::string>& metadata = {});

// Writes the same bytes as SerializeSafetensors to `path` + ".tmp" (streaming
// the tensor data, not copying it) and renames it over `path`.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Reads a sharded checkpoint's `*.safetensors.index.json`
// ({"metadata": {...}, "weight_map": {"tensor": "shard.safetensors", ...}})
// and returns the distinct shard files, as absolute paths in the index's
// folder, sorted by file name. Shard names must be plain file names: "/", "\"
// or ".." anywhere in one is an error (no path traversal). A `key_prefix`
// keeps only the shards holding a tensor whose name starts with it (a
// model's `vae.` part of a whole-model checkpoint).
absl::StatusOr<std::vector<std::string>> ReadShardIndex(const std::string& index_json_path,
                                                        std::string_view key_prefix = "");

}  // namespace vaedecode::formats
