#include "coordinator/paging.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace cohort::coordinator {

absl::StatusOr<PageRequest> ParsePageRequest(absl::string_view kind, int32_t page_size,
                                             absl::string_view page_token, size_t default_size,
                                             size_t max_size) {
  if (page_size < 0 || static_cast<size_t>(page_size) > max_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: ", page_size, " is outside [0, ", max_size, "] (0: ",
                     default_size, ")"));
  }
  PageRequest page;
  page.limit = page_size == 0 ? default_size : static_cast<size_t>(page_size);
  if (!page_token.empty()) {
    const std::string prefix = absl::StrCat(kind, "/");
    if (!absl::StartsWith(page_token, prefix) || page_token.size() == prefix.size() ||
        page_token.size() > 512) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page_token: not a next_page_token this coordinator returned for ", kind));
    }
    page.after = std::string(page_token.substr(prefix.size()));
  }
  return page;
}

std::string PageToken(absl::string_view kind, absl::string_view last_key) {
  return absl::StrCat(kind, "/", last_key);
}

}  // namespace cohort::coordinator
