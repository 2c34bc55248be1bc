#include "tools/sim/churn_driver.h"

#include <chrono>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "grpcpp/client_context.h"

namespace cohort::sim {
namespace {

constexpr absl::Duration kCallDeadline = absl::Seconds(10);

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(kCallDeadline));
}

// Sleeps until `until` or until `stop` is set, in small steps.
void SleepUntil(absl::Time until, const std::atomic<bool>& stop) {
  while (!stop.load() && absl::Now() < until) {
    absl::SleepFor(std::min(until - absl::Now(), absl::Milliseconds(20)));
  }
}

}  // namespace

v1::JobSpec ChurnDriver::SimJobSpec(const std::string& name, int min_workers, int max_workers) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_device_kind(v1::DEVICE_KIND_CPU);
  v1::ModelConfig* model = spec.mutable_model();
  model->set_layers(2);
  model->set_heads(4);
  model->set_width(64);
  model->set_vocab_size(256);
  model->set_context_length(64);
  spec.mutable_data()->mutable_synthetic()->set_seed(1);
  spec.mutable_data()->set_seed(1);
  spec.mutable_optimizer()->set_learning_rate(1e-3);
  // One micro-batch per worker at the largest size (2 and 4 both divide 4).
  spec.mutable_batch()->set_micro_batch_size(1);
  spec.mutable_batch()->set_global_batch_size(max_workers);
  spec.set_steps(1000000);  // simulated workers never finish
  spec.mutable_elastic()->set_min_workers(min_workers);
  spec.mutable_elastic()->set_max_workers(max_workers);
  return spec;
}

absl::StatusOr<std::unique_ptr<ChurnDriver>> ChurnDriver::Create(ChurnConfig config) {
  if (config.submits_per_second < 0 || config.replanning_jobs < 0 || config.probe_workers < 0 ||
      config.live_jobs < 1) {
    return absl::InvalidArgumentError(
        "churn: rates and counts must be >= 0 (live jobs >= 1)");
  }
  absl::StatusOr<CoordinatorTarget> target = MakeCoordinatorTarget(config.coordinator, config.tls);
  if (!target.ok()) return target.status();
  std::unique_ptr<ChurnDriver> driver(new ChurnDriver(std::move(config)));
  grpc::ChannelArguments args;
  args.SetInt("cohort.churn_channel", 1);  // a connection of its own
  driver->stub_ = v1::Jobs::NewStub(target->NewChannel(args));
  return driver;
}

ChurnDriver::~ChurnDriver() {
  stop_ = true;
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void ChurnDriver::Start() {
  if (config_.submits_per_second > 0) threads_.emplace_back([this] { SubmitLoop(); });
  for (int i = 0; i < config_.replanning_jobs; ++i) {
    threads_.emplace_back([this, i] { ReplanLoop(i); });
  }
  if (config_.probe_workers > 0) threads_.emplace_back([this] { Probe(); });
}

ChurnReport ChurnDriver::Stop() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  std::vector<std::string> made;
  {
    absl::MutexLock lock(&mu_);
    made.assign(made_.begin(), made_.end());
  }
  for (const std::string& id : made) Cancel(id);  // the ones still live
  ChurnReport report;
  report.submitted = submitted_.load();
  report.cancelled = cancelled_.load();
  report.replans = replans_.load();
  report.call_errors = errors_.load();
  if (probe_seconds_.load() >= 0) report.probe_seconds = probe_seconds_.load();
  absl::MutexLock lock(&mu_);
  report.first_error = first_error_;
  return report;
}

void ChurnDriver::Error(const std::string& what, const absl::Status& status) {
  errors_.fetch_add(1);
  LOG(WARNING) << "churn: " << what << ": " << status;
  absl::MutexLock lock(&mu_);
  if (first_error_.empty()) first_error_ = absl::StrCat(what, ": ", status.ToString());
}

std::optional<v1::Job> ChurnDriver::Submit(const v1::JobSpec& spec) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  const grpc::Status status = stub_->Submit(&context, request, &job);
  if (!status.ok()) {
    Error(absl::StrCat("Submit ", spec.name()), FromGrpcStatus(status));
    return std::nullopt;
  }
  submitted_.fetch_add(1);
  absl::MutexLock lock(&mu_);
  made_.insert(job.job_id());
  return job;
}

bool ChurnDriver::Cancel(const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  const grpc::Status status = stub_->Cancel(&context, request, &job);
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {  // finished already
    absl::MutexLock lock(&mu_);
    made_.erase(job_id);
    return false;
  }
  if (!status.ok()) {
    Error(absl::StrCat("Cancel ", job_id), FromGrpcStatus(status));
    return false;
  }
  cancelled_.fetch_add(1);
  absl::MutexLock lock(&mu_);
  made_.erase(job_id);
  return true;
}

std::optional<v1::Job> ChurnDriver::Get(const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  const grpc::Status status = stub_->Get(&context, request, &job);
  if (!status.ok()) {
    Error(absl::StrCat("Get ", job_id), FromGrpcStatus(status));
    return std::nullopt;
  }
  return job;
}

bool ChurnDriver::Scale(const std::string& job_id, int workers) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::ScaleJobRequest request;
  request.set_job_id(job_id);
  request.set_min_workers(workers);
  request.set_max_workers(workers);
  v1::Job job;
  const grpc::Status status = stub_->Scale(&context, request, &job);
  if (!status.ok()) {
    Error(absl::StrCat("Scale ", job_id), FromGrpcStatus(status));
    return false;
  }
  return true;
}

bool ChurnDriver::WaitRunning(const std::string& job_id, uint64_t after, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!stop_.load() && absl::Now() < deadline) {
    std::optional<v1::Job> job = Get(job_id);
    if (job.has_value() && job->state() == v1::JOB_STATE_RUNNING && job->generation() > after) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

void ChurnDriver::SubmitLoop() {
  std::deque<std::string> live;
  const absl::Duration period = absl::Seconds(1 / config_.submits_per_second);
  absl::Time next = absl::Now();
  for (int i = 0; !stop_.load(); ++i) {
    SleepUntil(next, stop_);
    if (stop_.load()) break;
    next += period;
    std::optional<v1::Job> job =
        Submit(SimJobSpec(absl::StrCat(config_.name_prefix, "-c", i % 1000), 1, 1));
    if (job.has_value()) live.push_back(job->job_id());
    while (static_cast<int>(live.size()) > config_.live_jobs) {
      Cancel(live.front());
      live.pop_front();
    }
  }
}

void ChurnDriver::ReplanLoop(int index) {
  std::optional<v1::Job> job =
      Submit(SimJobSpec(absl::StrCat(config_.name_prefix, "-r", index), 2, 4));
  if (!job.has_value()) return;
  if (!WaitRunning(job->job_id(), 0, absl::Seconds(60))) return;
  for (int workers = 2; !stop_.load(); workers = workers == 2 ? 4 : 2) {
    std::optional<v1::Job> now = Get(job->job_id());
    if (!now.has_value()) return;
    if (!Scale(job->job_id(), workers)) {
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (WaitRunning(job->job_id(), now->generation(), absl::Seconds(60))) replans_.fetch_add(1);
    SleepUntil(absl::Now() + config_.replan_pause, stop_);
  }
}

void ChurnDriver::Probe() {
  // Let the other traffic start first.
  SleepUntil(absl::Now() + absl::Seconds(2), stop_);
  if (stop_.load()) return;
  const absl::Time start = absl::Now();
  std::optional<v1::Job> job = Submit(SimJobSpec(
      absl::StrCat(config_.name_prefix, "-probe"), config_.probe_workers, config_.probe_workers));
  if (!job.has_value()) return;
  if (WaitRunning(job->job_id(), 0, absl::Seconds(120))) {
    probe_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
  } else if (!stop_.load()) {
    Error("the probe job", absl::DeadlineExceededError("not RUNNING within 120 s"));
  }
}

}  // namespace cohort::sim
