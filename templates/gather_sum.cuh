// gather_sum: the moves between token order [T, H] and sorted-row order [TK, H], over a 2-D
// grid (tokens x hidden blocks) so that small T still fills the GPU.
//   sum (SCATTER false): tokens[t] = sum_k s[t,k] * rows[pair_rows[t*K + k]] in fp32. Without
//     scores it is the plain sum that turns bwd_dx's per-slot rows into dx; that launch also
//     writes d_topk_weights, each pair's sum of bwd_down's fp32 slots (one per 64 columns of I)
//     added by one warp in one order, so the same bits on every run and at every block size.
//   scatter (SCATTER true): rows[pair_rows[t*K + k]] = tokens[t], the pre-gather that lets the
//     TMA configs of fwd_up, bwd_down, bwd_dw2 and bwd_dw1 bulk-copy their token rows.
// Dropped pairs (row >= routed count) are skipped either way.
#pragma once

#include "common/dtype.cuh"
#include "common/warp.cuh"

namespace moejit {

struct GatherSumParams {
  void* rows;                  // [TK, H] sorted rows: the sum reads them, the scatter writes them
  const void* scores;          // [T, K], or null for an unweighted sum
  const int32* pair_rows;      // [T*K] flat pair -> sorted row
  const int32* expert_offsets; // [E+2]; [E] = routed pairs
  void* tokens;                // [T, H]: the sum writes it, the scatter reads it
  const float* ds_acc;         // [T*K, ds_slots] or null
  void* ds_out;                // [T, K] or null
  int32 hidden;
  int32 topk;
  int32 experts;
  int32 ds_slots;
};

// VEC consecutive elements of a row, held as loaded (one 16-byte word when VEC is 8: rows
// 16-byte aligned) and converted to fp32 only when used, so a thread can keep several in flight.
template <typename T, int VEC>
struct RowChunk {
  static constexpr int kWords = VEC == 8 ? 4 : VEC;  // packed pairs, or one element each
  uint32 words[kWords];

  __device__ __forceinline__ void load(const T* src, int valid) {
    if constexpr (VEC == 8) {
      const uint4 q = *reinterpret_cast<const uint4*>(src);
      words[0] = q.x;
      words[1] = q.y;
      words[2] = q.z;
      words[3] = q.w;
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) words[j] = j < valid ? reinterpret_cast<const uint16*>(src)[j] : 0u;
    }
  }
  __device__ __forceinline__ float at(int j) const {
    if constexpr (VEC == 8) return word_element<T>(words, j);
    return DTypeTraits<T>::to_float(static_cast<uint16>(words[j]));
  }
  __device__ __forceinline__ void store(T* dst, int valid) const {
    if constexpr (VEC == 8) {
      uint4 q;
      q.x = words[0];
      q.y = words[1];
      q.z = words[2];
      q.w = words[3];
      *reinterpret_cast<uint4*>(dst) = q;
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (j < valid) reinterpret_cast<uint16*>(dst)[j] = static_cast<uint16>(words[j]);
      }
    }
  }
  __device__ __forceinline__ void pack(const float (&v)[VEC]) {
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      if constexpr (VEC == 8) {
        words[j] = DTypeTraits<T>::pack2(v[2 * j], v[2 * j + 1]);
      } else {
        words[j] = DTypeTraits<T>::from_float(v[j]);
      }
    }
  }
};

// Pairs a thread handles at once: their row indices, scores and rows are all loaded before any is
// used, so a thread keeps up to K loads in flight rather than one. The moves then run near the
// HBM's rate at every block size: 32-thread blocks moved 3.3 TB/s one load at a time, 4.1 with K
// (T=32768; the larger blocks were at 4.2 already, performance log, session 16).
constexpr int kPairsInFlight = 8;

template <typename T, int THREADS, int VEC, bool SCATTER>
__global__ void __launch_bounds__(THREADS) gather_sum_kernel(const __grid_constant__ GatherSumParams p) {
  const int64 t = blockIdx.x;
  const int64 first_pair = t * p.topk;
  if (!SCATTER && p.ds_out != nullptr && blockIdx.y == 0) {
    // A warp sums kDsPairs pairs at once, with all their loads in flight: one pair per round trip
    // kept this block's rows waiting K round trips (session 39). Lane l adds slots l, l + 32, ...
    // in order, then the lanes' sums meet in one fixed tree (warp_sum_each): the same bits
    // whichever warp and block size sum the pair.
    static_assert(THREADS % 32 == 0, "whole warps");
    // kDsChunks: slots per lane and pair loaded at once; four took the kernel from 70-71 registers
    // to 74-76, and so fewer of its 32-thread blocks fit an SM.
    constexpr int kDsPairs = 8, kDsChunks = 2;
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(lane_id());
    for (int k0 = warp * kDsPairs; k0 < p.topk; k0 += THREADS / 32 * kDsPairs) {
      float ds[kDsPairs];
#pragma unroll
      for (int k = 0; k < kDsPairs; ++k) ds[k] = 0.f;
      for (int j0 = lane; j0 < p.ds_slots; j0 += 32 * kDsChunks) {
        float v[kDsChunks][kDsPairs];
#pragma unroll
        for (int c = 0; c < kDsChunks; ++c)
#pragma unroll
          for (int k = 0; k < kDsPairs; ++k) {
            const int j = j0 + 32 * c;
            v[c][k] = k0 + k < p.topk && j < p.ds_slots ? p.ds_acc[(first_pair + k0 + k) * p.ds_slots + j] : 0.f;
          }
#pragma unroll
        for (int c = 0; c < kDsChunks; ++c)
#pragma unroll
          for (int k = 0; k < kDsPairs; ++k) ds[k] += v[c][k];
      }
      // Lane l holds pair k0 + l / 4's total (32 / kDsPairs lanes each).
      const float total = warp_sum_each<kDsPairs>(ds);
      const int k = k0 + lane / (32 / kDsPairs);
      if (lane % (32 / kDsPairs) == 0 && k < p.topk) store_float(static_cast<T*>(p.ds_out) + first_pair + k, total);
    }
  }
  const int h0 = (static_cast<int>(blockIdx.y) * THREADS + static_cast<int>(threadIdx.x)) * VEC;
  if (h0 >= p.hidden) return;
  const int valid = p.hidden - h0;
  const int32 routed = p.expert_offsets[p.experts];
  T* rows = static_cast<T*>(p.rows);
  T* tokens = static_cast<T*>(p.tokens) + t * p.hidden + h0;
  const T* scores = static_cast<const T*>(p.scores);
  const auto row_of = [&](int k) -> int32 { return k < p.topk ? p.pair_rows[first_pair + k] : routed; };
  RowChunk<T, VEC> chunk;
  // if/else rather than an early return: NVRTC warns of unreachable code after one (#128-D).
  if constexpr (SCATTER) {
    chunk.load(tokens, valid);
    for (int k0 = 0; k0 < p.topk; k0 += kPairsInFlight) {
      int32 row[kPairsInFlight];
#pragma unroll
      for (int j = 0; j < kPairsInFlight; ++j) row[j] = row_of(k0 + j);
#pragma unroll
      for (int j = 0; j < kPairsInFlight; ++j) {
        if (row[j] < routed) chunk.store(rows + static_cast<int64>(row[j]) * p.hidden + h0, valid);
      }
    }
  } else {
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0.f;
    for (int k0 = 0; k0 < p.topk; k0 += kPairsInFlight) {
      int32 row[kPairsInFlight];
      float weight[kPairsInFlight];
      RowChunk<T, VEC> in[kPairsInFlight];
#pragma unroll
      for (int j = 0; j < kPairsInFlight; ++j) row[j] = row_of(k0 + j);
#pragma unroll
      for (int j = 0; j < kPairsInFlight; ++j) {
        if (row[j] >= routed) continue;
        weight[j] = scores != nullptr ? load_float(scores + first_pair + k0 + j) : 1.f;
        in[j].load(rows + static_cast<int64>(row[j]) * p.hidden + h0, valid);
      }
      // Summed in pair order, as one pair at a time did: the result does not depend on kPairsInFlight.
#pragma unroll
      for (int j = 0; j < kPairsInFlight; ++j) {
        if (row[j] >= routed) continue;
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] += weight[j] * in[j].at(e);
      }
    }
    chunk.pack(acc);
    chunk.store(tokens, valid);
  }
}

}  // namespace moejit
