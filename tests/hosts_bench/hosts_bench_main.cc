// cohort-bench-hosts: all-reduce bandwidth across two hosts of two ranks each
// (network namespaces made with NetnsHosts, each host's link shaped to
// --rate_gbit), for Cohort's flat ring, Cohort's hierarchical all-reduce
// (HierarchicalCommunicator) and torch.distributed's gloo backend, run in
// the same namespaces and alternated within each repetition. Needs root
// (it makes namespaces) and, for gloo, Debian's python3-torch.
//
//   cohort-bench-hosts [--rate_gbit 10] [--sizes_mib 1,16,64,256] [--reps 3]
//
// Prints the median bus bandwidth of each over the repetitions, the share of
// the shaped link each reaches, and the ratios the goals name; then
// (--gradients, the default) the data group's gradient reduction of a
// deterministic step, flat against hierarchical, timed the same way.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "tests/testing/netns_hosts.h"
#include "tests/testing/testing.h"
#include "tools/bench/collectives_table.h"

ABSL_FLAG(double, rate_gbit, 10, "each host's link rate, Gbit/s (tc tbf both ways)");
ABSL_FLAG(std::vector<std::string>, sizes_mib, std::vector<std::string>({"1", "16", "64", "256"}),
          "all-reduce sizes, MiB");
ABSL_FLAG(int64_t, piece_kib, 4096,
          "Cohort's hierarchical pipeline piece in KiB (cohort-bench-collectives --piece_kib); "
          "0: the phases in turn");
ABSL_FLAG(int, reps, 3, "repetitions (each runs flat, hierarchical and gloo in turn)");
ABSL_FLAG(double, budget_seconds, 1.0, "approximate timing per size and run");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "python with torch (gloo)");
ABSL_FLAG(std::string, gloo_script, "", "tools/bench/gloo_allreduce.py (default: in the source tree)");
ABSL_FLAG(bool, gradients, true,
          "also time the data group's gradient reduction (deterministic: ordered reduce-scatter "
          "in the tree's order, then the gather), flat against hierarchical");

namespace cohort::testing {
namespace {

constexpr int kHosts = 2;
constexpr int kRanksPerHost = 2;
constexpr int kRanks = kHosts * kRanksPerHost;
// What one run measures: an all-reduce (Cohort flat or hierarchical, or
// gloo), or the data group's gradient reduction (the ordered reduce-scatter
// and gather of a deterministic step; --gradients).
struct Kind {
  const char* name;
  const char* algorithm;   // Cohort's --algorithm; "" for gloo
  const char* collective;  // cohort-bench-collectives --collective
};
const Kind kAllReduceKinds[] = {{"flat", "flat", "allreduce"},
                                {"hierarchical", "hierarchical", "allreduce"},
                                {"gloo", "", "allreduce"}};
const Kind kGradientKinds[] = {{"flat gradients", "flat", "gradients"},
                               {"hierarchical gradients", "hierarchical", "gradients"}};

int Fail(const std::string& message) {
  std::fprintf(stderr, "cohort-bench-hosts: %s\n", message.c_str());
  return 1;
}

// One run of `kind` over the four ranks (host = rank / 2); its rows.
absl::StatusOr<std::vector<bench::BenchRow>> RunOnce(NetnsHosts& hosts, const Kind& kind,
                                                     const std::string& dir, int rep) {
  const std::string tag = absl::StrCat(absl::StrReplaceAll(kind.name, {{" ", "-"}}), "-", rep);
  const std::string csv = absl::StrCat(dir, "/", tag, ".csv");
  const std::string kv_dir = absl::StrCat(dir, "/kv-", tag);
  std::filesystem::create_directories(kv_dir);
  const std::string sizes = absl::StrJoin(absl::GetFlag(FLAGS_sizes_mib), ",");
  const std::string budget = absl::StrCat(absl::GetFlag(FLAGS_budget_seconds));
  std::string script = absl::GetFlag(FLAGS_gloo_script);
  if (script.empty()) script = absl::StrCat(COHORT_SOURCE_DIR, "/tools/bench/gloo_allreduce.py");
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    Subprocess::Options options;
    const int host = r / kRanksPerHost;
    if (std::string(kind.algorithm).empty()) {
      std::tie(options.binary, options.args) = hosts.Command(
          host, absl::GetFlag(FLAGS_python),
          {script, "--rank", absl::StrCat(r), "--world", absl::StrCat(kRanks), "--init",
           absl::StrCat("tcp://", hosts.address(0), ":29500"), "--sizes_mib", sizes,
           "--budget_seconds", budget, "--csv", csv});
    } else {
      std::tie(options.binary, options.args) =
          hosts.Command(host, BinaryPath("tools/cohort-bench-collectives"),
                        {absl::StrCat("--rank=", r), absl::StrCat("--ranks=", kRanks),
                         "--kv_dir=" + kv_dir, absl::StrCat("--algorithm=", kind.algorithm),
                         absl::StrCat("--collective=", kind.collective), "--sizes_mib=" + sizes,
                         "--budget_seconds=" + budget, "--csv=" + csv,
                         absl::StrCat("--piece_kib=", absl::GetFlag(FLAGS_piece_kib))});
    }
    // gloo binds the interface its host name resolves to (loopback here)
    // unless told: each namespace's link is eth0.
    options.env = {{"UCX_WARN_UNUSED_ENV_VARS", "n"},
                   {"OMP_NUM_THREADS", "1"},
                   {"GLOO_SOCKET_IFNAME", "eth0"}};
    options.log_path = absl::StrCat(dir, "/", tag, "-rank", r, ".log");
    ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> p, Subprocess::Start(options));
    ranks.push_back(std::move(p));
  }
  // Any rank failing ends the run (its peers would wait for it).
  const absl::Time deadline = absl::Now() + absl::Minutes(15);
  std::vector<bool> done(kRanks, false);
  for (int left = kRanks; left > 0;) {
    if (absl::Now() > deadline) {
      for (auto& rank : ranks) rank->Kill();
      return absl::DeadlineExceededError(absl::StrCat(tag, ": still running after 15 minutes"));
    }
    for (int r = 0; r < kRanks; ++r) {
      if (done[r]) continue;
      absl::StatusOr<int> code = ranks[r]->Wait(absl::Milliseconds(50));
      if (!code.ok()) continue;  // still running
      if (*code != 0) {
        for (auto& rank : ranks) rank->Kill();
        return absl::InternalError(
            absl::StrCat(tag, " rank ", r, " failed:\n", ranks[r]->ReadLog()));
      }
      done[r] = true;
      --left;
    }
  }
  std::ifstream in(csv);
  std::stringstream text;
  text << in.rdbuf();
  return bench::FromCsv(text.str());
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Run() {
  // Checked here rather than by each rank (cohort-bench-collectives), so
  // that a bad value fails before any namespace is made.
  if (const int64_t kib = absl::GetFlag(FLAGS_piece_kib); kib < 0 || kib > (int64_t{1} << 20)) {
    return Fail(
        absl::StrCat("--piece_kib must be between 0 (the phases in turn) and 1048576 "
                     "(1 GiB), got ",
                     kib));
  }
  absl::StatusOr<std::unique_ptr<NetnsHosts>> made = NetnsHosts::Create(kHosts);
  if (!made.ok()) return Fail(std::string(made.status().message()));
  NetnsHosts& hosts = **made;
  const double rate_gbit = absl::GetFlag(FLAGS_rate_gbit);
  for (int h = 0; h < kHosts; ++h) {
    absl::Status limited = hosts.LimitRate(h, static_cast<int64_t>(rate_gbit * 1e9));
    if (!limited.ok()) return Fail(std::string(limited.message()));
  }
  const std::string dir = MakeTempDir("bench-hosts");
  // kind -> bytes -> busbw and algbw per repetition.
  std::map<std::string, std::map<size_t, std::vector<std::pair<double, double>>>> runs;
  std::vector<Kind> kinds(std::begin(kAllReduceKinds), std::end(kAllReduceKinds));
  if (absl::GetFlag(FLAGS_gradients)) {
    kinds.insert(kinds.end(), std::begin(kGradientKinds), std::end(kGradientKinds));
  }
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    for (const Kind& kind : kinds) {
      std::fprintf(stderr, "repetition %d: %s\n", rep + 1, kind.name);
      absl::StatusOr<std::vector<bench::BenchRow>> rows = RunOnce(hosts, kind, dir, rep);
      if (!rows.ok()) return Fail(std::string(rows.status().message()));
      for (const bench::BenchRow& row : *rows) {
        runs[kind.name][row.bytes].push_back({row.busbw_gbs, row.algbw_gbs});
      }
    }
  }
  // Bytes each host sends across its link per byte all-reduced: a ring
  // (flat, gloo) crosses it once each way with 2 (n-1)/n of the buffer (the
  // bus bandwidth); the hierarchical lanes send 2 (H-1)/H.
  const double link_gbs = rate_gbit / 8;
  auto across = [&](const std::string& kind, double busbw, double algbw) {
    return kind == "hierarchical" ? algbw * 2.0 * (kHosts - 1) / kHosts : busbw;
  };
  std::printf("all-reduce, float32, %d hosts x %d ranks, each host's link %.3g Gbit/s (%.3g GB/s); "
              "median of %d repetitions, alternated\n",
              kHosts, kRanksPerHost, rate_gbit, link_gbs, absl::GetFlag(FLAGS_reps));
  std::printf("busbw = size / time x 2(n-1)/n (GB/s); link share = bytes a host sends across its "
              "link per second / its rate\n\n");
  std::printf("| size | flat busbw | flat link share | hier. busbw | hier. link share | gloo busbw "
              "| gloo link share | hier./flat | hier./gloo |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [bytes, flat_runs] : runs["flat"]) {
    std::map<std::string, std::pair<double, double>> m;  // kind -> (busbw, link share)
    for (const Kind& kind : kAllReduceKinds) {
      std::vector<double> bus, share;
      for (const auto& [busbw, algbw] : runs[kind.name][bytes]) {
        bus.push_back(busbw);
        share.push_back(across(kind.name, busbw, algbw) / link_gbs);
      }
      m[kind.name] = {Median(bus), Median(share)};
    }
    // The hierarchical bus bandwidth on the flat scale: time ratios.
    const double hier_vs_flat = m["hierarchical"].first / m["flat"].first;
    const double hier_vs_gloo = m["hierarchical"].first / m["gloo"].first;
    std::printf("| %zu MiB | %.3f | %.2f | %.3f | %.2f | %.3f | %.2f | %.2fx | %.2fx |\n",
                bytes >> 20, m["flat"].first, m["flat"].second, m["hierarchical"].first,
                m["hierarchical"].second, m["gloo"].first, m["gloo"].second, hier_vs_flat,
                hier_vs_gloo);
  }
  std::printf("\ngoals (64-256 MiB): hierarchical >= 1.4x the flat ring and >= 2x gloo\n");
  if (absl::GetFlag(FLAGS_gradients)) {
    // Flat, the ordered reduce-scatter is a pairwise exchange (L (n-L)/n of
    // the buffer across each host's link) and the gather a ring up to
    // kSmallGradientFloats ((n-1)/n), pairwise above; hierarchical, both
    // cross in the lanes ((H-1)/H each).
    std::printf("\ngradient reduction of a deterministic step (ordered reduce-scatter in the "
                "tree's order, then the gather; ZeRO-1 off), median of %d repetitions\n"
                "busbw = size / time x 2(n-1)/n (GB/s), as for an all-reduce\n\n"
                "| size | flat busbw | hier. busbw | hier./flat |\n|---|---|---|---|\n",
                absl::GetFlag(FLAGS_reps));
    for (const auto& [bytes, flat_runs] : runs["flat gradients"]) {
      std::vector<double> flat, hier;
      for (const auto& [busbw, algbw] : flat_runs) flat.push_back(busbw);
      for (const auto& [busbw, algbw] : runs["hierarchical gradients"][bytes]) {
        hier.push_back(busbw);
      }
      std::printf("| %zu MiB | %.3f | %.3f | %.2fx |\n", bytes >> 20, Median(flat), Median(hier),
                  Median(hier) / Median(flat));
    }
  }
  std::printf("logs and CSVs: %s\n", dir.c_str());
  return 0;
}

}  // namespace
}  // namespace cohort::testing

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "all-reduce across two network-namespace hosts: Cohort flat, Cohort hierarchical, gloo.\n"
      "  cohort-bench-hosts [--rate_gbit 10] [--sizes_mib 1,16,64,256] [--reps 3]");
  absl::ParseCommandLine(argc, argv);
  return cohort::testing::Run();
}
