// SafetensorsReader: what a well-formed file holds (names, dtypes, shapes,
// offsets, metadata, float32 values, F16/BF16/F64 converted), and that a
// malformed or truncated file is DataLoss naming the file and tensor rather
// than a crash or a read outside the file.

#include "common/safetensors_reader.h"

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"

namespace cohort {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// u64 LE length | header | data, exactly as given (no padding or checks).
std::string RawFile(const std::string& header, const std::string& data,
                    uint64_t length_field = UINT64_MAX) {
  const uint64_t n = length_field == UINT64_MAX ? header.size() : length_field;
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  return out + header + data;
}

std::string WriteTemp(const std::string& bytes, const std::string& name = "t.safetensors") {
  const std::string path = testing::MakeTempDir("safetensors_reader") + "/" + name;
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

absl::Status ParseError(const std::string& header, uint64_t data_bytes) {
  return ParseSafetensorsHeader(header, data_bytes, "f.safetensors").status();
}

TEST(SafetensorsReaderTest, ReadsTensorsMetadataAndRanges) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.125f};
  const std::vector<float> b = {42.0f};
  // b is listed first but stored second; padding spaces after the object.
  const std::string header =
      R"({"b":{"dtype":"F32","shape":[],"data_offsets":[24,28]},)"
      R"("__metadata__":{"format":"pt","note":"caf\u00e9 \ud83d\ude00"},)"
      R"("a\/x":{"shape":[2,3],"data_offsets":[0,24],"dtype":"F32","extra":[{"k":[1,null,true]}]}}   )";
  const std::string path = WriteTemp(RawFile(header, Bytes(a) + Bytes(b)));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file = SafetensorsReader::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsReader& r = **file;
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.tensors()[0].name, "a/x");  // in data order
  EXPECT_EQ(r.tensors()[0].dtype, "F32");
  EXPECT_THAT(r.tensors()[0].shape, ElementsAre(2, 3));
  EXPECT_EQ(r.tensors()[0].file_offset, 8 + header.size());
  EXPECT_EQ(r.tensors()[0].bytes, 24u);
  EXPECT_EQ(r.tensors()[1].NumElements(), 1);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("note"), "caf\xC3\xA9 \xF0\x9F\x98\x80");
  ASSERT_NE(r.Find("b"), nullptr);
  EXPECT_EQ(r.Find("c"), nullptr);

  std::vector<float> got(6);
  ASSERT_TRUE(r.ReadFloat32(*r.Find("a/x"), got.data()).ok());
  EXPECT_EQ(got, a);
  std::vector<float> part(2);
  ASSERT_TRUE(r.ReadFloat32(*r.Find("a/x"), 3, 2, part.data()).ok());
  EXPECT_THAT(part, ElementsAre(0.0f, 7.0f));
  float scalar = 0;
  ASSERT_TRUE(r.ReadFloat32(*r.Find("b"), &scalar).ok());
  EXPECT_EQ(scalar, 42.0f);

  const absl::Status outside = r.ReadFloat32(*r.Find("a/x"), 5, 2, part.data());
  EXPECT_TRUE(absl::IsInvalidArgument(outside)) << outside;
  EXPECT_THAT(outside.message(), HasSubstr("\"a/x\""));
}

TEST(SafetensorsReaderTest, ConvertsHalfBfloatAndDouble) {
  // F16 bit patterns and their exact values.
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001,
                                     0x8000, 0x3555, 0x7C00, 0xFC00};
  const std::vector<float> f16_values = {1.0f,
                                         -2.0f,
                                         65504.0f,
                                         std::ldexp(1.0f, -24),
                                         -0.0f,
                                         0.333251953125f,
                                         std::numeric_limits<float>::infinity(),
                                         -std::numeric_limits<float>::infinity()};
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC049, 0x0001};
  const std::vector<float> bf16_values = {1.0f, -3.140625f, std::bit_cast<float>(0x00010000u)};
  const std::vector<double> f64 = {0.1, -1e300};
  const std::vector<uint16_t> nan = {0x7E00};
  const std::string header =
      absl::StrCat(R"({"h":{"dtype":"F16","shape":[8],"data_offsets":[0,16]},)",
                   R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},)",
                   R"("d":{"dtype":"F64","shape":[2],"data_offsets":[22,38]},)",
                   R"("n":{"dtype":"F16","shape":[1],"data_offsets":[38,40]},)",
                   R"("i":{"dtype":"I64","shape":[1],"data_offsets":[40,48]}})");
  const std::string path = WriteTemp(
      RawFile(header, Bytes(f16) + Bytes(bf16) + Bytes(f64) + Bytes(nan) + std::string(8, '\0')));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file = SafetensorsReader::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsReader& r = **file;

  std::vector<float> got(8);
  ASSERT_TRUE(r.ReadFloat32(*r.Find("h"), got.data()).ok());
  for (size_t i = 0; i < f16.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(f16_values[i])) << i;
  }
  ASSERT_TRUE(r.ReadFloat32(*r.Find("b"), got.data()).ok());
  for (size_t i = 0; i < bf16.size(); ++i) EXPECT_EQ(got[i], bf16_values[i]) << i;
  ASSERT_TRUE(r.ReadFloat32(*r.Find("d"), got.data()).ok());
  EXPECT_EQ(got[0], 0.1f);
  EXPECT_EQ(got[1], -std::numeric_limits<float>::infinity());
  ASSERT_TRUE(r.ReadFloat32(*r.Find("n"), got.data()).ok());
  EXPECT_TRUE(std::isnan(got[0]));
  const absl::Status integer = r.ReadFloat32(*r.Find("i"), got.data());
  EXPECT_TRUE(absl::IsInvalidArgument(integer)) << integer;
  EXPECT_THAT(integer.message(), HasSubstr("is I64"));
}

TEST(SafetensorsReaderTest, ShortOrOversizedFilesAreDataLoss) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  const std::string good = RawFile(header, std::string(16, '\0'));
  struct Case {
    std::string bytes;
    std::string message;
  } cases[] = {
      {"", "fewer than the 8"},
      {good.substr(0, 5), "fewer than the 8"},
      {good.substr(0, 8 + header.size() - 3), "runs past the end"},
      {RawFile(header, "", kMaxSafetensorsHeaderBytes + 1), "exceeds the format's limit"},
      {RawFile(header, "", UINT64_MAX - 1), "exceeds the format's limit"},
      // The data ends 4 bytes early: w's offsets leave the file.
      {good.substr(0, good.size() - 4), "outside the data section of 12 bytes"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteTemp(c.bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> file = SafetensorsReader::Open(path);
    ASSERT_FALSE(file.ok()) << c.message;
    EXPECT_TRUE(absl::IsDataLoss(file.status())) << file.status();
    EXPECT_THAT(file.status().message(), HasSubstr(path));
    EXPECT_THAT(file.status().message(), HasSubstr(c.message));
  }
  const absl::StatusOr<std::unique_ptr<SafetensorsReader>> missing =
      SafetensorsReader::Open(testing::MakeTempDir("safetensors_reader") + "/none");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

TEST(SafetensorsReaderTest, AFileThatShrinksAfterOpenIsDataLoss) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  const std::string path = WriteTemp(RawFile(header, std::string(16, '\0')));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file = SafetensorsReader::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(8 + header.size() + 6)), 0);
  std::vector<float> got(4);
  const absl::Status read = (*file)->ReadFloat32(*(*file)->Find("w"), got.data());
  EXPECT_TRUE(absl::IsDataLoss(read)) << read;
  EXPECT_THAT(read.message(), HasSubstr("\"w\""));
}

TEST(SafetensorsReaderTest, OffsetsMustFitTheShapeAndTheDataAndNotOverlap) {
  struct Case {
    std::string header;
    std::string message;
  } cases[] = {
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,20]}})", "outside the data section"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,4]}})", "outside the data section"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})",
       "spans 12 bytes but F32 [4] takes 16"},
      {R"({"w":{"dtype":"F16","shape":[4],"data_offsets":[0,16]}})",
       "spans 16 bytes but F16 [4] takes 8"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       "\"v\" overlaps tensor \"w\""},
      {R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}})",
       "too large to address"},
      {R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,16]}})",
       "too large to address"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", "not [begin, end]"},
      {R"({"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", "unknown dtype \"Q4\""},
      {R"({"w":{"shape":[4],"data_offsets":[0,16]}})", "lacks \"dtype\""},
      {R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", "lacks \"shape\""},
      {R"({"w":{"dtype":"F32","shape":[4]}})", "lacks \"data_offsets\""},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
       R"("w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       "appears twice"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ParseError(c.header, 16);
    EXPECT_TRUE(absl::IsDataLoss(s)) << c.header << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("f.safetensors")) << c.header;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.header;
  }
  // A gap and an empty tensor are fine.
  EXPECT_TRUE(ParseError(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                         R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}})",
                         16)
                  .ok());
}

TEST(SafetensorsReaderTest, MalformedJsonIsDataLoss) {
  const std::string deep = std::string(40, '[') + std::string(40, ']');
  const std::string cases[] = {
      "",
      "[]",
      "{",
      R"({"w")",
      R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}} x)",
      R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})",
      R"({"w":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}})",
      R"({"w":{"dtype":"F32","shape":[04],"data_offsets":[0,16]}})",
      R"({"w":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,16]}})",
      R"({"w":{"dtype":F32,"shape":[4],"data_offsets":[0,16]}})",
      R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],}})",
      "{\"w\x01\":{}}",
      R"({"\ud800":{}})",
      R"({"\uzzzz":{}})",
      R"({"\q":{}})",
      R"({"__metadata__":{"a":1}})",
      R"({"__metadata__":{"a":"1","a":"2"}})",
      R"({"__metadata__":{},"__metadata__":{}})",
      R"({"":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",  // weights_file_fuzzer
      absl::StrCat(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":)", deep, "}}"),
  };
  for (const std::string& header : cases) {
    const absl::Status s = ParseError(header, 16);
    EXPECT_TRUE(absl::IsDataLoss(s)) << header << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("f.safetensors")) << header;
  }
  // Nesting within the bound is skipped.
  const std::string shallow = std::string(20, '[') + std::string(20, ']');
  EXPECT_TRUE(
      ParseError(absl::StrCat(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":)",
                              shallow, "}}"),
                 16)
          .ok());
}

}  // namespace
}  // namespace cohort
