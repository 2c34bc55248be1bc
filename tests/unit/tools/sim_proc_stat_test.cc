#include <unistd.h>

#include <chrono>

#include "gtest/gtest.h"
#include "tools/sim/proc_stat.h"

namespace cohort::sim {
namespace {

// A real line's shape: pid (comm) state ppid pgrp session tty tpgid flags
// minflt cminflt majflt cmajflt utime stime cutime cstime ...
constexpr char kLine[] =
    "4242 (cohort-coord) S 1 4242 4242 0 -1 4194560 1200 0 3 0 250 50 7 9 20 0 9 0 "
    "123456 1000000 2000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 3 0 0 0 0 0\n";

TEST(ParseProcStatTest, UtimePlusStime) {
  absl::StatusOr<double> cpu = ParseProcStatCpuSeconds(kLine, 100);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_DOUBLE_EQ(*cpu, 3.0);  // (250 + 50) ticks at 100 Hz; cutime/cstime excluded
}

TEST(ParseProcStatTest, CommandNameWithSpacesAndParens) {
  absl::StatusOr<double> cpu = ParseProcStatCpuSeconds(
      "77 (a b) (c)) R 1 77 77 0 -1 0 0 0 0 0 1000 24 0 0 20 0 1 0 5 6 7", 1000);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_DOUBLE_EQ(*cpu, 1.024);
}

TEST(ParseProcStatTest, MalformedLines) {
  EXPECT_EQ(ParseProcStatCpuSeconds("", 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcStatCpuSeconds("1 (x) S 1 2 3", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcStatCpuSeconds("1 (x) S 1 1 1 0 -1 0 0 0 0 0 abc 5 0 0", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcStatCpuSeconds(kLine, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReadProcessCpuSecondsTest, OwnProcessGrows) {
  absl::StatusOr<double> before = ReadProcessCpuSeconds(::getpid());
  ASSERT_TRUE(before.ok()) << before.status();
  // Burn ~50 ms of CPU so at least a few clock ticks accrue.
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  volatile uint64_t sink = 0;
  while (std::chrono::steady_clock::now() < end) sink = sink + 1;
  absl::StatusOr<double> after = ReadProcessCpuSeconds(::getpid());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GT(*after, *before);
}

TEST(ReadProcessCpuSecondsTest, MissingProcessIsNotFound) {
  EXPECT_EQ(ReadProcessCpuSeconds(2147483647).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace cohort::sim
