// What a GEMM role includes: the loaders, main loops and epilogue helpers, and the choice of
// MMA and pipeline. WGMMA selects the Hopper warpgroup MMA (sm_90a configs,
// tuner/config_space.cpp), otherwise mma.sync; WS (wgmma only) the warp-specialized main loop,
// otherwise the multistage one. WM counts warps along M for mma.sync and warpgroups along M for
// wgmma (tuner/role_traits.cpp, gemm_warp_rows). WARPS counts the MMA warps; a warp-specialized
// block adds the producer warpgroup (GemmLaunch, mirrored by TileConfig::block_threads).
#pragma once

#include "common/gemm_sm80.cuh"
#include "common/epilogue_sm90.cuh"
#include "common/pipeline_sm90.cuh"
#include "common/wgmma_sm90.cuh"

namespace moejit {

template <bool WGMMA, bool WS, typename T, int BM, int BN, int BK, int WARPS, int WM, bool A_KMAJOR, bool B_KMAJOR>
using GemmMma = typename Select<WGMMA, WgmmaMma<T, BM, BN, BK, WARPS, WM, A_KMAJOR, B_KMAJOR, WS>,
                                WarpMma<T, BM, BN, BK, WM, WARPS / WM, A_KMAJOR, B_KMAJOR>>::type;

// Shared memory of a pipeline's STAGES A and B tiles.
template <typename Mma, int STAGES>
constexpr int kStageRingBytes = STAGES * (Mma::ATile::kElems + Mma::BTile::kElems) * 2;

// Beside more than this many bytes of stages, a persistent loop stages its output tile two
// 64-column panels at a time (SwizzledTile's ring): a 128 x 256 tile's whole staging (64 KB)
// leaves no room for a fourth stage of 48 KB. Mirrored by tuner/role_traits.cpp (ring_staging).
constexpr int kWholeStagingMaxStageBytes = 160 * 1024;

// Where a persistent loop's epilogue stages its BM x BN output tile (GemmSmem::apart()).
template <typename Mma, int STAGES, int BM, int BN>
using PersistentStaging =
    SwizzledTile<typename Mma::Element, BM, BN,
                 (kStageRingBytes<Mma, STAGES> > kWholeStagingMaxStageBytes && BN > 128 ? 2 : BN / 64)>;

// A GEMM role's dynamic shared memory, as tuner/role_traits.cpp (role_smem_bytes) sizes it:
// STAGES A tiles, STAGES B tiles, OUT_ELEMS elements of a persistent loop's output tile
// (apart()), ROWS int64 row offsets or token ring (one-tile blocks only), then the
// warp-specialized pipeline's 2 * STAGES barriers. The base is 1024-byte aligned (wgmma swizzle
// atoms) and every tile stage and output tile is a multiple of 1024 bytes. One-tile blocks stage
// their output tile in the stages once the main loop is done (run_token_gemm, run_expert_gemm).
template <typename Mma, int STAGES, int ROWS, int OUT_ELEMS = 0>
struct GemmSmem {
  using T = typename Mma::Element;
  static constexpr int kPipelineBytes = kStageRingBytes<Mma, STAGES>;
  static_assert(OUT_ELEMS * 2 % 1024 == 0, "TMA stores read 1024-byte aligned swizzled panels");
  T* a;
  T* b;
  T* out;
  int64* rows;
  uint64* barriers;

  __device__ __forceinline__ explicit GemmSmem(unsigned char* base)
      : a(reinterpret_cast<T*>(base)),
        b(a + STAGES * Mma::ATile::kElems),
        out(b + STAGES * Mma::BTile::kElems),
        rows(reinterpret_cast<int64*>(out + OUT_ELEMS)),
        barriers(reinterpret_cast<uint64*>(rows + ROWS)) {}

  __device__ __forceinline__ T* a_stage(int stage) const { return a + stage * Mma::ATile::kElems; }
  __device__ __forceinline__ T* b_stage(int stage) const { return b + stage * Mma::BTile::kElems; }
  // The barrier a stage's TMA copies complete on (warp-specialized pipeline).
  __device__ __forceinline__ uint64* full(int stage) const { return barriers + stage; }

  // Where a persistent loop's epilogue stages its output: apart from the stages, which the
  // producer refills meanwhile.
  template <int BM, int BN>
  __device__ __forceinline__ PersistentStaging<Mma, STAGES, BM, BN> apart() const {
    static_assert(PersistentStaging<Mma, STAGES, BM, BN>::kElems <= OUT_ELEMS, "the output tile has its own shared memory");
    return {out};
  }
  // Where a one-tile block's epilogue stages its output: the stages, done with.
  template <int BM, int BN>
  __device__ __forceinline__ StagedTile<T, BM, BN> in_stages() const {
    static_assert(StagedTile<T, BM, BN>::kBytes <= kPipelineBytes, "the output tile fits the pipeline's shared memory");
    return {a};
  }
};

// A role's __launch_bounds__: block threads, and the minimum of blocks per SM, which fixes the
// registers each thread starts with (the warp-specialized register split depends on it).
// EPILOGUE_GROUP adds an epilogue warpgroup (persistent_main_loop); tuner/role_traits.cpp
// (role_block_threads) mirrors it.
template <bool WS, int WARPS, bool EPILOGUE_GROUP = false>
struct GemmLaunch {
  static constexpr int kThreads = WARPS * 32 + (WS ? kProducerThreads : 0) + (EPILOGUE_GROUP ? 128 : 0);
  static constexpr int kMinBlocks = WS ? RegisterSplit<WS ? WARPS : 4>::kBlocksPerSm : 1;
};

// Which configs may run a persistent grid (persistent_main_loop through run_token_gemm or
// run_expert_gemm; the config's PERSISTENT says whether they do): the TMA warp-specialized
// configs with two MMA warpgroups (one block per SM, so nothing else overlaps their epilogue) and
// the cluster pairs. Mirrors tuner/role_traits.cpp (persistent_eligible), which also names the
// roles that may.
template <bool TMA, bool WS, int WARPS, int CLUSTER>
constexpr bool kPersistentEligible = TMA && WS && (WARPS == 8 || CLUSTER == 2);

// A per-work step (a prologue, a producer's step after its loads) that does nothing.
struct NoStep {
  template <typename Work>
  __device__ __forceinline__ void operator()(const Work&) const {}
};

// A main loop's `landed` step when nothing needs fixing after a stage's copies: every k row of
// the stage is the tile's.
struct NothingToFix {
  __device__ __forceinline__ int operator()(int, int) const { return kWholeKTile; }
};

// Runs the k loop into fresh accumulators (the first k tile's MMAs overwrite them; with no k tile
// they are undefined, for the caller to zero): load(stage, k_tile) fills one pipeline stage
// (with load_tile / fill_tile over Mma::kLoaders threads, and, warp-specialized only, TMA copies
// of TMA_BYTES per stage, after which landed(stage, k_tile) runs in the MMA threads; see
// warp_specialized_main_loop). `barriers` points at 2 * STAGES uint64 of shared memory, used by
// the warp-specialized loop only, as is `paired` (a cluster pair's, ClusterPair). Returns false
// in threads that hold no accumulators (the producer warpgroup), which must leave the epilogue
// to the rest.
template <int STAGES, int TMA_BYTES = 0, typename Mma, typename T, typename Load, typename Landed = NothingToFix>
__device__ __forceinline__ bool gemm_main_loop(Mma& mma, const T* sa, const T* sb, uint64* barriers, int k_tiles,
                                               Load load, Landed landed = {}, bool paired = false) {
  if constexpr (Mma::kWarpSpecialized) {
    return warp_specialized_main_loop<STAGES, TMA_BYTES>(mma, sa, sb, barriers, k_tiles, load, landed, paired);
  } else {
    static_assert(TMA_BYTES == 0, "TMA copies complete on the warp-specialized pipeline's barriers");
    multistage_main_loop<STAGES>(mma, sa, sb, k_tiles, load);
    return true;
  }
}

}  // namespace moejit
