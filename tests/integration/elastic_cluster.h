#pragma once
// ElasticTest: a LocalCluster of engine workers that log their losses, with
// helpers to kill members, wait for steps and compare loss trajectories
// against a fault-free run (tests/integration/elastic_*_test.cc).

#include <cmath>
#include <cstring>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpoint_client.h"
#include "common/box.h"
#include "common/box_proto.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/loss_log.h"

namespace cohort::testing {

inline constexpr double kLayoutTolerance = 1e-5;  // per (1 + step), as in model_parallel_test.cc

// A GPT small enough for 2 cores yet slow enough (tens of ms per step) that
// a kill lands inside a step: 4 layers, width 128, 4 micro-batches of 4
// sequences of 64 tokens per step.
inline v1::JobSpec ElasticSpec(const std::string& name, int tensor, int pipeline, int min_workers,
                        int max_workers, bool zero1, int steps = 40) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_layers(4);
  spec.mutable_model()->set_heads(4);
  spec.mutable_model()->set_width(128);
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_model()->set_context_length(64);
  spec.mutable_model()->set_init_seed(7);
  spec.mutable_data()->mutable_synthetic()->set_seed(11);
  spec.mutable_data()->mutable_synthetic()->set_order(1);
  spec.mutable_data()->set_seed(13);
  spec.mutable_optimizer()->set_learning_rate(3e-3);
  spec.mutable_optimizer()->set_min_learning_rate(3e-4);
  spec.mutable_optimizer()->set_warmup_steps(4);
  spec.mutable_optimizer()->set_weight_decay(0.1);
  spec.mutable_optimizer()->set_grad_clip(1.0);
  spec.mutable_batch()->set_global_batch_size(16);
  spec.mutable_batch()->set_micro_batch_size(4);
  spec.mutable_parallelism()->set_tensor(tensor);
  spec.mutable_parallelism()->set_pipeline(pipeline);
  spec.mutable_parallelism()->set_zero1(zero1);
  spec.mutable_elastic()->set_min_workers(min_workers);
  spec.mutable_elastic()->set_max_workers(max_workers);
  spec.set_steps(steps);
  return spec;
}

inline bool Finished(const v1::Job& job) {
  return job.state() == v1::JOB_STATE_COMPLETED || job.state() == v1::JOB_STATE_FAILED ||
         job.state() == v1::JOB_STATE_CANCELLED;
}

class ElasticTest : public ::testing::Test {
 protected:
  void StartCluster(int workers, const std::string& readopt_grace = "10s") {
    cluster_.StartCoordinator(readopt_grace);
    for (int i = 0; i < workers; ++i) StartWorker(i);
    cluster_.WaitForIdleWorkers(workers);
  }

  void StartWorker(int i) {
    std::vector<std::string> args = {absl::StrCat("--loss_log=", LossLog(i))};
    if (gpu_workers_) args.push_back("--device=gpu");  // after LocalCluster's --device=cpu: wins
    Subprocess* process =
        cluster_.StartWorker(absl::StrCat("w", i), "host", gpu_workers_ ? 0 : i, "engine", args);
    ASSERT_NE(process, nullptr);
    if (static_cast<int>(processes_.size()) <= i) processes_.resize(i + 1);
    processes_[i] = process;
  }

  std::string LossLog(int i) const { return absl::StrCat(cluster_.dir(), "/w", i, ".loss"); }

  std::vector<std::string> LossLogs() const {
    std::vector<std::string> paths;
    for (size_t i = 0; i < processes_.size(); ++i) paths.push_back(LossLog(static_cast<int>(i)));
    return paths;
  }

  // Exact repeats unless `layout_changed` (see ReadLosses).
  std::map<int, std::string> Losses(const std::string& job_id, bool layout_changed = false) {
    return ReadLosses(LossLogs(), job_id, layout_changed ? kLayoutTolerance : 0);
  }

  // The process of member `rank` of `job`'s current mesh.
  Subprocess* Member(const v1::Job& job, int rank) {
    const std::string& id = job.mesh().members(rank).worker_id();
    return processes_.at(std::stoi(id.substr(1)));
  }

  std::string Logs() {
    std::string text;
    for (size_t i = 0; i < processes_.size(); ++i) {
      absl::StrAppend(&text, "--- w", i, "\n", processes_[i]->ReadLog());
    }
    return text + "--- coordinator\n" + cluster_.coordinator()->ReadLog();
  }

  std::string SubmitJob(const v1::JobSpec& spec) {
    absl::StatusOr<v1::Job> job = cluster_.Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->job_id() : "";
  }

  // Waits for the job to run its current mesh of `workers` and pass `step`.
  v1::Job WaitForStep(const std::string& job_id, int64_t step, int workers) {
    return cluster_.WaitForJob(
        job_id,
        [&](const v1::Job& j) {
          return Finished(j) || (LocalCluster::RunningAndReady(j, workers) &&
                                 j.progress().step() >= step);
        },
        absl::Seconds(120), absl::StrCat("step ", step, " on ", workers, " workers"));
  }

  v1::Job WaitForEnd(const std::string& job_id) {
    const v1::Job job = cluster_.WaitForJob(job_id, Finished, absl::Seconds(240), "the job to end");
    EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.message() << "\n" << Logs();
    return job;
  }

  // Steps some generation trained again after a recovery that resumed
  // below them (from the loss logs' resume lines): what lost_steps counts.
  int64_t RedoneSteps(const std::string& job_id) const {
    return CountRedoneSteps(LossLogs(), job_id);
  }

  // Runs `spec` fault-free, then again, killing member `rank` with SIGKILL
  // once the job's `members` have passed step 12. Expects one recovery from
  // peers (generation 2), at most one step trained again, and the fault-free
  // run's losses bit for bit. Returns the job as it ended.
  v1::Job KillMemberAndCompare(const std::string& what, const v1::JobSpec& spec, int members,
                               int rank) {
    const std::map<int, std::string> reference = Reference(spec);
    const std::string id = SubmitJob(spec);
    const v1::Job before = WaitForStep(id, 12, members);
    EXPECT_FALSE(Finished(before)) << "the job finished before the kill";
    if (Finished(before)) return before;
    Member(before, rank)->Kill();
    const v1::Job job = WaitForEnd(id);
    EXPECT_EQ(job.generation(), 2u) << Logs();
    EXPECT_EQ(job.recovery().kind(), v1::RECOVERY_KIND_PEER) << job.recovery().reason();
    EXPECT_LE(job.recovery_stats().lost_steps(), 1);
    EXPECT_LE(job.recovery_stats().lost_steps(), RedoneSteps(id)) << Logs();
    ExpectTrajectory(what, Losses(id), reference, /*bitwise=*/true);
    std::printf("%s: killed at step %lld; recovered at step %lld; detection to running %.3f s\n",
                what.c_str(), static_cast<long long>(before.progress().step()),
                static_cast<long long>(job.recovery().step()),
                job.recovery_stats().last_detect_to_running_seconds());
    return job;
  }

  // Runs `spec` without faults and returns its losses (and, if asked, the
  // reference job's id).
  std::map<int, std::string> Reference(v1::JobSpec spec, std::string* job_id = nullptr) {
    spec.set_name(spec.name() + "-ref");
    const std::string id = SubmitJob(spec);
    if (job_id != nullptr) *job_id = id;
    WaitForEnd(id);
    std::map<int, std::string> losses = Losses(id);
    EXPECT_EQ(losses.size(), static_cast<size_t>(spec.steps())) << Logs();
    return losses;
  }

  // Every tensor of `job_id`'s committed checkpoint of `step` (weights and
  // AdamW moments), reassembled whole from its chunks whatever layout wrote
  // them: name -> the tensor's bytes in row-major order. Empty on failure.
  std::map<std::string, std::string> CheckpointTensors(const std::string& job_id, int64_t step) {
    auto client = client::NewGrpcCheckpointClient(CoordinatorTarget::Insecure(cluster_.address()));
    absl::StatusOr<v1::CheckpointManifest> manifest =
        client->GetManifest(job_id, step, absl::Seconds(10));
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    if (!manifest.ok()) return {};
    std::map<std::string, std::string> tensors;
    std::map<std::string, Box> wholes;
    for (const v1::TensorInfo& t : manifest->tensors()) {
      const std::vector<int64_t> shape(t.global_shape().begin(), t.global_shape().end());
      wholes[t.name()] = WholeBox(shape);
      tensors[t.name()].assign(static_cast<size_t>(wholes[t.name()].NumElements()) * 4, '\0');
    }
    const absl::Status read = client->Download(
        job_id, step, {},
        [&](const std::string& tensor, const v1::ChunkInfo& info, std::string_view bytes) {
          auto whole = wholes.find(tensor);
          if (whole == wholes.end()) return absl::NotFoundError("chunk of an unlisted tensor");
          const Box box = BoxFromProto(info.box());
          if (bytes.size() != static_cast<size_t>(box.NumElements()) * 4) {
            return absl::DataLossError("a chunk's size is not its box's");
          }
          CopyRegion(box, ConstBoxedBuffer{&box, 0, bytes.data()},
                     BoxedBuffer{&whole->second, 0, tensors[tensor].data()}, 4);
          return absl::OkStatus();
        },
        absl::Seconds(60));
    EXPECT_TRUE(read.ok()) << read;
    return read.ok() ? tensors : std::map<std::string, std::string>{};
  }

  // A fault-free run of `spec` (named with "-ref"), which must checkpoint
  // after its last step: every step's loss and that checkpoint's tensors.
  struct FixedRun {
    std::map<int, std::string> losses;
    std::map<std::string, std::string> tensors;
  };
  FixedRun ReferenceWithCheckpoint(const v1::JobSpec& spec) {
    std::string id;
    FixedRun run;
    run.losses = Reference(spec, &id);
    run.tensors = CheckpointTensors(id, spec.steps());
    return run;
  }
  // Expects `job_id` to have computed `fixed`'s bits: every step's loss, and
  // its checkpoint after the last step.
  void ExpectSameRun(const std::string& what, const std::string& job_id, const FixedRun& fixed,
                     int64_t steps) {
    ExpectTrajectory(what, Losses(job_id), fixed.losses, /*bitwise=*/true);
    ExpectSameTensors(absl::StrCat(what, ": final checkpoint"), CheckpointTensors(job_id, steps),
                      fixed.tensors);
  }

  // Expects two checkpoints' tensors to be the same bytes (memcmp).
  void ExpectSameTensors(const std::string& what, const std::map<std::string, std::string>& got,
                         const std::map<std::string, std::string>& reference) {
    ASSERT_FALSE(reference.empty()) << what;
    ASSERT_EQ(got.size(), reference.size()) << what;
    size_t bytes = 0;
    for (const auto& [name, value] : reference) {
      auto it = got.find(name);
      ASSERT_NE(it, got.end()) << what << ": no tensor " << name;
      ASSERT_EQ(it->second.size(), value.size()) << what << ": " << name;
      EXPECT_EQ(std::memcmp(it->second.data(), value.data(), value.size()), 0)
          << what << ": tensor " << name << " differs";
      bytes += value.size();
    }
    std::printf("%s: %zu tensors, %zu bytes of weights and moments bitwise equal\n", what.c_str(),
                reference.size(), bytes);
  }

  // Expects `losses` to hold every step and to match `reference` bitwise or
  // within the layout tolerance; prints the worst difference.
  void ExpectTrajectory(const std::string& what, const std::map<int, std::string>& losses,
                        const std::map<int, std::string>& reference, bool bitwise,
                        int first_step = 1) {
    int common = 0;
    const double worst = WorstRelativeDifference(losses, reference, &common);
    for (const auto& [step, loss] : reference) {
      if (step < first_step) continue;
      auto it = losses.find(step);
      if (it == losses.end()) {
        ADD_FAILURE() << what << ": step " << step << " was never trained";
        continue;
      }
      if (bitwise) {
        EXPECT_EQ(it->second, loss) << what << ": step " << step;
      } else {
        EXPECT_LE(std::fabs(std::strtod(it->second.c_str(), nullptr) -
                            std::strtod(loss.c_str(), nullptr)),
                  kLayoutTolerance * (1.0 + step))
            << what << ": step " << step;
      }
    }
    std::printf("%s: %d steps compared, max |dloss|/(1+t) %.3g%s\n", what.c_str(), common, worst,
                bitwise ? " (bitwise equal)" : "");
  }

  LocalCluster cluster_{"elastic"};
  std::vector<Subprocess*> processes_;
  // Workers run on the GPU (--device=gpu), all on CUDA device 0: several
  // ranks share one GPU, staged through host memory (gpu_training_test.cc).
  bool gpu_workers_ = false;
};

}  // namespace cohort::testing
