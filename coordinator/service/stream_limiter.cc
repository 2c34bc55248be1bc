#include "coordinator/service/stream_limiter.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace cohort::coordinator {

StreamLimiter::Lease& StreamLimiter::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    limiter_ = other.limiter_;
    client_ = std::move(other.client_);
    other.limiter_ = nullptr;
  }
  return *this;
}

void StreamLimiter::Lease::Release() {
  if (limiter_ == nullptr) return;
  limiter_->Release(client_);
  limiter_ = nullptr;
}

std::string StreamLimiter::ClientOf(absl::string_view peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) {
    return std::string(peer);
  }
  const size_t colon = peer.rfind(':');
  // "ipv4:" itself ends at index 4: only a later colon separates a port.
  if (colon == absl::string_view::npos || colon <= 4) return std::string(peer);
  return std::string(peer.substr(0, colon));
}

absl::StatusOr<StreamLimiter::Lease> StreamLimiter::Acquire(absl::string_view peer,
                                                            absl::string_view method) {
  std::string client = ClientOf(peer);
  absl::MutexLock lock(&mu_);
  int& count = open_[client];
  if (max_per_client_ > 0 && count >= max_per_client_) {
    if (count == 0) open_.erase(client);
    return absl::ResourceExhaustedError(
        absl::StrCat(method, ": client ", client, " already holds ", max_per_client_,
                     " open streams, the limit (--max_streams_per_client)"));
  }
  ++count;
  return Lease(this, std::move(client));
}

void StreamLimiter::Release(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(client);
  if (it == open_.end()) return;
  if (--it->second <= 0) open_.erase(it);
}

int StreamLimiter::open(absl::string_view client) const {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(client);
  return it == open_.end() ? 0 : it->second;
}

}  // namespace cohort::coordinator
