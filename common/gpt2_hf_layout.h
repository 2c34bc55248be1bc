#pragma once
// The mapping between Cohort's unsharded GPT tensors (worker/model's
// ParameterTable: "wte", "qkvw", ... in their logical global shapes) and
// Hugging Face's GPT-2 layout (GPT2LMHeadModel's state dict), both ways:
//
//   Cohort          HF (per layer N for the per-layer tensors)
//   wte (Vp,C)      transformer.wte.weight (V,C): the padding rows dropped
//   wpe (maxT,C)    transformer.wpe.weight
//   ln1w, ln1b      transformer.h.N.ln_1.weight, .bias
//   qkvw (3,C,C)    transformer.h.N.attn.c_attn.weight (C,3C), transposed
//   qkvb (3,C)      transformer.h.N.attn.c_attn.bias (3C)
//   attprojw (C,C)  transformer.h.N.attn.c_proj.weight, transposed
//   attprojb        transformer.h.N.attn.c_proj.bias
//   ln2w, ln2b      transformer.h.N.ln_2.weight, .bias
//   fcw (4C,C)      transformer.h.N.mlp.c_fc.weight (C,4C), transposed
//   fcb (4C)        transformer.h.N.mlp.c_fc.bias
//   fcprojw (C,4C)  transformer.h.N.mlp.c_proj.weight (4C,C), transposed
//   fcprojb         transformer.h.N.mlp.c_proj.bias
//   lnfw, lnfb      transformer.ln_f.weight, .bias
//
// HF's Conv1D stores weights (in, out), the transpose of Cohort's (out, in).
// Both split c_attn's 3C outputs into q, k, v blocks of C with the heads
// contiguous in each, so qkv needs no reordering beyond the transpose. The LM
// head is tied to wte in both; HF's lm_head.weight is not written.
//
// Here because both cohortctl (export) and the worker (import) use it and
// cohortctl links no worker library; the shape struct stands in for
// worker/model's GptConfig. Pure functions and an immutable importer:
// thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors_reader.h"

namespace cohort {

// A GPT-2 model's shape: worker/model's GptConfig with the padded vocab
// resolved.
struct GptShape {
  int layers = 0;
  int heads = 0;
  int width = 0;
  int vocab_size = 0;    // V, real tokens
  int padded_vocab = 0;  // Vp >= V, rows of Cohort's wte
  int context_length = 0;

  friend bool operator==(const GptShape&, const GptShape&) = default;
};

// The model string a checkpoint records (manifest objects()["model"], the
// Cohort export's "model" metadata): worker/checkpoint's ModelFingerprint,
// "layers=4 heads=4 width=128 vocab=512 padded_vocab=512 context=64".
std::string FormatModelFingerprint(const GptShape& shape);
// Its inverse: each key once, in any order, single spaces. InvalidArgument
// naming the key (or field) that is missing, repeated, unknown or not a
// positive integer, or a shape that cannot be (heads not dividing width,
// padded_vocab below vocab).
absl::StatusOr<GptShape> ParseModelFingerprint(absl::string_view fingerprint);

// Cohort's parameter tensors, in ParameterTable order.
const std::vector<std::string>& CohortTensorNames();
// The logical global shape of Cohort tensor `name` (ParameterTable's
// global_shape). InvalidArgument for a name that is not one.
absl::StatusOr<std::vector<int64_t>> CohortGlobalShape(const GptShape& model,
                                                       absl::string_view name);

struct HfTensorSpec {
  std::string name;  // with the "transformer." prefix
  std::vector<int64_t> shape;
};

// ---- Export ----

// The HF tensors Cohort tensor `cohort_name` becomes, in the order CohortToHf
// emits them (layer by layer for per-layer tensors). InvalidArgument for an
// unknown name.
absl::StatusOr<std::vector<HfTensorSpec>> HfTensorsOf(const GptShape& model,
                                                      absl::string_view cohort_name);

// Receives one HF tensor's values (row-major, its spec's shape); they are
// valid only during the call.
using HfTensorSink = std::function<absl::Status(const HfTensorSpec& tensor, const float* values)>;

// Converts the whole Cohort tensor `cohort_name` (`values` in the logical
// global `shape`) into its HF tensors, handing each to `emit` in HfTensorsOf's
// order. Needs at most one layer's slice besides `values`. InvalidArgument
// for an unknown name or a shape other than CohortGlobalShape's; emit's
// errors are returned as they are.
absl::Status CohortToHf(const GptShape& model, absl::string_view cohort_name,
                        const std::vector<int64_t>& shape, const float* values,
                        const HfTensorSink& emit);

// ---- Import ----

// Reads Cohort's tensors out of an HF GPT-2 safetensors file.
//
// Accepts each name with or without the "transformer." prefix (files on the
// Hub often lack it), ignores the causal-mask buffers attn.bias and
// attn.masked_bias, and accepts lm_head.weight only when it equals
// transformer.wte.weight (checked when wte is read): Cohort's LM head is
// tied. The file's vocabulary may be smaller than model.vocab_size (the
// missing rows, like the padding rows, are zero) but not larger.
class HfGpt2Importer {
 public:
  // Checks every tensor's name, dtype and shape against `model` before
  // anything is read. InvalidArgument naming the file and the tensor for a
  // missing tensor, an unexpected one (including a layer at or beyond
  // model.layers), a name given both with and without the prefix, a dtype
  // that does not read as float32, or a shape that disagrees with the model
  // (naming the job field: "model.width 768 but transformer.wte.weight has
  // 1024 columns"). `file` must outlive the importer.
  static absl::StatusOr<HfGpt2Importer> Create(const SafetensorsReader* file,
                                               const GptShape& model);

  // Fills `out` with Cohort's whole tensor `cohort_name` (CohortGlobalShape's
  // elements). Needs one layer's slice of extra memory for the transposed
  // tensors. InvalidArgument for an unknown name or an lm_head.weight that
  // differs from wte; the reader's errors.
  absl::Status Assemble(absl::string_view cohort_name, float* out) const;

  // Rows of the file's transformer.wte.weight (its vocabulary).
  int64_t file_vocab() const { return file_vocab_; }

 private:
  HfGpt2Importer(const SafetensorsReader* file, const GptShape& model)
      : file_(file), model_(model) {}

  // The file's entry for a canonical ("transformer."-prefixed) name.
  const SafetensorsEntry& Entry(const std::string& name) const;

  const SafetensorsReader* file_;
  GptShape model_;
  std::map<std::string, const SafetensorsEntry*> entries_;  // by canonical name
  const SafetensorsEntry* lm_head_ = nullptr;
  int64_t file_vocab_ = 0;
};

}  // namespace cohort
