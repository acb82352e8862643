// gather_sum: out[t] = sum_k s[t,k] * rows[pair_rows[t*K + k]] in fp32, over a 2-D grid
// (tokens x hidden blocks) so that small T still fills the GPU. Without scores it is the plain
// sum that turns bwd_dx's per-slot rows into dx; that launch also writes d_topk_weights from
// bwd_down's fp32 accumulators. Dropped pairs (row >= routed count) are skipped.
#pragma once

#include "common/dtype.cuh"

namespace moejit {

struct GatherSumParams {
  const void* rows;            // [TK, H] sorted rows
  const void* scores;          // [T, K], or null for an unweighted sum
  const int32* pair_rows;      // [T*K] flat pair -> sorted row
  const int32* expert_offsets; // [E+2]; [E] = routed pairs
  void* out;                   // [T, H]
  const float* ds_acc;         // [T*K] or null
  void* ds_out;                // [T, K] or null
  int32 hidden;
  int32 topk;
  int32 experts;
};

template <typename T, int THREADS, int VEC>
__global__ void __launch_bounds__(THREADS) gather_sum_kernel(const __grid_constant__ GatherSumParams p) {
  const int64 t = blockIdx.x;
  const int64 first_pair = t * p.topk;
  if (p.ds_out != nullptr && blockIdx.y == 0) {
    for (int k = threadIdx.x; k < p.topk; k += THREADS) {
      store_float(static_cast<T*>(p.ds_out) + first_pair + k, p.ds_acc[first_pair + k]);
    }
  }
  const int h0 = (static_cast<int>(blockIdx.y) * THREADS + static_cast<int>(threadIdx.x)) * VEC;
  if (h0 >= p.hidden) return;
  const int32 routed = p.expert_offsets[p.experts];
  const T* rows = static_cast<const T*>(p.rows);
  const T* scores = static_cast<const T*>(p.scores);
  float acc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0.f;
  for (int k = 0; k < p.topk; ++k) {
    const int32 row = p.pair_rows[first_pair + k];
    if (row >= routed) continue;
    const float w = scores != nullptr ? load_float(scores + first_pair + k) : 1.f;
    const T* src = rows + static_cast<int64>(row) * p.hidden + h0;
    if constexpr (VEC == 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(src);
      const uint32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[2 * j] += w * DTypeTraits<T>::to_float(static_cast<uint16>(words[j] & 0xffffu));
        acc[2 * j + 1] += w * DTypeTraits<T>::to_float(static_cast<uint16>(words[j] >> 16));
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (h0 + j < p.hidden) acc[j] += w * load_float(src + j);
      }
    }
  }
  T* out = static_cast<T*>(p.out) + t * p.hidden + h0;
  if constexpr (VEC == 8) {
    uint4 v;
    v.x = DTypeTraits<T>::pack2(acc[0], acc[1]);
    v.y = DTypeTraits<T>::pack2(acc[2], acc[3]);
    v.z = DTypeTraits<T>::pack2(acc[4], acc[5]);
    v.w = DTypeTraits<T>::pack2(acc[6], acc[7]);
    *reinterpret_cast<uint4*>(out) = v;
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (h0 + j < p.hidden) store_float(out + j, acc[j]);
    }
  }
}

}  // namespace moejit
