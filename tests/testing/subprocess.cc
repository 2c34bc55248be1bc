#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "tests/testing/paths.h"

extern char** environ;

namespace cohort::testing {
namespace {

// Exit status of a reaped child as a shell would report it.
int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

bool IsExecutable(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// `binary` itself if it has a '/', else the first match on $PATH.
absl::StatusOr<std::string> ResolveBinary(const std::string& binary) {
  if (binary.empty()) return absl::InvalidArgumentError("Subprocess: empty binary");
  if (binary.find('/') != std::string::npos) {
    if (!IsExecutable(binary)) {
      return absl::NotFoundError(absl::StrCat("Subprocess: not an executable file: ", binary));
    }
    return binary;
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", binary);
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("Subprocess: ", binary, " not found on $PATH"));
}

// The inherited environment with `overrides` replacing or adding entries.
std::vector<std::string> BuildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    const absl::string_view key = entry.substr(0, entry.find('='));
    const bool overridden = std::any_of(overrides.begin(), overrides.end(),
                                        [&](const auto& kv) { return kv.first == key; });
    if (!overridden) env.emplace_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(absl::StrCat(key, "=", value));
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Writes `value` to `fd`; used by the child after fork, so async-signal-safe.
void WriteErrno(int fd, int value) {
  ssize_t ignored = ::write(fd, &value, sizeof(value));
  (void)ignored;
}

std::string LogTail(const std::string& log) {
  constexpr size_t kTail = 4000;
  if (log.size() <= kTail) return log;
  return absl::StrCat("...", log.substr(log.size() - kTail));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(Options options) {
  absl::StatusOr<std::string> binary = ResolveBinary(options.binary);
  if (!binary.ok()) return binary.status();
  std::string log_path = options.log_path;
  if (log_path.empty()) {
    const std::string base = binary->substr(binary->rfind('/') + 1);
    log_path = absl::StrCat(MakeTempDir("subprocess"), "/", base, ".log");
  }

  // Everything the child needs is prepared before fork: between fork and exec
  // a multi-threaded parent's child may only call async-signal-safe functions.
  std::vector<std::string> argv_strings = {*binary};
  argv_strings.insert(argv_strings.end(), options.args.begin(), options.args.end());
  std::vector<std::string> env_strings = BuildEnvironment(options.env);
  std::vector<char*> argv = CStrings(argv_strings);
  std::vector<char*> envp = CStrings(env_strings);

  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
  }
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int error_pipe[2];  // the child reports an exec failure's errno here
  if (null_fd < 0 || ::pipe2(error_pipe, O_CLOEXEC) != 0) {
    const int saved = errno;
    ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    return absl::InternalError(absl::StrCat("Subprocess setup: ", std::strerror(saved)));
  }
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child. Own process group, so the destructor can kill what it spawns too.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    // A test harness may have blocked or ignored signals; the child starts clean.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    if (::dup2(null_fd, STDIN_FILENO) < 0 || ::dup2(log_fd, STDOUT_FILENO) < 0 ||
        ::dup2(log_fd, STDERR_FILENO) < 0) {
      WriteErrno(error_pipe[1], errno);
      ::_exit(127);
    }
    ::execve(argv[0], argv.data(), envp.data());
    WriteErrno(error_pipe[1], errno);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(log_fd);
  ::close(null_fd);
  ::close(error_pipe[1]);
  if (pid < 0) {
    ::close(error_pipe[0]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(fork_errno)));
  }
  // EOF (exec succeeded and closed the CLOEXEC pipe) or the child's errno.
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(error_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  ::close(error_pipe[0]);
  if (n == sizeof(child_errno)) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return absl::InternalError(absl::StrCat("exec ", *binary, ": ", std::strerror(child_errno)));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, std::move(log_path)));
}

Subprocess::~Subprocess() {
  absl::MutexLock lock(&mu_);
  if (PollLocked()) return;
  // The whole group: a child that spawned helpers must not leak them.
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

bool Subprocess::PollLocked() {
  if (exit_code_.has_value()) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_code_ = DecodeStatus(status);
    return true;
  }
  if (r < 0 && errno == ECHILD) {
    // Reaped by someone else (e.g. a SIGCHLD handler); the code is lost.
    exit_code_ = -1;
    return true;
  }
  return false;
}

void Subprocess::Signal(int sig) {
  absl::MutexLock lock(&mu_);
  // Once reaped the pid may belong to an unrelated process.
  if (exit_code_.has_value()) return;
  ::kill(pid_, sig);
}

void Subprocess::Kill() { Signal(SIGKILL); }

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Microseconds(200);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (PollLocked()) return *exit_code_;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
}

bool Subprocess::Running() {
  absl::MutexLock lock(&mu_);
  return !PollLocked();
}

std::string Subprocess::ReadLog() const {
  std::ifstream in(log_path_, std::ios::binary);
  if (!in) return "";
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::StatusOr<std::string> WaitForLogLine(const Subprocess& process, std::string_view needle,
                                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Running() reaps, which needs a non-const object; the pid is only polled.
  Subprocess& mutable_process = const_cast<Subprocess&>(process);
  while (true) {
    // Check exit before reading so a line written just before exit is seen.
    const bool exited = !mutable_process.Running();
    const std::string log = process.ReadLog();
    size_t pos = log.find(needle);
    if (pos != std::string::npos) {
      const size_t begin = log.rfind('\n', pos);
      const size_t start = begin == std::string::npos ? 0 : begin + 1;
      const size_t end = log.find('\n', pos);
      return log.substr(start, end == std::string::npos ? std::string::npos : end - start);
    }
    if (exited) {
      absl::StatusOr<int> code = mutable_process.Wait(absl::ZeroDuration());
      return absl::FailedPreconditionError(absl::StrCat(
          "pid ", process.pid(), " exited (", code.ok() ? *code : -1, ") without logging \"",
          std::string(needle), "\"; log tail:\n", LogTail(log)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line with \"", std::string(needle), "\" from pid ", process.pid(),
                       " within ", absl::FormatDuration(timeout), "; log tail:\n", LogTail(log)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<CommandResult> RunCommand(const std::string& binary,
                                         const std::vector<std::string>& args,
                                         absl::Duration timeout) {
  Subprocess::Options options;
  options.binary = binary;
  options.args = args;
  return RunCommand(std::move(options), timeout);
}

absl::StatusOr<CommandResult> RunCommand(Subprocess::Options options, absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(std::move(options));
  if (!process.ok()) return process.status();
  absl::StatusOr<int> code = (*process)->Wait(timeout);
  if (!code.ok()) {
    (*process)->Kill();
    (void)(*process)->Wait(absl::Seconds(5));
    return absl::DeadlineExceededError(absl::StrCat(code.status().message(), "; output so far:\n",
                                                    LogTail((*process)->ReadLog())));
  }
  return CommandResult{*code, (*process)->ReadLog()};
}

}  // namespace cohort::testing
