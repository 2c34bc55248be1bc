#pragma once
// In-process communicators for tests that run several ranks as threads of
// one process: ThreadGroup is one group's rendezvous (every collective is an
// exchange of each rank's contribution; point-to-point messages go through
// mailboxes), ThreadCommunicator one rank's Communicator on it, and
// ThreadMesh an EngineTrainer CommsFactory handing each generation's
// participants communicators on shared groups (worker/engine/generation_comms.h).
// Correct, not fast: every collective copies every contribution.
//
// Thread-safe. Abort ends this rank's calls (Aborted); a peer of an aborted
// rank waits for its timeout, as over a real transport.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/mesh_groups.h"
#include "worker/engine/generation_comms.h"

namespace cohort::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), next_round_(static_cast<size_t>(size), 0) {}
  int size() const { return size_; }

  // Every rank's contribution, once all `size` ranks of the same round have
  // given theirs. DeadlineExceeded after `timeout`; Aborted when `aborted`
  // (checked while waiting) becomes true.
  absl::StatusOr<std::vector<std::string>> Exchange(int rank, std::string contribution,
                                                    absl::Duration timeout,
                                                    const bool* aborted) {
    absl::MutexLock lock(&mu_);
    const uint64_t r = next_round_[static_cast<size_t>(rank)]++;
    Round& round = rounds_[r];
    round.parts.resize(static_cast<size_t>(size_));
    round.parts[static_cast<size_t>(rank)] = std::move(contribution);
    ++round.arrived;
    auto done = [&] { return rounds_[r].arrived == size_ || *aborted; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("rank ", rank, ": a peer never arrived"));
    }
    if (*aborted) return absl::AbortedError("communicator aborted");
    std::vector<std::string> parts = rounds_[r].parts;
    if (++rounds_[r].taken == size_) rounds_.erase(r);
    return parts;
  }

  void Post(int from, int to, uint32_t tag, std::string message) {
    absl::MutexLock lock(&mu_);
    boxes_[{from, to, tag}].push_back(std::move(message));
  }

  absl::StatusOr<std::string> Take(int from, int to, uint32_t tag, absl::Duration timeout,
                                   const bool* aborted) {
    absl::MutexLock lock(&mu_);
    const auto key = std::make_tuple(from, to, tag);
    auto ready = [&] { return !boxes_[key].empty() || *aborted; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("no message from rank ", from));
    }
    if (*aborted) return absl::AbortedError("communicator aborted");
    std::string message = std::move(boxes_[key].front());
    boxes_[key].pop_front();
    return message;
  }

  // Guards the `aborted` flags the waits above read: setting one under it
  // re-evaluates their conditions as it unlocks.
  absl::Mutex* mu() { return &mu_; }

 private:
  struct Round {
    std::vector<std::string> parts;
    int arrived = 0;
    int taken = 0;
  };
  const int size_;
  absl::Mutex mu_;
  std::vector<uint64_t> next_round_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Round> rounds_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<int, int, uint32_t>, std::deque<std::string>> boxes_ ABSL_GUARDED_BY(mu_);
};

class ThreadCommunicator : public comm::Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  absl::Status AllReduce(void* data, size_t count, comm::DataType type, comm::ReduceOp op,
                         absl::Duration timeout) override {
    const size_t bytes = count * comm::DataTypeSize(type);
    absl::StatusOr<std::vector<std::string>> parts = Exchange(data, bytes, timeout);
    if (!parts.ok()) return parts.status();
    return Reduce(*parts, 0, count, type, op, data);
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank,
                             comm::DataType type, comm::ReduceOp op,
                             absl::Duration timeout) override {
    const size_t bytes = count_per_rank * comm::DataTypeSize(type);
    absl::StatusOr<std::vector<std::string>> parts =
        Exchange(input, bytes * static_cast<size_t>(size()), timeout);
    if (!parts.ok()) return parts.status();
    return Reduce(*parts, static_cast<size_t>(rank_) * count_per_rank, count_per_rank, type, op,
                  output);
  }
  absl::Status AllGather(const void* input, void* output, size_t count_per_rank,
                         comm::DataType type, absl::Duration timeout) override {
    const size_t bytes = count_per_rank * comm::DataTypeSize(type);
    absl::StatusOr<std::vector<std::string>> parts = Exchange(input, bytes, timeout);
    if (!parts.ok()) return parts.status();
    for (size_t r = 0; r < parts->size(); ++r) {
      std::memcpy(static_cast<char*>(output) + r * bytes, (*parts)[r].data(), bytes);
    }
    return absl::OkStatus();
  }
  absl::Status Broadcast(void* data, size_t count, comm::DataType type, int root,
                         absl::Duration timeout) override {
    const size_t bytes = count * comm::DataTypeSize(type);
    absl::StatusOr<std::vector<std::string>> parts = Exchange(data, bytes, timeout);
    if (!parts.ok()) return parts.status();
    std::memcpy(data, (*parts)[static_cast<size_t>(root)].data(), bytes);
    return absl::OkStatus();
  }
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration) override {
    if (Aborted()) return absl::AbortedError("communicator aborted");
    group_->Post(rank_, peer, tag, std::string(static_cast<const char*>(data), bytes));
    return absl::OkStatus();
  }
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Duration timeout) override {
    absl::StatusOr<std::string> message = group_->Take(peer, rank_, tag, timeout, &aborted_);
    if (!message.ok()) return message.status();
    if (message->size() != bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a message of ", message->size(), " bytes, expected ", bytes));
    }
    std::memcpy(data, message->data(), bytes);
    return absl::OkStatus();
  }
  absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                        size_t recv_bytes, int recv_peer, uint32_t tag,
                        absl::Duration timeout) override {
    if (absl::Status s = Send(send_data, send_bytes, send_peer, tag, timeout); !s.ok()) return s;
    return Recv(recv_data, recv_bytes, recv_peer, tag, timeout);
  }
  absl::Status Barrier(absl::Duration timeout) override {
    return Exchange(nullptr, 0, timeout).status();
  }
  void Abort(const absl::Status&) override {
    absl::MutexLock lock(group_->mu());
    aborted_ = true;
  }

 private:
  bool Aborted() {
    absl::MutexLock lock(group_->mu());
    return aborted_;
  }
  absl::StatusOr<std::vector<std::string>> Exchange(const void* data, size_t bytes,
                                                    absl::Duration timeout) {
    return group_->Exchange(rank_, std::string(static_cast<const char*>(data), bytes), timeout,
                            &aborted_);
  }
  // `out` = the reduction of elements [first, first + count) of every part,
  // summed in rank order.
  static absl::Status Reduce(const std::vector<std::string>& parts, size_t first, size_t count,
                             comm::DataType type, comm::ReduceOp op, void* out) {
    switch (type) {
      case comm::DataType::kFloat32: return ReduceAs<float>(parts, first, count, op, out);
      case comm::DataType::kFloat64: return ReduceAs<double>(parts, first, count, op, out);
      case comm::DataType::kInt32: return ReduceAs<int32_t>(parts, first, count, op, out);
      case comm::DataType::kInt64: return ReduceAs<int64_t>(parts, first, count, op, out);
      default:
        return absl::UnimplementedError(
            absl::StrCat("no reduction of ", comm::DataTypeName(type), " in this test"));
    }
  }
  template <typename T>
  static absl::Status ReduceAs(const std::vector<std::string>& parts, size_t first, size_t count,
                               comm::ReduceOp op, void* out) {
    std::vector<T> acc(count);
    std::memcpy(acc.data(), parts[0].data() + first * sizeof(T), count * sizeof(T));
    for (size_t r = 1; r < parts.size(); ++r) {
      const T* in = reinterpret_cast<const T*>(parts[r].data()) + first;
      for (size_t i = 0; i < count; ++i) {
        acc[i] = op == comm::ReduceOp::kSum ? acc[i] + in[i] : std::max(acc[i], in[i]);
      }
    }
    std::memcpy(out, acc.data(), count * sizeof(T));
    return absl::OkStatus();
  }

  std::shared_ptr<ThreadGroup> group_;
  const int rank_;
  bool aborted_ = false;  // guarded by group_->mu()
};

// Hands each generation's participants communicators on shared groups: the
// mesh groups by (job, generation, communicator id), the world by (job,
// generation). One ThreadMesh serves every trainer of a test.
class ThreadMesh {
 public:
  worker::CommsFactory Factory() {
    return [this](const worker::CommsRequest& request)
               -> absl::StatusOr<std::unique_ptr<worker::GenerationComms>> {
      auto comms = std::make_unique<Comms>();
      const worker::Assignment& a = *request.assignment;
      if (request.mesh_groups) {
        absl::StatusOr<comm::MeshGroups> groups = comm::ComputeMeshGroups(a.mesh, a.coordinates);
        if (!groups.ok()) return groups.status();
        for (auto [group, slot] : {std::pair{&groups->data, &comms->data},
                                   std::pair{&groups->tensor, &comms->tensor},
                                   std::pair{&groups->pipeline, &comms->pipeline}}) {
          if (group->size() <= 1) continue;
          *slot = std::make_unique<ThreadCommunicator>(
              Group(a, group->communicator_id, group->size()), group->index);
        }
      }
      if (request.world) {
        comms->world_comm = std::make_unique<ThreadCommunicator>(
            Group(a, comm::MeshCommunicatorId(comm::MeshAxis::kWorld, 1), request.participants),
            request.participant);
      }
      return std::unique_ptr<worker::GenerationComms>(std::move(comms));
    };
  }

 private:
  struct Comms : worker::GenerationComms {
    train::TrainingGroups groups() const override {
      return {data.get(), tensor.get(), pipeline.get()};
    }
    comm::Communicator* world() const override { return world_comm.get(); }
    void Abort(const absl::Status& reason) override {
      for (ThreadCommunicator* c : {data.get(), tensor.get(), pipeline.get(), world_comm.get()}) {
        if (c != nullptr) c->Abort(reason);
      }
    }
    std::unique_ptr<ThreadCommunicator> data, tensor, pipeline, world_comm;
  };

  std::shared_ptr<ThreadGroup> Group(const worker::Assignment& a, uint16_t id, int size) {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<ThreadGroup>& group =
        groups_[{a.job_id.value(), a.generation.value(), id}];
    if (group == nullptr) group = std::make_shared<ThreadGroup>(size);
    return group;
  }

  absl::Mutex mu_;
  std::map<std::tuple<std::string, uint64_t, uint16_t>, std::shared_ptr<ThreadGroup>> groups_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::testing
