#include "coordinator/membership/worker_identity.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cohort::coordinator {
namespace {

constexpr absl::string_view kWorkerPrefix = "cohort://worker/";
constexpr absl::string_view kHostPrefix = "cohort://host/";
constexpr size_t kMaxName = 253;

}  // namespace

WorkerIdentity WorkerIdentity::FromUris(const std::vector<std::string>& uris) {
  WorkerIdentity identity;
  for (const std::string& uri : uris) {
    if (absl::StartsWith(uri, kWorkerPrefix)) {
      const std::string name = uri.substr(kWorkerPrefix.size());
      if (name == "*") {
        identity.any_ = true;
      } else if (!name.empty() && name.size() <= kMaxName) {
        identity.workers_.push_back(name);
      }
    } else if (absl::StartsWith(uri, kHostPrefix)) {
      const std::string name = uri.substr(kHostPrefix.size());
      if (!name.empty() && name.size() <= kMaxName) identity.hosts_.push_back(name);
    }
  }
  std::sort(identity.workers_.begin(), identity.workers_.end());
  std::sort(identity.hosts_.begin(), identity.hosts_.end());
  return identity;
}

bool WorkerIdentity::AllowsWorker(std::string_view worker_id, std::string_view host) const {
  if (any_) return true;
  if (std::binary_search(workers_.begin(), workers_.end(), worker_id)) return true;
  return !host.empty() && std::binary_search(hosts_.begin(), hosts_.end(), host);
}

std::string WorkerIdentity::Describe() const {
  if (any_) return "any worker";
  if (workers_.empty() && hosts_.empty()) {
    return "no worker (the certificate has no cohort://worker/<id> or cohort://host/<host> "
           "URI name)";
  }
  std::string out;
  if (!workers_.empty()) absl::StrAppend(&out, "workers ", absl::StrJoin(workers_, ", "));
  if (!hosts_.empty()) {
    absl::StrAppend(&out, out.empty() ? "" : " and ", "workers on hosts ",
                    absl::StrJoin(hosts_, ", "));
  }
  return out;
}

}  // namespace cohort::coordinator
