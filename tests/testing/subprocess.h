#pragma once
// Subprocess: a child process started by a test, with its stdout and stderr
// appended to a log file the test can read while it runs. Integration tests use
// it to start the real coordinator, workers, cohortctl and cohort-sim.
//
// Children never outlive the test: the child asks the kernel for SIGKILL when
// the thread that started it exits (PR_SET_PDEATHSIG), and the destructor
// SIGKILLs the child's process group and reaps it if it is still running.
//
// Thread-safe: every method may be called from any thread.

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace cohort::testing {

class Subprocess {
 public:
  // Members have default initializers so designated initializers may name
  // only some of them under -Wextra.
  struct Options {
    // Path of the executable; a name without '/' is looked up on $PATH.
    std::string binary{};
    // Arguments after argv[0] (argv[0] is `binary`).
    std::vector<std::string> args{};
    // Added to (and overriding) the inherited environment.
    std::vector<std::pair<std::string, std::string>> env{};
    // stdout and stderr are appended here; default: a file in a fresh temp dir.
    std::string log_path{};
  };

  // Starts the process. Errors: NotFound if the binary does not exist or is
  // not executable; Internal if fork/exec fails (message carries errno text).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(Options options);

  // SIGKILLs the process group and reaps the child if it is still running.
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // Sends `sig` to the child (not its group). No-op once it has been reaped.
  void Signal(int sig);
  // Signal(SIGKILL).
  void Kill();

  // Waits for the child to exit; returns its exit code, or 128 + signal when a
  // signal ended it. DeadlineExceeded if it is still running after `timeout`
  // (the child keeps running). Once reaped, returns the same value again.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // Whether the child has not exited yet (reaps it if it just did).
  bool Running();

  // The whole log file so far ("" if it cannot be read).
  std::string ReadLog() const;

 private:
  Subprocess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}

  // Reaps without blocking; true once the exit status is known.
  bool PollLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const pid_t pid_;
  const std::string log_path_;
  mutable absl::Mutex mu_;
  std::optional<int> exit_code_ ABSL_GUARDED_BY(mu_);
};

// Polls the log of `process` until a line containing `needle` appears and
// returns that line (without the newline). DeadlineExceeded after `timeout`;
// FailedPrecondition if the process exits without logging it. Both error
// messages end with the tail of the log, to make failures readable.
absl::StatusOr<std::string> WaitForLogLine(const Subprocess& process, std::string_view needle,
                                           absl::Duration timeout);

struct CommandResult {
  int exit_code = 0;   // exit code, or 128 + signal
  std::string output;  // stdout and stderr, interleaved as written
};

// Runs `binary args...` to completion and captures its output. If it is still
// running after `timeout` it is killed and DeadlineExceeded is returned (the
// message includes the output so far). Start errors as Subprocess::Start.
absl::StatusOr<CommandResult> RunCommand(const std::string& binary,
                                         const std::vector<std::string>& args,
                                         absl::Duration timeout);
// Same, with environment additions or a chosen log path.
absl::StatusOr<CommandResult> RunCommand(Subprocess::Options options, absl::Duration timeout);

}  // namespace cohort::testing
