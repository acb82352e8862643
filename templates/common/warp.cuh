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

// Swaps two words with lane ^ MASK: the lane with the MASK bit set gives and takes back words
// HI0 and HI1, its partner words LO0 and LO1.
template <int MASK, int HI0, int HI1, int LO0, int LO1>
__device__ __forceinline__ void exchange_words(uint32 (&v)[4]) {
  const bool high = (threadIdx.x & MASK) != 0;
  uint32 a = high ? v[HI0] : v[LO0], b = high ? v[HI1] : v[LO1];
  a = __shfl_xor_sync(kFullWarp, a, MASK);
  b = __shfl_xor_sync(kFullWarp, b, MASK);
  if (high) {  // constant indices keep v in registers
    v[HI0] = a;
    v[HI1] = b;
  } else {
    v[LO0] = a;
    v[LO1] = b;
  }
}

// The lanes of a quad (4k .. 4k + 3) hold the mma fragment layout's words: word j of lane q is
// columns 2q, 2q + 1 of 8-column group j. Transposes them, so that lane q holds the four words of
// group q (its 8 consecutive columns, one 16-byte store): swaps the off-diagonal 2 x 2 blocks
// between lanes q and q ^ 2, then transposes each block between lanes q and q ^ 1.
__device__ __forceinline__ void quad_transpose(uint32 (&v)[4]) {
  exchange_words<2, 0, 1, 2, 3>(v);
  exchange_words<1, 0, 2, 1, 3>(v);
}

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(kFullWarp, v, d);
  return v;
}

// Sums each of N values over every WIDTH lanes (the warp, or its halves): lane l returns the
// total over its segment of v[(l % WIDTH) / (WIDTH / N)]. Each of the first log2(N) steps halves
// what a lane keeps, trading the other half with its partner: 6 shuffles for four values over
// the warp where four warp_sums take 20.
template <int N, int WIDTH = 32>
__device__ __forceinline__ float warp_sum_each(const float (&v)[N]) {
  static_assert(WIDTH == 16 || WIDTH == 32, "the warp or its halves");
  static_assert(N >= 2 && N <= WIDTH && (N & (N - 1)) == 0, "a power of two up to the segment's lanes");
  const uint32 lane = lane_id();
  float a[N];
#pragma unroll
  for (int k = 0; k < N; ++k) a[k] = v[k];
#pragma unroll
  for (int half = N / 2, mask = WIDTH / 2; half >= 1; half /= 2, mask /= 2) {
    const bool high = (lane & mask) != 0;  // keeps values half .. 2 half - 1
#pragma unroll
    for (int k = 0; k < half; ++k) {
      a[k] = (high ? a[k + half] : a[k]) + __shfl_xor_sync(kFullWarp, high ? a[k] : a[k + half], mask);
    }
  }
#pragma unroll
  for (int mask = WIDTH / N / 2; mask >= 1; mask /= 2) a[0] += __shfl_xor_sync(kFullWarp, a[0], mask);
  return a[0];
}

}  // namespace moejit
