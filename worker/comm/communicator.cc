#include "worker/comm/communicator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace cohort::comm {

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat16: return 2;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
  }
  return 0;
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat16: return "float16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
  }
  return "unknown";
}

absl::Status CheckBuffer(const void* data, size_t count, const char* call) {
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": null buffer with count ", count));
  }
  return absl::OkStatus();
}

absl::Status CheckDataType(DataType type) {
  if (DataTypeSize(type) == 0) return absl::InvalidArgumentError("unsupported data type");
  return absl::OkStatus();
}

absl::Status CheckPeer(int peer, int rank, int size, const char* call) {
  if (peer < 0 || peer >= size || peer == rank) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": peer ", peer, " invalid for rank ",
                                                   rank, " of ", size));
  }
  return absl::OkStatus();
}

absl::Status CheckRoot(int root, int size, const char* call) {
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": root ", root, " not in [0, ", size, ")"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::AllGatherRanges(void* data, const std::vector<ByteRange>& ranges,
                                           uint32_t tag, absl::Duration timeout) {
  const int n = size();
  if (ranges.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(absl::StrCat("AllGatherRanges: ", ranges.size(),
                                                   " ranges for ", n, " ranks"));
  }
  if (n == 1) return absl::OkStatus();
  // One deadline for all rounds: the call, not each round, is bounded.
  const absl::Time deadline = absl::Now() + timeout;
  auto* bytes = static_cast<uint8_t*>(data);
  const int me = rank();
  for (int s = 1; s < n; ++s) {
    const int to = (me + s) % n;
    const int from = (me - s + n) % n;
    const absl::Status status =
        SendRecv(bytes + ranges[me].begin, ranges[me].size(), to, bytes + ranges[from].begin,
                 ranges[from].size(), from, tag,
                 std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace cohort::comm
