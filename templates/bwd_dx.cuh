// bwd_dx: dx of each (token, slot) = d_pre_act . W1[e] as one GEMM over K = 2I (gate and up
// gradients together), for each token tile and BN hidden columns. The per-slot rows [TK, H]
// are then summed per token by gather_sum (unweighted: s is already folded into d_pre_act).
#pragma once

#include "common/gemm.cuh"
#include "common/moe_tiles.cuh"

namespace moejit {

struct BwdDxParams {
  const void* d_pre_act;  // [TK, 2I]
  const void* w1;         // [E, 2I, H]
  void* dx_rows;          // [TK, H]
  RoutingView routing;
  int32 hidden;
  int32 inter;
};

template <typename T, int BM, int BN, int BK, int STAGES, int WARPS, int WM, int GROUP_M, bool WGMMA, bool WS, bool ALIGNED>
__global__ void __launch_bounds__(GemmLaunch<WS, WARPS>::kThreads, GemmLaunch<WS, WARPS>::kMinBlocks) bwd_dx_kernel(const __grid_constant__ BwdDxParams p) {
  constexpr int kThreads = WARPS * 32;
  using Mma = GemmMma<WGMMA, WS, T, BM, BN, BK, WARPS, WM, true, false>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma swizzle atoms
  const GemmSmem<Mma, STAGES, BM> sm(smem_raw);

  int64 m, n;
  grouped_tile(blockIdx.x, p.routing.max_tiles, ceil_div(p.hidden, BN), GROUP_M, m, n);
  TokenTile tile;
  if (!token_tile<BM>(p.routing, m, tile)) return;

  const int k_total = 2 * p.inter;
  const T* dpre = static_cast<const T*>(p.d_pre_act) + static_cast<int64>(tile.row0) * k_total;
  const int n0 = static_cast<int>(n) * BN;
  const T* w1 = static_cast<const T*>(p.w1) + static_cast<int64>(tile.expert) * k_total * p.hidden + n0;

  Mma mma;
  const bool mma_thread = gemm_main_loop<STAGES>(
      mma, sm.a, sm.b, sm.barriers, ceil_div(k_total, BK),
      [&](int stage, int kt) {
        const int k0 = kt * BK;
        load_tile<typename Mma::ATile, Mma::kLoaders, ALIGNED>(
            sm.a + stage * Mma::ATile::kElems,
            [&](int r) -> const T* { return r < tile.rows ? dpre + static_cast<int64>(r) * k_total + k0 : nullptr; },
            k_total - k0);
        // W1[e] read as [K = 2I][N = H]: tile row r is W1 row k0 + r.
        load_tile<typename Mma::BTile, Mma::kLoaders, ALIGNED>(
            sm.b + stage * Mma::BTile::kElems,
            [&](int r) -> const T* { return k0 + r < k_total ? w1 + static_cast<int64>(k0 + r) * p.hidden : nullptr; },
            p.hidden - n0);
      });
  if (!mma_thread) return;

  T* out = static_cast<T*>(p.dx_rows) + static_cast<int64>(tile.row0) * p.hidden + n0;
  static_assert(StagedTile<T, BM, BN>::kBytes <= STAGES * (Mma::ATile::kElems + Mma::BTile::kElems) * 2,
                "the output tile is staged in the pipeline's shared memory");
  store_accumulators<T, BM, BN, kThreads, ALIGNED>(
      smem_raw, mma,
      [&](int r) -> T* { return r < tile.rows ? out + static_cast<int64>(r) * p.hidden : nullptr; }, p.hidden - n0);
}

}  // namespace moejit
