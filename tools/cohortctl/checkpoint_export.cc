#include "tools/cohortctl/checkpoint_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/box_proto.h"
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

}  // namespace

absl::Status ExportSafetensors(client::CheckpointClient& client,
                               const v1::CheckpointManifest& manifest, const std::string& path,
                               absl::Duration timeout,
                               const std::function<void(const ExportProgress&)>& progress) {
  std::vector<const v1::TensorInfo*> weights;
  std::vector<SafetensorsTensor> layout_tensors;
  ExportProgress state;
  for (const v1::TensorInfo& t : manifest.tensors()) {
    if (!absl::StartsWith(t.name(), kWeightsPrefix)) continue;
    if (t.dtype() != v1::TENSOR_DTYPE_FLOAT32) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor ", t.name(), " is ", v1::TensorDType_Name(t.dtype()), "; only float32 exports"));
    }
    weights.push_back(&t);
    layout_tensors.push_back(SafetensorsTensor{
        t.name().substr(sizeof(kWeightsPrefix) - 1),
        std::vector<int64_t>(t.global_shape().begin(), t.global_shape().end())});
  }
  if (weights.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint of job ", manifest.job_id(), " step ", manifest.step(), " holds no weights"));
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "cohort-gpt"},
      {"job", manifest.job_id()},
      {"step", absl::StrCat(manifest.step())},
      {"generation", absl::StrCat(manifest.generation())},
      {"model", manifest.objects().contains("model") ? manifest.objects().at("model") : ""},
      {"layout", "tensor names and shapes: docs/checkpoint-format.md"},
  };
  const SafetensorsLayout layout = PlanSafetensors(layout_tensors, metadata);
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
  for (size_t i = 0; i < weights.size(); ++i) {
    const v1::TensorInfo& tensor = *weights[i];
    const Box whole = WholeBox(layout_tensors[i].shape);
    std::vector<float> values(static_cast<size_t>(whole.NumElements()));
    int64_t filled = 0;
    absl::Status downloaded = client.Download(
        manifest.job_id(), manifest.step(),
        [&] {
          std::vector<v1::ChunkRef> refs;
          for (const v1::ChunkInfo& c : tensor.chunks()) {
            v1::ChunkRef ref;
            ref.set_tensor(tensor.name());
            ref.set_index(c.index());
            refs.push_back(std::move(ref));
          }
          return refs;
        }(),
        [&](const std::string&, const v1::ChunkInfo& info, std::string_view bytes) {
          const Box box = BoxFromProto(info.box());
          if (!BoxWithin(box, whole.extent) ||
              static_cast<uint64_t>(box.NumElements()) * 4 != bytes.size()) {
            return absl::DataLossError(absl::StrCat("tensor ", tensor.name(), " chunk ",
                                                    info.index(), " does not fit its shape"));
          }
          CopyRegion(box, ConstBoxedBuffer{&box, 0, bytes.data()},
                     BoxedBuffer{&whole, 0, values.data()}, sizeof(float));
          filled += box.NumElements();
          return absl::OkStatus();
        },
        timeout);
    if (!downloaded.ok()) return fail(downloaded);
    if (filled != whole.NumElements()) {
      return fail(absl::DataLossError(absl::StrCat("tensor ", tensor.name(), ": chunks cover ",
                                                   filled, " of ", whole.NumElements(),
                                                   " elements")));
    }
    if (absl::Status s = WriteAt(fd, reinterpret_cast<const char*>(values.data()),
                                 values.size() * sizeof(float), layout.file_offsets[i], temporary);
        !s.ok()) {
      return fail(s);
    }
    ++state.tensors_done;
    state.bytes_done += values.size() * sizeof(float);
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
