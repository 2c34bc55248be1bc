#pragma once
// What main.cc hands to the cohortctl library: the parsed command line as a
// plain struct (docs/conventions.md, Flags only in main.cc: flags live only in main.cc).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/tls_credentials.h"
#include "absl/time/time.h"

namespace cohort::cohortctl {

enum class OutputFormat { kTable, kJson };

// Job spec fields given on the command line. A field left empty keeps the
// value from the spec file, or from the demo job when no file is given.
struct SpecFlags {
  std::optional<std::string> name;
  std::optional<std::string> device;  // "cpu" or "gpu"
  std::optional<int32_t> layers;
  std::optional<int32_t> heads;
  std::optional<int32_t> width;
  std::optional<int32_t> vocab;
  std::optional<int32_t> context;
  std::optional<uint64_t> seed;            // data seed (synthetic source too)
  std::optional<std::string> data_shards;  // glob of token shards
  std::optional<double> lr;
  std::optional<double> min_lr;
  std::optional<int32_t> warmup;
  std::optional<double> weight_decay;
  std::optional<double> grad_clip;
  std::optional<int32_t> global_batch;
  std::optional<int32_t> micro_batch;
  std::optional<int32_t> tensor;
  std::optional<int32_t> pipeline;
  std::optional<bool> zero1;
  std::optional<int32_t> min_workers;  // also used by `scale`
  std::optional<int32_t> max_workers;  // also used by `scale`
  std::optional<int64_t> steps;
  std::optional<int32_t> checkpoint_interval;
  std::optional<int32_t> keep_last;
};

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
