// Which devices a build's kernels run on (gpu_architectures.h): the
// decision the CUDA backend takes at creation, checked here without a GPU.

#include "worker/compute/gpu_architectures.h"

#include <string>

#include "gtest/gtest.h"

namespace cohort::compute {
namespace {

constexpr ComputeCapability kA100{8, 0}, kRtx3090{8, 6}, kL4{8, 9}, kH100{9, 0}, kB200{10, 0},
    kV100{7, 0}, kT4{7, 5};

bool Runs(absl::string_view architectures, ComputeCapability device) {
  absl::StatusOr<bool> runs = HasKernelImageFor(architectures, device);
  EXPECT_TRUE(runs.ok()) << runs.status();
  return runs.value_or(false);
}

TEST(GpuArchitecturesTest, TheDefaultListRunsOnAmpereHopperAndLaterButNotOlder) {
  // sm_80 machine code for 8.x, sm_90 for 9.0, compute_90 PTX compiled by
  // the driver for later majors.
  for (ComputeCapability device : {kA100, kRtx3090, kL4, kH100, kB200}) {
    EXPECT_TRUE(Runs("80;90", device)) << CapabilityName(device);
  }
  for (ComputeCapability device : {kV100, kT4}) {
    EXPECT_FALSE(Runs("80;90", device)) << CapabilityName(device);
  }
}

TEST(GpuArchitecturesTest, TheOldSm90OnlyListHadNoImageForAnA100) {
  EXPECT_FALSE(Runs("90", kA100));
  EXPECT_TRUE(Runs("90", kH100));
}

TEST(GpuArchitecturesTest, MachineCodeStaysWithinItsMajorAndPtxReachesLaterOnes) {
  EXPECT_TRUE(Runs("80-real", kRtx3090));
  EXPECT_FALSE(Runs("80-real", kH100));
  EXPECT_FALSE(Runs("86-real", kA100)) << "machine code needs a minor at least its own";
  EXPECT_TRUE(Runs("80-virtual", kH100));
  EXPECT_TRUE(Runs("80-virtual", kB200));
  EXPECT_FALSE(Runs("90-virtual", kA100));
}

TEST(GpuArchitecturesTest, ArchSpecificAndFamilyCodeIsBoundToItsArchitecture) {
  EXPECT_TRUE(Runs("90a", kH100));
  EXPECT_FALSE(Runs("90a", kB200)) << "sm_90a's code and PTX run on 9.0 alone";
  EXPECT_TRUE(Runs("100f", ComputeCapability{10, 3}));
  EXPECT_FALSE(Runs("100f", ComputeCapability{12, 0}));
  EXPECT_FALSE(Runs("100f", kH100));
}

TEST(GpuArchitecturesTest, CommasSpacesAndEmptyEntriesAreAccepted) {
  EXPECT_TRUE(Runs(" 80 , 90 ", kH100));
  EXPECT_TRUE(Runs("80,,90;", kA100));
  EXPECT_FALSE(Runs("", kH100)) << "an empty list has no image for anything";
}

TEST(GpuArchitecturesTest, AnEntryThatIsNotAnArchitectureIsInvalidArgumentNamingIt) {
  for (const char* bad : {"native", "all", "sm_90", "9", "90-fake", "-90", "90;x"}) {
    absl::StatusOr<bool> runs = HasKernelImageFor(bad, kH100);
    EXPECT_EQ(runs.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(std::string(runs.status().message()).find("CUDA architecture entry"),
              std::string::npos)
        << runs.status();
  }
}

TEST(GpuArchitecturesTest, ADeviceWithoutAnImageIsAFailedPreconditionNamingAllThree) {
  EXPECT_TRUE(CheckKernelImageFor("80,90", 0, "NVIDIA H200", kH100).ok());
  const absl::Status refused = CheckKernelImageFor("80,90", 1, "Tesla V100-SXM2-16GB", kV100);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  for (const char* part : {"CUDA device 1 (Tesla V100-SXM2-16GB)", "compute capability 7.0",
                           "CUDA architectures 80,90"}) {
    EXPECT_NE(std::string(refused.message()).find(part), std::string::npos)
        << part << " in " << refused;
  }
  EXPECT_EQ(CheckKernelImageFor("native", 0, "NVIDIA H100", kH100).code(),
            absl::StatusCode::kInternal);
}

// cmake/CohortCuda.cmake's list, as compiled into this binary: the devices
// the device check runs on (A100, H100, H200) must each find an image.
TEST(GpuArchitecturesTest, ThisBuildRunsOnA100H100AndH200) {
#if COHORT_HAVE_CUDA
  EXPECT_EQ(BuiltCudaArchitectures(), "80,90");
  for (ComputeCapability device : {kA100, kH100}) {  // an H200 is 9.0 too
    EXPECT_TRUE(Runs(BuiltCudaArchitectures(), device)) << CapabilityName(device);
  }
#else
  EXPECT_EQ(BuiltCudaArchitectures(), "");
#endif
}

}  // namespace
}  // namespace cohort::compute
