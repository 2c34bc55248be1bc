#pragma once
// Exports the model weights of a committed checkpoint ("param/*" tensors) as
// one safetensors file in the unsharded layout, whatever layout wrote it:
// tensor names are the ParameterTable's ("wte", "qkvw", ...) and shapes the
// logical global ones (docs/checkpoint-format.md). One tensor at a time is
// assembled in memory from its chunks and written at its offset, so memory
// stays at the largest tensor.
//
// Thread-compatible.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "cohort/v1/checkpoints.pb.h"
#include "client/checkpoint_client.h"

namespace cohort::cohortctl {

struct ExportProgress {
  int tensors_done = 0;
  int tensors = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes = 0;
};

// Writes `path` (replacing it only when complete: a temporary file is
// renamed). `progress` (may be empty) is called after each tensor. Errors:
// FailedPrecondition when the checkpoint holds no weights or a dtype other
// than float32; the download's (DataLoss naming tensor and chunk); Internal
// for file errors, naming the path.
absl::Status ExportSafetensors(client::CheckpointClient& client,
                               const v1::CheckpointManifest& manifest, const std::string& path,
                               absl::Duration timeout,
                               const std::function<void(const ExportProgress&)>& progress);

}  // namespace cohort::cohortctl
