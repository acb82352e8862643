// Warp-level primitives shared by the kernels.
#pragma once

#include "common/types.cuh"

namespace moejit {

constexpr uint32 kFullWarp = 0xffffffffu;

__device__ __forceinline__ uint32 lane_id() { return threadIdx.x & 31u; }

__device__ __forceinline__ uint32 lanemask_lt() {
  uint32 m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// Inclusive prefix sum across the warp.
__device__ __forceinline__ int32 warp_inclusive_scan(int32 v) {
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    int32 n = __shfl_up_sync(kFullWarp, v, d);
    if (static_cast<int>(lane_id()) >= d) v += n;
  }
  return v;
}

__device__ __forceinline__ int32 warp_sum(int32 v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(kFullWarp, v, d);
  return v;
}

}  // namespace moejit
