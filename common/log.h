#pragma once
// Minimal structured logging to stderr: one line per call, with time, level,
// file:line. Thread-safe (each line is written with a single write call).
//
//   LOG(INFO) << "worker " << id << " attached";
//   LOG(FATAL) aborts after writing: only for programmer invariants.

#include <sstream>
#include <string_view>

namespace cohort::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Lines below this level are dropped. Default kInfo; COHORT_LOG_LEVEL=debug|info|warning|error.
void SetMinLevel(Level level);
// "debug", "info", "warning", "error" (any case) -> level; false otherwise.
bool ParseLevel(std::string_view name, Level* level);
// Applies a --log_level flag value: empty keeps $COHORT_LOG_LEVEL (or info).
// False (and nothing changed) for an unknown name.
bool ApplyLevelFlag(std::string_view flag_value);
Level MinLevel();
// Sets a short tag printed on every line (e.g. "coordinator", "worker w0").
void SetProcessTag(std::string_view tag);

class LogMessage {
 public:
  LogMessage(Level level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  Level level_;
  std::ostringstream stream_;
};

// Swallows the stream for disabled levels without evaluating into a buffer.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace cohort::log

#define COHORT_LOG_LEVEL_DEBUG ::cohort::log::Level::kDebug
#define COHORT_LOG_LEVEL_INFO ::cohort::log::Level::kInfo
#define COHORT_LOG_LEVEL_WARNING ::cohort::log::Level::kWarning
#define COHORT_LOG_LEVEL_ERROR ::cohort::log::Level::kError
#define COHORT_LOG_LEVEL_FATAL ::cohort::log::Level::kFatal

#define LOG(severity)                                                     \
  (COHORT_LOG_LEVEL_##severity < ::cohort::log::MinLevel())               \
      ? (void)0                                                           \
      : ::cohort::log::Voidify() &                                        \
            ::cohort::log::LogMessage(COHORT_LOG_LEVEL_##severity, __FILE__, \
                                      __LINE__)                           \
                .stream()

// Programmer invariants only (docs/conventions.md, Crash policy), active in Release builds too.
#define CHECK(cond)                                                        \
  (cond) ? (void)0                                                         \
         : ::cohort::log::Voidify() &                                      \
               ::cohort::log::LogMessage(::cohort::log::Level::kFatal,     \
                                         __FILE__, __LINE__)               \
                       .stream()                                           \
                   << "Check failed: " #cond " "
