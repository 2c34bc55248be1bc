// Fuzz target: the coordinator's request handling below the gRPC layer.
//
// Each input is a fresh in-process coordinator as CoordinatorServer wires it
// (Coordinator over an InMemoryJobStore, CheckpointUploads over an
// InMemoryCheckpointStore, a FakeClock) driven by a sequence of records
// (fuzz_support.h): the selector picks an RPC, the payload is its serialized
// request. The checks the gRPC glue in coordinator/service/*.cc makes before
// calling the facade (empty job ids, KV scopes, the first message of an
// Attach stream, the chunk framing of an Upload stream, Download's chunk
// references) are repeated here as the glue makes them, so what reaches the
// facade is what a client can make reach it. Requests that do not parse are
// skipped.
//
// Checks, besides the sanitizers and CHECKs: every error is a proper status
// (a canonical code other than UNKNOWN, with a message); a KeyValue.WaitFor
// callback runs exactly once (at the latest when its deadline passes); a
// Watch sink gets no event after OnFinished.

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cohort/v1/checkpoints.pb.h"
#include "cohort/v1/jobs.pb.h"
#include "cohort/v1/kv.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/clock.h"
#include "common/command_target.h"
#include "common/status_macros.h"
#include "coordinator/attach_protocol.h"
#include "coordinator/checkpoints/checkpoint_store.h"
#include "coordinator/checkpoints/checkpoint_uploads.h"
#include "coordinator/checkpoints/upload_framing.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/jobs/job_store.h"
#include "fuzz/coordinator_rpc_ops.h"
#include "fuzz/fuzz_support.h"
#include "prometheus/registry.h"

namespace cohort::fuzz {
namespace {

using coordinator::CheckpointJobState;
using coordinator::CheckpointReader;
using coordinator::CheckpointUploads;
using coordinator::CheckpointUploadsOptions;
using coordinator::Coordinator;
using coordinator::InMemoryCheckpointStore;
using coordinator::InMemoryJobStore;
using coordinator::KvScope;
using coordinator::UploadFraming;


constexpr int kStreamSlots = 8;
constexpr int kUploadSlots = 4;
// The coordinator's smallest allowed --max_checkpoint_chunk_bytes, so that
// inputs need not be huge to hit the limit.
constexpr int64_t kMaxChunkBytes = 1 << 20;

template <typename Message>
bool Parse(std::string_view bytes, Message* message) {
  return message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

// The first payload byte as a slot index, and the rest.
std::pair<int, std::string_view> SplitSlot(std::string_view payload, int slots) {
  if (payload.empty()) return {0, payload};
  return {static_cast<uint8_t>(payload[0]) % slots, payload.substr(1)};
}

absl::Status RequireJobId(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: must not be empty");
  return absl::OkStatus();
}

// kv_service.cc's ParseScope.
absl::StatusOr<KvScope> ParseScope(const v1::KvScope& scope) {
  if (scope.job_id().empty()) return absl::InvalidArgumentError("scope.job_id: must not be empty");
  if (scope.generation() == 0) {
    return absl::InvalidArgumentError("scope.generation: must be a job generation (>= 1)");
  }
  return KvScope{JobId(scope.job_id()), Generation(scope.generation())};
}

// Keeps the last job-bearing message a worker was sent, so that kWorkerReply
// can answer it the way a worker would.
class FuzzWorkerSink : public coordinator::WorkerSink {
 public:
  void Send(v1::CoordinatorMessage message) override {
    if (std::optional<CommandTarget> target = CommandTargetOf(message)) {
      job_ = std::move(target->job_id);
      generation_ = target->generation;
    }
  }
  const std::string& job() const { return job_; }
  uint64_t generation() const { return generation_; }

 private:
  std::string job_;
  uint64_t generation_ = 0;
};

class FuzzWatchSink : public coordinator::JobEventSink {
 public:
  void OnEvent(const v1::JobEvent& event) override {
    Require(!finished_, "a Watch sink got an event after OnFinished");
  }
  void OnFinished() override {
    Require(!finished_, "a Watch sink got OnFinished twice");
    finished_ = true;
  }

 private:
  bool finished_ = false;
};

// One Attach stream, as attach_streams.cc's AttachCall sees it; its
// messages go through the server's own HandleAttachMessage.
struct AttachStream {
  std::optional<coordinator::AttachedWorker> worker;
  std::shared_ptr<FuzzWorkerSink> sink;
};

// One Upload stream, as checkpoints_service.cc's UploadReactor sees it (with
// chunks stored inline), framed by the reactor's own UploadFraming.
struct UploadStream {
  UploadFraming framing{kMaxChunkBytes};
  std::unique_ptr<CheckpointUploads::Writer> writer;
  std::string buffer;
};

class Harness {
 public:
  Harness() : metrics_(std::make_shared<prometheus::Registry>()) {
    Coordinator::Options options;
    options.coordinator_id = "fuzz";
    InMemoryCheckpointStore* store = &store_;
    options.checkpoint_exists = [store](const JobId& job, std::optional<Step> step) {
      return store->Open(job, step).status();
    };
    options.latest_checkpoint = [store](const JobId& job) { return store->NewestStep(job); };
    absl::StatusOr<std::unique_ptr<Coordinator>> created =
        Coordinator::Create(options, std::make_unique<InMemoryJobStore>(), &clock_, &metrics_);
    Require(created.ok(), "Coordinator::Create failed on an empty store");
    coordinator_ = *std::move(created);
    Coordinator* coordinator = coordinator_.get();
    CheckpointUploadsOptions uploads;
    uploads.max_chunk_bytes = kMaxChunkBytes;
    uploads_ = std::make_unique<CheckpointUploads>(
        &store_,
        [coordinator](const JobId& id) -> absl::StatusOr<CheckpointJobState> {
          absl::StatusOr<v1::Job> job = coordinator->GetJob(id);
          if (!job.ok()) return job.status();
          CheckpointJobState state;
          state.generation = Generation(job->generation());
          state.policy = job->spec().checkpoint();
          state.accepts_checkpoints =
              job->state() != v1::JOB_STATE_CANCELLED && job->state() != v1::JOB_STATE_FAILED;
          return state;
        },
        &clock_, uploads);
  }

  ~Harness() {
    for (UploadStream& upload : uploads_streams_) upload = UploadStream();
    uploads_.reset();
    coordinator_.reset();
  }

  void Run(const Record& record) {
    switch (static_cast<Op>(record.selector % kOpCount)) {
      case kSubmit: {
        v1::SubmitJobRequest request;
        if (!Parse(record.payload, &request)) return;
        Check(coordinator_->Submit(request).status(), "Jobs.Submit");
        return;
      }
      case kGetJob: {
        v1::GetJobRequest request;
        if (!Parse(record.payload, &request)) return;
        if (!Check(RequireJobId(request.job_id()), "Jobs.Get")) return;
        Check(coordinator_->GetJob(JobId(request.job_id())).status(), "Jobs.Get");
        return;
      }
      case kListJobs: {
        v1::ListJobsRequest request;
        if (!Parse(record.payload, &request)) return;
        coordinator_->ListJobs(request.include_finished());
        return;
      }
      case kCancel: {
        v1::CancelJobRequest request;
        if (!Parse(record.payload, &request)) return;
        if (!Check(RequireJobId(request.job_id()), "Jobs.Cancel")) return;
        Check(coordinator_->Cancel(JobId(request.job_id())).status(), "Jobs.Cancel");
        return;
      }
      case kScale: {
        v1::ScaleJobRequest request;
        if (!Parse(record.payload, &request)) return;
        if (!Check(RequireJobId(request.job_id()), "Jobs.Scale")) return;
        Check(coordinator_->Scale(request).status(), "Jobs.Scale");
        return;
      }
      case kWatch: {
        v1::WatchJobRequest request;
        if (!Parse(record.payload, &request)) return;
        if (!Check(RequireJobId(request.job_id()), "Jobs.Watch")) return;
        absl::StatusOr<uint64_t> handle =
            coordinator_->Watch(JobId(request.job_id()), std::make_shared<FuzzWatchSink>());
        if (Check(handle.status(), "Jobs.Watch")) watches_.push_back(*handle);
        return;
      }
      case kUnwatch: {
        if (watches_.empty()) return;
        const size_t i = record.payload.empty() ? 0 : static_cast<uint8_t>(record.payload[0]);
        const size_t index = i % watches_.size();
        coordinator_->Unwatch(watches_[index]);
        watches_.erase(watches_.begin() + static_cast<std::ptrdiff_t>(index));
        return;
      }
      case kKvSet: {
        v1::SetRequest request;
        if (!Parse(record.payload, &request)) return;
        absl::StatusOr<KvScope> scope = ParseScope(request.scope());
        if (!Check(scope.status(), "KeyValue.Set")) return;
        Check(coordinator_->KvSet(*scope, request.key(), request.value()), "KeyValue.Set");
        return;
      }
      case kKvGet: {
        v1::GetRequest request;
        if (!Parse(record.payload, &request)) return;
        absl::StatusOr<KvScope> scope = ParseScope(request.scope());
        if (!Check(scope.status(), "KeyValue.Get")) return;
        Check(coordinator_->KvGet(*scope, request.key()).status(), "KeyValue.Get");
        return;
      }
      case kKvWaitFor:
        return WaitFor(record.payload);
      case kAttachMessage:
        return AttachMessage(record.payload);
      case kAttachClose: {
        auto [slot, unused] = SplitSlot(record.payload, kStreamSlots);
        CloseStream(slot);
        return;
      }
      case kWorkerReply:
        return WorkerReply(record.payload);
      case kListWorkers:
        coordinator_->ListWorkers();
        return;
      case kDrain: {
        v1::DrainWorkerRequest request;
        if (!Parse(record.payload, &request)) return;
        Check(coordinator_->DrainWorker(WorkerId(request.worker_id()), request.reason()).status(),
              "Workers.Drain");
        return;
      }
      case kTick: {
        uint32_t ms = 0;
        for (size_t i = 0; i < record.payload.size() && i < 4; ++i) {
          ms |= static_cast<uint32_t>(static_cast<uint8_t>(record.payload[i])) << (8 * i);
        }
        clock_.Advance(absl::Milliseconds(ms % 120'000));
        coordinator_->Tick();
        uploads_->Tick();
        return;
      }
      case kUploadMessage:
        return UploadMessage(record.payload);
      case kUploadClose: {
        auto [slot, unused] = SplitSlot(record.payload, kUploadSlots);
        uploads_streams_[slot] = UploadStream();
        return;
      }
      case kListCheckpoints: {
        v1::ListCheckpointsRequest request;
        if (!Parse(record.payload, &request)) return;
        if (!Check(RequireJobId(request.job_id()), "Checkpoints.List")) return;
        Check(store_.List(JobId(request.job_id())).status(), "Checkpoints.List");
        return;
      }
      case kGetManifest: {
        v1::GetManifestRequest request;
        if (!Parse(record.payload, &request)) return;
        if (!Check(RequireJobId(request.job_id()), "Checkpoints.GetManifest")) return;
        Check(store_.Open(JobId(request.job_id()), coordinator::StepOrNewest(request.step())).status(),
              "Checkpoints.GetManifest");
        return;
      }
      case kDownload:
        return Download(record.payload);
      case kDeleteCheckpoint: {
        v1::DeleteCheckpointRequest request;
        if (!Parse(record.payload, &request)) return;
        if (!Check(RequireJobId(request.job_id()), "Checkpoints.Delete")) return;
        if (request.step() < 0) return;  // InvalidArgument in the glue
        Check(store_.Delete(JobId(request.job_id()), Step(request.step())), "Checkpoints.Delete");
        return;
      }
      case kQuiesce:
        coordinator_->Quiesce();
        quiesced_ = true;
        return;
      case kOpCount:
        return;
    }
  }

  // After the last record: every KV waiter has its answer once its
  // deadline (at most max_kv_wait) has passed.
  void Finish() {
    clock_.Advance(coordinator_->options().max_kv_wait + absl::Seconds(1));
    coordinator_->Tick();
    uploads_->Tick();
    if (quiesced_) return;
    for (const auto& calls : waiters_) {
      Require(*calls == 1, "a KeyValue.WaitFor callback did not run by its deadline");
    }
  }

 private:
  // Checks an error's form; true when `status` is OK.
  bool Check(const absl::Status& status, const char* what) {
    CheckHandlerError(status, what);
    return status.ok();
  }

  void WaitFor(std::string_view payload) {
    v1::WaitForRequest request;
    if (!Parse(payload, &request)) return;
    absl::StatusOr<KvScope> scope = ParseScope(request.scope());
    if (!Check(scope.status(), "KeyValue.WaitFor")) return;
    auto calls = std::make_shared<int>(0);
    waiters_.push_back(calls);
    coordinator_->KvWaitFor(*scope, request.key(), absl::Milliseconds(request.timeout_ms()),
                            [calls](absl::StatusOr<std::string> value) {
                              Require(*calls == 0, "a KeyValue.WaitFor callback ran twice");
                              ++*calls;
                              CheckHandlerError(value.status(), "KeyValue.WaitFor");
                            });
  }

  // An Attach stream message, through the server's own protocol code.
  absl::Status HandleAttach(AttachStream& stream, const v1::WorkerMessage& message) {
    if (!stream.worker.has_value()) stream.sink = std::make_shared<FuzzWorkerSink>();
    return coordinator::HandleAttachMessage(*coordinator_, coordinator::WorkerIdentity::Any(),
                                            message, stream.sink, stream.worker);
  }

  void AttachMessage(std::string_view payload) {
    auto [slot, bytes] = SplitSlot(payload, kStreamSlots);
    v1::WorkerMessage message;
    if (!Parse(bytes, &message)) return;
    Deliver(slot, message);
  }

  void Deliver(int slot, const v1::WorkerMessage& message) {
    absl::Status status = HandleAttach(streams_[slot], message);
    if (!Check(status, "Workers.Attach")) CloseStream(slot);  // the reactor finishes the call
  }

  void CloseStream(int slot) {
    AttachStream& stream = streams_[slot];
    if (stream.worker.has_value()) {
      coordinator_->Detach(stream.worker->id, stream.worker->incarnation, stream.sink.get());
    }
    stream = AttachStream();
  }

  // A worker's answer to its last assignment: payload = slot, state, step.
  void WorkerReply(std::string_view payload) {
    auto [slot, rest] = SplitSlot(payload, kStreamSlots);
    const AttachStream& stream = streams_[slot];
    if (!stream.worker.has_value()) return;
    const uint8_t state = rest.empty() ? 0 : static_cast<uint8_t>(rest[0]);
    int64_t step = 0;
    for (size_t i = 1; i < rest.size() && i < 5; ++i) {
      step |= static_cast<int64_t>(static_cast<uint8_t>(rest[i])) << (8 * (i - 1));
    }
    v1::WorkerMessage message;
    message.set_incarnation(stream.worker->incarnation.value());
    if (state & 0x80) {
      v1::Heartbeat* heartbeat = message.mutable_heartbeat();
      heartbeat->set_sequence(static_cast<uint64_t>(step) + 1);
      heartbeat->set_job_id(stream.sink->job());
      heartbeat->set_generation(stream.sink->generation());
      heartbeat->mutable_progress()->set_step(step);
      heartbeat->mutable_progress()->set_waiting_for_peers(state & 0x40);
    } else {
      v1::AssignmentStatus* status = message.mutable_status();
      status->set_job_id(stream.sink->job());
      status->set_generation(stream.sink->generation());
      status->set_state(static_cast<v1::AssignmentState>(state % 16));
      status->mutable_progress()->set_step(step);
      if (status->state() == v1::ASSIGNMENT_STATE_SUSPENDED) {
        v1::HeldState* held = status->add_held_states();
        held->set_generation(stream.sink->generation());
        held->set_step(step);
      }
    }
    Deliver(slot, message);
  }

  // checkpoints_service.cc's UploadReactor, one message at a time.
  void UploadMessage(std::string_view payload) {
    auto [slot, bytes] = SplitSlot(payload, kUploadSlots);
    v1::UploadRequest request;
    if (!Parse(bytes, &request)) return;
    UploadStream& upload = uploads_streams_[slot];
    absl::Status status = HandleUpload(upload, request);
    if (!Check(status, "Checkpoints.Upload") || request.part_case() == v1::UploadRequest::kEnd) {
      upload = UploadStream();  // the call finished
    }
  }

  absl::Status HandleUpload(UploadStream& upload, const v1::UploadRequest& request) {
    switch (request.part_case()) {
      case v1::UploadRequest::kHeader: {
        RETURN_IF_ERROR(upload.framing.OnHeader());
        absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> writer =
            uploads_->Begin(request.header());
        if (!writer.ok()) return writer.status();
        upload.writer = *std::move(writer);
        return absl::OkStatus();
      }
      case v1::UploadRequest::kChunk:
        RETURN_IF_ERROR(upload.framing.OnChunk(request.chunk()));
        upload.buffer.clear();
        return absl::OkStatus();
      case v1::UploadRequest::kData: {
        absl::StatusOr<bool> complete = upload.framing.OnData(request.data().size());
        if (!complete.ok()) return complete.status();
        upload.buffer.append(request.data());
        if (!*complete) return absl::OkStatus();
        Require(upload.buffer.size() == upload.framing.chunk().bytes(),
                "UploadFraming completed a chunk with more or fewer bytes than it declared");
        return upload.writer->AddChunk(upload.framing.chunk(), upload.buffer);
      }
      case v1::UploadRequest::kEnd:
        RETURN_IF_ERROR(upload.framing.OnEnd());
        return upload.writer->End(request.end()).status();
      default:
        return absl::InvalidArgumentError("an UploadRequest with no part set");
    }
  }

  // checkpoints_service.cc's DownloadReactor::Open and its reads.
  void Download(std::string_view payload) {
    v1::DownloadRequest request;
    if (!Parse(payload, &request)) return;
    if (!Check(RequireJobId(request.job_id()), "Checkpoints.Download")) return;
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        store_.Open(JobId(request.job_id()), coordinator::StepOrNewest(request.step()));
    if (!Check(reader.status(), "Checkpoints.Download")) return;
    const v1::CheckpointManifest& manifest = (*reader)->manifest();
    std::map<std::string, const v1::TensorInfo*> by_name;
    for (const v1::TensorInfo& t : manifest.tensors()) by_name[t.name()] = &t;
    std::vector<std::pair<const v1::TensorInfo*, const v1::ChunkInfo*>> todo;
    if (request.chunks().empty()) {
      for (const v1::TensorInfo& t : manifest.tensors()) {
        for (const v1::ChunkInfo& c : t.chunks()) todo.push_back({&t, &c});
      }
    } else {
      for (const v1::ChunkRef& ref : request.chunks()) {
        auto it = by_name.find(ref.tensor());
        if (it == by_name.end()) return;                                              // NotFound
        if (ref.index() >= static_cast<uint32_t>(it->second->chunks_size())) return;  // NotFound
        todo.push_back({it->second, &it->second->chunks(static_cast<int>(ref.index()))});
      }
    }
    for (const auto& [tensor, chunk] : todo) {
      absl::StatusOr<coordinator::ChunkBytes> bytes = (*reader)->ReadChunk(*tensor, *chunk);
      if (!Check(bytes.status(), "Checkpoints.Download")) return;
      Require(bytes->size() == chunk->bytes(), "a downloaded chunk has the wrong size");
    }
  }

  FakeClock clock_;
  coordinator::CoordinatorMetrics metrics_;
  InMemoryCheckpointStore store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CheckpointUploads> uploads_;
  std::array<AttachStream, kStreamSlots> streams_;
  std::array<UploadStream, kUploadSlots> uploads_streams_;
  std::vector<uint64_t> watches_;
  std::vector<std::shared_ptr<int>> waiters_;
  bool quiesced_ = false;
};

}  // namespace
}  // namespace cohort::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cohort::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort::fuzz;
  Harness harness;
  RecordReader reader(std::string_view(reinterpret_cast<const char*>(data), size));
  Record record;
  int records = 0;
  // Long sequences add little and make slow inputs; the rest is ignored.
  while (records++ < 256 && reader.Next(&record)) harness.Run(record);
  harness.Finish();
  return 0;
}
