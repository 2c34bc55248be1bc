#pragma once
// Checkpoints with known contents, for the integration tests: the state of
// a small GPT whose every value is a function of (step, kind, tensor,
// element), uploaded by `dp` writers (a dp x 1 x 1 layout) through a real
// CheckpointClient, and a check of downloaded chunks against those values.

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/checkpoint_client.h"
#include "common/box.h"
#include "common/box_proto.h"
#include "worker/checkpoint/checkpoint_writer.h"

namespace cohort::testing {

inline const model::GptConfig kSyntheticModel{
    .layers = 2, .heads = 4, .width = 64, .vocab_size = 256, .context_length = 64};

// Element i of parameter tensor `id` under state `kind` (0 weights, 1 and 2
// the AdamW moments) in the checkpoint of `step`.
inline float SyntheticValue(int64_t step, int kind, int id, size_t i) {
  uint64_t h = ((static_cast<uint64_t>(step) * 7919u + static_cast<uint64_t>(kind)) * 104729u +
                static_cast<uint64_t>(id)) * 2654435761u + i;
  h ^= h >> 31;
  h *= 0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  return static_cast<float>(h % 1000003) * 1e-3f;
}

// The whole model's three arenas for `step` (every dp rank holds them all).
struct SyntheticState {
  std::vector<float> params, m, v;
};
inline SyntheticState MakeSyntheticState(const model::ParameterTable& table, int64_t step) {
  SyntheticState s;
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<float>& out = kind == 0 ? s.params : kind == 1 ? s.m : s.v;
    out.resize(table.num_params());
    for (const model::ParameterInfo& info : table.tensors()) {
      for (size_t i = 0; i < info.numel; ++i) {
        out[info.offset + i] = SyntheticValue(step, kind, info.id, i);
      }
    }
  }
  return s;
}

struct SyntheticUpload {
  bool all_ok = true;
  bool committed = false;
  absl::Status first_error;
};

// Uploads checkpoint `step` of job `job_id` at `generation` from `dp`
// writers at once. `on_result` (may be empty) sees each writer's result.
inline SyntheticUpload UploadSynthetic(
    client::CheckpointClient* client, const std::string& job_id, uint64_t generation,
    int64_t step, int dp, std::function<void(const checkpoint::UploadResult&)> on_result = {}) {
  const model::ParameterTable table(kSyntheticModel);
  const SyntheticState state = MakeSyntheticState(table, step);
  std::vector<std::unique_ptr<checkpoint::CheckpointWriter>> writers;
  for (int r = 0; r < dp; ++r) {
    checkpoint::CheckpointWriterOptions options;
    options.job_id = job_id;
    options.generation = Generation(generation);
    options.writer = static_cast<uint32_t>(r);
    options.position = {{.data = dp}, {.data = r}};
    options.max_chunk_elements = 8192;
    options.upload_timeout = absl::Seconds(10);
    options.busy_retries = 0;
    options.on_result = on_result;
    writers.push_back(
        std::make_unique<checkpoint::CheckpointWriter>(client, kSyntheticModel, table, options));
    (void)writers.back()->Save(Step(step), {state.params.data(), state.m.data(), state.v.data(),
                                      {0, table.num_params()}});
  }
  SyntheticUpload result;
  for (auto& w : writers) {
    const checkpoint::UploadResult r = w->Wait();
    if (!r.status.ok() && result.all_ok) result.first_error = r.status;
    result.all_ok = result.all_ok && r.status.ok();
    result.committed = result.committed || r.committed;
  }
  return result;
}

// Whether a downloaded chunk of `tensor` holds the values of `step`.
inline absl::Status CheckSyntheticChunk(int64_t step, const std::string& tensor,
                                        const v1::ChunkInfo& info, std::string_view bytes) {
  static const model::ParameterTable whole(kSyntheticModel);
  const int kind = tensor.rfind("param/", 0) == 0 ? 0 : tensor.rfind("adam_m/", 0) == 0 ? 1 : 2;
  const model::ParameterInfo* p = whole.Find(tensor.substr(tensor.find('/') + 1));
  if (p == nullptr) return absl::NotFoundError(absl::StrCat("unknown tensor ", tensor));
  const Box box = BoxFromProto(info.box());
  const Box full = WholeBox(p->global_shape);
  std::vector<int64_t> point = box.start;
  const char* values = bytes.data();
  for (int64_t k = 0; k < box.NumElements(); ++k) {
    const float expected =
        SyntheticValue(step, kind, p->id, static_cast<size_t>(FlatIndexIn(full, point)));
    if (std::memcmp(values + 4 * k, &expected, 4) != 0) {
      return absl::DataLossError(
          absl::StrCat(tensor, " chunk ", info.index(), " holds a wrong value at ", k));
    }
    for (int d = box.rank() - 1; d >= 0; --d) {
      if (++point[d] < box.start[d] + box.extent[d]) break;
      point[d] = box.start[d];
    }
  }
  return absl::OkStatus();
}

}  // namespace cohort::testing
