#include "coordinator/service/attach_streams.h"

#include <pthread.h>

#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "coordinator/attach_protocol.h"

namespace cohort::coordinator {
namespace {

// Requests kept waiting per queue. A stream arriving while all are taken
// waits inside gRPC until the next is posted, right after each match, so
// this bounds only how many attach at once without that short wait.
constexpr int kRequestsPerQueue = 32;

// Reading stops while this many messages wait to be written to the worker,
// and resumes once half have gone. A peer that sends and never reads its
// stream (each heartbeat queues an ack) then makes the coordinator hold at
// most this many messages, plus gRPC's flow-control window of its own, not
// one more per message it sends.
constexpr size_t kMaxOutbox = 64;

class AttachCall;

// The Coordinator's handle on one stream. It outlives the call (the
// Coordinator may hold it a little longer), so it forwards only while the
// call is alive.
class StreamSink : public WorkerSink {
 public:
  explicit StreamSink(AttachCall* call) : call_(call) {}
  void Send(v1::CoordinatorMessage message) override;
  void Close() override;
  void Clear() {
    absl::MutexLock lock(&mu_);
    call_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  AttachCall* call_ ABSL_GUARDED_BY(mu_);
};

// One Attach stream. Its completions all come through one queue, whose one
// thread runs them in order; Enqueue and Supersede come from any thread.
// At most one read, one write and one Finish are outstanding; messages wait
// in `outbox_`, and no read is started while it holds kMaxOutbox. The
// message being written is held apart from the outbox (`in_flight_`), until
// its write's completion, so that what empties the outbox (the call's end,
// a Finish) never touches it: gRPC may report the call done before an
// outstanding write completes, and that write may still complete ok (issue
// 43: a completion that popped the outbox the end had emptied destroyed a
// message twice). The object deletes itself once gRPC holds none of its
// tags.
class AttachCall {
 public:
  enum class Op { kRequested, kRead, kWrite, kFinish, kDone };
  // The tag of each operation: which call, which operation.
  struct Event {
    AttachCall* call;
    Op op;
  };

  AttachCall(AttachStreams* streams, AttachStreams::Queue* queue)
      : streams_(streams), queue_(queue), stream_(&context_) {}

  // Waits for the next stream. False (and the object is the caller's to
  // delete) when the queue is closed.
  bool Request(const AttachStreams::RequestFn& request) {
    context_.AsyncNotifyWhenDone(&done_event_);
    absl::MutexLock lock(&mu_);
    requested_ =
        StartOp([&] { request(&context_, &stream_, queue_->cq.get(), &requested_event_); });
    return requested_;
  }

  // Runs one completion on the queue's thread; may delete the call.
  static void Proceed(void* tag, bool ok) {
    Event* event = static_cast<Event*>(tag);
    AttachCall* call = event->call;
    switch (event->op) {
      case Op::kRequested:
        call->OnRequested(ok);
        break;
      case Op::kRead:
        call->OnRead(ok);
        break;
      case Op::kWrite:
        call->OnWrite(ok);
        break;
      case Op::kFinish: {
        absl::MutexLock lock(&call->mu_);
        call->finishing_ = false;
        break;
      }
      case Op::kDone:
        call->OnDone();
        break;
    }
    call->MaybeDelete();
  }

  void Enqueue(v1::CoordinatorMessage message) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    outbox_.push_back(std::move(message));
    if (!writing_) StartNextWriteLocked();
  }

  // The same process attached again on a newer stream (Coordinator::Attach).
  void Supersede() {
    FinishOnce(grpc::Status(grpc::StatusCode::ABORTED,
                            "superseded by a newer Attach stream of the same process"));
  }

 private:
  void OnRequested(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      requested_ = false;
      started_ = ok;
    }
    if (!ok) return;               // the server shuts down: no stream came
    streams_->RequestOne(queue_);  // the queue's next stream
    peer_ = context_.peer();
    absl::StatusOr<StreamLimiter::Lease> lease =
        streams_->gate()->AdmitStream(context_, "Workers.Attach", Access::kWorker);
    if (!lease.ok()) {
      FinishOnce(ToGrpcStatus(lease.status()));
      return;
    }
    lease_ = *std::move(lease);
    identity_ = streams_->gate()->IdentityOf(context_);
    StartRead();
  }

  void OnRead(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
    }
    if (!ok) {
      // Client half-closed or the connection broke: either way the worker is
      // gone. Before any Hello it was no worker at all (or what it sent did
      // not parse): not a clean end.
      Lost("stream closed");
      FinishOnce(worker_.has_value()
                     ? grpc::Status::OK
                     : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "the Attach stream ended, or sent a message that does not "
                                    "parse, before its Hello"));
      return;
    }
    absl::Status status = Handle(incoming_);
    if (!status.ok()) {
      LOG(WARNING) << "Attach from " << peer_ << " ("
                   << (worker_ ? worker_->id.value() : std::string("no hello")) << "): " << status;
      Lost("refused");
      FinishOnce(ToGrpcStatus(status));
      return;
    }
    absl::MutexLock lock(&mu_);
    if (outbox_.size() >= kMaxOutbox) {
      read_paused_ = true;  // OnWrite resumes
      return;
    }
    StartReadLocked();
  }

  void OnWrite(bool ok) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    in_flight_.reset();
    if (!ok) outbox_.clear();  // the stream broke; the failed read reports it
    if (finished_) {
      if (!finish_started_) StartFinishLocked();
      return;
    }
    if (!outbox_.empty()) StartNextWriteLocked();
    if (read_paused_ && outbox_.size() <= kMaxOutbox / 2) {
      read_paused_ = false;
      StartReadLocked();
    }
  }

  // The call is over: finished, cancelled, or the connection is gone. A
  // write may still be outstanding; its message stays in `in_flight_`
  // until it completes.
  void OnDone() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      finished_ = true;  // nothing more to send, no status either
      finish_started_ = true;
      outbox_.clear();
    }
    Lost(context_.IsCancelled() ? "stream cancelled" : "stream done");
    if (sink_) sink_->Clear();
  }

  absl::Status Handle(const v1::WorkerMessage& message) {
    const bool hello = !worker_.has_value();
    // Made before the Hello is handled: the Welcome may be queued from
    // inside Attach.
    if (hello) sink_ = std::make_shared<StreamSink>(this);
    absl::Status status =
        HandleAttachMessage(*streams_->coordinator(), identity_, message, sink_, worker_);
    if (hello && !worker_.has_value()) sink_->Clear();
    return status;
  }

  // Reports the worker gone, once (queue thread only).
  void Lost(const char* why) {
    if (lost_reported_ || !worker_.has_value()) return;
    lost_reported_ = true;
    LOG(DEBUG) << "worker " << worker_->id << ": " << why;
    streams_->coordinator()->Detach(worker_->id, worker_->incarnation, sink_.get());
  }

  void FinishOnce(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    finish_status_ = std::move(status);
    // Queued messages are moot; the one being written completes first (one
    // write-like operation at a time).
    outbox_.clear();
    if (!writing_) StartFinishLocked();
  }

  void StartRead() {
    absl::MutexLock lock(&mu_);
    StartReadLocked();
  }

  void StartReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    reading_ = StartOp([&] { stream_.Read(&incoming_, &read_event_); });
  }

  void StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = StartOp([&] {
      in_flight_ = std::move(outbox_.front());
      outbox_.pop_front();
      stream_.Write(*in_flight_, &write_event_);
    });
    if (!writing_) outbox_.clear();
  }

  void StartFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finish_started_ = true;
    finishing_ = StartOp([&] { stream_.Finish(finish_status_, &finish_event_); });
  }

  // Starts a gRPC operation unless the queue is closed (then false).
  template <typename Start>
  bool StartOp(Start&& start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::ReaderMutexLock lock(&queue_->mu);
    if (!queue_->open) return false;
    start();
    return true;
  }

  void MaybeDelete() {
    {
      absl::MutexLock lock(&mu_);
      // A call that never started gets no done event.
      if (requested_ || reading_ || writing_ || finishing_ || (started_ && !done_)) return;
    }
    delete this;
  }

  AttachStreams* const streams_;
  AttachStreams::Queue* const queue_;
  grpc::ServerContext context_;
  AttachStreams::Stream stream_;
  Event requested_event_{this, Op::kRequested};
  Event read_event_{this, Op::kRead};
  Event write_event_{this, Op::kWrite};
  Event finish_event_{this, Op::kFinish};
  Event done_event_{this, Op::kDone};

  // Queue thread only.
  std::string peer_;
  StreamLimiter::Lease lease_;  // this client's stream slot
  WorkerIdentity identity_;     // who the client certificate may act as
  v1::WorkerMessage incoming_;  // the outstanding read's
  std::optional<AttachedWorker> worker_;
  std::shared_ptr<StreamSink> sink_;
  bool lost_reported_ = false;

  absl::Mutex mu_;
  // Which of the call's tags gRPC holds.
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  // A stream came, so the done event will too; it has come.
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  // Finish decided (no more writes); sent once no write is outstanding.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  // Messages waiting for their write, oldest first.
  std::deque<v1::CoordinatorMessage> outbox_ ABSL_GUARDED_BY(mu_);
  // The message of the outstanding write (set while writing_): gRPC's until
  // the write completes, whatever happens to the call meanwhile.
  std::optional<v1::CoordinatorMessage> in_flight_ ABSL_GUARDED_BY(mu_);
  // No read is outstanding because the outbox is full (kMaxOutbox).
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
};

void StreamSink::Send(v1::CoordinatorMessage message) {
  absl::MutexLock lock(&mu_);
  if (call_ != nullptr) call_->Enqueue(std::move(message));
}

void StreamSink::Close() {
  absl::MutexLock lock(&mu_);
  if (call_ != nullptr) call_->Supersede();
}

}  // namespace

AttachStreams::AttachStreams(Coordinator* coordinator, const CallGate* gate, RequestFn request)
    : coordinator_(coordinator), gate_(gate), request_(std::move(request)) {}

AttachStreams::~AttachStreams() { Shutdown(); }

void AttachStreams::AddQueues(grpc::ServerBuilder* builder, int queues) {
  CHECK(queues >= 1 && !started_) << "AttachStreams::AddQueues(" << queues << ")";
  for (int i = 0; i < queues; ++i) {
    auto queue = std::make_unique<Queue>();
    queue->cq = builder->AddCompletionQueue();
    queues_.push_back(std::move(queue));
  }
}

void AttachStreams::Start() {
  CHECK(!started_ && !queues_.empty()) << "AttachStreams::Start: call once, after AddQueues";
  started_ = true;
  for (size_t i = 0; i < queues_.size(); ++i) {
    Queue* queue = queues_[i].get();
    for (int k = 0; k < kRequestsPerQueue; ++k) RequestOne(queue);
    queue->thread = std::thread([this, queue, i] {
      pthread_setname_np(pthread_self(), absl::StrCat("attach-", i).c_str());
      Drain(queue);
    });
  }
}

bool AttachStreams::RequestOne(Queue* queue) {
  auto* call = new AttachCall(this, queue);
  if (call->Request(request_)) return true;
  delete call;
  return false;
}

void AttachStreams::Drain(Queue* queue) {
  void* tag = nullptr;
  bool ok = false;
  while (queue->cq->Next(&tag, &ok)) AttachCall::Proceed(tag, ok);
}

void AttachStreams::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  for (const std::unique_ptr<Queue>& queue : queues_) {
    {
      absl::MutexLock lock(&queue->mu);
      queue->open = false;
    }
    queue->cq->Shutdown();
  }
  for (const std::unique_ptr<Queue>& queue : queues_) {
    if (queue->thread.joinable()) {
      queue->thread.join();
    } else {
      Drain(queue.get());  // never started: nothing outstanding, Next ends at once
    }
  }
}

}  // namespace cohort::coordinator
