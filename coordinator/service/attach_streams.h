#pragma once
// AttachStreams: the Workers.Attach streams, served with gRPC's asynchronous
// API on completion queues of the coordinator's own, each drained by one
// thread. Every other method uses the callback API.
//
// Why: Debian builds gRPC without NDEBUG, and such a build keeps, per
// completion queue, a list of the operations outstanding on it that every
// completion searches linearly. All callback calls of a process share one
// queue, and every attached worker keeps a read outstanding: at 10,000
// workers each heartbeat's completions scanned about 10,000 entries, 43% of
// the coordinator's CPU at 2 Hz (docs/operations.md). Spread over `queues`
// queues, a scan covers 1/queues of the streams.
//
// Each stream's protocol is the same as before: the first message must be a
// Hello the caller's certificate may send (Coordinator::Attach), the rest go
// to Coordinator::OnWorkerMessage, and messages to the worker queue in an
// outbox with one write outstanding.
//
// Lifecycle: AddQueues before the server is built, Start after it started,
// Shutdown after the server's Shutdown returned (it drains the queues and
// joins their threads). Thread-safe otherwise.

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "coordinator/coordinator.h"
#include "coordinator/service/call_gate.h"

namespace cohort::coordinator {

class AttachStreams {
 public:
  using Stream = grpc::ServerAsyncReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>;
  // The generated RequestAttach of the service Attach is registered on.
  using RequestFn =
      std::function<void(grpc::ServerContext*, Stream*, grpc::ServerCompletionQueue*, void* tag)>;

  // `coordinator` and `gate` outlive this object.
  AttachStreams(Coordinator* coordinator, const CallGate* gate, RequestFn request);
  ~AttachStreams();

  AttachStreams(const AttachStreams&) = delete;
  AttachStreams& operator=(const AttachStreams&) = delete;

  // `queues` >= 1 completion queues on `builder`, before BuildAndStart.
  void AddQueues(grpc::ServerBuilder* builder, int queues);
  // Starts one thread per queue and waits for streams.
  void Start();
  // After grpc::Server::Shutdown: no operation starts any more, the queues
  // drain (every stream object is freed) and their threads end. Idempotent.
  void Shutdown();

  // One completion queue, its thread, and the gate that keeps operations
  // from starting once it shuts down (gRPC aborts the process on that).
  struct Queue {
    std::unique_ptr<grpc::ServerCompletionQueue> cq;
    std::thread thread;
    absl::Mutex mu;  // held shared while an operation starts on `cq`
    bool open ABSL_GUARDED_BY(mu) = true;
  };

  // Waits for one more stream on `queue` (a new call object). False when the
  // queue no longer takes operations.
  bool RequestOne(Queue* queue);

  Coordinator* coordinator() const { return coordinator_; }
  const CallGate* gate() const { return gate_; }

 private:
  void Drain(Queue* queue);

  Coordinator* const coordinator_;
  const CallGate* const gate_;
  const RequestFn request_;
  std::vector<std::unique_ptr<Queue>> queues_;
  bool started_ = false;
  bool shut_down_ = false;
};

}  // namespace cohort::coordinator
