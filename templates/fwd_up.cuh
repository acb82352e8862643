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
// act is computed from g and u rounded to the storage type, the values pre_act keeps: the
// backward and the memory-efficient recompute start from the same ones.
// A persistent block whose stages leave room for the tile's g and u (kFwdUpHandoff) hands them
// over in shared memory to the producer warpgroup's three spare warps, which store g and u, compute
// act and store it while the MMA warps run the next tile: the epilogue was 15 % of the MMA warps'
// time with the tensor cores idle (ncu, session 17). In inference (no pre_act) the MMA warps put
// act alone, half the bytes, and the spare warps only store it.
#pragma once

#include "common/token_gemm.cuh"
#include "common/swiglu.cuh"
#include "common/epilogue_group.cuh"

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

// Which fwd_up configs hand g and u to the producer warpgroup's spare warps: the persistent TMA
// blocks of their own whose stages leave room for the two BM x BN tiles (tuner/role_traits.cpp,
// fwd_up_handoff, mirrors it).
template <bool PERSISTENT, int CLUSTER, int STAGES, int BM, int BN, int BK>
constexpr bool kFwdUpHandoff =
    PERSISTENT && CLUSTER == 1 && STAGES * (BM + 2 * BN) * BK * 2 <= kFwdUpHandoffMaxStageBytes;

// Calls f(r, col, g, u) for each pair of this thread's outputs: row r, tile columns col and
// col + 1, their gate and up accumulators. A warp's (warpgroup's) N range [n0, n0 + kWarpN) holds
// gate columns n0 / 2 ... then the up columns of the same outputs, so acc[.][ni] (gate) pairs
// with acc[.][ni + kNi / 2] (up) for ni < kNi / 2.
template <typename Mma, typename F>
__device__ __forceinline__ void for_each_gate_up(const Mma& mma, F f) {
#pragma unroll
  for (int mi = 0; mi < Mma::kMi; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int ni = 0; ni < Mma::kNi / 2; ++ni) {
        const float g[2] = {mma.acc[mi][ni][2 * half], mma.acc[mi][ni][2 * half + 1]};
        const float u[2] = {mma.acc[mi][ni + Mma::kNi / 2][2 * half], mma.acc[mi][ni + Mma::kNi / 2][2 * half + 1]};
        f(mma.row(mi, half), mma.col(ni) - mma.n0 / 2, g, u);
      }
}

template <typename T, int BM, int BN, int BK, int STAGES, int WARPS, int WM, int GROUP_M, bool WGMMA, bool WS, bool ALIGNED, bool TMA, int CLUSTER, bool PERSISTENT>
__global__ void __launch_bounds__(GemmLaunch<WS, WARPS>::kThreads, GemmLaunch<WS, WARPS>::kMinBlocks) fwd_up_kernel(const __grid_constant__ FwdUpParams p) {
  static_assert(CLUSTER == 1 || TMA, "a cluster pair shares TMA copies");
  constexpr int kThreads = WARPS * 32;
  constexpr int kBN2 = 2 * BN;
  using Mma = GemmMma<WGMMA, WS, T, BM, kBN2, BK, WARPS, WM, true, true>;
  constexpr int kHalf = Mma::kWarpN / 2;  // gate columns per warp (warpgroup)
  static_assert(!PERSISTENT || kPersistentEligible<TMA, WS, WARPS, CLUSTER>,
                "a persistent grid of two-warpgroup TMA tiles or pairs");
  constexpr bool kHandoff = kFwdUpHandoff<PERSISTENT, CLUSTER, STAGES, BM, BN, BK>;
  // Where the epilogue stages its output tile (run_token_gemm / run_expert_gemm).
  using Staging = typename Select<PERSISTENT, PersistentStaging<Mma, STAGES, BM, BN>, StagedTile<T, BM, BN>>::type;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma swizzle atoms
  // kHandoff: the g and u tiles (act is computed into g's), and two barriers in the row offsets'
  // place: `act_full` (every MMA warp put its part) and `act_empty` (the spare warps are done).
  const GemmSmem<Mma, STAGES, !PERSISTENT ? BM : kHandoff ? 2 : 0, !PERSISTENT ? 0 : kHandoff ? 2 * BM * BN : BM * BN>
      sm(smem_raw);
  const T* x = static_cast<const T*>(p.x);
  T* pre = static_cast<T*>(p.pre_act);
  const SwizzledTile<T, BM, BN> g_tile{sm.out}, u_tile{sm.out + BM * BN};
  uint64* const act_full = reinterpret_cast<uint64*>(sm.rows);
  uint64* const act_empty = act_full + 1;
  if (kHandoff && threadIdx.x == 0) {
    mbarrier_init(act_full, WARPS);
    mbarrier_init(act_empty, 1);
    mbarrier_init_fence();  // the main loop's block barrier publishes them
  }
  uint32 tiles_done = 0;  // kHandoff: this thread's tiles so far, the barriers' phase

  Mma mma;
  // act of two outputs from their g and u rounded to T, as pre_act keeps them: the packed word
  // (to_float of one element) is the rounding.
  const auto act_of = [](const float (&g)[2], const float (&u)[2], float (&a)[2]) {
    const uint32 gw[1] = {DTypeTraits<T>::pack2(g[0], g[1])}, uw[1] = {DTypeTraits<T>::pack2(u[0], u[1])};
#pragma unroll
    for (int j = 0; j < 2; ++j) a[j] = SwiGlu::act(word_element<T>(gw, j), word_element<T>(uw, j));
  };
  // kHandoff: the spare warps' work on a tile whose g and u the MMA warps put in g_tile and u_tile
  // (in inference, act in g_tile). One thread stores g and u by TMA (or the warps row by row, a
  // short tile's rows past it being the next tile's), the warps compute act into g_tile 16 bytes
  // at a time, and it leaves the same way; act_empty once the stores have read the tiles.
  const auto handoff_epilogue = [&]() {
    if constexpr (kHandoff) {
      return make_epilogue_group<EpilogueWarps::kSpareProducerWarps>([&](const TokenWork& w) {
        constexpr int kSpare = 32 * kSpareProducerWarps;
        const int t = static_cast<int>(threadIdx.x) - (kThreads + 32);
        const bool whole = w.store && w.tile.rows == BM;
        const auto sync_spare = [] { asm volatile("bar.sync 3, %0;\n" ::"n"(kSpare) : "memory"); };
        const auto write_rows = [&](const SwizzledTile<T, BM, BN>& tile, T* base, int64 stride) {
          write_staged_rows<BM, BN, kSpare, ALIGNED>(
              [&](int r, int col) { return tile.smem + SwizzledTile<T, BM, BN>::Layout::offset(r, col); },
              [&](int r) -> T* { return w.store && r < w.tile.rows ? base + r * stride : nullptr; }, p.inter - w.n0,
              t);
        };
        mbarrier_wait_or_trap(act_full, tiles_done & 1);
        if (pre != nullptr) {
          if (whole) {
            if (t == 0) {
#pragma unroll
              for (int panel = 0; panel < BN / 64; ++panel) {
                tma_store(p.pre_act_map, g_tile.panel(panel), w.n0 + 64 * panel, 0, w.tile.row0);
                tma_store(p.pre_act_map, u_tile.panel(panel), w.n0 + 64 * panel, 1, w.tile.row0);
              }
              bulk_commit();
              bulk_wait_read();  // act goes over g
            }
          } else {
            T* const base = pre + static_cast<int64>(w.tile.row0) * 2 * p.inter + w.n0;
            write_rows(g_tile, base, 2 * p.inter);
            write_rows(u_tile, base + p.inter, 2 * p.inter);
          }
          sync_spare();
          for (int chunk = t; chunk < BM * BN / 8; chunk += kSpare) {
            const int r = chunk / (BN / 8), col = chunk % (BN / 8) * 8;
            T* const gp = g_tile.smem + SwizzledTile<T, BM, BN>::Layout::offset(r, col);
            const uint4 gv = *reinterpret_cast<const uint4*>(gp);
            const uint4 uv = *reinterpret_cast<const uint4*>(u_tile.smem + SwizzledTile<T, BM, BN>::Layout::offset(r, col));
            const uint32 gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
            uint32 aw[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              aw[j] = DTypeTraits<T>::pack2(SwiGlu::act(word_element<T>(gw, 2 * j), word_element<T>(uw, 2 * j)),
                                            SwiGlu::act(word_element<T>(gw, 2 * j + 1), word_element<T>(uw, 2 * j + 1)));
            }
            store_uint4(gp, aw);
          }
          if (whole) fence_proxy_async_shared();  // the act stores read g_tile through the async proxy
          sync_spare();
        }
        if (whole) {
          if (t == 0) {
#pragma unroll
            for (int panel = 0; panel < BN / 64; ++panel) tma_store(p.act_map, g_tile.panel(panel), w.n0 + 64 * panel, w.tile.row0);
            bulk_commit();
            bulk_wait();  // written, not only read: the block may exit after its last tile
          }
        } else {
          write_rows(g_tile, static_cast<T*>(p.act) + static_cast<int64>(w.tile.row0) * p.inter + w.n0, p.inter);
          sync_spare();
        }
        if (t == 0) mbarrier_arrive(act_empty);
        ++tiles_done;
      });
    } else {
      return NoEpilogueGroup{};
    }
  }();
  // Tiles of at most 64 rows split along K where the g and u tiles can take their partial sums.
  run_token_gemm<BM, BN, GROUP_M, CLUSTER, PERSISTENT, STAGES, TMA ? (Mma::ATile::kElems + Mma::BTile::kElems) * 2 : 0,
                 kHandoff>(
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
        if constexpr (kHandoff) {
          // Put g and u (in inference, act) once the spare warps are done with the last tile's.
          if (tiles_done > 0) mbarrier_wait(act_empty, (tiles_done - 1) & 1);
          static_assert(Mma::kAccumulators * 128 * 4 <= 2 * SwizzledTile<T, BM, BN>::kBytes,
                        "g and u's tiles hold a split's partial sums");
          mma.template fold_split<kThreads>(reinterpret_cast<float*>(g_tile.smem));
          if (pre != nullptr) {
            for_each_gate_up(mma, [&](int r, int col, const float (&g)[2], const float (&u)[2]) {
              g_tile.put(r, col, g[0], g[1]);
              u_tile.put(r, col, u[0], u[1]);
            });
          } else {
            for_each_gate_up(mma, [&](int r, int col, const float (&g)[2], const float (&u)[2]) {
              float a[2];
              act_of(g, u, a);
              g_tile.put(r, col, a[0], a[1]);
            });
          }
          fence_proxy_async_shared();  // TMA stores read g and u through the async proxy
          __syncwarp();                // the warp's writes precede lane 0's arrival
          if ((threadIdx.x & 31) == 0) mbarrier_arrive(act_full);
          ++tiles_done;
          return;
        }
        // Up to three [BM, BN] outputs (act, then g and u into pre_act), each staged in shared
        // memory, then stored by TMA (a persistent block's whole tiles: the MMA warps go on while
        // the copy engine drains it) or written with 16-byte stores. which: 0 act, 1 gate, 2 up.
        T* act = static_cast<T*>(p.act) + static_cast<int64>(w.tile.row0) * p.inter + w.n0;
        // One pass per output, inlined with a constant `which` so each pass keeps only its own
        // values live (a runtime loop over the three spilled at 128 x 256).
        auto write_output = [&](const int which) {
          const auto put = [&](const Staging& tile) {
            for_each_gate_up(mma, [&](int r, int col, const float (&g)[2], const float (&u)[2]) {
              if (which == 0) {
                float a[2];
                act_of(g, u, a);
                tile.put(r, col, a[0], a[1]);
              } else if (which == 1) {
                tile.put(r, col, g[0], g[1]);
              } else {
                tile.put(r, col, u[0], u[1]);
              }
            });
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
      },
      NoStep{}, handoff_epilogue);
}

}  // namespace moejit
