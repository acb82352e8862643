// The launch parameters of every role for one forward or backward call, derived from the
// caller's pointers and the memory layout. FusedMoe launches them in order; the autotuner
// launches one role at a time with candidate kernels over the same parameters.
#pragma once

#include "moe/kernel_params.hpp"
#include "moe/memory_layout.hpp"
#include "moe/routing.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

struct ForwardSteps {
  RoutingArgs routing;
  std::int32_t* dropped_count;  // device counter of expert ids outside [0, E)
  params::GatherSum scatter_x;  // x into y in sorted order, before a fwd_up that reads x_rows
  params::FwdUp fwd_up;
  params::FwdDown fwd_down;
  params::GatherSum gather_out;  // weighted by the router scores
};

struct BackwardSteps {
  float* ds_acc;  // [TK, score_gradient_slots]: zeroed before bwd_down, which adds into it
  std::size_t ds_count;
  // dO into dx_rows in sorted order, before bwd_down and bwd_dw2 (when they read d_out_rows);
  // bwd_dx overwrites it.
  params::GatherSum scatter_d_out;
  // Over every expert and the first column chunk (all of I unless chunk_columns is less).
  params::BwdDown bwd_down;
  params::BwdDw2 bwd_dw2;
  params::BwdDx bwd_dx;
  params::GatherSum gather_dx;  // unweighted; also writes d_topk_weights
  params::GatherSum scatter_x;  // x into dx_rows once gather_dx has read it, for bwd_dw1's x_rows
  params::BwdDw1 bwd_dw1;
  // dW1 and dW2 are asked for (BackwardArgs: both or neither). Without them bwd_dw2, bwd_dw1 and
  // its scatter of x do not run, bwd_down stores no weighted activation, and it runs whole.
  bool weight_grads;
  // Memory-efficient mode where bwd_dw2 recomputes the activation (memeff_recomputes_act): it
  // reads pre_act, which bwd_down then overwrites, so dW2 runs first.
  bool dw2_first;
  // Experts and columns of I per bwd_down + bwd_dw2 launch pair (memeff_chunk_experts,
  // memeff_chunk_columns): all, or expert_chunk()s.
  int chunk_experts;
  int chunk_columns;
};

// bwd_down and bwd_dw2 over experts first .. first + chunk_experts - 1 alone and columns n_begin
// .. n_begin + chunk_columns - 1 of I (the last chunks may hold fewer), their weighted activation
// stored from its buffer's start.
struct ExpertChunk {
  params::BwdDown bwd_down;
  params::BwdDw2 bwd_dw2;
};
ExpertChunk expert_chunk(const BackwardSteps& s, int first, int n_begin);

ForwardSteps forward_steps(const ForwardArgs& a, const MoeProblem& p, const MemoryLayout& l, int block_m);
BackwardSteps backward_steps(const BackwardArgs& a, const MoeProblem& p, const MemoryLayout& l);

}  // namespace moejit
