#pragma once
// Multi-process training runs of the small GPT in a (dp, tp, pp) layout:
// cohort-train-test-rank processes over UCX, their outputs reassembled into
// the unsharded model (tests/integration/model_parallel_test.cc,
// gpu_training_test.cc). The small GPT: 4 layers, 4 heads, width 128, vocab
// 512, context 64; global batch 8 in micro-batches of 2; kSteps steps.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"
#include "worker/model/parameter_table.h"

namespace cohort::testing {

inline constexpr int kSteps = 20;
inline const model::GptConfig kSmall{
    .layers = 4, .heads = 4, .width = 128, .vocab_size = 512, .context_length = 64};

struct Layout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int world() const { return dp * tp * pp; }
};

inline std::string Name(const Layout& l) {
  return absl::StrCat("(", l.dp, ",", l.tp, ",", l.pp, ")");
}

struct RunResult {
  bool ok = false;
  std::vector<double> losses;
  std::string losses_text;    // the step lines of the last stage, exact bits
  std::vector<float> grads;   // step 0, unsharded
  std::vector<float> params;  // after the last step, unsharded
};

inline std::vector<float> ReadFloats(const std::string& path, uint64_t* begin, uint64_t* end) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t offset = 0;
  if (begin != nullptr) {
    EXPECT_GE(bytes.size(), 16u) << path;
    if (bytes.size() < 16) return {};
    std::memcpy(begin, bytes.data(), 8);
    std::memcpy(end, bytes.data() + 8, 8);
    offset = 16;
  }
  std::vector<float> values((bytes.size() - offset) / sizeof(float));
  std::memcpy(values.data(), bytes.data() + offset, values.size() * sizeof(float));
  return values;
}

// How the ranks of a run train (cohort-train-test-rank's flags).
struct RankOptions {
  bool zero1 = false;
  // Add the tied embedding's two gradient parts once per step (as a
  // pipeline must), not per micro-batch: the reference of pipeline layouts.
  bool tie_per_step = false;
  std::string backend = "cpu";  // cpu, guarded or cuda
  std::string precision = "fp32";
};

// Runs a layout to completion; reassembles rank outputs into the unsharded
// layout (replicated tensors from tensor rank 0, the tied wte from stage 0).
inline RunResult Train(const Layout& l, const RankOptions& o = {}) {
  const std::string dir = MakeTempDir("mp");
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < l.world(); ++r) {
    Subprocess::Options options;
    options.binary = BinaryPath("tests/cohort-train-test-rank");
    options.args = {absl::StrCat("--rank=", r),
                    absl::StrCat("--size=", l.world()),
                    absl::StrCat("--tp=", l.tp),
                    absl::StrCat("--pp=", l.pp),
                    "--model=small",
                    "--kv_dir=" + dir + "/kv",
                    absl::StrCat("--steps=", kSteps),
                    "--global_batch=8",
                    "--micro_batch=2",
                    "--threads=1",
                    "--grads",
                    o.zero1 ? "--zero1" : "--nozero1",
                    o.tie_per_step ? "--tie_per_step" : "--notie_per_step",
                    "--backend=" + o.backend,
                    "--precision=" + o.precision,
                    absl::StrCat("--out=", dir, "/rank", r, ".txt")};
    options.env = {{"UCX_WARN_UNUSED_ENV_VARS", "n"}};
    options.log_path = absl::StrCat(dir, "/rank", r, ".log");
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(options);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    ranks.push_back(std::move(*p));
  }
  RunResult result;
  bool all_ok = true;
  for (int r = 0; r < l.world(); ++r) {
    absl::StatusOr<int> code = ranks[r]->Wait(absl::Seconds(150));
    const bool ok = code.ok() && *code == 0;
    all_ok = all_ok && ok;
    EXPECT_TRUE(ok) << Name(l) << " rank " << r << ": "
                    << (code.ok() ? absl::StrCat("exit ", *code) : code.status().ToString()) << "\n"
                    << ranks[r]->ReadLog();
  }
  if (!all_ok) return result;

  // Every rank reports the global loss; take the last rank's (the last stage).
  std::ifstream in(absl::StrCat(dir, "/rank", l.world() - 1, ".txt"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("step ", 0) != 0) continue;
    result.losses_text += line + "\n";
    std::istringstream words(line);
    std::string word, hex;
    int step = 0;
    words >> word >> step >> hex;
    result.losses.push_back(std::strtod(hex.c_str(), nullptr));
  }
  EXPECT_EQ(result.losses.size(), static_cast<size_t>(kSteps));

  const model::ParameterTable whole(kSmall);
  result.grads.assign(whole.num_params(), NAN);
  result.params.assign(whole.num_params(), NAN);
  for (int stage = 0; stage < l.pp; ++stage) {
    for (int t = 0; t < l.tp; ++t) {
      const model::ParameterTable table(
          kSmall, model::ModelLayout{.tp = l.tp, .tp_rank = t, .pp = l.pp, .stage = stage});
      // The shard's gradient: each data rank's valid range.
      std::vector<float> grads(table.num_params(), NAN);
      std::vector<float> params;
      for (int d = 0; d < l.dp; ++d) {
        const int rank = stage * l.dp * l.tp + d * l.tp + t;
        uint64_t begin = 0, end = 0;
        std::vector<float> g =
            ReadFloats(absl::StrCat(dir, "/rank", rank, ".txt.grads"), &begin, &end);
        EXPECT_EQ(g.size(), table.num_params()) << "rank " << rank;
        if (g.size() != table.num_params()) return RunResult{};
        std::copy(g.begin() + begin, g.begin() + end, grads.begin() + begin);
        if (d == 0)
          params = ReadFloats(absl::StrCat(dir, "/rank", rank, ".txt.params"), nullptr, nullptr);
      }
      for (const model::ParameterInfo& info : table.tensors()) {
        if (!info.present()) continue;
        if (info.shard == model::ShardKind::kReplicated && t != 0) continue;
        if (info.id == model::kWte && stage != 0) continue;
        InsertShard(info, grads.data() + info.offset, result.grads.data() + whole[info.id].offset);
        InsertShard(info, params.data() + info.offset,
                    result.params.data() + whole[info.id].offset);
      }
    }
  }
  result.ok = true;
  return result;
}

// Bounds on how far a run may be from its reference.
struct Tolerances {
  double first_loss = 1e-6;  // absolute, step 0
  double gradient = 1e-5;    // relative Frobenius error per tensor, step 0
  double trajectory = 1e-5;  // absolute per (1 + t), every step
};

// Expects `got` within `tol` of `ref`; prints the worst differences.
inline void ExpectClose(const std::string& name, const RunResult& got, const RunResult& ref,
                        const Tolerances& tol = {}) {
  ASSERT_TRUE(ref.ok && got.ok) << name;
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << name;
  EXPECT_NEAR(got.losses[0], ref.losses[0], tol.first_loss) << name;
  const model::ParameterTable whole(kSmall);
  double worst_grad = 0;
  for (const model::ParameterInfo& info : whole.tensors()) {
    double diff = 0, norm = 0;
    for (size_t i = info.offset; i < info.end(); ++i) {
      const double d = static_cast<double>(got.grads[i]) - ref.grads[i];
      diff += d * d;
      norm += static_cast<double>(ref.grads[i]) * ref.grads[i];
    }
    ASSERT_FALSE(std::isnan(diff)) << name << " " << info.name << " not fully reassembled";
    const double relative = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    worst_grad = std::max(worst_grad, relative);
    EXPECT_LE(relative, tol.gradient) << name << " step-0 gradient of " << info.name;
  }
  double worst_loss = 0;
  for (size_t t = 0; t < ref.losses.size(); ++t) {
    const double diff = std::fabs(got.losses[t] - ref.losses[t]);
    worst_loss = std::max(worst_loss, diff / (1.0 + t));
    EXPECT_LE(diff, tol.trajectory * (1.0 + t)) << name << " step " << t;
  }
  std::printf("%-24s step-0 |dloss| %.2e  worst grad rel err %.2e  max |dloss|/(1+t) %.2e\n",
              name.c_str(), std::fabs(got.losses[0] - ref.losses[0]), worst_grad, worst_loss);
}

}  // namespace cohort::testing
