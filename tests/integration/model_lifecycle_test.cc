// What users do with a trained model, end to end on real processes:
//   - a job with data.validation reports its validation loss after every
//     interval and after the last step; the coordinator keeps the curve
//     (Jobs.GetLossHistory), `cohortctl get` shows the newest result and
//     `cohortctl plot` draws it; one worker and two compute the same bits
//     (the deterministic reduction covers validation too); `cohortctl sample`
//     generates from its final checkpoint, the same text for the same seed;
//   - a job started from a Hugging Face GPT-2 file (checkpoint.init_from)
//     written by PyTorch trains its first step at PyTorch's loss (1e-5),
//     on a tensor-parallel mesh that loads its shards of the file; a file
//     that does not fit fails the job, naming the field.

#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
#include "tests/testing/job_specs.h"
#include "worker/data/token_shard.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;

bool Finished(const v1::Job& job) {
  return job.state() == v1::JOB_STATE_COMPLETED || job.state() == v1::JOB_STATE_FAILED ||
         job.state() == v1::JOB_STATE_CANCELLED;
}

absl::StatusOr<v1::LossHistory> History(LocalCluster& cluster, const std::string& job_id) {
  auto stub = v1::Jobs::NewStub(cluster.channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetLossHistoryRequest request;
  request.set_job_id(job_id);
  v1::LossHistory history;
  const grpc::Status status = stub->GetLossHistory(&context, request, &history);
  if (!status.ok()) return absl::InternalError(status.error_message());
  return history;
}

absl::StatusOr<CommandResult> Ctl(LocalCluster& cluster, std::vector<std::string> args) {
  args.insert(args.begin(), absl::StrCat("--coordinator=", cluster.address()));
  return RunCommand(BinaryPath("cohortctl"), args, absl::Seconds(30));
}

v1::JobSpec ValidatedSpec(const std::string& name, int workers) {
  v1::JobSpec spec = SmallJobSpec(name, 1, workers, workers);
  spec.mutable_data()->mutable_synthetic()->set_tokens(40000);
  spec.mutable_data()->mutable_validation()->set_held_out_fraction(0.25);
  spec.mutable_data()->mutable_validation()->set_interval_steps(5);
  spec.mutable_data()->mutable_validation()->set_batches(2);
  spec.set_steps(12);
  spec.mutable_checkpoint()->set_interval_steps(12);  // the final weights, for sample
  return spec;
}

TEST(ModelLifecycleTest, ValidationLossIsRecordedShownPlottedAndTheSameOnOneAndTwoWorkers) {
  LocalCluster cluster("lifecycle");
  cluster.StartCoordinator();
  for (int i = 0; i < 2; ++i) {
    ASSERT_NE(cluster.StartWorker(absl::StrCat("w", i), "host", i, "engine"), nullptr);
  }
  cluster.WaitForIdleWorkers(2);
  std::vector<v1::LossHistory> histories;
  for (const int workers : {1, 2}) {
    absl::StatusOr<v1::Job> submitted =
        cluster.Submit(ValidatedSpec(absl::StrCat("val", workers), workers));
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    const v1::Job job = cluster.WaitForJob(submitted->job_id(), Finished, absl::Seconds(120),
                                           "the validated job to finish");
    ASSERT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.message();
    EXPECT_EQ(job.mesh().data_parallel(), workers);
    // The job's progress carries the newest validations, the last step's last.
    ASSERT_FALSE(job.progress().validation().empty());
    EXPECT_EQ(job.progress().validation(job.progress().validation_size() - 1).step(), 12);
    absl::StatusOr<v1::LossHistory> history = History(cluster, job.job_id());
    ASSERT_TRUE(history.ok()) << history.status();
    ASSERT_EQ(history->validation_size(), 3) << history->DebugString();
    EXPECT_EQ(history->validation(0).step(), 5);
    EXPECT_EQ(history->validation(1).step(), 10);
    EXPECT_EQ(history->validation(2).step(), 12);
    ASSERT_FALSE(history->training().empty());
    EXPECT_EQ(history->training(history->training_size() - 1).step(), 12);
    // An untrained model over 256 tokens starts near ln(256) = 5.5; twelve
    // steps on the synthetic source bring the held-out loss down.
    EXPECT_LT(history->validation(2).loss(), history->validation(0).loss());
    EXPECT_LT(history->validation(0).loss(), std::log(256.0));
    histories.push_back(*history);

    absl::StatusOr<CommandResult> get = Ctl(cluster, {"get", job.job_id()});
    ASSERT_TRUE(get.ok()) << get.status();
    EXPECT_THAT(get->output, HasSubstr(absl::StrFormat(
                                 "loss %.4f at step 12", history->validation(2).loss())));
    EXPECT_THAT(get->output, HasSubstr("the last 25% of the data, every 5 steps"));
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(histories[0].validation(i).loss(), histories[1].validation(i).loss())
        << "validation " << i << ": one worker and two differ";
  }

  const std::string svg = absl::StrCat(cluster.dir(), "/loss.svg");
  absl::StatusOr<CommandResult> plot = Ctl(cluster, {"plot", "val2-2", "--out", svg});
  ASSERT_TRUE(plot.ok()) << plot.status();
  ASSERT_EQ(plot->exit_code, 0) << plot->output;
  EXPECT_THAT(plot->output, HasSubstr("3 validation points"));
  std::ifstream file(svg);
  std::stringstream contents;
  contents << file.rdbuf();
  EXPECT_THAT(contents.str(), HasSubstr("data-series=\"validation\""));
  // Text from the final checkpoint through `cohortctl sample` (cohort-sample):
  // greedy is deterministic, and a seeded draw repeats with its seed.
  std::vector<std::string> outputs;
  for (int i = 0; i < 2; ++i) {
    for (const char* temperature : {"0", "1"}) {
      // stdout only: stderr says how long it took.
      absl::StatusOr<CommandResult> sample = RunCommand(
          "/bin/sh",
          {"-c", absl::StrCat("exec \"$0\" --coordinator=", cluster.address(),
                              " sample val2-2 --prompt ab --tokens 24 --temperature ", temperature,
                              " --seed 7 2>/dev/null"),
           BinaryPath("cohortctl")},
          absl::Seconds(30));
      ASSERT_TRUE(sample.ok()) << sample.status();
      ASSERT_EQ(sample->exit_code, 0) << sample->output;
      outputs.push_back(sample->output);
    }
  }
  EXPECT_EQ(outputs[0], outputs[2]);
  EXPECT_EQ(outputs[1], outputs[3]);
  EXPECT_EQ(outputs[0].rfind("ab", 0), 0u) << outputs[0];
  EXPECT_GT(outputs[0].size(), 2u) << "24 tokens follow the prompt";
  absl::StatusOr<CommandResult> missing = Ctl(cluster, {"plot", "nope-1", "--out", svg});
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->exit_code, 1);
  EXPECT_THAT(missing->output, HasSubstr("NOT_FOUND"));
}

TEST(ModelLifecycleTest, AJobStartedFromAHuggingFaceFileTrainsItsFirstStepAtPyTorchsLoss) {
  const std::string dir = MakeTempDir("init_from");
  constexpr int kT = 32, kVocab = 256;
  // One window of T + 1 tokens: every sample of every step is this one
  // sequence, so the first step's loss is the loss PyTorch computes on it.
  std::vector<uint16_t> window(kT + 1);
  std::vector<int32_t> tokens(2 * kT);
  for (int t = 0; t <= kT; ++t) window[t] = static_cast<uint16_t>((t * 37 + 11) % kVocab);
  for (int t = 0; t < kT; ++t) {
    tokens[t] = window[t];
    tokens[kT + t] = window[t + 1];
  }
  ASSERT_TRUE(data::WriteTokenShard(absl::StrCat(dir, "/train_000000.bin"), window).ok());
  {
    std::ofstream config(absl::StrCat(dir, "/config.txt"));
    config << "layers 2\nheads 4\nwidth 64\nvocab_size " << kVocab << "\ncontext_length " << kT
           << "\nbatch 1\ntime " << kT << "\nseed 5\nthreads 1\n";
    std::ofstream out(absl::StrCat(dir, "/tokens.bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * sizeof(int32_t)));
  }
  absl::StatusOr<CommandResult> reference = RunCommand(
      PythonPath(), {absl::StrCat(COHORT_SOURCE_DIR, "/tests/reference/hf_gpt2_reference.py"), dir},
      absl::Seconds(60));
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->exit_code, 0)
      << reference->output << "\nNeeds " << PythonPath()
      << " with torch: run `tools/dev deps` (installs python3-torch).";
  double expected = 0;
  {
    std::ifstream in(absl::StrCat(dir, "/ref_loss.bin"), std::ios::binary);
    in.read(reinterpret_cast<char*>(&expected), sizeof(expected));
    ASSERT_TRUE(in.good());
  }

  LocalCluster cluster("initfrom");
  cluster.StartCoordinator();
  for (int i = 0; i < 2; ++i) {
    ASSERT_NE(cluster.StartWorker(absl::StrCat("w", i), "host", i, "engine"), nullptr);
  }
  cluster.WaitForIdleWorkers(2);
  v1::JobSpec spec = SmallJobSpec("hf", /*tensor=*/2, 2, 2);
  spec.mutable_model()->set_context_length(kT);
  spec.mutable_data()->mutable_shards()->set_pattern(absl::StrCat(dir, "/train_*.bin"));
  spec.mutable_batch()->set_global_batch_size(2);
  spec.mutable_batch()->set_micro_batch_size(1);
  spec.mutable_checkpoint()->set_init_from(absl::StrCat(dir, "/hf.safetensors"));
  spec.set_steps(1);
  absl::StatusOr<v1::Job> submitted = cluster.Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::Job job = cluster.WaitForJob(submitted->job_id(), Finished, absl::Seconds(120),
                                   "the job from the HF file to finish");
  ASSERT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.message();
  EXPECT_EQ(job.mesh().tensor_parallel(), 2);
  EXPECT_NEAR(job.progress().loss(), expected, 1e-5 * expected)
      << "Cohort's first step from the file against PyTorch's forward on the same weights";

  // A file for another model fails the job, saying which field disagrees.
  v1::JobSpec wider = spec;
  wider.set_name("hf-wider");
  wider.mutable_model()->set_width(128);
  submitted = cluster.Submit(wider);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  job = cluster.WaitForJob(submitted->job_id(), Finished, absl::Seconds(60),
                           "the mismatched job to fail");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.message(), HasSubstr("checkpoint.init_from"));
  EXPECT_THAT(job.message(), HasSubstr("width"));
}

}  // namespace
}  // namespace cohort::testing
