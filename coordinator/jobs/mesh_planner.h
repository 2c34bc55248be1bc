#pragma once
// MeshPlanner: (parallelism of a job, live workers) -> mesh. Pure logic.
//
// Ranks and coordinates come from the layout library
// (common/layout/mesh_layout.h: Megatron's order, tensor fastest).
// The data-parallel degree dp is the largest value such that
//   min_workers <= dp * tp * pp <= min(max_workers, candidates)
//   and dp <= micro_batches (every data rank trains at least one of the
//   step's micro-batches; layout::MicroBatchShares splits them, unevenly
//   where dp does not divide them, and the mesh says how), or, with
//   even_shares (the transport's reduction), dp divides micro_batches.
// A tensor group (same data and pipeline coordinate) stays on one host when
// some host has tp unused candidates. With a previous mesh, surviving members
// keep their coordinates where those still exist in the new shape; the others
// fill the holes. Output is deterministic for the same inputs.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cohort/v1/job.pb.h"
#include "common/ids.h"
#include "common/layout/mesh_layout.h"

namespace cohort::coordinator {

struct PlannerWorker {
  WorkerId id;
  Incarnation incarnation;
  std::string host;
  int32_t device_index = 0;
};

using MeshShape = layout::MeshShape;

struct PlanRequest {
  int tensor = 1;
  int pipeline = 1;
  int min_workers = 1;
  int max_workers = 1;
  int micro_batches = 1;  // global_batch_size / micro_batch_size
  // dp must divide micro_batches (parallelism.reduction TRANSPORT); else any
  // dp up to micro_batches.
  bool even_shares = false;
  // Workers that may be used: current members and free workers alike.
  std::vector<PlannerWorker> candidates;
  // The job's current mesh, if any; members not among `candidates` are gone.
  const v1::Mesh* previous = nullptr;
};

class MeshPlanner {
 public:
  // The shape for `available` workers. InvalidArgument if the request can
  // never be met (e.g. tensor * pipeline > max_workers, or no dp within the
  // bounds fits the micro-batch count); FailedPrecondition when it could be
  // met with more workers ("need at least 4 workers, 3 available"). Messages
  // say why.
  static absl::StatusOr<MeshShape> ChooseShape(const PlanRequest& request, int available);

  // The mesh over request.candidates, members sorted by rank. Errors as
  // ChooseShape with available = candidates.size().
  static absl::StatusOr<v1::Mesh> Plan(const PlanRequest& request);
};

}  // namespace cohort::coordinator
