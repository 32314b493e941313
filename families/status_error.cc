#include "families/status_error.h"

#include <exception>
#include <new>

#include <c10/util/Exception.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace vaedecode::families {
namespace {

// LibTorch errors carry a multi-line backtrace after the first line.
std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

absl::Status FromMessage(const char* what, const std::string& message) {
  const std::string line = FirstLine(message);
  if (absl::StrContains(line, "out of memory") || absl::StrContains(line, "can't allocate")) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory: ", line));
  }
  return absl::InternalError(absl::StrCat(what, " failed: ", line));
}

}  // namespace

absl::Status CatchExceptions(const char* what, const std::function<void()>& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const families::StatusError& e) {
    return e.status();
  } catch (const c10::Error& e) {
    return FromMessage(what, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  } catch (const std::exception& e) {
    return FromMessage(what, e.what());
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, " failed with an unknown exception"));
  }
}

}  // namespace vaedecode::families
