// Data-parallel training as separate processes over UCX against the
// single-process run on the same global batch (the determinism contract):
// ranks are cohort-train-test-rank processes (tests/train_rank), each
// training the tiny model on the synthetic source.
//
//   bitwise: the same run twice; OMP threads 1 vs 2; DP=2 with one
//            micro-batch per rank vs one process with both micro-batches;
//            DP=2 with ZeRO-1 vs without
//   within 1e-5 * (1 + t): DP=2 and DP=4 (several micro-batches per rank,
//            so the sum is associated differently) vs one process

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace cohort::testing {
namespace {

constexpr int kSteps = 20;

struct RunResult {
  std::vector<double> losses;
  std::string params_hash;
  std::string text;  // the whole report, for bitwise comparisons
};

struct RunOptions {
  int dp = 1;
  int micro_batch = 4;
  bool zero1 = false;
  int threads = 1;
  std::string transport = "default";
};

// Runs one configuration to completion and parses rank 0's report (all
// ranks' reports must be identical).
RunResult Train(const RunOptions& o) {
  const std::string dir = MakeTempDir("dp");
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < o.dp; ++r) {
    Subprocess::Options options;
    options.binary = BinaryPath("tests/cohort-train-test-rank");
    options.args = {absl::StrCat("--rank=", r),
                    absl::StrCat("--size=", o.dp),
                    "--kv_dir=" + dir + "/kv",
                    absl::StrCat("--steps=", kSteps),
                    "--global_batch=8",
                    absl::StrCat("--micro_batch=", o.micro_batch),
                    absl::StrCat("--threads=", o.threads),
                    o.zero1 ? "--zero1" : "--nozero1",
                    absl::StrCat("--out=", dir, "/rank", r, ".txt")};
    options.env = {{"UCX_WARN_UNUSED_ENV_VARS", "n"}};
    if (o.transport == "tcp") {
      options.env.push_back({"UCX_TLS", "tcp"});
      options.env.push_back({"UCX_NET_DEVICES", "lo"});
    }
    options.log_path = absl::StrCat(dir, "/rank", r, ".log");
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(options);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    ranks.push_back(std::move(*p));
  }
  for (int r = 0; r < o.dp; ++r) {
    absl::StatusOr<int> code = ranks[r]->Wait(absl::Seconds(120));
    EXPECT_TRUE(code.ok() && *code == 0)
        << "rank " << r << ": " << (code.ok() ? absl::StrCat("exit ", *code) : code.status().ToString())
        << "\n" << ranks[r]->ReadLog();
  }
  auto read = [&](int r) {
    std::ifstream in(absl::StrCat(dir, "/rank", r, ".txt"));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  RunResult result;
  result.text = read(0);
  for (int r = 1; r < o.dp; ++r) {
    EXPECT_EQ(read(r), result.text) << "rank " << r << " disagrees with rank 0";
  }
  std::istringstream lines(result.text);
  std::string word;
  while (lines >> word) {
    if (word == "step") {
      int step = 0;
      std::string hex;
      lines >> step >> hex;
      result.losses.push_back(std::strtod(hex.c_str(), nullptr));
    } else if (word == "params") {
      lines >> result.params_hash;
    }
  }
  EXPECT_EQ(result.losses.size(), static_cast<size_t>(kSteps)) << result.text;
  return result;
}

void ExpectWithinTrajectoryTolerance(const RunResult& got, const RunResult& reference) {
  ASSERT_EQ(got.losses.size(), reference.losses.size());
  double worst = 0;
  for (size_t t = 0; t < got.losses.size(); ++t) {
    const double diff = std::fabs(got.losses[t] - reference.losses[t]);
    worst = std::max(worst, diff / (1.0 + static_cast<double>(t)));
    EXPECT_LE(diff, 1e-5 * (1.0 + static_cast<double>(t)))
        << "step " << t << ": " << got.losses[t] << " vs " << reference.losses[t];
  }
  std::printf("max |dloss| / (1 + t) = %.3g over %zu steps\n", worst, got.losses.size());
}

TEST(DataParallelTest, SameRunTwiceAndAnyThreadCountAreBitwiseIdentical) {
  RunResult a = Train({.threads = 1});
  RunResult b = Train({.threads = 1});
  RunResult c = Train({.threads = 2});
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.text, c.text);
  // And it learns: the loss falls from about ln(64) toward the floor ln(4).
  ASSERT_EQ(a.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_NEAR(a.losses.front(), std::log(64.0), 0.3);
  EXPECT_LT(a.losses.back(), a.losses.front() - 0.5);
}

TEST(DataParallelTest, TwoRanksWithOneMicroBatchEachEqualOneProcessBitwise) {
  RunResult single = Train({.dp = 1, .micro_batch = 4});  // 2 micro-batches in one process
  RunResult dp2 = Train({.dp = 2, .micro_batch = 4});     // 1 micro-batch per rank
  EXPECT_EQ(dp2.text, single.text);
}

TEST(DataParallelTest, ZeroOneEqualsPlainDataParallelBitwise) {
  RunResult plain = Train({.dp = 2, .micro_batch = 2});
  RunResult zero1 = Train({.dp = 2, .micro_batch = 2, .zero1 = true});
  EXPECT_EQ(zero1.text, plain.text);
}

TEST(DataParallelTest, TwoAndFourRanksFollowTheSingleProcessTrajectory) {
  RunResult single = Train({.dp = 1, .micro_batch = 1});  // 8 micro-batches
  RunResult dp2 = Train({.dp = 2, .micro_batch = 1});     // 4 per rank
  ExpectWithinTrajectoryTolerance(dp2, single);
  RunResult dp4 = Train({.dp = 4, .micro_batch = 1, .zero1 = true});  // 2 per rank
  ExpectWithinTrajectoryTolerance(dp4, single);
  RunResult dp4_tcp = Train({.dp = 4, .micro_batch = 1, .transport = "tcp"});
  ExpectWithinTrajectoryTolerance(dp4_tcp, single);
}

}  // namespace
}  // namespace cohort::testing
