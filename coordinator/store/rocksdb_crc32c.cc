// Replaces RocksDB's crc32c::Extend in the cohort-coordinator binary with
// Cohort's hardware CRC-32C (common/crc32c.h).
//
// Why: Debian builds RocksDB portably, without SSE4.2, so every checksum it
// computes (blob records, SST blocks, WAL records) runs a table-driven
// software CRC. Writing a checkpoint computes one over every byte of every
// chunk when the flush writes its blob record: it was a fifth of the two
// cores during GPT-2 124M saves (perf, tools/dev bench checkpoint).
//
// How: librocksdb exports rocksdb::crc32c::Extend and calls it through its
// PLT everywhere (38 call sites in 7.8), so a definition in the executable
// takes precedence under ELF symbol interposition. The function computes the
// same CRC-32C with the same convention (the crc of A extended by data; 0 for
// the empty string), so files written with it are read by any RocksDB, and
// the other way round: tests/unit/coordinator/rocksdb_crc32c_test.cc checks
// that Cohort's CRC equals RocksDB's own on random data. A RocksDB that
// stopped exporting the symbol would simply keep its own.
//
// This file is linked into cohort-coordinator only (tools/ and tests use
// RocksDB's own function).

#include <cstddef>
#include <cstdint>

#include "common/crc32c.h"

namespace rocksdb {
namespace crc32c {

uint32_t Extend(uint32_t init_crc, const char* data, size_t n) {
  return cohort::Crc32cExtend(init_crc, data, n);
}

}  // namespace crc32c
}  // namespace rocksdb
