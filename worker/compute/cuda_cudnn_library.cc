#include "worker/compute/cuda_cudnn_library.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cohort::compute {
namespace {

constexpr char kSoname[] = "libcudnn.so.9";

// dlopen with RTLD_LOCAL: cuDNN's symbols stay out of the global namespace,
// so nothing else in the process binds to them by accident.
void* Open(const std::string& path, std::string* error) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    *error = reason != nullptr ? reason : "dlopen failed";
  }
  return handle;
}

void AppendGlob(const std::string& pattern, std::vector<std::string>* out) {
  glob_t found{};
  if (glob(pattern.c_str(), 0, nullptr, &found) == 0) {
    for (size_t i = 0; i < found.gl_pathc; ++i) out->push_back(found.gl_pathv[i]);
  }
  globfree(&found);
}

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* fn, std::vector<std::string>* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) missing->push_back(name);
  return *fn != nullptr;
}

}  // namespace

std::string CudnnVersionText(int version) {
  return absl::StrCat(version / 10000, ".", version / 100 % 100, ".", version % 100);
}

std::vector<std::string> CudnnSearchCandidates() {
  // The bare soname first: dlopen then searches LD_LIBRARY_PATH, the
  // ld.so cache and the default directories itself.
  std::vector<std::string> candidates = {kSoname, "/usr/local/cuda/lib64/libcudnn.so.9",
                                         "/usr/local/cuda/lib/libcudnn.so.9"};
  // PyTorch's pip wheel (nvidia-cudnn-cu*) keeps its cuDNN in
  // site-packages/nvidia/cudnn/lib; the usual prefixes of a python3 install
  // and of a user's pip --user.
  const char* home = std::getenv("HOME");
  std::vector<std::string> prefixes = {"/usr/local/lib", "/usr/lib", "/opt/conda/lib"};
  if (home != nullptr) prefixes.push_back(absl::StrCat(home, "/.local/lib"));
  for (const std::string& prefix : prefixes) {
    for (const char* packages : {"site-packages", "dist-packages"}) {
      AppendGlob(absl::StrCat(prefix, "/python3*/", packages, "/nvidia/cudnn/lib/", kSoname),
                 &candidates);
    }
  }
  return candidates;
}

absl::StatusOr<std::unique_ptr<CudnnLibrary>> CudnnLibrary::Load(const CudnnLoadOptions& options) {
  std::string explicit_path = options.path;
  if (explicit_path.empty()) {
    if (const char* env = std::getenv("COHORT_CUDNN_LIBRARY"); env != nullptr) explicit_path = env;
  }
  void* handle = nullptr;
  std::string loaded;
  if (!explicit_path.empty()) {
    std::string error;
    handle = Open(explicit_path, &error);
    if (handle == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("cuDNN library ", explicit_path, " (the explicit path) did not load: ", error));
    }
    loaded = explicit_path;
  } else {
    std::vector<std::string> tried;
    for (const std::string& candidate : CudnnSearchCandidates()) {
      std::string error;
      handle = Open(candidate, &error);
      if (handle != nullptr) {
        loaded = candidate;
        break;
      }
      tried.push_back(absl::StrCat(candidate, " (", error, ")"));
    }
    if (handle == nullptr) {
      return absl::NotFoundError(absl::StrCat("cuDNN (", kSoname, ") not found; tried ",
                                              absl::StrJoin(tried, "; ")));
    }
  }
  std::unique_ptr<CudnnLibrary> library(new CudnnLibrary(handle, loaded));
  CudnnFunctions& fn = library->fn_;
  std::vector<std::string> missing;
  Resolve(handle, "cudnnGetVersion", &fn.GetVersion, &missing);
  Resolve(handle, "cudnnGetErrorString", &fn.GetErrorString, &missing);
  Resolve(handle, "cudnnGetLastErrorString", &fn.GetLastErrorString, &missing);
  Resolve(handle, "cudnnCreate", &fn.Create, &missing);
  Resolve(handle, "cudnnDestroy", &fn.Destroy, &missing);
  Resolve(handle, "cudnnSetStream", &fn.SetStream, &missing);
  Resolve(handle, "cudnnBackendCreateDescriptor", &fn.BackendCreateDescriptor, &missing);
  Resolve(handle, "cudnnBackendDestroyDescriptor", &fn.BackendDestroyDescriptor, &missing);
  Resolve(handle, "cudnnBackendFinalize", &fn.BackendFinalize, &missing);
  Resolve(handle, "cudnnBackendSetAttribute", &fn.BackendSetAttribute, &missing);
  Resolve(handle, "cudnnBackendGetAttribute", &fn.BackendGetAttribute, &missing);
  Resolve(handle, "cudnnBackendExecute", &fn.BackendExecute, &missing);
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cuDNN library ", loaded, " lacks ",
                                                      absl::StrJoin(missing, ", ")));
  }
  library->version_ = static_cast<int>(fn.GetVersion());
  const int version = library->version_;
  if (version < kMinCudnnVersion || version / 10000 != kCudnnMajor) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuDNN library ", loaded, " is version ", CudnnVersionText(version),
                     "; the fused attention needs ", kCudnnMajor, ".x from ",
                     CudnnVersionText(kMinCudnnVersion), " (built against ",
                     CudnnVersionText(CUDNN_VERSION), ")"));
  }
  return library;
}

CudnnLibrary::~CudnnLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

std::string CudnnLibrary::VersionText() const { return CudnnVersionText(version_); }

std::string CudnnLibrary::ErrorText(cudnnStatus_t status) const {
  char last[512] = {};
  fn_.GetLastErrorString(last, sizeof(last));
  std::string text = fn_.GetErrorString(status);
  if (last[0] != '\0') absl::StrAppend(&text, ": ", last);
  return text;
}

}  // namespace cohort::compute
