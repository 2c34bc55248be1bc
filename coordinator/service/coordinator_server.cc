#include "coordinator/service/coordinator_server.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/rocksdb_job_store.h"
#include "rocksdb/db.h"  // RocksDbJobStore holds a unique_ptr<rocksdb::DB>
#include "coordinator/service/jobs_service.h"
#include "coordinator/service/kv_service.h"
#include "coordinator/service/workers_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace cohort::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerConfig config) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->tick_interval_ = config.tick_interval;
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbJobStore> store,
                   RocksDbJobStore::Open(config.data_dir));
  auto registry = std::make_shared<prometheus::Registry>();
  server->metrics_ = std::make_unique<CoordinatorMetrics>(registry);
  ASSIGN_OR_RETURN(server->metrics_server_, MetricsServer::Create(config.metrics_address, registry));
  ASSIGN_OR_RETURN(server->coordinator_,
                   Coordinator::Create(config.coordinator, std::move(store), RealClock::Get(),
                                       server->metrics_.get()));
  server->workers_service_ =
      std::make_unique<WorkersService>(server->coordinator_.get(), server->metrics_.get());
  server->jobs_service_ =
      std::make_unique<JobsService>(server->coordinator_.get(), server->metrics_.get());
  server->kv_service_ =
      std::make_unique<KeyValueService>(server->coordinator_.get(), server->metrics_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen_address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(server->workers_service_.get());
  builder.RegisterService(server->jobs_service_.get());
  builder.RegisterService(server->kv_service_.get());
  // Workers must notice a dead coordinator, and the coordinator a dead
  // worker's connection, even when no message is due.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for gRPC on ", config.listen_address));
  }
  server->address_ =
      absl::StrCat(config.listen_address.substr(0, config.listen_address.rfind(':')), ":", port);
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  server->ticker_ = std::thread([s = server.get()] { s->TickLoop(); });
  LOG(INFO) << "coordinator " << server->coordinator_->options().coordinator_id
            << " serving gRPC on " << server->address_ << ", metrics on http://"
            << server->metrics_server_->address() << "/metrics, data in " << config.data_dir;
  return server;
}

void CoordinatorServer::TickLoop() {
  while (!stop_.WaitForNotificationWithTimeout(tick_interval_)) coordinator_->Tick();
}

void CoordinatorServer::Wait() { stop_.WaitForNotification(); }

void CoordinatorServer::Shutdown() {
  if (shut_down_.exchange(true)) return;
  // Start() may have failed part way: only stop what exists.
  if (server_ == nullptr) return;
  LOG(INFO) << "coordinator shutting down";
  stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  coordinator_->Quiesce();
  // Streams get a short grace to finish; then they are cancelled.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown();
  if (server_ != nullptr) server_->Wait();
}

}  // namespace cohort::coordinator
