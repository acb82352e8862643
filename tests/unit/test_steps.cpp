// The launch parameters a step derives from the caller's pointers: where the pre-scattered token
// rows of TMA configs live, and that each buffer holds what its readers need.
#include <catch2/catch.hpp>

#include <algorithm>

#include "moe/launch.hpp"
#include "moe/memory_layout.hpp"
#include "moe/steps.hpp"
#include "tuner/role_traits.hpp"

using namespace moejit;

namespace {

// Distinct fake addresses: the steps only do pointer arithmetic on them.
template <typename T = void>
T* fake(std::uintptr_t a) {
  return reinterpret_cast<T*>(a << 32);
}

char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

// A forward call's arguments at fake addresses.
ForwardArgs forward_args() {
  ForwardArgs f;
  f.x = fake(1);
  f.w1 = fake(2);
  f.w2 = fake(3);
  f.topk_weights = fake(4);
  f.out = fake(5);
  f.saved = fake(6);
  f.workspace = fake(7);
  return f;
}

// A backward call's arguments at fake addresses, its inputs at forward_args()'s.
BackwardArgs backward_args() {
  BackwardArgs b;
  b.x = fake(1);
  b.w1 = fake(2);
  b.w2 = fake(3);
  b.topk_weights = fake(4);
  b.saved = fake(6);
  b.d_out = fake(8);
  b.dx = fake(9);
  b.dw1 = fake(10);
  b.dw2 = fake(11);
  b.d_topk_weights = fake(12);
  b.workspace = fake(13);
  return b;
}

}  // namespace

TEST_CASE("the scatters write x and dO into free [TK, H] workspaces that the TMA roles read", "[steps]") {
  for (Mode mode : {Mode::kTraining, Mode::kMemoryEfficient}) {
    INFO(mode_name(mode));
    const MoeProblem p{4096, 64, 2048, 1408, 6, DType::kBF16, mode};  // DeepSeek-V2-Lite
    const MemoryLayout l = memory_layout(p);
    const std::size_t rows_bytes = static_cast<std::size_t>(p.tokens) * p.topk * p.hidden * 2;

    const ForwardArgs f = forward_args();
    const ForwardSteps fs = forward_steps(f, p, l, token_block_m(MoeShape{p.tokens, p.experts, p.hidden,
                                                                        p.intermediate, p.topk, p.dtype}));
    void* y = at(f.workspace, l.y);
    CHECK(fs.scatter_x.tokens == f.x);
    CHECK(fs.scatter_x.rows == y);
    CHECK(fs.scatter_x.scores == nullptr);
    CHECK(fs.fwd_up.x_rows == y);
    CHECK(fs.fwd_up.x == f.x);
    CHECK(fs.fwd_down.y == y);  // written only after fwd_up has read the rows
    CHECK(l.forward_bytes - l.y >= rows_bytes);

    const BackwardArgs b = backward_args();
    const BackwardSteps bs = backward_steps(b, p, l);
    void* dx_rows = at(b.workspace, l.dx_rows);
    CHECK(bs.scatter_d_out.tokens == b.d_out);
    CHECK(bs.scatter_d_out.rows == dx_rows);
    CHECK(bs.bwd_down.d_out_rows == dx_rows);
    CHECK(bs.bwd_dw2.d_out_rows == dx_rows);
    CHECK(bs.bwd_dx.dx_rows == dx_rows);  // overwrites dO's rows after bwd_down and bwd_dw2
    CHECK(bs.gather_dx.rows == dx_rows);
    CHECK(bs.scatter_x.tokens == b.x);
    CHECK(bs.scatter_x.rows == dx_rows);  // after gather_dx has read bwd_dx's rows
    CHECK(bs.bwd_dw1.x_rows == dx_rows);
    CHECK(bs.scatter_x.pair_rows == bs.gather_dx.pair_rows);
    CHECK(l.backward_bytes - l.dx_rows >= rows_bytes);
  }
}

TEST_CASE("memory-efficient mode keeps the weighted activation in dW1's buffer where it fits", "[steps]") {
  // TK x I against E x 2I x H (2 E H = 524288 rows of I): Qwen3-30B-A3B's fit whole up to
  // T = 2 E H / K = 65536 tokens, an expert's (at most T rows) up to T = 2 E H.
  const auto qwen3 = [](long long t) { return MoeShape{t, 128, 2048, 768, 8, DType::kBF16}; };
  const Mode memeff = Mode::kMemoryEfficient;
  CHECK(dw1_rows_of_inter(qwen3(1)) == 524288);
  CHECK(memeff_chunk_experts(qwen3(65536), memeff) == 128);
  CHECK(memeff_chunk_experts(qwen3(65537), memeff) == 7);    // 524288 / 65537 experts of at most 65537 rows
  CHECK(memeff_chunk_experts(qwen3(98304), memeff) == 5);
  CHECK(memeff_chunk_experts(qwen3(262144), memeff) == 2);
  CHECK(memeff_chunk_experts(qwen3(524288), memeff) == 1);
  CHECK(memeff_chunk_columns(qwen3(524288), memeff) == 768);
  CHECK_FALSE(memeff_recomputes_act(qwen3(524288), memeff));
  // Past T = 2 E H one expert's rows may not fit: one expert at a time, the multiple of 256
  // columns whose T rows do (2 E H I / T = 767.99, 384, 256 columns), down to 256.
  CHECK(memeff_chunk_columns(qwen3(524289), memeff) == 512);
  CHECK(memeff_chunk_experts(qwen3(524289), memeff) == 1);
  CHECK(memeff_chunk_columns(qwen3(1 << 20), memeff) == 256);
  CHECK(memeff_chunk_columns(qwen3(1572864), memeff) == 256);
  CHECK_FALSE(memeff_recomputes_act(qwen3(1572864), memeff));
  CHECK(memeff_chunk_columns(qwen3(1572865), memeff) == 0);
  CHECK(memeff_recomputes_act(qwen3(1572865), memeff));
  CHECK(memeff_chunk_experts(qwen3(1572865), memeff) == 128);  // one launch pair that recomputes
  CHECK(memeff_chunk_experts(qwen3(1 << 21), Mode::kTraining) == 128);
  CHECK(memeff_chunk_columns(qwen3(1 << 21), Mode::kTraining) == 768);
  CHECK_FALSE(memeff_recomputes_act(qwen3(1 << 21), Mode::kTraining));

  struct Want {
    long long tokens;
    bool in_dw1;
    int experts, columns;
    long long rows;
  };
  for (const Want& w : {Want{4096, true, 128, 768, 32768}, Want{98304, true, 5, 768, 524288},
                        Want{1 << 20, true, 1, 256, 1572864}, Want{1 << 21, false, 128, 768, 1LL << 24}}) {
    const long long tokens = w.tokens;
    const bool in_dw1 = w.in_dw1;
    const MoeProblem p{tokens, 128, 2048, 768, 8, DType::kBF16, Mode::kMemoryEfficient};
    INFO("T=" << tokens);
    const MemoryLayout l = memory_layout(p);
    CHECK(l.weighted_act_in_dw1 == in_dw1);
    CHECK(l.chunk_experts == w.experts);
    CHECK(l.chunk_columns == w.columns);
    CHECK(l.weighted_act_rows == static_cast<std::size_t>(w.rows));
    CHECK(l.weighted_act == MemoryLayout::kNone);  // no workspace for it in this mode
    CHECK(l.d_pre_act == MemoryLayout::kNone);
    const BackwardArgs b = backward_args();
    const BackwardSteps bs = backward_steps(b, p, l);
    void* pre_act = at(b.saved, l.pre_act);
    CHECK(bs.bwd_down.d_pre_act == pre_act);  // written over pre_act in both cases
    if (in_dw1) {
      // Training's order and kernels: bwd_down stores the weighted activation where dW1 will
      // be written last, and bwd_dw2 reads it from there.
      CHECK_FALSE(bs.dw2_first);
      CHECK(bs.bwd_down.weighted_act == b.dw1);
      CHECK(bs.bwd_dw2.weighted_act == b.dw1);
      CHECK(bs.bwd_down.weighted_act_rows == static_cast<std::int32_t>(l.weighted_act_rows));
      CHECK(bs.bwd_dw2.weighted_act_rows == static_cast<std::int32_t>(l.weighted_act_rows));
      CHECK(bs.chunk_experts == l.chunk_experts);
      CHECK(bs.chunk_columns == l.chunk_columns);
      CHECK(bs.bwd_down.wact_ld == l.chunk_columns);
      CHECK(bs.bwd_dw2.wact_ld == l.chunk_columns);
    } else {
      // bwd_dw2 recomputes it from pre_act, so it runs before bwd_down overwrites pre_act.
      CHECK(bs.dw2_first);
      CHECK(bs.bwd_down.weighted_act == nullptr);
      CHECK(bs.bwd_dw2.pre_act == pre_act);
    }
  }
}

TEST_CASE("training keeps the weighted activation in dW1's buffer where it fits whole", "[steps]") {
  // dW1's buffer holds 2 E H = 524288 rows of I at Qwen3-30B-A3B: T·K up to that fits.
  for (const auto& [tokens, in_dw1] : {std::pair{4096LL, true}, std::pair{65536LL, true}, std::pair{65537LL, false}}) {
    INFO("T=" << tokens);
    const MoeProblem p{tokens, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
    const MemoryLayout l = memory_layout(p);
    const std::size_t tk = static_cast<std::size_t>(tokens) * 8;
    CHECK(l.weighted_act_in_dw1 == in_dw1);
    CHECK((l.weighted_act == MemoryLayout::kNone) == in_dw1);
    CHECK(l.chunk_experts == 128);
    CHECK(l.chunk_columns == 768);
    CHECK(l.weighted_act_rows == tk);
    const BackwardArgs b = backward_args();
    const BackwardSteps bs = backward_steps(b, p, l);
    CHECK_FALSE(bs.dw2_first);
    CHECK(bs.bwd_down.d_pre_act == at(b.workspace, l.d_pre_act));  // saved stays intact
    void* const wact = in_dw1 ? b.dw1 : at(b.workspace, l.weighted_act);
    CHECK(bs.bwd_down.weighted_act == wact);
    CHECK(bs.bwd_dw2.weighted_act == wact);
    CHECK(bs.bwd_down.wact_ld == 768);
    // The workspace: ds_acc (I = 768: 12 fp32 slots a pair), dx_rows, d_pre_act, and the
    // weighted activation only where it does not fit dW1's buffer.
    CHECK(bs.ds_count == tk * 12);
    CHECK(bs.bwd_down.ds_slots == 12);
    CHECK(bs.gather_dx.ds_slots == 12);
    const std::size_t round = 256, wact_bytes = tk * 768 * 2;
    CHECK(l.backward_bytes == (tk * 12 * 4 + round - 1) / round * round + tk * 2048 * 2 + tk * 1536 * 2 +
                                  (in_dw1 ? 0 : wact_bytes));
  }
}

TEST_CASE("a memory-efficient chunk launches bwd_down and bwd_dw2 over its experts alone", "[steps]") {
  // T = 98304 at Qwen3-30B-A3B: five experts per chunk, the last of 26 chunks holds three.
  const MoeProblem p{98304, 128, 2048, 768, 8, DType::kBF16, Mode::kMemoryEfficient};
  const MemoryLayout l = memory_layout(p);
  const BackwardArgs b = backward_args();
  const BackwardSteps bs = backward_steps(b, p, l);
  REQUIRE(bs.chunk_experts == 5);
  for (int first : {0, 5, 125}) {
    INFO("first expert " << first);
    const ExpertChunk c = expert_chunk(bs, first, 0);
    const int end = std::min(first + 5, 128);
    // bwd_down walks the token tiles from the first expert's to the end one's; its weighted
    // activation rows count from the first expert's first row.
    CHECK(c.bwd_down.expert_begin == first);
    CHECK(c.bwd_down.routing.experts == end);
    CHECK(c.bwd_down.routing.expert_offsets == bs.bwd_down.routing.expert_offsets);
    CHECK(c.bwd_down.weighted_act == b.dw1);
    // bwd_dw2 sees the chunk's experts as 0 .. end - first - 1 and writes their dW2 slices.
    CHECK(c.bwd_dw2.routing.experts == end - first);
    CHECK(c.bwd_dw2.routing.expert_offsets == bs.bwd_dw2.routing.expert_offsets + first);
    CHECK(c.bwd_dw2.routing.sorted_pairs == bs.bwd_dw2.routing.sorted_pairs);
    CHECK(c.bwd_dw2.dw2 == static_cast<char*>(b.dw2) + static_cast<std::size_t>(first) * 2048 * 768 * 2);
    CHECK(c.bwd_dw2.weighted_act == b.dw1);
    CHECK(c.bwd_dw2.weighted_act_rows == 524288);
  }
  // bwd_dw2's grid over a chunk holds only its experts' tiles: no block looks up an expert past them.
  LaunchGeometry g;
  g.grid = {128 * 48};
  CHECK(expert_subset(g, 128, 5).grid.x == 5 * 48);
  CHECK(expert_subset(g, 128, 3).grid.x == 3 * 48);
}

TEST_CASE("past T = 2 E H a memory-efficient chunk launches bwd_down and bwd_dw2 over one expert's columns", "[steps]") {
  // T = 2^20 at Qwen3-30B-A3B: 128 experts x 3 column chunks of 256; the weighted activation of
  // one expert's rows (at most T) in 256 columns fits dW1's buffer.
  const MoeProblem p{1 << 20, 128, 2048, 768, 8, DType::kBF16, Mode::kMemoryEfficient};
  const MemoryLayout l = memory_layout(p);
  const BackwardArgs b = backward_args();
  const BackwardSteps bs = backward_steps(b, p, l);
  REQUIRE(bs.chunk_experts == 1);
  REQUIRE(bs.chunk_columns == 256);
  CHECK(l.weighted_act_rows * 256 <= 128ull * 2 * 768 * 2048);  // inside dW1's buffer
  CHECK(l.weighted_act_rows >= static_cast<std::size_t>(p.tokens));
  // Steps outside a chunk (the tuner's launches) cover the first chunk's columns.
  CHECK(bs.bwd_down.n_begin == 0);
  CHECK(bs.bwd_down.n_end == 256);
  for (auto [first, n_begin] : {std::pair{0, 0}, std::pair{0, 512}, std::pair{127, 256}}) {
    INFO("expert " << first << ", columns from " << n_begin);
    const ExpertChunk c = expert_chunk(bs, first, n_begin);
    CHECK(c.bwd_down.expert_begin == first);
    CHECK(c.bwd_down.routing.experts == first + 1);
    CHECK(c.bwd_dw2.routing.experts == 1);
    for (auto [begin, end, ld] : {std::tuple{c.bwd_down.n_begin, c.bwd_down.n_end, c.bwd_down.wact_ld},
                                  std::tuple{c.bwd_dw2.n_begin, c.bwd_dw2.n_end, c.bwd_dw2.wact_ld}}) {
      CHECK(begin == n_begin);
      CHECK(end == n_begin + 256);
      CHECK(ld == 256);
    }
    CHECK(c.bwd_dw2.dw2 == static_cast<char*>(b.dw2) + static_cast<std::size_t>(first) * 2048 * 768 * 2);
  }
  // I = 640 in chunks of 512: the last holds 128 columns.
  const MoeProblem q{1100, 2, 256, 640, 2, DType::kBF16, Mode::kMemoryEfficient};
  const BackwardSteps qs = backward_steps(b, q, memory_layout(q));
  REQUIRE(qs.chunk_columns == 512);
  CHECK(expert_chunk(qs, 1, 512).bwd_dw2.n_end == 640);
  // Grids over a column chunk: every tile of its columns, whole clusters.
  LaunchGeometry g;
  g.grid = {2 * 2 * 10};  // dW2 [256, 640] of 2 experts in 128 x 64 tiles
  CHECK(column_subset(g, 640, 512, 64).grid.x == 2 * 2 * 8);
  CHECK(column_subset(g, 640, 128, 64).grid.x == 2 * 2 * 2);
  LaunchGeometry token;
  token.cluster = 2;
  token.grid = {22};  // 7 m tiles x 3 column tiles of 256 (I = 640) in pairs: 21 rounded up to 22
  // A chunk's grid covers its 7 m tiles x its column tiles of 256, in whole pairs, and is at most
  // one pair more than those tiles fill: it is the grid's share of the columns rounded up to
  // pairs, and 22 blocks hold 7 x 3 tiles and less than a pair more.
  for (auto [columns, tiles] : {std::pair{512, 7u * 2}, std::pair{128, 7u * 1}}) {
    INFO(columns << " columns");
    const unsigned blocks = column_subset(token, 640, columns, 256).grid.x;
    CHECK(blocks >= tiles);
    CHECK(blocks % 2 == 0);
    CHECK(blocks <= (tiles + 1) / 2 * 2 + 2);
  }
}

TEST_CASE("a training state ends with its stamp's 256 bytes; an inference plan keeps none", "[steps]") {
  for (Mode mode : {Mode::kTraining, Mode::kMemoryEfficient}) {
    const MoeProblem p{4096, 64, 2048, 1408, 6, DType::kBF16, mode};
    const MemoryLayout l = memory_layout(p);
    CHECK(l.stamp == l.saved_bytes - MemoryLayout::kStampBytes);
    CHECK(l.stamp >= l.pre_act + std::size_t{4096} * 6 * 2 * 1408 * 2);  // after pre_act, which nothing else follows
  }
  const MoeProblem infer{4096, 64, 2048, 1408, 6, DType::kBF16, Mode::kInference};
  CHECK(memory_layout(infer).stamp == MemoryLayout::kNone);
  CHECK(memory_layout(infer).saved_bytes == 0);
}

TEST_CASE("the score gradient takes one fp32 slot a pair for each 64 columns of I", "[steps]") {
  // templates/bwd_down.cuh sums each 64 columns into a slot of their own (kDsSlotColumns).
  const auto slots = [](int inter) { return score_gradient_slots(MoeShape{1024, 8, 256, inter, 2}); };
  CHECK(slots(1) == 1);
  CHECK(slots(64) == 1);
  CHECK(slots(65) == 2);
  CHECK(slots(768) == 12);
  CHECK(slots(14336) == 224);
  // Column chunks cover whole slots: every chunk but the last is a multiple of 256 columns.
  const MoeProblem p{1100, 2, 256, 640, 2, DType::kBF16, Mode::kMemoryEfficient};
  const BackwardSteps bs = backward_steps(backward_args(), p, memory_layout(p));
  CHECK(bs.chunk_columns % 64 == 0);
  CHECK(expert_chunk(bs, 0, bs.chunk_columns).bwd_down.ds_slots == 10);
}

TEST_CASE("a backward without weight gradients runs bwd_down whole and stores no weighted activation", "[steps]") {
  // Training with the weighted activation in dW1's buffer, memory-efficient in expert chunks
  // (T = 98304 at Qwen3-30B-A3B), and in column chunks (T = 2^20).
  for (const MoeProblem& p : {MoeProblem{8192, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining},
                              MoeProblem{98304, 128, 2048, 768, 8, DType::kBF16, Mode::kMemoryEfficient},
                              MoeProblem{1 << 20, 128, 2048, 768, 8, DType::kBF16, Mode::kMemoryEfficient}}) {
    INFO("T = " << p.tokens << ", " << mode_name(p.mode));
    const MemoryLayout l = memory_layout(p);
    const BackwardSteps full = backward_steps(backward_args(), p, l);
    REQUIRE(full.weight_grads);
    REQUIRE(full.bwd_down.weighted_act == backward_args().dw1);
    BackwardArgs b = backward_args();
    b.dw1 = b.dw2 = nullptr;
    const BackwardSteps bs = backward_steps(b, p, l);
    CHECK_FALSE(bs.weight_grads);
    CHECK_FALSE(bs.dw2_first);
    CHECK(bs.bwd_down.weighted_act == nullptr);
    CHECK(bs.chunk_experts == p.experts);
    CHECK(bs.chunk_columns == p.intermediate);
    CHECK(bs.bwd_down.n_begin == 0);
    CHECK(bs.bwd_down.n_end == p.intermediate);
    // What dx and the score gradient need is unchanged.
    CHECK(bs.bwd_down.d_pre_act == full.bwd_down.d_pre_act);
    CHECK(bs.bwd_dx.d_pre_act == full.bwd_dx.d_pre_act);
    CHECK(bs.gather_dx.tokens == full.gather_dx.tokens);
    CHECK(bs.ds_acc == full.ds_acc);
  }
}
