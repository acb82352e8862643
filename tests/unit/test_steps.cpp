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

// A backward call's arguments at fake addresses: those its memory-efficient steps read.
BackwardArgs backward_args() {
  BackwardArgs b;
  b.d_out = fake(8);
  b.topk_weights = fake(4);
  b.saved = fake(6);
  b.dw1 = fake(10);
  b.dw2 = fake(11);
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

    ForwardArgs f;
    f.x = fake(1);
    f.w1 = fake(2);
    f.w2 = fake(3);
    f.topk_weights = fake(4);
    f.out = fake(5);
    f.saved = fake(6);
    f.workspace = fake(7);
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

    BackwardArgs b;
    b.d_out = fake(8);
    b.x = f.x;
    b.w1 = f.w1;
    b.w2 = f.w2;
    b.topk_weights = f.topk_weights;
    b.saved = f.saved;
    b.dx = fake(9);
    b.dw1 = fake(10);
    b.dw2 = fake(11);
    b.d_topk_weights = fake(12);
    b.workspace = fake(13);
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
  CHECK_FALSE(memeff_recomputes_act(qwen3(524288), memeff));
  CHECK(memeff_recomputes_act(qwen3(524289), memeff));
  CHECK(memeff_chunk_experts(qwen3(524289), memeff) == 128);  // one launch pair that recomputes
  CHECK(memeff_chunk_experts(qwen3(1 << 20), Mode::kTraining) == 128);
  CHECK_FALSE(memeff_recomputes_act(qwen3(1 << 20), Mode::kTraining));

  for (long long tokens : {4096LL, 98304LL, 1LL << 20}) {
    const MoeProblem p{tokens, 128, 2048, 768, 8, DType::kBF16, Mode::kMemoryEfficient};
    INFO("T=" << tokens);
    const MemoryLayout l = memory_layout(p);
    const bool in_dw1 = tokens < (1LL << 20);
    CHECK(l.weighted_act_in_dw1 == in_dw1);
    CHECK(l.chunk_experts == (tokens == 98304 ? 5 : 128));
    CHECK(l.weighted_act_rows == static_cast<std::size_t>(in_dw1 ? std::min(tokens * 8, 524288LL) : tokens * 8));
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
    } else {
      // bwd_dw2 recomputes it from pre_act, so it runs before bwd_down overwrites pre_act.
      CHECK(bs.dw2_first);
      CHECK(bs.bwd_down.weighted_act == nullptr);
      CHECK(bs.bwd_dw2.pre_act == pre_act);
    }
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
    const ExpertChunk c = expert_chunk(bs, first, bs.chunk_experts);
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
