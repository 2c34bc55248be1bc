#pragma once
// Coordinator: the thread-safe facade the gRPC glue calls. It owns the pure
// logic (MembershipTable, JobManager, KvStore), serialises every call under
// one mutex, and delivers the resulting messages and events to sinks after
// releasing it. No gRPC types here (docs/conventions.md, gRPC at the edge).
//
// Errors (besides those of the logic classes):
//   OnWorkerMessage: Aborted if the incarnation is not the worker's current
//   one (a replaced process) or the message names a stale generation;
//   FailedPrecondition if the worker is not attached.
//   Kv*: Aborted for a generation older than the job's, FailedPrecondition
//   for a newer one, NotFound for an unknown or finished job.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cohort/v1/jobs.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/clock.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_persister.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/kv_store.h"
#include "coordinator/membership/membership_table.h"
#include "coordinator/membership/worker_identity.h"

namespace cohort::coordinator {

// Where messages for one attached worker stream go. Send must not block
// (implementations queue). Thread-safe.
class WorkerSink {
 public:
  virtual ~WorkerSink() = default;
  // By value: the sink keeps it (a large Assign is not copied again).
  virtual void Send(v1::CoordinatorMessage message) = 0;
  // The same process attached again on a newer stream: this one is over
  // (finish it; its end is not a loss). Must not block. Default: nothing.
  virtual void Close() {}
};

// Receives the events of one watched job. Thread-safe, must not block.
class JobEventSink {
 public:
  virtual ~JobEventSink() = default;
  virtual void OnEvent(const v1::JobEvent& event) = 0;
  // The job reached a terminal state; no more events follow.
  virtual void OnFinished() = 0;
};

class Coordinator {
 public:
  struct Options {
    absl::Duration heartbeat_interval = absl::Milliseconds(500);
    absl::Duration heartbeat_timeout = absl::Seconds(3);
    absl::Duration readopt_grace = absl::Seconds(10);
    absl::Duration max_kv_wait = absl::Seconds(60);
    KvStore::Options kv;  // KeyValue limits
    std::string coordinator_id;  // random per start when empty
    // Elasticity (JobManager::Options).
    absl::Duration suspend_timeout = absl::Seconds(10);
    absl::Duration prepare_timeout = absl::Minutes(10);
    absl::Duration finished_retention = absl::Hours(24 * 7);  // 0: forever
    int warm_spares_per_job = 1;  // JobManager::Options::warm_spares_per_job
    absl::Duration partition_hold = absl::Seconds(30);  // JobManager::Options::partition_hold
    // Tick() is expected this often at least: a longer gap means the
    // coordinator itself was stopped (a stalled host, SIGSTOP, a VM pause),
    // and that time is not counted against the workers (heartbeat ages and
    // every job deadline are moved later by it). Zero: off (tests that jump
    // a fake clock between ticks).
    absl::Duration stall_threshold = absl::ZeroDuration();
    // When no worker at all has been heard for IsolationSilence() (and at
    // least two are attached), the coordinator takes its own network to be
    // cut: it fences no one and lets no job deadline run until it hears from
    // a worker again, then gives the silent ones --readopt_grace to come
    // back. This bounds how long it may stay so (then it fences as usual).
    // Zero: never assume isolation.
    absl::Duration isolation_limit = absl::Minutes(2);
    absl::Duration hang_timeout_floor = absl::Seconds(30);
    double hang_step_multiple = 20.0;
    std::function<std::optional<Step>(const JobId&)> latest_checkpoint;
    // Whether `job` has a committed checkpoint at `step` (nullopt: any): OK,
    // or NotFound saying what is missing. Submit uses it to check
    // checkpoint.resume_from_job; unset: not checked at submit.
    std::function<absl::Status(const JobId& job, std::optional<Step> step)> checkpoint_exists;
  };

  // Restores persisted jobs from `store`. Errors from JobStore::LoadAll.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(Options options,
                                                             std::unique_ptr<JobStore> store,
                                                             const Clock* clock,
                                                             CoordinatorMetrics* metrics);

  // --- Workers ---
  // Registers the worker of `hello`; later messages for it go to `sink`.
  // The same process attaching again while its old stream still counts
  // (it gave that one up: no heartbeat answers, e.g. across a partition)
  // takes its record over where it is: a job member is re-adopted in place
  // (JobManager::OnWorkerJoined), and the old stream is closed. Errors from
  // MembershipTable::Join.
  absl::StatusOr<v1::Welcome> Attach(const v1::Hello& hello, std::shared_ptr<WorkerSink> sink);
  // A heartbeat or assignment status on an attached stream. `stream`: the
  // sink of the stream it came on; a message from a stream that has been
  // taken over is dropped (OK). nullptr: the worker's current stream.
  absl::Status OnWorkerMessage(const WorkerId& worker, const v1::WorkerMessage& message,
                               const WorkerSink* stream = nullptr);
  // The worker's stream closed or broke: the worker is lost at once, unless
  // `stream` (as for OnWorkerMessage) has been taken over.
  void Detach(const WorkerId& worker, Incarnation incarnation, const WorkerSink* stream = nullptr);
  // The silence after which a coordinator hearing from no worker takes
  // itself to be cut off: max(heartbeat_timeout / 2, 2 heartbeat intervals).
  absl::Duration IsolationSilence() const;
  // Whether it currently takes itself to be cut off from every worker.
  bool isolated() const;
  std::vector<v1::WorkerInfo> ListWorkers() const;
  // A page of workers by id, or of jobs in submit order (coordinator/
  // paging.h); InvalidArgument for a bad page_size or page_token.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkersPage(
      const v1::ListWorkersRequest& request) const;
  absl::StatusOr<v1::ListJobsResponse> ListJobsPage(const v1::ListJobsRequest& request) const;
  // Takes a worker out of service (Workers.Drain): no new assignments; its
  // job is re-planned without it (it donates its state first), then it gets
  // Drain and exits. NotFound for an unknown worker, FailedPrecondition for a
  // lost one.
  absl::StatusOr<v1::WorkerInfo> DrainWorker(const WorkerId& worker, const std::string& reason);

  // --- Jobs --- (errors as in JobManager)
  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const JobId& id) const;
  std::vector<v1::Job> ListJobs(bool include_finished) const;
  absl::StatusOr<v1::LossHistory> GetLossHistory(const JobId& id) const;
  absl::StatusOr<v1::Job> Cancel(const JobId& id);
  // Deletes a finished job's record (JobManager::Delete); its checkpoints stay.
  absl::Status DeleteJob(const JobId& id);
  absl::StatusOr<v1::Job> Scale(const v1::ScaleJobRequest& request);
  // Sends a SNAPSHOT event of the job to `sink` and then every change.
  // Returns a handle for Unwatch. NotFound for an unknown job. A finished
  // job gets its snapshot and OnFinished at once.
  absl::StatusOr<uint64_t> Watch(const JobId& id, std::shared_ptr<JobEventSink> sink);
  void Unwatch(uint64_t handle);

  // OK if `caller` may act as a member or donor of `job`'s `generation`
  // (or as any worker); else PermissionDenied naming what the caller's
  // certificate allows. A generation other than the job's current one is
  // let through: the call itself then fails as stale (Aborted) or early.
  // For the job-scoped worker RPCs: KeyValue, checkpoint uploads.
  absl::Status CheckParticipant(const WorkerIdentity& caller, const JobId& job,
                                Generation generation) const;

  // --- Checkpoints ---
  // A checkpoint attempt of `job` failed, or one committed
  // (CheckpointUploadsOptions::on_failure, on_commit): recorded in the job's
  // checkpoint_status (JobManager::OnCheckpointFailed, OnCheckpointCommitted),
  // published to its watchers and persisted; a failure also counts in
  // cohort_checkpoint_failures_total. An unknown job is ignored (the
  // metric still counts).
  void OnCheckpointFailed(const JobId& job, v1::CheckpointFailure failure);
  void OnCheckpointCommitted(const JobId& job, const v1::CheckpointCommit& commit);

  // --- KeyValue ---
  absl::Status KvSet(const KvScope& scope, const std::string& key, std::string value);
  absl::StatusOr<std::string> KvGet(const KvScope& scope, const std::string& key);
  // Calls `done` exactly once (possibly before returning) with the value,
  // DeadlineExceeded after `timeout` (capped at max_kv_wait; zero means the
  // cap), or Aborted if the generation ends first.
  // Returns the waiter's id for KvCancelWait (0: `done` already ran).
  uint64_t KvWaitFor(const KvScope& scope, const std::string& key, absl::Duration timeout,
                     KvWaiterCallback done);
  // The caller of a wait went away: `done` runs now with Cancelled, unless
  // it already ran or is running.
  void KvCancelWait(const KvScope& scope, const std::string& key, uint64_t id);

  // Periodic work (call every ~50-100 ms): heartbeat timeouts, KV waiter
  // deadlines, re-adoption grace, gauges.
  void Tick();

  // Called when the process is about to stop: closing streams from then on
  // are not worker failures (the workers will re-attach to the next
  // coordinator), so Detach and Tick stop changing state.
  void Quiesce();

  const Options& options() const { return options_; }

 private:
  Coordinator(Options options, std::unique_ptr<JobStore> store, const Clock* clock,
              CoordinatorMetrics* metrics);

  // Holds mu_ for one critical section and reports how long the section
  // waited for it and held it (CoordinatorMetrics::LockSectionTimed).
  class ABSL_SCOPED_LOCKABLE SectionLock {
   public:
    SectionLock(const Coordinator* coordinator, LockSection section)
        ABSL_EXCLUSIVE_LOCK_FUNCTION(coordinator->mu_);
    ~SectionLock() ABSL_UNLOCK_FUNCTION();
    SectionLock(const SectionLock&) = delete;
    SectionLock& operator=(const SectionLock&) = delete;

   private:
    const Coordinator* coordinator_;
    LockSection section_;
    absl::Time arrived_;
    absl::Time acquired_;
  };

  // Handles what a logic call produced: KV scopes of old generations,
  // messages and events. Fills `deliveries` to run after unlocking.
  struct Deliveries {
    struct Outgoing {
      std::shared_ptr<WorkerSink> sink;
      v1::CoordinatorMessage message;
      std::shared_ptr<const v1::CoordinatorMessage> base;  // Effects::Message::base
    };
    std::vector<Outgoing> messages;
    std::vector<std::pair<std::shared_ptr<JobEventSink>, v1::JobEvent>> events;
    std::vector<std::shared_ptr<JobEventSink>> finished;
    std::vector<KvCompletion> kv;
    // The job writes the section queued (0: none), made durable before
    // anything above is delivered.
    JobPersister* persister = nullptr;
    uint64_t persist_through = 0;
    // Flushes, then delivers; returns the flush's status (delivery goes
    // ahead either way, as the writes stay queued and are retried).
    absl::Status Run();
  };
  void Collect(Effects effects, Deliveries* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `f(&effects)` under the lock, then delivers what it produced after
  // unlocking, and returns f's result.
  template <typename F>
  auto WithEffects(F&& f) -> decltype(f(std::declval<Effects*>()));
  absl::Status CheckKvScope(const KvScope& scope) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Workers with ids above `after` (all: ""), at most `limit`; `*more` says
  // whether any follow.
  std::vector<v1::WorkerInfo> ListWorkersLocked(const std::string& after, size_t limit,
                                                bool* more) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleLost(const std::vector<LostWorker>& lost, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A gap longer than options_.stall_threshold since the last tick was the
  // coordinator's own stall: it is discounted from heartbeat ages and job
  // deadlines (MembershipTable/JobManager::Discount). Called by Tick and by
  // every handler that can time something out, whichever runs first.
  void DiscountOwnStall(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enters or leaves isolation (Options::isolation_limit) on a tick; true
  // while isolated: nothing times out.
  bool CheckIsolation(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `stream` is not `worker`'s current one (a taken-over stream).
  bool Superseded(const WorkerId& worker, const WorkerSink* stream) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct SinkEntry {
    Incarnation incarnation;
    std::shared_ptr<WorkerSink> sink;
  };
  struct Watcher {
    JobId job;
    std::shared_ptr<JobEventSink> sink;
  };

  const Options options_;
  const Clock* clock_;
  CoordinatorMetrics* metrics_;
  std::unique_ptr<JobStore> store_;
  // JobManager's store: queues writes under mu_, flushed after unlocking.
  std::unique_ptr<JobPersister> persister_;

  mutable absl::Mutex mu_;
  MembershipTable membership_ ABSL_GUARDED_BY(mu_);
  JobManager jobs_ ABSL_GUARDED_BY(mu_);
  KvStore kv_ ABSL_GUARDED_BY(mu_);
  // The persister's last ticket when Collect last ran: writes queued after
  // it were queued by the section now collecting (sections hold mu_).
  uint64_t collected_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<WorkerId, SinkEntry> sinks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watch_handle_ ABSL_GUARDED_BY(mu_) = 1;
  bool quiesced_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Time> last_tick_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> isolated_since_ ABSL_GUARDED_BY(mu_);
  absl::Time last_heard_before_isolation_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::coordinator
