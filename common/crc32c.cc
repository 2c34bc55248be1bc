#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace cohort {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli

// kTables[k][b]: the CRC of byte b followed by k zero bytes, for slicing-by-8.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    t[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

// `crc` here is the running register (already inverted).
uint32_t ExtendSoftware(uint32_t crc, const uint8_t* p, size_t n) {
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian hosts only (x86_64, aarch64)
    word ^= crc;
    crc = kTables[7][word & 0xFF] ^ kTables[6][(word >> 8) & 0xFF] ^
          kTables[5][(word >> 16) & 0xFF] ^ kTables[4][(word >> 24) & 0xFF] ^
          kTables[3][(word >> 32) & 0xFF] ^ kTables[2][(word >> 40) & 0xFF] ^
          kTables[1][(word >> 48) & 0xFF] ^ kTables[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xFFu];
  return crc;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of 3 cycles and a throughput of 1, so
// one dependency chain runs at a third of its speed. Large buffers are cut
// into blocks of three lanes of kLane bytes whose CRCs are computed in
// parallel chains and combined: the CRC register is linear, so
//   reg(r, A B C) = shift_2L(reg(r, A)) ^ shift_L(reg(0, B)) ^ reg(0, C)
// where shift_n is the register after n zero bytes, itself a linear map of
// 32 bits, applied with four byte-indexed tables.
constexpr size_t kLane = 4096;

struct ShiftTable {
  uint32_t byte[4][256];
  uint32_t Apply(uint32_t x) const {
    return byte[0][x & 0xFF] ^ byte[1][(x >> 8) & 0xFF] ^ byte[2][(x >> 16) & 0xFF] ^
           byte[3][x >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t ShiftByZeros(uint32_t x, size_t bytes) {
  uint64_t c = x;
  for (size_t i = 0; i < bytes; i += 8) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

ShiftTable MakeShiftTable(size_t bytes) {
  uint32_t basis[32];
  for (int bit = 0; bit < 32; ++bit) basis[bit] = ShiftByZeros(1u << bit, bytes);
  ShiftTable t{};
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int bit = 0; bit < 8; ++bit) {
        if (b & (1u << bit)) v ^= basis[8 * k + bit];
      }
      t.byte[k][b] = v;
    }
  }
  return t;
}

struct LaneShifts {
  ShiftTable one = MakeShiftTable(kLane);
  ShiftTable two = MakeShiftTable(2 * kLane);
};

const LaneShifts& Shifts() {
  static const LaneShifts* shifts = new LaneShifts();
  return *shifts;
}

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p,
                                                          size_t n) {
  uint64_t c = crc;
  if (n >= 3 * kLane) {
    const LaneShifts& shifts = Shifts();
    while (n >= 3 * kLane) {
      uint64_t c1 = 0, c2 = 0;
      const uint8_t* p1 = p + kLane;
      const uint8_t* p2 = p + 2 * kLane;
      for (size_t i = 0; i < kLane; i += 8) {
        uint64_t w0, w1, w2;
        std::memcpy(&w0, p + i, 8);
        std::memcpy(&w1, p1 + i, 8);
        std::memcpy(&w2, p2 + i, 8);
        c = _mm_crc32_u64(c, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
      }
      c = shifts.two.Apply(static_cast<uint32_t>(c)) ^ shifts.one.Apply(static_cast<uint32_t>(c1)) ^
          static_cast<uint32_t>(c2);
      p += 3 * kLane;
      n -= 3 * kLane;
    }
  }
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t reg = ~crc;
#if defined(__x86_64__)
  if (HaveSse42()) return ~ExtendHardware(reg, p, n);
#endif
  return ~ExtendSoftware(reg, p, n);
}

namespace internal {
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ~ExtendSoftware(~crc, static_cast<const uint8_t*>(data), n);
}
}  // namespace internal

bool Crc32cIsHardwareAccelerated() {
#if defined(__x86_64__)
  return HaveSse42();
#else
  return false;
#endif
}

}  // namespace cohort
