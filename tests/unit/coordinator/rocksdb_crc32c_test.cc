// cohort-coordinator replaces RocksDB's crc32c::Extend with Cohort's
// (coordinator/store/rocksdb_crc32c.cc). That is only sound if both compute the
// same function: this binary does not link the replacement, so it calls
// RocksDB's own and compares.

#include <cstdint>
#include <random>
#include <string>

#include "common/crc32c.h"
#include "gtest/gtest.h"

namespace rocksdb::crc32c {
// Exported by librocksdb (util/crc32c.h, not an installed header).
uint32_t Extend(uint32_t init_crc, const char* data, size_t n);
}  // namespace rocksdb::crc32c

namespace cohort {
namespace {

TEST(RocksDbCrc32cTest, CohortsCrcEqualsRocksDbsOwn) {
  std::mt19937 rng(17);
  for (size_t n : {0ul, 1ul, 7ul, 8ul, 63ul, 4096ul, 100003ul, 1ul << 20}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    SCOPED_TRACE(n);
    EXPECT_EQ(rocksdb::crc32c::Extend(0, data.data(), n), Crc32c(data));
    const size_t cut = n / 3;
    const uint32_t head = rocksdb::crc32c::Extend(0, data.data(), cut);
    EXPECT_EQ(rocksdb::crc32c::Extend(head, data.data() + cut, n - cut),
              Crc32cExtend(Crc32c(data.data(), cut), data.data() + cut, n - cut));
  }
  EXPECT_EQ(rocksdb::crc32c::Extend(0, "123456789", 9), 0xE3069283u);
}

}  // namespace
}  // namespace cohort
