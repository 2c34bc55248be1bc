#include "coordinator/service/authorizer.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTokens[] =
    "# ROLE NAME TOKEN\n"
    "admin alice 0123456789abcdef0123\n"
    "\n"
    "read  bob   fedcba9876543210fedc   # trailing comment\n";

std::unique_ptr<Authorizer> Make(bool certificates, const char* tokens = kTokens) {
  absl::StatusOr<std::unique_ptr<Authorizer>> made =
      Authorizer::FromTokens(certificates, tokens, "tokens.txt");
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *std::move(made) : nullptr;
}

TEST(AuthorizerTest, TokensGrantTheirRoleAndNothingMore) {
  auto auth = Make(true);
  ASSERT_NE(auth, nullptr);
  EXPECT_EQ(auth->token_count(), 2);
  EXPECT_TRUE(auth->Check("Jobs.Submit", Access::kAdmin, "Bearer 0123456789abcdef0123", false).ok());
  EXPECT_TRUE(auth->Check("Jobs.Get", Access::kRead, "Bearer 0123456789abcdef0123", false).ok());
  EXPECT_TRUE(auth->Check("Jobs.Get", Access::kRead, "bearer fedcba9876543210fedc", false).ok());

  absl::Status denied = auth->Check("Jobs.Submit", Access::kAdmin, "Bearer fedcba9876543210fedc",
                                    false);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.message(), HasSubstr("Jobs.Submit needs an admin token"));
  EXPECT_THAT(denied.message(), HasSubstr("bob has role read"));
  EXPECT_THAT(denied.message(), Not(HasSubstr("fedcba")));

  EXPECT_EQ(auth->Check("Jobs.Get", Access::kRead, "", false).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth->Check("Jobs.Get", Access::kRead, "Bearer wrong-token-wrong-token", false).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth->Check("Jobs.Get", Access::kRead, "Basic 0123456789abcdef0123", false).code(),
            absl::StatusCode::kUnauthenticated);
  // A token is not a worker certificate.
  EXPECT_EQ(auth->Check("Workers.Attach", Access::kWorker, "Bearer 0123456789abcdef0123", false)
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(AuthorizerTest, WorkerCertificatesOpenWorkerMethodsAndCheckpointReadsOnly) {
  auto auth = Make(true);
  ASSERT_NE(auth, nullptr);
  EXPECT_TRUE(auth->Check("Workers.Attach", Access::kWorker, "", true).ok());
  EXPECT_TRUE(auth->Check("Checkpoints.Download", Access::kWorkerOrRead, "", true).ok());
  EXPECT_TRUE(auth->Check("Checkpoints.Download", Access::kWorkerOrRead,
                          "Bearer fedcba9876543210fedc", false)
                  .ok());
  EXPECT_EQ(auth->Check("Checkpoints.Download", Access::kWorkerOrRead, "", false).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth->Check("Jobs.Submit", Access::kAdmin, "", true).code(),
            absl::StatusCode::kUnauthenticated);
  absl::Status attach = auth->Check("Workers.Attach", Access::kWorker, "", false);
  EXPECT_EQ(attach.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(attach.message(), HasSubstr("client certificate signed by the cluster CA"));
}

TEST(AuthorizerTest, UnconfiguredChecksAreOpen) {
  auto open = Make(false, "");
  ASSERT_NE(open, nullptr);
  EXPECT_FALSE(open->tokens_required());
  EXPECT_FALSE(open->worker_certificate_required());
  EXPECT_TRUE(open->Check("Jobs.Submit", Access::kAdmin, "", false).ok());
  EXPECT_TRUE(open->Check("Workers.Attach", Access::kWorker, "", false).ok());
  // Tokens only: workers need nothing, users a token.
  auto tokens_only = Make(false);
  ASSERT_NE(tokens_only, nullptr);
  EXPECT_TRUE(tokens_only->Check("Workers.Attach", Access::kWorker, "", false).ok());
  EXPECT_FALSE(tokens_only->Check("Jobs.List", Access::kRead, "", false).ok());
}

TEST(AuthorizerTest, MalformedTokenFilesNameTheLineNeverTheToken) {
  struct Case {
    const char* contents;
    const char* expected;
  };
  for (const Case& c : {
           Case{"admin alice\n", "line 1: expected `ROLE NAME TOKEN`, found 2 fields"},
           Case{"\nroot alice 0123456789abcdef0123\n", "line 2: role must be `read` or `admin`"},
           Case{"read bob short-secret\n", "has 12 characters; at least 16"},
           Case{"read a 0123456789abcdef0123\nadmin b 0123456789abcdef0123\n",
                "line 2: the token of b is also listed"},
       }) {
    absl::StatusOr<std::unique_ptr<Authorizer>> made =
        Authorizer::FromTokens(false, c.contents, "--auth_tokens_file t");
    ASSERT_FALSE(made.ok()) << c.contents;
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(made.status().message(), HasSubstr(c.expected));
    EXPECT_THAT(made.status().message(), HasSubstr("--auth_tokens_file t"));
    EXPECT_THAT(made.status().message(), Not(HasSubstr("short-secret")));
    EXPECT_THAT(made.status().message(), Not(HasSubstr("0123456789abcdef")));
  }
  Authorizer::Options missing;
  missing.tokens_file = "/nonexistent/tokens";
  EXPECT_EQ(Authorizer::Create(missing).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace cohort::coordinator
