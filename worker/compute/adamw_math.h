#pragma once
// AdamW's per-element update, shared by the host optimizer
// (worker/train/adamw.cc), the CPU backend's device-resident path and the
// CUDA kernel (cuda_kernels_optimizer.cu), so the three cannot drift apart:
// the same fp32 expressions in the same order. The scalars are computed once
// per update, in double, on the host (AdamWScalarsFor), exactly as
// torch.optim.AdamW's single-tensor path (PyTorch 1.13) turns its Python
// floats into fp32 factors.
//
//   if decay:  p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// Plain C++17 with CUDA qualifiers where nvcc compiles it (host_device.h);
// no other project header, so kernels include it without the rest of the tree.

#include <cmath>
#include <cstdint>

#include "worker/compute/host_device.h"

namespace cohort::compute {

// The fp32 factors of one update (1-based update number t).
struct AdamWScalars {
  float beta1 = 0;
  float beta2 = 0;
  float one_minus_beta1 = 0;
  float one_minus_beta2 = 0;
  float neg_step_size = 0;          // -(lr / (1 - beta1^t))
  float bias_correction2_sqrt = 0;  // sqrt(1 - beta2^t)
  float eps = 0;
  float decay_factor = 1;  // 1 - lr * weight_decay
  bool decays = false;     // weight_decay != 0: decaying ranges multiply by decay_factor
};

inline AdamWScalars AdamWScalarsFor(double beta1, double beta2, double eps, double weight_decay,
                                    double lr, int64_t t) {
  AdamWScalars s;
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(eps);
  s.decay_factor = static_cast<float>(1.0 - lr * weight_decay);
  s.decays = weight_decay != 0.0;
  return s;
}

// One element: updates *param, *m, *v from the gradient `grad` (already
// clipped). `decay`: the element's tensor takes weight decay.
COHORT_HOST_DEVICE void AdamWElement(const AdamWScalars& s, bool decay, float grad, float* param,
                                  float* m, float* v) {
  float p = *param;
  if (decay && s.decays) p *= s.decay_factor;
  const float m_new = *m * s.beta1 + s.one_minus_beta1 * grad;
  const float v_new = *v * s.beta2 + s.one_minus_beta2 * grad * grad;
  const float denom = sqrtf(v_new) / s.bias_correction2_sqrt + s.eps;
  *param = p + s.neg_step_size * (m_new / denom);
  *m = m_new;
  *v = v_new;
}

// The clip factor torch.nn.utils.clip_grad_norm_ applies: min(1, max_norm /
// (norm + 1e-6)); 1 (no clipping) when max_norm <= 0 or the norm is NaN
// (the trainer refuses a non-finite norm itself). In double, whose IEEE
// operations round the same on a GPU as on the host.
COHORT_HOST_DEVICE double ClipFactor(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double factor = max_norm / (norm + 1e-6);
  return factor < 1.0 ? factor : 1.0;
}

}  // namespace cohort::compute
