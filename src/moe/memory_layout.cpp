#include "moe/memory_layout.hpp"

#include <algorithm>

#include "tuner/role_traits.hpp"

namespace moejit {
namespace {

// Appends a region to a buffer, returning its offset.
std::size_t place(std::size_t& end, std::size_t bytes) {
  const std::size_t at = end;
  end += (bytes + 255) / 256 * 256;
  return at;
}

}  // namespace

long long dw1_rows_of_inter(const MoeShape& s) { return 2LL * s.experts * s.hidden; }

bool memeff_recomputes_act(const MoeShape& s, Mode mode) {
  return mode == Mode::kMemoryEfficient && s.pairs() > dw1_rows_of_inter(s) && s.tokens > dw1_rows_of_inter(s);
}

int memeff_chunk_experts(const MoeShape& s, Mode mode) {
  if (mode != Mode::kMemoryEfficient || s.pairs() <= dw1_rows_of_inter(s) || memeff_recomputes_act(s, mode)) {
    return s.experts;
  }
  return static_cast<int>(std::min<long long>(s.experts, dw1_rows_of_inter(s) / s.tokens));
}

MemoryLayout memory_layout(const MoeShape& s, Mode mode, int block_m) {
  MemoryLayout l;
  const std::size_t tk = static_cast<std::size_t>(s.pairs());
  const std::size_t h = s.hidden, i = s.intermediate, elt = 2;
  l.routing = routing_layout(s.pairs(), s.experts, block_m);
  l.routing_in_saved = mode != Mode::kInference;

  if (l.routing_in_saved) {
    l.routing_offset = place(l.saved_bytes, l.routing.total_bytes);
    l.pre_act = place(l.saved_bytes, tk * 2 * i * elt);
  }
  l.act = place(l.forward_bytes, tk * i * elt);
  l.y = place(l.forward_bytes, tk * h * elt);
  if (!l.routing_in_saved) l.routing_offset = place(l.forward_bytes, l.routing.total_bytes);

  if (mode != Mode::kInference) {
    l.ds_acc = place(l.backward_bytes, tk * sizeof(float));
    l.dx_rows = place(l.backward_bytes, tk * h * elt);
    if (mode == Mode::kTraining) {
      l.d_pre_act = place(l.backward_bytes, tk * 2 * i * elt);
      l.weighted_act = place(l.backward_bytes, tk * i * elt);
    }
    l.weighted_act_in_dw1 = mode == Mode::kMemoryEfficient && !memeff_recomputes_act(s, mode);
    l.weighted_act_rows = l.weighted_act_in_dw1 ? std::min<std::size_t>(tk, dw1_rows_of_inter(s)) : tk;
    l.chunk_experts = memeff_chunk_experts(s, mode);
  }
  return l;
}

MemoryLayout memory_layout(const MoeProblem& p) {
  const MoeShape shape = shape_of(p);
  return memory_layout(shape, p.mode, token_block_m(shape));
}

}  // namespace moejit
