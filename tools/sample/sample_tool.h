#pragma once
// cohort-sample's run: connect to the coordinator as cohortctl does
// (client::ApiClient: TLS, bearer token), read a committed checkpoint's
// manifest, load its weights into a whole model on the CPU
// (checkpoint_weights.h), generate (sampler.h) and print the prompt and its
// continuation. main.cc parses the flags into a SampleToolConfig
// (docs/conventions.md, Flags only in main.cc).
//
// Output: stdout gets exactly the prompt's bytes followed by the
// continuation's (and a newline when stdout is a terminal, so the shell's
// prompt does not run on); stderr gets what was loaded, progress every
// `progress_interval` once generation has run that long, and errors.
//
// Thread-compatible.

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "client/api_client.h"
#include "tools/cohortctl/command_line.h"
#include "tools/sample/sample_tokenizer.h"
#include "tools/sample/sampler.h"

namespace cohort::sample {

struct SampleToolConfig {
  std::string job;
  std::optional<int64_t> step;  // absent: the job's newest committed checkpoint
  std::string prompt;
  // tokens, temperature, top_k, seed; vocab_limit is set from the tokenizer.
  SampleOptions sample;
  TokenizerOptions tokenizer;
  // The coordinator, TLS and token; timeout bounds the manifest request (the
  // weights' download gets at least kMinDownloadTimeout).
  client::ApiClientOptions connection;
  bool stdout_is_terminal = false;
  absl::Duration progress_interval = absl::Seconds(2);
};

// The weights of a large model take a while to come over the network.
inline constexpr absl::Duration kMinDownloadTimeout = absl::Hours(1);

// Runs the whole tool; returns the exit code, cohortctl's
// (tools/cohortctl/command_line.h: `cohortctl sample` runs this tool):
// kExitUsage for arguments found wrong here (TLS or token files the client
// refuses, a malformed tokenizer file, a tokenizer larger than the model's
// vocabulary, --top_k above it), kExitUnreachable without a connection,
// kExitFailure for any other error (no such checkpoint, a checkpoint that
// is not a GPT's or is corrupt). Every error is one line on `err` starting
// "cohort-sample: ".
int RunSampleTool(const SampleToolConfig& config, std::ostream& out, std::ostream& err);

}  // namespace cohort::sample
