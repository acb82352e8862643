// fwd_down: Y = act . W2[e]^T for each token tile and BN hidden columns. act is already in
// sorted order (no gather); Y [TK, H] is unweighted: gather_sum applies the router scores.
// TMA (warp-specialized wgmma): both tiles are bulk copies; the act rows a tile holds past its
// expert's end belong to the next expert and feed only output rows that are not stored.
#pragma once

#include "common/token_gemm.cuh"

namespace moejit {

struct FwdDownParams {
  const void* act;  // [TK, I]
  const void* w2;   // [E, H, I]
  void* y;          // [TK, H]
  RoutingView routing;
  int32 hidden;
  int32 inter;
  TensorMap act_map;  // TMA: act as [TK, I], boxes BK x BM
  TensorMap w2_map;   // TMA: W2 as [E, H, I], boxes BK x (BN / CLUSTER) x 1
  TensorMap y_map;    // TMA: Y as [TK, H], boxes 64 x BM (persistent grids' stores)
};

template <typename T, int BM, int BN, int BK, int STAGES, int WARPS, int WM, int GROUP_M, bool WGMMA, bool WS, bool ALIGNED, bool TMA, int CLUSTER, bool PERSISTENT>
__global__ void __launch_bounds__(GemmLaunch<WS, WARPS>::kThreads, GemmLaunch<WS, WARPS>::kMinBlocks) fwd_down_kernel(const __grid_constant__ FwdDownParams p) {
  static_assert(CLUSTER == 1 || TMA, "a cluster pair shares TMA copies");
  constexpr int kThreads = WARPS * 32;
  using Mma = GemmMma<WGMMA, WS, T, BM, BN, BK, WARPS, WM, true, true>;
  static_assert(!PERSISTENT || kPersistentEligible<TMA, WS, WARPS, CLUSTER>,
                "a persistent grid of two-warpgroup TMA tiles or pairs");
  // Where the epilogue stages its output tile (run_token_gemm / run_expert_gemm).
  using Staging = typename Select<PERSISTENT, PersistentStaging<Mma, STAGES, BM, BN>, StagedTile<T, BM, BN>>::type;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma swizzle atoms
  const GemmSmem<Mma, STAGES, PERSISTENT ? 0 : BM, PERSISTENT ? PersistentStaging<Mma, STAGES, BM, BN>::kElems : 0> sm(smem_raw);

  Mma mma;
  // The copying (non-TMA) configs' tile bases, set once per tile (prologue, one-tile blocks
  // only): recomputed per k tile, while a wgmma group is in flight, they made ptxas serialize
  // the multistage loop (C7515).
  const T* act = nullptr;
  const T* w2 = nullptr;
  run_token_gemm<BM, BN, GROUP_M, CLUSTER, PERSISTENT, STAGES, TMA ? (Mma::ATile::kElems + Mma::BTile::kElems) * 2 : 0, true>(
      p.routing, p.hidden, ceil_div(p.inter, BK), mma, sm,
      [&](int stage, const TokenWork& w, int kt) {
        const int k0 = kt * BK;
        if constexpr (TMA) {
          if (tma_thread<kThreads>()) {
            tma_load_k_major<typename Mma::ATile>(sm.a_stage(stage), p.act_map, sm.full(stage), k0, w.tile.row0);
            // W2's tile as CLUSTER parts of BN / CLUSTER rows.
            w.pair.copy_weight_tile<CLUSTER>([&](int part, uint16 mask) {
              constexpr int kRows = BN / CLUSTER;
              for_each_k_box<typename Mma::BTile>(sm.b_stage(stage), part * kRows, k0, [&](T* dst, int32 k) {
                tma_load_multicast(dst, p.w2_map, sm.full(stage), mask, k, w.n0 + part * kRows, w.tile.expert);
              });
            });
          }
        } else {
          load_tile<typename Mma::ATile, Mma::kLoaders, ALIGNED>(
              sm.a_stage(stage),
              [&](int r) -> const T* { return r < w.tile.rows ? act + static_cast<int64>(r) * p.inter + k0 : nullptr; },
              p.inter - k0);
          load_tile<typename Mma::BTile, Mma::kLoaders, ALIGNED>(
              sm.b_stage(stage),
              [&](int r) -> const T* { return w.n0 + r < p.hidden ? w2 + static_cast<int64>(r) * p.inter + k0 : nullptr; },
              p.inter - k0);
        }
      },
      [&](const TokenWork& w, const Staging& staged) {
        store_token_tile<kThreads, ALIGNED>(staged, mma, w, p.y_map, static_cast<T*>(p.y), p.hidden);
      },
      [&](const TokenWork& w) {
        act = static_cast<const T*>(p.act) + static_cast<int64>(w.tile.row0) * p.inter;
        w2 = static_cast<const T*>(p.w2) + (static_cast<int64>(w.tile.expert) * p.hidden + w.n0) * p.inter;
      });
}

}  // namespace moejit
