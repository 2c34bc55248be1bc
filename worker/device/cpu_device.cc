#include "worker/device/cpu_device.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace cohort::worker {
namespace {

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value of a "key<spaces>: value" line of a /proc text, if present.
bool FindProcValue(absl::string_view text, absl::string_view key, absl::string_view* value) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    if (absl::StripAsciiWhitespace(kv.first) == key) {
      *value = absl::StripAsciiWhitespace(kv.second);
      return true;
    }
  }
  return false;
}

}  // namespace

int64_t ParseMemTotalBytes(absl::string_view meminfo) {
  absl::string_view value;
  if (!FindProcValue(meminfo, "MemTotal", &value)) return 0;
  // "16318768 kB": the kernel always reports kibibytes here.
  const bool kib = absl::ConsumeSuffix(&value, "kB");
  int64_t amount = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &amount) || amount < 0) return 0;
  return kib ? amount * 1024 : amount;
}

std::string ParseCpuModel(absl::string_view cpuinfo) {
  absl::string_view value;
  if (!FindProcValue(cpuinfo, "model name", &value)) return "";
  return std::string(value);
}

absl::StatusOr<DeviceInfo> DiscoverCpuDevice(int index) {
  if (index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--device_index must be >= 0, got ", index));
  }
  DeviceInfo info;
  info.kind = v1::DEVICE_KIND_CPU;
  info.index = index;
  // hardware_concurrency may return 0 when unknown; a worker has at least one.
  info.cores = std::max(1u, std::thread::hardware_concurrency());
  info.memory_bytes = ParseMemTotalBytes(ReadFile("/proc/meminfo"));
  if (info.memory_bytes <= 0) {
    return absl::UnavailableError("cannot read MemTotal from /proc/meminfo");
  }
  info.name = ParseCpuModel(ReadFile("/proc/cpuinfo"));
  if (info.name.empty()) info.name = "cpu";
  return info;
}

}  // namespace cohort::worker
