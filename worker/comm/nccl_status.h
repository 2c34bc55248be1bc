#pragma once
// Conversions between Cohort's vocabulary and NCCL / CUDA runtime codes: the
// one place where ncclResult_t and cudaError_t become absl::Status (house
// rule 5). Compiled only where CUDA exists (COHORT_HAVE_CUDA); none of these
// functions needs a device, so they are tested on any CUDA build.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/comm/communicator.h"

namespace cohort::comm {

// OK for ncclSuccess; otherwise a status whose message is
// "<context>: <ncclGetErrorString>[ (<detail>)]". `detail` is typically
// ncclGetLastError(comm) and may be null or empty. Codes:
//   ncclInvalidArgument                    -> InvalidArgument
//   ncclInvalidUsage                       -> FailedPrecondition
//   ncclRemoteError, ncclSystemError       -> Unavailable (a peer or the network failed)
//   ncclUnhandledCudaError, ncclInternalError, ncclInProgress (not an error:
//   converting it is a caller bug), anything else -> Internal
absl::Status NcclResultToStatus(ncclResult_t result, absl::string_view context,
                                const char* detail = nullptr);

// OK for cudaSuccess; otherwise "<context>: <cudaGetErrorName>: <cudaGetErrorString>".
//   cudaErrorInvalidValue, cudaErrorInvalidDevice,
//   cudaErrorInvalidDevicePointer                      -> InvalidArgument
//   cudaErrorMemoryAllocation                          -> ResourceExhausted
//   cudaErrorNoDevice, cudaErrorInsufficientDriver,
//   cudaErrorDevicesUnavailable, cudaErrorInitializationError
//                                                      -> FailedPrecondition (the host has
//                                                         no usable GPU: an operator fixes it)
//   cudaErrorNotReady                                  -> Unavailable (work still running)
//   anything else (faults, launch failures)            -> Internal
absl::Status CudaErrorToStatus(cudaError_t error, absl::string_view context);

// The NCCL type for a Cohort type. Every DataType has one; InvalidArgument
// only for a value outside the enum.
absl::StatusOr<ncclDataType_t> ToNcclDataType(DataType type);
// The NCCL op for a Cohort op; InvalidArgument only for a value outside the enum.
absl::StatusOr<ncclRedOp_t> ToNcclRedOp(ReduceOp op);

}  // namespace cohort::comm
