#include "worker/comm/hierarchical_communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/layout/mesh_layout.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/comm/failed_peer.h"

namespace cohort::comm {
namespace {

// The lane's and the local group's own tag for ordered exchanges (both
// communicators are private to this one).
constexpr uint32_t kOrderedTag = 1;

// `status` (message and code of `reported`) with the failed peer that
// `reported` names, a rank of a lane's context (host h, of `hosts`), named
// instead as the caller's context rank `world_rank_of_host(h)`; without
// such a peer, `status` as it is.
absl::Status NameLanePeer(absl::Status status, const absl::Status& reported, int hosts,
                          absl::FunctionRef<int(int)> world_rank_of_host) {
  const std::optional<int> peer = FailedPeer(reported);
  if (!peer.has_value() || *peer >= hosts) return status;
  return WithFailedPeer(absl::Status(status.code(), status.message()), world_rank_of_host(*peer));
}

}  // namespace

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
    CollectiveAlgorithm algorithm, const UcxContextOptions& bootstrap, size_t piece_bytes) {
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
  std::vector<std::vector<int>> by_host = layout::RanksByHost(hosts);
  // The lane's members, hosts in order, as ranks 0..H-1 of a context of
  // their own: its UCP worker is progressed only by the thread running the
  // lane.
  const auto self = std::find(split->lane.begin(), split->lane.end(), whole->rank());
  UcxContextOptions options = bootstrap;
  options.rank = static_cast<int>(self - split->lane.begin());
  options.size = static_cast<int>(split->lane.size());
  options.key_prefix =
      absl::StrCat(bootstrap.key_prefix, "lane/", lane_id, "/", local->rank(), "/");
  absl::StatusOr<std::unique_ptr<UcxContext>> lane_context = UcxContext::Create(options);
  if (!lane_context.ok()) {
    const absl::Status& failed = lane_context.status();
    return NameLanePeer(
        absl::Status(failed.code(), absl::StrCat("lane context: ", failed.message())), failed,
        options.size,
        [&](int h) { return whole->world_rank(split->lane[static_cast<size_t>(h)]); });
  }
  ASSIGN_OR_RETURN(std::unique_ptr<UcxCommunicator> lane,
                   UcxCommunicator::Create(lane_context->get(), {.comm_id = lane_id}));
  LOG(INFO) << "communicator " << whole->comm_id() << ": hierarchical collectives over "
            << lane->size() << " hosts x " << local->size()
            << " ranks, the lanes on UCP workers of their own";
  return std::unique_ptr<Communicator>(
      new HierarchicalCommunicator(std::move(whole), std::move(local), std::move(*lane_context),
                                   std::move(lane), std::move(by_host), piece_bytes));
}

HierarchicalCommunicator::HierarchicalCommunicator(std::unique_ptr<UcxCommunicator> flat,
                                                   std::unique_ptr<UcxCommunicator> local,
                                                   std::unique_ptr<UcxContext> lane_context,
                                                   std::unique_ptr<UcxCommunicator> lane,
                                                   std::vector<std::vector<int>> hosts,
                                                   size_t piece_bytes)
    : flat_(std::move(flat)),
      local_(std::move(local)),
      lane_context_(std::move(lane_context)),
      lane_(std::move(lane)),
      hosts_(std::move(hosts)),
      host_(lane_->rank()),
      local_index_(local_->rank()),
      piece_bytes_(piece_bytes) {}

std::optional<HierarchicalCommunicator::OrderedSplit> HierarchicalCommunicator::SplitMerges(
    const std::vector<std::pair<int, int>>& merges) const {
  const size_t n = static_cast<size_t>(size());
  std::vector<int> host_of(n), local_of(n);
  for (size_t h = 0; h < hosts_.size(); ++h) {
    for (size_t l = 0; l < hosts_[h].size(); ++l) {
      host_of[hosts_[h][l]] = static_cast<int>(h);
      local_of[hosts_[h][l]] = static_cast<int>(l);
    }
  }
  // A merge within a host may run before the merges across hosts only when
  // no merge across hosts has touched its ranks yet; those then combine the
  // hosts' first ranks, into which every host folded.
  std::vector<bool> crossed(n, false);
  OrderedSplit split;
  for (const auto& [into, from] : merges) {
    if (host_of[into] == host_of[from]) {
      if (crossed[into] || crossed[from] || local_of[from] == 0) return std::nullopt;
      if (host_of[into] == host_) split.local.emplace_back(local_of[into], local_of[from]);
    } else {
      if (local_of[into] != 0 || local_of[from] != 0) return std::nullopt;
      crossed[into] = crossed[from] = true;
      split.hosts.emplace_back(host_of[into], host_of[from]);
    }
  }
  return split;
}

absl::StatusOr<const float*> HierarchicalCommunicator::ExchangeOrdered(
    UcxCommunicator* group, const float* input, size_t piece,
    const std::vector<std::pair<int, int>>& merges, const Deadline& left,
    std::vector<uint8_t>* scratch) {
  const int m = group->size();
  const int me = group->rank();
  const size_t bytes = piece * sizeof(float);
  scratch->resize(bytes * static_cast<size_t>(m));
  auto* pieces = reinterpret_cast<float*>(scratch->data());
  std::memcpy(pieces + piece * static_cast<size_t>(me), input + piece * static_cast<size_t>(me),
              bytes);
  for (int k = 1; k < m; ++k) {
    const int to = (me + k) % m;
    const int from = (me - k + m) % m;
    RETURN_IF_ERROR(group->SendRecv(input + piece * static_cast<size_t>(to), bytes, to,
                                    pieces + piece * static_cast<size_t>(from), bytes, from,
                                    kOrderedTag, left()));
  }
  for (const auto& [into, from] : merges) {
    float* sum = pieces + piece * static_cast<size_t>(into);
    const float* add = pieces + piece * static_cast<size_t>(from);
    for (size_t i = 0; i < piece; ++i) sum[i] += add[i];
  }
  return pieces;
}

absl::Status HierarchicalCommunicator::RunReduceScatterOrdered(
    const float* input, size_t count, size_t block, float* output,
    const std::vector<std::pair<int, int>>& merges, absl::Duration timeout) {
  const size_t n = static_cast<size_t>(size());
  std::optional<OrderedSplit> split;
  if (count * sizeof(float) >= kHierarchicalMinBytes && input != nullptr && block * n >= count) {
    for (const auto& [into, from] : merges) {
      if (into < 0 || into >= size() || from < 0 || from >= size() || into == from) {
        return absl::InvalidArgumentError(absl::StrCat("ReduceScatterOrdered: merge (", into,
                                                       ", ", from, ") out of range for ", size(),
                                                       " ranks"));
      }
    }
    split = SplitMerges(merges);
    if (!ordered_logged_) {
      // Once per communicator: which way the data group's gradients go
      // explains its step time.
      ordered_logged_ = true;
      LOG(INFO) << "communicator " << flat_->comm_id() << ": ordered reduce-scatters "
                << (split.has_value() ? "fold host by host (hierarchical)"
                                      : "do not fold host by host: flat, point to point");
    }
  }
  // The flat group checks the arguments and keeps any other order (its
  // point-to-point fallback when it has no shared memory across the hosts).
  if (!split.has_value()) {
    return flat_->ReduceScatterOrdered(input, count, block, output, merges, timeout);
  }
  return RunOrderedPieces(input, count, block, output, *split, timeout);
}

void HierarchicalCommunicator::ToLanes(const uint8_t* grouped, size_t valid_bytes,
                                       size_t block_bytes, size_t offset_bytes, size_t piece_bytes,
                                       uint8_t* lanes) const {
  const size_t hosts = hosts_.size();
  for (size_t h = 0; h < hosts; ++h) {
    for (size_t l = 0; l < hosts_[h].size(); ++l) {
      const size_t at = static_cast<size_t>(hosts_[h][l]) * block_bytes + offset_bytes;
      const size_t real = std::min(piece_bytes, valid_bytes - std::min(valid_bytes, at));
      uint8_t* to = lanes + (l * hosts + h) * piece_bytes;
      if (real > 0) std::memcpy(to, grouped + at, real);
      if (real < piece_bytes) std::memset(to + real, 0, piece_bytes - real);
    }
  }
}

void HierarchicalCommunicator::FromLanes(const uint8_t* lanes, size_t block_bytes,
                                         size_t offset_bytes, size_t piece_bytes,
                                         size_t valid_bytes, uint8_t* grouped) const {
  const size_t hosts = hosts_.size();
  for (size_t h = 0; h < hosts; ++h) {
    for (size_t l = 0; l < hosts_[h].size(); ++l) {
      const size_t at = static_cast<size_t>(hosts_[h][l]) * block_bytes + offset_bytes;
      const size_t real = std::min(piece_bytes, valid_bytes - std::min(valid_bytes, at));
      if (real > 0) std::memcpy(grouped + at, lanes + (l * hosts + h) * piece_bytes, real);
    }
  }
}

absl::Status HierarchicalCommunicator::LaneError(absl::Status status) const {
  return NameLanePeer(status, status, static_cast<int>(hosts_.size()),
                      [&](int h) { return flat_->world_rank(GroupRank(h, local_index_)); });
}

void HierarchicalCommunicator::Fail(const absl::Status& status) {
  {
    absl::MutexLock lock(&failure_mu_);
    if (failure_.ok()) failure_ = status;
  }
  flat_->Abort(status);
  local_->Abort(status);
  lane_->Abort(status);
}

void HierarchicalCommunicator::Abort(const absl::Status& reason) {
  {
    // What an aborted UcxCommunicator answers.
    absl::MutexLock lock(&failure_mu_);
    if (failure_.ok()) {
      failure_ = absl::AbortedError(absl::StrCat("communicator aborted: ", reason.ToString()));
    }
  }
  flat_->Abort(reason);
  local_->Abort(reason);
  lane_->Abort(reason);
}

}  // namespace cohort::comm
