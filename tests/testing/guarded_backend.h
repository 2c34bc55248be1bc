#pragma once
// GuardedBackend: the CPU backend's arithmetic behind memory the host may not
// touch, like a GPU's. host_memory() is false, and every buffer it allocates
// is mapped PROT_NONE except while one of its own calls runs, so any code
// that dereferences backend memory outside the backend (instead of going
// through CopyToHost / CopyFromHost, or the model's host staging) dies with
// SIGSEGV at that line; and every span an op or a copy is handed must lie in
// one of its buffers (CHECKed), so host memory passed where backend memory
// belongs fails too. The GPU path's staging is tested with it on machines
// without a GPU; its results are the CPU backend's bits.
//
// It also keeps the books of the weights' working copy (backend.h,
// AttachParams) a bf16 GPU backend keeps, without the copy: a write to the
// attached arena by anything but ClipAdamW makes the copy stale until
// RefreshParamCopy, and a linear layer that reads a weight from the arena
// while it is stale is counted (stale_weight_reads()): on a GPU it would
// have read an old copy.
//
// The asynchronous copies keep a GPU's timing where it matters to the
// caller: their host side must be AllocateHost memory (CHECKed); what
// CopyToHostAsync reads is taken when it is called but written to the host
// only at the next Synchronize (a caller that reads it earlier sees the old
// contents), and the source of a CopyFromHostAsync must be unchanged when
// the next Synchronize comes (CHECKed: a GPU's copy engine might read it
// any time until then). Synchronize calls are counted.
//
// Constructed over a bf16-mode CPU backend (CpuBackendOptions::
// activation_dtype), its activations are bf16 as a bf16 GPU's are.
//
// It keeps the books of device memory too: the bytes Allocate has handed
// out (the most at once, peak_bytes(), and the calls, allocations()), and a
// GPU's up-front reservation (ReserveDeviceMemory), refused past
// set_capacity() as a device without the room refuses it.
//
// It captures as a GPU does (backend.h, "Captured op sequences";
// guarded_capture.h): while a capture is open the ops are recorded, not
// run, the calls a CUDA graph cannot hold fail the capture, and a replay
// runs the recorded ops on the memory's contents at replay time.
//
// Header-only (tests link it without a library of their own).
// Thread-compatible, like every Backend.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "tests/testing/guarded_capture.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::testing {

class GuardedBackend final : public compute::Backend {
 public:
  explicit GuardedBackend(int num_threads = 1)
      : cpu_(compute::CpuBackendOptions{.num_threads = num_threads}) {}
  // Over a CPU backend of these options: with activation_dtype kBFloat16,
  // the bf16 activation storage a GPU keeps (cpu_backend.h), so that the
  // model's and the step's mixed-dtype orchestration run here too.
  explicit GuardedBackend(const compute::CpuBackendOptions& options) : cpu_(options) {}
  ~GuardedBackend() override { CHECK(regions_.empty()) << "buffers outlive their backend"; }

  std::string_view name() const override { return "guarded-cpu"; }
  compute::DType activation_dtype() const override { return cpu_.activation_dtype(); }
  bool host_memory() const override { return false; }

  absl::StatusOr<compute::Buffer> Allocate(compute::DType dtype, size_t numel) override {
    if (capture_.Forbid("Allocate")) return absl::FailedPreconditionError("Allocate in a capture");
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t bytes = std::max<size_t>(numel * compute::DTypeSize(dtype), 1);
    const size_t mapped = (bytes + page - 1) / page * page;
    void* data = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot map ", mapped, " bytes"));
    }
    regions_.emplace(data, mapped);  // fresh anonymous pages read as zero
    ++allocations_;
    live_bytes_ += bytes;
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
    return compute::Buffer(data, dtype, numel, [this, bytes](void* p) {
      auto region = regions_.find(p);
      CHECK(region != regions_.end());
      munmap(p, region->second);
      regions_.erase(region);
      live_bytes_ -= bytes;
    });
  }
  // A GPU's up-front reservation, without its memory: refused past
  // set_capacity() as a device without the room refuses it, recorded
  // otherwise (reserved_bytes()), a no-op once made.
  absl::Status ReserveDeviceMemory(size_t bytes) override {
    if (capture_.Forbid("ReserveDeviceMemory")) {
      return absl::FailedPreconditionError("ReserveDeviceMemory in a capture");
    }
    if (reserved_bytes_ > 0) return absl::OkStatus();
    if (bytes > capacity_) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot reserve ", bytes,
                                                       " bytes of device memory: ", capacity_,
                                                       " bytes free"));
    }
    reserved_bytes_ = bytes;
    return absl::OkStatus();
  }
  void set_capacity(size_t bytes) { capacity_ = bytes; }
  size_t reserved_bytes() const { return reserved_bytes_; }
  // The bytes Allocate has handed out: the most held at once, and all calls.
  size_t peak_bytes() const { return peak_bytes_; }
  size_t allocations() const { return allocations_; }
  // Host memory, not guarded (the model's staging copies live there), but
  // remembered: the asynchronous copies take only it.
  absl::StatusOr<compute::Buffer> AllocateHost(compute::DType dtype, size_t numel) override {
    if (capture_.Forbid("AllocateHost")) {
      return absl::FailedPreconditionError("AllocateHost in a capture");
    }
    ASSIGN_OR_RETURN(compute::Buffer inner, cpu_.AllocateHost(dtype, numel));
    void* data = inner.data();
    host_regions_->emplace(data, std::max<size_t>(numel * compute::DTypeSize(dtype), 1));
    auto owned = std::make_shared<compute::Buffer>(std::move(inner));
    // Host buffers may outlive the backend (plain memory): the books are
    // shared with them.
    return compute::Buffer(data, dtype, numel, [regions = host_regions_, owned](void* p) mutable {
      regions->erase(p);
      owned.reset();
    });
  }
  absl::Status ReserveScratch(const compute::PassShape& shape) override {
    if (capture_.Forbid("ReserveScratch")) {
      return absl::FailedPreconditionError("ReserveScratch in a capture");
    }
    capture_.BumpGeneration();  // a GPU's scratch may move
    return cpu_.ReserveScratch(shape);
  }
  void Zero(compute::TensorSpan dst) override {
    CheckSpans("Zero", dst);
    capture_.RunOrRecord("Zero", [=, this] {
      Open open(this);
      cpu_.Zero(dst);
      NoteWrite(dst);
    });
  }
  void CopyFromHost(compute::TensorSpan dst, const void* src) override {
    if (capture_.Forbid("CopyFromHost")) return;
    Open open(this);
    CheckSpans("CopyFromHost", dst);
    CHECK(Region(src) == nullptr) << "CopyFromHost: the source is backend memory";
    cpu_.CopyFromHost(dst, src);
    bytes_from_host_ += dst.bytes();
    NoteWrite(dst);
  }
  void CopyToHost(void* dst, compute::TensorSpan src) override {
    if (capture_.Forbid("CopyToHost")) return;
    Open open(this);
    CheckSpans("CopyToHost", src);
    CHECK(Region(dst) == nullptr) << "CopyToHost: the destination is backend memory";
    cpu_.CopyToHost(dst, src);
    bytes_to_host_ += src.bytes();
  }
  void CopyWithin(compute::TensorSpan dst, compute::TensorSpan src) override {
    CheckSpans("CopyWithin", dst, src);
    capture_.RunOrRecord("CopyWithin", [=, this] {
      Open open(this);
      cpu_.CopyWithin(dst, src);
      NoteWrite(dst);
    });
  }
  absl::Status AttachParams(compute::TensorSpan params,
                            const std::vector<compute::ParamBlock>& blocks) override {
    if (capture_.Forbid("AttachParams")) {
      return absl::FailedPreconditionError("AttachParams in a capture");
    }
    capture_.BumpGeneration();  // a GPU's working copy moves
    CheckSpans("AttachParams", params);
    RETURN_IF_ERROR(cpu_.AttachParams(params, blocks));
    attached_ = params;
    copy_stale_ = false;  // made now
    ++param_copy_refreshes_;
    return absl::OkStatus();
  }
  void RefreshParamCopy() override {
    capture_.RunOrRecord("RefreshParamCopy", [this] {
      if (attached_.empty()) return;
      copy_stale_ = false;
      ++param_copy_refreshes_;
    });
  }
  void DetachParams(compute::TensorSpan params) override {
    capture_.Forbid("DetachParams");  // fails a capture, and detaches all the same
    if (params.data != attached_.data) return;
    capture_.BumpGeneration();
    attached_ = compute::TensorSpan{};
    copy_stale_ = false;
  }
  // The working copy's books (see the class comment).
  bool params_attached() const { return !attached_.empty(); }
  size_t param_copy_refreshes() const { return param_copy_refreshes_; }
  size_t stale_weight_reads() const { return stale_weight_reads_; }
  void CopyFromHostAsync(compute::TensorSpan dst, const void* src) override {
    CHECK(InHostRegion(src, dst.bytes()))
        << "CopyFromHostAsync: the source is not AllocateHost memory";
    // Replayed, it reads the host buffer then (backend.h).
    capture_.RunOrRecord("CopyFromHostAsync", [=, this] {
      CopyFromHost(dst, src);
      const auto* bytes = static_cast<const char*>(src);
      pending_uploads_.push_back({src, std::vector<char>(bytes, bytes + dst.bytes())});
    });
  }
  void CopyToHostAsync(void* dst, compute::TensorSpan src) override {
    CheckSpans("CopyToHostAsync", src);
    CHECK(InHostRegion(dst, src.bytes()))
        << "CopyToHostAsync: the destination is not AllocateHost memory";
    capture_.RunOrRecord("CopyToHostAsync", [=, this] {
      Open open(this);
      const auto* bytes = static_cast<const char*>(src.data);
      pending_downloads_.push_back({dst, std::vector<char>(bytes, bytes + src.bytes())});
      bytes_to_host_ += src.bytes();
    });
  }
  // The side copy's GPU timing: what it reads is taken when it is called
  // and written to `dst` only when its Wait() runs (on any thread: it
  // touches host memory only); a Zero, CopyWithin or copy from the host
  // into its source before then CHECK-fails, as a GPU's side stream could
  // read the new bytes.
  std::unique_ptr<compute::SideCopy> CopyToHostSide(void* dst, compute::TensorSpan src) override {
    if (capture_.Forbid("CopyToHostSide")) {  // as CUDA: the capture fails, the copy too
      struct Refused final : compute::SideCopy {
        absl::Status Wait() override {
          return absl::FailedPreconditionError("CopyToHostSide during a capture");
        }
      };
      return std::make_unique<Refused>();
    }
    Open open(this);
    CheckSpans("CopyToHostSide", src);
    CHECK(InHostRegion(dst, src.bytes()))
        << "CopyToHostSide: the destination is not AllocateHost memory";
    const auto* bytes = static_cast<const char*>(src.data);
    auto copy = std::make_shared<SideCopyState>();
    copy->source = src;
    copy->host = dst;
    copy->bytes.assign(bytes, bytes + src.bytes());
    std::erase_if(side_copies_, [](const auto& c) { return c->done.load(); });
    side_copies_.push_back(copy);
    bytes_to_host_ += src.bytes();
    ++side_copy_calls_;
    return std::make_unique<GuardedSideCopy>(std::move(copy));
  }
  size_t side_copy_calls() const { return side_copy_calls_; }
  absl::Status Synchronize() override {
    if (capture_.Forbid("Synchronize")) {
      return absl::FailedPreconditionError("Synchronize in a capture");
    }
    ++synchronizations_;
    for (const PendingCopy& upload : pending_uploads_) {
      CHECK(std::memcmp(upload.host, upload.bytes.data(), upload.bytes.size()) == 0)
          << "the source of a CopyFromHostAsync changed before the next Synchronize";
    }
    pending_uploads_.clear();
    for (const PendingCopy& download : pending_downloads_) {
      std::memcpy(const_cast<void*>(download.host), download.bytes.data(), download.bytes.size());
    }
    pending_downloads_.clear();
    return cpu_.Synchronize();
  }
  size_t synchronizations() const { return synchronizations_; }

  // Captures (guarded_capture.h).
  bool SupportsCapture() const override { return true; }
  absl::Status BeginCapture() override { return capture_.Begin(); }
  absl::StatusOr<std::unique_ptr<compute::CapturedOps>> EndCapture() override {
    return capture_.End(this);
  }
  absl::Status Replay(const compute::CapturedOps& ops) override {
    return capture_.Replay(this, ops);
  }
  size_t captures() const { return capture_.captures(); }
  size_t replays() const { return capture_.replays(); }
  // Makes op `name` ("AttentionForward") fail a capture, as an op a GPU
  // cannot record would.
  void set_uncapturable_op(std::string name) { capture_.set_uncapturable_op(std::move(name)); }
  // Bytes moved by CopyFromHost and CopyToHost since the backend was made:
  // what a GPU would move over PCIe (tests of the device-resident step).
  size_t bytes_from_host() const { return bytes_from_host_; }
  size_t bytes_to_host() const { return bytes_to_host_; }

  // Every op: its spans must be this backend's memory (host memory passed
  // to an op would be read as device memory on a GPU), and the memory
  // opens for the inner CPU backend's call only; while capturing, the call
  // is recorded for replays instead. The unsharded encoder and
  // cross-entropy backward are Backend's defaults over the guarded shard ops.
#define COHORT_GUARDED(op, ...)         \
  CheckSpans(#op, __VA_ARGS__);         \
  capture_.RunOrRecord(#op, [=, this] { \
    Open open(this);                    \
    cpu_.op(__VA_ARGS__);               \
  })
  void LayerNormForward(compute::TensorSpan out, compute::TensorSpan mean, compute::TensorSpan rstd,
                        compute::TensorSpan inp, compute::TensorSpan weight,
                        compute::TensorSpan bias, int N, int C) override {
    COHORT_GUARDED(LayerNormForward, out, mean, rstd, inp, weight, bias, N, C);
  }
  void LayerNormBackward(compute::TensorSpan dinp, compute::TensorSpan dweight,
                         compute::TensorSpan dbias, compute::TensorSpan dout,
                         compute::TensorSpan inp, compute::TensorSpan weight,
                         compute::TensorSpan mean, compute::TensorSpan rstd, int N,
                         int C) override {
    COHORT_GUARDED(LayerNormBackward, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void MatmulForward(compute::TensorSpan out, compute::TensorSpan inp, compute::TensorSpan weight,
                     compute::TensorSpan bias, int N, int C, int OC) override {
    capture_.RunOrRecord("MatmulForward", [=, this] { NoteWeightRead(weight); });
    COHORT_GUARDED(MatmulForward, out, inp, weight, bias, N, C, OC);
  }
  void MatmulBackward(compute::TensorSpan dinp, compute::TensorSpan dweight,
                      compute::TensorSpan dbias, compute::TensorSpan dout, compute::TensorSpan inp,
                      compute::TensorSpan weight, int N, int C, int OC) override {
    capture_.RunOrRecord("MatmulBackward", [=, this] { NoteWeightRead(weight); });
    COHORT_GUARDED(MatmulBackward, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void MatmulGeluForward(compute::TensorSpan out, compute::TensorSpan pre, compute::TensorSpan inp,
                         compute::TensorSpan weight, compute::TensorSpan bias, int N, int C,
                         int OC) override {
    COHORT_GUARDED(MatmulGeluForward, out, pre, inp, weight, bias, N, C, OC);
  }
  void MatmulGeluBackward(compute::TensorSpan dpre, compute::TensorSpan dpre_bias,
                          compute::TensorSpan dweight, compute::TensorSpan dbias,
                          compute::TensorSpan dout, compute::TensorSpan act,
                          compute::TensorSpan pre, compute::TensorSpan weight, int N, int C,
                          int OC) override {
    COHORT_GUARDED(MatmulGeluBackward, dpre, dpre_bias, dweight, dbias, dout, act, pre, weight, N,
                   C, OC);
  }
  void ResidualLayerNormForward(compute::TensorSpan residual_out, compute::TensorSpan out,
                                compute::TensorSpan mean, compute::TensorSpan rstd,
                                compute::TensorSpan inp1, compute::TensorSpan inp2,
                                compute::TensorSpan weight, compute::TensorSpan bias, int N,
                                int C) override {
    COHORT_GUARDED(ResidualLayerNormForward, residual_out, out, mean, rstd, inp1, inp2, weight,
                   bias, N, C);
  }
  size_t AttentionStateNumel(int B, int T, int C, int NH) const override {
    return cpu_.AttentionStateNumel(B, T, C, NH);
  }
  void AttentionForward(compute::TensorSpan out, compute::TensorSpan state, compute::TensorSpan qkv,
                        int B, int T, int C, int NH) override {
    COHORT_GUARDED(AttentionForward, out, state, qkv, B, T, C, NH);
  }
  void AttentionBackward(compute::TensorSpan dqkv, compute::TensorSpan dout,
                         compute::TensorSpan qkv, compute::TensorSpan state, int B, int T, int C,
                         int NH) override {
    COHORT_GUARDED(AttentionBackward, dqkv, dout, qkv, state, B, T, C, NH);
  }
  void GeluForward(compute::TensorSpan out, compute::TensorSpan inp, size_t n) override {
    COHORT_GUARDED(GeluForward, out, inp, n);
  }
  void GeluBackward(compute::TensorSpan dinp, compute::TensorSpan inp, compute::TensorSpan dout,
                    size_t n) override {
    COHORT_GUARDED(GeluBackward, dinp, inp, dout, n);
  }
  void ResidualForward(compute::TensorSpan out, compute::TensorSpan inp1, compute::TensorSpan inp2,
                       size_t n) override {
    COHORT_GUARDED(ResidualForward, out, inp1, inp2, n);
  }
  void ResidualBackward(compute::TensorSpan dinp1, compute::TensorSpan dinp2,
                        compute::TensorSpan dout, size_t n) override {
    COHORT_GUARDED(ResidualBackward, dinp1, dinp2, dout, n);
  }
  void CrossEntropyForward(compute::TensorSpan losses, compute::TensorSpan lse,
                           compute::TensorSpan logits, compute::TensorSpan targets, int N, int V,
                           int Vp) override {
    COHORT_GUARDED(CrossEntropyForward, losses, lse, logits, targets, N, V, Vp);
  }
  void EncoderForwardShard(compute::TensorSpan out, compute::TensorSpan inp,
                           compute::TensorSpan wte, compute::TensorSpan wpe, int vocab_start,
                           int Vs, int B, int T, int C) override {
    COHORT_GUARDED(EncoderForwardShard, out, inp, wte, wpe, vocab_start, Vs, B, T, C);
  }
  void EncoderBackwardShard(compute::TensorSpan dwte, compute::TensorSpan dwpe,
                            compute::TensorSpan dout, compute::TensorSpan inp, int vocab_start,
                            int Vs, int B, int T, int C) override {
    COHORT_GUARDED(EncoderBackwardShard, dwte, dwpe, dout, inp, vocab_start, Vs, B, T, C);
  }
  void CrossEntropyShardMax(compute::TensorSpan row_max, compute::TensorSpan logits, int N, int V,
                            int Vs, int vocab_start) override {
    COHORT_GUARDED(CrossEntropyShardMax, row_max, logits, N, V, Vs, vocab_start);
  }
  void CrossEntropyShardSums(compute::TensorSpan sums, compute::TensorSpan logits,
                             compute::TensorSpan row_max, compute::TensorSpan targets, int N, int V,
                             int Vs, int vocab_start) override {
    COHORT_GUARDED(CrossEntropyShardSums, sums, logits, row_max, targets, N, V, Vs, vocab_start);
  }
  void CrossEntropyShardFinish(compute::TensorSpan losses, compute::TensorSpan lse,
                               compute::TensorSpan row_max, compute::TensorSpan sums,
                               int N) override {
    COHORT_GUARDED(CrossEntropyShardFinish, losses, lse, row_max, sums, N);
  }
  void CrossEntropyShardBackward(compute::TensorSpan dlogits, compute::TensorSpan logits,
                                 compute::TensorSpan lse, compute::TensorSpan targets,
                                 compute::TensorSpan dlosses, int N, int V, int Vs,
                                 int vocab_start) override {
    COHORT_GUARDED(CrossEntropyShardBackward, dlogits, logits, lse, targets, dlosses, N, V, Vs,
                   vocab_start);
  }
  void SumOfSquaresPieces(compute::TensorSpan sums, compute::TensorSpan grads,
                          compute::TensorSpan pieces) override {
    COHORT_GUARDED(SumOfSquaresPieces, sums, grads, pieces);
  }
  void FinishGradNorm(compute::TensorSpan scalars, compute::TensorSpan sums,
                      double max_norm) override {
    COHORT_GUARDED(FinishGradNorm, scalars, sums, max_norm);
  }
  void SumLosses(compute::TensorSpan sum, compute::TensorSpan losses) override {
    COHORT_GUARDED(SumLosses, sum, losses);
  }
  void SkipUpdateUnlessFinite(compute::TensorSpan scalars, compute::TensorSpan values) override {
    COHORT_GUARDED(SkipUpdateUnlessFinite, scalars, values);
  }
  void ClipAdamW(compute::TensorSpan params, compute::TensorSpan m, compute::TensorSpan v,
                 compute::TensorSpan grads, compute::TensorSpan scalars, size_t begin, size_t end,
                 size_t moment_base, bool decay, const compute::AdamWScalars& adamw) override {
    COHORT_GUARDED(ClipAdamW, params, m, v, grads, scalars, begin, end, moment_base, decay, adamw);
  }
#undef COHORT_GUARDED

 private:
  // The live buffer holding `address`, or nullptr.
  const std::pair<void* const, size_t>* Region(const void* address) const {
    auto it = regions_.upper_bound(const_cast<void*>(address));
    if (it == regions_.begin()) return nullptr;
    --it;
    const auto* begin = static_cast<const char*>(it->first);
    return static_cast<const char*>(address) < begin + it->second ? &*it : nullptr;
  }
  // Every non-empty TensorSpan argument lies inside one live buffer.
  template <typename... Args>
  void CheckSpans(const char* op, const Args&... args) const {
    (CheckSpan(op, args), ...);
  }
  template <typename Arg>
  void CheckSpan(const char* op, const Arg& arg) const {
    if constexpr (std::is_same_v<Arg, compute::TensorSpan>) {
      if (arg.empty()) return;
      const auto* region = Region(arg.data);
      CHECK(region != nullptr) << op << ": a span that is not this backend's memory";
      const auto* end = static_cast<const char*>(arg.data) + arg.bytes();
      CHECK(end <= static_cast<const char*>(region->first) + region->second)
          << op << ": a span past the end of its buffer";
    }
  }

  // Opens every buffer for reading and writing for its lifetime.
  class Open {
   public:
    explicit Open(GuardedBackend* backend) : backend_(backend) {
      backend_->Protect(PROT_READ | PROT_WRITE);
    }
    ~Open() { backend_->Protect(PROT_NONE); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    GuardedBackend* backend_;
  };

  // Whether [address, address + bytes) lies in one AllocateHost buffer.
  bool InHostRegion(const void* address, size_t bytes) const {
    auto it = host_regions_->upper_bound(const_cast<void*>(address));
    if (it == host_regions_->begin()) return false;
    --it;
    const auto* begin = static_cast<const char*>(it->first);
    return static_cast<const char*>(address) + bytes <= begin + it->second;
  }
  bool InAttached(const compute::TensorSpan& span) const {
    if (attached_.empty() || span.empty()) return false;
    const auto* begin = static_cast<const char*>(attached_.data);
    const auto* data = static_cast<const char*>(span.data);
    return data + span.bytes() > begin && data < begin + attached_.bytes();
  }
  void NoteWrite(const compute::TensorSpan& dst) {
    if (InAttached(dst)) copy_stale_ = true;
    for (const auto& copy : side_copies_) {
      CHECK(copy->done.load() || !Overlap(copy->source, dst))
          << "backend memory written while a side copy still reads it (CopyToHostSide)";
    }
  }
  static bool Overlap(const compute::TensorSpan& a, const compute::TensorSpan& b) {
    const auto* a0 = static_cast<const char*>(a.data);
    const auto* b0 = static_cast<const char*>(b.data);
    return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
  }
  void NoteWeightRead(const compute::TensorSpan& weight) {
    if (copy_stale_ && InAttached(weight)) ++stale_weight_reads_;
  }

  void Protect(int protection) {
    for (const auto& [data, bytes] : regions_) CHECK(mprotect(data, bytes, protection) == 0);
  }

  compute::CpuBackend cpu_;
  std::map<void*, size_t> regions_;  // live buffers: address -> mapped bytes
  size_t bytes_from_host_ = 0;
  size_t bytes_to_host_ = 0;
  // Live AllocateHost buffers: address -> bytes.
  std::shared_ptr<std::map<void*, size_t>> host_regions_ =
      std::make_shared<std::map<void*, size_t>>();
  // An asynchronous copy waiting for the next Synchronize: the host side
  // and the bytes (a download's, to write then; an upload's, to compare).
  struct PendingCopy {
    const void* host;
    std::vector<char> bytes;
  };
  std::vector<PendingCopy> pending_uploads_, pending_downloads_;
  // A side copy until its Wait: its source, its destination and the bytes
  // taken at the call. Shared with the handle, which may wait on another
  // thread (hence `done` is atomic and the backend only reads it).
  struct SideCopyState {
    compute::TensorSpan source;
    void* host = nullptr;
    std::vector<char> bytes;
    std::atomic<bool> done{false};
  };
  class GuardedSideCopy final : public compute::SideCopy {
   public:
    explicit GuardedSideCopy(std::shared_ptr<SideCopyState> state) : state_(std::move(state)) {}
    // A GPU's handle waits for its copy when it goes: so does this one.
    ~GuardedSideCopy() override {
      if (!state_->done.load()) Land();
    }
    absl::Status Wait() override {
      CHECK(!state_->done.load()) << "SideCopy::Wait called twice";
      Land();
      return absl::OkStatus();
    }

   private:
    void Land() {
      std::memcpy(state_->host, state_->bytes.data(), state_->bytes.size());
      state_->done.store(true);
    }

    std::shared_ptr<SideCopyState> state_;
  };
  std::vector<std::shared_ptr<SideCopyState>> side_copies_;
  size_t side_copy_calls_ = 0;
  size_t synchronizations_ = 0;
  compute::TensorSpan attached_;  // AttachParams' arena; empty: none
  bool copy_stale_ = false;
  size_t param_copy_refreshes_ = 0;
  size_t stale_weight_reads_ = 0;
  size_t capacity_ = ~size_t{0};
  size_t reserved_bytes_ = 0;
  size_t live_bytes_ = 0;  // requested bytes, not the mapped pages
  size_t peak_bytes_ = 0;
  size_t allocations_ = 0;
  CaptureRecorder capture_;
};

}  // namespace cohort::testing
