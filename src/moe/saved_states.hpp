// What this process knows of the saved-state buffers its forwards wrote, across every plan: a
// backward refuses a buffer known to hold no complete state of its own problem. Thread-safe.
//
// An address never recorded passes: a state may move (PyTorch's save_on_cpu hands backward a
// copy at a new address), so the contents of a buffer no forward wrote are not caught. What is
// caught: a forward into it that stopped part-way, a memory-efficient backward that consumed it,
// and a state written by a forward of another problem (another plan's T, say), whose layout
// would send the kernels' reads elsewhere.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "moejit/moejit.hpp"

namespace moejit {

class SavedStates {
 public:
  enum class State { kComplete, kPartial, kConsumed };

  // Process-wide: plans share states (Python's backward may run another plan of the problem).
  static SavedStates& instance();

  void record(const void* saved, const MoeProblem& problem, State state);

  enum class Use { kRead, kConsume };
  // Throws StateError ("saved: ...") for a buffer recorded as partial, consumed, or complete for
  // another problem. kConsume then records it consumed under the same lock, so of two
  // memory-efficient backwards given one buffer at once, one runs and the other is refused.
  void use(const void* saved, const MoeProblem& problem, Use use);

  // At most this many buffers are remembered; the oldest half is forgotten past it (then they
  // pass as never recorded), so a process whose allocator hands out ever new addresses stays
  // bounded.
  static constexpr std::size_t kCapacity = 4096;

 private:
  struct Entry {
    MoeProblem problem;
    State state = State::kComplete;
    std::uint64_t order = 0;  // when recorded, for forgetting the oldest
  };
  void record_locked(const void* saved, const MoeProblem& problem, State state);

  std::mutex mu_;
  std::map<const void*, Entry> entries_;
  std::uint64_t next_order_ = 0;
};

}  // namespace moejit
