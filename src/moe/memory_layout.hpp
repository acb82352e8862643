// Where every intermediate lives in the three caller-provided buffers (saved state, forward
// workspace, backward workspace). Pure; offsets are 256-byte aligned.
//
//   saved (training modes)  routing outputs | pre_act [TK, 2I]
//   forward workspace        act [TK, I] | y [TK, H] | routing (inference only)
//   backward workspace       ds_acc [TK] fp32 | dx_rows [TK, H] | d_pre_act [TK, 2I] and
//                            weighted_act [TK, I] (default mode; memory-efficient mode writes
//                            d_pre_act over pre_act and recomputes the weighted activation)
#pragma once

#include <cstddef>

#include "moe/routing_layout.hpp"
#include "moe/shape.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

struct MemoryLayout {
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  RoutingLayout routing;
  bool routing_in_saved = true;  // false in inference: routing lives in the forward workspace
  std::size_t routing_offset = 0;
  std::size_t pre_act = kNone;
  std::size_t saved_bytes = 0;

  std::size_t act = 0, y = 0;
  std::size_t forward_bytes = 0;

  std::size_t ds_acc = kNone, dx_rows = kNone, d_pre_act = kNone, weighted_act = kNone;
  std::size_t backward_bytes = 0;
};

MemoryLayout memory_layout(const MoeShape& shape, Mode mode, int block_m);

// The layout a FusedMoe of this (validated) problem uses: the token tile height is
// token_block_m(). Pure, so callers (the C ABI, PyTorch's fake tensors) size buffers without a GPU.
MemoryLayout memory_layout(const MoeProblem& problem);

}  // namespace moejit
