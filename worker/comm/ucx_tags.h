#pragma once
// The 64-bit UCP tag layout shared by the UCX communicator and its context.
// Receives always use the full mask, so a message matches only the one
// receive meant for it:
//
//   bits 63..48  communicator id (16): groups sharing a context never match
//   bits 47..46  kind (2): point-to-point, collective, context control, or
//                the answer to a direct read's offer (ucx_direct_read.h)
//   bits 45..32  sender's rank within the group (14): UCP matches on tags
//                only, so the sender must be part of the tag
//   bits 31..0   point-to-point and direct-read answers: the user's tag
//                collective: sequence number (8) | message index (24)
//
// The per-call sequence number catches ranks that fall out of step; the
// message index numbers the messages of one call between a pair of ranks.

#include <cstdint>

namespace cohort::comm {

enum class TagKind : uint64_t {
  kPointToPoint = 0,
  kCollective = 1,
  kControl = 2,
  kDirectReadAnswer = 3
};

inline constexpr uint64_t kFullTagMask = ~uint64_t{0};
inline constexpr uint32_t kMessageIndexBits = 24;

inline uint64_t MakeTag(uint16_t comm_id, TagKind kind, int source, uint32_t low) {
  return (uint64_t{comm_id} << 48) | (static_cast<uint64_t>(kind) << 46) |
         ((static_cast<uint64_t>(source) & 0x3fffu) << 32) | low;
}

inline uint32_t CollectiveLow(uint32_t sequence, uint32_t message) {
  return ((sequence & 0xffu) << kMessageIndexBits) | (message & ((1u << kMessageIndexBits) - 1));
}

}  // namespace cohort::comm
