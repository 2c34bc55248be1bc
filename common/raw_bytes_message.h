#pragma once
// Checkpoint bytes through gRPC without protobuf copies.
//
// The checkpoint streams (Checkpoints.Upload and Download) carry tensor bytes
// in messages whose only field is a `bytes data` of a oneof. Through the
// generated code each byte is copied three times on top of the kernel's:
// into the message's string, from it into gRPC's serialized buffer, and on
// the other side out of the received buffer into a string again. These
// helpers make and read such messages as raw gRPC ByteBuffers instead: the
// sender's buffer refers to the caller's memory, and the receiver copies the
// payload once, straight from gRPC's slices to where it belongs. What goes
// over the wire is byte for byte the protobuf encoding, so peers that use the
// generated code interoperate unchanged.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace cohort {

// A message holding one length-delimited field `field_number` whose bytes
// are `data[0, size)`. The buffer refers to `data` without copying it:
// `data` must stay valid until gRPC has sent the message (for a call, until
// it has finished).
grpc::ByteBuffer BytesFieldMessage(uint32_t field_number, const void* data, size_t size);

// The same for bytes owned by someone else: `release(context)` runs once gRPC
// no longer refers to them (possibly on another thread, possibly after the
// call has finished).
grpc::ByteBuffer BytesFieldMessage(uint32_t field_number, const void* data, size_t size,
                                   void (*release)(void*), void* context);

// The payload of a received message, if the message consists of exactly one
// length-delimited field `field_number` and nothing else; otherwise (another
// field, the field twice, unknown fields, a malformed encoding) nullopt, and
// the caller parses the message with protobuf, which gives the same meaning
// in every case.
class BytesFieldView {
 public:
  static std::optional<BytesFieldView> Of(const grpc::ByteBuffer& message, uint32_t field_number);

  size_t size() const { return size_; }
  // Copies the payload to `out` (size() bytes) and returns the CRC-32C of
  // `crc` extended by it, computed piecewise while each piece is in cache.
  uint32_t CopyAndExtendCrc32c(void* out, uint32_t crc) const;

 private:
  BytesFieldView() = default;
  std::vector<grpc::Slice> slices_;  // references, not copies
  size_t offset_ = 0;                // where the payload starts in slices_[0]
  size_t size_ = 0;
};

}  // namespace cohort
