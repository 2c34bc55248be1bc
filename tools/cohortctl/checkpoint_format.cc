#include "tools/cohortctl/checkpoint_format.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "tools/cohortctl/text_table.h"

namespace cohort::cohortctl {
namespace {

std::string CommitTime(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1000) return absl::StrCat(bytes, " B");
  const char* units[] = {"kB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes) / 1000.0;
  int unit = 0;
  while (value >= 1000.0 && unit < 3) {
    value /= 1000.0;
    ++unit;
  }
  if (value < 10) return absl::StrFormat("%.2f %s", value, units[unit]);
  if (value < 100) return absl::StrFormat("%.1f %s", value, units[unit]);
  return absl::StrFormat("%.0f %s", value, units[unit]);
}

std::string CheckpointLayoutLabel(const v1::CheckpointLayout& layout) {
  return absl::StrCat(layout.data_parallel(), "x", layout.tensor_parallel(), "x",
                      layout.pipeline_parallel(), layout.zero1() ? " zero1" : "");
}

std::string FormatCheckpointTable(const v1::ListCheckpointsResponse& response) {
  TextTable table({"STEP", "GENERATION", "LAYOUT", "TENSORS", "CHUNKS", "SIZE", "COMMITTED"});
  for (const v1::CheckpointSummary& c : response.checkpoints()) {
    table.AddRow({absl::StrCat(c.step()), absl::StrCat(c.generation()),
                  CheckpointLayoutLabel(c.layout()), absl::StrCat(c.tensors()),
                  absl::StrCat(c.chunks()), FormatBytes(static_cast<uint64_t>(c.total_bytes())),
                  CommitTime(c.committed_unix_ms())});
  }
  if (table.row_count() == 0) return "no committed checkpoints\n";
  return table.Render();
}

std::string FormatManifest(const v1::CheckpointManifest& m) {
  std::string text = absl::StrCat(
      "job:         ", m.job_id(), "\nstep:        ", m.step(), "\ngeneration:  ", m.generation(),
      "\nlayout:      ", CheckpointLayoutLabel(m.layout()), " (data x tensor x pipeline), ",
      m.writers(), " writers\nsize:        ", FormatBytes(static_cast<uint64_t>(m.total_bytes())),
      "\ncommitted:   ", CommitTime(m.committed_unix_ms()), " UTC\n");
  std::set<std::string> names;
  for (const auto& [name, unused] : m.objects()) names.insert(name);
  for (const std::string& name : names) {
    const std::string& value = m.objects().at(name);
    const bool printable = std::all_of(value.begin(), value.end(),
                                       [](unsigned char c) { return c >= 0x20 && c < 0x7f; });
    absl::StrAppend(&text, "object ", name, ": ",
                    printable ? value : absl::StrCat(value.size(), " bytes"), "\n");
  }
  absl::StrAppend(&text, "\n");
  TextTable table({"TENSOR", "SHAPE", "CHUNKS", "SIZE", "WRITERS"});
  for (const v1::TensorInfo& t : m.tensors()) {
    uint64_t bytes = 0;
    std::set<uint32_t> writers;
    for (const v1::ChunkInfo& c : t.chunks()) {
      bytes += c.bytes();
      writers.insert(c.writer());
    }
    table.AddRow({t.name(), absl::StrCat("[", absl::StrJoin(t.global_shape(), ", "), "]"),
                  absl::StrCat(t.chunks_size()), FormatBytes(bytes), absl::StrJoin(writers, ",")});
  }
  return text + table.Render();
}

}  // namespace cohort::cohortctl
