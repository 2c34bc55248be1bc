#pragma once
// Early-return helpers for absl::Status / absl::StatusOr.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define COHORT_CONCAT_INNER(a, b) a##b
#define COHORT_CONCAT(a, b) COHORT_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::absl::Status _status = (expr);          \
    if (!_status.ok()) return _status;        \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F())` declares x from an OK StatusOr or returns its status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  COHORT_ASSIGN_OR_RETURN_IMPL(COHORT_CONCAT(_status_or_, __LINE__), lhs, expr)
#define COHORT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
