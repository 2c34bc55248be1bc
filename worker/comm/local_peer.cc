#include "worker/comm/local_peer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace cohort::comm {
namespace {

constexpr absl::string_view kMagic = "cohort-ucx-1";

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// State letter and start time of /proc/<pid>/stat; false if unreadable.
bool ReadStat(int64_t pid, char* state, uint64_t* start_ticks) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) may contain spaces and parentheses: parse
  // after the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::vector<std::string> fields =
      absl::StrSplit(text.substr(close + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state); field 22 (starttime) is fields[19].
  if (fields.size() < 20 || fields[0].empty()) return false;
  *state = fields[0][0];
  return absl::SimpleAtoi(fields[19], start_ticks);
}

}  // namespace

ProcessIdentity SelfIdentity() {
  ProcessIdentity self;
  char hostname[256] = {};
  ::gethostname(hostname, sizeof(hostname) - 1);
  struct stat ns {};
  const uint64_t pid_ns = ::stat("/proc/self/ns/pid", &ns) == 0 ? ns.st_ino : 0;
  // A network namespace is a host of its own: its peers are reached over
  // its network, never through shared memory that crosses the boundary
  // (what a multi-host test on one machine relies on, tests/testing/
  // netns_hosts.h).
  const uint64_t net_ns = ::stat("/proc/self/ns/net", &ns) == 0 ? ns.st_ino : 0;
  self.host = absl::StrCat(hostname, "|", ReadFirstLine("/proc/sys/kernel/random/boot_id"), "|",
                           pid_ns, "|", net_ns);
  self.pid = ::getpid();
  char state = 0;
  ReadStat(self.pid, &state, &self.start_ticks);
  return self;
}

bool ProcessGone(const ProcessIdentity& process) {
  char state = 0;
  uint64_t start_ticks = 0;
  if (!ReadStat(process.pid, &state, &start_ticks)) return true;
  return state == 'Z' || state == 'X' || start_ticks != process.start_ticks;
}

std::string EncodePeerAddress(const ProcessIdentity& identity, std::string_view ucx_address) {
  return absl::StrCat(kMagic, "\n", identity.host, "\n", identity.pid, "\n", identity.start_ticks,
                      "\n", absl::string_view(ucx_address.data(), ucx_address.size()));
}

absl::StatusOr<std::pair<ProcessIdentity, std::string>> DecodePeerAddress(std::string_view value) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(value.data(), value.size()), absl::MaxSplits('\n', 4));
  ProcessIdentity identity;
  if (parts.size() != 5 || parts[0] != kMagic || !absl::SimpleAtoi(parts[2], &identity.pid) ||
      !absl::SimpleAtoi(parts[3], &identity.start_ticks)) {
    return absl::InvalidArgumentError("peer address: not a cohort UCX address record");
  }
  identity.host = std::string(parts[1]);
  return std::make_pair(identity, std::string(parts[4]));
}

}  // namespace cohort::comm
