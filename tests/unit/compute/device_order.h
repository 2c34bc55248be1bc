#pragma once
// The order in which the CUDA kernels combine their lanes' shares of a row,
// modelled on the host, so that the CPU tests run kernel_math.h's Strided*
// functions as the device's warp and block kernels do (cuda_reduce.cuh).
//
// A full warp's CUB reduction (cub::WarpReduce<float>, WarpReduceShfl in the
// CCCL of CUDA 13) takes five shfl.down steps with offsets 1, 2, 4, 8 and 16;
// at each step lane i adds lane i + offset's value to its own (an inline
// add.f32: rounded, never fused), so lane 0 ends with the balanced tree
// ((p0 + p1) + (p2 + p3)) + ... over adjacent lanes, which WarpSumAll hands
// to every lane. What the host cannot model is inside a lane: the device
// fuses the multiply-adds of a share (kernel_math.h), so the tests compare
// these results within tolerances, never bitwise.

#include <array>
#include <functional>

#include "worker/compute/gpu_launch_plan.h"

namespace cohort::compute::device_order {

inline constexpr int kLanes = gpu_plan::kWarpSize;

// Lane 0's result of CUB's shuffle tree over the lanes' values.
template <typename T, typename Op>
T WarpTree(std::array<T, kLanes> values, Op op) {
  for (int offset = 1; offset < kLanes; offset *= 2) {
    for (int lane = 0; lane + offset < kLanes; lane += 2 * offset) {
      values[lane] = op(values[lane + offset], values[lane]);
    }
  }
  return values[0];
}

// WarpSumAll / WarpMaxAll of share(lane) over a warp's lanes.
template <typename Share>
float WarpSum(Share share) {
  std::array<float, kLanes> values;
  for (int lane = 0; lane < kLanes; ++lane) values[lane] = share(lane);
  return WarpTree(values, std::plus<float>());
}
template <typename Share>
float WarpMax(Share share) {
  std::array<float, kLanes> values;
  for (int lane = 0; lane < kLanes; ++lane) values[lane] = share(lane);
  // cuda_reduce.cuh's MaxOp; a max is exact, so the tree's order does not matter.
  return WarpTree(values, [](float a, float b) { return b > a ? b : a; });
}

}  // namespace cohort::compute::device_order
