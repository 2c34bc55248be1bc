#include "common/raw_bytes_message.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "common/crc32c.h"

namespace cohort {
namespace {

constexpr uint32_t kLengthDelimited = 2;  // protobuf wire type
constexpr size_t kMaxVarintBytes = 10;

size_t PutVarint(uint64_t value, uint8_t* out) {
  size_t n = 0;
  while (value >= 0x80) {
    out[n++] = static_cast<uint8_t>(value | 0x80);
    value >>= 7;
  }
  out[n++] = static_cast<uint8_t>(value);
  return n;
}

// The field's key and length: at most 2 x 10 bytes.
grpc::Slice FieldHeader(uint32_t field_number, size_t size) {
  std::array<uint8_t, 2 * kMaxVarintBytes> header;
  size_t n = PutVarint((static_cast<uint64_t>(field_number) << 3) | kLengthDelimited,
                       header.data());
  n += PutVarint(size, header.data() + n);
  return grpc::Slice(header.data(), n);  // copies these few bytes
}

grpc::ByteBuffer Message(grpc::Slice header, grpc::Slice payload, size_t size) {
  if (size == 0) return grpc::ByteBuffer(&header, 1);
  const grpc::Slice slices[2] = {std::move(header), std::move(payload)};
  return grpc::ByteBuffer(slices, 2);
}

// Reads the varints at the start of a message that spans several slices.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  std::optional<uint64_t> Varint() {
    uint64_t value = 0;
    for (size_t i = 0; i < kMaxVarintBytes; ++i) {
      std::optional<uint8_t> byte = Byte();
      if (!byte) return std::nullopt;
      value |= static_cast<uint64_t>(*byte & 0x7F) << (7 * i);
      if ((*byte & 0x80) == 0) return value;
    }
    return std::nullopt;  // over-long
  }
  size_t slice() const { return slice_; }
  size_t offset() const { return offset_; }

 private:
  std::optional<uint8_t> Byte() {
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
    if (slice_ == slices_.size()) return std::nullopt;
    return slices_[slice_].begin()[offset_++];
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

}  // namespace

grpc::ByteBuffer BytesFieldMessage(uint32_t field_number, const void* data, size_t size) {
  return Message(FieldHeader(field_number, size),
                 grpc::Slice(data, size, grpc::Slice::STATIC_SLICE), size);
}

grpc::ByteBuffer BytesFieldMessage(uint32_t field_number, const void* data, size_t size,
                                   void (*release)(void*), void* context) {
  if (size == 0) {
    release(context);
    return Message(FieldHeader(field_number, 0), grpc::Slice(), 0);
  }
  return Message(FieldHeader(field_number, size),
                 grpc::Slice(const_cast<void*>(data), size, release, context), size);
}

std::optional<BytesFieldView> BytesFieldView::Of(const grpc::ByteBuffer& message,
                                                 uint32_t field_number) {
  BytesFieldView view;
  if (!message.Dump(&view.slices_).ok()) return std::nullopt;
  SliceCursor cursor(view.slices_);
  const std::optional<uint64_t> key = cursor.Varint();
  if (!key || *key != ((static_cast<uint64_t>(field_number) << 3) | kLengthDelimited)) {
    return std::nullopt;
  }
  const std::optional<uint64_t> size = cursor.Varint();
  if (!size) return std::nullopt;
  size_t header = 0;
  for (size_t i = 0; i < cursor.slice(); ++i) header += view.slices_[i].size();
  header += cursor.offset();
  // Exactly the field and nothing after it: anything else takes protobuf.
  if (message.Length() < header || message.Length() - header != *size) return std::nullopt;
  view.slices_.erase(view.slices_.begin(),
                     view.slices_.begin() + static_cast<std::ptrdiff_t>(cursor.slice()));
  view.offset_ = cursor.offset();
  view.size_ = *size;
  return view;
}

uint32_t BytesFieldView::CopyAndExtendCrc32c(void* out, uint32_t crc) const {
  auto* to = static_cast<uint8_t*>(out);
  size_t skip = offset_;
  for (const grpc::Slice& slice : slices_) {
    const size_t n = slice.size() - std::min(skip, slice.size());
    if (n > 0) {
      const uint8_t* from = slice.begin() + (slice.size() - n);
      // Slices are at most a few hundred KiB; cut further so the CRC reads
      // what the copy just wrote from L1/L2, not from memory.
      constexpr size_t kPiece = 64 << 10;
      for (size_t at = 0; at < n; at += kPiece) {
        const size_t piece = std::min(kPiece, n - at);
        std::memcpy(to, from + at, piece);
        crc = Crc32cExtend(crc, to, piece);
        to += piece;
      }
    }
    skip -= std::min(skip, slice.size());
  }
  return crc;
}

}  // namespace cohort
