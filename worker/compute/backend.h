#pragma once
// Backend: the layer kernels one GPT training step needs, forward beside
// backward (the llm.c set: encoder, layernorm, matmul, attention, GELU,
// residual, softmax + cross-entropy), plus the little memory management the
// model needs around them. Implementations: CpuBackend (fp32, OpenBLAS and
// OpenMP) and CudaBackend (cuda_backend.h: device memory, cuBLASLt and the
// kernels of cuda_kernels.h); the tests' GuardedBackend
// (tests/testing/guarded_backend.h) runs the CPU kernels on memory the host
// may not touch, to check the callers.
//
// Memory. Every tensor argument is a TensorSpan: a typed, non-owning view of
// backend memory (host memory for CpuBackend, device memory for a GPU
// backend), obtained from a Buffer that Allocate() returned. The model never
// dereferences spans of a backend it does not know to be host-resident; it
// moves data with CopyFromHost / CopyToHost. Ops are asynchronous with
// respect to the host on a device backend: Synchronize() waits for them and
// reports the first failure. Shape or dtype mismatches are programmer errors
// (CHECK), never a Status.
//
// Shapes use llm.c's letters: B batch, T time, C channels, NH heads,
// OC output channels, N = B*T rows, V real vocab, Vp padded vocab.
// Weights are stored (OC, C) as in llm.c and PyTorch's nn.Linear: y = x W^T + b.
//
// Gradients ACCUMULATE: every backward op adds into its d* outputs (dinp,
// dweight, dbias ...), so the caller zeroes them first where it wants a plain
// result; the exceptions are the outputs that only make sense written (the
// dlogits of CrossEntropyBackward and CrossEntropyShardBackward). An empty
// span (data == nullptr) marks an optional output or input as absent where
// noted.
//
// Activation storage. activation_dtype() is the dtype of every ACTIVATION
// span the ops take: the encoder's output; LayerNorm's inp and out; a
// linear layer's inp, out, dinp and dout; MatmulGelu's out, pre, act, dpre
// and dout; attention's qkv, out, dqkv and dout; GELU's and the residual
// ops' operands; the logits and dlogits of every cross-entropy op; the
// encoder backward's dout. Everything else is fp32 whatever that dtype is:
// parameters and their gradients (weight, bias, wte, wpe and their d*),
// the statistics (LayerNorm's mean and rstd, losses, lse, row_max, sums,
// dlosses), attention's state (AttentionStateNumel counts fp32 elements),
// and the optimizer ops' operands; token ids are int32. ResidualForward
// also runs on fp32 parameter-gradient arenas (the gradient tree's folds):
// its three spans share one dtype, fp32 or the activation dtype.
// With bf16 activations an op computes exactly as with fp32 ones, in fp32:
// it widens what it reads (exact) and rounds to nearest even only what it
// stores, once; an accumulating output (+=) is widened, added to in fp32 and
// rounded once. The matmuls read bf16 activations as operands directly (no
// rounding pass) and write bf16 outputs from their fp32 accumulators; the
// parameter gradients they produce stay fp32. Spans of another dtype than
// an op expects are programmer errors (CHECK), as any shape mismatch.
//
// Determinism: for a given backend and options, every op is bitwise
// reproducible run to run. CpuBackend is additionally bitwise independent of
// its thread count.
//
// Thread-safety: thread-compatible. One backend per worker, called from one
// thread at a time; it may keep scratch memory between calls.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/compute/adamw_math.h"
#include "worker/compute/param_copy_layout.h"

namespace cohort::compute {

enum class DType : uint8_t { kFloat32, kBFloat16, kInt32, kFloat64, kInt64 };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

// `numel` elements of `dtype` at `data` in backend memory. Copyable; does not
// own the memory. A default-constructed span is empty (data == nullptr).
struct TensorSpan {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  size_t numel = 0;

  bool empty() const { return data == nullptr; }
  size_t bytes() const { return numel * DTypeSize(dtype); }
  // Elements [offset, offset + count). CHECKs that they lie inside this span.
  TensorSpan Slice(size_t offset, size_t count) const;
};

// Owning handle to backend memory; frees it through the function the backend
// supplied. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, DType dtype, size_t numel, std::function<void(void*)> release);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  TensorSpan span() const { return TensorSpan{data_, dtype_, numel_}; }
  TensorSpan Slice(size_t offset, size_t count) const { return span().Slice(offset, count); }
  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  size_t numel() const { return numel_; }

 private:
  void Release();

  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  size_t numel_ = 0;
  std::function<void(void*)> release_;
};

// The largest passes a model will run: what a backend needs to reserve the
// scratch its ops keep between calls (Backend::ReserveScratch).
struct PassShape {
  int max_batch = 0;         // B
  int max_seq = 0;           // T
  int attention_width = 0;   // channels of this rank's heads (C / tp)
  int heads = 0;             // this rank's heads (NH / tp)
  int max_bias_columns = 0;  // the widest output of a matmul with a bias, or of a LayerNorm
  int vocab_rows = 0;        // Vs, rows of this rank's wte; 0 without the embedding
  int head_rows = 0;         // Vs on the stage with the LM head; 0 elsewhere
  int width = 0;             // C, the model's channels
};

// A copy from backend memory to the host that runs beside the step's ops
// (Backend::CopyToHostSide). Wait() blocks until it is done and returns its
// status (Internal for a device fault, or the failure an op before it left
// pending); unlike the backend, it may be called from any thread (a
// checkpoint's uploader waits for the drain of its snapshot), once. The
// backend must outlive it.
class SideCopy {
 public:
  virtual ~SideCopy() = default;
  virtual absl::Status Wait() = 0;
};

// Ops a backend recorded between BeginCapture and EndCapture (on a GPU an
// instantiated CUDA graph), replayed with Backend::Replay. Owned by the
// caller, who destroys it before its backend; only the backend that made it
// replays it.
class CapturedOps {
 public:
  virtual ~CapturedOps() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda", ...: for logs and metrics.
  virtual std::string_view name() const = 0;
  // The dtype activations are stored in (see "Activation storage" above):
  // fp32, or bf16 on a GPU backend computing in bf16.
  virtual DType activation_dtype() const = 0;

  // ---- Memory -------------------------------------------------------------
  // Whether spans of this backend are host memory the caller may read and
  // write directly (the CPU's); false for device memory (a GPU's), which
  // moves only through CopyFromHost / CopyToHost.
  virtual bool host_memory() const = 0;
  // A zero-filled buffer of `numel` elements. ResourceExhausted when the
  // memory is not available.
  virtual absl::StatusOr<Buffer> Allocate(DType dtype, size_t numel) = 0;
  // A zero-filled buffer of HOST memory that CopyFromHost and CopyToHost
  // move fastest (page-locked on a GPU, where pageable memory takes a
  // staging copy and half the bandwidth; plain memory on the CPU). For the
  // host copies a model stages through. ResourceExhausted as Allocate.
  virtual absl::StatusOr<Buffer> AllocateHost(DType dtype, size_t numel) = 0;
  // dst[:] = 0.
  virtual void Zero(TensorSpan dst) = 0;
  // dst[:] = src[0 .. dst.numel) (host memory, same dtype).
  virtual void CopyFromHost(TensorSpan dst, const void* src) = 0;
  // dst[0 .. src.numel) = src[:] (host memory, same dtype).
  virtual void CopyToHost(void* dst, TensorSpan src) = 0;
  // Asynchronous copies between backend memory and host memory from
  // AllocateHost (page-locked on a GPU: the copy engine moves it while the
  // host goes on, where pageable memory makes the driver stage the copy and
  // wait). Ordered with the ops like every op; neither waits.
  // CopyFromHostAsync reads `src` when the copy runs, so the caller leaves
  // it unchanged until its next Synchronize returns; CopyToHostAsync writes
  // `dst` when the copy runs, so the caller reads it only after its next
  // Synchronize returns. The defaults are the synchronous copies, which keep
  // both promises (the CPU's).
  virtual void CopyFromHostAsync(TensorSpan dst, const void* src) { CopyFromHost(dst, src); }
  virtual void CopyToHostAsync(void* dst, TensorSpan src) { CopyToHost(dst, src); }
  // dst[:] = src[0 .. dst.numel), both backend memory of the same dtype, not
  // overlapping; every bit kept (negative zeros and NaN payloads too).
  virtual void CopyWithin(TensorSpan dst, TensorSpan src) = 0;
  // Reserves now the scratch that ops on passes up to `shape` keep between
  // calls, so that running out shows when a model is built, not mid-step.
  // ResourceExhausted naming the bytes when the memory is not there.
  virtual absl::Status ReserveScratch(const PassShape& shape) = 0;
  // The bytes of backend memory ReserveScratch(shape) takes (0 where the ops
  // keep none there). It settles what ReserveScratch would settle (a GPU
  // backend's choice of attention), so memory sized from it is the memory
  // the model then takes. Errors: ReserveScratch's, but for the shortage.
  virtual absl::StatusOr<size_t> ScratchBytes(const PassShape& shape) { return size_t{0}; }
  // Reserves `bytes` of backend memory at once, from which the buffers,
  // scratch and working copy asked for later are carved: a training session
  // sized up front (TrainingSession::Create) meets a shortage when it is
  // built, as ResourceExhausted naming the bytes asked and those free, not
  // in a step. An allocation the reservation cannot hold is taken outside it
  // where the device has the memory, logged once (an estimate that fell
  // short), rather than failing a job that fits. Once per backend (later
  // calls are no-ops); nothing on backends of host memory.
  virtual absl::Status ReserveDeviceMemory(size_t bytes) { return absl::OkStatus(); }
  // Waits for every op issued so far; the first failure since the last call
  // (Internal for device faults). Always OK on the CPU.
  virtual absl::Status Synchronize() = 0;
  // Copies `src` (backend memory) to `dst` (AllocateHost memory of at least
  // src.bytes()) off the step's critical path: on a GPU, on a stream of its
  // own that starts once every op issued before the call has run and then
  // runs beside the ops issued after it. So none of those may write `src`
  // until the handle's Wait() returns (the caller drains a snapshot it made
  // with CopyWithin, not the live state), and `dst` is read only after
  // Wait() returns. Neither the call nor later ops wait for it. The default
  // (the CPU's) copies at once and returns a handle that is already done.
  virtual std::unique_ptr<SideCopy> CopyToHostSide(void* dst, TensorSpan src);

  // The weights' working copy. A backend whose GEMMs take bf16 operands
  // would otherwise round every fp32 weight to bf16 on every GEMM call.
  // AttachParams hands it the parameter arena `params` (fp32, this backend's
  // memory, alive until DetachParams) and the `blocks` of it that GEMMs read
  // as matrices; the backend then keeps a bf16 copy of those blocks
  // (param_copy_layout.h), made here, and a GEMM operand that is whole rows
  // of one block is read from the copy: the same bits the per-call rounding
  // gives. ClipAdamW over exactly `params` writes the copy of every element
  // it updates in the same pass; any other change of `params` (a copy from
  // the host, CopyWithin, Zero) must be followed by RefreshParamCopy before
  // the next GEMM reads a weight. A second AttachParams replaces the first.
  // InvalidArgument for blocks that ParamCopyLayout refuses (checked on
  // every backend); ResourceExhausted when the copy does not fit. Backends
  // whose GEMMs round nothing (the CPU, fp32 and tf32 CUDA) keep no copy:
  // the defaults only check the blocks.
  virtual absl::Status AttachParams(TensorSpan params, const std::vector<ParamBlock>& blocks);
  // The backend memory AttachParams takes for an arena of `params_numel`
  // elements and these blocks (0 where the backend keeps no copy, or the
  // blocks are refused).
  virtual size_t ParamCopyBytes(size_t params_numel, const std::vector<ParamBlock>& blocks) const {
    return 0;
  }
  // Rounds the attached blocks into the copy again (nothing when none is
  // attached). Ordered after the ops issued before it, like every op.
  virtual void RefreshParamCopy() {}
  // Forgets the arena and frees its copy if `params` is the attached arena
  // (nothing otherwise, so that an owner that was replaced cannot detach its
  // successor's); GEMMs round per call again. Call it before the arena's
  // buffer is freed.
  virtual void DetachParams(TensorSpan params) {}

  // ---- Captured op sequences (CUDA graphs) ---------------------------------
  // A backend that SupportsCapture() records the ops issued between
  // BeginCapture() and EndCapture() instead of running them, and replays
  // them later as one launch (a GPU saves a launch per op: a small
  // micro-batch's step is otherwise bound by them). Nothing runs while
  // capturing: the caller replays what EndCapture returns to run it.
  //
  // What a capture may hold: ops, Zero, CopyWithin, RefreshParamCopy, and
  // the asynchronous copies with AllocateHost memory. A call a GPU cannot
  // record fails the capture instead of running: Synchronize (which returns
  // FailedPrecondition), the synchronous CopyFromHost and CopyToHost,
  // Allocate, AllocateHost, ReserveScratch, ReserveDeviceMemory,
  // AttachParams, DetachParams, Replay, and an op whose scratch would have
  // to grow (the first pass of a shape may grow it: run a shape once
  // directly before capturing it).
  //
  // What a replay reads: the ops' arguments as they were issued (spans,
  // shapes, scalars), so the same addresses; and the CONTENTS of that memory
  // when the replay runs, host staging included: an asynchronous copy from
  // AllocateHost memory reads the host buffer when replayed, with
  // CopyFromHostAsync's promise (left unchanged until the next Synchronize).
  // So whatever varies between replays is written into the captured
  // buffers, outside the capture, before the replay.
  //
  // Errors: a capture that fails (a forbidden call above, an op the device
  // refused to record) ends in EndCapture with the reason and leaves the
  // backend as usable as before BeginCapture; the caller then runs the ops
  // directly (and logs it once). Ops' ordinary failures while replaying are
  // pending as every op's, for Synchronize.
  //
  // Whether BeginCapture can succeed here; false on the CPU, whose ops have
  // no launch to save (the caller runs them directly).
  virtual bool SupportsCapture() const { return false; }
  // Starts recording. FailedPrecondition while a capture is open;
  // Unimplemented where !SupportsCapture(); a failure pending from earlier
  // ops is returned and left pending.
  virtual absl::Status BeginCapture();
  // Ends the open capture: its ops, or why it failed (FailedPrecondition
  // naming the forbidden call, Internal for a device's refusal), with
  // nothing recorded kept. FailedPrecondition without an open capture.
  virtual absl::StatusOr<std::unique_ptr<CapturedOps>> EndCapture();
  // Runs `ops` (this backend's) on the current contents of its memory,
  // ordered with the ops like every op. FailedPrecondition, with nothing
  // run, when the capture is stale: memory the backend keeps for itself
  // moved since it was recorded (scratch that grew, a working copy attached
  // again); the caller then runs the ops directly and may capture again.
  virtual absl::Status Replay(const CapturedOps& ops);

  // ---- Encoder ------------------------------------------------------------
  // out (B,T,C) = wte[inp[b,t], :] + wpe[t, :].   inp (B,T) int32, every id
  // < Vp (the caller validates); wte (Vp,C); wpe (maxT,C), T <= maxT.
  virtual void EncoderForward(TensorSpan out, TensorSpan inp, TensorSpan wte, TensorSpan wpe, int B,
                              int T, int C);
  // dwte[inp[b,t], :] += dout[b,t,:];  dwpe[t,:] += sum_b dout[b,t,:].
  // Both default to the shard ops below over the whole table (vocab_start 0,
  // Vs = Vp), which give the same bits.
  virtual void EncoderBackward(TensorSpan dwte, TensorSpan dwpe, TensorSpan dout, TensorSpan inp,
                               int B, int T, int C);

  // ---- LayerNorm over the last dim (eps 1e-5) -----------------------------
  // out (N,C) = (inp - mean) * rstd * weight + bias; saves mean (N), rstd (N).
  virtual void LayerNormForward(TensorSpan out, TensorSpan mean, TensorSpan rstd, TensorSpan inp,
                                TensorSpan weight, TensorSpan bias, int N, int C) = 0;
  // dinp (N,C) += ..., dweight (C) += ..., dbias (C) += ...
  virtual void LayerNormBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias,
                                 TensorSpan dout, TensorSpan inp, TensorSpan weight,
                                 TensorSpan mean, TensorSpan rstd, int N, int C) = 0;
  // A residual add fused with the LayerNorm that reads its sum (the model's
  // residual2 -> ln2 and residual3 -> the next layer's ln1):
  // residual_out (N,C) = inp1 + inp2, then LayerNormForward(out, mean, rstd,
  // residual_out, weight, bias). WRITES every output; residual_out may be
  // neither input. The default runs ResidualForward then LayerNormForward,
  // so the CPU's bits are those two ops'; a GPU reads the sum from
  // registers instead of reading it back.
  virtual void ResidualLayerNormForward(TensorSpan residual_out, TensorSpan out, TensorSpan mean,
                                        TensorSpan rstd, TensorSpan inp1, TensorSpan inp2,
                                        TensorSpan weight, TensorSpan bias, int N, int C);

  // ---- Linear -------------------------------------------------------------
  // out (N,OC) = inp (N,C) weight^T + bias.  weight (OC,C); bias (OC) or empty.
  virtual void MatmulForward(TensorSpan out, TensorSpan inp, TensorSpan weight, TensorSpan bias,
                             int N, int C, int OC) = 0;
  // dinp (N,C) += dout weight (empty: not needed);  dweight (OC,C) += dout^T inp;
  // dbias (OC) += sum_n dout[n,:] (empty when there is no bias).
  virtual void MatmulBackward(TensorSpan dinp, TensorSpan dweight, TensorSpan dbias,
                              TensorSpan dout, TensorSpan inp, TensorSpan weight, int N, int C,
                              int OC) = 0;

  // ---- Linear fused with GELU ----------------------------------------------
  // The MLP's two halves with the activation between them, in one op each
  // (a GPU folds bias, GELU and their gradients into the GEMMs' epilogues).
  // pre (N,OC) = inp (N,C) weight^T + bias (bias (OC) or empty), kept for the
  // backward; out (N,OC) = gelu(pre). WRITES both. The default runs
  // MatmulForward then GeluForward: the CPU's bits are those two ops'.
  virtual void MatmulGeluForward(TensorSpan out, TensorSpan pre, TensorSpan inp, TensorSpan weight,
                                 TensorSpan bias, int N, int C, int OC);
  // The backward of y = gelu(pre) weight^T + bias, for weight (OC,C) and
  // act = gelu(pre) (N,C) as MatmulGeluForward left them:
  //   dweight (OC,C) += dout^T act;  dbias (OC) += sum_n dout[n,:] (empty: none);
  //   dpre (N,C) = gelu'(pre) * (dout weight)            WRITES (no accumulation);
  //   dpre_bias (C) += sum_n dpre[n,:] (empty: none): the bias gradient of
  //   the layer that produced pre, which its own MatmulBackward then skips.
  // dpre may not alias act, pre or dout. On the CPU the bits are those of
  // Zero(t); MatmulBackward(t, dweight, dbias, dout, act, weight); Zero(dpre);
  // GeluBackward(dpre, pre, t) and the bias sums of MatmulBackward(.., dpre_bias,
  // dpre, ..), with t the backend's own scratch.
  virtual void MatmulGeluBackward(TensorSpan dpre, TensorSpan dpre_bias, TensorSpan dweight,
                                  TensorSpan dbias, TensorSpan dout, TensorSpan act, TensorSpan pre,
                                  TensorSpan weight, int N, int C, int OC) = 0;

  // ---- Causal self-attention ----------------------------------------------
  // fp32 elements (whatever the activation dtype) of the state
  // AttentionForward saves for AttentionBackward: for CpuBackend the softmax
  // probabilities (B,NH,T,T); for the CUDA backend with cuDNN's fused
  // attention a copy of the bf16 output and the fp32 softmax statistics
  // (sdpa_layout.h), which is why it takes C.
  virtual size_t AttentionStateNumel(int B, int T, int C, int NH) const = 0;
  // qkv (B,T,3C) = [q | k | v], head h in channels [h*hs, (h+1)*hs) of each
  // (hs = C/NH). out (B,T,C) = softmax(q k^T / sqrt(hs) + causal mask) v,
  // heads concatenated. state: AttentionStateNumel(B,T,C,NH) elements.
  virtual void AttentionForward(TensorSpan out, TensorSpan state, TensorSpan qkv, int B, int T,
                                int C, int NH) = 0;
  // dqkv (B,T,3C) += d(out)/d(qkv) applied to dout (B,T,C).
  virtual void AttentionBackward(TensorSpan dqkv, TensorSpan dout, TensorSpan qkv, TensorSpan state,
                                 int B, int T, int C, int NH) = 0;

  // ---- Pointwise ----------------------------------------------------------
  // out[i] = gelu(inp[i]), tanh approximation, for i < n.
  virtual void GeluForward(TensorSpan out, TensorSpan inp, size_t n) = 0;
  // dinp[i] += gelu'(inp[i]) * dout[i].
  virtual void GeluBackward(TensorSpan dinp, TensorSpan inp, TensorSpan dout, size_t n) = 0;
  // out[i] = inp1[i] + inp2[i]. out may be inp1 or inp2 (element-wise, so
  // an in-place sum: the gradient tree's folds on backend memory use it).
  virtual void ResidualForward(TensorSpan out, TensorSpan inp1, TensorSpan inp2, size_t n) = 0;
  // dinp1[i] += dout[i]; dinp2[i] += dout[i].
  virtual void ResidualBackward(TensorSpan dinp1, TensorSpan dinp2, TensorSpan dout, size_t n) = 0;

  // ---- Softmax + cross-entropy over the first V of Vp columns -------------
  // logits (N,Vp), targets (N) int32 < V. losses[n] = logsumexp(logits[n,:V])
  // - logits[n, targets[n]]; lse (N) saves the logsumexp for the backward.
  // Columns V..Vp-1 (vocab padding) take no part.
  virtual void CrossEntropyForward(TensorSpan losses, TensorSpan lse, TensorSpan logits,
                                   TensorSpan targets, int N, int V, int Vp) = 0;
  // dlogits (N,Vp) = (softmax(logits[n,:V]) - onehot(targets[n])) * dlosses[n]
  // in the first V columns, 0 in the padding. WRITES (no accumulation).
  // dlogits may be logits itself (the same span: the gradient overwrites the
  // logits in place, which the model does to keep one vocabulary-sized
  // buffer), or must not overlap it. dlosses (N) fp32: the loss scale per position.
  // Defaults to CrossEntropyShardBackward over the whole vocabulary.
  virtual void CrossEntropyBackward(TensorSpan dlogits, TensorSpan logits, TensorSpan lse,
                                    TensorSpan targets, TensorSpan dlosses, int N, int V, int Vp);

  // ---- Vocab-parallel embedding and cross-entropy -------------------------
  // Tensor parallelism over the vocabulary (Megatron's VocabParallelEmbedding
  // and vocab_parallel_cross_entropy): a rank holds rows [vocab_start,
  // vocab_start + Vs) of wte and computes only those logit columns. The
  // caller reduces over the tensor group between the steps.
  //
  // out (B,T,C) = (vocab_start <= inp[b,t] < vocab_start + Vs ? wte[inp[b,t] - vocab_start, :] : 0)
  //             + (wpe empty ? 0 : wpe[t, :]).   wte (Vs,C); wpe (maxT,C) or empty.
  // A term that is absent is written as -0.0f, IEEE's exact additive identity
  // (x + -0 = x for every x, -0 included, where +0 would turn -0 into +0). So
  // summing `out` over shards that together hold every row, one of them
  // passing wpe, gives EncoderForward's result bitwise in any order: each
  // element is wte + wpe (which commutes) plus identities. That holds for
  // fp32 activations; with bf16 ones the shard holding wpe rounds wpe alone
  // and the sum rounds again, so the sum is within two bf16 roundings of
  // EncoderForward's, not bitwise.
  virtual void EncoderForwardShard(TensorSpan out, TensorSpan inp, TensorSpan wte, TensorSpan wpe,
                                   int vocab_start, int Vs, int B, int T, int C) = 0;
  // dwte[inp[b,t] - vocab_start, :] += dout[b,t,:] for in-range tokens only;
  // dwpe (empty: skipped) as EncoderBackward. With vocab_start 0 and Vs = Vp
  // the same bits as EncoderBackward.
  virtual void EncoderBackwardShard(TensorSpan dwte, TensorSpan dwpe, TensorSpan dout,
                                    TensorSpan inp, int vocab_start, int Vs, int B, int T,
                                    int C) = 0;
  // Cross-entropy over a vocab shard in three steps. logits (N,Vs): column j
  // is vocab id vocab_start + j; ids >= V are padding and take no part (a
  // shard may be all padding). targets (N) int32 < V. All fp32; each shard's
  // sum of exponentials is accumulated in double and rounded to fp32 for the
  // group's reduction; Finish takes the log in double. Not bitwise equal to
  // CrossEntropyForward, but deterministic like every op.
  // 1. row_max (N): the max of the valid columns of row n (-infinity if the
  //    shard has none). The caller then takes the max over the group.
  virtual void CrossEntropyShardMax(TensorSpan row_max, TensorSpan logits, int N, int V, int Vs,
                                    int vocab_start) = 0;
  // 2. With row_max the max over all shards: sums (2N): sums[n] = sum over
  //    the valid columns of exp(logits[n,j] - row_max[n]); sums[N + n] =
  //    logits[n, targets[n] - vocab_start] if the target is in this shard,
  //    else 0. The caller then sums `sums` over the group.
  virtual void CrossEntropyShardSums(TensorSpan sums, TensorSpan logits, TensorSpan row_max,
                                     TensorSpan targets, int N, int V, int Vs, int vocab_start) = 0;
  // 3. With the group's sums: lse (N) = row_max + log(sums[n]);
  //    losses (N) = lse - sums[N + n]. The same on every rank.
  virtual void CrossEntropyShardFinish(TensorSpan losses, TensorSpan lse, TensorSpan row_max,
                                       TensorSpan sums, int N) = 0;
  // dlogits (N,Vs) = (exp(logits[n,j] - lse[n]) - [vocab_start + j == targets[n]]) * dlosses[n]
  // on valid columns, 0 on padding columns. WRITES (no accumulation); may be
  // logits itself, in place, as in CrossEntropyBackward. With vocab_start 0
  // and Vs = Vp the same bits as CrossEntropyBackward.
  virtual void CrossEntropyShardBackward(TensorSpan dlogits, TensorSpan logits, TensorSpan lse,
                                         TensorSpan targets, TensorSpan dlosses, int N, int V,
                                         int Vs, int vocab_start) = 0;

  // ---- The optimizer step on backend memory ---------------------------------
  // A step's end without the host, for training state that stays in backend
  // memory (worker/train/device_optimizer.h): the gradient norm's squares in
  // fixed pieces, the norm and the clip factor, then clipping fused into
  // AdamW over each range of the arena. The norm needs every gradient before
  // any update, so it is one pass over the gradients and the clipped update a
  // second over gradients, weights and moments. On the CPU the bits are the
  // host optimizer's (train::GradNormPlan, train::AdamWUpdate); on a GPU each
  // op reduces in a fixed order of its own, so it is deterministic run to run.
  //
  // sums (P) float64 = for each piece k: the sum of grads[i]^2 in double over
  // i in [pieces[2k], pieces[2k+1]) (pieces: 2P int64 in backend memory,
  // ascending, each at most 2^31 elements long).
  virtual void SumOfSquaresPieces(TensorSpan sums, TensorSpan grads, TensorSpan pieces) = 0;
  // scalars (2) float64: [0] = sqrt(sum of the P sums), [1] =
  // ClipFactor([0], max_norm) (adamw_math.h). The CPU adds the sums in order.
  virtual void FinishGradNorm(TensorSpan scalars, TensorSpan sums, double max_norm) = 0;
  // sum (1) float64 = the sum of losses[0..n) (fp32) in double: a
  // micro-batch's loss sum, kept in backend memory so that the step reads
  // all of them at once, at its end, instead of waiting for each. The CPU
  // adds in order from 0 (the bits of the host's serial double sum); a GPU
  // in a fixed tree of its own (deterministic, not the CPU's bits).
  virtual void SumLosses(TensorSpan sum, TensorSpan losses) = 0;
  // scalars[0] (FinishGradNorm's norm) = NaN when any of `values` (float64,
  // the step's loss sums) is not finite, so that ClipAdamW updates nothing:
  // a step whose loss is not finite leaves the state as it was, decided in
  // the stream without the host waiting for the losses before the update.
  virtual void SkipUpdateUnlessFinite(TensorSpan scalars, TensorSpan values) = 0;
  // For i in [begin, end): AdamWElement(adamw, decay, grads[i] * float(clip),
  // params[i], m[i - moment_base], v[i - moment_base]), where clip is
  // scalars[1] of FinishGradNorm; nothing at all when scalars[0] (the norm)
  // is not finite, so a step the caller refuses leaves the state as it was.
  // params and grads cover the arena; m and v hold elements from moment_base.
  // Where `params` is the arena AttachParams attached, the working copy of
  // each updated element is written in the same pass (fused).
  virtual void ClipAdamW(TensorSpan params, TensorSpan m, TensorSpan v, TensorSpan grads,
                         TensorSpan scalars, size_t begin, size_t end, size_t moment_base,
                         bool decay, const AdamWScalars& adamw) = 0;
};

}  // namespace cohort::compute
