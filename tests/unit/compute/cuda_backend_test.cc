// The CUDA backend's creation and memory errors, its GEMMs' pinned math and
// their operands at any alignment. The argument checks run on every machine
// (they come before any device is touched); the rest needs a device and
// skips, naming the reason, without one (fails so under
// COHORT_GPU_REQUIRED=1: tests/testing/gpu_required.h).

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/gpu_required.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/backend_factory.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::compute {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> MakeCuda(BackendOptions options) {
  options.kind = BackendKind::kCuda;
  return CreateBackend(options);
}

// Sets (or, with nullopt, unsets) NVIDIA_TF32_OVERRIDE for the test's
// scope and restores what was there.
class ScopedTf32Override {
 public:
  explicit ScopedTf32Override(std::optional<std::string> value) {
    if (const char* old = std::getenv(kName)) old_ = old;
    if (value.has_value()) {
      setenv(kName, value->c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }
  ~ScopedTf32Override() {
    if (old_.has_value()) {
      setenv(kName, old_->c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }

 private:
  static constexpr const char* kName = "NVIDIA_TF32_OVERRIDE";
  std::optional<std::string> old_;
};

TEST(CudaBackendTest, EveryPrecisionIsBuiltLikeFp32) {
  // No precision is refused for itself: each fails or succeeds as fp32 does
  // on this machine (FailedPrecondition without a device). tf32 is refused
  // under NVIDIA_TF32_OVERRIDE=0 (below), which this machine may set.
  const ScopedTf32Override unset(std::nullopt);
  const absl::StatusCode fp32 = MakeCuda(BackendOptions{}).status().code();
  for (Precision precision : {Precision::kTf32, Precision::kBf16}) {
    EXPECT_EQ(MakeCuda(BackendOptions{.precision = precision}).status().code(), fp32)
        << PrecisionName(precision);
  }
}

TEST(CudaBackendTest, ANegativeDeviceIndexIsRefused) {
  const absl::Status status = MakeCuda(BackendOptions{.device_index = -1}).status();
#if COHORT_HAVE_CUDA
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("device_index"), std::string::npos) << status;
#else
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
#endif
}

TEST(CudaBackendTest, NoDeviceIsAFailedPreconditionNamingIt) {
  const absl::Status status = MakeCuda(BackendOptions{}).status();
  if (status.ok()) GTEST_SKIP() << "this machine has a CUDA device";
#if COHORT_HAVE_CUDA
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(std::string(status.message()).find("CUDA device"), std::string::npos) << status;
#else
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
#endif
}

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status status = MakeCuda(BackendOptions{}).status();
    if (!status.ok()) COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no CUDA backend here: " + status.ToString());
  }
};

TEST_F(CudaDeviceTest, AnArenaLargerThanTheDeviceFailsAtCreation) {
  const absl::Status status =
      MakeCuda(BackendOptions{.arena_bytes = size_t{1} << 50}).status();  // 1 PiB
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(std::string(status.message()).find("bytes free"), std::string::npos) << status;
}

TEST_F(CudaDeviceTest, AllocationsComeFromTheArenaUntilItIsFull) {
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeCuda(BackendOptions{.arena_bytes = size_t{1} << 20});
  ASSERT_TRUE(backend.ok()) << backend.status();
  absl::StatusOr<Buffer> a = (*backend)->Allocate(DType::kFloat32, 128 * 1024);  // 512 KiB
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Buffer> b = (*backend)->Allocate(DType::kFloat32, 192 * 1024);  // 768 KiB
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_NE(std::string(b.status().message()).find("524288 of 1048576 free"), std::string::npos)
      << b.status();
  // Allocated memory reads as zero; freed memory is reused.
  std::vector<float> host(a->numel(), 1.0f);
  (*backend)->CopyToHost(host.data(), a->span());
  ASSERT_TRUE((*backend)->Synchronize().ok());
  EXPECT_EQ(host, std::vector<float>(a->numel(), 0.0f));
  *a = Buffer();
  absl::StatusOr<Buffer> c = (*backend)->Allocate(DType::kFloat32, 192 * 1024);
  EXPECT_TRUE(c.ok()) << c.status();
}

// A backend on a 256 KiB arena that ran attention where its scratch could
// not grow: 96 KiB of operands + 120 KiB of filler leave 40 KiB, and
// attention wants 64 KiB of head-major copies. The failure is pending.
struct StarvedBackend {
  std::unique_ptr<Backend> backend;
  std::vector<Buffer> buffers;  // qkv, out, state, filler; released before the backend
};

StarvedBackend RunAttentionWithoutRoomForItsScratch() {
  constexpr int B = 1, T = 64, C = 64, NH = 2;
  StarvedBackend starved;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeCuda(BackendOptions{.arena_bytes = size_t{256} << 10});
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return starved;
  starved.backend = *std::move(backend);
  Backend& be = *starved.backend;
  for (size_t numel : {size_t{B} * T * 3 * C, size_t{B} * T * C, be.AttentionStateNumel(B, T, C, NH),
                       size_t{120 * 1024 / 4}}) {
    absl::StatusOr<Buffer> buffer = be.Allocate(DType::kFloat32, numel);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return starved;
    starved.buffers.push_back(*std::move(buffer));
  }
  const std::vector<Buffer>& b = starved.buffers;
  be.AttentionForward(b[1].span(), b[2].span(), b[0].span(), B, T, C, NH);
  return starved;
}

TEST_F(CudaDeviceTest, ScratchThatCannotGrowIsReportedBySynchronize) {
  const StarvedBackend starved = RunAttentionWithoutRoomForItsScratch();
  ASSERT_EQ(starved.buffers.size(), 4u);
  Backend& be = *starved.backend;
  const absl::Status status = be.Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(be.Synchronize().ok()) << "the failure is reported once";
}

TEST_F(CudaDeviceTest, ScratchIsReservedUpFrontOrRefusedThere) {
  // Attention's score gradients alone: 4 x 2 heads x 256 x 256 floats = 2 MiB.
  const PassShape shape{.max_batch = 4,
                        .max_seq = 256,
                        .attention_width = 64,
                        .heads = 2,
                        .max_bias_columns = 256,
                        .vocab_rows = 512};
  absl::StatusOr<std::unique_ptr<Backend>> small =
      MakeCuda(BackendOptions{.arena_bytes = size_t{1} << 20});
  ASSERT_TRUE(small.ok()) << small.status();
  const absl::Status refused = (*small)->ReserveScratch(shape);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(std::string(refused.message()).find("scratch"), std::string::npos) << refused;
  EXPECT_TRUE((*small)->Synchronize().ok()) << "the refusal is not left pending";
  absl::StatusOr<std::unique_ptr<Backend>> large =
      MakeCuda(BackendOptions{.arena_bytes = size_t{64} << 20});
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_TRUE((*large)->ReserveScratch(shape).ok());
}

// A failure pending from an earlier op is Synchronize's to report: calls
// between the op and Synchronize that themselves return a status (host
// staging, the scratch reservation) return it too, and leave it pending.
// Issue 45: both took and cleared it, and Synchronize then returned OK for
// the failed op.
TEST_F(CudaDeviceTest, AFailurePendingBeforeAllocateHostOrReserveScratchStaysForSynchronize) {
  const StarvedBackend starved = RunAttentionWithoutRoomForItsScratch();
  ASSERT_EQ(starved.buffers.size(), 4u);
  Backend& be = *starved.backend;

  const absl::StatusOr<Buffer> staging = be.AllocateHost(DType::kFloat32, 1024);
  EXPECT_EQ(staging.status().code(), absl::StatusCode::kResourceExhausted) << staging.status();
  const absl::Status reserved = be.ReserveScratch(PassShape{
      .max_batch = 1, .max_seq = 8, .attention_width = 8, .heads = 1, .max_bias_columns = 8});
  EXPECT_EQ(reserved.code(), absl::StatusCode::kResourceExhausted) << reserved;
  const absl::Status synchronized = be.Synchronize();
  EXPECT_EQ(synchronized.code(), absl::StatusCode::kResourceExhausted) << synchronized;
  EXPECT_NE(std::string(synchronized.message()).find("scratch for an op"), std::string::npos)
      << "Synchronize reports the attention's failure: " << synchronized;
  EXPECT_TRUE(be.Synchronize().ok()) << "and only once";
  EXPECT_TRUE(be.AllocateHost(DType::kFloat32, 1024).ok()) << "then the backend works again";
}

TEST_F(CudaDeviceTest, ASideCopyDrainsWhatTheStreamWroteBeforeItWhileLaterOpsRunBeside) {
  // A checkpoint's drain (train::DeviceSnapshot): CopyWithin then
  // CopyToHostSide; the side copy must see the CopyWithin (ordered after the
  // ops issued before it) and not the Zero issued after it into the live
  // buffer, and its Wait may run on another thread.
  absl::StatusOr<std::unique_ptr<Backend>> created = MakeCuda(BackendOptions{});
  ASSERT_TRUE(created.ok()) << created.status();
  Backend& be = **created;
  constexpr size_t kCount = size_t{1} << 24;  // 64 MiB: the copy takes a while
  absl::StatusOr<Buffer> live = be.Allocate(DType::kFloat32, kCount);
  absl::StatusOr<Buffer> snapshot = be.Allocate(DType::kFloat32, kCount);
  absl::StatusOr<Buffer> host = be.AllocateHost(DType::kFloat32, kCount);
  ASSERT_TRUE(live.ok() && snapshot.ok() && host.ok());
  std::vector<float> values(kCount);
  for (size_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(i % 4099) + 0.5f;
  be.CopyFromHost(live->span(), values.data());
  be.CopyWithin(snapshot->span(), live->span());
  std::unique_ptr<SideCopy> drain = be.CopyToHostSide(host->data(), snapshot->span());
  be.Zero(live->span());  // the next step, beside the drain
  absl::Status waited;
  std::thread uploader([&] { waited = drain->Wait(); });
  uploader.join();
  ASSERT_TRUE(waited.ok()) << waited;
  ASSERT_TRUE(be.Synchronize().ok());
  const float* drained = static_cast<const float*>(host->data());
  for (size_t i = 0; i < kCount; i += 4097) ASSERT_EQ(drained[i], values[i]) << i;
  std::vector<float> after(16, 1.0f);
  be.CopyToHost(after.data(), live->Slice(0, 16));
  EXPECT_EQ(after[3], 0.0f) << "the Zero ran on the step's stream";
}

TEST_F(CudaDeviceTest, Tf32IsRefusedWhereNvidiaTf32OverrideWouldMakeItFp32) {
  const ScopedTf32Override zero("0");
  const absl::Status tf32 = MakeCuda(BackendOptions{.precision = Precision::kTf32}).status();
  EXPECT_EQ(tf32.code(), absl::StatusCode::kFailedPrecondition) << tf32;
  EXPECT_NE(std::string(tf32.message()).find("NVIDIA_TF32_OVERRIDE"), std::string::npos) << tf32;
  // fp32's GEMMs are pedantic and bf16's operands are not fp32: the
  // variable changes neither, so neither is refused.
  EXPECT_TRUE(MakeCuda(BackendOptions{.precision = Precision::kFp32}).ok());
  EXPECT_TRUE(MakeCuda(BackendOptions{.precision = Precision::kBf16}).ok());
}

// Views 4 and 8 bytes past a 256-byte boundary, and 75 channels (300-byte
// columns): cuBLASLt is told each operand's alignment, and where it offers
// no algorithm the backend falls back to cublasGemmEx. Either way the
// product is the CPU's within fp32's rounding, and a repeat gives the same
// bits (the plan is chosen once per shape and alignment).
TEST_F(CudaDeviceTest, LinearLayersAtAnyOperandAlignmentGiveTheCpusProduct) {
  constexpr int N = 14, C = 75, OC = 225;
  absl::StatusOr<std::unique_ptr<Backend>> created = MakeCuda(BackendOptions{});
  ASSERT_TRUE(created.ok()) << created.status();
  Backend& gpu = **created;
  CpuBackend cpu(CpuBackendOptions{.num_threads = 1});
  const std::vector<float> x = ref::RandomFloats(size_t{N} * C, 1);
  const std::vector<float> w = ref::RandomFloats(size_t{OC} * C, 2);
  const std::vector<float> dy = ref::RandomFloats(size_t{N} * OC, 3);
  std::vector<float> cpu_y(size_t{N} * OC), cpu_dx(x.size()), cpu_dw(w.size());
  {
    std::vector<float> xc = x, wc = w, dyc = dy;
    cpu.MatmulForward(ref::Span(cpu_y), ref::Span(xc), ref::Span(wc), TensorSpan{}, N, C, OC);
    cpu.MatmulBackward(ref::Span(cpu_dx), ref::Span(cpu_dw), TensorSpan{}, ref::Span(dyc),
                       ref::Span(xc), ref::Span(wc), N, C, OC);
  }
  for (size_t shift : {size_t{0}, size_t{1}, size_t{2}}) {  // floats past the boundary
    SCOPED_TRACE(::testing::Message() << "operands " << 4 * shift << " bytes past 256");
    // x, w, dy, y, dx, dw, each `shift` floats into its buffer.
    const size_t sizes[] = {x.size(), w.size(), dy.size(), cpu_y.size(), x.size(), w.size()};
    std::vector<Buffer> buffers;
    std::vector<TensorSpan> spans;
    for (size_t n : sizes) {
      absl::StatusOr<Buffer> buffer = gpu.Allocate(DType::kFloat32, n + shift);
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      spans.push_back(buffer->Slice(shift, n));
      buffers.push_back(std::move(*buffer));
    }
    const TensorSpan sx = spans[0], sw = spans[1], sdy = spans[2];
    const TensorSpan sy = spans[3], sdx = spans[4], sdw = spans[5];
    gpu.CopyFromHost(sx, x.data());
    gpu.CopyFromHost(sw, w.data());
    gpu.CopyFromHost(sdy, dy.data());
    std::vector<float> runs[2][3];
    for (auto& run : runs) {
      gpu.Zero(sdx);
      gpu.Zero(sdw);
      gpu.MatmulForward(sy, sx, sw, TensorSpan{}, N, C, OC);
      gpu.MatmulBackward(sdx, sdw, TensorSpan{}, sdy, sx, sw, N, C, OC);
      run[0].resize(cpu_y.size());
      run[1].resize(x.size());
      run[2].resize(w.size());
      gpu.CopyToHost(run[0].data(), sy);
      gpu.CopyToHost(run[1].data(), sdx);
      gpu.CopyToHost(run[2].data(), sdw);
      ASSERT_TRUE(gpu.Synchronize().ok());
    }
    EXPECT_LT(ref::RelativeError(runs[0][0], ref::ToDouble(cpu_y)), 1e-5);
    EXPECT_LT(ref::RelativeError(runs[0][1], ref::ToDouble(cpu_dx)), 1e-5);
    EXPECT_LT(ref::RelativeError(runs[0][2], ref::ToDouble(cpu_dw)), 1e-5);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "output " << i;
  }
}

}  // namespace
}  // namespace cohort::compute
