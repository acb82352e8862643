// The portable (sm_80+) GEMM building blocks every GEMM role composes: swizzled shared-memory
// tiles, a tile loader with zero fill, the warp-level MMA over one pipeline stage, and the
// multistage cp.async pipeline. A role supplies how tile rows map to global memory and what
// its epilogue does with the fp32 accumulators.
//
// Operand storage in shared memory (16-byte chunks XOR-swizzled per row, conflict-free for
// ldmatrix):
//   K-major  tile [rows = M or N][BK]   (K contiguous, e.g. x rows, weight rows)  -> ldmatrix
//   MN-major tile [BK][cols = M or N]   (M/N contiguous, e.g. token rows as k)    -> ldmatrix.trans
#pragma once

#include "common/mma_sm80.cuh"

namespace moejit {

// ROWS x COLS 16-bit elements, COLS a multiple of 8.
template <int ROWS, int COLS>
struct SmemTile {
  static constexpr int kChunks = COLS / 8;
  static constexpr int kElems = ROWS * COLS;
  static_assert(COLS % 8 == 0, "tile rows are made of 16-byte chunks");

  __device__ __forceinline__ static int swizzle(int row, int chunk) {
    if constexpr (kChunks >= 8) return chunk ^ (row & 7);
    else if constexpr (kChunks == 4) return chunk ^ ((row >> 1) & 3);
    else if constexpr (kChunks == 2) return chunk ^ ((row >> 2) & 1);
    else return chunk;
  }
  // Element offset of (row, col); col's low 3 bits stay inside the chunk.
  __device__ __forceinline__ static int offset(int row, int col) {
    return row * COLS + swizzle(row, col >> 3) * 8 + (col & 7);
  }
};

// Fills a ROWS x COLS tile with values computed per 16-byte chunk: fill(r, col, v) writes the
// 8 elements of tile row r starting at column col into v. Synchronous (plain loads and stores).
template <typename T, int ROWS, int COLS, int THREADS, typename Fill>
__device__ __forceinline__ void fill_tile(T* smem, Fill fill) {
  using Tile = SmemTile<ROWS, COLS>;
  constexpr int kTotal = ROWS * Tile::kChunks;
#pragma unroll
  for (int it = 0; it < (kTotal + THREADS - 1) / THREADS; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * THREADS;
    if (kTotal % THREADS != 0 && idx >= kTotal) break;
    const int r = idx / Tile::kChunks;
    const int col = (idx % Tile::kChunks) * 8;
    uint16 v[8];
    fill(r, col, v);
    uint4 packed;
    packed.x = v[0] | (static_cast<uint32>(v[1]) << 16);
    packed.y = v[2] | (static_cast<uint32>(v[3]) << 16);
    packed.z = v[4] | (static_cast<uint32>(v[5]) << 16);
    packed.w = v[6] | (static_cast<uint32>(v[7]) << 16);
    *reinterpret_cast<uint4*>(smem + Tile::offset(r, col)) = packed;
  }
}

// Loads a ROWS x COLS tile into shared memory. row_src(r) returns the global address of the
// element that lands in column 0 of tile row r, or nullptr to zero the row; `cols_valid` of the
// tile's columns exist in global memory (the rest are zeroed). ALIGNED: rows and column offsets
// are 16-byte aligned and cols_valid is a multiple of 8, so cp.async moves 16 bytes at a time;
// otherwise elements are loaded one by one.
template <typename T, int ROWS, int COLS, int THREADS, bool ALIGNED, typename RowSrc>
__device__ __forceinline__ void load_tile(T* smem, RowSrc row_src, int cols_valid) {
  using Tile = SmemTile<ROWS, COLS>;
  if constexpr (ALIGNED) {
    constexpr int kTotal = ROWS * Tile::kChunks;
#pragma unroll
    for (int it = 0; it < (kTotal + THREADS - 1) / THREADS; ++it) {
      const int idx = static_cast<int>(threadIdx.x) + it * THREADS;
      if (kTotal % THREADS != 0 && idx >= kTotal) break;
      const int r = idx / Tile::kChunks;
      const int col = (idx % Tile::kChunks) * 8;
      const T* src = row_src(r);
      T* dst = smem + Tile::offset(r, col);
      const bool ok = src != nullptr && col < cols_valid;
      cp_async_16(dst, ok ? static_cast<const void*>(src + col) : static_cast<const void*>(smem), ok ? 16 : 0);
    }
  } else {
    fill_tile<T, ROWS, COLS, THREADS>(smem, [&](int r, int col, uint16 (&v)[8]) {
      const uint16* src = reinterpret_cast<const uint16*>(row_src(r));
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = (src != nullptr && col + j < cols_valid) ? src[col + j] : 0;
    });
  }
}

// Warp-level MMA over one BM x BN x BK stage. WM x WN warps; each warp owns a
// (BM/WM) x (BN/WN) block of the fp32 accumulators in mma.sync's C-fragment layout:
// acc[mi][ni][0..1] -> row lane/4, cols 2*(lane%4)+{0,1}; acc[mi][ni][2..3] -> row lane/4 + 8.
template <typename T, int BM, int BN, int BK, int WM, int WN, bool A_KMAJOR, bool B_KMAJOR>
struct WarpMma {
  static constexpr int kWarpM = BM / WM;
  static constexpr int kWarpN = BN / WN;
  static constexpr int kMi = kWarpM / 16;
  static constexpr int kNi = kWarpN / 8;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "warp tiles are multiples of 16x16");
  using ATile = typename Select<A_KMAJOR, SmemTile<BM, BK>, SmemTile<BK, BM>>::type;
  using BTile = typename Select<B_KMAJOR, SmemTile<BN, BK>, SmemTile<BK, BN>>::type;

  float acc[kMi][kNi][4];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.f;
  }

  __device__ __forceinline__ void compute(const T* sa, const T* sb, int warp_m, int warp_n) {
    const int lane = static_cast<int>(threadIdx.x & 31);
    const int m0 = warp_m * kWarpM, n0 = warp_n * kWarpN;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32 a[kMi][4];
      uint32 b[kNi][2];
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) {
        if constexpr (A_KMAJOR) {
          const int row = m0 + mi * 16 + (lane & 15), col = kk + (lane >> 4) * 8;
          ldmatrix_x4<false>(a[mi], smem_u32(sa + ATile::offset(row, col)));
        } else {
          const int row = kk + (lane & 7) + (lane >> 4) * 8, col = m0 + mi * 16 + ((lane >> 3) & 1) * 8;
          ldmatrix_x4<true>(a[mi], smem_u32(sa + ATile::offset(row, col)));
        }
      }
#pragma unroll
      for (int nj = 0; nj < kNi / 2; ++nj) {
        uint32 r[4];
        if constexpr (B_KMAJOR) {
          const int row = n0 + nj * 16 + (lane & 7) + (lane >> 4) * 8, col = kk + ((lane >> 3) & 1) * 8;
          ldmatrix_x4<false>(r, smem_u32(sb + BTile::offset(row, col)));
        } else {
          const int row = kk + (lane & 7) + ((lane >> 3) & 1) * 8, col = n0 + nj * 16 + (lane >> 4) * 8;
          ldmatrix_x4<true>(r, smem_u32(sb + BTile::offset(row, col)));
        }
        b[2 * nj][0] = r[0];
        b[2 * nj][1] = r[1];
        b[2 * nj + 1][0] = r[2];
        b[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni) mma_16816<T>(acc[mi][ni], a[mi], b[ni]);
    }
  }
};

// The multistage pipeline: load(stage, k_tile) issues the cp.asyncs of one k tile into a
// stage; compute(stage) consumes it. STAGES-1 tiles are in flight while one is computed.
template <int STAGES, typename Load, typename Compute>
__device__ __forceinline__ void pipelined_k_loop(int k_tiles, Load load, Compute compute) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile kt landed for every thread; stage (kt-1)%STAGES is free to refill
    const int next = kt + STAGES - 1;
    if (next < k_tiles) load(next % STAGES, next);
    cp_async_commit();
    compute(kt % STAGES);
  }
  cp_async_wait<0>();
  __syncthreads();
}

}  // namespace moejit

namespace moejit {

// Calls f(row, col, v0, v1) for every accumulator pair a warp owns; row and col are tile-local.
template <typename Mma, typename F>
__device__ __forceinline__ void for_each_acc_pair(const Mma& mma, int warp_m, int warp_n, F f) {
  const int lane = static_cast<int>(threadIdx.x & 31);
#pragma unroll
  for (int mi = 0; mi < Mma::kMi; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_m * Mma::kWarpM + mi * 16 + (lane >> 2) + half * 8;
#pragma unroll
      for (int ni = 0; ni < Mma::kNi; ++ni) {
        const int col = warp_n * Mma::kWarpN + ni * 8 + 2 * (lane & 3);
        f(row, col, mma.acc[mi][ni][2 * half], mma.acc[mi][ni][2 * half + 1]);
      }
    }
}

}  // namespace moejit

namespace moejit {

// An output tile staged in shared memory so that global stores are 16-byte, row-contiguous
// and coalesced instead of the 4-byte scattered stores of the mma.sync fragment layout. Rows
// are padded by 8 elements so the fragment writes (8 rows x 16 bytes per warp) hit distinct
// banks. Reuses the pipeline's shared memory once the main loop is done.
template <typename T, int BM, int BN>
struct StagedTile {
  static constexpr int kStride = BN + 8;
  static constexpr int kBytes = BM * kStride * 2;
  T* smem;

  // Two adjacent values of tile row r at columns c, c+1 (c even).
  __device__ __forceinline__ void put(int r, int c, float v0, float v1) const { store_float2(smem + r * kStride + c, v0, v1); }

  // Writes the tile: row_dst(r) is the global address of tile row r's column 0, or nullptr to
  // skip the row; cols_valid columns exist. Call between __syncthreads() (after the puts, and
  // before the tile is reused).
  template <int THREADS, bool ALIGNED, typename RowDst>
  __device__ __forceinline__ void write(RowDst row_dst, int cols_valid) const {
    constexpr int kChunks = BN / 8;
    for (int idx = threadIdx.x; idx < BM * kChunks; idx += THREADS) {
      const int r = idx / kChunks, col = (idx % kChunks) * 8;
      T* dst = row_dst(r);
      if (dst == nullptr || col >= cols_valid) continue;
      const T* src = smem + r * kStride + col;
      if constexpr (ALIGNED) {
        *reinterpret_cast<uint4*>(dst + col) = *reinterpret_cast<const uint4*>(src);
      } else {
        for (int j = 0; j < 8 && col + j < cols_valid; ++j) dst[col + j] = src[j];
      }
    }
  }
};

// Stages every accumulator of `mma` (through value(v), e.g. identity) and writes the tile.
template <typename T, int BM, int BN, int THREADS, bool ALIGNED, typename Mma, typename RowDst>
__device__ __forceinline__ void store_accumulators(void* smem, const Mma& mma, int warp_m, int warp_n, RowDst row_dst,
                                                   int cols_valid) {
  const StagedTile<T, BM, BN> tile{static_cast<T*>(smem)};
  __syncthreads();
  for_each_acc_pair(mma, warp_m, warp_n, [&](int r, int c, float v0, float v1) { tile.put(r, c, v0, v1); });
  __syncthreads();
  tile.template write<THREADS, ALIGNED>(row_dst, cols_valid);
}

}  // namespace moejit
