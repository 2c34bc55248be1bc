#pragma once
// What main.cc hands to the cohortctl library: the parsed command line as a
// plain struct (docs/conventions.md, Flags only in main.cc: flags live only in main.cc).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/tls_credentials.h"
#include "absl/time/time.h"

namespace cohort::cohortctl {

enum class OutputFormat { kTable, kJson };

// Job spec fields given on the command line: (flag name, value text) in
// command-line order, the last of a repeated flag winning. The flag table
// (command_line.h, FlagDoc::spec_field) says which JobSpec field each one
// sets; a field no flag names keeps the spec file's value, or the demo job's
// when no file is given. Values are checked when the spec is built.
using SpecFlags = std::vector<std::pair<std::string, std::string>>;

struct CtlConfig {
  // host:port of the coordinator's gRPC endpoint.
  std::string coordinator = "localhost:7070";
  OutputFormat output = OutputFormat::kTable;
  // TLS material (--tls_ca etc.) and the bearer token (from --token_file or
  // $COHORT_TOKEN; empty: none).
  ClientTlsFiles tls;
  std::string token;
  // Deadline of each unary RPC, and how long a watch waits to connect.
  absl::Duration timeout = absl::Seconds(10);
  // Positional arguments: the command, then its operands.
  std::vector<std::string> args;
  bool all = false;            // list: include finished jobs
  bool validate_only = false;  // submit: check the spec, create nothing
  SpecFlags spec;
  // checkpoints export: the file format ("safetensors") and the output file.
  std::optional<std::string> format;
  std::optional<std::string> out;
  // scale: --workers=N, shorthand for --min_workers=N --max_workers=N.
  std::optional<int32_t> workers;
  // drain: why the worker is taken out of service (the coordinator logs it).
  std::optional<std::string> reason;
  // watch draws a progress bar in place when stdout is a terminal.
  bool stdout_is_terminal = false;
  int terminal_width = 80;
};

}  // namespace cohort::cohortctl
