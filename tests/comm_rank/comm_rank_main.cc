// cohort-comm-test-rank: one rank of a multi-process UCX collectives test.
// Exit codes: tests/comm_rank/comm_rank_scenarios.h (RankExit).

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/log.h"
#include "tests/comm_rank/comm_rank_scenarios.h"

ABSL_FLAG(std::string, kv, "", "host:port of a cohort.v1.KeyValue server");
ABSL_FLAG(std::string, job, "ucx-test", "KeyValue scope: job id");
ABSL_FLAG(uint64_t, generation, 1, "KeyValue scope: generation");
ABSL_FLAG(int, rank, 0, "this process's rank");
ABSL_FLAG(int, size, 1, "number of ranks");
ABSL_FLAG(std::string, scenario, "collectives", "collectives | p2p | kill | generations");
ABSL_FLAG(uint64_t, seed, 1, "seed of the random inputs");
ABSL_FLAG(uint64_t, max_elements, uint64_t{16} << 20, "largest float32 count (collectives)");
ABSL_FLAG(int64_t, timeout_ms, 30000, "timeout of every communicator call");
ABSL_FLAG(int, iterations, 1000, "allreduces in the kill loop");
ABSL_FLAG(std::string, algorithm, "flat",
          "collectives of the \"collectives\" scenario: flat | hierarchical | auto");
ABSL_FLAG(int, stride, 2,
          "the \"strided\" ordered reduce-scatter folds ranks r, r + stride, ... first (the "
          "host-by-host order when rank r runs on host r % stride)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  cohort::comm_rank::RankConfig config;
  config.kv_target = absl::GetFlag(FLAGS_kv);
  config.job = absl::GetFlag(FLAGS_job);
  config.generation = absl::GetFlag(FLAGS_generation);
  config.rank = absl::GetFlag(FLAGS_rank);
  config.size = absl::GetFlag(FLAGS_size);
  config.seed = absl::GetFlag(FLAGS_seed);
  config.max_elements = absl::GetFlag(FLAGS_max_elements);
  config.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  config.iterations = absl::GetFlag(FLAGS_iterations);
  config.algorithm = absl::GetFlag(FLAGS_algorithm);
  config.stride = absl::GetFlag(FLAGS_stride);
  if (config.stride < 1) {
    std::fprintf(stderr, "--stride must be at least 1\n");
    return cohort::comm_rank::kSetupFailed;
  }
  cohort::log::SetProcessTag("rank " + std::to_string(config.rank));
  if (config.kv_target.empty() && config.size > 1) {
    std::fprintf(stderr, "--kv is required for --size > 1\n");
    return cohort::comm_rank::kSetupFailed;
  }
  const std::string scenario = absl::GetFlag(FLAGS_scenario);
  if (scenario == "collectives") return cohort::comm_rank::RunCollectives(config);
  if (scenario == "p2p") return cohort::comm_rank::RunPointToPoint(config);
  if (scenario == "kill") return cohort::comm_rank::RunKillLoop(config);
  if (scenario == "generations") return cohort::comm_rank::RunGenerations(config);
  std::fprintf(stderr, "unknown --scenario=%s\n", scenario.c_str());
  return cohort::comm_rank::kSetupFailed;
}
