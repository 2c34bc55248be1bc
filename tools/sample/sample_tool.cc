#include "tools/sample/sample_tool.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/sample/checkpoint_weights.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::sample {
namespace {

using cohortctl::kExitFailure;
using cohortctl::kExitOk;
using cohortctl::kExitUnreachable;
using cohortctl::kExitUsage;

constexpr char kTool[] = "cohort-sample: ";

// Prints `status` and returns its exit code. `client` (may be null) tells an
// unreachable coordinator apart from its answers.
int Report(const absl::Status& status, const client::ApiClient* client, std::ostream& err) {
  const absl::Status classified = client == nullptr ? status : client->Classify(status);
  if (client::IsUnreachable(classified)) {
    err << kTool << classified.message() << "\n";
    return kExitUnreachable;
  }
  if (absl::IsInvalidArgument(classified)) {  // the arguments: their message says which
    err << kTool << classified.message() << "\n";
    return kExitUsage;
  }
  err << kTool << absl::StatusCodeToString(classified.code()) << ": " << classified.message()
      << "\n";
  return kExitFailure;
}

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(d)); }

}  // namespace

int RunSampleTool(const SampleToolConfig& config, std::ostream& out, std::ostream& err) {
  // The local checks first, so a typo costs no download.
  absl::StatusOr<std::unique_ptr<SampleTokenizer>> tokenizer =
      SampleTokenizer::Load(config.tokenizer);
  if (!tokenizer.ok()) return Report(tokenizer.status(), nullptr, err);
  absl::StatusOr<std::vector<int32_t>> prompt = (*tokenizer)->Encode(config.prompt);
  if (!prompt.ok()) return Report(prompt.status(), nullptr, err);
  if (prompt->empty()) {
    return Report(absl::InvalidArgumentError("--prompt encodes to no tokens; give some text"),
                  nullptr, err);
  }
  absl::StatusOr<std::unique_ptr<client::ApiClient>> api =
      client::ApiClient::Create(config.connection);
  if (!api.ok()) {  // unusable TLS files or token: the flags' fault, as in cohortctl
    err << kTool << api.status().message() << "\n";
    return kExitUsage;
  }
  client::ApiClient& client = **api;

  absl::StatusOr<v1::CheckpointManifest> manifest =
      client.checkpoints().GetManifest(config.job, config.step.value_or(-1), client.timeout());
  if (!manifest.ok()) return Report(manifest.status(), &client, err);
  absl::StatusOr<model::GptConfig> model_config = CheckpointModelConfig(*manifest);
  if (!model_config.ok()) return Report(model_config.status(), &client, err);
  // Before the download: the tokenizer and the options must fit the model.
  if ((*tokenizer)->vocab_size() > model_config->vocab_size) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
                      "--tokenizer ", (*tokenizer)->name(), " has ", (*tokenizer)->vocab_size(),
                      " tokens, more than the vocabulary of the checkpoint's model (",
                      model_config->vocab_size, "): it was trained with another tokenizer")),
                  nullptr, err);
  }
  SampleOptions options = config.sample;
  options.vocab_limit = (*tokenizer)->vocab_size();
  if (absl::Status valid = ValidateSampleOptions(options, model_config->vocab_size); !valid.ok()) {
    return Report(absl::InvalidArgumentError(absl::StrCat("--", valid.message())), nullptr, err);
  }

  compute::CpuBackend backend;
  const absl::Time load_start = absl::Now();
  absl::StatusOr<std::unique_ptr<model::GptModel>> loaded = LoadCheckpointModel(
      client.checkpoints(), *manifest, &backend, std::max(client.timeout(), kMinDownloadTimeout));
  if (!loaded.ok()) return Report(loaded.status(), &client, err);
  model::GptModel& model = **loaded;
  err << kTool << "job " << manifest->job_id() << " step " << manifest->step() << ": "
      << manifest->objects().at("model") << ", "
      << absl::StrFormat("%.1fM", static_cast<double>(model.num_params()) / 1e6)
      << " parameters, loaded in " << Seconds(absl::Now() - load_start) << "; generating "
      << options.tokens << " tokens on " << backend.num_threads() << " CPU threads\n";

  const absl::Time start = absl::Now();
  absl::Time last_line = start;
  bool progress_shown = false;
  absl::StatusOr<std::vector<int32_t>> generated = Generate(model, *prompt, options, [&](int done) {
    const absl::Time now = absl::Now();
    if (now - last_line < config.progress_interval || done == options.tokens) return;
    last_line = now;
    progress_shown = true;
    err << kTool << done << "/" << options.tokens << " tokens, "
        << absl::StrFormat("%.2f", done / absl::ToDoubleSeconds(now - start)) << " tokens/s\n";
    err.flush();
  });
  if (!generated.ok()) return Report(generated.status(), nullptr, err);
  absl::StatusOr<std::string> text = (*tokenizer)->Decode(*generated);
  if (!text.ok()) return Report(text.status(), nullptr, err);
  out << config.prompt << *text;
  if (config.stdout_is_terminal) out << "\n";
  out.flush();
  if (progress_shown) {
    const absl::Duration took = absl::Now() - start;
    err << kTool << options.tokens << " tokens in " << Seconds(took) << ", "
        << absl::StrFormat("%.2f", options.tokens / absl::ToDoubleSeconds(took)) << " tokens/s\n";
  }
  return kExitOk;
}

}  // namespace cohort::sample
