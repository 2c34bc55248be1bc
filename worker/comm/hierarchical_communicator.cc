#include "worker/comm/hierarchical_communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/layout/mesh_layout.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace cohort::comm {

std::optional<HostSplit> SplitByHost(const std::vector<std::string>& host_of_group_rank,
                                     int index) {
  for (const std::string& host : host_of_group_rank) {
    if (host.empty()) return std::nullopt;  // hosts unknown
  }
  const std::vector<std::vector<int>> hosts = layout::RanksByHost(host_of_group_rank);
  if (hosts.size() < 2 || hosts[0].size() < 2) return std::nullopt;
  for (const std::vector<int>& ranks : hosts) {
    if (ranks.size() != hosts[0].size()) return std::nullopt;
  }
  HostSplit split;
  for (const std::vector<int>& ranks : hosts) {
    if (std::find(ranks.begin(), ranks.end(), index) != ranks.end()) split.local = ranks;
  }
  const size_t local_index = static_cast<size_t>(
      std::find(split.local.begin(), split.local.end(), index) - split.local.begin());
  for (const std::vector<int>& ranks : hosts) split.lane.push_back(ranks[local_index]);
  return split;
}

absl::StatusOr<CollectiveAlgorithm> ParseCollectiveAlgorithm(const std::string& name) {
  if (name == "auto") return CollectiveAlgorithm::kAuto;
  if (name == "flat") return CollectiveAlgorithm::kFlat;
  if (name == "hierarchical") return CollectiveAlgorithm::kHierarchical;
  return absl::InvalidArgumentError(
      absl::StrCat("collective algorithm must be auto, flat or hierarchical, got '", name, "'"));
}

absl::StatusOr<std::unique_ptr<Communicator>> HierarchicalCommunicator::Create(
    UcxContext* context, UcxCommunicatorOptions flat, uint16_t local_id, uint16_t lane_id,
    CollectiveAlgorithm algorithm) {
  ASSIGN_OR_RETURN(std::unique_ptr<UcxCommunicator> whole,
                   UcxCommunicator::Create(context, std::move(flat)));
  if (algorithm == CollectiveAlgorithm::kFlat) return std::unique_ptr<Communicator>(std::move(whole));
  std::vector<std::string> hosts;
  for (int r = 0; r < whole->size(); ++r) hosts.push_back(context->peer_host(whole->world_rank(r)));
  const std::optional<HostSplit> split = SplitByHost(hosts, whole->rank());
  if (!split.has_value()) {
    if (algorithm == CollectiveAlgorithm::kHierarchical) {
      return absl::InvalidArgumentError(
          "hierarchical collectives need a group on two hosts or more with the same number (two "
          "or more) of its ranks on each");
    }
    return std::unique_ptr<Communicator>(std::move(whole));
  }
  auto to_world = [&](const std::vector<int>& group_ranks) {
    std::vector<int> world;
    for (const int r : group_ranks) world.push_back(whole->world_rank(r));
    return world;
  };
  ASSIGN_OR_RETURN(std::unique_ptr<UcxCommunicator> local,
                   UcxCommunicator::Create(context, {.comm_id = local_id,
                                                     .group = to_world(split->local)}));
  ASSIGN_OR_RETURN(std::unique_ptr<UcxCommunicator> lane,
                   UcxCommunicator::Create(context, {.comm_id = lane_id,
                                                     .group = to_world(split->lane)}));
  LOG(INFO) << "communicator " << whole->comm_id() << ": hierarchical all-reduces over "
            << lane->size() << " hosts x " << local->size() << " ranks";
  return std::unique_ptr<Communicator>(
      new HierarchicalCommunicator(std::move(whole), std::move(local), std::move(lane)));
}

absl::Status HierarchicalCommunicator::AllReduce(void* data, size_t count, DataType type,
                                                 ReduceOp op, absl::Duration timeout) {
  const size_t element = DataTypeSize(type);
  if (count * element < kHierarchicalMinBytes) {
    return flat_->AllReduce(data, count, type, op, timeout);
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto left = [&] { return std::max(deadline - absl::Now(), absl::ZeroDuration()); };
  const size_t locals = static_cast<size_t>(local_->size());
  const size_t per_rank = (count + locals - 1) / locals;
  // The local reduce-scatter cuts locals equal blocks: pad when they do not
  // divide the count (the padding is reduced too, and dropped).
  auto* buffer = static_cast<uint8_t*>(data);
  if (per_rank * locals != count) {
    padded_.resize(per_rank * locals * element);
    std::memcpy(padded_.data(), data, count * element);
    std::memset(padded_.data() + count * element, 0, (per_rank * locals - count) * element);
    buffer = padded_.data();
  }
  slice_.resize(per_rank * element);
  RETURN_IF_ERROR(local_->ReduceScatter(buffer, slice_.data(), per_rank, type, op, left()));
  RETURN_IF_ERROR(lane_->AllReduce(slice_.data(), per_rank, type, op, left()));
  RETURN_IF_ERROR(local_->AllGather(slice_.data(), buffer, per_rank, type, left()));
  if (buffer != data) std::memcpy(data, buffer, count * element);
  return absl::OkStatus();
}

void HierarchicalCommunicator::Abort(const absl::Status& reason) {
  flat_->Abort(reason);
  local_->Abort(reason);
  lane_->Abort(reason);
}

}  // namespace cohort::comm
