#pragma once

// Early returns on a failed absl::Status / absl::StatusOr, instead of the
// hand-written `if (!s.ok()) return s;`:
//
//   RETURN_IF_ERROR(CheckLatentDtype(latent));
//   ASSIGN_OR_RETURN(int64_t numel, CountLatentElements(latent));
//   ASSIGN_OR_RETURN(auto model, catalog.Lookup(name));
//
// The expression is evaluated once. In a function returning absl::StatusOr<T>
// the status converts. Neither macro adds to the message: statuses name
// their field or file where they are made.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define VAEDECODE_STATUS_CONCAT_INNER(a, b) a##b
#define VAEDECODE_STATUS_CONCAT(a, b) VAEDECODE_STATUS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                              \
  do {                                                     \
    const ::absl::Status vaedecode_status_ = (expr);       \
    if (!vaedecode_status_.ok()) return vaedecode_status_; \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, expr) \
  VAEDECODE_ASSIGN_OR_RETURN_IMPL(VAEDECODE_STATUS_CONCAT(vaedecode_statusor_, __LINE__), lhs, expr)

#define VAEDECODE_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = *std::move(statusor)
