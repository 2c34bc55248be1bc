#include "tools/cohortctl/checkpoint_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/box.h"
#include "common/box_proto.h"
#include "common/gpt2_hf_layout.h"
#include "common/status_macros.h"
#include "tools/cohortctl/safetensors.h"

namespace cohort::cohortctl {
namespace {

constexpr char kWeightsPrefix[] = "param/";

absl::Status FileError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Writes all of `data` at `offset`.
absl::Status WriteAt(int fd, const char* data, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t w = pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return FileError("cannot write", path);
    }
    data += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// Downloads every chunk of `tensor` into `values` (its whole, row-major).
absl::Status DownloadWhole(client::CheckpointClient& client, const v1::CheckpointManifest& manifest,
                           const v1::TensorInfo& tensor, const Box& whole, absl::Duration timeout,
                           std::vector<float>* values) {
  values->assign(static_cast<size_t>(whole.NumElements()), 0.0f);
  std::vector<v1::ChunkRef> refs;
  for (const v1::ChunkInfo& c : tensor.chunks()) {
    v1::ChunkRef ref;
    ref.set_tensor(tensor.name());
    ref.set_index(c.index());
    refs.push_back(std::move(ref));
  }
  int64_t filled = 0;
  RETURN_IF_ERROR(client.Download(
      manifest.job_id(), manifest.step(), refs,
      [&](const std::string&, const v1::ChunkInfo& info, std::string_view bytes) {
        const Box box = BoxFromProto(info.box());
        if (!BoxWithin(box, whole.extent) ||
            static_cast<uint64_t>(box.NumElements()) * 4 != bytes.size()) {
          return absl::DataLossError(absl::StrCat("tensor ", tensor.name(), " chunk ", info.index(),
                                                  " does not fit its shape"));
        }
        CopyRegion(box, ConstBoxedBuffer{&box, 0, bytes.data()},
                   BoxedBuffer{&whole, 0, values->data()}, sizeof(float));
        filled += box.NumElements();
        return absl::OkStatus();
      },
      timeout));
  if (filled != whole.NumElements()) {
    return absl::DataLossError(absl::StrCat("tensor ", tensor.name(), ": chunks cover ", filled,
                                            " of ", whole.NumElements(), " elements"));
  }
  return absl::OkStatus();
}

// The checkpoint's model shape, which the HF layout needs (its vocab, layers).
absl::StatusOr<GptShape> ManifestModel(const v1::CheckpointManifest& manifest) {
  const auto it = manifest.objects().find("model");
  if (it == manifest.objects().end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint of job ", manifest.job_id(), " step ", manifest.step(),
                     " records no model shape (object \"model\"); --format=hf-gpt2 needs it"));
  }
  absl::StatusOr<GptShape> model = ParseModelFingerprint(it->second);
  if (!model.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint of job ", manifest.job_id(),
                                                      " step ", manifest.step(), ": ",
                                                      model.status().message()));
  }
  return model;
}

// What the file holds: the tensors it lists, and for each Cohort tensor
// (manifest order) the first of its file tensors.
struct ExportPlan {
  std::vector<SafetensorsTensor> file_tensors;
  std::vector<size_t> first_file_tensor;
  std::map<std::string, std::string> metadata;
  std::optional<GptShape> model;  // hf-gpt2 only
};

absl::StatusOr<ExportPlan> PlanExport(const v1::CheckpointManifest& manifest,
                                      const std::vector<const v1::TensorInfo*>& weights,
                                      ExportFormat format) {
  ExportPlan plan;
  plan.metadata = {
      {"job", manifest.job_id()},
      {"step", absl::StrCat(manifest.step())},
      {"generation", absl::StrCat(manifest.generation())},
      {"model", manifest.objects().contains("model") ? manifest.objects().at("model") : ""},
  };
  if (format == ExportFormat::kSafetensors) {
    plan.metadata["format"] = "cohort-gpt";
    plan.metadata["layout"] = "tensor names and shapes: docs/checkpoint-format.md";
    for (const v1::TensorInfo* t : weights) {
      plan.first_file_tensor.push_back(plan.file_tensors.size());
      plan.file_tensors.push_back(SafetensorsTensor{
          t->name().substr(sizeof(kWeightsPrefix) - 1),
          std::vector<int64_t>(t->global_shape().begin(), t->global_shape().end())});
    }
    return plan;
  }
  ASSIGN_OR_RETURN(const GptShape model, ManifestModel(manifest));
  plan.model = model;
  // HF's loaders read "format"; the rest is provenance.
  plan.metadata["format"] = "pt";
  plan.metadata["layout"] =
      "Hugging Face GPT-2 (GPT2LMHeadModel; lm_head.weight tied to transformer.wte.weight, not "
      "stored): docs/checkpoint-format.md";
  std::set<std::string> present;
  for (const v1::TensorInfo* t : weights) {
    const std::string name = t->name().substr(sizeof(kWeightsPrefix) - 1);
    present.insert(name);
    absl::StatusOr<std::vector<HfTensorSpec>> specs = HfTensorsOf(model, name);
    if (!specs.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor ", t->name(), " has no place in the hf-gpt2 layout: ", specs.status().message()));
    }
    ASSIGN_OR_RETURN(const std::vector<int64_t> expected, CohortGlobalShape(model, name));
    if (!std::equal(expected.begin(), expected.end(), t->global_shape().begin(),
                    t->global_shape().end())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t->name(), " has shape [", absl::StrJoin(t->global_shape(), ", "),
                       "] but the checkpoint's model (", FormatModelFingerprint(model),
                       ") gives it [", absl::StrJoin(expected, ", "), "]"));
    }
    plan.first_file_tensor.push_back(plan.file_tensors.size());
    for (HfTensorSpec& spec : *specs) {
      plan.file_tensors.push_back(SafetensorsTensor{std::move(spec.name), std::move(spec.shape)});
    }
  }
  for (const std::string& name : CohortTensorNames()) {
    if (!present.contains(name)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint of job ", manifest.job_id(), " step ", manifest.step(),
                       " lacks ", kWeightsPrefix, name, ", which the hf-gpt2 layout needs"));
    }
  }
  return plan;
}

}  // namespace

const char* ExportFormatName(ExportFormat format) {
  switch (format) {
    case ExportFormat::kSafetensors:
      return "safetensors";
    case ExportFormat::kHfGpt2:
      return "hf-gpt2";
  }
  return "unknown";
}

absl::StatusOr<ExportFormat> ParseExportFormat(absl::string_view name) {
  for (ExportFormat f : {ExportFormat::kSafetensors, ExportFormat::kHfGpt2}) {
    if (name == ExportFormatName(f)) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--format must be safetensors or hf-gpt2, not \"", name, "\""));
}

absl::Status ExportSafetensors(client::CheckpointClient& client,
                               const v1::CheckpointManifest& manifest, const std::string& path,
                               const ExportOptions& options,
                               const std::function<void(const ExportProgress&)>& progress) {
  std::vector<const v1::TensorInfo*> weights;
  for (const v1::TensorInfo& t : manifest.tensors()) {
    if (!absl::StartsWith(t.name(), kWeightsPrefix)) continue;
    if (t.dtype() != v1::TENSOR_DTYPE_FLOAT32) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor ", t.name(), " is ", v1::TensorDType_Name(t.dtype()), "; only float32 exports"));
    }
    weights.push_back(&t);
  }
  if (weights.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint of job ", manifest.job_id(),
                                                      " step ", manifest.step(),
                                                      " holds no weights"));
  }
  ASSIGN_OR_RETURN(const ExportPlan plan, PlanExport(manifest, weights, options.format));
  const SafetensorsLayout layout = PlanSafetensors(plan.file_tensors, plan.metadata);
  ExportProgress state;
  state.tensors = static_cast<int>(weights.size());
  state.bytes = layout.file_size - layout.prefix.size();

  const std::string temporary = path + ".partial";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError("cannot create", temporary);
  auto fail = [&](absl::Status s) {
    ::close(fd);
    ::unlink(temporary.c_str());
    return s;
  };
  if (absl::Status s = WriteAt(fd, layout.prefix.data(), layout.prefix.size(), 0, temporary);
      !s.ok()) {
    return fail(s);
  }
  std::vector<float> values;
  for (size_t i = 0; i < weights.size(); ++i) {
    const v1::TensorInfo& tensor = *weights[i];
    const std::vector<int64_t> shape(tensor.global_shape().begin(), tensor.global_shape().end());
    if (absl::Status s =
            DownloadWhole(client, manifest, tensor, WholeBox(shape), options.timeout, &values);
        !s.ok()) {
      return fail(s);
    }
    size_t file_tensor = plan.first_file_tensor[i];
    const auto write = [&](const float* data, uint64_t count) -> absl::Status {
      RETURN_IF_ERROR(WriteAt(fd, reinterpret_cast<const char*>(data), count * sizeof(float),
                              layout.file_offsets[file_tensor], temporary));
      ++file_tensor;
      state.bytes_done += count * sizeof(float);
      return absl::OkStatus();
    };
    absl::Status written;
    if (options.format == ExportFormat::kSafetensors) {
      written = write(values.data(), values.size());
    } else {
      written = CohortToHf(*plan.model, tensor.name().substr(sizeof(kWeightsPrefix) - 1), shape,
                           values.data(), [&](const HfTensorSpec& spec, const float* data) {
                             uint64_t count = 1;
                             for (int64_t d : spec.shape) count *= static_cast<uint64_t>(d);
                             return write(data, count);
                           });
    }
    if (!written.ok()) return fail(written);
    ++state.tensors_done;
    if (progress) progress(state);
  }
  if (::fsync(fd) != 0) return fail(FileError("cannot sync", temporary));
  if (::close(fd) != 0) {
    ::unlink(temporary.c_str());
    return FileError("cannot close", temporary);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const absl::Status s = FileError(absl::StrCat("cannot rename ", temporary, " to"), path);
    ::unlink(temporary.c_str());
    return s;
  }
  return absl::OkStatus();
}

}  // namespace cohort::cohortctl
