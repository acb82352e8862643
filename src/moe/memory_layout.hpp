// Where every intermediate lives in the three caller-provided buffers (saved state, forward
// workspace, backward workspace). Pure; offsets are 256-byte aligned.
//
//   saved (training modes)  routing outputs | pre_act [TK, 2I] | stamp (256 B, SavedStates)
//   forward workspace        act [TK, I] | y [TK, H] | routing (inference only)
//   backward workspace       ds_acc [TK, slots] fp32 | dx_rows [TK, H] | d_pre_act [TK, 2I] and,
//                            where TK > 2 E H, weighted_act [TK, I] (default mode: below that
//                            it lives in dW1's buffer; memory-efficient mode writes d_pre_act
//                            over pre_act and keeps weighted_act in dW1's buffer always,
//                            some experts' at a time where all of it does not fit, one expert's
//                            columns some at a time where not even one expert's may, or
//                            recomputes it where not even 256 columns of one expert's fit:
//                            memeff_chunk_experts, memeff_chunk_columns, memeff_recomputes_act)
#pragma once

#include <cstddef>

#include "moe/routing_layout.hpp"
#include "moe/shape.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

struct MemoryLayout {
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  static constexpr std::size_t kStampBytes = 256;

  RoutingLayout routing;
  bool routing_in_saved = true;  // false in inference: routing lives in the forward workspace
  std::size_t routing_offset = 0;
  std::size_t pre_act = kNone;
  std::size_t stamp = kNone;  // the forward's last write (saved_states.hpp: state_stamp)
  std::size_t saved_bytes = 0;

  std::size_t act = 0, y = 0;
  std::size_t forward_bytes = 0;

  std::size_t ds_acc = kNone, dx_rows = kNone, d_pre_act = kNone, weighted_act = kNone;
  std::size_t backward_bytes = 0;
  // bwd_down writes weighted_act into the caller's dW1, which nothing reads and bwd_dw1 writes
  // last, and bwd_dw2 reads it there (training's kernels, in training's order), chunk_experts
  // experts at a time. Training mode: where it fits whole (TK <= 2 E H). Memory-efficient mode:
  // unless bwd_dw2 recomputes it.
  bool weighted_act_in_dw1 = false;
  std::size_t weighted_act_rows = 0;  // rows of chunk_columns elements where weighted_act lives (backward)
  int chunk_experts = 0;              // experts per bwd_down + bwd_dw2 launch pair (backward)
  int chunk_columns = 0;              // columns of I per launch pair (backward): I, or fewer
};

// The rows of I elements that dW1's [E, 2I, H] buffer holds: 2 E H.
long long dw1_rows_of_inter(const MoeShape& shape);

// Columns of I per bwd_down + bwd_dw2 launch pair in the backward: all I, except in
// memory-efficient mode where not even one expert's weighted activation (up to T rows, for
// tokens that name it once) need fit in dW1's buffer (TK > 2 E H and T > 2 E H): then the
// multiple of 256 columns whose T rows fit (every config's BLOCK_N divides it, so no tile
// straddles two launches), or 0 where not even 256 do. dW2's columns are those of I, so each
// launch pair writes whole columns of dW2, as the default mode does.
int memeff_chunk_columns(const MoeShape& shape, Mode mode);

// Whether memory-efficient mode's bwd_dw2 recomputes the weighted activation from pre_act (its
// fused-activation variant, which recomputes each element once per row tile of dW2 and ran 5.8x
// slower than training's dW2 at T=8192) because not even 256 columns of one expert's rows fit
// in dW1's buffer (memeff_chunk_columns is 0). Always false in the other modes.
bool memeff_recomputes_act(const MoeShape& shape, Mode mode);

// Experts per bwd_down + bwd_dw2 launch pair in the backward: all of them, except in
// memory-efficient mode where the weighted activation of every pair (TK rows) does not fit in
// dW1's buffer but one expert's (at most T rows, for tokens that name it once) does: then
// 2 E H / T of them, each launch pair's rows stored from the buffer's start; and one where
// even one expert's does not fit (column chunks, memeff_chunk_columns).
int memeff_chunk_experts(const MoeShape& shape, Mode mode);

// bwd_down's fp32 slots per pair for the score gradient, one per 64 columns of I, which
// gather_sum adds up in order (templates/bwd_down.cuh, kDsSlotColumns): ceil(I / 64).
int score_gradient_slots(const MoeShape& shape);

MemoryLayout memory_layout(const MoeShape& shape, Mode mode, int block_m);

// The layout a FusedMoe of this (validated) problem uses: the token tile height is
// token_block_m(). Pure, so callers (the C ABI, PyTorch's fake tensors) size buffers without a GPU.
MemoryLayout memory_layout(const MoeProblem& problem);

}  // namespace moejit
