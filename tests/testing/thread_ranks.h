#pragma once
// Runs every rank of a mesh (data x tensor x pipeline) as a thread of this
// process, each with its data, tensor and pipeline groups on in-process
// communicators (thread_comms.h), and joins them. For tests of the training
// engine that compare layouts with one process without starting processes.

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/layout/mesh_layout.h"
#include "tests/testing/thread_comms.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::testing {

// One rank's place: its coordinates, its rank (layout::RankOf: Megatron's
// order), the model shard it holds and its groups (null where the mesh's
// degree is 1).
struct ThreadRank {
  layout::MeshCoords coords;
  int rank = 0;
  model::ModelLayout model_layout;
  train::TrainingGroups groups;
};

// Calls `body` once per rank of `shape`, each on its own thread, and returns
// once every one has returned. `body` must not throw; a gtest ASSERT in it
// ends that rank's call only.
inline void RunRanksInThreads(const layout::MeshShape& shape,
                              const std::function<void(const ThreadRank&)>& body) {
  const int dp = shape.data, tp = shape.tensor, pp = shape.pipeline;
  std::vector<std::shared_ptr<ThreadGroup>> data(tp * pp), tensor(dp * pp), pipeline(dp * tp);
  for (auto& g : data) g = std::make_shared<ThreadGroup>(dp);
  for (auto& g : tensor) g = std::make_shared<ThreadGroup>(tp);
  for (auto& g : pipeline) g = std::make_shared<ThreadGroup>(pp);
  std::vector<std::thread> threads;
  for (int p = 0; p < pp; ++p) {
    for (int d = 0; d < dp; ++d) {
      for (int t = 0; t < tp; ++t) {
        threads.emplace_back([&, d, t, p] {
          ThreadCommunicator data_comm(data[p * tp + t], d);
          ThreadCommunicator tensor_comm(tensor[p * dp + d], t);
          ThreadCommunicator pipeline_comm(pipeline[d * tp + t], p);
          ThreadRank rank;
          rank.coords = {.data = d, .tensor = t, .pipeline = p};
          rank.rank = layout::RankOf(shape, rank.coords);
          rank.model_layout = {.tp = tp, .tp_rank = t, .pp = pp, .stage = p};
          rank.groups.data = dp > 1 ? &data_comm : nullptr;
          rank.groups.tensor = tp > 1 ? &tensor_comm : nullptr;
          rank.groups.pipeline = pp > 1 ? &pipeline_comm : nullptr;
          body(rank);
        });
      }
    }
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace cohort::testing
