// bwd_down: d_act = dO[gathered] . W2[e] for each token tile and BN intermediate columns, then
// in the epilogue, from the saved pre-activations [g | u] and the router score s of each row:
//   ds[pair][j]  += sum over i in 64j .. 64j + 63 of d_act * act   (act = silu(g) * u recomputed)
//   d_pre_act     = [dg | du] of act, with s folded into d(act) = s * d_act
//   weighted_act  = s * act                      (for dW2; skipped when null)
// d_pre_act may alias pre_act (memory-efficient mode): each element is read before it is
// written, by the same thread, and no other block touches it. TMA (warp-specialized wgmma): both
// tiles are bulk copies: the A tile from d_out_rows, dO already scattered into sorted order
// (gather_sum's scatter; rows past the tile's expert feed only rows that are not stored), the
// W2 tile as 64-column panels of W2 viewed as [E, H, I]; and the epilogue reads the tile's g and
// u from shared memory, bulk-copied there after the main loop (per-thread loads of 4 bytes a row
// stalled the MMA warps for ~30 % of the role), writes dg and du over them, and stores them by
// TMA (the fragment layout's scattered 4-byte stores wasted half the sectors they wrote); the
// weighted activation goes out in 16-byte stores after a transpose within each quad of lanes.
// A persistent grid of 256-column tiles instead hands each tile's d_act to an epilogue warpgroup
// (kBwdDownEpilogueGroup): the MMA warps' share of the epilogue was 40 % of their time at
// T=32768 (ncu, session 16), with the tensor cores idle; the warpgroup reads g and u from
// pre_act, eight rows per warp in flight, and writes every output with 8-byte coalesced stores.
// d_act goes over in fp32 beside at most 96 KB of stages, else in the storage type. In place
// the role took 7 % less time than the one-tile 128 x 256 block (session 17).
// A launch may cover experts expert_begin .. routing.experts - 1 alone (the memory-efficient
// backward's chunks, whose weighted activation lives in dW1's buffer): its token tiles, and
// weighted_act rows counted from the first of them, weighted_act_rows at most; a tile past that
// room (only an expert named twice by one token gets there) stores no weighted activation. It
// may also cover columns n_begin .. n_end - 1 of I alone (column chunks, n_begin a multiple of
// BN): weighted_act then holds those columns, rows wact_ld elements apart.
#pragma once

#include "common/epilogue_group.cuh"
#include "common/token_gemm.cuh"
#include "common/swiglu.cuh"
#include "common/warp.cuh"

namespace moejit {

struct BwdDownParams {
  const void* d_out;       // [T, H]
  const void* d_out_rows;  // [TK, H] dO in sorted order; TMA only
  const void* w2;       // [E, H, I]
  const void* scores;   // [T, K]
  const void* pre_act;  // [TK, 2I]
  void* d_pre_act;      // [TK, 2I], may equal pre_act
  void* weighted_act;   // [weighted_act_rows, I] or null
  float* ds_acc;        // [TK, ds_slots] by flat pair, zeroed before the launch (kDsSlotColumns)
  RoutingView routing;  // experts: one past the last expert of the launch
  int32 hidden;
  int32 inter;
  TensorMap w2_map;          // TMA: W2 as [E, H, I], boxes 64 x BK x 1
  TensorMap d_out_rows_map;  // TMA: d_out_rows as [TK, H], boxes BK x BM
  TensorMap pre_act_map;     // TMA: pre_act as [TK, 2, I], boxes 64 x 1 x BM
  TensorMap d_pre_act_map;   // TMA: d_pre_act as pre_act_map
  int32 expert_begin;        // the launch's first expert
  int32 weighted_act_rows;   // weighted_act's rows, from expert_begin's first
  int32 n_begin, n_end;      // the launch's columns of I
  int32 wact_ld;             // weighted_act's row stride in elements: a full column chunk's width (dW1's buffer) or I
  int32 ds_slots;            // ceil(I / kDsSlotColumns)
};

// The score gradient of a pair, sum_i d_act * act, is summed over each 64 columns of I apart, into
// a slot of its own that gather_sum then adds up in one fixed order: every slot is written by one warp,
// by two for warps 32 columns wide (two fp32 adds onto zero commute), or by four (16 wide) in
// turn behind a barrier, so the sum comes out the same bits on every run, where one fp32 atomic per row
// and column tile summed in the order they landed. Every config sums the same columns into a slot,
// so the tuner compares slots directly.
constexpr int kDsSlotColumns = 64;

// Which bwd_down configs hand their tiles to an epilogue warpgroup: the persistent ones wider than
// 128 columns, whose g and u tiles would not fit beside the stages (tuner/role_traits.cpp).
template <bool PERSISTENT, int BN>
constexpr bool kBwdDownEpilogueGroup = PERSISTENT && BN > 128;

template <typename T, int BM, int BN, int BK, int STAGES, int WARPS, int WM, int GROUP_M, bool WGMMA, bool WS, bool ALIGNED, bool TMA, int CLUSTER, bool PERSISTENT>
__global__ void __launch_bounds__(GemmLaunch<WS, WARPS, kBwdDownEpilogueGroup<PERSISTENT, BN>>::kThreads,
                                  GemmLaunch<WS, WARPS, kBwdDownEpilogueGroup<PERSISTENT, BN>>::kMinBlocks)
    bwd_down_kernel(const __grid_constant__ BwdDownParams p) {
  static_assert(CLUSTER == 1 || TMA, "a cluster pair shares TMA copies");
  constexpr int kThreads = WARPS * 32;
  constexpr bool kGroup = kBwdDownEpilogueGroup<PERSISTENT, BN>;
  using Mma = GemmMma<WGMMA, WS, T, BM, BN, BK, WARPS, WM, true, false>;
  // Persistent where g and u fit beside the stages (up to 128 columns), or with an epilogue
  // warpgroup in blocks of their own (tuner/role_traits.cpp).
  static_assert(!PERSISTENT || (kPersistentEligible<TMA, WS, WARPS, CLUSTER> && (BN <= 128 || CLUSTER == 1)),
                "a persistent grid of two-warpgroup TMA tiles or pairs, pairs up to 128 columns");
  // TMA: the epilogue's g and u tiles, BN / 64 panels each (SmemTile<BM, 64>, 128-byte swizzle).
  // A one-tile block copies them into its stages once the main loop is done; a persistent block's
  // producer copies them into memory of their own after issuing the tile's k tiles, so they land
  // under the last k tiles. Their barriers take the unused row offsets' place: `pre_full` (the
  // copies landed) and, persistent, `pre_empty` (every MMA warp is done with them).
  using PrePanel = SmemTile<BM, 64>;
  constexpr int kPreElems = 2 * BN * BM;
  // kGroup: d_act goes over in fp32 where the stages leave room for it (up to 96 KB of stages),
  // else rounded to the storage type, as PyTorch's own grouped GEMMs round it before the SwiGLU
  // backward; deeper pipelines may pay for that.
  constexpr bool kFp32Handoff = STAGES * (BM + BN) * BK * 2 <= kFp32HandoffMaxStageBytes;
  using Handoff = HandoffTile<BM, BN, typename Select<kFp32Handoff, float, T>::type>;
  // What run_token_gemm hands the epilogue to stage an output tile in; bwd_down stores from
  // registers and leaves it alone.
  using Staging = typename Select<PERSISTENT, PersistentStaging<Mma, STAGES, BM, BN>, StagedTile<T, BM, BN>>::type;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma swizzle atoms
  constexpr int kOutElems = !PERSISTENT ? 0 : kGroup ? Handoff::kBytes / 2 : kPreElems;
  const GemmSmem<Mma, STAGES, PERSISTENT ? 2 : BM, kOutElems> sm(smem_raw);
  static_assert(!TMA || PERSISTENT || kPreElems <= decltype(sm)::kPipelineBytes / 2, "g and u fit the stages");
  T* const g_tile = PERSISTENT ? sm.out : sm.a;
  T* const u_tile = g_tile + BN * BM;
  uint64* const pre_full = reinterpret_cast<uint64*>(sm.rows);
  uint64* const pre_empty = pre_full + 1;
  // kGroup: the d_act tile takes g and u's place, and their barriers: `act_full` (every MMA warp
  // wrote its part) and `act_empty` (every epilogue warp is done reading it).
  const Handoff act_tile{reinterpret_cast<decltype(Handoff::base)>(sm.out)};
  uint64* const act_full = pre_full;
  uint64* const act_empty = pre_empty;
  if (TMA && threadIdx.x == 0) {
    if (kGroup) {
      mbarrier_init(act_full, WARPS);
      mbarrier_init(act_empty, kEpilogueWarps);
    } else {
      mbarrier_init(pre_full, 1);
      if (PERSISTENT) mbarrier_init(pre_empty, WARPS);
    }
    mbarrier_init_fence();  // the main loop's block or cluster barrier publishes them
  }
  const auto copy_pre = [&](const TokenWork& w) {
    mbarrier_arrive_expect_tx(pre_full, kPreElems * 2);
#pragma unroll
    for (int panel = 0; panel < BN / 64; ++panel) {
      tma_load(g_tile + panel * PrePanel::kElems, p.pre_act_map, pre_full, w.n0 + 64 * panel, 0, w.tile.row0);
      tma_load(u_tile + panel * PrePanel::kElems, p.pre_act_map, pre_full, w.n0 + 64 * panel, 1, w.tile.row0);
    }
  };
  uint32 tiles_done = 0;  // this thread's tiles so far: the pre barriers' phase

  const T* d_out = static_cast<const T*>(p.d_out);
  const T* scores = static_cast<const T*>(p.scores);
  const T* pre = static_cast<const T*>(p.pre_act);
  T* dpre = static_cast<T*>(p.d_pre_act);
  // The weighted activation's row 0 is the launch's first sorted row.
  const int64 wact_row0 = p.routing.expert_offsets[p.expert_begin];
  // Where a tile's weighted activation goes, indexed by sorted row and column of I (row stride
  // wact_ld); null when not stored.
  const auto wact_of = [&](const TokenWork& w) -> T* {
    const bool room = w.tile.row0 - wact_row0 + w.tile.rows <= p.weighted_act_rows;
    return p.weighted_act != nullptr && room ? static_cast<T*>(p.weighted_act) - wact_row0 * p.wact_ld - p.n_begin
                                             : nullptr;
  };
  // Tile-local element (r, c) of the g or u tile in shared memory.
  const auto pre_smem = [](T* t, int r, int c) { return t + (c / 64) * PrePanel::kElems + PrePanel::offset(r, c % 64); };
  // TMA: the weighted activation leaves in 16-byte stores after a transpose within each quad of
  // lanes, where registers allow: at two blocks per SM (128 registers) its four packed words
  // spilled, so those configs store the fragment's pairs.
  constexpr bool kQuadWact = TMA && GemmLaunch<WS, WARPS>::kMinBlocks == 1;
  static_assert(!kQuadWact || Mma::kNi % 4 == 0, "the weighted activation's quad transposes take 4 column groups");
  Mma mma;
  // The flat pair and router score of each of this thread's rows, loaded for all of them at once
  // before the epilogue waits for g and u: loaded row by row inside finish(), each pair of
  // dependent loads came after the previous rows' stores (which may alias them) and stalled the
  // MMA warps once per row (ncu, session 16).
  struct RowScores {
    int32 pair[Mma::kMi][2];
    float s[Mma::kMi][2];
  };
  const auto row_scores = [&](const TokenWork& w) {
    RowScores rs;
#pragma unroll
    for (int mi = 0; mi < Mma::kMi; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mma.row(mi, half);
        rs.pair[mi][half] = w.store && r < w.tile.rows ? p.routing.sorted_pairs[w.tile.row0 + r] : -1;
      }
#pragma unroll
    for (int mi = 0; mi < Mma::kMi; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        rs.s[mi][half] = rs.pair[mi][half] >= 0 ? load_float(scores + rs.pair[mi][half]) : 0.f;
    return rs;
  };
  // The epilogue proper, with the tile's g and u in shared memory (TMA) or read from pre_act.
  constexpr int kSlotNi = kDsSlotColumns / 8;  // 8-column groups per score-gradient slot
  static_assert(Mma::kWarpN % kDsSlotColumns == 0 || kDsSlotColumns % Mma::kWarpN == 0,
                "a warp's columns are whole slots, or a slot is whole warps'");
  static_assert(BN % kDsSlotColumns == 0, "tiles start on slot boundaries");
  // Warps adding into each slot: two adds onto zero commute; four (the mma.sync path's 16- and
  // 32-row tiles, whose warps lie mostly along N, 16 columns each) add in turn. A turn is the warp's place
  // within its slot, from the tile-local column: tiles and launches start on slot boundaries
  // (BLOCK_N and n_begin multiples of 64).
  constexpr int kSlotWriters = Mma::kWarpN >= kDsSlotColumns ? 1 : kDsSlotColumns / Mma::kWarpN;
  const auto finish = [&](const TokenWork& w, const RowScores& rs) {
    const int lane = threadIdx.x & 31;
    T* const wact = wact_of(w);
#pragma unroll
    for (int mi = 0; mi < Mma::kMi; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mma.row(mi, half);
        const int32 pair = rs.pair[mi][half];
        const bool valid = pair >= 0;
        const int64 row = w.tile.row0 + r;
        const float s = rs.s[mi][half];
        float ds = 0.f;  // over the current slot's columns
        uint32 wa_words[4];  // kQuadWact: packed weighted activations of four 8-column groups
#pragma unroll
        for (int ni = 0; ni < Mma::kNi; ++ni) {
          const int col = w.n0 + mma.col(ni);
          const bool in_range = valid && col < p.n_end;
          // TMA reads g and u from shared memory, so out-of-range elements compute harmlessly
          // (and are not stored); the quad transpose below needs every lane.
          if (kQuadWact || in_range) {
            const int64 gi = row * 2 * p.inter + col;
            const float da[2] = {mma.acc[mi][ni][2 * half], mma.acc[mi][ni][2 * half + 1]};
            float g[2], u[2], dg[2], du[2], wa[2];
            // Column pairs: with I a multiple of 8 both columns exist and are 4-byte aligned.
            const bool both = ALIGNED || col + 1 < p.n_end;
            if (TMA) {
              load_float2(pre_smem(g_tile, r, mma.col(ni)), g[0], g[1]);
              load_float2(pre_smem(u_tile, r, mma.col(ni)), u[0], u[1]);
            } else if (ALIGNED) {
              load_float2(pre + gi, g[0], g[1]);
              load_float2(pre + gi + p.inter, u[0], u[1]);
            } else {
              g[0] = load_float(pre + gi);
              u[0] = load_float(pre + gi + p.inter);
              g[1] = both ? load_float(pre + gi + 1) : 0.f;
              u[1] = both ? load_float(pre + gi + 1 + p.inter) : 0.f;
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              ds += in_range && (j == 0 || both) ? da[j] * SwiGlu::act(g[j], u[j]) : 0.f;
              SwiGlu::backward(g[j], u[j], s * da[j], dg[j], du[j]);
              wa[j] = SwiGlu::weighted_act(g[j], u[j], s);
            }
            if (TMA) {
              // Over g and u, the same elements this thread read: stored by store_d_pre_act.
              store_float2(pre_smem(g_tile, r, mma.col(ni)), dg[0], dg[1]);
              store_float2(pre_smem(u_tile, r, mma.col(ni)), du[0], du[1]);
              if (!kQuadWact && wact != nullptr) store_float2(wact + row * p.wact_ld + col, wa[0], wa[1]);
            } else if (ALIGNED) {
              store_float2(dpre + gi, dg[0], dg[1]);
              store_float2(dpre + gi + p.inter, du[0], du[1]);
              if (wact != nullptr) store_float2(wact + row * p.wact_ld + col, wa[0], wa[1]);
            } else {
              for (int j = 0; j < (both ? 2 : 1); ++j) {
                store_float(dpre + gi + j, dg[j]);
                store_float(dpre + gi + j + p.inter, du[j]);
                if (wact != nullptr) store_float(wact + row * p.wact_ld + col + j, wa[j]);
              }
            }
            if constexpr (kQuadWact) {
              wa_words[ni % 4] = DTypeTraits<T>::pack2(wa[0], wa[1]);
              if (ni % 4 == 3 && wact != nullptr) {
                // This lane now holds the 8 columns of group ni - 3 + q (q = lane % 4).
                quad_transpose(wa_words);
                const int chunk = w.n0 + mma.n0 + (ni - 3 + (lane & 3)) * 8;
                if (valid && chunk < p.n_end) store_uint4(wact + row * p.wact_ld + chunk, wa_words);
              }
            }
          }
          // At the end of a slot's columns, or of the warp's where a slot is several warps': the
          // four lanes of a row hold them; reduce, then one add per row and warp into its slot.
          if ((ni + 1) % kSlotNi == 0 || ni == Mma::kNi - 1) {
            ds += __shfl_xor_sync(kFullWarp, ds, 1);
            ds += __shfl_xor_sync(kFullWarp, ds, 2);
            const int slot_col = w.n0 + mma.n0 + ni / kSlotNi * kDsSlotColumns;
            const bool add = valid && (lane & 3) == 0 && slot_col < p.n_end;
            const int64 slot = static_cast<int64>(pair) * p.ds_slots + slot_col / kDsSlotColumns;
            if constexpr (kSlotWriters <= 2) {
              if (add) atomicAdd(p.ds_acc + slot, ds);
            } else {
#pragma unroll
              for (int turn = 0; turn < kSlotWriters; ++turn) {
                if (add && mma.n0 % kDsSlotColumns / Mma::kWarpN == turn) atomicAdd(p.ds_acc + slot, ds);
                sync_mma_threads<kThreads>();
              }
            }
            ds = 0.f;
          }
        }
      }
  };
  // TMA: writes the dg and du tiles finish() left in shared memory to d_pre_act, by TMA when the
  // tile has all BM rows (rows past a short tile are the next tile's), else row by row.
  const auto store_d_pre_act = [&](const TokenWork& w) {
    const bool whole = w.store && w.tile.rows == BM;
    if (whole) fence_proxy_async_shared();  // the stores read dg and du through the async proxy
    sync_mma_threads<kThreads>();
    if (whole) {
      if (threadIdx.x == 0) {
#pragma unroll
        for (int panel = 0; panel < BN / 64; ++panel) {
          tma_store(p.d_pre_act_map, g_tile + panel * PrePanel::kElems, w.n0 + 64 * panel, 0, w.tile.row0);
          tma_store(p.d_pre_act_map, u_tile + panel * PrePanel::kElems, w.n0 + 64 * panel, 1, w.tile.row0);
        }
        bulk_commit();
      }
      return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      T* const tile = h == 0 ? g_tile : u_tile;
      T* const base = dpre + static_cast<int64>(w.tile.row0) * 2 * p.inter + h * p.inter + w.n0;
      write_staged_rows<BM, BN, kThreads, ALIGNED>(
          [&](int r, int col) { return pre_smem(tile, r, col); },
          [&](int r) -> T* { return w.store && r < w.tile.rows ? base + static_cast<int64>(r) * 2 * p.inter : nullptr; },
          p.n_end - w.n0);
    }
  };
  // kGroup: the epilogue warpgroup's work on a tile the MMA warps handed over. Warp w finishes
  // rows w, w + 4, ..., kRows at a time: lane l holds columns 4l..4l+3 and 128+4l..128+4l+3, so
  // each load and store of g, u, dg, du and the weighted activation covers 256 contiguous bytes.
  const auto group_epilogue = [&]() {
    if constexpr (kGroup) {
      static_assert(BM == 32 * kEpilogueWarps && BN == 256, "a row per lane and warp, 256 columns");
      return make_epilogue_group<EpilogueWarps::kAddedWarpgroup>([&](const TokenWork& w) {
        const int warp = static_cast<int>(threadIdx.x / 32) % kEpilogueWarps;
        const int lane = static_cast<int>(threadIdx.x & 31);
        // Each lane looks up one of the warp's rows ahead of the wait.
        const int lane_row = warp + kEpilogueWarps * lane;
        const int32 lane_pair = w.store && lane_row < w.tile.rows ? p.routing.sorted_pairs[w.tile.row0 + lane_row] : -1;
        const float lane_s = lane_pair >= 0 ? load_float(scores + lane_pair) : 0.f;
        // I is a multiple of 8 (TMA), so each of the lane's two 4-column chunks is wholly in range
        // or out.
        const bool chunk_in[2] = {w.n0 + 4 * lane < p.n_end, w.n0 + 4 * (32 + lane) < p.n_end};
        T* const wact = wact_of(w);
        mbarrier_wait_or_trap(act_full, tiles_done & 1);
        // Rows in flight per warp: their g and u loads are all issued before any row is finished.
        // With two, each tile took 16 round trips to memory per warp, longer than the next tile's
        // main loop (session 16).
        constexpr int kRows = 8;
        for (int i = 0; i < 32; i += kRows) {
          if (!w.store || warp + kEpilogueWarps * i >= w.tile.rows) break;  // rows past the tile's come last
          uint2 gw[kRows][2], uw[kRows][2];
#pragma unroll
          for (int j = 0; j < kRows; ++j)
#pragma unroll
            for (int part = 0; part < 2; ++part) {
              const int r = warp + kEpilogueWarps * (i + j);
              if (r >= w.tile.rows || !chunk_in[part]) continue;
              const int64 gi = (w.tile.row0 + r) * 2LL * p.inter + w.n0 + 4 * (part * 32 + lane);
              gw[j][part] = *reinterpret_cast<const uint2*>(pre + gi);
              uw[j][part] = *reinterpret_cast<const uint2*>(pre + gi + p.inter);
            }
          // A row's 256 columns are four score-gradient slots: of each 128-column part, lanes
          // 0-15 hold the first 64 and lanes 16-31 the second. Four rows' two sums per lane reduce
          // together over each half-warp (warp_sum_each): 8 shuffles. Eight rows' 16 sums at once
          // took 15, but ptxas kept them in local memory (a 64-byte stack frame, not counted as a
          // spill) beside the g and u loads in flight: 6 % of the role at T=32768 (session 40).
          constexpr int kSumRows = 4;
          static_assert(kRows % kSumRows == 0, "whole reductions per batch of rows");
          static_assert(kDsSlotColumns == 64, "a half-warp's chunks of a part are one slot");
          float ds[2 * kSumRows];  // [row][part]
#pragma unroll
          for (int j = 0; j < kRows; ++j) {
            const int32 pair = __shfl_sync(kFullWarp, lane_pair, i + j);
            const float s = __shfl_sync(kFullWarp, lane_s, i + j);
            float* const row_ds = ds + 2 * (j % kSumRows);
            row_ds[0] = row_ds[1] = 0.f;
            if (pair >= 0) {  // the same for the whole warp: rows past the tile's come last
              const int r = warp + kEpilogueWarps * (i + j);
              const int64 row = w.tile.row0 + r;
              // The lane's first chunk in the row: the second is 128 columns on, so its addresses
              // differ by a constant.
              const int64 pre_at = row * 2 * p.inter + w.n0 + 4 * lane, wact_at = row * p.wact_ld + w.n0 + 4 * lane;
#pragma unroll
              for (int part = 0; part < 2; ++part) {
                if (!chunk_in[part]) continue;
                float d[4];
                act_tile.load(r, part * 32 + lane, d);
                const uint32 gws[2] = {gw[j][part].x, gw[j][part].y}, uws[2] = {uw[j][part].x, uw[j][part].y};
                uint32 dgw[2], duw[2], waw[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  float dg[2], du[2], wa[2];
#pragma unroll
                  for (int e = 0; e < 2; ++e) {
                    const float g = word_element<T>(gws, 2 * h + e);
                    const float u = word_element<T>(uws, 2 * h + e);
                    row_ds[part] += d[2 * h + e] * SwiGlu::act(g, u);
                    SwiGlu::backward(g, u, s * d[2 * h + e], dg[e], du[e]);
                    wa[e] = SwiGlu::weighted_act(g, u, s);
                  }
                  dgw[h] = DTypeTraits<T>::pack2(dg[0], dg[1]);
                  duw[h] = DTypeTraits<T>::pack2(du[0], du[1]);
                  waw[h] = DTypeTraits<T>::pack2(wa[0], wa[1]);
                }
                T* const dst = dpre + pre_at + 128 * part;
                store_uint2(dst, dgw);
                store_uint2(dst + p.inter, duw);
                if (wact != nullptr) store_uint2(wact + wact_at + 128 * part, waw);
              }
            }
            if (j % kSumRows == kSumRows - 1) {
              // Lanes l and l ^ 1 hold, over their half-warp h = l / 16, row j + 1 - kSumRows +
              // (l % 16) / 4's sum for part (l / 2) % 2: the tile's slot 2 ((l / 2) % 2) + h. The
              // even lane adds it, once per slot.
              const float total = warp_sum_each<2 * kSumRows, 16>(ds);
              const int32 row_pair = __shfl_sync(kFullWarp, lane_pair, i + j + 1 - kSumRows + (lane % 16) / 4);
              const int slot_col = w.n0 + kDsSlotColumns * (2 * ((lane / 2) % 2) + lane / 16);
              if (lane % 2 == 0 && row_pair >= 0 && slot_col < p.n_end) {
                atomicAdd(p.ds_acc + static_cast<int64>(row_pair) * p.ds_slots + slot_col / kDsSlotColumns, total);
              }
            }
          }
        }
        __syncwarp();
        if (lane == 0) mbarrier_arrive(act_empty);
        ++tiles_done;
      });
    } else {
      return NoEpilogueGroup{};
    }
  }();
  // The epilogue warpgroup's tiles of at most 64 rows, whose warpgroups split N, are halved
  // (WgmmaMma::kCanHalve): the rows past them, whose accumulators go stale, are never read.
  run_token_gemm<BM, BN, GROUP_M, CLUSTER, PERSISTENT, STAGES, TMA ? (Mma::ATile::kElems + Mma::BTile::kElems) * 2 : 0,
                 kGroup>(
      p.routing, p.n_end - p.n_begin, ceil_div(p.hidden, BK), mma, sm,
      [&](int stage, const TokenWork& w, int kt) {
        const int k0 = kt * BK;
        // W2[e] read as [K = H][N = I]: tile row r is hidden index k0 + r.
        if constexpr (TMA) {
          if (tma_thread<kThreads>()) {
            tma_load_k_major<typename Mma::ATile>(sm.a_stage(stage), p.d_out_rows_map, sm.full(stage), k0,
                                                  w.tile.row0);
            using BTile = typename Mma::BTile;
            w.pair.copy_weight_tile<BN / 64>([&](int panel, uint16 mask) {
              tma_load_multicast(sm.b_stage(stage) + panel * BTile::kPanelElems, p.w2_map, sm.full(stage), mask,
                                 w.n0 + 64 * panel, k0, w.tile.expert);
            });
          }
        } else {
          const T* w2 = static_cast<const T*>(p.w2) + static_cast<int64>(w.tile.expert) * p.hidden * p.inter + w.n0;
          load_gathered_rows<typename Mma::ATile, Mma::kLoaders, ALIGNED>(sm.a_stage(stage), sm.rows, d_out, k0,
                                                                          p.hidden - k0);
          load_tile<typename Mma::BTile, Mma::kLoaders, ALIGNED>(
              sm.b_stage(stage),
              [&](int r) -> const T* { return k0 + r < p.hidden ? w2 + static_cast<int64>(k0 + r) * p.inter : nullptr; },
              p.inter - w.n0);
        }
      },
      [&](const TokenWork& w, const Staging&) {
        if constexpr (kGroup) {
          // Hand d_act over once the epilogue warpgroup is done with the last tile's.
          if (tiles_done > 0) mbarrier_wait(act_empty, (tiles_done - 1) & 1);
          act_tile.store(mma);
          __syncwarp();  // the warp's shared-memory writes precede lane 0's arrival
          if ((threadIdx.x & 31) == 0) mbarrier_arrive(act_full);
          ++tiles_done;
          return;
        }
        if constexpr (TMA) {
          if (!PERSISTENT && threadIdx.x == 0) copy_pre(w);
        }
        const RowScores rs = row_scores(w);
        if constexpr (TMA) mbarrier_wait(pre_full, tiles_done & 1);
        finish(w, rs);
        if constexpr (TMA) {
          store_d_pre_act(w);
          // The stores have read dg and du before the tiles are refilled (persistent) or the
          // block's shared memory goes (one tile); their writes complete with the grid, as
          // CUTLASS's epilogues rely on, so the block need not wait for them.
          if (threadIdx.x == 0) bulk_wait_read();
        }
        if constexpr (PERSISTENT) {
          fence_proxy_async_shared();  // the next tile's g and u come by TMA into what was read here
          __syncwarp();
          if ((threadIdx.x & 31) == 0) mbarrier_arrive(pre_empty);
        }
        ++tiles_done;
      },
      [&](const TokenWork& w) {
        if constexpr (!TMA) gather_row_offsets<BM>(p.routing, w.tile, p.hidden, sm.rows);
      },
      [&](const TokenWork& w) {
        if (kGroup || !tma_thread<kThreads>()) return;
        if (tiles_done > 0) mbarrier_wait_or_trap(pre_empty, (tiles_done - 1) & 1);
        copy_pre(w);
        ++tiles_done;
      },
      group_epilogue, p.routing.expert_tile_offsets[p.expert_begin], p.n_begin);
}

}  // namespace moejit
