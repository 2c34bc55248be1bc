#pragma once
// Loopback networking helpers for tests.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cohort::testing {

// A TCP port on 127.0.0.1 that was free a moment ago: binds port 0 with
// SO_REUSEADDR, reads the port and closes. Another process may still take it
// before the caller binds; prefer port 0 where the server reports its port.
// Aborts the test binary if no socket can be bound.
int PickFreePort();

// HTTP/1.0 GET http://host_port/path; returns the body. `host_port` is
// "host:port" (e.g. "127.0.0.1:9100"). Unavailable if the connection fails,
// DeadlineExceeded if the whole exchange takes longer than `timeout`,
// Internal on a malformed response, and FailedPrecondition for a status other
// than 200 (the message carries the status line).
absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout);

}  // namespace cohort::testing
