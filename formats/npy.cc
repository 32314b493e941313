#include "formats/npy.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "formats/file_io.h"
#include "rpc/status_macros.h"

namespace vaedecode::formats {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "'=' descr is read as little-endian");

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kDataAlignment = 64;

struct NpyType {
  char kind;
  size_t size;
  DType dtype;
};

constexpr std::array<NpyType, 12> kNpyTypes = {{
    {'f', 2, DType::kF16},
    {'f', 4, DType::kF32},
    {'f', 8, DType::kF64},
    {'i', 1, DType::kI8},
    {'i', 2, DType::kI16},
    {'i', 4, DType::kI32},
    {'i', 8, DType::kI64},
    {'u', 1, DType::kU8},
    {'u', 2, DType::kU16},
    {'u', 4, DType::kU32},
    {'u', 8, DType::kU64},
    {'b', 1, DType::kBool},
}};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return Cat("(", absl::StrJoin(shape, ", "), shape.size() == 1 ? ",)" : ")");
}

// See safetensors.cc: zeros count as one so that strides cannot overflow.
bool ShapeProductFits(const std::vector<int64_t>& shape) {
  int64_t product = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(product, std::max<int64_t>(d, 1), &product)) return false;
  }
  return true;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The header is a Python dict literal as written by numpy.lib.format, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// This parser accepts that subset of Python: string keys, string / bool /
// int-tuple values, optional trailing commas, and the 'L' suffix that
// Python 2 wrote after ints. Anything else is an error, never a guess.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  // On success the three fields are set; on failure returns the problem.
  std::optional<std::string> Parse(std::string* descr, bool* fortran_order, std::vector<int64_t>* shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    SkipSpace();
    if (!Consume('{')) return Problem("does not start with '{'");
    SkipSpace();
    while (!Peek('}')) {
      if (pos_ >= text_.size()) return Problem("ends before the closing '}'");
      std::string key;
      if (!ParseString(&key)) return Problem("expected a quoted key");
      SkipSpace();
      if (!Consume(':')) return Problem("expected ':' after a key");
      SkipSpace();
      if (key == "descr") {
        if (have_descr) return Problem("has 'descr' twice");
        have_descr = true;
        if (!ParseString(descr)) {
          return Problem("'descr' is not a simple type string (structured dtype?)");
        }
      } else if (key == "fortran_order") {
        if (have_order) return Problem("has 'fortran_order' twice");
        have_order = true;
        if (ConsumeWord("True")) {
          *fortran_order = true;
        } else if (ConsumeWord("False")) {
          *fortran_order = false;
        } else {
          return Problem("'fortran_order' is not True or False");
        }
      } else if (key == "shape") {
        if (have_shape) return Problem("has 'shape' twice");
        have_shape = true;
        if (std::optional<std::string> p = ParseShape(shape)) return p;
      } else {
        return Problem(Cat("has unexpected key '", QuoteForError(key), "'"));
      }
      SkipSpace();
      if (Consume(',')) {
        SkipSpace();
      } else if (pos_ >= text_.size()) {
        return Problem("ends before the closing '}'");
      } else if (!Peek('}')) {
        return Problem("expected ',' or '}'");
      }
    }
    Consume('}');
    SkipSpace();
    if (pos_ != text_.size()) return Problem("has text after the closing '}'");
    if (!have_descr || !have_order || !have_shape) {
      return Problem("must have the keys 'descr', 'fortran_order' and 'shape'");
    }
    return std::nullopt;
  }

 private:
  std::string Problem(std::string_view what) const { return Cat("header ", what, " (at offset ", pos_, ")"); }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Peek(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  bool Consume(char c) {
    if (!Peek(c)) return false;
    ++pos_;
    return true;
  }
  bool ConsumeWord(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    const size_t after = pos_ + word.size();
    if (after < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[after])) || text_[after] == '_')) {
      return false;
    }
    pos_ = after;
    return true;
  }
  // A '...' or "..." string without escapes.
  bool ParseString(std::string* out) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return false;
    const char quote = text_[pos_];
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) return false;
    const std::string_view body = text_.substr(pos_ + 1, end - pos_ - 1);
    if (body.find('\\') != std::string_view::npos || body.find('\n') != std::string_view::npos) {
      return false;
    }
    *out = std::string(body);
    pos_ = end + 1;
    return true;
  }
  // A Python tuple of non-negative ints: (), (5,), (2, 3), (2, 3,).
  std::optional<std::string> ParseShape(std::vector<int64_t>* shape) {
    shape->clear();
    if (!Consume('(')) return Problem("'shape' is not a tuple");
    SkipSpace();
    bool trailing_comma = false;
    while (!Peek(')')) {
      if (pos_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        return Problem("'shape' has an entry that is not a non-negative integer");
      }
      int64_t value = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        if (__builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, text_[pos_] - '0', &value)) {
          return Problem("'shape' has an integer that is too large");
        }
        ++pos_;
      }
      if (Peek('L') || Peek('l')) ++pos_;
      shape->push_back(value);
      SkipSpace();
      trailing_comma = Consume(',');
      SkipSpace();
      if (!trailing_comma && !Peek(')')) return Problem("'shape' expected ',' or ')'");
    }
    Consume(')');
    // In Python "(5)" is the int 5, not a tuple.
    if (shape->size() == 1 && !trailing_comma) return Problem("'shape' is not a tuple");
    return std::nullopt;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// Parses a descr such as '<f4' into the dtype and whether bytes need swapping.
std::optional<std::pair<DType, bool>> ParseDescr(std::string_view descr) {
  if (descr.size() < 3) return std::nullopt;
  const char order = descr[0];
  const char kind = descr[1];
  const std::string_view size_text = descr.substr(2);
  if (size_text.size() != 1 || !std::isdigit(static_cast<unsigned char>(size_text[0]))) {
    return std::nullopt;
  }
  const size_t size = static_cast<size_t>(size_text[0] - '0');
  for (const NpyType& t : kNpyTypes) {
    if (t.kind != kind || t.size != size) continue;
    switch (order) {
      case '<':
      case '=':
        return std::make_pair(t.dtype, false);
      case '>':
        return std::make_pair(t.dtype, size > 1);
      case '|':
        if (size == 1) return std::make_pair(t.dtype, false);
        return std::nullopt;
      default:
        return std::nullopt;
    }
  }
  return std::nullopt;
}

std::string_view LittleEndianDescr(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return "<f8";
    case DType::kF32:
      return "<f4";
    case DType::kF16:
      return "<f2";
    case DType::kI64:
      return "<i8";
    case DType::kI32:
      return "<i4";
    case DType::kI16:
      return "<i2";
    case DType::kI8:
      return "|i1";
    case DType::kU64:
      return "<u8";
    case DType::kU32:
      return "<u4";
    case DType::kU16:
      return "<u2";
    case DType::kU8:
      return "|u1";
    case DType::kBool:
      return "|b1";
    case DType::kBF16:
      return "";
  }
  return "";
}

void ByteSwapElements(std::string* data, size_t element_size) {
  for (size_t i = 0; i + element_size <= data->size(); i += element_size) {
    std::reverse(data->begin() + i, data->begin() + i + element_size);
  }
}

// Reorders Fortran-order (column-major) elements into C order.
std::string FortranToC(const std::string& src, const std::vector<int64_t>& shape, size_t element_size) {
  const size_t ndim = shape.size();
  if (ndim < 2) return src;
  const int64_t numel = Numel(shape);
  std::string dst(src.size(), '\0');
  if (numel == 0) return dst;
  // Fortran strides, in elements: the first axis varies fastest.
  std::vector<int64_t> fstride(ndim);
  int64_t s = 1;
  for (size_t d = 0; d < ndim; ++d) {
    fstride[d] = s;
    s *= shape[d];
  }
  std::vector<int64_t> index(ndim, 0);
  int64_t src_elem = 0;
  for (int64_t i = 0; i < numel; ++i) {
    std::memcpy(&dst[static_cast<size_t>(i) * element_size], &src[static_cast<size_t>(src_elem) * element_size],
                element_size);
    // Advance the C-order odometer (last axis fastest), tracking the source.
    for (size_t d = ndim; d-- > 0;) {
      if (++index[d] < shape[d]) {
        src_elem += fstride[d];
        break;
      }
      src_elem -= fstride[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
  return dst;
}

uint32_t LoadLittleEndian(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(std::string_view bytes, std::string_view label_in) {
  const std::string label = QuoteForError(label_in);
  auto error = [&label](auto&&... parts) { return absl::InvalidArgumentError(Cat(label, ": ", parts...)); };
  if (bytes.size() < kMagic.size() + 2 || bytes.substr(0, kMagic.size()) != kMagic) {
    return error("not a .npy file (bad magic)");
  }
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const int major = u[6];
  const int minor = u[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return error("unsupported .npy format version ", major, ".", minor);
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagic.size() + 2 + length_bytes;
  if (bytes.size() < prefix) return error("truncated header length field");
  const uint64_t header_len = LoadLittleEndian(u + 8, static_cast<int>(length_bytes));
  if (header_len > bytes.size() - prefix) {
    return error("truncated header: needs ", header_len, " bytes, file has ", bytes.size() - prefix);
  }
  const std::string_view header = bytes.substr(prefix, header_len);

  std::string descr;
  bool fortran_order = false;
  NpyArray array;
  if (std::optional<std::string> problem = HeaderParser(header).Parse(&descr, &fortran_order, &array.shape)) {
    return error(*problem);
  }
  const std::optional<std::pair<DType, bool>> type = ParseDescr(descr);
  if (!type) return error("unsupported descr '", QuoteForError(descr), "'");
  array.dtype = type->first;
  if (!ShapeProductFits(array.shape)) {
    return error("shape ", ShapeString(array.shape), " overflows 64-bit size");
  }
  const size_t element_size = DTypeSize(array.dtype);
  uint64_t expected = 0;
  const uint64_t available = bytes.size() - prefix - header_len;
  if (__builtin_mul_overflow(static_cast<uint64_t>(Numel(array.shape)), static_cast<uint64_t>(element_size),
                             &expected) ||
      expected > available) {
    return error("data is ", available, " bytes but shape ", ShapeString(array.shape), " of '", descr, "' needs ",
                 Numel(array.shape), " x ", element_size);
  }
  if (expected < available) {
    return error(available - expected, " trailing bytes after the ", expected, "-byte data for shape ",
                 ShapeString(array.shape), " of '", descr, "'");
  }
  array.data = std::string(bytes.substr(prefix + header_len));
  if (type->second) ByteSwapElements(&array.data, element_size);
  if (fortran_order) array.data = FortranToC(array.data, array.shape, element_size);
  return array;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  return ParseNpy(bytes, path);
}

absl::Status WriteNpy(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data,
                      size_t nbytes) {
  const std::string label = QuoteForError(path);
  auto error = [&label](auto&&... parts) { return absl::InvalidArgumentError(Cat(label, ": ", parts...)); };
  const std::string_view descr = LittleEndianDescr(dtype);
  if (descr.empty()) return error(DTypeName(dtype), " has no NumPy dtype");
  if (!ShapeProductFits(shape)) return error("invalid shape ", ShapeString(shape));
  uint64_t expected = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(Numel(shape)), static_cast<uint64_t>(DTypeSize(dtype)), &expected) ||
      expected != nbytes) {
    return error("nbytes ", nbytes, " does not match shape ", ShapeString(shape), " of '", descr, "'");
  }
  if (data == nullptr && nbytes > 0) return error("data is null");

  std::string header = Cat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", ShapeString(shape), ", }");
  int major = 1;
  size_t prefix = kMagic.size() + 2 + 2;
  if (header.size() + 1 + kDataAlignment > 0xffff) {
    major = 2;
    prefix = kMagic.size() + 2 + 4;
  }
  const size_t unpadded = prefix + header.size() + 1;  // + '\n'
  const size_t padded = (unpadded + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
  header.append(padded - unpadded, ' ');
  header.push_back('\n');

  std::string head(kMagic);
  head.push_back(static_cast<char>(major));
  head.push_back(0);
  const size_t length_bytes = prefix - kMagic.size() - 2;
  for (size_t i = 0; i < length_bytes; ++i) {
    head.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  head += header;
  return WriteFileAtomically(path, {{head.data(), head.size()}, {data, nbytes}});
}

}  // namespace vaedecode::formats
