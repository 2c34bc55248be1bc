#pragma once
// Times coordinator::MeshPlanner::Plan in-process on synthetic workers, to
// report how long planning a large job takes on the coordinator.

#include "absl/status/statusor.h"
#include "tools/sim/sim_report.h"

namespace cohort::sim {

struct PlanBenchmarkOptions {
  int workers = 10000;
  int tensor = 8;
  int pipeline = 1;
  int workers_per_host = 8;  // hosts of this many devices each
  int runs = 5;
};

// Plans a mesh over `workers` candidates ("plan-<i>" on host
// "plan-host-<i / workers_per_host>") using all of them: data degree
// workers / (tensor * pipeline), micro-batches equal to it. Returns the median
// wall time of `runs` plans. InvalidArgument if workers is not a positive
// multiple of tensor * pipeline or runs < 1; Plan's own error otherwise.
absl::StatusOr<PlanTiming> TimeMeshPlanning(const PlanBenchmarkOptions& options);

}  // namespace cohort::sim
