// vaedecode: decode diffusion latents (and encode images) with a diffusers VAE from the command line.

#include <iostream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/group_mode.h"
#include "device/counting_cpu_allocator.h"

int main(int argc, char** argv) {
  using vaedecode::cli::ParseArgs;
  // Before any tensor exists, so every CPU allocation is counted (peaks).
  vaedecode::device::CountingCpuAllocator::Install();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << vaedecode::cli::Usage();
    return args.empty() ? 2 : 0;
  }
  absl::StatusOr<vaedecode::cli::ParsedArgs> parsed = ParseArgs(args, vaedecode::cli::CommandFlags());
  if (!parsed.ok()) {
    std::cerr << "vaedecode: " << parsed.status().message() << "\n" << vaedecode::cli::Usage();
    return 2;
  }
  absl::Status status;
  if (parsed->command == "decode") {
    status = vaedecode::cli::RunDecode(*parsed, std::cout);
  } else if (parsed->command == "encode") {
    status = vaedecode::cli::RunEncode(*parsed, std::cout);
  } else if (parsed->command == "info") {
    status = vaedecode::cli::RunInfo(*parsed, std::cout);
  } else {
    status = vaedecode::cli::RunRank(*parsed);
    if (!status.ok()) std::cerr << "vaedecode rank " << parsed->Get("rank").value_or("?") << ": ";
  }
  if (!status.ok()) {
    std::cerr << "vaedecode: error: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
