// The Hopper (sm_90a) bulk tensor copy (TMA): one instruction copies a whole box of a tensor,
// described by a tensor map the host encoded (src/moe/tensor_maps.cpp), into shared memory in
// the swizzled layout wgmma reads, zero-filling what lies outside the tensor. Completion is
// counted in bytes on an mbarrier (the warp-specialized pipeline's `full` barrier).
#pragma once

#include "common/gemm_sm80.cuh"

namespace moejit {

// An encoded CUtensorMap (128 opaque bytes; the copy needs 64-byte alignment, 128 matches the
// host mirror in src/moe/kernel_params.hpp). Kernels take it inside their __grid_constant__
// parameters, whose address the copy reads it through.
struct alignas(128) TensorMap {
  uint64 opaque[16];
};

// Arrives on the barrier and adds `bytes` to the transactions its phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64* bar, uint32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Copies the box at `coords` (innermost dimension first) of `map` to `dst`, completing its
// bytes on `bar`. dst starts on a 1024-byte boundary of the swizzle pattern (128B: 8 rows of
// 128 bytes; 64B: 8 rows of 64 bytes, so 512 bytes suffice).
__device__ __forceinline__ void tma_load(void* dst, const TensorMap& map, uint64* bar, int32 c0, int32 c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(&map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap& map, uint64* bar, int32 c0, int32 c1, int32 c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_u32(dst)),
      "l"(&map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap& map, uint64* bar, int32 c0, int32 c1, int32 c2,
                                         int32 c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_u32(dst)),
      "l"(&map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}

// An MN-major tile (PanelTile<BK, COLS>) as COLS / 64 boxes of 64 columns x BK rows: panel p
// holds columns col0 + 64p; `outer` are the box's other coordinates (its first row, ...).
template <typename Tile, typename T, typename... Outer>
__device__ __forceinline__ void tma_load_panels(T* dst, const TensorMap& map, uint64* bar, int32 col0, Outer... outer) {
#pragma unroll
  for (int p = 0; p < Tile::kCols / 64; ++p) tma_load(dst + p * Tile::kPanelElems, map, bar, col0 + 64 * p, outer...);
}

// Zeroes rows [first, kRows) of an MN-major tile (PanelTile) in the THREADS MMA threads, fenced
// for wgmma's reads and synchronized among them; every MMA thread calls it with the same
// `first`. A TMA box cannot stop at an expert's last row: rows past it hold other data.
template <typename Tile, int THREADS, typename T>
__device__ __forceinline__ void zero_panel_rows(T* tile, int first) {
  constexpr int kChunks = Tile::kCols / 8;
  for (int idx = static_cast<int>(threadIdx.x); idx < (Tile::kRows - first) * kChunks; idx += THREADS) {
    const int r = first + idx / kChunks, col = (idx % kChunks) * 8;
    uint4 zero;
    zero.x = zero.y = zero.z = zero.w = 0;
    *reinterpret_cast<uint4*>(tile + Tile::offset(r, col)) = zero;
  }
  fence_proxy_async_shared();
  sync_mma_threads<THREADS>();
}

}  // namespace moejit
