#include "worker/model/initial_weights.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/safe_text.h"
#include "common/safetensors_reader.h"
#include "common/status_macros.h"

namespace cohort::model {
namespace {

constexpr char kCohortFormat[] = "cohort-gpt";

// Fills a whole Cohort tensor (its logical global shape) by name.
using Assembler = std::function<absl::Status(absl::string_view name, float* out)>;

bool ReadsAsFloat32(const SafetensorsEntry& t) {
  return t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16" || t.dtype == "F64";
}

// A Cohort export's "model" metadata against the job's model: OK when equal
// (or absent), else the first field that differs.
absl::Status CheckCohortModel(const SafetensorsReader& file, const GptShape& model) {
  const auto it = file.metadata().find("model");
  if (it == file.metadata().end() || it->second.empty()) return absl::OkStatus();
  const std::string job = FormatModelFingerprint(model);
  if (it->second == job) return absl::OkStatus();
  absl::StatusOr<GptShape> theirs = ParseModelFingerprint(it->second);
  if (!theirs.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": its model metadata ",
                                                   Quoted(it->second, 200), " is not the job's (",
                                                   job, "): ", theirs.status().message()));
  }
  const struct {
    const char* field;
    int file, job;
  } fields[] = {
      {"model.layers", theirs->layers, model.layers},
      {"model.heads", theirs->heads, model.heads},
      {"model.width", theirs->width, model.width},
      {"model.vocab_size", theirs->vocab_size, model.vocab_size},
      {"the padded vocabulary", theirs->padded_vocab, model.padded_vocab},
      {"model.context_length", theirs->context_length, model.context_length},
  };
  for (const auto& f : fields) {
    if (f.file == f.job) continue;
    return absl::InvalidArgumentError(absl::StrCat(file.path(), " holds another model: ", f.field,
                                                   " is ", f.job, " in the job but ", f.file,
                                                   " in the file (", it->second, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(file.path(), ": its model metadata ",
                                                 Quoted(it->second, 200), " is not the job's (",
                                                 job, ")"));
}

// Cohort's layout: every ParameterTable tensor by its name, in its logical
// global shape, and nothing else.
absl::StatusOr<Assembler> CohortLayout(const SafetensorsReader& file, const GptShape& model) {
  RETURN_IF_ERROR(CheckCohortModel(file, model));
  const std::vector<std::string>& names = CohortTensorNames();
  for (const SafetensorsEntry& t : file.tensors()) {
    if (std::find(names.begin(), names.end(), t.name) == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": ", Quoted(t.name, 200), " is not a tensor of Cohort's layout (expected ",
          absl::StrJoin(names, ", "), ")"));
    }
    if (!ReadsAsFloat32(t)) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", t.name, " is ", t.dtype,
                                                     "; weights must be F32, F16, BF16 or F64"));
    }
    ASSIGN_OR_RETURN(const std::vector<int64_t> expected, CohortGlobalShape(model, t.name));
    if (t.shape != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": ", t.name, " has shape [", absl::StrJoin(t.shape, ", "),
                       "] but the job's model (", FormatModelFingerprint(model), ") gives it [",
                       absl::StrJoin(expected, ", "), "]"));
    }
  }
  for (const std::string& name : names) {
    if (file.Find(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), " lacks tensor ", name));
    }
  }
  return Assembler([&file, model](absl::string_view name, float* out) -> absl::Status {
    RETURN_IF_ERROR(file.ReadFloat32(*file.Find(name), out));
    if (name == "wte") {
      // The padding rows take no part in the model; keep them zero whatever
      // the file says.
      const size_t real = static_cast<size_t>(model.vocab_size) * model.width;
      const size_t all = static_cast<size_t>(model.padded_vocab) * model.width;
      std::fill(out + real, out + all, 0.0f);
    }
    return absl::OkStatus();
  });
}

}  // namespace

GptShape GptShapeOf(const GptConfig& config) {
  return GptShape{.layers = config.layers,
                  .heads = config.heads,
                  .width = config.width,
                  .vocab_size = config.vocab_size,
                  .padded_vocab = config.PaddedVocab(),
                  .context_length = config.context_length};
}

GptConfig GptConfigOf(const GptShape& shape) {
  return GptConfig{.layers = shape.layers,
                   .heads = shape.heads,
                   .width = shape.width,
                   .vocab_size = shape.vocab_size,
                   .context_length = shape.context_length,
                   .padded_vocab = shape.padded_vocab};
}

absl::Status LoadInitialWeights(const std::string& path, const GptConfig& config,
                                const ParameterTable& table, float* params) {
  RETURN_IF_ERROR(config.Validate());
  const GptShape model = GptShapeOf(config);
  ASSIGN_OR_RETURN(const std::unique_ptr<SafetensorsReader> file, SafetensorsReader::Open(path));

  const auto format = file->metadata().find("format");
  const bool cohort = (format != file->metadata().end() && format->second == kCohortFormat) ||
                      file->Find("wte") != nullptr;
  const bool hf =
      file->Find("transformer.wte.weight") != nullptr || file->Find("wte.weight") != nullptr;
  Assembler assemble;
  std::unique_ptr<HfGpt2Importer> importer;
  if (cohort) {
    ASSIGN_OR_RETURN(assemble, CohortLayout(*file, model));
  } else if (hf) {
    ASSIGN_OR_RETURN(HfGpt2Importer created, HfGpt2Importer::Create(file.get(), model));
    importer = std::make_unique<HfGpt2Importer>(std::move(created));
    assemble = [&importer](absl::string_view name, float* out) {
      return importer->Assemble(name, out);
    };
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        " holds neither Cohort's layout (no tensor wte, no format cohort-gpt) nor Hugging "
        "Face's GPT-2 layout (no transformer.wte.weight or wte.weight)"));
  }

  std::vector<float> whole;
  for (const ParameterInfo& info : table.tensors()) {
    if (!info.present()) continue;
    ASSIGN_OR_RETURN(const std::vector<int64_t> shape, CohortGlobalShape(model, info.name));
    if (shape != info.global_shape) {
      return absl::InternalError(absl::StrCat(
          "common/gpt2_hf_layout gives ", info.name, " the shape [", absl::StrJoin(shape, ", "),
          "] but the ParameterTable [", absl::StrJoin(info.global_shape, ", "), "]"));
    }
    size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<size_t>(d);
    // Reused across tensors: its capacity grows to the largest one only.
    whole.resize(numel);
    RETURN_IF_ERROR(assemble(info.name, whole.data()));
    ExtractShard(info, whole.data(), params + info.offset);
  }
  return absl::OkStatus();
}

}  // namespace cohort::model
