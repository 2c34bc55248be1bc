#include "tools/sim/metrics_scrape.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace cohort::sim {
namespace {

// "name{labels} value" -> (series, value); false for comments and junk.
bool ParseSample(absl::string_view line, std::string* series, double* value) {
  if (line.empty() || line[0] == '#') return false;
  const size_t space = line.rfind(' ');
  if (space == absl::string_view::npos) return false;
  *series = std::string(line.substr(0, space));
  return absl::SimpleAtod(line.substr(space + 1), value);
}

// The value of label `le` in a series' label text, if any.
std::optional<double> LeOf(absl::string_view series) {
  const size_t at = series.find("le=\"");
  if (at == absl::string_view::npos) return std::nullopt;
  const size_t start = at + 4;
  const size_t end = series.find('"', start);
  absl::string_view text = series.substr(start, end - start);
  if (text == "+Inf") return std::numeric_limits<double>::infinity();
  double le = 0;
  if (!absl::SimpleAtod(text, &le)) return std::nullopt;
  return le;
}

}  // namespace

absl::StatusOr<std::string> FetchMetrics(const std::string& address, absl::Duration timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError("metrics address: host:port");
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", address));
  }
  const int fd = socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  const bool connected = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!connected) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address, ": ",
                                               std::strerror(errno)));
  }
  const std::string request = absl::StrCat("GET /metrics HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot send to ", address));
  }
  std::string response;
  const absl::Time deadline = absl::Now() + timeout;
  char buffer[65536];
  for (;;) {
    const int wait_ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{fd, POLLIN, 0};
    if (wait_ms <= 0 || poll(&p, 1, wait_ms) <= 0) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat("no whole answer from ", address));
    }
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    response.append(buffer, static_cast<size_t>(n));
    if (response.size() > (64u << 20)) break;  // far more than any /metrics
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos ||
      response.find(" 200 ") > body) {
    return absl::UnavailableError(absl::StrCat("GET /metrics from ", address, " failed"));
  }
  return response.substr(body + 4);
}

MetricsText::MetricsText(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::string series;
    double value = 0;
    if (ParseSample(line, &series, &value)) samples_[series] = value;
  }
}

double MetricsText::Sum(absl::string_view name) const {
  double sum = 0;
  for (const auto& [series, value] : samples_) {
    if (series == name || (absl::StartsWith(series, name) && series.size() > name.size() &&
                           series[name.size()] == '{')) {
      sum += value;
    }
  }
  return sum;
}

std::optional<double> MetricsText::Quantile(absl::string_view name, double q,
                                            absl::string_view label_filter) const {
  const std::string bucket = absl::StrCat(name, "_bucket{");
  std::map<double, double> cumulative;  // le -> count summed over matching series
  for (const auto& [series, value] : samples_) {
    if (series.rfind(bucket, 0) != 0) continue;
    if (!label_filter.empty() && !absl::StrContains(series, label_filter)) continue;
    if (std::optional<double> le = LeOf(series)) cumulative[*le] += value;
  }
  if (cumulative.empty() || cumulative.rbegin()->second <= 0) return std::nullopt;
  const double total = cumulative.rbegin()->second;
  for (const auto& [le, count] : cumulative) {
    if (count >= q * total) return le;
  }
  return cumulative.rbegin()->first;
}

std::string DiffMetrics(absl::string_view before, absl::string_view after) {
  std::map<std::string, double> old;
  for (absl::string_view line : absl::StrSplit(before, '\n')) {
    std::string series;
    double value = 0;
    if (ParseSample(line, &series, &value)) old[series] = value;
  }
  std::string out;
  for (absl::string_view line : absl::StrSplit(after, '\n')) {
    std::string series;
    double value = 0;
    if (!ParseSample(line, &series, &value)) continue;
    auto it = old.find(series);
    absl::StrAppend(&out, series, " ", value - (it == old.end() ? 0 : it->second), "\n");
  }
  return out;
}

}  // namespace cohort::sim
