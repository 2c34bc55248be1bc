#pragma once
// Which attention implementation the process's GPU backend runs, and why:
// recorded by the CUDA backend when it decides (at ReserveScratch), logged
// once per distinct choice, and read by the worker's metrics
// (cohort_worker_attention_implementation, docs/metrics.md). Process-wide,
// like the cuDNN library it reports on.
//
// Thread-safe.

#include <optional>
#include <string>
#include <string_view>

namespace cohort::compute {

enum class AttentionImplementation { kKernels, kCudnn };
const char* AttentionImplementationName(AttentionImplementation implementation);  // "kernels", "cudnn"

struct AttentionChoice {
  AttentionImplementation implementation = AttentionImplementation::kKernels;
  std::string reason;  // why (the fallback's cause, or the cuDNN version used)
};

// Records the latest choice; logs it when it differs from the last logged
// (a warning for a fallback from cuDNN, info otherwise).
void ReportAttentionChoice(const AttentionChoice& choice, bool fallback);
// The latest choice; nullopt before any GPU backend decided.
std::optional<AttentionChoice> LatestAttentionChoice();

}  // namespace cohort::compute
