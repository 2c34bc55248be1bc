#include "worker/comm/nccl_status.h"

#include "absl/strings/str_cat.h"

namespace cohort::comm {

absl::Status NcclResultToStatus(ncclResult_t result, absl::string_view context,
                                const char* detail) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(context, ": ", ncclGetErrorString(result));
  if (detail != nullptr && detail[0] != '\0') absl::StrAppend(&message, " (", detail, ")");
  switch (result) {
    case ncclInvalidArgument:
      return absl::InvalidArgumentError(message);
    case ncclInvalidUsage:
      return absl::FailedPreconditionError(message);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    case ncclInProgress:
      return absl::InternalError(absl::StrCat(message, " [ncclInProgress is not an error]"));
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaErrorToStatus(cudaError_t error, absl::string_view context) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(context, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return absl::FailedPreconditionError(message);
    case cudaErrorNotReady:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<ncclDataType_t> ToNcclDataType(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kUInt8:
      return ncclUint8;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown DataType ", static_cast<int>(type)));
}

absl::StatusOr<ncclRedOp_t> ToNcclRedOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown ReduceOp ", static_cast<int>(op)));
}

}  // namespace cohort::comm
