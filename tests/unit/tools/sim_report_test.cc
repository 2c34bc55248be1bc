#include "tools/sim/sim_report.h"

#include <string>

#include "gtest/gtest.h"

namespace cohort::sim {
namespace {

SimReport Example() {
  SimReport r;
  r.workers = 1000;
  r.rate = 1;
  r.attached = 1000;
  r.attach_seconds = 1.5;
  r.window_seconds = 10;
  r.heartbeat = {.count = 10000, .p50_ms = 0.4215, .p99_ms = 2.5, .max_ms = 12.25, .mean_ms = 0.5};
  r.unacked_heartbeats = 1;
  r.stream_errors = 2;
  r.coordinator_cpu_seconds = 2.5;
  return r;
}

TEST(SimReportTest, CpuPercentOfOneCore) {
  SimReport r = Example();
  ASSERT_TRUE(r.coordinator_cpu_percent().has_value());
  EXPECT_DOUBLE_EQ(*r.coordinator_cpu_percent(), 25.0);
  EXPECT_EQ(r.errors(), 3);
  r.coordinator_cpu_seconds.reset();
  EXPECT_FALSE(r.coordinator_cpu_percent().has_value());
}

TEST(SimReportTest, TableHasHeaderRowAndAlignedColumns) {
  const std::string table = FormatTable(Example());
  EXPECT_EQ(table,
            "workers  rate/s  attached  heartbeats  hb_p50_ms  hb_p99_ms  hb_max_ms  coord_cpu_s  "
            "coord_cpu_%  errors\n"
            "   1000       1      1000       10000      0.421      2.500     12.250         2.50  "
            "       25.0       3\n"
            "attached 1000/1000 workers in 1.500 s; window 10.000 s\n");
}

TEST(SimReportTest, TableShowsDashWithoutCpuAndAddsPlanLine) {
  SimReport r = Example();
  r.coordinator_cpu_seconds.reset();
  r.rate = 2.5;
  r.plan = PlanTiming{.workers = 10000, .tensor = 8, .runs = 5, .median_ms = 12.3456};
  const std::string table = FormatTable(r);
  EXPECT_NE(table.find("            -            -"), std::string::npos) << table;
  EXPECT_NE(table.find("   2.50"), std::string::npos) << table;
  EXPECT_NE(table.find("\nmesh planning over 10000 workers (tp 8): median 12.346 ms over 5 runs\n"),
            std::string::npos)
      << table;
}

TEST(SimReportTest, Json) {
  SimReport r = Example();
  r.coordinator_cpu_seconds.reset();
  EXPECT_EQ(FormatJson(r),
            "{\"workers\":1000,\"rate\":1.000,\"attached\":1000,\"attach_seconds\":1.500,"
            "\"window_seconds\":10.000,\"heartbeats\":10000,\"hb_p50_ms\":0.421,"
            "\"hb_p99_ms\":2.500,\"hb_max_ms\":12.250,\"hb_mean_ms\":0.500,"
            "\"coord_cpu_s\":null,\"coord_cpu_percent\":null,\"unacked_heartbeats\":1,"
            "\"stream_errors\":2,\"errors\":3,\"assignments\":0,\"plan\":null}\n");
  r.plan = PlanTiming{.workers = 16, .tensor = 8, .runs = 5, .median_ms = 0.5};
  EXPECT_NE(
      FormatJson(r).find("\"plan\":{\"workers\":16,\"tensor\":8,\"runs\":5,\"median_ms\":0.500}}"),
      std::string::npos);
}

}  // namespace
}  // namespace cohort::sim
