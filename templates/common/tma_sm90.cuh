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

// The multicast form of the 3-d and 4-d copies (cluster configs): the box lands at `dst` and
// completes its bytes on `bar`, both at the same offsets, in every CTA of the cluster named in
// `cta_mask`; 0 copies into this CTA alone.
__device__ __forceinline__ void tma_load_multicast(void* dst, const TensorMap& map, uint64* bar, uint16 cta_mask,
                                                   int32 c0, int32 c1, int32 c2) {
  if (cta_mask == 0) return tma_load(dst, map, bar, c0, c1, c2);
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%2, %3, %4}], [%5], %6;\n" ::"r"(smem_u32(dst)),
      "l"(&map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar)), "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_multicast(void* dst, const TensorMap& map, uint64* bar, uint16 cta_mask,
                                                   int32 c0, int32 c1, int32 c2, int32 c3) {
  if (cta_mask == 0) return tma_load(dst, map, bar, c0, c1, c2, c3);
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%2, %3, %4, %5}], [%6], %7;\n" ::"r"(smem_u32(dst)),
      "l"(&map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar)), "h"(cta_mask)
      : "memory");
}

// Copies the box at `coords` of `map` from `src` in shared memory (the layout tma_load writes),
// as one bulk async-group operation of this thread; rows and columns outside the tensor are not
// written. The writes that filled `src` must be fenced for the async proxy
// (fence_proxy_async_shared) and the group committed (bulk_commit) after the last store.
__device__ __forceinline__ void tma_store(const TensorMap& map, const void* src, int32 c0, int32 c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(&map), "r"(c0),
               "r"(c1), "r"(smem_u32(src))
               : "memory");
}
__device__ __forceinline__ void tma_store(const TensorMap& map, const void* src, int32 c0, int32 c1, int32 c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(&map),
               "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(src))
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until this thread's committed stores, but for the PENDING last groups, have read their shared
// memory (it may be rewritten).
template <int PENDING = 0>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
}
// Until this thread's committed stores have completed.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// A token GEMM block's place in a cluster of CLUSTER blocks (1 or 2) along the grid. The pair
// is `paired` when both blocks have a tile: their pipelines then wait on each other's consumers
// (warp_specialized_main_loop), and it is `shared` when the tiles also have the same expert and
// columns: each block then copies only its part of the weight tile, into both. Both blocks
// compute the same values.
struct ClusterPair {
  bool paired = false;
  bool shared = false;
  uint32 rank = 0;  // %cluster_ctarank

  // Issues the PARTS copies of a weight tile, copy(part, cta_mask): all of them alone, or,
  // shared, the parts of this block's rank (part % 2) into both blocks.
  template <int PARTS, typename Copy>
  __device__ __forceinline__ void copy_weight_tile(Copy copy) const {
#pragma unroll
    for (int part = 0; part < PARTS; ++part) {
      if (!shared) copy(part, uint16{0});
      else if (static_cast<uint32>(part % 2) == rank) copy(part, uint16{0b11});
    }
  }
};

__device__ __forceinline__ uint32 cluster_rank() {
  uint32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of the cluster's CTAs; orders shared-memory writes and barrier initializations
// before the other CTA's accesses to them.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// A K-major tile (SmemTile, or KPanelTile at BLOCK_K 128) as boxes of at most 64 columns, one
// per 128-byte swizzle row: copy(dst, k) copies columns k.. of tile rows [tile_row, ...) to dst.
template <typename Tile, typename T, typename Copy>
__device__ __forceinline__ void for_each_k_box(T* tile, int tile_row, int32 k0, Copy copy) {
  constexpr int kBox = Tile::kCols < 64 ? Tile::kCols : 64;
#pragma unroll
  for (int p = 0; p < Tile::kCols / kBox; ++p) copy(tile + (p * Tile::kRows + tile_row) * kBox, k0 + p * kBox);
}

// A K-major stage tile (SmemTile, or KPanelTile at BLOCK_K 128) of rows row0.. and columns k0..
// of a 2-d map, box by box. A stage's copies must bring every byte the pipeline expects of it,
// or its `full` barrier never completes; a single tma_load brings only 64 columns.
template <typename Tile, typename T>
__device__ __forceinline__ void tma_load_k_major(T* tile, const TensorMap& map, uint64* bar, int32 k0, int32 row0) {
  for_each_k_box<Tile>(tile, 0, k0, [&](T* dst, int32 k) { tma_load(dst, map, bar, k, row0); });
}

// An MN-major tile (PanelTile<BK, COLS>) as COLS / 64 boxes of 64 columns x BK rows: panel p
// holds columns col0 + 64p; `outer` are the box's other coordinates (its first row, ...).
template <typename Tile, typename T, typename... Outer>
__device__ __forceinline__ void tma_load_panels(T* dst, const TensorMap& map, uint64* bar, int32 col0, Outer... outer) {
#pragma unroll
  for (int p = 0; p < Tile::kCols / 64; ++p) tma_load(dst + p * Tile::kPanelElems, map, bar, col0 + 64 * p, outer...);
}

// Zeroes rows [first, last) of an MN-major tile (PanelTile), this thread's share of Team's
// (MmaThreads, OwnWarpgroup).
template <typename Tile, typename Team, typename T>
__device__ __forceinline__ void zero_rows_share(T* tile, int first, int last) {
  constexpr int kChunks = Tile::kCols / 8;
  for (int idx = Team::rank(); idx < (last - first) * kChunks; idx += Team::kThreads) {
    const int r = first + idx / kChunks, col = (idx % kChunks) * 8;
    uint4 zero;
    zero.x = zero.y = zero.z = zero.w = 0;
    *reinterpret_cast<uint4*>(tile + Tile::offset(r, col)) = zero;
  }
}

// Zeroes rows [first, last) of a stage's MN-major tiles (PanelTile) A and, unless it is null, B
// in Team's threads, then fences them for wgmma's reads and synchronizes Team, once for both
// tiles; every thread of Team calls it with the same rows. A TMA box cannot stop at an expert's
// last row: rows past it hold other data.
template <typename TileA, typename TileB, typename Team, typename T>
__device__ __forceinline__ void zero_stage_rows(T* a, T* b, int first, int last) {
  zero_rows_share<TileA, Team>(a, first, last);
  if (b != nullptr) zero_rows_share<TileB, Team>(b, first, last);
  fence_proxy_async_shared();
  Team::sync();
}

}  // namespace moejit
