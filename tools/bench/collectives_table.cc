#include "tools/bench/collectives_table.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace cohort::bench {
namespace {

std::string HumanBytes(size_t bytes) {
  if (bytes >= (size_t{1} << 30) && bytes % (size_t{1} << 30) == 0) {
    return absl::StrCat(bytes >> 30, " GiB");
  }
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

}  // namespace

bool ParseCollective(const std::string& name, Collective* out) {
  if (name == "allreduce") {
    *out = Collective::kAllReduce;
  } else if (name == "reduce_scatter") {
    *out = Collective::kReduceScatter;
  } else if (name == "allgather") {
    *out = Collective::kAllGather;
  } else if (name == "gradients") {
    *out = Collective::kGradients;
  } else {
    return false;
  }
  return true;
}

const char* CollectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce: return "allreduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllGather: return "allgather";
    case Collective::kGradients: return "gradients";
  }
  return "unknown";
}

double BusBandwidthFactor(Collective collective, int ranks) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  const bool two_passes =
      collective == Collective::kAllReduce || collective == Collective::kGradients;
  return two_passes ? 2 * (n - 1) / n : (n - 1) / n;
}

BenchRow MakeRow(Collective collective, int ranks, size_t bytes, double seconds) {
  BenchRow row;
  row.bytes = bytes;
  row.seconds = seconds;
  row.algbw_gbs = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
  row.busbw_gbs = row.algbw_gbs * BusBandwidthFactor(collective, ranks);
  return row;
}

std::vector<size_t> PowerOfTwoSizes(size_t min_bytes, size_t max_bytes) {
  std::vector<size_t> sizes;
  for (size_t s = std::max<size_t>(min_bytes, 1); s <= max_bytes; s *= 2) sizes.push_back(s);
  return sizes;
}

int IterationsFor(double estimate_seconds, double budget_seconds) {
  if (estimate_seconds <= 0) return 1000;
  const double n = budget_seconds / estimate_seconds;
  return static_cast<int>(std::clamp(n, 5.0, 1000.0));
}

std::string FormatTable(const std::string& title, const std::vector<BenchRow>& rows) {
  std::string out = absl::StrCat("# ", title, "\n");
  absl::StrAppendFormat(&out, "%12s %12s %12s %12s\n", "size", "time(us)", "algbw(GB/s)",
                        "busbw(GB/s)");
  for (const BenchRow& row : rows) {
    absl::StrAppendFormat(&out, "%12s %12.2f %12.3f %12.3f\n", HumanBytes(row.bytes),
                          row.seconds * 1e6, row.algbw_gbs, row.busbw_gbs);
  }
  return out;
}

std::string FormatComparison(const std::string& ours_name, const std::vector<BenchRow>& ours,
                             const std::string& theirs_name, const std::vector<BenchRow>& theirs) {
  std::map<size_t, const BenchRow*> theirs_by_size;
  for (const BenchRow& row : theirs) theirs_by_size[row.bytes] = &row;
  std::string out = absl::StrFormat("# %s vs %s (busbw ratio > 1 and time ratio < 1: %s faster)\n",
                                    ours_name, theirs_name, ours_name);
  absl::StrAppendFormat(&out, "%12s %10s %10s %8s %11s %11s %8s\n", "size", "busbw", "busbw",
                        "ratio", "time(us)", "time(us)", "ratio");
  absl::StrAppendFormat(&out, "%12s %10s %10s %8s %11s %11s %8s\n", "", ours_name.substr(0, 10),
                        theirs_name.substr(0, 10), "", ours_name.substr(0, 11),
                        theirs_name.substr(0, 11), "");
  for (const BenchRow& row : ours) {
    auto it = theirs_by_size.find(row.bytes);
    if (it == theirs_by_size.end()) continue;
    const BenchRow& other = *it->second;
    absl::StrAppendFormat(&out, "%12s %10.3f %10.3f %8.2f %11.2f %11.2f %8.2f\n",
                          HumanBytes(row.bytes), row.busbw_gbs, other.busbw_gbs,
                          other.busbw_gbs > 0 ? row.busbw_gbs / other.busbw_gbs : 0,
                          row.seconds * 1e6, other.seconds * 1e6,
                          other.seconds > 0 ? row.seconds / other.seconds : 0);
  }
  return out;
}

std::string ToCsv(const std::vector<BenchRow>& rows) {
  std::string out = "bytes,seconds,algbw_gbs,busbw_gbs\n";
  for (const BenchRow& row : rows) {
    absl::StrAppendFormat(&out, "%d,%.9g,%.9g,%.9g\n", row.bytes, row.seconds, row.algbw_gbs,
                          row.busbw_gbs);
  }
  return out;
}

absl::StatusOr<std::vector<BenchRow>> FromCsv(const std::string& text) {
  std::vector<BenchRow> rows;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++line_number;
    if (line_number == 1 && absl::StartsWith(line, "bytes")) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    BenchRow row;
    uint64_t bytes = 0;
    if (fields.size() != 4 || !absl::SimpleAtoi(fields[0], &bytes) ||
        !absl::SimpleAtod(fields[1], &row.seconds) || !absl::SimpleAtod(fields[2], &row.algbw_gbs) ||
        !absl::SimpleAtod(fields[3], &row.busbw_gbs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": expected bytes,seconds,algbw_gbs,busbw_gbs"));
    }
    row.bytes = bytes;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace cohort::bench
