#include "tools/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/process_info.h"
#include "tools/sim/latency_stats.h"
#include "tools/sim/proc_stat.h"

namespace cohort::sim {
namespace {

// Heartbeats per second one scheduler thread is given before adding another.
constexpr double kHeartbeatsPerTimerThread = 2500;
constexpr int kMaxTimerThreads = 4;

absl::Status Validate(const SimConfig& c) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("cohort-sim: ", what));
  };
  if (c.coordinator.empty()) return bad("--coordinator host:port is required");
  if (c.workers < 1) return bad("--workers must be at least 1");
  if (!(c.rate > 0) || !std::isfinite(c.rate)) return bad("--rate must be a positive number");
  if (c.duration <= absl::ZeroDuration()) return bad("--duration must be positive");
  if (c.warmup < absl::ZeroDuration()) return bad("--warmup must not be negative");
  if (c.channels < 0) return bad("--channels must be 0 (auto) or positive");
  if (c.workers_per_host < 1) return bad("--workers_per_host must be at least 1");
  if (c.attach_batch < 1) return bad("--attach_batch must be at least 1");
  if (c.attach_timeout <= absl::ZeroDuration()) return bad("--attach_timeout must be positive");
  if (c.timer_threads < 0) return bad("--timer_threads must be 0 (auto) or positive");
  if (c.queues < 0) return bad("--queues must be 0 (auto) or positive");
  return absl::OkStatus();
}

double Seconds(int64_t nanos) { return static_cast<double>(nanos) / 1e9; }

}  // namespace

absl::StatusOr<std::unique_ptr<Simulator>> Simulator::Create(SimConfig config) {
  if (absl::Status status = Validate(config); !status.ok()) return status;
  std::unique_ptr<Simulator> sim(new Simulator(std::move(config)));
  const SimConfig& c = sim->config_;
  absl::StatusOr<CoordinatorTarget> target = MakeCoordinatorTarget(c.coordinator, c.tls);
  if (!target.ok()) return target.status();

  const int channels = c.channels > 0 ? std::min(c.channels, c.workers)
                                      : (c.workers + kWorkersPerChannel - 1) / kWorkersPerChannel;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    // A private subchannel pool plus a distinct argument: each channel gets
    // its own TCP connection instead of sharing one.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("cohort.sim_channel", i);
    std::shared_ptr<grpc::Channel> channel = target->NewChannel(args);
    sim->stubs_.push_back(v1::Workers::NewStub(channel));
    sim->channels_.push_back(std::move(channel));
  }

  const int queues = c.queues > 0
                         ? c.queues
                         : std::clamp((c.workers + kWorkersPerQueue - 1) / kWorkersPerQueue, 1, 8);
  for (int i = 0; i < queues; ++i) {
    sim->queues_.push_back(std::make_unique<grpc::CompletionQueue>());
    grpc::CompletionQueue* queue = sim->queues_.back().get();
    sim->queue_threads_.emplace_back([queue] {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) SimWorker::Proceed(tag, ok);
    });
  }

  std::mt19937_64 rng(NewIncarnation().value());
  sim->workers_.reserve(c.workers);
  for (int i = 0; i < c.workers; ++i) {
    SimWorker::Options options;
    options.worker_id = absl::StrCat(c.name_prefix, "-", i);
    options.host = absl::StrCat(c.name_prefix, "-host-", i / c.workers_per_host);
    options.device_index = i % c.workers_per_host;
    do {
      options.incarnation = rng();
    } while (options.incarnation == 0);
    sim->workers_.push_back(
        std::make_unique<SimWorker>(std::move(options), sim->window_.get(), sim->counters_.get()));
  }
  return sim;
}

Simulator::~Simulator() {
  CloseAll();
  StopQueues();
  if (abandoned_) {
    // Abandoned streams still point at the window and counters.
    (void)window_.release();
    (void)counters_.release();
  }
}

void Simulator::StopQueues() {
  for (const std::unique_ptr<grpc::CompletionQueue>& queue : queues_) queue->Shutdown();
  for (std::thread& thread : queue_threads_) {
    if (abandoned_) {
      // gRPC still holds abandoned streams' tags: their queues may never
      // drain. The process is about to exit.
      thread.detach();
    } else {
      thread.join();
    }
  }
  queue_threads_.clear();
  if (abandoned_) {
    for (std::unique_ptr<grpc::CompletionQueue>& queue : queues_) (void)queue.release();
  }
  queues_.clear();
}

absl::StatusOr<SimReport> Simulator::Run() {
  const absl::Duration interval = absl::Seconds(1.0 / config_.rate);
  int timer_threads = config_.timer_threads;
  if (timer_threads == 0) {
    timer_threads = std::clamp(
        static_cast<int>(std::ceil(config_.workers * config_.rate / kHeartbeatsPerTimerThread)), 1,
        kMaxTimerThreads);
  }
  // Heartbeats start with the first Welcome: a worker attached early in a
  // long ramp must not be declared lost while the rest attach.
  scheduler_ = std::make_unique<HeartbeatScheduler>(
      HeartbeatScheduler::Options{config_.workers, interval, timer_threads},
      [this](int index) { workers_[index]->SendHeartbeat(); });
  scheduler_->Start();
  LOG(INFO) << "attaching " << config_.workers << " workers to " << config_.coordinator << " over "
            << stubs_.size() << " channels and " << queues_.size()
            << " completion queues, batches of " << config_.attach_batch << "; heartbeat every "
            << absl::FormatDuration(interval) << " (" << timer_threads << " timer threads)";

  absl::Duration attach_time;
  if (absl::Status status = AttachAll(&attach_time); !status.ok()) {
    CloseAll();
    return status;
  }
  LOG(INFO) << "attached " << config_.workers << "/" << config_.workers << " in "
            << absl::FormatDuration(attach_time);
  const uint32_t timeout_ms = counters_->heartbeat_timeout_ms.load();
  if (timeout_ms > 0 && interval >= absl::Milliseconds(timeout_ms)) {
    LOG(WARNING) << "heartbeat interval " << absl::FormatDuration(interval)
                 << " is not below the coordinator's heartbeat timeout " << timeout_ms
                 << " ms: workers will be declared lost";
  }

  if (config_.on_attached) config_.on_attached();
  if (config_.warmup > absl::ZeroDuration()) {
    LOG(INFO) << "warming up for " << absl::FormatDuration(config_.warmup);
    absl::SleepFor(config_.warmup);
  }

  SimReport report;
  report.workers = config_.workers;
  report.rate = config_.rate;
  report.attach_seconds = absl::ToDoubleSeconds(attach_time);
  Measure(&report);
  WaitForWindowAcks();
  if (config_.before_close) config_.before_close();
  // Streams that broke before we closed them are errors of the run.
  CloseAll();

  std::vector<double> rtts;
  for (const std::unique_ptr<SimWorker>& worker : workers_) {
    if (worker == nullptr) continue;  // abandoned by CloseAll
    SimWorker::Results results = worker->TakeResults();
    rtts.insert(rtts.end(), results.rtt_ms.begin(), results.rtt_ms.end());
    report.unacked_heartbeats += results.unacked;
  }
  report.attached = counters_->attached.load();
  report.stream_errors = counters_->stream_errors.load();
  report.assignments = counters_->assignments.load();
  report.heartbeat = SummarizeLatencies(std::move(rtts));
  if (report.stream_errors > 0) LOG(WARNING) << "stream errors, first: " << FirstError();
  return report;
}

absl::Status Simulator::AttachAll(absl::Duration* attach_time) {
  const int n = config_.workers;
  const int64_t start_ns = MonotonicNanos();
  const absl::Time deadline = absl::Now() + config_.attach_timeout;
  absl::Time last_log = absl::Now();
  for (int begin = 0; begin < n; begin += config_.attach_batch) {
    const int end = std::min(n, begin + config_.attach_batch);
    for (int i = begin; i < end; ++i) {
      workers_[i]->Start(stubs_[i % stubs_.size()].get(), queues_[i % queues_.size()].get());
    }
    // The next batch waits until this one is welcomed, so the coordinator
    // never has more than attach_batch Hellos queued from us.
    while (counters_->attached.load() < end) {
      if (counters_->failed_attach.load() > 0 || counters_->stream_errors.load() > 0) {
        return absl::UnavailableError(absl::StrCat("attach failed after ",
                                                   counters_->attached.load(), "/", n,
                                                   " workers attached: ", FirstError()));
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("only ", counters_->attached.load(), "/", n, " workers attached within ",
                         absl::FormatDuration(config_.attach_timeout), " (--attach_timeout)"));
      }
      if (now - last_log >= absl::Seconds(1)) {
        LOG(INFO) << "attached " << counters_->attached.load() << "/" << n;
        last_log = now;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  *attach_time = absl::Nanoseconds(counters_->last_welcome_ns.load() - start_ns);
  return absl::OkStatus();
}

void Simulator::Measure(SimReport* report) {
  std::optional<double> cpu_start;
  if (config_.coordinator_pid.has_value()) {
    absl::StatusOr<double> cpu = ReadProcessCpuSeconds(*config_.coordinator_pid);
    if (cpu.ok()) {
      cpu_start = *cpu;
    } else {
      LOG(WARNING) << "coordinator CPU not measured: " << cpu.status();
    }
  }
  const int64_t open_ns = MonotonicNanos();
  window_->Open(open_ns);
  LOG(INFO) << "measuring for " << absl::FormatDuration(config_.duration);
  const absl::Time end = absl::Now() + config_.duration;
  absl::Time next_log = absl::Now() + absl::Seconds(5);
  for (absl::Time now = absl::Now(); now < end; now = absl::Now()) {
    absl::SleepFor(std::min(end - now, absl::Milliseconds(200)));
    if (absl::Now() >= next_log && absl::Now() < end) {
      LOG(INFO) << "measuring: "
                << absl::FormatDuration(absl::Trunc(end - absl::Now(), absl::Seconds(1)))
                << " left, " << counters_->done.load() << " streams ended";
      next_log += absl::Seconds(5);
    }
  }
  const int64_t close_ns = MonotonicNanos();
  window_->Close(close_ns);
  if (cpu_start.has_value()) {
    absl::StatusOr<double> cpu = ReadProcessCpuSeconds(*config_.coordinator_pid);
    if (cpu.ok()) {
      report->coordinator_cpu_seconds = *cpu - *cpu_start;
    } else {
      LOG(WARNING) << "coordinator CPU not measured: " << cpu.status();
    }
  }
  report->window_seconds = Seconds(close_ns - open_ns);
}

void Simulator::WaitForWindowAcks() {
  // Acks of heartbeats sent just before the window closed are still on their
  // way; give them a bounded grace period.
  const absl::Duration interval = absl::Seconds(1.0 / config_.rate);
  const absl::Time deadline =
      absl::Now() + std::min(absl::Seconds(10), std::max(absl::Seconds(2), 3 * interval));
  while (absl::Now() < deadline) {
    int64_t pending = 0;
    for (const std::unique_ptr<SimWorker>& worker : workers_) pending += worker->PendingInWindow();
    if (pending == 0) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void Simulator::CloseAll() {
  if (closed_) return;
  closed_ = true;
  // Streams close first, heartbeats stop after: closing 10,000 streams can
  // take longer than the coordinator's heartbeat timeout, and a worker gone
  // silent before its stream closed would be declared lost (and its stream
  // ended with an error) at the very end of a clean run.
  for (const std::unique_ptr<SimWorker>& worker : workers_) worker->Close();
  if (scheduler_ != nullptr) scheduler_->Stop();
  auto all_done = [this] {
    for (const std::unique_ptr<SimWorker>& worker : workers_) {
      if (!worker->done()) return false;
    }
    return true;
  };
  auto wait = [&](absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!all_done()) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  };
  if (wait(config_.shutdown_timeout)) return;
  int cancelled = 0;
  for (const std::unique_ptr<SimWorker>& worker : workers_) {
    if (!worker->done()) {
      worker->Cancel();
      ++cancelled;
    }
  }
  LOG(WARNING) << cancelled << " streams did not finish within "
               << absl::FormatDuration(config_.shutdown_timeout) << " of WritesDone; cancelled";
  if (wait(absl::Seconds(5))) return;
  // gRPC still holds these streams' tags: freeing them would be a use-after-free,
  // so they are leaked deliberately (the process is about to exit).
  int leaked = 0;
  for (std::unique_ptr<SimWorker>& worker : workers_) {
    if (!worker->done()) {
      (void)worker.release();
      ++leaked;
    }
  }
  abandoned_ = true;
  LOG(ERROR) << leaked << " streams still not finished after cancel; abandoned";
}

std::string Simulator::FirstError() {
  for (const std::unique_ptr<SimWorker>& worker : workers_) {
    if (worker == nullptr) continue;
    std::string error = worker->error();
    if (!error.empty()) return error;
  }
  return "(no stream reported an error yet)";
}

}  // namespace cohort::sim
