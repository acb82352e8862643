// The Hopper (sm_90a) warpgroup MMA: wgmma.mma_async reading both operands from shared memory
// through matrix descriptors, fp32 accumulators in registers. WgmmaMma has WarpMma's interface
// (common/gemm_sm80.cuh), so every GEMM role runs on either, in the multistage main loop or,
// WS, the warp-specialized one (common/pipeline_sm90.cuh); the tiles are filled by the same
// cp.async loaders, in the layouts wgmma's descriptors describe:
//   K-major  SmemTile<rows, BK>: BK = 64 / 32 -> rows of 128 / 64 bytes; SmemTile's XOR swizzle
//            is exactly wgmma's 128B / 64B swizzle when the tile starts 1024-byte aligned.
//            BK = 128: KPanelTile, two such 64-column tiles side by side ([BK/64][rows][64]).
//   MN-major PanelTile<BK, cols>: 64-column panels [cols/64][BK][64], 128B swizzle.
#pragma once

#include "common/gemm_sm80.cuh"
#include "common/pipeline_sm90.cuh"

namespace moejit {

// BK x COLS tile of an MN-major operand (COLS contiguous in global memory) as 64-column panels.
template <int ROWS, int COLS>
struct PanelTile : TileDims<ROWS, COLS> {
  static constexpr int kPanelElems = ROWS * 64;
  static_assert(COLS % 64 == 0 && ROWS % 8 == 0, "panels are 64 columns by a multiple of 8 rows");

  __device__ __forceinline__ static int offset(int row, int col) {
    return (col >> 6) * kPanelElems + row * 64 + ((((col & 63) >> 3) ^ (row & 7)) << 3) + (col & 7);
  }
};

// ROWS x COLS tile of a K-major operand deeper than one 128-byte swizzle row (COLS = BLOCK_K =
// 128) as COLS / 64 panels of SmemTile<ROWS, 64>.
template <int ROWS, int COLS>
struct KPanelTile : TileDims<ROWS, COLS> {
  static constexpr int kPanelElems = ROWS * 64;
  static_assert(COLS % 64 == 0, "panels are 64 columns");

  __device__ __forceinline__ static int offset(int row, int col) {
    return (col >> 6) * kPanelElems + SmemTile<ROWS, 64>::offset(row, col & 63);
  }
};

// The K-major layout of a ROWS x BK tile: one swizzle row per tile row up to BK = 64, panels
// beyond.
template <int ROWS, int BK>
using KMajorTile = typename Select<(BK > 64), KPanelTile<ROWS, BK>, SmemTile<ROWS, BK>>::type;

// Shared-memory matrix descriptor: start address, leading and stride byte offsets (16-byte
// units), swizzle mode (1 = 128B, 2 = 64B, 3 = 32B).
__device__ __forceinline__ uint64 wgmma_desc(const void* smem, uint32 lbo_bytes, uint32 sbo_bytes, uint32 swizzle) {
  const uint64 addr = smem_u32(smem);
  return ((addr & 0x3FFFF) >> 4) | (static_cast<uint64>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64>(sbo_bytes >> 4) << 32) | (static_cast<uint64>(swizzle) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// wgmma m64nNk16 with fp32 accumulation: Wgmma<N, T>::run<TA, TB>(d, desc_a, desc_b, scale_d),
// TA / TB = 1 for an MN-major (transposed) operand, scale_d = 0 to overwrite d instead of adding. The operand lists are written out because inline
// asm takes only literal strings.
template <int N, typename T>
struct Wgmma;

#define MOEJIT_WGMMA_N64(TYPE, PTX)                                                                                        \
  template <>                                                                                                              \
  struct Wgmma<64, TYPE> {                                                                                                 \
    template <int TA, int TB>                                                                                              \
    __device__ __forceinline__ static void run(float (&d)[32], uint64 da, uint64 db, uint32 scale_d) {                                     \
      asm volatile(                                                                                                        \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                     \
          "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " {"                                                   \
          "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23,"  \
          "%24, %25, %26, %27, %28, %29, %30, %31"                                                                         \
          "}, %32, %33, p, 1, 1, %35, %36;\n}\n"                                                                           \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),            \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),                       \
          "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),                       \
          "+f"(d[30]), "+f"(d[31])                                                                                         \
          : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB)                                                                     \
          : "memory");                                                                                                     \
    }                                                                                                                      \
  };

#define MOEJIT_WGMMA_N128(TYPE, PTX)                                                                                       \
  template <>                                                                                                              \
  struct Wgmma<128, TYPE> {                                                                                                \
    template <int TA, int TB>                                                                                              \
    __device__ __forceinline__ static void run(float (&d)[64], uint64 da, uint64 db, uint32 scale_d) {                                     \
      asm volatile(                                                                                                        \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                                     \
          "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " {"                                                  \
          "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23,"  \
          "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45,"  \
          "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                       \
          "}, %64, %65, p, 1, 1, %67, %68;\n}\n"                                                                           \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),            \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),                       \
          "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),                       \
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),                       \
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),                       \
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),                       \
          "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),                       \
          "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                     \
          : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB)                                                                     \
          : "memory");                                                                                                     \
    }                                                                                                                      \
  };

#define MOEJIT_WGMMA_N256(TYPE, PTX)                                                                                       \
  template <>                                                                                                              \
  struct Wgmma<256, TYPE> {                                                                                                \
    template <int TA, int TB>                                                                                              \
    __device__ __forceinline__ static void run(float (&d)[128], uint64 da, uint64 db, uint32 scale_d) {                                    \
      asm volatile(                                                                                                        \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                                    \
          "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTX "." PTX " {"                                                  \
          "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23,"  \
          "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45,"  \
          "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67,"  \
          "%68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89,"  \
          "%90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109,"  \
          "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"     \
          "}, %128, %129, p, 1, 1, %131, %132;\n}\n"                                                                       \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),            \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),                       \
          "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),                       \
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),                       \
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),                       \
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),                       \
          "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),                       \
          "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),                       \
          "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),                       \
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),                       \
          "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),                       \
          "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),                       \
          "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),                       \
          "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),                \
          "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),                \
          "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),                \
          "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])                 \
          : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB)                                                                     \
          : "memory");                                                                                                     \
    }                                                                                                                      \
  };

MOEJIT_WGMMA_N64(bf16, "bf16")
MOEJIT_WGMMA_N64(fp16, "f16")
MOEJIT_WGMMA_N128(bf16, "bf16")
MOEJIT_WGMMA_N128(fp16, "f16")
MOEJIT_WGMMA_N256(bf16, "bf16")
MOEJIT_WGMMA_N256(fp16, "f16")
#undef MOEJIT_WGMMA_N64
#undef MOEJIT_WGMMA_N128
#undef MOEJIT_WGMMA_N256

// WARPS / 4 warpgroups, WGM of them along M; each owns a (BM / WGM) x (BN / (groups / WGM))
// block of the accumulators, issued as m64 x N wgmmas. Fragment layout per m64 block: as
// mma.sync's C fragment, warp w of the warpgroup holding rows 16w..16w+15. WARPS counts the
// MMA warps; WS: the stages are filled by a producer warpgroup instead of these warps.
template <typename T, int BM, int BN, int BK, int WARPS, int WGM, bool A_KMAJOR, bool B_KMAJOR, bool WS>
struct WgmmaMma {
  static constexpr int kGroups = WARPS / 4;
  static constexpr int kGroupsN = kGroups / WGM;
  static constexpr int kGroupRows = BM / WGM;
  static constexpr int kMi = kGroupRows / 64;  // m64 blocks per warpgroup
  static constexpr int kWarpN = BN / kGroupsN;  // output columns one warpgroup owns: wgmma's N
  static constexpr int kNi = kWarpN / 8;
  static constexpr int kInFlight = 1;  // one k tile's wgmmas stay in flight across compute()
  using Element = T;
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kLoaders = WS ? kProducerThreads : kThreads;
  static constexpr bool kWarpSpecialized = WS;
  static_assert(WARPS % 4 == 0 && kGroups % WGM == 0 && kGroupRows % 64 == 0, "warpgroups tile BM by 64 rows");
  static_assert(kWarpN == 64 || kWarpN == 128 || kWarpN == 256, "wgmma N per warpgroup is 64, 128 or 256");
  static_assert(BK == 32 || BK == 64 || BK == 128, "K-major rows of 64 or 128 bytes (64B / 128B swizzle), or two");
  using ATile = typename Select<A_KMAJOR, KMajorTile<BM, BK>, PanelTile<BK, BM>>::type;
  using BTile = typename Select<B_KMAJOR, KMajorTile<BN, BK>, PanelTile<BK, BN>>::type;

  // A persistent loop's token tile of at most 64 rows costs two warpgroups along M a whole
  // tile's time, the second's rows all padding, whether it issues its MMAs or not (sessions
  // 14-15). Such a tile may be split along K instead (`split`, set per work item by the
  // schedule, persistent_main_loop): both warpgroups multiply its first 64 rows, over alternate
  // k tiles, and fold_split() adds the second's partial sums into the first's.
  static constexpr bool kCanSplit = kGroups == 2 && kGroupsN == 1 && kMi == 1;
  // Where the warpgroups split N instead, each holding two m64 blocks (512-thread blocks, whose
  // registers allow no n256 wgmma), such a tile's second blocks are all padding: both warpgroups
  // issue their first block's wgmmas alone, and there is nothing to fold.
  static constexpr bool kCanHalve = kGroupsN == kGroups && kMi == 2;
  static constexpr int kAccumulators = kMi * kNi * 4;

  float acc[kMi][kNi][4];
  int m0, n0;  // this warpgroup's first tile row and column
  bool split = false;  // this work item is split (kCanSplit) or halved (kCanHalve)

  __device__ __forceinline__ WgmmaMma() {
    const int group = static_cast<int>(threadIdx.x / 128);
    m0 = (group / kGroupsN) * kGroupRows;
    n0 = (group % kGroupsN) * kWarpN;
  }

  __device__ __forceinline__ void set_split(bool s) { split = (kCanSplit || kCanHalve) && s; }
  // A split item's fold, in every MMA thread once its main loop is done: the second warpgroup's
  // partial sums go through `scratch` (kAccumulators / CHUNKS floats per thread of a warpgroup,
  // free) into the first's, whose thread t holds the same rows and columns as the second's thread
  // t, in CHUNKS passes over the columns. The first then holds the tile's 64 rows; the second's
  // accumulators (its rows 64 on, past the tile's) are left as they are. The scratch is free
  // again on return.
  template <int THREADS, int CHUNKS = 1>
  __device__ __forceinline__ void fold_split(float* scratch) {
    static_assert(kNi % CHUNKS == 0, "whole n8 blocks per pass");
    constexpr int kChunkNi = kNi / CHUNKS;
    if (!kCanSplit || !split) return;
    const int t = static_cast<int>(threadIdx.x & 127);
    const bool second = threadIdx.x >= 128;
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; ++chunk) {
      if (second) {
#pragma unroll
        for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
          for (int ni = 0; ni < kChunkNi; ++ni)
#pragma unroll
            for (int j = 0; j < 4; ++j) scratch[((mi * kChunkNi + ni) * 4 + j) * 128 + t] = acc[mi][chunk * kChunkNi + ni][j];
      }
      sync_mma_threads<THREADS>();
      if (!second) {
#pragma unroll
        for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
          for (int ni = 0; ni < kChunkNi; ++ni)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[mi][chunk * kChunkNi + ni][j] += scratch[((mi * kChunkNi + ni) * 4 + j) * 128 + t];
      }
      sync_mma_threads<THREADS>();
    }
  }

  __device__ __forceinline__ int row(int mi, int half) const {
    return m0 + mi * 64 + static_cast<int>((threadIdx.x & 127) >> 5) * 16 + static_cast<int>((threadIdx.x & 31) >> 2) +
           half * 8;
  }
  __device__ __forceinline__ int col(int ni) const { return n0 + ni * 8 + 2 * static_cast<int>(threadIdx.x & 3); }

  __device__ __forceinline__ void zero() { zero_fragments(acc); }
  // Ends the accumulators' values without an instruction: the next compute(..., false) overwrites
  // them, and ptxas, which sees the wgmmas read them, otherwise keeps them live through the last
  // tile's epilogue (124 bytes of spills in bwd_down's).
  __device__ __forceinline__ void discard() {
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) {
        asm("" : "=f"(acc[mi][ni][0]), "=f"(acc[mi][ni][1]), "=f"(acc[mi][ni][2]), "=f"(acc[mi][ni][3]));
      }
  }

  // A K-major tile's swizzle row (up to BK = 64 elements; panels beyond), in elements and bytes.
  static constexpr int kRow = BK < 64 ? BK : 64;
  static constexpr uint32 kRowBytes = kRow * 2;
  // Descriptor of a whole A or B tile in shared memory.
  template <bool KMAJOR>
  __device__ __forceinline__ static uint64 tile_desc(const T* tile) {
    if constexpr (KMAJOR) return wgmma_desc(tile, 16, 8 * kRowBytes, kRowBytes == 128 ? 1 : 2);
    else return wgmma_desc(tile, BK * 128, 1024, 1);
  }
  // 16-byte units from a tile's start to its 64 x 16 (A) or N x 16 (B) operand slice at tile row /
  // column `first` and reduction index kk.
  template <typename Tile, bool KMAJOR>
  __device__ __forceinline__ static uint32 slice_units(int first, int kk) {
    constexpr int kUnit = 16 / static_cast<int>(sizeof(T));
    if constexpr (KMAJOR) return ((kk / kRow) * Tile::kRows * kRow + first * kRow + kk % kRow) / kUnit;
    else return ((first / 64) * Tile::kPanelElems + kk * 64) / kUnit;
  }
  // A slice's descriptor is its tile's with the slice's offset added to the start address field,
  // the low 14 bits (16-byte units below 256 KB: the sum never carries out of them). Built from a
  // base computed once per k tile, each wgmma's descriptors cost a 32-bit add, where a pointer
  // conversion and a rebuilt descriptor cost about 25 instructions: with n128 wgmmas, a share of
  // the issue slots the epilogue warpgroup needed (ncu, session 17).
  // accumulate false: a tile's first k tile, whose wgmmas overwrite the accumulators (scale-d 0)
  // where zero() took an instruction per two of them (64 per tile at 64 x 256: 4 % of bwd_dw1's
  // warp samples at T=1024, where a tile has two k tiles).
  // a_row0: the first A row this warpgroup multiplies, m0 but in a split item (0); MI: the m64
  // blocks it multiplies, kMi but in a halved item (1); K_ROWS: the k rows of the tile to
  // multiply, a multiple of 16 (the k16 steps past them are not issued).
  __device__ __forceinline__ void compute(const T* sa, const T* sb, bool accumulate) { compute(sa, sb, accumulate, m0); }
  template <int MI = kMi, int K_ROWS = BK>
  __device__ __forceinline__ void compute(const T* sa, const T* sb, bool accumulate, int a_row0) {
    const uint64 a = tile_desc<A_KMAJOR>(sa), b = tile_desc<B_KMAJOR>(sb);
    const uint32 a_lo = static_cast<uint32>(a) + slice_units<ATile, A_KMAJOR>(a_row0, 0);
    const uint32 b_lo = static_cast<uint32>(b) + slice_units<BTile, B_KMAJOR>(n0, 0);
    const uint64 a_hi = a & ~0xFFFFFFFFull, b_hi = b & ~0xFFFFFFFFull;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K_ROWS; kk += 16) k_step<MI>(kk, a_hi, a_lo, b_hi, b_lo, accumulate);
    wgmma_commit();
    wgmma_wait<kInFlight>();
  }

  // compute() of a k tile whose first k_rows rows alone are the tile's (kWholeKTile: all; the
  // rows up to the next k16 step zeroed), as STEPS k16 steps or fewer. Each count is a compute()
  // of its own, so that every wgmma group is branch-free: a branch between the wgmmas makes ptxas
  // fence each alone (the accumulators' earlier wgmmas complete first) and close the group with
  // an empty wgmma, which cost bwd_dw1 10 % at the Mixtral shape (16 k tiles a tile).
  template <int MI = kMi, int STEPS = BK / 16>
  __device__ __forceinline__ void compute_k_rows(const T* sa, const T* sb, bool accumulate, int a_row0, int k_rows) {
    if constexpr (STEPS == 1) {
      compute<MI, 16>(sa, sb, accumulate, a_row0);
    } else if (k_rows > 16 * (STEPS - 1)) {
      compute<MI, 16 * STEPS>(sa, sb, accumulate, a_row0);
    } else {
      compute_k_rows<MI, STEPS - 1>(sa, sb, accumulate, a_row0, k_rows);
    }
  }

  // compute()'s wgmmas of the k16 step at kk, from the descriptors' high and low halves.
  template <int MI>
  __device__ __forceinline__ void k_step(int kk, uint64 a_hi, uint32 a_lo, uint64 b_hi, uint32 b_lo, bool accumulate) {
    const uint64 db = b_hi | (b_lo + slice_units<BTile, B_KMAJOR>(0, kk));
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      const uint64 da = a_hi | (a_lo + slice_units<ATile, A_KMAJOR>(mi * 64, kk));
      Wgmma<kWarpN, T>::template run<A_KMAJOR ? 0 : 1, B_KMAJOR ? 0 : 1>(
          reinterpret_cast<float(&)[kWarpN / 2]>(acc[mi]), da, db, kk > 0 || accumulate ? 1u : 0u);
    }
  }

  __device__ __forceinline__ void drain() { wgmma_wait<0>(); }
};

}  // namespace moejit
