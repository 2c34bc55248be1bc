#pragma once
// Text from peers in messages and logs: quoted when short and printable,
// described otherwise, so an error or a log line never echoes megabytes or
// a newline that forges the next line.

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace cohort {

// "\"value\"" if `value` is at most `max` printable ASCII characters, else
// "<N bytes, not shown>".
std::string Quoted(absl::string_view value, size_t max = 64);

// `value` with control characters, backslashes and bytes >= 0x80 escaped
// (\n, \xNN), cut to `max` bytes with "...(N bytes)": for log lines.
std::string LogSafe(absl::string_view value, size_t max = 256);

}  // namespace cohort
