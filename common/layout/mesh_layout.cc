#include "common/layout/mesh_layout.h"

#include <algorithm>

namespace cohort::layout {

int RankOf(const MeshShape& shape, const MeshCoords& coords) {
  return coords.pipeline * (shape.data * shape.tensor) + coords.data * shape.tensor +
         coords.tensor;
}

MeshCoords CoordsOf(const MeshShape& shape, int rank) {
  const int per_stage = shape.data * shape.tensor;
  return {(rank % per_stage) / shape.tensor, rank % shape.tensor, rank / per_stage};
}

bool InMesh(const MeshShape& shape, const MeshCoords& coords) {
  return coords.data >= 0 && coords.data < shape.data && coords.tensor >= 0 &&
         coords.tensor < shape.tensor && coords.pipeline >= 0 && coords.pipeline < shape.pipeline;
}

const char* AxisName(Axis axis) {
  switch (axis) {
    case Axis::kTensor:
      return "tensor";
    case Axis::kData:
      return "data";
    case Axis::kPipeline:
      return "pipeline";
  }
  return "unknown";
}

int AxisSize(const MeshShape& shape, Axis axis) {
  switch (axis) {
    case Axis::kTensor:
      return shape.tensor;
    case Axis::kData:
      return shape.data;
    case Axis::kPipeline:
      return shape.pipeline;
  }
  return 1;
}

int AxisCoordinate(const MeshCoords& coords, Axis axis) {
  switch (axis) {
    case Axis::kTensor:
      return coords.tensor;
    case Axis::kData:
      return coords.data;
    case Axis::kPipeline:
      return coords.pipeline;
  }
  return 0;
}

namespace {

MeshCoords WithCoordinate(MeshCoords coords, Axis axis, int value) {
  switch (axis) {
    case Axis::kTensor:
      coords.tensor = value;
      break;
    case Axis::kData:
      coords.data = value;
      break;
    case Axis::kPipeline:
      coords.pipeline = value;
      break;
  }
  return coords;
}

}  // namespace

AxisGroup GroupOf(const MeshShape& shape, Axis axis, const MeshCoords& coords) {
  AxisGroup group;
  const int size = AxisSize(shape, axis);
  group.ranks.reserve(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) group.ranks.push_back(RankOf(shape, WithCoordinate(coords, axis, i)));
  group.index = AxisCoordinate(coords, axis);
  group.group_index = GroupIndex(shape, axis, coords);
  return group;
}

int GroupIndex(const MeshShape& shape, Axis axis, const MeshCoords& coords) {
  switch (axis) {
    case Axis::kTensor:
      return coords.pipeline * shape.data + coords.data;
    case Axis::kData:
      return coords.pipeline * shape.tensor + coords.tensor;
    case Axis::kPipeline:
      return coords.data * shape.tensor + coords.tensor;
  }
  return 0;
}

MeshCoords GroupMember(const MeshShape& shape, Axis axis, int group_index, int position) {
  MeshCoords coords;
  switch (axis) {
    case Axis::kTensor:
      coords = {group_index % shape.data, 0, group_index / shape.data};
      break;
    case Axis::kData:
      coords = {0, group_index % shape.tensor, group_index / shape.tensor};
      break;
    case Axis::kPipeline:
      coords = {group_index / shape.tensor, group_index % shape.tensor, 0};
      break;
  }
  return WithCoordinate(coords, axis, position);
}

int GroupsOnAxis(const MeshShape& shape, Axis axis) {
  return shape.world() / AxisSize(shape, axis);
}

std::optional<int> PreviousStageRank(const MeshShape& shape, const MeshCoords& coords) {
  if (coords.pipeline == 0) return std::nullopt;
  return RankOf(shape, WithCoordinate(coords, Axis::kPipeline, coords.pipeline - 1));
}

std::optional<int> NextStageRank(const MeshShape& shape, const MeshCoords& coords) {
  if (coords.pipeline + 1 >= shape.pipeline) return std::nullopt;
  return RankOf(shape, WithCoordinate(coords, Axis::kPipeline, coords.pipeline + 1));
}

size_t PaddedShardedSize(size_t num_params, int data_parallel) {
  const size_t unit = static_cast<size_t>(data_parallel) * kShardAlignment;
  return (std::max<size_t>(num_params, 1) + unit - 1) / unit * unit;
}

ShardRange DataShardRange(size_t num_params, int data_parallel, int data_rank) {
  const size_t shard = PaddedShardedSize(num_params, data_parallel) / static_cast<size_t>(data_parallel);
  const size_t begin = std::min(num_params, shard * static_cast<size_t>(data_rank));
  return {begin, std::min(num_params, begin + shard)};
}

std::vector<int> MicroBatchShares(int micro_batches, int data_parallel) {
  const int dp = std::max(1, data_parallel);
  std::vector<int> shares(static_cast<size_t>(dp), 0);
  for (int r = 0; r < dp; ++r) shares[r] = micro_batches / dp + (r < micro_batches % dp ? 1 : 0);
  return shares;
}

bool SharesFit(const std::vector<int>& shares, int64_t micro_batches, bool even_shares) {
  if (shares.empty()) return false;
  int64_t sum = 0;
  for (const int share : shares) {
    if (share < 1 || (even_shares && share != shares.front())) return false;
    sum += share;
  }
  return sum == micro_batches;
}

bool MicroBatchesFit(int64_t micro_batches, int64_t data_parallel, bool even_shares) {
  return data_parallel >= 1 && data_parallel <= micro_batches &&
         (!even_shares || micro_batches % data_parallel == 0);
}

int OptimizerCopies(bool zero1, int optimizer_replicas, int data_parallel) {
  const int dp = std::max(1, data_parallel);
  return zero1 ? std::clamp(optimizer_replicas, 1, dp) : dp;
}

CopyRing::CopyRing(int data_parallel) {
  const int dp = std::max(1, data_parallel);
  order_.resize(static_cast<size_t>(dp));
  position_.resize(static_cast<size_t>(dp));
  for (int d = 0; d < dp; ++d) order_[static_cast<size_t>(d)] = position_[static_cast<size_t>(d)] = d;
}

std::vector<std::vector<int>> RanksByHost(const std::vector<std::string>& host_of_rank) {
  std::vector<std::vector<int>> by_host;
  std::vector<const std::string*> names;
  for (int r = 0; r < static_cast<int>(host_of_rank.size()); ++r) {
    const std::string& host = host_of_rank[static_cast<size_t>(r)];
    size_t h = 0;
    while (h < names.size() && *names[h] != host) ++h;
    if (h == names.size()) {
      names.push_back(&host);
      by_host.emplace_back();
    }
    by_host[h].push_back(r);
  }
  return by_host;
}

CopyRing CopyRing::AcrossHosts(const std::vector<std::string>& host_of_data_rank) {
  const std::vector<std::vector<int>> by_host = RanksByHost(host_of_data_rank);
  CopyRing ring(static_cast<int>(host_of_data_rank.size()));
  if (host_of_data_rank.empty()) return ring;
  size_t next = 0;
  for (size_t k = 0; next < host_of_data_rank.size(); ++k) {
    for (const std::vector<int>& ranks : by_host) {
      if (k < ranks.size()) ring.order_[next++] = ranks[k];
    }
  }
  for (int i = 0; i < ring.size(); ++i) {
    ring.position_[static_cast<size_t>(ring.order_[static_cast<size_t>(i)])] = i;
  }
  return ring;
}

int CopyRing::Holder(int owner, int copy) const {
  const int n = size();
  const int at = position_[static_cast<size_t>(owner)] + copy % n;
  return order_[static_cast<size_t>(at % n)];
}

int CopyRing::Owner(int holder, int copy) const {
  const int n = size();
  const int at = position_[static_cast<size_t>(holder)] - copy % n + n;
  return order_[static_cast<size_t>(at % n)];
}

}  // namespace cohort::layout
