// bwd_dw2: dW2[e] = dO[gathered rows of e]^T . weighted_act[rows of e], expert-major: each
// block owns a BM x BN tile of one expert's [H, I] gradient and loops over that expert's rows
// (the K dimension). Experts without rows run no iterations and write zeros, so dW2 is never
// pre-zeroed. FUSED_ACT (memory-efficient mode) recomputes s * silu(g) * u from the saved
// pre-activations while filling the B tile instead of reading a weighted-activation buffer.
// TMA (warp-specialized wgmma): the A tile is 64-column panels of d_out_rows, dO already
// scattered into sorted order (gather_sum's scatter), and, without FUSED_ACT, the B tile
// 64-column panels of weighted_act; in an expert's last k tile the rows past its end are
// zeroed before the MMAs read them.
// A launch may cover some experts alone (the memory-efficient backward's chunks): routing then
// views them as experts 0 .. routing.experts - 1 and dw2 starts at the first, and weighted_act
// holds their rows from the first one's on (weighted_act_rows of them; rows past it read as
// zeros). It may also cover columns n_begin .. n_end - 1 of I alone (column chunks, n_begin a
// multiple of BN), whose weighted activation is then all weighted_act holds, rows wact_ld apart.
#pragma once

#include "common/expert_gemm.cuh"
#include "common/swiglu.cuh"

namespace moejit {

struct BwdDw2Params {
  const void* d_out;         // [T, H]
  const void* d_out_rows;    // [TK, H] dO in sorted order; TMA only
  const void* weighted_act;  // [TK, I]; unused with FUSED_ACT
  const void* pre_act;       // [TK, 2I]; FUSED_ACT only
  const void* scores;        // [T, K]; FUSED_ACT only
  void* dw2;                 // [E, H, I]
  RoutingView routing;
  int32 hidden;
  int32 inter;
  TensorMap d_out_rows_map;    // TMA: d_out_rows as [TK, H], boxes 64 x BK
  TensorMap weighted_act_map;  // TMA without FUSED_ACT: weighted_act as [weighted_act_rows, I], boxes 64 x BK
  TensorMap dw2_map;           // TMA: dW2 as [E, H, I], boxes 64 x a warpgroup's rows x 1 (persistent stores)
  int32 weighted_act_rows;     // weighted_act's rows, from the launch's first sorted row
  int32 n_begin, n_end;        // the launch's columns of I
  int32 wact_ld;               // weighted_act's row stride in elements: a full column chunk's width (dW1's buffer) or I
};

template <typename T, int BM, int BN, int BK, int STAGES, int WARPS, int WM, int GROUP_M, bool WGMMA, bool WS, bool ALIGNED, bool TMA, int CLUSTER, bool PERSISTENT, bool FUSED_ACT>
__global__ void __launch_bounds__(GemmLaunch<WS, WARPS>::kThreads, GemmLaunch<WS, WARPS>::kMinBlocks) bwd_dw2_kernel(const __grid_constant__ BwdDw2Params p) {
  static_assert(CLUSTER == 1, "expert GEMMs run without clusters");
  constexpr int kThreads = WARPS * 32;
  using Mma = GemmMma<WGMMA, WS, T, BM, BN, BK, WARPS, WM, false, false>;
  constexpr int kTmaBytes = TMA ? (Mma::ATile::kElems + (FUSED_ACT ? 0 : Mma::BTile::kElems)) * 2 : 0;
  static_assert(!PERSISTENT || kPersistentEligible<TMA, WS, WARPS, CLUSTER>,
                "a persistent grid of two-warpgroup TMA tiles or pairs");
  // Where the epilogue stages its output tile (run_token_gemm / run_expert_gemm).
  using Staging = typename Select<PERSISTENT, PersistentStaging<Mma, STAGES, BM, BN>, StagedTile<T, BM, BN>>::type;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma swizzle atoms
  const GemmSmem<Mma, STAGES, PERSISTENT ? 0 : BK, PERSISTENT ? PersistentStaging<Mma, STAGES, BM, BN>::kElems : 0> sm(smem_raw);  // rows: the 2 * BK int32 token ring
  const T* scores = static_cast<const T*>(p.scores);
  // The weighted activation's row 0 is the launch's first sorted row.
  const int32 wact_row0 = p.routing.expert_offsets[0];

  KRowTokens<BK, Mma::kLoaders> tokens{p.routing, 0, 0, reinterpret_cast<int32*>(sm.rows)};
  Mma mma;
  // The copying (non-TMA) configs' tile bases, set once per tile (prologue, one-tile blocks
  // only): recomputed per k tile, while a wgmma group is in flight, they made ptxas serialize
  // the multistage loop (C7515).
  const T* d_out = nullptr;
  const T* wact = nullptr;
  const T* pre_tile = nullptr;  // the fused activation's pre-activations (one-tile blocks)
  run_expert_gemm<BM, BN, BK, GROUP_M, PERSISTENT, STAGES, kTmaBytes>(
      p.routing, p.hidden, p.n_end - p.n_begin, mma, sm,
      [&](int stage, const ExpertBlock& blk, int kt) {
        const int32 k0 = blk.r_begin + kt * BK;
        // A = dO^T: tile row r is sorted row k0 + r (its token's dO row), columns m0..
        if constexpr (TMA) {
          if (tma_thread<kThreads>()) {
            tma_load_panels<typename Mma::ATile>(sm.a_stage(stage), p.d_out_rows_map, sm.full(stage), blk.m0, k0);
            if (!FUSED_ACT) {
              tma_load_panels<typename Mma::BTile>(sm.b_stage(stage), p.weighted_act_map, sm.full(stage),
                                                   blk.n0 - p.n_begin, k0 - wact_row0);
            }
          }
        } else {
          tokens.begin(kt);
          tokens.template load_rows<typename Mma::ATile, ALIGNED>(sm.a_stage(stage), d_out, p.hidden, p.hidden - blk.m0);
          tokens.end(kt);
        }
        if constexpr (FUSED_ACT) {
          const T* pre = PERSISTENT ? static_cast<const T*>(p.pre_act) + blk.n0 : pre_tile;
          fill_tile<typename Mma::BTile, Mma::kLoaders>(sm.b_stage(stage), [&](int r, int col, uint16 (&v)[8]) {
            const int64 row = k0 + r;
            const bool ok = row < blk.r_end;
            const float s = ok ? load_float(scores + p.routing.sorted_pairs[row]) : 0.f;
            const T* g = pre + row * 2 * p.inter + col;
            if (ALIGNED && ok && blk.n0 + col < p.inter) {
              // 8 gate and 8 up values with two 16-byte loads (I is a multiple of 8).
              const uint4 gv = *reinterpret_cast<const uint4*>(g);
              const uint4 uv = *reinterpret_cast<const uint4*>(g + p.inter);
              const uint32 gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
#pragma unroll
              for (int j = 0; j < 8; ++j) {
                v[j] = DTypeTraits<T>::from_float(SwiGlu::weighted_act(word_element<T>(gw, j), word_element<T>(uw, j), s));
              }
              return;
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const bool in = ok && blk.n0 + col + j < p.inter;
              v[j] = in ? DTypeTraits<T>::from_float(SwiGlu::weighted_act(load_float(g + j), load_float(g + j + p.inter), s))
                        : 0;
            }
          });
        } else if constexpr (!TMA) {
          load_tile<typename Mma::BTile, Mma::kLoaders, ALIGNED>(
              sm.b_stage(stage),
              [&](int r) -> const T* {
                const int32 row = k0 + r - wact_row0;
                return k0 + r < blk.r_end && row < p.weighted_act_rows ? wact + static_cast<int64>(row) * p.wact_ld : nullptr;
              },
              p.n_end - blk.n0);
        }
      },
      [&](int stage, const ExpertBlock& blk, int kt) {
        return !TMA ? kWholeKTile
                    : expert_tail_rows<BK, typename Mma::ATile, typename Mma::BTile, ExpertTeam<PERSISTENT, kThreads>>(
                          sm.a_stage(stage), FUSED_ACT ? nullptr : sm.b_stage(stage), blk.r_end - (blk.r_begin + kt * BK));
      },
      [&](const ExpertBlock& blk, const Staging& staged) {
        store_expert_tile<kThreads, ALIGNED>(staged, mma, blk, p.dw2_map, static_cast<T*>(p.dw2), p.hidden, p.inter);
      },
      [&](const ExpertBlock& blk) {
        tokens.r_begin = blk.r_begin;
        tokens.r_end = blk.r_end;
        d_out = static_cast<const T*>(p.d_out) + blk.m0;
        wact = static_cast<const T*>(p.weighted_act) + (blk.n0 - p.n_begin);
        pre_tile = static_cast<const T*>(p.pre_act) + blk.n0;
      },
      p.n_begin);
}

}  // namespace moejit
