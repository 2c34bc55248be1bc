#include "common/flag_checks.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/safe_text.h"

namespace cohort {
namespace {

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

absl::Status CheckHostPort(absl::string_view flag, absl::string_view address, PortZero zero) {
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
  const bool bracketed = host.front() == '[';
  const absl::string_view inner = bracketed ? host.substr(1, host.size() - 2) : host;
  const bool host_chars = std::all_of(inner.begin(), inner.end(), [bracketed](char c) {
    return bracketed ? absl::ascii_isxdigit(c) || c == ':' || c == '.' || c == '%'
                     : absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_';
  });
  if (!host_chars) return bad("the host has a character outside [A-Za-z0-9._-] (or brackets)");
  uint32_t value = 0;
  if (port.empty() || port.size() > 5 || !absl::SimpleAtoi(port, &value) ||
      !std::all_of(port.begin(), port.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
      value > 65535 || (value == 0 && zero == PortZero::kRefused)) {
    return bad(zero == PortZero::kRefused
                   ? "the port must be a number from 1 to 65535"
                   : "the port must be a number from 0 (pick a free port) to 65535");
  }
  return absl::OkStatus();
}

bool IsNameChar(char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == ':' || c == '@' ||
         c == '/';
}

absl::Status CheckText(absl::string_view what, absl::string_view value, size_t max,
                       bool (*ok)(char), absl::string_view allowed) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": must not be empty"));
  if (value.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", value.size(), " bytes, at most ", max, " allowed"));
  }
  if (!std::all_of(value.begin(), value.end(), ok)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", Quoted(value), " has a character outside ", allowed));
  }
  return absl::OkStatus();
}

absl::Status CheckName(absl::string_view what, absl::string_view name, size_t max) {
  return CheckText(what, name, max, IsNameChar, kNameChars);
}

}  // namespace cohort
