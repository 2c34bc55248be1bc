// CpuBackend's optimizer ops (backend.h, "The optimizer step on backend
// memory"): the host optimizer's arithmetic and order (train::GradNormPlan's
// serial double sums per piece added in order, train::AdamWUpdate's
// elements), so a session whose training state stays in backend memory gets
// the same bits on the CPU as one that runs its optimizer on the host. The
// guarded test backend runs these too, which is how the device-resident
// path is checked bit for bit on machines without a GPU.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "worker/compute/adamw_math.h"
#include "worker/compute/cpu_backend.h"
#include "worker/compute/span_checks.h"

namespace cohort::compute {

void CpuBackend::CopyWithin(TensorSpan dst, TensorSpan src) {
  CheckCopyWithin(dst, src);
  if (dst.numel > 0) std::memcpy(dst.data, src.data, dst.bytes());
}

void CpuBackend::SumOfSquaresPieces(TensorSpan sums, TensorSpan grads, TensorSpan pieces) {
  const int64_t count = static_cast<int64_t>(CheckedPieceCount(sums, pieces));
  double* out = CheckedF64(sums, 0, "sums");
  const int64_t* bounds = CheckedI64(pieces, 0, "pieces");
  const int64_t numel = count == 0 ? 0 : bounds[2 * count - 1];
  const float* x = CheckedF32(grads, static_cast<size_t>(numel), "grads");
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 16)
  for (int64_t k = 0; k < count; ++k) {
    double sum = 0.0;
    for (int64_t i = bounds[2 * k]; i < bounds[2 * k + 1]; ++i) {
      const double value = x[i];
      sum += value * value;
    }
    out[k] = sum;
  }
}

void CpuBackend::FinishGradNorm(TensorSpan scalars, TensorSpan sums, double max_norm) {
  double* out = CheckedF64(scalars, 2, "scalars");
  const double* in = CheckedF64(sums, 0, "sums");
  double total = 0.0;
  for (size_t k = 0; k < sums.numel; ++k) total += in[k];
  out[0] = std::sqrt(total);
  out[1] = ClipFactor(out[0], max_norm);
}

void CpuBackend::SumLosses(TensorSpan sum, TensorSpan losses) {
  double* out = CheckedF64(sum, 1, "loss sum");
  const float* in = CheckedF32(losses, losses.numel, "losses");
  // In order, in double: what the model's host loop did with the losses
  // it copied back (GptModel::HeadLoss), bit for bit.
  double total = 0.0;
  for (size_t i = 0; i < losses.numel; ++i) total += in[i];
  out[0] = total;
}

void CpuBackend::SkipUpdateUnlessFinite(TensorSpan scalars, TensorSpan values) {
  double* out = CheckedF64(scalars, 2, "scalars");
  const double* in = CheckedF64(values, 0, "values");
  for (size_t i = 0; i < values.numel; ++i) {
    if (!std::isfinite(in[i])) out[0] = std::numeric_limits<double>::quiet_NaN();
  }
}

void CpuBackend::ClipAdamW(TensorSpan params, TensorSpan m, TensorSpan v, TensorSpan grads,
                           TensorSpan scalars, size_t begin, size_t end, size_t moment_base,
                           bool decay, const AdamWScalars& adamw) {
  CheckAdamWRange(params, m, v, grads, scalars, begin, end, moment_base);
  const double* norm_and_clip = static_cast<const double*>(scalars.data);
  if (!std::isfinite(norm_and_clip[0])) return;
  const float clip = static_cast<float>(norm_and_clip[1]);
  float* p = static_cast<float*>(params.data);
  const float* g = static_cast<const float*>(grads.data);
  float* m_base = static_cast<float*>(m.data) - moment_base;
  float* v_base = static_cast<float*>(v.data) - moment_base;
  const int64_t lo = static_cast<int64_t>(begin);
  const int64_t hi = static_cast<int64_t>(end);
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int64_t i = lo; i < hi; ++i) {
    AdamWElement(adamw, decay, g[i] * clip, &p[i], &m_base[i], &v_base[i]);
  }
}

}  // namespace cohort::compute
