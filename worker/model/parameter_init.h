#pragma once
// GPT-2 parameter initialisation, from one seeded generator over the
// UNSHARDED layout, so every parallel layout starts from the same weights
// (each rank slices what it owns; never seed per rank).
//
// Recipe (GPT-2 / nanoGPT): weights and embeddings ~ N(0, 0.02); the residual
// projections attprojw and fcprojw ~ N(0, 0.02 / sqrt(2L)); biases 0;
// LayerNorm weights 1 and biases 0. The vocabulary padding rows of wte
// (V..Vp-1) are 0: they are never a target and never feed a real logit.
//
// Random stream: std::mt19937_64 seeded with `seed`; each normal comes from
// our own Box-Muller transform (two 53-bit uniforms -> two normals, both
// used), so the values do not depend on the standard library's
// distributions. Tensors draw in table order, elements in row-major order;
// tensors filled with constants draw nothing.

#include <cstdint>
#include <random>

#include "worker/model/gpt_config.h"
#include "worker/model/parameter_table.h"

namespace cohort::model {

// Fills params[0 .. table.num_params()) (host memory). `table` must be a
// ParameterTable of `config`; for a shard's table, the shard's part of the
// unsharded initialisation (drawn whole, then sliced).
void InitializeParameters(const GptConfig& config, const ParameterTable& table, uint64_t seed,
                          float* params);

// The generator behind InitializeParameters, exposed for tests and for other
// seeded draws that must match across platforms. Not thread-safe.
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : engine_(seed) {}
  // A standard normal sample.
  double Next();

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace cohort::model
