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
#include "absl/strings/str_format.h"
#include "tools/sim/churn_driver.h"
#include "tools/sim/metrics_scrape.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
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
ABSL_FLAG(int, queues, 0,
          "gRPC completion queues (one thread each) the streams are spread over; 0 = auto (one "
          "per 1250 workers, at most 8)");
ABSL_FLAG(int, coordinator_pid, 0,
          "pid of the coordinator, to report its CPU over the window (0 = not measured)");
ABSL_FLAG(int, plan_workers, 10000,
          "time MeshPlanner::Plan over this many synthetic workers (tp 8); 0 = skip");
ABSL_FLAG(std::string, output, "table", "table | json");
ABSL_FLAG(std::string, name_prefix, "sim", "prefix of worker ids and host names");
ABSL_FLAG(double, churn_submits_per_second, 0,
          "while measuring, submit this many one-worker jobs per second, cancelling the oldest "
          "beyond 20 live ones");
ABSL_FLAG(int, churn_replanning_jobs, 0,
          "while measuring, this many jobs re-plan continuously (scaled between 2 and 4 workers "
          "--churn_replan_pause after each re-plan is RUNNING)");
ABSL_FLAG(double, churn_replan_pause, 1,
          "seconds between a re-plan reaching RUNNING and the next scale of that job; 0: at once");
ABSL_FLAG(int, churn_probe_workers, 0,
          "submit one job of this many workers 2 s into the run and report the time from Submit "
          "to RUNNING");
ABSL_FLAG(std::string, coordinator_metrics, "",
          "host:port of the coordinator's /metrics: report failures it detected, its lock wait "
          "and hold and heartbeat handling p99 over the run");

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
  config.queues = absl::GetFlag(FLAGS_queues);
  if (absl::GetFlag(FLAGS_coordinator_pid) > 0) {
    config.coordinator_pid = static_cast<pid_t>(absl::GetFlag(FLAGS_coordinator_pid));
  }
  config.name_prefix = absl::GetFlag(FLAGS_name_prefix);

  std::unique_ptr<cohort::sim::ChurnDriver> churn;
  cohort::sim::ChurnConfig churn_config;
  churn_config.coordinator = config.coordinator;
  churn_config.tls = config.tls;
  churn_config.submits_per_second = absl::GetFlag(FLAGS_churn_submits_per_second);
  churn_config.replanning_jobs = absl::GetFlag(FLAGS_churn_replanning_jobs);
  churn_config.probe_workers = absl::GetFlag(FLAGS_churn_probe_workers);
  churn_config.replan_pause = absl::Seconds(absl::GetFlag(FLAGS_churn_replan_pause));
  churn_config.name_prefix = config.name_prefix + "-job";
  if (churn_config.submits_per_second > 0 || churn_config.replanning_jobs > 0 ||
      churn_config.probe_workers > 0) {
    absl::StatusOr<std::unique_ptr<cohort::sim::ChurnDriver>> made =
        cohort::sim::ChurnDriver::Create(churn_config);
    if (!made.ok()) {
      std::cerr << "cohort-sim: " << made.status().message() << "\n";
      return 2;
    }
    churn = *std::move(made);
  }
  const std::string metrics_address = absl::GetFlag(FLAGS_coordinator_metrics);
  std::string metrics_before, metrics_after;
  auto scrape = [&metrics_address](std::string* out) {
    if (metrics_address.empty()) return;
    absl::StatusOr<std::string> text =
        cohort::sim::FetchMetrics(metrics_address, absl::Seconds(10));
    if (text.ok()) {
      *out = *std::move(text);
    } else {
      LOG(WARNING) << "coordinator metrics: " << text.status();
    }
  };
  std::optional<cohort::sim::ChurnReport> churn_report;
  config.on_attached = [&] {
    scrape(&metrics_before);
    if (churn != nullptr) churn->Start();
  };
  config.before_close = [&] {
    if (churn != nullptr) churn_report = churn->Stop();
    scrape(&metrics_after);
  };

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
  if (churn_report.has_value()) {
    std::cout << "churn: " << churn_report->submitted << " jobs submitted, "
              << churn_report->cancelled << " cancelled, " << churn_report->replans
              << " re-plans completed, " << churn_report->call_errors << " failed calls"
              << (churn_report->first_error.empty() ? "" : " (first: " + churn_report->first_error + ")")
              << "\n";
    if (churn_config.probe_workers > 0) {
      std::cout << "probe: a job of " << churn_config.probe_workers << " workers was RUNNING "
                << (churn_report->probe_seconds
                        ? absl::StrFormat("%.3f s", *churn_report->probe_seconds)
                        : std::string("never"))
                << " after its Submit (polled every 10 ms)\n";
    }
  }
  if (!metrics_before.empty() && !metrics_after.empty()) {
    const cohort::sim::MetricsText diff(cohort::sim::DiffMetrics(metrics_before, metrics_after));
    auto us = [](std::optional<double> seconds) {
      return seconds ? absl::StrFormat("%.0f us", *seconds * 1e6) : std::string("-");
    };
    std::cout << "coordinator over the run: "
              << diff.Sum("cohort_worker_failures_detected_total") << " failures detected; "
              << "lock hold p99 " << us(diff.Quantile("cohort_coordinator_lock_hold_seconds", 0.99))
              << " (heartbeat sections "
              << us(diff.Quantile("cohort_coordinator_lock_hold_seconds", 0.99,
                                  "section=\"heartbeat\""))
              << ", job sections "
              << us(diff.Quantile("cohort_coordinator_lock_hold_seconds", 0.99, "section=\"jobs\""))
              << "), lock wait p99 " << us(diff.Quantile("cohort_coordinator_lock_wait_seconds", 0.99))
              << ", heartbeat handling p99 "
              << us(diff.Quantile("cohort_coordinator_heartbeat_seconds", 0.99)) << "; "
              << diff.Sum("cohort_coordinator_job_write_batches_total") << " job-write batches of "
              << diff.Sum("cohort_coordinator_job_write_records_total") << " records\n";
  }
  return report->errors() == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Simulates many workers against a coordinator and reports heartbeat latency.\n"
      "  cohort-sim --coordinator 127.0.0.1:7070 --workers 1000 --rate 1 --duration 20");
  absl::ParseCommandLine(argc, argv);
  // As in the coordinator (coordinator/main.cc): Abseil's deadlock detection
  // records every lock in one global graph, 10% of the simulator's CPU at
  // 20,000 heartbeats a second, which its latency figures would include.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  cohort::log::SetProcessTag("sim");
  return RunMain();
}
