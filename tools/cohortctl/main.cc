// cohortctl: command-line client of the Cohort coordinator. Parses flags into
// a CtlConfig and hands it to the cohort_ctl library; see `cohortctl help`.

#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/tls_credentials.h"
#include "tools/cohortctl/cohortctl.h"
#include "tools/cohortctl/command_line.h"

// Each flag is declared in tools/cohortctl/command_line.cc (FlagDocs), which
// `cohortctl help` prints. The submit flags (those with a spec_field) go to
// CtlConfig::spec as text and have no absl flag; the others are defined here.
// Only flags given on the command line are read, so the defaults here are
// placeholders.
ABSL_FLAG(std::string, coordinator, "", "see cohortctl help");
ABSL_FLAG(std::string, output, "table", "see cohortctl help");
ABSL_FLAG(double, timeout, 10.0, "see cohortctl help");
ABSL_FLAG(std::string, tls_ca, "", "see cohortctl help");
ABSL_FLAG(std::string, tls_cert, "", "see cohortctl help");
ABSL_FLAG(std::string, tls_key, "", "see cohortctl help");
ABSL_FLAG(std::string, tls_server_name, "", "see cohortctl help");
ABSL_FLAG(std::string, token_file, "", "see cohortctl help");
ABSL_FLAG(bool, all, false, "see cohortctl help");
ABSL_FLAG(bool, validate_only, false, "see cohortctl help");
ABSL_FLAG(std::string, out, "", "see cohortctl help");
ABSL_FLAG(std::string, format, "safetensors", "see cohortctl help");
ABSL_FLAG(int32_t, workers, 0, "see cohortctl help");
ABSL_FLAG(std::string, reason, "", "see cohortctl help");

namespace {

using cohort::cohortctl::CtlConfig;

int TerminalWidth() {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    return size.ws_col;
  }
  int columns = 0;
  if (const char* env = std::getenv("COLUMNS");
      env != nullptr && absl::SimpleAtoi(env, &columns) && columns > 0) {
    return columns;
  }
  return 80;
}

// The command word: the first argument that is neither a flag nor the value
// of a global flag given as a separate argument ("--coordinator HOST").
// Its index, or args.size() when there is none.
size_t CommandIndex(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') return i;
    const std::string name = arg.substr(arg.find_first_not_of('-'));
    if (name.find('=') != std::string::npos) continue;
    const cohort::cohortctl::FlagDoc* doc = cohort::cohortctl::FindFlagDoc(name);
    if (doc != nullptr && doc->kind == cohort::cohortctl::FlagKind::kValue) ++i;
  }
  return args.size();
}

// `cohortctl sample ...` runs cohort-sample from cohortctl's own directory
// with the same arguments less the command word: generation needs the
// model and its compute libraries, which cohortctl does not link. Returns
// only when that program cannot be started.
int ExecSample(const std::vector<std::string>& args, size_t command) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = ".";
  if (n > 0) {
    self[n] = '\0';
    dir = std::string(self);
    dir = dir.substr(0, dir.rfind('/'));
  }
  // The build tree keeps it in tools/sample/; an installation beside cohortctl.
  std::string program;
  for (const std::string& candidate :
       {dir + "/cohort-sample", dir + "/sample/cohort-sample"}) {
    if (access(candidate.c_str(), X_OK) == 0) {
      program = candidate;
      break;
    }
  }
  if (program.empty()) {
    std::cerr << "cohortctl: sample: cannot find the cohort-sample program in " << dir
              << " (install it beside cohortctl; in a build tree: cmake --build BUILD "
                 "--target cohort-sample)\n";
    return cohort::cohortctl::kExitFailure;
  }
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i != command) rest.push_back(args[i]);
  }
  std::vector<char*> argv;
  argv.push_back(program.data());
  for (std::string& arg : rest) argv.push_back(arg.data());
  argv.push_back(nullptr);
  execv(program.c_str(), argv.data());
  std::cerr << "cohortctl: sample: cannot run " << program << ": " << std::strerror(errno) << "\n";
  return cohort::cohortctl::kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ctl = cohort::cohortctl;
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (const size_t command = CommandIndex(args);
      command < args.size() && args[command] == "sample") {
    return ExecSample(args, command);
  }
  // Scanning first (instead of absl::ParseCommandLine) lets unknown flags and
  // bad values exit with the usage status, and records which flags were given.
  absl::StatusOr<ctl::ScannedCommandLine> scanned = ctl::ScanCommandLine(args);
  if (!scanned.ok()) {
    return ctl::ReportUsageError(scanned.status().message(), std::cerr);
  }
  if (scanned->help) {
    std::cout << ctl::UsageText();
    return ctl::kExitOk;
  }
  absl::flat_hash_set<std::string> given;
  CtlConfig config;
  for (const auto& [name, value] : scanned->flags) {
    if (const ctl::FlagDoc* doc = ctl::FindFlagDoc(name); doc != nullptr && doc->spec_field != nullptr) {
      config.spec.emplace_back(name, value);  // checked as the spec is built
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {  // FlagDocs and the definitions above disagree
      std::cerr << "cohortctl: internal error: flag --" << name
                << " is documented but not defined\n";
      return 70;  // EX_SOFTWARE
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return ctl::ReportUsageError(error, std::cerr);
    }
    given.insert(name);
  }
  auto set = [&given](const char* name) { return given.contains(name); };
  config.args = scanned->positional;
  absl::StatusOr<std::string> coordinator = ctl::ResolveCoordinatorAddress(
      set("coordinator") ? std::optional(absl::GetFlag(FLAGS_coordinator)) : std::nullopt,
      std::getenv("COHORT_COORDINATOR"));
  if (!coordinator.ok()) return ctl::ReportUsageError(coordinator.status().message(), std::cerr);
  config.coordinator = *coordinator;
  absl::StatusOr<ctl::OutputFormat> output = ctl::ParseOutputFormat(absl::GetFlag(FLAGS_output));
  if (!output.ok()) return ctl::ReportUsageError(output.status().message(), std::cerr);
  config.output = *output;
  absl::StatusOr<absl::Duration> timeout = ctl::ParseTimeout(absl::GetFlag(FLAGS_timeout));
  if (!timeout.ok()) return ctl::ReportUsageError(timeout.status().message(), std::cerr);
  config.timeout = *timeout;
  auto flag_or_env = [&set](const char* name, const absl::Flag<std::string>& flag,
                            const char* env) -> std::string {
    if (set(name)) return absl::GetFlag(flag);
    const char* value = std::getenv(env);
    return value == nullptr ? "" : value;
  };
  config.tls.ca = flag_or_env("tls_ca", FLAGS_tls_ca, "COHORT_TLS_CA");
  config.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  config.tls.key = absl::GetFlag(FLAGS_tls_key);
  config.tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  absl::StatusOr<std::string> token = ctl::ResolveBearerToken(
      set("token_file") ? std::optional(absl::GetFlag(FLAGS_token_file)) : std::nullopt,
      std::getenv("COHORT_TOKEN_FILE"), std::getenv("COHORT_TOKEN"));
  if (!token.ok()) return ctl::ReportUsageError(token.status().message(), std::cerr);
  config.token = *token;
  config.all = absl::GetFlag(FLAGS_all);
  config.validate_only = absl::GetFlag(FLAGS_validate_only);
  if (set("out")) config.out = absl::GetFlag(FLAGS_out);
  if (set("format")) config.format = absl::GetFlag(FLAGS_format);
  if (set("workers")) config.workers = absl::GetFlag(FLAGS_workers);
  if (set("reason")) config.reason = absl::GetFlag(FLAGS_reason);

  config.stdout_is_terminal = isatty(STDOUT_FILENO) == 1;
  config.terminal_width = TerminalWidth();
  return ctl::RunCohortctl(config, std::cout, std::cerr);
}
