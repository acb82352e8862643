// Static facts about each kernel role that codegen, pruning and the launchers share: what kind
// of grid it runs, its GEMM dimensions for a problem, its warp layout and shared memory.
#pragma once

#include "jit/role.hpp"
#include "moe/shape.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

enum class RoleKind {
  kRouting,     // histogram, then scan + scatter
  kTokenGemm,   // rows = token tiles of one expert (fwd_up, fwd_down, bwd_down, bwd_dx)
  kExpertGemm,  // tiles of one expert's weight gradient, K = its tokens (bwd_dw1, bwd_dw2)
  kGather,      // gather_sum
  kUtility,     // autotuner helpers (templates/util.cuh)
};

RoleKind role_kind(Role r);

// Tile rows shared by routing and every token GEMM of a problem: the smallest power of two in
// [16, 128] that covers the expected tokens per expert m plus two spreads (m + 2 sqrt(m)).
int token_block_m(const MoeShape& shape);

struct GemmDims {
  long long m = 0;  // token GEMMs: T*K rows; expert GEMMs: weight-gradient rows
  long long n = 0;  // output columns
  long long k = 0;  // reduction length (expert GEMMs: tokens of an expert, T*K at most)
};
GemmDims gemm_dims(Role r, const MoeShape& shape);

// The smallest power of two >= v (1 for v <= 1): tile edges and warp counts are powers of two,
// which pruning and the config spaces fit to a problem's extents with it.
long long next_pow2(long long v);

// Columns of the B tile: BLOCK_N, doubled for fwd_up (gate and up rows together).
int gemm_tile_n(Role r, const TileConfig& c);

// mma.sync configs: warps along M of a legal warp layout (warp tiles are multiples of 16x16 and
// as square as the warp count allows). wgmma (Hopper) configs: warpgroups along M, as many as
// the tile's 64-row blocks allow, with a wgmma N of 64, 128 or 256 per warpgroup. 0 when the
// tile cannot be split over c.warps warps.
int gemm_warp_rows(Role r, const TileConfig& c);

// Hopper configs: the N of each warpgroup's wgmma instructions (0 without a legal layout).
int gemm_wgmma_n(Role r, const TileConfig& c);

// fp32 accumulator registers per thread.
int gemm_accumulators(Role r, const TileConfig& c);

// Whether a GEMM role's tiles can be TMA copies for this shape (src/moe/tensor_maps.cpp): every
// row stride a multiple of 16 bytes (H and I multiples of 8) and every stride below the
// driver's 2^40 bytes. The tuning key records it (use_tma).
bool tma_eligible(Role r, const MoeShape& shape);

// The token rows a TMA config bulk-copies instead of gathering: x or dO, which gather_sum's
// scatter writes in sorted order into a [TK, H] buffer before the role runs.
enum class SortedRows { kNone, kX, kDOut };
SortedRows sorted_rows_read(Role r, const TileConfig& c);

// Whether the config may run a persistent grid (templates/common/gemm.cuh, kPersistentEligible):
// the TMA warp-specialized tiles with two MMA warpgroups, and the cluster pairs, of every GEMM
// role; bwd_down's pairs up to 128 columns wide, and its 128 x 256 tiles with an epilogue
// warpgroup. The space holds these tiles both ways.
bool persistent_eligible(Role r, const TileConfig& c);

// Whether the config runs a persistent grid (TileConfig::persistent, where eligible): the grid
// then holds only the blocks the device runs at once.
bool persistent_grid(Role r, const TileConfig& c);

// Whether the config's blocks add an epilogue warpgroup (templates/bwd_down.cuh,
// kBwdDownEpilogueGroup): bwd_down's persistent tiles wider than 128 columns, whose g and u do not
// fit beside the stages; the MMA warps hand each tile's d_act over in shared memory instead.
bool epilogue_group(Role r, const TileConfig& c);

// Whether fwd_up's persistent blocks hand each tile's g and u to the producer warpgroup's spare
// warps (templates/fwd_up.cuh, kFwdUpHandoff): those of their own whose stages take at most 144 KB,
// beside which the two bf16 tiles fit.
bool fwd_up_handoff(Role r, const TileConfig& c);

// Whether the config's persistent blocks stage their output tile two 64-column panels at a time
// (templates/common/gemm.cuh, PersistentStaging's ring): tiles wider than 128 columns beside more
// than 160 KB of stages, where the whole tile's staging would leave no room for the last stage
// (a fourth of BK 64 at 128 x 256). Not bwd_down's, which stores its own way.
bool ring_staging(Role r, const TileConfig& c);

// Threads per block: TileConfig::block_threads plus the epilogue warpgroup, if any.
int role_block_threads(Role r, const TileConfig& c);

// Shared memory of the tile the MMA warps hand to the epilogue warpgroup (0 without one): fp32
// beside at most 96 KB of stages, else the storage type, d_act rounded as PyTorch's grouped GEMMs
// round it (templates/common/epilogue_group.cuh).
long long epilogue_handoff_bytes(Role r, const TileConfig& c);

// The columns of H a gather_sum block covers: 8 per thread on the 16-byte vector path (`vector`:
// H and I multiples of 8, MoeShape::vector_aligned), else 1. Its blocks per row (the grid's y
// extent) are H over that.
long long gather_block_columns(const TileConfig& c, bool vector);
long long gather_column_blocks(const TileConfig& c, long long hidden, bool vector);
// CUDA's limit on a grid's y extent, which gather_column_blocks must stay within; and the most
// warps a gather_sum block has (config_space), whose columns bound H (validate_problem).
inline constexpr long long kMaxGatherColumnBlocks = 65535;
inline constexpr int kMaxGatherWarps = 8;

// Dynamic shared memory of one launch of the role at this config, bytes.
long long role_smem_bytes(Role r, const TileConfig& c, const MoeShape& shape);

}  // namespace moejit
