// LoadInitialWeights against PyTorch: tests/reference/hf_gpt2_reference.py
// builds a GPT-2 with Hugging Face's names, writes it as an HF safetensors
// file and computes logits and loss; GptModel loaded from that file must give
// them within kTolerance (relative Frobenius error of the logits, relative
// error of the loss). A rank's shard of every tensor-parallel and pipeline
// layout must equal the same box of the whole model, the Hub's name variant
// must load the same bits, and the files `cohortctl checkpoints export`
// writes (both layouts) must load back bitwise and, for hf-gpt2, equal the
// PyTorch state dict tensor for tensor.
//
// Needs python3 with torch (Debian's python3-torch). Without it the test
// fails, telling how to install it: a silently skipped comparison would hide
// regressions.

#include "worker/model/initial_weights.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/box_proto.h"
#include "common/safetensors_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/paths.h"
#include "tests/testing/torch_reference.h"
#include "tools/cohortctl/checkpoint_export.h"
#include "worker/checkpoint/shard_plan.h"
#include "worker/compute/cpu_backend.h"
#include "worker/model/gpt_model.h"

namespace cohort::model {
namespace {

using ::testing::HasSubstr;

constexpr double kTolerance = 1e-5;
constexpr int kB = 2, kT = 16, kThreads = 2;

// vocab 100 pads to 128 rows: the padding rows must come out zero.
GptConfig TinyConfig() {
  return GptConfig{.layers = 2, .heads = 4, .width = 64, .vocab_size = 100, .context_length = 32};
}

bool BitwiseEqual(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// A checkpoint held in memory, served the way the Checkpoints service does:
// each tensor in two chunks (split along its first dimension) where it can
// be, so the export assembles them.
class MemoryCheckpointClient : public client::CheckpointClient {
 public:
  MemoryCheckpointClient(const GptConfig& config, const ParameterTable& whole,
                         const float* params) {
    manifest_.set_job_id("job-1");
    manifest_.set_step(7);
    manifest_.set_generation(2);
    (*manifest_.mutable_objects())["model"] = checkpoint::ModelFingerprint(config);
    for (const ParameterInfo& info : whole.tensors()) {
      v1::TensorInfo* tensor = manifest_.add_tensors();
      tensor->set_name(checkpoint::TensorName(checkpoint::StateKind::kParam, info.name));
      tensor->set_dtype(v1::TENSOR_DTYPE_FLOAT32);
      for (int64_t d : info.global_shape) tensor->add_global_shape(d);
      const int64_t rows = info.global_shape[0];
      const size_t row_numel = info.numel / static_cast<size_t>(rows);
      const int64_t cut = rows / 2;
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, cut}, {cut, rows}}) {
        if (begin == end) continue;
        Box box{std::vector<int64_t>(info.global_shape.size(), 0), info.global_shape};
        box.start[0] = begin;
        box.extent[0] = end - begin;
        v1::ChunkInfo* chunk = tensor->add_chunks();
        chunk->set_index(static_cast<uint32_t>(tensor->chunks_size() - 1));
        BoxToProto(box, chunk->mutable_box());
        const float* data = params + info.offset + static_cast<size_t>(begin) * row_numel;
        bytes_[{tensor->name(), chunk->index()}] =
            std::string(reinterpret_cast<const char*>(data),
                        static_cast<size_t>(end - begin) * row_numel * sizeof(float));
        chunk->set_bytes(bytes_[{tensor->name(), chunk->index()}].size());
      }
    }
    std::sort(manifest_.mutable_tensors()->begin(), manifest_.mutable_tensors()->end(),
              [](const v1::TensorInfo& a, const v1::TensorInfo& b) { return a.name() < b.name(); });
  }

  v1::CheckpointManifest& manifest() { return manifest_; }

  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader&,
                                            const std::vector<client::UploadChunk>&,
                                            const v1::UploadEnd&, absl::Duration) override {
    return absl::UnimplementedError("read-only");
  }
  absl::StatusOr<v1::CheckpointManifest> GetManifest(const std::string&, int64_t,
                                                     absl::Duration) override {
    return manifest_;
  }
  absl::Status Download(const std::string&, int64_t, const std::vector<v1::ChunkRef>& refs,
                        const client::ChunkPlacement&, const client::ChunkCallback& on_chunk,
                        absl::Duration) override {
    for (const v1::ChunkRef& ref : refs) {
      for (const v1::TensorInfo& tensor : manifest_.tensors()) {
        if (tensor.name() != ref.tensor()) continue;
        const v1::ChunkInfo& info = tensor.chunks(static_cast<int>(ref.index()));
        if (absl::Status s = on_chunk(tensor.name(), info, bytes_.at({tensor.name(), ref.index()}));
            !s.ok()) {
          return s;
        }
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<v1::ListCheckpointsResponse> List(const std::string&, absl::Duration) override {
    return absl::UnimplementedError("read-only");
  }
  absl::Status Delete(const std::string&, int64_t, absl::Duration) override {
    return absl::UnimplementedError("read-only");
  }

 private:
  v1::CheckpointManifest manifest_;
  std::map<std::pair<std::string, uint32_t>, std::string> bytes_;
};

class InitialWeightsTest : public ::testing::Test {
 protected:
  // Runs the PyTorch reference once for all tests of the binary.
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeTempDir("initial_weights"));
    const GptConfig config = TinyConfig();
    {
      std::ofstream cfg(*dir_ + "/config.txt");
      cfg << "layers " << config.layers << "\nheads " << config.heads << "\nwidth " << config.width
          << "\nvocab_size " << config.vocab_size << "\ncontext_length " << config.context_length
          << "\nbatch " << kB << "\ntime " << kT << "\nseed 5\nthreads " << kThreads << "\n";
    }
    tokens_ = new std::vector<int32_t>(2 * kB * kT);
    std::mt19937_64 rng(11);
    for (int32_t& t : *tokens_) t = static_cast<int32_t>(rng() % config.vocab_size);
    testing::WriteBinaryFile(*dir_ + "/tokens.bin", *tokens_);
    const absl::Status reference = testing::RunTorchReference("hf_gpt2_reference.py", *dir_);
    reference_error_ = new std::string(reference.message());
  }

  void SetUp() override { ASSERT_TRUE(reference_error_->empty()) << *reference_error_; }

  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  // The whole model's parameters loaded from `file`.
  static std::vector<float> LoadWhole(const std::string& file, const GptConfig& config) {
    const ParameterTable whole(config);
    std::vector<float> params(whole.num_params(), -7.0f);
    const absl::Status s = LoadInitialWeights(file, config, whole, params.data());
    EXPECT_TRUE(s.ok()) << s;
    return params;
  }

  static std::string* dir_;
  static std::vector<int32_t>* tokens_;
  static std::string* reference_error_;
};

std::string* InitialWeightsTest::dir_ = nullptr;
std::vector<int32_t>* InitialWeightsTest::tokens_ = nullptr;
std::string* InitialWeightsTest::reference_error_ = nullptr;

TEST_F(InitialWeightsTest, LogitsAndLossMatchPyTorch) {
  const GptConfig config = TinyConfig();
  compute::CpuBackend backend(compute::CpuBackendOptions{.num_threads = kThreads});
  absl::StatusOr<std::unique_ptr<GptModel>> created =
      GptModel::Create(config, &backend, ModelOptions{.max_micro_batch = kB});
  ASSERT_TRUE(created.ok()) << created.status();
  GptModel& model = **created;
  model.InitializeParameters(1);  // overwritten entirely below
  ASSERT_TRUE(
      LoadInitialWeights(File("hf.safetensors"), config, model.table(), model.params()).ok());

  // The padding rows of wte are zero.
  const ParameterInfo& wte = model.table()[kWte];
  for (size_t i = static_cast<size_t>(config.vocab_size) * config.width; i < wte.numel; ++i) {
    ASSERT_EQ(model.params()[wte.offset + i], 0.0f) << i;
  }

  const int32_t* inputs = tokens_->data();
  absl::StatusOr<double> loss = model.Forward(inputs, inputs + kB * kT, kB, kT);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const int V = config.vocab_size, Vp = config.PaddedVocab();
  std::vector<float> padded(static_cast<size_t>(kB) * kT * Vp);
  ASSERT_TRUE(model.CopyLogitsToHost(padded.data()).ok());
  std::vector<float> logits;
  for (int n = 0; n < kB * kT; ++n) {
    logits.insert(logits.end(), padded.begin() + n * Vp, padded.begin() + n * Vp + V);
  }
  const auto ref_logits = testing::ReadBinaryFile<float>(File("ref_logits.bin"), logits.size());
  const auto ref_loss = testing::ReadBinaryFile<double>(File("ref_loss.bin"), 1);
  ASSERT_EQ(ref_logits.size(), logits.size());
  const double logits_error =
      testing::RelativeError(logits.data(), ref_logits.data(), logits.size());
  EXPECT_LE(logits_error, kTolerance);
  EXPECT_LE(std::abs(*loss - ref_loss[0]), kTolerance * ref_loss[0])
      << *loss << " vs torch " << ref_loss[0];
  std::printf("relative error logits %.3g, loss %.6f vs torch %.6f\n", logits_error, *loss,
              ref_loss[0]);
}

TEST_F(InitialWeightsTest, HubNamesLoadTheSameBits) {
  const GptConfig config = TinyConfig();
  const std::vector<float> hf = LoadWhole(File("hf.safetensors"), config);
  const std::vector<float> hub = LoadWhole(File("hub.safetensors"), config);
  ASSERT_EQ(hf.size(), hub.size());
  EXPECT_TRUE(BitwiseEqual(hf.data(), hub.data(), hf.size()));
}

TEST_F(InitialWeightsTest, EveryShardIsItsBoxOfTheWholeModel) {
  const GptConfig config = TinyConfig();
  const ParameterTable whole_table(config);
  const std::vector<float> whole = LoadWhole(File("hf.safetensors"), config);
  int checked = 0;
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2}) {
      for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
        for (int stage = 0; stage < pp; ++stage) {
          const ModelLayout layout{.tp = tp, .tp_rank = tp_rank, .pp = pp, .stage = stage};
          ASSERT_TRUE(layout.Validate(config).ok()) << layout.Validate(config);
          const ParameterTable table(config, layout);
          std::vector<float> shard(table.num_params(), -7.0f);
          const absl::Status s =
              LoadInitialWeights(File("hf.safetensors"), config, table, shard.data());
          ASSERT_TRUE(s.ok()) << s;
          for (const ParameterInfo& info : table.tensors()) {
            std::vector<float> expected(info.numel);
            ExtractShard(info, whole.data() + whole_table[info.id].offset, expected.data());
            EXPECT_TRUE(BitwiseEqual(shard.data() + info.offset, expected.data(), info.numel))
                << info.name << " tp " << tp_rank << "/" << tp << " stage " << stage << "/" << pp;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 1 + 2 + 2 + 4 + 4 + 8);
}

TEST_F(InitialWeightsTest, ErrorsNameTheFileAndWhatDisagrees) {
  const GptConfig config = TinyConfig();
  const auto error = [](const std::string& file, const GptConfig& c) {
    const ParameterTable table(c);
    std::vector<float> params(table.num_params());
    const absl::Status s = LoadInitialWeights(file, c, table, params.data());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr(file));
    return std::string(s.message());
  };
  GptConfig narrow = config;
  narrow.width = 32;
  EXPECT_THAT(error(File("hf.safetensors"), narrow),
              HasSubstr("model.width 32 but transformer.wte.weight has 64 columns"));
  GptConfig deeper = config;
  deeper.layers = 3;
  EXPECT_THAT(error(File("hub.safetensors"), deeper),
              HasSubstr("lacks transformer.h.2.ln_1.weight: model.layers is 3 but the file holds "
                        "2 layers"));
  EXPECT_THAT(error(File("untied.safetensors"), config),
              HasSubstr("lm_head.weight differs from transformer.wte.weight at row 3 column 5: "
                        "an untied LM head is not supported"));
  GptConfig smaller_vocab = config;
  smaller_vocab.vocab_size = 90;
  EXPECT_THAT(error(File("hf.safetensors"), smaller_vocab),
              HasSubstr("model.vocab_size 90 but transformer.wte.weight has 100 rows"));

  const ParameterTable table(config);
  std::vector<float> params(table.num_params());
  const absl::Status missing = LoadInitialWeights(File("none"), config, table, params.data());
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
}

TEST_F(InitialWeightsTest, ExportedFilesLoadBackBitwise) {
  const GptConfig config = TinyConfig();
  const ParameterTable whole(config);
  const std::vector<float> params = LoadWhole(File("hf.safetensors"), config);
  MemoryCheckpointClient client(config, whole, params.data());
  EXPECT_EQ(client.manifest().objects().at("model"), FormatModelFingerprint(GptShapeOf(config)));

  for (cohortctl::ExportFormat format :
       {cohortctl::ExportFormat::kSafetensors, cohortctl::ExportFormat::kHfGpt2}) {
    const std::string out = File(absl::StrCat("export-", cohortctl::ExportFormatName(format)));
    int calls = 0;
    const absl::Status exported = cohortctl::ExportSafetensors(
        client, client.manifest(), out, cohortctl::ExportOptions{.format = format},
        [&](const cohortctl::ExportProgress& p) {
          ++calls;
          EXPECT_EQ(p.tensors, 16);
          if (p.tensors_done == p.tensors) {
            EXPECT_EQ(p.bytes_done, p.bytes);
          }
        });
    ASSERT_TRUE(exported.ok()) << exported;
    EXPECT_EQ(calls, 16);
    const std::vector<float> loaded = LoadWhole(out, config);
    EXPECT_TRUE(BitwiseEqual(loaded.data(), params.data(), params.size()))
        << cohortctl::ExportFormatName(format);
  }

  // The hf-gpt2 export holds PyTorch's tensors, bit for bit, and nothing else
  // but what HF's own save keeps (no lm_head.weight, no mask buffers).
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> exported =
      SafetensorsReader::Open(File("export-hf-gpt2"));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> torch =
      SafetensorsReader::Open(File("hf.safetensors"));
  ASSERT_TRUE(exported.ok() && torch.ok());
  EXPECT_EQ((*exported)->metadata().at("format"), "pt");
  EXPECT_EQ((*exported)->metadata().at("model"), checkpoint::ModelFingerprint(config));
  EXPECT_EQ((*exported)->tensors().size(), 4u + 12u * config.layers);
  for (const SafetensorsEntry& t : (*exported)->tensors()) {
    const SafetensorsEntry* reference = (*torch)->Find(t.name);
    ASSERT_NE(reference, nullptr) << t.name;
    EXPECT_EQ(t.shape, reference->shape) << t.name;
    std::vector<float> a(static_cast<size_t>(t.NumElements())), b(a.size());
    ASSERT_TRUE((*exported)->ReadFloat32(t, a.data()).ok());
    ASSERT_TRUE((*torch)->ReadFloat32(*reference, b.data()).ok());
    EXPECT_TRUE(BitwiseEqual(a.data(), b.data(), a.size())) << t.name;
  }

  // Cohort's layout records its model: another one is refused, naming the field.
  GptConfig more_heads = config;
  more_heads.heads = 8;
  const ParameterTable table(more_heads);
  std::vector<float> out(table.num_params());
  const absl::Status refused =
      LoadInitialWeights(File("export-safetensors"), more_heads, table, out.data());
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("model.heads is 8 in the job but 4 in the file"));

  // hf-gpt2 needs the model's shape.
  client.manifest().mutable_objects()->erase("model");
  const absl::Status no_model = cohortctl::ExportSafetensors(
      client, client.manifest(), File("export-none"),
      cohortctl::ExportOptions{.format = cohortctl::ExportFormat::kHfGpt2}, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(no_model)) << no_model;
  EXPECT_THAT(no_model.message(), HasSubstr("records no model shape"));
  EXPECT_NE(access(File("export-none").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace cohort::model
