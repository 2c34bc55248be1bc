#pragma once
// COHORT_HOST_DEVICE: a function that nvcc compiles for the device and the
// host (the kernels' per-element math, kernel_math.h and adamw_math.h) and
// the host compiler as a plain inline function, so CPU tests and the CPU
// backend run the very arithmetic the kernels do.

#if defined(__CUDACC__)
#define COHORT_HOST_DEVICE __host__ __device__ inline
#else
#define COHORT_HOST_DEVICE inline
#endif
