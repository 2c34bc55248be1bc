#include "worker/device/device_discovery.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/gpu_required.h"
#include "worker/device/cpu_device.h"

namespace cohort::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CpuDeviceTest, ReportsThisHost) {
  const absl::StatusOr<DeviceInfo> cpu = DiscoverDevice(v1::DEVICE_KIND_CPU, 2);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->kind, v1::DEVICE_KIND_CPU);
  EXPECT_EQ(cpu->index, 2);
  EXPECT_GE(cpu->cores, 1);
  EXPECT_EQ(static_cast<unsigned>(cpu->cores), std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_GT(cpu->memory_bytes, 0);
  EXPECT_FALSE(cpu->name.empty());
}

TEST(CpuDeviceTest, NegativeIndexIsInvalid) {
  EXPECT_EQ(DiscoverDevice(v1::DEVICE_KIND_CPU, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuDeviceTest, ParsesProcText) {
  EXPECT_EQ(ParseMemTotalBytes("MemTotal:       16318768 kB\nMemFree:  1 kB\n"),
            int64_t{16318768} * 1024);
  EXPECT_EQ(ParseMemTotalBytes("MemFree: 5 kB\n"), 0);
  EXPECT_EQ(ParseMemTotalBytes("MemTotal: lots kB\n"), 0);
  EXPECT_EQ(ParseCpuModel("processor\t: 0\nvendor_id\t: X\nmodel name\t: Example CPU @ 2GHz\n"
                          "processor\t: 1\nmodel name\t: Example CPU @ 2GHz\n"),
            "Example CPU @ 2GHz");
  EXPECT_EQ(ParseCpuModel("processor\t: 0\n"), "");
}

TEST(DeviceDiscoveryTest, CapabilitiesOfACpuWorker) {
  DeviceInfo cpu;
  cpu.kind = v1::DEVICE_KIND_CPU;
  cpu.name = "Example CPU";
  cpu.memory_bytes = 1 << 30;
  cpu.cores = 8;
  const v1::Capabilities capabilities = CapabilitiesFor(cpu);
  EXPECT_EQ(capabilities.cpu_cores(), 8);
  EXPECT_EQ(capabilities.memory_bytes(), 1 << 30);
  EXPECT_EQ(capabilities.device_name(), "Example CPU");
  EXPECT_THAT(capabilities.transports(), ElementsAre());
}

TEST(DeviceDiscoveryTest, CapabilitiesOfAGpuWorker) {
  DeviceInfo gpu;
  gpu.kind = v1::DEVICE_KIND_GPU;
  gpu.index = 1;
  gpu.name = "Example GPU";
  gpu.memory_bytes = int64_t{80} << 30;
  gpu.cores = 132;
  const v1::Capabilities capabilities = CapabilitiesFor(gpu);
  EXPECT_EQ(capabilities.memory_bytes(), int64_t{80} << 30);
  EXPECT_GE(capabilities.cpu_cores(), 1);  // host cores, not SMs
  EXPECT_THAT(capabilities.transports(), ElementsAre());
}

TEST(DeviceDiscoveryTest, GpuDiscoveryAndSelfTest) {
  const absl::StatusOr<DeviceInfo> gpu = DiscoverDevice(v1::DEVICE_KIND_GPU, 0);
  if (!BuildHasCuda()) {
    ASSERT_EQ(gpu.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(gpu.status().message(), HasSubstr("this build has no CUDA support"));
    COHORT_SKIP_OR_FAIL_WITHOUT_GPU("built without CUDA: " + gpu.status().ToString());
  }
  if (gpu.status().code() == absl::StatusCode::kFailedPrecondition) {
    EXPECT_THAT(gpu.status().message(), HasSubstr("CUDA"));
    COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no usable GPU here: " + gpu.status().ToString());
  }
  // A GPU is present: discovery and the self-test kernel must both succeed.
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->kind, v1::DEVICE_KIND_GPU);
  EXPECT_EQ(gpu->index, 0);
  EXPECT_FALSE(gpu->name.empty());
  EXPECT_GT(gpu->memory_bytes, 0);
  EXPECT_GT(gpu->cores, 0);
  EXPECT_FALSE(gpu->compute_capability.empty());
}

TEST(DeviceDiscoveryTest, GpuIndexBeyondTheDevicesIsRefused) {
  const absl::StatusOr<DeviceInfo> gpu = DiscoverDevice(v1::DEVICE_KIND_GPU, 4096);
  ASSERT_FALSE(gpu.ok());
  // InvalidArgument where GPUs exist; without any, the missing device is reported first.
  EXPECT_THAT(gpu.status().code(), ::testing::AnyOf(absl::StatusCode::kInvalidArgument,
                                                    absl::StatusCode::kFailedPrecondition,
                                                    absl::StatusCode::kUnimplemented));
}

}  // namespace
}  // namespace cohort::worker
