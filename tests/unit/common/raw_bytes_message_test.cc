#include "common/raw_bytes_message.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cohort/v1/checkpoints.pb.h"
#include "common/crc32c.h"
#include "grpcpp/impl/codegen/proto_utils.h"

namespace cohort {
namespace {

constexpr uint32_t kUploadData = v1::UploadRequest::kDataFieldNumber;
constexpr uint32_t kDownloadData = v1::DownloadResponse::kDataFieldNumber;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

template <typename Message>
grpc::ByteBuffer Serialize(const Message& message) {
  grpc::ByteBuffer buffer;
  bool own = false;
  EXPECT_TRUE(grpc::SerializationTraits<Message>::Serialize(message, &buffer, &own).ok());
  return buffer;
}

template <typename Message>
Message Parse(grpc::ByteBuffer buffer) {
  Message message;
  EXPECT_TRUE(grpc::SerializationTraits<Message>::Deserialize(&buffer, &message).ok());
  return message;
}

// The same bytes cut into slices at arbitrary points, as received messages
// arrive.
grpc::ByteBuffer Resliced(const grpc::ByteBuffer& buffer, const std::vector<size_t>& cuts) {
  grpc::Slice whole;
  EXPECT_TRUE(buffer.DumpToSingleSlice(&whole).ok());
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    cut = std::min(cut, whole.size());
    if (cut <= at) continue;
    slices.emplace_back(whole.begin() + at, cut - at);
    at = cut;
  }
  slices.emplace_back(whole.begin() + at, whole.size() - at);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(BytesFieldMessageTest, ParsesAsTheProtobufDataField) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383},
                      size_t{16384}, size_t{1} << 20, (size_t{1} << 20) + 3}) {
    const std::string data = RandomBytes(size, static_cast<uint32_t>(size));
    const v1::UploadRequest upload =
        Parse<v1::UploadRequest>(BytesFieldMessage(kUploadData, data.data(), data.size()));
    EXPECT_EQ(upload.part_case(), v1::UploadRequest::kData) << size;
    EXPECT_EQ(upload.data(), data) << size;

    bool released = false;
    const v1::DownloadResponse download = Parse<v1::DownloadResponse>(BytesFieldMessage(
        kDownloadData, data.data(), data.size(),
        [](void* flag) { *static_cast<bool*>(flag) = true; }, &released));
    EXPECT_TRUE(released) << "the buffer was destroyed, so its bytes must have been released";
    EXPECT_EQ(download.data(), data) << size;
  }
}

TEST(BytesFieldMessageTest, EncodesExactlyAsProtobufDoes) {
  const std::string data = RandomBytes(300000, 7);
  v1::UploadRequest request;
  request.set_data(data);
  grpc::Slice ours, theirs;
  ASSERT_TRUE(BytesFieldMessage(kUploadData, data.data(), data.size()).DumpToSingleSlice(&ours).ok());
  ASSERT_TRUE(Serialize(request).DumpToSingleSlice(&theirs).ok());
  ASSERT_EQ(ours.size(), theirs.size());
  EXPECT_EQ(0, std::memcmp(ours.begin(), theirs.begin(), ours.size()));
}

TEST(BytesFieldViewTest, CopiesThePayloadWithItsCrcAcrossAnySlicing) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t size = trial < 5 ? static_cast<size_t>(trial) : rng() % 300000;
    const std::string data = RandomBytes(size, static_cast<uint32_t>(trial));
    v1::UploadRequest request;
    request.set_data(data);
    const grpc::ByteBuffer encoded = Serialize(request);
    std::vector<size_t> cuts;
    const size_t pieces = rng() % 6;
    for (size_t i = 0; i < pieces; ++i) cuts.push_back(rng() % (encoded.Length() + 1));
    // Cuts inside the key and length varints too.
    if (trial % 3 == 0) cuts.insert(cuts.begin(), {1, 2});
    std::sort(cuts.begin(), cuts.end());
    const grpc::ByteBuffer received = Resliced(encoded, cuts);

    std::optional<BytesFieldView> view = BytesFieldView::Of(received, kUploadData);
    ASSERT_TRUE(view.has_value()) << "trial " << trial;
    ASSERT_EQ(view->size(), size);
    std::string out(size, '\0');
    EXPECT_EQ(view->CopyAndExtendCrc32c(out.data(), 0), Crc32c(data)) << "trial " << trial;
    EXPECT_EQ(out, data) << "trial " << trial;
  }
}

TEST(BytesFieldViewTest, ExtendsTheCrcGiven) {
  const std::string a = RandomBytes(1000, 1), b = RandomBytes(70000, 2);
  v1::UploadRequest request;
  request.set_data(b);
  std::optional<BytesFieldView> view = BytesFieldView::Of(Serialize(request), kUploadData);
  ASSERT_TRUE(view.has_value());
  std::string out(b.size(), '\0');
  EXPECT_EQ(view->CopyAndExtendCrc32c(out.data(), Crc32c(a)), Crc32c(a + b));
}

TEST(BytesFieldViewTest, LeavesEveryOtherMessageToProtobuf) {
  v1::UploadRequest header;
  header.mutable_header()->set_job_id("j");
  EXPECT_FALSE(BytesFieldView::Of(Serialize(header), kUploadData).has_value());

  v1::UploadRequest chunk;
  chunk.mutable_chunk()->set_tensor("wte");
  chunk.mutable_chunk()->set_bytes(4);
  EXPECT_FALSE(BytesFieldView::Of(Serialize(chunk), kUploadData).has_value());

  v1::UploadRequest data;
  data.set_data("abcd");
  // The right field, asked for as another one.
  EXPECT_FALSE(BytesFieldView::Of(Serialize(data), kUploadData + 1).has_value());

  grpc::Slice encoded;
  ASSERT_TRUE(Serialize(data).DumpToSingleSlice(&encoded).ok());
  const std::string field(reinterpret_cast<const char*>(encoded.begin()), encoded.size());
  auto view_of = [](const std::string& bytes) {
    grpc::Slice slice(bytes.data(), bytes.size());
    return BytesFieldView::Of(grpc::ByteBuffer(&slice, 1), kUploadData);
  };
  EXPECT_TRUE(view_of(field).has_value());
  // The field twice (protobuf keeps the last), a trailing unknown field
  // (protobuf keeps it), a truncated payload, a truncated length.
  EXPECT_FALSE(view_of(field + field).has_value());
  EXPECT_FALSE(view_of(field + std::string("\x28\x01", 2)).has_value());
  EXPECT_FALSE(view_of(field.substr(0, field.size() - 1)).has_value());
  EXPECT_FALSE(view_of(field.substr(0, 1)).has_value());
  // An over-long varint length.
  EXPECT_FALSE(view_of(std::string("\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12))
                   .has_value());
  EXPECT_FALSE(view_of("").has_value());
}

}  // namespace
}  // namespace cohort
