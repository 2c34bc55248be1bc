#pragma once
// Exports the model weights of a committed checkpoint ("param/*" tensors) as
// one safetensors file, unsharded whatever layout wrote it, in one of two
// layouts (docs/checkpoint-format.md):
//   kSafetensors: Cohort's: tensor names are the ParameterTable's ("wte",
//     "qkvw", ...) and shapes the logical global ones;
//   kHfGpt2: Hugging Face's GPT-2 (common/gpt2_hf_layout.h): per-layer
//     tensors, Conv1D weights transposed, wte without its padding rows, no
//     lm_head.weight (tied); needs the checkpoint's "model" object.
// One Cohort tensor at a time is assembled in memory from its chunks and
// written at its offset (for HF, layer by layer), so memory stays at the
// largest tensor (plus one layer's slice).
//
// Thread-compatible.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/checkpoint_client.h"
#include "cohort/v1/checkpoints.pb.h"

namespace cohort::cohortctl {

struct ExportProgress {
  int tensors_done = 0;
  int tensors = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes = 0;
};

enum class ExportFormat {
  kSafetensors,  // Cohort's layout
  kHfGpt2,       // Hugging Face's GPT-2 layout
};

// "safetensors" or "hf-gpt2" (cohortctl's --format).
const char* ExportFormatName(ExportFormat format);
// The inverse; InvalidArgument naming --format for another name.
absl::StatusOr<ExportFormat> ParseExportFormat(absl::string_view name);

struct ExportOptions {
  ExportFormat format = ExportFormat::kSafetensors;
  // Bound on each tensor's download.
  absl::Duration timeout = absl::Hours(1);
};

// Writes `path` (replacing it only when complete: a temporary file is
// renamed). `progress` (may be empty) is called after each Cohort tensor.
// Errors: FailedPrecondition when the checkpoint holds no weights or a dtype
// other than float32, and for kHfGpt2 when it records no model shape or lacks
// one of the model's tensors; InvalidArgument when a tensor's shape
// disagrees with the recorded model; the download's (DataLoss naming tensor
// and chunk); Internal for file errors, naming the path.
absl::Status ExportSafetensors(client::CheckpointClient& client,
                               const v1::CheckpointManifest& manifest, const std::string& path,
                               const ExportOptions& options,
                               const std::function<void(const ExportProgress&)>& progress);

}  // namespace cohort::cohortctl
