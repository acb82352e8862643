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

namespace {

// Memory-efficient mode where one expert's weighted activation (up to T rows of I) may not fit.
bool expert_may_not_fit(const MoeShape& s, Mode mode) {
  return mode == Mode::kMemoryEfficient && s.pairs() > dw1_rows_of_inter(s) && s.tokens > dw1_rows_of_inter(s);
}

}  // namespace

int memeff_chunk_columns(const MoeShape& s, Mode mode) {
  if (!expert_may_not_fit(s, mode)) return static_cast<int>(s.intermediate);
  constexpr long long kStep = 256;  // the widest BLOCK_N
  // dW1's buffer holds 2 E H I elements: T rows of c columns fit where T c <= 2 E H I. Here
  // 2 E H < T < 2^31 and I < 2^28, so the product stays below 2^59.
  const long long columns = dw1_rows_of_inter(s) * s.intermediate / s.tokens / kStep * kStep;
  return columns < kStep ? 0 : static_cast<int>(std::min<long long>(columns, s.intermediate));
}

bool memeff_recomputes_act(const MoeShape& s, Mode mode) {
  return expert_may_not_fit(s, mode) && memeff_chunk_columns(s, mode) == 0;
}

int memeff_chunk_experts(const MoeShape& s, Mode mode) {
  if (mode != Mode::kMemoryEfficient || s.pairs() <= dw1_rows_of_inter(s) || memeff_recomputes_act(s, mode)) {
    return s.experts;
  }
  if (expert_may_not_fit(s, mode)) return 1;
  return static_cast<int>(std::min<long long>(s.experts, dw1_rows_of_inter(s) / s.tokens));
}

int score_gradient_slots(const MoeShape& s) {
  constexpr long long kSlotColumns = 64;  // templates/bwd_down.cuh: kDsSlotColumns
  return static_cast<int>((s.intermediate + kSlotColumns - 1) / kSlotColumns);
}

MemoryLayout memory_layout(const MoeShape& s, Mode mode, int block_m) {
  MemoryLayout l;
  const std::size_t tk = static_cast<std::size_t>(s.pairs());
  const std::size_t h = s.hidden, i = s.intermediate, elt = 2;
  l.routing = routing_layout(s.pairs(), s.experts, block_m);
  l.routing_in_saved = mode != Mode::kInference;
  l.chunk_columns = s.intermediate;

  if (l.routing_in_saved) {
    l.routing_offset = place(l.saved_bytes, l.routing.total_bytes);
    l.pre_act = place(l.saved_bytes, tk * 2 * i * elt);
    l.stamp = place(l.saved_bytes, MemoryLayout::kStampBytes);
  }
  l.act = place(l.forward_bytes, tk * i * elt);
  l.y = place(l.forward_bytes, tk * h * elt);
  if (!l.routing_in_saved) l.routing_offset = place(l.forward_bytes, l.routing.total_bytes);

  if (mode != Mode::kInference) {
    l.ds_acc = place(l.backward_bytes, tk * static_cast<std::size_t>(score_gradient_slots(s)) * sizeof(float));
    l.dx_rows = place(l.backward_bytes, tk * h * elt);
    // The weighted activation lives in dW1's buffer wherever it fits (bwd_dw1 writes dW1 last):
    // whole in training mode, in chunks where needed in memory-efficient mode.
    const bool fits_dw1 = s.pairs() <= dw1_rows_of_inter(s);
    if (mode == Mode::kTraining) {
      l.d_pre_act = place(l.backward_bytes, tk * 2 * i * elt);
      if (!fits_dw1) l.weighted_act = place(l.backward_bytes, tk * i * elt);
    }
    l.weighted_act_in_dw1 = mode == Mode::kTraining ? fits_dw1 : !memeff_recomputes_act(s, mode);
    l.chunk_columns = memeff_recomputes_act(s, mode) ? static_cast<int>(i) : memeff_chunk_columns(s, mode);
    // Rows of chunk_columns elements: dW1's 2 E H rows of I hold 2 E H I / chunk_columns of them.
    const unsigned __int128 room_rows =
        static_cast<unsigned __int128>(dw1_rows_of_inter(s)) * i / static_cast<unsigned>(l.chunk_columns);
    l.weighted_act_rows = l.weighted_act_in_dw1 && room_rows < tk ? static_cast<std::size_t>(room_rows) : tk;
    l.chunk_experts = memeff_chunk_experts(s, mode);
  }
  return l;
}

MemoryLayout memory_layout(const MoeProblem& p) {
  const MoeShape shape = shape_of(p);
  return memory_layout(shape, p.mode, token_block_m(shape));
}

}  // namespace moejit
