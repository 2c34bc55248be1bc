#include "tests/simulation/protocol_sim.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "tests/simulation/sim_worker.h"
#include "tests/simulation/sim_world.h"
#include "tests/testing/job_specs.h"

namespace cohort::simulation {

const char* FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kCrashWorker: return "crash-worker";
    case FaultKind::kFreezeWorker: return "freeze-worker";
    case FaultKind::kFreezeWorkers: return "freeze-workers";
    case FaultKind::kFreezeAll: return "freeze-all";
    case FaultKind::kCrashCoordinator: return "crash-coordinator";
    case FaultKind::kFreezeCoordinator: return "freeze-coordinator";
    case FaultKind::kPartitionWorker: return "partition-worker";
    case FaultKind::kPartitionCoordinator: return "partition-coordinator";
    case FaultKind::kBreakStream: return "break-stream";
  }
  return "?";
}

namespace {

std::string FaultString(const ScriptedFault& f) {
  std::string s = absl::StrCat(FaultKindName(f.kind), "@", absl::FormatDuration(f.at));
  if (!f.workers.empty()) {
    absl::StrAppend(&s, "[", absl::StrJoin(f.workers, ",", [](std::string* out, int w) {
                      absl::StrAppend(out, "w", w);
                    }), "]");
  }
  absl::StrAppend(&s, " for ", absl::FormatDuration(f.length));
  return s;
}

}  // namespace

void World::Submit() {
  v1::SubmitJobRequest request;
  *request.mutable_spec() =
      testing::SmallJobSpec("sim", job_.tensor, job_.min_workers, job_.max_workers);
  request.mutable_spec()->mutable_parallelism()->set_pipeline(job_.pipeline);
  request.mutable_spec()->mutable_parallelism()->set_zero1(job_.zero1);
  request.mutable_spec()->set_steps(job_.steps);
  if (job_.checkpoint_interval > 0) {
    request.mutable_spec()->mutable_checkpoint()->set_interval_steps(job_.checkpoint_interval);
  }
  BeginCall();
  absl::StatusOr<v1::Job> job = coordinator_->Submit(request);
  if (!job.ok()) {
    Violation(absl::StrCat("the job cannot be submitted: ", job.status().ToString()));
    return;
  }
  job_id_ = job->job_id();
  submitted_ = Now();
  Trace(absl::StrCat("submitted ", job_id_));
  WatchJob();
}

void World::ScheduleFaults() {
  if (options_.randomize) {
    const int n = 1 + static_cast<int>(rng_() % 5);
    const int workers = static_cast<int>(workers_.size());
    for (int i = 0; i < n; ++i) {
      ScriptedFault f;
      f.at = Uniform(absl::Seconds(2), options_.fault_window);
      const uint64_t pick = rng_() % 13;
      f.kind = pick < 3   ? FaultKind::kCrashWorker
               : pick < 5 ? FaultKind::kFreezeWorker
               : pick < 6 ? FaultKind::kFreezeWorkers
               : pick < 7 ? FaultKind::kFreezeAll
               : pick < 8 ? FaultKind::kCrashCoordinator
               : pick < 9 ? FaultKind::kFreezeCoordinator
               : pick < 10 ? FaultKind::kPartitionWorker
               : pick < 11 ? FaultKind::kPartitionCoordinator
                           : FaultKind::kBreakStream;
      // Shorter than the re-adoption grace (10 s): the invariants count on
      // a frozen or cut-off process coming back in time (protocol_invariants.cc).
      f.length = Uniform(absl::Milliseconds(200), absl::Seconds(8));
      if (f.kind == FaultKind::kFreezeWorkers) {
        for (int w = 0; w < workers; ++w) {
          if (Chance(0.5)) f.workers.push_back(w);
        }
      } else if (f.kind != FaultKind::kFreezeAll && f.kind != FaultKind::kCrashCoordinator &&
                 f.kind != FaultKind::kFreezeCoordinator &&
                 f.kind != FaultKind::kPartitionCoordinator) {
        f.workers.push_back(static_cast<int>(rng_() % static_cast<uint64_t>(workers)));
      }
      faults_.push_back(f);
    }
  }
  std::sort(faults_.begin(), faults_.end(),
            [](const ScriptedFault& a, const ScriptedFault& b) { return a.at < b.at; });
  for (const ScriptedFault& f : faults_) {
    last_fault_end_ = std::max(last_fault_end_, submitted_ + f.at + f.length);
    queue_.At(submitted_ + f.at, [this, f] { Inject(f); });
  }
}

void World::Inject(const ScriptedFault& f) {
  Trace(absl::StrCat("FAULT ", FaultString(f)));
  const absl::Time until = Now() + f.length;
  switch (f.kind) {
    case FaultKind::kCrashWorker:
      for (int w : f.workers) {
        SimWorker& worker = *workers_[static_cast<size_t>(w)];
        if (!worker.alive()) continue;
        worker.Crash();
        FailCollectivesOf(w);
        queue_.At(until, [this, w] {
          SimWorker& again = *workers_[static_cast<size_t>(w)];
          if (!again.alive()) again.Start();
        });
      }
      break;
    case FaultKind::kFreezeWorker:
    case FaultKind::kFreezeWorkers:
      for (int w : f.workers) {
        NoteUnreachable(w, until);
        workers_[static_cast<size_t>(w)]->FreezeUntil(until);
      }
      break;
    case FaultKind::kFreezeAll:
      coordinator_frozen_until_ = std::max(coordinator_frozen_until_, until);
      for (size_t w = 0; w < workers_.size(); ++w) {
        NoteUnreachable(static_cast<int>(w), until);
        workers_[w]->FreezeUntil(until);
      }
      break;
    case FaultKind::kCrashCoordinator:
      CrashCoordinator();
      queue_.At(until, [this] {
        if (!coordinator_up_) StartCoordinator();
      });
      break;
    case FaultKind::kFreezeCoordinator:
      coordinator_frozen_until_ = std::max(coordinator_frozen_until_, until);
      break;
    case FaultKind::kPartitionWorker:
      for (int w : f.workers) {
        NoteUnreachable(w, until);
        partitioned_until_[w] = std::max(partitioned_until_[w], until);
      }
      break;
    case FaultKind::kPartitionCoordinator:
      for (size_t w = 0; w < workers_.size(); ++w) {
        NoteUnreachable(static_cast<int>(w), until);
        partitioned_until_[static_cast<int>(w)] =
            std::max(partitioned_until_[static_cast<int>(w)], until);
      }
      break;
    case FaultKind::kBreakStream:
      for (int w : f.workers) {
        const uint64_t stream = workers_[static_cast<size_t>(w)]->stream();
        if (stream == 0) continue;
        FinishStream(stream);
        const uint64_t epoch = coordinator_epoch_;
        AtCoordinator(epoch, Uniform(timing_.link_min, timing_.link_max),
                      [this, stream] { EndStreamAtCoordinator(stream, /*detach=*/true); });
      }
      break;
  }
}

void World::Run() {
  const absl::Time start = Now();
  StartCoordinator();
  for (auto& worker : workers_) {
    SimWorker* w = worker.get();
    queue_.After(Uniform(absl::ZeroDuration(), absl::Milliseconds(300)), [w] { w->Start(); });
  }
  queue_.After(absl::Seconds(1), [this] {
    if (!coordinator_up_) return;
    Submit();
    ScheduleFaults();
    std::vector<std::string> faults;
    for (const ScriptedFault& f : faults_) faults.push_back(FaultString(f));
    result_->scenario = absl::StrCat(
        workers_.size(), " workers; job tp ", job_.tensor, " pp ", job_.pipeline, " workers ",
        job_.min_workers, "-", job_.max_workers, job_.zero1 ? " zero1" : "", " steps ",
        job_.steps,
        job_.checkpoint_interval > 0 ? absl::StrCat(" checkpoint every ", job_.checkpoint_interval)
                                     : " no checkpoints",
        "; faults: ", faults.empty() ? "none" : absl::StrJoin(faults, ", "));
    Trace(result_->scenario);
  });
  const absl::Time end = start + options_.max_run;
  while (!stop_ && queue_.RunNext(end)) {
  }
  result_->events = queue_.executed();
  result_->simulated = Now() - start;
  if (result_->violations.empty() && !job_done_) CheckLiveness(/*final=*/true);
  if (coordinator_up_ && !job_id_.empty()) {
    absl::StatusOr<v1::Job> job = coordinator_->GetJob(JobId(job_id_));
    if (job.ok()) {
      result_->completed = job->state() == v1::JOB_STATE_COMPLETED;
      result_->peer_recoveries = job->recovery_stats().peer();
      result_->checkpoint_recoveries = job->recovery_stats().checkpoint();
      result_->lost_steps = job->recovery_stats().lost_steps();
      result_->outcome = absl::StrCat(
          job_id_, " ", v1::JobState_Name(job->state()), " at step ", job->progress().step(),
          ", generation ", job->generation(), ", recoveries: ", job->recovery_stats().peer(),
          " peer, ", job->recovery_stats().checkpoint(), " checkpoint, ",
          job->recovery_stats().lost_steps(), " lost steps; ",
          absl::FormatDuration(result_->simulated), " simulated, ", result_->events, " events");
    }
  }
}

absl::StatusOr<SimOptions> ScenarioOptions(const std::string& name, uint64_t seed) {
  SimOptions options;
  options.seed = seed;
  options.randomize = false;
  options.workers = 4;
  options.job.min_workers = 1;
  options.job.max_workers = 4;
  options.job.steps = 200;
  if (name == "stall") {
    // Steps take ~0.1 s: step 100 is ~10 s after the job starts.
    options.faults.push_back(ScriptedFault{absl::Seconds(10), FaultKind::kFreezeAll, {},
                                           absl::Seconds(5)});
    return options;
  }
  if (name == "donor") {
    options.job.zero1 = true;
    options.interleave_probability = 0.5;
    options.faults.push_back(ScriptedFault{absl::Seconds(5), FaultKind::kCrashWorker,
                                           {static_cast<int>(seed % 4)}, absl::Seconds(60)});
    return options;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--scenario: '", name, "' is not one of stall, donor"));
}

SimResult RunSimulation(const SimOptions& options) {
  SimResult result;
  result.seed = options.seed;
  const log::Level level = log::MinLevel();
  log::SetMinLevel(options.print_trace ? log::Level::kInfo : log::Level::kFatal);
  {
    World world(options, &result);
    world.Run();
  }
  log::SetMinLevel(level);
  return result;
}

std::string FormatFailure(const SimResult& result, size_t max_lines) {
  std::string out = absl::StrCat("seed ", result.seed, ": ", result.scenario, "\n");
  for (const std::string& v : result.violations) absl::StrAppend(&out, "  violated: ", v, "\n");
  if (!result.outcome.empty()) absl::StrAppend(&out, "  outcome: ", result.outcome, "\n");
  const size_t first = result.trace.size() > max_lines ? result.trace.size() - max_lines : 0;
  absl::StrAppend(&out, "  trace (", result.trace.size() - first, " of ", result.trace.size(),
                  " lines):\n");
  for (size_t i = first; i < result.trace.size(); ++i) {
    absl::StrAppend(&out, "    ", result.trace[i], "\n");
  }
  return out;
}

}  // namespace cohort::simulation
