// cohort-bench-checkpoint: checkpoint save and load throughput through a
// running coordinator, and the training stall a checkpoint costs.
//
//   cohort-bench-checkpoint --coordinator=HOST:PORT --jobs=1:ID1,2:ID2 --generation=G
//       [--model=gpt2-124m] [--writers=1,2] [--rounds=3] [--drop_caches]
//       [--stall_spec=deploy/local/jobs/demo.yaml --stall_steps=200 --stall_interval=10]
//
// Throughput: the model's full state (weights and both AdamW moments, fp32:
// 1.49 GB for GPT-2 124M) filled with a pattern, saved by W writers at once
// as a (W,1,1) ZeRO-1 layout (each writes 1/W) and loaded back by W loaders
// (each reads the weights and its moment shard). Save time runs from the
// uploads' start (after the snapshot copy, shown apart) to the commit; load
// time from the first request to the last byte in place. With --drop_caches (root) the page cache is dropped before
// each load, so loads read the disk. One table row per (writers, round).
//
// The coordinator takes uploads only in the layout of the job's current mesh,
// so each writer count W uploads under a RUNNING job of W workers (--jobs).
//
// Stall: the spec's model trains in this process for --stall_steps steps,
// checkpointing every --stall_interval steps to the coordinator (under the
// 1-worker job of --jobs, the uploads are real); prints the median step time without a
// checkpoint, the time the loop is blocked per checkpoint (waiting for the
// previous upload, then copying the state), and the time of the steps that
// run while an upload is in flight.

#include <algorithm>
#include <atomic>
#include <map>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/checkpoint_client.h"
#include "common/huge_page_malloc.h"
#include "common/job_spec/io.h"
#include "common/log.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/train/data_parallel.h"
#include "worker/train/training_config.h"
#include "worker/train/training_session.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "coordinator gRPC address");
ABSL_FLAG(std::string, jobs, "",
          "W:JOB,...: for each writer count W a RUNNING job of W workers whose generation the "
          "uploads carry");
ABSL_FLAG(uint64_t, generation, 1, "those jobs' current generation");
ABSL_FLAG(std::string, model, "gpt2-124m", "gpt2-124m (L12 C768 V50257 T1024) or small");
ABSL_FLAG(std::string, writers, "1,2", "writer counts to measure, comma separated");
ABSL_FLAG(int, rounds, 3, "rounds per writer count");
ABSL_FLAG(bool, drop_caches, false, "drop the page cache before each load (needs root)");
ABSL_FLAG(std::string, stall_spec, "", "job spec file whose model measures the stall; empty: skip");
ABSL_FLAG(int, stall_steps, 200, "training steps of the stall measurement");
ABSL_FLAG(int, stall_interval, 10, "checkpoint every this many steps in it");

namespace cohort::bench {
namespace {

model::GptConfig Model() {
  if (absl::GetFlag(FLAGS_model) == "small") {
    return {.layers = 4, .heads = 4, .width = 128, .vocab_size = 512, .context_length = 64};
  }
  return {.layers = 12, .heads = 12, .width = 768, .vocab_size = 50257, .context_length = 1024};
}

// --jobs parsed: writer count -> job id.
using JobsByWriters = std::map<int, std::string>;

absl::StatusOr<JobsByWriters> ParseJobs(absl::string_view text) {
  JobsByWriters jobs;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(entry, absl::MaxSplits(':', 1));
    int writers = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &writers) || writers < 1 ||
        parts[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--jobs: \"", entry, "\" is not W:JOB (a writer count and a job id)"));
    }
    jobs[writers] = std::string(parts[1]);
  }
  if (jobs.empty()) return absl::InvalidArgumentError("--jobs is required (W:JOB,...)");
  return jobs;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void DropCaches() {
  sync();
  std::ofstream drop("/proc/sys/vm/drop_caches");
  drop << "3\n";
  if (!drop.good()) LOG(WARNING) << "--drop_caches: cannot write /proc/sys/vm/drop_caches";
}

struct Rank {
  checkpoint::RankPosition position;
  checkpoint::ArenaRange optimizer;
  std::vector<float> params, m, v;
};

std::vector<Rank> MakeRanks(const model::ParameterTable& table, int writers) {
  std::vector<Rank> ranks(static_cast<size_t>(writers));
  for (int r = 0; r < writers; ++r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    rank.position = {{.data = writers}, {.data = r}};
    const layout::ShardRange own = layout::DataShardRange(table.num_params(), writers, r);
    rank.optimizer = {own.begin, own.end};
    rank.params.resize(table.num_params());
    rank.m.resize(own.end - own.begin);
    rank.v.resize(own.end - own.begin);
    for (size_t i = 0; i < rank.params.size(); ++i) rank.params[i] = static_cast<float>(i % 1021) * 1e-3f;
    for (size_t i = 0; i < rank.m.size(); ++i) {
      rank.m[i] = static_cast<float>((own.begin + i) % 997) * 1e-4f;
      rank.v[i] = static_cast<float>((own.begin + i) % 991) * 1e-6f;
    }
  }
  return ranks;
}

// Returns how many rounds failed.
int Throughput(client::CheckpointClient* client, const JobsByWriters& jobs) {
  const model::GptConfig config = Model();
  const model::ParameterTable table(config);
  const double state_gb = 3.0 * static_cast<double>(table.num_params()) * 4 / 1e9;
  std::printf("\nmodel %s: %zu parameters, checkpoint with AdamW state %.3f GB\n\n",
              absl::GetFlag(FLAGS_model).c_str(), table.num_params(), state_gb);
  std::printf("| writers | round | snapshot ms | save s | save GB/s | load s | load GB read | "
              "load GB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  int64_t step = 1;
  int failed = 0;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_writers), ',')) {
    int writers = 0;
    if (!absl::SimpleAtoi(text, &writers) || writers < 1) {
      LOG(ERROR) << "--writers: \"" << text << "\" is not a positive count";
      ++failed;
      continue;
    }
    const auto job = jobs.find(writers);
    if (job == jobs.end()) {
      LOG(ERROR) << "--jobs names no job of " << writers << " workers for --writers " << writers;
      ++failed;
      continue;
    }
    const std::string& job_id = job->second;
    std::vector<Rank> ranks = MakeRanks(table, writers);
    std::vector<Rank> loaded = MakeRanks(table, writers);
    // The writers live across rounds, as in a trainer: their snapshot
    // buffers are allocated (and paged in) once.
    std::vector<std::unique_ptr<checkpoint::CheckpointWriter>> writer_objects;
    for (int r = 0; r < writers; ++r) {
      checkpoint::CheckpointWriterOptions options;
      options.job_id = job_id;
      options.generation = Generation(absl::GetFlag(FLAGS_generation));
      options.writer = static_cast<uint32_t>(r);
      options.position = ranks[static_cast<size_t>(r)].position;
      options.zero1 = true;
      writer_objects.push_back(
          std::make_unique<checkpoint::CheckpointWriter>(client, config, table, options));
    }
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round, ++step) {
      // The time runs from the uploads' start (each Save has copied its
      // rank's state and returned: the training loop's share, the stall)
      // to the last writer's reply, which comes after the commit.
      std::fprintf(stderr, "writers %d round %d: saving step %lld\n", writers, round + 1,
                   static_cast<long long>(step));
      absl::Time start = absl::InfinitePast();
      double snapshot_ms = 0;
      for (int r = 0; r < writers; ++r) {
        const Rank& rank = ranks[static_cast<size_t>(r)];
        absl::StatusOr<absl::Duration> saved = writer_objects[static_cast<size_t>(r)]->Save(
            Step(step), {rank.params.data(), rank.m.data(), rank.v.data(), rank.optimizer});
        if (!saved.ok()) LOG(ERROR) << saved.status();
        if (saved.ok()) snapshot_ms = std::max(snapshot_ms, absl::ToDoubleMilliseconds(*saved));
        if (r == 0) start = absl::Now();
      }
      bool ok = true;
      for (auto& w : writer_objects) {
        const checkpoint::UploadResult result = w->Wait();
        if (!result.status.ok()) {
          LOG(ERROR) << "save: " << result.status;
          ok = false;
        }
      }
      const double save_s = absl::ToDoubleSeconds(absl::Now() - start);
      if (!ok) {
        ++failed;
        continue;
      }
      std::fprintf(stderr, "writers %d round %d: loading step %lld\n", writers, round + 1,
                   static_cast<long long>(step));
      if (absl::GetFlag(FLAGS_drop_caches)) DropCaches();
      absl::StatusOr<v1::CheckpointManifest> manifest =
          client->GetManifest(job_id, step, absl::Minutes(1));
      if (!manifest.ok()) {
        LOG(ERROR) << manifest.status();
        ++failed;
        continue;
      }
      std::vector<uint64_t> bytes(static_cast<size_t>(writers));
      std::atomic<int> load_errors{0};
      std::vector<std::thread> loaders;
      const absl::Time load_start = absl::Now();
      for (int r = 0; r < writers; ++r) {
        loaders.emplace_back([&, r] {
          Rank& rank = loaded[static_cast<size_t>(r)];
          checkpoint::LoadStats stats;
          const absl::Status s = checkpoint::LoadCheckpoint(
              client, *manifest, config, table,
              {rank.params.data(), rank.m.data(), rank.v.data(), rank.optimizer},
              absl::Minutes(10), &stats);
          if (!s.ok()) {
            LOG(ERROR) << "load: " << s;
            ++load_errors;
          }
          bytes[static_cast<size_t>(r)] = stats.bytes;
        });
      }
      for (std::thread& t : loaders) t.join();
      const double load_s = absl::ToDoubleSeconds(absl::Now() - load_start);
      if (load_errors > 0) {
        ++failed;
        continue;
      }
      uint64_t read = 0;
      for (uint64_t b : bytes) read += b;
      std::printf("| %d | %d | %.0f | %.2f | %.3f | %.2f | %.3f | %.3f |\n", writers, round + 1,
                  snapshot_ms, save_s, state_gb / save_s, load_s, static_cast<double>(read) / 1e9,
                  static_cast<double>(read) / 1e9 / load_s);
      std::fflush(stdout);
    }
  }
  return failed;
}

int Stall(client::CheckpointClient* client, const std::string& job_id) {
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(absl::GetFlag(FLAGS_stall_spec));
  if (!spec.ok()) {
    LOG(ERROR) << spec.status();
    return 1;
  }
  spec->set_steps(absl::GetFlag(FLAGS_stall_steps));
  absl::StatusOr<train::TrainingConfig> config = train::TrainingConfigFromSpec(*spec, {});
  if (!config.ok()) {
    LOG(ERROR) << config.status();
    return 1;
  }
  train::TrainingSessionOptions options;
  options.num_threads = 1;  // a worker's share when several share the machine
  absl::StatusOr<std::unique_ptr<train::TrainingSession>> session =
      train::TrainingSession::Create(*config, model::ModelLayout{}, {}, options);
  if (!session.ok()) {
    LOG(ERROR) << session.status();
    return 1;
  }
  train::TrainingSession& s = **session;
  checkpoint::CheckpointWriterOptions writer_options;
  writer_options.job_id = job_id;
  writer_options.generation = Generation(absl::GetFlag(FLAGS_generation));
  writer_options.position = {};
  checkpoint::CheckpointWriter writer(client, config->model, s.model().table(), writer_options);
  const checkpoint::ArenaRange optimizer{0, s.model().num_params()};
  const int interval = std::max(1, absl::GetFlag(FLAGS_stall_interval));
  std::vector<double> quiet, overlapped, stalls;
  int64_t uploads_done = 0;
  for (int step = 0; step < config->steps; ++step) {
    const bool in_flight = writer.uploads_ok() + writer.uploads_failed() < uploads_done;
    const absl::Time begin = absl::Now();
    absl::StatusOr<train::StepResult> result = s.RunStep(Step(step));
    if (!result.ok()) {
      LOG(ERROR) << result.status();
      return 1;
    }
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - begin);
    if (step >= 5) (in_flight ? overlapped : quiet).push_back(ms);  // skip warm-up
    if ((step + 1) % interval == 0) {
      absl::StatusOr<absl::Duration> stall = writer.Save(
          Step(step + 1), {s.model().params(), s.runner().adam_m(), s.runner().adam_v(), optimizer});
      if (stall.ok()) {
        stalls.push_back(absl::ToDoubleMilliseconds(*stall));
        // A long block means the previous upload was still running.
        if (*stall > absl::Milliseconds(5) && writer.last_result().has_value()) {
          std::printf("  checkpoint at step %d blocked %.1f ms: the previous upload (step %lld) "
                      "took %.1f ms\n",
                      step + 1, stalls.back(), static_cast<long long>(writer.last_result()->step.value()),
                      absl::ToDoubleMilliseconds(writer.last_result()->duration));
        }
      }
      ++uploads_done;
    }
  }
  writer.Wait();
  const double step_ms = Median(quiet);
  const double stall_ms = Median(stalls);
  std::printf("\nstall: %s (%zu parameters, %.2f MB per checkpoint), %d steps, a checkpoint every "
              "%d steps, %lld uploads (%lld failed)\n\n",
              absl::GetFlag(FLAGS_stall_spec).c_str(), s.model().num_params(),
              static_cast<double>(writer.bytes_per_checkpoint()) / 1e6,
              static_cast<int>(config->steps), interval,
              static_cast<long long>(writer.uploads_ok() + writer.uploads_failed()),
              static_cast<long long>(writer.uploads_failed()));
  std::printf("| step ms (no upload) | step ms (upload in flight) | blocked per checkpoint ms "
              "(median / max) | blocked / step |\n|---|---|---|---|\n");
  std::printf("| %.2f | %.2f | %.3f / %.3f | %.1f%% |\n", step_ms, Median(overlapped), stall_ms,
              stalls.empty() ? 0.0 : *std::max_element(stalls.begin(), stalls.end()),
              step_ms > 0 ? 100.0 * stall_ms / step_ms : 0.0);
  return writer.uploads_failed() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace cohort::bench

int main(int argc, char** argv) {
  // As in cohort-worker, whose checkpoint path this measures.
  cohort::ReexecWithHugePageMalloc(argv);
  absl::SetProgramUsageMessage("cohort-bench-checkpoint: checkpoint throughput and stall");
  absl::ParseCommandLine(argc, argv);
  const absl::StatusOr<cohort::bench::JobsByWriters> jobs =
      cohort::bench::ParseJobs(absl::GetFlag(FLAGS_jobs));
  if (!jobs.ok()) {
    std::fprintf(stderr, "cohort-bench-checkpoint: %s\n", std::string(jobs.status().message()).c_str());
    return 64;
  }
  auto client = cohort::client::NewGrpcCheckpointClient(
      cohort::CoordinatorTarget::Insecure(absl::GetFlag(FLAGS_coordinator)));
  int failed = 0;
  if (absl::GetFlag(FLAGS_rounds) > 0) failed += cohort::bench::Throughput(client.get(), *jobs);
  if (!absl::GetFlag(FLAGS_stall_spec).empty()) {
    const auto one = jobs->find(1);
    if (one == jobs->end()) {
      std::fprintf(stderr, "cohort-bench-checkpoint: --stall_spec needs a 1-worker job in --jobs\n");
      return 64;
    }
    failed += cohort::bench::Stall(client.get(), one->second);
  }
  if (failed > 0) {
    std::fprintf(stderr, "cohort-bench-checkpoint: %d measurement(s) failed (see the log)\n",
                 failed);
    return 1;
  }
  return 0;
}
