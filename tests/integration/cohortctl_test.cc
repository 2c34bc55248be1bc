// cohortctl against a real coordinator: bad job specs and unknown job ids
// give one clear message and a non-zero exit code; good ones work.
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class CohortctlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new LocalCluster("ctl");
    cluster_->StartCoordinator();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  CommandResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), absl::StrCat("--coordinator=", cluster_->address()));
    auto result = RunCommand(BinaryPath("cohortctl"), args, absl::Seconds(30));
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : CommandResult{-1, ""};
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = absl::StrCat(cluster_->dir(), "/", name);
    std::ofstream(path) << text;
    return path;
  }

  static LocalCluster* cluster_;
};

LocalCluster* CohortctlTest::cluster_ = nullptr;

constexpr char kGoodYaml[] = R"(name: ctl-job
model: {layers: 2, heads: 4, width: 64, vocab_size: 256, context_length: 64}
data: {synthetic: {seed: 1}}
optimizer: {learning_rate: 0.001}
batch: {global_batch_size: 16, micro_batch_size: 2}
parallelism: {tensor: 2}
elastic: {min_workers: 2, max_workers: 4}
steps: 10
)";

TEST_F(CohortctlTest, SubmitsAValidFileAndGetsTheJob) {
  CommandResult submit = Ctl({"submit", WriteFile("good.yaml", kGoodYaml)});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  EXPECT_THAT(submit.output, HasSubstr("ctl-job-"));
  CommandResult list = Ctl({"list"});
  ASSERT_EQ(list.exit_code, 0) << list.output;
  EXPECT_THAT(list.output, HasSubstr("ctl-job-"));
  EXPECT_THAT(list.output, HasSubstr("PENDING"));
}

TEST_F(CohortctlTest, DeleteRemovesOnlyAFinishedJob) {
  CommandResult submit = Ctl({"submit", WriteFile("good.yaml", kGoodYaml), "--output=json"});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  std::smatch id;
  ASSERT_TRUE(std::regex_search(submit.output, id, std::regex("ctl-job-[0-9]+"))) << submit.output;
  CommandResult early = Ctl({"delete", id.str()});
  EXPECT_NE(early.exit_code, 0) << early.output;
  EXPECT_THAT(early.output, HasSubstr("only a finished job can be deleted (cancel it first)"));
  ASSERT_EQ(Ctl({"cancel", id.str()}).exit_code, 0);
  CommandResult deleted = Ctl({"delete", id.str()});
  ASSERT_EQ(deleted.exit_code, 0) << deleted.output;
  EXPECT_THAT(deleted.output, HasSubstr("deleted job " + id.str()));
  CommandResult gone = Ctl({"get", id.str()});
  EXPECT_NE(gone.exit_code, 0);
  EXPECT_THAT(gone.output, HasSubstr("not found"));
}

TEST_F(CohortctlTest, TensorParallelThatDoesNotDivideHeadsIsRefusedWithTheReason) {
  std::string yaml = kGoodYaml;
  yaml.replace(yaml.find("tensor: 2"), 9, "tensor: 3");
  CommandResult result = Ctl({"submit", WriteFile("bad-tp.yaml", yaml)});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(result.output, HasSubstr("parallelism.tensor"));
  EXPECT_THAT(result.output, HasSubstr("does not divide"));
}

TEST_F(CohortctlTest, UnknownFieldInAFileNamesTheFieldAndTheFile) {
  std::string yaml = absl::StrCat(kGoodYaml, "learning_rat: 3\n");
  const std::string path = WriteFile("typo.yaml", yaml);
  CommandResult result = Ctl({"submit", path});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr("typo.yaml"));
  EXPECT_THAT(result.output, HasSubstr("learning_rat"));
}

TEST_F(CohortctlTest, MalformedYamlAndMissingFilesAreClearErrors) {
  CommandResult broken = Ctl({"submit", WriteFile("broken.yaml", "name: [unclosed\n")});
  EXPECT_EQ(broken.exit_code, 1) << broken.output;
  EXPECT_THAT(broken.output, HasSubstr("broken.yaml"));
  CommandResult missing = Ctl({"submit", absl::StrCat(cluster_->dir(), "/nope.yaml")});
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("nope.yaml"));
}

TEST_F(CohortctlTest, SeveralProblemsAreReportedTogether) {
  std::string yaml = kGoodYaml;
  yaml.replace(yaml.find("steps: 10"), 9, "steps: 0");
  yaml.replace(yaml.find("micro_batch_size: 2"), 19, "micro_batch_size: 5");
  CommandResult result = Ctl({"submit", WriteFile("multi.yaml", yaml)});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr("steps"));
  EXPECT_THAT(result.output, HasSubstr("batch.micro_batch_size"));
}

TEST_F(CohortctlTest, UnknownJobIdsAreNotFound) {
  for (const char* command : {"get", "cancel", "watch"}) {
    CommandResult result = Ctl({command, "no-such-job-42"});
    EXPECT_EQ(result.exit_code, 1) << command << ": " << result.output;
    EXPECT_THAT(result.output, HasSubstr("NOT_FOUND")) << command;
    EXPECT_THAT(result.output, HasSubstr("no-such-job-42")) << command;
  }
  CommandResult scale = Ctl({"scale", "no-such-job-42", "--min_workers=1", "--max_workers=2"});
  EXPECT_EQ(scale.exit_code, 1) << scale.output;
  EXPECT_THAT(scale.output, HasSubstr("NOT_FOUND"));
}

TEST_F(CohortctlTest, UnreachableCoordinatorIsOneLineAndExitCodeTwo) {
  auto result = RunCommand(
      BinaryPath("cohortctl"),
      {absl::StrCat("--coordinator=127.0.0.1:", PickFreePort()), "--timeout=2", "list"},
      absl::Seconds(30));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 2) << result->output;
  EXPECT_THAT(result->output, HasSubstr("cannot reach the coordinator"));
  EXPECT_THAT(result->output, Not(HasSubstr("Segmentation")));
}

// The exit statuses README.md documents: 0 help, 64 usage (before any
// request is sent), 1 refused or unreadable input.
TEST_F(CohortctlTest, ExitStatusesAreTheDocumentedOnes) {
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--help"}, 0, "Usage: cohortctl"},
      {{"help"}, 0, "Global flags"},
      {{}, 64, "no command given"},
      {{"frob"}, 64, "unknown command \"frob\""},
      {{"list", "--frob"}, 64, "unknown flag --frob"},
      {{"get"}, 64, "get needs a JOB operand"},
      {{"list", "--timeout=1e99"}, 64, "--timeout must be"},
      {{"list", "--timeout=0"}, 64, "--timeout must be"},
      {{"list", "--coordinator=a b:1"}, 64, "--coordinator=a b:1: the host"},
      {{"list", "--output=yaml"}, 64, "--output must be table or json"},
      {{"list", "--token_file=/nonexistent/token"}, 64, "--token_file"},
      {{"scale", "j", "--workers=2", "--min_workers=1"}, 64, "cannot be combined"},
      {{"checkpoints", "delete", "j", "x"}, 64, "STEP must be a step number"},
      {{"submit", "/nonexistent/job.yaml"}, 1, "/nonexistent/job.yaml"},
      {{"submit", "/dev/zero"}, 1, "larger than 1048576 bytes"},
      {{"get", "no-such-job-42"}, 1, "NOT_FOUND"},
  };
  for (const Case& c : cases) {
    CommandResult result = Ctl(c.args);
    EXPECT_EQ(result.exit_code, c.exit_code) << absl::StrJoin(c.args, " ") << ": " << result.output;
    EXPECT_THAT(result.output, HasSubstr(c.message)) << absl::StrJoin(c.args, " ");
  }
}

TEST_F(CohortctlTest, JsonOutputIsTheProtoJsonMapping) {
  CommandResult submit =
      Ctl({"--output=json", "submit", WriteFile("json-good.yaml", kGoodYaml)});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  EXPECT_THAT(submit.output, HasSubstr("\"jobId\""));
  EXPECT_THAT(submit.output, HasSubstr("\"JOB_STATE_PENDING\""));
}

}  // namespace
}  // namespace cohort::testing
