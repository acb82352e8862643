// bwd_dx: dx of each (token, slot) = d_pre_act . W1[e] as one GEMM over K = 2I (gate and up
// gradients together), for each token tile and BN hidden columns. The per-slot rows [TK, H]
// are then summed per token by gather_sum (unweighted: s is already folded into d_pre_act).
// TMA (warp-specialized wgmma): d_pre_act tiles are bulk copies (rows past the tile's expert feed
// only output rows that are not stored) and W1 tiles 64-column panels of W1 as [E, 2I, H].
#pragma once

#include "common/token_gemm.cuh"

namespace moejit {

struct BwdDxParams {
  const void* d_pre_act;  // [TK, 2I]
  const void* w1;         // [E, 2I, H]
  void* dx_rows;          // [TK, H]
  RoutingView routing;
  int32 hidden;
  int32 inter;
  TensorMap d_pre_act_map;  // TMA: d_pre_act as [TK, 2I], boxes BK x BM
  TensorMap w1_map;         // TMA: W1 as [E, 2I, H], boxes 64 x BK x 1
  TensorMap dx_rows_map;    // TMA: dx_rows as [TK, H], boxes 64 x BM (persistent grids' stores)
};

template <typename T, int BM, int BN, int BK, int STAGES, int WARPS, int WM, int GROUP_M, bool WGMMA, bool WS, bool ALIGNED, bool TMA, int CLUSTER, bool PERSISTENT>
__global__ void __launch_bounds__(GemmLaunch<WS, WARPS>::kThreads, GemmLaunch<WS, WARPS>::kMinBlocks) bwd_dx_kernel(const __grid_constant__ BwdDxParams p) {
  static_assert(CLUSTER == 1 || TMA, "a cluster pair shares TMA copies");
  constexpr int kThreads = WARPS * 32;
  using Mma = GemmMma<WGMMA, WS, T, BM, BN, BK, WARPS, WM, true, false>;
  static_assert(!PERSISTENT || kPersistentEligible<TMA, WS, WARPS, CLUSTER>,
                "a persistent grid of two-warpgroup TMA tiles or pairs");
  // Where the epilogue stages its output tile (run_token_gemm / run_expert_gemm).
  using Staging = typename Select<PERSISTENT, PersistentStaging<Mma, STAGES, BM, BN>, StagedTile<T, BM, BN>>::type;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma swizzle atoms
  const GemmSmem<Mma, STAGES, PERSISTENT ? 0 : BM, PERSISTENT ? PersistentStaging<Mma, STAGES, BM, BN>::kElems : 0> sm(smem_raw);
  const int k_total = 2 * p.inter;

  Mma mma;
  // The copying (non-TMA) configs' tile bases, set once per tile (prologue, one-tile blocks
  // only): recomputed per k tile, while a wgmma group is in flight, they made ptxas serialize
  // the multistage loop (C7515).
  const T* dpre = nullptr;
  const T* w1 = nullptr;
  run_token_gemm<BM, BN, GROUP_M, CLUSTER, PERSISTENT, STAGES, TMA ? (Mma::ATile::kElems + Mma::BTile::kElems) * 2 : 0, true>(
      p.routing, p.hidden, ceil_div(k_total, BK), mma, sm,
      [&](int stage, const TokenWork& w, int kt) {
        const int k0 = kt * BK;
        // W1[e] read as [K = 2I][N = H]: tile row r is W1 row k0 + r.
        if constexpr (TMA) {
          if (tma_thread<kThreads>()) {
            tma_load_k_major<typename Mma::ATile>(sm.a_stage(stage), p.d_pre_act_map, sm.full(stage), k0, w.tile.row0);
            using BTile = typename Mma::BTile;
            w.pair.copy_weight_tile<BN / 64>([&](int panel, uint16 mask) {
              tma_load_multicast(sm.b_stage(stage) + panel * BTile::kPanelElems, p.w1_map, sm.full(stage), mask,
                                 w.n0 + 64 * panel, k0, w.tile.expert);
            });
          }
        } else {
          load_tile<typename Mma::ATile, Mma::kLoaders, ALIGNED>(
              sm.a_stage(stage),
              [&](int r) -> const T* { return r < w.tile.rows ? dpre + static_cast<int64>(r) * k_total + k0 : nullptr; },
              k_total - k0);
          load_tile<typename Mma::BTile, Mma::kLoaders, ALIGNED>(
              sm.b_stage(stage),
              [&](int r) -> const T* { return k0 + r < k_total ? w1 + static_cast<int64>(k0 + r) * p.hidden : nullptr; },
              p.hidden - w.n0);
        }
      },
      [&](const TokenWork& w, const Staging& staged) {
        store_token_tile<kThreads, ALIGNED>(staged, mma, w, p.dx_rows_map, static_cast<T*>(p.dx_rows), p.hidden);
      },
      [&](const TokenWork& w) {
        dpre = static_cast<const T*>(p.d_pre_act) + static_cast<int64>(w.tile.row0) * k_total;
        w1 = static_cast<const T*>(p.w1) + static_cast<int64>(w.tile.expert) * k_total * p.hidden + w.n0;
      });
}

}  // namespace moejit
