// Block-wide exclusive prefix sum over an array in shared memory.
#pragma once

#include "common/warp.cuh"

namespace moejit {

// Replaces data[0..n) with its exclusive prefix sum and returns the total to every thread.
// `scratch` holds THREADS/32 + 1 ints of shared memory. All threads of the block must call it.
template <int THREADS>
__device__ int32 block_exclusive_scan(int32* data, int32 n, int32* scratch) {
  constexpr int kWarps = THREADS / 32;
  const int tid = threadIdx.x;
  const int per_thread = (n + THREADS - 1) / THREADS;
  const int begin = min_of(tid * per_thread, n);
  const int end = min_of(begin + per_thread, n);
  int32 local = 0;
  for (int i = begin; i < end; ++i) local += data[i];
  const int32 inclusive = warp_inclusive_scan(local);
  const int warp = tid / 32;
  if (lane_id() == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int32 w = static_cast<int>(lane_id()) < kWarps ? scratch[lane_id()] : 0;
    int32 w_incl = warp_inclusive_scan(w);
    if (static_cast<int>(lane_id()) < kWarps) scratch[lane_id()] = w_incl - w;
    if (lane_id() == 31) scratch[kWarps] = w_incl;
  }
  __syncthreads();
  int32 running = scratch[warp] + inclusive - local;
  for (int i = begin; i < end; ++i) {
    int32 v = data[i];
    data[i] = running;
    running += v;
  }
  const int32 total = scratch[kWarps];
  __syncthreads();
  return total;
}

}  // namespace moejit
