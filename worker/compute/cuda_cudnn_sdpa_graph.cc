// The forward and backward graphs of cuDNN's causal fused attention as cuDNN
// backend descriptors (cuda_cudnn_sdpa.h describes them): tensors, pointwise
// operations, reductions, products and reshapes, each finalized as it is
// written. Needs no handle and no device, so the CPU tests build all of it.

#include "worker/compute/cuda_cudnn_sdpa.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace cohort::compute::sdpa {
namespace {

// 16 bytes: what the tensor-core engines want of every operand; the views
// of sdpa_layout.h start on head boundaries of a 256-byte-aligned buffer,
// and hs is a multiple of 8 bf16 (UnsupportedReason).
constexpr int64_t kAlignment = 16;

// Writes one graph's descriptors. The first cuDNN refusal is kept in
// status_ and every later call does nothing, so a builder reads straight
// through and checks once.
class GraphWriter {
 public:
  GraphWriter(const CudnnLibrary& library, OperationSet* out) : lib_(library), out_(out) {}

  absl::Status status() const { return status_; }

  cudnnBackendDescriptor_t Tensor(int64_t uid, cudnnDataType_t type, const View& view,
                                  bool is_virtual, bool by_value = false) {
    cudnnBackendDescriptor_t t = Create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    const int64_t alignment = kAlignment;
    Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type");
    Set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, view.dims.data(), "tensor dims");
    Set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, view.strides.data(), "tensor strides");
    Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
    Set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value) {
      Set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    }
    Finalize(t, absl::StrCat("tensor ", uid));
    return t;
  }

  // A virtual tensor with the next free uid.
  cudnnBackendDescriptor_t Virtual(cudnnDataType_t type, const View& view) {
    return Tensor(next_virtual_++, type, view, /*is_virtual=*/true);
  }

  // y = op(x[, b[, t]]). axis >= 0 for GEN_INDEX.
  void Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y,
                 cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1) {
    cudnnBackendDescriptor_t desc = Create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    Set(desc, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    Set(desc, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute,
        "pointwise precision");
    if (axis >= 0) Set(desc, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "axis");
    Finalize(desc, "pointwise descriptor");
    cudnnBackendDescriptor_t op =
        Create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc);
    SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t != nullptr) SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    Operation(op, "pointwise operation");
  }

  // A new virtual fp32 tensor of `view` = mode(x[, b]), computed in fp32.
  cudnnBackendDescriptor_t Apply(cudnnPointwiseMode_t mode, const View& view,
                                 cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b = nullptr) {
    cudnnBackendDescriptor_t y = Virtual(CUDNN_DATA_FLOAT, view);
    Pointwise(mode, CUDNN_DATA_FLOAT, x, b, y);
    return y;
  }

  void Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t desc = Create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    Set(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "matmul type");
    Finalize(desc, "matmul descriptor");
    cudnnBackendDescriptor_t op =
        Create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    SetDesc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    SetDesc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    SetDesc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    SetDesc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, desc);
    Operation(op, "matmul operation");
  }

  void Reduce(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t desc = Create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    Set(desc, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
        "reduction operator");
    Set(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "reduction type");
    Finalize(desc, "reduction descriptor");
    cudnnBackendDescriptor_t op =
        Create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    SetDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    SetDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    SetDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc);
    Operation(op, "reduction operation");
  }

  // y = x seen with other dims and strides (a transpose in place).
  void Reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op =
        Create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    SetDesc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    SetDesc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    Operation(op, "reshape operation");
  }

 private:
  cudnnBackendDescriptor_t Create(cudnnBackendDescriptorType_t type, const char* what) {
    if (!status_.ok()) return nullptr;
    cudnnBackendDescriptor_t raw = nullptr;
    const cudnnStatus_t s = lib_.fn().BackendCreateDescriptor(type, &raw);
    if (s != CUDNN_STATUS_SUCCESS) {
      Refuse(s, absl::StrCat("creating the ", what, " descriptor"));
      return nullptr;
    }
    out_->owned.emplace_back(&lib_, raw);
    return raw;
  }

  void Set(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const void* value, const char* what) {
    if (!status_.ok() || desc == nullptr) return;
    const cudnnStatus_t s = lib_.fn().BackendSetAttribute(desc, name, type, count, value);
    if (s != CUDNN_STATUS_SUCCESS) Refuse(s, absl::StrCat("setting ", what));
  }

  void SetDesc(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t name,
               cudnnBackendDescriptor_t value) {
    Set(desc, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, "an operand");
  }

  void Finalize(cudnnBackendDescriptor_t desc, const std::string& what) {
    if (!status_.ok() || desc == nullptr) return;
    const cudnnStatus_t s = lib_.fn().BackendFinalize(desc);
    if (s != CUDNN_STATUS_SUCCESS) Refuse(s, absl::StrCat("finalizing the ", what));
  }

  void Operation(cudnnBackendDescriptor_t op, const char* what) {
    Finalize(op, absl::StrCat(what, " #", out_->ops.size()));
    if (status_.ok()) out_->ops.push_back(op);
  }

  void Refuse(cudnnStatus_t s, const std::string& what) {
    status_ = absl::InternalError(absl::StrCat("cuDNN attention graph: ", what, ": ",
                                               lib_.ErrorText(s)));
  }

  const CudnnLibrary& lib_;
  OperationSet* out_;
  int64_t next_virtual_ = kFirstVirtualUid;
  absl::Status status_;
};

View Scalar() { return View{{1, 1, 1, 1}, {1, 1, 1, 1}, 0}; }

View Transposed(View view) {
  std::swap(view.dims[2], view.dims[3]);
  std::swap(view.strides[2], view.strides[3]);
  return view;
}

// The masked, scaled scores S (virtual fp32) from Q and K^T.
cudnnBackendDescriptor_t MaskedScores(GraphWriter& g, const Shape& s,
                                      cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t kt) {
  const View scores = ScoresView(s);
  auto raw = g.Virtual(CUDNN_DATA_FLOAT, scores);
  g.Matmul(q, kt, raw);
  auto scale = g.Tensor(kUidScale, CUDNN_DATA_FLOAT, Scalar(), false, /*by_value=*/true);
  auto scaled = g.Apply(CUDNN_POINTWISE_MUL, scores, raw, scale);
  // Causal: keep column j of row i where i >= j, else the lowest float
  // (not -inf: exp(-inf - m) is fine, but -inf - -inf is not).
  auto row = g.Virtual(CUDNN_DATA_INT32, scores);
  auto col = g.Virtual(CUDNN_DATA_INT32, scores);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scaled, nullptr, row, nullptr, 2);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scaled, nullptr, col, nullptr, 3);
  auto keep = g.Virtual(CUDNN_DATA_BOOLEAN, scores);
  g.Pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, keep);
  auto lowest = g.Tensor(kUidLowest, CUDNN_DATA_FLOAT, Scalar(), false, /*by_value=*/true);
  auto masked = g.Virtual(CUDNN_DATA_FLOAT, scores);
  g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scaled, lowest, masked, keep);
  return masked;
}

void Forward(GraphWriter& g, const Shape& s) {
  auto q = g.Tensor(kUidQ, CUDNN_DATA_BFLOAT16, QkvView(s, Part::kQ), false);
  auto kt = g.Tensor(kUidK, CUDNN_DATA_BFLOAT16, KeyTransposedView(s), false);
  auto v = g.Tensor(kUidV, CUDNN_DATA_BFLOAT16, QkvView(s, Part::kV), false);
  auto o = g.Tensor(kUidO, CUDNN_DATA_BFLOAT16, HeadsView(s), false);
  auto stats = g.Tensor(kUidStats, CUDNN_DATA_FLOAT, StatsView(s), false);
  auto scores = MaskedScores(g, s, q, kt);
  const View full = ScoresView(s), row = StatsView(s);
  auto max = g.Virtual(CUDNN_DATA_FLOAT, row);
  g.Reduce(CUDNN_REDUCE_TENSOR_MAX, scores, max);
  auto e = g.Apply(CUDNN_POINTWISE_EXP, full, g.Apply(CUDNN_POINTWISE_SUB, full, scores, max));
  auto z = g.Virtual(CUDNN_DATA_FLOAT, row);
  g.Reduce(CUDNN_REDUCE_TENSOR_ADD, e, z);
  auto log_z = g.Apply(CUDNN_POINTWISE_LOG, row, z);
  g.Pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, log_z, stats);
  // P is bf16, the second product's operand type.
  auto p = g.Virtual(CUDNN_DATA_BFLOAT16, full);
  g.Pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, z, p);
  g.Matmul(p, v, o);
}

void Backward(GraphWriter& g, const Shape& s) {
  const View full = ScoresView(s), row = StatsView(s), heads = HeadsView(s);
  auto q = g.Tensor(kUidQ, CUDNN_DATA_BFLOAT16, QkvView(s, Part::kQ), false);
  auto kt = g.Tensor(kUidK, CUDNN_DATA_BFLOAT16, KeyTransposedView(s), false);
  auto vt = g.Tensor(kUidV, CUDNN_DATA_BFLOAT16, Transposed(QkvView(s, Part::kV)), false);
  auto o = g.Tensor(kUidO, CUDNN_DATA_BFLOAT16, heads, false);
  auto d_o = g.Tensor(kUidDO, CUDNN_DATA_BFLOAT16, heads, false);
  auto stats = g.Tensor(kUidStats, CUDNN_DATA_FLOAT, row, false);
  auto dq = g.Tensor(kUidDQ, CUDNN_DATA_BFLOAT16, QkvView(s, Part::kQ), false);
  auto dk = g.Tensor(kUidDK, CUDNN_DATA_BFLOAT16, QkvView(s, Part::kK), false);
  auto dv = g.Tensor(kUidDV, CUDNN_DATA_BFLOAT16, QkvView(s, Part::kV), false);
  auto one = g.Tensor(kUidOne, CUDNN_DATA_FLOAT, Scalar(), false, /*by_value=*/true);
  auto scale = g.Tensor(kUidScale, CUDNN_DATA_FLOAT, Scalar(), false, /*by_value=*/true);
  // D = rowsum(dO * O): the softmax backward's dot product per row.
  const View packed_heads{heads.dims, {s.NH * s.T * s.hs, s.T * s.hs, s.hs, 1}};
  auto dot = g.Virtual(CUDNN_DATA_FLOAT, row);
  g.Reduce(CUDNN_REDUCE_TENSOR_ADD, g.Apply(CUDNN_POINTWISE_MUL, packed_heads, d_o, o), dot);
  auto softmax_sum = g.Apply(CUDNN_POINTWISE_MUL, row, dot, one);
  // P = exp(S - stats), recomputed tile by tile.
  auto scores = MaskedScores(g, s, q, kt);
  auto p = g.Apply(CUDNN_POINTWISE_EXP, full, g.Apply(CUDNN_POINTWISE_SUB, full, scores, stats));
  // dV = P^T dO.
  auto pt = g.Virtual(CUDNN_DATA_BFLOAT16, Transposed(full));
  g.Reshape(p, pt);
  g.Matmul(pt, d_o, dv);
  // dS = (dO V^T * 1 - D) * P * scale.
  auto dp = g.Virtual(CUDNN_DATA_FLOAT, full);
  g.Matmul(d_o, vt, dp);
  auto dp_kept = g.Apply(CUDNN_POINTWISE_MUL, full, dp, one);
  auto centred = g.Apply(CUDNN_POINTWISE_SUB, full, dp_kept, softmax_sum);
  auto ds = g.Apply(CUDNN_POINTWISE_MUL, full, g.Apply(CUDNN_POINTWISE_MUL, full, centred, p), scale);
  // dK = dS^T Q.
  auto dst = g.Virtual(CUDNN_DATA_BFLOAT16, Transposed(full));
  g.Reshape(ds, dst);
  g.Matmul(dst, q, dk);
  // dQ = dS K, K as the transpose of the K^T view.
  auto k = g.Virtual(CUDNN_DATA_BFLOAT16, QkvView(s, Part::kK));
  g.Reshape(kt, k);
  g.Matmul(ds, k, dq);
}

}  // namespace

Descriptor::~Descriptor() {
  if (raw_ != nullptr) library_->fn().BackendDestroyDescriptor(raw_);
}

Descriptor& Descriptor::operator=(Descriptor&& other) noexcept {
  if (this != &other) {
    if (raw_ != nullptr) library_->fn().BackendDestroyDescriptor(raw_);
    library_ = other.library_;
    raw_ = std::exchange(other.raw_, nullptr);
  }
  return *this;
}

absl::StatusOr<OperationSet> BuildOperations(const CudnnLibrary& library, const Shape& shape,
                                             Direction direction) {
  if (const char* reason = UnsupportedReason(shape); reason != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuDNN attention: head width ", shape.hs, ": ", reason));
  }
  OperationSet set;
  GraphWriter writer(library, &set);
  if (direction == Direction::kForward) {
    Forward(writer, shape);
  } else {
    Backward(writer, shape);
  }
  if (!writer.status().ok()) return writer.status();
  return set;
}

}  // namespace cohort::compute::sdpa
