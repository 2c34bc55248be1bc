#include "coordinator/service/coordinator_server.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "coordinator/service/jobs_service.h"
#include "coordinator/service/kv_service.h"
#include "coordinator/service/parse_error_interceptor.h"
#include "coordinator/service/workers_service.h"
#include "coordinator/store/rocksdb_job_store.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "rocksdb/db.h"  // RocksDbJobStore holds a unique_ptr<rocksdb::DB>

namespace cohort::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerConfig config) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->tick_interval_ = config.tick_interval;
  // Credentials first: a bad file must fail before any state is opened.
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(config.tls));
  const bool tls = !config.tls.cert.empty();
  if (!tls && !config.auth_tokens_file.empty()) {
    return absl::InvalidArgumentError(
        "--auth_tokens_file: needs --tls_cert and --tls_key (bearer tokens would cross the "
        "network in plaintext)");
  }
  if (!tls && !config.allow_insecure && !IsLoopbackAddress(config.listen_address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", config.listen_address,
        ": plaintext gRPC on a non-loopback address lets anyone who can reach it steer the "
        "cluster; give --tls_cert and --tls_key (and --tls_client_ca, --auth_tokens_file), or "
        "--allow_insecure to accept that"));
  }
  Authorizer::Options auth;
  auth.require_worker_certificate = !config.tls.client_ca.empty();
  auth.tokens_file = config.auth_tokens_file;
  ASSIGN_OR_RETURN(server->authorizer_, Authorizer::Create(auth));
  server->streams_ = std::make_unique<StreamLimiter>(config.max_streams_per_client);
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbJobStore> store,
                   RocksDbJobStore::Open(config.data_dir));
  auto registry = std::make_shared<prometheus::Registry>();
  server->metrics_ = std::make_unique<CoordinatorMetrics>(registry);
  server->gate_ = std::make_unique<CallGate>(server->authorizer_.get(), server->streams_.get(),
                                             server->metrics_.get());
  ASSIGN_OR_RETURN(server->checkpoint_store_,
                   RocksDbCheckpointStore::Open(config.data_dir + "/checkpoints"));
  RocksDbCheckpointStore* checkpoint_store = server->checkpoint_store_.get();
  config.coordinator.checkpoint_exists =
      [checkpoint_store](const JobId& job, std::optional<Step> step) -> absl::Status {
    return checkpoint_store->Open(job, step).status();
  };
  // Called under the coordinator's lock: from the store's in-memory index.
  config.coordinator.latest_checkpoint =
      [checkpoint_store](const JobId& job) -> std::optional<Step> {
    return checkpoint_store->NewestStep(job);
  };
  if (config.coordinator.stall_threshold <= absl::ZeroDuration()) {
    // The ticker runs every tick_interval: a much longer gap is the
    // coordinator's own stall, which must not count against the workers.
    config.coordinator.stall_threshold = std::max(absl::Seconds(1), 20 * config.tick_interval);
  }
  ASSIGN_OR_RETURN(server->coordinator_,
                   Coordinator::Create(config.coordinator, std::move(store), RealClock::Get(),
                                       server->metrics_.get()));
  Coordinator* coordinator = server->coordinator_.get();
  CheckpointUploadsOptions uploads;
  uploads.max_chunk_bytes = config.checkpoints.max_chunk_bytes;
  uploads.abandon_after = config.checkpoint_abandon_after;
  // The executor exists before the first upload can commit; retention runs
  // there after the reply.
  CoordinatorServer* self = server.get();
  uploads.defer = [self](std::function<void()> work) {
    self->checkpoint_executor_->Schedule(std::move(work));
  };
  // Failures and commits go to the job's record, where `cohortctl get`
  // shows them (the writers train on and only log theirs), and to the
  // failure metric. Called without the uploads' lock; the coordinator takes
  // its own.
  uploads.on_failure = [coordinator](const FailedCheckpoint& failed) {
    v1::CheckpointFailure failure;
    failure.set_step(failed.attempt.step.value());
    failure.set_generation(failed.attempt.generation.value());
    *failure.mutable_time() = ToProtoTime(failed.time);
    failure.set_kind(failed.kind);
    failure.set_reason(failed.reason);
    coordinator->OnCheckpointFailed(failed.attempt.job, std::move(failure));
  };
  uploads.on_commit = [coordinator](const CommittedCheckpoint& committed) {
    v1::CheckpointCommit commit;
    commit.set_step(committed.attempt.step.value());
    commit.set_generation(committed.attempt.generation.value());
    *commit.mutable_time() = ToProtoTime(committed.time);
    coordinator->OnCheckpointCommitted(committed.attempt.job, commit);
  };
  server->checkpoint_uploads_ = std::make_unique<CheckpointUploads>(
      server->checkpoint_store_.get(),
      [coordinator](const JobId& id) -> absl::StatusOr<CheckpointJobState> {
        ASSIGN_OR_RETURN(v1::Job job, coordinator->GetJob(id));
        CheckpointJobState state;
        state.generation = Generation(job.generation());
        state.policy = job.spec().checkpoint();
        state.accepts_checkpoints =
            job.state() != v1::JOB_STATE_CANCELLED && job.state() != v1::JOB_STATE_FAILED;
        state.finished = job.state() == v1::JOB_STATE_COMPLETED || !state.accepts_checkpoints;
        state.data_parallel = job.mesh().data_parallel();
        state.tensor_parallel = job.mesh().tensor_parallel();
        state.pipeline_parallel = job.mesh().pipeline_parallel();
        return state;
      },
      RealClock::Get(), uploads);
  ASSIGN_OR_RETURN(int abandoned, server->checkpoint_uploads_->CollectAbandoned());
  if (abandoned > 0) {
    LOG(INFO) << "dropped " << abandoned << " checkpoint uploads a previous run left uncommitted";
  }
  server->checkpoint_executor_ = std::make_unique<BlockingExecutor>(config.checkpoint_io_threads);
  server->checkpoints_service_ = std::make_unique<CheckpointsService>(
      server->checkpoint_uploads_.get(), server->checkpoint_store_.get(),
      server->checkpoint_executor_.get(), server->metrics_.get(), server->gate_.get(),
      config.checkpoints,
      [coordinator](const WorkerIdentity& caller, const JobId& job, Generation generation) {
        return coordinator->CheckParticipant(caller, job, generation);
      });
  server->workers_service_ = std::make_unique<WorkersService>(
      server->coordinator_.get(), server->metrics_.get(), server->gate_.get());
  server->jobs_service_ = std::make_unique<JobsService>(server->coordinator_.get(),
                                                        server->metrics_.get(), server->gate_.get());
  server->kv_service_ = std::make_unique<KeyValueService>(
      server->coordinator_.get(), server->metrics_.get(), server->gate_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen_address, credentials, &port);
  builder.SetMaxReceiveMessageSize(config.max_message_bytes);
  grpc::ResourceQuota quota("cohort-coordinator");
  quota.Resize(static_cast<size_t>(config.grpc_memory_bytes));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config.max_streams_per_connection);
  builder.RegisterService(server->workers_service_.get());
  server->workers_service_->AddQueues(&builder, config.attach_queues);
  builder.RegisterService(server->jobs_service_.get());
  builder.RegisterService(server->kv_service_.get());
  builder.RegisterService(server->checkpoints_service_.get());
  builder.experimental().SetInterceptorCreators(CoordinatorInterceptors());
  // Workers must notice a dead coordinator, and the coordinator a dead
  // worker's connection, even when no message is due.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Checkpoint uploads stream megabytes per chunk: let writers run ahead of
  // the store by a few chunks instead of waiting for 64 KiB window updates.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 32 << 20);
  // gRPC binds with SO_REUSEPORT by default: a second coordinator on the same
  // port would start and take half the clients, with other data.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen for gRPC on ", config.listen_address,
        " (is the port in use, e.g. by another coordinator, or the address not this host's?)"));
  }
  server->workers_service_->Start();
  // The metrics endpoint binds after gRPC: with `--metrics_address HOST:0`
  // its free port could otherwise be the very port --listen names.
  ASSIGN_OR_RETURN(server->metrics_server_, MetricsServer::Create(config.metrics_address, registry));
  server->address_ =
      absl::StrCat(config.listen_address.substr(0, config.listen_address.rfind(':')), ":", port);
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  server->ticker_ = std::thread([s = server.get()] { s->TickLoop(); });
  LOG(INFO) << "coordinator " << server->coordinator_->options().coordinator_id
            << " serving gRPC on " << server->address_
            << (tls ? " with TLS" : " in plaintext (no TLS)") << "; worker RPCs "
            << (server->authorizer_->worker_certificate_required()
                    ? "need a client certificate from --tls_client_ca"
                    : "need no certificate")
            << "; user RPCs "
            << (server->authorizer_->tokens_required()
                    ? absl::StrCat("need one of ", server->authorizer_->token_count(),
                                   " bearer tokens")
                    : std::string("need no token"))
            << "; metrics on http://"
            << server->metrics_server_->address() << "/metrics, data in " << config.data_dir;
  return server;
}

void CoordinatorServer::TickLoop() {
  int ticks = 0;
  while (!stop_.WaitForNotificationWithTimeout(tick_interval_)) {
    coordinator_->Tick();
    // Once a second is plenty for checkpoint housekeeping.
    if (++ticks % std::max<int64_t>(1, absl::Seconds(1) / tick_interval_) == 0) TickCheckpoints();
  }
}

void CoordinatorServer::TickCheckpoints() {
  checkpoint_uploads_->Tick();
  const UploadCounters now = checkpoint_uploads_->counters();
  metrics_->CheckpointsAbandoned(now.abandoned - reported_counters_.abandoned);
  metrics_->CheckpointsRetired(now.retired - reported_counters_.retired);
  reported_counters_ = now;
  metrics_->SetCheckpointPending(checkpoint_uploads_->pending_attempts());
  if (absl::StatusOr<uint64_t> bytes = checkpoint_store_->LiveBytes(); bytes.ok()) {
    metrics_->SetCheckpointStoredBytes(*bytes);
  }
}

void CoordinatorServer::Wait() { shut_down_done_.WaitForNotification(); }

void CoordinatorServer::Shutdown() {
  if (shut_down_.exchange(true)) {
    // E.g. the destructor while a signal thread's Shutdown still runs.
    shut_down_done_.WaitForNotification();
    return;
  }
  ShutdownOnce();
  shut_down_done_.Notify();
}

void CoordinatorServer::ShutdownOnce() {
  // Start() may have failed part way: only stop what exists.
  if (server_ == nullptr) return;
  LOG(INFO) << "coordinator shutting down";
  stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  coordinator_->Quiesce();
  // Streams get a short grace to finish; then they are cancelled.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // Only now may the Attach streams' completion queues shut down (gRPC's
  // order for asynchronous services).
  workers_service_->ShutdownStreams();
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown();
  if (server_ != nullptr) server_->Wait();
}

}  // namespace cohort::coordinator
