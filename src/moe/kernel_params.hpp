// Host mirrors of the kernels' parameter structs in templates/*.cuh, field for field: a kernel
// receives one of these by value (as a __grid_constant__ parameter). Tensor maps are filled
// only for TMA configs, at launch (moe/tensor_maps.hpp).
#pragma once

#include <cstdint>

namespace moejit::params {

// templates/common/tma_sm90.cuh TensorMap: an encoded CUtensorMap, 128-byte aligned on both
// sides whatever alignment the toolkit's cuda.h gives CUtensorMap.
struct alignas(128) TensorMap {
  std::uint64_t opaque[16];
};

struct Routing {  // templates/routing.cuh RoutingParams
  const std::int32_t* topk_ids;
  std::int32_t num_pairs;
  std::int32_t num_experts;
  std::int32_t block_m;
  std::int32_t num_chunks;
  std::int32_t max_tiles;
  std::int32_t scanned;
  std::int32_t* chunk_counts;
  std::int32_t* expert_counts;
  std::int32_t* expert_offsets;
  std::int32_t* expert_tile_offsets;
  std::int32_t* tile_expert;
  std::int32_t* tile_row_begin;
  std::int32_t* sorted_pairs;
  std::int32_t* pair_rows;
  std::int32_t* ranked_experts;  // int4 entries
  std::uint32_t* stamp;
  std::uint32_t stamp_value;
};

struct RoutingView {  // templates/common/moe_tiles.cuh
  const std::int32_t* sorted_pairs;
  const std::int32_t* expert_offsets;
  const std::int32_t* expert_tile_offsets;
  const std::int32_t* tile_expert;
  const std::int32_t* tile_row_begin;
  const std::int32_t* ranked_experts;  // int4 entries
  std::int32_t experts;
  std::int32_t topk;
  std::int32_t max_tiles;
};

struct FwdUp {  // templates/fwd_up.cuh
  const void* x;
  const void* x_rows;
  const void* w1;
  void* act;
  void* pre_act;
  RoutingView routing;
  std::int32_t hidden;
  std::int32_t inter;
  TensorMap w1_map;
  TensorMap x_rows_map;
  TensorMap act_map;
  TensorMap pre_act_map;
};

struct FwdDown {  // templates/fwd_down.cuh
  const void* act;
  const void* w2;
  void* y;
  RoutingView routing;
  std::int32_t hidden;
  std::int32_t inter;
  TensorMap act_map;
  TensorMap w2_map;
  TensorMap y_map;
};

struct GatherSum {  // templates/gather_sum.cuh
  void* rows;
  const void* scores;
  const std::int32_t* pair_rows;
  const std::int32_t* expert_offsets;
  void* tokens;
  const float* ds_acc;
  void* ds_out;
  std::int32_t hidden;
  std::int32_t topk;
  std::int32_t experts;
  std::int32_t ds_slots;
};

struct BwdDown {  // templates/bwd_down.cuh
  const void* d_out;
  const void* d_out_rows;
  const void* w2;
  const void* scores;
  const void* pre_act;
  void* d_pre_act;
  void* weighted_act;
  float* ds_acc;
  RoutingView routing;
  std::int32_t hidden;
  std::int32_t inter;
  TensorMap w2_map;
  TensorMap d_out_rows_map;
  TensorMap pre_act_map;
  TensorMap d_pre_act_map;
  std::int32_t expert_begin;
  std::int32_t weighted_act_rows;
  std::int32_t n_begin, n_end;
  std::int32_t wact_ld;
  std::int32_t ds_slots;
};

struct BwdDw2 {  // templates/bwd_dw2.cuh
  const void* d_out;
  const void* d_out_rows;
  const void* weighted_act;
  const void* pre_act;
  const void* scores;
  void* dw2;
  RoutingView routing;
  std::int32_t hidden;
  std::int32_t inter;
  TensorMap d_out_rows_map;
  TensorMap weighted_act_map;
  TensorMap dw2_map;
  std::int32_t weighted_act_rows;
  std::int32_t n_begin, n_end;
  std::int32_t wact_ld;
};

struct BwdDx {  // templates/bwd_dx.cuh
  const void* d_pre_act;
  const void* w1;
  void* dx_rows;
  RoutingView routing;
  std::int32_t hidden;
  std::int32_t inter;
  TensorMap d_pre_act_map;
  TensorMap w1_map;
  TensorMap dx_rows_map;
};

struct BwdDw1 {  // templates/bwd_dw1.cuh
  const void* d_pre_act;
  const void* x;
  const void* x_rows;
  void* dw1;
  RoutingView routing;
  std::int32_t hidden;
  std::int32_t inter;
  TensorMap d_pre_act_map;
  TensorMap x_rows_map;
  TensorMap dw1_map;
};

struct Fill {  // templates/util.cuh FillParams
  void* out;
  std::int64_t count;
  std::uint64_t seed;
  float lo, hi;
};

struct TopkIds {  // templates/util.cuh TopkIdsParams
  std::int32_t* ids;
  std::int64_t tokens;
  std::int32_t topk, experts;
  std::uint64_t seed;
};

struct RelDiff {  // templates/util.cuh RelDiffParams
  const void* got;
  const void* want;
  std::int64_t count;
  double* sums;
};

}  // namespace moejit::params
