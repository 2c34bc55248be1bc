#pragma once
// Scenarios run by one rank of cohort-comm-test-rank (the multi-process UCX
// collective tests in tests/integration/ucx_collectives_test.cc). Each
// returns an exit code: see RankExit.

#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/comm/kv_client.h"

namespace cohort::comm_rank {

enum RankExit : int {
  kOk = 0,
  kMismatch = 1,     // a result differed from the reference
  kSetupFailed = 2,  // bootstrap or communicator creation failed
  kCommError = 3,    // a call failed with Unavailable or DeadlineExceeded
  kOtherError = 4,   // a call failed otherwise
};

struct RankConfig {
  std::string kv_target;
  std::string job = "ucx-test";
  uint64_t generation = 1;
  int rank = 0;
  int size = 1;
  uint64_t seed = 1;
  // Largest float32 element count used by "collectives" (64 MiB = 16 Mi);
  // below 1 Mi + 3 it is also the medium size.
  size_t max_elements = size_t{16} << 20;
  // Timeout of every communicator call.
  int64_t timeout_ms = 30000;
  // Allreduces of max_elements in the "kill" loop.
  int iterations = 1000;
  // "collectives": flat, hierarchical or auto (comm::ParseCollectiveAlgorithm).
  std::string algorithm = "flat";
  // The "strided" ordered reduce-scatter first folds ranks p, p + stride,
  // p + 2 stride, ... into p, then 1, 2, ... stride - 1 into 0.
  int stride = 2;
};

// allreduce (float32 sum/max, bf16, fp16, int32, int64, uint8), reduce_scatter,
// allgather and broadcast at sizes 0, 1, 7, 1023, 1 Mi + 3 and max_elements,
// checked against references and for bitwise agreement across ranks.
int RunCollectives(const RankConfig& config);
// Point-to-point ordering, and tag isolation between two communicators.
int RunPointToPoint(const RankConfig& config);
// Repeated large allreduces until one fails (a peer was killed); logs
// "entered allreduce loop" once the loop runs.
int RunKillLoop(const RankConfig& config);
// Two generations in a row: build, allreduce, tear down, rebuild from the
// next generation's KeyValue scope.
int RunGenerations(const RankConfig& config);

}  // namespace cohort::comm_rank
