// cohort-bench-mpi-allreduce: OpenMPI's MPI_Allreduce (float32 sum, in place)
// timed the same way as cohort-bench-collectives, for `tools/dev bench
// collectives`. Run under mpirun; rank 0 prints the table and, with --csv,
// writes the rows for comparison.
#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "tools/bench/collectives_table.h"

ABSL_FLAG(int64_t, min_bytes, 8, "smallest message size in bytes (powers of two up to max)");
ABSL_FLAG(int64_t, max_bytes, int64_t{256} << 20, "largest message size in bytes");
ABSL_FLAG(double, budget_seconds, 0.25, "approximate time spent timing each size");
ABSL_FLAG(std::string, csv, "", "if set, rank 0 writes the rows to this CSV file");

namespace {

// Seconds per allreduce of `count` floats over `iterations` runs, slowest rank.
double TimeAllreduce(std::vector<float>& buffer, int count, int iterations) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 0; i < iterations; ++i) {
    MPI_Allreduce(MPI_IN_PLACE, buffer.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  double elapsed = (MPI_Wtime() - start) / iterations;
  double slowest = 0;
  MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  absl::SetProgramUsageMessage("MPI_Allreduce benchmark; run with mpirun -np N");
  absl::ParseCommandLine(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  using cohort::bench::Collective;
  std::vector<cohort::bench::BenchRow> rows;
  for (size_t bytes : cohort::bench::PowerOfTwoSizes(absl::GetFlag(FLAGS_min_bytes),
                                                     absl::GetFlag(FLAGS_max_bytes))) {
    const int count = static_cast<int>(std::max<size_t>(bytes / sizeof(float), 1));
    std::vector<float> buffer(count, 1.0f);
    TimeAllreduce(buffer, count, 2);  // warm up connections and buffers
    const double estimate = TimeAllreduce(buffer, count, 1);
    // Every rank must run the same number of iterations: use rank 0's choice.
    int iterations = cohort::bench::IterationsFor(estimate, absl::GetFlag(FLAGS_budget_seconds));
    MPI_Bcast(&iterations, 1, MPI_INT, 0, MPI_COMM_WORLD);
    const double seconds = TimeAllreduce(buffer, count, iterations);
    rows.push_back(cohort::bench::MakeRow(Collective::kAllReduce, size, bytes, seconds));
  }
  if (rank == 0) {
    std::printf("%s", cohort::bench::FormatTable(
                          absl::StrCat("OpenMPI MPI_Allreduce, float32 sum, ", size, " ranks"), rows)
                          .c_str());
    if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
      std::ofstream(path) << cohort::bench::ToCsv(rows);
    }
  }
  MPI_Finalize();
  return 0;
}
