// fwd_up: for each token tile (one expert, up to BM sorted rows) and BN intermediate columns:
// gather the tile's x rows, multiply by the expert's gate and up rows, and apply SwiGLU to the
// fp32 accumulators. Writes act [TK, I] and, when training, pre_act [TK, 2I] = [g | u].
//
// The B tile holds 2*BN weight rows arranged so each warp's (wgmma: warpgroup's) N range is its
// gate columns followed by the up columns of the same outputs; the epilogue then pairs
// acc[.][ni] (gate) with acc[.][ni + kNi/2] (up) inside one thread. TMA (warp-specialized
// wgmma): both tiles are bulk copies. The A tile comes from x_rows, x already scattered into
// sorted order (gather_sum's scatter); its rows past the tile's expert feed only output rows
// that are not stored. The B tile comes as two boxes per warpgroup, gate and up, from W1
// viewed as [E, 2, I, H], so gate rows past I read as zeros instead of up rows.
#pragma once

#include "common/token_gemm.cuh"
#include "common/swiglu.cuh"

namespace moejit {

struct FwdUpParams {
  const void* x;       // [T, H]
  const void* x_rows;  // [TK, H] x in sorted order; TMA only
  const void* w1;      // [E, 2I, H]
  void* act;        // [TK, I] sorted rows
  void* pre_act;    // [TK, 2I] sorted rows; null in inference
  RoutingView routing;
  int32 hidden;
  int32 inter;
  TensorMap w1_map;      // TMA: W1 as [E, 2, I, H], boxes BK x kHalf
  TensorMap x_rows_map;  // TMA: x_rows as [TK, H], boxes BK x BM
  TensorMap act_map;      // TMA stores: act as [TK, I], boxes 64 x BM
  TensorMap pre_act_map;  // TMA stores: pre_act as [TK, 2, I], boxes 64 x 1 x BM; unset in inference
};

template <typename T, int BM, int BN, int BK, int STAGES, int WARPS, int WM, int GROUP_M, bool WGMMA, bool WS, bool ALIGNED, bool TMA, int CLUSTER, bool PERSISTENT>
__global__ void __launch_bounds__(GemmLaunch<WS, WARPS>::kThreads, GemmLaunch<WS, WARPS>::kMinBlocks) fwd_up_kernel(const __grid_constant__ FwdUpParams p) {
  static_assert(CLUSTER == 1 || TMA, "a cluster pair shares TMA copies");
  constexpr int kThreads = WARPS * 32;
  constexpr int kBN2 = 2 * BN;
  using Mma = GemmMma<WGMMA, WS, T, BM, kBN2, BK, WARPS, WM, true, true>;
  constexpr int kHalf = Mma::kWarpN / 2;  // gate columns per warp (warpgroup)
  static_assert(!PERSISTENT || kPersistentEligible<TMA, WS, WARPS, CLUSTER>,
                "a persistent grid of two-warpgroup TMA tiles or pairs");
  // Where the epilogue stages its output tile (run_token_gemm / run_expert_gemm).
  using Staging = typename Select<PERSISTENT, SwizzledTile<T, BM, BN>, StagedTile<T, BM, BN>>::type;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma swizzle atoms
  const GemmSmem<Mma, STAGES, PERSISTENT ? 0 : BM, PERSISTENT ? BM * BN : 0> sm(smem_raw);
  const T* x = static_cast<const T*>(p.x);
  T* pre = static_cast<T*>(p.pre_act);

  Mma mma;
  run_token_gemm<BM, BN, GROUP_M, CLUSTER, PERSISTENT, STAGES, TMA ? (Mma::ATile::kElems + Mma::BTile::kElems) * 2 : 0>(
      p.routing, p.inter, ceil_div(p.hidden, BK), mma, sm,
      [&](int stage, const TokenWork& w, int kt) {
        const int k0 = kt * BK;
        if constexpr (TMA) {
          if (tma_thread<kThreads>()) {
            tma_load_k_major<typename Mma::ATile>(sm.a_stage(stage), p.x_rows_map, sm.full(stage), k0, w.tile.row0);
            // Part 2 wn + h: warpgroup wn's gate (h = 0) or up (h = 1) rows.
            w.pair.copy_weight_tile<2 * kBN2 / Mma::kWarpN>([&](int part, uint16 mask) {
              const int wn = part / 2, h = part % 2;
              for_each_k_box<typename Mma::BTile>(
                  sm.b_stage(stage), wn * Mma::kWarpN + h * kHalf, k0, [&](T* dst, int32 k) {
                    tma_load_multicast(dst, p.w1_map, sm.full(stage), mask, k, w.n0 + wn * kHalf, h, w.tile.expert);
                  });
            });
          }
        } else {
          const T* w1 = static_cast<const T*>(p.w1) + static_cast<int64>(w.tile.expert) * 2 * p.inter * p.hidden;
          load_gathered_rows<typename Mma::ATile, Mma::kLoaders, ALIGNED>(sm.a_stage(stage), sm.rows, x, k0,
                                                                          p.hidden - k0);
          load_tile<typename Mma::BTile, Mma::kLoaders, ALIGNED>(
              sm.b_stage(stage),
              [&](int r) -> const T* {
                const int wn = r / Mma::kWarpN, within = r % Mma::kWarpN;
                const int j = w.n0 + wn * kHalf + within % kHalf;
                if (j >= p.inter) return nullptr;
                return w1 + static_cast<int64>(within < kHalf ? j : p.inter + j) * p.hidden + k0;
              },
              p.hidden - k0);
        }
      },
      [&](const TokenWork& w, const Staging& staged) {
        // Up to three [BM, BN] outputs (act, then g and u into pre_act), each staged in shared
        // memory, then stored by TMA (a persistent block's whole tiles: the MMA warps go on while
        // the copy engine drains it) or written with 16-byte stores. which: 0 act, 1 gate, 2 up.
        T* act = static_cast<T*>(p.act) + static_cast<int64>(w.tile.row0) * p.inter + w.n0;
        // One pass per output, inlined with a constant `which` so each pass keeps only its own
        // values live (a runtime loop over the three spilled at 128 x 256).
        auto write_output = [&](const int which) {
          const auto put = [&](const Staging& tile) {
#pragma unroll
            for (int mi = 0; mi < Mma::kMi; ++mi)
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                const int r = mma.row(mi, half);
#pragma unroll
                for (int ni = 0; ni < Mma::kNi / 2; ++ni) {
                  const int c = mma.col(ni) - mma.n0 / 2;  // the N range [n0, n0 + kWarpN) holds outputs n0/2 ..
                  const float g0 = mma.acc[mi][ni][2 * half], g1 = mma.acc[mi][ni][2 * half + 1];
                  const float u0 = mma.acc[mi][ni + Mma::kNi / 2][2 * half];
                  const float u1 = mma.acc[mi][ni + Mma::kNi / 2][2 * half + 1];
                  if (which == 0) tile.put(r, c, SwiGlu::act(g0, u0), SwiGlu::act(g1, u1));
                  else if (which == 1) tile.put(r, c, g0, g1);
                  else tile.put(r, c, u0, u1);
                }
              }
          };
          const int64 stride = which == 0 ? p.inter : 2 * p.inter;
          T* base = which == 0 ? act
                               : pre + static_cast<int64>(w.tile.row0) * 2 * p.inter + w.n0 + (which == 2 ? p.inter : 0);
          const auto row_dst = [&](int r) -> T* { return w.store && r < w.tile.rows ? base + r * stride : nullptr; };
          if constexpr (Staging::kTmaStore) {
            static_assert(BN % 64 == 0, "TMA stores of 64-column panels");
            store_staged_async<kThreads, ALIGNED>(
                staged, put, w.store && w.tile.rows == BM,
                [&](const Staging& tile) {
#pragma unroll
                  for (int panel = 0; panel < BN / 64; ++panel) {
                    const int32 col = w.n0 + 64 * panel;
                    if (which == 0) tma_store(p.act_map, tile.panel(panel), col, w.tile.row0);
                    else tma_store(p.pre_act_map, tile.panel(panel), col, which - 1, w.tile.row0);
                  }
                },
                row_dst, p.inter - w.n0);
          } else {
            sync_mma_threads<kThreads>();
            put(staged);
            sync_mma_threads<kThreads>();
            staged.template write<kThreads, ALIGNED>(row_dst, p.inter - w.n0);
          }
        };
        write_output(0);
        if (pre != nullptr) {
          write_output(1);
          write_output(2);
        }
      },
      [&](const TokenWork& w) {
        if constexpr (!TMA) gather_row_offsets<BM>(p.routing, w.tile, p.hidden, sm.rows);
      });
}

}  // namespace moejit
