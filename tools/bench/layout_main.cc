// cohort-bench-layout: GPT training step time, per-rank memory and the
// communication share of a step under (dp, tp, pp) layouts, every rank a
// separate process on this machine over UCX.
//
//   cohort-bench-layout [--model small|gpt2-124m] [--layouts 1x1x1,1x2x1,...]
//                       [--global_batch 8] [--micro_batch 2] [--warmup 1] [--steps 3]
//                       [--threads N] [--reduction deterministic|transport|both]
//
// Layouts are dp x tp x pp. Without --rank the binary is the launcher: for
// each layout it starts dp*tp*pp copies of itself (--rank r), each running a
// TrainingSession on the synthetic source, and prints one table row per
// layout:
//   step ms      median wall time of the timed steps (slowest rank)
//   tokens/s     global batch tokens / step time
//   tp comm %    time inside tensor-group collectives / step time (busiest rank)
//   pp wait %    time inside pipeline point-to-point calls and the stage
//                reductions / step time (the measured bubble plus transfers)
//   dp comm %    time inside data-group collectives / step time
//   dp MiB/step  bytes the busiest rank sends to its data group per step
//                (timed_communicator.h: point-to-point bytes, and ring
//                volumes for collectives)
//   bubble       the 1F1B bubble (p-1)/(m+p-1) for m micro-batches per data rank
//   CPU ms       CPU time (user + system, all threads) per timed step of the
//                busiest rank: about the step time with a core per thread,
//                which this machine may not have (dp 3 on 2 cores)
//   RSS MiB      resident set size of each rank after the timed steps (max, min)
// Threads: --threads (default: the machine's cores) are divided among the
// ranks, at least one each. --reduction both runs every layout with the
// deterministic reduction (data_parallel.h) and then the transport's, one
// row each, and prints the step-time ratio. Progress goes to stderr.

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/layout/mesh_layout.h"
#include "common/log.h"
#include "tools/bench/timed_communicator.h"
#include "worker/comm/file_kv_client.h"
#include "worker/comm/mesh_groups.h"
#include "worker/comm/ucx_context.h"
#include "worker/train/mesh_communicators.h"
#include "worker/train/training_session.h"

ABSL_FLAG(std::string, model, "small",
          "small (L4 NH4 C128 V512) or gpt2-124m (L12 NH12 C768 V50257)");
ABSL_FLAG(std::string, layouts, "1x1x1,1x2x1,1x1x2,1x2x2", "dp x tp x pp layouts, comma separated");
ABSL_FLAG(int, global_batch, 8, "sequences per step");
ABSL_FLAG(int, micro_batch, 2, "sequences per micro-batch");
ABSL_FLAG(int, seq, 64, "tokens per sequence (the model's context)");
ABSL_FLAG(int, warmup, 1, "untimed steps first");
ABSL_FLAG(int, steps, 3, "timed steps");
ABSL_FLAG(int, threads, 0, "threads shared by the ranks; 0 = the machine's cores");
ABSL_FLAG(bool, zero1, false, "shard the optimizer state over the data-parallel group");
ABSL_FLAG(bool, elastic, false,
          "keep what a peer recovery needs, as elastic jobs do: the previous step's state and "
          "(with --zero1) --optimizer_replicas copies of each optimizer shard");
ABSL_FLAG(int, optimizer_replicas, 2, "with --elastic and --zero1: copies of each optimizer shard");
ABSL_FLAG(std::string, reduction, "deterministic",
          "data-parallel sum order: deterministic (the fixed tree), transport (the "
          "communicator's), or both (a row each, same run)");
// Set by the launcher for each rank.
ABSL_FLAG(int, rank, -1, "internal: this process's rank");
ABSL_FLAG(std::string, layout, "", "internal: this rank's layout");
ABSL_FLAG(std::string, work_dir, "", "internal: KV directory and result files");

namespace cohort::bench {
namespace {

bool ParseLayout(const std::string& text, layout::MeshShape* out) {
  std::vector<std::string> parts = absl::StrSplit(text, 'x');
  return parts.size() == 3 && absl::SimpleAtoi(parts[0], &out->data) &&
         absl::SimpleAtoi(parts[1], &out->tensor) && absl::SimpleAtoi(parts[2], &out->pipeline) &&
         out->data > 0 && out->tensor > 0 && out->pipeline > 0;
}

int ThreadsPerRank(const layout::MeshShape& l) {
  int total = absl::GetFlag(FLAGS_threads);
  if (total <= 0) total = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, total / l.world());
}

// The job every layout trains, read as a worker reads a job
// (TrainingConfigFromSpec: the validator's rules and defaults).
absl::StatusOr<train::TrainingConfig> BenchConfig(const v1::Mesh& mesh) {
  const bool gpt2 = absl::GetFlag(FLAGS_model) == "gpt2-124m";
  v1::JobSpec spec;
  spec.set_name("bench-layout");
  v1::ModelConfig& model = *spec.mutable_model();
  model.set_layers(gpt2 ? 12 : 4);
  model.set_heads(gpt2 ? 12 : 4);
  model.set_width(gpt2 ? 768 : 128);
  model.set_vocab_size(gpt2 ? 50257 : 512);
  model.set_context_length(absl::GetFlag(FLAGS_seq));
  model.set_init_seed(42);
  spec.mutable_batch()->set_global_batch_size(absl::GetFlag(FLAGS_global_batch));
  spec.mutable_batch()->set_micro_batch_size(absl::GetFlag(FLAGS_micro_batch));
  spec.set_steps(absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_steps));
  spec.mutable_optimizer()->set_learning_rate(1e-4);
  spec.mutable_optimizer()->set_min_learning_rate(1e-5);
  spec.mutable_optimizer()->set_grad_clip(1.0);
  spec.mutable_data()->set_seed(11);
  v1::SyntheticSource& synthetic = *spec.mutable_data()->mutable_synthetic();
  synthetic.set_seed(7);
  synthetic.set_alphabet_size(64);
  synthetic.set_branching(4);
  synthetic.set_tokens(200000);
  spec.mutable_parallelism()->set_zero1(absl::GetFlag(FLAGS_zero1));
  spec.mutable_parallelism()->set_reduction(absl::GetFlag(FLAGS_reduction) == "transport"
                                                ? v1::ParallelismConfig::REDUCTION_TRANSPORT
                                                : v1::ParallelismConfig::REDUCTION_DETERMINISTIC);
  return train::TrainingConfigFromSpec(
      spec, std::vector<int>(mesh.micro_batches().begin(), mesh.micro_batches().end()));
}

double CpuMilliseconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(usage.ru_utime) + ms(usage.ru_stime);
}

double ResidentMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// One rank: trains and writes "step_ms rss_mib tp_ms pp_ms dp_ms" (per-step
// means of the communication times) to <work_dir>/rank<r>.txt.
int RunRank(int rank, const layout::MeshShape& l) {
  const std::string dir = absl::GetFlag(FLAGS_work_dir);
  log::SetProcessTag(absl::StrCat("rank ", rank));
  const int micro_batches = absl::GetFlag(FLAGS_global_batch) / absl::GetFlag(FLAGS_micro_batch);
  const v1::Mesh mesh = train::LocalMesh(l.data, l.tensor, l.pipeline, micro_batches);
  absl::StatusOr<comm::MeshGroups> groups =
      comm::ComputeMeshGroups(mesh, mesh.members(rank).coordinates());
  if (!groups.ok()) {
    LOG(ERROR) << groups.status();
    return 2;
  }
  std::unique_ptr<comm::KvClient> kv;
  std::unique_ptr<comm::UcxContext> context;
  train::MeshCommunicators comms;
  if (l.world() > 1) {
    auto file_kv = comm::FileKvClient::Create(dir + "/kv");
    if (!file_kv.ok()) {
      LOG(ERROR) << file_kv.status();
      return 2;
    }
    kv = std::move(*file_kv);
    comm::UcxContextOptions options;
    options.rank = rank;
    options.size = l.world();
    options.kv = kv.get();
    auto created = comm::UcxContext::Create(options);
    auto built = created.ok() ? train::CreateMeshCommunicators(created->get(), options, *groups)
                              : absl::StatusOr<train::MeshCommunicators>(created.status());
    if (!built.ok()) {
      LOG(ERROR) << built.status();
      return 2;
    }
    context = std::move(*created);
    comms = std::move(*built);
  }
  const train::TrainingGroups raw = comms.groups();
  std::unique_ptr<TimedCommunicator> timed[3];
  comm::Communicator* inner[3] = {raw.data, raw.tensor, raw.pipeline};
  train::TrainingGroups groups_timed;
  comm::Communicator** outer[3] = {&groups_timed.data, &groups_timed.tensor,
                                   &groups_timed.pipeline};
  for (int k = 0; k < 3; ++k) {
    if (inner[k] == nullptr) continue;
    timed[k] = std::make_unique<TimedCommunicator>(inner[k]);
    *outer[k] = timed[k].get();
  }
  train::TrainingSessionOptions options;
  options.num_threads = ThreadsPerRank(l);
  options.state_versions.keep_previous = absl::GetFlag(FLAGS_elastic);
  options.state_versions.optimizer_replicas =
      absl::GetFlag(FLAGS_elastic) ? absl::GetFlag(FLAGS_optimizer_replicas) : 1;
  absl::StatusOr<train::TrainingConfig> config = BenchConfig(mesh);
  if (!config.ok()) {
    LOG(ERROR) << config.status();
    return 2;
  }
  auto session = train::TrainingSession::Create(
      *config, train::LayoutOf(mesh, mesh.members(rank).coordinates()), groups_timed, options);
  if (!session.ok()) {
    LOG(ERROR) << session.status();
    return 2;
  }
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<double> step_ms;
  double cpu_start = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) {
      for (auto& t : timed) {
        if (t != nullptr) t->Reset();
      }
      cpu_start = CpuMilliseconds();
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<train::StepResult> result = (*session)->RunStep(Step(s));
    if (!result.ok()) {
      LOG(ERROR) << "step " << s << ": " << result.status();
      return 3;
    }
    if (s >= warmup) step_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    if (rank == 0) std::fprintf(stderr, "  step %d/%d loss %.4f\n", s + 1, warmup + steps,
                                result->loss);
  }
  std::sort(step_ms.begin(), step_ms.end());
  auto per_step = [&](const std::unique_ptr<TimedCommunicator>& t) {
    return t == nullptr ? 0.0 : absl::ToDoubleMilliseconds(t->elapsed()) / steps;
  };
  std::ofstream(absl::StrCat(dir, "/rank", rank, ".txt"))
      << step_ms[step_ms.size() / 2] << " " << ResidentMiB() << " " << per_step(timed[1]) << " "
      << per_step(timed[2]) << " " << per_step(timed[0]) << " "
      << (timed[0] == nullptr ? 0.0 : static_cast<double>(timed[0]->bytes_sent()) / steps)
      << " " << (CpuMilliseconds() - cpu_start) / steps << "\n";
  return 0;
}

// Starts the ranks of one layout with `reduction` and prints its row;
// returns the step time in ms, or a negative number if a rank failed.
double RunLayout(const std::string& text, const layout::MeshShape& l, const std::string& reduction,
                 char** argv) {
  char dir_template[] = "/tmp/cohort-bench-layout-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  std::vector<pid_t> pids;
  for (int r = 0; r < l.world(); ++r) {
    std::vector<std::string> args = {argv[0],
                                     absl::StrCat("--rank=", r),
                                     "--layout=" + text,
                                     "--work_dir=" + dir};
    args.push_back("--model=" + absl::GetFlag(FLAGS_model));
    args.push_back(absl::StrCat("--global_batch=", absl::GetFlag(FLAGS_global_batch)));
    args.push_back(absl::StrCat("--micro_batch=", absl::GetFlag(FLAGS_micro_batch)));
    args.push_back(absl::StrCat("--seq=", absl::GetFlag(FLAGS_seq)));
    args.push_back(absl::StrCat("--warmup=", absl::GetFlag(FLAGS_warmup)));
    args.push_back(absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps)));
    args.push_back(absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)));
    args.push_back(absl::StrCat("--zero1=", absl::GetFlag(FLAGS_zero1)));
    args.push_back(absl::StrCat("--elastic=", absl::GetFlag(FLAGS_elastic)));
    args.push_back(absl::StrCat("--optimizer_replicas=", absl::GetFlag(FLAGS_optimizer_replicas)));
    args.push_back("--reduction=" + reduction);
    std::vector<char*> c_args;
    for (std::string& a : args) c_args.push_back(a.data());
    c_args.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, c_args.data(), environ) != 0) {
      std::fprintf(stderr, "cannot start rank %d\n", r);
      for (pid_t p : pids) kill(p, SIGKILL);
      return -1;
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ok = false;
      // A failed rank leaves its peers waiting until their timeout: stop them.
      for (pid_t p : pids) kill(p, SIGKILL);
    }
  }
  if (!ok) {
    std::printf("| %s | %s | failed (see the ranks' stderr) |\n", text.c_str(), reduction.c_str());
    return -1;
  }
  double step = 0, tp = 0, pp = 0, dp = 0, dp_bytes = 0, cpu = 0, rss_max = 0, rss_min = 1e18;
  for (int r = 0; r < l.world(); ++r) {
    std::ifstream in(absl::StrCat(dir, "/rank", r, ".txt"));
    double s = 0, rss = 0, t = 0, p = 0, d = 0, b = 0, c = 0;
    in >> s >> rss >> t >> p >> d >> b >> c;
    cpu = std::max(cpu, c);
    step = std::max(step, s);
    tp = std::max(tp, t);
    pp = std::max(pp, p);
    dp = std::max(dp, d);
    dp_bytes = std::max(dp_bytes, b);
    rss_max = std::max(rss_max, rss);
    rss_min = std::min(rss_min, rss);
  }
  // The 1F1B bubble of the rank with the most micro-batches (shares are
  // uneven where dp does not divide them).
  const int micro_batches = absl::GetFlag(FLAGS_global_batch) / absl::GetFlag(FLAGS_micro_batch);
  const int m = (micro_batches + l.data - 1) / l.data;
  const double bubble = static_cast<double>(l.pipeline - 1) / (m + l.pipeline - 1);
  const double tokens = static_cast<double>(absl::GetFlag(FLAGS_global_batch)) *
                        absl::GetFlag(FLAGS_seq);
  std::printf("| (%d,%d,%d) | %s | %d | %d | %.1f | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f | "
              "%.1f | %.0f / %.0f |\n",
              l.data, l.tensor, l.pipeline, reduction.c_str(), l.world(), ThreadsPerRank(l), step,
              tokens / (step / 1000.0), 100 * tp / step, 100 * pp / step, 100 * dp / step,
              dp_bytes / (1 << 20), 100 * bubble, cpu, rss_max, rss_min);
  std::fflush(stdout);
  return step;
}

}  // namespace
}  // namespace cohort::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "cohort-bench-layout [--model small|gpt2-124m] [--layouts 1x1x1,1x2x1,...]");
  absl::ParseCommandLine(argc, argv);
  using cohort::layout::MeshShape;
  const int rank = absl::GetFlag(FLAGS_rank);
  if (rank >= 0) {
    MeshShape l;
    if (!cohort::bench::ParseLayout(absl::GetFlag(FLAGS_layout), &l)) return 2;
    return cohort::bench::RunRank(rank, l);
  }
  std::printf("model %s, batch %d x %d tokens, micro-batch %d, %d timed steps after %d warm-up%s%s\n\n",
              absl::GetFlag(FLAGS_model).c_str(), absl::GetFlag(FLAGS_global_batch),
              absl::GetFlag(FLAGS_seq), absl::GetFlag(FLAGS_micro_batch),
              absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_warmup),
              absl::GetFlag(FLAGS_zero1) ? ", ZeRO-1" : "",
              absl::GetFlag(FLAGS_elastic)
                  ? absl::StrCat(", elastic state (previous step kept, ",
                                 absl::GetFlag(FLAGS_optimizer_replicas),
                                 " optimizer shard copies)")
                        .c_str()
                  : "");
  const std::string reduction = absl::GetFlag(FLAGS_reduction);
  if (reduction != "deterministic" && reduction != "transport" && reduction != "both") {
    std::fprintf(stderr, "--reduction: '%s' is not deterministic, transport or both\n",
                 reduction.c_str());
    return 2;
  }
  std::printf("| (dp,tp,pp) | reduction | ranks | threads/rank | step ms | tokens/s | tp comm %% "
              "| pp wait %% | dp comm %% | dp MiB/step | 1F1B bubble %% | CPU ms | RSS MiB max / min "
              "|\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  bool ok = true;
  std::vector<std::string> ratios;
  const std::vector<std::string> layouts = absl::StrSplit(absl::GetFlag(FLAGS_layouts), ',');
  for (const std::string& text : layouts) {
    MeshShape l;
    if (!cohort::bench::ParseLayout(text, &l)) {
      std::fprintf(stderr, "--layouts: '%s' is not dp x tp x pp (e.g. 1x2x1)\n", text.c_str());
      return 2;
    }
    std::fprintf(stderr, "layout %s: %d ranks\n", text.c_str(), l.world());
    if (reduction != "both") {
      ok = cohort::bench::RunLayout(text, l, reduction, argv) >= 0 && ok;
      continue;
    }
    const double tree = cohort::bench::RunLayout(text, l, "deterministic", argv);
    const double transport = cohort::bench::RunLayout(text, l, "transport", argv);
    ok = tree >= 0 && transport >= 0 && ok;
    if (tree >= 0 && transport >= 0) {
      ratios.push_back(absl::StrFormat("(%d,%d,%d) %.3f", l.data, l.tensor, l.pipeline, tree / transport));
    }
  }
  if (!ratios.empty()) {
    std::printf("\ndeterministic / transport step time: %s\n", absl::StrJoin(ratios, ", ").c_str());
  }
  return ok ? 0 : 1;
}
