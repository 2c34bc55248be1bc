#pragma once
// Deterministic random numbers for the data layer. Everything here is written
// out in full (splitmix64) instead of using <random> distributions, whose
// output differs across standard library versions: the determinism contract
// needs the same samples on every machine and build.
//
// All functions are pure; SplitMix64 is a small value type (not thread-safe,
// copy it per thread).

#include <cstdint>

namespace cohort::data {

// The splitmix64 output function: a bijection on 64-bit values with good
// avalanche, used both as a generator step and as a hash of counters.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of a sequence of counters: each value is folded in after mixing the
// running state, so (a, b) and (b, a) differ. Stateless, so a sample's key
// depends on its coordinates alone.
constexpr uint64_t HashCounters(uint64_t a, uint64_t b) { return Mix64(Mix64(a) ^ b); }
constexpr uint64_t HashCounters(uint64_t a, uint64_t b, uint64_t c) {
  return Mix64(HashCounters(a, b) ^ c);
}

// The splitmix64 generator (Steele, Lea, Flood 2014): a Weyl sequence passed
// through Mix64. Period 2^64; plenty for token streams.
class SplitMix64 {
 public:
  constexpr explicit SplitMix64(uint64_t seed) : state_(seed) {}

  constexpr uint64_t Next() {
    const uint64_t out = Mix64(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return out;
  }

  // Uniform in [0, bound), exactly (Lemire's multiply-shift with rejection of
  // the biased low range). bound must be > 0.
  uint64_t Below(uint64_t bound) {
    unsigned __int128 product = static_cast<unsigned __int128>(Next()) * bound;
    uint64_t low = static_cast<uint64_t>(product);
    if (low < bound) {
      // 2^64 mod bound, computed without 128-bit division.
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        product = static_cast<unsigned __int128>(Next()) * bound;
        low = static_cast<uint64_t>(product);
      }
    }
    return static_cast<uint64_t>(product >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace cohort::data
