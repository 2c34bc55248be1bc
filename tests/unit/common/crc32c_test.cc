#include "common/crc32c.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace cohort {
namespace {

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 (iSCSI) B.4 and the common check value.
  EXPECT_EQ(Crc32c(std::string("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(std::string()), 0u);
}

TEST(Crc32cTest, ExtendEqualsWholeAndPortableEqualsHardware) {
  std::mt19937 rng(5);
  std::vector<unsigned char> bytes(100003);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  const uint32_t whole = Crc32c(bytes.data(), bytes.size());
  EXPECT_EQ(internal::Crc32cExtendPortable(0, bytes.data(), bytes.size()), whole);
  for (size_t cut : {0ul, 1ul, 7ul, 8ul, 4099ul, 100002ul, 100003ul}) {
    SCOPED_TRACE(cut);
    const uint32_t head = Crc32c(bytes.data(), cut);
    EXPECT_EQ(Crc32cExtend(head, bytes.data() + cut, bytes.size() - cut), whole);
    EXPECT_EQ(internal::Crc32cExtendPortable(
                  internal::Crc32cExtendPortable(0, bytes.data(), cut), bytes.data() + cut,
                  bytes.size() - cut),
              whole);
  }
}

// Around and across the parallel three-lane blocks of the hardware path
// (3 x 4096 bytes), with every kind of offset, against the portable path.
TEST(Crc32cTest, ParallelLanesMatchThePortablePathAtEveryLength) {
  std::mt19937 rng(11);
  std::vector<unsigned char> bytes(3 * 4096 * 4 + 64);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  for (size_t n : {12287ul, 12288ul, 12289ul, 12295ul, 24576ul, 24583ul, 36864ul, 49151ul}) {
    for (size_t offset : {0ul, 1ul, 5ul, 8ul}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " offset " << offset);
      EXPECT_EQ(Crc32cExtend(0x12345678u, bytes.data() + offset, n),
                internal::Crc32cExtendPortable(0x12345678u, bytes.data() + offset, n));
    }
  }
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::vector<unsigned char> bytes(64, 0x5A);
  const uint32_t clean = Crc32c(bytes.data(), bytes.size());
  for (size_t i = 0; i < bytes.size() * 8; ++i) {
    bytes[i / 8] ^= static_cast<unsigned char>(1u << (i % 8));
    EXPECT_NE(Crc32c(bytes.data(), bytes.size()), clean) << "bit " << i;
    bytes[i / 8] ^= static_cast<unsigned char>(1u << (i % 8));
  }
}

}  // namespace
}  // namespace cohort
