// TMA tensor maps (templates/common/tma_sm90.cuh) of the GEMM roles: how each role
// views the tensors it copies with TMA and the box one copy moves at a config (pure), and their
// encoding through the driver into the role's parameters at launch.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jit/role.hpp"
#include "moe/shape.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

struct TensorMapSpec {
  int rank = 0;
  std::array<std::uint64_t, 4> dims{};     // elements, innermost first
  std::array<std::uint64_t, 3> strides{};  // bytes between consecutive indices of dims 1..rank-1
  std::array<std::uint32_t, 4> box{};      // elements one copy moves, per dimension
  int swizzle_bytes = 0;                   // 64 or 128: the box's rows, swizzled as wgmma reads them

  friend bool operator==(const TensorMapSpec&, const TensorMapSpec&) = default;
};

// What the driver would reject in a spec (its documented limits for tiled maps of 16-bit
// elements: dims 1..2^32, strides multiples of 16 below 2^40, boxes of 1..256 with an inner row
// of at most the swizzle span), or nullopt.
std::optional<std::string> tensor_map_problem(const TensorMapSpec& spec);

// The maps a TMA config of `role` reads, in the order of the map fields of the role's parameter
// struct (src/moe/kernel_params.hpp). Throws InternalError for roles or configs without TMA and
// for maps tensor_map_problem() rejects (pruning keeps such configs out of every plan).
std::vector<TensorMapSpec> tensor_map_specs(Role role, const TileConfig& config, const MoeShape& shape);

// For a TMA config: encodes tensor_map_specs over the tensors `params` (the role's params::
// struct) points to, into its map fields. Nothing for other configs. Throws CudaError when the
// driver rejects a map.
void bind_tensor_maps(Role role, const TileConfig& config, const MoeShape& shape, void* params);

}  // namespace moejit
