#include "moe/steps.hpp"

#include <algorithm>

namespace moejit {
namespace {

char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

// gather_sum's scatter of `tokens` [T, H] into `rows` [TK, H] in sorted order (the kernel
// only reads `tokens`).
params::GatherSum scatter(const void* tokens, void* rows, const RoutingBuffers& b, const MoeProblem& p) {
  return {rows, nullptr, b.pair_rows, b.expert_offsets, const_cast<void*>(tokens), nullptr, nullptr,
          p.hidden, p.topk, p.experts};
}

params::RoutingView routing_view(const RoutingBuffers& b, const MoeProblem& p, const MemoryLayout& l) {
  return {b.sorted_pairs,   b.expert_offsets, b.expert_tile_offsets, b.tile_expert,
          b.tile_row_begin, b.ranked_experts,   p.experts,             p.topk,
          static_cast<std::int32_t>(l.routing.max_tiles)};
}

}  // namespace

ForwardSteps forward_steps(const ForwardArgs& a, const MoeProblem& p, const MemoryLayout& l, int block_m) {
  void* routing_base = l.routing_in_saved ? at(a.saved, l.routing_offset) : at(a.workspace, l.routing_offset);
  const RoutingBuffers rb = routing_buffers(reinterpret_cast<CUdeviceptr>(routing_base), l.routing);
  const params::RoutingView view = routing_view(rb, p, l);
  const std::int32_t h = p.hidden, i = p.intermediate;
  void* act = at(a.workspace, l.act);
  void* y = at(a.workspace, l.y);
  void* pre_act = l.pre_act == MemoryLayout::kNone ? nullptr : at(a.saved, l.pre_act);
  ForwardSteps s{};
  s.routing = {reinterpret_cast<CUdeviceptr>(a.topk_ids), p.tokens, p.topk, p.experts, block_m,
               reinterpret_cast<CUdeviceptr>(routing_base), l.routing.total_bytes,
               reinterpret_cast<CUstream>(a.stream), p.mode != Mode::kInference};
  s.dropped_count = rb.expert_counts + p.experts;
  s.scatter_x = scatter(a.x, y, rb, p);
  s.fwd_up = {a.x, y, a.w1, act, pre_act, view, h, i};
  s.fwd_down = {act, a.w2, y, view, h, i};
  s.gather_out = {y, a.topk_weights, rb.pair_rows, rb.expert_offsets, a.out, nullptr, nullptr, h, p.topk, p.experts};
  return s;
}

BackwardSteps backward_steps(const BackwardArgs& a, const MoeProblem& p, const MemoryLayout& l) {
  const RoutingBuffers rb = routing_buffers(reinterpret_cast<CUdeviceptr>(at(a.saved, l.routing_offset)), l.routing);
  const params::RoutingView view = routing_view(rb, p, l);
  const std::int32_t h = p.hidden, i = p.intermediate;
  const bool memeff = p.mode == Mode::kMemoryEfficient;
  void* pre_act = at(a.saved, l.pre_act);
  void* d_pre_act = memeff ? pre_act : at(a.workspace, l.d_pre_act);
  const bool weight_grads = a.dw1 != nullptr;
  // The chunks exist to fit the weighted activation in dW1's buffer; without dW1 there is none.
  const int chunk_experts = weight_grads ? l.chunk_experts : p.experts;
  const int chunk_columns = weight_grads ? l.chunk_columns : p.intermediate;
  void* weighted_act = !weight_grads            ? nullptr
                       : l.weighted_act_in_dw1 ? a.dw1
                       : memeff                ? nullptr
                                               : at(a.workspace, l.weighted_act);
  void* dx_rows = at(a.workspace, l.dx_rows);
  BackwardSteps s{};
  const int ds_slots = score_gradient_slots(shape_of(p));
  s.ds_acc = reinterpret_cast<float*>(at(a.workspace, l.ds_acc));
  s.ds_count = static_cast<std::size_t>(p.tokens * p.topk) * static_cast<std::size_t>(ds_slots);
  s.scatter_d_out = scatter(a.d_out, dx_rows, rb, p);
  s.bwd_down = {a.d_out, dx_rows, a.w2, a.topk_weights, pre_act, d_pre_act, weighted_act, s.ds_acc, view, h, i};
  s.bwd_dw2 = {a.d_out, dx_rows, weighted_act, pre_act, a.topk_weights, a.dw2, view, h, i};
  s.bwd_down.expert_begin = 0;
  s.bwd_down.weighted_act_rows = s.bwd_dw2.weighted_act_rows = static_cast<std::int32_t>(l.weighted_act_rows);
  s.bwd_down.n_begin = s.bwd_dw2.n_begin = 0;
  s.bwd_down.n_end = s.bwd_dw2.n_end = chunk_columns;  // the first column chunk's, where there are several
  s.bwd_down.wact_ld = s.bwd_dw2.wact_ld = l.weighted_act_in_dw1 ? chunk_columns : i;
  s.bwd_down.ds_slots = ds_slots;
  s.chunk_experts = chunk_experts;
  s.chunk_columns = chunk_columns;
  s.bwd_dx = {d_pre_act, a.w1, dx_rows, view, h, i};
  s.gather_dx = {dx_rows, nullptr, rb.pair_rows, rb.expert_offsets, a.dx, s.ds_acc, a.d_topk_weights,
                 h,       p.topk,  p.experts,        ds_slots};
  // a.x may be null without weight gradients, which alone run these two.
  s.scatter_x = scatter(a.x, dx_rows, rb, p);
  s.bwd_dw1 = {d_pre_act, a.x, dx_rows, a.dw1, view, h, i};
  s.weight_grads = weight_grads;
  s.dw2_first = weight_grads && memeff && !l.weighted_act_in_dw1;  // it reads pre_act before bwd_down overwrites it
  return s;
}

ExpertChunk expert_chunk(const BackwardSteps& s, int first, int n_begin) {
  ExpertChunk c{s.bwd_down, s.bwd_dw2};
  const int end = std::min(first + s.chunk_experts, s.bwd_dw2.routing.experts);
  c.bwd_down.n_begin = c.bwd_dw2.n_begin = n_begin;
  c.bwd_down.n_end = c.bwd_dw2.n_end = std::min(n_begin + s.chunk_columns, s.bwd_dw2.inter);
  c.bwd_down.expert_begin = first;
  c.bwd_down.routing.experts = end;
  c.bwd_dw2.routing.experts = end - first;
  c.bwd_dw2.routing.expert_offsets += first;
  // The ranking covers all E experts, not a chunk's: a chunk takes its experts in id order.
  if (end - first < s.bwd_dw2.routing.experts) c.bwd_dw2.routing.ranked_experts = nullptr;
  constexpr std::size_t kElem = 2;  // bf16 and fp16
  c.bwd_dw2.dw2 = static_cast<char*>(c.bwd_dw2.dw2) +
                  static_cast<std::size_t>(first) * s.bwd_dw2.hidden * s.bwd_dw2.inter * kElem;
  return c;
}

}  // namespace moejit
