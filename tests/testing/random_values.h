#pragma once
// Random float vectors for tests of summation order: values of mixed
// magnitudes, so that another association of the additions would change
// the bits.

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace cohort::testing {

// `vectors` vectors of `length` floats x * 2^e, x uniform in (-1, 1) and e
// uniform in [-max_exponent, max_exponent], drawn in order from
// std::mt19937(seed).
inline std::vector<std::vector<float>> RandomMixedMagnitudes(int vectors, size_t length,
                                                             uint32_t seed, int max_exponent) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-max_exponent, max_exponent);
  std::vector<std::vector<float>> values(static_cast<size_t>(vectors), std::vector<float>(length));
  for (auto& vector : values) {
    for (float& x : vector) x = std::ldexp(unit(random), exponent(random));
  }
  return values;
}

}  // namespace cohort::testing
