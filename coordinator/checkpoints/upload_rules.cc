#include "coordinator/checkpoints/upload_rules.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec/validator.h"

namespace cohort::coordinator {

size_t DTypeBytes(v1::TensorDType dtype) {
  switch (dtype) {
    case v1::TENSOR_DTYPE_FLOAT32:
      return 4;
    case v1::TENSOR_DTYPE_BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

absl::Status CheckUploadHeader(const v1::UploadHeader& h, int max_tensors) {
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("header.", field, ": ", why));
  };
  if (h.job_id().empty()) return bad("job_id", "must not be empty");
  if (h.generation() == 0) return bad("generation", "must be a job generation (>= 1)");
  if (h.step() < 0) return bad("step", absl::StrCat("must be >= 0, got ", h.step()));
  if (h.writers() == 0) return bad("writers", "must be >= 1");
  if (h.writer() >= h.writers()) {
    return bad("writer", absl::StrCat(h.writer(), " is not below writers = ", h.writers()));
  }
  const v1::CheckpointLayout& l = h.layout();
  if (l.data_parallel() < 1 || l.tensor_parallel() < 1 || l.pipeline_parallel() < 1) {
    return bad("layout", "every degree must be >= 1");
  }
  // Degrees are int32 and writers uint32: data x tensor fits in int64, and
  // times pipeline too once it is at most writers.
  const int64_t data_tensor = int64_t{l.data_parallel()} * l.tensor_parallel();
  if (data_tensor > h.writers() || data_tensor * l.pipeline_parallel() != h.writers()) {
    return bad("writers",
               absl::StrCat(h.writers(), " is not data x tensor x pipeline = ", l.data_parallel(),
                            " x ", l.tensor_parallel(), " x ", l.pipeline_parallel()));
  }
  if (h.tensors().empty()) return bad("tensors", "must declare at least one tensor");
  if (h.tensors_size() > max_tensors) {
    return absl::ResourceExhaustedError(absl::StrCat("header.tensors: ", h.tensors_size(),
                                                     " tensors exceed the limit of ",
                                                     max_tensors));
  }
  std::set<std::string> names;
  for (const v1::TensorInfo& t : h.tensors()) {
    if (!ValidTensorName(t.name())) {
      return bad("tensors", absl::StrCat("name \"", t.name(),
                                         "\" is not 1-128 characters of [A-Za-z0-9_/.-]"));
    }
    if (!names.insert(t.name()).second) {
      return bad("tensors", absl::StrCat("tensor ", t.name(), " is declared twice"));
    }
    if (DTypeBytes(t.dtype()) == 0) {
      return bad("tensors", absl::StrCat("tensor ", t.name(), " has no supported dtype"));
    }
    if (!t.chunks().empty()) {
      return bad("tensors", absl::StrCat("tensor ", t.name(), " must not list chunks"));
    }
    if (t.global_shape_size() > 8) {
      return bad("tensors", absl::StrCat("tensor ", t.name(), " has more than 8 dimensions"));
    }
    int64_t elements = 1;
    for (int64_t d : t.global_shape()) {
      if (d < 0 || (d > 0 && elements > std::numeric_limits<int64_t>::max() / 8 / d)) {
        return bad("tensors", absl::StrCat("tensor ", t.name(), " has an invalid shape [",
                                           absl::StrJoin(t.global_shape(), ", "), "]"));
      }
      elements *= d;
    }
  }
  return absl::OkStatus();
}

bool SameDeclaration(const v1::UploadHeader& a, const v1::UploadHeader& b) {
  if (a.writers() != b.writers() || a.layout().SerializeAsString() != b.layout().SerializeAsString() ||
      a.tensors_size() != b.tensors_size()) {
    return false;
  }
  for (int i = 0; i < a.tensors_size(); ++i) {
    if (a.tensors(i).SerializeAsString() != b.tensors(i).SerializeAsString()) return false;
  }
  return true;
}

bool ValidTensorName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '/' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::vector<int64_t> StepsToRetire(std::vector<int64_t> committed,
                                   v1::CheckpointPolicy policy) {
  ApplyCheckpointDefaults(policy);
  const int keep_last = policy.keep_last();
  std::sort(committed.begin(), committed.end(), std::greater<>());
  std::vector<int64_t> retire;
  for (size_t i = 0; i < committed.size(); ++i) {
    if (static_cast<int64_t>(i) < keep_last) continue;
    if (policy.keep_every() > 0 && committed[i] % policy.keep_every() == 0) continue;
    retire.push_back(committed[i]);
  }
  std::sort(retire.begin(), retire.end());
  return retire;
}

}  // namespace cohort::coordinator
