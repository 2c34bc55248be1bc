// cohort-train-test-rank: one rank of a multi-process training test
// (tests/integration/data_parallel_test.cc, model_parallel_test.cc). Trains
// the tiny or the small test model on the synthetic source for --steps steps
// in a (dp, tp, pp) layout (Megatron rank order: rank = stage * dp * tp +
// data * tp + tensor) and writes, to --out:
//
//   step <s> <loss as %a>          one line per step (hex float: exact bits)
//   params <FNV-1a of this rank's final parameters>
//   validation <loss as %a>        with --validation_batches: after the last step
//
// the raw final parameters of this rank's shard to --out.params, and (with
// --grads) the step-0 gradient after the data-parallel reduction, before
// clipping, to --out.grads: uint64 begin, uint64 end (the valid local range:
// the ZeRO-1 shard or everything), then the shard's num_params floats.
// Ranks bootstrap their UCX context through a FileKvClient directory.
// --backend picks where the layers run: the CPU, GuardedBackend (the CPU's
// arithmetic behind memory the host may not touch, so the model stages
// through host memory as on a GPU), or the CUDA backend (tests/integration/
// gpu_training_test.cc: every rank may share one GPU).
// Exit codes: 0 ok, 2 setup failed, 3 a step failed.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "tests/testing/guarded_backend.h"
#include "worker/comm/file_kv_client.h"
#include "worker/comm/mesh_groups.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"
#include "worker/train/mesh_communicators.h"
#include "worker/train/training_session.h"

ABSL_FLAG(int, rank, 0, "this process's rank (Megatron order)");
ABSL_FLAG(int, size, 1, "world size: dp x tp x pp");
ABSL_FLAG(int, tp, 1, "tensor-parallel degree");
ABSL_FLAG(int, pp, 1, "pipeline-parallel degree");
ABSL_FLAG(std::string, model, "tiny",
          "tiny (L2 NH4 C64 V64 T32) or small (L4 NH4 C128 V512 T64)");
ABSL_FLAG(std::string, kv_dir, "", "FileKvClient directory shared by the ranks (size > 1)");
ABSL_FLAG(int, steps, 20, "optimizer steps");
ABSL_FLAG(int, global_batch, 8, "sequences per step");
ABSL_FLAG(int, micro_batch, 4, "sequences per micro-batch");
ABSL_FLAG(bool, zero1, false, "shard optimizer state (ZeRO-1)");
ABSL_FLAG(bool, tie_per_step, false,
          "add the tied embedding's two gradient parts once per step (the pipeline's order) "
          "even without pipeline parallelism");
ABSL_FLAG(bool, grads, false, "write the step-0 reduced gradient to --out.grads");
ABSL_FLAG(int, threads, 1, "OpenMP threads");
ABSL_FLAG(int, validation_batches, 0,
          "validate on this many held-out batches after the last step (the corpus's last 20% "
          "held out); 0: no validation, nothing held out");
ABSL_FLAG(std::string, backend, "cpu",
          "where the layers run: cpu, guarded (GuardedBackend, tests/testing/guarded_backend.h: "
          "the CPU's arithmetic behind memory the host may not touch) or cuda");
ABSL_FLAG(std::string, precision, "fp32", "the CUDA backend's precision: fp32, tf32 or bf16");
ABSL_FLAG(int, device_index, 0, "the CUDA device (--backend=cuda)");
ABSL_FLAG(std::string, reduction, "deterministic",
          "data-parallel sum order: deterministic (the fixed tree) or transport");
ABSL_FLAG(std::string, out, "", "output file (losses, parameter hash)");

namespace {

using cohort::train::TrainingConfig;

absl::StatusOr<TrainingConfig> TestConfig() {
  TrainingConfig c;
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "cuda") {
    c.backend = cohort::compute::BackendKind::kCuda;
  } else if (backend != "cpu" && backend != "guarded") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: '", backend, "' is none of cpu, guarded, cuda"));
  }
  const std::string precision = absl::GetFlag(FLAGS_precision);
  const std::optional<cohort::compute::Precision> parsed =
      cohort::compute::PrecisionFromName(precision);
  if (!parsed.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--precision: '", precision, "' is none of fp32, tf32, bf16"));
  }
  c.precision = *parsed;
  if (c.precision != cohort::compute::Precision::kFp32 && backend != "cuda") {
    return absl::InvalidArgumentError("--precision: tf32 and bf16 need --backend=cuda");
  }
  const bool small = absl::GetFlag(FLAGS_model) == "small";
  c.model.layers = small ? 4 : 2;
  c.model.heads = 4;
  c.model.width = small ? 128 : 64;
  c.model.vocab_size = small ? 512 : 64;
  c.model.context_length = small ? 64 : 32;
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
  c.deterministic_reduction = absl::GetFlag(FLAGS_reduction) != "transport";
  c.data.synthetic = true;
  c.data.markov.seed = 7;
  c.data.markov.vocab_size = c.model.vocab_size;
  c.data.markov.alphabet_size = small ? 64 : 16;
  c.data.markov.branching = 4;
  c.data.synthetic_tokens = 200000;
  c.data.sample_seed = 11;
  c.validation_batches = absl::GetFlag(FLAGS_validation_batches);
  if (c.validation_batches > 0) c.data.held_out_fraction = 0.2;
  return c;
}

uint64_t Fnv(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

struct Comms {
  std::unique_ptr<cohort::comm::KvClient> kv;
  std::unique_ptr<cohort::comm::UcxContext> context;
  cohort::train::MeshCommunicators mesh;
};

absl::Status Connect(int rank, int size, const cohort::comm::MeshGroups& groups, Comms& comms) {
  auto file_kv = cohort::comm::FileKvClient::Create(absl::GetFlag(FLAGS_kv_dir));
  if (!file_kv.ok()) return file_kv.status();
  comms.kv = std::move(*file_kv);
  cohort::comm::UcxContextOptions options;
  options.rank = rank;
  options.size = size;
  options.kv = comms.kv.get();
  auto created = cohort::comm::UcxContext::Create(options);
  if (!created.ok()) return created.status();
  comms.context = std::move(*created);
  auto mesh = cohort::train::CreateMeshCommunicators(comms.context.get(), options, groups);
  if (!mesh.ok()) return mesh.status();
  comms.mesh = std::move(*mesh);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int size = absl::GetFlag(FLAGS_size);
  const int tp = absl::GetFlag(FLAGS_tp);
  const int pp = absl::GetFlag(FLAGS_pp);
  cohort::log::SetProcessTag("rank " + std::to_string(rank));
  if (size % (tp * pp) != 0) {
    LOG(ERROR) << "--size " << size << " is not a multiple of tp x pp = " << tp * pp;
    return 2;
  }
  const int micro_batches = absl::GetFlag(FLAGS_global_batch) / absl::GetFlag(FLAGS_micro_batch);
  const cohort::v1::Mesh mesh = cohort::train::LocalMesh(size / (tp * pp), tp, pp, micro_batches);
  auto groups = cohort::comm::ComputeMeshGroups(mesh, mesh.members(rank).coordinates());
  if (!groups.ok()) {
    LOG(ERROR) << groups.status();
    return 2;
  }
  Comms comms;
  if (size > 1) {
    if (absl::Status s = Connect(rank, size, *groups, comms); !s.ok()) {
      LOG(ERROR) << s;
      return 2;
    }
  }
  const cohort::model::ModelLayout layout =
      cohort::train::LayoutOf(mesh, mesh.members(rank).coordinates());
  cohort::train::TrainingSessionOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.collective_timeout = absl::Seconds(60);
  options.device_index = absl::GetFlag(FLAGS_device_index);
  if (absl::GetFlag(FLAGS_backend) == "guarded") {
    options.backend = std::make_shared<cohort::testing::GuardedBackend>(options.num_threads);
  }
  if (absl::GetFlag(FLAGS_tie_per_step)) options.tie_per_micro_batch = false;
  const std::string out = absl::GetFlag(FLAGS_out);
  if (absl::GetFlag(FLAGS_grads)) {
    options.gradient_observer = [out](const float* grads, size_t n, size_t begin, size_t end,
                                      cohort::Step step) {
      if (step.value() != 0) return;
      std::ofstream file(out + ".grads", std::ios::binary);
      const uint64_t range[2] = {begin, end};
      file.write(reinterpret_cast<const char*>(range), sizeof(range));
      file.write(reinterpret_cast<const char*>(grads),
                 static_cast<std::streamsize>(n * sizeof(float)));
    };
  }
  absl::StatusOr<TrainingConfig> config = TestConfig();
  if (!config.ok()) {
    LOG(ERROR) << config.status();
    return 2;
  }
  // The plan's split, as the worker takes it from its mesh.
  config->micro_batch_shares.assign(mesh.micro_batches().begin(), mesh.micro_batches().end());
  auto session =
      cohort::train::TrainingSession::Create(*config, layout, comms.mesh.groups(), options);
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
  if (config->validation_batches > 0) {
    absl::StatusOr<double> validation = (*session)->Validate();
    if (!validation.ok()) {
      LOG(ERROR) << "validation: " << validation.status();
      return 3;
    }
    char line[96];
    std::snprintf(line, sizeof(line), "validation %a\n", *validation);
    report += line;
  }
  cohort::model::GptModel& model = (*session)->model();
  const size_t bytes = model.num_params() * sizeof(float);
  absl::StrAppend(&report, "params ", Fnv(model.params(), bytes), "\n");
  std::ofstream(out) << report;
  std::ofstream(out + ".params", std::ios::binary)
      .write(reinterpret_cast<const char*>(model.params()), static_cast<std::streamsize>(bytes));
  return 0;
}
