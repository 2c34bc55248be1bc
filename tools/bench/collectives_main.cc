// cohort-bench-collectives: nccl-tests style timing of UcxCommunicator
// collectives, with any number of ranks as local processes.
//
//   cohort-bench-collectives --ranks 2 [--collective allreduce] [--csv out.csv]
//   cohort-bench-collectives --compare ours.csv theirs.csv
//
// The parent starts `--ranks` copies of itself (one per rank) that bootstrap
// through a FileKvClient directory; rank 0 prints the table. UCX_TLS and
// friends come from the environment, as for any UCX program.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tools/bench/collectives_table.h"
#include "worker/comm/file_kv_client.h"
#include "worker/comm/hierarchical_communicator.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"
#include "worker/train/data_parallel.h"

ABSL_FLAG(int, ranks, 2, "number of rank processes to start");
ABSL_FLAG(std::string, collective, "allreduce",
          "allreduce, reduce_scatter, allgather or gradients (the data group's deterministic "
          "gradient reduction as a training step runs it: ordered reduce-scatter and gather)");
ABSL_FLAG(int64_t, min_bytes, 8, "smallest buffer size in bytes (powers of two up to max)");
ABSL_FLAG(int64_t, max_bytes, int64_t{256} << 20, "largest buffer size in bytes");
ABSL_FLAG(double, budget_seconds, 0.25, "approximate time spent timing each size");
ABSL_FLAG(std::string, csv, "", "if set, rank 0 writes the rows to this CSV file");
ABSL_FLAG(std::vector<std::string>, sizes_mib, {},
          "if set, these buffer sizes in MiB instead of the powers of two");
ABSL_FLAG(std::string, algorithm, "flat",
          "flat (one ring over the ranks, host by host) or hierarchical (all-reduce within each "
          "host, across hosts between lanes, share within the host; needs ranks on two hosts or "
          "more, the same number on each)");
ABSL_FLAG(std::vector<std::string>, compare, {},
          "OURS.csv,THEIRS.csv: print the comparison of two CSV files and exit");
ABSL_FLAG(std::string, compare_names, "cohort,openmpi", "names of the two compared tables");
// Internal: set by the parent for each rank process.
ABSL_FLAG(int64_t, piece_kib, cohort::comm::kPipelineChunkBytes >> 10,
          "hierarchical: the pipeline's piece size in KiB; 0 runs the phases in turn");
ABSL_FLAG(int, rank, -1, "internal: this process's rank (set by the parent)");
ABSL_FLAG(std::string, kv_dir, "", "internal: bootstrap directory (set by the parent)");

namespace {

using cohort::bench::Collective;
constexpr absl::Duration kTimeout = absl::Seconds(120);

// --piece_kib's bound: a piece of 1 GiB is one piece at any size benchmarked.
constexpr int64_t kMaxPieceKib = int64_t{1} << 20;

int Fail(const std::string& message) {
  std::fprintf(stderr, "cohort-bench-collectives: %s\n", message.c_str());
  return 1;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int Compare(const std::vector<std::string>& files) {
  if (files.size() != 2) return Fail("--compare needs OURS.csv,THEIRS.csv");
  std::vector<std::string> names = absl::StrSplit(absl::GetFlag(FLAGS_compare_names), ',');
  if (names.size() != 2) return Fail("--compare_names needs two names");
  std::vector<cohort::bench::BenchRow> tables[2];
  for (int i = 0; i < 2; ++i) {
    auto text = ReadFile(files[i]);
    if (!text.ok()) return Fail(std::string(text.status().message()));
    auto rows = cohort::bench::FromCsv(*text);
    if (!rows.ok()) return Fail(absl::StrCat(files[i], ": ", rows.status().message()));
    tables[i] = *std::move(rows);
  }
  std::printf("%s", cohort::bench::FormatComparison(names[0], tables[0], names[1], tables[1])
                        .c_str());
  return 0;
}

// Seconds per operation over `iterations`, as seen by the slowest rank.
// `gradients`: the data group's reduction (kGradients only).
absl::StatusOr<double> TimeOperation(cohort::comm::Communicator& comm, Collective collective,
                                     std::vector<float>& buffer, std::vector<float>& output,
                                     size_t count, int iterations,
                                     cohort::train::DataParallel* gradients) {
  using cohort::comm::DataType;
  using cohort::comm::ReduceOp;
  absl::Status barrier = comm.Barrier(kTimeout);
  if (!barrier.ok()) return barrier;
  const size_t per_rank = count / comm.size();
  const absl::Time start = absl::Now();
  for (int i = 0; i < iterations; ++i) {
    absl::Status status;
    switch (collective) {
      case Collective::kAllReduce:
        status = comm.AllReduce(buffer.data(), count, DataType::kFloat32, ReduceOp::kSum, kTimeout);
        break;
      case Collective::kReduceScatter:
        status = comm.ReduceScatter(buffer.data(), output.data(), per_rank, DataType::kFloat32,
                                    ReduceOp::kSum, kTimeout);
        break;
      case Collective::kAllGather:
        status = comm.AllGather(buffer.data(), output.data(), per_rank, DataType::kFloat32,
                                kTimeout);
        break;
      case Collective::kGradients:
        status = gradients->ReduceGradientTree({buffer.data()}, {}).status();
        break;
    }
    if (!status.ok()) return status;
  }
  int64_t nanos = absl::ToInt64Nanoseconds(absl::Now() - start) / iterations;
  absl::Status reduced =
      comm.AllReduce(&nanos, 1, DataType::kInt64, ReduceOp::kMax, kTimeout);
  if (!reduced.ok()) return reduced;
  return static_cast<double>(nanos) * 1e-9;
}

int RunRank(int rank, int ranks, Collective collective) {
  auto kv = cohort::comm::FileKvClient::Create(absl::GetFlag(FLAGS_kv_dir));
  if (!kv.ok()) return Fail(std::string(kv.status().message()));
  cohort::comm::UcxContextOptions context_options;
  context_options.rank = rank;
  context_options.size = ranks;
  context_options.kv = kv->get();
  auto context = cohort::comm::UcxContext::Create(context_options);
  if (!context.ok()) return Fail(absl::StrCat("rank ", rank, ": ", context.status().ToString()));
  auto algorithm = cohort::comm::ParseCollectiveAlgorithm(absl::GetFlag(FLAGS_algorithm));
  if (!algorithm.ok()) return Fail(std::string(algorithm.status().message()));
  auto comm = cohort::comm::HierarchicalCommunicator::Create(
      context->get(), {.comm_id = 1, .group = {}}, 2, 3, *algorithm, context_options,
      static_cast<size_t>(absl::GetFlag(FLAGS_piece_kib)) << 10);
  if (!comm.ok()) return Fail(absl::StrCat("rank ", rank, ": ", comm.status().ToString()));
  std::vector<size_t> sizes = cohort::bench::PowerOfTwoSizes(absl::GetFlag(FLAGS_min_bytes),
                                                            absl::GetFlag(FLAGS_max_bytes));
  if (const std::vector<std::string> mib = absl::GetFlag(FLAGS_sizes_mib); !mib.empty()) {
    sizes.clear();
    for (const std::string& m : mib) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(m, &n) || n < 1 || n > 4096) {
        return Fail(absl::StrCat("--sizes_mib: '", m, "' is not a size in [1, 4096] MiB"));
      }
      sizes.push_back(static_cast<size_t>(n) << 20);
    }
  }

  std::vector<cohort::bench::BenchRow> rows;
  for (size_t bytes : sizes) {
    // reduce_scatter and allgather need a whole element per rank.
    const size_t unit =
        collective == Collective::kAllReduce || collective == Collective::kGradients ? 1 : ranks;
    const size_t count = std::max(bytes / sizeof(float) / unit, size_t{1}) * unit;
    std::vector<float> buffer(count, 1.0f);
    std::vector<float> output(count, 0.0f);
    // One micro-batch per rank: each rank's gradient is one node of the
    // reduction tree, as in a step of dp = ranks over as many micro-batches.
    std::unique_ptr<cohort::train::DataParallel> gradients;
    if (collective == Collective::kGradients) {
      gradients = std::make_unique<cohort::train::DataParallel>(
          comm->get(), count,
          cohort::train::DataParallelOptions{
              .zero1 = false,
              .timeout = kTimeout,
              .deterministic = true,
              .micro_batch_shares = std::vector<int>(static_cast<size_t>(ranks), 1)});
    }
    for (int warm = 0; warm < 2; ++warm) {
      auto t = TimeOperation(**comm, collective, buffer, output, count, 1, gradients.get());
      if (!t.ok()) return Fail(absl::StrCat("rank ", rank, ": ", t.status().ToString()));
    }
    auto estimate = TimeOperation(**comm, collective, buffer, output, count, 1, gradients.get());
    if (!estimate.ok()) return Fail(estimate.status().ToString());
    // Every rank reaches the same estimate (it is the slowest rank's time).
    const int iterations =
        cohort::bench::IterationsFor(*estimate, absl::GetFlag(FLAGS_budget_seconds));
    auto seconds =
        TimeOperation(**comm, collective, buffer, output, count, iterations, gradients.get());
    if (!seconds.ok()) return Fail(seconds.status().ToString());
    rows.push_back(cohort::bench::MakeRow(collective, ranks, count * sizeof(float), *seconds));
    if (rank == 0) {
      std::fprintf(stderr, "  %s: %zu bytes done\n", cohort::bench::CollectiveName(collective),
                   count * sizeof(float));
    }
  }
  if (rank == 0) {
    const char* tls = std::getenv("UCX_TLS");
    std::printf("%s", cohort::bench::FormatTable(
                          absl::StrCat("cohort UcxCommunicator ",
                                       cohort::bench::CollectiveName(collective), ", float32, ",
                                       ranks, " ranks, ", absl::GetFlag(FLAGS_algorithm),
                                       ", UCX_TLS=", tls ? tls : "(default)"),
                          rows)
                          .c_str());
    if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
      std::ofstream(path) << cohort::bench::ToCsv(rows);
    }
  }
  return 0;
}

// Starts one child per rank and waits for all; any failure stops the rest.
int RunParent(int ranks, char** argv, int argc) {
  char dir_template[] = "/tmp/cohort-bench-kv.XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return Fail("cannot create a bootstrap directory");
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> args(argv, argv + argc);
    args.push_back(absl::StrCat("--rank=", r));
    args.push_back(absl::StrCat("--kv_dir=", dir_template));
    const pid_t pid = ::fork();
    if (pid < 0) return Fail("fork failed");
    if (pid == 0) {
      std::vector<char*> c_args;
      for (std::string& a : args) c_args.push_back(a.data());
      c_args.push_back(nullptr);
      ::execv("/proc/self/exe", c_args.data());
      std::_Exit(127);
    }
    children.push_back(pid);
  }
  int failures = 0;
  for (size_t done = 0; done < children.size(); ++done) {
    int status = 0;
    const pid_t pid = ::wait(&status);
    if (pid < 0) break;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
      for (pid_t child : children) ::kill(child, SIGKILL);
    }
  }
  return failures == 0 ? 0 : Fail(absl::StrCat(failures, " rank process(es) failed"));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "nccl-tests style benchmark of Cohort's UCX collectives over local rank processes.\n"
      "  cohort-bench-collectives --ranks 2 [--collective allreduce] [--csv out.csv]\n"
      "  cohort-bench-collectives --compare ours.csv,theirs.csv");
  absl::ParseCommandLine(argc, argv);
  if (const auto files = absl::GetFlag(FLAGS_compare); !files.empty()) return Compare(files);
  Collective collective;
  if (!cohort::bench::ParseCollective(absl::GetFlag(FLAGS_collective), &collective)) {
    return Fail("--collective must be allreduce, reduce_scatter or allgather");
  }
  const int ranks = absl::GetFlag(FLAGS_ranks);
  if (ranks < 1 || ranks > 64) return Fail("--ranks must be between 1 and 64");
  if (const int64_t kib = absl::GetFlag(FLAGS_piece_kib); kib < 0 || kib > kMaxPieceKib) {
    return Fail(absl::StrCat("--piece_kib must be between 0 (the phases in turn) and ",
                             kMaxPieceKib, " (1 GiB), got ", kib));
  }
  const int rank = absl::GetFlag(FLAGS_rank);
  if (rank >= 0) return RunRank(rank, ranks, collective);
  return RunParent(ranks, argv, argc);
}
