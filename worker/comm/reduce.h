#pragma once
// Element-wise reductions used by the host collectives, plus the 16-bit float
// conversions they need.
//
// Determinism: every function is a plain element-wise loop, so a given
// (a, b) pair always gives the same bits; callers fix the order in which
// partial results are combined. bf16 and fp16 are reduced by converting each
// element to float, combining in float and rounding back to nearest-even.
// Max propagates NaN (either input NaN gives NaN). Integer sums wrap (two's
// complement), so they are exact and order-independent.
//
// Thread-safe (pure functions).

#include <cstddef>
#include <cstdint>

#include "worker/comm/communicator.h"

namespace cohort::comm {

// out[i] = a[i] op b[i] for i < count. `out` may alias `a` or `b` exactly
// (same pointer); partial overlap is not allowed.
void ReduceInto(DataType type, ReduceOp op, const void* a, const void* b, void* out,
                size_t count);

float BFloat16ToFloat(uint16_t bits);
// Round to nearest-even; NaN stays NaN (quiet).
uint16_t FloatToBFloat16(float value);
float HalfToFloat(uint16_t bits);
// Round to nearest-even; overflow gives infinity; NaN stays NaN (quiet).
uint16_t FloatToHalf(float value);

}  // namespace cohort::comm
