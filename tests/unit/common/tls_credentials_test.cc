#include "common/tls_credentials.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"

namespace cohort {
namespace {

using ::testing::HasSubstr;

std::string Write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(TlsCredentialsTest, LoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:7070"));
  EXPECT_TRUE(IsLoopbackAddress("127.1.2.3:0"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:7070"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:7070"));
  EXPECT_TRUE(IsLoopbackAddress("unix:/run/cohort.sock"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:7070"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:7070"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.7:7070"));
  EXPECT_FALSE(IsLoopbackAddress("coordinator.example:7070"));
  EXPECT_FALSE(IsLoopbackAddress("localhost.example:7070"));
}

TEST(TlsCredentialsTest, PlaintextWithoutFiles) {
  ASSERT_TRUE(MakeServerCredentials({}).ok());
  absl::StatusOr<CoordinatorTarget> target = MakeCoordinatorTarget("127.0.0.1:1", {});
  ASSERT_TRUE(target.ok());
  EXPECT_FALSE(target->secure);
  EXPECT_NE(target->credentials, nullptr);
}

TEST(TlsCredentialsTest, BadFilesAreErrorsNamingTheFlagNeverTheContents) {
  const std::string dir = testing::MakeTempDir("tls-files");
  const std::string garbage = Write(dir, "garbage.pem", "not a certificate: s3cr3t-material\n");

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> cert_only =
      MakeServerCredentials({.cert = garbage});
  EXPECT_EQ(cert_only.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cert_only.status().message(), HasSubstr("give both or neither"));

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> malformed =
      MakeServerCredentials({.cert = garbage, .key = garbage});
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("--tls_cert " + garbage));
  EXPECT_THAT(malformed.status().message(), HasSubstr("holds no PEM certificate"));
  EXPECT_THAT(malformed.status().message(), ::testing::Not(HasSubstr("s3cr3t")));

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> missing =
      MakeServerCredentials({.cert = dir + "/none.pem", .key = dir + "/none.key"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls_cert " + dir + "/none.pem"));

  EXPECT_EQ(MakeServerCredentials({.client_ca = garbage}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<CoordinatorTarget> cert_without_ca =
      MakeCoordinatorTarget("h:1", {.cert = garbage, .key = garbage});
  EXPECT_EQ(cert_without_ca.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cert_without_ca.status().message(), HasSubstr("need --tls_ca"));
  absl::StatusOr<CoordinatorTarget> bad_ca = MakeCoordinatorTarget("h:1", {.ca = garbage});
  EXPECT_THAT(bad_ca.status().message(), HasSubstr("--tls_ca " + garbage));
}

}  // namespace
}  // namespace cohort
