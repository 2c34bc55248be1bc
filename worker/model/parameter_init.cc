#include "worker/model/parameter_init.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "common/log.h"

namespace cohort::model {
namespace {

constexpr double kInitStd = 0.02;

// A uniform double in [0, 1) from the top 53 bits of one engine output.
double Uniform53(std::mt19937_64& engine) {
  return static_cast<double>(engine() >> 11) * 0x1.0p-53;
}

void FillNormal(NormalRng& rng, double stddev, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(stddev * rng.Next());
}

}  // namespace

double NormalRng::Next() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // u1 in (0, 1] so the log is finite.
  const double u1 = 1.0 - Uniform53(engine_);
  const double u2 = Uniform53(engine_);
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

void InitializeParameters(const GptConfig& config, const ParameterTable& table, uint64_t seed,
                          float* params) {
  if (!table.layout().whole_model()) {
    // Draw the unsharded model, then keep this rank's boxes.
    const ParameterTable whole(config);
    std::vector<float> all(whole.num_params());
    InitializeParameters(config, whole, seed, all.data());
    for (const ParameterInfo& info : table.tensors()) {
      ExtractShard(info, all.data() + whole[info.id].offset, params + info.offset);
    }
    return;
  }
  CHECK(table.num_params() == ParameterTable(config).num_params())
      << "table does not belong to this config";
  NormalRng rng(seed);
  const double residual_std = kInitStd / std::sqrt(2.0 * config.layers);
  for (const ParameterInfo& info : table.tensors()) {
    float* p = params + info.offset;
    switch (info.id) {
      case kWte: {
        // Real vocabulary rows random, padding rows zero.
        const size_t real = static_cast<size_t>(config.vocab_size) * config.width;
        FillNormal(rng, kInitStd, p, real);
        std::fill(p + real, p + info.numel, 0.0f);
        break;
      }
      case kWpe:
      case kQkvw:
      case kFcw:
        FillNormal(rng, kInitStd, p, info.numel);
        break;
      case kAttprojw:
      case kFcprojw:
        FillNormal(rng, residual_std, p, info.numel);
        break;
      case kLn1w:
      case kLn2w:
      case kLnfw:
        std::fill(p, p + info.numel, 1.0f);
        break;
      default:  // biases
        std::fill(p, p + info.numel, 0.0f);
        break;
    }
  }
}

}  // namespace cohort::model
