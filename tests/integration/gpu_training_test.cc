// GPU jobs as separate processes that share one GPU (labels integration and
// gpu: tools/gpu-check runs this binary on a GPU machine; without a CUDA
// device every test skips, naming why, or fails so under
// COHORT_GPU_REQUIRED=1).
//
// Ranks on one GPU cannot share an NCCL communicator (NCCL refuses two ranks
// on one device), so these runs take the UCX path: each rank's layers run
// on the CUDA backend and stage weights, gradients, pipeline exchanges and
// tensor all-reduces through page-locked host memory (gpt_model.h). The
// expectations are the CPU's (model_parallel_test.cc, elastic_test.cc):
//
//   layouts (cohort-train-test-rank, fp32, the small GPT, 20 steps), against
//   the single-process GPU run:
//     (1,1,2) and (2,1,2) with ZeRO-1: bitwise equal, every loss and every
//       weight after 20 steps (a pipeline runs the same kernels on the same
//       micro-batches; data ranks sum in the fixed tree's order);
//     (1,2,1) and (1,2,2): within the CPU layouts' bounds (step-0 loss 1e-6
//       absolute, step-0 gradients 1e-5 relative per tensor, losses
//       1e-5 * (1 + t)): tensor parallelism splits the matmuls' sums;
//     (2,2,2) with ZeRO-1: bitwise equal to (1,2,2) (the data-parallel
//       degree never changes the bits);
//   and the single-process GPU run against the CPU's: step-0 loss 1e-5,
//   gradients 1e-4 relative per tensor, losses 1e-4 * (1 + t) (the bounds
//   of gpt_cuda_parity_test.cc: the GPU sums in other orders).
//
//   elastic (coordinator + GPU workers, the job's default precision, bf16):
//     a member killed with SIGKILL mid-job is replaced by the spare, and
//     the trajectory equals the fault-free run's bit for bit;
//     without a spare the mesh shrinks to the survivor, bitwise too;
//     a killed member of a tensor group (dp 2 x tp 2): the survivors
//     shrink to the other replica (dp 1 x tp 2), bitwise too.

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/elastic_cluster.h"
#include "tests/integration/layout_runs.h"
#include "tests/testing/gpu_required.h"
#include "worker/compute/backend_factory.h"

namespace cohort::testing {
namespace {

// Why this machine cannot run the tests (empty: it can). Probed once, in
// this process: a CUDA backend on device 0.
const std::string& NoGpu() {
  static const std::string* reason = [] {
    absl::StatusOr<std::unique_ptr<compute::Backend>> probe =
        compute::CreateBackend(compute::BackendOptions{.kind = compute::BackendKind::kCuda});
    return new std::string(probe.ok() ? "" : probe.status().ToString());
  }();
  return *reason;
}

// Skips, or fails under COHORT_GPU_REQUIRED=1, where NoGpu() has a reason.
#define COHORT_SKIP_WITHOUT_GPU() \
  if (!NoGpu().empty()) COHORT_SKIP_OR_FAIL_WITHOUT_GPU("no CUDA backend here: " + NoGpu())

void ExpectBitwise(const std::string& name, const RunResult& got, const RunResult& ref) {
  ASSERT_TRUE(got.ok && ref.ok) << name;
  EXPECT_EQ(got.losses_text, ref.losses_text) << name;
  ASSERT_EQ(got.params.size(), ref.params.size()) << name;
  EXPECT_EQ(std::memcmp(got.params.data(), ref.params.data(), ref.params.size() * sizeof(float)), 0)
      << name << ": parameters after " << kSteps << " steps differ";
  std::printf("%-24s bitwise equal: %zu losses, %zu parameters\n", name.c_str(), got.losses.size(),
              got.params.size());
}

TEST(GpuLayoutsTest, EveryParallelismMatchesTheSingleProcessGpuRun) {
  COHORT_SKIP_WITHOUT_GPU();
  const RankOptions gpu{.backend = "cuda", .precision = "fp32"};
  RankOptions reference_options = gpu;
  reference_options.tie_per_step = true;  // as a pipeline adds the tied parts
  const RunResult reference = Train(Layout{}, reference_options);
  ASSERT_TRUE(reference.ok);

  RankOptions cpu_options = reference_options;
  cpu_options.backend = "cpu";
  ExpectClose("(1,1,1) GPU vs CPU", reference, Train(Layout{}, cpu_options),
              Tolerances{.first_loss = 1e-5, .gradient = 1e-4, .trajectory = 1e-4});

  RankOptions zero1 = gpu;
  zero1.zero1 = true;
  ExpectBitwise("(1,1,2)", Train(Layout{1, 1, 2}, gpu), reference);
  ExpectBitwise("(2,1,2) ZeRO-1", Train(Layout{2, 1, 2}, zero1), reference);
  ExpectClose("(1,2,1)", Train(Layout{1, 2, 1}, gpu), reference);
  const RunResult tensor_pipeline = Train(Layout{1, 2, 2}, gpu);
  ExpectClose("(1,2,2)", tensor_pipeline, reference);
  ExpectBitwise("(2,2,2) ZeRO-1 vs (1,2,2)", Train(Layout{2, 2, 2}, zero1), tensor_pipeline);
}

class GpuElasticTest : public ElasticTest {
 protected:
  void SetUp() override {
    COHORT_SKIP_WITHOUT_GPU();
    gpu_workers_ = true;
  }

  // ElasticSpec as a GPU job. A step of this model takes milliseconds on a
  // GPU: enough steps that a kill lands while the job runs.
  static v1::JobSpec GpuSpec(const std::string& name, int min_workers, int max_workers,
                             int tensor = 1) {
    v1::JobSpec spec = ElasticSpec(name, tensor, 1, min_workers, max_workers, /*zero1=*/true,
                                   /*steps=*/600);
    spec.set_device_kind(v1::DEVICE_KIND_GPU);
    return spec;
  }
};

TEST_F(GpuElasticTest, AKilledRankIsReplacedByTheSpareBitwise) {
  StartCluster(3);
  const v1::Job job = KillMemberAndCompare("GPU dp 2, the spare replaces rank 1, ZeRO-1",
                                           GpuSpec("gpu-spare", 2, 2), 2, 1);
  EXPECT_EQ(job.recovery_stats().spare(), 1);
  EXPECT_EQ(job.mesh().members_size(), 2);
}

TEST_F(GpuElasticTest, WithoutASpareTheMeshShrinksToTheSurvivorBitwise) {
  StartCluster(2);
  const v1::Job job = KillMemberAndCompare("GPU dp 2 -> 1 without a spare, ZeRO-1",
                                           GpuSpec("gpu-shrink", 1, 2), 2, 1);
  EXPECT_EQ(job.mesh().data_parallel(), 1);
}

TEST_F(GpuElasticTest, AKilledTensorGroupMemberShrinksToTheOtherReplicaBitwise) {
  StartCluster(4);
  const v1::Job job = KillMemberAndCompare("GPU dp 2 x tp 2 -> dp 1 x tp 2, rank 3 killed, ZeRO-1",
                                           GpuSpec("gpu-tensor", 2, 4, /*tensor=*/2), 4, 3);
  EXPECT_EQ(job.mesh().members_size(), 2);
}

}  // namespace
}  // namespace cohort::testing
