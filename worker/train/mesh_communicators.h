#pragma once
// MeshCommunicators: the UCX communicators of one rank's mesh groups (data,
// tensor, pipeline; one only where its group has more than one rank), built
// on a shared UcxContext. Used by the worker's EngineTrainer, the training
// tests' rank binary and the layout benchmark, so all three wire a mesh the
// same way.
//
// Thread-safety: as UcxCommunicator (Abort from any thread).

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cohort/v1/job.pb.h"
#include "worker/comm/hierarchical_communicator.h"
#include "worker/comm/mesh_groups.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"
#include "worker/model/model_layout.h"
#include "worker/train/training_session.h"

namespace cohort::train {

struct MeshCommunicators {
  // Flat or hierarchical (comm::HierarchicalCommunicator) by the hosts.
  std::unique_ptr<comm::Communicator> data;
  std::unique_ptr<comm::UcxCommunicator> tensor;
  std::unique_ptr<comm::UcxCommunicator> pipeline;

  TrainingGroups groups() const { return {data.get(), tensor.get(), pipeline.get()}; }
  // Aborts every communicator (in-flight and later calls return Aborted).
  void Abort(const absl::Status& reason);
};

// The communicators of `groups` on `context` (which must outlive them),
// made with `bootstrap` (which a data group spanning hosts uses again for its
// lanes' contexts); the data group's collectives by `data_algorithm`.
// Errors: HierarchicalCommunicator::Create's.
absl::StatusOr<MeshCommunicators> CreateMeshCommunicators(
    comm::UcxContext* context, const comm::UcxContextOptions& bootstrap,
    const comm::MeshGroups& groups,
    comm::CollectiveAlgorithm data_algorithm = comm::CollectiveAlgorithm::kAuto);

// The ModelLayout of the member at `self` in `mesh`.
model::ModelLayout LayoutOf(const v1::Mesh& mesh, const v1::MeshCoordinates& self);

// A complete mesh of dp x tp x pp ranks (coordinates from the layout
// library), with worker ids "rank-<r>" and `micro_batches` split over the
// data ranks by the planner's rule (layout::MicroBatchShares): the plan of
// tests and benchmarks that start their ranks themselves.
v1::Mesh LocalMesh(int dp, int tp, int pp, int micro_batches);

}  // namespace cohort::train
