#include "tests/testing/subprocess.h"

#include <signal.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"

namespace cohort::testing {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Subprocess> StartOrDie(Subprocess::Options options) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(std::move(options));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

TEST(SubprocessTest, ExitCodeAndLogCaptureStdoutAndStderr) {
  auto p = StartOrDie({.binary = "/bin/sh", .args = {"-c", "echo hi; echo oops >&2; exit 3"}});
  ASSERT_NE(p, nullptr);
  absl::StatusOr<int> code = p->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3);
  EXPECT_EQ(p->ReadLog(), "hi\noops\n");
  EXPECT_FALSE(p->Running());
  // Waiting again returns the same code.
  EXPECT_EQ(*p->Wait(absl::ZeroDuration()), 3);
}

TEST(SubprocessTest, KillReportsSignal) {
  auto p = StartOrDie({.binary = "sleep", .args = {"100"}});
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->Running());
  p->Kill();
  absl::StatusOr<int> code = p->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + SIGKILL);
}

TEST(SubprocessTest, SignalTermReportsSignal) {
  auto p = StartOrDie({.binary = "sleep", .args = {"100"}});
  ASSERT_NE(p, nullptr);
  p->Signal(SIGTERM);
  EXPECT_EQ(*p->Wait(absl::Seconds(10)), 128 + SIGTERM);
}

TEST(SubprocessTest, WaitTimesOutWhileRunning) {
  auto p = StartOrDie({.binary = "sleep", .args = {"100"}});
  ASSERT_NE(p, nullptr);
  absl::StatusOr<int> code = p->Wait(absl::Milliseconds(50));
  EXPECT_EQ(code.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(p->Running());
}

TEST(SubprocessTest, DestructorKillsRunningChild) {
  pid_t pid = 0;
  {
    auto p = StartOrDie({.binary = "sleep", .args = {"100"}});
    ASSERT_NE(p, nullptr);
    pid = p->pid();
    ASSERT_EQ(::kill(pid, 0), 0);
  }
  // Reaped by the destructor: the pid no longer names our child.
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(SubprocessTest, EnvironmentAdditionsOverrideInherited) {
  ::setenv("COHORT_SUBPROCESS_TEST_A", "parent", 1);
  auto p = StartOrDie(
      {.binary = "/bin/sh",
       .args = {"-c", "echo $COHORT_SUBPROCESS_TEST_A $COHORT_SUBPROCESS_TEST_B"},
       .env = {{"COHORT_SUBPROCESS_TEST_A", "child"}, {"COHORT_SUBPROCESS_TEST_B", "added"}}});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p->Wait(absl::Seconds(10)), 0);
  EXPECT_EQ(p->ReadLog(), "child added\n");
}

TEST(SubprocessTest, AppendsToGivenLogPath) {
  const std::string log = absl::StrCat(MakeTempDir("subprocess_test"), "/out.log");
  { std::ofstream(log) << "before\n"; }
  auto p = StartOrDie({.binary = "/bin/echo", .args = {"after"}, .log_path = log});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p->Wait(absl::Seconds(10)), 0);
  EXPECT_EQ(p->log_path(), log);
  EXPECT_EQ(p->ReadLog(), "before\nafter\n");
}

TEST(SubprocessTest, MissingBinaryIsNotFound) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start({.binary = "/nonexistent/cohort-nothing"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  p = Subprocess::Start({.binary = "cohort-no-such-binary-on-path"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
}

TEST(WaitForLogLineTest, ReturnsWholeLine) {
  auto p =
      StartOrDie({.binary = "/bin/sh",
                  .args = {"-c", "echo first; sleep 0.1; echo 'listening on 1234'; sleep 100"}});
  ASSERT_NE(p, nullptr);
  absl::StatusOr<std::string> line = WaitForLogLine(*p, "listening on", absl::Seconds(10));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "listening on 1234");
}

TEST(WaitForLogLineTest, TimesOut) {
  auto p = StartOrDie({.binary = "sleep", .args = {"100"}});
  ASSERT_NE(p, nullptr);
  absl::StatusOr<std::string> line = WaitForLogLine(*p, "never", absl::Milliseconds(50));
  EXPECT_EQ(line.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(WaitForLogLineTest, FailsWhenProcessExitsFirst) {
  auto p = StartOrDie({.binary = "/bin/sh", .args = {"-c", "echo bye; exit 2"}});
  ASSERT_NE(p, nullptr);
  absl::StatusOr<std::string> line = WaitForLogLine(*p, "never", absl::Seconds(30));
  EXPECT_EQ(line.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(line.status().message()), HasSubstr("bye"));
}

TEST(RunCommandTest, CapturesOutputAndExitCode) {
  absl::StatusOr<CommandResult> r =
      RunCommand("/bin/sh", {"-c", "echo out; echo err >&2; exit 5"}, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 5);
  EXPECT_EQ(r->output, "out\nerr\n");
}

TEST(RunCommandTest, KillsOnTimeout) {
  const absl::Time start = absl::Now();
  absl::StatusOr<CommandResult> r =
      RunCommand("/bin/sh", {"-c", "echo started; exec sleep 100"}, absl::Milliseconds(300));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace cohort::testing
