// cuDNN's causal fused attention (cuda_cudnn_sdpa.h): the operation graph,
// the deterministic engine choice, the execution plan and its execution.
// The graphs' operations are cuda_cudnn_sdpa_graph.cc's.

#include "worker/compute/cuda_cudnn_sdpa.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace cohort::compute::sdpa {
namespace {

absl::Status Check(const CudnnLibrary& library, cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuDNN attention: ", what, ": ",
                                          library.ErrorText(status)));
}

absl::StatusOr<Descriptor> Make(const CudnnLibrary& library, cudnnBackendDescriptorType_t type,
                                const char* what) {
  cudnnBackendDescriptor_t raw = nullptr;
  RETURN_IF_ERROR(Check(library, library.fn().BackendCreateDescriptor(type, &raw), what));
  return Descriptor(&library, raw);
}

// Whether the engine config's engine carries the NONDETERMINISTIC note.
absl::StatusOr<bool> Nondeterministic(const CudnnLibrary& library,
                                      cudnnBackendDescriptor_t config) {
  ASSIGN_OR_RETURN(Descriptor engine,
                   Make(library, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "an engine descriptor"));
  cudnnBackendDescriptor_t raw_engine = engine.get();
  int64_t count = 0;
  RETURN_IF_ERROR(Check(library,
                        library.fn().BackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                                                         &raw_engine),
                        "reading an engine config's engine"));
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  count = 0;
  RETURN_IF_ERROR(Check(
      library,
      library.fn().BackendGetAttribute(raw_engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                       CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                                       &count, notes),
      "reading an engine's numerical notes"));
  for (int64_t i = 0; i < count; ++i) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<Descriptor> BuildGraph(const CudnnLibrary& library, cudnnHandle_t handle,
                                      const OperationSet& operations) {
  const CudnnFunctions& fn = library.fn();
  ASSIGN_OR_RETURN(Descriptor graph, Make(library, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
                                          "the operation graph"));
  if (handle != nullptr) {
    RETURN_IF_ERROR(Check(library,
                          fn.BackendSetAttribute(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                                 CUDNN_TYPE_HANDLE, 1, &handle),
                          "setting the graph's handle"));
  }
  const std::vector<cudnnBackendDescriptor_t>& ops = operations.ops;
  RETURN_IF_ERROR(Check(library,
                        fn.BackendSetAttribute(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                               static_cast<int64_t>(ops.size()), ops.data()),
                        "setting the graph's operations"));
  RETURN_IF_ERROR(
      Check(library, fn.BackendFinalize(graph.get()), "finalizing the operation graph"));
  return graph;
}

absl::StatusOr<std::unique_ptr<Plan>> BuildPlan(const CudnnLibrary& library,
                                                cudnnHandle_t handle, const Shape& shape,
                                                Direction direction) {
  auto plan = std::make_unique<Plan>();
  ASSIGN_OR_RETURN(plan->operations, BuildOperations(library, shape, direction));
  const CudnnFunctions& fn = library.fn();
  ASSIGN_OR_RETURN(plan->graph, BuildGraph(library, handle, plan->operations));
  cudnnBackendDescriptor_t graph = plan->graph.get();

  ASSIGN_OR_RETURN(Descriptor heuristics,
                   Make(library, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "the heuristics"));
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  RETURN_IF_ERROR(Check(library,
                        fn.BackendSetAttribute(heuristics.get(),
                                               CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph),
                        "setting the heuristics' graph"));
  RETURN_IF_ERROR(Check(library,
                        fn.BackendSetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_MODE,
                                               CUDNN_TYPE_HEUR_MODE, 1, &mode),
                        "setting the heuristics' mode"));
  RETURN_IF_ERROR(Check(library, fn.BackendFinalize(heuristics.get()),
                        "finalizing the heuristics"));
  int64_t available = 0;
  RETURN_IF_ERROR(Check(library,
                        fn.BackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available,
                                               nullptr),
                        "counting the heuristics' results"));
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw_configs;
  for (int64_t i = 0; i < available; ++i) {
    ASSIGN_OR_RETURN(Descriptor config,
                     Make(library, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "an engine config"));
    raw_configs.push_back(config.get());
    configs.push_back(std::move(config));
  }
  int64_t returned = 0;
  if (available > 0) {
    RETURN_IF_ERROR(Check(library,
                          fn.BackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, available,
                                                 &returned, raw_configs.data()),
                          "reading the heuristics' results"));
  }
  std::vector<std::string> refused;
  for (int64_t i = 0; i < returned; ++i) {
    ASSIGN_OR_RETURN(const bool nondeterministic, Nondeterministic(library, raw_configs[i]));
    if (nondeterministic) {
      refused.push_back(absl::StrCat("config ", i, ": nondeterministic"));
      continue;
    }
    ASSIGN_OR_RETURN(Descriptor candidate, Make(library, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                                "an execution plan"));
    cudnnStatus_t s = fn.BackendSetAttribute(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                             CUDNN_TYPE_HANDLE, 1, &handle);
    if (s == CUDNN_STATUS_SUCCESS) {
      s = fn.BackendSetAttribute(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw_configs[i]);
    }
    if (s == CUDNN_STATUS_SUCCESS) s = fn.BackendFinalize(candidate.get());
    if (s != CUDNN_STATUS_SUCCESS) {
      refused.push_back(absl::StrCat("config ", i, ": ", library.ErrorText(s)));
      continue;
    }
    int64_t count = 0;
    RETURN_IF_ERROR(Check(library,
                          fn.BackendGetAttribute(candidate.get(),
                                                 CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                 CUDNN_TYPE_INT64, 1, &count,
                                                 &plan->workspace_bytes),
                          "reading the plan's workspace size"));
    plan->plan = std::move(candidate);
    plan->engine = absl::StrCat("heuristic config ", i, " of ", returned);
    return plan;
  }
  return absl::NotFoundError(absl::StrCat(
      "cuDNN attention ", direction == Direction::kForward ? "forward" : "backward", " B=",
      shape.B, " T=", shape.T, " NH=", shape.NH, " hs=", shape.hs,
      ": no deterministic engine config finalized (", returned, " offered",
      refused.empty() ? "" : ": ", absl::StrJoin(refused, "; "), ")"));
}

namespace {

absl::Status Execute(const CudnnLibrary& library, cudnnHandle_t handle, const Plan& plan,
                     const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
                     void* workspace) {
  const CudnnFunctions& fn = library.fn();
  ASSIGN_OR_RETURN(Descriptor pack,
                   Make(library, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "the variant pack"));
  const auto n = static_cast<int64_t>(uids.size());
  RETURN_IF_ERROR(Check(library,
                        fn.BackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                               CUDNN_TYPE_INT64, n, uids.data()),
                        "setting the variant pack's ids"));
  RETURN_IF_ERROR(Check(library,
                        fn.BackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                               CUDNN_TYPE_VOID_PTR, n, pointers.data()),
                        "setting the variant pack's pointers"));
  RETURN_IF_ERROR(Check(library,
                        fn.BackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                               CUDNN_TYPE_VOID_PTR, 1, &workspace),
                        "setting the variant pack's workspace"));
  RETURN_IF_ERROR(Check(library, fn.BackendFinalize(pack.get()), "finalizing the variant pack"));
  return Check(library, fn.BackendExecute(handle, plan.plan.get(), pack.get()),
               "cudnnBackendExecute");
}

// A bf16 tensor's element `offset` from `base`.
void* At(const void* base, int64_t offset) {
  return const_cast<char*>(static_cast<const char*>(base)) + offset * 2;
}

}  // namespace

absl::Status ExecuteForward(const CudnnLibrary& library, cudnnHandle_t handle, const Plan& plan,
                            const Shape& shape, const ForwardArgs& args, void* workspace) {
  // By-value scalars are read when the pack is executed (enqueued), so
  // locals suffice.
  float scale = 1.0f / std::sqrt(static_cast<float>(shape.hs));
  float lowest = std::numeric_limits<float>::lowest();
  return Execute(library, handle, plan,
                 {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidLowest},
                 {At(args.qkv_bf16, QkvView(shape, Part::kQ).offset),
                  At(args.qkv_bf16, QkvView(shape, Part::kK).offset),
                  At(args.qkv_bf16, QkvView(shape, Part::kV).offset), args.out_bf16, args.stats,
                  &scale, &lowest},
                 workspace);
}

absl::Status ExecuteBackward(const CudnnLibrary& library, cudnnHandle_t handle, const Plan& plan,
                             const Shape& shape, const BackwardArgs& args, void* workspace) {
  float scale = 1.0f / std::sqrt(static_cast<float>(shape.hs));
  float lowest = std::numeric_limits<float>::lowest();
  float one = 1.0f;
  return Execute(
      library, handle, plan,
      {kUidQ, kUidK, kUidV, kUidO, kUidDO, kUidStats, kUidDQ, kUidDK, kUidDV, kUidScale,
       kUidLowest, kUidOne},
      {At(args.qkv_bf16, QkvView(shape, Part::kQ).offset),
       At(args.qkv_bf16, QkvView(shape, Part::kK).offset),
       At(args.qkv_bf16, QkvView(shape, Part::kV).offset), const_cast<void*>(args.out_bf16),
       const_cast<void*>(args.dout_bf16), const_cast<float*>(args.stats),
       At(args.dqkv_bf16, QkvView(shape, Part::kQ).offset),
       At(args.dqkv_bf16, QkvView(shape, Part::kK).offset),
       At(args.dqkv_bf16, QkvView(shape, Part::kV).offset), &scale, &lowest, &one},
      workspace);
}

}  // namespace cohort::compute::sdpa
