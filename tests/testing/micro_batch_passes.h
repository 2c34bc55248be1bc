#pragma once
// A model trained pass by pass the way the device-resident step does
// (GptModel::TrainMicroBatch through a compute::CaptureCache), without the
// session around it: for the tests that compare captured replays with the
// same passes issued directly, on the guarded backend and on a GPU.
//
// Header-only.

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "worker/compute/backend.h"
#include "worker/compute/capture_cache.h"
#include "worker/model/gpt_model.h"

namespace cohort::testing {

struct MicroBatchPasses {
  compute::Backend* backend = nullptr;
  std::unique_ptr<model::GptModel> model;
  std::unique_ptr<compute::CaptureCache> graphs;
  compute::Buffer loss_sum;  // one float64, backend memory
  compute::Buffer tokens;    // inputs then targets, AllocateHost memory

  // A model of `config` for micro-batches up to `max_batch`, weights from
  // `seed`, its passes captured where `capture`.
  absl::Status Init(compute::Backend* on, const model::GptConfig& config, int max_batch,
                    bool capture, uint64_t seed = 11) {
    backend = on;
    ASSIGN_OR_RETURN(model,
                     model::GptModel::Create(config, backend,
                                             model::ModelOptions{.max_micro_batch = max_batch}));
    model->InitializeParameters(seed);
    model->set_gradients_stay_on_backend(true);
    RETURN_IF_ERROR(model->AttachWeightCopy());
    graphs = std::make_unique<compute::CaptureCache>(backend, capture, "a test's pass");
    ASSIGN_OR_RETURN(loss_sum, backend->Allocate(compute::DType::kFloat64, 1));
    ASSIGN_OR_RETURN(
        tokens, backend->AllocateHost(compute::DType::kInt32,
                                      2 * static_cast<size_t>(max_batch) * config.context_length));
    return absl::OkStatus();
  }

  // One micro-batch of (B, T) on `ids` (2*B*T: inputs then targets), then
  // the wait a step ends with. Returns the loss sum.
  absl::StatusOr<double> Pass(const std::vector<int32_t>& ids, int B, int T, double loss_scale) {
    const size_t n = static_cast<size_t>(B) * T;
    std::memcpy(tokens.data(), ids.data(), 2 * n * sizeof(int32_t));
    const auto* host = static_cast<const int32_t*>(tokens.data());
    RETURN_IF_ERROR(model->TrainMicroBatch(model::MicroBatchPass{.slot = 0,
                                                                 .inputs = host,
                                                                 .targets = host + n,
                                                                 .B = B,
                                                                 .T = T,
                                                                 .loss_scale = loss_scale,
                                                                 .loss_sum = loss_sum.span()},
                                           graphs.get()));
    RETURN_IF_ERROR(backend->Synchronize());
    double sum = 0.0;
    backend->CopyToHost(&sum, loss_sum.span());
    return sum;
  }

  // The gradients and the embedding's part, downloaded.
  std::vector<float> Grads() const {
    std::vector<float> host(model->num_params() + model->embedding_grad_span().numel);
    backend->CopyToHost(host.data(), model->grads_span());
    backend->CopyToHost(host.data() + model->num_params(), model->embedding_grad_span());
    return host;
  }
};

// 2*B*T token ids below `vocab` from `seed`.
inline std::vector<int32_t> RandomTokens(int vocab, int B, int T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(2 * static_cast<size_t>(B) * T);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

}  // namespace cohort::testing
