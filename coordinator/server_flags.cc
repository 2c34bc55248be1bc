#include "coordinator/server_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace cohort::coordinator {
namespace {

// Heartbeat periods travel to workers as uint32 milliseconds (Welcome);
// every other duration is kept far below that too.
constexpr absl::Duration kMaxHeartbeat = absl::Hours(1);
constexpr absl::Duration kMaxDeadline = absl::Hours(24 * 7);

std::string Format(absl::Duration d) { return absl::FormatDuration(d); }

}  // namespace

absl::Status CheckDuration(absl::string_view flag, absl::Duration value, absl::Duration min,
                           absl::Duration max) {
  if (value == absl::InfiniteDuration() || value == -absl::InfiniteDuration() || value < min ||
      value > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", Format(value),
                                                   " is outside [", Format(min), ", ",
                                                   Format(max), "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckHostPort(absl::string_view flag, absl::string_view address) {
  auto bad = [&](absl::string_view why) {
    // The value is echoed only when short and printable.
    const bool echo = address.size() <= 256 && std::all_of(address.begin(), address.end(),
                                                           [](char c) { return absl::ascii_isprint(c); });
    return absl::InvalidArgumentError(absl::StrCat("--", flag, (echo ? "=" : ""),
                                                   (echo ? address : ""), ": ", why));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("must be host:port");
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  if (host.empty()) return bad("the host is empty");
  if (host.front() == '[' ? host.back() != ']' || host.size() < 3
                          : host.find(':') != absl::string_view::npos) {
    return bad("an IPv6 host must be in brackets, e.g. [::1]:7070");
  }
  uint32_t value = 0;
  if (port.empty() || port.size() > 5 || !absl::SimpleAtoi(port, &value) ||
      !std::all_of(port.begin(), port.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
      value > 65535) {
    return bad("the port must be a number from 0 (pick a free port) to 65535");
  }
  return absl::OkStatus();
}

absl::Status CheckTimingFlags(const TimingFlags& f) {
  const absl::Duration ms = absl::Milliseconds(1);
  if (absl::Status s = CheckDuration("heartbeat_interval", f.heartbeat_interval, 10 * ms, kMaxHeartbeat);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDuration("heartbeat_timeout", f.heartbeat_timeout,
                                     f.heartbeat_interval + ms, kMaxHeartbeat);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (it must exceed --heartbeat_interval)"));
  }
  struct Bound {
    const char* flag;
    absl::Duration value, min, max;
  };
  const Bound bounds[] = {
      {"readopt_grace", f.readopt_grace, absl::ZeroDuration(), kMaxDeadline},
      {"suspend_timeout", f.suspend_timeout, ms, kMaxDeadline},
      {"prepare_timeout", f.prepare_timeout, ms, kMaxDeadline},
      {"hang_timeout_floor", f.hang_timeout_floor, absl::ZeroDuration(), kMaxDeadline},
      {"checkpoint_abandon_after", f.checkpoint_abandon_after, absl::Seconds(1), kMaxDeadline},
  };
  for (const Bound& b : bounds) {
    if (absl::Status s = CheckDuration(b.flag, b.value, b.min, b.max); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace cohort::coordinator
