// cohort-sim-protocol: runs the deterministic protocol simulation
// (tests/simulation/protocol_sim.h) over many seeds and reports the ones
// whose runs broke an invariant, each with a readable trace.
//
//   cohort-sim-protocol --seeds 20000             # seeds 1..20000
//   cohort-sim-protocol --first_seed 4242 --seeds 1 --print_trace
//
// The table ends with totals of the runs' outcomes and a digest of every
// trace line and outcome: two builds that print the same digest for the same
// seeds made every decision the same way (a refactor's check).
//
// Exit status: 0 every seed passed, 1 some seed failed, 2 bad flags.

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/simulation/protocol_sim.h"

ABSL_FLAG(uint64_t, first_seed, 1, "first seed to run");
ABSL_FLAG(uint64_t, seeds, 1000, "number of seeds (first_seed, first_seed + 1, ...)");
ABSL_FLAG(int, show, 3, "failing seeds whose traces are printed");
ABSL_FLAG(int, trace_lines, 300, "trace lines printed per failing seed (its last ones)");
ABSL_FLAG(bool, print_trace, false, "print every event of every run as it happens");
ABSL_FLAG(std::string, scenario, "",
          "run a named scenario (stall, donor) with each seed instead of random ones");
ABSL_FLAG(double, interleave, 0.2,
          "probability that a coordinator call's messages are delivered late, after a later "
          "call's");

namespace {

// FNV-1a, 64 bits: stable across builds and runs (absl::Hash is not).
class Digest {
 public:
  void Add(const std::string& text) {
    for (const char c : text) {
      state_ ^= static_cast<unsigned char>(c);
      state_ *= 0x100000001b3ULL;
    }
    state_ ^= 0xff;  // ends the string, so ("ab","c") and ("a","bc") differ
    state_ *= 0x100000001b3ULL;
  }
  uint64_t value() const { return state_; }

 private:
  uint64_t state_ = 0xcbf29ce484222325ULL;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "cohort-sim-protocol: the coordinator core against simulated workers, faults and "
      "network, one seed per run; prints failing seeds with their traces");
  absl::ParseCommandLine(argc, argv);
  const uint64_t first = absl::GetFlag(FLAGS_first_seed);
  const uint64_t count = absl::GetFlag(FLAGS_seeds);
  if (count == 0) {
    std::fprintf(stderr, "--seeds: must be at least 1\n");
    return 2;
  }
  const absl::Time start = absl::Now();
  uint64_t failed = 0;
  uint64_t events = 0;
  uint64_t completed = 0;
  int64_t peer_recoveries = 0;
  int64_t checkpoint_recoveries = 0;
  int64_t lost_steps = 0;
  Digest digest;
  absl::Duration simulated;
  int shown = 0;
  std::string failing;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    cohort::simulation::SimOptions options;
    options.seed = seed;
    options.interleave_probability = absl::GetFlag(FLAGS_interleave);
    if (!absl::GetFlag(FLAGS_scenario).empty()) {
      absl::StatusOr<cohort::simulation::SimOptions> scenario =
          cohort::simulation::ScenarioOptions(absl::GetFlag(FLAGS_scenario), seed);
      if (!scenario.ok()) {
        std::fprintf(stderr, "%s\n", std::string(scenario.status().message()).c_str());
        return 2;
      }
      options = *scenario;
    }
    options.print_trace = absl::GetFlag(FLAGS_print_trace);
    const cohort::simulation::SimResult result = cohort::simulation::RunSimulation(options);
    events += result.events;
    completed += result.completed ? 1 : 0;
    peer_recoveries += result.peer_recoveries;
    checkpoint_recoveries += result.checkpoint_recoveries;
    lost_steps += result.lost_steps;
    for (const std::string& line : result.trace) digest.Add(line);
    digest.Add(result.outcome);
    simulated += result.simulated;
    if (!result.ok()) {
      ++failed;
      if (failing.size() < 2000) absl::StrAppend(&failing, " ", seed);
      if (shown++ < absl::GetFlag(FLAGS_show)) {
        std::printf("%s\n", cohort::simulation::FormatFailure(
                                result, static_cast<size_t>(absl::GetFlag(FLAGS_trace_lines)))
                                .c_str());
      }
    }
    const uint64_t done = seed - first + 1;
    if (done % 500 == 0 || done == count) {
      std::fprintf(stderr, "%llu/%llu seeds, %llu failed, %.1f s\n",
                   static_cast<unsigned long long>(done), static_cast<unsigned long long>(count),
                   static_cast<unsigned long long>(failed),
                   absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("| seeds | failed | wall s | seeds/s | events | simulated h |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf("| %llu | %llu | %.1f | %.0f | %llu | %.1f |\n",
              static_cast<unsigned long long>(count), static_cast<unsigned long long>(failed),
              wall, static_cast<double>(count) / wall, static_cast<unsigned long long>(events),
              absl::ToDoubleHours(simulated));
  std::printf("\n| completed | peer recoveries | checkpoint recoveries | lost steps | trace digest |\n");
  std::printf("|---|---|---|---|---|\n");
  std::printf("| %llu | %lld | %lld | %lld | %016llx |\n", static_cast<unsigned long long>(completed),
              static_cast<long long>(peer_recoveries),
              static_cast<long long>(checkpoint_recoveries), static_cast<long long>(lost_steps),
              static_cast<unsigned long long>(digest.value()));
  if (failed > 0) std::printf("failing seeds:%s\n", failing.c_str());
  return failed == 0 ? 0 : 1;
}
