// Checkpoints end to end with real processes: cohort-workers training a
// small GPT save through the coordinator every 10 steps; new jobs resume
// from the step-10 checkpoint in the same layout and in another data-
// parallel degree with the same tensor and pipeline degrees (steps 11-20
// bitwise equal to the uninterrupted run: the deterministic reduction) and
// in other layouts (within the layout tests' trajectory tolerance
// 1e-5 * (1 + t)). Also: cohortctl lists, shows and
// exports checkpoints (the safetensors file read back by an independent
// Python reader), a stale generation's upload is refused, and flipped bytes
// in a blob file on disk are DataLoss naming the tensor and the chunk.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/loss_log.h"
#include "tests/integration/synthetic_checkpoint.h"
#include "client/checkpoint_client.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;

v1::JobSpec ResumeSpec(const std::string& name, int tensor, int pipeline, int workers) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_layers(4);
  spec.mutable_model()->set_heads(4);
  spec.mutable_model()->set_width(64);
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_model()->set_context_length(32);
  spec.mutable_model()->set_init_seed(42);
  spec.mutable_data()->mutable_synthetic()->set_seed(3);
  spec.mutable_data()->mutable_synthetic()->set_order(1);
  spec.mutable_data()->set_seed(5);
  spec.mutable_optimizer()->set_learning_rate(3e-3);
  spec.mutable_optimizer()->set_min_learning_rate(3e-4);
  spec.mutable_optimizer()->set_warmup_steps(3);
  spec.mutable_optimizer()->set_weight_decay(0.1);
  spec.mutable_optimizer()->set_grad_clip(1.0);
  spec.mutable_batch()->set_global_batch_size(8);
  spec.mutable_batch()->set_micro_batch_size(2);
  spec.mutable_parallelism()->set_tensor(tensor);
  spec.mutable_parallelism()->set_pipeline(pipeline);
  spec.mutable_parallelism()->set_zero1(true);
  spec.mutable_elastic()->set_min_workers(workers);
  spec.mutable_elastic()->set_max_workers(workers);
  spec.set_steps(20);
  spec.mutable_checkpoint()->set_interval_steps(10);
  spec.mutable_checkpoint()->set_keep_last(5);
  return spec;
}

class CheckpointTest : public ::testing::Test {
 protected:
  static constexpr int kWorkers = 4;

  void StartCluster(const std::string& trainer) {
    cluster_.StartCoordinator();
    for (int i = 0; i < kWorkers; ++i) {
      ASSERT_NE(cluster_.StartWorker(absl::StrCat("w", i), "host", i, trainer,
                                     {absl::StrCat("--loss_log=", LossLog(i))}),
                nullptr);
    }
    cluster_.WaitForIdleWorkers(kWorkers);
  }

  std::string LossLog(int worker) const { return absl::StrCat(cluster_.dir(), "/w", worker, ".loss"); }

  std::string Logs() {
    std::string text;
    for (int i = 0; i < kWorkers; ++i) {
      std::ifstream in(absl::StrCat(cluster_.dir(), "/w", i, ".log"));
      std::stringstream s;
      s << in.rdbuf();
      absl::StrAppend(&text, "--- w", i, "\n", s.str());
    }
    return text + "--- coordinator\n" + cluster_.coordinator()->ReadLog();
  }

  // Submits `spec`, waits for it to end, and expects COMPLETED.
  v1::Job RunToCompletion(const v1::JobSpec& spec) {
    absl::StatusOr<v1::Job> submitted = cluster_.Submit(spec);
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    if (!submitted.ok()) return {};
    const v1::Job job = cluster_.WaitForJob(
        submitted->job_id(),
        [](const v1::Job& j) {
          return j.state() == v1::JOB_STATE_COMPLETED || j.state() == v1::JOB_STATE_FAILED;
        },
        absl::Seconds(120), absl::StrCat(spec.name(), " to finish"));
    EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.message() << "\n" << Logs();
    return job;
  }

  // step -> loss text (hex float) of `job_id`; ranks must agree exactly.
  std::map<int, std::string> Losses(const std::string& job_id) {
    std::vector<std::string> paths;
    for (int i = 0; i < kWorkers; ++i) paths.push_back(LossLog(i));
    return ReadLosses(paths, job_id);
  }

  LocalCluster cluster_{"checkpoint"};
};

TEST_F(CheckpointTest, ResumeInTheSameLayoutIsBitwiseAndInOtherLayoutsWithinTolerance) {
  StartCluster("engine");
  const v1::Job base = RunToCompletion(ResumeSpec("base", 2, 1, 4));  // (2,2,1)
  ASSERT_EQ(base.state(), v1::JOB_STATE_COMPLETED);
  const std::map<int, std::string> reference = Losses(base.job_id());
  ASSERT_EQ(reference.size(), 20u) << Logs();

  auto client = client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(cluster_.address()));
  absl::StatusOr<v1::ListCheckpointsResponse> listed = client->List(base.job_id(), absl::Seconds(5));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->checkpoints_size(), 2);  // steps 10 and 20
  EXPECT_EQ(listed->checkpoints(0).step(), 20);
  EXPECT_EQ(listed->checkpoints(1).step(), 10);
  EXPECT_EQ(listed->checkpoints(1).layout().tensor_parallel(), 2);
  EXPECT_TRUE(listed->checkpoints(1).layout().zero1());

  struct Case {
    std::string name;
    int tensor, pipeline, workers;
    bool bitwise;
  };
  for (const Case& c : {Case{"same", 2, 1, 4, true}, Case{"narrow", 2, 1, 2, true},
                        Case{"pipe", 1, 2, 2, false},
                        Case{"wide", 1, 1, 4, false}, Case{"mixed", 2, 2, 4, false}}) {
    SCOPED_TRACE(c.name);
    v1::JobSpec spec = ResumeSpec(c.name, c.tensor, c.pipeline, c.workers);
    spec.mutable_checkpoint()->set_resume_from_job(base.job_id());
    spec.mutable_checkpoint()->set_resume_from_step(10);
    const v1::Job resumed = RunToCompletion(spec);
    ASSERT_EQ(resumed.state(), v1::JOB_STATE_COMPLETED);
    const std::map<int, std::string> losses = Losses(resumed.job_id());
    ASSERT_FALSE(losses.empty());
    EXPECT_EQ(losses.begin()->first, 11) << "resumed at step " << losses.begin()->first - 1;
    EXPECT_EQ(losses.size(), 10u);
    double worst = 0;
    for (const auto& [step, loss] : losses) {
      const double got = std::strtod(loss.c_str(), nullptr);
      const double want = std::strtod(reference.at(step).c_str(), nullptr);
      worst = std::max(worst, std::fabs(got - want) / (1.0 + step));
      if (c.bitwise) {
        EXPECT_EQ(loss, reference.at(step)) << "step " << step;
      } else {
        EXPECT_LE(std::fabs(got - want), 1e-5 * (1.0 + step)) << "step " << step;
      }
    }
    if (c.workers / (c.tensor * c.pipeline) > 1) {
      // Data ranks with ZeRO-1 each download their data shard of the
      // weights and gather the rest (what keeps "same" bitwise).
      EXPECT_THAT(Logs(), ::testing::HasSubstr(absl::StrCat(
                              "job ", resumed.job_id(), " generation 1 resumes at step 10")));
      EXPECT_THAT(Logs(), ::testing::HasSubstr("(its data shard of the weights, the rest gathered)"));
    }
    std::printf("resume of %s from step 10 into (%d,%d,%d): steps 11-20 max |dloss|/(1+t) %.2e%s\n",
                base.job_id().c_str(), c.workers / (c.tensor * c.pipeline), c.tensor, c.pipeline,
                worst, c.bitwise ? " (bitwise equal)" : "");
  }
}

CommandResult Ctl(const LocalCluster& cluster, std::vector<std::string> args) {
  args.insert(args.begin(), absl::StrCat("--coordinator=", cluster.address()));
  absl::StatusOr<CommandResult> result = RunCommand(BinaryPath("cohortctl"), args, absl::Seconds(60));
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : CommandResult{-1, ""};
}

// Writes the unsharded weights of synthetic checkpoint `step` as the raw
// files tests/reference/check_safetensors.py compares with.
void WriteExpectedWeights(const std::string& dir, int64_t step) {
  std::filesystem::create_directories(dir);
  const model::ParameterTable whole(kSyntheticModel);
  std::ofstream index(dir + "/index.txt");
  for (const model::ParameterInfo& info : whole.tensors()) {
    index << info.name;
    for (int64_t d : info.global_shape) index << " " << d;
    index << "\n";
    std::vector<float> values(info.numel);
    for (size_t i = 0; i < info.numel; ++i) values[i] = SyntheticValue(step, 0, info.id, i);
    std::ofstream(dir + "/" + info.name + ".f32", std::ios::binary)
        .write(reinterpret_cast<const char*>(values.data()),
               static_cast<std::streamsize>(values.size() * sizeof(float)));
  }
}

TEST_F(CheckpointTest, CohortctlExportsAStaleGenerationIsRefusedAndFlippedBlobBytesAreDataLoss) {
  cluster_.StartCoordinator();
  for (int i = 0; i < 2; ++i) ASSERT_NE(cluster_.StartWorker(absl::StrCat("w", i), "host", i), nullptr);
  cluster_.WaitForIdleWorkers(2);
  v1::JobSpec spec = LocalCluster::Spec(1, 2, 4);  // 8 micro-batches: dp 2, then 4
  spec.set_name("ckpt");
  spec.mutable_checkpoint()->set_interval_steps(1);
  absl::StatusOr<v1::Job> job = cluster_.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  cluster_.WaitForJob(id, [](const v1::Job& j) { return LocalCluster::RunningAndReady(j, 2); },
                      absl::Seconds(30), "the job to run on 2 workers");
  auto client = client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(cluster_.address()));
  const SyntheticUpload saved = UploadSynthetic(client.get(), id, 1, 7, 2);
  ASSERT_TRUE(saved.all_ok && saved.committed) << saved.first_error;

  // cohortctl list, show and export.
  CommandResult listed = Ctl(cluster_, {"checkpoints", "list", id});
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("STEP"));
  EXPECT_TRUE(std::regex_search(listed.output, std::regex(R"(\n7\s+1\s+2x1x1\s+48\s+)")))
      << listed.output;
  CommandResult shown = Ctl(cluster_, {"checkpoints", "show", id, "7"});
  ASSERT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_THAT(shown.output, HasSubstr("param/qkvw"));
  EXPECT_THAT(shown.output, HasSubstr("[2, 3, 64, 64]"));
  EXPECT_THAT(shown.output, HasSubstr("object model: layers=2 heads=4 width=64"));
  const std::string file = cluster_.dir() + "/weights.safetensors";
  CommandResult exported =
      Ctl(cluster_, {"checkpoints", "export", id, "--out=" + file, "--format=safetensors"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("wrote " + file));
  WriteExpectedWeights(cluster_.dir() + "/expected", 7);
  absl::StatusOr<CommandResult> checked = RunCommand(
      "python3",
      {absl::StrCat(COHORT_SOURCE_DIR, "/tests/reference/check_safetensors.py"), file,
       cluster_.dir() + "/expected"},
      absl::Seconds(60));
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->exit_code, 0) << checked->output;
  std::printf("%s", checked->output.c_str());

  // Two more workers: the job grows to dp 4 (through dp 3 if the second
  // arrives after the first re-plan), and an upload still naming
  // generation 1 is refused.
  for (int i = 2; i < 4; ++i) ASSERT_NE(cluster_.StartWorker(absl::StrCat("w", i), "host", i), nullptr);
  const v1::Job grown = cluster_.WaitForJob(
      id, [](const v1::Job& j) { return LocalCluster::RunningAndReady(j, 4); }, absl::Seconds(30),
      "the job to grow to 4 workers");
  ASSERT_GE(grown.generation(), 2u);
  const SyntheticUpload stale = UploadSynthetic(client.get(), id, 1, 8, 2);
  EXPECT_FALSE(stale.committed);
  EXPECT_TRUE(absl::IsAborted(stale.first_error)) << stale.first_error;
  EXPECT_THAT(stale.first_error.message(), HasSubstr("stale"));
  const SyntheticUpload current = UploadSynthetic(client.get(), id, grown.generation(), 8, 4);
  EXPECT_TRUE(current.all_ok && current.committed) << current.first_error;

  // Flip one byte in the middle of the largest blob file, with the
  // coordinator stopped; every read of the chunk it lands in is DataLoss.
  cluster_.coordinator()->Signal(SIGTERM);
  ASSERT_TRUE(cluster_.coordinator()->Wait(absl::Seconds(30)).ok());
  std::string largest;
  uintmax_t largest_size = 0;
  for (const auto& entry : std::filesystem::directory_iterator(cluster_.dir() + "/data/checkpoints")) {
    if (entry.path().extension() == ".blob" && entry.file_size() > largest_size) {
      largest = entry.path();
      largest_size = entry.file_size();
    }
  }
  ASSERT_FALSE(largest.empty()) << "no blob files";
  {
    std::fstream blob(largest, std::ios::in | std::ios::out | std::ios::binary);
    blob.seekg(static_cast<std::streamoff>(largest_size / 2));
    char byte = 0;
    blob.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x20);
    blob.seekp(static_cast<std::streamoff>(largest_size / 2));
    blob.write(&byte, 1);
  }
  cluster_.StartCoordinator();
  absl::Status first_failure;
  for (int64_t step : {7, 8}) {
    absl::Status read = client->Download(
        id, step, {},
        [step](const std::string& tensor, const v1::ChunkInfo& info, std::string_view bytes) {
          return CheckSyntheticChunk(step, tensor, info, bytes);
        },
        absl::Seconds(30));
    if (!read.ok() && first_failure.ok()) first_failure = read;
  }
  EXPECT_TRUE(absl::IsDataLoss(first_failure)) << first_failure;
  EXPECT_TRUE(std::regex_search(std::string(first_failure.message()),
                                std::regex(R"(tensor \S+ chunk \d+ is corrupt)")))
      << first_failure;
  std::printf("flipped byte %ju of %s: %s\n", largest_size / 2, largest.c_str(),
              first_failure.ToString().c_str());
}

}  // namespace
}  // namespace cohort::testing
