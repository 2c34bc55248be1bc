#include "worker/checkpoint/state_transfer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/train/data_parallel.h"

namespace cohort::checkpoint {
namespace {

Box LocalBox(const model::ParameterInfo& info) { return Box{info.box_start, info.box_extent}; }

// A buffer holding arena elements [range.begin, range.end), seen as laid out
// over tensor `info`'s local box.
ConstBoxedBuffer RangeView(const model::ParameterInfo& info, const Box& box, const float* data,
                           ArenaRange range) {
  const size_t begin = std::max(range.begin, info.offset);
  return ConstBoxedBuffer{&box, static_cast<int64_t>(begin - info.offset),
                          data + (begin - range.begin)};
}

// The source buffer of `t` on this participant, or an error.
absl::StatusOr<ConstBoxedBuffer> SourceView(const SourceState& s, const Transfer& t, Box* box) {
  const model::ParameterInfo& info = (*s.table)[t.tensor];
  if (!info.present()) {
    return absl::InvalidArgumentError(absl::StrCat("source rank ", s.rank, " does not hold tensor ",
                                                   info.name));
  }
  *box = LocalBox(info);
  if (t.kind == StateKind::kParam) return ConstBoxedBuffer{box, 0, s.params + info.offset};
  const bool m = t.kind == StateKind::kAdamM;
  // Its own moments (which, without ZeRO-1, cover every piece of its shard),
  // or a mirror of the piece's owner.
  if (t.piece == s.rank || !s.layout.zero1) {
    return RangeView(info, *box, m ? s.adam_m : s.adam_v, s.optimizer);
  }
  const RankPosition owner = PositionOf(s.layout, t.piece);
  auto held = std::find_if(s.mirrors.begin(), s.mirrors.end(),
                           [&](const SourceState::Mirror& m) { return m.owner == owner.coords.data; });
  if (held == s.mirrors.end()) {
    return absl::InvalidArgumentError(absl::StrCat("source rank ", s.rank, " holds no mirror of ",
                                                   "source rank ", t.piece));
  }
  const SourceState::Mirror& mirror = *held;
  return RangeView(info, *box, m ? mirror.adam_m : mirror.adam_v, mirror.range);
}

BoxedBuffer DestinationView(const DestinationState& d, const Transfer& t, Box* box) {
  const model::ParameterInfo& info = (*d.table)[t.tensor];
  *box = LocalBox(info);
  if (t.kind == StateKind::kParam) return BoxedBuffer{box, 0, d.buffers.params + info.offset};
  float* data = t.kind == StateKind::kAdamM ? d.buffers.adam_m : d.buffers.adam_v;
  const ArenaRange range = d.buffers.optimizer;
  const size_t begin = std::max(range.begin, info.offset);
  return BoxedBuffer{box, static_cast<int64_t>(begin - info.offset), data + (begin - range.begin)};
}

}  // namespace

absl::Status RunTransfers(comm::Communicator* world, int self,
                          const std::vector<Transfer>& transfers,
                          const std::vector<std::vector<int>>& rounds, const SourceState* source,
                          const DestinationState* destination, absl::Duration timeout,
                          TransferStats* stats) {
  const absl::Time start = absl::Now();
  TransferStats local;
  // Local copies first: no peer involved.
  for (const Transfer& t : transfers) {
    if (t.from != self || t.to != self) continue;
    if (source == nullptr || destination == nullptr) {
      return absl::InvalidArgumentError("a local transfer needs source and destination state");
    }
    Box from_box, to_box;
    ASSIGN_OR_RETURN(ConstBoxedBuffer from, SourceView(*source, t, &from_box));
    const BoxedBuffer to = DestinationView(*destination, t, &to_box);
    // A kept session serves and receives the same buffers: the state is in
    // place already.
    if (from.data == to.data && from.first == to.first && from_box == to_box) continue;
    CopyRegion(t.region, from, to, sizeof(float));
    local.copied_bytes += t.elements() * static_cast<int64_t>(sizeof(float));
  }
  std::vector<float> send_buffer, recv_buffer;
  for (size_t r = 0; r < rounds.size(); ++r) {
    const Transfer* send = nullptr;
    const Transfer* recv = nullptr;
    for (int index : rounds[r]) {
      const Transfer& t = transfers[static_cast<size_t>(index)];
      if (t.from == self) send = &t;
      if (t.to == self) recv = &t;
    }
    if (send == nullptr && recv == nullptr) continue;
    // A region that is one run of the buffer's flat elements (whole rows,
    // a 1-D slice) goes straight from the source's state and into the
    // destination's: no staging copy on either side.
    const void* send_data = nullptr;
    Box from_box;
    if (send != nullptr) {
      if (source == nullptr) return absl::InvalidArgumentError("asked to send without source state");
      ASSIGN_OR_RETURN(ConstBoxedBuffer from, SourceView(*source, *send, &from_box));
      if (IsContiguousIn(send->region, from_box)) {
        send_data = static_cast<const float*>(from.data) +
                    (FlatIndexIn(from_box, send->region.start) - from.first);
      } else {
        send_buffer.resize(static_cast<size_t>(send->elements()));
        CopyRegion(send->region, from, BoxedBuffer{&send->region, 0, send_buffer.data()},
                   sizeof(float));
        send_data = send_buffer.data();
      }
    }
    void* recv_data = nullptr;
    Box to_box;
    BoxedBuffer to;
    bool staged = false;
    if (recv != nullptr) {
      if (destination == nullptr) return absl::InvalidArgumentError("asked to receive as a donor");
      to = DestinationView(*destination, *recv, &to_box);
      if (IsContiguousIn(recv->region, to_box)) {
        recv_data = static_cast<float*>(to.data) +
                    (FlatIndexIn(to_box, recv->region.start) - to.first);
      } else {
        recv_buffer.resize(static_cast<size_t>(recv->elements()));
        recv_data = recv_buffer.data();
        staged = true;
      }
    }
    const uint32_t tag = static_cast<uint32_t>(r);
    const size_t send_bytes = send ? static_cast<size_t>(send->elements()) * sizeof(float) : 0;
    const size_t recv_bytes = recv ? static_cast<size_t>(recv->elements()) * sizeof(float) : 0;
    if (send != nullptr && recv != nullptr) {
      RETURN_IF_ERROR(world->SendRecv(send_data, send_bytes, send->to, recv_data, recv_bytes,
                                      recv->from, tag, timeout));
    } else if (send != nullptr) {
      RETURN_IF_ERROR(world->Send(send_data, send_bytes, send->to, tag, timeout));
    } else {
      RETURN_IF_ERROR(world->Recv(recv_data, recv_bytes, recv->from, tag, timeout));
    }
    if (recv != nullptr) {
      if (staged) {
        CopyRegion(recv->region, ConstBoxedBuffer{&recv->region, 0, recv_buffer.data()}, to,
                   sizeof(float));
      }
      local.received_bytes += static_cast<int64_t>(recv_bytes);
    }
    local.sent_bytes += static_cast<int64_t>(send_bytes);
    ++local.rounds;
  }
  local.duration = absl::Now() - start;
  if (stats != nullptr) *stats = local;
  return absl::OkStatus();
}

}  // namespace cohort::checkpoint
