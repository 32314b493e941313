#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "formats/file_io.h"
#include "nlohmann/json.hpp"
#include "rpc/status_macros.h"

namespace vaedecode::formats {
namespace {

using Json = nlohmann::json;

// Same limit as the reference Rust implementation MAX_HEADER_SIZE.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 13> kDTypes = {{
    {DType::kF64, "F64", 8},
    {DType::kF32, "F32", 4},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI64, "I64", 8},
    {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},
    {DType::kU64, "U64", 8},
    {DType::kU32, "U32", 4},
    {DType::kU16, "U16", 2},
    {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
}};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[1];  // Unreachable for valid enum values.
}

uint64_t LoadLittleEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void StoreLittleEndian64(uint64_t v, char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

std::string ShapeString(const std::vector<int64_t>& shape) { return Cat("[", absl::StrJoin(shape, ", "), "]"); }

// Checks that the element count of `shape` is representable: the product of
// the dimensions, with zeros counted as one (so that a zero-size tensor cannot
// smuggle in dimensions whose strides overflow), fits in int64.
bool ShapeProductFits(const std::vector<int64_t>& shape) {
  int64_t product = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(product, std::max<int64_t>(d, 1), &product)) return false;
  }
  return true;
}

// RFC 3629 UTF-8 (no overlongs, no surrogates, at most U+10FFFF): what
// nlohmann::json::dump() requires of strings.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int extra = 0;
    uint32_t cp = 0;
    if (c >= 0xc2 && c <= 0xdf) {
      extra = 1;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      extra = 2;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i <= static_cast<size_t>(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

// Real headers nest three levels deep. The limit keeps a hostile header of
// nothing but brackets from costing gigabytes as a DOM (serde_json, which the
// reference implementation uses, stops at 128).
constexpr int kMaxJsonDepth = 64;

// SAX pass over the header, run before the DOM parse. It finds the first key
// repeated within one object (the DOM parser silently keeps the last of
// duplicate keys, which would hide a tensor or one of its fields) and stops
// at nesting deeper than kMaxJsonDepth.
class HeaderScanner : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    objects_.emplace_back();
    return Enter();
  }
  bool key(string_t& key) override {
    if (objects_.size() == 1) top_level_key_ = key;
    if (!objects_.empty() && !objects_.back().insert(key).second && !found_) {
      found_ = true;
      duplicate_ = key;
      nested_ = objects_.size() > 1;
      inside_ = top_level_key_;
    }
    return true;
  }
  bool end_object() override {
    if (!objects_.empty()) objects_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return Enter(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    error_ = ex.what();
    return false;
  }

  bool too_deep() const { return too_deep_; }
  bool found() const { return found_; }
  bool nested() const { return nested_; }
  // The repeated key and, when it is not a top-level key, the top-level key
  // whose value holds it.
  const std::string& duplicate() const { return duplicate_; }
  const std::string& inside() const { return inside_; }
  const std::string& error() const { return error_; }

 private:
  bool Enter() {
    if (++depth_ > kMaxJsonDepth) too_deep_ = true;
    return !too_deep_;
  }

  int depth_ = 0;
  bool too_deep_ = false;
  std::vector<std::set<std::string>> objects_;  // Keys of each open object.
  std::string top_level_key_;
  bool found_ = false;
  bool nested_ = false;
  std::string duplicate_;
  std::string inside_;
  std::string error_;
};

// Reads a JSON integer that must be >= 0 and fit in int64. nlohmann stores
// non-negative literals as unsigned and negative ones as signed.
enum class IntCheck { kOk, kNotInteger, kNegative, kTooLarge };
IntCheck GetNonNegativeInt(const Json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return IntCheck::kTooLarge;
    *out = static_cast<int64_t>(v);
    return IntCheck::kOk;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return IntCheck::kNegative;
    *out = v;
    return IntCheck::kOk;
  }
  return IntCheck::kNotInteger;
}

std::string_view TypeName(const Json& j) { return j.type_name(); }

// A JSON fragment for an error message: escaped, and cut to 64 bytes.
std::string Abbreviate(std::string_view text) {
  constexpr size_t kMax = 64;
  if (text.size() <= kMax) return QuoteForError(text);
  return Cat(QuoteForError(text.substr(0, kMax)), "...");
}

}  // namespace

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(Cat("unknown dtype '", QuoteForError(name), "'"));
}

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------
// Reading.

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const std::string label = QuoteForError(path);
  // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer;
  // it is refused below as not a regular file. Regular files ignore it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string message = Cat(label, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(Cat(label, ": not a regular file"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  // mmap of length 0 fails; an empty file is rejected by Parse() instead.
  if (st.st_size > 0) {
    void* mapping = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(Cat(label, ": mmap failed: ", std::strerror(err)));
    }
    file->mapping_ = mapping;
    file->mapping_size_ = static_cast<size_t>(st.st_size);
    file->base_ = static_cast<const uint8_t*>(mapping);
    file->size_ = file->mapping_size_;
  }
  ::close(fd);  // The mapping keeps the file alive.
  RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(std::string bytes, std::string label) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(label);
  // The views point into owned_bytes_, which never moves again: the object
  // lives on the heap and is neither copyable nor movable.
  file->owned_bytes_ = std::move(bytes);
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_bytes_.data());
  file->size_ = file->owned_bytes_.size();
  RETURN_IF_ERROR(file->Parse());
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsFile::Parse() {
  const std::string label = QuoteForError(path_);
  auto error = [&label](auto&&... parts) { return absl::InvalidArgumentError(Cat(label, ": ", parts...)); };

  if (size_ == 0) return error("file is empty");
  if (size_ < 8) {
    return error("file is ", size_, " bytes, shorter than the 8-byte header length field");
  }
  const uint64_t header_len = LoadLittleEndian64(base_);
  if (header_len == 0) return error("header length is 0");
  if (header_len > kMaxHeaderBytes) {
    return error("header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  }
  if (header_len > size_ - 8) {
    return error("header length ", header_len, " runs past the end of the ", size_, "-byte file");
  }
  const char* header_begin = reinterpret_cast<const char*>(base_ + 8);
  const char* header_end = header_begin + header_len;
  const uint8_t* data_start = base_ + 8 + header_len;
  const uint64_t data_size = size_ - 8 - header_len;

  HeaderScanner scanner;
  if (!Json::sax_parse(header_begin, header_end, &scanner)) {
    if (scanner.too_deep()) {
      return error("header nests deeper than ", kMaxJsonDepth, " levels");
    }
    return error("header is not valid JSON: ", QuoteForError(scanner.error()));
  }
  if (scanner.found()) {
    if (scanner.nested()) {
      const std::string where = scanner.inside() == kMetadataKey
                                    ? std::string("\"__metadata__\"")
                                    : Cat("tensor '", QuoteForError(scanner.inside()), "'");
      return error(where, ": duplicate key '", QuoteForError(scanner.duplicate()), "'");
    }
    return error("header has duplicate key '", QuoteForError(scanner.duplicate()), "'");
  }
  const Json header = Json::parse(header_begin, header_end, nullptr,
                                  /*allow_exceptions=*/false);
  if (header.is_discarded()) return error("header is not valid JSON");
  if (!header.is_object()) {
    return error("header is a JSON ", TypeName(header), ", not an object");
  }

  struct Entry {
    uint64_t begin;
    uint64_t end;
    TensorView view;
  };
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const Json& value = it.value();
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        return error("\"__metadata__\" is a JSON ", TypeName(value), ", not an object of strings");
      }
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) {
          return error("\"__metadata__\" value for '", QuoteForError(m.key()), "' is a JSON ", TypeName(m.value()),
                       ", not a string");
        }
        metadata_.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    const std::string tensor = Cat("tensor '", QuoteForError(key), "': ");
    if (!value.is_object()) {
      return error(tensor, "entry is a JSON ", TypeName(value), ", not an object");
    }

    Entry entry;
    entry.view.name = key;

    const auto dtype_it = value.find("dtype");
    if (dtype_it == value.end()) return error(tensor, "missing \"dtype\"");
    if (!dtype_it->is_string()) {
      return error(tensor, "\"dtype\" is a JSON ", TypeName(*dtype_it), ", not a string");
    }
    const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
    absl::StatusOr<DType> dtype = ParseDType(dtype_name);
    if (!dtype.ok()) return error(tensor, dtype.status().message());
    entry.view.dtype = *dtype;

    const auto shape_it = value.find("shape");
    if (shape_it == value.end()) return error(tensor, "missing \"shape\"");
    if (!shape_it->is_array()) {
      return error(tensor, "\"shape\" is a JSON ", TypeName(*shape_it), ", not an array");
    }
    for (size_t i = 0; i < shape_it->size(); ++i) {
      const Json& dim = (*shape_it)[i];
      int64_t d = 0;
      switch (GetNonNegativeInt(dim, &d)) {
        case IntCheck::kOk:
          break;
        case IntCheck::kNotInteger:
          return error(tensor, "shape dimension ", i, " is a JSON ", TypeName(dim), ", not an integer");
        case IntCheck::kNegative:
          return error(tensor, "shape dimension ", i, " is negative (", dim.get<int64_t>(), ")");
        case IntCheck::kTooLarge:
          return error(tensor, "shape dimension ", i, " is too large (", dim.get<uint64_t>(), ")");
      }
      entry.view.shape.push_back(d);
    }
    if (!ShapeProductFits(entry.view.shape)) {
      return error(tensor, "shape ", ShapeString(entry.view.shape), " overflows 64-bit size");
    }

    const auto offsets_it = value.find("data_offsets");
    if (offsets_it == value.end()) return error(tensor, "missing \"data_offsets\"");
    int64_t begin = 0;
    int64_t end = 0;
    if (!offsets_it->is_array() || offsets_it->size() != 2 ||
        GetNonNegativeInt((*offsets_it)[0], &begin) != IntCheck::kOk ||
        GetNonNegativeInt((*offsets_it)[1], &end) != IntCheck::kOk) {
      return error(tensor, "\"data_offsets\" must be two non-negative integers, got ",
                   Abbreviate(offsets_it->dump(-1, ' ', true)));
    }
    if (begin > end) {
      return error(tensor, "data_offsets [", begin, ", ", end, "] begin after end");
    }
    if (static_cast<uint64_t>(end) > data_size) {
      return error(tensor, "data_offsets [", begin, ", ", end, "] run past the end of the ", data_size,
                   "-byte data section");
    }
    const uint64_t nbytes = static_cast<uint64_t>(end - begin);
    uint64_t expected = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(entry.view.numel()),
                               static_cast<uint64_t>(DTypeSize(entry.view.dtype)), &expected) ||
        expected != nbytes) {
      return error(tensor, "data_offsets [", begin, ", ", end, "] hold ", nbytes, " bytes but shape ",
                   ShapeString(entry.view.shape), " of ", dtype_name, " needs ", entry.view.numel(), " x ",
                   DTypeSize(entry.view.dtype));
    }
    entry.begin = static_cast<uint64_t>(begin);
    entry.end = static_cast<uint64_t>(end);
    entry.view.data = data_start + begin;
    entry.view.nbytes = static_cast<size_t>(nbytes);
    entries.push_back(std::move(entry));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.view.name) < std::tie(b.begin, b.end, b.view.name);
  });
  // Zero-size tensors occupy no bytes and cannot overlap anything. Gaps
  // between tensors are allowed (the spec asks for none, but readers such as
  // diffusers' accept them).
  const Entry* previous = nullptr;
  for (const Entry& entry : entries) {
    if (entry.begin == entry.end) continue;
    if (previous != nullptr && entry.begin < previous->end) {
      return error("tensors '", QuoteForError(previous->view.name), "' [", previous->begin, ", ", previous->end,
                   "] and '", QuoteForError(entry.view.name), "' [", entry.begin, ", ", entry.end, "] overlap");
    }
    if (previous == nullptr || entry.end > previous->end) previous = &entry;
  }

  tensors_.reserve(entries.size());
  for (Entry& entry : entries) {
    by_name_.emplace(entry.view.name, tensors_.size());
    tensors_.push_back(std::move(entry.view));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Writing.

namespace {

// The 8-byte length plus the padded JSON header for `tensors` laid out back
// to back in order.
absl::StatusOr<std::string> BuildHeader(const std::vector<TensorView>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  auto error = [](auto&&... parts) { return absl::InvalidArgumentError(Cat("safetensors writer: ", parts...)); };
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return error("metadata entry '", QuoteForError(key), "' is not valid UTF-8");
      }
      meta[key] = value;
    }
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    const std::string tensor = Cat("tensor '", QuoteForError(t.name), "': ");
    if (!IsValidUtf8(t.name)) return error(tensor, "name is not valid UTF-8");
    if (t.name == kMetadataKey) return error(tensor, "name is reserved");
    if (header.contains(t.name)) return error(tensor, "duplicate name");
    if (!ShapeProductFits(t.shape)) {
      return error(tensor, "invalid shape ", ShapeString(t.shape));
    }
    uint64_t expected = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(t.numel()), static_cast<uint64_t>(DTypeSize(t.dtype)),
                               &expected) ||
        expected != t.nbytes) {
      return error(tensor, "nbytes ", t.nbytes, " does not match shape ", ShapeString(t.shape), " of ",
                   DTypeName(t.dtype));
    }
    if (t.data == nullptr && t.nbytes > 0) return error(tensor, "data is null");
    Json shape = Json::array();
    for (int64_t d : t.shape) shape.push_back(d);
    Json offsets = Json::array();
    offsets.push_back(offset);
    offsets.push_back(offset + t.nbytes);
    Json entry = Json::object();
    entry["dtype"] = std::string(DTypeName(t.dtype));
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = std::move(offsets);
    header[t.name] = std::move(entry);
    offset += t.nbytes;
  }
  // Every string was checked above, so dump() cannot throw.
  std::string json = header.dump();
  json.resize((json.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  StoreLittleEndian64(json.size(), out.data());
  out += json;
  return out;
}

}  // namespace

absl::StatusOr<std::string> SerializeSafetensors(const std::vector<TensorView>& tensors,
                                                 const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(std::string out, BuildHeader(tensors, metadata));
  for (const TensorView& t : tensors) {
    out.append(reinterpret_cast<const char*>(t.data), t.nbytes);
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header = BuildHeader(tensors, metadata);
  if (!header.ok()) {
    return absl::InvalidArgumentError(Cat(QuoteForError(path), ": ", header.status().message()));
  }
  std::vector<ByteChunk> chunks;
  chunks.reserve(tensors.size() + 1);
  chunks.push_back({header->data(), header->size()});
  for (const TensorView& t : tensors) chunks.push_back({t.data, t.nbytes});
  return WriteFileAtomically(path, chunks);
}

// ---------------------------------------------------------------------------
// Sharded checkpoints.

absl::StatusOr<std::vector<std::string>> ReadShardIndex(const std::string& index_json_path,
                                                        std::string_view key_prefix) {
  const std::string label = QuoteForError(index_json_path);
  auto error = [&label](auto&&... parts) { return absl::InvalidArgumentError(Cat(label, ": ", parts...)); };
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_json_path));
  const Json index = Json::parse(text.begin(), text.end(), nullptr,
                                 /*allow_exceptions=*/false);
  if (index.is_discarded()) return error("not valid JSON");
  if (!index.is_object()) return error("top level is a JSON ", TypeName(index), ", not an object");
  const auto map_it = index.find("weight_map");
  if (map_it == index.end()) return error("missing \"weight_map\"");
  if (!map_it->is_object()) {
    return error("\"weight_map\" is a JSON ", TypeName(*map_it), ", not an object");
  }
  if (map_it->empty()) return error("\"weight_map\" is empty");
  std::set<std::string> shards;
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    const std::string tensor = Cat("tensor '", QuoteForError(it.key()), "': ");
    if (!it.value().is_string()) {
      return error(tensor, "shard is a JSON ", TypeName(it.value()), ", not a string");
    }
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos ||
        shard.find("..") != std::string::npos || shard.find('\0') != std::string::npos) {
      return error(tensor, "shard name '", QuoteForError(shard), "' is not a plain file name in the index's folder");
    }
    if (it.key().compare(0, key_prefix.size(), key_prefix) == 0) shards.insert(shard);
  }
  if (shards.empty()) return error("no tensor named \"", QuoteForError(std::string(key_prefix)), "...\"");
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(index_json_path, ec);
  if (ec) return error("cannot make the path absolute: ", ec.message());
  const std::filesystem::path folder = absolute.parent_path();
  std::vector<std::string> paths;
  paths.reserve(shards.size());
  for (const std::string& shard : shards) paths.push_back((folder / shard).string());
  return paths;
}

}  // namespace vaedecode::formats
