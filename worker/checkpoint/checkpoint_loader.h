#pragma once
// LoadCheckpoint: restores one rank's training state from a committed
// checkpoint written in any layout. The rank's needs (every weight of its
// shard, the AdamW moments of its optimizer range; shard_plan.h PlanLoad)
// are boxes of the global tensors; the chunks that overlap them, and only
// those, are downloaded, verified, and their overlaps copied into place (box
// intersection). The chunks are dealt over several concurrent streams (the
// largest first, to the stream with the fewest bytes): the coordinator reads
// a chunk from disk for one stream while another's is on the wire.
//
// Thread-compatible.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cohort/v1/checkpoints.pb.h"
#include "client/checkpoint_client.h"
#include "worker/checkpoint/shard_plan.h"

namespace cohort::checkpoint {

// Where the state goes: the weights arena (num_params floats) and the
// moments of [optimizer.begin, optimizer.end).
struct StateBuffers {
  float* params = nullptr;
  float* adam_m = nullptr;
  float* adam_v = nullptr;
  ArenaRange optimizer;
  // The part of the weights arena to load; the rest is left as it is (the
  // data ranks of a shard each load a part and all-gather the weights).
  ArenaRange weights{0, SIZE_MAX};
};

struct LoadStats {
  int64_t chunks = 0;  // downloaded
  int64_t chunks_in_place = 0;  // of those, received straight into the state buffers
  uint64_t bytes = 0;  // downloaded
  absl::Duration duration;
};

// Fills `buffers` from checkpoint `manifest` of `config`'s model. Errors:
// FailedPrecondition when the checkpoint is of another model (the message
// names the tensor or the model fingerprints); DataLoss when a chunk is
// corrupt (naming tensor and chunk) or the chunks leave part of the state
// uncovered; the client's errors (of the first stream that failed). After an
// error the buffers hold a partial state, not to be trained on. `streams` is
// clamped to [1, chunks]. A stream the coordinator refuses as busy
// (ResourceExhausted: --max_checkpoint_downloads) before its first chunk is
// tried again with backoff until `timeout`.
// Download streams of a load unless told otherwise: for GPT-2 124M (dp 2,
// page cache dropped, `tools/dev bench recovery`, case checkpoint) four gave
// 0.41-0.45x of a cold dd read where one gave 0.23-0.49x.
inline constexpr int kDefaultLoadStreams = 4;

absl::Status LoadCheckpoint(client::CheckpointClient* client, const v1::CheckpointManifest& manifest,
                            const model::GptConfig& config, const model::ParameterTable& table,
                            const StateBuffers& buffers, absl::Duration timeout,
                            LoadStats* stats = nullptr, int streams = kDefaultLoadStreams);

}  // namespace cohort::checkpoint
