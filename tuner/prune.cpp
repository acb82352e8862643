#include "tuner/prune.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "moe/routing_layout.hpp"
#include "tuner/config_space.hpp"
#include "tuner/gating.hpp"
#include "tuner/role_traits.hpp"

namespace moejit {
namespace {

constexpr int kMaxAccumulators = 128;  // fp32 registers per thread before ptxas starts spilling

std::optional<std::string> gemm_reason(Role role, const TileConfig& c, const MoeShape& shape) {
  // Routing cuts each expert's rows into tiles of this height, which every token GEMM must take.
  if (role_kind(role) == RoleKind::kTokenGemm && c.block_m != token_block_m(shape)) {
    return fmt::format("BLOCK_M {} is not the problem's token tile of {} rows", c.block_m, token_block_m(shape));
  }
  if (gemm_warp_rows(role, c) == 0) {
    return fmt::format("{}x{} tile does not split into 16x16-multiple warp tiles over {} warps", c.block_m,
                       gemm_tile_n(role, c), c.warps);
  }
  if (const int acc = gemm_accumulators(role, c); acc > kMaxAccumulators) {
    return fmt::format("{} fp32 accumulators per thread (more than {} would spill)", acc, kMaxAccumulators);
  }
  // ptxas checks each wgmma against the registers of the launch: a warp-specialized
  // one-warpgroup block runs two per SM at 128 registers per thread, too few for a 64x256
  // instruction's accumulators.
  if (c.warp_specialized && c.warps == 4 && gemm_wgmma_n(role, c) > 128) {
    return fmt::format("a 64x{} wgmma needs more than the 128 registers of a two-blocks-per-SM launch",
                       gemm_wgmma_n(role, c));
  }
  if (c.use_tma && !c.warp_specialized) {
    return std::string("TMA copies complete on the warp-specialized pipeline's barriers");
  }
  if (c.use_tma && !tma_eligible(role, shape)) {
    return fmt::format("{} copies no tile with TMA here (H and I multiples of 8)", role_name(role));
  }
  if (c.cluster != 1 && (c.cluster != 2 || !c.use_tma || role_kind(role) != RoleKind::kTokenGemm)) {
    return fmt::format("clusters of {}: only pairs, of token GEMM blocks sharing TMA copies of the weight tile",
                       c.cluster);
  }
  if (c.persistent && !persistent_eligible(role, c)) {
    return std::string(
        "persistent grids are for two-warpgroup TMA tiles and cluster pairs (bwd_down's pairs: up to 128 columns)");
  }
  // A one-tile bwd_down block copies the tile's g and u into its stages once the main loop is
  // done (templates/bwd_down.cuh).
  if (role == Role::kBwdDown && c.use_tma && !persistent_grid(role, c) &&
      4LL * c.block_m * c.block_n > 2LL * c.stages * (c.block_m + c.block_n) * c.block_k) {
    return fmt::format("g and u ({} B) do not fit the stages", 4LL * c.block_m * c.block_n);
  }
  const GemmDims d = gemm_dims(role, shape);
  if (c.block_n > std::max<long long>(next_pow2(d.n), min_block_n(role))) {
    return fmt::format("BLOCK_N {} is wider than the padded problem (N = {})", c.block_n, d.n);
  }
  if (role_kind(role) == RoleKind::kExpertGemm &&
      c.block_m > std::max<long long>(next_pow2(d.m), min_block_m(role))) {
    return fmt::format("BLOCK_M {} is wider than the padded problem (M = {})", c.block_m, d.m);
  }
  if (role_kind(role) == RoleKind::kTokenGemm && c.block_k > std::max<long long>(next_pow2(d.k), 32)) {
    return fmt::format("BLOCK_K {} is deeper than the padded problem (K = {})", c.block_k, d.k);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> prune_reason(Role role, const TileConfig& c, const MoeShape& shape,
                                        const cuda::DeviceInfo& device) {
  const RoleKind kind = role_kind(role);
  // Before any arithmetic on them (an override or an edited table may carry anything).
  if ((kind == RoleKind::kTokenGemm || kind == RoleKind::kExpertGemm) &&
      std::min({c.block_m, c.block_n, c.block_k, c.stages, c.warps, c.group_m}) <= 0) {
    return std::string("a GEMM's tile sizes, stages, warps and GROUP_M must be positive");
  }
  if (c.warps <= 0 || c.warps > 32) return fmt::format("{} warps: a block has 1 to 32", c.warps);
  if (auto why = arch_gate_reason(c, device)) return *why;
  if (role_block_threads(role, c) > device.max_threads_per_block) {
    return fmt::format("{} threads per block exceed the device's {}", role_block_threads(role, c),
                       device.max_threads_per_block);
  }
  if (kind == RoleKind::kTokenGemm || kind == RoleKind::kExpertGemm) {
    if (auto why = gemm_reason(role, c, shape)) return why;
  }
  const long long smem = role_smem_bytes(role, c, shape);
  if (smem > device.smem_optin_per_block) {
    return fmt::format("needs {} B of shared memory; {} allows {} B per block", smem, device.arch(),
                       device.smem_optin_per_block);
  }
  if (kind == RoleKind::kRouting) {
    // Padding to 1024 pairs keeps the smallest chunks legal for every problem.
    const long long padded = std::max<long long>(1024, (shape.pairs() + 1023) / 1024 * 1024);
    const long long chunk = static_cast<long long>(c.threads()) * c.items;
    if (chunk < kRoutingMinChunk) {
      return fmt::format("chunk of {} pairs is below the routing workspace's minimum of {}", chunk, kRoutingMinChunk);
    }
    if (chunk > padded) {
      return fmt::format("chunk of {} pairs is wider than the padded problem ({} pairs)", chunk, padded);
    }
  }
  if (kind == RoleKind::kGather) {
    // Hidden columns per block: 8 per thread on the vector path; more threads than that idle.
    const long long cols = gather_block_columns(c, true);
    if (c.warps > 1 && cols / 2 >= std::max<long long>(shape.hidden, 256)) {
      return fmt::format("{} threads cover {} columns; hidden size is {}", c.threads(), cols, shape.hidden);
    }
    if (const long long blocks = gather_column_blocks(c, shape.hidden, shape.vector_aligned());
        blocks > kMaxGatherColumnBlocks) {
      return fmt::format("{} blocks per row of H = {}; a grid holds at most {}", blocks, shape.hidden,
                         kMaxGatherColumnBlocks);
    }
  }
  return std::nullopt;
}

std::vector<PruneDecision> prune_space(Role role, const MoeShape& shape, const cuda::DeviceInfo& device) {
  std::vector<PruneDecision> out;
  for (const TileConfig& c : config_space(role, shape)) out.push_back({c, prune_reason(role, c, shape, device)});
  return out;
}

constexpr std::string_view kFirstCallExclusion =
    "outside the first call's space (TMA warp-specialized configs only; moejit tune times all)";
constexpr std::string_view kFirstCallShallowExclusion =
    "outside the first call's space (small token tiles: BK 64 and deeper; moejit tune times all)";

std::optional<std::string> first_call_exclusion(const TileConfig& config, const std::vector<PruneDecision>& space) {
  const auto legal_where = [&](auto pred) {
    return std::any_of(space.begin(), space.end(), [&](const PruneDecision& d) { return !d.reason && pred(d.config); });
  };
  const auto tma_ws = [](const TileConfig& c) { return c.use_tma && c.warp_specialized; };
  if (tma_ws(config)) return std::nullopt;
  if (legal_where(tma_ws)) return std::string(kFirstCallExclusion);
  // Token GEMM tiles under 64 rows: expert GEMM tiles are 64 rows or more, routing's and
  // gather_sum's configs have no BLOCK_K.
  const auto small_token_tile = [](const TileConfig& c) { return c.block_k > 0 && c.block_m < 64; };
  const auto deep = [&](const TileConfig& c) { return small_token_tile(c) && c.block_k >= 64; };
  if (small_token_tile(config) && !deep(config) && legal_where(deep)) return std::string(kFirstCallShallowExclusion);
  return std::nullopt;
}

constexpr std::string_view kBudgetSkip = "skipped: tuning budget";

std::string budget_skip_reason(double budget_s) {
  return fmt::format("{} of {:.0f} s spent", kBudgetSkip, budget_s);
}

bool tuned_partly(const db::TuningRow& row, const MoeShape& shape) {
  const std::vector<TileConfig> space = config_space(row.key.role, shape);
  return std::any_of(row.candidates.begin(), row.candidates.end(), [&](const db::CandidateResult& c) {
    return c.rejected &&
           (c.reason == kFirstCallExclusion || c.reason == kFirstCallShallowExclusion ||
            c.reason.starts_with(kBudgetSkip)) &&
           std::find(space.begin(), space.end(), c.config) != space.end();
  });
}

bool winner_legal(const db::TuningRow& row, const MoeShape& shape, const cuda::DeviceInfo& device) {
  if (prune_reason(row.key.role, row.winner, shape, device)) return false;
  const std::vector<TileConfig> space = config_space(row.key.role, shape);
  return std::find(space.begin(), space.end(), row.winner) != space.end();
}

}  // namespace moejit
