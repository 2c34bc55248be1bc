// The run-time cuDNN loader and the attention graph's descriptors, on the
// CPU: loading needs no device, and cuDNN finalizes tensor and operation
// descriptors, and (9.19) the operation graph, without a handle, so an
// attribute cuDNN refuses (a wrong type, a shape mismatch between an
// operation's operands, a tensor nothing produces) shows here. The engine
// choice and the plan need a handle, hence a device: the gpu test's
// (cuda_backend_attention_test.cc).

#include <gtest/gtest.h>

#include <string>

#if defined(COHORT_HAVE_CUDA)
#include "worker/compute/cuda_cudnn_library.h"
#include "worker/compute/cuda_cudnn_sdpa.h"
#endif

namespace cohort::compute {
namespace {

#if defined(COHORT_HAVE_CUDA)

TEST(CudnnLibraryTest, AnExplicitPathThatDoesNotLoadIsNamedInTheError) {
  auto library = CudnnLibrary::Load({.path = "/nonexistent/libcudnn.so.9"});
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(library.status().message().find("/nonexistent/libcudnn.so.9"), std::string::npos)
      << library.status();
}

TEST(CudnnLibraryTest, AFileThatIsNotCudnnIsRefused) {
  // A real shared library without cuDNN's entry points.
  auto library = CudnnLibrary::Load({.path = "libm.so.6"});
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(library.status().message().find("cudnnGetVersion"), std::string::npos)
      << library.status();
}

TEST(CudnnLibraryTest, TheSearchStartsWithTheDynamicLoadersOwnSearch) {
  const std::vector<std::string> candidates = CudnnSearchCandidates();
  ASSERT_GE(candidates.size(), 2u);
  EXPECT_EQ(candidates[0], "libcudnn.so.9");
  EXPECT_EQ(candidates[1], "/usr/local/cuda/lib64/libcudnn.so.9");
}

TEST(CudnnLibraryTest, VersionTextIsMajorMinorPatch) {
  EXPECT_EQ(CudnnVersionText(91900), "9.19.0");
  EXPECT_EQ(CudnnVersionText(90002), "9.0.2");
}

// The installed library (the build compiled against its headers): where it
// is absent the test says so and skips; the loader's fallback is the point.
absl::StatusOr<std::unique_ptr<CudnnLibrary>> Installed() { return CudnnLibrary::Load({}); }

TEST(CudnnLibraryTest, TheInstalledLibraryLoadsAndReportsItsVersion) {
  auto library = Installed();
  if (!library.ok()) GTEST_SKIP() << "no cuDNN here: " << library.status();
  EXPECT_GE((*library)->version(), kMinCudnnVersion);
  EXPECT_EQ((*library)->version() / 10000, kCudnnMajor);
  EXPECT_FALSE((*library)->path().empty());
  std::cout << "cuDNN " << (*library)->VersionText() << " from " << (*library)->path() << "\n";
}

TEST(CudnnSdpaGraphTest, ForwardAndBackwardDescriptorsFinalizeWithoutADevice) {
  auto library = Installed();
  if (!library.ok()) GTEST_SKIP() << "no cuDNN here: " << library.status();
  for (const sdpa::Shape shape : {sdpa::Shape{2, 64, 4, 16}, sdpa::Shape{2, 1024, 12, 64}}) {
    for (const sdpa::Direction direction : {sdpa::Direction::kForward, sdpa::Direction::kBackward}) {
      absl::StatusOr<sdpa::OperationSet> ops = sdpa::BuildOperations(**library, shape, direction);
      ASSERT_TRUE(ops.ok()) << ops.status();
      // forward: 2 products, scale, 2 indices, compare, select, max, sub,
      // exp, sum, log, add, div; backward: 5 products, 3 reshapes and 14
      // pointwise or reductions.
      EXPECT_EQ(ops->ops.size(), direction == sdpa::Direction::kForward ? 14u : 22u);
      // The whole graph too: cuDNN checks that it is connected and that
      // every operation's operands agree.
      absl::StatusOr<sdpa::Descriptor> graph = sdpa::BuildGraph(**library, nullptr, *ops);
      EXPECT_TRUE(graph.ok()) << graph.status();
    }
  }
}

TEST(CudnnSdpaGraphTest, AnUnsupportedHeadWidthIsRefusedBeforeCudnnSeesIt) {
  auto library = Installed();
  if (!library.ok()) GTEST_SKIP() << "no cuDNN here: " << library.status();
  auto ops = sdpa::BuildOperations(**library, sdpa::Shape{1, 8, 2, 12}, sdpa::Direction::kForward);
  ASSERT_FALSE(ops.ok());
  EXPECT_EQ(ops.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ops.status().message().find("multiple of 8"), std::string::npos) << ops.status();
}

#else

TEST(CudnnLibraryTest, NotBuiltWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace cohort::compute
