#pragma once

// The `vaedecode` subcommands. Each returns a Status; main() prints it as one
// line and turns it into the exit code.

#include <ostream>

#include "absl/status/status.h"
#include "cli/args.h"

namespace vaedecode::cli {

// The flags each command accepts (for ParseArgs).
const std::map<std::string, std::set<std::string>>& CommandFlags();

// decode: latent file (or a seeded demo latent) -> .safetensors / .npy / .png.
absl::Status RunDecode(const ParsedArgs& args, std::ostream& out);

// encode: image (.png/.jpg or a tensor file) -> latent .safetensors / .npy.
absl::Status RunEncode(const ParsedArgs& args, std::ostream& out);

// info: family, config, parameter count, latent channels, scale factors.
absl::Status RunInfo(const ParsedArgs& args, std::ostream& out);

std::string Usage();

}  // namespace vaedecode::cli
