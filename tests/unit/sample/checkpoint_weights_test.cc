// Loading a checkpoint's weights for sampling (tools/sample/checkpoint_weights.h)
// from an in-process checkpoint whose tensors are cut into chunks the way a
// sharded layout writes them: the assembled arena must equal the original
// bitwise, and a checkpoint of another model, an incomplete one or one
// without a readable fingerprint must be refused, naming what is wrong.

#include "tools/sample/checkpoint_weights.h"

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/box_proto.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/shard_plan.h"
#include "worker/compute/cpu_backend.h"
#include "worker/model/parameter_init.h"

namespace cohort::sample {
namespace {

using ChunkKey = std::pair<std::string, uint32_t>;

// A committed checkpoint held in memory: its manifest and every chunk's
// bytes. Download serves the chunks asked for (all when none are named),
// into the caller's buffer when it gives one. Thread-safe: read-only after
// construction (the loader downloads on several streams).
class ServingCheckpointClient : public client::CheckpointClient {
 public:
  ServingCheckpointClient(v1::CheckpointManifest manifest, std::map<ChunkKey, std::string> chunks)
      : manifest_(std::move(manifest)), chunks_(std::move(chunks)) {}

  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader&,
                                            const std::vector<client::UploadChunk>&,
                                            const v1::UploadEnd&, absl::Duration) override {
    return absl::UnimplementedError("read-only checkpoint");
  }
  absl::StatusOr<v1::CheckpointManifest> GetManifest(const std::string& job, int64_t step,
                                                     absl::Duration) override {
    if (job != manifest_.job_id() || (step != -1 && step != manifest_.step())) {
      return absl::NotFoundError(absl::StrCat("job ", job, " has no checkpoint at step ", step));
    }
    return manifest_;
  }
  absl::Status Download(const std::string&, int64_t, const std::vector<v1::ChunkRef>& refs,
                        const client::ChunkPlacement& place, const client::ChunkCallback& on_chunk,
                        absl::Duration) override {
    std::vector<ChunkKey> keys;
    for (const v1::ChunkRef& ref : refs) keys.emplace_back(ref.tensor(), ref.index());
    if (refs.empty()) {
      for (const auto& [key, unused] : chunks_) keys.push_back(key);
    }
    for (const ChunkKey& key : keys) {
      const v1::ChunkInfo* info = Find(key);
      auto bytes = chunks_.find(key);
      if (info == nullptr || bytes == chunks_.end()) {
        return absl::NotFoundError(absl::StrCat("no chunk ", key.second, " of ", key.first));
      }
      std::string_view view = bytes->second;
      if (void* to = place ? place(key.first, *info) : nullptr; to != nullptr) {
        std::memcpy(to, view.data(), view.size());
        view = std::string_view(static_cast<const char*>(to), view.size());
      }
      ++downloaded_;
      if (absl::Status s = on_chunk(key.first, *info, view); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<v1::ListCheckpointsResponse> List(const std::string&, absl::Duration) override {
    return absl::UnimplementedError("not used");
  }
  absl::Status Delete(const std::string&, int64_t, absl::Duration) override {
    return absl::UnimplementedError("read-only checkpoint");
  }

  int downloaded() const { return downloaded_.load(); }

 private:
  const v1::ChunkInfo* Find(const ChunkKey& key) const {
    for (const v1::TensorInfo& t : manifest_.tensors()) {
      if (t.name() != key.first) continue;
      for (const v1::ChunkInfo& c : t.chunks()) {
        if (c.index() == key.second) return &c;
      }
    }
    return nullptr;
  }

  const v1::CheckpointManifest manifest_;
  const std::map<ChunkKey, std::string> chunks_;
  std::atomic<int> downloaded_{0};
};

// The weights of `config` (arena `params`, whole-model layout) as a
// checkpoint of job "j" step 100. Each tensor is cut in two, as two
// tensor-parallel writers would: matrices into column halves (chunks that
// are not contiguous in the tensor), vectors into halves.
struct FakeCheckpoint {
  v1::CheckpointManifest manifest;
  std::map<ChunkKey, std::string> chunks;
};

FakeCheckpoint MakeCheckpoint(const model::GptConfig& config, const float* params) {
  FakeCheckpoint out;
  out.manifest.set_job_id("j");
  out.manifest.set_step(100);
  (*out.manifest.mutable_objects())["model"] = checkpoint::ModelFingerprint(config);
  const model::ParameterTable table(config);
  for (v1::TensorInfo tensor : checkpoint::Catalog(config)) {
    if (tensor.name().rfind("param/", 0) != 0) continue;  // weights only
    const model::ParameterInfo* info = table.Find(tensor.name().substr(6));
    const std::vector<int64_t>& shape = info->global_shape;
    const Box whole = WholeBox(shape);
    const size_t split = shape.size() >= 2 ? shape.size() - 1 : 0;
    std::vector<Box> boxes(2, whole);
    boxes[0].extent[split] = shape[split] / 2;
    boxes[1].start[split] = shape[split] / 2;
    boxes[1].extent[split] = shape[split] - shape[split] / 2;
    for (uint32_t index = 0; index < boxes.size(); ++index) {
      const Box& box = boxes[index];
      std::string bytes(static_cast<size_t>(box.NumElements()) * sizeof(float), '\0');
      CopyRegion(box, ConstBoxedBuffer{&whole, 0, params + info->offset},
                 BoxedBuffer{&box, 0, bytes.data()}, sizeof(float));
      v1::ChunkInfo* chunk = tensor.add_chunks();
      chunk->set_index(index);
      BoxToProto(box, chunk->mutable_box());
      chunk->set_bytes(bytes.size());
      chunk->set_writer(index);
      out.chunks[{tensor.name(), index}] = std::move(bytes);
    }
    *out.manifest.add_tensors() = std::move(tensor);
  }
  return out;
}

v1::TensorInfo* FindTensor(v1::CheckpointManifest& manifest, const std::string& name) {
  for (v1::TensorInfo& t : *manifest.mutable_tensors()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

class CheckpointWeightsTest : public ::testing::Test {
 protected:
  // Odd widths and a vocabulary that pads (50 -> 128) so halves are uneven.
  const model::GptConfig config_{
      .layers = 3, .heads = 2, .width = 18, .vocab_size = 50, .context_length = 12};
  compute::CpuBackend backend_{compute::CpuBackendOptions{.num_threads = 2}};
  std::vector<float> params_;
  FakeCheckpoint checkpoint_;

  void SetUp() override {
    const model::ParameterTable table(config_);
    params_.resize(table.num_params());
    model::InitializeParameters(config_, table, 77, params_.data());
    // No element may be 0 or repeated by accident of the init (biases are 0).
    for (size_t i = 0; i < params_.size(); ++i) params_[i] += 1e-3f * static_cast<float>(i + 1);
    checkpoint_ = MakeCheckpoint(config_, params_.data());
  }

  absl::StatusOr<std::unique_ptr<model::GptModel>> Load() {
    ServingCheckpointClient client(checkpoint_.manifest, checkpoint_.chunks);
    return LoadCheckpointModel(client, checkpoint_.manifest, &backend_, absl::Seconds(10));
  }
};

TEST_F(CheckpointWeightsTest, ShardedChunksAssembleTheArenaBitwise) {
  ServingCheckpointClient client(checkpoint_.manifest, checkpoint_.chunks);
  absl::StatusOr<std::unique_ptr<model::GptModel>> model =
      LoadCheckpointModel(client, checkpoint_.manifest, &backend_, absl::Seconds(10));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().layers, config_.layers);
  EXPECT_EQ((*model)->config().PaddedVocab(), 128);
  ASSERT_EQ((*model)->num_params(), params_.size());
  EXPECT_EQ(std::memcmp((*model)->params(), params_.data(), params_.size() * sizeof(float)), 0);
  EXPECT_EQ(client.downloaded(), 2 * model::kNumParamTensors);
}

TEST_F(CheckpointWeightsTest, AMissingTensorIsNamed) {
  auto* tensors = checkpoint_.manifest.mutable_tensors();
  for (int i = 0; i < tensors->size(); ++i) {
    if (tensors->Get(i).name() == "param/fcw") {
      tensors->DeleteSubrange(i, 1);
      break;
    }
  }
  const absl::Status status = Load().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("no tensor param/fcw"), std::string::npos) << status;
}

TEST_F(CheckpointWeightsTest, AWrongShapeIsNamed) {
  FindTensor(checkpoint_.manifest, "param/wpe")->set_global_shape(0, 24);
  const absl::Status status = Load().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(
      status.message().find("param/wpe has shape [24, 18], the model it names needs [12, 18]"),
      std::string::npos)
      << status;
}

TEST_F(CheckpointWeightsTest, AnUnknownWeightIsRefused) {
  v1::TensorInfo* extra = checkpoint_.manifest.add_tensors();
  extra->set_name("param/rotary");
  extra->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
  const absl::Status status = Load().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("param/rotary"), std::string::npos) << status;
}

TEST_F(CheckpointWeightsTest, AnotherDtypeIsRefused) {
  FindTensor(checkpoint_.manifest, "param/lnfb")->set_dtype(v1::TENSOR_DTYPE_BFLOAT16);
  const absl::Status status = Load().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("param/lnfb is TENSOR_DTYPE_BFLOAT16"), std::string::npos)
      << status;
}

TEST_F(CheckpointWeightsTest, UncoveredWeightsAreDataLoss) {
  v1::TensorInfo* qkvw = FindTensor(checkpoint_.manifest, "param/qkvw");
  qkvw->mutable_chunks()->RemoveLast();
  const absl::Status status = Load().status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("param/qkvw"), std::string::npos) << status;
}

TEST_F(CheckpointWeightsTest, AnUnreadableFingerprintIsRefused) {
  (*checkpoint_.manifest.mutable_objects())["model"] =
      "layers=3 heads=two width=18 vocab=50 padded_vocab=128 context=12";
  absl::Status status = Load().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("heads must be a positive integer, not \"two\""),
            std::string::npos)
      << status;

  checkpoint_.manifest.mutable_objects()->erase("model");
  status = Load().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("does not say which model"), std::string::npos) << status;
}

TEST_F(CheckpointWeightsTest, AFingerprintAloneAllocatesNothing) {
  // A billion layers would be terabytes of weights: the tensors, which are
  // of the 3-layer model, refuse it before the model is allocated (which
  // would fail as ResourceExhausted).
  (*checkpoint_.manifest.mutable_objects())["model"] =
      "layers=1000000000 heads=2 width=18 vocab=50 padded_vocab=128 context=12";
  const absl::Status status = Load().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("has shape [3, 18], the model it names needs [1000000000, 18]"),
            std::string::npos)
      << status;
}

TEST(ParseModelFingerprintTest, ReadsWhatModelFingerprintWrites) {
  for (const model::GptConfig& config :
       {model::GptConfig{
            .layers = 12, .heads = 12, .width = 768, .vocab_size = 50257, .context_length = 1024},
        model::GptConfig{.layers = 1,
        .heads = 1,
        .width = 8,
        .vocab_size = 256,
        .context_length = 4,
        .padded_vocab = 300}}) {
    absl::StatusOr<model::GptConfig> parsed =
        ParseModelFingerprint(checkpoint::ModelFingerprint(config));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    model::GptConfig expected = config;
    expected.padded_vocab = config.PaddedVocab();
    EXPECT_EQ(*parsed, expected);
  }
  // Any order.
  absl::StatusOr<model::GptConfig> reordered =
      ParseModelFingerprint("context=4 vocab=10 padded_vocab=16 width=8 heads=2 layers=1");
  ASSERT_TRUE(reordered.ok()) << reordered.status();
  EXPECT_EQ(reordered->context_length, 4);
  EXPECT_EQ(reordered->heads, 2);
}

TEST(ParseModelFingerprintTest, NamesWhatIsWrong) {
  const std::string good = "layers=1 heads=2 width=8 vocab=10 padded_vocab=16 context=4";
  ASSERT_TRUE(ParseModelFingerprint(good).ok());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "layers is missing"},
      {"layers=1 heads=2 width=8 vocab=10 padded_vocab=16", "context is missing"},
      {good + " layers=2", "layers appears twice"},
      {good + " dropout=0", "unknown field \"dropout=0\""},
      {"layers=1  heads=2 width=8 vocab=10 padded_vocab=16 context=4", "unknown field \"\""},
      {"layers=0 heads=2 width=8 vocab=10 padded_vocab=16 context=4",
       "layers must be a positive integer, not \"0\""},
      {"layers=1 heads=2 width=8 vocab=1e3 padded_vocab=16 context=4",
       "vocab must be a positive integer, not \"1e3\""},
      {"layers=1 heads=3 width=8 vocab=10 padded_vocab=16 context=4", "must divide"},
      {"layers=1 heads=2 width=8 vocab=10 padded_vocab=8 context=4", "padded_vocab"},
  };
  for (const auto& [text, reason] : cases) {
    const absl::Status status = ParseModelFingerprint(text).status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << text << ": " << status;
    EXPECT_NE(status.message().find(reason), std::string::npos) << text << ": " << status;
  }
}

}  // namespace
}  // namespace cohort::sample
