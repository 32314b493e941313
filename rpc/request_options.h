#pragma once

// The request options as data: one row per option of a v1::DecodeRequest
// (its field, kind, range, default and help), which every front end reads:
// the HTTP query parser (server/remote_decode.cc), the OIP parameters
// (server/oip_translation.cc), the CLI's flags and usage (cli/) and the
// client's flags (client/main.cc) set a request through SetOption, and
// ValidateDecodeOptions (rpc/request_checks.h) checks every request, from
// any protocol, against the same ranges. The field is set by protobuf
// reflection, so a new option is one row here plus its field in
// vaedecode.proto and what the worker does with it.
//
// Names: the field's name is the HTTP query parameter and the OIP parameter;
// the CLI flag is the name with '-' for '_' (--jpeg-quality), the client's
// absl flag the name itself (--jpeg_quality).
//
// Thread-safe: immutable after the first use.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::rpc {

enum class OptionKind {
  kChoice,    // an enum field, by its values' names (OptionInfo::choices)
  kInteger,   // an int32 field within [min, max]
  kUnsigned,  // a uint64 field (any value)
  kNumber,    // a double field, finite, within [min, max]
  kName,      // a string field: a name of at most kMaxNameLength characters (another model's)
};

// The longest kName option value (a model's name).
inline constexpr size_t kMaxNameLength = 256;

// Where an option is offered (the validation always checks it).
enum Surface : unsigned {
  kHttp = 1,    // remote_decode's query (which has its own output_type)
  kOip = 2,     // OIP request parameters
  kCli = 4,     // the vaedecode CLI (which takes its output format from --out, its mode from its own flag)
  kClient = 8,  // vaedecode_client's flags
};

struct OptionInfo {
  std::string name;  // the DecodeRequest field
  OptionKind kind;
  unsigned surfaces;  // Surface bits
  // kChoice: the names each value is read by (first: the value's name; then
  // aliases), in the enum's order.
  std::vector<std::pair<int, std::vector<std::string>>> choices;
  double min = 0, max = 0;  // kInteger, kNumber
  // What an unset field means ("75", "the model's own"), for help and the
  // range errors; "" when unset is simply the first choice.
  std::string unset;
  std::string help;

  // The CLI's flag, "--jpeg-quality".
  std::string CliFlag() const;
  // "1..100", "auto, dense, exact or tiled", ">= 0", "any number".
  std::string Accepted() const;
};

// A value as a protocol carries it: text (HTTP, CLI) or typed (OIP).
using OptionValue = std::variant<std::string, int64_t, uint64_t, double, bool>;

// Every option.
absl::Span<const OptionInfo> RequestOptions();
// The options of a v1::EncodeRequest (posterior, seed, latent_space, mode),
// the same way: its HTTP query parameters and OIP parameters by name.
absl::Span<const OptionInfo> EncodeOptions();
// The option named `name` (a field name, or a CLI flag without "--");
// nullptr when none.
const OptionInfo* FindRequestOption(absl::string_view name);

// Sets `option` on `request` from `value`: text is parsed by the option's
// kind; numbers are taken for numeric options (an integer option takes an
// integral double); choices take a name. INVALID_ARGUMENT "<name>: <why>"
// naming what is accepted when the value is malformed or out of range.
absl::Status SetOption(const OptionInfo& option, const OptionValue& value, v1::DecodeRequest& request);
// The same for an EncodeOptions() row.
absl::Status SetOption(const OptionInfo& option, const OptionValue& value, v1::EncodeRequest& request);

// Every option of `request` within its option's range (an unset int32 is
// 0, meaning the default) and every choice a known value.
absl::Status CheckOptionRanges(const v1::DecodeRequest& request);

// The usage lines of the options offered on `surface` ("  --jpeg-quality Q
// ..."), for the CLI's usage text and the client's flag help.
std::string OptionUsage(Surface surface);
// The same for the encode options.
std::string EncodeOptionUsage(Surface surface);

}  // namespace vaedecode::rpc
