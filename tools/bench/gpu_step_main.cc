// cohort-bench-gpu: the time of one single-process GPT training step's forward
// and backward on a compute backend (the CUDA backend by default), one row per
// precision, with tokens/s, model TFLOP/s and MFU against the device's peak.
// tools/bench/torch_gpu_step.py measures the same step in PyTorch eager, and
// tools/gpu-check runs both on a GPU machine. (A little over the ~600 lines
// docs/conventions.md asks for: one benchmark's flags, model presets, timing
// and table, read top to bottom.)
//
//   cohort-bench-gpu [--backend cuda|cpu] [--precision fp32,tf32,bf16] [--model gpt2|d12|tiny]
//                    [--layers L --heads NH --width C --vocab V --context maxT]
//                    [--batch B] [--seq T] [--warmup 3] [--steps 10] [--device_index 0]
//                    [--peak_tflops 67,495,989] [--cuda_graphs=true|false] [--output table|json]
//
// What is timed: the whole single-process training step with the training
// state resident on the backend, as a one-rank GPU session runs it
// (StepRunner's device-resident step): the micro-batch's ZeroGrad, forward
// and backward as one unit (GptModel::TrainMicroBatch: the tokens uploaded
// from page-locked memory, the loss summed on the device; from the third
// step a replayed CUDA graph unless --cuda_graphs=false), then the gradient
// norm, clip to 1.0 and AdamW as backend ops (train::DeviceOptimizer, lr
// 6e-4, weight decay 0.1), ending with the host reading the loss sum and
// the norm in one wait. Tokens/s and MFU are of that step. A second run of
// --steps steps per row times the host-staged step the GPU path ran before
// (and a multi-rank GPU job still runs): the gradients copied to host memory,
// the clip and AdamW there, the weights uploaded before the next forward
// (columns "host-staged ms", median, and "host AdamW ms", the clip and
// update alone): what keeping the state on the device saves.
//
// Model FLOPs per token are 6 * num_params + 12 * layers * width * seq, the
// estimate of nanoGPT's estimate_mfu (PaLM, appendix B): 6N for the matmuls of
// forward and backward over every parameter (the padded LM head included, which
// the step does compute), and 12 L C T for attention's two products.
//
// Per row: the backend is created (a row whose backend cannot be created for
// want of a device, or of CUDA in this build, is skipped with the reason), the
// model built and initialised, --warmup untimed steps and --steps timed ones
// run on fixed random tokens. Progress goes to stderr, one line per step.
//
// Exit status: 0 every requested row ran; 3 some rows were skipped for lack of
// a device (none failed); 2 a bad flag value (the message names the flag;
// absl's own parser exits 1 for an unknown flag or a value of the wrong type,
// and after --help); 1 a row failed while it ran (model creation, a step, a
// backend error).

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "tools/bench/host_optimizer.h"
#include "worker/compute/attention_report.h"
#include "worker/compute/backend.h"
#include "worker/compute/backend_factory.h"
#include "worker/compute/capture_cache.h"
#include "worker/model/gpt_config.h"
#include "worker/model/gpt_model.h"
#include "worker/model/model_layout.h"
#include "worker/model/parameter_table.h"
#include "worker/train/device_optimizer.h"
#include "worker/train/grad_norm_plan.h"

#if COHORT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

ABSL_FLAG(std::string, backend, "cuda", "compute backend: cuda or cpu");
ABSL_FLAG(std::string, precision, "",
          "comma list of precisions, one table row each: fp32, tf32 and bf16 (CUDA only). "
          "Default: fp32,tf32,bf16 on cuda, fp32 on cpu");
ABSL_FLAG(std::string, model, "gpt2",
          "model preset: gpt2 (= d12, GPT-2 124M: layers 12, heads 12, width 768, vocab 50257 "
          "padded to 50304, context 1024) or tiny (layers 2, heads 4, width 128, vocab 512, "
          "context 64); --layers/--heads/--width/--vocab/--context override its fields");
ABSL_FLAG(int, layers, 0, "transformer blocks L; 0 = the --model preset's");
ABSL_FLAG(int, heads, 0, "attention heads NH (must divide --width); 0 = the preset's");
ABSL_FLAG(int, width, 0, "channels C; 0 = the preset's");
ABSL_FLAG(int, vocab, 0, "vocabulary V (padded up to a multiple of 128); 0 = the preset's");
ABSL_FLAG(int, context, 0, "context length maxT; 0 = the preset's");
ABSL_FLAG(int, batch, 0, "sequences per step B; 0 = 16 on cuda, 4 on cpu");
ABSL_FLAG(int, seq, 0, "tokens per sequence T, 1..context; 0 = the context length");
ABSL_FLAG(int, warmup, 3, "untimed steps first, per row (0..10000)");
ABSL_FLAG(int, steps, 10, "timed steps per row (1..10000)");
ABSL_FLAG(int, device_index, 0, "cuda: the device (cudaSetDevice index, >= 0)");
ABSL_FLAG(bool, cuda_graphs, true,
          "replay each micro-batch's forward and backward as a captured CUDA graph after the "
          "first two steps, as a worker's --cuda_graphs=auto does; false: one launch per op");
ABSL_FLAG(int, threads, 0, "cpu: OpenMP and OpenBLAS threads; 0 = OMP_NUM_THREADS or all cores");
ABSL_FLAG(std::string, peak_tflops, "",
          "the device's dense peak TFLOP/s for MFU, a comma list with one value per --precision "
          "(in its order). Default on cuda: the H100/H200 SXM datasheet numbers, dense (not "
          "the doubled ones with sparsity): fp32 67, tf32 495, bf16 989; override them for "
          "another device. "
          "Default on cpu: none (MFU n/a)");
ABSL_FLAG(std::string, output, "table", "table (markdown) or json");

namespace {

namespace compute = cohort::compute;
namespace model = cohort::model;
using Clock = std::chrono::steady_clock;

constexpr int kMaxStepCount = 10000;
constexpr char kTimedNote[] =
    "Timed: the whole step as a one-rank GPU job runs it, the state on the device: ZeroGrad + "
    "forward + backward (one captured CUDA graph, replayed, unless --cuda_graphs=false) + "
    "gradient norm, clip and AdamW as device ops, the host reading the loss and the norm in one "
    "wait. "
    "host-staged: a second run with the gradients copied to host memory, clip and AdamW there "
    "(host AdamW ms alone) and the weights uploaded before the next forward.";

struct BenchConfig {
  compute::BackendKind backend = compute::BackendKind::kCuda;
  std::vector<compute::Precision> precisions;
  std::vector<double> peak_tflops;  // one per precision; 0: unknown (MFU n/a)
  std::string model_name;
  model::GptConfig model;
  int batch = 0;
  int seq = 0;
  int warmup = 0;
  int steps = 0;
  int device_index = 0;
  int threads = 0;
  bool cuda_graphs = true;
  bool json = false;
};

enum class Outcome { kRan, kSkipped, kFailed };

struct RowResult {
  compute::Precision precision = compute::Precision::kFp32;
  Outcome outcome = Outcome::kRan;
  std::string reason;  // why the row was skipped or failed
  double median_ms = 0;
  double min_ms = 0;
  double full_step_ms = 0;  // median of the second run: the host-staged step
  double optimizer_ms = 0;  // median of its host clip and AdamW alone
  double tokens_per_s = 0;
  double model_tflops = 0;
  std::optional<double> mfu;           // fraction of the peak; none without a peak
  std::optional<double> peak_mem_gib;  // none where the backend cannot tell
  double first_loss = 0;
  double last_loss = 0;
  std::string attention;  // the attention implementation and why (attention_report.h)
  size_t graph_replays = 0;  // timed steps whose micro-batch ran as a replayed graph
};

int FlagError(const std::string& message) {
  std::fprintf(stderr, "cohort-bench-gpu: %s (see --help)\n", message.c_str());
  return 2;
}

const char* BackendName(compute::BackendKind kind) {
  return kind == compute::BackendKind::kCuda ? "cuda" : "cpu";
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// nanoGPT's estimate_mfu (PaLM appendix B): 6N for forward + backward over
// every parameter, 12 L C T for attention's QK^T and AV products.
double FlopsPerToken(const model::GptConfig& config, size_t num_params, int seq) {
  return 6.0 * static_cast<double>(num_params) +
         12.0 * config.layers * static_cast<double>(config.width) * seq;
}

// Device memory in use on the device (total - free), or none without a CUDA
// device or in a build without CUDA. A probe whose failure only means "n/a",
// so CUDA's error is cleared here rather than turned into a Status.
std::optional<size_t> DeviceBytesInUse(compute::BackendKind kind, int device_index) {
  if (kind != compute::BackendKind::kCuda) return std::nullopt;
#if COHORT_HAVE_CUDA
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  if (cudaSetDevice(device_index) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return total_bytes - free_bytes;
#else
  (void)device_index;
  return std::nullopt;
#endif
}

// ---- Flags -> BenchConfig ----

std::optional<model::GptConfig> ModelPreset(const std::string& name) {
  if (name == "gpt2" || name == "d12") {
    return model::GptConfig{
        .layers = 12, .heads = 12, .width = 768, .vocab_size = 50257, .context_length = 1024};
  }
  if (name == "tiny") {
    return model::GptConfig{
        .layers = 2, .heads = 4, .width = 128, .vocab_size = 512, .context_length = 64};
  }
  return std::nullopt;
}

// Applies one of --layers etc.: 0 keeps the preset's value.
absl::Status Override(const char* flag, int value, int* field) {
  if (value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be >= 0, got ", value));
  }
  if (value > 0) *field = value;
  return absl::OkStatus();
}

absl::Status ParsePrecisions(const std::string& list, compute::BackendKind backend,
                             std::vector<compute::Precision>* out) {
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    const std::optional<compute::Precision> parsed =
        compute::PrecisionFromName(std::string_view(name.data(), name.size()));
    if (!parsed.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--precision: unknown precision '", name, "' (fp32, tf32, bf16)"));
    }
    const compute::Precision precision = *parsed;
    if (backend == compute::BackendKind::kCpu && precision != compute::Precision::kFp32) {
      return absl::InvalidArgumentError(
          absl::StrCat("--precision ", name, ": the cpu backend computes in fp32 only"));
    }
    if (std::find(out->begin(), out->end(), precision) != out->end()) {
      return absl::InvalidArgumentError(absl::StrCat("--precision lists ", name, " twice"));
    }
    out->push_back(precision);
  }
  return absl::OkStatus();
}

absl::Status ParsePeaks(const std::string& list, const BenchConfig& bench,
                        std::vector<double>* out) {
  if (list.empty()) {
    for (compute::Precision precision : bench.precisions) {
      // H100/H200 SXM datasheet peaks, dense: fp32 on the CUDA cores, tf32
      // and bf16 on the tensor cores. The CPU has no default (MFU n/a).
      double peak = 0;
      if (bench.backend == compute::BackendKind::kCuda) {
        peak = precision == compute::Precision::kTf32   ? 495.0
               : precision == compute::Precision::kBf16 ? 989.0
                                                        : 67.0;
      }
      out->push_back(peak);
    }
    return absl::OkStatus();
  }
  const std::vector<std::string> cells = absl::StrSplit(list, ',');
  if (cells.size() != bench.precisions.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--peak_tflops has ", cells.size(), " values; --precision has ", bench.precisions.size()));
  }
  for (const std::string& cell : cells) {
    double peak = 0;
    if (!absl::SimpleAtod(cell, &peak) || !(peak > 0) || peak > 1e6) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peak_tflops: '", cell, "' is not a number in (0, 1e6]"));
    }
    out->push_back(peak);
  }
  return absl::OkStatus();
}

absl::Status CheckRange(const char* flag, int value, int low, int high) {
  if (value < low || value > high) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be in [", low, ", ", high, "], got ", value));
  }
  return absl::OkStatus();
}

absl::Status ParseFlags(BenchConfig* bench) {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "cuda") {
    bench->backend = compute::BackendKind::kCuda;
  } else if (backend == "cpu") {
    bench->backend = compute::BackendKind::kCpu;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend must be cuda or cpu, got '", backend, "'"));
  }
  const bool cuda = bench->backend == compute::BackendKind::kCuda;
  std::string precisions = absl::GetFlag(FLAGS_precision);
  if (precisions.empty()) precisions = cuda ? "fp32,tf32,bf16" : "fp32";
  if (absl::Status s = ParsePrecisions(precisions, bench->backend, &bench->precisions); !s.ok()) {
    return s;
  }
  if (absl::Status s = ParsePeaks(absl::GetFlag(FLAGS_peak_tflops), *bench, &bench->peak_tflops);
      !s.ok()) {
    return s;
  }

  bench->model_name = absl::GetFlag(FLAGS_model);
  std::optional<model::GptConfig> preset = ModelPreset(bench->model_name);
  if (!preset) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model must be gpt2, d12 or tiny, got '", bench->model_name, "'"));
  }
  bench->model = *preset;
  for (const auto& [flag, value, field] :
       {std::tuple{"layers", absl::GetFlag(FLAGS_layers), &bench->model.layers},
        std::tuple{"heads", absl::GetFlag(FLAGS_heads), &bench->model.heads},
        std::tuple{"width", absl::GetFlag(FLAGS_width), &bench->model.width},
        std::tuple{"vocab", absl::GetFlag(FLAGS_vocab), &bench->model.vocab_size},
        std::tuple{"context", absl::GetFlag(FLAGS_context), &bench->model.context_length}}) {
    if (absl::Status s = Override(flag, value, field); !s.ok()) return s;
  }
  if (absl::Status s = bench->model.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model with --layers/--heads/--width/--vocab/--context: ", s.message()));
  }

  const int context = bench->model.context_length;
  bench->batch = absl::GetFlag(FLAGS_batch);
  bench->seq = absl::GetFlag(FLAGS_seq);
  if (absl::Status s = CheckRange("batch", bench->batch, 0, 1 << 16); !s.ok()) return s;
  if (absl::Status s = CheckRange("seq", bench->seq, 0, context); !s.ok()) return s;
  if (bench->batch == 0) bench->batch = cuda ? 16 : 4;
  if (bench->seq == 0) bench->seq = context;
  if (static_cast<int64_t>(bench->batch) * bench->seq > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch x --seq (", bench->batch, " x ", bench->seq, ") must be under 2^31"));
  }
  bench->warmup = absl::GetFlag(FLAGS_warmup);
  bench->steps = absl::GetFlag(FLAGS_steps);
  bench->device_index = absl::GetFlag(FLAGS_device_index);
  bench->cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  bench->threads = absl::GetFlag(FLAGS_threads);
  if (absl::Status s = CheckRange("warmup", bench->warmup, 0, kMaxStepCount); !s.ok()) return s;
  if (absl::Status s = CheckRange("steps", bench->steps, 1, kMaxStepCount); !s.ok()) return s;
  if (absl::Status s = CheckRange("device_index", bench->device_index, 0, 1023); !s.ok()) return s;
  if (absl::Status s = CheckRange("threads", bench->threads, 0, 4096); !s.ok()) return s;

  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "table" && output != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--output must be table or json, got '", output, "'"));
  }
  bench->json = output == "json";
  return absl::OkStatus();
}

// ---- One row ----

// Whether a backend that could not be created is missing (no device, or no
// CUDA in this build: the row is skipped) rather than broken (it failed).
bool IsMissingDevice(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) || absl::IsUnimplemented(status);
}

RowResult RunRow(const BenchConfig& bench, size_t row) {
  RowResult result;
  result.precision = bench.precisions[row];
  const std::string label =
      absl::StrCat(BackendName(bench.backend), " ", compute::PrecisionName(result.precision));
  auto fail = [&](Outcome outcome, const absl::Status& status) {
    result.outcome = outcome;
    result.reason = status.ToString();
    std::fprintf(stderr, "cohort-bench-gpu: %s %s: %s\n", label.c_str(),
                 outcome == Outcome::kSkipped ? "skipped" : "failed", result.reason.c_str());
    return result;
  };

  // Memory in use before the backend exists (the CUDA context, other
  // processes), so the row reports what the backend and model added.
  const std::optional<size_t> base_bytes = DeviceBytesInUse(bench.backend, bench.device_index);
  absl::StatusOr<std::unique_ptr<compute::Backend>> backend =
      compute::CreateBackend(compute::BackendOptions{.kind = bench.backend,
                                                     .num_threads = bench.threads,
                                                     .precision = result.precision,
                                                     .device_index = bench.device_index});
  if (!backend.ok()) {
    return fail(IsMissingDevice(backend.status()) ? Outcome::kSkipped : Outcome::kFailed,
                backend.status());
  }
  absl::StatusOr<std::unique_ptr<model::GptModel>> created = model::GptModel::Create(
      bench.model, backend->get(), model::ModelOptions{.max_micro_batch = bench.batch});
  if (!created.ok()) return fail(Outcome::kFailed, created.status());
  model::GptModel& gpt = **created;
  if (const std::optional<compute::AttentionChoice> choice = compute::LatestAttentionChoice();
      choice.has_value() && bench.backend == compute::BackendKind::kCuda) {
    result.attention = absl::StrCat(compute::AttentionImplementationName(choice->implementation),
                                    " (", choice->reason, ")");
  } else {
    result.attention = "kernels";
  }
  std::fprintf(stderr, "cohort-bench-gpu: %s attention: %s\n", label.c_str(),
               result.attention.c_str());
  gpt.InitializeParameters(/*seed=*/1234);

  // A few fixed random batches, cycled: the data does not change the work.
  constexpr int kBatches = 4;
  const size_t tokens_per_batch = static_cast<size_t>(bench.batch) * bench.seq;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token(0, bench.model.vocab_size - 1);
  std::vector<int32_t> tokens(kBatches * 2 * tokens_per_batch);
  for (int32_t& t : tokens) t = token(rng);

  // ZeroGrad, forward and backward of step `step`'s batch: its loss.
  auto forward_backward = [&](int step) -> absl::StatusOr<double> {
    const int32_t* inputs = tokens.data() + (step % kBatches) * 2 * tokens_per_batch;
    gpt.ZeroGrad();
    absl::StatusOr<double> loss =
        gpt.Forward(inputs, inputs + tokens_per_batch, bench.batch, bench.seq);
    if (!loss.ok()) return loss.status();
    RETURN_IF_ERROR(gpt.Backward(1.0));
    return *loss;
  };
  auto ms_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };

  // The device-resident step: the optimizer's moments on the backend too.
  const cohort::train::GradNormPlan norm_plan(bench.model, gpt.table());
  absl::StatusOr<std::unique_ptr<cohort::train::DeviceOptimizer>> device_optimizer =
      cohort::train::DeviceOptimizer::Create(
          backend->get(), norm_plan, gpt.table(), 0, gpt.num_params(),
          {.adamw = {.weight_decay = 0.1},
           .grad_clip = cohort::bench::HostOptimizer::kGradClip});
  if (!device_optimizer.ok()) return fail(Outcome::kFailed, device_optimizer.status());
  (*device_optimizer)->ResetMoments();
  // bf16: the GEMMs read the weights' working copy, which ClipAdamW keeps.
  if (absl::Status attached = gpt.AttachWeightCopy(); !attached.ok()) {
    return fail(Outcome::kFailed, attached);
  }
  gpt.set_gradients_stay_on_backend(true);
  // As StepRunner's device-resident step: the tokens from page-locked
  // memory, the micro-batch's ops as one unit (GptModel::TrainMicroBatch:
  // replayed as a CUDA graph from the third step), its loss sum left on the
  // device and read with the norm in the step's one wait.
  absl::StatusOr<compute::Buffer> pinned_tokens =
      (*backend)->AllocateHost(compute::DType::kInt32, tokens.size());
  absl::StatusOr<compute::Buffer> loss_sum =
      (*backend)->Allocate(compute::DType::kFloat64, 1);
  absl::StatusOr<compute::Buffer> loss_sum_host =
      (*backend)->AllocateHost(compute::DType::kFloat64, 1);
  for (const absl::Status& s : {pinned_tokens.status(), loss_sum.status(), loss_sum_host.status()}) {
    if (!s.ok()) return fail(Outcome::kFailed, s);
  }
  std::copy(tokens.begin(), tokens.end(), static_cast<int32_t*>(pinned_tokens->data()));
  compute::CaptureCache graphs(backend->get(), bench.cuda_graphs,
                               "the benchmark's forward and backward");
  auto device_step = [&](int step) -> absl::StatusOr<double> {
    if (!gpt.staged()) {
      // A backend of host memory (the CPU) has no device-resident step
      // to mirror: the same ops, the loss read from the forward.
      ASSIGN_OR_RETURN(double loss, forward_backward(step));
      RETURN_IF_ERROR((*device_optimizer)
                          ->Enqueue(gpt.params_span(), gpt.grads_span(),
                                    cohort::bench::HostOptimizer::kLearningRate, step + 1));
      RETURN_IF_ERROR((*device_optimizer)->Norm().status());
      return loss;
    }
    const int32_t* inputs = static_cast<const int32_t*>(pinned_tokens->data()) +
                            (step % kBatches) * 2 * tokens_per_batch;
    RETURN_IF_ERROR(gpt.TrainMicroBatch({.slot = 0,
                                         .inputs = inputs,
                                         .targets = inputs + tokens_per_batch,
                                         .B = bench.batch,
                                         .T = bench.seq,
                                         .loss_scale = 1.0,
                                         .loss_sum = loss_sum->span()},
                                        &graphs));
    (*backend)->CopyToHostAsync(loss_sum_host->data(), loss_sum->span());
    RETURN_IF_ERROR((*device_optimizer)
                        ->Enqueue(gpt.params_span(), gpt.grads_span(),
                                  cohort::bench::HostOptimizer::kLearningRate, step + 1,
                                  loss_sum->span()));
    ASSIGN_OR_RETURN(double norm, (*device_optimizer)->Norm());
    if (!std::isfinite(norm)) {
      return absl::InternalError(absl::StrCat("non-finite gradient norm or loss (norm ", norm, ")"));
    }
    gpt.MarkParamsChangedOnBackend();
    return *static_cast<const double*>(loss_sum_host->data()) / static_cast<double>(tokens_per_batch);
  };

  std::vector<double> step_ms;
  size_t peak_bytes = 0;
  for (int step = 0; step < bench.warmup + bench.steps; ++step) {
    if (step == bench.warmup) result.graph_replays = graphs.replays();
    const Clock::time_point start = Clock::now();
    const absl::StatusOr<double> loss = device_step(step);
    if (!loss.ok()) return fail(Outcome::kFailed, loss.status());
    const double ms = ms_since(start);
    // After each step: the backend keeps its buffers and scratch between
    // calls, so the largest value seen is its high-water mark.
    if (std::optional<size_t> bytes = DeviceBytesInUse(bench.backend, bench.device_index)) {
      peak_bytes = std::max(peak_bytes, *bytes);
    }
    const bool timed = step >= bench.warmup;
    std::fprintf(stderr, "cohort-bench-gpu: %s %s %d/%d: %.2f ms, loss %.4f\n", label.c_str(),
                 timed ? "step" : "warmup", timed ? step - bench.warmup + 1 : step + 1,
                 timed ? bench.steps : bench.warmup, ms, *loss);
    if (step == 0) result.first_loss = *loss;
    result.last_loss = *loss;
    if (timed) step_ms.push_back(ms);
  }

  result.graph_replays = graphs.replays() - result.graph_replays;
  result.median_ms = Median(step_ms);
  result.min_ms = *std::min_element(step_ms.begin(), step_ms.end());

  // The host-staged step for contrast: the gradients to host memory, the
  // clip and AdamW over the host copies (gpt_model.h's staging), one warmup
  // step first. The weights continue from the device-resident run's.
  gpt.set_gradients_stay_on_backend(false);
  cohort::bench::HostOptimizer optimizer(gpt, bench.threads);
  std::vector<double> full_ms, optimizer_ms;
  for (int step = 0; step < 1 + bench.steps; ++step) {
    const Clock::time_point start = Clock::now();
    const absl::StatusOr<double> loss = forward_backward(step);
    if (!loss.ok()) return fail(Outcome::kFailed, loss.status());
    const Clock::time_point backward_done = Clock::now();
    if (absl::Status s = optimizer.Step(gpt, step + 1); !s.ok()) return fail(Outcome::kFailed, s);
    if (step == 0) continue;
    full_ms.push_back(ms_since(start));
    optimizer_ms.push_back(ms_since(backward_done));
    std::fprintf(stderr,
                 "cohort-bench-gpu: %s host-staged %d/%d: %.2f ms (host AdamW %.2f), loss %.4f\n",
                 label.c_str(), step, bench.steps, full_ms.back(), optimizer_ms.back(), *loss);
  }
  result.full_step_ms = Median(full_ms);
  result.optimizer_ms = Median(optimizer_ms);
  result.tokens_per_s = static_cast<double>(tokens_per_batch) / (result.median_ms / 1e3);
  result.model_tflops =
      FlopsPerToken(bench.model, gpt.num_params(), bench.seq) * result.tokens_per_s / 1e12;
  if (bench.peak_tflops[row] > 0) result.mfu = result.model_tflops / bench.peak_tflops[row];
  if (base_bytes && peak_bytes > 0) {
    result.peak_mem_gib =
        static_cast<double>(peak_bytes > *base_bytes ? peak_bytes - *base_bytes : 0) /
        (1024.0 * 1024.0 * 1024.0);
  }
  return result;
}

// ---- Output ----

std::string ModelDescription(const BenchConfig& bench) {
  const model::GptConfig& m = bench.model;
  return absl::StrFormat("L=%d NH=%d C=%d V=%d Vp=%d maxT=%d", m.layers, m.heads, m.width,
                         m.vocab_size, m.PaddedVocab(), m.context_length);
}

std::string OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kRan:
      return "ok";
    case Outcome::kSkipped:
      return "skipped";
    case Outcome::kFailed:
      return "failed";
  }
  return "unknown";
}

void PrintTable(const BenchConfig& bench, size_t num_params, const std::vector<RowResult>& rows) {
  std::printf("cohort-bench-gpu: %s (%s), %zu parameters, B=%d T=%d, %d warmup + %d timed steps\n",
              bench.model_name.c_str(), ModelDescription(bench).c_str(), num_params, bench.batch,
              bench.seq, bench.warmup, bench.steps);
  std::printf("Model FLOPs/token = 6 N + 12 L C T = %.4g (nanoGPT/PaLM estimate).\n",
              FlopsPerToken(bench.model, num_params, bench.seq));
  std::printf("%s\n\n", kTimedNote);
  std::printf(
      "| engine | precision | B x T | median ms | min ms | tokens/s | TFLOP/s | MFU | "
      "peak mem GiB | host-staged ms | host AdamW ms | status |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowResult& r = rows[i];
    const std::string engine = absl::StrCat("cohort ", BackendName(bench.backend));
    const char* precision = compute::PrecisionName(r.precision);
    const std::string shape = absl::StrCat(bench.batch, " x ", bench.seq);
    if (r.outcome != Outcome::kRan) {
      // A table cell cannot hold a '|' or a newline.
      std::string reason = r.reason;
      std::replace(reason.begin(), reason.end(), '|', '/');
      std::replace(reason.begin(), reason.end(), '\n', ' ');
      std::printf("| %s | %s | %s | - | - | - | - | - | - | - | - | %s: %s |\n", engine.c_str(),
                  precision, shape.c_str(), OutcomeName(r.outcome).c_str(), reason.c_str());
      continue;
    }
    const std::string mfu =
        r.mfu ? absl::StrFormat("%.1f%% of %g", 100 * *r.mfu, bench.peak_tflops[i]) : "n/a";
    const std::string mem = r.peak_mem_gib ? absl::StrFormat("%.2f", *r.peak_mem_gib) : "n/a";
    std::printf("| %s | %s | %s | %.2f | %.2f | %.0f | %.3g | %s | %s | %.2f | %.2f | ok |\n",
                engine.c_str(), precision, shape.c_str(), r.median_ms, r.min_ms, r.tokens_per_s,
                r.model_tflops, mfu.c_str(), mem.c_str(), r.full_step_ms, r.optimizer_ms);
  }
  std::printf("\n");
  for (const RowResult& r : rows) {
    if (r.outcome != Outcome::kRan) continue;
    std::printf("%s: attention %s; CUDA graphs replayed in %zu of %d timed steps%s\n",
                compute::PrecisionName(r.precision), r.attention.c_str(), r.graph_replays,
                bench.steps, bench.cuda_graphs ? "" : " (--cuda_graphs=false)");
  }
}

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, c));
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", c));
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

std::string JsonNumber(std::optional<double> value) {
  return value ? absl::StrFormat("%.6g", *value) : "null";
}

void PrintJson(const BenchConfig& bench, size_t num_params, const std::vector<RowResult>& rows) {
  std::vector<std::string> cells;
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowResult& r = rows[i];
    const bool ran = r.outcome == Outcome::kRan;
    auto if_ran = [ran](double v) { return ran ? std::optional<double>(v) : std::nullopt; };
    cells.push_back(absl::StrCat(
        "{\"engine\": ", JsonString(absl::StrCat("cohort ", BackendName(bench.backend))),
        ", \"precision\": ", JsonString(compute::PrecisionName(r.precision)), ", \"status\": ",
        JsonString(OutcomeName(r.outcome)), ", \"reason\": ", JsonString(r.reason),
        ", \"median_ms\": ", JsonNumber(if_ran(r.median_ms)), ", \"min_ms\": ",
        JsonNumber(if_ran(r.min_ms)), ", \"full_step_ms\": ", JsonNumber(if_ran(r.full_step_ms)),
        ", \"optimizer_ms\": ", JsonNumber(if_ran(r.optimizer_ms)),
        ", \"tokens_per_s\": ", JsonNumber(if_ran(r.tokens_per_s)),
        ", \"model_tflops\": ", JsonNumber(if_ran(r.model_tflops)), ", \"peak_tflops\": ",
        JsonNumber(bench.peak_tflops[i] > 0 ? std::optional<double>(bench.peak_tflops[i])
                                            : std::nullopt),
        ", \"mfu\": ", JsonNumber(r.mfu), ", \"peak_mem_gib\": ", JsonNumber(r.peak_mem_gib),
        ", \"first_loss\": ", JsonNumber(if_ran(r.first_loss)),
        ", \"last_loss\": ", JsonNumber(if_ran(r.last_loss)),
        ", \"attention\": ", JsonString(r.attention),
        ", \"graph_replays\": ", ran ? absl::StrCat(r.graph_replays) : "null", "}"));
  }
  std::printf(
      "{\"model\": %s, \"shape\": %s, \"num_params\": %zu, \"batch\": %d, \"seq\": %d, "
      "\"warmup\": %d, \"steps\": %d, \"flops_per_token\": %.6g, \"timed\": %s,\n \"rows\": "
      "[\n  %s]}\n",
      JsonString(bench.model_name).c_str(), JsonString(ModelDescription(bench)).c_str(), num_params,
      bench.batch, bench.seq, bench.warmup, bench.steps,
      FlopsPerToken(bench.model, num_params, bench.seq), JsonString(kTimedNote).c_str(),
      absl::StrJoin(cells, ",\n  ").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // absl's --help lists only flags of files named after the program; ours
  // live in gpu_step_main.cc.
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "tools/bench/gpu_step_main.cc");
  };
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(
      "Times one single-process GPT training step (forward + backward + gradient norm, clip\n"
      "and AdamW, the state resident on the backend) on a compute backend, one markdown table\n"
      "row per precision (median and min step ms, tokens/s, model TFLOP/s, MFU against\n"
      "--peak_tflops, peak device memory), and the host-staged step for contrast. Progress\n"
      "goes to stderr.\n"
      "  cohort-bench-gpu [--backend cuda|cpu] [--precision fp32,tf32,bf16] [--model "
      "gpt2|d12|tiny]\n"
      "      [--batch B] [--seq T] [--warmup 3] [--steps 10] [--peak_tflops 67,495,989]\n"
      "      [--output table|json]\n"
      "Model FLOPs per token: 6 N + 12 L C T (nanoGPT's estimate_mfu, after PaLM).\n"
      "Exit status: 0 every requested row ran; 3 some rows were skipped for lack of a device\n"
      "(no CUDA device, or no CUDA in this build) and none failed; 2 a bad flag value (absl's\n"
      "parser itself exits 1 for an unknown flag or a value of the wrong type, and after\n"
      "--help); 1 a row failed while it ran.");
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    return FlagError(absl::StrCat("unexpected argument '", positional[1], "'"));
  }
  BenchConfig bench;
  if (absl::Status s = ParseFlags(&bench); !s.ok()) return FlagError(std::string(s.message()));

  std::vector<RowResult> rows;
  for (size_t row = 0; row < bench.precisions.size(); ++row) rows.push_back(RunRow(bench, row));

  // The parameter count from the layout, not from a model a row built: it is
  // known even when every row was skipped.
  const size_t num_params = model::ParameterTable(bench.model).num_params();
  if (bench.json) {
    PrintJson(bench, num_params, rows);
  } else {
    PrintTable(bench, num_params, rows);
  }
  std::fflush(stdout);

  const auto any = [&](Outcome outcome) {
    return std::any_of(rows.begin(), rows.end(),
                       [outcome](const RowResult& r) { return r.outcome == outcome; });
  };
  if (any(Outcome::kFailed)) return 1;
  if (any(Outcome::kSkipped)) return 3;
  return 0;
}
