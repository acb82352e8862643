// What a GEMM role includes: the loaders, main loops and epilogue helpers, and the choice of
// MMA and pipeline. WGMMA selects the Hopper warpgroup MMA (sm_90a configs,
// tuner/config_space.cpp), otherwise mma.sync; WS (wgmma only) the warp-specialized main loop,
// otherwise the multistage one. WM counts warps along M for mma.sync and warpgroups along M for
// wgmma (tuner/role_traits.cpp, gemm_warp_rows). WARPS counts the MMA warps; a warp-specialized
// block adds the producer warpgroup (GemmLaunch, mirrored by TileConfig::block_threads).
#pragma once

#include "common/gemm_sm80.cuh"
#include "common/pipeline_sm90.cuh"
#include "common/wgmma_sm90.cuh"

namespace moejit {

template <bool WGMMA, bool WS, typename T, int BM, int BN, int BK, int WARPS, int WM, bool A_KMAJOR, bool B_KMAJOR>
using GemmMma = typename Select<WGMMA, WgmmaMma<T, BM, BN, BK, WARPS, WM, A_KMAJOR, B_KMAJOR, WS>,
                                WarpMma<T, BM, BN, BK, WM, WARPS / WM, A_KMAJOR, B_KMAJOR>>::type;

// A GEMM role's dynamic shared memory, as tuner/role_traits.cpp (role_smem_bytes) sizes it:
// STAGES A tiles, STAGES B tiles, ROWS int64 row offsets (token GEMMs reserve BM), then the
// warp-specialized pipeline's 2 * STAGES barriers. The base is 1024-byte aligned (wgmma
// swizzle atoms) and every tile stage is a multiple of 1024 bytes.
template <typename Mma, int STAGES, int ROWS>
struct GemmSmem {
  using T = typename Mma::Element;
  T* a;
  T* b;
  int64* rows;
  uint64* barriers;

  __device__ __forceinline__ explicit GemmSmem(unsigned char* base)
      : a(reinterpret_cast<T*>(base)),
        b(a + STAGES * Mma::ATile::kElems),
        rows(reinterpret_cast<int64*>(b + STAGES * Mma::BTile::kElems)),
        barriers(reinterpret_cast<uint64*>(rows + ROWS)) {}
};

// A role's __launch_bounds__: block threads, and the minimum of blocks per SM, which fixes the
// registers each thread starts with (the warp-specialized register split depends on it).
template <bool WS, int WARPS>
struct GemmLaunch {
  static constexpr int kThreads = WARPS * 32 + (WS ? kProducerThreads : 0);
  static constexpr int kMinBlocks = WS ? RegisterSplit<WS ? WARPS : 4>::kBlocksPerSm : 1;
};

// Zeroes the accumulators and runs the k loop: load(stage, k_tile) fills one pipeline stage
// (with load_tile / fill_tile over Mma::kLoaders threads). `barriers` points at 2 * STAGES
// uint64 of shared memory, used by the warp-specialized loop only. Returns false in threads
// that hold no accumulators (the producer warpgroup), which must leave the epilogue to the rest.
template <int STAGES, typename Mma, typename T, typename Load>
__device__ __forceinline__ bool gemm_main_loop(Mma& mma, const T* sa, const T* sb, uint64* barriers, int k_tiles,
                                               Load load) {
  if constexpr (Mma::kWarpSpecialized) {
    return warp_specialized_main_loop<STAGES>(mma, sa, sb, barriers, k_tiles, load);
  } else {
    multistage_main_loop<STAGES>(mma, sa, sb, k_tiles, load);
    return true;
  }
}

}  // namespace moejit
