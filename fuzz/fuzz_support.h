#pragma once
// Helpers shared by the fuzz targets (fuzz/*_fuzzer.cc) and the seed writer.
//
// Record framing: a target that runs a sequence of operations reads its
// input as records
//
//   u8 selector | u16 little-endian length n | n payload bytes
//
// (a record whose length runs past the end takes what is left), so every
// byte string is a valid, if short, sequence, and libFuzzer's mutations of
// one record leave the others in place.
//
// Thread-compatible; the targets run single-threaded.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace cohort::fuzz {

struct Record {
  uint8_t selector = 0;
  std::string_view payload;
};

// Reads records from the front of `data`, one at a time.
class RecordReader {
 public:
  explicit RecordReader(std::string_view data) : data_(data) {}
  // The next record; false when the input is used up.
  bool Next(Record* record);

 private:
  std::string_view data_;
};

// Appends one record (payloads over 65535 bytes are cut) to `out`.
void AppendRecord(uint8_t selector, std::string_view payload, std::string* out);

// Whether `text` is one JSON value by RFC 8259: UTF-8, the grammar, and
// nothing more (names may repeat and numbers need not fit a double, as the
// RFC allows; protobuf's parser refuses both, so it is not used here).
bool IsJson(std::string_view text);

// Drops the project's log lines below FATAL (a target logs on every error
// path) and protobuf's, unless COHORT_FUZZ_LOG is set, e.g. to replay one input.
void QuietLogs();

// Whether `text` is well-formed UTF-8 (no overlongs, surrogates or code
// points above U+10FFFF).
bool IsUtf8(std::string_view text);

// A path for this process's scratch file or directory `name`, on tmpfs when
// there is one: <dir>/cohort-fuzz-<name>-<pid>. Scratch paths of processes
// that are gone (a crash skips the atexit cleanup) are removed first. The
// caller removes its own at exit.
std::string ScratchPath(std::string_view name);

// Aborts with `what` and the status when `status` is an error that is not a
// proper handler error: every error must carry a canonical code other than
// UNKNOWN and a message (docs/conventions.md, Errors: "a message a user can act on").
void CheckHandlerError(const absl::Status& status, const char* what);

// Aborts with a message when `condition` is false: a property of the code
// under test that the fuzz input broke (a finding, like a sanitizer report).
void Require(bool condition, const char* what);

}  // namespace cohort::fuzz
