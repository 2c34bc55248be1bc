#include "tests/simulation/sim_world.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "coordinator/coordinator_metrics.h"
#include "prometheus/registry.h"
#include "tests/simulation/sim_worker.h"
#include "tests/testing/job_specs.h"

namespace cohort::simulation {

// One Attach stream, as both ends see it.
struct World::Stream {
  uint64_t id = 0;
  int worker = 0;
  uint64_t incarnation = 0;
  uint64_t coordinator_epoch = 0;
  bool attaching = false;  // inside Coordinator::Attach
  bool attached = false;   // the Hello was accepted
  bool done_at_coordinator = false;
  bool ended_at_worker = false;
  bool lost_reported = false;
  std::shared_ptr<coordinator::WorkerSink> sink;
  absl::Time to_worker_last = absl::InfinitePast();  // FIFO per direction
  absl::Time to_coordinator_last = absl::InfinitePast();
};

class World::SimSink : public coordinator::WorkerSink {
 public:
  SimSink(World* world, uint64_t stream) : world_(world), stream_(stream) {}
  void Send(v1::CoordinatorMessage message) override { world_->SendToWorker(stream_, message); }
  void Close() override { world_->CloseStream(stream_); }

 private:
  World* world_;
  uint64_t stream_;
};

// Job events, as a Watch stream would carry them (synchronously here).
class JobWatcher : public coordinator::JobEventSink {
 public:
  explicit JobWatcher(std::function<void(const v1::Job&)> on_job) : on_job_(std::move(on_job)) {}
  void OnEvent(const v1::JobEvent& event) override { on_job_(event.job()); }
  void OnFinished() override {}

 private:
  std::function<void(const v1::Job&)> on_job_;
};

// The coordinator's JobStore, forwarding to the store that outlives its
// process (what RocksDB on disk is to the real one).
class World::ForwardingJobStore : public coordinator::JobStore {
 public:
  explicit ForwardingJobStore(coordinator::JobStore* inner) : inner_(inner) {}
  absl::Status Put(const v1::Job& job) override { return inner_->Put(job); }
  absl::StatusOr<std::vector<v1::Job>> LoadAll() override { return inner_->LoadAll(); }
  absl::StatusOr<int64_t> NextJobNumber() override { return inner_->NextJobNumber(); }
  absl::Status Delete(const std::string& job_id) override { return inner_->Delete(job_id); }

 private:
  coordinator::JobStore* inner_;
};

World::World(const SimOptions& options, SimResult* result)
    : options_(options), result_(result), rng_(options.seed), queue_(&clock_) {
  job_ = options.job;
  faults_ = options.faults;
  int workers = options.workers;
  if (options.randomize) {
    std::uniform_int_distribution<int> worker_count(2, 6);
    workers = worker_count(rng_);
    job_.tensor = (workers >= 4 && Chance(0.2)) ? 2 : 1;
    job_.pipeline = (workers >= 2 * job_.tensor && Chance(0.2)) ? 2 : 1;
    const int slice = job_.tensor * job_.pipeline;
    job_.min_workers = slice;
    job_.max_workers = slice * (Chance(0.5) ? 4 : 2);
    job_.zero1 = Chance(0.5);
    job_.steps = 200 + static_cast<int64_t>(rng_() % 101);
    job_.checkpoint_interval = Chance(0.5) ? 0 : 20 + static_cast<int64_t>(rng_() % 31);
  }
  for (int i = 0; i < workers; ++i) workers_.push_back(std::make_unique<SimWorker>(this, i));
}

World::~World() = default;

absl::Duration World::Uniform(absl::Duration lo, absl::Duration hi) {
  if (hi <= lo) return lo;
  const int64_t span = absl::ToInt64Nanoseconds(hi - lo);
  return lo + absl::Nanoseconds(static_cast<int64_t>(rng_() % static_cast<uint64_t>(span + 1)));
}

bool World::Chance(double p) {
  return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) < p;
}

void World::Trace(const std::string& line) {
  const double t = absl::ToDoubleSeconds(Now() - absl::UnixEpoch()) - 1'700'000'000.0;
  std::string text = absl::StrCat("[", absl::StrFormat("%9.4f", t), "] ", line);
  if (options_.print_trace) std::printf("%s\n", text.c_str());
  result_->trace.push_back(std::move(text));
}

void World::Violation(const std::string& what) {
  Trace(absl::StrCat("VIOLATION: ", what));
  result_->violations.push_back(what);
  stop_ = true;
}

int World::IndexOf(const std::string& worker_id) {
  return worker_id.size() > 1 ? std::atoi(worker_id.c_str() + 1) : -1;
}

// --- processes ---

void World::AtWorker(int index, uint64_t incarnation, absl::Duration delay,
                     std::function<void()> fn) {
  queue_.After(delay, [this, index, incarnation, fn = std::move(fn)]() mutable {
    std::function<void()> run = [this, index, incarnation, fn = std::move(fn)]() mutable {
      SimWorker& w = *workers_[static_cast<size_t>(index)];
      if (!w.alive() || w.incarnation() != incarnation) return;
      fn();
    };
    SimWorker& w = *workers_[static_cast<size_t>(index)];
    if (Now() < w.frozen_until()) {
      // Deferred to the thaw; AtWorker again, in case the freeze grows.
      AtWorker(index, incarnation, w.frozen_until() - Now(), std::move(run));
      return;
    }
    run();
  });
}

void World::AtCoordinator(uint64_t epoch, absl::Duration delay, std::function<void()> fn) {
  queue_.After(delay, [this, epoch, fn = std::move(fn)]() mutable {
    if (!coordinator_up_ || coordinator_epoch_ != epoch) return;
    if (CoordinatorFrozen()) {
      AtCoordinator(epoch, coordinator_frozen_until_ - Now(), std::move(fn));
      return;
    }
    fn();
  });
}

void World::BeginCall() {
  // The facade delivers a call's messages after releasing its mutex; two
  // calls' deliveries can interleave.
  call_delay_ = Chance(options_.interleave_probability)
                    ? Uniform(absl::ZeroDuration(), timing_.interleave_max)
                    : absl::ZeroDuration();
}

void World::StartCoordinator() {
  ++coordinator_epoch_;
  metrics_ = std::make_unique<coordinator::CoordinatorMetrics>(
      std::make_shared<prometheus::Registry>());
  coordinator::Coordinator::Options o;
  o.heartbeat_interval = timing_.heartbeat_interval;
  o.heartbeat_timeout = timing_.heartbeat_timeout;
  o.readopt_grace = timing_.readopt_grace;
  o.suspend_timeout = timing_.suspend_timeout;
  o.stall_threshold = absl::Seconds(1);  // as CoordinatorServer sets it for its 50 ms ticker
  o.coordinator_id = absl::StrCat("coordinator-", coordinator_epoch_);
  o.latest_checkpoint = [this](const JobId& job) -> std::optional<Step> {
    const std::optional<int64_t> step = CommittedCheckpoint(job.value());
    return step.has_value() ? std::optional<Step>(Step(*step)) : std::nullopt;
  };
  absl::StatusOr<std::unique_ptr<coordinator::Coordinator>> created =
      coordinator::Coordinator::Create(std::move(o),
                                       std::make_unique<ForwardingJobStore>(&persisted_), &clock_,
                                       metrics_.get());
  if (!created.ok()) {
    Violation(absl::StrCat("the coordinator cannot start: ", created.status().ToString()));
    return;
  }
  coordinator_ = *std::move(created);
  coordinator_up_ = true;
  // A new process knows only what was persisted.
  for (const v1::Job& job : coordinator_->ListJobs(/*include_finished=*/false)) {
    max_reported_[job.job_id()] = job.progress().step();
  }
  WatchJob();
  Trace(absl::StrCat("coordinator starts (epoch ", coordinator_epoch_, ")"));
  ScheduleTick(coordinator_epoch_);
}

void World::CrashCoordinator() {
  if (!coordinator_up_) return;
  Trace("coordinator crashes (kill -9)");
  coordinator_up_ = false;
  coordinator_.reset();
  // Waiters die with it; their callers see the connection break.
  for (KvWait& wait : kv_waits_) {
    if (wait.epoch == coordinator_epoch_) wait.reply(absl::UnavailableError("coordinator went away"));
  }
  kv_waits_.clear();
  for (auto& [id, stream] : streams_) {
    if (stream->coordinator_epoch == coordinator_epoch_ && !stream->done_at_coordinator) {
      FinishStream(id);
    }
  }
}

void World::ScheduleTick(uint64_t epoch) {
  AtCoordinator(epoch, absl::Milliseconds(50), [this, epoch] {
    BeginCall();
    coordinator_->Tick();
    CheckLiveness(/*final=*/false);
    ScheduleTick(epoch);
  });
}

bool World::Partitioned(int index) const {
  auto it = partitioned_until_.find(index);
  return it != partitioned_until_.end() && Now() < it->second;
}

void World::NoteUnreachable(int worker, absl::Time until) {
  std::vector<Span>& spans = unreachable_[worker];
  if (!spans.empty() && spans.back().end >= Now()) {
    spans.back().end = std::max(spans.back().end, until);  // lengthens the span under way
  } else {
    spans.push_back(Span{Now(), until});
  }
}

bool World::UnreachableAt(int worker, absl::Time t) const {
  auto it = unreachable_.find(worker);
  if (it == unreachable_.end()) return false;
  for (const Span& span : it->second) {
    if (span.start <= t && t < span.end) return true;
  }
  return false;
}

bool World::OutlastedGrace(int worker) const {
  auto broken = broken_at_.find(worker);
  if (broken != broken_at_.end() &&
      UnreachableAt(worker, broken->second + timing_.stream_rejoin_grace)) {
    return true;
  }
  auto it = unreachable_.find(worker);
  if (it == unreachable_.end()) return false;
  for (const Span& span : it->second) {
    if (span.end - span.start > timing_.readopt_grace && Now() - span.end < absl::Minutes(1)) {
      return true;
    }
  }
  return false;
}

void World::WatchJob() {
  if (job_id_.empty() || !coordinator_up_) return;
  absl::StatusOr<uint64_t> watched = coordinator_->Watch(
      JobId(job_id_), std::make_shared<JobWatcher>([this](const v1::Job& job) { OnJobEvent(job); }));
  if (!watched.ok()) Violation(absl::StrCat("cannot watch ", job_id_, ": ", watched.status().ToString()));
}

// --- streams ---

uint64_t World::OpenStream(int index, uint64_t incarnation, const v1::WorkerMessage& hello) {
  auto stream = std::make_unique<Stream>();
  stream->id = next_stream_++;
  stream->worker = index;
  stream->incarnation = incarnation;
  stream->coordinator_epoch = coordinator_up_ ? coordinator_epoch_ : 0;
  stream->sink = std::make_shared<SimSink>(this, stream->id);
  const uint64_t id = stream->id;
  streams_[id] = std::move(stream);
  if (!coordinator_up_) {
    FinishStream(id);  // connection refused
    return id;
  }
  SendOnStream(id, hello);
  return id;
}

absl::Time World::ArrivalTime(int worker, absl::Time* last) {
  // A random link delay, held back while the worker is cut off, and never
  // before what the stream carried earlier in the same direction (FIFO).
  absl::Time at = Now() + Uniform(timing_.link_min, timing_.link_max);
  if (Partitioned(worker)) at = std::max(at, partitioned_until_[worker] + timing_.link_max);
  at = std::max(at, *last);
  *last = at;
  return at;
}

void World::SendOnStream(uint64_t id, const v1::WorkerMessage& message) {
  auto it = streams_.find(id);
  if (it == streams_.end() || it->second->ended_at_worker) return;
  Stream& s = *it->second;
  const absl::Time at = ArrivalTime(s.worker, &s.to_coordinator_last);
  queue_.At(at, [this, id, message] { DeliverToCoordinator(id, message); });
}

void World::DeliverToCoordinator(uint64_t id, const v1::WorkerMessage& message) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  Stream& s = *it->second;
  if (!coordinator_up_ || s.coordinator_epoch != coordinator_epoch_ || s.done_at_coordinator) {
    return;
  }
  if (CoordinatorFrozen()) {
    queue_.At(coordinator_frozen_until_, [this, id, message] { DeliverToCoordinator(id, message); });
    return;
  }
  BeginCall();
  const std::string worker = absl::StrCat("w", s.worker);
  if (!s.attached) {
    if (!message.has_hello()) return;
    s.attaching = true;
    absl::StatusOr<v1::Welcome> welcome = coordinator_->Attach(message.hello(), s.sink);
    s.attaching = false;
    if (!welcome.ok()) {
      Trace(absl::StrCat("coordinator refuses stream ", id, " of ", worker, ": ",
                         welcome.status().ToString()));
      FinishStream(id);
      return;
    }
    s.attached = true;
    broken_at_.erase(s.worker);
    Trace(absl::StrCat("coordinator attaches ", worker, " on stream ", id,
                       message.hello().has_held()
                           ? absl::StrCat(" (holding ", message.hello().held().job_id(), " g",
                                          message.hello().held().generation(), ")")
                           : ""));
    CheckMembership();
    return;
  }
  // Statuses can trigger a plan inside the call: what they tell counts
  // first. Heartbeats count once the coordinator accepted them.
  if (message.has_status()) NoteReports(s, message);
  const absl::Status handled =
      coordinator_->OnWorkerMessage(WorkerId(worker), message, s.sink.get());
  if (message.has_heartbeat() && handled.ok()) NoteReports(s, message);
  const bool ignored = handled.ok() || absl::IsNotFound(handled) ||
                       (absl::IsAborted(handled) && message.has_status());
  if (!ignored) {
    // As the Attach reactor does: the stream ends and the worker is lost.
    Trace(absl::StrCat("coordinator ends stream ", id, " of ", worker, ": ", handled.ToString()));
    EndStreamAtCoordinator(id, /*detach=*/true);
    FinishStream(id);
  }
  if (!message.has_heartbeat()) CheckMembership();
}

void World::NoteReports(const Stream& s, const v1::WorkerMessage& message) {
  // What the coordinator is about to learn of the steps done: progress and
  // held states from members of the job's current generation (what
  // JobManager accepts).
  const std::string& job_id =
      message.has_heartbeat() ? message.heartbeat().job_id() : message.status().job_id();
  if (job_id.empty()) return;
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(JobId(job_id));
  if (!job.ok()) return;
  bool member = false;
  for (const v1::MeshMember& m : job->mesh().members()) {
    member |= m.worker_id() == absl::StrCat("w", s.worker) && m.incarnation() == s.incarnation;
  }
  if (!member) return;
  if (message.has_status()) {
    // Refused unless the worker is attached (not lost) in this process.
    bool attached = false;
    for (const v1::WorkerInfo& info : coordinator_->ListWorkers()) {
      attached |= info.worker_id() == absl::StrCat("w", s.worker) &&
                  info.incarnation() == s.incarnation && info.state() != v1::WORKER_STATE_LOST;
    }
    if (!attached) return;
  }
  if (message.has_heartbeat() && message.heartbeat().generation() == job->generation()) {
    NoteReportedStep(job_id, message.heartbeat().progress().step());
  }
  if (!message.has_status() || message.status().generation() != job->generation()) return;
  for (const v1::HeldState& held : message.status().held_states()) {
    if (held.generation() == job->live_state().generation()) {
      NoteReportedStep(job_id, held.step());
    }
  }
  if (message.status().state() == v1::ASSIGNMENT_STATE_COMPLETED) {
    NoteReportedStep(job_id, message.status().progress().step());
  }
}

void World::EndStreamAtCoordinator(uint64_t id, bool detach) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  Stream& s = *it->second;
  const bool report = detach && s.attached && !s.lost_reported && coordinator_up_ &&
                      s.coordinator_epoch == coordinator_epoch_;
  s.done_at_coordinator = true;
  if (!report) return;
  s.lost_reported = true;
  broken_at_[s.worker] = Now();
  const SimWorker& w = *workers_[static_cast<size_t>(s.worker)];
  if (Now() < w.frozen_until() || Partitioned(s.worker)) {
    // Indistinguishable from a crash for the coordinator (a broken stream
    // is awaited briefly, a heartbeat timeout for the whole grace).
    broken_while_unreachable_[s.worker] = Now();
  }
  BeginCall();
  coordinator_->Detach(WorkerId(absl::StrCat("w", s.worker)), Incarnation(s.incarnation),
                       s.sink.get());
  CheckMembership();
}

void World::CloseStream(uint64_t id) {
  // Its Detach would be ignored (taken over): not reported as a break.
  queue_.At(Now(), [this, id] {
    EndStreamAtCoordinator(id, /*detach=*/false);
    FinishStream(id);
  });
}

void World::FinishStream(uint64_t id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  Stream& s = *it->second;
  s.done_at_coordinator = true;
  absl::Time at = std::max(Now() + Uniform(timing_.link_min, timing_.link_max), s.to_worker_last);
  s.to_worker_last = at;
  const int index = s.worker;
  const uint64_t incarnation = s.incarnation;
  AtWorker(index, incarnation, at - Now(), [this, index, id] {
    workers_[static_cast<size_t>(index)]->OnStreamEnded(id);
  });
}

void World::CancelStream(uint64_t id) {
  auto it = streams_.find(id);
  if (it == streams_.end() || it->second->ended_at_worker) return;
  Stream& s = *it->second;
  s.ended_at_worker = true;
  const absl::Time at = ArrivalTime(s.worker, &s.to_coordinator_last);
  const uint64_t epoch = s.coordinator_epoch;
  queue_.At(at, [this, id, epoch] {
    AtCoordinator(epoch, absl::ZeroDuration(),
                  [this, id] { EndStreamAtCoordinator(id, /*detach=*/true); });
  });
}

void World::SendToWorker(uint64_t id, const v1::CoordinatorMessage& message) {
  auto it = streams_.find(id);
  if (it == streams_.end() || it->second->done_at_coordinator) return;
  const std::string job =
      message.has_assign() ? message.assign().job_id()
                           : (message.has_reconfigure() ? message.reconfigure().job_id() : "");
  if (message.has_assign()) {
    OnPlanIssued(job, message.assign().generation(), message.assign().mesh(),
                 message.assign().recovery());
  } else if (message.has_reconfigure()) {
    OnPlanIssued(job, message.reconfigure().generation(), message.reconfigure().mesh(),
                 message.reconfigure().recovery());
  }
  queue_.After(call_delay_, [this, id, message] {
    auto found = streams_.find(id);
    if (found == streams_.end() || found->second->done_at_coordinator) return;
    Stream& s = *found->second;
    const absl::Time at = ArrivalTime(s.worker, &s.to_worker_last);
    const int index = s.worker;
    AtWorker(index, s.incarnation, at - Now(), [this, index, id, message] {
      workers_[static_cast<size_t>(index)]->OnMessage(id, message);
    });
  });
}

// --- KeyValue ---

void World::KvCall(int index, uint64_t incarnation, absl::Duration deadline,
                   std::function<void(std::function<void(absl::Status)>)> call,
                   std::function<void(absl::Status)> done) {
  auto answered = std::make_shared<bool>(false);
  auto reply = [this, index, incarnation, done, answered](absl::Status status) {
    if (*answered) return;
    *answered = true;
    AtWorker(index, incarnation, Uniform(timing_.link_min, timing_.link_max),
             [done, status] { done(status); });
  };
  if (!coordinator_up_) {
    reply(absl::UnavailableError("coordinator unreachable"));
    return;
  }
  const uint64_t epoch = coordinator_epoch_;
  if (kv_waits_.size() > 1024) {
    std::erase_if(kv_waits_, [](const KvWait& wait) { return *wait.answered; });
  }
  kv_waits_.push_back(KvWait{epoch, answered, reply});  // a crash answers Unavailable
  AtCoordinator(epoch, Uniform(timing_.link_min, timing_.link_max), [this, call, reply] {
    BeginCall();
    call(reply);
  });
  queue_.After(deadline, [this, epoch, reply] {
    reply(coordinator_up_ && coordinator_epoch_ == epoch
              ? absl::DeadlineExceededError("KeyValue: client deadline")
              : absl::UnavailableError("coordinator went away"));
  });
}

void World::KvSet(int index, uint64_t incarnation, const std::string& job, uint64_t generation,
                  const std::string& key, std::function<void(absl::Status)> done) {
  KvCall(
      index, incarnation, absl::Seconds(10),
      [this, job, generation, key, index](std::function<void(absl::Status)> reply) {
        reply(coordinator_->KvSet(coordinator::KvScope{JobId(job), Generation(generation)}, key,
                                  absl::StrCat("address-of-w", index)));
      },
      std::move(done));
}

void World::KvWaitFor(int index, uint64_t incarnation, const std::string& job,
                      uint64_t generation, const std::string& key, absl::Duration timeout,
                      std::function<void(absl::Status)> done) {
  // The client's deadline: the server's cap on the wait plus a margin.
  KvCall(
      index, incarnation, timeout + absl::Seconds(5),
      [this, job, generation, key, timeout](std::function<void(absl::Status)> reply) {
        coordinator_->KvWaitFor(coordinator::KvScope{JobId(job), Generation(generation)}, key,
                                timeout, [reply](absl::StatusOr<std::string> value) {
                                  reply(value.status());
                                });
      },
      std::move(done));
}

}  // namespace cohort::simulation
