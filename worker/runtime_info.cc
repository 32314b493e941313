#include "worker/runtime_info.h"

#include <link.h>

#include <climits>
#include <cstdlib>
#include <cstring>

namespace vaedecode::worker {

std::string LoadedBlasLibrary() {
  std::string found;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* out) -> int {
        const char* name = info->dlpi_name;
        if (name == nullptr || std::strstr(name, "blas") == nullptr) return 0;
        char resolved[PATH_MAX];
        const char* path = realpath(name, resolved) ? resolved : name;
        *static_cast<std::string*>(out) = path;
        return 1;
      },
      &found);
  return found.empty() ? "unknown" : found;
}

}  // namespace vaedecode::worker
