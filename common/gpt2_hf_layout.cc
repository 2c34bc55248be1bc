#include "common/gpt2_hf_layout.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/safe_text.h"
#include "common/status_macros.h"

namespace cohort {
namespace {

constexpr absl::string_view kPrefix = "transformer.";
constexpr absl::string_view kLmHead = "lm_head.weight";

// The model size an HF dimension is a multiple of.
enum class Field { kVocab, kContext, kWidth };

struct Dim {
  int multiple;
  Field field;
};

// One Cohort tensor and the HF tensor (one per layer when per_layer) it maps
// to. `dims` are the HF tensor's (without the layer).
struct Mapping {
  const char* cohort;
  const char* hf;  // after "transformer." or "transformer.h.N."
  bool per_layer;
  bool transposed;  // HF holds the (in, out) transpose of Cohort's (out, in)
  int rank;
  Dim dims[2];
};

constexpr Field kV = Field::kVocab, kT = Field::kContext, kC = Field::kWidth;

// ParameterTable order (worker/model/parameter_table.h).
constexpr Mapping kMappings[] = {
    {"wte", "wte.weight", false, false, 2, {{1, kV}, {1, kC}}},
    {"wpe", "wpe.weight", false, false, 2, {{1, kT}, {1, kC}}},
    {"ln1w", "ln_1.weight", true, false, 1, {{1, kC}}},
    {"ln1b", "ln_1.bias", true, false, 1, {{1, kC}}},
    {"qkvw", "attn.c_attn.weight", true, true, 2, {{1, kC}, {3, kC}}},
    {"qkvb", "attn.c_attn.bias", true, false, 1, {{3, kC}}},
    {"attprojw", "attn.c_proj.weight", true, true, 2, {{1, kC}, {1, kC}}},
    {"attprojb", "attn.c_proj.bias", true, false, 1, {{1, kC}}},
    {"ln2w", "ln_2.weight", true, false, 1, {{1, kC}}},
    {"ln2b", "ln_2.bias", true, false, 1, {{1, kC}}},
    {"fcw", "mlp.c_fc.weight", true, true, 2, {{1, kC}, {4, kC}}},
    {"fcb", "mlp.c_fc.bias", true, false, 1, {{4, kC}}},
    {"fcprojw", "mlp.c_proj.weight", true, true, 2, {{4, kC}, {1, kC}}},
    {"fcprojb", "mlp.c_proj.bias", true, false, 1, {{1, kC}}},
    {"lnfw", "ln_f.weight", false, false, 1, {{1, kC}}},
    {"lnfb", "ln_f.bias", false, false, 1, {{1, kC}}},
};

// Per-layer buffers HF files carry and Cohort computes: the causal masks.
constexpr absl::string_view kIgnoredLayerBuffers[] = {"attn.bias", "attn.masked_bias"};

const Mapping* FindMapping(absl::string_view cohort_name) {
  for (const Mapping& m : kMappings) {
    if (cohort_name == m.cohort) return &m;
  }
  return nullptr;
}

absl::Status UnknownTensor(absl::string_view cohort_name) {
  return absl::InvalidArgumentError(
      absl::StrCat(Quoted(cohort_name), " is not a tensor of Cohort's GPT (expected one of ",
                   absl::StrJoin(CohortTensorNames(), ", "), ")"));
}

int64_t FieldValue(const GptShape& model, Field field) {
  switch (field) {
    case Field::kVocab:
      return model.vocab_size;
    case Field::kContext:
      return model.context_length;
    case Field::kWidth:
      return model.width;
  }
  return 0;
}

const char* FieldName(Field field) {
  switch (field) {
    case Field::kVocab:
      return "model.vocab_size";
    case Field::kContext:
      return "model.context_length";
    case Field::kWidth:
      return "model.width";
  }
  return "?";
}

// The HF tensor's shape for `model` (vocab: the unpadded V).
std::vector<int64_t> HfShape(const Mapping& m, const GptShape& model) {
  std::vector<int64_t> shape;
  for (int d = 0; d < m.rank; ++d) {
    shape.push_back(m.dims[d].multiple * FieldValue(model, m.dims[d].field));
  }
  return shape;
}

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string HfName(const Mapping& m, int layer) {
  return m.per_layer ? absl::StrCat(kPrefix, "h.", layer, ".", m.hf) : absl::StrCat(kPrefix, m.hf);
}

// dst (cols, rows) = the transpose of src (rows, cols), in tiles so that both
// sides stay in cache.
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const int64_t i1 = std::min(rows, i0 + kTile);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t j1 = std::min(cols, j0 + kTile);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) dst[j * rows + i] = src[i * cols + j];
      }
    }
  }
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// "model.width 768 but transformer.wte.weight has 1024 columns" for the
// first dimension of `got` that disagrees with `m`'s; OK when none does. The
// vocab dimension may be smaller than the model's.
absl::Status CheckHfShape(const std::string& file, const std::string& name, const Mapping& m,
                          const GptShape& model, const std::vector<int64_t>& got) {
  const std::vector<int64_t> expected = HfShape(m, model);
  if (got.size() != expected.size()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", name, " has shape ", ShapeText(got),
                                                   "; the model's is ", ShapeText(expected)));
  }
  for (int d = 0; d < m.rank; ++d) {
    const Dim dim = m.dims[d];
    const bool fits = dim.field == Field::kVocab ? got[d] <= expected[d] : got[d] == expected[d];
    if (fits) continue;
    const int64_t value = FieldValue(model, dim.field);
    const char* noun = m.rank == 1 ? "elements" : d == 0 ? "rows" : "columns";
    std::string message = absl::StrCat(file, ": ", FieldName(dim.field), " ", value, " but ", name,
                                       " has ", got[d], " ", noun);
    if (dim.multiple != 1) {
      absl::StrAppend(&message, " (expected ", dim.multiple, " x ", value, " = ", expected[d], ")");
    }
    if (dim.field == Field::kVocab) {
      absl::StrAppend(&message, ": the file's vocabulary is larger than the job's");
    }
    return absl::InvalidArgumentError(message);
  }
  return absl::OkStatus();
}

// Splits an HF name (without the prefix) into its layer (-1 for none) and
// the rest; false when "h." is not followed by "<digits>.".
bool SplitLayer(absl::string_view bare, int64_t* layer, absl::string_view* rest) {
  *layer = -1;
  *rest = bare;
  if (!absl::StartsWith(bare, "h.")) return true;
  const size_t dot = bare.find('.', 2);
  if (dot == absl::string_view::npos) return false;
  const absl::string_view digits = bare.substr(2, dot - 2);
  if (digits.empty() || digits.size() > 9 || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  *layer = std::stoll(std::string(digits));
  *rest = bare.substr(dot + 1);
  return true;
}

}  // namespace

std::string FormatModelFingerprint(const GptShape& shape) {
  return absl::StrCat("layers=", shape.layers, " heads=", shape.heads, " width=", shape.width,
                      " vocab=", shape.vocab_size, " padded_vocab=", shape.padded_vocab,
                      " context=", shape.context_length);
}

absl::StatusOr<GptShape> ParseModelFingerprint(absl::string_view fingerprint) {
  GptShape shape;
  const std::pair<absl::string_view, int*> keys[] = {
      {"layers", &shape.layers},
      {"heads", &shape.heads},
      {"width", &shape.width},
      {"vocab", &shape.vocab_size},
      {"padded_vocab", &shape.padded_vocab},
      {"context", &shape.context_length},
  };
  const auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("model fingerprint ", Quoted(fingerprint, 200), ": ", what));
  };
  bool seen[std::size(keys)] = {};
  // Single spaces between fields, as written: an empty field is an error
  // (an empty text has no fields, and says which is missing).
  const std::vector<absl::string_view> words =
      fingerprint.empty() ? std::vector<absl::string_view>{}
                          : std::vector<absl::string_view>(absl::StrSplit(fingerprint, ' '));
  for (absl::string_view word : words) {
    const size_t eq = word.find('=');
    const absl::string_view key = word.substr(0, eq);
    size_t k = 0;
    while (k < std::size(keys) && keys[k].first != key) ++k;
    if (eq == absl::string_view::npos || k == std::size(keys)) {
      return error(absl::StrCat("unknown field ", Quoted(word, 40)));
    }
    if (seen[k]) return error(absl::StrCat(key, " appears twice"));
    seen[k] = true;
    int value = 0;
    if (!absl::SimpleAtoi(word.substr(eq + 1), &value) || value <= 0) {
      return error(absl::StrCat(key, " must be a positive integer, not ",
                                Quoted(word.substr(eq + 1), 40)));
    }
    *keys[k].second = value;
  }
  for (size_t k = 0; k < std::size(keys); ++k) {
    if (!seen[k]) return error(absl::StrCat(keys[k].first, " is missing"));
  }
  if (shape.width % shape.heads != 0) return error("heads must divide width");
  if (shape.padded_vocab < shape.vocab_size) return error("padded_vocab is below vocab");
  return shape;
}

const std::vector<std::string>& CohortTensorNames() {
  static const std::vector<std::string>* const names = [] {
    auto* out = new std::vector<std::string>;
    for (const Mapping& m : kMappings) out->push_back(m.cohort);
    return out;
  }();
  return *names;
}

absl::StatusOr<std::vector<int64_t>> CohortGlobalShape(const GptShape& model,
                                                       absl::string_view name) {
  const Mapping* m = FindMapping(name);
  if (m == nullptr) return UnknownTensor(name);
  std::vector<int64_t> layer = HfShape(*m, model);
  if (m->transposed) std::swap(layer[0], layer[1]);
  if (name == "wte") layer[0] = model.padded_vocab;
  // ParameterTable's logical shapes split q, k and v: (3C, ...) is (3, C, ...).
  if (name == "qkvw" || name == "qkvb") {
    layer[0] = model.width;
    layer.insert(layer.begin(), 3);
  }
  if (m->per_layer) layer.insert(layer.begin(), model.layers);
  return layer;
}

absl::StatusOr<std::vector<HfTensorSpec>> HfTensorsOf(const GptShape& model,
                                                      absl::string_view cohort_name) {
  const Mapping* m = FindMapping(cohort_name);
  if (m == nullptr) return UnknownTensor(cohort_name);
  std::vector<HfTensorSpec> out;
  const int copies = m->per_layer ? model.layers : 1;
  for (int l = 0; l < copies; ++l) out.push_back(HfTensorSpec{HfName(*m, l), HfShape(*m, model)});
  return out;
}

absl::Status CohortToHf(const GptShape& model, absl::string_view cohort_name,
                        const std::vector<int64_t>& shape, const float* values,
                        const HfTensorSink& emit) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> expected, CohortGlobalShape(model, cohort_name));
  if (shape != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", cohort_name, " has shape ", ShapeText(shape), "; the model (",
                     FormatModelFingerprint(model), ") gives it ", ShapeText(expected)));
  }
  const Mapping& m = *FindMapping(cohort_name);
  ASSIGN_OR_RETURN(const std::vector<HfTensorSpec> specs, HfTensorsOf(model, cohort_name));
  const int64_t layer_numel = Product(specs[0].shape);
  std::vector<float> transposed(m.transposed ? static_cast<size_t>(layer_numel) : 0);
  for (size_t l = 0; l < specs.size(); ++l) {
    // wte's first V rows are the HF embedding: the padding rows follow them.
    const float* slice = values + static_cast<int64_t>(l) * layer_numel;
    if (m.transposed) {
      // Cohort's (out, in) is HF's shape reversed.
      Transpose(slice, specs[l].shape[1], specs[l].shape[0], transposed.data());
      slice = transposed.data();
    }
    RETURN_IF_ERROR(emit(specs[l], slice));
  }
  return absl::OkStatus();
}

absl::StatusOr<HfGpt2Importer> HfGpt2Importer::Create(const SafetensorsReader* file,
                                                      const GptShape& model) {
  HfGpt2Importer importer(file, model);
  const std::string& path = file->path();
  const auto invalid = [&](const SafetensorsEntry& t, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", Quoted(t.name, 200), " ", what));
  };
  int64_t file_layers = 0;  // 1 + the highest layer index seen
  for (const SafetensorsEntry& t : file->tensors()) {
    absl::string_view bare = t.name;
    const bool prefixed = absl::ConsumePrefix(&bare, kPrefix);
    if (!prefixed && bare == kLmHead) {
      importer.lm_head_ = &t;
      continue;
    }
    int64_t layer = -1;
    absl::string_view rest;
    const Mapping* mapping = nullptr;
    if (SplitLayer(bare, &layer, &rest)) {
      if (layer >= 0 && std::find(std::begin(kIgnoredLayerBuffers), std::end(kIgnoredLayerBuffers),
                                  rest) != std::end(kIgnoredLayerBuffers)) {
        continue;
      }
      for (const Mapping& m : kMappings) {
        if (m.per_layer == (layer >= 0) && rest == m.hf) mapping = &m;
      }
    }
    if (mapping == nullptr) return invalid(t, "is not a tensor of Hugging Face's GPT-2 layout");
    if (layer >= model.layers) {
      return invalid(t, absl::StrCat("belongs to layer ", layer, " but model.layers is ",
                                     model.layers, ": the file holds more layers than the job"));
    }
    file_layers = std::max(file_layers, layer + 1);
    std::string canonical = absl::StrCat(kPrefix, bare);
    if (importer.entries_.contains(canonical)) {
      return invalid(t, "appears both with and without the \"transformer.\" prefix");
    }
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16" && t.dtype != "F64") {
      return invalid(t, absl::StrCat("is ", t.dtype, "; weights must be F32, F16, BF16 or F64"));
    }
    RETURN_IF_ERROR(CheckHfShape(path, canonical, *mapping, model, t.shape));
    if (mapping->dims[0].field == Field::kVocab) importer.file_vocab_ = t.shape[0];
    importer.entries_.emplace(std::move(canonical), &t);
  }
  for (const Mapping& m : kMappings) {
    for (int l = 0; l < (m.per_layer ? model.layers : 1); ++l) {
      const std::string name = HfName(m, l);
      if (importer.entries_.contains(name)) continue;
      std::string message = absl::StrCat(path, " lacks ", name);
      if (m.per_layer && file_layers < model.layers) {
        absl::StrAppend(&message, ": model.layers is ", model.layers, " but the file holds ",
                        file_layers, " layer", file_layers == 1 ? "" : "s");
      }
      return absl::InvalidArgumentError(message);
    }
  }
  if (importer.lm_head_ != nullptr) {
    const SafetensorsEntry& wte = importer.Entry(HfName(kMappings[0], 0));
    if (importer.lm_head_->shape != wte.shape) {
      return invalid(*importer.lm_head_,
                     absl::StrCat("has shape ", ShapeText(importer.lm_head_->shape), " but ",
                                  wte.name, " has ", ShapeText(wte.shape),
                                  ": Cohort's LM head is tied to the token embedding"));
    }
  }
  return importer;
}

const SafetensorsEntry& HfGpt2Importer::Entry(const std::string& name) const {
  return *entries_.at(name);
}

absl::Status HfGpt2Importer::Assemble(absl::string_view cohort_name, float* out) const {
  const Mapping* m = FindMapping(cohort_name);
  if (m == nullptr) return UnknownTensor(cohort_name);
  if (cohort_name == "wte") {
    const SafetensorsEntry& wte = Entry(HfName(*m, 0));
    std::fill_n(out, static_cast<size_t>(model_.padded_vocab) * model_.width, 0.0f);
    RETURN_IF_ERROR(file_->ReadFloat32(wte, out));
    if (lm_head_ == nullptr) return absl::OkStatus();
    // Compared in blocks, so the check costs no second embedding in memory.
    std::vector<float> block(
        std::min<size_t>(size_t{1} << 18, static_cast<size_t>(wte.NumElements())));
    for (int64_t first = 0; first < wte.NumElements();) {
      const int64_t n =
          std::min<int64_t>(static_cast<int64_t>(block.size()), wte.NumElements() - first);
      RETURN_IF_ERROR(file_->ReadFloat32(*lm_head_, first, n, block.data()));
      if (std::memcmp(block.data(), out + first, static_cast<size_t>(n) * sizeof(float)) != 0) {
        int64_t i = 0;
        while (std::memcmp(&block[i], out + first + i, sizeof(float)) == 0) ++i;
        const int64_t at = first + i;
        return absl::InvalidArgumentError(absl::StrCat(
            file_->path(), ": lm_head.weight differs from ", wte.name, " at row ",
            at / model_.width, " column ", at % model_.width,
            ": an untied LM head is not supported (Cohort ties it to the token embedding)"));
      }
      first += n;
    }
    return absl::OkStatus();
  }
  const std::vector<int64_t> layer_shape = HfShape(*m, model_);
  const int64_t layer_numel = Product(layer_shape);
  std::vector<float> staging(m->transposed ? static_cast<size_t>(layer_numel) : 0);
  for (int l = 0; l < (m->per_layer ? model_.layers : 1); ++l) {
    const SafetensorsEntry& entry = Entry(HfName(*m, l));
    float* dst = out + static_cast<int64_t>(l) * layer_numel;
    if (!m->transposed) {
      RETURN_IF_ERROR(file_->ReadFloat32(entry, dst));
      continue;
    }
    RETURN_IF_ERROR(file_->ReadFloat32(entry, staging.data()));
    Transpose(staging.data(), layer_shape[0], layer_shape[1], dst);
  }
  return absl::OkStatus();
}

}  // namespace cohort
