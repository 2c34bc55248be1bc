// Fuzz target: what a peer or an operator hands the coordinator before it is
// trusted (issue 21): Hello messages (coordinator/membership/hello_validator.h), the
// URI names of worker certificates (coordinator/membership/worker_identity.h), listen
// addresses and timing flags (coordinator/server_flags.h), and the text
// helpers that quote or log what peers sent (common/safe_text.h).
//
// Input: records (fuzz_support.h); selector % 5 chooses
//   0  a serialized Hello       ValidateHello; a Hello it accepts has only
//                               bounded, control-free strings
//   1  newline-separated URIs   WorkerIdentity::FromUris; AllowsWorker agrees
//                               with the names given; Describe is bounded
//   2  an address               CheckHostPort; an accepted one has a port
//                               of at most 65535
//   3  seven durations (text,   CheckTimingFlags; accepted values are finite
//      ';'-separated)           and within the documented ranges
//   4  any bytes                Quoted and LogSafe hold no control characters
//                               and are bounded

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cohort/v1/workers.pb.h"
#include "common/safe_text.h"
#include "coordinator/membership/hello_validator.h"
#include "coordinator/membership/worker_identity.h"
#include "coordinator/server_flags.h"
#include "fuzz/fuzz_support.h"

namespace cohort::fuzz {
namespace {

bool HasControl(absl::string_view text) {
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

void Hello(absl::string_view bytes) {
  v1::Hello hello;
  if (!hello.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  const absl::Status valid = coordinator::ValidateHello(hello);
  if (!valid.ok()) {
    CheckHandlerError(valid, "ValidateHello");
    Require(valid.message().size() < 512, "a Hello error echoes what the peer sent");
    Require(!HasControl(valid.message()), "a Hello error holds a control character");
    return;
  }
  Require(!hello.worker_id().empty() && hello.worker_id().size() <= 128,
          "an accepted worker id is empty or longer than 128 bytes");
  for (const std::string* text :
       {&hello.worker_id(), &hello.host(), &hello.metrics_address(),
        &hello.capabilities().device_name(), &hello.held().job_id()}) {
    Require(text->size() <= 300, "an accepted Hello string is longer than 300 bytes");
    Require(!HasControl(*text), "an accepted Hello string holds a control character");
  }
}

void Uris(absl::string_view text) {
  std::vector<std::string> uris = absl::StrSplit(text, '\n');
  const coordinator::WorkerIdentity identity = coordinator::WorkerIdentity::FromUris(uris);
  bool wildcard = false;
  for (const std::string& uri : uris) wildcard |= uri == "cohort://worker/*";
  Require(identity.any() == wildcard, "any() differs from the presence of cohort://worker/*");
  for (const std::string& uri : uris) {
    constexpr absl::string_view kWorker = "cohort://worker/";
    if (absl::StartsWith(uri, kWorker) && uri.size() > kWorker.size() &&
        uri.size() - kWorker.size() <= 253) {
      Require(identity.AllowsWorker(uri.substr(kWorker.size()), ""),
              "a named worker is not allowed");
    }
  }
  if (!wildcard) {
    // Longer than any name a certificate may give (253 bytes), so unnamed.
    Require(!identity.AllowsWorker(std::string(300, 'u'), ""), "an unnamed worker is allowed");
  }
  (void)identity.Describe();
}

void Address(absl::string_view text) {
  const absl::Status valid = CheckHostPort("listen", text);
  if (!valid.ok()) {
    CheckHandlerError(valid, "CheckHostPort");
    Require(!HasControl(valid.message()), "an address error holds a control character");
    return;
  }
  const size_t colon = text.rfind(':');
  Require(colon != absl::string_view::npos, "an accepted address has no port");
  uint32_t port = 0;
  Require(absl::SimpleAtoi(text.substr(colon + 1), &port) && port <= 65535,
          "an accepted port is not a number of at most 65535");
}

void Timing(absl::string_view text) {
  std::vector<absl::Duration> values;
  for (absl::string_view part : absl::StrSplit(text, ';')) {
    absl::Duration d;
    values.push_back(absl::ParseDuration(part, &d) ? d : absl::ZeroDuration());
  }
  values.resize(7, absl::Seconds(1));
  const coordinator::TimingFlags flags{values[0], values[1], values[2], values[3],
                                       values[4], values[5], values[6]};
  const absl::Status valid = coordinator::CheckTimingFlags(flags);
  if (!valid.ok()) {
    CheckHandlerError(valid, "CheckTimingFlags");
    return;
  }
  Require(flags.heartbeat_timeout > flags.heartbeat_interval &&
              flags.heartbeat_timeout <= absl::Hours(1),
          "an accepted heartbeat timeout is out of range");
  for (absl::Duration d : values) {
    Require(d >= absl::ZeroDuration() && d <= absl::Hours(24 * 7),
            "an accepted duration is negative or over 7 days");
  }
}

void Text(absl::string_view bytes) {
  const std::string quoted = Quoted(bytes);
  Require(quoted.size() <= 66 || quoted.front() == '<', "Quoted shows more than 64 bytes");
  Require(!HasControl(quoted), "Quoted holds a control character");
  const std::string safe = LogSafe(bytes, 64);
  Require(!HasControl(safe), "LogSafe holds a control character");
  Require(safe.size() <= 4 * 64 + 32, "LogSafe is not bounded");
}

}  // namespace
}  // namespace cohort::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort::fuzz;
  static const bool quiet = (QuietLogs(), true);
  (void)quiet;
  RecordReader reader(std::string_view(reinterpret_cast<const char*>(data), size));
  Record record;
  while (reader.Next(&record)) {
    const absl::string_view payload(record.payload.data(), record.payload.size());
    switch (record.selector % 5) {
      case 0: Hello(payload); break;
      case 1: Uris(payload); break;
      case 2: Address(payload); break;
      case 3: Timing(payload); break;
      default: Text(payload); break;
    }
  }
  return 0;
}
