#pragma once
// GptModel: a GPT-2 style transformer (token + position embedding, pre-LN
// blocks of causal self-attention and a GELU MLP, final LayerNorm, LM head
// tied to the token embedding) whose forward and backward passes run on a
// compute::Backend. Parameters and gradients live in one flat fp32 arena
// each, laid out by ParameterTable; the optimizer works on those arenas.
//
// A step: ZeroGrad(); for each micro-batch { Forward(); Backward(scale); }
// then clip and update params() from grads(). Backward ACCUMULATES the
// gradient of (mean loss of the last Forward) * loss_scale, so with
// loss_scale = 1 / (micro_batches * dp) the accumulated gradient is that of
// the mean loss over the whole global batch.
//
// Model parallelism (options.layout). A model built for a ModelLayout holds
// one rank's shard (parameter_table.h) and runs its part of each pass:
//   tensor parallel (Megatron): QKV and fc are column-parallel and attproj
//     and fcproj row-parallel, the token embedding and the LM head
//     vocab-parallel with a vocab-parallel cross-entropy (the full logits
//     are never gathered). Each layer all-reduces over options.tensor_group
//     twice forward (after attproj and fcproj) and twice backward (the input
//     gradients of qkv and fc); the row-parallel biases are added by tensor
//     rank 0 before the reduction. Replicated tensors (LayerNorms, wpe, the
//     row-parallel biases) see bitwise identical inputs on every tensor rank,
//     so their gradients are identical there without a reduction.
//   pipeline parallel: a stage runs its layers on activations the caller
//     receives from the previous stage (StageInput) and hands StageOutput to
//     the next; backward takes the gradient of its output (StageOutputGrad)
//     and leaves that of its input (StageInputGrad). Activations of up to
//     options.activation_slots micro-batches are kept (1F1B keeps p - stage).
// The tied embedding: the LM head's part of the wte gradient goes to grads()
// and the token embedding's part to embedding_grad(), so that a pipeline
// (whose two parts live on different stages) and a single process can add
// them in the same order; Backward() adds them per micro-batch,
// BackwardStage() leaves that to the caller.
//
// Memory: activations are allocated once, for options.max_micro_batch
// sequences of config.context_length tokens per slot, in backend memory, in
// the backend's activation_dtype() (bf16 on a GPU computing in bf16: half
// the bytes) with their statistics in fp32 (gpt_activations.h); parameters
// and gradients are fp32 on every backend.
// params() and grads() are host memory on every backend: on one whose
// memory the host cannot read (a GPU; Backend::host_memory()) they are host
// copies of the backend's arenas, "staged": a Forward first uploads the
// parameters if params() was handed out for writing since the last upload,
// and a Backward downloads the gradients when it ends (and first uploads
// them if grads() was handed out for writing since). So the optimizer, the
// data-parallel reduction, checkpoints and live transfer work on host
// memory unchanged, at the cost of one copy of each arena per step. A
// writer must take the pointer (non-const params() / grads()) after the
// last pass it should not affect; const access never marks a copy stale.
// The pipeline's Stage* spans and embedding_grad() are host memory too on a
// staged model (the passes move them to and from the backend; StageOutput
// and StageInputGrad exist there only on the stages that send them), and
// the tensor group's all-reduces run on host
// copies: every layout works over host collectives. param(), grad() and
// logits() are backend memory. A caller that keeps the training state on
// the backend (StepRunner's device-resident step) has backwards leave the
// gradients there (set_gradients_stay_on_backend) and says when it changed
// the weights there (MarkParamsChangedOnBackend): the host copies then
// download when next read, so a host reader (a checkpoint) still sees the
// newest values, and nothing crosses on the step's path.
//
// Thread-safety: thread-compatible; one caller at a time (like its Backend).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/compute/backend.h"
#include "worker/compute/capture_cache.h"
#include "worker/model/gpt_activations.h"
#include "worker/model/gpt_config.h"
#include "worker/model/model_layout.h"
#include "worker/model/parameter_table.h"

namespace cohort::model {

// One micro-batch of the device-resident step (GptModel::TrainMicroBatch).
struct MicroBatchPass {
  int slot = 0;
  // Host arrays of B*T ids each in AllocateHost memory, left unchanged
  // until the caller's next Backend::Synchronize.
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  int B = 0;
  int T = 0;
  double loss_scale = 1.0;
  // Backend memory (one float64) for the loss sum (Backend::SumLosses).
  compute::TensorSpan loss_sum;
};

struct ModelOptions {
  // Largest B that Forward accepts; activations are sized for it.
  int max_micro_batch = 1;
  // The shard this rank holds; the whole model by default.
  ModelLayout layout{};
  // The tensor group (layout.tp ranks, group rank == layout.tp_rank); needed
  // when layout.tp > 1, and must outlive the model. Its memory kind must
  // match the backend's (host memory for CpuBackend).
  comm::Communicator* tensor_group = nullptr;
  // Bound on each collective of a pass.
  absl::Duration collective_timeout = absl::Minutes(5);
  // Micro-batches whose activations are kept at once (pipeline schedules
  // keep several forwards waiting for their backward).
  int activation_slots = 1;
};

class GptModel {
 public:
  // A model with zeroed parameters and gradients (call InitializeParameters
  // or fill params()). `backend` must outlive the model. Errors:
  // InvalidArgument for an invalid config or layout, max_micro_batch or
  // activation_slots < 1, a missing or mis-sized tensor group;
  // Unimplemented for a backend whose activations are neither fp32 nor bf16;
  // ResourceExhausted when the backend cannot allocate the arenas.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config,
                                                          compute::Backend* backend,
                                                          const ModelOptions& options);
  // The largest passes a model of `config` with `layout` and micro-batches
  // up to `max_micro_batch` runs: what Create reserves scratch for
  // (Backend::ReserveScratch), and what a session sizes its memory with.
  static compute::PassShape PassShapeFor(const GptConfig& config, const ModelLayout& layout,
                                         int max_micro_batch);
  // The blocks of the parameter arena that the linear layers read as
  // weights (Backend::AttachParams; AttachWeightCopy hands these over).
  static std::vector<compute::ParamBlock> WeightCopyBlocks(const ParameterTable& table);
  // The backend memory Create allocates for `config` and `options`, before
  // scratch (Backend::ScratchBytes) and a working copy: the weights, the
  // gradients, the activations of every slot and their gradients, the token
  // ids and the loss gradient, each rounded up to `alignment` bytes as a
  // device allocator rounds them.
  static size_t BackendBytes(const GptConfig& config, const compute::Backend& backend,
                             const ModelOptions& options, size_t alignment);
  // Detaches the weights' working copy (AttachWeightCopy) from the backend.
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptConfig& config() const { return config_; }
  const ModelLayout& layout() const { return options_.layout; }
  int activation_slots() const { return options_.activation_slots; }
  const ParameterTable& table() const { return table_; }
  size_t num_params() const { return table_.num_params(); }

  // The flat arenas (num_params() fp32 elements each, ParameterTable
  // layout), in host memory (see Memory above for a staged backend: the
  // non-const forms mark the backend's copy stale).
  float* params();
  const float* params() const;
  float* grads();
  const float* grads() const;
  // Whether params() and grads() are host copies of the backend's arenas.
  bool staged() const { return staging_ != nullptr; }
  compute::Backend* backend() const { return backend_; }
  // The device-resident step (StepRunner with a DeviceOptimizer): with
  // `stay`, a backward leaves the gradients (and the embedding part) in
  // backend memory only, for the caller to use as grads_span() and
  // embedding_grad_span(); a host reader of grads() or embedding_grad()
  // then downloads them when it asks. A no-op on a model that is not staged.
  void set_gradients_stay_on_backend(bool stay) { gradients_stay_ = stay; }
  // The caller changed the weights in backend memory (the device-resident
  // optimizer): the host copy is refreshed when params() is next read. The
  // backend's working copy is not refreshed: the optimizer's ClipAdamW
  // writes it (backend.h); a caller that changed the weights by any other
  // op calls backend()->RefreshParamCopy() itself.
  void MarkParamsChangedOnBackend();
  // The device-resident step's micro-batch, which does not wait for the
  // device: a ForwardStage of pass.slot that uploads the tokens
  // asynchronously and leaves its loss sum (float64, Backend::SumLosses:
  // the mean loss times B*T) in pass.loss_sum instead of reading it, ZeroGrad, and
  // BackwardStage(pass.slot, pass.loss_scale), with the same bits. The
  // backend's ops of all three are one unit run through `graphs`: issued
  // directly, or captured once and replayed (compute/capture_cache.h: a GPU
  // launches the whole pass at once), keyed by the slot, B, T and the loss
  // sum's address. What the host does is outside it, before the ops: the
  // checks, the weights' upload when the host wrote them, the tokens'
  // asynchronous upload into the slot, and the loss gradient's upload when
  // its value changes; so a replay reads this micro-batch's tokens, the
  // current weights and the current loss scale. Needs a staged model of one
  // rank (tp = pp = 1) whose gradients stay on the backend
  // (FailedPrecondition otherwise); errors as ForwardStage and
  // BackwardStage (Aborted on a cancel seen before or inside a direct run).
  absl::Status TrainMicroBatch(const MicroBatchPass& pass, compute::CaptureCache* graphs);
  // Attaches the parameter arena to the backend with the weights its GEMMs
  // read (backend.h, AttachParams: a bf16 backend then keeps a bf16 working
  // copy instead of rounding them on every call), for the device-resident
  // step; an upload of the weights from the host refreshes the copy from
  // then on, and the model detaches it when destroyed. InvalidArgument or
  // ResourceExhausted from the backend.
  absl::Status AttachWeightCopy();
  // The host weights to the backend if params() handed them out for writing
  // since the last upload (a restore), so that params_span() holds the
  // newest; a no-op on a model that is not staged. Forward does it itself;
  // a reader of params_span() between steps (a device snapshot) calls it.
  absl::Status UploadStaleParams();
  // The backend's arenas (what the ops use; device memory on a GPU).
  compute::TensorSpan params_span() const { return params_.span(); }
  compute::TensorSpan grads_span() const { return grads_.span(); }
  // One tensor of either arena, or one layer's slice of a per-layer tensor.
  compute::TensorSpan param(ParamId id) const;
  compute::TensorSpan grad(ParamId id) const;
  compute::TensorSpan param(ParamId id, int layer) const;
  compute::TensorSpan grad(ParamId id, int layer) const;

  // The token embedding's part of the wte gradient (wte's local shape; empty
  // on stages without the embedding). ZeroGrad clears it.
  compute::TensorSpan embedding_grad() const;
  // The same in backend memory (what the ops write), on any backend.
  compute::TensorSpan embedding_grad_span() const { return embedding_grad_.span(); }

  // Overwrites params() with the GPT-2 initialisation from `seed`
  // (model/parameter_init.h), this rank's shard of it.
  void InitializeParameters(uint64_t seed);

  // ---- Pipeline stages (any layout; Forward/Backward below are slot 0 of a
  // model without pipeline parallelism) ----
  // Where the caller puts the previous stage's activations (B,T,C) for
  // micro-batch slot `slot` before ForwardStage (stages > 0). Like every
  // Stage* span below, of the backend's activation dtype: a caller moves
  // span.bytes().
  compute::TensorSpan StageInput(int slot, int B, int T);
  // Forward of `slot`: inputs are read on the first stage, targets on the
  // last (either may be null elsewhere). Returns the mean loss on the last
  // stage, 0 on the others. Errors as Forward, plus InvalidArgument for a
  // slot out of range, and the tensor group's errors.
  absl::StatusOr<double> ForwardStage(int slot, const int32_t* inputs, const int32_t* targets,
                                      int B, int T);
  // This stage's output activations (B,T,C) of `slot` after ForwardStage.
  compute::TensorSpan StageOutput(int slot) const;
  // Where the caller puts d(loss)/d(StageOutput) before BackwardStage
  // (stages but the last), for a slot forwarded with (B,T).
  compute::TensorSpan StageOutputGrad(int B, int T);
  // Backward of `slot` (forwarded since its last backward): adds the
  // gradients into grads() and embedding_grad(). loss_scale applies on the
  // last stage; other stages take the scale with their output gradient.
  absl::Status BackwardStage(int slot, double loss_scale);
  // d(loss)/d(StageInput) of the last BackwardStage (stages > 0).
  compute::TensorSpan StageInputGrad() const;
  // While set, ForwardStage and BackwardStage return Aborted before the
  // next layer once `*cancel` is true, so a step abandoned for a Suspend or
  // Stop ends within one layer's compute rather than a whole step's. Neither
  // touches the weights; an abandoned call leaves its slot's activations
  // and the gradients undefined. Null: never cancelled.
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }
  // The tensor group the passes reduce over from now on (same size and rank
  // as the one it was created with): a model shard that a later session
  // trains on (TrainingSession reuses it across a re-plan that changes only
  // the data-parallel degree) runs over that session's communicators.
  absl::Status set_tensor_group(comm::Communicator* group);
  // Writes zeros into every buffer now, so a model prepared ahead (a warm
  // spare's) faults in no fresh pages when it trains (backends may leave
  // fresh memory untouched until first written).
  void Touch();

  // Runs the forward pass on inputs and targets (host memory, B*T int32 each,
  // row-major (B,T)) and returns the mean cross-entropy over the B*T
  // positions. Keeps the activations for Backward and the logits for
  // logits(). Errors (nothing is computed): InvalidArgument for B outside
  // [1, max_micro_batch], T outside [1, context_length], null pointers, or a
  // token id outside [0, vocab_size) (the message names the position); and
  // any failure the backend reports.
  absl::StatusOr<double> Forward(const int32_t* inputs, const int32_t* targets, int B, int T);

  // grads()[:] = 0 and embedding_grad()[:] = 0.
  void ZeroGrad();

  // Adds d(loss_scale * mean loss of the last Forward)/d(params) to grads()
  // (both parts of the tied wte included: the token embedding's is added
  // into grads() and embedding_grad() cleared). May be repeated (each call
  // adds again; on the stage with the LM head each call needs a Forward
  // before it, since the backward overwrites the logits with their gradient).
  // FailedPrecondition without a successful Forward since Create (or since
  // the last Backward, on the head's stage) or with pipeline parallelism;
  // InvalidArgument for a non-finite scale.
  absl::Status Backward(double loss_scale);

  // The logits (B,T,Vp) of the last successful Forward (backend memory, of
  // the backend's activation dtype: read them with CopyLogitsToHost); an
  // empty span before the first, and after a Backward of that Forward, which
  // writes the logits' gradient over them (one vocabulary-sized buffer, not
  // two). Padding columns V..Vp-1 hold lnf · wte[v] and take no part in the
  // loss.
  // Under tensor parallelism: this rank's vocabulary columns (B,T,Vp/tp).
  compute::TensorSpan logits() const;
  // Copies logits() into dst (its numel floats, widened from bf16 where the
  // activations are bf16); FailedPrecondition before
  // the first Forward, after a Backward of it (the logits are gradients now)
  // or on a stage without the head.
  absl::Status CopyLogitsToHost(float* dst);
  int last_batch() const { return slots_[0].B; }
  int last_time() const { return slots_[0].T; }

 private:
  // One micro-batch's activations; B == 0 until a successful forward.
  struct Slot {
    int B = 0;
    int T = 0;
    compute::TensorSpan arena;
    GptActivations acts;
    compute::TensorSpan inputs;
    compute::TensorSpan targets;
    // A backward wrote the logits' gradient over acts.logits (in place);
    // the logits are gone until the slot's next forward.
    bool logits_overwritten = false;
  };

  GptModel(const GptConfig& config, compute::Backend* backend, const ModelOptions& options);

  absl::Status CheckTokens(const char* what, const int32_t* ids, int B, int T) const;
  // Sums `span` over the tensor group (no-op without tensor parallelism).
  absl::Status TensorAllReduce(compute::TensorSpan span, comm::ReduceOp op);
  // ForwardStage in three parts, so that TrainMicroBatch can run the
  // middle one as a captured unit. BeginForward: the checks, the weights'
  // upload, the slot's tokens (asynchronously when `deferred`) and
  // activation views. ForwardOps: the backend's ops only (and the tensor
  // group's all-reduces), with the head's loss sum into `loss_sum` when it
  // is not empty. HeadLoss: the mean loss read back, or NaN when deferred.
  absl::Status BeginForward(int slot_index, const int32_t* inputs, const int32_t* targets, int B,
                            int T, bool deferred);
  absl::Status ForwardOps(Slot& slot, int B, int T, compute::TensorSpan loss_sum);
  absl::Status HeadOps(Slot& slot, int N, compute::TensorSpan loss_sum);
  absl::StatusOr<double> HeadLoss(Slot& slot, int N, compute::TensorSpan loss_sum);
  // BackwardOnBackend's parts likewise: BeginBackward checks the slot,
  // marks its logits overwritten and returns the loss gradient (uploaded
  // when it changed; empty without the head); BackwardOps issues the ops.
  absl::StatusOr<compute::TensorSpan> BeginBackward(int slot_index, double loss_scale);
  absl::Status BackwardOps(const Slot& slot, compute::TensorSpan dlosses);
  // ZeroGrad's ops, without the staging books.
  void ZeroGradOps();
  absl::Status CheckCancelled() const;
  // BackwardStage without the staging around it.
  absl::Status BackwardOnBackend(int slot_index, double loss_scale);
  // dlosses_'s first N elements, each `value`: uploaded only when the
  // value or a longer N asks for it (rarely: the first step, a new
  // micro-batch count).
  compute::TensorSpan LossGradient(float value, int N);
  // Staging (no-ops on a model that is not staged): the host gradients to
  // the backend if they were handed out for writing since the last upload,
  // before a backward; the backend's gradients to the host after one.
  // After a backward: with set_gradients_stay_on_backend on a staged model,
  // marks the gradients newer on the backend and returns true (nothing to
  // download); false otherwise.
  bool KeepGradientsOnBackend();
  absl::Status UploadStaleGrads();
  absl::Status DownloadGrads();

  // Where a staged tensor's newest contents are: kSynced (host and backend
  // copies agree), kHostNewer (the host copy was handed out for writing),
  // kZeroOnBackend (the backend's copy was cleared; the host copy is zeroed
  // when next read, so a cleared gradient costs no copy), kBackendNewer (the
  // backend's copy changed: the device-resident step's gradients and
  // weights; downloaded when next read).
  enum class Newest { kSynced, kHostNewer, kZeroOnBackend, kBackendNewer };
  // The host copy of one backend tensor, from Backend::AllocateHost
  // (page-locked on a GPU: these cross every step of the host-staged path).
  struct HostCopy {
    compute::Buffer host;
    Newest newest = Newest::kSynced;
    // The host copy to read: zero-filled first if the backend's was
    // cleared, downloaded from `device` first if the backend's is newer.
    float* Read(compute::Backend* backend, compute::TensorSpan device);
  };
  struct HostStaging {
    HostCopy params, grads;
    HostCopy embedding_grad;  // on the stage with the embedding
    // A pipeline stage's exchanges (max B x maxT x C each): the received
    // input and the output to send, per activation slot; the received
    // output gradient and the input gradient to send.
    // All from Backend::AllocateHost, as the copies above.
    std::vector<compute::Buffer> stage_input, stage_output;
    compute::Buffer stage_output_grad, stage_input_grad;
    compute::Buffer reduce;  // the tensor group's all-reduces (the largest: N x C)
  };
  // A host span of `numel` elements of `dtype` at the start of `host`
  // (which must hold their bytes).
  static compute::TensorSpan HostSpan(const compute::Buffer& host, compute::DType dtype,
                                      size_t numel);
  // Copies `copy` to `device` when its host side was handed out for writing
  // since; then both agree.
  absl::Status UploadIfHostNewer(HostCopy& copy, compute::TensorSpan device);
  // Enqueues `device` into `copy`'s host side (the caller synchronizes
  // before reading it); then both agree.
  void Download(HostCopy& copy, compute::TensorSpan device);

  const GptConfig config_;
  const ParameterTable table_;
  compute::Backend* const backend_;
  const ModelOptions options_;
  comm::Communicator* tensor_group_;  // null without tensor parallelism

  compute::Buffer params_;     // num_params() fp32
  compute::Buffer grads_;      // num_params() fp32
  compute::Buffer embedding_grad_;  // wte's numel on the first stage
  // Raw memory (gpt_activations.h): slots x ActivationsBytes(max B, maxT),
  // and ActivationGradsBytes(max B, maxT).
  compute::Buffer acts_;
  compute::Buffer grad_acts_;
  compute::Buffer tokens_;     // slots x 2 x max B x maxT int32: inputs then targets
  std::vector<Slot> slots_;
  int last_backward_slot_ = -1;
  std::vector<float> host_losses_;
  std::vector<uint16_t> host_logits_;  // CopyLogitsToHost's bf16 logits, before widening
  std::vector<float> host_dlosses_;
  // The loss gradient per position (loss_scale / N for the first N): the
  // same for every micro-batch of a step, so uploaded only when it changes.
  compute::Buffer dlosses_;  // max B x maxT fp32, on the stage with the head
  float dlosses_value_ = 0.0f;
  int dlosses_filled_ = 0;             // leading elements holding dlosses_value_
  const std::atomic<bool>* cancel_ = nullptr;
  bool gradients_stay_ = false;
  bool weight_copy_attached_ = false;  // AttachWeightCopy
  // Mutable: a const read of grads() may have to materialise the zeros that
  // ZeroGrad left on the backend.
  mutable std::unique_ptr<HostStaging> staging_;
};

}  // namespace cohort::model
