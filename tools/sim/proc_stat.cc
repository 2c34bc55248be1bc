#include "tools/sim/proc_stat.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace cohort::sim {
namespace {

// Fields of proc(5) numbered from 1: pid, comm, state, ... utime is 14 and
// stime is 15. After the comm's ')' the first field is state (3).
constexpr int kFirstFieldAfterComm = 3;
constexpr int kUtimeField = 14;
constexpr int kStimeField = 15;

}  // namespace

absl::StatusOr<double> ParseProcStatCpuSeconds(std::string_view stat_line, long ticks_per_second) {
  if (ticks_per_second <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad clock ticks: ", ticks_per_second));
  }
  const size_t close = stat_line.rfind(')');
  if (close == std::string_view::npos) {
    return absl::InvalidArgumentError("proc stat line has no ')' after the command name");
  }
  const absl::string_view rest(stat_line.data() + close + 1, stat_line.size() - close - 1);
  std::vector<absl::string_view> fields =
      absl::StrSplit(rest, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  const size_t utime_index = kUtimeField - kFirstFieldAfterComm;
  const size_t stime_index = kStimeField - kFirstFieldAfterComm;
  if (fields.size() <= stime_index) {
    return absl::InvalidArgumentError(
        absl::StrCat("proc stat line has ", fields.size(), " fields after the command name"));
  }
  uint64_t utime = 0, stime = 0;
  if (!absl::SimpleAtoi(fields[utime_index], &utime) ||
      !absl::SimpleAtoi(fields[stime_index], &stime)) {
    return absl::InvalidArgumentError(absl::StrCat("proc stat utime/stime not numbers: '",
                                                   fields[utime_index], "' '", fields[stime_index],
                                                   "'"));
  }
  return static_cast<double>(utime + stime) / static_cast<double>(ticks_per_second);
}

absl::StatusOr<double> ReadProcessCpuSeconds(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream content;
  content << in.rdbuf();
  return ParseProcStatCpuSeconds(content.str(), ::sysconf(_SC_CLK_TCK));
}

}  // namespace cohort::sim
