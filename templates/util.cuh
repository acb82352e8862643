// Utility kernels for the autotuner's scratch problems: random inputs generated on the device
// (no host round trip for gigabytes of weights) and the relative difference of two outputs.
#pragma once

#include "common/dtype.cuh"
#include "common/warp.cuh"

namespace moejit {

__device__ __forceinline__ uint32 mix32(uint64 x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32>(x);
}

struct FillParams {
  void* out;
  int64 count;
  uint64 seed;
  float lo;
  float hi;
};

// out[i] ~ U(lo, hi), a pure function of (seed, i).
template <typename T>
__global__ void fill_uniform_kernel(const __grid_constant__ FillParams p) {
  for (int64 i = blockIdx.x * static_cast<int64>(blockDim.x) + threadIdx.x; i < p.count;
       i += static_cast<int64>(gridDim.x) * blockDim.x) {
    const float u = (mix32(p.seed * 0x9e3779b97f4a7c15ull + i) >> 8) * (1.f / 16777216.f);
    store_float(static_cast<T*>(p.out) + i, p.lo + (p.hi - p.lo) * u);
  }
}

struct TopkIdsParams {
  int32* ids;  // [tokens, topk]
  int64 tokens;
  int32 topk;
  int32 experts;
  uint64 seed;
};

// K distinct experts per token, a uniform draw among the E-choose-K sets (Floyd's sampling), so
// each expert's tokens are independent of another's, as under a real router. The former pattern
// (r + k * E / K) gave groups of K experts identical token sets, which flattered configs that
// gather token rows: fwd_up gathering x timed level with the scattered rows under it and 5 %
// behind under a uniform draw (performance log, session 13).
__global__ void fill_topk_ids_kernel(const __grid_constant__ TopkIdsParams p) {
  for (int64 t = blockIdx.x * static_cast<int64>(blockDim.x) + threadIdx.x; t < p.tokens;
       t += static_cast<int64>(gridDim.x) * blockDim.x) {
    int32* ids = p.ids + t * p.topk;
    for (int32 k = 0, j = p.experts - p.topk; k < p.topk; ++k, ++j) {
      const int32 pick =
          static_cast<int32>(mix32(p.seed * 0x9e3779b97f4a7c15ull + t * p.topk + k) % static_cast<uint32>(j + 1));
      bool taken = false;
      for (int32 i = 0; i < k; ++i) taken |= ids[i] == pick;
      ids[k] = taken ? j : pick;
    }
  }
}

struct RelDiffParams {
  const void* got;
  const void* want;
  int64 count;
  double* sums;  // [3]: sum (got - want)^2, sum want^2, non-finite elements of got; zeroed by the caller
};

template <typename T>
__global__ void rel_diff_kernel(const __grid_constant__ RelDiffParams p) {
  double diff = 0, ref = 0, bad = 0;
  for (int64 i = blockIdx.x * static_cast<int64>(blockDim.x) + threadIdx.x; i < p.count;
       i += static_cast<int64>(gridDim.x) * blockDim.x) {
    const float g = load_float(static_cast<const T*>(p.got) + i), w = load_float(static_cast<const T*>(p.want) + i);
    if (!isfinite(g)) bad += 1;
    else diff += static_cast<double>(g - w) * (g - w);
    ref += static_cast<double>(w) * w;
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    diff += __shfl_xor_sync(kFullWarp, diff, d);
    ref += __shfl_xor_sync(kFullWarp, ref, d);
    bad += __shfl_xor_sync(kFullWarp, bad, d);
  }
  if (lane_id() == 0) {
    atomicAdd(p.sums, diff);
    atomicAdd(p.sums + 1, ref);
    atomicAdd(p.sums + 2, bad);
  }
}

}  // namespace moejit
