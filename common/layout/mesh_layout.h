#pragma once
// The mesh math every part of Cohort shares: where a rank sits in a
// data x tensor x pipeline mesh, which ranks form each axis's groups, how
// ZeRO-1 splits the flat parameter vector over data ranks, and which data
// ranks hold each optimizer shard's copies. The coordinator's planners and
// the worker's groups, communicators, state versions, checkpoint pieces and
// live transfer all call this; nothing else computes a rank. A planned mesh
// on the wire (v1::Mesh) converts to these types in mesh_proto.h.
//
// Ranks follow Megatron's order, tensor fastest, then data, then pipeline:
//
//   rank = pipeline * (data_parallel * tensor_parallel) + data * tensor_parallel + tensor
//
// so a tensor group is tensor_parallel consecutive ranks (the group that
// talks most shares a host when hosts get consecutive ranks).
//
//   axis      group members: the same ...     ordered by   group index
//   tensor    data and pipeline coordinates   tensor       pipeline * dp + data
//   data      tensor and pipeline coordinates data         pipeline * tp + tensor
//   pipeline  data and tensor coordinates     pipeline     data * tp + tensor
//
// Pure arithmetic: no I/O, no allocation beyond the returned vectors.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cohort::layout {

// The degrees of a mesh; each >= 1 where the functions below are used.
struct MeshShape {
  int data = 1;
  int tensor = 1;
  int pipeline = 1;
  int world() const { return data * tensor * pipeline; }
  bool operator==(const MeshShape&) const = default;
};

// Where a rank sits.
struct MeshCoords {
  int data = 0;
  int tensor = 0;
  int pipeline = 0;
  bool operator==(const MeshCoords&) const = default;
};

int RankOf(const MeshShape& shape, const MeshCoords& coords);
// `rank` in [0, shape.world()).
MeshCoords CoordsOf(const MeshShape& shape, int rank);
bool InMesh(const MeshShape& shape, const MeshCoords& coords);

enum class Axis { kTensor, kData, kPipeline };
const char* AxisName(Axis axis);

// The degree of `axis` (the size of each of its groups).
int AxisSize(const MeshShape& shape, Axis axis);
// The coordinate of `coords` along `axis` (its index within its group).
int AxisCoordinate(const MeshCoords& coords, Axis axis);

// The group of `axis` that `coords` belongs to.
struct AxisGroup {
  std::vector<int> ranks;  // ordered along the axis: ranks[i] has coordinate i
  int group_index = 0;     // distinct per group of one axis (table above)
  int index = 0;           // coords' position in `ranks`
};
AxisGroup GroupOf(const MeshShape& shape, Axis axis, const MeshCoords& coords);
// GroupOf(...).group_index without building the group.
int GroupIndex(const MeshShape& shape, Axis axis, const MeshCoords& coords);
// The member of group `group_index` of `axis` at coordinate `position` along
// it (the inverse of GroupIndex and AxisCoordinate): position 0 is the
// group's first member.
MeshCoords GroupMember(const MeshShape& shape, Axis axis, int group_index, int position);
// Groups of `axis` in the mesh: the product of the other two degrees.
int GroupsOnAxis(const MeshShape& shape, Axis axis);

// The neighbouring stages of `coords` in its pipeline group, if any.
std::optional<int> PreviousStageRank(const MeshShape& shape, const MeshCoords& coords);
std::optional<int> NextStageRank(const MeshShape& shape, const MeshCoords& coords);

// ZeRO-1: the flat parameter vector of a (tensor, pipeline) shard, padded to
// a multiple of data_parallel * kShardAlignment and cut into equal pieces,
// so piece boundaries fall on the gradient norm's fixed chunks (the norm
// does not depend on where pieces fall); [begin, end) is clipped to
// num_params and may be empty for the last data ranks of a tiny model.
inline constexpr size_t kShardAlignment = size_t{1} << 14;
struct ShardRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
  bool operator==(const ShardRange&) const = default;
};
ShardRange DataShardRange(size_t num_params, int data_parallel, int data_rank);
// The padded length those pieces cut: data_parallel pieces of equal size.
size_t PaddedShardedSize(size_t num_params, int data_parallel);

// How the step's `micro_batches` split over `data_parallel` ranks (rank
// order, contiguous): as evenly as possible, the larger shares first (8 over
// 3: 3, 3, 2). The deterministic reduction lets shares differ; the
// transport's needs data_parallel to divide micro_batches. Needs
// 1 <= data_parallel; ranks beyond micro_batches get 0.
std::vector<int> MicroBatchShares(int micro_batches, int data_parallel);
// Whether `data_parallel` >= 1 ranks can share `micro_batches`: each needs
// at least one, and with `even_shares` (the transport's reduction) the same
// number. The planner, the spec validator and the worker all ask this.
bool MicroBatchesFit(int64_t micro_batches, int64_t data_parallel, bool even_shares);
// Whether `shares` (a plan's split: Mesh.micro_batches) is a split of
// `micro_batches` a data group can train: at least one share, each >= 1,
// summing to `micro_batches`, and all equal with `even_shares`.
bool SharesFit(const std::vector<int>& shares, int64_t micro_batches, bool even_shares);

// How many data ranks hold each optimizer-state piece: with ZeRO-1 the
// piece's owner plus copies - 1 mirrors (`optimizer_replicas` clamped to
// [1, data_parallel]); without it every data rank holds all of it.
int OptimizerCopies(bool zero1, int optimizer_replicas, int data_parallel);
// Ranks grouped by host: `host_of_rank[r]` names rank r's host (any labels;
// equal labels are one host); hosts in the order of their first rank, each
// host's ranks ascending. Shared by the optimizer copy ring, the ring
// collectives' order and the hierarchical split, so all three agree.
std::vector<std::vector<int>> RanksByHost(const std::vector<std::string>& host_of_rank);

// The cyclic order of a data group's ranks that optimizer copies follow:
// copy j of the piece whose owner sits at position i of the ring is held at
// position i + j (wrapping), so each copy is a shift of the ring and any
// R - 1 consecutive losses along it leave a copy. AcrossHosts deals the
// ranks one host at a time in turn (hosts in the order of their first data
// rank, each host's ranks ascending), so the next position is on another
// host wherever the hosts allow and a lost host leaves a copy of each of its
// pieces elsewhere. With every rank on one host, or each on its own, the
// ring is 0, 1, ..., dp - 1.
class CopyRing {
 public:
  // The identity ring of `data_parallel` ranks (>= 1).
  explicit CopyRing(int data_parallel = 1);
  // `host_of_data_rank[d]` names data rank d's host (any labels; equal
  // labels are one host).
  static CopyRing AcrossHosts(const std::vector<std::string>& host_of_data_rank);

  int size() const { return static_cast<int>(order_.size()); }
  // The data rank holding copy `copy` (0: the owner) of `owner`'s piece.
  int Holder(int owner, int copy) const;
  // The owner whose copy `copy` data rank `holder` holds (the inverse).
  int Owner(int holder, int copy) const;
  // Data ranks in ring order.
  const std::vector<int>& order() const { return order_; }
  bool operator==(const CopyRing& other) const { return order_ == other.order_; }

 private:
  std::vector<int> order_;     // position -> data rank
  std::vector<int> position_;  // data rank -> position
};

}  // namespace cohort::layout
