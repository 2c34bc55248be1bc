#pragma once
// Double-precision reference versions of the Backend layers, written as
// directly from the math as possible (no BLAS, no tricks), for the CPU kernel
// tests. Backward functions return the gradient of sum(dout * out) and,
// unlike the backend, do not accumulate.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/backend.h"

namespace cohort::compute::ref {

using Vec = std::vector<double>;

inline TensorSpan Span(std::vector<float>& v) {
  return TensorSpan{v.data(), DType::kFloat32, v.size()};
}
inline TensorSpan Span(std::vector<int32_t>& v) {
  return TensorSpan{v.data(), DType::kInt32, v.size()};
}

inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline Vec ToDouble(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// Columns [col0, col0 + cols) of a row-major (n, width) matrix.
inline std::vector<float> Columns(const std::vector<float>& m, int n, int width, int col0,
                                  int cols) {
  std::vector<float> out(int64_t{n} * cols);
  for (int r = 0; r < n; ++r)
    std::copy_n(m.begin() + int64_t{r} * width + col0, cols, out.begin() + int64_t{r} * cols);
  return out;
}

// The bit patterns of `v`: EXPECT_EQ on them is a bitwise comparison that
// tells -0 from +0 and prints the first difference.
inline std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// ||actual - expected|| / ||expected|| (Frobenius); the absolute norm of the
// difference when `expected` is zero.
inline double RelativeError(const std::vector<float>& actual, const Vec& expected) {
  EXPECT_EQ(actual.size(), expected.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) {
    const double d = actual[i] - expected[i];
    diff += d * d;
    norm += expected[i] * expected[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline Vec Encoder(const std::vector<int32_t>& inp, const Vec& wte, const Vec& wpe, int B, int T,
                   int C) {
  Vec out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(b * T + t) * C + c] = wte[inp[b * T + t] * C + c] + wpe[t * C + c];
  return out;
}

inline Vec LayerNorm(const Vec& x, const Vec& w, const Vec& bias, int N, int C) {
  Vec out(x.size());
  for (int n = 0; n < N; ++n) {
    double mean = 0.0, var = 0.0;
    for (int c = 0; c < C; ++c) mean += x[n * C + c];
    mean /= C;
    for (int c = 0; c < C; ++c) var += (x[n * C + c] - mean) * (x[n * C + c] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    for (int c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - mean) * rstd * w[c] + bias[c];
  }
  return out;
}

// Gradients of sum(dout * LayerNorm(x)) with respect to x, w and bias.
inline void LayerNormBackward(const Vec& dout, const Vec& x, const Vec& w, int N, int C, Vec* dx,
                              Vec* dw, Vec* db) {
  dx->assign(x.size(), 0.0);
  dw->assign(C, 0.0);
  db->assign(C, 0.0);
  for (int n = 0; n < N; ++n) {
    double mean = 0.0, var = 0.0;
    for (int c = 0; c < C; ++c) mean += x[n * C + c];
    mean /= C;
    for (int c = 0; c < C; ++c) var += (x[n * C + c] - mean) * (x[n * C + c] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    // xhat = (x - mean) rstd; y = xhat w + b.
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w.
    double g_mean = 0.0, gx_mean = 0.0;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[n * C + c] - mean) * rstd;
      const double g = dout[n * C + c] * w[c];
      g_mean += g;
      gx_mean += g * xhat;
      (*dw)[c] += dout[n * C + c] * xhat;
      (*db)[c] += dout[n * C + c];
    }
    g_mean /= C;
    gx_mean /= C;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[n * C + c] - mean) * rstd;
      const double g = dout[n * C + c] * w[c];
      (*dx)[n * C + c] = rstd * (g - g_mean - xhat * gx_mean);
    }
  }
}

// out (N,OC) = x (N,C) w(OC,C)^T + bias (empty: none).
inline Vec Matmul(const Vec& x, const Vec& w, const Vec& bias, int N, int C, int OC) {
  Vec out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int c = 0; c < C; ++c) s += x[n * C + c] * w[o * C + c];
      out[n * OC + o] = s;
    }
  return out;
}

inline double Gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

inline double GeluGrad(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double u = k * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// Causal attention from qkv (B,T,3C) to out (B,T,C).
inline Vec Attention(const Vec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Vec out(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const double* q = &qkv[(b * T + t) * 3 * C + h * hs];
        Vec s(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          const double* k = &qkv[(b * T + u) * 3 * C + C + h * hs];
          double d = 0.0;
          for (int i = 0; i < hs; ++i) d += q[i] * k[i];
          s[u] = d * scale;
          mx = std::max(mx, s[u]);
        }
        double z = 0.0;
        for (int u = 0; u <= t; ++u) z += (s[u] = std::exp(s[u] - mx));
        for (int u = 0; u <= t; ++u) {
          const double* v = &qkv[(b * T + u) * 3 * C + 2 * C + h * hs];
          for (int i = 0; i < hs; ++i) out[(b * T + t) * C + h * hs + i] += s[u] / z * v[i];
        }
      }
  return out;
}

// Gradient of sum(dout * Attention(qkv)) with respect to qkv.
inline Vec AttentionBackward(const Vec& dout, const Vec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Vec dqkv(qkv.size(), 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const size_t qo = (b * T + t) * 3 * C + h * hs;
        Vec p(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          const size_t ko = (b * T + u) * 3 * C + C + h * hs;
          double d = 0.0;
          for (int i = 0; i < hs; ++i) d += qkv[qo + i] * qkv[ko + i];
          p[u] = d * scale;
          mx = std::max(mx, p[u]);
        }
        double z = 0.0;
        for (int u = 0; u <= t; ++u) z += (p[u] = std::exp(p[u] - mx));
        for (double& x : p) x /= z;
        const double* dy = &dout[(b * T + t) * C + h * hs];
        // dp[u] = dy . v_u ; ds = p * (dp - sum p dp)
        Vec dp(t + 1);
        double pdp = 0.0;
        for (int u = 0; u <= t; ++u) {
          const size_t vo = (b * T + u) * 3 * C + 2 * C + h * hs;
          double d = 0.0;
          for (int i = 0; i < hs; ++i) {
            d += dy[i] * qkv[vo + i];
            dqkv[vo + i] += p[u] * dy[i];
          }
          dp[u] = d;
          pdp += p[u] * d;
        }
        for (int u = 0; u <= t; ++u) {
          const double ds = p[u] * (dp[u] - pdp) * scale;
          const size_t ko = (b * T + u) * 3 * C + C + h * hs;
          for (int i = 0; i < hs; ++i) {
            dqkv[qo + i] += ds * qkv[ko + i];
            dqkv[ko + i] += ds * qkv[qo + i];
          }
        }
      }
  return dqkv;
}

// Per-row logsumexp over the first V columns of (N,Vp) logits.
inline Vec LogSumExp(const Vec& logits, int N, int V, int Vp) {
  Vec lse(N);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0.0;
    for (int i = 0; i < V; ++i) mx = std::max(mx, logits[n * Vp + i]);
    for (int i = 0; i < V; ++i) z += std::exp(logits[n * Vp + i] - mx);
    lse[n] = mx + std::log(z);
  }
  return lse;
}

// Per-row cross-entropy over the first V columns of (N,Vp) logits.
inline Vec CrossEntropy(const Vec& logits, const std::vector<int32_t>& targets, int N, int V,
                        int Vp) {
  Vec losses = LogSumExp(logits, N, V, Vp);
  for (int n = 0; n < N; ++n) losses[n] -= logits[n * Vp + targets[n]];
  return losses;
}

// Gradient of sum_n dlosses[n] * CrossEntropy(logits)[n] with respect to the
// (N,Vp) logits: (softmax - onehot(target)) * dlosses[n], 0 in the padding.
inline Vec CrossEntropyGrad(const Vec& logits, const std::vector<int32_t>& targets,
                            const std::vector<float>& dlosses, int N, int V, int Vp) {
  const Vec lse = LogSumExp(logits, N, V, Vp);
  Vec grad(static_cast<size_t>(N) * Vp, 0.0);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < V; ++i) {
      const double p = std::exp(logits[n * Vp + i] - lse[n]);
      grad[n * Vp + i] = (p - (i == targets[n] ? 1.0 : 0.0)) * dlosses[n];
    }
  return grad;
}

}  // namespace cohort::compute::ref
