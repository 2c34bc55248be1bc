// The Cohort <-> Hugging Face GPT-2 mapping: names, shapes and the Conv1D
// orientation element by element; Cohort -> HF file -> Cohort bitwise; the
// name variants HF files come in (no "transformer." prefix, mask buffers, a
// tied lm_head.weight, half precision); and errors that name the tensor and
// the job field that disagrees.

#include "common/gpt2_hf_layout.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"

namespace cohort {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const GptShape kModel{
    .layers = 2, .heads = 2, .width = 8, .vocab_size = 10, .padded_vocab = 16, .context_length = 6};

struct FileTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

FileTensor F32(std::string name, std::vector<int64_t> shape, const float* values) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return FileTensor{std::move(name), "F32", std::move(shape),
                    std::string(reinterpret_cast<const char*>(values), n * sizeof(float))};
}

// Writes a safetensors file of `tensors` in this order (the format by hand,
// so tests choose names, dtypes and shapes freely).
std::string WriteFile(const std::vector<FileTensor>& tensors, const std::string& name = "m") {
  std::vector<std::string> entries = {R"("__metadata__":{"format":"pt"})"};
  std::string data;
  for (const FileTensor& t : tensors) {
    entries.push_back(absl::StrCat("\"", t.name, "\":{\"dtype\":\"", t.dtype, "\",\"shape\":[",
                                   absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", data.size(),
                                   ",", data.size() + t.bytes.size(), "]}"));
    data += t.bytes;
  }
  const std::string header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  std::string file;
  for (int i = 0; i < 8; ++i) file.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  file += header + data;
  const std::string path = testing::MakeTempDir("gpt2_hf_layout") + "/" + name + ".safetensors";
  std::ofstream(path, std::ios::binary)
      .write(file.data(), static_cast<std::streamsize>(file.size()));
  return path;
}

// Random whole Cohort tensors of `model` (multiples of 1/256 in (-1, 1), so
// exact in half precision too); wte's padding rows zero.
std::map<std::string, std::vector<float>> RandomModel(const GptShape& model, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::map<std::string, std::vector<float>> out;
  for (const std::string& name : CohortTensorNames()) {
    const std::vector<int64_t> shape = *CohortGlobalShape(model, name);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    for (float& v : values) v = static_cast<float>(static_cast<int>(rng() % 511) - 255) / 256.0f;
    if (name == "wte") {
      std::fill(values.begin() + int64_t{model.vocab_size} * model.width, values.end(), 0.0f);
    }
    out[name] = std::move(values);
  }
  return out;
}

// The HF tensors of `weights`, in Cohort's tensor order.
std::vector<FileTensor> ToHf(const GptShape& model,
                             const std::map<std::string, std::vector<float>>& weights) {
  std::vector<FileTensor> out;
  for (const std::string& name : CohortTensorNames()) {
    const absl::Status s =
        CohortToHf(model, name, *CohortGlobalShape(model, name), weights.at(name).data(),
                   [&](const HfTensorSpec& spec, const float* values) {
                     out.push_back(F32(spec.name, spec.shape, values));
                     return absl::OkStatus();
                   });
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::vector<float>>> Import(const std::string& path,
                                                                 const GptShape& model) {
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file = SafetensorsReader::Open(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<HfGpt2Importer> importer = HfGpt2Importer::Create(file->get(), model);
  if (!importer.ok()) return importer.status();
  std::map<std::string, std::vector<float>> out;
  for (const std::string& name : CohortTensorNames()) {
    const std::vector<int64_t> shape = *CohortGlobalShape(model, name);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> values(static_cast<size_t>(n), -1.0f);
    if (absl::Status s = importer->Assemble(name, values.data()); !s.ok()) return s;
    out[name] = std::move(values);
  }
  return out;
}

void ExpectBitwiseEqual(const std::map<std::string, std::vector<float>>& a,
                        const std::map<std::string, std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, values] : a) {
    const std::vector<float>& other = b.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    EXPECT_EQ(std::memcmp(values.data(), other.data(), values.size() * sizeof(float)), 0) << name;
  }
}

std::string ImportError(const std::vector<FileTensor>& tensors, const GptShape& model) {
  absl::StatusOr<std::map<std::string, std::vector<float>>> got = Import(WriteFile(tensors), model);
  EXPECT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
  return std::string(got.status().message());
}

TEST(Gpt2HfLayoutTest, FingerprintRoundTripsAndRejectsWhatItCannotRead) {
  const std::string text = FormatModelFingerprint(kModel);
  EXPECT_EQ(text, "layers=2 heads=2 width=8 vocab=10 padded_vocab=16 context=6");
  absl::StatusOr<GptShape> parsed = ParseModelFingerprint(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, kModel);
  for (const auto& [bad, message] : std::vector<std::pair<std::string, std::string>>{
           {"layers=2 heads=2 width=8 vocab=10 padded_vocab=16", "context is missing"},
           {text + " rope=1", "unknown field \"rope=1\""},
           {text + " layers=3", "layers appears twice"},
           {"layers=0 heads=2 width=8 vocab=10 padded_vocab=16 context=6", "layers must be"},
           {"layers=x heads=2 width=8 vocab=10 padded_vocab=16 context=6", "layers must be"},
           {"layers=2 heads=3 width=8 vocab=10 padded_vocab=16 context=6", "heads must divide"},
           {"layers=2 heads=2 width=8 vocab=10 padded_vocab=8 context=6", "padded_vocab is below"},
           {"", "layers is missing"},
           {"layers=2  heads=2 width=8 vocab=10 padded_vocab=16 context=6", "unknown field \"\""},
       }) {
    const absl::StatusOr<GptShape> s = ParseModelFingerprint(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr(message)) << bad;
  }
}

TEST(Gpt2HfLayoutTest, NamesAndShapes) {
  EXPECT_THAT(CohortTensorNames(),
              ElementsAre("wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                          "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"));
  EXPECT_THAT(*CohortGlobalShape(kModel, "wte"), ElementsAre(16, 8));
  EXPECT_THAT(*CohortGlobalShape(kModel, "qkvw"), ElementsAre(2, 3, 8, 8));
  EXPECT_THAT(*CohortGlobalShape(kModel, "qkvb"), ElementsAre(2, 3, 8));
  EXPECT_THAT(*CohortGlobalShape(kModel, "fcprojw"), ElementsAre(2, 8, 32));
  EXPECT_THAT(*CohortGlobalShape(kModel, "lnfb"), ElementsAre(8));
  EXPECT_TRUE(absl::IsInvalidArgument(CohortGlobalShape(kModel, "lm_head").status()));

  absl::StatusOr<std::vector<HfTensorSpec>> wte = HfTensorsOf(kModel, "wte");
  ASSERT_TRUE(wte.ok());
  ASSERT_EQ(wte->size(), 1u);
  EXPECT_EQ((*wte)[0].name, "transformer.wte.weight");
  EXPECT_THAT((*wte)[0].shape, ElementsAre(10, 8));  // the padding rows dropped
  absl::StatusOr<std::vector<HfTensorSpec>> qkvw = HfTensorsOf(kModel, "qkvw");
  ASSERT_TRUE(qkvw.ok());
  ASSERT_EQ(qkvw->size(), 2u);
  EXPECT_EQ((*qkvw)[1].name, "transformer.h.1.attn.c_attn.weight");
  EXPECT_THAT((*qkvw)[1].shape, ElementsAre(8, 24));
  EXPECT_THAT((*HfTensorsOf(kModel, "fcprojw"))[0].shape, ElementsAre(32, 8));
  EXPECT_EQ((*HfTensorsOf(kModel, "lnfw"))[0].name, "transformer.ln_f.weight");
  EXPECT_EQ((*HfTensorsOf(kModel, "fcb"))[0].name, "transformer.h.0.mlp.c_fc.bias");
}

TEST(Gpt2HfLayoutTest, ConvWeightsAreTransposedAndQkvKeepsItsBlocks) {
  const auto weights = RandomModel(kModel, 1);
  std::map<std::string, FileTensor> hf;
  for (FileTensor& t : ToHf(kModel, weights)) hf[t.name] = std::move(t);
  const int C = kModel.width;
  const auto at = [&](const std::string& name, int64_t i) {
    float v;
    std::memcpy(&v, hf.at(name).bytes.data() + i * sizeof(float), sizeof(float));
    return v;
  };
  for (int l = 0; l < kModel.layers; ++l) {
    const std::string h = absl::StrCat("transformer.h.", l, ".");
    // Cohort qkvw[l][block][o][i] (out, in) is c_attn.weight[i][block*C + o] (in, out).
    for (int block = 0; block < 3; ++block)
      for (int o = 0; o < C; ++o)
        for (int i = 0; i < C; ++i) {
          const float cohort = weights.at("qkvw")[((l * 3 + block) * C + o) * C + i];
          ASSERT_EQ(at(h + "attn.c_attn.weight", i * 3 * C + block * C + o), cohort);
        }
    for (int j = 0; j < 3 * C; ++j) {
      ASSERT_EQ(at(h + "attn.c_attn.bias", j), weights.at("qkvb")[l * 3 * C + j]);
    }
    // fcprojw (C, 4C) is mlp.c_proj.weight (4C, C) transposed.
    for (int o = 0; o < C; ++o)
      for (int i = 0; i < 4 * C; ++i) {
        ASSERT_EQ(at(h + "mlp.c_proj.weight", i * C + o),
                  weights.at("fcprojw")[(l * C + o) * 4 * C + i]);
      }
  }
  EXPECT_EQ(hf.at("transformer.wte.weight").bytes.size(), 10u * C * sizeof(float));
  EXPECT_EQ(at("transformer.wte.weight", 9 * C + 7), weights.at("wte")[9 * C + 7]);
  EXPECT_EQ(hf.size(), 4u + 12u * kModel.layers);
}

TEST(Gpt2HfLayoutTest, CohortToHfToCohortIsBitwise) {
  const auto weights = RandomModel(kModel, 2);
  absl::StatusOr<std::map<std::string, std::vector<float>>> back =
      Import(WriteFile(ToHf(kModel, weights)), kModel);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectBitwiseEqual(weights, *back);
}

TEST(Gpt2HfLayoutTest, AcceptsHubNamesMaskBuffersATiedHeadAndHalfPrecision) {
  const auto weights = RandomModel(kModel, 3);
  std::vector<FileTensor> tensors = ToHf(kModel, weights);
  for (FileTensor& t : tensors) {
    t.name = t.name.substr(std::string("transformer.").size());
    // Half precision: the values are exact in F16.
    std::string half;
    for (size_t i = 0; i < t.bytes.size(); i += 4) {
      uint32_t bits;
      std::memcpy(&bits, t.bytes.data() + i, 4);
      ASSERT_EQ(bits & 0x1FFFu, 0u);
      const int exponent = static_cast<int>((bits >> 23) & 0xFF);
      const uint16_t h = static_cast<uint16_t>(
          ((bits >> 16) & 0x8000u) |
          (exponent == 0 ? 0u : (static_cast<uint32_t>(exponent - 127 + 15) << 10)) |
          ((bits >> 13) & 0x3FFu));
      half.append(reinterpret_cast<const char*>(&h), 2);
    }
    t.bytes = half;
    t.dtype = "F16";
  }
  tensors.push_back(tensors[0]);  // wte.weight
  tensors.back().name = "lm_head.weight";
  for (int l = 0; l < kModel.layers; ++l) {
    tensors.push_back(FileTensor{
        absl::StrCat("h.", l, ".attn.bias"), "BOOL", {1, 1, 6, 6}, std::string(36, '\1')});
    const float masked = -1e4f;
    tensors.push_back(F32(absl::StrCat("h.", l, ".attn.masked_bias"), {}, &masked));
  }
  absl::StatusOr<std::map<std::string, std::vector<float>>> back =
      Import(WriteFile(tensors), kModel);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectBitwiseEqual(weights, *back);
}

TEST(Gpt2HfLayoutTest, AnUntiedHeadIsRefused) {
  const auto weights = RandomModel(kModel, 4);
  std::vector<FileTensor> tensors = ToHf(kModel, weights);
  FileTensor head = tensors[0];
  head.name = "lm_head.weight";
  float changed;
  std::memcpy(&changed, head.bytes.data() + (3 * 8 + 5) * 4, 4);
  changed += 1.0f;
  std::memcpy(head.bytes.data() + (3 * 8 + 5) * 4, &changed, 4);
  tensors.push_back(head);
  EXPECT_THAT(ImportError(tensors, kModel),
              HasSubstr("lm_head.weight differs from transformer.wte.weight at row 3 column 5: "
                        "an untied LM head is not supported"));
  // A head of another shape is refused before anything is read.
  tensors.back() = F32("lm_head.weight", {4, 8}, weights.at("wte").data());
  EXPECT_THAT(ImportError(tensors, kModel), HasSubstr("\"lm_head.weight\" has shape [4, 8]"));
}

TEST(Gpt2HfLayoutTest, ShapeErrorsNameTheJobField) {
  GptShape narrow = kModel;
  narrow.width = 4;
  EXPECT_THAT(ImportError(ToHf(narrow, RandomModel(narrow, 5)), kModel),
              HasSubstr("model.width 8 but transformer.wte.weight has 4 columns"));

  GptShape deeper = kModel;
  deeper.layers = 3;
  EXPECT_THAT(ImportError(ToHf(kModel, RandomModel(kModel, 6)), deeper),
              HasSubstr("lacks transformer.h.2.ln_1.weight: model.layers is 3 but the file "
                        "holds 2 layers"));
  EXPECT_THAT(ImportError(ToHf(deeper, RandomModel(deeper, 6)), kModel),
              HasSubstr("\"transformer.h.2.ln_1.weight\" belongs to layer 2 but model.layers is "
                        "2"));

  GptShape bigger_vocab = kModel;
  bigger_vocab.vocab_size = 12;
  EXPECT_THAT(ImportError(ToHf(bigger_vocab, RandomModel(bigger_vocab, 7)), kModel),
              HasSubstr("model.vocab_size 10 but transformer.wte.weight has 12 rows: the file's "
                        "vocabulary is larger than the job's"));

  GptShape longer = kModel;
  longer.context_length = 7;
  EXPECT_THAT(ImportError(ToHf(longer, RandomModel(longer, 8)), kModel),
              HasSubstr("model.context_length 6 but transformer.wpe.weight has 7 rows"));

  std::vector<FileTensor> tensors = ToHf(kModel, RandomModel(kModel, 9));
  for (FileTensor& t : tensors) {
    if (t.name == "transformer.h.1.attn.c_attn.weight") {
      t.shape = {8, 16};
      t.bytes.resize(8 * 16 * 4);
    }
  }
  EXPECT_THAT(ImportError(tensors, kModel),
              HasSubstr("model.width 8 but transformer.h.1.attn.c_attn.weight has 16 columns "
                        "(expected 3 x 8 = 24)"));
}

TEST(Gpt2HfLayoutTest, ASmallerVocabularyLeavesZeroRows) {
  GptShape smaller = kModel;
  smaller.vocab_size = 7;
  const auto file_weights = RandomModel(smaller, 10);
  absl::StatusOr<std::map<std::string, std::vector<float>>> back =
      Import(WriteFile(ToHf(smaller, file_weights)), kModel);
  ASSERT_TRUE(back.ok()) << back.status();
  const std::vector<float>& wte = back->at("wte");
  for (size_t i = 0; i < wte.size(); ++i) {
    EXPECT_EQ(wte[i], i < 7 * 8 ? file_weights.at("wte")[i] : 0.0f) << i;
  }
}

TEST(Gpt2HfLayoutTest, NameErrors) {
  std::vector<FileTensor> tensors = ToHf(kModel, RandomModel(kModel, 11));
  const float one = 1.0f;

  std::vector<FileTensor> extra = tensors;
  extra.push_back(F32("transformer.h.0.attn.rotary", {1}, &one));
  EXPECT_THAT(ImportError(extra, kModel),
              HasSubstr("\"transformer.h.0.attn.rotary\" is not a tensor of Hugging Face's GPT-2 "
                        "layout"));
  extra.back() = F32("transformer.h.01.ln_1.weight", {1}, &one);
  EXPECT_THAT(ImportError(extra, kModel), HasSubstr("is not a tensor of Hugging Face's"));
  extra.back() = F32("transformer.lm_head.weight", {1}, &one);
  EXPECT_THAT(ImportError(extra, kModel), HasSubstr("is not a tensor of Hugging Face's"));

  std::vector<FileTensor> twice = tensors;
  twice.push_back(tensors.back());
  twice.back().name = "ln_f.bias";
  EXPECT_THAT(ImportError(twice, kModel),
              HasSubstr("appears both with and without the \"transformer.\" prefix"));

  std::vector<FileTensor> integer = tensors;
  integer.back().dtype = "I32";
  EXPECT_THAT(ImportError(integer, kModel), HasSubstr("is I32; weights must be F32"));

  std::vector<FileTensor> missing(tensors.begin(), tensors.end() - 1);
  EXPECT_THAT(ImportError(missing, kModel), HasSubstr("lacks transformer.ln_f.bias"));
}

TEST(Gpt2HfLayoutTest, ExportRefusesAWrongShapeAndPassesOnSinkErrors) {
  const auto weights = RandomModel(kModel, 12);
  const absl::Status shape =
      CohortToHf(kModel, "qkvw", {2, 24, 8}, weights.at("qkvw").data(),
                 [](const HfTensorSpec&, const float*) { return absl::OkStatus(); });
  EXPECT_TRUE(absl::IsInvalidArgument(shape)) << shape;
  EXPECT_THAT(shape.message(), HasSubstr("gives it [2, 3, 8, 8]"));
  int calls = 0;
  const absl::Status sink = CohortToHf(kModel, "fcw", {2, 32, 8}, weights.at("fcw").data(),
                                       [&](const HfTensorSpec&, const float*) {
                                         ++calls;
                                         return absl::InternalError("disk full");
                                       });
  EXPECT_EQ(sink, absl::InternalError("disk full"));
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace cohort
