#pragma once
// Runs every rank of a (dp, tp, pp) layout as a thread of this process, each
// with its data, tensor and pipeline groups on in-process communicators
// (thread_comms.h), and joins them. For tests of the training engine that
// compare layouts with one process without starting processes.

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "tests/testing/thread_comms.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::testing {

struct ThreadLayout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int world() const { return dp * tp * pp; }
  // Megatron's rank order: rank = (p * dp + d) * tp + t.
  int rank_of(int d, int t, int p) const { return (p * dp + d) * tp + t; }
};

// One rank's place: its coordinates, its Megatron rank, the model shard it
// holds and its groups (null where the layout's degree is 1).
struct ThreadRank {
  int d = 0;
  int t = 0;
  int p = 0;
  int rank = 0;
  model::ModelLayout model_layout;
  train::TrainingGroups groups;
};

// Calls `body` once per rank of `layout`, each on its own thread, and
// returns once every one has returned. `body` must not throw; a gtest
// ASSERT in it ends that rank's call only.
inline void RunRanksInThreads(const ThreadLayout& layout,
                              const std::function<void(const ThreadRank&)>& body) {
  std::vector<std::shared_ptr<ThreadGroup>> data(layout.tp * layout.pp),
      tensor(layout.dp * layout.pp), pipeline(layout.dp * layout.tp);
  for (auto& g : data) g = std::make_shared<ThreadGroup>(layout.dp);
  for (auto& g : tensor) g = std::make_shared<ThreadGroup>(layout.tp);
  for (auto& g : pipeline) g = std::make_shared<ThreadGroup>(layout.pp);
  std::vector<std::thread> threads;
  for (int p = 0; p < layout.pp; ++p) {
    for (int d = 0; d < layout.dp; ++d) {
      for (int t = 0; t < layout.tp; ++t) {
        threads.emplace_back([&, d, t, p] {
          ThreadCommunicator data_comm(data[p * layout.tp + t], d);
          ThreadCommunicator tensor_comm(tensor[p * layout.dp + d], t);
          ThreadCommunicator pipeline_comm(pipeline[d * layout.tp + t], p);
          ThreadRank rank;
          rank.d = d;
          rank.t = t;
          rank.p = p;
          rank.rank = layout.rank_of(d, t, p);
          rank.model_layout = {.tp = layout.tp, .tp_rank = t, .pp = layout.pp, .stage = p};
          rank.groups.data = layout.dp > 1 ? &data_comm : nullptr;
          rank.groups.tensor = layout.tp > 1 ? &tensor_comm : nullptr;
          rank.groups.pipeline = layout.pp > 1 ? &pipeline_comm : nullptr;
          body(rank);
        });
      }
    }
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace cohort::testing
