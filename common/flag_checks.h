#pragma once
// Start-up checks of daemon flags and of names peers announce: a bad value
// is an error naming the flag (or field) and the allowed range, never a
// silent wrap, a random port or a name that forges a log line.

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace cohort {

// `flag` (without dashes) must be finite and within [min, max].
absl::Status CheckDuration(absl::string_view flag, absl::Duration value, absl::Duration min,
                           absl::Duration max);

// What port 0 means in a host:port: a free port to listen on (servers' own
// addresses), or nothing (an address to connect to).
enum class PortZero { kPicksAFreePort, kRefused };

// host:port with a port of 0 (when it picks a free one) or 1 to 65535; the
// host a name, an IPv4 address or a bracketed IPv6 address. `flag` names it
// in the error.
absl::Status CheckHostPort(absl::string_view flag, absl::string_view address,
                           PortZero zero = PortZero::kPicksAFreePort);

// `value` (called `what` in errors) has 1 to `max` characters, each
// accepted by `ok` (described as `allowed`); the value is quoted only when
// short and printable.
absl::Status CheckText(absl::string_view what, absl::string_view value, size_t max,
                       bool (*ok)(char), absl::string_view allowed);

// The characters of worker ids and host names: [A-Za-z0-9._:@/-].
bool IsNameChar(char c);
inline constexpr char kNameChars[] = "[A-Za-z0-9._:@/-]";
// `name` (called `what` in the error) has 1 to `max` characters, each a
// name character; the value is quoted only when short and printable.
absl::Status CheckName(absl::string_view what, absl::string_view name, size_t max);

}  // namespace cohort
