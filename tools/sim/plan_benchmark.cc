#include "tools/sim/plan_benchmark.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/jobs/mesh_planner.h"
#include "tools/sim/latency_stats.h"

namespace cohort::sim {

absl::StatusOr<PlanTiming> TimeMeshPlanning(const PlanBenchmarkOptions& options) {
  const int group = options.tensor * options.pipeline;
  if (options.workers <= 0 || group <= 0 || options.workers % group != 0 || options.runs < 1 ||
      options.workers_per_host < 1) {
    return absl::InvalidArgumentError(absl::StrCat("plan benchmark: workers (", options.workers,
                                                   ") must be a positive multiple of tensor * "
                                                   "pipeline (",
                                                   group, "), runs (", options.runs,
                                                   ") and workers_per_host (",
                                                   options.workers_per_host, ") at least 1"));
  }
  coordinator::PlanRequest request;
  request.tensor = options.tensor;
  request.pipeline = options.pipeline;
  request.min_workers = group;
  request.max_workers = options.workers;
  request.micro_batches = options.workers / group;
  request.candidates.reserve(options.workers);
  for (int i = 0; i < options.workers; ++i) {
    coordinator::PlannerWorker worker;
    worker.id = WorkerId(absl::StrCat("plan-", i));
    worker.incarnation = Incarnation(static_cast<uint64_t>(i) + 1);
    worker.host = absl::StrCat("plan-host-", i / options.workers_per_host);
    worker.device_index = i % options.workers_per_host;
    request.candidates.push_back(std::move(worker));
  }

  std::vector<double> times_ms;
  for (int run = 0; run < options.runs; ++run) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<v1::Mesh> mesh = coordinator::MeshPlanner::Plan(request);
    const auto end = std::chrono::steady_clock::now();
    if (!mesh.ok()) return mesh.status();
    if (mesh->members_size() != options.workers) {
      return absl::InternalError(absl::StrCat("plan benchmark: mesh has ", mesh->members_size(),
                                              " members, want ", options.workers));
    }
    times_ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  std::sort(times_ms.begin(), times_ms.end());
  PlanTiming timing;
  timing.workers = options.workers;
  timing.tensor = options.tensor;
  timing.runs = options.runs;
  timing.median_ms = Percentile(times_ms, 0.5);
  return timing;
}

}  // namespace cohort::sim
