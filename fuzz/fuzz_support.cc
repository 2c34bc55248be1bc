#include "fuzz/fuzz_support.h"

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "google/protobuf/stubs/logging.h"

namespace cohort::fuzz {

bool RecordReader::Next(Record* record) {
  if (data_.empty()) return false;
  record->selector = static_cast<uint8_t>(data_[0]);
  data_.remove_prefix(1);
  size_t length = 0;
  if (data_.size() >= 2) {
    length =
        static_cast<uint8_t>(data_[0]) | (static_cast<size_t>(static_cast<uint8_t>(data_[1])) << 8);
    data_.remove_prefix(2);
  } else {
    data_ = {};
  }
  if (length > data_.size()) length = data_.size();
  record->payload = data_.substr(0, length);
  data_.remove_prefix(length);
  return true;
}

void AppendRecord(uint8_t selector, std::string_view payload, std::string* out) {
  if (payload.size() > 0xFFFF) payload = payload.substr(0, 0xFFFF);
  out->push_back(static_cast<char>(selector));
  out->push_back(static_cast<char>(payload.size() & 0xFF));
  out->push_back(static_cast<char>(payload.size() >> 8));
  out->append(payload);
}

namespace {

// A recursive-descent recognizer of RFC 8259's grammar (names may repeat,
// numbers are not limited to a double's range: the RFC allows both).
class JsonRecognizer {
 public:
  explicit JsonRecognizer(std::string_view text) : text_(text) {}
  bool Document() {
    Space();
    if (!Value(0)) return false;
    Space();
    return i_ == text_.size();
  }

 private:
  static constexpr int kMaxDepth = 100000;

  bool At(char c) const { return i_ < text_.size() && text_[i_] == c; }
  bool Eat(char c) {
    if (!At(c)) return false;
    ++i_;
    return true;
  }
  bool EatWord(std::string_view word) {
    if (text_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }
  void Space() {
    while (i_ < text_.size() &&
           (text_[i_] == ' ' || text_[i_] == '\t' || text_[i_] == '\n' || text_[i_] == '\r')) {
      ++i_;
    }
  }
  bool Digits() {
    const size_t start = i_;
    while (i_ < text_.size() && text_[i_] >= '0' && text_[i_] <= '9') ++i_;
    return i_ > start;
  }
  bool Number() {
    Eat('-');
    if (!Eat('0') && !Digits()) return false;
    if (Eat('.') && !Digits()) return false;
    if (Eat('e') || Eat('E')) {
      if (!Eat('+')) Eat('-');
      if (!Digits()) return false;
    }
    return true;
  }
  bool String() {
    if (!Eat('"')) return false;
    while (i_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[i_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c != '\\') continue;
      if (i_ >= text_.size()) return false;
      const char e = text_[i_++];
      if (e == 'u') {
        for (int k = 0; k < 4; ++k, ++i_) {
          if (i_ >= text_.size() || !std::isxdigit(static_cast<unsigned char>(text_[i_]))) {
            return false;
          }
        }
      } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
        return false;
      }
    }
    return false;
  }
  bool Value(int depth) {
    if (depth > kMaxDepth) return false;
    if (At('{')) {
      ++i_;
      Space();
      if (Eat('}')) return true;
      do {
        Space();
        if (!String()) return false;
        Space();
        if (!Eat(':')) return false;
        Space();
        if (!Value(depth + 1)) return false;
        Space();
      } while (Eat(','));
      return Eat('}');
    }
    if (At('[')) {
      ++i_;
      Space();
      if (Eat(']')) return true;
      do {
        Space();
        if (!Value(depth + 1)) return false;
        Space();
      } while (Eat(','));
      return Eat(']');
    }
    if (At('"')) return String();
    if (EatWord("true") || EatWord("false") || EatWord("null")) return true;
    return Number();
  }

  std::string_view text_;
  size_t i_ = 0;
};

}  // namespace

bool IsJson(std::string_view text) { return IsUtf8(text) && JsonRecognizer(text).Document(); }

bool IsUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
    const uint8_t c = byte(i);
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + n >= text.size()) return false;  // truncated sequence
    for (size_t k = 1; k <= n; ++k) {
      if ((byte(i + k) & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (byte(i + k) & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

std::string ScratchPath(std::string_view name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
  const std::string prefix =
      absl::StrCat("cohort-fuzz-", absl::string_view(name.data(), name.size()), "-");
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(prefix, 0) != 0) continue;
    std::string_view pid_text = std::string_view(file).substr(prefix.size());
    pid_text = pid_text.substr(0, pid_text.find('.'));
    int pid = 0;
    if (absl::SimpleAtoi(absl::string_view(pid_text.data(), pid_text.size()), &pid) && pid > 0 &&
        ::kill(pid, 0) != 0 && errno == ESRCH) {
      fs::remove_all(entry.path(), error);
    }
  }
  return (dir / absl::StrCat(prefix, ::getpid())).string();
}

void QuietLogs() {
  if (std::getenv("COHORT_FUZZ_LOG") != nullptr) return;
  log::SetMinLevel(log::Level::kFatal);
  // protobuf logs every string field with invalid UTF-8 it refuses to parse.
  google::protobuf::SetLogHandler(nullptr);
}

void CheckHandlerError(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  if (status.code() == absl::StatusCode::kUnknown || status.message().empty()) {
    std::fprintf(stderr, "fuzz finding: %s returned an improper error: %s\n", what,
                 status.ToString().c_str());
    std::abort();
  }
}

void Require(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "fuzz finding: %s\n", what);
  std::abort();
}

}  // namespace cohort::fuzz
