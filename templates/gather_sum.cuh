// gather_sum: the moves between token order [T, H] and sorted-row order [TK, H], over a 2-D
// grid (tokens x hidden blocks) so that small T still fills the GPU.
//   sum (SCATTER false): tokens[t] = sum_k s[t,k] * rows[pair_rows[t*K + k]] in fp32. Without
//     scores it is the plain sum that turns bwd_dx's per-slot rows into dx; that launch also
//     writes d_topk_weights from bwd_down's fp32 accumulators.
//   scatter (SCATTER true): rows[pair_rows[t*K + k]] = tokens[t], the pre-gather that lets the
//     TMA configs of fwd_up, bwd_down, bwd_dw2 and bwd_dw1 bulk-copy their token rows.
// Dropped pairs (row >= routed count) are skipped either way.
#pragma once

#include "common/dtype.cuh"

namespace moejit {

struct GatherSumParams {
  void* rows;                  // [TK, H] sorted rows: the sum reads them, the scatter writes them
  const void* scores;          // [T, K], or null for an unweighted sum
  const int32* pair_rows;      // [T*K] flat pair -> sorted row
  const int32* expert_offsets; // [E+2]; [E] = routed pairs
  void* tokens;                // [T, H]: the sum writes it, the scatter reads it
  const float* ds_acc;         // [T*K] or null
  void* ds_out;                // [T, K] or null
  int32 hidden;
  int32 topk;
  int32 experts;
};

// VEC consecutive elements of a row: one 16-byte access when VEC is 8 (rows 16-byte aligned).
template <typename T, int VEC>
struct RowChunk {
  float v[VEC];

  __device__ __forceinline__ void load(const T* src, int valid) {
    if constexpr (VEC == 8) {
      const uint4 q = *reinterpret_cast<const uint4*>(src);
      const uint32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[2 * j] = DTypeTraits<T>::to_float(static_cast<uint16>(words[j] & 0xffffu));
        v[2 * j + 1] = DTypeTraits<T>::to_float(static_cast<uint16>(words[j] >> 16));
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = j < valid ? load_float(src + j) : 0.f;
    }
  }
  __device__ __forceinline__ void store(T* dst, int valid) const {
    if constexpr (VEC == 8) {
      uint4 q;
      q.x = DTypeTraits<T>::pack2(v[0], v[1]);
      q.y = DTypeTraits<T>::pack2(v[2], v[3]);
      q.z = DTypeTraits<T>::pack2(v[4], v[5]);
      q.w = DTypeTraits<T>::pack2(v[6], v[7]);
      *reinterpret_cast<uint4*>(dst) = q;
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (j < valid) store_float(dst + j, v[j]);
      }
    }
  }
};

template <typename T, int THREADS, int VEC, bool SCATTER>
__global__ void __launch_bounds__(THREADS) gather_sum_kernel(const __grid_constant__ GatherSumParams p) {
  const int64 t = blockIdx.x;
  const int64 first_pair = t * p.topk;
  if (!SCATTER && p.ds_out != nullptr && blockIdx.y == 0) {
    for (int k = threadIdx.x; k < p.topk; k += THREADS) {
      store_float(static_cast<T*>(p.ds_out) + first_pair + k, p.ds_acc[first_pair + k]);
    }
  }
  const int h0 = (static_cast<int>(blockIdx.y) * THREADS + static_cast<int>(threadIdx.x)) * VEC;
  if (h0 >= p.hidden) return;
  const int valid = p.hidden - h0;
  const int32 routed = p.expert_offsets[p.experts];
  T* rows = static_cast<T*>(p.rows);
  T* tokens = static_cast<T*>(p.tokens) + t * p.hidden + h0;
  RowChunk<T, VEC> chunk;
  if constexpr (SCATTER) {
    chunk.load(tokens, valid);
    for (int k = 0; k < p.topk; ++k) {
      const int32 row = p.pair_rows[first_pair + k];
      if (row < routed) chunk.store(rows + static_cast<int64>(row) * p.hidden + h0, valid);
    }
    return;
  }
  const T* scores = static_cast<const T*>(p.scores);
  float acc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0.f;
  for (int k = 0; k < p.topk; ++k) {
    const int32 row = p.pair_rows[first_pair + k];
    if (row >= routed) continue;
    const float w = scores != nullptr ? load_float(scores + first_pair + k) : 1.f;
    chunk.load(rows + static_cast<int64>(row) * p.hidden + h0, valid);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] += w * chunk.v[j];
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) chunk.v[j] = acc[j];
  chunk.store(tokens, valid);
}

}  // namespace moejit
