// An epilogue warpgroup's input: the MMA warpgroups hand each tile's accumulators over in shared
// memory (persistent_main_loop's group_epilogue), so the tensor cores start the next tile while a
// warpgroup of its own finishes this one.
#pragma once

#include "common/dtype.cuh"
#include "common/gemm_sm80.cuh"

namespace moejit {

// Warps of the epilogue warpgroup.
constexpr int kEpilogueWarps = 4;

// The most pipeline stage bytes beside which a 128 x 256 fp32 handoff tile (128 KB) still fits
// sm_90's 227 KB; deeper pipelines hand over in the storage type instead. Mirrored by
// tuner/role_traits.cpp (epilogue_handoff_bytes).
constexpr int kFp32HandoffMaxStageBytes = 96 * 1024;

// fwd_up hands g and u to the producer warpgroup's spare warps beside at most this many bytes of
// stages: two bf16 128 x 128 tiles (64 KB) then fit beside them. Mirrored by tuner/role_traits.cpp
// (fwd_up_handoff).
constexpr int kFwdUpHandoffMaxStageBytes = 144 * 1024;

// A BM x BN tile of S (float, or the storage type T) in units of 4 columns; unit u of row r sits
// at unit u ^ (r % 8) of its row. The MMA warps' fragment writes (8 rows by 2 units per
// instruction) and the epilogue warps' row reads (32 consecutive units of one row per instruction)
// then meet no bank conflicts, or two-way ones at 2-byte S.
template <int BM, int BN, typename S>
struct HandoffTile {
  static_assert(BN % 32 == 0, "rows of whole 8-unit swizzle groups");
  static constexpr int kBytes = BM * BN * static_cast<int>(sizeof(S));
  S* base;

  __device__ __forceinline__ S* unit(int r, int u) const { return base + r * BN + 4 * (u ^ (r & 7)); }

  // The MMA threads' accumulators (wgmma's fragment layout) into the tile.
  template <typename Mma>
  __device__ __forceinline__ void store(const Mma& mma) const {
    for_each_acc_pair(mma, [&](int r, int col, float v0, float v1) {
      S* dst = unit(r, col / 4) + col % 4;  // col is even: a column pair within one unit
      if constexpr (sizeof(S) == 4) {
        float2 v;
        v.x = v0;
        v.y = v1;
        *reinterpret_cast<float2*>(dst) = v;
      } else {
        *reinterpret_cast<uint32*>(dst) = DTypeTraits<S>::pack2(v0, v1);
      }
    });
  }

  // The 4 columns of unit u of row r, as fp32.
  __device__ __forceinline__ void load(int r, int u, float (&d)[4]) const {
    if constexpr (sizeof(S) == 4) {
      const float4 v = *reinterpret_cast<const float4*>(unit(r, u));
      d[0] = v.x;
      d[1] = v.y;
      d[2] = v.z;
      d[3] = v.w;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(unit(r, u));
      const uint32 w[2] = {v.x, v.y};
#pragma unroll
      for (int j = 0; j < 4; ++j) d[j] = word_element<S>(w, j);
    }
  }
};

}  // namespace moejit
