// cohort-sim: N simulated workers in one process heartbeating against a real
// coordinator; reports heartbeat round trips, coordinator CPU and the time
// to plan a large mesh. See tools/sim/simulator.h.
//
//   cohort-sim --coordinator 127.0.0.1:7070 --workers 5000 --rate 1
//       --duration 20 --coordinator_pid <pid of that coordinator>
//
// Exit status: 0 success, 1 the run failed (e.g. not all workers attached),
// 2 bad flags, 3 the run finished but saw errors (unacked heartbeats or
// broken streams).

#include <sys/types.h>

#include <iostream>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "common/log.h"
#include "tools/sim/plan_benchmark.h"
#include "tools/sim/simulator.h"

ABSL_FLAG(std::string, coordinator, "", "coordinator address host:port");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of the coordinator's certificate; set: TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM worker certificate from the cluster CA");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "", "name the coordinator's certificate carries");
ABSL_FLAG(int, workers, 1000, "number of simulated workers (Attach streams)");
ABSL_FLAG(double, rate, 1.0, "heartbeats per second per worker");
ABSL_FLAG(double, duration, 20, "seconds of measurement");
ABSL_FLAG(double, warmup, 3, "seconds of heartbeating after attach, before measuring");
ABSL_FLAG(std::string, channels, "auto",
          "gRPC channels (TCP connections) to spread streams over; auto = one per 250 workers");
ABSL_FLAG(int, workers_per_host, 8, "simulated workers per simulated host");
ABSL_FLAG(int, attach_batch, 250, "streams opened before waiting for their Welcomes");
ABSL_FLAG(double, attach_timeout, 60, "seconds allowed for all workers to attach");
ABSL_FLAG(int, timer_threads, 0, "heartbeat scheduler threads; 0 = auto");
ABSL_FLAG(int, coordinator_pid, 0,
          "pid of the coordinator, to report its CPU over the window (0 = not measured)");
ABSL_FLAG(int, plan_workers, 10000,
          "time MeshPlanner::Plan over this many synthetic workers (tp 8); 0 = skip");
ABSL_FLAG(std::string, output, "table", "table | json");
ABSL_FLAG(std::string, name_prefix, "sim", "prefix of worker ids and host names");

namespace {

int RunMain() {
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "table" && output != "json") {
    std::cerr << "cohort-sim: --output must be table or json\n";
    return 2;
  }
  cohort::sim::SimConfig config;
  config.coordinator = absl::GetFlag(FLAGS_coordinator);
  config.tls = {absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
                absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_server_name)};
  config.workers = absl::GetFlag(FLAGS_workers);
  config.rate = absl::GetFlag(FLAGS_rate);
  config.duration = absl::Seconds(absl::GetFlag(FLAGS_duration));
  config.warmup = absl::Seconds(absl::GetFlag(FLAGS_warmup));
  const std::string channels = absl::GetFlag(FLAGS_channels);
  if (channels != "auto") {
    if (!absl::SimpleAtoi(channels, &config.channels) || config.channels < 1) {
      std::cerr << "cohort-sim: --channels must be auto or a positive number\n";
      return 2;
    }
  }
  config.workers_per_host = absl::GetFlag(FLAGS_workers_per_host);
  config.attach_batch = absl::GetFlag(FLAGS_attach_batch);
  config.attach_timeout = absl::Seconds(absl::GetFlag(FLAGS_attach_timeout));
  config.timer_threads = absl::GetFlag(FLAGS_timer_threads);
  if (absl::GetFlag(FLAGS_coordinator_pid) > 0) {
    config.coordinator_pid = static_cast<pid_t>(absl::GetFlag(FLAGS_coordinator_pid));
  }
  config.name_prefix = absl::GetFlag(FLAGS_name_prefix);

  absl::StatusOr<std::unique_ptr<cohort::sim::Simulator>> sim =
      cohort::sim::Simulator::Create(config);
  if (!sim.ok()) {
    std::cerr << sim.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<cohort::sim::SimReport> report = (*sim)->Run();
  sim->reset();
  if (!report.ok()) {
    std::cerr << "cohort-sim: " << report.status() << "\n";
    return 1;
  }

  const int plan_workers = absl::GetFlag(FLAGS_plan_workers);
  if (plan_workers > 0) {
    cohort::sim::PlanBenchmarkOptions plan;
    plan.workers = plan_workers;
    plan.workers_per_host = config.workers_per_host;
    absl::StatusOr<cohort::sim::PlanTiming> timing = cohort::sim::TimeMeshPlanning(plan);
    if (timing.ok()) {
      report->plan = *timing;
    } else {
      LOG(WARNING) << "mesh planning not timed: " << timing.status();
    }
  }
  std::cout << (output == "json" ? cohort::sim::FormatJson(*report)
                                 : cohort::sim::FormatTable(*report))
            << std::flush;
  return report->errors() == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Simulates many workers against a coordinator and reports heartbeat latency.\n"
      "  cohort-sim --coordinator 127.0.0.1:7070 --workers 1000 --rate 1 --duration 20");
  absl::ParseCommandLine(argc, argv);
  cohort::log::SetProcessTag("sim");
  return RunMain();
}
