#include "worker/checkpoint/live_transfer.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "common/layout/mesh_layout.h"
#include "common/layout/mesh_proto.h"

namespace cohort::checkpoint {
namespace {

// Cuts `box` along its first dimension of extent > 1 (recursively) into
// boxes of at most `max` elements.
void Cut(const Box& box, int64_t max, std::vector<Box>& out) {
  if (max <= 0 || box.NumElements() <= max) {
    out.push_back(box);
    return;
  }
  int k = 0;
  while (k < box.rank() && box.extent[k] == 1) ++k;
  int64_t inner = 1;
  for (int d = k + 1; d < box.rank(); ++d) inner *= box.extent[d];
  const int64_t rows = std::max<int64_t>(1, max / inner);
  for (int64_t r = 0; r < box.extent[k]; r += rows) {
    Box piece = box;
    piece.start[k] += r;
    piece.extent[k] = std::min(rows, box.extent[k] - r);
    if (piece.NumElements() > max) {
      Cut(piece, max, out);
    } else {
      out.push_back(std::move(piece));
    }
  }
}

}  // namespace

StateLayout SourceLayoutOf(const v1::RecoveryPlan& plan) {
  return StateLayout{layout::SourceShapeOf(plan), plan.source_zero1(),
                     std::max(1, plan.source_optimizer_replicas())};
}

RankPosition PositionOf(const StateLayout& state, int rank) {
  return RankPosition{state.shape, layout::CoordsOf(state.shape, rank)};
}

std::vector<Transfer> PlanTransfers(const model::GptConfig& config, const v1::RecoveryPlan& plan,
                                    const StateLayout& next, int64_t max_elements) {
  const StateLayout source = SourceLayoutOf(plan);
  // Pieces, by (kind, tensor): (source rank, box).
  std::map<std::pair<StateKind, model::ParamId>, std::vector<std::pair<int, Box>>> pieces;
  std::vector<model::ParameterTable> source_tables;
  for (int r = 0; r < source.world() && r < plan.pieces_size(); ++r) {
    const RankPosition position = PositionOf(source, r);
    const model::ParameterTable& table = source_tables.emplace_back(config, position.model());
    for (const SavePiece& piece : PlanSave(table, position, 0)) {
      const model::ParameterInfo* info = table.Find(piece.tensor.substr(piece.tensor.find('/') + 1));
      pieces[{piece.kind, info->id}].push_back({r, piece.box});
    }
  }
  // Whether participant `q` holds the weights of `region` of `tensor`: the
  // source rank it held has them in its shard (every data rank of a tensor
  // and pipeline coordinate holds the same weights; replicated tensors are
  // on every tensor rank).
  auto holds_weights = [&](int q, model::ParamId tensor, const Box& region) {
    if (q >= plan.participant_source_ranks_size()) return false;
    const int held = plan.participant_source_ranks(q);
    if (held < 0 || held >= static_cast<int>(source_tables.size())) return false;
    const model::ParameterInfo& info = source_tables[static_cast<size_t>(held)][tensor];
    if (!info.present()) return false;
    const std::optional<Box> inside = Intersect(region, Box{info.box_start, info.box_extent});
    return inside.has_value() && *inside == region;
  };
  std::vector<Transfer> transfers;
  for (int q = 0; q < next.world(); ++q) {
    const RankPosition position = PositionOf(next, q);
    const model::ParameterTable table(config, position.model());
    const layout::ShardRange own =
        layout::DataShardRange(table.num_params(), next.shape.data, position.coords.data);
    const ArenaRange optimizer =
        next.zero1 ? ArenaRange{own.begin, own.end} : ArenaRange{0, table.num_params()};
    for (const LoadPiece& need : PlanLoad(table, optimizer)) {
      const model::ParameterInfo* info = table.Find(need.tensor.substr(need.tensor.find('/') + 1));
      const auto& candidates = pieces[{need.kind, info->id}];
      for (const Box& local : FlatRangeToBoxes(need.local_box.extent, need.first,
                                               need.first + need.count)) {
        const Box wanted = Translate(local, need.local_box.start);
        for (const auto& [r, box] : candidates) {
          std::optional<Box> region = Intersect(wanted, box);
          if (!region) continue;
          const v1::PieceSource& from = plan.pieces(r);
          const bool params = need.kind == StateKind::kParam;
          std::vector<Box> cut;
          Cut(*region, max_elements, cut);
          for (Box& b : cut) {
            Transfer t;
            t.from = params ? (holds_weights(q, info->id, b) ? q : from.params_from())
                            : from.optimizer_from();
            t.to = q;
            t.kind = need.kind;
            t.tensor = info->id;
            t.piece = r;
            t.holder_rank = params ? -1 : from.optimizer_holder_rank();
            t.region = std::move(b);
            transfers.push_back(std::move(t));
          }
        }
      }
    }
  }
  std::sort(transfers.begin(), transfers.end(), [](const Transfer& a, const Transfer& b) {
    return std::tie(a.to, a.from, a.kind, a.tensor, a.region.start) <
           std::tie(b.to, b.from, b.kind, b.tensor, b.region.start);
  });
  return transfers;
}

std::vector<std::vector<int>> ScheduleRounds(const std::vector<Transfer>& transfers) {
  // Greedy: each transfer goes to the first round where its sender is not
  // sending and its receiver is not receiving. A participant's sends (and
  // receives) keep their canonical order across rounds.
  std::vector<std::vector<int>> rounds;
  std::map<int, size_t> next_send_round, next_recv_round;
  std::vector<std::set<int>> sending, receiving;
  for (int i = 0; i < static_cast<int>(transfers.size()); ++i) {
    const Transfer& t = transfers[static_cast<size_t>(i)];
    if (t.from == t.to) continue;
    size_t round = std::max(next_send_round[t.from], next_recv_round[t.to]);
    while (round < rounds.size() && (sending[round].contains(t.from) || receiving[round].contains(t.to))) {
      ++round;
    }
    if (round == rounds.size()) {
      rounds.emplace_back();
      sending.emplace_back();
      receiving.emplace_back();
    }
    rounds[round].push_back(i);
    sending[round].insert(t.from);
    receiving[round].insert(t.to);
    next_send_round[t.from] = round + 1;
    next_recv_round[t.to] = round + 1;
  }
  return rounds;
}

}  // namespace cohort::checkpoint
