// The process-wide record of saved-state buffers that backward() consults (src/moe/saved_states.hpp).
// A private SavedStates per case: the process-wide one is the library's.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "moe/saved_states.hpp"
#include "moejit/error.hpp"

using namespace moejit;

namespace {

// Buffers 256 bytes apart, each holding a state of kBytes.
const void* address(std::uintptr_t n) { return reinterpret_cast<const void*>(n << 8); }
constexpr std::size_t kBytes = 256;
// Context ids as cuCtxGetId gives them: a context reset or destroyed and made again gets a new one.
constexpr SavedStates::ContextId kContext = 1, kNewContext = 2;

std::string refusal_in(SavedStates::ContextId context, SavedStates& states, const void* saved, const MoeProblem& p,
                       SavedStates::Use use = SavedStates::Use::kRead) {
  try {
    states.use(context, saved, p, use);
  } catch (const StateError& e) {
    return e.what();
  }
  return "";
}

std::string refusal(SavedStates& states, const void* saved, const MoeProblem& p,
                    SavedStates::Use use = SavedStates::Use::kRead) {
  return refusal_in(kContext, states, saved, p, use);
}

}  // namespace

TEST_CASE("a backward refuses a saved buffer known to hold no complete state of its problem", "[saved]") {
  SavedStates states;
  const MoeProblem p{1024, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
  MoeProblem other_t = p;
  other_t.tokens = 8192;
  MoeProblem other_mode = p;
  other_mode.mode = Mode::kMemoryEfficient;

  // Never recorded: its routing tables would be whatever the memory held. A state that moved
  // (offloaded to the host and back) is recorded by adopt_saved.
  CHECK_THAT(refusal(states, address(1), p), Catch::StartsWith("saved: no forward() of this process wrote a state at "
                                                               "this address") &&
                                                 Catch::Contains("adopt_saved()"));
  states.record(kContext, address(1), kBytes, p, SavedStates::State::kComplete);
  CHECK(refusal(states, address(1), p).empty());
  // Another problem's complete state: its layout differs.
  CHECK_THAT(refusal(states, address(1), other_t),
             Catch::StartsWith("saved: it holds the state of another problem's forward() (T=1024, E=128, H=2048, "
                               "I=768, K=8, bf16, train)"));
  CHECK_THAT(refusal(states, address(1), other_mode), Catch::Contains("another problem"));
  states.record(kContext, address(2), kBytes, p, SavedStates::State::kPartial);
  CHECK_THAT(refusal(states, address(2), p), Catch::StartsWith("saved: a forward() into it stopped part-way"));
  states.record(kContext, address(3), kBytes, other_mode, SavedStates::State::kConsumed);
  CHECK_THAT(refusal(states, address(3), other_mode), Catch::Contains("already consumed"));
  // A forward that completes makes the buffer usable again.
  states.record(kContext, address(3), kBytes, other_mode, SavedStates::State::kComplete);
  CHECK(refusal(states, address(3), other_mode).empty());
  // Consuming is a use: once, then refused; a buffer never recorded is not consumed either.
  CHECK(refusal(states, address(3), other_mode, SavedStates::Use::kConsume).empty());
  CHECK_THAT(refusal(states, address(3), other_mode), Catch::Contains("already consumed"));
  CHECK_THAT(refusal(states, address(4), other_mode, SavedStates::Use::kConsume), Catch::Contains("no forward()"));
  CHECK_THAT(refusal(states, address(4), other_mode, SavedStates::Use::kConsume), Catch::Contains("no forward()"));
  // A refused consumer consumes nothing: another problem's state stays usable by its own.
  CHECK_THAT(refusal(states, address(1), other_mode, SavedStates::Use::kConsume), Catch::Contains("another problem"));
  CHECK(refusal(states, address(1), p).empty());
}

TEST_CASE("the saved-state record stays bounded, forgetting the least recently recorded or used buffers", "[saved]") {
  SavedStates states;
  const MoeProblem p{64, 8, 256, 128, 2, DType::kBF16, Mode::kTraining};
  const auto forgotten = [&](std::uintptr_t n) {
    return refusal(states, address(n), p).starts_with("saved: no forward() of this process");
  };
  states.record(kContext, address(1), kBytes, p, SavedStates::State::kComplete);
  for (std::uintptr_t n = 2; n <= SavedStates::kCapacity; ++n) states.record(kContext, address(n), kBytes, p, SavedStates::State::kPartial);
  // A backward's use refreshes its state: the state recorded first then outlives those after it.
  CHECK(refusal(states, address(1), p).empty());
  states.record(kContext, address(SavedStates::kCapacity + 1), kBytes, p, SavedStates::State::kPartial);
  CHECK(refusal(states, address(1), p).empty());
  CHECK(forgotten(2));
  CHECK(forgotten(SavedStates::kCapacity / 2));
  CHECK_THAT(refusal(states, address(SavedStates::kCapacity), p), Catch::Contains("stopped part-way"));
  CHECK_THAT(refusal(states, address(SavedStates::kCapacity + 1), p), Catch::Contains("stopped part-way"));
  // Recording an address again refreshes it too: the next time the record fills, it outlives the
  // buffers recorded before it.
  states.record(kContext, address(SavedStates::kCapacity / 2 + 10), kBytes, p, SavedStates::State::kPartial);
  for (std::uintptr_t n = 0; n < SavedStates::kCapacity / 2; ++n) {
    states.record(kContext, address(1000000 + n), kBytes, p, SavedStates::State::kPartial);
  }
  CHECK(forgotten(SavedStates::kCapacity));
  CHECK_THAT(refusal(states, address(SavedStates::kCapacity / 2 + 10), p), Catch::Contains("stopped part-way"));
}

TEST_CASE("plans on many threads record and consult saved buffers at once", "[saved]") {
  SavedStates states;
  const MoeProblem p{64, 8, 256, 128, 2, DType::kBF16, Mode::kMemoryEfficient};
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (std::uintptr_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (std::uintptr_t i = 0; i < 2000; ++i) {
        const void* saved = address(1 + t * 100 + i % 100);
        states.record(kContext, saved, kBytes, p, SavedStates::State::kComplete);
        if (!refusal(states, saved, p).empty()) ++refused;  // no other thread writes this address
        states.record(kContext, saved, kBytes, p, SavedStates::State::kConsumed);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(refused == 0);
  CHECK_FALSE(refusal(states, address(1), p).empty());
}

TEST_CASE("of backwards consuming one buffer at once, exactly one runs", "[saved]") {
  SavedStates states;
  const MoeProblem p{64, 8, 256, 128, 2, DType::kBF16, Mode::kMemoryEfficient};
  for (std::uintptr_t round = 0; round < 200; ++round) {
    const void* saved = address(1 + round);
    states.record(kContext, saved, kBytes, p, SavedStates::State::kComplete);
    std::atomic<int> ran{0}, ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        ++ready;
        while (ready < 4) {
        }
        if (refusal(states, saved, p, SavedStates::Use::kConsume).empty()) ++ran;
      });
    }
    for (std::thread& th : threads) th.join();
    INFO("round " << round);
    CHECK(ran == 1);
  }
}

TEST_CASE("a state that a later call writes over in part is refused; states beside the write are not", "[saved]") {
  SavedStates states;
  const MoeProblem p{64, 8, 256, 128, 2, DType::kBF16, Mode::kTraining};
  const auto at = [](std::uintptr_t offset) { return reinterpret_cast<const void*>(0x100000 + offset); };
  // Three states of 4096 bytes, a gap of 4096 between each.
  for (std::uintptr_t i = 0; i < 3; ++i) states.record(kContext, at(i * 8192), 4096, p, SavedStates::State::kComplete);
  // A forward's out inside the first state, past its start: an exact-address record misses it.
  states.overwrite({{"out", at(256), 512, 16, true}, {"x", at(8192), 4096, 16, false}}, nullptr);
  CHECK_THAT(refusal(states, at(0), p), Catch::StartsWith("saved: a later call of this process wrote over part of it"));
  CHECK(refusal(states, at(8192), p).empty());  // only read
  // Writes that end where a state begins, or begin where one ends, leave it whole; one byte in does not.
  states.overwrite({{"workspace", at(4096), 4096, 256, true}}, nullptr);
  CHECK(refusal(states, at(8192), p).empty());
  states.overwrite({{"dx", at(8192 - 16), 17, 2, true}}, nullptr);
  CHECK_THAT(refusal(states, at(8192), p), Catch::Contains("wrote over part of it"));
  // A write reaching into the third state from before its start, and a backward's own state,
  // which its use judges, kept.
  states.overwrite({{"saved", at(16384), 4096, 256, true}}, at(16384));
  CHECK(refusal(states, at(16384), p).empty());
  states.overwrite({{"dw1", at(12288), 4097, 16, true}}, at(0));
  CHECK_THAT(refusal(states, at(16384), p), Catch::Contains("wrote over part of it"));
  // Another forward recording its own state where one was written over makes it usable again.
  states.record(kContext, at(16384), 4096, p, SavedStates::State::kComplete);
  CHECK(refusal(states, at(16384), p).empty());
  // A state far larger than the others still counts from its start: found from a write near its end.
  states.record(kContext, at(1 << 20), 1 << 20, p, SavedStates::State::kComplete);
  states.overwrite({{"out", at((2 << 20) - 2), 2, 2, true}}, nullptr);
  CHECK_THAT(refusal(states, at(1 << 20), p), Catch::Contains("wrote over part of it"));
  // A null or empty tensor writes nothing.
  states.record(kContext, at(0), 4096, p, SavedStates::State::kComplete);
  states.overwrite({{"dw1", nullptr, 0, 16, true}, {"dw2", at(0), 0, 16, true}}, nullptr);
  CHECK(refusal(states, at(0), p).empty());
}

TEST_CASE("states written over are forgotten at the next write over them, so the record stays disjoint", "[saved]") {
  SavedStates states;
  const MoeProblem p{64, 8, 256, 128, 2, DType::kBF16, Mode::kTraining};
  // Many small states, then one large buffer written over all of them (a caching allocator
  // handing their memory to a new workspace).
  constexpr std::uintptr_t kStates = 1000;
  for (std::uintptr_t n = 1; n <= kStates; ++n) states.record(kContext, address(n), kBytes, p, SavedStates::State::kComplete);
  const std::vector<TensorRegion> big = {{"workspace", address(1), kStates * kBytes, 256, true}};
  states.overwrite(big, nullptr);
  CHECK_THAT(refusal(states, address(1), p), Catch::Contains("wrote over part of it"));
  CHECK_THAT(refusal(states, address(kStates), p), Catch::Contains("wrote over part of it"));
  // A state recorded inside the written-over range, then the range written again: the state is
  // written over, the older records forgotten.
  states.record(kContext, address(500), kBytes, p, SavedStates::State::kComplete);
  states.overwrite(big, nullptr);
  CHECK_THAT(refusal(states, address(500), p), Catch::Contains("wrote over part of it"));
  CHECK_THAT(refusal(states, address(1), p), Catch::StartsWith("saved: no forward() of this process"));
  CHECK_THAT(refusal(states, address(kStates), p), Catch::StartsWith("saved: no forward() of this process"));
  // A state written over a smaller one that began inside it, then a write into it past that
  // address: the old record, left at its address, must not hide the new state from the look back.
  states.record(kContext, address(3001), kBytes, p, SavedStates::State::kComplete);
  states.overwrite({{"saved", address(3000), 4 * kBytes, 256, true}}, nullptr);
  states.record(kContext, address(3000), 4 * kBytes, p, SavedStates::State::kComplete);
  states.overwrite({{"out", address(3002), 16, 16, true}}, nullptr);
  CHECK_THAT(refusal(states, address(3000), p), Catch::Contains("wrote over part of it"));
  // A state adopted where a larger one began reaches no further than its own bytes.
  states.record(kContext, address(2000), 4 * kBytes, p, SavedStates::State::kComplete);
  states.overwrite({{"saved", address(2000), kBytes, 256, true}}, nullptr);
  states.record(kContext, address(2000), kBytes, p, SavedStates::State::kComplete);
  states.overwrite({{"out", address(2002), 16, 16, true}}, nullptr);
  CHECK(refusal(states, address(2000), p).empty());
}

TEST_CASE("a state recorded in another CUDA context is refused; the new context's own state at its address replaces it",
          "[saved]") {
  SavedStates states;
  const MoeProblem p{64, 8, 256, 128, 2, DType::kBF16, Mode::kMemoryEfficient};
  MoeProblem other_t = p;
  other_t.tokens = 128;
  // A forward in a context that is then reset: a new context's allocation at the same address
  // holds none of its routing tables.
  states.record(kContext, address(1), kBytes, p, SavedStates::State::kComplete);
  CHECK_THAT(refusal_in(kNewContext, states, address(1), p),
             Catch::StartsWith("saved: it was written in another CUDA context than this plan's"));
  // Judged before the state: another context's partial or other problem's record says the same.
  states.record(kContext, address(2), kBytes, other_t, SavedStates::State::kPartial);
  CHECK_THAT(refusal_in(kNewContext, states, address(2), p), Catch::Contains("another CUDA context"));
  // A refused consumer consumes nothing: the recording context still runs its backward, once.
  CHECK_THAT(refusal_in(kNewContext, states, address(1), p, SavedStates::Use::kConsume),
             Catch::Contains("another CUDA context"));
  CHECK(refusal(states, address(1), p, SavedStates::Use::kConsume).empty());
  CHECK_THAT(refusal(states, address(1), p), Catch::Contains("already consumed"));

  // The new context's forward at the old address (its write, then its record) replaces the old
  // record: no false refusal after a reset. The old context's use is refused in turn.
  states.record(kContext, address(3), kBytes, p, SavedStates::State::kComplete);
  states.overwrite({{"saved", address(3), kBytes, 256, true}}, nullptr);
  states.record(kNewContext, address(3), kBytes, p, SavedStates::State::kComplete);
  CHECK(refusal_in(kNewContext, states, address(3), p).empty());
  CHECK_THAT(refusal(states, address(3), p), Catch::Contains("another CUDA context"));
  // Its forward stopping part-way there is that, in its own context.
  states.overwrite({{"saved", address(3), kBytes, 256, true}}, nullptr);
  states.record(kNewContext, address(3), kBytes, p, SavedStates::State::kPartial);
  CHECK_THAT(refusal_in(kNewContext, states, address(3), p), Catch::StartsWith("saved: a forward() into it stopped"));
  // A new state starting inside an old context's larger one: the old one is written over, as in
  // one context, and the new one is whole.
  states.record(kContext, address(10), 4 * kBytes, p, SavedStates::State::kComplete);
  states.overwrite({{"saved", address(12), kBytes, 256, true}}, nullptr);
  states.record(kNewContext, address(12), kBytes, p, SavedStates::State::kComplete);
  CHECK_THAT(refusal(states, address(10), p), Catch::Contains("wrote over part of it"));
  CHECK(refusal_in(kNewContext, states, address(12), p).empty());
}

TEST_CASE("a write marks the states of any context it overlaps, and no others", "[saved]") {
  SavedStates states;
  const MoeProblem p{64, 8, 256, 128, 2, DType::kBF16, Mode::kTraining};
  const auto at = [](std::uintptr_t offset) { return reinterpret_cast<const void*>(0x200000 + offset); };
  // Two states of the old context and one of the new, 4096 bytes each, a gap of 4096 between them.
  states.record(kContext, at(0), 4096, p, SavedStates::State::kComplete);
  states.record(kContext, at(8192), 4096, p, SavedStates::State::kComplete);
  states.record(kNewContext, at(16384), 4096, p, SavedStates::State::kComplete);
  // An out inside the old context's first state marks it. A write names no context: one address
  // space (UVA), so those bytes are gone whichever context wrote them.
  states.overwrite({{"out", at(256), 512, 16, true}}, nullptr);
  CHECK_THAT(refusal(states, at(0), p), Catch::Contains("wrote over part of it"));
  // A backward's write keeping the new context's state, its workspace filling the gap between the
  // old context's states: the kept state stays whole, the old context's second is untouched and
  // still refused from the new context.
  states.overwrite({{"saved", at(16384), 4096, 256, true}, {"workspace", at(4096), 4096, 256, true}}, at(16384));
  CHECK(refusal(states, at(8192), p).empty());
  CHECK(refusal_in(kNewContext, states, at(16384), p).empty());
  CHECK_THAT(refusal_in(kNewContext, states, at(8192), p), Catch::Contains("another CUDA context"));
  // A write reaching one byte into it marks it.
  states.overwrite({{"dx", at(12288 - 1), 2, 2, true}}, nullptr);
  CHECK_THAT(refusal(states, at(8192), p), Catch::Contains("wrote over part of it"));
  CHECK(refusal_in(kNewContext, states, at(16384), p).empty());
}

TEST_CASE("an adopted state is taken as complete, its stamp unchecked until a backward checks it", "[saved]") {
  SavedStates states;
  const MoeProblem p{1024, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
  MoeProblem other = p;
  other.experts = 64;
  states.record(kContext, address(1), kBytes, p, SavedStates::State::kAdopted);
  const std::optional<SavedStates::Unchecked> first = states.unchecked(kContext, address(1));
  REQUIRE(first);
  CHECK(first->state == SavedStates::State::kAdopted);
  CHECK_FALSE(states.unchecked(kNewContext, address(1)));  // another context's record says nothing here
  CHECK_FALSE(states.unchecked(kContext, address(2)));      // no record
  // A state adopted there again while the first one's stamp was read stays unchecked.
  states.record(kContext, address(1), kBytes, p, SavedStates::State::kAdopted);
  const std::optional<SavedStates::Unchecked> second = states.unchecked(kContext, address(1));
  REQUIRE(second);
  states.checked(kContext, address(1), first->recorded);
  CHECK(states.unchecked(kContext, address(1))->recorded == second->recorded);
  CHECK_THAT(refusal(states, address(1), other), Catch::Contains("another problem"));
  // Another thread's backward over the same state in between leaves it the same adoption.
  CHECK(refusal(states, address(1), p).empty());
  states.checked(kContext, address(1), second->recorded);
  CHECK_FALSE(states.unchecked(kContext, address(1)));
  CHECK(refusal(states, address(1), p).empty());
  // A forward's own state is not adopted; checked() leaves any other state as it is.
  states.record(kContext, address(2), kBytes, p, SavedStates::State::kComplete);
  CHECK_FALSE(states.unchecked(kContext, address(2)));
  states.record(kContext, address(3), kBytes, p, SavedStates::State::kPartial);
  states.checked(kContext, address(3), 0);
  states.checked(kContext, address(3), second->recorded + 1);
  CHECK_THAT(refusal(states, address(3), p), Catch::Contains("stopped part-way"));
  // Consumed, an adopted state is no longer waiting for its check.
  states.record(kContext, address(4), kBytes, p, SavedStates::State::kAdopted);
  CHECK(refusal(states, address(4), p, SavedStates::Use::kConsume).empty());
  CHECK_FALSE(states.unchecked(kContext, address(4)));
}

TEST_CASE("a captured forward's state is taken as complete for its problem, its stamp unchecked until a backward checks it",
          "[saved]") {
  SavedStates states;
  const MoeProblem p{1024, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
  MoeProblem other = p;
  other.tokens = 512;
  states.record(kContext, address(1), kBytes, p, SavedStates::State::kCaptured);
  const std::optional<SavedStates::Unchecked> captured = states.unchecked(kContext, address(1));
  REQUIRE(captured);
  CHECK(captured->state == SavedStates::State::kCaptured);
  CHECK_THAT(refusal(states, address(1), other), Catch::Contains("another problem"));
  CHECK(refusal(states, address(1), p).empty());  // a captured backward reads it unchecked
  states.checked(kContext, address(1), captured->recorded);
  CHECK_FALSE(states.unchecked(kContext, address(1)));
  CHECK(refusal(states, address(1), p).empty());
  // Written over, it is lost as any state.
  states.record(kContext, address(2), kBytes, p, SavedStates::State::kCaptured);
  states.overwrite({{"out", address(2), 16, 2, true}}, nullptr);
  CHECK_FALSE(states.unchecked(kContext, address(2)));
  CHECK_THAT(refusal(states, address(2), p), Catch::Contains("wrote over part of it"));
}

TEST_CASE("a state's stamp differs with every field of its problem, and is never 0 or all ones", "[saved]") {
  const MoeProblem p{1024, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
  std::vector<MoeProblem> problems(8, p);
  problems[1].tokens = 1025;
  problems[2].experts = 64;
  problems[3].hidden = 4096;
  problems[4].intermediate = 1536;
  problems[5].topk = 6;
  problems[6].dtype = DType::kFP16;
  problems[7].mode = Mode::kMemoryEfficient;
  std::vector<std::uint32_t> stamps;
  for (const MoeProblem& q : problems) stamps.push_back(state_stamp(q));
  for (std::size_t i = 0; i < stamps.size(); ++i) {
    CHECK(stamps[i] != 0u);
    CHECK(stamps[i] != 0xffffffffu);
    for (std::size_t j = 0; j < i; ++j) CHECK(stamps[i] != stamps[j]);
  }
  CHECK(state_stamp(p) == stamps[0]);  // a function of the problem alone
  // Every E from 2 to 16 at T=64, K=2, H=I=64 has one saved size: each its own stamp.
  std::vector<std::uint32_t> by_experts;
  for (int e = 2; e <= 16; ++e) {
    by_experts.push_back(state_stamp(MoeProblem{64, e, 64, 64, 2, DType::kBF16, Mode::kTraining}));
    for (std::size_t j = 0; j + 1 < by_experts.size(); ++j) CHECK(by_experts.back() != by_experts[j]);
  }
}
