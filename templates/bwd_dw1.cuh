// bwd_dw1: dW1[e] = d_pre_act[rows of e]^T . x[gathered rows of e], expert-major like bwd_dw2:
// each block owns a BM x BN tile of one expert's [2I, H] gradient and loops over the expert's
// rows. Experts without rows write zeros. TMA (warp-specialized wgmma): both tiles are 64-column
// panels, of d_pre_act as [TK, 2I] and of x_rows, x already scattered into sorted order
// (gather_sum's scatter); in an expert's last k tile the rows past its end (another expert's,
// or never written) are zeroed before the MMAs read them.
#pragma once

#include "common/expert_gemm.cuh"

namespace moejit {

struct BwdDw1Params {
  const void* d_pre_act;  // [TK, 2I]
  const void* x;          // [T, H]
  const void* x_rows;     // [TK, H] x in sorted order; TMA only
  void* dw1;              // [E, 2I, H]
  RoutingView routing;
  int32 hidden;
  int32 inter;
  TensorMap d_pre_act_map;  // TMA: d_pre_act as [TK, 2I], boxes 64 x BK
  TensorMap x_rows_map;     // TMA: x_rows as [TK, H], boxes 64 x BK
  TensorMap dw1_map;        // TMA: dW1 as [E, 2I, H], boxes 64 x a warpgroup's rows x 1 (persistent stores)
};

template <typename T, int BM, int BN, int BK, int STAGES, int WARPS, int WM, int GROUP_M, bool WGMMA, bool WS, bool ALIGNED, bool TMA, int CLUSTER, bool PERSISTENT>
__global__ void __launch_bounds__(GemmLaunch<WS, WARPS>::kThreads, GemmLaunch<WS, WARPS>::kMinBlocks) bwd_dw1_kernel(const __grid_constant__ BwdDw1Params p) {
  static_assert(CLUSTER == 1, "expert GEMMs run without clusters");
  constexpr int kThreads = WARPS * 32;
  using Mma = GemmMma<WGMMA, WS, T, BM, BN, BK, WARPS, WM, false, false>;
  static_assert(!PERSISTENT || kPersistentEligible<TMA, WS, WARPS, CLUSTER>,
                "a persistent grid of two-warpgroup TMA tiles or pairs");
  // Where the epilogue stages its output tile (run_token_gemm / run_expert_gemm).
  using Staging = typename Select<PERSISTENT, PersistentStaging<Mma, STAGES, BM, BN>, StagedTile<T, BM, BN>>::type;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma swizzle atoms
  const GemmSmem<Mma, STAGES, PERSISTENT ? 0 : BK, PERSISTENT ? PersistentStaging<Mma, STAGES, BM, BN>::kElems : 0> sm(smem_raw);  // rows: the 2 * BK int32 token ring
  const int m_total = 2 * p.inter;

  KRowTokens<BK, Mma::kLoaders> tokens{p.routing, 0, 0, reinterpret_cast<int32*>(sm.rows)};
  Mma mma;
  // The copying (non-TMA) configs' tile bases, set once per tile (prologue, one-tile blocks
  // only): recomputed per k tile, while a wgmma group is in flight, they made ptxas serialize
  // the multistage loop (C7515).
  const T* dpre = nullptr;
  const T* x = nullptr;
  run_expert_gemm<BM, BN, BK, GROUP_M, PERSISTENT, STAGES, TMA ? (Mma::ATile::kElems + Mma::BTile::kElems) * 2 : 0>(
      p.routing, m_total, p.hidden, mma, sm,
      [&](int stage, const ExpertBlock& blk, int kt) {
        const int32 k0 = blk.r_begin + kt * BK;
        if constexpr (TMA) {
          if (tma_thread<kThreads>()) {
            tma_load_panels<typename Mma::ATile>(sm.a_stage(stage), p.d_pre_act_map, sm.full(stage), blk.m0, k0);
            tma_load_panels<typename Mma::BTile>(sm.b_stage(stage), p.x_rows_map, sm.full(stage), blk.n0, k0);
          }
        } else {
          tokens.begin(kt);
          load_tile<typename Mma::ATile, Mma::kLoaders, ALIGNED>(
              sm.a_stage(stage),
              [&](int r) -> const T* {
                // 2I from the parameters, not m_total: a register held across the loop for it made
                // ptxas serialize the multistage wgmmas (C7515).
                return k0 + r < blk.r_end ? dpre + static_cast<int64>(k0 + r) * (2 * p.inter) : nullptr;
              },
              2 * p.inter - blk.m0);
          tokens.template load_rows<typename Mma::BTile, ALIGNED>(sm.b_stage(stage), x, p.hidden, p.hidden - blk.n0);
          tokens.end(kt);
        }
      },
      [&](int stage, const ExpertBlock& blk, int kt) {
        return !TMA ? kWholeKTile
                    : expert_tail_rows<BK, typename Mma::ATile, typename Mma::BTile, ExpertTeam<PERSISTENT, kThreads>>(
                          sm.a_stage(stage), sm.b_stage(stage), blk.r_end - (blk.r_begin + kt * BK));
      },
      [&](const ExpertBlock& blk, const Staging& staged) {
        store_expert_tile<kThreads, ALIGNED>(staged, mma, blk, p.dw1_map, static_cast<T*>(p.dw1), m_total, p.hidden);
      },
      [&](const ExpertBlock& blk) {
        tokens.r_begin = blk.r_begin;
        tokens.r_end = blk.r_end;
        dpre = static_cast<const T*>(p.d_pre_act) + blk.m0;
        x = static_cast<const T*>(p.x) + blk.n0;
      });
}

}  // namespace moejit
