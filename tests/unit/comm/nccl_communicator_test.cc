// Tests for NcclCommunicator and the NCCL/CUDA status conversions.
//
// The conversion and argument-checking tests run on any CUDA build, GPU or
// not. The communicator tests need GPUs: one for the 1-rank test, two for the
// 2-rank tests (two threads, one device each, bootstrapped through an
// in-memory KvClient); elsewhere they skip with the reason. Under
// COHORT_GPU_REQUIRED=1 (tests/testing/gpu_required.h) a host with no usable
// device fails them instead; a host with fewer devices than a test needs (a
// one-GPU machine, for the two-rank tests) still skips it.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/gpu_required.h"

#if defined(COHORT_HAVE_CUDA) && COHORT_HAVE_CUDA

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/comm/kv_client.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/nccl_status.h"

namespace cohort::comm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kTimeout = absl::Seconds(30);

// ---------------------------------------------------------------------------
// Conversions: no device needed.

TEST(NcclStatusTest, NcclResultsMapToFixedCodes) {
  EXPECT_TRUE(NcclResultToStatus(ncclSuccess, "AllReduce").ok());
  const struct {
    ncclResult_t result;
    absl::StatusCode code;
  } cases[] = {
      {ncclUnhandledCudaError, absl::StatusCode::kInternal},
      {ncclSystemError, absl::StatusCode::kUnavailable},
      {ncclInternalError, absl::StatusCode::kInternal},
      {ncclInvalidArgument, absl::StatusCode::kInvalidArgument},
      {ncclInvalidUsage, absl::StatusCode::kFailedPrecondition},
      {ncclRemoteError, absl::StatusCode::kUnavailable},
      {ncclInProgress, absl::StatusCode::kInternal},
  };
  for (const auto& c : cases) {
    const absl::Status status = NcclResultToStatus(c.result, "AllReduce", "peer 1 hung up");
    EXPECT_EQ(status.code(), c.code) << ncclGetErrorString(c.result);
    EXPECT_THAT(std::string(status.message()), HasSubstr("AllReduce: "));
    EXPECT_THAT(std::string(status.message()), HasSubstr(ncclGetErrorString(c.result)));
    EXPECT_THAT(std::string(status.message()), HasSubstr("(peer 1 hung up)"));
  }
}

TEST(NcclStatusTest, EmptyDetailIsLeftOut) {
  const absl::Status status = NcclResultToStatus(ncclRemoteError, "Send", "");
  EXPECT_EQ(status.message(), absl::StrCat("Send: ", ncclGetErrorString(ncclRemoteError)));
  EXPECT_EQ(NcclResultToStatus(ncclRemoteError, "Send", nullptr), status);
}

TEST(NcclStatusTest, CudaErrorsMapToFixedCodes) {
  EXPECT_TRUE(CudaErrorToStatus(cudaSuccess, "cudaMalloc").ok());
  const struct {
    cudaError_t error;
    absl::StatusCode code;
  } cases[] = {
      {cudaErrorInvalidValue, absl::StatusCode::kInvalidArgument},
      {cudaErrorInvalidDevice, absl::StatusCode::kInvalidArgument},
      {cudaErrorInvalidDevicePointer, absl::StatusCode::kInvalidArgument},
      {cudaErrorMemoryAllocation, absl::StatusCode::kResourceExhausted},
      {cudaErrorNoDevice, absl::StatusCode::kFailedPrecondition},
      {cudaErrorInsufficientDriver, absl::StatusCode::kFailedPrecondition},
      {cudaErrorDevicesUnavailable, absl::StatusCode::kFailedPrecondition},
      {cudaErrorInitializationError, absl::StatusCode::kFailedPrecondition},
      {cudaErrorNotReady, absl::StatusCode::kUnavailable},
      {cudaErrorIllegalAddress, absl::StatusCode::kInternal},
      {cudaErrorLaunchFailure, absl::StatusCode::kInternal},
  };
  for (const auto& c : cases) {
    const absl::Status status = CudaErrorToStatus(c.error, "cudaMalloc");
    EXPECT_EQ(status.code(), c.code) << cudaGetErrorName(c.error);
    EXPECT_EQ(status.message(), absl::StrCat("cudaMalloc: ", cudaGetErrorName(c.error), ": ",
                                             cudaGetErrorString(c.error)));
  }
}

TEST(NcclStatusTest, EveryDataTypeAndOpHasAnNcclEquivalent) {
  const struct {
    DataType type;
    ncclDataType_t nccl;
  } types[] = {
      {DataType::kFloat32, ncclFloat32}, {DataType::kFloat64, ncclFloat64},
      {DataType::kBFloat16, ncclBfloat16},
      {DataType::kFloat16, ncclFloat16}, {DataType::kInt32, ncclInt32},
      {DataType::kInt64, ncclInt64},     {DataType::kUInt8, ncclUint8},
  };
  for (const auto& t : types) {
    absl::StatusOr<ncclDataType_t> converted = ToNcclDataType(t.type);
    ASSERT_TRUE(converted.ok()) << DataTypeName(t.type);
    EXPECT_EQ(*converted, t.nccl) << DataTypeName(t.type);
  }
  EXPECT_EQ(ToNcclDataType(static_cast<DataType>(99)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ToNcclRedOp(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(*ToNcclRedOp(ReduceOp::kMax), ncclMax);
  EXPECT_EQ(ToNcclRedOp(static_cast<ReduceOp>(99)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Helpers.

// KvClient over a map, for ranks that are threads of one process. Thread-safe.
class InMemoryKvClient : public KvClient {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    changed_.SignalAll();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> WaitFor(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    while (values_.count(key) == 0) {
      if (changed_.WaitWithDeadline(&mu_, deadline) && values_.count(key) == 0) {
        return absl::DeadlineExceededError(absl::StrCat(key, " was never set"));
      }
    }
    return values_[key];
  }

 private:
  absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// The number of CUDA devices, 0 if none can be used; `why` says why not.
int VisibleDevices(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    *why = absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(error));
    return 0;
  }
  *why = absl::StrCat(count, " CUDA device(s) visible");
  return count;
}

// No usable device at all is "no GPU here" (a failure under
// COHORT_GPU_REQUIRED=1); some, but fewer than `n`, is this host's size, a
// skip everywhere.
#define REQUIRE_DEVICES(n)                                                                     \
  do {                                                                                         \
    std::string why;                                                                           \
    const int visible = VisibleDevices(&why);                                                  \
    if (visible == 0) {                                                                        \
      COHORT_SKIP_OR_FAIL_WITHOUT_GPU(                                                         \
          absl::StrCat("needs ", (n), " CUDA device(s) for NCCL; ", why));                     \
    }                                                                                          \
    if (visible < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA device(s) for NCCL; " << why; \
  } while (0)

// Host encoding of doubles as `type` (round to nearest) and back.
std::vector<uint8_t> Encode(DataType type, const std::vector<double>& values) {
  std::vector<uint8_t> bytes(values.size() * DataTypeSize(type));
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* out = bytes.data() + i * DataTypeSize(type);
    const double v = values[i];
    switch (type) {
      case DataType::kFloat32: {
        const float f = static_cast<float>(v);
        std::memcpy(out, &f, sizeof(f));
        break;
      }
      case DataType::kFloat64:
        std::memcpy(out, &v, sizeof(v));
        break;
      case DataType::kBFloat16: {
        const __nv_bfloat16 h = __float2bfloat16(static_cast<float>(v));
        std::memcpy(out, &h, sizeof(h));
        break;
      }
      case DataType::kFloat16: {
        const __half h = __float2half(static_cast<float>(v));
        std::memcpy(out, &h, sizeof(h));
        break;
      }
      case DataType::kInt32: {
        const int32_t x = static_cast<int32_t>(v);
        std::memcpy(out, &x, sizeof(x));
        break;
      }
      case DataType::kInt64: {
        const int64_t x = static_cast<int64_t>(v);
        std::memcpy(out, &x, sizeof(x));
        break;
      }
      case DataType::kUInt8:
        *out = static_cast<uint8_t>(v);
        break;
    }
  }
  return bytes;
}

// Inputs whose sums over two ranks are exact in every type (so the only
// rounding is the final one, the same on the host and in NCCL).
std::vector<double> InputValues(DataType type, size_t count, int seed) {
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 7919 + static_cast<uint64_t>(type));
  std::vector<double> values(count);
  for (double& v : values) {
    switch (type) {
      case DataType::kFloat32:
        v = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng));
        break;
      case DataType::kFloat64:
        v = std::uniform_real_distribution<double>(-1, 1)(rng);
        break;
      case DataType::kBFloat16:
      case DataType::kFloat16:
        v = static_cast<double>(std::uniform_int_distribution<int>(-64, 64)(rng)) / 8;
        break;
      case DataType::kInt32:
        v = std::uniform_int_distribution<int32_t>(-1'000'000, 1'000'000)(rng);
        break;
      case DataType::kInt64:
        v = static_cast<double>(
            std::uniform_int_distribution<int64_t>(-(1LL << 40), 1LL << 40)(rng));
        break;
      case DataType::kUInt8:
        v = std::uniform_int_distribution<int>(0, 100)(rng);
        break;
    }
  }
  return values;
}

// Device memory holding `bytes` bytes, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, bytes), cudaSuccess);
    }
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  void Upload(const std::vector<uint8_t>& host) {
    ASSERT_EQ(host.size(), bytes_);
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void Fill(uint8_t byte) { ASSERT_EQ(cudaMemset(ptr_, byte, bytes_), cudaSuccess); }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> host(bytes_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

NcclGroupSpec Spec(int rank, int size, const std::string& comm_id) {
  NcclGroupSpec spec;
  spec.rank = rank;
  spec.size = size;
  spec.comm_id = comm_id;
  spec.device = rank;
  return spec;
}

NcclCommunicatorOptions TestOptions() {
  NcclCommunicatorOptions options;
  options.init_timeout = absl::Seconds(60);
  options.finalize_timeout = absl::Seconds(5);
  return options;
}

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16,
                              DataType::kFloat16, DataType::kInt32,   DataType::kInt64,
                              DataType::kUInt8};

// ---------------------------------------------------------------------------
// Create: argument checks need no device.

TEST(NcclCommunicatorCreateTest, RejectsBadSpecsBeforeTouchingTheDevice) {
  InMemoryKvClient kv;
  const NcclCommunicatorOptions options = TestOptions();
  EXPECT_EQ(NcclCommunicator::Create(&kv, Spec(0, 0, "g"), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::Create(&kv, Spec(2, 2, "g"), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::Create(&kv, Spec(0, 1, ""), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  NcclGroupSpec negative_device = Spec(0, 1, "g");
  negative_device.device = -1;
  EXPECT_EQ(NcclCommunicator::Create(&kv, negative_device, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::Create(nullptr, Spec(0, 2, "g"), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclCommunicatorCreateTest, HostWithoutDeviceIsFailedPrecondition) {
  std::string why;
  if (VisibleDevices(&why) > 0) GTEST_SKIP() << "this host has a GPU (" << why << ")";
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
      NcclCommunicator::Create(nullptr, Spec(0, 1, "solo"), TestOptions());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
}

// ---------------------------------------------------------------------------
// One GPU: a one-rank group, where every collective is the identity.

TEST(NcclCommunicatorTest, SingleRankEveryCallMatchesHostReference) {
  REQUIRE_DEVICES(1);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> created =
      NcclCommunicator::Create(nullptr, Spec(0, 1, "solo"), TestOptions());
  ASSERT_TRUE(created.ok()) << created.status();
  NcclCommunicator& comm = **created;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);

  for (DataType type : kAllTypes) {
    SCOPED_TRACE(DataTypeName(type));
    for (size_t count : {size_t{1}, size_t{7}, size_t{1023}, size_t{(1 << 20) + 3}}) {
      SCOPED_TRACE(count);
      const std::vector<uint8_t> input = Encode(type, InputValues(type, count, 1));
      DeviceBuffer data(input.size());
      DeviceBuffer out(input.size());
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        data.Upload(input);
        ASSERT_TRUE(comm.AllReduce(data.get(), count, type, op, kTimeout).ok());
        EXPECT_EQ(data.Download(), input);
        // Out of place, into a poisoned buffer, so a no-op would be caught.
        data.Upload(input);
        out.Fill(0xAB);
        ASSERT_TRUE(comm.ReduceScatter(data.get(), out.get(), count, type, op, kTimeout).ok());
        EXPECT_EQ(out.Download(), input);
      }
      out.Fill(0xAB);
      ASSERT_TRUE(comm.AllGather(data.get(), out.get(), count, type, kTimeout).ok());
      EXPECT_EQ(out.Download(), input);
      ASSERT_TRUE(comm.AllGather(out.get(), out.get(), count, type, kTimeout).ok());  // in place
      EXPECT_EQ(out.Download(), input);
      ASSERT_TRUE(comm.Broadcast(data.get(), count, type, 0, kTimeout).ok());
      EXPECT_EQ(data.Download(), input);
    }
  }
  EXPECT_TRUE(comm.Barrier(kTimeout).ok());
  // Zero-sized calls need no buffer.
  EXPECT_TRUE(comm.AllReduce(nullptr, 0, DataType::kFloat32, ReduceOp::kSum, kTimeout).ok());
}

TEST(NcclCommunicatorTest, BadArgumentsAreInvalidArgumentAndLeaveItUsable) {
  REQUIRE_DEVICES(1);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> created =
      NcclCommunicator::Create(nullptr, Spec(0, 1, "solo-args"), TestOptions());
  ASSERT_TRUE(created.ok()) << created.status();
  NcclCommunicator& comm = **created;
  DeviceBuffer data(64);
  std::vector<float> host(16, 1.0f);

  const absl::Status host_pointer =
      comm.AllReduce(host.data(), host.size(), DataType::kFloat32, ReduceOp::kSum, kTimeout);
  EXPECT_EQ(host_pointer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(host_pointer.message()), HasSubstr("host memory"));
  EXPECT_EQ(comm.AllReduce(nullptr, 4, DataType::kFloat32, ReduceOp::kSum, kTimeout).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.Broadcast(data.get(), 16, DataType::kFloat32, 1, kTimeout).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.Send(data.get(), 64, 0, 0, kTimeout).code(),
            absl::StatusCode::kInvalidArgument);  // to itself
  EXPECT_EQ(comm.Recv(data.get(), 64, 1, 0, kTimeout).code(),
            absl::StatusCode::kInvalidArgument);  // no such peer
  const absl::Status tagged = comm.Send(data.get(), 64, 0, 7, kTimeout);
  EXPECT_EQ(tagged.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tagged.message()), HasSubstr("tags"));
  // Output overlapping input (not the in-place AllGather layout).
  char* base = static_cast<char*>(data.get());
  EXPECT_EQ(
      comm.ReduceScatter(base, base + 4, 8, DataType::kFloat32, ReduceOp::kSum, kTimeout).code(),
      absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(comm.AllReduce(data.get(), 16, DataType::kFloat32, ReduceOp::kSum, kTimeout).ok());
}

TEST(NcclCommunicatorTest, AbortMakesEveryLaterCallAborted) {
  REQUIRE_DEVICES(1);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> created =
      NcclCommunicator::Create(nullptr, Spec(0, 1, "solo-abort"), TestOptions());
  ASSERT_TRUE(created.ok()) << created.status();
  NcclCommunicator& comm = **created;
  DeviceBuffer data(64);
  comm.Abort(absl::CancelledError("job stopped"));
  comm.Abort(absl::CancelledError("second abort is ignored"));
  const absl::Status status =
      comm.AllReduce(data.get(), 16, DataType::kFloat32, ReduceOp::kSum, kTimeout);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("job stopped"));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("second abort")));
  EXPECT_EQ(comm.Barrier(kTimeout).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(comm.Broadcast(data.get(), 16, DataType::kFloat32, 0, kTimeout).code(),
            absl::StatusCode::kAborted);
}

// ---------------------------------------------------------------------------
// Two GPUs: ranks are threads, one device each.

// Runs `body(rank, comm)` on two threads with a fresh 2-rank communicator each.
// Rank 1 keeps its communicator alive until rank 0's body has returned, so a
// test where rank 1 stays silent sees a silent peer, not a departed one.
template <typename Body>
void RunTwoRanks(const std::string& comm_id, Body body) {
  InMemoryKvClient kv;
  absl::Notification rank0_done;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&kv, &comm_id, &body, &rank0_done, rank] {
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
          NcclCommunicator::Create(&kv, Spec(rank, 2, comm_id), TestOptions());
      if (!comm.ok()) {
        if (rank == 0) rank0_done.Notify();
        FAIL() << "rank " << rank << ": " << comm.status();
      }
      EXPECT_EQ(cudaSetDevice(rank), cudaSuccess);
      body(rank, **comm);
      if (rank == 0) {
        rank0_done.Notify();
      } else {
        EXPECT_TRUE(rank0_done.WaitForNotificationWithTimeout(absl::Seconds(120)));
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(NcclCommunicatorTest, TwoRanksMatchHostReference) {
  REQUIRE_DEVICES(2);
  constexpr size_t kCount = (1 << 20) + 3;
  // AllReduce results per type, op and rank, to check ranks agree bitwise.
  absl::Mutex results_mu;
  std::map<std::tuple<int, int, int>, std::vector<uint8_t>> results;

  RunTwoRanks("pair", [&](int rank, NcclCommunicator& comm) {
    for (DataType type : kAllTypes) {
      SCOPED_TRACE(DataTypeName(type));
      const std::vector<double> mine = InputValues(type, kCount, rank);
      const std::vector<double> rank0 = InputValues(type, kCount, 0);
      const std::vector<double> rank1 = InputValues(type, kCount, 1);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        std::vector<double> reduced(kCount);
        for (size_t i = 0; i < kCount; ++i) {
          reduced[i] = op == ReduceOp::kSum ? rank0[i] + rank1[i] : std::max(rank0[i], rank1[i]);
        }
        const std::vector<uint8_t> expected = Encode(type, reduced);
        DeviceBuffer data(expected.size());
        data.Upload(Encode(type, mine));
        ASSERT_TRUE(comm.AllReduce(data.get(), kCount, type, op, kTimeout).ok());
        const std::vector<uint8_t> got = data.Download();
        EXPECT_EQ(got, expected);
        {
          absl::MutexLock lock(&results_mu);
          results[{static_cast<int>(type), static_cast<int>(op), rank}] = got;
        }

        // ReduceScatter over an input of 2 blocks: this rank gets its block.
        const size_t half = kCount / 2;
        DeviceBuffer block(half * DataTypeSize(type));
        DeviceBuffer input(2 * half * DataTypeSize(type));
        input.Upload(Encode(type, std::vector<double>(mine.begin(), mine.begin() + 2 * half)));
        ASSERT_TRUE(comm.ReduceScatter(input.get(), block.get(), half, type, op, kTimeout).ok());
        const std::vector<double> my_block(reduced.begin() + rank * half,
                                           reduced.begin() + (rank + 1) * half);
        EXPECT_EQ(block.Download(), Encode(type, my_block));
      }
      // AllGather: rank r's input lands at block r.
      DeviceBuffer input(kCount * DataTypeSize(type));
      DeviceBuffer gathered(2 * kCount * DataTypeSize(type));
      input.Upload(Encode(type, mine));
      ASSERT_TRUE(comm.AllGather(input.get(), gathered.get(), kCount, type, kTimeout).ok());
      std::vector<double> both = rank0;
      both.insert(both.end(), rank1.begin(), rank1.end());
      EXPECT_EQ(gathered.Download(), Encode(type, both));
      // Broadcast from rank 1.
      input.Upload(Encode(type, mine));
      ASSERT_TRUE(comm.Broadcast(input.get(), kCount, type, 1, kTimeout).ok());
      EXPECT_EQ(input.Download(), Encode(type, rank1));
    }
    // Send/Recv: three messages of different sizes arrive in order.
    const size_t sizes[] = {1, 4096, 3 << 20};
    for (size_t i = 0; i < 3; ++i) {
      DeviceBuffer message(sizes[i]);
      if (rank == 0) {
        message.Fill(static_cast<uint8_t>(i + 1));
        ASSERT_TRUE(comm.Send(message.get(), sizes[i], 1, 0, kTimeout).ok());
      } else {
        ASSERT_TRUE(comm.Recv(message.get(), sizes[i], 0, 0, kTimeout).ok());
        EXPECT_EQ(message.Download(), std::vector<uint8_t>(sizes[i], static_cast<uint8_t>(i + 1)));
      }
    }
    EXPECT_TRUE(comm.Barrier(kTimeout).ok());
  });

  absl::MutexLock lock(&results_mu);
  for (DataType type : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      const int t = static_cast<int>(type), o = static_cast<int>(op);
      EXPECT_EQ(results[std::make_tuple(t, o, 0)], results[std::make_tuple(t, o, 1)])
          << DataTypeName(type) << " " << o;
    }
  }
}

TEST(NcclCommunicatorTest, SilentPeerTimesOutAndLeavesItUnusable) {
  REQUIRE_DEVICES(2);
  RunTwoRanks("silent", [](int rank, NcclCommunicator& comm) {
    if (rank != 0) return;  // rank 1 never sends
    DeviceBuffer data(1024);
    const absl::Time start = absl::Now();
    EXPECT_EQ(comm.Recv(data.get(), 1024, 1, 0, absl::Milliseconds(300)).code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    EXPECT_EQ(comm.Barrier(kTimeout).code(), absl::StatusCode::kFailedPrecondition);
  });
}

TEST(NcclCommunicatorTest, AbortFromAnotherThreadUnblocksAWaitingCall) {
  REQUIRE_DEVICES(2);
  RunTwoRanks("abort", [](int rank, NcclCommunicator& comm) {
    if (rank != 0) return;  // rank 1 never sends
    DeviceBuffer data(1024);
    absl::Status status;
    const absl::Time start = absl::Now();
    std::thread waiter([&] { status = comm.Recv(data.get(), 1024, 1, 0, absl::Seconds(60)); });
    // Whether the abort lands before or during the Recv, it must return Aborted.
    comm.Abort(absl::CancelledError("peer declared dead"));
    waiter.join();
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  });
}

}  // namespace
}  // namespace cohort::comm

#else  // !COHORT_HAVE_CUDA

TEST(NcclCommunicatorTest, NeedsCuda) {
  COHORT_SKIP_OR_FAIL_WITHOUT_GPU("built without CUDA (no nvcc): NcclCommunicator is not compiled");
}

#endif  // COHORT_HAVE_CUDA
