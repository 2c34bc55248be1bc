// cohort-train-test-rank: one rank of a multi-process data-parallel training
// test (tests/integration/data_parallel_test.cc). Trains the tiny test model
// on the synthetic source for --steps steps and writes, to --out:
//
//   step <s> <loss as %a>          one line per step (hex float: exact bits)
//   params <FNV-1a of the final parameters>
//
// and the raw final parameters to --out.params (rank 0 only).
// Ranks bootstrap their UCX context through a FileKvClient directory.
// Exit codes: 0 ok, 2 setup failed, 3 a step failed.

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/comm/file_kv_client.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"
#include "worker/train/training_session.h"

ABSL_FLAG(int, rank, 0, "this process's data-parallel rank");
ABSL_FLAG(int, size, 1, "data-parallel degree");
ABSL_FLAG(std::string, kv_dir, "", "FileKvClient directory shared by the ranks (size > 1)");
ABSL_FLAG(int, steps, 20, "optimizer steps");
ABSL_FLAG(int, global_batch, 8, "sequences per step");
ABSL_FLAG(int, micro_batch, 4, "sequences per micro-batch");
ABSL_FLAG(bool, zero1, false, "shard optimizer state (ZeRO-1)");
ABSL_FLAG(int, threads, 1, "OpenMP threads");
ABSL_FLAG(std::string, out, "", "output file (losses, parameter hash)");

namespace {

using cohort::train::TrainingConfig;

TrainingConfig TinyConfig() {
  TrainingConfig c;
  c.model.layers = 2;
  c.model.heads = 4;
  c.model.width = 64;
  c.model.vocab_size = 64;
  c.model.context_length = 32;
  c.init_seed = 42;
  c.global_batch_size = absl::GetFlag(FLAGS_global_batch);
  c.micro_batch_size = absl::GetFlag(FLAGS_micro_batch);
  c.steps = absl::GetFlag(FLAGS_steps);
  c.lr.max_lr = 1e-3;
  c.lr.min_lr = 1e-4;
  c.lr.warmup_steps = 3;
  c.lr.total_steps = c.steps;
  c.adamw.weight_decay = 0.1;
  c.grad_clip = 1.0;
  c.zero1 = absl::GetFlag(FLAGS_zero1);
  c.data.synthetic = true;
  c.data.markov.seed = 7;
  c.data.markov.vocab_size = 64;
  c.data.markov.alphabet_size = 16;
  c.data.markov.branching = 4;
  c.data.synthetic_tokens = 200000;
  c.data.sample_seed = 11;
  return c;
}

uint64_t Fnv(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int size = absl::GetFlag(FLAGS_size);
  cohort::log::SetProcessTag("rank " + std::to_string(rank));
  std::unique_ptr<cohort::comm::KvClient> kv;
  std::unique_ptr<cohort::comm::UcxContext> context;
  std::unique_ptr<cohort::comm::UcxCommunicator> group;
  if (size > 1) {
    auto file_kv = cohort::comm::FileKvClient::Create(absl::GetFlag(FLAGS_kv_dir));
    if (!file_kv.ok()) {
      LOG(ERROR) << file_kv.status();
      return 2;
    }
    kv = std::move(*file_kv);
    cohort::comm::UcxContextOptions options;
    options.rank = rank;
    options.size = size;
    options.kv = kv.get();
    auto created = cohort::comm::UcxContext::Create(options);
    if (!created.ok()) {
      LOG(ERROR) << created.status();
      return 2;
    }
    context = std::move(*created);
    auto communicator = cohort::comm::UcxCommunicator::Create(context.get(), {});
    if (!communicator.ok()) {
      LOG(ERROR) << communicator.status();
      return 2;
    }
    group = std::move(*communicator);
  }
  cohort::train::TrainingSessionOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.collective_timeout = absl::Seconds(60);
  auto session = cohort::train::TrainingSession::Create(TinyConfig(), group.get(), options);
  if (!session.ok()) {
    LOG(ERROR) << session.status();
    return 2;
  }
  std::string report;
  for (int s = 0; s < absl::GetFlag(FLAGS_steps); ++s) {
    auto result = (*session)->RunStep(cohort::Step(s));
    if (!result.ok()) {
      LOG(ERROR) << "step " << s << ": " << result.status();
      return 3;
    }
    char line[96];
    std::snprintf(line, sizeof(line), "step %d %a\n", s, result->loss);
    report += line;
  }
  cohort::model::GptModel& model = (*session)->model();
  const size_t bytes = model.num_params() * sizeof(float);
  absl::StrAppend(&report, "params ", Fnv(model.params(), bytes), "\n");
  const std::string out = absl::GetFlag(FLAGS_out);
  std::ofstream(out) << report;
  if (rank == 0) {
    std::ofstream(out + ".params", std::ios::binary)
        .write(reinterpret_cast<const char*>(model.params()), static_cast<std::streamsize>(bytes));
  }
  return 0;
}
