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

// The lanes of a quad (4k .. 4k + 3) hold the mma fragment layout's words: word j of lane q is
// columns 2q, 2q + 1 of 8-column group j. Transposes them, so that lane q holds the four words of
// group q (its 8 consecutive columns, one 16-byte store): swaps the off-diagonal 2 x 2 blocks
// between lanes q and q ^ 2, then transposes each block between lanes q and q ^ 1.
__device__ __forceinline__ void quad_transpose(uint32 (&v)[4]) {
  const bool upper = (threadIdx.x & 2) != 0;
  uint32 a = upper ? v[0] : v[2], b = upper ? v[1] : v[3];
  a = __shfl_xor_sync(kFullWarp, a, 2);
  b = __shfl_xor_sync(kFullWarp, b, 2);
  if (upper) {
    v[0] = a;
    v[1] = b;
  } else {
    v[2] = a;
    v[3] = b;
  }
  const bool odd = (threadIdx.x & 1) != 0;
  a = odd ? v[0] : v[1];
  b = odd ? v[2] : v[3];
  a = __shfl_xor_sync(kFullWarp, a, 1);
  b = __shfl_xor_sync(kFullWarp, b, 1);
  if (odd) {
    v[0] = a;
    v[2] = b;
  } else {
    v[1] = a;
    v[3] = b;
  }
}

__device__ __forceinline__ int32 warp_sum(int32 v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(kFullWarp, v, d);
  return v;
}

}  // namespace moejit
