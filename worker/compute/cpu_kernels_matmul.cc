// Linear layer kernels: cblas_sgemm for the products, OpenMP for the bias.
//
// OpenBLAS's own threading does not keep results independent of its thread
// count (its threaded driver blocks the products differently from the
// single-threaded one), so every product here runs as fixed tiles of the
// output, each a single-threaded sgemm over the full K range, with OpenMP
// over the tiles. Tile boundaries depend only on the shapes, never on
// `threads`.

#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "worker/compute/cpu_kernels.h"

namespace cohort::compute::cpu {
namespace {

// dbias is a reduction over rows: threads own blocks of output channels.
constexpr int kChannelBlock = 16;

// Output tiling of a product. Each tile is one single-threaded sgemm call
// over the whole K range, so an output element's sum is computed inside
// one call, and the tiles depend on the shape alone. The output is halved
// along its longer side until there are kTargetTiles tiles (a power of two,
// so 2, 4 or 8 threads share them evenly), stopping before a side drops
// under kMinTileSide or a tile under kMinTileWork multiply-adds, where
// packing and call overhead cost more than balance gains. Splitting the
// longer side repacks only the smaller operand per tile: the GPT-2 LM head
// (256 x 50304 outputs) becomes 8 column tiles that each pack the 256
// input rows, not row blocks that each pack the 50304 x 768 embedding. Before
// this, fixed 128-row blocks left products with 128 output rows (the dweight
// of a 128-channel layer) on one thread.
constexpr int kTargetTiles = 8;
constexpr int kMinTileSide = 64;
constexpr int64_t kMinTileWork = int64_t{1} << 21;
// Tile sides are rounded up to whole cache lines of the output.
constexpr int kTileAlign = 16;

struct Tiling {
  int rows = 0;  // rows per tile (the last may have fewer)
  int cols = 0;
  int row_tiles = 1;
  int col_tiles = 1;
};

int CeilDiv(int a, int b) { return (a + b - 1) / b; }
int RoundUp(int a, int b) { return CeilDiv(a, b) * b; }

Tiling ChooseTiling(int M, int N, int K) {
  int rt = 1, ct = 1;
  while (rt * ct < kTargetTiles &&
         int64_t{CeilDiv(M, rt)} * CeilDiv(N, ct) * K >= 2 * kMinTileWork) {
    const int rows = CeilDiv(M, rt);
    const int cols = CeilDiv(N, ct);
    const bool can_split_rows = rows >= 2 * kMinTileSide;
    const bool can_split_cols = cols >= 2 * kMinTileSide;
    if (can_split_rows && (rows >= cols || !can_split_cols)) {
      rt *= 2;
    } else if (can_split_cols) {
      ct *= 2;
    } else {
      break;
    }
  }
  Tiling t;
  t.rows = std::min(M, RoundUp(CeilDiv(M, rt), kTileAlign));
  t.cols = std::min(N, RoundUp(CeilDiv(N, ct), kTileAlign));
  t.row_tiles = CeilDiv(M, t.rows);
  t.col_tiles = CeilDiv(N, t.cols);
  return t;
}

// C (M,N) = alpha op(A) (M,K) op(B) (K,N) + beta C, row-major, as fixed tiles
// of C. op(A) = A (lda >= K) or A^T with A stored (K,M); likewise op(B) = B
// (K,N) or B^T with B stored (N,K).
void BlockedSgemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K,
                  float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                  float* C, int ldc, int threads) {
  const Tiling tiling = ChooseTiling(M, N, K);
  const int tiles = tiling.row_tiles * tiling.col_tiles;
  UseSingleThreadedBlas();
  const int team = TeamSize(threads, tiles, int64_t{M} * N * K);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int tile = 0; tile < tiles; ++tile) {
    const int m0 = tile / tiling.col_tiles * tiling.rows;
    const int n0 = tile % tiling.col_tiles * tiling.cols;
    const int rows = std::min(M, m0 + tiling.rows) - m0;
    const int cols = std::min(N, n0 + tiling.cols) - n0;
    // Rows m0.. of op(A): rows of A, or columns of A when transposed; columns
    // n0.. of op(B): columns of B, or rows of B when transposed.
    const float* a = trans_a == CblasNoTrans ? A + static_cast<int64_t>(m0) * lda : A + m0;
    const float* b = trans_b == CblasNoTrans ? B + n0 : B + static_cast<int64_t>(n0) * ldb;
    cblas_sgemm(CblasRowMajor, trans_a, trans_b, rows, cols, K, alpha, a, lda, b, ldb, beta,
                C + static_cast<int64_t>(m0) * ldc + n0, ldc);
  }
}

}  // namespace

void UseSingleThreadedBlas() {
  // Only ever lowered to 1 here, so once a caller has seen 1 it stays 1 for
  // its products, whatever other callers do meanwhile.
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC, int threads) {
  // out (N,OC) = inp (N,C) * weight (OC,C)^T + bias (OC)
  float beta = 0.0f;
  if (bias != nullptr) {
    // Start from the bias and let sgemm add the product (beta = 1), as
    // torch.addmm does.
    const int team = TeamSize(threads, N, int64_t{N} * OC);
#pragma omp parallel for num_threads(team) schedule(static)
    for (int n = 0; n < N; ++n) {
      std::copy(bias, bias + OC, out + static_cast<int64_t>(n) * OC);
    }
    beta = 1.0f;
  }
  BlockedSgemm(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC, threads);
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC, int threads) {
  // dinp (N,C) += dout (N,OC) * weight (OC,C)
  if (dinp != nullptr) {
    BlockedSgemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C,
                 threads);
  }
  // dweight (OC,C) += dout^T (OC,N) * inp (N,C)
  BlockedSgemm(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C,
               threads);
  if (dbias != nullptr) AddColumnSums(dbias, dout, N, OC, threads);
}

void AddColumnSums(float* dbias, const float* dout, int N, int OC, int threads) {
  const int blocks = (OC + kChannelBlock - 1) / kChannelBlock;
  const int team = TeamSize(threads, blocks, int64_t{N} * OC);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int o0 = blk * kChannelBlock;
    const int width = std::min(OC, o0 + kChannelBlock) - o0;
    float acc[kChannelBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float* dy = dout + static_cast<int64_t>(n) * OC + o0;
      for (int j = 0; j < width; ++j) acc[j] += dy[j];
    }
    for (int j = 0; j < width; ++j) dbias[o0 + j] += acc[j];
  }
}

}  // namespace cohort::compute::cpu
