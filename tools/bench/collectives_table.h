#pragma once
// Benchmark tables in the style of nccl-tests: size, time, algbw, busbw.
//   algbw = S / t, with S the buffer size in bytes (for reduce_scatter and
//           allgather the whole size() * count buffer)
//   busbw = algbw * 2(n-1)/n for allreduce, algbw * (n-1)/n for
//           reduce_scatter and allgather: the per-link traffic of an optimal
//           ring, comparable across rank counts.
// Rows can be written to and read from a small CSV file so that tables from
// separate runs (ours, OpenMPI's) can be compared.

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cohort::bench {

// kGradients: the data group's deterministic gradient reduction as a
// training step runs it (train::DataParallel::ReduceGradientTree, one
// micro-batch per rank, ZeRO-1 off): the ordered reduce-scatter in the
// reduction tree's order, then the gather. Counted like an all-reduce.
enum class Collective { kAllReduce, kReduceScatter, kAllGather, kGradients };

// "allreduce", "reduce_scatter", "allgather"; false for anything else.
bool ParseCollective(const std::string& name, Collective* out);
const char* CollectiveName(Collective collective);

double BusBandwidthFactor(Collective collective, int ranks);

struct BenchRow {
  size_t bytes = 0;      // S
  double seconds = 0;    // time per operation (slowest rank)
  double algbw_gbs = 0;  // GB/s (1e9 bytes)
  double busbw_gbs = 0;
};

BenchRow MakeRow(Collective collective, int ranks, size_t bytes, double seconds);

// Powers of two from `min_bytes` to `max_bytes` inclusive.
std::vector<size_t> PowerOfTwoSizes(size_t min_bytes, size_t max_bytes);

// Operations to time at `bytes` so one size takes about `budget_seconds`
// given a first estimate of one operation; at least 5, at most 1000.
int IterationsFor(double estimate_seconds, double budget_seconds);

// The table, with a title line.
std::string FormatTable(const std::string& title, const std::vector<BenchRow>& rows);
// Side by side: size, our busbw, their busbw, ratio; our time, their time, ratio.
std::string FormatComparison(const std::string& ours_name, const std::vector<BenchRow>& ours,
                             const std::string& theirs_name, const std::vector<BenchRow>& theirs);

std::string ToCsv(const std::vector<BenchRow>& rows);
// InvalidArgument naming the line for malformed input.
absl::StatusOr<std::vector<BenchRow>> FromCsv(const std::string& text);

}  // namespace cohort::bench
