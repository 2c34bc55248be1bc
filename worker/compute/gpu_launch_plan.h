#pragma once
// Launch shapes of the CUDA backend's kernels, in plain C++17 (no CUDA, no
// project headers) so that nvcc compiles the kernels against the same
// arithmetic that unit tests check on machines without a GPU.
//
// Determinism leans on these: every reduction a kernel does has a shape
// that depends only on the problem size (never on the device, the SM count
// or timing), so the same inputs sum in the same order on every run.

#include <cstddef>
#include <cstdint>

namespace cohort::compute::gpu_plan {

// Threads per block of the element-wise and column kernels.
inline constexpr int kThreads = 256;
// Threads per block of the row kernels (one block per row: cross-entropy).
inline constexpr int kRowThreads = 256;
// The warp kernels (one warp per row: LayerNorm, causal softmax) put this
// many warps, so this many rows, in a block.
inline constexpr int kWarpSize = 32;
inline constexpr int kWarpsPerBlock = 8;
// Grid-stride kernels launch at most this many blocks; a larger problem
// loops. Far below the 2^31 - 1 limit of gridDim.x.
inline constexpr int64_t kMaxBlocks = int64_t{1} << 20;
// Device buffers start on this boundary (cuBLASLt and vector loads want 16
// bytes; 256 matches cudaMalloc's own alignment).
inline constexpr size_t kDeviceAlignment = 256;

// Blocks of `threads` that cover `n` elements with a grid-stride loop: at
// least 1, at most kMaxBlocks.
constexpr int64_t GridStrideBlocks(int64_t n, int threads) {
  const int64_t blocks = n <= 0 ? 1 : (n + threads - 1) / threads;
  return blocks < kMaxBlocks ? blocks : kMaxBlocks;
}

// Blocks of kWarpsPerBlock warps that give each of `rows` rows one warp.
constexpr int64_t WarpRowBlocks(int64_t rows) {
  return rows <= 0 ? 1 : (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
}

// A sum over the rows of an (rows x columns) array, per column (dbias,
// LayerNorm's dweight): the first pass gives each of `chunks` consecutive
// runs of rows_per_chunk rows a partial sum per column, serially in row
// order; the second adds the partials in chunk order into the output. Few
// enough chunks that the second pass is short, enough that the first fills
// the device.
struct ColumnReducePlan {
  int rows_per_chunk = 1;
  int chunks = 1;
};
inline constexpr int kColumnChunksTarget = 512;
inline constexpr int kMinRowsPerChunk = 16;
constexpr ColumnReducePlan PlanColumnReduce(int rows) {
  if (rows <= 0) return ColumnReducePlan{1, 0};
  int per = (rows + kColumnChunksTarget - 1) / kColumnChunksTarget;
  if (per < kMinRowsPerChunk) per = kMinRowsPerChunk;
  return ColumnReducePlan{per, (rows + per - 1) / per};
}

// Bits a radix sort needs for keys in [0, max_key].
constexpr int KeyBits(uint32_t max_key) {
  int bits = 1;
  while (bits < 32 && (max_key >> bits) != 0) ++bits;
  return bits;
}

// `bytes` rounded up to kDeviceAlignment: the stride of buffers carved from
// one scratch allocation.
constexpr size_t AlignUp(size_t bytes) {
  return (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
}

}  // namespace cohort::compute::gpu_plan
