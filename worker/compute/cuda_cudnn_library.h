#pragma once
// CudnnLibrary: cuDNN loaded at run time. cuDNN is about a gigabyte of
// engines, so the worker neither links it nor ships it in the GPU bundle: it
// takes the library of the machine that runs the job, and falls back to its
// own attention kernels where there is none (cuda_backend_attention.cc).
// Only the graph (backend) API's entry points the fused attention calls are
// looked up; the build compiles against cuDNN's headers only.
//
// Where the library is looked for, first hit wins:
//   1. an explicit path (CudnnLoadOptions::path, else $COHORT_CUDNN_LIBRARY):
//      that file only, an error naming it if it does not load;
//   2. "libcudnn.so.9" through the dynamic loader's own search
//      (LD_LIBRARY_PATH, the ld.so cache, the default directories);
//   3. /usr/local/cuda/lib64 and /usr/local/cuda/lib;
//   4. nvidia/cudnn/lib of PyTorch's pip wheel, under the site-packages
//      directories of the python3 interpreter's usual prefixes (a glob, no
//      interpreter is started).
//
// Thread-safety: the table is immutable once loaded; cuDNN's functions have
// cuDNN's thread-safety (a handle per thread).

#include <cudnn_graph.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cohort::compute {

// The oldest cuDNN the fused attention runs on: the graph API's pointwise
// GEN_INDEX/BINARY_SELECT and the flash-attention engines with statistics
// and a deterministic backward are all in 9.0; a different major version
// may renumber the backend API's enums this build was compiled with.
constexpr int kMinCudnnVersion = 90000;  // cudnnGetVersion's encoding: 9.0.0
constexpr int kCudnnMajor = 9;

struct CudnnLoadOptions {
  // An explicit library file; empty: $COHORT_CUDNN_LIBRARY, else the search.
  std::string path;
};

// The entry points used, resolved with dlsym.
struct CudnnFunctions {
  decltype(&::cudnnGetVersion) GetVersion = nullptr;
  decltype(&::cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&::cudnnGetLastErrorString) GetLastErrorString = nullptr;
  decltype(&::cudnnCreate) Create = nullptr;
  decltype(&::cudnnDestroy) Destroy = nullptr;
  decltype(&::cudnnSetStream) SetStream = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) BackendCreateDescriptor = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) BackendDestroyDescriptor = nullptr;
  decltype(&::cudnnBackendFinalize) BackendFinalize = nullptr;
  decltype(&::cudnnBackendSetAttribute) BackendSetAttribute = nullptr;
  decltype(&::cudnnBackendGetAttribute) BackendGetAttribute = nullptr;
  decltype(&::cudnnBackendExecute) BackendExecute = nullptr;
};

class CudnnLibrary {
 public:
  // Loads the library and every entry point, and checks the version.
  // NotFound naming every place tried (or the explicit path and dlerror's
  // reason); FailedPrecondition for a library that lacks an entry point or
  // whose version is older than kMinCudnnVersion or of another major
  // version, naming the version found and the version wanted.
  static absl::StatusOr<std::unique_ptr<CudnnLibrary>> Load(const CudnnLoadOptions& options);
  ~CudnnLibrary();
  CudnnLibrary(const CudnnLibrary&) = delete;
  CudnnLibrary& operator=(const CudnnLibrary&) = delete;

  const CudnnFunctions& fn() const { return fn_; }
  // cudnnGetVersion()'s value (major * 10000 + minor * 100 + patch).
  int version() const { return version_; }
  // "9.19.0".
  std::string VersionText() const;
  // The file that was loaded.
  const std::string& path() const { return path_; }

  // cuDNN's status as text: its name and the last error message cuDNN kept
  // (cudnnGetLastErrorString), for the one place each call is converted.
  std::string ErrorText(cudnnStatus_t status) const;

 private:
  CudnnLibrary(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}

  void* handle_;
  std::string path_;
  int version_ = 0;
  CudnnFunctions fn_;
};

// The places Load tries when no explicit path is given, in order (for its
// error message and the tests).
std::vector<std::string> CudnnSearchCandidates();

// major.minor.patch of a cudnnGetVersion() value.
std::string CudnnVersionText(int version);

}  // namespace cohort::compute
