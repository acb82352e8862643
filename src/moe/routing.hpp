// Host side of the routing role: argument checks and the launches (two, or one when a single
// chunk covers all pairs), on the caller's stream, without synchronising.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "jit/loaded_kernel.hpp"
#include "moe/routing_layout.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

struct RoutingArgs {
  CUdeviceptr topk_ids = 0;  // int32 [tokens, topk]
  long long tokens = 0;
  int topk = 0;
  int experts = 0;
  int block_m = 0;           // GEMM tile rows the tile table is built for
  CUdeviceptr workspace = 0;
  std::size_t workspace_bytes = 0;  // at least routing_layout(...).total_bytes
  CUstream stream = nullptr;
  bool rank_experts = false;  // write ranked_experts, which the dW roles' grids read (training)
};

// Device pointers of the routing outputs inside a workspace.
struct RoutingBuffers {
  std::int32_t* chunk_counts;
  std::int32_t* expert_counts;
  std::int32_t* expert_offsets;
  std::int32_t* expert_tile_offsets;
  std::int32_t* tile_expert;
  std::int32_t* tile_row_begin;
  std::int32_t* sorted_pairs;
  std::int32_t* pair_rows;
  std::int32_t* ranked_experts;  // [E] x 4
};

RoutingBuffers routing_buffers(CUdeviceptr workspace, const RoutingLayout& layout);

// Throws InvalidArgument naming the offending argument; returns the workspace layout the
// arguments need.
RoutingLayout validate_routing_args(const RoutingArgs& args);

// Enqueues routing with a loaded routing kernel of config `config`, into `queue` where given (a
// call's graph), else onto args.stream.
void launch_routing(const jit::LoadedKernel& kernel, const TileConfig& config, const RoutingArgs& args,
                    cuda::WorkQueue* queue = nullptr);

// A saved state's routing tables, as a forward of (pairs, experts, block_m) wrote them at
// `tables`, laid out as `layout` (routing_layout of the same three), with its expert ranking
// (training's).
struct RoutingCheckArgs {
  CUdeviceptr tables = 0;
  RoutingLayout layout;
  long long pairs = 0;
  int experts = 0;
  int block_m = 0;
  CUdeviceptr stamp = 0;            // the state's stamp (MemoryLayout::stamp)
  std::uint32_t stamp_value = 0;    // state_stamp of its problem
  CUstream stream = nullptr;
};

// Enqueues the routing kernel's check phase: where a table holds anything a forward would not
// have written, and the stamp's first word is stamp_value, that word becomes kDamagedStamp.
void launch_routing_check(const jit::LoadedKernel& kernel, const TileConfig& config, const RoutingCheckArgs& args);

}  // namespace moejit
