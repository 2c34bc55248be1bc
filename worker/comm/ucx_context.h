#pragma once
// UcxContext: one UCP context and worker per process (per generation), with
// an endpoint to every other rank of the world. Communicators for the whole
// world and for its sub-groups (mesh axes) share one context and tell their
// messages apart by a 16-bit communicator id in the tag (ucx_tags.h).
//
// Bootstrap (Create): publish this worker's address under
// "<key_prefix><rank>" through the KvClient, fetch every peer's, create
// endpoints with peer error handling, and optionally exchange a small
// warm-up message with every peer so wire-up cost and unreachable peers show
// up here rather than in the first collective.
//
// Peer failure: UCX calls the endpoint's error handler (from inside
// ucp_worker_progress) when a peer dies or becomes unreachable; the context
// marks that peer dead and communicators waiting on it return Unavailable.
//
// Teardown (destructor): closes every endpoint (flush mode for live peers,
// force mode for dead ones) waiting at most `close_timeout`, then releases
// the address and destroys the worker and context. Never hangs on gone peers.
//
// Thread-safety: the worker runs in UCS_THREAD_MODE_MULTI, so communicators
// over one context may be used from different threads at once. All methods
// are thread-safe. The context must outlive its communicators.

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/kv_client.h"
#include "worker/comm/local_peer.h"

namespace cohort::comm {

struct UcxContextOptions {
  int rank = 0;
  int size = 1;
  // Bootstrap channel; used only during Create (not retained).
  KvClient* kv = nullptr;
  // Worker addresses live under "<key_prefix><rank>", host identities (used
  // to choose transports when UCX_TLS is unset) under "<key_prefix>host/<rank>".
  std::string key_prefix = "ucx/";
  // Bounds the whole bootstrap (address exchange and warm-up).
  absl::Duration bootstrap_timeout = absl::Seconds(60);
  // Exchange one small message with every peer during Create.
  bool warm_up = true;
  // When set, Create gives up (Cancelled) soon after it becomes true while
  // it waits for peers in the warm-up. (The address exchange is cancelled
  // through the KvClient.)
  const std::atomic<bool>* cancelled = nullptr;
  // UCX_NET_DEVICES for a group spanning hosts, unless the environment sets
  // it: the interfaces UCX may use between hosts (e.g. "eth0"); empty: every
  // interface UCX finds.
  std::string net_devices;
  // Bound on closing endpoints at destruction.
  absl::Duration close_timeout = absl::Seconds(2);
  // With UCX_TLS unset, peers on this host (same kernel and pid namespace)
  // get endpoints without UCX peer-failure handling, which UCX's
  // shared-memory transports lack: otherwise UCX would route them over TCP.
  // Their liveness is then watched through /proc (CheckLocalPeers). An
  // explicit UCX_TLS keeps failure handling wherever a transport offers it.
  bool shared_memory_for_local_peers = true;
  // With UCX_TLS unset, large collectives of a group whose ranks all run on
  // this host bypass UCX and go through Cohort's own shared-memory segments
  // (shm_collectives.h): one copy per byte instead of UCX's two.
  bool shared_memory_collectives = true;
  // With UCX_TLS unset, large point-to-point messages between ranks on this
  // host are read by the receiver straight from the sender's memory
  // (ucx_direct_read.h: one copy, process_vm_readv) rather than through
  // UCX's shared-memory FIFOs (two copies).
  bool direct_read_for_local_peers = true;
};

class UcxContext {
 public:
  // World sizes are limited by the 14-bit source field of the tag.
  static constexpr int kMaxRanks = 1 << 14;

  // Errors: InvalidArgument (rank/size out of range, no kv), Internal (UCX
  // setup failed), the KvClient's errors for the address exchange
  // (DeadlineExceeded when a peer never publishes), Unavailable (a peer is
  // unreachable during warm-up), DeadlineExceeded (warm-up timed out).
  static absl::StatusOr<std::unique_ptr<UcxContext>> Create(const UcxContextOptions& options);

  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  ucp_worker_h worker() const { return worker_; }
  // The endpoint to world rank `peer`; null for this rank itself.
  ucp_ep_h endpoint(int peer) const { return peers_[peer]->ep; }

  // Whether UCX reported `peer` dead or unreachable.
  bool peer_dead(int peer) const {
    return peers_[peer]->dead.load(std::memory_order_acquire);
  }
  // Incremented each time a peer is marked dead: a cheap "anything new?"
  // check for progress loops.
  uint64_t dead_epoch() const { return dead_epoch_.load(std::memory_order_acquire); }
  // Records that a call failed with operations possibly still queued on
  // endpoints: teardown then force-closes every endpoint instead of flushing
  // (a flush could wait for peers that abandoned the same call, and UCX
  // asserts if a worker is destroyed with requests still on an endpoint).
  void NoteFailedCall() { failed_call_.store(true, std::memory_order_release); }
  // Marks dead every same-host peer whose process is gone. Progress loops
  // call it while waiting; it does real work at most every 5 ms.
  void CheckLocalPeers();

  // The host identity world rank `peer` published (empty where hosts were
  // not exchanged: an explicit UCX_TLS).
  const std::string& peer_host(int peer) const { return peers_[peer]->process.host; }
  // The process of world rank `peer` when large point-to-point messages with
  // it go as direct reads (enabled by the options, the peer on this host and
  // not this rank); null otherwise. Both ends of a pair decide alike.
  const ProcessIdentity* DirectReadPeer(int peer) const {
    return direct_reads_ && peer != rank_ && !peers_[rank_]->process.host.empty() &&
                   peers_[peer]->process.host == peers_[rank_]->process.host
               ? &peers_[peer]->process
               : nullptr;
  }
  // Whether `group` (world ranks) should use the shared-memory collectives:
  // enabled by the options and every member on this host.
  bool SharedMemoryGroup(const std::vector<int>& group) const;
  // The shared-memory segment name of world rank `world_rank`'s communicator
  // `comm_id` in this context (unique per process, generation, id and rank).
  std::string SegmentName(int world_rank, uint16_t comm_id) const;

  // Claims a communicator id; AlreadyExists if a live communicator holds it.
  absl::Status ClaimCommId(uint16_t id);
  void ReleaseCommId(uint16_t id);

 private:
  struct Peer {
    UcxContext* context = nullptr;
    int rank = 0;
    ucp_ep_h ep = nullptr;
    std::atomic<bool> dead{false};
    // Set for same-host peers reached without UCX failure handling.
    bool watched_locally = false;
    ProcessIdentity process;
  };
  void MarkDead(Peer& peer, const std::string& why);
  // Publishes this rank's host and reads every peer's (before UCP exists).
  absl::StatusOr<bool> AllRanksOnThisHost(const UcxContextOptions& options,
                                          const ProcessIdentity& self, absl::Time deadline);

  UcxContext(int rank, int size);
  absl::Status Init(const UcxContextOptions& options);
  absl::Status WarmUp(absl::Time deadline, const std::atomic<bool>* cancelled);
  // Waits for a warm-up request with peer `peer` (then frees it): OK,
  // Unavailable (the peer failed), Cancelled, or DeadlineExceeded.
  absl::Status AwaitWarmUp(void* request, int peer, absl::Time deadline,
                           const std::atomic<bool>* cancelled);
  void CloseEndpoints(absl::Duration timeout);
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

  const int rank_;
  const int size_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_address_t* address_ = nullptr;
  size_t address_length_ = 0;
  absl::Duration close_timeout_ = absl::Seconds(2);
  // Stable addresses: the error handler gets a Peer* as its argument.
  std::vector<std::unique_ptr<Peer>> peers_;
  std::atomic<uint64_t> dead_epoch_{0};
  bool has_local_peers_ = false;
  bool shared_memory_collectives_ = false;
  bool direct_reads_ = false;
  // Distinguishes this context's segments from another generation's.
  std::string instance_tag_;
  std::atomic<bool> failed_call_{false};
  std::atomic<int64_t> next_local_check_nanos_{0};

  absl::Mutex mu_;
  absl::flat_hash_set<uint16_t> comm_ids_ ABSL_GUARDED_BY(mu_);
};

// Converts a UCX status to the project's codes: peer and transport failures
// become Unavailable, timeouts DeadlineExceeded, truncation InvalidArgument,
// anything else Internal. `what` prefixes the message.
absl::Status UcxStatusToStatus(ucs_status_t status, const std::string& what);

}  // namespace cohort::comm
