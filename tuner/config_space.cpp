#include "tuner/config_space.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "moe/memory_layout.hpp"
#include "tuner/prune.hpp"
#include "tuner/role_traits.hpp"

namespace moejit {
namespace {

constexpr int kGroupM = 8;
// (BLOCK_K, stages): two-stage cp.async pipelines never won in measurements and, for tiles of 64
// rows and more, deeper BK=64 pipelines exceed the register and shared-memory budget, so the
// space keeps three depths there.
constexpr std::pair<int, int> kDepths[] = {{32, 3}, {32, 4}, {64, 3}};
// Token tiles under 64 rows (decode-sized T) hold a few rows per weight tile: such a role streams
// the touched experts' weights, at a rate set by the bytes each block keeps in flight, and with
// few experts touched there are few blocks. These tiles' stages are small enough to go deeper:
// session 44's retune took 35 of 75 such keys' winners from these depths (fwd_up and fwd_down up
// to 8 % faster). BK 128 x 4 won none of them but every token role's tune at T=1 itself, where
// only 8 experts' weights stream; BK 64 x 8 and BK 128 x 6 won neither and were left out.
constexpr std::pair<int, int> kStreamingDepths[] = {{64, 4}, {64, 6}, {128, 3}, {128, 4}};

// Hopper wgmma configs (sm_90a only; gated on every other device), in two pipelines; one k
// tile stays in flight in the tensor cores, so either keeps stages - 2 tiles loading.
//   multistage: every thread loads and multiplies, a block barrier per k tile; the depths that
//     fit two blocks per SM (<= 113 KB) let one block's barrier waits and epilogue overlap the
//     other's MMAs.
//   warp-specialized: a producer warpgroup refills a stage as soon as the tensor cores are done
//     with it; one MMA warpgroup runs two blocks per SM, two run one. Roles whose shape allows
//     it copy their ungathered tiles (weights, sorted rows) with TMA, which frees the
//     producer's threads for the gathered rows; the cp.async producer stays for the rest.
//     BK 128 (two 128-byte swizzle rows per tile row) at three stages, the fewest that keep a
//     tile loading: 128 x 128 tiles and smaller fit.
// Pruning drops what exceeds shared memory.
constexpr std::pair<int, int> kHopperDepths[] = {{32, 4}, {32, 6}, {64, 3}, {64, 4}, {64, 5}};
constexpr std::pair<int, int> kWarpSpecializedDepths[] = {{32, 6}, {32, 8}, {64, 3}, {64, 4}, {128, 3}};

TileConfig gemm(int bm, int bn, int bk, int stages, int warps) {
  TileConfig c;
  c.block_m = bm;
  c.block_n = bn;
  c.block_k = bk;
  c.stages = stages;
  c.warps = warps;
  c.group_m = kGroupM;
  return c;
}

TileConfig hopper(TileConfig c) {
  c.arch_tag = ArchTag::kHopper;
  return c;
}

TileConfig warp_specialized(TileConfig c, bool tma) {
  c.arch_tag = ArchTag::kHopper;
  c.warp_specialized = true;
  c.use_tma = tma;
  return c;
}

// c, and where it may run a persistent grid, c persistent too: the tuner measures both.
void push_both_grids(std::vector<TileConfig>& out, Role role, TileConfig c) {
  out.push_back(c);
  if (persistent_eligible(role, c)) {
    c.persistent = true;
    out.push_back(c);
  }
}

// Halves a tile edge while it is wider than the problem (never below the space's minimum).
int fit(int edge, long long extent, int minimum) {
  while (edge > minimum && edge > next_pow2(extent)) edge /= 2;
  return edge;
}

// A measured default is used only when it passes pruning (a wgmma or mma.sync warp layout, the
// device's shared memory, a BLOCK_K no deeper than the problem); otherwise the portable default is.
bool default_fits(Role role, const TileConfig& c, const MoeShape& shape, const cuda::DeviceInfo& device) {
  return !prune_reason(role, c, shape, device);
}

TileConfig persistent_if(TileConfig c, bool persistent) {
  c.persistent = persistent;
  return c;
}

// The first of `tiles` as wide as the problem allows that passes pruning, each tried as given and,
// where its persistent grid does not fit, as a grid of one tile per block.
std::optional<TileConfig> first_fitting(Role role, const std::vector<TileConfig>& tiles, const MoeShape& shape,
                                        const cuda::DeviceInfo& device) {
  const GemmDims d = gemm_dims(role, shape);
  for (TileConfig t : tiles) {
    if (fit(t.block_n, d.n, min_block_n(role)) != t.block_n) continue;
    if (t.persistent) {
      t.persistent = persistent_eligible(role, t);
      if (default_fits(role, t, shape, device)) return t;
      t.persistent = false;
    }
    if (default_fits(role, t, shape, device)) return t;
  }
  return std::nullopt;
}

// Hopper token GEMMs where TMA can copy, per role and token-tile height: the config whose
// geometric-mean slowdown against the winners of the H200 table's keys is least (session 45, five
// models, 10 to 66 keys each: within 2.5 % on that mean, except bwd_down's 128-row tile at 5.6 %,
// whose persistent form does not fit); for fwd_up's and bwd_dx's 64-row tiles, session 6's
// narrower one follows for problems too narrow for it.
std::vector<TileConfig> hopper_tma_defaults(Role role, int bm) {
  auto ws = [bm](int bn, int bk, int stages, int warps, bool persistent) {
    return persistent_if(warp_specialized(gemm(bm, bn, bk, stages, warps), true), persistent);
  };
  if (bm >= 128) {
    switch (role) {
      case Role::kFwdUp: return {ws(128, 64, 4, 8, true)};
      case Role::kFwdDown: return {ws(256, 64, 4, 8, true)};
      case Role::kBwdDown: return {ws(256, 64, 4, 8, false)};  // its persistent form does not fit
      default: return {ws(256, 64, 3, 8, true)};
    }
  }
  switch (role) {
    case Role::kFwdUp: return {ws(128, 64, 4, 8, false), ws(64, 64, 4, 4, false)};
    case Role::kFwdDown:
    case Role::kBwdDown: return {ws(128, 64, 4, 4, false)};
    default: return {ws(256, 64, 4, 8, false), ws(128, 32, 6, 4, false)};
  }
}

}  // namespace

int min_block_n(Role role) {
  switch (role_kind(role)) {
    case RoleKind::kTokenGemm: return role == Role::kFwdUp ? 32 : 64;
    case RoleKind::kExpertGemm: return 64;
    default: return 0;
  }
}

int min_block_m(Role role) { return role_kind(role) == RoleKind::kExpertGemm ? 64 : 0; }

std::vector<TileConfig> config_space(Role role, const MoeShape& shape) {
  std::vector<TileConfig> out;
  switch (role_kind(role)) {
    case RoleKind::kRouting:
      for (int warps : {4, 8, 16, 32}) {
        for (int items : {4, 8, 16, 32}) {
          TileConfig c;
          c.warps = warps;
          c.items = items;
          out.push_back(c);
        }
      }
      break;
    case RoleKind::kTokenGemm: {
      const int bm = token_block_m(shape);
      const int n_min = min_block_n(role);
      for (int bn : {n_min, 2 * n_min, 4 * n_min}) {
        for (auto [bk, stages] : kDepths)
          for (int warps : {4, 8}) out.push_back(gemm(bm, bn, bk, stages, warps));
        if (bm < 64) {
          for (auto [bk, stages] : kStreamingDepths)
            for (int warps : {4, 8}) out.push_back(gemm(bm, bn, bk, stages, warps));
        }
      }
      if (bm >= 64) {  // a warpgroup's MMA is 64 rows high; pruning drops what does not fit
        for (int bn : {2 * n_min, 4 * n_min}) {
          for (auto [bk, stages] : kHopperDepths)
            for (int warps : {4, 8}) {
              if (bm == 64 || warps == 8) out.push_back(hopper(gemm(bm, bn, bk, stages, warps)));
            }
          for (auto [bk, stages] : kWarpSpecializedDepths)
            for (int warps : {4, 8}) {
              push_both_grids(out, role, warp_specialized(gemm(bm, bn, bk, stages, warps), tma_eligible(role, shape)));
            }
        }
        // bwd_down's 128 x 256 tiles with an epilogue warpgroup: the loop above offers their
        // persistent forms, of which those beside a bf16 d_act fit (BK 32 x 6, BK 64 x 3); this adds
        // the depth beside which an fp32 d_act (128 KB) fits, BK 32 x 4 (role_smem_bytes).
        if (role == Role::kBwdDown && bm == 128 && tma_eligible(role, shape)) {
          push_both_grids(out, role, warp_specialized(gemm(bm, 4 * n_min, 32, 4, 8), true));
        }
        // Cluster pairs of the widest two-warpgroup TMA tiles: neighbouring m tiles of one expert
        // share the weight tile, each block copying half of it into both.
        if (bm >= 128 && tma_eligible(role, shape)) {
          for (auto [bk, stages] : kWarpSpecializedDepths) {
            if (bk > 64) continue;  // three stages of these tiles at BK 128 exceed shared memory
            TileConfig c = warp_specialized(gemm(bm, 4 * n_min, bk, stages, 8), true);
            c.cluster = 2;
            push_both_grids(out, role, c);
          }
        }
      }
      break;
    }
    case RoleKind::kExpertGemm:
      for (int bm : {64, 128})
        for (int bn : {64, 128})
          for (auto [bk, stages] : kDepths)
            for (int warps : {4, 8}) out.push_back(gemm(bm, bn, bk, stages, warps));
      for (int bn : {128, 256}) {
        for (auto [bk, stages] : kHopperDepths) out.push_back(hopper(gemm(128, bn, bk, stages, 8)));
        for (auto [bk, stages] : kWarpSpecializedDepths)
          for (int warps : {4, 8}) {
            push_both_grids(out, role, warp_specialized(gemm(128, bn, bk, stages, warps), tma_eligible(role, shape)));
          }
      }
      break;
    case RoleKind::kGather:
      for (int warps = 1; warps <= kMaxGatherWarps; warps *= 2) {
        TileConfig c;
        c.warps = warps;
        out.push_back(c);
      }
      break;
    case RoleKind::kUtility:
      out.push_back(TileConfig{});  // one module, nothing to tune
      break;
  }
  return out;
}

TileConfig default_config(Role role, const MoeShape& shape, const cuda::DeviceInfo& device, Mode mode) {
  TileConfig c;
  const GemmDims d = gemm_dims(role, shape);
  switch (role_kind(role)) {
    case RoleKind::kRouting: {
      // Chunks of 4096 pairs (16 warps x 8 items): every block of the scatter phase re-reads all
      // chunks' counts, num_chunks * (E+1) ints, which small chunks make expensive at large T.
      // Smaller problems take the widest chunk pruning keeps (none wider than the pairs padded to
      // 1024), usually a single chunk and so a single launch; many experts trade warps for items
      // (same chunk) until the per-warp counts fit shared memory.
      const long long padded = std::max<long long>(1024, (shape.pairs() + 1023) / 1024 * 1024);
      c.warps = 16;
      c.items = 8;
      while (static_cast<long long>(c.threads()) * c.items > padded) {
        if (c.items > 4) {
          c.items /= 2;
        } else {
          c.warps /= 2;
        }
      }
      while (c.warps > 4 && role_smem_bytes(role, c, shape) > device.smem_optin_per_block) {
        c.warps /= 2;
        c.items *= 2;
      }
      return c;
    }
    case RoleKind::kTokenGemm: {
      const int bm = token_block_m(shape);
      const int bn = role == Role::kFwdUp ? 64 : 128;
      if (device.is_hopper() && bm >= 64 && tma_eligible(role, shape)) {
        if (auto t = first_fitting(role, hopper_tma_defaults(role, bm), shape, device)) return *t;
      }
      // wgmma, multistage, where TMA cannot copy: the most frequent multistage winners of the
      // session 3 table. 128-row tiles: fwd_up 128 x (128 gate + 128 up), BK 64, 4 stages; the
      // other roles 128 x 128, BK 32, 6 stages. 64-row tiles: one warpgroup, BK 64, 4 stages.
      const int wg_bn = bm >= 128 ? 128 : bn;
      if (device.is_hopper() && bm >= 64 && fit(wg_bn, d.n, min_block_n(role)) == wg_bn) {
        const bool deep_k = role == Role::kFwdUp || bm < 128;
        c = hopper(gemm(bm, wg_bn, deep_k ? 64 : 32, deep_k ? 4 : 6, bm >= 128 ? 8 : 4));
        if (default_fits(role, c, shape, device)) return c;
      }
      // Token tiles under 64 rows, which have no wgmma config: per role, the config whose worst
      // slowdown against the winner of the H200 table's 16- and 32-row keys is least (session 44:
      // 3.6 to 5.2 %; the default below ran up to 1.6x slower there). Measured on the H200 only;
      // elsewhere pruning (shared memory) decides whether they run.
      if (bm < 64) {
        switch (role) {
          case Role::kFwdUp: c = gemm(bm, 32, 128, 3, 4); break;
          case Role::kFwdDown: c = gemm(bm, 128, 64, 4, 4); break;
          case Role::kBwdDown: c = gemm(bm, 128, 64, 4, 8); break;
          default: c = gemm(bm, 256, 64, 4, 8); break;
        }
        c.block_n = fit(c.block_n, d.n, min_block_n(role));
        if (default_fits(role, c, shape, device)) return c;
      }
      c = gemm(bm, bn, 32, 4, bm >= 128 ? 8 : 4);
      c.block_n = fit(c.block_n, d.n, min_block_n(role));
      return c;
    }
    case RoleKind::kExpertGemm: {
      // Where TMA copies on Hopper: per token-tile height, the persistent two-warpgroup tile whose
      // geometric-mean slowdown against the winners of the H200 table's 58 keys per role (five
      // models) is about least, with a small worst case (session 45): 128 x 256, BK 64 x 4 where
      // experts get 64 rows or more (1-3 % on that mean, at most 11 %), 128 x 128, BK 64 x 3
      // below (0.2-2.6 %, at most 6 %). Session 6's one-warpgroup 128 x 128 tiles, which these
      // replace, ran 1.34-1.57x slower on that mean, up to 1.9x: they were picked before
      // persistent dW grids and their two-warpgroup tiles existed.
      // Without TMA (session 4): multistage 128 x 256, BK 64, 4 stages when experts get 128 rows
      // or more, else 128 x 128, BK 32, 4 stages. The memory-efficient bwd_dw2 (recomputed
      // activation) wins the warp-specialized TMA config only below 32 tokens per expert; with
      // more, where it runs ~1.7x faster, mma.sync 128 x 64, BK 64, 3 stages, 8 warps (its most
      // frequent winner).
      const bool recomputed_b = role == Role::kBwdDw2 && memeff_recomputes_act(shape, mode);
      if (device.is_hopper() && d.m >= 128 && d.n >= 128 && !(recomputed_b && token_block_m(shape) >= 64)) {
        if (tma_eligible(role, shape)) {
          std::vector<TileConfig> tiles = {persistent_if(warp_specialized(gemm(128, 128, 64, 3, 8), true), true)};
          if (token_block_m(shape) >= 64) {
            tiles.insert(tiles.begin(), persistent_if(warp_specialized(gemm(128, 256, 64, 4, 8), true), true));
          }
          if (auto t = first_fitting(role, tiles, shape, device)) return *t;
        } else {
          const bool long_k = token_block_m(shape) >= 128;
          c = long_k && d.n >= 256 ? hopper(gemm(128, 256, 64, 4, 8)) : hopper(gemm(128, 128, 32, 4, 8));
          if (default_fits(role, c, shape, device)) return c;
        }
      }
      c = device.is_hopper() && recomputed_b ? gemm(128, 64, 64, 3, 8) : gemm(128, 128, 32, 3, 8);
      c.block_m = fit(c.block_m, d.m, min_block_m(role));
      c.block_n = fit(c.block_n, d.n, min_block_n(role));
      return c;
    }
    case RoleKind::kGather:
      // About 256 hidden columns per warp (8 per thread), up to 4 warps.
      c.warps = static_cast<int>(std::min<long long>(4, next_pow2((shape.hidden + 255) / 256)));
      // More warps where 4 warps' blocks would not fit a grid's rows (H past 8.4 M, 67 M on the
      // vector path).
      while (c.warps < kMaxGatherWarps &&
             gather_column_blocks(c, shape.hidden, shape.vector_aligned()) > kMaxGatherColumnBlocks) {
        c.warps *= 2;
      }
      return c;
    case RoleKind::kUtility:
      return c;
  }
  return c;
}

}  // namespace moejit
