#include "coordinator/membership/hello_validator.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/flag_checks.h"

namespace cohort::coordinator {
namespace {

// CheckText of field `hello.<field>`; an empty value passes if `may_be_empty`.
absl::Status CheckString(absl::string_view field, absl::string_view value, size_t max,
                         bool (*ok)(char), absl::string_view allowed, bool may_be_empty) {
  if (value.empty() && may_be_empty) return absl::OkStatus();
  return CheckText(absl::StrCat("hello.", field), value, max, ok, allowed);
}

// UTF-8 is fine in a device name; control characters (a newline forging a
// log line) are not.
bool IsNotControl(char c) { return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f; }
bool IsTransportChar(char c) { return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_'; }
bool IsAddressChar(char c) { return IsNameChar(c) || c == '[' || c == ']'; }

}  // namespace

absl::Status ValidateHello(const v1::Hello& hello) {
  if (absl::Status s = CheckString("worker_id", hello.worker_id(), kMaxWorkerIdLength, IsNameChar,
                                   kNameChars, /*may_be_empty=*/false);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckString("host", hello.host(), kMaxHostLength, IsNameChar, kNameChars,
                                   /*may_be_empty=*/true);
      !s.ok()) {
    return s;
  }
  if (hello.device_index() < 0 || hello.device_index() > 4095) {
    return absl::InvalidArgumentError(absl::StrCat("hello.device_index: ", hello.device_index(),
                                                   " is outside [0, 4095]"));
  }
  if (absl::Status s = CheckString("metrics_address", hello.metrics_address(), 300, IsAddressChar,
                                   "[A-Za-z0-9._:@/[]-]", /*may_be_empty=*/true);
      !s.ok()) {
    return s;
  }
  const v1::Capabilities& caps = hello.capabilities();
  if (caps.cpu_cores() < 0 || caps.cpu_cores() > (1 << 20) || caps.memory_bytes() < 0) {
    return absl::InvalidArgumentError(
        "hello.capabilities: cpu_cores must be within [0, 2^20] and memory_bytes >= 0");
  }
  if (absl::Status s = CheckString("capabilities.device_name", caps.device_name(), 256,
                                   IsNotControl, "non-control characters", /*may_be_empty=*/true);
      !s.ok()) {
    return s;
  }
  if (caps.transports_size() > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.capabilities.transports: ", caps.transports_size(), " entries, at most 16"));
  }
  for (const std::string& transport : caps.transports()) {
    if (absl::Status s = CheckString("capabilities.transports", transport, 32, IsTransportChar,
                                     "[a-z0-9_]", /*may_be_empty=*/false);
        !s.ok()) {
      return s;
    }
  }
  if (hello.has_held()) {
    // Job ids are the coordinator's own (name-number); anything else is
    // simply not a job it knows, but it must still be safe to log.
    if (absl::Status s = CheckString("held.job_id", hello.held().job_id(), 160, IsNameChar,
                                     kNameChars, /*may_be_empty=*/true);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace cohort::coordinator
