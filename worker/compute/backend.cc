#include "worker/compute/backend.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/compute/span_checks.h"

namespace cohort::compute {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

namespace {

// The synchronous copy's handle: done when it is made.
class DoneSideCopy final : public SideCopy {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<SideCopy> Backend::CopyToHostSide(void* dst, TensorSpan src) {
  CopyToHost(dst, src);
  return std::make_unique<DoneSideCopy>();
}

TensorSpan TensorSpan::Slice(size_t offset, size_t count) const {
  CHECK(offset <= numel && count <= numel - offset)
      << "slice [" << offset << ", " << offset + count << ") of a span of " << numel;
  auto* base = static_cast<char*>(data);
  return TensorSpan{base == nullptr ? nullptr : base + offset * DTypeSize(dtype), dtype, count};
}

Buffer::Buffer(void* data, DType dtype, size_t numel, std::function<void(void*)> release)
    : data_(data), dtype_(dtype), numel_(numel), release_(std::move(release)) {}

Buffer::~Buffer() { Release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      dtype_(other.dtype_),
      numel_(std::exchange(other.numel_, 0)),
      release_(std::move(other.release_)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    dtype_ = other.dtype_;
    numel_ = std::exchange(other.numel_, 0);
    release_ = std::move(other.release_);
  }
  return *this;
}

void Buffer::Release() {
  if (data_ != nullptr && release_) release_(data_);
  data_ = nullptr;
  numel_ = 0;
}

absl::Status Backend::AttachParams(TensorSpan params, const std::vector<ParamBlock>& blocks) {
  CHECK(params.dtype == DType::kFloat32) << "AttachParams: the arena is fp32";
  // No copy to keep; the blocks are still checked, so that a caller's
  // mistake shows on every backend.
  return ParamCopyLayout::Create(params.numel, blocks).status();
}

// Backends of host memory capture nothing (backend.h): no launch to save.
absl::Status Backend::BeginCapture() {
  return absl::UnimplementedError(absl::StrCat("the ", std::string(name()), " backend does not capture ops"));
}

absl::StatusOr<std::unique_ptr<CapturedOps>> Backend::EndCapture() {
  return absl::FailedPreconditionError("EndCapture without an open capture");
}

absl::Status Backend::Replay(const CapturedOps& ops) {
  LOG(FATAL) << "Replay on the " << name() << " backend, which made no capture";
  return absl::InternalError("unreachable");
}

// The unsharded ops are the shards that hold the whole table (the shard ops
// promise the same bits with vocab_start 0 and Vs = Vp).
void Backend::EncoderForward(TensorSpan out, TensorSpan inp, TensorSpan wte, TensorSpan wpe, int B,
                             int T, int C) {
  CHECK(C > 0 && !wpe.empty()) << "EncoderForward: C=" << C << ", wpe is required";
  EncoderForwardShard(out, inp, wte, wpe, 0, static_cast<int>(wte.numel / C), B, T, C);
}

void Backend::EncoderBackward(TensorSpan dwte, TensorSpan dwpe, TensorSpan dout, TensorSpan inp,
                              int B, int T, int C) {
  CHECK(C > 0 && !dwpe.empty()) << "EncoderBackward: C=" << C << ", dwpe is required";
  EncoderBackwardShard(dwte, dwpe, dout, inp, 0, static_cast<int>(dwte.numel / C), B, T, C);
}

void Backend::ResidualLayerNormForward(TensorSpan residual_out, TensorSpan out, TensorSpan mean,
                                       TensorSpan rstd, TensorSpan inp1, TensorSpan inp2,
                                       TensorSpan weight, TensorSpan bias, int N, int C) {
  CheckNotAnInput(residual_out, {inp1, inp2}, "ResidualLayerNormForward: residual_out");
  ResidualForward(residual_out, inp1, inp2, static_cast<size_t>(N) * C);
  LayerNormForward(out, mean, rstd, residual_out, weight, bias, N, C);
}

void Backend::MatmulGeluForward(TensorSpan out, TensorSpan pre, TensorSpan inp, TensorSpan weight,
                                TensorSpan bias, int N, int C, int OC) {
  MatmulForward(pre, inp, weight, bias, N, C, OC);
  GeluForward(out, pre, static_cast<size_t>(N) * OC);
}

void Backend::CrossEntropyBackward(TensorSpan dlogits, TensorSpan logits, TensorSpan lse,
                                   TensorSpan targets, TensorSpan dlosses, int N, int V, int Vp) {
  CHECK(V > 0 && V <= Vp) << "V=" << V << " Vp=" << Vp;
  CrossEntropyShardBackward(dlogits, logits, lse, targets, dlosses, N, V, Vp, 0);
}

}  // namespace cohort::compute
