// What a GEMM role includes: the loaders, main loop and epilogue helpers, and the choice of
// MMA. WGMMA selects the Hopper warpgroup MMA (sm_90a configs, tuner/config_space.cpp);
// otherwise the portable mma.sync path. WM counts warps along M for mma.sync and warpgroups
// along M for wgmma (tuner/role_traits.cpp, gemm_warp_rows).
#pragma once

#include "common/gemm_sm80.cuh"
#include "common/wgmma_sm90.cuh"

namespace moejit {

template <bool WGMMA, typename T, int BM, int BN, int BK, int WARPS, int WM, bool A_KMAJOR, bool B_KMAJOR>
using GemmMma = typename Select<WGMMA, WgmmaMma<T, BM, BN, BK, WARPS, WM, A_KMAJOR, B_KMAJOR>,
                                WarpMma<T, BM, BN, BK, WM, WARPS / WM, A_KMAJOR, B_KMAJOR>>::type;

}  // namespace moejit
