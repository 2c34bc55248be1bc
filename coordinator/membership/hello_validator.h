#pragma once
// Bounds on what a worker's Hello may carry (issue 21). The coordinator
// keeps these strings (membership, lost-worker records for 10 minutes),
// logs them and returns them from Workers.List, so each is limited in
// length and characters before it is stored: no forged log lines, no
// megabyte ids.

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "cohort/v1/workers.pb.h"

namespace cohort::coordinator {

inline constexpr int kMaxWorkerIdLength = 128;
inline constexpr int kMaxHostLength = 253;  // a DNS name

// OK, or InvalidArgument naming the first bad field ("hello.<field>: ...").
// A bad value is quoted only when it is short and printable.
absl::Status ValidateHello(const v1::Hello& hello);

}  // namespace cohort::coordinator
