// bwd_dw1: dW1[e] = d_pre_act[rows of e]^T . x[gathered rows of e], expert-major like bwd_dw2:
// each block owns a BM x BN tile of one expert's [2I, H] gradient and loops over the expert's
// rows. Experts without rows write zeros. TMA (warp-specialized wgmma): both tiles are 64-column
// panels, of d_pre_act as [TK, 2I] and of x_rows, x already scattered into sorted order
// (gather_sum's scatter); in an expert's last k tile the rows past its end (another expert's,
// or never written) are zeroed before the MMAs read them.
#pragma once

#include "common/gemm.cuh"
#include "common/moe_tiles.cuh"

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
};

template <typename T, int BM, int BN, int BK, int STAGES, int WARPS, int WM, int GROUP_M, bool WGMMA, bool WS, bool ALIGNED, bool TMA, int CLUSTER>
__global__ void __launch_bounds__(GemmLaunch<WS, WARPS>::kThreads, GemmLaunch<WS, WARPS>::kMinBlocks) bwd_dw1_kernel(const __grid_constant__ BwdDw1Params p) {
  static_assert(CLUSTER == 1, "expert GEMMs run without clusters");
  constexpr int kThreads = WARPS * 32;
  using Mma = GemmMma<WGMMA, WS, T, BM, BN, BK, WARPS, WM, false, false>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma swizzle atoms
  const GemmSmem<Mma, STAGES, BK> sm(smem_raw);  // rows: the 2 * BK int32 token ring

  const int m_total = 2 * p.inter;
  const ExpertBlock blk = expert_block<BM, BN, GROUP_M>(p.routing, m_total, p.hidden);
  const int32 e = blk.expert, r_begin = blk.r_begin, r_end = blk.r_end;
  const int m0 = blk.m0, n0 = blk.n0;
  const T* dpre = static_cast<const T*>(p.d_pre_act) + m0;
  const T* x = static_cast<const T*>(p.x) + n0;

  KRowTokens<BK, Mma::kLoaders> tokens{p.routing, r_begin, r_end, reinterpret_cast<int32*>(sm.rows)};
  Mma mma;
  const bool mma_thread = gemm_main_loop<STAGES, TMA ? (Mma::ATile::kElems + Mma::BTile::kElems) * 2 : 0>(
      mma, sm.a, sm.b, sm.barriers, ceil_div(r_end - r_begin, BK),
      [&](int stage, int kt) {
        const int32 k0 = r_begin + kt * BK;
        if constexpr (TMA) {
          if (tma_thread<kThreads>()) {
            tma_load_panels<typename Mma::ATile>(sm.a_stage(stage), p.d_pre_act_map, sm.full(stage), m0, k0);
            tma_load_panels<typename Mma::BTile>(sm.b_stage(stage), p.x_rows_map, sm.full(stage), n0, k0);
          }
        } else {
          tokens.begin(kt);
          load_tile<typename Mma::ATile, Mma::kLoaders, ALIGNED>(
              sm.a_stage(stage),
              [&](int r) -> const T* { return k0 + r < r_end ? dpre + static_cast<int64>(k0 + r) * m_total : nullptr; },
              m_total - m0);
          tokens.template load_rows<typename Mma::BTile, ALIGNED>(sm.b_stage(stage), x, p.hidden, p.hidden - n0);
          tokens.end(kt);
        }
      },
      [&](int stage, int kt) {
        const int32 rows = r_end - (r_begin + kt * BK);
        if (TMA && rows < BK) {
          zero_panel_rows<typename Mma::ATile, kThreads>(sm.a_stage(stage), rows);
          zero_panel_rows<typename Mma::BTile, kThreads>(sm.b_stage(stage), rows);
        }
      });
  if (!mma_thread) return;

  T* out = static_cast<T*>(p.dw1) + (static_cast<int64>(e) * m_total + m0) * p.hidden + n0;
  sm.template store<BM, BN, ALIGNED>(
      mma, [&](int r) -> T* { return m0 + r < m_total ? out + static_cast<int64>(r) * p.hidden : nullptr; },
      p.hidden - n0);
}

}  // namespace moejit
