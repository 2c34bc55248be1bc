#pragma once
// The sizes of the largest request messages Cohort's own peers send, which
// the coordinator's receive limit (--max_message_bytes) is made to fit. A
// limit no larger than these lets a peer that stalls a message one byte
// short make the coordinator hold little more than one legitimate message
// per stream (docs/operations.md, --grpc_memory_bytes).

#include <cstddef>

namespace cohort {

// Bytes per data message of a checkpoint upload (client/checkpoint_client.h).
// Small enough that a stalled message holds little, large enough that the
// per-message cost is small: GPT-2 124M's 1.49 GB save is 5,700 messages.
inline constexpr size_t kUploadPieceBytes = size_t{256} << 10;

// The default largest KeyValue value (--max_kv_value_bytes). UCX worker
// addresses and NCCL unique ids, what jobs keep there, are hundreds of bytes.
inline constexpr size_t kDefaultMaxKvValueBytes = size_t{256} << 10;

// What a message holds besides its one large bytes field: a KeyValue key (at
// most 1 KiB) and scope, field tags and lengths.
inline constexpr size_t kMessageEnvelopeBytes = size_t{8} << 10;

// The coordinator's default receive limit: the larger of the two messages
// above, whole.
inline constexpr size_t kDefaultMaxMessageBytes =
    (kUploadPieceBytes > kDefaultMaxKvValueBytes ? kUploadPieceBytes : kDefaultMaxKvValueBytes) +
    kMessageEnvelopeBytes;

}  // namespace cohort
