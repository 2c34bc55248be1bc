#include "common/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace cohort::log {
namespace {

Level LevelFromEnv() {
  const char* env = std::getenv("COHORT_LOG_LEVEL");
  Level level = Level::kInfo;
  if (env != nullptr) ParseLevel(env, &level);
  return level;
}

std::atomic<Level>& MinLevelStorage() {
  static std::atomic<Level> level{LevelFromEnv()};
  return level;
}

std::mutex& TagMutex() {
  static std::mutex mu;
  return mu;
}

std::string& Tag() {
  static std::string* tag = new std::string();
  return *tag;
}

char LevelLetter(Level level) {
  switch (level) {
    case Level::kDebug: return 'D';
    case Level::kInfo: return 'I';
    case Level::kWarning: return 'W';
    case Level::kError: return 'E';
    case Level::kFatal: return 'F';
  }
  return '?';
}

}  // namespace

void SetMinLevel(Level level) { MinLevelStorage().store(level); }

bool ParseLevel(std::string_view name, Level* level) {
  const std::string v = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  if (v == "debug") {
    *level = Level::kDebug;
  } else if (v == "info") {
    *level = Level::kInfo;
  } else if (v == "warning") {
    *level = Level::kWarning;
  } else if (v == "error") {
    *level = Level::kError;
  } else {
    return false;
  }
  return true;
}

bool ApplyLevelFlag(std::string_view flag_value) {
  if (flag_value.empty()) return true;
  Level level;
  if (!ParseLevel(flag_value, &level)) return false;
  SetMinLevel(level);
  return true;
}
Level MinLevel() { return MinLevelStorage().load(std::memory_order_relaxed); }

void SetProcessTag(std::string_view tag) {
  std::lock_guard<std::mutex> lock(TagMutex());
  Tag() = std::string(tag);
}

LogMessage::LogMessage(Level level, const char* file, int line) : level_(level) {
  const char* base = std::strrchr(file, '/');
  std::string tag;
  {
    std::lock_guard<std::mutex> lock(TagMutex());
    tag = Tag();
  }
  stream_ << LevelLetter(level) << ' '
          << absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  if (!tag.empty()) stream_ << ' ' << tag;
  stream_ << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  std::string line = stream_.str();
  // One record, one line: a newline or other control character inside a
  // message (a peer's worker id, a status message) is escaped, so nothing a
  // peer sends can forge a log line.
  if (std::any_of(line.begin(), line.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 && c != '\t'; })) {
    std::string escaped;
    escaped.reserve(line.size() + 16);
    for (char c : line) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (c == '\n') {
        escaped += "\\n";
      } else if (u < 0x20 && c != '\t') {
        escaped += absl::StrFormat("\\x%02x", u);
      } else {
        escaped.push_back(c);
      }
    }
    line = std::move(escaped);
  }
  line.push_back('\n');
  // One write per line so concurrent threads do not interleave characters.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  if (level_ == Level::kFatal) std::abort();
}

}  // namespace cohort::log
