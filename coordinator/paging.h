#pragma once
// Pages of Jobs.List and Workers.List (issue 21: one response with every
// job or worker could outgrow what clients accept). A page token names the
// last key returned ("jobs/<submit number>", "workers/<worker id>"), so
// pages stay correct while jobs and workers come and go.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cohort::coordinator {

struct PageRequest {
  std::string after;  // the last key of the previous page; empty: from the start
  size_t limit = 0;
};

// `kind` is "jobs" or "workers". InvalidArgument naming page_size (negative
// or above `max_size`) or page_token (not one this coordinator returned for
// `kind`).
absl::StatusOr<PageRequest> ParsePageRequest(absl::string_view kind, int32_t page_size,
                                             absl::string_view page_token, size_t default_size,
                                             size_t max_size);
std::string PageToken(absl::string_view kind, absl::string_view last_key);

}  // namespace cohort::coordinator
