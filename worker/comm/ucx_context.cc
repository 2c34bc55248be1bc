#include "worker/comm/ucx_context.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "worker/comm/failed_peer.h"
#include "worker/comm/shm_segment.h"
#include "worker/comm/ucx_tags.h"

namespace cohort::comm {
namespace {

// Short hex digest of the bootstrap key prefix, which names the job and
// generation: FNV-1a, stable across processes and builds.
std::string InstanceTag(const std::string& key_prefix) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : key_prefix) h = (h ^ c) * 0x100000001b3ull;
  return absl::StrCat(absl::Hex(h >> 32));
}

// Reserved for context-level control traffic (warm-up).
constexpr uint16_t kControlCommId = 0xffff;

struct ConfigDeleter {
  void operator()(ucp_config_t* config) const { ucp_config_release(config); }
};

}  // namespace

absl::Status UcxStatusToStatus(ucs_status_t status, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_OK: return absl::OkStatus();
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_CANCELED:
    case UCS_ERR_NOT_CONNECTED:
    // The shared-memory transports (posix, sysv: every group on one host)
    // fail a send this way when the peer's segment went with its process,
    // before the peer's death is noticed (chaos seed 4 failed a whole job on
    // it as an internal error).
    case UCS_ERR_SHMEM_SEGMENT:
      return absl::UnavailableError(message);
    case UCS_ERR_TIMED_OUT: return absl::DeadlineExceededError(message);
    case UCS_ERR_MESSAGE_TRUNCATED: return absl::InvalidArgumentError(message);
    default: return absl::InternalError(message);
  }
}

UcxContext::UcxContext(int rank, int size) : rank_(rank), size_(size) {}

absl::StatusOr<std::unique_ptr<UcxContext>> UcxContext::Create(const UcxContextOptions& options) {
  if (options.size < 1 || options.size > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ucx context: size ", options.size, " not in [1, ", kMaxRanks, "]"));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ucx context: rank ", options.rank, " not in [0, ", options.size, ")"));
  }
  if (options.kv == nullptr && options.size > 1) {
    return absl::InvalidArgumentError("ucx context: a KvClient is required for size > 1");
  }
  std::unique_ptr<UcxContext> context(new UcxContext(options.rank, options.size));
  absl::Status status = context->Init(options);
  if (!status.ok()) return status;  // the destructor undoes partial setup
  return context;
}

bool UcxContext::SharedMemoryGroup(const std::vector<int>& group) const {
  if (!shared_memory_collectives_) return false;
  const std::string& host = peers_[rank_]->process.host;
  for (int r : group) {
    if (peers_[r]->process.host != host || host.empty()) return false;
  }
  return true;
}

std::string UcxContext::SegmentName(int world_rank, uint16_t comm_id) const {
  return ShmSegment::Name(peers_[world_rank]->process, absl::StrCat(instance_tag_, "-", comm_id, "-", world_rank));
}

absl::Status UcxContext::Init(const UcxContextOptions& options) {
  close_timeout_ = options.close_timeout;
  const absl::Time deadline = absl::Now() + options.bootstrap_timeout;
  ucp_config_t* raw_config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw_config);
  if (st != UCS_OK) return UcxStatusToStatus(st, "ucp_config_read");
  std::unique_ptr<ucp_config_t, ConfigDeleter> config(raw_config);
  const bool default_transports = std::getenv("UCX_TLS") == nullptr;
  const ProcessIdentity self = SelfIdentity();
  if (default_transports) {
    absl::StatusOr<bool> single_host = AllRanksOnThisHost(options, self, deadline);
    if (!single_host.ok()) return single_host.status();
    // Never cma: it reads a peer's memory with process_vm_readv, and when
    // that peer has been killed UCX 1.13 treats the failure as fatal and
    // aborts this process. A group on one host uses the shared-memory FIFOs
    // only: with tcp also enabled, UCX sends large messages over tcp
    // rendezvous lanes and every progress call polls tcp too.
    const char* transports = *single_host ? "posix,sysv,self" : "^cma";
    st = ucp_config_modify(config.get(), "TLS", transports);
    if (st != UCS_OK) {
      LOG(WARNING) << "ucx: cannot set transports " << transports << ": "
                   << ucs_status_string(st);
    }
    // Across hosts a peer behind a cut link is found by UCX's endpoint
    // keepalive, every 20 s by default: a collective would wait that long
    // (or its whole timeout) to fail. One round a second costs a few
    // bytes per endpoint and turns a cut into Unavailable within seconds.
    if (!*single_host && !options.net_devices.empty() &&
        std::getenv("UCX_NET_DEVICES") == nullptr) {
      st = ucp_config_modify(config.get(), "NET_DEVICES", options.net_devices.c_str());
      if (st != UCS_OK) {
        LOG(WARNING) << "ucx: cannot use network devices " << options.net_devices << ": "
                     << ucs_status_string(st);
      }
    }
    if (!*single_host && std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
      st = ucp_config_modify(config.get(), "KEEPALIVE_INTERVAL", "1s");
      if (st != UCS_OK) {
        LOG(WARNING) << "ucx: cannot set the keepalive interval: " << ucs_status_string(st);
      }
    }
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG;
  params.estimated_num_eps = static_cast<size_t>(size_);
  params.mt_workers_shared = 0;
  st = ucp_init(&params, config.get(), &context_);
  if (st != UCS_OK) {
    context_ = nullptr;
    return UcxStatusToStatus(st, "ucp_init");
  }

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_MULTI;
  st = ucp_worker_create(context_, &worker_params, &worker_);
  if (st != UCS_OK) {
    worker_ = nullptr;
    return UcxStatusToStatus(st, "ucp_worker_create");
  }
  st = ucp_worker_get_address(worker_, &address_, &address_length_);
  if (st != UCS_OK) {
    address_ = nullptr;
    return UcxStatusToStatus(st, "ucp_worker_get_address");
  }

  peers_.reserve(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    auto peer = std::make_unique<Peer>();
    peer->context = this;
    peer->rank = r;
    peers_.push_back(std::move(peer));
  }
  peers_[rank_]->process = self;
  shared_memory_collectives_ = options.shared_memory_collectives && default_transports;
  direct_reads_ = options.direct_read_for_local_peers && default_transports;
  instance_tag_ = InstanceTag(options.key_prefix);
  if (size_ == 1) return absl::OkStatus();

  const std::string blob = EncodePeerAddress(
      self, std::string_view(reinterpret_cast<const char*>(address_), address_length_));
  absl::Status status = options.kv->Set(absl::StrCat(options.key_prefix, rank_), blob);
  if (!status.ok()) return status;

  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    absl::StatusOr<std::string> remote =
        options.kv->WaitFor(absl::StrCat(options.key_prefix, r),
                            std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!remote.ok()) {
      return absl::Status(remote.status().code(),
                          absl::StrCat("ucx address of rank ", r, ": ", remote.status().message()));
    }
    absl::StatusOr<std::pair<ProcessIdentity, std::string>> decoded = DecodePeerAddress(*remote);
    if (!decoded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ucx address of rank ", r, ": ", decoded.status().message()));
    }
    const std::string& address = decoded->second;
    Peer& peer = *peers_[r];
    peer.process = decoded->first;
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = &UcxContext::OnPeerError;
    ep_params.err_handler.arg = &peer;
    // Only under our own transport choice (UCX_TLS unset: everything but
    // cma), which includes shared memory; a user's explicit UCX_TLS keeps
    // UCX's failure handling wherever it is available.
    if (options.shared_memory_for_local_peers && default_transports &&
        peer.process.host == self.host) {
      // Without failure handling UCX may choose shared memory; liveness
      // comes from CheckLocalPeers instead.
      ep_params.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
      ep_params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      peer.watched_locally = true;
      has_local_peers_ = true;
    }
    st = ucp_ep_create(worker_, &ep_params, &peers_[r]->ep);
    if (st == UCS_ERR_UNREACHABLE && ep_params.err_mode == UCP_ERR_HANDLING_MODE_PEER) {
      // UCX 1.13's shared-memory transports have no peer failure handler,
      // so they refuse PEER mode (e.g. with UCX_TLS=sm). Fall back to no
      // error handling: a dead peer on this host is then noticed through
      // /proc, a remote one only at the call's timeout.
      LOG(WARNING) << "ucx: no transport to rank " << r << " supports peer failure detection";
      ep_params.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
      ep_params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      st = ucp_ep_create(worker_, &ep_params, &peers_[r]->ep);
      if (peer.process.host == self.host) {
        peer.watched_locally = true;
        has_local_peers_ = true;
      }
    }
    if (st != UCS_OK) {
      peers_[r]->ep = nullptr;
      // A peer on this host that exited, or abandoned this generation (a
      // newer plan cancelled its build), after publishing its address takes
      // its shared-memory segments with it: connecting then fails with a
      // shared-memory error. That is the peer going away (Unavailable: the
      // job re-plans), not a fault of this process.
      if (peer.process.host == self.host &&
          (st == UCS_ERR_SHMEM_SEGMENT || ProcessGone(peer.process))) {
        return absl::UnavailableError(absl::StrCat(
            "ucp_ep_create to rank ", r, " (process ", peer.process.pid, " on this host): ",
            ucs_status_string(st), "; the peer exited or left this generation"));
      }
      return WithFailedPeer(UcxStatusToStatus(st, absl::StrCat("ucp_ep_create to rank ", r)), r);
    }
  }
  if (options.warm_up) return WarmUp(deadline, options.cancelled);
  return absl::OkStatus();
}

absl::Status UcxContext::AwaitWarmUp(void* request, int peer, absl::Time deadline,
                                     const std::atomic<bool>* cancelled) {
  if (request == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(request)) {
    return WithFailedPeer(
        UcxStatusToStatus(UCS_PTR_STATUS(request), absl::StrCat("ucx warm-up with rank ", peer)),
        peer);
  }
  absl::Status result;
  ucs_status_t status = UCS_INPROGRESS;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    if (ucp_worker_progress(worker_) != 0) continue;
    // A peer that died after publishing its address never answers: a local
    // one is seen gone through /proc, a remote one by UCX's error handler.
    CheckLocalPeers();
    if (peers_[peer]->dead.load(std::memory_order_acquire)) {
      result = absl::UnavailableError(absl::StrCat("ucx warm-up with rank ", peer, ": it failed"));
      break;
    }
    if (cancelled != nullptr && cancelled->load(std::memory_order_acquire)) {
      result = absl::CancelledError(absl::StrCat("ucx warm-up with rank ", peer, ": cancelled"));
      break;
    }
    if (absl::Now() > deadline) {
      result = absl::DeadlineExceededError(absl::StrCat("ucx warm-up with rank ", peer));
      break;
    }
  }
  if (status == UCS_INPROGRESS) {
    ucp_request_cancel(worker_, request);
  } else if (status != UCS_OK) {
    result = UcxStatusToStatus(status, absl::StrCat("ucx warm-up with rank ", peer));
  }
  ucp_request_free(request);
  return WithFailedPeer(result, peer);
}

absl::Status UcxContext::WarmUp(absl::Time deadline, const std::atomic<bool>* cancelled) {
  // Every rank sends one byte to and receives one byte from every peer. The
  // buffers are per peer so receives can all be posted first.
  std::vector<uint8_t> in(static_cast<size_t>(size_), 0);
  const uint8_t out = 1;
  std::vector<void*> recvs(static_cast<size_t>(size_), nullptr);
  std::vector<void*> sends(static_cast<size_t>(size_), nullptr);
  ucp_request_param_t param{};
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    recvs[r] = ucp_tag_recv_nbx(worker_, &in[r], 1,
                                MakeTag(kControlCommId, TagKind::kControl, r, 0), kFullTagMask,
                                &param);
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    sends[r] = ucp_tag_send_nbx(peers_[r]->ep, &out, 1,
                                MakeTag(kControlCommId, TagKind::kControl, rank_, 0), &param);
  }
  absl::Status result;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    for (void* request : {recvs[r], sends[r]}) {
      // After a failure the rest are only cancelled and freed.
      const absl::Status waited =
          AwaitWarmUp(request, r, result.ok() ? deadline : absl::InfinitePast(), cancelled);
      if (result.ok()) result = waited;
    }
  }
  return result;
}

absl::StatusOr<bool> UcxContext::AllRanksOnThisHost(const UcxContextOptions& options,
                                                    const ProcessIdentity& self,
                                                    absl::Time deadline) {
  if (size_ == 1) return true;
  // A first, tiny exchange: transports must be chosen before the UCP
  // context exists, and so before there is an address to publish.
  const std::string prefix = absl::StrCat(options.key_prefix, "host/");
  absl::Status status = options.kv->Set(absl::StrCat(prefix, rank_), self.host);
  if (!status.ok()) return status;
  bool all_local = true;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    absl::StatusOr<std::string> host = options.kv->WaitFor(
        absl::StrCat(prefix, r), std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!host.ok()) {
      return absl::Status(host.status().code(),
                          absl::StrCat("ucx host of rank ", r, ": ", host.status().message()));
    }
    all_local = all_local && *host == self.host;
  }
  return all_local;
}

void UcxContext::MarkDead(Peer& peer, const std::string& why) {
  if (!peer.dead.exchange(true, std::memory_order_acq_rel)) {
    dead_epoch_.fetch_add(1, std::memory_order_acq_rel);
    LOG(WARNING) << "ucx: peer rank " << peer.rank << " failed: " << why;
  }
}

void UcxContext::OnPeerError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->context->MarkDead(*peer, ucs_status_string(status));
}

void UcxContext::CheckLocalPeers() {
  if (!has_local_peers_) return;
  const int64_t now = absl::GetCurrentTimeNanos();
  int64_t next = next_local_check_nanos_.load(std::memory_order_relaxed);
  // One caller at a time does the check, at most every 5 ms.
  if (now < next || !next_local_check_nanos_.compare_exchange_strong(
                        next, now + absl::ToInt64Nanoseconds(absl::Milliseconds(5)))) {
    return;
  }
  for (const std::unique_ptr<Peer>& peer : peers_) {
    if (peer->watched_locally && !peer->dead.load(std::memory_order_acquire) &&
        ProcessGone(peer->process)) {
      MarkDead(*peer, absl::StrCat("process ", peer->process.pid, " on this host is gone"));
    }
  }
}

absl::Status UcxContext::ClaimCommId(uint16_t id) {
  if (id == kControlCommId) {
    return absl::InvalidArgumentError("ucx communicator id 0xffff is reserved");
  }
  absl::MutexLock lock(&mu_);
  if (!comm_ids_.insert(id).second) {
    return absl::AlreadyExistsError(absl::StrCat("ucx communicator id ", id, " is in use"));
  }
  return absl::OkStatus();
}

void UcxContext::ReleaseCommId(uint16_t id) {
  absl::MutexLock lock(&mu_);
  comm_ids_.erase(id);
}

void UcxContext::CloseEndpoints(absl::Duration timeout) {
  std::vector<void*> pending;
  // After a failure, force-close everything: force purges queued requests.
  const bool force_all = failed_call_.load(std::memory_order_acquire) ||
                         dead_epoch_.load(std::memory_order_acquire) > 0;
  for (auto& peer : peers_) {
    if (peer->ep == nullptr) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // A flush close delivers what is still queued to live peers; a dead
    // peer's endpoint can only be force-closed.
    param.flags = force_all || peer->dead.load() ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* request = ucp_ep_close_nbx(peer->ep, &param);
    peer->ep = nullptr;
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) pending.push_back(request);
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (void* request : pending) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS && absl::Now() < deadline) {
      ucp_worker_progress(worker_);
    }
    // Releasing an unfinished close lets UCX finish or drop it with the worker.
    ucp_request_free(request);
  }
}

UcxContext::~UcxContext() {
  if (worker_ != nullptr) CloseEndpoints(close_timeout_);
  if (address_ != nullptr) ucp_worker_release_address(worker_, address_);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

}  // namespace cohort::comm
