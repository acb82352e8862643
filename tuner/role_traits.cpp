#include "tuner/role_traits.hpp"

#include <algorithm>
#include <cstdlib>

#include "moe/routing_layout.hpp"

namespace moejit {

RoleKind role_kind(Role r) {
  switch (r) {
    case Role::kRouting: return RoleKind::kRouting;
    case Role::kGatherSum: return RoleKind::kGather;
    case Role::kUtility: return RoleKind::kUtility;
    case Role::kBwdDw1:
    case Role::kBwdDw2: return RoleKind::kExpertGemm;
    default: return RoleKind::kTokenGemm;
  }
}

int token_block_m(const MoeShape& s) {
  const long long per_expert = (s.pairs() + s.experts - 1) / std::max(1, s.experts);
  // A uniform router gives an expert about per_expert +- sqrt(per_expert) rows. A tile of just
  // the mean sends half the experts into a second, nearly empty tile that streams the expert's
  // weights once more, so the tile covers the mean plus two spreads: (bm - m)^2 >= 4 m past m,
  // in integers as in python/moejit/_layout.py.
  const auto covers = [&](long long bm) {
    return bm >= per_expert && (bm - per_expert) * (bm - per_expert) >= 4 * per_expert;
  };
  int bm = 16;
  while (!covers(bm) && bm < 128) bm *= 2;
  return bm;
}

GemmDims gemm_dims(Role r, const MoeShape& s) {
  const long long tk = s.pairs(), h = s.hidden, i = s.intermediate;
  switch (r) {
    case Role::kFwdUp: return {tk, i, h};
    case Role::kFwdDown: return {tk, h, i};
    case Role::kBwdDown: return {tk, i, h};
    case Role::kBwdDx: return {tk, h, 2 * i};
    case Role::kBwdDw2: return {h, i, tk};
    case Role::kBwdDw1: return {2 * i, h, tk};
    default: return {};
  }
}

long long next_pow2(long long v) {
  long long p = 1;
  while (p < v) p *= 2;
  return p;
}

int gemm_tile_n(Role r, const TileConfig& c) { return r == Role::kFwdUp ? 2 * c.block_n : c.block_n; }

int gemm_warp_rows(Role r, const TileConfig& c) {
  const int bm = c.block_m, bn = gemm_tile_n(r, c);
  if (c.arch_tag == ArchTag::kHopper) {
    if (c.warps % 4 != 0) return 0;
    const int groups = c.warps / 4;
    // 512 threads get 128 registers each, fewer than one m64 x n256 wgmma takes (ptxas: 154).
    const int widest = role_block_threads(r, c) > 384 ? 128 : 256;
    for (int wgm = groups; wgm >= 1; wgm /= 2) {
      if (groups % wgm != 0 || bm % (64 * wgm) != 0) continue;
      const int n = bn / (groups / wgm);
      if ((n == 64 || n == 128 || n == 256) && n <= widest) return wgm;
    }
    return 0;
  }
  int best = 0, best_gap = 1 << 30;
  for (int wm = 1; wm <= c.warps; wm *= 2) {
    if (c.warps % wm != 0) continue;
    const int wn = c.warps / wm;
    if (bm % (16 * wm) != 0 || bn % (16 * wn) != 0) continue;
    const int gap = std::abs(bm / wm - bn / wn);
    if (gap <= best_gap) best = wm, best_gap = gap;
  }
  return best;
}

int gemm_wgmma_n(Role r, const TileConfig& c) {
  const int wgm = gemm_warp_rows(r, c);
  if (c.arch_tag != ArchTag::kHopper || wgm == 0) return 0;
  return gemm_tile_n(r, c) / (c.warps / 4 / wgm);
}

int gemm_accumulators(Role r, const TileConfig& c) {
  return c.block_m * gemm_tile_n(r, c) / std::max(1, c.threads());
}

bool tma_eligible(Role r, const MoeShape& s) {
  const bool gemm = role_kind(r) == RoleKind::kTokenGemm || role_kind(r) == RoleKind::kExpertGemm;
  // A tensor map's strides stay below 2^40 bytes; the largest is one expert's W1, 2I x H x 2.
  const bool strides_fit = 4LL * s.hidden * s.intermediate < (1LL << 40);
  return gemm && s.vector_aligned() && strides_fit;
}

SortedRows sorted_rows_read(Role r, const TileConfig& c) {
  if (!c.use_tma) return SortedRows::kNone;
  switch (r) {
    case Role::kFwdUp:
    case Role::kBwdDw1: return SortedRows::kX;
    case Role::kBwdDown:
    case Role::kBwdDw2: return SortedRows::kDOut;
    default: return SortedRows::kNone;
  }
}

namespace {

// Mirrors templates/common/epilogue_group.cuh: beside at most this many bytes of stages, an
// epilogue warpgroup's handoff tile is fp32; beside more, it is the storage type.
constexpr long long kFp32HandoffMaxStageBytes = 96 * 1024;
// Mirrors templates/common/epilogue_group.cuh: fwd_up's persistent blocks beside at most this many
// bytes of stages hand g and u to the producer warpgroup's spare warps.
constexpr long long kFwdUpHandoffMaxStageBytes = 144 * 1024;

// Mirrors templates/common/gemm.cuh (PersistentStaging): beside more than this many bytes of
// stages, a persistent grid's epilogue stages two 64-column panels of a wider output tile at a
// time, for a 128 x 256 tile to keep a fourth stage.
constexpr long long kWholeStagingMaxStageBytes = 160 * 1024;

// A full and an empty mbarrier per stage in warp-specialized pipelines.
long long pipeline_barrier_bytes(const TileConfig& c) { return c.warp_specialized ? 16LL * c.stages : 0; }

// The A and B tiles of every pipeline stage.
long long stage_ring_bytes(Role r, const TileConfig& c) {
  return 2LL * c.stages * (c.block_m + gemm_tile_n(r, c)) * c.block_k;
}

}  // namespace

bool persistent_eligible(Role r, const TileConfig& c) {
  const bool gemm = role_kind(r) == RoleKind::kTokenGemm || role_kind(r) == RoleKind::kExpertGemm;
  // bwd_down's block also keeps the tile's g and u apart from the stages, up to 128 columns; a
  // 128 x 256 tile hands d_act to an epilogue warpgroup instead (templates/bwd_down.cuh).
  if (r == Role::kBwdDown && c.block_n > 128 && !(c.block_n == 256 && c.block_m == 128 && c.cluster == 1)) {
    return false;
  }
  return gemm && c.use_tma && c.warp_specialized && (c.warps == 8 || c.cluster == 2);
}

bool persistent_grid(Role r, const TileConfig& c) { return c.persistent && persistent_eligible(r, c); }

bool epilogue_group(Role r, const TileConfig& c) {
  return r == Role::kBwdDown && c.block_n > 128 && persistent_grid(r, c);
}

bool fwd_up_handoff(Role r, const TileConfig& c) {
  return r == Role::kFwdUp && persistent_grid(r, c) && c.cluster == 1 &&
         stage_ring_bytes(r, c) <= kFwdUpHandoffMaxStageBytes;
}

bool ring_staging(Role r, const TileConfig& c) {
  return r != Role::kBwdDown && persistent_grid(r, c) && c.block_n > 128 &&
         stage_ring_bytes(r, c) > kWholeStagingMaxStageBytes;
}

namespace {

// A persistent grid's output tile staging: the whole tile, or two of its panels.
long long persistent_staging_bytes(Role r, const TileConfig& c) {
  return 2LL * c.block_m * (ring_staging(r, c) ? 128 : c.block_n);
}

}  // namespace

int role_block_threads(Role r, const TileConfig& c) { return c.block_threads() + (epilogue_group(r, c) ? 128 : 0); }

long long epilogue_handoff_bytes(Role r, const TileConfig& c) {
  if (!epilogue_group(r, c)) return 0;
  return (stage_ring_bytes(r, c) <= kFp32HandoffMaxStageBytes ? 4LL : 2LL) * c.block_m * c.block_n;
}

long long role_smem_bytes(Role r, const TileConfig& c, const MoeShape& shape) {
  switch (role_kind(r)) {
    case RoleKind::kRouting: {
      long long worst = 0;
      for (int phase = 0; phase < kRoutingPhases; ++phase) {
        worst = std::max(worst, routing_smem_bytes(phase, c.threads(), shape.experts));
      }
      return worst;
    }
    case RoleKind::kTokenGemm:
      // Pipeline stages of the A and B tiles, then the tile's gathered row offsets (int64), then
      // the barriers (templates/common/gemm.cuh, GemmSmem).
      // A persistent grid's blocks stage the output tile (BM x BLOCK_N swizzled for TMA stores, or
      // two 64-column panels of it at a time: persistent_staging_bytes) apart from the stages
      // instead of keeping row offsets; bwd_down keeps its g and u tiles there (2 x BM x
      // BLOCK_N), or the d_act it hands to its epilogue warpgroup (epilogue_handoff_bytes), and
      // two barriers for them in the row offsets' place; fwd_up's handoff blocks keep the tile's
      // g and u and their two barriers likewise.
      return stage_ring_bytes(r, c) + pipeline_barrier_bytes(c) +
             (!persistent_grid(r, c)                          ? 8LL * c.block_m
              : epilogue_group(r, c)                         ? epilogue_handoff_bytes(r, c) + 16
              : r == Role::kBwdDown || fwd_up_handoff(r, c) ? 4LL * c.block_m * c.block_n + 16
                                                              : persistent_staging_bytes(r, c));
    case RoleKind::kExpertGemm:
      // Pipeline stages, the barriers, then the k rows' token ring (2 * BLOCK_K int32), or a
      // persistent grid's output tile staging instead (it copies with TMA, needing no ring).
      return stage_ring_bytes(r, c) + pipeline_barrier_bytes(c) +
             (persistent_grid(r, c) ? persistent_staging_bytes(r, c) : 8LL * c.block_k);
    case RoleKind::kGather:
    case RoleKind::kUtility: return 0;
  }
  return 0;
}

long long gather_block_columns(const TileConfig& c, bool vector) {
  return static_cast<long long>(c.threads()) * (vector ? 8 : 1);
}

long long gather_column_blocks(const TileConfig& c, long long hidden, bool vector) {
  const long long columns = gather_block_columns(c, vector);
  return (hidden + columns - 1) / columns;
}

}  // namespace moejit
