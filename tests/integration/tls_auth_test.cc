// TLS, worker certificates and bearer tokens against a real coordinator
// (cohort-coordinator --tls_cert --tls_key --tls_client_ca
// --auth_tokens_file), with material from tools/dev-certs. Prints the matrix
// of what each client got.

#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cohort/v1/checkpoints.grpc.pb.h"
#include "cohort/v1/jobs.grpc.pb.h"
#include "cohort/v1/kv.grpc.pb.h"
#include "cohort/v1/workers.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/tls_credentials.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::string Trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

class TlsAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(MakeTempDir("tls-certs") + "/pki");
    Subprocess::Options options;
    options.binary = "/bin/bash";
    options.args = {std::string(COHORT_SOURCE_DIR) + "/tools/dev-certs", *certs_};
    options.log_path = *certs_ + ".log";
    auto script = Subprocess::Start(options);
    ASSERT_TRUE(script.ok()) << script.status();
    absl::StatusOr<int> code = (*script)->Wait(absl::Seconds(60));
    ASSERT_TRUE(code.ok() && *code == 0) << "tools/dev-certs failed:\n" << (*script)->ReadLog();
  }
  static void TearDownTestSuite() { delete certs_; }

  void SetUp() override {
    dir_ = MakeTempDir("tls-auth");
    port_ = PickFreePort();
    Subprocess::Options options;
    options.binary = BinaryPath("cohort-coordinator");
    options.args = {absl::StrCat("--listen=127.0.0.1:", port_),
                    "--metrics_address=127.0.0.1:0",
                    absl::StrCat("--data_dir=", dir_, "/data"),
                    "--tls_cert=" + Cert("coordinator.pem"),
                    "--tls_key=" + Cert("coordinator.key"),
                    "--tls_client_ca=" + Cert("ca.pem"),
                    "--auth_tokens_file=" + Cert("tokens")};
    options.log_path = dir_ + "/coordinator.log";
    auto process = Subprocess::Start(options);
    ASSERT_TRUE(process.ok()) << process.status();
    coordinator_ = *std::move(process);
    // Up once an admin call goes through.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!Call(Client("", "", Token("admin.token")), "Workers.List").ok()) {
      ASSERT_LT(absl::Now(), give_up) << "coordinator did not come up:\n" << coordinator_->ReadLog();
      ASSERT_TRUE(coordinator_->Running()) << coordinator_->ReadLog();
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  static std::string Cert(const std::string& name) { return *certs_ + "/" + name; }
  static std::string Token(const std::string& file) { return Trimmed(ReadFile(Cert(file))); }
  std::string address() const { return absl::StrCat("localhost:", port_); }

  // A channel with the cluster CA (or `ca`), an optional client
  // certificate, and an optional bearer token.
  std::shared_ptr<grpc::Channel> Client(const std::string& cert, const std::string& key,
                                        const std::string& token,
                                        const std::string& ca = "ca.pem") {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(Cert(ca));
    if (!cert.empty()) {
      ssl.pem_cert_chain = ReadFile(Cert(cert));
      ssl.pem_private_key = ReadFile(Cert(key));
    }
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
    if (!token.empty()) {
      credentials = grpc::CompositeChannelCredentials(credentials,
                                                      grpc::AccessTokenCredentials(token));
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    return grpc::CreateCustomChannel(address(), credentials, args);
  }

  // One call of `method` ("Workers.List", "Jobs.Submit", "Workers.Attach",
  // "KeyValue.Set") and its status.
  static grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& method) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (method == "Workers.List") {
      v1::ListWorkersRequest request;
      v1::ListWorkersResponse response;
      return v1::Workers::NewStub(channel)->List(&context, request, &response);
    }
    if (method == "Jobs.Submit") {
      v1::SubmitJobRequest request;
      request.set_validate_only(true);
      *request.mutable_spec() = SmallJobSpec("tls", 1, 1, 5);
      v1::Job response;
      return v1::Jobs::NewStub(channel)->Submit(&context, request, &response);
    }
    if (method == "KeyValue.Set") {
      v1::SetRequest request;
      request.mutable_scope()->set_job_id("no-such-job");
      request.mutable_scope()->set_generation(1);
      request.set_key("k");
      request.set_value("v");
      v1::SetResponse response;
      return v1::KeyValue::NewStub(channel)->Set(&context, request, &response);
    }
    // Workers.Attach: a refused stream finishes before any message; an
    // admitted one gets the empty message refused by the attach logic
    // (InvalidArgument: no Hello), not by the gate.
    auto stream = v1::Workers::NewStub(channel)->Attach(&context);
    v1::WorkerMessage empty;
    stream->Write(empty);
    stream->WritesDone();
    v1::CoordinatorMessage reply;
    while (stream->Read(&reply)) {
    }
    return stream->Finish();
  }

  void Expect(const std::string& who, const grpc::Status& status, grpc::StatusCode code,
              const std::string& message_part = "") {
    std::printf("  %-44s %-20s %s\n", who.c_str(),
                StatusCodeLabel(FromGrpcStatus(status)).c_str(), status.error_message().c_str());
    EXPECT_EQ(status.error_code(), code) << who << ": " << status.error_message();
    if (!message_part.empty()) {
      EXPECT_THAT(status.error_message(), HasSubstr(message_part)) << who;
    }
  }

  static std::string* certs_;
  std::string dir_;
  int port_ = 0;
  std::unique_ptr<Subprocess> coordinator_;
};

std::string* TlsAuthTest::certs_ = nullptr;

TEST_F(TlsAuthTest, WorkerCertificatesAndTokensDecideWhatACallerMayDo) {
  std::printf("  %-44s %-20s %s\n", "client", "status", "message");
  // Workers.
  Expect("plaintext client on the TLS port",
         Call(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                  grpc::InsecureChannelCredentials()),
              "Workers.Attach"),
         grpc::StatusCode::UNAVAILABLE);
  Expect("worker without a certificate: Attach", Call(Client("", "", ""), "Workers.Attach"),
         grpc::StatusCode::UNAUTHENTICATED, "client certificate signed by the cluster CA");
  Expect("worker without a certificate: KeyValue.Set", Call(Client("", "", ""), "KeyValue.Set"),
         grpc::StatusCode::UNAUTHENTICATED);
  Expect("worker, certificate from another CA: Attach",
         Call(Client("wrong-ca-worker.pem", "wrong-ca-worker.key", ""), "Workers.Attach"),
         grpc::StatusCode::UNAVAILABLE);
  Expect("worker, expired certificate: Attach",
         Call(Client("expired-worker.pem", "expired-worker.key", ""), "Workers.Attach"),
         grpc::StatusCode::UNAVAILABLE);
  Expect("worker, valid certificate: Attach (empty Hello)",
         Call(Client("worker.pem", "worker.key", ""), "Workers.Attach"),
         grpc::StatusCode::INVALID_ARGUMENT);
  // Admitted: the KeyValue logic answers (the scope's job does not exist).
  Expect("worker, valid certificate: KeyValue.Set",
         Call(Client("worker.pem", "worker.key", ""), "KeyValue.Set"),
         grpc::StatusCode::NOT_FOUND, "is not active");
  Expect("client trusting another CA", Call(Client("", "", Token("admin.token"), "other-ca.pem"),
                                              "Workers.List"),
         grpc::StatusCode::UNAVAILABLE);
  // Users.
  Expect("no token: Workers.List", Call(Client("", "", ""), "Workers.List"),
         grpc::StatusCode::UNAUTHENTICATED, "bearer token");
  Expect("unknown token: Workers.List",
         Call(Client("", "", "not-a-token-of-this-cluster"), "Workers.List"),
         grpc::StatusCode::UNAUTHENTICATED, "not one of this coordinator's tokens");
  Expect("worker certificate, no token: Jobs.Submit",
         Call(Client("worker.pem", "worker.key", ""), "Jobs.Submit"),
         grpc::StatusCode::UNAUTHENTICATED);
  Expect("read-only token: Workers.List", Call(Client("", "", Token("read.token")), "Workers.List"),
         grpc::StatusCode::OK);
  Expect("read-only token: Jobs.Submit (admin)",
         Call(Client("", "", Token("read.token")), "Jobs.Submit"),
         grpc::StatusCode::PERMISSION_DENIED, "needs an admin token");
  Expect("admin token: Jobs.Submit", Call(Client("", "", Token("admin.token")), "Jobs.Submit"),
         grpc::StatusCode::OK);

  // Nothing secret reaches the log.
  coordinator_->Signal(SIGTERM);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(30)).ok());
  const std::string log = coordinator_->ReadLog();
  for (const std::string file : {"admin.token", "read.token"}) {
    EXPECT_THAT(log, Not(HasSubstr(Token(file)))) << file;
  }
  for (const std::string file : {"coordinator.key", "ca.pem", "coordinator.pem"}) {
    const std::string pem = ReadFile(Cert(file));
    // The base64 body's first line is unique to the key or certificate.
    const std::string body_line = pem.substr(pem.find('\n') + 1, 40);
    EXPECT_THAT(log, Not(HasSubstr(body_line))) << file;
  }
  EXPECT_THAT(log, HasSubstr("with TLS"));
}

TEST_F(TlsAuthTest, AWorkerWithACertificateTrainsAndOneWithoutNeverJoins) {
  auto start_worker = [&](const std::string& id, std::vector<std::string> tls) {
    Subprocess::Options options;
    options.binary = BinaryPath("cohort-worker");
    options.args = {"--coordinator=" + address(), "--worker_id=" + id, "--host=tls-host",
                    "--device=cpu", "--metrics_address=127.0.0.1:0", "--threads=1",
                    "--tls_ca=" + Cert("ca.pem")};
    options.args.insert(options.args.end(), tls.begin(), tls.end());
    options.log_path = dir_ + "/" + id + ".log";
    auto process = Subprocess::Start(options);
    EXPECT_TRUE(process.ok()) << process.status();
    return *std::move(process);
  };
  auto good = start_worker("good", {"--tls_cert=" + Cert("worker.pem"),
                                    "--tls_key=" + Cert("worker.key")});
  auto bad = start_worker("no-cert", {});
  auto admin = Client("", "", Token("admin.token"));
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = SmallJobSpec("tls-train", 1, 1, 1);
  request.mutable_spec()->set_steps(20);
  v1::Job job;
  ASSERT_TRUE(v1::Jobs::NewStub(admin)->Submit(&context, request, &job).ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(120);
  for (;;) {
    grpc::ClientContext get_context;
    v1::GetJobRequest get;
    get.set_job_id(job.job_id());
    v1::Job now;
    ASSERT_TRUE(v1::Jobs::NewStub(admin)->Get(&get_context, get, &now).ok());
    if (now.state() == v1::JOB_STATE_COMPLETED) break;
    ASSERT_NE(now.state(), v1::JOB_STATE_FAILED) << now.message();
    ASSERT_LT(absl::Now(), give_up) << "job did not complete:\n" << good->ReadLog();
    absl::SleepFor(absl::Milliseconds(100));
  }
  grpc::ClientContext list_context;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(
      v1::Workers::NewStub(admin)->List(&list_context, v1::ListWorkersRequest(), &workers).ok());
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).worker_id(), "good");
  EXPECT_THAT(bad->ReadLog(), HasSubstr("UNAUTHENTICATED"));
}

// Attaches as `worker_id` on `host` with a full Hello; the stream's status
// once the coordinator answered (OK: welcomed, then cancelled by us).
grpc::Status AttachAs(const std::shared_ptr<grpc::Channel>& channel, const std::string& worker_id,
                      const std::string& host) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = v1::Workers::NewStub(channel)->Attach(&context);
  v1::WorkerMessage hello;
  hello.set_incarnation(4242);
  hello.mutable_hello()->set_worker_id(worker_id);
  hello.mutable_hello()->set_host(host);
  hello.mutable_hello()->set_device_kind(v1::DEVICE_KIND_CPU);
  hello.mutable_hello()->set_incarnation(4242);
  stream->Write(hello);
  v1::CoordinatorMessage reply;
  if (stream->Read(&reply) && reply.has_welcome()) {
    context.TryCancel();
    stream->Finish();
    return grpc::Status::OK;
  }
  return stream->Finish();
}

// Issue 21: a worker certificate could act as any worker id (evicting the
// real one), write another job's KeyValue keys and upload its checkpoints.
// Now its URI names bind it (coordinator/membership/worker_identity.h).
TEST_F(TlsAuthTest, AWorkerCertificateActsOnlyAsTheWorkersItNames) {
  auto w0 = Client("worker-w0.pem", "worker-w0.key", "");
  auto h1 = Client("host-h1-worker.pem", "host-h1-worker.key", "");
  auto unnamed = Client("unnamed-worker.pem", "unnamed-worker.key", "");
  auto any = Client("worker.pem", "worker.key", "");
  Expect("cohort://worker/w0 attaching as w0", AttachAs(w0, "w0", "hx"), grpc::StatusCode::OK);
  Expect("cohort://worker/w0 attaching as w1", AttachAs(w0, "w1", "hx"),
         grpc::StatusCode::PERMISSION_DENIED, "may act as workers w0, not as worker \"w1\"");
  Expect("cohort://host/h1 attaching as x on h1", AttachAs(h1, "x", "h1"), grpc::StatusCode::OK);
  Expect("cohort://host/h1 attaching as y on h2", AttachAs(h1, "y", "h2"),
         grpc::StatusCode::PERMISSION_DENIED, "workers on hosts h1");
  Expect("certificate naming no worker", AttachAs(unnamed, "z", "hz"),
         grpc::StatusCode::PERMISSION_DENIED, "no worker");
  Expect("cohort://worker/* attaching as w7", AttachAs(any, "w7", "hx"), grpc::StatusCode::OK);

  // A job whose one member is worker "member": only a certificate that may
  // act as it may use the job's KeyValue scope or upload its checkpoints.
  Subprocess::Options options;
  options.binary = BinaryPath("cohort-worker");
  options.args = {"--coordinator=" + address(), "--worker_id=member", "--host=tls-host",
                  "--device=cpu", "--metrics_address=127.0.0.1:0", "--threads=1",
                  "--trainer=idle", "--tls_ca=" + Cert("ca.pem"),
                  "--tls_cert=" + Cert("worker.pem"), "--tls_key=" + Cert("worker.key")};
  options.log_path = dir_ + "/member.log";
  auto member = Subprocess::Start(options);
  ASSERT_TRUE(member.ok()) << member.status();
  auto admin = Client("", "", Token("admin.token"));
  // The job must land on "member": wait until it is the only idle worker
  // (the Attach streams above may not have been seen closing yet).
  const absl::Time attached_by = absl::Now() + absl::Seconds(60);
  for (;;) {
    grpc::ClientContext context;
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(
        v1::Workers::NewStub(admin)->List(&context, v1::ListWorkersRequest(), &workers).ok());
    std::vector<std::string> idle;
    for (const v1::WorkerInfo& worker : workers.workers()) {
      if (worker.state() == v1::WORKER_STATE_IDLE) idle.push_back(worker.worker_id());
    }
    if (idle == std::vector<std::string>{"member"}) break;
    ASSERT_LT(absl::Now(), attached_by) << "idle: " << absl::StrJoin(idle, ", ") << "\n"
                                        << (*member)->ReadLog();
    absl::SleepFor(absl::Milliseconds(20));
  }
  v1::Job job;
  {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = SmallJobSpec("bound", 1, 1, 1);
    ASSERT_TRUE(v1::Jobs::NewStub(admin)->Submit(&context, request, &job).ok());
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  for (;;) {
    grpc::ClientContext context;
    v1::GetJobRequest get;
    get.set_job_id(job.job_id());
    ASSERT_TRUE(v1::Jobs::NewStub(admin)->Get(&context, get, &job).ok());
    if (job.generation() >= 1 && job.state() == v1::JOB_STATE_RUNNING) break;
    ASSERT_LT(absl::Now(), give_up) << "the job never ran:\n" << (*member)->ReadLog();
    absl::SleepFor(absl::Milliseconds(50));
  }
  auto kv_set = [&](const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::SetRequest request;
    request.mutable_scope()->set_job_id(job.job_id());
    request.mutable_scope()->set_generation(job.generation());
    request.set_key("forged");
    request.set_value("v");
    v1::SetResponse response;
    return v1::KeyValue::NewStub(channel)->Set(&context, request, &response);
  };
  Expect("cohort://worker/w0: KeyValue.Set in another job", kv_set(w0),
         grpc::StatusCode::PERMISSION_DENIED, "none of which is a member or donor of job");
  Expect("cohort://worker/*: KeyValue.Set", kv_set(any), grpc::StatusCode::OK);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::UploadResponse response;
    auto writer = v1::Checkpoints::NewStub(w0)->Upload(&context, &response);
    v1::UploadRequest header;
    header.mutable_header()->set_job_id(job.job_id());
    header.mutable_header()->set_generation(job.generation());
    header.mutable_header()->set_step(1);
    writer->Write(header);
    writer->WritesDone();
    Expect("cohort://worker/w0: Checkpoints.Upload for another job", writer->Finish(),
           grpc::StatusCode::PERMISSION_DENIED, "none of which is a member or donor of job");
  }
}

TEST_F(TlsAuthTest, TheCoordinatorRefusesToStartWithUnusableOrMissingSecurity) {
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--tls_cert=" + Cert("expired-worker.pem"), "--tls_key=" + Cert("expired-worker.key")},
       "expired on"},
      {{"--tls_cert=" + Cert("coordinator.pem"), "--tls_key=" + Cert("worker.key")},
       "is not the private key of --tls_cert"},
      {{"--auth_tokens_file=" + Cert("tokens")}, "--auth_tokens_file: needs --tls_cert"},
      {{"--listen=0.0.0.0:0"}, "plaintext gRPC on a non-loopback address"},
  };
  for (const Case& c : cases) {
    Subprocess::Options options;
    options.binary = BinaryPath("cohort-coordinator");
    options.args = {"--listen=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
                    "--data_dir=" + MakeTempDir("tls-refused") + "/data"};
    options.args.insert(options.args.end(), c.flags.begin(), c.flags.end());
    options.log_path = MakeTempDir("tls-refused") + "/coordinator.log";
    auto process = Subprocess::Start(options);
    ASSERT_TRUE(process.ok()) << process.status();
    absl::StatusOr<int> code = (*process)->Wait(absl::Seconds(30));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 1) << c.expected;
    const std::string log = (*process)->ReadLog();
    EXPECT_THAT(log, HasSubstr(c.expected));
    std::printf("  refused: %s", log.substr(log.rfind("cohort-coordinator:")).c_str());
  }
}

}  // namespace
}  // namespace cohort::testing
