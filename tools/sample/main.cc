// cohort-sample: text from a committed checkpoint, generated on the CPU.
//
//   cohort-sample JOB [STEP] --prompt TEXT --tokens N [--temperature T]
//       [--top_k K] [--seed S] [--tokenizer byte|gpt2 --vocab encoder.json
//       --merges vocab.bpe] [--coordinator HOST:PORT] [--timeout SECONDS]
//       [--tls_ca FILE ...] [--token_file FILE]
//
// `cohortctl sample ...` runs this binary with the arguments after
// "sample", so the command line, connection flags and exit codes are
// cohortctl's. Parses flags into a SampleToolConfig and hands it to
// tools/sample/sample_tool.h; see --help.

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/tls_credentials.h"
#include "tools/cohortctl/command_line.h"
#include "tools/sample/sample_tool.h"

// Documented in Flags() below, which --help prints; only flags given on the
// command line are read, so the defaults here are placeholders.
ABSL_FLAG(std::string, prompt, "", "see cohort-sample --help");
ABSL_FLAG(int32_t, tokens, 0, "see cohort-sample --help");
ABSL_FLAG(double, temperature, 1.0, "see cohort-sample --help");
ABSL_FLAG(int32_t, top_k, 0, "see cohort-sample --help");
ABSL_FLAG(uint64_t, seed, 1, "see cohort-sample --help");
ABSL_FLAG(std::string, tokenizer, "byte", "see cohort-sample --help");
ABSL_FLAG(std::string, vocab, "", "see cohort-sample --help");
ABSL_FLAG(std::string, merges, "", "see cohort-sample --help");
ABSL_FLAG(std::string, coordinator, "", "see cohort-sample --help");
ABSL_FLAG(double, timeout, 10.0, "see cohort-sample --help");
ABSL_FLAG(std::string, tls_ca, "", "see cohort-sample --help");
ABSL_FLAG(std::string, tls_cert, "", "see cohort-sample --help");
ABSL_FLAG(std::string, tls_key, "", "see cohort-sample --help");
ABSL_FLAG(std::string, tls_server_name, "", "see cohort-sample --help");
ABSL_FLAG(std::string, token_file, "", "see cohort-sample --help");

namespace {

namespace ctl = cohort::cohortctl;
namespace sample = cohort::sample;

// cohort-sample's own flags; the connection flags are cohortctl's (Flags()).
constexpr ctl::FlagKind kValue = ctl::FlagKind::kValue;
constexpr std::array<ctl::FlagDoc, 9> kOwnFlags = {{
    {"prompt", kValue, "TEXT", "",
     "the text to continue (required; printed before the continuation)", nullptr},
    {"tokens", kValue, "N", "", "tokens to generate, 1 to 1000000 (required)", nullptr},
    {"temperature", kValue, "T", "",
     "0: greedy (the most likely token); else sample from softmax(logits / T), "
     "T at most 100 (default: 1)",
     nullptr},
    {"top_k", kValue, "K", "",
     "sample among the K most likely tokens; 0: all (default: 0). At most the "
     "tokenizer's vocabulary",
     nullptr},
    {"seed", kValue, "S", "",
     "seed of the sampling; a seed gives the same text every run (default: 1)", nullptr},
    {"tokenizer", kValue, "byte|gpt2", "",
     "byte: one token per byte (vocabulary 256); gpt2: GPT-2's BPE from --vocab "
     "and --merges (default: byte). Must be the one the job trained with",
     nullptr},
    {"vocab", kValue, "FILE", "", "gpt2: GPT-2's encoder.json", nullptr},
    {"merges", kValue, "FILE", "", "gpt2: GPT-2's vocab.bpe", nullptr},
    {"timeout", kValue, "SECONDS", "",
     "deadline of the manifest request; the weights' download gets at least an hour "
     "(default: 10)",
     nullptr},
}};

// Every flag cohort-sample accepts, in help order: its own, then the
// connection flags as cohortctl declares them.
const std::vector<ctl::FlagDoc>& Flags() {
  static const std::vector<ctl::FlagDoc>* const flags = [] {
    auto* all = new std::vector<ctl::FlagDoc>(kOwnFlags.begin(), kOwnFlags.end());
    for (const char* name :
         {"coordinator", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "token_file"}) {
      all->push_back(*ctl::FindFlagDoc(name));
    }
    return all;
  }();
  return *flags;
}

std::string UsageText() {
  std::string text =
      "cohort-sample: text from a committed checkpoint of a Cohort job, generated on\n"
      "the CPU (also run as `cohortctl sample`).\n\n"
      "Usage: cohort-sample JOB [STEP] --prompt TEXT --tokens N [flags]\n\n"
      "STEP is the checkpoint's step (default: the job's newest). stdout gets the\n"
      "prompt followed by the generated text (and a newline on a terminal); stderr\n"
      "the model loaded and, every 2 s, progress. Each token runs the model over the\n"
      "last context_length tokens (OMP_NUM_THREADS threads).\n\nFlags:\n";
  for (const ctl::FlagDoc& flag : Flags()) {
    absl::StrAppend(&text, "  --", flag.name, "=", flag.value_name, "\n      ", flag.help, "\n");
  }
  absl::StrAppend(&text, "  --help\n      print this text (also: -h)\n\n",
                  "Exit status: 0 success; 1 the checkpoint cannot be read or the run failed;\n"
                  "2 the coordinator cannot be reached; 64 usage error.\n");
  return text;
}

int UsageError(const std::string& message) {
  std::cerr << "cohort-sample: " << message << " (see cohort-sample --help)\n";
  return ctl::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  // The flags are scanned as cohortctl's are (ScanCommandLine) rather than by
  // absl::ParseCommandLine, so that a bad flag exits with the usage status
  // (64): flags anywhere among the operands, --name=value or --name value,
  // "--" ends them.
  absl::StatusOr<ctl::ScannedCommandLine> scanned =
      ctl::ScanCommandLine(std::vector<std::string>(argv + 1, argv + argc), Flags());
  if (!scanned.ok()) return UsageError(std::string(scanned.status().message()));
  if (scanned->help) {
    std::cout << UsageText();
    return ctl::kExitOk;
  }
  const std::vector<std::string>& positional = scanned->positional;
  absl::flat_hash_set<std::string> given;
  for (const auto& [name, value] : scanned->flags) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return UsageError(absl::StrCat("--", name, ": ", error));
    }
    given.insert(name);
  }
  auto set = [&given](const char* name) { return given.contains(name); };

  sample::SampleToolConfig config;
  if (positional.empty() || positional.size() > 2) {
    return UsageError(absl::StrCat("expected JOB [STEP], got ", positional.size(), " operands"));
  }
  config.job = positional[0];
  if (config.job.empty()) return UsageError("JOB is empty");
  if (positional.size() == 2) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(positional[1], &step) || step < 0) {
      return UsageError(
          absl::StrCat("STEP must be a step number (>= 0), not \"", positional[1], "\""));
    }
    config.step = step;
  }
  if (!set("prompt") || absl::GetFlag(FLAGS_prompt).empty()) {
    return UsageError("--prompt is required: the text to continue");
  }
  config.prompt = absl::GetFlag(FLAGS_prompt);
  if (!set("tokens")) return UsageError("--tokens is required: how many tokens to generate");
  config.sample.tokens = absl::GetFlag(FLAGS_tokens);
  if (config.sample.tokens < 1 || config.sample.tokens > sample::kMaxSampleTokens) {
    return UsageError(absl::StrCat("--tokens must be in [1, ", sample::kMaxSampleTokens, "], not ",
                                   config.sample.tokens));
  }
  config.sample.temperature = absl::GetFlag(FLAGS_temperature);
  if (!(config.sample.temperature >= 0 && config.sample.temperature <= sample::kMaxTemperature)) {
    return UsageError(absl::StrCat("--temperature must be 0 (greedy) or in (0, ",
                                   sample::kMaxTemperature, "], not ", config.sample.temperature));
  }
  config.sample.top_k = absl::GetFlag(FLAGS_top_k);
  if (config.sample.top_k < 0) {
    return UsageError(
        absl::StrCat("--top_k must be >= 0 (0: all tokens), not ", config.sample.top_k));
  }
  config.sample.seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<sample::TokenizerKind> kind =
      sample::ParseTokenizerKind(absl::GetFlag(FLAGS_tokenizer));
  if (!kind.ok()) return UsageError(std::string(kind.status().message()));
  config.tokenizer.kind = *kind;
  config.tokenizer.encoder_json = absl::GetFlag(FLAGS_vocab);
  config.tokenizer.merges = absl::GetFlag(FLAGS_merges);
  if (*kind == sample::TokenizerKind::kGpt2 &&
      (config.tokenizer.encoder_json.empty() || config.tokenizer.merges.empty())) {
    return UsageError("--tokenizer gpt2 needs --vocab (encoder.json) and --merges (vocab.bpe)");
  }
  if (*kind == sample::TokenizerKind::kByte && (set("vocab") || set("merges"))) {
    return UsageError("--vocab and --merges are GPT-2's files; they need --tokenizer gpt2");
  }

  // The connection, exactly as cohortctl's (tools/cohortctl/main.cc).
  absl::StatusOr<std::string> coordinator = ctl::ResolveCoordinatorAddress(
      set("coordinator") ? std::optional(absl::GetFlag(FLAGS_coordinator)) : std::nullopt,
      std::getenv("COHORT_COORDINATOR"));
  if (!coordinator.ok()) return UsageError(std::string(coordinator.status().message()));
  config.connection.address = *coordinator;
  absl::StatusOr<absl::Duration> timeout = ctl::ParseTimeout(absl::GetFlag(FLAGS_timeout));
  if (!timeout.ok()) return UsageError(std::string(timeout.status().message()));
  config.connection.timeout = *timeout;
  auto flag_or_env = [&set](const char* name, const absl::Flag<std::string>& flag,
                            const char* env) -> std::string {
    if (set(name)) return absl::GetFlag(flag);
    const char* value = std::getenv(env);
    return value == nullptr ? "" : value;
  };
  config.connection.tls.ca = flag_or_env("tls_ca", FLAGS_tls_ca, "COHORT_TLS_CA");
  config.connection.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  config.connection.tls.key = absl::GetFlag(FLAGS_tls_key);
  config.connection.tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  absl::StatusOr<std::string> token = ctl::ResolveBearerToken(
      set("token_file") ? std::optional(absl::GetFlag(FLAGS_token_file)) : std::nullopt,
      std::getenv("COHORT_TOKEN_FILE"), std::getenv("COHORT_TOKEN"));
  if (!token.ok()) return UsageError(std::string(token.status().message()));
  config.connection.token = *token;
  config.stdout_is_terminal = isatty(STDOUT_FILENO) == 1;
  return sample::RunSampleTool(config, std::cout, std::cerr);
}
