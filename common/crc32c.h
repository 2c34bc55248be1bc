#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
// every checkpoint chunk (docs/checkpoint-format.md). Uses the SSE4.2 crc32
// instruction where the CPU has it and a slicing-by-8 table otherwise; both
// give the same values. Crc32c("123456789") == 0xE3069283.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cohort {

// Extends `crc` (the CRC of the bytes so far; 0 for none) by `n` bytes.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
inline uint32_t Crc32c(std::string_view bytes) { return Crc32c(bytes.data(), bytes.size()); }

// Whether the hardware path is in use (for benchmarks and logs).
bool Crc32cIsHardwareAccelerated();

namespace internal {
// The table-driven path alone, so tests can compare it with the hardware one.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
}  // namespace internal

}  // namespace cohort
